/*
 * plan.cu -- the Hopper path's planner and launcher: fc_sm90_plan (can this
 * path run p on dev, with which config), fc_sm90_tile_shape (for the split-KV
 * choice in dispatch.c) and fc_sm90_forward (tensor maps + launch).
 *
 * Everything that can make the launch impossible (device, dtype, head_dim,
 * layouts TMA cannot express, shared memory) is decided in fc_sm90_plan, so
 * that dispatch can fall back to the sm80 path with the reason in hand.
 */
#include <stdio.h>
#include <string.h>

#include "constants.h"
#include "cuda/common/mask_mode.h"
#include "cuda/common/plan_names.cuh"
#include "cuda/common/tma_map.h"
#include "cuda/sm90/sm90.h"
#include "cuda/sm90/tail_split.h"
#include "cuda/sm90/tiles.cuh"

namespace {

/* What a layout TMA cannot load means here (fc_tma_layout_ok's messages). */
const char *const k_tma_who = "the sm90 kernels load it with TMA (use the sm80 path)";

#if FC_SM90_TRACE
/* Trace builds only (sm90.h): one device buffer for the process; after each
 * launch the call waits for the kernel and writes the buffer to
 * tuning.sm90_trace_file (header: int32 ctas, roles, tiles, events,
 * config, then int64 clock64 stamps, -1 = not reached). Tracing serialises
 * every call: never in a shipped build. */
const size_t k_trace_ctas = 1024;
const size_t k_trace_count =
    k_trace_ctas * FC_SM90_TRACE_ROLES * FC_SM90_TRACE_TILES * FC_SM90_TRACE_EVENTS;
long long *g_trace;

long long *trace_buffer(cudaStream_t stream)
{
    if (!g_trace && cudaMalloc((void **)&g_trace, k_trace_count * sizeof(long long)) != cudaSuccess) {
        cudaGetLastError();
        g_trace = NULL;
    }
    if (g_trace) cudaMemsetAsync(g_trace, 0xff, k_trace_count * sizeof(long long), stream);
    return g_trace;
}

void trace_write(cudaStream_t stream, int grid, int config, const char *path)
{
    if (!g_trace || !path || !*path) return;
    const int ctas = grid < (int)k_trace_ctas ? grid : (int)k_trace_ctas;
    const size_t n = (size_t)ctas * FC_SM90_TRACE_ROLES * FC_SM90_TRACE_TILES * FC_SM90_TRACE_EVENTS;
    long long *h = (long long *)malloc(n * sizeof(long long));
    FILE *f = fopen(path, "wb");
    if (h && f && cudaStreamSynchronize(stream) == cudaSuccess &&
        cudaMemcpy(h, g_trace, n * sizeof(long long), cudaMemcpyDeviceToHost) == cudaSuccess) {
        const int32_t head[5] = {ctas, FC_SM90_TRACE_ROLES, FC_SM90_TRACE_TILES, FC_SM90_TRACE_EVENTS, config};
        fwrite(head, sizeof head, 1, f);
        fwrite(h, sizeof(long long), n, f);
    }
    if (f) fclose(f);
    free(h);
}
#endif

using fc90::kNumTiles;
using fc90::kTiles;
using fc90::TileRow;

/* Every row's head dim has launchers (sm90.h FC_SM90_HEAD_DIMS). */
constexpr bool has_launcher(int d)
{
#define FC_SM90_IS_DIM(dim) d == (dim) ||
    return FC_SM90_HEAD_DIMS(FC_SM90_IS_DIM) false;
#undef FC_SM90_IS_DIM
}
constexpr bool all_rows_launchable(int i = 0)
{
    return i >= kNumTiles || (has_launcher(kTiles[i].head_dim) && all_rows_launchable(i + 1));
}
static_assert(all_rows_launchable(), "a tiles.cuh row's head dim has no kernel TU (sm90.h FC_SM90_HEAD_DIMS)");

/* Launch row `config` through its (dtype, head dim) launcher. */
fc_status launch_row(int config, bool bf16, const fc_sm90_params *prm, int grid, int device, cudaStream_t stream,
                     char *err, size_t err_len)
{
    switch (kTiles[config].head_dim) {
#define FC_SM90_LAUNCH_CASE(dim)                                                                              \
    case dim:                                                                                                 \
        return (bf16 ? fc_sm90_launch_bf16_d##dim : fc_sm90_launch_f16_d##dim)(config, prm, grid, device, stream, \
                                                                               err, err_len);
        FC_SM90_HEAD_DIMS(FC_SM90_LAUNCH_CASE)
#undef FC_SM90_LAUNCH_CASE
    }
    snprintf(err, err_len, "sm90 forward: config %d has no launcher (build bug)", config);
    return FC_ERR_INTERNAL;
}

/* "64, 96, 128, 192, 256": the head dims of the table, in order, once each. */
void head_dim_list(char *buf, size_t len)
{
    buf[0] = '\0';
    size_t used = 0;
    for (int i = 0; i < kNumTiles; ++i) {
        int seen = 0;
        for (int j = 0; j < i; ++j) seen |= kTiles[j].head_dim == kTiles[i].head_dim;
        if (seen) continue;
        int n = snprintf(buf + used, len - used, "%s%d", used ? ", " : "", kTiles[i].head_dim);
        if (n < 0 || (size_t)n >= len - used) break;
        used += (size_t)n;
    }
}

/* Pack-GQA (the ratio query heads that share a KV head as rows of one
 * tile) pays when it cuts the row tiles by >= 10% (decode-like shapes,
 * where a tile of 128 positions would hold 1 real row). */
bool pack_pays(const fc_fwd_params *p, int block_m)
{
    const int ratio = p->heads_q / p->heads_kv;
    if (ratio <= 1) return false;
    const int64_t plain = (int64_t)ratio * ((p->seqlen_q + block_m - 1) / block_m);
    const int64_t packed = ((int64_t)p->seqlen_q * ratio + block_m - 1) / block_m;
    return 10 * plain >= 11 * packed;
}

/* These kernels pack a ratio that is a power of two dividing block_m (a
 * tile covers whole position groups). Returns log2(ratio) where packing
 * pays and they can, else 0. */
int pack_shift_for(const fc_fwd_params *p, int block_m)
{
    const int ratio = p->heads_q / p->heads_kv;
    if ((ratio & (ratio - 1)) != 0 || block_m % ratio != 0 || !pack_pays(p, block_m)) return 0;
    int shift = 0;
    while ((1 << shift) < ratio) ++shift;
    return shift;
}

/* A causal or local band: tiles then see different KV ranges (the kvsplit
 * small row, the rotation's limit, no tail balancing). */
bool banded(const fc_fwd_params *p) { return p->window_left >= 0 || p->window_right >= 0; }

int64_t row_tiles(const fc_fwd_params *p, int block_m, int shift)
{
    const int64_t rows = (int64_t)p->seqlen_q << shift;
    return (int64_t)p->batch * (p->heads_q >> shift) * ((rows + block_m - 1) / block_m);
}

/* Wave-quantised cost of a row for p (persistent CTAs, one tile per SM at a
 * time): waves * rows per tile, divided by the row's expected per-row gain. */
double wave_cost(const fc_fwd_params *p, const fc_cuda_device *dev, const TileRow &t, int shift)
{
    const int64_t sms = dev->sm_count > 0 ? dev->sm_count : 1;
    const int64_t waves = (row_tiles(p, t.block_m, shift) + sms - 1) / sms;
    return (double)(waves * t.block_m) / (1.0 + t.tall / 100.0);
}

/* tune->sm90_config (a row of tiles.cuh): a tuning and benchmarking hook
 * (docs/API.md) that forces a row when it fits p (its head_dim); otherwise,
 * or when -1, the planner chooses. The choice shows in the kernel name
 * (fc_kernel_info), so a forced row is never silent. */
int forced_config(const fc_fwd_params *p, const fc_tuning *tune)
{
    const int v = tune->sm90_config;
    if (v < 0 || v >= kNumTiles || kTiles[v].head_dim != p->head_dim) return -1;
    return v;
}

/* The config for p: the big entry of its head_dim; the tall entry of least
 * wave-quantised cost instead when that is lower still; the 64-row entry
 * instead when the big tiles would leave more than half of the SMs idle
 * (split-KV can then still add CTAs along the keys) or hold at most 64 real
 * rows. Rows marked unbanded are skipped for banded calls. -1: head_dim not
 * built. *shift: pack-GQA. */
int pick_config(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune, int *shift)
{
    const int forced = forced_config(p, tune);
    if (forced >= 0) {
        *shift = pack_shift_for(p, kTiles[forced].block_m);
        return forced;
    }
    int cfg = -1, small = -1, small_kvs = -1, tall = -1, tall_shift = 0;
    double tall_cost = 0.0; /* the tall row of least wave-quantised cost (the first of equals) */
    for (int i = 0; i < kNumTiles; ++i) {
        if (kTiles[i].head_dim != p->head_dim) continue;
        if (kTiles[i].ctas > 1) continue; /* no cost model for 2-CTA rows: forced only (tiles.cuh) */
        if (kTiles[i].unbanded && banded(p)) continue;
        if (kTiles[i].small) {
            int &slot = kTiles[i].kvsplit > 1 ? small_kvs : small;
            if (slot < 0) slot = i;
            continue;
        }
        if (kTiles[i].tall) {
            const int s = pack_shift_for(p, kTiles[i].block_m);
            const double c = wave_cost(p, dev, kTiles[i], s);
            if (tall < 0 || c < tall_cost) tall = i, tall_shift = s, tall_cost = c;
            continue;
        }
        if (cfg < 0) cfg = i;
    }
    /* Small grids with a causal or local mask take the kvsplit row where
     * there is one: its two warpgroups halve the longest tile's chain of KV
     * blocks: mission-causal +8.5% on an H100, the unmasked mission shape
     * -2% (its CTAs are equal, so the chain is not the bound): masked only. */
    if (banded(p) && small_kvs >= 0) small = small_kvs;
    if (cfg < 0) cfg = small;
    if (cfg < 0) return -1;
    *shift = pack_shift_for(p, kTiles[cfg].block_m);
    if (tall >= 0 && cfg != small && tall_cost < wave_cost(p, dev, kTiles[cfg], *shift)) {
        cfg = tall;
        *shift = tall_shift;
    }
    /* Small grid, or rows that fill at most one 64-row tile per head unit
     * (decode, also after pack-GQA): the 128-row tile would be mostly
     * padding, computed at full cost. */
    const bool few_tiles = 2 * row_tiles(p, kTiles[cfg].block_m, *shift) <= dev->sm_count;
    const bool short_rows = ((int64_t)p->seqlen_q << *shift) <= 64;
    if (small >= 0 && cfg != small && (few_tiles || short_rows)) {
        cfg = small;
        *shift = pack_shift_for(p, kTiles[cfg].block_m);
    }
#if defined(FC_SM90_NO_PACK_GQA) && FC_SM90_NO_PACK_GQA
    *shift = 0;
#endif
    return cfg;
}

/* Persistent grid of a row: every CTA slot of the chip, at most one CTA per
 * tile; cap (tuning.sm90_grid via choice->grid_cap, a test hook) caps it:
 * with a few CTAs small problems run several rounds of tiles, and get tails. */
int64_t grid_for(const fc_cuda_device *dev, const TileRow &t, int64_t tiles, int cap)
{
    int64_t grid = (int64_t)(dev->sm_count > 0 ? dev->sm_count : 1) * t.ctas;
    if (cap >= 1 && cap < grid) grid = cap;
    return grid < tiles ? grid : tiles;
}

/* Tail balancing. With T tiles of equal length on G persistent CTAs, the
 * last of the ceil(T / G) rounds holds T mod G tiles, and the other CTAs
 * idle through it: at s2k/s8k-d128 (2048 tiles, 132 SMs) 64 of 132 CTAs
 * idle for 1/16 of the call, 3%. Balanced, the last tiles' KV blocks are
 * dealt out evenly instead (fc_sm90_params.tail_first), at the cost of a
 * partial write, an arrival count and a merge by the last part of each
 * split tile, and of the counters' memset, which also takes the call's
 * programmatic dependent launch: about kTailCostBlocks KV blocks of one
 * CTA's time (H100, same passes without it: s8k-d128 +2.0% with 31
 * idle blocks per CTA, s2k-d128 -0.4% with 7.8: 9-11 blocks).
 * Taken when every tile has the same KV range (no mask band, no varlen),
 * the call takes neither the rotated loop nor softcap (kernel instances),
 * the row can (tiles.cuh tail_row: registers for the merge), and
 * the blocks it saves exceed that cost by 0.5% of the call.
 * tuning.sm90_tail 0|1 turns it off, or on wherever it is possible
 * (tests, A/B). */
const double kTailCostBlocks = 10.0;

/* The shape of a tail-balanced launch of p on row t, whether or not it is
 * taken: what the planner weighs and the launcher lays out, from one place. */
struct TailShape {
    int64_t grid, rounds, rest, nb; /* CTAs, whole rounds, tiles left after them, KV blocks per tile */
    int64_t blocks;                 /* the tail's KV blocks, rest * nb (tail_split.h's B)       */
    int64_t cnt_bytes, bytes;       /* workspace: counters (zeroed per call), then partials */
};

TailShape tail_shape(const fc_fwd_params *p, const fc_cuda_device *dev, const TileRow &t, int shift, int cap)
{
    TailShape ts;
    const int64_t tiles = row_tiles(p, t.block_m, shift);
    ts.grid = grid_for(dev, t, tiles, cap);
    ts.nb = ((int64_t)p->seqlen_k + t.block_n - 1) / t.block_n;
    ts.rounds = ts.grid > 0 ? tiles / ts.grid : 0;
    ts.rest = tiles - ts.rounds * ts.grid;
    ts.blocks = ts.rest * ts.nb;
    ts.cnt_bytes = (ts.rest * t.wgs * (int64_t)sizeof(int) + 255) / 256 * 256;
    ts.bytes = ts.cnt_bytes + 2 * ts.grid * t.wgs * 128 * FC_TAIL_THREAD_FLOATS(t.head_dim) * (int64_t)sizeof(float);
    return ts;
}

/* Does p take tail balancing on row t? choice carries the rotate and mask
 * decisions already made (the tail instance has neither). */
bool tail_on(const fc_fwd_params *p, const TileRow &t, const fc_cuda_choice *choice, const TailShape &ts,
             int forced)
{
    const bool uniform = p->cu_seqlens_q == NULL && p->seqused_k == NULL && !banded(p);
    /* (the kernel's share arithmetic is 32-bit: rest * nb and grid^2 fit) */
    if (!uniform || !fc90::tail_row(t) || FC_SM90_SIMPLE || choice->rotate || choice->masks == FC_MASKS_ANY ||
        ts.rounds < 1 || ts.rest == 0 || ts.nb < 2 || ts.blocks >= ((int64_t)1 << 30) || ts.grid > 32768 ||
        forced == 0)
        return false;
    if (forced == 1) return true;
    const double idle = (1.0 - (double)ts.rest / (double)ts.grid) * (double)ts.nb; /* blocks per CTA */
    const double share = (double)ts.blocks / (double)ts.grid;
    return share >= 2.0 && idle - kTailCostBlocks >= 0.005 * (double)((ts.rounds + 1) * ts.nb);
}

/* Stream-ordered device memory whose first `zero` bytes are zeroed (graph-
 * capture safe); freed by the caller with cudaFreeAsync after the kernel. */
fc_status alloc_zeroed(void **out, size_t bytes, size_t zero, int device, cudaStream_t stream, const char *what,
                       char *err, size_t err_len)
{
    const fc_status st = fc_cuda_ws_alloc(out, (int64_t)bytes, device, stream, what, err, err_len);
    if (st != FC_OK) return st;
    const cudaError_t e = cudaMemsetAsync(*out, 0, zero, stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, err_len, "sm90 forward: cudaMemsetAsync (%s): %s", what, cudaGetErrorString(e));
        cudaFreeAsync(*out, stream);
        cudaGetLastError();
        *out = NULL;
        return FC_ERR_CUDA;
    }
    return FC_OK;
}

bool pingpong_on(const TileRow &t) { return t.pingpong && t.wgs > 1 && !FC_SM90_SIMPLE; }
bool overlap_on(const TileRow &t) { return t.overlap && !FC_SM90_SIMPLE; }

/* A paged call on row t: a kPaged instance exists for the row and every
 * K/V block lies in one page (tiles.cuh paged_row). */
bool pages_fit(const fc_fwd_params *p, const TileRow &t)
{
    return fc90::paged_row(t) && p->page_size % t.block_n == 0;
}

/* The kernel name of a plan (what it is made from: its key), formatted
 * once per thread and key (common/plan_names.cuh). */
thread_local PlanNames t_names;

void name_plan(fc_cuda_choice *choice, const TileRow &t, bool bf16, int shift, bool paged)
{
    const int32_t key[PlanNames::K] = {choice->config, bf16, choice->rotate, shift > 0, choice->masks, paged};
    if (plan_name_get(t_names, key, choice->name)) return;
    snprintf(choice->name, sizeof choice->name, "sm90_fwd_%s_d%d_m%dn%d_s%d_ws%d%s%s%s%s%s%s%s",
             bf16 ? "bf16" : "f16", t.head_dim, t.block_m, t.block_n, t.stages, t.wgs,
             pingpong_on(t) ? "_pp" : "", overlap_on(t) ? "_ov" : "", t.kvsplit > 1 ? "_kvs" : "",
             choice->rotate ? "_rot" : "", shift > 0 ? "_packgqa" : "",
             choice->masks == FC_MASKS_NONE ? "_plain" : (choice->masks == FC_MASKS_FIRST ? "_plainloop" : ""),
             paged ? "_paged" : "");
    plan_name_put(t_names, key, choice->name);
}

} /* namespace */

void fc_sm90_tile_shape(int config, int *block_m, int *block_n)
{
    if (config < 0 || config >= kNumTiles) {
        *block_m = *block_n = 1;
        return;
    }
    *block_m = kTiles[config].block_m;
    *block_n = kTiles[config].block_n;
}

namespace {

/* What no sm90 row takes: another device, dtype or FP8 k/v. */
fc_status device_refusal(const fc_fwd_params *p, const fc_cuda_device *dev, char *why, size_t why_len)
{
    if (dev->cc_major != 9 || dev->cc_minor != 0) {
        snprintf(why, why_len, "the sm90 kernels need an sm_90 device (wgmma/TMA); %s is sm_%d%d",
                 dev->name, dev->cc_major, dev->cc_minor);
        return FC_ERR_UNSUPPORTED;
    }
    if (p->dtype != FC_DTYPE_F16 && p->dtype != FC_DTYPE_BF16) {
        snprintf(why, why_len, "dtype %s is not supported by the sm90 kernels: supported f16, bf16",
                 fc_dtype_name(p->dtype));
        return FC_ERR_UNSUPPORTED;
    }
    if (fc_dtype_is_fp8(p->kv_dtype)) {
        snprintf(why, why_len, "FP8 k/v (%s) are not supported by the sm90 kernels: the sm80 path takes them",
                 fc_dtype_name(p->kv_dtype));
        return FC_ERR_UNSUPPORTED;
    }
    return FC_OK;
}

/* What row t (GQA packed by 2^shift) cannot run: the block table, the
 * page size, a scale the softmax cannot take, heads, shared memory. */
fc_status row_refusal(const fc_fwd_params *p, const fc_cuda_device *dev, const TileRow &t, char *why, size_t why_len)
{
    /* A K/V block is one TMA box inside one page: pages of whole blocks
     * only (the sm80-class kernels gather any page size row by row). */
    if (p->block_table && (int64_t)p->batch * p->block_table_stride >= ((int64_t)1 << 31)) {
        snprintf(why, why_len, "a block table of %lld entries: the sm90 kernels index it in int32; the sm80-class "
                 "path runs it", (long long)p->batch * p->block_table_stride);
        return FC_ERR_UNSUPPORTED;
    }
    if (p->block_table && !pages_fit(p, t)) {
        snprintf(why, why_len,
                 "page_size %d is not a multiple of the %d-key blocks of a paged sm90 kernel (head_dim %d): the "
                 "sm80-class path runs it", (int)p->page_size, fc90::paged_row(t) ? t.block_n : 128,
                 (int)p->head_dim);
        return FC_ERR_UNSUPPORTED;
    }
    if (!(p->scale > 0.0f) && p->softcap == 0.0f) {
        snprintf(why, why_len,
                 "scale %g <= 0 is not supported by the sm90 kernels (their softmax takes the row max of "
                 "q.k, which is the max of scale*q.k only for scale > 0)",
                 (double)p->scale);
        return FC_ERR_UNSUPPORTED;
    }
    if (p->heads_kv <= 0 || p->heads_q % p->heads_kv != 0) {
        snprintf(why, why_len, "heads_q %d is not a multiple of heads_kv %d", (int)p->heads_q,
                 (int)p->heads_kv);
        return FC_ERR_INVALID_ARGUMENT;
    }
    const int need_smem = fc90::smem_bytes(t);
    if (dev->smem_optin < need_smem) {
        snprintf(why, why_len,
                 "the sm90 kernel for head_dim %d needs %d bytes of shared memory per block; %s allows %lld",
                 (int)p->head_dim, need_smem, dev->name, (long long)dev->smem_optin);
        return FC_ERR_UNSUPPORTED;
    }
    return FC_OK;
}

/* TMA-expressible layouts (varlen tensors have no batch dimension) and
 * tile indices the scheduler's int32 holds. */
fc_status layout_refusal(const fc_fwd_params *p, const TileRow &t, int shift, char *why, size_t why_len)
{
    const int64_t qs[3] = {p->q_row_stride, p->q_head_stride, p->q_batch_stride};
    if (!fc_tma_q_ok(p, "q", p->q, qs, k_tma_who, why, why_len) || !fc_tma_kv_ok(p, k_tma_who, why, why_len))
        return FC_ERR_UNSUPPORTED;
    if (row_tiles(p, t.block_m, shift) * FC_MAX_SPLITS >= ((int64_t)1 << 31) ||
        ((int64_t)p->seqlen_q << shift) >= ((int64_t)1 << 31)) {
        snprintf(why, why_len, "%lld query tiles exceed the sm90 scheduler's int32 tile index",
                 (long long)row_tiles(p, t.block_m, shift));
        return FC_ERR_UNSUPPORTED;
    }
    return FC_OK;
}

/* Row cfg's launch choices: GQA packing, masks, the rotated tile loop,
 * tail balancing, workspace and name. */
void choose(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune, int cfg, int shift,
            fc_cuda_choice *choice)
{
    const TileRow &t = kTiles[cfg];
    choice->config = cfg;
    choice->pack_gqa = shift > 0;
    choice->pack_refused = shift == 0 && pack_pays(p, t.block_m);
    /* The rotated tile loop issues a tile's first S GEMM during the previous
     * tile's epilogue, so it pays only where CTAs run several tiles, and
     * where the tile edges are a large share of a tile: short KV. Same-run
     * A/B on an H100 (tuning.sm90_rotate overrides):
     *   - 2-warpgroup rows without a band: +1.2% at s2k-d128 (16 KV blocks),
     *     -1.6% at s8k-d128 (64);
     *   - causal: -3.3% at s2k-causal and gqa-prefill (16-32 blocks); kept
     *     at <= 8 blocks, where it was measured to gain;
     *   - the tall rows: -1.3% at s512-d64 with 3 warpgroups (4 blocks),
     *     -0.6..-3.8% there with 4 (8 blocks);
     *   - -8% where each CTA runs one tile (the mission shape).
     * Rows with one Q buffer cannot rotate. */
    const int forced_rot = tune->sm90_rotate;
    choice->grid_cap = tune->sm90_grid;
    choice->trace_file = tune->sm90_trace_file;
    const TailShape ts = tail_shape(p, dev, t, shift, choice->grid_cap);
    /* Paged calls have one instance per row (the producer reads the block
     * table): any-block masks, not rotated, so no tail balancing either;
     * the other instances stay free of the table code. */
    const bool paged = p->block_table != NULL;
    choice->masks = paged ? FC_MASKS_ANY : fc_cuda_mask_mode(p, t.block_m, t.block_n, shift); /* mask_mode.h */
    if (tune->masks > choice->masks) choice->masks = tune->masks; /* more mask code: a tuning candidate */
    const int64_t rot_max_blocks = banded(p) ? 8 : 16;
    choice->rotate = !paged && fc90::can_rotate(t) && !FC_SM90_SIMPLE &&
                     (forced_rot >= 0 ? forced_rot == 1
                                      : row_tiles(p, t.block_m, shift) > (int64_t)dev->sm_count * t.ctas &&
                                            t.tall == 0 && ts.nb <= rot_max_blocks);
    choice->tail = tail_on(p, t, choice, ts, tune->sm90_tail);
    choice->workspace_bytes = choice->tail ? ts.bytes : 0;
    name_plan(choice, t, p->dtype == FC_DTYPE_BF16, shift, paged);
}

} /* namespace */

fc_status fc_sm90_plan(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                       fc_cuda_choice *choice, char *why, size_t why_len)
{
    fc_status st = device_refusal(p, dev, why, why_len);
    if (st != FC_OK) return st;
    int shift = 0;
    const int cfg = pick_config(p, dev, tune, &shift);
    if (cfg < 0) {
        char list[64];
        head_dim_list(list, sizeof list);
        snprintf(why, why_len, "head_dim %d is not supported by the sm90 kernels: supported %s",
                 (int)p->head_dim, list);
        return FC_ERR_UNSUPPORTED;
    }
    st = row_refusal(p, dev, kTiles[cfg], why, why_len);
    if (st == FC_OK) st = layout_refusal(p, kTiles[cfg], shift, why, why_len);
    if (st != FC_OK) return st;
    choose(p, dev, tune, cfg, shift, choice);
    return FC_OK;
}

namespace {

/* The launch geometry of a planned call: pack-GQA shift and tile counts. */
struct Geometry {
    int ratio, shift, splits;
    int64_t m_blocks, head_units, units, tiles;
    int64_t rows_q, rows_k, nb, nb_k; /* tensor-map extents (K/V: pages when paged) */
};

/* Checks what the planner and the launcher promised (a failure is their
 * bug) and derives the geometry. */
fc_status geometry(const fc_fwd_params *p, const fc_cuda_choice *choice, Geometry &g, char *err, size_t err_len)
{
    if (choice->config < 0 || choice->config >= kNumTiles || kTiles[choice->config].head_dim != p->head_dim ||
        (p->dtype != FC_DTYPE_F16 && p->dtype != FC_DTYPE_BF16)) {
        snprintf(err, err_len, "sm90 forward: config %d does not fit head_dim %d / dtype %d (planner bug)",
                 (int)choice->config, (int)p->head_dim, (int)p->dtype);
        return FC_ERR_INTERNAL;
    }
    const TileRow &t = kTiles[choice->config];
    g.splits = p->num_splits > 1 ? p->num_splits : 1;
    if (g.splits > 1 && choice->tail) {
        snprintf(err, err_len, "sm90 forward: tail balancing with %d splits (dispatch bug)", g.splits);
        return FC_ERR_INTERNAL;
    }
    if (g.splits > 1 && (!p->o_accum || !p->lse_accum)) {
        snprintf(err, err_len, "sm90 forward: %d splits without a workspace (launcher bug)", g.splits);
        return FC_ERR_INTERNAL;
    }
    g.ratio = p->heads_q / p->heads_kv;
    g.shift = 0;
    if (choice->pack_gqa) {
        while ((1 << g.shift) < g.ratio) ++g.shift;
        if ((1 << g.shift) != g.ratio || t.block_m % g.ratio != 0) {
            snprintf(err, err_len, "sm90 forward: pack-GQA with %d query heads per KV head (planner bug)", g.ratio);
            return FC_ERR_INTERNAL;
        }
    }
    g.m_blocks = (((int64_t)p->seqlen_q << g.shift) + t.block_m - 1) / t.block_m;
    g.head_units = p->heads_q >> g.shift;
    g.units = (int64_t)p->batch * g.head_units * g.splits;
    g.tiles = g.units * g.m_blocks;
    if (g.tiles >= ((int64_t)1 << 31)) {
        snprintf(err, err_len, "sm90 forward: %lld tiles exceed the int32 tile index", (long long)g.tiles);
        return FC_ERR_UNSUPPORTED;
    }
    g.rows_q = fc_tma_q_rows(p);
    g.rows_k = fc_tma_k_rows(p);
    g.nb = fc_tma_q_batches(p);
    g.nb_k = fc_tma_kv_batches(p);
    if (p->block_table && !pages_fit(p, t)) {
        snprintf(err, err_len, "sm90 forward: page_size %d with block_n %d (planner bug)",
                 (int)p->page_size, t.block_n);
        return FC_ERR_INTERNAL;
    }
    return FC_OK;
}

/* A 5-d map of Q or O {D, ratio, heads/ratio, rows, batch} with box_rows
 * positions per box (sm90.h). */
fc_status encode_rows_map(CUtensorMap *map, const char *what, const void *base, int64_t head_stride,
                          int64_t row_stride, int64_t batch_stride, const fc_fwd_params *p, const TileRow &t,
                          const Geometry &g, int box_rows, bool bf16, char *err, size_t err_len)
{
    const int64_t r = (int64_t)1 << g.shift;
    const int64_t s4[4] = {head_stride, head_stride * r, row_stride, batch_stride};
    const int64_t n4[4] = {r, g.head_units, g.rows_q, g.nb};
    uint64_t sb[4];
    fc_tma_map_strides(s4, n4, 4, p->head_dim, sb);
    const uint64_t dims[5] = {(uint64_t)p->head_dim, (uint64_t)r, (uint64_t)g.head_units, (uint64_t)g.rows_q,
                              (uint64_t)g.nb};
    const uint32_t box[5] = {(uint32_t)t.swz / 2, (uint32_t)r, 1, (uint32_t)box_rows, 1};
    return fc_tma_encode_map(map, what, base, bf16, 5, dims, sb, box, t.swz, err, err_len);
}

/* The K and V maps {D, rows, heads_kv, batch} (paged: {D, page_size,
 * heads_kv, num_pages}; the producer turns a key row into a page and a
 * row in it, sm90.h). With no key at all nothing
 * is ever loaded from K/V; the maps then describe q (a valid address) so
 * that encoding cannot fail on a NULL or zero-sized tensor. */
fc_status encode_kv_maps(fc_sm90_params &prm, const fc_fwd_params *p, const TileRow &t, const Geometry &g,
                         bool bf16, char *err, size_t err_len)
{
    const bool none = g.rows_k == 0;
    const int64_t hk = none ? p->heads_q : p->heads_kv;
    const int64_t rk = none ? g.rows_q : g.rows_k;
    const int64_t ks[3] = {p->k_row_stride, p->k_head_stride, p->k_batch_stride};
    const int64_t vs[3] = {p->v_row_stride, p->v_head_stride, p->v_batch_stride};
    const int64_t qs[3] = {p->q_row_stride, p->q_head_stride, p->q_batch_stride};
    const int64_t nb = none ? g.nb : g.nb_k;
    fc_status st = fc_tma_encode_rows(&prm.tm_k, "sm90 forward: k", none ? p->q : p->k, bf16, none ? qs : ks, rk, hk,
                                      nb, p->head_dim, t.block_n, t.swz, err, err_len);
    if (st) return st;
    return fc_tma_encode_rows(&prm.tm_v, "sm90 forward: v", none ? p->q : p->v, bf16, none ? qs : vs, rk, hk, nb,
                              p->head_dim, t.block_n, t.swz, err, err_len);
}

/* The TMA store of O: dense, unsplit, whole position groups in a
 * warpgroup's 64 rows, and an O layout TMA can address; else the kernel's
 * generic stores (prm.o_tma stays 0). */
fc_status encode_o_map(fc_sm90_params &prm, const fc_fwd_params *p, const TileRow &t, const Geometry &g, bool bf16,
                       char *err, size_t err_len)
{
    const int64_t os[3] = {p->o_row_stride, p->o_head_stride, p->o_batch_stride};
    const int64_t on[3] = {g.rows_q, p->heads_q, g.nb};
    char why_not[192];
    if (p->cu_seqlens_q || g.splits != 1 || (64 >> g.shift) == 0 ||
        !fc_tma_layout_ok("o", p->o, os, on, k_tma_who, why_not, sizeof why_not))
        return FC_OK;
    const fc_status st = encode_rows_map(&prm.tm_o, "sm90 forward: o", p->o, p->o_head_stride, p->o_row_stride,
                                         p->o_batch_stride, p, t, g, 64 >> g.shift, bf16, err, err_len);
    prm.o_tma = st == FC_OK;
    return st;
}

/* The kernel's scalar parameters: pointers, strides, sizes, scales,
 * divisors and the tile order. */
void fill_params(fc_sm90_params &prm, const fc_fwd_params *p, const fc_cuda_device *dev, const Geometry &g,
                 const fc_cuda_choice *choice)
{
    const bool varlen = p->cu_seqlens_q != NULL;
    prm.o = p->o;
    prm.lse = p->lse;
    prm.o_accum = g.splits > 1 ? p->o_accum : NULL;
    prm.lse_accum = g.splits > 1 ? p->lse_accum : NULL;
    prm.cu_q = p->cu_seqlens_q;
    prm.cu_k = p->cu_seqlens_k;
    prm.used_k = p->seqused_k;
    prm.block_table = p->block_table;
    prm.bt_stride = (int32_t)p->block_table_stride;
    prm.page = fc_fastdiv_make(p->block_table ? p->page_size : 1);
    prm.o_batch_stride = varlen ? 0 : p->o_batch_stride;
    prm.o_row_stride = p->o_row_stride;
    prm.o_head_stride = p->o_head_stride;
    prm.lse_batch_stride = varlen ? 0 : p->lse_batch_stride;
    prm.lse_head_stride = p->lse_head_stride;
    prm.lse_row_stride = p->lse_row_stride;
    prm.batch = p->batch;
    prm.heads_q = p->heads_q;
    prm.hq_per_kv = fc_fastdiv_make(g.ratio);
    prm.head_units = fc_fastdiv_make((int32_t)g.head_units);
    prm.pack_shift = g.shift;
    prm.seqlen_q = p->seqlen_q;
    prm.seqlen_k = p->seqlen_k;
    prm.window_left = p->window_left;
    prm.window_right = p->window_right;
    if (p->softcap > 0.0f) {
        prm.softcap_in = p->scale / p->softcap;
        prm.softcap_out = p->softcap;
        prm.scale_log2 = FC_LOG2E_F;
    } else {
        prm.scale_log2 = p->scale * FC_LOG2E_F;
    }
    prm.num_splits = fc_fastdiv_make(g.splits);
    prm.num_m_blocks = fc_fastdiv_make((int32_t)g.m_blocks);
    prm.num_units = (int32_t)g.units;
    prm.num_tiles = (int32_t)g.tiles;
    prm.tail_first = prm.num_tiles;
    prm.longest_first = fc_causal_like(p);
    /* L2 sections for the longest-first order: as many KV heads as fill
     * half the L2 (K and V of one KV head of one sequence each), times the
     * units that share one. */
    const int64_t kv_head_bytes = (int64_t)(p->seqlen_k > 0 ? p->seqlen_k : 1) * p->head_dim * 2 * 2;
    int64_t kv_heads = dev->l2_bytes > 0 ? (dev->l2_bytes / 2) / kv_head_bytes : 1;
    if (kv_heads < 1) kv_heads = 1;
    int64_t group = kv_heads * (g.ratio >> g.shift) * g.splits;
    if (group > g.units) group = g.units;
    prm.l2_group = fc_fastdiv_make((int32_t)group);
    prm.l2_section = fc_fastdiv_make((int32_t)(group * g.m_blocks));
    prm.rotate = choice->rotate;
    prm.masks = choice->masks;
    prm.o_vec_ok = fc_o_vec_ok(p);
}

/* Stream-ordered device memory of one call, freed after its kernel. */
struct Workspaces {
    void *owned[2] = {NULL, NULL}; /* the tile counter, the tail-balancing workspace */
};

/* Causal (longest-first) tiles have unequal lengths: handing them out
 * statically (CTA i: i, i+grid, ...) left 8-25% of the SM time idle in a
 * host simulation of the benchmark shapes; a counter gives the next longest
 * tile to whichever CTA is free first (4 bytes, zeroed before the kernel).
 * Tail balancing (tail_on, the plan's choice) takes its counters zeroed and
 * its partials not. */
fc_status alloc_workspaces(fc_sm90_params &prm, Workspaces &ws, const fc_fwd_params *p, const fc_cuda_device *dev,
                           const TileRow &t, const Geometry &g, const fc_cuda_choice *choice, int grid,
                           cudaStream_t stream, char *err, size_t err_len)
{
    if (prm.longest_first && g.tiles > grid) {
        fc_status st =
            alloc_zeroed(&ws.owned[0], sizeof(int), sizeof(int), dev->id, stream, "tile counter", err, err_len);
        if (st) return st;
        prm.tile_ctr = (int *)ws.owned[0];
    }
    if (!choice->tail) return FC_OK;
    const TailShape ts = tail_shape(p, dev, t, g.shift, choice->grid_cap);
    fc_status st = alloc_zeroed(&ws.owned[1], (size_t)ts.bytes, (size_t)ts.cnt_bytes, dev->id, stream,
                                "tail-balancing workspace", err, err_len);
    if (st) return st;
    prm.tail_cnt = (int *)ws.owned[1];
    prm.tail_ws = (float *)((char *)ws.owned[1] + ts.cnt_bytes);
    prm.tail_first = (int32_t)(ts.rounds * grid);
    prm.tail_rounds = (int32_t)ts.rounds;
    prm.tail_nb = fc_fastdiv_make((int32_t)ts.nb);
    prm.tail_grid = fc_fastdiv_make(grid);
    prm.tail_q = (int32_t)(ts.blocks / grid);
    prm.tail_rem = (int32_t)(ts.blocks % grid);
    return FC_OK;
}

/* Frees ws in stream order after the kernel (also after a failed launch or
 * allocation); st is the call's status so far, kept if it is an error. */
fc_status free_workspaces(const Workspaces &ws, cudaStream_t stream, fc_status st, char *err, size_t err_len)
{
    for (int i = 0; i < 2; ++i) {
        if (!ws.owned[i]) continue;
        const cudaError_t e = cudaFreeAsync(ws.owned[i], stream);
        if (e != cudaSuccess) {
            cudaGetLastError();
            if (st == FC_OK) {
                snprintf(err, err_len, "sm90 forward: cudaFreeAsync of the %s: %s",
                         i ? "tail-balancing workspace" : "tile counter", cudaGetErrorString(e));
                st = FC_ERR_CUDA;
            }
        }
    }
    return st;
}

} /* namespace */

fc_status fc_sm90_forward(const fc_fwd_params *p, const fc_cuda_choice *choice, const fc_cuda_device *dev,
                          void *stream_, char *err, size_t err_len)
{
    const cudaStream_t stream = (cudaStream_t)stream_;
    Geometry g;
    fc_status st = geometry(p, choice, g, err, err_len);
    if (st) return st;
    if (g.tiles == 0) return FC_OK; /* no query row anywhere */
    const TileRow &t = kTiles[choice->config];
    const bool bf16 = p->dtype == FC_DTYPE_BF16;

    fc_sm90_params prm;
    memset(&prm, 0, sizeof prm);
    st = encode_rows_map(&prm.tm_q, "sm90 forward: q", p->q, p->q_head_stride, p->q_row_stride, p->q_batch_stride,
                         p, t, g, t.block_m >> g.shift, bf16, err, err_len);
    if (!st) st = encode_kv_maps(prm, p, t, g, bf16, err, err_len);
    if (!st) st = encode_o_map(prm, p, t, g, bf16, err, err_len);
    if (st) return st;
    fill_params(prm, p, dev, g, choice);

    const int grid = (int)grid_for(dev, t, g.tiles, choice->grid_cap);
    Workspaces ws;
    st = alloc_workspaces(prm, ws, p, dev, t, g, choice, grid, stream, err, err_len);
    if (st == FC_OK) {
        /* Launch as a programmatic dependent of the previous kernel in the
         * stream (common/pdl.cuh): this grid's launch and barrier set-up
         * overlap that kernel's tail (-0.7 us per call at the mission shape
         * graph-timed on an H100). Not after a workspace memset: that is the
         * stream's previous operation. */
        prm.pdl = choice->pdl && ws.owned[0] == NULL && ws.owned[1] == NULL;
#if FC_SM90_TRACE
        prm.trace = grid <= (int)k_trace_ctas ? trace_buffer(stream) : NULL;
#endif
        st = launch_row(choice->config, bf16, &prm, grid, dev->id, stream, err, err_len);
#if FC_SM90_TRACE
        if (st == FC_OK && prm.trace) trace_write(stream, grid, choice->config, choice->trace_file);
#endif
    }
    return free_workspaces(ws, stream, st, err, err_len);
}
