/*
 * trace.cuh -- phase stamps of trace builds (-DFC_SM90_TRACE=1, never
 * shipped; sm90.h has the buffer layout, plan.cu writes it out,
 * bench/trace_sm90.py reads it). In other builds every call is empty.
 */
#ifndef FC_SM90_TRACE_CUH
#define FC_SM90_TRACE_CUH

#include "cuda/sm90/config.cuh"

namespace fc90 {

/* Trace builds only (sm90.h): the slot of event ev of this CTA's tile k for
 * role, trace[cta][role][k][ev]. */
__device__ __forceinline__ long long *trace_slot(const fc_sm90_params &p, int role, int k, int ev)
{
    return p.trace + (((size_t)blockIdx.x * FC_SM90_TRACE_ROLES + role) * FC_SM90_TRACE_TILES + k) *
                         FC_SM90_TRACE_EVENTS + ev;
}

/* Trace builds only: stamp event ev of this CTA's tile k for role (SM clock). */
__device__ __forceinline__ void trace(const fc_sm90_params &p, int role, int k, int ev, bool who)
{
#if FC_SM90_TRACE
    if (who && p.trace && k < FC_SM90_TRACE_TILES) *trace_slot(p, role, k, ev) = clock64();
#else
    (void)p, (void)role, (void)k, (void)ev, (void)who;
#endif
}

/* Trace builds only: %globaltimer (ns, one clock for every SM) into event ev
 * of tile slot 0 of role, past the per-tile phases: producer role events 5
 * (CTA entry) and 6 (after the PDL wait), consumer roles event 5 (exit).
 * They align CTAs across SMs. */
__device__ __forceinline__ void trace_gt(const fc_sm90_params &p, int role, int ev, bool who)
{
#if FC_SM90_TRACE
    if (who && p.trace) {
        long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        *trace_slot(p, role, 0, ev) = t;
    }
#else
    (void)p, (void)role, (void)ev, (void)who;
#endif
}

} /* namespace fc90 */

#endif /* FC_SM90_TRACE_CUH */
