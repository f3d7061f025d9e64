/*
 * cli_demo.c -- `flashcore demo`: the headline shape (B=1, H=8, S=512, D=64,
 * fp16, non-causal) on the best backend, checked against the fp64 reference
 * with the kit's gates, then timed.
 */
#include <math.h>
#include <string.h>

#include "cli.h"

static void help(void)
{
    printf("usage: flashcore demo [--backend auto|cpu|cuda] [--iters N] [--warmup-ms MS] [--threads N]\n\n"
           "Runs the headline shape (B=1, H=8, S=512, D=64, fp16, non-causal) on the best\n"
           "backend (CUDA when a usable device is present, else the CPU), checks the\n"
           "output and lse against the fp64 reference with the fp16 gates, and times it.\n\n"
           "  --backend B      auto (default), cpu or cuda\n"
           "  --iters N        timed calls (default 100 on CUDA, 20 on the CPU)\n"
           "  --warmup-ms MS   warm-up before timing (default 1000 on CUDA, 100 on the CPU)\n"
           "  --threads N      CPU worker threads (default 0 = one per core)\n\n"
           "Exit status: 0 if the gates pass, 1 if not or on a library error, 2 bad usage.\n");
}

typedef struct demo_opts {
    fc_backend backend;
    long long iters, threads;
    double warmup_ms;
} demo_opts;

/* 0, or -1 with *rc the exit status (--help: CLI_EXIT_OK). */
static int parse_args(int argc, char **argv, demo_opts *o, int *rc)
{
    cli_args a;
    cli_args_init(&a, "demo", argc, argv);
    *rc = CLI_EXIT_USAGE;
    for (const char *arg; (arg = cli_next(&a));) {
        if (cli_is(&a, arg, "--help") || cli_is(&a, arg, "-h")) {
            help();
            *rc = CLI_EXIT_OK;
            return -1;
        } else if (cli_is(&a, arg, "--backend")) {
            const char *v = cli_value(&a, arg);
            if (!v || cli_parse_backend("demo", v, &o->backend)) return -1;
        } else if (cli_is(&a, arg, "--iters")) {
            if (cli_int(&a, arg, 1, 1000000, &o->iters)) return -1;
        } else if (cli_is(&a, arg, "--warmup-ms")) {
            if (cli_double(&a, arg, 0, 600000, &o->warmup_ms)) return -1;
        } else if (cli_is(&a, arg, "--threads")) {
            if (cli_int(&a, arg, 0, 4096, &o->threads)) return -1;
        } else {
            *rc = cli_unknown(&a, arg);
            return -1;
        }
    }
    return 0;
}

/* The headline shape, and where it runs. */
static kit_shape mission_shape(fc_context *ctx, const demo_opts *o, int cuda)
{
    kit_shape s;
    memset(&s, 0, sizeof(s));
    s.name = "mission";
    s.batch = 1;
    s.heads_q = s.heads_kv = 8;
    s.seqlen_q = s.seqlen_k = 512;
    s.head_dim = 64;
    s.dtype = FC_DTYPE_F16;
    s.window_left = s.window_right = -1;
    s.want_lse = 1;
    printf("flashcore %s demo: B=%d H=%d S=%d D=%d %s non-causal\n", fc_version_string(), s.batch,
           s.heads_q, s.seqlen_q, s.head_dim, kit_dtype_name(s.dtype));
    if (cuda) {
        char dev[256];
        if (fc_cuda_device_info(ctx, dev, sizeof(dev)) == FC_OK) printf("device:  %s\n", dev);
    } else {
        printf("device:  cpu, %d threads (%s)\n", o->threads ? (int)o->threads : cli_online_cpus(),
               o->backend == FC_BACKEND_AUTO ? "no usable CUDA device" : "asked for");
    }
    return s;
}

/* The case against the fp64 reference, printed; 0 if within the gates. */
static int check(fc_context *ctx, kit_case *c, fc_backend be)
{
    cli_check_result r;
    cli_check_case(ctx, c, be, &r);
    printf("backend: %s\nkernel:  %s (splits %d, workspace %lld B)\n", cli_backend_name(be),
           r.info.name[0] ? r.info.name : "-", r.info.num_splits, (long long)r.info.workspace_bytes);
    if (r.verdict == CLI_SKIP) {
        fprintf(stderr, "flashcore demo: %s: %s\n", fc_status_string(FC_ERR_UNSUPPORTED), r.note);
        return -1;
    }
    if (r.m.n == 0) { /* never compared: the run itself failed */
        fprintf(stderr, "flashcore demo: %s\n", r.note);
        return -1;
    }
    printf("check vs reference (fp64):\n"
           "  max_abs %.3e (gate %.1e)  rel_l2 %.3e (gate %.1e)  %%bad %.3f (gate %.1f)\n"
           "  unwritten %lld  non-finite %lld  lse max_abs %.3e, %lld out of tolerance\n",
           r.m.max_abs, r.g.max_abs, r.m.rel_l2, r.g.rel_l2, r.m.pct_bad, r.g.pct_bad,
           (long long)r.m.unwritten, (long long)r.m.nonfinite, r.m.lse_max_abs, (long long)r.m.lse_bad);
    if (r.verdict == CLI_PASS) return 0;
    printf("FAIL: %s\n", r.note);
    return -1;
}

/* The case timed on a fresh preparation, printed; 0 on success. */
static int timed(fc_context *ctx, kit_case *c, fc_backend be, const demo_opts *o)
{
    const int cuda = be == FC_BACKEND_CUDA;
    cli_exec e;
    char err[400];
    if (cli_exec_init(&e, c, be, err, sizeof(err))) {
        fprintf(stderr, "flashcore demo: %s\n", err);
        return -1;
    }
    const cli_time_opts t_opts = {
        .warmup_ms = o->warmup_ms >= 0 ? o->warmup_ms : (cuda ? 1000 : 100),
        .iters = o->iters > 0 ? (int)o->iters : (cuda ? 100 : 20),
        .max_ms = 10000,
        .graph = cuda,
        .flush_l2 = 0,
    };
    cli_timing t;
    const fc_status st = cli_time_exec(ctx, &e, &t_opts, &t, err, sizeof(err));
    cli_exec_free(&e);
    if (st != FC_OK) {
        fprintf(stderr, "flashcore demo: timing: %s\n", err);
        return -1;
    }
    const double flops = kit_flops_nominal(&c->s);
    printf("time:    median %.2f us, p90 %.2f us over %d calls (%s) -> %.4g TFLOP/s\n", t.p50_us, t.p90_us,
           t.iters, cuda ? "CUDA events" : "wall clock", flops / (t.p50_us * 1e-6) / 1e12);
    if (cuda) {
        if (isfinite(t.graph_us))
            printf("graph:   %.2f us per call (%d calls per CUDA graph) -> %.4g TFLOP/s\n", t.graph_us,
                   CLI_GRAPH_CALLS, flops / (t.graph_us * 1e-6) / 1e12);
        else
            printf("graph:   not measured: %s\n", t.graph_note);
    }
    return 0;
}

int cli_demo(int argc, char **argv)
{
    demo_opts o = {FC_BACKEND_AUTO, -1, 0, -1};
    int rc;
    if (parse_args(argc, argv, &o, &rc)) return rc;
    fc_context *ctx = cli_context("demo", (int)o.threads);
    if (!ctx) return CLI_EXIT_FAIL;
    const fc_backend be = cli_resolve_backend(o.backend);
    if (cli_require_backend("demo", ctx, be)) {
        fc_context_free(ctx);
        return CLI_EXIT_FAIL;
    }
    const kit_shape s = mission_shape(ctx, &o, be == FC_BACKEND_CUDA);
    kit_case c;
    if (kit_case_init(&c, &s, 1)) {
        fprintf(stderr, "flashcore demo: out of host memory building the case\n");
        fc_context_free(ctx);
        return CLI_EXIT_FAIL;
    }
    rc = CLI_EXIT_FAIL;
    if (!check(ctx, &c, be) && !timed(ctx, &c, be, &o)) {
        printf("PASS\n");
        rc = CLI_EXIT_OK;
    }
    kit_case_free(&c);
    cli_cuda_release_scratch();
    fc_context_free(ctx);
    return rc;
}
