/*
 * test_cpu_f64.c -- f64 calls, which exist for gradient checks in double
 * (torch.autograd.gradcheck): backend AUTO runs them on the cpu-reference
 * backend, the tiled CPU and the CUDA backends refuse them.
 *
 * The backward's dq, dk, dv in f64 are held to central differences of the
 * library's own f64 forward of L = sum(out * dout) (h = 1e-6: truncation
 * ~h^2, cancellation ~1e-16 |L| / h, both below 1e-9 here). The backward
 * reads lse in f32 (the API's one lse type), so P carries a relative error
 * of |lse| 2^-24 (a few 1e-7 on these shapes): gated at 2e-6 of the largest
 * gradient. Gradients whose difference is exactly 0 (keys no query sees)
 * must be exactly 0. Outputs are poisoned first and checked fully written.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "test_util.h"

typedef struct f64_case {
    const char *name;
    int b, hq, hkv, sq, sk, d, causal, wl, wr;
    float softcap;
} f64_case;

/* Dense bshd tensors of one case: q, k, v, out, dout, dq, dk, dv and lse. */
typedef struct f64_bufs {
    const f64_case *c;
    double *x[8];
    int64_t n[8];
    float *lse;
} f64_bufs;

enum { Q, K, V, O, DO, DQ, DK, DV };

static void dense(fc_tensor *t, void *data, fc_dtype dt, int b, int s, int h, int d)
{
    t->data = data; t->dtype = dt; t->ndim = 4;
    int64_t sh[4] = {b, s, h, d}, st[4] = {(int64_t)s * h * d, (int64_t)h * d, d, 1};
    memcpy(t->shape, sh, sizeof sh);
    memcpy(t->stride, st, sizeof st);
}

static void fwd_args(const f64_bufs *u, fc_attention_args *a)
{
    const f64_case *c = u->c;
    fc_attention_args_init(a);
    dense(&a->q, u->x[Q], FC_DTYPE_F64, c->b, c->sq, c->hq, c->d);
    dense(&a->k, u->x[K], FC_DTYPE_F64, c->b, c->sk, c->hkv, c->d);
    dense(&a->v, u->x[V], FC_DTYPE_F64, c->b, c->sk, c->hkv, c->d);
    dense(&a->out, u->x[O], FC_DTYPE_F64, c->b, c->sq, c->hq, c->d);
    a->lse.data = u->lse; a->lse.dtype = FC_DTYPE_F32; a->lse.ndim = 3;
    a->lse.shape[0] = c->b; a->lse.shape[1] = c->hq; a->lse.shape[2] = c->sq;
    a->lse.stride[0] = (int64_t)c->hq * c->sq; a->lse.stride[1] = c->sq; a->lse.stride[2] = 1;
    a->causal = c->causal; a->window_left = c->wl; a->window_right = c->wr;
    a->softcap = c->softcap;
}

static void bwd_args(const f64_bufs *u, fc_attention_backward_args *b)
{
    const f64_case *c = u->c;
    fc_attention_backward_args_init(b);
    fwd_args(u, &b->fwd);
    dense(&b->dout, u->x[DO], FC_DTYPE_F64, c->b, c->sq, c->hq, c->d);
    dense(&b->dq, u->x[DQ], FC_DTYPE_F64, c->b, c->sq, c->hq, c->d);
    dense(&b->dk, u->x[DK], FC_DTYPE_F64, c->b, c->sk, c->hkv, c->d);
    dense(&b->dv, u->x[DV], FC_DTYPE_F64, c->b, c->sk, c->hkv, c->d);
}

static int bufs_alloc(f64_bufs *u, const f64_case *c, uint64_t seed)
{
    memset(u, 0, sizeof *u);
    u->c = c;
    const int64_t nq = (int64_t)c->b * c->sq * c->hq * c->d, nk = (int64_t)c->b * c->sk * c->hkv * c->d;
    const int64_t n[8] = {nq, nk, nk, nq, nq, nq, nk, nk};
    for (int i = 0; i < 8; i++) {
        u->n[i] = n[i];
        u->x[i] = malloc((size_t)n[i] * sizeof(double));
        if (!u->x[i]) return -1;
        for (int64_t e = 0; e < n[i]; e++) u->x[i][e] = 2.0 * kit_rand_uniform(&seed) - 1.0;
    }
    u->lse = malloc((size_t)c->b * c->hq * c->sq * sizeof(float));
    return u->lse ? 0 : -1;
}

static void bufs_free(f64_bufs *u)
{
    for (int i = 0; i < 8; i++) free(u->x[i]);
    free(u->lse);
}

/* L = sum(out * dout) from the library's f64 forward; NAN if it failed. */
static double loss(fc_context *ctx, f64_bufs *u)
{
    fc_attention_args a;
    fwd_args(u, &a);
    if (fc_attention_forward(ctx, &a, NULL, NULL) != FC_OK) return NAN;
    double l = 0;
    for (int64_t e = 0; e < u->n[O]; e++) l += u->x[O][e] * u->x[DO][e];
    return l;
}

/* Worst |grad - central difference| over tensor t (Q, K or V), relative to
 * the largest gradient; exact zeros must stay exact. */
static double fd_error(fc_context *ctx, f64_bufs *u, int t, const double *grad, int *zero_bad)
{
    const double h = 1e-6;
    double worst = 0, top = 0;
    for (int64_t e = 0; e < u->n[t]; e++) top = fmax(top, fabs(grad[e]));
    for (int64_t e = 0; e < u->n[t]; e++) {
        const double x0 = u->x[t][e];
        u->x[t][e] = x0 + h;
        const double lp = loss(ctx, u);
        u->x[t][e] = x0 - h;
        const double lm = loss(ctx, u);
        u->x[t][e] = x0;
        const double fd = (lp - lm) / (2 * h);
        if (lp == lm && grad[e] != 0) (*zero_bad)++;
        worst = fmax(worst, fabs(grad[e] - fd) / (top > 0 ? top : 1));
    }
    return worst;
}

static void gradient_case(fc_context *ctx, const f64_case *c, uint64_t seed)
{
    int p0 = g_pass, f0 = g_fail;
    f64_bufs u;
    if (bufs_alloc(&u, c, seed)) { CHECK(0, "%s: out of memory", c->name); bufs_free(&u); return; }
    fc_kernel_info info;
    fc_attention_args a;
    fwd_args(&u, &a);
    for (int64_t e = 0; e < u.n[O]; e++) u.x[O][e] = NAN;
    fc_status st = fc_attention_forward(ctx, &a, NULL, &info);
    CHECK(st == FC_OK, "%s forward: %s", c->name, fc_last_error(ctx));
    CHECK(info.backend == FC_BACKEND_CPU_REFERENCE, "%s: f64 ran on %s", c->name, info.name);
    int unwritten = 0;
    for (int64_t e = 0; e < u.n[O]; e++) unwritten += isnan(u.x[O][e]);
    CHECK(unwritten == 0, "%s forward: %d elements unwritten", c->name, unwritten);

    fc_attention_backward_args b;
    bwd_args(&u, &b);
    for (int t = DQ; t <= DV; t++)
        for (int64_t e = 0; e < u.n[t]; e++) u.x[t][e] = NAN;
    st = fc_attention_backward(ctx, &b, NULL, &info);
    CHECK(st == FC_OK, "%s backward: %s", c->name, fc_last_error(ctx));
    for (int t = DQ; t <= DV; t++) {
        unwritten = 0;
        for (int64_t e = 0; e < u.n[t]; e++) unwritten += isnan(u.x[t][e]);
        CHECK(unwritten == 0, "%s backward: %d elements of grad %d unwritten", c->name, unwritten, t - DQ);
        /* loss() overwrites out; the gradients stay in their own buffers. */
        int zero_bad = 0;
        const double err = fd_error(ctx, &u, t - DQ, u.x[t], &zero_bad);
        CHECK(err <= 2e-6, "%s: grad %d off the central difference by %.3g of its largest", c->name, t - DQ, err);
        CHECK(zero_bad == 0, "%s: grad %d has %d nonzero elements where the loss does not move", c->name,
              t - DQ, zero_bad);
    }
    bufs_free(&u);
    group_done(c->name, p0, f0);
}

/* f64 anywhere but the reference: FC_ERR_UNSUPPORTED, out untouched. */
static void refusals(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    static const f64_case c = {"refusals", 1, 2, 2, 5, 6, 8, 0, -1, -1, 0};
    f64_bufs u;
    if (bufs_alloc(&u, &c, 7)) { CHECK(0, "refusals: out of memory"); bufs_free(&u); return; }
    const fc_backend bk[2] = {FC_BACKEND_CPU, FC_BACKEND_CUDA};
    for (int i = 0; i < 2; i++) {
        fc_attention_args a;
        fwd_args(&u, &a);
        a.backend = bk[i];
        for (int64_t e = 0; e < u.n[O]; e++) u.x[O][e] = 3.0;
        fc_status st = fc_attention_forward(ctx, &a, NULL, NULL);
        /* CUDA refuses these host pointers before it looks at the dtype. */
        if (bk[i] == FC_BACKEND_CPU) {
            CHECK(st == FC_ERR_UNSUPPORTED, "backend cpu took f64 (%d)", (int)st);
            CHECK(strstr(fc_last_error(ctx), "f64") != NULL, "message does not name f64: %s", fc_last_error(ctx));
        } else {
            CHECK(st != FC_OK, "backend cuda took host f64");
        }
        int touched = 0;
        for (int64_t e = 0; e < u.n[O]; e++) touched += u.x[O][e] != 3.0;
        CHECK(touched == 0, "backend %d: %d elements of out touched", (int)bk[i], touched);
    }
    fc_attention_args a;
    fwd_args(&u, &a);
    a.lse.dtype = FC_DTYPE_F64;
    CHECK(fc_attention_supported(ctx, &a, NULL) == FC_ERR_INVALID_ARGUMENT, "lse in f64 accepted");
    bufs_free(&u);
    group_done("refusals", p0, f0);
}

int main(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("cannot create a context");
    static const f64_case cases[] = {
        {"plain", 1, 2, 2, 5, 7, 8, 0, -1, -1, 0},
        {"causal sq>sk gqa", 2, 4, 2, 6, 4, 8, 1, -1, 0, 0},
        {"window softcap", 1, 3, 1, 7, 9, 16, 0, 2, 1, 5.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) gradient_case(ctx, &cases[i], 100 + i);
    refusals(ctx);
    fc_context_free(ctx);
    return test_summary();
}
