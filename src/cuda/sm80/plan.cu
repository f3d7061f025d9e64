/*
 * plan.cu -- the sm80-class path's planner and launcher:
 *   fc_sm80_plan     can this path run p on dev, and with which tile-table row?
 *   fc_sm80_forward  launch the planned row (through the per-(dtype, head_dim)
 *                    translation unit's launcher)
 *   fc_sm80_tile_shape  block_m/block_n of a row (for fc_cuda_tile_shape)
 *   fc_sm80_tile_row    a row as tools list it (fc_tuning_row_info)
 * Host code only; .cu so that it can read the constexpr table in tiles.cuh.
 */
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda/common/mask_mode.h"
#include "cuda/common/plan_names.cuh"
#include "cuda/common/tma_map.h"
#include "cuda/sm80/fwd_args.h"
#include "cuda/sm80/plan_checks.h"
#include "cuda/sm80/tiles.cuh"

namespace {

using fc::sm80::kTiles;
using fc::sm80::kNumTiles;
using fc::sm80::Tile;
using fc::sm80::tile_smem_bytes;

/* Architecture class of a device (tiles.cuh), -1 if this path has no SASS
 * that can run there (sm_80/86/89 SASS runs on any 8.x >= its minor; the
 * 90/90a SASS on 9.0). */
int arch_class(int major, int minor)
{
    if (major == 8) return (minor == 0 || minor == 7) ? fc::sm80::kClassSm80 : fc::sm80::kClassSm86;
    if (major == 9) return fc::sm80::kClassSm90;
    return -1;
}

/* Query heads folded into one tile's rows (GQA packing), or 1. Packing pays
 * when a (batch, head) has fewer query rows than a tile (decode, short
 * prefill chunks): the heads sharing a KV head fill the tile instead, and
 * K/V is read once per group instead of once per query head. */
int pack_factor(const fc_fwd_params *p, int block_m)
{
    const int g = p->heads_q / p->heads_kv;
    return (g > 1 && p->seqlen_q < block_m) ? g : 1;
}

/* CTAs of row t on p, before split-KV: m-tiles x grid heads x batch. */
int64_t grid_of(const fc_fwd_params *p, const fc::sm80::Tile &t)
{
    const int g = pack_factor(p, t.block_m);
    return ((int64_t)p->seqlen_q * g + t.block_m - 1) / t.block_m * (p->heads_q / g) * (int64_t)p->batch;
}

/* Row t can run p on dev (class cls): p's head dim, shared memory within
 * the device's opt-in limit, code built for the device (tile_sm90_only
 * rows only on the SM90 class), and for a kVarTma row K/V that TMA can
 * load (else the planner falls back to a cp.async row). */
bool tile_runs(const Tile &t, int cls, const fc_fwd_params *p, const fc_cuda_device *dev)
{
    char why[256]; /* (why not: the fallback row needs no message) */
    const bool paged_row = (t.variant & fc::sm80::kVarPaged) != 0;
    const bool kv8_row = (t.variant & fc::sm80::kVarKv8) != 0;
    /* kVarTma with seqused_k: its boxes bring a dense cache's rows past a
     * sequence's length, which may hold NaN, and only varlen calls zero
     * them (mainloop.cuh block_mid); a cp.async row zero-fills them. */
    return t.head_dim == p->head_dim && paged_row == (p->block_table != nullptr) &&
           kv8_row == fc_dtype_is_fp8(p->kv_dtype) &&
           tile_smem_bytes(t) <= dev->smem_optin &&
           (cls == fc::sm80::kClassSm90 || !fc::sm80::tile_sm90_only(t)) &&
           (!(t.variant & fc::sm80::kVarTma) || (!p->seqused_k && fc_tma_kv_ok(p, "", why, sizeof why)));
}

/* The kVarTma maps of K and V (fwd_args.h): 5-d, so that a whole K or V
 * tile is one box (dims {32, rows, panels, heads, batch}: the panel dim
 * steps 64 bytes along the row, and the box lands panel-major, the PC 4
 * layout). With no key rows nothing is ever loaded and the maps stay zero. */
fc_status encode_kv_maps(const fc_fwd_params *p, const Tile &t, fc_sm80_kv_maps *m, char *err, size_t err_len)
{
    const int64_t rows = fc_tma_k_rows(p), nb = fc_tma_kv_batches(p);
    if (rows == 0) return FC_OK;
    const int bf16 = p->dtype == FC_DTYPE_BF16;
    const int64_t n[4] = {rows, p->head_dim / 32, p->heads_kv, nb};
    const uint64_t dims[5] = {32, (uint64_t)rows, (uint64_t)(p->head_dim / 32), (uint64_t)p->heads_kv,
                              (uint64_t)nb};
    const uint32_t box[5] = {32, (uint32_t)t.block_n, (uint32_t)(p->head_dim / 32), 1, 1};
    const int64_t ks[4] = {p->k_row_stride, 32, p->k_head_stride, p->k_batch_stride};
    const int64_t vs[4] = {p->v_row_stride, 32, p->v_head_stride, p->v_batch_stride};
    uint64_t sb[4];
    fc_tma_map_strides(ks, n, 4, p->head_dim, sb);
    fc_status st = fc_tma_encode_map(&m->k, "sm80 forward: k", p->k, bf16, 5, dims, sb, box, 64, err, err_len);
    if (st != FC_OK) return st;
    fc_tma_map_strides(vs, n, 4, p->head_dim, sb);
    return fc_tma_encode_map(&m->v, "sm80 forward: v", p->v, bf16, 5, dims, sb, box, 64, err, err_len);
}

/* Tile row for p on dev (class cls), among the rows that run it
 * (tile_runs). tune->sm80_config (the tuning hook, docs/API.md) first, when
 * it runs p. Else the class's own rows: the default (min_sk 0)
 * or the long-KV alternate with the largest min_sk <= seqlen_k; then the
 * class's few-rows alternate if a tile column's query rows fit its
 * max_rows; else, if that row's grid is under one CTA per SM, the class's
 * small-grid alternate. Without a row of its own class: the smallest-smem
 * row of another class (e.g. a cut-down part reporting less smem than its
 * class). */
int pick_tile(int cls, const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune)
{
    const int forced = tune->sm80_config;
    if (forced >= 0 && forced < kNumTiles && tile_runs(kTiles[forced], cls, p, dev)) return forced;
    auto planned = [&](int i) { return tile_runs(kTiles[i], cls, p, dev); };
    /* The class's first row that runs p and satisfies want, or -1. */
    auto own_row = [&](auto want) {
        for (int i = 0; i < kNumTiles; ++i)
            if (kTiles[i].arch_class == cls && planned(i) && want(kTiles[i])) return i;
        return -1;
    };
    int pick = -1;
    for (int i = 0; i < kNumTiles; ++i)
        if (kTiles[i].arch_class == cls && !kTiles[i].small_grid && !kTiles[i].max_rows && planned(i) &&
            kTiles[i].min_sk <= p->seqlen_k && (pick < 0 || kTiles[i].min_sk > kTiles[pick].min_sk))
            pick = i;
    if (pick >= 0) {
        /* Few query rows per tile column (decode): the shorter alternate,
         * when every column fits in one of its tiles. */
        const int few = own_row([&](const Tile &t) {
            return t.max_rows && (int64_t)p->seqlen_q * pack_factor(p, t.block_m) <= t.max_rows;
        });
        if (few >= 0) return few;
        if (grid_of(p, kTiles[pick]) < dev->sm_count) {
            const int small = own_row([](const Tile &t) { return t.small_grid != 0; });
            if (small >= 0) return small;
        }
        return pick;
    }
    /* The smallest default row of another class, or its few-rows alternate
     * when a tile column fits that. */
    int best = -1;
    for (int i = 0; i < kNumTiles; ++i)
        if (planned(i) && !kTiles[i].max_rows &&
            (best < 0 || tile_smem_bytes(kTiles[i]) < tile_smem_bytes(kTiles[best])))
            best = i;
    for (int i = 0; best >= 0 && i < kNumTiles; ++i)
        if (planned(i) && kTiles[i].arch_class == kTiles[best].arch_class && kTiles[i].max_rows &&
            (int64_t)p->seqlen_q * pack_factor(p, kTiles[i].block_m) <= kTiles[i].max_rows)
            return i;
    return best;
}

/* "64, 128": the head dims of the kVarPaged rows, from the table. */
void paged_head_dims(char *list, size_t len)
{
    int n = 0;
    list[0] = 0;
    for (int i = 0; i < kNumTiles; ++i) {
        const int hd = kTiles[i].head_dim;
        bool dup = !(kTiles[i].variant & fc::sm80::kVarPaged);
        for (int j = 0; j < i && !dup; ++j) dup = (kTiles[j].variant & fc::sm80::kVarPaged) && kTiles[j].head_dim == hd;
        if (!dup && n < (int)len) n += snprintf(list + n, len - n, "%s%d", n ? ", " : "", hd);
    }
}

/* The kVarPaged loads multiply 32-bit strides (loads.cuh). */
bool paged_strides_ok(const fc_fwd_params *p)
{
    const int64_t s[4] = {p->k_batch_stride, p->k_row_stride, p->v_batch_stride, p->v_row_stride};
    for (int i = 0; i < 4; ++i)
        if (s[i] > INT32_MAX) return false;
    return true;
}

bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }

/* The 16-byte cp.async / store path needs 16-byte aligned bases and every
 * stride a multiple of 8 elements (16 bytes of f16/bf16). */
fc_status check_alignment(const fc_sm80_tensor_ref *t, int n, char *why, size_t why_len)
{
    for (int i = 0; i < n; ++i) {
        if (!aligned16(t[i].ptr)) {
            snprintf(why, why_len,
                     "%s.data (%p) is not 16-byte aligned: the sm80 kernels move 16-byte chunks", t[i].name,
                     t[i].ptr);
            return FC_ERR_UNSUPPORTED;
        }
        const char *dim[3] = {"batch", "row", "head"};
        const int64_t st[3] = {t[i].bs, t[i].rs, t[i].hs};
        for (int d = 0; d < 3; ++d)
            if (st[d] % 8 != 0) {
                snprintf(why, why_len,
                         "%s %s stride %lld is not a multiple of 8 elements: the sm80 kernels move "
                         "16-byte chunks",
                         t[i].name, dim[d], (long long)st[d]);
                return FC_ERR_UNSUPPORTED;
            }
    }
    return FC_OK;
}

/* An FP8 K/V call (kVarKv8 rows): sm_89+ (the e4m3 conversion), head dims
 * with rows, 16-byte chunks of 16 elements. */
fc_status kv8_checks(const fc_fwd_params *p, const fc_cuda_device *dev, char *why, size_t why_len)
{
    /* the kVarKv8 kernels are empty below sm_89 (fwd_kernel.cuh): sm_89+
     * SASS that runs on this device (none does on an older one) */
    if (!fc_cuda_compiled_from(dev->cc_major, dev->cc_minor, 89)) {
        if (dev->cc_major * 10 + dev->cc_minor < 89)
            snprintf(why, why_len, "FP8 k/v (%s) need an sm_89 or newer device (FP8 conversion); %s is sm_%d%d",
                     fc_dtype_name(p->kv_dtype), dev->name, dev->cc_major, dev->cc_minor);
        else
            snprintf(why, why_len, "FP8 k/v need sm_89+ code for %s (sm_%d%d): this build has %s "
                     "(FLASHCORE_CUDA_ARCHS)", dev->name, dev->cc_major, dev->cc_minor, fc_cuda_compiled_archs());
        return FC_ERR_UNSUPPORTED;
    }
    if (p->head_dim != 64 && p->head_dim != 128) {
        snprintf(why, why_len, "head_dim %d with FP8 k/v is not supported by the sm80 kernels: supported 64, 128",
                 p->head_dim);
        return FC_ERR_UNSUPPORTED;
    }
    if (p->out_amax || p->p_amax) {
        snprintf(why, why_len, "out_amax/p_amax are not computed by the cuda kernels yet: the cpu backends do");
        return FC_ERR_UNSUPPORTED;
    }
    const int64_t st[6] = {p->k_batch_stride, p->k_row_stride, p->k_head_stride,
                           p->v_batch_stride, p->v_row_stride, p->v_head_stride};
    for (int i = 0; i < 6; ++i)
        if (st[i] % 16 != 0) {
            snprintf(why, why_len, "FP8 %s stride %lld is not a multiple of 16 elements: the sm80 kernels move "
                     "16-byte chunks", i < 3 ? "k" : "v", (long long)st[i]);
            return FC_ERR_UNSUPPORTED;
        }
    return FC_OK;
}

} /* namespace */

extern "C" void fc_sm80_tile_shape(int config, int *block_m, int *block_n)
{
    if (config >= 0 && config < kNumTiles) {
        *block_m = kTiles[config].block_m;
        *block_n = kTiles[config].block_n;
    } else {
        *block_m = 1;
        *block_n = 1;
    }
}

extern "C" int fc_sm80_tile_row(int i, fc_tile_row *row)
{
    if (i < 0 || i >= kNumTiles) return 0;
    const Tile &t = kTiles[i];
    int kernel = 0;
    while (!fc::sm80::same_kernel(kTiles[kernel], t)) ++kernel;
    *row = fc_sm80_listed_row(t.head_dim, t.block_m, t.block_n, t.warps, t.stages, t.ctas, t.arch_class, t.variant,
                              kernel);
    return 1;
}

extern "C" fc_status fc_sm80_common_checks(const fc_fwd_params *p, const fc_cuda_device *dev,
                                           const fc_sm80_tensor_ref *extra, int n_extra, int *cls, char *why,
                                           size_t why_len)
{
    if (dev->cc_major < 8) {
        snprintf(why, why_len,
                 "device %s is sm_%d%d: the sm80 kernels need compute capability 8.0 or newer", dev->name,
                 dev->cc_major, dev->cc_minor);
        return FC_ERR_UNSUPPORTED;
    }
    *cls = arch_class(dev->cc_major, dev->cc_minor);
    if (*cls < 0) {
        snprintf(why, why_len,
                 "device %s is sm_%d%d: the sm80 kernels are built for sm_80..sm_90 only", dev->name,
                 dev->cc_major, dev->cc_minor);
        return FC_ERR_UNSUPPORTED;
    }
    if (p->softcap == 0.f && !(p->scale > 0.f)) {
        /* The kernels fold scale*log2(e) into the exp2 argument after taking
         * the row max of the raw scores: only valid for a positive scale. */
        snprintf(why, why_len, "scale %g is not supported by the sm80 kernels: scale must be > 0",
                 (double)p->scale);
        return FC_ERR_UNSUPPORTED;
    }
    if (p->seqlen_k > INT_MAX - 1024 || p->seqlen_q > INT_MAX - 1024) {
        snprintf(why, why_len, "seqlen_k %d / seqlen_q %d: the sm80 kernels index keys with int32 (limit %d)",
                 p->seqlen_k, p->seqlen_q, INT_MAX - 1024);
        return FC_ERR_UNSUPPORTED;
    }
    const fc_sm80_tensor_ref t[3] = {{"q", p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride},
                                     {"k", p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride},
                                     {"v", p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride}};
    const fc_status st = check_alignment(t, 3, why, why_len);
    return st != FC_OK ? st : check_alignment(extra, n_extra, why, why_len);
}

namespace {

/* What no sm80 row takes: the dtype, head dim, the common checks (strides,
 * alignment, device) and an FP8 cache's; *cls the device's class. */
fc_status input_refusal(const fc_fwd_params *p, const fc_cuda_device *dev, int *cls, char *why, size_t why_len)
{
    if (p->dtype != FC_DTYPE_F16 && p->dtype != FC_DTYPE_BF16) {
        snprintf(why, why_len, "dtype %s is not supported by the sm80 kernels: supported f16, bf16",
                 fc_dtype_name(p->dtype));
        return FC_ERR_UNSUPPORTED;
    }
    const int hd = p->head_dim;
    if (hd != 32 && hd != 64 && hd != 96 && hd != 128 && hd != 256) {
        snprintf(why, why_len,
                 "head_dim %d is not supported by the sm80 kernels: supported 32, 64, 96, 128, 256", hd);
        return FC_ERR_UNSUPPORTED;
    }
    fc_status st = fc_sm80_common_checks(p, dev, nullptr, 0, cls, why, why_len);
    if (st == FC_OK && fc_dtype_is_fp8(p->kv_dtype)) st = kv8_checks(p, dev, why, why_len);
    return st;
}

/* Why no row cfg (-1) runs p, or a paged cache the kernels cannot index. */
fc_status tile_refusal(const fc_fwd_params *p, const fc_cuda_device *dev, int cfg, char *why, size_t why_len)
{
    const int hd = p->head_dim;
    if (cfg < 0 && p->block_table) {
        char list[64];
        paged_head_dims(list, sizeof list);
        snprintf(why, why_len, "head_dim %d with a paged KV cache (block_table) is not supported by the sm80 kernels: "
                 "supported %s", hd, list);
        return FC_ERR_UNSUPPORTED;
    }
    if (p->block_table && !paged_strides_ok(p)) {
        snprintf(why, why_len, "a paged KV cache with a k/v stride of 2^31 elements or more is not supported by "
                 "the sm80 kernels (they form page offsets in 32x32-bit products)");
        return FC_ERR_UNSUPPORTED;
    }
    if (cfg < 0) {
        snprintf(why, why_len,
                 "device %s allows %lld bytes of shared memory per block: no sm80 tile for head_dim %d fits",
                 dev->name, (long long)dev->smem_optin, hd);
        return FC_ERR_UNSUPPORTED;
    }
    return FC_OK;
}

/* The grid and the tile rows (heads packed g to a row) within 32 bits. */
fc_status grid_refusal(const fc_fwd_params *p, const fc::sm80::Tile &t, int g, char *why, size_t why_len)
{
    const int64_t m_tiles = ((int64_t)p->seqlen_q * g + t.block_m - 1) / t.block_m;
    const int64_t grid = m_tiles * (p->heads_q / g) * (int64_t)p->batch;
    if (grid > INT_MAX) {
        snprintf(why, why_len, "the sm80 grid would have %lld CTAs (limit %d): batch*heads*seqlen_q too large",
                 (long long)grid, INT_MAX);
        return FC_ERR_UNSUPPORTED;
    }
    /* The kernel divides tile rows (< seqlen_q * pack + block_m) in 32 bits. */
    if ((int64_t)p->seqlen_q * g + t.block_m > INT_MAX) {
        snprintf(why, why_len, "seqlen_q %lld x %d packed heads is too long for the sm80 kernels (limit %d rows)",
                 (long long)p->seqlen_q, g, INT_MAX - t.block_m);
        return FC_ERR_UNSUPPORTED;
    }
    return FC_OK;
}

/* The plan's name, formatted once per thread and key (common/plan_names.cuh). */
void name_plan(const fc_fwd_params *p, const fc::sm80::Tile &t, int cfg, int g, fc_cuda_choice *choice)
{
    static thread_local PlanNames names;
    const int32_t key[PlanNames::K] = {cfg, p->dtype, (int32_t)p->head_dim, g > 1, choice->masks, p->kv_dtype};
    if (plan_name_get(names, key, choice->name)) return;
    char var[16] = "", kv[16] = "";
    if (t.variant) snprintf(var, sizeof var, "_v%d", t.variant); /* the row's code variant bits (tiles.cuh) */
    if (fc_dtype_is_fp8(p->kv_dtype)) snprintf(kv, sizeof kv, "_kv%s", fc_dtype_name(p->kv_dtype));
    snprintf(choice->name, sizeof(choice->name), "sm80_fwd_%s%s_d%d_m%dn%d_s%d%s%s%s", fc_dtype_name(p->dtype), kv,
             (int)p->head_dim, t.block_m, t.block_n, t.stages, var, g > 1 ? "_gqapack" : "",
             choice->masks == FC_MASKS_NONE ? "_plain" : "");
    plan_name_put(names, key, choice->name);
}

} /* namespace */

extern "C" fc_status fc_sm80_plan(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                                  fc_cuda_choice *choice, char *why, size_t why_len)
{
    int cls = -1;
    fc_status st = input_refusal(p, dev, &cls, why, why_len);
    if (st != FC_OK) return st;
    const int cfg = pick_tile(cls, p, dev, tune);
    if ((st = tile_refusal(p, dev, cfg, why, why_len)) != FC_OK) return st;
    const fc::sm80::Tile &t = kTiles[cfg];
    const int g = pack_factor(p, t.block_m);
    if ((st = grid_refusal(p, t, g, why, why_len)) != FC_OK) return st;
    choice->path = FC_CUDA_PATH_SM80;
    choice->config = cfg;
    choice->pack_gqa = g > 1;
    choice->num_splits = 1;
    choice->workspace_bytes = 0;
    /* No block of any CTA masked: the kernel instance without the softcap and
     * mask code runs (common/mask_mode.h; this kernel has no first-block-only
     * instance, and the pack shift only matters for that one), unless the
     * row opts out (kVarNoPlain) or tuning.masks asks for more mask code. */
    choice->masks = fc_cuda_mask_mode(p, t.block_m, t.block_n, 0) == FC_MASKS_NONE &&
                            (t.variant & fc::sm80::kVarNoPlain) == 0 && tune->masks <= FC_MASKS_NONE
                        ? FC_MASKS_NONE
                        : FC_MASKS_ANY;
    name_plan(p, t, cfg, g, choice);
    return FC_OK;
}

extern "C" fc_status fc_sm80_forward(const fc_fwd_params *p, const fc_cuda_choice *choice,
                                     const fc_cuda_device *dev, void *stream, char *err, size_t err_len)
{
    if (choice->path != FC_CUDA_PATH_SM80 || choice->config < 0 || choice->config >= kNumTiles ||
        kTiles[choice->config].head_dim != p->head_dim) {
        snprintf(err, err_len, "internal: sm80 forward got an invalid plan (path %d, config %d, head_dim %d)",
                 choice->path, choice->config, p->head_dim);
        return FC_ERR_INTERNAL;
    }
    const fc::sm80::Tile &t = kTiles[choice->config];
    const int splits = p->num_splits > 1 ? p->num_splits : 1;
    if (splits > 1 && (!p->o_accum || !p->lse_accum)) {
        snprintf(err, err_len, "internal: sm80 forward with %d splits but no workspace", splits);
        return FC_ERR_INTERNAL;
    }

    fc_sm80_args a;
    memset(&a, 0, sizeof(a));
    a.p = *p;
    a.p.num_splits = splits;
    const float log2e = 1.4426950408889634f;
    if (p->softcap != 0.f) {
        const float cap = std::fabs(p->softcap);
        a.sl2 = cap * log2e;             /* exp2 argument: tanh(...) * softcap * log2(e) */
        a.softcap_in = p->scale / cap;   /* tanh argument: qk * scale / softcap          */
    } else {
        a.sl2 = p->scale * log2e;
        a.softcap_in = 0.f;
    }
    a.heads_per_kv = fc_fastdiv_make(p->heads_q / p->heads_kv);
    a.pack_g = fc_fastdiv_make(choice->pack_gqa ? a.heads_per_kv.d : 1);
    a.grid_heads = fc_fastdiv_make(p->heads_q / a.pack_g.d);
    a.num_splits = fc_fastdiv_make(splits);
    a.page = fc_fastdiv_make(p->block_table ? p->page_size : 1);
    const int64_t m_tiles = ((int64_t)p->seqlen_q * a.pack_g.d + t.block_m - 1) / t.block_m;
    if (m_tiles > INT_MAX) {
        snprintf(err, err_len, "internal: sm80 m_tiles %lld overflows", (long long)m_tiles);
        return FC_ERR_INTERNAL;
    }
    a.m_tiles = fc_fastdiv_make((int32_t)m_tiles);
    a.pdl = choice->pdl;
    a.plain = choice->masks == FC_MASKS_NONE;
    a.o_vec = fc_o_vec_ok(p);
    fc_sm80_kv_maps maps;
    memset(&maps, 0, sizeof maps);
    if (t.variant & fc::sm80::kVarTma) {
        const fc_status st = encode_kv_maps(p, t, &maps, err, err_len);
        if (st != FC_OK) return st;
    }

    const int cfg = choice->config;
    const int device = dev->id;
    const bool bf16 = p->dtype == FC_DTYPE_BF16;
    switch (p->head_dim) {
    case 32: return bf16 ? fc_sm80_launch_bf16_d32(&a, &maps, cfg, device, stream, err, err_len)
                         : fc_sm80_launch_f16_d32(&a, &maps, cfg, device, stream, err, err_len);
    case 64: return bf16 ? fc_sm80_launch_bf16_d64(&a, &maps, cfg, device, stream, err, err_len)
                         : fc_sm80_launch_f16_d64(&a, &maps, cfg, device, stream, err, err_len);
    case 96: return bf16 ? fc_sm80_launch_bf16_d96(&a, &maps, cfg, device, stream, err, err_len)
                         : fc_sm80_launch_f16_d96(&a, &maps, cfg, device, stream, err, err_len);
    case 128: return bf16 ? fc_sm80_launch_bf16_d128(&a, &maps, cfg, device, stream, err, err_len)
                          : fc_sm80_launch_f16_d128(&a, &maps, cfg, device, stream, err, err_len);
    case 256: return bf16 ? fc_sm80_launch_bf16_d256(&a, &maps, cfg, device, stream, err, err_len)
                          : fc_sm80_launch_f16_d256(&a, &maps, cfg, device, stream, err, err_len);
    default: break;
    }
    snprintf(err, err_len, "internal: sm80 forward reached head_dim %d", p->head_dim);
    return FC_ERR_INTERNAL;
}
