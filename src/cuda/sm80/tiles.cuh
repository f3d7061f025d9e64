/*
 * tiles.cuh -- the tile table of the sm80-class forward path: one default
 * row per (architecture class, head_dim), plus alternates the planner
 * prefers for long KV (min_sk), grids under one wave (small_grid) or few
 * query rows per tile column (max_rows: decode). Plan, launch and the
 * per-head-dim translation units all read it; nothing else names a tile.
 *
 * Budgets a row must meet (fwd_kernel.cuh for the kernel's shape):
 *  - registers per thread: O MT*head_dim/2 + S MT*block_n/2 (+ Q
 *    MT*head_dim/4 when Shape::Q_IN_REGS) + ~60-90 more; 255 is the cap, no
 *    row may spill, and `ctas` CTAs must fit 64 K registers.
 *  - smem per CTA: tile_smem_bytes (Q tile + a K and a V tile per stage +
 *    24 bytes + the LEAN_REGS mask table + the kVarTma barriers and pad),
 *    plus FC_SMEM_RESERVED_PER_CTA per CTA on the SM.
 *  - MT 2 where the accumulators fit: at MT 1 a warp's K/V smem reads per
 *    MMA FLOP double, below what mma.sync needs on sm_80/sm_90.
 * Classes: SM80 (A100, A30, Orin: 164 KB smem per SM, 163 KB per block),
 * SM86 (GA10x, Ada: 100 KB, 99 KB per block), SM90 (H100/H200 on this
 * path: 228 KB, 227 KB per block). Every row targets >= 8 warps per SM.
 * Identical rows of different classes compile to one kernel; a row only
 * the SM90 class has (tile_sm90_only) compiles empty below sm_90.
 */
#ifndef FC_SM80_TILES_CUH
#define FC_SM80_TILES_CUH

#include <stdint.h>

#include "constants.h"

namespace fc {
namespace sm80 {

enum ArchClass { kClassSm80 = 0, kClassSm86 = 1, kClassSm90 = 2, kNumArchClasses = 3 };

struct Tile {
    int arch_class;
    int head_dim;
    int block_m; /* query rows per CTA = 16 * MT * warps                      */
    int block_n; /* keys per main-loop iteration                              */
    int warps;
    int stages;  /* K/V cp.async ring depth (2..4); 1 = split K/V buffers      */
    int ctas;    /* CTAs per SM the register use must allow                   */
    int min_sk;  /* 0: the (class, head_dim) default. > 0: an alternate the
                  * planner takes instead when seqlen_k >= min_sk (a wider
                  * block_n that pays only once the KV tail's padding is small) */
    int small_grid; /* 1: an alternate the planner takes instead when the
                     * default row's grid has fewer CTAs than the device has
                     * SMs (smaller tiles: more CTAs, shorter serial chains) */
    int variant;    /* code variant bits (kVarLeanAddr, kVarEarlyFirst, ...;
                     * layout.cuh Shape), each a compile-time switch measured
                     * per row. Omitted = 0: the basic kernel.                */
    int max_rows;   /* 0, or: an alternate the planner takes instead when a
                     * tile column holds at most this many query rows
                     * (seqlen_q x packed query heads; decode), where the
                     * default's taller tile would be mostly padding rows
                     * that cost MMAs. Omitted = 0.                           */
};

/* Code variants (Tile::variant bits), each a compile-time switch of the kernel:
 *  kVarLeanAddr   cp.async / store addresses from one 64-bit pointer per
 *                 distinct row of a pass instead of a 64-bit multiply per
 *                 16-byte chunk (Q load and O store too when G == 1).
 *  kVarEarlyFirst ring rows: the prologue keeps one block more in flight
 *                 (every slot is free at the start); the first block waits
 *                 for Q + K only, and for its V just before O += P V.
 *  kVarNoPlain    never the plain instance (no softcap/mask code): slower
 *                 there on the 128x64 d128 row (s8k -2.5%).
 *  kVarTma        split K/V rows of the SM90 class: K and V by TMA, one box
 *                 per tile on one mbarrier per buffer, issued by thread 0,
 *                 off the MIO queue the ldmatrix share (plan.cu checks TMA
 *                 can load the call's K and V). */
constexpr int kVarLeanAddr = 1;
constexpr int kVarEarlyFirst = 2;
constexpr int kVarNoPlain = 4;
constexpr int kVarTma = 8;
/*  kVarPaged      K/V from a paged cache (fc_attention_args.block_table):
 *                 each thread's rows through the block table; the planner
 *                 takes these rows for paged calls and only for them. */
constexpr int kVarPaged = 16;
/*  kVarKv8        K/V in FP8 (an FP8 K/V cache under f16/bf16 q): the ring
 *                 carries FP8 bytes, each block is converted to 16-bit
 *                 panels in smem (loads_kv8.cuh); the planner takes these
 *                 rows for FP8 K/V calls and only for them. */
constexpr int kVarKv8 = 32;
/*  kVarWarpKeys   block_m 16: the warps share one m16 tile of rows and split
 *                 each block's keys, merging at the end (warp_keys.cuh): a
 *                 decode step's GQA group fills the tile, and no warp runs
 *                 MMAs for padding rows. */
constexpr int kVarWarpKeys = 64;

// clang-format off
constexpr Tile kTiles[] = {
    /* ------------------------- SM80: 164 KB smem per SM ------------------------- */
    {kClassSm80,  32, 128,  64, 4, 2, 2, 0, 0},   /* MT 2, 24 KB: 2 CTAs; block_n 128 buys nothing */
    {kClassSm80,  64, 128,  64, 4, 2, 2, 0, 0},   /* MT 2, 255 regs; block_n 128 spills        */
    {kClassSm80,  96, 128,  32, 4, 2, 2, 0, 0},   /* MT 2, O 96 regs: block_n 64 leaves no room */
    {kClassSm80, 128, 128,  32, 4, 2, 2, 0, 0},   /* MT 2, Q from smem; block_n 64 spills       */
    {kClassSm80, 256, 128,  32, 8, 2, 1, 0, 0},   /* MT 1 (O 128 regs), 128 KB: 1 CTA of 8 warps */

    /* ------------------ SM86/89: 100 KB smem per SM, 99 KB per block ------------------ */
    {kClassSm86,  32, 128,  64, 4, 2, 2, 0, 0},   /* = SM80                                  */
    {kClassSm86,  64, 128,  64, 4, 2, 2, 0, 0},   /* = SM80: 2 x 48 KB fit                   */
    {kClassSm86,  96, 128,  32, 4, 2, 2, 0, 0},   /* = SM80                                  */
    {kClassSm86, 128, 128,  64, 8, 2, 1, 0, 0},   /* MT 1, 96 KB: SM80's row would be 4 warps/SM */
    {kClassSm86, 256,  64,  32, 4, 2, 1, 0, 0},   /* 96 KB under the 99 KB cap (FA2's choice too) */

    /* --------------- SM90 running mma.sync: 228 KB smem per SM, 227 KB per block --------------- */
    {kClassSm90,  32, 128,  64, 4, 2, 2, 0, 0},   /* = SM80                                  */
    /* FA2's d64 tile: half the per-block overhead of 128x64 (LEAN_REGS keeps it
     * spill-free); lean addressing +10% at s512-d64. SM90 only: 1 CTA on SM80. */
    {kClassSm90,  64, 128, 128, 4, 2, 2, 0, 0, kVarLeanAddr},
    /* long KV: +5% at 16k keys over 128x64, -8% at 512 (a padded tail block). */
    {kClassSm90,  64, 128,  96, 4, 3, 2, 4096, 0},
    /* grids under one wave: twice the CTAs, half the serial chain each
     * (1x8x512: 10.9 us vs 13.3 us for 128x64 + split 4). */
    {kClassSm90,  64,  64,  64, 4, 4, 2, 0, 1, kVarLeanAddr | kVarEarlyFirst},
    {kClassSm90,  96, 128,  32, 4, 2, 2, 0, 0},   /* = SM80                                  */
    /* FA2's d128 tile, 255 regs on sm_90a (sm_80 spills, so SM80 keeps 128x32):
     * +4-5% over 128x32; lean addressing +1-3%. */
    {kClassSm90, 128, 128,  64, 4, 2, 2, 0, 0, kVarLeanAddr | kVarNoPlain},
    /* FA2's H100 d256 tile: split K/V buffers, 2 CTAs of 96 KB hide each
     * other's loads (the 128x64 ring: 277 vs FA2's 331 TFLOP/s); K/V by TMA:
     * 0.988x -> 1.081x FA2 at s4k. */
    {kClassSm90, 256,  64,  64, 4, 1, 2, 0, 0, kVarTma},

    /* ------------- few query rows per tile column (max_rows): decode ------------- */
    /* d128: 64-row tiles halve the padding MMAs that set gqa-decode's time. */
    {kClassSm80, 128,  64,  64, 4, 2, 2, 0, 0, 0, 64},
    {kClassSm90, 128,  64,  64, 4, 2, 2, 0, 0, 0, 64},
    /* d64: the SM90 small-grid kernel (149 regs on sm_80): 236.8 -> 150.6 us
     * at gqa-decode on an H200. */
    {kClassSm80,  64,  64,  64, 4, 4, 2, 0, 0, kVarLeanAddr | kVarEarlyFirst, 64},
    {kClassSm90,  64,  64,  64, 4, 4, 2, 0, 0, kVarLeanAddr | kVarEarlyFirst, 64},

    /* ------------- paged KV cache (kVarPaged): decode and chunked prefill ------------- */
    /* The decode rows' tiles (64 query rows: a GQA group's decode or
     * speculative tokens fill them); SM86 parts run the SM80 rows. Never
     * plain: a cache call nearly always has seqused_k, so masked tails.
     * d128 ring depth 2: 3 stages measured level, 4 stages at 1 CTA/SM
     * -30% (H200, B64 S8k 32/8). */
    {kClassSm80, 128,  64,  64, 4, 2, 2, 0, 0, kVarPaged | kVarNoPlain},
    {kClassSm90, 128,  64,  64, 4, 2, 2, 0, 0, kVarPaged | kVarNoPlain},
    {kClassSm80,  64,  64,  64, 4, 4, 2, 0, 0, kVarPaged | kVarNoPlain},
    {kClassSm90,  64,  64,  64, 4, 4, 2, 0, 0, kVarPaged | kVarNoPlain},

    /* ------------- FP8 K/V (kVarKv8), dense and paged: decode ------------- */
    /* The decode rows' tiles; the ring carries half the bytes, so d64 keeps
     * 2 stages too (3-4 stages and 128-key blocks measured no faster:
     * design-sm80.md). Never plain, as the paged rows. */
    {kClassSm80, 128,  64,  64, 4, 2, 2, 0, 0, kVarKv8 | kVarNoPlain},
    {kClassSm80,  64,  64,  64, 4, 2, 2, 0, 0, kVarKv8 | kVarNoPlain},
    {kClassSm80, 128,  64,  64, 4, 2, 2, 0, 0, kVarKv8 | kVarPaged | kVarNoPlain},
    {kClassSm80,  64,  64,  64, 4, 2, 2, 0, 0, kVarKv8 | kVarPaged | kVarNoPlain},
    /* At most 16 rows a tile column (a decode step's GQA group): one m16
     * tile, the warps splitting the keys (H100 gqa-decode e4m3 under bf16
     * q: 327 -> 228 us against the 64-row row). */
    {kClassSm80, 128,  16,  64, 4, 2, 2, 0, 0, kVarKv8 | kVarNoPlain | kVarWarpKeys, 16},
    {kClassSm80,  64,  16,  64, 4, 2, 2, 0, 0, kVarKv8 | kVarNoPlain | kVarWarpKeys, 16},
    {kClassSm80, 128,  16,  64, 4, 2, 2, 0, 0, kVarKv8 | kVarPaged | kVarNoPlain | kVarWarpKeys, 16},
    {kClassSm80,  64,  16,  64, 4, 2, 2, 0, 0, kVarKv8 | kVarPaged | kVarNoPlain | kVarWarpKeys, 16},
};
// clang-format on

constexpr int kNumTiles = (int)(sizeof(kTiles) / sizeof(kTiles[0]));

/* = Shape::LEAN_REGS (layout.cuh): S = QK^T alone takes >= 128 registers. */
constexpr bool tile_lean_regs(const Tile &t)
{
    return (t.block_m / (16 * t.warps)) * t.block_n / 2 >= 128;
}
/* = Shape::SMEM_BYTES (fwd_launch.cuh checks they agree). */
constexpr int64_t tile_smem_bytes(const Tile &t)
{
    return (int64_t)(t.block_m + 2 * t.stages * t.block_n) * t.head_dim * 2 + 24 /* + K/V bases, block range */ +
           ((t.variant & kVarKv8) ? (int64_t)(2 - t.stages) * t.block_n * t.head_dim * 2 : 0) /* FP8 ring:
                                                   * half the bytes, + the converted K/V pair */ +
           (tile_lean_regs(t) ? t.block_m * 8 : 0) /* + mask limits */ +
           ((t.variant & kVarTma) ? 16 + 512 : 0); /* + 2 mbarriers, + the 512-byte alignment
                                                    * the 64-byte TMA swizzle needs */
}

/* True when row r is of the SM90 class and no row of an older class has the
 * same kernel (template arguments): its kernel is then compiled empty for
 * targets below sm_90 (fwd_kernel.cuh) and the planner never picks it on a
 * device of an older class (plan.cu). */
constexpr bool same_kernel(const Tile &a, const Tile &b)
{
    return a.head_dim == b.head_dim && a.block_m == b.block_m && a.block_n == b.block_n &&
           a.warps == b.warps && a.stages == b.stages && a.ctas == b.ctas && a.variant == b.variant;
}
constexpr bool tile_sm90_only(const Tile &r, int i = 0)
{
    return r.arch_class != kClassSm90 ? false
           : i >= kNumTiles           ? true
           : (kTiles[i].arch_class != kClassSm90 && same_kernel(kTiles[i], r)) ? false
                                                                              : tile_sm90_only(r, i + 1);
}

/* Shared memory per SM of a class, for the occupancy check: `ctas` CTAs
 * of a row must fit, each with the SM's per-CTA reserve. */
constexpr int64_t class_sm_smem(int cls)
{
    return cls == kClassSm80 ? 164 * 1024 : cls == kClassSm86 ? 100 * 1024 : FC_SM90_SMEM_PER_SM;
}

/* Compile-time checks of every row: the kernel's static_asserts repeat them
 * for the instantiated ones, these catch a bad row even if no unit uses it. */
constexpr bool tile_ok(const Tile &t)
{
    return (t.head_dim == 32 || t.head_dim == 64 || t.head_dim == 96 || t.head_dim == 128 ||
            t.head_dim == 256) &&
           t.warps >= 1 && t.warps <= 8 &&
           ((t.variant & kVarWarpKeys) ? t.block_m == 16 && t.block_n % (16 * t.warps) == 0
                                       : t.block_m % (16 * t.warps) == 0 &&
                                             (t.block_m / (16 * t.warps) == 1 || t.block_m / (16 * t.warps) == 2)) &&
           t.block_n % 16 == 0 && t.block_n >= 16 && t.stages >= 1 && t.stages <= 4 &&
           t.ctas >= 1 && 32 * t.warps * t.ctas * 24 <= 65536 && t.min_sk >= 0 && (t.small_grid == 0 || t.small_grid == 1) &&
           /* an alternate is one kind of alternate; a few-rows one fits its rows */
           (t.min_sk > 0) + (t.small_grid != 0) + (t.max_rows != 0) <= 1 &&
           t.max_rows >= 0 && t.max_rows <= t.block_m &&
           t.variant >= 0 &&
           t.variant <= (kVarLeanAddr | kVarEarlyFirst | kVarNoPlain | kVarTma | kVarPaged | kVarKv8 | kVarWarpKeys) &&
           /* FP8 K/V: plain ring rows (layout.cuh Shape) */
           (!(t.variant & kVarKv8) || (t.stages >= 2 && !(t.variant & (kVarTma | kVarLeanAddr | kVarEarlyFirst)))) &&
           /* paged: cp.async per-row addresses (no TMA boxes, no lean pointers) */
           (!(t.variant & kVarPaged) || !(t.variant & (kVarTma | kVarLeanAddr))) &&
           !((t.variant & kVarEarlyFirst) && t.stages < 2) &&
           /* TMA: split K/V rows of the SM90 class, without lean addressing
            * (no K/V address code left to make lean) */
           (!(t.variant & kVarTma) || (t.stages == 1 && t.arch_class == kClassSm90 &&
                                       !(t.variant & kVarLeanAddr))) &&
           tile_smem_bytes(t) <= FC_SM90_SMEM_OPTIN &&
           (t.arch_class != kClassSm86 || tile_smem_bytes(t) <= 99 * 1024) &&
           (t.arch_class != kClassSm80 || tile_smem_bytes(t) <= 163 * 1024) &&
           t.ctas * (tile_smem_bytes(t) + FC_SMEM_RESERVED_PER_CTA) <= class_sm_smem(t.arch_class);
}
constexpr bool all_tiles_ok(int i = 0)
{
    return i >= kNumTiles ? true : (tile_ok(kTiles[i]) && all_tiles_ok(i + 1));
}
static_assert(all_tiles_ok(), "a row of the sm80 tile table breaks a kernel or smem limit");

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_TILES_CUH */
