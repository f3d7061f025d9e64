/* fwd_f16_d96.cu -- Hopper forward kernels for f16, head_dim 96 (config: 1 of tiles.cuh). */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(1, 96, f16, 0)
