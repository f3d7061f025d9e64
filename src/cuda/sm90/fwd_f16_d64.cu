/* fwd_f16_d64.cu -- Hopper forward kernels for f16, head_dim 64: every d64 row of tiles.cuh. */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(f16, 0, 64)
