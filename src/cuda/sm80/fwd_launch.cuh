/*
 * fwd_launch.cuh -- host side of one (dtype, head_dim) translation unit:
 * instantiates the kernel for every tile-table row with that head_dim
 * (identical rows collapse into one instantiation) and launches the row the
 * planner chose. Included only by fwd_<dtype>_d<hd>.cu.
 */
#ifndef FC_SM80_FWD_LAUNCH_CUH
#define FC_SM80_FWD_LAUNCH_CUH

#include <atomic>
#include <climits>
#include <cstdio>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"
#include "cuda/common/smem_optin.cuh"
#include "cuda/sm80/fwd_kernel.cuh"
#include "cuda/sm80/tiles.cuh"

namespace fc {
namespace sm80 {

template <bool kBF16, int HD, int BM, int BN, int W, int STAGES, int CTAS, bool SM90_ONLY, int VAR, bool PLAIN>
fc_status launch_tile(const fc_sm80_args *a, const fc_sm80_kv_maps *maps, int device, cudaStream_t stream,
                      char *err, size_t err_len)
{
    using S_ = Shape<HD, BM, BN, W, STAGES, VAR>;
    /* kVarTma rows: the kernel with the K/V maps as a second parameter. */
    constexpr bool TMA = S_::TMA;
    auto kernel = [] {
        if constexpr (TMA)
            return fwd_kernel_tma<kBF16, HD, BM, BN, W, STAGES, CTAS, SM90_ONLY, VAR, PLAIN>;
        else
            return fwd_kernel<kBF16, HD, BM, BN, W, STAGES, CTAS, SM90_ONLY, VAR, PLAIN>;
    }();
    const int smem = (int)S_::SMEM_BYTES;

    static std::atomic<unsigned long long> opted_in{0};
    const fc_status opt = fc_smem_opt_in(kernel, smem, device, opted_in, "sm80 forward", -1, err, err_len);
    if (opt != FC_OK) return opt;

    const long long grid = (long long)a->m_tiles.d * a->num_splits.d * a->grid_heads.d * a->p.batch;
    if (grid <= 0) return FC_OK; /* nothing to compute (empty batch or seqlen_q 0) */
    if (grid > INT_MAX) {
        snprintf(err, err_len, "internal: sm80 grid of %lld CTAs exceeds 2^31-1 (the planner should have refused)",
                 grid);
        return FC_ERR_INTERNAL;
    }
    cudaError_t e;
    if constexpr (TMA)
        e = fc_launch(kernel, (unsigned)grid, S_::NT, (size_t)smem, stream, a->pdl != 0, *a, *maps);
    else
        e = fc_launch(kernel, (unsigned)grid, S_::NT, (size_t)smem, stream, a->pdl != 0, *a);
    return fc_cuda_check(e, "sm80 forward kernel launch", err, err_len);
}

/* Walk the table at compile time: instantiate rows with this head_dim, launch
 * the one whose index is `config`. */
template <bool kBF16, int HD, int I = 0>
fc_status launch_config(const fc_sm80_args *a, const fc_sm80_kv_maps *maps, int config, int device,
                        cudaStream_t stream, char *err, size_t err_len)
{
    if constexpr (I >= kNumTiles) {
        snprintf(err, err_len, "internal: sm80 tile config %d has no d%d kernel", config, HD);
        return FC_ERR_INTERNAL;
    } else {
        constexpr Tile T = kTiles[I];
        if constexpr (T.head_dim == HD) {
            static_assert(Shape<HD, T.block_m, T.block_n, T.warps, T.stages, T.variant>::SMEM_BYTES ==
                              tile_smem_bytes(T),
                          "tiles.cuh tile_smem_bytes and the kernel's smem layout disagree");
            if (config == I) {
                /* A kVarNoPlain row has no plain instance at all (the planner
                 * never asks for one: plan.cu folds the bit into masks). */
                if constexpr ((T.variant & kVarNoPlain) == 0)
                    if (a->plain)
                        return launch_tile<kBF16, HD, T.block_m, T.block_n, T.warps, T.stages, T.ctas,
                                           tile_sm90_only(T), T.variant, true>(a, maps, device, stream, err, err_len);
                return launch_tile<kBF16, HD, T.block_m, T.block_n, T.warps, T.stages, T.ctas,
                                   tile_sm90_only(T), T.variant, false>(a, maps, device, stream, err, err_len);
            }
        }
        return launch_config<kBF16, HD, I + 1>(a, maps, config, device, stream, err, err_len);
    }
}

} /* namespace sm80 */
} /* namespace fc */

/* Defines the extern "C" launcher of one translation unit. */
#define FC_SM80_DEFINE_LAUNCHER(dt, is_bf16, hd)                                                  \
    extern "C" fc_status fc_sm80_launch_##dt##_d##hd(const fc_sm80_args *a, const fc_sm80_kv_maps *maps,  \
                                                     int config, int device, void *stream, char *err, \
                                                     size_t err_len)                                  \
    {                                                                                                 \
        return fc::sm80::launch_config<is_bf16, hd>(a, maps, config, device, (cudaStream_t)stream, err, \
                                                    err_len);                                         \
    }

#endif /* FC_SM80_FWD_LAUNCH_CUH */
