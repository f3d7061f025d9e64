/*
 * merge.c -- fc_attention_merge: its checks (each tensor through
 * tensor_check.c, as the forward's; shapes agreeing; outputs aliasing no
 * input; every pointer where the backend runs), then the backend's merge
 * (src/cpu/merge.c, or src/cuda/merge.cu for device memory). Nothing is
 * written before every check has passed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memory_space.h"
#include "tensor_check.h"
#if defined(FC_HAVE_CUDA)
#include "cuda/merge.h"
#endif

static const char *const dims_out[] = {"batch", "seqlen_q", "heads", "head_dim"};
static const char *const dims_out_var[] = {"total_q", "heads", "head_dim"};
static const char *const dims_lse[] = {"batch", "heads", "seqlen_q"};
static const char *const dims_lse_var[] = {"heads", "total_q"};

void fc_attention_merge_args_init(fc_attention_merge_args *args)
{
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->backend = FC_BACKEND_AUTO;
}

static int out_dtype_ok(fc_dtype d) { return d == FC_DTYPE_F32 || d == FC_DTYPE_F16 || d == FC_DTYPE_BF16; }

/* An output-like tensor (a part's out, or out): dtype, then the checks of
 * every tensor; a part must have out's shape. */
static fc_status check_out_like(fc_context *ctx, const char *name, const fc_tensor *t, const fc_tensor *out,
                                int written)
{
    if (!out_dtype_ok(t->dtype))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s.dtype is %s: must be f32, f16 or bf16", name,
                            fc_dtype_name(t->dtype));
    const int varlen = out->ndim == 3;
    fc_status st = fc_check_tensor(ctx, name, t, out->ndim, varlen ? dims_out_var : dims_out, varlen ? 0 : -1,
                                   written);
    if (st == FC_OK && t != out && !fc_same_shape(t, out))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s.shape differs from out.shape", name);
    return st;
}

/* An lse tensor: f32, [batch, heads, seqlen_q] of out (varlen: [heads,
 * total_q]). */
static fc_status check_lse(fc_context *ctx, const char *name, const fc_tensor *t, const fc_tensor *out,
                           int written)
{
    if (t->dtype != FC_DTYPE_F32)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s.dtype is %s: must be f32", name,
                            fc_dtype_name(t->dtype));
    const int varlen = out->ndim == 3;
    fc_status st = fc_check_tensor(ctx, name, t, varlen ? 2 : 3, varlen ? dims_lse_var : dims_lse,
                                   varlen ? 1 : -1, written);
    if (st) return st;
    const int ok = varlen ? t->shape[0] == out->shape[1] && t->shape[1] == out->shape[0]
                          : t->shape[0] == out->shape[0] && t->shape[1] == out->shape[2] &&
                                t->shape[2] == out->shape[1];
    if (!ok)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            varlen ? "%s.shape must be [heads, total_q] of out" : "%s.shape must be [batch, "
                                                                                 "heads, seqlen_q] of out",
                            name);
    return FC_OK;
}

/* out and lse alias no part and not each other. */
static fc_status check_aliasing(fc_context *ctx, const fc_attention_merge_args *a)
{
    fc_span w[2] = {fc_span_of_tensor("out", &a->out), fc_span_of_tensor("lse", &a->lse)};
    const int nw = a->lse.data ? 2 : 1;
    if (nw == 2 && fc_spans_overlap(&w[0], &w[1]))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "lse overlaps out in memory: outputs must not alias "
                                                          "each other");
    for (int i = 0; i < a->num_parts; i++) {
        const fc_span r[2] = {fc_span_of_tensor("parts_out", &a->parts_out[i]),
                              fc_span_of_tensor("parts_lse", &a->parts_lse[i])};
        for (int o = 0; o < nw; o++)
            for (int k = 0; k < 2; k++)
                if (fc_spans_overlap(&w[o], &r[k]))
                    return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                        "%s overlaps %s[%d] in memory: outputs must not alias inputs", w[o].name,
                                        r[k].name, i);
    }
    return FC_OK;
}

static fc_status check_args(fc_context *ctx, const fc_attention_merge_args *a)
{
    if (!a) return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "args is NULL");
    if (a->num_parts < 1 || a->num_parts > FC_MAX_MERGE_PARTS)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "num_parts is %d: must be 1 to %d", (int)a->num_parts,
                            FC_MAX_MERGE_PARTS);
    if (!a->parts_out || !a->parts_lse)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s is NULL", a->parts_out ? "parts_lse" : "parts_out");
    if (a->out.ndim != 3 && a->out.ndim != 4)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "out.ndim is %d: expected 4 (or 3: variable length)",
                            (int)a->out.ndim);
    fc_status st = check_out_like(ctx, "out", &a->out, &a->out, 1);
    if (!st && a->lse.data) st = check_lse(ctx, "lse", &a->lse, &a->out, 1);
    for (int i = 0; i < a->num_parts && !st; i++) {
        char name[32];
        snprintf(name, sizeof name, "parts_out[%d]", i);
        st = check_out_like(ctx, name, &a->parts_out[i], &a->out, 0);
        snprintf(name, sizeof name, "parts_lse[%d]", i);
        if (!st) st = check_lse(ctx, name, &a->parts_lse[i], &a->out, 0);
    }
    return st ? st : check_aliasing(ctx, a);
}

/* Pointer k of a call: out, lse, then each part's out and lse. */
static const void *pointer(const fc_attention_merge_args *a, int k)
{
    if (k < 2) return k == 0 ? a->out.data : a->lse.data;
    return (k % 2 ? a->parts_lse : a->parts_out)[k / 2 - 1].data;
}

/* is_device[k] for each pointer k of the call (pointer()): device or
 * managed memory (all 0 without CUDA: cuda_stub.c). */
static void locate_pointers(const fc_attention_merge_args *a, unsigned char *is_device)
{
    const int n = 2 + 2 * a->num_parts;
    for (int at = 0; at < n; at += FC_MAX_CALL_POINTERS) {
        const void *ptr[FC_MAX_CALL_POINTERS];
        const int m = n - at < FC_MAX_CALL_POINTERS ? n - at : FC_MAX_CALL_POINTERS;
        for (int j = 0; j < m; j++) ptr[j] = pointer(a, at + j);
        fc_cuda_device_pointers(ptr, m, is_device + at);
    }
}

/* The pointer of the call that is not where the backend needs it (device
 * memory for cuda, host memory for the others), with its name; -1 if none. */
static int misplaced(const fc_attention_merge_args *a, const unsigned char *is_device, int want_device, char *name,
                     size_t len)
{
    for (int k = 0; k < 2 + 2 * a->num_parts; k++) {
        if (!pointer(a, k) || is_device[k] == want_device) continue;
        if (k < 2) snprintf(name, len, "%s", k ? "lse" : "out");
        else snprintf(name, len, "%s[%d]", k % 2 ? "parts_lse" : "parts_out", k / 2 - 1);
        return k;
    }
    return -1;
}

/* AUTO runs where out lives; the CPU backends need every pointer on the
 * host, the CUDA backend every one on the device. A cuda request whose out
 * is on the host is one that backend cannot run (FC_ERR_UNSUPPORTED); out
 * on the device with another pointer on the host is a mixed call, an
 * invalid argument (as the forward's). */
static fc_status pick_backend(fc_context *ctx, const fc_attention_merge_args *a, fc_backend *b)
{
#if !defined(FC_HAVE_CUDA)
    if (*b == FC_BACKEND_CUDA)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED, "fc_attention_merge: the cuda backend has no merge in this "
                                                     "build (configured without CUDA); merge host copies on the "
                                                     "cpu backend");
#endif
    unsigned char is_device[2 + 2 * FC_MAX_MERGE_PARTS];
    locate_pointers(a, is_device);
    if (*b == FC_BACKEND_AUTO) *b = is_device[0] ? FC_BACKEND_CUDA : FC_BACKEND_CPU;
    const int cuda = *b == FC_BACKEND_CUDA;
    char name[32];
    const int k = misplaced(a, is_device, cuda, name, sizeof name);
    if (k < 0) return FC_OK;
    return fc_set_error(ctx, cuda && k == 0 ? FC_ERR_UNSUPPORTED : FC_ERR_INVALID_ARGUMENT,
                        "%s is %s memory but the %s backend needs %s pointers", name, cuda ? "host" : "device",
                        cuda ? "cuda" : "cpu", cuda ? "device" : "host");
}

/* A checked tensor as rows [batch][seq][head] (variable length: no batch
 * stride): out-like [b, s, h, d] / [t, h, d], or lse [b, h, s] / [h, t]
 * (lse set; its data NULL: not written). */
static fc_merge_tensor rows_of(const fc_tensor *t, int lse)
{
    fc_merge_tensor r = {t->data, (int32_t)t->dtype, 0, 0, 0};
    const int varlen = t->ndim == (lse ? 2 : 3), b = varlen ? -1 : 0;
    if (!t->data) return r;
    if (b == 0) r.batch_stride = t->stride[0];
    r.row_stride = t->stride[lse ? b + 2 : b + 1];
    r.head_stride = t->stride[lse ? b + 1 : b + 2];
    return r;
}

/* The checked call on the CUDA backend: the context's device, queued on
 * stream. A build without CUDA never gets here (pick_backend refuses). */
static fc_status run_cuda(fc_context *ctx, const fc_merge_params *m, void *stream)
{
#if defined(FC_HAVE_CUDA)
    fc_cuda_device dev;
    fc_status st = fc_cuda_get_device(ctx->device, &dev, ctx->err, sizeof ctx->err);
    if (st) return st;
    return fc_cuda_merge(m, &dev, fc_cuda_pdl_on(&dev, &ctx->tuning), stream, ctx->err, sizeof ctx->err);
#else
    (void)m, (void)stream;
    return fc_set_error(ctx, FC_ERR_UNSUPPORTED, "fc_attention_merge: this build has no CUDA backend");
#endif
}

fc_status fc_attention_merge(fc_context *ctx, const fc_attention_merge_args *args, void *stream)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    fc_status st = check_args(ctx, args);
    fc_backend b = args ? args->backend : FC_BACKEND_AUTO;
    if (!st && b != FC_BACKEND_AUTO && b != FC_BACKEND_CPU && b != FC_BACKEND_CPU_REFERENCE && b != FC_BACKEND_CUDA)
        st = fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "backend %d is invalid", (int)b);
    if (!st) st = pick_backend(ctx, args, &b);
    if (st) return st;
    const int n = args->num_parts; /* 1 to FC_MAX_MERGE_PARTS: checked */
    fc_merge_tensor *parts = malloc(2 * (size_t)(unsigned)n * sizeof *parts);
    if (!parts) return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "merge: no memory for %d parts", n);
    for (int i = 0; i < n; i++) {
        parts[i] = rows_of(&args->parts_out[i], 0);
        parts[n + i] = rows_of(&args->parts_lse[i], 1);
    }
    const fc_tensor *o = &args->out;
    const int varlen = o->ndim == 3;
    fc_merge_params m = {n, parts, parts + n, rows_of(o, 0), rows_of(&args->lse, 1), varlen ? 1 : o->shape[0],
                         o->shape[varlen ? 0 : 1], o->shape[varlen ? 1 : 2], o->shape[varlen ? 2 : 3]};
    if (b == FC_BACKEND_CUDA) st = run_cuda(ctx, &m, stream);
    else st = fc_cpu_merge(&m, ctx->num_threads, fc_context_cpu_pool(ctx), ctx->err, sizeof ctx->err);
    free(parts);
    if (st == FC_OK) ctx->err[0] = 0;
    return st;
}
