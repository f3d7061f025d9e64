/*
 * bwd_convert.cuh -- the backward's last kernel: dq = scale * dq_accum in
 * the output dtype, for every query token that belongs to a sequence
 * (varlen tokens past the last offset are not written). Rows no key sees
 * get the zeros the preprocess left. One 16-byte output chunk (8 values)
 * per thread and step, grid-stride. Where the GQA group is split over
 * CTAs (bwd_coords.cuh), the blocks after dQ's convert dkv_accum's chunks
 * too (dk = scale * dK, dv = dV): convert_dkv_chunk, which the Hopper
 * convert shares.
 */
#ifndef FC_SM80_BWD_CONVERT_CUH
#define FC_SM80_BWD_CONVERT_CUH

#include <stdint.h>

#include "cuda/common/pdl.cuh"
#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/bwd_args.h"
#include "cuda/sm80/bwd_preprocess.cuh"

namespace fc {
namespace sm80 {

/* Key chunk n (ROWS rows) of gradient head wh (dK heads, then dV heads)
 * of sequence b, from dkv_accum's rows, by NT threads: 8 columns (two
 * float4 loads, one 16-byte store) per item, every load before any store
 * (interleaved, each load waited for the store before it), rows past the
 * sequence skipped. */
template <bool kBF16, int D, int ROWS, int NT>
__device__ __forceinline__ void convert_dkv_chunk(const fc_sm80_bwd_args &a, int n, int wh, int b)
{
    constexpr int V = D / 8, ITEMS = ROWS * V / NT;
    static_assert(ROWS * V % NT == 0, "whole items per thread");
    const fc_fwd_params &f = a.p.f;
    const fc_bwd_params &p = a.p;
    const int which = wh >= f.heads_kv, h = wh - which * f.heads_kv, t = threadIdx.x;
    const int64_t k_start = f.cu_seqlens_k ? f.cu_seqlens_k[b] : (int64_t)b * f.seqlen_k;
    const int sk = f.cu_seqlens_k ? f.cu_seqlens_k[b + 1] - (int)k_start : f.seqlen_k;
    const int rows = sk - n * ROWS;
    if (rows <= 0) return;
    const int64_t k0 = k_start + (int64_t)n * ROWS;
    const float4 *src = reinterpret_cast<const float4 *>(
        a.dkv_accum + (((int64_t)which * f.heads_kv + h) * a.k_rows + k0) * D);
    float4 x[ITEMS][2];
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int i = it * NT + t;
        if (i / V < rows) x[it][0] = src[2 * i], x[it][1] = src[2 * i + 1];
    }
    const float s = which == 0 ? a.scale : 1.f;
    /* dense: row j of batch b; varlen: token k0 + j (batch stride unused) */
    const int64_t bk = f.cu_seqlens_k ? 0 : b, j0 = f.cu_seqlens_k ? k0 : (int64_t)n * ROWS;
    uint16_t *dst = which == 0 ? (uint16_t *)p.dk + bk * p.dk_batch_stride + j0 * p.dk_row_stride +
                                     (int64_t)h * p.dk_head_stride
                               : (uint16_t *)p.dv + bk * p.dv_batch_stride + j0 * p.dv_row_stride +
                                     (int64_t)h * p.dv_head_stride;
    const int64_t row_stride = which == 0 ? p.dk_row_stride : p.dv_row_stride;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int i = it * NT + t, row = i / V, c = i - row * V;
        if (row >= rows) continue;
        const float4 u = x[it][0], w = x[it][1];
        *reinterpret_cast<uint4 *>(dst + row * row_stride + 8 * c) =
            make_uint4(ptx::pack2<kBF16>(u.x * s, u.y * s), ptx::pack2<kBF16>(u.z * s, u.w * s),
                       ptx::pack2<kBF16>(w.x * s, w.y * s), ptx::pack2<kBF16>(w.z * s, w.w * s));
    }
}

constexpr int kDkvChunk = 64; /* key rows per dK/dV convert block (split calls) */

/* dK/dV convert blocks of a split call (0 unsplit): key chunks of the
 * longest sequence x (dK, dV) heads x sequences. */
__host__ __device__ __forceinline__ int64_t dkv_convert_blocks(const fc_sm80_bwd_args &a)
{
    const fc_fwd_params &f = a.p.f;
    if (!a.dkv_accum) return 0;
    return (int64_t)((f.seqlen_k + kDkvChunk - 1) / kDkvChunk) * 2 * f.heads_kv * f.batch;
}

template <bool kBF16, int HD>
__global__ void __launch_bounds__(kBwdAuxThreads) bwd_convert_kernel(const fc_sm80_bwd_args a)
{
    fc_grid_dep_sync();
    const fc_fwd_params &f = a.p.f;
    constexpr int CH = HD / 8;
    /* the first dq_blocks blocks convert dQ, the rest dK/dV chunks */
    const unsigned dq_blocks = aux_grid(a.rows * f.heads_q * CH);
    if (blockIdx.x >= dq_blocks) {
        const int k = (int)(blockIdx.x - dq_blocks), chunks = (f.seqlen_k + kDkvChunk - 1) / kDkvChunk;
        const int rest = k / chunks, wh = rest % (2 * f.heads_kv);
        convert_dkv_chunk<kBF16, HD, kDkvChunk, kBwdAuxThreads>(a, k - rest * chunks, wh, rest / (2 * f.heads_kv));
        return;
    }
    const int64_t rows = f.cu_seqlens_q ? f.cu_seqlens_q[f.batch] : a.rows;
    const int64_t items = rows * f.heads_q * CH;
    const float s = a.scale;
    for (int64_t idx = (int64_t)blockIdx.x * kBwdAuxThreads + threadIdx.x; idx < items;
         idx += (int64_t)dq_blocks * kBwdAuxThreads) {
        const int64_t pair = idx / CH;
        const int ch = (int)(idx - pair * CH);
        const int64_t row = pair / f.heads_q;
        const int h = (int)(pair - row * f.heads_q);
        int64_t b, i;
        row_place(f, row, b, i);
        const float4 *src = reinterpret_cast<const float4 *>(a.dq_accum + pair * HD + ch * 8);
        const float4 x = src[0], y = src[1];
        uint4 v;
        v.x = ptx::pack2<kBF16>(x.x * s, x.y * s);
        v.y = ptx::pack2<kBF16>(x.z * s, x.w * s);
        v.z = ptx::pack2<kBF16>(y.x * s, y.y * s);
        v.w = ptx::pack2<kBF16>(y.z * s, y.w * s);
        uint16_t *dst = (uint16_t *)a.p.dq + b * a.p.dq_batch_stride + i * a.p.dq_row_stride +
                        (int64_t)h * a.p.dq_head_stride + ch * 8;
        *reinterpret_cast<uint4 *>(dst) = v;
    }
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_CONVERT_CUH */
