/*
 * smem_optin.cuh -- the dynamic shared-memory opt-in that a kernel needs
 * above 48 KB, done once per (kernel, device) instead of on every call:
 * cudaFuncSetAttribute is host time on the critical path of each launch.
 */
#ifndef FC_SMEM_OPTIN_CUH
#define FC_SMEM_OPTIN_CUH

#include <atomic>
#include <stdio.h>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"

/* `done` is the caller's per-kernel flag word (a function-local static next
 * to the kernel): bit d set = device d has opted in. Devices >= 64 opt in on
 * every call. Two threads racing only repeat the idempotent call. */
/* max_carveout: also ask for the largest shared-memory carveout (a kernel
 * sized for 2 CTAs per SM needs more than one CTA's share of the unified
 * L1/shared memory; the driver takes the carveout as a hint). An error names
 * the kernel (`what`, and `config` when >= 0) and the bytes asked for; the
 * message is only formatted then, off the per-call path. */
template <class Kernel>
static fc_status fc_smem_opt_in(Kernel kernel, int smem, int device, std::atomic<unsigned long long> &done,
                                const char *what, int config, char *err, size_t err_len, bool max_carveout = false)
{
    if (smem <= 48 * 1024 && !max_carveout) return FC_OK;
    const unsigned long long bit = (device >= 0 && device < 64) ? (1ull << device) : 0;
    if (bit && (done.load(std::memory_order_acquire) & bit)) return FC_OK;
    cudaError_t e = cudaSuccess;
    if (smem > 48 * 1024) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess && max_carveout)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 (int)cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) {
        char name[160], cfg[24] = "";
        if (config >= 0) snprintf(cfg, sizeof cfg, " (config %d)", config);
        snprintf(name, sizeof name, "%s%s: cudaFuncSetAttribute(%d bytes of dynamic shared memory%s)", what, cfg,
                 smem, max_carveout ? ", max shared carveout" : "");
        return fc_cuda_check(e, name, err, err_len);
    }
    done.fetch_or(bit, std::memory_order_release);
    return FC_OK;
}

#endif /* FC_SMEM_OPTIN_CUH */
