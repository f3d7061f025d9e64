/* bwd_f16_d256.cu -- sm80-class backward kernels for f16, head_dim 256: one
 * translation unit per (dtype, head_dim) so the build parallelises; the tile
 * rows it instantiates come from bwd_tiles.cuh. */
#include "cuda/sm80/bwd_launch.cuh"

FC_SM80_DEFINE_BWD_LAUNCHER(f16, false, 256)
