/*
 * runtime.c -- the CUDA runtime glue of the CUDA layer (plain C, the runtime
 * API only): is CUDA compiled in and for which architectures, which device
 * is there and can this build run on it, a synchronous device->host copy,
 * is a stream capturing (where a pointer lives: pointers.c).
 *
 * Every CUDA return code is checked; failures become FC_ERR_CUDA with
 * "cudaXxx failed: <reason>" (allocation failures FC_ERR_OUT_OF_MEMORY).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/common/cuda_check.h"
#include "internal.h"

#ifndef FC_COMPILED_ARCHS
#error "FC_COMPILED_ARCHS must be defined by the build (cmake/CudaKernels.cmake)"
#endif

int fc_cuda_compiled(void) { return 1; }

const char *fc_cuda_compiled_archs(void) { return FC_COMPILED_ARCHS; }

/* Can SASS built for one entry of FC_COMPILED_ARCHS ("80", "86", "90a") run
 * on a device of compute capability major.minor? Plain sm_XY SASS runs on
 * the same major with minor >= Y (sm_80 runs on 8.6 and 8.9); an
 * arch-specific "a" target runs only on exactly that capability. */
static int arch_runs_on(const char *tok, size_t len, int major, int minor, int floor)
{
    char buf[8];
    if (len == 0 || len >= sizeof(buf)) return 0;
    memcpy(buf, tok, len);
    buf[len] = '\0';
    char *end = NULL;
    const long v = strtol(buf, &end, 10);
    if (end == buf || v < 10) return 0;
    const int specific = (*end == 'a');
    const int amaj = (int)(v / 10), amin = (int)(v % 10);
    if (amaj != major || v < floor) return 0;
    return specific ? amin == minor : amin <= minor;
}

int fc_cuda_compiled_from(int major, int minor, int floor)
{
    const char *s = FC_COMPILED_ARCHS;
    while (*s) {
        const char *e = strchr(s, ',');
        const size_t len = e ? (size_t)(e - s) : strlen(s);
        if (arch_runs_on(s, len, major, minor, floor)) return 1;
        if (!e) break;
        s = e + 1;
    }
    return 0;
}

static int compiled_for(int major, int minor) { return fc_cuda_compiled_from(major, minor, 0); }

/* cudaGetDeviceProperties can take a while; device properties never change
 * within a process, so they are cached per device (state: 0 empty, 1 being
 * filled by one thread, 2 ready; a thread that loses the race just queries
 * the runtime itself). */
#define FC_DEV_CACHE 64
static fc_cuda_device g_dev_cache[FC_DEV_CACHE];
static atomic_int g_dev_state[FC_DEV_CACHE];

static fc_status query_device(int device, fc_cuda_device *dev, char *err, size_t err_len)
{
    struct cudaDeviceProp prop;
    FC_CUDA_TRY("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, device));
    memset(dev, 0, sizeof(*dev));
    dev->id = device;
    dev->cc_major = prop.major;
    dev->cc_minor = prop.minor;
    dev->sm_count = prop.multiProcessorCount;
    dev->smem_optin = (int64_t)prop.sharedMemPerBlockOptin;
    dev->l2_bytes = (int64_t)prop.l2CacheSize;
    size_t n = 0; /* copy the name, truncated to fit (prop.name is 256 bytes) */
    while (n + 1 < sizeof(dev->name) && n < sizeof(prop.name) && prop.name[n]) {
        dev->name[n] = prop.name[n];
        ++n;
    }
    dev->name[n] = '\0';
    FC_CUDA_TRY("cudaDriverGetVersion", cudaDriverGetVersion(&dev->driver_version));
    FC_CUDA_TRY("cudaRuntimeGetVersion", cudaRuntimeGetVersion(&dev->runtime_version));
    return FC_OK;
}

/* The forward's scratch pool of each device (split-KV partials, the append
 * step's scratch, the Hopper tile counter and tail workspace). The default
 * pool of cudaMallocAsync hands its memory back at every synchronisation,
 * so a decode call after one mapped its workspace again: ~40 us of its 46
 * us of host time on an H100 host. This pool keeps up to FC_WS_POOL_KEEP
 * bytes across synchronisations. Made on first use; where that fails, the
 * default pool serves. */
#define FC_WS_POOL_KEEP ((uint64_t)64 << 20)
static cudaMemPool_t g_ws_pool[FC_DEV_CACHE];
static atomic_int g_ws_pool_state[FC_DEV_CACHE]; /* 0 none, 1 being made, 2 ready, 3 failed */

static cudaMemPool_t make_ws_pool(int device)
{
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = NULL;
    uint64_t keep = FC_WS_POOL_KEEP;
    if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
        cudaGetLastError();
        cudaMemPoolDestroy(pool);
        cudaGetLastError();
        return NULL;
    }
    return pool;
}

static cudaMemPool_t ws_pool(int device)
{
    if (device < 0 || device >= FC_DEV_CACHE) return NULL;
    const int s = atomic_load_explicit(&g_ws_pool_state[device], memory_order_acquire);
    if (s == 2) return g_ws_pool[device];
    int expect = 0;
    if (s != 0 || !atomic_compare_exchange_strong_explicit(&g_ws_pool_state[device], &expect, 1,
                                                           memory_order_acq_rel, memory_order_relaxed))
        return NULL; /* failed, or another thread is making it: the default pool this time */
    g_ws_pool[device] = make_ws_pool(device);
    atomic_store_explicit(&g_ws_pool_state[device], g_ws_pool[device] ? 2 : 3, memory_order_release);
    return g_ws_pool[device];
}

fc_status fc_cuda_ws_alloc(void **ws, int64_t bytes, int device, void *stream, const char *what, char *err,
                           size_t err_len)
{
    cudaMemPool_t pool = ws_pool(device);
    const cudaError_t e = pool ? cudaMallocFromPoolAsync(ws, (size_t)bytes, pool, (cudaStream_t)stream)
                               : cudaMallocAsync(ws, (size_t)bytes, (cudaStream_t)stream);
    if (e == cudaSuccess) return FC_OK;
    cudaGetLastError(); /* clear the non-sticky error */
    *ws = NULL;
    snprintf(err, err_len, "stream-ordered allocation failed: %s (%lld bytes of %s)", cudaGetErrorString(e),
             (long long)bytes, what);
    return e == cudaErrorMemoryAllocation ? FC_ERR_OUT_OF_MEMORY : FC_ERR_CUDA;
}

fc_status fc_cuda_get_device(int device, fc_cuda_device *dev, char *err, size_t err_len)
{
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the (non-sticky) error for later calls */
        snprintf(err, err_len, "no CUDA device: cudaGetDeviceCount failed: %s", cudaGetErrorString(e));
        return FC_ERR_NO_DEVICE;
    }
    if (count <= 0) {
        snprintf(err, err_len, "no CUDA device: cudaGetDeviceCount found 0 devices");
        return FC_ERR_NO_DEVICE;
    }
    if (device < 0) FC_CUDA_TRY("cudaGetDevice", cudaGetDevice(&device));
    if (device >= count) {
        snprintf(err, err_len, "no CUDA device %d: this machine has %d (ids 0..%d)", device, count, count - 1);
        return FC_ERR_NO_DEVICE;
    }

    if (device < FC_DEV_CACHE && atomic_load_explicit(&g_dev_state[device], memory_order_acquire) == 2) {
        *dev = g_dev_cache[device];
    } else {
        const fc_status st = query_device(device, dev, err, err_len);
        if (st != FC_OK) return st;
        int expect = 0;
        if (device < FC_DEV_CACHE &&
            atomic_compare_exchange_strong_explicit(&g_dev_state[device], &expect, 1, memory_order_acq_rel,
                                                    memory_order_relaxed)) {
            g_dev_cache[device] = *dev;
            atomic_store_explicit(&g_dev_state[device], 2, memory_order_release);
        }
    }

    /* Refuse a device no compiled kernel can run on here, not at launch
     * ("no kernel image is available"). */
    if (!compiled_for(dev->cc_major, dev->cc_minor)) {
        snprintf(err, err_len,
                 "device %s is sm_%d%d but this build has kernels for %s only (rebuild with "
                 "-DFLASHCORE_CUDA_ARCHS=\"%d%d\" or a list including it)",
                 dev->name, dev->cc_major, dev->cc_minor, FC_COMPILED_ARCHS, dev->cc_major, dev->cc_minor);
        return FC_ERR_UNSUPPORTED;
    }
    return FC_OK;
}

fc_status fc_cuda_copy_to_host(void *dst, const void *src, size_t bytes, void *stream, char *err,
                               size_t err_len)
{
    if (bytes == 0) return FC_OK;
    FC_CUDA_TRY("cudaMemcpyAsync",
                cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    FC_CUDA_TRY("cudaStreamSynchronize", cudaStreamSynchronize((cudaStream_t)stream));
    return FC_OK;
}

int fc_cuda_stream_is_capturing(void *stream)
{
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing((cudaStream_t)stream, &status);
    if (e != cudaSuccess) {
        cudaGetLastError();
        /* The legacy stream while another stream captures globally: treat as
         * capturing, so the caller does not synchronise. */
        return e == cudaErrorStreamCaptureImplicit;
    }
    return status != cudaStreamCaptureStatusNone;
}
