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
 * and the bytes of an element of q, k, v and out. */
typedef struct fc_cp_dims {
    int64_t b, c, hq, hkv, d;
    size_t es;
} fc_cp_dims;
fc_cp_dims fc_cp_dims_of(const fc_attention_args *a);

/* A contiguous [n0][n1][n2][n3] tensor, and a contiguous lse [b][h][s]. */
fc_tensor fc_cp_tensor4(void *data, fc_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3);
fc_tensor fc_cp_lse3(float *data, int64_t b, int64_t h, int64_t s);
/* Rows [r0, r0 + n) of a [b][s][h][d] tensor (lse: [b][h][s]) as a view;
 * a NULL tensor stays NULL. */
fc_tensor fc_cp_rows(const fc_tensor *t, int64_t r0, int64_t n, size_t es, int lse);
/* Global chunk of slot w (0, 1) of rank's zigzag slice among 2 * size. */
int fc_cp_chunk(const fc_cp_comm *c, int rank, int w);
/* args and the comm's fields, which the handshake needs (what: the entry
 * point's name, for the messages). */
fc_status fc_cp_comm_ok(fc_context *ctx, const void *args, const fc_cp_comm *c, const char *what);
/* What the ring does not take. */
fc_status fc_cp_checks(fc_context *ctx, const fc_attention_args *a, const char *what);
/* A digest of what every rank must pass alike (pass: 1 forward, 2
 * backward). */
uint64_t fc_cp_digest(const fc_attention_args *a, int pass);
/* Before any work, every rank learns of every other's checks: size - 1
 * exchanges of a small message around the ring (the lowest refusing
 * rank, the digests' range). local: this rank's verdict, returned as it
 * is when not FC_OK (its message kept); else FC_ERR_INVALID_ARGUMENT
 * where another rank refused or the digests differ. */
fc_status fc_cp_agree(fc_context *ctx, const fc_cp_comm *c, fc_status local, uint64_t digest, const char *what);
/* After the entry's own supported check: the slice's two chunks of one
 * length, and every pointer (n of them) in host memory. */
fc_status fc_cp_slice(fc_context *ctx, const fc_attention_args *a, const void *const *ptrs, int n,
                      const char *what);
/* a's k, then v, strided, packed into kv as [b][s2][hkv][d] each. */
void fc_cp_pack(const fc_attention_args *a, int64_t b, int64_t s2, int64_t hkv, int64_t d, size_t es, char *kv);
static inline size_t fc_cp_up64(size_t n) { return (n + 63) & ~(size_t)63; }

#endif /* FC_CP_H */
