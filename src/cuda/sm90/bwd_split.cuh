/*
 * bwd_split.cuh -- the Hopper backward's GQA group split. On a grid too
 * small to fill the device (bwd_plan.cu) a key block's query heads are
 * dealt to 1 << split_shift neighbouring CTAs, group_run heads each
 * (fc_sm80_bwd_args). Each CTA then holds a partial dK and dV of its keys:
 * it adds them to the workspace's fp32 dkv_accum (zeroed by the
 * preprocess; atomics, so never in the deterministic mode) and a last
 * kernel converts the sums. Here: a CTA's place in the split grid, the
 * adds, and that kernel.
 */
#ifndef FC_SM90_BWD_SPLIT_CUH
#define FC_SM90_BWD_SPLIT_CUH

#include "cuda/common/device_math.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/sm80/bwd_coords.cuh"
#include "cuda/sm80/bwd_preprocess.cuh"

namespace fc90 {

/* The CTA's key block and (batch, KV head), and *h0, the first query head
 * it walks (then group_run heads; unsplit: the whole group). */
__device__ __forceinline__ fc::sm80::BwdCoords bwd_place(const fc_sm80_bwd_args &a, int *h0)
{
    int32_t nb, vp;
    fc_bwd_tile_of(a.order, fc::ptx::ctaid_x(), &nb, &vp);
    const fc::sm80::BwdCoords c = fc::sm80::bwd_coords_at(a, nb, vp >> a.split_shift);
    *h0 = c.h_kv * a.group + (vp & ((1 << a.split_shift) - 1)) * a.group_run;
    return c;
}

/* dkv_accum's row 0 of gradient `which` (0 dK, 1 dV) of the CTA's keys. */
__device__ __forceinline__ float *bwd_dkv_rows(const fc_sm80_bwd_args &a, const fc::sm80::BwdCoords &c, int which,
                                               int bn)
{
    const fc_fwd_params &f = a.p.f;
    const int64_t k0 = (f.cu_seqlens_k ? c.k_start : (int64_t)c.b * f.seqlen_k) + (int64_t)c.n * bn;
    return a.dkv_accum + (((int64_t)which * f.heads_kv + c.h_kv) * a.k_rows + k0) * f.head_dim;
}

/* A consumer thread's dK or dV accumulators (wgmma layout: rows r and r +
 * 8, column pairs 8 j + t2) added to rows of `D` floats; keys past the
 * sequence are not added. */
template <int D>
__device__ __forceinline__ void bwd_add_grad(float *g, int valid, const float (&acc)[D / 2], int r, int t2)
{
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (r + 8 * h >= valid) continue;
        float2 *row = reinterpret_cast<float2 *>(g + (int64_t)(r + 8 * h) * D + t2);
#pragma unroll
        for (int j = 0; j < D / 8; ++j) atomicAdd(row + 4 * j, make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]));
    }
}

/* dk = scale * dK sum, dv = dV sum in the output dtype: 8 columns (two
 * float4 loads, one 16-byte store: the common checks hold dk and dv to
 * 16-byte chunks) per thread and step of a grid-stride pass. */
template <bool kBF16, int D>
__global__ void __launch_bounds__(fc::sm80::kBwdAuxThreads) bwd_convert_dkv(const fc_sm80_bwd_args a)
{
    fc_grid_dep_sync();
    const fc_fwd_params &f = a.p.f;
    const fc_bwd_params &p = a.p;
    constexpr int V = D / 8;
    const int64_t per = a.k_rows * V, n = 2 * f.heads_kv * per;
    const int64_t step = (int64_t)gridDim.x * fc::sm80::kBwdAuxThreads;
    /* varlen: tokens past the last sequence belong to none (never written) */
    const int64_t end = f.cu_seqlens_k ? f.cu_seqlens_k[f.batch] : a.k_rows;
    for (int64_t i = (int64_t)blockIdx.x * fc::sm80::kBwdAuxThreads + threadIdx.x; i < n; i += step) {
        const int64_t wh = i / per, rest = i - wh * per, row = rest / V;
        if (row >= end) continue;
        const int which = (int)(wh / f.heads_kv), h = (int)(wh - (int64_t)which * f.heads_kv), c = (int)(rest - row * V);
        const float4 *src = reinterpret_cast<const float4 *>(a.dkv_accum + (wh * a.k_rows + row) * D + 8 * c);
        const float4 x = src[0], y = src[1];
        const float s = which == 0 ? a.scale : 1.f;
        const int64_t b = f.cu_seqlens_k ? 0 : row / f.seqlen_k, j = f.cu_seqlens_k ? row : row - b * f.seqlen_k;
        uint16_t *dst = which == 0 ? (uint16_t *)p.dk + b * p.dk_batch_stride + j * p.dk_row_stride +
                                         (int64_t)h * p.dk_head_stride
                                   : (uint16_t *)p.dv + b * p.dv_batch_stride + j * p.dv_row_stride +
                                         (int64_t)h * p.dv_head_stride;
        const uint4 o = make_uint4(fc::dev::pack2<kBF16>(x.x * s, x.y * s), fc::dev::pack2<kBF16>(x.z * s, x.w * s),
                                   fc::dev::pack2<kBF16>(y.x * s, y.y * s), fc::dev::pack2<kBF16>(y.z * s, y.w * s));
        *reinterpret_cast<uint4 *>(dst + 8 * c) = o;
    }
}

/* The convert on stream when the group is split; else nothing. */
template <bool kBF16, int D>
cudaError_t launch_bwd_convert_dkv(const fc_sm80_bwd_args &a, cudaStream_t stream, bool pdl)
{
    if (!a.dkv_accum || a.k_rows == 0) return cudaSuccess;
    const int64_t work = 2 * a.p.f.heads_kv * a.k_rows * (D / 8);
    return fc_launch(bwd_convert_dkv<kBF16, D>, fc::sm80::aux_grid(work), fc::sm80::kBwdAuxThreads, 0, stream, pdl,
                     a);
}

} /* namespace fc90 */

#endif /* FC_SM90_BWD_SPLIT_CUH */
