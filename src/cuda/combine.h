/*
 * combine.h -- the split-KV combine step (combine.cu), shared by both CUDA
 * paths: merges the per-split fp32 partial outputs in p->o_accum /
 * p->lse_accum into out (and lse).
 */
#ifndef FC_CUDA_COMBINE_H
#define FC_CUDA_COMBINE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* p->num_splits > 1 and p->o_accum / p->lse_accum filled by a forward kernel
 * launched earlier on the same stream. pdl: launch as a programmatic
 * dependent of that kernel (common/pdl.cuh). Checks the launch error. */
fc_status fc_cuda_combine_splits(const fc_fwd_params *p, int pdl, void *stream, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* FC_CUDA_COMBINE_H */
