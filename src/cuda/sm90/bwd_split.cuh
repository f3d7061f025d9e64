/*
 * bwd_split.cuh -- the Hopper backward's GQA group split. On a grid too
 * small to fill the device (bwd_plan.cu) a key block's query heads are
 * dealt to 1 << split_shift neighbouring CTAs, group_run heads each
 * (fc_sm80_bwd_args, sm80/bwd_coords.cuh, as the sm80-class path). Each
 * CTA then holds a partial dK and dV of its keys: it adds them to the
 * workspace's fp32 dkv_accum, which the last kernel converts with dQ
 * (bwd_convert.cuh). Here: a CTA's place in the split grid and the adds
 * from the wgmma layout.
 */
#ifndef FC_SM90_BWD_SPLIT_CUH
#define FC_SM90_BWD_SPLIT_CUH

#include "cuda/common/device_math.cuh"
#include "cuda/sm80/bwd_coords.cuh"

namespace fc90 {

using fc::sm80::bwd_coords; /* the CTA's key block, (batch, KV head) and first query head h0 */
using fc::sm80::bwd_dkv_rows;

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

} /* namespace fc90 */

#endif /* FC_SM90_BWD_SPLIT_CUH */
