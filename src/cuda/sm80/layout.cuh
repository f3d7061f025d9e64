/*
 * layout.cuh -- the compile-time shape of one sm80-class kernel instance
 * (Shape) and where its tiles sit in shared memory: the panel swizzle, the
 * storage-order walk the loads and the O store share, the ldmatrix lane
 * offsets, and the carve-up of the dynamic shared memory (Smem).
 *
 * Panels: a tile of R rows x HD columns (16-bit) is stored as column panels
 * of R rows x PC 16-byte chunks.
 *  - PC 8 (head dims 64 and 128, FA2's layout): 128-byte panel rows, chunk c
 *    (0..7) of row r at chunk position c ^ (r & 7).
 *  - PC 4 (head dims 32 and 96, which 128-byte panels do not divide, and
 *    256, where 8 measured slower): 64-byte panel rows, chunk c (0..3) of
 *    row r at c ^ ((r >> 1) & 3) (a row pair shares a 128-byte line).
 * Any 8 consecutive rows (r0 % 8 == 0) at the same logical chunk then cover
 * all 8 bank groups, so every ldmatrix phase and every cp.async phase (8
 * threads = one 128-byte line) is bank-conflict free. 128-byte rows halve
 * the L1 wavefronts per cp.async against 64-byte ones (+4-6% at d64/d128).
 */
#ifndef FC_SM80_LAYOUT_CUH
#define FC_SM80_LAYOUT_CUH

#include <stdint.h>

#include "cuda/common/sm80_ptx.cuh"

namespace fc {
namespace sm80 {

/* log2 of a panel's chunk count PC (4 or 8): index math by shifts and masks,
 * which / and % by PC on signed ints would not compile to. */
constexpr int panel_log2(int pc) { return pc == 8 ? 3 : 2; }
/* Chunk-position XOR of row r in a panel of PC chunks (see the file comment). */
template <int PC>
__device__ __forceinline__ int panel_swz(int r)
{
    return PC == 8 ? (r & 7) : ((r >> 1) & 3);
}
/* Byte offset of 16-byte chunk c (0..HD/8-1) of row r in a tile of ROWS rows
 * stored as panels of PC chunks. */
template <int ROWS, int PC>
__device__ __forceinline__ uint32_t panel_offset(int r, int c)
{
    return (uint32_t)((c >> panel_log2(PC)) * ROWS * PC * 16 + r * PC * 16 + (((c & (PC - 1)) ^ panel_swz<PC>(r)) << 4));
}
/* Unit u of a tile of ROWS rows walked in storage order (panel, row, chunk:
 * the cp.async loads and the O store): its row, its chunk, and its byte
 * offset -- u's own chunk position XOR the swizzle, which is
 * (u >> 3) & (PC - 1) = panel_swz(row) for either PC (ROWS % 8 == 0).
 * u >= 0: unsigned, so that the divisions by powers of two are plain
 * shifts without the sign fix-ups. */
template <int ROWS, int PC>
__device__ __forceinline__ int unit_row(int u)
{
    return (int)(((unsigned)u >> panel_log2(PC)) % ROWS);
}
template <int ROWS, int PC>
__device__ __forceinline__ int unit_chunk(int u)
{
    return (int)(((unsigned)u >> panel_log2(PC)) / ROWS) * PC + (u & (PC - 1));
}
template <int PC>
__device__ __forceinline__ uint32_t unit_smem_offset(int u)
{
    return (uint32_t)(u ^ ((u >> 3) & (PC - 1))) * 16;
}

/* Compile-time shape of one instantiation (VAR: the row's variant bits,
 * tiles.cuh; only kVarTma changes the layout). */
template <int HD_, int BM_, int BN_, int W_, int STAGES_, int VAR_>
struct Shape {
    static constexpr int HD = HD_, BM = BM_, BN = BN_, W = W_, STAGES = STAGES_, VAR = VAR_;
    static constexpr int NT = W * 32;         /* threads per CTA                    */
    /* kVarWarpKeys: the W warps share one m16 tile (BM 16) and split each
     * block's keys, KW = W slices of BN / W keys; their partial (m, l, O)
     * merge in the epilogue (warp_keys.cuh). Else KW 1: each warp owns its
     * MT m16 tiles of rows and every key. */
    static constexpr int KW = (VAR_ & 64) != 0 ? W : 1;
    static constexpr int MT = KW > 1 ? 1 : BM / (16 * W); /* m16 tiles per warp (1 or 2) */
    static constexpr int WROWS = MT * 16;     /* rows owned by one warp             */
    static constexpr int KSTEPS = HD / 16;    /* k16 steps of S = Q K^T             */
    static constexpr int NTL = BN / (8 * KW); /* n8 tiles of S                      */
    static constexpr int DTL = HD / 8;        /* n8 tiles of O                      */
    static constexpr int PSTEPS = BN / (16 * KW); /* k16 steps of O += P V          */
    /* PC chunks of 16 bytes per panel row (file comment); KPP k16 steps per
     * panel. d256 keeps 4: with 8 it measured 1-2% slower. */
    static constexpr int PC = (HD == 64 || HD == 128) ? 8 : 4;
    static constexpr int LPC = panel_log2(PC);
    static constexpr int PB = PC * 16;        /* bytes per panel row                */
    static constexpr int KPP = PC / 2;
    static constexpr uint32_t Q_BYTES = BM * HD * 2;
    static constexpr uint32_t KV_BYTES = BN * HD * 2; /* one K (or V) tile          */
    /* kVarKv8: K and V are FP8 in memory. The ring holds their bytes (a
     * row-major [BN][HD] tile each, KV8_BYTES); each block is converted
     * into one K and one V tile of 16-bit panels (CVT_BYTES, after the
     * ring) that the MMAs read (loads_kv8.cuh). */
    static constexpr bool KV8 = (VAR_ & 32) != 0;
    static constexpr uint32_t KV8_BYTES = BN * HD;
    static constexpr uint32_t STAGE_BYTES = KV8 ? 2 * KV8_BYTES : 2 * KV_BYTES;
    static constexpr uint32_t CVT_BYTES = KV8 ? 2 * KV_BYTES : 0;
    /* S alone takes >= 128 registers (128x128 d64 at MT 2): the per-row
     * visible key intervals go to a BM x 8 byte smem table, and load_kv
     * re-derives unit tid's row, chunk and smem offset from a fresh %tid.x;
     * without both that row spills 64 B on sm_90a. tiles.cuh's
     * tile_smem_bytes repeats the condition (fwd_launch.cuh checks). */
    static constexpr bool LEAN_REGS = MT * BN / 2 >= 128;
    static constexpr uint32_t MASK_BYTES = LEAN_REGS ? BM * 8 : 0;
    /* STAGES == 1: split K/V buffers (the K and V tiles of "stage 0"), each
     * with its own cp.async groups (mainloop.cuh states the invariant). */
    static constexpr bool KV_SPLIT = STAGES == 1;
    /* kVarTma: K/V by TMA into the split buffers, one mbarrier each. TMA's
     * 64-byte swizzle equals the PC 4 panel XOR only on 512-byte aligned
     * tiles, so the smem base is rounded up to 512 (+ 512 bytes requested). */
    static constexpr bool TMA = (VAR_ & 8) != 0;
    static constexpr uint32_t BAR_BYTES = TMA ? 16 : 0, ALIGN_PAD = TMA ? 512 : 0;
    static constexpr uint32_t SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES + CVT_BYTES + 24 + MASK_BYTES +
                                           BAR_BYTES + ALIGN_PAD; /* + K/V bases, the mask-free block
                                                                   * range (+ mask table) (+ TMA
                                                                   * barriers, pad) */
    /* Keep Q's A fragments in registers when the fp32 accumulators leave room
     * (else re-read them from smem with ldmatrix each block). */
    static constexpr bool Q_IN_REGS = MT * (HD / 2 + BN / 2 + HD / 4) <= 160;
    /* Park the K/V base pointers in smem instead of 4 registers when the
     * accumulators alone take > 160 (d128 x 64 keys at MT 2: 192). */
    static constexpr bool KV_BASE_IN_SMEM = MT * (HD / 2 + BN / 2) > 160;
    /* Re-derive the main loop's ldmatrix lane offsets from a fresh %tid.x at
     * each GEMM: PC 8 needs four XOR variants of each, and holding them
     * spilled where the accumulators take >= 160 registers. */
    static constexpr bool FRESH_LANE_OFFS = PC == 8 && MT * (HD / 2 + BN / 2) >= 160;
    /* Code variants (tiles.cuh, Tile::variant; 0 = the plain kernel). */
    static constexpr bool LEAN_ADDR = (VAR_ & 1) != 0;            /* kVarLeanAddr   */
    static constexpr bool EARLY = (VAR_ & 2) != 0 && !KV_SPLIT;   /* kVarEarlyFirst */
    static constexpr bool PAGED = (VAR_ & 16) != 0;               /* kVarPaged      */

    static_assert(HD % 32 == 0 && HD >= 32 && HD <= 256, "head_dim: multiple of 32 in 32..256");
    static_assert(KW > 1 ? (BM == 16 && BN % (16 * KW) == 0) : (BM % (16 * W) == 0 && (MT == 1 || MT == 2)),
                  "block_m = 16 * warps * (1 or 2); kVarWarpKeys: 16, block_n 16 keys a warp or more");
    static_assert(BN % 16 == 0 && BN >= 16, "block_n: multiple of 16 (pairs of n8 MMA tiles)");
    static_assert(STAGES >= 1 && STAGES <= 4, "1 (split K/V buffers) or a 2..4-deep ring");
    static_assert(BM % 8 == 0 && BN % 8 == 0, "the panel swizzle's period is 8 rows");
    static_assert((WROWS * HD / 8) % 32 == 0, "epilogue: whole 16-byte chunks per lane");
    static_assert(!TMA || (KV_SPLIT && PC == 4 && BN <= 256),
                  "kVarTma: split K/V rows with 64-byte panel rows (the TMA swizzle), box rows <= 256");
    static_assert(VAR_ >= 0 && VAR_ <= 127 && ((VAR_ & 2) == 0 || !KV_SPLIT) && (!TMA || !LEAN_ADDR),
                  "variant bits: 1 lean addressing, 2 early first block (ring rows only), 4 no plain "
                  "instance, 8 TMA K/V (split rows, not with 1), 16 paged K/V, 32 FP8 K/V, 64 warps split keys");
    static_assert(!PAGED || (!TMA && !LEAN_ADDR && !KV_BASE_IN_SMEM && !LEAN_REGS),
                  "kVarPaged: cp.async rows whose K/V bases and block-table row stay in registers");
    static_assert(!KV8 || (STAGES >= 2 && !EARLY && !TMA && !LEAN_ADDR && !KV_BASE_IN_SMEM && !LEAN_REGS),
                  "kVarKv8: plain ring rows whose K/V bases stay in registers");
};

/* The dynamic shared memory of a CTA, as shared-window addresses. */
struct Smem {
    uint32_t q;     /* [BM x HD] panels; later the O staging                    */
    uint32_t kv;    /* stage s: K tile, then V tile                             */
    uint32_t cvt;   /* KV8: the block's K and V converted to 16-bit panels      */
    uint32_t base;  /* KV_BASE_IN_SMEM: K, V base pointers, then the mask-free
                     * block range {n_full_lo, n_full_hi} at +16 (24 bytes)     */
    uint32_t mask;  /* LEAN_REGS: row r's {jmin, jmax} at mask + 8r             */
    uint32_t bar_k; /* TMA: the K and V buffers' mbarriers                      */
    uint32_t bar_v;
};

template <class S_>
__device__ __forceinline__ Smem smem_layout(unsigned char *smem)
{
    Smem m;
    /* TMA: rounded up to 512 bytes (Shape::TMA). */
    m.q = S_::TMA ? (ptx::smem_addr(smem) + 511u) & ~511u : ptx::smem_addr(smem);
    m.kv = m.q + S_::Q_BYTES;
    m.cvt = m.kv + S_::STAGES * S_::STAGE_BYTES;
    m.base = m.cvt + S_::CVT_BYTES;
    m.mask = m.base + 24;
    m.bar_k = m.mask + S_::MASK_BYTES;
    m.bar_v = m.bar_k + 8;
    return m;
}

/* This thread's place in the CTA: lane, MMA fragment row group g and column
 * pair t, and the first tile row its warp owns. */
struct Thr {
    int tid, lane, g, t, wrow;
};

template <class S_>
__device__ __forceinline__ Thr thread_coords()
{
    Thr r;
    r.tid = threadIdx.x;
    r.lane = r.tid & 31;
    const int warp = r.tid >> 5;
    r.g = r.lane >> 2;
    r.t = r.lane & 3;
    r.wrow = S_::KW > 1 ? 0 : warp * S_::WROWS; /* kVarWarpKeys: one shared m16 tile */
    return r;
}

/* The first key of this thread's warp's slice of a block (kVarWarpKeys;
 * 0 when every warp sees the whole block). */
template <class S_>
__device__ __forceinline__ int warp_key0(const Thr &th)
{
    return S_::KW > 1 ? (th.tid >> 5) * (S_::BN / S_::KW) : 0;
}

/* ldmatrix lane offsets inside a 16-row band of a panel (plain inline, like
 * the loads: loads.cuh says why):
 *  ldm_off_a: A operand (Q) and V^T: lane -> row lane%16, chunk lane/16
 *  ldm_off_b: B operand (K): lane -> row 8*(lane/16) + lane%8, chunk (lane/8)%2
 * k16 step kk % KPP of a panel has logical chunk + 2 (kk % KPP): XOR
 * (kk % KPP) * 32 bytes (the swizzle is an XOR, the two lane bits and the
 * step's bits are disjoint). */
template <class S_>
__device__ inline uint32_t ldm_off_a(int l)
{
    constexpr int PC = S_::PC, PB = S_::PB;
    return (uint32_t)((l & 15) * PB + ((((l >> 4) ^ panel_swz<PC>(l & 15)) & (PC - 1)) << 4));
}
template <class S_>
__device__ inline uint32_t ldm_off_b(int l)
{
    constexpr int PC = S_::PC, PB = S_::PB;
    return (uint32_t)((((l >> 4) << 3) + (l & 7)) * PB + (((((l >> 3) & 1) ^ panel_swz<PC>(l & 7)) & (PC - 1)) << 4));
}
/* The lane the main loop's ldmatrix offsets derive from: a fresh %tid.x read
 * where holding them would spill (Shape::FRESH_LANE_OFFS). */
template <class S_>
__device__ inline int loop_lane(int lane)
{
    if constexpr (S_::FRESH_LANE_OFFS)
        return dev::tid_x_volatile() & 31;
    else
        return lane;
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_LAYOUT_CUH */
