/*
 * tiled_avx512.h -- AVX-512 versions of the tiled CPU path's two matrix
 * products, for the avx512 variant only (tiled_variants.h; included from
 * tiled_kernels.h inside its target region, after tiled_avx2.h): the
 * whole tiles of tiled_simd.h at 512 bits (4 rows x 32 floats in 8 zmm
 * accumulators), the column remainders and every other loop the AVX2
 * variant's. Each output element is the same fused sum in the same order
 * as the AVX2 kernels', so the two variants agree bitwise.
 */
#ifndef FC_CPU_TILED_AVX512_H
#define FC_CPU_TILED_AVX512_H

/* Lanes 8..15 (AVX-512F only: no DQ extract). */
static inline __m256 upper8(__m512 x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }

#define SIMD_NAME(n) n##_avx512
#define SIMD_T float
#define SIMD_V __m512
#define SIMD_W 16
#define SIMD_ZERO _mm512_setzero_ps
#define SIMD_SET1 _mm512_set1_ps
#define SIMD_LOAD _mm512_loadu_ps
#define SIMD_STORE _mm512_storeu_ps
#define SIMD_FMA _mm512_fmadd_ps
#define SIMD_MUL _mm512_mul_ps
#define SIMD_EXP2 1
#define SIMD_ADD _mm512_add_ps
#define SIMD_SUB _mm512_sub_ps
#define SIMD_I __m512i
#define SIMD_AS_I _mm512_castps_si512
#define SIMD_AS_F _mm512_castsi512_ps
#define SIMD_ADD_I32 _mm512_add_epi32
#define SIMD_SUB_I32 _mm512_sub_epi32
#define SIMD_SLLI_I32 _mm512_slli_epi32
#define SIMD_SET1_I32 _mm512_set1_epi32
#define SIMD_ZERO_BELOW(x, lo, r) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_NLT_UQ), r)
/* the 8 lanes' sums, in j order: the low half, then the high */
#define SIMD_ADD8(acc, p) _mm256_add_ps(_mm256_add_ps(acc, _mm512_castps512_ps256(p)), upper8(p))
#include "tiled_simd.h" /* scores_tiles_avx512, pv_tiles_avx512, exp2_sum_avx512 */

/* s[r][c] = scale * sum_d q[r][d] kt[d][c], as scores_rows_avx2: tiles of
 * 32 columns, the rest by the AVX2 kernel. */
static inline void scores_rows_avx512(const float *restrict q, int64_t dp, const float *restrict kt,
                                      float *restrict s, int c0, int c1, float scale)
{
    const int c = scores_tiles_avx512(q, dp, kt, s, c0, c1, scale);
    if (c < c1) scores_rows_avx2(q, dp, kt, s, c, c1, scale);
}

#define SIMD_NAME(n) n##_f64_avx512
#define SIMD_T double
#define SIMD_V __m512d
#define SIMD_W 8
#define SIMD_ZERO _mm512_setzero_pd
#define SIMD_SET1 _mm512_set1_pd
#define SIMD_LOAD _mm512_loadu_pd
#define SIMD_STORE _mm512_storeu_pd
#define SIMD_FMA _mm512_fmadd_pd
#define SIMD_MUL _mm512_mul_pd
#include "tiled_simd.h" /* scores_tiles_f64_avx512 (its pv_tiles unused) */

/* Double scores (S for f32, dP for the f32 backward): tiles of 16
 * columns, a last 8 by the AVX2 kernel. */
static inline void scores_rows_f64_avx512(const double *restrict q, int64_t dp, const double *restrict kt,
                                          double *restrict s, int c0, int c1, double scale)
{
    const int c = scores_tiles_f64_avx512(q, dp, kt, s, c0, c1, scale);
    if (c < c1) scores_rows_f64_avx2(q, dp, kt, s, c, c1, scale);
}

/* o[r][:] += sum_{a <= j < e} p[r][j] v[j][:], as pv_rows_avx2: tiles of
 * 32 columns, the rest by the AVX2 kernel. */
static inline void pv_rows_avx512(const float *restrict pw, const float *restrict v, int64_t dp,
                                  float *restrict o, int a, int e)
{
    const int64_t c = pv_tiles_avx512(pw, v, dp, o, a, e, 0);
    if (c < dp) pv_rows_avx2(pw, v, dp, o, a, e, c);
}

/* The largest of s[a..e) and *lane's 8 values into lane[0..7] (any
 * order: a max does not depend on it), NaN scores skipped; returns the
 * first j not done. */
static inline int max_lanes_avx512(const float *s, int a, int e, float *lane)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    int j = a;
    for (; j + 16 <= e; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(s + j), m); /* NaN: m kept */
    const __m256 h = _mm256_max_ps(upper8(m), _mm512_castps512_ps256(m));
    _mm256_storeu_ps(lane, _mm256_max_ps(h, _mm256_loadu_ps(lane)));
    return j;
}

#endif /* FC_CPU_TILED_AVX512_H */
