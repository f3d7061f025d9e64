/*
 * append.c -- the append step of a forward call on host memory, for both
 * CPU backends: k_new / v_new written into the cache after each sequence's
 * seqused_k keys, k_new and q rotated when rotary tables are given (in
 * double, rounded once to the dtype; the CUDA step, cuda/append.cu, does
 * the same in fp32). The attention then runs, unchanged, on the rotated q
 * and the longer lengths.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ref_io.h"
#include "internal.h"

/* x (head_dim doubles) rotated to position pos: the first rotary_dim dims
 * in pairs (2i, 2i+1) when interleaved, else (i, i + rotary_dim/2). cs, sn:
 * room for rotary_dim/2 doubles each. */
static void rotate_row(const fc_append_params *ap, int32_t dt, int64_t pos, double *x, double *cs, double *sn)
{
    const int half = ap->rotary_dim / 2;
    fc_ref_load_row(ap->cos, dt, pos * ap->cos_row_stride, half, cs);
    fc_ref_load_row(ap->sin, dt, pos * ap->sin_row_stride, half, sn);
    for (int i = 0; i < half; i++) {
        const int a = ap->interleaved ? 2 * i : i, b = ap->interleaved ? 2 * i + 1 : i + half;
        const double xa = x[a], xb = x[b];
        x[a] = xa * cs[i] - xb * sn[i];
        x[b] = xb * cs[i] + xa * sn[i];
    }
}

/* Row (b, t, h) of k_new (rotated to its key position) and v_new into the
 * cache slot of key seqused_k[b] + t. */
static void append_row(const fc_fwd_params *p, int64_t b, int64_t t, int64_t h, double *x, double *cs, double *sn)
{
    const fc_append_params *ap = &p->app;
    const int64_t j = p->seqused_k[b] + t, d = p->head_dim;
    const fc_key_slot slot = fc_key_slot_of(p, b, j);
    const int64_t kd = fc_key_offset(slot, h * p->k_head_stride, p->k_row_stride, p->k_batch_stride);
    const int64_t vd = fc_key_offset(slot, h * p->v_head_stride, p->v_row_stride, p->v_batch_stride);
    fc_ref_load_row(ap->k_new, p->dtype, b * ap->kn_batch_stride + t * ap->kn_row_stride + h * ap->kn_head_stride, d, x);
    if (ap->cos) rotate_row(ap, p->dtype, j, x, cs, sn);
    for (int64_t e = 0; e < d; e++) fc_ref_store((void *)p->k, p->dtype, kd + e, x[e]); /* the cache is written */
    fc_ref_load_row(ap->v_new, p->dtype, b * ap->vn_batch_stride + t * ap->vn_row_stride + h * ap->vn_head_stride, d, x);
    for (int64_t e = 0; e < d; e++) fc_ref_store((void *)p->v, p->dtype, vd + e, x[e]);
}

/* q rotated into qr, contiguous [batch, seqlen_q, heads_q, head_dim]. */
static void rotate_q(const fc_fwd_params *p, void *qr, double *x, double *cs, double *sn)
{
    const int64_t d = p->head_dim, step = fc_rotary_q_step(p);
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->seqlen_q; i++)
            for (int64_t h = 0; h < p->heads_q; h++) {
                fc_ref_load_row(p->q, p->dtype, b * p->q_batch_stride + i * p->q_row_stride + h * p->q_head_stride, d, x);
                rotate_row(&p->app, p->dtype, p->seqused_k[b] + i * step, x, cs, sn);
                const int64_t o = ((b * p->seqlen_q + i) * p->heads_q + h) * d;
                for (int64_t e = 0; e < d; e++) fc_ref_store(qr, p->dtype, o + e, x[e]);
            }
}

fc_status fc_cpu_append(const fc_fwd_params *p, fc_fwd_params *lp, void **scratch, char *err, size_t err_len)
{
    const fc_append_params *ap = &p->app;
    const int64_t d = p->head_dim;
    const int64_t q_bytes = ap->cos ? (int64_t)p->batch * p->seqlen_q * p->heads_q * d * fc_dtype_bytes(p->dtype) : 0;
    const int64_t q_room = (q_bytes + 7) / 8 * 8;
    const size_t bytes = (size_t)q_room + 3 * (size_t)d * sizeof(double) + (size_t)p->batch * sizeof(int32_t);
    char *s = malloc(bytes);
    *scratch = s;
    if (!s) {
        snprintf(err, err_len, "cannot allocate %zu bytes of host memory for the append step", bytes);
        return FC_ERR_OUT_OF_MEMORY;
    }
    double *x = (double *)(s + q_room), *cs = x + d, *sn = cs + d;
    int32_t *used = (int32_t *)(sn + d);
    for (int64_t b = 0; b < p->batch; b++) {
        for (int64_t t = 0; t < ap->seqlen_new; t++)
            for (int64_t h = 0; h < p->heads_kv; h++) append_row(p, b, t, h, x, cs, sn);
        used[b] = p->seqused_k[b] + ap->seqlen_new; /* fc_check_paged: within the cache */
    }
    if (ap->cos) rotate_q(p, s, x, cs, sn);
    fc_append_result(p, lp, ap->cos ? s : NULL, used);
    return FC_OK;
}
