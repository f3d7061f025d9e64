/* bwd_bf16_d96.cu -- the Hopper backward for bf16, head_dim 96: every d96 row of bwd_tiles.cuh. */
#include "cuda/sm90/bwd_kernel.cuh"

FC_SM90_DEFINE_BWD_LAUNCHER(bf16, 1, 96)
