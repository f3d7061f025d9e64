/* fwd_f16_d256.cu -- sm80-class forward kernels for f16, head_dim 256: one
 * translation unit per (dtype, head_dim) so the build parallelises; the tile
 * rows it instantiates come from tiles.cuh. */
#include "cuda/sm80/fwd_launch.cuh"

FC_SM80_DEFINE_LAUNCHER(f16, false, 256)
