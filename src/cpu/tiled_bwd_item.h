/*
 * tiled_bwd_item.h -- the work items of the tiled CPU backward
 * (src/cpu/tiled_bwd.c): loading rows and blocks, the register-tile step
 * and the two item kinds. Included by tiled_bwd.c once per instruction
 * set with FC_ISA(name) naming the variant, as tiled_item.h is by tiled.c:
 * no include guard. Needs the types defined above it in tiled_bwd.c.
 */
#ifndef FC_ISA
#error "tiled_bwd_item.h: define FC_ISA(name) before including"
#endif

#include "tiled_kernels.h" /* first: the AVX2 variant's conversions are in tiled_avx2.h */
#include "tiled_convert.h"

/* ---- rows in and out ------------------------------------------------------------ */

/* Element off.. of src (head_dim of them) into t->row as fp32; returns it. */
static const float *FC_ISA(get_row)(const bwd_job *job, bwd_scratch *t, const void *src, int64_t off)
{
    FC_ISA(load_f32)(src, job->p->f.dtype, off, job->p->f.head_dim, t->row);
    return t->row;
}


/* A row as column c of a transposed block (rows TILE_N apart), in fp32 or,
 * when dt is not NULL, in double. */
static void FC_ISA(put_col)(const float *row, int64_t D, float *ft, double *dt, int c)
{
    if (dt)
        for (int64_t d = 0; d < D; d++) dt[d * TILE_N + c] = row[d];
    else
        for (int64_t d = 0; d < D; d++) ft[d * TILE_N + c] = row[d];
}

/* The double twin of an fp32 row (f32 inputs), when there is one. */
static void FC_ISA(twin)(const float *f, double *d, int64_t D)
{
    if (d)
        for (int64_t x = 0; x < D; x++) d[x] = f[x];
}

/* Columns [nb, nb_pad) of a transposed block, which the last register tile
 * reads: zero. */
static void FC_ISA(zero_cols)(int64_t D, int nb, float *ft, double *dt)
{
    const int nb_pad = (nb + VEC_W - 1) & ~(VEC_W - 1);
    for (int64_t d = 0; d < D; d++)
        for (int c = nb; c < nb_pad; c++) {
            if (dt) dt[d * TILE_N + c] = 0.0;
            else ft[d * TILE_N + c] = 0.0f;
        }
}

/* Item rows [n, n rounded up to ROWS) of the S and dP operands: zero, so
 * the products computed for them are finite and never read. */
static void FC_ISA(zero_pad_rows)(const bwd_job *job, bwd_scratch *t, int n)
{
    const int n_pad = (n + ROWS - 1) / ROWS * ROWS;
    const size_t k = (size_t)((n_pad - n) * job->dp);
    memset(t->a1 + n * job->dp, 0, k * sizeof(float));
    memset(t->a2 + n * job->dp, 0, k * sizeof(float));
    if (t->a2d) memset(t->a2d + n * job->dp, 0, k * sizeof(double));
    t->na1 = n_pad;
    t->na1d = 0; /* the double S rows: at the item's first double-score block */
}

/* The item's S operand row rr (a float row of D elements) and its norm. */
static void FC_ISA(put_a1)(bwd_scratch *t, int64_t dp, int rr, const float *row, int64_t D)
{
    memcpy(t->a1 + rr * dp, row, (size_t)D * sizeof(float));
    t->a1n2 = fmax(t->a1n2, FC_ISA(norm2)(row, D));
}

/* After a block's S operand is in b1t (bn2: its largest squared norm): are
 * its scores double? If so, the double copies of it and of the item's rows. */
static void FC_ISA(choose_scores)(const bwd_job *job, bwd_scratch *t, int64_t D, int nb, double bn2)
{
    const fc_score_ops ops = {t->a1, t->b1t, t->a1d, t->b1td, t->a1n2, bn2, job->dp, D, t->na1, &t->na1d, nb};
    /* f32: always double. dq = sum_j dS_j k_j cancels (sum_j dS_j = 0), and
     * fp32 scores' relative error, carried by every dS_j, left a lone query's
     * dq 1.2e-4 off at logits far below the bound (fuzz/corpus/bwd-f32-cancel.bin) */
    t->blk64 = fc_double_scores(job->dp64 ? INFINITY : job->lscale, &ops);
}

/* acc (head_dim elements) times mul, rounded once to the dtype at off. */
static void FC_ISA(store_acc)(const bwd_job *job, void *dst, int64_t off, float *acc, float mul)
{
    const int64_t D = job->p->f.head_dim;
    for (int64_t d = 0; d < D; d++) acc[d] *= mul;
    FC_ISA(store_row)(dst, job->p->f.dtype, off, D, acc, 1.0f);
}

/* ---- one register tile ---------------------------------------------------------- */

/* Row x of the tile over its columns [a, e): scores (t->sd) to P in t->s,
 * dP (t->dpv or t->dpd) to dS in t->dpv, with each column's lse L and D. */
static void FC_ISA(grad_row)(const bwd_job *job, bwd_scratch *t, int x, int a, int e, const double *L,
                             const double *D)
{
    float *s = t->s + x * TILE_N, *dpv = t->dpv + x * TILE_N;
    const double *sd = t->sd + x * TILE_N;
    if (job->cap > 0.0)
        for (int j = a; j < e; j++) {
            const double th = tanh(sd[j]);
            /* in double: near saturation 1 - tanh^2 is below fp32's quantum at 1 */
            t->cf[j] = (float)(1.0 - th * th);
            s[j] = (float)(job->cap * th - L[j]);
        }
    else
        for (int j = a; j < e; j++) s[j] = (float)(sd[j] - L[j]);
    if (job->dp64) {
        const double *dpd = t->dpd + x * TILE_N;
        for (int j = a; j < e; j++) dpv[j] = (float)(dpd[j] - D[j]);
    } else {
        for (int j = a; j < e; j++) dpv[j] = dpv[j] - (float)D[j];
    }
    /* P = 2^(S - lse) is at most 1 up to rounding: exp2_le0 takes the few
     * ulp above 0 exactly (see its comment) */
    for (int j = a; j < e; j++) {
        const float P = FC_ISA(exp2_le0)(s[j]);
        s[j] = P;
        dpv[j] = P * dpv[j];
    }
    if (job->cap > 0.0)
        for (int j = a; j < e; j++) dpv[j] *= t->cf[j];
}

/* Rows [rg, rg+ROWS) of the item against the streamed block [j0, j0+nb):
 * S and dP over the union of the rows' ranges, P and dS per row, then
 * acc1 += dS . b4 and (kv pass) acc2 += P . b3. L, D: per column (kv pass:
 * the block's) or NULL (q pass: each row's own, broadcast). */
static void FC_ISA(tile_step)(const bwd_job *job, bwd_scratch *t, int rg, int nr, int64_t j0, int nb, int kv)
{
    const int64_t dp = job->dp;
    int a[ROWS], e[ROWS], ua, ue, same;
    if (!tile_ranges(t->lo, t->hi, rg, nr, j0, nb, a, e, &ua, &ue, &same)) return;
    const int c0 = ua & ~(VEC_W - 1), c1 = (ue + VEC_W - 1) & ~(VEC_W - 1);
    if (t->blk64) {
        FC_ISA(scores_rows_f64)(t->a1d + rg * dp, dp, t->b1td, t->sd, c0, c1, job->qscale);
    } else { /* fp32 scores, widened for grad_row */
        FC_ISA(scores_rows)(t->a1 + rg * dp, dp, t->b1t, t->s, c0, c1, (float)job->qscale);
        for (int x = 0; x < ROWS; x++)
            for (int j = c0; j < c1; j++) t->sd[x * TILE_N + j] = t->s[x * TILE_N + j];
    }
    if (job->dp64) FC_ISA(scores_rows_f64)(t->a2d + rg * dp, dp, t->b2td, t->dpd, c0, c1, 1.0);
    else FC_ISA(scores_rows)(t->a2 + rg * dp, dp, t->b2t, t->dpv, c0, c1, 1.0f);
    for (int x = 0; x < ROWS; x++) {
        if (a[x] >= e[x]) continue;
        if (!kv) /* the row's own lse and D in every column */
            for (int j = a[x]; j < e[x]; j++) {
                t->bL[j] = t->aL[rg + x];
                t->bD[j] = t->aD[rg + x];
            }
        FC_ISA(grad_row)(job, t, x, a[x], e[x], t->bL, t->bD);
    }
    FC_ISA(wsum_rows)(t->dpv, t->b4, dp, t->acc1 + rg * dp, a, e, same, t->pt);
    if (kv) FC_ISA(wsum_rows)(t->s, t->b3, dp, t->acc2 + rg * dp, a, e, same, t->pt);
}

/* Forward declarations: sweep loads either side's blocks. */
static void FC_ISA(k_block)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int g, int64_t j0, int nb);
static void FC_ISA(q_block)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int b, int g, int64_t r0,
                            int nb);

/* The item's n rows (loaded, ranges set) against every block of the other
 * side that one of them sees: key blocks (q pass) or blocks of packed
 * query rows (kv pass). */
static void FC_ISA(sweep)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int b, int g, int n, int kv)
{
    int64_t lo = INT64_MAX, hi = 0;
    for (int x = 0; x < n; x++)
        if (t->lo[x] < t->hi[x]) {
            if (t->lo[x] < lo) lo = t->lo[x];
            if (t->hi[x] > hi) hi = t->hi[x];
        }
    FC_ISA(zero_pad_rows)(job, t, n);
    for (int64_t c0 = lo; c0 < hi; c0 += TILE_N) {
        const int nb = (int)(hi - c0 < TILE_N ? hi - c0 : TILE_N);
        if (kv) FC_ISA(q_block)(job, t, sv, b, g, c0, nb);
        else FC_ISA(k_block)(job, t, sv, g, c0, nb);
        for (int rg = 0; rg < n; rg += ROWS) FC_ISA(tile_step)(job, t, rg, n, c0, nb, kv);
    }
}

/* ---- the q pass: dQ of TILE_M packed query rows ------------------------------------ */

/* Packed row rr of the item (query i, head h): its Q and dO rows, its lse
 * and D (kept in job->L/D for the kv pass), its visible keys. */
static void FC_ISA(q_row)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int b, int rr, int64_t i,
                          int h)
{
    const fc_bwd_params *p = job->p;
    const fc_fwd_params *f = &p->f;
    const int64_t D = f->head_dim, dp = job->dp;
    const float *q = FC_ISA(get_row)(job, t, f->q, sv->q + i * f->q_row_stride + h * f->q_head_stride);
    FC_ISA(put_a1)(t, dp, rr, q, D);
    float *dout = t->a2 + rr * dp;
    FC_ISA(load_f32)(p->dout, f->dtype, sv->dout + i * p->do_row_stride + h * p->do_head_stride, D, dout);
    FC_ISA(twin)(dout, t->a2d ? t->a2d + rr * dp : NULL, D);
    const float *o = FC_ISA(get_row)(job, t, f->o, sv->o + i * f->o_row_stride + h * f->o_head_stride);
    double dsum = 0.0; /* D in the precision of dP */
    if (job->dp64)
        for (int64_t d = 0; d < D; d++) dsum += (double)dout[d] * o[d];
    else {
        float fsum = 0.0f;
        for (int64_t d = 0; d < D; d++) fsum += dout[d] * o[d];
        dsum = fsum;
    }
    const double lse = f->lse[sv->lse + h * f->lse_head_stride + i * f->lse_row_stride];
    const int dead = isinf(lse) && lse < 0; /* saw no key: adds nothing */
    const int64_t at = (job->row0[b] + i) * f->heads_q + h;
    job->L[at] = t->aL[rr] = dead ? INFINITY : lse * k_log2e;
    job->D[at] = t->aD[rr] = dsum;
    visible_range(i, sv->sq, sv->sk, f->window_left, f->window_right, &t->lo[rr], &t->hi[rr]);
    if (dead) t->lo[rr] = t->hi[rr] = 0;
    memset(t->acc1 + rr * dp, 0, (size_t)dp * sizeof(float));
}

/* Keys [j0, j0+nb) of kv head g: K^T and V^T for the products, K rows for dQ. */
static void FC_ISA(k_block)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int g, int64_t j0, int nb)
{
    const fc_fwd_params *f = &job->p->f;
    const int64_t D = f->head_dim, dp = job->dp;
    double bn2 = 0.0;
    for (int c = 0; c < nb; c++) {
        const int64_t j = j0 + c, ja = j + PREFETCH_AHEAD;
        if (c + PREFETCH_AHEAD < nb) {
            prefetch_row(f->k, sv->k + ja * f->k_row_stride + g * f->k_head_stride, f->head_dim, f->dtype);
            prefetch_row(f->v, sv->v + ja * f->v_row_stride + g * f->v_head_stride, f->head_dim, f->dtype);
        }
        const float *k = FC_ISA(get_row)(job, t, f->k, sv->k + j * f->k_row_stride + g * f->k_head_stride);
        FC_ISA(put_col)(k, D, t->b1t, NULL, c);
        bn2 = fmax(bn2, FC_ISA(norm2)(k, D));
        memcpy(t->b4 + c * dp, k, (size_t)D * sizeof(float));
        const float *v = FC_ISA(get_row)(job, t, f->v, sv->v + j * f->v_row_stride + g * f->v_head_stride);
        FC_ISA(put_col)(v, D, t->b2t, t->b2td, c);
    }
    FC_ISA(zero_cols)(D, nb, t->b1t, NULL);
    FC_ISA(zero_cols)(D, nb, t->b2t, t->b2td);
    FC_ISA(choose_scores)(job, t, D, nb, bn2);
}

static void FC_ISA(q_item)(const bwd_job *job, bwd_scratch *t, int b, int g, int64_t tile)
{
    const fc_bwd_params *p = job->p;
    fc_bwd_seq sv;
    fc_bwd_seq_of(p, b, &sv);
    const int G = job->group;
    const int64_t rows = sv.sq * G, r0 = tile * TILE_M;
    const int nr = (int)(rows - r0 < TILE_M ? rows - r0 : TILE_M);
    t->a1n2 = 0.0;
    for (int rr = 0; rr < nr; rr++) {
        const int64_t r = r0 + rr;
        FC_ISA(q_row)(job, t, &sv, b, rr, r / G, g * G + (int)(r % G));
    }
    FC_ISA(sweep)(job, t, &sv, b, g, nr, 0);
    for (int rr = 0; rr < nr; rr++) {
        const int64_t r = r0 + rr, i = r / G;
        const int h = g * G + (int)(r % G);
        FC_ISA(store_acc)(job, p->dq, sv.dq + i * p->dq_row_stride + h * p->dq_head_stride, t->acc1 + rr * job->dp,
                          p->f.scale);
    }
}

/* ---- the kv pass: dK and dV of TILE_M keys --------------------------------------- */

/* Key row c of the item (key j of kv head g): K and V rows, the packed
 * query rows that see it. */
static void FC_ISA(kv_row)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int c, int64_t j, int g)
{
    const fc_fwd_params *f = &job->p->f;
    const int64_t D = f->head_dim, dp = job->dp;
    const float *k = FC_ISA(get_row)(job, t, f->k, sv->k + j * f->k_row_stride + g * f->k_head_stride);
    FC_ISA(put_a1)(t, dp, c, k, D);
    FC_ISA(load_f32)(f->v, f->dtype, sv->v + j * f->v_row_stride + g * f->v_head_stride, D, t->a2 + c * dp);
    FC_ISA(twin)(t->a2 + c * dp, t->a2d ? t->a2d + c * dp : NULL, D);
    int64_t ilo, ihi;
    visible_queries(j, sv->sq, sv->sk, f->window_left, f->window_right, &ilo, &ihi);
    t->lo[c] = ilo * job->group;
    t->hi[c] = ihi * job->group;
    memset(t->acc1 + c * dp, 0, (size_t)dp * sizeof(float));
    memset(t->acc2 + c * dp, 0, (size_t)dp * sizeof(float));
}

/* Packed query rows [r0, r0+nb) of kv head g's group: Q^T and dO^T for the
 * products, Q and dO rows for dK and dV, each column's lse and D. */
static void FC_ISA(q_block)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int b, int g, int64_t r0,
                            int nb)
{
    const fc_bwd_params *p = job->p;
    const fc_fwd_params *f = &p->f;
    const int G = job->group;
    const int64_t D = f->head_dim, dp = job->dp;
    double bn2 = 0.0;
    for (int c = 0; c < nb; c++) {
        const int64_t r = r0 + c, i = r / G, ra = r + PREFETCH_AHEAD, ia = ra / G;
        const int h = g * G + (int)(r % G), ha = g * G + (int)(ra % G);
        if (c + PREFETCH_AHEAD < nb) {
            prefetch_row(f->q, sv->q + ia * f->q_row_stride + ha * f->q_head_stride, f->head_dim, f->dtype);
            prefetch_row(p->dout, sv->dout + ia * p->do_row_stride + ha * p->do_head_stride, f->head_dim, f->dtype);
        }
        const float *q = FC_ISA(get_row)(job, t, f->q, sv->q + i * f->q_row_stride + h * f->q_head_stride);
        FC_ISA(put_col)(q, D, t->b1t, NULL, c);
        bn2 = fmax(bn2, FC_ISA(norm2)(q, D));
        memcpy(t->b4 + c * dp, q, (size_t)D * sizeof(float));
        FC_ISA(load_f32)(p->dout, f->dtype, sv->dout + i * p->do_row_stride + h * p->do_head_stride, D,
                         t->b3 + c * dp);
        FC_ISA(put_col)(t->b3 + c * dp, D, t->b2t, t->b2td, c);
        const int64_t at = (job->row0[b] + i) * f->heads_q + h;
        t->bL[c] = job->L[at];
        t->bD[c] = job->D[at];
    }
    FC_ISA(zero_cols)(D, nb, t->b1t, NULL);
    FC_ISA(zero_cols)(D, nb, t->b2t, t->b2td);
    FC_ISA(choose_scores)(job, t, D, nb, bn2);
}

static void FC_ISA(kv_item)(const bwd_job *job, bwd_scratch *t, int b, int g, int64_t tile)
{
    const fc_bwd_params *p = job->p;
    fc_bwd_seq sv;
    fc_bwd_seq_of(p, b, &sv);
    const int64_t k0 = tile * TILE_M;
    const int nk = (int)(sv.sk - k0 < TILE_M ? sv.sk - k0 : TILE_M);
    t->a1n2 = 0.0;
    for (int c = 0; c < nk; c++) FC_ISA(kv_row)(job, t, &sv, c, k0 + c, g);
    FC_ISA(sweep)(job, t, &sv, b, g, nk, 1);
    for (int c = 0; c < nk; c++) {
        const int64_t j = k0 + c;
        FC_ISA(store_acc)(job, p->dk, sv.dk + j * p->dk_row_stride + g * p->dk_head_stride, t->acc1 + c * job->dp,
                          p->f.scale);
        FC_ISA(store_acc)(job, p->dv, sv.dv + j * p->dv_row_stride + g * p->dv_head_stride, t->acc2 + c * job->dp,
                          1.0f);
    }
}
