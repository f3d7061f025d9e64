/*
 * dispatch.h -- the one selection function and the run (dispatch.c), called
 * by both attention entry points so that "supported?" and "what runs" agree.
 */
#ifndef FC_DISPATCH_H
#define FC_DISPATCH_H

#include "api_internal.h"

/* The selection function's answer: which backend and kernel, and the work
 * split. fc_attention_supported reports it; fc_attention_forward runs it. */
typedef struct fc_plan {
    fc_backend backend;       /* CPU, CPU_REFERENCE or CUDA                      */
    char name[96];
    int32_t num_splits;
    int64_t workspace_bytes;
    int32_t tuned;            /* 1: the CUDA plan is a tuning cache entry's      */
    fc_cuda_choice cuda;      /* valid when backend == FC_BACKEND_CUDA            */
    fc_cuda_device dev;       /* idem                                             */
} fc_plan;

/* Backend, kernel, splits for p under ctx's settings; or the reason none
 * fits. bwd: the backward's params (p is then &bwd->f), NULL for the forward. */
fc_status fc_select(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *bwd, fc_backend requested,
                    void *stream, fc_plan *plan);
/* Run a plan made by fc_select. */
fc_status fc_run(fc_context *ctx, const fc_fwd_params *p, const fc_plan *plan, void *stream);
/* Run a backward plan made by fc_select. */
fc_status fc_run_backward(fc_context *ctx, const fc_bwd_params *p, const fc_plan *plan, void *stream);

#endif /* FC_DISPATCH_H */
