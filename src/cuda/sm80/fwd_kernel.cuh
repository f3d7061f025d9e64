/*
 * fwd_kernel.cuh -- the sm80-class fused attention forward kernel
 * (mma.sync + ldmatrix + cp.async; runs on sm_80, 86, 89 and 90).
 *
 * One CTA computes one M tile: block_m query rows of one (batch, head) --
 * or, with GQA packing, block_m rows drawn from all query heads sharing one
 * KV head -- against the key range the masks leave visible (or, split-KV,
 * its share of that range). The pieces, by role:
 *   layout.cuh    Shape (the compile-time tile), the smem panels and carve-up
 *   schedule.cuh  blockIdx.x -> tile, the KV blocks it visits
 *   loads.cuh     Q and K/V tiles: cp.async (general, lean-address), TMA
 *   mma.cuh       S = Q K^T and O += P V on the smem tiles
 *   softmax.cuh   softcap, masks, online max/sum, final row sums and LSE
 *   mainloop.cuh  the load pipeline and the per-block sequence
 *   epilogue.cuh  O and LSE stores, split-KV partials
 *
 * Runtime flags (no extra instantiations): causal/window masks, softcap,
 * varlen, lse, split-KV, GQA packing. Compile time: dtype, head dim, tile.
 */
#ifndef FC_SM80_FWD_KERNEL_CUH
#define FC_SM80_FWD_KERNEL_CUH

#include <stdint.h>

#include "cuda/common/pdl.cuh"
#include "cuda/sm80/epilogue.cuh"
#include "cuda/sm80/fwd_args.h"
#include "cuda/sm80/layout.cuh"
#include "cuda/sm80/mainloop.cuh"

namespace fc {
namespace sm80 {

/* PLAIN: the call has no softcap and no masked block (plan.cu: masks 0), so
 * neither path is compiled in (they sit inline in every block). */
template <bool kBF16, int HD, int BM, int BN, int W, int STAGES, int VAR, bool PLAIN>
__device__ __forceinline__ void fwd_body(const fc_sm80_args &a, const fc_sm80_kv_maps *maps)
{
    using S_ = Shape<HD, BM, BN, W, STAGES, VAR>;
    constexpr int MT = S_::MT, DTL = S_::DTL;

    extern __shared__ __align__(128) unsigned char smem[];
    const Smem sm = smem_layout<S_>(smem);
    const Thr th = thread_coords<S_>();

    float o[MT][DTL][4];              /* O accumulator (unnormalised)                    */
    float m_run[MT][2], l_run[MT][2]; /* running row max (score units), partial row sum */
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < DTL; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
        m_run[mt][0] = m_run[mt][1] = -INFINITY;
        l_run[mt][0] = l_run[mt][1] = 0.f;
    }

    {
        /* Scoped: the epilogue recomputes the coordinates rather than
         * holding them across the loop. */
        const TileCoords c = locate_tile<BM>(a);
        if (c.r0 >= c.rows) return; /* past a short sequence's end (uniform per CTA) */
        mainloop<kBF16, S_, PLAIN>(a, maps, sm, th, c, o, m_run, l_run);
    }
    epilogue<kBF16, S_>(a, sm, th, o, m_run, l_run);
}

/* The kernel. SM90_ONLY: the tile is a row of the SM90 class alone
 * (tiles.cuh: tile_sm90_only), which the planner never launches below sm_90,
 * so older targets get an empty body -- no code, no compile time, and no
 * ptxas verdict (e.g. spills) on a register budget tuned for sm_90. */
template <bool kBF16, int HD, int BM, int BN, int W, int STAGES, int MIN_CTAS, bool SM90_ONLY, int VAR,
          bool PLAIN>
__global__ void __launch_bounds__(W * 32, MIN_CTAS) fwd_kernel(const fc_sm80_args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    if constexpr (SM90_ONLY)
        return;
    else
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
    /* FP8 K/V rows convert with cvt.f16x2.e4m3x2 (sm_89+); the planner
     * never launches them below that */
    if constexpr (Shape<HD, BM, BN, W, STAGES, VAR>::KV8)
        return;
    else
#endif
    {
        /* With PDL (a.pdl, sm_90+) this grid launches while the previous
         * kernel in the stream finishes: nothing global before this. */
        fc_grid_dep_sync();
        fwd_body<kBF16, HD, BM, BN, W, STAGES, VAR, PLAIN>(a, nullptr);
    }
}

/* The kernel of kVarTma rows (SM90 class only): the same body, with the K/V
 * tensor maps as a __grid_constant__ second parameter (fwd_args.h). */
template <bool kBF16, int HD, int BM, int BN, int W, int STAGES, int MIN_CTAS, bool SM90_ONLY, int VAR,
          bool PLAIN>
__global__ void __launch_bounds__(W * 32, MIN_CTAS)
    fwd_kernel_tma(const fc_sm80_args a, const __grid_constant__ fc_sm80_kv_maps maps)
{
    static_assert(SM90_ONLY, "kVarTma rows are SM90-class rows (tiles.cuh)");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    fc_grid_dep_sync();
    fwd_body<kBF16, HD, BM, BN, W, STAGES, VAR, PLAIN>(a, &maps);
#endif
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_FWD_KERNEL_CUH */
