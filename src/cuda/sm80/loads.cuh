/*
 * loads.cuh -- global -> shared loads of the sm80-class kernel: the Q tile
 * and the K/V tiles by cp.async (general and lean-address variants), and
 * the K/V tiles by TMA (kVarTma rows).
 *
 * cp.async: unit u (one 16-byte chunk) walks a tile of R rows in storage
 * order (layout.cuh: unit_row, unit_chunk, unit_smem_offset). 8 consecutive
 * threads = 128 contiguous global bytes (one row at PC 8, two at PC 4) and
 * one 128-byte smem line, conflict-free. Thread tid handles units
 * tid + k*NT: their row and chunk differ from unit tid's by compile-time
 * amounts, so one base pointer per tensor. Keys and query rows past the end
 * are zero-filled (src-size 0) from an address inside the tensor.
 *
 * The load functions are plain `inline`, not __forceinline__: NVVM then
 * simplifies each on its own before inlining it, which keeps the address
 * arithmetic (and so the kernels' PTX) as it was when they were lambdas.
 */
#ifndef FC_SM80_LOADS_CUH
#define FC_SM80_LOADS_CUH

#include <stdint.h>

#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/fwd_args.h"
#include "cuda/sm80/layout.cuh"
#include "cuda/sm80/schedule.cuh"
#include "cuda/sm90/ptx_sm90.cuh" /* mbarrier + TMA wrappers (kVarTma rows, sm_90 only) */

namespace fc {
namespace sm80 {

/* Which half of a KV block a load issues (K tile, V tile or both): a
 * compile-time tag, so each call compiles to just its own copies. */
template <int X>
struct KvSel {
    static constexpr bool K = (X & 1) != 0, V = (X & 2) != 0;
};
using LoadK = KvSel<1>;
using LoadV = KvSel<2>;
using LoadKV = KvSel<3>;

/* Compile-time flag argument (the lean loads' from_regs). */
template <bool B>
struct Flag {
    static constexpr bool value = B;
};

/* Rows per pass of NT threads over a tile of PC-chunk panels. */
template <class S_>
constexpr int pass_rows()
{
    return S_::NT / S_::PC;
}

/* K/V rows per pass of NT threads: 16-bit panels (PC chunks per row) or,
 * kVarKv8, FP8 rows of HD / 16 chunks (loads_kv8.cuh). */
template <class S_>
constexpr int kv_pass_rows()
{
    return S_::KV8 ? S_::NT / (S_::HD / 16) : pass_rows<S_>();
}

/* A CTA's K/V source addresses. kb0/vb0: the (batch, KV head) bases, parked
 * in smem with KV_BASE_IN_SMEM (there the two 64-bit pointers held across
 * the loop are exactly the registers that would spill). kt/vt: with unit
 * tid's row and chunk added, each thread's own pointers otherwise. */
struct KvAddr {
    const uint16_t *__restrict__ kb0;
    const uint16_t *__restrict__ vb0;
    const uint16_t *__restrict__ kt;
    const uint16_t *__restrict__ vt;
    int row0, chunk0;  /* unit tid's row and chunk (LEAN_REGS recomputes them) */
    uint32_t soff;     /* unit tid's smem offset                               */
    int h_kv;          /* KV head                                              */
    int sk;            /* keys of this sequence                                */
    int tid;
    const int32_t *__restrict__ bt; /* kVarPaged: the sequence's block-table row */
    fc_fastdiv page;                /* kVarPaged: keys per page                  */
    int pg[4], pw[4];               /* kVarPaged: the next tile's rows: page, row in it */
    const uint8_t *__restrict__ k8; /* kVarKv8: unit tid's K/V bytes (loads_kv8.cuh) */
    const uint8_t *__restrict__ v8;
};

template <class S_>
__device__ __forceinline__ KvAddr kv_addr(const fc_sm80_args &a, const TileCoords &c, int tid)
{
    constexpr int BN = S_::BN, PC = S_::PC, QS = pass_rows<S_>();
    static_assert(BN % QS == 0 || QS % BN == 0, "K/V load: passes must tile the rows");
    static_assert(S_::NT % (8 * PC) == 0, "K/V load: unit tid + k*NT keeps tid's chunk and swizzle bits");
    const fc_fwd_params &p = a.p;
    KvAddr ka;
    ka.sk = c.sk;
    ka.tid = tid;
    ka.h_kv = fc_fastdiv_div(c.h_base, a.heads_per_kv);
    ka.row0 = unit_row<BN, PC>(tid);
    ka.chunk0 = unit_chunk<BN, PC>(tid);
    if constexpr (S_::PAGED) { /* the head's base; load_kv_paged adds page and row */
        ka.kb0 = (const uint16_t *)p.k + (int64_t)ka.h_kv * p.k_head_stride;
        ka.vb0 = (const uint16_t *)p.v + (int64_t)ka.h_kv * p.v_head_stride;
        ka.bt = p.block_table + (int64_t)c.b * p.block_table_stride;
        ka.page = a.page;
        return ka;
    }
    ka.kb0 = (const uint16_t *)p.k + c.bk * p.k_batch_stride + c.k_start * p.k_row_stride +
             (int64_t)ka.h_kv * p.k_head_stride;
    ka.vb0 = (const uint16_t *)p.v + c.bk * p.v_batch_stride + c.k_start * p.v_row_stride +
             (int64_t)ka.h_kv * p.v_head_stride;
    return ka;
}
/* The per-thread pointers, after the bases are parked (the order the
 * kernel has always issued them in). */
template <class S_>
__device__ __forceinline__ void kv_addr_thread(const fc_fwd_params &p, KvAddr &ka)
{
    const int64_t r0 = S_::PAGED ? 0 : ka.row0; /* paged: the row is added per key */
    ka.kt = ka.kb0 + r0 * p.k_row_stride + ka.chunk0 * 8;
    ka.vt = ka.vb0 + r0 * p.v_row_stride + ka.chunk0 * 8;
    ka.soff = unit_smem_offset<S_::PC>(ka.tid);
}

/* cp.async of the K and/or V tile (Sel) of block n into ring stage `stage`. */
template <class S_, class Sel>
__device__ inline void load_kv(const fc_fwd_params &p, const KvAddr &ka, const Smem &sm, int n, int stage,
                                        Sel)
{
    constexpr int BN = S_::BN, HD = S_::HD, NT = S_::NT, PC = S_::PC, QS = pass_rows<S_>();
    /* LEAN_REGS: the same three values, recomputed from a fresh %tid.x, so
     * none of them is live between loads. */
    int row0 = ka.row0, chunk0 = ka.chunk0;
    uint32_t soff = ka.soff;
    if constexpr (S_::LEAN_REGS) {
        const int tid_ = dev::tid_x_volatile();
        row0 = unit_row<BN, PC>(tid_);
        chunk0 = unit_chunk<BN, PC>(tid_);
        soff = unit_smem_offset<PC>(tid_);
    }
    (void)chunk0; /* only the KV_BASE_IN_SMEM path uses it */
    const uint32_t sK = sm.kv + stage * S_::STAGE_BYTES + soff;
    const uint32_t sV = sK + S_::KV_BYTES;
    constexpr int UNITS = BN * HD / 8;
    const int j0 = n * BN + row0;
    const int64_t kn = (int64_t)n * BN * p.k_row_stride;
    const int64_t vn = (int64_t)n * BN * p.v_row_stride;
    const uint16_t *__restrict__ kbase = nullptr, *__restrict__ vbase = nullptr;
    if constexpr (S_::KV_BASE_IN_SMEM) { /* (volatile loads: only the ones used) */
        if constexpr (Sel::K) kbase = (const uint16_t *)dev::lds64(sm.base);
        if constexpr (Sel::V) vbase = (const uint16_t *)dev::lds64(sm.base + 8);
    }
    (void)kn, (void)vn, (void)kbase, (void)vbase; /* unused in some instances */
#pragma unroll
    for (int k = 0; k < (UNITS + NT - 1) / NT; ++k) {
        if (UNITS % NT == 0 || ka.tid + k * NT < UNITS) {
            /* Unit tid + k*NT sits DR rows and DC chunks from unit tid (u/PC
             * grows by k*QS) and k*NT*16 bytes further in smem. */
            const int DR = (k * QS) % BN, DC = ((k * QS) / BN) * PC;
            const bool ok = j0 + DR < ka.sk;
            const uint16_t *ks = (const uint16_t *)p.k, *vs = (const uint16_t *)p.v;
            if (ok) {
                if constexpr (S_::KV_BASE_IN_SMEM) {
                    const int64_t jr = j0 + DR;
                    ks = kbase + (jr * p.k_row_stride + (chunk0 + DC) * 8);
                    vs = vbase + (jr * p.v_row_stride + (chunk0 + DC) * 8);
                } else {
                    ks = ka.kt + (kn + DR * p.k_row_stride + DC * 8);
                    vs = ka.vt + (vn + DR * p.v_row_stride + DC * 8);
                }
            }
            if constexpr (Sel::K) ptx::cp_async_16(sK + k * NT * 16, ks, ok);
            if constexpr (Sel::V) ptx::cp_async_16(sV + k * NT * 16, vs, ok);
        }
    }
}

/* The Q tile, any G: packed rows map to (position, head) by a division. */
template <class S_>
__device__ inline void load_q(const fc_sm80_args &a, const TileCoords &c, uint32_t sQ, int tid)
{
    constexpr int BM = S_::BM, HD = S_::HD, NT = S_::NT, PC = S_::PC;
    const fc_fwd_params &p = a.p;
    constexpr int UNITS = BM * HD / 8;
    static_assert(UNITS % NT == 0, "Q tile: whole chunks per thread");
    const uint16_t *__restrict__ qg = (const uint16_t *)p.q;
#pragma unroll
    for (int k = 0; k < UNITS / NT; ++k) {
        const int u = tid + k * NT;
        const int r = unit_row<BM, PC>(u);
        const int ch = unit_chunk<BM, PC>(u);
        const int64_t rr = c.r0 + r;
        const bool ok = rr < c.rows; /* rows past the sequence: zeros */
        const uint16_t *src = qg;
        if (ok) {
            const int64_t i = row_pos(rr, a.pack_g);
            const int h = c.h_base + (int)(rr - i * c.G);
            src = qg + c.bq * p.q_batch_stride + (c.q_start + i) * p.q_row_stride + (int64_t)h * p.q_head_stride +
                  ch * 8;
        }
        ptx::cp_async_16(sQ + unit_smem_offset<PC>(u), src, ok);
    }
}

/* ---- kVarLeanAddr loads. The chunks a thread copies in one tile lie on NR
 * distinct rows (pass k: row + (k*QS) % R, chunk + PC * ((k*QS) / R)), so
 * one 64-bit pointer per distinct row, built by 64-bit adds of QS rows,
 * covers them all; the panel hop is a constant byte offset (an immediate of
 * the LDGSTS). No 64-bit multiply per chunk, no per-chunk stride reloads.
 * from_regs: the prologue, where kb0/vb0 are still in registers. */
template <class S_, class Sel, class FromRegs>
__device__ inline void load_kv_lean(const fc_fwd_params &p, const KvAddr &ka, const Smem &sm, int n,
                                             int stage, Sel, FromRegs)
{
    constexpr int BN = S_::BN, HD = S_::HD, NT = S_::NT, PC = S_::PC, QS = pass_rows<S_>();
    /* unit tid's row, chunk, smem offset: from a fresh %tid.x (S2R + a few
     * ALU ops), so that none of them is held across the loop */
    const int tid_ = FromRegs::value ? ka.tid : dev::tid_x_volatile();
    const int row0 = unit_row<BN, PC>(tid_);
    const int chunk0 = unit_chunk<BN, PC>(tid_);
    const uint32_t sK = sm.kv + stage * S_::STAGE_BYTES + unit_smem_offset<PC>(tid_);
    const uint32_t sV = sK + S_::KV_BYTES;
    constexpr int UNITS = BN * HD / 8;
    constexpr int NR = BN > QS ? BN / QS : 1; /* distinct row offsets of the passes */
    const int j0 = n * BN + row0;
    (void)chunk0; /* only the KV_BASE_IN_SMEM path uses it */
    constexpr bool DO_K = Sel::K, DO_V = Sel::V;
    const uint16_t *kp = nullptr, *vp = nullptr; /* unit tid, block n */
    if constexpr (S_::KV_BASE_IN_SMEM) {
        const uint16_t *kbase, *vbase;
        if constexpr (FromRegs::value) {
            kbase = ka.kb0;
            vbase = ka.vb0;
        } else { /* (volatile loads: only the ones used) */
            if constexpr (DO_K) kbase = (const uint16_t *)dev::lds64(sm.base);
            if constexpr (DO_V) vbase = (const uint16_t *)dev::lds64(sm.base + 8);
        }
        if constexpr (DO_K) kp = kbase + ((int64_t)j0 * p.k_row_stride + chunk0 * 8);
        if constexpr (DO_V) vp = vbase + ((int64_t)j0 * p.v_row_stride + chunk0 * 8);
    } else {
        if constexpr (DO_K) kp = ka.kt + (int64_t)n * BN * p.k_row_stride;
        if constexpr (DO_V) vp = ka.vt + (int64_t)n * BN * p.v_row_stride;
    }
    const uint16_t *kr[NR], *vr[NR];
    bool okr[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        okr[r] = j0 + r * QS < ka.sk;
        if constexpr (DO_K) kr[r] = r == 0 ? kp : kr[r - 1] + (int64_t)QS * p.k_row_stride;
        if constexpr (DO_V) vr[r] = r == 0 ? vp : vr[r - 1] + (int64_t)QS * p.v_row_stride;
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        if constexpr (DO_K) kr[r] = okr[r] ? kr[r] : (const uint16_t *)p.k;
        if constexpr (DO_V) vr[r] = okr[r] ? vr[r] : (const uint16_t *)p.v;
    }
#pragma unroll
    for (int k = 0; k < (UNITS + NT - 1) / NT; ++k) {
        if (UNITS % NT == 0 || tid_ + k * NT < UNITS) {
            const int DR = (k * QS) % BN, DC = ((k * QS) / BN) * PC;
            const int r = DR / QS;
            if constexpr (DO_K) ptx::cp_async_16(sK + k * NT * 16, kr[r] + DC * 8, okr[r]);
            if constexpr (DO_V) ptx::cp_async_16(sV + k * NT * 16, vr[r] + DC * 8, okr[r]);
        }
    }
}

/* Q with G == 1 (else the general load_q): row rr = r0 + r is query
 * position r0 + r of head h_base. */
template <class S_>
__device__ inline void load_q_lean(const fc_sm80_args &a, const TileCoords &c, uint32_t sQ, int tid)
{
    constexpr int BM = S_::BM, HD = S_::HD, NT = S_::NT, PC = S_::PC, QS = pass_rows<S_>();
    static_assert(BM % QS == 0 || QS % BM == 0, "Q load: passes must tile the rows");
    if (c.G != 1) {
        load_q<S_>(a, c, sQ, tid);
        return;
    }
    const fc_fwd_params &p = a.p;
    constexpr int UNITS = BM * HD / 8;
    constexpr int NRQ = BM > QS ? BM / QS : 1;
    const int qr0 = unit_row<BM, PC>(tid);
    const int qc0 = unit_chunk<BM, PC>(tid);
    const uint16_t *qg = (const uint16_t *)p.q;
    const uint16_t *q0 = qg + c.bq * p.q_batch_stride + (c.q_start + c.r0 + qr0) * p.q_row_stride +
                         (int64_t)c.h_base * p.q_head_stride + qc0 * 8;
    const uint16_t *qr[NRQ];
    bool okq[NRQ];
#pragma unroll
    for (int r = 0; r < NRQ; ++r) {
        okq[r] = c.r0 + qr0 + r * QS < c.rows; /* rows past the sequence: zeros */
        qr[r] = r == 0 ? q0 : qr[r - 1] + (int64_t)QS * p.q_row_stride;
    }
#pragma unroll
    for (int r = 0; r < NRQ; ++r) qr[r] = okq[r] ? qr[r] : qg;
    const uint32_t sq0 = sQ + unit_smem_offset<PC>(tid);
#pragma unroll
    for (int k = 0; k < UNITS / NT; ++k) {
        const int DR = (k * QS) % BM, DC = ((k * QS) / BM) * PC;
        const int r = DR / QS;
        ptx::cp_async_16(sq0 + k * NT * 16, qr[r] + DC * 8, okq[r]);
    }
}

/* ---- kVarPaged loads. Each of a thread's NR distinct rows per tile (as in
 * the lean loads) is key j of the sequence: row j % page_size of page
 * bt[j / page_size], one block-table read per row shared by K and V.
 * paged_fetch reads a tile ahead into ka.pg / ka.pw (page, row in page),
 * used by the next call: read where they were used, each tile's copies
 * waited a table read's latency (-14% against the dense kernel at B128
 * S32k, page 16, H200). The decode kernel runs at 2 warps per scheduler,
 * so its time follows its instruction count (ncu: +14% instructions, +14%
 * time against the dense kernel with the per-row 64-bit address math):
 * the planner keeps every K/V stride under 2^31 (plan.cu), so offsets are
 * 32x32->64-bit products, and rows past sk take page 0's address (always
 * valid) instead of a select. The ring loads tiles in order, one call per
 * tile. */
template <class S_>
__device__ __forceinline__ void paged_fetch(KvAddr &ka, int n)
{
    constexpr int BN = S_::BN, QS = kv_pass_rows<S_>(), NR = BN / QS;
    static_assert(NR <= 4, "paged K/V load: at most 4 rows per thread (KvAddr::pg)");
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        const int j = n * BN + ka.row0 + r * QS;
        const int pi = fc_fastdiv_div(j, ka.page);
        ka.pw[r] = j - pi * ka.page.d;
        ka.pg[r] = j < ka.sk ? __ldg(ka.bt + pi) : 0; /* past sk: the table is not read */
    }
}
template <class S_, class Sel>
__device__ inline void load_kv_paged(const fc_fwd_params &p, KvAddr &ka, const Smem &sm, int n, int stage, Sel)
{
    constexpr int BN = S_::BN, HD = S_::HD, NT = S_::NT, PC = S_::PC, QS = pass_rows<S_>();
    static_assert(BN % QS == 0, "paged K/V load: passes must tile the rows");
    static_assert(Sel::K && Sel::V && !S_::KV_SPLIT && !S_::EARLY, "paged K/V load: whole tiles, in order");
    constexpr int UNITS = BN * HD / 8;
    constexpr int NR = BN / QS;
    const uint32_t sK = sm.kv + stage * S_::STAGE_BYTES + ka.soff;
    const uint32_t sV = sK + S_::KV_BYTES;
    const int j0 = n * BN + ka.row0;
    const int32_t kbs = (int32_t)p.k_batch_stride, krs = (int32_t)p.k_row_stride;
    const int32_t vbs = (int32_t)p.v_batch_stride, vrs = (int32_t)p.v_row_stride;
    const uint16_t *kr[NR], *vr[NR];
    bool okr[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        okr[r] = j0 + r * QS < ka.sk;
        kr[r] = ka.kt + ((int64_t)ka.pg[r] * kbs + (int64_t)ka.pw[r] * krs);
        vr[r] = ka.vt + ((int64_t)ka.pg[r] * vbs + (int64_t)ka.pw[r] * vrs);
    }
#pragma unroll
    for (int k = 0; k < (UNITS + NT - 1) / NT; ++k) {
        if (UNITS % NT == 0 || ka.tid + k * NT < UNITS) {
            const int DR = (k * QS) % BN, DC = ((k * QS) / BN) * PC;
            const int r = DR / QS;
            ptx::cp_async_16(sK + k * NT * 16, kr[r] + DC * 8, okr[r]);
            ptx::cp_async_16(sV + k * NT * 16, vr[r] + DC * 8, okr[r]);
        }
    }
    paged_fetch<S_>(ka, n + 1);
}

/* kVarKv8 rows' loads (loads_kv8.cuh). */
template <class S_>
__device__ inline void load_kv8(const fc_fwd_params &p, KvAddr &ka, const Smem &sm, int n, int stage);

/* The loads a kernel instance issues: FP8, paged, lean or the general ones. */
template <class S_, class Sel, class FromRegs>
__device__ inline void kv_load(const fc_fwd_params &p, KvAddr &ka, const Smem &sm, int n, int stage,
                                        Sel sel, FromRegs from_regs)
{
    if constexpr (S_::KV8)
        load_kv8<S_>(p, ka, sm, n, stage);
    else if constexpr (S_::PAGED)
        load_kv_paged<S_>(p, ka, sm, n, stage, sel);
    else if constexpr (S_::LEAN_ADDR)
        load_kv_lean<S_>(p, ka, sm, n, stage, sel, from_regs);
    else
        load_kv<S_>(p, ka, sm, n, stage, sel);
}
template <class S_>
__device__ inline void q_load(const fc_sm80_args &a, const TileCoords &c, uint32_t sQ, int tid)
{
    if constexpr (S_::LEAN_ADDR)
        load_q_lean<S_>(a, c, sQ, tid);
    else
        load_q<S_>(a, c, sQ, tid);
}

/* TMA (thread 0 only): the K or V tile of block n into the buffer at dst as
 * ONE box, completing on bar. Map dims {32, rows, HD/32 panels, heads_kv,
 * batch} with the panel dim's stride 64 bytes (plan.cu; varlen: rows are
 * the packed total, batch 1), box {32, BN, HD/32, 1, 1}: it lands panel by
 * panel, BN rows of 64 bytes each, i.e. the PC 4 layout. One box, not one
 * per panel: 8 boxes measured 10% slower (thread 0's warp held up issuing
 * them). Keys past the tensor's rows are zero-filled; keys past a varlen
 * sequence are the next sequence's: masked to -inf like every key >= sk,
 * and their V rows zeroed before P V (mainloop.cuh). */
template <class S_>
__device__ inline void tma_tile(const TileCoords &c, int h_kv, int n, const CUtensorMap *map, uint32_t dst,
                                         uint32_t bar)
{
    fc90::mbar_arrive_expect_tx(bar, S_::KV_BYTES);
    fc90::tma_load_5d(dst, map, bar, 0, (int)c.k_start + n * S_::BN, 0, h_kv, (int)c.bk);
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_LOADS_CUH */
