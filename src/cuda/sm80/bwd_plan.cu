/*
 * bwd_plan.cu -- the sm80-class backward's planner and path launcher:
 *   fc_sm80_bwd_plan       can this path run p on dev, with which backward
 *                          tile row, and how much workspace it needs
 *   fc_sm80_bwd_common     the checks every CUDA backward shares (the
 *                          Hopper planner runs them too: it uses this
 *                          path's preprocess and convert kernels)
 *   fc_sm80_bwd_workspace  the workspace layout (the one place it is sized)
 *   fc_bwd_group_splits    CTAs per key block on small GQA grids (both paths)
 *   fc_sm80_bwd_fill_args  the kernels' argument block (both paths)
 *   fc_sm80_backward       fill the kernels' args and launch the row's
 *                          (dtype, head_dim) unit (fc_cuda_backward,
 *                          launch.cu, provides the workspace)
 * Host code only; .cu so that it can read the constexpr table.
 */
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda/common/plan_names.cuh"
#include "cuda/sm80/bwd_args.h"
#include "cuda/sm80/bwd_tiles.cuh"
#include "cuda/sm80/plan_checks.h"

namespace {

using fc::sm80::BwdTile;
using fc::sm80::kBwdTiles;
using fc::sm80::kNumBwdTiles;

/* Whether row t can run head_dim hd on dev (class cls): its head dim, the
 * device's shared memory, and a kernel there (an SM90-only row is empty
 * below sm_90). */
bool bwd_tile_runs(const BwdTile &t, int cls, int hd, const fc_cuda_device *dev)
{
    return t.head_dim == hd && fc::sm80::bwd_smem_bytes(t) <= dev->smem_optin &&
           (cls == fc::sm80::kClassSm90 || !fc::sm80::bwd_tile_sm90_only(t));
}

/* The tuning hook's row (tune->sm80_bwd_config) when it runs hd; else the
 * class's row; without one (a part reporting less smem than its class),
 * the smallest-smem row of any class that runs it. -1 if none. */
int pick_bwd_tile(int cls, int hd, const fc_cuda_device *dev, const fc_tuning *tune)
{
    const int forced = tune->sm80_bwd_config;
    if (forced >= 0 && forced < kNumBwdTiles && bwd_tile_runs(kBwdTiles[forced], cls, hd, dev)) return forced;
    int best = -1;
    for (int i = 0; i < kNumBwdTiles; ++i) {
        const BwdTile &t = kBwdTiles[i];
        if (!bwd_tile_runs(t, cls, hd, dev)) continue;
        if (t.arch_class == cls) return i;
        if (best < 0 || fc::sm80::bwd_smem_bytes(t) < fc::sm80::bwd_smem_bytes(kBwdTiles[best])) best = i;
    }
    return best;
}

/* Whether the table has a row of head_dim hd; into list its head dims in
 * table order ("32, 64, ..."), for the refusal. */
bool bwd_head_dim_listed(int hd, char *list, size_t len)
{
    bool found = false;
    size_t at = 0;
    list[0] = '\0';
    for (int i = 0; i < kNumBwdTiles; ++i) {
        const int d = kBwdTiles[i].head_dim;
        found = found || d == hd;
        bool seen = false;
        for (int j = 0; j < i && !seen; ++j) seen = kBwdTiles[j].head_dim == d;
        if (!seen && at < len) at += (size_t)snprintf(list + at, len - at, "%s%d", at ? ", " : "", d);
    }
    return found;
}

int64_t round256(int64_t x) { return (x + 255) / 256 * 256; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

} /* namespace */

extern "C" fc_sm80_bwd_ws fc_sm80_bwd_workspace(const fc_bwd_params *p, int block_m, int dq_chunk,
                                                 int group_splits)
{
    const fc_fwd_params *f = &p->f;
    fc_sm80_bwd_ws w;
    memset(&w, 0, sizeof w);
    w.rows = f->cu_seqlens_q ? f->total_q : (int64_t)f->batch * f->seqlen_q;
    /* chunked: each sequence's rows start at a multiple of dq_chunk, at most
     * dq_chunk rows after its token offset plus dq_chunk per earlier sequence */
    w.dq_rows = dq_chunk == 0 ? w.rows
                : f->cu_seqlens_q ? f->total_q + (int64_t)(f->batch + 1) * dq_chunk
                                  : (int64_t)f->batch * ceil_div(f->seqlen_q, dq_chunk) * dq_chunk;
    w.k_rows = f->cu_seqlens_k ? f->total_k : (int64_t)f->batch * f->seqlen_k;
    const int64_t per_head = w.rows * (int64_t)sizeof(float);
    w.dq_off = 0;
    w.dkv_off = round256(w.dq_rows * f->heads_q * f->head_dim * (int64_t)sizeof(float));
    w.dkv_bytes = group_splits > 1 ? round256(2 * w.k_rows * f->heads_kv * f->head_dim * (int64_t)sizeof(float)) : 0;
    w.dsum_off = w.dkv_off + w.dkv_bytes;
    w.lse2_off = w.dsum_off + round256(f->heads_q * per_head);
    w.sems_off = w.lse2_off + round256(f->heads_q * per_head);
    w.n_sems = p->deterministic ? (int64_t)f->batch * f->heads_q * ceil_div(f->seqlen_q, block_m) : 0;
    w.bytes = w.sems_off + round256(w.n_sems * (int64_t)sizeof(int32_t));
    return w;
}

extern "C" int fc_bwd_group_splits(const fc_bwd_params *b, int64_t ctas, int64_t slots)
{
    const int group = b->f.heads_q / b->f.heads_kv;
    int s = 1;
    while (!b->deterministic && group % (2 * s) == 0 && ctas * 2 * s <= slots) s *= 2;
    return s;
}

extern "C" fc_status fc_sm80_bwd_common(const fc_bwd_params *b, const fc_cuda_device *dev, int *cls, char *why,
                                       size_t why_len)
{
    const fc_fwd_params *p = &b->f;
    if (p->dtype != FC_DTYPE_F16 && p->dtype != FC_DTYPE_BF16) {
        snprintf(why, why_len, "dtype %s is not supported by the CUDA backward: supported f16, bf16",
                 fc_dtype_name(p->dtype));
        return FC_ERR_UNSUPPORTED;
    }
    const fc_sm80_tensor_ref grads[5] = {
        {"out", p->o, p->o_batch_stride, p->o_row_stride, p->o_head_stride},
        {"dout", b->dout, b->do_batch_stride, b->do_row_stride, b->do_head_stride},
        {"dq", b->dq, b->dq_batch_stride, b->dq_row_stride, b->dq_head_stride},
        {"dk", b->dk, b->dk_batch_stride, b->dk_row_stride, b->dk_head_stride},
        {"dv", b->dv, b->dv_batch_stride, b->dv_row_stride, b->dv_head_stride}};
    int c = -1;
    return fc_sm80_common_checks(p, dev, grads, 5, cls ? cls : &c, why, why_len);
}

extern "C" int fc_sm80_bwd_tile_row(int i, fc_tile_row *row)
{
    if (i < 0 || i >= kNumBwdTiles) return 0;
    const BwdTile &t = kBwdTiles[i];
    int kernel = 0;
    while (!fc::sm80::same_bwd_kernel(kBwdTiles[kernel], t)) ++kernel;
    /* stages 2: the Q and dO buffers */
    *row = fc_sm80_listed_row(t.head_dim, t.block_m, t.block_n, t.warps, 2, t.ctas, t.arch_class, 0, kernel);
    return 1;
}

extern "C" fc_status fc_sm80_bwd_plan(const fc_bwd_params *b, const fc_cuda_device *dev, const fc_tuning *tune,
                                      fc_cuda_choice *choice, char *why, size_t why_len)
{
    const fc_fwd_params *p = &b->f;
    const int hd = p->head_dim;
    char dims[64];
    if (!bwd_head_dim_listed(hd, dims, sizeof dims)) {
        snprintf(why, why_len, "head_dim %d is not supported by the sm80 backward: supported %s", hd, dims);
        return FC_ERR_UNSUPPORTED;
    }
    int cls = -1;
    const fc_status st = fc_sm80_bwd_common(b, dev, &cls, why, why_len);
    if (st != FC_OK) return st;
    const int cfg = pick_bwd_tile(cls, hd, dev, tune);
    if (cfg < 0) {
        snprintf(why, why_len,
                 "device %s allows %lld bytes of shared memory per block: no sm80 backward tile for head_dim %d fits",
                 dev->name, (long long)dev->smem_optin, hd);
        return FC_ERR_UNSUPPORTED;
    }
    const BwdTile &t = kBwdTiles[cfg];
    const int64_t grid = ceil_div(p->seqlen_k, t.block_n) * p->batch * p->heads_kv;
    if (grid > INT_MAX) {
        snprintf(why, why_len, "the sm80 backward grid would have %lld CTAs (limit %d): batch*heads_kv*seqlen_k too large",
                 (long long)grid, INT_MAX);
        return FC_ERR_UNSUPPORTED;
    }
    choice->path = FC_CUDA_PATH_SM80;
    choice->config = cfg;
    choice->num_splits = 1;
    const int gs = fc_bwd_group_splits(b, grid, (int64_t)dev->sm_count * t.ctas);
    choice->group_splits = gs;
    choice->workspace_bytes = fc_sm80_bwd_workspace(b, t.block_m, 0, gs).bytes;
    /* formatted once per thread and key (common/plan_names.cuh) */
    static thread_local PlanNames names;
    const int32_t key[PlanNames::K] = {cfg, p->dtype, b->deterministic, gs, 0, 0};
    if (plan_name_get(names, key, choice->name)) return FC_OK;
    char split[16] = "";
    if (gs > 1) snprintf(split, sizeof split, "_g%d", gs);
    snprintf(choice->name, sizeof choice->name, "sm80_bwd_%s_d%d_m%dn%d%s%s", fc_dtype_name(p->dtype), hd,
             t.block_m, t.block_n, split, b->deterministic ? "_det" : "");
    plan_name_put(names, key, choice->name);
    return FC_OK;
}

extern "C" void fc_sm80_bwd_fill_args(const fc_bwd_params *b, int block_m, int block_n, int dq_chunk,
                                      int group_splits, void *workspace, int pdl, fc_sm80_bwd_args *a)
{
    const fc_fwd_params *p = &b->f;
    const fc_sm80_bwd_ws w = fc_sm80_bwd_workspace(b, block_m, dq_chunk, group_splits);
    memset(a, 0, sizeof *a);
    a->p = *b;
    unsigned char *ws = (unsigned char *)workspace;
    if (w.bytes > 0) {
        a->dq_accum = (float *)(ws + w.dq_off);
        a->dsum = (float *)(ws + w.dsum_off);
        a->lse2 = (float *)(ws + w.lse2_off);
        a->sems = w.n_sems > 0 ? (int32_t *)(ws + w.sems_off) : nullptr;
        a->dkv_accum = w.dkv_bytes > 0 ? (float *)(ws + w.dkv_off) : nullptr;
    }
    a->rows = w.rows;
    a->k_rows = w.k_rows;
    a->zero_f4 = (w.dkv_off + w.dkv_bytes) / 16;
    a->dq_rows = w.dq_rows;
    a->dq_chunk = dq_chunk;
    a->n_sems = w.n_sems;
    const float log2e = 1.4426950408889634f;
    if (p->softcap != 0.f) { /* as the forward (plan.cu, fc_sm80_forward) */
        const float cap = std::fabs(p->softcap);
        a->sl2 = cap * log2e;
        a->softcap_in = p->scale / cap;
    } else {
        a->sl2 = p->scale * log2e;
        a->softcap_in = 0.f;
    }
    a->scale = p->scale;
    a->m_blocks = (int32_t)ceil_div(p->seqlen_q, block_m);
    a->group = p->heads_q / p->heads_kv;
    while ((1 << a->split_shift) < group_splits) ++a->split_shift;
    a->group_run = a->group >> a->split_shift;
    a->heads_kv = fc_fastdiv_make(p->heads_kv);
    /* exact whenever the grid is launched (n_blocks * batch * heads_kv *
     * group_splits <= INT_MAX); a pair's split CTAs are neighbours in it */
    const int64_t pairs = std::min<int64_t>((int64_t)p->batch * p->heads_kv << a->split_shift, INT32_MAX);
    const int causal_like = fc_causal_like(p);
    a->down = b->deterministic || causal_like;
    a->order = fc_bwd_order_make((int32_t)ceil_div(p->seqlen_k, block_n), (int32_t)pairs, causal_like);
    a->pdl = pdl;
}

extern "C" fc_status fc_sm80_backward(const fc_bwd_params *b, const fc_cuda_choice *choice,
                                      const fc_cuda_device *dev, void *workspace, void *stream, char *err,
                                      size_t err_len)
{
    const fc_fwd_params *p = &b->f;
    if (choice->config < 0 || choice->config >= kNumBwdTiles || kBwdTiles[choice->config].head_dim != p->head_dim) {
        snprintf(err, err_len, "internal: sm80 backward got an invalid plan (config %d, head_dim %d)", choice->config,
                 p->head_dim);
        return FC_ERR_INTERNAL;
    }
    const BwdTile &t = kBwdTiles[choice->config];
    if (choice->workspace_bytes > 0 && !workspace) {
        snprintf(err, err_len, "internal: sm80 backward without its %lld-byte workspace",
                 (long long)choice->workspace_bytes);
        return FC_ERR_INTERNAL;
    }
    fc_sm80_bwd_args a;
    const int gs = choice->group_splits > 1 ? choice->group_splits : 1;
    fc_sm80_bwd_fill_args(b, t.block_m, t.block_n, 0, gs, workspace, choice->pdl, &a);

    const int cfg = choice->config, device = dev->id;
    const bool bf16 = p->dtype == FC_DTYPE_BF16;
    switch (p->head_dim) {
    case 32: return bf16 ? fc_sm80_bwd_launch_bf16_d32(&a, cfg, device, stream, err, err_len)
                         : fc_sm80_bwd_launch_f16_d32(&a, cfg, device, stream, err, err_len);
    case 64: return bf16 ? fc_sm80_bwd_launch_bf16_d64(&a, cfg, device, stream, err, err_len)
                         : fc_sm80_bwd_launch_f16_d64(&a, cfg, device, stream, err, err_len);
    case 96: return bf16 ? fc_sm80_bwd_launch_bf16_d96(&a, cfg, device, stream, err, err_len)
                         : fc_sm80_bwd_launch_f16_d96(&a, cfg, device, stream, err, err_len);
    case 128: return bf16 ? fc_sm80_bwd_launch_bf16_d128(&a, cfg, device, stream, err, err_len)
                          : fc_sm80_bwd_launch_f16_d128(&a, cfg, device, stream, err, err_len);
    case 256: return bf16 ? fc_sm80_bwd_launch_bf16_d256(&a, cfg, device, stream, err, err_len)
                          : fc_sm80_bwd_launch_f16_d256(&a, cfg, device, stream, err, err_len);
    default: break;
    }
    snprintf(err, err_len, "internal: sm80 backward reached head_dim %d", p->head_dim);
    return FC_ERR_INTERNAL;
}
