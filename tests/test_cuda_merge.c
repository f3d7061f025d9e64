/*
 * test_cuda_merge.c -- fc_attention_merge on the CUDA backend, through the
 * public API, against the CPU backend (the same call on host copies) and
 * against the merge computed in double here:
 *  - every out dtype (f32, f16, bf16), parts of one dtype or of all three,
 *    dense [B, S, H, D] (head-major strides too) and variable-length
 *    [T, H, D] layouts, padded strides and bases one element off 16 bytes
 *    (the element loads and stores), head dims 1 to 300, num_parts 1, 2, 7,
 *    8 (the most the kernel's parameters carry), 9 and 300 (a part table
 *    on the device), lse written and not;
 *  - random inputs, never 0; parts that saw no key (lse -inf; their out rows
 *    hold NaN, which must not be read), rows that no part saw (out 0, lse
 *    -inf), weights that underflow to subnormals, a NaN and a +inf lse
 *    (NaN rows);
 *  - every run starts from one arena of inputs with out and lse poisoned:
 *    after it every element of out and lse is written and no other byte of
 *    the arena has changed;
 *  - gates, per element: both backends within the rounding-error bound of
 *    the fp32 algorithm (bound_of: the weights' exp within 1 ulp of their
 *    fp32 arguments, part-order sums, one division; f16/bf16 out then one
 *    rounding of that dtype) around the double merge; the CUDA result equal
 *    to the CPU one bit for bit in every row whose weights and log both
 *    backends round alike (predicted here: the CPU path's expf/logf against
 *    the kernel's exp/log in double rounded once), else within twice that
 *    bound (f16/bf16: plus one rounding of the dtype);
 *  - a graph captured from the call gives the eager call's bits (parts in
 *    the kernel's parameters and in the table); no token writes nothing;
 *  - refused calls with device pointers (out on a part, lse inside out, a
 *    host part or lse beside device ones, host out under the cuda backend,
 *    device pointers under the cpu backend) return their status, name the
 *    argument and change no byte; a good call after succeeds.
 *
 * Usage: test_cuda_merge [--quick]   (--quick: the cases the sanitizers run)
 * Without a CUDA device: "SKIP: no CUDA device (...)" and exit code 77.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_util.h"

#if !defined(FC_HAVE_CUDA)
TU_MAIN_WITHOUT_CUDA
#else
#include <cuda_runtime_api.h>

enum { MAXP = 300, MAXT = 2 * MAXP + 2 };
#define U32 0x1p-24 /* the unit roundoff of f32 */

typedef struct mcase {
    const char *name;
    int n, varlen, B, S, H, D; /* variable length: B 1, S the token count */
    fc_dtype out_dt;
    int part_dt;  /* an fc_dtype, or -1: f32, f16, bf16 in turn */
    int pad;      /* elements after each dim's extent in every stride */
    int misalign; /* odd parts and out start one element past 256 bytes */
    int bhsd;     /* dense outs with head-major strides */
    int lse;      /* lse written */
    int quick;    /* run under --quick */
} mcase;

/* A case's tensors carved from one arena: parts' outs [0, n), parts' lses
 * [n, 2n), out 2n, lse 2n + 1 (when written). t[i].data is the offset. */
typedef struct arena {
    const mcase *c;
    int nt;
    fc_tensor t[MAXT];
    size_t bytes;
    unsigned char *init, *gpu, *cpu, *mask; /* inputs + poison; the runs' results; out/lse element bytes */
    void *dev;
} arena;

static const fc_dtype k_mixed[3] = {FC_DTYPE_F32, FC_DTYPE_F16, FC_DTYPE_BF16};

static size_t esize(fc_dtype dt) { return dt == FC_DTYPE_F32 ? 4 : 2; }
static size_t off_of(const fc_tensor *t) { return (size_t)(uintptr_t)t->data; }

/* Element index of row (b, s, h) in an out-like tensor (its first column)
 * or an lse tensor. */
static int64_t at_out(const fc_tensor *t, int varlen, int64_t b, int64_t s, int64_t h)
{
    return varlen ? s * t->stride[0] + h * t->stride[1] : b * t->stride[0] + s * t->stride[1] + h * t->stride[2];
}

static int64_t at_lse(const fc_tensor *t, int varlen, int64_t b, int64_t s, int64_t h)
{
    return varlen ? h * t->stride[0] + s * t->stride[1] : b * t->stride[0] + h * t->stride[1] + s * t->stride[2];
}

/* Strides of t (shape set): its dims innermost first as order lists them,
 * each stride the extent so far plus pad elements. */
static void set_strides(fc_tensor *t, const int *order, int pad)
{
    int64_t s = 1;
    for (int k = 0; k < t->ndim; k++) {
        t->stride[order[k]] = s;
        s = s * t->shape[order[k]] + pad;
    }
}

/* Elements from the first to the last (1 for an empty tensor: its
 * pointer still has to be valid). */
static int64_t extent(const fc_tensor *t)
{
    for (int k = 0; k < t->ndim; k++)
        if (t->shape[k] == 0) return 1;
    int64_t e = 1;
    for (int k = 0; k < t->ndim; k++) e += (t->shape[k] - 1) * t->stride[k];
    return e;
}

/* Tensor i's shape and strides (out-like or lse). */
static void shape_tensor(const mcase *c, fc_tensor *t, fc_dtype dt, int lse)
{
    static const int bshd[4] = {3, 2, 1, 0}, bhsd[4] = {3, 1, 2, 0}, last3[3] = {2, 1, 0}, last2[2] = {1, 0};
    t->dtype = dt;
    if (lse) {
        t->ndim = c->varlen ? 2 : 3;
        const int64_t dense[3] = {c->B, c->H, c->S}, var[2] = {c->H, c->S};
        memcpy(t->shape, c->varlen ? var : dense, (size_t)t->ndim * sizeof(int64_t));
        set_strides(t, c->varlen ? last2 : last3, c->pad);
    } else {
        t->ndim = c->varlen ? 3 : 4;
        const int64_t dense[4] = {c->B, c->S, c->H, c->D}, var[3] = {c->S, c->H, c->D};
        memcpy(t->shape, c->varlen ? var : dense, (size_t)t->ndim * sizeof(int64_t));
        set_strides(t, c->varlen ? last3 : c->bhsd ? bhsd : bshd, c->pad);
    }
}

static void arena_free(arena *A)
{
    free(A->init);
    free(A->gpu);
    free(A->cpu);
    free(A->mask);
    cudaFree(A->dev);
    memset(A, 0, sizeof *A);
}

/* Mark the bytes of t's logical elements in mask. */
static void mark(arena *A, const fc_tensor *t, int lse)
{
    const mcase *c = A->c;
    const size_t es = esize(t->dtype);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < c->S; s++)
            for (int64_t h = 0; h < c->H; h++) {
                if (lse) {
                    memset(A->mask + off_of(t) + (size_t)at_lse(t, c->varlen, b, s, h) * 4, 1, 4);
                    continue;
                }
                const size_t o = off_of(t) + (size_t)at_out(t, c->varlen, b, s, h) * es;
                memset(A->mask + o, 1, (size_t)c->D * es);
            }
}

/* A random value of dtype dt in [-2, 2], never 0. */
static void store_random(void *buf, fc_dtype dt, int64_t idx, uint64_t *rng)
{
    float v = (float)(kit_rand_uniform(rng) * 4.0 - 2.0);
    kit_store(buf, dt, idx, v);
    if (kit_load(buf, dt, idx) == 0.0f) kit_store(buf, dt, idx, 0.75f);
}

/* Part i's lse at row r: -inf for every part of every 13th row (no part saw
 * a key) and for one in eight others, a weight that underflows for one in
 * ten, NaN at row 1 in part 0, +inf at row 2 in the last part; else in
 * [-6, 6]. */
static float random_lse(const mcase *c, int64_t r, int i, uint64_t *rng)
{
    const double u = kit_rand_uniform(rng), v = kit_rand_uniform(rng);
    if (r == 1 && i == 0) return NAN;
    if (r == 2 && i == c->n - 1) return INFINITY;
    if (r % 13 == 5 || u < 0.125) return -INFINITY;
    if (u < 0.225) return (float)(-92.0 - 8.0 * v); /* exp(lse - max) near 2^-130 and below */
    return (float)(12.0 * v - 6.0);
}

/* Lay out, fill and upload a case. 0, or -1 with err. */
static int arena_make(arena *A, const mcase *c, uint64_t seed, char *err, size_t err_len)
{
    memset(A, 0, sizeof *A);
    A->c = c;
    A->nt = 2 * c->n + (c->lse ? 2 : 1);
    size_t at = 0;
    for (int i = 0; i < A->nt; i++) {
        const int lse = (i >= c->n && i < 2 * c->n) || i == 2 * c->n + 1;
        const fc_dtype dt = lse ? FC_DTYPE_F32
                            : i == 2 * c->n ? c->out_dt
                            : c->part_dt >= 0 ? (fc_dtype)c->part_dt : k_mixed[i % 3];
        fc_tensor *t = &A->t[i];
        shape_tensor(c, t, dt, lse);
        const int shift = c->misalign && !lse && (i % 2 == 1 || i == 2 * c->n);
        at = (at + 255) / 256 * 256 + (shift ? esize(dt) : 0);
        t->data = (void *)(uintptr_t)at;
        at += (size_t)extent(t) * esize(dt);
    }
    A->bytes = at + 64;
    A->init = malloc(A->bytes);
    A->gpu = malloc(A->bytes);
    A->cpu = malloc(A->bytes);
    A->mask = calloc(A->bytes, 1);
    if (!A->init || !A->gpu || !A->cpu || !A->mask || cudaMalloc(&A->dev, A->bytes) != cudaSuccess) {
        snprintf(err, err_len, "no memory for %zu bytes", A->bytes);
        arena_free(A);
        return -1;
    }
    memset(A->init, 0xff, A->bytes); /* NaN in every dtype: padding that is read spreads */
    uint64_t rng = seed;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < c->S; s++)
            for (int64_t h = 0; h < c->H; h++) {
                const int64_t r = (b * c->S + s) * c->H + h;
                for (int i = 0; i < c->n; i++) {
                    const fc_tensor *to = &A->t[i], *tl = &A->t[c->n + i];
                    const float l = random_lse(c, r, i, &rng);
                    ((float *)(A->init + off_of(tl)))[at_lse(tl, c->varlen, b, s, h)] = l;
                    const int64_t o = at_out(to, c->varlen, b, s, h);
                    for (int64_t d = 0; d < c->D; d++) {
                        if (l == -INFINITY) kit_store(A->init + off_of(to), to->dtype, o + d, NAN);
                        else store_random(A->init + off_of(to), to->dtype, o + d, &rng);
                    }
                }
            }
    for (int i = 2 * c->n; i < A->nt; i++) {
        const fc_tensor *t = &A->t[i];
        const size_t bytes = (size_t)extent(t) * esize(t->dtype);
        kit_poison(A->init + off_of(t), bytes, t->dtype, NULL, 0);
        mark(A, t, i == 2 * c->n + 1);
    }
    return 0;
}

/* arena_make, its failure counted as one under `what`: 1 when A is ready. */
static int arena_ready(arena *A, const mcase *c, uint64_t seed, const char *what)
{
    char err[600];
    if (!arena_make(A, c, seed, err, sizeof err)) return 1;
    CHECK(0, "%s: %s", what, err);
    return 0;
}

/* The call's args on one copy of the arena (po, pl: room for n tensors). */
static fc_attention_merge_args args_on(const arena *A, void *base, fc_tensor *po, fc_tensor *pl)
{
    const mcase *c = A->c;
    fc_attention_merge_args m;
    fc_attention_merge_args_init(&m);
    for (int i = 0; i < c->n; i++) {
        po[i] = A->t[i];
        po[i].data = (char *)base + off_of(&A->t[i]);
        pl[i] = A->t[c->n + i];
        pl[i].data = (char *)base + off_of(&A->t[c->n + i]);
    }
    m.num_parts = c->n;
    m.parts_out = po;
    m.parts_lse = pl;
    m.out = A->t[2 * c->n];
    m.out.data = (char *)base + off_of(&A->t[2 * c->n]);
    if (c->lse) {
        m.lse = A->t[2 * c->n + 1];
        m.lse.data = (char *)base + off_of(&A->t[2 * c->n + 1]);
    }
    return m;
}

static fc_tensor g_po[MAXP], g_pl[MAXP];

/* The initial arena onto the device, landed before anything runs (a copy
 * from pageable memory may return before its DMA is done). */
static cudaError_t upload(const arena *A)
{
    cudaError_t e = cudaMemcpy(A->dev, A->init, A->bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

static fc_status run_gpu(fc_context *ctx, arena *A, cudaStream_t stream, char *err, size_t err_len)
{
    cudaError_t e = upload(A);
    if (e != cudaSuccess) {
        snprintf(err, err_len, "upload: %s", cudaGetErrorString(e));
        return FC_ERR_CUDA;
    }
    const fc_attention_merge_args m = args_on(A, A->dev, g_po, g_pl);
    const fc_status st = fc_attention_merge(ctx, &m, (void *)stream);
    if (st != FC_OK) {
        snprintf(err, err_len, "%s: %s", fc_status_string(st), fc_last_error(ctx));
        return st;
    }
    e = cudaStreamSynchronize(stream);
    if (e == cudaSuccess) e = cudaMemcpy(A->gpu, A->dev, A->bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        snprintf(err, err_len, "after the merge: %s", cudaGetErrorString(e));
        return FC_ERR_CUDA;
    }
    return FC_OK;
}

static fc_status run_cpu(fc_context *ctx, arena *A, char *err, size_t err_len)
{
    memcpy(A->cpu, A->init, A->bytes);
    const fc_attention_merge_args m = args_on(A, A->cpu, g_po, g_pl);
    const fc_status st = fc_attention_merge(ctx, &m, NULL);
    if (st != FC_OK) snprintf(err, err_len, "%s: %s", fc_status_string(st), fc_last_error(ctx));
    return st;
}

/* ---- the double merge and its bounds ------------------------------------------- */

static double gamma_n(int k) { return k * U32 / (1.0 - k * U32); }

/* 1 when v (a double that the device and this host compute within 1.5 ulp
 * of each other) rounds to the same float on both: not within 2^-50 of a
 * rounding boundary. */
static int rounds_alike(double v) { return (float)(v * (1.0 + 0x1p-50)) == (float)(v * (1.0 - 0x1p-50)); }

/* Spacing of dtype dt (f16, bf16) at magnitude v. */
static double spacing(fc_dtype dt, double v)
{
    int e;
    frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
    if (dt == FC_DTYPE_F16) return v < 0x1p-14 ? 0x1p-24 : ldexp(1.0, e - 11);
    return v < 0x1p-126 ? 0x1p-133 : ldexp(1.0, e - 8);
}

/* One row of the case, from the initial arena. */
typedef struct row_eval {
    int nan, empty, n_a;   /* a NaN row; no part saw a key; parts taken    */
    float mx;              /* the largest lse (NaN ignored), as both paths */
    double W, dW;          /* sum of the weights in double; its fp32 bound */
    int same_w, same_log;  /* both backends' weights / log alike (bits)    */
    double lse_ref, lse_gate;
} row_eval;

static double g_w[MAXP], g_e[MAXP]; /* the row's weights in double (0: skipped) and their error bounds */

static void eval_row(const arena *A, int64_t b, int64_t s, int64_t h, row_eval *r)
{
    const mcase *c = A->c;
    float lse[MAXP];
    memset(r, 0, sizeof *r);
    r->mx = -INFINITY;
    for (int i = 0; i < c->n; i++) {
        const fc_tensor *tl = &A->t[c->n + i];
        lse[i] = ((const float *)(A->init + off_of(tl)))[at_lse(tl, c->varlen, b, s, h)];
        r->nan |= isnan(lse[i]);
        if (lse[i] > r->mx) r->mx = lse[i];
    }
    r->nan |= r->mx == INFINITY; /* its weight is exp(inf - inf) */
    r->empty = r->mx == -INFINITY && !r->nan;
    r->same_w = r->same_log = 1;
    if (r->nan || r->empty) {
        r->lse_ref = r->nan ? NAN : -INFINITY;
        return;
    }
    float sum = 0.0f; /* the fp32 sum of the CPU path's weights, in part order */
    for (int i = 0; i < c->n; i++) {
        g_w[i] = g_e[i] = 0.0;
        if (lse[i] == -INFINITY) continue;
        const float df = lse[i] - r->mx;
        const double dd = exp((double)df);
        r->same_w &= expf(df) == (float)dd && rounds_alike(dd);
        sum += expf(df);
        const double d = (double)lse[i] - (double)r->mx; /* exact */
        g_w[i] = exp(d);
        /* the argument's rounding (u |d| relative in exp), exp's (1 ulp),
         * a subnormal's (2^-149) */
        g_e[i] = g_w[i] * (2.0 * U32 + 1.0001 * U32 * fabs(d)) + 0x1p-149;
        r->W += g_w[i];
        r->n_a++;
    }
    const double ld = log((double)sum);
    r->same_log = r->same_w && logf(sum) == (float)ld && rounds_alike(ld);
    const double g = gamma_n(r->n_a - 1);
    for (int i = 0; i < c->n; i++)
        if (g_w[i] > 0.0 || g_e[i] > 0.0) r->dW += g_e[i] + (g_w[i] + g_e[i]) * g;
    r->dW += r->n_a * 0x1p-148;
    const double t = r->dW / (r->W - r->dW), L = log(r->W); /* |log W~ - log W| <= t */
    r->lse_ref = r->mx + L;
    r->lse_gate = t + 2.0 * U32 * (fabs(L) + t) + U32 * (fabs(r->lse_ref) + 3.0 * t) + 0x1p-149 +
                  0x1p-40 * (fabs(r->mx) + fabs(L));
}

/* Column k of the row: the double merge *ref and the bound of the fp32
 * algorithm around it. */
static double bound_of(const arena *A, const row_eval *r, int64_t b, int64_t s, int64_t h, int64_t k, double *ref)
{
    const mcase *c = A->c;
    if (r->empty || r->nan) {
        *ref = r->nan ? NAN : 0.0;
        return 0.0;
    }
    double N = 0, dN = 0, S = 0;
    const double g = gamma_n(r->n_a);
    for (int i = 0; i < c->n; i++) {
        if (g_w[i] == 0.0 && g_e[i] == 0.0) continue;
        const fc_tensor *to = &A->t[i];
        const double x = kit_load(A->init + off_of(to), to->dtype, at_out(to, c->varlen, b, s, h) + k);
        N += g_w[i] * x;
        S += g_w[i] * fabs(x);
        dN += g_e[i] * fabs(x) + (g_w[i] + g_e[i]) * fabs(x) * g;
    }
    dN += r->n_a * 0x1p-148;
    *ref = N / r->W;
    const double a = fabs(*ref), E = (dN + a * r->dW) / (r->W - r->dW);
    return E + U32 * (a + E) + 0x1p-149 + 0x1p-40 * (S / r->W + a);
}

/* ---- judging a case ------------------------------------------------------------------ */

typedef struct tally {
    int64_t unwritten[2], stray[2], ref_bad[2], pair_bad, lse_bad, rows, bit_rows;
    double worst_ref, worst_pair; /* largest error / gate */
    char first[300];
} tally;

/* The first failure's line (k -1: the row's lse). */
static void note(tally *t, const char *who, int64_t b, int64_t s, int64_t h, int64_t k, double got, double want,
                 double gate)
{
    if (t->first[0]) return;
    snprintf(t->first, sizeof t->first, "%s at row (%lld,%lld,%lld) col %lld: %.9g, want %.9g (gate %.3g)", who,
             (long long)b, (long long)s, (long long)h, (long long)k, got, want, gate);
}

/* Every byte outside out's and lse's elements as it was; every element of
 * them written (res: a run's arena, w 0 CUDA, 1 CPU). */
static void check_bytes(const arena *A, const unsigned char *res, int w, tally *t)
{
    for (size_t x = 0; x < A->bytes; x++)
        if (!A->mask[x] && res[x] != A->init[x]) t->stray[w]++;
    for (int i = 2 * A->c->n; i < A->nt; i++) {
        const fc_tensor *tt = &A->t[i];
        const size_t es = esize(tt->dtype);
        for (size_t x = off_of(tt); x < off_of(tt) + (size_t)extent(tt) * es; x += es)
            if (A->mask[x] && kit_is_poison(res + x, tt->dtype, 0)) t->unwritten[w]++;
    }
}

/* One output value against the reference and the other backend. */
static void check_value(tally *t, int w, double got, double ref, double gate, int nan_row, int64_t b, int64_t s,
                        int64_t h, int64_t k)
{
    const int ok = nan_row ? isnan(got) : fabs(got - ref) <= gate;
    if (!ok) {
        t->ref_bad[w]++;
        note(t, w ? "cpu against the double merge" : "cuda against the double merge", b, s, h, k, got, ref, gate);
    } else if (!nan_row && gate > 0) {
        t->worst_ref = fmax(t->worst_ref, fabs(got - ref) / gate);
    }
}

static void judge(const arena *A, tally *t)
{
    const mcase *c = A->c;
    memset(t, 0, sizeof *t);
    check_bytes(A, A->gpu, 0, t);
    check_bytes(A, A->cpu, 1, t);
    const fc_tensor *o = &A->t[2 * c->n], *l = c->lse ? &A->t[2 * c->n + 1] : NULL;
    const size_t es = esize(o->dtype);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < c->S; s++)
            for (int64_t h = 0; h < c->H; h++) {
                row_eval r;
                eval_row(A, b, s, h, &r);
                t->rows++;
                int bits = 1;
                for (int64_t k = 0; k < c->D; k++) {
                    double ref;
                    const double B32 = bound_of(A, &r, b, s, h, k, &ref);
                    const int64_t idx = at_out(o, c->varlen, b, s, h) + k;
                    const double g = kit_load(A->gpu + off_of(o), o->dtype, idx);
                    const double p = kit_load(A->cpu + off_of(o), o->dtype, idx);
                    const int f32 = o->dtype == FC_DTYPE_F32;
                    const double sp = f32 ? 0.0 : spacing(o->dtype, fabs(ref) + B32);
                    check_value(t, 0, g, ref, B32 + 0.5 * sp, r.nan, b, s, h, k);
                    check_value(t, 1, p, ref, B32 + 0.5 * sp, r.nan, b, s, h, k);
                    const size_t x = off_of(o) + (size_t)idx * es;
                    const int same = !memcmp(A->gpu + x, A->cpu + x, es) || (isnan(g) && isnan(p));
                    bits &= same;
                    const double pair_gate = 2.0 * B32 + sp;
                    if (r.same_w ? !same : !(r.nan ? isnan(g) && isnan(p) : fabs(g - p) <= pair_gate)) {
                        t->pair_bad++;
                        note(t, "cuda against cpu", b, s, h, k, g, p, r.same_w ? 0.0 : pair_gate);
                    } else if (!r.same_w && !r.nan && pair_gate > 0) {
                        t->worst_pair = fmax(t->worst_pair, fabs(g - p) / pair_gate);
                    }
                }
                t->bit_rows += bits && r.same_w;
                if (!l) continue;
                const int64_t li = at_lse(l, c->varlen, b, s, h);
                const double g = ((const float *)(A->gpu + off_of(l)))[li];
                const double p = ((const float *)(A->cpu + off_of(l)))[li];
                const int special = r.nan || r.empty;
                const int ok_g = special ? (r.nan ? isnan(g) : g == -INFINITY) : fabs(g - r.lse_ref) <= r.lse_gate;
                const int ok_p = special ? (r.nan ? isnan(p) : p == -INFINITY) : fabs(p - r.lse_ref) <= r.lse_gate;
                const int pair = r.same_log ? (g == p || (isnan(g) && isnan(p))) : fabs(g - p) <= 2.0 * r.lse_gate;
                t->lse_bad += !ok_g || !ok_p || !pair;
                if (!ok_g) note(t, "cuda lse against the double merge", b, s, h, -1, g, r.lse_ref, r.lse_gate);
                if (!ok_p) note(t, "cpu lse against the double merge", b, s, h, -1, p, r.lse_ref, r.lse_gate);
                if (!pair) note(t, "cuda lse against cpu", b, s, h, -1, g, p, r.same_log ? 0.0 : 2.0 * r.lse_gate);
            }
}

static void one_case(fc_context *ctx, const mcase *c, uint64_t seed, cudaStream_t stream)
{
    const int p0 = g_pass, f0 = g_fail;
    arena A;
    char err[600];
    if (!arena_ready(&A, c, seed, c->name)) return;
    const fc_status sg = run_gpu(ctx, &A, stream, err, sizeof err);
    CHECK(sg == FC_OK, "%s: cuda: %s", c->name, err);
    const fc_status sc = run_cpu(ctx, &A, err, sizeof err);
    CHECK(sc == FC_OK, "%s: cpu: %s", c->name, err);
    if (sg == FC_OK && sc == FC_OK) {
        tally t;
        judge(&A, &t);
        CHECK(!t.unwritten[0] && !t.stray[0], "%s: cuda left %lld elements unwritten, changed %lld other bytes",
              c->name, (long long)t.unwritten[0], (long long)t.stray[0]);
        CHECK(!t.unwritten[1] && !t.stray[1], "%s: cpu left %lld elements unwritten, changed %lld other bytes",
              c->name, (long long)t.unwritten[1], (long long)t.stray[1]);
        CHECK(!t.ref_bad[0] && !t.ref_bad[1] && !t.pair_bad && !t.lse_bad,
              "%s: %lld cuda and %lld cpu elements off the double merge, %lld cuda elements off the cpu's, %lld "
              "lse; first: %s",
              c->name, (long long)t.ref_bad[0], (long long)t.ref_bad[1], (long long)t.pair_bad,
              (long long)t.lse_bad, t.first);
        printf("  %-46s rows %4lld (%lld bit for bit), worst error/gate: double %.3f, cpu %.3f\n", c->name,
               (long long)t.rows, (long long)t.bit_rows, t.worst_ref, t.worst_pair);
    }
    arena_free(&A);
    group_done(c->name, p0, f0);
}

/* ---- capture, no token ----------------------------------------------------------- */

/* The call captured on stream s into a graph and launched: its arena the
 * eager call's, bit for bit. */
static void captured(fc_context *ctx, const mcase *c, cudaStream_t s)
{
    const int p0 = g_pass, f0 = g_fail;
    arena A;
    char err[600];
    if (!arena_ready(&A, c, 77, "capture")) return;
    fc_status st = run_gpu(ctx, &A, s, err, sizeof err);
    CHECK(st == FC_OK, "capture: the eager call: %s", err);
    memcpy(A.cpu, A.gpu, A.bytes); /* the eager bits */
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    const fc_attention_merge_args m = args_on(&A, A.dev, g_po, g_pl);
    int ok = st == FC_OK && upload(&A) == cudaSuccess &&
             cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok) {
        st = fc_attention_merge(ctx, &m, (void *)s);
        ok = cudaStreamEndCapture(s, &g) == cudaSuccess && st == FC_OK;
    }
    ok = ok && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess && cudaGraphLaunch(exec, s) == cudaSuccess &&
         cudaStreamSynchronize(s) == cudaSuccess &&
         cudaMemcpy(A.gpu, A.dev, A.bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
    CHECK(ok && !memcmp(A.gpu, A.cpu, A.bytes), "%d parts captured: %s (%s), %s", c->n, fc_status_string(st),
          fc_last_error(ctx), ok ? "the graph's arena differs from the eager call's" : "did not run");
    if (exec) cudaGraphExecDestroy(exec);
    if (g) cudaGraphDestroy(g);
    arena_free(&A);
    char name[48];
    snprintf(name, sizeof name, "capture, %d parts", c->n);
    group_done(name, p0, f0);
}

/* Variable length with no token: FC_OK, nothing written. */
static void no_token(fc_context *ctx, cudaStream_t s)
{
    const int p0 = g_pass, f0 = g_fail;
    static const mcase c = {"no token", 2, 1, 1, 0, 2, 64, FC_DTYPE_F16, FC_DTYPE_F16, 0, 0, 0, 1, 1};
    arena A;
    char err[600];
    if (!arena_ready(&A, &c, 5, "no token")) return;
    const fc_status st = run_gpu(ctx, &A, s, err, sizeof err);
    CHECK(st == FC_OK && !memcmp(A.gpu, A.init, A.bytes), "no token: %s, %s", fc_status_string(st),
          st == FC_OK ? "the arena changed" : err);
    arena_free(&A);
    group_done("no token", p0, f0);
}

/* ---- refused calls --------------------------------------------------------------- */

/* m refused with status want and word in the message; neither the device
 * arena nor the host one changed. */
static void refused(fc_context *ctx, arena *A, fc_attention_merge_args m, fc_status want, const char *word,
                    const char *what)
{
    memcpy(A->cpu, A->init, A->bytes);
    const int up = upload(A) == cudaSuccess;
    const fc_status st = fc_attention_merge(ctx, &m, NULL);
    const int down = cudaDeviceSynchronize() == cudaSuccess &&
                     cudaMemcpy(A->gpu, A->dev, A->bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
    const int untouched = up && down && !memcmp(A->gpu, A->init, A->bytes) && !memcmp(A->cpu, A->init, A->bytes);
    CHECK(st == want && strstr(fc_last_error(ctx), word) && untouched, "%s: status %s, '%s', untouched %d", what,
          fc_status_string(st), fc_last_error(ctx), untouched);
}

static void errors(fc_context *ctx)
{
    const int p0 = g_pass, f0 = g_fail;
    static const mcase c = {"errors", 2, 0, 2, 3, 2, 64, FC_DTYPE_F32, FC_DTYPE_F32, 0, 0, 0, 1, 1};
    arena A;
    if (!arena_ready(&A, &c, 9, "errors")) return;
    fc_tensor po[2], pl[2], hpo[2], hpl[2];
    const fc_attention_merge_args ok = args_on(&A, A.dev, po, pl), host = args_on(&A, A.cpu, hpo, hpl);
    fc_attention_merge_args m = ok;
    m.out.data = po[0].data;
    refused(ctx, &A, m, FC_ERR_INVALID_ARGUMENT, "overlaps parts_out[0]", "out on a part");
    m = ok;
    m.lse.data = (char *)ok.out.data + 4;
    refused(ctx, &A, m, FC_ERR_INVALID_ARGUMENT, "lse overlaps out", "lse inside out");
    fc_tensor mo[2] = {po[0], hpo[1]}, ml[2] = {hpl[0], pl[1]};
    m = ok;
    m.parts_out = mo;
    refused(ctx, &A, m, FC_ERR_INVALID_ARGUMENT, "parts_out[1] is host memory", "a host part's out");
    m = ok;
    m.parts_lse = ml;
    refused(ctx, &A, m, FC_ERR_INVALID_ARGUMENT, "parts_lse[0] is host memory", "a host part's lse");
    m = ok;
    m.lse = host.lse;
    refused(ctx, &A, m, FC_ERR_INVALID_ARGUMENT, "lse is host memory", "a host lse");
    m = ok;
    m.out = host.out;
    m.lse = host.lse;
    refused(ctx, &A, m, FC_ERR_INVALID_ARGUMENT, "parts_out[0] is device memory", "host outputs, device parts");
    m = host;
    m.backend = FC_BACKEND_CUDA;
    refused(ctx, &A, m, FC_ERR_UNSUPPORTED, "out is host memory but the cuda backend", "host pointers, cuda");
    m = ok;
    m.backend = FC_BACKEND_CPU;
    refused(ctx, &A, m, FC_ERR_INVALID_ARGUMENT, "out is device memory but the cpu backend", "device pointers, cpu");
    m = ok;
    m.backend = FC_BACKEND_CUDA;
    const fc_status st = fc_attention_merge(ctx, &m, NULL);
    CHECK(st == FC_OK && fc_last_error(ctx)[0] == 0 && cudaDeviceSynchronize() == cudaSuccess,
          "a good call after: %s (%s)", fc_status_string(st), fc_last_error(ctx));
    arena_free(&A);
    group_done("refused calls", p0, f0);
}

#define F32 FC_DTYPE_F32
#define F16 FC_DTYPE_F16
#define BF16 FC_DTYPE_BF16
/* name, n, varlen, B, S, H, D, out, parts, pad, misalign, bhsd, lse, quick */
static const mcase k_cases[] = {
    {"1 part, f32", 1, 0, 2, 5, 3, 64, F32, F32, 0, 0, 0, 1, 1},
    {"2 parts, bf16, padded", 2, 0, 2, 7, 4, 128, BF16, BF16, 8, 0, 0, 1, 1},
    {"2 parts, f16, head-major, no lse", 2, 0, 3, 6, 2, 64, F16, F16, 0, 0, 1, 0, 0},
    {"2 parts, f32, d1", 2, 0, 2, 9, 5, 1, F32, F32, 0, 0, 0, 1, 0},
    {"7 parts, f16 out, mixed, variable length", 7, 1, 1, 23, 3, 80, F16, -1, 0, 0, 0, 1, 1},
    {"7 parts, bf16 out, mixed, d300, odd strides", 7, 0, 1, 5, 3, 300, BF16, -1, 1, 1, 0, 1, 0},
    {"8 parts, f32 out, f16 parts, misaligned", 8, 0, 2, 4, 3, 40, F32, F16, 1, 1, 0, 0, 0},
    {"9 parts, bf16, variable length, d256", 9, 1, 1, 17, 2, 256, BF16, BF16, 3, 0, 0, 1, 1},
    {"300 parts, f32 out, mixed, padded", 300, 0, 1, 4, 2, 64, F32, -1, 2, 1, 0, 1, 1},
    {"300 parts, f16, variable length, d3, no lse", 300, 1, 1, 9, 2, 3, F16, F16, 0, 0, 0, 0, 0},
    {"300 parts, bf16 out, f32 parts, d128", 300, 0, 2, 3, 2, 128, BF16, F32, 0, 0, 0, 1, 0},
};

int main(int argc, char **argv)
{
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else {
            fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
            return 2;
        }
    }
    fc_context *ctx;
    const int rc = tu_cuda_start(&ctx);
    if (rc >= 0) return rc;
    fc_context_set_num_threads(ctx, 2);
    cudaStream_t stream = NULL;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        fc_context_free(ctx);
        return test_give_up("FAIL cudaStreamCreateWithFlags");
    }
    const int n_cases = (int)(sizeof k_cases / sizeof k_cases[0]);
    for (int i = 0; i < n_cases; i++)
        if (!quick || k_cases[i].quick) one_case(ctx, &k_cases[i], 1000 + (uint64_t)i, i % 2 ? stream : NULL);
    captured(ctx, &k_cases[1], stream);
    captured(ctx, &k_cases[8], stream);
    no_token(ctx, stream);
    errors(ctx);
    cudaStreamDestroy(stream);
    fc_context_free(ctx);
    return test_summary();
}
#endif
