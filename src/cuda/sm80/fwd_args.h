/*
 * fwd_args.h -- what the sm80 planner/launcher (plan.cu) hands to the
 * per-(dtype, head_dim) translation units (fwd_<dtype>_d<hd>.cu), and the
 * extern "C" launcher each of those units defines.
 *
 * fc_sm80_args is plain data passed by value as the kernel parameter: the
 * fc_fwd_params the API layer filled (already checked) plus values derived
 * once on the host so the kernel does not recompute them per CTA.
 */
#ifndef FC_SM80_FWD_ARGS_H
#define FC_SM80_FWD_ARGS_H

#include <cuda.h> /* CUtensorMap (type only) */

#include "cuda/common/fastdiv.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fc_sm80_args {
    fc_fwd_params p;
    /* Softmax multiplier in the log2 domain: p = 2^(s*sl2 - max*sl2).
     * Without softcap s is the raw q.k and sl2 = scale*log2(e); with softcap
     * s is tanh(q.k*scale/softcap) and sl2 = softcap*log2(e). */
    float sl2;
    float softcap_in;   /* scale/softcap (0 = softcap off)                      */
    fc_fastdiv pack_g;  /* query rows per query position in a tile: heads_q/heads_kv
                         * when GQA packing is on, else 1 (tile row -> position) */
    /* The tile decode's divisors (blockIdx.x -> M tile, split, head, batch),
     * with their multipliers (common/fastdiv.h); the values are the .d's.  */
    fc_fastdiv heads_per_kv; /* heads_q / heads_kv                          */
    fc_fastdiv grid_heads; /* heads on the grid: heads_kv when packed, else heads_q */
    fc_fastdiv m_tiles;    /* M tiles per (batch, grid head): ceil(seqlen_q*pack_g / block_m) */
    fc_fastdiv num_splits; /* >= 1                                           */
    fc_fastdiv page;       /* kVarPaged rows: keys per page (p.page_size)     */
    int32_t plain;      /* host only: no softcap and no masked block in the call
                         * (fc_cuda_choice.masks 0): the kernel instance
                         * without that code                                */
    int32_t pdl;        /* host only: launch as a programmatic dependent of the
                         * previous kernel (common/pdl.cuh)                     */
    int32_t o_vec;      /* out 16-byte aligned with strides of 8 elements: 16-byte
                         * O stores; else element stores (odd strides)       */
} fc_sm80_args;

/* kVarTma rows (tiles.cuh): the K and V tensor maps, dims {32, rows,
 * head_dim/32 panels, heads_kv, batch} (the panel dim's stride 64 bytes;
 * varlen: rows = total_k, batch 1), box {32, block_n, head_dim/32, 1, 1}:
 * one box per tile, 64-byte swizzle. A second kernel parameter of those rows alone (a
 * __grid_constant__, so that the maps stay in parameter space, where
 * cp.async.bulk.tensor may read them): the other kernels keep their one
 * parameter, fc_sm80_args, as it was. */
typedef struct fc_sm80_kv_maps {
    CUtensorMap k, v;
} fc_sm80_kv_maps;

/* One launcher per (dtype, head_dim) translation unit: launches tile-table
 * entry `config` (which must have that head_dim) on `stream`, grid and
 * dynamic shared memory derived from the table; `maps` are read by kVarTma
 * rows only. Checks every CUDA return code and the launch error. */
#define FC_SM80_DECLARE_LAUNCHER(dt, hd)                                                      \
    fc_status fc_sm80_launch_##dt##_d##hd(const fc_sm80_args *a, const fc_sm80_kv_maps *maps, int config, \
                                          int device, void *stream, char *err, size_t err_len);
FC_SM80_DECLARE_LAUNCHER(f16, 32)
FC_SM80_DECLARE_LAUNCHER(f16, 64)
FC_SM80_DECLARE_LAUNCHER(f16, 96)
FC_SM80_DECLARE_LAUNCHER(f16, 128)
FC_SM80_DECLARE_LAUNCHER(f16, 256)
FC_SM80_DECLARE_LAUNCHER(bf16, 32)
FC_SM80_DECLARE_LAUNCHER(bf16, 64)
FC_SM80_DECLARE_LAUNCHER(bf16, 96)
FC_SM80_DECLARE_LAUNCHER(bf16, 128)
FC_SM80_DECLARE_LAUNCHER(bf16, 256)
#undef FC_SM80_DECLARE_LAUNCHER

/* block_m / block_n of tile-table row `config` (1, 1 for an invalid row). */
void fc_sm80_tile_shape(int config, int *block_m, int *block_n);

#ifdef __cplusplus
}
#endif
#endif /* FC_SM80_FWD_ARGS_H */
