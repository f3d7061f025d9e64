/*
 * test_cli_commands.c -- the `flashcore` command itself, run as a process
 * (its path is argv[1], given by CMake): `check --bwd` and `bench --bwd` on
 * the CPU backends, the bench file they write read back, `compare` refusing
 * to pair a forward with a backward, the paged KV cache (check's paged rows,
 * --page-size on check and bench, --append on check), and usage errors. With a usable CUDA
 * device also `check --bwd --backend cuda --quick`, the paged rows and the
 * append step there.
 */
#define _POSIX_C_SOURCE 200809L /* popen, mkstemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kit_json.h"

#include "test_util.h"

static const char *g_cli;

/* Runs "CLI ARGS" (stderr to /dev/null); its stdout (owned by the caller)
 * and exit status. */
static char *run(const char *args, int *status)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "'%s' %s 2>/dev/null", g_cli, args);
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    *status = -1;
    if (!p || !out) {
        if (p) pclose(p);
        free(out);
        return NULL;
    }
    for (size_t got; (got = fread(out + n, 1, cap - n - 1, p)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *b = realloc(out, cap * 2);
            if (!b) break;
            out = b;
            cap *= 2;
        }
    }
    out[n] = '\0';
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

/* Runs args: its exit status must be want_status and its stdout hold text
 * (when not NULL). */
static void expect_run(const char *args, int want_status, const char *text)
{
    int status;
    char *out = run(args, &status);
    CHECK(out && status == want_status && (!text || strstr(out, text)), "'%s': exit %d (want %d)%s%s\n%s", args,
          status, want_status, text ? ", output without " : "", text ? text : "", out ? out : "(no output)");
    free(out);
}

/* "N passed, M failed" and "(K skipped" of a check run; 0 if found. */
static int check_counts(const char *out, int *passed, int *failed, int *skipped)
{
    const char *s = out ? strstr(out, "skipped, ") : NULL;
    const char *p = s ? strrchr(out, '(') : NULL;
    const char *q = s ? strchr(s, '\n') : NULL;
    if (!p || !q || sscanf(p, "(%d skipped", skipped) != 1) return -1;
    return sscanf(q + 1, "%d passed, %d failed", passed, failed) == 2 ? 0 : -1;
}

/* A check run that must pass: exit 0, no failure, at least min_pass passed. */
static void expect_check(const char *args, int min_pass)
{
    int status, passed = 0, failed = -1, skipped = -1;
    char *out = run(args, &status);
    int ok = check_counts(out, &passed, &failed, &skipped) == 0;
    CHECK(ok && status == 0 && failed == 0 && passed >= min_pass,
          "check %s: exit %d, %d passed, %d failed, %d skipped (want >= %d passed)\n%s", args, status, passed, failed,
          skipped, min_pass, out ? out : "(no output)");
    free(out);
}

static void test_check_bwd(void)
{
    /* the reference against itself: the plumbing (poison, every element
     * written, nothing past it) on edge cases */
    expect_check("check --bwd --backend reference --seeds 0 --filter seqlen-17", 2);
    expect_check("check --bwd --backend reference --seeds 0 --filter empty-rows", 2);
    expect_check("check --bwd --backend reference --seeds 0 --filter varlen-empty-seqs", 1);
    /* the CPU paths: the quick set, every supported case passing */
    expect_check("check --bwd --backend cpu --quick --seeds 3", 15);
    /* two backends: one row per case and backend */
    expect_run("check --bwd --backend cpu,reference --seeds 0 --filter gqa-4", 0, "2 passed, 0 failed");
    expect_run("check --bwd --backend cpu,reference --seeds 0 --filter gqa-4", 0, "reference/cpu_reference");
}

/* The fields of the first row of a bench JSON file that the kit does not
 * keep: the number row_key ("flops", "page_size") and meta's "pass". */
static void raw_fields(const char *path, const char *row_key, double *num, char *meta_pass, size_t n)
{
    *num = NAN;
    meta_pass[0] = '\0';
    FILE *f = fopen(path, "rb");
    char *buf = malloc(1 << 20);
    size_t len = f && buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    kit_json *j = NULL;
    char err[256];
    if (len && kit_json_parse(buf, len, &j, err, sizeof(err)) == 0) {
        const kit_json *rows = kit_json_get(j, "rows"), *meta = kit_json_get(j, "meta");
        const kit_json *fl = rows && rows->n ? kit_json_get(&rows->items[0], row_key) : NULL;
        const kit_json *mp = meta ? kit_json_get(meta, "pass") : NULL;
        if (fl && fl->type == KIT_JSON_NUMBER) *num = fl->number;
        if (mp && mp->type == KIT_JSON_STRING) snprintf(meta_pass, n, "%s", mp->string);
    }
    kit_json_free(j);
    free(buf);
    if (f) fclose(f);
}

static void test_bench_bwd(void)
{
    char fwd[] = "/tmp/test_cli_fwd_XXXXXX", bwd[] = "/tmp/test_cli_bwd_XXXXXX";
    int fd1 = mkstemp(fwd), fd2 = mkstemp(bwd);
    CHECK(fd1 >= 0 && fd2 >= 0, "cannot create temporary files");
    if (fd1 < 0 || fd2 < 0) return;
    close(fd1);
    close(fd2);
    const char *shape = "--custom 2,4,2,96,128,64,bf16 --iters 3 --warmup-ms 0 --backend cpu";
    char args[512];
    snprintf(args, sizeof(args), "bench --bwd %s --json %s", shape, bwd);
    expect_run(args, 0, "(backward)");
    snprintf(args, sizeof(args), "bench %s --json %s", shape, fwd);
    expect_run(args, 0, NULL);

    kit_bench_file f;
    char err[512];
    int rc = kit_bench_file_read(bwd, &f, err, sizeof(err));
    CHECK(rc == 0 && f.n == 1, "bwd bench file: %s", rc ? err : "not one row");
    if (rc == 0 && f.n == 1) {
        const kit_bench_row *r = &f.rows[0];
        CHECK(strcmp(r->pass, "bwd") == 0 && strcmp(r->system, "flashcore-cpu") == 0, "row pass '%s' system '%s'",
              r->pass, r->system);
        CHECK(isfinite(r->p50_us) && r->p50_us > 0 && isfinite(r->tflops) && r->tflops > 0, "row times");
        /* 2.5x the forward's 4*B*Hq*Sq*Sk*D; TFLOP/s from it over p50 */
        const double flops = 2.5 * 4.0 * 2 * 4 * 96 * 128 * 64;
        double got;
        char meta_pass[8];
        raw_fields(bwd, "flops", &got, meta_pass, sizeof(meta_pass));
        CHECK(got == flops && strcmp(meta_pass, "bwd") == 0, "flops %.17g (want %.17g), meta pass '%s'", got, flops,
              meta_pass);
        CHECK(fabs(r->tflops - flops / (r->p50_us * 1e-6) / 1e12) <= 1e-6 + 1e-3 * r->tflops, "tflops %g", r->tflops);
    }
    if (rc == 0) kit_bench_file_free(&f);

    /* compare: a backward pairs with a backward, never with a forward */
    snprintf(args, sizeof(args), "compare %s %s", bwd, bwd);
    expect_run(args, 0, "[backward]");
    snprintf(args, sizeof(args), "compare %s %s", fwd, bwd);
    expect_run(args, 1, NULL);
    remove(fwd);
    remove(bwd);
}

/* The paged KV cache through the CLI: check's named paged and seqused_k
 * rows, --page-size on check and on bench (its JSON row says so). */
static void test_paged(void)
{
    expect_check("check --backend cpu,reference --seeds 0 --filter paged", 10);
    expect_check("check --backend cpu --seeds 0 --filter seqused", 1);
    expect_check("check --backend cpu --quick --seeds 3 --page-size 16", 15);
    expect_run("check --backend cpu --quick --seeds 0 --page-size 3 --filter gqa-4", 0, "gqa-4+p3");
    /* the append step (k_new, v_new, rotary) into dense and paged caches */
    expect_check("check --backend cpu,reference --quick --seeds 3 --append 2", 30);
    expect_check("check --backend cpu --quick --seeds 2 --append 3 --page-size 16", 15);
    expect_run("check --backend cpu --quick --seeds 0 --append 1 --filter gqa-4", 0, "gqa-4+a1");
    expect_run("bench --custom 2,4,2,1,300,64,bf16 --append 1 --page-size 16 --backend cpu --iters 3 --warmup-ms 0", 0,
               "custom-2x4x2-q1-k300-d64-bf16/p16/a1");
    char path[] = "/tmp/test_cli_paged_XXXXXX", args[256], meta_pass[8];
    const int fd = mkstemp(path);
    CHECK(fd >= 0, "cannot create a temporary file");
    if (fd < 0) return;
    close(fd);
    snprintf(args, sizeof(args),
             "bench --custom 2,4,2,3,300,64,bf16 --page-size 16 --backend cpu --iters 3 --warmup-ms 0 --json %s", path);
    expect_run(args, 0, "custom-2x4x2-q3-k300-d64-bf16/p16");
    double page = NAN;
    raw_fields(path, "page_size", &page, meta_pass, sizeof(meta_pass));
    CHECK(page == 16 && strcmp(meta_pass, "fwd") == 0, "bench --page-size 16: row page_size %g, meta pass '%s'", page,
          meta_pass);
    remove(path);
}

static void test_usage(void)
{
    expect_run("bench --bwd --list", 0, "gqa-train");
    expect_run("bench --bwd --list", 0, "bwd GFLOP");
    const char *bad[] = {"check --bwd=1", "check --backend cpu,bogus", "check --backend cpu,", "bench --bwd=yes",
                         "check --bwd --filter no-such-case", "check --bwd --page-size 16",
                         "bench --bwd --page-size 16", "check --page-size 0", "bench --page-size x",
                         "check --bwd --append 1", "check --append 0", "bench --bwd --append 1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) expect_run(bad[i], 2, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("SKIP: give the flashcore command's path (ctest does)\n");
        return 77;
    }
    g_cli = argv[1];
    test_usage();
    test_check_bwd();
    test_bench_bwd();
    test_paged();
    if (fc_cuda_available()) {
        expect_check("check --bwd --backend cuda --quick", 0);
        /* the CLI's device copies of the block table and seqused_k (the
         * f32 row is a SKIP there) */
        expect_check("check --backend cuda --seeds 0 --filter paged", 4);
        /* the device copies of k_new, v_new and the rotary tables; pages of
         * 256 take the Hopper kernels on an sm_90 device */
        expect_check("check --backend cuda --quick --seeds 3 --append 2", 8);
        expect_check("check --backend cuda --quick --seeds 3 --append 1 --page-size 256", 8);
    }
    return test_summary();
}
