/*
 * reference_bwd.c -- the double-precision backward oracle. Written to be
 * obviously right, not fast: for each sequence and kv head, the keys and
 * values are loaded once as doubles; then one query row at a time (every
 * query head of the group in turn) every visible key by fc_key_visible:
 *
 *     P  = exp(S - lse)            S the scaled (and capped) logit, lse given
 *     dV += P dO                   dP = dO . v
 *     dS = P (dP - D)              D = dO . O of the row (the given out)
 *     dS *= 1 - tanh^2             with softcap: S = c tanh(scale qk / c)
 *     dQ += scale dS k,  dK += scale dS q
 *
 * everything accumulated in double and rounded once to the dtype (ref_io.h,
 * as the forward reference). A row whose lse is -inf contributes nothing
 * (dq = 0); a key no row sees gets dk = dv = 0. Single-threaded and
 * deterministic.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bwd_seq.h"
#include "internal.h"
#include "ref_io.h"

/* Scratch of one (sequence, kv head): K, V, dK, dV as [sk][D] doubles, and
 * the rows of one query (q, dout, out, dq). */
typedef struct ref_scratch {
    double *k, *v, *dk, *dv;
    double *q, *dout, *out, *dq;
    void *block;
} ref_scratch;

static int scratch_alloc(ref_scratch *r, int64_t max_sk, int64_t D)
{
    const int64_t kv = max_sk * D;
    double *x = malloc((size_t)(4 * kv + 4 * D) * sizeof(double));
    if (!x) return -1;
    r->block = x;
    r->k = x; r->v = x + kv; r->dk = x + 2 * kv; r->dv = x + 3 * kv;
    x += 4 * kv;
    r->q = x; r->dout = x + D; r->out = x + 2 * D; r->dq = x + 3 * D;
    return 0;
}

/* Longest key sequence, from the real lengths: max_seqlen_k is only a bound
 * (INT32_MAX would ask for terabytes on a 5-token call). */
static int64_t longest_key_seq(const fc_bwd_params *p)
{
    int64_t m = 0;
    for (int b = 0; b < p->f.batch; b++) {
        fc_bwd_seq s;
        fc_bwd_seq_of(p, b, &s);
        if (s.sk > m) m = s.sk;
    }
    return m;
}

static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0.0;
    for (int64_t x = 0; x < n; x++) s += a[x] * b[x];
    return s;
}

/* Query row i of head h: its dq, and its share of r->dk, r->dv. */
static void query_row(const fc_bwd_params *p, const fc_bwd_seq *s, int h, int64_t i, ref_scratch *r)
{
    const fc_fwd_params *f = &p->f;
    const int64_t D = f->head_dim;
    const double scale = f->scale, cap = f->softcap;
    fc_ref_load_row(f->q, f->dtype, s->q + i * f->q_row_stride + h * f->q_head_stride, D, r->q);
    fc_ref_load_row(p->dout, f->dtype, s->dout + i * p->do_row_stride + h * p->do_head_stride, D, r->dout);
    fc_ref_load_row(f->o, f->dtype, s->o + i * f->o_row_stride + h * f->o_head_stride, D, r->out);
    const double lse = f->lse[s->lse + h * f->lse_head_stride + i * f->lse_row_stride];
    const double Di = dot(r->dout, r->out, D);
    memset(r->dq, 0, (size_t)D * sizeof(double));
    const int64_t keys = isinf(lse) && lse < 0 ? 0 : s->sk; /* lse -inf: the row adds nothing */
    for (int64_t j = 0; j < keys; j++) {
        if (!fc_key_visible(i, j, s->sq, s->sk, f->window_left, f->window_right)) continue;
        const double *kj = r->k + j * D, *vj = r->v + j * D;
        double sc = scale * dot(r->q, kj, D), t = 0.0;
        if (cap > 0.0) {
            t = tanh(sc / cap);
            sc = cap * t;
        }
        const double P = exp(sc - lse);
        double dS = P * (dot(r->dout, vj, D) - Di);
        if (cap > 0.0) dS *= 1.0 - t * t;
        for (int64_t d = 0; d < D; d++) {
            r->dv[j * D + d] += P * r->dout[d];
            r->dq[d] += dS * kj[d];
            r->dk[j * D + d] += dS * r->q[d];
        }
    }
    const int64_t dq0 = s->dq + i * p->dq_row_stride + h * p->dq_head_stride;
    for (int64_t d = 0; d < D; d++) fc_ref_store(p->dq, p->g_dtype, dq0 + d, scale * r->dq[d]);
}

/* Every query head of kv head g over sequence s; then dk, dv of its keys. */
static void kv_head(const fc_bwd_params *p, const fc_bwd_seq *s, int g, ref_scratch *r)
{
    const fc_fwd_params *f = &p->f;
    const int64_t D = f->head_dim;
    const int group = f->heads_q / f->heads_kv;
    for (int64_t j = 0; j < s->sk; j++) {
        fc_ref_load_row(f->k, f->dtype, s->k + j * f->k_row_stride + g * f->k_head_stride, D, r->k + j * D);
        fc_ref_load_row(f->v, f->dtype, s->v + j * f->v_row_stride + g * f->v_head_stride, D, r->v + j * D);
    }
    memset(r->dk, 0, (size_t)(s->sk * D) * sizeof(double));
    memset(r->dv, 0, (size_t)(s->sk * D) * sizeof(double));
    for (int h = g * group; h < (g + 1) * group; h++)
        for (int64_t i = 0; i < s->sq; i++) query_row(p, s, h, i, r);
    for (int64_t j = 0; j < s->sk; j++) {
        const int64_t dk0 = s->dk + j * p->dk_row_stride + g * p->dk_head_stride;
        const int64_t dv0 = s->dv + j * p->dv_row_stride + g * p->dv_head_stride;
        for (int64_t d = 0; d < D; d++) {
            fc_ref_store(p->dk, p->g_dtype, dk0 + d, (double)f->scale * r->dk[j * D + d]);
            fc_ref_store(p->dv, p->g_dtype, dv0 + d, r->dv[j * D + d]);
        }
    }
}

fc_status fc_cpu_reference_backward(const fc_bwd_params *p, char *err, size_t err_len)
{
    const int64_t D = p->f.head_dim, max_sk = longest_key_seq(p);
    ref_scratch r;
    if (scratch_alloc(&r, max_sk, D) != 0) {
        snprintf(err, err_len,
                 "cpu reference backward: cannot allocate %lld bytes of scratch (seqlen_k %lld, head_dim %lld)",
                 (long long)((4 * max_sk * D + 4 * D) * (int64_t)sizeof(double)), (long long)max_sk,
                 (long long)D);
        return FC_ERR_OUT_OF_MEMORY;
    }
    for (int b = 0; b < p->f.batch; b++) {
        fc_bwd_seq s;
        fc_bwd_seq_of(p, b, &s);
        for (int g = 0; g < p->f.heads_kv; g++) kv_head(p, &s, g, &r);
    }
    free(r.block);
    return FC_OK;
}
