/*
 * tiled_bwd.c -- the fast CPU backward: tiled, fp32 accumulation,
 * multithreaded, deterministic. Two parallel passes over work items:
 *
 *   rows pass (sequence b, kv head g, tile of TILE_M packed query rows):
 *            D = rowsum(dO * O) and lse (log2 units) of its rows, kept for
 *            the key pass; dq = 0 for blocks of rows that no key sees.
 *   key pass (sequence b, kv head g, tile of TILE_M keys): over the blocks
 *            of TILE_N packed query rows (every query head of the group)
 *            that see its keys, S^T = K Q^T, dP^T = V dO^T, P^T = 2^(S^T -
 *            lse), dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q (the
 *            item's own rows), and the block's share of dQ, dS K, added
 *            into an fp32 dq accumulator in key-tile order.
 *
 * Packed rows as in the forward (tiled.c): packed row r of sequence b is
 * query r / G of head g*G + r % G. The key pass puts its keys in the
 * register tile and streams the query rows in blocks of TILE_N, so every
 * product is one of the forward's kernels (tiled_kernels.h: scores_rows
 * for S and dP, wsum_rows for the sums, dQ's with the weights
 * transposed): 5 products per visible pair. dK and dV belong to one item;
 * a block of dq rows takes the adds of every key tile that sees it, in
 * tile order (a turn counter per block: the first tile stores, the last
 * converts); items are claimed in index order and a head's tiles in
 * increasing order, so a turn only ever waits for a running item.
 *
 * Precision: S in fp32 where the block's logit bound allows it
 * (F32_SCORE_BOUND, tiled_common.h), else in double: P = 2^(S - lse)
 * multiplies the scores' absolute error into every gradient, and fp32
 * scores of logits near 1e3 already cost f16 a unit of rounding. dP in
 * the scores' precision for f32 (a saturated softmax, which only large
 * logits give, leaves dP - D as rounding noise), fp32 for f16/bf16; D in
 * dP's products and order, so that dP - D is exactly 0 where a row sees
 * one key. P, dS and the accumulators fp32; each gradient rounded once. A
 * row whose lse is -inf adds nothing (its lse is taken as +inf, so its P
 * is exactly 0), and masked pairs are skipped by ranges, never multiplied
 * by 0.
 *
 * Determinism: dK and dV belong to one item, dq's adds run in key-tile
 * order, the tiling and each item's summation order do not depend on the
 * thread count or on which thread runs it, and a machine always runs the
 * same instruction-set build (see tiled.c): results are bitwise identical
 * for any num_threads.
 */
#define _POSIX_C_SOURCE 200809L /* sched_yield */
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bwd_seq.h"
#include "cpu_dtype.h"
#include "internal.h"
#include "pool.h"
#include "tiled_common.h"
#include "tiled_kernels.h"


static const double k_log2e = 1.4426950408889634074;

/* A worker's scratch. "a" buffers hold the item's keys, "b" buffers one
 * streamed block of packed query rows. The double dP operands only for f32
 * (else NULL). Pad rows and columns are zero when read. */
typedef struct bwd_scratch {
    float *a1;        /* [TILE_M][dp]   K rows: the S operand, dQ's                */
    double *a1d;      /* [TILE_M][dp]   the same in double, for double-score blocks */
    double a1n2;      /*                their largest squared norm                 */
    int na1, na1d;    /*                rows (padded); how many a1d holds          */
    int na2d;         /*                how many a2d holds (f32)                   */
    int blk64;        /*                the streamed block's scores in double      */
    float *a2;        /* [TILE_M][dp]   V rows: the dP operand                     */
    uint32_t *a1h, *a2h; /* [TILE_M][dp/2] both as bf16 pairs (job->bf16dot)       */
    uint32_t *b1h, *b2h; /* [dp/2][TILE_N] the streamed Q^T, dO^T as bf16 pairs     */
    double *a2d;      /* [TILE_M][dp]   the same in double (f32, double blocks)    */
    float *acc1;      /* [TILE_M][dp]   dK                                         */
    float *acc2;      /* [TILE_M][dp]   dV                                         */
    int64_t *lo, *hi; /* [TILE_M]       each key's visible packed query rows       */
    float *dst;       /* [TILE_M][TILE_N] dP^T, then dS^T, of the streamed block   */
    float *wt;        /* [TILE_M / TILE_N][TILE_N][TILE_N] it transposed, for dQ    */
    float *dqb;       /* [TILE_N][dp]   the block's dQ from the item's keys        */
    int64_t *qlo, *qhi; /* [TILE_N]     each block row's visible keys              */
    int *qa, *qe;     /* [TILE_N]       the same within the item                   */
    int64_t klo, khi; /*                the union of qlo/qhi (the block's turns)   */
    float *b1t;       /* [dp][TILE_N]   Q^T: the S operand                         */
    double *b1td;     /* [dp][TILE_N]   the same in double, for double scores      */
    float *b2t;       /* [dp][TILE_N]   dO^T: the dP operand                       */
    double *b2td;     /* [dp][TILE_N]   the same in double (f32)                   */
    float *b3;        /* [TILE_N][dp]   dO rows (for dV)                           */
    float *b4;        /* [TILE_N][dp]   Q rows (for dK)                            */
    double *bL;       /* [TILE_N]       lse of each column (log2 units)            */
    double *bD;       /* [TILE_N]       D of each column, in double (f32)          */
    float *bDf;       /* [TILE_N]       the same in dP's fp32 order                */
    double *sd;       /* [ROWS][TILE_N] scores                                     */
    float *s;         /* [ROWS][TILE_N] P                                          */
    double *dpd;      /* [ROWS][TILE_N] double dP (f32)                            */
    float *cf;        /* [TILE_N]       softcap factor 1 - tanh^2 of one row       */
    float *pt;        /* [TILE_N][ROWS] transposed weights (plain C kernels)       */
    float *row;       /* [dp]           one row before it is scattered             */
} bwd_scratch;

/* Lay out a scratch block at base into *t, or (base NULL) only measure it. */
static size_t scratch_layout(bwd_scratch *t, char *base, int64_t dp, int dp64)
{
    size_t off = 0;
    bwd_scratch x;
    const int64_t am = TILE_M * dp, bn = TILE_N * dp, dn = dp64 ? 1 : 0;
    x.a1 = CARVE(base, off, float, am);
    x.a1d = CARVE(base, off, double, am);
    x.a2 = CARVE(base, off, float, am);
    x.a1h = CARVE(base, off, uint32_t, am / 2);
    x.a2h = CARVE(base, off, uint32_t, am / 2);
    x.b1h = CARVE(base, off, uint32_t, bn / 2);
    x.b2h = CARVE(base, off, uint32_t, bn / 2);
    x.a2d = CARVE(base, off, double, dn * am);
    x.acc1 = CARVE(base, off, float, am);
    x.acc2 = CARVE(base, off, float, am);
    x.lo = CARVE(base, off, int64_t, TILE_M);
    x.hi = CARVE(base, off, int64_t, TILE_M);
    x.dst = CARVE(base, off, float, TILE_M * TILE_N);
    x.wt = CARVE(base, off, float, TILE_M * TILE_N);
    x.dqb = CARVE(base, off, float, TILE_N * dp);
    x.qlo = CARVE(base, off, int64_t, TILE_N);
    x.qhi = CARVE(base, off, int64_t, TILE_N);
    x.qa = CARVE(base, off, int, TILE_N);
    x.qe = CARVE(base, off, int, TILE_N);
    x.b1t = CARVE(base, off, float, bn);
    x.b1td = CARVE(base, off, double, bn);
    x.b2t = CARVE(base, off, float, bn);
    x.b2td = CARVE(base, off, double, dn * bn);
    x.b3 = CARVE(base, off, float, bn);
    x.b4 = CARVE(base, off, float, bn);
    x.bL = CARVE(base, off, double, TILE_N);
    x.bD = CARVE(base, off, double, dn * TILE_N);
    x.bDf = CARVE(base, off, float, TILE_N);
    x.sd = CARVE(base, off, double, ROWS * TILE_N);
    x.s = CARVE(base, off, float, ROWS * TILE_N);
    x.dpd = CARVE(base, off, double, dn * ROWS * TILE_N);
    x.cf = CARVE(base, off, float, TILE_N);
    x.pt = CARVE(base, off, float, TILE_N * ROWS);
    x.row = CARVE(base, off, float, dp);
    if (!dp64) x.a2d = x.b2td = x.dpd = x.bD = NULL;
    if (t) *t = x;
    return off;
}

typedef struct bwd_job {
    const fc_bwd_params *p;
    int group;            /* query heads per kv head                            */
    int dp64;             /* 1: f32 inputs: dP and D in double on double blocks */
    int bf16dot;          /* 1: bf16 inputs: the avx512bf16 variant's products  */
    int64_t dp;           /* head_dim rounded up to VEC_W                       */
    double qscale;        /* times q.k: scale*log2e, or scale/softcap           */
    double lscale;        /* |scale| * log2 e: a logit in log2 units per q.k    */
    double cap;           /* softcap*log2e, 0 = no cap                          */
    double *L;            /* [rows][heads_q] lse in log2 units (+inf: lse -inf) */
    double *D;            /* [rows][heads_q] rowsum(dout * out), double (f32)   */
    float *Df;            /* [rows][heads_q] the same in fp32, dP's order       */
    float *dq_acc;        /* [rows][heads_q][dp] dQ / scale, fp32               */
    atomic_int *turns;    /* per block of TILE_N packed rows: tiles added so far */
    const int64_t *turn0; /* [batch] each sequence's first turn                 */
    const int64_t *row0;  /* [batch] first row of each sequence in L and D      */
    const int64_t *first; /* the running pass: its work list, tile order, item   */
    int reverse;
    void (*item)(const struct bwd_job *job, bwd_scratch *t, int b, int g, int64_t tile);
    bwd_scratch *scratch; /* [workers]                                          */
    /* the per-item code for this CPU's instruction set (see tiled.c) */
    void (*rows_item)(const struct bwd_job *job, bwd_scratch *t, int b, int g, int64_t tile);
    void (*kv_item)(const struct bwd_job *job, bwd_scratch *t, int b, int g, int64_t tile);
} bwd_job;

/* The turn counter of the block of packed rows at r0 (sequence b, kv head g). */
static inline atomic_int *block_turn(const bwd_job *job, const fc_bwd_seq *sv, int b, int g, int64_t r0)
{
    const int64_t nblk = (sv->sq * job->group + TILE_N - 1) / TILE_N;
    return job->turns + job->turn0[b] + g * nblk + r0 / TILE_N;
}

/* Until the block's counter reads `want` (the tiles before this one have
 * added): spin briefly, then yield (more threads than cores). */
static inline void wait_turn(atomic_int *turn, int want)
{
    for (int spins = 0; atomic_load_explicit(turn, memory_order_acquire) != want;)
        if (++spins == 64) {
            sched_yield();
            spins = 0;
        }
}

/* ---- the per-item code, once per instruction set (see tiled.c) --------------- */
#define FC_ITEM_HEADER "tiled_bwd_item.h"
#include "tiled_variants.h"
#undef FC_ITEM_HEADER

/* ---- the two passes ------------------------------------------------------------ */

/* Work item idx of the running pass on worker `worker`'s scratch. */
static void run_one(void *arg, int worker, int64_t idx)
{
    bwd_job *job = arg;
    int b, g;
    int64_t tile;
    item_of(job->first, job->p->f.batch, job->p->f.heads_kv, job->reverse, idx, &b, &g, &tile);
    job->item(job, &job->scratch[worker], b, g, tile);
}

/* The work lists of both passes, each sequence's first row in L/D and
 * first turn counter, and the call's multiply-adds; one allocation
 * (first_q owns it). */
typedef struct bwd_lists {
    int64_t *first_q, *first_kv, *row0, *turn0;
    int64_t rows, turns, macs;
} bwd_lists;

static int lists_build(const fc_bwd_params *p, int group, bwd_lists *l)
{
    const int n = p->f.batch;
    l->first_q = malloc((size_t)(4 * n + 2) * sizeof(int64_t));
    if (!l->first_q) return -1;
    l->first_kv = l->first_q + n + 1;
    l->row0 = l->first_kv + n + 1;
    l->turn0 = l->row0 + n;
    l->first_q[0] = l->first_kv[0] = 0;
    l->rows = l->turns = l->macs = 0;
    for (int b = 0; b < n; b++) {
        fc_bwd_seq s;
        fc_bwd_seq_of(p, b, &s);
        l->first_q[b + 1] = l->first_q[b] + (s.sq * group + TILE_M - 1) / TILE_M * p->f.heads_kv;
        l->first_kv[b + 1] = l->first_kv[b] + (s.sk + TILE_M - 1) / TILE_M * p->f.heads_kv;
        l->row0[b] = p->f.cu_seqlens_q ? p->f.cu_seqlens_q[b] : (int64_t)b * p->f.seqlen_q;
        l->rows = l->row0[b] + s.sq;
        l->turn0[b] = l->turns;
        l->turns += (s.sq * group + TILE_N - 1) / TILE_N * p->f.heads_kv;
        l->macs += 5 * s.sq * s.sk * p->f.heads_q * (int64_t)p->f.head_dim; /* 5 products */
    }
    return 0;
}

static void job_init(bwd_job *job, const fc_bwd_params *p, int group, int64_t dp)
{
    memset(job, 0, sizeof *job);
    job->p = p;
    job->group = group;
    job->dp = dp;
    job->dp64 = p->f.dtype == FC_DTYPE_F32;
    job->bf16dot = p->f.dtype == FC_DTYPE_BF16;
    job->cap = p->f.softcap > 0.0f ? p->f.softcap * k_log2e : 0.0;
    job->qscale = p->f.softcap > 0.0f ? (double)p->f.scale / p->f.softcap : p->f.scale * k_log2e;
    job->lscale = fabs((double)p->f.scale) * k_log2e; /* capped logits are no larger */
    /* but the cap's slope 1 - tanh^2(x), x = scale * q.k / softcap, takes
     * twice x's absolute error as its relative error: a softcap of 1e-3 made
     * fp32 scores' dq 3e-4 off (fuzz) */
    if (p->f.softcap > 0.0f) job->lscale = fmax(job->lscale, 2.0 * fabs((double)p->f.scale) / p->f.softcap);
    job->rows_item = rows_item_generic;
    job->kv_item = kv_item_generic;
#ifdef FC_HAVE_AVX2_VARIANT
    if (fc_cpu_avx2()) {
        job->rows_item = rows_item_avx2;
        job->kv_item = kv_item_avx2;
    }
#endif
#ifdef FC_HAVE_AVX512_VARIANT
    if (fc_cpu_avx512()) {
        job->rows_item = rows_item_avx512;
        job->kv_item = kv_item_avx512;
    }
#endif
#ifdef FC_HAVE_AVX512BF16_VARIANT
    if (fc_cpu_avx512bf16()) {
        job->rows_item = rows_item_avx512bf16;
        job->kv_item = kv_item_avx512bf16;
    }
#endif
}

fc_status fc_cpu_tiled_backward(const fc_bwd_params *p, int num_threads, fc_pool *pool, char *err, size_t err_len)
{
    const int group = p->f.heads_q / p->f.heads_kv;
    const int64_t dp = ((int64_t)p->f.head_dim + VEC_W - 1) / VEC_W * VEC_W;
    bwd_job job;
    job_init(&job, p, group, dp);
    bwd_lists l;
    if (lists_build(p, group, &l) != 0) {
        snprintf(err, err_len, "cpu tiled backward: cannot allocate the work lists (%d sequences)", p->f.batch);
        return FC_ERR_OUT_OF_MEMORY;
    }
    const int64_t nq = l.first_q[p->f.batch], nkv = l.first_kv[p->f.batch];
    const int nt = fc_pool_threads(num_threads, MAX_THREADS, nq > nkv ? nq : nkv, l.macs, FC_POOL_MIN_MACS);

    /* All scratch before any output is touched. */
    const size_t bytes = scratch_layout(NULL, NULL, dp, job.dp64);
    const int64_t nrow = (l.rows > 0 ? l.rows : 1) * p->f.heads_q;
    void **blocks = fc_pool_blocks(pool, nt, bytes);
    job.scratch = blocks ? calloc((size_t)nt, sizeof *job.scratch) : NULL;
    job.L = malloc((size_t)nrow * sizeof(double));
    job.D = job.dp64 ? malloc((size_t)nrow * sizeof(double)) : NULL;
    job.Df = malloc((size_t)nrow * sizeof(float));
    job.dq_acc = malloc((size_t)(nrow * dp) * sizeof(float));
    job.turns = malloc((size_t)(l.turns > 0 ? l.turns : 1) * sizeof(atomic_int));
    fc_status st = FC_OK;
    if (!job.scratch || !job.L || (job.dp64 && !job.D) || !job.Df || !job.dq_acc || !job.turns) {
        snprintf(err, err_len,
                 "cpu tiled backward: cannot allocate %d scratch blocks of %zu bytes, %lld row sums and an "
                 "fp32 dq accumulator (head_dim %d)", nt, bytes, (long long)nrow, p->f.head_dim);
        st = FC_ERR_OUT_OF_MEMORY;
    } else {
        for (int x = 0; x < nt; x++) scratch_layout(&job.scratch[x], blocks[x], dp, job.dp64);
        for (int64_t x = 0; x < l.turns; x++) atomic_init(&job.turns[x], 0);
        job.row0 = l.row0;
        job.turn0 = l.turn0;
        /* The rows pass: L and D for the key pass, dq of unseen rows. */
        job.first = l.first_q;
        job.reverse = 0;
        job.item = job.rows_item;
        fc_pool_run(pool, nt, nq, run_one, &job);
        /* The key pass, in index order: a head's key tiles in increasing
         * order (dq's turns need it), first tiles first (seen by the most
         * queries under a causal mask). */
        job.first = l.first_kv;
        job.reverse = 0;
        job.item = job.kv_item;
        fc_pool_run(pool, nt, nkv, run_one, &job);
    }
    free(job.L);
    free(job.D);
    free(job.Df);
    free(job.dq_acc);
    free(job.turns);
    free(job.scratch);
    fc_pool_blocks_free(pool, blocks, nt);
    free(l.first_q);
    return st;
}
