/*
 * bwd_convert.cuh -- the Hopper backward's last kernel, one launch for
 * every fp32 sum the main kernel leaves: dq = scale * dq_accum from the
 * chunked layout (bwd_dq.cuh) and, where the group is split
 * (bwd_split.cuh), dk = scale * dK and dv = dV from dkv_accum, all in
 * the output dtype. Grid (chunk, head, sequence): heads_q dQ heads, then
 * 2 * heads_kv dK/dV heads when split; a chunk is kBwdChunk rows, those
 * past the sequence skipped (the planner keeps the grid's y in range).
 * Two launches, dQ then dK/dV, cost the split calls a kernel boundary
 * each. dQ: one 128-thread block per chunk; every thread first loads all
 * its float4s of each warpgroup part (coalesced), then packs them into a
 * shared tile in row order, and the block writes whole rows in 16-byte
 * stores (the common backward checks hold dq, dk and dv to 16-byte
 * chunks). Loads interleaved with 4-byte stores ran at 1.2 TB/s: the
 * stores, which may alias the loads, kept each load waiting for the one
 * before; the dK/dV rows likewise load everything before storing.
 */
#ifndef FC_SM90_BWD_CONVERT_CUH
#define FC_SM90_BWD_CONVERT_CUH

#include "cuda/common/pdl.cuh"
#include "cuda/sm90/bwd_dq.cuh"

namespace fc90 {

/* Query block m of head h of sequence b, from its chunk. */
template <class C, bool kBF16>
__device__ __forceinline__ void bwd_convert_dq(const fc_sm80_bwd_args &a, uint32_t *tile, int m, int h, int b)
{
    constexpr int PARTS = C::SPLIT_N ? 2 : 1, R4 = C::DQN / 8;
    constexpr int PITCH = C::D / 2 + 4; /* 32-bit words per tile row: g rows 4 banks apart */
    const fc_fwd_params &f = a.p.f;
    const int t = threadIdx.x;
    const int64_t q_start = f.cu_seqlens_q ? f.cu_seqlens_q[b] : 0;
    const int sq = f.cu_seqlens_q ? f.cu_seqlens_q[b + 1] - (int)q_start : f.seqlen_q;
    if (m * kBwdChunk >= sq) return;
    const float4 *chunk = reinterpret_cast<const float4 *>(bwd_dq_chunk<C>(a, b, BwdStep{h, m}));
    float4 v[PARTS][R4];
#pragma unroll
    for (int part = 0; part < PARTS; ++part)
#pragma unroll
        for (int r4 = 0; r4 < R4; ++r4) v[part][r4] = chunk[part * (kBwdChunk * C::DQN / 4) + r4 * 128 + t];
    /* float4 r4 of thread t: rows r and r + 8, columns col and col + 1 (bwd_dq.cuh) */
    const int r = 16 * (t >> 5) + ((t & 31) >> 2), w0 = (t & 3);
    const float s = a.scale;
#pragma unroll
    for (int part = 0; part < PARTS; ++part)
#pragma unroll
        for (int r4 = 0; r4 < R4; ++r4) {
            const int w = (part * C::DQN + 8 * r4) / 2 + w0;
            tile[r * PITCH + w] = pack2<kBF16>(v[part][r4].x * s, v[part][r4].y * s);
            tile[(r + 8) * PITCH + w] = pack2<kBF16>(v[part][r4].z * s, v[part][r4].w * s);
        }
    __syncthreads();
    const fc_bwd_params &p = a.p;
    uint16_t *dst = (uint16_t *)p.dq + (f.cu_seqlens_q ? 0 : b) * p.dq_batch_stride +
                    (q_start + (int64_t)m * kBwdChunk) * p.dq_row_stride + (int64_t)h * p.dq_head_stride;
    constexpr int V_ROW = C::D / 8; /* 16-byte chunks per row */
#pragma unroll
    for (int i = t; i < kBwdChunk * V_ROW; i += 128) {
        const int row = i / V_ROW, c = i - row * V_ROW;
        if (m * kBwdChunk + row < sq)
            *reinterpret_cast<uint4 *>(dst + row * p.dq_row_stride + 8 * c) =
                *reinterpret_cast<const uint4 *>(&tile[row * PITCH + 4 * c]);
    }
}

/* Key chunk n of gradient head wh (dK heads, then dV heads) of sequence b,
 * from dkv_accum's rows (bwd_split.cuh): 8 columns (two float4 loads,
 * one 16-byte store) per item, rows past the sequence skipped. */
template <bool kBF16, int D>
__device__ __forceinline__ void bwd_convert_dkv(const fc_sm80_bwd_args &a, int n, int wh, int b)
{
    constexpr int V = D / 8, ITEMS = kBwdChunk * V / 128;
    static_assert(kBwdChunk * V % 128 == 0, "whole items per thread");
    const fc_fwd_params &f = a.p.f;
    const fc_bwd_params &p = a.p;
    const int which = wh >= f.heads_kv, h = wh - which * f.heads_kv, t = threadIdx.x;
    const int64_t k_start = f.cu_seqlens_k ? f.cu_seqlens_k[b] : (int64_t)b * f.seqlen_k;
    const int sk = f.cu_seqlens_k ? f.cu_seqlens_k[b + 1] - (int)k_start : f.seqlen_k;
    const int rows = sk - n * kBwdChunk;
    if (rows <= 0) return;
    const int64_t k0 = k_start + (int64_t)n * kBwdChunk;
    const float4 *src = reinterpret_cast<const float4 *>(
        a.dkv_accum + (((int64_t)which * f.heads_kv + h) * a.k_rows + k0) * D);
    float4 x[ITEMS][2];
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int i = it * 128 + t;
        if (i / V < rows) x[it][0] = src[2 * i], x[it][1] = src[2 * i + 1];
    }
    const float s = which == 0 ? a.scale : 1.f;
    /* dense: row j of batch b; varlen: token k0 + j (batch stride unused) */
    const int64_t bk = f.cu_seqlens_k ? 0 : b, j0 = f.cu_seqlens_k ? k0 : (int64_t)n * kBwdChunk;
    uint16_t *dst = which == 0 ? (uint16_t *)p.dk + bk * p.dk_batch_stride + j0 * p.dk_row_stride +
                                     (int64_t)h * p.dk_head_stride
                               : (uint16_t *)p.dv + bk * p.dv_batch_stride + j0 * p.dv_row_stride +
                                     (int64_t)h * p.dv_head_stride;
    const int64_t row_stride = which == 0 ? p.dk_row_stride : p.dv_row_stride;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int i = it * 128 + t, row = i / V, c = i - row * V;
        if (row >= rows) continue;
        const float4 u = x[it][0], w = x[it][1];
        *reinterpret_cast<uint4 *>(dst + row * row_stride + 8 * c) =
            make_uint4(pack2<kBF16>(u.x * s, u.y * s), pack2<kBF16>(u.z * s, u.w * s),
                       pack2<kBF16>(w.x * s, w.y * s), pack2<kBF16>(w.z * s, w.w * s));
    }
}

template <class C, bool kBF16>
__global__ void __launch_bounds__(128) bwd_convert(const fc_sm80_bwd_args a)
{
    __shared__ __align__(16) uint32_t tile[kBwdChunk * (C::D / 2 + 4)];
    fc_grid_dep_sync();
    const int heads_q = a.p.f.heads_q;
    if ((int)blockIdx.y < heads_q) bwd_convert_dq<C, kBF16>(a, tile, blockIdx.x, blockIdx.y, blockIdx.z);
    else bwd_convert_dkv<kBF16, C::D>(a, blockIdx.x, blockIdx.y - heads_q, blockIdx.z);
}

/* The convert's grid: chunks of the longest sequence (queries, or keys
 * where split and longer), heads_q + (split: 2 heads_kv), batch. */
inline dim3 bwd_convert_grid(const fc_sm80_bwd_args &a)
{
    const fc_fwd_params &f = a.p.f;
    const bool split = a.dkv_accum != nullptr;
    const int key_chunks = split ? (f.seqlen_k + kBwdChunk - 1) / kBwdChunk : 0;
    const int rows_q = a.rows > 0 ? a.m_blocks : 0;
    return dim3((unsigned)(rows_q > key_chunks ? rows_q : key_chunks),
                (unsigned)(f.heads_q + (split ? 2 * f.heads_kv : 0)), (unsigned)f.batch);
}

} /* namespace fc90 */

#endif /* FC_SM90_BWD_CONVERT_CUH */
