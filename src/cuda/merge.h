/*
 * merge.h -- fc_attention_merge on device memory (merge.cu): the CUDA twin
 * of fc_cpu_merge (src/cpu/merge.c), called by src/merge.c after every
 * check has passed.
 */
#ifndef FC_CUDA_MERGE_H
#define FC_CUDA_MERGE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Merge m's parts into m->out (and m->lse) on dev, queued on stream. m is
 * the checked call (its part arrays in host memory, the tensors' data in
 * device memory); nothing of it is kept after the return. pdl: launch as
 * programmatic dependents of the previous kernel (common/pdl.cuh). Checks
 * every CUDA return code; on failure err says what failed. */
fc_status fc_cuda_merge(const fc_merge_params *m, const fc_cuda_device *dev, int pdl, void *stream, char *err,
                        size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* FC_CUDA_MERGE_H */
