/* fwd_bf16_d128.cu -- Hopper forward kernels for bf16, head_dim 128 (configs: 2, 6 of tiles.cuh). */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(2, 128, bf16, 1)
FC_SM90_DEFINE_LAUNCHER(6, 128, bf16, 1)
