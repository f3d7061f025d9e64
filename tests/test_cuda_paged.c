/*
 * test_cuda_paged.c -- the paged KV cache and seqused_k on the CUDA backend
 * against the fp64 CPU reference, through the public API, judged by the
 * kit's per-dtype gates: the library's own choice of kernel (path 0) and
 * each kernel family forced (fc_context_set_cuda_path 80 and 90).
 *
 * Per case (test_paged.h): the kit builds the paged problem on the host,
 * the reference runs once and is checked bit for bit against a dense twin
 * of the same keys; inputs, block table and seqused_k go to the device; out
 * and lse are poisoned on the device before every run. Each run must
 *   - pass kit_compare / kit_gate_pass (every logical element written),
 *   - leave every other element of out untouched (padding),
 *   - give exactly 0 and lse -inf on rows that see no key,
 *   - be bitwise identical on a second run.
 * Path 0 must run every case (f16/bf16, head dims 64 and 128); a forced
 * path that answers FC_ERR_UNSUPPORTED counts as a skip, with the reason.
 * Then the contents checks on the device (the synchronous copy: bad table
 * entries and counts refused, out untouched) and a capture into a CUDA
 * graph (no copy while capturing: the graph's result equals the eager one;
 * invalid contents are not read there, FC_OK, the graph is not launched).
 *
 * Usage: test_cuda_paged [--quick] [--cases N] [--seed S] [--path 80|90] [--verbose]
 *   --quick    the named edges in bf16 and 6 small random cases (for the
 *              sanitizers)
 *   --cases N  random cases (default 150) besides the named edges
 *   --path P   force only that kernel family besides path 0
 * Without a CUDA device: "SKIP: no CUDA device (...)" and exit code 77.
 * Output: a line per failure (every run with --verbose), the skip reasons,
 * then exactly "N passed, M failed" (", K skipped" when some were skipped).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_append.h"
#include "test_paged.h"
#include "test_util.h"

#if defined(FC_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "test_cuda_util.h"
#endif

#if !defined(FC_HAVE_CUDA)
TU_MAIN_WITHOUT_CUDA
#else

static int g_verbose;
static int g_seen[TP_SEEN_N];

typedef struct runner {
    fc_context *ctx;
    tcu_paths forced;        /* the families to force, each where available */
    cudaStream_t streams[2]; /* the legacy default stream, a created one      */
    int n;
} runner;

/* A case's host copies of two runs' out and lse. */
typedef struct run_bufs {
    void *out[2];
    float *lse[2];
} run_bufs;

static int bufs_alloc(run_bufs *b, const kit_case *c)
{
    memset(b, 0, sizeof *b);
    for (int i = 0; i < 2; i++) {
        b->out[i] = malloc(c->out_bytes);
        b->lse[i] = c->lse_bytes ? malloc(c->lse_bytes) : NULL;
        if (!b->out[i] || (c->lse_bytes && !b->lse[i])) return -1;
    }
    return 0;
}

static void bufs_free(run_bufs *b)
{
    for (int i = 0; i < 2; i++) {
        free(b->out[i]);
        free(b->lse[i]);
    }
}

static int same_bits(const kit_case *c, const run_bufs *b)
{
    return memcmp(b->out[0], b->out[1], c->out_bytes) == 0 && (!c->lse || !memcmp(b->lse[0], b->lse[1], c->lse_bytes));
}

/* A sticky CUDA error spoils every later case: stop with the summary. */
static void stop_if_sticky(fc_status st)
{
    if (st != FC_ERR_CUDA || cudaDeviceSynchronize() == cudaSuccess) return;
    printf("sticky CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
    tu_print_skips();
    exit(test_summary());
}

/* The case on path (0: the library's choice), twice. 1 pass, 0 fail, -1
 * skip (a forced path's UNSUPPORTED); line says what. */
static int run_path(runner *r, const tp_ref *ref, dev_case *d, int path, run_bufs *b, char *line, size_t n)
{
    char err[600], judge[400];
    fc_kernel_info info;
    memset(&info, 0, sizeof info);
    const cudaStream_t stream = r->streams[r->n++ % 2];
    fc_context_set_cuda_path(r->ctx, path);
    const fc_status st = dev_run(r->ctx, &ref->c, d, stream, b->out[0], b->lse[0], &info, err, sizeof err);
    const fc_status st2 =
        st == FC_OK ? dev_run(r->ctx, &ref->c, d, stream, b->out[1], b->lse[1], NULL, err, sizeof err) : st;
    fc_context_set_cuda_path(r->ctx, 0);
    if (st == FC_ERR_UNSUPPORTED && path != 0) {
        snprintf(line, n, "path %d: %.180s", path, fc_last_error(r->ctx));
        return -1;
    }
    if (st != FC_OK || st2 != FC_OK) {
        snprintf(line, n, "%s", err);
        stop_if_sticky(st != FC_OK ? st : st2);
        return 0;
    }
    const int ok = tp_judge(ref, b->out[0], b->lse[0], judge, sizeof judge), same = same_bits(&ref->c, b);
    snprintf(line, n, "[%s split%d] %s | rerun %s", info.name, info.num_splits, judge,
             same ? "identical" : "DIFFERENT");
    return ok && same && info.backend == FC_BACKEND_CUDA;
}

static void verdict(int ok, const char *tag, int path, const char *desc, const char *line)
{
    if (ok) g_pass++;
    else g_fail++;
    if (!ok || g_verbose) printf("%s %s path%d %s | %s\n", ok ? "PASS" : "FAIL", tag, path, desc, line);
    fflush(stdout);
}

/* Path 0, then each forced family that this device and build run. */
static void run_paths(runner *r, const char *tag, const tp_ref *ref, dev_case *d, run_bufs *b)
{
    char desc[300], line[1000];
    tp_describe(&ref->c, desc, sizeof desc);
    for (int i = -1; i < r->forced.n; i++) {
        if (i >= 0 && !r->forced.ok[i]) {
            tu_note_skip(r->forced.why[i]);
            continue;
        }
        const int path = i < 0 ? 0 : r->forced.path[i];
        const int v = run_path(r, ref, d, path, b, line, sizeof line);
        if (v < 0) tu_note_skip(line);
        else verdict(v, tag, path, desc, line);
    }
}

static void run_case(void *user, const char *tag, const kit_shape *s, uint64_t seed, void (*prep)(kit_case *))
{
    runner *r = user;
    char why[600];
    tp_ref ref;
    run_bufs b = {{NULL, NULL}, {NULL, NULL}};
    dev_case d;
    if (tp_ref_init(r->ctx, &ref, s, seed, prep, why, sizeof why) != 0 || bufs_alloc(&b, &ref.c) != 0) {
        verdict(0, tag, 0, "(set-up)", why);
    } else if (dev_upload(&ref.c, &d, why, sizeof why) != 0) {
        verdict(0, tag, 0, "(upload)", why);
    } else {
        tp_note(&ref.c, g_seen);
        run_paths(r, tag, &ref, &d, &b);
        dev_free(&d);
    }
    bufs_free(&b);
    tp_ref_free(&ref);
}

/* ---- the cases ---------------------------------------------------------------------- */

/* ---- the contents check on the device ------------------------------------------------ */

/* One bad entry or count, the argument the error must name. */
static void bad_entry0(kit_case *c) { c->block_table[0] = -1; }
static void bad_entry_past(kit_case *c) { c->block_table[c->table_stride + 1] = c->num_pages; }
static void bad_used_past(kit_case *c) { c->seqused_k[1] = c->max_pages * c->s.page_size + 1; }
static void bad_used_neg(kit_case *c) { c->seqused_k[0] = -1; }

static const struct {
    const char *name;
    void (*mutate)(kit_case *c);
    const char *names;
} k_bad[] = {
    {"block_table entry -1", bad_entry0, "block_table[0][0]"},
    {"block_table entry num_pages", bad_entry_past, "block_table[1][1]"},
    {"seqused_k past the capacity", bad_used_past, "seqused_k[1]"},
    {"seqused_k -1", bad_used_neg, "seqused_k[0]"},
};

/* A valid paged case whose every table entry is used (seqused_k = 40 of 48). */
static int contents_case(kit_case *c)
{
    kit_shape s = test_shape(2, 4, 2, 3, 40, 64, FC_DTYPE_F16);
    s.page_size = 16;
    s.seqused = KIT_SEQUSED_FULL;
    return kit_case_init(c, &s, 77);
}

/* 1 if out and lse on the device still hold c's poison. */
static int device_untouched(const kit_case *c, const dev_case *d)
{
    run_bufs b;
    int same = bufs_alloc(&b, c) == 0 &&
               cudaMemcpy(b.out[0], d->out, c->out_bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
               (!c->lse || cudaMemcpy(b.lse[0], d->lse, c->lse_bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    same = same && !memcmp(b.out[0], c->out, c->out_bytes) && (!c->lse || !memcmp(b.lse[0], c->lse, c->lse_bytes));
    bufs_free(&b);
    return same;
}

static void contents_checks(runner *r)
{
    const int p0 = g_pass, f0 = g_fail;
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        kit_case c;
        dev_case d;
        char err[300];
        if (contents_case(&c) != 0) {
            CHECK(0, "%s: kit_case_init", k_bad[i].name);
            continue;
        }
        k_bad[i].mutate(&c);
        if (dev_upload(&c, &d, err, sizeof err) != 0) {
            CHECK(0, "%s: %s", k_bad[i].name, err);
            kit_case_free(&c);
            continue;
        }
        const fc_status st = fc_attention_forward(r->ctx, &d.args, NULL, NULL);
        CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(r->ctx), k_bad[i].names),
              "%s on the device: %s (%s), want INVALID_ARGUMENT naming %s", k_bad[i].name, fc_status_string(st),
              fc_last_error(r->ctx), k_bad[i].names);
        CHECK(cudaDeviceSynchronize() == cudaSuccess && device_untouched(&c, &d), "%s: a failing call wrote out or lse",
              k_bad[i].name);
        dev_free(&d);
        kit_case_free(&c);
    }
    group_done("contents checked on the device", p0, f0);
}

/* ---- the append step -------------------------------------------------------------------- */

/* The case on path (0: the library's choice), twice (the second call
 * appends the same keys again: same bits); the cache it leaves. 1 pass,
 * 0 fail, -1 skip. */
static int append_path(runner *r, const ta_case *t, int path, run_bufs *b, void *k, void *v, char *line, size_t n)
{
    const kit_case *c = &t->r.c;
    char err[600], judge[500];
    dev_case d;
    fc_kernel_info info;
    memset(&info, 0, sizeof info);
    if (dev_upload(c, &d, err, sizeof err) != 0) {
        snprintf(line, n, "upload: %s", err);
        return 0;
    }
    fc_context_set_cuda_path(r->ctx, path);
    const cudaStream_t stream = r->streams[r->n++ % 2];
    fc_status st = dev_run(r->ctx, c, &d, stream, b->out[0], b->lse[0], &info, err, sizeof err);
    if (st == FC_OK) st = dev_run(r->ctx, c, &d, stream, b->out[1], b->lse[1], NULL, err, sizeof err);
    fc_context_set_cuda_path(r->ctx, 0);
    int v_ = -1;
    if (st == FC_ERR_UNSUPPORTED && path != 0) {
        snprintf(line, n, "path %d: %.180s", path, fc_last_error(r->ctx));
    } else if (st != FC_OK) {
        snprintf(line, n, "%s", err);
        v_ = 0;
    } else if (cudaMemcpy(k, d.k, c->k_bytes, cudaMemcpyDeviceToHost) != cudaSuccess ||
               cudaMemcpy(v, d.v, c->v_bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        snprintf(line, n, "cache download failed");
        v_ = 0;
    } else {
        const int good = ta_judge(t, b->out[0], b->lse[0], k, v, judge, sizeof judge), same = same_bits(c, b);
        snprintf(line, n, "[%s split%d] %s | rerun %s", info.name, info.num_splits, judge, same ? "identical" : "DIFFERENT");
        v_ = good && same && info.backend == FC_BACKEND_CUDA;
    }
    dev_free(&d);
    if (v_ == 0) stop_if_sticky(st);
    return v_;
}

static void append_spec(runner *r, const char *tag, const kit_shape *s, uint64_t seed)
{
    char why[1000], desc[400];
    ta_case t;
    run_bufs b = {{NULL, NULL}, {NULL, NULL}};
    void *k = NULL, *v = NULL;
    int ok = ta_init(r->ctx, &t, s, seed, why, sizeof why) == 0 &&
             bufs_alloc(&b, &t.r.c) == 0 && (k = malloc(t.r.c.k_bytes)) && (v = malloc(t.r.c.v_bytes));
    ta_describe(&t, desc, sizeof desc);
    for (int i = -1; ok && i < r->forced.n; i++) {
        if (i >= 0 && !r->forced.ok[i]) continue;
        const int path = i < 0 ? 0 : r->forced.path[i];
        const int res = append_path(r, &t, path, &b, k, v, why, sizeof why);
        if (res < 0) tu_note_skip(why);
        else verdict(res, tag, path, desc, why);
    }
    if (!ok) verdict(0, tag, 0, desc, why);
    free(k);
    free(v);
    bufs_free(&b);
    ta_free(&t);
}

static void append_cases(runner *r, int n, uint64_t seed, const fc_dtype *dtypes, int ndtypes)
{
    const int p0 = g_pass, f0 = g_fail;
    static const int pages[] = {0, 1, 3, 16, 64, 256};
    static const int dims[] = {64, 128};
    for (int d = 0; d < ndtypes; d++)
        for (int i = 0; i < TA_NUM_EDGES; i++) {
            const kit_shape s = ta_edge_spec(i, dtypes[d]);
            append_spec(r, ta_edges[i].name, &s, 900 + (uint64_t)i);
        }
    uint64_t rng = seed * 0x2545F4914F6CDD1Dull + 5;
    for (int i = 0; i < n; i++) {
        const kit_shape s = ta_random_spec(&rng, pages, 6, dims, 2, dtypes, ndtypes);
        char tag[32];
        snprintf(tag, sizeof tag, "append#%d", i);
        append_spec(r, tag, &s, seed * 1000 + (uint64_t)i);
    }
    group_done("append and rotary", p0, f0);
}

/* ---- capture ------------------------------------------------------------------------- */

/* The call captured on stream s (ThreadLocal, as the CLI captures) into
 * *exec, instantiated; the call's status. */
static fc_status capture_call(fc_context *ctx, const dev_case *d, cudaStream_t s, cudaGraphExec_t *exec)
{
    cudaGraph_t g = NULL;
    *exec = NULL;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return FC_ERR_CUDA;
    const fc_status st = fc_attention_forward(ctx, &d->args, (void *)s, NULL);
    const cudaError_t e = cudaStreamEndCapture(s, &g);
    if (st == FC_OK && e == cudaSuccess && cudaGraphInstantiate(exec, g, 0) != cudaSuccess) *exec = NULL;
    if (g) cudaGraphDestroy(g);
    return st != FC_OK ? st : e != cudaSuccess || !*exec ? FC_ERR_CUDA : FC_OK;
}

/* The eager result in b->out[0]; the graph's into b->out[1]: same bits. */
static void capture_valid(runner *r, const tp_ref *ref, dev_case *d, run_bufs *b)
{
    char err[600];
    cudaGraphExec_t exec = NULL;
    fc_status st = dev_run(r->ctx, &ref->c, d, r->streams[1], b->out[0], b->lse[0], NULL, err, sizeof err);
    kit_poison(b->out[1], ref->c.out_bytes, ref->c.s.dtype, b->lse[1], ref->c.lse_bytes);
    int ok = st == FC_OK && cudaMemcpy(d->out, b->out[1], ref->c.out_bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
             (!b->lse[1] || cudaMemcpy(d->lse, b->lse[1], ref->c.lse_bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    if (ok) st = capture_call(r->ctx, d, r->streams[1], &exec);
    ok = ok && st == FC_OK && cudaGraphLaunch(exec, r->streams[1]) == cudaSuccess &&
         cudaStreamSynchronize(r->streams[1]) == cudaSuccess &&
         cudaMemcpy(b->out[1], d->out, ref->c.out_bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
         (!b->lse[1] || cudaMemcpy(b->lse[1], d->lse, ref->c.lse_bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(ok && same_bits(&ref->c, b), "captured paged call: %s (%s), %s", fc_status_string(st), fc_last_error(r->ctx),
          ok ? "the graph's result differs from the eager call's" : "did not run");
    if (st == FC_OK && exec) cudaGraphExecDestroy(exec);
}

/* Invalid contents while capturing: not read (no copy), so FC_OK; the
 * graph would read page -1, so it is destroyed unlaunched. */
static void capture_unchecked(runner *r, kit_case *c)
{
    dev_case d;
    char err[300];
    cudaGraphExec_t exec;
    c->block_table[0] = -1;
    if (dev_upload(c, &d, err, sizeof err) != 0) {
        CHECK(0, "capture with a bad entry: %s", err);
        return;
    }
    const fc_status st = capture_call(r->ctx, &d, r->streams[1], &exec);
    CHECK(st == FC_OK, "capture with a bad entry: %s (%s); the contents check must not run while capturing",
          fc_status_string(st), fc_last_error(r->ctx));
    if (st == FC_OK) cudaGraphExecDestroy(exec);
    dev_free(&d);
}

static void capture_checks(runner *r)
{
    const int p0 = g_pass, f0 = g_fail;
    kit_shape s = test_shape(3, 8, 2, 1, 700, 128, FC_DTYPE_BF16);
    s.page_size = 64;
    s.seqused = KIT_SEQUSED_RANDOM;
    char why[600];
    tp_ref ref;
    run_bufs b = {{NULL, NULL}, {NULL, NULL}};
    dev_case d;
    if (tp_ref_init(r->ctx, &ref, &s, 91, NULL, why, sizeof why) != 0 || bufs_alloc(&b, &ref.c) != 0 ||
        dev_upload(&ref.c, &d, why, sizeof why) != 0) {
        CHECK(0, "capture set-up: %s", why);
    } else {
        capture_valid(r, &ref, &d, &b);
        dev_free(&d);
        capture_unchecked(r, &ref.c);
    }
    bufs_free(&b);
    tp_ref_free(&ref);
    group_done("capture", p0, f0);
}

int main(int argc, char **argv)
{
    tu_opts o = {.cases = 150, .seed = 1};
    if (tu_parse_opts(argc, argv, &o, "test_cuda_paged [--quick] [--cases N] [--seed S] [--path 80|90] [--verbose]"))
        return 2;
    g_verbose = o.verbose;
    runner r;
    memset(&r, 0, sizeof r);
    if (fc_context_create(&r.ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    /* gpu-check forces rows and hooks through a FLASHCORE_TUNING_CACHE file */
    if (kit_tuning_from_env(r.ctx) != FC_OK)
        return test_give_up("FAIL FLASHCORE_TUNING_CACHE or FLASHCORE_SM90_TRACE_FILE");
    if (!tu_cuda_device(r.ctx)) {
        fc_context_free(r.ctx);
        return 77;
    }
    tcu_probe_paths(r.ctx, o.path, &r.forced);
    if (cudaStreamCreateWithFlags(&r.streams[1], cudaStreamNonBlocking) != cudaSuccess)
        return test_give_up("FAIL cudaStreamCreate");
    const double t0 = kit_now();
    static const int pages[] = {1, 3, 16, 64, 256, 1024};
    static const int dims[] = {64, 128};
    static const fc_dtype dtypes[] = {FC_DTYPE_BF16, FC_DTYPE_F16};
    const tp_config cfg = {pages, 6, dims, 2, dtypes, 2, o.quick ? 2e6 : 4e7};
    tp_edge_cases(run_case, &r, dtypes, o.quick ? 1 : 2);
    tp_random_cases(run_case, &r, &cfg, o.quick ? 6 : o.cases, o.seed);
    append_cases(&r, o.quick ? 4 : 40, o.seed, dtypes, o.quick ? 1 : 2);
    contents_checks(&r);
    capture_checks(&r);
    if (!o.quick) {
        const int p0 = g_pass, f0 = g_fail;
        tp_check_seen(g_seen);
        group_done("kit cache features reached", p0, f0);
    }
    cudaStreamDestroy(r.streams[1]);
    fc_context_free(r.ctx);
    printf("(%.1f s)\n", kit_now() - t0);
    tu_print_skips();
    return test_summary();
}
#endif
