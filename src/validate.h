/*
 * validate.h -- the argument checks (validate.c): an fc_attention_args (or
 * fc_attention_backward_args) in, a trusted fc_fwd_params (fc_bwd_params)
 * out, or an error naming the argument and limit.
 */
#ifndef FC_VALIDATE_H
#define FC_VALIDATE_H

#include "api_internal.h"

/* Check args completely and translate them into params. *nothing_to_do is
 * set when the problem is empty (varlen with no query tokens). */
fc_status fc_build_params(fc_context *ctx, const fc_attention_args *args, fc_fwd_params *p,
                          int *nothing_to_do);
/* The same for the backward: b->fwd as above, then dout, dq, dk, dv, the
 * workspace, and every output against every input. *nothing_to_do: no
 * query row and no key token. */
fc_status fc_build_bwd_params(fc_context *ctx, const fc_attention_backward_args *b, fc_bwd_params *p,
                              int *nothing_to_do);
/* Check host-readable copies of cu_seqlens against p. */
fc_status fc_check_varlen(fc_context *ctx, const fc_fwd_params *p, const int32_t *cu_q,
                          const int32_t *cu_k);

/* Check host-readable copies of seqused_k and the block table against p
 * (NULL where p has none): counts in [0, seqlen_k], used pages in range. */
fc_status fc_check_paged(fc_context *ctx, const fc_fwd_params *p, const int32_t *used, const int32_t *table);

#endif /* FC_VALIDATE_H */
