/*
 * bwd_dq.cuh -- a Hopper backward step's dQ into the workspace's fp32
 * dq_accum (chunked, bwd_args.h; the layout below):
 * each consumer warpgroup stages its accumulator in shared memory in the
 * chunk's order and hands it (named barriers full/free) to the writer
 * warp, which adds it with one bulk reduce-add: one instruction per
 * warpgroup and step (one per row of 256 bytes ran at ~1 TB/s of adds,
 * 152-300 TFLOP/s). Rows past the sequence land in its chunk's padding. The consumers run no branch and no wait on
 * global memory while their next GEMMs are in flight (ptxas serialises
 * wgmma across divergent code).
 *
 * Deterministic mode: a query block takes its adds in key-block order
 * (sm80/bwd_dq.cuh, the same semaphores): the writer waits for its turn,
 * adds, waits for the adds to complete, and releases the next.
 */
#ifndef FC_SM90_BWD_DQ_CUH
#define FC_SM90_BWD_DQ_CUH

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/bwd_coords.cuh"
#include "cuda/sm80/bwd_ranges.h"
#include "cuda/sm90/bwd_args.h"
#include "cuda/sm90/bwd_place.cuh"
#include "cuda/sm90/bwd_split.cuh"
#include "cuda/sm90/bwd_tiles.cuh"
#include "cuda/sm90/ptx_sm90.cuh"

namespace fc90 {

/* Where a step's rows go: query block m of head h of the CTA's sequence. */
struct BwdStep {
    int h, m;
};

/* The chunked dq_accum (bwd_args.h): sequence b's query block m of head
 * h is kBwdChunk rows x head_dim floats at
 *     dq_accum + (h * dq_rows + pad0(b) + m * kBwdChunk) * head_dim,
 * pad0(b) = b * ceil(seqlen_q / kBwdChunk) * kBwdChunk (dense) or
 * (cu_seqlens_q[b] + b * kBwdChunk) rounded down to a multiple of
 * kBwdChunk (varlen; sequences never overlap: pad0(b + 1) - pad0(b) >=
 * their blocks' rows; kBwdChunk: bwd_tiles.cuh). A 128-row block
 * (kDqByRows) is two chunks, one per warpgroup. Inside a chunk, warpgroup
 * w's part (kDqByCols: its columns; kDqByKeys: both add the whole chunk)
 * is its accumulators in register order, 4 at a time: float4 r4 of thread
 * t at (r4 * 128 + t) * 4, which both the staging stores and the convert
 * read without bank conflicts. */
__host__ __device__ __forceinline__ int64_t bwd_pad0(const fc_fwd_params &f, int b)
{
    if (!f.cu_seqlens_q) return (int64_t)b * ((f.seqlen_q + kBwdChunk - 1) / kBwdChunk) * kBwdChunk;
    return ((int64_t)f.cu_seqlens_q[b] + (int64_t)b * kBwdChunk) / kBwdChunk * kBwdChunk;
}

/* Chunk `chunk` (its first row chunk * kBwdChunk) of head h of sequence b. */
template <class C>
__device__ __forceinline__ float *bwd_dq_chunk(const fc_sm80_bwd_args &a, int b, int h, int chunk)
{
    return a.dq_accum + ((int64_t)h * a.dq_rows + bwd_pad0(a.p.f, b) + (int64_t)chunk * kBwdChunk) * C::D;
}

template <class C>
__device__ __forceinline__ void bwd_stage_dq(uint32_t stage, const float (&dq)[C::DQN / 2], int tid)
{
#pragma unroll
    for (int r4 = 0; r4 < C::DQN / 8; ++r4)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(stage + 16u * (r4 * 128 + tid)),
                     "f"(dq[4 * r4]), "f"(dq[4 * r4 + 1]), "f"(dq[4 * r4 + 2]), "f"(dq[4 * r4 + 3])
                     : "memory");
}

/* Lane 0 of the writer: warpgroup cw's part of the step's block: its
 * columns of the chunk (SPLIT_N), its own chunk (SPLIT_M; none past the
 * sequence: the padding holds one chunk), or the whole chunk. */
template <class C>
__device__ __forceinline__ void bwd_reduce_part(const fc_sm80_bwd_args &a, const fc::sm80::BwdCoords &c, BwdStep st,
                                                uint32_t stage, int cw)
{
    const int chunk = st.m * (C::BM / kBwdChunk) + (C::SPLIT_M ? cw : 0);
    if (C::SPLIT_M && chunk * kBwdChunk >= c.sq) return;
    float *dst = bwd_dq_chunk<C>(a, c.b, st.h, chunk) + (C::SPLIT_N ? cw * kBwdChunk * C::DQN : 0);
    bulk_reduce_add_f32(dst, stage, 4u * kBwdChunk * C::DQN);
    tma_store_commit();
}

/* Lane 0 spins until the key blocks before this CTA's that see query block
 * st.m have added (sm80/bwd_dq.cuh dq_turn_wait). */
template <class C>
__device__ __forceinline__ void bwd_dq_turn_wait(const fc_sm80_bwd_args &a, const fc::sm80::BwdCoords &c, BwdStep st,
                                                 int lane)
{
    if (lane == 0) {
        const int first = fc::sm80::dq_first_adder(a, c, st.m, C::BM, C::BN);
        const int *sem = fc::sm80::dq_sem(a, c, st.h, st.m);
        while (fc::ptx::ld_acquire_gpu(sem) != c.n - first) {
        }
    }
    __syncwarp();
}

__device__ __forceinline__ void bwd_dq_release(const fc_sm80_bwd_args &a, const fc::sm80::BwdCoords &c, BwdStep st,
                                               int lane)
{
    __syncwarp();
    if (lane == 0) {
        __threadfence();
        fc::ptx::red_release_gpu_add(fc::sm80::dq_sem(a, c, st.h, st.m), 1);
    }
}

/* Consumer side: a step's dQ into warpgroup cw's staging once the writer
 * warp has read the previous one (free), then handed over (full). */
template <class C>
__device__ __forceinline__ void bwd_hand_dq(uint32_t stage, const float (&dq)[C::DQN / 2], int cw, int tid)
{
    bar_sync(kBwdBarFree + cw, 160);
    bwd_stage_dq<C>(stage, dq, tid);
    fence_proxy_async(); /* generic writes before the bulk copy (async proxy) reads them */
    bar_arrive(kBwdBarFull + cw, 160);
}

/* The writer warp (warp 1 of the producer warpgroup): per step of the
 * walk, each consumer warpgroup's staged dQ added to dq_accum, the staging
 * handed back once read. Deterministic: in key-block order per query
 * block (the turn), both warpgroups' parts in one turn; where both add the
 * same rows (kDqByKeys) warpgroup 0's adds complete before 1's start. */
template <class C, bool kDet>
__device__ void bwd_dq_writer(const fc_sm80_bwd_args &a, uint32_t base, int lane)
{
    const BwdPlace<C, C::EARLY_DS> pl(a);
    bar_arrive(kBwdBarFree + 0, 160);
    bar_arrive(kBwdBarFree + 1, 160);
    int m;
    {
        const fc_brange mr = pl.range(a);
        m = mr.hi > mr.lo ? fc_bwd_first_block(fc::sm80::bwd_down<kDet>(a), mr) : -1;
    }
    for (int g = m < 0 ? a.group_run : 0; g < a.group_run;) {
        const auto &c = pl.coords(a);
        const BwdStep st{c.h0 + g, m};
        if (kDet) bwd_dq_turn_wait<C>(a, c, st, lane);
#pragma unroll 1
        for (int cw = 0; cw < 2; ++cw) {
            const uint32_t stage = base + C::OFF_DQ + cw * C::DQ_BYTES;
            bar_sync(kBwdBarFull + cw, 160);
            if (lane == 0) {
                bwd_reduce_part<C>(a, c, st, stage, cw);
                if (kDet && !C::DQ_ALL_KEYS) tma_store_wait_all(); /* warpgroup 0's adds land before 1's */
                else tma_store_wait_read();
            }
            __syncwarp();
            bar_arrive(kBwdBarFree + cw, 160);
        }
        if (kDet) {
            if (lane == 0) tma_store_wait_all();
            bwd_dq_release(a, c, st, lane);
        }
        int gn, mn;
        fc_bwd_next_block(fc::sm80::bwd_down<kDet>(a), a.group_run, pl.range(a), g, m, &gn, &mn);
        g = gn;
        m = mn;
    }
    tma_store_wait_read(); /* the adds complete with the grid, before the convert's wait returns */
}

} /* namespace fc90 */

#endif /* FC_SM90_BWD_DQ_CUH */
