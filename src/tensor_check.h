/*
 * tensor_check.h -- the checks every tensor argument of the API goes
 * through (tensor_check.c), and the byte ranges that the calls' aliasing
 * checks compare.
 */
#ifndef FC_TENSOR_CHECK_H
#define FC_TENSOR_CHECK_H

#include "api_internal.h"

/* Largest element offset of t, or -1 when it (or it in bytes) overflows
 * int64. Shapes checked > 0 first. */
int64_t fc_tensor_max_offset(const fc_tensor *t);
/* A dimension of t is 0. */
int fc_tensor_empty(const fc_tensor *t);
/* No two elements of the n dims share an offset (written tensors). */
int fc_dims_non_overlapping(int n, const int64_t *shape, const int64_t *stride);
int fc_tensor_non_overlapping(const fc_tensor *t);
/* Pointer, alignment, ndim, sizes (> 0 but empty_dim, which may be 0;
 * <= INT32_MAX), non-negative strides, a contiguous last dimension, no
 * offset overflow, and for a written tensor no self-aliasing; the message
 * names the argument and dimension (dim_names). */
fc_status fc_check_tensor(fc_context *ctx, const char *name, const fc_tensor *t, int ndim,
                          const char *const *dim_names, int empty_dim, int written);
/* a and b have the same shape (a->ndim dims). */
int fc_same_shape(const fc_tensor *a, const fc_tensor *b);

/* The bytes [lo, hi) a call reads or writes through one argument. */
typedef struct fc_span {
    const char *name;
    uint64_t lo, hi;
} fc_span;

fc_span fc_span_of_bytes(const char *name, const void *ptr, uint64_t bytes);
fc_span fc_span_of_tensor(const char *name, const fc_tensor *t);
/* Do two non-empty spans share a byte? */
int fc_spans_overlap(const fc_span *a, const fc_span *b);

#endif /* FC_TENSOR_CHECK_H */
