/*
 * bwd_place.cuh -- what the Hopper backward's warps need of where they
 * work: the CTA's coordinates and query-block range (sm80/bwd_coords.cuh,
 * bwd_ranges.h) and a consumer thread's place in its warpgroup. Held in
 * registers across the walk, or, in rows whose accumulators take the
 * registers (C::EARLY_DS: 128-query steps, where the held values spilled;
 * their producer warpgroup runs on 24), derived afresh at each use from
 * the volatile %ctaid.x and %tid.x.
 */
#ifndef FC_SM90_BWD_PLACE_CUH
#define FC_SM90_BWD_PLACE_CUH

#include "cuda/common/device_math.cuh"
#include "cuda/sm80/bwd_coords.cuh"
#include "cuda/sm80/bwd_ranges.h"

namespace fc90 {

/* A consumer thread's place: its warpgroup cw, its index among the 256
 * consumer threads (ctid) and within its warpgroup (tid), warp, lane,
 * g = lane / 4, t2 = 2 (lane % 4). */
struct BwdThread {
    int cw, ctid, tid, warp, lane, g, t2;
};

/* kFresh: from the volatile %tid.x, so that it is recomputed where used */
template <bool kFresh> __device__ __forceinline__ BwdThread bwd_thread(int cw)
{
    BwdThread th;
    th.cw = cw;
    th.ctid = (kFresh ? fc::dev::tid_x_volatile() : (int)threadIdx.x) - 128;
    th.tid = th.ctid - 128 * cw;
    th.warp = th.tid >> 5;
    th.lane = th.ctid & 31;
    th.g = th.lane >> 2;
    th.t2 = 2 * (th.lane & 3);
    return th;
}

/* The CTA's coordinates and its query blocks (block_m C::BM). */
template <class C, bool kFresh> struct BwdPlace;

template <class C> struct BwdPlace<C, false> {
    fc::sm80::BwdCoords c;
    fc_brange mr;
    __device__ __forceinline__ explicit BwdPlace(const fc_sm80_bwd_args &a) : c(fc::sm80::bwd_coords(a))
    {
        mr = fc_bwd_q_blocks(c.n, C::BN, C::BM, c.sq, c.sk, a.p.f.window_left, a.p.f.window_right);
    }
    __device__ __forceinline__ const fc::sm80::BwdCoords &coords(const fc_sm80_bwd_args &) const { return c; }
    __device__ __forceinline__ fc_brange range(const fc_sm80_bwd_args &) const { return mr; }
};

template <class C> struct BwdPlace<C, true> {
    __device__ __forceinline__ explicit BwdPlace(const fc_sm80_bwd_args &) {}
    __device__ __forceinline__ fc::sm80::BwdCoords coords(const fc_sm80_bwd_args &a) const
    {
        return fc::sm80::bwd_coords(a);
    }
    __device__ __forceinline__ fc_brange range(const fc_sm80_bwd_args &a) const
    {
        const fc::sm80::BwdCoords c = fc::sm80::bwd_coords(a);
        return fc_bwd_q_blocks(c.n, C::BN, C::BM, c.sq, c.sk, a.p.f.window_left, a.p.f.window_right);
    }
};

/* A consumer thread's BwdThread, held or derived afresh. */
template <bool kFresh> struct BwdThreadPlace;

template <> struct BwdThreadPlace<false> {
    BwdThread t;
    __device__ __forceinline__ explicit BwdThreadPlace(int cw) : t(bwd_thread<false>(cw)) {}
    __device__ __forceinline__ const BwdThread &get() const { return t; }
};

template <> struct BwdThreadPlace<true> {
    int cw;
    __device__ __forceinline__ explicit BwdThreadPlace(int w) : cw(w) {}
    __device__ __forceinline__ BwdThread get() const { return bwd_thread<true>(cw); }
};

} /* namespace fc90 */

#endif /* FC_SM90_BWD_PLACE_CUH */
