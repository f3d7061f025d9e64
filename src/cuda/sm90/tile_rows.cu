/* tile_rows.cu -- fc_sm90_tile_row and fc_sm90_bwd_tile_row: the rows of
 * tiles.cuh and bwd_tiles.cuh as tools list them (internal.h). Host code
 * only, built whatever the target architectures (cmake/CudaKernels.cmake),
 * so the row lists need no sm_90a build. */
#include "cuda/sm90/bwd_tiles.cuh"
#include "cuda/sm90/tiles.cuh"
#include "internal.h"

/* A Hopper row as the tools list it: architecture class 90, no sm80 code
 * variant, every row its own kernel instances. */
static fc_tile_row listed(int i, int hd, int bm, int bn, int threads, int stages, int ctas, int kvsplit, int tall)
{
    fc_tile_row r;
    r.head_dim = hd;
    r.block_m = bm;
    r.block_n = bn;
    r.threads = threads;
    r.stages = stages;
    r.ctas = ctas;
    r.kvsplit = kvsplit;
    r.tall = tall;
    r.arch_class = 90;
    r.variant = 0;
    r.kernel = i;
    return r;
}

int fc_sm90_tile_row(int i, fc_tile_row *row)
{
    if (i < 0 || i >= fc90::kNumTiles) return 0;
    const fc90::TileRow &t = fc90::kTiles[i];
    *row = listed(i, t.head_dim, t.block_m, t.block_n, 128 * (t.wgs + 1), t.stages, t.ctas, t.kvsplit, t.tall);
    return 1;
}

/* 384 threads: a producer and two consumer warpgroups */
int fc_sm90_bwd_tile_row(int i, fc_tile_row *row)
{
    if (i < 0 || i >= fc90::kNumBwdRows) return 0;
    const fc90::BwdRow &t = fc90::kBwdRows[i];
    *row = listed(i, t.head_dim, t.block_m, t.block_n, 384, t.stages, 1, 0, 0);
    return 1;
}
