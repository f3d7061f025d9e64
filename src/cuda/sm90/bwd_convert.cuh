/*
 * bwd_convert.cuh -- the Hopper backward's last kernel: dq = scale *
 * dq_accum in the output dtype, from the chunked layout (bwd_dq.cuh). One
 * 128-thread block per chunk (query block m of head h of sequence b):
 * thread t reads its float4s of each warpgroup part (coalesced) and
 * writes the 16-bit pairs they hold, rows past the sequence skipped.
 */
#ifndef FC_SM90_BWD_CONVERT_CUH
#define FC_SM90_BWD_CONVERT_CUH

#include "cuda/common/pdl.cuh"
#include "cuda/sm90/bwd_dq.cuh"

namespace fc90 {

template <class C, bool kBF16>
__global__ void __launch_bounds__(128) bwd_convert_chunks(const fc_sm80_bwd_args a)
{
    fc_grid_dep_sync();
    const fc_fwd_params &f = a.p.f;
    const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
    const int64_t q_start = f.cu_seqlens_q ? f.cu_seqlens_q[b] : 0;
    const int sq = f.cu_seqlens_q ? f.cu_seqlens_q[b + 1] - (int)q_start : f.seqlen_q;
    if (m * kBwdChunk >= sq) return;
    const float *chunk = bwd_dq_chunk<C>(a, b, BwdStep{h, m});
    const int row = m * kBwdChunk + 16 * (t >> 5) + ((t & 31) >> 2), t2 = 2 * (t & 3);
    const fc_bwd_params &p = a.p;
    uint16_t *dst = (uint16_t *)p.dq + (f.cu_seqlens_q ? 0 : b) * p.dq_batch_stride +
                    (q_start + row) * p.dq_row_stride + (int64_t)h * p.dq_head_stride + t2;
    const float s = a.scale;
    constexpr int PARTS = C::SPLIT_N ? 2 : 1;
#pragma unroll
    for (int part = 0; part < PARTS; ++part)
#pragma unroll
        for (int r4 = 0; r4 < C::DQN / 8; ++r4) {
            const float4 v = reinterpret_cast<const float4 *>(chunk + part * kBwdChunk * C::DQN)[r4 * 128 + t];
            const int col = part * C::DQN + 8 * r4;
            if (row < sq) *reinterpret_cast<uint32_t *>(dst + col) = pack2<kBF16>(v.x * s, v.y * s);
            if (row + 8 < sq)
                *reinterpret_cast<uint32_t *>(dst + 8 * p.dq_row_stride + col) = pack2<kBF16>(v.z * s, v.w * s);
        }
}

} /* namespace fc90 */

#endif /* FC_SM90_BWD_CONVERT_CUH */
