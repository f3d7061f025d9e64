/*
 * kit_paged.c -- paged KV caches and per-sequence key counts for the kit's
 * cases (see kit.h): the shuffled block table with spare pages and poisoned
 * unused entries, seqused_k, key addressing, and the reference's own check
 * against a dense twin of the same keys.
 */
#include "kit.h"
#include "kit_internal.h"

#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int64_t pick(uint64_t *rng, int64_t n) { return (int64_t)(kit_rand_u64(rng) % (uint64_t)n); }

int64_t kit_case_capacity(const kit_case *c)
{
    return c->s.page_size > 0 ? (int64_t)c->max_pages * c->s.page_size : c->s.seqlen_k;
}

/* Pages per sequence (at least one: an empty cache still has its row), a
 * few spare pages no sequence is given, and a row stride that is the
 * default (args 0), exactly max_pages, or longer with padding entries. */
static void plan_pages(kit_case *c, uint64_t *rng)
{
    const kit_shape *s = &c->s;
    c->max_pages = s->seqlen_k > 0 ? (s->seqlen_k + s->page_size - 1) / s->page_size : 1;
    c->num_pages = s->batch * c->max_pages + 1 + (int32_t)pick(rng, c->max_pages + 2);
    const int64_t kind = pick(rng, 3);
    c->table_stride = c->max_pages + (kind == 2 ? 1 + pick(rng, 5) : 0);
    c->args.block_table_stride = kind == 0 ? 0 : c->table_stride;
    c->args.max_pages_per_seq = c->max_pages;
}

/* 0 .. n-1 in random order (Fisher-Yates); NULL when out of memory. */
static int32_t *shuffled(int32_t n, uint64_t *rng)
{
    int32_t *p = malloc((size_t)n * sizeof *p);
    if (!p) return NULL;
    for (int32_t i = 0; i < n; i++) p[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        const int32_t j = (int32_t)pick(rng, (int64_t)i + 1), t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    return p;
}

/* An entry no sequence uses: out of range every way (negative, num_pages
 * and beyond, the int32 extremes), so a read of its page would show. */
static int32_t unused_entry(const kit_case *c, int64_t i)
{
    static const int32_t far[4] = {-1, 0, INT32_MIN, INT32_MAX};
    return i % 4 == 1 ? c->num_pages + (int32_t)(i % 7) : far[i % 4];
}

static int32_t draw_used(const kit_case *c, int b, uint64_t *rng)
{
    const int64_t room = kit_case_capacity(c) - c->s.append, cap = room > 0 ? room : 0;
    /* full: the call sees seqlen_k keys, the appended ones included, dense or paged */
    if (c->s.seqused == KIT_SEQUSED_FULL)
        return (int32_t)(c->s.seqlen_k > c->s.append ? c->s.seqlen_k - c->s.append : 0);
    if (c->s.seqused == KIT_SEQUSED_EMPTY) return 0;
    if (c->s.seqused == KIT_SEQUSED_FEW) return (int32_t)(b % 4 < cap ? b % 4 : cap);
    switch (pick(rng, 8)) {
    case 0: return 0;
    case 1: return cap > 0 ? 1 : 0;
    case 2: return (int32_t)cap;
    default: return (int32_t)pick(rng, cap + 1);
    }
}

/* Row b of the table: the sequence's pages from the shuffled order, then
 * unused entries past the pages its keys need and in the row's padding. */
static void fill_table(kit_case *c, const int32_t *perm)
{
    const int ps = c->s.page_size;
    for (int b = 0; b < c->s.batch; b++) {
        const int64_t pages = (kit_case_keys(c, b) + ps - 1) / ps;
        int32_t *row = c->block_table + (int64_t)b * c->table_stride;
        for (int64_t p = 0; p < c->table_stride; p++)
            row[p] = p < pages ? perm[(int64_t)b * c->max_pages + p] : unused_entry(c, b + p);
    }
}

/* Pool row r of c's k/v (a page's row, or a dense sequence's key) and its
 * element offset in k (strides: k's or v's). */
static int64_t row_offset(const kit_case *c, int64_t r, const fc_tensor *t)
{
    const int64_t per = c->s.page_size > 0 ? c->s.page_size : kit_case_capacity(c);
    return r / per * t->stride[0] + r % per * t->stride[1];
}

static void nan_row(const kit_case *c, int64_t r)
{
    const fc_tensor *t[2] = {&c->args.k, &c->args.v};
    void *buf[2] = {c->k, c->v};
    for (int i = 0; i < 2; i++)
        for (int64_t h = 0; h < t[i]->shape[2]; h++)
            for (int64_t d = 0; d < t[i]->shape[3]; d++)
                kit_store(buf[i], kit_kv_dtype(&c->s), row_offset(c, r, t[i]) + h * t[i]->stride[2] + d, NAN);
}

/* Rows no sequence uses (past a cache's length, spare pages) hold NaN: a
 * kernel that reads one without masking it (a box load past the length
 * whose V rows are not zeroed) turns its rows NaN. Best effort: skipped
 * when the bitmap cannot be allocated. */
void kit_paged_nan_unused(const kit_case *c)
{
    if (c->s.page_size <= 0 && !c->seqused_k) return; /* every row is used */
    const int ps = c->s.page_size;
    const int64_t per = ps > 0 ? ps : kit_case_capacity(c);
    const int64_t rows = (ps > 0 ? (int64_t)c->num_pages : c->s.batch) * per;
    unsigned char *used = rows > 0 ? calloc((size_t)rows, 1) : NULL;
    if (!used) return;
    for (int b = 0; b < c->s.batch; b++)
        for (int64_t j = 0; j < kit_case_keys(c, b); j++)
            used[ps > 0 ? c->block_table[b * c->table_stride + j / ps] * per + j % ps : b * per + j] = 1;
    for (int64_t r = 0; r < rows; r++)
        if (!used[r]) nan_row(c, r);
    free(used);
}

int kit_paged_setup(kit_case *c, uint64_t seed)
{
    const kit_shape *s = &c->s;
    if (s->page_size <= 0 && s->seqused == KIT_SEQUSED_NONE) return 0;
    uint64_t rng = seed * 0xD1B54A32D192ED03ull + 0x9A6ED;
    if (s->page_size > 0) plan_pages(c, &rng);
    if (s->seqused != KIT_SEQUSED_NONE) {
        c->used_bytes = (size_t)s->batch * sizeof(int32_t);
        if (!(c->seqused_k = malloc(c->used_bytes))) return -1;
        for (int b = 0; b < s->batch; b++) c->seqused_k[b] = draw_used(c, b, &rng);
        c->args.seqused_k = c->seqused_k;
    }
    if (s->page_size <= 0) return 0;
    c->table_bytes = (size_t)s->batch * (size_t)c->table_stride * sizeof(int32_t);
    int32_t *perm = shuffled(c->num_pages, &rng);
    c->block_table = malloc(c->table_bytes);
    if (perm && c->block_table) fill_table(c, perm);
    free(perm);
    c->args.block_table = c->block_table;
    return perm && c->block_table ? 0 : -1;
}

int64_t kit_case_keys(const kit_case *c, int b)
{
    if (c->cu_k) return c->cu_k[b + 1] - c->cu_k[b];
    if (c->seqused_k) return c->seqused_k[b] + c->s.append;
    return kit_case_capacity(c);
}

int64_t kit_key_offset(const kit_case *c, int b, int64_t j)
{
    const fc_tensor *k = &c->args.k;
    if (c->cu_k) return (c->cu_k[b] + j) * k->stride[0];
    if (!c->block_table) return b * k->stride[0] + j * k->stride[1];
    const int ps = c->s.page_size;
    const int64_t page = c->block_table[b * c->table_stride + j / ps];
    return page * k->stride[0] + (j % ps) * k->stride[1];
}

/* ---- the reference's own check ------------------------------------------------ */

/* Copy every used key of c (k and v, every head) into dense twin d. */
static void gather_keys(const kit_case *c, kit_case *d)
{
    const fc_dtype dt = kit_kv_dtype(&c->s);
    const int64_t hc = c->args.k.stride[2], hd = d->args.k.stride[2];
    for (int b = 0; b < c->s.batch; b++)
        for (int64_t j = 0; j < kit_case_keys(c, b); j++) {
            const int64_t src = kit_key_offset(c, b, j), dst = kit_key_offset(d, b, j);
            for (int h = 0; h < c->s.heads_kv; h++)
                for (int x = 0; x < c->s.head_dim; x++) {
                    kit_store(d->k, dt, dst + h * hd + x, kit_load(c->k, dt, src + h * hc + x));
                    kit_store(d->v, dt, dst + h * hd + x, kit_load(c->v, dt, src + h * hc + x));
                }
        }
}

/* d: c's problem with dense k/v of the longest used length (at least one
 * key row: a dense tensor is never empty), c's q, seqused_k and descales. */
static int dense_twin(const kit_case *c, kit_case *d)
{
    kit_shape s = c->s;
    int64_t longest = 1;
    for (int b = 0; b < s.batch; b++)
        if (kit_case_keys(c, b) > longest) longest = kit_case_keys(c, b);
    s.page_size = 0;
    s.seqlen_k = (int)longest;
    s.seqused = c->seqused_k ? KIT_SEQUSED_FULL : KIT_SEQUSED_NONE;
    if (kit_case_init(d, &s, 1) != 0) return -1;
    memcpy(d->q, c->q, c->q_bytes);
    if (c->seqused_k) memcpy(d->seqused_k, c->seqused_k, c->used_bytes);
    const size_t nd = (size_t)kit_descale_count(&s) * sizeof(float);
    for (int i = 0; i < 3; i++) /* FP8: the same descales */
        if (c->descale[i]) memcpy(d->descale[i], c->descale[i], nd);
    gather_keys(c, d);
    return 0;
}

/* Elements of a and b (n bytes of elem-sized items) whose bits differ. */
static int64_t bits_differ(const void *a, const void *b, size_t n, size_t elem)
{
    int64_t d = 0;
    for (size_t i = 0; i < n; i += elem) d += memcmp((const char *)a + i, (const char *)b + i, elem) != 0;
    return d;
}

int kit_paged_reference_check(fc_context *ctx, const kit_case *c, const void *ref_out, const float *ref_lse,
                              char *why, size_t why_len)
{
    kit_case d;
    if (dense_twin(c, &d) != 0) {
        snprintf(why, why_len, "dense twin: out of host memory");
        return -1;
    }
    fc_attention_args a = d.args;
    a.backend = FC_BACKEND_CPU_REFERENCE;
    const fc_status st = fc_attention_forward(ctx, &a, NULL, NULL);
    int rc = -1;
    if (st != FC_OK) {
        snprintf(why, why_len, "dense twin's reference: %s (%s)", fc_status_string(st), fc_last_error(ctx));
    } else {
        const int64_t dout = bits_differ(d.out, ref_out, c->out_bytes, kit_dtype_size(kit_out_dtype(&c->s)));
        const int64_t dlse = c->lse ? bits_differ(d.lse, ref_lse, c->lse_bytes, sizeof(float)) : 0;
        snprintf(why, why_len, "paged reference vs dense twin: %lld out and %lld lse elements differ",
                 (long long)dout, (long long)dlse);
        rc = dout == 0 && dlse == 0;
    }
    kit_case_free(&d);
    return rc;
}
