/*
 * tiles.cuh -- THE tile table of the sm80-class forward path: one row per
 * (architecture class, head_dim). Everything else (plan, launch, the
 * per-head-dim translation units) reads this table; nothing else hard-codes
 * a tile size.
 *
 * Kernel shape recap (fwd_kernel.cuh): a CTA of `warps` warps owns block_m
 * query rows, each warp owning 16*MT of them as MT m16 MMA tiles (MT =
 * block_m / (16*warps), 1 or 2). It walks the KV sequence block_n keys at a
 * time through a `stages`-deep cp.async ring.
 *
 * Register budget (per thread, 32-bit): O accumulator MT*head_dim/2, S = QK^T
 * MT*block_n/2, Q fragments MT*head_dim/4 when kept in registers (Shape::
 * Q_IN_REGS), plus ~60-90 for addresses, softmax state and fragments in
 * flight (measured with ptxas -v; sm_80, CUDA 13.0). 255 is the cap and no
 * row may spill. `ctas` is the occupancy the registers must allow
 * (__launch_bounds__ minBlocks): 65536 / (32*warps*ctas) registers.
 *
 * Shared memory per CTA: (block_m + 2*stages*block_n) * head_dim * 2 bytes
 * (the Q tile, then a K and a V tile per stage; the output is staged in the
 * Q tile's space). Each SM also reserves 1 KB per CTA.
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
 * row is one more kernel compiled for every architecture in the build.
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
    int stages;  /* K/V cp.async ring depth (>= 2)                            */
    int ctas;    /* CTAs per SM the register use must allow                   */
};

// clang-format off
constexpr Tile kTiles[] = {
    /* ------------------------- SM80: 164 KB smem per SM ------------------------- */
    /* d32: MT 2, S 64 + O 32 + Q 16 regs (~215 used). smem 8+2*2*4 = 24 KB. 2 CTAs
     * = 8 warps. block_n 128 would double S for a head dim this cheap: no.       */
    {kClassSm80,  32, 128,  64, 4, 2, 2},
    /* d64: MT 2, S 64 + O 64 + Q 32 regs (255 used, no spill; block_n 128 would
     * need S 128 and spills). smem 16+2*2*8 = 48 KB. 2 CTAs = 8 warps.           */
    {kClassSm80,  64, 128,  64, 4, 2, 2},
    /* d96: MT 2, O 96 + S 32 regs (block_n 64 would reach 255 with no room).
     * smem 24+2*2*6 = 48 KB. 2 CTAs = 8 warps.                                    */
    {kClassSm80,  96, 128,  32, 4, 2, 2},
    /* d128: MT 2, O 128 + S 32, Q re-read from smem (~240 regs; block_n 64 spills).
     * smem 32+2*2*8 = 64 KB: 2 CTAs (128 KB) = 8 warps. (MT 1 at 128x64 with 8
     * warps also fits but reads twice the smem per FLOP.)                          */
    {kClassSm80, 128, 128,  32, 4, 2, 2},
    /* d256: MT 1 (O alone is 128 regs), S 16, Q from smem (~243 regs). smem
     * 64+2*2*16 = 128 KB: 1 CTA of 8 warps. block_n 64 needs 192 KB: too much.    */
    {kClassSm80, 256, 128,  32, 8, 2, 1},

    /* ------------------ SM86/89: 100 KB smem per SM, 99 KB per block ------------------ */
    {kClassSm86,  32, 128,  64, 4, 2, 2},   /* = SM80: 24 KB, 2 CTAs                 */
    {kClassSm86,  64, 128,  64, 4, 2, 2},   /* = SM80: 2 x 48 KB + 2 x 1 KB <= 100 KB */
    {kClassSm86,  96, 128,  32, 4, 2, 2},   /* = SM80: 2 x 48 KB                      */
    /* d128: SM80's 64 KB row gives 1 CTA = 4 warps here; MT 1 with 8 warps
     * (O 64 + S 32 + Q 32, ~200 regs) at 32+2*2*16 = 96 KB keeps 8 warps per SM.   */
    {kClassSm86, 128, 128,  64, 8, 2, 1},
    /* d256: 99 KB cap: 64 rows x 32 keys = 32+2*2*16 = 96 KB, 1 CTA of 4 warps
     * (the tensor cores here have half of A100's rate per SM; FA2 also runs
     * 4 warps at d256 on these parts).                                               */
    {kClassSm86, 256,  64,  32, 4, 2, 1},

    /* --------------- SM90 running mma.sync: 228 KB smem per SM, 227 KB per block --------------- */
    {kClassSm90,  32, 128,  64, 4, 2, 2},   /* = SM80                                  */
    {kClassSm90,  64, 128,  64, 4, 2, 2},   /* = SM80: smem-bandwidth bound, MT 2 helps */
    {kClassSm90,  96, 128,  32, 4, 2, 2},   /* = SM80                                  */
    {kClassSm90, 128, 128,  32, 4, 2, 2},   /* = SM80: 2 x 64 KB; registers cap at 2 CTAs */
    /* d256: block_n 64 halves the per-block softmax/rescale overhead vs 32 and
     * fits here: 64+2*2*32 = 192 KB, 1 CTA of 8 warps (~243 regs).                  */
    {kClassSm90, 256, 128,  64, 8, 2, 1},
};
// clang-format on

constexpr int kNumTiles = (int)(sizeof(kTiles) / sizeof(kTiles[0]));

constexpr int64_t tile_smem_bytes(const Tile &t)
{
    return (int64_t)(t.block_m + 2 * t.stages * t.block_n) * t.head_dim * 2;
}

/* Compile-time checks of every row: the kernel's static_asserts repeat them
 * for the instantiated ones, these catch a bad row even if no unit uses it. */
constexpr bool tile_ok(const Tile &t)
{
    return (t.head_dim == 32 || t.head_dim == 64 || t.head_dim == 96 || t.head_dim == 128 ||
            t.head_dim == 256) &&
           t.warps >= 1 && t.warps <= 8 && t.block_m % (16 * t.warps) == 0 &&
           (t.block_m / (16 * t.warps) == 1 || t.block_m / (16 * t.warps) == 2) &&
           t.block_n % 16 == 0 && t.block_n >= 16 && t.stages >= 2 && t.stages <= 4 &&
           t.ctas >= 1 && 32 * t.warps * t.ctas * 24 <= 65536 &&
           tile_smem_bytes(t) <= 227 * 1024 &&
           (t.arch_class != kClassSm86 || tile_smem_bytes(t) <= 99 * 1024) &&
           (t.arch_class != kClassSm80 || tile_smem_bytes(t) <= 163 * 1024);
}
constexpr bool all_tiles_ok(int i = 0)
{
    return i >= kNumTiles ? true : (tile_ok(kTiles[i]) && all_tiles_ok(i + 1));
}
static_assert(all_tiles_ok(), "a row of the sm80 tile table breaks a kernel or smem limit");

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_TILES_CUH */
