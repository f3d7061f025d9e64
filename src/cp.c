/*
 * cp.c -- context parallelism over the caller's ring transport
 * (fc_cp_attention_forward, flashcore.h): the zigzag ring forward, one
 * fc_attention_forward per (query chunk, key chunk) pair the mask lets
 * through, each merged by fc_attention_merge into an fp32 accumulator per
 * query chunk in ring order, and the K/V slice handed on between steps
 * through a double buffer.
 */
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "flashcore.h"
#include "internal.h"
#include "memory_space.h"

/* One rank's call: the chunk sizes and its host scratch. */
typedef struct cp_run {
    const fc_attention_args *a;
    const fc_cp_comm *comm;
    int64_t b, c, hq, hkv, d; /* batch, chunk rows, heads, head_dim        */
    size_t es;                /* bytes per element of q, k, v and out     */
    size_t kv_bytes;          /* a packed slice: k then v, [b][2c][hkv][d] */
    char *kv[2];              /* the ring's double buffer                 */
    char *part;               /* [b][c][hq][d] one pair's out, q's dtype  */
    float *part_lse;          /* [b][hq][c]                               */
    float *acc[2][2];         /* per query chunk, ping-pong: [b][c][hq][d] */
    float *acc_lse[2][2];     /* [b][hq][c]                               */
    int parts[2], ping[2];    /* parts merged so far; which acc holds them */
} cp_run;

static fc_tensor tensor4(void *data, fc_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    fc_tensor t = {data, dt, 4, {n0, n1, n2, n3}, {n1 * n2 * n3, n2 * n3, n3, 1}};
    return t;
}

static fc_tensor lse3(float *data, int64_t b, int64_t h, int64_t s)
{
    fc_tensor t = {data, FC_DTYPE_F32, 3, {b, h, s, 0}, {h * s, s, 1, 0}};
    return t;
}

/* Rows [r0, r0 + n) of a [b][s][h][d] tensor (lse: [b][h][s]) as a view. */
static fc_tensor rows_of(const fc_tensor *t, int64_t r0, int64_t n, size_t es, int lse)
{
    fc_tensor v = *t;
    const int axis = lse ? 2 : 1;
    if (v.data) v.data = (char *)v.data + (size_t)(r0 * t->stride[axis]) * es;
    v.shape[axis] = n;
    return v;
}

/* What the ring does not take, and the comm's own fields. */
static fc_status cp_checks(fc_context *ctx, const fc_attention_args *a, const fc_cp_comm *c)
{
    if (!a || !c) return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "args and comm must not be NULL");
    if (c->size < 1 || c->rank < 0 || c->rank >= c->size || !c->exchange)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "comm: rank %d of size %d with %s exchange (need 0 <= rank < size, a function)",
                            (int)c->rank, (int)c->size, c->exchange ? "an" : "no");
    if (a->cu_seqlens_q || a->cu_seqlens_k || a->block_table || a->seqused_k || a->k_new.data ||
        a->window_left != -1 || a->window_right != -1)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "fc_cp_attention_forward takes dense calls only: no varlen, paged cache, append or "
                            "window");
    if (fc_dtype_is_fp8(a->q.dtype) || fc_dtype_is_fp8(a->k.dtype))
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED, "fc_cp_attention_forward does not take FP8 inputs");
    if (a->backend == FC_BACKEND_CUDA)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "fc_cp_attention_forward runs on host memory only for now (flashcore.distributed "
                            "runs the ring on GPUs)");
    return FC_OK;
}

/* The slice as one plain forward call (every tensor check), its two
 * chunks, and host memory. */
static fc_status cp_slice(fc_context *ctx, const fc_attention_args *a)
{
    fc_status st = fc_attention_supported(ctx, a, NULL);
    if (st) return st;
    if (a->q.shape[1] != a->k.shape[1] || a->q.shape[1] % 2)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "the rank's slice holds two chunks of one length: seqlen_q (%lld) == seqlen_k "
                            "(%lld), even", (long long)a->q.shape[1], (long long)a->k.shape[1]);
    const void *ptrs[5] = {a->q.data, a->k.data, a->v.data, a->out.data, a->lse.data};
    unsigned char dev[5] = {0};
    fc_cuda_device_pointers(ptrs, 5, dev);
    for (int i = 0; i < 5; i++)
        if (dev[i])
            return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                                "fc_cp_attention_forward runs on host memory only for now (flashcore.distributed "
                                "runs the ring on GPUs)");
    return FC_OK;
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The scratch in one block, each region 64-byte aligned. */
static fc_status cp_alloc(fc_context *ctx, cp_run *r)
{
    const size_t qe = (size_t)(r->b * r->c * r->hq * r->d), lse = (size_t)(r->b * r->hq * r->c);
    const size_t kv = up64(r->kv_bytes), part = up64(qe * r->es), acc = up64(qe * 4), al = up64(lse * 4);
    const size_t bytes = 2 * kv + part + al + 4 * (acc + al);
    char *m = malloc(bytes);
    if (!m) return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of ring scratch", bytes);
    r->kv[0] = m;
    r->kv[1] = m + kv;
    r->part = m + 2 * kv;
    char *f = r->part + part;
    r->part_lse = (float *)(void *)f;
    f += al;
    for (int q = 0; q < 2; q++)
        for (int p = 0; p < 2; p++) {
            r->acc[q][p] = (float *)(void *)f;
            r->acc_lse[q][p] = (float *)(void *)(f + acc);
            f += acc + al;
        }
    return FC_OK;
}

/* The rank's k and v, strided, packed into kv: [b][2c][hkv][d] each. */
static void cp_pack(const cp_run *r, char *kv)
{
    const fc_tensor *src[2] = {&r->a->k, &r->a->v};
    char *dst = kv;
    for (int t = 0; t < 2; t++)
        for (int64_t b = 0; b < r->b; b++)
            for (int64_t s = 0; s < 2 * r->c; s++)
                for (int64_t h = 0; h < r->hkv; h++) {
                    const fc_tensor *x = src[t];
                    const char *row = (const char *)x->data +
                                      (size_t)(b * x->stride[0] + s * x->stride[1] + h * x->stride[2]) * r->es;
                    for (int64_t d = 0; d < r->d; d++, dst += r->es)
                        memcpy(dst, row + (size_t)(d * x->stride[3]) * r->es, r->es);
                }
}

/* parts[qi] so far and part into the other accumulator (the first part:
 * copied in); the merge's out and parts may not overlap. */
static fc_status cp_fold(fc_context *ctx, cp_run *r, int qi, void *stream)
{
    const int from = r->ping[qi], to = r->parts[qi] ? from ^ 1 : from;
    fc_tensor outs[2], lses[2];
    int n = 0;
    if (r->parts[qi]) {
        outs[n] = tensor4(r->acc[qi][from], FC_DTYPE_F32, r->b, r->c, r->hq, r->d);
        lses[n++] = lse3(r->acc_lse[qi][from], r->b, r->hq, r->c);
    }
    outs[n] = tensor4(r->part, r->a->q.dtype, r->b, r->c, r->hq, r->d);
    lses[n++] = lse3(r->part_lse, r->b, r->hq, r->c);
    fc_attention_merge_args m;
    fc_attention_merge_args_init(&m);
    m.num_parts = n;
    m.parts_out = outs;
    m.parts_lse = lses;
    m.out = tensor4(r->acc[qi][to], FC_DTYPE_F32, r->b, r->c, r->hq, r->d);
    m.lse = lse3(r->acc_lse[qi][to], r->b, r->hq, r->c);
    m.backend = r->a->backend;
    const fc_status st = fc_attention_merge(ctx, &m, stream);
    r->ping[qi] = to;
    r->parts[qi]++;
    return st;
}

/* Query chunk qi (global chunk gq) against the key chunks of the slice in
 * kv (global chunks src and 2P - 1 - src). */
static fc_status cp_step(fc_context *ctx, cp_run *r, const char *kv, int src, int qi, void *stream)
{
    const int P = r->comm->size, gq = qi ? 2 * P - 1 - r->comm->rank : r->comm->rank;
    const size_t half = r->kv_bytes / 2, chunk = (size_t)(r->c * r->hkv * r->d) * r->es;
    for (int kj = 0; kj < 2; kj++) {
        const int gk = kj ? 2 * P - 1 - src : src;
        if (r->a->causal && gk > gq) continue;
        fc_attention_args sub = *r->a;
        sub.causal = r->a->causal && gk == gq;
        sub.q = rows_of(&r->a->q, qi * r->c, r->c, r->es, 0);
        /* chunk kj of every batch row: the packed slice is [b][2c][hkv][d] */
        sub.k = tensor4((char *)kv + kj * chunk, r->a->k.dtype, r->b, r->c, r->hkv, r->d);
        sub.v = tensor4((char *)kv + half + kj * chunk, r->a->v.dtype, r->b, r->c, r->hkv, r->d);
        sub.k.stride[0] = sub.v.stride[0] = 2 * r->c * r->hkv * r->d;
        sub.out = tensor4(r->part, r->a->q.dtype, r->b, r->c, r->hq, r->d);
        sub.lse = lse3(r->part_lse, r->b, r->hq, r->c);
        fc_status st = fc_attention_forward(ctx, &sub, stream, NULL);
        if (!st) st = cp_fold(ctx, r, qi, stream);
        if (st) return st;
    }
    return FC_OK;
}

/* Each query chunk's fp32 sum into out (and lse) in the caller's dtype. */
static fc_status cp_finish(fc_context *ctx, cp_run *r, void *stream)
{
    for (int qi = 0; qi < 2; qi++) {
        const fc_tensor o = tensor4(r->acc[qi][r->ping[qi]], FC_DTYPE_F32, r->b, r->c, r->hq, r->d);
        const fc_tensor l = lse3(r->acc_lse[qi][r->ping[qi]], r->b, r->hq, r->c);
        fc_attention_merge_args m;
        fc_attention_merge_args_init(&m);
        m.num_parts = 1;
        m.parts_out = &o;
        m.parts_lse = &l;
        m.out = rows_of(&r->a->out, qi * r->c, r->c, r->es, 0);
        m.lse = rows_of(&r->a->lse, qi * r->c, r->c, sizeof(float), 1);
        m.backend = r->a->backend;
        const fc_status st = fc_attention_merge(ctx, &m, stream);
        if (st) return st;
    }
    return FC_OK;
}

static fc_status cp_ring(fc_context *ctx, cp_run *r, void *stream)
{
    const int P = r->comm->size, rank = r->comm->rank;
    cp_pack(r, r->kv[0]);
    int cur = 0;
    for (int s = 0; s < P; s++) {
        const int src = (rank - s + P) % P;
        for (int qi = 0; qi < 2; qi++) {
            const fc_status st = cp_step(ctx, r, r->kv[cur], src, qi, stream);
            if (st) return st;
        }
        if (s + 1 < P) {
            const fc_status st = r->comm->exchange(r->comm->user, r->kv[cur], r->kv[cur ^ 1], r->kv_bytes, stream);
            if (st) return fc_set_error(ctx, st, "the ring's exchange at step %d of %d returned %s", s + 1, P,
                                        fc_status_string(st));
            cur ^= 1;
        }
    }
    return cp_finish(ctx, r, stream);
}

fc_status fc_cp_attention_forward(fc_context *ctx, const fc_attention_args *args, const fc_cp_comm *comm,
                                  void *stream)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    fc_status st = cp_checks(ctx, args, comm);
    if (!st) st = cp_slice(ctx, args);
    if (st) return st;
    cp_run r;
    memset(&r, 0, sizeof r);
    r.a = args;
    r.comm = comm;
    r.b = args->q.shape[0];
    r.c = args->q.shape[1] / 2;
    r.hq = args->q.shape[2];
    r.hkv = args->k.shape[2];
    r.d = args->q.shape[3];
    r.es = (size_t)fc_dtype_bytes(args->q.dtype);
    r.kv_bytes = 2 * (size_t)(r.b * 2 * r.c * r.hkv * r.d) * r.es;
    st = cp_alloc(ctx, &r);
    if (st) return st;
    st = cp_ring(ctx, &r, stream);
    free(r.kv[0]);
    return st;
}
