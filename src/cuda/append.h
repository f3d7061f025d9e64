/*
 * append.h -- the append step of a CUDA forward call (append.cu): k_new /
 * v_new (rotated) into the cache and q rotated, ahead of the attention.
 */
#ifndef FC_CUDA_APPEND_H
#define FC_CUDA_APPEND_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scratch the step needs (p->app.k_new set): the rotated q (when rotary)
 * and the attention's key counts. */
int64_t fc_cuda_append_scratch_bytes(const fc_fwd_params *p);

/* Launch the step on stream (as a programmatic dependent when pdl) with
 * scratch of fc_cuda_append_scratch_bytes(p); *lp = p as the attention
 * takes it (rotated q, seqused_k + seqlen_new, app cleared). Checks the
 * launch error. */
fc_status fc_cuda_append(const fc_fwd_params *p, void *scratch, int pdl, void *stream, fc_fwd_params *lp, char *err,
                         size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* FC_CUDA_APPEND_H */
