/*
 * test_mask_mode.c -- the planners' proof that a call's loops need no
 * mask code (src/cuda/common/mask_mode.h), checked against the visibility rule
 * itself (fc_key_visible, the reference's): random problems over the tile
 * shapes the kernels use (block_m 64/128/192, block_n 80/112/128, pack
 * shifts 0-3), every tile of each. For each tile the blocks it visits are
 * those holding a key some real row sees; a visited block is masked when
 * some real row does not see every key of it. NONE must leave no visited
 * block masked; FIRST at most the highest one (a tile's first in the
 * kernel's descending order). Runs on the CPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda/common/mask_mode.h"
#include "test_util.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static int rnd(int n) /* 0..n-1 */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)((rng >> 33) % (uint64_t)n);
}

/* Visible keys of position i: [lo, hi) (the band is an interval), from
 * fc_key_visible alone (a scan over the keys). */
static void row_interval(int i, int sq, int sk, int wl, int wr, int *lo, int *hi)
{
    *lo = sk;
    *hi = 0;
    for (int j = 0; j < sk; ++j)
        if (fc_key_visible(i, j, sq, sk, wl, wr)) {
            if (j < *lo) *lo = j;
            *hi = j + 1;
        }
}

/* 1 if the proof holds for every tile of the problem (prints the first tile
 * that breaks it). */
static int check_problem(int sq, int sk, int wl, int wr, int bm, int bn, int shift, int mode, int *lo, int *hi)
{
    for (int i = 0; i < sq; ++i) row_interval(i, sq, sk, wl, wr, &lo[i], &hi[i]);
    const int64_t rows = (int64_t)sq << shift;
    for (int64_t m0 = 0; m0 < rows; m0 += bm) {
        const int p0 = (int)(m0 >> shift);
        const int p1 = (int)(((m0 + bm < rows ? m0 + bm : rows) - 1) >> shift); /* last real position */
        int vis_lo = sk, vis_hi = 0;
        for (int i = p0; i <= p1; ++i)
            if (hi[i] > lo[i]) {
                if (lo[i] < vis_lo) vis_lo = lo[i];
                if (hi[i] > vis_hi) vis_hi = hi[i];
            }
        if (vis_hi <= vis_lo) continue; /* the tile sees no key: no block runs */
        const int n_lo = vis_lo / bn, n_hi = (vis_hi + bn - 1) / bn;
        for (int n = n_lo; n < n_hi; ++n) {
            int masked = 0;
            for (int i = p0; i <= p1 && !masked; ++i)
                masked = !(lo[i] <= n * bn && n * bn + bn <= hi[i]);
            if (masked && (mode == FC_MASKS_NONE || n != n_hi - 1)) {
                printf("FAIL mask mode %d: sq %d sk %d wl %d wr %d block %dx%d shift %d: tile row %lld, "
                       "block %d of [%d, %d) is masked\n",
                       mode, sq, sk, wl, wr, bm, bn, shift, (long long)m0, n, n_lo, n_hi);
                return 0;
            }
        }
    }
    return 1;
}

int main(void)
{
    int p0 = g_pass, f0 = g_fail;
    static int lo[1024], hi[1024];
    const int bms[] = {64, 128, 192}, bns[] = {80, 112, 128};
    int checked[3] = {0, 0, 0}, bad = 0;
    for (int it = 0; it < 8000 && !bad; ++it) {
        const int bm = bms[rnd(3)], bn = bns[rnd(3)], shift = rnd(4);
        if ((bm >> shift) < 1) continue;
        const int sk = rnd(4) ? bn * (1 + rnd(6)) : 1 + rnd(700);
        /* A third square (causal prefill), the rest any length (chunks, decode). */
        const int sq = rnd(3) == 0 && sk <= 1024 ? sk : 1 + rnd(400);
        const int wl = rnd(5) ? -1 : rnd(300);
        const int wr = rnd(3) == 0 ? -1 : (rnd(2) ? 0 : rnd(300));
        const fc_fwd_params p = {.seqlen_q = sq, .seqlen_k = sk, .window_left = wl, .window_right = wr};
        const int mode = fc_cuda_mask_mode(&p, bm, bn, shift);
        ++checked[mode];
        if (mode != FC_MASKS_ANY) bad += !check_problem(sq, sk, wl, wr, bm, bn, shift, mode, lo, hi);
    }
    CHECK(bad == 0, "a tile has a masked block its mask mode rules out");
    /* Enough of each proven mode, and of causal square shapes, to mean something. */
    CHECK(checked[FC_MASKS_NONE] > 500 && checked[FC_MASKS_FIRST] > 200,
          "too few proven cases: none %d, first %d, any %d", checked[0], checked[1], checked[2]);
    /* Named cases: a causal square call with 128-row tiles is FIRST; 192-row
     * tiles over 128-key blocks are not; softcap, a left window, a KV tail,
     * varlen and sq > sk (rows that see nothing) are ANY. */
    fc_fwd_params p;
    memset(&p, 0, sizeof p);
    p.seqlen_q = p.seqlen_k = 2048;
    p.window_left = -1;
    p.window_right = 0;
    CHECK(fc_cuda_mask_mode(&p, 128, 128, 0) == FC_MASKS_FIRST, "causal 2k, 128x128: FIRST");
    CHECK(fc_cuda_mask_mode(&p, 64, 128, 0) == FC_MASKS_FIRST, "causal 2k, 64x128: FIRST");
    CHECK(fc_cuda_mask_mode(&p, 128, 128, 2) == FC_MASKS_FIRST, "causal 2k, packed x4: FIRST");
    CHECK(fc_cuda_mask_mode(&p, 192, 128, 0) == FC_MASKS_ANY, "causal 2k, 192x128: ANY");
    p.window_right = -1;
    CHECK(fc_cuda_mask_mode(&p, 192, 128, 0) == FC_MASKS_NONE, "dense 2k: NONE");
    p.softcap = 30.0f;
    CHECK(fc_cuda_mask_mode(&p, 128, 128, 0) == FC_MASKS_ANY, "softcap: ANY");
    p.softcap = 0.0f;
    p.window_left = 256;
    CHECK(fc_cuda_mask_mode(&p, 128, 128, 0) == FC_MASKS_ANY, "left window: ANY");
    p.window_left = -1;
    p.seqlen_k = 2000;
    CHECK(fc_cuda_mask_mode(&p, 128, 128, 0) == FC_MASKS_ANY, "KV tail: ANY");
    p.seqlen_k = 2048;
    static const int32_t cu[2] = {0, 2048};
    p.cu_seqlens_k = cu;
    CHECK(fc_cuda_mask_mode(&p, 128, 128, 0) == FC_MASKS_ANY, "varlen: ANY");
    p.cu_seqlens_k = NULL;
    p.window_right = 0;
    p.seqlen_q = 4096;
    CHECK(fc_cuda_mask_mode(&p, 128, 128, 0) == FC_MASKS_ANY, "causal sq > sk: ANY");
    printf("cases: none %d, first %d, any %d\n", checked[0], checked[1], checked[2]);
    group_done("mask_mode", p0, f0);
    return test_summary();
}
