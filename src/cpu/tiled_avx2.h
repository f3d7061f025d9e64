/*
 * tiled_avx2.h -- AVX2 versions of the two matrix products of the tiled CPU
 * path, for the avx2 variant of tiled_item.h only (included from
 * tiled_kernels.h inside tiled.c's target("avx2") region).
 *
 * Why intrinsics: gcc's auto-vectorization of the plain C kernels under
 * AVX2 turned the fp32 score loop into shuffles and blends (5x slower than
 * SSE2). These spell out the register tile instead, wider than the C one:
 * ROWS x 16 floats (or x 8 doubles) = 8 ymm accumulators per step, so each
 * K^T / V vector loaded feeds 4 rows and each broadcast feeds 2 vectors.
 *
 * Same results as the plain C, bit for bit: every output element is one
 * accumulator summed over d (or j) in the same order, by a multiply then an
 * add (no fma: the variant is built without it, so the C cannot contract
 * either), and the scale is applied after the sum.
 */
#ifndef FC_CPU_TILED_AVX2_H
#define FC_CPU_TILED_AVX2_H

#include <immintrin.h>

_Static_assert(ROWS == 4, "the AVX2 kernels hold a 4-row register tile");
_Static_assert(VEC_W == 8, "the AVX2 kernels step columns by 8 floats");

/* s[r][c] = scale * sum_d q[r][d] kt[d][c], as scores_rows in tiled_kernels.h. */
static inline void scores_rows_avx2(const float *restrict q, int64_t dp, const float *restrict kt,
                                    float *restrict s, int c0, int c1, float scale)
{
    const __m256 vs = _mm256_set1_ps(scale);
    int c = c0;
    for (; c + 16 <= c1; c += 16) {
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        const float *k = kt + c;
        for (int64_t d = 0; d < dp; d++, k += TILE_N) {
            const __m256 k0 = _mm256_load_ps(k), k1 = _mm256_load_ps(k + 8);
            __m256 b = _mm256_broadcast_ss(q + d);
            a00 = _mm256_add_ps(a00, _mm256_mul_ps(b, k0));
            a01 = _mm256_add_ps(a01, _mm256_mul_ps(b, k1));
            b = _mm256_broadcast_ss(q + dp + d);
            a10 = _mm256_add_ps(a10, _mm256_mul_ps(b, k0));
            a11 = _mm256_add_ps(a11, _mm256_mul_ps(b, k1));
            b = _mm256_broadcast_ss(q + 2 * dp + d);
            a20 = _mm256_add_ps(a20, _mm256_mul_ps(b, k0));
            a21 = _mm256_add_ps(a21, _mm256_mul_ps(b, k1));
            b = _mm256_broadcast_ss(q + 3 * dp + d);
            a30 = _mm256_add_ps(a30, _mm256_mul_ps(b, k0));
            a31 = _mm256_add_ps(a31, _mm256_mul_ps(b, k1));
        }
        float *o = s + c;
        _mm256_store_ps(o, _mm256_mul_ps(a00, vs));
        _mm256_store_ps(o + 8, _mm256_mul_ps(a01, vs));
        _mm256_store_ps(o + TILE_N, _mm256_mul_ps(a10, vs));
        _mm256_store_ps(o + TILE_N + 8, _mm256_mul_ps(a11, vs));
        _mm256_store_ps(o + 2 * TILE_N, _mm256_mul_ps(a20, vs));
        _mm256_store_ps(o + 2 * TILE_N + 8, _mm256_mul_ps(a21, vs));
        _mm256_store_ps(o + 3 * TILE_N, _mm256_mul_ps(a30, vs));
        _mm256_store_ps(o + 3 * TILE_N + 8, _mm256_mul_ps(a31, vs));
    }
    if (c < c1) { /* one last group of 8 columns */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *k = kt + c;
        for (int64_t d = 0; d < dp; d++, k += TILE_N) {
            const __m256 k0 = _mm256_load_ps(k);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_broadcast_ss(q + d), k0));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_broadcast_ss(q + dp + d), k0));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_broadcast_ss(q + 2 * dp + d), k0));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_broadcast_ss(q + 3 * dp + d), k0));
        }
        float *o = s + c;
        _mm256_store_ps(o, _mm256_mul_ps(a0, vs));
        _mm256_store_ps(o + TILE_N, _mm256_mul_ps(a1, vs));
        _mm256_store_ps(o + 2 * TILE_N, _mm256_mul_ps(a2, vs));
        _mm256_store_ps(o + 3 * TILE_N, _mm256_mul_ps(a3, vs));
    }
}

/* The same in double (scores_rows_f64): c0, c1 are multiples of 8, so the
 * columns go 8 doubles (two vectors) at a time with no remainder. */
static inline void scores_rows_f64_avx2(const double *restrict q, int64_t dp, const double *restrict kt,
                                        double *restrict s, int c0, int c1, double scale)
{
    const __m256d vs = _mm256_set1_pd(scale);
    for (int c = c0; c < c1; c += 8) {
        __m256d a00 = _mm256_setzero_pd(), a01 = a00, a10 = a00, a11 = a00;
        __m256d a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        const double *k = kt + c;
        for (int64_t d = 0; d < dp; d++, k += TILE_N) {
            const __m256d k0 = _mm256_load_pd(k), k1 = _mm256_load_pd(k + 4);
            __m256d b = _mm256_broadcast_sd(q + d);
            a00 = _mm256_add_pd(a00, _mm256_mul_pd(b, k0));
            a01 = _mm256_add_pd(a01, _mm256_mul_pd(b, k1));
            b = _mm256_broadcast_sd(q + dp + d);
            a10 = _mm256_add_pd(a10, _mm256_mul_pd(b, k0));
            a11 = _mm256_add_pd(a11, _mm256_mul_pd(b, k1));
            b = _mm256_broadcast_sd(q + 2 * dp + d);
            a20 = _mm256_add_pd(a20, _mm256_mul_pd(b, k0));
            a21 = _mm256_add_pd(a21, _mm256_mul_pd(b, k1));
            b = _mm256_broadcast_sd(q + 3 * dp + d);
            a30 = _mm256_add_pd(a30, _mm256_mul_pd(b, k0));
            a31 = _mm256_add_pd(a31, _mm256_mul_pd(b, k1));
        }
        double *o = s + c;
        _mm256_store_pd(o, _mm256_mul_pd(a00, vs));
        _mm256_store_pd(o + 4, _mm256_mul_pd(a01, vs));
        _mm256_store_pd(o + TILE_N, _mm256_mul_pd(a10, vs));
        _mm256_store_pd(o + TILE_N + 4, _mm256_mul_pd(a11, vs));
        _mm256_store_pd(o + 2 * TILE_N, _mm256_mul_pd(a20, vs));
        _mm256_store_pd(o + 2 * TILE_N + 4, _mm256_mul_pd(a21, vs));
        _mm256_store_pd(o + 3 * TILE_N, _mm256_mul_pd(a30, vs));
        _mm256_store_pd(o + 3 * TILE_N + 4, _mm256_mul_pd(a31, vs));
    }
}

/* o[r][:] += sum_{a <= j < e} p[r][j] v[j][:], as pv_rows but with the
 * weights read from the rows themselves (p: the score tile, rows TILE_N
 * apart; broadcasts need no transpose). 16 columns of the
 * 4 rows per pass over the keys, then a last group of 8 (dp is a multiple
 * of 8). o rows are 64-byte aligned only when dp is a multiple of 16: loadu. */
static inline void pv_rows_avx2(const float *restrict pw, const float *restrict v, int64_t dp,
                                float *restrict o, int a, int e)
{
    int64_t c = 0;
    for (; c + 16 <= dp; c += 16) {
        float *o0 = o + c, *o1 = o0 + dp, *o2 = o1 + dp, *o3 = o2 + dp;
        __m256 a00 = _mm256_loadu_ps(o0), a01 = _mm256_loadu_ps(o0 + 8);
        __m256 a10 = _mm256_loadu_ps(o1), a11 = _mm256_loadu_ps(o1 + 8);
        __m256 a20 = _mm256_loadu_ps(o2), a21 = _mm256_loadu_ps(o2 + 8);
        __m256 a30 = _mm256_loadu_ps(o3), a31 = _mm256_loadu_ps(o3 + 8);
        for (int j = a; j < e; j++) {
            const float *vj = v + j * dp + c, *p = pw + j;
            const __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
            __m256 b = _mm256_broadcast_ss(p);
            a00 = _mm256_add_ps(a00, _mm256_mul_ps(b, v0));
            a01 = _mm256_add_ps(a01, _mm256_mul_ps(b, v1));
            b = _mm256_broadcast_ss(p + TILE_N);
            a10 = _mm256_add_ps(a10, _mm256_mul_ps(b, v0));
            a11 = _mm256_add_ps(a11, _mm256_mul_ps(b, v1));
            b = _mm256_broadcast_ss(p + 2 * TILE_N);
            a20 = _mm256_add_ps(a20, _mm256_mul_ps(b, v0));
            a21 = _mm256_add_ps(a21, _mm256_mul_ps(b, v1));
            b = _mm256_broadcast_ss(p + 3 * TILE_N);
            a30 = _mm256_add_ps(a30, _mm256_mul_ps(b, v0));
            a31 = _mm256_add_ps(a31, _mm256_mul_ps(b, v1));
        }
        _mm256_storeu_ps(o0, a00);
        _mm256_storeu_ps(o0 + 8, a01);
        _mm256_storeu_ps(o1, a10);
        _mm256_storeu_ps(o1 + 8, a11);
        _mm256_storeu_ps(o2, a20);
        _mm256_storeu_ps(o2 + 8, a21);
        _mm256_storeu_ps(o3, a30);
        _mm256_storeu_ps(o3 + 8, a31);
    }
    if (c < dp) {
        float *o0 = o + c, *o1 = o0 + dp, *o2 = o1 + dp, *o3 = o2 + dp;
        __m256 a0 = _mm256_loadu_ps(o0), a1 = _mm256_loadu_ps(o1);
        __m256 a2 = _mm256_loadu_ps(o2), a3 = _mm256_loadu_ps(o3);
        for (int j = a; j < e; j++) {
            const __m256 v0 = _mm256_loadu_ps(v + j * dp + c);
            const float *p = pw + j;
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_broadcast_ss(p), v0));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_broadcast_ss(p + TILE_N), v0));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_broadcast_ss(p + 2 * TILE_N), v0));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_broadcast_ss(p + 3 * TILE_N), v0));
        }
        _mm256_storeu_ps(o0, a0);
        _mm256_storeu_ps(o1, a1);
        _mm256_storeu_ps(o2, a2);
        _mm256_storeu_ps(o3, a3);
    }
}

#endif /* FC_CPU_TILED_AVX2_H */
