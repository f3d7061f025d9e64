/*
 * bwd_dq.cuh -- a backward block's dQ contribution: dQ_blk = dS K over the
 * CTA's block_n keys, from the dS^T tile every warp has written, and its
 * fp32 adds into the workspace accumulator (red.global.add; one add per
 * element and block).
 *
 * The GEMM spreads block_m x head_dim over the warps: warp w takes query
 * rows 16 DQ_MT rg .. (DQ_MT m16 tiles, rg = w / DQ_CW) and head-dim
 * columns DQ_COLS * cg .. (cg = w % DQ_CW). A = dS (queries x keys) is the
 * dS^T tile read with ldmatrix.trans, its lanes addressing rows as the
 * forward's B operand (ldm_off_b); B = K (keys x head dim) is the K tile
 * read with ldmatrix.trans, as the forward's V.
 *
 * Deterministic mode: the key blocks that see a query block add into it
 * one CTA at a time, in key-block order (bwd_kernel.cuh says why),
 * counted by the block's semaphore: a CTA waits until the count says its
 * turn, adds, and releases the next.
 */
#ifndef FC_SM80_BWD_DQ_CUH
#define FC_SM80_BWD_DQ_CUH

#include <stdint.h>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/bwd_loads.cuh"
#include "cuda/sm80/bwd_shape.cuh"
#include "cuda/sm80/mma.cuh"

namespace fc {
namespace sm80 {

template <bool kBF16, class S_>
__device__ __forceinline__ void gemm_dq(float (&acc)[S_::DQ_MT][S_::DQ_NTL][4], int rg, int cg, int lane)
{
    using DS = typename S_::DS;
    using SM = BwdSmem<S_>;
    constexpr int MT = S_::DQ_MT;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S_::DQ_NTL; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
    const uint32_t offA = ldm_off_b<DS>(loop_lane<DS>(lane)), offB = ldm_off_a<S_>(loop_lane<S_>(lane));
#pragma unroll
    for (int kk = 0; kk < S_::BN / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            ptx::ldmatrix_x4_trans(a[mt], ldm_addr<DS, S_::BN>(SM::ds(), rg * MT + mt, kk * 16, offA));
#pragma unroll
        for (int j = 0; j < S_::DQ_NTL / 2; ++j)
            mma_b_x4<kBF16, true>(acc, j, a, ldm_addr<S_, S_::BN>(SM::k(), cg * (S_::DQ_COLS / 16) + j, kk * 16, offB));
    }
}

/* Two adjacent fp32 adds (one 8-byte vector red on sm_90). */
__device__ __forceinline__ void red_add2(float *dst, float x, float y)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(dst), make_float2(x, y));
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
#endif
}

/* This warp's dQ slice of query block m (head h) into dq_accum; rows past
 * the sequence are not added (they belong to no row, or the next
 * sequence's). */
template <class S_>
__device__ __forceinline__ void add_dq(const fc_sm80_bwd_args &a, const BwdCoords &c, const BwdThr &th, int h, int m,
                                       int rg, int cg, const float (&acc)[S_::DQ_MT][S_::DQ_NTL][4])
{
    const int64_t hq = a.p.f.heads_q;
#pragma unroll
    for (int mt = 0; mt < S_::DQ_MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int i = m * S_::BM + 16 * (rg * S_::DQ_MT + mt) + th.g + 8 * hf;
            if (i >= c.sq) continue;
            float *dst = a.dq_accum + ((c.row0 + i) * hq + h) * S_::HD + cg * S_::DQ_COLS + 2 * th.t;
#pragma unroll
            for (int nt = 0; nt < S_::DQ_NTL; ++nt)
                red_add2(dst + 8 * nt, acc[mt][nt][2 * hf], acc[mt][nt][2 * hf + 1]);
        }
}

/* The deterministic mode's turn: wait until the key blocks before c.n that
 * see query block m have added (the count reaches their number). */
template <class S_>
__device__ __forceinline__ void dq_turn_wait(const fc_sm80_bwd_args &a, int h, int m, int tid)
{
    if (tid == 0) {
        /* the coordinates read again, not passed in: held across the call,
         * the d96 64x64 deterministic row spilled on sm_86 */
        const BwdCoords c = bwd_coords(a);
        const int first = dq_first_adder(a, c, m, S_::BM, S_::BN);
        const int *sem = dq_sem(a, c, h, m);
        while (ptx::ld_acquire_gpu(sem) != c.n - first) {
        }
    }
    __syncthreads();
}

/* ... and hand the turn on once every thread's adds are visible: the
 * barrier orders the CTA's adds before thread 0's red.release, whose
 * release (a fence.acq_rel.gpu, cumulative) orders them before the count:
 * CUTLASS's generic barrier. A fence in every thread cost ~13% of the
 * loop's issue cycles (membar stalls) at d128. */
__device__ __forceinline__ void dq_turn_release(const fc_sm80_bwd_args &a, int h, int m, int tid)
{
    __syncthreads();
    if (tid == 0)
        ptx::red_release_gpu_add(dq_sem(a, bwd_coords(a), h, m), 1);
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_DQ_CUH */
