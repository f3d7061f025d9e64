/*
 * test_append.h -- what the append tests share (test_append.c on the CPU
 * backends, test_cuda_paged.c's append group on CUDA): a paged or dense
 * cache case (kit, with room for the new keys), k_new / v_new and RoPE
 * tables, and the oracle, computed here and not by the library's append
 * step: the cache after the append and q rotated, in double, then the fp64
 * reference attention over them. A backend's call with k_new is judged on
 * its output (the kit's gates, every element written, empty rows) and on
 * the cache it leaves: v bit for bit, k within one rounding of the
 * oracle's, every other element untouched.
 *
 * Header-only (static), like test_paged.h.
 */
#ifndef FC_TEST_APPEND_H
#define FC_TEST_APPEND_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_paged.h"
#include "test_util.h"

typedef struct ta_case {
    tp_ref r;                  /* r.c: the case, its k/v the cache before the append;
                                * r.out/lse: the oracle's attention              */
    void *k0, *v0;             /* the cache before, kept                          */
    void *k_exp, *v_exp;       /* the oracle's cache after                        */
    void *q_rot;               /* the oracle's rotated q                          */
} ta_case;                     /* k_new, v_new, the tables: r.c's (kit_append.c)  */

static inline void ta_free(ta_case *t)
{
    free(t->k0); free(t->v0); free(t->k_exp); free(t->v_exp); free(t->q_rot);
    tp_ref_free(&t->r);
    memset(t, 0, sizeof *t);
}

/* x (head_dim doubles) rotated to position pos with t's tables. */
static inline void ta_rotate(const ta_case *t, int64_t pos, double *x)
{
    const kit_case *kc = &t->r.c;
    const int half = kc->s.rotary_dim / 2, il = kc->s.rotary_interleaved;
    const fc_dtype dt = kc->s.dtype;
    for (int i = 0; i < half; i++) {
        const double c = kit_load(kc->rot_cos, dt, pos * half + i), s = kit_load(kc->rot_sin, dt, pos * half + i);
        const int a = il ? 2 * i : i, b = il ? 2 * i + 1 : i + half;
        const double xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xb * c + xa * s;
    }
}

/* The oracle's cache: k_new rows (rotated) and v_new rows at their keys. */
static inline void ta_oracle_cache(ta_case *t)
{
    const kit_case *c = &t->r.c;
    const kit_shape *s = &c->s;
    const int d = s->head_dim;
    double x[512];
    memcpy(t->k_exp, c->k, c->k_bytes);
    memcpy(t->v_exp, c->v, c->v_bytes);
    for (int b = 0; b < s->batch; b++)
        for (int n = 0; n < s->append; n++)
            for (int h = 0; h < s->heads_kv; h++) {
                const int64_t j = c->seqused_k[b] + n, src = (((int64_t)b * s->append + n) * s->heads_kv + h) * d;
                const int64_t kd = kit_key_offset(c, b, j) + h * c->args.k.stride[2], vd = kd; /* same strides */
                for (int e = 0; e < d; e++) x[e] = kit_load(t->r.c.k_new, s->dtype, src + e);
                if (t->r.c.s.rotary_dim) ta_rotate(t, j, x);
                for (int e = 0; e < d; e++) {
                    kit_store(t->k_exp, s->dtype, kd + e, (float)x[e]);
                    kit_store(t->v_exp, s->dtype, vd + e, kit_load(t->r.c.v_new, s->dtype, src + e));
                }
            }
}

/* The oracle's q: rotated (when rotary) into q_rot, [batch, sq, hq, d];
 * rows at seqused_k[b] + i when a mask applies, else all at seqused_k[b]. */
static inline void ta_oracle_q(ta_case *t)
{
    const kit_case *c = &t->r.c;
    const kit_shape *s = &c->s;
    const int d = s->head_dim, step = s->causal || s->window_left >= 0 || s->window_right >= 0;
    double x[512];
    for (int b = 0; b < s->batch; b++)
        for (int i = 0; i < s->seqlen_q; i++)
            for (int h = 0; h < s->heads_q; h++) {
                const fc_tensor *q = &c->args.q;
                const int64_t src = b * q->stride[0] + i * q->stride[1] + h * q->stride[2];
                const int64_t dst = (((int64_t)b * s->seqlen_q + i) * s->heads_q + h) * d;
                for (int e = 0; e < d; e++) x[e] = kit_load(c->q, s->dtype, src + e);
                if (t->r.c.s.rotary_dim) ta_rotate(t, c->seqused_k[b] + (int64_t)i * step, x);
                for (int e = 0; e < d; e++) kit_store(t->q_rot, s->dtype, dst + e, (float)x[e]);
            }
}

/* The fp64 reference over the oracle's cache and q: r.out / r.lse. */
static inline fc_status ta_oracle_attention(fc_context *ctx, ta_case *t, int32_t *used)
{
    kit_case *c = &t->r.c;
    const kit_shape *s = &c->s;
    fc_attention_args a = c->args;
    a.q = kit_contiguous(t->q_rot, s->dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim);
    a.k.data = t->k_exp;
    a.v.data = t->v_exp;
    for (int b = 0; b < s->batch; b++) used[b] = c->seqused_k[b] + s->append;
    a.seqused_k = used;
    a.out.data = t->r.out;
    if (c->lse) a.lse.data = t->r.lse;
    a.k_new.data = a.v_new.data = a.rotary_cos.data = a.rotary_sin.data = NULL; /* done by the oracle */
    a.backend = FC_BACKEND_CPU_REFERENCE;
    kit_poison(t->r.out, c->out_bytes, s->dtype, t->r.lse, c->lse_bytes);
    return fc_attention_forward(ctx, &a, NULL, NULL);
}

/* The case, its inputs and the oracle. 0, or -1 with why. */
static inline int ta_init(fc_context *ctx, ta_case *t, const kit_shape *s, uint64_t seed, char *why, size_t why_len)
{
    memset(t, 0, sizeof *t);
    kit_case *c = &t->r.c;
    if (kit_case_init(c, s, seed) != 0) {
        snprintf(why, why_len, "kit_case_init failed (memory or shape)");
        return -1;
    }
    t->r.out = malloc(c->out_bytes);
    t->r.lse = c->lse_bytes ? malloc(c->lse_bytes) : NULL;
    t->k0 = malloc(c->k_bytes), t->v0 = malloc(c->v_bytes);
    t->k_exp = malloc(c->k_bytes), t->v_exp = malloc(c->v_bytes);
    t->q_rot = malloc((size_t)s->batch * s->seqlen_q * s->heads_q * s->head_dim * kit_dtype_size(s->dtype) + 1);
    int32_t *used = malloc((size_t)s->batch * sizeof(int32_t));
    if (!t->r.out || (c->lse_bytes && !t->r.lse) || !t->k0 || !t->v0 || !t->k_exp || !t->v_exp || !t->q_rot ||
        !used) {
        free(used);
        snprintf(why, why_len, "out of host memory");
        return -1;
    }
    memcpy(t->k0, c->k, c->k_bytes);
    memcpy(t->v0, c->v, c->v_bytes);
    ta_oracle_cache(t);
    ta_oracle_q(t);
    const fc_status st = ta_oracle_attention(ctx, t, used);
    free(used);
    if (st != FC_OK) {
        snprintf(why, why_len, "oracle attention: %s (%s)", fc_status_string(st), fc_last_error(ctx));
        return -1;
    }
    return 0;
}

/* Cache elements off the oracle's: v bit for bit, k within one rounding
 * (the oracle rounds from double, a backend from its own precision). */
static inline int64_t ta_cache_bad(const ta_case *t, const void *k, const void *v)
{
    const kit_case *c = &t->r.c;
    const fc_dtype dt = c->s.dtype;
    const double eps = dt == FC_DTYPE_F32 ? 0x1p-23 : dt == FC_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
    const size_t es = kit_dtype_size(dt);
    int64_t bad = 0;
    for (int64_t i = 0; i < (int64_t)(c->k_bytes / es); i++) {
        if (!memcmp((const char *)k + i * es, (const char *)t->k_exp + i * es, es)) continue;
        const double x = kit_load(k, dt, i), y = kit_load(t->k_exp, dt, i);
        bad += !(fabs(x - y) <= eps * fabs(y) + 1e-6);
    }
    for (int64_t i = 0; i < (int64_t)(c->v_bytes / es); i++)
        bad += memcmp((const char *)v + i * es, (const char *)t->v_exp + i * es, es) != 0;
    return bad;
}

/* A backend's out / lse and cache against the oracle; 1 if all hold. */
static inline int ta_judge(const ta_case *t, const void *out, const float *lse, const void *k, const void *v,
                           char *line, size_t n)
{
    char judge[400];
    const int ok = tp_judge(&t->r, out, lse, judge, sizeof judge);
    const int64_t bad = ta_cache_bad(t, k, v);
    snprintf(line, n, "%s | cache off %lld", judge, (long long)bad);
    return ok && bad == 0;
}

/* "... append 5 rotary 64 interleaved" */
static inline void ta_describe(const ta_case *t, char *buf, size_t n)
{
    char d[300];
    tp_describe(&t->r.c, d, sizeof d);
    const kit_shape *s = &t->r.c.s;
    snprintf(buf, n, "%s append %d rotary %d%s", d, s->append, s->rotary_dim,
             s->rotary_dim ? (s->rotary_interleaved ? " interleaved" : " half") : "");
}

/* ---- the cases ----------------------------------------------------------------- */

/* Decode and speculative steps (1-6 new keys, as many queries or one)
 * into dense or paged caches (page sizes of `pages`, 0 = dense), appends
 * that cross pages, empty caches, rotary off / full / partial in both
 * pairings, causal or not. */
static inline kit_shape ta_random_spec(uint64_t *rng, const int *pages, int npages, const int *dims, int ndims,
                                     const fc_dtype *dtypes, int ndtypes)
{
#define R(n) ((int)(kit_rand_u64(rng) % (uint64_t)(n)))
    static const int keys[] = {8, 33, 100, 300, 1000};
    const int hkv = 1 + R(2), ratio = R(2) ? 1 : 4, append = 1 + R(6);
    const int d = dims[R(ndims)];
    kit_shape s = test_shape(1 + R(3), hkv * ratio, hkv, R(3) ? append : 1, keys[R(5)] + append, d, dtypes[R(ndtypes)]);
    s.page_size = pages[R(npages)];
    s.seqused = R(4) ? KIT_SEQUSED_RANDOM : KIT_SEQUSED_FULL;
    s.append = append;
    s.causal = R(2);
    s.layout = (kit_layout)R(3);
    s.want_lse = R(2);
    const int rot = R(4);
    s.rotary_dim = rot == 0 ? 0 : rot == 1 ? d / 2 : d;
    s.rotary_interleaved = R(2);
#undef R
    return s;
}

/* The named edges: the first keys of an empty cache, an append that fills
 * the cache, page size 1, appends over several pages of 3, a one-query
 * decode step with rotary at position 0. */
static const struct {
    const char *name;
    int batch, hq, hkv, sq, sk, d, page, causal, append, rotary, interleaved;
    kit_seqused used;
} ta_edges[] = {
    /* name                             B  Hq Hkv Sq Sk   D    page c  new rot int used */
    {"empty caches, causal rotary",     2, 4, 2,  3, 40,  64,  16,  1, 3,  64, 0, KIT_SEQUSED_EMPTY},
    {"append fills the cache",          2, 4, 4,  1, 48,  128, 16,  0, 4,  128, 1, KIT_SEQUSED_FULL},
    {"page_size 1",                     3, 8, 2,  2, 20,  64,  1,   1, 2,  32, 1, KIT_SEQUSED_RANDOM},
    {"page 3, across pages",            2, 4, 1,  7, 60,  128, 3,   1, 7,  128, 0, KIT_SEQUSED_RANDOM},
    {"dense cache, no rotary",          3, 8, 8,  1, 200, 64,  0,   0, 1,  0,  0, KIT_SEQUSED_RANDOM},
};
#define TA_NUM_EDGES ((int)(sizeof ta_edges / sizeof ta_edges[0]))

static inline kit_shape ta_edge_spec(int i, fc_dtype dt)
{
    kit_shape s = test_shape(ta_edges[i].batch, ta_edges[i].hq, ta_edges[i].hkv, ta_edges[i].sq, ta_edges[i].sk,
                      ta_edges[i].d, dt);
    s.page_size = ta_edges[i].page;
    s.causal = ta_edges[i].causal;
    s.append = ta_edges[i].append;
    s.seqused = ta_edges[i].used;
    s.rotary_dim = ta_edges[i].rotary;
    s.rotary_interleaved = ta_edges[i].interleaved;
    return s;
}

#endif /* FC_TEST_APPEND_H */
