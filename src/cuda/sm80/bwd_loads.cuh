/*
 * bwd_loads.cuh -- a backward CTA's global -> shared loads (its place:
 * bwd_coords.cuh), all cp.async: the K and V tiles once, and per query
 * block the Q and dO tiles with their rows' lse2 and D.
 *
 * A tile of R rows x HD columns is walked in the forward's storage order
 * (layout.cuh: unit_row, unit_chunk, unit_smem_offset), 8 threads per 128
 * contiguous global bytes; rows past the sequence are zero-filled from an
 * address inside the tensor.
 */
#ifndef FC_SM80_BWD_LOADS_CUH
#define FC_SM80_BWD_LOADS_CUH

#include <stdint.h>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/bwd_args.h"
#include "cuda/sm80/bwd_coords.cuh"
#include "cuda/sm80/bwd_ranges.h"
#include "cuda/sm80/bwd_shape.cuh"

namespace fc {
namespace sm80 {

/* cp.async of a tile of ROWS rows x HD columns (16-bit) whose row r starts
 * at g + r * row_stride; rows r >= valid are zero-filled (read from base,
 * an address inside the tensor). A thread's k-th unit lies a fixed number
 * of rows and panels from its first (the storage order walks NT / PC panel
 * rows per step), so one address is computed and the rest are constant
 * offsets of it: 64-bit row math per unit cost ~65 instructions a block at
 * d128. Not at d64 (lane offsets held, bwd_shape.cuh): there the held
 * address spilled 8 bytes in the deterministic instance. */
template <class S_, int ROWS>
__device__ inline void load_rows(uint32_t tile, const uint16_t *__restrict__ g, int64_t row_stride, int valid,
                                 const void *base, int tid)
{
    constexpr int PC = S_::PC, NT = S_::NT, UNITS = ROWS * S_::HD / 8, STEP = NT / PC;
    static_assert(UNITS % NT == 0 && NT % (8 * PC) == 0, "whole units per thread, one swizzle phase");
    static_assert(STEP % ROWS == 0 || ROWS % STEP == 0, "a unit's row offset is the same in every thread");
    const int r0 = unit_row<ROWS, PC>(tid);
    const uint16_t *p = g + r0 * row_stride + unit_chunk<ROWS, PC>(tid) * 8;
    /* opaque: else the compiler folds r0 into each unit's row again */
    if constexpr (S_::FRESH) asm("" : "+l"(p));
#pragma unroll
    for (int k = 0; k < UNITS / NT; ++k) {
        const int dr = (k * STEP) % ROWS, dc = (k * STEP) / ROWS * PC, u = tid + k * NT;
        const bool ok = r0 + dr < valid;
        const uint16_t *src = S_::FRESH ? p + dr * row_stride + dc * 8
                                        : g + unit_row<ROWS, PC>(u) * row_stride + unit_chunk<ROWS, PC>(u) * 8;
        ptx::cp_async_16(tile + unit_smem_offset<PC>(u), ok ? (const void *)src : base, ok);
    }
}

/* The CTA's K and V tiles (key block c.n). */
template <class S_>
__device__ __forceinline__ void load_kv_tiles(const fc_sm80_bwd_args &a, const BwdCoords &c, int tid)
{
    using SM = BwdSmem<S_>;
    const fc_fwd_params &f = a.p.f;
    const int64_t j0 = (int64_t)c.n * S_::BN;
    const int valid = c.sk - (int)j0;
    const uint16_t *k = (const uint16_t *)f.k + c.bk * f.k_batch_stride + (c.k_start + j0) * f.k_row_stride +
                        (int64_t)c.h_kv * f.k_head_stride;
    const uint16_t *v = (const uint16_t *)f.v + c.bk * f.v_batch_stride + (c.k_start + j0) * f.v_row_stride +
                        (int64_t)c.h_kv * f.v_head_stride;
    load_rows<S_, S_::BN>(SM::k(), k, f.k_row_stride, valid, f.k, tid);
    load_rows<S_, S_::BN>(SM::v(), v, f.v_row_stride, valid, f.v, tid);
}

/* Query block m of query head h into buffer buf: Q, dO, and the rows'
 * lse2 and D (4-byte copies; rows past the sequence read as 0, and the
 * kernel masks them). */
template <class S_>
__device__ __forceinline__ void load_q_block(const fc_sm80_bwd_args &a, const BwdCoords &c, int h, int m, int buf,
                                             int tid)
{
    using SM = BwdSmem<S_>;
    const fc_fwd_params &f = a.p.f;
    const int64_t i0 = (int64_t)m * S_::BM;
    const int valid = c.sq - (int)i0;
    const uint16_t *q = (const uint16_t *)f.q + c.bq * f.q_batch_stride + (c.q_start + i0) * f.q_row_stride +
                        (int64_t)h * f.q_head_stride;
    const uint16_t *d = (const uint16_t *)a.p.dout + c.bq * a.p.do_batch_stride +
                        (c.q_start + i0) * a.p.do_row_stride + (int64_t)h * a.p.do_head_stride;
    load_rows<S_, S_::BM>(SM::q(buf), q, f.q_row_stride, valid, f.q, tid);
    load_rows<S_, S_::BM>(SM::dout(buf), d, a.p.do_row_stride, valid, a.p.dout, tid);
    static_assert(2 * S_::BM <= S_::NT, "one thread per lse2 / D element");
    if (tid < 2 * S_::BM) {
        const int r = tid < S_::BM ? tid : tid - S_::BM;
        const float *src = tid < S_::BM ? a.lse2 : a.dsum;
        const uint32_t dst = (tid < S_::BM ? SM::lse2(buf) : SM::dsum(buf)) + 4 * r;
        const bool ok = r < valid;
        ptx::cp_async_4(dst, ok ? src + (int64_t)h * a.rows + c.row0 + i0 + r : src, ok);
    }
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_BWD_LOADS_CUH */
