/* fwd_f16_d192.cu -- Hopper forward kernels for f16, head_dim 192: every d192 row of tiles.cuh. */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(f16, 0, 192)
