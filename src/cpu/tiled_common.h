/*
 * tiled_common.h -- helpers shared by the tiled CPU forward (tiled.c) and
 * backward (tiled_bwd.c): the visibility rule as ranges, scratch carving,
 * the instruction-set choice. Plain C, not compiled per variant.
 */
#ifndef FC_CPU_TILED_COMMON_H
#define FC_CPU_TILED_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "flashcore.h"
#include "internal.h" /* fc_dtype_bytes */
#include "tiled_kernels.h" /* the tile table */

/* A block of keys (queries) gets fp32 scores while scale * log2 e * |q|max
 * * |k|max, a bound on every |logit| of the block in log2 units
 * (Cauchy-Schwarz), stays at or below this; double scores past it. An fp32
 * dot product's error grows with the logit's size and P = 2^(s - m) makes
 * it a relative error of every weight: with fp32 scores everywhere the
 * f32 forward's first elements left its gate at bounds of 300-500 (N(0,
 * sigma^2) inputs, S 512, d 64/128); at 64 its worst error was 1.5x that
 * of double scores. */
#define F32_SCORE_BOUND 64.0

/* The score operands of one streamed block, in fp32 and (for double
 * scores) double: the item's rows ([rows][dp], the first `done` of them
 * already in double) and the block transposed ([D][TILE_N]), with the
 * largest squared norm of each side. */
typedef struct fc_score_ops {
    const float *rows, *bt;
    double *rowsd, *btd;
    double rn2, bn2;
    int64_t dp, D;
    int nrows, *done, nb;
} fc_score_ops;

/* The double copies of a block's operands: its columns (their pad
 * included) and the item's rows not yet copied (so the rows are copied
 * once, at the item's first double block). */
static inline void fc_double_copies(const fc_score_ops *o)
{
    const int nb_pad = (o->nb + VEC_W - 1) & ~(VEC_W - 1);
    for (int64_t d = 0; d < o->D; d++)
        for (int c = 0; c < nb_pad; c++) o->btd[d * TILE_N + c] = o->bt[d * TILE_N + c];
    for (; *o->done < o->nrows; ++*o->done)
        for (int64_t d = 0; d < o->dp; d++) o->rowsd[*o->done * o->dp + d] = o->rows[*o->done * o->dp + d];
}

/* 1 if the block's scores must be double (lscale * |row|max * |col|max
 * passes F32_SCORE_BOUND), after making the copies. */
static inline int fc_double_scores(double lscale, const fc_score_ops *o)
{
    /* fmax skipped NaN norms: such a key's scores are NaN in either precision */
    if (!(lscale * sqrt(o->rn2) * sqrt(o->bn2) > F32_SCORE_BOUND)) return 0;
    fc_double_copies(o);
    return 1;
}

/* Keys visible to query i: exactly the j in [lo, hi) for which
 * fc_key_visible(i, j, sq, sk, wl, wr) holds (the rule is an interval). */
static inline void visible_range(int64_t i, int64_t sq, int64_t sk, int wl, int wr, int64_t *lo, int64_t *hi)
{
    int64_t diag = i + sk - sq; /* bottom-right alignment, as fc_key_visible */
    int64_t a = 0, e = sk;
    if (wl >= 0 && diag - wl > a) a = diag - wl;
    if (wr >= 0 && diag + wr + 1 < e) e = diag + wr + 1;
    if (e < a) e = a;
    *lo = a;
    *hi = e;
}

/* The other way round: the queries i in [lo, hi) that see key j (the same
 * rule solved for i: j - diag_offset - wr <= i <= j - diag_offset + wl). */
static inline void visible_queries(int64_t j, int64_t sq, int64_t sk, int wl, int wr, int64_t *lo, int64_t *hi)
{
    int64_t off = sk - sq;
    int64_t a = 0, e = sq;
    if (wr >= 0 && j - off - wr > a) a = j - off - wr;
    if (wl >= 0 && j - off + wl + 1 < e) e = j - off + wl + 1;
    if (e < a) e = a;
    *lo = a;
    *hi = e;
}

/* The part of the block [j0, j0+nb) that each row rg+x (x < ROWS) of a
 * register tile sees, from the rows' ranges [lo, hi): a[x], e[x] relative
 * to j0 (0, 0 for a row past nr or seeing nothing of it). Returns 0 when no
 * row sees the block; else the union's bounds in *ua, *ue and in *same
 * whether all ROWS rows exist and share row 0's range. */
static inline int tile_ranges(const int64_t *lo, const int64_t *hi, int rg, int nr, int64_t j0, int nb, int *a,
                              int *e, int *ua, int *ue, int *same)
{
    *ua = TILE_N;
    *ue = 0;
    *same = rg + ROWS <= nr;
    for (int x = 0; x < ROWS; x++) {
        a[x] = e[x] = 0;
        const int rr = rg + x;
        if (rr < nr) {
            int64_t l = lo[rr] > j0 ? lo[rr] : j0;
            int64_t h = hi[rr] < j0 + nb ? hi[rr] : j0 + nb;
            if (l < h) {
                a[x] = (int)(l - j0);
                e[x] = (int)(h - j0);
                if (a[x] < *ua) *ua = a[x];
                if (e[x] > *ue) *ue = e[x];
            }
        }
        if (a[x] != a[0] || e[x] != e[0]) *same = 0;
    }
    return *ua < *ue;
}

/* Work item idx of a list where sequence b owns items first[b] ..
 * first[b+1]-1, the same number of tiles for each of its heads_kv heads:
 * its sequence *b, kv head *g and *tile. reverse: a head's tiles from the
 * last one (see the callers for which tiles are heaviest: starting those
 * early evens out the threads' finishing times). */
static inline void item_of(const int64_t *first, int batch, int heads_kv, int reverse, int64_t idx, int *b,
                           int *g, int64_t *tile)
{
    int lo = 0, hi = batch; /* the sequence: first[b] <= idx < first[b+1] */
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (first[mid] <= idx) lo = mid;
        else hi = mid;
    }
    const int64_t local = idx - first[lo];
    const int64_t tiles = (first[lo + 1] - first[lo]) / heads_kv;
    *b = lo;
    *g = (int)(local / tiles);
    *tile = reverse ? tiles - 1 - local % tiles : local % tiles;
}

/* Rows this far ahead of the one being loaded are asked for early (see
 * prefetch_row): without it the loads waited on memory, ~15% of the
 * backward's time and 16% of the forward's (f32, single thread). */
#define PREFETCH_AHEAD 4

/* Ask for the cache lines of the n elements at element off of src, a
 * tensor of dtype (fc_dtype): rows of a block are strided (heads apart),
 * which the hardware prefetcher does not follow. */
static inline void prefetch_row(const void *src, int64_t off, int64_t n, int32_t dtype)
{
    const size_t es = (size_t)fc_dtype_bytes(dtype);
    const char *r = (const char *)src + (size_t)off * es;
    for (size_t b = 0; b < (size_t)n * es; b += 64) __builtin_prefetch(r + b);
}

/* n elements of type T at offset *off of base (NULL when only measuring);
 * every piece starts 64-byte aligned. */
#define CARVE(base, off, T, n) ((T *)carve(base, &(off), (size_t)(n) * sizeof(T)))
static inline void *carve(char *base, size_t *off, size_t bytes)
{
    void *p = base ? base + *off : NULL;
    *off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* 1 when the AVX2 build of the per-item code (AVX2, FMA and F16C) can run
 * on this CPU. F16C through CPUID (leaf 1, ECX): not every clang's
 * __builtin_cpu_supports knows its name. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(FC_CPU_PORTABLE_ONLY)
#include <cpuid.h>
#define FC_HAVE_AVX2_VARIANT 1
static inline int fc_cpu_avx2(void)
{
    unsigned int a, b, c, d;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
           (c & bit_F16C);
}
/* ... and its AVX-512 twin (512-bit matrix products). */
#define FC_HAVE_AVX512_VARIANT 1
static inline int fc_cpu_avx512(void)
{
    return fc_cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw");
}
/* ... with AVX512_BF16 (CPUID leaf 7, subleaf 1, EAX bit 5), where the
 * compiler knows its intrinsics (gcc 10, clang 9). */
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define FC_HAVE_AVX512BF16_VARIANT 1
static inline int fc_cpu_avx512bf16(void)
{
    unsigned int a, b, c, d;
    return fc_cpu_avx512() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}
#else
static inline int fc_cpu_avx512bf16(void) { return 0; }
#endif
#else
static inline int fc_cpu_avx2(void) { return 0; }
static inline int fc_cpu_avx512(void) { return 0; }
static inline int fc_cpu_avx512bf16(void) { return 0; }
#endif

#endif /* FC_CPU_TILED_COMMON_H */
