/*
 * sm80_ptx.cuh -- inline-PTX wrappers for the Ampere-class instructions the
 * sm80 forward kernel is built from (all valid on sm_80 and newer):
 *
 *   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}   tensor-core MMA
 *   ldmatrix.sync.aligned.m8n8.x4{,.trans}.shared.b16  smem -> fragments
 *   cp.async.cg.shared.global (16 bytes, zero-fill)    global -> smem, async
 *   cp.async.ca.shared.global (4 bytes, zero-fill)     (the backward's row vectors)
 *   cp.async.commit_group / wait_group                 pipeline bookkeeping
 *   ex2.approx.ftz.f32                                 2^x for the softmax
 *   cvt.rn.{f16x2,bf16x2}.f32                          fp32 pair -> packed 16-bit
 *
 * Register layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
 * g = lane / 4 and t = lane % 4:
 *   A (16x16, row-major), 4 x b32: a[0] = (row g,   k 2t..2t+1)
 *                                  a[1] = (row g+8, k 2t..2t+1)
 *                                  a[2] = (row g,   k 2t+8..2t+9)
 *                                  a[3] = (row g+8, k 2t+8..2t+9)
 *   B (16x8, "col" = stored n-major), 2 x b32: b[0] = (k 2t..2t+1, col g)
 *                                              b[1] = (k 2t+8..2t+9, col g)
 *   C/D (16x8 fp32), 4 x f32: c[0], c[1] = (row g,   cols 2t, 2t+1)
 *                             c[2], c[3] = (row g+8, cols 2t, 2t+1)
 * In every packed b32 the lower 16 bits hold the lower column (k) index.
 *
 * Memory-touching wrappers are `asm volatile` with a "memory" clobber so the
 * compiler keeps them ordered against __syncthreads() and each other; the
 * pure arithmetic ones (mma, ex2, cvt) are plain asm so it may schedule them.
 */
#ifndef FC_SM80_PTX_CUH
#define FC_SM80_PTX_CUH

#include <stdint.h>

#include "cuda/common/device_math.cuh"

namespace fc {
namespace ptx {

using dev::ex2;
using dev::pack2;
using dev::smem_addr;
using dev::sts32;


/* D = A * B + D, fp32 accumulate. kBF16 selects the bf16 input type. */
template <bool kBF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1)
{
    if constexpr (kBF16) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

/* Four 8x8 b16 matrices. Lanes 8i..8i+7 give the row addresses of matrix i;
 * r[i] receives matrix i with lane holding (row lane/4, cols 2*(lane%4)..+1). */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* Same, transposed: lane holds (rows 2*(lane%4)..+1, col lane/4) of each
 * stored matrix -- the B fragment of a row-major [k][n] operand (V). */
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* 16-byte global -> shared async copy, bypassing L1 (.cg). When valid is
 * false the source size is 0: nothing is read and the 16 destination bytes
 * are zero-filled (rows past a sequence end must be zeros, not stale smem,
 * so that 0 * garbage can never make a NaN). src must still be a valid
 * global address; callers pass the tensor base for invalid rows. */
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void *gmem_src, bool valid)
{
    const int src_size = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :
                 : "r"(smem_dst), "l"(gmem_src), "r"(src_size)
                 : "memory");
}

/* 4-byte global -> shared async copy (.ca: the only form below 16 bytes),
 * zero-filled when valid is false, as cp_async_16. */
__device__ __forceinline__ void cp_async_4(uint32_t smem_dst, const void *gmem_src, bool valid)
{
    const int src_size = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :
                 : "r"(smem_dst), "l"(gmem_src), "r"(src_size)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Wait until at most N of this thread's committed groups are still pending. */
template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* 16-byte shared load / global store (epilogue). */
/* 16-byte global store (the O epilogue of the kVarLeanAddr variant, the
 * backward's dK/dV): one
 * STG.128 whatever the front end can prove about the pointer's alignment
 * (the plain uint4 store came out as 4 x STG.32 for half the chunks). */
__device__ __forceinline__ void stg128(void *dst, uint4 v)
{
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w));
}

__device__ __forceinline__ void sts128(uint32_t addr, const uint4 &v)
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t addr)
{
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

/* GPU-scope acquire load / release add of a global int (the backward's
 * deterministic dQ order: a CTA waits for its turn, then hands it on). */
__device__ __forceinline__ int ld_acquire_gpu(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_gpu_add(int *p, int v)
{
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

/* blockIdx.x through volatile asm, so that a second read is really a second
 * read: the kernel recomputes its tile coordinates for the epilogue instead
 * of keeping them live (in registers) across the main loop. */
__device__ __forceinline__ int ctaid_x()
{
    int r;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(r));
    return r;
}

} /* namespace ptx */
} /* namespace fc */

#endif /* FC_SM80_PTX_CUH */
