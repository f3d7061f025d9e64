/*
 * test_cp.c -- fc_cp_attention_forward on the CPU backend, P ranks as P
 * threads of this process with an exchange through shared slots:
 *  - the ranks' zigzag slices put back in order equal the fp64 reference
 *    over the whole sequence within the dtype's gate (f32, bf16; causal
 *    and not; GQA; odd chunk lengths; totals that 2P does not divide,
 *    down to a rank of one row; 1 to 4 ranks), lse included;
 *  - a rerun gives the same bits; an f32 out under bf16 inputs lands in
 *    the right rows (the final merge steps through out by its own size);
 *  - fc_cp_attention_backward, given the whole call's out and lse: the
 *    slices' dq, dk, dv against the fp64 reference backward over the whole
 *    sequence, f32 within the CPU backward gate; bf16 within the CUDA one
 *    (1.5x PyTorch's error, kit_bwd.c): each pair's gradients are rounded
 *    to bf16 before their fp32 sum, as a GPU kernel rounds P; reruns
 *    bitwise equal;
 *  - what the ring builds on: an f32 out (forward) and f32 dq, dk, dv
 *    (backward) of f16/bf16 inputs, on the CPU and reference backends,
 *    within the f32 gates of the fp64 reference's (no rounding to 16 bits
 *    in between); mixed gradient dtypes refused;
 *  - refused calls (bad comm, unequal q and k lengths, windows, paged)
 *    name the problem and write nothing; a failing exchange's status
 *    comes back from every rank; where one rank refuses, or the ranks'
 *    options differ, every rank returns an error (the handshake), none
 *    waits.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_internal.h" /* struct fc_context: cp_fail_step */
#include "internal.h"     /* fc_dtype_bytes */
#include "test_ring.h"
#include "test_util.h"

enum { B = 2, HQ = 4, HKV = 2, D = 40, C = 13, PMAX = 4 };
_Static_assert(PMAX <= RING_MAX_RANKS, "test_ring.h holds the ranks' slots");

/* Rank 1 breaks its call: 1 out NULL, 2 causal flipped (0: none). */
static int g_break;
/* Rank 1's pair calls fail from this ring step on (-1: never). */
static int g_fail_step = -1;
/* The ranks' out in f32 under 16-bit inputs (the forward's f32 out). */
static int g_out_f32;
static fc_dtype out_dt(fc_dtype dt) { return g_out_f32 ? FC_DTYPE_F32 : dt; }

/* Rows cut from the end of the whole sequence of 2 P C rows (each_case:
 * none, one, all but 2P - 1): the 2P chunks then have base + 1 rows (the
 * first S % 2P) or base, the split the ring's documentation asks for, and
 * a rank's slice holds chunks r and 2P - 1 - r. */
static int g_trim;
static int total(int P) { return 2 * P * C - g_trim; }
static int chunk_len(int P, int g) { return total(P) / (2 * P) + (g < total(P) % (2 * P)); }
static int chunk_off(int P, int g)
{
    int o = 0;
    for (int i = 0; i < g; i++) o += chunk_len(P, i);
    return o;
}
static int chunk_of(int P, int r, int w) { return w ? 2 * P - 1 - r : r; }
static int slice_rows(int P, int r) { return chunk_len(P, r) + chunk_len(P, 2 * P - 1 - r); }
static int slot_off(int P, int r, int w) { return w ? chunk_len(P, r) : 0; }


typedef struct rank_job {
    ring_seat seat; /* first: comm.user */
    int causal;
    fc_dtype dt;
    const float *q, *k, *v; /* the whole sequence, f32 [B][S][H][D] */
    void *out;              /* the rank's slice out, dt [B][2C][HQ][D] */
    float *lse;             /* [B][HQ][2C] */
    /* the backward (bwd non-NULL): the whole call's out (dt), lse and
     * dout (f32); the slice's dq, dk, dv (dt) */
    const struct whole *bwd;
    void *grad[3];
    fc_status st;
    char err[256];
} rank_job;

typedef struct whole {
    const void *out;
    const float *lse, *dout;
} whole;

/* Rank r's chunk slot w of the whole sequence x (h heads, dtype xt) into
 * its slice s, converted to dt. */
static void put_chunk_of(const void *x, fc_dtype xt, int h, int P, int r, int w, void *s, fc_dtype dt)
{
    const int g = chunk_of(P, r, w), n = slice_rows(P, r), S = total(P);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < chunk_len(P, g); i++)
            for (int e = 0; e < h * D; e++)
                kit_store(s, dt, ((int64_t)(b * n + slot_off(P, r, w) + i) * h) * D + e,
                          kit_load(x, xt, ((int64_t)(b * S + chunk_off(P, g) + i) * h) * D + e));
}

static void put_chunk(const float *x, int h, int P, int r, int w, void *s, fc_dtype dt)
{
    put_chunk_of(x, FC_DTYPE_F32, h, P, r, w, s, dt);
}

/* The whole call's lse [B][HQ][S], rank r's slot w into its [B][HQ][n]. */
static void put_lse(const float *x, int P, int r, int w, float *s)
{
    const int g = chunk_of(P, r, w), n = slice_rows(P, r), S = total(P);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++)
            memcpy(s + ((int64_t)b * HQ + h) * n + slot_off(P, r, w), x + ((int64_t)b * HQ + h) * S + chunk_off(P, g),
                   (size_t)chunk_len(P, g) * sizeof(float));
}

/* The rank's backward: its slices of the whole call's out, lse, dout. */
static fc_status rank_backward(fc_context *ctx, const rank_job *j, const fc_attention_args *a, const fc_cp_comm *comm)
{
    const int P = j->seat.r->size, n = slice_rows(P, j->seat.rank);
    const size_t es = (size_t)fc_dtype_bytes(j->dt);
    void *dout = malloc((size_t)B * n * HQ * D * es);
    for (int w = 0; w < 2; w++) {
        put_chunk_of(j->bwd->out, j->dt, HQ, P, j->seat.rank, w, j->out, j->dt);
        put_chunk(j->bwd->dout, HQ, P, j->seat.rank, w, dout, j->dt);
        put_lse(j->bwd->lse, P, j->seat.rank, w, j->lse);
    }
    fc_attention_backward_args b;
    fc_attention_backward_args_init(&b);
    b.fwd = *a;
    b.dout = kit_contiguous(dout, j->dt, B, n, HQ, D);
    b.dq = kit_contiguous(j->grad[0], j->dt, B, n, HQ, D);
    b.dk = kit_contiguous(j->grad[1], j->dt, B, n, HKV, D);
    b.dv = kit_contiguous(j->grad[2], j->dt, B, n, HKV, D);
    const fc_status st = fc_cp_attention_backward(ctx, &b, comm, NULL);
    free(dout);
    return st;
}

static void *run_rank(void *p)
{
    rank_job *j = p;
    const int P = j->seat.r->size, n = slice_rows(P, j->seat.rank);
    const size_t es = (size_t)fc_dtype_bytes(j->dt);
    void *q = malloc((size_t)B * n * HQ * D * es), *k = malloc((size_t)B * n * HKV * D * es);
    void *v = malloc((size_t)B * n * HKV * D * es);
    for (int w = 0; w < 2; w++) {
        put_chunk(j->q, HQ, P, j->seat.rank, w, q, j->dt);
        put_chunk(j->k, HKV, P, j->seat.rank, w, k, j->dt);
        put_chunk(j->v, HKV, P, j->seat.rank, w, v, j->dt);
    }
    fc_context *ctx;
    fc_context_create(&ctx);
    fc_context_set_num_threads(ctx, 1);
    if (j->seat.rank == 1) ctx->cp_fail_step = g_fail_step;
    fc_attention_args a;
    fc_attention_args_init(&a);
    a.q = kit_contiguous(q, j->dt, B, n, HQ, D);
    a.k = kit_contiguous(k, j->dt, B, n, HKV, D);
    a.v = kit_contiguous(v, j->dt, B, n, HKV, D);
    a.out = kit_contiguous(j->out, out_dt(j->dt), B, n, HQ, D);
    a.lse = kit_contiguous(j->lse, FC_DTYPE_F32, B, HQ, n, 0);
    a.causal = j->causal;
    a.backend = FC_BACKEND_CPU;
    if (j->seat.rank == 1 && g_break == 1) a.out.data = NULL;
    if (j->seat.rank == 1 && g_break == 2) a.causal ^= 1;
    const fc_cp_comm comm = ring_comm(&j->seat);
    j->st = j->bwd ? rank_backward(ctx, j, &a, &comm) : fc_cp_attention_forward(ctx, &a, &comm, NULL);
    snprintf(j->err, sizeof j->err, "%s", fc_last_error(ctx));
    fc_context_free(ctx);
    free(q);
    free(k);
    free(v);
    return NULL;
}

/* P ranks on the whole sequence; outs[r] and lses[r] their slices (the
 * backward, bwd non-NULL: grads[r][0..2] their dq, dk, dv). */
static void run_ring_bwd(int P, int causal, fc_dtype dt, fc_status fail, const float *q, const float *k,
                         const float *v, void **outs, float **lses, const whole *bwd, void *(*grads)[3], fc_status *st)
{
    test_ring r = {.size = P, .fail = fail};
    pthread_barrier_init(&r.bar, NULL, (unsigned)P);
    rank_job jobs[PMAX];
    pthread_t th[PMAX];
    for (int i = 0; i < P; i++) {
        jobs[i] = (rank_job){{&r, i}, causal, dt, q, k, v, outs[i], lses[i], bwd, {NULL, NULL, NULL}, FC_OK, ""};
        if (bwd)
            for (int t = 0; t < 3; t++) jobs[i].grad[t] = grads[i][t];
        pthread_create(&th[i], NULL, run_rank, &jobs[i]);
    }
    for (int i = 0; i < P; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&r.bar);
    for (int i = 0; i < P; i++) {
        st[i] = jobs[i].st;
        if (jobs[i].st != FC_OK && fail == FC_OK && !g_break && g_fail_step < 0)
            printf("rank %d: %s\n", i, jobs[i].err);
    }
}

static void run_ring(int P, int causal, fc_dtype dt, fc_status fail, const float *q, const float *k, const float *v,
                     void **outs, float **lses, fc_status *st)
{
    run_ring_bwd(P, causal, dt, fail, q, k, v, outs, lses, NULL, NULL, st);
}

static void fill(float *x, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    }
}

/* The fp64 reference over the whole sequence (inputs rounded to dt). */
static void reference(int P, int causal, fc_dtype dt, const float *q, const float *k, const float *v, void *out,
                      float *lse)
{
    const int S = total(P);
    const size_t es = (size_t)fc_dtype_bytes(dt), nq = (size_t)B * S * HQ * D, nk = (size_t)B * S * HKV * D;
    void *qd = malloc(nq * es), *kd = malloc(nk * es), *vd = malloc(nk * es);
    for (size_t i = 0; i < nq; i++) kit_store(qd, dt, (int64_t)i, q[i]);
    for (size_t i = 0; i < nk; i++) kit_store(kd, dt, (int64_t)i, k[i]), kit_store(vd, dt, (int64_t)i, v[i]);
    fc_context *ctx;
    fc_context_create(&ctx);
    fc_attention_args a;
    fc_attention_args_init(&a);
    a.q = kit_contiguous(qd, dt, B, S, HQ, D);
    a.k = kit_contiguous(kd, dt, B, S, HKV, D);
    a.v = kit_contiguous(vd, dt, B, S, HKV, D);
    a.out = kit_contiguous(out, dt, B, S, HQ, D);
    a.lse = kit_contiguous(lse, FC_DTYPE_F32, B, HQ, S, 0);
    a.causal = causal;
    a.backend = FC_BACKEND_CPU_REFERENCE;
    CHECK(fc_attention_forward(ctx, &a, NULL, NULL) == FC_OK, "reference: %s", fc_last_error(ctx));
    fc_context_free(ctx);
    free(qd);
    free(kd);
    free(vd);
}

/* Every rank's slice against the whole call's rows; 1 if within the gate. */
static int compare(int P, fc_dtype dt, void **outs, float **lses, const void *ref, const float *ref_lse, double *worst)
{
    const int S = total(P);
    const kit_gate g = kit_gate_for(dt);
    double err2 = 0, ref2 = 0, max_abs = 0, lse_abs = 0;
    int lse_bad = 0;
    for (int r = 0; r < P; r++)
        for (int w = 0; w < 2; w++) {
            const int gc = chunk_of(P, r, w), n = slice_rows(P, r), so = slot_off(P, r, w), go = chunk_off(P, gc);
            for (int b = 0; b < B; b++)
                for (int i = 0; i < chunk_len(P, gc); i++) {
                    for (int e = 0; e < HQ * D; e++) {
                        const double x = kit_load(outs[r], out_dt(dt), ((int64_t)(b * n + so + i) * HQ) * D + e);
                        const double y = kit_load(ref, dt, ((int64_t)(b * S + go + i) * HQ) * D + e);
                        max_abs = fmax(max_abs, fabs(x - y));
                        err2 += (x - y) * (x - y);
                        ref2 += y * y;
                    }
                    for (int h = 0; h < HQ; h++) {
                        const double x = lses[r][((int64_t)b * HQ + h) * n + so + i];
                        const double y = ref_lse[((int64_t)b * HQ + h) * S + go + i];
                        lse_abs = fmax(lse_abs, fabs(x - y));
                        lse_bad += !(fabs(x - y) <= g.lse_atol + g.lse_rtol * fabs(y));
                    }
                }
        }
    *worst = max_abs;
    return max_abs <= g.max_abs && sqrt(err2 / ref2) <= g.rel_l2 && lse_bad == 0;
}

typedef struct bufs {
    void *outs[PMAX];
    float *lses[PMAX];
} bufs;

static void bufs_alloc(bufs *x, fc_dtype dt)
{
    dt = out_dt(dt);
    for (int i = 0; i < PMAX; i++) {
        x->outs[i] = malloc((size_t)B * 2 * C * HQ * D * (size_t)fc_dtype_bytes(dt));
        x->lses[i] = malloc((size_t)B * HQ * 2 * C * sizeof(float));
        memset(x->outs[i], 0xA5, (size_t)B * 2 * C * HQ * D * (size_t)fc_dtype_bytes(dt));
        memset(x->lses[i], 0xA5, (size_t)B * HQ * 2 * C * sizeof(float));
    }
}

static void bufs_free(bufs *x)
{
    for (int i = 0; i < PMAX; i++) free(x->outs[i]), free(x->lses[i]);
}

/* f(P, causal, dtype, inputs) for 1 to PMAX ranks, causal or not, f32
 * and bf16, each with totals of 2 P C, 2 P C - 1 and 2 P - 1 rows. */
typedef void (*case_fn)(int P, int causal, fc_dtype dt, const float *const in[4]);
static void each_case(case_fn f, const float *const in[4])
{
    const fc_dtype dts[2] = {FC_DTYPE_F32, FC_DTYPE_BF16};
    for (int P = 1; P <= PMAX; P++)
        for (int trim = 0; trim < 3; trim++) {
            g_trim = trim == 0 ? 0 : trim == 1 ? 1 : 2 * P * C - (2 * P - 1);
            for (int causal = 0; causal < 2; causal++)
                for (int t = 0; t < 2; t++) f(P, causal, dts[t], in);
        }
    g_trim = 0;
}

static void ring_case(int P, int causal, fc_dtype dt, const float *const in[4])
{
    const float *q = in[0], *k = in[1], *v = in[2];
    const int S = total(P);
    bufs x, y;
    bufs_alloc(&x, dt);
    bufs_alloc(&y, dt);
    void *ref = malloc((size_t)B * S * HQ * D * (size_t)fc_dtype_bytes(dt));
    float *ref_lse = malloc((size_t)B * HQ * S * sizeof(float));
    reference(P, causal, dt, q, k, v, ref, ref_lse);
    fc_status st[PMAX], st2[PMAX];
    run_ring(P, causal, dt, FC_OK, q, k, v, x.outs, x.lses, st);
    run_ring(P, causal, dt, FC_OK, q, k, v, y.outs, y.lses, st2);
    int ok = 1, same = 1;
    for (int r = 0; r < P; r++) {
        ok &= st[r] == FC_OK && st2[r] == FC_OK;
        same &= !memcmp(x.outs[r], y.outs[r], (size_t)B * 2 * C * HQ * D * (size_t)fc_dtype_bytes(out_dt(dt))) &&
                !memcmp(x.lses[r], y.lses[r], (size_t)B * HQ * 2 * C * sizeof(float));
    }
    double worst = 0;
    CHECK(ok && compare(P, dt, x.outs, x.lses, ref, ref_lse, &worst),
          "P %d S %d causal %d %s: status %d, max_abs %.3g off the whole call", P, S, causal,
          kit_dtype_name(dt), (int)st[0], worst);
    CHECK(same, "P %d S %d causal %d %s: a rerun differs", P, S, causal, kit_dtype_name(dt));
    free(ref);
    free(ref_lse);
    bufs_free(&x);
    bufs_free(&y);
}

/* x (n floats) in dt, a new buffer. */
static void *to_dt(const float *x, size_t n, fc_dtype dt)
{
    void *y = malloc(n * (size_t)fc_dtype_bytes(dt));
    for (size_t i = 0; i < n; i++) kit_store(y, dt, (int64_t)i, x[i]);
    return y;
}

/* The fp64 reference backward over the whole sequence, given its out and
 * lse: grad[0..2] = dq, dk, dv in dt. */
static void reference_bwd(int P, int causal, fc_dtype dt, const float *const in[4], const whole *w, void *grad[3])
{
    const int S = total(P);
    const size_t nq = (size_t)B * S * HQ * D, nk = (size_t)B * S * HKV * D;
    void *qd = to_dt(in[0], nq, dt), *kd = to_dt(in[1], nk, dt), *vd = to_dt(in[2], nk, dt), *dd = to_dt(in[3], nq, dt);
    fc_context *ctx;
    fc_context_create(&ctx);
    fc_attention_backward_args b;
    fc_attention_backward_args_init(&b);
    b.fwd.q = kit_contiguous(qd, dt, B, S, HQ, D);
    b.fwd.k = kit_contiguous(kd, dt, B, S, HKV, D);
    b.fwd.v = kit_contiguous(vd, dt, B, S, HKV, D);
    b.fwd.out = kit_contiguous((void *)w->out, dt, B, S, HQ, D);
    b.fwd.lse = kit_contiguous((void *)w->lse, FC_DTYPE_F32, B, HQ, S, 0);
    b.fwd.causal = causal;
    b.fwd.backend = FC_BACKEND_CPU_REFERENCE;
    b.dout = kit_contiguous(dd, dt, B, S, HQ, D);
    b.dq = kit_contiguous(grad[0], dt, B, S, HQ, D);
    b.dk = kit_contiguous(grad[1], dt, B, S, HKV, D);
    b.dv = kit_contiguous(grad[2], dt, B, S, HKV, D);
    CHECK(fc_attention_backward(ctx, &b, NULL, NULL) == FC_OK, "reference backward: %s", fc_last_error(ctx));
    fc_context_free(ctx);
    free(qd), free(kd), free(vd), free(dd);
}

/* Gradient t (0 dq, 1 dk, 2 dv) of every rank's slice against the whole
 * call's, within the gate g; *rel: its max_rel. */
static int grad_matches(int P, fc_dtype dt, void *(*got)[3], void *const ref[3], int t, const kit_bwd_gate *g,
                        double *rel)
{
    const int S = total(P), h = t ? HKV : HQ;
    double ref_max = 0, max_abs = 0, err2 = 0, ref2 = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < P; r++)
            for (int w = 0; w < 2; w++)
                for (int b = 0; b < B; b++)
                    for (int i = 0; i < chunk_len(P, chunk_of(P, r, w)); i++)
                        for (int e = 0; e < h * D; e++) {
                            const int gc = chunk_of(P, r, w), n = slice_rows(P, r);
                            const int64_t ys = ((int64_t)(b * S + chunk_off(P, gc) + i) * h) * D + e;
                            const double y = kit_load(ref[t], dt, ys);
                            if (pass == 0) { ref_max = fmax(ref_max, fabs(y)); continue; }
                            const int64_t xs = ((int64_t)(b * n + slot_off(P, r, w) + i) * h) * D + e;
                            const double x = kit_load(got[r][t], dt, xs);
                            const double d = fabs(x - y);
                            if (!(d <= g->atol + g->atol_rel * ref_max + g->rtol * fabs(y))) max_abs = INFINITY;
                            max_abs = fmax(max_abs, d);
                            err2 += d * d;
                            ref2 += y * y;
                        }
    if (ref_max == 0) { /* a lone token's dq and dk are 0: nothing to be relative to */
        *rel = max_abs;
        return max_abs <= g->atol;
    }
    *rel = max_abs / ref_max;
    return *rel <= g->max_rel && sqrt(err2 / ref2) <= g->rel_l2;
}

static void backward_case(int P, int causal, fc_dtype dt, const float *const in[4])
{
    const int S = total(P);
    const size_t es = (size_t)fc_dtype_bytes(dt), nq = (size_t)B * S * HQ * D, nk = (size_t)B * S * HKV * D;
    void *out = malloc(nq * es), *ref[3] = {malloc(nq * es), malloc(nk * es), malloc(nk * es)};
    float *lse = malloc((size_t)B * HQ * S * sizeof(float));
    reference(P, causal, dt, in[0], in[1], in[2], out, lse);
    const whole w = {out, lse, in[3]};
    reference_bwd(P, causal, dt, in, &w, ref);
    bufs x, y;
    bufs_alloc(&x, dt);
    bufs_alloc(&y, dt);
    void *gx[PMAX][3], *gy[PMAX][3];
    for (int r = 0; r < PMAX; r++)
        for (int k = 0; k < 3; k++) {
            const size_t n = (size_t)B * 2 * C * (k ? HKV : HQ) * D * es;
            gx[r][k] = malloc(n), gy[r][k] = malloc(n);
            memset(gx[r][k], 0xA5, n);
            memset(gy[r][k], 0xA5, n);
        }
    fc_status st[PMAX], st2[PMAX];
    run_ring_bwd(P, causal, dt, FC_OK, in[0], in[1], in[2], x.outs, x.lses, &w, gx, st);
    run_ring_bwd(P, causal, dt, FC_OK, in[0], in[1], in[2], y.outs, y.lses, &w, gy, st2);
    int ok = 1, same = 1;
    for (int r = 0; r < P; r++) {
        ok &= st[r] == FC_OK && st2[r] == FC_OK;
        for (int k = 0; k < 3; k++)
            same &= !memcmp(gx[r][k], gy[r][k], (size_t)B * 2 * C * (k ? HKV : HQ) * D * es);
    }
    const kit_bwd_gate g = kit_bwd_gate_for(dt, KIT_BWD_CPU);
    for (int k = 0; k < 3 && ok; k++) {
        double rel = 0;
        CHECK(grad_matches(P, dt, gx, ref, k, &g, &rel), "backward P %d S %d causal %d %s: %s max_rel %.3g",
              P, S, causal, kit_dtype_name(dt), kit_grad_name(k), rel);
    }
    CHECK(ok, "backward P %d S %d causal %d %s: status %s", P, S, causal, kit_dtype_name(dt),
          fc_status_string(st[0]));
    CHECK(same, "backward P %d S %d causal %d %s: a rerun differs", P, S, causal, kit_dtype_name(dt));
    for (int r = 0; r < PMAX; r++)
        for (int k = 0; k < 3; k++) free(gx[r][k]), free(gy[r][k]);
    bufs_free(&x);
    bufs_free(&y);
    free(out), free(lse);
    for (int k = 0; k < 3; k++) free(ref[k]);
}

/* One 16-bit-input problem (the first 2C rows of the inputs) on backend
 * be with f32 out, lse and f32 dq, dk, dv (grad NULL: forward only). */
static fc_status wide_call(fc_backend be, fc_dtype dt, const float *const in[4], float *out, float *lse,
                           float *const grad[3], fc_status *bst)
{
    const size_t nq = (size_t)B * 2 * C * HQ * D, nk = (size_t)B * 2 * C * HKV * D;
    void *q = to_dt(in[0], nq, dt), *k = to_dt(in[1], nk, dt), *v = to_dt(in[2], nk, dt);
    void *dout = to_dt(in[3], nq, dt), *o16 = malloc(nq * (size_t)fc_dtype_bytes(dt));
    fc_context *ctx;
    fc_context_create(&ctx);
    fc_attention_backward_args b;
    fc_attention_backward_args_init(&b);
    b.fwd.q = kit_contiguous(q, dt, B, 2 * C, HQ, D);
    b.fwd.k = kit_contiguous(k, dt, B, 2 * C, HKV, D);
    b.fwd.v = kit_contiguous(v, dt, B, 2 * C, HKV, D);
    b.fwd.out = kit_contiguous(out, FC_DTYPE_F32, B, 2 * C, HQ, D);
    b.fwd.lse = kit_contiguous(lse, FC_DTYPE_F32, B, HQ, 2 * C, 0);
    b.fwd.causal = 1;
    b.fwd.backend = be;
    const fc_status st = fc_attention_forward(ctx, &b.fwd, NULL, NULL);
    /* the backward reads out in q's dtype: the reference's, rounded */
    for (size_t i = 0; i < nq; i++) kit_store(o16, dt, (int64_t)i, out[i]);
    b.fwd.out = kit_contiguous(o16, dt, B, 2 * C, HQ, D);
    b.dout = kit_contiguous(dout, dt, B, 2 * C, HQ, D);
    b.dq = kit_contiguous(grad[0], FC_DTYPE_F32, B, 2 * C, HQ, D);
    b.dk = kit_contiguous(grad[1], FC_DTYPE_F32, B, 2 * C, HKV, D);
    b.dv = kit_contiguous(grad[2], FC_DTYPE_F32, B, 2 * C, HKV, D);
    *bst = fc_attention_backward(ctx, &b, NULL, NULL);
    b.dk.dtype = dt;
    const fc_status mixed = fc_attention_backward(ctx, &b, NULL, NULL);
    CHECK(mixed == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), "dk.dtype"),
          "dq f32 with dk %s: %s (%s)", kit_dtype_name(dt), fc_status_string(mixed), fc_last_error(ctx));
    fc_context_free(ctx);
    free(q), free(k), free(v), free(dout), free(o16);
    return st;
}

/* max |x - y| / max |y| over n floats; *l2 its rel_l2, *abs max |x - y| */
static double rel_max(const float *x, const float *y, size_t n, double *l2, double *abs)
{
    double m = 0, ym = 0, e2 = 0, y2 = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)x[i] - y[i]);
        m = fmax(m, d), ym = fmax(ym, fabs(y[i])), e2 += d * d, y2 += (double)y[i] * y[i];
    }
    *l2 = sqrt(e2 / y2);
    *abs = m;
    return m / ym;
}

static void wide_outputs(const float *const in[4])
{
    const size_t nq = (size_t)B * 2 * C * HQ * D, nk = (size_t)B * 2 * C * HKV * D, nl = (size_t)B * HQ * 2 * C;
    const size_t n[4] = {nq, nq, nk, nk};
    const fc_dtype dts[2] = {FC_DTYPE_F16, FC_DTYPE_BF16};
    const kit_gate g = kit_gate_for(FC_DTYPE_F32);
    const kit_bwd_gate gb = kit_bwd_gate_for(FC_DTYPE_F32, KIT_BWD_CPU);
    for (int t = 0; t < 2; t++) {
        float *x[2][4], *lse[2];
        fc_status st[2], bst[2];
        for (int be = 0; be < 2; be++) {
            for (int i = 0; i < 4; i++) x[be][i] = malloc(n[i] * sizeof(float));
            lse[be] = malloc(nl * sizeof(float));
            st[be] = wide_call(be ? FC_BACKEND_CPU_REFERENCE : FC_BACKEND_CPU, dts[t], in, x[be][0], lse[be],
                               x[be] + 1, &bst[be]);
        }
        double l2 = 0, abs = 0, lse_l2 = 0, lse_abs = 0;
        rel_max(x[0][0], x[1][0], nq, &l2, &abs);
        rel_max(lse[0], lse[1], nl, &lse_l2, &lse_abs);
        CHECK(st[0] == FC_OK && st[1] == FC_OK && abs <= g.max_abs && l2 <= g.rel_l2 && lse_abs <= g.lse_atol,
              "%s inputs, f32 out: status %s/%s, max_abs %.3g rel_l2 %.3g, lse max_abs %.3g",
              kit_dtype_name(dts[t]), fc_status_string(st[0]), fc_status_string(st[1]), abs, l2, lse_abs);
        for (int i = 1; i < 4; i++) {
            const double rel = rel_max(x[0][i], x[1][i], n[i], &l2, &abs);
            CHECK(bst[0] == FC_OK && bst[1] == FC_OK && rel <= gb.max_rel && l2 <= gb.rel_l2,
                  "%s inputs, f32 %s: status %s/%s, max_rel %.3g rel_l2 %.3g", kit_dtype_name(dts[t]),
                  kit_grad_name(i - 1), fc_status_string(bst[0]), fc_status_string(bst[1]), rel, l2);
        }
        for (int be = 0; be < 2; be++) {
            for (int i = 0; i < 4; i++) free(x[be][i]);
            free(lse[be]);
        }
    }
}

/* A refused call: its status, a message naming `what`, out untouched. */
static void refused(const char *tag, fc_attention_args a, const fc_cp_comm *comm, fc_status want, const char *what)
{
    fc_context *ctx;
    fc_context_create(&ctx);
    unsigned char before[64];
    memcpy(before, a.out.data, sizeof before);
    const fc_status st = fc_cp_attention_forward(ctx, &a, comm, NULL);
    const int kept = !memcmp(before, a.out.data, sizeof before);
    CHECK(st == want && strstr(fc_last_error(ctx), what) && kept,
          "%s: status %s (want %s), message \"%s\" (want it to name %s), out %s", tag, fc_status_string(st),
          fc_status_string(want), fc_last_error(ctx), what, kept ? "kept" : "written");
    fc_context_free(ctx);
}

static fc_status never(void *user, const void *send, void *recv, size_t bytes, void *stream)
{
    (void)user, (void)send, (void)recv, (void)bytes, (void)stream;
    return FC_ERR_INTERNAL;
}

static void refusals(const float *q, const float *k, const float *v)
{
    static float out[B * 2 * C * HQ * D], lse[B * HQ * 2 * C];
    memset(out, 0x5A, sizeof out);
    fc_attention_args a;
    fc_attention_args_init(&a);
    a.q = kit_contiguous((void *)q, FC_DTYPE_F32, B, 2 * C, HQ, D);
    a.k = kit_contiguous((void *)k, FC_DTYPE_F32, B, 2 * C, HKV, D);
    a.v = kit_contiguous((void *)v, FC_DTYPE_F32, B, 2 * C, HKV, D);
    a.out = kit_contiguous(out, FC_DTYPE_F32, B, 2 * C, HQ, D);
    a.lse = kit_contiguous(lse, FC_DTYPE_F32, B, HQ, 2 * C, 0);
    a.backend = FC_BACKEND_CPU;
    const fc_cp_comm ok = {0, 2, NULL, never}, bad_rank = {2, 2, NULL, never}, no_fn = {0, 2, NULL, NULL};
    refused("comm NULL", a, NULL, FC_ERR_INVALID_ARGUMENT, "comm");
    refused("rank == size", a, &bad_rank, FC_ERR_INVALID_ARGUMENT, "rank 2 of size 2");
    refused("no exchange", a, &no_fn, FC_ERR_INVALID_ARGUMENT, "no exchange");
    fc_attention_args x = a;
    x.window_left = 5;
    refused("window", x, &ok, FC_ERR_UNSUPPORTED, "window");
    x = a;
    x.k.shape[1] = x.v.shape[1] = 2 * C - 2;
    refused("unequal lengths", x, &ok, FC_ERR_INVALID_ARGUMENT, "seqlen_k");
    x = a;
    x.q.dtype = FC_DTYPE_BF16;
    refused("dtypes differ", x, &ok, FC_ERR_INVALID_ARGUMENT, "dtypes differ");
    x = a;
    x.backend = FC_BACKEND_CUDA;
    refused("cuda", x, &ok, FC_ERR_UNSUPPORTED, "host memory");
    static const int32_t table[2] = {0, 1};
    x = a;
    x.block_table = table;
    refused("paged", x, &ok, FC_ERR_UNSUPPORTED, "paged");
}

/* Rank 1 of 3 refuses, or passes other options: every rank returns an
 * error (rank 1 its own), and nothing is written. */
static void one_rank_breaks(const float *q, const float *k, const float *v)
{
    for (g_break = 1; g_break <= 2; g_break++) {
        bufs x;
        bufs_alloc(&x, FC_DTYPE_F32);
        unsigned char before[64];
        memcpy(before, x.outs[0], sizeof before);
        fc_status st[PMAX];
        run_ring(3, 1, FC_DTYPE_F32, FC_OK, q, k, v, x.outs, x.lses, st);
        CHECK(st[0] == FC_ERR_INVALID_ARGUMENT && st[1] == FC_ERR_INVALID_ARGUMENT &&
                  st[2] == FC_ERR_INVALID_ARGUMENT && !memcmp(before, x.outs[0], sizeof before),
              "rank 1 %s: ranks returned %s, %s, %s", g_break == 1 ? "with no out" : "with causal flipped",
              fc_status_string(st[0]), fc_status_string(st[1]), fc_status_string(st[2]));
        bufs_free(&x);
    }
    g_break = 0;
}

/* Two ranks whose exchange fails: both return its status. */
static void failing_exchange(const float *q, const float *k, const float *v)
{
    bufs x;
    bufs_alloc(&x, FC_DTYPE_F32);
    fc_status st[PMAX];
    run_ring(2, 1, FC_DTYPE_F32, FC_ERR_INTERNAL, q, k, v, x.outs, x.lses, st);
    CHECK(st[0] == FC_ERR_INTERNAL && st[1] == FC_ERR_INTERNAL, "a failing exchange: ranks returned %s, %s",
          fc_status_string(st[0]), fc_status_string(st[1]));
    bufs_free(&x);
}

/* Rank 1 of 3 fails mid-ring (its pair calls, from step 0, 1 or 2, as
 * out of memory): no rank waits; rank 1 returns the failure and writes
 * nothing. Forward: the others' results are those of a clean run, bit for
 * bit. Backward: a rank whose dK/dV sums passed rank 1 after it failed
 * returns an error naming rank 1 and writes nothing; any other rank's
 * results equal a clean run's. */
static void mid_ring_failure(const float *const in[4])
{
    enum { P = 3 };
    const size_t es = sizeof(float), nq = (size_t)B * 2 * C * HQ * D * es, nk = (size_t)B * 2 * C * HKV * D * es;
    const size_t S = (size_t)total(P);
    void *out = malloc(S * B * HQ * D * es);
    float *lse = malloc(S * B * HQ * sizeof(float));
    reference(P, 1, FC_DTYPE_F32, in[0], in[1], in[2], out, lse);
    const whole w = {out, lse, in[3]};
    bufs clean, x;
    bufs_alloc(&clean, FC_DTYPE_F32);
    void *g0[PMAX][3], *g1[PMAX][3];
    for (int r = 0; r < PMAX; r++)
        for (int k = 0; k < 3; k++) g0[r][k] = malloc(k ? nk : nq), g1[r][k] = malloc(k ? nk : nq);
    fc_status st[PMAX];
    run_ring(P, 1, FC_DTYPE_F32, FC_OK, in[0], in[1], in[2], clean.outs, clean.lses, st);
    CHECK(st[0] == FC_OK && st[1] == FC_OK && st[2] == FC_OK, "mid-ring failure: the clean forward failed");
    bufs_alloc(&x, FC_DTYPE_F32); /* the backward's slices of the whole call's out and lse */
    run_ring_bwd(P, 1, FC_DTYPE_F32, FC_OK, in[0], in[1], in[2], x.outs, x.lses, &w, g0, st);
    CHECK(st[0] == FC_OK && st[1] == FC_OK && st[2] == FC_OK, "mid-ring failure: the clean backward failed");
    bufs_free(&x);
    for (g_fail_step = 0; g_fail_step < P; g_fail_step++) {
        bufs_alloc(&x, FC_DTYPE_F32);
        run_ring(P, 1, FC_DTYPE_F32, FC_OK, in[0], in[1], in[2], x.outs, x.lses, st);
        int ok = st[1] == FC_ERR_OUT_OF_MEMORY && ((unsigned char *)x.outs[1])[0] == 0xA5;
        for (int r = 0; r < P; r += 2)
            ok &= st[r] == FC_OK && !memcmp(x.outs[r], clean.outs[r], nq) && !memcmp(x.lses[r], clean.lses[r],
                                                                                     (size_t)B * HQ * 2 * C * 4);
        CHECK(ok, "forward, rank 1 failing from step %d: ranks returned %s, %s, %s", g_fail_step,
              fc_status_string(st[0]), fc_status_string(st[1]), fc_status_string(st[2]));
        bufs_free(&x);
        bufs_alloc(&x, FC_DTYPE_F32);
        for (int r = 0; r < PMAX; r++)
            for (int k = 0; k < 3; k++) memset(g1[r][k], 0xA5, k ? nk : nq);
        run_ring_bwd(P, 1, FC_DTYPE_F32, FC_OK, in[0], in[1], in[2], x.outs, x.lses, &w, g1, st);
        int others_failed = 0;
        ok = st[1] == FC_ERR_OUT_OF_MEMORY;
        for (int r = 0; r < P; r++) {
            const int kept = ((unsigned char *)g1[r][0])[0] == 0xA5 && ((unsigned char *)g1[r][1])[0] == 0xA5;
            if (st[r] == FC_OK)
                for (int k = 0; k < 3; k++) ok &= !memcmp(g1[r][k], g0[r][k], k ? nk : nq);
            else ok &= kept;
            others_failed += r != 1 && st[r] != FC_OK;
        }
        CHECK(ok && others_failed > 0, "backward, rank 1 failing from step %d: ranks returned %s, %s, %s",
              g_fail_step, fc_status_string(st[0]), fc_status_string(st[1]), fc_status_string(st[2]));
        bufs_free(&x);
    }
    g_fail_step = -1;
    for (int r = 0; r < PMAX; r++)
        for (int k = 0; k < 3; k++) free(g0[r][k]), free(g1[r][k]);
    bufs_free(&clean);
    free(out), free(lse);
}

int main(void)
{
    const size_t nq = (size_t)B * 2 * PMAX * C * HQ * D, nk = (size_t)B * 2 * PMAX * C * HKV * D;
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float));
    if (!q || !k || !v) return test_give_up("FAIL cannot allocate the inputs");
    fill(q, nq, 1);
    fill(k, nk, 2);
    fill(v, nk, 3);
    float *dout = malloc(nq * sizeof(float));
    if (!dout) return test_give_up("FAIL cannot allocate the inputs");
    fill(dout, nq, 4);
    const float *const in[4] = {q, k, v, dout};
    int p0 = g_pass, f0 = g_fail;
    each_case(ring_case, in);
    group_done("ring vs the whole call", p0, f0);
    p0 = g_pass, f0 = g_fail;
    each_case(backward_case, in);
    group_done("backward vs the whole call", p0, f0);
    p0 = g_pass, f0 = g_fail;
    g_out_f32 = 1; /* the ring's out in f32 under bf16 inputs: its chunks found by f32 strides */
    for (int P = 2; P <= PMAX; P++)
        for (int causal = 0; causal < 2; causal++) ring_case(P, causal, FC_DTYPE_BF16, in);
    g_out_f32 = 0;
    group_done("ring with an f32 out of bf16 inputs", p0, f0);
    p0 = g_pass, f0 = g_fail;
    wide_outputs(in);
    group_done("f32 outputs of 16-bit inputs", p0, f0);
    p0 = g_pass, f0 = g_fail;
    refusals(q, k, v);
    failing_exchange(q, k, v);
    one_rank_breaks(q, k, v);
    group_done("refusals", p0, f0);
    p0 = g_pass, f0 = g_fail;
    mid_ring_failure(in);
    group_done("a rank failing mid-ring", p0, f0);
    free(q);
    free(k);
    free(v);
    free(dout);
    return test_summary();
}
