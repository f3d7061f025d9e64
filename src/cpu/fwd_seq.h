/*
 * fwd_seq.h -- one sequence's view of the forward's tensors, shared by the
 * CPU forward paths (reference.c, tiled.c): its lengths, the element
 * offsets of its first token in q, o and lse (dense: batch stride;
 * varlen: token offset times row stride), and the varlen base of its keys
 * in k and v (fc_key_offset adds the rest, pages included).
 */
#ifndef FC_CPU_FWD_SEQ_H
#define FC_CPU_FWD_SEQ_H

#include "internal.h"

typedef struct seq_view {
    int64_t b;
    int64_t sq, sk;
    int64_t q, k, v, o, lse;
} seq_view;

static inline void seq_view_of(const fc_fwd_params *p, int b, seq_view *sv)
{
    sv->b = b;
    if (p->cu_seqlens_q) {
        int64_t tq = p->cu_seqlens_q[b], tk = p->cu_seqlens_k[b];
        sv->sq = p->cu_seqlens_q[b + 1] - tq;
        sv->q = tq * p->q_row_stride;
        sv->o = tq * p->o_row_stride;
        sv->lse = tq * p->lse_row_stride;
        sv->k = tk * p->k_row_stride;
        sv->v = tk * p->v_row_stride;
    } else {
        sv->sq = p->seqlen_q;
        sv->q = (int64_t)b * p->q_batch_stride;
        sv->o = (int64_t)b * p->o_batch_stride;
        sv->lse = (int64_t)b * p->lse_batch_stride;
        sv->k = sv->v = 0;
    }
    sv->sk = fc_used_keys(p, b);
}

#endif /* FC_CPU_FWD_SEQ_H */
