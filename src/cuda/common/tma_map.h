/*
 * tma_map.h -- host side of TMA (src/cuda/tma.cu), shared by the Hopper path
 * and the sm80-class path's kVarTma rows. C++ (CUDA host code) only.
 */
#ifndef FC_TMA_MAP_H
#define FC_TMA_MAP_H

#include <cuda.h> /* CUtensorMap (type only: the encoder is fetched at run time) */
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* Encode a rank-1..5 tiled tensor map of 16-bit elements (swizzle 64 or 128
 * bytes). dims/box innermost first (rank entries); strides in bytes for dims
 * 1..rank-1. Fails with FC_ERR_UNSUPPORTED (layout TMA cannot express) or
 * FC_ERR_CUDA (driver entry point missing, encode error) and a message
 * naming `what`. Each thread caches its last few maps. */
fc_status fc_tma_encode_map(CUtensorMap *map, const char *what, const void *base, int bf16, int rank,
                            const uint64_t *dims, const uint64_t *strides_bytes, const uint32_t *box,
                            int swizzle_bytes, char *err, size_t err_len);

/* A 16-bit tensor view TMA can load: 16-byte aligned base; every stride of a
 * dimension with more than one index (size[i] > 1; dims row, head, batch) a
 * positive multiple of 8 elements (16 bytes) below 2^40 bytes. Size-1
 * dimensions never step, so their stride does not matter. Else false, and
 * why says which, followed by `who` (what that means for the caller). */
bool fc_tma_layout_ok(const char *name, const void *ptr, const int64_t stride[3], const int64_t size[3],
                      const char *who, char *why, size_t why_len);

/* The key rows and the outer extent of K/V as a tensor map sees them:
 * varlen tensors are the packed total with no batch dimension, a paged
 * cache is num_pages pages of page_size rows. */
static inline int64_t fc_tma_k_rows(const fc_fwd_params *p)
{
    return p->cu_seqlens_k ? p->total_k : p->block_table ? p->page_size : p->seqlen_k;
}
static inline int64_t fc_tma_kv_batches(const fc_fwd_params *p)
{
    return p->cu_seqlens_k ? 1 : p->block_table ? p->num_pages : p->batch;
}
/* The outer extent of Q-shaped tensors (q, out, dout): varlen none. */
static inline int64_t fc_tma_q_batches(const fc_fwd_params *p) { return p->cu_seqlens_q ? 1 : p->batch; }

/* The query rows as a tensor map sees them (varlen: the packed total). */
static inline int64_t fc_tma_q_rows(const fc_fwd_params *p) { return p->cu_seqlens_q ? p->total_q : p->seqlen_q; }

/* TMA can load a tensor shaped like p's q (q itself, the backward's dout):
 * query rows that int32 coordinates reach (row + block < 2^31) and a layout
 * fc_tma_layout_ok accepts with extents {rows, heads_q, batches}. Else
 * false with why (then `who`). */
bool fc_tma_q_ok(const fc_fwd_params *p, const char *name, const void *ptr, const int64_t stride[3], const char *who,
                 char *why, size_t why_len);

/* TMA can load p's K and V: key rows that int32 TMA coordinates reach
 * (row + block_n < 2^31) and K/V layouts fc_tma_layout_ok accepts (no key
 * rows: nothing is loaded, true). Else false with why (then `who`). */
bool fc_tma_kv_ok(const fc_fwd_params *p, const char *who, char *why, size_t why_len);

/* Strides in bytes for the n outer dims of a tensor map; a size-1 dimension
 * gets a harmless 16-byte-multiple stand-in (the caller's value may be
 * anything, it is never stepped). */
void fc_tma_map_strides(const int64_t *stride, const int64_t *size, int n, int head_dim, uint64_t *out);

/* A rank-4 map {head_dim, rows, heads, batches} (strides in elements for
 * rows, heads, batches; fc_tma_map_strides) with boxes of swizzle / 2
 * columns x box_rows rows: K, V and the backward's Q, dO tiles. */
fc_status fc_tma_encode_rows(CUtensorMap *map, const char *what, const void *base, int bf16, const int64_t stride[3],
                             int64_t rows, int64_t heads, int64_t batches, int head_dim, int box_rows, int swizzle,
                             char *err, size_t err_len);

#endif /* FC_TMA_MAP_H */
