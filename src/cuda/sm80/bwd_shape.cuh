/*
 * bwd_shape.cuh -- the compile-time shape of one sm80-class backward
 * instance (BwdShape), the views through which it calls the forward's
 * warp GEMMs (mma.cuh), and the carve-up of its shared memory.
 *
 * Every tile of head_dim columns (K, V, Q, dO) uses the forward's panel
 * layout for that head dim (layout.cuh); the dS^T and P^T tiles (block_n
 * keys x block_m queries) use the layout of a block_m-wide tile.
 */
#ifndef FC_SM80_BWD_SHAPE_CUH
#define FC_SM80_BWD_SHAPE_CUH

#include <stdint.h>

#include "cuda/sm80/layout.cuh"

namespace fc {
namespace sm80 {

/* Panel constants of a tile COLS 16-bit columns wide, as layout.cuh's
 * Shape defines them (the ldmatrix helpers read these members). FRESH:
 * the lane offsets are re-derived from a fresh %tid.x at each GEMM
 * (BwdShape says where). */
template <int COLS, bool FRESH>
struct Panels {
    static constexpr int PC = (COLS == 64 || COLS == 128) ? 8 : 4;
    static constexpr int LPC = panel_log2(PC);
    static constexpr int PB = PC * 16;
    static constexpr int KPP = PC / 2;
    static constexpr bool FRESH_LANE_OFFS = FRESH;
};

/* The forward's gemm_qk / gemm_pv (mma.cuh) seen as generic warp GEMMs on
 * tiles of HD columns: gemm_qk computes a 16 MT-row slice (rows wrow.. of
 * an A tile of BM rows) times the transpose of N_ROWS rows of a B tile of
 * BN rows; gemm_pv adds a 16 MT x N_ROWS register operand times N_ROWS
 * rows x HD of a B tile of BN rows. (The caller offsets the B tile's base
 * by whole groups of 8 rows to pick the rows.) */
template <int HD, int A_ROWS, int B_ROWS, int N_ROWS, int MT_, bool FRESH>
struct GemmView : Panels<HD, FRESH> {
    static constexpr int MT = MT_, BM = A_ROWS, BN = B_ROWS;
    static constexpr int KSTEPS = HD / 16, NTL = N_ROWS / 8, PSTEPS = N_ROWS / 16, DTL = HD / 8;
    static constexpr bool Q_IN_REGS = false;
};

/* Lane offsets re-derived per GEMM, except at d64 (re-derived, its
 * deterministic instance spilled 8 bytes; held, d128's spilled 20). */
constexpr bool bwd_fresh_lanes(int hd) { return hd != 64; }

template <int HD_, int BM_, int BN_, int W_, int CTAS_, int KW_, int QW_>
struct BwdShape : Panels<HD_, bwd_fresh_lanes(HD_)> {
    static constexpr int HD = HD_, BM = BM_, BN = BN_, W = W_, CTAS = CTAS_;
    static constexpr int NT = W * 32;
    /* S^T, dP^T (keys x queries) and dK, dV (keys x head dim): KW x WQ
     * warps; warp w has keys SK * (w / WQ).. (MT m16 tiles), queries
     * SQ * (w % WQ).. (QTL n8 tiles) and head-dim columns DK * (w % WQ)..
     * (DTL n8 tiles). */
    static constexpr int KW = KW_, WQ = W / KW, SK = BN / KW, MT = SK / 16;
    static constexpr int SQ = BM / WQ, QTL = SQ / 8, DK = HD / WQ, DTL = DK / 8;
    /* P^T and dS^T reach the dV and dK GEMMs through shared memory unless a
     * warp holds all BM queries of its keys (then from registers). */
    static constexpr bool P_SMEM = WQ > 1;
    /* dQ = dS K: QW x DQ_CW warps, each DQ_MT m16 tiles of queries x DQ_COLS
     * head-dim columns. */
    static constexpr int QW = QW_, DQ_CW = W / QW, DQ_MT = BM / QW / 16, DQ_COLS = HD / DQ_CW,
                         DQ_NTL = DQ_COLS / 8;
    static constexpr bool FRESH = bwd_fresh_lanes(HD_);
    using KQ = GemmView<HD, BN, BM, SQ, MT, FRESH>; /* S^T = K_w Q^T, dP^T = V_w dO^T; with
                                              * P in registers dV += P^T dO, dK += dS^T Q */
    using DS = Panels<BM, FRESH>;               /* the dS^T and P^T tiles               */
    static constexpr uint32_t KV_BYTES = BN * HD * 2;
    static constexpr uint32_t Q_BYTES = BM * HD * 2;
    static constexpr uint32_t DS_BYTES = BN * BM * 2;
    static constexpr uint32_t ROWVEC_BYTES = BM * 4; /* lse2 or D of one block */
    static constexpr uint32_t SMEM_BYTES =
        2 * KV_BYTES + 4 * Q_BYTES + (P_SMEM ? 2 : 1) * DS_BYTES + 4 * ROWVEC_BYTES;

    static_assert(HD % 32 == 0 && HD >= 32 && HD <= 256, "head_dim 32..256, a multiple of 32");
    static_assert(W % KW == 0 && SK % 16 == 0 && SQ % 16 == 0 && DK % 16 == 0,
                  "S^T, dK, dV: whole 16 x 16 steps per warp");
    static_assert(W % QW == 0 && BM % (16 * QW) == 0 && DQ_COLS % 16 == 0, "dQ: whole 16 x 16 steps per warp");
    static_assert(BM <= BN, "the dS^T tile is read as block_n/16 k-steps of the dQ GEMM");
};

/* A thread's place in the backward CTA: lane, MMA fragment row group g and
 * column pair t, its warp's first key row (S^T, dK, dV), first query
 * column of S^T, and first 16-column step of dK and dV. Derived from a
 * fresh %tid.x per query block (held across the loop, they spilled). */
struct BwdThr {
    int tid, lane, g, t, wrow, q0, c16;
};

template <class S_>
__device__ __forceinline__ BwdThr bwd_thread_coords()
{
    BwdThr r;
    r.tid = dev::tid_x_volatile();
    r.lane = r.tid & 31;
    r.g = r.lane >> 2;
    r.t = r.lane & 3;
    const int warp = r.tid >> 5, wk = warp / S_::WQ, wq = warp - wk * S_::WQ;
    r.wrow = wk * S_::SK;
    r.q0 = wq * S_::SQ;
    r.c16 = wq * (S_::DK / 16);
    return r;
}

/* The dynamic shared memory (every extern __shared__ array names its start). */
extern __shared__ __align__(128) unsigned char fc_bwd_smem[];

/* Shared-window addresses of a CTA's tiles, all at constant offsets from
 * the start of the dynamic shared memory, so that none of them occupies a
 * register across the loop. Q, dO, lse2 and D have two buffers (b). */
template <class S_>
struct BwdSmem {
    static constexpr uint32_t K = 0, V = S_::KV_BYTES, QBUF = 2 * S_::KV_BYTES, Q_STEP = 2 * S_::Q_BYTES;
    static constexpr uint32_t DS = QBUF + 2 * Q_STEP, PT = DS + S_::DS_BYTES;
    static constexpr uint32_t RBUF = PT + (S_::P_SMEM ? S_::DS_BYTES : 0), R_STEP = 2 * S_::ROWVEC_BYTES;
    static __device__ __forceinline__ uint32_t base() { return ptx::smem_addr(fc_bwd_smem); }
    static __device__ __forceinline__ uint32_t k() { return base() + K; }
    static __device__ __forceinline__ uint32_t v() { return base() + V; }
    static __device__ __forceinline__ uint32_t ds() { return base() + DS; }
    static __device__ __forceinline__ uint32_t pt() { return base() + PT; }
    static __device__ __forceinline__ uint32_t q(int b) { return base() + QBUF + b * Q_STEP; }
    static __device__ __forceinline__ uint32_t dout(int b) { return q(b) + S_::Q_BYTES; }
    static __device__ __forceinline__ uint32_t lse2(int b) { return base() + RBUF + b * R_STEP; }
    static __device__ __forceinline__ uint32_t dsum(int b) { return lse2(b) + S_::ROWVEC_BYTES; }
};

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_SHAPE_CUH */
