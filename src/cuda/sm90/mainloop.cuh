/*
 * mainloop.cuh -- a consumer warpgroup's GEMM rounds over one tile's KV
 * blocks: S = Q K^T (wgmma SS, fp32), the softmax, O += P V (wgmma RS, P
 * from registers). Two block loops:
 *   overlap (cfg.overlap): S_j and O += P_{j-1} V_{j-1} issued back to back,
 *     the softmax of block j running while the P.V GEMM is on the tensor cores;
 *   plain: S, softmax, P.V per block, waiting for each.
 * Pingpong (cfg.pingpong) makes the consumer warpgroups take turns issuing
 * on named barriers, so one's softmax overlaps the other's GEMMs.
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
 * instance only: varlen and seqused_k always run it; a cache's rows past
 * its length may hold anything, NaN included). Every consumer warpgroup that
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
    if ((!p.cu_k && !p.used_k) || r0 >= C::BN) return;
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

/* One step of this warpgroup through the K/V ring: KVS blocks. */
template <class C> __device__ __forceinline__ void advance(int &st, uint32_t &ph)
{
    for (int i = 0; i < C::KVS; ++i)
        if (++st == C::ST) {
            st = 0;
            ph ^= 1;
        }
}

/* Hand Q buffer b back: our generic reads/writes of it, and the O store's
 * reads of the staging (issuing thread), come before the next TMA (async
 * proxy) write into it. */
template <class C> __device__ __forceinline__ void release_q(const fc_sm90_params &p, const Bars<C> &bars, int tid, int b)
{
    if (p.o_tma && tid == 0) tma_store_wait_read();
    fence_proxy_async();
    mbar_arrive(bars.q_empty(b));
}

/* A tile's first block n: S0 (in flight, or issued here for kvsplit), its
 * softmax into rs, P and the zeroed O; hands the previous tile's Q buffer
 * back (q_release) once the S GEMM no longer reads Q. */
template <class C, bool kBF16, int kMask>
__device__ __forceinline__ void first_block(const fc_sm90_params &p, const Tile &g, const Bars<C> &bars,
                                            uint32_t base, const WgThread &w, int k, float (&S0)[C::BN / 2],
                                            uint32_t q_addr, int qb, uint32_t q_par, int n, int stage,
                                            uint32_t phase, int &q_release, float (&O)[C::D / 2],
                                            uint32_t (&P)[C::BN / 4], RowState &rs, const MaskRows &mr)
{
    if (C::KVS > 1) issue_first_s<C, kBF16>(S0, bars, base, q_addr, qb, q_par, stage, phase, w.cw, true);
    wg_wait<0>();
    fence_regs(S0);
    trace(p, w.cw + 1, k, 1, w.tid == 0);
    mbar_arrive(bars.k_empty(stage));
    /* Varlen calls always run the any-block-mask instance (mask_mode.h),
     * so only it carries the code: in the others it cost 1-2% at
     * s512-d64 and s2k-d128 though never executed. */
    if constexpr (kMask == kMaskAny) zero_v_tail<C>(p, g, n, bars, base, stage, phase);
#pragma unroll
    for (int i = 0; i < C::D / 2; ++i) O[i] = 0.0f;
    float alpha[2];
    softmax_block<C::BN, true, kMask>(S0, rs, alpha, p, block_masked<C>(g, n), n * C::BN + w.col_t, mr);
    convert_p<C::BN, kBF16>(S0, P);
    if (C::QB == 2 && q_release >= 0) release_q<C>(p, bars, w.tid, q_release), q_release = -1;
    trace(p, w.cw + 1, k, 2, w.tid == 0);
}

/* The overlap loop over the blocks after the first (n, its stage v_stage),
 * then the last P.V. */
template <class C, bool kBF16, int kMask>
__device__ __forceinline__ void overlap_blocks(const fc_sm90_params &p, const Tile &g, const Bars<C> &bars,
                                               uint32_t base, const WgThread &w, uint32_t q_addr, int n,
                                               int &stage, uint32_t &phase, int v_stage, uint32_t v_phase,
                                               float (&O)[C::D / 2], uint32_t (&P)[C::BN / 4], RowState &rs,
                                               const MaskRows &mr)
{
    float S[C::BN / 2];
    float alpha[2];
    for (n -= C::KVS; n >= g.n_lo; n -= C::KVS) {
        FC90_WAIT(bars.k_full(stage), phase);
        /* V_{j-1} was issued before K_j: waiting here costs nothing
         * and keeps the wait loop out of the fence..wgmma window
         * (ptxas would otherwise inject a second fence, C7519). */
        FC90_WAIT(bars.v_full(v_stage), v_phase);
        round_begin<C>(w.cw);
        issue_s<C, kBF16>(S, q_addr, base + C::OFF_K + stage * C::KV_BYTES);
        wg_commit();
        issue_pv<C, kBF16>(O, P, base + C::OFF_V + v_stage * C::KV_BYTES);
        round_end<C>(w.cw);
        wg_wait<1>(); /* S_j done, P.V of the previous block may still run */
        fence_regs(S);
        mbar_arrive(bars.k_empty(stage));
        softmax_block<C::BN, false, kMask>(S, rs, alpha, p, block_masked<C>(g, n), n * C::BN + w.col_t, mr);
        wg_wait<0>();
        fence_regs(O);
        fence_regs(S);
        fence_regs(P);
        mbar_arrive(bars.v_empty(v_stage));
        rescale_o<C::D>(O, alpha);
        convert_p<C::BN, kBF16>(S, P);
        v_stage = stage;
        v_phase = phase;
        advance<C>(stage, phase);
    }
    pv_round<C, kBF16>(O, P, bars, base, v_stage, v_phase, w.cw); /* the last P.V */
}

/* The plain loop: P.V of the first block (at v_stage), then S, softmax, P.V
 * per block, waiting for each. */
template <class C, bool kBF16, int kMask>
__device__ __forceinline__ void plain_blocks(const fc_sm90_params &p, const Tile &g, const Bars<C> &bars,
                                             uint32_t base, const WgThread &w, uint32_t q_addr, int n, int &stage,
                                             uint32_t &phase, int v_stage, uint32_t v_phase, float (&O)[C::D / 2],
                                             uint32_t (&P)[C::BN / 4], RowState &rs, const MaskRows &mr)
{
    float S[C::BN / 2];
    float alpha[2];
    pv_round<C, kBF16>(O, P, bars, base, v_stage, v_phase, w.cw);
    for (n -= C::KVS; n >= g.n_lo; n -= C::KVS) {
        FC90_WAIT(bars.k_full(stage), phase);
        round_begin<C>(w.cw);
        issue_s<C, kBF16>(S, q_addr, base + C::OFF_K + stage * C::KV_BYTES);
        round_end<C>(w.cw);
        wg_wait<0>();
        fence_regs(S);
        mbar_arrive(bars.k_empty(stage));
        softmax_block<C::BN, false, kMask>(S, rs, alpha, p, block_masked<C>(g, n), n * C::BN + w.col_t, mr);
        rescale_o<C::D>(O, alpha);
        convert_p<C::BN, kBF16>(S, P);
        pv_round<C, kBF16>(O, P, bars, base, stage, phase, w.cw);
        advance<C>(stage, phase);
    }
}

/* All of this warpgroup's blocks of tile g, from n = g.n_hi - 1 - kv down:
 * O and rs hold its unnormalised partial at the end. */
template <class C, bool kBF16, int kMask>
__device__ __forceinline__ void attend_tile(const fc_sm90_params &p, const Tile &g, const Bars<C> &bars,
                                            uint32_t base, const WgThread &w, int k, float (&S0)[C::BN / 2],
                                            uint32_t q_addr, int qb, uint32_t q_par, int &stage, uint32_t &phase,
                                            int &q_release, float (&O)[C::D / 2], RowState &rs, const MaskRows &mr)
{
    uint32_t P[C::BN / 4];
    const int n = g.n_hi - 1 - w.kv;
    first_block<C, kBF16, kMask>(p, g, bars, base, w, k, S0, q_addr, qb, q_par, n, stage, phase, q_release, O, P,
                                 rs, mr);
    const int v_stage = stage;
    const uint32_t v_phase = phase;
    advance<C>(stage, phase);
    if (C::OV)
        overlap_blocks<C, kBF16, kMask>(p, g, bars, base, w, q_addr, n, stage, phase, v_stage, v_phase, O, P, rs, mr);
    else
        plain_blocks<C, kBF16, kMask>(p, g, bars, base, w, q_addr, n, stage, phase, v_stage, v_phase, O, P, rs, mr);
}

} /* namespace fc90 */

#endif /* FC_SM90_MAINLOOP_CUH */
