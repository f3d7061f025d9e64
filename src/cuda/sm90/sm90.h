/*
 * sm90.h -- what crosses between the Hopper planner/launcher (plan.cu, tma.cu)
 * and the kernel translation units (fwd_<dtype>_d<dim>.cu). CUDA-only.
 *
 * fc_sm90_params is the kernel's only argument (passed by value as a
 * __grid_constant__, so the TMA tensor maps inside it live in parameter
 * space, where cp.async.bulk.tensor may read them).
 */
#ifndef FC_SM90_H
#define FC_SM90_H

#include <cuda.h> /* CUtensorMap (type only: the encoder is fetched at run time) */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/common/fastdiv.h"
#include "cuda/common/tma_map.h"
#include "internal.h"

typedef struct fc_sm90_params {
    /* Q: dims {head_dim, ratio, heads_q/ratio, rows, batch}, box {swz/2,
     * ratio, 1, block_m/ratio, 1} with ratio = 1 << pack_shift (1 without
     * pack-GQA). K, V: dims {head_dim, rows, heads_kv, batch}, box {swz/2,
     * block_n, 1, 1}. Dense rows = seqlen_q/k; varlen rows = total_q/k and
     * batch = 1. O (o_tma only): like Q with box rows 64/ratio, one
     * consumer warpgroup's rows. */
    CUtensorMap tm_q, tm_k, tm_v, tm_o;

    void *o;          /* 16-bit output, strides below (elements)            */
    float *lse;       /* NULL: not requested                               */
    float *o_accum;   /* split-KV partials (num_splits > 1), else NULL      */
    float *lse_accum;
    const int32_t *cu_q, *cu_k; /* varlen offsets (device) or NULL           */
    const int32_t *used_k; /* dense: keys in use per sequence (seqused_k) or NULL */
    int *tile_ctr;    /* dynamic tile scheduler: zeroed counter, or NULL (static) */
    float *tail_ws;   /* tail balancing (tail_first < num_tiles): per-piece partials,
                       * slot 2*cta + j, consumer warpgroup, (head_dim/2 + 4) floats
                       * per thread, float4-interleaved over the 128 threads      */
    int *tail_cnt;    /* tail balancing: zeroed arrival counter per (tail tile, warpgroup) */
    long long *trace; /* phase timestamps, trace builds only (FC_SM90_TRACE), else NULL */

    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int64_t lse_batch_stride, lse_head_stride, lse_row_stride;

    /* Divisors of the tile decode carry their multipliers (common/fastdiv.h:
     * no software division per tile); their values are the .d's.        */
    int32_t batch, heads_q;
    fc_fastdiv hq_per_kv;
    fc_fastdiv head_units; /* heads_q, or heads_kv with pack-GQA           */
    int32_t pack_shift; /* log2 of the query heads packed per tile row group (0: off) */
    int32_t seqlen_q, seqlen_k; /* dense sizes; varlen: the maxima          */
    int32_t window_left, window_right; /* -1 = unbounded, causal folded in  */

    float scale_log2;  /* log2(e) * scale; log2(e) when softcap is on       */
    float softcap_in;  /* scale / softcap, 0 = off                          */
    float softcap_out; /* softcap                                           */

    fc_fastdiv num_splits;
    fc_fastdiv num_m_blocks; /* ceil((seqlen_q << pack_shift) / block_m)    */
    int32_t num_units;     /* batch * head_units * num_splits               */
    int32_t num_tiles;     /* num_units * num_m_blocks                      */
    fc_fastdiv l2_group;   /* units per L2 section (longest-first order)     */
    fc_fastdiv l2_section; /* tiles per L2 section: l2_group * num_m_blocks  */
    int32_t longest_first; /* 1: visit tiles by decreasing work (causal)    */
    int32_t o_vec_ok;      /* 1: o and its strides allow 16-byte stores     */
    int32_t rotate;        /* 1: the rotated tile loop (2-Q-buffer rows only):
                            * chosen where a CTA gets several short tiles     */
    int32_t masks;         /* which blocks may need softcap/mask code: 0 none,
                            * 1 each tile's first block only, 2 any (host
                            * side: picks the kernel instance; plan.cu)     */
    int32_t pdl;           /* 1: launched as a programmatic dependent of the
                            * previous kernel (default; tuning.pdl = 0 turns
                            * it off, and the tile counter does; host side
                            * only: the kernel always waits, a no-op without) */
    /* Tail balancing (plan.cu): whole tiles t < tail_first (= tail_rounds *
     * grid) go statically, CTA i taking i, i+grid, ...; the KV blocks of the
     * last tiles (tail_blocks = (num_tiles - tail_first) * tail_nb = tail_q *
     * grid + tail_rem) are then dealt out evenly, CTA i taking
     * [i * tail_blocks / grid, (i+1) * tail_blocks / grid),
     * and each tile split between CTAs is merged by whichever of them
     * finishes its part last. tail_first = num_tiles: off.              */
    int32_t tail_first, tail_rounds, tail_q, tail_rem;
    fc_fastdiv tail_nb;    /* KV blocks per tile (all equal under tail balancing) */
    fc_fastdiv tail_grid;  /* the grid */
    int32_t o_tma;         /* 1: the epilogue stores O with TMA (tm_o): dense
                            * (TMA clips rows past seqlen_q; varlen rows past a
                            * sequence belong to the next), no split, whole
                            * position groups per 64 rows, TMA-able layout   */
    /* Paged K/V (block_table non-NULL; the kPaged instances read it): key
     * row j of sequence b is row j % page of page block_table[b * bt_stride
     * + j / page]; page is a multiple of block_n (plan.cu), so a block is
     * one box in one page. Last, so the other fields keep their offsets. */
    const int32_t *block_table;
    int32_t bt_stride;     /* batch * bt_stride < 2^31 (plan.cu)             */
    fc_fastdiv page;
} fc_sm90_params;

/* The head dims with kernel TUs (fwd_<dtype>_d<dim>.cu); every row of
 * tiles.cuh has one of them (plan.cu checks). */
#define FC_SM90_HEAD_DIMS(X) X(64) X(96) X(128) X(192) X(256)

/* One launcher per (dtype, head dim), defined in the kernel TUs: launches
 * row `config` of tiles.cuh (of that head dim) with `grid` persistent CTAs
 * on stream, having set its dynamic shared-memory attribute (once per
 * device), and checks the launch error. */
#define FC_SM90_DECLARE_LAUNCHERS(dim)                                                                 \
    fc_status fc_sm90_launch_bf16_d##dim(int config, const fc_sm90_params *prm, int grid, int device,   \
                                         cudaStream_t stream, char *err, size_t err_len);               \
    fc_status fc_sm90_launch_f16_d##dim(int config, const fc_sm90_params *prm, int grid, int device,    \
                                        cudaStream_t stream, char *err, size_t err_len);
FC_SM90_HEAD_DIMS(FC_SM90_DECLARE_LAUNCHERS)

/* Build switches for bisecting and profiling, never shipped: SIMPLE turns
 * pingpong and overlap off (kernel and planner), TRACE stamps phases. */
#ifndef FC_SM90_SIMPLE
#define FC_SM90_SIMPLE 0
#endif
#ifndef FC_SM90_TRACE
#define FC_SM90_TRACE 0
#endif

/* Trace builds (-DFC_SM90_TRACE=1, never shipped): the kernel stamps the SM
 * clock (clock64) at phase boundaries into trace[cta][role][tile][event],
 * role 0 = the producer thread, 1.. = consumer warpgroups (their thread 0;
 * up to 4, tiles.cuh), tile = the CTA's k-th tile; plan.cu writes the last
 * call's buffer to tuning.sm90_trace_file; bench/trace_sm90.py reads it. */
#define FC_SM90_TRACE_ROLES 5
#define FC_SM90_TRACE_TILES 64
#define FC_SM90_TRACE_EVENTS 8

#endif /* FC_SM90_H */
