/*
 * cli_tune.c -- `flashcore tune`: measure, for each shape of a list, every
 * kernel choice the planners could legally make (cli_tune_search.c), record
 * the winners that beat the planner by more than the noise into a tuning
 * cache file (docs/TUNING.md), then time the planner against that file in
 * fresh interleaved rounds (the verify pass, free of the search's winner's
 * bias). `--verify FILE` runs the verify pass alone.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_tune.h"

typedef struct tune_item {
    char name[96];
    kit_shape s;
} tune_item;

typedef struct tune_opts {
    int rounds;        /* interleaved rounds per stage                  */
    double min_gain;   /* smallest relative gain worth an entry          */
    double warm_ms;    /* clock warm-up per shape                        */
} tune_opts;

typedef struct tune_result {
    int status;        /* 0 ok, 1 skipped, 2 failed                      */
    char note[400];
    char planner[96], winner[96];
    int candidates;    /* timed over both stages                         */
    kit_tune_verdict v; /* the confirmation's verdict when there was one   */
    double search_gain; /* the winner's gain in the search                 */
    char choice[160];  /* the recorded entry's fields                     */
    double seconds;    /* wall time of the shape's search                */
    char tuned[96];    /* verify: the kernel the cache gives             */
    int entry;         /* verify: fc_kernel_info.tuned                   */
    int dropped;       /* verify: this run's entry lost, and was removed */
    double speedup, noise; /* verify: planner / cache, and the planner's own spread */
} tune_result;

static void help(void)
{
    printf("usage: flashcore tune [--shape NAME[,NAME...]]... [--custom SPEC]... [--shapes-file FILE]\n"
           "                      --output FILE [--merge] [--no-verify] [--rounds N] [--min-gain X]\n"
           "                      [--json FILE]\n"
           "       flashcore tune --verify FILE [shapes as above] [--rounds N] [--json FILE]\n\n"
           "Times every kernel choice the planners could legally make for each shape on this\n"
           "GPU (rows of the tile tables, split-KV counts, the rotated loop, tail balancing,\n"
           "mask code, PDL), graph-timed in interleaved rounds after a clock\n"
           "warm-up; each candidate's output is checked against the planner's first. A\n"
           "choice that beats the planner by more than max(--min-gain, 2 x the measured\n"
           "noise) is written to the tuning cache FILE (docs/TUNING.md); ties keep the\n"
           "planner. Then the planner and the cache are timed against each other in fresh\n"
           "rounds (the verify pass), which drops this run's entries that lose there.\n"
           "Load the file with FLASHCORE_TUNING_CACHE=FILE,\n"
           "fc_context_load_tuning or flashcore.load_tuning.\n\n"
           "  --shape NAMES      benchmark shapes (flashcore bench --list)\n"
           "  --custom SPEC      B,Hq,Hkv,Sq,Sk,D[,causal][,wl=N][,wr=N][,softcap=X][,dtype]\n"
           "  --shapes-file F    one shape per line (a name or a SPEC), '#' comments\n"
           "  --output FILE      the cache to write (an existing FILE is replaced unless --merge,\n"
           "                     which keeps its entries and adds or replaces this run's)\n"
           "  --rounds N         interleaved rounds per stage (default 15)\n"
           "  --min-gain X       smallest gain worth an entry (default 0.01 = 1%%)\n"
           "  --json FILE        the results, per shape\n");
}

/* ---- shapes ---------------------------------------------------------------------- */

static int add_item(tune_item **items, int *n, int *cap, const kit_shape *s, const char *name)
{
    if (*n == *cap) {
        const int nc = *cap ? *cap * 2 : 16;
        tune_item *p = realloc(*items, (size_t)nc * sizeof *p);
        if (!p) return -1;
        *items = p;
        *cap = nc;
    }
    tune_item *it = &(*items)[(*n)++];
    it->s = *s;
    snprintf(it->name, sizeof it->name, "%s", name);
    it->s.name = NULL;
    return 0;
}

/* One shape: a benchmark name, or a custom SPEC (has a comma). */
static int add_shape(const char *text, tune_item **items, int *n, int *cap)
{
    kit_shape s;
    char name[96];
    if (strchr(text, ',')) {
        if (cli_parse_custom("tune", text, &s, name, sizeof name)) return -1;
    } else {
        const cli_named_shape *ns = cli_find_bench_shape(text);
        if (!ns) {
            fprintf(stderr, "flashcore tune: no benchmark shape '%s' (flashcore bench --list)\n", text);
            return -1;
        }
        s = cli_shape_from_named(ns);
        snprintf(name, sizeof name, "%s", ns->name);
    }
    if (add_item(items, n, cap, &s, name)) {
        fprintf(stderr, "flashcore tune: out of memory\n");
        return -1;
    }
    return 0;
}

static int add_names(const char *list, tune_item **items, int *n, int *cap)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (add_shape(tok, items, n, cap)) return -1;
    return 0;
}

static int add_file(const char *path, tune_item **items, int *n, int *cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "flashcore tune: cannot read --shapes-file %s\n", path);
        return -1;
    }
    char line[512];
    int rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        line[strcspn(line, "#\r\n")] = 0;
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        for (char *e = p + strlen(p); e > p && (e[-1] == ' ' || e[-1] == '\t'); e--) e[-1] = 0;
        if (*p) rc = add_shape(p, items, n, cap);
    }
    fclose(f);
    return rc;
}

/* ---- one shape ----------------------------------------------------------------------- */

static int arch_class(int cc) { return cc == 90 ? 90 : (cc == 80 || cc == 87) ? 80 : 86; }

/* The device buffers of a shape, the planner's output as a host copy (ref)
 * and the calls per graph: about 2 ms of the planner's kernels. */
static int setup(tune_state *ts, const tune_item *it, kit_case *c, cli_exec *e, void **ref, const tune_opts *o,
                 char *err, size_t n)
{
    memset(e, 0, sizeof *e);
    if (kit_case_init(c, &it->s, 42)) {
        snprintf(err, n, "out of host memory for the inputs");
        return -1;
    }
    if (cli_exec_init(e, c, FC_BACKEND_CUDA, err, n)) return -1;
    ts->e = e;
    ts->shape = it->name;
    fc_tuning t;
    fc_tuning_init(&t);
    fc_context_set_cuda_path(ts->ctx, 0);
    fc_context_set_tuning(ts->ctx, &t);
    if (cli_exec_poison(e, err, n) || cli_exec_run(ts->ctx, e, NULL, err, n) != FC_OK || cli_exec_fetch(e, err, n))
        return -1;
    if (!(*ref = malloc(c->out_bytes))) {
        snprintf(err, n, "out of host memory");
        return -1;
    }
    memcpy(*ref, c->out, c->out_bytes);
    const double t0 = kit_now();
    int calls = 0;
    while ((kit_now() - t0) * 1e3 < o->warm_ms || calls < 3) {
        if (cli_exec_call(ts->ctx, e, NULL) != FC_OK || cli_cuda_stream_sync(e->stream, err, n)) {
            snprintf(err + strlen(err), n - strlen(err), " %s", fc_last_error(ts->ctx));
            return -1;
        }
        calls++;
    }
    const double per_call_ms = (kit_now() - t0) * 1e3 / calls; /* an overestimate: host gaps */
    ts->calls = (int)(2.0 / per_call_ms);
    if (ts->calls < 2) ts->calls = 2;
    if (ts->calls > 200) ts->calls = 200;
    return 0;
}

/* What setup made for a shape, and its graphs. */
static void teardown(tune_state *ts, cli_exec *e, kit_case *c, void *ref)
{
    tune_release(ts);
    cli_exec_free(e);
    kit_case_free(c);
    free(ref);
}

/* The winner against the planner once more, fresh graphs and twice the
 * rounds: the search picked the best of many noisy medians, which flatters
 * it. r->v becomes this verdict; not recorded unless it holds. */
static int confirm(tune_state *ts, const void *ref, const tune_cand *w, const tune_opts *o, tune_result *r)
{
    const tune_cand planner = ts->c[0];
    tune_release(ts);
    ts->c[0] = ts->c[1] = planner;
    ts->c[2] = *w;
    for (int i = 0; i < 3; i++) ts->c[i].graph = NULL; /* released above */
    ts->n = 3;
    double med[3];
    if (tune_measure(ts, ref, 2 * o->rounds, med, r->note, sizeof r->note)) return -1;
    if (ts->n != 3) {
        r->v.recorded = 0;
        return 0;
    }
    const double found = r->v.best_gain;
    kit_tune_decide(med, 3, o->min_gain, &r->v);
    r->search_gain = found;
    return 0;
}

/* "path=90 sm90_config=6 splits=8": the fields a candidate sets. */
static void describe(const tune_cand *c, char *buf, size_t n)
{
    fc_tuning d;
    fc_tuning_init(&d);
    const struct { const char *name; int32_t v, def; } f[] = {
        {"path", c->path, 0},
        {"sm90_config", c->t.sm90_config, d.sm90_config}, {"sm80_config", c->t.sm80_config, d.sm80_config},
        {"sm90_rotate", c->t.sm90_rotate, d.sm90_rotate}, {"sm90_tail", c->t.sm90_tail, d.sm90_tail},
        {"splits", c->t.splits, d.splits}, {"pdl", c->t.pdl, d.pdl}, {"masks", c->t.masks, d.masks},
    };
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v != f[i].def && at < n) {
            const int k = snprintf(buf + at, n - at, "%s%s=%d", at ? " " : "", f[i].name, (int)f[i].v);
            at += k > 0 ? (size_t)k : 0;
        }
}

static void tune_one(tune_state *ts, fc_context *out, const tune_item *it, const tune_opts *o, tune_result *r)
{
    const double t0 = kit_now();
    kit_case c;
    cli_exec e;
    void *ref = NULL;
    double med[TUNE_MAX_CANDS];
    memset(&c, 0, sizeof c);
    if (setup(ts, it, &c, &e, &ref, o, r->note, sizeof r->note)) goto fail;
    tune_stage1(ts);
    snprintf(r->planner, sizeof r->planner, "%s", ts->c[0].name);
    if (tune_measure(ts, ref, o->rounds, med, r->note, sizeof r->note)) goto fail;
    r->candidates = ts->n;
    tune_release(ts);
    tune_stage2(ts, med);
    if (tune_measure(ts, ref, o->rounds, med, r->note, sizeof r->note)) goto fail;
    r->candidates += ts->n - 2;
    kit_tune_decide(med, ts->n, o->min_gain, &r->v);
    tune_cand w = ts->c[r->v.winner];
    snprintf(r->winner, sizeof r->winner, "%s", w.name);
    if (r->v.recorded && confirm(ts, ref, &w, o, r)) goto fail;
    if (r->v.recorded) {
        char comment[200];
        snprintf(comment, sizeof comment, "%.3fx over %.100s (noise %.1f%%)", r->v.gain, r->planner,
                 100 * r->v.noise);
        describe(&w, r->choice, sizeof r->choice);
        if (fc_context_record_tuning(out, &e.args, NULL, w.path, &w.t, comment) != FC_OK) {
            snprintf(r->note, sizeof r->note, "record: %s", fc_last_error(out));
            goto fail;
        }
    }
    goto done;
fail:
    r->status = 2;
done:
    teardown(ts, &e, &c, ref);
    r->seconds = kit_now() - t0;
}

/* The verify pass of one shape: the planner (twice: its spread is the
 * noise) against the cache, fresh graphs, interleaved rounds. An entry
 * this run recorded into out (NULL: none) that runs slower than the
 * planner here is removed from out again. */
static void verify_one(tune_state *ts, fc_context *planner, fc_context *cached, fc_context *out,
                       const tune_item *it, const tune_opts *o, tune_result *r)
{
    kit_case c;
    cli_exec e;
    void *ref = NULL;
    double med[3];
    memset(&c, 0, sizeof c);
    if (setup(ts, it, &c, &e, &ref, o, r->note, sizeof r->note)) goto fail;
    fc_context *ctxs[3] = {planner, planner, cached};
    ts->n = 3;
    for (int i = 0; i < 3; i++) {
        memset(&ts->c[i], 0, sizeof ts->c[i]);
        ts->c[i].own = ctxs[i];
        fc_kernel_info info;
        if (cli_exec_supported(ctxs[i], &e, &info) != FC_OK) {
            snprintf(r->note, sizeof r->note, "%s", fc_last_error(ctxs[i]));
            goto fail;
        }
        memcpy(ts->c[i].name, info.name, sizeof info.name);
        if (i == 2) r->entry = info.tuned;
    }
    snprintf(r->tuned, sizeof r->tuned, "%s", ts->c[2].name);
    if (!r->planner[0]) snprintf(r->planner, sizeof r->planner, "%s", ts->c[0].name);
    if (tune_measure(ts, ref, 2 * o->rounds, med, r->note, sizeof r->note) || ts->n != 3) goto fail;
    const double p = 0.5 * (med[0] + med[1]);
    r->speedup = p / med[2];
    r->noise = fabs(med[0] - med[1]) / p;
    if (out && r->v.recorded && r->entry && r->speedup < 1.0) {
        if (fc_context_record_tuning(out, &e.args, NULL, 0, NULL, NULL) != FC_OK) {
            snprintf(r->note, sizeof r->note, "removing the entry: %s", fc_last_error(out));
            goto fail;
        }
        r->dropped = 1;
    }
    goto done;
fail:
    r->status = 2;
done:
    teardown(ts, &e, &c, ref);
}

/* ---- output -------------------------------------------------------------------------- */

static void print_table(const tune_item *items, const tune_result *res, int n, int searched, int verified)
{
    printf("\n| shape | planner | candidates | entry | search gain | noise | recorded | verify: kernel | "
           "verify: speedup |\n|---|---|---|---|---|---|---|---|---|\n");
    double logsum = 0;
    int nv = 0;
    for (int i = 0; i < n; i++) {
        const tune_result *r = &res[i];
        if (r->status) {
            printf("| %s | %s | failed: %s |||||||\n", items[i].name, r->planner, r->note);
            continue;
        }
        printf("| %s | %s |", items[i].name, r->planner);
        if (searched)
            printf(" %d | %s | %.3fx | %.1f%% | %s |", r->candidates,
                   r->v.recorded ? r->choice : (r->v.best ? "(within noise)" : "(none faster)"),
                   r->search_gain > 0 ? r->search_gain : r->v.best_gain, 100 * r->v.noise,
                   r->v.recorded ? "yes" : (r->search_gain > 0 ? "not confirmed" : "no"));
        else
            printf(" | | | | |");
        if (verified) {
            printf(" %s%s | %.3fx (noise %.1f%%)%s |\n", r->tuned, r->dropped ? " (dropped)" : r->entry ? "" : " (planner)",
                   r->speedup, 100 * r->noise, r->dropped ? ", the planner's from now on" : "");
            logsum += r->dropped ? 0.0 : log(r->speedup); /* the file no longer has it */
            nv++;
        } else {
            printf(" | |\n");
        }
    }
    if (nv) printf("\nverify: geometric mean speedup %.3fx over %d shapes (a dropped entry counts 1.0x)\n",
                   exp(logsum / nv), nv);
}

static int write_json(const char *path, const tune_item *items, const tune_result *res, int n, double tune_s)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "flashcore tune: cannot write %s\n", path);
        return -1;
    }
    char dev[160], drv[96];
    cli_cuda_describe(dev, sizeof dev, drv, sizeof drv);
    fprintf(f, "{\n  \"device\": \"%s\",\n  \"driver\": \"%s\",\n  \"library\": \"%s\",\n  \"tune_seconds\": %.2f,\n"
               "  \"shapes\": [\n", dev, drv, fc_version_string(), tune_s);
    for (int i = 0; i < n; i++) {
        const tune_result *r = &res[i];
        fprintf(f,
                "    {\"shape\": \"%s\", \"status\": %d, \"planner\": \"%s\", \"candidates\": %d, "
                "\"search_gain\": %.4f, \"confirmed_gain\": %.4f, \"noise\": %.4f, \"recorded\": %d, "
                "\"entry\": \"%s\", \"winner\": \"%s\", \"planner_us\": %.3f, \"winner_us\": %.3f, "
                "\"seconds\": %.2f, \"cache_kernel\": \"%s\", \"cache_entry\": %d, \"verify_speedup\": %.4f, "
                "\"verify_noise\": %.4f, \"dropped\": %d}%s\n",
                items[i].name, r->status, r->planner, r->candidates,
                r->search_gain > 0 ? r->search_gain : r->v.best_gain, r->v.gain, r->v.noise, r->v.recorded,
                r->choice, r->winner, r->v.planner_us, r->v.winner_us, r->seconds, r->tuned, r->entry, r->speedup,
                r->noise, r->dropped, i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    return fclose(f) ? -1 : 0;
}

/* ---- the command --------------------------------------------------------------------------- */

typedef struct tune_args {
    tune_item *items;
    int n, cap;
    const char *output, *verify, *json;
    int merge, no_verify;
    tune_opts o;
} tune_args;

/* 0 to run, -1 on a usage error (reported), 1 for --help. */
static int parse(int argc, char **argv, tune_args *t)
{
    long long rounds = 15;
    double gain = 0.01;
    cli_args a;
    cli_args_init(&a, "tune", argc, argv);
    for (const char *arg; (arg = cli_next(&a));) {
        const char *v = NULL;
        if (cli_is(&a, arg, "--help") || cli_is(&a, arg, "-h")) return help(), 1;
        if (cli_is(&a, arg, "--shape")) {
            if (!(v = cli_value(&a, arg)) || add_names(v, &t->items, &t->n, &t->cap)) return -1;
        } else if (cli_is(&a, arg, "--custom")) {
            if (!(v = cli_value(&a, arg)) || add_shape(v, &t->items, &t->n, &t->cap)) return -1;
        } else if (cli_is(&a, arg, "--shapes-file")) {
            if (!(v = cli_value(&a, arg)) || add_file(v, &t->items, &t->n, &t->cap)) return -1;
        } else if (cli_is(&a, arg, "--output")) {
            if (!(t->output = cli_value(&a, arg))) return -1;
        } else if (cli_is(&a, arg, "--verify")) {
            if (!(t->verify = cli_value(&a, arg))) return -1;
        } else if (cli_is(&a, arg, "--json")) {
            if (!(t->json = cli_value(&a, arg))) return -1;
        } else if (cli_is(&a, arg, "--merge")) {
            if (cli_no_value(&a, arg)) return -1;
            t->merge = 1;
        } else if (cli_is(&a, arg, "--no-verify")) {
            if (cli_no_value(&a, arg)) return -1;
            t->no_verify = 1;
        } else if (cli_is(&a, arg, "--rounds")) {
            if (cli_int(&a, arg, 3, 1000, &rounds)) return -1;
        } else if (cli_is(&a, arg, "--min-gain")) {
            if (cli_double(&a, arg, 0, 1, &gain)) return -1;
        } else {
            return cli_unknown(&a, arg), -1;
        }
    }
    t->o.rounds = (int)rounds;
    t->o.min_gain = gain;
    t->o.warm_ms = 300;
    if (!t->n || (!t->output == !t->verify)) {
        fprintf(stderr, "flashcore tune: give shapes and exactly one of --output FILE and --verify FILE "
                        "(flashcore tune --help)\n");
        return -1;
    }
    return 0;
}

/* Save out to path again if the verify pass dropped entries; 0 or -1. */
static int save_dropped(fc_context *out, const tune_result *res, int n, const char *path)
{
    int dropped = 0;
    for (int i = 0; i < n; i++) dropped += res[i].dropped;
    if (!dropped) return 0;
    if (fc_context_save_tuning(out, path) != FC_OK) {
        cli_report("tune", "--output", out, FC_ERR_INVALID_ARGUMENT);
        return -1;
    }
    printf("verify: %d entries lost to the planner and were dropped; wrote %s again\n", dropped, path);
    return 0;
}

/* A context with no tuning cache (the planner's choices), or with path's. */
static fc_context *context_with(const char *path)
{
    fc_context *ctx = cli_context("tune", 0);
    if (!ctx) return NULL;
    const fc_status st = fc_context_load_tuning(ctx, path);
    if (st != FC_OK) {
        cli_report("tune", path, ctx, st);
        fc_context_free(ctx);
        return NULL;
    }
    return ctx;
}

int cli_tune(int argc, char **argv)
{
    tune_args t;
    memset(&t, 0, sizeof t);
    int rc = parse(argc, argv, &t);
    if (rc) {
        free(t.items);
        return rc > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    }
    rc = CLI_EXIT_FAIL;
    tune_state *ts = calloc(1, sizeof *ts);
    tune_result *res = calloc((size_t)t.n, sizeof *res);
    fc_context *search = context_with(NULL), *out = context_with(t.merge ? t.output : NULL);
    fc_context *cached = NULL;
    double tune_s = 0;
    if (!ts || !res || !search || !out) goto done;
    if (cli_require_backend("tune", search, FC_BACKEND_CUDA) || cli_cuda_props(&ts->cc, &ts->sms)) goto done;
    ts->arch_class = arch_class(ts->cc);
    ts->ctx = search;
    if (t.output) {
        const double t0 = kit_now();
        for (int i = 0; i < t.n; i++) {
            cli_progress(i + 1, t.n, t.items[i].name);
            tune_one(ts, out, &t.items[i], &t.o, &res[i]);
        }
        cli_progress_done();
        tune_s = kit_now() - t0;
        if (fc_context_save_tuning(out, t.output) != FC_OK) {
            cli_report("tune", "--output", out, FC_ERR_INVALID_ARGUMENT);
            goto done;
        }
        printf("tuned %d shapes in %.1f s; wrote %s\n", t.n, tune_s, t.output);
    }
    const char *file = t.verify ? t.verify : t.output;
    if (!t.no_verify) {
        if (!(cached = context_with(file))) goto done;
        for (int i = 0; i < t.n; i++) {
            cli_progress(i + 1, t.n, t.items[i].name);
            if (!res[i].status) verify_one(ts, search, cached, t.output ? out : NULL, &t.items[i], &t.o, &res[i]);
        }
        cli_progress_done();
        if (t.output && save_dropped(out, res, t.n, t.output)) goto done;
    }
    print_table(t.items, res, t.n, t.output != NULL, !t.no_verify);
    if (t.json && write_json(t.json, t.items, res, t.n, tune_s)) goto done;
    rc = CLI_EXIT_OK;
    for (int i = 0; i < t.n; i++)
        if (res[i].status) rc = CLI_EXIT_FAIL;
done:
    fc_context_free(search);
    fc_context_free(out);
    fc_context_free(cached);
    free(ts);
    free(res);
    free(t.items);
    return rc;
}
