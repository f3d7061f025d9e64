/* bwd_f16_d96.cu -- the Hopper backward for f16, head_dim 96: every d96 row of bwd_tiles.cuh. */
#include "cuda/sm90/bwd_kernel.cuh"

FC_SM90_DEFINE_BWD_LAUNCHER(f16, 0, 96)
