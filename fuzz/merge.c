/*
 * merge.c -- fc_attention_merge under fuzzing: 1-4 parts (out, lse) and the
 * outputs of random shapes, dtypes, layouts and padded strides in one
 * arena, and now and then one broken argument (a part count out of range,
 * a NULL or misaligned pointer, a dtype, a shape, a stride, an output over
 * a part or over out). A broken call must be refused with a message and
 * write nothing; an intact one must be accepted, write every output element
 * and nothing else, and equal the merge computed in double within the
 * output dtype's rounding. The CPU build's arena is host memory (the CPU
 * backend); the CUDA build's is managed memory, so AUTO runs the CUDA
 * merge, and the device is synchronized before anything is read.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

enum { MAXP = 4, NT = 2 * MAXP + 2 }; /* tensors: parts' outs, parts' lses, out, lse */

typedef struct merge_call {
    fc_attention_merge_args a;
    fc_tensor t[NT]; /* [0, MAXP) outs, [MAXP, 2 MAXP) lses, out, lse */
    int n, varlen, broken, lse_on;
    int64_t dims[4]; /* B, S, H, D (varlen: B = 1, S = tokens)  */
    fz_arena ar;
} merge_call;

static merge_call *g_mc;

static void describe(void)
{
    const merge_call *m = g_mc;
    fprintf(stderr, "merge call: num_parts=%d (built %d) varlen=%d dims=[%lld,%lld,%lld,%lld] lse=%d broken=%d\n",
            (int)m->a.num_parts, m->n, m->varlen, (long long)m->dims[0], (long long)m->dims[1],
            (long long)m->dims[2], (long long)m->dims[3], m->lse_on, m->broken);
    for (int i = 0; i < NT; i++) {
        const fc_tensor *t = &m->t[i];
        if (!t->ndim) continue;
        fprintf(stderr,
                "  t%d data=%s+%lld dtype=%d ndim=%d shape=[%lld,%lld,%lld,%lld] stride=[%lld,%lld,%lld,%lld]\n",
                i, t->data ? "arena" : "NULL", t->data ? (long long)((uint8_t *)t->data - m->ar.base) : 0LL,
                (int)t->dtype, (int)t->ndim, (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                (long long)t->shape[3], (long long)t->stride[0], (long long)t->stride[1], (long long)t->stride[2],
                (long long)t->stride[3]);
    }
}

/* Shape of an out-like (lse 0) or lse tensor of the call. */
static void shape_of(const merge_call *m, int lse, fc_tensor *t)
{
    const int64_t B = m->dims[0], S = m->dims[1], H = m->dims[2], D = m->dims[3];
    if (lse) {
        t->ndim = m->varlen ? 2 : 3;
        const int64_t s[3] = {B, H, S}, v[2] = {H, S};
        memcpy(t->shape, m->varlen ? v : s, (size_t)t->ndim * sizeof(int64_t));
    } else {
        t->ndim = m->varlen ? 3 : 4;
        const int64_t s[4] = {B, S, H, D}, v[3] = {S, H, D};
        memcpy(t->shape, m->varlen ? v : s, (size_t)t->ndim * sizeof(int64_t));
    }
}

/* Row-major strides with 0-2 elements of padding after each dimension. */
static void strides(fz_in *in, fc_tensor *t)
{
    int64_t s = 1;
    for (int k = t->ndim - 1; k >= 0; k--) {
        t->stride[k] = s;
        s = s * (t->shape[k] > 0 ? t->shape[k] : 1) + (fz_chance(in, 30) ? fz_range(in, 1, 2) : 0);
    }
}

static int64_t extent_bytes(const fc_tensor *t)
{
    int64_t last = 0;
    for (int k = 0; k < t->ndim; k++) {
        if (t->shape[k] == 0) return 0;
        last += (t->shape[k] - 1) * t->stride[k];
    }
    return (last + 1) * (int64_t)fz_dtype_size(t->dtype);
}

static void build(fz_in *in, merge_call *m)
{
    static const fc_dtype dts[3] = {FC_DTYPE_F32, FC_DTYPE_F16, FC_DTYPE_BF16};
    m->n = fz_range(in, 1, MAXP);
    m->varlen = fz_chance(in, 30);
    m->dims[0] = m->varlen ? 1 : fz_range(in, 1, 2);
    m->dims[1] = fz_range(in, m->varlen ? 0 : 1, 6);
    m->dims[2] = fz_range(in, 1, 3);
    m->dims[3] = fz_range(in, 1, 12);
    m->lse_on = fz_chance(in, 70);
    for (int i = 0; i < NT; i++) {
        fc_tensor *t = &m->t[i];
        const int lse = (i >= MAXP && i < 2 * MAXP) || i == NT - 1;
        if ((i % MAXP >= m->n && i < 2 * MAXP) || (i == NT - 1 && !m->lse_on)) continue;
        shape_of(m, lse, t);
        t->dtype = lse ? FC_DTYPE_F32 : dts[fz_range(in, 0, 2)];
        strides(in, t);
    }
}

/* One broken argument, or none. Returns 1 when one was broken. */
static int break_one(fz_in *in, merge_call *m)
{
    if (!fz_chance(in, 25)) return 0;
    const int i = fz_range(in, 0, NT - 1), what = fz_range(in, 0, 4);
    fc_tensor *t = &m->t[i];
    if (!t->ndim || what == 0) { /* a count out of range */
        m->a.num_parts = fz_chance(in, 50) ? 0 : FC_MAX_MERGE_PARTS + 1;
        return 1;
    }
    if (what == 1) t->dtype = fz_chance(in, 50) ? FC_DTYPE_E4M3 : (fc_dtype)99;
    if (what == 2) t->shape[fz_range(in, 0, t->ndim - 1)] += 1;
    if (what == 3) t->stride[t->ndim - 1] = 2;
    if (what == 4) t->ndim = t->ndim == 4 ? 2 : 4;
    return 1;
}

/* Offsets in the arena, in order, aligned to 16 bytes unless a pointer is
 * broken: misaligned, NULL, or an output put on a part (or lse on out). */
static int64_t place(fz_in *in, merge_call *m, int64_t *off)
{
    int64_t at = 16;
    for (int i = 0; i < NT; i++) {
        off[i] = at;
        at += (extent_bytes(&m->t[i]) + 31) / 16 * 16;
    }
    if (m->broken || !fz_chance(in, 20)) return at;
    const int kind = fz_range(in, 0, 2), p = fz_range(in, 0, m->n - 1);
    const int64_t out_bytes = extent_bytes(&m->t[2 * MAXP]);
    if (kind == 0) off[fz_chance(in, 50) ? p : 2 * MAXP] += 1; /* misaligned (f32/f16/bf16: >= 2 bytes) */
    if (kind == 1) off[2 * MAXP] = off[fz_chance(in, 50) ? p : MAXP + p];
    if (kind == 2) off[NT - 1] = off[2 * MAXP] + 4; /* lse inside out */
    /* an empty tensor addresses nothing: only a real overlap is broken */
    m->broken = kind == 0 || (kind == 1 && out_bytes > 0 && extent_bytes(&m->t[p]) > 0) ||
                (kind == 2 && m->lse_on && out_bytes > 4 && extent_bytes(&m->t[NT - 1]) > 0);
    return at;
}

/* Random part values and lses (-inf now and then, NaN rarely). */
static void fill(fz_in *in, merge_call *m)
{
    uint64_t r = fz_u64(in) | 1;
    for (int i = 0; i < 2 * MAXP; i++) {
        fc_tensor *t = &m->t[i];
        int64_t *offs = NULL, k = t->data && t->ndim ? fz_tensor_offsets(t, &offs) : -1;
        for (int64_t e = 0; e < k; e++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            float v = (float)((double)(r >> 11) / 9007199254740992.0 * 8.0 - 4.0);
            if (i >= MAXP) {
                const unsigned c = (unsigned)(r >> 3) % 64u;
                v = c < 6 ? -INFINITY : c == 6 ? NAN : v * 6.0f;
            }
            fz_store(t->data, t->dtype, offs[e], v);
        }
        free(offs);
    }
}

/* Element offset of row (b, s, h) in an out-like tensor (lse 0; its head
 * dim's first element) or an lse tensor, dense or variable-length. */
static int64_t elem(const merge_call *m, const fc_tensor *t, int lse, int64_t b, int64_t s, int64_t h)
{
    if (m->varlen) return lse ? h * t->stride[0] + s * t->stride[1] : s * t->stride[0] + h * t->stride[1];
    return b * t->stride[0] + (lse ? h * t->stride[1] + s * t->stride[2] : s * t->stride[1] + h * t->stride[2]);
}

/* The double merge of one row; its out elements and lse against it. */
static void check_row(const merge_call *m, int64_t b, int64_t s, int64_t h)
{
    const fc_tensor *o = &m->t[2 * MAXP], *l = &m->t[NT - 1];
    double w[MAXP], mx = -INFINITY;
    int nan = 0;
    for (int i = 0; i < m->n; i++) {
        const fc_tensor *t = &m->t[MAXP + i];
        w[i] = fz_load(t->data, FC_DTYPE_F32, elem(m, t, 1, b, s, h));
        nan |= isnan(w[i]) || w[i] == INFINITY;
        if (w[i] > mx) mx = w[i];
    }
    double sum = 0;
    for (int i = 0; i < m->n; i++) sum += w[i] == -INFINITY ? 0.0 : exp(w[i] - mx);
    const double tol = o->dtype == FC_DTYPE_F32 ? 1e-5 : o->dtype == FC_DTYPE_F16 ? 2e-3 : 1.6e-2;
    for (int64_t d = 0; d < m->dims[3]; d++) {
        double want = 0;
        for (int i = 0; i < m->n; i++) {
            if (w[i] == -INFINITY || nan) continue;
            const fc_tensor *t = &m->t[i];
            want += exp(w[i] - mx) / sum * fz_load(t->data, t->dtype, elem(m, t, 0, b, s, h) + d);
        }
        const int64_t oi = elem(m, o, 0, b, s, h) + d;
        const double got = fz_load(o->data, o->dtype, oi);
        if (nan ? !isnan(got) : !(fabs(got - want) <= tol * (1.0 + fabs(want)) + 1e-6))
            fz_fail("merge", "out at row (%lld,%lld,%lld) element %lld: %.9g, want %.9g", (long long)b, (long long)s,
                    (long long)h, (long long)d, got, want);
    }
    if (!m->lse_on) return;
    const int64_t li = elem(m, l, 1, b, s, h);
    const double got = fz_load(l->data, FC_DTYPE_F32, li), want = mx == -INFINITY && !nan ? -INFINITY : mx + log(sum);
    if (nan ? !isnan(got) : !(got == want || fabs(got - want) <= 1e-5 * (1.0 + fabs(want))))
        fz_fail("merge", "lse at row (%lld,%lld,%lld): %.9g, want %.9g", (long long)b, (long long)s, (long long)h, got,
                want);
}

static void check(fc_context *ctx, merge_call *m)
{
    fz_arena_snapshot(&m->ar);
    const fc_status st = fc_attention_merge(ctx, &m->a, NULL);
    fz_device_sync("fc_attention_merge"); /* the CUDA build: the kernel done (or a fault found) */
    fz_check_status(ctx, st, "fc_attention_merge");
    fz_stats_of[FZ_MERGE].status[st]++;
    if (st != FC_OK) {
        if (!m->broken) fz_fail("merge", "an intact call was refused: %s", fc_last_error(ctx));
        if (fz_arena_changed(&m->ar, 0) >= 0) fz_fail("merge", "a refused call wrote: %s", fc_last_error(ctx));
        return;
    }
    if (m->broken) fz_fail("merge", "a broken call was accepted");
    if (fz_arena_changed(&m->ar, 1) >= 0) fz_fail("merge", "the call wrote outside out and lse");
    for (int64_t b = 0; b < m->dims[0]; b++)
        for (int64_t s = 0; s < m->dims[1]; s++)
            for (int64_t h = 0; h < m->dims[2]; h++) check_row(m, b, s, h);
    fz_stats_of[FZ_MERGE].gated++;
}

/* Mark out's and lse's bytes as outputs, and poison them. */
static void mark_outputs(merge_call *m)
{
    for (int i = 2 * MAXP; i < NT; i++) {
        fc_tensor *t = &m->t[i];
        int64_t *offs = NULL, k = t->data && t->ndim ? fz_tensor_offsets(t, &offs) : -1;
        const size_t es = fz_dtype_size(t->dtype);
        for (int64_t e = 0; e < k; e++) {
            const int64_t byte = (int64_t)((uint8_t *)t->data - m->ar.base) + offs[e] * (int64_t)es;
            if (byte >= 0 && (size_t)byte + es <= m->ar.size) memset(m->ar.mask + byte, 1, es);
        }
        free(offs);
    }
}

void fz_entry_merge(fz_in *in)
{
    merge_call m;
    memset(&m, 0, sizeof m);
    build(in, &m);
    fc_attention_merge_args_init(&m.a);
    m.a.num_parts = m.n;
    m.broken = break_one(in, &m);
    int64_t off[NT];
    const int64_t size = place(in, &m, off);
    if (fz_arena_init(&m.ar, (size_t)size + 64, fz_cuda_mode)) return;
    for (int i = 0; i < NT; i++)
        if (m.t[i].ndim) m.t[i].data = m.ar.base + off[i];
    if (!m.broken && fz_chance(in, 3)) { /* a NULL pointer */
        m.t[fz_chance(in, 50) ? 0 : 2 * MAXP].data = NULL;
        m.broken = 1;
    }
    m.a.parts_out = m.t;
    m.a.parts_lse = m.t + MAXP;
    m.a.out = m.t[2 * MAXP];
    if (m.lse_on) m.a.lse = m.t[NT - 1];
    fill(in, &m);
    mark_outputs(&m);
    g_mc = &m;
    fz_describe = describe;
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) == FC_OK) {
        fc_context_set_num_threads(ctx, fz_range(in, 1, 3));
        check(ctx, &m);
    }
    fc_context_free(ctx);
    g_mc = NULL;
    fz_arena_free(&m.ar);
}
