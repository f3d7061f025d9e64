/* bwd_f16_d128.cu -- the Hopper backward for f16, head_dim 128: every d128 row of bwd_tiles.cuh. */
#include "cuda/sm90/bwd_kernel.cuh"

FC_SM90_DEFINE_BWD_LAUNCHER(f16, 0, 128)
