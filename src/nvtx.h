/*
 * nvtx.h -- named ranges for profilers (nsys, ncu): FC_RANGE_PUSH/POP wrap
 * each API call so a timeline shows FlashCore's calls by name. With the
 * toolkit's header-only nvtx3 (FC_HAVE_NVTX, set by CMake) a range costs a
 * call through a pointer that is a no-op when no profiler is attached;
 * without it the macros are empty.
 */
#ifndef FC_NVTX_H
#define FC_NVTX_H

#if defined(FC_HAVE_NVTX) && FC_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#define FC_RANGE_PUSH(name) nvtxRangePushA(name)
#define FC_RANGE_POP() nvtxRangePop()
#else
#define FC_RANGE_PUSH(name) ((void)0)
#define FC_RANGE_POP() ((void)0)
#endif

#endif /* FC_NVTX_H */
