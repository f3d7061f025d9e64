/*
 * test_cp_varlen.c -- the ring (fc_cp_attention_forward / _backward) over
 * packed variable-length batches on the CPU backend, P ranks as P threads
 * of this process:
 *  - every sequence of the batch cut into 2P chunks (the first L % 2P one
 *    row longer), rank r holding chunks r and 2P - 1 - r of each, packed
 *    in sequence order with its own cu_seqlens; lengths that leave chunks
 *    and whole slices empty (a sequence of 0 rows, one of 1);
 *  - the ranks' out and lse, put back in order, against the fp64
 *    reference over the whole batch (f32 and bf16 within the forward
 *    gate; causal and not; GQA; 1 to 4 ranks); reruns bitwise equal;
 *  - the backward, given the whole call's out and lse: dq, dk, dv against
 *    the reference backward within the CPU backward gate (f32); reruns
 *    bitwise equal;
 *  - a slice whose cu_seqlens_q and cu_seqlens_k differ is refused by
 *    every rank, nothing written.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* fc_dtype_bytes */
#include "test_ring.h"
#include "test_util.h"

enum { NS = 4, HQ = 4, HKV = 2, D = 24, PMAX = 4 };
_Static_assert(PMAX <= RING_MAX_RANKS, "test_ring.h holds the ranks' slots");
static const int g_len[NS] = {37, 9, 0, 1}; /* the whole batch's sequences */

static int seq_off(int b)
{
    int o = 0;
    for (int i = 0; i < b; i++) o += g_len[i];
    return o;
}
static int whole_rows(void) { return seq_off(NS); }
/* Chunk g (of 2P) of sequence b: its rows and where they start in it. */
static int chunk_len(int b, int P, int g) { return g_len[b] / (2 * P) + (g < g_len[b] % (2 * P)); }
static int chunk_off(int b, int P, int g)
{
    int o = 0;
    for (int i = 0; i < g; i++) o += chunk_len(b, P, i);
    return o;
}
/* Rank r's slice of sequence b: chunk r then chunk 2P - 1 - r. */
static int slice_len(int b, int P, int r) { return chunk_len(b, P, r) + chunk_len(b, P, 2 * P - 1 - r); }
/* The whole batch's row of row j of rank r's slice of sequence b. */
static int whole_row(int b, int P, int r, int j)
{
    const int n0 = chunk_len(b, P, r);
    return seq_off(b) + (j < n0 ? chunk_off(b, P, r) + j : chunk_off(b, P, 2 * P - 1 - r) + j - n0);
}

/* A rank's slice: cu_seqlens and, per slice row, its whole-batch row. */
typedef struct slice {
    int32_t cu[NS + 1];
    int rows, max;
    int *map;
} slice;

static void slice_of(int P, int r, slice *s)
{
    s->cu[0] = 0;
    s->max = 0;
    for (int b = 0; b < NS; b++) {
        s->cu[b + 1] = s->cu[b] + slice_len(b, P, r);
        if (slice_len(b, P, r) > s->max) s->max = slice_len(b, P, r);
    }
    s->rows = s->cu[NS];
    s->map = malloc(((size_t)s->rows + 1) * sizeof(int));
    for (int b = 0; b < NS; b++)
        for (int j = 0; j < slice_len(b, P, r); j++) s->map[s->cu[b] + j] = whole_row(b, P, r, j);
}

/* rows of x ([rows][w] elements of dt, whole-batch rows) into the slice's order, or back */
static void *take_rows(const void *x, fc_dtype dt, int w, const slice *s)
{
    const size_t es = (size_t)fc_dtype_bytes(dt), row = (size_t)w * es;
    char *y = malloc((size_t)s->rows * row + 1);
    for (int i = 0; i < s->rows; i++) memcpy(y + (size_t)i * row, (const char *)x + (size_t)s->map[i] * row, row);
    return y;
}


typedef struct job {
    ring_seat seat; /* first: comm.user */
    int causal, bwd, bad_cu;
    fc_dtype dt;
    const void *q, *k, *v;            /* the whole batch, dt */
    const void *out, *dout;           /* backward: the whole call's out (dt), dout (dt) */
    const float *lse;                 /* backward: [HQ][whole rows] */
    void *got[3];                     /* forward: out (dt), lse; backward: dq, dk, dv (f32) */
    fc_status st;
} job;

/* lse [HQ][whole] into the slice's [HQ][rows] */
static float *take_lse(const float *lse, const slice *s)
{
    float *y = malloc(((size_t)HQ * s->rows + 1) * sizeof(float));
    for (int h = 0; h < HQ; h++)
        for (int i = 0; i < s->rows; i++) y[(size_t)h * s->rows + i] = lse[(size_t)h * whole_rows() + s->map[i]];
    return y;
}

static void *run_rank(void *p)
{
    job *j = p;
    slice s;
    slice_of(j->seat.r->size, j->seat.rank, &s);
    void *q = take_rows(j->q, j->dt, HQ * D, &s), *k = take_rows(j->k, j->dt, HKV * D, &s);
    void *v = take_rows(j->v, j->dt, HKV * D, &s);
    int32_t cu_k[NS + 1];
    memcpy(cu_k, s.cu, sizeof cu_k);
    if (j->bad_cu && j->seat.rank == 0) cu_k[1] -= 1; /* still valid offsets (the first sequence has rows) */
    fc_attention_args a;
    fc_attention_args_init(&a);
    a.q = kit_contiguous(q, j->dt, s.rows, HQ, D, 0);
    a.k = kit_contiguous(k, j->dt, s.rows, HKV, D, 0);
    a.v = kit_contiguous(v, j->dt, s.rows, HKV, D, 0);
    a.cu_seqlens_q = s.cu;
    a.cu_seqlens_k = j->bad_cu ? cu_k : s.cu;
    a.num_seqs = NS;
    a.max_seqlen_q = a.max_seqlen_k = s.max;
    a.causal = j->causal;
    a.backend = FC_BACKEND_CPU;
    fc_context *ctx;
    fc_context_create(&ctx);
    fc_context_set_num_threads(ctx, 1);
    const fc_cp_comm comm = ring_comm(&j->seat);
    void *out = NULL, *dout = NULL;
    float *lse = NULL;
    if (!j->bwd) {
        a.out = kit_contiguous(j->got[0], j->dt, s.rows, HQ, D, 0);
        a.lse = kit_contiguous(j->got[1], FC_DTYPE_F32, HQ, s.rows, 0, 0);
        j->st = fc_cp_attention_forward(ctx, &a, &comm, NULL);
    } else {
        out = take_rows(j->out, j->dt, HQ * D, &s);
        dout = take_rows(j->dout, j->dt, HQ * D, &s);
        lse = take_lse(j->lse, &s);
        fc_attention_backward_args b;
        fc_attention_backward_args_init(&b);
        b.fwd = a;
        b.fwd.out = kit_contiguous(out, j->dt, s.rows, HQ, D, 0);
        b.fwd.lse = kit_contiguous(lse, FC_DTYPE_F32, HQ, s.rows, 0, 0);
        b.dout = kit_contiguous(dout, j->dt, s.rows, HQ, D, 0);
        b.dq = kit_contiguous(j->got[0], FC_DTYPE_F32, s.rows, HQ, D, 0);
        b.dk = kit_contiguous(j->got[1], FC_DTYPE_F32, s.rows, HKV, D, 0);
        b.dv = kit_contiguous(j->got[2], FC_DTYPE_F32, s.rows, HKV, D, 0);
        j->st = fc_cp_attention_backward(ctx, &b, &comm, NULL);
    }
    if (j->st && !j->bad_cu) printf("rank %d: %s\n", j->seat.rank, fc_last_error(ctx));
    fc_context_free(ctx);
    free(q), free(k), free(v), free(out), free(dout), free(lse), free(s.map);
    return NULL;
}

/* P ranks; got[r][0..2] their outputs (poisoned by the caller). */
static void run_ring(int P, job proto, void *(*got)[3], fc_status *st)
{
    test_ring r = {.size = P};
    pthread_barrier_init(&r.bar, NULL, (unsigned)P);
    job jobs[PMAX];
    pthread_t th[PMAX];
    for (int i = 0; i < P; i++) {
        jobs[i] = proto;
        jobs[i].seat = (ring_seat){&r, i};
        for (int t = 0; t < 3; t++) jobs[i].got[t] = got[i][t];
        pthread_create(&th[i], NULL, run_rank, &jobs[i]);
    }
    for (int i = 0; i < P; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&r.bar);
    for (int i = 0; i < P; i++) st[i] = jobs[i].st;
}

static void *filled(size_t n, fc_dtype dt, uint64_t seed)
{
    void *x = malloc(n * (size_t)fc_dtype_bytes(dt) + 1);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        kit_store(x, dt, (int64_t)i, (float)((double)(seed >> 11) / 9007199254740992.0 * 4.0 - 2.0));
    }
    return x;
}

/* The whole batch on the fp64 reference: out (dt), lse; with dout, dq/dk/dv (f32). */
static void reference(const job *w, void *out, float *lse, float *const grad[3])
{
    const int S = whole_rows();
    int32_t cu[NS + 1];
    int mx = 0;
    for (int b = 0; b <= NS; b++) cu[b] = seq_off(b);
    for (int b = 0; b < NS; b++) mx = g_len[b] > mx ? g_len[b] : mx;
    fc_context *ctx;
    fc_context_create(&ctx);
    fc_attention_backward_args b;
    fc_attention_backward_args_init(&b);
    b.fwd.q = kit_contiguous((void *)w->q, w->dt, S, HQ, D, 0);
    b.fwd.k = kit_contiguous((void *)w->k, w->dt, S, HKV, D, 0);
    b.fwd.v = kit_contiguous((void *)w->v, w->dt, S, HKV, D, 0);
    b.fwd.out = kit_contiguous(out, w->dt, S, HQ, D, 0);
    b.fwd.lse = kit_contiguous(lse, FC_DTYPE_F32, HQ, S, 0, 0);
    b.fwd.cu_seqlens_q = b.fwd.cu_seqlens_k = cu;
    b.fwd.num_seqs = NS;
    b.fwd.max_seqlen_q = b.fwd.max_seqlen_k = mx;
    b.fwd.causal = w->causal;
    b.fwd.backend = FC_BACKEND_CPU_REFERENCE;
    CHECK(fc_attention_forward(ctx, &b.fwd, NULL, NULL) == FC_OK, "reference: %s", fc_last_error(ctx));
    if (grad) {
        b.dout = kit_contiguous((void *)w->dout, w->dt, S, HQ, D, 0);
        b.dq = kit_contiguous(grad[0], FC_DTYPE_F32, S, HQ, D, 0);
        b.dk = kit_contiguous(grad[1], FC_DTYPE_F32, S, HKV, D, 0);
        b.dv = kit_contiguous(grad[2], FC_DTYPE_F32, S, HKV, D, 0);
        CHECK(fc_attention_backward(ctx, &b, NULL, NULL) == FC_OK, "reference backward: %s", fc_last_error(ctx));
    }
    fc_context_free(ctx);
}

/* Errors of the ranks' rows (w elements a row, dt) against the whole's:
 * max |x - y|, and the sums of squares for rel_l2. */
typedef struct err {
    double max_abs, e2, y2, ymax;
} err;

static void add_rows(int P, void *(*got)[3], int t, fc_dtype dt, int w, const void *ref, err *e)
{
    for (int r = 0; r < P; r++) {
        slice s;
        slice_of(P, r, &s);
        for (int i = 0; i < s.rows; i++)
            for (int x = 0; x < w; x++) {
                const double a = kit_load(got[r][t], dt, (int64_t)i * w + x);
                const double b = kit_load(ref, dt, (int64_t)s.map[i] * w + x);
                e->max_abs = fmax(e->max_abs, fabs(a - b)), e->ymax = fmax(e->ymax, fabs(b));
                e->e2 += (a - b) * (a - b), e->y2 += b * b;
            }
        free(s.map);
    }
}

static int lse_ok(int P, void *(*got)[3], const float *ref, const kit_gate *g)
{
    int bad = 0;
    for (int r = 0; r < P; r++) {
        slice s;
        slice_of(P, r, &s);
        const float *l = got[r][1];
        for (int h = 0; h < HQ; h++)
            for (int i = 0; i < s.rows; i++) {
                const double x = l[(size_t)h * s.rows + i], y = ref[(size_t)h * whole_rows() + s.map[i]];
                bad += !(x == y || fabs(x - y) <= g->lse_atol + g->lse_rtol * fabs(y));
            }
        free(s.map);
    }
    return bad == 0;
}

/* Buffers for P ranks' outputs (sz[t] bytes each), poisoned. */
static void alloc_got(void *(*got)[3], const size_t sz[3])
{
    for (int r = 0; r < PMAX; r++)
        for (int t = 0; t < 3; t++) {
            got[r][t] = malloc(sz[t] + 1);
            memset(got[r][t], 0xA5, sz[t] + 1);
        }
}

static void free_got(void *(*got)[3])
{
    for (int r = 0; r < PMAX; r++)
        for (int t = 0; t < 3; t++) free(got[r][t]);
}

/* The ring run twice on fresh poisoned buffers; 1 if every rank's both runs succeeded. */
static int run_twice(int P, job pw, const size_t sz[3], void *(*gx)[3], void *(*gy)[3], fc_status *st)
{
    fc_status st2[PMAX];
    alloc_got(gx, sz);
    alloc_got(gy, sz);
    run_ring(P, pw, gx, st);
    run_ring(P, pw, gy, st2);
    int ok = 1;
    for (int r = 0; r < P; r++) ok &= st[r] == FC_OK && st2[r] == FC_OK;
    return ok;
}

static void forward_case(int P, int causal, fc_dtype dt, const job *w)
{
    const int S = whole_rows();
    const size_t es = (size_t)fc_dtype_bytes(dt);
    void *ref = malloc((size_t)S * HQ * D * es);
    float *ref_lse = malloc((size_t)HQ * S * sizeof(float));
    job pw = *w;
    pw.causal = causal;
    reference(&pw, ref, ref_lse, NULL);
    const size_t sz[3] = {(size_t)S * HQ * D * es, (size_t)HQ * S * sizeof(float), 1};
    void *gx[PMAX][3], *gy[PMAX][3];
    fc_status st[PMAX];
    const int ok = run_twice(P, pw, sz, gx, gy, st);
    err e = {0};
    add_rows(P, gx, 0, dt, HQ * D, ref, &e);
    const kit_gate g = kit_gate_for(dt);
    const double l2 = sqrt(e.e2 / e.y2);
    CHECK(ok && e.max_abs <= g.max_abs && l2 <= g.rel_l2 && lse_ok(P, gx, ref_lse, &g),
          "forward P %d causal %d %s: status %s, max_abs %.3g rel_l2 %.3g", P, causal, kit_dtype_name(dt),
          fc_status_string(st[0]), e.max_abs, l2);
    int same = 1;
    for (int r = 0; r < P; r++) {
        slice s;
        slice_of(P, r, &s);
        same &= !memcmp(gx[r][0], gy[r][0], (size_t)s.rows * HQ * D * es) &&
                !memcmp(gx[r][1], gy[r][1], (size_t)HQ * s.rows * sizeof(float));
        free(s.map);
    }
    CHECK(same, "forward P %d causal %d %s: a rerun differs", P, causal, kit_dtype_name(dt));
    free_got(gx), free_got(gy);
    free(ref), free(ref_lse);
}

static void backward_case(int P, int causal, const job *w)
{
    const int S = whole_rows();
    void *out = malloc((size_t)S * HQ * D * 4);
    float *lse = malloc((size_t)HQ * S * sizeof(float)), *ref[3];
    for (int t = 0; t < 3; t++) ref[t] = malloc((size_t)S * (t ? HKV : HQ) * D * sizeof(float));
    job pw = *w;
    pw.causal = causal, pw.bwd = 1, pw.out = out, pw.lse = lse;
    reference(&pw, out, lse, ref);
    const size_t sz[3] = {(size_t)S * HQ * D * 4, (size_t)S * HKV * D * 4, (size_t)S * HKV * D * 4};
    void *gx[PMAX][3], *gy[PMAX][3];
    fc_status st[PMAX];
    const int ok = run_twice(P, pw, sz, gx, gy, st);
    int same = 1;
    for (int r = 0; r < P; r++) {
        slice s;
        slice_of(P, r, &s);
        for (int t = 0; t < 3; t++)
            same &= !memcmp(gx[r][t], gy[r][t], (size_t)s.rows * (t ? HKV : HQ) * D * 4);
        free(s.map);
    }
    const kit_bwd_gate g = kit_bwd_gate_for(FC_DTYPE_F32, KIT_BWD_CPU);
    for (int t = 0; t < 3; t++) {
        err e = {0};
        add_rows(P, gx, t, FC_DTYPE_F32, (t ? HKV : HQ) * D, ref[t], &e);
        const double rel = e.max_abs / e.ymax, l2 = sqrt(e.e2 / e.y2);
        CHECK(ok && rel <= g.max_rel && l2 <= g.rel_l2, "backward P %d causal %d: status %s, %s max_rel %.3g rel_l2 %.3g",
              P, causal, fc_status_string(st[0]), kit_grad_name(t), rel, l2);
    }
    CHECK(same, "backward P %d causal %d: a rerun differs", P, causal);
    free_got(gx), free_got(gy);
    free(out), free(lse);
    for (int t = 0; t < 3; t++) free(ref[t]);
}

/* Rank 0's cu_seqlens_k differs from its cu_seqlens_q: every rank refuses. */
static void refusal(const job *w)
{
    const int S = whole_rows();
    const size_t sz[3] = {(size_t)S * HQ * D * 4, (size_t)HQ * S * sizeof(float), 1};
    void *got[PMAX][3];
    alloc_got(got, sz);
    job pw = *w;
    pw.bad_cu = 1;
    fc_status st[PMAX];
    run_ring(2, pw, got, st);
    unsigned char poison[16];
    memset(poison, 0xA5, sizeof poison);
    CHECK(st[0] == FC_ERR_INVALID_ARGUMENT && st[1] == FC_ERR_INVALID_ARGUMENT &&
              !memcmp(got[0][0], poison, sizeof poison) && !memcmp(got[1][0], poison, sizeof poison),
          "cu_seqlens_k != cu_seqlens_q: statuses %s, %s (want invalid argument on both), outputs kept",
          fc_status_string(st[0]), fc_status_string(st[1]));
    free_got(got);
}

int main(void)
{
    const int S = whole_rows();
    const fc_dtype dts[2] = {FC_DTYPE_F32, FC_DTYPE_BF16};
    int p0 = g_pass, f0 = g_fail;
    for (int t = 0; t < 2; t++) {
        job w = {.dt = dts[t]};
        w.q = filled((size_t)S * HQ * D, dts[t], 1);
        w.k = filled((size_t)S * HKV * D, dts[t], 2);
        w.v = filled((size_t)S * HKV * D, dts[t], 3);
        w.dout = filled((size_t)S * HQ * D, dts[t], 4);
        for (int P = 1; P <= PMAX; P++)
            for (int causal = 0; causal < 2; causal++) {
                forward_case(P, causal, dts[t], &w);
                if (dts[t] == FC_DTYPE_F32) backward_case(P, causal, &w);
            }
        if (t == 0) refusal(&w);
        free((void *)w.q), free((void *)w.k), free((void *)w.v), free((void *)w.dout);
    }
    group_done("varlen ring vs the whole batch", p0, f0);
    return test_summary();
}
