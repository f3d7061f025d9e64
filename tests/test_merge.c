/*
 * test_merge.c -- fc_attention_merge on the CPU backend:
 *  - attention over all keys equals the merge of the forwards over blocks
 *    of them (with lse), unmasked and causal (each block's forward masked
 *    at the global diagonal through window_right, so later blocks have
 *    rows that see no key: lse -inf), against the fp64 reference, within
 *    the parts' dtype gate (f32, bf16, mixed);
 *  - one part merges to itself bit for bit; rows where every part is -inf
 *    give 0 and -inf, a NaN lse a NaN row; 1 and 3 threads give the same
 *    bits; the variable-length layout and transposed strides give the same
 *    bits as the dense one;
 *  - the backward of each key block, given the whole call's out and lse,
 *    gives the whole call's gradients: dq summed over the blocks, dk and dv
 *    block by block (context parallelism's backward step), unmasked and
 *    causal;
 *  - every refused argument names itself and writes nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { B = 2, SQ = 37, SK = 100, HQ = 4, HKV = 2, D = 64, NMAX = 5 };
#define NQ ((size_t)B * SQ * HQ * D)
#define NL ((size_t)B * HQ * SQ)

static float g_q[NQ], g_k[(size_t)B * SK * HKV * D], g_v[(size_t)B * SK * HKV * D];

static void fill_inputs(void)
{
    uint64_t s = 12345;
    float *arrays[3] = {g_q, g_k, g_v};
    const size_t n[3] = {NQ, sizeof g_k / 4, sizeof g_v / 4};
    for (int a = 0; a < 3; a++)
        for (size_t i = 0; i < n[a]; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            arrays[a][i] = (float)((double)(s >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        }
}

/* q against keys [k0, k1) (f32), out and lse; causal: at the global
 * bottom-right diagonal. */
static fc_status forward(fc_context *ctx, fc_backend be, int k0, int k1, int causal, float *out, float *lse)
{
    fc_attention_args a;
    fc_attention_args_init(&a);
    a.q = kit_contiguous(g_q, FC_DTYPE_F32, B, SQ, HQ, D);
    a.k = kit_contiguous(g_k + (size_t)k0 * HKV * D, FC_DTYPE_F32, B, k1 - k0, HKV, D);
    a.v = kit_contiguous(g_v + (size_t)k0 * HKV * D, FC_DTYPE_F32, B, k1 - k0, HKV, D);
    a.k.stride[0] = a.v.stride[0] = (int64_t)SK * HKV * D;
    a.out = kit_contiguous(out, FC_DTYPE_F32, B, SQ, HQ, D);
    a.lse = kit_contiguous(lse, FC_DTYPE_F32, B, HQ, SQ, 0);
    if (causal) a.window_right = SK - k1; /* key k0 + j sees query i iff k0 + j <= i + SK - SQ */
    a.backend = be;
    return fc_attention_forward(ctx, &a, NULL, NULL);
}

typedef struct parts {
    int n;
    float out[NMAX][NQ], lse[NMAX][NL];
    uint16_t out16[NMAX][NQ];
    fc_tensor to[NMAX], tl[NMAX];
} parts;

/* The forwards over the blocks cut at cuts[0..n] (f32 outputs; bf16 copies
 * for the parts listed in bf16_mask). */
static int make_parts(fc_context *ctx, parts *p, const int *cuts, int n, int causal, unsigned bf16_mask)
{
    p->n = n;
    for (int i = 0; i < n; i++) {
        if (forward(ctx, FC_BACKEND_CPU, cuts[i], cuts[i + 1], causal, p->out[i], p->lse[i]) != FC_OK)
            return -1;
        p->to[i] = kit_contiguous(p->out[i], FC_DTYPE_F32, B, SQ, HQ, D);
        if (bf16_mask >> i & 1) {
            for (size_t x = 0; x < NQ; x++) p->out16[i][x] = kit_f32_to_bf16(p->out[i][x]);
            p->to[i] = kit_contiguous(p->out16[i], FC_DTYPE_BF16, B, SQ, HQ, D);
        }
        p->tl[i] = kit_contiguous(p->lse[i], FC_DTYPE_F32, B, HQ, SQ, 0);
    }
    return 0;
}

static fc_attention_merge_args merge_args(parts *p, void *out, fc_dtype dt, float *lse)
{
    fc_attention_merge_args m;
    fc_attention_merge_args_init(&m);
    m.num_parts = p->n;
    m.parts_out = p->to;
    m.parts_lse = p->tl;
    m.out = kit_contiguous(out, dt, B, SQ, HQ, D);
    if (lse) m.lse = kit_contiguous(lse, FC_DTYPE_F32, B, HQ, SQ, 0);
    return m;
}

static float g_ref[NQ], g_ref_lse[NL], g_out[NQ], g_lse[NL];
static uint16_t g_out16[NQ];
static parts g_p;

/* Merged blocks against the fp64 reference over all keys. */
static void merged_equals_whole(fc_context *ctx, const char *name, const int *cuts, int n, int causal,
                                unsigned bf16_mask, fc_dtype out_dt)
{
    int p0 = g_pass, f0 = g_fail;
    CHECK(forward(ctx, FC_BACKEND_CPU_REFERENCE, 0, SK, causal, g_ref, g_ref_lse) == FC_OK,
          "%s: reference: %s", name, fc_last_error(ctx));
    CHECK(make_parts(ctx, &g_p, cuts, n, causal, bf16_mask) == 0, "%s: parts: %s", name, fc_last_error(ctx));
    int neg_inf = 0;
    for (int i = 0; i < n; i++)
        for (size_t x = 0; x < NL; x++) neg_inf += isinf(g_p.lse[i][x]) && g_p.lse[i][x] < 0;
    CHECK(!causal || neg_inf > 0, "%s: some block has rows that see no key", name);
    void *out = out_dt == FC_DTYPE_F32 ? (void *)g_out : (void *)g_out16;
    fc_attention_merge_args m = merge_args(&g_p, out, out_dt, g_lse);
    CHECK(fc_attention_merge(ctx, &m, NULL) == FC_OK, "%s: merge: %s", name, fc_last_error(ctx));
    const kit_gate g = kit_gate_for(bf16_mask || out_dt != FC_DTYPE_F32 ? FC_DTYPE_BF16 : FC_DTYPE_F32);
    double worst = 0, worst_lse = 0;
    for (size_t x = 0; x < NQ; x++) {
        const float o = out_dt == FC_DTYPE_F32 ? g_out[x] : kit_bf16_to_f32(g_out16[x]);
        worst = fmax(worst, fabs((double)o - g_ref[x]));
    }
    for (size_t x = 0; x < NL; x++) worst_lse = fmax(worst_lse, fabs((double)g_lse[x] - g_ref_lse[x]));
    CHECK(worst <= g.max_abs, "%s: out max_abs %.3g (gate %.3g)", name, worst, g.max_abs);
    CHECK(worst_lse <= g.lse_atol + g.lse_rtol * 10, "%s: lse max_abs %.3g", name, worst_lse);
    group_done(name, p0, f0);
}

/* One part, -inf and NaN rows, threads, layouts. */
static void properties(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    static const int cuts[] = {0, 30, 61, SK};
    make_parts(ctx, &g_p, cuts, 3, 1, 0);
    parts *one = malloc(sizeof *one);
    *one = g_p;
    one->n = 1;
    fc_attention_merge_args m = merge_args(one, g_out, FC_DTYPE_F32, g_lse);
    CHECK(fc_attention_merge(ctx, &m, NULL) == FC_OK && !memcmp(g_out, one->out[0], sizeof g_out) &&
              !memcmp(g_lse, one->lse[0], sizeof g_lse),
          "one part merges to itself bit for bit");

    for (size_t x = 0; x < NL; x += 7) g_p.lse[0][x] = g_p.lse[1][x] = g_p.lse[2][x] = -INFINITY;
    g_p.lse[1][3] = NAN;
    m = merge_args(&g_p, g_out, FC_DTYPE_F32, g_lse);
    CHECK(fc_attention_merge(ctx, &m, NULL) == FC_OK, "merge: %s", fc_last_error(ctx));
    int zero_rows = 1; /* lse index x = (b*HQ + h)*SQ + s; its out row (b, s, h) */
    for (size_t x = 0; x < NL; x += 7) {
        const size_t b = x / ((size_t)HQ * SQ), h = x / SQ % HQ, s = x % SQ;
        const float *row = g_out + ((b * SQ + s) * HQ + h) * D;
        for (int d = 0; d < D; d++) zero_rows &= row[d] == 0.0f;
        zero_rows &= isinf(g_lse[x]) && g_lse[x] < 0;
    }
    CHECK(zero_rows, "rows that no part saw: out 0, lse -inf");
    CHECK(isnan(g_lse[3]) && isnan(g_out[(3 * HQ + 0) * D]), "a NaN lse makes its row NaN");

    free(one);
    group_done("properties", p0, f0);
}

/* Random parts large enough for several workers (the pool gives a worker
 * 2^18 multiply-adds at least): 1 and 3 threads, the same bits. */
static void threads(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    enum { TB = 4, TS = 512, TH = 8, TP = 4 };
    const size_t no = (size_t)TB * TS * TH * D, nl = (size_t)TB * TH * TS;
    float *buf = malloc(((TP + 2) * no + (TP + 2) * nl) * sizeof(float));
    if (!buf) {
        CHECK(0, "no memory");
        return;
    }
    uint64_t r = 99;
    for (size_t x = 0; x < (TP + 2) * (no + nl); x++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        buf[x] = (float)((double)(r >> 11) / 9007199254740992.0 * 8.0 - 4.0);
    }
    fc_tensor to[TP], tl[TP];
    for (int i = 0; i < TP; i++) {
        to[i] = kit_contiguous(buf + i * no, FC_DTYPE_F32, TB, TS, TH, D);
        tl[i] = kit_contiguous(buf + (TP + 2) * no + i * nl, FC_DTYPE_F32, TB, TH, TS, 0);
    }
    fc_attention_merge_args m;
    fc_attention_merge_args_init(&m);
    m.num_parts = TP;
    m.parts_out = to;
    m.parts_lse = tl;
    float *outs[2] = {buf + TP * no, buf + (TP + 1) * no};
    float *lses[2] = {buf + (TP + 2) * no + TP * nl, buf + (TP + 2) * no + (TP + 1) * nl};
    for (int k = 0; k < 2; k++) {
        m.out = kit_contiguous(outs[k], FC_DTYPE_F32, TB, TS, TH, D);
        m.lse = kit_contiguous(lses[k], FC_DTYPE_F32, TB, TH, TS, 0);
        fc_context_set_num_threads(ctx, k ? 3 : 1);
        CHECK(fc_attention_merge(ctx, &m, NULL) == FC_OK, "%d threads: %s", k ? 3 : 1, fc_last_error(ctx));
    }
    CHECK(!memcmp(outs[0], outs[1], no * sizeof(float)) && !memcmp(lses[0], lses[1], nl * sizeof(float)),
          "3 threads give the 1-thread bits");
    fc_context_set_num_threads(ctx, 1);
    free(buf);
    group_done("threads", p0, f0);
}

/* Batch 0 alone as variable length ([total, H, D], lse [H, total]) and the
 * parts as transposed [B, H, S, D] views: the same bits as dense. */
static void layouts(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    static const int cuts[] = {0, 50, SK};
    make_parts(ctx, &g_p, cuts, 2, 0, 0);
    fc_attention_merge_args m = merge_args(&g_p, g_out, FC_DTYPE_F32, g_lse);
    CHECK(fc_attention_merge(ctx, &m, NULL) == FC_OK, "dense: %s", fc_last_error(ctx));
    static float vout[(size_t)SQ * HQ * D], vlse[(size_t)HQ * SQ];
    fc_tensor to[2], tl[2];
    for (int i = 0; i < 2; i++) {
        to[i] = kit_contiguous(g_p.out[i], FC_DTYPE_F32, SQ, HQ, D, 0);
        tl[i] = (fc_tensor){g_p.lse[i], FC_DTYPE_F32, 2, {HQ, SQ}, {SQ, 1}};
    }
    fc_attention_merge_args v = m;
    v.parts_out = to;
    v.parts_lse = tl;
    v.out = kit_contiguous(vout, FC_DTYPE_F32, SQ, HQ, D, 0);
    v.lse = (fc_tensor){vlse, FC_DTYPE_F32, 2, {HQ, SQ}, {SQ, 1}};
    CHECK(fc_attention_merge(ctx, &v, NULL) == FC_OK && !memcmp(vout, g_out, sizeof vout) &&
              !memcmp(vlse, g_lse, sizeof vlse),
          "variable length: the dense bits (%s)", fc_last_error(ctx));
    static float tout[NQ];
    fc_attention_merge_args t = m;
    t.lse.data = NULL;
    t.out = (fc_tensor){tout, FC_DTYPE_F32, 4, {B, SQ, HQ, D}, {(int64_t)HQ * SQ * D, D, (int64_t)SQ * D, 1}};
    CHECK(fc_attention_merge(ctx, &t, NULL) == FC_OK, "a [B, H, S, D] out: %s", fc_last_error(ctx));
    int same = 1;
    for (int b = 0; b < B; b++)
        for (int s = 0; s < SQ; s++)
            for (int h = 0; h < HQ; h++)
                same &= !memcmp(tout + (((size_t)b * HQ + h) * SQ + s) * D, g_out + (((size_t)b * SQ + s) * HQ + h) * D,
                                D * sizeof(float));
    CHECK(same, "a [B, H, S, D] out: the dense bits");
    group_done("layouts", p0, f0);
}

/* The backward of one key block [k0, k1) given the whole call's out and lse
 * (context parallelism's backward step): dq of the block's keys, and dk, dv
 * of its keys into the slices of dk_all, dv_all. */
static fc_status block_backward(fc_context *ctx, int k0, int k1, int causal, const float *dout, float *dq,
                                float *dk_all, float *dv_all)
{
    fc_attention_backward_args b;
    fc_attention_backward_args_init(&b);
    fc_attention_args *a = &b.fwd;
    a->q = kit_contiguous(g_q, FC_DTYPE_F32, B, SQ, HQ, D);
    a->k = kit_contiguous(g_k + (size_t)k0 * HKV * D, FC_DTYPE_F32, B, k1 - k0, HKV, D);
    a->v = kit_contiguous(g_v + (size_t)k0 * HKV * D, FC_DTYPE_F32, B, k1 - k0, HKV, D);
    a->k.stride[0] = a->v.stride[0] = (int64_t)SK * HKV * D;
    a->out = kit_contiguous(g_ref, FC_DTYPE_F32, B, SQ, HQ, D);
    a->lse = kit_contiguous(g_ref_lse, FC_DTYPE_F32, B, HQ, SQ, 0);
    if (causal) a->window_right = SK - k1;
    a->backend = FC_BACKEND_CPU;
    b.dout = kit_contiguous((void *)dout, FC_DTYPE_F32, B, SQ, HQ, D);
    b.dq = kit_contiguous(dq, FC_DTYPE_F32, B, SQ, HQ, D);
    b.dk = a->k;
    b.dk.data = dk_all + (size_t)k0 * HKV * D;
    b.dv = a->v;
    b.dv.data = dv_all + (size_t)k0 * HKV * D;
    return fc_attention_backward(ctx, &b, NULL, NULL);
}

/* The whole call's backward against the blocks' backwards given the whole
 * out and lse: dq the sum over blocks, dk and dv block by block. */
static void blockwise_backward(fc_context *ctx, const int *cuts, int n, int causal, const char *name)
{
    int p0 = g_pass, f0 = g_fail;
    const size_t nkv = (size_t)B * SK * HKV * D;
    float *dout = malloc(NQ * sizeof(float)), *dq = malloc(NQ * sizeof(float)), *dq_sum = calloc(NQ, sizeof(float));
    float *bufs = malloc(4 * nkv * sizeof(float)); /* dk, dv of the whole call, then of the blocks */
    static float full_dq[NQ];
    if (!dout || !dq || !dq_sum || !bufs) {
        CHECK(0, "no memory");
        goto out;
    }
    for (size_t x = 0; x < NQ; x++) dout[x] = g_q[(x * 7919) % NQ] * 0.5f;
    CHECK(forward(ctx, FC_BACKEND_CPU, 0, SK, causal, g_ref, g_ref_lse) == FC_OK, "forward: %s", fc_last_error(ctx));
    CHECK(block_backward(ctx, 0, SK, causal, dout, full_dq, bufs, bufs + nkv) == FC_OK, "whole: %s",
          fc_last_error(ctx));
    for (int i = 0; i < n; i++) {
        CHECK(block_backward(ctx, cuts[i], cuts[i + 1], causal, dout, dq, bufs + 2 * nkv, bufs + 3 * nkv) == FC_OK,
              "block %d: %s", i, fc_last_error(ctx));
        for (size_t x = 0; x < NQ; x++) dq_sum[x] += dq[x];
    }
    double worst = 0, scale = 0;
    for (size_t x = 0; x < NQ; x++) {
        worst = fmax(worst, fabs((double)dq_sum[x] - full_dq[x]));
        scale = fmax(scale, fabs(full_dq[x]));
    }
    for (size_t x = 0; x < 2 * nkv; x++) {
        worst = fmax(worst, fabs((double)bufs[2 * nkv + x] - bufs[x]));
        scale = fmax(scale, fabs(bufs[x]));
    }
    CHECK(worst <= 1e-5 * scale, "%s: the blocks' gradients %.3g off the whole call's (largest %.3g)", name, worst,
          scale);
out:
    free(dout);
    free(dq);
    free(dq_sum);
    free(bufs);
    group_done(name, p0, f0);
}

/* A refused call: the status, the argument named, out untouched. */
static void refused(fc_context *ctx, fc_attention_merge_args m, fc_status want, const char *word, const char *what)
{
    memset(g_out, 0x5a, sizeof g_out);
    const fc_status st = fc_attention_merge(ctx, &m, NULL);
    int untouched = 1;
    for (size_t x = 0; x < sizeof g_out; x++) untouched &= ((unsigned char *)g_out)[x] == 0x5a;
    CHECK(st == want && strstr(fc_last_error(ctx), word) && untouched, "%s: status %d, '%s', untouched %d", what,
          (int)st, fc_last_error(ctx), untouched);
}

static void errors(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    static const int cuts[] = {0, 40, SK};
    make_parts(ctx, &g_p, cuts, 2, 0, 0);
    const fc_attention_merge_args ok = merge_args(&g_p, g_out, FC_DTYPE_F32, g_lse);
    CHECK(fc_attention_merge(NULL, &ok, NULL) == FC_ERR_INVALID_ARGUMENT, "ctx NULL");
    CHECK(fc_attention_merge(ctx, NULL, NULL) == FC_ERR_INVALID_ARGUMENT, "args NULL");
    fc_attention_merge_args m = ok;
    m.num_parts = 0;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "num_parts", "no parts");
    m.num_parts = FC_MAX_MERGE_PARTS + 1;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "num_parts", "too many parts");
    m = ok;
    m.parts_lse = NULL;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "parts_lse", "parts_lse NULL");
    m = ok;
    m.out.dtype = FC_DTYPE_E4M3;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "out.dtype", "an FP8 out");
    m = ok;
    m.out.ndim = 2;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "out.ndim", "a 2-d out");
    fc_tensor to[2] = {g_p.to[0], g_p.to[1]}, tl[2] = {g_p.tl[0], g_p.tl[1]};
    m = ok;
    m.parts_out = to;
    m.parts_lse = tl;
    to[1].shape[1] = SQ - 1;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "parts_out[1].shape", "a part of another shape");
    to[1] = g_p.to[1];
    tl[0].shape[2] = SQ + 1;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "parts_lse[0]", "a part's lse of another shape");
    tl[0] = g_p.tl[0];
    tl[1].dtype = FC_DTYPE_F16;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "parts_lse[1].dtype", "an f16 lse");
    tl[1] = g_p.tl[1];
    to[0].data = (char *)g_p.out[0] + 2;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "aligned", "a misaligned part");
    to[0] = g_p.to[0];
    to[1].data = NULL;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "parts_out[1].data", "a NULL part");
    m = ok;
    m.out.data = g_p.out[1];
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "overlaps parts_out[1]", "out on a part");
    m = ok;
    m.lse.data = g_out + 64;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "lse overlaps out", "lse inside out");
    m = ok;
    m.out.stride[2] = 0;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "overlap", "an out whose heads share elements");
    m = ok;
    m.backend = (fc_backend)77;
    refused(ctx, m, FC_ERR_INVALID_ARGUMENT, "backend", "an invalid backend");
    m = ok;
    m.backend = FC_BACKEND_CUDA;
    refused(ctx, m, FC_ERR_UNSUPPORTED, "cuda", "the CUDA backend");
    CHECK(fc_attention_merge(ctx, &ok, NULL) == FC_OK && fc_last_error(ctx)[0] == 0, "a good call after: %s",
          fc_last_error(ctx));
    group_done("errors", p0, f0);
}

int main(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) return test_give_up("FAIL fc_context_create");
    fc_context_set_num_threads(ctx, 1);
    fill_inputs();
    static const int three[] = {0, 17, 64, SK}, four[] = {0, 25, 50, 75, SK}, two[] = {0, 70, SK};
    merged_equals_whole(ctx, "unmasked, 3 parts", three, 3, 0, 0, FC_DTYPE_F32);
    merged_equals_whole(ctx, "causal, 4 parts", four, 4, 1, 0, FC_DTYPE_F32);
    merged_equals_whole(ctx, "bf16 parts, bf16 out", two, 2, 1, 3u, FC_DTYPE_BF16);
    merged_equals_whole(ctx, "mixed parts, f32 out", three, 3, 0, 2u, FC_DTYPE_F32);
    blockwise_backward(ctx, three, 3, 0, "blockwise backward");
    blockwise_backward(ctx, four, 4, 1, "blockwise backward, causal");
    properties(ctx);
    threads(ctx);
    layouts(ctx);
    errors(ctx);
    fc_context_free(ctx);
    return test_summary();
}
