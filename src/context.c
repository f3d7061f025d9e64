/*
 * context.c -- the fc_context: creation, the per-context settings (threads,
 * device, CUDA path, tuning hooks) and the last-error message every other
 * file writes through fc_set_error.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "cpu/pool.h"
#include "tuning_cache.h"

/* More CPU workers than this is a caller's mistake, not a machine. */
#define FC_MAX_THREADS 4096

/* ---- context ---------------------------------------------------------------- */

fc_status fc_context_create(fc_context **out)
{
    if (!out) return FC_ERR_INVALID_ARGUMENT;
    fc_context *c = calloc(1, sizeof *c);
    *out = c;
    if (!c) return FC_ERR_OUT_OF_MEMORY;
    c->device = -1;
    c->cp_fail_step = -1;
    fc_tuning_init(&c->tuning);
    c->tune = fc_tune_cache_from_env(&c->tune_env_status, c->tune_env_err, sizeof c->tune_env_err);
    return FC_OK;
}

void fc_context_free(fc_context *ctx)
{
    if (!ctx) return;
    fc_pool_destroy(ctx->cpu_pool);
    free(ctx->trace_file);
    fc_tune_cache_release(ctx->tune);
    free(ctx);
}

struct fc_pool *fc_context_cpu_pool(fc_context *ctx)
{
    if (!ctx->cpu_pool) ctx->cpu_pool = fc_pool_create();
    return ctx->cpu_pool;
}

const char *fc_last_error(const fc_context *ctx)
{
    return ctx ? ctx->err : "fc_last_error: ctx is NULL";
}

fc_status fc_set_error(fc_context *ctx, fc_status st, const char *fmt, ...)
{
    if (!ctx) return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    return st;
}

fc_status fc_context_set_num_threads(fc_context *ctx, int num_threads)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    if (num_threads < 0 || num_threads > FC_MAX_THREADS)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "num_threads %d is out of range: use 0 (one per core) to %d", num_threads,
                            FC_MAX_THREADS);
    if (num_threads != ctx->num_threads) { /* the caller's way to release the workers and their scratch */
        fc_pool_destroy(ctx->cpu_pool);
        ctx->cpu_pool = NULL;
    }
    ctx->num_threads = num_threads;
    ctx->err[0] = 0;
    return FC_OK;
}

fc_status fc_context_set_device(fc_context *ctx, int device)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    if (device < -1)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "device %d is invalid: use -1 (current device) or an index >= 0", device);
    ctx->device = device;
    ctx->err[0] = 0;
    return FC_OK;
}

fc_status fc_context_set_cuda_path(fc_context *ctx, int path)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    if (path != 0 && path != 80 && path != 90)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "cuda path %d is invalid: use 0 (automatic), 80 or 90", path);
    ctx->cuda_path = path;
    ctx->err[0] = 0;
    return FC_OK;
}

fc_status fc_context_set_check_device_arrays(fc_context *ctx, int on)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    if (on != 0 && on != 1)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "check_device_arrays %d is invalid: use 1 (check) or 0",
                            on);
    ctx->trust_arrays = !on;
    ctx->err[0] = 0;
    return FC_OK;
}

/* ---- experimental: tuning hooks ------------------------------------------- */

void fc_tuning_init(fc_tuning *t)
{
    if (!t) return;
    memset(t, 0, sizeof *t);
    for (int i = 0; i < FC_TUNE_NUM_FIELDS; i++) *fc_tune_at(t, &fc_tune_fields[i]) = fc_tune_fields[i].def;
}

fc_status fc_check_tuning(fc_context *ctx, const fc_tuning *t)
{
    for (int i = 0; i < FC_TUNE_NUM_FIELDS; i++) {
        const fc_tune_field *f = &fc_tune_fields[i];
        const int32_t v = fc_tune_get(t, f), hi = fc_tune_field_max(f);
        if (v >= f->lo && v <= hi) continue;
        if (hi < f->lo + 1) /* a row index where the build has no such table */
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "tuning.%s is %d: this build has no such tile "
                                "table, use -1", f->name, (int)v);
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "tuning.%s is %d: use %d to %d", f->name, (int)v,
                            (int)f->lo, (int)hi);
    }
    return FC_OK;
}

fc_status fc_context_set_tuning(fc_context *ctx, const fc_tuning *t)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    if (!t) return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "tuning is NULL");
    const fc_status st = fc_check_tuning(ctx, t);
    if (st) return st;
    char *file = NULL;
    if (t->sm90_trace_file && t->sm90_trace_file[0] && !(file = strdup(t->sm90_trace_file)))
        return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "cannot copy tuning.sm90_trace_file");
    free(ctx->trace_file);
    ctx->trace_file = file;
    ctx->tuning = *t;
    ctx->tuning.sm90_trace_file = file;
    ctx->err[0] = 0;
    return FC_OK;
}

fc_status fc_context_get_tuning(const fc_context *ctx, fc_tuning *out)
{
    if (!ctx || !out) return FC_ERR_INVALID_ARGUMENT;
    *out = ctx->tuning;
    return FC_OK;
}

fc_status fc_tuning_row_info(int path, int index, fc_tile_row *row)
{
    if (!row || (path != 80 && path != 90) || index < 0) return FC_ERR_INVALID_ARGUMENT;
    if (!fc_cuda_compiled()) return FC_ERR_UNSUPPORTED;
    const int found = path == 90 ? fc_sm90_tile_row(index, row) : fc_sm80_tile_row(index, row);
    return found ? FC_OK : FC_ERR_INVALID_ARGUMENT;
}

fc_status fc_tuning_bwd_row_info(int path, int index, fc_tile_row *row)
{
    if (!row || (path != 80 && path != 90) || index < 0) return FC_ERR_INVALID_ARGUMENT;
    if (!fc_cuda_compiled()) return FC_ERR_UNSUPPORTED;
    const int found = path == 90 ? fc_sm90_bwd_tile_row(index, row) : fc_sm80_bwd_tile_row(index, row);
    return found ? FC_OK : FC_ERR_INVALID_ARGUMENT;
}
