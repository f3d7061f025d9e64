/*
 * bwd_tiles.cuh -- the tile table of the sm80-class backward: one row per
 * (architecture class, head_dim). Plan, launch and the per-(dtype,
 * head_dim) translation units read it; nothing else names a backward tile.
 *
 * A CTA owns block_n keys of one (batch, KV head): each warp 16 of them,
 * whose dK and dV stay in registers (fp32) for the whole CTA. It loops
 * over the query blocks of block_m rows (and the query heads of its GQA
 * group) that see those keys, double-buffering Q, dO, lse and D.
 * Budgets a row must meet (bwd_shape.cuh for the kernel's shape):
 *  - registers per thread: dK + dV head_dim, S^T + dP^T sub_m (fp32, one
 *    pass of sub_m query rows at a time), plus ~60 more; 255 is the cap, no
 *    row may spill, and `ctas` CTAs must fit 64 K registers.
 *  - smem per CTA: bwd_smem_bytes (K and V, two Q and dO buffers, dS^T,
 *    lse and D), plus FC_SMEM_RESERVED_PER_CTA per CTA on the SM.
 *  - the dQ GEMM spreads block_m/16 row groups over the warps: warps must
 *    be a multiple of block_m/16, each warp's columns a multiple of 16.
 * Classes as in tiles.cuh: SM80 (164 KB smem per SM, 163 KB per block),
 * SM86 (100 KB, 99 KB), SM90 (228 KB, 227 KB).
 */
#ifndef FC_SM80_BWD_TILES_CUH
#define FC_SM80_BWD_TILES_CUH

#include <stdint.h>

#include "constants.h"
#include "cuda/sm80/tiles.cuh"

namespace fc {
namespace sm80 {

struct BwdTile {
    int arch_class;
    int head_dim;
    int block_m; /* query rows per inner iteration                          */
    int block_n; /* keys per CTA, 16 per warp                               */
    int warps;   /* = block_n / 16                                          */
    int ctas;    /* CTAs per SM the register use must allow                 */
    int sub_m;   /* query rows per S^T / dP^T pass (block_m, or a divisor that
                  * keeps the pass's accumulators in registers)              */
};

// clang-format off
constexpr BwdTile kBwdTiles[] = {
    /* ------------------------- SM80: 164 KB smem per SM ------------------------- */
    {kClassSm80,  32,  64,  64, 4, 2,  64}, /* 33 KB, two CTAs (8 warps of 128 keys spill at 128 regs)  */
    {kClassSm80,  64, 128, 128, 8, 1,  64}, /* 130 KB; passes of 64 rows: dK+dV 64 + S,dP 64 regs      */
    {kClassSm80,  96,  64, 128, 8, 1,  64}, /* 113 KB; dK+dV 96 + S,dP 64 regs                         */
    {kClassSm80, 128,  64, 128, 8, 1,  32}, /* FA2's d128 tile, 145 KB; passes of 32 rows (64 spill)    */

    /* ------------------ SM86/89: 100 KB smem per SM, 99 KB per block ------------------ */
    {kClassSm86,  32,  64,  64, 4, 2,  64}, /* = SM80                                                 */
    {kClassSm86,  64,  64, 128, 8, 1,  64}, /* 81 KB: SM80's 128-row blocks need 130 KB                */
    {kClassSm86,  96,  64,  64, 4, 1,  64}, /* 81 KB: 128 keys would need 113 KB                       */
    {kClassSm86, 128,  32,  64, 4, 1,  32}, /* 69 KB: 64x64 would need 105 KB                          */

    /* --------------- SM90 running mma.sync: 228 KB smem per SM, 227 KB per block --------------- */
    /* (H200, same runs: 64x128 in passes of 32 beat 32x128 by 8-15% at d128,
     * 128x128 in passes of 64 beat 64x128 by 9% at d64; 2 CTAs of 4 warps
     * lost 3-23% at both; docs/design-sm80.md lists the rest) */
    {kClassSm90,  32,  64,  64, 4, 2,  64}, /* = SM80                                                 */
    {kClassSm90,  64, 128, 128, 8, 1,  64}, /* = SM80                                                 */
    {kClassSm90,  96,  64, 128, 8, 1,  64}, /* = SM80                                                 */
    {kClassSm90, 128,  64, 128, 8, 1,  32}, /* = SM80                                                 */
};
// clang-format on

constexpr int kNumBwdTiles = (int)(sizeof(kBwdTiles) / sizeof(kBwdTiles[0]));

/* = BwdShape::SMEM_BYTES (bwd_launch.cuh checks they agree): K and V, two
 * buffers of Q and dO, dS^T, and two buffers of lse and D (fp32). */
constexpr int64_t bwd_smem_bytes(const BwdTile &t)
{
    return (int64_t)2 * t.block_n * t.head_dim * 2 + (int64_t)2 * 2 * t.block_m * t.head_dim * 2 +
           (int64_t)t.block_n * t.block_m * 2 + (int64_t)2 * 2 * t.block_m * 4;
}

constexpr bool same_bwd_kernel(const BwdTile &a, const BwdTile &b)
{
    return a.head_dim == b.head_dim && a.block_m == b.block_m && a.block_n == b.block_n && a.warps == b.warps &&
           a.ctas == b.ctas && a.sub_m == b.sub_m;
}

/* Compile-time checks of every row (the kernel's static_asserts repeat
 * them for the instantiated ones). */
constexpr bool bwd_tile_ok(const BwdTile &t)
{
    return (t.head_dim == 32 || t.head_dim == 64 || t.head_dim == 96 || t.head_dim == 128) &&
           t.block_n == 16 * t.warps && t.warps >= 1 && t.warps <= 8 && t.block_m % 16 == 0 &&
           t.block_m >= 16 && t.block_m <= t.block_n && t.warps % (t.block_m / 16) == 0 &&
           (t.head_dim / (t.warps / (t.block_m / 16))) % 16 == 0 && t.ctas >= 1 && t.sub_m % 16 == 0 &&
           t.sub_m >= 16 && t.block_m % t.sub_m == 0 &&
           32 * t.warps * t.ctas * 24 <= 65536 && bwd_smem_bytes(t) <= FC_SM90_SMEM_OPTIN &&
           (t.arch_class != kClassSm86 || bwd_smem_bytes(t) <= 99 * 1024) &&
           (t.arch_class != kClassSm80 || bwd_smem_bytes(t) <= 163 * 1024) &&
           t.ctas * (bwd_smem_bytes(t) + FC_SMEM_RESERVED_PER_CTA) <= class_sm_smem(t.arch_class);
}
constexpr bool all_bwd_tiles_ok(int i = 0)
{
    return i >= kNumBwdTiles ? true : (bwd_tile_ok(kBwdTiles[i]) && all_bwd_tiles_ok(i + 1));
}
static_assert(all_bwd_tiles_ok(), "a row of the sm80 backward tile table breaks a kernel or smem limit");

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_TILES_CUH */
