/*
 * tensor_check.c -- the checks every tensor argument of the API goes
 * through (shape, strides, alignment, overflow, self-aliasing) and the byte
 * ranges that the calls' aliasing checks compare. Used by validate.c (the
 * forward and backward) and merge.c.
 */
#include <stdio.h>

#include "tensor_check.h"

/* Largest element offset of t (sum of (shape-1)*stride), or -1 when that
 * offset, or the same offset in bytes, overflows int64 (kernels form byte
 * addresses from it). Shapes are checked > 0 before this is called. */
int64_t fc_tensor_max_offset(const fc_tensor *t)
{
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) {
        int64_t term;
        if (__builtin_mul_overflow(t->shape[i] - 1, t->stride[i], &term)) return -1;
        if (__builtin_add_overflow(off, term, &off)) return -1;
    }
    if (off > (INT64_MAX - 1) / fc_dtype_bytes(t->dtype)) return -1;
    return off;
}

int fc_tensor_empty(const fc_tensor *t)
{
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 1;
    return 0;
}

/* Elements of a tensor written by the library must not alias each other:
 * sorted by stride, each stride must cover the extent of the faster dims. */
int fc_dims_non_overlapping(int n, const int64_t *shape, const int64_t *stride)
{
    int idx[5] = {0, 1, 2, 3, 4};
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && stride[idx[j]] < stride[idx[j - 1]]; j--) {
            int tmp = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = tmp;
        }
    int64_t extent = 1; /* elements spanned by the dims already placed */
    for (int i = 0; i < n; i++) {
        const int d = idx[i];
        if (shape[d] == 1) continue;
        if (stride[d] < extent) return 0;
        extent = stride[d] * (shape[d] - 1) + extent;
    }
    return 1;
}

int fc_tensor_non_overlapping(const fc_tensor *t)
{
    return fc_dims_non_overlapping(t->ndim, t->shape, t->stride);
}

/* Shape, stride and pointer checks common to every tensor. empty_dim is the
 * one dimension that may be 0 (the token count of a varlen tensor), or -1. */
fc_status fc_check_tensor(fc_context *ctx, const char *name, const fc_tensor *t, int ndim,
                          const char *const *dim_names, int empty_dim, int written)
{
    if (!t->data)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s.data is NULL", name);
    /* Every backend loads and stores whole elements (misaligned ones are
     * undefined behaviour in C); the dtype is known here. */
    if ((uintptr_t)t->data % (uintptr_t)fc_dtype_bytes(t->dtype) != 0)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s.data (%p) is not aligned to its %d-byte elements",
                            name, t->data, (int)fc_dtype_bytes(t->dtype));
    if (t->ndim != ndim)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "%s.ndim is %d: expected %d", name,
                            (int)t->ndim, ndim);
    for (int i = 0; i < ndim; i++) {
        int64_t lo = i == empty_dim ? 0 : 1;
        if (t->shape[i] < lo)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s.shape[%d] (%s) is %lld: must be >= %lld", name, i, dim_names[i],
                                (long long)t->shape[i], (long long)lo);
        if (t->shape[i] > INT32_MAX)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s.shape[%d] (%s) is %lld: sizes are limited to %d", name, i,
                                dim_names[i], (long long)t->shape[i], INT32_MAX);
        if (t->stride[i] < 0)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s.stride[%d] is %lld: negative strides are not supported", name, i,
                                (long long)t->stride[i]);
    }
    if (t->stride[ndim - 1] != 1)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "%s.stride[%d] is %lld: the last dimension must be contiguous (stride 1)",
                            name, ndim - 1, (long long)t->stride[ndim - 1]);
    if (fc_tensor_empty(t)) return FC_OK; /* empty varlen tensor: nothing is addressed */
    if (fc_tensor_max_offset(t) < 0)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "%s: shape and strides give element offsets that overflow 64 bits", name);
    if (written && !fc_tensor_non_overlapping(t))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "%s: strides make elements overlap (an output must not alias itself)", name);
    return FC_OK;
}

int fc_same_shape(const fc_tensor *a, const fc_tensor *b)
{
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

fc_span fc_span_of_bytes(const char *name, const void *ptr, uint64_t bytes)
{
    fc_span s = {name, (uint64_t)(uintptr_t)ptr, (uint64_t)(uintptr_t)ptr + bytes};
    if (s.hi < s.lo) s.hi = UINT64_MAX; /* runs to the top of the address space */
    return s;
}

/* From the first element to the end of the last (fc_check_tensor passed, so
 * the extent fits int64). An empty tensor addresses nothing. */
fc_span fc_span_of_tensor(const char *name, const fc_tensor *t)
{
    if (fc_tensor_empty(t)) return fc_span_of_bytes(name, t->data, 0);
    const uint64_t n = (uint64_t)(fc_tensor_max_offset(t) + 1);
    return fc_span_of_bytes(name, t->data, n * (uint64_t)fc_dtype_bytes(t->dtype));
}

/* A range test is conservative for interleaved views, but an output that
 * shares memory with anything the call reads would be read after other
 * threads/CTAs wrote it (cu_seqlens inside out crashed the CPU backends). */
int fc_spans_overlap(const fc_span *a, const fc_span *b)
{
    return a->lo < a->hi && b->lo < b->hi && a->lo < b->hi && b->lo < a->hi;
}

