/*
 * bwd_kernel.cuh -- the sm80-class attention backward's main kernel
 * (mma.sync + ldmatrix + cp.async; sm_80, 86, 89 and 90), FlashAttention-2
 * style. The pieces, by role:
 *   bwd_tiles.cuh       the table          bwd_shape.cuh   Shape, smem
 *   bwd_ranges.h        visited blocks     bwd_loads.cuh   CTA coords, loads
 *   bwd_mainloop.cuh    one query block    bwd_scores.cuh  P, dS
 *   bwd_dq.cuh          dQ GEMM and adds   bwd_preprocess.cuh, bwd_convert.cuh
 *
 * One CTA per (key block, batch, KV head): its dK and dV live in registers
 * while it walks, for each query head of its GQA group, the query blocks
 * that see its keys (bwd_ranges.h), with the next block's Q, dO, lse2 and
 * D loading into the other buffer. The grid is 1-D, key blocks fastest, so
 * that the CTAs sharing a head's Q and dO run together.
 *
 * Deterministic mode counts key blocks from the last: a query block's dQ
 * takes its adds from the highest key block down, and with causal masks
 * the CTA of key block n reaches a query block after the CTA of n + 1 has
 * (its range starts later), so it seldom waits; every CTA it waits for has
 * a lower grid index, so is running or done (no deadlock).
 *
 * Barriers per query block: one at the top (its loads visible; the other
 * buffer and the dS^T tile free), one before the dQ GEMM; the deterministic
 * turn adds two.
 */
#ifndef FC_SM80_BWD_KERNEL_CUH
#define FC_SM80_BWD_KERNEL_CUH

#include <stdint.h>

#include "cuda/common/pdl.cuh"
#include "cuda/sm80/bwd_loads.cuh"
#include "cuda/sm80/bwd_mainloop.cuh"
#include "cuda/sm80/bwd_ranges.h"
#include "cuda/sm80/bwd_shape.cuh"
#include "cuda/sm80/epilogue.cuh"

namespace fc {
namespace sm80 {

/* Stage a warp's 16 rows of dK or dV (times mul, 16-bit) in its own rows of
 * the tile at sT, then store them: 16-byte chunks in storage order, rows
 * at or past the sequence's end skipped. */
template <bool kBF16, class S_>
__device__ __forceinline__ void store_grad_rows(uint32_t sT, const Thr &th, const float (&acc)[1][S_::DTL][4],
                                               float mul, uint16_t *__restrict__ g, int64_t row_stride, int valid)
{
    constexpr int PC = S_::PC, UNITS = 16 * S_::HD / 8;
#pragma unroll
    for (int dt = 0; dt < S_::DTL; ++dt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
            ptx::sts32(sT + panel_offset<S_::BN, PC>(th.wrow + th.g + 8 * hf, dt) + 4 * th.t,
                       ptx::pack2<kBF16>(acc[0][dt][2 * hf] * mul, acc[0][dt][2 * hf + 1] * mul));
    __syncwarp();
#pragma unroll
    for (int k = 0; k < UNITS / 32; ++k) {
        const int u = th.lane + 32 * k;
        const int r = th.wrow + unit_row<16, PC>(u), ch = unit_chunk<16, PC>(u);
        if (r < valid) stg128(g + r * row_stride + ch * 8, ptx::lds128(sT + panel_offset<S_::BN, PC>(r, ch)));
    }
}

template <bool kBF16, class S_>
__device__ __forceinline__ void bwd_body(const fc_sm80_bwd_args &a)
{
    using SM = BwdSmem<S_>;
    const Thr th = thread_coords<S_>();
    const fc_fwd_params &f = a.p.f;
    fc_brange mr;
    {
        /* Scoped: the loop recomputes what it needs of the coordinates. */
        const BwdCoords c = bwd_coords(a);
        if ((int64_t)c.n * S_::BN >= c.sk) return; /* past this sequence's keys (uniform per CTA) */
        mr = fc_bwd_q_blocks(c.n, S_::BN, S_::BM, c.sq, c.sk, f.window_left, f.window_right);
        load_kv_tiles<S_>(a, c, th.tid);
        if (mr.hi > mr.lo) load_q_block<S_>(a, c, c.h_kv * a.group, mr.lo, 0, th.tid);
        ptx::cp_async_commit();
    }
    const int total = a.group * (mr.hi > mr.lo ? mr.hi - mr.lo : 0);

    float dk[1][S_::DTL][4], dv[1][S_::DTL][4];
#pragma unroll
    for (int dt = 0; dt < S_::DTL; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[0][dt][e] = dv[0][dt][e] = 0.f;

    int g = 0, m = mr.lo; /* query head h_kv * group + g, query block m */
    for (int it = 0; it < total; ++it) {
        const int buf = it & 1;
        ptx::cp_async_wait<0>();
        __syncthreads(); /* block it visible; every warp is past block it-1 */
        const bool step_m = m + 1 < mr.hi;
        const int gn = step_m ? g : g + 1, mn = step_m ? m + 1 : mr.lo;
        if (it + 1 < total) {
            const BwdCoords c = bwd_coords(a);
            load_q_block<S_>(a, c, c.h_kv * a.group + gn, mn, buf ^ 1, th.tid);
        }
        ptx::cp_async_commit();
        bwd_block<kBF16, S_>(a, th, g, m, buf, dk, dv);
        g = gn;
        m = mn;
    }
    ptx::cp_async_wait<0>();
    __syncthreads(); /* every warp is done reading K and V */

    const BwdCoords c = bwd_coords(a);
    const int64_t j0 = (int64_t)c.n * S_::BN;
    uint16_t *dkg = (uint16_t *)a.p.dk + c.bk * a.p.dk_batch_stride + (c.k_start + j0) * a.p.dk_row_stride +
                    (int64_t)c.h_kv * a.p.dk_head_stride;
    uint16_t *dvg = (uint16_t *)a.p.dv + c.bk * a.p.dv_batch_stride + (c.k_start + j0) * a.p.dv_row_stride +
                    (int64_t)c.h_kv * a.p.dv_head_stride;
    store_grad_rows<kBF16, S_>(SM::k(), th, dk, a.scale, dkg, a.p.dk_row_stride, c.sk - (int)j0);
    store_grad_rows<kBF16, S_>(SM::v(), th, dv, 1.f, dvg, a.p.dv_row_stride, c.sk - (int)j0);
}

template <bool kBF16, int HD, int BM, int BN, int W, int CTAS, int SUB>
__global__ void __launch_bounds__(W * 32, CTAS) bwd_kernel(const fc_sm80_bwd_args a)
{
    /* With PDL (a.pdl, sm_90+) this grid starts while the preprocess
     * finishes: nothing global before this. */
    fc_grid_dep_sync();
    bwd_body<kBF16, BwdShape<HD, BM, BN, W, CTAS, SUB>>(a);
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_KERNEL_CUH */
