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
 * Precision: fp32 scores, as the GPU kernels use, except where an f32 call's
 * logits are so large that fp32 dot products would break the f32 gate: a
 * key block whose bound on the logits passes F32_SCORE_BOUND
 * (tiled_common.h) gets double scores (Q, K^T and S in double; see
 * scores_rows_f64). Probabilities, sums and the output accumulator are fp32
 * for every dtype.
 *
 * Instruction sets: the per-item code (tiled_item.h) is compiled twice, as
 * plain C for any target and, on x86-64, under target("avx2,f16c,fma") with
 * explicit AVX2 matrix products, conversions and 2^x (tiled_avx2.h), and
 * where the CPU has AVX-512 the same with 512-bit matrix products
 * (tiled_avx512.h); the variant is picked once per call from the CPU's
 * features, so a machine always runs the same one. The plain C differs
 * from the vector ones in the last bits (fused multiply-adds).
 *
 * Determinism: every output element belongs to exactly one work item, the
 * tiling does not depend on the thread count, and an item's arithmetic does
 * not depend on which thread runs it or on what ran before: results are
 * bitwise identical for any num_threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_dtype.h"
#include "fwd_seq.h"
#include "internal.h"
#include "pool.h"
#include "tiled_common.h"
#include "tiled_kernels.h"


static const double k_log2e = 1.4426950408889634074;

static const double k_ln2 = 0.69314718055994530942;

/* ---- a work item -------------------------------------------------------------- */

/* A worker's scratch, allocated before any work starts. The double
 * score-side buffers exist for f32 outputs only (else NULL). Pad rows and
 * columns are zero and stay zero. */
typedef struct tile_scratch {
    float *q;          /* [TILE_M][dp]     query rows                               */
    double *qd;        /* [TILE_M][dp]     query rows, for double scores            */
    float *kt;         /* [dp][TILE_N]     key block transposed                     */
    uint32_t *qh;      /* [TILE_M][dp/2]   query rows as bf16 pairs (job->bf16dot)  */
    uint32_t *kth;     /* [dp/2][TILE_N]   the key block as bf16 pairs (the same)   */
    double *ktd;       /* [dp][TILE_N]     key block transposed, for double scores  */
    double *sd;        /* [ROWS][TILE_N]   double scores of one register tile       */
    double qn2;        /* the item's largest squared query-row norm (f32 outputs)  */
    int nq, nqd;       /* the item's Q rows (padded); how many of them qd holds    */
    int blk64;         /* the current key block's scores in double                 */
    float *s;          /* [ROWS][TILE_N]   scores, then shifted scores, then weights */
    float *pt;         /* [TILE_N][ROWS]   weights of a register tile, transposed (generic) */
    float *kr;         /* [TILE_N][dp]     key rows before the transpose (pad 0)    */
    float *v;          /* [TILE_N][dp]     value block                              */
    float *o;          /* [TILE_M][dp]     unnormalised output accumulators         */
    double *m;         /* [TILE_M]         running max (log2 units)                 */
    float *l;          /* [TILE_M]         running sum                              */
    int64_t *lo, *hi;  /* [TILE_M]         visible key range of each row            */
    float q_ds, k_ds, v_ds; /* the item's descales (FP8; else 1)                     */
    float out_amax, p_amax; /* the worker's running maxima (FP8 amax outputs)        */
} tile_scratch;

typedef struct tiled_job {
    const fc_fwd_params *p;
    int group;            /* query heads per kv head                           */
    int f64;              /* 1: f32 outputs: double scores where the bound asks */
    int bf16dot;          /* 1: bf16 q and k: the avx512bf16 variant's scores   */
    double lscale;        /* |scale| * log2 e: a logit in log2 units per q.k    */
    int64_t dp;           /* head_dim rounded up to VEC_W                      */
    double qscale;        /* times q.k: scale*log2e, or scale/softcap          */
    double cap;           /* softcap*log2e, 0 = no cap                         */
    const int64_t *first; /* [batch+1] first work item of each sequence        */
    tile_scratch *scratch; /* [workers]                                        */
    /* the per-item code for this CPU's instruction set, the same for every
     * worker (so the thread count cannot change a result) */
    void (*run_item)(const struct tiled_job *job, tile_scratch *t, int b, int g, int64_t tile);
} tiled_job;

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
    }
    x.q = CARVE(base, off, float, TILE_M * dp);
    x.kt = CARVE(base, off, float, dp * TILE_N);
    x.qh = CARVE(base, off, uint32_t, TILE_M * dp / 2);
    x.kth = CARVE(base, off, uint32_t, dp / 2 * TILE_N);
    x.s = CARVE(base, off, float, ROWS * TILE_N);
    x.pt = CARVE(base, off, float, TILE_N * ROWS);
    x.kr = CARVE(base, off, float, TILE_N * dp);
    x.v = CARVE(base, off, float, TILE_N * dp);
    x.o = CARVE(base, off, float, TILE_M * dp);
    x.m = CARVE(base, off, double, TILE_M);
    x.l = CARVE(base, off, float, TILE_M);
    x.lo = CARVE(base, off, int64_t, TILE_M);
    x.hi = CARVE(base, off, int64_t, TILE_M);
    if (t) *t = x;
    return off;
}

/* ---- the per-item code, once per instruction set ---------------------------
 * Built without -march, gcc targets SSE2 only (4 floats per vector); the
 * AVX2 variant's hot loops are intrinsics (tiled_avx2.h). Fused
 * multiply-adds there took the matrix products from 26 to 18 micro-ops per
 * 8 vector multiply-adds (issue-bound before): +14-18% on the forward.
 * The C parts are not contracted (-std=c11). */
#define FC_ITEM_HEADER "tiled_item.h"
#include "tiled_variants.h"
#undef FC_ITEM_HEADER

/* ---- threads ------------------------------------------------------------------ */

/* Work item idx on worker `worker`'s scratch. */
static void run_one(void *arg, int worker, int64_t idx)
{
    tiled_job *job = arg;
    int b, g;
    int64_t tile;
    /* Last query tiles first: under a causal mask they see the most keys. */
    item_of(job->first, job->p->batch, job->p->heads_kv, 1, idx, &b, &g, &tile);
    job->run_item(job, &job->scratch[worker], b, g, tile);
}

/* The FP8 amax outputs: the workers' maxima (order-free, so any thread
 * count gives the same bits). */
static void store_amax(const fc_fwd_params *p, const tile_scratch *ts, int nt)
{
    float oa = 0.0f, pa = 0.0f;
    for (int x = 0; x < nt; x++) {
        oa = (float)fc_nan_max(oa, ts[x].out_amax);
        pa = (float)fc_nan_max(pa, ts[x].p_amax);
    }
    if (p->out_amax) *p->out_amax = oa;
    if (p->p_amax) *p->p_amax = pa;
}

fc_status fc_cpu_tiled_forward(const fc_fwd_params *p, int num_threads, fc_pool *pool, char *err, size_t err_len)
{
    const int group = p->heads_q / p->heads_kv;
    const int64_t dp = ((int64_t)p->head_dim + VEC_W - 1) / VEC_W * VEC_W;
    /* f32 out (f32 inputs, or FP8 ones written in f32): the f32 gate */
    const int f64 = p->o_dtype == FC_DTYPE_F32;

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

    const int nt = fc_pool_threads(num_threads, MAX_THREADS, nitems, macs, FC_POOL_MIN_MACS);

    /* All scratch before any output is touched. */
    const size_t bytes = scratch_layout(NULL, NULL, dp, f64);
    void **blocks = fc_pool_blocks(pool, nt, bytes);
    tile_scratch *ts = blocks ? calloc((size_t)nt, sizeof *ts) : NULL;
    if (!ts) {
        fc_pool_blocks_free(pool, blocks, nt);
        free(first);
        snprintf(err, err_len, "cpu tiled: cannot allocate %d scratch blocks of %zu bytes (head_dim %d)", nt,
                 bytes, p->head_dim);
        return FC_ERR_OUT_OF_MEMORY;
    }
    for (int x = 0; x < nt; x++) scratch_layout(&ts[x], blocks[x], dp, f64);

    tiled_job job;
    job.p = p;
    job.group = group;
    job.dp = dp;
    job.f64 = f64;
    job.bf16dot = p->dtype == FC_DTYPE_BF16 && p->kv_dtype == FC_DTYPE_BF16;
    job.cap = p->softcap > 0.0f ? p->softcap * k_log2e : 0.0;
    job.qscale = p->softcap > 0.0f ? (double)p->scale / p->softcap : p->scale * k_log2e;
    job.lscale = fabs((double)p->scale) * k_log2e; /* capped logits are no larger */
    job.first = first;
    job.scratch = ts;
    job.run_item = run_item_generic;
#ifdef FC_HAVE_AVX2_VARIANT
    if (fc_cpu_avx2()) job.run_item = run_item_avx2;
#endif
#ifdef FC_HAVE_AVX512_VARIANT
    if (fc_cpu_avx512()) job.run_item = run_item_avx512;
#endif
#ifdef FC_HAVE_AVX512BF16_VARIANT
    if (fc_cpu_avx512bf16()) job.run_item = run_item_avx512bf16;
#endif
    fc_pool_run(pool, nt, nitems, run_one, &job);
    store_amax(p, ts, nt);

    free(ts);
    fc_pool_blocks_free(pool, blocks, nt);
    free(first);
    return FC_OK;
}
