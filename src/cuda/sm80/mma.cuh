/*
 * mma.cuh -- the warp-level GEMMs of the sm80-class kernel on panel-swizzled
 * shared-memory tiles (layout.cuh): S = Q K^T and O += P V, both built from
 * one step -- an ldmatrix.x4 of a 16x16 B operand and its two m16n8k16
 * MMAs per m16 tile.
 */
#ifndef FC_SM80_MMA_CUH
#define FC_SM80_MMA_CUH

#include <stdint.h>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/layout.cuh"

namespace fc {
namespace sm80 {

/* Address of the ldmatrix of k16 step `step` (its panel: step / KPP; its
 * chunk pair inside the panel: the XOR of (step % KPP) * 32 bytes) for the
 * 8-row group at `row` of a tile of ROWS rows at `tile`, lane offset off. */
template <class S_, int ROWS>
__device__ __forceinline__ uint32_t ldm_addr(uint32_t tile, int step, int row, uint32_t off)
{
    return tile + (step / S_::KPP) * (ROWS * S_::PB) + row * S_::PB + (off ^ ((step % S_::KPP) << 5));
}

/* One ldmatrix.x4 (TRANS: .trans, for V) of a B operand: 16 rows (keys) x 16
 * columns, i.e. the B fragments of n8 tiles 2j and 2j+1, then their MMAs
 * against each m16 tile's A fragment: acc[mt][2j], acc[mt][2j+1] += a[mt] b. */
template <bool kBF16, bool TRANS, int MT, int N>
__device__ __forceinline__ void mma_b_x4(float (&acc)[MT][N][4], int j, const uint32_t (&a)[MT][4], uint32_t addr)
{
    uint32_t b[4];
    if constexpr (TRANS)
        ptx::ldmatrix_x4_trans(b, addr);
    else
        ptx::ldmatrix_x4(b, addr);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        ptx::mma_16816<kBF16>(acc[mt][2 * j], a[mt], b[0], b[1]);
        ptx::mma_16816<kBF16>(acc[mt][2 * j + 1], a[mt], b[2], b[3]);
    }
}

/* Q's A fragments, kept in registers across the main loop when Q_IN_REGS
 * (a 1x1 dummy otherwise). */
template <class S_>
using QFrags = uint32_t[S_::Q_IN_REGS ? S_::MT : 1][S_::Q_IN_REGS ? S_::KSTEPS : 1][4];

/* Q_IN_REGS: load the warp's Q fragments once (block n_begin). */
template <class S_>
__device__ __forceinline__ void load_q_frags(QFrags<S_> &qf, uint32_t sQ, int wrow, int lane)
{
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < S_::KSTEPS; ++kk)
            ptx::ldmatrix_x4(qf[mt][kk], ldm_addr<S_, S_::BM>(sQ, kk, wrow + mt * 16, ldm_off_a<S_>(lane)));
}

/* S = Q K^T: s[mt][nt] = rows of m-tile mt x keys 8nt .. 8nt+7 of the K tile
 * at sK. Q from qf (Q_IN_REGS) or re-read from sQ. */
template <bool kBF16, class S_>
__device__ __forceinline__ void gemm_qk(float (&s)[S_::MT][S_::NTL][4], const QFrags<S_> &qf, uint32_t sQ,
                                        uint32_t sK, int wrow, int lane)
{
    constexpr int MT = S_::MT;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S_::NTL; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
    const int lane_s = loop_lane<S_>(lane);
    const uint32_t offA = ldm_off_a<S_>(lane_s), offB = ldm_off_b<S_>(lane_s);
#pragma unroll
    for (int kk = 0; kk < S_::KSTEPS; ++kk) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            if constexpr (S_::Q_IN_REGS) {
#pragma unroll
                for (int e = 0; e < 4; ++e) qa[mt][e] = qf[mt][kk][e];
            } else {
                ptx::ldmatrix_x4(qa[mt], ldm_addr<S_, S_::BM>(sQ, kk, wrow + mt * 16, offA));
            }
        }
        /* keys 16np..16np+15 x head-dim cols 16kk..16kk+15 */
#pragma unroll
        for (int np = 0; np < S_::NTL / 2; ++np)
            mma_b_x4<kBF16, false>(s, np, qa, ldm_addr<S_, S_::BN>(sK, kk, np * 16, offB));
    }
}

/* O += P V with P = s (probabilities): the C fragments of n-tiles 2kk, 2kk+1
 * are exactly the A fragment of k16 step kk (keys 16kk..16kk+15), converted
 * to 16-bit in registers (no smem round trip). */
template <bool kBF16, class S_>
__device__ __forceinline__ void gemm_pv(float (&o)[S_::MT][S_::DTL][4], const float (&s)[S_::MT][S_::NTL][4],
                                        uint32_t sV, int lane)
{
    constexpr int MT = S_::MT;
    const uint32_t offV = ldm_off_a<S_>(loop_lane<S_>(lane));
#pragma unroll
    for (int kk = 0; kk < S_::PSTEPS; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            pa[mt][0] = ptx::pack2<kBF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);         /* row g,   k 2t   */
            pa[mt][1] = ptx::pack2<kBF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);         /* row g+8, k 2t   */
            pa[mt][2] = ptx::pack2<kBF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]); /* row g,   k 2t+8 */
            pa[mt][3] = ptx::pack2<kBF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]); /* row g+8, k 2t+8 */
        }
        /* keys 16kk.. x head-dim cols 16dp..16dp+15 (chunks 2dp, 2dp+1) */
#pragma unroll
        for (int dp = 0; dp < S_::DTL / 2; ++dp)
            mma_b_x4<kBF16, true>(o, dp, pa, ldm_addr<S_, S_::BN>(sV, dp, kk * 16, offV));
    }
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_MMA_CUH */
