/*
 * consumer.cuh -- a consumer warpgroup's tile loop: take the next tile
 * (scheduler.cuh), run its KV blocks (mainloop.cuh), merge and store it
 * (epilogue.cuh), and hand the Q buffers back to the producer.
 *
 * With 2 Q buffers the producer loads tile i+1's Q while tile i runs; with
 * 1 it waits until tile i's epilogue has released the buffer. The rotated
 * loop (kRotate, rows that can_rotate) also issues a tile's first S during
 * the previous tile's epilogue.
 */
#ifndef FC_SM90_CONSUMER_CUH
#define FC_SM90_CONSUMER_CUH

#include "cuda/sm90/epilogue.cuh"
#include "cuda/sm90/mainloop.cuh"

namespace fc90 {

/* The CTA's next tile with KV blocks to visit; tiles without query rows are
 * skipped and tiles without KV blocks finished on the way (write_empty_tile),
 * as the producer skips both. slot counts the scheduler's hand-outs; k is
 * the returned tile's (for trace stamps). False when none is left. */
template <class C>
__device__ __forceinline__ bool next_tile(const fc_sm90_params &p, const Bars<C> &bars, int &slot, Tile &g, int &k,
                                          int row_wg, int col_t)
{
    for (;;) {
        const int s = slot++;
        const int t = take_tile<C>(p, bars, s);
        if (!work_item<C>(p, t, s, g)) return false;
        if (!g.rows) continue;
        if (g.n_hi <= g.n_lo) {
            write_empty_tile<C>(p, g, row_wg, col_t);
            continue;
        }
        k = s;
        return true;
    }
}

/* The tile loop. Rotated: a tile's first S = Q K^T is issued before the
 * loop for the first tile and by the previous tile's epilogue for every
 * later one, so S0 is in flight on every edge into the loop head, which
 * keeps ptxas to one register assignment for it and no wgmma
 * serialisation. Otherwise (the plain order, what one tile per CTA wants:
 * plan.cu) it is issued at the loop head. */
template <class C, bool kBF16, bool kRotate, int kMask>
__device__ void consumer(const fc_sm90_params &p, int cw, uint32_t base, uint8_t *smem, const Bars<C> &bars)
{
    constexpr bool ROT = kRotate && can_rotate(C::T);
    const WgThread w = wg_thread<C>(cw);

    /* Pingpong: the last warpgroup gives warpgroup 0 its first turn. */
    if (C::PP && cw == C::WG - 1) bar_arrive(kBarSched + 0, 256);

    int stage = 0;
    uint32_t phase = 0;
    uint32_t q_iter = 0; /* work tiles so far: Q buffer q_iter % QB, parity (q_iter / QB) & 1 */
    int q_release = -1;  /* 2 Q buffers: the previous tile's, not yet handed back */
    uint32_t ring = 0;   /* kvsplit: KV blocks of this CTA's earlier tiles (ring position) */
    uint32_t merges = 0; /* kvsplit: tiles merged so far (m_full/m_empty parity) */
    bool mine = true;    /* kvsplit: this warpgroup has a block of the tile */
    int slot = 0;
    Tile g;
    int k = 0;
    float S0[C::BN / 2]; /* the tile's first S block */
    bool more = true;
    if (ROT) {
        more = next_tile<C>(p, bars, slot, g, k, w.row_wg, w.col_t);
        issue_first_s<C, kBF16>(S0, bars, base, base + C::OFF_Q + 64 * w.rg * C::SW, 0, 0, stage, phase, cw, more);
    }
    while (more) {
        if (!ROT) {
            /* One Q buffer: the tile's Q lands where the previous tile's O
             * was staged, so nothing can be issued early. */
            if (!next_tile<C>(p, bars, slot, g, k, w.row_wg, w.col_t)) break;
            const int qt = (int)(q_iter % C::QB);
            if (C::KVS > 1) {
                /* The tile's blocks take ring positions ring.. in producer
                 * order; this warpgroup's first is ring + kv. */
                const uint32_t pos = ring + (uint32_t)w.kv;
                stage = (int)(pos % C::ST);
                phase = (pos / C::ST) & 1;
                mine = w.kv < g.n_hi - g.n_lo;
            }
            /* kvsplit: issued in attend_tile, on the branch that waits for it
             * (a wgmma result live across a branch join makes ptxas wait). */
            if (C::KVS == 1)
                issue_first_s<C, kBF16>(S0, bars, base, base + C::OFF_Q + qt * C::Q_BYTES + 64 * w.rg * C::SW, qt,
                                        (q_iter / C::QB) & 1, stage, phase, cw, true);
        }
        trace(p, cw + 1, k, 0, w.tid == 0);
        const int qb = (int)(q_iter % C::QB);
        const uint32_t q_off = C::OFF_Q + qb * C::Q_BYTES;        /* this tile's Q (and O staging) */
        const uint32_t q_addr = base + q_off + 64 * w.rg * C::SW; /* this warpgroup's Q rows */
        const MaskRows mr = mask_rows(p, g, w.row_wg);
        float O[C::D / 2];
        RowState rs;
        if (!mine) {
            /* kvsplit, a tile of one block: the other warpgroup has it. An
             * empty partial (max -inf, sum 0, O 0) for the merge. */
            if (C::QB == 2 && q_release >= 0) release_q<C>(p, bars, w.tid, q_release), q_release = -1;
#pragma unroll
            for (int i = 0; i < C::D / 2; ++i) O[i] = 0.0f;
#pragma unroll
            for (int r = 0; r < 2; ++r) rs.m[r] = neg_inf(), rs.l[r] = 0.0f;
        } else {
            attend_tile<C, kBF16, kMask>(p, g, bars, base, w, k, S0, q_addr, qb, (q_iter / C::QB) & 1, stage, phase,
                                         q_release, O, rs, mr);
        }
        trace(p, cw + 1, k, 3, w.tid == 0);
        if (C::KVS > 1) {
            kvsplit_merge<C>(p, bars, smem, w.tid, w.kv, merges, rs, O);
            ring += (uint32_t)(g.n_hi - g.n_lo);
        }
        const int q_next = (int)((q_iter + 1) % C::QB);
        const uint32_t q_next_par = ((q_iter + 1) / C::QB) & 1;
        Tile gn;
        int kn = 0;
        if (ROT) {
            /* The next tile's Q is in the other buffer: its first S runs
             * during this tile's epilogue. */
            more = next_tile<C>(p, bars, slot, gn, kn, w.row_wg, w.col_t);
            issue_first_s<C, kBF16>(S0, bars, base, base + C::OFF_Q + q_next * C::Q_BYTES + 64 * w.rg * C::SW, q_next,
                                    q_next_par, stage, phase, cw, more);
        }
        bool store = w.kv == 0; /* kvsplit: the first warpgroup of the pair stores */
        if constexpr (C::TAIL) {
            /* tail balancing: a part of a split tile stores only if it merged */
            int part_slot = 0;
            const int part = tail_part<C>(p, g, part_slot);
            if (part >= 0) store = tail_merge<C>(p, part, part_slot, bars, cw, w.tid, rs, O);
        }
        if (store) store_tile<C, kBF16>(p, g, base, smem, w, q_off, rs, O);
        /* With 2 Q buffers this one is refilled only for the tile after next:
         * hand it back during the next tile (release_q), by when the O store
         * has long read it, instead of waiting for that read here with the
         * whole warpgroup behind thread 0. */
        if (C::QB == 2) q_release = qb;
        else release_q<C>(p, bars, w.tid, qb);
        ++q_iter;
        trace(p, cw + 1, k, 4, w.tid == 0);
        if (ROT) {
            g = gn;
            k = kn;
        }
    }
    if (ROT) {
        /* The dropped S (issue_first_s). Reading S0 after the wait keeps its
         * registers reserved until then: a wgmma result that is never read
         * would otherwise be dead from its issue on, and its registers free
         * for other values while the tensor core still writes them. */
        wg_wait<0>();
        fence_regs(S0);
    }
    /* The last O stores must land before the CTA's shared memory goes away. */
    if (p.o_tma && w.tid == 0) tma_store_wait_all();
    trace_gt(p, cw + 1, 5, w.tid == 0);
}

} /* namespace fc90 */

#endif /* FC_SM90_CONSUMER_CUH */
