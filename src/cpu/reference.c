/*
 * reference.c -- the double-precision oracle every other path is judged
 * against (tests, the CLI's check command). It is written to be obviously
 * right, not fast: one query row at a time, every visible key, the rule from
 * fc_key_visible, a two-pass softmax in double, one rounding at the end.
 * FP8 inputs are dequantised in double (x * descale, exact) first.
 * Single-threaded and deterministic.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fwd_seq.h"
#include "internal.h"
#include "ref_io.h"

/* max(amax, |out row|) over the D elements just stored at orow (FP8
 * out_amax: the values as written), read back through tmp. */
static double row_amax(const fc_fwd_params *p, int64_t orow, int64_t D, double *tmp, double amax)
{
    fc_ref_load_row(p->o, p->o_dtype, orow, D, tmp);
    for (int64_t d = 0; d < D; d++) amax = fc_nan_max(amax, fabs(tmp[d]));
    return amax;
}

/* A row's scratch, doubles: the scores of every key, and D each for the
 * output sum, the query row and a key or value row. */
typedef struct ref_scratch {
    double *score, *acc, *qrow, *kvrow;
} ref_scratch;

static void scratch_free(ref_scratch *x)
{
    free(x->score);
    free(x->acc);
    free(x->qrow);
    free(x->kvrow);
}

/* Sized for the longest key sequence, from the real lengths: max_seqlen_k
 * is only a bound (INT32_MAX would ask for 16 GiB on a 5-token call; a
 * paged seqlen_k is the capacity, too). */
static fc_status scratch_alloc(const fc_fwd_params *p, ref_scratch *x, char *err, size_t err_len)
{
    const int64_t D = p->head_dim;
    int64_t max_sk = 0;
    for (int b = 0; b < p->batch; b++) {
        const int64_t sk = fc_used_keys(p, b);
        if (sk > max_sk) max_sk = sk;
    }
    x->score = malloc((size_t)(max_sk > 0 ? max_sk : 1) * sizeof(double));
    x->acc = malloc((size_t)(D > 0 ? D : 1) * sizeof(double));
    x->qrow = malloc((size_t)(D > 0 ? D : 1) * sizeof(double));
    x->kvrow = malloc((size_t)(D > 0 ? D : 1) * sizeof(double));
    if (x->score && x->acc && x->qrow && x->kvrow) return FC_OK;
    scratch_free(x);
    snprintf(err, err_len, "cpu reference: cannot allocate %lld bytes of row scratch (seqlen_k %lld, head_dim %lld)",
             (long long)((max_sk + 3 * D) * (int64_t)sizeof(double)), (long long)max_sk, (long long)D);
    return FC_ERR_OUT_OF_MEMORY;
}

/* The scores of query row x->qrow (row i of sequence sv) against every key
 * of kv head hk it sees, in x->score; *mx their largest. The keys seen. */
static int64_t row_scores(const fc_fwd_params *p, const seq_view *sv, int hk, int64_t i, double kd, ref_scratch *x,
                          double *mx)
{
    const int64_t D = p->head_dim;
    int64_t visible = 0;
    *mx = -INFINITY;
    for (int64_t j = 0; j < sv->sk; j++) {
        if (!fc_key_visible(i, j, sv->sq, sv->sk, p->window_left, p->window_right)) continue;
        const int64_t kj = fc_key_offset(fc_key_slot_of(p, (int)sv->b, j), sv->k, p->k_row_stride, p->k_batch_stride);
        fc_ref_load_row(p->k, p->kv_dtype, kj + hk * p->k_head_stride, D, x->kvrow);
        double dot = 0.0;
        for (int64_t d = 0; d < D; d++) dot += x->qrow[d] * (x->kvrow[d] * kd);
        double s = (double)p->scale * dot;
        if (p->softcap > 0.0f) s = (double)p->softcap * tanh(s / (double)p->softcap);
        x->score[j] = s;
        if (s > *mx) *mx = s;
        visible++;
    }
    return visible;
}

/* sum_j exp(score_j - mx) v_j over the keys row i sees, into x->acc; the
 * sum of the weights. */
static double row_sum(const fc_fwd_params *p, const seq_view *sv, int hk, int64_t i, double vd, double mx,
                      ref_scratch *x)
{
    const int64_t D = p->head_dim;
    double sum = 0.0;
    for (int64_t d = 0; d < D; d++) x->acc[d] = 0.0;
    for (int64_t j = 0; j < sv->sk; j++) {
        if (!fc_key_visible(i, j, sv->sq, sv->sk, p->window_left, p->window_right)) continue;
        const int64_t vj = fc_key_offset(fc_key_slot_of(p, (int)sv->b, j), sv->v, p->v_row_stride, p->v_batch_stride);
        fc_ref_load_row(p->v, p->kv_dtype, vj + hk * p->v_head_stride, D, x->kvrow);
        double w = exp(x->score[j] - mx);
        sum += w;
        for (int64_t d = 0; d < D; d++) x->acc[d] += w * (x->kvrow[d] * vd);
    }
    return sum;
}

/* Query row i of head h of sequence sv: its out and lse; the FP8
 * statistics (out_amax, p_amax) updated. */
static void ref_row(const fc_fwd_params *p, const seq_view *sv, int h, int64_t i, ref_scratch *x, double *out_amax,
                    double *p_amax)
{
    const int64_t D = p->head_dim, b = sv->b;
    const int hk = h / (p->heads_q / p->heads_kv);
    const double qd = fc_descale_at(&p->q_descale, (int)b, hk), kd = fc_descale_at(&p->k_descale, (int)b, hk);
    const double vd = fc_descale_at(&p->v_descale, (int)b, hk);
    const int64_t orow = sv->o + i * p->o_row_stride + h * p->o_head_stride;
    float *lse = p->lse ? p->lse + sv->lse + h * p->lse_head_stride + i * p->lse_row_stride : NULL;
    fc_ref_load_row(p->q, p->dtype, sv->q + i * p->q_row_stride + h * p->q_head_stride, D, x->qrow);
    for (int64_t d = 0; d < D; d++) x->qrow[d] *= qd; /* FP8: dequantised exactly */
    double mx;
    if (row_scores(p, sv, hk, i, kd, x, &mx) == 0) { /* nothing to attend to: defined as 0 and -inf */
        for (int64_t d = 0; d < D; d++) fc_ref_store(p->o, p->o_dtype, orow + d, 0.0);
        if (lse) *lse = -INFINITY;
        return;
    }
    const double sum = row_sum(p, sv, hk, i, vd, mx, x);
    for (int64_t d = 0; d < D; d++) fc_ref_store(p->o, p->o_dtype, orow + d, x->acc[d] / sum);
    if (p->out_amax) *out_amax = row_amax(p, orow, D, x->kvrow, *out_amax);
    *p_amax = fc_nan_max(*p_amax, 1.0 / sum); /* exp(mx - mx) = 1 is the row's largest */
    if (lse) *lse = (float)(mx + log(sum));
}

fc_status fc_cpu_reference_forward(const fc_fwd_params *p, char *err, size_t err_len)
{
    ref_scratch x;
    const fc_status st = scratch_alloc(p, &x, err, err_len);
    if (st != FC_OK) return st;
    double out_amax = 0.0, p_amax = 0.0; /* FP8 statistics */
    for (int b = 0; b < p->batch; b++) {
        seq_view sv;
        seq_view_of(p, b, &sv);
        for (int h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < sv.sq; i++) ref_row(p, &sv, h, i, &x, &out_amax, &p_amax);
    }
    scratch_free(&x);
    if (p->out_amax) *p->out_amax = (float)out_amax; /* a stored value: exact */
    if (p->p_amax) *p->p_amax = (float)p_amax;
    return FC_OK;
}
