/*
 * test_cuda_offsets.c -- every backend answers bad varlen offsets alike,
 * also where there is nothing to compute: a call with no query token (and,
 * for the backward, no key token either) whose cu_seqlens_q or cu_seqlens_k
 * is invalid ({0, INT32_MIN}) is FC_ERR_INVALID_ARGUMENT naming the array,
 * from fc_attention_(backward_)supported and the call, on the CPU backends
 * and on CUDA paths 0, 80 and 90, and writes nothing. The CUDA backend once
 * skipped its device-side check when total_q was 0 and returned FC_OK there.
 * Valid offsets of the same shapes are FC_OK on every backend (the control),
 * and a backward with keys but no query writes dk = dv = 0.
 * The CPU half runs everywhere; the CUDA half needs a device.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_util.h"

#if defined(FC_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

/* One backend to ask: a CPU one, or CUDA with a forced path. */
typedef struct where {
    const char *name;
    fc_backend backend;
    int cuda_path;
} where;

static const where k_cpu[] = {{"cpu", FC_BACKEND_CPU, 0}, {"cpu-reference", FC_BACKEND_CPU_REFERENCE, 0}};
static const where k_cuda[] = {{"cuda", FC_BACKEND_CUDA, 0}, {"cuda80", FC_BACKEND_CUDA, 80},
                               {"cuda90", FC_BACKEND_CUDA, 90}};

/* Offsets to install: which side is bad (0 none, 1 q, 2 k). */
static void offsets(int bad, int32_t sk, int32_t cu_q[2], int32_t cu_k[2])
{
    cu_q[0] = cu_k[0] = 0;
    cu_q[1] = bad == 1 ? INT32_MIN : 0;
    cu_k[1] = bad == 2 ? INT32_MIN : sk;
}

/* The call's buffers where the backend reads them: the case's own (host)
 * or device copies (cu_seqlens and every tensor). */
typedef struct bufs {
    fc_attention_backward_args a;
    void *ptr[9]; /* q k v out lse dout dq dk dv, as a.* point (device: owned) */
    int32_t *cu_q, *cu_k;
    size_t bytes[9];
} bufs;

static void host_bufs(bufs *h, kit_bwd_case *b, int32_t *cu_q, int32_t *cu_k)
{
    memset(h, 0, sizeof *h);
    h->a = b->args;
    h->a.fwd.cu_seqlens_q = h->cu_q = cu_q;
    h->a.fwd.cu_seqlens_k = h->cu_k = cu_k;
    void *p[9] = {b->c.q, b->c.k, b->c.v, b->c.out, b->c.lse, b->dout, b->dq, b->dk, b->dv};
    const size_t n[9] = {b->c.q_bytes, b->c.k_bytes, b->c.v_bytes, b->c.out_bytes, b->c.lse_bytes,
                         b->dout_bytes, b->dq_bytes, b->dk_bytes, b->dv_bytes};
    memcpy(h->ptr, p, sizeof p);
    memcpy(h->bytes, n, sizeof n);
}

/* A copy of the written buffers (out lse dq dk dv) to compare after a call. */
static void snapshot(const bufs *h, int device, unsigned char *snap[9])
{
    for (int i = 3; i < 9; i++) {
        if (i == 5) continue; /* dout is read only */
        snap[i] = malloc(h->bytes[i]);
        if (!snap[i]) continue;
#if defined(FC_HAVE_CUDA)
        if (device) {
            if (cudaMemcpy(snap[i], h->ptr[i], h->bytes[i], cudaMemcpyDeviceToHost) != cudaSuccess)
                memset(snap[i], 0xa5, h->bytes[i]);
            continue;
        }
#endif
        (void)device;
        memcpy(snap[i], h->ptr[i], h->bytes[i]);
    }
}

/* 1 if the written buffers still equal before[]; frees before[]. */
static int unchanged(const bufs *h, int device, unsigned char *before[9])
{
    unsigned char *now[9] = {0};
    snapshot(h, device, now);
    int same = 1;
    for (int i = 3; i < 9; i++) {
        if (i == 5) continue;
        same &= before[i] && now[i] && memcmp(before[i], now[i], h->bytes[i]) == 0;
        free(before[i]);
        free(now[i]);
    }
    return same;
}

/* supported, then the call, of the forward (bwd 0) or the backward; both
 * statuses must be `want`, and an error must name `name`. */
static void ask(fc_context *ctx, const where *w, bufs *h, int bwd, int device, fc_status want, const char *name,
                const char *what)
{
    fc_context_set_cuda_path(ctx, w->cuda_path);
    h->a.fwd.backend = w->backend;
    unsigned char *before[9] = {0};
    snapshot(h, device, before);
    const fc_status sup = bwd ? fc_attention_backward_supported(ctx, &h->a, NULL)
                              : fc_attention_supported(ctx, &h->a.fwd, NULL);
    char why[512];
    snprintf(why, sizeof why, "%s", fc_last_error(ctx));
    const fc_status st = bwd ? fc_attention_backward(ctx, &h->a, NULL, NULL)
                             : fc_attention_forward(ctx, &h->a.fwd, NULL, NULL);
#if defined(FC_HAVE_CUDA)
    if (device) CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s %s: a device error after the call", what, w->name);
#endif
    CHECK(sup == want && st == want, "%s on %s: supported %s (%s), call %s (%s), want %s", what, w->name,
          fc_status_string(sup), why, fc_status_string(st), fc_last_error(ctx), fc_status_string(want));
    if (want == FC_ERR_INVALID_ARGUMENT)
        CHECK(strstr(why, name) && strstr(fc_last_error(ctx), name), "%s on %s: the error does not name %s: %s",
              what, w->name, name, fc_last_error(ctx));
    if (want != FC_OK) {
        CHECK(unchanged(h, device, before), "%s on %s: a failing call wrote an output", what, w->name);
    } else {
        for (int i = 0; i < 9; i++) free(before[i]);
    }
    fc_context_set_cuda_path(ctx, 0);
}

/* dk and dv of a backward with keys and no query: all zero. */
static void zero_grads(const bufs *h, const kit_bwd_case *b, int device, const char *what)
{
    unsigned char *snap[9] = {0};
    snapshot(h, device, snap);
    int64_t bad = 0;
    for (int g = 7; g < 9; g++) {
        const fc_tensor *t = g == 7 ? &b->args.dk : &b->args.dv;
        for (int64_t r = 0; r < t->shape[0]; r++)
            for (int64_t x = 0; x < t->shape[1]; x++)
                for (int64_t d = 0; d < t->shape[2]; d++)
                    bad += !snap[g] || kit_load(snap[g], t->dtype, r * t->stride[0] + x * t->stride[1] + d) != 0.0f;
    }
    for (int i = 0; i < 9; i++) free(snap[i]);
    CHECK(bad == 0, "%s: %lld dk/dv elements are not 0", what, (long long)bad);
}

/* Every (entry, bad side) on the backends in w[0..n): host (device 0) or
 * device buffers. dev_up copies the case and offsets to the device. */
typedef int (*uploader)(bufs *h, kit_bwd_case *b, const int32_t *cu_q, const int32_t *cu_k);

static void run_all(fc_context *ctx, const where *w, int n, int device, uploader dev_up, void (*dev_free)(bufs *))
{
    /* one sequence, no query token; the backward's second case has no key
     * token either (then it has nothing to write at all) */
    static const int32_t key_tokens[2] = {5, 0};
    for (int bwd = 0; bwd < 2; bwd++)
        for (int kt = 0; kt < 1 + bwd; kt++)
            for (int bad = 0; bad < 3; bad++) {
                kit_shape s = test_shape(1, 2, 1, 0, key_tokens[kt], 64, FC_DTYPE_F16);
                s.varlen = 1;
                kit_bwd_case b;
                if (kit_bwd_case_init(&b, &s, 7 + (uint64_t)bad) != 0) {
                    CHECK(0, "kit_bwd_case_init");
                    continue;
                }
                int32_t cu_q[2], cu_k[2];
                offsets(bad, key_tokens[kt], cu_q, cu_k);
                bufs h;
                if (device ? dev_up(&h, &b, cu_q, cu_k) != 0 : (host_bufs(&h, &b, cu_q, cu_k), 0)) {
                    CHECK(0, "device setup");
                    kit_bwd_case_free(&b);
                    continue;
                }
                char what[96];
                snprintf(what, sizeof what, "%s, %d key tokens, %s offsets", bwd ? "backward" : "forward",
                         key_tokens[kt], bad == 0 ? "valid" : bad == 1 ? "bad q" : "bad k");
                for (int i = 0; i < n; i++) {
                    const fc_status want = bad ? FC_ERR_INVALID_ARGUMENT : FC_OK;
                    ask(ctx, &w[i], &h, bwd, device, want, bad == 1 ? "cu_seqlens_q" : "cu_seqlens_k", what);
                    if (want == FC_OK && bwd && key_tokens[kt] > 0) zero_grads(&h, &b, device, what);
                }
                if (device) dev_free(&h);
                kit_bwd_case_free(&b);
            }
}

#if defined(FC_HAVE_CUDA)
static void device_free(bufs *h)
{
    for (int i = 0; i < 9; i++) cudaFree(h->ptr[i]);
    cudaFree(h->cu_q);
    cudaFree(h->cu_k);
}

static int device_upload(bufs *h, kit_bwd_case *b, const int32_t *cu_q, const int32_t *cu_k)
{
    bufs src;
    host_bufs(&src, b, (int32_t *)cu_q, (int32_t *)cu_k);
    *h = src;
    memset(h->ptr, 0, sizeof h->ptr);
    h->cu_q = h->cu_k = NULL;
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 9 && e == cudaSuccess; i++) {
        e = cudaMalloc(&h->ptr[i], src.bytes[i]);
        if (e == cudaSuccess) e = cudaMemcpy(h->ptr[i], src.ptr[i], src.bytes[i], cudaMemcpyHostToDevice);
    }
    if (e == cudaSuccess) e = cudaMalloc((void **)&h->cu_q, 2 * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMalloc((void **)&h->cu_k, 2 * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMemcpy(h->cu_q, cu_q, 2 * sizeof(int32_t), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(h->cu_k, cu_k, 2 * sizeof(int32_t), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        device_free(h);
        return -1;
    }
    fc_tensor *t[9] = {&h->a.fwd.q, &h->a.fwd.k, &h->a.fwd.v, &h->a.fwd.out, &h->a.fwd.lse,
                       &h->a.dout, &h->a.dq, &h->a.dk, &h->a.dv};
    for (int i = 0; i < 9; i++) t[i]->data = h->ptr[i];
    h->a.fwd.cu_seqlens_q = h->cu_q;
    h->a.fwd.cu_seqlens_k = h->cu_k;
    return 0;
}
#endif

int main(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    int p0 = g_pass, f0 = g_fail;
    run_all(ctx, k_cpu, 2, 0, NULL, NULL);
    group_done("cpu backends", p0, f0);
#if defined(FC_HAVE_CUDA)
    if (tu_cuda_device(ctx)) {
        /* path 90 only where it exists: an sm_90 device and a build with 90a */
        int dev = 0, major = 0, minor = 0;
        const int hopper = cudaGetDevice(&dev) == cudaSuccess &&
                           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                           major == 9 && minor == 0 && strstr(fc_build_info(), "90a") != NULL;
        p0 = g_pass, f0 = g_fail;
        run_all(ctx, k_cuda, hopper ? 3 : 2, 1, device_upload, device_free);
        group_done(hopper ? "cuda paths 0/80/90" : "cuda paths 0/80 (no sm_90 device or build)", p0, f0);
    }
#else
    printf("SKIP: the CUDA half (this build has no CUDA backend)\n");
#endif
    fc_context_free(ctx);
    return test_summary();
}
