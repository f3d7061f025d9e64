/*
 * bwd_shape.cuh -- the compile-time shape of one sm80-class backward
 * instance (BwdShape), the views through which it calls the forward's
 * warp GEMMs (mma.cuh), and the carve-up of its shared memory.
 *
 * Every tile of head_dim columns (K, V, Q, dO) uses the forward's panel
 * layout for that head dim (layout.cuh); the dS^T tile (block_n keys x
 * block_m queries) uses the layout of a block_m-wide tile.
 */
#ifndef FC_SM80_BWD_SHAPE_CUH
#define FC_SM80_BWD_SHAPE_CUH

#include <stdint.h>

#include "cuda/sm80/layout.cuh"

namespace fc {
namespace sm80 {

/* Panel constants of a tile COLS 16-bit columns wide, as layout.cuh's
 * Shape defines them (the ldmatrix helpers read these members). The lane
 * offsets are held, not re-derived (a fresh %tid.x at each GEMM spilled
 * more at d128, not less). */
template <int COLS>
struct Panels {
    static constexpr int PC = (COLS == 64 || COLS == 128) ? 8 : 4;
    static constexpr int LPC = panel_log2(PC);
    static constexpr int PB = PC * 16;
    static constexpr int KPP = PC / 2;
    static constexpr bool FRESH_LANE_OFFS = false;
};

/* The forward's gemm_qk / gemm_pv (mma.cuh) seen as generic warp GEMMs on
 * tiles of HD columns: gemm_qk computes a 16-row slice (rows wrow.. of an
 * A tile of BM rows) times the transpose of N_ROWS rows of a B tile of BN
 * rows; gemm_pv adds a 16 x N_ROWS register operand times N_ROWS rows x HD
 * of a B tile of BN rows. (The caller offsets the B tile's base by whole
 * groups of 8 rows to pick the rows.) */
template <int HD, int A_ROWS, int B_ROWS, int N_ROWS>
struct GemmView : Panels<HD> {
    static constexpr int MT = 1, BM = A_ROWS, BN = B_ROWS;
    static constexpr int KSTEPS = HD / 16, NTL = N_ROWS / 8, PSTEPS = N_ROWS / 16, DTL = HD / 8;
    static constexpr bool Q_IN_REGS = false;
};

template <int HD_, int BM_, int BN_, int W_, int CTAS_, int SUB_>
struct BwdShape : Panels<HD_> {
    static constexpr int HD = HD_, BM = BM_, BN = BN_, W = W_, CTAS = CTAS_;
    static constexpr int NT = W * 32;
    static constexpr int WROWS = 16;    /* keys per warp (thread_coords)           */
    /* S^T, P, dS and their dV/dK GEMMs run in passes of SUB query rows (the
     * accumulators of one pass in registers); loads, barriers and the dQ
     * GEMM per block of BM. */
    static constexpr int SUB = SUB_;
    static constexpr int QTL = SUB / 8; /* n8 tiles of S^T, dP^T (query columns)   */
    static constexpr int DTL = HD / 8;  /* n8 tiles of dK, dV                       */
    /* dQ = dS K: BM/16 row groups of 16 queries, DQ_CW warps per group, each
     * DQ_COLS head-dim columns. */
    static constexpr int DQ_RG = BM / 16, DQ_CW = W / DQ_RG, DQ_COLS = HD / DQ_CW, DQ_NTL = DQ_COLS / 8;
    using KQ = GemmView<HD, BN, BM, SUB>; /* S^T = K_w Q^T, dP^T = V_w dO^T,
                                           * dV += P^T dO, dK += dS^T Q       */
    using DS = Panels<BM>;           /* the dS^T tile                           */
    static constexpr uint32_t KV_BYTES = BN * HD * 2;
    static constexpr uint32_t Q_BYTES = BM * HD * 2;
    static constexpr uint32_t DS_BYTES = BN * BM * 2;
    static constexpr uint32_t ROWVEC_BYTES = BM * 4; /* lse2 or D of one block */
    static constexpr uint32_t SMEM_BYTES = 2 * KV_BYTES + 4 * Q_BYTES + DS_BYTES + 4 * ROWVEC_BYTES;

    static_assert(HD % 32 == 0 && HD >= 32 && HD <= 128, "head_dim 32..128, a multiple of 32");
    static_assert(BN == 16 * W, "16 keys per warp");
    static_assert(BM % 16 == 0 && BM <= BN && W % DQ_RG == 0 && DQ_COLS % 16 == 0,
                  "dQ GEMM: whole 16-row groups over the warps, 16-column steps");
    static_assert(SUB % 16 == 0 && BM % SUB == 0, "passes of whole k16 steps dividing block_m");
};

/* The dynamic shared memory (every extern __shared__ array names its start). */
extern __shared__ __align__(128) unsigned char fc_bwd_smem[];

/* Shared-window addresses of a CTA's tiles, all at constant offsets from
 * the start of the dynamic shared memory, so that none of them occupies a
 * register across the loop. Q, dO, lse2 and D have two buffers (b). */
template <class S_>
struct BwdSmem {
    static constexpr uint32_t K = 0, V = S_::KV_BYTES, QBUF = 2 * S_::KV_BYTES, Q_STEP = 2 * S_::Q_BYTES;
    static constexpr uint32_t DS = QBUF + 2 * Q_STEP, RBUF = DS + S_::DS_BYTES, R_STEP = 2 * S_::ROWVEC_BYTES;
    static __device__ __forceinline__ uint32_t base() { return ptx::smem_addr(fc_bwd_smem); }
    static __device__ __forceinline__ uint32_t k() { return base() + K; }
    static __device__ __forceinline__ uint32_t v() { return base() + V; }
    static __device__ __forceinline__ uint32_t ds() { return base() + DS; }
    static __device__ __forceinline__ uint32_t q(int b) { return base() + QBUF + b * Q_STEP; }
    static __device__ __forceinline__ uint32_t dout(int b) { return q(b) + S_::Q_BYTES; }
    static __device__ __forceinline__ uint32_t lse2(int b) { return base() + RBUF + b * R_STEP; }
    static __device__ __forceinline__ uint32_t dsum(int b) { return lse2(b) + S_::ROWVEC_BYTES; }
};

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_SHAPE_CUH */
