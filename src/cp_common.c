/*
 * cp_common.c -- the ring's shared pieces (cp.h).
 */
#include <string.h>

#include "api_internal.h"
#include "cp.h"
#include "cpu/cpu_dtype.h"
#include "internal.h"
#include "memory_space.h" /* fc_cuda_device_pointers */

fc_cp_dims fc_cp_dims_of(const fc_attention_args *a)
{
    if (a->cu_seqlens_q) { /* [total][h][d] */
        fc_cp_dims n = {1, a->q.shape[1], a->k.shape[1], a->q.shape[2], (size_t)fc_dtype_bytes(a->q.dtype),
                        a->q.shape[0], a->q.shape[0], a->num_seqs, a->cu_seqlens_q};
        return n;
    }
    fc_cp_dims n = {a->q.shape[0], a->q.shape[2], a->k.shape[2], a->q.shape[3], (size_t)fc_dtype_bytes(a->q.dtype),
                    a->q.shape[1], a->q.shape[1], 0, NULL};
    return n;
}

/* A varlen split from the sequences' slice lengths (fc_cp_chunk_rows of each). */
static void split_of_lens(const fc_cp_dims *n, const int32_t *lens, int32_t *store, fc_cp_split *s)
{
    int64_t at = 0;
    for (int w = 0; w < 2; w++) {
        int32_t *cu = store + w * (n->nseq + 1);
        cu[0] = 0;
        s->max[w] = 0;
        for (int32_t b = 0; b < n->nseq; b++) {
            const int32_t c = (int32_t)fc_cp_chunk_rows(lens[b], w);
            cu[b + 1] = cu[b] + c;
            if (c > s->max[w]) s->max[w] = c;
        }
        s->cu[w] = cu;
        s->row0[w] = at;
        s->rows[w] = cu[n->nseq];
        at += s->rows[w];
    }
}

static void split_dense(int64_t rows, fc_cp_split *s)
{
    for (int w = 0; w < 2; w++) {
        s->row0[w] = fc_cp_chunk_row0(rows, w);
        s->rows[w] = fc_cp_chunk_rows(rows, w);
        s->cu[w] = NULL;
        s->max[w] = 0;
    }
}

void fc_cp_own_split(const fc_cp_dims *n, int32_t *store, fc_cp_split *s)
{
    if (!n->nseq) {
        split_dense(n->rows, s);
        return;
    }
    int32_t *lens = store + 2 * (n->nseq + 1); /* past the two chunks' offsets */
    for (int32_t b = 0; b < n->nseq; b++) lens[b] = n->cu[b + 1] - n->cu[b];
    split_of_lens(n, lens, store, s);
}

void fc_cp_packet_split(const fc_cp_dims *n, const char *kv, int32_t *store, fc_cp_split *s)
{
    if (!n->nseq) split_dense(fc_cp_packed_rows(kv), s);
    else split_of_lens(n, (const int32_t *)(const void *)(kv + FC_CP_HEADER), store, s);
}

void fc_cp_drop_batch(fc_tensor *t)
{
    if (t->ndim < 1) return;
    const int nd = t->ndim - 1;
    for (int i = 0; i < nd; i++) {
        t->shape[i] = t->shape[i + 1];
        t->stride[i] = t->stride[i + 1];
    }
    t->shape[nd] = t->stride[nd] = 0;
    t->ndim = nd;
}

void fc_cp_varlen_pair(const fc_cp_split *qs, int qi, const fc_cp_split *ks, int kj, fc_attention_args *sub)
{
    if (!qs->cu[qi]) return;
    sub->cu_seqlens_q = qs->cu[qi];
    sub->cu_seqlens_k = ks->cu[kj];
    sub->max_seqlen_q = qs->max[qi];
    sub->max_seqlen_k = ks->max[kj];
    fc_tensor *ts[5] = {&sub->q, &sub->k, &sub->v, &sub->out, &sub->lse};
    for (int i = 0; i < 5; i++) fc_cp_drop_batch(ts[i]);
}

/* One caller row's h x d elements (lse: h, one a row) to or from
 * chunk-major row i of buf. */
static void regroup_row(const fc_tensor *t, char *buf, int64_t rows, int64_t i, int64_t src, int lse, int gather)
{
    const size_t es = (size_t)fc_dtype_bytes(t->dtype);
    const int64_t h = lse ? t->shape[0] : t->shape[1], d = lse ? 1 : t->shape[2];
    for (int64_t x = 0; x < h; x++)
        for (int64_t e = 0; e < d; e++) {
            const int64_t at = lse ? x * t->stride[0] + src * t->stride[1]
                                   : src * t->stride[0] + x * t->stride[1] + e * t->stride[2];
            char *mine = buf + (size_t)(lse ? x * rows + i : (i * h + x) * d + e) * es;
            char *theirs = (char *)t->data + (size_t)at * es;
            if (gather) memcpy(mine, theirs, es);
            else memcpy(theirs, mine, es);
        }
}

void fc_cp_regroup(const fc_cp_dims *n, const fc_tensor *t, void *buf, int lse, int gather)
{
    int64_t i = 0; /* chunk-major order: every sequence's chunk 0, then every chunk 1 */
    for (int w = 0; w < 2; w++)
        for (int32_t b = 0; b < n->nseq; b++) {
            const int64_t len = n->cu[b + 1] - n->cu[b], r0 = n->cu[b] + fc_cp_chunk_row0(len, w);
            for (int64_t s = r0; s < r0 + fc_cp_chunk_rows(len, w); s++, i++)
                regroup_row(t, buf, n->rows, i, s, lse, gather);
        }
}

size_t fc_cp_chunk_major(const fc_cp_dims *n, const fc_tensor *src, int lse, char *g, fc_tensor *dst)
{
    if (!src->data) return 0; /* an optional lse not asked for */
    const int64_t h = lse ? src->shape[0] : src->shape[1];
    const size_t bytes = fc_cp_up64((size_t)(n->rows * h * (lse ? 1 : src->shape[2]) * fc_dtype_bytes(src->dtype)));
    if (g) *dst = lse ? fc_cp_lse3((float *)(void *)g, 1, h, n->rows)
                      : fc_cp_tensor4(g, src->dtype, 1, n->rows, h, src->shape[2]);
    return bytes;
}

fc_tensor fc_cp_tensor4(void *data, fc_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    fc_tensor t = {data, dt, 4, {n0, n1, n2, n3}, {n1 * n2 * n3, n2 * n3, n3, 1}};
    return t;
}

fc_tensor fc_cp_lse3(float *data, int64_t b, int64_t h, int64_t s)
{
    fc_tensor t = {data, FC_DTYPE_F32, 3, {b, h, s, 0}, {h * s, s, 1, 0}};
    return t;
}

fc_tensor fc_cp_rows(const fc_tensor *t, int64_t r0, int64_t n, size_t es, int lse)
{
    fc_tensor v = *t;
    const int axis = lse ? 2 : 1;
    if (v.data) v.data = (char *)v.data + (size_t)(r0 * t->stride[axis]) * es;
    v.shape[axis] = n;
    return v;
}

fc_status fc_cp_injected(fc_context *ctx, int s)
{
    if (ctx->cp_fail_step < 0 || s < ctx->cp_fail_step) return FC_OK;
    return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "out of memory (injected by a test at ring step %d)", s);
}

int fc_cp_chunk(const fc_cp_comm *c, int rank, int w) { return w ? 2 * c->size - 1 - rank : rank; }

void fc_cp_kv_chunk(const fc_cp_dims *n, const char *kv, const fc_cp_split *ks, int kj, fc_dtype dt, fc_tensor *k,
                    fc_tensor *v)
{
    const int64_t rows = fc_cp_packed_rows(kv), c = ks->rows[kj];
    const size_t at = fc_cp_header_bytes(n) + (size_t)(ks->row0[kj] * n->hkv * n->d) * n->es;
    *k = fc_cp_tensor4((char *)kv + at, dt, n->b, c, n->hkv, n->d);
    *v = fc_cp_tensor4((char *)kv + fc_cp_k_bytes(n, rows) + at, dt, n->b, c, n->hkv, n->d);
    k->stride[0] = v->stride[0] = rows * n->hkv * n->d; /* a batch row holds both chunks */
}

static fc_status comm_ok(fc_context *ctx, const void *args, const fc_cp_comm *c, const char *what)
{
    if (!args || !c) return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s: args and comm must not be NULL", what);
    if (c->size < 1 || c->rank < 0 || c->rank >= c->size || !c->exchange)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "%s: comm rank %d of size %d with %s exchange (need 0 <= rank < size, a function)",
                            what, (int)c->rank, (int)c->size, c->exchange ? "an" : "no");
    return FC_OK;
}

static fc_status host_only(fc_context *ctx, const char *what)
{
    return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                        "%s runs on host memory only for now (flashcore.distributed runs the ring on GPUs)", what);
}

/* What the ring does not take. */
static fc_status ring_takes(fc_context *ctx, const fc_attention_args *a, const char *what)
{
    if (a->block_table || a->seqused_k || a->k_new.data || a->window_left != -1 || a->window_right != -1)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "%s takes dense or varlen calls only: no paged cache, append or window", what);
    if (fc_dtype_is_fp8(a->q.dtype) || fc_dtype_is_fp8(a->k.dtype))
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED, "%s does not take FP8 inputs", what);
    return a->backend == FC_BACKEND_CUDA ? host_only(ctx, what) : FC_OK;
}

/* The slice's tensors (and varlen offsets) in host memory. */
static fc_status host_memory(fc_context *ctx, const fc_attention_args *f, const fc_attention_backward_args *b,
                             const char *what)
{
    const void *ptrs[11] = {f->q.data, f->k.data, f->v.data, f->out.data, f->lse.data, f->cu_seqlens_q,
                            f->cu_seqlens_k};
    int n = 7;
    if (b) {
        ptrs[n++] = b->dout.data;
        ptrs[n++] = b->dq.data;
        ptrs[n++] = b->dk.data;
        ptrs[n++] = b->dv.data;
    }
    unsigned char dev[11] = {0};
    fc_cuda_device_pointers(ptrs, n, dev);
    for (int i = 0; i < n; i++)
        if (dev[i]) return host_only(ctx, what);
    return FC_OK;
}

/* After the plain call's checks: host memory, and the slice's queries and
 * keys are the same tokens (varlen: the same offsets). */
static fc_status slice_ok(fc_context *ctx, const fc_attention_args *f, const fc_attention_backward_args *b,
                          const char *what)
{
    const fc_status st = host_memory(ctx, f, b, what);
    if (st) return st;
    const int vl = f->cu_seqlens_q != NULL, ax = vl ? 0 : 1;
    if (f->q.shape[ax] != f->k.shape[ax])
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "%s: the rank's slice holds the same tokens' queries and keys: seqlen_q (%lld) == "
                            "seqlen_k (%lld)", what, (long long)f->q.shape[ax], (long long)f->k.shape[ax]);
    for (int32_t i = 0; vl && i <= f->num_seqs; i++)
        if (f->cu_seqlens_q[i] != f->cu_seqlens_k[i])
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s: the rank's slice holds the same tokens' queries and keys: cu_seqlens_q[%d] = %d, "
                                "cu_seqlens_k[%d] = %d", what, (int)i, (int)f->cu_seqlens_q[i], (int)i,
                                (int)f->cu_seqlens_k[i]);
    return FC_OK;
}

/* What every rank must pass alike: all but the slice's rows. */
static uint64_t digest(const fc_attention_args *a, int backward)
{
    const int vl = a->cu_seqlens_q != NULL; /* varlen: the batch is num_seqs, [total][h][d] */
    const uint64_t v[11] = {(uint64_t)backward, (uint64_t)a->q.dtype, (uint64_t)a->out.dtype, (uint64_t)a->causal,
                            (uint64_t)(vl ? a->num_seqs : a->q.shape[0]), (uint64_t)a->q.shape[vl ? 1 : 2],
                            (uint64_t)a->q.shape[vl ? 2 : 3], (uint64_t)a->k.shape[vl ? 1 : 2],
                            fc_f32_to_bits(a->scale), fc_f32_to_bits(a->softcap), (uint64_t)vl};
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the words */
    for (int i = 0; i < 11; i++) h = (h ^ v[i]) * 1099511628211ull;
    return h;
}

/* The handshake's message: the lowest rank that refused (size: none),
 * the least and greatest digest seen, and the longest slice's rows; all
 * merged by min or max, so hearing twice from a rank changes nothing. */
typedef struct cp_hello {
    int64_t refused;
    uint64_t lo, hi;
    int64_t max_rows;
} cp_hello;

/* The merged message's verdict, on a rank that did not refuse. */
static fc_status agreed(fc_context *ctx, const fc_cp_comm *c, const cp_hello *m, const char *what)
{
    if (m->refused < c->size)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "%s: rank %lld refused the call (its own status says why); nothing was computed", what,
                            (long long)m->refused);
    if (m->lo != m->hi)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "%s: the ranks' shapes, dtypes or options differ (every rank must pass the same)", what);
    return FC_OK;
}

static fc_status agree(fc_context *ctx, const fc_cp_comm *c, fc_status local, uint64_t dg, int64_t *max_rows,
                       const char *what)
{
    cp_hello mine = {local ? c->rank : c->size, dg, dg, *max_rows}, in;
    for (int s = 1; s < c->size; s++) { /* after step s a rank has heard from s ranks before it */
        const fc_status st = c->exchange(c->user, &mine, &in, sizeof mine, NULL);
        if (st) return local ? local : fc_set_error(ctx, st, "%s: the ranks' handshake exchange returned %s", what,
                                                   fc_status_string(st));
        if (in.refused < mine.refused) mine.refused = in.refused;
        if (in.lo < mine.lo) mine.lo = in.lo;
        if (in.hi > mine.hi) mine.hi = in.hi;
        if (in.max_rows > mine.max_rows) mine.max_rows = in.max_rows;
    }
    *max_rows = mine.max_rows;
    return local ? local : agreed(ctx, c, &mine, what);
}

fc_status fc_cp_admit(fc_context *ctx, const fc_cp_comm *c, const fc_attention_args *f,
                      const fc_attention_backward_args *b, const char *what, fc_cp_dims *n)
{
    memset(n, 0, sizeof *n);
    ctx->err[0] = 0;
    fc_status st = comm_ok(ctx, f, c, what);
    if (st) return st;
    st = ring_takes(ctx, f, what);
    if (!st) st = b ? fc_attention_backward_supported(ctx, b, NULL) : fc_attention_supported(ctx, f, NULL);
    if (!st) st = slice_ok(ctx, f, b, what);
    if (!st) *n = fc_cp_dims_of(f);
    return agree(ctx, c, st, digest(f, b != NULL), &n->max_rows, what);
}

int64_t fc_cp_packed_rows(const char *kv)
{
    int64_t rows;
    memcpy(&rows, kv, sizeof rows);
    return rows;
}

/* Varlen: k and v chunk-major after the header, which lists the sequences' slice lengths. */
/* Varlen: k and v chunk-major after the header, which lists the sequences' slice lengths. */
static void pack_varlen(const fc_attention_args *a, const fc_cp_dims *n, char *kv)
{
    int32_t *lens = (int32_t *)(void *)(kv + FC_CP_HEADER);
    for (int32_t b = 0; b < n->nseq; b++) lens[b] = n->cu[b + 1] - n->cu[b];
    char *k = kv + fc_cp_header_bytes(n);
    fc_cp_regroup(n, &a->k, k, 0, 1);
    fc_cp_regroup(n, &a->v, k + fc_cp_k_bytes(n, n->rows), 0, 1);
}

void fc_cp_pack(const fc_attention_args *a, const fc_cp_dims *n, char *kv)
{
    const fc_tensor *src[2] = {&a->k, &a->v};
    const size_t es = n->es;
    memset(kv, 0, fc_cp_header_bytes(n));
    memcpy(kv, &n->rows, sizeof n->rows);
    if (n->nseq) {
        pack_varlen(a, n, kv);
        return;
    }
    char *dst = kv + FC_CP_HEADER;
    for (int t = 0; t < 2; t++)
        for (int64_t i = 0; i < n->b; i++)
            for (int64_t s = 0; s < n->rows; s++)
                for (int64_t h = 0; h < n->hkv; h++) {
                    const fc_tensor *x = src[t];
                    const char *row =
                        (const char *)x->data + (size_t)(i * x->stride[0] + s * x->stride[1] + h * x->stride[2]) * es;
                    for (int64_t e = 0; e < n->d; e++, dst += es)
                        memcpy(dst, row + (size_t)(e * x->stride[3]) * es, es);
                }
}
