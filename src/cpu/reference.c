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

fc_status fc_cpu_reference_forward(const fc_fwd_params *p, char *err, size_t err_len)
{
    const int varlen = p->cu_seqlens_q != NULL;
    const int64_t D = p->head_dim;
    const int group = p->heads_q / p->heads_kv;

    /* Longest key sequence: the size of the per-row score scratch. From the
     * real lengths: max_seqlen_k is only a bound (INT32_MAX would ask for
     * 16 GiB on a 5-token call). */
    int64_t max_sk = 0; /* (a paged seqlen_k is the capacity, too) */
    for (int b = 0; b < p->batch; b++) {
        const int64_t sk = fc_used_keys(p, b);
        if (sk > max_sk) max_sk = sk;
    }
    double *score = malloc((size_t)(max_sk > 0 ? max_sk : 1) * sizeof(double)); /* [max_sk] */
    double *acc = malloc((size_t)(D > 0 ? D : 1) * sizeof(double));             /* [D]      */
    double *qrow = malloc((size_t)(D > 0 ? D : 1) * sizeof(double));            /* [D]      */
    double *kvrow = malloc((size_t)(D > 0 ? D : 1) * sizeof(double));           /* [D]      */
    if (!score || !acc || !qrow || !kvrow) {
        free(score);
        free(acc);
        free(qrow);
        free(kvrow);
        snprintf(err, err_len,
                 "cpu reference: cannot allocate %lld bytes of row scratch (seqlen_k %lld, head_dim %lld)",
                 (long long)((max_sk + 3 * D) * (int64_t)sizeof(double)), (long long)max_sk, (long long)D);
        return FC_ERR_OUT_OF_MEMORY;
    }

    double out_amax = 0.0, p_amax = 0.0; /* FP8 statistics */
    for (int b = 0; b < p->batch; b++) {
        int64_t sq = p->seqlen_q;
        const int64_t sk = fc_used_keys(p, b);
        int64_t q0 = (int64_t)b * p->q_batch_stride, o0 = (int64_t)b * p->o_batch_stride;
        int64_t l0 = (int64_t)b * p->lse_batch_stride, k0 = 0, v0 = 0; /* keys: fc_key_offset */
        if (varlen) { /* sequence b is a run of tokens; offsets are token offsets */
            int64_t tq = p->cu_seqlens_q[b], tk = p->cu_seqlens_k[b];
            sq = p->cu_seqlens_q[b + 1] - tq;
            q0 = tq * p->q_row_stride;
            o0 = tq * p->o_row_stride;
            l0 = tq * p->lse_row_stride;
            k0 = tk * p->k_row_stride;
            v0 = tk * p->v_row_stride;
        }
        for (int h = 0; h < p->heads_q; h++) {
            const int hk = h / group;
            const double qd = fc_descale_at(&p->q_descale, b, hk), kd = fc_descale_at(&p->k_descale, b, hk);
            const double vd = fc_descale_at(&p->v_descale, b, hk);
            for (int64_t i = 0; i < sq; i++) {
                const int64_t qrow0 = q0 + i * p->q_row_stride + h * p->q_head_stride;
                const int64_t orow = o0 + i * p->o_row_stride + h * p->o_head_stride;
                fc_ref_load_row(p->q, p->dtype, qrow0, D, qrow);
                for (int64_t d = 0; d < D; d++) qrow[d] *= qd; /* FP8: dequantised exactly */
                int64_t visible = 0;
                double mx = -INFINITY;
                for (int64_t j = 0; j < sk; j++) {
                    if (!fc_key_visible(i, j, sq, sk, p->window_left, p->window_right)) continue;
                    const int64_t kj = fc_key_offset(fc_key_slot_of(p, b, j), k0, p->k_row_stride, p->k_batch_stride);
                    fc_ref_load_row(p->k, p->kv_dtype, kj + hk * p->k_head_stride, D, kvrow);
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++) dot += qrow[d] * (kvrow[d] * kd);
                    double s = (double)p->scale * dot;
                    if (p->softcap > 0.0f) s = (double)p->softcap * tanh(s / (double)p->softcap);
                    score[j] = s;
                    if (s > mx) mx = s;
                    visible++;
                }
                if (visible == 0) { /* nothing to attend to: defined as 0 and -inf */
                    for (int64_t d = 0; d < D; d++) fc_ref_store(p->o, p->o_dtype, orow + d, 0.0);
                    if (p->lse) p->lse[l0 + h * p->lse_head_stride + i * p->lse_row_stride] = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int64_t d = 0; d < D; d++) acc[d] = 0.0;
                for (int64_t j = 0; j < sk; j++) {
                    if (!fc_key_visible(i, j, sq, sk, p->window_left, p->window_right)) continue;
                    const int64_t vj = fc_key_offset(fc_key_slot_of(p, b, j), v0, p->v_row_stride, p->v_batch_stride);
                    fc_ref_load_row(p->v, p->kv_dtype, vj + hk * p->v_head_stride, D, kvrow);
                    double w = exp(score[j] - mx);
                    sum += w;
                    for (int64_t d = 0; d < D; d++) acc[d] += w * (kvrow[d] * vd);
                }
                for (int64_t d = 0; d < D; d++) fc_ref_store(p->o, p->o_dtype, orow + d, acc[d] / sum);
                if (p->out_amax) out_amax = row_amax(p, orow, D, kvrow, out_amax);
                p_amax = fc_nan_max(p_amax, 1.0 / sum); /* exp(mx - mx) = 1 is the row's largest */
                if (p->lse)
                    p->lse[l0 + h * p->lse_head_stride + i * p->lse_row_stride] = (float)(mx + log(sum));
            }
        }
    }
    free(score);
    free(acc);
    free(qrow);
    free(kvrow);
    if (p->out_amax) *p->out_amax = (float)out_amax; /* a stored value: exact */
    if (p->p_amax) *p->p_amax = (float)p_amax;
    return FC_OK;
}
