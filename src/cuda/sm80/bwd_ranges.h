/*
 * bwd_ranges.h -- which (query block, key block) pairs the sm80-class
 * backward visits, from both sides: the query blocks a key block's CTA
 * loops over, the key blocks that add into one query block's dQ (the
 * deterministic mode orders those adds), and whether a pair needs the
 * per-element mask.
 *
 * Key j is visible to query i (fc_key_visible) iff
 *     L <= j - i <= R,  L = diag - wl (wl < 0: none),  R = diag + wr (wr < 0:
 *     none),  diag = sk - sq,  0 <= i < sq,  0 <= j < sk.
 * A rectangle of rows [i0, i1] x keys [j0, j1] holds a visible pair iff
 * j1 - i0 >= L and j0 - i1 <= R: so the rows that see some key of
 * [j0, j1] are [j0 - R, j1 - L], the keys some row of [i0, i1] sees are
 * [i0 + L, i1 + R], and both sides give the same set of pairs.
 *
 * And the grid's order: which key block of which (batch, KV head) pair a
 * CTA index works on.
 *
 * Plain C on plain values, so that tests/test_bwd_ranges.c checks exactly
 * what the kernel runs against a brute-force walk of every pair.
 */
#ifndef FC_SM80_BWD_RANGES_H
#define FC_SM80_BWD_RANGES_H

#include <stdint.h>

#include "cuda/common/fastdiv.h"

#if defined(__CUDACC__)
#define FC_BWD_FN static __host__ __device__ __forceinline__
#else
#define FC_BWD_FN static inline
#endif

/* A half-open range of block indices; empty when lo >= hi. */
typedef struct fc_brange {
    int32_t lo, hi;
} fc_brange;

FC_BWD_FN int64_t fc_bwd_max64(int64_t a, int64_t b) { return a > b ? a : b; }
FC_BWD_FN int64_t fc_bwd_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The query blocks (bm rows each) whose rows see some key of key block n
 * (bn keys). */
FC_BWD_FN fc_brange fc_bwd_q_blocks(int32_t n, int32_t bn, int32_t bm, int32_t sq, int32_t sk, int32_t wl,
                                    int32_t wr)
{
    fc_brange r = {0, 0};
    const int64_t j0 = (int64_t)n * bn, j1 = fc_bwd_min64(j0 + bn, sk) - 1, diag = (int64_t)sk - sq;
    if (j0 > j1 || sq <= 0) return r;
    const int64_t i_lo = wr >= 0 ? fc_bwd_max64(0, j0 - diag - wr) : 0;
    const int64_t i_hi = wl >= 0 ? fc_bwd_min64((int64_t)sq - 1, j1 - diag + wl) : (int64_t)sq - 1;
    if (i_lo > i_hi) return r;
    r.lo = (int32_t)(i_lo / bm);
    r.hi = (int32_t)(i_hi / bm + 1);
    return r;
}

/* The key blocks some row of query block m sees. */
FC_BWD_FN fc_brange fc_bwd_kv_blocks(int32_t m, int32_t bm, int32_t bn, int32_t sq, int32_t sk, int32_t wl,
                                     int32_t wr)
{
    fc_brange r = {0, 0};
    const int64_t i0 = (int64_t)m * bm, i1 = fc_bwd_min64(i0 + bm, sq) - 1, diag = (int64_t)sk - sq;
    if (i0 > i1 || sk <= 0) return r;
    const int64_t j_lo = wl >= 0 ? fc_bwd_max64(0, i0 + diag - wl) : 0;
    const int64_t j_hi = wr >= 0 ? fc_bwd_min64((int64_t)sk - 1, i1 + diag + wr) : (int64_t)sk - 1;
    if (j_lo > j_hi) return r;
    r.lo = (int32_t)(j_lo / bn);
    r.hi = (int32_t)(j_hi / bn + 1);
    return r;
}

/* 1 if every pair of query block m x key block n is a visible pair inside
 * both sequences (no element needs the mask). */
FC_BWD_FN int fc_bwd_block_full(int32_t m, int32_t n, int32_t bm, int32_t bn, int32_t sq, int32_t sk, int32_t wl,
                                int32_t wr)
{
    const int64_t i0 = (int64_t)m * bm, i1 = i0 + bm - 1, j0 = (int64_t)n * bn, j1 = j0 + bn - 1;
    const int64_t diag = (int64_t)sk - sq;
    if (i1 >= sq || j1 >= sk) return 0;
    if (wl >= 0 && j0 - i1 < diag - wl) return 0;
    if (wr >= 0 && j1 - i0 > diag + wr) return 0;
    return 1;
}

/* The band's bounds on j - i as int32 (L, R above), clamped to what a pair
 * can reach (|j - i| < 2^31 - 1): the kernel's per-element test is then
 * lo <= j - i <= hi in 32 bits. */
FC_BWD_FN int32_t fc_bwd_band_lo(int32_t sq, int32_t sk, int32_t wl)
{
    return wl >= 0 ? (int32_t)fc_bwd_max64(-(int64_t)INT32_MAX, (int64_t)sk - sq - wl) : -INT32_MAX;
}
FC_BWD_FN int32_t fc_bwd_band_hi(int32_t sq, int32_t sk, int32_t wr)
{
    return wr >= 0 ? (int32_t)fc_bwd_min64((int64_t)INT32_MAX, (int64_t)sk - sq + wr) : INT32_MAX;
}

/* The per-element mask of a block that is not whole (fc_bwd_block_full):
 * a thread's first key j0 and query i0, the sequence lengths and the band
 * (fc_bwd_band_lo/hi). */
typedef struct fc_bwd_mask {
    int32_t j0, i0;
    int32_t sq, sk;
    int32_t lo, hi;
} fc_bwd_mask;

/* The mask of a thread's first key j0 and query i0 in a sequence of sq
 * queries and sk keys, the band from the windows. */
FC_BWD_FN fc_bwd_mask fc_bwd_mask_of(int32_t j0, int32_t i0, int32_t sq, int32_t sk, int32_t wl, int32_t wr)
{
    fc_bwd_mask m;
    m.j0 = j0;
    m.i0 = i0;
    m.sq = sq;
    m.sk = sk;
    m.lo = fc_bwd_band_lo(sq, sk, wl);
    m.hi = fc_bwd_band_hi(sq, sk, wr);
    return m;
}

/* 1 if key j and query i (j0, i0 plus the element's offsets) are no
 * visible pair: past either sequence or outside the band. */
FC_BWD_FN int fc_bwd_hidden(fc_bwd_mask m, int32_t j, int32_t i)
{
    const int32_t d = j - i;
    return i >= m.sq || j >= m.sk || d < m.lo || d > m.hi;
}

/* Key j's visible queries among a block's query offsets x = i - m.i0 in
 * [0, n): exactly lo <= x <= hi (fc_bwd_hidden's test as two bounds, for
 * kernels whose x is a compile-time offset; empty when lo > hi). */
typedef struct fc_bwd_qspan {
    int32_t lo, hi;
} fc_bwd_qspan;

FC_BWD_FN fc_bwd_qspan fc_bwd_visible_span(fc_bwd_mask m, int32_t j, int32_t n)
{
    const int64_t hi = j >= m.sk ? -1 : fc_bwd_min64((int64_t)m.sq - 1, (int64_t)j - m.lo) - m.i0;
    const int64_t lo = (int64_t)j - m.hi - m.i0;
    fc_bwd_qspan s;
    s.lo = (int32_t)fc_bwd_max64(0, fc_bwd_min64(lo, n));
    s.hi = (int32_t)fc_bwd_max64(-1, fc_bwd_min64(hi, (int64_t)n - 1));
    return s;
}

/* The first query block a CTA visits (of its range mr, query head 0),
 * and the block after (query head g of its group, query block m); *gn =
 * group: none. Downward (down; the deterministic mode and causal-like
 * masks): the query blocks from the last down, the group's heads
 * innermost. With causal masks every key block's range ends at the last
 * query block, so the CTAs of one (batch, KV head) meet each (g, m) at the
 * same step: the deterministic mode, which adds in key-block order, waits
 * once for its turn, not once per block, and the default mode's CTAs read
 * each block from L2 together. Otherwise each head's blocks upwards (the
 * downward walk measured 3% slower there). */
FC_BWD_FN int32_t fc_bwd_first_block(int down, fc_brange mr) { return down ? mr.hi - 1 : mr.lo; }
FC_BWD_FN void fc_bwd_next_block(int down, int32_t group, fc_brange mr, int32_t g, int32_t m, int32_t *gn,
                                 int32_t *mn)
{
    if (down) {
        const int step_g = g + 1 < group;
        *gn = step_g ? g + 1 : (m - 1 >= mr.lo ? 0 : group);
        *mn = step_g ? m : m - 1;
    } else {
        const int step_m = m + 1 < mr.hi;
        *gn = step_m ? g : g + 1;
        *mn = step_m ? m + 1 : mr.lo;
    }
}

/* The grid order (both backward paths; fc_bwd_tile_of): groups of
 * 2^grp_shift (batch, KV head) pairs, the pairs of a group innermost, then
 * its key blocks, then the groups.
 *   grp_shift 0, the plain order: a pair's key blocks run together,
 *     sharing its Q and dO in L2.
 *   Causal-like masks (key block n's work falls with n): the largest
 *     power of two that divides the pair count, at most FC_BWD_GROUP_PAIRS,
 *     so that the longest CTAs start first while a pair still has several
 *     CTAs in flight (on a 132-SM H100, about 132 / 16); as these walk
 *     their query blocks downward in step (fc_bwd_next_block), they read
 *     each block from L2 together. Key blocks outermost over all 128 pairs
 *     of s2k-d128-causal (one CTA per pair in flight) left 35% L2 hits and
 *     0.50x cuDNN; the plain order cost gqa-prefill (8 pairs, 256 CTAs,
 *     its longest CTA a whole SM's share) 15%.
 * Either way a lower key block of a pair has a lower index: the
 * deterministic mode's waits need that. */
typedef struct fc_bwd_order {
    fc_fastdiv n_blocks; /* key blocks per pair (of the longest sequence) */
    int32_t grp_shift;   /* log2 of the pairs per group                   */
} fc_bwd_order;

#define FC_BWD_GROUP_PAIRS 16

/* n_blocks * pairs CTAs (<= INT32_MAX, as the planners require);
 * causal_like: key block n's work falls with n. */
FC_BWD_FN fc_bwd_order fc_bwd_order_make(int32_t n_blocks, int32_t pairs, int causal_like)
{
    fc_bwd_order o;
    int sh = 0;
    while (causal_like && (2 << sh) <= FC_BWD_GROUP_PAIRS && pairs % (2 << sh) == 0) ++sh;
    o.n_blocks = fc_fastdiv_make(n_blocks);
    o.grp_shift = sh;
    return o;
}

/* CTA bid's key block *n and pair *pair: bid = ((group * n_blocks + n) <<
 * grp_shift) + the pair's place in its group. */
FC_BWD_FN void fc_bwd_tile_of(fc_bwd_order o, int32_t bid, int32_t *n, int32_t *pair)
{
    if (o.grp_shift == 0) { /* the same result; without the branch the sm80 kernel spilled */
        *pair = fc_fastdiv_div(bid, o.n_blocks);
        *n = bid - *pair * o.n_blocks.d;
        return;
    }
    const int32_t q = bid >> o.grp_shift, g = fc_fastdiv_div(q, o.n_blocks);
    *n = q - g * o.n_blocks.d;
    *pair = (g << o.grp_shift) + (bid & ((1 << o.grp_shift) - 1));
}

#undef FC_BWD_FN
#endif /* FC_SM80_BWD_RANGES_H */
