/*
 * cli_cuda.c -- the few CUDA runtime calls the CLI makes itself: device
 * buffers for the inputs/outputs it hands the library, streams, events for
 * timing, graph capture, and an L2 flush. Every return code is checked and
 * turned into a message. Without FC_HAVE_CUDA every entry reports that this
 * CLI was built without CUDA.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifdef FC_HAVE_CUDA
#include <cuda_runtime_api.h>

#define CK(call, what)                                                                   \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            snprintf(err, n, "%s: %s (%s)", what, cudaGetErrorString(e_), cudaGetErrorName(e_)); \
            return -1;                                                                   \
        }                                                                                \
    } while (0)

int cli_cuda_compiled(void) { return 1; }

int cli_cuda_malloc(void **p, size_t bytes, const char *what, char *err, size_t n)
{
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        snprintf(err, n, "cudaMalloc(%s, %zu bytes): %s", what, bytes, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

void cli_cuda_free(void *p)
{
    if (p) cudaFree(p);
}

int cli_cuda_h2d(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t n)
{
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream), "cudaMemcpyAsync(host to device)");
    CK(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize after upload");
    return 0;
}

int cli_cuda_d2h(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t n)
{
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream), "cudaMemcpyAsync(device to host)");
    CK(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize after download");
    return 0;
}

int cli_cuda_stream_create(void **stream, char *err, size_t n)
{
    cudaStream_t s = NULL;
    /* non-blocking: graph capture is not allowed on the legacy stream */
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    *stream = s;
    return 0;
}

void cli_cuda_stream_destroy(void *stream)
{
    if (stream) cudaStreamDestroy((cudaStream_t)stream);
}

int cli_cuda_stream_sync(void *stream, char *err, size_t n)
{
    CK(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
    CK(cudaGetLastError(), "after the library call");
    return 0;
}

int cli_cuda_timer_create(cli_cuda_timer *t, char *err, size_t n)
{
    cudaEvent_t a = NULL, b = NULL;
    t->start = t->stop = NULL;
    CK(cudaEventCreate(&a), "cudaEventCreate");
    cudaError_t e = cudaEventCreate(&b);
    if (e != cudaSuccess) {
        cudaEventDestroy(a);
        snprintf(err, n, "cudaEventCreate: %s", cudaGetErrorString(e));
        return -1;
    }
    t->start = a;
    t->stop = b;
    return 0;
}

void cli_cuda_timer_destroy(cli_cuda_timer *t)
{
    if (t->start) cudaEventDestroy((cudaEvent_t)t->start);
    if (t->stop) cudaEventDestroy((cudaEvent_t)t->stop);
    t->start = t->stop = NULL;
}

int cli_cuda_timer_start(cli_cuda_timer *t, void *stream, char *err, size_t n)
{
    CK(cudaEventRecord((cudaEvent_t)t->start, (cudaStream_t)stream), "cudaEventRecord(start)");
    return 0;
}

int cli_cuda_timer_stop(cli_cuda_timer *t, void *stream, float *ms, char *err, size_t n)
{
    CK(cudaEventRecord((cudaEvent_t)t->stop, (cudaStream_t)stream), "cudaEventRecord(stop)");
    CK(cudaEventSynchronize((cudaEvent_t)t->stop), "cudaEventSynchronize");
    CK(cudaGetLastError(), "after the timed call");
    CK(cudaEventElapsedTime(ms, (cudaEvent_t)t->start, (cudaEvent_t)t->stop), "cudaEventElapsedTime");
    return 0;
}

int cli_cuda_capture_begin(void *stream, char *err, size_t n)
{
    CK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    return 0;
}

int cli_cuda_capture_end(void *stream, int ok, void **exec, char *err, size_t n)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    *exec = NULL;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &g);
    if (!ok) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError(); /* a failed capture leaves a (non-sticky) error: clear it */
        return 0;
    }
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        snprintf(err, n, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
        return -1;
    }
#if CUDART_VERSION >= 12000
    e = cudaGraphInstantiate(&x, g, 0);
#else
    e = cudaGraphInstantiate(&x, g, NULL, NULL, 0);
#endif
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, n, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
        return -1;
    }
    *exec = x;
    return 0;
}

int cli_cuda_graph_launch(void *exec, void *stream, char *err, size_t n)
{
    CK(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream), "cudaGraphLaunch");
    return 0;
}

void cli_cuda_graph_destroy(void *exec)
{
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

static void *g_scratch;
static size_t g_scratch_bytes;
static unsigned g_flush_round;

int cli_cuda_flush_l2(void *stream, char *err, size_t n)
{
    if (!g_scratch) {
        int dev = 0, l2 = 0;
        CK(cudaGetDevice(&dev), "cudaGetDevice");
        CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute(L2 size)");
        size_t bytes = (size_t)(l2 > 0 ? l2 : (64 << 20)) * 2;
        if (cli_cuda_malloc(&g_scratch, bytes, "L2 flush buffer", err, n)) return -1;
        g_scratch_bytes = bytes;
    }
    CK(cudaMemsetAsync(g_scratch, (int)(g_flush_round++ & 0xff), g_scratch_bytes, (cudaStream_t)stream),
       "cudaMemsetAsync(L2 flush)");
    return 0;
}

void cli_cuda_release_scratch(void)
{
    cli_cuda_free(g_scratch);
    g_scratch = NULL;
    g_scratch_bytes = 0;
}

int cli_cuda_describe(char *name, size_t name_len, char *driver, size_t driver_len)
{
    int dev = 0, drv = 0, rt = 0;
    struct cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(name, name_len, "none");
        snprintf(driver, driver_len, "none");
        return -1;
    }
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    snprintf(name, name_len, "%s (sm_%d%d, %d SMs)", p.name, p.major, p.minor, p.multiProcessorCount);
    snprintf(driver, driver_len, "driver %d.%d, runtime %d.%d", drv / 1000, (drv % 1000) / 10, rt / 1000,
             (rt % 1000) / 10);
    return 0;
}

int cli_cuda_props(int *cc, int *sms)
{
    int dev = 0;
    struct cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    *cc = p.major * 10 + p.minor;
    *sms = p.multiProcessorCount;
    return 0;
}

#else /* !FC_HAVE_CUDA */

static int no_cuda(char *err, size_t n)
{
    snprintf(err, n, "this flashcore CLI was built without CUDA (configure with nvcc available)");
    return -1;
}

int cli_cuda_compiled(void) { return 0; }
int cli_cuda_malloc(void **p, size_t bytes, const char *what, char *err, size_t n)
{
    *p = NULL;
    return no_cuda(err, n);
}
void cli_cuda_free(void *p) { (void)p; }
int cli_cuda_h2d(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t n) { return no_cuda(err, n); }
int cli_cuda_d2h(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t n) { return no_cuda(err, n); }
int cli_cuda_stream_create(void **stream, char *err, size_t n)
{
    *stream = NULL;
    return no_cuda(err, n);
}
void cli_cuda_stream_destroy(void *stream) { (void)stream; }
int cli_cuda_stream_sync(void *stream, char *err, size_t n) { return no_cuda(err, n); }
int cli_cuda_timer_create(cli_cuda_timer *t, char *err, size_t n)
{
    t->start = t->stop = NULL;
    return no_cuda(err, n);
}
void cli_cuda_timer_destroy(cli_cuda_timer *t) { (void)t; }
int cli_cuda_timer_start(cli_cuda_timer *t, void *stream, char *err, size_t n) { return no_cuda(err, n); }
int cli_cuda_timer_stop(cli_cuda_timer *t, void *stream, float *ms, char *err, size_t n) { return no_cuda(err, n); }
int cli_cuda_capture_begin(void *stream, char *err, size_t n) { return no_cuda(err, n); }
int cli_cuda_capture_end(void *stream, int ok, void **exec, char *err, size_t n)
{
    *exec = NULL;
    return no_cuda(err, n);
}
int cli_cuda_graph_launch(void *exec, void *stream, char *err, size_t n) { return no_cuda(err, n); }
void cli_cuda_graph_destroy(void *exec) { (void)exec; }
int cli_cuda_flush_l2(void *stream, char *err, size_t n) { return no_cuda(err, n); }
void cli_cuda_release_scratch(void) {}
int cli_cuda_describe(char *name, size_t name_len, char *driver, size_t driver_len)
{
    snprintf(name, name_len, "none");
    snprintf(driver, driver_len, "none");
    return -1;
}
int cli_cuda_props(int *cc, int *sms)
{
    *cc = *sms = 0;
    return -1;
}

#endif /* FC_HAVE_CUDA */
