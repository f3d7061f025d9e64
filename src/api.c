/*
 * api.c -- the public entry points: version, build and status strings, and
 * the attention calls, forward and backward (checks, then the one selection
 * function, then the run). The context lives in context.c, the checks in validate.c, the
 * selection and the run in dispatch.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dispatch.h"
#include "nvtx.h"
#include "validate.h"

/* ---- version, build, status ----------------------------------------------- */

extern const char fc_build_git_sha[], fc_build_compiler[], fc_build_flags[], fc_build_type[],
    fc_build_cuda[];

unsigned fc_version_number(void) { return FLASHCORE_VERSION_NUMBER; }
const char *fc_version_string(void) { return FLASHCORE_VERSION_STRING; }

static char build_info_buf[1024];

static void build_info_once(void)
{
    snprintf(build_info_buf, sizeof build_info_buf, "flashcore %s git %s; %s %s; flags '%s'; cuda: %s",
             FLASHCORE_VERSION_STRING, fc_build_git_sha, fc_build_compiler, fc_build_type,
             fc_build_flags, fc_build_cuda);
}

const char *fc_build_info(void)
{
    /* Built exactly once: pthread_once orders the write before every read,
     * so concurrent first calls neither race nor see a half-written string. */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_info_once);
    return build_info_buf;
}

const char *fc_status_string(fc_status status)
{
    switch (status) {
    case FC_OK: return "FC_OK: success";
    case FC_ERR_INVALID_ARGUMENT: return "FC_ERR_INVALID_ARGUMENT: an argument is invalid";
    case FC_ERR_UNSUPPORTED: return "FC_ERR_UNSUPPORTED: no kernel supports this combination";
    case FC_ERR_OUT_OF_MEMORY: return "FC_ERR_OUT_OF_MEMORY: an allocation failed";
    case FC_ERR_CUDA: return "FC_ERR_CUDA: a CUDA call failed";
    case FC_ERR_NO_DEVICE: return "FC_ERR_NO_DEVICE: no usable CUDA device";
    case FC_ERR_INTERNAL: return "FC_ERR_INTERNAL: internal error (a FlashCore bug)";
    }
    return "unknown status";
}

void fc_attention_args_init(fc_attention_args *args)
{
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->window_left = -1;
    args->window_right = -1;
    args->backend = FC_BACKEND_AUTO;
}

/* ---- entry points ------------------------------------------------------------- */

_Static_assert(sizeof ((fc_kernel_info *)0)->name == sizeof ((fc_plan *)0)->name, "kernel names differ in size");

static void fill_info(fc_kernel_info *info, const fc_plan *plan)
{
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->backend = plan->backend;
    memcpy(info->name, plan->name, sizeof info->name); /* NUL-terminated, same size */
    info->num_splits = plan->num_splits;
    info->workspace_bytes = plan->workspace_bytes;
    info->tuned = plan->tuned;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Checks, then selection; *t_checked (if not NULL) gets the time in between. */
static fc_status prepare(fc_context *ctx, const fc_attention_args *args, void *stream,
                         fc_fwd_params *p, fc_plan *plan, int *nothing_to_do, double *t_checked)
{
    ctx->err[0] = 0;
    fc_status st = fc_build_params(ctx, args, p, nothing_to_do);
    if (st) return st;
    if (t_checked) *t_checked = now_us();
    return fc_select(ctx, p, NULL, args->backend, stream, plan);
}

fc_status fc_attention_supported(fc_context *ctx, const fc_attention_args *args, fc_kernel_info *info)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    FC_RANGE_PUSH("fc_attention_supported");
    fc_fwd_params p;
    fc_plan plan;
    int nothing;
    fc_status st = prepare(ctx, args, NULL, &p, &plan, &nothing, NULL);
    if (st == FC_OK) fill_info(info, &plan);
    FC_RANGE_POP();
    return st;
}

static void record_profile(fc_context *ctx, double t0, double t1, double t2, double t3)
{
    ctx->prof.check_us = t1 - t0;
    ctx->prof.select_us = t2 - t1;
    ctx->prof.launch_us = t3 - t2;
    ctx->prof.total_us = t3 - t0;
}

static fc_status forward(fc_context *ctx, const fc_attention_args *args, void *stream, fc_kernel_info *info)
{
    const double t0 = now_us();
    fc_fwd_params p;
    fc_plan plan;
    int nothing;
    double t1 = t0;
    fc_status st = prepare(ctx, args, stream, &p, &plan, &nothing, &t1);
    if (st) return st;
    fill_info(info, &plan);
    const double t2 = now_us();
    if (!nothing) st = fc_run(ctx, &p, &plan, stream);
    if (st) return st;
    record_profile(ctx, t0, t1, t2, now_us());
    return FC_OK;
}

fc_status fc_attention_forward(fc_context *ctx, const fc_attention_args *args, void *stream,
                               fc_kernel_info *info)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    FC_RANGE_PUSH("fc_attention_forward");
    const fc_status st = forward(ctx, args, stream, info);
    FC_RANGE_POP();
    return st;
}

/* ---- backward ------------------------------------------------------------------ */

void fc_attention_backward_args_init(fc_attention_backward_args *args)
{
    if (!args) return;
    memset(args, 0, sizeof *args);
    fc_attention_args_init(&args->fwd);
}

/* The backward's checks, then the same selection function as the forward. */
static fc_status prepare_bwd(fc_context *ctx, const fc_attention_backward_args *args, void *stream,
                             fc_bwd_params *p, fc_plan *plan, int *nothing_to_do, double *t_checked)
{
    ctx->err[0] = 0;
    fc_status st = fc_build_bwd_params(ctx, args, p, nothing_to_do);
    if (st) return st;
    if (t_checked) *t_checked = now_us();
    return fc_select(ctx, &p->f, p, args->fwd.backend, stream, plan);
}

fc_status fc_attention_backward_supported(fc_context *ctx, const fc_attention_backward_args *args,
                                          fc_kernel_info *info)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    FC_RANGE_PUSH("fc_attention_backward_supported");
    fc_bwd_params p;
    fc_plan plan;
    int nothing;
    fc_status st = prepare_bwd(ctx, args, NULL, &p, &plan, &nothing, NULL);
    if (st == FC_OK) fill_info(info, &plan);
    FC_RANGE_POP();
    return st;
}

static fc_status backward(fc_context *ctx, const fc_attention_backward_args *args, void *stream,
                          fc_kernel_info *info)
{
    const double t0 = now_us();
    fc_bwd_params p;
    fc_plan plan;
    int nothing;
    double t1 = t0;
    fc_status st = prepare_bwd(ctx, args, stream, &p, &plan, &nothing, &t1);
    if (st) return st;
    fill_info(info, &plan);
    const double t2 = now_us();
    if (!nothing) st = fc_run_backward(ctx, &p, &plan, stream);
    if (st) return st;
    record_profile(ctx, t0, t1, t2, now_us());
    return FC_OK;
}

fc_status fc_attention_backward(fc_context *ctx, const fc_attention_backward_args *args, void *stream,
                                fc_kernel_info *info)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    FC_RANGE_PUSH("fc_attention_backward");
    const fc_status st = backward(ctx, args, stream, info);
    FC_RANGE_POP();
    return st;
}

fc_status fc_last_host_profile(const fc_context *ctx, fc_host_profile *out)
{
    if (!ctx || !out) return FC_ERR_INVALID_ARGUMENT;
    *out = ctx->prof;
    return FC_OK;
}

int fc_cuda_available(void)
{
    if (!fc_cuda_compiled()) return 0;
    fc_cuda_device dev;
    char err[FC_ERRMSG_LEN];
    return fc_cuda_get_device(-1, &dev, err, sizeof err) == FC_OK;
}

fc_status fc_cuda_device_info(fc_context *ctx, char *buf, size_t buf_size)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    if (!buf || buf_size == 0) return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "buf is NULL or empty");
    buf[0] = 0;
    fc_cuda_device dev;
    fc_status st = fc_cuda_get_device(ctx->device, &dev, ctx->err, sizeof ctx->err);
    if (st) return st;
    snprintf(buf, buf_size, "%s (sm_%d%d, %d SMs, %lld KB smem/block, %lld MB L2, driver %d, runtime %d)",
             dev.name, dev.cc_major, dev.cc_minor, dev.sm_count, (long long)(dev.smem_optin >> 10),
             (long long)(dev.l2_bytes >> 20), dev.driver_version, dev.runtime_version);
    return FC_OK;
}
