/*
 * validate.c -- the argument checks that turn an fc_attention_args into a
 * trusted fc_fwd_params, and the cu_seqlens check. Every check runs before
 * anything is written; every failure leaves a message in the context naming
 * the argument and the limit.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tensor_check.h"
#include "validate.h"

static int dtype_known(int dt) { return dt >= FC_DTYPE_F32 && dt <= FC_DTYPE_F64; }

/* k and v in one allocation (an interleaved K/V cache) with no element in
 * common: the same strides, a whole number of elements apart, and the pair
 * non-overlapping as one tensor with a dimension of 2 (stride: that
 * distance). Anything else whose memory ranges meet is refused. */
static int kv_elements_disjoint(const fc_tensor *k, const fc_tensor *v)
{
    const int64_t es = fc_dtype_bytes(k->dtype);
    const int64_t gap = (int64_t)((uintptr_t)v->data - (uintptr_t)k->data) / (es > 0 ? es : 1);
    if (k->ndim != v->ndim || k->ndim > 4 || gap * es != (int64_t)((uintptr_t)v->data - (uintptr_t)k->data)) return 0;
    int64_t shape[5], stride[5];
    for (int i = 0; i < k->ndim; i++) {
        if (k->stride[i] != v->stride[i]) return 0;
        shape[i] = k->shape[i];
        stride[i] = k->stride[i];
    }
    shape[k->ndim] = 2;
    stride[k->ndim] = gap < 0 ? -gap : gap;
    return fc_dims_non_overlapping(k->ndim + 1, shape, stride);
}

/* Names of the dimensions, for messages ("q.shape[2] (heads_q) is 0"). */
static const char *const dims_q[] = {"batch", "seqlen_q", "heads_q", "head_dim"};
static const char *const dims_kv[] = {"batch", "seqlen_k", "heads_kv", "head_dim"};
static const char *const dims_q_var[] = {"total_q", "heads_q", "head_dim"};
static const char *const dims_kv_var[] = {"total_k", "heads_kv", "head_dim"};
static const char *const dims_pages[] = {"num_pages", "page_size", "heads_kv", "head_dim"};
static const char *const dims_lse[] = {"batch", "heads_q", "seqlen_q"};
static const char *const dims_lse_var[] = {"heads_q", "total_q"};
static const char *const dims_new[] = {"batch", "seqlen_new", "heads_kv", "head_dim"};
static const char *const dims_rotary[] = {"seqlen_ro", "rotary_dim / 2"};

static fc_status check_cu_seqlens(fc_context *ctx, const char *name, const int32_t *cu, int n,
                                  int64_t total, int32_t max_len)
{
    if (cu[0] != 0)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s[0] is %d: must be 0", name, cu[0]);
    for (int b = 0; b < n; b++) {
        int64_t len = (int64_t)cu[b + 1] - cu[b];
        if (len < 0)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s is not non-decreasing: %s[%d]=%d > %s[%d]=%d", name, name, b, cu[b],
                                name, b + 1, cu[b + 1]);
        if (len > max_len)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s: sequence %d has length %lld > max_seqlen %d", name, b,
                                (long long)len, max_len);
    }
    if (cu[n] > total)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "%s[%d]=%d exceeds the %lld tokens of the tensor", name, n, cu[n],
                            (long long)total);
    return FC_OK;
}

/* Batch, row and head strides of a q/k/v/out tensor; o = 1 for varlen. */
static void set_strides(const fc_tensor *t, int o, int64_t *batch, int64_t *row, int64_t *head)
{
    *batch = o ? 0 : t->stride[0];
    *row = t->stride[1 - o];
    *head = t->stride[2 - o];
}

/* The dtypes of q, k, v and out: all one of f32, f16, bf16, f64; or an FP8
 * call (flashcore.h, fc_attention_args: q, k, v one FP8 type and out f32,
 * f16 or bf16; or k, v FP8 under q and out of one f32/f16/bf16 type). */
static fc_status check_dtypes(fc_context *ctx, const fc_attention_args *a, int bwd)
{
    const fc_tensor *t[4] = {&a->q, &a->k, &a->v, &a->out};
    static const char *const tn[4] = {"q", "k", "v", "out"};
    for (int i = 0; i < 4; i++)
        if (!dtype_known(t[i]->dtype))
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s.dtype %d is not a valid fc_dtype", tn[i],
                                (int)t[i]->dtype);
    const int q = a->q.dtype, k = a->k.dtype, v = a->v.dtype, o = a->out.dtype;
    if (!fc_dtype_is_fp8(q) && !fc_dtype_is_fp8(k) && !fc_dtype_is_fp8(v)) {
        if (k != q || v != q || (o != q && !(!bwd && o == FC_DTYPE_F32 && fc_dtype_is_16bit(q))))
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "dtypes differ: q %s, k %s, v %s, out %s (all must be equal, but for an f32 out "
                                "of f16/bf16 inputs; FP8 k/v may sit under another q)", fc_dtype_name(q),
                                fc_dtype_name(k), fc_dtype_name(v), fc_dtype_name(o));
        return FC_OK;
    }
    if (bwd)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "FP8 inputs (q %s, k %s, v %s) are forward-only: the backward takes f32, f16 or bf16",
                            fc_dtype_name(q), fc_dtype_name(k), fc_dtype_name(v));
    if (k != v || !fc_dtype_is_fp8(k) || (fc_dtype_is_fp8(q) && q != k))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "FP8 dtypes q %s, k %s, v %s: k and v must be one FP8 type, and q either that type "
                            "or f32/f16/bf16 (an FP8 K/V cache)", fc_dtype_name(q), fc_dtype_name(k),
                            fc_dtype_name(v));
    if (o != FC_DTYPE_F32 && o != FC_DTYPE_F16 && o != FC_DTYPE_BF16)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "out.dtype is %s: an FP8 call writes f32, f16 or bf16",
                            fc_dtype_name(o));
    if (!fc_dtype_is_fp8(q) && o != q)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "q.dtype %s, out.dtype %s: under an FP8 K/V cache q and out must be one f32/f16/bf16 "
                            "type", fc_dtype_name(q), fc_dtype_name(o));
    return FC_OK;
}

/* q, k, v, out (and their dtypes), dense 4-d or varlen 3-d, and how their
 * shapes relate. bwd: out is the forward's output, read, not written. */
static fc_status check_tensors(fc_context *ctx, const fc_attention_args *a, int varlen, int bwd)
{
    fc_status st = check_dtypes(ctx, a, bwd);
    if (st) return st;

    const int nd = varlen ? 3 : 4;
    const int e0 = varlen ? 0 : -1; /* varlen token counts may be 0 */
    const char *const *dq = varlen ? dims_q_var : dims_q;
    const char *const *dkv = varlen ? dims_kv_var : a->block_table ? dims_pages : dims_kv;
    if ((st = fc_check_tensor(ctx, "q", &a->q, nd, dq, e0, 0))) return st;
    const int append = a->k_new.data != NULL; /* the cache is written */
    if ((st = fc_check_tensor(ctx, "k", &a->k, nd, dkv, e0, append))) return st;
    if ((st = fc_check_tensor(ctx, "v", &a->v, nd, dkv, e0, append))) return st;
    if ((st = fc_check_tensor(ctx, "out", &a->out, nd, dq, e0, !bwd))) return st;

    const int o = varlen ? 1 : 0; /* index shift: varlen tensors have no batch dim */
    const int64_t hq = a->q.shape[2 - o], hkv = a->k.shape[2 - o], d = a->q.shape[3 - o];
    if (!fc_same_shape(&a->q, &a->out))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "out.shape must equal q.shape");
    if (!fc_same_shape(&a->k, &a->v))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "v.shape must equal k.shape (a different value head dim is not supported)");
    if (a->k.shape[3 - o] != d)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "k head_dim %lld differs from q head_dim %lld",
                            (long long)a->k.shape[3 - o], (long long)d);
    if (!varlen && !a->block_table && a->k.shape[0] != a->q.shape[0])
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "k batch %lld differs from q batch %lld",
                            (long long)a->k.shape[0], (long long)a->q.shape[0]);
    if (hq % hkv != 0)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "heads_q %lld is not a multiple of heads_kv %lld (GQA/MQA need heads_q %% "
                            "heads_kv == 0)", (long long)hq, (long long)hkv);
    return FC_OK;
}

/* scale, softcap, causal, window. The scale and softcap ranges keep every
 * fp32 intermediate of every path finite and accurate: constants.h says why. */
static fc_status check_options(fc_context *ctx, const fc_attention_args *a)
{
    const float s = fabsf(a->scale);
    if (!(a->scale == 0.0f || (s >= FC_MIN_ABS_SCALE && s <= FC_MAX_ABS_SCALE)))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "scale %g is out of range: use 0 (1/sqrt(head_dim)) or a finite value with "
                            "%g <= |scale| <= %g", (double)a->scale, (double)FC_MIN_ABS_SCALE,
                            (double)FC_MAX_ABS_SCALE);
    if (!(a->softcap == 0.0f || (a->softcap >= FC_MIN_SOFTCAP && a->softcap <= FC_MAX_SOFTCAP)))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "softcap %g is out of range: use 0 (off) or a value in [%g, %g]",
                            (double)a->softcap, (double)FC_MIN_SOFTCAP, (double)FC_MAX_SOFTCAP);
    if (a->causal != 0 && a->causal != 1)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "causal is %d: use 0 or 1", (int)a->causal);
    if (a->window_left < -1 || a->window_right < -1)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "window (%d, %d) is invalid: each side is -1 (unbounded) or >= 0",
                            (int)a->window_left, (int)a->window_right);
    if (a->causal && a->window_right > 0)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "causal with window_right %d > 0 is contradictory: causal means window_right 0",
                            (int)a->window_right);
    return FC_OK;
}

/* lse: f32, [batch, heads_q, seqlen_q] or varlen [heads_q, total_q]; optional
 * output of the forward, required input of the backward. */
static fc_status check_lse(fc_context *ctx, const fc_attention_args *a, int varlen, int bwd)
{
    if (!a->lse.data && bwd)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "lse.data is NULL: the backward needs the forward's lse");
    if (!a->lse.data) return FC_OK;
    if (a->lse.dtype != FC_DTYPE_F32)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "lse.dtype is %s: must be f32",
                            fc_dtype_name(a->lse.dtype));
    /* varlen lse is [heads_q, total_q]: its dim 1 may be 0 */
    fc_status st = fc_check_tensor(ctx, "lse", &a->lse, varlen ? 2 : 3, varlen ? dims_lse_var : dims_lse,
                                varlen ? 1 : -1, !bwd);
    if (st) return st;
    const int64_t hq = a->q.shape[varlen ? 1 : 2];
    int ok = varlen ? (a->lse.shape[0] == hq && a->lse.shape[1] == a->q.shape[0])
                    : (a->lse.shape[0] == a->q.shape[0] && a->lse.shape[1] == hq &&
                       a->lse.shape[2] == a->q.shape[1]);
    if (!ok)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            varlen ? "lse.shape must be [heads_q, total_q]"
                                   : "lse.shape must be [batch, heads_q, seqlen_q]");
    return FC_OK;
}

/* The varlen scalars; the cu_seqlens contents are checked by fc_check_varlen
 * once they are host-readable. */
static fc_status check_varlen_args(fc_context *ctx, const fc_attention_args *a)
{
    if (a->num_seqs <= 0)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "num_seqs is %d: varlen needs >= 1 sequence",
                            (int)a->num_seqs);
    if (a->max_seqlen_q < 0 || a->max_seqlen_k < 0)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "max_seqlen_q/k must be >= 0 (got %d, %d)",
                            (int)a->max_seqlen_q, (int)a->max_seqlen_k);
    return FC_OK;
}

/* The paged-cache and seqused_k scalars; their contents are checked by
 * fc_check_paged once they are host-readable. */
static fc_status check_paged_args(fc_context *ctx, const fc_attention_args *a, int varlen, int bwd)
{
    if (!a->block_table && !a->seqused_k) return FC_OK;
    const char *what = a->block_table ? "block_table (a paged KV cache)" : "seqused_k";
    if (bwd)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "%s is forward-only: the backward takes dense or varlen k/v", what);
    if (varlen)
        return fc_set_error(ctx, a->block_table ? FC_ERR_UNSUPPORTED : FC_ERR_INVALID_ARGUMENT,
                            a->block_table ? "block_table with cu_seqlens (varlen q) is not supported: "
                                             "give q dense, [batch, seqlen_q, heads_q, head_dim]"
                                           : "seqused_k with cu_seqlens: cu_seqlens_k already gives the "
                                             "key counts");
    if (!a->block_table) return FC_OK;
    if (a->max_pages_per_seq < 1)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "max_pages_per_seq is %d: must be >= 1",
                            (int)a->max_pages_per_seq);
    if (a->block_table_stride < 0 || a->block_table_stride > INT32_MAX)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "block_table_stride %lld is out of range [0, %d]",
                            (long long)a->block_table_stride, INT32_MAX);
    if (a->block_table_stride != 0 && a->block_table_stride < a->max_pages_per_seq)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "block_table_stride %lld is less than max_pages_per_seq %d (0 means "
                            "max_pages_per_seq)", (long long)a->block_table_stride, (int)a->max_pages_per_seq);
    const int64_t keys = (int64_t)a->max_pages_per_seq * a->k.shape[1];
    if (keys > INT32_MAX)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "max_pages_per_seq %d x page_size %lld = %lld keys per sequence: the limit is %d",
                            (int)a->max_pages_per_seq, (long long)a->k.shape[1], (long long)keys, INT32_MAX);
    return FC_OK;
}

/* Entries of the block table the call may read: every row but the last in
 * full stride, the last row's max_pages_per_seq. */
static uint64_t block_table_entries(const fc_attention_args *a)
{
    const int64_t stride = a->block_table_stride ? a->block_table_stride : a->max_pages_per_seq;
    return (uint64_t)(a->q.shape[0] - 1) * (uint64_t)stride + (uint64_t)a->max_pages_per_seq;
}

/* Two tensors that go together (k_new and v_new, the rotary tables): q's
 * dtype, each valid, the same shape. */
static fc_status check_pair(fc_context *ctx, const fc_attention_args *a, const char *const names[2],
                            const fc_tensor *t[2], int ndim, const char *const *dims, int empty_dim)
{
    if ((int)t[0]->dtype != (int)a->q.dtype || (int)t[1]->dtype != (int)a->q.dtype)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s (%s) and %s (%s) must have q's dtype %s", names[0],
                            fc_dtype_name(t[0]->dtype), names[1], fc_dtype_name(t[1]->dtype),
                            fc_dtype_name(a->q.dtype));
    fc_status st;
    for (int i = 0; i < 2; i++)
        if ((st = fc_check_tensor(ctx, names[i], t[i], ndim, dims, empty_dim, 0))) return st;
    if (!fc_same_shape(t[0], t[1]))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s.shape must equal %s.shape", names[1], names[0]);
    return FC_OK;
}

/* k_new / v_new against q and the cache, the rotary tables against the
 * head dim. Their contents (positions within the cache and the tables)
 * are checked by fc_check_paged with seqused_k. */
static fc_status check_new_kv(fc_context *ctx, const fc_attention_args *a)
{
    static const char *const names[2] = {"k_new", "v_new"};
    const fc_tensor *t[2] = {&a->k_new, &a->v_new};
    fc_status st = check_pair(ctx, a, names, t, 4, dims_new, 1);
    if (st) return st;
    if (a->k_new.shape[0] != a->q.shape[0] || a->k_new.shape[2] != a->k.shape[2] ||
        a->k_new.shape[3] != a->q.shape[3])
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "k_new.shape is [%lld, %lld, %lld, %lld]: must be [batch %lld, seqlen_new, heads_kv %lld, "
                            "head_dim %lld]", (long long)a->k_new.shape[0], (long long)a->k_new.shape[1],
                            (long long)a->k_new.shape[2], (long long)a->k_new.shape[3], (long long)a->q.shape[0],
                            (long long)a->k.shape[2], (long long)a->q.shape[3]);
    const int64_t cap = a->k.shape[1] * (a->block_table ? a->max_pages_per_seq : 1);
    if (a->k_new.shape[1] > cap)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "k_new.shape[1] (seqlen_new) is %lld: the cache holds %lld keys%s",
                            (long long)a->k_new.shape[1], (long long)cap,
                            a->block_table ? " (max_pages_per_seq * page_size)" : " (seqlen_k)");
    return FC_OK;
}

static fc_status check_rotary(fc_context *ctx, const fc_attention_args *a)
{
    if (!a->rotary_cos.data || !a->rotary_sin.data)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "rotary_cos and rotary_sin go together: %s.data is NULL",
                            a->rotary_cos.data ? "rotary_sin" : "rotary_cos");
    static const char *const names[2] = {"rotary_cos", "rotary_sin"};
    const fc_tensor *t[2] = {&a->rotary_cos, &a->rotary_sin};
    fc_status st = check_pair(ctx, a, names, t, 2, dims_rotary, -1);
    if (st) return st;
    if (2 * a->rotary_cos.shape[1] > a->q.shape[3])
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "rotary_cos.shape[1] is %lld: rotary_dim %lld exceeds head_dim %lld",
                            (long long)a->rotary_cos.shape[1], 2 * (long long)a->rotary_cos.shape[1],
                            (long long)a->q.shape[3]);
    return FC_OK;
}

/* The append step's arguments (k_new, v_new, rotary): forward, dense q,
 * with seqused_k. */
static fc_status check_append_args(fc_context *ctx, const fc_attention_args *a, int varlen, int bwd)
{
    if (a->rotary_interleaved != 0 && a->rotary_interleaved != 1)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "rotary_interleaved is %d: use 0 or 1",
                            (int)a->rotary_interleaved);
    const int append = a->k_new.data || a->v_new.data, rotary = a->rotary_cos.data || a->rotary_sin.data;
    if (!append && !rotary) return FC_OK;
    if (bwd)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "k_new/v_new and rotary_cos/sin are forward-only (a decoding step's append)");
    if (varlen)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "k_new/v_new with cu_seqlens (varlen q) is not supported: give q dense and the "
                            "cache lengths in seqused_k");
    if (!a->k_new.data || !a->v_new.data)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s", !append ? "rotary_cos/sin rotate q and k_new: set "
                                                                           "k_new and v_new too"
                                                                         : "k_new and v_new go together: one is NULL");
    if (!a->seqused_k)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "k_new needs seqused_k: the cache lengths the new keys are written after");
    if (fc_dtype_is_fp8(a->k.dtype))
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "k_new/v_new into an FP8 cache (k %s) is not supported: quantising the new keys is "
                            "the caller's step", fc_dtype_name(a->k.dtype));
    fc_status st = check_new_kv(ctx, a);
    if (st) return st;
    return rotary ? check_rotary(ctx, a) : FC_OK;
}

/* The backward's dout (like out, read) and dq, dk, dv (like q, k, v, written). */
static fc_status check_grads(fc_context *ctx, const fc_attention_backward_args *b, int varlen)
{
    const fc_attention_args *a = &b->fwd;
    const fc_tensor *g[4] = {&b->dout, &b->dq, &b->dk, &b->dv};
    const fc_tensor *like[4] = {&a->out, &a->q, &a->k, &a->v};
    static const char *const gn[4] = {"dout", "dq", "dk", "dv"};
    static const char *const ln[4] = {"out", "q", "k", "v"};
    const int nd = varlen ? 3 : 4, e0 = varlen ? 0 : -1;
    /* dq, dk, dv: q's dtype, or all three f32 under f16/bf16 inputs (sums
     * a caller adds up, as context parallelism does) */
    const int gt = b->dq.dtype == FC_DTYPE_F32 && fc_dtype_is_16bit(a->q.dtype) ? FC_DTYPE_F32 : a->q.dtype;
    for (int i = 0; i < 4; i++) {
        const int want = i == 0 ? (int)a->q.dtype : gt;
        if ((int)g[i]->dtype != want)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s.dtype is %s, dq.dtype %s: dout takes q's dtype (%s), and dq, dk, dv all q's "
                                "or, under f16/bf16 inputs, all f32", gn[i], fc_dtype_name(g[i]->dtype),
                                fc_dtype_name(b->dq.dtype), fc_dtype_name(a->q.dtype));
        const char *const *dims = i == 2 || i == 3 ? (varlen ? dims_kv_var : dims_kv)
                                                   : (varlen ? dims_q_var : dims_q);
        fc_status st = fc_check_tensor(ctx, gn[i], g[i], nd, dims, e0, i > 0);
        if (st) return st;
        if (!fc_same_shape(g[i], like[i]))
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s.shape must equal %s.shape", gn[i], ln[i]);
    }
    if (b->deterministic != 0 && b->deterministic != 1)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "deterministic is %d: use 0 or 1",
                            (int)b->deterministic);
    if (b->workspace_bytes < 0 || (!b->workspace) != (b->workspace_bytes == 0))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "workspace %p with workspace_bytes %lld: give both (a buffer and its size > 0) "
                            "or neither", b->workspace, (long long)b->workspace_bytes);
    if ((uintptr_t)b->workspace % 256 != 0)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "workspace (%p) is not 256-byte aligned",
                            b->workspace);
    return FC_OK;
}

/* ---- FP8 ---------------------------------------------------------------------- */

/* Descale d's batch and head extent (fc_descale), as the element offset of
 * its last entry, or -1 when that overflows int64 in bytes. */
static int64_t descale_last(const fc_descale *d, int64_t batch, int64_t heads_kv)
{
    int64_t a, b, off;
    if (__builtin_mul_overflow(batch - 1, d->batch_stride, &a) || __builtin_mul_overflow(heads_kv - 1, d->head_stride, &b) ||
        __builtin_add_overflow(a, b, &off) || off > INT64_MAX / 4 - 1)
        return -1;
    return off;
}

/* Sequences of the call (varlen: num_seqs) and its KV heads: a descale's extent. */
static void descale_dims(const fc_attention_args *a, int varlen, int64_t *batch, int64_t *heads_kv)
{
    *batch = varlen ? a->num_seqs : a->q.shape[0];
    *heads_kv = a->k.shape[varlen ? 1 : 2];
}

/* The descales (only on FP8 tensors, strides >= 0, extents that fit) and
 * the amax outputs (FP8 calls, 4-byte aligned). Their overlaps are
 * check_pointers'. */
static fc_status check_fp8_args(fc_context *ctx, const fc_attention_args *a, int varlen)
{
    const fc_descale *d[3] = {&a->q_descale, &a->k_descale, &a->v_descale};
    const fc_tensor *t[3] = {&a->q, &a->k, &a->v};
    static const char *const tn[3] = {"q", "k", "v"};
    int64_t batch, hkv;
    descale_dims(a, varlen, &batch, &hkv);
    for (int i = 0; i < 3; i++) {
        if (!d[i]->data) continue;
        if (!fc_dtype_is_fp8(t[i]->dtype))
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s_descale is set but %s is %s: descales belong to FP8 tensors", tn[i], tn[i],
                                fc_dtype_name(t[i]->dtype));
        if (d[i]->batch_stride < 0 || d[i]->head_stride < 0)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s_descale strides (%lld, %lld): must be >= 0 (0 broadcasts one value)", tn[i],
                                (long long)d[i]->batch_stride, (long long)d[i]->head_stride);
        if (batch > 0 && descale_last(d[i], batch, hkv) < 0)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s_descale: strides (%lld, %lld) over [%lld, %lld] overflow 64-bit offsets", tn[i],
                                (long long)d[i]->batch_stride, (long long)d[i]->head_stride, (long long)batch,
                                (long long)hkv);
    }
    if (!a->out_amax && !a->p_amax) return FC_OK;
    if (!fc_dtype_is_fp8(a->k.dtype))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "out_amax/p_amax are set on a %s call: they are statistics of FP8 calls",
                            fc_dtype_name(a->q.dtype));
    if ((uintptr_t)a->out_amax % 4 != 0 || (uintptr_t)a->p_amax % 4 != 0)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s (%p) is not aligned to its 4-byte element",
                            (uintptr_t)a->out_amax % 4 ? "out_amax" : "p_amax",
                            (uintptr_t)a->out_amax % 4 ? (void *)a->out_amax : (void *)a->p_amax);
    return FC_OK;
}

/* ---- aliasing ------------------------------------------------------------------ */

/* Read spans at most: 7 tensors (q, k, v, k_new, v_new, rotary_cos/sin), 7
 * arrays (cu_seqlens x2, block_table, seqused_k, 3 descales) and the
 * backward's out, lse and dout. */
#define FC_MAX_SPANS 18
/* Write spans at most: out, lse, out_amax, p_amax, an appended-to k and v. */
#define FC_MAX_OUT_SPANS 6

/* Everything the call reads: the tensors (q, k and v unless appended to,
 * the appended keys and rotary tables), then from index *arrays the
 * int32/float arrays (varlen cu_seqlens of num_seqs + 1 entries, the block
 * table, seqused_k, the per-tensor descales where set). */
static int read_spans(const fc_attention_args *a, int varlen, fc_span in[FC_MAX_SPANS], int *arrays)
{
    int n = 0;
    in[n++] = fc_span_of_tensor("q", &a->q);
    if (!a->k_new.data) { /* else the cache is written: an output */
        in[n++] = fc_span_of_tensor("k", &a->k);
        in[n++] = fc_span_of_tensor("v", &a->v);
    }
    const fc_tensor *app[4] = {&a->k_new, &a->v_new, &a->rotary_cos, &a->rotary_sin};
    static const char *const an[4] = {"k_new", "v_new", "rotary_cos", "rotary_sin"};
    for (int i = 0; i < 4; i++)
        if (app[i]->data) in[n++] = fc_span_of_tensor(an[i], app[i]);
    *arrays = n;
    if (varlen) {
        const uint64_t bytes = ((uint64_t)a->num_seqs + 1) * sizeof(int32_t);
        in[n++] = fc_span_of_bytes("cu_seqlens_q", a->cu_seqlens_q, bytes);
        in[n++] = fc_span_of_bytes("cu_seqlens_k", a->cu_seqlens_k, bytes);
    }
    if (a->block_table)
        in[n++] = fc_span_of_bytes("block_table", a->block_table, block_table_entries(a) * sizeof(int32_t));
    if (a->seqused_k) in[n++] = fc_span_of_bytes("seqused_k", a->seqused_k, (uint64_t)a->q.shape[0] * sizeof(int32_t));
    const fc_descale *ds[3] = {&a->q_descale, &a->k_descale, &a->v_descale};
    static const char *const dn[3] = {"q_descale", "k_descale", "v_descale"};
    int64_t batch, hkv;
    descale_dims(a, varlen, &batch, &hkv);
    for (int i = 0; i < 3; i++)
        if (ds[i]->data && batch > 0) /* check_fp8_args: the extent fits */
            in[n++] = fc_span_of_bytes(dn[i], ds[i]->data, (uint64_t)(descale_last(ds[i], batch, hkv) + 1) * 4);
    return n;
}

/* What the call writes: the forward's out, lse and amax (when requested);
 * the backward's dq, dk, dv and the caller's workspace. The backward reads
 * out, lse and dout: they join the inputs. */
static int write_spans(const fc_attention_args *a, const fc_attention_backward_args *b, fc_span in[FC_MAX_SPANS],
                       int *ni, fc_span out[FC_MAX_OUT_SPANS])
{
    int no = 0;
    if (!b) {
        out[no++] = fc_span_of_tensor("out", &a->out);
        if (a->lse.data) out[no++] = fc_span_of_tensor("lse", &a->lse);
        if (a->out_amax) out[no++] = fc_span_of_bytes("out_amax", a->out_amax, sizeof(float));
        if (a->p_amax) out[no++] = fc_span_of_bytes("p_amax", a->p_amax, sizeof(float));
        if (a->k_new.data) { /* last: they may share an allocation (check_pointers) */
            out[no++] = fc_span_of_tensor("k", &a->k);
            out[no++] = fc_span_of_tensor("v", &a->v);
        }
        return no;
    }
    in[(*ni)++] = fc_span_of_tensor("out", &a->out);
    in[(*ni)++] = fc_span_of_tensor("lse", &a->lse);
    in[(*ni)++] = fc_span_of_tensor("dout", &b->dout);
    out[no++] = fc_span_of_tensor("dq", &b->dq);
    out[no++] = fc_span_of_tensor("dk", &b->dk);
    out[no++] = fc_span_of_tensor("dv", &b->dv);
    if (b->workspace) out[no++] = fc_span_of_bytes("workspace", b->workspace, (uint64_t)b->workspace_bytes);
    return no;
}

/* The arrays are 4-byte aligned, and no output overlaps an input or another
 * output. b: the backward's arguments (a is then b->fwd), NULL for the forward. */
static fc_status check_pointers(fc_context *ctx, const fc_attention_args *a,
                                const fc_attention_backward_args *b, int varlen)
{
    fc_span in[FC_MAX_SPANS], out[FC_MAX_OUT_SPANS];
    int arrays;
    int ni = read_spans(a, varlen, in, &arrays);
    for (int i = arrays; i < ni; i++) /* int32 and float arrays */
        if (in[i].lo % 4 != 0)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s (%p) is not aligned to its 4-byte elements",
                                in[i].name, (const void *)(uintptr_t)in[i].lo);
    const int no = write_spans(a, b, in, &ni, out);
    for (int o = 0; o < no; o++)
        for (int i = 0; i < ni; i++)
            if (fc_spans_overlap(&out[o], &in[i]))
                return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                    "%s overlaps %s in memory: outputs must not alias inputs", out[o].name,
                                    in[i].name);
    /* an appended-to k and v (the last two) may interleave in one allocation */
    const int kv_shared = a->k_new.data && !b;
    for (int o = 1; o < no; o++)
        for (int e = 0; e < o; e++) {
            if (!fc_spans_overlap(&out[o], &out[e])) continue;
            if (kv_shared && o == no - 1 && e == no - 2) {
                if (kv_elements_disjoint(&a->k, &a->v)) continue;
                return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                    "v shares elements with k (or interleaves with it at other strides): "
                                    "an appended-to cache's k and v may share an allocation, not elements");
            }
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s overlaps %s in memory: outputs must not alias each other", out[o].name,
                                out[e].name);
        }
    return FC_OK;
}

/* ---- the params ------------------------------------------------------------------- */

static void fill_append(const fc_attention_args *a, fc_append_params *ap)
{
    ap->k_new = a->k_new.data;
    ap->v_new = a->v_new.data;
    set_strides(&a->k_new, 0, &ap->kn_batch_stride, &ap->kn_row_stride, &ap->kn_head_stride);
    set_strides(&a->v_new, 0, &ap->vn_batch_stride, &ap->vn_row_stride, &ap->vn_head_stride);
    ap->seqlen_new = (int32_t)a->k_new.shape[1];
    ap->interleaved = a->rotary_interleaved;
    if (!a->rotary_cos.data) return;
    ap->cos = a->rotary_cos.data;
    ap->sin = a->rotary_sin.data;
    ap->cos_row_stride = a->rotary_cos.stride[0];
    ap->sin_row_stride = a->rotary_sin.stride[0];
    ap->seqlen_ro = (int32_t)a->rotary_cos.shape[0];
    ap->rotary_dim = 2 * (int32_t)a->rotary_cos.shape[1];
}

/* Translate checked args into params. */
static void fill_params(const fc_attention_args *a, int varlen, fc_fwd_params *p, int *nothing_to_do)
{
    const int o = varlen ? 1 : 0;
    const int64_t d = a->q.shape[3 - o];
    p->q = a->q.data; p->k = a->k.data; p->v = a->v.data; p->o = a->out.data; p->lse = a->lse.data;
    p->dtype = a->q.dtype;
    p->kv_dtype = a->k.dtype;
    p->o_dtype = a->out.dtype;
    p->q_descale = a->q_descale;
    p->k_descale = a->k_descale;
    p->v_descale = a->v_descale;
    p->out_amax = a->out_amax;
    p->p_amax = a->p_amax;
    p->heads_q = (int32_t)a->q.shape[2 - o]; p->heads_kv = (int32_t)a->k.shape[2 - o]; p->head_dim = (int32_t)d;
    set_strides(&a->q, o, &p->q_batch_stride, &p->q_row_stride, &p->q_head_stride);
    set_strides(&a->k, o, &p->k_batch_stride, &p->k_row_stride, &p->k_head_stride);
    set_strides(&a->v, o, &p->v_batch_stride, &p->v_row_stride, &p->v_head_stride);
    set_strides(&a->out, o, &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
    if (p->lse) {
        if (varlen) { p->lse_batch_stride = 0; p->lse_head_stride = a->lse.stride[0]; p->lse_row_stride = a->lse.stride[1]; }
        else { p->lse_batch_stride = a->lse.stride[0]; p->lse_head_stride = a->lse.stride[1]; p->lse_row_stride = a->lse.stride[2]; }
    }
    p->scale = a->scale != 0.0f ? a->scale : (float)(1.0 / sqrt((double)d));
    p->softcap = a->softcap;
    p->causal = a->causal;
    p->window_left = a->window_left;
    p->window_right = a->causal ? 0 : a->window_right;
    p->num_splits = 1;
    if (varlen) {
        p->batch = a->num_seqs;
        p->seqlen_q = a->max_seqlen_q;
        p->seqlen_k = a->max_seqlen_k;
        p->cu_seqlens_q = a->cu_seqlens_q;
        p->cu_seqlens_k = a->cu_seqlens_k;
        p->total_q = a->q.shape[0];
        p->total_k = a->k.shape[0];
        /* No query token, or max_seqlen_q 0: once cu_seqlens are validated
         * (every sequence <= max_seqlen_q) no row exists. The selection
         * function still validates cu_seqlens on every backend, so a wrong
         * max_seqlen_q or offset is an error, not an unwritten output. */
        if (p->total_q == 0 || p->seqlen_q == 0) *nothing_to_do = 1;
    } else {
        p->batch = (int32_t)a->q.shape[0];
        p->seqlen_q = (int32_t)a->q.shape[1];
        p->seqlen_k = (int32_t)a->k.shape[1];
    }
    p->seqused_k = a->seqused_k;
    if (a->block_table) {
        p->block_table = a->block_table;
        p->block_table_stride = a->block_table_stride ? a->block_table_stride : a->max_pages_per_seq;
        p->page_size = (int32_t)a->k.shape[1];
        p->num_pages = (int32_t)a->k.shape[0];
        p->max_pages = a->max_pages_per_seq;
        p->seqlen_k = p->max_pages * p->page_size; /* check_paged_args: fits int32 */
    }
    if (a->k_new.data) fill_append(a, &p->app);
}

/* The checks of both calls, in one order; b is NULL for the forward. */
static fc_status check_call(fc_context *ctx, const fc_attention_args *a, const fc_attention_backward_args *b,
                            fc_fwd_params *p, int *nothing_to_do)
{
    memset(p, 0, sizeof *p);
    *nothing_to_do = 0;
    if (a->backend < FC_BACKEND_AUTO || a->backend > FC_BACKEND_CPU_REFERENCE)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "backend %d is not a valid fc_backend",
                            (int)a->backend);
    const int varlen = a->cu_seqlens_q || a->cu_seqlens_k;
    if (varlen && (!a->cu_seqlens_q || !a->cu_seqlens_k))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "cu_seqlens_q and cu_seqlens_k must be both set (varlen) or both NULL");
    fc_status st;
    if ((st = check_tensors(ctx, a, varlen, b != NULL))) return st;
    if ((st = check_options(ctx, a))) return st;
    if ((st = check_lse(ctx, a, varlen, b != NULL))) return st;
    if (b && (st = check_grads(ctx, b, varlen))) return st;
    if (varlen && (st = check_varlen_args(ctx, a))) return st;
    if ((st = check_paged_args(ctx, a, varlen, b != NULL))) return st;
    if ((st = check_append_args(ctx, a, varlen, b != NULL))) return st;
    if ((st = check_fp8_args(ctx, a, varlen))) return st;
    if ((st = check_pointers(ctx, a, b, varlen))) return st;
    fill_params(a, varlen, p, nothing_to_do);
    if (a->out_amax || a->p_amax) *nothing_to_do = 0; /* the amax outputs are written (0) */
    return FC_OK;
}

fc_status fc_build_params(fc_context *ctx, const fc_attention_args *a, fc_fwd_params *p,
                          int *nothing_to_do)
{
    if (!a) {
        memset(p, 0, sizeof *p);
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "args is NULL");
    }
    return check_call(ctx, a, NULL, p, nothing_to_do);
}

fc_status fc_build_bwd_params(fc_context *ctx, const fc_attention_backward_args *b, fc_bwd_params *p,
                              int *nothing_to_do)
{
    memset(p, 0, sizeof *p);
    *nothing_to_do = 0;
    if (!b) return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "args is NULL");
    fc_status st = check_call(ctx, &b->fwd, b, &p->f, nothing_to_do);
    if (st) return st;
    const int o = b->fwd.cu_seqlens_q ? 1 : 0;
    p->dout = b->dout.data; p->dq = b->dq.data; p->dk = b->dk.data; p->dv = b->dv.data;
    p->g_dtype = b->dq.dtype;
    set_strides(&b->dout, o, &p->do_batch_stride, &p->do_row_stride, &p->do_head_stride);
    set_strides(&b->dq, o, &p->dq_batch_stride, &p->dq_row_stride, &p->dq_head_stride);
    set_strides(&b->dk, o, &p->dk_batch_stride, &p->dk_row_stride, &p->dk_head_stride);
    set_strides(&b->dv, o, &p->dv_batch_stride, &p->dv_row_stride, &p->dv_head_stride);
    p->deterministic = b->deterministic;
    p->workspace = b->workspace;
    p->workspace_bytes = b->workspace_bytes;
    /* No query row still leaves dk and dv to write (zeros) unless there is
     * no key token either. */
    if (*nothing_to_do && p->f.total_k > 0 && p->f.seqlen_k > 0) *nothing_to_do = 0;
    return FC_OK;
}

/* Validate host-visible cu_seqlens (host copies for CUDA are made by the caller). */
fc_status fc_check_varlen(fc_context *ctx, const fc_fwd_params *p, const int32_t *cu_q,
                          const int32_t *cu_k)
{
    fc_status st = check_cu_seqlens(ctx, "cu_seqlens_q", cu_q, p->batch, p->total_q, p->seqlen_q);
    if (st) return st;
    return check_cu_seqlens(ctx, "cu_seqlens_k", cu_k, p->batch, p->total_k, p->seqlen_k);
}

/* Validate host-visible seqused_k and block table (host copies for CUDA
 * are made by the caller; either may be NULL when p has none): every count
 * in [0, seqlen_k], every page a sequence uses in [0, num_pages). */
fc_status fc_check_paged(fc_context *ctx, const fc_fwd_params *p, const int32_t *used, const int32_t *table)
{
    const fc_append_params *ap = &p->app;
    /* the last rotary position past seqused_k[b]: k_new's last row, or q's (rows step) */
    const int64_t q_last = fc_rotary_q_step(p) ? p->seqlen_q - 1 : 0;
    const int64_t last_off = ap->seqlen_new - 1 > q_last ? ap->seqlen_new - 1 : q_last;
    for (int b = 0; b < p->batch; b++) {
        const int64_t start = used ? used[b] : p->seqlen_k, keys = start + ap->seqlen_new;
        if (start < 0 || keys > p->seqlen_k)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "seqused_k[%d] is %lld%s: must be in [0, %lld]%s", b, (long long)start,
                                ap->k_new ? " before seqlen_new keys are appended" : "",
                                (long long)p->seqlen_k - ap->seqlen_new,
                                p->block_table ? " (max_pages_per_seq * page_size)" : " (seqlen_k)");
        const int64_t last = start + last_off;
        if (ap->cos && last >= ap->seqlen_ro)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "sequence %d needs rotary position %lld: rotary_cos/sin have %d rows (seqlen_ro)", b,
                                (long long)last, (int)ap->seqlen_ro);
        if (!table) continue;
        const int64_t pages = (keys + p->page_size - 1) / p->page_size;
        for (int64_t j = 0; j < pages; j++) {
            const int32_t pg = table[b * p->block_table_stride + j];
            if (pg < 0 || pg >= p->num_pages)
                return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                    "block_table[%d][%lld] is %d: page indices must be in [0, %d) (num_pages)", b,
                                    (long long)j, (int)pg, (int)p->num_pages);
        }
    }
    return FC_OK;
}
