/*
 * bwd_mainloop.cuh -- one query block of a backward CTA (block_m rows of
 * query head h_kv * group + g against the CTA's block_n keys), with Q, dO,
 * lse2 and D in buffer buf and K, V resident. Each warp, on its tiles
 * (bwd_shape.cuh: FlashAttention-2's warp layout):
 *
 *   dP^T = V_w dO_w^T       its SK keys x SQ queries
 *   S^T  = K_w Q_w^T        (the forward's gemm_qk, mma.cuh)
 *   P^T, dS^T               bwd_scores.cuh (masks only where the block
 *                           straddles the band or a sequence end)
 *   P^T, dS^T -> smem       (dS^T only, when the warp holds all queries)
 *   barrier
 *   dV  += P^T dO           its SK keys x DK head-dim columns, all queries
 *   dK  += dS^T Q
 *   dQ_blk = dS K           its dQ tile; adds into dq_accum
 *
 * dP^T first: S^T, P and dS then need no value held across a GEMM besides
 * the two accumulators (tanh's t is used within the element).
 */
#ifndef FC_SM80_BWD_MAINLOOP_CUH
#define FC_SM80_BWD_MAINLOOP_CUH

#include <stdint.h>

#include "cuda/sm80/bwd_dq.cuh"
#include "cuda/sm80/bwd_loads.cuh"
#include "cuda/sm80/bwd_ranges.h"
#include "cuda/sm80/bwd_scores.cuh"
#include "cuda/sm80/bwd_shape.cuh"
#include "cuda/sm80/mma.cuh"

namespace fc {
namespace sm80 {

/* acc += A B for a warp's SK keys x DK columns: A = its MT m16 row tiles of
 * the P^T or dS^T tile at sA (keys x block_m queries, ldmatrix), B = the
 * dO or Q tile at sB (block_m queries x head dim, ldmatrix.trans, as the
 * forward's V), columns from 16-column step th.c16. */
template <bool kBF16, class S_>
__device__ __forceinline__ void gemm_scores_t(float (&acc)[S_::MT][S_::DTL][4], uint32_t sA, uint32_t sB,
                                              const BwdThr &th)
{
    using DS = typename S_::DS;
    using KQ = typename S_::KQ;
    const uint32_t offA = ldm_off_a<DS>(loop_lane<DS>(th.lane)), offB = ldm_off_a<KQ>(loop_lane<KQ>(th.lane));
#pragma unroll
    for (int kk = 0; kk < S_::BM / 16; ++kk) {
        uint32_t pa[S_::MT][4];
#pragma unroll
        for (int mt = 0; mt < S_::MT; ++mt)
            ptx::ldmatrix_x4(pa[mt], ldm_addr<DS, S_::BN>(sA, kk, th.wrow + 16 * mt, offA));
#pragma unroll
        for (int dp = 0; dp < S_::DTL / 2; ++dp)
            mma_b_x4<kBF16, true>(acc, dp, pa, ldm_addr<KQ, S_::BM>(sB, th.c16 + dp, kk * 16, offB));
    }
}

/* S^T and dP^T of the warp's tile, then P^T and dS^T in place. */
template <bool kBF16, class S_>
__device__ __forceinline__ void bwd_scores(const fc_sm80_bwd_args &a, const BwdThr &th, int m, int buf,
                                           float (&s)[S_::MT][S_::QTL][4], float (&dp)[S_::MT][S_::QTL][4])
{
    using KQ = typename S_::KQ;
    using SM = BwdSmem<S_>;
    const fc_fwd_params &f = a.p.f;
    /* the warp's query rows of the Q and dO tiles: whole 8-row groups further on */
    const QFrags<KQ> none = {};
    gemm_qk<kBF16, KQ>(dp, none, SM::v(), SM::dout(buf) + th.q0 * S_::PB, th.wrow, th.lane);
    gemm_qk<kBF16, KQ>(s, none, SM::k(), SM::q(buf) + th.q0 * S_::PB, th.wrow, th.lane);
    const BwdCoords c = bwd_coords(a);
    fc_bwd_mask bm;
    bm.j0 = c.n * S_::BN + th.wrow + th.g;
    bm.i0 = m * S_::BM + th.q0 + 2 * th.t;
    bm.sq = c.sq;
    bm.sk = c.sk;
    bm.lo = fc_bwd_band_lo(c.sq, c.sk, f.window_left);
    bm.hi = fc_bwd_band_hi(c.sq, c.sk, f.window_right);
    const bool full = fc_bwd_block_full(m, c.n, S_::BM, S_::BN, c.sq, c.sk, f.window_left, f.window_right);
    if (a.softcap_in != 0.f) {
        if (full) p_and_ds<S_, false, true>(s, dp, buf, th, a.sl2, a.softcap_in, bm);
        else p_and_ds<S_, true, true>(s, dp, buf, th, a.sl2, a.softcap_in, bm);
    } else {
        if (full) p_and_ds<S_, false, false>(s, dp, buf, th, a.sl2, a.softcap_in, bm);
        else p_and_ds<S_, true, false>(s, dp, buf, th, a.sl2, a.softcap_in, bm);
    }
}

/* Each phase derives the thread's coordinates afresh (a volatile %tid.x):
 * held across the block, they spilled. */
template <bool kBF16, bool kDet, class S_>
__device__ __forceinline__ void bwd_block(const fc_sm80_bwd_args &a, int g, int m, int buf,
                                          float (&dk)[S_::MT][S_::DTL][4], float (&dv)[S_::MT][S_::DTL][4])
{
    using KQ = typename S_::KQ;
    using SM = BwdSmem<S_>;
    {
        const BwdThr th = bwd_thread_coords<S_>();
        float s[S_::MT][S_::QTL][4], dp[S_::MT][S_::QTL][4];
        bwd_scores<kBF16, S_>(a, th, m, buf, s, dp);
        const BwdThr tw = bwd_thread_coords<S_>();
        if constexpr (S_::P_SMEM) {
            store_scores<kBF16, S_>(SM::pt(), tw, s);
            store_scores<kBF16, S_>(SM::ds(), tw, dp);
        } else {
            /* the warp holds P^T and dS^T for all queries of its keys */
            gemm_pv<kBF16, KQ>(dv, s, SM::dout(buf), tw.lane);
            gemm_pv<kBF16, KQ>(dk, dp, SM::q(buf), tw.lane);
            store_scores<kBF16, S_>(SM::ds(), tw, dp);
        }
    }
    __syncthreads(); /* P^T and dS^T complete */
    if constexpr (S_::P_SMEM) {
        const BwdThr th = bwd_thread_coords<S_>();
        gemm_scores_t<kBF16, S_>(dv, SM::pt(), SM::dout(buf), th);
        gemm_scores_t<kBF16, S_>(dk, SM::ds(), SM::q(buf), th);
    }

    const BwdThr th = bwd_thread_coords<S_>();
    const int warp = th.tid >> 5, rg = warp / S_::DQ_CW, cg = warp - rg * S_::DQ_CW;
    float dq[S_::DQ_MT][S_::DQ_NTL][4];
    gemm_dq<kBF16, S_>(dq, rg, cg, th.lane);
    const BwdCoords c = bwd_coords(a);
    const int h = c.h0 + g;
    const BwdThr ta = bwd_thread_coords<S_>();
    if constexpr (kDet) {
        dq_turn_wait<S_>(a, h, m, ta.tid);
        add_dq<S_>(a, c, ta, h, m, rg, cg, dq);
        dq_turn_release(a, h, m, ta.tid);
    } else {
        add_dq<S_>(a, c, ta, h, m, rg, cg, dq);
    }
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_MAINLOOP_CUH */
