/*
 * cli_compare.c -- `flashcore compare A.json B.json`: pairs the rows of two
 * bench files and prints a Markdown table of B's speedup over A (p50, p90,
 * graph-timed, TFLOP/s) with a verdict line.
 *
 * Rows pair by (shape, system). A shape matches by name, or by dimensions
 * (B, Hq, Hkv, Sq, Sk, D, causal, dtype) when the names differ (the anchor
 * files call "mission" "seed-mission"). When the two files share no system
 * (flashcore against a peer), rows pair by shape alone, provided each file has
 * one row per shape; otherwise --system-a/--system-b pick the systems.
 * A forward row pairs only with a forward row, a backward (pass "bwd") only
 * with a backward one: their FLOP counts differ.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kit_json.h"

static void help(void)
{
    printf("usage: flashcore compare A.json B.json [--system-a NAME] [--system-b NAME]\n\n"
           "Reads two bench files (flashcore bench --json, a peer benchmark with a \"system\"\n"
           "per row, or the anchor files) and prints a Markdown table of the speedup of B\n"
           "over A per shape: time(A) / time(B) for p50, p90 and graph-timed calls, and\n"
           "TFLOP/s(B) / TFLOP/s(A); > 1 means B is faster. The verdict line counts the\n"
           "shapes B wins and the geometric-mean speedup, graph-timed when every pair has\n"
           "graph times, else p50; pairs whose run recorded a failed check are left out.\n"
           "Rows pair within a pass: forward with forward, backward (\"pass\": \"bwd\", as\n"
           "flashcore bench --bwd and bench/peers.py --bwd write) with backward.\n\n"
           "  --system-a NAME  use only A's rows of this system (e.g. flashcore-cuda)\n"
           "  --system-b NAME  use only B's rows of this system (e.g. torch-cudnn)\n\n"
           "Exit status: 0 compared, 1 no rows matched, 2 bad usage or malformed input.\n");
}

/* A table cell: '|' would end the cell early */
static void md_cell(const char *s)
{
    fputs(" ", stdout);
    for (; *s; s++) {
        if (*s == '|') fputs("\\|", stdout);
        else if (*s == '\n' || *s == '\r') fputc(' ', stdout);
        else fputc(*s, stdout);
    }
    fputs(" |", stdout);
}

static int dims_known(const kit_bench_row *r)
{
    return r->B > 0 && r->Hq > 0 && r->Hkv > 0 && r->Sq >= 0 && r->Sk >= 0 && r->D > 0 && r->causal >= 0;
}

static int same_dims(const kit_bench_row *a, const kit_bench_row *b)
{
    if (!dims_known(a) || !dims_known(b)) return 0;
    if (a->B != b->B || a->Hq != b->Hq || a->Hkv != b->Hkv || a->Sq != b->Sq || a->Sk != b->Sk || a->D != b->D)
        return 0;
    /* causal only matters where it masks something */
    if (a->causal != b->causal) return 0;
    return !a->dtype[0] || !b->dtype[0] || strcmp(a->dtype, b->dtype) == 0;
}

/* Index in A of the row pairing with b, or -1. by_name first, then by dims. */
static int find_pair(const kit_bench_file *A, const char *sys_a, const kit_bench_row *b, int match_system)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < A->n; i++) {
            const kit_bench_row *a = &A->rows[i];
            if (strcmp(a->pass, b->pass) != 0) continue;
            if (sys_a && strcmp(a->system, sys_a) != 0) continue;
            if (match_system && strcmp(a->system, b->system) != 0) continue;
            if (pass == 0 ? strcmp(a->shape, b->shape) == 0 : same_dims(a, b)) return i;
        }
    }
    return -1;
}

/* 1 if some shape has more than one row of a pass (of the selected system). */
static int has_duplicate_shapes(const kit_bench_file *f, const char *sys)
{
    for (int i = 0; i < f->n; i++) {
        if (sys && strcmp(f->rows[i].system, sys) != 0) continue;
        for (int j = i + 1; j < f->n; j++) {
            if (sys && strcmp(f->rows[j].system, sys) != 0) continue;
            if (strcmp(f->rows[i].shape, f->rows[j].shape) == 0 && strcmp(f->rows[i].pass, f->rows[j].pass) == 0)
                return 1;
        }
    }
    return 0;
}

static void list_systems(const char *label, const kit_bench_file *f)
{
    fprintf(stderr, "  %s systems:", label);
    for (int i = 0; i < f->n; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++)
            if (strcmp(f->rows[j].system, f->rows[i].system) == 0) seen = 1;
        if (!seen) fprintf(stderr, " '%s'", f->rows[i].system);
    }
    fprintf(stderr, "\n");
}

static int has_system(const kit_bench_file *f, const char *sys)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->rows[i].system, sys) == 0) return 1;
    return 0;
}

/* The passes a file holds: 1 forward, 2 backward (bits). */
static int passes_of(const kit_bench_file *f)
{
    int p = 0;
    for (int i = 0; i < f->n; i++) p |= strcmp(f->rows[i].pass, "bwd") == 0 ? 2 : 1;
    return p;
}

static const char *pass_label(const kit_bench_file *f)
{
    int p = passes_of(f);
    return p == 3 ? " [forward and backward]" : p == 2 ? " [backward]" : "";
}

static void cell_us(char *buf, size_t n, double v)
{
    if (isfinite(v)) snprintf(buf, n, "%.2f", v);
    else snprintf(buf, n, "n/a");
}

/* TFLOP/s: CPU figures are small, GPU ones large */
static void cell_tf(char *buf, size_t n, double v)
{
    if (!isfinite(v)) snprintf(buf, n, "n/a");
    else snprintf(buf, n, "%.*f", v < 1 ? 4 : v < 100 ? 2 : 1, v);
}

/* time ratio a/b (speedup of b), or TFLOP/s ratio b/a */
static double ratio(double num, double den) { return (isfinite(num) && isfinite(den) && num > 0 && den > 0) ? num / den : NAN; }

static void cell_x(char *buf, size_t n, double v)
{
    if (!isfinite(v)) snprintf(buf, n, "n/a");
    else if (v < 0.01) snprintf(buf, n, "%.2gx", v); /* keep tiny ratios readable, not 0.00x */
    else snprintf(buf, n, "%.2fx", v);
}

/* The command line: two bench files, an optional system of each. */
typedef struct compare_opts {
    const char *path[2];
    const char *sys_a, *sys_b;
} compare_opts;

/* 0, or -1 with *rc the exit status (--help: CLI_EXIT_OK). */
static int parse_args(int argc, char **argv, compare_opts *o, int *rc)
{
    int npaths = 0;
    cli_args a;
    cli_args_init(&a, "compare", argc, argv);
    *rc = CLI_EXIT_USAGE;
    for (const char *arg; (arg = cli_next(&a));) {
        if (cli_is(&a, arg, "--help") || cli_is(&a, arg, "-h")) {
            help();
            *rc = CLI_EXIT_OK;
            return -1;
        } else if (cli_is(&a, arg, "--system-a")) {
            if (!(o->sys_a = cli_value(&a, arg))) return -1;
        } else if (cli_is(&a, arg, "--system-b")) {
            if (!(o->sys_b = cli_value(&a, arg))) return -1;
        } else if (arg[0] == '-' && arg[1] != '\0') {
            *rc = cli_unknown(&a, arg);
            return -1;
        } else if (npaths < 2) {
            o->path[npaths++] = arg;
        } else {
            fprintf(stderr, "flashcore compare: expected two files, got a third: '%s'\n", arg);
            return -1;
        }
    }
    if (npaths == 2) return 0;
    fprintf(stderr, "flashcore compare: expected two bench files: flashcore compare A.json B.json\n");
    return -1;
}

/* The picked systems exist; a side without a pick holds one row per shape
 * where the other side's system was picked. -1 (said why) if not. */
static int check_systems(const kit_bench_file *A, const kit_bench_file *B, const compare_opts *o)
{
    if (o->sys_a && !has_system(A, o->sys_a)) {
        fprintf(stderr, "flashcore compare: --system-a '%s': no such system in %s\n", o->sys_a, o->path[0]);
        list_systems("A", A);
        return -1;
    }
    if (o->sys_b && !has_system(B, o->sys_b)) {
        fprintf(stderr, "flashcore compare: --system-b '%s': no such system in %s\n", o->sys_b, o->path[1]);
        list_systems("B", B);
        return -1;
    }
    const int picked = o->sys_a || o->sys_b;
    if (picked && ((!o->sys_a && has_duplicate_shapes(A, NULL)) || (!o->sys_b && has_duplicate_shapes(B, NULL)))) {
        fprintf(stderr, "flashcore compare: %s holds several systems per shape: pick one with %s\n",
                !o->sys_a ? o->path[0] : o->path[1], !o->sys_a ? "--system-a" : "--system-b");
        list_systems(!o->sys_a ? "A" : "B", !o->sys_a ? A : B);
        return -1;
    }
    return 0;
}

/* pair[j]: the row of A that B's row j pairs with (-1: none). Systems
 * must agree unless picked; where no (shape, system) pair exists, the
 * shapes alone, if each file holds one system per shape. The pairs found,
 * or -1 (said why) when the files need a pick. */
static int pair_rows(const kit_bench_file *A, const kit_bench_file *B, const compare_opts *o, int *pair)
{
    int match_system = !o->sys_a && !o->sys_b, npairs = 0;
    for (int pass = 0; pass < 2 && npairs == 0; pass++) {
        if (pass == 1) {
            if (!match_system) break;
            if (has_duplicate_shapes(A, NULL) || has_duplicate_shapes(B, NULL)) {
                fprintf(stderr,
                        "flashcore compare: the files share no (shape, system) pair and hold several "
                        "systems per shape: pick them with --system-a / --system-b\n");
                list_systems("A", A);
                list_systems("B", B);
                return -1;
            }
            match_system = 0;
        }
        for (int j = 0; j < B->n; j++) {
            pair[j] = -1;
            if (o->sys_b && strcmp(B->rows[j].system, o->sys_b) != 0) continue;
            pair[j] = find_pair(A, o->sys_a, &B->rows[j], match_system);
            if (pair[j] >= 0) npairs++;
        }
    }
    return npairs;
}

static void print_header(const kit_bench_file *A, const kit_bench_file *B, const compare_opts *o, int any_graph)
{
    printf("A: %s%s%s%s%s\nB: %s%s%s%s%s\n\n", o->path[0], A->device[0] ? " (" : "", A->device,
           A->device[0] ? ")" : "", pass_label(A), o->path[1], B->device[0] ? " (" : "", B->device,
           B->device[0] ? ")" : "", pass_label(B));
    printf("| shape | A | B | A p50 us | B p50 us | p50 speedup | A p90 us | B p90 us | p90 speedup |");
    if (any_graph) printf(" A graph us | B graph us | graph speedup |");
    printf(" A TFLOP/s | B TFLOP/s | TFLOP/s ratio |\n");
    printf("|---|---|---|---:|---:|---:|---:|---:|---:|");
    if (any_graph) printf("---:|---:|---:|");
    printf("---:|---:|---:|\n");
}

/* The verdict's running sums: graph-timed speedups when every pair has
 * them (the docs/PERF.md method: launch gaps out), else p50. Pairs where
 * either side recorded a failed correctness check prove nothing and are
 * left out. */
typedef struct verdict {
    double log_p50, log_graph;
    int n_p50, n_graph, faster_p50, faster_graph, n_bad;
} verdict;

/* The shape cell: B's shape (A's = B's when they differ), and a failed
 * check named. */
static void shape_cell(char *shape, size_t n, const kit_bench_row *ra, const kit_bench_row *rb)
{
    if (strcmp(ra->shape, rb->shape) == 0) snprintf(shape, n, "%s", rb->shape);
    else snprintf(shape, n, "%s = %s", ra->shape, rb->shape);
    if (ra->check_failed || rb->check_failed) {
        size_t k = strlen(shape);
        snprintf(shape + k, n - k, " (check FAILED in %s)",
                 ra->check_failed && rb->check_failed ? "A and B" : ra->check_failed ? "A" : "B");
    }
}

/* One table row for the pair (ra, rb), counted into v. */
static void print_pair(const kit_bench_row *ra, const kit_bench_row *rb, int any_graph, verdict *v)
{
    char c[12][32], shape[160];
    const double s50 = ratio(ra->p50_us, rb->p50_us), s90 = ratio(ra->p90_us, rb->p90_us);
    const double sg = ratio(ra->graph_us, rb->graph_us), st = ratio(rb->tflops, ra->tflops);
    const double us[9] = {ra->p50_us, rb->p50_us, s50, ra->p90_us, rb->p90_us, s90, ra->graph_us, rb->graph_us, sg};
    for (int i = 0; i < 9; i++) (i % 3 == 2 ? cell_x : cell_us)(c[i], 32, us[i]);
    cell_tf(c[9], 32, ra->tflops);
    cell_tf(c[10], 32, rb->tflops);
    cell_x(c[11], 32, st);
    shape_cell(shape, sizeof shape, ra, rb);
    printf("|");
    md_cell(shape);
    md_cell(ra->system[0] ? ra->system : "-");
    md_cell(rb->system[0] ? rb->system : "-");
    printf(" %s | %s | %s | %s | %s | %s |", c[0], c[1], c[2], c[3], c[4], c[5]);
    if (any_graph) printf(" %s | %s | %s |", c[6], c[7], c[8]);
    printf(" %s | %s | %s |\n", c[9], c[10], c[11]);
    if (ra->check_failed || rb->check_failed) {
        v->n_bad++;
        return;
    }
    if (isfinite(s50)) v->log_p50 += log(s50), v->n_p50++, v->faster_p50 += s50 > 1;
    if (isfinite(sg)) v->log_graph += log(sg), v->n_graph++, v->faster_graph += sg > 1;
}

/* The rows of either file (of the picked system) that paired with none. */
static void print_unpaired(const kit_bench_file *A, const kit_bench_file *B, const compare_opts *o, const int *pair,
                           const char *used_a)
{
    int printed = 0;
    for (int i = 0; i < A->n; i++) {
        if (used_a[i] || (o->sys_a && strcmp(A->rows[i].system, o->sys_a) != 0)) continue;
        printf("%s%s (%s)", printed ? ", " : "only in A: ", A->rows[i].shape, A->rows[i].system);
        printed = 1;
    }
    if (printed) printf("\n");
    printed = 0;
    for (int j = 0; j < B->n; j++) {
        if (pair[j] >= 0 || (o->sys_b && strcmp(B->rows[j].system, o->sys_b) != 0)) continue;
        printf("%s%s (%s)", printed ? ", " : "only in B: ", B->rows[j].shape, B->rows[j].system);
        printed = 1;
    }
    if (printed) printf("\n");
    if (A->n_errors || B->n_errors)
        printf("entries recorded as errors (not compared): %d in A, %d in B\n", A->n_errors, B->n_errors);
}

static void print_verdict(const verdict *v)
{
    if (v->n_bad) printf("%d pair(s) with a failed correctness check are left out of the verdict\n", v->n_bad);
    if (v->n_graph > 0 && v->n_graph >= v->n_p50) {
        printf("B is faster on %d/%d shapes; geometric-mean speedup %.2fx (graph)", v->faster_graph, v->n_graph,
               exp(v->log_graph / v->n_graph));
        if (v->n_p50 > 0) printf("; %.2fx (p50, per-call events)", exp(v->log_p50 / v->n_p50));
        printf("\n");
    } else if (v->n_p50 > 0) {
        printf("B is faster on %d/%d shapes; geometric-mean speedup %.2fx (p50)", v->faster_p50, v->n_p50,
               exp(v->log_p50 / v->n_p50));
        if (v->n_graph > 0) printf("; %.2fx (graph, %d shapes)", exp(v->log_graph / v->n_graph), v->n_graph);
        printf("\n");
    } else {
        printf("no pair has times on both sides: no verdict\n");
    }
}

/* The table, the unpaired rows and the verdict of the pairs found. */
static void report(const kit_bench_file *A, const kit_bench_file *B, const compare_opts *o, const int *pair,
                   char *used_a)
{
    int any_graph = 0;
    for (int j = 0; j < B->n; j++)
        if (pair[j] >= 0 && isfinite(A->rows[pair[j]].graph_us) && isfinite(B->rows[j].graph_us)) any_graph = 1;
    print_header(A, B, o, any_graph);
    verdict v;
    memset(&v, 0, sizeof v);
    for (int j = 0; j < B->n; j++) {
        if (pair[j] < 0) continue;
        used_a[pair[j]] = 1;
        print_pair(&A->rows[pair[j]], &B->rows[j], any_graph, &v);
    }
    printf("\n");
    print_unpaired(A, B, o, pair, used_a);
    print_verdict(&v);
}

/* Pairs the files' rows and reports; the exit status. */
static int compare_files(const kit_bench_file *A, const kit_bench_file *B, const compare_opts *o)
{
    if (check_systems(A, B, o)) return CLI_EXIT_USAGE;
    int *pair = malloc((size_t)(B->n > 0 ? B->n : 1) * sizeof(int));
    char *used_a = calloc((size_t)(A->n > 0 ? A->n : 1), 1);
    int rc = CLI_EXIT_FAIL;
    if (!pair || !used_a) {
        fprintf(stderr, "flashcore compare: out of memory\n");
        goto out;
    }
    const int npairs = pair_rows(A, B, o, pair);
    if (npairs < 0) {
        rc = CLI_EXIT_USAGE;
    } else if (npairs == 0) {
        if (A->n && B->n && !(passes_of(A) & passes_of(B)))
            fprintf(stderr, "flashcore compare: %s times the %s and %s the %s: rows pair within a pass\n", o->path[0],
                    passes_of(A) == 2 ? "backward" : "forward", o->path[1],
                    passes_of(B) == 2 ? "backward" : "forward");
        else
            fprintf(stderr, "flashcore compare: no shape of %s matches one of %s\n", o->path[1], o->path[0]);
    } else {
        report(A, B, o, pair, used_a);
        rc = CLI_EXIT_OK;
    }
out:
    free(pair);
    free(used_a);
    return rc;
}

int cli_compare(int argc, char **argv)
{
    compare_opts o = {{NULL, NULL}, NULL, NULL};
    int rc;
    if (parse_args(argc, argv, &o, &rc)) return rc;
    kit_bench_file F[2];
    char err[600];
    memset(F, 0, sizeof(F));
    for (int k = 0; k < 2; k++) {
        if (kit_bench_file_read(o.path[k], &F[k], err, sizeof(err))) {
            fprintf(stderr, "flashcore compare: %s\n", err);
            kit_bench_file_free(&F[0]);
            return CLI_EXIT_USAGE;
        }
    }
    rc = compare_files(&F[0], &F[1], &o);
    kit_bench_file_free(&F[0]);
    kit_bench_file_free(&F[1]);
    return rc;
}
