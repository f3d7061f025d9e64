/*
 * bwd_convert.cuh -- the backward's last kernel: dq = scale * dq_accum in
 * the output dtype, for every query token that belongs to a sequence
 * (varlen tokens past the last offset are not written). Rows no key sees
 * get the zeros the preprocess left. One 16-byte output chunk (8 values)
 * per thread and step, grid-stride.
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

template <bool kBF16, int HD>
__global__ void __launch_bounds__(kBwdAuxThreads) bwd_convert_kernel(const fc_sm80_bwd_args a)
{
    fc_grid_dep_sync();
    const fc_fwd_params &f = a.p.f;
    constexpr int CH = HD / 8;
    const int64_t rows = f.cu_seqlens_q ? f.cu_seqlens_q[f.batch] : a.rows;
    const int64_t items = rows * f.heads_q * CH;
    const float s = a.scale;
    for (int64_t idx = (int64_t)blockIdx.x * kBwdAuxThreads + threadIdx.x; idx < items;
         idx += (int64_t)gridDim.x * kBwdAuxThreads) {
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
