/*
 * device.c -- where a fuzzed call's memory lives. The CPU build keeps it on
 * the host. The CUDA fuzz build (FZ_CUDA) puts the call's arena in managed
 * memory, so the CUDA backend takes its pointers while the harness still
 * reads and writes every byte, and synchronizes after each call: a kernel's
 * fault, or an error a call leaves behind, is a failure with the reproducer.
 */
#include <stdlib.h>

#include "fuzz.h"

#ifdef FZ_CUDA
#include <cuda_runtime_api.h>

const int fz_cuda_mode = 1;

/* A call's arena is KBs to tens of MBs; managed memory past what the card
 * has free can hang it, so nothing near that is ever asked for. */
#define FZ_DEVICE_ARENA_MAX ((size_t)256 << 20)

void *fz_device_alloc(size_t n)
{
    void *p = NULL;
    if (n > FZ_DEVICE_ARENA_MAX) return NULL;
    const cudaError_t e = cudaMallocManaged(&p, n, cudaMemAttachGlobal);
    if (e != cudaSuccess)
        fz_fail("cuda", "cudaMallocManaged(%zu bytes) failed: %s: %s", n, cudaGetErrorName(e), cudaGetErrorString(e));
    return p;
}

void fz_device_free(void *p)
{
    const cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) fz_fail("cuda", "cudaFree failed: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
}

void fz_device_sync(const char *after)
{
    cudaError_t e = cudaDeviceSynchronize();
    const char *where = "cudaDeviceSynchronize";
    if (e == cudaSuccess) {
        e = cudaGetLastError();
        where = "an error left behind (cudaGetLastError)";
    }
    if (e != cudaSuccess)
        fz_fail("cuda", "after %s: %s: %s: %s", after, where, cudaGetErrorName(e), cudaGetErrorString(e));
}

#else

const int fz_cuda_mode = 0;

void *fz_device_alloc(size_t n) { return malloc(n); }
void fz_device_free(void *p) { free(p); }
void fz_device_sync(const char *after) { (void)after; }

#endif
