/*
 * launch.cu -- the CUDA layer's entry for running a planned kernel choice:
 *   fc_cuda_forward                 the append step (append.cu) where asked, split-KV
 *                                   workspace + path launcher + combine
 *   fc_cuda_backward                workspace (the caller's or stream-ordered) + the
 *                                   planned path's backward
 *   fc_cuda_merge                   fc_attention_merge's part table (stream-ordered) +
 *                                   merge.cu's launches
 *   fc_cuda_tile_shape              block_m/block_n of a choice, either path
 *   fc_cuda_split_workspace_bytes   the one place the workspace size is computed
 * and, when the Hopper path is not compiled in (FC_HAVE_SM90 == 0), its stubs.
 */
#include <cstdio>

#include <cuda_runtime.h>

#include "cuda/append.h"
#include "cuda/combine.h"
#include "cuda/common/cuda_check.h"
#include "cuda/merge.h"
#include "cuda/sm80/fwd_args.h"
#include "internal.h"

#ifndef FC_HAVE_SM90
#define FC_HAVE_SM90 0
#endif

extern "C" int64_t fc_cuda_split_workspace_bytes(const fc_fwd_params *p, int splits)
{
    if (splits <= 1) return 0;
    /* o_accum [splits][B*Hq][Sq][D] then lse_accum [splits][B*Hq][Sq], fp32 */
    return (int64_t)splits * p->batch * p->heads_q * p->seqlen_q * (p->head_dim + 1) * (int64_t)sizeof(float);
}

extern "C" void fc_cuda_tile_shape(const fc_cuda_choice *choice, int *block_m, int *block_n)
{
    if (choice->path == FC_CUDA_PATH_SM90) {
        fc_sm90_tile_shape(choice->config, block_m, block_n);
    } else if (choice->path == FC_CUDA_PATH_SM80) {
        fc_sm80_tile_shape(choice->config, block_m, block_n);
    } else {
        *block_m = 1;
        *block_n = 1;
    }
}

namespace {

/* Free ws (if any) in stream order after the kernels that use it, also
 * after an earlier failure; returns st, or the free's error when st is OK. */
fc_status ws_free(void *ws, void *stream, fc_status st, char *err, size_t err_len)
{
    if (!ws) return st;
    const cudaError_t e = cudaFreeAsync(ws, (cudaStream_t)stream);
    if (st == FC_OK) return fc_cuda_check(e, "cudaFreeAsync", err, err_len);
    if (e != cudaSuccess) cudaGetLastError();
    return st;
}

fc_status run_path(const fc_fwd_params *p, const fc_cuda_choice *choice, const fc_cuda_device *dev, void *stream,
                   char *err, size_t err_len)
{
    fc_fwd_params lp = *p;
    const int splits = choice->num_splits > 1 ? choice->num_splits : 1;
    lp.num_splits = splits;
    lp.o_accum = nullptr;
    lp.lse_accum = nullptr;

    void *ws = nullptr;
    const int64_t ws_bytes = fc_cuda_split_workspace_bytes(p, splits);
    if (splits > 1 && ws_bytes > 0) {
        char what[64];
        snprintf(what, sizeof what, "split-KV workspace for %d splits", splits);
        const fc_status st = fc_cuda_ws_alloc(&ws, ws_bytes, dev->id, stream, what, err, err_len);
        if (st != FC_OK) return st;
        lp.o_accum = static_cast<float *>(ws);
        lp.lse_accum = lp.o_accum + (int64_t)splits * p->batch * p->heads_q * p->seqlen_q * p->head_dim;
    } else {
        lp.num_splits = 1; /* nothing to split (empty problem) */
    }

    fc_status st;
    if (choice->path == FC_CUDA_PATH_SM80) {
        st = fc_sm80_forward(&lp, choice, dev, stream, err, err_len);
    } else if (choice->path == FC_CUDA_PATH_SM90) {
        st = fc_sm90_forward(&lp, choice, dev, stream, err, err_len);
    } else {
        snprintf(err, err_len, "internal: unknown CUDA path %d", choice->path);
        st = FC_ERR_INTERNAL;
    }
    if (st == FC_OK && lp.num_splits > 1) st = fc_cuda_combine_splits(&lp, choice->pdl, stream, err, err_len);

    return ws_free(ws, stream, st, err, err_len);
}

/* The append step, when the call has one, then the attention on what it
 * left (its scratch freed in stream order after both). */
fc_status run_forward(const fc_fwd_params *p, const fc_cuda_choice *choice, const fc_cuda_device *dev, void *stream,
                      char *err, size_t err_len)
{
    if (!p->app.k_new) return run_path(p, choice, dev, stream, err, err_len);
    void *ws = nullptr;
    fc_status st = fc_cuda_ws_alloc(&ws, fc_cuda_append_scratch_bytes(p), dev->id, stream, "append step", err,
                                    err_len);
    if (st != FC_OK) return st;
    fc_fwd_params lp;
    st = fc_cuda_append(p, ws, choice->pdl, stream, &lp, err, err_len);
    if (st == FC_OK) st = run_path(&lp, choice, dev, stream, err, err_len);
    return ws_free(ws, stream, st, err, err_len);
}

/* The backward: the caller's workspace or one of the library's, then the
 * planned path's kernels. */
fc_status run_backward(const fc_bwd_params *p, const fc_cuda_choice *choice, const fc_cuda_device *dev,
                       void *stream, char *err, size_t err_len)
{
    void *ws = p->workspace, *own = nullptr;
    if (!ws && choice->workspace_bytes > 0) {
        const fc_status st = fc_cuda_ws_alloc(&own, choice->workspace_bytes, -1, stream, "backward workspace", err,
                                                    err_len);
        if (st != FC_OK) return st;
        ws = own;
    }
    const fc_status st = choice->path == FC_CUDA_PATH_SM90
                             ? fc_sm90_backward(p, choice, dev, ws, stream, err, err_len)
                             : fc_sm80_backward(p, choice, dev, ws, stream, err, err_len);
    return ws_free(own, stream, st, err, err_len);
}

/* fc_attention_merge: merge.cu's launches with their part table, when the
 * parts do not fit the kernel's parameters. */
fc_status run_merge(const fc_merge_params *m, const fc_cuda_device *dev, int pdl, void *stream, char *err,
                    size_t err_len)
{
    void *table = nullptr;
    const int64_t bytes = fc_cuda_merge_table_bytes(m);
    if (bytes > 0) {
        const fc_status st = fc_cuda_ws_alloc(&table, bytes, dev->id, stream, "merge part table", err, err_len);
        if (st != FC_OK) return st;
    }
    return ws_free(table, stream, fc_cuda_merge_launch(m, table, dev, pdl, stream, err, err_len), err, err_len);
}

/* Run fn on the planned device; restore the caller's current device. A
 * thread's first call sets the device even where it is already the
 * current one: cudaGetDevice answers 0 on a new thread without making that
 * device's context current, and the TMA maps are encoded through the
 * driver API, which needs it (CUresult 201 from a fresh thread). */
template <class Fn>
fc_status on_device(const fc_cuda_device *dev, char *err, size_t err_len, Fn fn)
{
    static thread_local int made_current = -1;
    int cur = -1;
    FC_CUDA_TRY("cudaGetDevice", cudaGetDevice(&cur));
    if (cur != dev->id || made_current != dev->id) {
        FC_CUDA_TRY("cudaSetDevice", cudaSetDevice(dev->id));
        made_current = dev->id;
    }
    fc_status st = fn();
    if (cur != dev->id) {
        const cudaError_t e = cudaSetDevice(cur);
        if (st == FC_OK) st = fc_cuda_check(e, "cudaSetDevice", err, err_len);
    }
    return st;
}

} /* namespace */

extern "C" fc_status fc_cuda_forward(const fc_fwd_params *p, const fc_cuda_choice *choice,
                                     const fc_cuda_device *dev, void *stream, char *err, size_t err_len)
{
    return on_device(dev, err, err_len, [&] { return run_forward(p, choice, dev, stream, err, err_len); });
}

extern "C" fc_status fc_cuda_backward(const fc_bwd_params *p, const fc_cuda_choice *choice,
                                      const fc_cuda_device *dev, void *stream, char *err, size_t err_len)
{
    return on_device(dev, err, err_len, [&] { return run_backward(p, choice, dev, stream, err, err_len); });
}

extern "C" fc_status fc_cuda_merge(const fc_merge_params *m, const fc_cuda_device *dev, int pdl, void *stream,
                                   char *err, size_t err_len)
{
    return on_device(dev, err, err_len, [&] { return run_merge(m, dev, pdl, stream, err, err_len); });
}

#if !FC_HAVE_SM90
/* ---- the Hopper path is not compiled in: every entry says so ---- */
static const char k_no_sm90[] = "the Hopper path is not compiled in (needs 90a in FLASHCORE_CUDA_ARCHS)";

extern "C" fc_status fc_sm90_plan(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                                  fc_cuda_choice *choice, char *why, size_t why_len)
{
    snprintf(why, why_len, "%s", k_no_sm90);
    return FC_ERR_UNSUPPORTED;
}

extern "C" fc_status fc_sm90_forward(const fc_fwd_params *p, const fc_cuda_choice *choice,
                                     const fc_cuda_device *dev, void *stream, char *err, size_t err_len)
{
    snprintf(err, err_len, "%s", k_no_sm90);
    return FC_ERR_UNSUPPORTED;
}

extern "C" void fc_sm90_tile_shape(int config, int *block_m, int *block_n)
{
    *block_m = 1;
    *block_n = 1;
}

extern "C" fc_status fc_sm90_bwd_plan(const fc_bwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                                      fc_cuda_choice *choice, char *why, size_t why_len)
{
    snprintf(why, why_len, "%s", k_no_sm90);
    return FC_ERR_UNSUPPORTED;
}

extern "C" fc_status fc_sm90_backward(const fc_bwd_params *p, const fc_cuda_choice *choice,
                                      const fc_cuda_device *dev, void *workspace, void *stream, char *err,
                                      size_t err_len)
{
    snprintf(err, err_len, "%s", k_no_sm90);
    return FC_ERR_UNSUPPORTED;
}
#endif
