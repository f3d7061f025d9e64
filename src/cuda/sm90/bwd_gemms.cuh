/*
 * bwd_gemms.cuh -- the five wgmma GEMMs of a Hopper backward step, for one
 * consumer warpgroup cw (keys 64 cw .. 64 cw + 63 of the CTA's block):
 *   S^T  = K_w Q^T      SS, both K-major            64 x block_m
 *   dP^T = V_w dO^T     SS, both K-major            64 x block_m
 *                       (EARLY_DS rows: onto -D, dP^T - D)
 *   dV  += P^T dO       RS (P^T from registers), dO MN-major   64 x head_dim
 *   dK  += dS^T Q       RS, Q MN-major                         64 x head_dim
 *   dQ   = dS K         SS, dS^T (M-major) and K (MN-major) from shared
 *                       memory, 64 queries: head_dim / 2 columns over all
 *                       keys (SPLIT_N), the warpgroup's 64 of 128 queries
 *                       over all keys (SPLIT_M), or all columns over this
 *                       warpgroup's keys
 * Accumulator layout as the forward's (softmax.cuh): rows are this
 * warpgroup's keys, columns queries (S^T, dP^T) or head_dim (dV, dK, dQ's
 * rows are queries). Descriptors: ptx_sm90.cuh.
 */
#ifndef FC_SM90_BWD_GEMMS_CUH
#define FC_SM90_BWD_GEMMS_CUH

#include "cuda/sm90/bwd_tiles.cuh"
#include "cuda/sm90/ptx_sm90.cuh"

namespace fc90 {

/* acc = A_w B^T over head_dim (kAdd: acc += A_w B^T), A = this
 * warpgroup's 64 rows of the K or V tile (block_n rows per panel), B =
 * the Q or dO tile (block_m rows). */
template <class C, bool kBF16, bool kAdd>
__device__ __forceinline__ void bwd_issue_kt(float (&acc)[C::BM / 2], uint32_t a_tile, uint32_t b_tile, int cw)
{
    const uint64_t da = desc_kmajor<C::SW>(a_tile + 64u * cw * C::SW);
    const uint64_t db = desc_kmajor<C::SW>(b_tile);
#pragma unroll
    for (int k = 0; k < C::DSTEPS; ++k) {
        const uint32_t in_row = (k % C::KPP) * 32;
        const uint32_t oa = (k / C::KPP) * (C::BN * C::SW) + in_row;
        const uint32_t ob = (k / C::KPP) * (C::BM * C::SW) + in_row;
        if (k == 0 && !kAdd) Wgmma<C::BM, kBF16>::ss0(acc, da + (oa >> 4), db + (ob >> 4));
        else Wgmma<C::BM, kBF16>::ss(acc, da + (oa >> 4), db + (ob >> 4), 1);
    }
}

/* acc += X^T B over the block's queries, X^T (keys x queries) in 16-bit A
 * fragments, B = the Q or dO tile as [query][head_dim] panels (MN-major;
 * the next panel of head_dim columns is block_m rows further). */
template <class C, bool kBF16>
__device__ __forceinline__ void bwd_issue_acc(float (&acc)[C::D / 2], const uint32_t (&x)[C::BM / 4], uint32_t b_tile)
{
    const uint64_t db = desc_mnmajor<C::SW>(b_tile, C::BM * C::SW);
#pragma unroll
    for (int k = 0; k < C::MSTEPS; ++k)
        Wgmma<C::D, kBF16>::rs(acc, x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3],
                               db + ((uint32_t)(k * 16 * C::SW) >> 4), 1);
}

/* dQ (64 queries x DQN columns) = dS K over this warpgroup's share: A =
 * dS^T buffer [panel of 64 queries][block_n keys][128 B], M-major, the
 * next 64 queries a panel (block_n * 128 bytes) further; B = the K tile,
 * MN-major. */
template <class C, bool kBF16>
__device__ __forceinline__ void bwd_issue_dq(float (&acc)[C::DQN / 2], uint32_t ds_tile, uint32_t k_tile, int cw)
{
    static_assert(C::BM == (C::SPLIT_M ? 128 : 64), "dQ's M is one wgmma of 64 queries a warpgroup");
    const uint32_t key0 = C::DQ_ALL_KEYS ? 0u : 64u * cw;
    const uint32_t col_panel = C::SPLIT_N ? (uint32_t)cw * (C::DQN / C::PW) : 0u;
    const uint32_t q_panel = C::SPLIT_M ? (uint32_t)cw : 0u;
    const uint64_t da = desc_mnmajor<128>(ds_tile + q_panel * (C::BN * 128u) + key0 * 128u, C::BN * 128);
    const uint64_t db = desc_mnmajor<C::SW>(k_tile + col_panel * (C::BN * C::SW) + key0 * C::SW, C::BN * C::SW);
#pragma unroll
    for (int k = 0; k < C::DQ_KSTEPS; ++k)
        Wgmma<C::DQN, kBF16>::ss_tt(acc, da + ((uint32_t)(k * 16 * 128) >> 4), db + ((uint32_t)(k * 16 * C::SW) >> 4),
                                    k > 0);
}

} /* namespace fc90 */

#endif /* FC_SM90_BWD_GEMMS_CUH */
