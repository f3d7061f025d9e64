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
int main(void)
{
    printf("SKIP: no CUDA device (this build has no CUDA backend)\n");
    return 77;
}
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
    kit_case c;
    dev_case d;
    char err[400];
    const kit_shape s = test_shape(2, 8, 2, 300, 300, 128, FC_DTYPE_BF16);
    if (kit_case_init(&c, &s, 5)) {
        CHECK(0, "no memory for the case");
        return;
    }
    void *ref = malloc(c.out_bytes), *out = malloc(c.out_bytes);
    float *ref_lse = c.lse ? malloc(c.lse_bytes) : NULL, *lse = c.lse ? malloc(c.lse_bytes) : NULL;
    if (!ref || !out || test_reference(ctx, &c, ref, ref_lse) != FC_OK || dev_upload(&c, &d, err, sizeof err)) {
        CHECK(0, "setup: %s", fc_last_error(ctx));
    } else {
        job j = {&d.args, path, FC_OK, "", {0}};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, worker, &j) == 0, "pthread_create");
        pthread_join(t, NULL);
        CHECK(j.st == FC_OK, "path %d in a new thread: %s", path, j.err);
        if (j.st == FC_OK && cudaMemcpy(out, d.out, c.out_bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
            (!lse || cudaMemcpy(lse, d.lse, c.lse_bytes, cudaMemcpyDeviceToHost) == cudaSuccess)) {
            const kit_gate g = kit_gate_for(kit_out_dtype(&c.s));
            kit_metrics m;
            kit_compare(&c, out, lse, ref, ref_lse, &g, &m);
            CHECK(kit_gate_pass(&m, &g), "path %d (%s): max_abs %.3g rel_l2 %.3g, %lld unwritten", path,
                  j.info.name, m.max_abs, m.rel_l2, (long long)m.unwritten);
        }
        dev_free(&d);
    }
    kit_case_free(&c);
    free(ref);
    free(out);
    free(ref_lse);
    free(lse);
    char name[32];
    snprintf(name, sizeof name, "new-thread/path%d", path);
    group_done(name, p0, f0);
}

int main(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    if (!tu_cuda_device(ctx)) {
        fc_context_free(ctx);
        return 77;
    }
    struct cudaDeviceProp prop;
    const int cc = cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.major * 10 + prop.minor : 0;
    if (cc == 90) one_path(ctx, 90);
    one_path(ctx, 80);
    fc_context_free(ctx);
    return test_summary();
}
#endif
