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
#include "cpu/ref_io.h"
#include "internal.h"

typedef struct cpb_run {
    const fc_attention_backward_args *a;
    const fc_cp_comm *comm;
    fc_cp_dims n;             /* the slice's sizes                           */
    fc_cp_split own;          /* its chunks                                  */
    int32_t *ints;            /* the own and the held packet's split store   */
    fc_tensor q, out, lse, dout; /* a's, or varlen: chunk-major [1][rows] copies */
    char *regroup;            /* varlen: a gradient in its dtype, chunk-major */
    char *kv[2];              /* the ring's double buffer                    */
    float *dq;                /* [b][rows][hq][d] the rank's dq, fp32        */
    float *sums[2];           /* dK then dV of the held slice: built, arrived,
                               * each after a header (fc_cp_mark)          */
    float *g[3];              /* one pair's dq, dk, dv in fp32               */
} cpb_run;

/* Varlen: the chunk-major copies of q, out, dout and lse, and room for a
 * gradient's (in its dtype, at most 4 bytes), at g (NULL: their bytes). */
static size_t cpb_varlen_views(cpb_run *r, char *g)
{
    const fc_attention_backward_args *a = r->a;
    size_t at = fc_cp_chunk_major(&r->n, &a->fwd.q, 0, g, &r->q);
    at += fc_cp_chunk_major(&r->n, &a->fwd.out, 0, g ? g + at : NULL, &r->out);
    at += fc_cp_chunk_major(&r->n, &a->dout, 0, g ? g + at : NULL, &r->dout);
    at += fc_cp_chunk_major(&r->n, &a->fwd.lse, 1, g ? g + at : NULL, &r->lse);
    if (g) r->regroup = g + at;
    return at + fc_cp_up64((size_t)(r->n.rows * r->n.hq * r->n.d) * 4);
}

/* The scratch; the sums and a pair's dk, dv sized for the longest slice. */
static fc_status cpb_alloc(fc_context *ctx, cpb_run *r)
{
    const int vl = r->n.nseq > 0; /* a varlen chunk may hold up to all of a slice */
    const int64_t cq = vl ? r->n.rows : fc_cp_chunk_rows(r->n.rows, 0);
    const int64_t ck = vl ? r->n.max_rows : fc_cp_chunk_rows(r->n.max_rows, 0); /* the longer */
    const size_t kv = fc_cp_up64(fc_cp_packet_bytes(&r->n));
    const size_t dq = fc_cp_up64((size_t)(r->n.b * r->n.rows * r->n.hq * r->n.d) * 4);
    const size_t sums = fc_cp_up64(FC_CP_HEADER + 2 * fc_cp_k_elems(&r->n, r->n.max_rows) * 4);
    const size_t gq = fc_cp_up64((size_t)(r->n.b * cq * r->n.hq * r->n.d) * 4);
    const size_t gk = fc_cp_up64(fc_cp_k_elems(&r->n, ck) * 4);
    const size_t ints = fc_cp_up64(2 * fc_cp_split_ints(&r->n) * sizeof(int32_t));
    const size_t base = 2 * kv + dq + 2 * sums + gq + 2 * gk + ints;
    const size_t bytes = base + (vl ? cpb_varlen_views(r, NULL) : 0);
    char *m = calloc(1, bytes);
    if (!m) return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of ring scratch", bytes);
    r->ints = (int32_t *)(void *)(m + base - ints);
    r->q = r->a->fwd.q, r->out = r->a->fwd.out, r->lse = r->a->fwd.lse, r->dout = r->a->dout;
    if (vl) cpb_varlen_views(r, m + base);
    r->kv[0] = m;
    r->kv[1] = m + kv;
    r->dq = (float *)(void *)(m + 2 * kv);
    r->sums[0] = (float *)(void *)(m + 2 * kv + dq + FC_CP_HEADER);
    r->sums[1] = (float *)(void *)(m + 2 * kv + dq + sums + FC_CP_HEADER);
    r->g[0] = (float *)(void *)(m + 2 * kv + dq + 2 * sums);
    r->g[1] = (float *)(void *)(m + 2 * kv + dq + 2 * sums + gq);
    r->g[2] = (float *)(void *)(m + 2 * kv + dq + 2 * sums + gq + gk);
    return FC_OK;
}

/* acc's rows [r0, r0 + c) of a [b][rows][h][d] fp32 array += one pair's
 * gradient g ([b][c][h][d]). */
static void add_rows(float *acc, int64_t rows, int64_t r0, int64_t c, const float *g, const cpb_run *r, int64_t h)
{
    const int64_t row = h * r->n.d;
    for (int64_t b = 0; b < r->n.b; b++)
        for (int64_t i = 0; i < c; i++) {
            float *x = acc + ((b * rows + r0 + i) * row);
            const size_t at = (size_t)((b * c + i) * row);
            for (int64_t e = 0; e < row; e++) x[e] += g[at + (size_t)e];
        }
}

/* The pair (query chunk qi, key chunk kj of the held slice in kv, split ks). */
static fc_status cpb_pair(fc_context *ctx, cpb_run *r, const char *kv, const fc_cp_split *ks, int qi, int kj,
                          int causal, void *stream)
{
    const fc_attention_backward_args *a = r->a;
    const fc_dtype dt = a->fwd.q.dtype;
    const int64_t r0 = r->own.row0[qi], c = r->own.rows[qi];
    const int64_t krows = fc_cp_packed_rows(kv);
    fc_attention_backward_args sub = *a;
    sub.fwd.causal = causal;
    sub.fwd.q = fc_cp_rows(&r->q, r0, c, r->n.es, 0);
    fc_cp_kv_chunk(&r->n, kv, ks, kj, dt, &sub.fwd.k, &sub.fwd.v);
    sub.fwd.out = fc_cp_rows(&r->out, r0, c, (size_t)fc_dtype_bytes(r->out.dtype), 0);
    sub.fwd.lse = fc_cp_rows(&r->lse, r0, c, sizeof(float), 1);
    sub.dout = fc_cp_rows(&r->dout, r0, c, (size_t)fc_dtype_bytes(r->dout.dtype), 0);
    /* fp32 gradients: the pairs' sums are rounded once, at the end */
    sub.dq = fc_cp_tensor4(r->g[0], FC_DTYPE_F32, r->n.b, c, r->n.hq, r->n.d);
    sub.dk = fc_cp_tensor4(r->g[1], FC_DTYPE_F32, r->n.b, sub.fwd.k.shape[1], r->n.hkv, r->n.d);
    sub.dv = fc_cp_tensor4(r->g[2], FC_DTYPE_F32, r->n.b, sub.fwd.k.shape[1], r->n.hkv, r->n.d);
    sub.workspace = NULL;
    sub.workspace_bytes = 0;
    if (r->n.nseq) {
        fc_cp_varlen_pair(&r->own, qi, ks, kj, &sub.fwd);
        fc_tensor *ts[4] = {&sub.dout, &sub.dq, &sub.dk, &sub.dv};
        for (int i = 0; i < 4; i++) fc_cp_drop_batch(ts[i]);
    }
    const fc_status st = fc_attention_backward(ctx, &sub, stream, NULL);
    if (st) return st;
    const int64_t k0 = ks->row0[kj], kc = ks->rows[kj];
    add_rows(r->dq, r->n.rows, r0, c, r->g[0], r, r->n.hq);
    add_rows(r->sums[0], krows, k0, kc, r->g[1], r, r->n.hkv);
    add_rows(r->sums[0] + fc_cp_k_elems(&r->n, krows), krows, k0, kc, r->g[2], r, r->n.hkv);
    return FC_OK;
}

static fc_cp_mark *mark_of(float *sums) { return (fc_cp_mark *)(void *)((char *)sums - FC_CP_HEADER); }

/* Every pair of step s (the held slice is src's) into sums[0] and dq; the
 * first failure. */
static fc_status cpb_pairs(fc_context *ctx, cpb_run *r, const char *kv, int s, int src, void *stream)
{
    const int rank = r->comm->rank;
    fc_cp_split ks;
    fc_cp_packet_split(&r->n, kv, r->ints + fc_cp_split_ints(&r->n), &ks);
    for (int qi = 0; qi < 2; qi++)
        for (int kj = 0; kj < 2; kj++) {
            const int gq = fc_cp_chunk(r->comm, rank, qi), gk = fc_cp_chunk(r->comm, src, kj);
            if (r->a->fwd.causal && gk > gq) continue;
            if (r->own.rows[qi] == 0 || ks.rows[kj] == 0) continue; /* empty */
            fc_status st = fc_cp_injected(ctx, s);
            if (!st) st = cpb_pair(ctx, r, kv, &ks, qi, kj, r->a->fwd.causal && gk == gq, stream);
            if (st) return st;
        }
    return FC_OK;
}

/* Step s: sums[0] gets the held slice's gradients here, plus (s > 0)
 * those that arrived with it in sums[1]; then they move on. After a pair
 * fails (*failed) the rank computes no more but still passes the sums on,
 * marked as missing its share (their owner then fails too), so none
 * waits. Returns a transport failure only. */
static fc_status cpb_step(fc_context *ctx, cpb_run *r, const char *kv, int s, fc_status *failed, void *stream)
{
    const int P = r->comm->size, rank = r->comm->rank, src = (rank - s + P) % P;
    const size_t held = 2 * fc_cp_k_elems(&r->n, fc_cp_packed_rows(kv)); /* the held slice's sums */
    memset(mark_of(r->sums[0]), 0, FC_CP_HEADER + held * sizeof(float));
    if (!*failed) *failed = cpb_pairs(ctx, r, kv, s, src, stream);
    fc_cp_mark m = {(int32_t)*failed, rank};
    if (s > 0) {
        for (size_t i = 0; i < held; i++) r->sums[0][i] += r->sums[1][i];
        if (!m.status) m = *mark_of(r->sums[1]);
    }
    *mark_of(r->sums[0]) = m;
    if (P == 1) return FC_OK;
    const size_t bytes = FC_CP_HEADER + 2 * fc_cp_k_elems(&r->n, r->n.max_rows) * sizeof(float);
    const fc_status st = r->comm->exchange(r->comm->user, mark_of(r->sums[0]), mark_of(r->sums[1]), bytes, stream);
    if (!st || *failed) return st; /* a failure's own message stays */
    return fc_set_error(ctx, st, "the ring's exchange of dK/dV at step %d of %d returned %s", s + 1, P,
                        fc_status_string(st));
}

/* acc ([b][rows][h][d] fp32) into the strided t in its dtype. */
static void write_out4(const float *acc, const fc_tensor *t)
{
    const int64_t *n = t->shape, *st = t->stride;
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t h = 0; h < n[2]; h++)
                for (int64_t e = 0; e < n[3]; e++)
                    fc_ref_store(t->data, t->dtype, b * st[0] + s * st[1] + h * st[2] + e * st[3],
                                 acc[((b * n[1] + s) * n[2] + h) * n[3] + e]);
}

/* acc into the caller's t (varlen: through the chunk-major copy). */
static void write_out(const cpb_run *r, const float *acc, const fc_tensor *t)
{
    if (!r->n.nseq) {
        write_out4(acc, t);
        return;
    }
    const fc_tensor grouped = fc_cp_tensor4(r->regroup, t->dtype, 1, r->n.rows, t->shape[1], t->shape[2]);
    write_out4(acc, &grouped);
    fc_cp_regroup(&r->n, t, r->regroup, 0, 0);
}

/* Varlen: q, out, dout and lse in chunk-major order. */
static void cpb_gather(cpb_run *r)
{
    const fc_attention_backward_args *a = r->a;
    fc_cp_regroup(&r->n, &a->fwd.q, r->q.data, 0, 1);
    fc_cp_regroup(&r->n, &a->fwd.out, r->out.data, 0, 1);
    fc_cp_regroup(&r->n, &a->dout, r->dout.data, 0, 1);
    fc_cp_regroup(&r->n, &a->fwd.lse, r->lse.data, 1, 1);
}

static fc_status cpb_ring(fc_context *ctx, cpb_run *r, void *stream)
{
    const int P = r->comm->size;
    fc_cp_pack(&r->a->fwd, &r->n, r->kv[0]);
    if (r->n.nseq) cpb_gather(r);
    int cur = 0;
    fc_status failed = FC_OK;
    for (int s = 0; s < P; s++) {
        fc_status st = cpb_step(ctx, r, r->kv[cur], s, &failed, stream);
        if (!st && s + 1 < P) {
            st = r->comm->exchange(r->comm->user, r->kv[cur], r->kv[cur ^ 1], fc_cp_packet_bytes(&r->n), stream);
            if (st && !failed)
                fc_set_error(ctx, st, "the ring's exchange at step %d of %d returned %s", s + 1, P,
                             fc_status_string(st));
            cur ^= 1;
        }
        if (st) return failed ? failed : st;
    }
    if (failed) return failed;
    float *home = P == 1 ? r->sums[0] : r->sums[1]; /* the rank's own slice, back from its tour */
    const fc_cp_mark m = *mark_of(home);
    if (m.status)
        return fc_set_error(ctx, (fc_status)m.status,
                            "rank %d failed during the ring (%s): this rank's dk and dv would miss its share; "
                            "nothing was written", (int)m.rank, fc_status_string((fc_status)m.status));
    write_out(r, r->dq, &r->a->dq);
    write_out(r, home, &r->a->dk);
    write_out(r, home + fc_cp_k_elems(&r->n, r->n.rows), &r->a->dv);
    return FC_OK;
}

fc_status fc_cp_attention_backward(fc_context *ctx, const fc_attention_backward_args *args, const fc_cp_comm *comm,
                                   void *stream)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    cpb_run r = {.a = args, .comm = comm};
    fc_status st = fc_cp_admit(ctx, comm, args ? &args->fwd : NULL, args, "fc_cp_attention_backward", &r.n);
    if (st) return st;
    st = cpb_alloc(ctx, &r);
    if (st) return st;
    fc_cp_own_split(&r.n, r.ints, &r.own);
    st = cpb_ring(ctx, &r, stream);
    free(r.kv[0]);
    return st;
}
