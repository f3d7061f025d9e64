/*
 * softmax.cuh -- the online softmax of one S block in registers: softcap,
 * element mask, running row max and sum, the O rescale factors, and P
 * packed to 16 bits as the A operand of O += P V. Templated on the block
 * width and the parameter type only (fields scale_log2, softcap_in,
 * softcap_out), so other kernels with the wgmma accumulator layout reuse it.
 *
 * Accumulator layout (wgmma, per warpgroup of 64 rows): warp w owns rows
 * 16w..16w+15; a thread holds rows r and r+8 (r = 16w + lane/4) and, in
 * every 8-column group j, columns 8j + 2*(lane%4) + {0,1}:
 *   acc[4j+0], acc[4j+1] -> row r,   acc[4j+2], acc[4j+3] -> row r+8.
 */
#ifndef FC_SM90_SOFTMAX_CUH
#define FC_SM90_SOFTMAX_CUH

#include "cuda/sm90/config.cuh"
#include "cuda/sm90/mask.cuh"

namespace fc90 {

/* Row statistics of the two rows a thread holds. */
struct RowState {
    float m[2];  /* running max of the (capped) scores, raw units */
    float l[2];  /* this thread's partial row sums (quad-reduced at the end) */
};

/* The exp2 shift of a row whose running max (raw score units) is m: m * c,
 * or 0 for a row with nothing visible yet (max -inf), so that
 * exp2(-inf * c - 0) = 0 instead of NaN. */
__device__ __forceinline__ float max_shift(float m, float c) { return m == neg_inf() ? 0.0f : m * c; }

/* Softcap, mask, online softmax of one S block in place (S becomes P in
 * fp32); returns the factors by which O must be rescaled. The softcap and
 * mask code is compiled in only where kMask says a block can need it. */
template <int kBN, bool kFirst, int kMask, class Params>
__device__ __forceinline__ void softmax_block(float (&S)[kBN / 2], RowState &rs, float (&alpha)[2],
                                              const Params &p, bool masked, int col0, const MaskRows &mr)
{
    constexpr bool kMayMask = kMask == kMaskAny || (kMask == kMaskFirst && kFirst);
    FC90_ASSERT(kMayMask || !masked);
    if (kMask == kMaskAny && p.softcap_in != 0.0f) {
#pragma unroll
        for (int i = 0; i < kBN / 2; ++i)
            S[i] = p.softcap_out * tanh_acc(S[i] * p.softcap_in);
    }
    if (kMayMask && masked) {
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = col0 + 8 * j + e;
                if (!(col >= mr.lo[0] && col < mr.hi[0])) S[4 * j + e] = neg_inf();
                if (!(col >= mr.lo[1] && col < mr.hi[1])) S[4 * j + 2 + e] = neg_inf();
            }
        }
    }
    float mx[2] = {S[0], S[2]};
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(S[4 * j], S[4 * j + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(S[4 * j + 2], S[4 * j + 3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    const float c = p.scale_log2;
    float ms[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float mnew = kFirst ? mx[r] : fmaxf(rs.m[r], mx[r]);
        ms[r] = max_shift(mnew, c);
        alpha[r] = kFirst ? 1.0f : ex2(rs.m[r] * c - ms[r]);
        rs.m[r] = mnew;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            S[4 * j + e] = ex2(fmaf(S[4 * j + e], c, -ms[0]));
            S[4 * j + 2 + e] = ex2(fmaf(S[4 * j + 2 + e], c, -ms[1]));
            sum[0] += S[4 * j + e];
            sum[1] += S[4 * j + 2 + e];
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) rs.l[r] = kFirst ? sum[r] : rs.l[r] * alpha[r] + sum[r];
}

/* P (16-bit) as the A fragments of the RS wgmma: k16 slice k covers the
 * accumulator groups 2k and 2k+1, whose register order is exactly the
 * A-fragment order (row r cols 0-7, row r+8 cols 0-7, row r cols 8-15, ...). */
template <int kBN, bool kBF16>
__device__ __forceinline__ void convert_p(const float (&S)[kBN / 2], uint32_t (&P)[kBN / 4])
{
#pragma unroll
    for (int i = 0; i < kBN / 4; ++i) P[i] = pack2<kBF16>(S[2 * i], S[2 * i + 1]);
}

template <int kD> __device__ __forceinline__ void rescale_o(float (&O)[kD / 2], const float (&alpha)[2])
{
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
        O[4 * j] *= alpha[0];
        O[4 * j + 1] *= alpha[0];
        O[4 * j + 2] *= alpha[1];
        O[4 * j + 3] *= alpha[1];
    }
}

} /* namespace fc90 */

#endif /* FC_SM90_SOFTMAX_CUH */
