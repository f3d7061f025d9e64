/*
 * loads_kv8.cuh -- FP8 K/V for the sm80-class forward (kVarKv8 rows, an FP8
 * K/V cache under f16/bf16 q; sm_89 and newer): the K/V tiles' bytes by
 * cp.async into the ring, their conversion into the 16-bit panels the MMAs
 * read, and where the descales enter.
 *
 * Ring tile: row-major [BN][HD] bytes. Unit u (16 bytes = 16 elements of
 * one row) is row u / CPR, chunk u % CPR (CPR = HD / 16 chunks per row), so
 * thread tid's units tid + k*NT are rows row0 + k*QS (QS = NT / CPR) of one
 * chunk: one pointer per tensor plus a row stride, as the dense loads; the
 * paged rows share paged_fetch's block-table reads (loads.cuh
 * kv_pass_rows). Rows past the keys are zero-filled.
 *
 * Conversion (after the block's bytes are visible to all, before the MMAs):
 * each thread turns its own units into two 16-byte chunks of the 16-bit
 * panels (layout.cuh panel_offset). FP8 values are exact in f16 and bf16.
 *
 * Descales: k_descale multiplies each block's q.k scores as they come out
 * of the MMAs; v_descale multiplies O, so it scales the rows' 1/sum. Both
 * are constants of the CTA's (sequence, KV head).
 */
#ifndef FC_SM80_LOADS_KV8_CUH
#define FC_SM80_LOADS_KV8_CUH

#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/fwd_args.h"
#include "cuda/sm80/layout.cuh"
#include "cuda/sm80/loads.cuh"
#include "cuda/sm80/schedule.cuh"
#include "cuda/sm80/softmax.cuh"

namespace fc {
namespace sm80 {

/* Descale (b, g) of an FP8 call (fc_descale; 1 when not given). */
__device__ __forceinline__ float kv8_descale(const fc_descale &d, int b, int g)
{
    return d.data ? __ldg(d.data + (int64_t)b * d.batch_stride + (int64_t)g * d.head_stride) : 1.f;
}

/* S *= k_descale, ahead of softcap and the masks: the scores are then the
 * dequantised q.k whatever the descale's sign or zero (folded into the
 * softmax multiplier instead, a zero descale made masked scores NaN). */
template <class S_>
__device__ __forceinline__ void kv8_scale_scores(float (&s)[S_::MT][S_::NTL][4], float kd)
{
    map_scores<S_>(s, [kd](float x) { return x * kd; });
}

/* Thread tid's ring-tile unit and its K/V source pointers (the sequence's
 * first key, row0 and the chunk added; paged: the head's base, the page
 * and row come per tile). */
template <class S_>
__device__ __forceinline__ void kv8_addr(const fc_sm80_args &a, const TileCoords &c, KvAddr &ka)
{
    constexpr int CPR = S_::HD / 16;
    const fc_fwd_params &p = a.p;
    ka.row0 = ka.tid / CPR;
    ka.chunk0 = ka.tid % CPR;
    ka.soff = (uint32_t)(ka.row0 * S_::HD + ka.chunk0 * 16);
    int64_t ko = (int64_t)ka.h_kv * p.k_head_stride + ka.chunk0 * 16, vo = (int64_t)ka.h_kv * p.v_head_stride + ka.chunk0 * 16;
    if constexpr (!S_::PAGED) {
        ko += c.bk * p.k_batch_stride + (c.k_start + ka.row0) * p.k_row_stride;
        vo += c.bk * p.v_batch_stride + (c.k_start + ka.row0) * p.v_row_stride;
    }
    ka.k8 = (const uint8_t *)p.k + ko;
    ka.v8 = (const uint8_t *)p.v + vo;
}

/* cp.async of block n's K and V bytes into ring stage `stage`. */
template <class S_>
__device__ inline void load_kv8(const fc_fwd_params &p, KvAddr &ka, const Smem &sm, int n, int stage)
{
    constexpr int BN = S_::BN, QS = kv_pass_rows<S_>(), NR = BN / QS;
    static_assert(BN % QS == 0 && S_::NT % (S_::HD / 16) == 0, "FP8 K/V load: passes must tile the rows");
    const uint32_t sK = sm.kv + stage * S_::STAGE_BYTES + ka.soff, sV = sK + S_::KV8_BYTES;
    const int j0 = n * BN + ka.row0;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        const bool ok = j0 + r * QS < ka.sk;
        const uint8_t *ks = (const uint8_t *)p.k, *vs = (const uint8_t *)p.v;
        if (ok) {
            if constexpr (S_::PAGED) {
                ks = ka.k8 + ((int64_t)ka.pg[r] * p.k_batch_stride + (int64_t)ka.pw[r] * p.k_row_stride);
                vs = ka.v8 + ((int64_t)ka.pg[r] * p.v_batch_stride + (int64_t)ka.pw[r] * p.v_row_stride);
            } else {
                ks = ka.k8 + (int64_t)(n * BN + r * QS) * p.k_row_stride;
                vs = ka.v8 + (int64_t)(n * BN + r * QS) * p.v_row_stride;
            }
        }
        ptx::cp_async_16(sK + r * QS * S_::HD, ks, ok);
        ptx::cp_async_16(sV + r * QS * S_::HD, vs, ok);
    }
    if constexpr (S_::PAGED) paged_fetch<S_>(ka, n + 1);
}

/* Two FP8 values (the low 16 bits of w) as two f16 or bf16 (low value in
 * the low half). e5m2 is the top byte of an f16; e4m3 by cvt (sm_89+). */
template <bool kBF16>
__device__ __forceinline__ uint32_t fp8x2_to_16x2(uint32_t w, bool e5m2)
{
    uint32_t h;
    if (e5m2) {
        h = __byte_perm(w, 0u, 0x1404); /* bytes {0, w0, 0, w1} */
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)(w & 0xffffu)));
#else
        h = 0u; /* kVarKv8 kernels are empty below sm_89 (fwd_kernel.cuh) */
#endif
    }
    if constexpr (!kBF16) return h;
    /* bf16: through float, exactly (an FP8 value's float has 16 zero low bits) */
    const float lo = __half2float(__ushort_as_half((unsigned short)(h & 0xffffu)));
    const float hi = __half2float(__ushort_as_half((unsigned short)(h >> 16)));
    return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
}

/* 16 FP8 values (one ring unit) as two 16-byte chunks of 16-bit values. */
template <bool kBF16>
__device__ __forceinline__ void fp8x16_to_16(const uint4 &x, bool e5m2, uint4 &lo, uint4 &hi)
{
    lo.x = fp8x2_to_16x2<kBF16>(x.x, e5m2);
    lo.y = fp8x2_to_16x2<kBF16>(x.x >> 16, e5m2);
    lo.z = fp8x2_to_16x2<kBF16>(x.y, e5m2);
    lo.w = fp8x2_to_16x2<kBF16>(x.y >> 16, e5m2);
    hi.x = fp8x2_to_16x2<kBF16>(x.z, e5m2);
    hi.y = fp8x2_to_16x2<kBF16>(x.z >> 16, e5m2);
    hi.z = fp8x2_to_16x2<kBF16>(x.w, e5m2);
    hi.w = fp8x2_to_16x2<kBF16>(x.w >> 16, e5m2);
}

/* Ring stage `stage` (block bytes visible to every thread) into the K and V
 * panels at sm.cvt. The caller's __syncthreads orders them before the MMAs. */
template <bool kBF16, class S_>
__device__ __forceinline__ void convert_kv8(const fc_fwd_params &p, const Smem &sm, const KvAddr &ka, int stage)
{
    constexpr int BN = S_::BN, HD = S_::HD, QS = kv_pass_rows<S_>(), NR = BN / QS;
    const bool e5m2 = p.kv_dtype == FC_DTYPE_E5M2;
    const uint32_t src = sm.kv + stage * S_::STAGE_BYTES + ka.soff;
#pragma unroll
    for (int t = 0; t < 2; ++t) { /* K, then V */
        const uint32_t s8 = src + t * S_::KV8_BYTES, d16 = sm.cvt + t * S_::KV_BYTES;
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            const int row = ka.row0 + r * QS;
            uint4 lo, hi;
            fp8x16_to_16<kBF16>(ptx::lds128(s8 + r * QS * HD), e5m2, lo, hi);
            ptx::sts128(d16 + panel_offset<BN, S_::PC>(row, 2 * ka.chunk0), lo);
            ptx::sts128(d16 + panel_offset<BN, S_::PC>(row, 2 * ka.chunk0 + 1), hi);
        }
    }
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_LOADS_KV8_CUH */
