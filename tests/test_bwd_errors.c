/*
 * test_bwd_errors.c -- the table of bad backward inputs. Each row starts
 * from a valid small CPU backward problem, breaks exactly one thing, and
 * checks that
 *   - fc_attention_backward returns the expected status on every CPU-side
 *     backend request (CPU, AUTO, CPU_REFERENCE),
 *   - fc_last_error names the argument (an expected substring),
 *   - fc_attention_backward_supported answers the same status and message,
 *   - nothing was written: every buffer of the call (inputs, out, lse,
 *     dout, and the poisoned dq, dk, dv) is byte-identical afterwards.
 * Then NULL context/args, the CUDA request without a usable GPU, and the
 * valid variants (a caller's workspace, deterministic 1, varlen with no
 * query token) accepted and fully written.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"

#include "test_util.h"

#define FC_MSG_COPY 1024 /* room for a copy of a last-error message */

enum {
    F_F32 = 1 << 0,    /* base case in f32 (default f16)                       */
    F_VARLEN = 1 << 1, /* base case is varlen (3 sequences)                    */
    F_KEEPB = 1 << 2,  /* the row sets the backend itself: no loop over them   */
};

static kit_shape base_shape(int flags)
{
    kit_shape s = test_shape(flags & F_VARLEN ? 3 : 2, 4, 2, 5, 7, 16, flags & F_F32 ? FC_DTYPE_F32 : FC_DTYPE_F16);
    s.varlen = flags & F_VARLEN ? 1 : 0;
    return s;
}

/* ---- the rows ------------------------------------------------------------------------ */

typedef void (*mutate_fn)(kit_bwd_case *b, fc_attention_backward_args *a);
#define MUT(fn, body)                                                 \
    static void fn(kit_bwd_case *b, fc_attention_backward_args *a)    \
    {                                                                 \
        (void)b;                                                      \
        (void)a;                                                      \
        body                                                          \
    }

/* 256-byte aligned scratch for the workspace rows (and one off by 8). */
static _Alignas(256) unsigned char g_ws[1024];

/* required inputs */
MUT(m_lse_null, a->fwd.lse.data = NULL;)
MUT(m_dout_null, a->dout.data = NULL;)
MUT(m_dq_null, a->dq.data = NULL;)
MUT(m_dv_null, a->dv.data = NULL;)
MUT(m_q_null, a->fwd.q.data = NULL;)
/* aliasing: an output over an input or another output */
MUT(m_dq_is_q, a->dq.data = b->c.q;)
MUT(m_dq_is_dout, a->dq.data = b->dout;)
MUT(m_dq_in_lse, a->dq.data = b->c.lse;)
MUT(m_dq_is_out, a->dq.data = b->c.out;)
MUT(m_dk_is_dq, a->dk.data = b->dq;)
MUT(m_dv_is_dk, a->dv.data = b->dk;)
MUT(m_dv_is_v, a->dv.data = b->c.v;)
MUT(m_dk_is_k, a->dk.data = b->c.k;)
MUT(m_ws_in_dq, a->workspace = b->dq; a->workspace_bytes = 64;)
/* the aliased pointers above are aligned; these are not, or overlap themselves */
MUT(m_dq_misaligned, a->dq.data = (char *)b->dq + 1;)
MUT(m_dq_self_overlap, a->dq.stride[2] = 8;) /* head stride 8 < head_dim 16 */
MUT(m_dk_row_zero, a->dk.stride[1] = 0;)
/* shapes, ndim, strides */
MUT(m_dk_shape, a->dk.shape[1] -= 1;)
MUT(m_dv_heads, a->dv.shape[2] = 1;)
MUT(m_dq_dim, a->dq.shape[3] = 8;)
MUT(m_dout_shape, a->dout.shape[1] += 1;)
MUT(m_dq_ndim3, a->dq.ndim = 3;)
MUT(m_dout_last_stride, a->dout.stride[3] = 2;)
MUT(m_dk_neg_stride, a->dk.stride[0] = -1;)
MUT(m_varlen_dk_total, a->dk.shape[0] -= 1;)
MUT(m_varlen_dq_ndim4, a->dq.ndim = 4;)
/* dtypes */
MUT(m_dq_dtype, a->dq.dtype = FC_DTYPE_F32;)
MUT(m_dout_dtype, a->dout.dtype = FC_DTYPE_BF16;)
MUT(m_dv_dtype_f16, a->dv.dtype = FC_DTYPE_F16;)
MUT(m_lse_dtype, a->fwd.lse.dtype = FC_DTYPE_F16;)
MUT(m_fp8, a->fwd.q.dtype = a->fwd.k.dtype = a->fwd.v.dtype = a->fwd.out.dtype = a->dout.dtype =
               a->dq.dtype = a->dk.dtype = a->dv.dtype = FC_DTYPE_E4M3;)
/* the backward's own fields */
MUT(m_det2, a->deterministic = 2;)
MUT(m_det_neg, a->deterministic = -1;)
MUT(m_ws_misaligned, a->workspace = g_ws + 8; a->workspace_bytes = 512;)
MUT(m_ws_no_size, a->workspace = g_ws; a->workspace_bytes = 0;)
MUT(m_size_no_ws, a->workspace = NULL; a->workspace_bytes = 256;)
MUT(m_ws_neg_size, a->workspace = g_ws; a->workspace_bytes = -256;)
/* the forward's options and varlen offsets, checked by the same code */
MUT(m_causal2, a->fwd.causal = 2;)
MUT(m_scale_nan, a->fwd.scale = (float)(0.0 / 0.0);)
MUT(m_cu_k_decreasing, b->c.cu_k[2] = b->c.cu_k[1] - 1;)
MUT(m_backend_7, a->fwd.backend = (fc_backend)7;)
/* the forward-only fields: k and v read as 2 pages of 7 keys, or 3 and 5
 * keys in use of the dense 7 (valid values: refused for being there) */
static const int32_t k_pages[2] = {1, 0}, k_used[3] = {3, 5, 2};
MUT(m_paged, a->fwd.block_table = k_pages; a->fwd.max_pages_per_seq = 1;)
MUT(m_seqused, a->fwd.seqused_k = k_used;)

typedef struct row {
    const char *name;
    mutate_fn mutate;
    int flags;
    fc_status want;
    const char *substr; /* must appear in fc_last_error */
} row;

#define INV FC_ERR_INVALID_ARGUMENT
#define UNS FC_ERR_UNSUPPORTED

static const row k_rows[] = {
    {"lse.data NULL", m_lse_null, 0, INV, "lse.data"},
    {"varlen lse.data NULL", m_lse_null, F_VARLEN, INV, "lse.data"},
    {"dout.data NULL", m_dout_null, 0, INV, "dout.data"},
    {"dq.data NULL", m_dq_null, F_F32, INV, "dq.data"},
    {"dv.data NULL", m_dv_null, 0, INV, "dv.data"},
    {"q.data NULL", m_q_null, 0, INV, "q.data"},
    {"dq is q", m_dq_is_q, 0, INV, "dq overlaps q"},
    {"dq is dout", m_dq_is_dout, 0, INV, "dq overlaps dout"},
    {"dq over lse", m_dq_in_lse, F_F32, INV, "dq overlaps lse"},
    {"dq is out", m_dq_is_out, 0, INV, "dq overlaps out"},
    {"dk is dq", m_dk_is_dq, 0, INV, "dk overlaps dq"},
    {"dv is dk", m_dv_is_dk, F_VARLEN, INV, "dv overlaps dk"},
    {"dv is v", m_dv_is_v, 0, INV, "dv overlaps v"},
    {"dk is k", m_dk_is_k, F_F32, INV, "dk overlaps k"},
    {"workspace inside dq", m_ws_in_dq, F_F32, INV, "workspace"},
    {"dq misaligned", m_dq_misaligned, 0, INV, "dq.data"},
    {"dq overlaps itself", m_dq_self_overlap, 0, INV, "dq"},
    {"dk rows on one row", m_dk_row_zero, 0, INV, "dk"},
    {"dk shape != k shape", m_dk_shape, 0, INV, "dk.shape"},
    {"dv heads != v heads", m_dv_heads, 0, INV, "dv.shape"},
    {"dq head_dim != q's", m_dq_dim, 0, INV, "dq.shape"},
    {"dout shape != out shape", m_dout_shape, 0, INV, "dout.shape"},
    {"dq ndim 3", m_dq_ndim3, 0, INV, "dq.ndim"},
    {"dout last stride 2", m_dout_last_stride, 0, INV, "dout.stride"},
    {"dk negative stride", m_dk_neg_stride, 0, INV, "dk.stride"},
    {"varlen dk tokens != k tokens", m_varlen_dk_total, F_VARLEN, INV, "dk.shape"},
    {"varlen dq ndim 4", m_varlen_dq_ndim4, F_VARLEN, INV, "dq.ndim"},
    {"dq dtype f32 vs f16", m_dq_dtype, 0, INV, "dq.dtype"},
    {"dout dtype bf16 vs f32", m_dout_dtype, F_F32, INV, "dout.dtype"},
    {"dv dtype f16 vs f32", m_dv_dtype_f16, F_F32, INV, "dv.dtype"},
    {"lse dtype f16", m_lse_dtype, 0, INV, "lse.dtype"},
    {"fp8 everywhere", m_fp8, 0, UNS, "FP8"},
    {"deterministic 2", m_det2, 0, INV, "deterministic"},
    {"deterministic -1", m_det_neg, F_VARLEN, INV, "deterministic"},
    {"workspace misaligned", m_ws_misaligned, 0, INV, "256-byte"},
    {"workspace without size", m_ws_no_size, 0, INV, "workspace"},
    {"size without workspace", m_size_no_ws, 0, INV, "workspace"},
    {"workspace negative size", m_ws_neg_size, 0, INV, "workspace"},
    {"causal 2", m_causal2, 0, INV, "causal"},
    {"scale NaN", m_scale_nan, 0, INV, "scale"},
    {"varlen cu_seqlens_k decreasing", m_cu_k_decreasing, F_VARLEN, INV, "cu_seqlens_k"},
    {"backend 7", m_backend_7, F_KEEPB, INV, "backend"},
    {"paged k/v (block_table)", m_paged, 0, UNS, "block_table (a paged KV cache) is forward-only"},
    {"block_table with cu_seqlens", m_paged, F_VARLEN, UNS, "block_table"},
    {"seqused_k", m_seqused, F_F32, UNS, "seqused_k is forward-only"},
    {"seqused_k with cu_seqlens", m_seqused, F_VARLEN, UNS, "seqused_k"},
};

/* ---- running one row --------------------------------------------------------------- */

#define NBUF 9

static const char *const k_buf_names[NBUF] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};

/* Every buffer a backward call can touch, to prove a failing call wrote nothing. */
static int snapshot_take(tu_snapshot *s, kit_bwd_case *b)
{
    kit_case *c = &b->c;
    void *buf[NBUF] = {c->q, c->k, c->v, c->out, c->lse, b->dout, b->dq, b->dk, b->dv};
    const size_t bytes[NBUF] = {c->q_bytes, c->k_bytes, c->v_bytes, c->out_bytes, c->lse_bytes,
                                b->dout_bytes, b->dq_bytes, b->dk_bytes, b->dv_bytes};
    return tu_snapshot_take(s, NBUF, buf, bytes);
}

/* supported() then backward() reject a with the expected status (or want2)
 * and one message naming the argument; no buffer of b changed. backward()
 * runs only if supported() rejected: on accepted broken args a run could
 * write anywhere. */
static void expect_failure(fc_context *ctx, const char *what, kit_bwd_case *b,
                           const fc_attention_backward_args *a, fc_status want, fc_status want2,
                           const char *substr)
{
    tu_snapshot snap;
    if (snapshot_take(&snap, b)) {
        CHECK(0, "%s: out of host memory for the snapshot", what);
        tu_snapshot_free(&snap);
        return;
    }
    fc_kernel_info info;
    fc_status st = fc_attention_backward_supported(ctx, a, &info);
    char msg[FC_MSG_COPY];
    snprintf(msg, sizeof msg, "%s", fc_last_error(ctx));
    CHECK(st == want || st == want2, "%s: supported returned %d (%s), expected %d; message '%s'", what, (int)st,
          fc_status_string(st), (int)want, msg);
    CHECK(msg[0] != 0, "%s: rejected with an empty last-error message", what);
    CHECK(!substr || strstr(msg, substr), "%s: message '%s' does not contain '%s'", what, msg,
          substr ? substr : "");
    int d = tu_snapshot_diff(&snap);
    CHECK(d < 0, "%s: supported changed %s", what, d >= 0 ? k_buf_names[d] : "");
    if (st != FC_OK) {
        fc_status st2 = fc_attention_backward(ctx, a, NULL, &info);
        CHECK(st2 == st, "%s: backward returned %d, supported %d", what, (int)st2, (int)st);
        CHECK(strcmp(fc_last_error(ctx), msg) == 0, "%s: backward says '%s', supported said '%s'", what,
              fc_last_error(ctx), msg);
        d = tu_snapshot_diff(&snap);
        CHECK(d < 0, "%s: failing backward changed %s", what, d >= 0 ? k_buf_names[d] : "");
    } else {
        CHECK(0, "%s: backward not called: supported accepted the broken args", what);
    }
    tu_snapshot_free(&snap);
}

/* A valid case with out and lse from the reference forward. */
static int base_case(fc_context *ctx, kit_bwd_case *b, int flags, uint64_t seed)
{
    const kit_shape s = base_shape(flags);
    if (kit_bwd_case_init(b, &s, seed)) return -1;
    if (kit_bwd_forward(ctx, b, FC_BACKEND_CPU_REFERENCE) != FC_OK) {
        kit_bwd_case_free(b);
        return -1;
    }
    return 0;
}

static void run_row(fc_context *ctx, const row *r, uint64_t seed)
{
    kit_bwd_case b;
    if (base_case(ctx, &b, r->flags, seed)) {
        CHECK(0, "%s: base case failed", r->name);
        return;
    }
    fc_attention_backward_args a = b.args;
    a.fwd.backend = FC_BACKEND_CPU;
    CHECK(fc_attention_backward_supported(ctx, &a, NULL) == FC_OK, "%s: the unbroken base case is rejected: %s",
          r->name, fc_last_error(ctx));
    r->mutate(&b, &a);
    static const fc_backend backends[] = {FC_BACKEND_CPU, FC_BACKEND_AUTO, FC_BACKEND_CPU_REFERENCE};
    static const char *const bnames[] = {"CPU", "AUTO", "CPU_REFERENCE"};
    const int nb = r->flags & F_KEEPB ? 1 : 3;
    for (int i = 0; i < nb; i++) {
        char what[160];
        if (!(r->flags & F_KEEPB)) a.fwd.backend = backends[i];
        snprintf(what, sizeof what, "[%s] %s (%s)", r->flags & F_KEEPB ? "row's" : bnames[i], r->name,
                 kit_dtype_name(b.c.s.dtype));
        expect_failure(ctx, what, &b, &a, r->want, r->want, r->substr);
    }
    kit_bwd_case_free(&b);
}

/* ---- the other groups ------------------------------------------------------------------- */

static void test_rows(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    const int n = (int)(sizeof k_rows / sizeof k_rows[0]);
    for (int i = 0; i < n; i++) run_row(ctx, &k_rows[i], 100 + (uint64_t)i);
    group_done("bad arguments", p0, f0);
}

static void test_null_ctx_args(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    kit_bwd_case b;
    if (base_case(ctx, &b, 0, 7)) {
        CHECK(0, "base case failed");
        return;
    }
    tu_snapshot snap;
    if (snapshot_take(&snap, &b) == 0) {
        CHECK(fc_attention_backward(NULL, &b.args, NULL, NULL) == FC_ERR_INVALID_ARGUMENT,
              "backward with ctx NULL is not FC_ERR_INVALID_ARGUMENT");
        CHECK(fc_attention_backward_supported(NULL, &b.args, NULL) == FC_ERR_INVALID_ARGUMENT,
              "backward_supported with ctx NULL is not FC_ERR_INVALID_ARGUMENT");
        CHECK(tu_snapshot_diff(&snap) < 0, "backward with ctx NULL wrote something");
        expect_failure(ctx, "args NULL", &b, NULL, INV, INV, "args");
        CHECK(fc_attention_backward(NULL, NULL, NULL, NULL) == FC_ERR_INVALID_ARGUMENT,
              "backward(NULL, NULL) is not FC_ERR_INVALID_ARGUMENT");
    } else {
        CHECK(0, "snapshot failed");
    }
    tu_snapshot_free(&snap);
    kit_bwd_case_free(&b);
    group_done("null ctx/args", p0, f0);
}

static void test_cuda_request(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    kit_bwd_case b;
    if (base_case(ctx, &b, 0, 11)) {
        CHECK(0, "base case failed");
        return;
    }
    fc_attention_backward_args a = b.args;
    a.fwd.backend = FC_BACKEND_CUDA;
    if (fc_cuda_available())
        expect_failure(ctx, "cuda backend on host pointers", &b, &a, INV, INV, "host");
    else
        expect_failure(ctx, "cuda backend without a gpu", &b, &a, FC_ERR_NO_DEVICE, UNS, NULL);
    kit_bwd_case_free(&b);
    group_done("cuda request", p0, f0);
}

/* One valid variant of a case: supported and backward accept it, name the
 * CPU kernel with no workspace, write every gradient element and nothing
 * else, bitwise as the plain call. */
static void expect_same(fc_context *ctx, const char *what, kit_bwd_case *b, const fc_attention_backward_args *a)
{
    const size_t n[3] = {b->dq_bytes, b->dk_bytes, b->dv_bytes};
    void *plain[3] = {malloc(n[0]), malloc(n[1]), malloc(n[2])};
    void *grad[3] = {b->dq, b->dk, b->dv};
    fc_kernel_info info;
    memset(&info, 0, sizeof info);
    kit_bwd_poison(b);
    fc_status st = fc_attention_backward(ctx, &b->args, NULL, NULL);
    for (int i = 0; i < 3 && plain[i]; i++) memcpy(plain[i], grad[i], n[i]);
    kit_bwd_poison(b);
    fc_status st2 = fc_attention_backward_supported(ctx, a, &info);
    CHECK(st2 == FC_OK && strcmp(info.name, "cpu_tiled") == 0 && info.workspace_bytes == 0,
          "%s: supported says %d (%s), kernel '%s', workspace %lld", what, (int)st2, fc_last_error(ctx), info.name,
          (long long)info.workspace_bytes);
    if (st == FC_OK) st = fc_attention_backward(ctx, a, NULL, NULL);
    CHECK(st == FC_OK, "%s: backward failed: %s", what, fc_last_error(ctx));
    const kit_bwd_gate g = kit_bwd_gate_for(b->c.s.dtype, KIT_BWD_CPU);
    const void *got[3] = {grad[0], grad[1], grad[2]};
    kit_bwd_metrics m[3];
    kit_bwd_compare(b, got, got, &g, m);
    for (int i = 0; i < 3; i++) {
        CHECK(m[i].unwritten == 0 && m[i].stray == 0, "%s: %s unwritten %lld stray %lld", what, kit_grad_name(i),
              (long long)m[i].unwritten, (long long)m[i].stray);
        CHECK(plain[i] && memcmp(plain[i], grad[i], n[i]) == 0, "%s: %s differs from the plain call", what,
              kit_grad_name(i));
        free(plain[i]);
    }
}

static void test_valid_variants(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    kit_bwd_case b;
    if (base_case(ctx, &b, 0, 13)) {
        CHECK(0, "base case failed");
        return;
    }
    b.args.fwd.backend = FC_BACKEND_CPU;
    fc_attention_backward_args a = b.args;
    a.workspace = g_ws;
    a.workspace_bytes = (int64_t)sizeof g_ws;
    expect_same(ctx, "caller's workspace", &b, &a);
    a = b.args;
    a.deterministic = 1;
    expect_same(ctx, "deterministic 1", &b, &a);
    kit_bwd_case_free(&b);

    /* varlen with no query token but key tokens: dk = dv = 0 written */
    kit_shape s = base_shape(F_VARLEN);
    s.seqlen_q = 0;
    if (kit_bwd_case_init(&b, &s, 17) || kit_bwd_forward(ctx, &b, FC_BACKEND_CPU) != FC_OK) {
        CHECK(0, "varlen no-query case failed: %s", fc_last_error(ctx));
    } else {
        b.args.fwd.backend = FC_BACKEND_CPU;
        expect_same(ctx, "varlen total_q 0", &b, &b.args);
        int zero = 1;
        for (int64_t t = 0; t < b.c.total_k * s.heads_kv * s.head_dim; t++)
            zero &= kit_load(b.dk, s.dtype, t) == 0.0f && kit_load(b.dv, s.dtype, t) == 0.0f;
        CHECK(zero && b.c.total_q == 0 && b.c.total_k > 0, "varlen total_q 0: dk/dv not all 0 (total_k %lld)",
              (long long)b.c.total_k);
    }
    kit_bwd_case_free(&b);
    group_done("valid variants", p0, f0);
}

int main(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    test_rows(ctx);
    test_null_ctx_args(ctx);
    test_cuda_request(ctx);
    test_valid_variants(ctx);
    fc_context_free(ctx);
    return test_summary();
}
