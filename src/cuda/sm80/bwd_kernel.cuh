/*
 * bwd_kernel.cuh -- the sm80-class attention backward's main kernel
 * (mma.sync + ldmatrix + cp.async; sm_80, 86, 89 and 90), FlashAttention-2
 * style. The pieces, by role:
 *   bwd_tiles.cuh       the table          bwd_shape.cuh   Shape, smem
 *   bwd_ranges.h        visited blocks     bwd_coords.cuh  CTA coords
 *   bwd_loads.cuh       loads
 *   bwd_mainloop.cuh    one query block    bwd_scores.cuh  P, dS
 *   bwd_dq.cuh          dQ GEMM and adds   bwd_preprocess.cuh, bwd_convert.cuh
 *
 * One CTA per (key block, batch, KV head): its dK and dV live in registers
 * (each warp a keys x head-dim tile, bwd_shape.cuh) while it walks, for
 * each query head of its GQA group, the query blocks that see its keys
 * (bwd_ranges.h), with the next block's Q, dO, lse2 and D loading into the
 * other buffer. On grids that leave SMs idle the planner deals the group's
 * heads to several CTAs per key block, which add fp32 partial dK and dV
 * for the convert (bwd_coords.cuh). The grid is 1-D, in the order of fc_bwd_order
 * (bwd_ranges.h): key blocks innermost, or outermost inside groups of
 * (batch, KV head) pairs for causal-like bands, whose CTAs then walk their
 * query blocks downward, as the deterministic mode's do.
 *
 * Deterministic mode: a query block's dQ takes its adds in key-block
 * order, so a CTA waits only for lower key blocks of its (batch, KV head),
 * which have lower grid indices: running or done (no deadlock). CTAs walk
 * the query blocks from the last down, the group's heads innermost
 * (fc_bwd_next_block): with causal masks every key block's range ends at
 * the last query block, so they all meet each block at the same step and
 * a CTA waits once for the adds of the lower key blocks, not once per
 * block; and the longest-first grid order holds in this mode too.
 *
 * Barriers per query block: one at the top (its loads visible; the other
 * buffer and the P^T and dS^T tiles free), one before the GEMMs that read
 * P^T and dS^T; the deterministic turn adds two.
 */
#ifndef FC_SM80_BWD_KERNEL_CUH
#define FC_SM80_BWD_KERNEL_CUH

#include <stdint.h>

#include "cuda/common/pdl.cuh"
#include "cuda/sm80/bwd_loads.cuh"
#include "cuda/sm80/bwd_mainloop.cuh"
#include "cuda/sm80/bwd_ranges.h"
#include "cuda/sm80/bwd_shape.cuh"

namespace fc {
namespace sm80 {

/* Stage a warp's tile of dK or dV (times mul, 16-bit) in its rows and
 * columns of the block_n x head_dim tile at sT. */
template <bool kBF16, class S_>
__device__ __forceinline__ void stage_grad(uint32_t sT, const BwdThr &th, const float (&acc)[S_::MT][S_::DTL][4],
                                           float mul)
{
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < S_::DTL; ++dt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
                ptx::sts32(sT + panel_offset<S_::BN, S_::PC>(th.wrow + 16 * mt + th.g + 8 * hf, 2 * th.c16 + dt) +
                               4 * th.t,
                           ptx::pack2<kBF16>(acc[mt][dt][2 * hf] * mul, acc[mt][dt][2 * hf + 1] * mul));
}

/* Store a staged block_n x head_dim tile: 16-byte chunks in storage order,
 * rows at or past the sequence's end skipped. */
template <class S_>
__device__ __forceinline__ void store_grad_tile(uint32_t sT, int tid, uint16_t *__restrict__ g, int64_t row_stride,
                                                int valid)
{
    constexpr int PC = S_::PC, UNITS = S_::BN * S_::HD / 8;
    static_assert(UNITS % S_::NT == 0, "whole 16-byte chunks per thread");
#pragma unroll
    for (int k = 0; k < UNITS / S_::NT; ++k) {
        const int u = tid + k * S_::NT;
        const int r = unit_row<S_::BN, PC>(u), ch = unit_chunk<S_::BN, PC>(u);
        if (r < valid) ptx::stg128(g + r * row_stride + ch * 8, ptx::lds128(sT + panel_offset<S_::BN, PC>(r, ch)));
    }
}

/* Add a warp's tiles of dK and dV (fp32, unscaled) into rows of HD floats
 * at gk and gv; keys at or past the sequence's end are not added. The two
 * interleaved, so that each pair's registers free as it goes (dK's adds
 * first, with all of dV held, spilled at d128 on sm_80). */
template <class S_>
__device__ __forceinline__ void add_grads(float *gk, float *gv, const BwdThr &th,
                                          const float (&dk)[S_::MT][S_::DTL][4],
                                          const float (&dv)[S_::MT][S_::DTL][4], int valid)
{
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int r = th.wrow + 16 * mt + th.g + 8 * hf;
            if (r >= valid) continue;
            const int64_t off = (int64_t)r * S_::HD + 16 * th.c16 + 2 * th.t;
#pragma unroll
            for (int dt = 0; dt < S_::DTL; ++dt) {
                red_add2(gk + off + 8 * dt, dk[mt][dt][2 * hf], dk[mt][dt][2 * hf + 1]);
                red_add2(gv + off + 8 * dt, dv[mt][dt][2 * hf], dv[mt][dt][2 * hf + 1]);
            }
        }
}

template <bool kBF16, bool kDet, class S_>
__device__ __forceinline__ void bwd_body(const fc_sm80_bwd_args &a)
{
    using SM = BwdSmem<S_>;
    const fc_fwd_params &f = a.p.f;
    int m;
    {
        /* Scoped: the loop recomputes what it needs of the coordinates. */
        const BwdCoords c = bwd_coords(a);
        if ((int64_t)c.n * S_::BN >= c.sk) return; /* past this sequence's keys (uniform per CTA) */
        const fc_brange mr = fc_bwd_q_blocks(c.n, S_::BN, S_::BM, c.sq, c.sk, f.window_left, f.window_right);
        const int tid = threadIdx.x;
        load_kv_tiles<S_>(a, c, tid);
        if (mr.hi > mr.lo)
            load_q_block<S_>(a, c, c.h0, fc_bwd_first_block(bwd_down<kDet>(a), mr), 0, tid);
        ptx::cp_async_commit();
        m = mr.hi > mr.lo ? fc_bwd_first_block(bwd_down<kDet>(a), mr) : -1;
    }

    float dk[S_::MT][S_::DTL][4], dv[S_::MT][S_::DTL][4];
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < S_::DTL; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dk[mt][dt][e] = dv[mt][dt][e] = 0.f;

    /* query head h0 + g, query block m (-1: no block sees these keys); the
     * block range is recomputed per block (held, it spilled) */
    for (int g = m < 0 ? a.group_run : 0, it = 0; g < a.group_run; ++it) {
        const int buf = it & 1;
        ptx::cp_async_wait<0>();
        __syncthreads(); /* block it visible; every warp is past block it-1 */
        const BwdCoords c = bwd_coords(a);
        const fc_brange mr = fc_bwd_q_blocks(c.n, S_::BN, S_::BM, c.sq, c.sk, f.window_left, f.window_right);
        int gn, mn;
        fc_bwd_next_block(bwd_down<kDet>(a), a.group_run, mr, g, m, &gn, &mn);
        if (gn < a.group_run) load_q_block<S_>(a, c, c.h0 + gn, mn, buf ^ 1, dev::tid_x_volatile());
        ptx::cp_async_commit();
        bwd_block<kBF16, kDet, S_>(a, g, m, buf, dk, dv);
        g = gn;
        m = mn;
    }
    ptx::cp_async_wait<0>();
    __syncthreads(); /* every warp is done reading K and V */

    const BwdThr th = bwd_thread_coords<S_>();
    const BwdCoords c = bwd_coords(a);
    const int64_t j0 = (int64_t)c.n * S_::BN;
    if (!kDet && a.dkv_accum) { /* a share of the group: fp32 partial sums */
        add_grads<S_>(bwd_dkv_rows(a, c, 0, S_::BN), bwd_dkv_rows(a, c, 1, S_::BN), th, dk, dv, c.sk - (int)j0);
        return;
    }
    uint16_t *dkg = (uint16_t *)a.p.dk + c.bk * a.p.dk_batch_stride + (c.k_start + j0) * a.p.dk_row_stride +
                    (int64_t)c.h_kv * a.p.dk_head_stride;
    uint16_t *dvg = (uint16_t *)a.p.dv + c.bk * a.p.dv_batch_stride + (c.k_start + j0) * a.p.dv_row_stride +
                    (int64_t)c.h_kv * a.p.dv_head_stride;
    stage_grad<kBF16, S_>(SM::k(), th, dk, a.scale);
    stage_grad<kBF16, S_>(SM::v(), th, dv, 1.f);
    __syncthreads(); /* both tiles staged */
    store_grad_tile<S_>(SM::k(), th.tid, dkg, a.p.dk_row_stride, c.sk - (int)j0);
    store_grad_tile<S_>(SM::v(), th.tid, dvg, a.p.dv_row_stride, c.sk - (int)j0);
}

/* kDet: the deterministic mode, an instance of its own (in one kernel,
 * its downward walk and the dQ turn's registers cost the default mode
 * 4-15%). SM90_ONLY: a row of the SM90 class alone (bwd_tile_sm90_only),
 * never launched below sm_90: older targets get an empty body, and no
 * ptxas verdict on a register budget tuned for sm_90. */
template <bool kBF16, bool kDet, int HD, int BM, int BN, int W, int CTAS, int KW, int QW, bool SM90_ONLY>
__global__ void __launch_bounds__(W * 32, CTAS) bwd_kernel(const fc_sm80_bwd_args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    if constexpr (SM90_ONLY) return;
#endif
    /* With PDL (a.pdl, sm_90+) this grid starts while the preprocess
     * finishes: nothing global before this. */
    fc_grid_dep_sync();
    bwd_body<kBF16, kDet, BwdShape<HD, BM, BN, W, CTAS, KW, QW>>(a);
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_KERNEL_CUH */
