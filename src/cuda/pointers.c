/*
 * pointers.c -- the memory space of a call's pointers (memory_space.h), from
 * the CUDA driver's pointer attributes.
 *
 * One cuPointerGetAttributes per distinct allocation: with the memory type
 * it returns the allocation's address range, and each later pointer of the
 * same call inside that range takes the same answer without a query (torch's
 * caching allocator puts the q, k, v and out of a small call in one or two
 * segments). On an H100 host the driver query costs ~0.10 us, the runtime's
 * cudaPointerGetAttributes 0.14 us (device) to 0.22 us (host).
 *
 * Nothing is kept from one call to the next. The library is not told when an
 * allocation is freed, and a freed range soon holds host memory: on an H100
 * host an mmap landed inside a just-freed cudaMalloc range in 126 of 200
 * tries. A kept "device" answer would then send a host pointer to a kernel
 * (a device fault instead of the clear error). Within one call the caller
 * keeps every pointer valid, so a range the driver reported stays that
 * allocation until the call returns.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h> /* PFN_cuPointerGetAttributes_v7000 */

#include "memory_space.h"

/* The library links only the runtime: the driver function comes through
 * its entry point; NULL where the driver has none (then the runtime asks). */
static PFN_cuPointerGetAttributes_v7000 g_get_attrs;

static void load_get_attrs(void)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000,
                                                           cudaEnableDefault, &q);
    if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && fn)
        g_get_attrs = (PFN_cuPointerGetAttributes_v7000)fn;
    else if (e != cudaSuccess)
        cudaGetLastError(); /* e.g. no driver: leave no error for a later call */
}

static int runtime_is_device(const void *ptr)
{
    struct cudaPointerAttributes attr;
    memset(&attr, 0, sizeof(attr));
    const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* e.g. no driver/device: not device memory; leave no error behind */
        return 0;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

/* 1 if ptr is device or managed memory. [*lo, *hi) is its allocation's
 * address range when it is and the driver said so, else empty. */
static int ask(const void *ptr, uintptr_t *lo, uintptr_t *hi)
{
    unsigned int type = 0;
    int managed = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    void *data[4] = {&type, &managed, &start, &size};
    const uintptr_t a = (uintptr_t)ptr;
    *lo = *hi = 0;
    if (!g_get_attrs || g_get_attrs(4, attrs, data, (CUdeviceptr)a) != CUDA_SUCCESS) return runtime_is_device(ptr);
    /* A pointer the driver does not know gets type 0 and no range. */
    const int dev = type == CU_MEMORYTYPE_DEVICE || managed;
    if (dev && size > 0 && start <= a && a - start < size) {
        *lo = (uintptr_t)start;
        *hi = (uintptr_t)start + size;
    }
    return dev;
}

void fc_cuda_device_pointers(const void *const *ptrs, int n, unsigned char *is_device)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, load_get_attrs);
    uintptr_t lo[FC_MAX_CALL_POINTERS], hi[FC_MAX_CALL_POINTERS]; /* device ranges seen in this call */
    int ranges = 0;
    for (int i = 0; i < n && i < FC_MAX_CALL_POINTERS; i++) {
        const uintptr_t a = (uintptr_t)ptrs[i];
        int j = 0;
        while (j < ranges && !(a >= lo[j] && a < hi[j])) j++;
        if (j < ranges) {
            is_device[i] = 1;
            continue;
        }
        is_device[i] = (unsigned char)ask(ptrs[i], &lo[ranges], &hi[ranges]);
        if (hi[ranges] > lo[ranges]) ranges++;
    }
}
