/*
 * tiled_avx512bf16.h -- the avx512bf16 variant's kernels (tiled_variants.h;
 * included from tiled_kernels.h inside its target region, after
 * tiled_avx512.h): the AVX-512 variant's products under this variant's
 * names, and the score product of bf16 operands by vdpbf16ps.
 *
 * Scores of bf16 inputs: each pair of products q[2p] k[2p] + q[2p+1]
 * k[2p+1] is exact in fp32 (8-bit significands) and added to an fp32
 * accumulator, as the fp32 kernels add one product at a time: the same
 * accuracy, another order of the adds (so this variant's bits are its
 * own), at twice the products per instruction. The instruction treats
 * subnormal inputs and results as zero (bf16 subnormals are below 1.2e-38).
 * Operands are packed as pairs of bf16 in a 32-bit word: rows [n][dp / 2],
 * blocks [dp / 2][TILE_N] (pair p of column c at p * TILE_N + c).
 */
#ifndef FC_CPU_TILED_AVX512BF16_H
#define FC_CPU_TILED_AVX512BF16_H

#include <string.h>

static inline void scores_rows_avx512bf16(const float *restrict q, int64_t dp, const float *restrict kt,
                                          float *restrict s, int c0, int c1, float scale)
{
    scores_rows_avx512(q, dp, kt, s, c0, c1, scale);
}

static inline void scores_rows_f64_avx512bf16(const double *restrict q, int64_t dp, const double *restrict kt,
                                              double *restrict s, int c0, int c1, double scale)
{
    scores_rows_f64_avx512(q, dp, kt, s, c0, c1, scale);
}

/* The bf16 bits of x, which holds a bf16 value (exact). */
static inline uint32_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u >> 16;
}

/* n rows of dp floats (bf16 values) as rows of dp / 2 pairs. */
static inline void pack_rows_bf16(const float *restrict src, int64_t dp, int n, uint32_t *restrict dst)
{
    for (int r = 0; r < n; r++)
        for (int64_t p = 0; p < dp / 2; p++)
            dst[r * (dp / 2) + p] = bf16_bits(src[r * dp + 2 * p]) | bf16_bits(src[r * dp + 2 * p + 1]) << 16;
}

/* A transposed block [dp][TILE_N] (bf16 values), columns [0, nb), as
 * [dp / 2][TILE_N] pairs. */
static inline void pack_block_bf16(const float *restrict bt, int64_t dp, int nb, uint32_t *restrict dst)
{
    for (int64_t p = 0; p < dp / 2; p++)
        for (int c = 0; c < nb; c++)
            dst[p * TILE_N + c] = bf16_bits(bt[2 * p * TILE_N + c]) | bf16_bits(bt[(2 * p + 1) * TILE_N + c]) << 16;
}

/* sum_d x[d] y[d] over dp / 2 pairs (bf16 values; zero past D) in the
 * order and rounding scores_pairs_bf16 gives each element: the backward's
 * D = rowsum(dO * O) must equal dP = dO . V bitwise where O = V (one
 * visible key), so that dP - D is exactly 0 there. */
static inline float dot_pairs_bf16(const float *restrict x, const float *restrict y, int64_t D, int64_t dp)
{
    __m128 acc = _mm_setzero_ps();
    for (int64_t p = 0; p < dp / 2; p++) {
        const float x0 = 2 * p < D ? x[2 * p] : 0.0f, x1 = 2 * p + 1 < D ? x[2 * p + 1] : 0.0f;
        const float y0 = 2 * p < D ? y[2 * p] : 0.0f, y1 = 2 * p + 1 < D ? y[2 * p + 1] : 0.0f;
        const int xp = (int)(bf16_bits(x0) | bf16_bits(x1) << 16), yp = (int)(bf16_bits(y0) | bf16_bits(y1) << 16);
        acc = _mm_dpbf16_ps(acc, (__m128bh)_mm_set1_epi32(xp), (__m128bh)_mm_set1_epi32(yp));
    }
    return _mm_cvtss_f32(acc);
}

/* s[r][c] = scale * sum_d q[r][d] kt[d][c] for ROWS rows and columns c0
 * <= c < c1 (multiples of VEC_W), from packed pairs (q rows dh = dp / 2
 * apart): tiles of 32 columns (8 zmm accumulators), then 16, then 8. */
static inline void scores_pairs_bf16(const uint32_t *restrict q, int64_t dh, const uint32_t *restrict kt,
                                     float *restrict s, int c0, int c1, float scale)
{
    int c = c0;
    const __m512 vs = _mm512_set1_ps(scale);
    for (; c + 32 <= c1; c += 32) {
        __m512 a[ROWS][2];
        for (int r = 0; r < ROWS; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
        for (int64_t p = 0; p < dh; p++) {
            const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kt + p * TILE_N + c);
            const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kt + p * TILE_N + c + 16);
            for (int r = 0; r < ROWS; r++) {
                const __m512bh qr = (__m512bh)_mm512_set1_epi32((int)q[r * dh + p]);
                a[r][0] = _mm512_dpbf16_ps(a[r][0], qr, k0);
                a[r][1] = _mm512_dpbf16_ps(a[r][1], qr, k1);
            }
        }
        for (int r = 0; r < ROWS; r++) {
            _mm512_storeu_ps(s + r * TILE_N + c, _mm512_mul_ps(a[r][0], vs));
            _mm512_storeu_ps(s + r * TILE_N + c + 16, _mm512_mul_ps(a[r][1], vs));
        }
    }
    for (; c < c1; c += 8) {
        __m256 a[ROWS];
        for (int r = 0; r < ROWS; r++) a[r] = _mm256_setzero_ps();
        for (int64_t p = 0; p < dh; p++) {
            const __m256bh k0 = (__m256bh)_mm256_loadu_si256((const __m256i *)(kt + p * TILE_N + c));
            for (int r = 0; r < ROWS; r++)
                a[r] = _mm256_dpbf16_ps(a[r], (__m256bh)_mm256_set1_epi32((int)q[r * dh + p]), k0);
        }
        for (int r = 0; r < ROWS; r++) _mm256_storeu_ps(s + r * TILE_N + c, _mm256_mul_ps(a[r], _mm256_set1_ps(scale)));
    }
}

#endif /* FC_CPU_TILED_AVX512BF16_H */
