/*
 * bwd_scores.cuh -- the elementwise middle of a backward block: from a
 * warp's S^T (SK keys x SQ queries, raw q.k) and dP^T (dO V^T, same
 * shape) to the probabilities P^T and the score gradients dS^T, in place:
 *
 *   t  = softcap on ? tanh(q.k * scale/softcap) : q.k
 *   P  = 2^(t * sl2 - lse2[i])           (= exp(s - lse), lse2 = lse * log2 e)
 *   dS = P * (dP - D[i])  [* (1 - t^2) with softcap: d tanh]
 *
 * Masked pairs (outside the band or either sequence) get P = 0, so dS = 0;
 * rows without any visible key arrive with lse2 = +inf (preprocess), P = 0.
 * MASK and SOFTCAP are compile-time, so that each block runs only its own
 * code (with a run-time softcap test the d128 kernel spilled).
 * The factor scale of dQ and dK is applied once at the end (convert,
 * epilogue). A thread holds keys wrow + 16 mt + g and + 8 of each m16
 * tile mt (C fragment rows) and queries q0 + 8 nt + 2 t, + 1 of each n8
 * tile nt (wrow, q0: the warp's first key and query in the block).
 */
#ifndef FC_SM80_BWD_SCORES_CUH
#define FC_SM80_BWD_SCORES_CUH

#include <stdint.h>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/bwd_ranges.h"
#include "cuda/sm80/bwd_shape.cuh"
#include "cuda/sm80/layout.cuh"

namespace fc {
namespace sm80 {

template <class S_, bool MASK, bool SOFTCAP>
__device__ __forceinline__ void p_and_ds(float (&s)[S_::MT][S_::QTL][4], float (&dp)[S_::MT][S_::QTL][4], int buf,
                                         const BwdThr &th, float sl2, float softcap_in, const fc_bwd_mask &bm)
{
    using SM = BwdSmem<S_>;
#pragma unroll
    for (int nt = 0; nt < S_::QTL; ++nt) {
        const uint32_t col = 4 * (th.q0 + 8 * nt + 2 * th.t);
        /* volatile loads, each where it is used: hoisted, the pairs of all
         * n8 tiles were live at once and the d128 kernel spilled */
        const uint64_t lw = dev::lds64(SM::lse2(buf) + col), dw = dev::lds64(SM::dsum(buf) + col);
        const float2 l2 = make_float2(__uint_as_float((uint32_t)lw), __uint_as_float((uint32_t)(lw >> 32)));
        const float2 dd = make_float2(__uint_as_float((uint32_t)dw), __uint_as_float((uint32_t)(dw >> 32)));
#pragma unroll
        for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float x = s[mt][nt][e];
                const float t = SOFTCAP ? dev::tanh_acc(x * softcap_in) : x;
                float p = ptx::ex2(fmaf(t, sl2, -((e & 1) ? l2.y : l2.x)));
                if constexpr (MASK) {
                    const int j = bm.j0 + 16 * mt + 8 * (e >> 1), i = bm.i0 + 8 * nt + (e & 1);
                    if (fc_bwd_hidden(bm, j, i)) p = 0.f;
                }
                float ds = p * (dp[mt][nt][e] - ((e & 1) ? dd.y : dd.x));
                if constexpr (SOFTCAP) ds *= 1.f - t * t;
                s[mt][nt][e] = p;
                dp[mt][nt][e] = ds;
            }
    }
}

/* A warp's P^T or dS^T (16-bit) into its rows and columns of a block_n
 * keys x block_m queries tile (panels of a block_m-wide tile), for the
 * GEMMs that read it from shared memory. Every row it writes is g modulo
 * 8, so the swizzle comes from g and the rows' other parts are immediates
 * (through panel_offset, the addresses took 4 integer ops per store). */
template <bool kBF16, class S_>
__device__ __forceinline__ void store_scores(uint32_t sT, const BwdThr &th, const float (&x)[S_::MT][S_::QTL][4])
{
    using DS = typename S_::DS;
    constexpr int PC = DS::PC, PB = DS::PB;
    const uint32_t rb = sT + (th.wrow + th.g) * PB + 4 * th.t;
#pragma unroll
    for (int nt = 0; nt < S_::QTL; ++nt) {
        const int c = th.q0 / 8 + nt;
        const uint32_t at = rb + (c >> DS::LPC) * (S_::BN * PB) + (((c & (PC - 1)) ^ panel_swz<PC>(th.g)) << 4);
#pragma unroll
        for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
                ptx::sts32(at + (16 * mt + 8 * hf) * PB, ptx::pack2<kBF16>(x[mt][nt][2 * hf], x[mt][nt][2 * hf + 1]));
    }
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_SCORES_CUH */
