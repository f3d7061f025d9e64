/*
 * tiles.cuh -- THE tile table of the sm80-class forward path: one default
 * row per (architecture class, head_dim), plus optional alternates the
 * planner prefers for long KV (min_sk), grids under one wave (small_grid)
 * or few query rows per tile column (max_rows: decode).
 * Everything else (plan, launch, the per-head-dim translation units) reads
 * this table; nothing else hard-codes a tile size.
 *
 * Kernel shape recap (fwd_kernel.cuh): a CTA of `warps` warps owns block_m
 * query rows, each warp owning 16*MT of them as MT m16 MMA tiles (MT =
 * block_m / (16*warps), 1 or 2). It walks the KV sequence block_n keys at a
 * time through a `stages`-deep cp.async ring -- or, stages 1, through split
 * K/V buffers: one K and one V tile, each with its own cp.async group, V_j
 * loading during S = Q K_j^T and K_{j+1} during O += P V_j (FA2's pipeline;
 * two barriers per block instead of one, and a load is only hidden behind
 * half a block of one CTA's compute -- pays where it buys a second CTA).
 *
 * Register budget (per thread, 32-bit): O accumulator MT*head_dim/2, S = QK^T
 * MT*block_n/2, Q fragments MT*head_dim/4 when kept in registers (Shape::
 * Q_IN_REGS), plus ~60-90 for addresses, softmax state and fragments in
 * flight (measured with ptxas -v; sm_80, CUDA 13.0). 255 is the cap and no
 * row may spill. `ctas` is the occupancy the registers must allow
 * (__launch_bounds__ minBlocks): 65536 / (32*warps*ctas) registers.
 *
 * Shared memory per CTA: (block_m + 2*stages*block_n) * head_dim * 2 bytes
 * (the Q tile, then a K and a V tile per stage -- stages 1: the one K and one
 * V buffer; the output is staged in the Q tile's space) + 24 bytes (the K/V
 * base pointers and the mask-free block range, kept out of registers)
 * + block_m * 8 bytes where S alone
 * takes >= 128 registers (MT * block_n / 2 >= 128: the per-row mask limits,
 * kept out of registers -- fwd_kernel.cuh, Shape::LEAN_REGS)
 * + 16 + 512 bytes on kVarTma rows (two mbarriers, and the pad that puts
 * the tiles on the 512-byte boundaries TMA's swizzle needs).
 * Each SM also reserves 1 KB per CTA.
 *
 * Shared-memory bandwidth: a warp reads each K and V tile once per block for
 * 16*MT rows, i.e. 16*MT MMA FLOPs per byte. At MT = 1 that is ~2 KFLOP per
 * clock per SM at 128 B/clk -- below what mma.sync can do on sm_80/sm_90 --
 * so MT = 2 is preferred where the accumulators fit; MT = 1 where head_dim
 * makes O alone 64-128 registers.
 *
 * Classes:
 *   SM80  A100 / A30 / Orin (cc 8.0, 8.7): 164 KB smem per SM (163 KB per
 *         block opt-in), 64 K registers, 2048 threads per SM.
 *   SM86  GA10x / Ada (cc 8.6, 8.9): 100 KB smem per SM (99 KB per block),
 *         64 K registers, 1536 threads per SM.
 *   SM90  H100 / H200 running this portable path (cc 9.0): 228 KB smem per
 *         SM (227 KB per block), 64 K registers, 2048 threads.
 * Every choice below targets >= 8 warps per SM (2 per scheduler) as FA2 does.
 *
 * Identical rows of different classes compile to ONE kernel (same template
 * arguments), so rows are shared wherever the limits allow: each distinct
 * row is one more kernel compiled for every architecture in the build --
 * except a row only the SM90 class has (tile_sm90_only), whose kernel is
 * empty below sm_90 (its register budget is tuned, and spill-checked, for
 * sm_90 alone).
 */
#ifndef FC_SM80_TILES_CUH
#define FC_SM80_TILES_CUH

#include <stdint.h>

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
    int variant;    /* code variant bits (kVarLeanAddr, kVarEarlyFirst;
                     * fwd_kernel.cuh), each a compile-time switch measured
                     * per row. Omitted = 0: the basic kernel.                */
    int max_rows;   /* 0, or: an alternate the planner takes instead when a
                     * tile column holds at most this many query rows
                     * (seqlen_q x packed query heads; decode), where the
                     * default's taller tile would be mostly padding rows
                     * that cost MMAs. Omitted = 0.                           */
};

/* Code variants (Tile::variant bits), each a compile-time switch of the kernel:
 *  kVarLeanAddr   cp.async / store address generation with one 64-bit pointer
 *                 per distinct row of a pass (64-bit adds, panel hops as
 *                 immediates) instead of a 64-bit multiply per 16-byte chunk;
 *                 Q load and O store take that path when G == 1 (no GQA
 *                 packing); the prologue loads use the K/V bases from
 *                 registers, so the __syncthreads after parking them in smem
 *                 goes (the loop's first barrier orders the smem copy).
 *  kVarEarlyFirst ring rows only: the prologue commits Q + K of the first
 *                 block, then its V, then blocks 2..STAGES (every ring slot is
 *                 free at the start, so one block more than the steady state
 *                 keeps in flight); the first block waits for Q + K only and
 *                 for its V just before O += P V (one extra barrier, first
 *                 block only). */
constexpr int kVarLeanAddr = 1;
constexpr int kVarEarlyFirst = 2;
/*  kVarNoPlain    the row never takes the plain instance (no softcap/mask
 *                 code; fwd_kernel.cuh PLAIN) even where the call allows
 *                 it: measured slower there (H100, session 6: the 128x64
 *                 d128 row, s2k -0.3%, s8k -2.5% against FA2's same-pass
 *                 figures, where d64 and d256 gained 1.4-2.8%).          */
constexpr int kVarNoPlain = 4;
/*  kVarTma        split K/V rows (stages 1) of the SM90 class only: the K and
 *                 V tiles arrive by TMA (cp.async.bulk.tensor: one 5-d box
 *                 per tile, its 64-byte swizzle = the PC 4 panel layout)
 *                 issued by thread 0 and completing on one mbarrier per
 *                 buffer, instead of 16 cp.async per thread and tile. Q
 *                 stays cp.async. The copies leave the threads' instruction
 *                 stream and the MIO queue the ldmatrix share (notes-sm80.md,
 *                 sessions 7-9, 13 and 14). The planner takes such a row only
 *                 where TMA can load K and V (plan.cu).                    */
constexpr int kVarTma = 8;

// clang-format off
constexpr Tile kTiles[] = {
    /* ------------------------- SM80: 164 KB smem per SM ------------------------- */
    /* d32: MT 2, S 64 + O 32 + Q 16 regs (~215 used). smem 8+2*2*4 = 24 KB. 2 CTAs
     * = 8 warps. block_n 128 would double S for a head dim this cheap: no.       */
    {kClassSm80,  32, 128,  64, 4, 2, 2, 0, 0},
    /* d64: MT 2, S 64 + O 64 + Q 32 regs (255 used, no spill; block_n 128 would
     * need S 128 and spills). smem 16+2*2*8 = 48 KB. 2 CTAs = 8 warps.           */
    {kClassSm80,  64, 128,  64, 4, 2, 2, 0, 0},
    /* d96: MT 2, O 96 + S 32 regs (block_n 64 would reach 255 with no room).
     * smem 24+2*2*6 = 48 KB. 2 CTAs = 8 warps.                                    */
    {kClassSm80,  96, 128,  32, 4, 2, 2, 0, 0},
    /* d128: MT 2, O 128 + S 32, Q re-read from smem (~240 regs; block_n 64 spills).
     * smem 32+2*2*8 = 64 KB: 2 CTAs (128 KB) = 8 warps. (MT 1 at 128x64 with 8
     * warps also fits but reads twice the smem per FLOP.)                          */
    {kClassSm80, 128, 128,  32, 4, 2, 2, 0, 0},
    /* d256: MT 1 (O alone is 128 regs), S 16, Q from smem (~243 regs). smem
     * 64+2*2*16 = 128 KB: 1 CTA of 8 warps. block_n 64 needs 192 KB: too much.    */
    {kClassSm80, 256, 128,  32, 8, 2, 1, 0, 0},

    /* ------------------ SM86/89: 100 KB smem per SM, 99 KB per block ------------------ */
    {kClassSm86,  32, 128,  64, 4, 2, 2, 0, 0},   /* = SM80: 24 KB, 2 CTAs                 */
    {kClassSm86,  64, 128,  64, 4, 2, 2, 0, 0},   /* = SM80: 2 x 48 KB + 2 x 1 KB <= 100 KB */
    {kClassSm86,  96, 128,  32, 4, 2, 2, 0, 0},   /* = SM80: 2 x 48 KB                      */
    /* d128: SM80's 64 KB row gives 1 CTA = 4 warps here; MT 1 with 8 warps
     * (O 64 + S 32 + Q 32, ~200 regs) at 32+2*2*16 = 96 KB keeps 8 warps per SM.   */
    {kClassSm86, 128, 128,  64, 8, 2, 1, 0, 0},
    /* d256: 99 KB cap: 64 rows x 32 keys = 32+2*2*16 = 96 KB, 1 CTA of 4 warps
     * (the tensor cores here have half of A100's rate per SM; FA2 also runs
     * 4 warps at d256 on these parts).                                               */
    {kClassSm86, 256,  64,  32, 4, 2, 1, 0, 0},

    /* --------------- SM90 running mma.sync: 228 KB smem per SM, 227 KB per block --------------- */
    {kClassSm90,  32, 128,  64, 4, 2, 2, 0, 0},   /* = SM80                                  */
    /* d64: 128x128 = FA2's d64 tile: MT 2, O 64 + S 128 regs, Q from smem, K/V
     * bases and the per-row mask limits in smem, load_kv's unit offsets
     * recomputed from %tid.x (Shape::LEAN_REGS): 255 regs, no spill on sm_90a
     * (spilled 64 B before). smem 16+2*2*16 = 80 KB + 24 B + 1 KB (mask
     * limits): 2 CTAs = 8 warps (2 x (81 KB + 24 B + 1 KB reserved) <= 228 KB).
     * Half the KV blocks of 128x64, so half the per-block barriers, row-max
     * shuffles, O rescales and Q re-reads: ~12% fewer issued instructions per
     * key on the unmasked path (SASS: 1139 per 128 keys vs 648 per 64).
     * Default, not a min_sk alternate: tail padding is at most 127 keys
     * (vs 63), and a causal diagonal wastes the same 128*128/2 scores either
     * way. Measured (H100, notes-sm80.md, session 2): the same speed as the
     * 128x64 row it replaced (s512-d64 0.85x FA2 with either), not the
     * predicted +3..7%; kept as FA2's tile, tested like every row.
     * SM90-only: it also compiles without spills for sm_80/86/89, but on SM80
     * 2 x (81 KB + 24 B + 1 KB reserved) = 164 KB + 48 B > 164 KB, i.e. 1 CTA
     * of 4 warps, and SM86 has 100 KB (FA2 takes it on both; not taken here).
     * Lean addressing: +3% at s512-d64 (H100, session 4, same run); with the
     * lean Q load / O store too (spill-free since session 6): +7.5% more.    */
    {kClassSm90,  64, 128, 128, 4, 2, 2, 0, 0, kVarLeanAddr},
    /* d64, long KV: 128x96, 3 stages (255 regs, no spill; 88 KB: 2 CTAs). Fewer
     * per-block softmax/barrier rounds: +5% at 16k keys on an H100 over 128x64,
     * but -8% at 512 keys (512 = 5.3 blocks of 96: a padded tail block) --
     * hence min_sk. Against 128x128 only the spilling probe was measured
     * (313 vs 308 TFLOP/s at 16k): kept until 128x128 is measured spill-free. */
    {kClassSm90,  64, 128,  96, 4, 3, 2, 4096, 0},
    /* d64, small grid (fewer 128-row tiles than SMs, e.g. 1 x 8 heads x 512):
     * 64 rows, MT 1, 40 KB. Twice the CTAs, each half the serial MMA chain per
     * KV block; at 1x8x512 on an H100 10.9 us (split 1 or 4; 11.3 us at split
     * 2, which fc_choose_num_splits picks for 64 CTAs) vs 13.3 us for 128x64 +
     * split4 (FA2: 10.7 us). At 32x32x512 it loses (207 vs 221 TFLOP/s): only
     * for grids under one wave. A 4-deep ring (8+2*4*8 = 72 KB: 2 CTAs) with
     * lean addressing and the early first block: the mission's 4-block
     * split has every block in flight at once; +5.5% at 1x8x512 over the
     * 2-stage plain row (H100, session 4, same run; lean alone +2.6%).         */
    {kClassSm90,  64,  64,  64, 4, 4, 2, 0, 1, kVarLeanAddr | kVarEarlyFirst},
    {kClassSm90,  96, 128,  32, 4, 2, 2, 0, 0},   /* = SM80                                  */
    /* d128: 128x64 = FA2's tile (MT 2, O 128 + S 64 regs, Q from smem): 255 regs
     * on sm_90a, no spill now that the K/V bases sit in smem (sm_80 still spills
     * 4 bytes, so the SM80 row keeps 128x32). smem 32+2*2*16 = 96 KB: 2 CTAs.
     * +4-5% over 128x32 on an H100 (s2k / s8k). Lean addressing (spill-free
     * since session 6): s2k-d128 +1.6%, s2k-causal +2.6%, gqa-prefill +0.9%.     */
    {kClassSm90, 128, 128,  64, 4, 2, 2, 0, 0, kVarLeanAddr | kVarNoPlain},
    /* d256: FA2's H100 tile -- 64x64, 4 warps (MT 1: O 128 + S 32 regs, Q from
     * smem, KV bases in registers; 246 regs on sm_90a, no spill), split K/V
     * buffers (stages 1): 32+2*1*32 = 96 KB + 24 B, so 2 CTAs = 8 warps per SM
     * (2 x (96 KB + 24 B + 1 KB) = 194 KB <= 228 KB), the two CTAs covering each
     * other's load waits and barriers. block_n 64 keeps the per-block
     * softmax/barrier cost of the old 128x64 ring row (1 CTA of 8 warps,
     * 64+2*2*32 = 192 KB; measured on an H100: 277 TFLOP/s at s4k vs FA2's
     * 331); the ring at 64x32 x 2 CTAs measured -3%, 128x32 -10%.
     * Not for SM80: 2 x (96 KB + 1 KB) = 194 KB > 164 KB per SM, so it would
     * be 1 CTA of 4 warps there (SM80 keeps its 128x32 ring row; FA2's A100
     * tile would be 128x64 x 8 warps split, 128 KB -- unmeasured, not taken).
     * Not for SM86: 1 CTA per SM either way (100 KB); unmeasured, not taken.
     * Lean addressing here measured -4% at s4k-d256 (H100, session 6): not
     * taken (the split K/V loads sit mid-block, hidden by the other CTA).
     * K/V by TMA, one box per tile (kVarTma): s4k-d256 0.988x -> 1.081x FA2
     * (H100, session 14, run 103, same passes); +16 B of mbarriers and a
     * 512-byte alignment pad: 2 x (96 KB + 552 B + 1 KB) <= 228 KB.        */
    {kClassSm90, 256,  64,  64, 4, 1, 2, 0, 0, kVarTma},

    /* ------------- few query rows per tile column (max_rows): decode ------------- */
    /* d128, SM80 and SM90 classes (one kernel): 64x64, 4 warps, MT 1 (O 64 + S 32
     * regs), 2-stage ring, 64+2*2*64 rows x 256 B = 80 KB: 2 CTAs per SM on both
     * (2 x (80 KB + 24 B + 1 KB) <= 164 KB). gqa-decode packs 1 row x 4 query
     * heads per KV head: in the default 128-row tiles 124 of 128 rows are
     * padding, and the padded MMAs, not the K/V stream, set the time (H200,
     * session 11: 378 us = 2.84 TB/s, 68% of the copy rate; 137 GFLOP of
     * mostly padding at the path's ~355 TFLOP/s is 386 us). 64 rows halve
     * that work; more rows per column than 64 would need two CTAs reading
     * the same K/V.                                                           */
    {kClassSm80, 128,  64,  64, 4, 2, 2, 0, 0, 0, 64},
    {kClassSm90, 128,  64,  64, 4, 2, 2, 0, 0, 0, 64},
    /* d64, SM80 and SM90 classes: the SM90 small-grid row's kernel (64x64, 4
     * warps, MT 1, 4-stage ring, lean addressing, early first block; 72 KB:
     * 2 CTAs per SM on both), so no new kernel on sm_90 (on sm_80/86/89 that
     * kernel is now built too: 149 registers on sm_80, no spill). The default
     * 128-row tiles (128x96 at long KV) are 124/128 padding at gqa-decode
     * too: 236.8 -> 150.6 us on an H200 (session 11, run 82).               */
    {kClassSm80,  64,  64,  64, 4, 4, 2, 0, 0, kVarLeanAddr | kVarEarlyFirst, 64},
    {kClassSm90,  64,  64,  64, 4, 4, 2, 0, 0, kVarLeanAddr | kVarEarlyFirst, 64},
};
// clang-format on

constexpr int kNumTiles = (int)(sizeof(kTiles) / sizeof(kTiles[0]));

/* = Shape::LEAN_REGS (fwd_kernel.cuh): S = QK^T alone takes >= 128 registers. */
constexpr bool tile_lean_regs(const Tile &t)
{
    return (t.block_m / (16 * t.warps)) * t.block_n / 2 >= 128;
}
/* = Shape::SMEM_BYTES (fwd_launch.cuh checks they agree). */
constexpr int64_t tile_smem_bytes(const Tile &t)
{
    return (int64_t)(t.block_m + 2 * t.stages * t.block_n) * t.head_dim * 2 + 24 /* + K/V bases, block range */ +
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

/* Shared memory per SM of a class (the header comment), for the occupancy
 * check: `ctas` CTAs of a row must fit, each with the 1 KB the SM reserves. */
constexpr int64_t class_sm_smem(int cls)
{
    return cls == kClassSm80 ? 164 * 1024 : cls == kClassSm86 ? 100 * 1024 : 228 * 1024;
}

/* Compile-time checks of every row: the kernel's static_asserts repeat them
 * for the instantiated ones, these catch a bad row even if no unit uses it. */
constexpr bool tile_ok(const Tile &t)
{
    return (t.head_dim == 32 || t.head_dim == 64 || t.head_dim == 96 || t.head_dim == 128 ||
            t.head_dim == 256) &&
           t.warps >= 1 && t.warps <= 8 && t.block_m % (16 * t.warps) == 0 &&
           (t.block_m / (16 * t.warps) == 1 || t.block_m / (16 * t.warps) == 2) &&
           t.block_n % 16 == 0 && t.block_n >= 16 && t.stages >= 1 && t.stages <= 4 &&
           t.ctas >= 1 && 32 * t.warps * t.ctas * 24 <= 65536 && t.min_sk >= 0 && (t.small_grid == 0 || t.small_grid == 1) &&
           /* an alternate is one kind of alternate; a few-rows one fits its rows */
           (t.min_sk > 0) + (t.small_grid != 0) + (t.max_rows != 0) <= 1 &&
           t.max_rows >= 0 && t.max_rows <= t.block_m &&
           t.variant >= 0 && t.variant <= (kVarLeanAddr | kVarEarlyFirst | kVarNoPlain | kVarTma) &&
           !((t.variant & kVarEarlyFirst) && t.stages < 2) &&
           /* TMA: split K/V rows of the SM90 class, without lean addressing
            * (no K/V address code left to make lean) */
           (!(t.variant & kVarTma) || (t.stages == 1 && t.arch_class == kClassSm90 &&
                                       !(t.variant & kVarLeanAddr))) &&
           tile_smem_bytes(t) <= 227 * 1024 &&
           (t.arch_class != kClassSm86 || tile_smem_bytes(t) <= 99 * 1024) &&
           (t.arch_class != kClassSm80 || tile_smem_bytes(t) <= 163 * 1024) &&
           t.ctas * (tile_smem_bytes(t) + 1024) <= class_sm_smem(t.arch_class);
}
constexpr bool all_tiles_ok(int i = 0)
{
    return i >= kNumTiles ? true : (tile_ok(kTiles[i]) && all_tiles_ok(i + 1));
}
static_assert(all_tiles_ok(), "a row of the sm80 tile table breaks a kernel or smem limit");

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_TILES_CUH */
