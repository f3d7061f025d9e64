/*
 * test_append.c -- the append step (k_new / v_new into the cache, rotary on
 * q and k_new) on both CPU backends, through the public API, against the
 * oracle of test_append.h (its own rotation and cache writes, then the fp64
 * reference attention): the output by the kit's gates, the cache bit for
 * bit (k within one rounding).
 *
 *   1. random cases: dense and paged caches (pages 1, 3, 16, 64), 1-6 new
 *      keys, decode and speculative steps, rotary off / full / half of the
 *      head dim in both pairings, causal or not, f32/f16/bf16, every layout;
 *   2. the named edges in every dtype (empty caches, an append that fills
 *      the cache, page size 1, appends across pages of 3, no rotary).
 *
 * Usage: test_append [--quick] [--cases N] [--seed S] [--verbose]
 * Output: a line per failure (every case with --verbose), a line per group,
 * then "N passed, M failed".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_append.h"
#include "test_util.h"

static int g_verbose;

/* One backend's call on the case's own buffers (the cache restored first). */
static int run_backend(fc_context *ctx, ta_case *t, fc_backend backend, char *line, size_t n)
{
    kit_case *c = &t->r.c;
    memcpy(c->k, t->k0, c->k_bytes);
    memcpy(c->v, t->v0, c->v_bytes);
    kit_poison(c->out, c->out_bytes, c->s.dtype, c->lse, c->lse_bytes);
    fc_attention_args a = c->args;
    a.backend = backend;
    const fc_status st = fc_attention_forward(ctx, &a, NULL, NULL);
    if (st != FC_OK) {
        snprintf(line, n, "%s (%s)", fc_status_string(st), fc_last_error(ctx));
        return 0;
    }
    return ta_judge(t, c->out, c->lse, c->k, c->v, line, n);
}

static void run_spec(fc_context *ctx, const char *tag, const kit_shape *s, uint64_t seed)
{
    static const fc_backend backends[2] = {FC_BACKEND_CPU_REFERENCE, FC_BACKEND_CPU};
    static const char *const names[2] = {"cpu-reference", "cpu"};
    char why[600], desc[400];
    ta_case t;
    const int built = ta_init(ctx, &t, s, seed, why, sizeof why) == 0;
    ta_describe(&t, desc, sizeof desc);
    for (int i = 0; i < 2; i++) {
        const int ok = built && run_backend(ctx, &t, backends[i], why, sizeof why);
        if (ok) g_pass++;
        else g_fail++;
        if (!ok || g_verbose) printf("%s %s %s [%s] | %s\n", ok ? "PASS" : "FAIL", tag, names[i], desc, why);
    }
    fflush(stdout);
    ta_free(&t);
}

int main(int argc, char **argv)
{
    tu_opts o = {.cases = 120, .seed = 1};
    if (tu_parse_opts(argc, argv, &o, "test_append [--quick] [--cases N] [--seed S] [--verbose]") != 0) return 2;
    g_verbose = o.verbose;
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    static const int pages[] = {0, 1, 3, 16, 64};
    static const int dims[] = {32, 64, 128, 128};
    static const fc_dtype dtypes[] = {FC_DTYPE_F32, FC_DTYPE_F16, FC_DTYPE_BF16};
    const double t0 = kit_now();
    int p0 = g_pass, f0 = g_fail;
    uint64_t rng = o.seed * 0x2545F4914F6CDD1Dull + 3;
    for (int i = 0; i < (o.quick ? 16 : o.cases); i++) {
        const kit_shape s = ta_random_spec(&rng, pages, 5, dims, 4, dtypes, 3);
        char tag[32];
        snprintf(tag, sizeof tag, "random#%d", i);
        run_spec(ctx, tag, &s, o.seed * 1000 + (uint64_t)i);
    }
    group_done("random configurations", p0, f0);
    p0 = g_pass, f0 = g_fail;
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < TA_NUM_EDGES; i++) {
            const kit_shape s = ta_edge_spec(i, dtypes[d]);
            run_spec(ctx, ta_edges[i].name, &s, 900 + (uint64_t)i);
        }
    group_done("named edges", p0, f0);
    fc_context_free(ctx);
    printf("(%.1f s)\n", kit_now() - t0);
    return test_summary();
}
