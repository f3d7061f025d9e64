/* bwd_f16_d64.cu -- the Hopper backward for f16, head_dim 64: every d64 row of bwd_tiles.cuh. */
#include "cuda/sm90/bwd_kernel.cuh"

FC_SM90_DEFINE_BWD_LAUNCHER(f16, 0, 64)
