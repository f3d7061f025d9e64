/*
 * bwd_plan.cu -- the Hopper backward's planner and path launcher:
 *   fc_sm90_bwd_plan   can this path run b on dev, with which row of
 *                      bwd_tiles.cuh, and how much workspace it needs
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

#include "cuda/common/tma_map.h"
#include "cuda/sm90/bwd_args.h"
#include "cuda/sm90/bwd_tiles.cuh"

namespace {

using fc90::BwdRow;
using fc90::kBwdRows;
using fc90::kNumBwdRows;

const char k_bwd_tma_who[] = "the sm90 backward loads q, k, v and dout with TMA (use cuda path 80)";

int pick_bwd_row(int hd)
{
    for (int i = 0; i < kNumBwdRows; ++i)
        if (kBwdRows[i].head_dim == hd) return i;
    return -1;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The layouts TMA must load: q and dout as [rows, heads_q, batch], k and v
 * (fc_tma_kv_ok), rows reachable by int32 coordinates. */
bool bwd_tma_ok(const fc_bwd_params *b, char *why, size_t why_len)
{
    const fc_fwd_params *p = &b->f;
    const int64_t rows_q = p->cu_seqlens_q ? p->total_q : p->seqlen_q;
    if (rows_q >= ((int64_t)1 << 31) - 256) {
        snprintf(why, why_len, "%lld query rows: the sm90 backward addresses rows with int32 TMA coordinates",
                 (long long)rows_q);
        return false;
    }
    const int64_t n[3] = {rows_q, p->heads_q, fc_tma_k_batches(p)};
    const int64_t qs[3] = {p->q_row_stride, p->q_head_stride, p->q_batch_stride};
    const int64_t ds[3] = {b->do_row_stride, b->do_head_stride, b->do_batch_stride};
    return fc_tma_layout_ok("q", p->q, qs, n, k_bwd_tma_who, why, why_len) &&
           fc_tma_layout_ok("dout", b->dout, ds, n, k_bwd_tma_who, why, why_len) &&
           fc_tma_kv_ok(p, k_bwd_tma_who, why, why_len);
}

/* A map {head_dim, rows, heads, batches} with boxes of box_rows rows. */
fc_status encode_map(CUtensorMap *map, const char *what, const void *base, const int64_t stride[3], int64_t rows,
                     int64_t heads, int64_t batches, int box_rows, const BwdRow &t, bool bf16, char *err,
                     size_t err_len)
{
    const int64_t n[3] = {rows, heads, batches};
    uint64_t sb[3];
    fc_tma_map_strides(stride, n, 3, t.head_dim, sb);
    const uint64_t dims[4] = {(uint64_t)t.head_dim, (uint64_t)rows, (uint64_t)heads, (uint64_t)batches};
    const uint32_t box[4] = {(uint32_t)t.swz / 2, (uint32_t)box_rows, 1, 1};
    return fc_tma_encode_map(map, what, base, bf16, 4, dims, sb, box, t.swz, err, err_len);
}

/* With no query row (varlen, every sequence empty of queries) nothing is
 * loaded through the Q and dO maps, nor through K and V without a key row:
 * such a map then describes the other tensor, so that encoding cannot fail
 * on a zero extent. The caller skips the call when both are empty. */
fc_status encode_maps(fc_sm90_bwd_params &prm, const fc_bwd_params *b, const BwdRow &t, char *err, size_t err_len)
{
    const fc_fwd_params *p = &b->f;
    const bool bf16 = p->dtype == FC_DTYPE_BF16;
    const int64_t nb = fc_tma_k_batches(p), rows_q = p->cu_seqlens_q ? p->total_q : p->seqlen_q;
    const int64_t rows_k = fc_tma_k_rows(p);
    const int64_t qs[3] = {p->q_row_stride, p->q_head_stride, p->q_batch_stride};
    const int64_t ks[3] = {p->k_row_stride, p->k_head_stride, p->k_batch_stride};
    const int64_t vs[3] = {p->v_row_stride, p->v_head_stride, p->v_batch_stride};
    const int64_t ds[3] = {b->do_row_stride, b->do_head_stride, b->do_batch_stride};
    const bool no_q = rows_q == 0, no_k = rows_k == 0;
    const int64_t rq = no_q ? rows_k : rows_q, hq = no_q ? p->heads_kv : p->heads_q;
    const int64_t rk = no_k ? rows_q : rows_k, hk = no_k ? p->heads_q : p->heads_kv;
    fc_status st = encode_map(&prm.tm_q, "sm90 backward: q", no_q ? p->k : p->q, no_q ? ks : qs, rq, hq, nb,
                              t.block_m, t, bf16, err, err_len);
    if (!st) st = encode_map(&prm.tm_do, "sm90 backward: dout", no_q ? p->k : b->dout, no_q ? ks : ds, rq, hq, nb,
                             t.block_m, t, bf16, err, err_len);
    if (!st) st = encode_map(&prm.tm_k, "sm90 backward: k", no_k ? p->q : p->k, no_k ? qs : ks, rk, hk, nb,
                             t.block_n, t, bf16, err, err_len);
    if (!st) st = encode_map(&prm.tm_v, "sm90 backward: v", no_k ? p->q : p->v, no_k ? qs : vs, rk, hk, nb,
                             t.block_n, t, bf16, err, err_len);
    return st;
}

} /* namespace */

extern "C" fc_status fc_sm90_bwd_plan(const fc_bwd_params *b, const fc_cuda_device *dev, const fc_tuning *tune,
                                      fc_cuda_choice *choice, char *why, size_t why_len)
{
    (void)tune;
    const fc_fwd_params *p = &b->f;
    if (dev->cc_major != 9 || dev->cc_minor != 0) {
        snprintf(why, why_len, "the sm90 backward needs an sm_90 device (wgmma/TMA); %s is sm_%d%d", dev->name,
                 dev->cc_major, dev->cc_minor);
        return FC_ERR_UNSUPPORTED;
    }
    const int row = pick_bwd_row(p->head_dim);
    if (row < 0) {
        snprintf(why, why_len, "head_dim %d is not supported by the sm90 backward: supported 64, 96, 128",
                 (int)p->head_dim);
        return FC_ERR_UNSUPPORTED;
    }
    int cls = -1;
    fc_status st = fc_sm80_bwd_common(b, dev, &cls, why, why_len);
    if (st != FC_OK) return st;
    if ((p->cu_seqlens_q == NULL) != (p->cu_seqlens_k == NULL)) {
        snprintf(why, why_len, "the sm90 backward needs both cu_seqlens_q and cu_seqlens_k, or neither");
        return FC_ERR_UNSUPPORTED;
    }
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
    choice->workspace_bytes = fc_sm80_bwd_workspace(b, t.block_m, fc90::kBwdChunk).bytes;
    snprintf(choice->name, sizeof choice->name, "sm90_bwd_%s_d%d_m%dn%d%s", p->dtype == FC_DTYPE_BF16 ? "bf16" : "f16",
             (int)p->head_dim, t.block_m, t.block_n, b->deterministic ? "_det" : "");
    return FC_OK;
}

extern "C" fc_status fc_sm90_backward(const fc_bwd_params *b, const fc_cuda_choice *choice, const fc_cuda_device *dev,
                                      void *workspace, void *stream, char *err, size_t err_len)
{
    const fc_fwd_params *p = &b->f;
    if (choice->config < 0 || choice->config >= kNumBwdRows || kBwdRows[choice->config].head_dim != p->head_dim) {
        snprintf(err, err_len, "internal: sm90 backward got an invalid plan (row %d, head_dim %d)", choice->config,
                 (int)p->head_dim);
        return FC_ERR_INTERNAL;
    }
    const BwdRow &t = kBwdRows[choice->config];
    if (fc_sm80_bwd_workspace(b, t.block_m, fc90::kBwdChunk).bytes > 0 && !workspace) {
        snprintf(err, err_len, "internal: sm90 backward without its workspace");
        return FC_ERR_INTERNAL;
    }
    fc_sm90_bwd_params prm;
    memset(&prm, 0, sizeof prm);
    fc_sm80_bwd_fill_args(b, t.block_m, t.block_n, fc90::kBwdChunk, workspace, choice->pdl, &prm.a);
    if (prm.a.rows == 0 && fc_tma_k_rows(p) == 0) return FC_OK; /* no token: nothing to write */
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
