/*
 * bwd_args.h -- what the sm80 backward's planner/launcher (bwd_plan.cu)
 * hands to the per-(dtype, head_dim) translation units (bwd_<dtype>_d<hd>.cu),
 * the workspace carve-up both use, and the extern "C" launcher each unit
 * defines.
 *
 * fc_sm80_bwd_args is plain data passed by value as the parameter of all
 * three kernels (preprocess, main, convert): the checked fc_bwd_params plus
 * what the host derives once.
 */
#ifndef FC_SM80_BWD_ARGS_H
#define FC_SM80_BWD_ARGS_H

#include "cuda/common/fastdiv.h"
#include "cuda/sm80/bwd_ranges.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Workspace rows: one per query token (dense: batch * seqlen_q; varlen:
 * total_q). Regions, each 256-byte aligned, in this order:
 *   dq_accum  [rows][heads_q][head_dim] fp32: dQ / scale, summed by atomics;
 *             or, with dq_chunk > 0 (the Hopper path), [heads_q][dq_rows]
 *             [head_dim] in chunks of dq_chunk rows, each sequence's first
 *             row at a multiple of dq_chunk (sm90/bwd_dq.cuh has the order
 *             inside a chunk)
 *   dsum      [heads_q][rows] fp32: D = rowsum(dO * O)
 *   lse2      [heads_q][rows] fp32: lse * log2(e); -inf (no visible key) -> +inf
 *   sems      [batch][heads_q][m_blocks] int32 (deterministic only): how many
 *             key blocks have added into each query block's dQ so far */
typedef struct fc_sm80_bwd_ws {
    int64_t rows;
    int64_t dq_rows;                              /* dq_accum's rows          */
    int64_t k_rows;                               /* dkv_accum's rows         */
    int64_t dq_off, dkv_off, dsum_off, lse2_off, sems_off; /* byte offsets   */
    int64_t dkv_bytes;                            /* 0: no group split        */
    int64_t n_sems;
    int64_t bytes;                                /* the total                */
} fc_sm80_bwd_ws;

/* The layout for p with query blocks of block_m rows, dq_accum chunked
 * by dq_chunk rows (0: not) and the GQA group split over group_splits
 * CTAs per key block (1: not): the one place the workspace size is
 * computed (planners and launchers of both paths). */
fc_sm80_bwd_ws fc_sm80_bwd_workspace(const fc_bwd_params *p, int block_m, int dq_chunk, int group_splits);

typedef struct fc_sm80_bwd_args {
    fc_bwd_params p;
    float *dq_accum, *dsum, *lse2; /* the workspace regions above           */
    int32_t *sems;                 /* NULL unless deterministic              */
    int64_t rows;                  /* workspace rows                         */
    int64_t dq_rows;               /* dq_accum's rows (fc_sm80_bwd_ws)       */
    int32_t dq_chunk;              /* its chunk rows, 0: the row layout       */
    float *dkv_accum;              /* NULL unless the group is split          */
    int64_t k_rows;                /* dkv_accum's rows (fc_sm80_bwd_ws)       */
    int64_t zero_f4;               /* float4s the preprocess zeroes from
                                    * dq_accum on: it and dkv_accum          */
    int64_t n_sems;
    /* exp2 argument of P: s * sl2 - lse2, with s the raw q.k (sl2 =
     * scale*log2 e) or, softcap on, tanh(q.k * softcap_in) (sl2 =
     * softcap*log2 e); as the forward (fc_sm80_args). */
    float sl2;
    float softcap_in;
    float scale;      /* dQ and dK = scale * (dS_raw K), (dS_raw^T Q)      */
    int32_t m_blocks; /* query blocks of the longest sequence             */
    int32_t group;    /* heads_q / heads_kv                                */
    /* Small GQA grids (fc_bwd_group_splits): a key block's CTAs, 1 <<
     * split_shift of them, each walk group_run = group >> split_shift
     * query heads; unsplit: 0 and group. */
    int32_t split_shift, group_run;
    fc_bwd_order order;  /* the grid's order (bwd_ranges.h)              */
    /* 1: CTAs walk their query blocks downward (fc_bwd_next_block):
     * deterministic, or causal-like */
    int32_t down;
    fc_fastdiv heads_kv; /* a pair's batch and KV head (common/fastdiv.h) */
    int32_t pdl;      /* host only: programmatic dependent launches         */
} fc_sm80_bwd_args;

/* CTAs per key block (both paths): on a grid of ctas CTAs that leaves
 * some of `slots` (SMs x CTAs per SM) idle, the GQA group dealt out in
 * powers of two while the grid still fits (a small decoder's step, B4 S512
 * Hq8/Hkv2 d64: 32 CTAs of 4 heads' work on 132 SMs become 128). The
 * split CTAs sum dK and dV by atomics: never in the deterministic mode. */
int fc_bwd_group_splits(const fc_bwd_params *b, int64_t ctas, int64_t slots);

/* The checks every CUDA backward shares (sm80/bwd_plan.cu): f16/bf16 and
 * fc_sm80_common_checks with out, dout, dq, dk, dv moved in 16-byte chunks
 * (the preprocess and convert kernels both paths run); *cls (unless
 * NULL) the device's sm80 architecture class. FC_OK or FC_ERR_UNSUPPORTED and why. */
fc_status fc_sm80_bwd_common(const fc_bwd_params *b, const fc_cuda_device *dev, int *cls, char *why,
                             size_t why_len);

/* Fill the argument block for b with query blocks of block_m rows, key
 * blocks of block_n, dq_accum chunked by dq_chunk rows and the group split
 * over group_splits CTAs (a power of two dividing the group; the
 * workspace carved as fc_sm80_bwd_workspace says). */
void fc_sm80_bwd_fill_args(const fc_bwd_params *b, int block_m, int block_n, int dq_chunk, int group_splits,
                           void *workspace, int pdl, fc_sm80_bwd_args *a);

/* One launcher per (dtype, head_dim) translation unit: preprocess, main
 * and convert kernels of backward row `config` on `stream`. Checks every
 * CUDA return code and the last error after each launch. */
#define FC_SM80_DECLARE_BWD_LAUNCHER(dt, hd)                                                          \
    fc_status fc_sm80_bwd_launch_##dt##_d##hd(const fc_sm80_bwd_args *a, int config, int device, void *stream, \
                                              char *err, size_t err_len);
FC_SM80_DECLARE_BWD_LAUNCHER(f16, 32)
FC_SM80_DECLARE_BWD_LAUNCHER(f16, 64)
FC_SM80_DECLARE_BWD_LAUNCHER(f16, 96)
FC_SM80_DECLARE_BWD_LAUNCHER(f16, 128)
FC_SM80_DECLARE_BWD_LAUNCHER(f16, 256)
FC_SM80_DECLARE_BWD_LAUNCHER(bf16, 32)
FC_SM80_DECLARE_BWD_LAUNCHER(bf16, 64)
FC_SM80_DECLARE_BWD_LAUNCHER(bf16, 96)
FC_SM80_DECLARE_BWD_LAUNCHER(bf16, 128)
FC_SM80_DECLARE_BWD_LAUNCHER(bf16, 256)
#undef FC_SM80_DECLARE_BWD_LAUNCHER

#ifdef __cplusplus
}
#endif
#endif /* FC_SM80_BWD_ARGS_H */
