/* fwd_bf16_d192.cu -- Hopper forward kernels for bf16, head_dim 192 (configs: 4 of tiles.cuh). */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(4, 192, bf16, 1)
