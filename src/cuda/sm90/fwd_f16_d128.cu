/* fwd_f16_d128.cu -- Hopper forward kernels for f16, head_dim 128 (configs: 2, 6 of tiles.cuh). */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(2, 128, f16, 0)
FC_SM90_DEFINE_LAUNCHER(6, 128, f16, 0)
