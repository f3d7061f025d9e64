/*
 * scheduler.cuh -- which tile a CTA works on next: the tile order (static
 * i, i + grid, ... or a dynamic atomic counter handed from the producer to
 * the consumers), the decode of a tile index into (m_block, batch, head,
 * split) and its KV block range, and tail balancing's work items (the last
 * tiles' KV blocks dealt out evenly; tail_split.h).
 *
 * Order: non-causal m-fastest (a head's K/V stays in L2 while its row
 * blocks run); causal longest-first within L2 sections of heads, handed
 * out dynamically when there are more tiles than CTAs (unequal lengths).
 */
#ifndef FC_SM90_SCHEDULER_CUH
#define FC_SM90_SCHEDULER_CUH

#include "cuda/sm90/config.cuh"
#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/tail_split.h"

namespace fc90 {

#ifdef __CUDA_ARCH__
#define FC90_LDG(ptr) __ldg(ptr)
#else
#define FC90_LDG(ptr) (*(ptr))
#endif

/* Tile rows R are query positions s (R = s), or with pack-GQA the pairs
 * (s, i) of a position and one of the ratio query heads sharing a KV head
 * (R = s * ratio + i, ratio = 1 << pack_shift). The "head unit" hu is the
 * query head, or with pack-GQA the KV head. */
struct Tile {
    int m_block, b, hu, bu, split; /* bu = b * head_units + hu */
    int hk;                   /* KV head */
    int q_off, k_off, sq, sk; /* sequence offsets (varlen) and lengths */
    int m0;                   /* first tile row R */
    int n_lo, n_hi;           /* KV blocks of this split: [n_lo, n_hi) */
    int hi_first, lo_last;    /* key_hi(first row), key_lo(last real row) */
    bool rows;                /* the tile has query rows in its sequence */
};

/* Query position and query head of tile row R. */
__host__ __device__ __forceinline__ int row_pos(const fc_sm90_params &p, int R) { return R >> p.pack_shift; }
__host__ __device__ __forceinline__ int row_head(const fc_sm90_params &p, const Tile &g, int R)
{
    return (g.hu << p.pack_shift) + (R & ((1 << p.pack_shift) - 1));
}

/* Host-callable too (the scheduler/mask logic is checked on the host). */
template <class C> __host__ __device__ __forceinline__ void decode_tile(const fc_sm90_params &p, int t, Tile &g)
{
    int u;
    if (p.longest_first) {
        /* Sections of l2_group units; inside one, m_block decreasing (longest
         * first for a causal mask), units fastest. */
        const int sec = fc_fastdiv_div(t, p.l2_section);
        const int within = t - sec * p.l2_section.d;
        const int left = p.num_units - sec * p.l2_group.d;
        int q;
        if (left < p.l2_group.d) { /* the last, short section: a plain division */
            q = within / left;
            u = sec * p.l2_group.d + (within - q * left);
        } else {
            q = fc_fastdiv_div(within, p.l2_group);
            u = sec * p.l2_group.d + (within - q * p.l2_group.d);
        }
        g.m_block = p.num_m_blocks.d - 1 - q;
    } else {
        u = fc_fastdiv_div(t, p.num_m_blocks);
        g.m_block = t - u * p.num_m_blocks.d;
    }
    g.bu = fc_fastdiv_div(u, p.num_splits);
    g.split = u - g.bu * p.num_splits.d;
    g.b = fc_fastdiv_div(g.bu, p.head_units);
    g.hu = g.bu - g.b * p.head_units.d;
    g.hk = fc_fastdiv_div(g.hu << p.pack_shift, p.hq_per_kv);
    if (p.cu_q) {
        g.q_off = FC90_LDG(p.cu_q + g.b);
        g.sq = FC90_LDG(p.cu_q + g.b + 1) - g.q_off;
        g.k_off = FC90_LDG(p.cu_k + g.b);
        g.sk = FC90_LDG(p.cu_k + g.b + 1) - g.k_off;
    } else {
        g.q_off = 0;
        g.sq = p.seqlen_q;
        g.k_off = 0;
        g.sk = p.used_k ? FC90_LDG(p.used_k + g.b) : p.seqlen_k; /* a cache's length */
    }
    g.m0 = g.m_block * C::BM;
    const int rows_total = g.sq << p.pack_shift;
    g.rows = g.m0 < rows_total;
    g.n_lo = g.n_hi = 0;
    g.hi_first = g.lo_last = 0;
    if (!g.rows) return;
    /* The band is monotone in the position, and the position in R. */
    const int first = row_pos(p, g.m0);
    const int last = row_pos(p, (g.m0 + C::BM < rows_total ? g.m0 + C::BM : rows_total) - 1);
    const int hi = key_hi(last, g.sq, g.sk, p.window_right);   /* max over rows */
    const int lo = key_lo(first, g.sq, g.sk, p.window_left);   /* min over rows */
    g.hi_first = key_hi(first, g.sq, g.sk, p.window_right);    /* min over rows */
    g.lo_last = key_lo(last, g.sq, g.sk, p.window_left);       /* max over rows */
    if (hi <= lo) return; /* no row of the tile sees a key */
    const int n_min = lo / C::BN;
    const int n_max = (hi + C::BN - 1) / C::BN;
    const int per = fc_fastdiv_div(n_max - n_min + p.num_splits.d - 1, p.num_splits);
    g.n_lo = n_min + g.split * per;
    g.n_hi = g.n_lo + per < n_max ? g.n_lo + per : n_max;
    if (g.n_hi <= g.n_lo) g.n_lo = g.n_hi = 0; /* a split past the end: empty */
    FC90_ASSERT(g.n_lo >= 0 && g.n_lo <= g.n_hi && g.n_hi * C::BN < g.sk + C::BN);
}

/* Does block n need the element mask for any real row of the tile? The band
 * is monotone in the row, so the first row bounds key_hi and the last real
 * row bounds key_lo. */
template <class C> __host__ __device__ __forceinline__ bool block_masked(const Tile &g, int n)
{
    return n * C::BN + C::BN > g.hi_first || n * C::BN < g.lo_last;
}

/* The visible key range of a thread's two accumulator rows (tile rows
 * row_wg and row_wg + 8) in tile g. */
__device__ __forceinline__ MaskRows mask_rows(const fc_sm90_params &p, const Tile &g, int row_wg)
{
    MaskRows mr;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row_pos(p, g.m0 + row_wg + 8 * r);
        mr.lo[r] = key_lo(row, g.sq, g.sk, p.window_left);
        mr.hi[r] = key_hi(row, g.sq, g.sk, p.window_right);
    }
    return mr;
}

/* Tail balancing (fc_sm90_params.tail_first): CTA c's share of the tail's
 * KV blocks, [lo, hi) in tail-block numbers (tail_split.h has the
 * partition; tests/test_tail_split.c checks it on the CPU). */
__device__ __forceinline__ void tail_range(const fc_sm90_params &p, int c, int &lo, int &hi)
{
    lo = fc_tail_lo(c, p.tail_q, p.tail_rem, p.tail_grid);
    hi = fc_tail_lo(c + 1, p.tail_q, p.tail_rem, p.tail_grid);
}

/* Work item s of this CTA (t: its static tile index blockIdx.x + s * grid,
 * or the dynamic scheduler's), false when it has none left. In the tail-
 * balanced instance (static schedule only), whole tiles below tail_first,
 * then at most two parts of tail tiles (a share of at most nb blocks spans
 * at most two). */
template <class C> __device__ __forceinline__ bool work_item(const fc_sm90_params &p, int t, int s, Tile &g)
{
    if (!C::TAIL || t < p.tail_first) {
        if (t >= p.num_tiles) return false;
        decode_tile<C>(p, t, g);
        return true;
    }
    int i, n_lo, n_hi; /* the CTA's part s - tail_rounds (0 or 1): tail tile i, blocks [n_lo, n_hi) */
    if (!fc_tail_part((int)blockIdx.x, s - p.tail_rounds, p.tail_q, p.tail_rem, p.tail_grid, p.tail_nb, &i, &n_lo,
                      &n_hi))
        return false;
    decode_tile<C>(p, p.tail_first + i, g);
    /* Every tile has the KV range [0, nb) (plan.cu tail_on: no band, no varlen). */
    FC90_ASSERT(g.n_lo == 0 && g.n_hi == p.tail_nb.d);
    g.n_lo = n_lo;
    g.n_hi = n_hi;
    return true;
}

/* Tail balancing: the tail tile number of g and this CTA's part slot in it,
 * or -1 when g is not a tile this CTA shares with others. Derived from the
 * tile's coordinates (held for the epilogue anyway) rather than carried
 * through the main loop in registers, where d256 has none to spare. */
template <class C> __device__ __forceinline__ int tail_part(const fc_sm90_params &p, const Tile &g, int &slot)
{
    const int m_block = (int)((unsigned)g.m0 / C::BM);
    const int i = (g.b * p.head_units.d + g.hu) * p.num_m_blocks.d + m_block - p.tail_first;
    if (i < 0) return -1;
    slot = fc_tail_slot((int)blockIdx.x, i, p.tail_q, p.tail_rem, p.tail_grid, p.tail_nb);
    return slot < 0 ? -1 : i;
}

/* Producer side: the tile index of the CTA's k-th work item. Dynamic: the
 * first wave is blockIdx.x, later tiles come from the counter in the same
 * (longest-first) order, so whichever CTA is free first takes the next
 * longest tile; handed to the consumers through slot k & 1 (the arrive
 * releases the store). */
template <class C> __device__ __forceinline__ int hand_out_tile(const fc_sm90_params &p, const Bars<C> &bars, int k)
{
    int t;
    if (p.tile_ctr) {
        t = k == 0 ? (int)blockIdx.x : atomicAdd(p.tile_ctr, 1) + (int)gridDim.x;
        FC90_WAIT(bars.t_empty(k & 1), ((k >> 1) & 1) ^ 1);
        sts32(bars.t_slot(k & 1), (uint32_t)t);
        mbar_arrive(bars.t_full(k & 1));
    } else {
        t = (int)blockIdx.x + k * (int)gridDim.x;
    }
    return t;
}

/* Consumer side: the tile index of work item s, the producer's choice when
 * dynamic (read before our arrive on the slot's empty barrier). */
template <class C> __device__ __forceinline__ int take_tile(const fc_sm90_params &p, const Bars<C> &bars, int s)
{
    int t;
    if (p.tile_ctr) {
        FC90_WAIT(bars.t_full(s & 1), (s >> 1) & 1);
        t = (int)lds32(bars.t_slot(s & 1));
        mbar_arrive(bars.t_empty(s & 1));
    } else {
        t = (int)blockIdx.x + s * (int)gridDim.x;
    }
    return t;
}

} /* namespace fc90 */

#endif /* FC_SM90_SCHEDULER_CUH */
