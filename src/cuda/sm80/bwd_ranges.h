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
 * Plain C on plain values, so that tests/test_bwd_ranges.c checks exactly
 * what the kernel runs against a brute-force walk of every pair.
 */
#ifndef FC_SM80_BWD_RANGES_H
#define FC_SM80_BWD_RANGES_H

#include <stdint.h>

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

/* 1 if key j and query i (j0, i0 plus the element's offsets) are no
 * visible pair: past either sequence or outside the band. */
FC_BWD_FN int fc_bwd_hidden(fc_bwd_mask m, int32_t j, int32_t i)
{
    const int32_t d = j - i;
    return i >= m.sq || j >= m.sk || d < m.lo || d > m.hi;
}

/* The first query block a CTA visits (of its range mr, query head 0),
 * and the block after (query head g of its group, query block m); *gn =
 * group: none. Deterministic (det): the query blocks from the last down,
 * the group's heads innermost. With causal masks every key block's range
 * ends at the last query block, so the CTAs of one (batch, KV head), which
 * add in key-block order, meet each (g, m) at the same step: a CTA waits
 * once for its turn, not once per block. Otherwise each head's blocks
 * upwards (the deterministic walk measured 3% slower there). */
FC_BWD_FN int32_t fc_bwd_first_block(int det, fc_brange mr) { return det ? mr.hi - 1 : mr.lo; }
FC_BWD_FN void fc_bwd_next_block(int det, int32_t group, fc_brange mr, int32_t g, int32_t m, int32_t *gn,
                                 int32_t *mn)
{
    if (det) {
        const int step_g = g + 1 < group;
        *gn = step_g ? g + 1 : (m - 1 >= mr.lo ? 0 : group);
        *mn = step_g ? m : m - 1;
    } else {
        const int step_m = m + 1 < mr.hi;
        *gn = step_m ? g : g + 1;
        *mn = step_m ? m + 1 : mr.lo;
    }
}

#undef FC_BWD_FN
#endif /* FC_SM80_BWD_RANGES_H */
