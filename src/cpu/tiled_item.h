/*
 * tiled_item.h -- one work item of the tiled CPU path (src/cpu/tiled.c):
 * conversion in and out, the row-group step and run_item, with the kernels of
 * tiled_kernels.h. Included by tiled.c once per instruction set, with
 * FC_ISA(name) naming that variant (run_item_generic, run_item_avx2), so the
 * same C is compiled for SSE2 (any x86-64, any other architecture) and for
 * AVX2, which the compiler vectorizes 8 floats wide. No include guard: that
 * is the point. Needs the types and helpers defined above it in tiled.c.
 */
#ifndef FC_ISA
#error "tiled_item.h: define FC_ISA(name) before including"
#endif

#include "tiled_kernels.h" /* first: the AVX2 variant's conversions are in tiled_avx2.h */
#include "tiled_convert.h"

/* load_f32 of an FP8 call's tensor, times its descale ds (the dequantised
 * input, rounded once to float; ds 1 for the others: nothing to do). */
static void FC_ISA(load_scaled)(const void *src, int32_t dtype, int64_t off, int64_t n, float *dst, float ds)
{
    FC_ISA(load_f32)(src, dtype, off, n, dst);
    if (ds != 1.0f)
        for (int64_t x = 0; x < n; x++) dst[x] *= ds;
}

/* *amax = max(*amax, |row|) over the n elements written at off (FP8 calls'
 * out_amax: the values as stored), read back through tmp. */
static void FC_ISA(amax_row)(const void *o, int32_t dtype, int64_t off, int64_t n, float *tmp, float *amax)
{
    FC_ISA(load_f32)(o, dtype, off, n, tmp);
    for (int64_t x = 0; x < n; x++) *amax = (float)fc_nan_max(*amax, fabsf(tmp[x]));
}

/* The rows [rg, rg+ROWS) of the item against the key block [j0, j0+nb). */
static void FC_ISA(run_row_group)(const tiled_job *job, tile_scratch *t, int rg, int nr, int64_t j0, int nb)
{
    const int64_t dp = job->dp;
    int a[ROWS], e[ROWS], ua, ue, same;
    if (!tile_ranges(t->lo, t->hi, rg, nr, j0, nb, a, e, &ua, &ue, &same))
        return; /* no row of the group sees this block */

    /* Scores over the union of the rows' ranges, whole register tiles; what a
     * row does not see is computed but never read. */
    const int c0 = ua & ~(VEC_W - 1), c1 = (ue + VEC_W - 1) & ~(VEC_W - 1);
    if (t->blk64) FC_ISA(scores_rows_f64)(t->qd + rg * dp, dp, t->ktd, t->sd, c0, c1, job->qscale);
#if defined(FC_ISA_BF16)
    else if (job->bf16dot) scores_pairs_bf16(t->qh + rg * dp / 2, dp / 2, t->kth, t->s, c0, c1, (float)job->qscale);
#endif
    else FC_ISA(scores_rows)(t->q + rg * dp, dp, t->kt, t->s, c0, c1, (float)job->qscale);

    for (int x = 0; x < ROWS; x++) {
        if (a[x] >= e[x]) continue;
        const int rr = rg + x;
        float *w = t->s + x * TILE_N;
        float sub;
        const float alpha =
            t->blk64 ? FC_ISA(shift_row_f64)(t->sd + x * TILE_N, w, a[x], e[x], job->cap, &t->m[rr], &sub)
                     : FC_ISA(shift_row)(w, a[x], e[x], (float)job->cap, &t->m[rr], &sub);
        FC_ISA(finish_row)(w, a[x], e[x], sub, alpha, &t->l[rr], t->o + rr * dp, dp);
    }
    FC_ISA(wsum_rows)(t->s, t->v, dp, t->o + rg * dp, a, e, same, t->pt);
}

/* Key rows [j0, j0+nb) of kv head g into the K^T and V blocks; for f32
 * outputs, whether the block's scores need double (t->blk64), and if so
 * K^T in double too. */
static void FC_ISA(load_kv_block)(const tiled_job *job, tile_scratch *t, const seq_view *sv, int g, int64_t j0,
                          int nb)
{
    const fc_fwd_params *p = job->p;
    const int64_t D = p->head_dim, dp = job->dp;
    double kn2 = 0.0; /* the largest squared key norm */
    fc_key_slot slot[TILE_N]; /* one page lookup per key, for K and V */
    for (int jj = 0; jj < nb; jj++) slot[jj] = fc_key_slot_of(p, sv->b, j0 + jj);
    for (int jj = 0; jj < nb; jj++) {
        if (jj + PREFETCH_AHEAD < nb) { /* the rows are heads apart: no hardware prefetch */
            const fc_key_slot ka = slot[jj + PREFETCH_AHEAD];
            prefetch_row(p->k, fc_key_offset(ka, sv->k, p->k_row_stride, p->k_batch_stride) +
                                   (int64_t)g * p->k_head_stride, D, p->kv_dtype);
            prefetch_row(p->v, fc_key_offset(ka, sv->v, p->v_row_stride, p->v_batch_stride) +
                                   (int64_t)g * p->v_head_stride, D, p->kv_dtype);
        }
        /* convert contiguously (vectorizes), transposed below */
        const int64_t koff = fc_key_offset(slot[jj], sv->k, p->k_row_stride, p->k_batch_stride);
        const int64_t voff = fc_key_offset(slot[jj], sv->v, p->v_row_stride, p->v_batch_stride);
        float *kr = t->kr + jj * dp;
        FC_ISA(load_scaled)(p->k, p->kv_dtype, koff + (int64_t)g * p->k_head_stride, D, kr, t->k_ds);
        if (job->f64) kn2 = fmax(kn2, FC_ISA(norm2)(kr, D));
        FC_ISA(load_scaled)(p->v, p->kv_dtype, voff + (int64_t)g * p->v_head_stride, D, t->v + jj * dp, t->v_ds);
    }
    FC_ISA(rows_to_cols)(t->kr, dp, nb, t->kt); /* K^T */
#if defined(FC_ISA_BF16)
    if (job->bf16dot) pack_block_bf16(t->kt, dp, (nb + VEC_W - 1) & ~(VEC_W - 1), t->kth);
#endif
    const fc_score_ops ops = {t->q, t->kt, t->qd, t->ktd, t->qn2, kn2, dp, D, t->nq, &t->nqd, nb};
    t->blk64 = job->f64 && fc_double_scores(job->lscale, &ops);
}

static void FC_ISA(run_item)(const tiled_job *job, tile_scratch *t, int b, int g, int64_t tile)
{
    const fc_fwd_params *p = job->p;
    seq_view sv;
    seq_view_of(p, b, &sv);
    const int G = job->group;
    const int64_t D = p->head_dim, dp = job->dp;
    const int64_t rows = sv.sq * G, r0 = tile * TILE_M;
    const int nr = (int)(rows - r0 < TILE_M ? rows - r0 : TILE_M);
    const int nr_pad = (nr + ROWS - 1) / ROWS * ROWS;
    t->nq = nr_pad;

    t->q_ds = fc_descale_at(&p->q_descale, b, g); /* FP8: this item's descales */
    t->k_ds = fc_descale_at(&p->k_descale, b, g);
    t->v_ds = fc_descale_at(&p->v_descale, b, g);
    /* Q rows; visible ranges; fresh softmax state. */
    int64_t jlo = INT64_MAX, jhi = 0;
    double qn2 = 0.0;
    for (int rr = 0; rr < nr; rr++) {
        const int64_t r = r0 + rr, i = r / G;
        const int h = g * G + (int)(r % G);
        const int64_t qoff = sv.q + i * p->q_row_stride + h * p->q_head_stride;
        FC_ISA(load_scaled)(p->q, p->dtype, qoff, D, t->q + rr * dp, t->q_ds);
        if (job->f64) qn2 = fmax(qn2, FC_ISA(norm2)(t->q + rr * dp, D));
        visible_range(i, sv.sq, sv.sk, p->window_left, p->window_right, &t->lo[rr], &t->hi[rr]);
        if (t->lo[rr] < t->hi[rr]) {
            if (t->lo[rr] < jlo) jlo = t->lo[rr];
            if (t->hi[rr] > jhi) jhi = t->hi[rr];
        }
        t->m[rr] = -INFINITY;
        t->l[rr] = 0.0f;
        memset(t->o + rr * dp, 0, (size_t)dp * sizeof(float));
    }
    /* Rows past the end of the sequence fill out the last register tile:
     * zero, so the scores computed for them are finite and never read. */
    if (nr_pad > nr) memset(t->q + nr * dp, 0, (size_t)((nr_pad - nr) * dp) * sizeof(float));
#if defined(FC_ISA_BF16)
    if (job->bf16dot) pack_rows_bf16(t->q, dp, nr_pad, t->qh);
#endif
    t->qn2 = qn2;
    t->nqd = 0; /* the double Q rows: at the item's first double-score block */

    /* Only the key blocks some row of the tile can see. */
    for (int64_t j0 = jlo; j0 < jhi; j0 += TILE_N) {
        const int nb = (int)(jhi - j0 < TILE_N ? jhi - j0 : TILE_N);
        FC_ISA(load_kv_block)(job, t, &sv, g, j0, nb);
        for (int rg = 0; rg < nr; rg += ROWS) FC_ISA(run_row_group)(job, t, rg, nr, j0, nb);
    }

    /* Normalise and write; rows that see no key get 0 and lse = -inf. */
    for (int rr = 0; rr < nr; rr++) {
        const int64_t r = r0 + rr, i = r / G;
        const int h = g * G + (int)(r % G);
        const int empty = t->lo[rr] >= t->hi[rr];
        const int64_t off = sv.o + i * p->o_row_stride + h * p->o_head_stride;
        FC_ISA(store_row)(p->o, p->o_dtype, off, D, empty ? NULL : t->o + rr * dp, t->l[rr]);
        if (p->out_amax) FC_ISA(amax_row)(p->o, p->o_dtype, off, D, t->kr, &t->out_amax); /* kr: scratch */
        if (p->p_amax && !empty) t->p_amax = (float)fc_nan_max(t->p_amax, 1.0f / t->l[rr]);
        if (p->lse) {
            /* natural log: (m + log2 l) * ln 2 */
            float lse = empty ? -INFINITY : (float)((t->m[rr] + log2((double)t->l[rr])) * k_ln2);
            p->lse[sv.lse + h * p->lse_head_stride + i * p->lse_row_stride] = lse;
        }
    }
}

