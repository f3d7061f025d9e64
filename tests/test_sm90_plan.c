/*
 * test_sm90_plan.c -- the Hopper planner's choices for the benchmark shapes
 * of DESIGN.md on an H100-like device (132 SMs, 227 KB of shared memory),
 * run on the CPU: which tile row, whether the tile loop rotates, whether
 * the last round is tail-balanced, which mask instance. Each expectation is
 * a rule of src/cuda/sm90/plan.cu that a same-run measurement chose
 * (docs/PERF.md, notes-sm90.md); a change of rule must change this test on
 * purpose. Skipped (77) when the Hopper path is not compiled in.
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

int main(void)
{
    int p0 = g_pass, f0 = g_fail;
    /* The planner's hooks must not steer this test. */
    const char *hooks[] = {"FLASHCORE_SM90_CONFIG", "FLASHCORE_SM90_ROTATE", "FLASHCORE_SM90_TAIL",
                           "FLASHCORE_SM90_GRID", "FLASHCORE_PDL", "FLASHCORE_SPLITS"};
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; ++i) {
        unsetenv(hooks[i]);
        /* (also links dispatch.c's hook reader before the planner needs it) */
        CHECK(fc_tuning_row(hooks[i], 64) == -1, "%s unset", hooks[i]);
    }

    fc_cuda_device dev;
    memset(&dev, 0, sizeof dev);
    dev.cc_major = 9;
    dev.cc_minor = 0;
    dev.sm_count = 132;
    dev.smem_optin = 232448;
    dev.l2_bytes = 50 << 20;
    snprintf(dev.name, sizeof dev.name, "H100-like test device");

    {
        fc_fwd_params p = shape(1, 8, 8, 512, 64, 0, 0);
        fc_cuda_choice c;
        char why[256];
        memset(&c, 0, sizeof c);
        /* the stubs' answers: no CUDA at all (cuda_stub.c), or no 90a (launch.cu) */
        if (fc_sm90_plan(&p, &dev, &c, why, sizeof why) == FC_ERR_UNSUPPORTED &&
            (!fc_cuda_compiled() || strstr(why, "not compiled in"))) {
            printf("skip: %s\n", why);
            return 77;
        }
    }

    const struct expect cases[] = {
        /* one tile per CTA: the 64-row row, never rotated (-8%, session 4) */
        {"mission", shape(1, 8, 8, 512, 64, 0, 0), 64, 128, 0, 0, FC_MASKS_NONE},
        /* the tall row, not rotated (run 72: -1.3% rotated) */
        {"s512-d64", shape(32, 32, 32, 512, 64, 0, 1), 192, 128, 0, 0, FC_MASKS_NONE},
        /* 16 KV blocks, no band: rotated (run 72: +1.2%); its tail costs what
         * it saves (run 63), so none */
        {"s2k-d128", shape(8, 16, 16, 2048, 128, 0, 1), 128, 128, 1, 0, FC_MASKS_NONE},
        /* a band: rotation only up to 8 blocks (run 72: -3.3% at 16) */
        {"s2k-d128-causal", shape(8, 16, 16, 2048, 128, 1, 1), 128, 128, 0, 0, FC_MASKS_FIRST},
        /* 64 KV blocks: not rotated (-1.6%, session 4), tail-balanced (run 64) */
        {"s8k-d128", shape(2, 16, 16, 8192, 128, 0, 1), 128, 128, 0, 1, FC_MASKS_NONE},
        {"s8k-d128-causal", shape(2, 16, 16, 8192, 128, 1, 1), 128, 128, 0, 0, FC_MASKS_FIRST},
        /* the tall row where it pays (tall = 20 in tiles.cuh) */
        {"s16k-d64", shape(1, 32, 32, 16384, 64, 0, 0), 192, 128, 0, 0, FC_MASKS_NONE},
        /* 4096 keys in 80-key blocks: a KV tail, the mask-everywhere
         * instance (run 74: the first-block one gained nothing); one Q
         * buffer, so no rotation; no tail row */
        {"s4k-d256", shape(4, 8, 8, 4096, 256, 0, 1), 128, 80, 0, 0, FC_MASKS_ANY},
        {"gqa-prefill", shape(1, 32, 8, 4096, 128, 1, 1), 128, 128, 0, 0, FC_MASKS_FIRST},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const struct expect *e = &cases[i];
        fc_cuda_choice c;
        char why[256] = "";
        memset(&c, 0, sizeof c);
        const fc_status st = fc_sm90_plan(&e->p, &dev, &c, why, sizeof why);
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
    return test_summary();
}
