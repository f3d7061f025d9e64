/*
 * smem_optin.cuh -- the dynamic shared-memory opt-in that a kernel needs
 * above 48 KB, done once per (kernel, device) instead of on every call:
 * cudaFuncSetAttribute is host time on the critical path of each launch.
 */
#ifndef FC_SMEM_OPTIN_CUH
#define FC_SMEM_OPTIN_CUH

#include <atomic>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"

/* `done` is the caller's per-kernel flag word (a function-local static next
 * to the kernel): bit d set = device d has opted in. Devices >= 64 opt in on
 * every call. Two threads racing only repeat the idempotent call. */
/* max_carveout: also ask for the largest shared-memory carveout (a kernel
 * sized for 2 CTAs per SM needs more than one CTA's share of the unified
 * L1/shared memory; the driver takes the carveout as a hint). */
template <class Kernel>
static fc_status fc_smem_opt_in(Kernel kernel, int smem, int device, std::atomic<unsigned long long> &done,
                                char *err, size_t err_len, bool max_carveout = false)
{
    if (smem <= 48 * 1024 && !max_carveout) return FC_OK;
    const unsigned long long bit = (device >= 0 && device < 64) ? (1ull << device) : 0;
    if (bit && (done.load(std::memory_order_acquire) & bit)) return FC_OK;
    if (smem > 48 * 1024)
        FC_CUDA_TRY("cudaFuncSetAttribute",
                    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if (max_carveout)
        FC_CUDA_TRY("cudaFuncSetAttribute(carveout)",
                    cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         (int)cudaSharedmemCarveoutMaxShared));
    done.fetch_or(bit, std::memory_order_release);
    return FC_OK;
}

#endif /* FC_SMEM_OPTIN_CUH */
