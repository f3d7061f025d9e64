/*
 * bwd_plan.cu -- the Hopper backward's planner and path launcher:
 *   fc_sm90_bwd_plan   can this path run b on dev, with which row of
 *                      bwd_tiles.cuh, over how many CTAs per key block
 *                      (the GQA group split), and how much workspace it
 *                      needs
 *   fc_sm90_backward   the TMA maps and the argument block, then the row's
 *                      (dtype, head_dim) launcher (fc_cuda_backward,
 *                      launch.cu, provides the workspace)
 * The checks the sm80-class backward makes come first (fc_sm80_bwd_common:
 * this path runs its preprocess and convert kernels); then what TMA and the
 * kernel need. Host code only.
 */
#include <climits>
#include <cstdio>
#include <cstring>

#include "cuda/common/plan_names.cuh"
#include "cuda/common/tma_map.h"
#include "cuda/sm90/bwd_args.h"
#include "cuda/sm90/bwd_tiles.cuh"

namespace {

using fc90::BwdRow;
using fc90::kBwdRows;
using fc90::kNumBwdRows;

const char k_bwd_tma_who[] = "the sm90 backward loads q, k, v and dout with TMA (use cuda path 80)";

bool bwd_row_runs(const BwdRow &t, int hd, bool softcap) { return t.head_dim == hd && (t.softcap || !softcap); }

/* The tuning hook's row (tune->sm90_bwd_config) when it runs the call;
 * else the first row of the call's head_dim that has its softcap kernel. */
int pick_bwd_row(int hd, bool softcap, const fc_tuning *tune)
{
    const int forced = tune->sm90_bwd_config;
    if (forced >= 0 && forced < kNumBwdRows && bwd_row_runs(kBwdRows[forced], hd, softcap)) return forced;
    for (int i = 0; i < kNumBwdRows; ++i)
        if (bwd_row_runs(kBwdRows[i], hd, softcap)) return i;
    return -1;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The layouts TMA must load: q and dout as the forward's q, k and v. */
bool bwd_tma_ok(const fc_bwd_params *b, char *why, size_t why_len)
{
    const fc_fwd_params *p = &b->f;
    const int64_t qs[3] = {p->q_row_stride, p->q_head_stride, p->q_batch_stride};
    const int64_t ds[3] = {b->do_row_stride, b->do_head_stride, b->do_batch_stride};
    return fc_tma_q_ok(p, "q", p->q, qs, k_bwd_tma_who, why, why_len) &&
           fc_tma_q_ok(p, "dout", b->dout, ds, k_bwd_tma_who, why, why_len) &&
           fc_tma_kv_ok(p, k_bwd_tma_who, why, why_len);
}

/* With no query row (varlen, every sequence empty of queries) nothing is
 * loaded through the Q and dO maps, nor through K and V without a key row:
 * such a map then describes the other tensor, so that encoding cannot fail
 * on a zero extent. The caller skips the call when both are empty. */
fc_status encode_maps(fc_sm90_bwd_params &prm, const fc_bwd_params *b, const BwdRow &t, char *err, size_t err_len)
{
    const fc_fwd_params *p = &b->f;
    const int bf16 = p->dtype == FC_DTYPE_BF16;
    const int64_t nb = fc_tma_q_batches(p), rows_q = fc_tma_q_rows(p), rows_k = fc_tma_k_rows(p);
    const int64_t qs[3] = {p->q_row_stride, p->q_head_stride, p->q_batch_stride};
    const int64_t ks[3] = {p->k_row_stride, p->k_head_stride, p->k_batch_stride};
    const int64_t vs[3] = {p->v_row_stride, p->v_head_stride, p->v_batch_stride};
    const int64_t ds[3] = {b->do_row_stride, b->do_head_stride, b->do_batch_stride};
    const bool no_q = rows_q == 0, no_k = rows_k == 0;
    const int64_t rq = no_q ? rows_k : rows_q, hq = no_q ? p->heads_kv : p->heads_q;
    const int64_t rk = no_k ? rows_q : rows_k, hk = no_k ? p->heads_q : p->heads_kv;
    const int hd = p->head_dim, bm = t.block_m, bn = t.block_n, sw = t.swz;
    fc_status st = fc_tma_encode_rows(&prm.tm_q, "sm90 backward: q", no_q ? p->k : p->q, bf16, no_q ? ks : qs, rq, hq,
                                      nb, hd, bm, sw, err, err_len);
    if (!st) st = fc_tma_encode_rows(&prm.tm_do, "sm90 backward: dout", no_q ? p->k : b->dout, bf16, no_q ? ks : ds,
                                     rq, hq, nb, hd, bm, sw, err, err_len);
    if (!st) st = fc_tma_encode_rows(&prm.tm_k, "sm90 backward: k", no_k ? p->q : p->k, bf16, no_k ? qs : ks, rk, hk,
                                     nb, hd, bn, sw, err, err_len);
    if (!st) st = fc_tma_encode_rows(&prm.tm_v, "sm90 backward: v", no_k ? p->q : p->v, bf16, no_k ? qs : vs, rk, hk,
                                     nb, hd, bn, sw, err, err_len);
    return st;
}

} /* namespace */

extern "C" fc_status fc_sm90_bwd_plan(const fc_bwd_params *b, const fc_cuda_device *dev, const fc_tuning *tune,
                                      fc_cuda_choice *choice, char *why, size_t why_len)
{
    const fc_fwd_params *p = &b->f;
    if (dev->cc_major != 9 || dev->cc_minor != 0) {
        snprintf(why, why_len, "the sm90 backward needs an sm_90 device (wgmma/TMA); %s is sm_%d%d", dev->name,
                 dev->cc_major, dev->cc_minor);
        return FC_ERR_UNSUPPORTED;
    }
    const int row = pick_bwd_row(p->head_dim, p->softcap != 0.f, tune);
    if (row < 0) {
        snprintf(why, why_len, "head_dim %d is not supported by the sm90 backward: supported 64, 96, 128",
                 (int)p->head_dim);
        return FC_ERR_UNSUPPORTED;
    }
    fc_status st = fc_sm80_bwd_common(b, dev, NULL, why, why_len);
    if (st != FC_OK) return st;
    const BwdRow &t = kBwdRows[row];
    if (dev->smem_optin < fc90::bwd_smem_bytes(t)) {
        snprintf(why, why_len, "the sm90 backward for head_dim %d needs %d bytes of shared memory per block; %s allows %lld",
                 (int)p->head_dim, fc90::bwd_smem_bytes(t), dev->name, (long long)dev->smem_optin);
        return FC_ERR_UNSUPPORTED;
    }
    if (!bwd_tma_ok(b, why, why_len)) return FC_ERR_UNSUPPORTED;
    const int64_t grid = ceil_div(p->seqlen_k, t.block_n) * p->batch * p->heads_kv;
    if (grid > INT_MAX || p->batch > 65535 || p->heads_q > 65535) {
        snprintf(why, why_len,
                 "the sm90 backward grid would have %lld CTAs (limit %d), or its dq convert batch %d / heads %d "
                 "blocks (limit 65535)", (long long)grid, INT_MAX, (int)p->batch, (int)p->heads_q);
        return FC_ERR_UNSUPPORTED;
    }
    choice->path = FC_CUDA_PATH_SM90;
    choice->config = row;
    choice->num_splits = 1;
    /* the convert's grid.y holds the split's dK/dV heads after dQ's (bwd_convert.cuh) */
    const int gs = p->heads_q + 2LL * p->heads_kv > 65535 ? 1 : fc_bwd_group_splits(b, grid, dev->sm_count);
    choice->group_splits = gs;
    choice->workspace_bytes = fc_sm80_bwd_workspace(b, t.block_m, fc90::kBwdChunk, gs).bytes;
    /* formatted once per thread and key (common/plan_names.cuh) */
    static thread_local PlanNames names;
    const int32_t key[PlanNames::K] = {row, p->dtype, b->deterministic, gs, 0, 0};
    if (plan_name_get(names, key, choice->name)) return FC_OK;
    char split[16] = "";
    if (gs > 1) snprintf(split, sizeof split, "_g%d", gs);
    snprintf(choice->name, sizeof choice->name, "sm90_bwd_%s_d%d_m%dn%d%s%s", fc_dtype_name(p->dtype),
             (int)p->head_dim, t.block_m, t.block_n, split, b->deterministic ? "_det" : "");
    plan_name_put(names, key, choice->name);
    return FC_OK;
}

extern "C" fc_status fc_sm90_backward(const fc_bwd_params *b, const fc_cuda_choice *choice, const fc_cuda_device *dev,
                                      void *workspace, void *stream, char *err, size_t err_len)
{
    const fc_fwd_params *p = &b->f;
    if (choice->config < 0 || choice->config >= kNumBwdRows ||
        !bwd_row_runs(kBwdRows[choice->config], p->head_dim, p->softcap != 0.f)) {
        snprintf(err, err_len, "internal: sm90 backward got an invalid plan (row %d, head_dim %d)", choice->config,
                 (int)p->head_dim);
        return FC_ERR_INTERNAL;
    }
    const BwdRow &t = kBwdRows[choice->config];
    if (choice->workspace_bytes > 0 && !workspace) {
        snprintf(err, err_len, "internal: sm90 backward without its workspace");
        return FC_ERR_INTERNAL;
    }
    fc_sm90_bwd_params prm;
    memset(&prm, 0, sizeof prm);
    const int gs = choice->group_splits > 1 ? choice->group_splits : 1;
    fc_sm80_bwd_fill_args(b, t.block_m, t.block_n, fc90::kBwdChunk, gs, workspace, choice->pdl, &prm.a);
    if (fc_tma_q_rows(p) == 0 && fc_tma_k_rows(p) == 0) return FC_OK; /* no token: nothing to write */
    const fc_status st = encode_maps(prm, b, t, err, err_len);
    if (st != FC_OK) return st;
    const int row = choice->config, device = dev->id;
    const bool bf16 = p->dtype == FC_DTYPE_BF16;
    cudaStream_t s = (cudaStream_t)stream;
    switch (p->head_dim) {
    case 64: return bf16 ? fc_sm90_bwd_launch_bf16_d64(row, &prm, device, s, err, err_len)
                         : fc_sm90_bwd_launch_f16_d64(row, &prm, device, s, err, err_len);
    case 96: return bf16 ? fc_sm90_bwd_launch_bf16_d96(row, &prm, device, s, err, err_len)
                         : fc_sm90_bwd_launch_f16_d96(row, &prm, device, s, err, err_len);
    case 128: return bf16 ? fc_sm90_bwd_launch_bf16_d128(row, &prm, device, s, err, err_len)
                          : fc_sm90_bwd_launch_f16_d128(row, &prm, device, s, err, err_len);
    default: break;
    }
    snprintf(err, err_len, "internal: sm90 backward reached head_dim %d", (int)p->head_dim);
    return FC_ERR_INTERNAL;
}
