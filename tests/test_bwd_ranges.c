/*
 * test_bwd_ranges.c -- the CUDA backwards' block ranges
 * (src/cuda/sm80/bwd_ranges.h) against a brute-force walk of every
 * (query, key) pair through fc_key_visible, on the CPU:
 *  - a key block's query blocks (fc_bwd_q_blocks) and a query block's key
 *    blocks (fc_bwd_kv_blocks) are exactly the blocks holding a visible
 *    pair with it: the CTA loop visits every contribution, and the
 *    deterministic mode's turn count (the key blocks of a query block)
 *    matches the CTAs that really add into it;
 *  - fc_bwd_block_full holds exactly when every pair of the block is a
 *    visible pair inside both sequences (the mask may be skipped);
 *  - the band bounds fc_bwd_band_lo/hi give fc_key_visible's answer for
 *    every pair, and the kernels' per-element mask (fc_bwd_hidden) hides
 *    exactly the pairs that are not visible, past the sequences included,
 *    as do its per-key query spans (fc_bwd_visible_span);
 *  - the CTA's walk (fc_bwd_next_block from g = 0, m = hi - 1) visits every
 *    (query head, query block) of its range once and then stops;
 *  - the grid order (fc_bwd_tile_of) gives every (key block, pair) to
 *    exactly one CTA, a lower key block of a pair a lower CTA index (the
 *    deterministic mode's waits), the plain order without causal-like
 *    masks, and key blocks outermost inside each causal group.
 * Random lengths (0 included), windows, causal and block sizes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/sm80/bwd_ranges.h"
#include "internal.h"
#include "test_util.h"

/* splitmix64: this test links nothing of the library or the kit */
static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int in_range(fc_brange r, int x) { return x >= r.lo && x < r.hi; }

/* One configuration: every block pair and every element pair. Returns the
 * number of mismatches (printing the first few). */
static int check(int sq, int sk, int wl, int wr, int bm, int bn)
{
    const int mb = (sq + bm - 1) / bm, nb = (sk + bn - 1) / bn;
    const int lo = fc_bwd_band_lo(sq, sk, wl), hi = fc_bwd_band_hi(sq, sk, wr);
    int bad = 0;
    for (int m = 0; m < mb; m++)
        for (int n = 0; n < nb; n++) {
            int any = 0, all = 1;
            const fc_bwd_mask mk = fc_bwd_mask_of(n * bn, m * bm, sq, sk, wl, wr);
            for (int i = m * bm; i < (m + 1) * bm; i++)
                for (int j = n * bn; j < (n + 1) * bn; j++) {
                    const int inside = i < sq && j < sk;
                    const int vis = inside && fc_key_visible(i, j, sq, sk, wl, wr);
                    any |= vis;
                    all &= vis;
                    if (inside && vis != (j - i >= lo && j - i <= hi)) bad++;
                    if (fc_bwd_hidden(mk, j, i) != !vis) bad++;
                }
            /* the same mask as per-key spans of the block's query offsets */
            for (int j = n * bn; j < (n + 1) * bn; j++) {
                const fc_bwd_qspan sp = fc_bwd_visible_span(mk, j, bm);
                for (int x = 0; x < bm; x++)
                    if ((x >= sp.lo && x <= sp.hi) != !fc_bwd_hidden(mk, j, m * bm + x)) bad++;
            }
            const int q_ok = in_range(fc_bwd_q_blocks(n, bn, bm, sq, sk, wl, wr), m) == any;
            const int k_ok = in_range(fc_bwd_kv_blocks(m, bm, bn, sq, sk, wl, wr), n) == any;
            const int f_ok = fc_bwd_block_full(m, n, bm, bn, sq, sk, wl, wr) == all;
            if (!(q_ok && k_ok && f_ok) && bad++ < 3)
                printf("FAIL sq %d sk %d wl %d wr %d bm %d bn %d: block (%d, %d) visited %d q_blocks %d kv_blocks %d "
                       "full %d/%d\n",
                       sq, sk, wl, wr, bm, bn, m, n, any, q_ok, k_ok, fc_bwd_block_full(m, n, bm, bn, sq, sk, wl, wr),
                       all);
        }
    /* blocks past the ends are empty ranges */
    const fc_brange q_past = fc_bwd_q_blocks(nb, bn, bm, sq, sk, wl, wr);
    const fc_brange k_past = fc_bwd_kv_blocks(mb, bm, bn, sq, sk, wl, wr);
    if (q_past.hi > q_past.lo || k_past.hi > k_past.lo) bad++;
    return bad;
}

/* A CTA's walk over `group` heads x range r: 0 if it visits each pair
 * once, in order (det: heads innermost, blocks downwards; else blocks
 * upwards, heads outermost), and ends. */
static int check_walk(int det, int group, fc_brange r)
{
    const int nm = r.hi > r.lo ? r.hi - r.lo : 0;
    int32_t g = nm ? 0 : group, m = fc_bwd_first_block(det, r);
    for (int k = 0; k < group * nm; k++) {
        const int32_t gg = det ? k % group : k / nm, mm = det ? r.hi - 1 - k / group : r.lo + k % nm;
        if (g != gg || m != mm) return 1;
        fc_bwd_next_block(det, group, r, g, m, &g, &m);
    }
    return g == group ? 0 : 1;
}

/* Every CTA index of an order over nb key blocks x pairs: returns the
 * number of broken rules (printing the first). */
static int check_order(int nb, int pairs, int causal)
{
    const fc_bwd_order o = fc_bwd_order_make(nb, pairs, causal);
    const int g = 1 << o.grp_shift;
    /* the group: the largest power of two dividing pairs, at most FC_BWD_GROUP_PAIRS (causal), else 1 */
    int bad = pairs % g != 0 || (!causal && g != 1) || g > FC_BWD_GROUP_PAIRS ||
              (causal && 2 * g <= FC_BWD_GROUP_PAIRS && pairs % (2 * g) == 0);
    int *seen = calloc((size_t)nb * pairs, sizeof *seen), *last = malloc((size_t)pairs * sizeof *last);
    if (!seen || !last) {
        free(seen);
        free(last);
        return 1;
    }
    for (int p = 0; p < pairs; p++) last[p] = -1;
    for (int bid = 0; bid < nb * pairs; bid++) {
        int n, p;
        fc_bwd_tile_of(o, bid, &n, &p);
        if (n < 0 || n >= nb || p < 0 || p >= pairs || seen[(int64_t)p * nb + n]++ || n <= last[p]) {
            if (!bad++) printf("  order nb %d pairs %d causal %d: bid %d -> n %d pair %d\n", nb, pairs, causal, bid, n, p);
            continue;
        }
        last[p] = n;
        /* plain: bid = pair * nb + n; grouped: key blocks outside the group's pairs */
        const int want = (p / g) * g * nb + n * g + p % g;
        if (bid != want && !bad++) printf("  order nb %d pairs %d grp %d: bid %d -> n %d pair %d\n", nb, pairs, g, bid, n, p);
    }
    free(seen);
    free(last);
    return bad;
}

int main(void)
{
    uint64_t rng = 12345;
    static const int bms[] = {16, 32, 64, 128}, bns[] = {16, 64, 128};
    const int p0 = g_pass, f0 = g_fail;
    for (int t = 0; t < 3000; t++) {
        const int sq = (int)(next(&rng) % 300), sk = (int)(next(&rng) % 300);
        const int kind = (int)(next(&rng) % 4);
        int wl = -1, wr = -1;
        if (kind == 1) wr = 0;                                   /* causal */
        if (kind == 2) { wl = (int)(next(&rng) % 200); wr = 0; } /* causal + left window */
        if (kind == 3) {
            wl = (int)(next(&rng) % 3) ? (int)(next(&rng) % 200) : -1;
            wr = (int)(next(&rng) % 3) ? (int)(next(&rng) % 200) : -1;
        }
        const int bm = bms[next(&rng) % 4], bn = bns[next(&rng) % 3];
        const int bad = check(sq, sk, wl, wr, bm, bn);
        CHECK(bad == 0, "sq %d sk %d wl %d wr %d bm %d bn %d: %d mismatches", sq, sk, wl, wr, bm, bn, bad);
        const int group = 1 + (int)(next(&rng) % 4), n = sk > 0 ? (int)(next(&rng) % ((sk + bn - 1) / bn)) : 0;
        const fc_brange r = fc_bwd_q_blocks(n, bn, bm, sq, sk, wl, wr);
        CHECK(check_walk(0, group, r) == 0 && check_walk(1, group, r) == 0, "walk: group %d blocks [%d, %d)", group,
              r.lo, r.hi);
    }
    /* windows far wider than the sequences (the int32 clamps) */
    CHECK(check(100, 90, 2147483000, 2147483000, 64, 64) == 0, "huge windows");
    CHECK(check(90, 100, 0, 2147483000, 32, 128) == 0, "huge right window");
    for (int t = 0; t < 400; t++) {
        const int nb = 1 + (int)(next(&rng) % 70), pairs = 1 + (int)(next(&rng) % 200);
        const int causal = (int)(next(&rng) % 2);
        CHECK(check_order(nb, pairs, causal) == 0, "order: nb %d pairs %d causal %d", nb, pairs, causal);
    }
    /* s2k-d128-causal's 128 pairs: groups of 16; gqa-prefill's 8: one group; 13 pairs: groups of one */
    CHECK(fc_bwd_order_make(16, 128, 1).grp_shift == 4 && fc_bwd_order_make(32, 8, 1).grp_shift == 3 &&
              fc_bwd_order_make(16, 13, 1).grp_shift == 0 && fc_bwd_order_make(16, 128, 0).grp_shift == 0,
          "group sizes");
    group_done("bwd block ranges", p0, f0);
    return test_summary();
}
