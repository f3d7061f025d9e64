/*
 * place.c -- where each buffer of a fuzzed call sits in its arena: 64-byte
 * gaps between them (256-byte boundaries for a workspace), then the odd ones
 * out: misaligned, aliased (an output over an input or over another output,
 * inputs over each other), NULL. Then the arena is allocated and the call's
 * pointers set into it.
 */
#include "call.h"

fc_tensor *fz_tensor_of(fz_call *c, int b)
{
    fc_tensor *t[] = {&c->a.q, &c->a.k, &c->a.v, &c->a.out, &c->a.lse};
    if (b <= FB_LSE) return t[b];
    if (b >= FB_DOUT && b <= FB_DV) return &c->grad[b - FB_DOUT];
    return NULL;
}

/* Byte footprint of buffer b around its pointer, or 0 if it has none. */
static int buffer_extent(fz_call *c, int b, int64_t *lo, int64_t *hi)
{
    *lo = 0;
    *hi = 0;
    if (b == FB_BT || b == FB_SU) return 0; /* placed by paged.c, after every older decision */
    if (b == FB_LSE && c->a.lse.ndim == 0) return 0;
    if (b == FB_CUQ || b == FB_CUK) { *hi = 4 * (c->nseq + 1); return c->varlen; }
    if (b == FB_DESC) { *hi = 12; return 0; } /* placed only when a descale is set */
    if (b >= FB_DOUT && !c->bwd) return 0;
    if (b == FB_WS) { *hi = c->ws_alloc; return c->ws_alloc > 0; }
    fz_footprint(fz_tensor_of(c, b), lo, hi);
    return 1;
}

/* Move buffer p's pointer into q's bytes (a workspace keeps its 256-byte
 * boundary, so that the overlap is what the library must name). */
static void point_into(fz_in *in, fz_call *c, int p, int q, const int64_t *lo, const int64_t *hi)
{
    if (c->off[p] < 0 || c->off[q] < 0) return;
    const fc_tensor *t = fz_tensor_of(c, p);
    const int64_t unit = p == FB_WS ? 256 : t && p != FB_LSE ? (int64_t)fz_dtype_size(t->dtype) : 4;
    const int64_t start = p == FB_WS ? (c->off[q] + 255) & ~(int64_t)255 : c->off[q];
    const int64_t span = (hi[q] - (start - c->off[q])) / unit;
    const int64_t off = start + unit * (span > 1 ? (int64_t)(fz_u32(in) % (uint64_t)span) : 0);
    if (off + lo[p] >= 0) c->off[p] = off;
}

/* The forward's pairs: an output over an input, inputs over each other. */
static void alias_forward(fz_in *in, fz_call *c, const int64_t *lo, const int64_t *hi)
{
    static const int pairs[][2] = {{FB_O, FB_Q}, {FB_LSE, FB_O}, {FB_O, FB_V}, {FB_CUQ, FB_O},
                                   {FB_CUK, FB_LSE}, {FB_K, FB_V}, {FB_CUQ, FB_Q}, {FB_LSE, FB_Q},
                                   {FB_O, FB_CUK}, {FB_CUK, FB_O}};
    const int *p = pairs[fz_range(in, 0, 9)];
    const int cu = p[0] == FB_CUQ || p[0] == FB_CUK || p[1] == FB_CUQ || p[1] == FB_CUK;
    const int into_out = cu && (p[0] == FB_O || p[0] == FB_LSE || p[1] == FB_O || p[1] == FB_LSE);
    if (into_out && (fz_skip & FZ_SKIP_CU_IN_OUT)) return;
    point_into(in, c, p[0], p[1], lo, hi);
}

/* The backward's: every output (dq, dk, dv, the workspace) with every other
 * buffer, either way round; now and then two inputs (legal: both are read). */
static void alias_backward(fz_in *in, fz_call *c, const int64_t *lo, const int64_t *hi)
{
    static const int reads[][2] = {{FB_DOUT, FB_O}, {FB_O, FB_Q}, {FB_K, FB_V}, {FB_LSE, FB_DOUT},
                                   {FB_CUQ, FB_O}, {FB_DOUT, FB_Q}, {FB_CUK, FB_LSE}, {FB_LSE, FB_O}};
    static const int others[] = {FB_Q, FB_K, FB_V, FB_O, FB_LSE, FB_CUQ, FB_CUK,
                                 FB_DOUT, FB_DQ, FB_DK, FB_DV, FB_WS};
    if (fz_chance(in, 25)) {
        const int *p = reads[fz_range(in, 0, 7)];
        point_into(in, c, p[0], p[1], lo, hi);
        return;
    }
    const int out = fz_range(in, FB_DQ, FB_WS);
    int other = others[fz_range(in, 0, 11)];
    if (other == out) other = FB_Q;
    if (fz_chance(in, 50)) point_into(in, c, out, other, lo, hi);
    else point_into(in, c, other, out, lo, hi);
}

/* NULL where a pointer is required (the forward's data pointers; the
 * backward's and its lse too). */
static void drop_one(fz_in *in, fz_call *c)
{
    static const int bwd[] = {FB_Q, FB_K, FB_V, FB_O, FB_LSE, FB_DOUT, FB_DQ, FB_DK, FB_DV};
    c->off[c->bwd ? bwd[fz_range(in, 0, 8)] : fz_range(in, FB_Q, FB_O)] = -1;
}

/* Offsets of every buffer, then the odd ones out. Returns the arena size. */
static int64_t place(fz_in *in, fz_call *c)
{
    static const int64_t ws_mis[] = {4, 16, 64, 128};
    int64_t lo[FB_N], hi[FB_N], cursor = 0, size = 0;
    const int with_desc = fz_chance(in, 2);
    for (int b = 0; b < FB_N; b++) {
        c->off[b] = -1;
        if (!buffer_extent(c, b, &lo[b], &hi[b]) && !(b == FB_DESC && with_desc)) continue;
        int64_t mis = 0;
        if (!(fz_skip & FZ_SKIP_MISALIGNED) && b != FB_DESC && fz_chance(in, 4)) {
            if (b == FB_WS) mis = ws_mis[fz_range(in, 0, 3)];
            else mis = fz_cuda_mode ? (int[]){1, 2, 3, 4, 8}[fz_range(in, 0, 4)] : fz_range(in, 1, 3); /* 2-8: off 16 B */
        }
        const int64_t align = b == FB_WS ? 256 : 64;
        c->off[b] = ((cursor + 64 + align - 1) & ~(align - 1)) + mis - lo[b];
        cursor = c->off[b] + hi[b];
    }
    if (fz_chance(in, c->bwd ? 12 : 8)) {
        if (c->bwd) alias_backward(in, c, lo, hi);
        else alias_forward(in, c, lo, hi);
    }
    if (c->varlen && fz_chance(in, 2)) c->off[fz_range(in, FB_CUQ, FB_CUK)] = -1;
    if (fz_chance(in, 3)) drop_one(in, c);
    for (int b = 0; b < FB_N; b++)
        if (c->off[b] >= 0 && c->off[b] + hi[b] > size) size = c->off[b] + hi[b];
    return size + 64;
}

static void set_pointers(fz_call *c)
{
    uint8_t *p[FB_N];
    for (int b = 0; b < FB_N; b++) p[b] = c->off[b] >= 0 ? c->ar.base + c->off[b] : NULL;
    for (int b = 0; b < FB_N; b++)
        if (fz_tensor_of(c, b)) fz_tensor_of(c, b)->data = p[b];
    c->a.cu_seqlens_q = (const int32_t *)p[FB_CUQ];
    c->a.cu_seqlens_k = (const int32_t *)p[FB_CUK];
    if (c->pg.table_on) c->a.block_table = (const int32_t *)p[FB_BT];
    if (c->pg.used_on) c->a.seqused_k = (const int32_t *)p[FB_SU];
    fc_descale *desc[] = {&c->a.q_descale, &c->a.k_descale, &c->a.v_descale};
    if (p[FB_DESC]) desc[c->desc_which]->data = (const float *)p[FB_DESC]; /* strides 0: one value */
}

int64_t fz_place_call(fz_in *in, fz_call *c)
{
    static const float values[6] = {1.0f, 0.5f, 2.0f, 0.0f, -1.0f, -0.5f};
    const int64_t size = place(in, c);
    c->desc_which = c->off[FB_DESC] >= 0 ? fz_range(in, 0, 2) : 0;
    c->desc_value = c->off[FB_DESC] >= 0 ? values[fz_range(in, 0, 5)] : 1.0f;
    return size;
}

int fz_alloc_call(fz_call *c, int64_t size)
{
    if (fz_arena_init(&c->ar, (size_t)size, fz_cuda_mode)) return -1;
    set_pointers(c);
    return 0;
}
