/* bwd_bf16_d128.cu -- the Hopper backward for bf16, head_dim 128: every d128 row of bwd_tiles.cuh. */
#include "cuda/sm90/bwd_kernel.cuh"

FC_SM90_DEFINE_BWD_LAUNCHER(bf16, 1, 128)
