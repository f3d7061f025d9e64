/*
 * bwd_mainloop.cuh -- one query block of a backward CTA (block_m rows of
 * query head h_kv * group + g against the CTA's block_n keys), with Q, dO,
 * lse2 and D in buffer buf and K, V resident. Per pass of sub_m rows:
 *
 *   dP^T = V_w dO^T         each warp: its 16 keys x sub_m queries
 *   S^T  = K_w Q^T          (the forward's gemm_qk, mma.cuh)
 *   P^T, dS^T               bwd_scores.cuh (masks only where the block
 *                           straddles the band or a sequence end)
 *   dV  += P^T dO           (the forward's gemm_pv, P from registers)
 *   dK  += dS^T Q
 *   dS^T -> smem
 * then, once per block: barrier; dQ_blk = dS K (all warps); adds into
 * dq_accum.
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

/* One pass: query rows q0 .. q0 + SUB - 1 of the block. */
template <bool kBF16, class S_>
__device__ __forceinline__ void bwd_pass(const fc_sm80_bwd_args &a, const Thr &th, int m, int buf, int q0,
                                         float (&dk)[1][S_::DTL][4], float (&dv)[1][S_::DTL][4])
{
    using KQ = typename S_::KQ;
    using SM = BwdSmem<S_>;
    const fc_fwd_params &f = a.p.f;
    /* the pass's rows of the Q and dO tiles: whole 8-row groups further on */
    const uint32_t sQ = SM::q(buf) + q0 * S_::PB, sO = SM::dout(buf) + q0 * S_::PB;
    const QFrags<KQ> none = {};
    float s[1][S_::QTL][4], dp[1][S_::QTL][4];
    gemm_qk<kBF16, KQ>(dp, none, SM::v(), sO, th.wrow, th.lane);
    gemm_qk<kBF16, KQ>(s, none, SM::k(), sQ, th.wrow, th.lane);
    {
        const BwdCoords c = bwd_coords(a);
        BlockMask bm;
        bm.j0 = c.n * S_::BN + th.wrow + th.g;
        bm.i0 = m * S_::BM + 2 * th.t;
        bm.sq = c.sq;
        bm.sk = c.sk;
        bm.lo = fc_bwd_band_lo(c.sq, c.sk, f.window_left);
        bm.hi = fc_bwd_band_hi(c.sq, c.sk, f.window_right);
        const bool full = fc_bwd_block_full(m, c.n, S_::BM, S_::BN, c.sq, c.sk, f.window_left, f.window_right);
        if (a.softcap_in != 0.f) {
            if (full) p_and_ds<S_, false, true>(s, dp, buf, q0, th, a.sl2, a.softcap_in, bm);
            else p_and_ds<S_, true, true>(s, dp, buf, q0, th, a.sl2, a.softcap_in, bm);
        } else {
            if (full) p_and_ds<S_, false, false>(s, dp, buf, q0, th, a.sl2, a.softcap_in, bm);
            else p_and_ds<S_, true, false>(s, dp, buf, q0, th, a.sl2, a.softcap_in, bm);
        }
    }
    gemm_pv<kBF16, KQ>(dv, s, sO, th.lane);
    gemm_pv<kBF16, KQ>(dk, dp, sQ, th.lane);
    store_ds<kBF16, S_>(SM::ds(), q0, th, dp);
}

template <bool kBF16, class S_>
__device__ __forceinline__ void bwd_block(const fc_sm80_bwd_args &a, const Thr &th, int g, int m, int buf,
                                          float (&dk)[1][S_::DTL][4], float (&dv)[1][S_::DTL][4])
{
#pragma unroll 1
    for (int q0 = 0; q0 < S_::BM; q0 += S_::SUB) bwd_pass<kBF16, S_>(a, th, m, buf, q0, dk, dv);
    __syncthreads(); /* dS^T complete for the dQ GEMM */

    const int warp = th.tid >> 5, rg = warp / S_::DQ_CW, cg = warp - rg * S_::DQ_CW;
    float dq[1][S_::DQ_NTL][4];
    gemm_dq<kBF16, S_>(dq, rg, cg, th.lane);
    const BwdCoords c = bwd_coords(a);
    const int h = c.h_kv * a.group + g;
    if (a.sems) {
        int *sem = dq_turn_wait<S_>(a, c, h, m, th.tid);
        add_dq<S_>(a, c, th, h, m, rg, cg, dq);
        dq_turn_release(sem, th.tid);
    } else {
        add_dq<S_>(a, c, th, h, m, rg, cg, dq);
    }
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_MAINLOOP_CUH */
