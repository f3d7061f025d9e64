/*
 * bwd_preprocess.cuh -- the backward's first kernel: for every workspace
 * row (query token) and query head, D = rowsum(dO * O) (summed in double) and lse2 =
 * lse * log2(e) (-inf, a row that sees no key, becomes +inf so that every
 * P of it is 2^-inf = 0); the fp32 dQ (and split dK/dV) accumulators zeroed whole, in
 * either layout (the Hopper path's chunks with their padding: a memset
 * before the kernel cost ~35 us at s2k-d128); and the deterministic
 * mode's semaphores zeroed.
 *
 * Four threads per (row, head), each a quarter of the 16-byte chunks of
 * dO and O (4 threads read 64 contiguous bytes), summed by two shuffles.
 * Grid-stride over groups of 8 pairs per warp, so the shuffles always
 * have the whole warp.
 */
#ifndef FC_SM80_BWD_PREPROCESS_CUH
#define FC_SM80_BWD_PREPROCESS_CUH

#include <stdint.h>

#include "constants.h"
#include "cuda/common/pdl.cuh"
#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/bwd_args.h"

namespace fc {
namespace sm80 {

constexpr int kBwdAuxThreads = 256; /* preprocess and convert blocks */

/* Blocks of a grid-stride pass over `work` threads' worth of items: enough
 * to fill any device many times over, never more than the work. */
__host__ __device__ inline unsigned aux_grid(int64_t work)
{
    const int64_t blocks = (work + kBwdAuxThreads - 1) / kBwdAuxThreads;
    return (unsigned)(blocks < 8192 ? blocks : 8192);
}

/* (b, i): the batch index for the batch strides and the row index for the
 * row strides of workspace row `row` (varlen: the token itself). */
__device__ __forceinline__ void row_place(const fc_fwd_params &f, int64_t row, int64_t &b, int64_t &i)
{
    b = f.cu_seqlens_q ? 0 : row / f.seqlen_q;
    i = row - b * f.seqlen_q;
    if (f.cu_seqlens_q) i = row;
}

/* The dot of two 16-byte chunks of 8 16-bit values, in double: D is
 * subtracted from dP (dS = P (dP - D)), and where a row's softmax is nearly
 * one-hot the two nearly cancel; an exact D leaves only dP's fp32 error in
 * the difference (the preprocess is memory-bound, double costs nothing). */
template <bool kBF16>
__device__ __forceinline__ double dot8(uint4 x, uint4 y)
{
    const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
    double acc = 0.0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 a = dev::unpack2<kBF16>(xs[k]), b = dev::unpack2<kBF16>(ys[k]);
        acc = fma((double)a.x, (double)b.x, acc);
        acc = fma((double)a.y, (double)b.y, acc);
    }
    return acc;
}

template <bool kBF16, int HD>
__global__ void __launch_bounds__(kBwdAuxThreads) bwd_preprocess_kernel(const fc_sm80_bwd_args a)
{
    /* Wait first, then let the main kernel launch: everything written
     * before this call is then visible to it, so the Hopper kernel may load
     * K, V, Q and dO before its own wait (which is for this kernel's rows). */
    fc_grid_dep_wait();
    fc_grid_dep_launch();
    const fc_fwd_params &f = a.p.f;
    const int64_t gtid = (int64_t)blockIdx.x * kBwdAuxThreads + threadIdx.x;
    const int64_t nthreads = (int64_t)gridDim.x * kBwdAuxThreads;
    for (int64_t s = gtid; s < a.n_sems; s += nthreads) a.sems[s] = 0;
    float4 *acc = reinterpret_cast<float4 *>(a.dq_accum);
    for (int64_t k = gtid; k < a.zero_f4; k += nthreads) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);

    constexpr int CPT = HD / 32; /* 16-byte chunks per thread: HD/8 over 4 threads */
    const int lane = threadIdx.x & 31, sub = lane & 3;
    const int64_t pairs = a.rows * f.heads_q;
    for (int64_t p0 = (gtid >> 5) * 8; p0 < pairs; p0 += (nthreads >> 5) * 8) {
        const int64_t pair = p0 + (lane >> 2);
        const bool ok = pair < pairs;
        const int64_t row = ok ? pair / f.heads_q : 0;
        const int h = (int)(pair - row * f.heads_q);
        int64_t b, i;
        row_place(f, row, b, i);
        double d = 0.0;
        if (ok) {
            const uint16_t *o = (const uint16_t *)f.o + b * f.o_batch_stride + i * f.o_row_stride +
                                (int64_t)h * f.o_head_stride;
            const uint16_t *g = (const uint16_t *)a.p.dout + b * a.p.do_batch_stride + i * a.p.do_row_stride +
                                (int64_t)h * a.p.do_head_stride;
#pragma unroll
            for (int k = 0; k < CPT; ++k) {
                const int ch = sub + 4 * k;
                d += dot8<kBF16>(*reinterpret_cast<const uint4 *>(o + ch * 8),
                                 *reinterpret_cast<const uint4 *>(g + ch * 8));
            }
        }
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        d += __shfl_xor_sync(0xffffffffu, d, 2);
        if (ok && sub == 0) {
            const float lse = f.lse[b * f.lse_batch_stride + (int64_t)h * f.lse_head_stride + i * f.lse_row_stride];
            a.dsum[(int64_t)h * a.rows + row] = (float)d;
            a.lse2[(int64_t)h * a.rows + row] = lse == -INFINITY ? INFINITY : lse * FC_LOG2E_F;
        }
    }
}

/* The preprocess on stream (both backward paths): a thread group per
 * (row, head), enough threads to zero the semaphores and the split dK/dV
 * accumulators (which queries need not reach); nothing to launch without
 * any. Returns the launch error. */
template <bool kBF16, int HD>
cudaError_t launch_bwd_preprocess(const fc_sm80_bwd_args &a, cudaStream_t stream, bool pdl)
{
    const int64_t pairs = a.rows * a.p.f.heads_q * 4, sems = pairs > a.n_sems ? pairs : a.n_sems;
    const int64_t work = a.dkv_accum && a.zero_f4 > sems ? a.zero_f4 : sems;
    if (work == 0) return cudaSuccess;
    return fc_launch(bwd_preprocess_kernel<kBF16, HD>, aux_grid(work), kBwdAuxThreads, 0, stream, pdl, a);
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_PREPROCESS_CUH */
