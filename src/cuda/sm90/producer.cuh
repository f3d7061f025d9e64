/*
 * producer.cuh -- the producer warpgroup's loads: one thread issues TMA
 * loads of Q once per tile and of K and V through a `stages`-deep ring of
 * full/empty mbarriers (phase parity), in exactly the order the consumers
 * take the blocks (a tile's KV blocks from high to low).
 */
#ifndef FC_SM90_PRODUCER_CUH
#define FC_SM90_PRODUCER_CUH

#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/trace.cuh"

namespace fc90 {

/* K or V block: map dims {D, rows, heads_kv, batch}, box {PW, BN, 1, 1}. */
template <class C>
__device__ __forceinline__ void load_kv(const CUtensorMap *map, uint32_t dst, uint32_t bar, int row, int head,
                                        int batch)
{
#pragma unroll
    for (int pn = 0; pn < C::PANELS; ++pn)
        tma_load_4d(dst + pn * C::BN * C::SW, map, bar, pn * C::PW, row, head, batch);
}

/* Paged K/V: key row `row` of sequence b -> (row in its page, page). 32-bit
 * index math (plan.cu keeps the table under 2^31 entries): the producer
 * has 40 registers, and the 64-bit product spilled 4 bytes. */
__device__ __forceinline__ void page_of(const fc_sm90_params &p, int b, int &row, int &page)
{
    const int pi = fc_fastdiv_div(row, p.page);
    page = __ldg(p.block_table + (b * p.bt_stride + pi));
    row -= pi * p.page.d;
}

/* Q tile: map dims {D, ratio, heads_q/ratio, rows, batch}, box {PW, ratio,
 * 1, BM/ratio, 1} (ratio = 1 without pack-GQA): the box lands as rows
 * s_local*ratio + i, i.e. tile row R - m0. */
template <class C>
__device__ __forceinline__ void load_q(const CUtensorMap *map, uint32_t dst, uint32_t bar, int pos, int hu,
                                       int batch)
{
#pragma unroll
    for (int pn = 0; pn < C::PANELS; ++pn)
        tma_load_5d(dst + pn * C::BM * C::SW, map, bar, pn * C::PW, 0, hu, pos, batch);
}

/* Runs on one thread. The K/V ring position (stage, phase) advances once per
 * KV block in exactly the order the consumers consume them. */
template <class C, bool kPaged> __device__ void producer(const fc_sm90_params &p, uint32_t base, const Bars<C> &bars)
{
    int stage = 0;
    uint32_t phase = 0;
    uint32_t q_iter = 0;
    for (int k = 0;; ++k) {
        const int t = hand_out_tile<C>(p, bars, k);
        Tile g;
        if (!work_item<C>(p, t, k, g)) break;
        trace(p, 0, k, 0, true);
        if (!g.rows || g.n_hi <= g.n_lo) continue; /* consumers write it without loads */
        const int hk = g.hk;
        const int bq = p.cu_q ? 0 : g.b;
        const int bk = p.cu_k ? 0 : g.b;
        /* Q tile number q_iter goes to buffer q_iter % QB; its use number
         * q_iter / QB gives the phase parity. */
        const int qb = (int)(q_iter % C::QB);
        const uint32_t q_par = (q_iter / C::QB) & 1;
        if (C::QB == 2) {
            /* The other buffer: released by the tile before the current one,
             * so the next tile's Q is in flight while the current tile runs. */
            FC90_WAIT(bars.q_empty(qb), q_par ^ 1);
            mbar_arrive_expect_tx(bars.q_full(qb), C::Q_BYTES);
            load_q<C>(&p.tm_q, base + C::OFF_Q + qb * C::Q_BYTES, bars.q_full(qb), g.q_off + row_pos(p, g.m0),
                      g.hu, bq);
            ++q_iter;
        }
        for (int n = g.n_hi - 1; n >= g.n_lo; --n) {
            int krow = g.k_off + n * C::BN, kb = bk;
            if constexpr (kPaged) page_of(p, g.b, krow, kb);
            FC90_WAIT(bars.k_empty(stage), phase ^ 1);
            mbar_arrive_expect_tx(bars.k_full(stage), C::KV_BYTES);
            load_kv<C>(&p.tm_k, base + C::OFF_K + stage * C::KV_BYTES, bars.k_full(stage), krow, hk, kb);
            FC90_WAIT(bars.v_empty(stage), phase ^ 1);
            mbar_arrive_expect_tx(bars.v_full(stage), C::KV_BYTES);
            load_kv<C>(&p.tm_v, base + C::OFF_V + stage * C::KV_BYTES, bars.v_full(stage), krow, hk, kb);
            if (C::QB == 1 && n == g.n_hi - 1) {
                /* One Q buffer: Q after the first K and V, since the previous
                 * tile's epilogue may still use the buffer as O staging, and
                 * this way the first K/V of the tile stream in meanwhile. */
                FC90_WAIT(bars.q_empty(0), (q_iter & 1) ^ 1);
                mbar_arrive_expect_tx(bars.q_full(0), C::Q_BYTES);
                load_q<C>(&p.tm_q, base + C::OFF_Q, bars.q_full(0), g.q_off + row_pos(p, g.m0), g.hu, bq);
                ++q_iter;
            }
            if (n == g.n_hi - 1) trace(p, 0, k, 1, true); /* first K/V issued */
            if (++stage == C::ST) {
                stage = 0;
                phase ^= 1;
            }
        }
        trace(p, 0, k, 2, true); /* every load of the tile issued */
    }
}

} /* namespace fc90 */

#endif /* FC_SM90_PRODUCER_CUH */
