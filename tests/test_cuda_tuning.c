/*
 * test_cuda_tuning.c -- the tuning cache on a GPU: for a few shapes (a
 * prefill on each path's row table, a decode that splits, an odd head dim),
 *  - an entry recorded for the shape, saved and loaded into a fresh context,
 *    runs: fc_kernel_info says tuned and names the entry's kernel, and the
 *    output matches the fp64 reference with every element written;
 *  - an entry the call cannot take (a row of another head dim, more splits
 *    than KV blocks) is ignored: the planner's kernel, tuned 0, correct;
 *  - an entry asking for more mask code runs that kernel instance;
 *  - a hook set with fc_context_set_tuning wins over the cache;
 *  - recording no choice removes the entry;
 * and one planner rule the tuner found (planner_packs_any_ratio).
 * (Which shapes share a bucket is test_tuning_cache.c's.)
 * 77 without a CUDA device.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#if !defined(FC_HAVE_CUDA)
TU_MAIN_WITHOUT_CUDA
#else
#include <cuda_runtime.h>

#include "test_cuda_util.h"

static char g_file[64];

/* Run r's case on ctx and judge it against its reference: every element
 * written, within the dtype's gate. info gets the kernel. */
static int run_checked(fc_context *ctx, tcu_ref_case *r, fc_kernel_info *info, const char *what)
{
    const kit_case *c = &r->c;
    void *out = malloc(c->out_bytes);
    float *lse = c->lse ? malloc(c->lse_bytes) : NULL;
    char err[600];
    memset(info, 0, sizeof *info);
    const fc_status st = out ? dev_run(ctx, c, &r->d, NULL, out, lse, info, err, sizeof err) : FC_ERR_OUT_OF_MEMORY;
    int ok = st == FC_OK;
    CHECK(ok, "%s: %s", what, st == FC_OK ? "" : err);
    if (ok) {
        const kit_gate g = kit_gate_for(kit_out_dtype(&c->s));
        kit_metrics m;
        kit_compare(c, out, lse, r->ref, r->ref_lse, &g, &m);
        ok = kit_gate_pass(&m, &g);
        CHECK(ok, "%s (%s): max_abs %.3g rel_l2 %.3g, %lld unwritten", what, info->name, m.max_abs, m.rel_l2,
              (long long)m.unwritten);
    }
    free(out);
    free(lse);
    return ok;
}

/* A row of path `path` for head dim d whose kernel differs from the
 * planner's (name), or -1. */
static int other_row(fc_context *probe, const fc_attention_args *a, int path, int d, const char *name)
{
    fc_tile_row r;
    for (int i = 0; fc_tuning_row_info(path, i, &r) == FC_OK; i++) {
        if (r.head_dim != d) continue;
        fc_tuning t;
        fc_tuning_init(&t);
        *(path == 90 ? &t.sm90_config : &t.sm80_config) = i;
        fc_kernel_info info;
        if (fc_context_set_cuda_path(probe, path) || fc_context_set_tuning(probe, &t) ||
            fc_attention_supported(probe, a, &info) != FC_OK)
            continue;
        if (strcmp(info.name, name) != 0 && !strstr(info.name, "+split")) return i;
    }
    return -1;
}

/* A row of path `path` whose head dim is not d, or -1. */
static int foreign_row(int path, int d)
{
    fc_tile_row r;
    for (int i = 0; fc_tuning_row_info(path, i, &r) == FC_OK; i++)
        if (r.head_dim != d) return i;
    return -1;
}

typedef struct tcase {
    const char *name;
    kit_shape s;
    int splits; /* > 0: the entry chooses this split count               */
    int masks;  /* > 0: the entry asks for this much mask code; else (with
                 * splits 0) another row                                 */
} tcase;

/* Does a kernel name carry the mask code that tuning.masks m asks for? */
static int has_masks(const char *name, int m, int path)
{
    if (m == 1 && path == 90) return strstr(name, "_plainloop") != NULL;
    return strstr(name, "_plain") == NULL; /* sm80 takes 1 as 2 */
}

static void one_shape(fc_context *planner, const tcase *tc, int path)
{
    int p0 = g_pass, f0 = g_fail;
    tcu_ref_case r;
    char err[400];
    if (tcu_ref_case_init(planner, &tc->s, 7, &r, err, sizeof err)) {
        CHECK(0, "%s: setup: %s", tc->name, err);
        return;
    }
    fc_kernel_info pinfo, info;
    run_checked(planner, &r, &pinfo, "the planner");
    CHECK(pinfo.tuned == 0, "%s: no cache, not tuned", tc->name);

    /* the entry: another row of the planner's path, or a split count */
    fc_context *rec = NULL, *loaded = NULL, *probe = NULL;
    fc_context_create(&rec);
    fc_context_create(&loaded);
    fc_context_create(&probe);
    fc_context_load_tuning(rec, NULL);
    fc_context_load_tuning(probe, NULL);
    fc_tuning t;
    fc_tuning_init(&t);
    const int want_splits = pinfo.num_splits == tc->splits ? tc->splits + 2 : tc->splits;
    if (tc->masks) t.masks = tc->masks;
    else if (tc->splits) t.splits = want_splits;
    else {
        const int row = other_row(probe, &r.d.args, path, tc->s.head_dim, pinfo.name);
        if (row < 0) {
            tu_note_skip("no second row for the head dim on this path");
            goto out;
        }
        *(path == 90 ? &t.sm90_config : &t.sm80_config) = row;
    }
    CHECK(fc_context_record_tuning(rec, &r.d.args, NULL, path, &t, "test entry") == FC_OK, "%s: record: %s",
          tc->name, fc_last_error(rec));
    CHECK(fc_context_save_tuning(rec, g_file) == FC_OK, "save: %s", fc_last_error(rec));
    CHECK(fc_context_load_tuning(loaded, g_file) == FC_OK, "load: %s", fc_last_error(loaded));
    run_checked(loaded, &r, &info, "the entry");
    CHECK(info.tuned == 1 && strcmp(info.name, pinfo.name) != 0, "%s: tuned %d, kernel %s (planner %s)", tc->name,
          (int)info.tuned, info.name, pinfo.name);
    if (tc->splits) {
        char want[16];
        snprintf(want, sizeof want, "+split%d", want_splits);
        CHECK(strstr(info.name, want) != NULL, "%s: %s has %s", tc->name, info.name, want);
    }
    if (tc->masks)
        CHECK(has_masks(info.name, tc->masks, path), "%s: %s has mask code %d", tc->name, info.name, tc->masks);

    /* a hook set on the context wins over the entry */
    fc_tuning hook;
    fc_tuning_init(&hook);
    hook.splits = 1;
    fc_context_set_tuning(loaded, &hook);
    run_checked(loaded, &r, &info, "a hook over the entry");
    CHECK(!tc->splits || (info.tuned == 0 && !strstr(info.name, "+split")), "%s: the hook wins: %s tuned %d",
          tc->name, info.name, (int)info.tuned);
    fc_tuning_init(&hook);
    fc_context_set_tuning(loaded, &hook);

    /* entries the call cannot take whole are ignored */
    fc_tuning bad;
    fc_tuning_init(&bad);
    const int fr = foreign_row(path, tc->s.head_dim);
    if (fr >= 0) *(path == 90 ? &bad.sm90_config : &bad.sm80_config) = fr;
    else bad.splits = 64;
    CHECK(fc_context_record_tuning(rec, &r.d.args, NULL, path, &bad, NULL) == FC_OK, "record the illegal entry");
    CHECK(fc_context_save_tuning(rec, g_file) == FC_OK && fc_context_load_tuning(loaded, g_file) == FC_OK, "reload");
    run_checked(loaded, &r, &info, "an illegal entry");
    CHECK(info.tuned == 0 && strcmp(info.name, pinfo.name) == 0, "%s: illegal entry ignored: %s tuned %d", tc->name,
          info.name, (int)info.tuned);

    /* recording no choice removes the bucket's entry */
    CHECK(fc_context_record_tuning(rec, &r.d.args, NULL, path, &t, NULL) == FC_OK &&
              fc_context_record_tuning(rec, &r.d.args, NULL, 0, NULL, NULL) == FC_OK,
          "record, then remove: %s", fc_last_error(rec));
    CHECK(fc_context_save_tuning(rec, g_file) == FC_OK && fc_context_load_tuning(loaded, g_file) == FC_OK, "reload");
    run_checked(loaded, &r, &info, "a removed entry");
    CHECK(info.tuned == 0 && strcmp(info.name, pinfo.name) == 0, "%s: removed entry: %s tuned %d", tc->name,
          info.name, (int)info.tuned);

out:
    fc_context_free(rec);
    fc_context_free(loaded);
    fc_context_free(probe);
    tcu_ref_case_free(&r);
    char name[96];
    snprintf(name, sizeof name, "%s/path%d", tc->name, path);
    group_done(name, p0, f0);
}

/* Not the cache but what it taught the planner: on an sm_90 device a
 * decode whose GQA ratio the Hopper kernels cannot pack (5:1) runs the
 * sm80-class packed kernel, correct; forcing path 90 keeps the Hopper one. */
static void planner_packs_any_ratio(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    tcu_ref_case r;
    char err[400];
    const kit_shape s = test_shape(2, 40, 8, 1, 4096, 128, FC_DTYPE_BF16);
    if (tcu_ref_case_init(ctx, &s, 11, &r, err, sizeof err)) {
        CHECK(0, "setup: %s", err);
        return;
    }
    fc_kernel_info info;
    run_checked(ctx, &r, &info, "5:1 decode");
    CHECK(strstr(info.name, "sm80_") && strstr(info.name, "_gqapack"), "5:1 decode runs %s", info.name);
    fc_context_set_cuda_path(ctx, 90);
    run_checked(ctx, &r, &info, "5:1 decode on path 90");
    CHECK(strstr(info.name, "sm90_") != NULL, "path 90 forced: %s", info.name);
    fc_context_set_cuda_path(ctx, 0);
    tcu_ref_case_free(&r);
    group_done("planner/gqa5-decode", p0, f0);
}

int main(void)
{
    fc_context *ctx;
    const int rc = tu_cuda_start(&ctx);
    if (rc >= 0) return rc;
    fc_context_load_tuning(ctx, NULL); /* the planner, whatever the environment says */
    snprintf(g_file, sizeof g_file, "/tmp/fc_cuda_tuning_%d.tune", (int)getpid());
    const int cc = tcu_device_cc();
    tcase cases[5];
    cases[0] = (tcase){"prefill-causal", test_shape(2, 8, 8, 1000, 1000, 128, FC_DTYPE_BF16), 0, 0};
    cases[0].s.window_right = 0;
    cases[0].s.causal = 1;
    cases[1] = (tcase){"decode", test_shape(2, 16, 4, 1, 3000, 128, FC_DTYPE_F16), 3, 0};
    cases[2] = (tcase){"odd-d96", test_shape(3, 6, 2, 777, 777, 96, FC_DTYPE_BF16), 0, 0};
    /* whole KV blocks, no mask: the planner's instance has no mask code */
    cases[3] = (tcase){"masks-any", test_shape(2, 8, 8, 1024, 1024, 128, FC_DTYPE_BF16), 0, 2};
    cases[4] = (tcase){"masks-first", test_shape(1, 8, 8, 2048, 2048, 64, FC_DTYPE_F16), 0, 1};
    for (int i = 0; i < 5; i++) {
        if (cc == 90) one_shape(ctx, &cases[i], 90);
        one_shape(ctx, &cases[i], 80);
    }
    if (cc == 90) planner_packs_any_ratio(ctx);
    unlink(g_file);
    fc_context_free(ctx);
    tu_print_skips();
    return test_summary();
}
#endif
