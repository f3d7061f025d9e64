/* tile_rows.cu -- fc_sm90_tile_row: the rows of tiles.cuh as tools list them
 * (internal.h). Host code only, built whatever the target architectures
 * (cmake/CudaKernels.cmake), so the row list needs no sm_90a build. */
#include "cuda/sm90/tiles.cuh"
#include "internal.h"

int fc_sm90_tile_row(int i, fc_tile_row *row)
{
    if (i < 0 || i >= fc90::kNumTiles) return 0;
    const fc90::TileRow &t = fc90::kTiles[i];
    row->head_dim = t.head_dim;
    row->block_m = t.block_m;
    row->block_n = t.block_n;
    row->threads = 128 * (t.wgs + 1);
    row->stages = t.stages;
    row->ctas = t.ctas;
    row->kvsplit = t.kvsplit;
    row->tall = t.tall;
    row->arch_class = 90;
    row->variant = 0;
    row->kernel = i; /* every row has its own kernel instances */
    return 1;
}
