/*
 * tiled_bwd_item.h -- the work items of the tiled CPU backward
 * (src/cpu/tiled_bwd.c): loading rows and blocks, the register-tile step,
 * a block's dQ and its ordered add, and the two item kinds (rows, keys).
 * Included by tiled_bwd.c once per instruction set with FC_ISA(name)
 * naming the variant, as tiled_item.h is by tiled.c: no include guard.
 * Needs the types and helpers defined above it in tiled_bwd.c.
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


/* Item rows [n, n rounded up to ROWS) of the S and dP operands: zero, so
 * the products computed for them are finite and never read. */
static void FC_ISA(zero_pad_rows)(const bwd_job *job, bwd_scratch *t, int n)
{
    const int n_pad = (n + ROWS - 1) / ROWS * ROWS;
    const size_t k = (size_t)((n_pad - n) * job->dp);
    memset(t->a1 + n * job->dp, 0, k * sizeof(float));
    memset(t->a2 + n * job->dp, 0, k * sizeof(float));
    t->na1 = n_pad;
    t->na1d = t->na2d = 0; /* the double rows: at the item's first double block */
}

/* The item's S operand row rr (a float row of D elements) and its norm. */
static void FC_ISA(put_a1)(bwd_scratch *t, int64_t dp, int rr, const float *row, int64_t D)
{
    memcpy(t->a1 + rr * dp, row, (size_t)D * sizeof(float));
    t->a1n2 = fmax(t->a1n2, FC_ISA(norm2)(row, D));
}

/* After a block's operands are in b1t and b2t (bn2: b1t's largest squared
 * norm): are its scores double? If so, the double copies of S's operands
 * and, for f32 (dP in double too), of dP's. */
static void FC_ISA(choose_scores)(const bwd_job *job, bwd_scratch *t, int64_t D, int nb, double bn2)
{
    const fc_score_ops ops = {t->a1, t->b1t, t->a1d, t->b1td, t->a1n2, bn2, job->dp, D, t->na1, &t->na1d, nb};
    t->blk64 = fc_double_scores(job->lscale, &ops);
    if (t->blk64 && job->dp64) {
        const fc_score_ops dps = {t->a2, t->b2t, t->a2d, t->b2td, 0, 0, job->dp, D, t->na1, &t->na2d, nb};
        fc_double_copies(&dps);
    }
}

/* acc (head_dim elements) times mul, rounded once to the dtype at off. */
static void FC_ISA(store_acc)(const bwd_job *job, void *dst, int64_t off, float *acc, float mul)
{
    const int64_t D = job->p->f.head_dim;
    for (int64_t d = 0; d < D; d++) acc[d] *= mul;
    FC_ISA(store_row)(dst, job->p->g_dtype, off, D, acc, 1.0f);
}

/* ---- one register tile ---------------------------------------------------------- */

/* Row x of the tile over its columns [a, e): scores (t->sd) to P in t->s,
 * dP (ds or, double, t->dpd) to dS in ds (the tile's rows of t->dst), with
 * each column's lse and D (t->bL, t->bD or t->bDf). */
static void FC_ISA(grad_row)(const bwd_job *job, bwd_scratch *t, float *ds, int x, int a, int e)
{
    const double *L = t->bL;
    float *s = t->s + x * TILE_N, *dpv = ds + x * TILE_N;
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
    if (job->dp64 && t->blk64) {
        const double *dpd = t->dpd + x * TILE_N;
        for (int j = a; j < e; j++) dpv[j] = (float)(dpd[j] - t->bD[j]);
    } else {
        for (int j = a; j < e; j++) dpv[j] = dpv[j] - t->bDf[j];
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

/* Key rows [rg, rg+ROWS) of the item against the streamed block of packed
 * query rows [r0, r0+nb): S^T and dP^T over the union of the rows' ranges,
 * P^T and dS^T per row (with each column's lse and D), dK += dS^T . Q,
 * dV += P^T . dO. dP^T and dS^T are made in the rows' place in t->dst,
 * which the block's dQ reads. */
static void FC_ISA(tile_step)(const bwd_job *job, bwd_scratch *t, int rg, int nr, int64_t r0, int nb)
{
    const int64_t dp = job->dp;
    float *ds = t->dst + rg * TILE_N;
    int a[ROWS], e[ROWS], ua, ue, same;
    if (!tile_ranges(t->lo, t->hi, rg, nr, r0, nb, a, e, &ua, &ue, &same)) return;
    const int c0 = ua & ~(VEC_W - 1), c1 = (ue + VEC_W - 1) & ~(VEC_W - 1);
    if (t->blk64) {
        FC_ISA(scores_rows_f64)(t->a1d + rg * dp, dp, t->b1td, t->sd, c0, c1, job->qscale);
    } else { /* fp32 scores, widened for grad_row */
#if defined(FC_ISA_BF16)
        if (job->bf16dot) scores_pairs_bf16(t->a1h + rg * dp / 2, dp / 2, t->b1h, t->s, c0, c1, (float)job->qscale);
        else
#endif
            FC_ISA(scores_rows)(t->a1 + rg * dp, dp, t->b1t, t->s, c0, c1, (float)job->qscale);
        for (int x = 0; x < ROWS; x++)
            for (int j = c0; j < c1; j++) t->sd[x * TILE_N + j] = t->s[x * TILE_N + j];
    }
    if (job->dp64 && t->blk64) FC_ISA(scores_rows_f64)(t->a2d + rg * dp, dp, t->b2td, t->dpd, c0, c1, 1.0);
#if defined(FC_ISA_BF16)
    else if (job->bf16dot) scores_pairs_bf16(t->a2h + rg * dp / 2, dp / 2, t->b2h, ds, c0, c1, 1.0f);
#endif
    else FC_ISA(scores_rows)(t->a2 + rg * dp, dp, t->b2t, ds, c0, c1, 1.0f);
    for (int x = 0; x < ROWS; x++)
        if (a[x] < e[x]) FC_ISA(grad_row)(job, t, ds, x, a[x], e[x]);
    FC_ISA(wsum_rows)(ds, t->b4, dp, t->acc1 + rg * dp, a, e, same, t->pt);
    FC_ISA(wsum_rows)(t->s, t->b3, dp, t->acc2 + rg * dp, a, e, same, t->pt);
}

/* One pass over the loaded block's rows' visible keys (t->qlo/qhi): each
 * row's part of the item's keys [k0, k0+nk) in t->qa/qe, the union of
 * the rows' keys in t->klo/khi (which key tiles add into the block);
 * returns whether a row sees one of the item's keys. */
static int FC_ISA(block_keys)(bwd_scratch *t, int64_t k0, int nk, int nb)
{
    int seen = 0;
    t->klo = INT64_MAX;
    t->khi = 0;
    for (int c = 0; c < nb; c++) {
        const int64_t lo = t->qlo[c], hi = t->qhi[c];
        if (lo < hi) {
            if (lo < t->klo) t->klo = lo;
            if (hi > t->khi) t->khi = hi;
        }
        const int64_t a = lo > k0 ? lo - k0 : 0, e = hi < k0 + nk ? hi - k0 : nk;
        t->qa[c] = a < e ? (int)a : 0;
        t->qe[c] = a < e ? (int)e : 0;
        seen |= a < e;
    }
    return seen;
}

/* dQ of the block's nb packed query rows from the item's keys into t->dqb:
 * row c += sum of dS^T[j][c] K_j over the keys it sees (t->qa/qe; no other
 * key is read, so a non-finite key outside stays out). The weights go
 * transposed into t->wt, TILE_N keys a row, as wsum_rows reads them (whole
 * TILE_N x TILE_N tiles of the keys some row sees; the sums read only the
 * rows' ranges); the keys are the item's fp32 rows (t->a1). */
static void FC_ISA(dq_block)(const bwd_job *job, bwd_scratch *t, int nk, int nb)
{
    const int64_t dp = job->dp;
    int lo = nk, hi = 0;
    for (int c = 0; c < nb; c++) {
        if (t->qa[c] < t->qe[c]) {
            if (t->qa[c] < lo) lo = t->qa[c];
            if (t->qe[c] > hi) hi = t->qe[c];
        }
        memset(t->dqb + c * dp, 0, (size_t)dp * sizeof(float));
    }
    for (int ch = lo / TILE_N; ch * TILE_N < hi; ch++)
        FC_ISA(transpose)(t->dst + ch * TILE_N * TILE_N, TILE_N, TILE_N, TILE_N, t->wt + ch * TILE_N * TILE_N, TILE_N);
    for (int c = 0; c < nb; c += ROWS)
        for (int ch = 0; ch * TILE_N < nk; ch++) {
            int a[ROWS], e[ROWS], any = 0, same = c + ROWS <= nb;
            for (int x = 0; x < ROWS; x++) {
                const int lo = c + x < nb ? t->qa[c + x] - ch * TILE_N : 0, hi = c + x < nb ? t->qe[c + x] - ch * TILE_N : 0;
                a[x] = lo < 0 ? 0 : lo;
                e[x] = hi > TILE_N ? TILE_N : hi;
                if (a[x] >= e[x]) a[x] = e[x] = 0;
                any |= a[x] < e[x];
                if (a[x] != a[0] || e[x] != e[0]) same = 0;
            }
            if (any)
                FC_ISA(wsum_rows)(t->wt + (ch * TILE_N + c) * TILE_N, t->a1 + ch * TILE_N * dp, dp, t->dqb + c * dp, a,
                                  e, same, t->pt);
        }
}

/* The block's dQ into the fp32 dq accumulator in key-tile order: the first
 * tile that sees the block stores, the others add after it, the last
 * converts the rows to dq (times scale). Which tiles see it follows from
 * the union of its rows' visible keys (t->klo/khi, contiguous for band
 * masks), so every tile computes the same turns. */
static void FC_ISA(dq_commit)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int b, int g, int64_t tile,
                              int64_t r0, int nb)
{
    const fc_bwd_params *p = job->p;
    const int64_t dp = job->dp;
    const int G = job->group;
    const int64_t tlo = t->klo / TILE_M, thi = (t->khi - 1) / TILE_M + 1;
    atomic_int *turn = block_turn(job, sv, b, g, r0);
    wait_turn(turn, (int)(tile - tlo));
    for (int c = 0; c < nb; c++) {
        const int64_t r = r0 + c, i = r / G;
        const int h = g * G + (int)(r % G);
        float *acc = job->dq_acc + ((job->row0[b] + i) * p->f.heads_q + h) * dp;
        const float *add = t->dqb + c * dp;
        if (tile == tlo) memcpy(acc, add, (size_t)dp * sizeof(float));
        else
            for (int64_t d = 0; d < dp; d++) acc[d] += add[d];
        if (tile == thi - 1)
            FC_ISA(store_acc)(job, p->dq, sv->dq + i * p->dq_row_stride + h * p->dq_head_stride, acc, p->f.scale);
    }
    atomic_store_explicit(turn, (int)(tile - tlo + 1), memory_order_release);
}

static void FC_ISA(q_block)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int b, int g, int64_t r0,
                            int nb);

/* The item's nk keys [k0, k0+nk) (loaded, ranges set) against every block
 * of TILE_N packed query rows (aligned, so that every tile adds the same
 * blocks into dQ) that one of them sees: dK, dV and the block's dQ. The
 * blocks from the last down: under band masks a head's tiles then all
 * start at blocks the tiles before them do not see or have added to
 * already (walking up, causal tile t would wait at its first block until
 * tile t - 1 had done every block above it). */
static void FC_ISA(sweep)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int b, int g, int64_t tile,
                          int64_t k0, int nk)
{
    int64_t lo = INT64_MAX, hi = 0;
    for (int x = 0; x < nk; x++)
        if (t->lo[x] < t->hi[x]) {
            if (t->lo[x] < lo) lo = t->lo[x];
            if (t->hi[x] > hi) hi = t->hi[x];
        }
    if (lo >= hi) return; /* no query sees these keys: dK = dV = 0 */
    FC_ISA(zero_pad_rows)(job, t, nk);
#if defined(FC_ISA_BF16)
    if (job->bf16dot) {
        pack_rows_bf16(t->a1, job->dp, t->na1, t->a1h);
        pack_rows_bf16(t->a2, job->dp, t->na1, t->a2h);
    }
#endif
    const int64_t rows = sv->sq * job->group;
    for (int64_t r0 = (hi - 1) / TILE_N * TILE_N; r0 >= lo / TILE_N * TILE_N; r0 -= TILE_N) {
        const int nb = (int)(rows - r0 < TILE_N ? rows - r0 : TILE_N);
        FC_ISA(q_block)(job, t, sv, b, g, r0, nb);
        if (!FC_ISA(block_keys)(t, k0, nk, nb)) continue;
        for (int rg = 0; rg < nk; rg += ROWS) FC_ISA(tile_step)(job, t, rg, nk, r0, nb);
        FC_ISA(dq_block)(job, t, nk, nb);
        FC_ISA(dq_commit)(job, t, sv, b, g, tile, r0, nb);
    }
}

/* ---- the rows pass: lse and D of TILE_M packed query rows ------------------------ */

/* Packed row (query i, head h): its lse (log2 units; +inf where it is
 * -inf: the row saw no key and adds nothing) and D = rowsum(dO * O) in
 * each precision dP may take, into job->L, job->Df (and, f32, job->D) for
 * the key pass. */
static void FC_ISA(row_sums)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int b, int64_t i, int h)
{
    const fc_bwd_params *p = job->p;
    const fc_fwd_params *f = &p->f;
    const int64_t D = f->head_dim;
    float *dout = t->a2;
    FC_ISA(load_f32)(p->dout, f->dtype, sv->dout + i * p->do_row_stride + h * p->do_head_stride, D, dout);
    const float *o = FC_ISA(get_row)(job, t, f->o, sv->o + i * f->o_row_stride + h * f->o_head_stride);
    const int64_t at = (job->row0[b] + i) * f->heads_q + h;
    if (job->dp64) { /* the double dP's order (scores_rows_f64) */
        double dsum = 0.0;
        for (int64_t d = 0; d < D; d++) dsum += (double)dout[d] * o[d];
        job->D[at] = dsum;
    }
    float fsum; /* the fp32 dP's products and order */
#if defined(FC_ISA_BF16)
    if (job->bf16dot) fsum = dot_pairs_bf16(dout, o, D, job->dp); /* tiled_avx512bf16.h */
    else
#endif
        fsum = FC_ISA(dot_f32)(dout, o, D);
    const double lse = f->lse[sv->lse + h * f->lse_head_stride + i * f->lse_row_stride];
    job->L[at] = isinf(lse) && lse < 0 ? INFINITY : lse * k_log2e;
    job->Df[at] = fsum;
}

/* The item's rows' sums, and dq = 0 for its blocks of TILE_N rows that no
 * key sees (no key tile adds into those). */
static void FC_ISA(rows_item)(const bwd_job *job, bwd_scratch *t, int b, int g, int64_t tile)
{
    const fc_bwd_params *p = job->p;
    const fc_fwd_params *f = &p->f;
    fc_bwd_seq sv;
    fc_bwd_seq_of(p, b, &sv);
    const int G = job->group;
    const int64_t rows = sv.sq * G, r0 = tile * TILE_M, r1 = rows - r0 < TILE_M ? rows : r0 + TILE_M;
    for (int64_t r = r0; r < r1; r++) FC_ISA(row_sums)(job, t, &sv, b, r / G, g * G + (int)(r % G));
    memset(t->row, 0, (size_t)job->dp * sizeof(float));
    for (int64_t c0 = r0; c0 < r1; c0 += TILE_N) {
        const int64_t c1 = r1 - c0 < TILE_N ? r1 : c0 + TILE_N;
        int seen = 0;
        for (int64_t r = c0; r < c1 && !seen; r++) {
            int64_t lo, hi;
            visible_range(r / G, sv.sq, sv.sk, f->window_left, f->window_right, &lo, &hi);
            seen = lo < hi;
        }
        for (int64_t r = c0; r < c1 && !seen; r++) {
            const int64_t i = r / G;
            const int h = g * G + (int)(r % G);
            FC_ISA(store_row)(p->dq, p->g_dtype, sv.dq + i * p->dq_row_stride + h * p->dq_head_stride, f->head_dim, t->row,
                              1.0f);
        }
    }
}

/* ---- the key pass: dK and dV of TILE_M keys, their share of dQ --------------------- */

/* Key row c of the item (key j of kv head g): K and V rows, the packed
 * query rows that see it. */
static void FC_ISA(kv_row)(const bwd_job *job, bwd_scratch *t, const fc_bwd_seq *sv, int c, int64_t j, int g)
{
    const fc_fwd_params *f = &job->p->f;
    const int64_t D = f->head_dim, dp = job->dp;
    const float *k = FC_ISA(get_row)(job, t, f->k, sv->k + j * f->k_row_stride + g * f->k_head_stride);
    FC_ISA(put_a1)(t, dp, c, k, D);
    FC_ISA(load_f32)(f->v, f->dtype, sv->v + j * f->v_row_stride + g * f->v_head_stride, D, t->a2 + c * dp);
    int64_t ilo, ihi;
    visible_queries(j, sv->sq, sv->sk, f->window_left, f->window_right, &ilo, &ihi);
    t->lo[c] = ilo * job->group;
    t->hi[c] = ihi * job->group;
    memset(t->acc1 + c * dp, 0, (size_t)dp * sizeof(float));
    memset(t->acc2 + c * dp, 0, (size_t)dp * sizeof(float));
}

/* Packed query rows [r0, r0+nb) of kv head g's group: Q^T and dO^T for the
 * products, Q and dO rows for dK and dV, each column's lse and D and
 * visible keys. */
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
        bn2 = fmax(bn2, FC_ISA(norm2)(q, D));
        memcpy(t->b4 + c * dp, q, (size_t)D * sizeof(float));
        FC_ISA(load_f32)(p->dout, f->dtype, sv->dout + i * p->do_row_stride + h * p->do_head_stride, D,
                         t->b3 + c * dp);
        const int64_t at = (job->row0[b] + i) * f->heads_q + h;
        t->bL[c] = job->L[at];
        if (job->dp64) t->bD[c] = job->D[at];
        t->bDf[c] = job->Df[at];
        visible_range(i, sv->sq, sv->sk, f->window_left, f->window_right, &t->qlo[c], &t->qhi[c]);
    }
    FC_ISA(rows_to_cols)(t->b4, dp, nb, t->b1t);
    FC_ISA(rows_to_cols)(t->b3, dp, nb, t->b2t);
#if defined(FC_ISA_BF16)
    if (job->bf16dot) {
        const int nb_pad = (nb + VEC_W - 1) & ~(VEC_W - 1);
        pack_block_bf16(t->b1t, dp, nb_pad, t->b1h);
        pack_block_bf16(t->b2t, dp, nb_pad, t->b2h);
    }
#endif
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
    FC_ISA(sweep)(job, t, &sv, b, g, tile, k0, nk);
    for (int c = 0; c < nk; c++) {
        const int64_t j = k0 + c;
        FC_ISA(store_acc)(job, p->dk, sv.dk + j * p->dk_row_stride + g * p->dk_head_stride, t->acc1 + c * job->dp,
                          p->f.scale);
        FC_ISA(store_acc)(job, p->dv, sv.dv + j * p->dv_row_stride + g * p->dv_head_stride, t->acc2 + c * job->dp,
                          1.0f);
    }
}
