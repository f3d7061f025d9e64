/*
 * config.cuh -- compile-time shape of one Hopper kernel instance (Cfg, from
 * a row of tiles.cuh), its shared-memory layout, its mbarriers (Bars) and
 * its named-barrier ids.
 *
 * Shared memory (from a 1024-aligned base):
 *   Q     [qbuf][panel][block_m rows][swz bytes]   (a tile's own Q buffer is
 *                                                  reused as its O staging)
 *   K     [stage][panel][block_n rows][swz bytes]
 *   V     [stage][panel][block_n rows][swz bytes]
 *   merge kvsplit partials (tiles.cuh merge_bytes)
 *   bars  Bars below
 * A "panel" is swz/2 head_dim columns: rows of one swizzle span, what one
 * TMA box and one wgmma descriptor row cover.
 */
#ifndef FC_SM90_CONFIG_CUH
#define FC_SM90_CONFIG_CUH

#include "constants.h"
#include "cuda/common/mask_mode.h"
#include "cuda/sm90/ptx_sm90.cuh"
#include "cuda/sm90/sm90.h"
#include "cuda/sm90/tiles.cuh"

namespace fc90 {

/* Named barrier ids (0 is __syncthreads). */
enum : uint32_t {
    kBarSched = 1, /* + consumer index: pingpong turn of that warpgroup (256 threads) */
    kBarEpi = 8,   /* + consumer index: epilogue of one warpgroup (128 threads)        */
    kBarVz = 12    /* + consumer index: V tail rows zeroed (zero_v_tail, 128 threads)  */
};

/* Which blocks may need the softcap and mask code (mask_mode.h proves it per
 * call; fc_sm90_params.masks): none, a tile's first block only (the highest
 * KV block, where a causal diagonal lies), or any. */
enum MaskMode { kMaskNone = FC_MASKS_NONE, kMaskFirst = FC_MASKS_FIRST, kMaskAny = FC_MASKS_ANY };

template <int kCfg, bool kTail = false> struct Cfg {
    static constexpr TileRow T = kTiles[kCfg];
    static constexpr int D = T.head_dim;
    static constexpr int BM = T.block_m;
    static constexpr int BN = T.block_n;
    static constexpr int WG = T.wgs;
    static constexpr int ST = T.stages;
    static constexpr int QB = T.qbufs;               /* Q buffers (1 or 2)           */
    static constexpr int SW = T.swz;                 /* bytes per panel row          */
    static constexpr int PW = SW / 2;                /* elements per panel row       */
    static constexpr int PANELS = D / PW;
    static constexpr int KSTEPS = D / 16;            /* k16 steps of S = Q K^T       */
    static constexpr int KPP = SW / 32;              /* k16 steps within one panel   */
    static constexpr int PVSTEPS = BN / 16;          /* k16 steps of O += P V        */
    static constexpr bool PP = T.pingpong && T.wgs > 1 && !FC_SM90_SIMPLE;
    static constexpr bool OV = T.overlap && !FC_SM90_SIMPLE;
    static constexpr int THREADS = 128 * (WG + 1);
    static constexpr int CONSUMERS = 128 * WG;
    static constexpr int KVS = T.kvsplit;            /* warpgroups sharing one tile's KV blocks */
    /* The tail-balanced instance (plan.cu tail_on says when, tiles.cuh
     * tail_row which rows can) is its own: its split and merge code in a
     * shared instance cost the others' main loop 4 R2UR at d128 and 1.5% at
     * s512-d64 (uniform-register pressure). */
    static constexpr bool TAIL = kTail && tail_row(T);
    static constexpr int KV_CONSUMERS = CONSUMERS / KVS; /* threads that read one K/V block */
    static constexpr uint32_t Q_BYTES = BM * D * 2;
    static constexpr uint32_t KV_BYTES = BN * D * 2;
    static constexpr uint32_t OFF_Q = 0;
    static constexpr uint32_t OFF_K = OFF_Q + QB * Q_BYTES;
    static constexpr uint32_t OFF_V = OFF_K + ST * KV_BYTES;
    static constexpr uint32_t OFF_MERGE = OFF_V + ST * KV_BYTES;
    static constexpr uint32_t OFF_BAR = OFF_MERGE + merge_bytes(T);
    static constexpr int SMEM = smem_bytes(T);

    /* 2-4 consumer warpgroups move registers with setmaxnreg (tiles.cuh);
     * 1 may use 255 from the start. */
    static_assert(WG >= 1 && WG <= 4, "1 to 4 consumer warpgroups");
    static_assert(WG + 1 <= FC_SM90_TRACE_ROLES, "a trace role per warpgroup (sm90.h)");
    static constexpr int CTAS = T.ctas;             /* CTAs per SM (launch bounds) */
    static constexpr bool SETMAXNREG = WG >= 2 || CTAS > 1;
    static constexpr int PRODUCER_REGS = producer_regs(WG);
    static constexpr int CONSUMER_REGS = consumer_regs(WG, CTAS);
    static_assert(tile_ok(T), "tiles.cuh tile_ok");
    static_assert(OFF_BAR + kBarrierBytes + kSmemAlign == (uint32_t)SMEM, "layout = table");
};

/* A consumer thread's place in its tile: warpgroup cw computes the tile's
 * rows 64*rg.. over every KVS-th KV block from the kv-th (kvsplit), else
 * rg = cw and kv = 0; row_wg and col_t locate its accumulator elements
 * (softmax.cuh has the layout). */
struct WgThread {
    int cw;     /* consumer warpgroup index                  */
    int tid;    /* 0..127 within the warpgroup               */
    int lane;
    int rg, kv;
    int row_wg; /* tile row of accumulator rows r (and r+8)  */
    int col_t;  /* column of acc[4j] within 8-column group j */
};
template <class C> __device__ __forceinline__ WgThread wg_thread(int cw)
{
    WgThread w;
    w.cw = cw;
    w.tid = threadIdx.x - 128 * (cw + 1);
    const int warp = w.tid >> 5;
    w.lane = w.tid & 31;
    w.rg = cw / C::KVS;
    w.kv = cw % C::KVS;
    w.row_wg = 64 * w.rg + 16 * warp + (w.lane >> 2);
    w.col_t = 2 * (w.lane & 3);
    return w;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

/* XOR swizzle of a byte offset inside a 1024-aligned region: 16-byte chunk
 * bits [4, 4+b) ^= row bits [7, 7+b), b = 3 for 128B, 2 for 64B (the pattern
 * TMA writes and wgmma reads). */
template <int kSwz> __host__ __device__ __forceinline__ uint32_t swz(uint32_t off)
{
    return off ^ (((off >> 7) & (kSwz / 16 - 1)) << 4);
}

/* The CTA's mbarriers (8 bytes each) and scheduler words, at OFF_BAR. */
template <class C> struct Bars {
    uint32_t base;
    /* Two slots each for the Q barriers whatever QB is (b < QB used). */
    __device__ __forceinline__ uint32_t q_full(int b) const { return base + 8 * b; }
    __device__ __forceinline__ uint32_t q_empty(int b) const { return base + 16 + 8 * b; }
    __device__ __forceinline__ uint32_t k_full(int s) const { return base + 32 + 8 * s; }
    __device__ __forceinline__ uint32_t k_empty(int s) const { return base + 32 + 8 * (C::ST + s); }
    __device__ __forceinline__ uint32_t v_full(int s) const { return base + 32 + 8 * (2 * C::ST + s); }
    __device__ __forceinline__ uint32_t v_empty(int s) const { return base + 32 + 8 * (3 * C::ST + s); }
    /* Dynamic scheduler: a 2-slot ring of tile indices, producer -> consumers. */
    __device__ __forceinline__ uint32_t t_full(int i) const { return base + 32 + 32 * C::ST + 8 * i; }
    __device__ __forceinline__ uint32_t t_empty(int i) const { return base + 48 + 32 * C::ST + 8 * i; }
    __device__ __forceinline__ uint32_t t_slot(int i) const { return base + 64 + 32 * C::ST + 4 * i; }
    /* kvsplit: the second warpgroup's partials in the merge area (full), and
     * read by the first (empty). */
    __device__ __forceinline__ uint32_t m_full() const { return base + 72 + 32 * C::ST; }
    __device__ __forceinline__ uint32_t m_empty() const { return base + 80 + 32 * C::ST; }
    /* Tail balancing: the arrival count a warpgroup's thread 0 read, for
     * the other 127 threads. */
    __device__ __forceinline__ uint32_t t_flag(int cw) const { return base + 88 + 32 * C::ST + 4 * cw; }
    static_assert(88 + 32 * C::ST + 4 * 3 <= kBarrierBytes, "barrier area");
};

/* Initialise the CTA's mbarriers (one thread), before the __syncthreads. */
template <class C> __device__ __forceinline__ void init_bars(const Bars<C> &bars)
{
#pragma unroll
    for (int b = 0; b < C::QB; ++b) {
        mbar_init(bars.q_full(b), 1);
        mbar_init(bars.q_empty(b), C::CONSUMERS);
    }
    /* Both scheduler slots, whatever QB is. */
#pragma unroll
    for (int b = 0; b < 2; ++b) {
        mbar_init(bars.t_full(b), 1);
        mbar_init(bars.t_empty(b), C::CONSUMERS);
    }
    if (C::KVS > 1) {
        mbar_init(bars.m_full(), 128);
        mbar_init(bars.m_empty(), 128);
    }
#pragma unroll
    for (int s = 0; s < C::ST; ++s) {
        mbar_init(bars.k_full(s), 1);
        mbar_init(bars.k_empty(s), C::KV_CONSUMERS);
        mbar_init(bars.v_full(s), 1);
        mbar_init(bars.v_empty(s), C::KV_CONSUMERS);
    }
    mbar_fence_init();
}

} /* namespace fc90 */

#endif /* FC_SM90_CONFIG_CUH */
