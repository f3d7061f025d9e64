/*
 * paged_check.c -- what is asked of a paged or seqused_k call beyond the
 * common checks: a corrupt one gets the status its kind names whenever
 * the same call with clean arrays (its twin) is accepted; a successful one
 * matches the reference, and the reference's paged answer equals, bit for
 * bit, its answer on a dense copy of the keys the sequences use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"

/* An int32 array the twin reads, where the call's backend reads memory. */
static int32_t *twin_array(const int32_t *from, int64_t n, void **mem)
{
    const size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(int32_t);
    int32_t *p = fz_cuda_mode ? fz_device_alloc(bytes) : malloc(bytes);
    if (!p) fz_fail("harness", "cannot allocate a twin array");
    memcpy(p, from, (size_t)n * sizeof(int32_t));
    *mem = p;
    return p;
}

/* a's block_table and seqused_k as the clean twin has them. */
static void twin_args(const fz_call *c, fc_attention_args *a, void **mem)
{
    const fz_paged *g = &c->pg;
    a->block_table = NULL;
    a->seqused_k = NULL;
    if (c->varlen || c->bwd) return; /* the twin is the call without the arrays */
    if (g->table_on) a->block_table = twin_array(g->clean, g->table_n, &mem[0]);
    if (g->used_on) a->seqused_k = twin_array(g->used_clean, g->batch, &mem[1]);
    a->max_pages_per_seq = g->max_pages;
    a->block_table_stride = g->clean_arg_stride;
}

void fz_check_expected(fc_context *ctx, const fz_call *c, fc_status st, fz_twin_fn supported)
{
    if (!c->pg.known || c->args_null) return;
    fc_attention_args a = c->a;
    void *mem[2] = {NULL, NULL};
    twin_args(c, &a, mem);
    const fc_status twin = supported(ctx, c, &a);
    fz_check_status(ctx, twin, "supported (the clean twin)");
    for (int i = 0; i < 2; i++) {
        if (fz_cuda_mode && mem[i]) fz_device_free(mem[i]);
        else free(mem[i]);
    }
    if (twin != FC_OK) {
        if (st == FC_OK)
            fz_fail("paged-status", "FC_OK where the same call with clean arrays gets %s", fc_status_string(twin));
        return;
    }
    if (st != c->pg.expect)
        fz_fail("paged-status", "%s where %s is expected (the same call with clean arrays is accepted)",
                fc_status_string(st), fc_status_string(c->pg.expect));
}

/* ---- the reference against itself ------------------------------------------------ */

/* A contiguous [B, L, heads, d] copy of t's used keys (pristine arena),
 * the NaN payload where a sequence has no key. */
static fc_tensor gather(const fz_call *c, const fc_tensor *t, int64_t L)
{
    const int64_t B = c->pg.batch, H = t->shape[2], D = t->shape[3], es = (int64_t)fz_dtype_size(t->dtype);
    fc_tensor d = {.dtype = t->dtype, .ndim = 4, .shape = {B, L, H, D}, .stride = {L * H * D, H * D, D, 1}};
    if (!(d.data = malloc((size_t)(B * L * H * D * es)))) fz_fail("harness", "cannot allocate a dense twin");
    for (int64_t i = 0; i < B * L * H * D; i++) fz_store_nan(&d, i);
    const uint8_t *src = c->ar.copy + ((const uint8_t *)t->data - c->ar.base);
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < fz_paged_keys(c, b); j++) {
            const int64_t from = fz_paged_key_offset(c, t, b, j);
            for (int64_t h = 0; h < H; h++)
                for (int64_t x = 0; x < D; x++)
                    memcpy((uint8_t *)d.data + (((b * L + j) * H + h) * D + x) * es,
                           src + (from + h * t->stride[2] + x * t->stride[3]) * es, (size_t)es);
        }
    return d;
}

/* A contiguous tensor like t (out, or lse [B, H, S]) to receive an answer. */
static fc_tensor blank_like(const fc_tensor *t)
{
    fc_tensor d = *t;
    int64_t n = 1;
    for (int i = t->ndim - 1; i >= 0; i--) { d.stride[i] = n; n *= t->shape[i]; }
    if (!(d.data = malloc((size_t)n * fz_dtype_size(t->dtype)))) fz_fail("harness", "cannot allocate a dense twin");
    return d;
}

/* Elements of the answers (reference arena r, dense twin d) whose bits differ. */
static int64_t bits_differ(const fz_call *c, const fz_arena *r, const fc_attention_args *d)
{
    const fc_tensor *o = &c->a.out, *l = &c->a.lse;
    const int64_t B = o->shape[0], S = o->shape[1], H = o->shape[2], D = o->shape[3];
    const size_t es = fz_dtype_size(o->dtype);
    const uint8_t *ro = fz_rebase(c, r, o->data), *rl = fz_rebase(c, r, l->data);
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                for (int64_t x = 0; x < D; x++)
                    n += memcmp(ro + fz_elem_offset(o, 0, b * S + s, h, x) * (int64_t)es,
                                (const uint8_t *)d->out.data + (((b * S + s) * H + h) * D + x) * (int64_t)es, es) != 0;
                if (rl) n += memcmp(rl + 4 * (b * l->stride[0] + h * l->stride[1] + s * l->stride[2]),
                                    (const float *)d->lse.data + (b * H + h) * S + s, 4) != 0;
            }
    return n;
}

void fz_paged_cross_check(const fz_call *c, const fz_arena *r)
{
    if (!c->pg.pool && !c->pg.used_on) return;
    int64_t L = 1;
    for (int b = 0; b < c->pg.batch; b++)
        if (fz_paged_keys(c, b) > L) L = fz_paged_keys(c, b);
    fc_attention_args d = c->a;
    d.q.data = fz_rebase(c, r, c->a.q.data);
    d.k = gather(c, &c->a.k, L);
    d.v = gather(c, &c->a.v, L);
    d.out = blank_like(&c->a.out);
    if (c->a.lse.data) d.lse = blank_like(&c->a.lse);
    d.block_table = NULL;
    d.max_pages_per_seq = 0;
    d.block_table_stride = 0;
    d.seqused_k = c->pg.used_on ? c->pg.used : NULL;
    d.backend = FC_BACKEND_CPU_REFERENCE;
    fc_context *ctx;
    if (fc_context_create(&ctx) != FC_OK) fz_fail("harness", "fc_context_create failed");
    const fc_status st = fc_attention_forward(ctx, &d, NULL, NULL);
    if (st != FC_OK)
        fz_fail("paged-twin", "the reference refuses the dense twin: %s (%s)", fc_status_string(st), fc_last_error(ctx));
    const int64_t n = bits_differ(c, r, &d);
    if (n) fz_fail("paged-twin", "the reference's paged answer and its dense twin's differ in %lld elements", (long long)n);
    fc_context_free(ctx);
    free(d.k.data);
    free(d.v.data);
    free(d.out.data);
    free(d.lse.data);
}
