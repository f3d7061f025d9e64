/*
 * bwd_convert.cuh -- the Hopper backward's last kernel, one launch for
 * every fp32 sum the main kernel leaves: dq = scale * dq_accum from the
 * chunked layout (bwd_dq.cuh) and, where the group is split
 * (bwd_split.cuh), dk = scale * dK and dv = dV from dkv_accum, all in
 * the output dtype. Grid (chunk, head, sequence): heads_q dQ heads, then
 * 2 * heads_kv dK/dV heads when split; a chunk is kBwdChunk rows, those
 * past the sequence skipped (the planner keeps the grid's y in range).
 * One launch, not dQ's and then dK/dV's: the second kernel boundary cost
 * the split calls 10% (gqa-step, H100). dQ: one 128-thread block per chunk; every thread first loads all
 * its float4s of each warpgroup part (coalesced), then packs them into a
 * shared tile in row order, and the block writes whole rows in 16-byte
 * stores (the common backward checks hold dq, dk and dv to 16-byte
 * chunks). Loads interleaved with 4-byte stores ran at 1.2 TB/s: the
 * stores, which may alias the loads, kept each load waiting for the one
 * before; the dK/dV rows (sm80/bwd_convert.cuh's convert_dkv_chunk,
 * shared with the sm80-class path) likewise load everything first.
 */
#ifndef FC_SM90_BWD_CONVERT_CUH
#define FC_SM90_BWD_CONVERT_CUH

#include "cuda/common/pdl.cuh"
#include "cuda/sm80/bwd_convert.cuh"
#include "cuda/sm90/bwd_dq.cuh"

namespace fc90 {

/* Chunk m (rows m * kBwdChunk on) of head h of sequence b. */
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
    const float4 *chunk = reinterpret_cast<const float4 *>(bwd_dq_chunk<C>(a, b, h, m));
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

template <class C, bool kBF16>
__global__ void __launch_bounds__(128) bwd_convert(const fc_sm80_bwd_args a)
{
    __shared__ __align__(16) uint32_t tile[kBwdChunk * (C::D / 2 + 4)];
    fc_grid_dep_sync();
    const int heads_q = a.p.f.heads_q;
    if ((int)blockIdx.y < heads_q) bwd_convert_dq<C, kBF16>(a, tile, blockIdx.x, blockIdx.y, blockIdx.z);
    else fc::sm80::convert_dkv_chunk<kBF16, C::D, kBwdChunk, 128>(a, blockIdx.x, blockIdx.y - heads_q, blockIdx.z);
}

/* The convert's grid: chunks of the longest sequence (queries, or keys
 * where split and longer; a 128-row query block is two chunks), heads_q +
 * (split: 2 heads_kv), batch. */
inline dim3 bwd_convert_grid(const fc_sm80_bwd_args &a)
{
    const fc_fwd_params &f = a.p.f;
    const bool split = a.dkv_accum != nullptr;
    const int key_chunks = split ? (f.seqlen_k + kBwdChunk - 1) / kBwdChunk : 0;
    const int rows_q = a.rows > 0 ? (f.seqlen_q + kBwdChunk - 1) / kBwdChunk : 0;
    return dim3((unsigned)(rows_q > key_chunks ? rows_q : key_chunks),
                (unsigned)(f.heads_q + (split ? 2 * f.heads_kv : 0)), (unsigned)f.batch);
}

} /* namespace fc90 */

#endif /* FC_SM90_BWD_CONVERT_CUH */
