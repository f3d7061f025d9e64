/*
 * bwd_tiles.cuh -- the Hopper backward's table of tile rows (the one source
 * of truth: bwd_plan.cu picks a row, the TUs bwd_<dtype>_d<dim>.cu
 * instantiate it) and BwdCfg, the compile-time shape and shared-memory
 * layout of one row.
 *
 * CTA = 1 producer warpgroup (warp 0 loads, warp 1 adds dQ) + 2 consumer
 * warpgroups, each owning 64 of the CTA's block_n = 128 keys: S^T and dP^T
 * (64 keys x block_m queries), dK and dV (64 keys x head_dim, fp32, in
 * registers for the whole query range). Registers after setmaxnreg: 40 /
 * 232, or 24 / 240 for 128-query rows (384 threads, 168 at entry).
 *
 * dQ of a query block, dS K, is computed by both warpgroups from the dS^T
 * tile in shared memory, split one of three ways (dq_split):
 *   kDqByKeys  each warpgroup all of head_dim over its own 64 keys; both
 *              add into the same rows;
 *   kDqByCols  each warpgroup half of head_dim over all 128 keys (both
 *              warpgroups' dS first: one 256-thread barrier); needs
 *              head_dim / 2 a multiple of 64 (a whole 128B MN-major panel
 *              of K);
 *   kDqByRows  (block_m 128) each warpgroup 64 of the queries, all of
 *              head_dim over all 128 keys (the same barrier): one chunk of
 *              dq_accum each.
 * Either way a warpgroup's fp32 64-row block goes through shared memory to
 * dq_accum by bulk reduce-add (cp.reduce.async.bulk), one instruction per
 * warpgroup.
 *
 * Shared memory (1024-aligned base):
 *   K, V     [panel][block_n rows][swz bytes]            loaded once
 *   Q, dO    [stage][panel][block_m rows][swz bytes]     the query ring
 *   dS^T     [2][block_m / 64 panels][block_n rows][128 bytes]
 *   dQ       [2 warpgroups][64 rows x dq cols] fp32, in dq_accum's chunk
 *            order (bwd_dq.cuh)
 *   lse2, D  [stage][2][block_m] fp32
 *   bars     kv_full, q_full[stages], q_empty[stages]
 */
#ifndef FC_SM90_BWD_TILES_CUH
#define FC_SM90_BWD_TILES_CUH

#include <stdint.h>

#include "constants.h"
#include "cuda/sm90/tiles.cuh"

namespace fc90 {

/* How the warpgroups share a step's dQ (above). */
enum { kDqByKeys = 0, kDqByCols = 1, kDqByRows = 2 };

struct BwdRow {
    int head_dim;
    int block_m;  /* query rows per step: N of S^T and dP^T, K of dV and dK */
    int block_n;  /* keys per CTA: 64 per consumer warpgroup                */
    int stages;   /* depth of the Q, dO, lse2, D ring                        */
    int swz;      /* swizzle of the Q, K, V, dO tiles: 128, or 64 (d96)      */
    int dq_split; /* kDqByKeys, kDqByCols or kDqByRows                       */
    int softcap;  /* 1: has softcap instances; 0: the planner takes another row */
};

/* clang-format off */
constexpr BwdRow kBwdRows[] = {
    /* 0: d64: 128-query steps (S^T, dP^T 64 floats each beside dK, dV's 64): half the
     *    steps' fixed work a query; dQ by rows (a half-width N of 32 is no whole panel);
     *    no softcap (tanh's temporaries spilled 8 bytes at 232 registers); 195 KB     */
    {.head_dim = 64, .block_m = 128, .block_n = 128, .stages = 2, .swz = 128, .dq_split = kDqByRows, .softcap = 0},
    /* 1: d64 with softcap: 64-query steps, dQ by keys; 133 KB                              */
    {.head_dim = 64, .block_m = 64, .block_n = 128, .stages = 2, .swz = 128, .dq_split = kDqByKeys, .softcap = 1},
    /* 2: d96: 64-byte swizzle (96 % 64 != 0), dQ by keys; 182 KB                         */
    {.head_dim = 96, .block_m = 64, .block_n = 128, .stages = 2, .swz = 64, .dq_split = kDqByKeys, .softcap = 1},
    /* 3: d128: dQ by columns (64 fp32 per thread instead of 128 with dK and dV live); 198 KB */
    {.head_dim = 128, .block_m = 64, .block_n = 128, .stages = 2, .swz = 128, .dq_split = kDqByCols, .softcap = 1},
};
/* clang-format on */
constexpr int kNumBwdRows = (int)(sizeof kBwdRows / sizeof kBwdRows[0]);

/* Rows of a dq_accum chunk (bwd_dq.cuh): one warpgroup's dQ rows (wgmma's M). */
constexpr int kBwdChunk = 64;

constexpr int bwd_dq_cols(const BwdRow &t) { return t.dq_split == kDqByCols ? t.head_dim / 2 : t.head_dim; }

/* Shared-memory regions in bytes, in layout order. */
constexpr int bwd_kv_bytes(const BwdRow &t) { return t.block_n * t.head_dim * 2; }
constexpr int bwd_q_bytes(const BwdRow &t) { return t.block_m * t.head_dim * 2; }
constexpr int bwd_ds_bytes(const BwdRow &t) { return t.block_n * t.block_m * 2; }
constexpr int bwd_dq_bytes(const BwdRow &t) { return kBwdChunk * bwd_dq_cols(t) * 4; }
constexpr int bwd_ld_bytes(const BwdRow &t) { return 2 * t.block_m * 4; }
constexpr int kBwdBarrierBytes = 64;
constexpr int bwd_smem_bytes(const BwdRow &t)
{
    return kSmemAlign + 2 * bwd_kv_bytes(t) + 2 * t.stages * bwd_q_bytes(t) + 2 * bwd_ds_bytes(t) +
           2 * bwd_dq_bytes(t) + t.stages * bwd_ld_bytes(t) + kBwdBarrierBytes;
}

constexpr bool bwd_row_ok(const BwdRow &t)
{
    return (t.swz == 128 || t.swz == 64) && t.head_dim % (t.swz / 2) == 0 && t.head_dim % 16 == 0 &&
           t.head_dim <= 256 && t.block_n == 128 &&
           t.block_m == (t.dq_split == kDqByRows ? 2 : 1) * kBwdChunk && t.stages >= 1 &&
           8 + 16 * t.stages <= kBwdBarrierBytes && (t.dq_split != kDqByCols || (t.head_dim / 2) % 64 == 0) &&
           bwd_smem_bytes(t) <= FC_SM90_SMEM_OPTIN;
}
constexpr bool all_bwd_rows_ok(int i = 0)
{
    return i >= kNumBwdRows || (bwd_row_ok(kBwdRows[i]) && all_bwd_rows_ok(i + 1));
}
static_assert(all_bwd_rows_ok(), "a row of the sm90 backward table breaks a kernel or shared-memory limit");

/* Named barrier ids of the backward kernel (0 is __syncthreads). */
enum : uint32_t {
    kBwdBarInit = 1, /* K/V (or a Q/dO tail) zeroed, both consumer warpgroups  */
    kBwdBarDs = 2,   /* both warpgroups' dS^T stored (dQ over all keys)        */
    kBwdBarWg = 3,   /* + warpgroup: its own 128 threads                       */
    kBwdBarFull = 5, /* + warpgroup: its dQ staged for the writer warp (160)   */
    kBwdBarFree = 7  /* + warpgroup: its staging read by the writer (160)      */
};

template <int kRow> struct BwdCfg {
    static constexpr BwdRow T = kBwdRows[kRow];
    static constexpr int D = T.head_dim;
    static constexpr int BM = T.block_m;
    static constexpr int BN = T.block_n;
    static constexpr int ST = T.stages;
    static constexpr int SW = T.swz;
    static constexpr int PW = SW / 2;        /* elements per panel row            */
    static constexpr int KPP = SW / 32;      /* k16 steps within one panel        */
    static constexpr int DSTEPS = D / 16;    /* k16 steps over head_dim (S^T, dP^T) */
    static constexpr int MSTEPS = BM / 16;   /* k16 steps over queries (dV, dK)   */
    static constexpr bool SPLIT_N = T.dq_split == kDqByCols;
    static constexpr bool SPLIT_M = T.dq_split == kDqByRows;
    static constexpr bool DQ_ALL_KEYS = T.dq_split != kDqByKeys; /* dS of both warpgroups */
    static constexpr int DQN = bwd_dq_cols(T);                  /* dQ columns per warpgroup */
    static constexpr int DQ_KSTEPS = (DQ_ALL_KEYS ? BN : 64) / 16;
    /* Issue the next step's S^T and dP^T before handing dQ over: their
     * accumulators (block_m floats) live beside dK, dV and dQ's: 224 at
     * d128 spilled under 232 registers. */
    static constexpr bool SDP_FIRST = D + BM + DQN / 2 <= 192;
    /* dS^T computed and both made 16-bit before dV's issue, not while it
     * runs: with 128-query steps P's 16-bit copy beside S^T and dP^T
     * (64 floats each) spilled 72-172 bytes. */
    static constexpr bool EARLY_DS = BM > 64;
    static_assert(!EARLY_DS || !T.softcap, "no softcap instance where dS is computed early (bwd_scores.cuh)");
    static constexpr int THREADS = 384;
    /* the forward's split of a 3-warpgroup CTA (tiles.cuh): 40 / 232;
     * 128-query steps 24 / 240 (their producer holds nothing: bwd_place.cuh) */
    static constexpr int PRODUCER_REGS = EARLY_DS ? 24 : producer_regs(2);
    static constexpr int CONSUMER_REGS = EARLY_DS ? 240 : consumer_regs(2, 1);
    static constexpr uint32_t KV_BYTES = bwd_kv_bytes(T);
    static constexpr uint32_t Q_BYTES = bwd_q_bytes(T);
    static constexpr uint32_t DS_BYTES = bwd_ds_bytes(T);
    static constexpr uint32_t DQ_BYTES = bwd_dq_bytes(T);
    static constexpr uint32_t LD_BYTES = bwd_ld_bytes(T);
    static constexpr uint32_t OFF_K = 0;
    static constexpr uint32_t OFF_V = OFF_K + KV_BYTES;
    static constexpr uint32_t OFF_Q = OFF_V + KV_BYTES;
    static constexpr uint32_t OFF_DO = OFF_Q + ST * Q_BYTES;
    static constexpr uint32_t OFF_DS = OFF_DO + ST * Q_BYTES;
    static constexpr uint32_t OFF_DQ = OFF_DS + 2 * DS_BYTES;
    static constexpr uint32_t OFF_LD = OFF_DQ + 2 * DQ_BYTES;
    static constexpr uint32_t OFF_BAR = OFF_LD + ST * LD_BYTES;
    static constexpr int SMEM = bwd_smem_bytes(T);
    static_assert(bwd_row_ok(T), "bwd_tiles.cuh bwd_row_ok");
    static_assert(OFF_BAR + kBwdBarrierBytes + kSmemAlign == (uint32_t)SMEM, "layout = table");
    static_assert(OFF_Q % 1024 == 0 && OFF_DO % 1024 == 0 && OFF_DS % 1024 == 0 && Q_BYTES % 1024 == 0,
                  "swizzled tiles on 1024-byte boundaries");
    static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 65536, "register budget");

    /* mbarriers at OFF_BAR (shared-window addresses from the aligned base) */
    static __device__ __forceinline__ uint32_t kv_full(uint32_t base) { return base + OFF_BAR; }
    static __device__ __forceinline__ uint32_t q_full(uint32_t base, int s) { return base + OFF_BAR + 8 + 8 * s; }
    static __device__ __forceinline__ uint32_t q_empty(uint32_t base, int s)
    {
        return base + OFF_BAR + 8 + 8 * ST + 8 * s;
    }
};

} /* namespace fc90 */

#endif /* FC_SM90_BWD_TILES_CUH */
