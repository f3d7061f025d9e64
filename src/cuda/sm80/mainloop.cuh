/*
 * mainloop.cuh -- the KV loop of the sm80-class kernel: the load pipeline
 * (a `stages`-deep cp.async ring, split K/V buffers, or TMA into the split
 * buffers) and, per KV block of block_n keys,
 *
 *   S = Q K^T            mma.cuh, fp32 accumulate
 *   [softcap] [mask]     softmax.cuh; masks only on blocks straddling the
 *                        band or the sequence tail
 *   online softmax       softmax.cuh
 *   O += P V             mma.cuh, P from registers, V via ldmatrix.trans
 *
 * Ring (stages >= 2): the load of block j+stages-1 is issued before block j
 * is computed, one __syncthreads per block. Split (stages 1): one K and one
 * V tile, each refilled by its own cp.async group as soon as the other half
 * of the block's work no longer reads it (V_j lands during S = Q K_j^T,
 * K_{j+1} during O += P V_j; two __syncthreads per block): half the smem of
 * a 2-stage ring, so that two 64x64 d256 CTAs fit on an sm_90 SM and hide
 * each other's load latency.
 *
 * Split K/V invariant. Every thread commits the same sequence of cp.async
 * groups, and at each wait exactly ONE group of its own is pending -- the
 * one the next phase reads -- so wait_group 0 is exact:
 *   top of block n:  pending {K_n} (for n_begin: {Q + K_n}, prologue)
 *     wait_group 0 ; __syncthreads
 *       -> K_n (and Q) visible to all; every thread is past O += P V_{n-1},
 *          so the V buffer is free: issue V_n, commit.   pending {V_n}
 *     S = Q K_n^T, softcap, masks (read the K buffer)
 *     wait_group 0 ; __syncthreads
 *       -> V_n visible to all; every thread is past S = Q K_n^T, so the
 *          K buffer is free: issue K_{n+1} (if n+1 < n_end; the group is
 *          committed, possibly empty, either way).  pending {K_{n+1}}
 *     softmax, O += P V_n (reads the V buffer)
 * So a buffer is only written between the barrier after its last reader and
 * the barrier before its next reader, and that barrier follows the writer
 * thread's own wait for the group. The epilogue's O staging in the Q tile
 * needs nothing more (each warp only touches its own rows of it).
 * kVarTma: the same two points per block, with the copies issued by thread 0
 * and awaited on the buffers' mbarriers (each completes once per block:
 * phase parity ph). A buffer is rearmed only after the __syncthreads that
 * follows every thread's last read of it and its own wait on the previous
 * phase, so no wait can see a phase two ahead. Q is the only cp.async group.
 */
#ifndef FC_SM80_MAINLOOP_CUH
#define FC_SM80_MAINLOOP_CUH

#include <stdint.h>

#include <type_traits>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/fwd_args.h"
#include "cuda/sm80/layout.cuh"
#include "cuda/sm80/loads.cuh"
#include "cuda/sm80/loads_kv8.cuh"
#include "cuda/sm80/mma.cuh"
#include "cuda/sm80/schedule.cuh"
#include "cuda/sm80/softmax.cuh"

namespace fc {
namespace sm80 {

/* KV_BASE_IN_SMEM: park the K/V bases and the mask-free block range in smem
 * (re-read at each load / mask test): with them held, these are the
 * registers ptxas spills. */
template <class S_>
__device__ __forceinline__ void park_kv_bases(const KvAddr &ka, const Smem &sm, const BlockRange &br, int tid)
{
    if constexpr (S_::KV_BASE_IN_SMEM) {
        if (tid == 0) {
            dev::sts64(sm.base, (uint64_t)ka.kb0);
            dev::sts64(sm.base + 8, (uint64_t)ka.vb0);
            dev::sts64(sm.base + 16, (uint64_t)(uint32_t)br.n_full_lo | ((uint64_t)(uint32_t)br.n_full_hi << 32));
        }
        /* LEAN_ADDR: the prologue's loads take kb0/vb0 from registers and
         * the first smem read is after the main loop's first barrier. */
        if constexpr (!S_::LEAN_ADDR) __syncthreads();
    }
}

/* Prologue: group 0 = Q + block n_begin (split: Q + K tile of n_begin only);
 * ring: groups 1..STAGES-2 = next blocks. EARLY: group 0 = Q + K of
 * n_begin, group 1 = V of n_begin, groups 2..STAGES = blocks
 * n_begin+1..n_begin+STAGES-1 (all slots free). */
template <class S_>
__device__ __forceinline__ void pipeline_prologue(const fc_sm80_args &a, const fc_sm80_kv_maps *maps,
                                                  const TileCoords &c, KvAddr &ka, const Smem &sm, int tid,
                                                  int n_begin, int n_end)
{
    constexpr int STAGES = S_::STAGES;
    const fc_fwd_params &p = a.p;
    q_load<S_>(a, c, sm.q, tid);
    if constexpr (S_::TMA) {
        /* The barriers are initialised by the thread that first arms them;
         * every other thread's first wait follows the loop's first
         * __syncthreads. */
        if (tid == 0) {
            fc90::mbar_init(sm.bar_k, 1);
            fc90::mbar_init(sm.bar_v, 1);
            fc90::mbar_fence_init();
            tma_tile<S_>(c, ka.h_kv, n_begin, &maps->k, sm.kv, sm.bar_k);
        }
        ptx::cp_async_commit(); /* Q alone */
    } else if constexpr (S_::KV_SPLIT) {
        kv_load<S_>(p, ka, sm, n_begin, 0, LoadK{}, Flag<true>{});
        ptx::cp_async_commit();
    } else if constexpr (S_::EARLY) {
        kv_load<S_>(p, ka, sm, n_begin, 0, LoadK{}, Flag<true>{});
        ptx::cp_async_commit();
        kv_load<S_>(p, ka, sm, n_begin, 0, LoadV{}, Flag<true>{});
        ptx::cp_async_commit();
#pragma unroll
        for (int s = 1; s < STAGES; ++s) {
            if (n_begin + s < n_end) kv_load<S_>(p, ka, sm, n_begin + s, s, LoadKV{}, Flag<true>{});
            ptx::cp_async_commit(); /* always commit: keeps the group count uniform */
        }
    } else {
        kv_load<S_>(p, ka, sm, n_begin, 0, LoadKV{}, Flag<true>{});
        ptx::cp_async_commit();
#pragma unroll
        for (int s = 1; s < STAGES - 1; ++s) {
            if (n_begin + s < n_end) kv_load<S_>(p, ka, sm, n_begin + s, s, LoadKV{}, Flag<true>{});
            ptx::cp_async_commit(); /* always commit: keeps the group count uniform */
        }
    }
}

/* Ring, steady state: block n landed and visible, and block n+STAGES-1
 * issued into the stage block n-1 used (plain inline taking references:
 * written inline, ptxas spills 8 bytes in 128x128 d64 v1/v3). (EARLY, n > n_begin: STAGES+1 +
 * (n - n_begin - 1) groups committed, block n is number n - n_begin + 1:
 * the same STAGES-2 may be pending.) */
template <class S_>
__device__ inline void ring_top(const fc_fwd_params &p, KvAddr &ka, const Smem &sm, const int &n,
                                const int &n_end, const int &stage)
{
    constexpr int STAGES = S_::STAGES;
    ptx::cp_async_wait<STAGES - 2>();
    /* Block n now visible to every thread; every thread is done with block
     * n-1, whose stage is the one block n+STAGES-1 refills. */
    __syncthreads();
    int ls = stage + STAGES - 1;
    if (ls >= STAGES) ls -= STAGES;
    if (n + STAGES - 1 < n_end) kv_load<S_>(p, ka, sm, n + STAGES - 1, ls, LoadKV{}, Flag<false>{});
    ptx::cp_async_commit();
}

/* How the main loop hands the ring stage to block_top: by value in the
 * plain kernel, by reference in the variants -- the forms each had before
 * the split, which keep their PTX instruction for instruction. */
template <class S_>
using StageArg = typename std::conditional<S_::VAR == 0, int, const int &>::type;

/* Top of block n: wait for its K tile (ring: the whole block) and refill the
 * buffer that has just become free. */
template <class S_>
__device__ __forceinline__ void block_top(const fc_sm80_args &a, const fc_sm80_kv_maps *maps, const TileCoords &c,
                                          KvAddr &ka, const Smem &sm, int tid, int n, int n_end,
                                          StageArg<S_> stage, uint32_t ph, bool first)
{
    constexpr int STAGES = S_::STAGES;
    const fc_fwd_params &p = a.p;
    if constexpr (S_::TMA) {
        ptx::cp_async_wait<0>(); /* Q (block n_begin; a no-op after)   */
        __syncthreads();         /* Q visible; V buffer free           */
        if (tid == 0) tma_tile<S_>(c, ka.h_kv, n, &maps->v, sm.kv + S_::KV_BYTES, sm.bar_v);
        fc90::mbar_wait(sm.bar_k, ph); /* K_n landed                */
    } else if constexpr (S_::KV_SPLIT) {
        ptx::cp_async_wait<0>(); /* K_n (+ Q at n_begin) landed       */
        __syncthreads();         /* visible; V buffer free (invariant) */
        kv_load<S_>(p, ka, sm, n, 0, LoadV{}, Flag<false>{});
        ptx::cp_async_commit();
    } else if constexpr (S_::EARLY) {
        if (first) {
            /* Block n_begin: STAGES+1 groups committed and group 0 (Q + K_n)
             * is needed: STAGES may remain. Block n+STAGES-1 was issued by
             * the prologue. */
            ptx::cp_async_wait<STAGES>();
            __syncthreads();
        } else {
            ring_top<S_>(p, ka, sm, n, n_end, stage);
        }
    } else {
        ring_top<S_>(p, ka, sm, n, n_end, stage);
    }
}

/* Between S = Q K_n^T and the softmax (split buffers only): wait for V_n and
 * refill the K buffer with block n+1. */
template <class S_, bool PLAIN>
__device__ __forceinline__ void block_mid(const fc_sm80_args &a, const fc_sm80_kv_maps *maps, const TileCoords &c,
                                          KvAddr &ka, const Smem &sm, int tid, int n, int n_end, uint32_t &ph)
{
    const fc_fwd_params &p = a.p;
    if constexpr (S_::TMA) {
        __syncthreads(); /* every thread is past S = Q K_n^T: K buffer free */
        if (tid == 0 && n + 1 < n_end) tma_tile<S_>(c, ka.h_kv, n + 1, &maps->k, sm.kv, sm.bar_k);
        fc90::mbar_wait(sm.bar_v, ph); /* V_n landed                      */
        ph ^= 1;
        /* A varlen sequence's last block: V rows sk - n*BN .. BN-1 are the
         * next sequence's (tma_tile). Zero them; the barrier orders the
         * zeros before every warp's P V. It is the range's last block, so no
         * later copy lands in the V buffer. Varlen never runs the plain
         * instance (mask_mode.h), which therefore leaves it out. */
        if (!PLAIN && p.cu_seqlens_k && (n + 1) * S_::BN > ka.sk) {
            dev::zero_rows_from<S_::KV_BYTES, S_::PB, S_::BN, S_::NT>(sm.kv + S_::KV_BYTES, ka.sk - n * S_::BN, tid);
            __syncthreads();
        }
    } else if constexpr (S_::KV_SPLIT) {
        ptx::cp_async_wait<0>(); /* V_n landed                             */
        __syncthreads();         /* visible; K buffer free (invariant)     */
        if (n + 1 < n_end) kv_load<S_>(p, ka, sm, n + 1, 0, LoadK{}, Flag<false>{});
        ptx::cp_async_commit(); /* always: one pending group at each wait */
    }
}

/* The KV loop of the CTA of tile c: accumulates o, m_run, l_run over the
 * blocks the tile sees. */
template <bool kBF16, class S_, bool PLAIN>
__device__ __forceinline__ void mainloop(const fc_sm80_args &a, const fc_sm80_kv_maps *maps, const Smem &sm,
                                         const Thr &th, const TileCoords &c, float (&o)[S_::MT][S_::DTL][4],
                                         float (&m_run)[S_::MT][2], float (&l_run)[S_::MT][2])
{
    constexpr int MT = S_::MT, STAGES = S_::STAGES;
    const fc_fwd_params &p = a.p;
    int jmin[MT][2], jmax[MT][2];
    const BlockRange br = key_range<S_, PLAIN>(a, c, th, sm, jmin, jmax);
    const int n_begin = br.n_begin, n_end = br.n_end;

    KvAddr ka = kv_addr<S_>(a, c, th.tid);
    park_kv_bases<S_>(ka, sm, br, th.tid);
    float kd = 1.f; /* kVarKv8: the CTA's k_descale */
    if constexpr (S_::KV8) {
        kv8_addr<S_>(a, c, ka);
        kd = kv8_descale(p.k_descale, c.b, ka.h_kv);
    } else {
        kv_addr_thread<S_>(p, ka);
    }
    (void)kd;
    if constexpr (S_::PAGED) paged_fetch<S_>(ka, n_begin);

    QFrags<S_> qf;
    const float sl2 = a.sl2;
    const float softcap_in = a.softcap_in;
    if (n_begin < n_end) pipeline_prologue<S_>(a, maps, c, ka, sm, th.tid, n_begin, n_end);

    int stage = 0;    /* ring stage of block n                                  */
    uint32_t ph = 0;  /* TMA: the buffers' mbarrier phase parity                */
    (void)ph;
    bool first = true; /* EARLY: block n_begin (a predicate, not n_begin kept live) */
    for (int n = n_begin; n < n_end; ++n) {
        block_top<S_>(a, maps, c, ka, sm, th.tid, n, n_end, stage, ph, first);
        if constexpr (S_::KV8) { /* the block's bytes into the 16-bit panels */
            convert_kv8<kBF16, S_>(p, sm, ka, stage);
            __syncthreads();
        }
        if constexpr (S_::Q_IN_REGS)
            if (n == n_begin) load_q_frags<S_>(qf, sm.q, th.wrow, th.lane);
        /* (kVarWarpKeys: the warp's rows of the K and V panels) */
        const uint32_t sK = (S_::KV8 ? sm.cvt : sm.kv + stage * S_::STAGE_BYTES) + warp_key0<S_>(th) * S_::PB,
                       sV = sK + S_::KV_BYTES;

        float s[MT][S_::NTL][4];
        gemm_qk<kBF16, S_>(s, qf, sm.q, sK, th.wrow, th.lane);
        if constexpr (S_::KV8) kv8_scale_scores<S_>(s, kd);
        if (!PLAIN && softcap_in != 0.f) apply_softcap<S_>(s, softcap_in);

        /* masks, only on blocks straddling a band edge or sk */
        int nf_lo = br.n_full_lo, nf_hi = br.n_full_hi;
        if constexpr (S_::KV_BASE_IN_SMEM && !PLAIN) { /* (volatile: really re-read) */
            const uint64_t v = dev::lds64(sm.base + 16);
            nf_lo = (int)(uint32_t)v;
            nf_hi = (int)(uint32_t)(v >> 32);
        }
        if (!PLAIN && (n < nf_lo || n >= nf_hi)) apply_mask<S_>(s, n, th, sm, jmin, jmax);

        block_mid<S_, PLAIN>(a, maps, c, ka, sm, th.tid, n, n_end, ph);
        online_softmax<S_>(s, o, m_run, l_run, sl2);
        if constexpr (S_::EARLY) {
            if (first) {
                /* V of the first block: group 1 of the STAGES+1 committed. */
                ptx::cp_async_wait<STAGES - 1>();
                __syncthreads();
            }
        }
        gemm_pv<kBF16, S_>(o, s, sV, th.lane);
        stage = (stage + 1 == STAGES) ? 0 : stage + 1;
        if constexpr (S_::EARLY) first = false;
    }
    ptx::cp_async_wait<0>(); /* only empty groups can remain; drain anyway */
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_MAINLOOP_CUH */
