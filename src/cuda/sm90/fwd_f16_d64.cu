/* fwd_f16_d64.cu -- Hopper forward kernels for f16, head_dim 64 (configs: 0, 5, 7, 8, 9 of tiles.cuh). */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(0, 64, f16, 0)
FC_SM90_DEFINE_LAUNCHER(5, 64, f16, 0)
FC_SM90_DEFINE_LAUNCHER(7, 64, f16, 0)
FC_SM90_DEFINE_LAUNCHER(8, 64, f16, 0)
FC_SM90_DEFINE_LAUNCHER(9, 64, f16, 0)
