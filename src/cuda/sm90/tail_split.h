/*
 * tail_split.h -- how the Hopper path's tail balancing deals out the last,
 * partial round of tiles (sm90/plan.cu tail_on decides when and tail_shape sizes it; the
 * kernel, sm90/fwd_kernel.cuh, runs it; tests/test_tail_split.c checks it
 * on the CPU).
 *
 * With T tiles of nb KV blocks each on G persistent CTAs, the first
 * floor(T / G) rounds go whole, and the rest < G tiles' blocks are dealt
 * out evenly: tile i of the tail holds tail blocks i*nb .. i*nb + nb - 1,
 * all B = rest * nb of them are written B = q * G + rem, and CTA c takes
 *     [lo(c), lo(c+1)),  lo(c) = floor(c * B / G) = c*q + floor(c*rem / G)
 * (the second form in 32 bits: c * rem < G^2 < 2^30, which the planner
 * ensures along with B < 2^30). A share has at most ceil(B / G) <= nb
 * blocks (rest < G), so it meets at most two tiles: part 0 in the tile
 * holding its first block, part 1 in the next. Part j of CTA c writes its
 * partials to slot 2c + j; a tile's parts belong to consecutive CTAs.
 *
 * Plain C on plain values (the kernel passes its parameters' fields), so
 * that the C test calls exactly what the kernel runs.
 */
#ifndef FC_TAIL_SPLIT_H
#define FC_TAIL_SPLIT_H

#include <stdint.h>

#include "cuda/common/fastdiv.h"

#if defined(__CUDACC__)
#define FC_TAIL_FN static __host__ __device__ __forceinline__
#else
#define FC_TAIL_FN static inline
#endif

/* Floats of one consumer thread's partial in a slot: its O accumulator
 * (head_dim / 2) and its rows' {max, max, sum, sum}; the workspace holds
 * 2 * grid slots of warpgroups x 128 threads of these (plan.cu sizes it,
 * the kernel's tail_merge indexes it as float4 units). A macro: the kernel
 * needs it as a constant expression. */
#define FC_TAIL_THREAD_FLOATS(head_dim) ((head_dim) / 2 + 4)

/* lo(c): the first tail block of CTA c's share (lo(G) = B). */
FC_TAIL_FN int32_t fc_tail_lo(int32_t c, int32_t q, int32_t rem, fc_fastdiv grid)
{
    return c * q + fc_fastdiv_div(c * rem, grid);
}

/* Part j (0 or 1) of CTA c: tail tile *i and its blocks [*n_lo, *n_hi).
 * 0 when CTA c has no part j (an empty share, or one inside one tile). */
FC_TAIL_FN int fc_tail_part(int32_t c, int32_t j, int32_t q, int32_t rem, fc_fastdiv grid, fc_fastdiv nb,
                            int32_t *i, int32_t *n_lo, int32_t *n_hi)
{
    const int32_t lo = fc_tail_lo(c, q, rem, grid), hi = fc_tail_lo(c + 1, q, rem, grid);
    const int32_t i0 = fc_fastdiv_div(lo, nb); /* (no divide: uniform registers) */
    if (lo >= hi || j > 1) return 0;
    if (j == 0) {
        *i = i0;
        *n_lo = lo - i0 * nb.d;
        *n_hi = hi - i0 * nb.d < nb.d ? hi - i0 * nb.d : nb.d;
    } else {
        if (hi <= (i0 + 1) * nb.d) return 0;
        *i = i0 + 1;
        *n_lo = 0;
        *n_hi = hi - *i * nb.d;
    }
    return 1;
}

/* The slot of CTA c's part in the tail tile whose first block is t_lo,
 * for a share beginning at block lo: part 1 if it began in an earlier
 * tile. */
FC_TAIL_FN int32_t fc_tail_part_slot(int32_t c, int32_t lo, int32_t t_lo) { return 2 * c + (lo < t_lo ? 1 : 0); }

/* CTA c's part slot in tail tile i (its share meets the tile): 2c + 1 if
 * the share began in an earlier tile, else 2c; -1 if the share holds all
 * of the tile (no part: the CTA stores it as a whole tile). */
FC_TAIL_FN int32_t fc_tail_slot(int32_t c, int32_t i, int32_t q, int32_t rem, fc_fastdiv grid, fc_fastdiv nb)
{
    const int32_t lo = fc_tail_lo(c, q, rem, grid), hi = fc_tail_lo(c + 1, q, rem, grid);
    const int32_t t_lo = i * nb.d;
    if (lo <= t_lo && hi >= t_lo + nb.d) return -1;
    return fc_tail_part_slot(c, lo, t_lo);
}

/* The first CTA whose share meets tail tile i (of a grid of g CTAs): the
 * one whose share holds the tile's block t = i*nb, lo(c) <= t < lo(c+1).
 * The estimate c' = floor(t*g / B) is never past it (lo(c') <= t) and at
 * most one short of it. */
FC_TAIL_FN int32_t fc_tail_first_cta(int32_t i, int32_t q, int32_t rem, fc_fastdiv grid, fc_fastdiv nb, int32_t g)
{
    const int32_t t = i * nb.d;
    int32_t c = (int32_t)((int64_t)t * g / (q * g + rem));
    while (fc_tail_lo(c + 1, q, rem, grid) <= t) ++c;
    return c;
}

#undef FC_TAIL_FN
#endif /* FC_TAIL_SPLIT_H */
