/*
 * epilogue.cuh -- what a consumer warpgroup does with a finished tile:
 * merge partial states (the kvsplit pair through shared memory, tail
 * balancing's parts through global memory), normalise O and compute the LSE,
 * and store: 16-bit O staged in the tile's own Q buffer, then one TMA store
 * per panel (p.o_tma) or generic stores where TMA cannot (varlen, odd
 * layouts: 16-byte chunks, or elements where strides are odd); split-KV
 * partials (fp32) and LSE straight from registers;
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
            if (p.o_vec_ok) *reinterpret_cast<uint4 *>(dst) = v;
            else fc::dev::st_elems8(dst, v);
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

/* kvsplit: merge the pair's partials, thread t with thread t (the same rows
 * and columns): the second warpgroup (kv 1) hands its m, l, O over shared
 * memory (m_full) and goes on to its next tile; the first rescales both to
 * the common max and hands the area back (m_empty). Merge number `merges`
 * gives the parity. */
template <class C>
__device__ __forceinline__ void kvsplit_merge(const fc_sm90_params &p, const Bars<C> &bars, uint8_t *smem, int tid,
                                              int kv, uint32_t &merges, RowState &rs, float (&O)[C::D / 2])
{
    float *mg = reinterpret_cast<float *>(smem + C::OFF_MERGE) + tid;
    const uint32_t m_par = merges & 1;
    ++merges;
    if (kv == 1) {
        FC90_WAIT(bars.m_empty(), m_par ^ 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mg[128 * r] = rs.m[r];
            mg[128 * (2 + r)] = rs.l[r];
        }
#pragma unroll
        for (int i = 0; i < C::D / 2; ++i) mg[128 * (4 + i)] = O[i];
        mbar_arrive(bars.m_full());
    } else {
        FC90_WAIT(bars.m_full(), m_par);
        float f0[2], f1[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float m1 = mg[128 * r];
            const float mn = fmaxf(rs.m[r], m1);
            const float ms = max_shift(mn, p.scale_log2);
            f0[r] = ex2(rs.m[r] * p.scale_log2 - ms);
            f1[r] = ex2(m1 * p.scale_log2 - ms);
            rs.l[r] = rs.l[r] * f0[r] + mg[128 * (2 + r)] * f1[r];
            rs.m[r] = mn;
        }
#pragma unroll
        for (int i = 0; i < C::D / 2; ++i) {
            const int r = (i >> 1) & 1; /* acc[4j+0..1]: row r, acc[4j+2..3]: row r+8 */
            O[i] = O[i] * f0[r] + mg[128 * (4 + i)] * f1[r];
        }
        mbar_arrive(bars.m_empty());
    }
}

/* O / l and lse = max * scale + ln(l) (natural log) for the thread's two
 * rows; l is quad-reduced first (each lane held a partial sum). */
template <int kD, class Params>
__device__ __forceinline__ void finalize_rows(const Params &p, const RowState &rs, float (&O)[kD / 2],
                                              float (&lse)[2])
{
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = rs.l[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const bool empty = rs.m[r] == neg_inf() || !(l > 0.0f);
        const float inv = empty ? 0.0f : 1.0f / l;
        /* ln(l) as log2(l) * ln 2 with the hardware log2 (MUFU.LG2, as the
         * sm80 path): logf is a ~30-instruction routine in every tile's
         * epilogue, and its extra accuracy is far below the LSE bound. */
        lse[r] = empty ? neg_inf() : (rs.m[r] * p.scale_log2 + __log2f(l)) * FC_LN2_F;
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
            O[4 * j + 2 * r] *= inv;
            O[4 * j + 2 * r + 1] *= inv;
        }
    }
}

/* Split-KV: fp32 partials for the shared combine kernel, o_accum
 * [split][b*Hq+h][seqlen_q][D], lse_accum [split][b*Hq+h][seqlen_q]. */
template <class C>
__device__ __forceinline__ void store_partials(const fc_sm90_params &p, const Tile &g, const WgThread &w,
                                               const int (&pos_r)[2], const int (&head_r)[2],
                                               const float (&O)[C::D / 2], const float (&lse)[2])
{
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (pos_r[r] >= g.sq) continue;
        const int64_t plane = (((int64_t)g.split * p.batch + g.b) * p.heads_q + head_r[r]) * p.seqlen_q + pos_r[r];
        float *dst = p.o_accum + plane * C::D + w.col_t;
#pragma unroll
        for (int j = 0; j < C::D / 8; ++j)
            *reinterpret_cast<float2 *>(dst + 8 * j) = make_float2(O[4 * j + 2 * r], O[4 * j + 2 * r + 1]);
        if ((w.lane & 3) == 0) p.lse_accum[plane] = lse[r];
    }
}

/* Stage the 16-bit O in this warpgroup's rows of the tile's Q buffer (its
 * last S GEMM has completed in every warp once all four reach the barrier). */
template <class C, bool kBF16>
__device__ __forceinline__ void stage_o(uint8_t *smem, uint32_t q_off, int cw, int rg, int etid,
                                        const float (&O)[C::D / 2])
{
    bar_sync(kBarEpi + cw, 128);
    const int e_row = 64 * rg + 16 * (etid >> 5) + ((etid & 31) >> 2);
    const int e_col = 2 * (etid & 3);
#pragma unroll
    for (int j = 0; j < C::D / 8; ++j) {
        const int col = 8 * j + e_col;
        const uint32_t pan = (uint32_t)(col / C::PW) * (C::BM * C::SW);
        const uint32_t cb = (uint32_t)(col % C::PW) * 2;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint32_t off = q_off + pan + (uint32_t)(e_row + 8 * r) * C::SW + cb;
            *reinterpret_cast<uint32_t *>(smem + swz<C::SW>(off)) = pack2<kBF16>(O[4 * j + 2 * r], O[4 * j + 2 * r + 1]);
        }
    }
}

/* TMA store of the warpgroup's 64 staged rows (one box per panel): the
 * staging writes go to the async proxy first; rows past seqlen_q are
 * clipped by the tensor map. */
template <class C>
__device__ __forceinline__ void store_o_tma(const fc_sm90_params &p, const Tile &g, uint32_t base, uint32_t q_off,
                                            int cw, int rg, int etid)
{
    fence_proxy_async();
    bar_sync(kBarEpi + cw, 128);
    if (etid == 0) {
        const int pos0 = g.q_off + row_pos(p, g.m0 + 64 * rg);
#pragma unroll
        for (int pn = 0; pn < C::PANELS; ++pn)
            tma_store_5d(&p.tm_o, base + q_off + pn * (C::BM * C::SW) + 64 * rg * C::SW, pn * C::PW, 0, g.hu, pos0,
                         g.b);
        tma_store_commit();
    }
}

/* Normalise and store the warpgroup's rows of tile g (Q buffer at q_off is
 * its O staging): everything that reads O first, then LSE and O from the
 * staging to global memory. */
template <class C, bool kBF16>
__device__ __forceinline__ void store_tile(const fc_sm90_params &p, const Tile &g, uint32_t base, uint8_t *smem,
                                           const WgThread &w, uint32_t q_off, RowState &rs, float (&O)[C::D / 2])
{
    float lse[2];
    finalize_rows<C::D>(p, rs, O, lse);

    /* The thread's two rows: position and query head. */
    int pos_r[2], head_r[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        pos_r[r] = row_pos(p, g.m0 + w.row_wg + 8 * r);
        head_r[r] = row_head(p, g, g.m0 + w.row_wg + 8 * r);
    }
    /* An opaque copy of the thread index: without it the compiler hoists
     * the D/4 per-thread staging addresses out of the tile loop and keeps
     * them live across the main loop (spills at head_dim 192/256). */
    int etid = w.tid;
    asm volatile("" : "+r"(etid));
    if (p.num_splits.d > 1) store_partials<C>(p, g, w, pos_r, head_r, O, lse);
    else stage_o<C, kBF16>(smem, q_off, w.cw, w.rg, etid, O);
    if (p.num_splits.d == 1) {
        if (p.lse && (w.lane & 3) == 0) {
#pragma unroll
            for (int r = 0; r < 2; ++r)
                if (pos_r[r] < g.sq)
                    p.lse[g.b * p.lse_batch_stride + head_r[r] * p.lse_head_stride +
                          (int64_t)(g.q_off + pos_r[r]) * p.lse_row_stride] = lse[r];
        }
        if (p.o_tma) {
            store_o_tma<C>(p, g, base, q_off, w.cw, w.rg, etid);
        } else {
            bar_sync(kBarEpi + w.cw, 128);
            uint16_t *o16 = reinterpret_cast<uint16_t *>(p.o) + g.b * p.o_batch_stride;
            store_o_generic<C>(p, g, o16, smem, q_off, w.rg, etid);
        }
    }
}

} /* namespace fc90 */

#endif /* FC_SM90_EPILOGUE_CUH */
