/*
 * cli_bench.c -- `flashcore bench`: the timing runner, forward or (--bwd)
 * backward. Benchmark shapes by name or custom shapes, random inputs,
 * warm-up, per-call times (p50, p90, mean, std), graph-timed calls on CUDA,
 * TFLOP/s by the docs/PERF.md convention, and a JSON record with the build
 * and machine it was taken on.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kit_json.h"

typedef struct bench_item {
    kit_shape s;
    char name[96];
} bench_item;

typedef struct bench_row {
    const bench_item *it;
    fc_backend backend;
    fc_kernel_info info;
    cli_timing t;
    double tflops;
    int status;             /* 0 timed, 1 skipped, 2 failed */
    char note[400];
} bench_row;

static void help(void)
{
    printf("usage: flashcore bench [--shape NAME[,NAME...]]... [--all] [--custom B,Hq,Hkv,Sq,Sk,D[,causal][,dtype]]...\n"
           "                       [--bwd] [--backend auto|cpu|cuda|reference] [--dtype T] [--warmup-ms MS] [--iters N]\n"
           "                       [--max-ms MS] [--no-graph] [--flush-l2] [--threads N] [--force]\n"
           "                       [--cuda-path 0|80|90] [--page-size N] [--append N] [--kv-dtype T]\n"
           "                       [--cpu-budget GFLOP] [--json FILE] [--list]\n\n"
           "Times the forward pass (the backward with --bwd) on random inputs (N(0,1), never\n"
           "zeros). Per shape: warm-up, then up to --iters timed calls (CUDA events on the\n"
           "GPU, the monotonic clock on the CPU; stops early after --max-ms, keeping at least\n"
           "3), reported as p50/p90/mean/std in microseconds. On CUDA also graph-timed: %d\n"
           "calls captured into a CUDA graph, replays timed, divided by %d (graph_us); a\n"
           "kernel that cannot be captured says why. host_us (CUDA) is the median CPU time spent inside the call; the JSON\n"
           "splits it into checks, selection and launch (fc_last_host_profile).\n"
           "TFLOP/s = 4*B*Hq*Sq*Sk*D (halved for causal with Sq == Sk) over graph_us when\n"
           "measured, else over p50; the backward counts 2.5x that (five matrix products\n"
           "against the forward's two).\n\n"
           "  --shape NAME     a benchmark shape (repeatable, or comma-separated); default --all\n"
           "  --all            every benchmark shape of the pass (--list: the sets)\n"
           "  --bwd            time the backward: each shape's forward runs once on the backend\n"
           "                   first (its out and lse are what the backward reads); not timed\n"
           "  --custom SPEC    B,Hq,Hkv,Sq,Sk,D with optional 'causal' and dtype (default f16)\n"
           "  --backend B      auto (default: cuda if usable, else cpu), cpu, cuda, reference\n"
           "  --cuda-path P    CUDA: run only the sm80-class path (80) or the Hopper path (90),\n"
           "                   where a shape that path cannot run fails; 0 (default): the\n"
           "                   selection function chooses (fc_context_set_cuda_path)\n"
           "  --dtype T        override the shapes' dtype (f32, f16, bf16)\n"
           "  --page-size N    the forward through a paged KV cache: k and v in pages of N keys\n"
           "                   (shuffled, with spare pages), seqused_k = Sk; shapes are named\n"
           "                   NAME/pN and the JSON rows carry page_size\n"
           "  --kv-dtype T     the forward with an FP8 K/V cache (e4m3 or e5m2) under the shape's q,\n"
           "                   descales per (batch, kv head); shapes are named NAME/kvT, the JSON\n"
           "                   rows carry kv_dtype\n"
           "  --append N       the forward with the append step: N keys per sequence written\n"
           "                   into the cache (seqused_k = Sk - N), q and k_new rotated over the\n"
           "                   head dim; shapes are named NAME/aN, the JSON rows carry append\n"
           "  --warmup-ms MS   warm-up per shape (default 1000 on CUDA, 100 on the CPU)\n"
           "  --iters N        timed calls per shape (default 200 on CUDA, 10 on the CPU)\n"
           "  --max-ms MS      time budget per shape for the timed calls (default 3000)\n"
           "  --no-graph       skip the CUDA graph timing\n"
           "  --flush-l2       CUDA: overwrite the L2 cache before each event-timed call\n"
           "  --threads N      CPU worker threads (default 0 = one per core)\n"
           "  --cpu-budget G   on the CPU backends skip shapes above G GFLOP per call (default 20)\n"
           "  --force          run every shape, whatever its cost\n"
           "  --json FILE      write the results (meta + rows) to FILE\n"
           "  --list           print the benchmark shapes (GFLOP of the pass, sets) and exit\n\n"
           "Exit status: 0 all selected shapes timed or skipped, 1 a run failed, 2 bad usage.\n",
           CLI_GRAPH_CALLS, CLI_GRAPH_CALLS);
}

/* The shapes to run, a growing array. */
typedef struct bench_items {
    bench_item *v;
    int n, cap;
} bench_items;

/* Appends shape s named name; -1 (said why) when out of memory. */
static int push_item(bench_items *x, const kit_shape *s, const char *name)
{
    if (x->n == x->cap) {
        int nc = x->cap ? x->cap * 2 : 16;
        bench_item *b = realloc(x->v, (size_t)nc * sizeof(*b));
        if (!b) {
            fprintf(stderr, "flashcore bench: out of memory\n");
            return -1;
        }
        x->v = b;
        x->cap = nc;
    }
    bench_item *it = &x->v[x->n++];
    it->s = *s;
    snprintf(it->name, sizeof(it->name), "%s", name);
    return 0;
}

/* Adds the benchmark shapes named in a comma-separated list. */
static int add_named(const char *list, bench_items *x)
{
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        char name[64];
        if (len == 0 || len >= sizeof(name)) {
            fprintf(stderr, "flashcore bench: --shape: empty or overlong name in '%s'\n", list);
            return -1;
        }
        memcpy(name, p, len);
        name[len] = '\0';
        p += len;
        if (*p == ',') p++;
        const cli_named_shape *ns = cli_find_bench_shape(name);
        if (!ns) {
            fprintf(stderr, "flashcore bench: --shape: no shape '%s'; known:", name);
            for (int i = 0; i < cli_num_bench_shapes; i++) fprintf(stderr, " %s", cli_bench_shapes[i].name);
            fprintf(stderr, "\n");
            return -1;
        }
        const kit_shape shape = cli_shape_from_named(ns);
        if (push_item(x, &shape, ns->name)) return -1;
    }
    return 0;
}

/* Count of elements of buf (a case's dtype) that hold the poison, and of
 * those that are not finite. */
static void count_bad(const void *buf, size_t bytes, fc_dtype dt, int64_t *unwritten, int64_t *nonfinite)
{
    const int64_t elems = (int64_t)(bytes / kit_dtype_size(dt));
    for (int64_t i = 0; i < elems; i++) {
        if (kit_is_poison(buf, dt, i)) (*unwritten)++;
        else if (!isfinite(kit_load(buf, dt, i))) (*nonfinite)++;
    }
}

/* Every output element of the pass (out; or dq, dk, dv) written and finite:
 * a kernel that returns without writing must not be timed as if it had
 * worked. The benchmark layouts have no padding: every element is logical. */
static int output_sane(const cli_exec *e, char *note, size_t n)
{
    const kit_case *c = e->c;
    const kit_bwd_case *b = e->b;
    const void *bufs[3] = {c->out};
    size_t bytes[3] = {c->out_bytes};
    int nb = 1;
    if (b) {
        nb = 3;
        bufs[0] = b->dq, bufs[1] = b->dk, bufs[2] = b->dv;
        bytes[0] = b->dq_bytes, bytes[1] = b->dk_bytes, bytes[2] = b->dv_bytes;
    }
    int64_t unwritten = 0, nonfinite = 0, elems = 0;
    for (int i = 0; i < nb; i++) {
        count_bad(bufs[i], bytes[i], c->s.dtype, &unwritten, &nonfinite);
        elems += (int64_t)(bytes[i] / kit_dtype_size(c->s.dtype));
    }
    if (!unwritten && !nonfinite) return 1;
    snprintf(note, n, "output check failed: %lld of %lld elements unwritten, %lld non-finite", (long long)unwritten,
             (long long)elems, (long long)nonfinite);
    return 0;
}

/* The item through a paged cache of page_size keys a page, every key in
 * use (seqused_k = Sk), named NAME/pN. */
static void page_item(bench_item *it, int page_size)
{
    char name[sizeof it->name];
    snprintf(name, sizeof name, "%s", it->name);
    snprintf(it->name, sizeof it->name, "%.80s/p%d", name, page_size);
    it->s.page_size = page_size;
    it->s.seqused = KIT_SEQUSED_FULL;
}

/* The item with an FP8 K/V cache of type kv under its q (descales per
 * (batch, kv head)), named NAME/kvT. */
static void kv8_item(bench_item *it, fc_dtype kv)
{
    char name[sizeof it->name];
    snprintf(name, sizeof name, "%s", it->name);
    snprintf(it->name, sizeof it->name, "%.80s/kv%s", name, kit_dtype_name(kv));
    it->s.fp8_kv = kv;
    it->s.descale = 2;
}

/* The item with the append step: n keys per sequence written into its
 * cache (which keeps Sk keys: seqused_k = Sk - n), rotary over the head
 * dim, named NAME/aN. */
static void append_item(bench_item *it, int n)
{
    char name[sizeof it->name];
    snprintf(name, sizeof name, "%s", it->name);
    snprintf(it->name, sizeof it->name, "%.80s/a%d", name, n);
    kit_shape_append(&it->s, n, 0);
}

static double pass_flops(const kit_shape *s, int bwd) { return bwd ? kit_flops_backward(s) : kit_flops_nominal(s); }

/* The row's case and exec for the pass; for the backward also the forward
 * on the backend (out, lse). On failure row says why, nothing is left
 * allocated and -1 is returned. b is a backward case or, for the forward,
 * only its forward case c is used. */
static int prepare(fc_context *ctx, const bench_item *it, fc_backend be, int bwd, kit_bwd_case *b, cli_exec *e,
                   bench_row *row)
{
    char err[400];
    memset(b, 0, sizeof(*b));
    if (bwd ? kit_bwd_case_init(b, &it->s, 42) : kit_case_init(&b->c, &it->s, 42)) {
        row->status = 2;
        snprintf(row->note, sizeof(row->note), "out of host memory building the inputs");
        return -1;
    }
    if (bwd ? cli_exec_init_bwd(e, b, be, err, sizeof(err)) : cli_exec_init(e, &b->c, be, err, sizeof(err))) {
        row->status = 2;
        snprintf(row->note, sizeof(row->note), "%s", err);
        kit_bwd_case_free(b);
        return -1;
    }
    fc_status st = bwd ? cli_exec_bwd_forward(ctx, e, err, sizeof(err)) : FC_OK;
    if (st != FC_OK) {
        row->status = st == FC_ERR_UNSUPPORTED ? 1 : 2;
        snprintf(row->note, sizeof(row->note), "forward: %s", err);
        cli_exec_free(e);
        kit_bwd_case_free(b);
        return -1;
    }
    return 0;
}

static void run_one(fc_context *ctx, const bench_item *it, fc_backend be, int bwd, const cli_time_opts *o,
                    double cpu_budget, int force, bench_row *row)
{
    char err[400];
    memset(row, 0, sizeof(*row));
    row->it = it;
    row->backend = be;
    row->t.graph_us = NAN;
    row->tflops = NAN;
    double flops = pass_flops(&it->s, bwd);
    if (be != FC_BACKEND_CUDA && flops > cpu_budget && !force) {
        row->status = 1;
        snprintf(row->note, sizeof(row->note), "%.3g %s on %s (budget %.3g GFLOP), pass --force",
                 flops >= 1e12 ? flops / 1e12 : flops / 1e9, flops >= 1e12 ? "TFLOP" : "GFLOP",
                 cli_backend_name(be), cpu_budget / 1e9);
        return;
    }
    kit_bwd_case b;
    cli_exec e;
    if (prepare(ctx, it, be, bwd, &b, &e, row)) return;
    fc_status st = cli_exec_supported(ctx, &e, &row->info);
    if (st == FC_ERR_UNSUPPORTED) {
        row->status = 1;
        snprintf(row->note, sizeof(row->note), "%s: %s", fc_status_string(st), fc_last_error(ctx));
        goto done;
    }
    /* one checked call before timing: outputs poisoned, then all written */
    if (cli_exec_poison(&e, err, sizeof(err))) {
        row->status = 2;
        snprintf(row->note, sizeof(row->note), "%s", err);
        goto done;
    }
    st = cli_exec_run(ctx, &e, &row->info, err, sizeof(err));
    if (st == FC_OK && cli_exec_fetch(&e, err, sizeof(err))) st = FC_ERR_CUDA;
    if (st != FC_OK) {
        row->status = 2;
        snprintf(row->note, sizeof(row->note), "%s", err);
        goto done;
    }
    if (!output_sane(&e, row->note, sizeof(row->note))) {
        row->status = 2;
        goto done;
    }
    st = cli_time_exec(ctx, &e, o, &row->t, err, sizeof(err));
    if (st != FC_OK) {
        row->status = 2;
        snprintf(row->note, sizeof(row->note), "%s", err);
        goto done;
    }
    double us = isfinite(row->t.graph_us) ? row->t.graph_us : row->t.p50_us;
    row->tflops = flops / (us * 1e-6) / 1e12;
done:
    cli_exec_free(&e);
    kit_bwd_case_free(&b);
}

static void print_row(const bench_row *r)
{
    const bench_item *it = r->it;
    char kern[140];
    snprintf(kern, sizeof(kern), "%s/%s", cli_backend_name(r->backend), r->info.name[0] ? r->info.name : "-");
    if (r->status != 0) {
        printf("%-18s %-36s %s  %s\n", it->name, kern, r->status == 1 ? "SKIP" : "FAIL", r->note);
        return;
    }
    char graph[32];
    if (isfinite(r->t.graph_us)) snprintf(graph, sizeof(graph), "%.2f", r->t.graph_us);
    else snprintf(graph, sizeof(graph), "-");
    /* small CPU figures need more digits than GPU ones */
    char host[32];
    if (isfinite(r->t.host.total_us)) snprintf(host, sizeof(host), "%.2f", r->t.host.total_us);
    else snprintf(host, sizeof(host), "-");
    printf("%-18s %-36s %10.2f %10.2f %10.2f %8.2f %10s %8s %9.*f %6d\n", it->name, kern, r->t.p50_us, r->t.p90_us,
           r->t.mean_us, r->t.std_us, graph, host, r->tflops < 10 ? 4 : 1, r->tflops, r->t.iters);
    if (r->backend == FC_BACKEND_CUDA && !isfinite(r->t.graph_us) && r->t.graph_note[0])
        printf("    graph: %s\n", r->t.graph_note);
}

/* The benchmark shapes, the pass's GFLOP and the default sets they are in. */
static void print_list(int bwd)
{
    printf("%-18s %4s %4s %4s %6s %6s %4s %-6s %-5s %10s  %s\n", "name", "B", "Hq", "Hkv", "Sq", "Sk", "D", "causal",
           "dtype", bwd ? "bwd GFLOP" : "GFLOP", "sets");
    for (int i = 0; i < cli_num_bench_shapes; i++) {
        const cli_named_shape *s = &cli_bench_shapes[i];
        kit_shape ks = cli_shape_from_named(s);
        const char *sets = s->sets == (CLI_SET_FWD | CLI_SET_BWD) ? "fwd bwd" : s->sets == CLI_SET_BWD ? "bwd" : "fwd";
        printf("%-18s %4d %4d %4d %6d %6d %4d %-6s %-5s %10.1f  %s\n", s->name, s->B, s->Hq, s->Hkv, s->Sq, s->Sk,
               s->D, s->causal ? "yes" : "no", kit_dtype_name(s->dtype), pass_flops(&ks, bwd) / 1e9, sets);
    }
}

/* Times to the nanosecond, rates to 1e-6 TFLOP/s: more digits are noise. */
static double round_to(double v, double unit) { return isfinite(v) ? round(v / unit) * unit : v; }

typedef struct bench_meta {
    char git_sha[64], device[300], driver[128], cpu[256], host[256], date[40];
    char gpu_before[64], gpu_after[64];
    int threads;
    int cuda_path; /* --cuda-path: 0 the selection function's choice, 80 or 90 forced */
    int bwd;       /* the pass timed: 0 forward, 1 backward */
} bench_meta;

/* The run's meta object: build, machine, timing method. */
static void json_meta(kit_jw *w, const bench_meta *m, fc_backend be, const cli_time_opts *o)
{
    kit_jw_key(w, "meta");
    kit_jw_object_begin(w);
    kit_jw_kv_string(w, "tool", "flashcore bench");
    kit_jw_kv_string(w, "git_sha", m->git_sha);
    kit_jw_kv_string(w, "build_info", fc_build_info());
    kit_jw_kv_string(w, "compiler", cli_compiler());
    kit_jw_kv_string(w, "library_version", fc_version_string());
    kit_jw_kv_string(w, "backend", cli_backend_name(be));
    kit_jw_kv_string(w, "pass", m->bwd ? "bwd" : "fwd");
    kit_jw_kv_int(w, "cuda_path", m->cuda_path);
    kit_jw_kv_string(w, "device_name", m->device);
    kit_jw_kv_string(w, "driver", m->driver);
    kit_jw_kv_string(w, "cpu_model", m->cpu);
    kit_jw_kv_int(w, "threads", m->threads);
    kit_jw_kv_string(w, "date", m->date);
    kit_jw_kv_string(w, "host", m->host);
    kit_jw_kv_string(w, "gpu_before", m->gpu_before);
    kit_jw_kv_string(w, "gpu_after", m->gpu_after);
    kit_jw_key(w, "timing");
    kit_jw_object_begin(w);
    kit_jw_kv_number(w, "warmup_ms", o->warmup_ms);
    kit_jw_kv_int(w, "iters", o->iters);
    kit_jw_kv_number(w, "max_ms", o->max_ms);
    kit_jw_kv_int(w, "graph_calls", o->graph ? CLI_GRAPH_CALLS : 0);
    kit_jw_kv_bool(w, "flush_l2", o->flush_l2);
    kit_jw_kv_string(w, "clock", be == FC_BACKEND_CUDA ? "cuda events" : "clock_gettime(CLOCK_MONOTONIC)");
    kit_jw_kv_string(w, "tflops_from", "graph_us when measured, else p50_us");
    kit_jw_kv_string(w, "flops", m->bwd ? "2.5 x 4*B*Hq*Sq*Sk*D, halved when causal with Sq == Sk"
                                         : "4*B*Hq*Sq*Sk*D, halved when causal with Sq == Sk");
    kit_jw_object_end(w);
    kit_jw_object_end(w);
}

/* A row per timed shape. */
static void json_rows(kit_jw *w, const bench_meta *m, const bench_row *rows, int n)
{
    kit_jw_key(w, "rows");
    kit_jw_array_begin(w);
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        if (r->status != 0) continue;
        const kit_shape *s = &r->it->s;
        char system[48];
        snprintf(system, sizeof(system), "flashcore-%s", cli_backend_name(r->backend));
        kit_jw_object_begin(w);
        kit_jw_kv_string(w, "shape", r->it->name);
        kit_jw_kv_string(w, "system", system);
        kit_jw_kv_string(w, "pass", m->bwd ? "bwd" : "fwd");
        kit_jw_kv_int(w, "B", s->batch);
        kit_jw_kv_int(w, "Hq", s->heads_q);
        kit_jw_kv_int(w, "Hkv", s->heads_kv);
        kit_jw_kv_int(w, "Sq", s->seqlen_q);
        kit_jw_kv_int(w, "Sk", s->seqlen_k);
        kit_jw_kv_int(w, "D", s->head_dim);
        kit_jw_kv_bool(w, "causal", s->causal);
        kit_jw_kv_string(w, "dtype", kit_dtype_name(s->dtype));
        kit_jw_kv_int(w, "page_size", s->page_size); /* 0: dense k/v */
        kit_jw_kv_int(w, "append", s->append);       /* keys appended per sequence */
        kit_jw_kv_string(w, "kv_dtype", kit_dtype_name(kit_kv_dtype(s)));
        kit_jw_kv_string(w, "backend", cli_backend_name(r->backend));
        kit_jw_kv_string(w, "kernel", r->info.name);
        kit_jw_kv_int(w, "num_splits", r->info.num_splits);
        if (m->bwd) { /* the kit's cases: the default mode; the scratch the library allocated */
            kit_jw_kv_bool(w, "deterministic", 0);
            kit_jw_kv_int(w, "workspace_bytes", r->info.workspace_bytes);
        }
        kit_jw_kv_number(w, "flops", pass_flops(s, m->bwd));
        kit_jw_kv_number(w, "p50_us", round_to(r->t.p50_us, 1e-3));
        kit_jw_kv_number(w, "p90_us", round_to(r->t.p90_us, 1e-3));
        kit_jw_kv_number(w, "mean_us", round_to(r->t.mean_us, 1e-3));
        kit_jw_kv_number(w, "std_us", round_to(r->t.std_us, 1e-3));
        kit_jw_kv_number(w, "min_us", round_to(r->t.min_us, 1e-3));
        kit_jw_kv_number(w, "graph_us", round_to(r->t.graph_us, 1e-3)); /* null when not measured */
        if (!isfinite(r->t.graph_us)) kit_jw_kv_string(w, "graph_note", r->t.graph_note);
        /* host time inside the call, medians (null on the CPU) */
        kit_jw_kv_number(w, "host_us", round_to(r->t.host.total_us, 1e-3));
        kit_jw_kv_number(w, "host_check_us", round_to(r->t.host.check_us, 1e-3));
        kit_jw_kv_number(w, "host_select_us", round_to(r->t.host.select_us, 1e-3));
        kit_jw_kv_number(w, "host_launch_us", round_to(r->t.host.launch_us, 1e-3));
        kit_jw_kv_number(w, "tflops", round_to(r->tflops, 1e-6));
        kit_jw_kv_int(w, "iters", r->t.iters);
        kit_jw_object_end(w);
    }
    kit_jw_array_end(w);
}

/* The shapes skipped or failed, and why. */
static void json_not_timed(kit_jw *w, const bench_row *rows, int n)
{
    kit_jw_key(w, "not_timed");
    kit_jw_array_begin(w);
    for (int i = 0; i < n; i++) {
        if (rows[i].status == 0) continue;
        kit_jw_object_begin(w);
        kit_jw_kv_string(w, "shape", rows[i].it->name);
        kit_jw_kv_string(w, "status", rows[i].status == 1 ? "skipped" : "failed");
        kit_jw_kv_string(w, "reason", rows[i].note);
        kit_jw_object_end(w);
    }
    kit_jw_array_end(w);
}

static int write_json(const char *path, const bench_meta *m, fc_backend be, const cli_time_opts *o,
                      const bench_row *rows, int n)
{
    kit_jw w;
    kit_jw_init(&w, 1);
    kit_jw_object_begin(&w);
    json_meta(&w, m, be, o);
    json_rows(&w, m, rows, n);
    json_not_timed(&w, rows, n);
    kit_jw_object_end(&w);

    const char *doc = kit_jw_result(&w);
    if (!doc) {
        fprintf(stderr, "flashcore bench: --json: out of memory building the document\n");
        kit_jw_free(&w);
        return -1;
    }
    FILE *f = fopen(path, "w");
    int ok = f && fputs(doc, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    kit_jw_free(&w);
    if (!ok) {
        fprintf(stderr, "flashcore bench: --json: cannot write '%s'\n", path);
        return -1;
    }
    return 0;
}

/* What the command line asks for. */
typedef struct bench_opts {
    fc_backend backend;
    long long iters, threads, cuda_path, page, append;
    fc_dtype kv8; /* --kv-dtype: an FP8 K/V cache (0: none) */
    double warmup_ms, max_ms, cpu_budget_g;
    int all, force, graph, flush_l2, have_dtype, list, bwd;
    fc_dtype dtype;
    const char *json;
} bench_opts;

/* A valueless switch: *hit 1 if arg is one (-1: it was given a value). */
static int parse_switch(cli_args *a, const char *arg, bench_opts *o, int *hit)
{
    const struct {
        const char *name;
        int *field, value;
    } sw[] = {{"--all", &o->all, 1},     {"--bwd", &o->bwd, 1},        {"--list", &o->list, 1},
              {"--force", &o->force, 1}, {"--no-graph", &o->graph, 0}, {"--flush-l2", &o->flush_l2, 1}};
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
        if (cli_is(a, arg, sw[i].name)) {
            *hit = 1;
            if (cli_no_value(a, arg)) return -1;
            *sw[i].field = sw[i].value;
            return 0;
        }
    return 0;
}

/* A numeric option, range-checked: *hit 1 if arg is one. */
static int parse_number(cli_args *a, const char *arg, bench_opts *o, int *hit)
{
    const struct {
        const char *name;
        double *field, lo, hi;
    } dbl[] = {{"--warmup-ms", &o->warmup_ms, 0, 600000},
               {"--max-ms", &o->max_ms, 1, 3600000},
               {"--cpu-budget", &o->cpu_budget_g, 0, 1e9}};
    /* (fc_context_set_cuda_path says which --cuda-path values are paths) */
    const struct {
        const char *name;
        long long *field, lo, hi;
    } ints[] = {{"--iters", &o->iters, 1, 10000000}, {"--threads", &o->threads, 0, 4096},
                {"--cuda-path", &o->cuda_path, 0, 90}, {"--page-size", &o->page, 1, 1 << 20},
                {"--append", &o->append, 1, 1 << 16}};
    *hit = 1;
    for (size_t i = 0; i < sizeof dbl / sizeof dbl[0]; i++)
        if (cli_is(a, arg, dbl[i].name)) return cli_double(a, arg, dbl[i].lo, dbl[i].hi, dbl[i].field);
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (cli_is(a, arg, ints[i].name)) return cli_int(a, arg, ints[i].lo, ints[i].hi, ints[i].field);
    *hit = 0;
    return 0;
}

/* An option with a string value: *hit 1 if arg is one; -1 on a bad one
 * (*rc: the exit status). */
static int parse_valued(cli_args *a, const char *arg, bench_opts *o, bench_items *x, int *hit, int *rc)
{
    const char *v;
    *hit = 1;
    if (cli_is(a, arg, "--shape")) return (v = cli_value(a, arg)) && !add_named(v, x) ? 0 : -1;
    if (cli_is(a, arg, "--backend")) return (v = cli_value(a, arg)) && !cli_parse_backend("bench", v, &o->backend) ? 0 : -1;
    if (cli_is(a, arg, "--json")) return (o->json = cli_value(a, arg)) ? 0 : -1;
    if (cli_is(a, arg, "--custom")) {
        kit_shape s;
        char name[96];
        if (!(v = cli_value(a, arg)) || cli_parse_custom("bench", v, &s, name, sizeof(name))) return -1;
        if (!push_item(x, &s, name)) return 0;
        *rc = CLI_EXIT_FAIL;
        return -1;
    }
    if (cli_is(a, arg, "--dtype")) {
        if (!(v = cli_value(a, arg))) return -1;
        if (kit_dtype_parse(v, &o->dtype)) {
            fprintf(stderr, "flashcore bench: --dtype: expected f32, f16 or bf16, got '%s'\n", v);
            return -1;
        }
        o->have_dtype = 1;
        return 0;
    }
    if (cli_is(a, arg, "--kv-dtype")) {
        if (!(v = cli_value(a, arg))) return -1;
        if (strcmp(v, "e4m3") && strcmp(v, "e5m2")) {
            fprintf(stderr, "flashcore bench: --kv-dtype: expected e4m3 or e5m2, got '%s'\n", v);
            return -1;
        }
        o->kv8 = strcmp(v, "e4m3") ? FC_DTYPE_E5M2 : FC_DTYPE_E4M3;
        return 0;
    }
    *hit = 0;
    return 0;
}

/* The command line into o and x. 0, or -1 with *rc the exit status
 * (--help: CLI_EXIT_OK). */
static int parse_args(int argc, char **argv, bench_opts *o, bench_items *x, int *rc)
{
    cli_args a;
    cli_args_init(&a, "bench", argc, argv);
    *rc = CLI_EXIT_USAGE;
    for (const char *arg; (arg = cli_next(&a));) {
        int hit = 0;
        if (cli_is(&a, arg, "--help") || cli_is(&a, arg, "-h")) {
            help();
            *rc = CLI_EXIT_OK;
            return -1;
        }
        if (parse_switch(&a, arg, o, &hit) || (!hit && parse_number(&a, arg, o, &hit)) ||
            (!hit && parse_valued(&a, arg, o, x, &hit, rc)))
            return -1;
        if (!hit) {
            *rc = cli_unknown(&a, arg);
            return -1;
        }
    }
    return 0;
}

/* The shapes the options select, with their dtype, paged cache, FP8 K/V
 * cache or append step; -1 (said why) on options that do not go together. */
static int finish_items(const bench_opts *o, bench_items *x)
{
    if (o->all || x->n == 0)
        for (int i = 0; i < cli_num_bench_shapes; i++)
            if ((cli_bench_shapes[i].sets & (o->bwd ? CLI_SET_BWD : CLI_SET_FWD)) &&
                add_named(cli_bench_shapes[i].name, x))
                return -1;
    if (o->have_dtype)
        for (int i = 0; i < x->n; i++) x->v[i].s.dtype = o->dtype;
    if ((o->page || o->append || o->kv8) && o->bwd) {
        fprintf(stderr, "flashcore bench: --%s: the backward takes no %s (forward only)\n",
                o->page ? "page-size" : o->append ? "append" : "kv-dtype",
                o->page ? "paged cache" : o->append ? "append step" : "FP8 k/v");
        return -1;
    }
    if (o->kv8 && o->append) {
        fprintf(stderr, "flashcore bench: --kv-dtype with --append: the append writes no FP8 cache\n");
        return -1;
    }
    for (int i = 0; o->kv8 && i < x->n; i++) kv8_item(&x->v[i], o->kv8);
    for (int i = 0; o->page && i < x->n; i++) page_item(&x->v[i], (int)o->page);
    for (int i = 0; o->append && i < x->n; i++) append_item(&x->v[i], (int)o->append);
    return 0;
}

/* A context for the options' threads, backend (*be) and CUDA path; NULL
 * (said why) on failure. */
static fc_context *open_context(const bench_opts *o, fc_backend *be)
{
    fc_context *ctx = cli_context("bench", (int)o->threads);
    if (!ctx) return NULL;
    *be = cli_resolve_backend(o->backend);
    if (cli_require_backend("bench", ctx, *be)) {
        fc_context_free(ctx);
        return NULL;
    }
    if (fc_context_set_cuda_path(ctx, (int)o->cuda_path) != FC_OK) {
        fprintf(stderr, "flashcore bench: --cuda-path %lld: %s\n", o->cuda_path, fc_last_error(ctx));
        fc_context_free(ctx);
        return NULL;
    }
    return ctx;
}

/* The build, machine and device the run is taken on. */
static void fill_meta(fc_context *ctx, const bench_opts *o, int cuda, bench_meta *m)
{
    memset(m, 0, sizeof(*m));
    cli_git_sha(m->git_sha, sizeof(m->git_sha));
    cli_cpu_model(m->cpu, sizeof(m->cpu));
    cli_hostname(m->host, sizeof(m->host));
    cli_utc_now_iso8601(m->date, sizeof(m->date));
    m->threads = o->threads ? (int)o->threads : cli_online_cpus();
    m->cuda_path = (int)o->cuda_path;
    m->bwd = o->bwd;
    if (cuda) {
        if (fc_cuda_device_info(ctx, m->device, sizeof(m->device)) != FC_OK)
            snprintf(m->device, sizeof(m->device), "%s", fc_last_error(ctx));
        char name[256];
        cli_cuda_describe(name, sizeof(name), m->driver, sizeof(m->driver));
        cli_gpu_clock_temp(m->gpu_before, sizeof(m->gpu_before));
    } else {
        snprintf(m->device, sizeof(m->device), "cpu: %s", m->cpu);
        snprintf(m->driver, sizeof(m->driver), "none");
    }
}

/* Every shape, a row each, printed as it finishes; the failures. */
static int run_all(fc_context *ctx, const bench_items *x, fc_backend be, const bench_opts *o, const cli_time_opts *t,
                   bench_row *rows)
{
    int failed = 0;
    for (int i = 0; i < x->n; i++) {
        cli_progress(i + 1, x->n, x->v[i].name);
        /* one profiler range per shape, named for it (nsys/ncu timelines) */
        CLI_RANGE_PUSH(x->v[i].name);
        run_one(ctx, &x->v[i], be, o->bwd, t, o->cpu_budget_g * 1e9, o->force, &rows[i]);
        CLI_RANGE_POP();
        cli_progress_done();
        print_row(&rows[i]);
        fflush(stdout);
        if (rows[i].status == 2) failed++;
    }
    return failed;
}

/* Times the shapes on the context's backend be; the exit status. */
static int bench_run(fc_context *ctx, fc_backend be, const bench_opts *o, const bench_items *x)
{
    const int cuda = be == FC_BACKEND_CUDA;
    const cli_time_opts t = {
        .warmup_ms = o->warmup_ms >= 0 ? o->warmup_ms : (cuda ? 1000 : 100),
        .iters = o->iters > 0 ? (int)o->iters : (cuda ? 200 : 10),
        .max_ms = o->max_ms,
        .graph = cuda && o->graph,
        .flush_l2 = cuda && o->flush_l2,
    };
    bench_meta m;
    fill_meta(ctx, o, cuda, &m);
    printf("flashcore %s bench%s: %s, %s, git %s\n", fc_version_string(), o->bwd ? " (backward)" : "",
           cli_backend_name(be), m.device, m.git_sha);
    if (m.gpu_before[0]) printf("gpu before: %s\n", m.gpu_before);
    printf("%-18s %-36s %10s %10s %10s %8s %10s %8s %9s %6s\n", "shape", "backend/kernel", "p50_us", "p90_us", "mean_us",
           "std_us", "graph_us", "host_us", "TFLOP/s", "iters");
    bench_row *rows = calloc((size_t)x->n, sizeof(*rows));
    if (!rows) {
        fprintf(stderr, "flashcore bench: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    const int failed = run_all(ctx, x, be, o, &t, rows);
    if (cuda) {
        cli_gpu_clock_temp(m.gpu_after, sizeof(m.gpu_after));
        if (m.gpu_after[0]) printf("gpu after: %s\n", m.gpu_after);
    }
    cli_cuda_release_scratch();
    int rc = failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
    if (o->json) {
        if (write_json(o->json, &m, be, &t, rows, x->n)) rc = CLI_EXIT_FAIL;
        else printf("wrote %s\n", o->json);
    }
    free(rows);
    return rc;
}

int cli_bench(int argc, char **argv)
{
    bench_opts o = {.backend = FC_BACKEND_AUTO, .iters = -1, .warmup_ms = -1, .max_ms = 3000, .cpu_budget_g = 20,
                    .graph = 1, .dtype = FC_DTYPE_F16};
    bench_items x = {NULL, 0, 0};
    int rc = CLI_EXIT_USAGE;
    if (parse_args(argc, argv, &o, &x, &rc)) goto out;
    if (o.list) {
        print_list(o.bwd);
        rc = CLI_EXIT_OK;
        goto out;
    }
    rc = CLI_EXIT_USAGE;
    if (finish_items(&o, &x)) goto out;
    rc = CLI_EXIT_FAIL;
    fc_backend be;
    fc_context *ctx = open_context(&o, &be);
    if (!ctx) goto out;
    rc = bench_run(ctx, be, &o, &x);
    fc_context_free(ctx);
out:
    free(x.v);
    return rc;
}
