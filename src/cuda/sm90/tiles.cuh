/*
 * tiles.cuh -- the table of Hopper forward-kernel configurations, the one
 * source of truth: plan.cu picks a row, the kernel TUs (fwd_<dtype>_d<dim>.cu
 * through fwd_launch.cuh) instantiate every row of their head_dim, and
 * fc_sm90_tile_row lists the rows for tools. A new row of an existing head
 * dim touches only this file.
 *
 * CTA = 1 producer warpgroup (TMA) + `wgs` consumer warpgroups of 64 query
 * rows each. Registers per thread after setmaxnreg (producer / consumers;
 * the CTA's launch-bounds share is all they can move, in steps of 8):
 *     2 WGs (384 threads, 168 at entry):  40 / 232
 *     3 WGs (512 threads, 128 at entry):  40 / 152
 *     4 WGs (640 threads,  96 at entry):  32 / 112
 *     1 WG  (256 threads): no setmaxnreg, up to 255 each.
 * A consumer needs, per 64-row warpgroup in fp32: S block_n / 2, P block_n / 4
 * (live with S under intra-warpgroup overlap), O head_dim / 2, + ~30.
 *
 * Shared memory (1024-aligned base): Q qbufs * block_m * head_dim * 2, the
 * K/V ring 2 * stages * block_n * head_dim * 2, the kvsplit merge area, the
 * barriers, + kSmemAlign slack; at most FC_SM90_SMEM_OPTIN (227 KB).
 *
 * Swizzle: 128 bytes where head_dim % 64 == 0, else 64 (a 128B MN-major
 * wgmma operand needs N = head_dim a multiple of 64); tiles load as
 * head_dim / (swz / 2) column panels.
 */
#ifndef FC_SM90_TILES_CUH
#define FC_SM90_TILES_CUH

#include "constants.h"

namespace fc90 {

struct TileRow {
    int head_dim;
    int block_m;  /* 64 * wgs / kvsplit query rows                              */
    int block_n;  /* keys per block: multiple of 16, <= 256 (wgmma N, TMA box)  */
    int wgs;      /* consumer warpgroups (1..4)                                 */
    int stages;   /* K/V ring depth                                             */
    int swz;      /* swizzle bytes: 128 or 64                                   */
    int qbufs;    /* Q buffers: 2 loads the next tile's Q during this tile      */
    int pingpong; /* consumer warpgroups alternate GEMMs on named barriers      */
    int overlap;  /* issue S(j+1) before the softmax of block j                 */
    int small;    /* the alternate for grids filling at most half of the SMs    */
    int tall;     /* > 0: a taller alternate, its expected gain in percent; the
                   * planner weighs ceil(tiles / SMs) * block_m / (1 + tall/100) */
    int ctas;     /* CTAs per SM registers and shared memory are sized for: 1
                   * (2 measured 1-4% slower at d64)                          */
    int kvsplit;  /* 1, or 2: two warpgroups take one 64-row tile's KV blocks
                   * in turn and merge through shared memory                  */
    int unbanded; /* the planner takes it only without a causal/local band    */
};
/* Fields are written in every row except the 0/1 flags (omitted = 0): no
 * default member initialisers, which nvcc's front end and the host compiler
 * resolve differently under designated initialisers. */

/* clang-format off */
constexpr TileRow kTiles[] = {
    /* 0: d64 default: 2 WGs pingpong; S+P+O 128 regs, 96 KB                                        */
    {.head_dim = 64, .block_m = 128, .block_n = 128, .wgs = 2, .stages = 2, .swz = 128, .qbufs = 2, .pingpong = 1, .overlap = 1, .ctas = 1, .kvsplit = 1},
    /* 1: d96 default: 64-byte swizzle (head_dim % 64 != 0); 144 regs, 144 KB                        */
    {.head_dim = 96, .block_m = 128, .block_n = 128, .wgs = 2, .stages = 2, .swz = 64, .qbufs = 2, .pingpong = 1, .overlap = 1, .ctas = 1, .kvsplit = 1},
    /* 2: d128 default: 2 Q buffers beat FA3's non-causal 128x176 by 1-8%; 160 regs, 192 KB          */
    {.head_dim = 128, .block_m = 128, .block_n = 128, .wgs = 2, .stages = 2, .swz = 128, .qbufs = 2, .pingpong = 1, .overlap = 1, .ctas = 1, .kvsplit = 1},
    /* 3: d192: FA3's 128x112 (128x128 needs 240 KB); 180 regs, 216 KB                               */
    {.head_dim = 192, .block_m = 128, .block_n = 112, .wgs = 2, .stages = 2, .swz = 128, .qbufs = 1, .overlap = 1, .ctas = 1, .kvsplit = 1},
    /* 4: d256: FA3's 128x80, Q 64 KB + 2 stages of 80 KB; 188 regs, 224 KB                          */
    {.head_dim = 256, .block_m = 128, .block_n = 80, .wgs = 2, .stages = 2, .swz = 128, .qbufs = 1, .overlap = 1, .ctas = 1, .kvsplit = 1},
    /* 5: d64 small grids: 64-row tiles, 1 WG with 255 regs (4 stages ran 1.6% slower)               */
    {.head_dim = 64, .block_m = 64, .block_n = 128, .wgs = 1, .stages = 2, .swz = 128, .qbufs = 2, .overlap = 1, .small = 1, .ctas = 1, .kvsplit = 1},
    /* 6: d128 small grids: as row 5; 160 KB                                                          */
    {.head_dim = 128, .block_m = 64, .block_n = 128, .wgs = 1, .stages = 2, .swz = 128, .qbufs = 2, .overlap = 1, .small = 1, .ctas = 1, .kvsplit = 1},
    /* 7: d64 tall: FA3's 3 WGs, no overlap (it spills); +16% at s16k-d64, +7% at s512-d64 over row 0 */
    {.head_dim = 64, .block_m = 192, .block_n = 128, .wgs = 3, .stages = 2, .swz = 128, .qbufs = 2, .tall = 20, .ctas = 1, .kvsplit = 1},
    /* 8: d64 small banded grids: 2 WGs share a 64-row tile's KV blocks; mission-causal +9%           */
    {.head_dim = 64, .block_m = 64, .block_n = 128, .wgs = 2, .stages = 4, .swz = 128, .qbufs = 2, .overlap = 1, .small = 1, .ctas = 1, .kvsplit = 2},
    /* 9: d64 tall unbanded: 4 WGs, 256 rows pad less than 192 at s512-d64 (176 us against 192)     */
    {.head_dim = 64, .block_m = 256, .block_n = 64, .wgs = 4, .stages = 4, .swz = 128, .qbufs = 2, .overlap = 1, .tall = 15, .ctas = 1, .kvsplit = 1, .unbanded = 1},
};
/* clang-format on */
constexpr int kNumTiles = (int)(sizeof kTiles / sizeof kTiles[0]);

/* Base alignment of the shared-memory layout (the 128B swizzle's repeat);
 * the dynamic allocation carries this much slack to align itself. */
constexpr int kSmemAlign = 1024;
constexpr int kBarrierBytes = 256;

/* The rotated tile loop (a tile's first S issued in the previous tile's
 * epilogue) needs the next tile's Q in its own buffer and no kvsplit merge
 * between tiles. Planner, launcher and kernel all ask this. */
constexpr bool can_rotate(const TileRow &t) { return t.qbufs == 2 && t.kvsplit == 1; }

/* Rows with registers for tail balancing's merge (plan.cu tail_on, the
 * kernel's tail_merge). */
constexpr bool tail_row(const TileRow &t) { return !t.small && t.kvsplit == 1 && t.wgs <= 2 && t.head_dim <= 192; }

/* Rows whose producer turns key rows into pages (paged K/V, sm90.h): a
 * power-of-two block_n, so whole blocks tile the usual page sizes, and the
 * register room for the table read (the d192/d256 and 4-warpgroup rows
 * spilled 12-40 bytes with it). */
constexpr bool paged_row(const TileRow &t)
{
    return (t.block_n & (t.block_n - 1)) == 0 && t.wgs <= 3 && t.head_dim <= 128;
}

/* Registers per thread: the producer's after setmaxnreg, what a thread gets
 * at launch, and the consumers' share of the rest, in steps of 8 (an
 * increase beyond the launch allocation waits forever). */
constexpr int producer_regs(int wgs) { return wgs == 4 ? 32 : 40; }
constexpr int entry_regs(int wgs, int ctas) { return 65536 / ctas / (128 * (wgs + 1)) / 8 * 8; }
constexpr int consumer_regs(int wgs, int ctas)
{
    return (128 * (wgs + 1) * entry_regs(wgs, ctas) - 128 * producer_regs(wgs)) / (128 * wgs) / 8 * 8;
}

/* kvsplit 2: the second warpgroup's m[2], l[2] and O (head_dim / 2 floats)
 * for its 128 threads. */
constexpr int merge_bytes(const TileRow &t) { return t.kvsplit > 1 ? 128 * (t.head_dim / 2 + 4) * 4 : 0; }

/* Dynamic shared memory of a row (the kernel's Cfg layout must match). */
constexpr int smem_bytes(const TileRow &t)
{
    return kSmemAlign + t.qbufs * t.block_m * t.head_dim * 2 + 2 * t.stages * t.block_n * t.head_dim * 2 +
           merge_bytes(t) + kBarrierBytes;
}

/* Compile-time checks of every row; the kernel's Cfg repeats them for the
 * rows it instantiates. */
constexpr bool tile_ok(const TileRow &t)
{
    const int pw = t.swz / 2;
    const bool setmaxnreg = t.wgs >= 2 || t.ctas > 1;
    return t.wgs >= 1 && t.wgs <= 4 && (t.swz == 128 || t.swz == 64) && t.head_dim % pw == 0 &&
           t.head_dim % 16 == 0 && t.block_n % 16 == 0 && t.block_n >= 16 && t.block_n <= 256 &&
           t.block_m * t.kvsplit == 64 * t.wgs && t.block_m <= 256 && (t.block_m * t.swz) % kSmemAlign == 0 &&
           (t.block_n * t.swz) % kSmemAlign == 0 && (t.qbufs == 1 || t.qbufs == 2) && t.stages >= 1 &&
           88 + 32 * t.stages + 4 * 3 <= kBarrierBytes && (t.ctas == 1 || t.ctas == 2) &&
           (t.kvsplit == 1 || (t.kvsplit == 2 && t.wgs == 2 && !t.pingpong)) && t.tall >= 0 &&
           (t.small == 0 || t.small == 1) && (t.unbanded == 0 || t.unbanded == 1) &&
           (!setmaxnreg || 128 * producer_regs(t.wgs) + 128 * t.wgs * consumer_regs(t.wgs, t.ctas) <=
                               128 * (t.wgs + 1) * entry_regs(t.wgs, t.ctas)) &&
           smem_bytes(t) <= FC_SM90_SMEM_OPTIN && t.ctas * (smem_bytes(t) + FC_SMEM_RESERVED_PER_CTA) <= FC_SM90_SMEM_PER_SM;
}
constexpr bool all_tiles_ok(int i = 0) { return i >= kNumTiles || (tile_ok(kTiles[i]) && all_tiles_ok(i + 1)); }
static_assert(all_tiles_ok(), "a row of the sm90 tile table breaks a kernel, register or shared-memory limit");

/* True when row i is the first of its head_dim (one launcher per head dim). */
constexpr bool first_of_head_dim(int i, int j = 0)
{
    return j >= i || (kTiles[j].head_dim != kTiles[i].head_dim && first_of_head_dim(i, j + 1));
}

} /* namespace fc90 */

#endif /* FC_SM90_TILES_CUH */
