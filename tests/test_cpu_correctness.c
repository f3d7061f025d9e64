/*
 * test_cpu_correctness.c -- the tiled CPU path (FC_BACKEND_CPU) against the
 * double-precision reference (FC_BACKEND_CPU_REFERENCE), through the public
 * API only, judged by the kit's per-dtype gates.
 *
 *   1. random shapes over seeds: every dtype, layout, lse on/off, causal,
 *      windows, softcap, GQA/MQA, varlen;
 *   2. named edge cases: seqlen 1, seqlen_q != seqlen_k under causal (both
 *      ways), windows that leave whole rows without a key (those rows must
 *      hold exactly 0 and lse -inf in both backends), large logits
 *      (scale*qk ~ 1e4: finite and gated), GQA ratios 1/4/8, varlen with
 *      empty sequences, odd sizes 1, 17, 1000;
 *   2b. the edges of the accepted scale and softcap ranges (constants.h),
 *      with a q.k = 0 pair under the tiny softcap and huge scale;
 *   2c. varlen with max_seqlen_q/k = INT32_MAX over a few tokens;
 *   2d. f32: fp32-score and double-score key blocks in one row;
 *   3. bitwise identity of the CPU backend with 1 and 4 threads.
 *
 * Every run poisons out and lse first; an element still holding the poison
 * afterwards was never written and fails the case. One line per case, then
 * "N passed, M failed"; exit status 0 only if nothing failed.
 */
#define _POSIX_C_SOURCE 200809L /* getrlimit */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"

#include "test_util.h"

#include <sys/resource.h>

/* Built with AddressSanitizer (gcc or clang)? */
#if defined(__SANITIZE_ADDRESS__)
#define FC_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FC_TEST_ASAN 1
#endif
#endif
#ifndef FC_TEST_ASAN
#define FC_TEST_ASAN 0
#endif

static void verdict(int ok, const char *name, const char *detail)
{
    if (ok) g_pass++;
    else g_fail++;
    printf("%s %-44s %s\n", ok ? "PASS" : "FAIL", name, detail);
    fflush(stdout);
}

/* Run one backend into the case's (freshly poisoned) buffers. */
static fc_status run_backend(fc_context *ctx, kit_case *c, fc_backend backend)
{
    kit_poison(c->out, c->out_bytes, c->s.dtype, c->lse, c->lse_bytes);
    c->args.backend = backend;
    return fc_attention_forward(ctx, &c->args, NULL, NULL);
}

/* Changes a case after its inputs are drawn (NULL: none). */
typedef void (*prep_fn)(kit_case *c);

/* Tiled vs reference on one shape, prepared by prep; 1 if it passed. */
static int run_case_prep(fc_context *ctx, const char *name, const kit_shape *s, uint64_t seed, prep_fn prep)
{
    char line[512];
    kit_case c;
    if (kit_case_init(&c, s, seed) != 0) {
        verdict(0, name, "kit_case_init failed (allocation or shape)");
        return 0;
    }
    if (prep) prep(&c);
    void *ref = malloc(c.out_bytes);
    float *ref_lse = c.lse_bytes ? malloc(c.lse_bytes) : NULL;
    if (!ref || (c.lse_bytes && !ref_lse)) {
        verdict(0, name, "out of memory for the reference copy");
        free(ref);
        free(ref_lse);
        kit_case_free(&c);
        return 0;
    }

    int ok = 0;
    fc_status st = test_reference(ctx, &c, ref, ref_lse);
    if (st != FC_OK) {
        snprintf(line, sizeof line, "reference: %s (%s)", fc_status_string(st), fc_last_error(ctx));
        goto done;
    }

    st = run_backend(ctx, &c, FC_BACKEND_CPU);
    if (st != FC_OK) {
        snprintf(line, sizeof line, "cpu: %s (%s)", fc_status_string(st), fc_last_error(ctx));
        goto done;
    }

    kit_gate g = kit_gate_for(s->dtype);
    kit_metrics m, mref;
    kit_compare(&c, c.out, c.lse, ref, ref_lse, &g, &m);
    kit_compare(&c, ref, ref_lse, ref, ref_lse, &g, &mref); /* the reference wrote everything too */
    int64_t empty = 0, empty_bad = kit_empty_rows(&c, c.out, c.lse, &empty);
    int64_t empty_ref = 0, empty_bad_ref = kit_empty_rows(&c, ref, ref_lse, &empty_ref);
    ok = kit_gate_pass(&m, &g) && mref.unwritten == 0 && mref.lse_bad == 0 && empty_bad == 0 &&
         empty_bad_ref == 0;
    snprintf(line, sizeof line,
             "%s %s lse%d | max_abs %.2e rel_l2 %.2e bad %.3f%% lse_max %.2e | unwritten %lld "
             "nonfinite %lld lse_bad %lld | empty rows %lld (bad %lld/%lld)",
             kit_dtype_name(s->dtype), kit_layout_name(s->layout), s->want_lse, m.max_abs, m.rel_l2,
             m.pct_bad, m.lse_max_abs, (long long)(m.unwritten + mref.unwritten),
             (long long)m.nonfinite, (long long)(m.lse_bad + mref.lse_bad), (long long)empty,
             (long long)empty_bad, (long long)empty_bad_ref);
done:
    verdict(ok, name, line);
    free(ref);
    free(ref_lse);
    kit_case_free(&c);
    return ok;
}

static int run_case(fc_context *ctx, const char *name, const kit_shape *s, uint64_t seed)
{
    return run_case_prep(ctx, name, s, seed, NULL);
}

/* ---- 1. random shapes ----------------------------------------------------- */

static void random_cases(fc_context *ctx, int count)
{
    static const int dims[] = {1, 8, 17, 32, 64, 80, 128, 256};
    static const int lens[] = {1, 7, 17, 33, 64, 65, 128, 191};
    static const int ratios[] = {1, 2, 4, 8};
    for (int n = 0; n < count; n++) {
        uint64_t rng = 0x5eed0000u + (uint64_t)n;
        kit_shape s = test_shape(1 + (int)(kit_rand_u64(&rng) % 3), 1, 1 + (int)(kit_rand_u64(&rng) % 2),
                                 lens[kit_rand_u64(&rng) % 8], lens[kit_rand_u64(&rng) % 8],
                                 dims[kit_rand_u64(&rng) % 8], (fc_dtype)(n % 3));
        s.heads_q = s.heads_kv * ratios[kit_rand_u64(&rng) % 4];
        s.layout = (kit_layout)((n / 3) % 3);
        s.want_lse = (int)(kit_rand_u64(&rng) & 1);
        s.causal = kit_rand_u64(&rng) % 3 == 0;
        if (kit_rand_u64(&rng) % 4 == 0) s.window_left = (int)(kit_rand_u64(&rng) % 48);
        if (!s.causal && kit_rand_u64(&rng) % 4 == 0) s.window_right = (int)(kit_rand_u64(&rng) % 48);
        if (kit_rand_u64(&rng) % 5 == 0) s.softcap = 5.0f + (float)(kit_rand_u64(&rng) % 45);
        s.varlen = kit_rand_u64(&rng) % 4 == 0;
        if (s.varlen) s.batch += 2;
        char name[96];
        snprintf(name, sizeof name, "random#%d b%d h%d/%d s%d/%d d%d%s%s%s%s", n, s.batch, s.heads_q,
                 s.heads_kv, s.seqlen_q, s.seqlen_k, s.head_dim, s.causal ? " causal" : "",
                 s.window_left >= 0 || s.window_right >= 0 ? " window" : "", s.softcap > 0 ? " cap" : "",
                 s.varlen ? " varlen" : "");
        run_case(ctx, name, &s, 1000 + (uint64_t)n);
    }
}

/* ---- 2. edge cases ---------------------------------------------------------- */

static void edge_cases(fc_context *ctx)
{
    char name[96];
    for (int dt = 0; dt < 3; dt++) {
        const fc_dtype t = (fc_dtype)dt;
        const char *tn = kit_dtype_name(t);
        kit_shape s;

        /* seqlen 1 (one query, one key), with and without causal */
        s = test_shape(2, 4, 4, 1, 1, 64, t);
        snprintf(name, sizeof name, "seqlen 1 %s", tn);
        run_case(ctx, name, &s, 11);
        s.causal = 1;
        snprintf(name, sizeof name, "seqlen 1 causal %s", tn);
        run_case(ctx, name, &s, 12);

        /* causal with seqlen_q < seqlen_k (decode-like, bottom-right aligned) */
        s = test_shape(2, 8, 2, 1, 1000, 64, t);
        s.causal = 1;
        snprintf(name, sizeof name, "causal sq1 < sk1000 %s", tn);
        run_case(ctx, name, &s, 13);
        s = test_shape(1, 4, 4, 100, 333, 64, t);
        s.causal = 1;
        s.layout = KIT_LAYOUT_BHSD;
        snprintf(name, sizeof name, "causal sq100 < sk333 %s", tn);
        run_case(ctx, name, &s, 14);

        /* causal with seqlen_q > seqlen_k: the first sq-sk rows see no key */
        s = test_shape(2, 4, 4, 300, 77, 32, t);
        s.causal = 1;
        s.layout = KIT_LAYOUT_PADDED;
        snprintf(name, sizeof name, "causal sq300 > sk77 (empty rows) %s", tn);
        run_case(ctx, name, &s, 15);

        /* local window with sq > sk: rows whose window falls before key 0 */
        s = test_shape(1, 4, 2, 160, 40, 64, t);
        s.window_left = 3;
        s.window_right = 5;
        snprintf(name, sizeof name, "window (3,5) sq160 > sk40 (empty rows) %s", tn);
        run_case(ctx, name, &s, 16);
        s = test_shape(2, 4, 4, 200, 200, 32, t);
        s.window_left = 0;
        s.window_right = 0;
        snprintf(name, sizeof name, "window (0,0): one key per row %s", tn);
        run_case(ctx, name, &s, 17);
        s = test_shape(2, 4, 4, 129, 257, 64, t);
        s.window_left = 16;
        s.causal = 1;
        snprintf(name, sizeof name, "causal + window_left 16 %s", tn);
        run_case(ctx, name, &s, 18);

        /* large logits: inputs N(0, 100^2) make scale*qk ~ 1e4 */
        s = test_shape(1, 4, 2, 96, 96, 64, t);
        s.input_scale = 100.0f;
        snprintf(name, sizeof name, "large logits (input_scale 100) %s", tn);
        run_case(ctx, name, &s, 19);
        /* and through scale: scale 1000 with N(0,1) inputs, causal */
        s = test_shape(1, 4, 4, 96, 96, 128, t);
        s.scale = 1000.0f;
        s.causal = 1;
        snprintf(name, sizeof name, "large logits (scale 1000) causal %s", tn);
        run_case(ctx, name, &s, 20);
        s.softcap = 30.0f;
        snprintf(name, sizeof name, "large logits (scale 1000) softcap 30 %s", tn);
        run_case(ctx, name, &s, 21);

        /* GQA ratios 1, 4, 8 */
        static const int ratio[] = {1, 4, 8};
        for (int r = 0; r < 3; r++) {
            s = test_shape(2, 8, 8 / ratio[r], 130, 150, 64, t);
            s.causal = r == 1;
            s.layout = (kit_layout)r;
            snprintf(name, sizeof name, "gqa %d:1 %s", ratio[r], tn);
            run_case(ctx, name, &s, 22 + (uint64_t)r);
        }

        /* varlen with empty sequences (kit makes some lengths 0) */
        s = test_shape(7, 8, 2, 150, 120, 64, t);
        s.varlen = 1;
        s.causal = 1;
        snprintf(name, sizeof name, "varlen 7 seqs causal (some empty) %s", tn);
        run_case(ctx, name, &s, 25);
        s.causal = 0;
        s.window_left = 10;
        s.window_right = 2;
        s.layout = KIT_LAYOUT_PADDED;
        snprintf(name, sizeof name, "varlen 7 seqs window (10,2) %s", tn);
        run_case(ctx, name, &s, 26);

        /* odd sizes: head_dim 1 and 17, seqlen 17 and 1000 */
        s = test_shape(1, 3, 1, 17, 1000, 1, t);
        snprintf(name, sizeof name, "odd d1 sq17 sk1000 %s", tn);
        run_case(ctx, name, &s, 27);
        s = test_shape(1, 2, 2, 1000, 17, 17, t);
        s.layout = KIT_LAYOUT_PADDED;
        snprintf(name, sizeof name, "odd d17 sq1000 sk17 %s", tn);
        run_case(ctx, name, &s, 28);
        s = test_shape(1, 2, 1, 1000, 1000, 17, t);
        s.causal = 1;
        snprintf(name, sizeof name, "odd d17 sq1000 sk1000 causal %s", tn);
        run_case(ctx, name, &s, 29);
    }
}

/* ---- 2b. the edges of the accepted scale and softcap ranges ----------------------- */

/* Key 0 of every sequence and kv head made orthogonal to query 0 of its
 * first query head: k[2i] = q[2i+1], k[2i+1] = -q[2i], so q.k sums exact
 * cancelling pairs to 0 (dense BSHD, even head_dim). With a tiny softcap
 * and a huge scale, scale/softcap * 0 is where inf * 0 made NaN. */
static void zero_dot_pair(kit_case *c)
{
    const fc_tensor *q = &c->args.q, *k = &c->args.k;
    const int group = c->s.heads_q / c->s.heads_kv;
    for (int b = 0; b < c->s.batch; b++)
        for (int g = 0; g < c->s.heads_kv; g++) {
            const int64_t qo = b * q->stride[0] + (int64_t)g * group * q->stride[2];
            const int64_t ko = b * k->stride[0] + g * k->stride[2];
            for (int d = 0; d + 1 < c->s.head_dim; d += 2) {
                kit_store(c->k, c->s.dtype, ko + d, kit_load(c->q, c->s.dtype, qo + d + 1));
                kit_store(c->k, c->s.dtype, ko + d + 1, -kit_load(c->q, c->s.dtype, qo + d));
            }
        }
}

/* Key blocks (64 keys) scaled x1, x5, x1, x40 in turn, so that an f32 call
 * mixes fp32-score blocks with double-score ones (bound ~20 / ~100 / ~800
 * in log2 units) within every row. */
static void mixed_key_blocks(kit_case *c)
{
    static const float f[4] = {1.0f, 5.0f, 1.0f, 40.0f};
    const fc_tensor *k = &c->args.k;
    for (int b = 0; b < c->s.batch; b++)
        for (int j = 0; j < c->s.seqlen_k; j++)
            for (int g = 0; g < c->s.heads_kv; g++)
                for (int d = 0; d < c->s.head_dim; d++) {
                    const int64_t x = b * k->stride[0] + j * k->stride[1] + g * k->stride[2] + d;
                    kit_store(c->k, c->s.dtype, x, f[(j / 64) % 4] * kit_load(c->k, c->s.dtype, x));
                }
}

/* The first key block f times the head's first query (group 1): that
 * query's running max starts far from the next blocks' fp32 logits, which
 * then replace it (f < 0) or weigh nothing beside it (f > 0). */
static void far_first_block(kit_case *c, float f)
{
    const fc_tensor *q = &c->args.q, *k = &c->args.k;
    for (int b = 0; b < c->s.batch; b++)
        for (int j = 0; j < 64 && j < c->s.seqlen_k; j++)
            for (int g = 0; g < c->s.heads_kv; g++)
                for (int d = 0; d < c->s.head_dim; d++)
                    kit_store(c->k, c->s.dtype, b * k->stride[0] + j * k->stride[1] + g * k->stride[2] + d,
                              f * kit_load(c->q, c->s.dtype, b * q->stride[0] + g * q->stride[2] + d));
}
static void far_negative_block(kit_case *c) { far_first_block(c, -1e5f); }
static void far_positive_block(kit_case *c) { far_first_block(c, 1e5f); }

/* With scale 1e25: q and the first key block x1e6 (logits ~1e39, past the
 * float range, in double), the other keys x1e-32 (fp32 logits ~0.1). */
static void past_float_range(kit_case *c)
{
    const fc_tensor *q = &c->args.q, *k = &c->args.k;
    for (int64_t x = 0; x < (int64_t)c->s.batch * q->stride[0]; x++)
        kit_store(c->q, c->s.dtype, x, 1e6f * kit_load(c->q, c->s.dtype, x));
    for (int b = 0; b < c->s.batch; b++)
        for (int j = 0; j < c->s.seqlen_k; j++)
            for (int64_t d = 0; d < k->stride[1]; d++) {
                const int64_t x = b * k->stride[0] + j * k->stride[1] + d;
                kit_store(c->k, c->s.dtype, x, (j < 64 ? 1e6f : 1e-32f) * kit_load(c->k, c->s.dtype, x));
            }
}

/* f32 only: blocks of fp32 and double scores in one row (tiled.c,
 * F32_SCORE_BOUND), with running maxima far from the fp32 logits. */
static void mixed_precision_cases(fc_context *ctx)
{
    kit_shape s = test_shape(2, 4, 2, 130, 300, 64, FC_DTYPE_F32);
    run_case_prep(ctx, "f32 key blocks x1 x5 x1 x40 (mixed precision)", &s, 61, mixed_key_blocks);
    s.causal = 1;
    run_case_prep(ctx, "f32 key blocks x1 x5 x1 x40 causal", &s, 62, mixed_key_blocks);
    s = test_shape(1, 4, 4, 1, 200, 64, FC_DTYPE_F32);
    run_case_prep(ctx, "f32 first block's logits ~-1e6, then fp32 ones", &s, 63, far_negative_block);
    run_case_prep(ctx, "f32 first block's logits ~+1e6, then fp32 ones", &s, 64, far_positive_block);
    s = test_shape(1, 2, 2, 3, 150, 64, FC_DTYPE_F32);
    s.scale = 1e25f;
    run_case_prep(ctx, "f32 logits past the float range, then fp32 ones", &s, 65, past_float_range);
}

/* One case at an edge of the accepted ranges: a dense BSHD shape with these
 * options, then prep. */
typedef struct range_edge {
    const char *name;
    int batch, hq, hkv, sq, sk, d, causal;
    float scale, softcap, input_scale;
    prep_fn prep;
} range_edge;

/* The bounds of constants.h, as the tests state them. The d512 row has f16
 * inputs near 8e3 (bf16/f32: 1e4), so its scores reach ~1e35; the q.k = 0
 * rows put scale/softcap = 1e38 (and 1e22) against an exact zero. */
static const range_edge k_range_edges[] = {
    {"scale 1e25", 2, 4, 2, 33, 70, 64, 0, 1e25f, 0.0f, 1.0f, NULL},
    {"scale -1e25 causal", 2, 4, 2, 33, 70, 64, 1, -1e25f, 0.0f, 1.0f, NULL},
    {"scale 1e-25", 2, 4, 2, 33, 70, 64, 0, 1e-25f, 0.0f, 1.0f, NULL},
    {"scale -1e-25 causal", 2, 4, 2, 33, 70, 64, 1, -1e-25f, 0.0f, 1.0f, NULL},
    {"scale 1e25 d512 large inputs", 1, 2, 1, 9, 40, 512, 0, 1e25f, 0.0f, 0.0f, NULL},
    {"softcap 1e3 scale 100", 1, 4, 4, 50, 90, 64, 0, 100.0f, 1e3f, 1.0f, NULL},
    {"softcap 1e3 scale -1e-25", 1, 4, 4, 50, 90, 64, 0, -1e-25f, 1e3f, 1.0f, NULL},
    {"softcap 1e-13 scale 1e25 q.k=0", 2, 4, 2, 20, 30, 32, 0, 1e25f, 1e-13f, 1.0f, zero_dot_pair},
    {"softcap 1e3 scale 1e25 q.k=0", 2, 4, 2, 20, 30, 32, 0, 1e25f, 1e3f, 1.0f, zero_dot_pair},
};

static void range_edges(fc_context *ctx)
{
    char name[96];
    const int n = (int)(sizeof k_range_edges / sizeof k_range_edges[0]);
    for (int dt = 0; dt < 3; dt++)
        for (int i = 0; i < n; i++) {
            const range_edge *e = &k_range_edges[i];
            kit_shape s = test_shape(e->batch, e->hq, e->hkv, e->sq, e->sk, e->d, (fc_dtype)dt);
            s.causal = e->causal;
            s.scale = e->scale;
            s.softcap = e->softcap;
            s.input_scale = e->input_scale > 0.0f ? e->input_scale : (dt == FC_DTYPE_F16 ? 8000.0f : 1e4f);
            snprintf(name, sizeof name, "%s %s", e->name, kit_dtype_name((fc_dtype)dt));
            run_case_prep(ctx, name, &s, 40 + (uint64_t)i, e->prep);
        }
}

/* ---- 2c. reference scratch from the real lengths ----------------------------------- */

static void huge_max_seqlen(kit_case *c)
{
    c->args.max_seqlen_q = INT32_MAX;
    c->args.max_seqlen_k = INT32_MAX;
}

/* Varlen with a few tokens and max_seqlen_q/k = INT32_MAX: the reference
 * must size its scratch from the real lengths. Address space is capped at
 * 8 GiB around the run (not under ASan, whose shadow needs far more), so a
 * 16 GiB scratch request fails even where memory is overcommitted. */
static void max_seqlen_bound(fc_context *ctx)
{
    kit_shape s = test_shape(2, 2, 1, 5, 5, 16, FC_DTYPE_BF16);
    s.varlen = 1;
    struct rlimit old;
    int capped = 0;
#if !FC_TEST_ASAN
    if (getrlimit(RLIMIT_AS, &old) == 0) {
        struct rlimit cap = old;
        cap.rlim_cur = (rlim_t)8 << 30;
        if (old.rlim_cur == RLIM_INFINITY || old.rlim_cur > cap.rlim_cur) capped = setrlimit(RLIMIT_AS, &cap) == 0;
    }
#endif
    run_case_prep(ctx, capped ? "varlen max_seqlen INT32_MAX (8 GiB cap)" : "varlen max_seqlen INT32_MAX",
                  &s, 49, huge_max_seqlen);
    if (capped) setrlimit(RLIMIT_AS, &old);
}

/* ---- 3. thread-count independence ---------------------------------------------- */

/* The CPU backend with 1 and with 4 threads: out and lse equal byte for byte. */
static void thread_identity(fc_context *ctx, const char *name, const kit_shape *s, uint64_t seed)
{
    kit_case c;
    if (kit_case_init(&c, s, seed) != 0) {
        verdict(0, name, "kit_case_init failed");
        return;
    }
    void *out1 = malloc(c.out_bytes);
    float *lse1 = c.lse_bytes ? malloc(c.lse_bytes) : NULL;
    char line[256] = "out of memory";
    int ok = 0;
    if (out1 && (!c.lse_bytes || lse1)) {
        fc_status st1 = fc_context_set_num_threads(ctx, 1);
        if (st1 == FC_OK) st1 = run_backend(ctx, &c, FC_BACKEND_CPU);
        memcpy(out1, c.out, c.out_bytes);
        if (lse1) memcpy(lse1, c.lse, c.lse_bytes);
        fc_status st4 = fc_context_set_num_threads(ctx, 4);
        if (st4 == FC_OK) st4 = run_backend(ctx, &c, FC_BACKEND_CPU);
        kit_gate g = kit_gate_for(s->dtype);
        kit_metrics m;
        kit_compare(&c, out1, lse1, out1, lse1, &g, &m); /* every element written */
        int same_out = memcmp(out1, c.out, c.out_bytes) == 0;
        int same_lse = !lse1 || memcmp(lse1, c.lse, c.lse_bytes) == 0;
        ok = st1 == FC_OK && st4 == FC_OK && same_out && same_lse && m.unwritten == 0 && m.lse_bad == 0;
        snprintf(line, sizeof line, "%s: status %d/%d, out %s, lse %s, unwritten %lld", kit_dtype_name(s->dtype),
                 (int)st1, (int)st4, same_out ? "identical" : "DIFFERENT",
                 same_lse ? "identical" : "DIFFERENT", (long long)(m.unwritten + m.lse_bad));
    }
    fc_context_set_num_threads(ctx, 0);
    verdict(ok, name, line);
    free(out1);
    free(lse1);
    kit_case_free(&c);
}

static void thread_cases(fc_context *ctx)
{
    /* Big enough that the backend really starts 4 workers (it uses fewer
     * on tiny problems). */
    kit_shape s = test_shape(2, 8, 2, 300, 300, 64, FC_DTYPE_F16);
    s.causal = 1;
    thread_identity(ctx, "threads 1 vs 4: causal gqa 4:1", &s, 31);
    s = test_shape(5, 8, 8, 250, 270, 80, FC_DTYPE_BF16);
    s.varlen = 1;
    s.window_left = 30;
    s.softcap = 20.0f;
    s.layout = KIT_LAYOUT_PADDED;
    thread_identity(ctx, "threads 1 vs 4: varlen window softcap", &s, 32);
    s = test_shape(1, 4, 4, 333, 400, 128, FC_DTYPE_F32);
    s.layout = KIT_LAYOUT_BHSD;
    thread_identity(ctx, "threads 1 vs 4: dense f32", &s, 33);
}

int main(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    double t0 = kit_now();
    random_cases(ctx, 150);
    edge_cases(ctx);
    range_edges(ctx);
    mixed_precision_cases(ctx);
    max_seqlen_bound(ctx);
    thread_cases(ctx);
    fc_context_free(ctx);
    printf("(%.1f s)\n", kit_now() - t0);
    return test_summary();
}
