/* fwd_bf16_d128.cu -- Hopper forward kernels for bf16, head_dim 128: every d128 row of tiles.cuh. */
#include "cuda/sm90/fwd_kernel.cuh"

FC_SM90_DEFINE_LAUNCHER(bf16, 1, 128)
