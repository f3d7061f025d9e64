/*
 * consumer.cuh -- a consumer warpgroup's tile loop: take the next tile
 * (scheduler.cuh), run its KV blocks with the GEMM rounds of mainloop.cuh
 * and the softmax of softmax.cuh, merge and store it (epilogue.cuh), and
 * hand the Q buffers back to the producer.
 *
 * Block loops: overlap (cfg.overlap) issues S_j and O += P_{j-1} V_{j-1}
 * back to back and runs the softmax of block j while the P.V GEMM is on the
 * tensor cores; plain runs S, softmax, P.V per block, waiting for each.
 * With 2 Q buffers the producer loads tile i+1's Q while tile i runs; with
 * 1 it waits until tile i's epilogue has released the buffer.
 *
 * `consumer` is kept one function: moving its blocks into functions, even
 * verbatim, renumbers the PTX virtual registers, and ptxas then allocates
 * and schedules differently, so the SASS would no longer be the measured one.
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
        int t;
        if (p.tile_ctr) {
            FC90_WAIT(bars.t_full(s & 1), (s >> 1) & 1);
            t = (int)lds32(bars.t_slot(s & 1));
            mbar_arrive(bars.t_empty(s & 1));
        } else {
            t = (int)blockIdx.x + s * (int)gridDim.x;
        }
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

/* The tile loop is rotated: a tile's first S = Q K^T is issued before the
 * loop for the first tile, and for every later one by the previous tile's
 * epilogue, so that (2 Q buffers) it runs on the tensor cores while the
 * previous tile's O is normalised, stored and the tile ends. S0 is thus in
 * flight on every edge into the loop head, which keeps ptxas to one register
 * assignment for it and no wgmma serialisation. */
template <class C, bool kBF16, bool kRotate, int kMask>
__device__ void consumer(const fc_sm90_params &p, int cw, uint32_t base, uint8_t *smem, const Bars<C> &bars)
{
    /* Rotated tile loop (above) with 2 Q buffers and kRotate; otherwise a
     * tile's first S is issued at the loop head (the plain order), which is
     * what one tile per CTA wants (plan.cu: choose_rotate). */
    constexpr bool ROT = kRotate && can_rotate(C::T);
    const int tid = threadIdx.x - 128 * (cw + 1); /* 0..127 within the warpgroup */
    const int warp = tid >> 5;
    const int lane = tid & 31;
    /* kvsplit: warpgroup cw computes the tile's rows 64*rg.. over every
     * KVS-th KV block from the kv-th; otherwise rg = cw and kv = 0. */
    const int rg = cw / C::KVS;
    const int kv = cw % C::KVS;
    const int row_wg = 64 * rg + 16 * warp + (lane >> 2); /* tile row of acc rows r (and r+8) */
    const int col_t = 2 * (lane & 3);                     /* column of acc[4j] within group j */

    /* Pingpong: the last warpgroup gives warpgroup 0 its first turn. */
    if (C::PP && cw == C::WG - 1) bar_arrive(kBarSched + 0, 256);

    int stage = 0;
    uint32_t phase = 0;
    uint32_t q_iter = 0; /* work tiles so far: Q buffer q_iter % QB, parity (q_iter / QB) & 1 */
    int q_release = -1;  /* 2 Q buffers: the previous tile's, not yet handed back */
    /* Hand Q buffer b back: our generic reads/writes of it, and the O store's
     * reads of the staging (issuing thread), come before the next TMA (async
     * proxy) write into it. */
    auto release_q = [&](int b) {
        if (p.o_tma && tid == 0) tma_store_wait_read();
        fence_proxy_async();
        mbar_arrive(bars.q_empty(b));
    };
    auto q_rows = [&](int b) { return base + C::OFF_Q + b * C::Q_BYTES + 64 * rg * C::SW; };
    /* One step of this warpgroup through the K/V ring: KVS blocks. */
    auto advance = [&](int &st, uint32_t &ph) {
        for (int i = 0; i < C::KVS; ++i)
            if (++st == C::ST) { st = 0; ph ^= 1; }
    };
    uint32_t ring = 0;   /* kvsplit: KV blocks of this CTA's earlier tiles (ring position) */
    uint32_t merges = 0; /* kvsplit: tiles merged so far (m_full/m_empty parity) */
    bool mine = true;  /* kvsplit: this warpgroup has a block of the tile */
    int slot = 0;
    Tile g;
    int k = 0;
    float S0[C::BN / 2]; /* the tile's first S block */
    bool more = true;
    if (ROT) {
        more = next_tile<C>(p, bars, slot, g, k, row_wg, col_t);
        issue_first_s<C, kBF16>(S0, bars, base, q_rows(0), 0, 0, stage, phase, cw, more);
    }
    while (more) {
        if (!ROT) {
            /* The plain order (one Q buffer: the tile's Q lands where the
             * previous tile's O was staged, so nothing can be issued early). */
            if (!next_tile<C>(p, bars, slot, g, k, row_wg, col_t)) break;
            const int qt = (int)(q_iter % C::QB);
            if (C::KVS > 1) {
                /* The tile's blocks take ring positions ring.. in producer
                 * order; this warpgroup's first is ring + kv. */
                const uint32_t pos = ring + (uint32_t)kv;
                stage = (int)(pos % C::ST);
                phase = (pos / C::ST) & 1;
                mine = kv < g.n_hi - g.n_lo;
            }
            /* kvsplit: issued below, on the branch that waits for it (a
             * wgmma result live across a branch join makes ptxas wait). */
            if (C::KVS == 1)
                issue_first_s<C, kBF16>(S0, bars, base, q_rows(qt), qt, (q_iter / C::QB) & 1, stage, phase, cw,
                                        true);
        }
        trace(p, cw + 1, k, 0, tid == 0);
        const int qb = (int)(q_iter % C::QB);
        const uint32_t q_off = C::OFF_Q + qb * C::Q_BYTES; /* this tile's Q (and O staging) */
        const uint32_t q_addr = base + q_off + 64 * rg * C::SW; /* this warpgroup's Q rows */
        MaskRows mr;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row_pos(p, g.m0 + row_wg + 8 * r);
            mr.lo[r] = key_lo(row, g.sq, g.sk, p.window_left);
            mr.hi[r] = key_hi(row, g.sq, g.sk, p.window_right);
        }
        float S[C::BN / 2];
        uint32_t P[C::BN / 4];
        float alpha[2];
        float O[C::D / 2];
        RowState rs;
        int n = g.n_hi - 1 - kv;

        if (!mine) {
            /* kvsplit, a tile of one block: the other warpgroup has it. An
             * empty partial (max -inf, sum 0, O 0) for the merge. */
            if (C::QB == 2 && q_release >= 0) release_q(q_release), q_release = -1;
#pragma unroll
            for (int i = 0; i < C::D / 2; ++i) O[i] = 0.0f;
#pragma unroll
            for (int r = 0; r < 2; ++r) rs.m[r] = neg_inf(), rs.l[r] = 0.0f;
        } else {
        if (C::KVS > 1)
            issue_first_s<C, kBF16>(S0, bars, base, q_addr, qb, (q_iter / C::QB) & 1, stage, phase, cw, true);
        /* first block: S0 (in flight), softmax, P */
        wg_wait<0>();
        fence_regs(S0);
        trace(p, cw + 1, k, 1, tid == 0);
        mbar_arrive(bars.k_empty(stage));
        /* Varlen calls always run the any-block-mask instance (mask_mode.h),
         * so only it carries the code: in the others it cost 1-2% at
         * s512-d64 and s2k-d128 though never executed. */
        if constexpr (kMask == kMaskAny) zero_v_tail<C>(p, g, n, bars, base, stage, phase);
#pragma unroll
        for (int i = 0; i < C::D / 2; ++i) O[i] = 0.0f;
        softmax_block<C::BN, true, kMask>(S0, rs, alpha, p, block_masked<C>(g, n), n * C::BN + col_t, mr);
        convert_p<C::BN, kBF16>(S0, P);
        if (C::QB == 2 && q_release >= 0) release_q(q_release), q_release = -1;
        trace(p, cw + 1, k, 2, tid == 0);
        int v_stage = stage;
        uint32_t v_phase = phase;
        advance(stage, phase);

        if (C::OV) {
            /* S_j and O += P_{j-1} V_{j-1} issued together; the softmax of
             * block j runs while the P.V GEMM is on the tensor cores. */
            for (n -= C::KVS; n >= g.n_lo; n -= C::KVS) {
                FC90_WAIT(bars.k_full(stage), phase);
                /* V_{j-1} was issued before K_j: waiting here costs nothing
                 * and keeps the wait loop out of the fence..wgmma window
                 * (ptxas would otherwise inject a second fence, C7519). */
                FC90_WAIT(bars.v_full(v_stage), v_phase);
                round_begin<C>(cw);
                issue_s<C, kBF16>(S, q_addr, base + C::OFF_K + stage * C::KV_BYTES);
                wg_commit();
                issue_pv<C, kBF16>(O, P, base + C::OFF_V + v_stage * C::KV_BYTES);
                round_end<C>(cw);
                wg_wait<1>(); /* S_j done, P.V of the previous block may still run */
                fence_regs(S);
                mbar_arrive(bars.k_empty(stage));
                softmax_block<C::BN, false, kMask>(S, rs, alpha, p, block_masked<C>(g, n), n * C::BN + col_t, mr);
                wg_wait<0>();
                fence_regs(O);
                fence_regs(S);
                fence_regs(P);
                mbar_arrive(bars.v_empty(v_stage));
                rescale_o<C::D>(O, alpha);
                convert_p<C::BN, kBF16>(S, P);
                v_stage = stage;
                v_phase = phase;
                advance(stage, phase);
            }
            pv_round<C, kBF16>(O, P, bars, base, v_stage, v_phase, cw); /* the last P.V */
        } else {
            /* Plain order: P.V of the first block, then S, softmax, P.V per
             * block, waiting for each. */
            pv_round<C, kBF16>(O, P, bars, base, v_stage, v_phase, cw);
            for (n -= C::KVS; n >= g.n_lo; n -= C::KVS) {
                FC90_WAIT(bars.k_full(stage), phase);
                round_begin<C>(cw);
                issue_s<C, kBF16>(S, q_addr, base + C::OFF_K + stage * C::KV_BYTES);
                round_end<C>(cw);
                wg_wait<0>();
                fence_regs(S);
                mbar_arrive(bars.k_empty(stage));
                softmax_block<C::BN, false, kMask>(S, rs, alpha, p, block_masked<C>(g, n), n * C::BN + col_t, mr);
                rescale_o<C::D>(O, alpha);
                convert_p<C::BN, kBF16>(S, P);
                pv_round<C, kBF16>(O, P, bars, base, stage, phase, cw);
                advance(stage, phase);
            }
        }
        } /* mine */

        trace(p, cw + 1, k, 3, tid == 0);
        if (C::KVS > 1) {
            /* Merge the pair's partials, thread t with thread t (the same
             * rows and columns): the second warpgroup hands its m, l, O over
             * shared memory (m_full) and goes on to its next tile; the first
             * rescales both to the common max and hands the area back
             * (m_empty). Merge number `merges` gives the parity. */
            float *mg = reinterpret_cast<float *>(smem + C::OFF_MERGE) + tid;
            const uint32_t m_par = merges & 1;
            ++merges;
            if (kv == 1) {
                FC90_WAIT(bars.m_empty(), m_par ^ 1);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    mg[128 * r] = rs.m[r];
                    mg[128 * (2 + r)] = rs.l[r];
                }
#pragma unroll
                for (int i = 0; i < C::D / 2; ++i) mg[128 * (4 + i)] = O[i];
                mbar_arrive(bars.m_full());
            } else {
                FC90_WAIT(bars.m_full(), m_par);
                float f0[2], f1[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float m1 = mg[128 * r];
                    const float mn = fmaxf(rs.m[r], m1);
                    const float ms = max_shift(mn, p.scale_log2);
                    f0[r] = ex2(rs.m[r] * p.scale_log2 - ms);
                    f1[r] = ex2(m1 * p.scale_log2 - ms);
                    rs.l[r] = rs.l[r] * f0[r] + mg[128 * (2 + r)] * f1[r];
                    rs.m[r] = mn;
                }
#pragma unroll
                for (int i = 0; i < C::D / 2; ++i) {
                    const int r = (i >> 1) & 1; /* acc[4j+0..1]: row r, acc[4j+2..3]: row r+8 */
                    O[i] = O[i] * f0[r] + mg[128 * (4 + i)] * f1[r];
                }
                mbar_arrive(bars.m_empty());
            }
            ring += (uint32_t)(g.n_hi - g.n_lo);
        }
        const int q_next = (int)((q_iter + 1) % C::QB);
        const uint32_t q_next_par = ((q_iter + 1) / C::QB) & 1;
        Tile gn;
        int kn = 0;
        if (ROT) {
            /* The next tile's Q is in the other buffer: its first S runs
             * during this tile's epilogue. */
            more = next_tile<C>(p, bars, slot, gn, kn, row_wg, col_t);
            issue_first_s<C, kBF16>(S0, bars, base, q_rows(q_next), q_next, q_next_par, stage, phase, cw, more);
        }
        bool store = kv == 0; /* kvsplit: the first warpgroup of the pair stores */
        if constexpr (C::TAIL) {
            /* tail balancing: a part of a split tile stores only if it merged */
            int slot = 0;
            const int part = tail_part<C>(p, g, slot);
            if (part >= 0) store = tail_merge<C>(p, part, slot, bars, cw, tid, rs, O);
        }
        if (store) {
        /* ---- finalize: O / l, lse = max*scale + ln(l) (natural log) ---- */
        float lse[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = rs.l[r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const bool empty = rs.m[r] == neg_inf() || !(l > 0.0f);
            const float inv = empty ? 0.0f : 1.0f / l;
            /* ln(l) as log2(l) * ln 2 with the hardware log2 (MUFU.LG2, as the
             * sm80 path): logf is a ~30-instruction routine in every tile's
             * epilogue, and its extra accuracy is far below the LSE bound. */
            lse[r] = empty ? neg_inf() : (rs.m[r] * p.scale_log2 + __log2f(l)) * FC_LN2_F;
#pragma unroll
            for (int j = 0; j < C::D / 8; ++j) {
                O[4 * j + 2 * r] *= inv;
                O[4 * j + 2 * r + 1] *= inv;
            }
        }

        /* The thread's two rows: position and query head. */
        int pos_r[2], head_r[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            pos_r[r] = row_pos(p, g.m0 + row_wg + 8 * r);
            head_r[r] = row_head(p, g, g.m0 + row_wg + 8 * r);
        }
        /* An opaque copy of the thread index: without it the compiler hoists
         * the D/4 per-thread staging addresses out of the tile loop and keeps
         * them live across the main loop (spills at head_dim 192/256). */
        int etid = tid;
        asm volatile("" : "+r"(etid));
        /* Phase A: everything that reads O. */
        if (p.num_splits.d > 1) {
            /* fp32 partials for the shared combine kernel:
             * o_accum [split][b*Hq+h][seqlen_q][D], lse_accum [split][b*Hq+h][seqlen_q]. */
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                if (pos_r[r] >= g.sq) continue;
                const int64_t plane =
                    (((int64_t)g.split * p.batch + g.b) * p.heads_q + head_r[r]) * p.seqlen_q + pos_r[r];
                float *dst = p.o_accum + plane * C::D + col_t;
#pragma unroll
                for (int j = 0; j < C::D / 8; ++j)
                    *reinterpret_cast<float2 *>(dst + 8 * j) = make_float2(O[4 * j + 2 * r], O[4 * j + 2 * r + 1]);
                if ((lane & 3) == 0) p.lse_accum[plane] = lse[r];
            }
        } else {
            /* Stage the 16-bit tile in this warpgroup's rows of the Q buffer
             * (its last S GEMM has completed in every warp once all four
             * reach the barrier). */
            bar_sync(kBarEpi + cw, 128);
            const int e_row = 64 * rg + 16 * (etid >> 5) + ((etid & 31) >> 2);
            const int e_col = 2 * (etid & 3);
#pragma unroll
            for (int j = 0; j < C::D / 8; ++j) {
                const int col = 8 * j + e_col;
                const uint32_t pan = (uint32_t)(col / C::PW) * (C::BM * C::SW);
                const uint32_t cb = (uint32_t)(col % C::PW) * 2;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint32_t off = q_off + pan + (uint32_t)(e_row + 8 * r) * C::SW + cb;
                    *reinterpret_cast<uint32_t *>(smem + swz<C::SW>(off)) =
                        pack2<kBF16>(O[4 * j + 2 * r], O[4 * j + 2 * r + 1]);
                }
            }
        }
        /* Phase B: LSE, and O from the staging to global memory. */
        if (p.num_splits.d == 1) {
            if (p.lse && (lane & 3) == 0) {
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    if (pos_r[r] < g.sq)
                        p.lse[g.b * p.lse_batch_stride + head_r[r] * p.lse_head_stride +
                              (int64_t)(g.q_off + pos_r[r]) * p.lse_row_stride] = lse[r];
            }
            if (p.o_tma) {
                /* TMA store of the warpgroup's 64 rows (one box per panel):
                 * the staging writes go to the async proxy first; rows past
                 * seqlen_q are clipped by the tensor map. */
                fence_proxy_async();
                bar_sync(kBarEpi + cw, 128);
                if (etid == 0) {
                    const int pos0 = g.q_off + row_pos(p, g.m0 + 64 * rg);
#pragma unroll
                    for (int pn = 0; pn < C::PANELS; ++pn)
                        tma_store_5d(&p.tm_o, base + q_off + pn * (C::BM * C::SW) + 64 * rg * C::SW, pn * C::PW, 0,
                                     g.hu, pos0, g.b);
                    tma_store_commit();
                }
            } else {
                bar_sync(kBarEpi + cw, 128);
                uint16_t *o16 = reinterpret_cast<uint16_t *>(p.o) + g.b * p.o_batch_stride;
                store_o_generic<C>(p, g, o16, smem, q_off, rg, etid);
            }
        }
        } /* store */
        /* With 2 Q buffers this one is refilled only for the tile after next:
         * hand it back during the next tile (release_q), by when the O store
         * has long read it, instead of waiting for that read here with the
         * whole warpgroup behind thread 0. */
        if (C::QB == 2) q_release = qb;
        else release_q(qb);
        ++q_iter;
        trace(p, cw + 1, k, 4, tid == 0);
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
    if (p.o_tma && tid == 0) tma_store_wait_all();
    trace_gt(p, cw + 1, 5, tid == 0);
}

} /* namespace fc90 */

#endif /* FC_SM90_CONSUMER_CUH */
