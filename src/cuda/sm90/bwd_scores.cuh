/*
 * bwd_scores.cuh -- the elementwise middle of a Hopper backward step, in a
 * consumer warpgroup's registers: from S^T (raw q.k) and dP^T (dO.v) to
 * P^T and dS^T, as the sm80-class kernel does it (sm80/bwd_scores.cuh has
 * the formulas), then dS^T to shared memory for the dQ GEMM.
 *
 * A thread holds keys r and r + 8 (r = 16 warp + lane / 4 of its
 * warpgroup's 64) and, in every 8-query group j, queries 8j + 2 (lane % 4)
 * and + 1: acc[4j + 2h + e] is key r + 8h, query 8j + 2 (lane % 4) + e.
 * Each query's lse2 and D come from the stage's area (bwd_producer.cuh).
 */
#ifndef FC_SM90_BWD_SCORES_CUH
#define FC_SM90_BWD_SCORES_CUH

#include "cuda/sm80/bwd_ranges.h"
#include "cuda/sm90/bwd_tiles.cuh"
#include "cuda/sm90/ptx_sm90.cuh"
#include "cuda/sm90/softmax.cuh" /* convert_p: 16-bit A fragments of the RS GEMMs */

namespace fc90 {

/* P^T in place of S^T: t = softcap ? tanh(s softcap_in) : s, P = 2^(t sl2 -
 * lse2), masked pairs 0. With softcap dS^T too, in place of dP^T: its
 * factor 1 - t^2 needs t, which would otherwise cost a register per
 * element across the dV issue; without, bwd_ds follows that issue. */
template <class C, bool kMask, bool kSoftcap>
__device__ __forceinline__ void bwd_p(float (&s)[C::BM / 2], float (&dp)[C::BM / 2], uint32_t ld, int t2, float sl2,
                                      float softcap_in, const fc_bwd_mask &bm)
{
#pragma unroll
    for (int j = 0; j < C::BM / 8; ++j) {
        const uint64_t lw = lds64(ld + 4 * (8 * j + t2));
        const float l2[2] = {__uint_as_float((uint32_t)lw), __uint_as_float((uint32_t)(lw >> 32))};
        const uint64_t dw = kSoftcap ? lds64(ld + 4 * (C::BM + 8 * j + t2)) : 0;
        const float dd[2] = {__uint_as_float((uint32_t)dw), __uint_as_float((uint32_t)(dw >> 32))};
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int x = 4 * j + 2 * h + e;
                const float t = kSoftcap ? tanh_acc(s[x] * softcap_in) : s[x];
                float p = ex2(fmaf(t, sl2, -l2[e]));
                if (kMask && fc_bwd_hidden(bm, bm.j0 + 8 * h, bm.i0 + 8 * j + e)) p = 0.f;
                s[x] = p;
                if constexpr (kSoftcap) dp[x] = p * (dp[x] - dd[e]) * (1.f - t * t);
            }
    }
}

/* dS^T in place of dP^T without softcap: P (dP - D). */
template <class C>
__device__ __forceinline__ void bwd_ds(const float (&p)[C::BM / 2], float (&dp)[C::BM / 2], uint32_t ld, int t2)
{
#pragma unroll
    for (int j = 0; j < C::BM / 8; ++j) {
        const uint64_t dw = lds64(ld + 4 * (C::BM + 8 * j + t2));
        const float dd[2] = {__uint_as_float((uint32_t)dw), __uint_as_float((uint32_t)(dw >> 32))};
#pragma unroll
        for (int i = 0; i < 4; ++i) dp[4 * j + i] = p[4 * j + i] * (dp[4 * j + i] - dd[i & 1]);
    }
}

/* P^T and dS^T at once, each pair made 16-bit as soon as it is done (for
 * 128-query steps, C::EARLY_DS: computed whole first, as bwd_p and bwd_ds
 * do, their temporaries beside S^T and dP^T spilled). dpd is dP^T - D
 * (the GEMM started from -D, bwd_kernel.cuh); the mask is two spans of
 * query offsets, key r + 8h seeing sp[h] (fc_bwd_visible_span: the
 * offsets are immediates). P[2j + h] packs elements 4j + 2h and + 1, as
 * convert_p. No softcap: its tanh's temporaries spilled, so those rows
 * have no softcap instance (bwd_tiles.cuh). */
template <class C, bool kMask, bool kBF16>
__device__ __forceinline__ void bwd_p_ds_packed(const float (&s)[C::BM / 2], const float (&dpd)[C::BM / 2],
                                                uint32_t (&P)[C::BM / 4], uint32_t (&dS)[C::BM / 4], uint32_t ld,
                                                int t2, float sl2, const fc_bwd_qspan (&sp)[2])
{
#pragma unroll
    for (int j = 0; j < C::BM / 8; ++j) {
        const uint64_t lw = lds64(ld + 4 * (8 * j + t2));
        const float l2[2] = {__uint_as_float((uint32_t)lw), __uint_as_float((uint32_t)(lw >> 32))};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float p2[2], d2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int x = 4 * j + 2 * h + e;
                float p = ex2(fmaf(s[x], sl2, -l2[e]));
                if (kMask && (8 * j + e < sp[h].lo || 8 * j + e > sp[h].hi)) p = 0.f;
                p2[e] = p;
                d2[e] = p * dpd[x];
            }
            P[2 * j + h] = pack2<kBF16>(p2[0], p2[1]);
            dS[2 * j + h] = pack2<kBF16>(d2[0], d2[1]);
        }
    }
}

/* dS^T into the buffer [block_m / 64 panels][block_n keys][64 queries]
 * (128-byte rows, 128B swizzle): key row R = 64 cw + 16 warp + g + 8h has
 * R % 8 = g. */
template <class C>
__device__ __forceinline__ void bwd_store_ds(uint32_t ds_tile, const uint32_t (&ds)[C::BM / 4], int cw, int warp,
                                             int g, int t2)
{
    static_assert(C::BM % 64 == 0, "whole 64-query panels of dS^T");
    const uint32_t row0 = ds_tile + (uint32_t)(64 * cw + 16 * warp + g) * 128u + 2u * t2;
#pragma unroll
    for (int j = 0; j < C::BM / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            sts32(row0 + (uint32_t)(j / 8) * (C::BN * 128u) + 8u * 128u * h + ((uint32_t)((j % 8) ^ g) << 4),
                  ds[2 * j + h]);
}

} /* namespace fc90 */

#endif /* FC_SM90_BWD_SCORES_CUH */
