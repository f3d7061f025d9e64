/*
 * bwd_kernel.cuh -- the Hopper (sm_90a) attention backward's main kernel
 * and its launchers; included by the TUs bwd_<dtype>_d<dim>.cu only. The
 * pieces, by role:
 *   bwd_tiles.cuh     the table, shape, layout    bwd_producer.cuh  loads
 *   bwd_gemms.cuh     the five wgmma GEMMs        bwd_scores.cuh    P, dS
 *   bwd_dq.cuh        dQ to dq_accum (bulk reduce-add, deterministic turn)
 *   bwd_split.cuh     the GQA group split over CTAs (small grids)
 * The preprocess (D, lse2, accumulators zeroed) is the sm80-class path's
 * kernel, on the same workspace; bwd_convert.cuh converts dQ (and a
 * split group's dK/dV).
 *
 * One CTA per (key block of 128, batch, KV head), the sm80-class grid and
 * order (bwd_coords.cuh), or with the group split one per share of the
 * group: warp 0 of warpgroup 0 loads, its warp 1 adds dQ
 * to the workspace (bwd_dq.cuh); consumer warpgroups
 * 1 and 2 own 64 keys each, keep dK and dV in registers over every query
 * block of every query head of its share of the GQA group that sees their
 * keys (bwd_ranges.h), and write them once at the end (split: add them).
 *
 * A step (one query block), its S^T and dP^T issued at the end of the step
 * before: P^T once S^T is done, then dV += P^T dO issued while dP^T
 * finishes; dS^T, stored for dQ, and dK += dS^T Q issued; after the dS
 * barrier dQ = dS K; all waited for, the stage released, dQ staged; the
 * next step's S^T and dP^T issued while the writer warp adds this dQ.
 */
#ifndef FC_SM90_BWD_KERNEL_CUH
#define FC_SM90_BWD_KERNEL_CUH

#include <atomic>
#include <climits>
#include <stdio.h>

#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"
#include "cuda/common/smem_optin.cuh"
#include "cuda/sm80/bwd_preprocess.cuh"
#include "cuda/sm90/bwd_convert.cuh"
#include "cuda/sm90/bwd_dq.cuh"
#include "cuda/sm90/bwd_gemms.cuh"
#include "cuda/sm90/bwd_place.cuh"
#include "cuda/sm90/bwd_producer.cuh"
#include "cuda/sm90/bwd_scores.cuh"
#include "cuda/sm90/bwd_split.cuh"

namespace fc90 {

/* Varlen: tile rows from r0 on belong to the next sequence (the TMA box
 * runs on into it): zeroed so that no value of it (an Inf, say) reaches
 * this one's sums through a 0 weight. Both consumer warpgroups, then
 * ordered before the wgmma reads. */
template <uint32_t BYTES, uint32_t ROWS, class C>
__device__ __forceinline__ void bwd_zero_rows(uint32_t t0, uint32_t t1, int r0, int ctid)
{
    fc::dev::zero_rows_from<BYTES, C::SW, ROWS, 256>(t0, r0, (uint32_t)ctid);
    fc::dev::zero_rows_from<BYTES, C::SW, ROWS, 256>(t1, r0, (uint32_t)ctid);
    fence_proxy_async();
    bar_sync(kBwdBarInit, 256);
}

/* dK (times scale) or dV of this warpgroup's keys, 16-bit pairs straight
 * from the accumulators; keys past the sequence are not written. */
template <class C, bool kBF16>
__device__ __forceinline__ void bwd_store_grad(uint16_t *g, int64_t row_stride, int valid, const float (&acc)[C::D / 2],
                                               float mul, int r, int t2)
{
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (r + 8 * h >= valid) continue;
        uint32_t *row = reinterpret_cast<uint32_t *>(g + (int64_t)(r + 8 * h) * row_stride + t2);
#pragma unroll
        for (int j = 0; j < C::D / 8; ++j) row[4 * j] = pack2<kBF16>(acc[4 * j + 2 * h] * mul, acc[4 * j + 2 * h + 1] * mul);
    }
}

/* Step it's loads are in (wait), a varlen tail zeroed, then S^T and dP^T
 * issued as one commit group (P waits for both: design-sm90.md, tried and
 * lost). With `real` false (no step left) one
 * k-step of each is issued on stage 0 without waiting, its result
 * dropped: a wgmma issued on one branch only leaves ptxas unable to track
 * the accumulators in flight across the loop, and it then serialises every
 * wgmma (C7515; the forward's issue_first_s does the same). */
template <class C, bool kBF16, class Place, class ThreadPlace>
__device__ __forceinline__ void bwd_issue_sdp(const fc_sm80_bwd_args &a, const Place &pl, const ThreadPlace &tp,
                                              uint32_t base, int it, int m, int cw, float (&S)[C::BM / 2],
                                              float (&dP)[C::BM / 2], bool real)
{
    if (!real) {
        wg_fence();
        Wgmma<C::BM, kBF16>::ss0(S, desc_kmajor<C::SW>(base + C::OFF_K), desc_kmajor<C::SW>(base + C::OFF_Q));
        Wgmma<C::BM, kBF16>::ss0(dP, desc_kmajor<C::SW>(base + C::OFF_V), desc_kmajor<C::SW>(base + C::OFF_DO));
        wg_commit();
        return;
    }
    const int s = bwd_stage<C>(it);
    FC90_WAIT(C::q_full(base, s), bwd_phase<C>(it));
    const uint32_t q = base + C::OFF_Q + s * C::Q_BYTES, dO = base + C::OFF_DO + s * C::Q_BYTES;
    if (a.p.f.cu_seqlens_q) {
        const int sq = pl.coords(a).sq;
        if ((m + 1) * C::BM > sq) bwd_zero_rows<C::Q_BYTES, C::BM, C>(q, dO, sq - m * C::BM, tp.get().ctid);
    }
    if constexpr (C::EARLY_DS) {
        /* dP^T starts from -D (the producer stores it negated): the GEMM
         * leaves dP - D, whose 32 values a thread would else load in the
         * elementwise part, where the registers are short */
        const uint32_t ld = base + C::OFF_LD + s * C::LD_BYTES + 4u * (C::BM + tp.get().t2);
#pragma unroll
        for (int j = 0; j < C::BM / 8; ++j) {
            const uint64_t dw = lds64(ld + 32u * j);
            dP[4 * j] = dP[4 * j + 2] = __uint_as_float((uint32_t)dw);
            dP[4 * j + 1] = dP[4 * j + 3] = __uint_as_float((uint32_t)(dw >> 32));
        }
        fence_regs(dP); /* the starts written before the fence, not sunk past it */
    }
    wg_fence();
    bwd_issue_kt<C, kBF16, false>(S, base + C::OFF_K, q, cw);
    bwd_issue_kt<C, kBF16, C::EARLY_DS>(dP, base + C::OFF_V, dO, cw);
    wg_commit();
}

/* The queries each of the thread's two keys sees in query block m
 * (fc_bwd_visible_span), for a block that is not whole: C::EARLY_DS rows'
 * mask, worked out while S^T and dP^T are in flight. */
template <class C>
__device__ __forceinline__ void bwd_spans(const fc_sm80_bwd_args &a, const fc::sm80::BwdCoords &c, int m,
                                          const BwdThread &th, fc_bwd_qspan (&sp)[2])
{
    const fc_fwd_params &f = a.p.f;
    const int j = c.n * C::BN + 64 * th.cw + 16 * th.warp + th.g;
    const fc_bwd_mask bm = fc_bwd_mask_of(j, m * C::BM + th.t2, c.sq, c.sk, f.window_left, f.window_right);
    sp[0] = fc_bwd_visible_span(bm, j, C::BM);
    sp[1] = fc_bwd_visible_span(bm, j + 8, C::BM);
}

/* The consumer's end: its keys' dK (times scale) and dV written, or with
 * the group split added into dkv_accum. */
template <class C, bool kBF16, bool kDet, class Place, class ThreadPlace>
__device__ __forceinline__ void bwd_write_dkdv(const fc_sm80_bwd_args &a, const Place &pl, const ThreadPlace &tp,
                                               int cw, const float (&dk)[C::D / 2], const float (&dv)[C::D / 2])
{
    const auto &c = pl.coords(a);
    const auto &th = tp.get();
    const int r = 64 * cw + 16 * th.warp + th.g, valid = c.sk - c.n * C::BN;
    if (!kDet && a.dkv_accum) { /* a share of the group (bwd_split.cuh) */
        bwd_add_grad<C::D>(bwd_dkv_rows(a, c, 0, C::BN), valid, dk, r, th.t2);
        bwd_add_grad<C::D>(bwd_dkv_rows(a, c, 1, C::BN), valid, dv, r, th.t2);
        return;
    }
    const int64_t j0 = c.k_start + (int64_t)c.n * C::BN;
    const fc_bwd_params &b = a.p;
    bwd_store_grad<C, kBF16>((uint16_t *)b.dk + c.bk * b.dk_batch_stride + j0 * b.dk_row_stride +
                                 (int64_t)c.h_kv * b.dk_head_stride,
                             b.dk_row_stride, valid, dk, a.scale, r, th.t2);
    bwd_store_grad<C, kBF16>((uint16_t *)b.dv + c.bk * b.dv_batch_stride + j0 * b.dv_row_stride +
                                 (int64_t)c.h_kv * b.dv_head_stride,
                             b.dv_row_stride, valid, dv, 1.f, r, th.t2);
}

/* Step m's mask: whether the block is whole; if not, the spans of query
 * offsets each of the thread's keys sees (C::EARLY_DS rows) or the held
 * mask's first query. */
template <class C, class Place, class ThreadPlace>
__device__ __forceinline__ bool bwd_step_mask(const fc_sm80_bwd_args &a, const Place &pl, const ThreadPlace &tp, int m,
                                              fc_bwd_mask &bm, fc_bwd_qspan (&sp)[2])
{
    const fc_fwd_params &f = a.p.f;
    const auto &c = pl.coords(a);
    const bool full = fc_bwd_block_full(m, c.n, C::BM, C::BN, c.sq, c.sk, f.window_left, f.window_right);
    if constexpr (C::EARLY_DS) {
        if (!full) bwd_spans<C>(a, c, m, tp.get(), sp);
    } else {
        bm.i0 = m * C::BM + tp.get().t2;
    }
    return full;
}

template <class C, bool kBF16, bool kDet, bool kSoftcap>
__device__ void bwd_consumer(const fc_sm90_bwd_params &prm, uint32_t base, int cw)
{
    const fc_sm80_bwd_args &a = prm.a;
    const fc_fwd_params &f = a.p.f;
    const BwdThreadPlace<C::EARLY_DS> tp(cw);
    const BwdPlace<C, C::EARLY_DS> pl(a);
    FC90_WAIT(C::kv_full(base), 0);
    if (f.cu_seqlens_k) {
        const auto &c = pl.coords(a);
        if ((c.n + 1) * C::BN > c.sk)
            bwd_zero_rows<C::KV_BYTES, C::BN, C>(base + C::OFF_K, base + C::OFF_V, c.sk - c.n * C::BN,
                                                 tp.get().ctid);
    }

    float dk[C::D / 2], dv[C::D / 2];
#pragma unroll
    for (int i = 0; i < C::D / 2; ++i) dk[i] = dv[i] = 0.f;
    fc_bwd_mask bm; /* rows with 64-query steps: the per-element mask, held (else spans, bwd_spans) */
    if constexpr (!C::EARLY_DS) { /* i0 set per step */
        const auto &c = pl.coords(a);
        bm = fc_bwd_mask_of(c.n * C::BN + 64 * cw + 16 * tp.get().warp + tp.get().g, 0, c.sq, c.sk, f.window_left,
                            f.window_right);
    }
    const uint32_t dq_stage = base + C::OFF_DQ + cw * C::DQ_BYTES;

    float S[C::BM / 2], dP[C::BM / 2];
    int m;
    {
        const fc_brange mr = pl.range(a);
        m = mr.hi > mr.lo ? fc_bwd_first_block(fc::sm80::bwd_down<kDet>(a), mr) : -1;
    }
    int gi = m < 0 ? a.group_run : 0;
    fence_regs(dk); /* the zeros defined here, not sunk into the GEMMs' window */
    fence_regs(dv);
    bwd_issue_sdp<C, kBF16>(a, pl, tp, base, 0, m, cw, S, dP, gi < a.group_run);
    for (int it = 0; gi < a.group_run; ++it) {
        const int s = bwd_stage<C>(it);
        const uint32_t q = base + C::OFF_Q + s * C::Q_BYTES, dO = base + C::OFF_DO + s * C::Q_BYTES;
        const uint32_t ld = base + C::OFF_LD + s * C::LD_BYTES;
        fc_bwd_qspan sp[2] = {};
        const bool full = bwd_step_mask<C>(a, pl, tp, m, bm, sp);
        uint32_t P[C::BM / 4], dS[C::BM / 4];
        /* P^T (with softcap dS^T too: it needs tanh's t), dV += P^T dO
         * issued, dS^T computed while it runs (C::EARLY_DS: before) */
        wg_wait<0>();
        fence_regs(S);
        fence_regs(dP);
        if constexpr (C::EARLY_DS) {
            static_assert(!kSoftcap, "EARLY_DS rows have no softcap instance");
            if (full) bwd_p_ds_packed<C, false, kBF16>(S, dP, P, dS, ld, tp.get().t2, a.sl2, sp);
            else bwd_p_ds_packed<C, true, kBF16>(S, dP, P, dS, ld, tp.get().t2, a.sl2, sp);
        } else {
            if (full) bwd_p<C, false, kSoftcap>(S, dP, ld, tp.get().t2, a.sl2, a.softcap_in, bm);
            else bwd_p<C, true, kSoftcap>(S, dP, ld, tp.get().t2, a.sl2, a.softcap_in, bm);
            convert_p<C::BM, kBF16>(S, P);
        }
        wg_fence();
        bwd_issue_acc<C, kBF16>(dv, P, dO);
        wg_commit();
        if constexpr (!C::EARLY_DS && !kSoftcap) bwd_ds<C>(S, dP, ld, tp.get().t2);
        /* dS^T stored for dQ; dK += dS^T Q */
        if constexpr (!C::EARLY_DS) convert_p<C::BM, kBF16>(dP, dS);
        const uint32_t ds_tile = base + C::OFF_DS + (it & 1) * C::DS_BYTES;
        {
            const auto &th = tp.get();
            bwd_store_ds<C>(ds_tile, dS, cw, th.warp, th.g, th.t2);
        }
        fence_proxy_async();
        wg_fence();
        bwd_issue_acc<C, kBF16>(dk, dS, q);
        wg_commit();
        if (C::DQ_ALL_KEYS) bar_sync(kBwdBarDs, 256);
        else bar_sync(kBwdBarWg + cw, 128);
        float dq[C::DQN / 2];
        bwd_issue_dq<C, kBF16>(dq, ds_tile, base + C::OFF_K, cw);
        wg_commit();
        wg_wait<0>();
        fence_regs(dv);
        fence_regs(dk);
        fence_regs(dq);
        fence_regs(P);
        fence_regs(dS);
        mbar_arrive(C::q_empty(base, s));
        /* The next step's S^T and dP^T, and this dQ handed to the writer
         * warp: GEMMs first where their accumulators fit beside dQ's
         * (C::SDP_FIRST), so that the hand-over runs under them. */
        int gn, mn;
        fc_bwd_next_block(fc::sm80::bwd_down<kDet>(a), a.group_run, pl.range(a), gi, m, &gn, &mn);
        gi = gn;
        m = mn;
        if constexpr (!C::SDP_FIRST) bwd_hand_dq<C>(dq_stage, dq, cw, tp.get().tid);
        bwd_issue_sdp<C, kBF16>(a, pl, tp, base, it + 1, m, cw, S, dP, gi < a.group_run);
        if constexpr (C::SDP_FIRST) bwd_hand_dq<C>(dq_stage, dq, cw, tp.get().tid);
    }
    wg_wait<0>(); /* the dropped last issue */
    fence_regs(S);
    fence_regs(dP);

    bwd_write_dkdv<C, kBF16, kDet>(a, pl, tp, cw, dk, dv);
}

template <int kRow, bool kBF16, bool kDet, bool kSoftcap>
__global__ void __launch_bounds__(384, 1) fc_sm90_bwd_kernel(const __grid_constant__ fc_sm90_bwd_params prm)
{
    using C = BwdCfg<kRow>;
    extern __shared__ __align__(kSmemAlign) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + (kSmemAlign - 1u)) & ~(kSmemAlign - 1u);
    if (threadIdx.x == 0) {
        tma_prefetch_map(&prm.tm_q);
        tma_prefetch_map(&prm.tm_k);
        tma_prefetch_map(&prm.tm_v);
        tma_prefetch_map(&prm.tm_do);
        mbar_init(C::kv_full(base), 1);
#pragma unroll
        for (int s = 0; s < C::ST; ++s) {
            mbar_init(C::q_full(base, s), 33);
            mbar_init(C::q_empty(base, s), 256);
        }
        mbar_fence_init();
    }
    __syncthreads();
    /* PDL: the convert may launch; the wait for the preprocess's lse2, D and
     * zeroed accumulators is each role's own (the producer's comes after its
     * first K/V and Q/dO loads: inputs, visible once the preprocess waited). */
    fc_grid_dep_launch();
    {
        /* past this sequence's keys: nothing to do (uniform per CTA) */
        const fc::sm80::BwdCoords c = bwd_coords(prm.a);
        if ((int64_t)c.n * C::BN >= c.sk) return;
    }
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
    if (wg == 0) {
        reg_dealloc<C::PRODUCER_REGS>();
        if (threadIdx.x < 32) {
            bwd_producer<C, kDet>(prm, base, (int)threadIdx.x);
        } else if (threadIdx.x < 64) {
            fc_grid_dep_wait();
            bwd_dq_writer<C, kDet>(prm.a, base, (int)threadIdx.x - 32);
        }
    } else {
        reg_alloc<C::CONSUMER_REGS>();
        fc_grid_dep_wait(); /* split: dkv_accum zeroed by the preprocess */
        bwd_consumer<C, kBF16, kDet, kSoftcap>(prm, base, wg - 1);
    }
}

template <int kRow, bool kBF16, bool kDet, bool kSoftcap>
fc_status bwd_launch_main(const fc_sm90_bwd_params *prm, int device, cudaStream_t stream, char *err, size_t err_len)
{
    using C = BwdCfg<kRow>;
    void (*kern)(const fc_sm90_bwd_params) = fc_sm90_bwd_kernel<kRow, kBF16, kDet, kSoftcap>;
    static std::atomic<unsigned long long> opted_in{0};
    const fc_status opt = fc_smem_opt_in(kern, C::SMEM, device, opted_in, "sm90 backward", kRow, err, err_len);
    if (opt != FC_OK) return opt;
    const fc_sm80_bwd_args &a = prm->a;
    const long long grid = ((long long)a.order.n_blocks.d * a.p.f.batch * a.p.f.heads_kv) << a.split_shift;
    if (grid > INT_MAX) {
        snprintf(err, err_len, "internal: sm90 backward grid of %lld CTAs (the planner should have refused)", grid);
        return FC_ERR_INTERNAL;
    }
    if (grid > 0)
        FC_CUDA_TRY("sm90 backward kernel launch",
                    fc_launch(kern, (unsigned)grid, C::THREADS, (size_t)C::SMEM, stream, a.pdl != 0, *prm));
    return FC_OK;
}

/* The preprocess (D, lse2, the chunked dq_accum and any dkv_accum
 * zeroed), the row's main kernel for the call's mode, and the convert
 * (dQ and, split, dK/dV). */
template <int kRow, bool kBF16>
fc_status bwd_launch_row(const fc_sm90_bwd_params *prm, int device, cudaStream_t stream, char *err, size_t err_len)
{
    using C = BwdCfg<kRow>;
    const fc_sm80_bwd_args &a = prm->a;
    const bool pdl = a.pdl != 0;
    FC_CUDA_TRY("sm90 backward preprocess launch", (fc::sm80::launch_bwd_preprocess<kBF16, C::D>(a, stream, pdl)));
    const bool det = a.p.deterministic != 0, cap = a.softcap_in != 0.f;
    fc_status st;
    if constexpr (C::T.softcap) {
        if (det) st = cap ? bwd_launch_main<kRow, kBF16, true, true>(prm, device, stream, err, err_len)
                          : bwd_launch_main<kRow, kBF16, true, false>(prm, device, stream, err, err_len);
        else st = cap ? bwd_launch_main<kRow, kBF16, false, true>(prm, device, stream, err, err_len)
                      : bwd_launch_main<kRow, kBF16, false, false>(prm, device, stream, err, err_len);
    } else {
        if (cap) {
            snprintf(err, err_len, "internal: sm90 backward row %d has no softcap kernel", kRow);
            return FC_ERR_INTERNAL;
        }
        st = det ? bwd_launch_main<kRow, kBF16, true, false>(prm, device, stream, err, err_len)
                 : bwd_launch_main<kRow, kBF16, false, false>(prm, device, stream, err, err_len);
    }
    if (st != FC_OK) return st;
    const dim3 grid = bwd_convert_grid(a);
    if (grid.x > 0)
        FC_CUDA_TRY("sm90 backward convert launch", fc_launch(bwd_convert<C, kBF16>, grid, 128, 0, stream, pdl, a));
    return FC_OK;
}

template <bool kBF16, int kD, int I = 0>
fc_status bwd_launch_config(int row, const fc_sm90_bwd_params *prm, int device, cudaStream_t s, char *err, size_t len)
{
    if constexpr (I >= kNumBwdRows) {
        snprintf(err, len, "internal: sm90 backward row %d has no d%d kernel", row, kD);
        return FC_ERR_INTERNAL;
    } else {
        if constexpr (kBwdRows[I].head_dim == kD) {
            if (row == I) return bwd_launch_row<I, kBF16>(prm, device, s, err, len);
        }
        return bwd_launch_config<kBF16, kD, I + 1>(row, prm, device, s, err, len);
    }
}

} /* namespace fc90 */

#define FC_SM90_DEFINE_BWD_LAUNCHER(tag, is_bf16, dim)                                                        \
    fc_status fc_sm90_bwd_launch_##tag##_d##dim(int row, const fc_sm90_bwd_params *prm, int device,           \
                                                cudaStream_t s, char *err, size_t len)                        \
    {                                                                                                         \
        return fc90::bwd_launch_config<(is_bf16) != 0, dim>(row, prm, device, s, err, len);                  \
    }

#endif /* FC_SM90_BWD_KERNEL_CUH */
