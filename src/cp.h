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

/* A rank's slice: batch, chunk rows (half the slice), heads, head_dim,
 * the bytes of an element of q, k, v and out, and the elements of its k
 * (and of its v). */
typedef struct fc_cp_dims {
    int64_t b, c, hq, hkv, d;
    size_t es, kv;
} fc_cp_dims;
fc_cp_dims fc_cp_dims_of(const fc_attention_args *a);
/* The packed K/V slice's bytes: k then v, q's dtype. */
static inline size_t fc_cp_kv_bytes(const fc_cp_dims *n) { return 2 * n->kv * n->es; }

/* A contiguous [n0][n1][n2][n3] tensor, and a contiguous lse [b][h][s]. */
fc_tensor fc_cp_tensor4(void *data, fc_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3);
fc_tensor fc_cp_lse3(float *data, int64_t b, int64_t h, int64_t s);
/* Rows [r0, r0 + n) of a [b][s][h][d] tensor (lse: [b][h][s]) as a view;
 * a NULL tensor stays NULL. */
fc_tensor fc_cp_rows(const fc_tensor *t, int64_t r0, int64_t n, size_t es, int lse);
/* Global chunk of slot w (0, 1) of rank's zigzag slice among 2 * size. */
int fc_cp_chunk(const fc_cp_comm *c, int rank, int w);
/* k and v of chunk kj (0, 1) of a packed K/V slice (fc_cp_pack), q's dtype dt. */
void fc_cp_kv_chunk(const fc_cp_dims *n, const char *kv, int kj, fc_dtype dt, fc_tensor *k, fc_tensor *v);
/* Every check of an entry point (f: the forward's args, or the backward's
 * fwd; b: the backward's args, NULL for the forward; what: the entry's
 * name, for the messages): the comm (refused at once: the handshake needs
 * it), what the ring does not take, the slice as one plain call of the
 * entry (fc_attention_supported or fc_attention_backward_supported), its
 * two chunks of one length, host memory; then the handshake, size - 1
 * exchanges of a small message round the ring (the lowest refusing rank,
 * the range of a digest of shapes, dtypes and options). This rank's
 * refusal comes back with its own message; another's, or differing
 * digests, as FC_ERR_INVALID_ARGUMENT. */
fc_status fc_cp_admit(fc_context *ctx, const fc_cp_comm *c, const fc_attention_args *f,
                      const fc_attention_backward_args *b, const char *what);
/* a's k, then v, strided, packed into kv as [b][2c][hkv][d] each. */
void fc_cp_pack(const fc_attention_args *a, const fc_cp_dims *n, char *kv);
static inline size_t fc_cp_up64(size_t n) { return (n + 63) & ~(size_t)63; }

#endif /* FC_CP_H */
