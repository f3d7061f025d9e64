/* fwd_bf16_d96.cu -- Hopper forward kernels for bf16, head_dim 96: every d96 row of tiles.cuh. */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(bf16, 1, 96)
