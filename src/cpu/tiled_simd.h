/*
 * tiled_simd.h -- the whole-tile parts of the tiled CPU path's two matrix
 * products for one vector width, included by tiled_avx2.h (256 bits) and
 * tiled_avx512.h (512 bits) with SIMD_NAME, the element type SIMD_T
 * (float; double for the double scores) and the SIMD_ vector operations
 * defined: 4 rows x 2 vectors = 8 accumulators per step, each
 * output element one fused sum over d (or j) in order, so every width
 * gives the same bits; and for float widths (SIMD_EXP2) 2^x. No include
 * guard: once per width; the SIMD_ macros are undefined at the end.
 */
#ifndef SIMD_NAME
#error "tiled_simd.h: define SIMD_NAME and the SIMD_ operations before including"
#endif

/* s[r][c] = scale * sum_d q[r][d] kt[d][c] for the columns c0.. in whole
 * tiles of 2 SIMD_W; returns the first column not done. */
static inline int SIMD_NAME(scores_tiles)(const SIMD_T *restrict q, int64_t dp, const SIMD_T *restrict kt,
                                          SIMD_T *restrict s, int c0, int c1, SIMD_T scale)
{
    const SIMD_V vs = SIMD_SET1(scale);
    int c = c0;
    for (; c + 2 * SIMD_W <= c1; c += 2 * SIMD_W) {
        SIMD_V a00 = SIMD_ZERO(), a01 = a00, a10 = a00, a11 = a00;
        SIMD_V a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        const SIMD_T *k = kt + c;
        for (int64_t d = 0; d < dp; d++, k += TILE_N) {
            const SIMD_V k0 = SIMD_LOAD(k), k1 = SIMD_LOAD(k + SIMD_W);
            SIMD_V b = SIMD_SET1(q[d]);
            a00 = SIMD_FMA(b, k0, a00);
            a01 = SIMD_FMA(b, k1, a01);
            b = SIMD_SET1(q[dp + d]);
            a10 = SIMD_FMA(b, k0, a10);
            a11 = SIMD_FMA(b, k1, a11);
            b = SIMD_SET1(q[2 * dp + d]);
            a20 = SIMD_FMA(b, k0, a20);
            a21 = SIMD_FMA(b, k1, a21);
            b = SIMD_SET1(q[3 * dp + d]);
            a30 = SIMD_FMA(b, k0, a30);
            a31 = SIMD_FMA(b, k1, a31);
        }
        SIMD_T *o = s + c;
        SIMD_STORE(o, SIMD_MUL(a00, vs));
        SIMD_STORE(o + SIMD_W, SIMD_MUL(a01, vs));
        SIMD_STORE(o + TILE_N, SIMD_MUL(a10, vs));
        SIMD_STORE(o + TILE_N + SIMD_W, SIMD_MUL(a11, vs));
        SIMD_STORE(o + 2 * TILE_N, SIMD_MUL(a20, vs));
        SIMD_STORE(o + 2 * TILE_N + SIMD_W, SIMD_MUL(a21, vs));
        SIMD_STORE(o + 3 * TILE_N, SIMD_MUL(a30, vs));
        SIMD_STORE(o + 3 * TILE_N + SIMD_W, SIMD_MUL(a31, vs));
    }
    return c;
}

/* o[r][:] += sum_{a <= j < e} p[r][j] v[j][:] for the columns c0.. in
 * whole tiles of 2 SIMD_W (p: the score tile, rows TILE_N apart: broadcasts
 * need no transpose; v and o rows dp apart, o not always aligned); returns
 * the first column not done. */
static inline int64_t SIMD_NAME(pv_tiles)(const SIMD_T *restrict pw, const SIMD_T *restrict v, int64_t dp,
                                          SIMD_T *restrict o, int a, int e, int64_t c0)
{
    int64_t c = c0;
    for (; c + 2 * SIMD_W <= dp; c += 2 * SIMD_W) {
        SIMD_T *o0 = o + c, *o1 = o0 + dp, *o2 = o1 + dp, *o3 = o2 + dp;
        SIMD_V a00 = SIMD_LOAD(o0), a01 = SIMD_LOAD(o0 + SIMD_W);
        SIMD_V a10 = SIMD_LOAD(o1), a11 = SIMD_LOAD(o1 + SIMD_W);
        SIMD_V a20 = SIMD_LOAD(o2), a21 = SIMD_LOAD(o2 + SIMD_W);
        SIMD_V a30 = SIMD_LOAD(o3), a31 = SIMD_LOAD(o3 + SIMD_W);
        for (int j = a; j < e; j++) {
            const SIMD_T *vj = v + j * dp + c, *p = pw + j;
            const SIMD_V v0 = SIMD_LOAD(vj), v1 = SIMD_LOAD(vj + SIMD_W);
            SIMD_V b = SIMD_SET1(p[0]);
            a00 = SIMD_FMA(b, v0, a00);
            a01 = SIMD_FMA(b, v1, a01);
            b = SIMD_SET1(p[TILE_N]);
            a10 = SIMD_FMA(b, v0, a10);
            a11 = SIMD_FMA(b, v1, a11);
            b = SIMD_SET1(p[2 * TILE_N]);
            a20 = SIMD_FMA(b, v0, a20);
            a21 = SIMD_FMA(b, v1, a21);
            b = SIMD_SET1(p[3 * TILE_N]);
            a30 = SIMD_FMA(b, v0, a30);
            a31 = SIMD_FMA(b, v1, a31);
        }
        SIMD_STORE(o0, a00);
        SIMD_STORE(o0 + SIMD_W, a01);
        SIMD_STORE(o1, a10);
        SIMD_STORE(o1 + SIMD_W, a11);
        SIMD_STORE(o2, a20);
        SIMD_STORE(o2 + SIMD_W, a21);
        SIMD_STORE(o3, a30);
        SIMD_STORE(o3 + SIMD_W, a31);
    }
    return c;
}

#ifdef SIMD_EXP2
/* exp2_le0 (tiled_kernels.h) on SIMD_W float lanes, the polynomial in
 * fused steps: every width gives each value the same bits. Float widths
 * only (SIMD_EXP2 and its integer operations defined). */
static inline SIMD_V SIMD_NAME(exp2_le0_v)(SIMD_V x)
{
    const SIMD_V shift = SIMD_SET1(0x1.8p23f);
    const SIMD_V t = SIMD_ADD(x, shift);
    const SIMD_V f = SIMD_SUB(x, SIMD_SUB(t, shift));
    const SIMD_I n = SIMD_SUB_I32(SIMD_AS_I(t), SIMD_AS_I(shift));
    SIMD_V p = SIMD_SET1(0x1.ffcbfcp-17f);
    p = SIMD_FMA(p, f, SIMD_SET1(0x1.430912p-13f));
    p = SIMD_FMA(p, f, SIMD_SET1(0x1.5d87fep-10f));
    p = SIMD_FMA(p, f, SIMD_SET1(0x1.3b2ab6p-7f));
    p = SIMD_FMA(p, f, SIMD_SET1(0x1.c6b08ep-5f));
    p = SIMD_FMA(p, f, SIMD_SET1(0x1.ebfbe0p-3f));
    p = SIMD_FMA(p, f, SIMD_SET1(0x1.62e430p-1f));
    p = SIMD_FMA(p, f, SIMD_SET1(1.0f));
    const SIMD_I e = SIMD_SLLI_I32(SIMD_ADD_I32(n, SIMD_SET1_I32(127)), 23);
    /* x < -126 (-inf included) gives 0; NaN compares false and stays */
    return SIMD_ZERO_BELOW(x, -126.0f, SIMD_MUL(p, SIMD_AS_F(e)));
}

/* w[j] = 2^(w[j] - sub) for a <= j < e, whole vectors from a; their sums
 * added into lane's 8 (lane (j - a) mod 8, in j order at every width).
 * Returns the first j not done. */
static inline int SIMD_NAME(exp2_sum)(float *w, int a, int e, float sub, float *lane)
{
    const SIMD_V vs = SIMD_SET1(sub);
    __m256 acc = _mm256_loadu_ps(lane);
    int j = a;
    for (; j + SIMD_W <= e; j += SIMD_W) {
        const SIMD_V p = SIMD_NAME(exp2_le0_v)(SIMD_SUB(SIMD_LOAD(w + j), vs));
        SIMD_STORE(w + j, p);
        acc = SIMD_ADD8(acc, p);
    }
    _mm256_storeu_ps(lane, acc);
    return j;
}
#endif

/* the parameters are this include's alone */
#undef SIMD_NAME
#undef SIMD_T
#undef SIMD_V
#undef SIMD_W
#undef SIMD_ZERO
#undef SIMD_SET1
#undef SIMD_LOAD
#undef SIMD_STORE
#undef SIMD_FMA
#undef SIMD_MUL
#undef SIMD_EXP2
#undef SIMD_ADD
#undef SIMD_SUB
#undef SIMD_I
#undef SIMD_AS_I
#undef SIMD_AS_F
#undef SIMD_ADD_I32
#undef SIMD_SUB_I32
#undef SIMD_SLLI_I32
#undef SIMD_SET1_I32
#undef SIMD_ZERO_BELOW
#undef SIMD_ADD8
