/*
 * mainloop.cuh -- the GEMM rounds a consumer warpgroup's block loop
 * (consumer.cuh) is made of: S = Q K^T (wgmma SS, fp32), O += P V (wgmma
 * RS, P from registers), a tile's first S (also the rotated loop's dropped
 * one), the pingpong turns (named barriers: one warpgroup's softmax
 * overlaps the other's GEMMs), and the varlen V-tail zeroing.
 */
#ifndef FC_SM90_MAINLOOP_CUH
#define FC_SM90_MAINLOOP_CUH

#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/sm90/trace.cuh"

namespace fc90 {

template <class C, bool kBF16>
__device__ __forceinline__ void issue_s(float (&S)[C::BN / 2], uint32_t q_addr, uint32_t k_addr)
{
    const uint64_t dq = desc_kmajor<C::SW>(q_addr);
    const uint64_t dk = desc_kmajor<C::SW>(k_addr);
#pragma unroll
    for (int k = 0; k < C::KSTEPS; ++k) {
        const uint32_t in_row = (k % C::KPP) * 32; /* 16 elements = 32 bytes */
        const uint32_t oq = (k / C::KPP) * (C::BM * C::SW) + in_row;
        const uint32_t ok = (k / C::KPP) * (C::BN * C::SW) + in_row;
        /* k-step 0 overwrites S (scale-d 0, write-only operands): the
         * previous block's S is dead from here, not carried across. */
        if (k == 0) Wgmma<C::BN, kBF16>::ss0(S, dq + (oq >> 4), dk + (ok >> 4));
        else Wgmma<C::BN, kBF16>::ss(S, dq + (oq >> 4), dk + (ok >> 4), 1);
    }
}

template <class C, bool kBF16>
__device__ __forceinline__ void issue_pv(float (&O)[C::D / 2], const uint32_t (&P)[C::BN / 4],
                                         uint32_t v_addr)
{
    /* V is [kv][head_dim] in panels: N (head_dim) contiguous = MN-major; the
     * next panel of head_dim columns is block_n rows further (LBO). */
    const uint64_t dv = desc_mnmajor<C::SW>(v_addr, C::BN * C::SW);
#pragma unroll
    for (int k = 0; k < C::PVSTEPS; ++k)
        Wgmma<C::D, kBF16>::rs(O, P[4 * k], P[4 * k + 1], P[4 * k + 2], P[4 * k + 3],
                               dv + ((uint32_t)(k * 16 * C::SW) >> 4), 1);
}

/* A GEMM round of a consumer warpgroup: with pingpong it waits for its turn,
 * issues, and hands the turn on; every warpgroup runs the same sequence of
 * rounds (tiles are shared by the CTA's warpgroups), so the turns carry over
 * from tile to tile. */
template <class C> __device__ __forceinline__ void round_begin(int cw)
{
    if (C::PP) bar_sync(kBarSched + cw, 256);
    wg_fence();
}
template <class C> __device__ __forceinline__ void round_end(int cw)
{
    wg_commit();
    if (C::PP) bar_arrive(kBarSched + (cw + 1) % C::WG, 256);
}

/* A tile's first S = Q K^T, in flight when this returns. With `real` false
 * (no tile left) it issues one k-step of it instead, without waiting for any
 * operand and with no pingpong turn (every warpgroup does the same), and the
 * result is dropped: a wgmma issued on one branch only leaves ptxas unable
 * to track the in-flight accumulator across the rotated loop, and it then
 * serialises every wgmma of the kernel (C7518) and spills. */
template <class C, bool kBF16>
__device__ __forceinline__ void issue_first_s(float (&S)[C::BN / 2], const Bars<C> &bars, uint32_t base,
                                              uint32_t q_addr, int qb, uint32_t q_par, int stage,
                                              uint32_t phase, int cw, bool real)
{
    if (!real) {
        wg_fence();
        Wgmma<C::BN, kBF16>::ss0(S, desc_kmajor<C::SW>(q_addr), desc_kmajor<C::SW>(base + C::OFF_K));
        wg_commit();
        return;
    }
    FC90_WAIT(bars.q_full(qb), q_par);
    FC90_WAIT(bars.k_full(stage), phase);
    round_begin<C>(cw);
    issue_s<C, kBF16>(S, q_addr, base + C::OFF_K + stage * C::KV_BYTES);
    round_end<C>(cw);
}

/* Varlen: the rows of a sequence's last key block past its end are the next
 * sequence's first keys (the TMA box runs on into them; it zero-fills only
 * past the packed tensor). Their probabilities are 0, but 0 x Inf is NaN
 * inside the P.V wgmma, so a non-finite value there would reach this
 * sequence's rows. Blocks are visited from high to low, so only a tile's
 * first block vb can be that block: once its S is done (before its
 * softmax; placed where it costs no register: 4 bytes spilled at d256
 * elsewhere), wait for its V and zero those rows (the any-block-mask
 * instance only: varlen always runs it). Every consumer warpgroup that
 * reads the block zeroes them itself (the same zeros, so no wait on another
 * warpgroup), then orders its generic writes before its wgmma's
 * async-proxy reads (fence.proxy.async, then its own barrier); the P.V's
 * own wait on the same phase then returns at once. Dense calls and blocks
 * that end inside their sequence skip it (a warpgroup-uniform test). The
 * stage is released only after this warpgroup's P.V, so no later TMA
 * write races the zeros. */
template <class C>
__device__ __forceinline__ void zero_v_tail(const fc_sm90_params &p, const Tile &g, int vb, const Bars<C> &bars,
                                            uint32_t base, int v_stage, uint32_t v_phase)
{
    const int r0 = g.sk - vb * C::BN; /* first row of the block past the sequence */
    if (!p.cu_k || r0 >= C::BN) return;
    FC90_WAIT(bars.v_full(v_stage), v_phase);
    /* A fresh %tid.x: nothing more kept live across the first block. */
    const uint32_t t = (uint32_t)fc::dev::tid_x_volatile();
    fc::dev::zero_rows_from<C::KV_BYTES, C::SW, C::BN, 128>(base + C::OFF_V + v_stage * C::KV_BYTES, r0, t & 127);
    fence_proxy_async();
    bar_sync(kBarVz + t / 128 - 1, 128); /* this consumer warpgroup */
}

/* O += P V for one block, waited for (the plain loop and the last block). */
template <class C, bool kBF16>
__device__ __forceinline__ void pv_round(float (&O)[C::D / 2], uint32_t (&P)[C::BN / 4], const Bars<C> &bars,
                                         uint32_t base, int v_stage, uint32_t v_phase, int cw)
{
    FC90_WAIT(bars.v_full(v_stage), v_phase);
    round_begin<C>(cw);
    issue_pv<C, kBF16>(O, P, base + C::OFF_V + v_stage * C::KV_BYTES);
    round_end<C>(cw);
    wg_wait<0>();
    fence_regs(O);
    fence_regs(P);
    mbar_arrive(bars.v_empty(v_stage));
}

} /* namespace fc90 */

#endif /* FC_SM90_MAINLOOP_CUH */
