/*
 * tiled_avx2.h -- AVX2 (with F16C and FMA) versions of the tiled CPU
 * path's hot loops, for the avx2 variant of tiled_item.h and
 * tiled_bwd_item.h only (included from tiled_kernels.h inside the
 * target("avx2,f16c,fma") region): the conversions in, 2^x with the row
 * sums, and the two matrix products.
 *
 * Why intrinsics: gcc's auto-vectorization of the plain C kernels under
 * AVX2 turned the fp32 score loop into shuffles and blends (5x slower than
 * SSE2). These spell out the register tile instead, wider than the C one:
 * ROWS x 16 floats (or x 8 doubles) = 8 ymm accumulators per step, so each
 * K^T / V vector loaded feeds 4 rows and each broadcast feeds 2 vectors.
 *
 * The same sums in the same order as the plain C, but each product-add
 * fused (one rounding instead of two): the variants differ in the last
 * bits, each repeats itself exactly.
 */
#ifndef FC_CPU_TILED_AVX2_H
#define FC_CPU_TILED_AVX2_H

#include <immintrin.h>

_Static_assert(ROWS == 4, "the AVX2 kernels hold a 4-row register tile");
_Static_assert(VEC_W == 8, "the AVX2 kernels step columns by 8 floats");

/* dst[x] = element off + x of src as float for x below n rounded down to 8,
 * for f16 (F16C), bf16 and f32 sources; returns how many were done (0 for
 * the others). Exact, the values of cpu_dtype.h's conversions (F16C quiets
 * a signalling NaN, which stays NaN). */
static inline int64_t widen_avx2(const void *src, int32_t dtype, int64_t off, int64_t n, float *dst)
{
    const int64_t n8 = n & ~(int64_t)7;
    if (dtype == FC_DTYPE_F16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t x = 0; x < n8; x += 8)
            _mm256_storeu_ps(dst + x, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + x))));
    } else if (dtype == FC_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t x = 0; x < n8; x += 8) {
            const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(s + x)));
            _mm256_storeu_ps(dst + x, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
    } else if (dtype == FC_DTYPE_F32) {
        const float *s = (const float *)src + off;
        for (int64_t x = 0; x < n8; x += 8) _mm256_storeu_ps(dst + x, _mm256_loadu_ps(s + x));
    } else {
        return 0;
    }
    return n8;
}

#define SIMD_NAME(n) n##_avx2
#define SIMD_T float
#define SIMD_V __m256
#define SIMD_W 8
#define SIMD_ZERO _mm256_setzero_ps
#define SIMD_SET1 _mm256_set1_ps
#define SIMD_LOAD _mm256_loadu_ps
#define SIMD_STORE _mm256_storeu_ps
#define SIMD_FMA _mm256_fmadd_ps
#define SIMD_MUL _mm256_mul_ps
#define SIMD_EXP2 1
#define SIMD_ADD _mm256_add_ps
#define SIMD_SUB _mm256_sub_ps
#define SIMD_I __m256i
#define SIMD_AS_I _mm256_castps_si256
#define SIMD_AS_F _mm256_castsi256_ps
#define SIMD_ADD_I32 _mm256_add_epi32
#define SIMD_SUB_I32 _mm256_sub_epi32
#define SIMD_SLLI_I32 _mm256_slli_epi32
#define SIMD_SET1_I32 _mm256_set1_epi32
#define SIMD_ZERO_BELOW(x, lo, r) _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(lo), _CMP_LT_OQ), r)
#define SIMD_ADD8 _mm256_add_ps
#include "tiled_simd.h" /* scores_tiles_avx2, pv_tiles_avx2, exp2_sum_avx2 */

/* s[r][c] = scale * sum_d q[r][d] kt[d][c], as scores_rows in tiled_kernels.h:
 * whole tiles of 16 columns, then a last group of 8. */
static inline void scores_rows_avx2(const float *restrict q, int64_t dp, const float *restrict kt,
                                    float *restrict s, int c0, int c1, float scale)
{
    const __m256 vs = _mm256_set1_ps(scale);
    const int c = scores_tiles_avx2(q, dp, kt, s, c0, c1, scale);
    if (c < c1) { /* one last group of 8 columns */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *k = kt + c;
        for (int64_t d = 0; d < dp; d++, k += TILE_N) {
            const __m256 k0 = _mm256_load_ps(k);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d), k0, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + dp + d), k0, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + 2 * dp + d), k0, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + 3 * dp + d), k0, a3);
        }
        float *o = s + c;
        _mm256_store_ps(o, _mm256_mul_ps(a0, vs));
        _mm256_store_ps(o + TILE_N, _mm256_mul_ps(a1, vs));
        _mm256_store_ps(o + 2 * TILE_N, _mm256_mul_ps(a2, vs));
        _mm256_store_ps(o + 3 * TILE_N, _mm256_mul_ps(a3, vs));
    }
}

#define SIMD_NAME(n) n##_f64_avx2
#define SIMD_T double
#define SIMD_V __m256d
#define SIMD_W 4
#define SIMD_ZERO _mm256_setzero_pd
#define SIMD_SET1 _mm256_set1_pd
#define SIMD_LOAD _mm256_loadu_pd
#define SIMD_STORE _mm256_storeu_pd
#define SIMD_FMA _mm256_fmadd_pd
#define SIMD_MUL _mm256_mul_pd
#include "tiled_simd.h" /* scores_tiles_f64_avx2 (its pv_tiles unused) */

/* The same in double (scores_rows_f64): c0, c1 are multiples of 8, one
 * tile's width, so whole tiles do every column. */
static inline void scores_rows_f64_avx2(const double *restrict q, int64_t dp, const double *restrict kt,
                                        double *restrict s, int c0, int c1, double scale)
{
    scores_tiles_f64_avx2(q, dp, kt, s, c0, c1, scale);
}

/* o[r][:] += sum_{a <= j < e} p[r][j] v[j][:], as pv_rows (tiled_kernels.h)
 * but with the weights read from the score rows: whole tiles of 16 columns
 * from c0, then a last group of 8 (dp is a multiple of 8). */
static inline void pv_rows_avx2(const float *restrict pw, const float *restrict v, int64_t dp,
                                float *restrict o, int a, int e, int64_t c0)
{
    const int64_t c = pv_tiles_avx2(pw, v, dp, o, a, e, c0);
    if (c < dp) {
        float *o0 = o + c, *o1 = o0 + dp, *o2 = o1 + dp, *o3 = o2 + dp;
        __m256 a0 = _mm256_loadu_ps(o0), a1 = _mm256_loadu_ps(o1);
        __m256 a2 = _mm256_loadu_ps(o2), a3 = _mm256_loadu_ps(o3);
        for (int j = a; j < e; j++) {
            const __m256 v0 = _mm256_loadu_ps(v + j * dp + c);
            const float *p = pw + j;
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p), v0, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + TILE_N), v0, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + 2 * TILE_N), v0, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + 3 * TILE_N), v0, a3);
        }
        _mm256_storeu_ps(o0, a0);
        _mm256_storeu_ps(o1, a1);
        _mm256_storeu_ps(o2, a2);
        _mm256_storeu_ps(o3, a3);
    }
}

/* The 8 x 8 block at src (rows ss apart) transposed into dst (rows ds
 * apart): unpacks within lanes, then 128-bit halves swapped. */
static inline void transpose8_avx2(const float *restrict src, int64_t ss, float *restrict dst, int64_t ds)
{
    __m256 r[8], t[8];
    for (int x = 0; x < 8; x++) r[x] = _mm256_loadu_ps(src + x * ss);
    for (int x = 0; x < 8; x += 2) {
        t[x] = _mm256_unpacklo_ps(r[x], r[x + 1]);
        t[x + 1] = _mm256_unpackhi_ps(r[x], r[x + 1]);
    }
    for (int x = 0; x < 8; x += 4) {
        r[x] = _mm256_shuffle_ps(t[x], t[x + 2], 0x44);
        r[x + 1] = _mm256_shuffle_ps(t[x], t[x + 2], 0xEE);
        r[x + 2] = _mm256_shuffle_ps(t[x + 1], t[x + 3], 0x44);
        r[x + 3] = _mm256_shuffle_ps(t[x + 1], t[x + 3], 0xEE);
    }
    for (int x = 0; x < 4; x++) {
        _mm256_storeu_ps(dst + x * ds, _mm256_permute2f128_ps(r[x], r[x + 4], 0x20));
        _mm256_storeu_ps(dst + (x + 4) * ds, _mm256_permute2f128_ps(r[x], r[x + 4], 0x31));
    }
}

#endif /* FC_CPU_TILED_AVX2_H */
