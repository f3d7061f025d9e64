/*
 * cli_time.c -- timing one prepared case, forward or backward (the exec's
 * pass): warm-up for a fixed wall time (the GPU needs a second or more of
 * load to reach its clock), then per-call times (CUDA events on the GPU,
 * the monotonic clock on the CPU), and on the GPU also a captured graph of
 * CLI_GRAPH_CALLS calls replayed, which removes launch gaps (docs/PERF.md,
 * Method).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void summarize(const double *us, int n, cli_timing *t)
{
    double sum = 0, sum2 = 0, mn = INFINITY;
    for (int i = 0; i < n; i++) {
        sum += us[i];
        if (us[i] < mn) mn = us[i];
    }
    double mean = sum / n;
    for (int i = 0; i < n; i++) sum2 += (us[i] - mean) * (us[i] - mean);
    t->iters = n;
    t->mean_us = mean;
    t->std_us = n > 1 ? sqrt(sum2 / (n - 1)) : 0.0;
    t->min_us = mn;
    t->p50_us = kit_percentile(us, n, 50.0);
    t->p90_us = kit_percentile(us, n, 90.0);
}

/* Calls until warmup_ms of wall time has passed (at least one call). */
static fc_status warm_up(fc_context *ctx, cli_exec *e, double warmup_ms, char *err, size_t err_len)
{
    double t0 = kit_now();
    do {
        fc_status st = cli_exec_run(ctx, e, NULL, err, err_len);
        if (st != FC_OK) return st;
    } while ((kit_now() - t0) * 1e3 < warmup_ms);
    return FC_OK;
}

/* Graph timing: capture CLI_GRAPH_CALLS calls, replay, per call = replay / calls.
 * A failure here is not an error of the run: it is reported in graph_note. */
static void time_graph(fc_context *ctx, cli_exec *e, const cli_time_opts *o, cli_timing *t)
{
    char err[200];
    void *exec = NULL;
    cli_cuda_timer tm = {0};
    double *us = NULL;
    t->graph_us = NAN;
    if (cli_cuda_capture_begin(e->stream, err, sizeof(err))) {
        snprintf(t->graph_note, sizeof(t->graph_note), "capture failed: %s", err);
        return;
    }
    for (int i = 0; i < CLI_GRAPH_CALLS; i++) {
        fc_status st = cli_exec_call(ctx, e, NULL);
        if (st != FC_OK) {
            snprintf(t->graph_note, sizeof(t->graph_note), "capture failed: %s: %s", fc_status_string(st),
                     fc_last_error(ctx));
            cli_cuda_capture_end(e->stream, 0, &exec, err, sizeof(err));
            return;
        }
    }
    if (cli_cuda_capture_end(e->stream, 1, &exec, err, sizeof(err))) {
        snprintf(t->graph_note, sizeof(t->graph_note), "capture failed: %s", err);
        return;
    }
    if (cli_cuda_timer_create(&tm, err, sizeof(err))) goto fail;
    /* one untimed replay (first launch uploads the graph), then as many
     * replays as fit in the time budget, at least 3 */
    if (cli_cuda_graph_launch(exec, e->stream, err, sizeof(err)) ||
        cli_cuda_stream_sync(e->stream, err, sizeof(err)))
        goto fail;
    int max_rep = o->iters > 3 ? o->iters : 3;
    us = malloc((size_t)max_rep * sizeof(double));
    if (!us) {
        snprintf(err, sizeof(err), "out of memory");
        goto fail;
    }
    int n = 0;
    double t0 = kit_now();
    while (n < max_rep) {
        float ms = 0;
        if (cli_cuda_timer_start(&tm, e->stream, err, sizeof(err)) ||
            cli_cuda_graph_launch(exec, e->stream, err, sizeof(err)) ||
            cli_cuda_timer_stop(&tm, e->stream, &ms, err, sizeof(err)))
            goto fail;
        us[n++] = ms * 1e3 / CLI_GRAPH_CALLS;
        if (n >= 3 && (kit_now() - t0) * 1e3 > o->max_ms) break;
    }
    t->graph_us = kit_percentile(us, n, 50.0);
    free(us);
    cli_cuda_timer_destroy(&tm);
    cli_cuda_graph_destroy(exec);
    return;
fail:
    snprintf(t->graph_note, sizeof(t->graph_note), "graph replay failed: %s", err);
    free(us);
    cli_cuda_timer_destroy(&tm);
    cli_cuda_graph_destroy(exec);
}

fc_status cli_time_exec(fc_context *ctx, cli_exec *e, const cli_time_opts *o, cli_timing *t,
                        char *err, size_t err_len)
{
    memset(t, 0, sizeof(*t));
    t->graph_us = NAN;
    int cuda = e->backend == FC_BACKEND_CUDA;
    int max_iters = o->iters > 0 ? o->iters : 1;
    /* us, then the 4 host-profile phases of each CUDA call */
    double *us = malloc((size_t)max_iters * 5 * sizeof(double));
    if (!us) {
        snprintf(err, err_len, "out of host memory for %d timings", max_iters);
        return FC_ERR_OUT_OF_MEMORY;
    }
    double *host = us + max_iters;
    cli_cuda_timer tm = {0};
    fc_status st = warm_up(ctx, e, o->warmup_ms, err, err_len);
    if (st != FC_OK) goto done;
    if (cuda && cli_cuda_timer_create(&tm, err, err_len)) {
        st = FC_ERR_CUDA;
        goto done;
    }
    int n = 0;
    double t0 = kit_now();
    while (n < max_iters) {
        if (cuda) {
            float ms = 0;
            if (o->flush_l2 && cli_cuda_flush_l2(e->stream, err, err_len)) {
                st = FC_ERR_CUDA;
                goto done;
            }
            if (cli_cuda_timer_start(&tm, e->stream, err, err_len)) {
                st = FC_ERR_CUDA;
                goto done;
            }
            st = cli_exec_call(ctx, e, NULL);
            if (st != FC_OK) {
                snprintf(err, err_len, "%s: %s", fc_status_string(st), fc_last_error(ctx));
                goto done;
            }
            if (cli_cuda_timer_stop(&tm, e->stream, &ms, err, err_len)) {
                st = FC_ERR_CUDA;
                goto done;
            }
            fc_host_profile hp; /* read outside the event-timed region */
            fc_last_host_profile(ctx, &hp);
            host[n] = hp.check_us;
            host[max_iters + n] = hp.select_us;
            host[2 * max_iters + n] = hp.launch_us;
            host[3 * max_iters + n] = hp.total_us;
            us[n++] = ms * 1e3;
        } else {
            double a = kit_now();
            st = cli_exec_call(ctx, e, NULL);
            double b = kit_now();
            if (st != FC_OK) {
                snprintf(err, err_len, "%s: %s", fc_status_string(st), fc_last_error(ctx));
                goto done;
            }
            us[n++] = (b - a) * 1e6;
        }
        if (n >= 3 && (kit_now() - t0) * 1e3 > o->max_ms) break;
    }
    summarize(us, n, t);
    t->host.check_us = cuda ? kit_percentile(host, n, 50.0) : NAN;
    t->host.select_us = cuda ? kit_percentile(host + max_iters, n, 50.0) : NAN;
    t->host.launch_us = cuda ? kit_percentile(host + 2 * max_iters, n, 50.0) : NAN;
    t->host.total_us = cuda ? kit_percentile(host + 3 * max_iters, n, 50.0) : NAN;
    if (cuda && o->graph) time_graph(ctx, e, o, t);
    else if (!cuda) snprintf(t->graph_note, sizeof(t->graph_note), "not a CUDA run");
    st = FC_OK;
done:
    cli_cuda_timer_destroy(&tm);
    free(us);
    return st;
}
