/*
 * test_cuda_util.h -- what the forward's GPU tests share (test_cuda_forward.c,
 * test_cuda_paged.c): a kit case's device copy (every tensor, the varlen
 * offsets, the block table, seqused_k and the append step's tensors), a run with out and lse poisoned
 * on the device, and which CUDA paths this device and build can run.
 *
 * Header-only (static), like test_util.h; include it only where
 * FC_HAVE_CUDA is defined, after cuda_runtime_api.h.
 */
#ifndef FC_TEST_CUDA_UTIL_H
#define FC_TEST_CUDA_UTIL_H

#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "flashcore.h"
#include "kit.h"
#include "test_util.h"

/* ---- device buffers ------------------------------------------------------------ */

typedef struct dev_case {
    void *q, *k, *v, *out;
    float *lse;
    int32_t *cu_q, *cu_k, *block_table, *seqused_k;
    void *k_new, *v_new, *rot_cos, *rot_sin; /* the append step's (kit_append.c) */
    float *descale[3];                       /* FP8: q, k, v descales (kit.c init_fp8) */
    fc_attention_args args; /* = the host case's args with device pointers */
} dev_case;

static inline void dev_free(dev_case *d)
{
    cudaFree(d->q); cudaFree(d->k); cudaFree(d->v); cudaFree(d->out);
    cudaFree(d->lse); cudaFree(d->cu_q); cudaFree(d->cu_k);
    cudaFree(d->block_table); cudaFree(d->seqused_k);
    cudaFree(d->k_new); cudaFree(d->v_new); cudaFree(d->rot_cos); cudaFree(d->rot_sin);
    for (int i = 0; i < 3; i++) cudaFree(d->descale[i]);
    memset(d, 0, sizeof *d);
}

/* a (a host case's args) moved onto d's buffers and the CUDA backend. */
static inline void dev_point(const dev_case *d, fc_attention_args *a)
{
    a->q.data = d->q;
    a->k.data = d->k;
    a->v.data = d->v;
    a->out.data = d->out;
    a->lse.data = a->lse.data ? d->lse : NULL;
    a->cu_seqlens_q = d->cu_q;
    a->cu_seqlens_k = d->cu_k;
    a->block_table = d->block_table;
    a->seqused_k = d->seqused_k;
    a->k_new.data = a->k_new.data ? d->k_new : NULL;
    a->v_new.data = a->v_new.data ? d->v_new : NULL;
    a->rotary_cos.data = a->rotary_cos.data ? d->rot_cos : NULL;
    a->rotary_sin.data = a->rotary_sin.data ? d->rot_sin : NULL;
    a->q_descale.data = d->descale[0];
    a->k_descale.data = d->descale[1];
    a->v_descale.data = d->descale[2];
    a->backend = FC_BACKEND_CUDA;
}

static inline int dev_upload(const kit_case *c, dev_case *d, char *err, size_t err_len)
{
    memset(d, 0, sizeof *d);
    cudaError_t e = cudaSuccess;
#define UP(dst, src, bytes)                                                                  \
    do {                                                                                     \
        if (e == cudaSuccess) e = cudaMalloc((void **)&(dst), (bytes));                     \
        if (e == cudaSuccess) e = cudaMemcpy((dst), (src), (bytes), cudaMemcpyHostToDevice); \
    } while (0)
    UP(d->q, c->q, c->q_bytes);
    UP(d->k, c->k, c->k_bytes);
    UP(d->v, c->v, c->v_bytes);
    UP(d->out, c->out, c->out_bytes); /* c->out holds the poison */
    if (c->lse) UP(d->lse, c->lse, c->lse_bytes);
    if (c->cu_q) {
        UP(d->cu_q, c->cu_q, ((size_t)c->s.batch + 1) * sizeof(int32_t));
        UP(d->cu_k, c->cu_k, ((size_t)c->s.batch + 1) * sizeof(int32_t));
    }
    if (c->block_table) UP(d->block_table, c->block_table, c->table_bytes);
    if (c->seqused_k) UP(d->seqused_k, c->seqused_k, c->used_bytes);
    if (c->k_new) {
        UP(d->k_new, c->k_new, c->new_bytes);
        UP(d->v_new, c->v_new, c->new_bytes);
    }
    if (c->rot_cos) {
        UP(d->rot_cos, c->rot_cos, c->rot_bytes);
        UP(d->rot_sin, c->rot_sin, c->rot_bytes);
    }
    const size_t nds = (size_t)kit_descale_count(&c->s) * sizeof(float);
    for (int i = 0; i < 3; i++)
        if (c->descale[i]) UP(d->descale[i], c->descale[i], nds);
#undef UP
    /* A cudaMemcpy from pageable memory may return before its DMA has
     * landed, and the kernel runs on a non-blocking stream that does not
     * wait for it: wait here (see dev_run). */
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        snprintf(err, err_len, "device setup: %s", cudaGetErrorString(e));
        dev_free(d);
        return -1;
    }
    d->args = c->args;
    dev_point(d, &d->args);
    return 0;
}

/* Poison out/lse on the device, run, wait, copy back into out/lse. */
static inline fc_status dev_run(fc_context *ctx, const kit_case *c, dev_case *d, cudaStream_t stream,
                                void *out, float *lse, fc_kernel_info *info, char *err, size_t err_len)
{
    kit_poison(out, c->out_bytes, kit_out_dtype(&c->s), lse, c->lse_bytes);
    cudaError_t e = cudaMemcpy(d->out, out, c->out_bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && lse) e = cudaMemcpy(d->lse, lse, c->lse_bytes, cudaMemcpyHostToDevice);
    /* The poison must have landed before the kernel starts: a cudaMemcpy from
     * pageable memory returns once the data is staged, not written, and the
     * kernel's stream is non-blocking. Without this wait the tail of the
     * poison DMA overwrote the first outputs a kernel wrote (the zeros of
     * tiles that see no key), now and then: a "rerun DIFFERENT" with
     * poisoned outputs in a correct kernel. */
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        snprintf(err, err_len, "poisoning: %s", cudaGetErrorString(e));
        return FC_ERR_CUDA;
    }
    fc_status st = fc_attention_forward(ctx, &d->args, (void *)stream, info);
    if (st != FC_OK) {
        snprintf(err, err_len, "%s: %s", fc_status_string(st), fc_last_error(ctx));
        return st;
    }
    e = cudaStreamSynchronize(stream);
    if (e == cudaSuccess) e = cudaMemcpy(out, d->out, c->out_bytes, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess && lse) e = cudaMemcpy(lse, d->lse, c->lse_bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        snprintf(err, err_len, "after the kernel: %s", cudaGetErrorString(e));
        return FC_ERR_CUDA;
    }
    return FC_OK;
}

/* A case with its fp64 reference (out, lse) on the host and its copy on
 * the device. */
typedef struct tcu_ref_case {
    kit_case c;
    dev_case d;
    void *ref;
    float *ref_lse;
} tcu_ref_case;

/* r for shape s: 0, or -1 with err (nothing left to free). */
static inline int tcu_ref_case_init(fc_context *ctx, const kit_shape *s, uint64_t seed, tcu_ref_case *r, char *err,
                                    size_t n)
{
    memset(r, 0, sizeof *r);
    if (kit_case_init(&r->c, s, seed)) {
        snprintf(err, n, "no memory for the case");
        return -1;
    }
    r->ref = malloc(r->c.out_bytes);
    r->ref_lse = r->c.lse ? malloc(r->c.lse_bytes) : NULL;
    if (!r->ref || (r->c.lse && !r->ref_lse)) snprintf(err, n, "no memory for the reference");
    else if (test_reference(ctx, &r->c, r->ref, r->ref_lse) != FC_OK) snprintf(err, n, "reference: %s", fc_last_error(ctx));
    else if (dev_upload(&r->c, &r->d, err, n) == 0) return 0;
    kit_case_free(&r->c);
    free(r->ref);
    free(r->ref_lse);
    return -1;
}

static inline void tcu_ref_case_free(tcu_ref_case *r)
{
    dev_free(&r->d);
    kit_case_free(&r->c);
    free(r->ref);
    free(r->ref_lse);
}

/* The current device's compute capability as major * 10 + minor (0 if
 * the runtime cannot say). */
static inline int tcu_device_cc(void)
{
    int dev = 0;
    struct cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return 0;
    return prop.major * 10 + prop.minor;
}

/* ---- the CUDA paths ----------------------------------------------------------------- */

/* The kernel families (fc_context_set_cuda_path 80 and 90) a test asks for,
 * and whether this device and build run each, with the reason if not. */
typedef struct tcu_paths {
    int n;
    int path[2], ok[2];
    char why[2][200];
} tcu_paths;

/* Probe each path (only_path 0: both) on a shape both families cover;
 * prints a line per path. */
static inline void tcu_probe_paths(fc_context *ctx, int only_path, tcu_paths *p)
{
    static const int all_paths[2] = {80, 90};
    memset(p, 0, sizeof *p);
    for (int i = 0; i < 2; i++) {
        if (only_path && all_paths[i] != only_path) continue;
        const int n = p->n++;
        kit_shape s = test_shape(1, 2, 2, 64, 64, 128, FC_DTYPE_BF16);
        kit_case c;
        dev_case d;
        char err[300];
        p->path[n] = all_paths[i];
        snprintf(p->why[n], sizeof p->why[n], "path %d: probe failed", all_paths[i]);
        if (kit_case_init(&c, &s, 1) == 0 && dev_upload(&c, &d, err, sizeof err) == 0) {
            fc_context_set_cuda_path(ctx, all_paths[i]);
            const fc_status st = fc_attention_supported(ctx, &d.args, NULL);
            p->ok[n] = st == FC_OK;
            if (st != FC_OK)
                snprintf(p->why[n], sizeof p->why[n], "path %d unavailable: %.170s", all_paths[i], fc_last_error(ctx));
            fc_context_set_cuda_path(ctx, 0);
            dev_free(&d);
        }
        kit_case_free(&c);
        printf("path %d: %s\n", all_paths[i], p->ok[n] ? "available" : p->why[n]);
    }
}

#endif /* FC_TEST_CUDA_UTIL_H */
