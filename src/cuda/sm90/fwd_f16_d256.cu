/* fwd_f16_d256.cu -- Hopper forward kernels for f16, head_dim 256: every d256 row of tiles.cuh. */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(f16, 0, 256)
