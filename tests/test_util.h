/*
 * test_util.h -- what the test programs share: pass/fail counting (CHECK),
 * per-group lines, the closing summary line, skip reasons, a plain dense
 * kit_shape, the fp64 reference of a case into buffers of its own, snapshots
 * of buffers.
 *
 * Header-only (static, static inline): every test is a single translation
 * unit, so each program gets its own counters. The closing line is exactly
 * "N passed, M failed" with ", K skipped" appended only when some were
 * skipped: scripts/gpu-check.sh and ctest logs are read by that line.
 */
#ifndef FC_TEST_UTIL_H
#define FC_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"

/* Counters of the whole program (main thread only: worker threads count in
 * their own structs and the main thread adds them up). */
static int g_pass, g_fail, g_skip;

/* "FAIL file:line: " before a failed check's message; with
 * TEST_UTIL_SHOW_COND defined before this header, the condition's text too. */
#ifdef TEST_UTIL_SHOW_COND
#define TU_COND_TEXT(text) (text)
#else
#define TU_COND_TEXT(text) ((const char *)0)
#endif

static inline void tu_fail_prefix(const char *file, int line, const char *cond)
{
    printf("FAIL %s:%d: ", file, line);
    if (cond) printf("%s: ", cond);
}

/* One check: counts a pass, or counts a failure and prints a line with the
 * printf-style message. The message arguments are evaluated only on failure. */
#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            g_pass++;                                                      \
        } else {                                                           \
            g_fail++;                                                      \
            tu_fail_prefix(__FILE__, __LINE__, TU_COND_TEXT(#cond));       \
            printf(__VA_ARGS__);                                           \
            printf("\n");                                                  \
        }                                                                  \
    } while (0)

/* "group NAME  P passed, F failed" for the checks since the counts were
 * pass0/fail0 (taken with `int p0 = g_pass, f0 = g_fail;` at its start). */
static inline void group_done(const char *name, int pass0, int fail0)
{
    printf("group %-26s %d passed, %d failed\n", name, g_pass - pass0, g_fail - fail0);
}

/* The closing line; returns the exit status (1 if anything failed). */
static inline int test_summary(void)
{
    printf("%d passed, %d failed", g_pass, g_fail);
    if (g_skip) printf(", %d skipped", g_skip);
    printf("\n");
    return g_fail ? 1 : 0;
}

/* For a program that cannot go on (no context, no memory for its cases):
 * prints the line, counts one failure, closes; returns the exit status. */
static inline int test_give_up(const char *line)
{
    printf("%s\n", line);
    g_fail++;
    return test_summary();
}

/* A dense BSHD problem with lse, no mask, no softcap, default scale; callers
 * set the rest (name, causal, windows, varlen, layout...) on the result. */
static inline kit_shape test_shape(int batch, int hq, int hkv, int sq, int sk, int d, fc_dtype dt)
{
    const kit_shape s = {
        .batch = batch, .heads_q = hq, .heads_kv = hkv, .seqlen_q = sq, .seqlen_k = sk, .head_dim = d,
        .dtype = dt, .window_left = -1, .window_right = -1, .layout = KIT_LAYOUT_BSHD, .want_lse = 1,
    };
    return s; /* every other field 0: no name, no causal, softcap, scale, varlen */
}

/* The fp64 reference (FC_BACKEND_CPU_REFERENCE) of c's inputs, written into
 * ref_out/ref_lse: buffers of c->out_bytes/c->lse_bytes in c's layout
 * (ref_lse NULL when c has no lse). They are poisoned first, so an element
 * the reference skipped shows as unwritten. c's own buffers and args are not
 * touched. On an error, fc_last_error(ctx) says why. */
static inline fc_status test_reference(fc_context *ctx, const kit_case *c, void *ref_out, float *ref_lse)
{
    fc_attention_args a = c->args;
    a.out.data = ref_out;
    if (c->lse) a.lse.data = ref_lse;
    a.backend = FC_BACKEND_CPU_REFERENCE;
    kit_poison(ref_out, c->out_bytes, kit_out_dtype(&c->s), ref_lse, c->lse_bytes);
    return fc_attention_forward(ctx, &a, NULL, NULL);
}

/* The options of the matrix-style tests: [--quick] [--cases N] [--seed S]
 * [--path 80|90] [--verbose]. Fields keep the caller's defaults where an
 * option is absent. 0, or -1 (with the usage line on stderr) on anything
 * else, a --path other than 80 or 90 included. */
typedef struct tu_opts {
    int quick, verbose, cases, path;
    uint64_t seed;
} tu_opts;

static inline int tu_parse_opts(int argc, char **argv, tu_opts *o, const char *usage)
{
    for (int i = 1; i < argc; i++) {
        const int more = i + 1 < argc;
        if (!strcmp(argv[i], "--quick")) o->quick = 1;
        else if (!strcmp(argv[i], "--verbose")) o->verbose = 1;
        else if (!strcmp(argv[i], "--cases") && more) o->cases = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && more) o->seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--path") && more && ((o->path = atoi(argv[++i])) == 80 || o->path == 90)) continue;
        else {
            fprintf(stderr, "usage: %s\n", usage);
            return -1;
        }
    }
    return 0;
}

/* Why cases were skipped, each reason once with its count: tu_note_skip
 * counts a skip (g_skip) under a reason, tu_print_skips lists them before
 * the closing line. The table is a function's static, so a program that
 * skips nothing carries no unused variable. */
#define TU_MAX_SKIP_REASONS 16
typedef struct tu_skips {
    int n;
    struct {
        char why[200];
        int count;
    } r[TU_MAX_SKIP_REASONS];
} tu_skips;

static inline tu_skips *tu_skip_table(void)
{
    static tu_skips t;
    return &t;
}

static inline void tu_note_skip(const char *why)
{
    tu_skips *t = tu_skip_table();
    g_skip++;
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->r[i].why, why)) {
            t->r[i].count++;
            return;
        }
    if (t->n < TU_MAX_SKIP_REASONS) {
        snprintf(t->r[t->n].why, sizeof t->r[t->n].why, "%s", why);
        t->r[t->n++].count = 1;
    }
}

static inline void tu_print_skips(void)
{
    const tu_skips *t = tu_skip_table();
    for (int i = 0; i < t->n; i++) printf("skipped %d x: %s\n", t->r[i].count, t->r[i].why);
}

/* A GPU test's start: 1 with a "device: ..." line when a CUDA device is
 * there, else 0 with the "SKIP: no CUDA device (...)" line (the caller
 * then exits 77). */
static inline int tu_cuda_device(fc_context *ctx)
{
    char buf[512];
    if (!fc_cuda_available()) {
        fc_status st = fc_cuda_device_info(ctx, buf, sizeof buf);
        printf("SKIP: no CUDA device (%s)\n", st == FC_OK ? "fc_cuda_available() is 0" : fc_last_error(ctx));
        return 0;
    }
    if (fc_cuda_device_info(ctx, buf, sizeof buf) == FC_OK) printf("device: %s\n", buf);
    return 1;
}

/* The whole main of a GPU test in a build without CUDA (write
 * `#if !defined(FC_HAVE_CUDA)` TU_MAIN_WITHOUT_CUDA `#else` ... `#endif`). */
#define TU_MAIN_WITHOUT_CUDA                                                 \
    int main(void)                                                           \
    {                                                                        \
        printf("SKIP: no CUDA device (this build has no CUDA backend)\n"); \
        return 77;                                                           \
    }

/* A GPU test's start: its context in *ctx and -1; or, with the line
 * printed, the exit code: 77 without a CUDA device, a failure without a
 * context. */
static inline int tu_cuda_start(fc_context **ctx)
{
    *ctx = NULL;
    if (fc_context_create(ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    if (tu_cuda_device(*ctx)) return -1;
    fc_context_free(*ctx);
    *ctx = NULL;
    return 77;
}

/* Copies of the buffers a call may touch, to prove that a failing call
 * wrote nothing: take them before, compare after. */
#define TU_SNAP_MAX 12
typedef struct tu_snapshot {
    int n;
    const void *src[TU_SNAP_MAX];
    void *copy[TU_SNAP_MAX];
    size_t bytes[TU_SNAP_MAX];
} tu_snapshot;

static inline void tu_snapshot_free(tu_snapshot *s)
{
    for (int i = 0; i < s->n; i++) free(s->copy[i]);
    s->n = 0;
}

/* Copy n (<= TU_SNAP_MAX) buffers of bytes[i] each (0: nothing to copy).
 * 0, or -1 when out of memory (nothing kept). */
static inline int tu_snapshot_take(tu_snapshot *s, int n, void *const *buf, const size_t *bytes)
{
    memset(s, 0, sizeof *s);
    for (; s->n < n; s->n++) {
        const int i = s->n;
        s->src[i] = buf[i];
        s->bytes[i] = bytes[i];
        s->copy[i] = bytes[i] ? malloc(bytes[i]) : NULL;
        if (bytes[i] && !s->copy[i]) {
            tu_snapshot_free(s);
            return -1;
        }
        if (bytes[i]) memcpy(s->copy[i], buf[i], bytes[i]);
    }
    return 0;
}

/* Index of the first buffer that differs from its copy, or -1. */
static inline int tu_snapshot_diff(const tu_snapshot *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->bytes[i] && memcmp(s->copy[i], s->src[i], s->bytes[i]) != 0) return i;
    return -1;
}

#endif /* FC_TEST_UTIL_H */
