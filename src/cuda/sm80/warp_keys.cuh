/*
 * warp_keys.cuh -- kVarWarpKeys rows (decode: one m16 tile of rows holds a
 * whole tile column, e.g. one GQA group of a decode step): the W warps share
 * the tile's 16 rows and split each KV block's keys, so the MMA work is that
 * of one warp's rows rather than W warps' padding rows. Each warp keeps its
 * own online-softmax state over its keys; after the loop the partials meet
 * in shared memory and warp 0 merges them in warp order (deterministic) and
 * runs the epilogue alone.
 */
#ifndef FC_SM80_WARP_KEYS_CUH
#define FC_SM80_WARP_KEYS_CUH

#include <stdint.h>

#include "cuda/common/device_math.cuh"
#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/layout.cuh"

namespace fc {
namespace sm80 {

/* Floats a warp parks per lane: m_run[2], l_run[2] and O (4 per n8 tile). */
template <class S_>
constexpr int kw_floats()
{
    return 4 + 4 * S_::DTL;
}

/* The partials of warps 1..KW-1 into the ring (free after the loop), then
 * warp 0 folds them into its own: per row the common max M, factors
 * 2^((m_w - M) sl2) on l and O (l_run stays a per-lane partial sum: the
 * epilogue's quad reduction finishes it). Returns true for warp 0, which
 * then holds the tile's state; the other warps are done. */
template <class S_>
__device__ __forceinline__ bool kw_merge(const Smem &sm, const Thr &th, float sl2, float (&o)[1][S_::DTL][4],
                                         float (&m_run)[1][2], float (&l_run)[1][2])
{
    constexpr int F = kw_floats<S_>();
    static_assert((S_::KW - 1) * 32 * F * 4 <= S_::STAGES * S_::STAGE_BYTES, "warp partials fit the ring");
    const int warp = th.tid >> 5;
    /* lane-fastest slots: float f of lane l of warp w at ((w - 1) * F + f) * 32 + l */
    auto slot = [&](int w, int f) { return sm.kv + (uint32_t)((((w - 1) * F + f) * 32 + th.lane) * 4); };
    __syncthreads(); /* every warp is past its last read of the ring and panels */
    if (warp > 0) {
        dev::sts32(slot(warp, 0), __float_as_uint(m_run[0][0]));
        dev::sts32(slot(warp, 1), __float_as_uint(m_run[0][1]));
        dev::sts32(slot(warp, 2), __float_as_uint(l_run[0][0]));
        dev::sts32(slot(warp, 3), __float_as_uint(l_run[0][1]));
#pragma unroll
        for (int dt = 0; dt < S_::DTL; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dev::sts32(slot(warp, 4 + 4 * dt + e), __float_as_uint(o[0][dt][e]));
    }
    __syncthreads();
    if (warp > 0) return false;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        float mw[S_::KW], mx = m_run[0][hf];
        mw[0] = mx;
#pragma unroll
        for (int w = 1; w < S_::KW; ++w) {
            mw[w] = __uint_as_float(dev::lds32(slot(w, hf)));
            mx = fmaxf(mx, mw[w]);
        }
        float f[S_::KW];
#pragma unroll
        for (int w = 0; w < S_::KW; ++w) f[w] = mw[w] == -INFINITY ? 0.f : ptx::ex2(mw[w] * sl2 - mx * sl2);
        float l = l_run[0][hf] * f[0];
#pragma unroll
        for (int w = 1; w < S_::KW; ++w) l += __uint_as_float(dev::lds32(slot(w, 2 + hf))) * f[w];
#pragma unroll
        for (int dt = 0; dt < S_::DTL; ++dt)
#pragma unroll
            for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
                float v = o[0][dt][e] * f[0];
#pragma unroll
                for (int w = 1; w < S_::KW; ++w) v += __uint_as_float(dev::lds32(slot(w, 4 + 4 * dt + e))) * f[w];
                o[0][dt][e] = v;
            }
        m_run[0][hf] = mx;
        l_run[0][hf] = l;
    }
    return true;
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_WARP_KEYS_CUH */
