/*
 * epilogue.cuh -- what a consumer warpgroup does with a finished tile:
 * merge partial states (the kvsplit pair through shared memory, tail
 * balancing's parts through global memory), normalise O and compute the LSE,
 * and store: 16-bit O staged in the tile's own Q buffer, then one TMA store
 * per panel (p.o_tma) or 16-byte generic stores where TMA cannot (varlen,
 * odd layouts); split-KV partials (fp32) and LSE straight from registers;
 * tiles whose rows see no key written as O = 0, LSE = -inf.
 */
#ifndef FC_SM90_EPILOGUE_CUH
#define FC_SM90_EPILOGUE_CUH

#include "constants.h"
#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/softmax.cuh"

namespace fc90 {

/* Epilogue without TMA: the warpgroup's staged 16-bit rows (swizzled, in its
 * rows of the tile's Q buffer) to global memory in 16-byte row chunks, or
 * element by element when o's layout does not allow 16-byte stores. */
template <class C>
__device__ __forceinline__ void store_o_generic(const fc_sm90_params &p, const Tile &g, uint16_t *o16,
                                                const uint8_t *smem, uint32_t q_off, int rg, int etid)
{
    constexpr int CPR = C::D / 8;  /* 16-byte chunks per row */
    constexpr int CPP = C::PW / 8; /* 16-byte chunks per panel row */
#pragma unroll
    for (int it = 0; it < 64 * CPR / 128; ++it) {
        const int i = etid + 128 * it;
        const int lr = i / CPR;
        const int cc = i - lr * CPR;
        const int R = g.m0 + 64 * rg + lr;
        const int pos = row_pos(p, R);
        if (pos < g.sq) {
            const uint32_t off = q_off + (uint32_t)(cc / CPP) * (C::BM * C::SW) +
                                 (uint32_t)(64 * rg + lr) * C::SW + (uint32_t)(cc % CPP) * 16;
            const uint4 v = *reinterpret_cast<const uint4 *>(smem + swz<C::SW>(off));
            uint16_t *dst = o16 + (int64_t)(g.q_off + pos) * p.o_row_stride +
                            row_head(p, g, R) * p.o_head_stride + cc * 8;
            if (p.o_vec_ok) {
                *reinterpret_cast<uint4 *>(dst) = v;
            } else {
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    dst[2 * e] = (uint16_t)(w[e] & 0xffffu);
                    dst[2 * e + 1] = (uint16_t)(w[e] >> 16);
                }
            }
        }
    }
}

/* Tail balancing (work_item): this warpgroup's rows of a part of a split
 * tile. Its partials (unnormalised O, row maxima, the thread's row sums) go
 * to its slot, then it counts itself in the tile's arrivals. The last part
 * to arrive merges every part, its own included, from the workspace in part
 * order, so that the result is the same whichever CTA ends last, and
 * returns true: it stores the tile (rs and O hold the merged state). */
/* Tail balancing: this thread's float4 units of the partials in a slot of
 * the workspace, O then {m0, m1, l0, l1} (tail_split.h). */
template <class C> __device__ __forceinline__ float4 *tail_part_at(const fc_sm90_params &p, int slot, int cw, int tid)
{
    constexpr int U = FC_TAIL_THREAD_FLOATS(C::D) / 4;
    return reinterpret_cast<float4 *>(p.tail_ws) + ((int64_t)slot * C::WG + cw) * U * 128 + tid;
}

/* Tail balancing: f(c, lo) for each CTA c, in order, whose share [lo, hi)
 * meets a tile's blocks [.., t_hi) (consecutive CTAs from c0, empty shares
 * skipped). */
template <class F> __device__ __forceinline__ void each_tail_part(const fc_sm90_params &p, int c0, int t_hi, F &&f)
{
    int lo, hi;
    for (int c = c0; c < (int)gridDim.x; ++c) {
        tail_range(p, c, lo, hi);
        if (lo >= t_hi) break;
        if (hi <= lo) continue;
        f(c, lo);
    }
}

template <class C>
__device__ bool tail_merge(const fc_sm90_params &p, int part, int slot, const Bars<C> &bars, int cw, int tid,
                           RowState &rs, float (&O)[C::D / 2])
{
    constexpr int U = FC_TAIL_THREAD_FLOATS(C::D) / 4; /* float4 units per thread */
    float4 *mine = tail_part_at<C>(p, slot, cw, tid);
#pragma unroll
    for (int u = 0; u < U - 1; ++u) mine[128 * u] = make_float4(O[4 * u], O[4 * u + 1], O[4 * u + 2], O[4 * u + 3]);
    mine[128 * (U - 1)] = make_float4(rs.m[0], rs.m[1], rs.l[0], rs.l[1]);
    __threadfence(); /* the partials before the count (every thread's) */
    bar_sync(kBarEpi + cw, 128);
    if (tid == 0) sts32(bars.t_flag(cw), (uint32_t)atomicAdd(p.tail_cnt + part * C::WG + cw, 1));
    bar_sync(kBarEpi + cw, 128);
    /* (through a shuffle: provably warp-uniform to the compiler, which else
     * treats the branches below as divergent, and with them the tile loop's
     * counters, and moves the main loop's wgmma descriptors through vector
     * registers, R2UR) */
    const int arrived = __shfl_sync(0xffffffffu, (int)lds32(bars.t_flag(cw)), 0);

    /* The tile's blocks [t_lo, t_hi) and the first CTA with a part of them;
     * CTA c's part (its share [c_lo, ...)) is in slot fc_tail_part_slot. */
    const int t_lo = part * p.tail_nb.d, t_hi = t_lo + p.tail_nb.d;
    const int c0 = fc_tail_first_cta(part, p.tail_q, p.tail_rem, p.tail_grid, p.tail_nb, (int)gridDim.x);
    /* Pass 1: count the parts; the last to arrive takes the rows' maxima
     * over them. */
    int parts = 0;
    each_tail_part(p, c0, t_hi, [&](int, int) { ++parts; });
    if (arrived != parts - 1) return false;
    __threadfence();
    float mx[2] = {neg_inf(), neg_inf()};
    each_tail_part(p, c0, t_hi, [&](int c, int lo) {
        const float4 ml = __ldcg(tail_part_at<C>(p, fc_tail_part_slot(c, lo, t_lo), cw, tid) + 128 * (U - 1));
        mx[0] = fmaxf(mx[0], ml.x);
        mx[1] = fmaxf(mx[1], ml.y);
    });
    /* Pass 2, a few columns at a time (registers: the O being summed, not
     * every part's): sum_q O_q * 2^(m_q - max) in part order, and the row
     * sums likewise. */
    const float sc = p.scale_log2;
    const float ms[2] = {max_shift(mx[0], sc), max_shift(mx[1], sc)};
    constexpr int CH = C::D >= 192 ? 2 : 4; /* float4 units per pass over the parts */
    static_assert((U - 1) % CH == 0, "head_dim / 8 units in chunks");
#pragma unroll
    for (int r = 0; r < 2; ++r) rs.m[r] = mx[r], rs.l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < C::D / 2; ++i) O[i] = 0.0f;
#pragma unroll
    for (int u0 = 0; u0 < U - 1; u0 += CH) {
        each_tail_part(p, c0, t_hi, [&](int c, int lo) {
            const float4 *src = tail_part_at<C>(p, fc_tail_part_slot(c, lo, t_lo), cw, tid);
            const float4 ml = __ldcg(src + 128 * (U - 1));
            const float f0 = ex2(ml.x * sc - ms[0]), f1 = ex2(ml.y * sc - ms[1]);
            if (u0 == 0) {
                rs.l[0] += ml.z * f0;
                rs.l[1] += ml.w * f1;
            }
#pragma unroll
            for (int u = u0; u < u0 + CH; ++u) {
                const float4 v = __ldcg(src + 128 * u);
                O[4 * u] += v.x * f0;
                O[4 * u + 1] += v.y * f0;
                O[4 * u + 2] += v.z * f1;
                O[4 * u + 3] += v.w * f1;
            }
        });
    }
    return true;
}

/* A tile whose rows see no key (or a split past the end of the band): O = 0
 * and LSE = -inf, straight from registers (no staging: the Q buffers may
 * hold other tiles' Q). Branch-free on purpose: a thread whose row lies past
 * the sequence writes the same zeros to the tile's last row instead (the
 * tile has one: it has rows), and every lane of a quad writes its rows' LSE.
 * A thread-dependent branch here, inside next_tile's loop, makes the
 * compiler treat the tile loop's counters as divergent, and every wgmma
 * descriptor of the main loop then goes through vector registers (R2UR). */
template <class C>
__device__ __forceinline__ void write_empty_tile(const fc_sm90_params &p, const Tile &g, int row_wg, int col_t)
{
    const int last = (g.sq << p.pack_shift) - 1; /* the last tile row R in the sequence */
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int R = min(g.m0 + row_wg + 8 * r, last);
        const int pos = row_pos(p, R);
        const int head = row_head(p, g, R);
        if (p.num_splits.d > 1) {
            const int64_t plane = (((int64_t)g.split * p.batch + g.b) * p.heads_q + head) * p.seqlen_q + pos;
            float *dst = p.o_accum + plane * C::D + col_t;
#pragma unroll
            for (int j = 0; j < C::D / 8; ++j) *reinterpret_cast<float2 *>(dst + 8 * j) = make_float2(0.0f, 0.0f);
            p.lse_accum[plane] = neg_inf();
        } else {
            if (p.lse)
                p.lse[g.b * p.lse_batch_stride + head * p.lse_head_stride +
                      (int64_t)(g.q_off + pos) * p.lse_row_stride] = neg_inf();
            uint16_t *dst = reinterpret_cast<uint16_t *>(p.o) + g.b * p.o_batch_stride +
                            (int64_t)(g.q_off + pos) * p.o_row_stride + head * p.o_head_stride + col_t;
#pragma unroll
            for (int j = 0; j < C::D / 8; ++j) {
                dst[8 * j] = 0;
                dst[8 * j + 1] = 0;
            }
        }
    }
}

} /* namespace fc90 */

#endif /* FC_SM90_EPILOGUE_CUH */
