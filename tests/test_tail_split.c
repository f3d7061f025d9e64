/*
 * test_tail_split.c -- the Hopper path's tail-balancing partition
 * (src/cuda/sm90/tail_split.h, the functions the kernel calls) on the CPU,
 * over grids and tile counts the planner can choose and their edges: every
 * tail KV block belongs to exactly one CTA's part, a CTA has at most two
 * parts in consecutive tiles, the part slots are distinct and inside the
 * workspace (2 per CTA), a tile's parts come from consecutive CTAs starting
 * at fc_tail_first_cta, and a CTA holding a whole tile has no slot in it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/sm90/tail_split.h"
#include "test_util.h"

/* One check of a launch; a failed one ends the launch's checks (a broken
 * rule would repeat for every CTA after it). */
#define REQUIRE(cond, ...)                 \
    do {                                   \
        const int ok_ = (cond);            \
        CHECK(ok_, __VA_ARGS__);           \
        if (!ok_) goto done;               \
    } while (0)

/* One launch: `rest` tail tiles (0 < rest < grid) of nb KV blocks on `grid`
 * CTAs; every rule of the file comment, each as checks. */
static void check_split(int32_t grid, int32_t rest, int32_t nb)
{
    const int64_t blocks = (int64_t)rest * nb;
    const int32_t q = (int32_t)(blocks / grid), rem = (int32_t)(blocks % grid);
    const fc_fastdiv fg = fc_fastdiv_make(grid), fnb = fc_fastdiv_make(nb);
    /* owner[b]: the CTA whose part holds tail block b (-1: none yet);
     * slot_of[b]: that part's slot. Kept for up to 2^24 blocks; above, the
     * per-CTA checks alone (shares that partition [0, B), parts that
     * partition each share) still imply that every block has one part. */
    const int per_block = blocks <= ((int64_t)1 << 24);
    const size_t nown = per_block ? (size_t)blocks : 1;
    int32_t *owner = malloc(nown * sizeof *owner);
    int32_t *slot_of = malloc(nown * sizeof *slot_of);
    unsigned char *slot_used = calloc((size_t)2 * grid, 1);
    REQUIRE(owner && slot_of && slot_used, "grid %d rest %d nb %d: out of host memory", (int)grid, (int)rest, (int)nb);
    for (size_t b = 0; b < nown; ++b) owner[b] = -1;

    REQUIRE(fc_tail_lo(0, q, rem, fg) == 0, "lo(0) = %d", (int)fc_tail_lo(0, q, rem, fg));
    REQUIRE(fc_tail_lo(grid, q, rem, fg) == blocks, "lo(grid) = %d, want %lld", (int)fc_tail_lo(grid, q, rem, fg),
            (long long)blocks);
    for (int32_t c = 0; c < grid; ++c) {
        const int32_t lo = fc_tail_lo(c, q, rem, fg), hi = fc_tail_lo(c + 1, q, rem, fg);
        /* lo(c) = floor(c * B / G): an even deal, shares of q or q + 1 blocks */
        REQUIRE(lo == (int32_t)((int64_t)c * blocks / grid), "lo(%d) = %d", (int)c, (int)lo);
        REQUIRE(hi - lo == q || hi - lo == q + 1, "CTA %d share %d blocks (q %d)", (int)c, (int)(hi - lo), (int)q);
        int32_t covered = 0, last_tile = -1;
        for (int32_t j = 0; j < 3; ++j) {
            int32_t i = -1, n_lo = -1, n_hi = -1;
            if (!fc_tail_part(c, j, q, rem, fg, fnb, &i, &n_lo, &n_hi)) continue;
            REQUIRE(j <= 1, "CTA %d has a part %d", (int)c, (int)j);
            REQUIRE(i >= 0 && i < rest, "CTA %d part %d: tile %d of %d", (int)c, (int)j, (int)i, (int)rest);
            REQUIRE(n_lo >= 0 && n_lo < n_hi && n_hi <= nb, "CTA %d part %d: blocks [%d, %d)", (int)c, (int)j,
                    (int)n_lo, (int)n_hi);
            REQUIRE(last_tile < 0 || i == last_tile + 1, "CTA %d parts in tiles %d and %d", (int)c, (int)last_tile,
                    (int)i);
            last_tile = i;
            /* the part is the share's intersection with tile i */
            const int64_t b0 = (int64_t)i * nb + n_lo, b1 = (int64_t)i * nb + n_hi;
            REQUIRE(b0 >= lo && b1 <= hi, "CTA %d part %d: blocks %lld..%lld outside its share [%d, %d)", (int)c,
                    (int)j, (long long)b0, (long long)b1, (int)lo, (int)hi);
            const int32_t slot = fc_tail_slot(c, i, q, rem, fg, fnb);
            const int whole = n_lo == 0 && n_hi == nb;
            REQUIRE(whole == (slot < 0), "CTA %d tile %d: whole %d, slot %d", (int)c, (int)i, whole, (int)slot);
            REQUIRE(slot < 0 || slot == 2 * c + j, "CTA %d part %d: slot %d", (int)c, (int)j, (int)slot);
            if (slot >= 0 && slot < 2 * grid) {
                REQUIRE(!slot_used[slot], "slot %d used twice", (int)slot);
                slot_used[slot] = 1;
            }
            for (int64_t b = b0; per_block && b < b1 && b >= 0 && b < blocks; ++b) {
                REQUIRE(owner[b] < 0, "block %lld in CTAs %d and %d", (long long)b, (int)owner[b], (int)c);
                owner[b] = c;
                slot_of[b] = slot;
            }
            covered += n_hi - n_lo;
        }
        REQUIRE(covered == hi - lo, "CTA %d: parts cover %d of its %d blocks", (int)c, (int)covered, (int)(hi - lo));
    }
    for (int64_t b = 0; per_block && b < blocks; ++b) REQUIRE(owner[b] >= 0, "block %lld in no part", (long long)b);

    /* Per tile: its parts come from consecutive CTAs, the first of them is
     * fc_tail_first_cta, and a tile held whole by one CTA has no slot. */
    for (int32_t i = 0; per_block && i < rest; ++i) {
        const int64_t t0 = (int64_t)i * nb;
        const int32_t first = fc_tail_first_cta(i, q, rem, fg, fnb, grid);
        REQUIRE(first == owner[t0], "tile %d: first CTA %d, owner of its block 0 is %d", (int)i, (int)first,
                (int)owner[t0]);
        int32_t prev = owner[t0], parts = 1;
        for (int64_t b = t0 + 1; b < t0 + nb; ++b) {
            if (owner[b] == prev) continue;
            REQUIRE(owner[b] == prev + 1 || fc_tail_lo(prev + 1, q, rem, fg) == fc_tail_lo(owner[b], q, rem, fg),
                    "tile %d: CTA %d after CTA %d with non-empty shares between", (int)i, (int)owner[b], (int)prev);
            prev = owner[b];
            ++parts;
        }
        REQUIRE((parts == 1) == (slot_of[t0] < 0), "tile %d: %d parts, slot %d", (int)i, (int)parts,
                (int)slot_of[t0]);
    }
done:
    free(owner), free(slot_of), free(slot_used);
}

int main(void)
{
    int p0 = g_pass, f0 = g_fail;
    /* Small grids (the tests' sm90_grid), every rest and a range
     * of block counts, including shares shorter than one block (q = 0). */
    for (int32_t grid = 2; grid <= 24; ++grid)
        for (int32_t rest = 1; rest < grid; ++rest)
            for (int32_t nb = 1; nb <= 40; nb += (nb < 8 ? 1 : 7)) check_split(grid, rest, nb);
    /* H100/H200 grids (132, 264 with 2 CTAs per SM) with the benchmark
     * shapes' tails: s2k-d128 / s8k-d128 (2048 tiles, 16 / 64 blocks). */
    const int32_t grids[] = {114, 132, 144, 264};
    for (size_t g = 0; g < sizeof grids / sizeof grids[0]; ++g)
        for (int32_t rest = 1; rest < grids[g]; rest += 5)
            for (int32_t nb = 2; nb <= 128; nb *= 2) check_split(grids[g], rest, nb);
    check_split(132, 2048 % 132, 16);
    check_split(132, 2048 % 132, 64);
    /* The planner's limits: grid <= 32768 (c * rem < grid^2 < 2^30) and
     * rest * nb < 2^30; the largest values next to them. */
    check_split(32768, 32767, 2);
    check_split(32768, 1, 32767);
    check_split(32749, 32748, 31);
    check_split(4099, 4098, 262000); /* B = 1073676000 < 2^30 */
    group_done("tail_split", p0, f0);
    return test_summary();
}
