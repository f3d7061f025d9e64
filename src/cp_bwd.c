/*
 * cp_bwd.c -- context parallelism's backward over the caller's ring
 * (fc_cp_attention_backward, flashcore.h). The K/V slices go round as in
 * the forward, and one step behind each, the fp32 dK/dV sums of that slice
 * so far. Each (query chunk, key chunk) pair the mask lets through is one
 * fc_attention_backward against the whole sequence's out and lse (which
 * makes the pairs' gradients add up to the whole call's): its dq is added
 * into the rank's fp32 dq, its dk and dv into the held slice's sums, which
 * then travel on; after the last step every slice's sums are home.
 */
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "cp.h"
#include "cpu/cpu_dtype.h"
#include "internal.h"

typedef struct cpb_run {
    const fc_attention_backward_args *a;
    const fc_cp_comm *comm;
    fc_cp_dims n;             /* the slice's sizes                           */
    size_t kv_bytes;          /* the packed K/V slice: k then v, q's dtype   */
    size_t n_kv;              /* floats in one slice's dK (and in its dV)    */
    char *kv[2];              /* the ring's double buffer                    */
    float *dq;                /* [b][2c][hq][d] the rank's dq, fp32          */
    float *sums[2];           /* dK then dV of the held slice: built, arrived */
    float *g[3];              /* one pair's dq, dk, dv in fp32               */
} cpb_run;

static void store(char *p, fc_dtype dt, size_t i, float x)
{
    uint16_t *h = (uint16_t *)(void *)p;
    if (dt == FC_DTYPE_F32) ((float *)(void *)p)[i] = x;
    else h[i] = dt == FC_DTYPE_F16 ? fc_f32_to_f16(x) : fc_f32_to_bf16(x);
}

static fc_status cpb_alloc(fc_context *ctx, cpb_run *r)
{
    const size_t kv = fc_cp_up64(r->kv_bytes), dq = fc_cp_up64((size_t)(r->n.b * 2 * r->n.c * r->n.hq * r->n.d) * 4);
    const size_t sums = fc_cp_up64(2 * r->n_kv * 4), gq = fc_cp_up64((size_t)(r->n.b * r->n.c * r->n.hq * r->n.d) * 4);
    const size_t gk = fc_cp_up64((size_t)(r->n.b * r->n.c * r->n.hkv * r->n.d) * 4);
    const size_t bytes = 2 * kv + dq + 2 * sums + gq + 2 * gk;
    char *m = calloc(1, bytes);
    if (!m) return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of ring scratch", bytes);
    r->kv[0] = m;
    r->kv[1] = m + kv;
    r->dq = (float *)(void *)(m + 2 * kv);
    r->sums[0] = (float *)(void *)(m + 2 * kv + dq);
    r->sums[1] = (float *)(void *)(m + 2 * kv + dq + sums);
    r->g[0] = (float *)(void *)(m + 2 * kv + dq + 2 * sums);
    r->g[1] = (float *)(void *)(m + 2 * kv + dq + 2 * sums + gq);
    r->g[2] = (float *)(void *)(m + 2 * kv + dq + 2 * sums + gq + gk);
    return FC_OK;
}

/* acc rows [r0, r0 + c) of a [b][rows][h][d] fp32 array += one pair's
 * gradient g ([b][c][h][d]). */
static void add_rows(float *acc, int64_t rows, int64_t r0, const float *g, const cpb_run *r, int64_t h)
{
    const int64_t row = h * r->n.d;
    for (int64_t b = 0; b < r->n.b; b++)
        for (int64_t i = 0; i < r->n.c; i++) {
            float *x = acc + ((b * rows + r0 + i) * row);
            const size_t at = (size_t)((b * r->n.c + i) * row);
            for (int64_t e = 0; e < row; e++) x[e] += g[at + (size_t)e];
        }
}

/* The pair (query chunk qi, key chunk kj of the held slice in kv). */
static fc_status cpb_pair(fc_context *ctx, cpb_run *r, const char *kv, int qi, int kj, int causal, void *stream)
{
    const fc_attention_backward_args *a = r->a;
    const fc_dtype dt = a->fwd.q.dtype;
    const size_t chunk = (size_t)(r->n.c * r->n.hkv * r->n.d) * r->n.es;
    fc_attention_backward_args sub = *a;
    sub.fwd.causal = causal;
    sub.fwd.q = fc_cp_rows(&a->fwd.q, qi * r->n.c, r->n.c, r->n.es, 0);
    sub.fwd.k = fc_cp_tensor4((char *)kv + kj * chunk, dt, r->n.b, r->n.c, r->n.hkv, r->n.d);
    sub.fwd.v = fc_cp_tensor4((char *)kv + r->kv_bytes / 2 + kj * chunk, dt, r->n.b, r->n.c, r->n.hkv, r->n.d);
    sub.fwd.k.stride[0] = sub.fwd.v.stride[0] = 2 * r->n.c * r->n.hkv * r->n.d;
    sub.fwd.out = fc_cp_rows(&a->fwd.out, qi * r->n.c, r->n.c, r->n.es, 0);
    sub.fwd.lse = fc_cp_rows(&a->fwd.lse, qi * r->n.c, r->n.c, sizeof(float), 1);
    sub.dout = fc_cp_rows(&a->dout, qi * r->n.c, r->n.c, r->n.es, 0);
    /* fp32 gradients: the pairs' sums are rounded once, at the end */
    sub.dq = fc_cp_tensor4(r->g[0], FC_DTYPE_F32, r->n.b, r->n.c, r->n.hq, r->n.d);
    sub.dk = fc_cp_tensor4(r->g[1], FC_DTYPE_F32, r->n.b, r->n.c, r->n.hkv, r->n.d);
    sub.dv = fc_cp_tensor4(r->g[2], FC_DTYPE_F32, r->n.b, r->n.c, r->n.hkv, r->n.d);
    sub.workspace = NULL;
    sub.workspace_bytes = 0;
    const fc_status st = fc_attention_backward(ctx, &sub, stream, NULL);
    if (st) return st;
    add_rows(r->dq, 2 * r->n.c, qi * r->n.c, r->g[0], r, r->n.hq);
    add_rows(r->sums[0], 2 * r->n.c, kj * r->n.c, r->g[1], r, r->n.hkv);
    add_rows(r->sums[0] + r->n_kv, 2 * r->n.c, kj * r->n.c, r->g[2], r, r->n.hkv);
    return FC_OK;
}

/* Step s: the held slice is src's; sums[0] gets its gradients here, plus
 * (s > 0) those that arrived with it in sums[1]; then they move on. */
static fc_status cpb_step(fc_context *ctx, cpb_run *r, const char *kv, int s, void *stream)
{
    const int P = r->comm->size, rank = r->comm->rank, src = (rank - s + P) % P;
    memset(r->sums[0], 0, 2 * r->n_kv * sizeof(float));
    for (int qi = 0; qi < 2; qi++)
        for (int kj = 0; kj < 2; kj++) {
            const int gq = fc_cp_chunk(r->comm, rank, qi), gk = fc_cp_chunk(r->comm, src, kj);
            if (r->a->fwd.causal && gk > gq) continue;
            const fc_status st = cpb_pair(ctx, r, kv, qi, kj, r->a->fwd.causal && gk == gq, stream);
            if (st) return st;
        }
    if (s > 0)
        for (size_t i = 0; i < 2 * r->n_kv; i++) r->sums[0][i] += r->sums[1][i];
    if (P == 1) return FC_OK;
    const fc_status st = r->comm->exchange(r->comm->user, r->sums[0], r->sums[1], 2 * r->n_kv * sizeof(float), stream);
    return st ? fc_set_error(ctx, st, "the ring's exchange of dK/dV at step %d of %d returned %s", s + 1, P,
                             fc_status_string(st))
              : FC_OK;
}

/* acc ([b][rows][h][d] fp32) into the strided t in its dtype. */
static void write_out(const float *acc, const fc_tensor *t, const cpb_run *r)
{
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t s = 0; s < t->shape[1]; s++)
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t e = 0; e < t->shape[3]; e++)
                    store((char *)t->data, t->dtype,
                          (size_t)(b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + e * t->stride[3]),
                          acc[((b * t->shape[1] + s) * t->shape[2] + h) * r->n.d + e]);
}

static fc_status cpb_ring(fc_context *ctx, cpb_run *r, void *stream)
{
    const int P = r->comm->size;
    fc_cp_pack(&r->a->fwd, r->n.b, 2 * r->n.c, r->n.hkv, r->n.d, r->n.es, r->kv[0]);
    int cur = 0;
    for (int s = 0; s < P; s++) {
        fc_status st = cpb_step(ctx, r, r->kv[cur], s, stream);
        if (!st && s + 1 < P) {
            st = r->comm->exchange(r->comm->user, r->kv[cur], r->kv[cur ^ 1], r->kv_bytes, stream);
            if (st) fc_set_error(ctx, st, "the ring's exchange at step %d of %d returned %s", s + 1, P,
                                 fc_status_string(st));
            cur ^= 1;
        }
        if (st) return st;
    }
    const float *home = P == 1 ? r->sums[0] : r->sums[1]; /* the rank's own slice, back from its tour */
    write_out(r->dq, &r->a->dq, r);
    write_out(home, &r->a->dk, r);
    write_out(home + r->n_kv, &r->a->dv, r);
    return FC_OK;
}

fc_status fc_cp_attention_backward(fc_context *ctx, const fc_attention_backward_args *args, const fc_cp_comm *comm,
                                   void *stream)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    static const char what[] = "fc_cp_attention_backward";
    fc_status st = fc_cp_comm_ok(ctx, args, comm, what);
    if (st) return st;
    const fc_attention_args *f = &args->fwd;
    st = fc_cp_checks(ctx, f, what);
    if (!st) st = fc_attention_backward_supported(ctx, args, NULL);
    const void *ptrs[9] = {f->q.data, f->k.data, f->v.data, f->out.data, f->lse.data,
                           args->dout.data, args->dq.data, args->dk.data, args->dv.data};
    if (!st) st = fc_cp_slice(ctx, f, ptrs, 9, what);
    st = fc_cp_agree(ctx, comm, st, fc_cp_digest(f, 2), what);
    if (st) return st;
    cpb_run r = {.a = args, .comm = comm, .n = fc_cp_dims_of(f)};
    r.n_kv = (size_t)(r.n.b * 2 * r.n.c * r.n.hkv * r.n.d);
    r.kv_bytes = 2 * r.n_kv * r.n.es;
    st = cpb_alloc(ctx, &r);
    if (st) return st;
    st = cpb_ring(ctx, &r, stream);
    free(r.kv[0]);
    return st;
}
