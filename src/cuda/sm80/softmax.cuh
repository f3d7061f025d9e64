/*
 * softmax.cuh -- the score side of the sm80-class kernel: softcap, the
 * per-element masks of the blocks straddling a band edge or the sequence
 * end, the online softmax (row max/sum in registers, quad shuffles, exp2
 * with the scale folded into one FMA) and the final row sums and LSE.
 *
 * A thread holds 2 rows per m16 tile (hf 0: row g, hf 1: row g + 8 of the
 * MMA C fragment); a row's 4 owners are one quad (lanes xor 1, 2).
 */
#ifndef FC_SM80_SOFTMAX_CUH
#define FC_SM80_SOFTMAX_CUH

#include <stdint.h>

#include "constants.h"
#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/fwd_args.h"
#include "cuda/sm80/layout.cuh"
#include "cuda/sm80/schedule.cuh"

namespace fc {
namespace sm80 {

/* s <- f(s), element by element. */
template <class S_, class F>
__device__ __forceinline__ void map_scores(float (&s)[S_::MT][S_::NTL][4], F f)
{
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S_::NTL; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = f(s[mt][nt][e]);
}

/* s <- tanh(s * scale/softcap); the softmax's sl2 carries softcap*log2e. */
template <class S_>
__device__ __forceinline__ void apply_softcap(float (&s)[S_::MT][S_::NTL][4], float softcap_in)
{
    map_scores<S_>(s, [softcap_in](float x) { return dev::tanh_acc(x * softcap_in); });
}

/* Scores of block n outside each row's [jmin, jmax] -> -inf. */
template <class S_>
__device__ __forceinline__ void apply_mask(float (&s)[S_::MT][S_::NTL][4], int n, const Thr &th, const Smem &sm,
                                           const int (&jmin)[S_::MT][2], const int (&jmax)[S_::MT][2])
{
    constexpr int MT = S_::MT;
    int lo[MT][2], hi[MT][2]; /* [jmin, jmax] of the thread's rows */
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            if constexpr (S_::LEAN_REGS) { /* from the smem table (volatile: really re-read) */
                const uint64_t v = dev::lds64(sm.mask + (uint32_t)(th.wrow + mt * 16 + th.g + 8 * hf) * 8);
                lo[mt][hf] = (int)(uint32_t)v;
                hi[mt][hf] = (int)(uint32_t)(v >> 32);
            } else {
                lo[mt][hf] = jmin[mt][hf];
                hi[mt][hf] = jmax[mt][hf];
            }
        }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S_::NTL; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int hf = e >> 1; /* c0,c1: row g; c2,c3: row g+8 */
                const int j = n * S_::BN + warp_key0<S_>(th) + nt * 8 + 2 * th.t + (e & 1);
                if (j < lo[mt][hf] || j > hi[mt][hf]) s[mt][nt][e] = -INFINITY;
            }
}

/* One block of the online softmax: new row max, s -> p = 2^(s*sl2 - max*sl2)
 * in place, running sums, and O rescaled where some row's max moved. l_run
 * stays a per-thread partial sum until the end (the quad rescales it
 * alike). */
template <class S_>
__device__ __forceinline__ void online_softmax(float (&s)[S_::MT][S_::NTL][4], float (&o)[S_::MT][S_::DTL][4],
                                               float (&m_run)[S_::MT][2], float (&l_run)[S_::MT][2], float sl2)
{
    constexpr int MT = S_::MT, NTL = S_::NTL;
    float corr[MT][2];
    bool rescale = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float mx = m_run[mt][hf];
#pragma unroll
            for (int nt = 0; nt < NTL; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* Row still fully masked: offset 0, so -inf - (-inf) never makes
             * a NaN (every p is exp2(-inf) = 0). */
            const float ms = (mx == -INFINITY) ? 0.f : mx * sl2;
            /* Nothing accumulated yet: factor 0 (never exp2(+big) * 0). An
             * unchanged max gives exactly ex2(0) = 1. */
            corr[mt][hf] = (m_run[mt][hf] == -INFINITY) ? 0.f : ptx::ex2(m_run[mt][hf] * sl2 - ms);
            rescale |= corr[mt][hf] != 1.f;
            m_run[mt][hf] = mx;
            float rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float pv = ptx::ex2(fmaf(s[mt][nt][2 * hf + e], sl2, -ms));
                    s[mt][nt][2 * hf + e] = pv;
                    rs += pv;
                }
            l_run[mt][hf] = l_run[mt][hf] * corr[mt][hf] + rs;
        }
    /* Rescale O only when some row of the warp has a new max: after the
     * first blocks of a long row that is rare, and skipping saves MT*HD/2
     * multiplies per block (warp-uniform branch). */
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int dt = 0; dt < S_::DTL; ++dt)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[mt][dt][e] *= corr[mt][e >> 1];
    }
}

/* Full row sums (quad reduce), the normaliser 1/l and LSE (natural log).
 * Fully masked rows (l = 0) give O = 0 and LSE = -inf. */
template <class S_>
__device__ __forceinline__ void finish_rows(const float (&m_run)[S_::MT][2], const float (&l_run)[S_::MT][2],
                                            float sl2, float (&inv)[S_::MT][2], float (&lse)[S_::MT][2])
{
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float l = l_run[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[mt][hf] = l > 0.f ? 1.f / l : 0.f;
            lse[mt][hf] = l > 0.f ? (m_run[mt][hf] * sl2 + __log2f(l)) * FC_LN2_F : -INFINITY;
        }
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_SOFTMAX_CUH */
