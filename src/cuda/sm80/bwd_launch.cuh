/*
 * bwd_launch.cuh -- host side of one backward (dtype, head_dim) translation
 * unit: instantiates the main kernel for every backward tile row with that
 * head_dim (identical rows collapse into one instantiation), and launches
 * the preprocess, the planned row's main kernel and the convert on the
 * stream, each as a programmatic dependent of the one before when a.pdl.
 * Included only by bwd_<dtype>_d<hd>.cu.
 */
#ifndef FC_SM80_BWD_LAUNCH_CUH
#define FC_SM80_BWD_LAUNCH_CUH

#include <atomic>
#include <climits>
#include <cstdio>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"
#include "cuda/common/smem_optin.cuh"
#include "cuda/sm80/bwd_convert.cuh"
#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/sm80/bwd_preprocess.cuh"
#include "cuda/sm80/bwd_tiles.cuh"

namespace fc {
namespace sm80 {

/* The main kernel of one mode (kDet: deterministic), its smem limit raised
 * once per process and device. */
template <bool kBF16, bool kDet, int HD, int BM, int BN, int W, int CTAS, int KW, int QW, bool SM90_ONLY>
fc_status launch_bwd_main(const fc_sm80_bwd_args *a, int device, cudaStream_t stream, bool pdl, char *err,
                          size_t err_len)
{
    using S_ = BwdShape<HD, BM, BN, W, CTAS, KW, QW>;
    auto kernel = bwd_kernel<kBF16, kDet, HD, BM, BN, W, CTAS, KW, QW, SM90_ONLY>;
    const int smem = (int)S_::SMEM_BYTES;
    static std::atomic<unsigned long long> opted_in{0};
    const fc_status opt =
        fc_smem_opt_in(kernel, smem, device, opted_in, "sm80 backward", -1, err, err_len, CTAS > 1);
    if (opt != FC_OK) return opt;
    const long long grid = ((long long)a->order.n_blocks.d * a->p.f.batch * a->p.f.heads_kv) << a->split_shift;
    if (grid > INT_MAX) {
        snprintf(err, err_len, "internal: sm80 backward grid of %lld CTAs (the planner should have refused)", grid);
        return FC_ERR_INTERNAL;
    }
    if (grid > 0)
        FC_CUDA_TRY("sm80 backward kernel launch",
                    fc_launch(kernel, (unsigned)grid, S_::NT, (size_t)smem, stream, pdl, *a));
    return FC_OK;
}

template <bool kBF16, int HD, int BM, int BN, int W, int CTAS, int KW, int QW, bool SM90_ONLY>
fc_status launch_bwd_tile(const fc_sm80_bwd_args *a, int device, cudaStream_t stream, char *err, size_t err_len)
{
    const bool pdl = a->pdl != 0;
    FC_CUDA_TRY("sm80 backward preprocess launch", (launch_bwd_preprocess<kBF16, HD>(*a, stream, pdl)));
    const fc_status st =
        a->p.deterministic
            ? launch_bwd_main<kBF16, true, HD, BM, BN, W, CTAS, KW, QW, SM90_ONLY>(a, device, stream, pdl, err,
                                                                                  err_len)
            : launch_bwd_main<kBF16, false, HD, BM, BN, W, CTAS, KW, QW, SM90_ONLY>(a, device, stream, pdl, err,
                                                                                   err_len);
    if (st != FC_OK) return st;

    /* dQ's grid-stride blocks, then (split) one per dK/dV chunk: the
     * planner splits only grids that fit the SMs, so this stays small */
    const int64_t conv_blocks = aux_grid(a->rows * a->p.f.heads_q * (HD / 8)) + dkv_convert_blocks(*a);
    if (conv_blocks > 0)
        FC_CUDA_TRY("sm80 backward convert launch", fc_launch(bwd_convert_kernel<kBF16, HD>, (unsigned)conv_blocks,
                                                              kBwdAuxThreads, 0, stream, pdl, *a));
    return FC_OK;
}

/* Walk the table at compile time: instantiate rows with this head_dim,
 * launch the one whose index is `config`. */
template <bool kBF16, int HD, int I = 0>
fc_status launch_bwd_config(const fc_sm80_bwd_args *a, int config, int device, cudaStream_t stream, char *err,
                            size_t err_len)
{
    if constexpr (I >= kNumBwdTiles) {
        snprintf(err, err_len, "internal: sm80 backward tile config %d has no d%d kernel", config, HD);
        return FC_ERR_INTERNAL;
    } else {
        constexpr BwdTile T = kBwdTiles[I];
        if constexpr (T.head_dim == HD) {
            static_assert(BwdShape<HD, T.block_m, T.block_n, T.warps, T.ctas, T.key_warps, T.dq_warps>::SMEM_BYTES ==
                              bwd_smem_bytes(T),
                          "bwd_tiles.cuh bwd_smem_bytes and the kernel's smem layout disagree");
            if (config == I)
                return launch_bwd_tile<kBF16, HD, T.block_m, T.block_n, T.warps, T.ctas, T.key_warps, T.dq_warps,
                                       bwd_tile_sm90_only(T)>(
                    a, device, stream, err, err_len);
        }
        return launch_bwd_config<kBF16, HD, I + 1>(a, config, device, stream, err, err_len);
    }
}

} /* namespace sm80 */
} /* namespace fc */

/* Defines the extern "C" launcher of one translation unit. */
#define FC_SM80_DEFINE_BWD_LAUNCHER(dt, is_bf16, hd)                                                          \
    extern "C" fc_status fc_sm80_bwd_launch_##dt##_d##hd(const fc_sm80_bwd_args *a, int config, int device,     \
                                                         void *stream, char *err, size_t err_len)              \
    {                                                                                                         \
        return fc::sm80::launch_bwd_config<is_bf16, hd>(a, config, device, (cudaStream_t)stream, err, err_len); \
    }

#endif /* FC_SM80_BWD_LAUNCH_CUH */
