/*
 * fwd_kernel.cuh -- the Hopper (sm_90a) attention forward kernel.
 *
 * Persistent, warp-specialised CTA (one per SM):
 *   warpgroup 0      producer: setmaxnreg.dec; one thread issues TMA loads:
 *                    Q once per tile, K and V through a `stages`-deep ring of
 *                    full/empty mbarriers (phase parity).
 *   warpgroups 1..W  consumers, 64 query rows each: setmaxnreg.inc; per KV
 *                    block S = Q K^T (wgmma SS, fp32), mask only on blocks
 *                    that straddle the band / the key tail, online softmax in
 *                    registers (exp2, scale*log2e folded in one FMA), P packed
 *                    in registers as the A fragment of O += P V (wgmma RS).
 * Tiles (m_block, batch*head, split) are handed out statically: CTA i takes
 * tiles i, i+grid, ...; or, when p.tile_ctr is set (causal with more tiles
 * than CTAs: tiles of unequal length), dynamically from an atomic counter.
 * Non-causal in m-fastest order (a head's K/V stays in L2 while its row
 * blocks run), causal longest-first within L2 sections of heads. KV blocks are visited from high to low, so the masked diagonal /
 * tail blocks come first.
 *
 * Overlap (cfg.overlap): the consumer issues S_{j} = Q K_j^T and
 * O += P_{j-1} V_{j-1} back to back, waits only for S_j, runs the softmax of
 * block j while the P.V GEMM is on the tensor cores, then waits for it.
 * Pingpong (cfg.pingpong): the consumer warpgroups take turns issuing GEMMs
 * on named barriers, so one's softmax overlaps the other's GEMMs.
 * Both are turned off by building with -DFC_SM90_SIMPLE=1 (for bisecting).
 *
 * Shared memory (from a 1024-aligned base):
 *   Q    [qbuf][panel][block_m rows][swz bytes]   (a tile's own Q buffer is
 *                                                 reused as its O staging)
 *   K    [stage][panel][block_n rows][swz bytes]
 *   V    [stage][panel][block_n rows][swz bytes]
 *   bars Q_full[2], Q_empty[2], K_full[st], K_empty[st], V_full[st], V_empty[st]
 * With 2 Q buffers (cfg.qbufs) the producer loads tile i+1's Q while tile i
 * runs; with 1 it waits until tile i's epilogue has released the buffer.
 * Epilogue: each consumer warpgroup stages its 64 rows of O (16-bit) in its
 * rows of the tile's Q buffer and stores them with one TMA store per panel
 * (p.o_tma), or with 16-byte generic stores where TMA cannot (varlen, odd
 * layouts); split-KV partials (fp32) and LSE go straight from registers.
 * A "panel" is swz/2 head_dim columns: rows of one swizzle span, which is
 * what one TMA box and one wgmma descriptor row cover.
 */
#ifndef FC_SM90_FWD_KERNEL_CUH
#define FC_SM90_FWD_KERNEL_CUH

#include <stdio.h>

#include "cuda/common/pdl.cuh"
#include "cuda/common/smem_optin.cuh"
#include "cuda/common/mask_mode.h"
#include "cuda/sm90/ptx_sm90.cuh"
#include "cuda/sm90/sm90.h"
#include "cuda/sm90/tail_split.h"
#include "cuda/sm90/tiles.cuh"

#ifndef FC_SM90_SIMPLE
#define FC_SM90_SIMPLE 0
#endif
#ifndef FC_SM90_TRACE
#define FC_SM90_TRACE 0
#endif

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

static constexpr fc_sm90_tile kTiles[] = {FC_SM90_TILE_TABLE};
static_assert(sizeof kTiles / sizeof kTiles[0] == FC_SM90_NUM_TILES, "FC_SM90_NUM_TILES = the table's rows");

/* Named barrier ids (0 is __syncthreads). */
enum : uint32_t {
    kBarSched = 1, /* + consumer index: pingpong turn of that warpgroup (256 threads) */
    kBarEpi = 8,   /* + consumer index: epilogue of one warpgroup (128 threads)        */
    kBarVz = 12    /* + consumer index: V tail rows zeroed (zero_v_tail, 128 threads)  */
};

template <int kCfg, bool kTail = false> struct Cfg {
    static constexpr fc_sm90_tile T = kTiles[kCfg];
    static constexpr int D = T.head_dim;
    static constexpr int BM = T.block_m;
    static constexpr int BN = T.block_n;
    static constexpr int WG = T.wgs;
    static constexpr int ST = T.stages;
    static constexpr int QB = T.qbufs;               /* Q buffers (1 or 2)           */
    static constexpr int SW = T.swz;                 /* bytes per panel row          */
    static constexpr int PW = SW / 2;                /* elements per panel row       */
    static constexpr int PANELS = D / PW;
    static constexpr int KSTEPS = D / 16;            /* k16 steps of S = Q K^T       */
    static constexpr int KPP = SW / 32;              /* k16 steps within one panel   */
    static constexpr int PVSTEPS = BN / 16;          /* k16 steps of O += P V        */
    static constexpr bool PP = T.pingpong && T.wgs > 1 && !FC_SM90_SIMPLE;
    static constexpr bool OV = T.overlap && !FC_SM90_SIMPLE;
    static constexpr int THREADS = 128 * (WG + 1);
    static constexpr int CONSUMERS = 128 * WG;
    static constexpr int KVS = T.kvsplit;            /* warpgroups sharing one tile's KV blocks */
    /* The tail-balanced instance (plan.cu tail_on says when; tiles.cuh
     * FC_SM90_TAIL_ROW which rows can). Its own instance because the work
     * split and merge code cost the main loop of every other kernel: in
     * one shared instance the d128 loop gained 4 R2UR before its GEMMs
     * (uniform-register pressure) and s512-d64 (row 7) lost 1.5% (H100,
     * run 63). */
    static constexpr bool TAIL = kTail && FC_SM90_TAIL_ROW(T);
    static constexpr int KV_CONSUMERS = CONSUMERS / KVS; /* threads that read one K/V block */
    static constexpr uint32_t Q_BYTES = BM * D * 2;
    static constexpr uint32_t KV_BYTES = BN * D * 2;
    static constexpr uint32_t OFF_Q = 0;
    static constexpr uint32_t OFF_K = OFF_Q + QB * Q_BYTES;
    static constexpr uint32_t OFF_V = OFF_K + ST * KV_BYTES;
    static constexpr uint32_t OFF_MERGE = OFF_V + ST * KV_BYTES;
    static constexpr uint32_t OFF_BAR = OFF_MERGE + FC_SM90_MERGE_BYTES(T);
    static constexpr int SMEM = FC_SM90_SMEM_BYTES(T);

    /* 2 (3, 4) consumer warpgroups: 384 (512, 640) threads enter with 168
     * (128, 96) registers and move them with setmaxnreg (40/232, 40/152,
     * 32/112: tiles.cuh).
     * 1 consumer warpgroup: 256 threads may use up to 255 registers each
     * from the start (65536/256), so no setmaxnreg is needed. */
    static_assert(WG >= 1 && WG <= 4, "1 to 4 consumer warpgroups");
    static_assert(WG + 1 <= FC_SM90_TRACE_ROLES, "a trace role per warpgroup (sm90.h)");
    static constexpr int CTAS = T.ctas;             /* CTAs per SM (launch bounds) */
    static constexpr bool SETMAXNREG = WG >= 2 || CTAS > 1;
    static constexpr int PRODUCER_REGS = FC_SM90_PRODUCER_REGS(WG);
    static constexpr int CONSUMER_REGS = FC_SM90_CONSUMER_REGS(WG, CTAS);
    static_assert(CTAS == 1 || CTAS == 2, "1 or 2 CTAs per SM");
    static_assert(!SETMAXNREG || 128 * PRODUCER_REGS + CONSUMERS * CONSUMER_REGS <= THREADS * FC_SM90_ENTRY_REGS(WG, CTAS),
                  "setmaxnreg split must fit the CTA's share of the register file");
    static_assert(CTAS * (SMEM + 1024) <= 233472, "CTAS CTAs (+1 KB reserved each) in 228 KB of smem");
    static_assert(BM * KVS == 64 * WG, "block_m = 64 rows per consumer warpgroup (per kvsplit pair)");
    static_assert(KVS == 1 || (KVS == 2 && WG == 2 && !PP),
                  "kvsplit: two warpgroups on one 64-row tile, no pingpong");
    static_assert(D % PW == 0 && D % 16 == 0, "head_dim: whole panels and k16 steps");
    static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "block_n: wgmma N and TMA box");
    static_assert(BM <= 256, "TMA box rows <= 256");
    static_assert((BM * SW) % 1024 == 0 && (BN * SW) % 1024 == 0,
                  "every panel must start on a 1024-byte swizzle repeat");
    static_assert(QB == 1 || QB == 2, "1 or 2 Q buffers");
    static_assert(88 + 32 * ST <= FC_SM90_BARRIER_BYTES, "barrier area (Bars below)");
    static_assert(OFF_BAR + FC_SM90_BARRIER_BYTES + 1024 == (uint32_t)SMEM, "layout = table");
    static_assert(SMEM <= 232448, "227 KB: the sm_90 dynamic shared memory limit");
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

/* XOR swizzle of a byte offset inside a 1024-aligned region: 16-byte chunk
 * bits [4, 4+b) ^= row bits [7, 7+b), b = 3 for 128B, 2 for 64B (the pattern
 * TMA writes and wgmma reads). */
template <int kSwz> __host__ __device__ __forceinline__ uint32_t swz(uint32_t off)
{
    return off ^ (((off >> 7) & (kSwz / 16 - 1)) << 4);
}

/* ---- key limits ------------------------------------------------------------ */
/* Visible keys of query row r (within its sequence) are [key_lo, key_hi):
 * exactly fc_key_visible() intersected with [0, sk). */
__host__ __device__ __forceinline__ int key_hi(int r, int sq, int sk, int wr)
{
    long long hi = sk;
    if (wr >= 0) {
        long long d = (long long)r + sk - sq + wr + 1;
        hi = d < hi ? d : hi;
    }
    return hi < 0 ? 0 : (int)hi;
}
__host__ __device__ __forceinline__ int key_lo(int r, int sq, int sk, int wl)
{
    if (wl < 0) return 0;
    long long lo = (long long)r + sk - sq - wl;
    return lo < 0 ? 0 : (lo > sk ? sk : (int)lo);
}

/* ---- tile decode ------------------------------------------------------------- */
#ifdef __CUDA_ARCH__
#define FC90_LDG(ptr) __ldg(ptr)
#else
#define FC90_LDG(ptr) (*(ptr))
#endif

/* Tile rows R are query positions s (R = s), or with pack-GQA the pairs
 * (s, i) of a position and one of the ratio query heads sharing a KV head
 * (R = s * ratio + i, ratio = 1 << pack_shift). The "head unit" hu is the
 * query head, or with pack-GQA the KV head. */
struct Tile {
    int m_block, b, hu, bu, split; /* bu = b * head_units + hu */
    int hk;                   /* KV head */
    int q_off, k_off, sq, sk; /* sequence offsets (varlen) and lengths */
    int m0;                   /* first tile row R */
    int n_lo, n_hi;           /* KV blocks of this split: [n_lo, n_hi) */
    int hi_first, lo_last;    /* key_hi(first row), key_lo(last real row) */
    bool rows;                /* the tile has query rows in its sequence */
};

/* Query position and query head of tile row R. */
__host__ __device__ __forceinline__ int row_pos(const fc_sm90_params &p, int R) { return R >> p.pack_shift; }
__host__ __device__ __forceinline__ int row_head(const fc_sm90_params &p, const Tile &g, int R)
{
    return (g.hu << p.pack_shift) + (R & ((1 << p.pack_shift) - 1));
}

/* Host-callable too (the scheduler/mask logic is checked on the host). */
template <class C> __host__ __device__ __forceinline__ void decode_tile(const fc_sm90_params &p, int t, Tile &g)
{
    int u;
    if (p.longest_first) {
        /* Sections of l2_group units; inside one, m_block decreasing (longest
         * first for a causal mask), units fastest. */
        const int sec = fc_fastdiv_div(t, p.l2_section);
        const int within = t - sec * p.l2_section.d;
        const int left = p.num_units - sec * p.l2_group.d;
        int q;
        if (left < p.l2_group.d) { /* the last, short section: a plain division */
            q = within / left;
            u = sec * p.l2_group.d + (within - q * left);
        } else {
            q = fc_fastdiv_div(within, p.l2_group);
            u = sec * p.l2_group.d + (within - q * p.l2_group.d);
        }
        g.m_block = p.num_m_blocks.d - 1 - q;
    } else {
        u = fc_fastdiv_div(t, p.num_m_blocks);
        g.m_block = t - u * p.num_m_blocks.d;
    }
    g.bu = fc_fastdiv_div(u, p.num_splits);
    g.split = u - g.bu * p.num_splits.d;
    g.b = fc_fastdiv_div(g.bu, p.head_units);
    g.hu = g.bu - g.b * p.head_units.d;
    g.hk = fc_fastdiv_div(g.hu << p.pack_shift, p.hq_per_kv);
    if (p.cu_q) {
        g.q_off = FC90_LDG(p.cu_q + g.b);
        g.sq = FC90_LDG(p.cu_q + g.b + 1) - g.q_off;
        g.k_off = FC90_LDG(p.cu_k + g.b);
        g.sk = FC90_LDG(p.cu_k + g.b + 1) - g.k_off;
    } else {
        g.q_off = 0;
        g.sq = p.seqlen_q;
        g.k_off = 0;
        g.sk = p.seqlen_k;
    }
    g.m0 = g.m_block * C::BM;
    const int rows_total = g.sq << p.pack_shift;
    g.rows = g.m0 < rows_total;
    g.n_lo = g.n_hi = 0;
    g.hi_first = g.lo_last = 0;
    if (!g.rows) return;
    /* The band is monotone in the position, and the position in R. */
    const int first = row_pos(p, g.m0);
    const int last = row_pos(p, (g.m0 + C::BM < rows_total ? g.m0 + C::BM : rows_total) - 1);
    const int hi = key_hi(last, g.sq, g.sk, p.window_right);   /* max over rows */
    const int lo = key_lo(first, g.sq, g.sk, p.window_left);   /* min over rows */
    g.hi_first = key_hi(first, g.sq, g.sk, p.window_right);    /* min over rows */
    g.lo_last = key_lo(last, g.sq, g.sk, p.window_left);       /* max over rows */
    if (hi <= lo) return; /* no row of the tile sees a key */
    const int n_min = lo / C::BN;
    const int n_max = (hi + C::BN - 1) / C::BN;
    const int per = fc_fastdiv_div(n_max - n_min + p.num_splits.d - 1, p.num_splits);
    g.n_lo = n_min + g.split * per;
    g.n_hi = g.n_lo + per < n_max ? g.n_lo + per : n_max;
    if (g.n_hi <= g.n_lo) g.n_lo = g.n_hi = 0; /* a split past the end: empty */
    FC90_ASSERT(g.n_lo >= 0 && g.n_lo <= g.n_hi && g.n_hi * C::BN < g.sk + C::BN);
}

/* Tail balancing (fc_sm90_params.tail_first): CTA c's share of the tail's
 * KV blocks, [lo, hi) in tail-block numbers (tail_split.h has the
 * partition; tests/test_tail_split.c checks it on the CPU). */
__device__ __forceinline__ void tail_range(const fc_sm90_params &p, int c, int &lo, int &hi)
{
    lo = fc_tail_lo(c, p.tail_q, p.tail_rem, p.tail_grid);
    hi = fc_tail_lo(c + 1, p.tail_q, p.tail_rem, p.tail_grid);
}

/* Work item s of this CTA (t: its static tile index blockIdx.x + s * grid,
 * or the dynamic scheduler's), false when it has none left. In the tail-
 * balanced instance (static schedule only), whole tiles below tail_first,
 * then at most two parts of tail tiles (a share of at most nb blocks spans
 * at most two). */
template <class C> __device__ __forceinline__ bool work_item(const fc_sm90_params &p, int t, int s, Tile &g)
{
    if (!C::TAIL || t < p.tail_first) {
        if (t >= p.num_tiles) return false;
        decode_tile<C>(p, t, g);
        return true;
    }
    int i, n_lo, n_hi; /* the CTA's part s - tail_rounds (0 or 1): tail tile i, blocks [n_lo, n_hi) */
    if (!fc_tail_part((int)blockIdx.x, s - p.tail_rounds, p.tail_q, p.tail_rem, p.tail_grid, p.tail_nb, &i, &n_lo,
                      &n_hi))
        return false;
    decode_tile<C>(p, p.tail_first + i, g);
    /* Every tile has the KV range [0, nb) (plan.cu tail_on: no band, no varlen). */
    FC90_ASSERT(g.n_lo == 0 && g.n_hi == p.tail_nb.d);
    g.n_lo = n_lo;
    g.n_hi = n_hi;
    return true;
}

/* Tail balancing: the tail tile number of g and this CTA's part slot in it,
 * or -1 when g is not a tile this CTA shares with others. Derived from the
 * tile's coordinates (held for the epilogue anyway) rather than carried
 * through the main loop in registers, where d256 has none to spare. */
template <class C> __device__ __forceinline__ int tail_part(const fc_sm90_params &p, const Tile &g, int &slot)
{
    const int m_block = (int)((unsigned)g.m0 / C::BM);
    const int i = (g.b * p.head_units.d + g.hu) * p.num_m_blocks.d + m_block - p.tail_first;
    if (i < 0) return -1;
    slot = fc_tail_slot((int)blockIdx.x, i, p.tail_q, p.tail_rem, p.tail_grid, p.tail_nb);
    return slot < 0 ? -1 : i;
}

/* ---- barriers ---------------------------------------------------------------- */
template <class C> struct Bars {
    uint32_t base;
    /* Two slots each for the Q barriers whatever QB is (b < QB used). */
    __device__ __forceinline__ uint32_t q_full(int b) const { return base + 8 * b; }
    __device__ __forceinline__ uint32_t q_empty(int b) const { return base + 16 + 8 * b; }
    __device__ __forceinline__ uint32_t k_full(int s) const { return base + 32 + 8 * s; }
    __device__ __forceinline__ uint32_t k_empty(int s) const { return base + 32 + 8 * (C::ST + s); }
    __device__ __forceinline__ uint32_t v_full(int s) const { return base + 32 + 8 * (2 * C::ST + s); }
    __device__ __forceinline__ uint32_t v_empty(int s) const { return base + 32 + 8 * (3 * C::ST + s); }
    /* Dynamic scheduler: a 2-slot ring of tile indices, producer -> consumers. */
    __device__ __forceinline__ uint32_t t_full(int i) const { return base + 32 + 32 * C::ST + 8 * i; }
    __device__ __forceinline__ uint32_t t_empty(int i) const { return base + 48 + 32 * C::ST + 8 * i; }
    __device__ __forceinline__ uint32_t t_slot(int i) const { return base + 64 + 32 * C::ST + 4 * i; }
    /* kvsplit: the second warpgroup's partials in the merge area (full), and
     * read by the first (empty). */
    __device__ __forceinline__ uint32_t m_full() const { return base + 72 + 32 * C::ST; }
    __device__ __forceinline__ uint32_t m_empty() const { return base + 80 + 32 * C::ST; }
    /* Tail balancing: the arrival count a warpgroup's thread 0 read, for
     * the other 127 threads. */
    __device__ __forceinline__ uint32_t t_flag(int cw) const { return base + 88 + 32 * C::ST + 4 * cw; }
    static_assert(88 + 32 * C::ST + 4 * 3 <= FC_SM90_BARRIER_BYTES, "barrier area");
};

/* ---- producer ------------------------------------------------------------------ */
/* K or V block: map dims {D, rows, heads_kv, batch}, box {PW, BN, 1, 1}. */
template <class C>
__device__ __forceinline__ void load_kv(const CUtensorMap *map, uint32_t dst, uint32_t bar, int row, int head,
                                        int batch)
{
#pragma unroll
    for (int pn = 0; pn < C::PANELS; ++pn)
        tma_load_4d(dst + pn * C::BN * C::SW, map, bar, pn * C::PW, row, head, batch);
}

/* Q tile: map dims {D, ratio, heads_q/ratio, rows, batch}, box {PW, ratio,
 * 1, BM/ratio, 1} (ratio = 1 without pack-GQA): the box lands as rows
 * s_local*ratio + i, i.e. tile row R - m0. */
template <class C>
__device__ __forceinline__ void load_q(const CUtensorMap *map, uint32_t dst, uint32_t bar, int pos, int hu,
                                       int batch)
{
#pragma unroll
    for (int pn = 0; pn < C::PANELS; ++pn)
        tma_load_5d(dst + pn * C::BM * C::SW, map, bar, pn * C::PW, 0, hu, pos, batch);
}

/* Runs on one thread. The K/V ring position (stage, phase) advances once per
 * KV block in exactly the order the consumers consume them. */
template <class C> __device__ void producer(const fc_sm90_params &p, uint32_t base, const Bars<C> &bars)
{
    int stage = 0;
    uint32_t phase = 0;
    uint32_t q_iter = 0;
    for (int k = 0;; ++k) {
        int t;
        if (p.tile_ctr) {
            /* Dynamic: the first wave is blockIdx.x, later tiles come from the
             * counter in the same (longest-first) order, so whichever CTA is
             * free first takes the next longest tile. Handed to the consumers
             * through slot k & 1 (the arrive releases the store). */
            t = k == 0 ? (int)blockIdx.x : atomicAdd(p.tile_ctr, 1) + (int)gridDim.x;
            FC90_WAIT(bars.t_empty(k & 1), ((k >> 1) & 1) ^ 1);
            sts32(bars.t_slot(k & 1), (uint32_t)t);
            mbar_arrive(bars.t_full(k & 1));
        } else {
            t = (int)blockIdx.x + k * (int)gridDim.x;
        }
        Tile g;
        if (!work_item<C>(p, t, k, g)) break;
        trace(p, 0, k, 0, true);
        if (!g.rows || g.n_hi <= g.n_lo) continue; /* consumers write it without loads */
        const int hk = g.hk;
        const int bq = p.cu_q ? 0 : g.b;
        const int bk = p.cu_k ? 0 : g.b;
        /* Q tile number q_iter goes to buffer q_iter % QB; its use number
         * q_iter / QB gives the phase parity. */
        const int qb = (int)(q_iter % C::QB);
        const uint32_t q_par = (q_iter / C::QB) & 1;
        if (C::QB == 2) {
            /* The other buffer: released by the tile before the current one,
             * so the next tile's Q is in flight while the current tile runs. */
            FC90_WAIT(bars.q_empty(qb), q_par ^ 1);
            mbar_arrive_expect_tx(bars.q_full(qb), C::Q_BYTES);
            load_q<C>(&p.tm_q, base + C::OFF_Q + qb * C::Q_BYTES, bars.q_full(qb), g.q_off + row_pos(p, g.m0),
                      g.hu, bq);
            ++q_iter;
        }
        for (int n = g.n_hi - 1; n >= g.n_lo; --n) {
            const int krow = g.k_off + n * C::BN;
            FC90_WAIT(bars.k_empty(stage), phase ^ 1);
            mbar_arrive_expect_tx(bars.k_full(stage), C::KV_BYTES);
            load_kv<C>(&p.tm_k, base + C::OFF_K + stage * C::KV_BYTES, bars.k_full(stage), krow, hk, bk);
            FC90_WAIT(bars.v_empty(stage), phase ^ 1);
            mbar_arrive_expect_tx(bars.v_full(stage), C::KV_BYTES);
            load_kv<C>(&p.tm_v, base + C::OFF_V + stage * C::KV_BYTES, bars.v_full(stage), krow, hk, bk);
            if (C::QB == 1 && n == g.n_hi - 1) {
                /* One Q buffer: Q after the first K and V, since the previous
                 * tile's epilogue may still use the buffer as O staging, and
                 * this way the first K/V of the tile stream in meanwhile. */
                FC90_WAIT(bars.q_empty(0), (q_iter & 1) ^ 1);
                mbar_arrive_expect_tx(bars.q_full(0), C::Q_BYTES);
                load_q<C>(&p.tm_q, base + C::OFF_Q, bars.q_full(0), g.q_off + row_pos(p, g.m0), g.hu, bq);
                ++q_iter;
            }
            if (n == g.n_hi - 1) trace(p, 0, k, 1, true); /* first K/V issued */
            if (++stage == C::ST) {
                stage = 0;
                phase ^= 1;
            }
        }
        trace(p, 0, k, 2, true); /* every load of the tile issued */
    }
}

/* ---- consumer pieces --------------------------------------------------------------- */
/* Per-thread view of the wgmma accumulator layout: warp w of the warpgroup
 * owns rows 16w..16w+15; a thread holds rows r and r+8 (r = 16w + lane/4) and,
 * in every 8-column group j, columns 8j + 2*(lane%4) + {0,1}:
 *   acc[4j+0], acc[4j+1] -> row r,   acc[4j+2], acc[4j+3] -> row r+8. */

template <class C, bool kBF16>
__device__ __forceinline__ void issue_s(float (&S)[C::BN / 2], uint32_t q_addr, uint32_t k_addr)
{
    const uint64_t dq = desc_kmajor<C::SW>(q_addr);
    const uint64_t dk = desc_kmajor<C::SW>(k_addr);
#pragma unroll
    for (int k = 0; k < C::KSTEPS; ++k) {
        const uint32_t in_row = (k % C::KPP) * 32; /* 16 elements = 32 bytes */
        const uint32_t oq = (k / C::KPP) * (C::BM * C::SW) + in_row;
        const uint32_t ok = (k / C::KPP) * (C::BN * C::SW) + in_row;
        /* k-step 0 overwrites S (scale-d 0, write-only operands): the
         * previous block's S is dead from here, not carried across. */
        if (k == 0) Wgmma<C::BN, kBF16>::ss0(S, dq + (oq >> 4), dk + (ok >> 4));
        else Wgmma<C::BN, kBF16>::ss(S, dq + (oq >> 4), dk + (ok >> 4), 1);
    }
}

template <class C, bool kBF16>
__device__ __forceinline__ void issue_pv(float (&O)[C::D / 2], const uint32_t (&P)[C::BN / 4],
                                         uint32_t v_addr)
{
    /* V is [kv][head_dim] in panels: N (head_dim) contiguous = MN-major; the
     * next panel of head_dim columns is block_n rows further (LBO). */
    const uint64_t dv = desc_mnmajor<C::SW>(v_addr, C::BN * C::SW);
#pragma unroll
    for (int k = 0; k < C::PVSTEPS; ++k)
        Wgmma<C::D, kBF16>::rs(O, P[4 * k], P[4 * k + 1], P[4 * k + 2], P[4 * k + 3],
                               dv + ((uint32_t)(k * 16 * C::SW) >> 4), 1);
}

/* Row statistics of the two rows a thread holds. */
struct RowState {
    float m[2];  /* running max of the (capped) scores, raw units */
    float l[2];  /* this thread's partial row sums (quad-reduced at the end) */
};

struct MaskRows {
    int lo[2], hi[2]; /* visible key range of the thread's two rows */
};

/* The exp2 shift of a row whose running max (raw score units) is m: m * c,
 * or 0 for a row with nothing visible yet (max -inf), so that
 * exp2(-inf * c - 0) = 0 instead of NaN. */
__device__ __forceinline__ float max_shift(float m, float c) { return m == neg_inf() ? 0.0f : m * c; }

/* Which blocks may need the softcap and mask code (mask_mode.h proves it per
 * call; fc_sm90_params.masks): none, a tile's first block only (the highest
 * KV block, where a causal diagonal lies), or any. */
enum MaskMode { kMaskNone = FC_MASKS_NONE, kMaskFirst = FC_MASKS_FIRST, kMaskAny = FC_MASKS_ANY };

/* Softcap, mask, online softmax of one S block in place (S becomes P in
 * fp32); returns the factors by which O must be rescaled. The softcap and
 * mask code is compiled in only where kMask says a block can need it. */
template <class C, bool kFirst, int kMask>
__device__ __forceinline__ void softmax_block(float (&S)[C::BN / 2], RowState &rs, float (&alpha)[2],
                                              const fc_sm90_params &p, bool masked, int col0,
                                              const MaskRows &mr)
{
    constexpr bool kMayMask = kMask == kMaskAny || (kMask == kMaskFirst && kFirst);
    FC90_ASSERT(kMayMask || !masked);
    if (kMask == kMaskAny && p.softcap_in != 0.0f) {
#pragma unroll
        for (int i = 0; i < C::BN / 2; ++i)
            S[i] = p.softcap_out * tanh_acc(S[i] * p.softcap_in);
    }
    if (kMayMask && masked) {
#pragma unroll
        for (int j = 0; j < C::BN / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = col0 + 8 * j + e;
                if (!(col >= mr.lo[0] && col < mr.hi[0])) S[4 * j + e] = neg_inf();
                if (!(col >= mr.lo[1] && col < mr.hi[1])) S[4 * j + 2 + e] = neg_inf();
            }
        }
    }
    float mx[2] = {S[0], S[2]};
#pragma unroll
    for (int j = 0; j < C::BN / 8; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(S[4 * j], S[4 * j + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(S[4 * j + 2], S[4 * j + 3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    const float c = p.scale_log2;
    float ms[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float mnew = kFirst ? mx[r] : fmaxf(rs.m[r], mx[r]);
        ms[r] = max_shift(mnew, c);
        alpha[r] = kFirst ? 1.0f : ex2(rs.m[r] * c - ms[r]);
        rs.m[r] = mnew;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < C::BN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            S[4 * j + e] = ex2(fmaf(S[4 * j + e], c, -ms[0]));
            S[4 * j + 2 + e] = ex2(fmaf(S[4 * j + 2 + e], c, -ms[1]));
            sum[0] += S[4 * j + e];
            sum[1] += S[4 * j + 2 + e];
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) rs.l[r] = kFirst ? sum[r] : rs.l[r] * alpha[r] + sum[r];
}

/* P (16-bit) as the A fragments of the RS wgmma: k16 slice k covers the
 * accumulator groups 2k and 2k+1, whose register order is exactly the
 * A-fragment order (row r cols 0-7, row r+8 cols 0-7, row r cols 8-15, ...). */
template <class C, bool kBF16>
__device__ __forceinline__ void convert_p(const float (&S)[C::BN / 2], uint32_t (&P)[C::BN / 4])
{
#pragma unroll
    for (int i = 0; i < C::BN / 4; ++i) P[i] = pack2<kBF16>(S[2 * i], S[2 * i + 1]);
}

template <class C> __device__ __forceinline__ void rescale_o(float (&O)[C::D / 2], const float (&alpha)[2])
{
#pragma unroll
    for (int j = 0; j < C::D / 8; ++j) {
        O[4 * j] *= alpha[0];
        O[4 * j + 1] *= alpha[0];
        O[4 * j + 2] *= alpha[1];
        O[4 * j + 3] *= alpha[1];
    }
}

/* Does block n need the element mask for any real row of the tile? The band
 * is monotone in the row, so the first row bounds key_hi and the last real
 * row bounds key_lo. */
template <class C> __host__ __device__ __forceinline__ bool block_masked(const Tile &g, int n)
{
    return n * C::BN + C::BN > g.hi_first || n * C::BN < g.lo_last;
}

/* Epilogue without TMA: the warpgroup's staged 16-bit rows (swizzled, in its
 * rows of the tile's Q buffer) to global memory in 16-byte row chunks, or
 * element by element when o's layout does not allow 16-byte stores. */
template <class C>
__device__ __forceinline__ void store_o_generic(const fc_sm90_params &p, const Tile &g, uint16_t *o16,
                                                const uint8_t *smem, uint32_t q_off, int rg, int etid)
{
    constexpr int CPR = C::D / 8;  /* 16-byte chunks per row */
    constexpr int CPP = C::PW / 8; /* 16-byte chunks per panel row */
#pragma unroll
    for (int it = 0; it < 64 * CPR / 128; ++it) {
        const int i = etid + 128 * it;
        const int lr = i / CPR;
        const int cc = i - lr * CPR;
        const int R = g.m0 + 64 * rg + lr;
        const int pos = row_pos(p, R);
        if (pos < g.sq) {
            const uint32_t off = q_off + (uint32_t)(cc / CPP) * (C::BM * C::SW) +
                                 (uint32_t)(64 * rg + lr) * C::SW + (uint32_t)(cc % CPP) * 16;
            const uint4 v = *reinterpret_cast<const uint4 *>(smem + swz<C::SW>(off));
            uint16_t *dst = o16 + (int64_t)(g.q_off + pos) * p.o_row_stride +
                            row_head(p, g, R) * p.o_head_stride + cc * 8;
            if (p.o_vec_ok) {
                *reinterpret_cast<uint4 *>(dst) = v;
            } else {
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    dst[2 * e] = (uint16_t)(w[e] & 0xffffu);
                    dst[2 * e + 1] = (uint16_t)(w[e] >> 16);
                }
            }
        }
    }
}

/* Tail balancing (work_item): this warpgroup's rows of a part of a split
 * tile. Its partials (unnormalised O, row maxima, the thread's row sums) go
 * to its slot, then it counts itself in the tile's arrivals. The last part
 * to arrive merges every part, its own included, from the workspace in part
 * order, so that the result is the same whichever CTA ends last, and
 * returns true: it stores the tile (rs and O hold the merged state). */
template <class C>
__device__ bool tail_merge(const fc_sm90_params &p, int part, int slot, const Bars<C> &bars, int cw, int tid,
                           RowState &rs, float (&O)[C::D / 2])
{
    /* float4 units per thread: O, then {m0, m1, l0, l1} (tail_split.h) */
    constexpr int U = FC_TAIL_THREAD_FLOATS(C::D) / 4;
    auto part_at = [&](int slot) {
        return reinterpret_cast<float4 *>(p.tail_ws) + ((int64_t)slot * C::WG + cw) * U * 128 + tid;
    };
    float4 *mine = part_at(slot);
#pragma unroll
    for (int u = 0; u < U - 1; ++u) mine[128 * u] = make_float4(O[4 * u], O[4 * u + 1], O[4 * u + 2], O[4 * u + 3]);
    mine[128 * (U - 1)] = make_float4(rs.m[0], rs.m[1], rs.l[0], rs.l[1]);
    __threadfence(); /* the partials before the count (every thread's) */
    bar_sync(kBarEpi + cw, 128);
    if (tid == 0) sts32(bars.t_flag(cw), (uint32_t)atomicAdd(p.tail_cnt + part * C::WG + cw, 1));
    bar_sync(kBarEpi + cw, 128);
    /* (through a shuffle: provably warp-uniform to the compiler, which else
     * treats the branches below as divergent, and with them the tile loop's
     * counters, and moves the main loop's wgmma descriptors through vector
     * registers, R2UR) */
    const int arrived = __shfl_sync(0xffffffffu, (int)lds32(bars.t_flag(cw)), 0);

    /* The tile's parts: f(c, lo) for each CTA c, in order, whose share
     * [lo, hi) meets the tile's blocks [t_lo, t_hi) (consecutive CTAs from
     * the first, fc_tail_first_cta; empty shares skipped). */
    const int t_lo = part * p.tail_nb.d, t_hi = t_lo + p.tail_nb.d;
    const int c0 = fc_tail_first_cta(part, p.tail_q, p.tail_rem, p.tail_grid, p.tail_nb, (int)gridDim.x);
    auto each_part = [&](auto &&f) {
        int lo, hi;
        for (int c = c0; c < (int)gridDim.x; ++c) {
            tail_range(p, c, lo, hi);
            if (lo >= t_hi) break;
            if (hi <= lo) continue;
            f(c, lo);
        }
    };
    /* CTA c's part of the tile (its share [c_lo, ...)). */
    auto src_of = [&](int c, int c_lo) { return part_at(fc_tail_part_slot(c, c_lo, t_lo)); };
    /* Pass 1: count the parts; the last to arrive takes the rows' maxima
     * over them. */
    int parts = 0;
    each_part([&](int, int) { ++parts; });
    if (arrived != parts - 1) return false;
    __threadfence();
    float mx[2] = {neg_inf(), neg_inf()};
    each_part([&](int c, int lo) {
        const float4 ml = __ldcg(src_of(c, lo) + 128 * (U - 1));
        mx[0] = fmaxf(mx[0], ml.x);
        mx[1] = fmaxf(mx[1], ml.y);
    });
    /* Pass 2, a few columns at a time (registers: the O being summed, not
     * every part's): sum_q O_q * 2^(m_q - max) in part order, and the row
     * sums likewise. */
    const float sc = p.scale_log2;
    const float ms[2] = {max_shift(mx[0], sc), max_shift(mx[1], sc)};
    constexpr int CH = C::D >= 192 ? 2 : 4; /* float4 units per pass over the parts */
    static_assert((U - 1) % CH == 0, "head_dim / 8 units in chunks");
#pragma unroll
    for (int r = 0; r < 2; ++r) rs.m[r] = mx[r], rs.l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < C::D / 2; ++i) O[i] = 0.0f;
#pragma unroll
    for (int u0 = 0; u0 < U - 1; u0 += CH) {
        each_part([&](int c, int lo) {
            const float4 *src = src_of(c, lo);
            const float4 ml = __ldcg(src + 128 * (U - 1));
            const float f0 = ex2(ml.x * sc - ms[0]), f1 = ex2(ml.y * sc - ms[1]);
            if (u0 == 0) {
                rs.l[0] += ml.z * f0;
                rs.l[1] += ml.w * f1;
            }
#pragma unroll
            for (int u = u0; u < u0 + CH; ++u) {
                const float4 v = __ldcg(src + 128 * u);
                O[4 * u] += v.x * f0;
                O[4 * u + 1] += v.y * f0;
                O[4 * u + 2] += v.z * f1;
                O[4 * u + 3] += v.w * f1;
            }
        });
    }
    return true;
}

/* ---- consumer -------------------------------------------------------------------- */
/* A GEMM round of a consumer warpgroup: with pingpong it waits for its turn,
 * issues, and hands the turn on; every warpgroup runs the same sequence of
 * rounds (tiles are shared by the CTA's warpgroups), so the turns carry over
 * from tile to tile. */
template <class C> __device__ __forceinline__ void round_begin(int cw)
{
    if (C::PP) bar_sync(kBarSched + cw, 256);
    wg_fence();
}
template <class C> __device__ __forceinline__ void round_end(int cw)
{
    wg_commit();
    if (C::PP) bar_arrive(kBarSched + (cw + 1) % C::WG, 256);
}

/* A tile's first S = Q K^T, in flight when this returns. With `real` false
 * (no tile left) it issues one k-step of it instead, without waiting for any
 * operand and with no pingpong turn (every warpgroup does the same), and the
 * result is dropped: a wgmma issued on one branch only leaves ptxas unable
 * to track the in-flight accumulator across the rotated loop, and it then
 * serialises every wgmma of the kernel (C7518) and spills. */
template <class C, bool kBF16>
__device__ __forceinline__ void issue_first_s(float (&S)[C::BN / 2], const Bars<C> &bars, uint32_t base,
                                              uint32_t q_addr, int qb, uint32_t q_par, int stage,
                                              uint32_t phase, int cw, bool real)
{
    if (!real) {
        wg_fence();
        Wgmma<C::BN, kBF16>::ss0(S, desc_kmajor<C::SW>(q_addr), desc_kmajor<C::SW>(base + C::OFF_K));
        wg_commit();
        return;
    }
    FC90_WAIT(bars.q_full(qb), q_par);
    FC90_WAIT(bars.k_full(stage), phase);
    round_begin<C>(cw);
    issue_s<C, kBF16>(S, q_addr, base + C::OFF_K + stage * C::KV_BYTES);
    round_end<C>(cw);
}

/* Varlen: the rows of a sequence's last key block past its end are the next
 * sequence's first keys (the TMA box runs on into them; it zero-fills only
 * past the packed tensor). Their probabilities are 0, but 0 x Inf is NaN
 * inside the P.V wgmma, so a non-finite value there would reach this
 * sequence's rows. Blocks are visited from high to low, so only a tile's
 * first block vb can be that block: once its S is done (before its
 * softmax; placed where it costs no register: 4 bytes spilled at d256
 * elsewhere), wait for its V and zero those rows (the any-block-mask
 * instance only: varlen always runs it). Every consumer warpgroup that
 * reads the block zeroes them itself (the same zeros, so no wait on another
 * warpgroup), then orders its generic writes before its wgmma's
 * async-proxy reads (fence.proxy.async, then its own barrier); the P.V's
 * own wait on the same phase then returns at once. Dense calls and blocks
 * that end inside their sequence skip it (a warpgroup-uniform test). The
 * stage is released only after this warpgroup's P.V, so no later TMA
 * write races the zeros. */
template <class C>
__device__ __forceinline__ void zero_v_tail(const fc_sm90_params &p, const Tile &g, int vb, const Bars<C> &bars,
                                            uint32_t base, int v_stage, uint32_t v_phase)
{
    const int r0 = g.sk - vb * C::BN; /* first row of the block past the sequence */
    if (!p.cu_k || r0 >= C::BN) return;
    FC90_WAIT(bars.v_full(v_stage), v_phase);
    /* A fresh %tid.x: nothing more kept live across the first block. */
    const uint32_t t = (uint32_t)fc::dev::tid_x_volatile();
    fc::dev::zero_rows_from<C::KV_BYTES, C::SW, C::BN, 128>(base + C::OFF_V + v_stage * C::KV_BYTES, r0, t & 127);
    fence_proxy_async();
    bar_sync(kBarVz + t / 128 - 1, 128); /* this consumer warpgroup */
}

/* O += P V for one block, waited for (the plain loop and the last block). */
template <class C, bool kBF16>
__device__ __forceinline__ void pv_round(float (&O)[C::D / 2], uint32_t (&P)[C::BN / 4], const Bars<C> &bars,
                                         uint32_t base, int v_stage, uint32_t v_phase, int cw)
{
    FC90_WAIT(bars.v_full(v_stage), v_phase);
    round_begin<C>(cw);
    issue_pv<C, kBF16>(O, P, base + C::OFF_V + v_stage * C::KV_BYTES);
    round_end<C>(cw);
    wg_wait<0>();
    fence_regs(O);
    fence_regs(P);
    mbar_arrive(bars.v_empty(v_stage));
}

/* A tile whose rows see no key (or a split past the end of the band): O = 0
 * and LSE = -inf, straight from registers (no staging: the Q buffers may
 * hold other tiles' Q). Branch-free on purpose: a thread whose row lies past
 * the sequence writes the same zeros to the tile's last row instead (the
 * tile has one: it has rows), and every lane of a quad writes its rows' LSE.
 * A thread-dependent branch here, inside next_tile's loop, makes the
 * compiler treat the tile loop's counters as divergent, and every wgmma
 * descriptor of the main loop then goes through vector registers (R2UR). */
template <class C>
__device__ __forceinline__ void write_empty_tile(const fc_sm90_params &p, const Tile &g, int row_wg, int col_t)
{
    const int last = (g.sq << p.pack_shift) - 1; /* the last tile row R in the sequence */
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int R = min(g.m0 + row_wg + 8 * r, last);
        const int pos = row_pos(p, R);
        const int head = row_head(p, g, R);
        if (p.num_splits.d > 1) {
            const int64_t plane = (((int64_t)g.split * p.batch + g.b) * p.heads_q + head) * p.seqlen_q + pos;
            float *dst = p.o_accum + plane * C::D + col_t;
#pragma unroll
            for (int j = 0; j < C::D / 8; ++j) *reinterpret_cast<float2 *>(dst + 8 * j) = make_float2(0.0f, 0.0f);
            p.lse_accum[plane] = neg_inf();
        } else {
            if (p.lse)
                p.lse[g.b * p.lse_batch_stride + head * p.lse_head_stride +
                      (int64_t)(g.q_off + pos) * p.lse_row_stride] = neg_inf();
            uint16_t *dst = reinterpret_cast<uint16_t *>(p.o) + g.b * p.o_batch_stride +
                            (int64_t)(g.q_off + pos) * p.o_row_stride + head * p.o_head_stride + col_t;
#pragma unroll
            for (int j = 0; j < C::D / 8; ++j) {
                dst[8 * j] = 0;
                dst[8 * j + 1] = 0;
            }
        }
    }
}

/* The CTA's next tile with KV blocks to visit; tiles without query rows are
 * skipped and tiles without KV blocks finished on the way (write_empty_tile),
 * as the producer skips both. slot counts the scheduler's hand-outs; k is
 * the returned tile's (for trace stamps). False when none is left. */
template <class C>
__device__ __forceinline__ bool next_tile(const fc_sm90_params &p, const Bars<C> &bars, int &slot, Tile &g, int &k,
                                          int row_wg, int col_t)
{
    for (;;) {
        const int s = slot++;
        int t;
        if (p.tile_ctr) {
            /* The producer's choice (see producer); the read comes before our
             * arrive on the slot's empty barrier. */
            FC90_WAIT(bars.t_full(s & 1), (s >> 1) & 1);
            t = (int)lds32(bars.t_slot(s & 1));
            mbar_arrive(bars.t_empty(s & 1));
        } else {
            t = (int)blockIdx.x + s * (int)gridDim.x;
        }
        if (!work_item<C>(p, t, s, g)) return false;
        if (!g.rows) continue;
        if (g.n_hi <= g.n_lo) {
            write_empty_tile<C>(p, g, row_wg, col_t);
            continue;
        }
        k = s;
        return true;
    }
}


/* The tile loop is rotated: a tile's first S = Q K^T is issued before the
 * loop for the first tile, and for every later one by the previous tile's
 * epilogue, so that (2 Q buffers) it runs on the tensor cores while the
 * previous tile's O is normalised, stored and the tile ends. S0 is thus in
 * flight on every edge into the loop head, which keeps ptxas to one register
 * assignment for it and no wgmma serialisation (docs/perf/notes-sm90.md). */
template <class C, bool kBF16, bool kRotate, int kMask>
__device__ void consumer(const fc_sm90_params &p, int cw, uint32_t base, uint8_t *smem, const Bars<C> &bars)
{
    /* Rotated tile loop (above) with 2 Q buffers and kRotate; otherwise a
     * tile's first S is issued at the loop head (the plain order), which is
     * what one tile per CTA wants (plan.cu: choose_rotate). */
    constexpr bool ROT = kRotate && FC_SM90_CAN_ROTATE(C::T);
    const int tid = threadIdx.x - 128 * (cw + 1); /* 0..127 within the warpgroup */
    const int warp = tid >> 5;
    const int lane = tid & 31;
    /* kvsplit: warpgroup cw computes the tile's rows 64*rg.. over every
     * KVS-th KV block from the kv-th; otherwise rg = cw and kv = 0. */
    const int rg = cw / C::KVS;
    const int kv = cw % C::KVS;
    const int row_wg = 64 * rg + 16 * warp + (lane >> 2); /* tile row of acc rows r (and r+8) */
    const int col_t = 2 * (lane & 3);                     /* column of acc[4j] within group j */

    /* Pingpong: the last warpgroup gives warpgroup 0 its first turn. */
    if (C::PP && cw == C::WG - 1) bar_arrive(kBarSched + 0, 256);

    int stage = 0;
    uint32_t phase = 0;
    uint32_t q_iter = 0; /* work tiles so far: Q buffer q_iter % QB, parity (q_iter / QB) & 1 */
    int q_release = -1;  /* 2 Q buffers: the previous tile's, not yet handed back */
    /* Hand Q buffer b back: our generic reads/writes of it, and the O store's
     * reads of the staging (issuing thread), come before the next TMA (async
     * proxy) write into it. */
    auto release_q = [&](int b) {
        if (p.o_tma && tid == 0) tma_store_wait_read();
        fence_proxy_async();
        mbar_arrive(bars.q_empty(b));
    };
    auto q_rows = [&](int b) { return base + C::OFF_Q + b * C::Q_BYTES + 64 * rg * C::SW; };
    /* One step of this warpgroup through the K/V ring: KVS blocks. */
    auto advance = [&](int &st, uint32_t &ph) {
        for (int i = 0; i < C::KVS; ++i)
            if (++st == C::ST) { st = 0; ph ^= 1; }
    };
    uint32_t ring = 0;   /* kvsplit: KV blocks of this CTA's earlier tiles (ring position) */
    uint32_t merges = 0; /* kvsplit: tiles merged so far (m_full/m_empty parity) */
    bool mine = true;  /* kvsplit: this warpgroup has a block of the tile */
    int slot = 0;
    Tile g;
    int k = 0;
    float S0[C::BN / 2]; /* the tile's first S block */
    bool more = true;
    if (ROT) {
        more = next_tile<C>(p, bars, slot, g, k, row_wg, col_t);
        issue_first_s<C, kBF16>(S0, bars, base, q_rows(0), 0, 0, stage, phase, cw, more);
    }
    while (more) {
        if (!ROT) {
            /* The plain order (one Q buffer: the tile's Q lands where the
             * previous tile's O was staged, so nothing can be issued early). */
            if (!next_tile<C>(p, bars, slot, g, k, row_wg, col_t)) break;
            const int qt = (int)(q_iter % C::QB);
            if (C::KVS > 1) {
                /* The tile's blocks take ring positions ring.. in producer
                 * order; this warpgroup's first is ring + kv. */
                const uint32_t pos = ring + (uint32_t)kv;
                stage = (int)(pos % C::ST);
                phase = (pos / C::ST) & 1;
                mine = kv < g.n_hi - g.n_lo;
            }
            /* kvsplit: issued below, on the branch that waits for it (a
             * wgmma result live across a branch join makes ptxas wait). */
            if (C::KVS == 1)
                issue_first_s<C, kBF16>(S0, bars, base, q_rows(qt), qt, (q_iter / C::QB) & 1, stage, phase, cw,
                                        true);
        }
        trace(p, cw + 1, k, 0, tid == 0);
        const int qb = (int)(q_iter % C::QB);
        const uint32_t q_off = C::OFF_Q + qb * C::Q_BYTES; /* this tile's Q (and O staging) */
        const uint32_t q_addr = base + q_off + 64 * rg * C::SW; /* this warpgroup's Q rows */
        MaskRows mr;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row_pos(p, g.m0 + row_wg + 8 * r);
            mr.lo[r] = key_lo(row, g.sq, g.sk, p.window_left);
            mr.hi[r] = key_hi(row, g.sq, g.sk, p.window_right);
        }
        float S[C::BN / 2];
        uint32_t P[C::BN / 4];
        float alpha[2];
        float O[C::D / 2];
        RowState rs;
        int n = g.n_hi - 1 - kv;

        if (!mine) {
            /* kvsplit, a tile of one block: the other warpgroup has it. An
             * empty partial (max -inf, sum 0, O 0) for the merge. */
            if (C::QB == 2 && q_release >= 0) release_q(q_release), q_release = -1;
#pragma unroll
            for (int i = 0; i < C::D / 2; ++i) O[i] = 0.0f;
#pragma unroll
            for (int r = 0; r < 2; ++r) rs.m[r] = neg_inf(), rs.l[r] = 0.0f;
        } else {
        if (C::KVS > 1)
            issue_first_s<C, kBF16>(S0, bars, base, q_addr, qb, (q_iter / C::QB) & 1, stage, phase, cw, true);
        /* first block: S0 (in flight), softmax, P */
        wg_wait<0>();
        fence_regs(S0);
        trace(p, cw + 1, k, 1, tid == 0);
        mbar_arrive(bars.k_empty(stage));
        /* Varlen calls always run the any-block-mask instance (mask_mode.h),
         * so only it carries the code: in the others it cost 1-2% at
         * s512-d64 and s2k-d128 though never executed (run 106). */
        if constexpr (kMask == kMaskAny) zero_v_tail<C>(p, g, n, bars, base, stage, phase);
#pragma unroll
        for (int i = 0; i < C::D / 2; ++i) O[i] = 0.0f;
        softmax_block<C, true, kMask>(S0, rs, alpha, p, block_masked<C>(g, n), n * C::BN + col_t, mr);
        convert_p<C, kBF16>(S0, P);
        if (C::QB == 2 && q_release >= 0) release_q(q_release), q_release = -1;
        trace(p, cw + 1, k, 2, tid == 0);
        int v_stage = stage;
        uint32_t v_phase = phase;
        advance(stage, phase);

        if (C::OV) {
            /* S_j and O += P_{j-1} V_{j-1} issued together; the softmax of
             * block j runs while the P.V GEMM is on the tensor cores. */
            for (n -= C::KVS; n >= g.n_lo; n -= C::KVS) {
                FC90_WAIT(bars.k_full(stage), phase);
                /* V_{j-1} was issued before K_j: waiting here costs nothing
                 * and keeps the wait loop out of the fence..wgmma window
                 * (ptxas would otherwise inject a second fence, C7519). */
                FC90_WAIT(bars.v_full(v_stage), v_phase);
                round_begin<C>(cw);
                issue_s<C, kBF16>(S, q_addr, base + C::OFF_K + stage * C::KV_BYTES);
                wg_commit();
                issue_pv<C, kBF16>(O, P, base + C::OFF_V + v_stage * C::KV_BYTES);
                round_end<C>(cw);
                wg_wait<1>(); /* S_j done, P.V of the previous block may still run */
                fence_regs(S);
                mbar_arrive(bars.k_empty(stage));
                softmax_block<C, false, kMask>(S, rs, alpha, p, block_masked<C>(g, n), n * C::BN + col_t, mr);
                wg_wait<0>();
                fence_regs(O);
                fence_regs(S);
                fence_regs(P);
                mbar_arrive(bars.v_empty(v_stage));
                rescale_o<C>(O, alpha);
                convert_p<C, kBF16>(S, P);
                v_stage = stage;
                v_phase = phase;
                advance(stage, phase);
            }
            pv_round<C, kBF16>(O, P, bars, base, v_stage, v_phase, cw); /* the last P.V */
        } else {
            /* Plain order: P.V of the first block, then S, softmax, P.V per
             * block, waiting for each. */
            pv_round<C, kBF16>(O, P, bars, base, v_stage, v_phase, cw);
            for (n -= C::KVS; n >= g.n_lo; n -= C::KVS) {
                FC90_WAIT(bars.k_full(stage), phase);
                round_begin<C>(cw);
                issue_s<C, kBF16>(S, q_addr, base + C::OFF_K + stage * C::KV_BYTES);
                round_end<C>(cw);
                wg_wait<0>();
                fence_regs(S);
                mbar_arrive(bars.k_empty(stage));
                softmax_block<C, false, kMask>(S, rs, alpha, p, block_masked<C>(g, n), n * C::BN + col_t, mr);
                rescale_o<C>(O, alpha);
                convert_p<C, kBF16>(S, P);
                pv_round<C, kBF16>(O, P, bars, base, stage, phase, cw);
                advance(stage, phase);
            }
        }
        } /* mine */

        trace(p, cw + 1, k, 3, tid == 0);
        if (C::KVS > 1) {
            /* Merge the pair's partials, thread t with thread t (the same
             * rows and columns): the second warpgroup hands its m, l, O over
             * shared memory (m_full) and goes on to its next tile; the first
             * rescales both to the common max and hands the area back
             * (m_empty). Merge number `merges` gives the parity. */
            float *mg = reinterpret_cast<float *>(smem + C::OFF_MERGE) + tid;
            const uint32_t m_par = merges & 1;
            ++merges;
            if (kv == 1) {
                FC90_WAIT(bars.m_empty(), m_par ^ 1);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    mg[128 * r] = rs.m[r];
                    mg[128 * (2 + r)] = rs.l[r];
                }
#pragma unroll
                for (int i = 0; i < C::D / 2; ++i) mg[128 * (4 + i)] = O[i];
                mbar_arrive(bars.m_full());
            } else {
                FC90_WAIT(bars.m_full(), m_par);
                float f0[2], f1[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float m1 = mg[128 * r];
                    const float mn = fmaxf(rs.m[r], m1);
                    const float ms = max_shift(mn, p.scale_log2);
                    f0[r] = ex2(rs.m[r] * p.scale_log2 - ms);
                    f1[r] = ex2(m1 * p.scale_log2 - ms);
                    rs.l[r] = rs.l[r] * f0[r] + mg[128 * (2 + r)] * f1[r];
                    rs.m[r] = mn;
                }
#pragma unroll
                for (int i = 0; i < C::D / 2; ++i) {
                    const int r = (i >> 1) & 1; /* acc[4j+0..1]: row r, acc[4j+2..3]: row r+8 */
                    O[i] = O[i] * f0[r] + mg[128 * (4 + i)] * f1[r];
                }
                mbar_arrive(bars.m_empty());
            }
            ring += (uint32_t)(g.n_hi - g.n_lo);
        }
        const int q_next = (int)((q_iter + 1) % C::QB);
        const uint32_t q_next_par = ((q_iter + 1) / C::QB) & 1;
        Tile gn;
        int kn = 0;
        if (ROT) {
            /* The next tile's Q is in the other buffer: its first S runs
             * during this tile's epilogue. */
            more = next_tile<C>(p, bars, slot, gn, kn, row_wg, col_t);
            issue_first_s<C, kBF16>(S0, bars, base, q_rows(q_next), q_next, q_next_par, stage, phase, cw, more);
        }
        bool store = kv == 0; /* kvsplit: the first warpgroup of the pair stores */
        if constexpr (C::TAIL) {
            /* tail balancing: a part of a split tile stores only if it merged */
            int slot = 0;
            const int part = tail_part<C>(p, g, slot);
            if (part >= 0) store = tail_merge<C>(p, part, slot, bars, cw, tid, rs, O);
        }
        if (store) {
        /* ---- finalize: O / l, lse = max*scale + ln(l) (natural log) ---- */
        float lse[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = rs.l[r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const bool empty = rs.m[r] == neg_inf() || !(l > 0.0f);
            const float inv = empty ? 0.0f : 1.0f / l;
            /* ln(l) as log2(l) * ln 2 with the hardware log2 (MUFU.LG2, as the
             * sm80 path): logf is a ~30-instruction routine in every tile's
             * epilogue, and its extra accuracy is far below the LSE bound. */
            lse[r] = empty ? neg_inf() : (rs.m[r] * p.scale_log2 + __log2f(l)) * 0.69314718055994531f;
#pragma unroll
            for (int j = 0; j < C::D / 8; ++j) {
                O[4 * j + 2 * r] *= inv;
                O[4 * j + 2 * r + 1] *= inv;
            }
        }

        /* The thread's two rows: position and query head. */
        int pos_r[2], head_r[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            pos_r[r] = row_pos(p, g.m0 + row_wg + 8 * r);
            head_r[r] = row_head(p, g, g.m0 + row_wg + 8 * r);
        }
        /* An opaque copy of the thread index: without it the compiler hoists
         * the D/4 per-thread staging addresses out of the tile loop and keeps
         * them live across the main loop (spills at head_dim 192/256). */
        int etid = tid;
        asm volatile("" : "+r"(etid));
        /* Phase A: everything that reads O. */
        if (p.num_splits.d > 1) {
            /* fp32 partials for the shared combine kernel:
             * o_accum [split][b*Hq+h][seqlen_q][D], lse_accum [split][b*Hq+h][seqlen_q]. */
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                if (pos_r[r] >= g.sq) continue;
                const int64_t plane =
                    (((int64_t)g.split * p.batch + g.b) * p.heads_q + head_r[r]) * p.seqlen_q + pos_r[r];
                float *dst = p.o_accum + plane * C::D + col_t;
#pragma unroll
                for (int j = 0; j < C::D / 8; ++j)
                    *reinterpret_cast<float2 *>(dst + 8 * j) = make_float2(O[4 * j + 2 * r], O[4 * j + 2 * r + 1]);
                if ((lane & 3) == 0) p.lse_accum[plane] = lse[r];
            }
        } else {
            /* Stage the 16-bit tile in this warpgroup's rows of the Q buffer
             * (its last S GEMM has completed in every warp once all four
             * reach the barrier). */
            bar_sync(kBarEpi + cw, 128);
            const int e_row = 64 * rg + 16 * (etid >> 5) + ((etid & 31) >> 2);
            const int e_col = 2 * (etid & 3);
#pragma unroll
            for (int j = 0; j < C::D / 8; ++j) {
                const int col = 8 * j + e_col;
                const uint32_t pan = (uint32_t)(col / C::PW) * (C::BM * C::SW);
                const uint32_t cb = (uint32_t)(col % C::PW) * 2;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint32_t off = q_off + pan + (uint32_t)(e_row + 8 * r) * C::SW + cb;
                    *reinterpret_cast<uint32_t *>(smem + swz<C::SW>(off)) =
                        pack2<kBF16>(O[4 * j + 2 * r], O[4 * j + 2 * r + 1]);
                }
            }
        }
        /* Phase B: LSE, and O from the staging to global memory. */
        if (p.num_splits.d == 1) {
            if (p.lse && (lane & 3) == 0) {
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    if (pos_r[r] < g.sq)
                        p.lse[g.b * p.lse_batch_stride + head_r[r] * p.lse_head_stride +
                              (int64_t)(g.q_off + pos_r[r]) * p.lse_row_stride] = lse[r];
            }
            if (p.o_tma) {
                /* TMA store of the warpgroup's 64 rows (one box per panel):
                 * the staging writes go to the async proxy first; rows past
                 * seqlen_q are clipped by the tensor map. */
                fence_proxy_async();
                bar_sync(kBarEpi + cw, 128);
                if (etid == 0) {
                    const int pos0 = g.q_off + row_pos(p, g.m0 + 64 * rg);
#pragma unroll
                    for (int pn = 0; pn < C::PANELS; ++pn)
                        tma_store_5d(&p.tm_o, base + q_off + pn * (C::BM * C::SW) + 64 * rg * C::SW, pn * C::PW, 0,
                                     g.hu, pos0, g.b);
                    tma_store_commit();
                }
            } else {
                bar_sync(kBarEpi + cw, 128);
                uint16_t *o16 = reinterpret_cast<uint16_t *>(p.o) + g.b * p.o_batch_stride;
                store_o_generic<C>(p, g, o16, smem, q_off, rg, etid);
            }
        }
        } /* store */
        /* With 2 Q buffers this one is refilled only for the tile after next:
         * hand it back during the next tile (release_q), by when the O store
         * has long read it, instead of waiting for that read here with the
         * whole warpgroup behind thread 0. */
        if (C::QB == 2) q_release = qb;
        else release_q(qb);
        ++q_iter;
        trace(p, cw + 1, k, 4, tid == 0);
        if (ROT) {
            g = gn;
            k = kn;
        }
    }
    if (ROT) {
        /* The dropped S (issue_first_s). Reading S0 after the wait keeps its
         * registers reserved until then: a wgmma result that is never read
         * would otherwise be dead from its issue on, and its registers free
         * for other values while the tensor core still writes them. */
        wg_wait<0>();
        fence_regs(S0);
    }
    /* The last O stores must land before the CTA's shared memory goes away. */
    if (p.o_tma && tid == 0) tma_store_wait_all();
    trace_gt(p, cw + 1, 5, tid == 0);
}

/* ---- the kernel --------------------------------------------------------------------- */
template <int kCfg, bool kBF16, bool kRotate, int kMask, bool kTail>
__global__ void __launch_bounds__(Cfg<kCfg>::THREADS, Cfg<kCfg>::CTAS) fc_sm90_fwd_kernel(const __grid_constant__ fc_sm90_params p)
{
    using C = Cfg<kCfg, kTail>;
    trace_gt(p, 0, 5, threadIdx.x == 0);
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023u) & ~1023u;
    uint8_t *smem = smem_raw + (base - raw);
    Bars<C> bars;
    bars.base = base + C::OFF_BAR;

#if defined(FC_SM90_DEBUG) && FC_SM90_DEBUG
    {
        uint32_t dyn;
        asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dyn));
        FC90_ASSERT(dyn >= (uint32_t)C::SMEM);
        FC90_ASSERT(blockDim.x == (unsigned)C::THREADS);
    }
#endif

    if (threadIdx.x == 0) {
        /* The tensor maps are kernel parameters, not anything the previous
         * kernel writes: fetch them into the TMA unit before the PDL wait, so
         * that the first loads and the epilogue's first store do not wait
         * for a descriptor. */
        tma_prefetch_map(&p.tm_q);
        tma_prefetch_map(&p.tm_k);
        tma_prefetch_map(&p.tm_v);
        if (p.o_tma) tma_prefetch_map(&p.tm_o);
#pragma unroll
        for (int b = 0; b < C::QB; ++b) {
            mbar_init(bars.q_full(b), 1);
            mbar_init(bars.q_empty(b), C::CONSUMERS);
        }
        /* Both scheduler slots, whatever QB is. */
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            mbar_init(bars.t_full(b), 1);
            mbar_init(bars.t_empty(b), C::CONSUMERS);
        }
        if (C::KVS > 1) {
            mbar_init(bars.m_full(), 128);
            mbar_init(bars.m_empty(), 128);
        }
#pragma unroll
        for (int s = 0; s < C::ST; ++s) {
            mbar_init(bars.k_full(s), 1);
            mbar_init(bars.k_empty(s), C::KV_CONSUMERS);
            mbar_init(bars.v_full(s), 1);
            mbar_init(bars.v_empty(s), C::KV_CONSUMERS);
        }
        mbar_fence_init();
    }
    __syncthreads();
    /* Everything above touches only this CTA's shared memory and the
     * parameters; from here on global memory (cu_seqlens, Q/K/V, O, LSE, the
     * tile counter) is read and written, so with programmatic dependent
     * launch (p.pdl) this is where the previous kernel must be complete. The
     * next kernel may start launching now: it cannot take an SM before one of
     * our CTAs leaves it (shared memory), and it waits in turn. */
    fc_grid_dep_sync();
    trace_gt(p, 0, 6, threadIdx.x == 0);

    /* Warp-uniform role (shfl makes it provably uniform to the compiler). */
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
    if (wg == 0) {
        if constexpr (C::SETMAXNREG) reg_dealloc<C::PRODUCER_REGS>();
        if (threadIdx.x == 0) producer<C>(p, base, bars);
    } else {
        if constexpr (C::SETMAXNREG) reg_alloc<C::CONSUMER_REGS>();
        /* With one consumer warpgroup its index is the constant 0, which
         * keeps the named-barrier ids compile-time. */
        consumer<C, kBF16, kRotate, kMask>(p, C::WG == 1 ? 0 : wg - 1, base, smem, bars);
    }
}

template <int kCfg, bool kBF16, bool kRotate, int kMask, bool kTail = false>
static fc_status launch(const fc_sm90_params *prm, int grid, int device, cudaStream_t stream, char *err,
                        size_t err_len)
{
    using C = Cfg<kCfg>;
    void (*kern)(const fc_sm90_params) = fc_sm90_fwd_kernel<kCfg, kBF16, kRotate, kMask, kTail>;
    static std::atomic<unsigned long long> opted_in{0};
    const fc_status opt =
        fc_smem_opt_in(kern, C::SMEM, device, opted_in, "sm90 forward", kCfg, err, err_len, C::CTAS > 1);
    if (opt != FC_OK) return opt;
    const cudaError_t e = fc_launch(kern, (unsigned)grid, C::THREADS, (size_t)C::SMEM, stream, prm->pdl != 0, *prm);
    if (e != cudaSuccess) {
        snprintf(err, err_len, "sm90 forward (config %d): kernel launch (%d CTAs x %d threads, %d B smem): %s",
                 kCfg, grid, C::THREADS, C::SMEM, cudaGetErrorString(e));
        return FC_ERR_CUDA;
    }
    return FC_OK;
}

/* The kernel for prm's rotate, tail and mask-mode choices (plan.cu made
 * them; tail balancing comes without rotation and the any-block mask). */
template <int kCfg, bool kBF16, int kMask>
static fc_status launch_rot(const fc_sm90_params *prm, int grid, int device, cudaStream_t s, char *err,
                            size_t len)
{
    if (prm->tail_first < prm->num_tiles) {
        if constexpr (FC_SM90_TAIL_ROW(kTiles[kCfg]) && kMask != kMaskAny) {
            if (!prm->rotate) return launch<kCfg, kBF16, false, kMask, true>(prm, grid, device, s, err, len);
        }
        snprintf(err, len, "sm90 forward (config %d): no tail-balanced instance for rotate %d, masks %d (planner bug)",
                 kCfg, prm->rotate, kMask);
        return FC_ERR_INTERNAL;
    }
    if constexpr (FC_SM90_CAN_ROTATE(kTiles[kCfg])) {
        if (prm->rotate) return launch<kCfg, kBF16, true, kMask>(prm, grid, device, s, err, len);
    }
    return launch<kCfg, kBF16, false, kMask>(prm, grid, device, s, err, len);
}
} /* namespace fc90 */

/* One launcher per (config, dtype): the only symbols a kernel TU exports.
 * tag is bf16 or f16, is_bf16 the matching 1/0. */
#define FC_SM90_DEFINE_LAUNCHER(cfg, dim, tag, is_bf16)                                            \
    static_assert(fc90::kTiles[cfg].head_dim == (dim), "config " #cfg " is not head_dim " #dim);   \
    fc_status fc_sm90_launch_##cfg##_##tag(const fc_sm90_params *prm, int grid, int device,       \
                                           cudaStream_t s, char *err, size_t len)                \
    {                                                                                              \
        if (prm->masks == fc90::kMaskNone)                                                         \
            return fc90::launch_rot<cfg, (is_bf16) != 0, fc90::kMaskNone>(prm, grid, device, s, err, len); \
        if (prm->masks == fc90::kMaskFirst)                                                        \
            return fc90::launch_rot<cfg, (is_bf16) != 0, fc90::kMaskFirst>(prm, grid, device, s, err, len); \
        return fc90::launch_rot<cfg, (is_bf16) != 0, fc90::kMaskAny>(prm, grid, device, s, err, len); \
    }

#endif /* FC_SM90_FWD_KERNEL_CUH */
