/*
 * test_cuda_plan.c -- the CUDA planners' choices for the benchmark shapes
 * (docs/PERF.md), run on the CPU against fake devices:
 *  - sm90_plan: the Hopper planner on an H100-like device (132 SMs, 227 KB
 *    of shared memory): which tile row, whether the tile loop rotates,
 *    whether the last round is tail-balanced, which mask instance;
 *  - sm80_plan: the sm80-class planner on A100- and H100-like devices:
 *    which tile row and whether query heads are packed;
 *  - bwd_plan: the sm80-class backward planner: the row per class and head
 *    dim, the workspace size, the refusals.
 * Each expectation is a rule of src/cuda/sm90/plan.cu or sm80/plan.cu that
 * a same-run measurement chose (docs/PERF.md, docs/design-sm90.md,
 * docs/design-sm80.md); a change of rule must change this test on purpose. A
 * group whose path is not compiled in is skipped; 77 when neither is.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "cuda/common/mask_mode.h"
#include "test_util.h"

/* The planners' defaults: no hook steers this test. */
static fc_tuning k_tuning;

/* A dense BSHD problem; the pointers are never dereferenced by the planner,
 * only checked for the TMA's 16-byte alignment. */
static fc_fwd_params shape(int b, int hq, int hkv, int s, int d, int causal, int bf16)
{
    fc_fwd_params p;
    memset(&p, 0, sizeof p);
    p.q = p.k = p.v = (const void *)(uintptr_t)0x10000000u;
    p.o = (void *)(uintptr_t)0x20000000u;
    p.batch = b;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = d;
    p.seqlen_q = p.seqlen_k = s;
    p.dtype = bf16 ? FC_DTYPE_BF16 : FC_DTYPE_F16;
    p.scale = 1.0f / sqrtf((float)d);
    p.causal = causal;
    p.window_left = -1;
    p.window_right = causal ? 0 : -1;
    p.q_head_stride = p.o_head_stride = d;
    p.q_row_stride = p.o_row_stride = (int64_t)hq * d;
    p.q_batch_stride = p.o_batch_stride = (int64_t)s * hq * d;
    p.k_head_stride = p.v_head_stride = d;
    p.k_row_stride = p.v_row_stride = (int64_t)hkv * d;
    p.k_batch_stride = p.v_batch_stride = (int64_t)s * hkv * d;
    return p;
}

struct expect {
    const char *name;
    fc_fwd_params p;
    int block_m, block_n; /* the row's tile                            */
    int rotate, tail;     /* plan.cu's rotation and tail-balancing rules */
    int masks;            /* FC_MASKS_*                                  */
};

/* A device as the planners see it: compute capability, SMs, the shared
 * memory a block may opt in to, L2. */
static fc_cuda_device fake_device(int major, int minor, int sms, int64_t smem_optin, int64_t l2, const char *name)
{
    fc_cuda_device dev;
    memset(&dev, 0, sizeof dev);
    dev.cc_major = major;
    dev.cc_minor = minor;
    dev.sm_count = sms;
    dev.smem_optin = smem_optin;
    dev.l2_bytes = l2;
    snprintf(dev.name, sizeof dev.name, "%s", name);
    return dev;
}
/* H100: 132 SMs, 227 KB of shared memory per block, 50 MB L2. */
static fc_cuda_device h100_like(void) { return fake_device(9, 0, 132, 232448, 50 << 20, "H100-like test device"); }

/* 1: the Hopper planner's choices checked; 0: skipped (not compiled in). */
static int sm90_plan_group(void)
{
    int p0 = g_pass, f0 = g_fail;
    const fc_cuda_device dev = h100_like();

    {
        fc_fwd_params p = shape(1, 8, 8, 512, 64, 0, 0);
        fc_cuda_choice c;
        char why[256];
        memset(&c, 0, sizeof c);
        /* the stubs' answers: no CUDA at all (cuda_stub.c), or no 90a (launch.cu) */
        if (fc_sm90_plan(&p, &dev, &k_tuning, &c, why, sizeof why) == FC_ERR_UNSUPPORTED &&
            (!fc_cuda_compiled() || strstr(why, "not compiled in"))) {
            printf("sm90_plan skipped: %s\n", why);
            return 0;
        }
    }

    const struct expect cases[] = {
        /* one tile per CTA: the 64-row row, never rotated (-8%) */
        {"mission", shape(1, 8, 8, 512, 64, 0, 0), 64, 128, 0, 0, FC_MASKS_NONE},
        /* the 4-warpgroup tall row: 256 rows, no padding (+9% over the
         * 192-row row, which pads 512 rows to 576), not rotated */
        {"s512-d64", shape(32, 32, 32, 512, 64, 0, 1), 256, 64, 0, 0, FC_MASKS_NONE},
        /* masked: the 4-warpgroup row is unmeasured there, so the 192-row one,
         * whose tiles meet the diagonal in more than their first key block */
        {"s512-d64-causal", shape(32, 32, 32, 512, 64, 1, 1), 192, 128, 0, 0, FC_MASKS_ANY},
        /* 16 KV blocks, no band: rotated (+1.2%); its tail costs what it
         * saves, so none */
        {"s2k-d128", shape(8, 16, 16, 2048, 128, 0, 1), 128, 128, 1, 0, FC_MASKS_NONE},
        /* a band: rotation only up to 8 blocks (-3.3% at 16) */
        {"s2k-d128-causal", shape(8, 16, 16, 2048, 128, 1, 1), 128, 128, 0, 0, FC_MASKS_FIRST},
        /* 64 KV blocks: not rotated (-1.6%), tail-balanced */
        {"s8k-d128", shape(2, 16, 16, 8192, 128, 0, 1), 128, 128, 0, 1, FC_MASKS_NONE},
        {"s8k-d128-causal", shape(2, 16, 16, 8192, 128, 1, 1), 128, 128, 0, 0, FC_MASKS_FIRST},
        /* the 192-row tall row where it pays (tall = 20 in tiles.cuh; the
         * 256-row one, tall = 15, trails it by 4% at long KV) */
        {"s16k-d64", shape(1, 32, 32, 16384, 64, 0, 0), 192, 128, 0, 0, FC_MASKS_NONE},
        /* 4096 keys in 80-key blocks: a KV tail, the mask-everywhere
         * instance (the first-block one gained nothing); one Q
         * buffer, so no rotation; no tail row */
        {"s4k-d256", shape(4, 8, 8, 4096, 256, 0, 1), 128, 80, 0, 0, FC_MASKS_ANY},
        {"gqa-prefill", shape(1, 32, 8, 4096, 128, 1, 1), 128, 128, 0, 0, FC_MASKS_FIRST},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const struct expect *e = &cases[i];
        fc_cuda_choice c;
        char why[256] = "";
        memset(&c, 0, sizeof c);
        const fc_status st = fc_sm90_plan(&e->p, &dev, &k_tuning, &c, why, sizeof why);
        CHECK(st == FC_OK, "%s: planned (%s)", e->name, why);
        if (st != FC_OK) continue;
        int bm = 0, bn = 0;
        c.path = FC_CUDA_PATH_SM90;
        fc_cuda_tile_shape(&c, &bm, &bn);
        CHECK(bm == e->block_m && bn == e->block_n, "%s: tile %dx%d, expected %dx%d (%s)", e->name, bm, bn,
              e->block_m, e->block_n, c.name);
        CHECK(c.rotate == e->rotate, "%s: rotate %d, expected %d (%s)", e->name, c.rotate, e->rotate, c.name);
        CHECK(c.tail == e->tail, "%s: tail %d, expected %d (%s)", e->name, c.tail, e->tail, c.name);
        CHECK(c.masks == e->masks, "%s: masks %d, expected %d (%s)", e->name, c.masks, e->masks, c.name);
        CHECK((c.tail != 0) == (c.workspace_bytes > 0), "%s: workspace %lld with tail %d", e->name,
              (long long)c.workspace_bytes, c.tail);
        CHECK((strstr(c.name, "_rot") != NULL) == (c.rotate != 0), "%s: the name says the rotation (%s)", e->name,
              c.name);
        printf("%-16s %s%s\n", e->name, c.name, c.tail ? " (+tail)" : "");
    }
    group_done("sm90_plan", p0, f0);
    return 1;
}

/* 1: the sm80-class planner's choices checked; 0: skipped (no CUDA). */
static int sm80_plan_group(void)
{
    int p0 = g_pass, f0 = g_fail;
    /* A100: 108 SMs, 163 KB of shared memory per block, 40 MB L2. */
    const fc_cuda_device a100 = fake_device(8, 0, 108, 166912, 40 << 20, "A100-like test device");
    const fc_cuda_device h100 = h100_like();
    {
        fc_fwd_params p = shape(1, 8, 8, 512, 64, 0, 0);
        fc_cuda_choice c;
        char why[256];
        memset(&c, 0, sizeof c);
        if (fc_sm80_plan(&p, &a100, &k_tuning, &c, why, sizeof why) == FC_ERR_UNSUPPORTED && !fc_cuda_compiled()) {
            printf("sm80_plan skipped: %s\n", why);
            return 0;
        }
    }
    fc_fwd_params decode = shape(32, 32, 8, 8192, 128, 0, 1); /* the benchmark's gqa-decode */
    decode.seqlen_q = 1;
    decode.q_batch_stride = decode.o_batch_stride = 32 * 128;
    fc_fwd_params mha_decode = decode; /* one query row per (batch, head): no packing */
    mha_decode.heads_kv = 32;
    mha_decode.k_row_stride = mha_decode.v_row_stride = 32 * 128;
    mha_decode.k_batch_stride = mha_decode.v_batch_stride = (int64_t)8192 * 32 * 128;
    fc_fwd_params chunk = shape(4, 32, 8, 2048, 128, 0, 1); /* 32 rows x 4 heads = 128 per column */
    chunk.seqlen_q = 32;
    chunk.q_batch_stride = chunk.o_batch_stride = (int64_t)32 * 32 * 128;
    /* K's heads broadcast (head stride 0): TMA needs positive strides, so
     * the kVarTma d256 row does not run it and the planner falls back to a
     * cp.async row (the SM86 class's 64x32, the smallest that fits). */
    fc_fwd_params d256_bcast = shape(4, 8, 8, 4096, 256, 0, 1);
    d256_bcast.k_head_stride = 0;
    /* A cache's lengths (seqused_k): the TMA row would bring rows past them
     * unzeroed, so the cp.async fallback as above. */
    fc_fwd_params d256_used = shape(4, 8, 8, 4096, 256, 0, 1);
    static const int32_t used4[4] = {4096, 17, 0, 300};
    d256_used.seqused_k = used4;
    fc_fwd_params d64_decode = shape(32, 32, 8, 8192, 64, 0, 1);
    d64_decode.seqlen_q = 1;
    d64_decode.q_batch_stride = d64_decode.o_batch_stride = 32 * 64;
    const struct {
        const char *name;
        const fc_cuda_device *dev;
        fc_fwd_params p;
        int block_m, block_n, pack;
    } cases[] = {
        /* the defaults (tiles.cuh: FA2's tiles per class) */
        {"s2k-d128 A100", &a100, shape(8, 16, 16, 2048, 128, 0, 1), 128, 32, 0},
        {"s2k-d128 H100", &h100, shape(8, 16, 16, 2048, 128, 0, 1), 128, 64, 0},
        {"s4k-d256 H100", &h100, shape(4, 8, 8, 4096, 256, 0, 1), 64, 64, 0},
        {"d256 bcast-K H100", &h100, d256_bcast, 64, 32, 0},
        {"d256 seqused H100", &h100, d256_used, 64, 32, 0},
        /* d64 at long KV: the 128x96 row (min_sk 4096) */
        {"s16k-d64 H100", &h100, shape(1, 32, 32, 16384, 64, 0, 0), 128, 96, 0},
        /* under one wave of 128-row tiles: the small-grid d64 row */
        {"mission H100", &h100, shape(1, 8, 8, 512, 64, 0, 0), 64, 64, 0},
        /* 4 packed rows per column: the few-rows d128 row */
        {"gqa-decode A100", &a100, decode, 64, 64, 1},
        {"gqa-decode H100", &h100, decode, 64, 64, 1},
        {"mha-decode H100", &h100, mha_decode, 64, 64, 0},
        /* 128 packed rows per column: two 64-row tiles would read K/V twice */
        {"gqa-chunk32 H100", &h100, chunk, 128, 64, 1},
        {"d64-decode H100", &h100, d64_decode, 64, 64, 1},
        {"d64-decode A100", &a100, d64_decode, 64, 64, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        fc_cuda_choice c;
        char why[256] = "";
        memset(&c, 0, sizeof c);
        const fc_status st = fc_sm80_plan(&cases[i].p, cases[i].dev, &k_tuning, &c, why, sizeof why);
        CHECK(st == FC_OK, "%s: planned (%s)", cases[i].name, why);
        if (st != FC_OK) continue;
        int bm = 0, bn = 0;
        fc_cuda_tile_shape(&c, &bm, &bn);
        CHECK(bm == cases[i].block_m && bn == cases[i].block_n, "%s: tile %dx%d, expected %dx%d (%s)",
              cases[i].name, bm, bn, cases[i].block_m, cases[i].block_n, c.name);
        CHECK(c.pack_gqa == cases[i].pack, "%s: pack %d, expected %d (%s)", cases[i].name, c.pack_gqa,
              cases[i].pack, c.name);
        printf("%-16s %s\n", cases[i].name, c.name);
        /* the d256 H100 default is the kVarTma row (tiles.cuh), named _v8 */
        if (!strcmp(cases[i].name, "s4k-d256 H100"))
            CHECK(strstr(c.name, "_v8") != NULL, "%s: the TMA row (%s)", cases[i].name, c.name);
    }
    /* FP8 K/V (kVarKv8 rows): the decode tile on an H100 and an Ada part,
     * named for the cache's type; refused on an A100 (no FP8 conversion)
     * and by the Hopper planner */
    const fc_cuda_device ada = fake_device(8, 9, 128, 101376, 72 << 20, "Ada-like test device");
    fc_fwd_params kv8 = decode;
    kv8.kv_dtype = FC_DTYPE_E4M3;
    const fc_cuda_device *kv8_devs[2] = {&h100, &ada};
    for (int i = 0; i < 2; ++i) {
        fc_cuda_choice c;
        char why[256] = "";
        memset(&c, 0, sizeof c);
        const fc_status st = fc_sm80_plan(&kv8, kv8_devs[i], &k_tuning, &c, why, sizeof why);
        if (!fc_cuda_compiled_from(kv8_devs[i]->cc_major, kv8_devs[i]->cc_minor, 89)) {
            /* a build without sm_89+ code for it (FLASHCORE_CUDA_ARCHS): refused, not an empty kernel */
            CHECK(st == FC_ERR_UNSUPPORTED && strstr(why, "sm_89+ code"), "FP8 k/v on %s without sm_89+ code: %s",
                  kv8_devs[i]->name, why);
            continue;
        }
        /* 4 packed rows: the one-m16-tile row whose warps split the keys */
        CHECK(st == FC_OK && strstr(c.name, "_kve4m3_d128_m16n64") && c.pack_gqa, "FP8 k/v decode on %s: %s (%s)",
              kv8_devs[i]->name, st == FC_OK ? c.name : "refused", why);
    }
    fc_fwd_params kv8_chunk = chunk; /* 128 packed rows a column: the 64-row tile */
    kv8_chunk.kv_dtype = FC_DTYPE_E5M2;
    fc_cuda_choice cc;
    char whyc[256] = "";
    CHECK(fc_sm80_plan(&kv8_chunk, &h100, &k_tuning, &cc, whyc, sizeof whyc) == FC_OK &&
              strstr(cc.name, "_kve5m2_d128_m64n64"),
          "FP8 k/v chunk on the H100: %s (%s)", cc.name, whyc);
    fc_cuda_choice c8;
    char why8[256] = "";
    CHECK(fc_sm80_plan(&kv8, &a100, &k_tuning, &c8, why8, sizeof why8) == FC_ERR_UNSUPPORTED && strstr(why8, "sm_89"),
          "FP8 k/v on an A100: %s", why8);
    CHECK(fc_sm90_plan(&kv8, &h100, &k_tuning, &c8, why8, sizeof why8) == FC_ERR_UNSUPPORTED && strstr(why8, "FP8"),
          "FP8 k/v on the sm90 planner: %s", why8);
    group_done("sm80_plan", p0, f0);
    return 1;
}

/* A backward problem over shape()'s forward: dout, dq, dk, dv laid out
 * like out, q, k, v (the planner reads only pointers and strides). */
static fc_bwd_params bwd_shape(int b, int hq, int hkv, int s, int d, int causal, int bf16)
{
    fc_bwd_params p;
    memset(&p, 0, sizeof p);
    p.f = shape(b, hq, hkv, s, d, causal, bf16);
    p.f.lse = (float *)(uintptr_t)0x30000000u;
    p.dout = (const void *)(uintptr_t)0x40000000u;
    p.dq = (void *)(uintptr_t)0x50000000u;
    p.dk = (void *)(uintptr_t)0x60000000u;
    p.dv = (void *)(uintptr_t)0x70000000u;
    p.do_batch_stride = p.dq_batch_stride = p.f.q_batch_stride;
    p.do_row_stride = p.dq_row_stride = p.f.q_row_stride;
    p.do_head_stride = p.dq_head_stride = p.f.q_head_stride;
    p.dk_batch_stride = p.dv_batch_stride = p.f.k_batch_stride;
    p.dk_row_stride = p.dv_row_stride = p.f.k_row_stride;
    p.dk_head_stride = p.dv_head_stride = p.f.k_head_stride;
    return p;
}

static int64_t r256(int64_t x) { return (x + 255) / 256 * 256; }

/* 1: the sm80-class backward planner's choices checked; 0: skipped. Each
 * class's row per head dim (src/cuda/sm80/bwd_tiles.cuh), the workspace
 * (fp32 dQ, D and lse2, semaphores when deterministic), and what it
 * refuses. */
static int bwd_plan_group(void)
{
    int p0 = g_pass, f0 = g_fail;
    const fc_cuda_device a100 = fake_device(8, 0, 108, 166912, 40 << 20, "A100-like test device");
    const fc_cuda_device h100 = h100_like();
    /* RTX 4090-like: sm_89, 99 KB of shared memory per block */
    const fc_cuda_device ada = fake_device(8, 9, 128, 101376, 72 << 20, "Ada-like test device");
    fc_cuda_choice c;
    char why[256] = "";
    fc_bwd_params p = bwd_shape(2, 16, 16, 2048, 128, 1, 1);
    memset(&c, 0, sizeof c);
    if (fc_sm80_bwd_plan(&p, &h100, &k_tuning, &c, why, sizeof why) == FC_ERR_UNSUPPORTED && !fc_cuda_compiled()) {
        printf("bwd_plan skipped: %s\n", why);
        return 0;
    }
    const struct {
        const fc_cuda_device *dev;
        int d;
        const char *name;
    } rows[] = {
        {&h100, 128, "sm80_bwd_bf16_d128_m64n128"}, {&h100, 64, "sm80_bwd_bf16_d64_m128n128"},
        {&h100, 96, "sm80_bwd_bf16_d96_m64n128"},   {&h100, 32, "sm80_bwd_bf16_d32_m64n64"},
        {&a100, 128, "sm80_bwd_bf16_d128_m64n128"}, {&a100, 64, "sm80_bwd_bf16_d64_m64n128"},
        {&ada, 128, "sm80_bwd_bf16_d128_m32n64"},   {&ada, 64, "sm80_bwd_bf16_d64_m64n128"},
        {&ada, 96, "sm80_bwd_bf16_d96_m64n64"},     {&h100, 256, "sm80_bwd_bf16_d256_m64n64"},
        {&a100, 256, "sm80_bwd_bf16_d256_m32n64"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) {
        p = bwd_shape(2, 16, 16, 2048, rows[i].d, 1, 1);
        memset(&c, 0, sizeof c);
        const fc_status st = fc_sm80_bwd_plan(&p, rows[i].dev, &k_tuning, &c, why, sizeof why);
        CHECK(st == FC_OK && !strcmp(c.name, rows[i].name), "%s d%d: %s, expected %s (%s)", rows[i].dev->name,
              rows[i].d, st == FC_OK ? c.name : "refused", rows[i].name, why);
    }
    /* the tuning hook: a row that runs the call is taken (the SM80 class's
     * d256 row on an H100), one that does not (another head dim, or an
     * SM90-only row below sm_90) is ignored */
    int row256 = -1, row128 = -1, row90_256 = -1;
    fc_tile_row tr;
    for (int i = 0; fc_tuning_bwd_row_info(80, i, &tr) == FC_OK; i++) {
        if (tr.head_dim == 256 && tr.arch_class == 80) row256 = i;
        if (tr.head_dim == 256 && tr.arch_class == 90) row90_256 = i;
        if (tr.head_dim == 128 && tr.arch_class == 80) row128 = i;
    }
    const struct {
        const fc_cuda_device *dev;
        int row, d;
        const char *name;
    } forced[] = {
        {&h100, row256, 256, "sm80_bwd_bf16_d256_m32n64"},
        {&h100, row128, 256, "sm80_bwd_bf16_d256_m64n64"},
        {&a100, row90_256, 256, "sm80_bwd_bf16_d256_m32n64"},
    };
    for (size_t i = 0; i < sizeof forced / sizeof forced[0]; ++i) {
        fc_tuning tune = k_tuning;
        tune.sm80_bwd_config = forced[i].row;
        p = bwd_shape(2, 16, 16, 2048, forced[i].d, 1, 1);
        memset(&c, 0, sizeof c);
        const fc_status st = fc_sm80_bwd_plan(&p, forced[i].dev, &tune, &c, why, sizeof why);
        CHECK(forced[i].row >= 0 && st == FC_OK && !strcmp(c.name, forced[i].name), "%s d%d, row %d forced: %s, expected %s (%s)",
              forced[i].dev->name, forced[i].d, forced[i].row, st == FC_OK ? c.name : "refused", forced[i].name, why);
    }
    /* workspace: rows x heads_q x head_dim fp32 + D + lse2 (+ semaphores:
     * batch x heads_q x query blocks of 128 rows, the d64 row's; + the
     * split group's fp32 dK and dV: 4 CTAs on 132 SMs split 2 ways) */
    p = bwd_shape(2, 4, 2, 100, 64, 0, 0);
    for (int det = 0; det < 2; det++) {
        p.deterministic = det;
        memset(&c, 0, sizeof c);
        const fc_status st = fc_sm80_bwd_plan(&p, &h100, &k_tuning, &c, why, sizeof why);
        const int64_t rows_ = 2 * 100, want = r256(rows_ * 4 * 64 * 4) + 2 * r256(4 * rows_ * 4) +
                                             r256(det * 2 * 4 * 4) + (det ? 0 : r256(2 * rows_ * 2 * 64 * 4));
        CHECK(st == FC_OK && c.workspace_bytes == want, "workspace det %d: %lld, expected %lld (%s)", det,
              (long long)c.workspace_bytes, (long long)want, why);
        CHECK(st == FC_OK && (strstr(c.name, "_det") != NULL) == det && (strstr(c.name, "_g2") != NULL) == !det,
              "det %d named: %s", det, c.name);
    }
    /* refusals, each naming what it refuses */
    p = bwd_shape(1, 2, 2, 64, 192, 0, 1);
    CHECK(fc_sm80_bwd_plan(&p, &h100, &k_tuning, &c, why, sizeof why) == FC_ERR_UNSUPPORTED &&
              strstr(why, "supported 32, 64, 96, 128, 256"),
          "d192: %s", why);
    p = bwd_shape(1, 2, 2, 64, 256, 0, 1);
    CHECK(fc_sm80_bwd_plan(&p, &ada, &k_tuning, &c, why, sizeof why) == FC_ERR_UNSUPPORTED &&
              strstr(why, "no sm80 backward tile for head_dim 256 fits"),
          "d256 on 99 KB: %s", why);
    p = bwd_shape(1, 2, 2, 64, 64, 0, 1);
    p.dq_row_stride = 68;
    CHECK(fc_sm80_bwd_plan(&p, &h100, &k_tuning, &c, why, sizeof why) == FC_ERR_UNSUPPORTED &&
              strstr(why, "dq row stride"),
          "dq stride 68: %s", why);
    p = bwd_shape(1, 2, 2, 64, 64, 0, 1);
    p.dout = (const void *)(uintptr_t)0x40000008u;
    CHECK(fc_sm80_bwd_plan(&p, &h100, &k_tuning, &c, why, sizeof why) == FC_ERR_UNSUPPORTED &&
              strstr(why, "dout.data"),
          "dout misaligned: %s", why);
    group_done("bwd_plan", p0, f0);
    return 1;
}

/* 1: the Hopper backward planner's rows checked; 0: skipped. d64 takes
 * 128-query steps but with softcap the 64-query row (the 128-query row
 * has no softcap instance, src/cuda/sm90/bwd_tiles.cuh). */
static int sm90_bwd_rows(void)
{
    int p0 = g_pass, f0 = g_fail;
    const fc_cuda_device h100 = h100_like();
    fc_cuda_choice c;
    char why[256] = "";
    const struct {
        int d;
        float softcap;
        const char *name;
    } rows[] = {
        {64, 0.f, "sm90_bwd_bf16_d64_m128n128"},   {64, 30.f, "sm90_bwd_bf16_d64_m64n128"},
        {96, 0.f, "sm90_bwd_bf16_d96_m64n128"},    {128, 0.f, "sm90_bwd_bf16_d128_m64n128"},
        {128, 30.f, "sm90_bwd_bf16_d128_m64n128"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) {
        fc_bwd_params p = bwd_shape(2, 16, 16, 2048, rows[i].d, 1, 1);
        p.f.softcap = rows[i].softcap;
        memset(&c, 0, sizeof c);
        const fc_status st = fc_sm90_bwd_plan(&p, &h100, &k_tuning, &c, why, sizeof why);
        if (i == 0 && st == FC_ERR_UNSUPPORTED && (!fc_cuda_compiled() || strstr(why, "not compiled in"))) {
            printf("sm90_bwd_rows skipped: %s\n", why);
            return 0;
        }
        CHECK(st == FC_OK && !strcmp(c.name, rows[i].name), "d%d softcap %g: %s, expected %s (%s)", rows[i].d,
              (double)rows[i].softcap, st == FC_OK ? c.name : "refused", rows[i].name, why);
    }
    /* the tuning hook (sm90_bwd_config): a row that runs the call is taken;
     * one of another head_dim, or without the call's softcap kernel, is not */
    int r64 = -1, r64cap = -1, r128 = -1;
    fc_tile_row tr;
    for (int i = 0; fc_tuning_bwd_row_info(90, i, &tr) == FC_OK; i++) {
        if (tr.head_dim == 64 && tr.block_m == 128) r64 = i;
        if (tr.head_dim == 64 && tr.block_m == 64) r64cap = i;
        if (tr.head_dim == 128) r128 = i;
    }
    const struct {
        int row, d;
        float softcap;
        const char *name;
    } forced[] = {
        {r64cap, 64, 0.f, "sm90_bwd_bf16_d64_m64n128"},
        {r64, 64, 30.f, "sm90_bwd_bf16_d64_m64n128"},
        {r128, 64, 0.f, "sm90_bwd_bf16_d64_m128n128"},
    };
    for (size_t i = 0; i < sizeof forced / sizeof forced[0]; ++i) {
        fc_tuning tune = k_tuning;
        tune.sm90_bwd_config = forced[i].row;
        fc_bwd_params p = bwd_shape(2, 16, 16, 2048, forced[i].d, 1, 1);
        p.f.softcap = forced[i].softcap;
        memset(&c, 0, sizeof c);
        const fc_status st = fc_sm90_bwd_plan(&p, &h100, &tune, &c, why, sizeof why);
        CHECK(forced[i].row >= 0 && st == FC_OK && !strcmp(c.name, forced[i].name),
              "d%d softcap %g, row %d forced: %s, expected %s (%s)", forced[i].d, (double)forced[i].softcap,
              forced[i].row, st == FC_OK ? c.name : "refused", forced[i].name, why);
    }
    group_done("sm90_bwd_rows", p0, f0);
    return 1;
}

typedef fc_status (*bwd_planner)(const fc_bwd_params *, const fc_cuda_device *, const fc_tuning *, fc_cuda_choice *,
                                 char *, size_t);
static int bwd_split_path(bwd_planner plan, int path);

/* 1: both backward planners' GQA group split checked (the Hopper one
 * skipped where not compiled in); 0: none ran. The group is dealt to 2^k
 * CTAs per key block while the grid still fits the SMs, never in the
 * deterministic mode; the split adds fp32 dK and dV (2 x key rows x
 * heads_kv x head_dim) to the workspace. On an H100 both paths' rows for
 * d64 and d128 have key blocks of 128 and one CTA per SM: the same splits. */
static int bwd_split_group(void)
{
    int p0 = g_pass, f0 = g_fail, ran = 0;
    for (int path = 80; path <= 90; path += 10) ran += bwd_split_path(path == 90 ? fc_sm90_bwd_plan : fc_sm80_bwd_plan, path);
    group_done("bwd_split", p0, f0);
    return ran > 0;
}
static int bwd_split_path(bwd_planner plan, int path)
{
    const fc_cuda_device h100 = h100_like();
    fc_cuda_choice c;
    char why[256];
    const struct {
        int b, hq, hkv, s, d, det, splits;
    } rows[] = {
        {4, 8, 2, 512, 64, 0, 4},    /* 32 CTAs, group 4: the small decoder's step */
        {4, 8, 2, 512, 64, 1, 1},    /* deterministic: no atomics                  */
        {2, 16, 2, 257, 128, 0, 8},  /* 12 CTAs x 8 = 96                            */
        {1, 12, 2, 1024, 64, 0, 2},  /* group 6: 2, not 4 (6 % 4)                   */
        {2, 8, 8, 512, 64, 0, 1},    /* no group to split                          */
        {2, 32, 8, 2048, 128, 0, 1}, /* 256 CTAs: the grid fills the device         */
        {1, 32, 8, 1024, 128, 0, 2}, /* 64 CTAs x 2 = 128 <= 132                   */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) {
        fc_bwd_params p = bwd_shape(rows[i].b, rows[i].hq, rows[i].hkv, rows[i].s, rows[i].d, 1, 0);
        p.deterministic = rows[i].det;
        memset(&c, 0, sizeof c);
        fc_status st = plan(&p, &h100, &k_tuning, &c, why, sizeof why);
        if (i == 0 && st == FC_ERR_UNSUPPORTED && (!fc_cuda_compiled() || strstr(why, "not compiled in"))) {
            printf("bwd_split path %d skipped: %s\n", path, why);
            return 0;
        }
        const int64_t with = c.workspace_bytes, splits = c.group_splits > 1 ? c.group_splits : 1;
        char tag[8] = "";
        if (rows[i].splits > 1) snprintf(tag, sizeof tag, "_g%d", rows[i].splits);
        CHECK(st == FC_OK && splits == rows[i].splits && (rows[i].splits == 1 ? !strstr(c.name, "_g") : !!strstr(c.name, tag)),
              "path %d b%d h%d/%d s%d d%d det %d: %s, %d splits (expected %d) (%s)", path, rows[i].b, rows[i].hq,
              rows[i].hkv, rows[i].s, rows[i].d, rows[i].det, st == FC_OK ? c.name : "refused", (int)splits,
              rows[i].splits, why);
        p.deterministic = 1; /* the same problem unsplit, for its workspace (plus semaphores) */
        memset(&c, 0, sizeof c);
        st = plan(&p, &h100, &k_tuning, &c, why, sizeof why);
        int bm = 0; /* the row's query block, from the plan's name (..._m<bm>n<bn>...) */
        const char *m = strstr(c.name, "_m");
        CHECK(m && sscanf(m, "_m%d", &bm) == 1 && bm > 0, "path %d: no block_m in %s", path, c.name);
        if (bm <= 0) continue;
        const int64_t qb = (rows[i].s + bm - 1) / bm, sems = r256((int64_t)rows[i].b * rows[i].hq * qb * 4);
        const int64_t dkv = rows[i].splits > 1 ? r256(2LL * rows[i].b * rows[i].s * rows[i].hkv * rows[i].d * 4) : 0;
        const int64_t want = c.workspace_bytes - (rows[i].det ? 0 : sems) + dkv;
        CHECK(st == FC_OK && with == want, "path %d b%d h%d/%d s%d d%d: workspace %lld, expected %lld", path,
              rows[i].b, rows[i].hq, rows[i].hkv, rows[i].s, rows[i].d, (long long)with, (long long)want);
    }
    return 1;
}

int main(void)
{
    fc_tuning_init(&k_tuning);
    const int ran = sm90_plan_group() + sm80_plan_group() + bwd_plan_group() + sm90_bwd_rows() + bwd_split_group();
    if (!ran) return 77;
    return test_summary();
}
