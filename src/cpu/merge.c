/*
 * merge.c -- fc_attention_merge on host memory: each (batch, position,
 * head) row of the merged output from the parts' rows, weighted by
 * exp(lse_i - max) and summed in fp32 in part order (so the thread count
 * never changes a bit), then divided once by the weights' sum.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_dtype.h"
#include "internal.h"
#include "pool.h"

/* The tiled paths' row conversions (load_f32_merge, store_row_merge), in
 * plain C: the merge is bound by its loads. */
#define FC_ISA(name) name##_merge
#include "tiled_convert.h"
#undef FC_ISA

#define MAX_THREADS 256

typedef struct merge_job {
    const fc_merge_params *m;
    float **acc; /* per worker: head_dim floats twice (the sum, a part's
                  * row), then num_parts weights */
} merge_job;

static const void *at(const fc_merge_tensor *t, int64_t b, int64_t s, int64_t h)
{
    const int64_t off = b * t->batch_stride + s * t->row_stride + h * t->head_stride;
    return (const char *)t->data + off * (int64_t)fc_dtype_bytes((fc_dtype)t->dtype);
}

/* One merged row: the largest lse, the weights, the weighted sum (row:
 * head_dim floats of scratch for a part's row). */
static void merge_row(const fc_merge_params *m, float *acc, float *row, float *w, int64_t b, int64_t s, int64_t h)
{
    float mx = -INFINITY;
    int nan = 0; /* a NaN lse makes the row NaN (its weight below is NaN) */
    for (int i = 0; i < m->num_parts; i++) {
        w[i] = *(const float *)at(&m->parts_lse[i], b, s, h);
        nan |= isnan(w[i]);
        if (w[i] > mx) mx = w[i];
    }
    void *dst = (void *)at(&m->out, b, s, h);
    float *lse = m->lse.data ? (float *)at(&m->lse, b, s, h) : NULL;
    if (mx == -INFINITY && !nan) { /* no part saw a key */
        store_row_merge(dst, m->out.dtype, 0, m->head_dim, NULL, 1.0f);
        if (lse) *lse = -INFINITY;
        return;
    }
    float sum = 0.0f;
    for (int64_t x = 0; x < m->head_dim; x++) acc[x] = 0.0f;
    for (int i = 0; i < m->num_parts; i++) {
        if (w[i] == -INFINITY) continue; /* its row is not read */
        w[i] = expf(w[i] - mx);
        sum += w[i];
        load_f32_merge(at(&m->parts_out[i], b, s, h), m->parts_out[i].dtype, 0, m->head_dim, row);
        for (int64_t x = 0; x < m->head_dim; x++) acc[x] += w[i] * row[x];
    }
    store_row_merge(dst, m->out.dtype, 0, m->head_dim, acc, sum);
    if (lse) *lse = mx + logf(sum);
}

/* Item = one (batch, position): its heads. */
static void run_item(void *arg, int worker, int64_t item)
{
    const merge_job *job = arg;
    const fc_merge_params *m = job->m;
    float *acc = job->acc[worker], *row = acc + m->head_dim, *w = row + m->head_dim;
    const int64_t b = item / m->seqlen, s = item % m->seqlen;
    for (int64_t h = 0; h < m->heads; h++) merge_row(m, acc, row, w, b, s, h);
}

fc_status fc_cpu_merge(const fc_merge_params *m, int num_threads, fc_pool *pool, char *err, size_t err_len)
{
    const int64_t items = m->batch * m->seqlen;
    if (items == 0) return FC_OK;
    const int64_t work = items * m->heads * m->head_dim * m->num_parts;
    const int nt = fc_pool_threads(num_threads, MAX_THREADS, items, work, FC_POOL_MIN_MACS);
    const size_t bytes = ((size_t)(2 * m->head_dim + m->num_parts) * sizeof(float) + 63) / 64 * 64;
    merge_job job = {m, (float **)fc_pool_blocks(pool, nt, bytes)};
    if (!job.acc) {
        snprintf(err, err_len, "merge: out of memory for %d x %zu bytes of scratch", nt, bytes);
        return FC_ERR_OUT_OF_MEMORY;
    }
    fc_pool_run(pool, nt, items, run_item, &job);
    fc_pool_blocks_free(pool, (void **)job.acc, nt);
    return FC_OK;
}
