/*
 * bwd_producer.cuh -- the Hopper backward's loads, by one warp of the
 * producer warpgroup: K and V once (kv_full), then per step of the CTA's
 * walk (bwd_ranges.h: fc_bwd_first_block / fc_bwd_next_block, the order
 * the consumers take) the Q and dO tiles by TMA into the stage's buffers
 * and the rows' lse2 and D (the preprocess's fp32 rows) copied by the 32
 * lanes into the stage's lse2/D area. q_full counts 33 arrivals: lane 0's
 * expect_tx and every lane's after its copies (release: the consumers'
 * wait sees the stores). Rows past the sequence get lse2 = +inf, D = 0, so
 * their P and dS are 0 without a mask. C::EARLY_DS rows take -D.
 */
#ifndef FC_SM90_BWD_PRODUCER_CUH
#define FC_SM90_BWD_PRODUCER_CUH

#include "cuda/common/pdl.cuh"
#include "cuda/sm80/bwd_coords.cuh"
#include "cuda/sm80/bwd_ranges.h"
#include "cuda/sm90/bwd_args.h"
#include "cuda/sm90/bwd_place.cuh"
#include "cuda/sm90/bwd_split.cuh"
#include "cuda/sm90/bwd_tiles.cuh"
#include "cuda/sm90/ptx_sm90.cuh"

namespace fc90 {

/* A tile of `rows` rows starting at row, all panels: map {D, rows, heads, batch}. */
template <class C, int kRows>
__device__ __forceinline__ void bwd_load_tile(const CUtensorMap *map, uint32_t dst, uint32_t bar, int row, int head,
                                              int batch)
{
#pragma unroll
    for (int pn = 0; pn < C::D / C::PW; ++pn) tma_load_4d(dst + pn * kRows * C::SW, map, bar, pn * C::PW, row, head, batch);
}

/* The query walk's stage and parity of step it. */
template <class C> __device__ __forceinline__ int bwd_stage(int it) { return it % C::ST; }
template <class C> __device__ __forceinline__ uint32_t bwd_phase(int it) { return (uint32_t)(it / C::ST) & 1u; }

/* Query block m of head h: the lane's rows' lse2 and D (C::EARLY_DS:
 * -D, dP^T's start) into the stage's area at ld, past the sequence +inf
 * and 0. Every load first, then the stores: a step waits for one round
 * trip, not one per row (128-query rows on 24 registers, copying a row at
 * a time: s512-d64 -23%). */
template <class C>
__device__ __forceinline__ void bwd_copy_rows(const fc_sm80_bwd_args &a, const fc::sm80::BwdCoords &c, uint32_t ld,
                                              int h, int m, int lane)
{
    constexpr int R = C::BM / 32;
    float l2[R], d[R];
    const int64_t at = (int64_t)h * a.rows + c.row0 + m * C::BM + lane;
    const int left = c.sq - m * C::BM - lane;
#pragma unroll
    for (int k = 0; k < R; ++k) {
        l2[k] = __int_as_float(0x7f800000);
        d[k] = 0.f;
        if (32 * k < left) {
            l2[k] = a.lse2[at + 32 * k];
            d[k] = a.dsum[at + 32 * k];
        }
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
        sts32(ld + 4 * (lane + 32 * k), __float_as_uint(l2[k]));
        sts32(ld + 4 * (C::BM + lane + 32 * k), __float_as_uint(C::EARLY_DS ? -d[k] : d[k]));
    }
}

template <class C, bool kDet>
__device__ void bwd_producer(const fc_sm90_bwd_params &prm, uint32_t base, int lane)
{
    const fc_sm80_bwd_args &a = prm.a;
    const BwdPlace<C, C::EARLY_DS> pl(a);
    int m;
    {
        const auto &c = pl.coords(a);
        const fc_brange mr = pl.range(a);
        if (lane == 0) {
            const int krow = (int)c.k_start + c.n * C::BN, bk = (int)c.bk;
            mbar_arrive_expect_tx(C::kv_full(base), 2 * C::KV_BYTES);
            bwd_load_tile<C, C::BN>(&prm.tm_k, base + C::OFF_K, C::kv_full(base), krow, c.h_kv, bk);
            bwd_load_tile<C, C::BN>(&prm.tm_v, base + C::OFF_V, C::kv_full(base), krow, c.h_kv, bk);
        }
        m = mr.hi > mr.lo ? fc_bwd_first_block(fc::sm80::bwd_down<kDet>(a), mr) : -1;
    }
    for (int g = m < 0 ? a.group_run : 0, it = 0; g < a.group_run; ++it) {
        const auto &c = pl.coords(a);
        const int s = bwd_stage<C>(it), h = c.h0 + g;
        /* every lane: each then writes the stage's lse2/D area the consumers released */
        FC90_WAIT(C::q_empty(base, s), bwd_phase<C>(it) ^ 1u);
        if (lane == 0) {
            const int qrow = (int)c.q_start + m * C::BM, bq = (int)c.bq;
            mbar_arrive_expect_tx(C::q_full(base, s), 2 * C::Q_BYTES);
            bwd_load_tile<C, C::BM>(&prm.tm_q, base + C::OFF_Q + s * C::Q_BYTES, C::q_full(base, s), qrow, h, bq);
            bwd_load_tile<C, C::BM>(&prm.tm_do, base + C::OFF_DO + s * C::Q_BYTES, C::q_full(base, s), qrow, h, bq);
        }
        const uint32_t ld = base + C::OFF_LD + s * C::LD_BYTES;
        if (it == 0) fc_grid_dep_wait(); /* lse2 and D: the preprocess's */
        bwd_copy_rows<C>(a, c, ld, h, m, lane);
        mbar_arrive(C::q_full(base, s));
        int gn, mn;
        fc_bwd_next_block(fc::sm80::bwd_down<kDet>(a), a.group_run, pl.range(a), g, m, &gn, &mn);
        g = gn;
        m = mn;
    }
}

} /* namespace fc90 */

#endif /* FC_SM90_BWD_PRODUCER_CUH */
