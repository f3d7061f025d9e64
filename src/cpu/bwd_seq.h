/*
 * bwd_seq.h -- one sequence's view of the backward's tensors, shared by the
 * CPU backward paths (reference_bwd.c, tiled_bwd.c): its lengths and the
 * element offset of its first token in each tensor.
 */
#ifndef FC_CPU_BWD_SEQ_H
#define FC_CPU_BWD_SEQ_H

#include "internal.h"

typedef struct fc_bwd_seq {
    int64_t sq, sk;
    int64_t q, k, v, o, lse, dout, dq, dk, dv;
} fc_bwd_seq;

/* Sequence b of p. Dense: sequence b is batch b. Varlen: a run of tokens
 * from cu_seqlens; validate.c sets the batch strides to 0 there, so
 * b*batch_stride + first_token*row_stride is the offset in both cases. */
static inline void fc_bwd_seq_of(const fc_bwd_params *p, int b, fc_bwd_seq *s)
{
    const fc_fwd_params *f = &p->f;
    int64_t tq = 0, tk = 0;
    s->sq = f->seqlen_q;
    s->sk = f->seqlen_k;
    if (f->cu_seqlens_q) {
        tq = f->cu_seqlens_q[b];
        tk = f->cu_seqlens_k[b];
        s->sq = f->cu_seqlens_q[b + 1] - tq;
        s->sk = f->cu_seqlens_k[b + 1] - tk;
    }
    s->q = b * f->q_batch_stride + tq * f->q_row_stride;
    s->o = b * f->o_batch_stride + tq * f->o_row_stride;
    s->lse = b * f->lse_batch_stride + tq * f->lse_row_stride;
    s->dout = b * p->do_batch_stride + tq * p->do_row_stride;
    s->dq = b * p->dq_batch_stride + tq * p->dq_row_stride;
    s->k = b * f->k_batch_stride + tk * f->k_row_stride;
    s->v = b * f->v_batch_stride + tk * f->v_row_stride;
    s->dk = b * p->dk_batch_stride + tk * p->dk_row_stride;
    s->dv = b * p->dv_batch_stride + tk * p->dv_row_stride;
}

#endif /* FC_CPU_BWD_SEQ_H */
