/*
 * test_cuda_backward.c -- the CUDA backward against the double-precision
 * CPU reference backward, through the public API only, judged by the kit's
 * CUDA backward gates (kit_bwd_gate_for(dtype, KIT_BWD_CUDA)).
 *
 * Per case: kit_bwd_case_init builds the problem on the host, the CPU
 * forward gives out and lse, the reference backward runs once on the host;
 * the inputs go to device buffers; dq, dk and dv are poisoned ON THE DEVICE
 * before every run; then four runs through fc_attention_backward:
 *   A  deterministic 0, the library's workspace, twice (A, A')
 *   B  deterministic 1, the library's workspace
 *   C  deterministic 1, a caller workspace of the size
 *      fc_attention_backward_supported reports, filled with NaN bytes
 * A and B must pass the gates with every logical element written and
 * nothing else (padding, varlen tokens past the last offset); B and C must
 * be bitwise identical; A's dk and dv bitwise equal to those of A' (only dq's
 * summation order may differ without the deterministic mode; the two
 * modes walk the query blocks in different orders, so dk and dv repeat
 * within a mode, not across) unless A's plan split the GQA group (names
 * with _gN: dk and dv summed over CTAs by atomics as well). A full run
 * must have run some such plans on each path it ran.
 *
 * Every case runs on each CUDA kernel family (fc_context_set_cuda_path 80,
 * and 90 on an sm_90 device), the reference computed once.
 *
 * Usage: test_cuda_backward [--quick] [--cases N] [--seed S] [--path 80|90] [--head-dim D] [--verbose]
 *   --path P   only that kernel family (default: 80, and 90 on sm_90)
 *   --quick    a few small cases of every kernel (dtype x head_dim x {plain,
 *              causal+varlen, window+softcap+padded, GQA BHSD}) -- the run
 *              to put under compute-sanitizer
 *   --cases N  random cases (default 300) besides the named edge cases
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

static int g_verbose, g_only_dim;
static int g_group_split[2]; /* split plans run: path 80, path 90 */
static int g_paths[2] = {80, 90}, g_npaths = 2;

/* ---- device buffers ------------------------------------------------------------ */

typedef struct dev_bwd {
    dev_case f;      /* the forward's tensors and offsets (test_cuda_util.h) */
    void *dout, *g[3]; /* g: dq, dk, dv */
    void *ws;
    fc_attention_backward_args args; /* = the host case's args with device pointers */
} dev_bwd;

static void bwd_free(dev_bwd *d)
{
    dev_free(&d->f);
    cudaFree(d->dout);
    cudaFree(d->g[0]); cudaFree(d->g[1]); cudaFree(d->g[2]);
    cudaFree(d->ws);
    memset(d, 0, sizeof *d);
}

static int bwd_upload(const kit_bwd_case *b, dev_bwd *d, char *err, size_t err_len)
{
    memset(d, 0, sizeof *d);
    if (dev_upload(&b->c, &d->f, err, err_len) != 0) return -1;
    void **dst[4] = {&d->dout, &d->g[0], &d->g[1], &d->g[2]};
    const void *src[4] = {b->dout, b->dq, b->dk, b->dv}; /* dq, dk, dv: the kit's poison */
    const size_t bytes[4] = {b->dout_bytes, b->dq_bytes, b->dk_bytes, b->dv_bytes};
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 4 && e == cudaSuccess; i++) {
        e = cudaMalloc(dst[i], bytes[i]);
        if (e == cudaSuccess) e = cudaMemcpy(*dst[i], src[i], bytes[i], cudaMemcpyHostToDevice);
    }
    /* pageable cudaMemcpy may return before its DMA lands (test_cuda_util.h) */
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        snprintf(err, err_len, "device setup: %s", cudaGetErrorString(e));
        bwd_free(d);
        return -1;
    }
    fc_attention_backward_args *a = &d->args;
    *a = b->args;
    dev_point(&d->f, &a->fwd);
    a->dout.data = d->dout;
    a->dq.data = d->g[0];
    a->dk.data = d->g[1];
    a->dv.data = d->g[2];
    return 0;
}

/* One run: poison dq/dk/dv on the device (and the caller workspace, when
 * ws_bytes > 0, with 0xff bytes: NaNs), run, wait, copy the gradients back
 * into got[]. */
static fc_status bwd_run(fc_context *ctx, const kit_bwd_case *b, dev_bwd *d, cudaStream_t stream, int det,
                         int64_t ws_bytes, void *const got[3], fc_kernel_info *info, char *err, size_t err_len)
{
    const size_t bytes[3] = {b->dq_bytes, b->dk_bytes, b->dv_bytes};
    const void *poison[3] = {b->dq, b->dk, b->dv};
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 3 && e == cudaSuccess; i++)
        e = cudaMemcpy(d->g[i], poison[i], bytes[i], cudaMemcpyHostToDevice);
    d->args.deterministic = det;
    d->args.workspace = NULL;
    d->args.workspace_bytes = 0;
    if (e == cudaSuccess && ws_bytes > 0) {
        if (!d->ws) e = cudaMalloc(&d->ws, (size_t)ws_bytes);
        if (e == cudaSuccess) e = cudaMemset(d->ws, 0xff, (size_t)ws_bytes);
        d->args.workspace = d->ws;
        d->args.workspace_bytes = ws_bytes;
    }
    if (e == cudaSuccess) e = cudaDeviceSynchronize(); /* the poison lands first */
    if (e != cudaSuccess) {
        snprintf(err, err_len, "poisoning: %s", cudaGetErrorString(e));
        return FC_ERR_CUDA;
    }
    fc_status st = fc_attention_backward(ctx, &d->args, (void *)stream, info);
    if (st != FC_OK) {
        snprintf(err, err_len, "%s: %s", fc_status_string(st), fc_last_error(ctx));
        return st;
    }
    e = cudaStreamSynchronize(stream);
    for (int i = 0; i < 3 && e == cudaSuccess; i++) e = cudaMemcpy(got[i], d->g[i], bytes[i], cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        snprintf(err, err_len, "after the kernels: %s", cudaGetErrorString(e));
        return FC_ERR_CUDA;
    }
    return FC_OK;
}

static void describe(const kit_shape *s, char *buf, size_t len)
{
    snprintf(buf, len, "%s d%d b%d h%d/%d s%d/%d %s%s%s%s%s%s%s", kit_dtype_name(s->dtype), s->head_dim, s->batch,
             s->heads_q, s->heads_kv, s->seqlen_q, s->seqlen_k, kit_layout_name(s->layout), s->causal ? " causal" : "",
             (s->window_left >= 0 || s->window_right >= 0) ? " window" : "", s->softcap > 0 ? " softcap" : "",
             s->varlen ? " varlen" : "", s->scale > 0 ? " scale" : "", s->input_scale > 1 ? " big-inputs" : "");
}

/* Head dims the sm80-class backward covers on the H100/H200 this test runs
 * on (d256 needs 137 KB of shared memory: not on sm_86/89); any other is
 * an expected UNSUPPORTED (counted as a skip, with its message). On the
 * Hopper path any UNSUPPORTED is a skip (head dims 64, 96, 128 and
 * TMA-able layouts; the skip lines say which). */
static int bwd_supports(int path, int d)
{
    return path == 80 && (d == 32 || d == 64 || d == 96 || d == 128 || d == 256);
}

/* Which gradients of two runs differ bitwise: bit i for gradient i. */
static int differs(const kit_bwd_case *b, void *const x[3], void *const y[3])
{
    const size_t bytes[3] = {b->dq_bytes, b->dk_bytes, b->dv_bytes};
    int m = 0;
    for (int i = 0; i < 3; i++)
        if (memcmp(x[i], y[i], bytes[i]) != 0) m |= 1 << i;
    return m;
}

/* "differ: dq dk" for the bits of mask m. */
static void grad_names(int m, char *buf, size_t len)
{
    snprintf(buf, len, "NO:%s%s%s", m & 1 ? " dq" : "", m & 2 ? " dk" : "", m & 4 ? " dv" : "");
}

typedef struct bufs {
    void *ref[3], *a[3], *b[3], *c[3];
} bufs;

static int bufs_alloc(bufs *h, const kit_bwd_case *b)
{
    const size_t bytes[3] = {b->dq_bytes, b->dk_bytes, b->dv_bytes};
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        h->ref[i] = malloc(bytes[i]);
        h->a[i] = malloc(bytes[i]);
        h->b[i] = malloc(bytes[i]);
        h->c[i] = malloc(bytes[i]);
        ok = ok && h->ref[i] && h->a[i] && h->b[i] && h->c[i];
    }
    return ok ? 0 : -1;
}

static void bufs_free(bufs *h)
{
    for (int i = 0; i < 3; i++) {
        free(h->ref[i]); free(h->a[i]); free(h->b[i]); free(h->c[i]);
    }
}

/* A, B, C on the device; the verdict. */
static void judge(fc_context *ctx, int path, const char *tag, const char *desc, const kit_bwd_case *b, dev_bwd *d,
                  bufs *h, cudaStream_t stream)
{
    char err[600], line[2400], ma[500], mb[500];
    fc_kernel_info info, sup;
    memset(&info, 0, sizeof info);
    fc_status st = fc_attention_backward_supported(ctx, &d->args, &sup);
    if (st == FC_OK) st = bwd_run(ctx, b, d, stream, 0, 0, h->a, &info, err, sizeof err);
    else snprintf(err, sizeof err, "%s: %s", fc_status_string(st), fc_last_error(ctx));
    if (st == FC_ERR_UNSUPPORTED && !bwd_supports(path, b->c.s.head_dim)) {
        char why[200];
        snprintf(why, sizeof why, "path %d: %.180s", path, fc_last_error(ctx));
        tu_note_skip(why);
        if (g_verbose) printf("SKIP %s path%d %s: %s\n", tag, path, desc, err);
        return;
    }
    if (st != FC_OK) {
        g_fail++;
        printf("FAIL %s path%d %s: %s\n", tag, path, desc, err);
        if (st == FC_ERR_CUDA && cudaDeviceSynchronize() != cudaSuccess) {
            printf("sticky CUDA error after this case: %s\n", cudaGetErrorString(cudaGetLastError()));
            exit(test_summary());
        }
        return;
    }
    fc_kernel_info ia2, ib, ic;
    /* A' (into C's buffers, before C): dk and dv take no atomics unless the group is split */
    const char *gs = strstr(info.name, "_g");
    const int split = gs && gs[2] >= '2' && gs[2] <= '9';
    g_group_split[path == 90] += split;
    const fc_status sa2 = bwd_run(ctx, b, d, stream, 0, 0, h->c, &ia2, err, sizeof err);
    const int aa = sa2 == FC_OK ? differs(b, h->a, h->c) & (split ? 0 : 6) : 6; /* dk, dv only */
    d->args.deterministic = 1; /* the workspace C's mode needs */
    fc_status sb = fc_attention_backward_supported(ctx, &d->args, &sup);
    if (sb == FC_OK) sb = bwd_run(ctx, b, d, stream, 1, 0, h->b, &ib, err, sizeof err);
    else snprintf(err, sizeof err, "%s: %s", fc_status_string(sb), fc_last_error(ctx));
    fc_status sc = sb == FC_OK ? bwd_run(ctx, b, d, stream, 1, sup.workspace_bytes > 0 ? sup.workspace_bytes : 0,
                                         h->c, &ic, err, sizeof err)
                               : sb;
    const kit_bwd_gate g = kit_bwd_gate_for(b->c.s.dtype, KIT_BWD_CUDA);
    kit_bwd_metrics m_a[3], m_b[3];
    kit_bwd_compare(b, (const void *const *)h->a, (const void *const *)h->ref, &g, m_a);
    kit_bwd_compare(b, (const void *const *)h->b, (const void *const *)h->ref, &g, m_b);
    const int bc = sc == FC_OK ? differs(b, h->b, h->c) : 7;
    const int ok = kit_bwd_gate_pass(m_a, &g) && kit_bwd_gate_pass(m_b, &g) && sb == FC_OK && sc == FC_OK && bc == 0 && aa == 0 &&
                   info.backend == FC_BACKEND_CUDA;
    kit_bwd_describe(m_a, ma, sizeof ma);
    kit_bwd_describe(m_b, mb, sizeof mb);
    char nbc[16], naa[16];
    grad_names(bc, nbc, sizeof nbc);
    grad_names(aa, naa, sizeof naa);
    snprintf(line, sizeof line, "%s path%d %s [%s ws %lld] | A %s | B(det) %s | B=C %s | A=A' %s%s%s", tag, path, desc,
             info.name, (long long)sup.workspace_bytes, ma, mb, bc ? nbc : "yes", aa ? naa : "yes",
             sa2 != FC_OK || sb != FC_OK || sc != FC_OK ? " | " : "",
             sa2 != FC_OK || sb != FC_OK || sc != FC_OK ? err : "");
    if (ok) g_pass++;
    else g_fail++;
    if (!ok || g_verbose) printf("%s %s\n", ok ? "PASS" : "FAIL", line);
    fflush(stdout);
}

/* One case: forward and reference on the host, then judge() on the device. */
static void run_case(fc_context *ctx, const char *tag, const kit_shape *s, uint64_t seed, cudaStream_t stream)
{
    char desc[200], err[600];
    describe(s, desc, sizeof desc);
    kit_bwd_case b;
    if (kit_bwd_case_init(&b, s, seed) != 0) {
        g_fail++;
        printf("FAIL %s %s: kit_bwd_case_init failed\n", tag, desc);
        return;
    }
    bufs h;
    memset(&h, 0, sizeof h);
    dev_bwd d;
    memset(&d, 0, sizeof d);
    fc_status st = bufs_alloc(&h, &b) == 0 ? FC_OK : FC_ERR_OUT_OF_MEMORY;
    if (st == FC_OK) st = kit_bwd_forward(ctx, &b, FC_BACKEND_CPU);
    if (st == FC_OK) st = kit_bwd_reference(ctx, &b, h.ref);
    if (st != FC_OK) {
        g_fail++;
        printf("FAIL %s %s: host forward/reference: %s (%s)\n", tag, desc, fc_status_string(st), fc_last_error(ctx));
    } else if (bwd_upload(&b, &d, err, sizeof err) != 0) {
        g_fail++;
        printf("FAIL %s %s: %s\n", tag, desc, err);
    } else {
        for (int pi = 0; pi < g_npaths; pi++) {
            fc_context_set_cuda_path(ctx, g_paths[pi]);
            /* judge leaves deterministic 1 and C's workspace, sized for its path */
            d.args.deterministic = 0;
            d.args.workspace = NULL;
            d.args.workspace_bytes = 0;
            cudaFree(d.ws);
            d.ws = NULL;
            judge(ctx, g_paths[pi], tag, desc, &b, &d, &h, stream);
        }
        fc_context_set_cuda_path(ctx, 0);
    }
    bwd_free(&d);
    bufs_free(&h);
    kit_bwd_case_free(&b);
}

/* ---- shapes -------------------------------------------------------------------- */

/* Host reference work of a case (multiply-adds of the forward): keeps the
 * run short (the reference backward costs about 2.5 times that). */
static double work(const kit_shape *s)
{
    return 2.0 * s->batch * s->heads_q * (double)s->seqlen_q * (double)s->seqlen_k * s->head_dim;
}

static kit_shape random_shape(uint64_t *rng)
{
    static const int dims[] = {32, 64, 64, 96, 128, 128, 128, 256};
    static const int lens[] = {1, 2, 17, 33, 64, 100, 127, 128, 129, 255, 300, 512, 1000, 1023, 2048};
    static const int ratios[] = {1, 1, 1, 2, 4, 8};
#define R(n) ((int)(kit_rand_u64(rng) % (uint64_t)(n)))
    const fc_dtype dt = R(2) ? FC_DTYPE_BF16 : FC_DTYPE_F16;
    const int hkv = 1 + R(3);
    const int sq = lens[R(15)];
    const int b = 1 + R(3), hq = hkv * ratios[R(6)], sk = R(3) == 0 ? sq : lens[R(15)], d = dims[R(8)];
    kit_shape s = test_shape(b, hq, hkv, sq, sk, g_only_dim ? g_only_dim : d, dt);
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
    if (R(12) == 0) s.input_scale = 3.0f;
    while (work(&s) > 1.5e7) {
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
    cudaStream_t streams[2];
    int n;
} runner;

static void run(runner *r, const char *tag, const kit_shape *s, uint64_t seed)
{
    if (g_only_dim && s->head_dim != g_only_dim) return;
    /* every third case on a created (non-default) stream */
    run_case(r->ctx, tag, s, seed, (r->n++ % 3 == 2) ? r->streams[1] : r->streams[0]);
}

/* A named case: the shape's fields that differ from test_shape's plain
 * dense problem (window -2: none; layout, varlen, scales 0: the default). */
typedef struct named {
    const char *tag;
    int b, hq, hkv, sq, sk, d;
    int causal, wl, wr;
    float softcap, scale, input_scale;
    int varlen;
    kit_layout layout;
} named;

static void run_named(runner *r, const named *n, int count, fc_dtype dt, int d_override, uint64_t seed)
{
    for (int i = 0; i < count; i++) {
        kit_shape s = test_shape(n[i].b, n[i].hq, n[i].hkv, n[i].sq, n[i].sk, d_override ? d_override : n[i].d, dt);
        s.causal = n[i].causal;
        if (n[i].wl != -2) s.window_left = n[i].wl;
        if (n[i].wr != -2) s.window_right = n[i].wr;
        s.softcap = n[i].softcap;
        s.scale = n[i].scale;
        s.input_scale = n[i].input_scale;
        s.varlen = n[i].varlen;
        s.layout = n[i].layout;
        run(r, n[i].tag, &s, seed + (uint64_t)i);
    }
}

/* Edge cases: sq != sk both ways under causal (rows and keys that see
 * nothing), windows, one key per row (dq = dk = 0), empty varlen sequences
 * and no query token at all, GQA/MQA, large logits, softcap at a large
 * scale, unsupported dims (UNSUPPORTED, never wrong). */
static const named k_edges[] = {
    {"edge:s1", 2, 4, 4, 1, 1, 64, 0, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
    {"edge:s17/1500", 1, 2, 2, 17, 1500, 128, 0, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
    {"edge:causal-s1500/17(empty rows)", 1, 2, 1, 1500, 17, 64, 1, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
    {"edge:causal-s300/1000", 1, 2, 2, 300, 1000, 96, 1, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_PADDED},
    {"edge:local-s700/1500", 1, 2, 2, 700, 1500, 32, 1, 100, -2, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
    {"edge:window(3,5)-unseen", 1, 4, 2, 160, 40, 64, 0, 3, 5, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
    {"edge:window(0,0)", 2, 4, 4, 200, 200, 128, 0, 0, 0, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
    {"edge:varlen-empty-seqs", 7, 8, 2, 150, 300, 128, 1, -2, -2, 0, 0, 0, 1, KIT_LAYOUT_BSHD},
    {"edge:varlen-no-query-token", 4, 4, 2, 0, 200, 64, 0, -2, -2, 0, 0, 0, 1, KIT_LAYOUT_BSHD},
    {"edge:large-logits", 1, 4, 2, 96, 96, 64, 0, -2, -2, 0, 0, 30.0f, 0, KIT_LAYOUT_BSHD},
    {"edge:scale1000-softcap", 1, 4, 4, 96, 200, 128, 1, -2, -2, 30.0f, 1000.0f, 0, 0, KIT_LAYOUT_BSHD},
    {"edge:gqa8-causal", 2, 16, 2, 257, 257, 128, 1, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_BHSD},
    {"edge:mqa", 2, 6, 1, 100, 333, 96, 0, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
    {"edge:d256-unsupported", 1, 2, 2, 64, 64, 256, 0, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
    {"edge:d80-unsupported", 1, 2, 2, 64, 64, 80, 0, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
};

/* --quick: every (dtype, head_dim) kernel with each code path, small sizes
 * (head dim from the loop). */
static const named k_quick[] = {
    {"quick:plain", 2, 2, 2, 130, 200, 0, 0, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_BSHD},
    {"quick:causal-varlen", 4, 4, 2, 70, 150, 0, 1, -2, -2, 0, 0, 0, 1, KIT_LAYOUT_BSHD},
    {"quick:window-softcap-padded", 1, 2, 1, 100, 180, 0, 0, 40, 7, 20.0f, 0, 0, 0, KIT_LAYOUT_PADDED},
    {"quick:gqa-bhsd", 2, 8, 2, 64, 129, 0, 0, -2, -2, 0, 0, 0, 0, KIT_LAYOUT_BHSD},
};

#define COUNT(x) ((int)(sizeof(x) / sizeof((x)[0])))

static void edge_cases(runner *r)
{
    run_named(r, k_edges, COUNT(k_edges), FC_DTYPE_F16, 0, 101);
    run_named(r, k_edges, COUNT(k_edges), FC_DTYPE_BF16, 0, 101);
}

/* Odd element strides (valid input for 2-byte dtypes): the sm80 backward
 * moves out, dout, dq, dk and dv in 16-byte chunks and refuses such layouts
 * (docs/API.md). The answer must be that, cleanly, on every path: supported
 * and the call agree on FC_ERR_UNSUPPORTED naming the tensor's stride, no
 * device fault, and dq, dk and dv keep their poison. Cases: out and dout
 * odd (kit odd_out), then the head stride of one of dout/dq/dk/dv one less
 * in a padded layout (dim + 7: still inside its buffer, rows apart). */
static void odd_strides(runner *r)
{
    static const char *const which[5] = {"out", "dout", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        kit_shape s = test_shape(2, 4, 2, 70, 90, 64, i % 2 ? FC_DTYPE_F16 : FC_DTYPE_BF16);
        s.odd_out = i == 0;
        s.layout = KIT_LAYOUT_PADDED;
        kit_bwd_case b;
        dev_bwd d;
        char err[300];
        if (kit_bwd_case_init(&b, &s, 150 + (uint64_t)i) != 0) { CHECK(0, "odd strides: kit_bwd_case_init"); continue; }
        fc_tensor *t[5] = {NULL, &b.args.dout, &b.args.dq, &b.args.dk, &b.args.dv};
        if (t[i]) t[i]->stride[2] -= 1;
        if (bwd_upload(&b, &d, err, sizeof err) != 0) {
            CHECK(0, "odd strides: %s", err);
            kit_bwd_case_free(&b);
            continue;
        }
        for (int path = 0; path <= 80; path += 80) {
            fc_context_set_cuda_path(r->ctx, path);
            const fc_status sup = fc_attention_backward_supported(r->ctx, &d.args, NULL);
            const fc_status st = fc_attention_backward(r->ctx, &d.args, NULL, NULL);
            const char *msg = fc_last_error(r->ctx);
            char name[16]; /* the planner's message starts with the tensor's name ("out" is in "dout") */
            snprintf(name, sizeof name, "%s ", which[i]);
            CHECK(sup == FC_ERR_UNSUPPORTED && st == FC_ERR_UNSUPPORTED && !strncmp(msg, name, strlen(name)) &&
                      strstr(msg, "stride"),
                  "odd %s strides, path %d: supported %s, call %s (%s)", which[i], path, fc_status_string(sup),
                  fc_status_string(st), msg);
        }
        fc_context_set_cuda_path(r->ctx, 0);
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "odd %s strides: a device error", which[i]);
        const void *poison[3] = {b.dq, b.dk, b.dv};
        const size_t bytes[3] = {b.dq_bytes, b.dk_bytes, b.dv_bytes};
        for (int g = 0; g < 3; g++) {
            void *now = malloc(bytes[g]);
            CHECK(now && cudaMemcpy(now, d.g[g], bytes[g], cudaMemcpyDeviceToHost) == cudaSuccess &&
                      memcmp(now, poison[g], bytes[g]) == 0,
                  "odd %s strides: a refused call wrote %s", which[i], kit_grad_name(g));
            free(now);
        }
        bwd_free(&d);
        kit_bwd_case_free(&b);
    }
}

static void quick_cases(runner *r)
{
    static const int dims[] = {32, 64, 96, 128, 256};
    for (int di = 0; di < 5; di++) {
        run_named(r, k_quick, COUNT(k_quick), FC_DTYPE_F16, dims[di], 201);
        run_named(r, k_quick, COUNT(k_quick), FC_DTYPE_BF16, dims[di], 201);
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: test_cuda_backward [--quick] [--cases N] [--seed S] [--path 80|90] [--head-dim D] [--verbose]\n");
}

int main(int argc, char **argv)
{
    int quick = 0, ncases = 300, path = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--verbose")) g_verbose = 1;
        else if (!strcmp(argv[i], "--cases") && i + 1 < argc) ncases = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) g_only_dim = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--path") && i + 1 < argc) path = atoi(argv[++i]);
        else { usage(); return 2; }
    }
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    if (kit_tuning_from_env(ctx) != FC_OK) {
        fc_context_free(ctx);
        return test_give_up("FAIL FLASHCORE_TUNING_CACHE or FLASHCORE_SM90_TRACE_FILE");
    }
    if (!tu_cuda_device(ctx)) {
        fc_context_free(ctx);
        return 77;
    }

    if (path != 0 && path != 80 && path != 90) {
        usage();
        fc_context_free(ctx);
        return 2;
    }
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        fc_context_free(ctx);
        return test_give_up("FAIL reading the device's compute capability");
    }
    if (path) g_paths[0] = path, g_npaths = 1;
    else g_npaths = major == 9 && minor == 0 ? 2 : 1;
    runner r;
    memset(&r, 0, sizeof r);
    r.ctx = ctx;
    r.streams[0] = NULL; /* the legacy default stream */
    if (cudaStreamCreateWithFlags(&r.streams[1], cudaStreamNonBlocking) != cudaSuccess) {
        fc_context_free(ctx);
        return test_give_up("FAIL cudaStreamCreate");
    }
    const double t0 = kit_now();
    if (quick) {
        quick_cases(&r);
    } else {
        edge_cases(&r);
        odd_strides(&r);
        uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 11;
        for (int n = 0; n < ncases; n++) {
            kit_shape s = random_shape(&rng);
            char tag[48];
            snprintf(tag, sizeof tag, "random#%d", n);
            run(&r, tag, &s, seed * 100000 + (uint64_t)n);
        }
    }
    const int dim90 = g_only_dim == 0 || g_only_dim == 64 || g_only_dim == 96 || g_only_dim == 128;
    if (!quick && major == 9 && minor == 0 && (path == 0 || path == 90) && dim90 && ncases >= 50)
        CHECK(g_group_split[1] > 0, "no case ran an sm90 plan with the GQA group split over CTAs");
    if (!quick && (path == 0 || path == 80) && ncases >= 50)
        CHECK(g_group_split[0] > 0, "no case ran an sm80 plan with the GQA group split over CTAs");
    printf("group-split plans: path 80 %d, path 90 %d\n", g_group_split[0], g_group_split[1]);
    cudaStreamDestroy(r.streams[1]);
    fc_context_free(ctx);
    printf("(%.1f s)\n", kit_now() - t0);
    tu_print_skips();
    return test_summary();
}
#endif
