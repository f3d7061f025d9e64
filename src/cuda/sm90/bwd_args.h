/*
 * bwd_args.h -- what the Hopper backward's planner/launcher (bwd_plan.cu)
 * hands to its kernel TUs (bwd_<dtype>_d<dim>.cu), and their launchers.
 *
 * fc_sm90_bwd_params is the main kernel's only argument (a
 * __grid_constant__, so the TMA maps live in parameter space). Its `a` is
 * the sm80-class backward's argument block: the same grid decode
 * (bwd_coords.cuh), workspace (dq_accum, dsum, lse2, semaphores) and
 * constants, and the argument of the preprocess and convert kernels, which
 * both paths share.
 */
#ifndef FC_SM90_BWD_ARGS_H
#define FC_SM90_BWD_ARGS_H

#include <cuda.h> /* CUtensorMap (type only) */
#include <cuda_runtime.h>

#include "cuda/sm80/bwd_args.h"

typedef struct fc_sm90_bwd_params {
    /* {head_dim, rows, heads, batch} (varlen: rows = the packed total,
     * batch 1); boxes {swz/2, block_m (Q, dO) or block_n (K, V), 1, 1} */
    CUtensorMap tm_q, tm_k, tm_v, tm_do;
    fc_sm80_bwd_args a;
} fc_sm90_bwd_params;

#define FC_SM90_BWD_HEAD_DIMS(X) X(64) X(96) X(128)

/* One launcher per (dtype, head dim) TU: preprocess, main kernel of row
 * `row` (bwd_tiles.cuh) and convert on stream, each launch checked. */
#define FC_SM90_DECLARE_BWD_LAUNCHERS(dim)                                                                  \
    fc_status fc_sm90_bwd_launch_bf16_d##dim(int row, const fc_sm90_bwd_params *prm, int device,           \
                                             cudaStream_t stream, char *err, size_t err_len);               \
    fc_status fc_sm90_bwd_launch_f16_d##dim(int row, const fc_sm90_bwd_params *prm, int device,            \
                                            cudaStream_t stream, char *err, size_t err_len);
FC_SM90_BWD_HEAD_DIMS(FC_SM90_DECLARE_BWD_LAUNCHERS)
#undef FC_SM90_DECLARE_BWD_LAUNCHERS

#endif /* FC_SM90_BWD_ARGS_H */
