/*
 * test_paged.h -- what the paged-cache tests share (test_paged.c on the
 * CPU, test_cuda_paged.c on CUDA): random paged and seqused_k
 * configurations, the named edges, one case's fp64 reference checked
 * against its dense twin (kit_paged_reference_check), the judge of a
 * backend's output against that reference, and a tally proving the random
 * cases reached every feature of the kit's caches.
 *
 * Header-only (static), like test_util.h: each test is one translation unit.
 */
#ifndef FC_TEST_PAGED_H
#define FC_TEST_PAGED_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_util.h"

/* What a test draws its random cases from. */
typedef struct tp_config {
    const int *pages;
    int npages; /* page sizes */
    const int *dims;
    int ndims; /* head dims (repeats weight them) */
    const fc_dtype *dtypes;
    int ndtypes;
    double max_work; /* reference multiply-adds per case: keeps the run short */
} tp_config;

static inline double tp_work(const kit_shape *s)
{
    return 2.0 * s->batch * s->heads_q * (double)s->seqlen_q * (double)s->seqlen_k * s->head_dim;
}

/* Smaller until the reference's work fits: batch, heads, keys, queries. */
static inline void tp_shrink(kit_shape *s, double max_work)
{
    while (tp_work(s) > max_work) {
        if (s->batch > 1) s->batch--;
        else if (s->heads_q > s->heads_kv) s->heads_q /= 2; /* ratios 1, 4, 8 stay whole */
        else if (s->heads_kv > 1) s->heads_q = s->heads_kv = 1;
        else if (s->seqlen_k > 1) s->seqlen_k = (s->seqlen_k + 1) / 2;
        else if (s->seqlen_q > 1) s->seqlen_q = (s->seqlen_q + 1) / 2;
        else break;
    }
}

/* Decode and speculative steps (1-8 queries) against caches of 1 to 2100
 * keys, and chunked prefill (64-200 causal queries after a longer paged
 * prefix); GQA 1, 4, 8; every page size of cfg or dense k/v with seqused_k;
 * causal, windows, softcap, lse on/off, every layout. */
static inline kit_shape tp_random_shape(uint64_t *rng, const tp_config *cfg)
{
#define R(n) ((int)(kit_rand_u64(rng) % (uint64_t)(n)))
    static const int ratios[] = {1, 4, 8};
    static const int keys[] = {1, 7, 33, 100, 257, 600, 1000, 2100};
    const int chunk = R(6) == 0, hkv = 1 + R(2), sq = chunk ? 64 + R(137) : 1 + R(8);
    kit_shape s = test_shape(1 + R(4), hkv * ratios[R(3)], hkv, sq, chunk ? sq + 100 + R(900) : keys[R(8)],
                             cfg->dims[R(cfg->ndims)], cfg->dtypes[R(cfg->ndtypes)]);
    s.page_size = R(7) == 0 ? 0 : cfg->pages[R(cfg->npages)];
    s.seqused = !s.page_size ? KIT_SEQUSED_RANDOM : chunk ? (kit_seqused)R(2) : (kit_seqused)R(3);
    s.causal = chunk || R(3) == 0;
    if (R(5) == 0) {
        s.window_left = R(3) ? R(200) : -1;
        if (!s.causal) s.window_right = R(2) ? R(16) : -1;
    }
    if (R(6) == 0) s.softcap = 5.0f + (float)R(46);
    s.layout = (kit_layout)R(3);
    s.want_lse = R(4) != 0;
#undef R
    tp_shrink(&s, cfg->max_work);
    return s;
}

/* ---- named edges --------------------------------------------------------------- */

/* Every sequence reads sequence 0's pages (a shared prefix): one page in
 * several rows of the table. */
static inline void tp_shared_pages(kit_case *c)
{
    for (int b = 1; b < c->s.batch; b++) {
        memcpy(c->block_table + b * c->table_stride, c->block_table, (size_t)c->table_stride * sizeof(int32_t));
        c->seqused_k[b] = c->seqused_k[0];
    }
}

typedef struct tp_edge {
    const char *name;
    int batch, hq, hkv, sq, sk, d, page, causal, window_left;
    kit_seqused used;
    /* after the inputs are drawn, or NULL; it may not give a sequence keys
     * the draw left unused (the kit filled those rows with NaN) */
    void (*prep)(kit_case *c);
} tp_edge;

#define TP_NONE KIT_SEQUSED_NONE
#define TP_FULL KIT_SEQUSED_FULL
#define TP_RAND KIT_SEQUSED_RANDOM
#define TP_EMPTY KIT_SEQUSED_EMPTY
#define TP_FEW KIT_SEQUSED_FEW /* 0, 1, 2, 3 keys: with 8 causal queries most rows see none */
static const tp_edge tp_edges[] = {
    /* name                                   B  Hq  Hkv Sq   Sk    D    page  c  wl  used     prep */
    {"all sequences empty (paged, causal)",   3, 8,  2,  4,   100,  128, 16,   1, -1, TP_EMPTY, NULL},
    {"all sequences empty (dense seqused)",   2, 4,  4,  3,   50,   64,  0,    0, -1, TP_EMPTY, NULL},
    {"one page holds every key",              2, 4,  4,  3,   16,   64,  16,   0, -1, TP_FULL, NULL},
    {"one page, longer than the keys",        3, 4,  2,  2,   5,    128, 64,   1, -1, TP_RAND, NULL},
    {"page_size 1",                           3, 8,  1,  5,   37,   64,  1,    1, -1, TP_RAND, NULL},
    {"page_size 1, one key",                  1, 4,  4,  1,   1,    128, 1,    0, -1, TP_FULL, NULL},
    {"seqused 0..3 causal (empty rows)",      4, 4,  2,  8,   64,   64,  16,   1, -1, TP_FEW,  NULL},
    {"dense seqused decode",                  4, 8,  2,  1,   300,  128, 0,    0, -1, TP_RAND, NULL},
    {"dense seqused causal window",           3, 4,  4,  8,   200,  64,  0,    1, 16, TP_RAND, NULL},
    {"chunked prefill, page 64",              2, 8,  2,  128, 600,  128, 64,   1, -1, TP_FULL, NULL},
    {"chunked prefill, page 256, window",     1, 4,  4,  200, 900,  64,  256,  1, 64, TP_NONE, NULL},
    {"speculative gqa 8, page 3",             3, 16, 2,  4,   500,  64,  3,    1, -1, TP_RAND, NULL},
    {"decode, page 1024",                     2, 8,  2,  1,   3000, 128, 1024, 0, -1, TP_RAND, NULL},
    {"every sequence on the same pages",      3, 8,  2,  3,   200,  64,  16,   1, -1, TP_FULL, tp_shared_pages},
};
#define TP_NUM_EDGES ((int)(sizeof tp_edges / sizeof tp_edges[0]))

/* Edge i in dtype dt; the layouts take turns. */
static inline kit_shape tp_edge_shape(int i, fc_dtype dt)
{
    const tp_edge *e = &tp_edges[i];
    kit_shape s = test_shape(e->batch, e->hq, e->hkv, e->sq, e->sk, e->d, dt);
    s.page_size = e->page;
    s.seqused = e->used;
    s.causal = e->causal;
    s.window_left = e->window_left;
    s.layout = (kit_layout)(i % 3);
    return s;
}

/* ---- one case: the reference and the judge ------------------------------------------ */

typedef struct tp_ref {
    kit_case c;
    void *out; /* the fp64 reference's out and lse, in c's layout */
    float *lse;
} tp_ref;

static inline void tp_ref_free(tp_ref *r)
{
    free(r->out);
    free(r->lse);
    kit_case_free(&r->c);
    memset(r, 0, sizeof *r);
}

/* The case (prep applied), its reference (poisoned first) and the
 * reference's own check against the dense twin. 0, or -1 with why (free r
 * either way). */
static inline int tp_ref_init(fc_context *ctx, tp_ref *r, const kit_shape *s, uint64_t seed,
                              void (*prep)(kit_case *), char *why, size_t why_len)
{
    memset(r, 0, sizeof *r);
    if (kit_case_init(&r->c, s, seed) != 0) {
        snprintf(why, why_len, "kit_case_init failed (memory or shape)");
        return -1;
    }
    if (prep) prep(&r->c);
    r->out = malloc(r->c.out_bytes);
    r->lse = r->c.lse_bytes ? malloc(r->c.lse_bytes) : NULL;
    if (!r->out || (r->c.lse_bytes && !r->lse)) {
        snprintf(why, why_len, "out of host memory for the reference");
        return -1;
    }
    const fc_status st = test_reference(ctx, &r->c, r->out, r->lse);
    if (st != FC_OK) {
        snprintf(why, why_len, "reference: %s (%s)", fc_status_string(st), fc_last_error(ctx));
        return -1;
    }
    return kit_paged_reference_check(ctx, &r->c, r->out, r->lse, why, why_len) == 1 ? 0 : -1;
}

/* A backend's out/lse (poisoned before its call) against the reference:
 * the dtype's gates, every logical element written and nothing else, rows
 * with no visible key exactly 0 / -inf (in the reference too). 1 if all hold;
 * line gets the figures. */
static inline int tp_judge(const tp_ref *r, const void *out, const float *lse, char *line, size_t n)
{
    const kit_case *c = &r->c;
    const kit_gate g = kit_gate_for(c->s.dtype);
    kit_metrics m, mref;
    kit_compare(c, out, lse, r->out, r->lse, &g, &m);
    kit_compare(c, r->out, r->lse, r->out, r->lse, &g, &mref); /* the reference wrote everything */
    int64_t empty = 0, empty_ref = 0;
    const int64_t bad = kit_empty_rows(c, out, lse, &empty), bad_ref = kit_empty_rows(c, r->out, r->lse, &empty_ref);
    const int64_t stray = kit_stray_writes(c, out);
    snprintf(line, n,
             "max_abs %.2e rel_l2 %.2e bad %.3f%% lse_max %.2e | unwritten %lld nonfinite %lld lse_bad %lld "
             "stray %lld | empty rows %lld (bad %lld/%lld)",
             m.max_abs, m.rel_l2, m.pct_bad, m.lse_max_abs, (long long)(m.unwritten + mref.unwritten),
             (long long)m.nonfinite, (long long)(m.lse_bad + mref.lse_bad), (long long)stray, (long long)empty,
             (long long)bad, (long long)bad_ref);
    return kit_gate_pass(&m, &g) && mref.unwritten == 0 && mref.lse_bad == 0 && bad == 0 && bad_ref == 0 &&
           stray == 0;
}

/* "f16 d64 b3 h8/2 sq4 sk100 bshd page16 x7 (22 pages, stride 9) used 0,3,100 causal ..." */
static inline void tp_describe(const kit_case *c, char *buf, size_t n)
{
    const kit_shape *s = &c->s;
    int k = snprintf(buf, n, "%s d%d b%d h%d/%d sq%d sk%d %s", kit_dtype_name(s->dtype), s->head_dim, s->batch,
                     s->heads_q, s->heads_kv, s->seqlen_q, s->seqlen_k, kit_layout_name(s->layout));
    if (s->page_size && k > 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, " page%d x%d (%d pages, stride %lld%s)", s->page_size, c->max_pages,
                      c->num_pages, (long long)c->table_stride, c->args.block_table_stride ? "" : " as 0");
    for (int b = 0; c->seqused_k && b < s->batch && b < 6 && k > 0 && (size_t)k < n; b++)
        k += snprintf(buf + k, n - (size_t)k, "%s%d", b ? "," : " used ", c->seqused_k[b]);
    if (k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, "%s%s%s%s", s->causal ? " causal" : "",
                 s->window_left >= 0 || s->window_right >= 0 ? " window" : "", s->softcap > 0 ? " softcap" : "",
                 s->want_lse ? " lse" : "");
}

/* ---- the case lists ------------------------------------------------------------------ */

/* How a test runs one case (prep: after the inputs are drawn, or NULL). */
typedef void (*tp_run_fn)(void *user, const char *tag, const kit_shape *s, uint64_t seed, void (*prep)(kit_case *c));

/* n random configurations from seed, as a group. */
static inline void tp_random_cases(tp_run_fn run, void *user, const tp_config *cfg, int n, uint64_t seed)
{
    const int p0 = g_pass, f0 = g_fail;
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 0x9a6ed;
    for (int i = 0; i < n; i++) {
        const kit_shape s = tp_random_shape(&rng, cfg);
        char tag[32];
        snprintf(tag, sizeof tag, "random#%d", i);
        run(user, tag, &s, seed * 100000 + (uint64_t)i, NULL);
    }
    group_done("random configurations", p0, f0);
}

/* Every named edge in each of the dtypes, as a group. */
static inline void tp_edge_cases(tp_run_fn run, void *user, const fc_dtype *dtypes, int ndtypes)
{
    const int p0 = g_pass, f0 = g_fail;
    for (int t = 0; t < ndtypes; t++)
        for (int i = 0; i < TP_NUM_EDGES; i++) {
            const kit_shape s = tp_edge_shape(i, dtypes[t]);
            run(user, tp_edges[i].name, &s, 500 + (uint64_t)i, tp_edges[i].prep);
        }
    group_done("named edges", p0, f0);
}

/* ---- what the cases reached ---------------------------------------------------------- */

enum {
    TP_SEEN_SPARE,      /* pages no sequence uses                        */
    TP_SEEN_PAD,        /* a table stride above max_pages                */
    TP_SEEN_STRIDE0,    /* block_table_stride 0 (the default)            */
    TP_SEEN_UNUSED,     /* out-of-range entries past a sequence's pages  */
    TP_SEEN_HEADS_MAJOR,/* [pages, heads, page, dim] storage             */
    TP_SEEN_USED0,      /* a sequence with no key                        */
    TP_SEEN_USED1,      /* a sequence with one key                       */
    TP_SEEN_FULL,       /* a sequence using its whole capacity           */
    TP_SEEN_DENSE,      /* seqused_k with dense k/v                      */
    TP_SEEN_N
};
static const char *const tp_seen_names[TP_SEEN_N] = {
    "spare pages", "table row padding", "block_table_stride 0", "unused out-of-range entries",
    "[pages, heads, page, dim] storage", "seqused_k 0", "seqused_k 1", "seqused_k = capacity",
    "seqused_k with dense k/v"};

/* Count the features of c into seen[TP_SEEN_N]. */
static inline void tp_note(const kit_case *c, int *seen)
{
    const int64_t cap = kit_case_capacity(c);
    seen[TP_SEEN_SPARE] += c->block_table && c->num_pages > c->s.batch * c->max_pages;
    seen[TP_SEEN_PAD] += c->block_table && c->table_stride > c->max_pages;
    seen[TP_SEEN_STRIDE0] += c->block_table && c->args.block_table_stride == 0;
    seen[TP_SEEN_HEADS_MAJOR] += c->block_table && c->s.layout == KIT_LAYOUT_BHSD;
    seen[TP_SEEN_DENSE] += !c->block_table && c->seqused_k;
    for (int b = 0; b < c->s.batch; b++) {
        const int64_t keys = kit_case_keys(c, b);
        seen[TP_SEEN_USED0] += c->seqused_k && keys == 0;
        seen[TP_SEEN_USED1] += c->seqused_k && keys == 1;
        seen[TP_SEEN_FULL] += c->seqused_k && keys == cap;
        seen[TP_SEEN_UNUSED] += c->block_table && c->s.page_size * (int64_t)c->max_pages - keys >= c->s.page_size;
    }
}

static inline void tp_check_seen(const int *seen)
{
    for (int i = 0; i < TP_SEEN_N; i++)
        CHECK(seen[i] > 0, "no case had %s", tp_seen_names[i]);
}

#endif /* FC_TEST_PAGED_H */
