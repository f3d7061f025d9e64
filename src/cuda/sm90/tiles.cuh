/*
 * tiles.cuh -- THE table of Hopper forward-kernel configurations. Host code
 * (plan.cu) picks an index; each kernel TU instantiates the entries of its
 * head_dim. Every limit a row must respect is written here once.
 *
 * CTA = 1 producer warpgroup (TMA) + `wgs` consumer warpgroups of 64 query
 * rows each: block_m = 64 * wgs. With 2 consumer warpgroups the CTA has 384
 * threads; __launch_bounds__(384, 1) caps the entry allocation at
 * 65536 / 384 = 168 registers, then setmaxnreg moves registers from the
 * producer (dec to 40) to the consumers (inc to 232), FA3's split:
 *     128 * 40 + 256 * 232 = 64512 = 384 * 168     (what the CTA owns)
 * (24/240 spilled in the producer once it also ran the dynamic tile
 * scheduler: atomic fetch + tile hand-off.)
 * With 3 consumer warpgroups (512 threads, 128 registers at entry):
 *     128 * 40 + 384 * 152 = 63488 <= 65536 = 512 * 128
 * (32/160, FA3's split, spilled the producer's scheduler at d128), so a
 * 3-warpgroup row must fit S + O (+ P while converting) + ~30 in 152.
 * With 4 (640 threads) the entry share is 65536 / 640 = 102, rounded down to
 * 96: registers come in steps of 8 per thread, and setmaxnreg only moves
 * them within what the CTA was given at launch (an increase past it waits
 * forever, session 12):
 *     128 * 32 + 512 * 112 = 61440 = 640 * 96
 * (the d64 producer fits 32), so a 4-warpgroup row fits S + P + O + ~30 in 112.
 *
 * Consumer register budget (232 per thread), per 64-row warpgroup, fp32:
 *     S accumulator   block_n / 2        (64 x block_n over 128 threads)
 *     P fragments     block_n / 4        (16-bit pairs; live together with S
 *                                         in the intra-warpgroup overlap)
 *     O accumulator   head_dim / 2
 *     + ~30 for addresses, row max/sum, mask limits, loop state.
 *
 * Shared memory (dynamic, 1024-aligned, H100/H200 opt-in limit 227 KB =
 * 232448 B, checked against the device at plan time):
 *     Q           block_m * head_dim * 2
 *     K, V ring   stages * 2 * block_n * head_dim * 2
 *     + 1024 alignment slack + barriers (256 B)
 *
 * Swizzle: 128-byte (rows of 64 16-bit elements) when head_dim % 64 == 0;
 * head_dim 96 uses 64-byte swizzle (rows of 32), because a wgmma MN-major
 * 128B operand needs N (= head_dim for P.V) to be a multiple of 64. With
 * swizzle the TMA box inner extent must be <= the swizzle span, so each
 * tile is loaded as head_dim / (swz/2) column panels; box rows <= 256.
 *
 * Starting point: FlashAttention-3's published 16-bit choices (HOPPER-NOTES
 * section 2), with 2 consumer warpgroups except the tall rows 7 and 9:
 *   d64   FA3 192x192 / causal 192x128 with 3 WGs. Here 128x128 (2 WGs), and
 *         192x128 (3 WGs; 192x192 would need 176 registers) where the query
 *         rows pad little.
 *   d96   FA3 192x144. Here 128x128, 64B swizzle.
 *   d128  FA3 128x176 non-causal, 128x128 causal/local. Here 128x128 for both
 *         (2 Q buffers; see row 2).
 *   d192  FA3 128x112 (V head_dim 192): same; 128x128 would need 240 KB.
 *   d256  FA3 128x80: same; Q 64 KB + 2 stages * 80 KB = 224 KB.
 * Pingpong (named-barrier alternation of the two consumer warpgroups) for
 * head_dim <= 128 as FA3; intra-warpgroup overlap everywhere.
 *
 * Small problems (e.g. B=1, H=8, S=512: 32 tiles of 128 rows for 132 SMs):
 * plan.cu switches to a 64-row entry (1 consumer warpgroup, 256 threads,
 * up to 255 registers without setmaxnreg, 1 CTA/SM) when the 128-row grid
 * would occupy at most half of the SMs; dispatch may add split-KV on top.
 * With a causal or local mask it takes the kvsplit entry instead (2
 * consumer warpgroups taking the 64-row tile's KV blocks in turn).
 * Decode-like GQA shapes fold the query heads of a KV head into the rows
 * (pack-GQA, plan.cu), which needs ratio | block_m.
 */
#ifndef FC_SM90_TILES_CUH
#define FC_SM90_TILES_CUH

typedef struct fc_sm90_tile {
    int head_dim;
    int block_m;   /* 64 * wgs / kvsplit                                       */
    int block_n;   /* multiple of 16 (P.V k-steps), <= 256 (wgmma N, TMA box)  */
    int wgs;       /* consumer warpgroups                                      */
    int stages;    /* K/V ring depth                                           */
    int swz;       /* swizzle bytes: 128 or 64                                 */
    int pingpong;  /* 1: consumer warpgroups alternate GEMMs on named barriers */
    int overlap;   /* 1: issue S(j+1) before the softmax of block j            */
    int small;     /* 1: 64-row variant, chosen when the 128-row grid would
                    * occupy less than half of the SMs (few heads/rows)     */
    int qbufs;     /* Q buffers, 1 or 2. With 2 the next tile's Q loads while
                    * the current tile runs (its epilogue stages O in its own
                    * Q buffer), hiding the per-tile Q latency; needs the
                    * shared memory of a second Q tile.                     */
    int tall;      /* 0, or: an alternate with more rows per tile (3 or 4
                    * consumer warpgroups: more independent GEMM chains per
                    * SM where one 64-row chain per warpgroup is latency-
                    * bound, d64), and the value is its expected throughput
                    * gain in percent over the 128-row entry. plan.cu takes
                    * the tall row of least wave-quantised cost,
                    * ceil(tiles / SMs) * block_m / (1 + tall/100), when it
                    * is below the 128-row entry's.                      */
    int ctas;      /* CTAs per SM the registers and shared memory are sized
                    * for (1 or 2). 2: a second CTA's GEMMs fill the tensor
                    * cores while one CTA is between tiles (Q wait, first
                    * block, epilogue), which matters where tiles are short
                    * (s512: 4 KV blocks). Every row is 1: a 2-CTA d64 row
                    * (row 5's 64x128 tile, setmaxnreg 40/216) measured 1-4%
                    * slower than the 1-CTA rows at the mission shape and
                    * s512-d64 (H100, session 4, notes-sm90.md) and was
                    * dropped; launch bounds, setmaxnreg, grid and carveout
                    * still follow this column.                            */
    int kvsplit;   /* 1, or 2: the consumer warpgroups share one 64-row tile and
                    * take its KV blocks in turn (block_m = 64 * wgs / kvsplit),
                    * then merge their (max, sum, O) through shared memory
                    * before one of them stores. Without pingpong or the
                    * rotated loop. Measured for small grids (H100, session
                    * 5): +9% where a causal mask makes tiles unequal
                    * (mission-causal), -2% on the unmasked mission shape,
                    * so plan.cu takes it for masked small grids only. */
    int unbanded;  /* 1: the planner takes this row only for calls without a
                    * causal or local band, where alone it was measured.
                    * Omitted (= 0) in the other rows.                     */
} fc_sm90_tile;

/*                      d    M    N  wg st swz pp ov sm qb ta ct kv (ub)  S+P+O regs  smem (Q*qb + ring) */
#define FC_SM90_TILE_TABLE                                                                              \
    {64, 128, 128, 2, 2, 128, 1, 1, 0, 2, 0, 1, 1},  /* 0: 64+32+32=128;  2*16K+2*32K = 96 KB   */  \
    {96, 128, 128, 2, 2, 64, 1, 1, 0, 2, 0, 1, 1},   /* 1: 64+32+48=144;  2*24K+2*48K = 144 KB  */  \
    /* 2: d128, causal and not: 64+32+64=160; 2*32K+2*64K = 192 KB. FA3's non-causal  \
     * 128x176 (1 Q buffer, 208 KB) ran 8% slower at s2k-d128 and 1% at s8k once   \
     * 2 Q buffers hid the epilogue's store read (H100, notes-sm90.md run 9).       */ \
    {128, 128, 128, 2, 2, 128, 1, 1, 0, 2, 0, 1, 1},                                            \
    {192, 128, 112, 2, 2, 128, 0, 1, 0, 1, 0, 1, 1}, /* 3: 56+28+96=180;  48K+2*84K = 216 KB    */  \
    {256, 128, 80, 2, 2, 128, 0, 1, 0, 1, 0, 1, 1},  /* 4: 40+20+128=188; 64K+2*80K = 224 KB    */  \
    /* 5: small; 2*8K+2*32K = 80 KB, <=255 regs. A 4-stage ring (all 4 KV blocks of   \
     * the mission shape in flight from the start) ran 1.6% slower (H100, session 5). */ \
    {64, 64, 128, 1, 2, 128, 0, 1, 1, 2, 0, 1, 1},                                              \
    {128, 64, 128, 1, 2, 128, 0, 1, 1, 2, 0, 1, 1},  /* 6: small; 2*16K+2*64K = 160 KB          */  \
    /* 7: d64 tall, FA3's 3 consumer warpgroups, 2*24K+2*32K = 112 KB. S+O = 96 of 152 regs: \
     * P (32) and the next S (64) cannot both live (intra-warpgroup overlap spills at 160); \
     * the other two warpgroups' GEMMs fill the tensor core during this one's softmax.     \
     * 192x112 with overlap fits (116 regs) but ran 3-11% slower (H100, notes-sm90.md).    \
     * tall = 20: +16% at s16k-d64 over row 0, +7% at s512-d64 despite 12.5% padded rows. \
     * 4 stages (176 KB) gained nothing at s512-d64 or s16k-d64 (session 5), nor did row \
     * 0 with 4 stages: the producer is not what holds these tiles back.                 */ \
    {64, 192, 128, 3, 2, 128, 0, 0, 0, 2, 20, 1, 1},                                          \
    /* 8: d64 small, 2 warpgroups splitting a 64-row tile's KV blocks (kvsplit 2), the     \
     * small row of causal/local calls (plan.cu): 2*8K + 4*32K + merge 18K = 162 KB;       \
     * 4 stages so that each warpgroup has its next block loaded while it works on one.    \
     * H100, session 5: mission-causal 7.42 -> 6.80 us, mission (unmasked) 2% slower.    */ \
    {64, 64, 128, 2, 4, 128, 0, 1, 1, 2, 0, 1, 2},                                              \
    /* 9: d64 tall, 4 consumer warpgroups (640 threads: 96 registers at entry, setmaxnreg \
     * 32/112), 256x64 with intra-warpgroup overlap (S 32 + P 16 + O 32 in 112 regs;        \
     * 256x128 spills there), 4 stages: 2*32K + 4*16K = 128 KB. Where 192-row tiles pad  \
     * (s512-d64: 576 rows for 512) 256 rows do not: s512-d64 176 us against row 7's 192 \
     * and cuDNN's 191 (H100, run 88); not rotated (rotated 177-183 us). At s16k-d64 it  \
     * is 4% behind row 7 (64-key blocks cost more per key), hence tall = 15 against 20. \
     * Unmeasured with a band, so banded calls keep row 7 (unbanded = 1).               */ \
    {64, 256, 64, 4, 4, 128, 0, 1, 0, 2, 15, 1, 1, 1},
#define FC_SM90_NUM_TILES 10

/* Rows whose tiles can take the rotated tile loop (a tile's first S GEMM
 * issued during the previous tile's epilogue): the next tile's Q needs its
 * own buffer, and a kvsplit pair merges between tiles. The planner, the
 * launcher and the kernel all ask this. */
#define FC_SM90_CAN_ROTATE(t) ((t).qbufs == 2 && (t).kvsplit == 1)

/* Rows that can run tail balancing (plan.cu tail_on, fwd_kernel.cuh
 * tail_merge): the planner and the kernel both ask this. */
#define FC_SM90_TAIL_ROW(t) (!(t).small && (t).kvsplit == 1 && (t).wgs <= 2 && (t).head_dim <= 192)

/* Registers after setmaxnreg, per thread, by consumer warpgroup count and
 * CTAs per SM (see the budget above): the CTA's share of the 64 K registers
 * less the producer's, over the consumer threads, in steps of 8.
 * 1-warpgroup configs at 1 CTA per SM do not use setmaxnreg: 256 threads
 * may use 255 registers each from the start. */
#define FC_SM90_PRODUCER_REGS(wgs) ((wgs) == 4 ? 32 : 40)
/* What a CTA's threads get at launch (the launch bounds' share, in steps of 8):
 * setmaxnreg moves registers within the CTA's own allocation, so an
 * increase beyond it waits forever (640 threads enter with 96, not 102). */
#define FC_SM90_ENTRY_REGS(wgs, ctas) (65536 / (ctas) / (128 * ((wgs) + 1)) / 8 * 8)
#define FC_SM90_CONSUMER_REGS(wgs, ctas)                                                     \
    ((128 * ((wgs) + 1) * FC_SM90_ENTRY_REGS(wgs, ctas) - 128 * FC_SM90_PRODUCER_REGS(wgs)) / \
     (128 * (wgs)) / 8 * 8) /* 232, 152, 112; 216 at 1 wg x 2 CTAs */

/* Bytes of dynamic shared memory a config needs (the kernel's own layout in
 * fwd_kernel.cuh must match: Q buffers, K stages, V stages, merge, barriers). */
#define FC_SM90_BARRIER_BYTES 256
/* kvsplit 2: the second warpgroup's per-thread m[2], l[2] and O (head_dim / 2
 * floats) for 128 threads. */
#define FC_SM90_MERGE_BYTES(t) ((t).kvsplit > 1 ? 128 * ((t).head_dim / 2 + 4) * 4 : 0)
#define FC_SM90_SMEM_BYTES(t)                                                              \
    (1024 + (t).qbufs * (t).block_m * (t).head_dim * 2 +                                   \
     2 * (t).stages * (t).block_n * (t).head_dim * 2 + FC_SM90_MERGE_BYTES(t) + FC_SM90_BARRIER_BYTES)

#endif /* FC_SM90_TILES_CUH */
