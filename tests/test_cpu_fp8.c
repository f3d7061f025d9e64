/*
 * test_cpu_fp8.c -- FP8 inputs on the CPU backends (flashcore.h, "FP8"):
 *
 *   1. the decoders: every e4m3 and e5m2 code against the format's
 *      definition computed in double, and the kit's encoder round-trips
 *      every finite code;
 *   2. the oracle itself: the fp64 reference on FP8 inputs with
 *      power-of-two descales equals, bit for bit, the reference on an f32
 *      twin holding the dequantised values (x * descale, exact in f32), out
 *      and lse, with the amax outputs read off the twin's own output;
 *   3. random configurations, tiled path vs the reference, gated by the out
 *      dtype's gate: all-FP8 (e4m3/e5m2, out f32/f16/bf16) and FP8 K/V
 *      caches under f32/f16/bf16 q; descales none, per tensor, per (batch,
 *      kv head); layouts, causal, windows, softcap, GQA, varlen, paged; both
 *      amax outputs against the reference's;
 *   4. p_amax is exactly 1 where a row sees a single key (causal, Sq = Sk),
 *      and an FP8 call with nothing to compute still writes both amax as 0;
 *   5. the tiled path's bits (out, lse, amax) do not depend on the thread
 *      count.
 * Outputs are poisoned before every run; an unwritten element fails.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"

#include "cpu/cpu_dtype.h"
#include "test_util.h"

/* One line per case; counts a pass or a failure. */
static void verdict_line(int ok, const char *name, const char *detail)
{
    if (ok) g_pass++;
    else g_fail++;
    printf("%s %-44s %s\n", ok ? "PASS" : "FAIL", name, detail);
    fflush(stdout);
}

/* ---- 1. the decoders ---------------------------------------------------------- */

/* Code x of an FP8 format with `eb` exponent bits and `mb` mantissa bits,
 * bias 2^(eb-1)-1, in double, by the definition. e4m3fn: no infinity, only
 * S.1111.111 is NaN. */
static double fp8_definition(unsigned x, int eb, int mb, int fn)
{
    const int bias = (1 << (eb - 1)) - 1, emax = (1 << eb) - 1;
    const unsigned e = (x >> mb) & (unsigned)emax, m = x & ((1u << mb) - 1);
    const double sign = (x >> 7) ? -1.0 : 1.0;
    if (fn && e == (unsigned)emax && m == (1u << mb) - 1) return NAN;
    if (!fn && e == (unsigned)emax) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexp((double)m, 1 - bias - mb);
    return sign * ldexp(1.0 + ldexp((double)m, -mb), (int)e - bias);
}

static void decoders(void)
{
    const int p0 = g_pass, f0 = g_fail;
    for (unsigned x = 0; x < 256; x++) {
        const double d4 = fp8_definition(x, 4, 3, 1), d5 = fp8_definition(x, 5, 2, 0);
        const float l4 = fc_e4m3_to_f32((uint8_t)x), l5 = fc_e5m2_to_f32((uint8_t)x);
        CHECK(isnan(d4) ? isnan(l4) : (double)l4 == d4, "e4m3 0x%02x: library %g, definition %g", x, (double)l4, d4);
        CHECK(isnan(d5) ? isnan(l5) : (double)l5 == d5, "e5m2 0x%02x: library %g, definition %g", x, (double)l5, d5);
        CHECK(isnan(d4) ? isnan(kit_fp8_to_f32((uint8_t)x, FC_DTYPE_E4M3)) : kit_fp8_to_f32((uint8_t)x, FC_DTYPE_E4M3) == l4,
              "kit e4m3 0x%02x", x);
        if (!isnan(d4))
            CHECK(kit_f32_to_fp8(l4, FC_DTYPE_E4M3) == x, "e4m3 0x%02x does not round-trip (%02x)", x,
                  kit_f32_to_fp8(l4, FC_DTYPE_E4M3));
        if (isfinite(d5))
            CHECK(kit_f32_to_fp8(l5, FC_DTYPE_E5M2) == x, "e5m2 0x%02x does not round-trip (%02x)", x,
                  kit_f32_to_fp8(l5, FC_DTYPE_E5M2));
    }
    /* rounding: ties to even, saturation */
    CHECK(kit_f32_to_fp8(1.0625f, FC_DTYPE_E4M3) == 0x38, "1.0625 -> e4m3 1.0 (tie to even)");
    CHECK(kit_f32_to_fp8(1.1875f, FC_DTYPE_E4M3) == 0x3a, "1.1875 -> e4m3 1.25 (tie to even)");
    CHECK(kit_f32_to_fp8(1e6f, FC_DTYPE_E4M3) == 0x7e, "1e6 saturates to e4m3 448");
    CHECK(kit_f32_to_fp8(-1e6f, FC_DTYPE_E5M2) == 0xfb, "-1e6 saturates to e5m2 -57344");
    group_done("fp8 decoders", p0, f0);
}

/* ---- 2. the oracle on FP8 equals the oracle on the dequantised f32 twin ----- */

/* out and lse of c by the reference into ref/ref_lse (test_reference), and
 * its amax pair into amax[2] (poisoned first: NaN). */
static fc_status reference_with_amax(fc_context *ctx, kit_case *c, void *ref, float *ref_lse, float amax[2])
{
    fc_attention_args a = c->args;
    a.out.data = ref;
    if (c->lse) a.lse.data = ref_lse;
    if (a.out_amax) a.out_amax = &amax[0];
    if (a.p_amax) a.p_amax = &amax[1];
    a.backend = FC_BACKEND_CPU_REFERENCE;
    amax[0] = amax[1] = NAN;
    kit_poison(ref, c->out_bytes, kit_out_dtype(&c->s), ref_lse, c->lse_bytes);
    return fc_attention_forward(ctx, &a, NULL, NULL);
}

/* Replace c's descales by powers of two (so x * descale is exact in f32). */
static void pow2_descales(kit_case *c, uint64_t seed)
{
    const int64_t n = kit_descale_count(&c->s);
    for (int i = 0; i < 3; i++)
        for (int64_t x = 0; c->descale[i] && x < n; x++)
            c->descale[i][x] = ldexpf(1.0f, (int)((seed + 7 * (uint64_t)x + 3 * (uint64_t)i) % 5) - 2);
}

/* Tensor t of c (dtype dt) dequantised into twin tensor tt (f32, same
 * strides), element by element through every (b, row, head, d). */
static void dequantise(const kit_case *c, const fc_tensor *t, const fc_tensor *tt, const fc_descale *ds)
{
    const int o = t->ndim == 3; /* varlen: no batch dim */
    const int64_t nb = o ? 1 : t->shape[0], nr = t->shape[1 - o], nh = t->shape[2 - o], nd = t->shape[3 - o];
    const int G = c->s.heads_q / c->s.heads_kv;
    const int is_q = t->data == c->q;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t r = 0; r < nr; r++)
            for (int64_t h = 0; h < nh; h++) {
                /* the descale's batch: the dense batch, or (varlen) the
                 * sequence that owns token r (the twins are never paged) */
                int64_t seq = b;
                if (o) {
                    const int32_t *cu = is_q ? c->cu_q : c->cu_k;
                    seq = 0;
                    while (seq + 1 < c->s.batch && cu[seq + 1] <= r) seq++;
                }
                const int64_t g = is_q ? h / G : h;
                const float d = ds->data ? ds->data[seq * ds->batch_stride + g * ds->head_stride] : 1.0f;
                const int64_t off = (o ? 0 : b * t->stride[0]) + r * t->stride[1 - o] + h * t->stride[2 - o];
                for (int64_t x = 0; x < nd; x++)
                    ((float *)tt->data)[off + x] = kit_load(t->data, t->dtype, off + x) * d;
            }
}

static void twin_case(fc_context *ctx, const char *name, kit_shape s, uint64_t seed)
{
    char line[256] = "";
    int ok = 0;
    kit_case c, tw;
    s.amax = 1;
    kit_shape st = s;
    st.dtype = FC_DTYPE_F32;
    st.fp8_kv = 0;
    st.descale = 0;
    st.amax = 0;
    if (kit_case_init(&c, &s, seed) || kit_case_init(&tw, &st, seed)) {
        verdict_line(0, name, "kit_case_init failed");
        return;
    }
    pow2_descales(&c, seed);
    dequantise(&c, &c.args.q, &tw.args.q, &c.args.q_descale);
    dequantise(&c, &c.args.k, &tw.args.k, &c.args.k_descale);
    dequantise(&c, &c.args.v, &tw.args.v, &c.args.v_descale);
    void *ref = malloc(c.out_bytes), *tref = malloc(tw.out_bytes);
    float *lse = malloc(c.lse_bytes + 4), *tlse = malloc(tw.lse_bytes + 4), amax[2], tamax[2];
    fc_status st1 = reference_with_amax(ctx, &c, ref, lse, amax);
    fc_status st2 = reference_with_amax(ctx, &tw, tref, tlse, tamax);
    if (st1 || st2) {
        snprintf(line, sizeof line, "reference: %s / %s (%s)", fc_status_string(st1), fc_status_string(st2),
                 fc_last_error(ctx));
    } else {
        /* the twin's amax from its output: every logical element's |value| */
        kit_gate g = kit_gate_for(FC_DTYPE_F32);
        kit_metrics m;
        kit_compare(&c, ref, lse, tref, tlse, &g, &m);
        const int same_out = memcmp(ref, tref, c.out_bytes) == 0, same_lse = memcmp(lse, tlse, c.lse_bytes) == 0;
        float oa = 0.0f;
        for (size_t x = 0; x < tw.out_bytes / 4; x++)
            if (!kit_is_poison(tref, FC_DTYPE_F32, (int64_t)x) && fabsf(((float *)tref)[x]) > oa)
                oa = fabsf(((float *)tref)[x]);
        ok = same_out && same_lse && m.unwritten == 0 && amax[0] == oa && amax[1] > 0.0f && amax[1] <= 1.0f;
        snprintf(line, sizeof line, "%s kv %s: out %s, lse %s, out_amax %g (twin's max %g), p_amax %g",
                 kit_dtype_name(s.dtype), kit_dtype_name(kit_kv_dtype(&s)), same_out ? "bitwise" : "DIFFERS",
                 same_lse ? "bitwise" : "DIFFERS", (double)amax[0], (double)oa, (double)amax[1]);
    }
    verdict_line(ok, name, line);
    free(ref);
    free(tref);
    free(lse);
    free(tlse);
    kit_case_free(&c);
    kit_case_free(&tw);
}

static void oracle_twins(fc_context *ctx)
{
    const int p0 = g_pass, f0 = g_fail;
    kit_shape s = test_shape(2, 4, 2, 9, 13, 32, FC_DTYPE_E4M3);
    s.fp8_out = FC_DTYPE_F32;
    s.descale = 2;
    twin_case(ctx, "twin e4m3 per-head descales", s, 11);
    s.dtype = FC_DTYPE_E5M2;
    s.causal = 1;
    s.layout = KIT_LAYOUT_BHSD;
    twin_case(ctx, "twin e5m2 causal bhsd", s, 12);
    s = test_shape(3, 6, 3, 7, 20, 16, FC_DTYPE_F32);
    s.fp8_kv = FC_DTYPE_E4M3;
    s.descale = 2;
    s.softcap = 8.0f;
    s.varlen = 1;
    twin_case(ctx, "twin f32 q, e4m3 k/v, varlen softcap", s, 13);
    group_done("reference on FP8 = reference on the dequantised twin", p0, f0);
}

/* ---- 3. tiled vs reference ------------------------------------------------------ */

static int run_pair(fc_context *ctx, const char *name, const kit_shape *s, uint64_t seed)
{
    char line[384] = "";
    int ok = 0;
    kit_case c;
    if (kit_case_init(&c, s, seed) != 0) {
        verdict_line(0, name, "kit_case_init failed");
        return 0;
    }
    void *ref = malloc(c.out_bytes);
    float *ref_lse = malloc(c.lse_bytes + 4), ramax[2] = {0, 0};
    fc_status st = reference_with_amax(ctx, &c, ref, ref_lse, ramax);
    if (st == FC_OK) {
        kit_poison(c.out, c.out_bytes, kit_out_dtype(s), c.lse, c.lse_bytes);
        if (c.amax) c.amax[0] = c.amax[1] = NAN;
        c.args.backend = FC_BACKEND_CPU;
        st = fc_attention_forward(ctx, &c.args, NULL, NULL);
    }
    if (st != FC_OK) {
        snprintf(line, sizeof line, "%s (%s)", fc_status_string(st), fc_last_error(ctx));
    } else {
        const kit_gate g = kit_gate_for(kit_out_dtype(s));
        kit_metrics m, mref;
        kit_compare(&c, c.out, c.lse, ref, ref_lse, &g, &m);
        kit_compare(&c, ref, ref_lse, ref, ref_lse, &g, &mref);
        int64_t empty = 0, empty_bad = kit_empty_rows(&c, c.out, c.lse, &empty);
        /* amax: out's within the gate's per-element tolerance; p's from
         * sums in fp32 against double */
        int amax_ok = 1;
        if (c.amax)
            amax_ok = fabs(c.amax[0] - ramax[0]) <= g.atol + g.rtol * ramax[0] &&
                      fabs(c.amax[1] - ramax[1]) <= 1e-5 * ramax[1] + 1e-30;
        ok = kit_gate_pass(&m, &g) && mref.unwritten == 0 && empty_bad == 0 && amax_ok;
        snprintf(line, sizeof line,
                 "q %s kv %s out %s ds%d | max_abs %.2e rel_l2 %.2e bad %.3f%% | unwritten %lld lse_bad %lld "
                 "empty %lld/%lld | amax %g/%g vs %g/%g",
                 kit_dtype_name(s->dtype), kit_dtype_name(kit_kv_dtype(s)), kit_dtype_name(kit_out_dtype(s)),
                 s->descale, m.max_abs, m.rel_l2, m.pct_bad, (long long)(m.unwritten + mref.unwritten),
                 (long long)m.lse_bad, (long long)empty_bad, (long long)empty, c.amax ? (double)c.amax[0] : 0.0,
                 c.amax ? (double)c.amax[1] : 0.0, (double)ramax[0], (double)ramax[1]);
    }
    verdict_line(ok, name, line);
    free(ref);
    free(ref_lse);
    kit_case_free(&c);
    return ok;
}

/* Config n of the random set: the FP8 fields on a random forward shape. */
static kit_shape random_fp8_shape(int n, uint64_t *rng)
{
    static const int dims[] = {8, 16, 32, 64, 80, 128};
    static const int lens[] = {1, 5, 17, 33, 64, 70};
    static const fc_dtype qdt[] = {FC_DTYPE_E4M3, FC_DTYPE_E5M2, FC_DTYPE_F16, FC_DTYPE_BF16, FC_DTYPE_F32};
    kit_shape s = test_shape(1 + (int)(kit_rand_u64(rng) % 3), 1, 1 + (int)(kit_rand_u64(rng) % 2),
                             lens[kit_rand_u64(rng) % 6], lens[kit_rand_u64(rng) % 6], dims[kit_rand_u64(rng) % 6],
                             qdt[n % 5]);
    s.heads_q = s.heads_kv * (1 << (kit_rand_u64(rng) % 3));
    if (s.dtype == FC_DTYPE_E4M3 || s.dtype == FC_DTYPE_E5M2) s.fp8_out = (fc_dtype)(kit_rand_u64(rng) % 3);
    else s.fp8_kv = kit_rand_u64(rng) & 1 ? FC_DTYPE_E4M3 : FC_DTYPE_E5M2;
    s.descale = (int)(kit_rand_u64(rng) % 4); /* 3: zeros and negative descales too */
    s.amax = (int)(kit_rand_u64(rng) % 4 != 0);
    s.layout = (kit_layout)((n / 5) % 3);
    s.want_lse = (int)(kit_rand_u64(rng) & 1);
    s.causal = kit_rand_u64(rng) % 3 == 0;
    if (kit_rand_u64(rng) % 4 == 0) s.window_left = (int)(kit_rand_u64(rng) % 24);
    if (kit_rand_u64(rng) % 5 == 0) s.softcap = 5.0f + (float)(kit_rand_u64(rng) % 30);
    const unsigned kind = (unsigned)(kit_rand_u64(rng) % 4);
    if (kind == 1) {
        s.varlen = 1;
        s.batch += 2;
    } else if (kind == 2) {
        s.page_size = 1 + (int)(kit_rand_u64(rng) % 16);
        s.seqused = KIT_SEQUSED_RANDOM;
    }
    return s;
}

static void random_pairs(fc_context *ctx, int count)
{
    const int p0 = g_pass, f0 = g_fail;
    for (int n = 0; n < count; n++) {
        uint64_t rng = 0xf8f80000u + (uint64_t)n;
        const kit_shape s = random_fp8_shape(n, &rng);
        char name[96];
        snprintf(name, sizeof name, "fp8#%d b%d h%d/%d s%d/%d d%d%s%s%s%s", n, s.batch, s.heads_q, s.heads_kv,
                 s.seqlen_q, s.seqlen_k, s.head_dim, s.causal ? " causal" : "", s.window_left >= 0 ? " window" : "",
                 s.softcap > 0 ? " cap" : "", s.varlen ? " varlen" : s.page_size ? " paged" : "");
        run_pair(ctx, name, &s, 5000 + (uint64_t)n);
    }
    group_done("tiled vs reference, FP8", p0, f0);
}

/* ---- 4. p_amax edges ------------------------------------------------------------ */

static void amax_edges(fc_context *ctx)
{
    const int p0 = g_pass, f0 = g_fail;
    const fc_backend bk[2] = {FC_BACKEND_CPU_REFERENCE, FC_BACKEND_CPU};
    kit_shape s = test_shape(1, 2, 1, 6, 6, 16, FC_DTYPE_E4M3);
    s.fp8_out = FC_DTYPE_BF16;
    s.causal = 1;
    s.amax = 1;
    kit_case c;
    if (kit_case_init(&c, &s, 3) == 0) {
        for (int i = 0; i < 2; i++) {
            c.amax[0] = c.amax[1] = NAN;
            c.args.backend = bk[i];
            const fc_status st = fc_attention_forward(ctx, &c.args, NULL, NULL);
            CHECK(st == FC_OK && c.amax[1] == 1.0f, "backend %d: causal row 0 sees one key, p_amax %g (%s)", (int)bk[i],
                  (double)c.amax[1], fc_last_error(ctx));
        }
        kit_case_free(&c);
    }
    /* varlen with no query token: nothing to compute, the amax still written */
    s = test_shape(3, 2, 2, 4, 4, 16, FC_DTYPE_E5M2);
    s.fp8_out = FC_DTYPE_F16;
    s.varlen = 1;
    s.amax = 1;
    if (kit_case_init(&c, &s, 4) == 0) {
        for (int b = 0; b <= s.batch; b++) c.cu_q[b] = 0;
        c.args.q.shape[0] = c.args.out.shape[0] = 0;
        c.args.max_seqlen_q = 0;
        if (c.lse) c.args.lse.shape[1] = 0;
        for (int i = 0; i < 2; i++) {
            c.amax[0] = c.amax[1] = NAN;
            c.args.backend = bk[i];
            const fc_status st = fc_attention_forward(ctx, &c.args, NULL, NULL);
            CHECK(st == FC_OK && c.amax[0] == 0.0f && c.amax[1] == 0.0f, "backend %d: empty call's amax %g %g (%s)",
                  (int)bk[i], (double)c.amax[0], (double)c.amax[1], fc_last_error(ctx));
        }
        kit_case_free(&c);
    }
    group_done("amax edges", p0, f0);
}

/* ---- 5. thread count ----------------------------------------------------------- */

static void thread_bits(fc_context *ctx)
{
    const int p0 = g_pass, f0 = g_fail;
    kit_shape s = test_shape(2, 8, 2, 67, 131, 64, FC_DTYPE_E4M3);
    s.fp8_out = FC_DTYPE_F32;
    s.descale = 2;
    s.amax = 1;
    s.causal = 1;
    kit_case c;
    if (kit_case_init(&c, &s, 9) != 0) {
        CHECK(0, "kit_case_init failed");
        return;
    }
    void *out1 = malloc(c.out_bytes);
    float *lse1 = malloc(c.lse_bytes), amax1[2];
    c.args.backend = FC_BACKEND_CPU;
    fc_context_set_num_threads(ctx, 1);
    fc_status st = fc_attention_forward(ctx, &c.args, NULL, NULL);
    memcpy(out1, c.out, c.out_bytes);
    memcpy(lse1, c.lse, c.lse_bytes);
    memcpy(amax1, c.amax, sizeof amax1);
    kit_poison(c.out, c.out_bytes, FC_DTYPE_F32, c.lse, c.lse_bytes);
    c.amax[0] = c.amax[1] = NAN;
    fc_context_set_num_threads(ctx, 4);
    if (st == FC_OK) st = fc_attention_forward(ctx, &c.args, NULL, NULL);
    fc_context_set_num_threads(ctx, 0);
    CHECK(st == FC_OK, "cpu: %s", fc_last_error(ctx));
    CHECK(memcmp(out1, c.out, c.out_bytes) == 0 && memcmp(lse1, c.lse, c.lse_bytes) == 0 &&
              memcmp(amax1, c.amax, sizeof amax1) == 0,
          "1 and 4 threads differ");
    free(out1);
    free(lse1);
    kit_case_free(&c);
    group_done("bitwise across thread counts", p0, f0);
}

int main(int argc, char **argv)
{
    tu_opts o = {.cases = 300};
    if (tu_parse_opts(argc, argv, &o, "test_cpu_fp8 [--quick] [--cases N] [--verbose]")) return 2;
    if (o.quick) o.cases = 60;
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return 1;
    decoders();
    oracle_twins(ctx);
    random_pairs(ctx, o.cases);
    amax_edges(ctx);
    thread_bits(ctx);
    fc_context_free(ctx);
    return test_summary();
}
