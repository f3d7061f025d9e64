/*
 * tile_row_tmp.cu -- TEMPORARY: fc_sm90_tile_row over the Hopper table until
 * sm90/plan.cu defines it; delete this file when that lands.
 */
#include "internal.h"
#include "cuda/sm90/tiles.cuh"

namespace {
const fc_sm90_tile k_rows[] = {FC_SM90_TILE_TABLE};
}

extern "C" int fc_sm90_tile_row(int i, fc_tile_row_info *row)
{
    if (i < 0 || i >= FC_SM90_NUM_TILES) return 0;
    const fc_sm90_tile &t = k_rows[i];
    *row = fc_tile_row_info{};
    row->head_dim = t.head_dim;
    row->block_m = t.block_m;
    row->block_n = t.block_n;
    row->threads = 128 * (t.wgs + 1); /* the consumers and the producer warpgroup */
    row->stages = t.stages;
    row->ctas = t.ctas;
    row->kvsplit = t.kvsplit;
    row->tall = t.tall;
    row->kernel = i;
    return 1;
}
