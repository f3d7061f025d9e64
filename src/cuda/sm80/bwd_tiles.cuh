/*
 * bwd_tiles.cuh -- the tile table of the sm80-class backward: one row per
 * (architecture class, head_dim). Plan, launch and the per-(dtype,
 * head_dim) translation units read it; nothing else names a backward tile.
 *
 * A CTA owns block_n keys of one (batch, KV head) and loops over the query
 * blocks of block_m rows (and the query heads of its GQA group) that see
 * them, double-buffering Q, dO, lse and D. Its warps tile each GEMM as
 * FlashAttention-2 does (bwd_shape.cuh):
 *  - S^T, dP^T (keys x queries): key_warps x (warps / key_warps) warps;
 *  - dK, dV (keys x head dim, fp32 in registers for the CTA's life): the
 *    same key_warps x (warps / key_warps) grid, so a warp's keys are the
 *    keys of its S^T tile; P^T and dS^T go through shared memory unless one
 *    warp holds all block_m queries of its keys (warps == key_warps);
 *  - dQ (queries x head dim): dq_warps x (warps / dq_warps).
 * Budgets a row must meet:
 *  - registers per thread: dK + dV (2 * block_n * head_dim / threads), S^T
 *    + dP^T (2 * block_n * block_m / threads), plus ~60 more; 255 is the
 *    cap, no row may spill, and `ctas` CTAs must fit 64 K registers.
 *  - smem per CTA: bwd_smem_bytes (K and V, two Q and dO buffers, dS^T and
 *    P^T, lse and D), plus FC_SMEM_RESERVED_PER_CTA per CTA on the SM.
 *  - every warp tile a whole number of 16 x 16 MMA steps.
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
    int block_n;   /* keys per CTA                                          */
    int warps;
    int ctas;      /* CTAs per SM the register use must allow               */
    int key_warps; /* warps along the keys of S^T, dP^T, dK and dV         */
    int dq_warps;  /* warps along the queries of dQ                        */
};

// clang-format off
constexpr BwdTile kBwdTiles[] = {
    /* ------------------------- SM80: 164 KB smem per SM ------------------------- */
    {kClassSm80,  32,  64,  64, 4, 2, 4, 4}, /* 33 KB, two CTAs; a warp holds all 64 queries of its 16 keys   */
    {kClassSm80,  64,  64, 128, 8, 1, 4, 4}, /* 97 KB; 128x128 (SM90's) spills 8-36 B at sm_80/86/89      */
    {kClassSm80,  96,  64, 128, 8, 1, 4, 4}, /* 129 KB; dK,dV 32x48; dQ 16x48 (24-column warps do not divide) */
    {kClassSm80, 128,  64, 128, 8, 1, 4, 2}, /* FA2's d128 tile, 161 KB; S^T 32x32, dK,dV 32x64, dQ 32x32     */
    {kClassSm80, 256,  32,  64, 8, 1, 4, 2}, /* 137 KB (64-row blocks: 209 KB); S^T 16x16, dK,dV 16x128         */

    /* ------------------ SM86/89: 100 KB smem per SM, 99 KB per block ------------------ */
    {kClassSm86,  32,  64,  64, 4, 2, 4, 4}, /* = SM80                                                        */
    {kClassSm86,  64,  64, 128, 8, 1, 4, 4}, /* = SM80 (128-row blocks need 162 KB)                          */
    {kClassSm86,  96,  64,  64, 4, 1, 4, 4}, /* 81 KB: 128 keys would need 129 KB                             */
    {kClassSm86, 128,  32,  64, 4, 1, 4, 2}, /* 69 KB: 64x64 would need 105 KB                                */
    /* no d256: K, V and two Q, dO buffers of 32 rows alone take 96 KB     */

    /* --------------- SM90 running mma.sync: 228 KB smem per SM, 227 KB per block --------------- */
    /* (H200, same runs: this warp layout beat one warp per 16 keys by 9-10%
     * at d128 and 6-9% at d64; in it 64x128 lost 11% to 128x128 at d64.
     * With one warp per 16 keys, 64x128 beat 32x128 by 8-15% at d128 and 2
     * CTAs of 4 warps lost 3-23%; docs/design-sm80.md lists the rest) */
    {kClassSm90,  32,  64,  64, 4, 2, 4, 4}, /* = SM80                                                        */
    {kClassSm90,  64, 128, 128, 8, 1, 4, 4}, /* FA2's d64 tile, 162 KB; S^T 32x64, dK,dV 32x32 a warp; +11%  */
    {kClassSm90,  96,  64, 128, 8, 1, 4, 4}, /* = SM80                                                        */
    {kClassSm90, 128,  64, 128, 8, 1, 4, 2}, /* = SM80                                                        */
    {kClassSm90, 256,  64,  64, 8, 1, 2, 2}, /* 209 KB, FA2's d256 tile; S^T 32x16, dK,dV 32x64, dQ 32x64; +3%  */
};
// clang-format on

constexpr int kNumBwdTiles = (int)(sizeof(kBwdTiles) / sizeof(kBwdTiles[0]));


/* = BwdShape::SMEM_BYTES (bwd_launch.cuh checks they agree): K and V, two
 * buffers of Q and dO, dS^T, P^T (only when the query columns of S^T are
 * split over warps), and two buffers of lse and D (fp32). */
constexpr int64_t bwd_smem_bytes(const BwdTile &t)
{
    return (int64_t)2 * t.block_n * t.head_dim * 2 + (int64_t)2 * 2 * t.block_m * t.head_dim * 2 +
           (int64_t)(t.warps > t.key_warps ? 2 : 1) * t.block_n * t.block_m * 2 + (int64_t)2 * 2 * t.block_m * 4;
}

constexpr bool same_bwd_kernel(const BwdTile &a, const BwdTile &b)
{
    return a.head_dim == b.head_dim && a.block_m == b.block_m && a.block_n == b.block_n && a.warps == b.warps &&
           a.ctas == b.ctas && a.key_warps == b.key_warps && a.dq_warps == b.dq_warps;
}

/* A row only the SM90 class has: its kernel compiles empty below sm_90
 * (bwd_kernel.cuh), as the forward's (tiles.cuh, tile_sm90_only). */
constexpr bool bwd_tile_sm90_only(const BwdTile &r, int i = 0)
{
    return r.arch_class != kClassSm90 ? false
           : i >= kNumBwdTiles        ? true
           : (kBwdTiles[i].arch_class != kClassSm90 && same_bwd_kernel(kBwdTiles[i], r)) ? false
                                                                                      : bwd_tile_sm90_only(r, i + 1);
}

/* Compile-time checks of every row (the kernel's static_asserts repeat
 * them for the instantiated ones). */
/* Warp tiles of whole 16 x 16 steps: S^T (block_n / kw keys x block_m /
 * (w / kw) queries), dK and dV (keys x head_dim / (w / kw)), dQ (block_m /
 * qw queries x head_dim / (w / qw)). */
constexpr bool bwd_warp_grid_ok(const BwdTile &t)
{
    const int kw = t.key_warps, qw = t.dq_warps;
    return kw >= 1 && t.warps % kw == 0 && t.block_n % (16 * kw) == 0 && t.block_m % (16 * (t.warps / kw)) == 0 &&
           t.head_dim % (16 * (t.warps / kw)) == 0 && qw >= 1 && t.warps % qw == 0 &&
           t.block_m % (16 * qw) == 0 && t.head_dim % (16 * (t.warps / qw)) == 0;
}

constexpr bool bwd_tile_ok(const BwdTile &t)
{
    return (t.head_dim == 32 || t.head_dim == 64 || t.head_dim == 96 || t.head_dim == 128 || t.head_dim == 256) &&
           t.warps >= 1 &&
           t.warps <= 8 && t.block_m >= 16 && t.block_m <= t.block_n && t.ctas >= 1 && bwd_warp_grid_ok(t) &&
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
