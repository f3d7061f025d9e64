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
 * Instruction sets: the per-item code (tiled_item.h) is compiled twice, as
 * plain C for any target and, on x86-64, under target("avx2") with
 * explicit AVX2 matrix products (tiled_avx2.h); the variant is picked once
 * per call from the CPU's features. Both give the same bits (see below).
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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h> /* for the avx2 variant, compiled under a target pragma below */
#endif

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
    float *pt;         /* [TILE_N][ROWS]   weights of a register tile, transposed (generic) */
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
    /* the per-item code for this CPU's instruction set, the same for every
     * worker (so the thread count cannot change a result) */
    void (*run_item)(const struct tiled_job *job, tile_scratch *t, int b, int g, int64_t tile);
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

/* ---- the per-item code, once per instruction set ---------------------------
 * Built without -march, gcc targets SSE2 only (4 floats per vector). The same
 * C compiled under target("avx2") vectorizes 8 wide with 16 ymm registers.
 * The target deliberately leaves out fma: with no fused multiply-add
 * instruction available no compiler can contract a*b+c (clang would under its
 * default -ffp-contract=on), and every accumulator keeps its order, so both
 * variants produce the same bits. (On AMD Zen, separate mul and add run on
 * separate pipes: fma would not be faster here.) */
#define FC_ISA(name) name##_generic
#include "tiled_item.h"
#undef FC_ISA

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FC_HAVE_AVX2_VARIANT 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define FC_ISA(name) name##_avx2
#define FC_ISA_AVX2 1 /* the explicit kernels of tiled_avx2.h */
#include "tiled_item.h"
#undef FC_ISA_AVX2
#undef FC_ISA
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

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
        job->run_item(job, &w->scratch, b, g, tile);
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
    job.run_item = run_item_generic;
#ifdef FC_HAVE_AVX2_VARIANT
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) job.run_item = run_item_avx2;
#endif

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
