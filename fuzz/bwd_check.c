/*
 * bwd_check.c -- runs one fuzzed backward call and judges it: valid status
 * with a message; supported and backward agree; a caller workspace smaller
 * than the reported need is refused; a failing call (and supported, always)
 * leaves every arena byte as it was; a successful one wrote every dq, dk, dv
 * element, nothing else (varlen tokens past the last offset included),
 * matches the fp64 reference backward (run on a host copy of the arena)
 * within the kit's backward gates, and, where determinism is promised, gives
 * the same bytes when run again.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "kit.h"

/* Gated where the logits are at most this large (the bound is loose: real
 * logits are far smaller): the CPU backward holds its gates at logits ~1e4
 * (docs/API.md), a CUDA kernel as the forward's conditioning allows. */
#define FZ_BWD_WELL_CPU 1e4
#define FZ_BWD_WELL_CUDA 500.0

static fc_attention_backward_args bwd_args(const fz_call *c)
{
    fc_attention_backward_args b;
    fc_attention_backward_args_init(&b);
    b.fwd = c->a;
    b.dout = c->grad[0];
    b.dq = c->grad[1];
    b.dk = c->grad[2];
    b.dv = c->grad[3];
    b.deterministic = c->deterministic;
    b.workspace = c->off[FB_WS] >= 0 ? c->ar.base + c->off[FB_WS] : NULL;
    b.workspace_bytes = c->ws_bytes;
    return b;
}

/* How run_reference changes the inputs first: not at all; out's elements
 * set to 0 (D = 0); or (FZ_REF_NUDGE_K + m) k's rows each scaled by 1 +
 * 2^-21 or 1 - 2^-21 by bit m of their token index, which moves every
 * logit by some 8 units of fp32 rounding, any two keys the opposite ways
 * for some m. */
enum { FZ_REF_PLAIN, FZ_REF_ZERO_OUT, FZ_REF_NUDGE_K };

static void nudge_k(const fz_call *c, const fc_tensor *k, int bit)
{
    const int64_t rows = c->varlen ? k->shape[0] : k->shape[0] * k->shape[1];
    const int64_t heads = k->shape[k->ndim - 2], dim = k->shape[k->ndim - 1];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t d = 0; d < dim; d++) {
                const int64_t at = fz_elem_offset(k, c->varlen, r, h, d);
                const double x = fz_load(k->data, FC_DTYPE_F32, at);
                fz_store(k->data, FC_DTYPE_F32, at, (float)(x * ((r >> bit) & 1 ? 1.0 + 0x1p-21 : 1.0 - 0x1p-21)));
            }
}

/* The same call on CPU_REFERENCE (no workspace), in a host copy of the
 * pristine arena, its inputs changed as `how` says. */
static void run_reference(const fz_call *c, fz_arena *r, int how)
{
    if (fz_arena_init(r, c->ar.size, 0)) fz_fail("harness", "cannot allocate the reference arena");
    memcpy(r->base, c->ar.copy, c->ar.size);
    fc_attention_backward_args b = bwd_args(c);
    fc_tensor *t[] = {&b.fwd.q, &b.fwd.k, &b.fwd.v, &b.fwd.out, &b.fwd.lse, &b.dout, &b.dq, &b.dk, &b.dv};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) t[i]->data = fz_rebase(c, r, t[i]->data);
    b.fwd.cu_seqlens_q = fz_rebase(c, r, b.fwd.cu_seqlens_q);
    b.fwd.cu_seqlens_k = fz_rebase(c, r, b.fwd.cu_seqlens_k);
    b.fwd.block_table = fz_rebase(c, r, b.fwd.block_table);
    b.fwd.seqused_k = fz_rebase(c, r, b.fwd.seqused_k);
    b.fwd.backend = FC_BACKEND_CPU_REFERENCE;
    b.workspace = NULL;
    b.workspace_bytes = 0;
    if (how == FZ_REF_ZERO_OUT) {
        int64_t *offs, n = fz_tensor_offsets(&b.fwd.out, &offs);
        for (int64_t i = 0; i < n; i++) fz_store(b.fwd.out.data, b.fwd.out.dtype, offs[i], 0.0f);
        free(offs);
    } else if (how >= FZ_REF_NUDGE_K) {
        nudge_k(c, &b.fwd.k, how - FZ_REF_NUDGE_K);
    }
    fc_context *ctx;
    if (fc_context_create(&ctx) != FC_OK) fz_fail("harness", "fc_context_create failed");
    const fc_status st = fc_attention_backward(ctx, &b, NULL, NULL);
    fz_check_status(ctx, st, "fc_attention_backward (reference)");
    if (st != FC_OK)
        fz_fail("reference-fails", "the reference backward returns %s where the call succeeded: %s",
                fc_status_string(st), fc_last_error(ctx));
    fc_context_free(ctx);
}

/* Calls f(j, i, offset, owned) for every logical element of gradient i
 * (0 dq, 1 dk, 2 dv); owned: not a varlen token past the last offset. */
typedef struct bjudge bjudge;
static void each_elem(bjudge *j, int i, void (*f)(bjudge *, int, int64_t, int));

struct bjudge {
    const fz_call *c;
    const uint8_t *ref;  /* the reference run's arena                        */
    const uint8_t *alt;  /* another reference's (score_sensitive)             */
    int64_t moved;       /* its elements out of the gate's tolerance of ref's */
    int well;            /* every element within the gates                    */
    int finite;          /* non-finite where the reference is finite: a bug   */
    double dtype_max;    /* a reference within 2x of it may round either way  */
    double dtype_tiny;   /* the smallest normal number of the dtype           */
    double err2[3], ref2[3];
    int64_t bad[3];
    kit_bwd_gate g;
    kit_bwd_metrics m[3];
};

static void each_elem(bjudge *j, int i, void (*f)(bjudge *, int, int64_t, int))
{
    const fz_call *c = j->c;
    const fc_tensor *t = &c->grad[1 + i];
    const int side = i == 0 ? 0 : 1; /* q's tokens or k's */
    const int64_t rows = c->varlen ? t->shape[0] : t->shape[0] * t->shape[1];
    const int64_t heads = t->shape[t->ndim - 2], dim = t->shape[t->ndim - 1];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t d = 0; d < dim; d++)
                f(j, i, fz_elem_offset(t, c->varlen, r, h, d), !c->varlen || r < c->total_owned[side]);
}

/* The scale of gradient i: its largest finite reference element. */
static void find_ref_max(bjudge *j, int i, int64_t idx, int owned)
{
    const fc_tensor *t = &j->c->grad[1 + i];
    const double y = fz_load(j->ref + ((const uint8_t *)t->data - j->c->ar.base), t->dtype, idx);
    if (owned && isfinite(y) && fabs(y) > j->m[i].ref_max) j->m[i].ref_max = fabs(y);
}

/* The gate's tolerance of an element of gradient i whose reference is y. */
static double tolerance(const bjudge *j, int i, double y)
{
    const double t = j->g.atol + j->g.atol_rel * j->m[i].ref_max + j->g.rtol * fabs(y);
    /* A gradient whose every reference element is subnormal holds no
     * relative precision in the dtype: below its smallest normal number
     * every error passes. (At a saturated softcap 1 - tanh^2 is ~1e-43 in
     * double and 0 in fp32, as PyTorch's f32 tanh backward also gives:
     * fuzz/corpus/bwd-saturated-softcap.bin.) */
    return j->m[i].ref_max < j->dtype_tiny && t < j->dtype_tiny ? j->dtype_tiny : t;
}

/* One gradient element: x from the call, y from the reference. */
static void judge_elem(bjudge *j, int i, int64_t idx, int owned)
{
    const fc_tensor *t = &j->c->grad[1 + i];
    const void *ref = j->ref + ((const uint8_t *)t->data - j->c->ar.base);
    kit_bwd_metrics *m = &j->m[i];
    if (!owned) { /* a varlen token past the last offset: not written */
        if (!fz_is_poison(t->data, t->dtype, idx)) m->stray++;
        return;
    }
    m->n++;
    if (fz_is_poison(ref, t->dtype, idx))
        fz_fail("reference", "the reference left %s element %lld unwritten", kit_grad_name(i), (long long)idx);
    if (fz_is_poison(t->data, t->dtype, idx)) { m->unwritten++; return; }
    const double x = fz_load(t->data, t->dtype, idx), y = fz_load(ref, t->dtype, idx);
    if (!isfinite(y)) return;
    if (!isfinite(x)) { m->nonfinite += j->finite && fabs(y) < j->dtype_max / 2; return; }
    if (!j->well) return;
    const double e = fabs(x - y);
    if (e > m->max_abs) m->max_abs = e;
    j->err2[i] += e * e;
    j->ref2[i] += y * y;
    if (e > tolerance(j, i, y)) j->bad[i]++;
}

/* The backward holds dP = dout.v, D = dout.out and the gradients' sums in
 * fp32. Finite inputs can overflow them (bf16 holds 3e38, and dout may lie
 * over lse's bytes): then, as for the forward's large q.k (docs/API.md), the
 * result is undefined. 1 where a bound on those sums stays far below 3e38;
 * *nonfinite: an input holds a NaN or Inf. */
static int fp32_tame(const fz_call *c, int *nonfinite)
{
    const fc_attention_args *a = &c->a;
    const int nd = 4 - c->varlen;
    const double d = (double)c->shape[0][nd - 1], heads = (double)c->shape[0][nd - 2];
    const double rows = (double)(c->varlen ? c->shape[0][0] + c->shape[1][0] : c->shape[0][1] + c->shape[1][1]);
    const double qk = fmax(1.0, fmax(fz_max_abs(c, &a->q, nonfinite), fz_max_abs(c, &a->k, nonfinite)));
    const double vo = fmax(fz_max_abs(c, &a->v, nonfinite), fz_max_abs(c, &a->out, nonfinite));
    const double dp = d * fz_max_abs(c, &c->grad[0], nonfinite) * vo;
    return dp * rows * heads * fmax(1.0, fz_abs_scale(c)) * qk < 1e30;
}

/* What can be asked of a successful call: the gates where out and lse are
 * the forward's, the inputs finite and their logits and sums not too large;
 * finiteness where out and lse are the forward's and the sums tame (on
 * CUDA, as in the forward: not past the logit limit, nor with a NaN/Inf
 * input); writes always. */
static void judge_init(bjudge *j, const fz_call *c, const fc_kernel_info *info)
{
    const int cuda = info->backend == FC_BACKEND_CUDA;
    const double bound = fz_logit_bound(c);
    int nonfinite = c->special;
    const int tame = fp32_tame(c, &nonfinite);
    memset(j, 0, sizeof *j);
    j->c = c;
    j->well = c->fwd_real && tame && !nonfinite && bound <= (cuda ? FZ_BWD_WELL_CUDA : FZ_BWD_WELL_CPU);
    j->finite = c->fwd_real && tame && !(cuda && (nonfinite || fz_past_cuda_logit_limit(c, bound)));
    j->dtype_max = c->dtype == FC_DTYPE_F16 ? 65504.0 : 3.3895313892515355e38;
    j->dtype_tiny = c->dtype == FC_DTYPE_F16 ? 0x1p-14 : 0x1p-126;
    j->g = kit_bwd_gate_for(c->dtype, cuda ? KIT_BWD_CUDA : KIT_BWD_CPU);
}

/* Bytes [lo, hi) of input buffer b in the arena. */
static void input_span(const fz_call *c, int b, int64_t *lo, int64_t *hi)
{
    const fc_tensor *t[FB_N] = {[FB_Q] = &c->a.q, [FB_K] = &c->a.k, [FB_V] = &c->a.v, [FB_O] = &c->a.out,
                                [FB_LSE] = &c->a.lse, [FB_DOUT] = &c->grad[0]};
    *lo = 0;
    *hi = 4 * (int64_t)(c->nseq + 1); /* cu_seqlens */
    if (t[b]) fz_footprint(t[b], lo, hi);
    *lo += c->off[b];
    *hi += c->off[b];
}

/* 1 if out's bytes meet another input's (dout over out, say): zeroing out
 * would change that input too. */
static int out_shares_bytes(const fz_call *c)
{
    static const int others[] = {FB_Q, FB_K, FB_V, FB_LSE, FB_CUQ, FB_CUK, FB_DOUT};
    int64_t lo, hi, olo, ohi;
    input_span(c, FB_O, &olo, &ohi);
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        if (c->off[others[i]] < 0) continue;
        input_span(c, others[i], &lo, &hi);
        if (lo < ohi && olo < hi) return 1;
    }
    return 0;
}

/* dq and dk are sums of dS = P (dP - D). Where P is nearly one-hot, or
 * every key alike, dP - D cancels: the gradient is the rounding of out and
 * the fp32 error of dP and D (about 6e-8 sqrt(head_dim) of the terms),
 * which the CPU gate's 1e-5 of the largest reference element cannot hold.
 * Measured against the same reference with D = 0 (out zeroed): gated only
 * where the gradient keeps at least 0.0125 sqrt(head_dim) of it (twice
 * that error over 1e-5), and never less than 5%. */
static double cancel_floor(const fz_call *c)
{
    const double f = 0.0125 * sqrt((double)c->shape[0][3 - c->varlen]);
    return f > 0.05 ? f : 0.05;
}

static int cancels(const bjudge *j)
{
    if (out_shares_bytes(j->c)) return 1;
    fz_arena r0;
    run_reference(j->c, &r0, FZ_REF_ZERO_OUT);
    bjudge k = *j;
    k.ref = r0.base;
    memset(k.m, 0, sizeof k.m);
    each_elem(&k, 0, find_ref_max);
    each_elem(&k, 1, find_ref_max);
    fz_arena_free(&r0);
    const double f = cancel_floor(j->c);
    return j->m[0].ref_max < f * k.m[0].ref_max || j->m[1].ref_max < f * k.m[1].ref_max;
}

/* An element of gradient i that the nudged reference (j->alt) moves by
 * more than its tolerance. */
static void judge_moved(bjudge *j, int i, int64_t idx, int owned)
{
    const fc_tensor *t = &j->c->grad[1 + i];
    const int64_t at = (const uint8_t *)t->data - j->c->ar.base;
    if (!owned) return;
    const double y = fz_load(j->ref + at, t->dtype, idx), z = fz_load(j->alt + at, t->dtype, idx);
    if (isfinite(y) && isfinite(z) && fabs(z - y) > tolerance(j, i, y)) j->moved++;
}

/* fp32 scores carry rounding of some 2^-24 |logit| (a fused sum, the
 * scale, 2^x), which P = 2^(S - lse) makes a relative error of every dS_j;
 * where dq or dk is a small difference of large terms (a lone query
 * weighing two keys), that error is a large share of it. PyTorch's f32
 * SDPA backward, on random lone queries (1-39 keys, d 1-3, logits to
 * ~50): max_rel past 1e-4 in 14% of them, past 1e-5 in 22%, against fp64.
 * Measured on the reference itself: with every logit moved by some 8 units
 * of fp32 rounding (FZ_REF_NUDGE_K), an element of dq or dk that moves by
 * its tolerance cannot be held to it. f32 only (f16/bf16 hold no such
 * nudge; their gates allow units of their own rounding). */
static int score_sensitive(bjudge *j)
{
    const fz_call *c = j->c;
    if (c->dtype != FC_DTYPE_F32) return 0;
    const int64_t tokens = c->varlen ? c->a.k.shape[0] : c->a.k.shape[0] * c->a.k.shape[1];
    j->moved = 0;
    for (int bit = 0; (int64_t)1 << bit < tokens && !j->moved; bit++) {
        fz_arena r1;
        run_reference(c, &r1, FZ_REF_NUDGE_K + bit);
        j->alt = r1.base;
        each_elem(j, 0, judge_moved);
        each_elem(j, 1, judge_moved);
        fz_arena_free(&r1);
    }
    return j->moved > 0;
}

/* The gate of kit_bwd_gate_pass, of one gradient. Every element is judged
 * against its tolerance always; the aggregates where they mean what the
 * gate assumes: rel_l2 over enough elements, and neither where every
 * reference element is subnormal (one quantum of rounding there, 2^-24 in
 * f16, is no longer a relative error below one ulp). */
static int grad_passes(const bjudge *j, int i)
{
    const kit_bwd_metrics *m = &j->m[i];
    if (m->unwritten || m->nonfinite || m->stray) return 0;
    if (!j->well) return 1;
    if (!(m->pct_bad <= j->g.pct_bad)) return 0;
    if (m->ref_max < j->dtype_tiny) return 1;
    return m->max_rel <= j->g.max_rel && (m->n < FZ_L2_MIN_ELEMS || m->rel_l2 <= j->g.rel_l2);
}

/* Every element of the three gradients judged; 1 if all pass. */
static int judge_grads(bjudge *j)
{
    int pass = 1;
    for (int i = 0; i < 3; i++) {
        kit_bwd_metrics *m = &j->m[i];
        const double ref_max = m->ref_max;
        memset(m, 0, sizeof *m);
        m->ref_max = ref_max;
        j->err2[i] = j->ref2[i] = 0;
        j->bad[i] = 0;
        each_elem(j, i, judge_elem);
        m->max_rel = m->ref_max > 0 ? m->max_abs / m->ref_max : m->max_abs;
        m->rel_l2 = j->ref2[i] > 0 ? sqrt(j->err2[i] / j->ref2[i]) : sqrt(j->err2[i]);
        m->pct_bad = m->n ? 100.0 * (double)j->bad[i] / (double)m->n : 0.0;
        pass &= grad_passes(j, i);
    }
    return pass;
}

/* Judged by the gates; where they fail, asked whether they apply (the
 * conditioning checks, which need more reference runs, only then). */
static void judge_success(const fz_call *c, const fc_kernel_info *info)
{
    fz_arena r;
    run_reference(c, &r, FZ_REF_PLAIN);
    bjudge j;
    judge_init(&j, c, info);
    j.ref = r.base;
    for (int i = 0; i < 3; i++) each_elem(&j, i, find_ref_max);
    int pass = judge_grads(&j);
    if (!pass && j.well && (cancels(&j) || score_sensitive(&j))) {
        j.well = 0;
        pass = judge_grads(&j);
    }
    fz_stats_of[FZ_BACKWARD].gated += (uint64_t)j.well;
    fz_stats_of[FZ_BACKWARD].loose += (uint64_t)!j.well;
    if (!pass) {
        char buf[512];
        kit_bwd_describe(j.m, buf, sizeof buf);
        fz_fail("bwd-accuracy", "FC_OK but vs the reference (%s %s gates%s): %s; kernel %s", kit_dtype_name(c->dtype),
                info->backend == FC_BACKEND_CUDA ? "cuda" : "cpu",
                j.well ? "" : "; writes and finiteness only", buf, info->name);
    }
    fz_arena_free(&r);
}

/* A caller workspace the call accepts is at least what it reports needing. */
static void check_workspace(const fc_attention_backward_args *a, fc_status sup, const fc_kernel_info *info)
{
    if (!a || sup != FC_OK || !a->workspace) return;
    if (a->workspace_bytes < info->workspace_bytes)
        fz_fail("workspace", "supported accepts a workspace of %lld bytes but reports needing %lld",
                (long long)a->workspace_bytes, (long long)info->workspace_bytes);
}

/* Run again from the pristine arena: the same bytes everywhere but in the
 * workspace (scratch, whose contents nothing promises). */
static void check_deterministic(fc_context *ctx, fz_call *c, const fc_attention_backward_args *a)
{
    const size_t ws_lo = c->off[FB_WS] >= 0 ? (size_t)c->off[FB_WS] : c->ar.size;
    const size_t ws_hi = c->off[FB_WS] >= 0 ? ws_lo + (size_t)c->ws_alloc : c->ar.size;
    uint8_t *first = malloc(c->ar.size);
    if (!first) fz_fail("harness", "cannot allocate %zu bytes", c->ar.size);
    memcpy(first, c->ar.base, c->ar.size);
    memcpy(c->ar.base, c->ar.copy, c->ar.size);
    const fc_status st = fc_attention_backward(ctx, a, NULL, NULL);
    fz_device_sync("fc_attention_backward (run again)");
    fz_check_status(ctx, st, "fc_attention_backward (run again)");
    if (st != FC_OK) fz_fail("disagree", "run again, the backward returns %s", fc_status_string(st));
    for (size_t i = 0; i < c->ar.size; i++)
        if (c->ar.base[i] != first[i] && (i < ws_lo || i >= ws_hi))
            fz_fail("nondeterministic", "run again, arena byte %zu differs (deterministic=%d)", i,
                    (int)c->deterministic);
    free(first);
}

static fc_status twin_supported(fc_context *ctx, const fz_call *c, const fc_attention_args *twin)
{
    fc_attention_backward_args b = bwd_args(c);
    b.fwd = *twin;
    return fc_attention_backward_supported(ctx, &b, NULL);
}

void fz_bwd_check(fz_call *c)
{
    fc_context *ctx = fz_make_context(c);
    const fc_attention_backward_args args = bwd_args(c);
    const fc_attention_backward_args *pa = c->args_null ? NULL : &args;
    fc_kernel_info info;
    fz_arena_snapshot(&c->ar);
    const fc_status sup = fc_attention_backward_supported(ctx, pa, &info);
    fz_after_supported(ctx, c, sup, "fc_attention_backward_supported");
    check_workspace(pa, sup, &info);
    const fc_status st = fc_attention_backward(ctx, pa, NULL, &info);
    if (st == FC_OK || sup == FC_OK) snprintf(c->kernel, sizeof c->kernel, "%s", info.name);
    fz_after_call(ctx, c, FZ_BACKWARD, sup, st, "fc_attention_backward");
    fz_check_expected(ctx, c, st, twin_supported);
    if (st == FC_OK) {
        fz_note_kernel(FZ_BACKWARD, info.name);
        judge_success(c, &info);
        /* the CPU backends promise it whatever the flag says */
        if (c->deterministic == 1 || info.backend != FC_BACKEND_CUDA) check_deterministic(ctx, c, pa);
    }
    fc_context_free(ctx);
}
