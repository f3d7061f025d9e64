/*
 * dispatch.c -- the one selection function. fc_attention_supported and
 * fc_attention_forward both call fc_select, so "supported?" and "what runs"
 * can never disagree. It picks the backend (from the request and where the
 * pointers live), the kernel family and tile config (through the per-path
 * planners), and the split-KV count; or it says why nothing fits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "validate.h"

int fc_choose_num_splits(int64_t tiles, int n_blocks, int sm_count, int max_splits)
{
    /* A grid that already fills most of the SMs gains nothing from splitting;
     * nor does a KV range of a few blocks (the combine pass would cost more). */
    if (tiles <= 0 || sm_count <= 0 || tiles >= (int64_t)sm_count * 8 / 10 || n_blocks <= 4) return 1;
    if (max_splits > n_blocks) max_splits = n_blocks;
    if (max_splits > FC_MAX_SPLITS) max_splits = FC_MAX_SPLITS;
    /* Wave efficiency of s splits: the fraction of SM slots busy over the
     * waves the grid needs. Take the smallest s within 85% of the best. */
    double eff[FC_MAX_SPLITS + 1] = {0};
    double best = 0;
    for (int s = 1; s <= max_splits; s++) {
        double waves = (double)(tiles * s) / sm_count;
        double full = (double)((tiles * s + sm_count - 1) / sm_count);
        eff[s] = waves / full;
        if (eff[s] > best) best = eff[s];
    }
    for (int s = 1; s <= max_splits; s++)
        if (eff[s] >= 0.85 * best) return s;
    return 1;
}

static const char *backend_name(fc_backend b)
{
    switch (b) {
    case FC_BACKEND_AUTO: return "auto";
    case FC_BACKEND_CPU: return "cpu";
    case FC_BACKEND_CUDA: return "cuda";
    case FC_BACKEND_CPU_REFERENCE: return "cpu-reference";
    }
    return "?";
}

/* Every pointer a call reads or writes, with its name, for the memory-space
 * check; b: the backward's params (p is then &b->f), else NULL. */
static int list_pointers(const fc_fwd_params *p, const fc_bwd_params *b, const void *ptrs[12],
                         const char *names[12])
{
    int n = 0;
    ptrs[n] = p->q; names[n++] = "q";
    ptrs[n] = p->k; names[n++] = "k";
    ptrs[n] = p->v; names[n++] = "v";
    ptrs[n] = p->o; names[n++] = "out";
    if (p->lse) { ptrs[n] = p->lse; names[n++] = "lse"; }
    if (p->cu_seqlens_q) {
        ptrs[n] = p->cu_seqlens_q; names[n++] = "cu_seqlens_q";
        ptrs[n] = p->cu_seqlens_k; names[n++] = "cu_seqlens_k";
    }
    if (b) {
        ptrs[n] = b->dout; names[n++] = "dout";
        ptrs[n] = b->dq; names[n++] = "dq";
        ptrs[n] = b->dk; names[n++] = "dk";
        ptrs[n] = b->dv; names[n++] = "dv";
        if (b->workspace) { ptrs[n] = b->workspace; names[n++] = "workspace"; }
    }
    return n;
}

/* All pointers must live where the backend runs. Only answerable when the
 * CUDA runtime is compiled in; without it every pointer is host memory.
 * q_known: q's memory space was already established (AUTO asked it), so it
 * is not queried again (each query is a driver call on the hot path). */
static fc_status check_memory_space(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *b,
                                    int want_device, int q_known)
{
    if (!fc_cuda_compiled()) return FC_OK;
    const void *ptrs[12];
    const char *names[12];
    int n = list_pointers(p, b, ptrs, names);
    for (int i = q_known ? 1 : 0; i < n; i++) { /* q is ptrs[0] */
        int dev = fc_cuda_pointer_is_device(ptrs[i]);
        if (dev != want_device)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s is %s memory but the %s backend needs %s pointers", names[i],
                                dev ? "device" : "host", want_device ? "cuda" : "cpu",
                                want_device ? "device" : "host");
    }
    return FC_OK;
}

static fc_status select_cpu(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *bwd, fc_backend b,
                            int q_known, fc_plan *plan)
{
    if (p->dtype != FC_DTYPE_F32 && p->dtype != FC_DTYPE_F16 && p->dtype != FC_DTYPE_BF16)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED, "dtype %d is not supported by the cpu backend",
                            (int)p->dtype);
    if (p->head_dim > FC_CPU_MAX_HEAD_DIM)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "head_dim %d is not supported by the cpu backend: supported 1 to %d",
                            (int)p->head_dim, FC_CPU_MAX_HEAD_DIM);
    fc_status st = check_memory_space(ctx, p, bwd, 0, q_known);
    if (st) return st;
    /* Always validated on the host (cheap), even when nothing is to be done:
     * "nothing" may rest on max_seqlen_q == 0, which only cu_seqlens confirm. */
    if (p->cu_seqlens_q) {
        st = fc_check_varlen(ctx, p, p->cu_seqlens_q, p->cu_seqlens_k);
        if (st) return st;
    }
    plan->backend = b;
    snprintf(plan->name, sizeof plan->name, "%s", b == FC_BACKEND_CPU ? "cpu_tiled" : "cpu_reference");
    plan->num_splits = 1;
    return FC_OK;
}

/* Validate device-resident cu_seqlens through one small synchronous copy.
 * While the stream is being captured a copy would break the capture, so the
 * check is skipped (documented in docs/API.md). */
static fc_status check_device_varlen(fc_context *ctx, const fc_fwd_params *p, void *stream)
{
    if (fc_cuda_stream_is_capturing(stream)) return FC_OK;
    size_t bytes = ((size_t)p->batch + 1) * sizeof(int32_t);
    int32_t *h = malloc(2 * bytes);
    if (!h) return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", 2 * bytes);
    fc_status st = fc_cuda_copy_to_host(h, p->cu_seqlens_q, bytes, stream, ctx->err, sizeof ctx->err);
    if (!st) st = fc_cuda_copy_to_host(h + p->batch + 1, p->cu_seqlens_k, bytes, stream, ctx->err, sizeof ctx->err);
    if (!st) st = fc_check_varlen(ctx, p, h, h + p->batch + 1);
    free(h);
    return st;
}

/* What every CUDA plan needs: the device, every pointer in device memory,
 * a dtype the kernels take, and valid cu_seqlens whenever they are given,
 * forward and backward, whatever the token counts: with no query token
 * nothing is written, but bad offsets are still an error, as on the CPU
 * backends, so that every backend answers a call alike. */
static fc_status cuda_common(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *bwd, int q_known,
                             void *stream, fc_plan *plan)
{
    fc_status st = fc_cuda_get_device(ctx->device, &plan->dev, ctx->err, sizeof ctx->err);
    if (st) return st;
    st = check_memory_space(ctx, p, bwd, 1, q_known);
    if (st) return st;
    if (p->dtype != FC_DTYPE_F16 && p->dtype != FC_DTYPE_BF16)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "dtype %s is not supported by the cuda kernels: supported f16, bf16 (the cpu "
                            "backend takes f32)", p->dtype == FC_DTYPE_F32 ? "f32" : "fp8");
    return p->cu_seqlens_q ? check_device_varlen(ctx, p, stream) : FC_OK;
}

/* The backward on CUDA: the sm80-class kernels (they run on sm_90 too; the
 * Hopper backward is not built yet, so a forced path 90 is unsupported). */
static fc_status select_cuda_bwd(fc_context *ctx, const fc_bwd_params *b, fc_plan *plan)
{
    if (ctx->cuda_path == 90)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "the Hopper (sm90) path has no backward yet: use cuda path 0 (auto) or 80");
    fc_cuda_choice *ch = &plan->cuda;
    memset(ch, 0, sizeof *ch);
    char why[FC_ERRMSG_LEN] = "";
    fc_status st = fc_sm80_bwd_plan(b, &plan->dev, &ctx->tuning, ch, why, sizeof why);
    if (st) return fc_set_error(ctx, st, "%s", why);
    ch->path = FC_CUDA_PATH_SM80;
    ch->num_splits = 1;
    ch->pdl = plan->dev.cc_major >= 9 && ctx->tuning.pdl != 0; /* as the forward (select_cuda) */
    if (b->workspace && b->workspace_bytes < ch->workspace_bytes)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "workspace_bytes %lld is too small: this call needs %lld (see "
                            "fc_attention_backward_supported)", (long long)b->workspace_bytes,
                            (long long)ch->workspace_bytes);
    plan->backend = FC_BACKEND_CUDA;
    plan->num_splits = 1;
    plan->workspace_bytes = ch->workspace_bytes;
    snprintf(plan->name, sizeof plan->name, "%s", ch->name);
    return FC_OK;
}

static fc_status select_cuda(fc_context *ctx, const fc_fwd_params *p, fc_plan *plan)
{
    const fc_cuda_device *dev = &plan->dev;
    fc_status st;
    const int hopper = dev->cc_major == 9 && dev->cc_minor == 0;
    const int try90 = ctx->cuda_path == 90 || (ctx->cuda_path == 0 && hopper);
    const int try80 = ctx->cuda_path != 90;
    char why90[FC_ERRMSG_LEN] = "", why80[FC_ERRMSG_LEN] = "";
    fc_cuda_choice *ch = &plan->cuda;
    memset(ch, 0, sizeof *ch);
    st = FC_ERR_UNSUPPORTED;
    if (try90) {
        if (!hopper) {
            snprintf(why90, sizeof why90, "the sm90 path needs an sm_90 device, this is %s (sm_%d%d)",
                     dev->name, dev->cc_major, dev->cc_minor);
        } else {
            st = fc_sm90_plan(p, dev, &ctx->tuning, ch, why90, sizeof why90);
            if (st == FC_OK) ch->path = FC_CUDA_PATH_SM90;
        }
    }
    if (st != FC_OK && try80) {
        memset(ch, 0, sizeof *ch);
        st = fc_sm80_plan(p, dev, &ctx->tuning, ch, why80, sizeof why80);
        if (st == FC_OK) ch->path = FC_CUDA_PATH_SM80;
    }
    if (st != FC_OK) {
        if (st != FC_ERR_UNSUPPORTED) /* a real error (e.g. CUDA) from a planner */
            return fc_set_error(ctx, st, "%s", why90[0] && !try80 ? why90 : (why80[0] ? why80 : why90));
        if (try90 && try80)
            return fc_set_error(ctx, FC_ERR_UNSUPPORTED, "%s; %s", why90, why80);
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED, "%s", try90 ? why90 : why80);
    }
    /* Split-KV when the grid would leave SMs idle (decode above all). Varlen
     * problems are not split: their per-sequence lengths are only known on
     * the device. */
    int bm = 1, bn = 1;
    fc_cuda_tile_shape(ch, &bm, &bn);
    int64_t rows = ch->pack_gqa ? (int64_t)p->seqlen_q * (p->heads_q / p->heads_kv) : p->seqlen_q;
    int64_t heads = ch->pack_gqa ? p->heads_kv : p->heads_q;
    int64_t tiles = (int64_t)p->batch * heads * ((rows + bm - 1) / bm);
    int n_blocks = (int)((p->seqlen_k + bn - 1) / bn);
    int splits = p->cu_seqlens_q ? 1 : fc_choose_num_splits(tiles, n_blocks, dev->sm_count, FC_MAX_SPLITS);
    /* tuning.splits (an A/B hook): that many splits instead, at most one per
     * KV block; the plan name shows it. */
    const int forced_splits = ctx->tuning.splits;
    if (!p->cu_seqlens_q && forced_splits >= 1)
        splits = forced_splits < n_blocks ? forced_splits : (n_blocks > 0 ? n_blocks : 1);
    ch->num_splits = splits;
    /* Programmatic dependent launch (common/pdl.cuh): sm_90 or newer (a 9.x
     * device runs only this library's sm_90/90a images, each compiled with
     * the kernel-side wait), unless tuning.pdl is 0. */
    ch->pdl = dev->cc_major >= 9 && ctx->tuning.pdl != 0;
    /* A split replaces the planner's tail balancing (for unsplit grids of
     * several rounds; otherwise its workspace came with the plan). */
    if (splits > 1) {
        ch->tail = 0;
        ch->workspace_bytes = fc_cuda_split_workspace_bytes(p, splits);
    }
    plan->backend = FC_BACKEND_CUDA;
    plan->num_splits = splits;
    plan->workspace_bytes = ch->workspace_bytes;
    if (splits > 1)
        snprintf(plan->name, sizeof plan->name, "%.78s+split%d", ch->name, splits);
    else
        snprintf(plan->name, sizeof plan->name, "%.88s%s", ch->name, ch->tail ? "+tail" : "");
    return FC_OK;
}

fc_status fc_select(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *bwd, fc_backend requested,
                    void *stream, fc_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    fc_backend b = requested;
    /* AUTO goes where q lives; that answer then also stands for q's check. */
    const int q_known = b == FC_BACKEND_AUTO && fc_cuda_compiled();
    if (b == FC_BACKEND_AUTO) b = (q_known && fc_cuda_pointer_is_device(p->q)) ? FC_BACKEND_CUDA : FC_BACKEND_CPU;
    switch (b) {
    case FC_BACKEND_CPU:
    case FC_BACKEND_CPU_REFERENCE: return select_cpu(ctx, p, bwd, b, q_known, plan);
    case FC_BACKEND_CUDA: {
        fc_status st = cuda_common(ctx, p, bwd, q_known, stream, plan);
        if (st) return st;
        return bwd ? select_cuda_bwd(ctx, bwd, plan) : select_cuda(ctx, p, plan);
    }
    default: return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "backend %s is invalid", backend_name(b));
    }
}

fc_status fc_run(fc_context *ctx, const fc_fwd_params *p, const fc_plan *plan, void *stream)
{
    switch (plan->backend) {
    case FC_BACKEND_CPU_REFERENCE: return fc_cpu_reference_forward(p, ctx->err, sizeof ctx->err);
    case FC_BACKEND_CPU: return fc_cpu_tiled_forward(p, ctx->num_threads, ctx->err, sizeof ctx->err);
    case FC_BACKEND_CUDA: {
        fc_fwd_params q = *p;
        q.num_splits = plan->num_splits;
        return fc_cuda_forward(&q, &plan->cuda, &plan->dev, stream, ctx->err, sizeof ctx->err);
    }
    default:
        return fc_set_error(ctx, FC_ERR_INTERNAL, "plan has no backend (%s)", backend_name(plan->backend));
    }
}

fc_status fc_run_backward(fc_context *ctx, const fc_bwd_params *p, const fc_plan *plan, void *stream)
{
    switch (plan->backend) {
    case FC_BACKEND_CPU_REFERENCE: return fc_cpu_reference_backward(p, ctx->err, sizeof ctx->err);
    case FC_BACKEND_CPU: return fc_cpu_tiled_backward(p, ctx->num_threads, ctx->err, sizeof ctx->err);
    case FC_BACKEND_CUDA: return fc_cuda_backward(p, &plan->cuda, &plan->dev, stream, ctx->err, sizeof ctx->err);
    default:
        return fc_set_error(ctx, FC_ERR_INTERNAL, "plan has no backend (%s)", backend_name(plan->backend));
    }
}
