/*
 * cuda_check.h -- turning a CUDA runtime return code into an fc_status plus
 * a message. Plain C (used by runtime.c and by the .cu launchers alike).
 *
 * Every CUDA call in src/cuda/ goes through fc_cuda_check(): failures become
 * FC_ERR_CUDA with "cudaXxx failed: <cudaGetErrorString>", except allocation
 * failures, which are FC_ERR_OUT_OF_MEMORY.
 */
#ifndef FC_CUDA_CHECK_H
#define FC_CUDA_CHECK_H

#include <stdio.h>

#include <cuda_runtime_api.h>

#include "internal.h"

static inline fc_status fc_cuda_check(cudaError_t e, const char *what, char *err, size_t err_len)
{
    if (e == cudaSuccess) return FC_OK;
    if (err && err_len) snprintf(err, err_len, "%s failed: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? FC_ERR_OUT_OF_MEMORY : FC_ERR_CUDA;
}

/* Evaluate a CUDA call named `name` ("cudaMemcpyAsync"); on failure return
 * its fc_status from the enclosing function (which must have `err` and
 * `err_len` in scope). */
#define FC_CUDA_TRY(name, call)                                                \
    do {                                                                       \
        fc_status fc_try_st_ = fc_cuda_check((call), name, err, err_len);      \
        if (fc_try_st_ != FC_OK) return fc_try_st_;                           \
    } while (0)

#endif /* FC_CUDA_CHECK_H */
