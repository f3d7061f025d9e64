/*
 * bwd_coords.cuh -- where a backward CTA works: its key block, batch and KV
 * head, and its sequence's lengths and offsets, decoded from the 1-D grid;
 * and the deterministic mode's semaphore and turn of a query block.
 * Shared by the sm80-class backward and the Hopper backward, which launch
 * the same grid.
 */
#ifndef FC_SM80_BWD_COORDS_CUH
#define FC_SM80_BWD_COORDS_CUH

#include <stdint.h>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/bwd_args.h"
#include "cuda/sm80/bwd_ranges.h"

namespace fc {
namespace sm80 {

struct BwdCoords {
    int n;            /* key block                                        */
    int b, h_kv;      /* sequence and KV head                             */
    int sq, sk;       /* this sequence's lengths                          */
    int64_t q_start;  /* varlen: first token of the sequence (else 0)     */
    int64_t k_start;
    int64_t bq, bk;   /* batch index for the batch strides (0 for varlen) */
    int64_t row0;     /* workspace row of the sequence's query 0          */
    int h0;           /* the first query head it walks (then group_run)   */
};

/* Key block nb of (batch, KV head) pair bh. */
__device__ __forceinline__ BwdCoords bwd_coords_at(const fc_sm80_bwd_args &a, int32_t nb, int32_t bh)
{
    const fc_fwd_params &f = a.p.f;
    BwdCoords c;
    c.n = nb;
    c.b = fc_fastdiv_div(bh, a.heads_kv);
    c.h_kv = bh - c.b * f.heads_kv;
    c.sq = f.seqlen_q;
    c.sk = f.seqlen_k;
    c.q_start = c.k_start = 0;
    if (f.cu_seqlens_q) {
        c.q_start = f.cu_seqlens_q[c.b];
        c.sq = f.cu_seqlens_q[c.b + 1] - (int)c.q_start;
        c.k_start = f.cu_seqlens_k[c.b];
        c.sk = f.cu_seqlens_k[c.b + 1] - (int)c.k_start;
    }
    c.bq = f.cu_seqlens_q ? 0 : c.b;
    c.bk = f.cu_seqlens_k ? 0 : c.b;
    c.row0 = f.cu_seqlens_q ? c.q_start : (int64_t)c.b * f.seqlen_q;
    return c;
}

/* The CTA's place in the grid's order (fc_bwd_order, bwd_ranges.h). Read
 * through the volatile %ctaid.x: the loop recomputes the coordinates where
 * it needs them instead of holding them in registers across the GEMMs.
 * Where the planner split the GQA group (fc_bwd_group_splits), a key
 * block's query heads are dealt to 1 << split_shift neighbouring CTAs,
 * group_run heads each; unsplit, h0 is the group's first head. */
__device__ __forceinline__ BwdCoords bwd_coords(const fc_sm80_bwd_args &a)
{
    int32_t vp, nb;
    fc_bwd_tile_of(a.order, ptx::ctaid_x(), &nb, &vp);
    BwdCoords c = bwd_coords_at(a, nb, vp >> a.split_shift);
    c.h0 = c.h_kv * a.group + (vp & ((1 << a.split_shift) - 1)) * a.group_run;
    return c;
}

/* A split CTA's partial dK and dV go to the workspace's fp32 dkv_accum
 * (zeroed by the preprocess, added by atomics, so never in the
 * deterministic mode; the convert scales and stores them): row 0 of
 * gradient `which` (0 dK, 1 dV) of the CTA's keys (key blocks of bn). */
__device__ __forceinline__ float *bwd_dkv_rows(const fc_sm80_bwd_args &a, const BwdCoords &c, int which, int bn)
{
    const fc_fwd_params &f = a.p.f;
    const int64_t k0 = (f.cu_seqlens_k ? c.k_start : (int64_t)c.b * f.seqlen_k) + (int64_t)c.n * bn;
    return a.dkv_accum + (((int64_t)which * f.heads_kv + c.h_kv) * a.k_rows + k0) * f.head_dim;
}

/* Whether the CTA walks its query blocks downward (fc_bwd_next_block):
 * a.down, folded to true at compile time in the deterministic kernels. */
template <bool kDet> __device__ __forceinline__ bool bwd_down(const fc_sm80_bwd_args &a) { return kDet || a.down; }

/* The deterministic mode's semaphore of query block m of head h: how many
 * key blocks have added into its dQ (both paths; counted in one thread). */
__device__ __forceinline__ int *dq_sem(const fc_sm80_bwd_args &a, const BwdCoords &c, int h, int m)
{
    return a.sems + ((int64_t)c.b * a.p.f.heads_q + h) * a.m_blocks + m;
}

/* ... the first key block that adds into query block m (bm x bn blocks):
 * the count is c.n - this when this CTA's key block c.n may add. */
__device__ __forceinline__ int dq_first_adder(const fc_sm80_bwd_args &a, const BwdCoords &c, int m, int bm, int bn)
{
    const fc_fwd_params &f = a.p.f;
    return fc_bwd_kv_blocks(m, bm, bn, c.sq, c.sk, f.window_left, f.window_right).lo;
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_COORDS_CUH */
