/*
 * tiled_kernels.h -- the inner loops of the tiled CPU path (src/cpu/tiled.c):
 * register-tiled score and P.V products, the online-softmax row update and a
 * vectorizable 2^x. Included by tiled.c only: first for the tile table, then
 * once per instruction-set variant (see tiled_item.h); the AVX2 variant takes
 * its two matrix products from tiled_avx2.h instead of the C below.
 *
 * Everything is plain C written as fixed-size loops over small arrays, so gcc
 * (-O3, no -ffast-math) keeps the accumulators in vector registers: each
 * accumulator sums in a fixed order, so nothing needs reassociation, and the
 * results do not depend on the vector width the compiler picks.
 */
#ifndef FC_CPU_TILED_KERNELS_H
#define FC_CPU_TILED_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_dtype.h"

/* Tile sizes: the one table. */
enum {
    TILE_M = 256,      /* packed query rows per work item: the Q and O scratch (TILE_M x head_dim)
                          stay in L2 (128 KiB each at d=128 fp32); each doubling halves the K/V
                          loads per query row (128 -> 256: +4-10% at s1k-d128, forward and
                          backward; 64 -> 128: ~5%); multiple of ROWS                         */
    TILE_N = 64,       /* keys per K/V block: K^T and V blocks are head_dim x TILE_N, in L1
                          together at d=64 (128 keys: -12% at d=128); multiple of VEC_W        */
    ROWS = 4,          /* query rows per register tile: ROWS x VEC_W fp32 accumulators = 8 SSE
                          registers of 16 (the AVX2 kernels: ROWS x 16 floats = 8 ymm of 16),
                          leaving room for the K/V vectors and the broadcasts                  */
    VEC_W = 8,         /* columns per fp32 register tile; head_dim is padded to a multiple     */
    VEC_W64 = 4,       /* columns per fp64 register tile: ROWS x 4 doubles = 8 SSE registers   */
    MAX_THREADS = 256, /* worker cap: each worker owns a scratch block (~350 KiB at d=128,
                          ~650 KiB for f32)                                                    */
};

#endif /* FC_CPU_TILED_KERNELS_H */

/* The kernels below are compiled once per instruction set: tiled_item.h
 * includes this header with FC_ISA(name) naming that variant, so there is
 * deliberately no include guard past this point (tiled.c includes this
 * header first without FC_ISA, for the tile table only). */
#ifdef FC_ISA

/* 2^x for x <= 0 (every call site passes a score minus a running max, or
 * NaN), to 2 ulp. Written without branches or float selects so the softmax
 * loop vectorizes (a libm call per score cost as much as both matrix
 * products at head_dim 64): gcc will not if-convert a float compare under
 * the default -ftrapping-math, so the underflow test is done on the bits.
 * x < -126 (incl. -inf) gives 0, which also keeps subnormals out; NaN stays
 * NaN. Not for x > 0. */
static inline float FC_ISA(exp2_le0)(float x)
{
    const float shift = 0x1.8p23f; /* x + shift holds round(x) in its low mantissa bits */
    const float t = x + shift;
    const float f = x - (t - shift);                              /* in [-0.5, 0.5], exact */
    const uint32_t n = fc_f32_to_bits(t) - fc_f32_to_bits(shift); /* round(x), two's complement */
    /* 2^f = sum (f ln2)^k / k!, k <= 7: truncation error < 6e-9 for |f| <= 0.5 */
    float p = 0x1.ffcbfcp-17f;
    p = p * f + 0x1.430912p-13f;
    p = p * f + 0x1.5d87fep-10f;
    p = p * f + 0x1.3b2ab6p-7f;
    p = p * f + 0x1.c6b08ep-5f;
    p = p * f + 0x1.ebfbe0p-3f;
    p = p * f + 0x1.62e430p-1f;
    p = p * f + 1.0f;
    const float r = p * fc_bits_to_f32((n + 127u) << 23); /* times 2^n */
    /* -inf <= x < -126 is the bit range (bits(-126), bits(-inf)]: one unsigned compare */
    const uint32_t u = fc_f32_to_bits(x);
    const uint32_t under = u - 0xc2fc0001u <= 0xff800000u - 0xc2fc0001u;
    return fc_bits_to_f32(fc_f32_to_bits(r) & (under - 1u));
}

/* An upper bound's worth of sum x[d]^2 (fp32 in 8 lanes: only compared
 * with F32_SCORE_BOUND; overflow gives inf, which asks for double). */
static inline double FC_ISA(norm2)(const float *x, int64_t n)
{
    float lane[8] = {0};
    int64_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) lane[l] += x[d + l] * x[d + l];
    for (int l = 0; d < n; d++, l++) lane[l] += x[d] * x[d];
    double s = 0.0;
    for (int l = 0; l < 8; l++) s += lane[l];
    return s * (1.0 + 0x1p-16); /* covers the fp32 sums' rounding */
}

/* sum_d x[d] y[d] as one element of scores_rows with scale 1 (the same
 * products, fused where the variant's are, in the same order): where y is
 * a column of scores_rows' second operand, the same bits. */
static inline float FC_ISA(dot_f32)(const float *x, const float *y, int64_t n)
{
    float s = 0.0f;
    for (int64_t d = 0; d < n; d++) {
#if defined(FC_ISA_AVX2)
        s = fmaf(x[d], y[d], s);
#else
        s += x[d] * y[d];
#endif
    }
    return s;
}

#if defined(FC_ISA_AVX2)
#include "tiled_avx2.h" /* scores_rows_avx2, scores_rows_f64_avx2 */
#if defined(FC_ISA_AVX512)
#include "tiled_avx512.h" /* scores_rows_avx512, scores_rows_f64_avx512 */
#endif
#if defined(FC_ISA_BF16)
#include "tiled_avx512bf16.h" /* the same named for its variant, scores_pairs_bf16 */
#endif
#else
/* ---- S = Q K^T ----------------------------------------------------------------
 * s[r][c] = scale * sum_d q[r][d] * kt[d][c] for ROWS rows and columns
 * c0 <= c < c1 (multiples of VEC_W). q rows have stride dp; kt and s rows
 * TILE_N. K is stored transposed so the inner loop runs over adjacent keys:
 * independent accumulators, no horizontal sums. The scale is applied after
 * the sum so that products of f16/bf16 inputs are exact in fp32. */
static inline void FC_ISA(scores_rows)(const float *restrict q, int64_t dp, const float *restrict kt,
                               float *restrict s, int c0, int c1, float scale)
{
    for (int c = c0; c < c1; c += VEC_W) {
        float acc[ROWS][VEC_W] = {{0}};
        for (int64_t d = 0; d < dp; d++) {
            const float *k = kt + d * TILE_N + c;
            for (int r = 0; r < ROWS; r++) {
                const float qr = q[r * dp + d];
                for (int x = 0; x < VEC_W; x++) acc[r][x] += qr * k[x];
            }
        }
        for (int r = 0; r < ROWS; r++)
            for (int x = 0; x < VEC_W; x++) s[r * TILE_N + c + x] = acc[r][x] * scale;
    }
}

/* The same in double, for f32 inputs: with fp32 scores a logit of magnitude
 * L carries an error near L * 2^-24 (1e-3 at L = 1e4), which moves the
 * softmax weights of near-tied keys by as much and breaks the fp32 gate;
 * double scores keep f32 outputs at fp32 accuracy for any logit size. */
static inline void FC_ISA(scores_rows_f64)(const double *restrict q, int64_t dp, const double *restrict kt,
                                   double *restrict s, int c0, int c1, double scale)
{
    for (int c = c0; c < c1; c += VEC_W64) {
        double acc[ROWS][VEC_W64] = {{0}};
        for (int64_t d = 0; d < dp; d++) {
            const double *k = kt + d * TILE_N + c;
            for (int r = 0; r < ROWS; r++) {
                const double qr = q[r * dp + d];
                for (int x = 0; x < VEC_W64; x++) acc[r][x] += qr * k[x];
            }
        }
        for (int r = 0; r < ROWS; r++)
            for (int x = 0; x < VEC_W64; x++) s[r * TILE_N + c + x] = acc[r][x] * scale;
    }
}
#endif /* FC_ISA_AVX2 */

/* ---- online softmax, one row over its visible part [a, e) of a block ----------
 * Step 1 (two variants by score precision): cap the scores, take the block
 * max, move the running max m to the new max, leave in w[j] - *sub the
 * shifted scores s[j] - m (<= 0, log2 units; fp32 scores: w = s, sub = m;
 * double ones: w = s - m rounded, sub = 0), and return alpha = 2^(m_old -
 * m_new), the factor the old sum and accumulator must be rescaled by (0 on the
 * first block, where m_old = -inf). The block max is taken in lanes: the max
 * of a set does not depend on the order, and a NaN score is skipped there but
 * surfaces through its own exponential. */

static inline float FC_ISA(shift_row)(float *restrict s, int a, int e, float cap, double *m, float *sub)
{
    if (cap > 0.0f) /* softcap: cap*tanh(scale*qk/softcap), cap in log2 units */
        for (int j = a; j < e; j++) s[j] = cap * tanhf(s[j]);
    float lane[VEC_W];
    for (int x = 0; x < VEC_W; x++) lane[x] = -INFINITY;
    int j = a;
#if defined(FC_ISA_AVX512)
    j = max_lanes_avx512(s, a, e, lane);
#endif
    for (; j + VEC_W <= e; j += VEC_W)
        for (int x = 0; x < VEC_W; x++) lane[x] = s[j + x] > lane[x] ? s[j + x] : lane[x];
    for (; j < e; j++) lane[0] = s[j] > lane[0] ? s[j] : lane[0];
    /* A max from a double-score block (shift_row_f64) is rounded here; that
     * moves weights only where its magnitude is large beside these logits
     * (<= F32_SCORE_BOUND), so where the weights of one side are 0. Past
     * the float range it is kept (m_old = mx = +inf: alpha 1). */
    const float m_old = (float)*m;
    float mx = m_old;
    for (int x = 0; x < VEC_W; x++) mx = lane[x] > mx ? lane[x] : mx;
    *sub = mx; /* finish_row takes it off (one pass over the row, not two) */
    if (mx == m_old) return 1.0f;
    *m = mx;
    return FC_ISA(exp2_le0)(m_old - mx);
}

static inline float FC_ISA(shift_row_f64)(double *restrict sd, float *restrict w, int a, int e, double cap,
                                  double *m, float *sub)
{
    if (cap > 0.0)
        for (int j = a; j < e; j++) sd[j] = cap * tanh(sd[j]);
    double lane[VEC_W64];
    for (int x = 0; x < VEC_W64; x++) lane[x] = -INFINITY;
    int j = a;
    for (; j + VEC_W64 <= e; j += VEC_W64)
        for (int x = 0; x < VEC_W64; x++) lane[x] = sd[j + x] > lane[x] ? sd[j + x] : lane[x];
    for (; j < e; j++) lane[0] = sd[j] > lane[0] ? sd[j] : lane[0];
    const double m_old = *m;
    double mx = m_old;
    for (int x = 0; x < VEC_W64; x++) mx = lane[x] > mx ? lane[x] : mx;
    for (j = a; j < e; j++) w[j] = (float)(sd[j] - mx); /* the difference is exact-ish, then rounded */
    *sub = 0.0f;
    if (mx == m_old) return 1.0f;
    *m = mx;
    return FC_ISA(exp2_le0)((float)(m_old - mx));
}

/* Step 2: weights p[j] = 2^(w[j] - sub) in place, their sum folded into l,
 * and the accumulator o rescaled by alpha. The sum runs in 8 lanes (lane
 * (j-a) mod 8) combined in a fixed tree: one order for any vector width, and
 * not one long dependent chain. */
static inline void FC_ISA(finish_row)(float *restrict w, int a, int e, float sub, float alpha, float *l,
                                      float *restrict o, int64_t dp)
{
    float lane[8] = {0};
    int j = a;
#if defined(FC_ISA_AVX512)
    j = exp2_sum_avx512(w, a, e, sub, lane);
#endif
#if defined(FC_ISA_AVX2)
    j = exp2_sum_avx2(w, j, e, sub, lane);
#else
    for (; j + 8 <= e; j += 8)
        for (int x = 0; x < 8; x++) {
            w[j + x] = FC_ISA(exp2_le0)(w[j + x] - sub);
            lane[x] += w[j + x];
        }
#endif
    for (int x = 0; j < e; j++, x++) {
        w[j] = FC_ISA(exp2_le0)(w[j] - sub);
        lane[x] += w[j];
    }
    const float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    *l = *l * alpha + sum;
    if (alpha != 1.0f)
        for (int64_t d = 0; d < dp; d++) o[d] *= alpha;
}

#if !defined(FC_ISA_AVX2) /* else pv_rows_avx2 from tiled_avx2.h */
/* ---- O += P V ------------------------------------------------------------------
 * o[r][:] += sum_{a <= j < e} pt[j][r] * v[j][:] for ROWS rows sharing [a, e).
 * pt is the probability block transposed ([TILE_N][ROWS]) so the ROWS weights
 * of one key are adjacent, which gcc turns into broadcasts from one load
 * (with row-major P it vectorized the j loop instead, with gathers). v and o
 * rows have stride dp. Per element this is the same sequence of operations
 * as pv_row, so either may serve a row. */
static inline void FC_ISA(pv_rows)(const float *restrict pt, const float *restrict v, int64_t dp,
                           float *restrict o, int a, int e)
{
    for (int64_t c = 0; c < dp; c += VEC_W) {
        float acc[ROWS][VEC_W];
        for (int r = 0; r < ROWS; r++)
            for (int x = 0; x < VEC_W; x++) acc[r][x] = o[r * dp + c + x];
        for (int j = a; j < e; j++) {
            const float *vj = v + j * dp + c;
            for (int r = 0; r < ROWS; r++) {
                const float p = pt[j * ROWS + r];
                for (int x = 0; x < VEC_W; x++) acc[r][x] += p * vj[x];
            }
        }
        for (int r = 0; r < ROWS; r++)
            for (int x = 0; x < VEC_W; x++) o[r * dp + c + x] = acc[r][x];
    }
}
#endif

/* One row of pv_rows alone (rows of a register tile whose ranges differ):
 * its weight of key j is p[j * ps] (the transposed tile: pt + r, ps = ROWS;
 * or the row itself, ps = 1). Per element the same operations as pv_rows. */
static inline void FC_ISA(pv_row)(const float *restrict p, int ps, const float *restrict v, int64_t dp,
                                  float *restrict o, int a, int e)
{
    for (int64_t c = 0; c < dp; c += VEC_W) {
        float acc[VEC_W];
        for (int x = 0; x < VEC_W; x++) acc[x] = o[c + x];
        for (int j = a; j < e; j++) {
            const float *vj = v + j * dp + c;
            const float pj = p[j * ps];
            for (int x = 0; x < VEC_W; x++) acc[x] += pj * vj[x];
        }
        for (int x = 0; x < VEC_W; x++) o[c + x] = acc[x];
    }
}

/* o[x][:] += sum_{a[x] <= j < e[x]} w[x][j] v[j][:] for the ROWS rows x of a
 * register tile: w rows TILE_N apart, v and o rows dp apart; a row with
 * a[x] >= e[x] is left alone. same: every row has row 0's range, so the
 * 4-row kernel serves all. pt: [TILE_N][ROWS] scratch for the transpose
 * the plain C kernel needs (the AVX2 one broadcasts from the rows). */
static inline void FC_ISA(wsum_rows)(const float *restrict w, const float *restrict v, int64_t dp,
                                     float *restrict o, const int *a, const int *e, int same, float *pt)
{
#if defined(FC_ISA_AVX2)
    (void)pt;
    if (same) {
#if defined(FC_ISA_AVX512)
        pv_rows_avx512(w, v, dp, o, a[0], e[0]);
#else
        pv_rows_avx2(w, v, dp, o, a[0], e[0], 0);
#endif
    } else {
        for (int x = 0; x < ROWS; x++)
            if (a[x] < e[x]) FC_ISA(pv_row)(w + x * TILE_N, 1, v, dp, o + x * dp, a[x], e[x]);
    }
#else
    for (int x = 0; x < ROWS; x++)
        for (int j = a[x]; j < e[x]; j++) pt[j * ROWS + x] = w[x * TILE_N + j];
    if (same) {
        FC_ISA(pv_rows)(pt, v, dp, o, a[0], e[0]);
    } else {
        for (int x = 0; x < ROWS; x++)
            if (a[x] < e[x]) FC_ISA(pv_row)(pt + x, ROWS, v, dp, o + x * dp, a[x], e[x]);
    }
#endif
}

/* dst = src^T for nr x nc elements, both multiples of 8 (src rows ss
 * apart, dst rows ds apart): moves only, the same bits in every variant. */
static inline void FC_ISA(transpose)(const float *restrict src, int64_t ss, int64_t nr, int64_t nc,
                                     float *restrict dst, int64_t ds)
{
    for (int64_t r = 0; r < nr; r += 8)
        for (int64_t c = 0; c < nc; c += 8) {
#if defined(FC_ISA_AVX2)
            transpose8_avx2(src + r * ss + c, ss, dst + c * ds + r, ds);
#else
            for (int x = 0; x < 8; x++)
                for (int y = 0; y < 8; y++) dst[(c + y) * ds + r + x] = src[(r + x) * ss + c + y];
#endif
        }
}

/* The block's rows [0, nb) (dp apart, their pad columns 0) as columns of
 * ft (rows TILE_N apart), with rows [nb, nb rounded up to VEC_W) zeroed
 * first: the last register tile reads those columns (the forward's K^T,
 * the backward's Q^T and dO^T). */
static inline void FC_ISA(rows_to_cols)(float *rows, int64_t dp, int nb, float *ft)
{
    const int nb_pad = (nb + VEC_W - 1) & ~(VEC_W - 1);
    memset(rows + nb * dp, 0, (size_t)((nb_pad - nb) * dp) * sizeof(float));
    FC_ISA(transpose)(rows, dp, nb_pad, dp, ft, TILE_N);
}

#endif /* FC_ISA */
