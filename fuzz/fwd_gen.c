/*
 * fwd_gen.c -- input bytes to one forward call: context settings, shapes,
 * layouts and their corruptions, options, cu_seqlens. Where each buffer
 * sits is place.c's, what it holds fill.c's; the backward's generator
 * (bwd_gen.c) starts from the same steps.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "kit.h"

/* How often each kind of call comes: the CPU build's weights, and the CUDA
 * fuzz build's, leaning toward what the CUDA backend takes (f16/bf16, its
 * head dims, backend CUDA/AUTO, 16-byte layouts, forced paths and tuning,
 * several tiles of keys) while every invalid class still comes. The CUDA
 * build's extra decisions read bytes only there, so a CPU input means the
 * same call it always did. */
typedef struct fz_weights {
    int path_pct, tuned_pct;  /* fc_context_set_cuda_path; fc_tuning set      */
    int dtype[6];             /* f32, f16, bf16, e4m3, e5m2, not an fc_dtype  */
    int head_dim[4];          /* 1-16, the CUDA list, 17-512, 513             */
    int backend[6];           /* CPU, CPU_REFERENCE, AUTO, CUDA, -1, 4        */
    int tokens_max;           /* varlen tokens a tensor may hold              */
} fz_weights;

static const fz_weights k_cpu = {10, 20, {30, 30, 30, 3, 3, 4}, {70, 20, 8, 2}, {70, 20, 5, 3, 1, 1}, 200};
static const fz_weights k_cuda = {60, 40, {6, 42, 42, 3, 3, 4}, {15, 70, 12, 3}, {4, 4, 45, 45, 1, 1}, 1200};
#define W (fz_cuda_mode ? &k_cuda : &k_cpu)

/* CUDA build: the reference's work bound (B*H*Sq*Sk*D): a case stays well
 * under a second on the CPU, however long its keys. */
#define FZ_REF_WORK ((int64_t)1 << 26)

int fz_pick(fz_in *in, const int *w, int n)
{
    int r = fz_range(in, 0, 99), i = 0;
    while (i < n - 1 && r >= w[i]) r -= w[i++];
    return i;
}

/* ---- context ------------------------------------------------------------ */

static void gen_context(fz_in *in, fz_call *c)
{
    static const int threads[] = {1, 2, 3, 0, 4, -1, 5000};
    c->threads = threads[fz_pick(in, (const int[]){40, 25, 10, 10, 10, 3, 2}, 7)];
    c->cuda_path = fz_chance(in, W->path_pct) ? (int[]){80, 90, 7, -1}[fz_range(in, 0, 3)] : 0;
    c->device = fz_chance(in, 5) ? fz_range(in, -3, 2) : -1;
    fc_tuning_init(&c->tun);
    c->tuned = fz_chance(in, W->tuned_pct);
    if (!c->tuned) return;
    int32_t *f[] = {&c->tun.sm90_config, &c->tun.sm80_config, &c->tun.sm90_rotate, &c->tun.sm90_tail,
                    &c->tun.sm90_grid, &c->tun.splits, &c->tun.pdl, &c->tun.masks};
    for (int i = 0; i < 8; i++)
        if (fz_chance(in, 30)) *f[i] = fz_chance(in, 10) ? (int32_t)fz_u32(in) : fz_range(in, -3, 70);
    if (fz_chance(in, 10)) c->tun.sm90_trace_file = "/dev/null";
}

/* ---- tensors -------------------------------------------------------------- */

/* Padding after a dim, in elements; the CUDA build mostly keeps strides a
 * multiple of 8 (16 bytes), the CUDA kernels' layout limit. */
static int64_t gen_pad(fz_in *in)
{
    if (fz_skip & FZ_SKIP_ODD_STRIDE) return 8 * fz_range(in, 1, 2);
    if (fz_cuda_mode && fz_chance(in, 80)) return 8 * fz_range(in, 1, 2);
    return fz_range(in, 1, 9);
}

/* Row-major strides with optional padding after each dim and, sometimes,
 * two outer dims swapped (BHSD and the like). */
static void gen_strides(fz_in *in, fc_tensor *t)
{
    int nd = t->ndim, order[3] = {nd - 2, nd - 3, nd - 4}; /* innermost outer dim first */
    if (nd >= 3 && fz_chance(in, 30)) { int x = order[0]; order[0] = order[1]; order[1] = x; }
    if (nd == 4 && fz_chance(in, 10)) { int x = order[1]; order[1] = order[2]; order[2] = x; }
    int64_t ext = t->shape[nd - 1];
    t->stride[nd - 1] = 1;
    for (int i = 0; i < nd - 1; i++) {
        int k = order[i];
        t->stride[k] = ext + (fz_chance(in, 25) ? gen_pad(in) : 0);
        ext = t->stride[k] * (t->shape[k] > 0 ? t->shape[k] : 1);
    }
}

static void set_tensor(fz_in *in, fc_tensor *t, fc_dtype dt, int nd, const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = nd;
    for (int i = 0; i < nd; i++) t->shape[i] = shape[i];
    gen_strides(in, t);
}

/* One corruption a caller could make; the library must reject or handle it. */
static void corrupt(fz_in *in, fc_tensor *t)
{
    static const int64_t huge[] = {INT64_MAX / 3, INT64_MAX / 2 + 1, (int64_t)1 << 62, INT64_MAX};
    static const int64_t bad_shape[] = {0, -1, (int64_t)INT32_MAX + 1, INT64_MIN, 1};
    int k = fz_range(in, 0, t->ndim - 1);
    switch (fz_range(in, 0, 7)) {
    case 0: t->stride[t->ndim - 1] = fz_range(in, 0, 2) * 2; break;
    case 1: t->stride[k] = 0; break;
    case 2: t->stride[k] = -t->stride[k] - fz_range(in, 0, 1); break;
    case 3: t->stride[k] = huge[fz_range(in, 0, 3)]; break;
    case 4: t->stride[k] = 1; break;
    case 5: t->shape[k] = bad_shape[fz_range(in, 0, 4)]; break;
    case 6: t->ndim = (int32_t[]){0, 1, 2, 3, 4, 5, -1}[fz_range(in, 0, 6)]; break;
    default: t->dtype = (fc_dtype)fz_range(in, -1, 5); break;
    }
}

int fz_footprint(const fc_tensor *t, int64_t *lo, int64_t *hi)
{
    __int128 l = 0, h = 0;
    int nd = t->ndim < 1 ? 1 : t->ndim > 4 ? 4 : t->ndim;
    *lo = 0;
    *hi = 64;
    for (int i = 0; i < nd; i++) {
        if (t->shape[i] <= 0 || t->shape[i] > INT32_MAX) return 1;
        __int128 e = (__int128)(t->shape[i] - 1) * t->stride[i];
        if (e < 0) l += e; else h += e;
    }
    const int64_t es = (int64_t)fz_dtype_size(t->dtype);
    if (h > (INT64_MAX - 1) / es || -l > INT64_MAX / es) return 0;
    if ((h + 1 - l) * es > FZ_ARENA_MAX) return -1;
    *lo = (int64_t)(l * es);
    *hi = (int64_t)((h + 1) * es);
    return 1;
}
/* A tensor, corrupted now and then; a corruption that would need more
 * memory than the arena gets is undone. ok: its elements may be listed. */
void fz_gen_tensor(fz_in *in, fc_tensor *t, fc_dtype dt, int nd, const int64_t *shape, int *ok)
{
    set_tensor(in, t, dt, nd, shape);
    const fc_tensor clean = *t;
    if (fz_chance(in, 4)) corrupt(in, t);
    int64_t lo, hi;
    *ok = fz_footprint(t, &lo, &hi);
    if (*ok < 0) {
        *t = clean;
        *ok = fz_footprint(t, &lo, &hi) > 0;
    }
}

static int gen_dim(fz_in *in, int lo_invalid)
{
    if (lo_invalid && fz_chance(in, 3)) return 0;
    if (fz_cuda_mode && fz_chance(in, 15)) return fz_range(in, 65, 700); /* tiles, split-KV */
    return fz_chance(in, 25) ? fz_range(in, 1, 64) : fz_range(in, 1, 12);
}

static int gen_head_dim(fz_in *in)
{
    static const int pow2ish[] = {32, 64, 96, 128, 192, 256};
    switch (fz_pick(in, W->head_dim, 4)) {
    case 0: return fz_range(in, 1, 16);
    case 1: return pow2ish[fz_range(in, 0, 5)];
    case 2: return fz_range(in, 17, 512);
    default: return 513;
    }
}

/* Valid offsets for lengths in [0, max] (the first sequence attains it);
 * then, rarely, one entry made arbitrary. Returns the largest length. */
static int32_t gen_cu(fz_in *in, int32_t *cu, int n, int max)
{
    static const int32_t odd[] = {-1, 1, 80, INT32_MAX, INT32_MIN, 3};
    int32_t top = 0;
    cu[0] = 0;
    for (int b = 0; b < n; b++) {
        int32_t len = b == 0 ? max : fz_range(in, 0, max);
        cu[b + 1] = cu[b] + len;
        if (len > top) top = len;
    }
    if (!(fz_skip & FZ_SKIP_ODD_CU) && fz_chance(in, 6)) cu[fz_range(in, 0, n)] = odd[fz_range(in, 0, 5)];
    return top;
}

static int32_t gen_max_seqlen(fz_in *in, int32_t top)
{
    if (!(fz_skip & FZ_SKIP_MAX_SEQLEN) && fz_chance(in, 5))
        return fz_chance(in, 50) ? INT32_MAX : (int32_t)1 << fz_range(in, 20, 30);
    if (fz_chance(in, 5)) return top - 1;
    return top + (fz_chance(in, 10) ? fz_range(in, 1, 100) : 0);
}

/* q, k, v, out, lse: dense [b, s, h, d] or varlen [t, h, d]. */
static void gen_tensors(fz_in *in, fz_call *c, int ok[FB_N])
{
    static const fc_dtype dts[] = {FC_DTYPE_F32, FC_DTYPE_F16, FC_DTYPE_BF16, FC_DTYPE_E4M3,
                                   FC_DTYPE_E5M2, (fc_dtype)7};
    const fc_dtype dt = c->dtype = dts[fz_pick(in, W->dtype, 6)];
    const int B = fz_range(in, 1, 3), HQ = fz_range(in, 1, 4), D = gen_head_dim(in);
    int HKV = fz_chance(in, 95) ? HQ / (int[]){1, 2, 4}[fz_range(in, 0, 2)] : fz_range(in, 1, 4);
    if (HKV < 1) HKV = 1;
    int64_t SQ = gen_dim(in, !c->varlen), SK = gen_dim(in, !c->varlen);
    while (fz_cuda_mode && SQ > 1 && B * HQ * SQ * SK * D > FZ_REF_WORK) SQ = (SQ + 1) / 2;
    if (c->bwd && c->varlen && fz_chance(in, 8)) SQ = 0; /* no query token: dk, dv still written */
    if (c->bwd && c->varlen && fz_chance(in, 5)) SK = 0;
    fc_attention_args *a = &c->a;
    if (c->varlen) {
        c->nseq = B;
        const int32_t tq = gen_cu(in, c->cu[0], B, (int)SQ), tk = gen_cu(in, c->cu[1], B, (int)SK);
        a->num_seqs = fz_chance(in, 3) ? fz_range(in, -1, 0) : B;
        a->max_seqlen_q = gen_max_seqlen(in, tq);
        a->max_seqlen_k = gen_max_seqlen(in, tk);
        c->total_owned[0] = c->cu[0][B];
        c->total_owned[1] = c->cu[1][B];
        const int32_t top = W->tokens_max;
        SQ = c->cu[0][B] < 0 ? 0 : c->cu[0][B] > top ? top : c->cu[0][B];
        SK = c->cu[1][B] < 0 ? 0 : c->cu[1][B] > top ? top : c->cu[1][B];
        if (fz_chance(in, 15)) SQ += fz_range(in, 1, 3); /* tokens no sequence owns */
        if (fz_chance(in, 10)) SK += fz_range(in, 1, 3);
    }
    const int64_t qs[4] = {B, SQ, HQ, D}, ks[4] = {B, SK, HKV, D};
    const int o = c->varlen, nd = 4 - o;
    for (int i = 0; i < nd; i++) { c->shape[0][i] = qs[o + i]; c->shape[1][i] = ks[o + i]; }
    fz_gen_tensor(in, &a->q, dt, nd, qs + o, &ok[FB_Q]);
    fz_gen_tensor(in, &a->k, dt, nd, ks + o, &ok[FB_K]);
    fz_gen_tensor(in, &a->v, dt, nd, ks + o, &ok[FB_V]);
    /* FP8 q/k/v write f16 or bf16 (an FP8 out is refused) */
    const int fp8 = dt == FC_DTYPE_E4M3 || dt == FC_DTYPE_E5M2;
    const fc_dtype odt = fp8 && fz_chance(in, 85) ? (fz_chance(in, 50) ? FC_DTYPE_BF16 : FC_DTYPE_F16) : dt;
    fz_gen_tensor(in, &a->out, odt, nd, qs + o, &ok[FB_O]);
    if (fz_chance(in, c->bwd ? 97 : 50)) { /* the backward needs it */
        const int64_t ls[3] = {B, HQ, SQ};
        fz_gen_tensor(in, &a->lse, fz_chance(in, 97) ? FC_DTYPE_F32 : FC_DTYPE_F16, 3 - o, ls + o, &ok[FB_LSE]);
    }
}

/* ---- options ---------------------------------------------------------------- */

static float gen_float(fz_in *in, const int w[5], float lo, float hi, const float *extreme, int n_ext)
{
    static const float invalid[] = {INFINITY, -INFINITY, NAN, -1.0f};
    int k = fz_pick(in, w, 5);
    if (k == 3 && (fz_skip & FZ_SKIP_EXTREME)) k = 0;
    switch (k) {
    case 0: return 0.0f;
    case 1: return lo + (hi - lo) * (float)fz_range(in, 0, 1000) / 1000.0f;
    case 2: return powf(10.0f, (float)fz_range(in, -3, 4)) * (fz_chance(in, 20) ? -1.0f : 1.0f);
    case 3: return extreme[fz_range(in, 0, n_ext - 1)];
    default: return invalid[fz_range(in, 0, 3)];
    }
}

static void gen_options(fz_in *in, fz_call *c)
{
    static const float ext_scale[] = {1e30f, 2e38f, 3e38f, FLT_MAX, -3e38f, 1e-40f, 1e-45f, FLT_MIN};
    static const float ext_cap[] = {3e38f, FLT_MAX, 1e-40f, 1e-45f, 1e20f, 2e38f};
    static const fc_backend backends[] = {FC_BACKEND_CPU, FC_BACKEND_CPU_REFERENCE, FC_BACKEND_AUTO,
                                          FC_BACKEND_CUDA, (fc_backend)-1, (fc_backend)4};
    fc_attention_args *a = &c->a;
    a->scale = gen_float(in, (const int[]){45, 35, 10, 7, 3}, -1.5f, 1.5f, ext_scale, 8);
    /* the CUDA kernels refuse a negative scale without softcap: mostly positive there */
    if (fz_cuda_mode && a->scale < 0.0f && fz_chance(in, 85)) a->scale = -a->scale;
    a->softcap = fabsf(gen_float(in, (const int[]){55, 30, 6, 6, 3}, 0.5f, 50.0f, ext_cap, 6));
    if (fz_chance(in, 2)) a->softcap = -1.0f;
    a->causal = fz_chance(in, 98) ? fz_chance(in, 25) : fz_range(in, -1, 2);
    int32_t *w[2] = {&a->window_left, &a->window_right};
    for (int i = 0; i < 2; i++)
        *w[i] = fz_chance(in, 70) ? -1 : fz_chance(in, 90) ? fz_range(in, 0, 70) : fz_chance(in, 50) ? -2 : INT32_MIN;
    a->backend = backends[fz_pick(in, W->backend, 6)];
}


/* Sometimes an FP8 K/V cache under an f32/f16/bf16 q: k and v retyped
 * (last, so that every earlier decision reads the bytes it always did). */
static void gen_fp8_kv(fz_in *in, fz_call *c)
{
    c->kv_dtype = c->dtype;
    if (c->dtype != FC_DTYPE_F32 && c->dtype != FC_DTYPE_F16 && c->dtype != FC_DTYPE_BF16) return;
    if (!fz_chance(in, 8)) return;
    c->kv_dtype = fz_chance(in, 50) ? FC_DTYPE_E4M3 : FC_DTYPE_E5M2;
    c->a.k.dtype = c->a.v.dtype = c->kv_dtype;
}

void fz_gen_forward(fz_in *in, fz_call *c, int ok[FB_N])
{
    fc_attention_args_init(&c->a);
    gen_context(in, c);
    c->args_null = fz_chance(in, 1);
    c->varlen = fz_chance(in, 35);
    gen_tensors(in, c, ok);
    gen_options(in, c);
    gen_fp8_kv(in, c);
}

/* Inputs first, then the outputs' poison, then cu_seqlens, descales and
 * the paged arrays, so those placed inside an output hold valid values
 * when the call reads them. */
int fz_fwd_build(fz_in *in, fz_call *c)
{
    memset(c, 0, sizeof *c);
    int ok[FB_N] = {0};
    fz_gen_forward(in, c, ok);
    int64_t size = fz_place_call(in, c);
    fz_fill_plan_read(in, c);
    size = fz_gen_paged(in, c, ok, size);
    if (fz_alloc_call(c, size)) return -1;
    fz_fill_inputs(c, ok);
    fz_mark_unused_rows(c, ok);
    fz_scrub_inputs(c, ok);
    for (int b = FB_O; b <= FB_LSE; b++)
        if (ok[b] && c->off[b] >= 0) fz_poison_output(c, b);
    fz_write_arrays(c);
    return 0;
}
