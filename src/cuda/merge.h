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

/* Merge m's parts into m->out (and m->lse) on dev, queued on stream:
 * launch.cu's entry (dev made current, the part table from the scratch
 * pool and freed in stream order). m is the checked call (its part arrays
 * in host memory, the tensors' data in device memory); nothing of it is
 * kept after the return. pdl: launch as programmatic dependents of the
 * previous kernel (common/pdl.cuh). Checks every CUDA return code; on
 * failure err says what failed. */
fc_status fc_cuda_merge(const fc_merge_params *m, const fc_cuda_device *dev, int pdl, void *stream, char *err,
                        size_t err_len);

/* merge.cu, for that entry: the bytes of device memory the call's part
 * table needs (0: its parts travel in the kernel's parameters, or it has
 * no row), and the launches on the current device with that table (NULL
 * when 0 bytes). */
int64_t fc_cuda_merge_table_bytes(const fc_merge_params *m);
fc_status fc_cuda_merge_launch(const fc_merge_params *m, void *table, const fc_cuda_device *dev, int pdl,
                               void *stream, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* FC_CUDA_MERGE_H */
