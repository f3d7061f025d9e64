/*
 * test_threads.c -- concurrency. Different contexts may be used from
 * different threads at once, and the CPU backend (each context's own
 * parked workers, cpu/pool.h) gives bitwise identical results for any
 * thread count. So:
 *   1. a set of cases (f32/f16/bf16, causal, GQA/MQA, varlen, windows,
 *      softcap, lse, three layouts) is computed once, single-threaded, through
 *      FC_BACKEND_CPU and FC_BACKEND_CPU_REFERENCE: the baseline;
 *   2. four threads, each with its own context and its own num_threads
 *      (0 = one per core, 1, 2, 3), run every case several times in
 *      different orders through both backends, into their own buffers; each
 *      result must equal the baseline byte for byte (out and lse);
 *   3. one thread fails calls in a loop while three others succeed: the
 *      failing thread's messages stay its own, and the others' last error is
 *      "" after every success (messages are per context).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"

#include "test_util.h" /* CHECK and the counters: main thread only */

/* The same for a worker: counts into w, prints the whole line in one call
 * so lines of different threads do not interleave. */
#define TCHECK(w, cond, ...)                                               \
    do {                                                                   \
        if (cond) {                                                        \
            (w)->pass++;                                                   \
        } else {                                                           \
            char line_[512];                                               \
            (w)->fail++;                                                   \
            snprintf(line_, sizeof line_, __VA_ARGS__);                    \
            printf("FAIL %s:%d: [thread %d] %s\n", __FILE__, __LINE__,     \
                   (w)->id, line_);                                        \
        }                                                                  \
    } while (0)

enum { NTHREADS = 4, REPS = 3, NBACK = 2 };
static const fc_backend k_backends[NBACK] = {FC_BACKEND_CPU, FC_BACKEND_CPU_REFERENCE};
static const char *const k_backend_names[NBACK] = {"cpu", "reference"};

/* ---- the cases and their baseline ------------------------------------------------------ */

typedef struct tcase {
    kit_shape s;
    kit_case c;                   /* inputs (shared, read-only in the threads) */
    void *base_out[NBACK];        /* single-threaded results                   */
    float *base_lse[NBACK];
} tcase;

static kit_shape shape(const char *name, fc_dtype dt, int b, int hq, int hkv, int sq, int sk, int d)
{
    kit_shape s = test_shape(b, hq, hkv, sq, sk, d, dt);
    s.name = name;
    return s;
}

static int make_cases(tcase *tc, int *n)
{
    kit_shape s[8];
    int k = 0;
    s[k++] = shape("f32 mha", FC_DTYPE_F32, 2, 4, 4, 70, 90, 32);
    s[k] = shape("f16 causal gqa", FC_DTYPE_F16, 1, 8, 2, 128, 128, 64);
    s[k++].causal = 1;
    s[k] = shape("bf16 varlen mqa causal", FC_DTYPE_BF16, 5, 4, 1, 60, 80, 48);
    s[k].varlen = 1;
    s[k++].causal = 1;
    s[k] = shape("f16 window softcap bhsd", FC_DTYPE_F16, 2, 2, 2, 40, 100, 80);
    s[k].window_left = 16; s[k].window_right = 4; s[k].softcap = 20.0f;
    s[k].layout = KIT_LAYOUT_BHSD; s[k++].want_lse = 0;
    s[k] = shape("bf16 decode padded", FC_DTYPE_BF16, 3, 8, 2, 1, 333, 128);
    s[k++].layout = KIT_LAYOUT_PADDED;
    s[k] = shape("f32 varlen sq>sk window", FC_DTYPE_F32, 4, 3, 3, 50, 30, 16);
    s[k].varlen = 1; s[k].causal = 1; s[k].window_left = 7; s[k++].scale = 0.3f;
    *n = k;
    for (int i = 0; i < k; i++) {
        memset(&tc[i], 0, sizeof tc[i]);
        tc[i].s = s[i];
        if (kit_case_init(&tc[i].c, &s[i], 1000 + (uint64_t)i)) return -1;
        for (int b = 0; b < NBACK; b++) {
            tc[i].base_out[b] = malloc(tc[i].c.out_bytes);
            tc[i].base_lse[b] = tc[i].c.lse ? malloc(tc[i].c.lse_bytes) : NULL;
            if (!tc[i].base_out[b] || (tc[i].c.lse && !tc[i].base_lse[b])) return -1;
        }
    }
    return 0;
}

static void free_cases(tcase *tc, int n)
{
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < NBACK; b++) {
            free(tc[i].base_out[b]);
            free(tc[i].base_lse[b]);
        }
        kit_case_free(&tc[i].c);
    }
}

/* args of a case writing into other output buffers (same layout) */
static fc_attention_args args_into(const tcase *t, void *out, float *lse, fc_backend b)
{
    fc_attention_args a = t->c.args;
    a.out.data = out;
    if (t->c.lse) a.lse.data = lse;
    a.backend = b;
    return a;
}

static void baseline(tcase *tc, int n)
{
    int p0 = g_pass, f0 = g_fail;
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx)) { CHECK(0, "fc_context_create"); return; }
    for (int i = 0; i < n; i++) {
        tcase *t = &tc[i];
        for (int b = 0; b < NBACK; b++) {
            kit_poison(t->base_out[b], t->c.out_bytes, t->s.dtype, t->base_lse[b], t->c.lse_bytes);
            fc_attention_args a = args_into(t, t->base_out[b], t->base_lse[b], k_backends[b]);
            fc_status st = fc_attention_forward(ctx, &a, NULL, NULL);
            CHECK(st == FC_OK, "baseline %s %s: %s", t->s.name, k_backend_names[b], fc_last_error(ctx));
        }
        /* the baseline itself must be right: cpu against the reference */
        kit_gate g = kit_gate_for(t->s.dtype);
        kit_metrics m;
        kit_compare(&t->c, t->base_out[0], t->base_lse[0], t->base_out[1], t->base_lse[1], &g, &m);
        CHECK(kit_gate_pass(&m, &g), "baseline %s: cpu vs reference: max_abs %.3g rel_l2 %.3g bad %.3g%% "
              "unwritten %lld nonfinite %lld lse_bad %lld", t->s.name, m.max_abs, m.rel_l2, m.pct_bad,
              (long long)m.unwritten, (long long)m.nonfinite, (long long)m.lse_bad);
        /* and the cpu backend with one worker equals the one-per-core run */
        void *o1 = malloc(t->c.out_bytes);
        float *l1 = t->c.lse ? malloc(t->c.lse_bytes) : NULL;
        if (o1 && (!t->c.lse || l1)) {
            kit_poison(o1, t->c.out_bytes, t->s.dtype, l1, t->c.lse_bytes);
            fc_context_set_num_threads(ctx, 1);
            fc_attention_args a = args_into(t, o1, l1, FC_BACKEND_CPU);
            CHECK(fc_attention_forward(ctx, &a, NULL, NULL) == FC_OK, "%s 1 thread: %s", t->s.name,
                  fc_last_error(ctx));
            CHECK(memcmp(o1, t->base_out[0], t->c.out_bytes) == 0, "%s: out with 1 worker differs", t->s.name);
            CHECK(!l1 || memcmp(l1, t->base_lse[0], t->c.lse_bytes) == 0, "%s: lse with 1 worker differs",
                  t->s.name);
            fc_context_set_num_threads(ctx, 0);
        } else {
            CHECK(0, "out of host memory");
        }
        free(o1);
        free(l1);
    }
    fc_context_free(ctx);
    group_done("single-threaded baseline", p0, f0);
}

/* ---- phase 2: every thread recomputes every case --------------------------------------- */

typedef struct worker {
    int id;
    int pass, fail;
    tcase *tc;
    int ncases;
} worker;

static void *recompute_main(void *arg)
{
    worker *w = arg;
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx)) { TCHECK(w, 0, "fc_context_create"); return NULL; }
    /* each thread a different worker count: results must not depend on it */
    TCHECK(w, fc_context_set_num_threads(ctx, w->id) == FC_OK, "set_num_threads(%d)", w->id);
    void *out[16];
    float *lse[16];
    int ok = 1;
    for (int i = 0; i < w->ncases; i++) {
        out[i] = malloc(w->tc[i].c.out_bytes);
        lse[i] = w->tc[i].c.lse ? malloc(w->tc[i].c.lse_bytes) : NULL;
        if (!out[i] || (w->tc[i].c.lse && !lse[i])) ok = 0;
    }
    for (int rep = 0; ok && rep < REPS; rep++)
        for (int j = 0; j < w->ncases; j++) {
            /* a different order per thread and repetition */
            int i = (j * (rep % 2 ? w->ncases - 1 : 1) + w->id + rep) % w->ncases;
            const tcase *t = &w->tc[i];
            for (int bb = 0; bb < NBACK; bb++) {
                int b = (bb + w->id + rep) % NBACK;
                kit_poison(out[i], t->c.out_bytes, t->s.dtype, lse[i], t->c.lse_bytes);
                fc_attention_args a = args_into(t, out[i], lse[i], k_backends[b]);
                fc_status st = fc_attention_forward(ctx, &a, NULL, NULL);
                TCHECK(w, st == FC_OK, "rep %d %s %s: %s", rep, t->s.name, k_backend_names[b], fc_last_error(ctx));
                TCHECK(w, fc_last_error(ctx)[0] == 0, "rep %d %s: last error '%s' after success", rep, t->s.name,
                       fc_last_error(ctx));
                TCHECK(w, memcmp(out[i], t->base_out[b], t->c.out_bytes) == 0,
                       "rep %d %s %s (num_threads %d): out differs from the single-threaded run", rep,
                       t->s.name, k_backend_names[b], w->id);
                TCHECK(w, !lse[i] || memcmp(lse[i], t->base_lse[b], t->c.lse_bytes) == 0,
                       "rep %d %s %s (num_threads %d): lse differs from the single-threaded run", rep,
                       t->s.name, k_backend_names[b], w->id);
            }
        }
    TCHECK(w, ok, "out of host memory");
    for (int i = 0; i < w->ncases; i++) {
        free(out[i]);
        free(lse[i]);
    }
    fc_context_free(ctx);
    return NULL;
}

static void run_threads(void *(*fn)(void *), worker *w, int n, const char *group)
{
    int p0 = g_pass, f0 = g_fail;
    pthread_t tid[NTHREADS];
    int started[NTHREADS] = {0};
    for (int i = 0; i < n; i++) {
        started[i] = pthread_create(&tid[i], NULL, fn, &w[i]) == 0;
        CHECK(started[i], "pthread_create %d", i);
    }
    for (int i = 0; i < n; i++)
        if (started[i]) pthread_join(tid[i], NULL);
    for (int i = 0; i < n; i++) {
        g_pass += w[i].pass;
        g_fail += w[i].fail;
    }
    group_done(group, p0, f0);
}

/* ---- phase 3: errors stay in their own context ----------------------------------------- */

static atomic_int g_successes_running;

typedef struct msg_worker {
    int id;
    int pass, fail;
    const tcase *t; /* a small case to succeed on (successes) or break (errors) */
    int iterations;
} msg_worker;

/* Fails in a loop, with the thread's own argument values, until the
 * succeeding threads are done (and at least `iterations` times). */
static void *error_main(void *arg)
{
    msg_worker *w = arg;
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx)) { TCHECK(w, 0, "fc_context_create"); return NULL; }
    fc_attention_args good = w->t->c.args;
    good.backend = FC_BACKEND_CPU;
    for (int it = 0; it < w->iterations || atomic_load(&g_successes_running) > 0; it++) {
        fc_attention_args a = good;
        const char *want;
        switch (it % 3) {
        case 0: a.causal = 7; want = "causal is 7"; break;
        case 1: a.q.data = NULL; want = "q.data"; break;
        default: a.window_left = -9; want = "window (-9, -1)"; break;
        }
        fc_status st = it % 2 ? fc_attention_forward(ctx, &a, NULL, NULL) : fc_attention_supported(ctx, &a, NULL);
        TCHECK(w, st == FC_ERR_INVALID_ARGUMENT, "iteration %d: status %d", it, (int)st);
        TCHECK(w, strstr(fc_last_error(ctx), want) != NULL, "iteration %d: message '%s' lacks '%s'", it,
               fc_last_error(ctx), want);
        if (it > 100000) break; /* a hung success thread must not hang this one */
    }
    fc_context_free(ctx);
    return NULL;
}

/* Succeeds in a loop; every success must leave ""; now and then fails with
 * its own value and must see exactly its own message. */
static void *success_main(void *arg)
{
    msg_worker *w = arg;
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx)) {
        TCHECK(w, 0, "fc_context_create");
        atomic_fetch_sub(&g_successes_running, 1);
        return NULL;
    }
    fc_context_set_num_threads(ctx, 2);
    void *out = malloc(w->t->c.out_bytes);
    float *lse = w->t->c.lse ? malloc(w->t->c.lse_bytes) : NULL;
    if (out && (!w->t->c.lse || lse)) {
        fc_attention_args a = args_into(w->t, out, lse, FC_BACKEND_CPU);
        char own[64];
        snprintf(own, sizeof own, "num_seqs is %d", -100 - w->id);
        for (int it = 0; it < w->iterations; it++) {
            fc_status st = it % 2 ? fc_attention_forward(ctx, &a, NULL, NULL) : fc_attention_supported(ctx, &a, NULL);
            TCHECK(w, st == FC_OK, "iteration %d: %s", it, fc_last_error(ctx));
            TCHECK(w, fc_last_error(ctx)[0] == 0, "iteration %d: last error '%s' after a success", it,
                   fc_last_error(ctx));
            if (it % 5 == 4) {
                fc_attention_args bad = a;
                bad.num_seqs = -100 - w->id;
                st = fc_attention_supported(ctx, &bad, NULL);
                TCHECK(w, st == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), own),
                       "iteration %d: own error %d '%s', expected '%s'", it, (int)st, fc_last_error(ctx), own);
            }
        }
    } else {
        TCHECK(w, 0, "out of host memory");
    }
    free(out);
    free(lse);
    fc_context_free(ctx);
    atomic_fetch_sub(&g_successes_running, 1);
    return NULL;
}

static void test_error_isolation(const tcase *varlen_case)
{
    int p0 = g_pass, f0 = g_fail;
    pthread_t tid[NTHREADS];
    int started[NTHREADS] = {0};
    msg_worker w[NTHREADS];
    memset(w, 0, sizeof w);
    atomic_store(&g_successes_running, NTHREADS - 1);
    for (int i = 0; i < NTHREADS; i++) {
        w[i].id = i;
        w[i].t = varlen_case; /* varlen: the success path also reads cu_seqlens */
        w[i].iterations = i == 0 ? 200 : 60;
        started[i] = pthread_create(&tid[i], NULL, i == 0 ? error_main : success_main, &w[i]) == 0;
        CHECK(started[i], "pthread_create %d", i);
        if (!started[i] && i > 0) atomic_fetch_sub(&g_successes_running, 1);
    }
    for (int i = 0; i < NTHREADS; i++)
        if (started[i]) pthread_join(tid[i], NULL);
    for (int i = 0; i < NTHREADS; i++) {
        g_pass += w[i].pass;
        g_fail += w[i].fail;
    }
    group_done("per-context error messages", p0, f0);
}

int main(void)
{
    tcase tc[16];
    int n = 0;
    if (make_cases(tc, &n)) return test_give_up("FAIL: cannot build the cases (out of host memory)");
    baseline(tc, n);

    worker w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].id = i;
        w[i].tc = tc;
        w[i].ncases = n;
    }
    run_threads(recompute_main, w, NTHREADS, "4 threads == baseline");

    /* a small varlen case for the message test: index 5 (f32 varlen) */
    test_error_isolation(&tc[5]);

    free_cases(tc, n);
    return test_summary();
}
