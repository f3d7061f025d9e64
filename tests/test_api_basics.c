/*
 * test_api_basics.c -- the small promises of the public header: version
 * macros and calls agree, build info and status strings, context lifetime,
 * argument defaults, supported() and forward() naming the same kernel, the
 * last-error life cycle, AUTO on host memory, empty varlen problems, and
 * fc_cuda_available() as a plain 0/1.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_util.h"

static void test_version(void)
{
    int p0 = g_pass, f0 = g_fail;
    CHECK(fc_version_number() == FLASHCORE_VERSION_NUMBER, "fc_version_number %u != macro %u",
          fc_version_number(), (unsigned)FLASHCORE_VERSION_NUMBER);
    CHECK(FLASHCORE_VERSION_NUMBER ==
              FLASHCORE_VERSION_MAJOR * 10000 + FLASHCORE_VERSION_MINOR * 100 + FLASHCORE_VERSION_PATCH,
          "FLASHCORE_VERSION_NUMBER does not match MAJOR/MINOR/PATCH");
    const char *vs = fc_version_string();
    CHECK(vs && strcmp(vs, FLASHCORE_VERSION_STRING) == 0, "fc_version_string '%s' != macro '%s'",
          vs ? vs : "(null)", FLASHCORE_VERSION_STRING);
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", FLASHCORE_VERSION_MAJOR, FLASHCORE_VERSION_MINOR,
             FLASHCORE_VERSION_PATCH);
    CHECK(strcmp(FLASHCORE_VERSION_STRING, expect) == 0, "version string '%s' != '%s'",
          FLASHCORE_VERSION_STRING, expect);
    CHECK(fc_version_string() == vs, "fc_version_string is not static storage");

    const char *bi = fc_build_info();
    CHECK(bi && bi[0], "fc_build_info is empty");
    CHECK(bi && strstr(bi, FLASHCORE_VERSION_STRING), "fc_build_info '%s' lacks the version", bi ? bi : "");
    CHECK(fc_build_info() == bi, "fc_build_info is not static storage");
    group_done("version/build info", p0, f0);
}

static void test_status_strings(void)
{
    int p0 = g_pass, f0 = g_fail;
    static const struct {
        fc_status st;
        int value;
        const char *name;
    } k[] = {
        {FC_OK, 0, "FC_OK"},
        {FC_ERR_INVALID_ARGUMENT, 1, "FC_ERR_INVALID_ARGUMENT"},
        {FC_ERR_UNSUPPORTED, 2, "FC_ERR_UNSUPPORTED"},
        {FC_ERR_OUT_OF_MEMORY, 3, "FC_ERR_OUT_OF_MEMORY"},
        {FC_ERR_CUDA, 4, "FC_ERR_CUDA"},
        {FC_ERR_NO_DEVICE, 5, "FC_ERR_NO_DEVICE"},
        {FC_ERR_INTERNAL, 6, "FC_ERR_INTERNAL"},
    };
    const int n = (int)(sizeof k / sizeof k[0]);
    for (int i = 0; i < n; i++) {
        CHECK((int)k[i].st == k[i].value, "%s has value %d, pinned %d", k[i].name, (int)k[i].st, k[i].value);
        const char *s = fc_status_string(k[i].st);
        CHECK(s && strncmp(s, k[i].name, strlen(k[i].name)) == 0, "fc_status_string(%d) = '%s', want '%s...'",
              k[i].value, s ? s : "(null)", k[i].name);
        /* the name must be followed by the description, not a longer name */
        CHECK(s && (s[strlen(k[i].name)] == ':' || s[strlen(k[i].name)] == 0),
              "fc_status_string(%d) = '%s'", k[i].value, s ? s : "(null)");
        for (int j = 0; j < i; j++)
            CHECK(strcmp(s, fc_status_string(k[j].st)) != 0, "status %d and %d share a string", i, j);
    }
    const int unknown[] = {7, 8, 100, -1, 1 << 30};
    for (int i = 0; i < 5; i++) {
        const char *s = fc_status_string((fc_status)unknown[i]);
        CHECK(s && strcmp(s, "unknown status") == 0, "fc_status_string(%d) = '%s'", unknown[i],
              s ? s : "(null)");
    }
    /* pinned enum values of the other public enums */
    CHECK(FC_DTYPE_F32 == 0 && FC_DTYPE_F16 == 1 && FC_DTYPE_BF16 == 2 && FC_DTYPE_E4M3 == 3 &&
              FC_DTYPE_E5M2 == 4 && FC_DTYPE_F64 == 5, "fc_dtype values moved");
    CHECK(FC_BACKEND_AUTO == 0 && FC_BACKEND_CPU == 1 && FC_BACKEND_CUDA == 2 &&
              FC_BACKEND_CPU_REFERENCE == 3, "fc_backend values moved");
    group_done("status strings", p0, f0);
}

static void test_context_lifetime(void)
{
    int p0 = g_pass, f0 = g_fail;
    fc_context_free(NULL); /* must be a no-op */
    CHECK(1, "fc_context_free(NULL)");
    CHECK(fc_context_create(NULL) == FC_ERR_INVALID_ARGUMENT, "fc_context_create(NULL) not invalid");
    fc_context *a = NULL, *b = NULL;
    CHECK(fc_context_create(&a) == FC_OK && a, "fc_context_create failed");
    CHECK(fc_context_create(&b) == FC_OK && b && b != a, "second context not distinct");
    if (a) CHECK(strcmp(fc_last_error(a), "") == 0, "new context has error '%s'", fc_last_error(a));
    const char *nm = fc_last_error(NULL);
    CHECK(nm && nm[0], "fc_last_error(NULL) is empty");
    /* valid settings are accepted */
    if (a) {
        CHECK(fc_context_set_num_threads(a, 0) == FC_OK, "set_num_threads(0)");
        CHECK(fc_context_set_num_threads(a, 3) == FC_OK, "set_num_threads(3)");
        CHECK(fc_context_set_device(a, -1) == FC_OK, "set_device(-1)");
        CHECK(fc_context_set_device(a, 0) == FC_OK, "set_device(0)");
        CHECK(fc_context_set_cuda_path(a, 0) == FC_OK, "set_cuda_path(0)");
        CHECK(fc_context_set_cuda_path(a, 80) == FC_OK, "set_cuda_path(80)");
        CHECK(fc_context_set_cuda_path(a, 90) == FC_OK, "set_cuda_path(90)");
        CHECK(fc_context_set_cuda_path(a, 0) == FC_OK, "set_cuda_path(0) again");
        CHECK(fc_context_set_check_device_arrays(a, 0) == FC_OK, "set_check_device_arrays(0)");
        CHECK(fc_context_set_check_device_arrays(a, 1) == FC_OK, "set_check_device_arrays(1)");
        /* a setter's error is per context */
        CHECK(fc_context_set_num_threads(a, -1) == FC_ERR_INVALID_ARGUMENT, "set_num_threads(-1)");
        CHECK(fc_last_error(a)[0] != 0, "no message after a rejected setter");
        if (b) CHECK(fc_last_error(b)[0] == 0, "error leaked into another context: '%s'", fc_last_error(b));
    }
    fc_context_free(a);
    fc_context_free(b);
    group_done("context lifetime", p0, f0);
}

/* The experimental tuning hooks: defaults, range checks naming the field, a
 * copied trace-file string, and the table rows they index. */
static void test_tuning(void)
{
    int p0 = g_pass, f0 = g_fail;
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) { CHECK(0, "fc_context_create"); return; }
    fc_tuning t, got;
    fc_tuning_init(&t);
    CHECK(t.sm90_config == -1 && t.sm80_config == -1 && t.sm90_rotate == -1 && t.sm90_tail == -1 &&
              t.sm90_grid == 0 && t.splits == 0 && t.pdl == -1 && t.sm80_bwd_config == -1 && t.sm90_bwd_config == -1 &&
              t.masks == -1 &&
              t.sm90_trace_file == NULL,
          "fc_tuning_init defaults");
    CHECK(fc_context_get_tuning(ctx, &got) == FC_OK && !memcmp(&got, &t, sizeof t), "new context: defaults");
    CHECK(fc_context_set_tuning(ctx, NULL) == FC_ERR_INVALID_ARGUMENT, "set_tuning(NULL)");
    CHECK(fc_context_set_tuning(NULL, &t) == FC_ERR_INVALID_ARGUMENT, "set_tuning(ctx NULL)");
    char file[32] = "/tmp/trace.bin";
    t.splits = 3;
    t.pdl = 0;
    t.sm90_grid = 5;
    t.sm90_trace_file = file;
    CHECK(fc_context_set_tuning(ctx, &t) == FC_OK, "set_tuning: %s", fc_last_error(ctx));
    file[0] = 'X'; /* the context holds its own copy */
    CHECK(fc_context_get_tuning(ctx, &got) == FC_OK && got.splits == 3 && got.pdl == 0 && got.sm90_grid == 5 &&
              got.sm90_trace_file && !strcmp(got.sm90_trace_file, "/tmp/trace.bin"),
          "get_tuning returns what was set");
    const struct { const char *field; int32_t *v; int32_t bad; } bad[] = {
        {"splits", &t.splits, 65}, {"pdl", &t.pdl, 2}, {"sm90_rotate", &t.sm90_rotate, -2},
        {"sm90_tail", &t.sm90_tail, 2}, {"sm90_grid", &t.sm90_grid, -1}, {"sm80_config", &t.sm80_config, 10000},
        {"sm90_config", &t.sm90_config, -2}, {"sm80_bwd_config", &t.sm80_bwd_config, 10000},
        {"sm90_bwd_config", &t.sm90_bwd_config, 10000}, {"sm90_bwd_config", &t.sm90_bwd_config, -2},
        {"masks", &t.masks, 3}, {"masks", &t.masks, -2},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fc_tuning_init(&t);
        *bad[i].v = bad[i].bad;
        CHECK(fc_context_set_tuning(ctx, &t) == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), bad[i].field),
              "tuning.%s = %d rejected by name ('%s')", bad[i].field, (int)bad[i].bad, fc_last_error(ctx));
    }
    CHECK(fc_context_get_tuning(ctx, &got) == FC_OK && got.splits == 3, "a rejected tuning changes nothing");
    fc_tile_row row;
    CHECK(fc_tuning_row_info(70, 0, &row) == FC_ERR_INVALID_ARGUMENT, "row_info: path 70");
    CHECK(fc_tuning_row_info(80, -1, &row) == FC_ERR_INVALID_ARGUMENT, "row_info: index -1");
    CHECK(fc_tuning_row_info(80, 0, NULL) == FC_ERR_INVALID_ARGUMENT, "row_info: row NULL");
    CHECK(fc_tuning_bwd_row_info(70, 0, &row) == FC_ERR_INVALID_ARGUMENT, "bwd_row_info: path 70");
    CHECK(fc_tuning_bwd_row_info(80, 0, NULL) == FC_ERR_INVALID_ARGUMENT, "bwd_row_info: row NULL");
    /* the forward tables (path 80, 90), then the backward's (80, 90) */
    for (int k = 0; k < 4; k++) {
        const int path = k % 2 ? 90 : 80, bwd = k >= 2;
        int32_t *field = path == 90 ? (bwd ? &t.sm90_bwd_config : &t.sm90_config)
                                    : (bwd ? &t.sm80_bwd_config : &t.sm80_config);
        int n = 0;
        while ((bwd ? fc_tuning_bwd_row_info(path, n, &row) : fc_tuning_row_info(path, n, &row)) == FC_OK) {
            CHECK(row.head_dim > 0 && row.block_m > 0 && row.block_n > 0 && row.threads > 0 &&
                      row.kernel >= 0 && row.kernel <= n,
                  "path %d%s row %d: sane fields", path, bwd ? " bwd" : "", n);
            n++;
        }
        /* the last valid row can be forced, one past it cannot */
        fc_tuning_init(&t);
        *field = n - 1;
        CHECK(fc_context_set_tuning(ctx, &t) == FC_OK, "path %d%s: row %d accepted", path, bwd ? " bwd" : "", n - 1);
        *field = n;
        CHECK(fc_context_set_tuning(ctx, &t) == FC_ERR_INVALID_ARGUMENT, "path %d%s: row %d rejected", path,
              bwd ? " bwd" : "", n);
    }
    fc_context_free(ctx);
    group_done("tuning hooks", p0, f0);
}

static int tensor_is_empty(const fc_tensor *t)
{
    static const fc_tensor zero;
    return memcmp(t, &zero, sizeof zero) == 0;
}

static void test_args_init(void)
{
    int p0 = g_pass, f0 = g_fail;
    fc_attention_args a;
    memset(&a, 0xA5, sizeof a); /* garbage everywhere: init must set every field */
    fc_attention_args_init(&a);
    CHECK(tensor_is_empty(&a.q) && tensor_is_empty(&a.k) && tensor_is_empty(&a.v) &&
              tensor_is_empty(&a.out) && tensor_is_empty(&a.lse),
          "tensors are not zeroed (data NULL) by fc_attention_args_init");
    CHECK(a.scale == 0.0f, "scale %g", (double)a.scale);
    CHECK(a.softcap == 0.0f, "softcap %g", (double)a.softcap);
    CHECK(a.causal == 0, "causal %d", (int)a.causal);
    CHECK(a.window_left == -1 && a.window_right == -1, "windows (%d, %d)", (int)a.window_left,
          (int)a.window_right);
    CHECK(a.cu_seqlens_q == NULL && a.cu_seqlens_k == NULL, "cu_seqlens not NULL");
    CHECK(a.num_seqs == 0 && a.max_seqlen_q == 0 && a.max_seqlen_k == 0, "varlen fields not 0");
    CHECK(a.backend == FC_BACKEND_AUTO, "backend %d", (int)a.backend);
    CHECK(a.q_descale.data == NULL && a.k_descale.data == NULL && a.v_descale.data == NULL, "descales not NULL");
    CHECK(a.q_descale.batch_stride == 0 && a.k_descale.head_stride == 0, "descale strides not 0");
    CHECK(a.out_amax == NULL && a.p_amax == NULL, "amax outputs not NULL");
    group_done("fc_attention_args_init", p0, f0);
}

static kit_shape small_shape(fc_dtype dt, int varlen)
{
    kit_shape s = test_shape(varlen ? 4 : 2, 4, 2, 9, 13, 32, dt);
    s.varlen = varlen;
    return s;
}

static int same_info(const fc_kernel_info *x, const fc_kernel_info *y)
{
    return x->backend == y->backend && strcmp(x->name, y->name) == 0 && x->num_splits == y->num_splits &&
           x->workspace_bytes == y->workspace_bytes;
}

/* supported() and forward() name the same kernel; a success clears the last
 * error; AUTO on host memory is the CPU backend; forward computes the right
 * thing (checked against the reference with the project's gates). */
static void test_supported_matches_forward(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    static const fc_dtype dts[] = {FC_DTYPE_F32, FC_DTYPE_F16, FC_DTYPE_BF16};
    static const fc_backend bks[] = {FC_BACKEND_CPU, FC_BACKEND_CPU_REFERENCE, FC_BACKEND_AUTO};
    static const char *const bnames[] = {"CPU", "CPU_REFERENCE", "AUTO"};
    for (int varlen = 0; varlen < 2; varlen++)
        for (int di = 0; di < 3; di++) {
            kit_shape s = small_shape(dts[di], varlen);
            kit_case c, ref;
            if (kit_case_init(&c, &s, 40 + di + 3 * varlen) || kit_case_init(&ref, &s, 40 + di + 3 * varlen)) {
                CHECK(0, "kit_case_init failed");
                return;
            }
            ref.args.backend = FC_BACKEND_CPU_REFERENCE;
            CHECK(fc_attention_forward(ctx, &ref.args, NULL, NULL) == FC_OK, "reference failed: %s",
                  fc_last_error(ctx));
            for (int bi = 0; bi < 3; bi++) {
                char what[96];
                snprintf(what, sizeof what, "[%s] %s%s", bnames[bi], kit_dtype_name(s.dtype),
                         varlen ? " varlen" : "");
                fc_attention_args a = c.args;
                a.backend = bks[bi];
                const fc_backend expect = bks[bi] == FC_BACKEND_AUTO ? FC_BACKEND_CPU : bks[bi];

                /* leave an error in the context first: each success must clear it */
                fc_attention_args bad = a;
                bad.causal = 5;
                CHECK(fc_attention_supported(ctx, &bad, NULL) == FC_ERR_INVALID_ARGUMENT, "%s: causal 5", what);
                fc_kernel_info si, fi;
                memset(&si, 0x5A, sizeof si);
                memset(&fi, 0x3C, sizeof fi);
                fc_status st = fc_attention_supported(ctx, &a, &si);
                CHECK(st == FC_OK, "%s: supported: %s", what, fc_last_error(ctx));
                CHECK(fc_last_error(ctx)[0] == 0, "%s: supported success left '%s'", what, fc_last_error(ctx));
                CHECK(fc_attention_supported(ctx, &a, NULL) == FC_OK, "%s: supported with info NULL", what);
                CHECK(si.backend == expect, "%s: supported picked backend %d, expected %d", what,
                      (int)si.backend, (int)expect);
                CHECK(si.name[0] != 0 && memchr(si.name, 0, sizeof si.name) != NULL, "%s: bad kernel name", what);
                CHECK(si.num_splits == 1, "%s: cpu num_splits %d", what, (int)si.num_splits);

                CHECK(fc_attention_supported(ctx, &bad, NULL) == FC_ERR_INVALID_ARGUMENT, "%s: causal 5", what);
                kit_poison(c.out, c.out_bytes, s.dtype, c.lse, c.lse_bytes);
                st = fc_attention_forward(ctx, &a, NULL, &fi);
                CHECK(st == FC_OK, "%s: forward: %s", what, fc_last_error(ctx));
                CHECK(fc_last_error(ctx)[0] == 0, "%s: forward success left '%s'", what, fc_last_error(ctx));
                CHECK(same_info(&si, &fi), "%s: supported says %d '%s' splits %d ws %lld, forward ran %d '%s' "
                      "splits %d ws %lld", what, (int)si.backend, si.name, (int)si.num_splits,
                      (long long)si.workspace_bytes, (int)fi.backend, fi.name, (int)fi.num_splits,
                      (long long)fi.workspace_bytes);
                kit_gate g = kit_gate_for(s.dtype);
                kit_metrics m;
                kit_compare(&c, c.out, c.lse, ref.out, ref.lse, &g, &m);
                CHECK(kit_gate_pass(&m, &g), "%s: result off: max_abs %.3g rel_l2 %.3g bad %.3g%% unwritten %lld "
                      "nonfinite %lld lse_bad %lld", what, m.max_abs, m.rel_l2, m.pct_bad,
                      (long long)m.unwritten, (long long)m.nonfinite, (long long)m.lse_bad);
                /* forward with info NULL */
                CHECK(fc_attention_forward(ctx, &a, NULL, NULL) == FC_OK, "%s: forward with info NULL", what);
            }
            /* the two CPU backends have different names */
            fc_kernel_info i1, i2;
            memset(&i1, 0, sizeof i1);
            memset(&i2, 0, sizeof i2);
            fc_attention_args a = c.args;
            a.backend = FC_BACKEND_CPU;
            fc_attention_supported(ctx, &a, &i1);
            a.backend = FC_BACKEND_CPU_REFERENCE;
            fc_attention_supported(ctx, &a, &i2);
            CHECK(strcmp(i1.name, i2.name) != 0, "CPU and CPU_REFERENCE share the name '%s'", i1.name);
            kit_case_free(&c);
            kit_case_free(&ref);
        }
    group_done("supported == forward", p0, f0);
}

/* The empty-varlen problems: EV_H heads of dim EV_D, EV_NSEQ sequences over
 * EV_TOK_K keys; q and out have room for EV_SLACK tokens. */
enum { EV_H = 2, EV_D = 8, EV_NSEQ = 3, EV_TOK_K = 6, EV_SLACK = 5 };

/* f32 varlen args over the buffers with total_q query tokens (lse not set). */
static void empty_varlen_args(fc_attention_args *a, float *q, float *k, float *v, float *out, int64_t total_q,
                              const int32_t *cu_q, const int32_t *cu_k, int32_t max_q)
{
    fc_attention_args_init(a);
    fc_tensor *ts[4] = {&a->q, &a->k, &a->v, &a->out};
    void *ptr[4] = {q, k, v, out};
    int64_t tok[4] = {total_q, EV_TOK_K, EV_TOK_K, total_q};
    for (int t = 0; t < 4; t++) {
        ts[t]->data = ptr[t];
        ts[t]->dtype = FC_DTYPE_F32;
        ts[t]->ndim = 3;
        ts[t]->shape[0] = tok[t]; ts[t]->shape[1] = EV_H; ts[t]->shape[2] = EV_D;
        ts[t]->stride[0] = EV_H * EV_D; ts[t]->stride[1] = EV_D; ts[t]->stride[2] = 1;
    }
    a->cu_seqlens_q = cu_q;
    a->cu_seqlens_k = cu_k;
    a->num_seqs = EV_NSEQ;
    a->max_seqlen_q = max_q;
    a->max_seqlen_k = 4;
}

/* Varlen problems without any query row: FC_OK, nothing written. */
static void test_empty_varlen(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    enum { H = EV_H, D = EV_D, NSEQ = EV_NSEQ, TOK_K = EV_TOK_K, SLACK = EV_SLACK };
    static const int32_t cu_q0[NSEQ + 1] = {0, 0, 0, 0};
    static const int32_t cu_k[NSEQ + 1] = {0, 2, 2, 6};
    /* q and out have SLACK tokens of room that no sequence owns: the call
     * must not write them either */
    float *q = malloc(sizeof(float) * SLACK * H * D), *k = malloc(sizeof(float) * TOK_K * H * D);
    float *v = malloc(sizeof(float) * TOK_K * H * D), *out = malloc(sizeof(float) * SLACK * H * D);
    float *lse = malloc(sizeof(float) * H * SLACK);
    float *out_copy = malloc(sizeof(float) * SLACK * H * D), *lse_copy = malloc(sizeof(float) * H * SLACK);
    if (!q || !k || !v || !out || !lse || !out_copy || !lse_copy) {
        CHECK(0, "out of host memory");
        goto done;
    }
    uint64_t rng = 99;
    for (int i = 0; i < SLACK * H * D; i++) q[i] = (float)kit_rand_normal(&rng);
    for (int i = 0; i < TOK_K * H * D; i++) k[i] = (float)kit_rand_normal(&rng), v[i] = (float)kit_rand_normal(&rng);

    /* [total_q] = 0 (an empty tensor), then total_q = SLACK with every
     * sequence empty, with max_seqlen_q 0 and with max_seqlen_q 4 */
    struct {
        const char *name;
        int64_t total_q;
        int32_t max_q;
        int with_lse;
    } cases[] = {
        {"total_q 0, lse", 0, 0, 1},      {"total_q 0, no lse", 0, 0, 0},
        {"total_q 0, max_q 4", 0, 4, 1},  {"empty seqs, max_q 0", SLACK, 0, 1},
        {"empty seqs, max_q 4", SLACK, 4, 1},
    };
    static const fc_backend bks[] = {FC_BACKEND_CPU, FC_BACKEND_CPU_REFERENCE, FC_BACKEND_AUTO};
    for (int ci = 0; ci < 5; ci++)
        for (int bi = 0; bi < 3; bi++) {
            fc_attention_args a;
            empty_varlen_args(&a, q, k, v, out, cases[ci].total_q, cu_q0, cu_k, cases[ci].max_q);
            if (cases[ci].with_lse) {
                a.lse.data = lse;
                a.lse.dtype = FC_DTYPE_F32;
                a.lse.ndim = 2;
                a.lse.shape[0] = H; a.lse.shape[1] = cases[ci].total_q;
                a.lse.stride[0] = cases[ci].total_q; a.lse.stride[1] = 1;
            }
            a.backend = bks[bi];
            kit_poison(out, sizeof(float) * SLACK * H * D, FC_DTYPE_F32, lse, sizeof(float) * H * SLACK);
            memcpy(out_copy, out, sizeof(float) * SLACK * H * D);
            memcpy(lse_copy, lse, sizeof(float) * H * SLACK);
            fc_kernel_info si, fi;
            fc_status st = fc_attention_supported(ctx, &a, &si);
            CHECK(st == FC_OK, "%s backend %d: supported: %s", cases[ci].name, (int)bks[bi], fc_last_error(ctx));
            st = fc_attention_forward(ctx, &a, NULL, &fi);
            CHECK(st == FC_OK, "%s backend %d: forward: %s", cases[ci].name, (int)bks[bi], fc_last_error(ctx));
            if (st == FC_OK)
                CHECK(same_info(&si, &fi), "%s backend %d: supported '%s' != forward '%s'", cases[ci].name,
                      (int)bks[bi], si.name, fi.name);
            CHECK(memcmp(out, out_copy, sizeof(float) * SLACK * H * D) == 0, "%s backend %d: out written",
                  cases[ci].name, (int)bks[bi]);
            CHECK(memcmp(lse, lse_copy, sizeof(float) * H * SLACK) == 0, "%s backend %d: lse written",
                  cases[ci].name, (int)bks[bi]);
        }
    /* still validated when there is nothing to do: a bad cu_seqlens_k is an error */
    {
        static const int32_t bad_k[NSEQ + 1] = {0, 3, 1, 6};
        fc_attention_args a;
        empty_varlen_args(&a, q, k, v, out, 0, cu_q0, bad_k, 0);
        a.backend = FC_BACKEND_CPU;
        fc_status st = fc_attention_forward(ctx, &a, NULL, NULL);
        CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), "cu_seqlens_k"),
              "empty q with decreasing cu_seqlens_k: %d '%s'", (int)st, fc_last_error(ctx));
    }
done:
    free(q); free(k); free(v); free(out); free(lse); free(out_copy); free(lse_copy);
    group_done("empty varlen", p0, f0);
}

static void test_cuda_available(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    int a = fc_cuda_available();
    CHECK(a == 0 || a == 1, "fc_cuda_available() = %d", a);
    CHECK(fc_cuda_available() == a, "fc_cuda_available() changed between calls");
    char buf[256];
    fc_status st = fc_cuda_device_info(ctx, buf, sizeof buf);
    if (a) {
        CHECK(st == FC_OK && buf[0], "cuda available but device_info: %d '%s'", (int)st, fc_last_error(ctx));
        printf("cuda device: %s\n", buf);
    } else {
        CHECK(st == FC_ERR_NO_DEVICE, "no cuda but device_info returned %d", (int)st);
        CHECK(fc_last_error(ctx)[0] != 0, "device_info failed without a message");
        printf("no cuda device: %s\n", fc_last_error(ctx));
    }
    group_done("fc_cuda_available", p0, f0);
}

/* fc_last_host_profile: zeros before any call, the phases of the last
 * successful forward after one, untouched by a failing call. */
static void test_host_profile(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) {
        CHECK(0, "fc_context_create failed");
        return;
    }
    fc_host_profile hp;
    memset(&hp, 0x7f, sizeof hp);
    CHECK(fc_last_host_profile(NULL, &hp) == FC_ERR_INVALID_ARGUMENT, "profile of a NULL context");
    CHECK(fc_last_host_profile(ctx, NULL) == FC_ERR_INVALID_ARGUMENT, "profile into NULL");
    CHECK(fc_last_host_profile(ctx, &hp) == FC_OK, "profile of a fresh context");
    CHECK(hp.check_us == 0 && hp.select_us == 0 && hp.launch_us == 0 && hp.total_us == 0,
          "fresh context profile not zero: %g %g %g %g", hp.check_us, hp.select_us, hp.launch_us, hp.total_us);

    kit_shape s = small_shape(FC_DTYPE_F32, 0);
    kit_case c;
    if (kit_case_init(&c, &s, 77)) {
        CHECK(0, "kit_case_init failed");
        fc_context_free(ctx);
        return;
    }
    c.args.backend = FC_BACKEND_CPU;
    CHECK(fc_attention_forward(ctx, &c.args, NULL, NULL) == FC_OK, "forward: %s", fc_last_error(ctx));
    CHECK(fc_last_host_profile(ctx, &hp) == FC_OK, "profile after a forward");
    const double parts = hp.check_us + hp.select_us + hp.launch_us;
    CHECK(hp.check_us >= 0 && hp.select_us >= 0 && hp.launch_us > 0, "phases %g %g %g", hp.check_us,
          hp.select_us, hp.launch_us);
    CHECK(hp.total_us > 0 && fabs(hp.total_us - parts) <= 1e-6 * hp.total_us + 1e-3,
          "total %g != sum of phases %g", hp.total_us, parts);

    fc_attention_args bad = c.args;
    bad.causal = 5;
    fc_host_profile after;
    CHECK(fc_attention_forward(ctx, &bad, NULL, NULL) == FC_ERR_INVALID_ARGUMENT, "causal 5 accepted");
    CHECK(fc_last_host_profile(ctx, &after) == FC_OK && memcmp(&after, &hp, sizeof hp) == 0,
          "a failing call changed the profile");
    kit_case_free(&c);
    fc_context_free(ctx);
}

int main(void)
{
    test_version();
    test_status_strings();
    test_context_lifetime();
    test_tuning();
    test_args_init();
    test_host_profile();
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL: fc_context_create");
    test_supported_matches_forward(ctx);
    test_empty_varlen(ctx);
    test_cuda_available(ctx);
    fc_context_free(ctx);
    return test_summary();
}
