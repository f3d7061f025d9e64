/*
 * bwd_convert.cuh -- the Hopper backward's last kernel: dq = scale *
 * dq_accum in the output dtype, from the chunked layout (bwd_dq.cuh). One
 * 128-thread block per chunk (query block m of head h of sequence b):
 * every thread first loads all its float4s of each warpgroup part
 * (coalesced), then packs them into a shared tile in row order, and the
 * block writes whole rows in 16-byte stores (the common backward checks
 * hold dq to 16-byte chunks), rows past the sequence skipped. Loads
 * interleaved with 4-byte stores ran at 1.2 TB/s: the stores, which may
 * alias the loads, kept each load waiting for the one before.
 */
#ifndef FC_SM90_BWD_CONVERT_CUH
#define FC_SM90_BWD_CONVERT_CUH

#include "cuda/common/pdl.cuh"
#include "cuda/sm90/bwd_dq.cuh"

namespace fc90 {

template <class C, bool kBF16>
__global__ void __launch_bounds__(128) bwd_convert_chunks(const fc_sm80_bwd_args a)
{
    constexpr int PARTS = C::SPLIT_N ? 2 : 1, R4 = C::DQN / 8;
    constexpr int PITCH = C::D / 2 + 4; /* 32-bit words per tile row: g rows 4 banks apart */
    __shared__ __align__(16) uint32_t tile[kBwdChunk * PITCH];
    fc_grid_dep_sync();
    const fc_fwd_params &f = a.p.f;
    const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
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

} /* namespace fc90 */

#endif /* FC_SM90_BWD_CONVERT_CUH */
