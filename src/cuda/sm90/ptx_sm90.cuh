/*
 * ptx_sm90.cuh -- inline-PTX wrappers for the Hopper (sm_90a) kernels:
 * mbarrier, TMA (cp.async.bulk.tensor), proxy fences, named barriers,
 * setmaxnreg, and wgmma (descriptors, SS/RS issue, fence/commit/wait).
 *
 * Used by the Hopper kernels (sm_90a only, cmake/CudaKernels.cmake) and,
 * for its mbarrier and TMA wrappers, by the sm80 path's kVarTma rows, whose
 * kernels are empty below sm_90 (sm80/fwd_kernel.cuh). Everything is a
 * forceinline device function in namespace fc90, emitted only where used;
 * nothing here allocates or touches global state.
 *
 * FC_SM90_DEBUG (compile-time, off by default): mbarrier waits count their
 * spins and trap with a message naming the barrier after ~2^31 tries, and
 * FC90_ASSERT checks kernel invariants. Build with
 * -DCMAKE_CUDA_FLAGS=-DFC_SM90_DEBUG=1 to turn a hang into a message.
 */
#ifndef FC_SM90_PTX_CUH
#define FC_SM90_PTX_CUH

#include <stdint.h>

#include "cuda/common/device_math.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(FC_SM90_DEBUG) && FC_SM90_DEBUG
#include <assert.h>
#include <stdio.h>
#ifdef __CUDA_ARCH__
#define FC90_ASSERT(cond)                                                                   \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            printf("fc_sm90 assert failed: %s (%s:%d) block %d thread %d\n", #cond,         \
                   __FILE__, __LINE__, (int)blockIdx.x, (int)threadIdx.x);                  \
            __trap();                                                                       \
        }                                                                                   \
    } while (0)
#else
#define FC90_ASSERT(cond) assert(cond)
#endif
#else
#define FC90_ASSERT(cond) ((void)0)
#endif

namespace fc90 {

/* Shared addresses and words, 2^x, accurate tanh, f16x2/bf16x2 packing:
 * shared with the sm80-class path (device_math.cuh). */
using fc::dev::ex2;
using fc::dev::lds32;
using fc::dev::lds64;
using fc::dev::pack2;
using fc::dev::sts32;
using fc::dev::tanh_acc;
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return fc::dev::smem_addr(p); }

/* ---- mbarrier --------------------------------------------------------------- */
/* An mbarrier is one 8-byte word in shared memory, addressed here by its
 * 32-bit shared-window address. */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/* Makes the inits visible to the async proxy (TMA complete_tx) and to the
 * other threads once followed by a CTA barrier. */
__device__ __forceinline__ void mbar_fence_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* Producer side of a TMA stage: one arrival plus `bytes` expected from the
 * copies that complete_tx on this barrier. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

/* 1 once the phase of parity `parity` has completed. A fresh barrier is in
 * phase 0, so waiting for parity 1 succeeds at once: that is how a producer
 * gets through its first pass over the empty barriers. */
__device__ __forceinline__ uint32_t mbar_try_wait(uint32_t bar, uint32_t parity)
{
    uint32_t ok;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
    return ok;
}

#if defined(FC_SM90_DEBUG) && FC_SM90_DEBUG
static __device__ __noinline__ void mbar_hang(uint32_t bar, uint32_t parity, int line)
{
    printf("fc_sm90 hang: mbarrier 0x%x parity %u (fwd_kernel.cuh line %d) block %d thread %d\n", bar,
           parity, line, (int)blockIdx.x, (int)threadIdx.x);
    __trap();
}
/* Spins inline (a call inside the wgmma window would serialize it); only the
 * report after ~2^31 failed tries is out of line. */
__device__ __forceinline__ void mbar_wait_debug(uint32_t bar, uint32_t parity, int line)
{
    uint32_t spins = 0;
    while (!mbar_try_wait(bar, parity))
        if (++spins == 0x80000000u) mbar_hang(bar, parity, line);
    __syncwarp();
}
#define FC90_WAIT(bar, parity) ::fc90::mbar_wait_debug((bar), (parity), __LINE__)
#else
#define FC90_WAIT(bar, parity) ::fc90::mbar_wait((bar), (parity))
#endif

/* The whole spin is one asm statement (the label is local to its { }
 * block), so the warp leaves it converged: .sync.aligned instructions
 * (wgmma, bar.sync) follow these waits. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "FC90_WAIT_LOOP:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra FC90_WAIT_LOOP;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

/* ---- proxy fences ------------------------------------------------------------ */
/* Orders this thread's generic-proxy shared-memory accesses before later
 * async-proxy accesses (TMA writes into a buffer we just read or wrote). */
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- TMA ------------------------------------------------------------------- */
__device__ __forceinline__ void tma_prefetch_map(const void *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* 4-d tiled load of one box into shared memory at dst, completing `box bytes`
 * of transactions on barrier bar. Out-of-bound elements are zero-filled and
 * still counted. */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, uint32_t bar, int c0,
                                            int c1, int c2, int c3)
{
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

/* 5-d tiled load, same contract. */
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const void *map, uint32_t bar, int c0, int c1,
                                            int c2, int c3, int c4)
{
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
        : "memory");
}

/* 5-d tiled store of one box from shared memory at src (written by the
 * generic proxy: every writer runs fence_proxy_async before the barrier that
 * precedes this). Elements outside the tensor are not written. Completes in
 * the issuing thread's bulk async-group (tma_store_commit / _wait_read). */
__device__ __forceinline__ void tma_store_5d(const void *map, uint32_t src, int c0, int c1, int c2, int c3,
                                             int c4)
{
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];\n" ::"l"(
                     (uint64_t)map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* The shared-memory sources of this thread's stores have been read (the
 * buffer may be reused); the global writes may still be in flight. */
__device__ __forceinline__ void tma_store_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
/* This thread's stores are complete. */
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

/* Adds `bytes` (a multiple of 16) of fp32 at shared src into global dst
 * (both 16-byte aligned), elementwise and atomically in L2: the backward's
 * dQ accumulation. Completes in the issuing thread's bulk async-group, as
 * the stores above. */
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}

/* ---- named barriers ---------------------------------------------------------- */
/* id 0 is __syncthreads; count is the number of threads (multiple of 32)
 * that arrive or sync on this instance. */
__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t count)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t count)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* ---- setmaxnreg -------------------------------------------------------------- */
template <int N> __device__ __forceinline__ void reg_dealloc()
{
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg immediate");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void reg_alloc()
{
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg immediate");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* ---- wgmma: ordering ----------------------------------------------------------- */
/* Before the first wgmma of a batch whose register operands (accumulators or
 * A fragments) were written by ordinary instructions. */
__device__ __forceinline__ void wg_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* Wait until at most N committed groups are pending. */
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Compiler-level fences: an empty volatile asm that "modifies" each register
 * keeps ordinary reads/writes of accumulators and fragments on their side of
 * the async window (volatile asms are never reordered among themselves). */
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void fence_regs(uint32_t (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

/* ---- wgmma: shared-memory matrix descriptors ------------------------------------ */
/* Bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride
 * byte offset >> 4, 49-51 base offset (0: every tile here is aligned to the
 * swizzle repeat), 62-63 swizzle (1 = 128B, 2 = 64B).
 *
 * K-major (Q and K, the K-dim contiguous in rows of `swz` bytes): LBO is not
 * used with swizzling; SBO = 8 rows * swz bytes between 8-row groups.
 * MN-major (V as the B operand of P.V, N = head_dim contiguous): LBO = the
 * distance between swz-byte column panels, SBO = 8 rows * swz bytes between
 * 8-row groups along K. */
template <int kSwz> __device__ __forceinline__ uint64_t desc_mode()
{
    static_assert(kSwz == 128 || kSwz == 64, "swizzle");
    return kSwz == 128 ? (1ull << 62) : (2ull << 62);
}
template <int kSwz> __device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr)
{
    return (uint64_t)((addr >> 4) & 0x3FFF) | ((uint64_t)1 << 16) |
           ((uint64_t)((8 * kSwz) >> 4) << 32) | desc_mode<kSwz>();
}
template <int kSwz> __device__ __forceinline__ uint64_t desc_mnmajor(uint32_t addr, uint32_t lbo)
{
    return (uint64_t)((addr >> 4) & 0x3FFF) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((8 * kSwz) >> 4) << 32) | desc_mode<kSwz>();
}

/* ---- wgmma: issue --------------------------------------------------------------- */
/* The asm operand lists are long (up to 128 accumulators), so they are built
 * from 8-register pieces. Accumulators are always operands %0..%(N/2-1); the
 * remaining operands follow at numbers passed literally to the macro. */
#define FC90_R8_0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FC90_R8_1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define FC90_R8_2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define FC90_R8_3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define FC90_R8_4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define FC90_R8_5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define FC90_R8_6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define FC90_R8_7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define FC90_R8_8 "%64, %65, %66, %67, %68, %69, %70, %71"
#define FC90_R8_9 "%72, %73, %74, %75, %76, %77, %78, %79"
#define FC90_R8_10 "%80, %81, %82, %83, %84, %85, %86, %87"
#define FC90_R8_11 "%88, %89, %90, %91, %92, %93, %94, %95"
#define FC90_R8_12 "%96, %97, %98, %99, %100, %101, %102, %103"
#define FC90_R8_13 "%104, %105, %106, %107, %108, %109, %110, %111"
#define FC90_R8_14 "%112, %113, %114, %115, %116, %117, %118, %119"
#define FC90_R8_15 "%120, %121, %122, %123, %124, %125, %126, %127"

#define FC90_S1 FC90_R8_0
#define FC90_S2 FC90_S1 ", " FC90_R8_1
#define FC90_S3 FC90_S2 ", " FC90_R8_2
#define FC90_S4 FC90_S3 ", " FC90_R8_3
#define FC90_S5 FC90_S4 ", " FC90_R8_4
#define FC90_S6 FC90_S5 ", " FC90_R8_5
#define FC90_S7 FC90_S6 ", " FC90_R8_6
#define FC90_S8 FC90_S7 ", " FC90_R8_7
#define FC90_S9 FC90_S8 ", " FC90_R8_8
#define FC90_S10 FC90_S9 ", " FC90_R8_9
#define FC90_S11 FC90_S10 ", " FC90_R8_10
#define FC90_S12 FC90_S11 ", " FC90_R8_11
#define FC90_S13 FC90_S12 ", " FC90_R8_12
#define FC90_S14 FC90_S13 ", " FC90_R8_13
#define FC90_S15 FC90_S14 ", " FC90_R8_14
#define FC90_S16 FC90_S15 ", " FC90_R8_15

/* c is the constraint: "+f" (accumulate: the old value is read) or "=f" (the
 * first k-step with scale-d 0: the old value is dead). */
#define FC90_O8(c, d, i)                                                                    \
    c(d[(i) + 0]), c(d[(i) + 1]), c(d[(i) + 2]), c(d[(i) + 3]), c(d[(i) + 4]), c(d[(i) + 5]),  \
        c(d[(i) + 6]), c(d[(i) + 7])
#define FC90_O1(c, d) FC90_O8(c, d, 0)
#define FC90_O2(c, d) FC90_O1(c, d), FC90_O8(c, d, 8)
#define FC90_O3(c, d) FC90_O2(c, d), FC90_O8(c, d, 16)
#define FC90_O4(c, d) FC90_O3(c, d), FC90_O8(c, d, 24)
#define FC90_O5(c, d) FC90_O4(c, d), FC90_O8(c, d, 32)
#define FC90_O6(c, d) FC90_O5(c, d), FC90_O8(c, d, 40)
#define FC90_O7(c, d) FC90_O6(c, d), FC90_O8(c, d, 48)
#define FC90_O8_(c, d) FC90_O7(c, d), FC90_O8(c, d, 56)
#define FC90_O9(c, d) FC90_O8_(c, d), FC90_O8(c, d, 64)
#define FC90_O10(c, d) FC90_O9(c, d), FC90_O8(c, d, 72)
#define FC90_O11(c, d) FC90_O10(c, d), FC90_O8(c, d, 80)
#define FC90_O12(c, d) FC90_O11(c, d), FC90_O8(c, d, 88)
#define FC90_O13(c, d) FC90_O12(c, d), FC90_O8(c, d, 96)
#define FC90_O14(c, d) FC90_O13(c, d), FC90_O8(c, d, 104)
#define FC90_O15(c, d) FC90_O14(c, d), FC90_O8(c, d, 112)
#define FC90_O16(c, d) FC90_O15(c, d), FC90_O8(c, d, 120)

#define FC90_STR_(x) #x
#define FC90_STR(x) FC90_STR_(x)

/* SS: D(64xN, f32) (+)= A(64x16 from smem desc) * B(16xN from smem desc).
 * TR is the imm-trans-a, imm-trans-b pair: "0, 0" both K-major (S = Q K^T),
 * "1, 1" both MN-major (the backward's dQ = dS K, dS^T and K as they lie
 * in shared memory). Operands after the accumulators: desc_a = %T0, desc_b
 * = %T1, scale_d = %T2 (0: D = A*B, the first k-step of S). */
#define FC90_WGMMA_SS(N, G, OPS, TY, TR, T0, T1, T2)                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" FC90_STR(T2) ", 0;\n"                \
                 "wgmma.mma_async.sync.aligned.m64n" FC90_STR(N) "k16.f32." TY "." TY " {"  \
                 FC90_S##G "}, %" FC90_STR(T0) ", %" FC90_STR(T1) ", p, 1, 1, " TR ";\n}\n" \
                 : OPS("+f", d)                                                                   \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d))

/* SS with D = A*B (scale-d 0) and write-only accumulator constraints: the
 * first k-step of S, so the compiler knows the old S is dead. */
#define FC90_WGMMA_SS0(N, G, OPS, TY, T0, T1)                                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned.m64n" FC90_STR(N) "k16.f32." TY "." TY " {"  \
                 FC90_S##G "}, %" FC90_STR(T0) ", %" FC90_STR(T1) ", p, 1, 1, 0, 0;\n}\n" \
                 : OPS("=f", d)                                                             \
                 : "l"(desc_a), "l"(desc_b))

/* RS: D(64xN, f32) += A(64x16 from 4 b32 registers per thread) * B(16xN from
 * smem desc, MN-major: imm-trans-b = 1). Operands: a0..a3 = %T0..%T3,
 * desc_b = %T4, scale_d = %T5. */
#define FC90_WGMMA_RS(N, G, OPS, TY, T0, T1, T2, T3, T4, T5)                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" FC90_STR(T5) ", 0;\n"                \
                 "wgmma.mma_async.sync.aligned.m64n" FC90_STR(N) "k16.f32." TY "." TY " {"  \
                 FC90_S##G "}, {%" FC90_STR(T0) ", %" FC90_STR(T1) ", %" FC90_STR(T2)        \
                 ", %" FC90_STR(T3) "}, %" FC90_STR(T4) ", p, 1, 1, 1;\n}\n"                 \
                 : OPS("+f", d)                                                                   \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d))

template <int N, bool kBF16> struct Wgmma;

/* G = N/16 groups of 8 accumulators; the numbers after are 8G .. 8G+5.
 * One body per input type (TY: "bf16" or "f16"). */
#define FC90_DEFINE_WGMMA_TY(N, G, OPS, IS_BF16, TY, T0, T1, T2, T3, T4, T5)                   \
    template <> struct Wgmma<N, IS_BF16> {                                                  \
        static __device__ __forceinline__ void ss(float *d, uint64_t desc_a, uint64_t desc_b, \
                                                  int scale_d)                             \
        {                                                                                   \
            FC90_WGMMA_SS(N, G, OPS, TY, "0, 0", T0, T1, T2);                               \
        }                                                                                   \
        static __device__ __forceinline__ void ss_tt(float *d, uint64_t desc_a, uint64_t desc_b, \
                                                     int scale_d)                          \
        {                                                                                   \
            FC90_WGMMA_SS(N, G, OPS, TY, "1, 1", T0, T1, T2);                               \
        }                                                                                   \
        static __device__ __forceinline__ void ss0(float *d, uint64_t desc_a, uint64_t desc_b) \
        {                                                                                   \
            FC90_WGMMA_SS0(N, G, OPS, TY, T0, T1);                                          \
        }                                                                                   \
        static __device__ __forceinline__ void rs(float *d, uint32_t a0, uint32_t a1,        \
                                                  uint32_t a2, uint32_t a3, uint64_t desc_b, \
                                                  int scale_d)                             \
        {                                                                                   \
            FC90_WGMMA_RS(N, G, OPS, TY, T0, T1, T2, T3, T4, T5);                           \
        }                                                                                   \
    };
#define FC90_DEFINE_WGMMA(N, G, OPS, T0, T1, T2, T3, T4, T5)                                \
    FC90_DEFINE_WGMMA_TY(N, G, OPS, true, "bf16", T0, T1, T2, T3, T4, T5)                   \
    FC90_DEFINE_WGMMA_TY(N, G, OPS, false, "f16", T0, T1, T2, T3, T4, T5)

/* The N values the tile table uses: block_n for S = Q K^T, head_dim for
 * O += P V (tiles.cuh). Unused ones cost nothing (never instantiated). */
FC90_DEFINE_WGMMA(64, 4, FC90_O4, 32, 33, 34, 35, 36, 37)
FC90_DEFINE_WGMMA(80, 5, FC90_O5, 40, 41, 42, 43, 44, 45)
FC90_DEFINE_WGMMA(96, 6, FC90_O6, 48, 49, 50, 51, 52, 53)
FC90_DEFINE_WGMMA(112, 7, FC90_O7, 56, 57, 58, 59, 60, 61)
FC90_DEFINE_WGMMA(128, 8, FC90_O8_, 64, 65, 66, 67, 68, 69)
FC90_DEFINE_WGMMA(144, 9, FC90_O9, 72, 73, 74, 75, 76, 77)
FC90_DEFINE_WGMMA(160, 10, FC90_O10, 80, 81, 82, 83, 84, 85)
FC90_DEFINE_WGMMA(176, 11, FC90_O11, 88, 89, 90, 91, 92, 93)
FC90_DEFINE_WGMMA(192, 12, FC90_O12, 96, 97, 98, 99, 100, 101)
FC90_DEFINE_WGMMA(256, 16, FC90_O16, 128, 129, 130, 131, 132, 133)

} /* namespace fc90 */

#endif /* FC_SM90_PTX_CUH */
