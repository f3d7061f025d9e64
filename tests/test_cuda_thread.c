/*
 * test_cuda_thread.c -- a CUDA call whose thread has no current CUDA
 * context: the first CUDA work of a new thread is fc_attention_forward
 * (a framework's worker thread, a Python thread). The library makes the
 * planned device's context current itself: the TMA maps of the Hopper path
 * are encoded through the driver API, which needs one. On each CUDA path
 * the device has, in a fresh thread: the call succeeds and matches the fp64
 * reference with every element written. 77 without a CUDA device.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#if !defined(FC_HAVE_CUDA)
TU_MAIN_WITHOUT_CUDA
#else
#include <cuda_runtime.h>

#include "test_cuda_util.h"

typedef struct job {
    const fc_attention_args *args;
    int path;
    fc_status st;
    char err[600];
    fc_kernel_info info;
} job;

/* The worker's first CUDA work is the library's call (the outputs on the
 * device hold the poison already). */
static void *worker(void *arg)
{
    job *j = arg;
    fc_context *ctx = NULL;
    j->st = fc_context_create(&ctx);
    if (j->st == FC_OK) j->st = fc_context_set_cuda_path(ctx, j->path);
    if (j->st == FC_OK) j->st = fc_attention_forward(ctx, j->args, NULL, &j->info);
    if (j->st != FC_OK) snprintf(j->err, sizeof j->err, "%s", ctx ? fc_last_error(ctx) : "no context");
    if (j->st == FC_OK && cudaStreamSynchronize(NULL) != cudaSuccess) {
        j->st = FC_ERR_CUDA;
        snprintf(j->err, sizeof j->err, "after the call: %s", cudaGetErrorString(cudaGetLastError()));
    }
    fc_context_free(ctx);
    return NULL;
}

static void one_path(fc_context *ctx, int path)
{
    int p0 = g_pass, f0 = g_fail;
    tcu_ref_case r;
    char err[400];
    const kit_shape s = test_shape(2, 8, 2, 300, 300, 128, FC_DTYPE_BF16);
    if (tcu_ref_case_init(ctx, &s, 5, &r, err, sizeof err)) {
        CHECK(0, "setup: %s", err);
        return;
    }
    void *out = malloc(r.c.out_bytes);
    float *lse = r.c.lse ? malloc(r.c.lse_bytes) : NULL;
    job j = {&r.d.args, path, FC_OK, "", {0}};
    pthread_t t;
    CHECK(out && pthread_create(&t, NULL, worker, &j) == 0, "pthread_create");
    if (out) pthread_join(t, NULL);
    CHECK(j.st == FC_OK, "path %d in a new thread: %s", path, j.err);
    if (out && j.st == FC_OK && cudaMemcpy(out, r.d.out, r.c.out_bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
        (!lse || cudaMemcpy(lse, r.d.lse, r.c.lse_bytes, cudaMemcpyDeviceToHost) == cudaSuccess)) {
        const kit_gate g = kit_gate_for(kit_out_dtype(&r.c.s));
        kit_metrics m;
        kit_compare(&r.c, out, lse, r.ref, r.ref_lse, &g, &m);
        CHECK(kit_gate_pass(&m, &g), "path %d (%s): max_abs %.3g rel_l2 %.3g, %lld unwritten", path, j.info.name,
              m.max_abs, m.rel_l2, (long long)m.unwritten);
    }
    tcu_ref_case_free(&r);
    free(out);
    free(lse);
    char name[32];
    snprintf(name, sizeof name, "new-thread/path%d", path);
    group_done(name, p0, f0);
}

int main(void)
{
    fc_context *ctx;
    const int rc = tu_cuda_start(&ctx);
    if (rc >= 0) return rc;
    const int cc = tcu_device_cc();
    if (cc == 90) one_path(ctx, 90);
    one_path(ctx, 80);
    fc_context_free(ctx);
    return test_summary();
}
#endif
