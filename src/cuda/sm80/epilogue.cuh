/*
 * epilogue.cuh -- the end of an sm80-class CTA: O normalised by the row
 * sums, LSE, and their stores -- split-KV partials (fp32 O_i and LSE_i for
 * combine.cu), or O in the output dtype staged through shared memory for
 * 16-byte stores (general and lean-address variants; element stores for an
 * out with odd strides), and the LSE.
 */
#ifndef FC_SM80_EPILOGUE_CUH
#define FC_SM80_EPILOGUE_CUH

#include <stdint.h>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/fwd_args.h"
#include "cuda/sm80/layout.cuh"
#include "cuda/sm80/loads_kv8.cuh"
#include "cuda/sm80/schedule.cuh"
#include "cuda/sm80/softmax.cuh"
#include "cuda/sm80/warp_keys.cuh"

namespace fc {
namespace sm80 {

/* Query position i and head h of this thread's row (mt, hf) (the MMA C
 * fragment's row g or g + 8); false for a row past the sequence. */
template <class S_>
__device__ __forceinline__ bool thread_row(const fc_sm80_args &a, const TileCoords &c, const Thr &th, int mt, int hf,
                                           int64_t &i, int &h)
{
    const int64_t rr = c.r0 + th.wrow + mt * 16 + th.g + 8 * hf;
    if (rr >= c.rows) return false;
    i = row_pos(rr, a.pack_g);
    h = c.h_base + (int)(rr - i * c.G);
    return true;
}

/* Split-KV: fp32 O_i (normalised by this split's own sum) and LSE_i at
 * [split][b][h][i], i < the sequence's length; combine.cu merges. */
template <class S_>
__device__ __forceinline__ void store_partials(const fc_sm80_args &a, const TileCoords &c, const Thr &th,
                                               const float (&o)[S_::MT][S_::DTL][4], const float (&inv)[S_::MT][2],
                                               const float (&lse)[S_::MT][2])
{
    const fc_fwd_params &p = a.p;
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            int64_t i;
            int h;
            if (!thread_row<S_>(a, c, th, mt, hf, i, h)) continue;
            const int64_t row = (((int64_t)c.split * p.batch + c.b) * p.heads_q + h) * p.seqlen_q + i;
            float *dst = p.o_accum + row * S_::HD + 2 * th.t;
#pragma unroll
            for (int dt = 0; dt < S_::DTL; ++dt)
                *reinterpret_cast<float2 *>(dst + dt * 8) =
                    make_float2(o[mt][dt][2 * hf] * inv[mt][hf], o[mt][dt][2 * hf + 1] * inv[mt][hf]);
            if (th.t == 0) p.lse_accum[row] = lse[mt][hf];
        }
}

/* Stage the warp's rows (normalised, converted) in its own rows of the Q
 * tile's smem -- no other warp reads or writes them, so a warp barrier
 * suffices. */
template <bool kBF16, class S_>
__device__ __forceinline__ void stage_o(uint32_t sQ, const Thr &th, const float (&o)[S_::MT][S_::DTL][4],
                                        const float (&inv)[S_::MT][2])
{
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < S_::DTL; ++dt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = th.wrow + mt * 16 + th.g + 8 * hf;
                ptx::sts32(sQ + panel_offset<S_::BM, S_::PC>(r, dt) + 4 * th.t,
                           ptx::pack2<kBF16>(o[mt][dt][2 * hf] * inv[mt][hf], o[mt][dt][2 * hf + 1] * inv[mt][hf]));
            }
    __syncwarp();
}

/* The warp's staged rows to O, any G: 16-byte stores in storage order, 128
 * contiguous bytes per 8 lanes; element stores instead (kVec false) where
 * o's layout does not allow 16-byte ones. (Plain inline: loads.cuh says why.) */
template <class S_, bool kVec>
__device__ inline void store_o(const fc_sm80_args &a, const TileCoords &c, uint32_t sQ, const Thr &th,
                               uint16_t *__restrict__ og)
{
    constexpr int WROWS = S_::WROWS, PC = S_::PC;
    constexpr int WUNITS = WROWS * S_::HD / 8;
    const fc_fwd_params &p = a.p;
#pragma unroll
    for (int k = 0; k < WUNITS / 32; ++k) {
        const int u = th.lane + 32 * k; /* storage order inside the warp's rows */
        const int r = th.wrow + unit_row<WROWS, PC>(u);
        const int ch = unit_chunk<WROWS, PC>(u);
        const int64_t rr = c.r0 + r;
        if (rr < c.rows) {
            const uint4 v = ptx::lds128(sQ + panel_offset<S_::BM, PC>(r, ch));
            const int64_t i = row_pos(rr, a.pack_g);
            const int h = c.h_base + (int)(rr - i * c.G);
            uint16_t *dst =
                og + c.bq * p.o_batch_stride + (c.q_start + i) * p.o_row_stride + (int64_t)h * p.o_head_stride + ch * 8;
            if constexpr (!kVec)
                fc::dev::st_elems8(dst, v);
            else if constexpr (S_::LEAN_ADDR)
                ptx::stg128(dst, v);
            else
                *reinterpret_cast<uint4 *>(dst) = v;
        }
    }
}

/* kVarLeanAddr, G == 1: unit lane + 32k, RP = 32 / PC rows per pass: row
 * wrow + lane/PC + (RP*k % WROWS), chunk PC * (RP*k / WROWS) + lane % PC --
 * WROWS/RP distinct rows, one pointer each (query position r0 + row of head
 * h_base), panel hops as immediates, one STG.128 per chunk. */
template <class S_>
__device__ __forceinline__ void store_o_lean(const fc_sm80_args &a, const TileCoords &c, uint32_t sQ, const Thr &th,
                                             uint16_t *__restrict__ og)
{
    constexpr int WROWS = S_::WROWS, PC = S_::PC;
    constexpr int WUNITS = WROWS * S_::HD / 8;
    constexpr int RP = 32 / PC;
    static_assert(WROWS % RP == 0, "epilogue: whole passes of a warp's rows");
    constexpr int NRO = WROWS / RP;
    const fc_fwd_params &p = a.p;
    const int orow = th.wrow + (th.lane >> S_::LPC);
    uint16_t *o0 = og + c.bq * p.o_batch_stride + (c.q_start + c.r0 + orow) * p.o_row_stride +
                   (int64_t)c.h_base * p.o_head_stride + (th.lane & (PC - 1)) * 8;
    uint16_t *orp[NRO];
#pragma unroll
    for (int j = 0; j < NRO; ++j) orp[j] = j == 0 ? o0 : orp[j - 1] + (int64_t)RP * p.o_row_stride;
#pragma unroll
    for (int k = 0; k < WUNITS / 32; ++k) {
        const int j = (RP * k % WROWS) / RP, DC = (RP * k / WROWS) * PC;
        if (c.r0 + orow + RP * j < c.rows)
            ptx::stg128(orp[j] + DC * 8, ptx::lds128(sQ + panel_offset<S_::BM, PC>(orow + RP * j, DC + (th.lane & (PC - 1)))));
    }
}

/* LSE (natural log) of the thread's rows, lane t == 0 of each quad. */
template <class S_>
__device__ __forceinline__ void store_lse(const fc_sm80_args &a, const TileCoords &c, const Thr &th,
                                          const float (&lse)[S_::MT][2])
{
    const fc_fwd_params &p = a.p;
    if (p.lse && th.t == 0) {
#pragma unroll
        for (int r = 0; r < 2 * S_::MT; ++r) { /* row r: m-tile r / 2, half r % 2 */
            int64_t i;
            int h;
            if (thread_row<S_>(a, c, th, r >> 1, r & 1, i, h))
                p.lse[c.bq * p.lse_batch_stride + (int64_t)h * p.lse_head_stride + (c.q_start + i) * p.lse_row_stride] =
                    lse[r >> 1][r & 1];
        }
    }
}

/* finish_rows of a kVarKv8 CTA: its v_descale in the rows' 1/sum
 * (loads_kv8.cuh). */
template <class S_>
__device__ __forceinline__ void kv8_finish_rows(const fc_sm80_args &a, const float (&m_run)[S_::MT][2],
                                                const float (&l_run)[S_::MT][2], float (&inv)[S_::MT][2],
                                                float (&lse)[S_::MT][2])
{
    finish_rows<S_>(m_run, l_run, a.sl2, inv, lse);
    const TileCoords c = locate_tile<S_::BM>(a);
    const float vd = kv8_descale(a.p.v_descale, c.b, fc_fastdiv_div(c.h_base, a.heads_per_kv));
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt) {
        inv[mt][0] *= vd;
        inv[mt][1] *= vd;
    }
}

/* The whole epilogue: normalise, then partials or O + LSE. The tile
 * coordinates are recomputed here rather than held across the loop. */
template <bool kBF16, class S_>
__device__ __forceinline__ void epilogue(const fc_sm80_args &a, const Smem &sm, const Thr &th,
                                         float (&o)[S_::MT][S_::DTL][4], float (&m_run)[S_::MT][2],
                                         float (&l_run)[S_::MT][2])
{
    if constexpr (S_::KW > 1) /* the warps' key slices into warp 0, which carries on alone */
        if (!kw_merge<S_>(sm, th, a.sl2, o, m_run, l_run)) return;
    float inv[S_::MT][2], lse[S_::MT][2];
    if constexpr (S_::KV8)
        kv8_finish_rows<S_>(a, m_run, l_run, inv, lse);
    else
        finish_rows<S_>(m_run, l_run, a.sl2, inv, lse);

    const TileCoords c = locate_tile<S_::BM>(a);
    if (a.num_splits.d > 1) {
        store_partials<S_>(a, c, th, o, inv, lse);
        return;
    }
    stage_o<kBF16, S_>(sm.q, th, o, inv);
    uint16_t *__restrict__ og = (uint16_t *)a.p.o;
    if (!a.o_vec) {
        store_o<S_, false>(a, c, sm.q, th, og); /* odd strides (plan.cu o_vec_ok) */
    } else if constexpr (S_::LEAN_ADDR) {
        if (c.G == 1)
            store_o_lean<S_>(a, c, sm.q, th, og);
        else
            store_o<S_, true>(a, c, sm.q, th, og);
    } else {
        store_o<S_, true>(a, c, sm.q, th, og);
    }
    store_lse<S_>(a, c, th, lse);
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_EPILOGUE_CUH */
