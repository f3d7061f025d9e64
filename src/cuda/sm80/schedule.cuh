/*
 * schedule.cuh -- which work a CTA of the sm80-class kernel does: its tile
 * (batch, head group, query rows, split) from blockIdx.x, and the KV blocks
 * it visits, split into the ones that need a per-element mask and the ones
 * that do not.
 */
#ifndef FC_SM80_SCHEDULE_CUH
#define FC_SM80_SCHEDULE_CUH

#include <stdint.h>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/fwd_args.h"
#include "cuda/sm80/layout.cuh"

namespace fc {
namespace sm80 {

/* Where a CTA's tile lives: derived from blockIdx.x and the sequence
 * lengths. Computed twice (before the main loop and again for the epilogue)
 * so that none of it has to stay live in registers across the loop. */
struct TileCoords {
    int split;        /* split-KV index                                             */
    int b;            /* batch (sequence) index                                     */
    int h_base;       /* query head of tile row 0 (packed: first head of the group) */
    int G;            /* tile row rr -> query position rr / G, head h_base + rr % G */
    int sq, sk;       /* this sequence's lengths                                    */
    int64_t q_start;  /* varlen: first token of the sequence (else 0)               */
    int64_t k_start;
    int64_t bq, bk;   /* batch index for the batch strides (0 for varlen)           */
    int64_t r0;       /* first tile row                                             */
    int64_t rows;     /* valid tile rows of this (b, head group): sq * G            */
};

/* blockIdx.x = ((b * grid_heads + hg) * splits + split) * m_tiles + m. M tiles
 * vary fastest so neighbouring CTAs share K/V in L2; they run from the last
 * tile down so causal's longest tiles start first. */
template <int BM>
__device__ __forceinline__ TileCoords locate_tile(const fc_sm80_args &a)
{
    const fc_fwd_params &p = a.p;
    TileCoords c;
    int bid = ptx::ctaid_x(); /* volatile read: the epilogue call recomputes */
    /* Plan-time divisors (common/fastdiv.h): a division by a run-time value
     * is a ~30-instruction routine, and this runs twice per CTA. */
    int q = fc_fastdiv_div(bid, a.m_tiles);
    const int m_tile = a.m_tiles.d - 1 - (bid - q * a.m_tiles.d);
    bid = q;
    q = fc_fastdiv_div(bid, a.num_splits);
    c.split = bid - q * a.num_splits.d;
    bid = q;
    c.b = fc_fastdiv_div(bid, a.grid_heads);
    const int hg = bid - c.b * a.grid_heads.d;
    c.G = a.pack_g.d;
    c.h_base = hg * c.G;
    c.q_start = 0;
    c.k_start = 0;
    c.sq = p.seqlen_q;
    c.sk = p.seqlen_k;
    if (p.cu_seqlens_q) { /* varlen: device-memory offsets, batch folded in */
        const int s0 = p.cu_seqlens_q[c.b];
        c.q_start = s0;
        c.sq = p.cu_seqlens_q[c.b + 1] - s0;
    }
    if (p.cu_seqlens_k) {
        const int s0 = p.cu_seqlens_k[c.b];
        c.k_start = s0;
        c.sk = p.cu_seqlens_k[c.b + 1] - s0;
    }
    if (p.seqused_k) c.sk = p.seqused_k[c.b]; /* a cache's length (dense or paged) */
    c.bq = p.cu_seqlens_q ? 0 : c.b;
    c.bk = p.cu_seqlens_k ? 0 : c.b;
    c.r0 = (int64_t)m_tile * BM;
    c.rows = (int64_t)c.sq * c.G;
    return c;
}

/* Query position of tile row rr (rr / G; G is 1 unless GQA packing is on),
 * by the plan-time divider: 3 instructions and no branch, where a 64-bit
 * division behind a G == 1 test cost ~1000 instructions of dead code in a
 * kernel that stalls on instruction fetch. Tile rows are < 2^31 (plan.cu). */
__device__ __forceinline__ int64_t row_pos(int64_t rr, fc_fastdiv G) { return fc_fastdiv_div((int32_t)rr, G); }

/* floor(x / d) for d > 0 and any sign of x. */
__device__ __forceinline__ int64_t floor_div(int64_t x, int64_t d)
{
    return x >= 0 ? x / d : -((-x + d - 1) / d);
}

/* The KV blocks a CTA visits, [n_begin, n_end) (empty if nothing is
 * visible), and the mask-free ones among them, [n_full_lo, n_full_hi). */
struct BlockRange {
    int n_begin, n_end;
    int n_full_lo, n_full_hi;
};

/* Key j is visible to query i iff (fc_key_visible)
 *   i + diag - wl <= j <= i + diag + wr  and  0 <= j < sk,  diag = sk - sq.
 * The tile's block range, and the visible key interval [jmin, jmax] of this
 * thread's rows (mt, hf) -> tile row wrow + 16 mt + g + 8 hf, read on masked
 * blocks. LEAN_REGS parks the intervals in smem and skips them when no
 * block of the CTA's range is masked (the table is then never read). */
template <class S_, bool PLAIN>
__device__ __forceinline__ BlockRange key_range(const fc_sm80_args &a, const TileCoords &c, const Thr &th,
                                                const Smem &sm, int (&jmin)[S_::MT][2], int (&jmax)[S_::MT][2])
{
    constexpr int BN = S_::BN;
    const fc_fwd_params &p = a.p;
    const int64_t i_first = row_pos(c.r0, a.pack_g); /* query positions spanned by the tile */
    const int64_t i_last = row_pos(min(c.r0 + S_::BM, c.rows) - 1, a.pack_g);
    const int sk = c.sk;
    const int64_t diag = (int64_t)sk - c.sq;
    const int wl = p.window_left, wr = p.window_right;
    int64_t j_lo = 0, j_hi = sk; /* [j_lo, j_hi): union over the tile's rows */
    if (wl >= 0) j_lo = max((int64_t)0, i_first + diag - wl);
    if (wr >= 0) j_hi = min((int64_t)sk, i_last + diag + wr + 1);
    BlockRange r;
    int n_begin = 0, n_end = 0;
    if (j_hi > j_lo) {
        n_begin = (int)(j_lo / BN);
        n_end = (int)((j_hi + BN - 1) / BN);
    }
    if (a.num_splits.d > 1) { /* a contiguous share of the blocks; may be empty */
        const int per = fc_fastdiv_div(n_end - n_begin + a.num_splits.d - 1, a.num_splits);
        const int nb = n_begin + c.split * per;
        n_end = min(n_end, nb + per);
        n_begin = nb;
    }
    /* Mask-free blocks: all their keys are < sk, <= i_first + diag + wr
     * (right edge of the tile's first row, the tightest) and >= i_last +
     * diag - wl (left edge of its last row). The others straddle an edge
     * (blocks wholly outside the band are not in [n_begin, n_end) at all). */
    int64_t full_hi = sk / BN;
    if (wr >= 0) full_hi = min(full_hi, floor_div(i_first + diag + wr + 1, BN));
    int64_t full_lo = 0;
    if (wl >= 0) full_lo = max((int64_t)0, -floor_div(-(i_last + diag - wl), BN)); /* ceil */
    r.n_begin = n_begin;
    r.n_end = n_end;
    r.n_full_lo = (int)min(full_lo, (int64_t)n_end);
    r.n_full_hi = (int)max(full_hi, (int64_t)r.n_full_lo);

    const bool any_masked = r.n_full_lo > r.n_begin || r.n_full_hi < r.n_end;
#pragma unroll
    for (int mt = 0; mt < S_::MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            if (PLAIN || (S_::LEAN_REGS && !any_masked)) continue;
            const int64_t i = row_pos(c.r0 + th.wrow + mt * 16 + th.g + 8 * hf, a.pack_g);
            const int64_t lo = wl >= 0 ? i + diag - wl : 0;
            const int64_t hi = wr >= 0 ? i + diag + wr : (int64_t)sk - 1;
            jmin[mt][hf] = (int)max((int64_t)0, min(lo, (int64_t)sk));
            jmax[mt][hf] = (int)min((int64_t)sk - 1, max(hi, (int64_t)-1));
            /* LEAN_REGS: park them (the quad's 4 lanes hold the same row;
             * lane t == 0 writes). Only this warp reads its rows, and the
             * first read is after the main loop's first __syncthreads. */
            if constexpr (S_::LEAN_REGS)
                if (th.t == 0)
                    dev::sts64(sm.mask + (uint32_t)(th.wrow + mt * 16 + th.g + 8 * hf) * 8,
                               (uint64_t)(uint32_t)jmin[mt][hf] | ((uint64_t)(uint32_t)jmax[mt][hf] << 32));
        }
    return r;
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_SCHEDULE_CUH */
