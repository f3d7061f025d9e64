/*
 * api_internal.h -- the context (context.c) and the error setter every
 * host file reports through. Included by validate.c, dispatch.c and api.c.
 */
#ifndef FC_API_INTERNAL_H
#define FC_API_INTERNAL_H

#include "internal.h"

struct fc_tune_cache;

struct fc_context {
    char err[FC_ERRMSG_LEN]; /* last error message ("" after a success)          */
    int num_threads;         /* CPU backend workers, 0 = one per core            */
    int device;              /* CUDA device, -1 = current                        */
    int cuda_path;           /* 0 auto, 80 or 90 forced                          */
    int trust_arrays;        /* 1: device int32 arrays taken unchecked           */
    fc_tuning tuning;        /* the experimental hooks (fc_context_set_tuning)   */
    char *trace_file;        /* the context's copy of tuning.sm90_trace_file     */
    fc_host_profile prof;    /* the last successful forward call's host time     */
    struct fc_tune_cache *tune; /* the tuning cache (tuning_cache.h), or NULL     */
    fc_status tune_env_status;  /* FLASHCORE_TUNING_CACHE's load, at creation     */
    char tune_env_err[FC_ERRMSG_LEN]; /* its message when that failed             */
    int cp_fail_step;        /* tests only (test_cp.c): the ring's pair calls fail
                              * from this step on, as out of memory (-1: never) */
    struct fc_pool *cpu_pool; /* the CPU backend's workers, from its first call */
};

/* The context's CPU workers (cpu/pool.h), created at the first call that
 * needs them; NULL if that failed (that call runs on the calling thread,
 * the next one tries again). */
struct fc_pool *fc_context_cpu_pool(fc_context *ctx);

/* Write a printf-style message into ctx->err and return st. */
fc_status fc_set_error(fc_context *ctx, fc_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Check every field of a tuning struct (fc_context_set_tuning's ranges). */
fc_status fc_check_tuning(fc_context *ctx, const fc_tuning *t);

#endif /* FC_API_INTERNAL_H */
