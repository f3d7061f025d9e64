/*
 * test_cpu_backward.c -- the fp64 reference backward (FC_BACKEND_CPU_REFERENCE)
 * against central finite differences of the loss L = sum(out * dout), with
 * out from a double-precision forward written here (independent of the
 * library: its own visibility rule, as flashcore.h states it).
 *
 * The inputs are the case's f32 values taken as doubles; each logical
 * element of q, k and v is moved by +-h and L evaluated in double, so the
 * difference quotient is accurate to ~1e-9 (h = 1e-5: truncation h^2,
 * cancellation eps*|L|/h). The reference reads the forward's out and lse
 * rounded to f32 and rounds its gradients to f32, which bounds its error by
 * a few 1e-7 of the largest gradient: gated at 1e-5. Elements whose
 * difference is exactly 0 (masked keys, rows with no key) must be exactly 0.
 * f16/bf16 cases check the reference's loads and stores: its out is rounded
 * to the dtype, so the bound is a few units of the dtype's rounding.
 *
 * Shapes: plain, causal with sq = sk, sq > sk (rows with no key), sq < sk,
 * a window that leaves keys unseen, softcap, GQA 3:1 and MQA, BHSD and
 * padded layouts, varlen with empty sequences and tokens past the last
 * offset (left unwritten), varlen with no query token at all (dk = dv = 0
 * must still be written). Every gradient buffer is poisoned first; the
 * kit's comparison proves every logical element written and nothing else.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"

#include "test_util.h"

/* ---- the fp64 forward and its loss ----------------------------------------------- */

/* The case's inputs as doubles, indexed like its buffers. */
typedef struct fd_inputs {
    const kit_bwd_case *b;
    double *x[4]; /* q, k, v, dout */
    int64_t n[4];
} fd_inputs;

static const char *const k_in_names[4] = {"q", "k", "v", "dout"};

/* Key j visible to query i, as flashcore.h states the rule. */
static int visible(int64_t i, int64_t j, int64_t sq, int64_t sk, const kit_shape *s)
{
    const int64_t diag = i + sk - sq, wr = s->causal ? 0 : s->window_right, wl = s->window_left;
    return (wr < 0 || j <= diag + wr) && (wl < 0 || j >= diag - wl);
}

/* Offset of element (sequence b, row, head h, d = 0) of t. */
static int64_t at(const kit_bwd_case *b, const fc_tensor *t, int seq, int64_t row, int h, int kv)
{
    if (!b->c.s.varlen) return seq * t->stride[0] + row * t->stride[1] + h * t->stride[2];
    const int32_t *cu = kv ? b->c.cu_k : b->c.cu_q;
    return (cu[seq] + row) * t->stride[0] + h * t->stride[1];
}

static void seq_lengths(const kit_bwd_case *b, int seq, int64_t *sq, int64_t *sk)
{
    const kit_case *c = &b->c;
    *sq = c->s.varlen ? c->cu_q[seq + 1] - c->cu_q[seq] : c->s.seqlen_q;
    *sk = c->s.varlen ? c->cu_k[seq + 1] - c->cu_k[seq] : c->s.seqlen_k;
}

/* The scale as the library resolves it: a float. */
static double resolved_scale(const kit_shape *s)
{
    return s->scale != 0.0f ? (double)s->scale : (double)(float)(1.0 / sqrt((double)s->head_dim));
}

/* L of one query row: out = softmax(scores) . V, dotted with dout. */
static double row_loss(const fd_inputs *in, int seq, int h, int64_t i, double *w)
{
    const kit_bwd_case *b = in->b;
    const kit_shape *s = &b->c.s;
    const int D = s->head_dim, g = h / (s->heads_q / s->heads_kv);
    const double scale = resolved_scale(s), cap = s->softcap;
    int64_t sq, sk;
    seq_lengths(b, seq, &sq, &sk);
    const double *q = in->x[0] + at(b, &b->args.fwd.q, seq, i, h, 0);
    double mx = -INFINITY;
    for (int64_t j = 0; j < sk; j++) {
        if (!visible(i, j, sq, sk, s)) continue;
        const double *k = in->x[1] + at(b, &b->args.fwd.k, seq, j, g, 1);
        double dotp = 0;
        for (int d = 0; d < D; d++) dotp += q[d] * k[d];
        w[j] = cap > 0 ? cap * tanh(scale * dotp / cap) : scale * dotp;
        if (w[j] > mx) mx = w[j];
    }
    if (mx == -INFINITY) return 0.0; /* no visible key: out = 0 */
    double sum = 0, l = 0;
    for (int64_t j = 0; j < sk; j++)
        if (visible(i, j, sq, sk, s)) sum += w[j] = exp(w[j] - mx);
    const double *dout = in->x[3] + at(b, &b->args.dout, seq, i, h, 0);
    for (int64_t j = 0; j < sk; j++) {
        if (!visible(i, j, sq, sk, s)) continue;
        const double *v = in->x[2] + at(b, &b->args.fwd.v, seq, j, g, 1);
        for (int d = 0; d < D; d++) l += w[j] / sum * v[d] * dout[d];
    }
    return l;
}

static double loss(const fd_inputs *in, double *w)
{
    const kit_shape *s = &in->b->c.s;
    double L = 0;
    for (int seq = 0; seq < s->batch; seq++) {
        int64_t sq, sk;
        seq_lengths(in->b, seq, &sq, &sk);
        for (int h = 0; h < s->heads_q; h++)
            for (int64_t i = 0; i < sq; i++) L += row_loss(in, seq, h, i, w);
    }
    return L;
}

/* ---- finite differences ------------------------------------------------------------ */

/* What one gradient's comparison found. */
typedef struct fd_result {
    int64_t n, zero, zero_bad;
    double fd_max, err_max;
} fd_result;

/* Central difference of L in input t (0 q, 1 k, 2 v) at element x. */
static double central(fd_inputs *in, int t, int64_t x, double *w)
{
    const double h = 1e-5, keep = in->x[t][x];
    in->x[t][x] = keep + h;
    const double lp = loss(in, w);
    in->x[t][x] = keep - h;
    const double lm = loss(in, w);
    in->x[t][x] = keep;
    return (lp - lm) / (2 * h);
}

/* Every logical element of gradient t against the difference quotient. */
static void fd_compare(fd_inputs *in, int t, const void *grad, double *w, fd_result *r)
{
    const kit_bwd_case *b = in->b;
    const kit_shape *s = &b->c.s;
    const fc_tensor *ten = t == 0 ? &b->args.fwd.q : t == 1 ? &b->args.fwd.k : &b->args.fwd.v;
    const int heads = t == 0 ? s->heads_q : s->heads_kv;
    memset(r, 0, sizeof *r);
    for (int seq = 0; seq < s->batch; seq++) {
        int64_t sq, sk;
        seq_lengths(b, seq, &sq, &sk);
        for (int64_t row = 0; row < (t == 0 ? sq : sk); row++)
            for (int h = 0; h < heads; h++)
                for (int d = 0; d < s->head_dim; d++) {
                    const int64_t x = at(b, ten, seq, row, h, t > 0) + d;
                    const double fd = central(in, t, x, w), g = kit_load(grad, s->dtype, x);
                    r->n++;
                    if (fd == 0.0) {
                        r->zero++;
                        if (g != 0.0) r->zero_bad++;
                    }
                    if (fabs(fd) > r->fd_max) r->fd_max = fabs(fd);
                    if (!(fabs(g - fd) <= r->err_max)) r->err_max = fabs(g - fd); /* NaN sticks */
                }
    }
}

static int inputs_load(fd_inputs *in, const kit_bwd_case *b)
{
    const void *buf[4] = {b->c.q, b->c.k, b->c.v, b->dout};
    const size_t bytes[4] = {b->c.q_bytes, b->c.k_bytes, b->c.v_bytes, b->dout_bytes};
    in->b = b;
    for (int t = 0; t < 4; t++) {
        in->n[t] = (int64_t)(bytes[t] / kit_dtype_size(b->c.s.dtype));
        in->x[t] = malloc((size_t)in->n[t] * sizeof(double));
        if (!in->x[t]) return -1;
        for (int64_t x = 0; x < in->n[t]; x++) in->x[t][x] = kit_load(buf[t], b->c.s.dtype, x);
    }
    return 0;
}

static void inputs_free(fd_inputs *in)
{
    for (int t = 0; t < 4; t++) free(in->x[t]);
}

/* ---- the cases --------------------------------------------------------------------- */

/* Changes a case after its inputs are drawn (NULL: none). */
typedef void (*prep_fn)(kit_bwd_case *b);

/* Bound on max|reference - fd| / max|fd| by dtype: f32, a few 1e-7 (f32
 * rounding of out, lse and the gradient) with margin; f16/bf16, out and the
 * gradient rounded to the dtype: 4 units of 2^-11 / 2^-8. */
static double fd_bound(fc_dtype dt) { return dt == FC_DTYPE_F32 ? 1e-5 : dt == FC_DTYPE_F16 ? 0x1p-9 : 0x1p-6; }

/* The reference backward of one case twice (bitwise equal), fully written
 * and nothing else, and within fd_bound of the finite differences. */
static void fd_case(fc_context *ctx, const char *name, const kit_shape *s, uint64_t seed, prep_fn prep)
{
    int p0 = g_pass, f0 = g_fail;
    kit_bwd_case b;
    if (kit_bwd_case_init(&b, s, seed) != 0) {
        CHECK(0, "%s: kit_bwd_case_init failed", name);
        return;
    }
    if (prep) prep(&b);
    fc_status st = kit_bwd_forward(ctx, &b, FC_BACKEND_CPU_REFERENCE);
    CHECK(st == FC_OK, "%s: reference forward: %s", name, fc_last_error(ctx));
    void *ref[3] = {malloc(b.dq_bytes), malloc(b.dk_bytes), malloc(b.dv_bytes)};
    fd_inputs in;
    memset(&in, 0, sizeof in);
    double *w = malloc((size_t)(b.c.s.seqlen_k + 1) * sizeof(double)); /* after prep */
    if (st || !ref[0] || !ref[1] || !ref[2] || !w || inputs_load(&in, &b) != 0) {
        CHECK(st != FC_OK, "%s: out of memory", name);
        goto done;
    }
    st = kit_bwd_reference(ctx, &b, ref);
    CHECK(st == FC_OK, "%s: reference backward: %s (%s)", name, fc_status_string(st), fc_last_error(ctx));
    b.args.fwd.backend = FC_BACKEND_CPU_REFERENCE; /* the same again into b's buffers */
    st = fc_attention_backward(ctx, &b.args, NULL, NULL);
    const void *got[3] = {b.dq, b.dk, b.dv}, *want[3] = {ref[0], ref[1], ref[2]};
    CHECK(st == FC_OK && !memcmp(b.dq, ref[0], b.dq_bytes) && !memcmp(b.dk, ref[1], b.dk_bytes) &&
              !memcmp(b.dv, ref[2], b.dv_bytes), "%s: a second reference run differs", name);
    kit_bwd_gate gate = kit_bwd_gate_for(s->dtype, KIT_BWD_CPU);
    kit_bwd_metrics m[3];
    kit_bwd_compare(&b, got, want, &gate, m);
    for (int t = 0; t < 3; t++) {
        CHECK(m[t].unwritten == 0 && m[t].nonfinite == 0 && m[t].stray == 0,
              "%s: %s unwritten %lld nonfinite %lld stray %lld", name, kit_grad_name(t),
              (long long)m[t].unwritten, (long long)m[t].nonfinite, (long long)m[t].stray);
        fd_result r;
        fd_compare(&in, t, ref[t], w, &r);
        const double rel = r.fd_max > 0 ? r.err_max / r.fd_max : r.err_max;
        CHECK(rel <= fd_bound(s->dtype) && r.zero_bad == 0,
              "%s: %s vs finite differences: max err %.3e of max %.3e (rel %.2e > %.2e?), %lld of %lld "
              "exact zeros not 0", name, kit_grad_name(t), r.err_max, r.fd_max, rel, fd_bound(s->dtype),
              (long long)r.zero_bad, (long long)r.zero);
        printf("  %-40s %s rel %.2e (max |g| %.2e, %lld elements, %lld zero)\n", name, kit_grad_name(t),
               rel, r.fd_max, (long long)r.n, (long long)r.zero);
    }
done:
    group_done(name, p0, f0);
    inputs_free(&in);
    free(w);
    for (int t = 0; t < 3; t++) free(ref[t]);
    kit_bwd_case_free(&b);
}

/* One row of the case list: a small shape and its options. */
typedef struct fd_row {
    const char *name;
    int batch, hq, hkv, sq, sk, d;
    int causal, wl, wr;
    float softcap, scale;
    kit_layout layout;
    int varlen;
    prep_fn prep;
} fd_row;

static const fd_row k_rows[] = {
    {"plain", 2, 2, 2, 6, 6, 5, 0, -1, -1, 0, 0, KIT_LAYOUT_BSHD, 0, NULL},
    {"causal sq = sk", 1, 2, 2, 7, 7, 4, 1, -1, -1, 0, 0, KIT_LAYOUT_BSHD, 0, NULL},
    {"causal sq 9 > sk 5 (rows without keys)", 2, 2, 1, 9, 5, 3, 1, -1, -1, 0, 0, KIT_LAYOUT_BHSD, 0, NULL},
    {"causal sq 4 < sk 10", 1, 3, 3, 4, 10, 6, 1, -1, -1, 0, 0, KIT_LAYOUT_PADDED, 0, NULL},
    {"window (1,0) sq 4 sk 12 (keys unseen)", 2, 2, 2, 4, 12, 4, 0, 1, 0, 0, 0, KIT_LAYOUT_BSHD, 0, NULL},
    {"window (2,3) sq 8 sk 6", 1, 2, 1, 8, 6, 5, 0, 2, 3, 0, 0, KIT_LAYOUT_BSHD, 0, NULL},
    {"softcap 2 scale 1.5", 2, 2, 2, 5, 7, 4, 0, -1, -1, 2.0f, 1.5f, KIT_LAYOUT_BSHD, 0, NULL},
    {"softcap 3 causal window_left 2", 1, 2, 2, 7, 7, 3, 1, 2, -1, 3.0f, 0, KIT_LAYOUT_PADDED, 0, NULL},
    {"gqa 3:1", 1, 6, 2, 5, 6, 4, 0, -1, -1, 0, 0, KIT_LAYOUT_BHSD, 0, NULL},
    {"mqa 4:1 causal", 2, 4, 1, 6, 4, 3, 1, -1, -1, 0, 0, KIT_LAYOUT_BSHD, 0, NULL},
    {"negative scale", 1, 2, 2, 5, 5, 4, 0, -1, -1, 0, -0.7f, KIT_LAYOUT_BSHD, 0, NULL},
    {"varlen empty seqs, tokens past the end", 5, 4, 2, 6, 7, 3, 0, -1, -1, 0, 0, KIT_LAYOUT_BSHD, 1,
     kit_bwd_varlen_edges},
    {"varlen causal empty seqs, gqa, padded", 4, 4, 2, 7, 5, 4, 1, -1, -1, 0, 0, KIT_LAYOUT_PADDED, 1,
     kit_bwd_varlen_edges},
    {"varlen no query token (dk = dv = 0)", 3, 2, 1, 0, 6, 4, 0, -1, -1, 0, 0, KIT_LAYOUT_BSHD, 1, NULL},
};

static kit_shape row_shape(const fd_row *r, fc_dtype dt)
{
    kit_shape s = test_shape(r->batch, r->hq, r->hkv, r->sq, r->sk, r->d, dt);
    s.name = r->name;
    s.causal = r->causal;
    s.window_left = r->wl;
    s.window_right = r->wr;
    s.softcap = r->softcap;
    s.scale = r->scale;
    s.layout = r->layout;
    s.varlen = r->varlen;
    return s;
}

int main(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    const double t0 = kit_now();
    const int n = (int)(sizeof k_rows / sizeof k_rows[0]);
    char name[128];
    for (int i = 0; i < n; i++) {
        const kit_shape s = row_shape(&k_rows[i], FC_DTYPE_F32);
        snprintf(name, sizeof name, "%s f32", k_rows[i].name);
        fd_case(ctx, name, &s, 100 + (uint64_t)i, k_rows[i].prep);
    }
    /* the f16 and bf16 loads and stores, on the masked and the varlen rows */
    static const int narrow[] = {2, 7, 12};
    for (int dt = FC_DTYPE_F16; dt <= FC_DTYPE_BF16; dt++)
        for (int i = 0; i < 3; i++) {
            const fd_row *r = &k_rows[narrow[i]];
            const kit_shape s = row_shape(r, (fc_dtype)dt);
            snprintf(name, sizeof name, "%s %s", r->name, kit_dtype_name((fc_dtype)dt));
            fd_case(ctx, name, &s, 200 + (uint64_t)narrow[i], r->prep);
        }
    fc_context_free(ctx);
    printf("(%.1f s)\n", kit_now() - t0);
    return test_summary();
}
