/*
 * test_cuda_forward.c -- the CUDA backend against the double-precision CPU
 * reference, through the public API only, judged by the kit's per-dtype
 * gates; for every CUDA kernel family (fc_context_set_cuda_path 80 and 90).
 *
 * Per case: kit_case_init builds the problem on the host; the reference runs
 * on the host (FC_BACKEND_CPU_REFERENCE, once per case); inputs are copied
 * to device buffers; out and lse are poisoned ON THE DEVICE (cudaMemcpy of
 * the poisoned host buffers) before every run; the CUDA run goes through
 * fc_attention_forward(FC_BACKEND_CUDA); results come back and must
 *   - pass kit_compare / kit_gate_pass (every logical element written),
 *   - leave every non-logical element of out (padding) untouched (poison),
 *   - be bitwise identical on a second run.
 *
 * Usage: test_cuda_forward [--quick] [--cases N] [--seed S] [--path 80|90] [--head-dim D] [--verbose]
 *   --quick    a few small cases of every kernel variant (dtype x head_dim x
 *              {plain, causal+varlen, window+softcap+padded, decode/GQA-pack/split})
 *              -- the run to put under compute-sanitizer
 *   --cases N  random cases (default 300) besides the named edge cases
 *   --path P   only that kernel family (default: 80 and 90)
 *   --head-dim D  only cases of that head_dim (random ones drawn with it);
 *              with a tuning cache file that forces sm90_config=<row>
 *              (FLASHCORE_TUNING_CACHE, docs/TUNING.md) this runs the matrix
 *              on one row of the Hopper tile table whatever the planner picks
 * Without a CUDA device: "SKIP: no CUDA device (...)" and exit code 77.
 * Output: a line per failure (every case with --verbose), the skip reasons,
 * then exactly "N passed, M failed" (", K skipped" when some were skipped).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_util.h"

#if defined(FC_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "test_cuda_util.h"
#endif

#if !defined(FC_HAVE_CUDA)
TU_MAIN_WITHOUT_CUDA
#else

static int g_verbose;

/* Where two runs of one case differ (a race shows here first): how many
 * output and LSE elements, the largest difference, and the first element
 * (flat index into the output buffer) that differs. */
static void rerun_diff(const kit_case *c, const void *a, const void *b, const float *la, const float *lb, char *buf,
                       size_t len)
{
    const size_t esz = kit_dtype_size(c->s.dtype);
    const int64_t n = (int64_t)(c->out_bytes / esz);
    int64_t nd = 0, first = -1, nl = 0;
    double maxd = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (memcmp((const char *)a + i * esz, (const char *)b + i * esz, esz) == 0) continue;
        if (first < 0) first = i;
        nd++;
        const double d = fabs((double)kit_load(a, c->s.dtype, i) - (double)kit_load(b, c->s.dtype, i));
        if (d > maxd || d != d) maxd = d;
    }
    if (la && lb)
        for (size_t i = 0; i < c->lse_bytes / sizeof(float); i++) nl += memcmp(la + i, lb + i, sizeof(float)) != 0;
    snprintf(buf, len, " (%lld outputs differ, max %.3g, first at %lld; %lld LSE)", (long long)nd, maxd,
             (long long)first, (long long)nl);
}

static void describe(const kit_shape *s, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s%s d%d b%d h%d/%d s%d/%d %s%s%s%s%s%s%s%s", kit_dtype_name(s->dtype),
             s->fp8_kv ? " kv " : "", s->fp8_kv ? kit_dtype_name((fc_dtype)s->fp8_kv) : "", s->head_dim, s->batch,
             s->heads_q, s->heads_kv, s->seqlen_q, s->seqlen_k, kit_layout_name(s->layout), s->odd_out ? " odd-out" : "",
             s->causal ? " causal" : "",
             (s->window_left >= 0 || s->window_right >= 0) ? " window" : "", s->softcap > 0 ? " softcap" : "",
             s->varlen ? " varlen" : "", s->want_lse ? " lse" : "", s->scale > 0 ? " scale" : "");
}

/* Head dims every sm80 kernel set covers (anything else is an expected
 * UNSUPPORTED there). For the sm90 path any UNSUPPORTED counts as a skip. */
static int sm80_supports(const kit_shape *s)
{
    const int d = s->head_dim;
    if (s->fp8_kv) return d == 64 || d == 128; /* the kVarKv8 rows */
    return d == 32 || d == 64 || d == 96 || d == 128 || d == 256;
}

/* One case on every path in paths[]; reference computed once. */
static void run_case(fc_context *ctx, const char *tag, const kit_shape *s, uint64_t seed, const int *paths,
                     int npaths, const int *path_ok, const char path_why[][200], cudaStream_t stream)
{
    char desc[200], line[1400], err[600];
    describe(s, desc, sizeof desc);
    kit_case c;
    if (kit_case_init(&c, s, seed) != 0) {
        g_fail += npaths;
        printf("FAIL %s %s: kit_case_init failed\n", tag, desc);
        return;
    }
    void *ref = malloc(c.out_bytes), *out1 = malloc(c.out_bytes), *out2 = malloc(c.out_bytes);
    float *ref_lse = c.lse_bytes ? malloc(c.lse_bytes) : NULL;
    float *lse1 = c.lse_bytes ? malloc(c.lse_bytes) : NULL, *lse2 = c.lse_bytes ? malloc(c.lse_bytes) : NULL;
    if (!ref || !out1 || !out2 || (c.lse_bytes && (!ref_lse || !lse1 || !lse2))) {
        g_fail += npaths;
        printf("FAIL %s %s: out of host memory\n", tag, desc);
        goto out;
    }

    /* reference on the host inputs; c.out keeps the poison dev_upload copies */
    fc_status st = test_reference(ctx, &c, ref, ref_lse);
    if (st != FC_OK) {
        g_fail += npaths;
        printf("FAIL %s %s: reference: %s (%s)\n", tag, desc, fc_status_string(st), fc_last_error(ctx));
        goto out;
    }
    kit_poison(c.out, c.out_bytes, kit_out_dtype(s), c.lse, c.lse_bytes);

    dev_case d;
    if (dev_upload(&c, &d, err, sizeof err) != 0) {
        g_fail += npaths;
        printf("FAIL %s %s: %s\n", tag, desc, err);
        goto out;
    }
    for (int pi = 0; pi < npaths; pi++) {
        const int path = paths[pi];
        if (!path_ok[pi]) {
            tu_note_skip(path_why[pi]);
            continue;
        }
        fc_context_set_cuda_path(ctx, path);
        fc_kernel_info info;
        memset(&info, 0, sizeof info);
        st = dev_run(ctx, &c, &d, stream, out1, lse1, &info, err, sizeof err);
        if (st == FC_ERR_UNSUPPORTED && (path == 90 || !sm80_supports(s))) {
            char why[200];
            snprintf(why, sizeof why, "path %d: %.180s", path, fc_last_error(ctx));
            tu_note_skip(why);
            if (g_verbose) printf("SKIP %s path%d %s: %s\n", tag, path, desc, err);
            continue;
        }
        if (st != FC_OK) {
            g_fail++;
            printf("FAIL %s path%d %s: %s\n", tag, path, desc, err);
            /* a sticky CUDA error poisons everything after it: stop here */
            if (st == FC_ERR_CUDA && cudaDeviceSynchronize() != cudaSuccess) {
                printf("sticky CUDA error after this case: %s\n", cudaGetErrorString(cudaGetLastError()));
                dev_free(&d);
                fc_context_set_cuda_path(ctx, 0);
                exit(test_summary());
            }
            continue;
        }
        fc_kernel_info info2;
        fc_status st2 = dev_run(ctx, &c, &d, stream, out2, lse2, &info2, err, sizeof err);

        kit_gate g = kit_gate_for(kit_out_dtype(s));
        kit_metrics m;
        kit_compare(&c, out1, lse1, ref, ref_lse, &g, &m);
        const int64_t stray = kit_stray_writes(&c, out1);
        const int same = st2 == FC_OK && memcmp(out1, out2, c.out_bytes) == 0 &&
                         (!lse1 || memcmp(lse1, lse2, c.lse_bytes) == 0);
        const int ok = kit_gate_pass(&m, &g) && stray == 0 && same && info.backend == FC_BACKEND_CUDA;
        char diff[160] = "";
        if (st2 == FC_OK && !same) rerun_diff(&c, out1, out2, lse1, lse2, diff, sizeof diff);
        snprintf(line, sizeof line,
                 "%s path%d %s [%s split%d] | max_abs %.2e rel_l2 %.2e bad %.3f%% lse_max %.2e | unwritten %lld "
                 "nonfinite %lld lse_bad %lld stray %lld | rerun %.300s%s",
                 tag, path, desc, info.name, info.num_splits, m.max_abs, m.rel_l2, m.pct_bad, m.lse_max_abs,
                 (long long)m.unwritten, (long long)m.nonfinite, (long long)m.lse_bad, (long long)stray,
                 st2 != FC_OK ? err : (same ? "identical" : "DIFFERENT"), diff);
        if (ok) g_pass++;
        else g_fail++;
        if (!ok || g_verbose) printf("%s %s\n", ok ? "PASS" : "FAIL", line);
        fflush(stdout);
    }
    fc_context_set_cuda_path(ctx, 0);
    dev_free(&d);
out:
    free(ref); free(out1); free(out2);
    free(ref_lse); free(lse1); free(lse2);
    kit_case_free(&c);
}

/* ---- shapes -------------------------------------------------------------------- */

/* Host reference work of a case (multiply-adds): keeps the run short. */
static double work(const kit_shape *s)
{
    return 2.0 * s->batch * s->heads_q * (double)s->seqlen_q * (double)s->seqlen_k * s->head_dim;
}

static int g_only_dim; /* --head-dim: 0 = every head_dim */

static kit_shape random_shape(uint64_t *rng)
{
    static const int dims[] = {32, 64, 64, 96, 128, 128, 192, 256, 256};
    static const int lens[] = {1, 2, 17, 33, 64, 100, 127, 128, 129, 255, 300, 512, 1000, 1023, 2048, 4097};
    static const int ratios[] = {1, 1, 1, 2, 4, 8};
#define R(n) ((int)(kit_rand_u64(rng) % (uint64_t)(n)))
    const fc_dtype dt = R(2) ? FC_DTYPE_BF16 : FC_DTYPE_F16;
    kit_shape s;
    if (R(8) == 0) { /* decode: few queries, long KV, GQA -> packing and split-KV */
        const int g = R(2) ? 4 : 8, hkv = 1 + R(2);
        const int d = dims[R(9)];
        s = test_shape(1 + R(4), hkv * g, hkv, 1 + R(4), (int[]){300, 1000, 2048, 4097}[R(4)],
                       g_only_dim ? g_only_dim : d, dt);
    } else {
        const int hkv = 1 + R(3);
        const int sq = lens[R(16)];
        const int b = 1 + R(3), hq = hkv * ratios[R(6)], sk = R(3) == 0 ? sq : lens[R(16)], d = dims[R(9)];
        s = test_shape(b, hq, hkv, sq, sk, g_only_dim ? g_only_dim : d, dt);
    }
    if (R(3) == 0) s.causal = 1;
    if (R(5) == 0) {
        s.window_left = R(3) ? R(300) : -1;
        if (!s.causal) s.window_right = R(2) ? R(64) : (s.window_left < 0 ? R(8) : -1);
    }
    if (R(6) == 0) s.softcap = 5.0f + (float)R(46);
    if (R(5) == 0) s.scale = 0.02f + 0.04f * (float)R(8);
    if (R(4) == 0) {
        s.varlen = 1;
        s.batch += 1 + R(4);
    }
    s.layout = (kit_layout)R(3);
    s.want_lse = R(10) < 7;
    if (R(12) == 0) s.input_scale = 3.0f;
    /* cap the host reference work at ~4e7 multiply-adds per case */
    while (work(&s) > 4e7) {
        if (s.batch > 1) s.batch--;
        else if (s.heads_kv > 1) { s.heads_q /= s.heads_kv; s.heads_kv = 1; }
        else if (s.heads_q > 1 && s.heads_q > s.heads_kv) s.heads_q = s.heads_kv * ((s.heads_q / s.heads_kv + 1) / 2);
        else if (s.seqlen_q >= s.seqlen_k) s.seqlen_q = (s.seqlen_q + 1) / 2;
        else s.seqlen_k = (s.seqlen_k + 1) / 2;
    }
#undef R
    return s;
}

typedef struct runner {
    fc_context *ctx;
    const int *paths;
    int npaths;
    const int *path_ok;
    const char (*path_why)[200];
    cudaStream_t streams[2];
    int n;
} runner;

static void run(runner *r, const char *tag, const kit_shape *s, uint64_t seed)
{
    if (g_only_dim && s->head_dim != g_only_dim) return;
    /* every third case on a created (non-default) stream */
    cudaStream_t st = (r->n++ % 3 == 2) ? r->streams[1] : r->streams[0];
    run_case(r->ctx, tag, s, seed, r->paths, r->npaths, r->path_ok, r->path_why, st);
}

/* out with odd element strides (rows only 2-byte aligned; valid input):
 * every O store must cope. The first is the fuzz target's CUDA finding
 * (seed 101, case 369: split-KV, whose combine stored 8 bytes at a time
 * there, a misaligned-address fault); then split-KV on both paths, the
 * unsplit stores under varlen and causal, and with BHSD inputs. */
static void odd_out_cases(runner *r, fc_dtype dt)
{
    static const struct { const char *tag; int b, hq, hkv, sq, sk, d, varlen_causal; kit_layout layout; } k[] = {
        {"edge:odd-out-split-d192", 3, 4, 2, 3, 532, 192, 0, KIT_LAYOUT_BSHD},
        {"edge:odd-out-split-d128", 3, 4, 2, 3, 532, 128, 0, KIT_LAYOUT_BSHD},
        {"edge:odd-out-varlen-causal", 5, 4, 2, 150, 200, 64, 1, KIT_LAYOUT_BSHD},
        {"edge:odd-out-bhsd-d256", 1, 4, 4, 260, 300, 256, 0, KIT_LAYOUT_BHSD},
        {"edge:odd-out-d32", 1, 8, 2, 500, 500, 32, 0, KIT_LAYOUT_BSHD},
    };
    for (int i = 0; i < (int)(sizeof k / sizeof k[0]); i++) {
        kit_shape s = test_shape(k[i].b, k[i].hq, k[i].hkv, k[i].sq, k[i].sk, k[i].d, dt);
        s.odd_out = 1;
        s.varlen = s.causal = k[i].varlen_causal;
        s.layout = k[i].layout;
        run(r, k[i].tag, &s, 140 + (uint64_t)i);
    }
}

/* Named edge cases: odd sizes, sq != sk both ways under causal, windows that
 * empty whole rows, empty varlen sequences, large logits, unsupported dims. */
static void edge_cases(runner *r)
{
    for (int t = 0; t < 2; t++) {
        const fc_dtype dt = t ? FC_DTYPE_BF16 : FC_DTYPE_F16;
        kit_shape s;
        s = test_shape(2, 4, 4, 1, 1, 64, dt);
        run(r, "edge:s1", &s, 101);
        s = test_shape(1, 2, 2, 17, 4097, 128, dt);
        run(r, "edge:s17/4097", &s, 102);
        s = test_shape(1, 2, 1, 4097, 17, 64, dt);
        s.causal = 1;
        run(r, "edge:causal-s4097/17(empty rows)", &s, 103);
        s = test_shape(1, 2, 2, 1000, 1000, 96, dt);
        s.causal = 1;
        s.layout = KIT_LAYOUT_PADDED;
        run(r, "edge:causal-s1000", &s, 104);
        s = test_shape(1, 2, 2, 1000, 4097, 32, dt);
        s.causal = 1;
        s.window_left = 100;
        run(r, "edge:local-s1000/4097", &s, 105);
        s = test_shape(1, 4, 2, 160, 40, 64, dt);
        s.window_left = 3;
        s.window_right = 5;
        run(r, "edge:window(3,5)-empty-rows", &s, 106);
        s = test_shape(2, 4, 4, 200, 200, 256, dt);
        s.window_left = 0;
        s.window_right = 0;
        run(r, "edge:window(0,0)", &s, 107);
        s = test_shape(7, 8, 2, 150, 300, 128, dt);
        s.varlen = 1;
        s.causal = 1;
        run(r, "edge:varlen-empty-seqs", &s, 108);
        s = test_shape(1, 4, 2, 96, 96, 64, dt);
        s.input_scale = 100.0f;
        run(r, "edge:large-logits", &s, 109);
        s = test_shape(1, 4, 4, 96, 96, 128, dt);
        s.scale = 1000.0f;
        s.causal = 1;
        s.softcap = 30.0f;
        run(r, "edge:scale1000-softcap", &s, 110);
        /* the edges of the accepted scale/softcap ranges (constants.h): every
         * fp32 intermediate finite, the capped logits within the gates. Scale
         * 1e5 and 1e6 on unit inputs: |logit| * log2 e up to ~2^22 and ~2^26,
         * the softmax an argmax, inside the kernels' range (docs/API.md: the
         * rounding of max * c must not push the row's largest term past f16;
         * scale 1e7, ~2^29, did). At scale 1e25 the q.k of inputs * 1e-13
         * (bf16 only: f16 cannot hold them) keeps the logits moderate. */
        static const struct { const char *tag; float scale, softcap; int causal; float in; } ranges[] = {
            {"edge:scale1e5", 1e5f, 0.0f, 0, 0.0f},
            {"edge:scale1e6", 1e6f, 0.0f, 1, 0.0f},
            {"edge:scale1e25-inputs1e-13", 1e25f, 0.0f, 0, 1e-13f},
            {"edge:scale1e-25-causal", 1e-25f, 0.0f, 1},
            {"edge:softcap1e3-scale100", 100.0f, 1e3f, 0},
            {"edge:softcap1e3-scale-1e-25", -1e-25f, 1e3f, 0},
            {"edge:softcap1e-13-scale1e25", 1e25f, 1e-13f, 1},
        };
        for (int j = 0; j < 7; j++) {
            if (ranges[j].in > 0.0f && dt == FC_DTYPE_F16) continue;
            s = test_shape(2, 4, 2, 96, 300, 64 << (j & 1), dt); /* head dims 64, 128 in turn */
            s.input_scale = ranges[j].in;
            s.scale = ranges[j].scale;
            s.softcap = ranges[j].softcap;
            s.causal = ranges[j].causal;
            run(r, ranges[j].tag, &s, 120 + (uint64_t)j);
        }
        s = test_shape(4, 32, 8, 1, 4097, 128, dt);
        run(r, "edge:gqa-decode", &s, 111);
        s = test_shape(3, 16, 1, 3, 2048, 64, dt);
        s.causal = 1;
        s.layout = KIT_LAYOUT_BHSD;
        run(r, "edge:mqa-decode-causal", &s, 112);
        s = test_shape(1, 2, 2, 64, 64, 80, dt); /* no kernel has d80: UNSUPPORTED, never wrong */
        run(r, "edge:d80-unsupported", &s, 113);
        odd_out_cases(r, dt);
        /* More causal tiles than SMs (132 on H100/H200): the sm90 path's
         * dynamic tile scheduler with its tile ring; one dtype per dim keeps
         * the host reference affordable. */
        static const int many_tile_dims[2][2] = {{64, 192}, {128, 256}};
        for (int j = 0; j < 2; j++) {
            s = test_shape(1, 40, 40, 512, 512, many_tile_dims[t][j], dt);
            s.causal = 1;
            run(r, "edge:causal-many-tiles", &s, 114 + j);
        }
    }
}

/* Varlen with +inf in the NEXT sequence's V rows: a key block that runs past
 * a sequence's end holds the next sequence's first keys, and 0 * inf is NaN,
 * so a kernel must not let them into P V. The sm80 path zero-fills them
 * (cp.async rows) or zeroes them in shared memory (kVarTma rows), the Hopper
 * path zeroes them in shared memory (zero_v_tail); sequence 0's rows must
 * come out finite and within the gate on both. Sequence 0 has 70 keys, so
 * its last block runs past its end for every block_n. */
static void varlen_next_inf(runner *r)
{
    static const int dims[] = {64, 128, 256};
    for (int di = 0; di < 3; di++) {
        if (g_only_dim && dims[di] != g_only_dim) continue;
        kit_shape s = test_shape(2, 2, 2, 70, 70, dims[di], FC_DTYPE_BF16);
        s.varlen = 1;
        kit_case c;
        int found = 0;
        for (uint64_t seed = 300; seed < 340 && !found; seed++) { /* sequence 1 must have keys */
            if (kit_case_init(&c, &s, seed) != 0) break;
            if (c.cu_k[2] > c.cu_k[1]) found = 1;
            else kit_case_free(&c);
        }
        if (!found) {
            g_fail++;
            printf("FAIL varlen-next-inf d%d: no case with keys in sequence 1\n", dims[di]);
            continue;
        }
        const fc_tensor *vt = &c.args.v, *ot = &c.args.out;
        for (int64_t j = c.cu_k[1]; j < c.cu_k[2]; j++)
            for (int64_t h = 0; h < vt->shape[1]; h++)
                for (int64_t x = 0; x < vt->shape[2]; x++)
                    kit_store(c.v, s.dtype, j * vt->stride[0] + h * vt->stride[1] + x, INFINITY);
        void *ref = malloc(c.out_bytes), *out = malloc(c.out_bytes);
        float *ref_lse = malloc(c.lse_bytes), *lse = malloc(c.lse_bytes);
        dev_case d;
        char err[600];
        if (!ref || !out || !ref_lse || !lse || test_reference(r->ctx, &c, ref, ref_lse) != FC_OK ||
            dev_upload(&c, &d, err, sizeof err) != 0) {
            g_fail++;
            printf("FAIL varlen-next-inf d%d: set-up (memory, reference or upload)\n", dims[di]);
            free(ref); free(out); free(ref_lse); free(lse);
            kit_case_free(&c);
            continue;
        }
        const kit_gate g = kit_gate_for(s.dtype);
        for (int pi = 0; pi < r->npaths; pi++) {
            const int path = r->paths[pi];
            if (!r->path_ok[pi]) {
                tu_note_skip(r->path_why[pi]);
                continue;
            }
            fc_context_set_cuda_path(r->ctx, path);
            fc_kernel_info info;
            fc_status st = dev_run(r->ctx, &c, &d, r->streams[0], out, lse, &info, err, sizeof err);
            fc_context_set_cuda_path(r->ctx, 0);
            if (st != FC_OK) {
                g_fail++;
                printf("FAIL varlen-next-inf path%d d%d: %s\n", path, dims[di], err);
                continue;
            }
            int64_t nonfinite = 0;
            double max_abs = 0;
            for (int64_t i = 0; i < c.cu_q[1]; i++)
                for (int64_t h = 0; h < ot->shape[1]; h++)
                    for (int64_t x = 0; x < ot->shape[2]; x++) {
                        const int64_t idx = i * ot->stride[0] + h * ot->stride[1] + x;
                        const double o = kit_load(out, s.dtype, idx), e = kit_load(ref, s.dtype, idx);
                        if (!isfinite(o)) nonfinite++;
                        else if (fabs(o - e) > max_abs) max_abs = fabs(o - e);
                    }
            const int ok = nonfinite == 0 && max_abs <= g.max_abs;
            if (ok) g_pass++;
            else g_fail++;
            if (!ok || g_verbose)
                printf("%s varlen-next-inf path%d d%d [%s]: sequence 0 (%d rows) nonfinite %lld max_abs %.2e\n",
                       ok ? "PASS" : "FAIL", path, dims[di], info.name, c.cu_q[1], (long long)nonfinite, max_abs);
        }
        dev_free(&d);
        free(ref); free(out); free(ref_lse); free(lse);
        kit_case_free(&c);
    }
}

/* --quick: every (dtype, head_dim) with each kernel variant, small sizes. */
/* scale < 0 without softcap: FC_ERR_UNSUPPORTED on every path (the planners
 * refuse it: the kernels take exponents against the largest raw score),
 * out and lse untouched. */
static void negative_scale(runner *r)
{
    kit_shape s = test_shape(1, 2, 2, 40, 50, 64, FC_DTYPE_F16);
    s.scale = -0.5f;
    kit_case c;
    dev_case d;
    char err[300];
    if (kit_case_init(&c, &s, 131) != 0) { CHECK(0, "negative scale: kit_case_init"); return; }
    kit_poison(c.out, c.out_bytes, s.dtype, c.lse, c.lse_bytes);
    if (dev_upload(&c, &d, err, sizeof err) != 0) {
        CHECK(0, "negative scale: %s", err);
        kit_case_free(&c);
        return;
    }
    const int paths[3] = {0, 80, 90};
    for (int i = 0; i < 3; i++) {
        fc_context_set_cuda_path(r->ctx, paths[i]);
        fc_status st = fc_attention_forward(r->ctx, &d.args, NULL, NULL);
        CHECK(st == FC_ERR_UNSUPPORTED && strstr(fc_last_error(r->ctx), "scale"),
              "negative scale on path %d: %s (%s)", paths[i], fc_status_string(st), fc_last_error(r->ctx));
    }
    fc_context_set_cuda_path(r->ctx, 0);
    void *out = malloc(c.out_bytes);
    CHECK(out && cudaMemcpy(out, d.out, c.out_bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
              memcmp(out, c.out, c.out_bytes) == 0,
          "negative scale: out was written by a failing call");
    free(out);
    dev_free(&d);
    kit_case_free(&c);
}

/* An FP8 K/V cache under f16/bf16 q (kVarKv8 rows, path 80; path 90
 * refuses them, a skip): both FP8 types, both head dims, descales none, per
 * tensor and per (batch, kv head); decode with GQA packing and split-KV,
 * paged, varlen, causal, windows, softcap, BHSD and padded layouts. */
static void fp8_kv_cases(runner *r, int quick)
{
    static const int dims[] = {64, 128};
    for (int n = 0; n < (quick ? 8 : 24); n++) {
        const fc_dtype dt = n & 1 ? FC_DTYPE_BF16 : FC_DTYPE_F16;
        const int d = dims[(n >> 1) & 1], kind = (n >> 2) % 6;
        kit_shape s = test_shape(2, 8, 2, 1, 1500, d, dt);
        s.fp8_kv = n % 3 ? FC_DTYPE_E4M3 : FC_DTYPE_E5M2;
        s.descale = n % 4; /* 3: zero and negative descales, and a key tail (1500 % 64) */
        if (kind == 1) { s.page_size = 16 << (n % 3); s.seqused = KIT_SEQUSED_RANDOM; s.seqlen_q = 4; s.causal = 1; }
        if (kind == 2) { s.batch = 5; s.varlen = 1; s.seqlen_q = 77; s.seqlen_k = 300; s.causal = 1; }
        if (kind == 3) { s = test_shape(1, 4, 4, 130, 200, d, dt); s.fp8_kv = FC_DTYPE_E4M3; s.descale = 2;
                         s.window_left = 50; s.softcap = 15.0f; s.layout = KIT_LAYOUT_BHSD; }
        if (kind == 4) { s.batch = 4; s.heads_q = 32; s.heads_kv = 8; s.seqlen_k = 4096; s.layout = KIT_LAYOUT_BHSD; }
        if (kind == 5) { s.page_size = 64; s.seqused = KIT_SEQUSED_FEW; s.seqlen_q = 2; s.heads_q = 2; s.heads_kv = 2; }
        char tag[48];
        snprintf(tag, sizeof tag, "fp8kv#%d ds%d%s", n, s.descale, s.page_size ? " paged" : "");
        run(r, tag, &s, 700 + (uint64_t)n);
    }
}

/* What the CUDA backend refuses of FP8 today, with FC_ERR_UNSUPPORTED and
 * a reason: FP8 q, the amax outputs, FP8 K/V on the sm90 path and at a
 * head dim without kVarKv8 rows. */
static void fp8_refusals(fc_context *ctx)
{
    const int p0 = g_pass, f0 = g_fail;
    struct { const char *what; fc_dtype q, kv; int d, path, amax; const char *msg; } k[] = {
        {"FP8 q", FC_DTYPE_E4M3, FC_DTYPE_E4M3, 128, 0, 0, "dtype e4m3 (q) is not supported by the cuda"},
        {"amax outputs", FC_DTYPE_BF16, FC_DTYPE_E4M3, 128, 0, 1, "amax"},
        {"FP8 k/v on path 90", FC_DTYPE_F16, FC_DTYPE_E5M2, 128, 90, 0, "sm80 path takes them"},
        {"FP8 k/v at d96", FC_DTYPE_BF16, FC_DTYPE_E4M3, 96, 80, 0, "head_dim 96 with FP8"},
        {"FP8 k/v, 8-byte strides", FC_DTYPE_F16, FC_DTYPE_E4M3, 64, 80, 0, "not a multiple of 16"},
    };
    for (int i = 0; i < 5; i++) {
        kit_shape s = test_shape(2, 4, 2, 1, 300, k[i].d, k[i].q);
        if (i == 4) s.layout = KIT_LAYOUT_PADDED; /* rows 72 elements apart */
        if (k[i].q == FC_DTYPE_E4M3) s.fp8_out = FC_DTYPE_BF16;
        else s.fp8_kv = k[i].kv;
        kit_case c;
        dev_case d;
        char err[300];
        float *amax = NULL;
        if (kit_case_init(&c, &s, 9) || dev_upload(&c, &d, err, sizeof err)) {
            CHECK(0, "%s: setup failed", k[i].what);
            continue;
        }
        if (k[i].amax && cudaMalloc((void **)&amax, 2 * sizeof(float)) == cudaSuccess) {
            d.args.out_amax = amax;
            d.args.p_amax = amax + 1;
        }
        fc_context_set_cuda_path(ctx, k[i].path);
        const fc_status st = fc_attention_supported(ctx, &d.args, NULL);
        CHECK(st == FC_ERR_UNSUPPORTED && strstr(fc_last_error(ctx), k[i].msg), "%s: %s (%s)", k[i].what,
              fc_status_string(st), fc_last_error(ctx));
        fc_context_set_cuda_path(ctx, 0);
        cudaFree(amax);
        dev_free(&d);
        kit_case_free(&c);
    }
    group_done("cuda FP8 refusals", p0, f0);
}

/* An f32 out of bf16 inputs, which the CPU backends write: the CUDA
 * kernels write q's dtype, so FC_ERR_UNSUPPORTED with that reason. */
static void wide_out_refused(fc_context *ctx)
{
    const int p0 = g_pass, f0 = g_fail;
    kit_shape s = test_shape(1, 2, 2, 64, 64, 64, FC_DTYPE_BF16);
    kit_case c;
    dev_case d;
    char err[300];
    if (kit_case_init(&c, &s, 11) || dev_upload(&c, &d, err, sizeof err)) {
        CHECK(0, "f32 out: setup failed");
        return;
    }
    /* A buffer of its own: the bf16 one read as f32 would run into lse. */
    const fc_tensor *o = &d.args.out;
    int64_t extent = 1;
    for (int i = 0; i < 4; i++) extent += (o->shape[i] - 1) * o->stride[i];
    float *wide = NULL;
    if (cudaMalloc((void **)&wide, (size_t)extent * sizeof(float)) != cudaSuccess) {
        CHECK(0, "f32 out: cudaMalloc failed");
    } else {
        d.args.out.data = wide;
        d.args.out.dtype = FC_DTYPE_F32;
        const fc_status st = fc_attention_supported(ctx, &d.args, NULL);
        CHECK(st == FC_ERR_UNSUPPORTED && strstr(fc_last_error(ctx), "write q's dtype"), "f32 out of bf16: %s (%s)",
              fc_status_string(st), fc_last_error(ctx));
        cudaFree(wide);
    }
    dev_free(&d);
    kit_case_free(&c);
    group_done("cuda f32 out refused", p0, f0);
}

static void quick_cases(runner *r)
{
    static const int dims[] = {32, 64, 96, 128, 192, 256};
    for (int t = 0; t < 2; t++)
        for (int di = 0; di < 6; di++) {
            const fc_dtype dt = t ? FC_DTYPE_BF16 : FC_DTYPE_F16;
            const int d = dims[di];
            kit_shape s = test_shape(2, 2, 2, 130, 77, d, dt);
            run(r, "quick:plain", &s, 201);
            /* Several KV blocks and 12+ tiles: what a small grid
             * (sm90_grid in gpu-check's cache file) splits by tail balancing. */
            s = test_shape(2, 3, 3, 200, 300, d, dt);
            run(r, "quick:plain-long-kv", &s, 206);
            s.odd_out = 1; /* the same with 2-byte aligned O rows (element stores) */
            run(r, "quick:odd-out-long-kv", &s, 207);
            s = test_shape(3, 4, 2, 3, 532, d, dt); /* split-KV: the combine's stores */
            s.odd_out = 1;
            run(r, "quick:odd-out-split", &s, 208);
            s = test_shape(4, 4, 2, 70, 150, d, dt);
            s.causal = 1;
            s.varlen = 1;
            s.want_lse = 0;
            run(r, "quick:causal-varlen", &s, 202);
            s = test_shape(1, 2, 1, 100, 180, d, dt);
            s.window_left = 40;
            s.window_right = 7;
            s.softcap = 20.0f;
            s.layout = KIT_LAYOUT_PADDED;
            run(r, "quick:window-softcap-padded", &s, 203);
            s = test_shape(2, 8, 2, 1, 1100, d, dt);
            s.layout = KIT_LAYOUT_BHSD;
            run(r, "quick:decode-pack-split", &s, 204);
            s = test_shape(1, 140, 140, 128, 128, d, dt); /* > 132 causal tiles: dynamic scheduler */
            s.causal = 1;
            run(r, "quick:causal-many-tiles", &s, 205);
        }
}

static void usage(void)
{
    fprintf(stderr, "usage: test_cuda_forward [--quick] [--cases N] [--seed S] [--path 80|90] [--head-dim D] "
                    "[--verbose]\n");
}

int main(int argc, char **argv)
{
    int quick = 0, ncases = 300, only_path = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--verbose")) g_verbose = 1;
        else if (!strcmp(argv[i], "--cases") && i + 1 < argc) ncases = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) g_only_dim = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--path") && i + 1 < argc) {
            only_path = atoi(argv[++i]);
            if (only_path != 80 && only_path != 90) { usage(); return 2; }
        } else { usage(); return 2; }
    }

    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) {
        printf("FAIL fc_context_create\n0 passed, 1 failed\n");
        return 1;
    }
    /* gpu-check forces rows and hooks through a FLASHCORE_TUNING_CACHE file */
    if (kit_tuning_from_env(ctx) != FC_OK) {
        printf("FAIL FLASHCORE_TUNING_CACHE or FLASHCORE_SM90_TRACE_FILE\n0 passed, 1 failed\n");
        fc_context_free(ctx);
        return 1;
    }
    if (!tu_cuda_device(ctx)) {
        fc_context_free(ctx);
        return 77;
    }

    tcu_paths pp;
    tcu_probe_paths(ctx, only_path, &pp);

    runner r;
    memset(&r, 0, sizeof r);
    r.ctx = ctx;
    r.paths = pp.path;
    r.npaths = pp.n;
    r.path_ok = pp.ok;
    r.path_why = (const char(*)[200])pp.why;
    r.streams[0] = NULL; /* the legacy default stream */
    if (cudaStreamCreateWithFlags(&r.streams[1], cudaStreamNonBlocking) != cudaSuccess) {
        printf("FAIL cudaStreamCreate\n0 passed, 1 failed\n");
        return 1;
    }

    const double t0 = kit_now();
    fp8_refusals(ctx);
    wide_out_refused(ctx);
    fp8_kv_cases(&r, quick);
    if (quick) {
        quick_cases(&r);
    } else {
        edge_cases(&r);
        negative_scale(&r);
        varlen_next_inf(&r);
        uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 7;
        for (int n = 0; n < ncases; n++) {
            kit_shape s = random_shape(&rng);
            char tag[48];
            snprintf(tag, sizeof tag, "random#%d", n);
            run(&r, tag, &s, seed * 100000 + (uint64_t)n);
        }
    }
    cudaStreamDestroy(r.streams[1]);
    fc_context_free(ctx);

    printf("(%.1f s)\n", kit_now() - t0);
    tu_print_skips();
    return test_summary();
}
#endif
