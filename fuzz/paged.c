/*
 * paged.c -- a fuzzed call's paged KV cache and seqused_k: page pools for k
 * and v, a shuffled block table (garbage in the entries no sequence uses),
 * the key counts, their corruptions and misplacements, and the NaN payload
 * in every cache row no sequence uses (a read of one shows in out). These
 * decisions come after every older one, so older inputs decode as before.
 */
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "kit.h"

/* A pool over this many bytes is not made (the arena's limit, with room). */
#define FZ_POOL_MAX (FZ_ARENA_MAX / 4)

/* Keys a sequence may hold: the pool's capacity, or the dense seqlen_k. */
static int64_t capacity(const fz_call *c)
{
    return c->pg.pool ? (int64_t)c->pg.max_pages * c->pg.page_size : c->shape[1][1];
}

/* Keys sequence b reads by the arrays' contents, clamped to what exists. */
int64_t fz_paged_keys(const fz_call *c, int b)
{
    const int64_t cap = capacity(c);
    if (!c->pg.used_on) return cap;
    const int64_t u = c->pg.used[b];
    return u < 0 ? 0 : u > cap ? cap : u;
}

/* An entry no sequence uses: out of range every way, so a read would show. */
static int32_t unused_entry(const fz_paged *g, int64_t i)
{
    static const int32_t far[4] = {-1, INT32_MIN, INT32_MAX, 0};
    return i % 4 == 3 ? g->num_pages + (int32_t)(i % 5) : far[i % 4];
}

static int32_t draw_used(fz_in *in, int64_t cap)
{
    switch (fz_range(in, 0, 7)) {
    case 0: return 0;
    case 1: return cap > 0 ? 1 : 0;
    case 2: return (int32_t)cap;
    default: return (int32_t)(fz_u32(in) % (uint64_t)(cap + 1));
    }
}

/* Pages shuffled (Fisher-Yates from a seed the bytes give) into each
 * sequence's used entries; everything else garbage. */
static int fill_table(fz_in *in, fz_call *c)
{
    fz_paged *g = &c->pg;
    const int B = g->batch;
    g->table_n = B * g->stride;
    int32_t *perm = malloc((size_t)g->num_pages * sizeof *perm);
    g->table = malloc((size_t)g->table_n * sizeof *g->table);
    g->clean = malloc((size_t)g->table_n * sizeof *g->clean);
    if (!perm || !g->table || !g->clean) { free(perm); return -1; }
    uint64_t rng = fz_u64(in);
    for (int32_t i = 0; i < g->num_pages; i++) perm[i] = i;
    for (int32_t i = g->num_pages - 1; i > 0; i--) {
        const int32_t j = (int32_t)(kit_rand_u64(&rng) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int b = 0; b < B; b++) {
        const int64_t pages = (fz_paged_keys(c, b) + g->page_size - 1) / g->page_size;
        for (int64_t p = 0; p < g->stride; p++)
            g->table[b * g->stride + p] = p < pages ? perm[b * g->max_pages + p] : unused_entry(g, b + p);
    }
    memcpy(g->clean, g->table, (size_t)g->table_n * sizeof *g->table);
    free(perm);
    return 0;
}

/* The page size (biased to 1, 3, 16, 64), pages per sequence from the
 * dense key count, spare pages, and a row stride: 0, exact, padded, long. */
static void gen_geometry(fz_in *in, fz_call *c)
{
    static const int common[] = {1, 3, 16, 64};
    fz_paged *g = &c->pg;
    const int64_t sk = c->shape[1][1] > 0 ? c->shape[1][1] : 1;
    g->page_size = fz_chance(in, 60) ? common[fz_range(in, 0, 3)] : fz_range(in, 1, 70);
    g->max_pages = (int32_t)((sk + g->page_size - 1) / g->page_size) + fz_chance(in, 20);
    g->num_pages = (int32_t)c->shape[0][0] * g->max_pages + fz_range(in, 0, 3);
    const int kind = fz_range(in, 0, 9);
    g->stride = g->max_pages + (kind >= 8 ? fz_range(in, 1, 5) : kind == 7 ? 1000 : 0);
    g->arg_stride = g->clean_arg_stride = kind < 4 ? 0 : g->stride;
    g->arg_max_pages = g->max_pages;
}

/* k and v as page pools [num_pages, page_size, heads_kv, head_dim] (any
 * strides, corrupted now and then). 0 when too large to place. */
static int gen_pools(fz_in *in, fz_call *c, int ok[FB_N])
{
    fz_paged *g = &c->pg;
    const int64_t shape[4] = {g->num_pages, g->page_size, c->shape[1][2], c->shape[1][3]};
    if (shape[0] * shape[1] * shape[2] * shape[3] * (int64_t)fz_dtype_size(c->kv_dtype) > FZ_POOL_MAX) return 0;
    memcpy(c->shape[1], shape, sizeof shape);
    fz_gen_tensor(in, &c->a.k, c->kv_dtype, 4, shape, &ok[FB_K]);
    fz_gen_tensor(in, &c->a.v, c->kv_dtype, 4, shape, &ok[FB_V]);
    g->pool = 1;
    return 1;
}

static void gen_counts(fz_in *in, fz_call *c)
{
    for (int b = 0; b < c->pg.batch; b++) c->pg.used[b] = c->pg.used_clean[b] = draw_used(in, capacity(c));
}

/* A used entry of some sequence with pages, or -1 when none has one. */
static int64_t some_used_entry(fz_in *in, const fz_call *c)
{
    const int B = c->pg.batch, b0 = fz_range(in, 0, B - 1);
    for (int i = 0; i < B; i++) {
        const int b = (b0 + i) % B;
        const int64_t pages = (fz_paged_keys(c, b) + c->pg.page_size - 1) / c->pg.page_size;
        if (pages > 0) return b * c->pg.stride + fz_range(in, 0, (int)(pages - 1));
    }
    return -1;
}

/* One thing the library must refuse with FC_ERR_INVALID_ARGUMENT. */
static void corrupt_paged(fz_in *in, fz_call *c)
{
    static const int32_t bad_count[] = {-1, INT32_MAX, INT32_MIN, 0};
    static const int64_t bad_stride[] = {(int64_t)INT32_MAX + 1, INT64_MAX, INT64_MIN, -1};
    fz_paged *g = &c->pg;
    const int kind = fz_range(in, 0, 6), b = fz_range(in, 0, g->batch - 1);
    int64_t e;
    g->expect = FC_ERR_INVALID_ARGUMENT;
    g->known = 1;
    switch (g->pool ? kind : 2) {
    case 0: /* a used page past the pool */
    case 1: /* a negative used page */
        if ((e = some_used_entry(in, c)) < 0) { g->known = 0; break; }
        g->table[e] = kind == 0 ? g->num_pages + fz_range(in, 0, 2) : (fz_chance(in, 50) ? -1 : INT32_MIN);
        break;
    case 2: /* a count out of [0, seqlen_k] */
        if (!g->used_on) for (int i = 0; i < g->batch; i++) g->used[i] = g->used_clean[i] = (int32_t)capacity(c);
        g->used_on = 1;
        g->used[b] = bad_count[fz_range(in, 0, 3)];
        if (g->used[b] == 0) g->used[b] = (int32_t)capacity(c) + 1;
        break;
    case 3: g->arg_stride = g->max_pages > 1 ? fz_range(in, 1, g->max_pages - 1) : -1; break;
    case 4: g->arg_stride = bad_stride[fz_range(in, 0, 3)]; break;
    case 5: g->arg_max_pages = (int32_t[]){0, -1, INT32_MIN}[fz_range(in, 0, 2)]; break;
    default: /* max_pages * page_size past INT32_MAX */
        g->arg_max_pages = g->page_size > 1 ? INT32_MAX / g->page_size + 1 : 0;
    }
}

/* A dense forward's k and v become page pools with a block table (counts
 * now and then); sometimes one thing is corrupt. */
static void gen_paged_call(fz_in *in, fz_call *c, int ok[FB_N])
{
    fz_paged *g = &c->pg;
    gen_geometry(in, c);
    if (!gen_pools(in, c, ok)) return;
    g->table_on = 1;
    g->used_on = fz_chance(in, 60);
    if (g->used_on) gen_counts(in, c);
    if (fill_table(in, c)) fz_fail("harness", "cannot allocate a block table");
    if (fz_chance(in, 30)) corrupt_paged(in, c);
}

/* The arrays a varlen or backward call must refuse (valid contents): the
 * table UNSUPPORTED; seqused_k INVALID with cu_seqlens, UNSUPPORTED in a
 * backward (docs/API.md, "Not combined"). */
static void gen_refused(fz_in *in, fz_call *c)
{
    fz_paged *g = &c->pg;
    g->table_on = fz_chance(in, 50);
    g->used_on = !g->table_on || fz_chance(in, 40);
    g->page_size = g->num_pages = g->max_pages = g->arg_max_pages = 1;
    g->stride = 1;
    g->table_n = g->batch;
    g->table = calloc((size_t)g->batch, sizeof *g->table);
    g->clean = calloc((size_t)g->batch, sizeof *g->clean);
    if (!g->table || !g->clean) fz_fail("harness", "cannot allocate a block table");
    g->expect = c->bwd || g->table_on ? FC_ERR_UNSUPPORTED : FC_ERR_INVALID_ARGUMENT;
    g->known = 1;
}

/* Misaligned, inside out or lse (both INVALID), or NULL where sizes are
 * set (the call's meaning changes: no expectation). */
static void misplace(fz_in *in, fz_call *c)
{
    fz_paged *g = &c->pg;
    const int b = g->table_on && (!g->used_on || fz_chance(in, 50)) ? FB_BT : FB_SU;
    const int into = c->off[FB_LSE] >= 0 && fz_chance(in, 40) ? FB_LSE : FB_O;
    int64_t lo, hi;
    switch (fz_range(in, 0, 2)) {
    case 0: c->off[b] += fz_range(in, 1, 3); break;
    case 1:
        if (c->off[into] < 0) return;
        fz_footprint(fz_tensor_of(c, into), &lo, &hi);
        /* starting inside the output's bytes, so the two must overlap */
        c->off[b] = c->off[into] + lo + 4 * (fz_range(in, 0, 3) % ((hi - lo + 3) / 4));
        break;
    default: /* the call now means a dense cache, or every key in use */
        c->off[b] = -1;
        if (b == FB_BT) g->table_on = g->pool = 0;
        else g->used_on = 0;
        g->known = 0;
        return;
    }
    g->expect = FC_ERR_INVALID_ARGUMENT;
    g->known = 1;
}

/* Footprint of buffer b as this file places it; 0: not one of its own. */
static int own_extent(fz_call *c, int b, int64_t *lo, int64_t *hi)
{
    *lo = 0;
    if (b == FB_BT) *hi = 4 * c->pg.table_n;
    if (b == FB_SU) *hi = 4 * (int64_t)c->pg.batch;
    if (b == FB_BT || b == FB_SU) return b == FB_BT ? c->pg.table_on : c->pg.used_on;
    if (!c->pg.pool || c->off[b] < 0) return 0; /* a pool whose pointer was dropped stays NULL */
    fz_footprint(fz_tensor_of(c, b), lo, hi);
    return 1;
}

/* Pools, table and counts past the older buffers, then the odd one out. */
static int64_t place_paged(fz_in *in, fz_call *c, int64_t size)
{
    static const int bufs[] = {FB_K, FB_V, FB_BT, FB_SU};
    int64_t lo[4], hi[4], cursor = size, end = size;
    int own[4];
    for (int i = 0; i < 4; i++) {
        if (!(own[i] = own_extent(c, bufs[i], &lo[i], &hi[i]))) continue;
        c->off[bufs[i]] = ((cursor + 64 + 63) & ~(int64_t)63) - lo[i];
        cursor = c->off[bufs[i]] + hi[i];
    }
    if (!c->varlen && !c->bwd && (c->pg.table_on || c->pg.used_on) && fz_chance(in, 10)) misplace(in, c);
    for (int i = 0; i < 4; i++)
        if (own[i] && c->off[bufs[i]] >= 0 && c->off[bufs[i]] + hi[i] > end) end = c->off[bufs[i]] + hi[i];
    return end + 64;
}

int64_t fz_gen_paged(fz_in *in, fz_call *c, int ok[FB_N], int64_t size)
{
    fz_paged *g = &c->pg;
    c->off[FB_BT] = c->off[FB_SU] = -1;
    g->batch = c->varlen ? c->nseq : (int)c->shape[0][0];
    if (c->varlen || c->bwd) {
        if (fz_chance(in, 6)) gen_refused(in, c);
    } else {
        switch (fz_pick(in, (const int[]){82, 12, 6}, 3)) {
        case 1: gen_paged_call(in, c, ok); break;
        case 2:
            g->used_on = 1;
            gen_counts(in, c);
            if (fz_chance(in, 25)) corrupt_paged(in, c);
            break;
        default: break;
        }
    }
    if (g->table_on) {
        c->a.max_pages_per_seq = g->arg_max_pages;
        c->a.block_table_stride = g->arg_stride;
    }
    return g->table_on || g->used_on || g->pool ? place_paged(in, c, size) : size;
}

int64_t fz_paged_key_offset(const fz_call *c, const fc_tensor *t, int b, int64_t j)
{
    const fz_paged *g = &c->pg;
    if (!g->pool) return b * t->stride[0] + j * t->stride[1];
    const int64_t page = g->table[b * g->stride + j / g->page_size];
    return page * t->stride[0] + j % g->page_size * t->stride[1];
}

/* ---- contents ------------------------------------------------------------------ */

/* Rows ([pages or batch] x [page_size or seqlen_k]) of the cache that some
 * sequence reads by the arrays' contents; NULL when the shape is not the
 * one meant (the call is refused; nothing to mark). */
static uint8_t *rows_read(const fz_call *c, const fc_tensor *t)
{
    const fz_paged *g = &c->pg;
    const int64_t n0 = g->pool ? g->num_pages : g->batch, n1 = g->pool ? g->page_size : c->shape[1][1];
    if (t->ndim != 4 || t->shape[0] != n0 || t->shape[1] != n1 || n0 * n1 <= 0) return NULL;
    if (t->shape[2] != c->shape[1][2] || t->shape[3] != c->shape[1][3]) return NULL;
    uint8_t *seen = calloc((size_t)(n0 * n1), 1);
    if (!seen) fz_fail("harness", "cannot allocate a row map");
    for (int b = 0; b < g->batch; b++)
        for (int64_t j = 0; j < fz_paged_keys(c, b); j++) {
            if (!g->pool) { seen[b * n1 + j] = 1; continue; }
            const int32_t page = g->table[b * g->stride + j / n1];
            if (page >= 0 && page < n0) seen[page * n1 + j % n1] = 1;
        }
    return seen;
}

/* A NaN no input, output or poison pattern holds. */
void fz_store_nan(const fc_tensor *t, int64_t idx)
{
    static const uint32_t f32 = 0x7FC0F00Du;
    const uint16_t h = t->dtype == FC_DTYPE_BF16 ? 0x7FB1u : 0x7E3Cu;
    const size_t es = fz_dtype_size(t->dtype);
    uint8_t *p = (uint8_t *)t->data + idx * (int64_t)es;
    if (es == 4) memcpy(p, &f32, 4);
    else if (es == 2) memcpy(p, &h, 2);
    else memset(p, 0xFF, es);
}

void fz_mark_unused_rows(fz_call *c, const int ok[FB_N])
{
    if (!c->pg.pool && !c->pg.used_on) return;
    for (int b = FB_K; b <= FB_V; b++) {
        const fc_tensor *t = fz_tensor_of(c, b);
        uint8_t *seen = ok[b] && c->off[b] >= 0 ? rows_read(c, t) : NULL;
        if (!seen) continue;
        for (int64_t r = 0; r < t->shape[0] * t->shape[1]; r++) {
            if (seen[r]) continue;
            const int64_t base = r / t->shape[1] * t->stride[0] + r % t->shape[1] * t->stride[1];
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t d = 0; d < t->shape[3]; d++) fz_store_nan(t, base + h * t->stride[2] + d * t->stride[3]);
        }
        free(seen);
    }
}

void fz_write_paged(fz_call *c)
{
    const fz_paged *g = &c->pg;
    if (g->table_on && c->off[FB_BT] >= 0) memcpy(c->ar.base + c->off[FB_BT], g->table, 4 * (size_t)g->table_n);
    if (g->used_on && c->off[FB_SU] >= 0) memcpy(c->ar.base + c->off[FB_SU], g->used, 4 * (size_t)g->batch);
}

void fz_paged_free(fz_call *c)
{
    free(c->pg.table);
    free(c->pg.clean);
    c->pg.table = c->pg.clean = NULL;
}
