/*
 * cp.c -- context parallelism over the caller's ring transport
 * (fc_cp_attention_forward, flashcore.h): the zigzag ring forward, one
 * fc_attention_forward per (query chunk, key chunk) pair the mask lets
 * through, each merged by fc_attention_merge into an fp32 accumulator per
 * query chunk in ring order, and the K/V slice handed on between steps
 * through a double buffer.
 */
#include <stdlib.h>

#include "api_internal.h"
#include "cp.h"
#include "internal.h"

/* One rank's call: the chunk sizes and its host scratch. */
typedef struct cp_run {
    const fc_attention_args *a;
    const fc_cp_comm *comm;
    fc_cp_dims n;             /* the slice's sizes                        */
    fc_cp_split own;          /* its chunks                               */
    int32_t *ints;            /* the own and the held packet's split store */
    fc_tensor q, out, lse;    /* a's, or varlen: chunk-major [1][rows] copies */
    char *kv[2];              /* the ring's double buffer                 */
    float *part;              /* [b][c][hq][d] one pair's out, in fp32    */
    float *part_lse;          /* [b][hq][c]                               */
    float *acc[2][2];         /* per query chunk, ping-pong: [b][c][hq][d] */
    float *acc_lse[2][2];     /* [b][hq][c]                               */
    int parts[2], ping[2];    /* parts merged so far; which acc holds them */
} cp_run;

/* Varlen: the chunk-major copies of q, out and lse at g (NULL: their bytes). */
static size_t cp_varlen_views(cp_run *r, char *g)
{
    const fc_attention_args *a = r->a;
    size_t at = fc_cp_chunk_major(&r->n, &a->q, 0, g, &r->q);
    at += fc_cp_chunk_major(&r->n, &a->out, 0, g ? g + at : NULL, &r->out);
    return at + fc_cp_chunk_major(&r->n, &a->lse, 1, g ? g + at : NULL, &r->lse);
}

/* The scratch in one block, each region 64-byte aligned; a query chunk's
 * regions sized for the longer (the first; varlen: the slice). */
static fc_status cp_alloc(fc_context *ctx, cp_run *r)
{
    const int64_t c0 = r->n.nseq ? r->n.rows : fc_cp_chunk_rows(r->n.rows, 0); /* the longer query chunk, or more */
    const size_t qe = (size_t)(r->n.b * c0 * r->n.hq * r->n.d), lse = (size_t)(r->n.b * r->n.hq * c0);
    const size_t kv = fc_cp_up64(fc_cp_packet_bytes(&r->n)), acc = fc_cp_up64(qe * 4), al = fc_cp_up64(lse * 4);
    const size_t ints = fc_cp_up64(2 * fc_cp_split_ints(&r->n) * sizeof(int32_t));
    const size_t base = 2 * kv + 5 * (acc + al) + ints; /* the part, then two accumulators per query chunk */
    const size_t bytes = base + (r->n.nseq ? cp_varlen_views(r, NULL) : 0);
    char *m = malloc(bytes);
    if (!m) return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of ring scratch", bytes);
    r->ints = (int32_t *)(void *)(m + base - ints);
    r->q = r->a->q, r->out = r->a->out, r->lse = r->a->lse;
    if (r->n.nseq) cp_varlen_views(r, m + base);
    r->kv[0] = m;
    r->kv[1] = m + kv;
    r->part = (float *)(void *)(m + 2 * kv);
    char *f = m + 2 * kv + acc;
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

/* parts[qi] so far and part into the other accumulator (the first part:
 * copied in); the merge's out and parts may not overlap. */
static fc_status cp_fold(fc_context *ctx, cp_run *r, int qi, void *stream)
{
    const int from = r->ping[qi], to = r->parts[qi] ? from ^ 1 : from;
    const int64_t c = r->own.rows[qi];
    fc_tensor outs[2], lses[2];
    int n = 0;
    if (r->parts[qi]) {
        outs[n] = fc_cp_tensor4(r->acc[qi][from], FC_DTYPE_F32, r->n.b, c, r->n.hq, r->n.d);
        lses[n++] = fc_cp_lse3(r->acc_lse[qi][from], r->n.b, r->n.hq, c);
    }
    outs[n] = fc_cp_tensor4(r->part, FC_DTYPE_F32, r->n.b, c, r->n.hq, r->n.d);
    lses[n++] = fc_cp_lse3(r->part_lse, r->n.b, r->n.hq, c);
    fc_attention_merge_args m;
    fc_attention_merge_args_init(&m);
    m.num_parts = n;
    m.parts_out = outs;
    m.parts_lse = lses;
    m.out = fc_cp_tensor4(r->acc[qi][to], FC_DTYPE_F32, r->n.b, c, r->n.hq, r->n.d);
    m.lse = fc_cp_lse3(r->acc_lse[qi][to], r->n.b, r->n.hq, c);
    m.backend = r->a->backend;
    const fc_status st = fc_attention_merge(ctx, &m, stream);
    r->ping[qi] = to;
    r->parts[qi]++;
    return st;
}

/* Query chunk qi (global chunk gq) against the key chunks of the slice in
 * kv (global chunks src and 2P - 1 - src, split ks); an empty chunk (a
 * slice of one row has one) takes no part. */
static fc_status cp_step(fc_context *ctx, cp_run *r, const char *kv, const fc_cp_split *ks, int src, int qi, int s,
                         void *stream)
{
    const int gq = fc_cp_chunk(r->comm, r->comm->rank, qi);
    const int64_t c = r->own.rows[qi];
    for (int kj = 0; kj < 2; kj++) {
        const int gk = fc_cp_chunk(r->comm, src, kj);
        if ((r->a->causal && gk > gq) || c == 0 || ks->rows[kj] == 0) continue;
        fc_attention_args sub = *r->a;
        sub.causal = r->a->causal && gk == gq;
        sub.q = fc_cp_rows(&r->q, r->own.row0[qi], c, r->n.es, 0);
        fc_cp_kv_chunk(&r->n, kv, ks, kj, r->a->k.dtype, &sub.k, &sub.v);
        sub.out = fc_cp_tensor4(r->part, FC_DTYPE_F32, r->n.b, c, r->n.hq, r->n.d); /* fp32 partials */
        sub.lse = fc_cp_lse3(r->part_lse, r->n.b, r->n.hq, c);
        fc_cp_varlen_pair(&r->own, qi, ks, kj, &sub);
        fc_status st = fc_cp_injected(ctx, s);
        if (!st) st = fc_attention_forward(ctx, &sub, stream, NULL);
        if (!st) st = cp_fold(ctx, r, qi, stream);
        if (st) return st;
    }
    return FC_OK;
}

/* Each query chunk's fp32 sum into out (and lse) in the caller's dtype
 * (varlen: chunk-major, then into the caller's rows). */
static fc_status cp_finish(fc_context *ctx, cp_run *r, void *stream)
{
    const size_t oes = (size_t)fc_dtype_bytes(r->out.dtype);
    for (int qi = 0; qi < 2; qi++) {
        const int64_t c = r->own.rows[qi];
        if (c == 0) continue;
        const fc_tensor o = fc_cp_tensor4(r->acc[qi][r->ping[qi]], FC_DTYPE_F32, r->n.b, c, r->n.hq, r->n.d);
        const fc_tensor l = fc_cp_lse3(r->acc_lse[qi][r->ping[qi]], r->n.b, r->n.hq, c);
        fc_attention_merge_args m;
        fc_attention_merge_args_init(&m);
        m.num_parts = 1;
        m.parts_out = &o;
        m.parts_lse = &l;
        m.out = fc_cp_rows(&r->out, r->own.row0[qi], c, oes, 0);
        m.lse = fc_cp_rows(&r->lse, r->own.row0[qi], c, sizeof(float), 1);
        m.backend = r->a->backend;
        const fc_status st = fc_attention_merge(ctx, &m, stream);
        if (st) return st;
    }
    if (r->n.nseq) {
        fc_cp_regroup(&r->n, &r->a->out, r->out.data, 0, 0);
        if (r->a->lse.data) fc_cp_regroup(&r->n, &r->a->lse, r->lse.data, 1, 0);
    }
    return FC_OK;
}

/* After a pair call fails the rank computes no more but still hands the
 * K/V slices on, so the others finish (their results never depend on its
 * work) and none waits; it returns that failure and writes nothing. */
static fc_status cp_ring(fc_context *ctx, cp_run *r, void *stream)
{
    const int P = r->comm->size, rank = r->comm->rank;
    fc_cp_pack(r->a, &r->n, r->kv[0]);
    if (r->n.nseq) fc_cp_regroup(&r->n, &r->a->q, r->q.data, 0, 1);
    int cur = 0;
    fc_status failed = FC_OK;
    for (int s = 0; s < P; s++) {
        const int src = (rank - s + P) % P;
        fc_cp_split ks;
        fc_cp_packet_split(&r->n, r->kv[cur], r->ints + fc_cp_split_ints(&r->n), &ks);
        for (int qi = 0; qi < 2 && !failed; qi++) failed = cp_step(ctx, r, r->kv[cur], &ks, src, qi, s, stream);
        if (s + 1 < P) {
            const size_t bytes = fc_cp_packet_bytes(&r->n);
            const fc_status st = r->comm->exchange(r->comm->user, r->kv[cur], r->kv[cur ^ 1], bytes, stream);
            if (st) return failed ? failed : fc_set_error(ctx, st, "the ring's exchange at step %d of %d returned %s",
                                                          s + 1, P, fc_status_string(st));
            cur ^= 1;
        }
    }
    return failed ? failed : cp_finish(ctx, r, stream);
}

fc_status fc_cp_attention_forward(fc_context *ctx, const fc_attention_args *args, const fc_cp_comm *comm,
                                  void *stream)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    cp_run r = {.a = args, .comm = comm};
    fc_status st = fc_cp_admit(ctx, comm, args, NULL, "fc_cp_attention_forward", &r.n);
    if (st) return st;
    st = cp_alloc(ctx, &r);
    if (st) return st;
    fc_cp_own_split(&r.n, r.ints, &r.own);
    st = cp_ring(ctx, &r, stream);
    free(r.kv[0]);
    return st;
}
