/*
 * api_internal.h -- the context and the plan, shared by api.c (checks,
 * entry points) and dispatch.c (the one selection function and the run).
 */
#ifndef FC_API_INTERNAL_H
#define FC_API_INTERNAL_H

#include "internal.h"

struct fc_context {
    char err[FC_ERRMSG_LEN]; /* last error message ("" after a success)          */
    int num_threads;         /* CPU backend workers, 0 = one per core            */
    int device;              /* CUDA device, -1 = current                        */
    int cuda_path;           /* 0 auto, 80 or 90 forced                          */
    fc_host_profile prof;    /* the last successful forward call's host time     */
};

/* The selection function's answer: which backend and kernel, and the work
 * split. fc_attention_supported reports it; fc_attention_forward runs it. */
typedef struct fc_plan {
    fc_backend backend;       /* CPU, CPU_REFERENCE or CUDA                      */
    char name[96];
    int32_t num_splits;
    int64_t workspace_bytes;
    fc_cuda_choice cuda;      /* valid when backend == FC_BACKEND_CUDA            */
    fc_cuda_device dev;       /* idem                                             */
} fc_plan;

/* Write a printf-style message into ctx->err and return st. */
fc_status fc_set_error(fc_context *ctx, fc_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Check args completely and translate them into params. *nothing_to_do is
 * set when the problem is empty (varlen with no query tokens). */
fc_status fc_build_params(fc_context *ctx, const fc_attention_args *args, fc_fwd_params *p,
                          int *nothing_to_do);
/* Check host-readable copies of cu_seqlens against p. */
fc_status fc_check_varlen(fc_context *ctx, const fc_fwd_params *p, const int32_t *cu_q,
                          const int32_t *cu_k);

/* The one selection function: backend, kernel, splits; or the reason none fits. */
fc_status fc_select(fc_context *ctx, const fc_fwd_params *p, fc_backend requested, void *stream,
                    fc_plan *plan);
/* Run a plan made by fc_select. */
fc_status fc_run(fc_context *ctx, const fc_fwd_params *p, const fc_plan *plan, void *stream);

#endif /* FC_API_INTERNAL_H */
