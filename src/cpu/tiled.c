/*
 * tiled.c -- the fast CPU path: tiled online softmax in fp32, multithreaded
 * over work items.
 *
 * A work item is (sequence b, kv head g, tile of TILE_M packed query rows).
 * Packed row r of sequence b stands for query i = r / group and query head
 * g*group + r % group: the query heads that share a kv head are processed
 * together, so each K/V block is converted to fp32 once for all of them, and
 * consecutive packed rows of one query have the same visible key range.
 *
 * Per item: the Q rows are converted once; then only the key blocks the mask
 * can make visible are walked, each converted once into a transposed K block
 * and a V block. Scores come out in log2 units (the softmax scale times
 * log2(e) is applied to each dot product), so 2^x is the exponential. Each
 * row has a visible range [lo, hi) derived from the window rule, so the
 * inner loops run over contiguous ranges with no per-element mask test.
 *
 * Precision: f16/bf16 inputs use fp32 scores, as the GPU kernels do. f32
 * inputs use double scores (Q, K^T and S in double, the rest in fp32): see
 * scores_rows_f64 for why. Probabilities, sums and the output accumulator are
 * fp32 for every dtype.
 *
 * Determinism: every output element belongs to exactly one work item, the
 * tiling does not depend on the thread count, and an item's arithmetic does
 * not depend on which thread runs it or on what ran before: results are
 * bitwise identical for any num_threads.
 */
#define _POSIX_C_SOURCE 200809L /* sysconf */

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_dtype.h"
#include "internal.h"
#include "tiled_kernels.h"

/* Below this many multiply-adds per thread, starting a thread costs more than it saves. */
#define MIN_MACS_PER_THREAD ((int64_t)1 << 18)

static const double k_log2e = 1.4426950408889634074;
static const double k_ln2 = 0.69314718055994530942;

/* ---- one sequence's view ---------------------------------------------------- */

/* Lengths of sequence b and element offsets of its first token in each
 * tensor (dense: batch stride; varlen: token offset times row stride). */
typedef struct seq_view {
    int64_t sq, sk;
    int64_t q, k, v, o, lse;
} seq_view;

static void seq_view_of(const fc_fwd_params *p, int b, seq_view *sv)
{
    if (p->cu_seqlens_q) {
        int64_t tq = p->cu_seqlens_q[b], tk = p->cu_seqlens_k[b];
        sv->sq = p->cu_seqlens_q[b + 1] - tq;
        sv->sk = p->cu_seqlens_k[b + 1] - tk;
        sv->q = tq * p->q_row_stride;
        sv->o = tq * p->o_row_stride;
        sv->lse = tq * p->lse_row_stride;
        sv->k = tk * p->k_row_stride;
        sv->v = tk * p->v_row_stride;
    } else {
        sv->sq = p->seqlen_q;
        sv->sk = p->seqlen_k;
        sv->q = (int64_t)b * p->q_batch_stride;
        sv->o = (int64_t)b * p->o_batch_stride;
        sv->lse = (int64_t)b * p->lse_batch_stride;
        sv->k = (int64_t)b * p->k_batch_stride;
        sv->v = (int64_t)b * p->v_batch_stride;
    }
}

/* Keys visible to query i: exactly the j in [lo, hi) for which
 * fc_key_visible(i, j, sq, sk, wl, wr) holds (the rule is an interval). */
static void visible_range(int64_t i, int64_t sq, int64_t sk, int wl, int wr, int64_t *lo, int64_t *hi)
{
    int64_t diag = i + sk - sq; /* bottom-right alignment, as fc_key_visible */
    int64_t a = 0, e = sk;
    if (wl >= 0 && diag - wl > a) a = diag - wl;
    if (wr >= 0 && diag + wr + 1 < e) e = diag + wr + 1;
    if (e < a) e = a;
    *lo = a;
    *hi = e;
}

/* ---- conversion in and out --------------------------------------------------- */

/* dst[x * dst_stride] = element off + x of src, for x < n, as float. */
static void load_f32(const void *src, int32_t dtype, int64_t off, int64_t n, float *dst,
                     int64_t dst_stride)
{
    if (dtype == FC_DTYPE_F16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t x = 0; x < n; x++) dst[x * dst_stride] = fc_f16_to_f32(s[x]);
    } else if (dtype == FC_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t x = 0; x < n; x++) dst[x * dst_stride] = fc_bf16_to_f32(s[x]);
    } else {
        const float *s = (const float *)src + off;
        for (int64_t x = 0; x < n; x++) dst[x * dst_stride] = s[x];
    }
}

/* Elements off .. off+n-1 of dst = src[x] / l, rounded once to the dtype;
 * src NULL: zeros (a row that sees no key). */
static void store_row(void *dst, int32_t dtype, int64_t off, int64_t n, const float *src, float l)
{
    if (dtype == FC_DTYPE_F16) {
        uint16_t *d = (uint16_t *)dst + off;
        for (int64_t x = 0; x < n; x++) d[x] = fc_f32_to_f16(src ? src[x] / l : 0.0f);
    } else if (dtype == FC_DTYPE_BF16) {
        uint16_t *d = (uint16_t *)dst + off;
        for (int64_t x = 0; x < n; x++) d[x] = fc_f32_to_bf16(src ? src[x] / l : 0.0f);
    } else {
        float *d = (float *)dst + off;
        for (int64_t x = 0; x < n; x++) d[x] = src ? src[x] / l : 0.0f;
    }
}

/* ---- a work item -------------------------------------------------------------- */

/* A worker's scratch, allocated before any work starts. The score-side
 * buffers are float or double by the job's precision (the other set is
 * NULL). Pad rows and columns are zero and stay zero. */
typedef struct tile_scratch {
    float *q;          /* [TILE_M][dp]     query rows, fp32 scores                  */
    double *qd;        /* [TILE_M][dp]     query rows, double scores                */
    float *kt;         /* [dp][TILE_N]     key block transposed, fp32 scores        */
    double *ktd;       /* [dp][TILE_N]     key block transposed, double scores      */
    double *sd;        /* [ROWS][TILE_N]   double scores of one register tile       */
    float *s;          /* [ROWS][TILE_N]   scores, then shifted scores, then weights */
    float *pt;         /* [TILE_N][ROWS]   weights of one register tile, transposed */
    float *krow;       /* [dp]             one key row before the transpose         */
    float *v;          /* [TILE_N][dp]     value block                              */
    float *o;          /* [TILE_M][dp]     unnormalised output accumulators         */
    double *m;         /* [TILE_M]         running max (log2 units)                 */
    float *l;          /* [TILE_M]         running sum                              */
    int64_t *lo, *hi;  /* [TILE_M]         visible key range of each row            */
    void *block;       /* the single allocation behind all of the above             */
} tile_scratch;

typedef struct tiled_job {
    const fc_fwd_params *p;
    int group;            /* query heads per kv head                           */
    int f64;              /* 1: double scores (f32 inputs)                     */
    int64_t dp;           /* head_dim rounded up to VEC_W                      */
    double qscale;        /* times q.k: scale*log2e, or scale/softcap          */
    double cap;           /* softcap*log2e, 0 = no cap                         */
    const int64_t *first; /* [batch+1] first work item of each sequence        */
    int64_t nitems;
    atomic_llong next;    /* next unclaimed work item                          */
} tiled_job;

/* n elements of type T at offset *off of base (NULL when only measuring);
 * every piece starts 64-byte aligned. */
#define CARVE(base, off, T, n) ((T *)carve(base, &(off), (size_t)(n) * sizeof(T)))
static void *carve(char *base, size_t *off, size_t bytes)
{
    void *p = base ? base + *off : NULL;
    *off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Lay out a scratch block at base into *t, or (base NULL) only measure it.
 * Returns its size in bytes, a multiple of 64. */
static size_t scratch_layout(tile_scratch *t, char *base, int64_t dp, int f64)
{
    size_t off = 0;
    tile_scratch x;
    memset(&x, 0, sizeof x);
    if (f64) {
        x.qd = CARVE(base, off, double, TILE_M * dp);
        x.ktd = CARVE(base, off, double, dp * TILE_N);
        x.sd = CARVE(base, off, double, ROWS * TILE_N);
    } else {
        x.q = CARVE(base, off, float, TILE_M * dp);
        x.kt = CARVE(base, off, float, dp * TILE_N);
    }
    x.s = CARVE(base, off, float, ROWS * TILE_N);
    x.pt = CARVE(base, off, float, TILE_N * ROWS);
    x.krow = CARVE(base, off, float, dp);
    x.v = CARVE(base, off, float, TILE_N * dp);
    x.o = CARVE(base, off, float, TILE_M * dp);
    x.m = CARVE(base, off, double, TILE_M);
    x.l = CARVE(base, off, float, TILE_M);
    x.lo = CARVE(base, off, int64_t, TILE_M);
    x.hi = CARVE(base, off, int64_t, TILE_M);
    x.block = base;
    if (t) *t = x;
    return off;
}

static int scratch_alloc(tile_scratch *t, int64_t dp, int f64)
{
    const size_t bytes = scratch_layout(NULL, NULL, dp, f64); /* a multiple of 64 */
    char *base = aligned_alloc(64, bytes);
    if (!base) return -1;
    memset(base, 0, bytes); /* pad rows/columns must read as 0 */
    scratch_layout(t, base, dp, f64);
    return 0;
}

/* The rows [rg, rg+ROWS) of the item against the key block [j0, j0+nb). */
static void run_row_group(const tiled_job *job, tile_scratch *t, int rg, int nr, int64_t j0, int nb)
{
    const int64_t dp = job->dp;
    int a[ROWS], e[ROWS];
    int ua = TILE_N, ue = 0;
    for (int x = 0; x < ROWS; x++) {
        a[x] = e[x] = 0;
        const int rr = rg + x;
        if (rr >= nr) continue;
        int64_t lo = t->lo[rr] > j0 ? t->lo[rr] : j0;
        int64_t hi = t->hi[rr] < j0 + nb ? t->hi[rr] : j0 + nb;
        if (lo >= hi) continue;
        a[x] = (int)(lo - j0);
        e[x] = (int)(hi - j0);
        if (a[x] < ua) ua = a[x];
        if (e[x] > ue) ue = e[x];
    }
    if (ua >= ue) return; /* no row of the group sees this block */

    /* Scores over the union of the rows' ranges, whole register tiles; what a
     * row does not see is computed but never read. */
    const int c0 = ua & ~(VEC_W - 1), c1 = (ue + VEC_W - 1) & ~(VEC_W - 1);
    if (job->f64) scores_rows_f64(t->qd + rg * dp, dp, t->ktd, t->sd, c0, c1, job->qscale);
    else scores_rows(t->q + rg * dp, dp, t->kt, t->s, c0, c1, (float)job->qscale);

    int same = rg + ROWS <= nr;
    for (int x = 0; x < ROWS; x++) {
        if (a[x] != a[0] || e[x] != e[0]) same = 0;
        if (a[x] >= e[x]) continue;
        const int rr = rg + x;
        float *w = t->s + x * TILE_N;
        const float alpha = job->f64 ? shift_row_f64(t->sd + x * TILE_N, w, a[x], e[x], job->cap, &t->m[rr])
                                     : shift_row(w, a[x], e[x], (float)job->cap, &t->m[rr]);
        finish_row(w, a[x], e[x], alpha, &t->l[rr], t->o + rr * dp, dp, t->pt + x);
    }
    if (same) {
        pv_rows(t->pt, t->v, dp, t->o + rg * dp, a[0], e[0]);
    } else {
        for (int x = 0; x < ROWS; x++)
            if (a[x] < e[x]) pv_row(t->pt, x, t->v, dp, t->o + (rg + x) * dp, a[x], e[x]);
    }
}

/* Key rows [j0, j0+nb) of kv head g into the K^T and V blocks. */
static void load_kv_block(const tiled_job *job, tile_scratch *t, const seq_view *sv, int g, int64_t j0,
                          int nb)
{
    const fc_fwd_params *p = job->p;
    const int64_t D = p->head_dim, dp = job->dp;
    const int nb_pad = (nb + VEC_W - 1) & ~(VEC_W - 1);
    for (int jj = 0; jj < nb; jj++) {
        const int64_t key = j0 + jj;
        /* convert contiguously (vectorizes), then scatter into the transpose */
        load_f32(p->k, p->dtype, sv->k + key * p->k_row_stride + (int64_t)g * p->k_head_stride, D,
                 t->krow, 1);
        if (job->f64)
            for (int64_t d = 0; d < D; d++) t->ktd[d * TILE_N + jj] = t->krow[d];
        else
            for (int64_t d = 0; d < D; d++) t->kt[d * TILE_N + jj] = t->krow[d];
        load_f32(p->v, p->dtype, sv->v + key * p->v_row_stride + (int64_t)g * p->v_head_stride, D,
                 t->v + jj * dp, 1);
    }
    /* Columns past the block that the last register tile reads: zero. */
    for (int64_t d = 0; d < D && nb_pad > nb; d++)
        for (int jj = nb; jj < nb_pad; jj++) {
            if (job->f64) t->ktd[d * TILE_N + jj] = 0.0;
            else t->kt[d * TILE_N + jj] = 0.0f;
        }
}

static void run_item(const tiled_job *job, tile_scratch *t, int b, int g, int64_t tile)
{
    const fc_fwd_params *p = job->p;
    seq_view sv;
    seq_view_of(p, b, &sv);
    const int G = job->group;
    const int64_t D = p->head_dim, dp = job->dp;
    const int64_t rows = sv.sq * G, r0 = tile * TILE_M;
    const int nr = (int)(rows - r0 < TILE_M ? rows - r0 : TILE_M);
    const int nr_pad = (nr + ROWS - 1) / ROWS * ROWS;

    /* Q rows; visible ranges; fresh softmax state. */
    int64_t jlo = INT64_MAX, jhi = 0;
    for (int rr = 0; rr < nr; rr++) {
        const int64_t r = r0 + rr, i = r / G;
        const int h = g * G + (int)(r % G);
        const int64_t qoff = sv.q + i * p->q_row_stride + h * p->q_head_stride;
        if (job->f64) {
            load_f32(p->q, p->dtype, qoff, D, t->krow, 1);
            for (int64_t d = 0; d < D; d++) t->qd[rr * dp + d] = t->krow[d];
        } else {
            load_f32(p->q, p->dtype, qoff, D, t->q + rr * dp, 1);
        }
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
    if (nr_pad > nr) {
        if (job->f64) memset(t->qd + nr * dp, 0, (size_t)((nr_pad - nr) * dp) * sizeof(double));
        else memset(t->q + nr * dp, 0, (size_t)((nr_pad - nr) * dp) * sizeof(float));
    }

    /* Only the key blocks some row of the tile can see. */
    for (int64_t j0 = jlo; j0 < jhi; j0 += TILE_N) {
        const int nb = (int)(jhi - j0 < TILE_N ? jhi - j0 : TILE_N);
        load_kv_block(job, t, &sv, g, j0, nb);
        for (int rg = 0; rg < nr; rg += ROWS) run_row_group(job, t, rg, nr, j0, nb);
    }

    /* Normalise and write; rows that see no key get 0 and lse = -inf. */
    for (int rr = 0; rr < nr; rr++) {
        const int64_t r = r0 + rr, i = r / G;
        const int h = g * G + (int)(r % G);
        const int empty = t->lo[rr] >= t->hi[rr];
        const int64_t off = sv.o + i * p->o_row_stride + h * p->o_head_stride;
        store_row(p->o, p->dtype, off, D, empty ? NULL : t->o + rr * dp, t->l[rr]);
        if (p->lse) {
            /* natural log: (m + log2 l) * ln 2 */
            float lse = empty ? -INFINITY : (float)((t->m[rr] + log2((double)t->l[rr])) * k_ln2);
            p->lse[sv.lse + h * p->lse_head_stride + i * p->lse_row_stride] = lse;
        }
    }
}

/* ---- threads ------------------------------------------------------------------ */

typedef struct worker {
    tiled_job *job;
    tile_scratch scratch;
    pthread_t tid;
} worker;

/* Claim work items until none is left. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    tiled_job *job = w->job;
    const int batch = job->p->batch, heads_kv = job->p->heads_kv;
    for (;;) {
        const int64_t idx = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (idx >= job->nitems) break;
        int lo = 0, hi = batch; /* the sequence: first[b] <= idx < first[b+1] */
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2;
            if (job->first[mid] <= idx) lo = mid;
            else hi = mid;
        }
        const int b = lo;
        const int64_t local = idx - job->first[b];
        const int64_t tiles = (job->first[b + 1] - job->first[b]) / heads_kv;
        const int g = (int)(local / tiles);
        /* Last query tiles first: under a causal mask they see the most keys,
         * and starting them early evens out the threads' finishing times. */
        const int64_t tile = tiles - 1 - local % tiles;
        run_item(job, &w->scratch, b, g, tile);
    }
    return NULL;
}

fc_status fc_cpu_tiled_forward(const fc_fwd_params *p, int num_threads, char *err, size_t err_len)
{
    const int group = p->heads_q / p->heads_kv;
    const int64_t dp = ((int64_t)p->head_dim + VEC_W - 1) / VEC_W * VEC_W;
    const int f64 = p->dtype == FC_DTYPE_F32;

    int64_t *first = malloc((size_t)(p->batch + 1) * sizeof(int64_t));
    if (!first) {
        snprintf(err, err_len, "cpu tiled: cannot allocate the work list (%d sequences)", p->batch);
        return FC_ERR_OUT_OF_MEMORY;
    }
    /* Work items per sequence and an estimate of the multiply-adds. */
    int64_t macs = 0;
    first[0] = 0;
    for (int b = 0; b < p->batch; b++) {
        seq_view sv;
        seq_view_of(p, b, &sv);
        const int64_t tiles = (sv.sq * group + TILE_M - 1) / TILE_M;
        first[b + 1] = first[b] + tiles * p->heads_kv;
        macs += 2 * sv.sq * sv.sk * p->heads_q * (int64_t)p->head_dim;
    }
    const int64_t nitems = first[p->batch];

    int64_t nt = num_threads > 0 ? num_threads : (int64_t)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt > MAX_THREADS) nt = MAX_THREADS;
    if (nt > nitems) nt = nitems;
    if (nt > macs / MIN_MACS_PER_THREAD) nt = macs / MIN_MACS_PER_THREAD;
    if (nt < 1) nt = 1;

    /* All scratch before any output is touched. */
    worker *w = calloc((size_t)nt, sizeof(worker));
    int64_t got = 0;
    if (w)
        for (; got < nt; got++)
            if (scratch_alloc(&w[got].scratch, dp, f64) != 0) break;
    if (!w || got < nt) {
        for (int64_t x = 0; x < got; x++) free(w[x].scratch.block);
        free(w);
        free(first);
        snprintf(err, err_len,
                 "cpu tiled: cannot allocate %lld scratch blocks of %zu bytes (head_dim %d)",
                 (long long)nt, scratch_layout(NULL, NULL, dp, f64), p->head_dim);
        return FC_ERR_OUT_OF_MEMORY;
    }

    tiled_job job;
    job.p = p;
    job.group = group;
    job.dp = dp;
    job.f64 = f64;
    job.cap = p->softcap > 0.0f ? p->softcap * k_log2e : 0.0;
    job.qscale = p->softcap > 0.0f ? (double)p->scale / p->softcap : p->scale * k_log2e;
    job.first = first;
    job.nitems = nitems;
    atomic_init(&job.next, 0);

    /* Workers 1..nt-1 on new threads, worker 0 on this one. A thread that
     * cannot be created is no error: the others claim its share. */
    int64_t started = 1;
    for (int64_t x = 0; x < nt; x++) w[x].job = &job;
    for (; started < nt; started++)
        if (pthread_create(&w[started].tid, NULL, worker_main, &w[started]) != 0) break;
    worker_main(&w[0]);
    for (int64_t x = 1; x < started; x++) pthread_join(w[x].tid, NULL);

    for (int64_t x = 0; x < nt; x++) free(w[x].scratch.block);
    free(w);
    free(first);
    return FC_OK;
}
