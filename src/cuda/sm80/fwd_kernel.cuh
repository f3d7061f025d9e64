/*
 * fwd_kernel.cuh -- the sm80-class fused attention forward kernel
 * (mma.sync + ldmatrix + cp.async; runs on sm_80, 86, 89 and 90).
 *
 * One CTA computes one M tile: block_m query rows of one (batch, head) --
 * or, with GQA packing, block_m rows drawn from all query heads sharing one
 * KV head -- against the key range the masks leave visible (or, split-KV,
 * its share of that range). Per KV block of block_n keys:
 *
 *   S = Q K^T            mma.sync m16n8k16, fp32 accumulate, Q in registers
 *                        (or re-read from smem when registers are short)
 *   [softcap] s = tanh(s * scale/softcap)
 *   [mask]               only on blocks straddling the band or the seq tail
 *   online softmax       row max/sum in registers, quad shuffles, exp2 with
 *                        the scale folded into one FMA
 *   O += P V             P converted to 16-bit in registers = A operand
 *                        (no smem round trip); V via ldmatrix.trans
 *
 * K/V go through a `stages`-deep cp.async ring: the load of block j+stages-1
 * is issued before block j is computed, with one __syncthreads per block.
 * stages == 1 instead means split K/V buffers: one K tile and one V tile,
 * each refilled by its own cp.async group as soon as the other half of the
 * block's work no longer reads it (V_j lands during S = Q K_j^T, K_{j+1}
 * during O += P V_j; two __syncthreads per block). Half the smem of a
 * 2-stage ring, so a 64x64 d256 CTA takes 96 KB and two fit on an sm_90 SM;
 * the second CTA hides the load latency that one buffer each cannot.
 *
 * Shared memory layout (panels): a tile of R rows x HD columns (16-bit) is
 * stored as column panels of R rows x PC 16-byte chunks (Shape::PC).
 *  - PC 8 (head dims 64 and 128: FA2's layout): 128-byte panel rows, chunk
 *    c (0..7) of row r at chunk position c ^ (r & 7).
 *  - PC 4 (head dims 32 and 96, which 128-byte panels do not divide, and 256,
 *    where 8 measured slower: Shape::PC): 64-byte panel rows, chunk c (0..3)
 *    of row r at c ^ ((r >> 1) & 3) (a row pair shares a 128-byte line; row
 *    parity picks its half).
 * Any 8 consecutive rows (r0 % 8 == 0) at the same logical chunk then cover
 * all 8 bank groups, so every ldmatrix phase and every cp.async phase (8
 * threads = one 128-byte line: a panel row at PC 8, two at PC 4) is
 * bank-conflict free. Why 128-byte rows: a warp's cp.async (32 chunks) then
 * writes 4 whole shared-memory lines, against 8 half lines at PC 4 -- half
 * the L1 wavefronts per copy (Nsight Compute, H100: 8 per cp.async at PC 4,
 * FA2's 4; docs/perf/notes-sm80.md, sessions 7-8). Measured on an H100
 * (session 8): s512-d64, s2k-d128, s8k-d128 and gqa-prefill +4-6%.
 *
 * Runtime flags (no extra instantiations): causal/window masks, softcap,
 * varlen, lse, split-KV, GQA packing. Compile time: dtype, head dim, tile.
 */
#ifndef FC_SM80_FWD_KERNEL_CUH
#define FC_SM80_FWD_KERNEL_CUH

#include <stdint.h>

#include "cuda/common/pdl.cuh"
#include "cuda/common/sm80_ptx.cuh"
#include "cuda/sm80/fwd_args.h"
#include "cuda/sm90/ptx_sm90.cuh" /* mbarrier + TMA wrappers (kVarTma rows, sm_90 only) */

namespace fc {
namespace sm80 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

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

/* tanh for softcap and the K/V base-pointer parking slots (device_math.cuh). */
using dev::lds64;
using dev::sts64;
using dev::tanh_acc;
using dev::tid_x_volatile;
using dev::zero_rows_from;

/* Which half of a KV block load_kv issues (K tile, V tile or both): a
 * compile-time tag, so each call compiles to just its own cp.asyncs. */
template <int X>
struct KvSel {
    static constexpr bool K = (X & 1) != 0, V = (X & 2) != 0;
};
using LoadK = KvSel<1>;
using LoadV = KvSel<2>;
using LoadKV = KvSel<3>;


/* 16-byte global store (the O epilogue of the kVarLeanAddr variant): one
 * STG.128 whatever the front end can prove about the pointer's alignment
 * (the plain uint4 store came out as 4 x STG.32 for half the chunks). */
__device__ __forceinline__ void stg128(void *dst, uint4 v)
{
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w));
}

/* Compile-time flag argument for the generic load lambdas. */
template <bool B>
struct Flag {
    static constexpr bool value = B;
};

/* Compile-time shape of one instantiation (VAR: the row's variant bits,
 * tiles.cuh; only kVarTma changes the layout). */
template <int HD_, int BM_, int BN_, int W_, int STAGES_, int VAR_>
struct Shape {
    static constexpr int HD = HD_, BM = BM_, BN = BN_, W = W_, STAGES = STAGES_;
    static constexpr int NT = W * 32;         /* threads per CTA                    */
    static constexpr int MT = BM / (16 * W);  /* m16 tiles per warp (1 or 2)        */
    static constexpr int WROWS = MT * 16;     /* rows owned by one warp             */
    static constexpr int KSTEPS = HD / 16;    /* k16 steps of S = Q K^T             */
    static constexpr int NTL = BN / 8;        /* n8 tiles of S                      */
    static constexpr int DTL = HD / 8;        /* n8 tiles of O                      */
    static constexpr int PSTEPS = BN / 16;    /* k16 steps of O += P V              */
    /* smem panels (file comment): PC chunks of 16 bytes per panel row, 8 for
     * head dims 64 and 128, else 4; KPP k16 steps per panel. d256 keeps 4:
     * with 8, s4k-d256 measured 1-2% slower (0.97x FA2 against 0.98-0.99x;
     * with lean addressing 0.98x; H100, session 8, runs 48-50), while d64
     * and d128 gained 4-6%. */
    static constexpr int PC = (HD == 64 || HD == 128) ? 8 : 4;
    static constexpr int LPC = panel_log2(PC);
    static constexpr int PB = PC * 16;        /* bytes per panel row                */
    static constexpr int KPP = PC / 2;
    static constexpr uint32_t Q_BYTES = BM * HD * 2;
    static constexpr uint32_t KV_BYTES = BN * HD * 2; /* one K (or V) tile          */
    static constexpr uint32_t STAGE_BYTES = 2 * KV_BYTES;
    /* Rows whose S accumulator alone takes >= 128 registers (128x128 d64 at
     * MT 2: O 64 + S 128 leaves ~60 for everything else) cut what else stays
     * live across the main loop (SASS of 128x128 d64: without this it spills
     * 64 B on sm_90a -- the 8 per-row mask limits, the load_kv unit offsets,
     * then l_run and the loop bounds):
     *  - the per-row visible key interval [jmin, jmax] goes to smem (a BM x 8
     *    byte table after the K/V bases, written once, read only on masked
     *    blocks) instead of 2*2*MT registers;
     *  - load_kv re-derives unit tid's row, chunk and smem offset from a
     *    fresh %tid.x read instead of keeping 3 registers.
     * (tiles.cuh: tile_smem_bytes repeats the condition; fwd_launch.cuh
     * checks the two agree.) */
    static constexpr bool LEAN_REGS = MT * BN / 2 >= 128;
    static constexpr uint32_t MASK_BYTES = LEAN_REGS ? BM * 8 : 0;
    /* STAGES == 1: split K/V buffers (the K and V tiles of "stage 0"), each
     * with its own cp.async groups -- see the main loop's invariant. */
    static constexpr bool KV_SPLIT = STAGES == 1;
    /* kVarTma (tiles.cuh): K/V tiles by TMA into the split buffers, one
     * mbarrier each (16 bytes after the mask table). TMA's 64-byte swizzle
     * XORs shared-memory address bits 4-5 with bits 7-8, which is the PC 4
     * panel XOR (chunk c of row r at c ^ ((r >> 1) & 3)) only for 512-byte
     * aligned tiles: the kernel rounds the dynamic smem base up to 512
     * (+ 512 bytes requested). */
    static constexpr bool TMA = (VAR_ & 8) != 0;
    static constexpr uint32_t BAR_BYTES = TMA ? 16 : 0, ALIGN_PAD = TMA ? 512 : 0;
    static constexpr uint32_t SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES + 24 + MASK_BYTES + BAR_BYTES +
                                           ALIGN_PAD; /* + K/V bases, the mask-free block range
                                                       * (+ mask table) (+ TMA barriers, pad) */
    /* Keep Q's A fragments in registers when the fp32 accumulators leave room
     * (else re-read them from smem with ldmatrix each block). */
    static constexpr bool Q_IN_REGS = MT * (HD / 2 + BN / 2 + HD / 4) <= 160;
    /* Park the K/V base pointers in smem instead of 4 registers when the
     * accumulators alone take > 160 (d128 x 64 keys at MT 2: 192). */
    static constexpr bool KV_BASE_IN_SMEM = MT * (HD / 2 + BN / 2) > 160;
    /* Re-derive the main loop's ldmatrix lane offsets from a fresh %tid.x at
     * each GEMM instead of holding them: PC 8 needs four XOR variants of
     * each, and where the accumulators take >= 160 registers holding them
     * spilled (sm_90a: 128x64 d128 8 bytes, 128x96 d64 12 bytes). */
    static constexpr bool FRESH_LANE_OFFS = PC == 8 && MT * (HD / 2 + BN / 2) >= 160;

    static_assert(HD % 32 == 0 && HD >= 32 && HD <= 256, "head_dim: multiple of 32 in 32..256");
    static_assert(BM % (16 * W) == 0 && (MT == 1 || MT == 2), "block_m = 16 * warps * (1 or 2)");
    static_assert(BN % 16 == 0 && BN >= 16, "block_n: multiple of 16 (pairs of n8 MMA tiles)");
    static_assert(STAGES >= 1 && STAGES <= 4, "1 (split K/V buffers) or a 2..4-deep ring");
    static_assert(BM % 8 == 0 && BN % 8 == 0, "the panel swizzle's period is 8 rows");
    static_assert((WROWS * HD / 8) % 32 == 0, "epilogue: whole 16-byte chunks per lane");
    static_assert(!TMA || (KV_SPLIT && PC == 4 && BN <= 256),
                  "kVarTma: split K/V rows with 64-byte panel rows (the TMA swizzle), box rows <= 256");
};

/* Where a CTA's tile lives: derived from blockIdx.x and the sequence
 * lengths. Computed twice (before the main loop and again for the epilogue)
 * so that none of it has to stay live in registers across the loop. */
struct TileCoords {
    int split;        /* split-KV index                                             */
    int b;            /* batch (sequence) index                                     */
    int h_base;       /* query head of tile row 0 (packed: first head of the group) */
    int G;            /* tile row rr -> query position rr / G, head h_base + rr % G */
    int sq, sk;       /* this sequence's lengths                                    */
    int64_t q_start;  /* varlen: first token of the sequence (else 0)               */
    int64_t k_start;
    int64_t bq, bk;   /* batch index for the batch strides (0 for varlen)           */
    int64_t r0;       /* first tile row                                             */
    int64_t rows;     /* valid tile rows of this (b, head group): sq * G            */
};

/* blockIdx.x = ((b * grid_heads + hg) * splits + split) * m_tiles + m. M tiles
 * vary fastest so neighbouring CTAs share K/V in L2; they run from the last
 * tile down so causal's longest tiles start first. */
template <int BM>
__device__ __forceinline__ TileCoords locate_tile(const fc_sm80_args &a)
{
    const fc_fwd_params &p = a.p;
    TileCoords c;
    int bid = ptx::ctaid_x(); /* volatile read: the epilogue call recomputes */
    /* Plan-time divisors (common/fastdiv.h): a division by a run-time value
     * is a ~30-instruction routine, and this runs twice per CTA. */
    int q = fc_fastdiv_div(bid, a.m_tiles);
    const int m_tile = a.m_tiles.d - 1 - (bid - q * a.m_tiles.d);
    bid = q;
    q = fc_fastdiv_div(bid, a.num_splits);
    c.split = bid - q * a.num_splits.d;
    bid = q;
    c.b = fc_fastdiv_div(bid, a.grid_heads);
    const int hg = bid - c.b * a.grid_heads.d;
    c.G = a.pack_g.d;
    c.h_base = hg * c.G;
    c.q_start = 0;
    c.k_start = 0;
    c.sq = p.seqlen_q;
    c.sk = p.seqlen_k;
    if (p.cu_seqlens_q) { /* varlen: device-memory offsets, batch folded in */
        const int s0 = p.cu_seqlens_q[c.b];
        c.q_start = s0;
        c.sq = p.cu_seqlens_q[c.b + 1] - s0;
    }
    if (p.cu_seqlens_k) {
        const int s0 = p.cu_seqlens_k[c.b];
        c.k_start = s0;
        c.sk = p.cu_seqlens_k[c.b + 1] - s0;
    }
    c.bq = p.cu_seqlens_q ? 0 : c.b;
    c.bk = p.cu_seqlens_k ? 0 : c.b;
    c.r0 = (int64_t)m_tile * BM;
    c.rows = (int64_t)c.sq * c.G;
    return c;
}

/* Query position of tile row rr (rr / G; G is 1 unless GQA packing is on),
 * by the plan-time divider: 3 instructions and no branch. A 64-bit software
 * division behind a G == 1 test cost ~20 call sites a branch each and ~1000
 * instructions of (unexecuted) code in a kernel whose prologue and epilogue
 * already stall on instruction fetch. Tile rows are < 2^31 (plan.cu). */
__device__ __forceinline__ int64_t row_pos(int64_t rr, fc_fastdiv G) { return fc_fastdiv_div((int32_t)rr, G); }

/* floor(x / d) for d > 0 and any sign of x. */
__device__ __forceinline__ int64_t floor_div(int64_t x, int64_t d)
{
    return x >= 0 ? x / d : -((-x + d - 1) / d);
}

/* PLAIN: the call has no softcap and no masked block (plan.cu: masks 0), so
 * neither path is compiled in (they sit inline in every block). */
template <bool kBF16, int HD, int BM, int BN, int W, int STAGES, int VAR, bool PLAIN>
__device__ __forceinline__ void fwd_body(const fc_sm80_args &a, const fc_sm80_kv_maps *maps)
{
    using S_ = Shape<HD, BM, BN, W, STAGES, VAR>;
    constexpr int NT = S_::NT, MT = S_::MT, WROWS = S_::WROWS;
    constexpr int PC = S_::PC, LPC = S_::LPC, PB = S_::PB, KPP = S_::KPP;
    constexpr int KSTEPS = S_::KSTEPS, NTL = S_::NTL, DTL = S_::DTL, PSTEPS = S_::PSTEPS;
    constexpr bool Q_IN_REGS = S_::Q_IN_REGS;
    /* Code variants (tiles.cuh, Tile::variant; 0 = the plain kernel). */
    constexpr bool LEAN_ADDR = (VAR & 1) != 0;                 /* kVarLeanAddr   */
    constexpr bool EARLY = (VAR & 2) != 0 && !S_::KV_SPLIT;   /* kVarEarlyFirst */
    /* The lean Q load / O store (their G == 1 fast path is a second code path
     * beside the general one) with the lean K/V addressing. Until session 6
     * the rows whose accumulators push the K/V bases to smem (128x128 d64,
     * 128x64 d128) spilled 4-12 bytes with it; with the tile decode and
     * row_pos on plan-time divisors they no longer do (s512-d64 +7.5%,
     * H100, session 6, run 33). */
    constexpr bool LEAN_QO = LEAN_ADDR;
    constexpr bool TMA = S_::TMA;                              /* kVarTma        */
    static_assert(VAR >= 0 && VAR <= 15 && ((VAR & 2) == 0 || !S_::KV_SPLIT) && (!TMA || !LEAN_ADDR),
                  "variant bits: 1 lean addressing, 2 early first block (ring rows only), 4 no plain "
                  "instance, 8 TMA K/V (split rows, not with 1)");

    extern __shared__ __align__(128) unsigned char smem[];
    /* [BM x HD] panels; later the O staging. TMA: rounded up to 512 bytes. */
    const uint32_t sQ = TMA ? (ptx::smem_addr(smem) + 511u) & ~511u : ptx::smem_addr(smem);
    const uint32_t sKV = sQ + S_::Q_BYTES;    /* stage s: K tile, then V tile           */
    const uint32_t sBase = sKV + S_::STAGES * S_::STAGE_BYTES; /* K, V base pointers, block range (24 B) */
    /* sBase + 16: KV_BASE_IN_SMEM, the mask-free block range {n_full_lo, n_full_hi} */
    const uint32_t sMask = sBase + 24; /* LEAN_REGS: row r's {jmin, jmax} at sMask + 8r */
    const uint32_t sBarK = sMask + S_::MASK_BYTES, sBarV = sBarK + 8; /* TMA: the buffers' mbarriers */

    const fc_fwd_params &p = a.p;
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3; /* MMA fragment: row group, column pair */
    const int wrow = warp * WROWS;         /* first tile row owned by this warp    */

    float o[MT][DTL][4];              /* O accumulator (unnormalised)                    */
    float m_run[MT][2], l_run[MT][2]; /* running row max (score units), partial row sum */
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < DTL; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
        m_run[mt][0] = m_run[mt][1] = -INFINITY;
        l_run[mt][0] = l_run[mt][1] = 0.f;
    }

    {
        const TileCoords c = locate_tile<BM>(a);
        if (c.r0 >= c.rows) return; /* past a short sequence's end (uniform per CTA) */
        const int sk = c.sk;
        const int G = c.G;
        const int64_t i_first = row_pos(c.r0, a.pack_g); /* query positions spanned by the tile */
        const int64_t i_last = row_pos(min(c.r0 + BM, c.rows) - 1, a.pack_g);

        /* ---- key range. Key j is visible to query i iff (fc_key_visible)
         *   i + diag - wl <= j <= i + diag + wr  and  0 <= j < sk,  diag = sk - sq. */
        const int64_t diag = (int64_t)sk - c.sq;
        const int wl = p.window_left, wr = p.window_right;
        int64_t j_lo = 0, j_hi = sk; /* [j_lo, j_hi): union over the tile's rows */
        if (wl >= 0) j_lo = max((int64_t)0, i_first + diag - wl);
        if (wr >= 0) j_hi = min((int64_t)sk, i_last + diag + wr + 1);
        int n_begin = 0, n_end = 0; /* KV blocks [n_begin, n_end); empty if nothing visible */
        if (j_hi > j_lo) {
            n_begin = (int)(j_lo / BN);
            n_end = (int)((j_hi + BN - 1) / BN);
        }
        if (a.num_splits.d > 1) { /* a contiguous share of the blocks; may be empty */
            const int per = fc_fastdiv_div(n_end - n_begin + a.num_splits.d - 1, a.num_splits);
            const int nb = n_begin + c.split * per;
            n_end = min(n_end, nb + per);
            n_begin = nb;
        }
        /* Blocks [n_full_lo, n_full_hi) need no per-element mask: all their
         * keys are < sk, <= i_first + diag + wr (right edge of the tile's first
         * row, the tightest) and >= i_last + diag - wl (left edge of its last
         * row). The others straddle an edge (blocks wholly outside the band are
         * not in [n_begin, n_end) at all). */
        int64_t full_hi = sk / BN;
        if (wr >= 0) full_hi = min(full_hi, floor_div(i_first + diag + wr + 1, BN));
        int64_t full_lo = 0;
        if (wl >= 0) full_lo = max((int64_t)0, -floor_div(-(i_last + diag - wl), BN)); /* ceil */
        const int n_full_lo = (int)min(full_lo, (int64_t)n_end);
        const int n_full_hi = (int)max(full_hi, (int64_t)n_full_lo);

        /* Per-row visible key interval [jmin, jmax] (used on masked blocks)
         * for this thread's rows (mt, hf) -> tile row wrow + 16 mt + g + 8 hf.
         * LEAN_REGS keeps them in smem and skips them when no block of the
         * CTA's range is masked (the table is then never read). */
        int jmin[MT][2], jmax[MT][2];
        const bool any_masked = n_full_lo > n_begin || n_full_hi < n_end;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                if (PLAIN || (S_::LEAN_REGS && !any_masked)) continue;
                const int64_t i = row_pos(c.r0 + wrow + mt * 16 + g + 8 * hf, a.pack_g);
                const int64_t lo = wl >= 0 ? i + diag - wl : 0;
                const int64_t hi = wr >= 0 ? i + diag + wr : (int64_t)sk - 1;
                jmin[mt][hf] = (int)max((int64_t)0, min(lo, (int64_t)sk));
                jmax[mt][hf] = (int)min((int64_t)sk - 1, max(hi, (int64_t)-1));
                /* LEAN_REGS: park them (the quad's 4 lanes hold the same row;
                 * lane t == 0 writes). Only this warp reads its rows, and the
                 * first read is after the main loop's first __syncthreads. */
                if constexpr (S_::LEAN_REGS)
                    if (t == 0)
                        sts64(sMask + (uint32_t)(wrow + mt * 16 + g + 8 * hf) * 8,
                              (uint64_t)(uint32_t)jmin[mt][hf] | ((uint64_t)(uint32_t)jmax[mt][hf] << 32));
            }

        /* ---- cp.async tile loads. Unit u (one 16-byte chunk) walks a tile of R
         * rows in storage order: panel u / (PC*R), row (u / PC) % R, chunk
         * u % PC, stored at unit_smem_offset(u). 8 consecutive threads = 128
         * contiguous global bytes (one row at PC 8, two at PC 4) and one
         * 128-byte smem line, conflict-free. Thread tid handles units
         * tid + k*NT: its row and chunk differ from unit tid's by compile-time
         * amounts, so one base pointer per tensor. */
        const int h_kv = fc_fastdiv_div(c.h_base, a.heads_per_kv);
        constexpr int QS = NT / PC; /* panel rows covered by one pass of NT threads */
        static_assert(BN % QS == 0 || QS % BN == 0, "K/V load: passes must tile the rows");
        static_assert(NT % (8 * PC) == 0, "K/V load: unit tid + k*NT keeps tid's chunk and swizzle bits");
        /* Row and chunk of unit tid (load_kv recomputes them with LEAN_REGS). */
        const int kv_row0 = unit_row<BN, PC>(tid);
        const int kv_chunk0 = unit_chunk<BN, PC>(tid);
        /* CTA-uniform K/V bases. With KV_BASE_IN_SMEM they are parked in
         * shared memory (sBase, 16 bytes) and re-read at each load: there the
         * two 64-bit per-thread pointers held across the loop are exactly
         * the registers that would otherwise spill. Else each thread keeps
         * its own pointers (kt, vt: unit tid's row and chunk added). The
         * same rows park the mask-free block range beside them (re-read at
         * each block's mask test): with the tile decode's divisions now a
         * few instructions, ptxas keeps one more value of the prologue live
         * and these two loop bounds were the 4 bytes it spilled. */
        const uint16_t *__restrict__ kb0 = (const uint16_t *)p.k + c.bk * p.k_batch_stride +
                                           c.k_start * p.k_row_stride + (int64_t)h_kv * p.k_head_stride;
        const uint16_t *__restrict__ vb0 = (const uint16_t *)p.v + c.bk * p.v_batch_stride +
                                           c.k_start * p.v_row_stride + (int64_t)h_kv * p.v_head_stride;
        if constexpr (S_::KV_BASE_IN_SMEM) {
            if (tid == 0) {
                sts64(sBase, (uint64_t)kb0);
                sts64(sBase + 8, (uint64_t)vb0);
                sts64(sBase + 16, (uint64_t)(uint32_t)n_full_lo | ((uint64_t)(uint32_t)n_full_hi << 32));
            }
            /* LEAN_ADDR: the prologue's loads take kb0/vb0 from registers and
             * the first smem read is after the main loop's first barrier. */
            if constexpr (!LEAN_ADDR) __syncthreads();
        }
        const uint16_t *__restrict__ kt = kb0 + kv_row0 * p.k_row_stride + kv_chunk0 * 8;
        const uint16_t *__restrict__ vt = vb0 + kv_row0 * p.v_row_stride + kv_chunk0 * 8;
        const uint32_t kv_soff = unit_smem_offset<PC>(tid); /* unit tid's smem offset */
        /* TMA (thread 0 only): the K or V tile of block n into the buffer at
         * dst as ONE box, completing on bar. Map dims {32, rows, HD/32
         * panels, heads_kv, batch} with the panel dim's stride 64 bytes
         * (plan.cu; varlen: rows are the packed total, batch 1), box {32, BN,
         * HD/32, 1, 1}: it lands panel by panel, BN rows of 64 bytes each,
         * i.e. the PC 4 layout. One box, not one per panel: 8 boxes of one
         * panel each measured 10% slower (H100, session 14, runs 102-103:
         * 0.978x FA2 against 1.081x), thread 0's warp held up issuing them.
         * Keys past the tensor's rows are zero-filled. Keys past a varlen
         * sequence are the next sequence's: their scores are masked to -inf
         * like every key >= sk, and their V rows are zeroed before P V
         * (below), so that 0 * a non-finite value there never reaches O. */
        auto tma_tile = [&](int n, const CUtensorMap *map, uint32_t dst, uint32_t bar) {
            fc90::mbar_arrive_expect_tx(bar, S_::KV_BYTES);
            fc90::tma_load_5d(dst, map, bar, 0, (int)c.k_start + n * BN, 0, h_kv, (int)c.bk);
        };
        auto load_kv = [&](int n, int stage, auto sel) {
            /* LEAN_REGS: the same three values, recomputed from a fresh
             * %tid.x, so none of them is live between loads. */
            int row0 = kv_row0, chunk0 = kv_chunk0;
            uint32_t soff = kv_soff;
            if constexpr (S_::LEAN_REGS) {
                const int tid_ = tid_x_volatile();
                row0 = unit_row<BN, PC>(tid_);
                chunk0 = unit_chunk<BN, PC>(tid_);
                soff = unit_smem_offset<PC>(tid_);
            }
            (void)chunk0; /* only the KV_BASE_IN_SMEM path uses it */
            const uint32_t sK = sKV + stage * S_::STAGE_BYTES + soff;
            const uint32_t sV = sK + S_::KV_BYTES;
            constexpr int UNITS = BN * HD / 8;
            const int j0 = n * BN + row0;
            const int64_t kn = (int64_t)n * BN * p.k_row_stride;
            const int64_t vn = (int64_t)n * BN * p.v_row_stride;
            const uint16_t *__restrict__ kbase = nullptr, *__restrict__ vbase = nullptr;
            if constexpr (S_::KV_BASE_IN_SMEM) { /* (volatile loads: only the ones used) */
                if constexpr (decltype(sel)::K) kbase = (const uint16_t *)lds64(sBase);
                if constexpr (decltype(sel)::V) vbase = (const uint16_t *)lds64(sBase + 8);
            }
            /* (each is unreferenced in some instantiation of this generic lambda) */
            (void)kn, (void)vn, (void)kbase, (void)vbase;
#pragma unroll
            for (int k = 0; k < (UNITS + NT - 1) / NT; ++k) {
                if (UNITS % NT == 0 || tid + k * NT < UNITS) {
                    /* Unit tid + k*NT sits DR rows and DC chunks from unit tid
                     * (u/PC grows by k*QS; BN and QS divide one another) and k*NT*16
                     * bytes further in smem (the swizzle bits are tid's). */
                    const int DR = (k * QS) % BN, DC = ((k * QS) / BN) * PC;
                    /* Keys past the end are zero-filled (src-size 0: nothing is
                     * read); they still get an address inside the tensor. */
                    const bool ok = j0 + DR < sk;
                    const uint16_t *ks = (const uint16_t *)p.k, *vs = (const uint16_t *)p.v;
                    if (ok) {
                        if constexpr (S_::KV_BASE_IN_SMEM) {
                            const int64_t jr = j0 + DR;
                            ks = kbase + (jr * p.k_row_stride + (chunk0 + DC) * 8);
                            vs = vbase + (jr * p.v_row_stride + (chunk0 + DC) * 8);
                        } else {
                            ks = kt + (kn + DR * p.k_row_stride + DC * 8);
                            vs = vt + (vn + DR * p.v_row_stride + DC * 8);
                        }
                    }
                    if constexpr (decltype(sel)::K) ptx::cp_async_16(sK + k * NT * 16, ks, ok);
                    if constexpr (decltype(sel)::V) ptx::cp_async_16(sV + k * NT * 16, vs, ok);
                }
            }
        };
        auto load_q = [&]() {
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
                    const int h = c.h_base + (int)(rr - i * G);
                    src = qg + c.bq * p.q_batch_stride + (c.q_start + i) * p.q_row_stride +
                          (int64_t)h * p.q_head_stride + ch * 8;
                }
                ptx::cp_async_16(sQ + unit_smem_offset<PC>(u), src, ok);
            }
        };

        /* ---- kVarLeanAddr loads. The chunks a thread copies in one tile lie
         * on NR distinct rows (pass k: row + (k*QS) % R, chunk + PC * ((k*QS) / R)
         * -- see load_kv), so one 64-bit pointer per distinct row, built by
         * 64-bit adds of QS rows, covers them all; the panel hop is a constant
         * byte offset (an immediate of the LDGSTS). Rows past the end get the
         * tensor base (+ that in-row offset, still inside row 0) as load_kv's
         * do. No 64-bit multiply per chunk, no per-chunk stride reloads. */
        static_assert(BM % QS == 0 || QS % BM == 0, "Q load: passes must tile the rows");
        auto load_kv_lean = [&](int n, int stage, auto sel, auto from_regs) {
            /* unit tid's row, chunk, smem offset: from a fresh %tid.x (S2R + a
             * few ALU ops), so that none of them is held across the loop */
            const int tid_ = decltype(from_regs)::value ? tid : tid_x_volatile();
            const int row0 = unit_row<BN, PC>(tid_);
            const int chunk0 = unit_chunk<BN, PC>(tid_);
            const uint32_t sK = sKV + stage * S_::STAGE_BYTES + unit_smem_offset<PC>(tid_);
            const uint32_t sV = sK + S_::KV_BYTES;
            constexpr int UNITS = BN * HD / 8;
            constexpr int NR = BN > QS ? BN / QS : 1; /* distinct row offsets of the passes */
            const int j0 = n * BN + row0;
            (void)chunk0; /* only the KV_BASE_IN_SMEM path uses it */
            constexpr bool DO_K = decltype(sel)::K, DO_V = decltype(sel)::V;
            const uint16_t *kp = nullptr, *vp = nullptr; /* unit tid, block n */
            if constexpr (S_::KV_BASE_IN_SMEM) {
                const uint16_t *kbase, *vbase;
                if constexpr (decltype(from_regs)::value) {
                    kbase = kb0;
                    vbase = vb0;
                } else { /* (volatile loads: only the ones used) */
                    if constexpr (DO_K) kbase = (const uint16_t *)lds64(sBase);
                    if constexpr (DO_V) vbase = (const uint16_t *)lds64(sBase + 8);
                }
                if constexpr (DO_K) kp = kbase + ((int64_t)j0 * p.k_row_stride + chunk0 * 8);
                if constexpr (DO_V) vp = vbase + ((int64_t)j0 * p.v_row_stride + chunk0 * 8);
            } else {
                if constexpr (DO_K) kp = kt + (int64_t)n * BN * p.k_row_stride;
                if constexpr (DO_V) vp = vt + (int64_t)n * BN * p.v_row_stride;
            }
            const uint16_t *kr[NR], *vr[NR];
            bool okr[NR];
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                okr[r] = j0 + r * QS < sk;
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
        };
        /* Q with G == 1 (else the general load_q: packed rows map to (i, h)
         * by a division). Row rr = r0 + r is query position r0 + r of head h_base. */
        auto load_q_lean = [&]() {
            if (G != 1) {
                load_q();
                return;
            }
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
        };
        /* The loads the kernel issues: lean or the general ones. from_regs:
         * the prologue (K/V bases still in registers). */
        auto kv_load = [&](int n, int stage, auto sel, auto from_regs) {
            if constexpr (LEAN_ADDR)
                load_kv_lean(n, stage, sel, from_regs);
            else
                load_kv(n, stage, sel);
        };
        auto q_load = [&]() {
            if constexpr (LEAN_QO)
                load_q_lean();
            else
                load_q();
        };

        /* ldmatrix lane offsets inside a 16-row band of a panel (file comment):
         *  offA: A operand (Q) and V^T: lane -> row lane%16, chunk lane/16
         *  offB: B operand (K): lane -> row 8*(lane/16) + lane%8, chunk (lane/8)%2
         * k16 step kk % KPP of a panel has logical chunk + 2 (kk % KPP): XOR
         * (kk % KPP) * 32 bytes (the swizzle is an XOR, the two lane bits and
         * the step's bits are disjoint). */
        auto off_a = [](int l) {
            return (uint32_t)((l & 15) * PB + ((((l >> 4) ^ panel_swz<PC>(l & 15)) & (PC - 1)) << 4));
        };
        auto off_b = [](int l) {
            return (uint32_t)((((l >> 4) << 3) + (l & 7)) * PB + (((((l >> 3) & 1) ^ panel_swz<PC>(l & 7)) & (PC - 1)) << 4));
        };
        /* The lane the main loop's ldmatrix offsets derive from
         * (Shape::FRESH_LANE_OFFS). */
        auto loop_lane = [&]() {
            if constexpr (S_::FRESH_LANE_OFFS)
                return tid_x_volatile() & 31;
            else
                return lane;
        };
        uint32_t qf[Q_IN_REGS ? MT : 1][Q_IN_REGS ? KSTEPS : 1][4];
        const float sl2 = a.sl2;
        const float softcap_in = a.softcap_in;

        if (n_begin < n_end) {
            /* prologue: group 0 = Q + block n_begin (split: Q + K tile of n_begin
             * only); ring: groups 1..STAGES-2 = next blocks.
             * EARLY: group 0 = Q + K of n_begin, group 1 = V of n_begin, groups
             * 2..STAGES = blocks n_begin+1..n_begin+STAGES-1 (all slots free). */
            q_load();
            if constexpr (TMA) {
                /* The barriers are initialised by the thread that first
                 * arms them; every other thread's first wait follows the
                 * loop's first __syncthreads. */
                if (tid == 0) {
                    fc90::mbar_init(sBarK, 1);
                    fc90::mbar_init(sBarV, 1);
                    fc90::mbar_fence_init();
                    tma_tile(n_begin, &maps->k, sKV, sBarK);
                }
                ptx::cp_async_commit(); /* Q alone */
            } else if constexpr (S_::KV_SPLIT) {
                kv_load(n_begin, 0, LoadK{}, Flag<true>{});
                ptx::cp_async_commit();
            } else if constexpr (EARLY) {
                kv_load(n_begin, 0, LoadK{}, Flag<true>{});
                ptx::cp_async_commit();
                kv_load(n_begin, 0, LoadV{}, Flag<true>{});
                ptx::cp_async_commit();
#pragma unroll
                for (int s = 1; s < STAGES; ++s) {
                    if (n_begin + s < n_end) kv_load(n_begin + s, s, LoadKV{}, Flag<true>{});
                    ptx::cp_async_commit(); /* always commit: keeps the group count uniform */
                }
            } else {
                kv_load(n_begin, 0, LoadKV{}, Flag<true>{});
                ptx::cp_async_commit();
#pragma unroll
                for (int s = 1; s < STAGES - 1; ++s) {
                    if (n_begin + s < n_end) kv_load(n_begin + s, s, LoadKV{}, Flag<true>{});
                    ptx::cp_async_commit(); /* always commit: keeps the group count uniform */
                }
            }
        }

        /* Split K/V (STAGES == 1) invariant. Every thread commits the same
         * sequence of cp.async groups, and at each wait exactly ONE group of
         * its own is pending -- the one the next phase reads -- so
         * wait_group 0 is exact (never waits for more than that tile):
         *   top of block n:  pending {K_n} (for n_begin: {Q + K_n}, prologue)
         *     wait_group 0 ; __syncthreads
         *       -> K_n (and Q) visible to all; every thread is past O += P V_{n-1},
         *          so the V buffer is free: issue V_n, commit.   pending {V_n}
         *     S = Q K_n^T, softcap, masks (read the K buffer)
         *     wait_group 0 ; __syncthreads
         *       -> V_n visible to all; every thread is past S = Q K_n^T, so the
         *          K buffer is free: issue K_{n+1} (if n+1 < n_end; the group
         *          is committed, possibly empty, either way).  pending {K_{n+1}}
         *     softmax, O += P V_n (reads the V buffer)
         * So a buffer is only written between the barrier after its last
         * reader and the barrier before its next reader, and that barrier
         * follows the writer thread's own wait for the group. The epilogue's
         * O staging in the Q tile needs nothing more than in the ring (each
         * warp only reads and writes its own rows of it); after the loop
         * only an empty group can be pending. */
        /* kVarTma: the same two points per block, with the copies issued by
         * thread 0 and awaited on the buffers' mbarriers (each completes
         * once per block: phase parity ph). A buffer is rearmed only after
         * the __syncthreads that follows every thread's last read of it
         * and its own wait on the previous phase, so no wait can see a
         * phase two ahead. Q is the only cp.async group (prologue). */
        int stage = 0;
        uint32_t ph = 0;
        (void)ph;
        bool first = true; /* EARLY: block n_begin (a predicate, not n_begin kept live) */
        for (int n = n_begin; n < n_end; ++n) {
            if constexpr (TMA) {
                ptx::cp_async_wait<0>(); /* Q (block n_begin; a no-op after)   */
                __syncthreads();         /* Q visible; V buffer free           */
                if (tid == 0) tma_tile(n, &maps->v, sKV + S_::KV_BYTES, sBarV);
                fc90::mbar_wait(sBarK, ph); /* K_n landed                      */
            } else if constexpr (S_::KV_SPLIT) {
                ptx::cp_async_wait<0>(); /* K_n (+ Q at n_begin) landed       */
                __syncthreads();         /* visible; V buffer free (invariant) */
                kv_load(n, 0, LoadV{}, Flag<false>{});
                ptx::cp_async_commit();
            } else if constexpr (VAR == 0) {
                /* Groups committed so far: STAGES-1 + (n - n_begin), block n being
                 * number n - n_begin: at most STAGES-2 may still be pending. */
                ptx::cp_async_wait<STAGES - 2>();
                /* Block n now visible to every thread; every thread is done with
                 * block n-1, whose stage is the one block n+STAGES-1 refills. */
                __syncthreads();
                int ls = stage + STAGES - 1;
                if (ls >= STAGES) ls -= STAGES;
                if (n + STAGES - 1 < n_end) load_kv(n + STAGES - 1, ls, LoadKV{});
                ptx::cp_async_commit();
            } else {
                /* The same for the variants, as a lambda: written inline (the
                 * VAR == 0 branch above, kept so that the planned kernels compile
                 * exactly as before), ptxas spills 8 bytes in 128x128 d64 v1/v3. */
                auto ring_top = [&]() {
                    /* (EARLY, n > n_begin: STAGES+1 + (n - n_begin - 1) groups
                     * committed, block n is number n - n_begin + 1: the same
                     * STAGES-2 may be pending.) */
                    ptx::cp_async_wait<STAGES - 2>();
                    /* Block n now visible to every thread; every thread is done with
                     * block n-1, whose stage is the one block n+STAGES-1 refills. */
                    __syncthreads();
                    int ls = stage + STAGES - 1;
                    if (ls >= STAGES) ls -= STAGES;
                    if (n + STAGES - 1 < n_end) kv_load(n + STAGES - 1, ls, LoadKV{}, Flag<false>{});
                    ptx::cp_async_commit();
                };
                if constexpr (EARLY) {
                    if (first) {
                        /* Block n_begin: STAGES+1 groups committed and group 0
                         * (Q + K_n) is needed: STAGES may remain. Block
                         * n+STAGES-1 was issued by the prologue. */
                        ptx::cp_async_wait<STAGES>();
                        __syncthreads();
                    } else {
                        ring_top();
                    }
                } else {
                    ring_top();
                }
            }
            if constexpr (Q_IN_REGS) {
                if (n == n_begin) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int kk = 0; kk < KSTEPS; ++kk)
                            ptx::ldmatrix_x4(qf[mt][kk], sQ + (kk / KPP) * (BM * PB) + (wrow + mt * 16) * PB +
                                                             (off_a(lane) ^ ((kk % KPP) << 5)));
                }
            }
            const uint32_t sK = sKV + stage * S_::STAGE_BYTES, sV = sK + S_::KV_BYTES;

            /* ---- S = Q K^T: s[mt][nt] = rows of m-tile mt x keys n*BN + 8nt .. +7 */
            float s[MT][NTL][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
            const int lane_s = loop_lane();
            const uint32_t offA = off_a(lane_s), offB = off_b(lane_s);
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                uint32_t qa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    if constexpr (Q_IN_REGS) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) qa[mt][e] = qf[mt][kk][e];
                    } else {
                        ptx::ldmatrix_x4(qa[mt], sQ + (kk / KPP) * (BM * PB) + (wrow + mt * 16) * PB +
                                                     (offA ^ ((kk % KPP) << 5)));
                    }
                }
#pragma unroll
                for (int np = 0; np < NTL / 2; ++np) {
                    /* keys 16np..16np+15 x head-dim cols 16kk..16kk+15:
                     * kb[0..1] = B of n-tile 2np, kb[2..3] = B of n-tile 2np+1 */
                    uint32_t kb[4];
                    ptx::ldmatrix_x4(kb, sK + (kk / KPP) * (BN * PB) + np * (16 * PB) + (offB ^ ((kk % KPP) << 5)));
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        ptx::mma_16816<kBF16>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
                        ptx::mma_16816<kBF16>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
                    }
                }
            }

            /* ---- softcap: s <- tanh(s * scale/softcap); sl2 carries softcap*log2e */
            if (!PLAIN && softcap_in != 0.f) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) s[mt][nt][e] = tanh_acc(s[mt][nt][e] * softcap_in);
            }

            /* ---- masks, only on blocks straddling a band edge or sk ---- */
            int nf_lo = n_full_lo, nf_hi = n_full_hi;
            if constexpr (S_::KV_BASE_IN_SMEM && !PLAIN) { /* (volatile: really re-read) */
                const uint64_t v = lds64(sBase + 16);
                nf_lo = (int)(uint32_t)v;
                nf_hi = (int)(uint32_t)(v >> 32);
            }
            if (!PLAIN && (n < nf_lo || n >= nf_hi)) {
                int lo[MT][2], hi[MT][2]; /* [jmin, jmax] of the thread's rows */
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int hf = 0; hf < 2; ++hf) {
                        if constexpr (S_::LEAN_REGS) { /* from the smem table (volatile: really re-read) */
                            const uint64_t v = lds64(sMask + (uint32_t)(wrow + mt * 16 + g + 8 * hf) * 8);
                            lo[mt][hf] = (int)(uint32_t)v;
                            hi[mt][hf] = (int)(uint32_t)(v >> 32);
                        } else {
                            lo[mt][hf] = jmin[mt][hf];
                            hi[mt][hf] = jmax[mt][hf];
                        }
                    }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int hf = e >> 1; /* c0,c1: row g; c2,c3: row g+8 */
                            const int j = n * BN + nt * 8 + 2 * t + (e & 1);
                            if (j < lo[mt][hf] || j > hi[mt][hf]) s[mt][nt][e] = -INFINITY;
                        }
            }

            if constexpr (TMA) {
                __syncthreads(); /* every thread is past S = Q K_n^T: K buffer free */
                if (tid == 0 && n + 1 < n_end) tma_tile(n + 1, &maps->k, sKV, sBarK);
                fc90::mbar_wait(sBarV, ph); /* V_n landed                      */
                ph ^= 1;
                /* A varlen sequence's last block: V rows sk - n*BN .. BN-1 are
                 * the next sequence's (tma_tile). Zero them; the barrier
                 * orders the zeros before every warp's P V. This is the
                 * range's last block (n_end <= its block count), so no later
                 * copy lands in the V buffer. Varlen never runs the plain
                 * instance (mask_mode.h), which therefore leaves it out. */
                if (!PLAIN && p.cu_seqlens_k && (n + 1) * BN > sk) {
                    zero_rows_from<S_::KV_BYTES, PB, BN, NT>(sKV + S_::KV_BYTES, sk - n * BN, tid);
                    __syncthreads();
                }
            } else if constexpr (S_::KV_SPLIT) {
                ptx::cp_async_wait<0>(); /* V_n landed                             */
                __syncthreads();         /* visible; K buffer free (invariant)     */
                if (n + 1 < n_end) kv_load(n + 1, 0, LoadK{}, Flag<false>{});
                ptx::cp_async_commit();  /* always: one pending group at each wait */
            }

            /* ---- online softmax: a thread holds 2 rows per m-tile; a row's 4
             * owners are one quad (xor 1, 2). l_run stays a per-thread partial
             * sum until the end (the quad rescales it alike). */
            float corr[MT][2];
            bool rescale = false;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    float mx = m_run[mt][hf];
#pragma unroll
                    for (int nt = 0; nt < NTL; ++nt)
                        mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    /* Row still fully masked: offset 0, so -inf - (-inf) never
                     * makes a NaN (every p is exp2(-inf) = 0). */
                    const float ms = (mx == -INFINITY) ? 0.f : mx * sl2;
                    /* Nothing accumulated yet: factor 0 (never exp2(+big) * 0).
                     * An unchanged max gives exactly ex2(0) = 1. */
                    corr[mt][hf] = (m_run[mt][hf] == -INFINITY) ? 0.f : ptx::ex2(m_run[mt][hf] * sl2 - ms);
                    rescale |= corr[mt][hf] != 1.f;
                    m_run[mt][hf] = mx;
                    float rs = 0.f;
#pragma unroll
                    for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const float pv = ptx::ex2(fmaf(s[mt][nt][2 * hf + e], sl2, -ms));
                            s[mt][nt][2 * hf + e] = pv;
                            rs += pv;
                        }
                    l_run[mt][hf] = l_run[mt][hf] * corr[mt][hf] + rs;
                }
            /* Rescale O only when some row of the warp has a new max: after the
             * first blocks of a long row that is rare, and skipping saves
             * MT*HD/2 multiplies per block (warp-uniform branch). */
            if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int dt = 0; dt < DTL; ++dt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) o[mt][dt][e] *= corr[mt][e >> 1];
            }

            if constexpr (EARLY) {
                if (first) {
                    /* V of the first block: group 1 of the STAGES+1 committed. */
                    ptx::cp_async_wait<STAGES - 1>();
                    __syncthreads();
                }
            }

            /* ---- O += P V. The C fragments of n-tiles 2kk, 2kk+1 are exactly
             * the A fragment of k16 step kk (keys 16kk..16kk+15). */
            const uint32_t offV = off_a(loop_lane());
#pragma unroll
            for (int kk = 0; kk < PSTEPS; ++kk) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    pa[mt][0] = ptx::pack2<kBF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);         /* row g,   k 2t   */
                    pa[mt][1] = ptx::pack2<kBF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);         /* row g+8, k 2t   */
                    pa[mt][2] = ptx::pack2<kBF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]); /* row g,   k 2t+8 */
                    pa[mt][3] = ptx::pack2<kBF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]); /* row g+8, k 2t+8 */
                }
#pragma unroll
                for (int dp = 0; dp < DTL / 2; ++dp) {
                    /* keys 16kk.. x head-dim cols 16dp..16dp+15 (chunks 2dp, 2dp+1):
                     * vb[0..1] = B of d-tile 2dp, vb[2..3] = B of d-tile 2dp+1 */
                    uint32_t vb[4];
                    ptx::ldmatrix_x4_trans(vb, sV + (dp / KPP) * (BN * PB) + kk * (16 * PB) + (offV ^ ((dp % KPP) << 5)));
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        ptx::mma_16816<kBF16>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
                        ptx::mma_16816<kBF16>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
                    }
                }
            }
            stage = (stage + 1 == STAGES) ? 0 : stage + 1;
            if constexpr (EARLY) first = false;
        }
        ptx::cp_async_wait<0>(); /* only empty groups can remain; drain anyway */
    }

    /* ---- epilogue: full row sums, normalise, LSE (natural log). Fully
     * masked rows (l = 0) give O = 0 and LSE = -inf. */
    const float sl2 = a.sl2;
    float inv[MT][2], lse[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float l = l_run[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[mt][hf] = l > 0.f ? 1.f / l : 0.f;
            lse[mt][hf] = l > 0.f ? (m_run[mt][hf] * sl2 + __log2f(l)) * kLn2 : -INFINITY;
        }

    const TileCoords c = locate_tile<BM>(a);
    if (a.num_splits.d > 1) {
        /* Split-KV: fp32 O_i (normalised by this split's own sum) and LSE_i at
         * [split][b][h][i], i < the sequence's length; combine.cu merges. */
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int64_t rr = c.r0 + wrow + mt * 16 + g + 8 * hf;
                if (rr >= c.rows) continue;
                const int64_t i = row_pos(rr, a.pack_g);
                const int h = c.h_base + (int)(rr - i * c.G);
                const int64_t row = (((int64_t)c.split * p.batch + c.b) * p.heads_q + h) * p.seqlen_q + i;
                float *dst = p.o_accum + row * HD + 2 * t;
#pragma unroll
                for (int dt = 0; dt < DTL; ++dt)
                    *reinterpret_cast<float2 *>(dst + dt * 8) =
                        make_float2(o[mt][dt][2 * hf] * inv[mt][hf], o[mt][dt][2 * hf + 1] * inv[mt][hf]);
                if (t == 0) p.lse_accum[row] = lse[mt][hf];
            }
        return;
    }

    /* Output: stage the warp's rows (normalised, converted) in its own rows of
     * the Q tile's smem -- no other warp reads or writes them, so a warp
     * barrier suffices -- then 16-byte stores, 128 contiguous bytes per 8 lanes. */
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < DTL; ++dt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = wrow + mt * 16 + g + 8 * hf;
                ptx::sts32(sQ + panel_offset<BM, PC>(r, dt) + 4 * t,
                           ptx::pack2<kBF16>(o[mt][dt][2 * hf] * inv[mt][hf], o[mt][dt][2 * hf + 1] * inv[mt][hf]));
            }
    __syncwarp();
    uint16_t *__restrict__ og = (uint16_t *)p.o;
    constexpr int WUNITS = WROWS * HD / 8;
    auto store_o = [&]() {
#pragma unroll
        for (int k = 0; k < WUNITS / 32; ++k) {
            const int u = lane + 32 * k; /* storage order inside the warp's rows */
            const int r = wrow + unit_row<WROWS, PC>(u);
            const int ch = unit_chunk<WROWS, PC>(u);
            const int64_t rr = c.r0 + r;
            if (rr < c.rows) {
                const uint4 v = ptx::lds128(sQ + panel_offset<BM, PC>(r, ch));
                const int64_t i = row_pos(rr, a.pack_g);
                const int h = c.h_base + (int)(rr - i * c.G);
                uint16_t *dst = og + c.bq * p.o_batch_stride + (c.q_start + i) * p.o_row_stride +
                                (int64_t)h * p.o_head_stride + ch * 8;
                if constexpr (LEAN_QO)
                    stg128(dst, v);
                else
                    *reinterpret_cast<uint4 *>(dst) = v;
            }
        }
    };
    if constexpr (LEAN_QO) {
        if (c.G == 1) {
            /* Unit lane + 32k, RP = 32 / PC rows per pass: row wrow + lane/PC
             * + (RP*k % WROWS), chunk PC * (RP*k / WROWS) + lane % PC -- WROWS/RP
             * distinct rows, one pointer each (query position r0 + row of head
             * h_base), panel hops as immediates, one STG.128 per chunk. */
            constexpr int RP = 32 / PC;
            static_assert(WROWS % RP == 0, "epilogue: whole passes of a warp's rows");
            constexpr int NRO = WROWS / RP;
            const int orow = wrow + (lane >> LPC);
            uint16_t *o0 = og + c.bq * p.o_batch_stride + (c.q_start + c.r0 + orow) * p.o_row_stride +
                           (int64_t)c.h_base * p.o_head_stride + (lane & (PC - 1)) * 8;
            uint16_t *orp[NRO];
#pragma unroll
            for (int j = 0; j < NRO; ++j) orp[j] = j == 0 ? o0 : orp[j - 1] + (int64_t)RP * p.o_row_stride;
#pragma unroll
            for (int k = 0; k < WUNITS / 32; ++k) {
                const int j = (RP * k % WROWS) / RP, DC = (RP * k / WROWS) * PC;
                if (c.r0 + orow + RP * j < c.rows)
                    stg128(orp[j] + DC * 8, ptx::lds128(sQ + panel_offset<BM, PC>(orow + RP * j, DC + (lane & (PC - 1)))));
            }
        } else {
            store_o();
        }
    } else {
        store_o();
    }
    if (p.lse && t == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int64_t rr = c.r0 + wrow + mt * 16 + g + 8 * hf;
                if (rr >= c.rows) continue;
                const int64_t i = row_pos(rr, a.pack_g);
                const int h = c.h_base + (int)(rr - i * c.G);
                p.lse[c.bq * p.lse_batch_stride + (int64_t)h * p.lse_head_stride +
                      (c.q_start + i) * p.lse_row_stride] = lse[mt][hf];
            }
    }
}

/* The kernel. SM90_ONLY: the tile is a row of the SM90 class alone
 * (tiles.cuh: tile_sm90_only), which the planner never launches below sm_90,
 * so older targets get an empty body -- no code, no compile time, and no
 * ptxas verdict (e.g. spills) on a register budget tuned for sm_90. */
template <bool kBF16, int HD, int BM, int BN, int W, int STAGES, int MIN_CTAS, bool SM90_ONLY, int VAR,
          bool PLAIN>
__global__ void __launch_bounds__(W * 32, MIN_CTAS) fwd_kernel(const fc_sm80_args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    if constexpr (SM90_ONLY)
        return;
    else
#endif
    {
        /* With PDL (a.pdl, sm_90+) this grid launches while the previous
         * kernel in the stream finishes: nothing global before this. */
        fc_grid_dep_sync();
        fwd_body<kBF16, HD, BM, BN, W, STAGES, VAR, PLAIN>(a, nullptr);
    }
}

/* The kernel of kVarTma rows (SM90 class only): the same body, with the K/V
 * tensor maps as a __grid_constant__ second parameter (fwd_args.h). */
template <bool kBF16, int HD, int BM, int BN, int W, int STAGES, int MIN_CTAS, bool SM90_ONLY, int VAR,
          bool PLAIN>
__global__ void __launch_bounds__(W * 32, MIN_CTAS)
    fwd_kernel_tma(const fc_sm80_args a, const __grid_constant__ fc_sm80_kv_maps maps)
{
    static_assert(SM90_ONLY, "kVarTma rows are SM90-class rows (tiles.cuh)");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    fc_grid_dep_sync();
    fwd_body<kBF16, HD, BM, BN, W, STAGES, VAR, PLAIN>(a, &maps);
#endif
}

} /* namespace sm80 */
} /* namespace fc */

#endif /* FC_SM80_FWD_KERNEL_CUH */
