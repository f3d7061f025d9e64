/*
 * cp.h -- what the ring's forward (cp.c) and backward (cp_bwd.c) share
 * (cp_common.c): views of a rank's slice and of packed scratch, the checks
 * of the ring's own rules, the K/V packing.
 */
#ifndef FC_CP_H
#define FC_CP_H

#include <stddef.h>
#include <stdint.h>

#include "flashcore.h"

/* A rank's slice: batch, heads, head_dim, the bytes of an element of q,
 * k, v and out; its rows (seqlen_q == seqlen_k) and the longest slice's
 * of any rank (fc_cp_admit's handshake), which sizes what travels. */
typedef struct fc_cp_dims {
    int64_t b, hq, hkv, d;
    size_t es;
    int64_t rows, max_rows;
    /* varlen (nseq > 0): the slice packs nseq sequences' slices, cu its
     * offsets (the caller's cu_seqlens); b is 1 and the ring's own buffers
     * hold the rows chunk-major (fc_cp_split) */
    int32_t nseq;
    const int32_t *cu;
} fc_cp_dims;
fc_cp_dims fc_cp_dims_of(const fc_attention_args *a);
/* Chunk w (0, 1) of a slice of `rows` rows: the first ceil(rows / 2) rows,
 * the second the rest (so the sequence's 2 * size chunks may differ in
 * length: base + 1 rows for the first total % (2 * size), base after). */
static inline int64_t fc_cp_chunk_rows(int64_t rows, int w) { return w ? rows / 2 : rows - rows / 2; }
static inline int64_t fc_cp_chunk_row0(int64_t rows, int w) { return w ? rows - rows / 2 : 0; }
/* The elements of a slice's k (or v) for `rows` rows; the bytes of a
 * packed K/V slice of the longest length (fc_cp_pack: a header with its
 * rows, then k and v in q's dtype), which is what every exchange moves. */
static inline size_t fc_cp_k_elems(const fc_cp_dims *n, int64_t rows) { return (size_t)(n->b * rows * n->hkv * n->d); }
static inline size_t fc_cp_k_bytes(const fc_cp_dims *n, int64_t rows) { return fc_cp_k_elems(n, rows) * n->es; }
enum { FC_CP_HEADER = 64 };
static inline size_t fc_cp_up64(size_t n) { return (n + 63) & ~(size_t)63; }
/* A packet's header: its rows; varlen, then its sequences' lengths (int32). */
static inline size_t fc_cp_header_bytes(const fc_cp_dims *n)
{
    return FC_CP_HEADER + fc_cp_up64((size_t)n->nseq * sizeof(int32_t));
}
static inline size_t fc_cp_packet_bytes(const fc_cp_dims *n)
{
    return fc_cp_header_bytes(n) + 2 * fc_cp_k_bytes(n, n->max_rows);
}

/* Where a slice's chunks lie in the ring's buffers: chunk w is rows
 * [row0[w], row0[w] + rows[w]) of each batch row (dense), or, varlen, of
 * the chunk-major rows (every sequence's chunk 0, then every chunk 1: a
 * chunk is one packed varlen batch, cu[w] its nseq + 1 offsets, max[w]
 * its longest sequence; NULL and 0 dense). */
typedef struct fc_cp_split {
    int64_t row0[2], rows[2];
    const int32_t *cu[2];
    int32_t max[2];
} fc_cp_split;
/* int32 of store a split needs (its two chunks' offsets and the lengths). */
static inline size_t fc_cp_split_ints(const fc_cp_dims *n) { return 3 * ((size_t)n->nseq + 1); }
/* The split of this rank's own slice, and of a packet's (fc_cp_pack);
 * varlen, its cu in store (fc_cp_split_ints). */
void fc_cp_own_split(const fc_cp_dims *n, int32_t *store, fc_cp_split *s);
void fc_cp_packet_split(const fc_cp_dims *n, const char *kv, int32_t *store, fc_cp_split *s);
/* A pair call's varlen fields from the ring's [1][rows][h][d] views: the
 * query chunk qi of qs, the key chunk kj of ks (no-op for dense). */
void fc_cp_varlen_pair(const fc_cp_split *qs, int qi, const fc_cp_split *ks, int kj, fc_attention_args *sub);
/* A [1][rows][h][d] view as varlen's [rows][h][d] (lse: [1][h][s] as [h][s]). */
void fc_cp_drop_batch(fc_tensor *t);
/* Varlen: rows of the caller's tensor t ([total][h][d], or lse [h][total])
 * to or from the chunk-major contiguous buf ([rows][h][d] or [h][rows],
 * dtype t->dtype; fc_cp_pack's order for k and v); gather: t into buf,
 * else buf into t. */
void fc_cp_regroup(const fc_cp_dims *n, const fc_tensor *t, void *buf, int lse, int gather);
/* Varlen: *dst, the chunk-major copy of the caller's src (as [1][rows][h][d],
 * lse [1][h][rows]) placed at g; returns its bytes (64-aligned; 0 for a
 * NULL src, whose *dst stays as it is). g NULL: the bytes only. */
size_t fc_cp_chunk_major(const fc_cp_dims *n, const fc_tensor *src, int lse, char *g, fc_tensor *dst);

/* A contiguous [n0][n1][n2][n3] tensor, and a contiguous lse [b][h][s]. */
fc_tensor fc_cp_tensor4(void *data, fc_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3);
fc_tensor fc_cp_lse3(float *data, int64_t b, int64_t h, int64_t s);
/* Rows [r0, r0 + n) of a [b][s][h][d] tensor (lse: [b][h][s]) as a view;
 * a NULL tensor stays NULL. */
fc_tensor fc_cp_rows(const fc_tensor *t, int64_t r0, int64_t n, size_t es, int lse);
/* Global chunk of slot w (0, 1) of rank's zigzag slice among 2 * size. */
int fc_cp_chunk(const fc_cp_comm *c, int rank, int w);
/* The rows of the packed K/V slice kv (fc_cp_pack), and the k and v of
 * its chunk kj (0, 1) by its split ks, q's dtype dt. */
int64_t fc_cp_packed_rows(const char *kv);
void fc_cp_kv_chunk(const fc_cp_dims *n, const char *kv, const fc_cp_split *ks, int kj, fc_dtype dt, fc_tensor *k,
                    fc_tensor *v);
/* Every check of an entry point (f: the forward's args, or the backward's
 * fwd; b: the backward's args, NULL for the forward; what: the entry's
 * name, for the messages): the comm (refused at once: the handshake needs
 * it), what the ring does not take, the slice as one plain call of the
 * entry (fc_attention_supported or fc_attention_backward_supported),
 * seqlen_q == seqlen_k, host memory; then the handshake, size - 1
 * exchanges of a small message round the ring (the lowest refusing rank,
 * the range of a digest of all but the slice's rows, the longest slice).
 * On FC_OK *n is the slice's dims. This rank's refusal comes back with its
 * own message; another's, or differing digests, as
 * FC_ERR_INVALID_ARGUMENT. */
fc_status fc_cp_admit(fc_context *ctx, const fc_cp_comm *c, const fc_attention_args *f,
                      const fc_attention_backward_args *b, const char *what, fc_cp_dims *n);
/* a's slice packed into kv: the header (its rows), then k and v, strided,
 * as [b][rows][hkv][d] each. */
void fc_cp_pack(const fc_attention_args *a, const fc_cp_dims *n, char *kv);
/* FC_OK, or the failure a test injected at ring step s (ctx->cp_fail_step). */
fc_status fc_cp_injected(fc_context *ctx, int s);
/* The mark in the header of the travelling dK/dV sums: the status of the
 * first rank whose pairs are missing from them (FC_OK: none), and which. */
typedef struct fc_cp_mark {
    int32_t status, rank;
} fc_cp_mark;

#endif /* FC_CP_H */
