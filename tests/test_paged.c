/*
 * test_paged.c -- the paged KV cache and seqused_k on the tiled CPU path
 * (FC_BACKEND_CPU) against the fp64 reference, through the public API,
 * judged by the kit's per-dtype gates.
 *
 * Every case's reference is first checked against itself: the used keys
 * gathered into a dense twin must give the same bits (test_paged.h). Then
 * the tiled path runs on poisoned out/lse: every logical element written,
 * nothing else, rows with no visible key exactly 0 and lse -inf.
 *
 *   1. random configurations (test_paged.h): page sizes 1, 3, 16, 64, 256,
 *      decode, speculative and chunked prefill, GQA 1/4/8, masks, softcap,
 *      head dims 32..256, f32/f16/bf16, every layout, seqused_k modes;
 *   2. the named edges in every dtype (all sequences empty, one page,
 *      page_size 1, page 1024, ...);
 *   3. the kit's caches reached every feature (spare pages, padded rows,
 *      out-of-range unused entries, both page layouts, counts 0/1/full).
 *
 * Usage: test_paged [--quick] [--cases N] [--seed S] [--verbose]
 *   --quick    20 random cases and the edges in f32 (default: 170, every dtype)
 * Output: a line per failure (every case with --verbose), a line per group,
 * then "N passed, M failed".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_paged.h"
#include "test_util.h"

static int g_verbose;
static int g_seen[TP_SEEN_N];

/* One case: reference, its own check, then the tiled path (tp_run_fn). */
static void run_case(void *user, const char *tag, const kit_shape *s, uint64_t seed, void (*prep)(kit_case *))
{
    fc_context *ctx = user;
    char why[512], line[400], desc[300];
    tp_ref r;
    int ok = tp_ref_init(ctx, &r, s, seed, prep, why, sizeof why) == 0;
    if (ok) {
        tp_note(&r.c, g_seen);
        kit_poison(r.c.out, r.c.out_bytes, s->dtype, r.c.lse, r.c.lse_bytes);
        r.c.args.backend = FC_BACKEND_CPU;
        const fc_status st = fc_attention_forward(ctx, &r.c.args, NULL, NULL);
        if (st != FC_OK) snprintf(why, sizeof why, "cpu: %s (%s)", fc_status_string(st), fc_last_error(ctx));
        ok = st == FC_OK && tp_judge(&r, r.c.out, r.c.lse, line, sizeof line);
        if (st == FC_OK) snprintf(why, sizeof why, "%s", line);
    }
    tp_describe(&r.c, desc, sizeof desc);
    if (ok) g_pass++;
    else g_fail++;
    if (!ok || g_verbose) printf("%s %s [%s] | %s\n", ok ? "PASS" : "FAIL", tag, desc, why);
    fflush(stdout);
    tp_ref_free(&r);
}

int main(int argc, char **argv)
{
    tu_opts o = {.cases = 170, .seed = 1};
    if (tu_parse_opts(argc, argv, &o, "test_paged [--quick] [--cases N] [--seed S] [--verbose]") != 0) return 2;
    g_verbose = o.verbose;
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    static const int pages[] = {1, 3, 16, 64, 256};
    static const int dims[] = {32, 64, 64, 96, 128, 128, 256};
    static const fc_dtype dtypes[] = {FC_DTYPE_F32, FC_DTYPE_F16, FC_DTYPE_BF16};
    const tp_config cfg = {pages, 5, dims, 7, dtypes, 3, 3e7};
    const double t0 = kit_now();
    tp_random_cases(run_case, ctx, &cfg, o.quick ? 20 : o.cases, o.seed);
    tp_edge_cases(run_case, ctx, dtypes, o.quick ? 1 : 3);
    if (!o.quick) { /* too few cases to reach every feature */
        const int p0 = g_pass, f0 = g_fail;
        tp_check_seen(g_seen);
        group_done("kit cache features reached", p0, f0);
    }
    fc_context_free(ctx);
    printf("(%.1f s)\n", kit_now() - t0);
    return test_summary();
}
