/*
 * device_math.cuh -- the small device helpers both CUDA paths use: shared
 * window addresses and word access, 2^x, an accurate tanh for softcap,
 * fp32-pair packing to f16x2/bf16x2, and element stores for outputs with odd
 * strides. One definition, so the sm80-class and
 * sm90 kernels round and approximate identically.
 */
#ifndef FC_CUDA_DEVICE_MATH_CUH
#define FC_CUDA_DEVICE_MATH_CUH

#include <stdint.h>

namespace fc {
namespace dev {

/* 32-bit shared-state-space address of a generic pointer into shared memory. */
__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* Shared-memory word stores/loads by shared-window address. volatile with a
 * memory clobber: the 64-bit pair holds K/V base pointers that the sm80
 * kernel re-reads inside its main loop on purpose (keeping them out of
 * registers), so the compiler must not hoist or merge them. */
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v)
{
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr)
{
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void sts64(uint32_t addr, uint64_t v)
{
    asm volatile("st.shared.b64 [%0], %1;\n" ::"r"(addr), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t lds64(uint32_t addr)
{
    uint64_t v;
    asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(v) : "r"(addr) : "memory");
    return v;
}
/* threadIdx.x through volatile asm: each call is a fresh S2R, so values
 * derived from it are recomputed where used instead of held in registers
 * (the sm80 kernel's Shape::LEAN_REGS, the Hopper consumers' zero_v_tail). */
__device__ __forceinline__ int tid_x_volatile()
{
    int r;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
    return r;
}

/* Zero rows r0..ROWS-1 of a BYTES-byte shared-memory tile stored as column
 * panels of ROWS rows x ROW_BYTES (both paths' K/V layouts), NT threads, t
 * this thread's index among them. A row's 16-byte chunks are contiguous in
 * its panel whatever the swizzle (it permutes them within the row), so
 * chunk i lies in row (i / (ROW_BYTES/16)) % ROWS. Both paths zero the V
 * rows past a varlen sequence's end with it. Not unrolled: it runs once per
 * tile at most, inside kernels whose registers are spoken for. */
template <uint32_t BYTES, uint32_t ROW_BYTES, uint32_t ROWS, uint32_t NT>
__device__ __forceinline__ void zero_rows_from(uint32_t tile, int r0, uint32_t t)
{
    static_assert(ROW_BYTES % 16 == 0 && BYTES % (ROW_BYTES * ROWS) == 0, "whole panels of 16-byte chunks");
    const uint32_t first = (uint32_t)r0 * (ROW_BYTES / 16); /* chunk index of row r0 in a panel */
#pragma unroll 1
    for (uint32_t i = t; i < BYTES / 16; i += NT)
        if (i % (ROWS * (ROW_BYTES / 16)) >= first)
            asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(tile + 16u * i), "r"(0u) : "memory");
}

/* 2^x, approximate (max rel. error 2^-22); ex2(-inf) = +0, flushes denormals.
 * Plain asm (not volatile) so the compiler may schedule it. */
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* tanh(x) = 1 - 2/(2^(2x log2 e) + 1): absolute error ~1e-7 over the whole
 * range, which is what matters for a logit (softcap multiplies it);
 * tanh.approx's ~5e-4 relative error would move a logit by ~0.025 at
 * softcap 50. */
__device__ __forceinline__ float tanh_acc(float x)
{
    const float e = ex2(x * 2.8853900817779268f); /* 2*log2(e) */
    return 1.0f - __fdividef(2.0f, e + 1.0f);
}

/* Pack two fp32 into f16x2 / bf16x2 (round to nearest even). `lo` lands in
 * bits 0..15 (the lower column index), `hi` in bits 16..31; PTX cvt takes the
 * high half first. */
template <bool kBF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    uint32_t r;
    if constexpr (kBF16)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* The inverse of pack2: bits 0..15 -> .x, bits 16..31 -> .y (exact). */
template <bool kBF16>
__device__ __forceinline__ float2 unpack2(uint32_t v)
{
    float2 r;
    if constexpr (kBF16) {
        r.x = __uint_as_float(v << 16);
        r.y = __uint_as_float(v & 0xffff0000u);
    } else {
        asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.f32.f16 %0, lo;\n cvt.f32.f16 %1, hi;\n}\n"
            : "=f"(r.x), "=f"(r.y)
            : "r"(v));
    }
    return r;
}

/* 16 bytes of 16-bit elements (8, bits 0..15 first) to a dst that is only
 * 2-byte aligned (an output with odd element strides): one store each. */
__device__ __forceinline__ void st_elems8(uint16_t *dst, uint4 v)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        dst[2 * e] = (uint16_t)(w[e] & 0xffffu);
        dst[2 * e + 1] = (uint16_t)(w[e] >> 16);
    }
}

} /* namespace dev */
} /* namespace fc */

#endif /* FC_CUDA_DEVICE_MATH_CUH */
