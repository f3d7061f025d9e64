/*
 * pdl.cuh -- programmatic dependent launch (PDL, sm_90+), shared by every
 * kernel of the library.
 *
 * A kernel launched with programmatic stream serialisation may begin
 * launching while the previous kernel in the stream is still running; it
 * must then wait (griddepcontrol.wait) before it touches global memory. Over
 * back-to-back calls in a stream or graph this hides one launch latency per
 * kernel boundary (-0.7 us per call at the mission shape on the Hopper path,
 * H100). Where the previous operation is not a kernel (a memset,
 * a stream-ordered allocation), the launch is ordered as usual.
 *
 * Whether a call's launches use it is decided once, by the selection
 * function (dispatch.c: fc_cuda_choice.pdl): the device is sm_90 or newer
 * -- a 9.x device runs only the sm_90/90a images of this library (no PTX is
 * embedded, runtime.c refuses other majors), so the kernel executing there
 * was compiled with the wait below -- and the context's tuning.pdl is not
 * 0 (A/B hook, docs/API.md).
 */
#ifndef FC_PDL_CUH
#define FC_PDL_CUH

#include <cuda_runtime.h>

/* Device side, the two halves. Let the next kernel in the stream start
 * launching (its CTAs take SMs as ours leave; none of ours is then still
 * waiting for an SM, so it cannot starve us); wait until the kernel this
 * one depends on has completed and its memory is visible. Both are no-ops
 * for a normal launch; below sm_90 they compile to nothing (such devices
 * never get a PDL launch). */
__device__ __forceinline__ void fc_grid_dep_launch()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void fc_grid_dep_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* Both, launch first: call before the first global-memory access. A kernel
 * may instead issue loads of its call's inputs (written before the previous
 * kernel waited, so visible) before it waits for that kernel's outputs. */
__device__ __forceinline__ void fc_grid_dep_sync()
{
    fc_grid_dep_launch();
    fc_grid_dep_wait();
}

/* Launch kern<<<grid, threads, smem, stream>>>(args...), as a programmatic
 * dependent of the previous kernel when pdl. Returns the launch error. */
template <typename... Params, typename... Args>
static cudaError_t fc_launch(void (*kern)(Params...), dim3 grid, unsigned threads, size_t smem,
                             cudaStream_t stream, bool pdl, Args &&...args)
{
    if (!pdl) {
        kern<<<grid, threads, smem, stream>>>(static_cast<Args &&>(args)...);
        return cudaGetLastError();
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<Args &&>(args)...);
}

#endif /* FC_PDL_CUH */
