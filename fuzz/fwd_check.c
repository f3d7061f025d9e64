/*
 * fwd_check.c -- runs one fuzzed forward call and judges it: valid status
 * with a message; supported and forward agree; a failing call (and
 * supported, always) leaves every arena byte as it was; a successful one
 * wrote every output element, nothing else, and matches the float64
 * reference (run on a copy of the arena) within the kit's dtype gates.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "kit.h"

/* Above this bound on |scale * q.k| the softmax amplifies fp32 rounding of
 * the scores past the gates (a conditioning limit, not an error bound):
 * beyond it only writes and finiteness are judged. */
#define FZ_WELL_CONDITIONED 500.0
/* The CUDA kernels' documented limit (docs/API.md, large logits): past
 * |logit| * log2 e of about 2^28 a row may come out non-finite; beyond half
 * of it only writes are judged on a CUDA run. */
#define FZ_CUDA_LOGIT_LIMIT 0x1p27

static void setting(fc_context *ctx, fc_status st, const char *what, int valid)
{
    fz_check_status(ctx, st, what);
    if ((st == FC_OK) != valid) fz_fail("context", "%s returned %s", what, fc_status_string(st));
}

fc_context *fz_make_context(const fz_call *c)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) fz_fail("context", "fc_context_create failed");
    setting(ctx, fc_context_set_num_threads(ctx, c->threads), "fc_context_set_num_threads",
            c->threads >= 0 && c->threads <= 4096);
    setting(ctx, fc_context_set_cuda_path(ctx, c->cuda_path), "fc_context_set_cuda_path",
            c->cuda_path == 0 || c->cuda_path == 80 || c->cuda_path == 90);
    setting(ctx, fc_context_set_device(ctx, c->device), "fc_context_set_device", c->device >= -1);
    if (c->tuned) fz_check_status(ctx, fc_context_set_tuning(ctx, &c->tun), "fc_context_set_tuning");
    return ctx;
}

double fz_max_abs(const fz_call *c, const fc_tensor *t, int *nonfinite)
{
    int64_t *offs, n = fz_tensor_offsets(t, &offs);
    const void *base = c->ar.copy + ((const uint8_t *)t->data - c->ar.base);
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs(fz_load(base, t->dtype, offs[i]));
        if (isfinite(x) && x > m) m = x;
        if (!isfinite(x) && nonfinite) *nonfinite = 1;
    }
    free(offs);
    return m;
}

double fz_abs_scale(const fz_call *c)
{
    const int64_t d = c->a.q.shape[c->a.q.ndim - 1];
    return c->a.scale != 0.0f ? fabs((double)c->a.scale) : 1.0 / sqrt((double)d);
}

double fz_logit_bound(const fz_call *c)
{
    const int64_t d = c->a.q.shape[c->a.q.ndim - 1];
    /* a descale on q or k scales the logits too */
    const double ds = c->off[FB_DESC] >= 0 && c->desc_which < 2 && fabs(c->desc_value) > 1 ? fabs(c->desc_value) : 1;
    return ds * fz_abs_scale(c) * (double)d * fz_max_abs(c, &c->a.q, NULL) * fz_max_abs(c, &c->a.k, NULL);
}

/* Logical rows of out ([b, s] or [t]) and whether sequence data owns row r. */
static int row_owned(const fz_call *c, int64_t r) { return !c->varlen || r < c->total_owned[0]; }

int64_t fz_elem_offset(const fc_tensor *t, int varlen, int64_t r, int64_t h, int64_t d)
{
    if (varlen) return r * t->stride[0] + h * t->stride[1] + d;
    return (r / t->shape[1]) * t->stride[0] + (r % t->shape[1]) * t->stride[1] + h * t->stride[2] + d;
}

typedef struct judge {
    const fz_call *c;
    const uint8_t *ref; /* the reference run's arena */
    int well;           /* every element within the gates                      */
    int out_finite;     /* out non-finite where the reference is finite: a bug */
    int lse_finite;     /* the same for lse                                     */
    kit_gate g;
    kit_metrics m;
    int64_t bad;
} judge;

/* One output element: x from the call, y from the reference. */
static void judge_out(judge *j, int64_t idx, int owned, double *err2, double *ref2)
{
    const fc_tensor *t = &j->c->a.out;
    const void *ref = j->ref + ((const uint8_t *)t->data - j->c->ar.base);
    const size_t es = fz_dtype_size(t->dtype);
    if (!owned) {
        if (memcmp((const uint8_t *)t->data + idx * (int64_t)es, (const uint8_t *)ref + idx * (int64_t)es, es))
            fz_fail("unowned-row", "out element %lld (a token no sequence owns) differs from the reference's",
                    (long long)idx);
        return;
    }
    j->m.n++;
    if (fz_is_poison(ref, t->dtype, idx)) fz_fail("reference", "the reference left out element %lld unwritten", (long long)idx);
    if (fz_is_poison(t->data, t->dtype, idx)) { j->m.unwritten++; return; }
    const double x = fz_load(t->data, t->dtype, idx), y = fz_load(ref, t->dtype, idx);
    if (!isfinite(y)) return;
    if (!isfinite(x)) { j->m.nonfinite += j->out_finite; return; }
    if (!j->well) return;
    const double e = fabs(x - y);
    if (e > j->m.max_abs) j->m.max_abs = e;
    *err2 += e * e;
    *ref2 += y * y;
    if (e > j->g.atol + j->g.rtol * fabs(y)) j->bad++;
}

static void judge_outputs(judge *j)
{
    const fz_call *c = j->c;
    const fc_tensor *t = &c->a.out;
    const int64_t rows = c->varlen ? t->shape[0] : t->shape[0] * t->shape[1];
    const int64_t heads = t->shape[t->ndim - 2], dim = t->shape[t->ndim - 1];
    double err2 = 0, ref2 = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t d = 0; d < dim; d++)
                judge_out(j, fz_elem_offset(t, c->varlen, r, h, d), row_owned(c, r), &err2, &ref2);
    j->m.rel_l2 = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    j->m.pct_bad = j->m.n ? 100.0 * (double)j->bad / (double)j->m.n : 0.0;
}

/* lse: dense [b, h, s], varlen [h, t]; -inf exactly where the reference has it. */
static void judge_lse(judge *j)
{
    const fz_call *c = j->c;
    const fc_tensor *t = &c->a.lse;
    if (!t->data) return;
    const float *ref = (const float *)(j->ref + ((const uint8_t *)t->data - c->ar.base));
    const int64_t outer = c->varlen ? 1 : t->shape[0], heads = t->shape[t->ndim - 2], rows = t->shape[t->ndim - 1];
    for (int64_t b = 0; b < outer; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t r = 0; r < rows; r++) {
                const int64_t idx = (c->varlen ? 0 : b * t->stride[0]) + h * t->stride[t->ndim - 2] + r;
                if (!row_owned(c, r)) {
                    if (memcmp((const float *)t->data + idx, ref + idx, 4))
                        fz_fail("unowned-row", "lse element %lld (a token no sequence owns) differs from the "
                                "reference's", (long long)idx);
                    continue;
                }
                if (fz_is_poison(t->data, FC_DTYPE_F32, idx)) { j->m.lse_bad++; continue; }
                const double x = fz_load(t->data, FC_DTYPE_F32, idx), y = fz_load(ref, FC_DTYPE_F32, idx);
                if (isinf(y) && y < 0) { if (!(isinf(x) && x < 0)) j->m.lse_bad++; continue; }
                if (!isfinite(y) || !j->lse_finite) continue;
                const double e = fabs(x - y);
                if (!isfinite(x) || (j->well && !(e <= j->g.lse_atol + j->g.lse_rtol * fabs(y)))) j->m.lse_bad++;
                if (e > j->m.lse_max_abs || e != e) j->m.lse_max_abs = e;
            }
}

void *fz_rebase(const fz_call *c, const fz_arena *r, const void *p)
{
    return p ? r->base + ((const uint8_t *)p - c->ar.base) : NULL;
}

/* c's forward arguments with every pointer moved into r. */
static fc_attention_args rebased_args(const fz_call *c, const fz_arena *r)
{
    fc_attention_args a = c->a;
    void **ptrs[] = {&a.q.data, &a.k.data, &a.v.data, &a.out.data, &a.lse.data};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) *ptrs[i] = fz_rebase(c, r, *ptrs[i]);
    a.cu_seqlens_q = fz_rebase(c, r, a.cu_seqlens_q);
    a.cu_seqlens_k = fz_rebase(c, r, a.cu_seqlens_k);
    a.block_table = fz_rebase(c, r, a.block_table);
    a.seqused_k = fz_rebase(c, r, a.seqused_k);
    return a;
}

fc_status fz_reference_forward(const fz_call *c, const uint8_t *from, fz_arena *r, char *why, size_t why_len)
{
    if (fz_arena_init(r, c->ar.size, 0)) fz_fail("harness", "cannot allocate the reference arena");
    memcpy(r->base, from, c->ar.size);
    fc_attention_args a = rebased_args(c, r);
    a.backend = FC_BACKEND_CPU_REFERENCE;
    fc_context *ctx;
    if (fc_context_create(&ctx) != FC_OK) fz_fail("harness", "fc_context_create failed");
    const fc_status st = fc_attention_forward(ctx, &a, NULL, NULL);
    fz_check_status(ctx, st, "fc_attention_forward (reference)");
    snprintf(why, why_len, "%s", fc_last_error(ctx));
    fc_context_free(ctx);
    return st;
}

/* The same call on CPU_REFERENCE, in a copy of the pristine arena. */
static void run_reference(const fz_call *c, fz_arena *r)
{
    char why[FC_FUZZ_MSG];
    const fc_status st = fz_reference_forward(c, c->ar.copy, r, why, sizeof why);
    if (st != FC_OK)
        fz_fail("reference-fails", "the reference returns %s where the call succeeded: %s", fc_status_string(st),
                why);
}

/* What can be asked of a successful call: the gates where the inputs are
 * finite and well conditioned; on CUDA, finiteness only below the logit
 * limit, and not of out where v holds a NaN or Inf (docs/API.md: a masked
 * key's 0 x Inf in the block product). */
int fz_past_cuda_logit_limit(const fz_call *c, double bound)
{
    const double logit = c->a.softcap > 0.0f && c->a.softcap < bound ? c->a.softcap : bound;
    return logit * 1.4426950408889634 > FZ_CUDA_LOGIT_LIMIT;
}

static void judge_init(judge *j, const fz_call *c, const fc_kernel_info *info)
{
    const double bound = fz_logit_bound(c);
    const int cuda = info->backend == FC_BACKEND_CUDA;
    const int limit = cuda && fz_past_cuda_logit_limit(c, bound);
    j->c = c;
    j->well = !c->special && bound <= FZ_WELL_CONDITIONED;
    j->out_finite = !limit && !(cuda && c->special);
    j->lse_finite = !limit;
    j->g = kit_gate_for(c->a.out.dtype); /* (FP8 inputs: the out dtype's) */
}

/* kit_gate_pass, with rel_l2 judged only over FZ_L2_MIN_ELEMS or more. */
static int gates_hold(const judge *j)
{
    kit_metrics m = j->m;
    if (m.n < FZ_L2_MIN_ELEMS) m.rel_l2 = 0;
    return kit_gate_pass(&m, &j->g);
}

static void judge_success(const fz_call *c, const fc_kernel_info *info)
{
    fz_arena r;
    run_reference(c, &r);
    judge j = {0};
    judge_init(&j, c, info);
    j.ref = r.base;
    judge_outputs(&j);
    judge_lse(&j);
    fz_paged_cross_check(c, &r);
    const int pass = j.well ? gates_hold(&j)
                            : j.m.unwritten == 0 && j.m.nonfinite == 0 && j.m.lse_bad == 0;
    fz_stats_of[FZ_FORWARD].gated += (uint64_t)j.well;
    fz_stats_of[FZ_FORWARD].loose += (uint64_t)!j.well;
    if (!pass)
        fz_fail(j.m.unwritten ? "unwritten" : j.m.nonfinite ? "nonfinite" : "accuracy",
                "FC_OK but vs the reference (%s gates%s): %lld elements, unwritten %lld, non-finite %lld, "
                "max_abs %.3g, rel_l2 %.3g, bad %.3g%%, lse bad %lld (max_abs %.3g); kernel %s",
                kit_dtype_name(c->a.q.dtype), j.well ? "" : "; ill-conditioned: writes and finiteness only",
                (long long)j.m.n, (long long)j.m.unwritten, (long long)j.m.nonfinite, j.m.max_abs, j.m.rel_l2,
                j.m.pct_bad, (long long)j.m.lse_bad, j.m.lse_max_abs, info->name);
    fz_arena_free(&r);
}

void fz_after_supported(fc_context *ctx, const fz_call *c, fc_status sup, const char *what)
{
    fz_device_sync(what);
    fz_check_status(ctx, sup, what);
    const int64_t at = fz_arena_changed(&c->ar, 0);
    if (at >= 0) fz_fail("supported-wrote", "%s changed arena byte %lld", what, (long long)at);
}

void fz_after_call(fc_context *ctx, const fz_call *c, int kind, fc_status sup, fc_status st, const char *what)
{
    fz_device_sync(what);
    fz_check_status(ctx, st, what);
    fz_stats_of[kind].status[st]++;
    if (st != sup && !(sup == FC_OK && st == FC_ERR_OUT_OF_MEMORY))
        fz_fail("disagree", "supported says %s, %s %s (%s)", fc_status_string(sup), what, fc_status_string(st),
                fc_last_error(ctx));
    const int64_t at = fz_arena_changed(&c->ar, st == FC_OK);
    if (at >= 0)
        fz_fail(st == FC_OK ? "wrote-outside" : "failed-call-wrote", "%s (%s: %s) changed arena byte %lld", what,
                fc_status_string(st), st ? fc_last_error(ctx) : "", (long long)at);
}

static fc_status twin_supported(fc_context *ctx, const fz_call *c, const fc_attention_args *twin)
{
    (void)c;
    return fc_attention_supported(ctx, twin, NULL);
}

void fz_fwd_check(fz_call *c)
{
    fc_context *ctx = fz_make_context(c);
    const fc_attention_args *args = c->args_null ? NULL : &c->a;
    fc_kernel_info info;
    fz_arena_snapshot(&c->ar);
    const fc_status sup = fc_attention_supported(ctx, args, &info);
    fz_after_supported(ctx, c, sup, "fc_attention_supported");
    const fc_status fwd = fc_attention_forward(ctx, args, NULL, &info);
    if (fwd == FC_OK || sup == FC_OK) snprintf(c->kernel, sizeof c->kernel, "%s", info.name);
    fz_after_call(ctx, c, FZ_FORWARD, sup, fwd, "fc_attention_forward");
    fz_check_expected(ctx, c, fwd, twin_supported);
    fc_context_free(ctx);
    if (fwd != FC_OK) return;
    fz_note_kernel(FZ_FORWARD, info.name);
    judge_success(c, &info);
}
