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

#include "cuda/sm90/bwd_tiles.cuh"
#include "cuda/sm90/ptx_sm90.cuh"

namespace fc90 {

/* The per-element mask of a block that is not whole (bwd_ranges.h,
 * fc_bwd_block_full): the thread's first key and query, the sequence
 * lengths and the band on key - query. */
struct BwdMask {
    int j0, i0;
    int sq, sk;
    int lo, hi;
};

/* P^T in place of S^T without softcap: P = 2^(s sl2 - lse2), masked
 * pairs 0. */
template <class C, bool kMask>
__device__ __forceinline__ void bwd_p(float (&s)[C::BM / 2], uint32_t ld, int t2, float sl2, const BwdMask &bm)
{
#pragma unroll
    for (int j = 0; j < C::BM / 8; ++j) {
        const uint64_t lw = lds64(ld + 4 * (8 * j + t2));
        const float l2[2] = {__uint_as_float((uint32_t)lw), __uint_as_float((uint32_t)(lw >> 32))};
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int x = 4 * j + 2 * h + e;
                float p = ex2(fmaf(s[x], sl2, -l2[e]));
                if constexpr (kMask) {
                    const int key = bm.j0 + 8 * h, q = bm.i0 + 8 * j + e, d = key - q;
                    if (q >= bm.sq || key >= bm.sk || d < bm.lo || d > bm.hi) p = 0.f;
                }
                s[x] = p;
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

/* Both at once with softcap, which needs t = tanh(s softcap_in) for dS's
 * factor 1 - t^2 (kept for dS, t would cost a register per element
 * across the dV issue): t, P = 2^(t sl2 - lse2), dS = P (dP - D)(1 - t^2). */
template <class C, bool kMask>
__device__ __forceinline__ void bwd_p_ds_softcap(float (&s)[C::BM / 2], float (&dp)[C::BM / 2], uint32_t ld, int t2,
                                                 float sl2, float softcap_in, const BwdMask &bm)
{
#pragma unroll
    for (int j = 0; j < C::BM / 8; ++j) {
        const uint64_t lw = lds64(ld + 4 * (8 * j + t2)), dw = lds64(ld + 4 * (C::BM + 8 * j + t2));
        const float l2[2] = {__uint_as_float((uint32_t)lw), __uint_as_float((uint32_t)(lw >> 32))};
        const float dd[2] = {__uint_as_float((uint32_t)dw), __uint_as_float((uint32_t)(dw >> 32))};
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int x = 4 * j + 2 * h + e;
                const float t = tanh_acc(s[x] * softcap_in);
                float p = ex2(fmaf(t, sl2, -l2[e]));
                if constexpr (kMask) {
                    const int key = bm.j0 + 8 * h, q = bm.i0 + 8 * j + e, d = key - q;
                    if (q >= bm.sq || key >= bm.sk || d < bm.lo || d > bm.hi) p = 0.f;
                }
                s[x] = p;
                dp[x] = p * (dp[x] - dd[e]) * (1.f - t * t);
            }
    }
}

/* 16-bit pairs of adjacent queries: the A fragments of the RS GEMMs
 * (softmax.cuh convert_p has why the order matches). */
template <class C, bool kBF16>
__device__ __forceinline__ void bwd_pack(const float (&x)[C::BM / 2], uint32_t (&y)[C::BM / 4])
{
#pragma unroll
    for (int i = 0; i < C::BM / 4; ++i) y[i] = pack2<kBF16>(x[2 * i], x[2 * i + 1]);
}

/* dS^T into the buffer [block_n keys][64 queries] (128-byte rows, 128B
 * swizzle): key row R = 64 cw + 16 warp + g + 8h has R % 8 = g. */
template <class C>
__device__ __forceinline__ void bwd_store_ds(uint32_t ds_tile, const uint32_t (&ds)[C::BM / 4], int cw, int warp,
                                             int g, int t2)
{
    static_assert(C::BM == 64, "one 64-query panel of dS^T");
    const uint32_t row0 = ds_tile + (uint32_t)(64 * cw + 16 * warp + g) * 128u + 2u * t2;
#pragma unroll
    for (int j = 0; j < C::BM / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) sts32(row0 + 8u * 128u * h + ((uint32_t)(j ^ g) << 4), ds[2 * j + h]);
}

} /* namespace fc90 */

#endif /* FC_SM90_BWD_SCORES_CUH */
