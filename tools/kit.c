/*
 * kit.c -- random problems, poisoning, comparison gates and clocks for the
 * tests and the CLI (see kit.h). Host memory only.
 */
#define _POSIX_C_SOURCE 200809L
#include "kit.h"
#include "kit_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- dtypes ---------------------------------------------------------------- */

/* Poison payloads: quiet NaNs with a payload that arithmetic never produces
 * (hardware and libm produce the canonical NaN), so "still poison" means
 * "never written". */
#define KIT_POISON_F32 0x7FC0DEADu
#define KIT_POISON_16 0x7E5Au   /* f16 NaN with payload 0x25A */
#define KIT_POISON_BF16 0x7FA5u /* bf16 NaN with payload 0x25 */

size_t kit_dtype_size(fc_dtype dtype)
{
    switch (dtype) {
    case FC_DTYPE_F64: return 8;
    case FC_DTYPE_F32: return 4;
    case FC_DTYPE_F16:
    case FC_DTYPE_BF16: return 2;
    case FC_DTYPE_E4M3:
    case FC_DTYPE_E5M2: return 1;
    }
    return 0;
}

const char *kit_dtype_name(fc_dtype dtype)
{
    switch (dtype) {
    case FC_DTYPE_F32: return "f32";
    case FC_DTYPE_F16: return "f16";
    case FC_DTYPE_BF16: return "bf16";
    case FC_DTYPE_E4M3: return "e4m3";
    case FC_DTYPE_E5M2: return "e5m2";
    case FC_DTYPE_F64: return "f64";
    }
    return "?";
}

const char *kit_layout_name(kit_layout layout)
{
    return layout == KIT_LAYOUT_BHSD ? "bhsd" : layout == KIT_LAYOUT_PADDED ? "padded" : "bshd";
}

int kit_dtype_parse(const char *s, fc_dtype *out)
{
    if (!strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32")) *out = FC_DTYPE_F32;
    else if (!strcmp(s, "f16") || !strcmp(s, "fp16") || !strcmp(s, "float16")) *out = FC_DTYPE_F16;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *out = FC_DTYPE_BF16;
    else return -1;
    return 0;
}

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t kit_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float kit_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t kit_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7FFFFFFFu;
    if (absu > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);       /* NaN */
    if (absu >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);      /* rounds to >= 65520: inf */
    if (absu < 0x38800000u) {                                        /* subnormal or zero */
        if (absu < 0x33000000u) return (uint16_t)sign;               /* < 2^-25: 0 */
        uint32_t mant = (absu & 0x7FFFFFu) | 0x800000u;
        int shift = 126 - (int)(absu >> 23); /* 14..24 */
        uint32_t half = 1u << (shift - 1);
        uint32_t r = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = absu - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t out = r >> 13;
    uint32_t rem = r & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (out & 1u))) out++;
    return (uint16_t)(sign | out);
}

float kit_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        float f = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24 */
        return sign ? -f : f;
    }
    if (exp == 31) return bits_f32(sign | 0x7F800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* e4m3fn: bias 7, no infinity, max 448, NaN S.1111.111; e5m2: the top
 * byte of a binary16 (bias 15, max 57344, IEEE infinities and NaNs). */
uint8_t kit_f32_to_fp8(float f, fc_dtype dtype)
{
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    if (isnan(f)) return (uint8_t)(sign | 0x7f);
    const int e5 = dtype == FC_DTYPE_E5M2;
    float a = fabsf(f);
    if (a > (e5 ? 57344.0f : 448.0f)) a = e5 ? 57344.0f : 448.0f; /* saturate */
    if (e5) { /* round the binary16 at its 8th bit, ties to even: no double rounding past f16's own */
        uint16_t h = kit_f32_to_f16(a);
        h = (uint16_t)(h + 0x7f + ((h >> 8) & 1));
        return (uint8_t)(sign | (h >> 8));
    }
    if (a < 0x1p-6f) return (uint8_t)(sign | (uint8_t)nearbyintf(a * 0x1p9f)); /* subnormal; 8 = 2^-6 */
    uint32_t u = f32_bits(a);
    u += 0x7ffffu + ((u >> 20) & 1u); /* round the 23-bit mantissa to 3 bits */
    const uint32_t code = ((((u >> 23) & 0xffu) - 120u) << 3) | ((u >> 20) & 7u);
    return (uint8_t)(sign | (code > 0x7e ? 0x7e : code));
}

float kit_fp8_to_f32(uint8_t x, fc_dtype dtype)
{
    if (dtype == FC_DTYPE_E5M2) return kit_f16_to_f32((uint16_t)(x << 8));
    const uint32_t e = (x >> 3) & 0xfu, m = x & 7u;
    float a = e ? bits_f32(((e + 120u) << 23) | (m << 20)) : (float)m * 0x1p-9f;
    if (e == 15 && m == 7) a = NAN;
    return (x & 0x80) ? -a : a;
}

float kit_load(const void *buf, fc_dtype dtype, int64_t idx)
{
    switch (dtype) {
    case FC_DTYPE_F32: return ((const float *)buf)[idx];
    case FC_DTYPE_F16: return kit_f16_to_f32(((const uint16_t *)buf)[idx]);
    case FC_DTYPE_BF16: return kit_bf16_to_f32(((const uint16_t *)buf)[idx]);
    case FC_DTYPE_E4M3:
    case FC_DTYPE_E5M2: return kit_fp8_to_f32(((const uint8_t *)buf)[idx], dtype);
    default: return NAN;
    }
}

void kit_store(void *buf, fc_dtype dtype, int64_t idx, float v)
{
    switch (dtype) {
    case FC_DTYPE_F32: ((float *)buf)[idx] = v; break;
    case FC_DTYPE_F16: ((uint16_t *)buf)[idx] = kit_f32_to_f16(v); break;
    case FC_DTYPE_BF16: ((uint16_t *)buf)[idx] = kit_f32_to_bf16(v); break;
    case FC_DTYPE_E4M3:
    case FC_DTYPE_E5M2: ((uint8_t *)buf)[idx] = kit_f32_to_fp8(v, dtype); break;
    default: break;
    }
}

static int is_fp8(fc_dtype dt) { return dt == FC_DTYPE_E4M3 || dt == FC_DTYPE_E5M2; }

fc_dtype kit_kv_dtype(const kit_shape *s) { return is_fp8(s->dtype) ? s->dtype : s->fp8_kv ? (fc_dtype)s->fp8_kv : s->dtype; }

fc_dtype kit_out_dtype(const kit_shape *s) { return is_fp8(s->dtype) ? s->fp8_out : s->dtype; }

int64_t kit_descale_count(const kit_shape *s) { return s->descale >= 2 ? (int64_t)s->batch * s->heads_kv : 1; }

void kit_poison(void *out, size_t out_bytes, fc_dtype dtype, float *lse, size_t lse_bytes)
{
    if (out) {
        if (dtype == FC_DTYPE_F32) {
            uint32_t *o = out;
            for (size_t i = 0; i < out_bytes / 4; i++) o[i] = KIT_POISON_F32;
        } else {
            uint16_t *o = out;
            uint16_t pv = dtype == FC_DTYPE_BF16 ? KIT_POISON_BF16 : KIT_POISON_16;
            for (size_t i = 0; i < out_bytes / 2; i++) o[i] = pv;
        }
    }
    if (lse) {
        uint32_t *l = (uint32_t *)lse;
        for (size_t i = 0; i < lse_bytes / 4; i++) l[i] = KIT_POISON_F32;
    }
}

int kit_is_poison(const void *buf, fc_dtype dtype, int64_t idx)
{
    if (dtype == FC_DTYPE_F32) return ((const uint32_t *)buf)[idx] == KIT_POISON_F32;
    uint16_t pv = dtype == FC_DTYPE_BF16 ? KIT_POISON_BF16 : KIT_POISON_16;
    return ((const uint16_t *)buf)[idx] == pv;
}

/* ---- random ------------------------------------------------------------------ */

uint64_t kit_rand_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double kit_rand_uniform(uint64_t *state) { return (double)(kit_rand_u64(state) >> 11) * 0x1.0p-53; }

double kit_rand_normal(uint64_t *state)
{
    double u1 = kit_rand_uniform(state), u2 = kit_rand_uniform(state);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- cases ------------------------------------------------------------------- */

/* Strides (elements) of a [outer, seq, heads, dim] tensor in a layout; returns
 * the allocation size in elements. outer = batch (dense) or 1 (varlen). */
static int64_t layout_strides(kit_layout layout, int64_t outer, int64_t seq, int64_t heads,
                              int64_t dim, int64_t st[4])
{
    st[3] = 1;
    switch (layout) {
    case KIT_LAYOUT_BHSD:
        st[1] = dim;               /* seq */
        st[2] = seq * dim;         /* heads */
        st[0] = heads * seq * dim; /* batch */
        return outer * st[0];
    case KIT_LAYOUT_PADDED: {
        int64_t hs = dim + 8;          /* 8 elements of padding after each head: keeps 16-B alignment */
        st[2] = hs;
        st[1] = heads * hs + 16;       /* and 16 after each row */
        st[0] = seq * st[1] + 32;
        return outer * st[0];
    }
    case KIT_LAYOUT_BSHD:
    default:
        st[2] = dim;
        st[1] = heads * dim;
        st[0] = seq * heads * dim;
        return outer * st[0];
    }
}

/* The odd number above x. */
static int64_t odd_above(int64_t x) { return x + 1 + (x & 1); }

/* kit_shape.odd_out: BSHD with every stride odd (head, row, batch), so that
 * consecutive rows and heads start at every 2-byte alignment. */
static int64_t odd_strides(int64_t outer, int64_t seq, int64_t heads, int64_t dim, int64_t st[4])
{
    st[3] = 1;
    st[2] = odd_above(dim);
    st[1] = odd_above(heads * st[2]);
    st[0] = odd_above(seq * st[1]);
    return outer * st[0];
}

static void set_tensor(fc_tensor *t, void *data, fc_dtype dt, int varlen, int64_t outer, int64_t seq,
                       int64_t heads, int64_t dim, const int64_t st[4])
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dt;
    if (varlen) {
        t->ndim = 3;
        t->shape[0] = seq; t->shape[1] = heads; t->shape[2] = dim;
        t->stride[0] = st[1]; t->stride[1] = st[2]; t->stride[2] = 1;
    } else {
        t->ndim = 4;
        t->shape[0] = outer; t->shape[1] = seq; t->shape[2] = heads; t->shape[3] = dim;
        for (int i = 0; i < 4; i++) t->stride[i] = st[i];
    }
}

/* N(0,1)*scale values, redrawn where one rounds to 0 in the dtype (a few
 * tries: a tiny scale may leave no choice): a kernel that reads the wrong
 * page or row must not meet zeros that happen to give the right sum. */
void kit_fill_normal(void *buf, fc_dtype dt, int64_t n, uint64_t *rng, float scale)
{
    for (int64_t i = 0; i < n; i++)
        for (int tries = 0; tries < 4; tries++) {
            kit_store(buf, dt, i, (float)(kit_rand_normal(rng) * scale));
            if (kit_load(buf, dt, i) != 0.0f) break;
        }
}

static int shape_ok(const kit_shape *s)
{
    if (s->batch <= 0 || s->heads_q <= 0 || s->heads_kv <= 0 || s->seqlen_q < 0 || s->seqlen_k < 0 ||
        s->head_dim <= 0 || kit_dtype_size(s->dtype) == 0 || s->page_size < 0)
        return 0;
    if ((s->fp8_kv && (!is_fp8((fc_dtype)s->fp8_kv) || (is_fp8(s->dtype) && s->fp8_kv != (int)s->dtype))) ||
        (is_fp8(s->dtype) && (s->fp8_out < FC_DTYPE_F32 || s->fp8_out > FC_DTYPE_BF16)) ||
        ((s->descale || s->amax) && !is_fp8(kit_kv_dtype(s))) || (is_fp8(kit_kv_dtype(s)) && s->append))
        return 0;
    if (s->append < 0 || (s->append > 0 && (s->seqused == KIT_SEQUSED_NONE || s->append > s->seqlen_k))) return 0;
    if (s->rotary_dim < 0 || s->rotary_dim % 2 || s->rotary_dim > s->head_dim || (s->rotary_dim && !s->append))
        return 0;
    return !(s->varlen && (s->page_size > 0 || s->seqused != KIT_SEQUSED_NONE)); /* dense-only options */
}

/* Random lengths in [0, max] into cu_seqlens: every third sequence may be
 * empty, the first always has the maximum so max_seqlen is attained. */
static int init_varlen(kit_case *c, uint64_t *rng)
{
    const kit_shape *s = &c->s;
    c->cu_q = calloc((size_t)s->batch + 1, sizeof(int32_t));
    c->cu_k = calloc((size_t)s->batch + 1, sizeof(int32_t));
    if (!c->cu_q || !c->cu_k) return -1;
    for (int b = 0; b < s->batch; b++) {
        int lq = b == 0 ? s->seqlen_q : (int)(kit_rand_u64(rng) % (uint64_t)(s->seqlen_q + 1));
        int lk = b == 0 ? s->seqlen_k : (int)(kit_rand_u64(rng) % (uint64_t)(s->seqlen_k + 1));
        if (b % 3 == 2 && (kit_rand_u64(rng) & 1)) lq = 0;
        if (b % 3 == 1 && (kit_rand_u64(rng) & 1)) lk = 0;
        c->cu_q[b + 1] = c->cu_q[b] + lq;
        c->cu_k[b + 1] = c->cu_k[b] + lk;
    }
    c->total_q = c->cu_q[s->batch];
    c->total_k = c->cu_k[s->batch];
    return 0;
}

/* q, k, v and out: strides by layout, buffers filled (out poisoned later),
 * tensors in args. k and v: [batch, seqlen_k, ...], varlen tokens or pages. */
static int init_tensors(kit_case *c, uint64_t *rng)
{
    const kit_shape *s = &c->s;
    const fc_dtype kdt = kit_kv_dtype(s), odt = kit_out_dtype(s);
    const size_t es = kit_dtype_size(s->dtype), kes = kit_dtype_size(kdt), oes = kit_dtype_size(odt);
    const int paged = s->page_size > 0;
    const int64_t outer = s->varlen ? 1 : s->batch, sq = s->varlen ? c->total_q : s->seqlen_q;
    const int64_t kv_outer = paged ? c->num_pages : outer;
    const int64_t sk = s->varlen ? c->total_k : paged ? s->page_size : s->seqlen_k;
    int64_t stq[4], stk[4], stv[4], sto[4];
    int64_t nq = layout_strides(s->layout, outer, sq, s->heads_q, s->head_dim, stq);
    int64_t nk = layout_strides(s->layout, kv_outer, sk, s->heads_kv, s->head_dim, stk);
    int64_t nv = layout_strides(s->layout, kv_outer, sk, s->heads_kv, s->head_dim, stv);
    int64_t no = s->odd_out ? odd_strides(outer, sq, s->heads_q, s->head_dim, sto)
                            : layout_strides(s->layout, outer, sq, s->heads_q, s->head_dim, sto);
    /* never allocate 0 bytes: malloc(0) may return NULL */
    c->q_bytes = (size_t)(nq > 0 ? nq : 1) * es;
    c->k_bytes = (size_t)(nk > 0 ? nk : 1) * kes;
    c->v_bytes = (size_t)(nv > 0 ? nv : 1) * kes;
    c->out_bytes = (size_t)(no > 0 ? no : 1) * oes;
    c->q = malloc(c->q_bytes);
    c->k = malloc(c->k_bytes);
    c->v = malloc(c->v_bytes);
    c->out = malloc(c->out_bytes);
    if (!c->q || !c->k || !c->v || !c->out) return -1;
    float isc = s->input_scale > 0 ? s->input_scale : 1.0f;
    /* padding and spare pages get random values too: a kernel that reads them would show */
    kit_fill_normal(c->q, s->dtype, (int64_t)(c->q_bytes / es), rng, isc);
    kit_fill_normal(c->k, kdt, (int64_t)(c->k_bytes / kes), rng, isc);
    kit_fill_normal(c->v, kdt, (int64_t)(c->v_bytes / kes), rng, 1.0f);
    fc_attention_args *a = &c->args;
    set_tensor(&a->q, c->q, s->dtype, s->varlen, outer, sq, s->heads_q, s->head_dim, stq);
    set_tensor(&a->k, c->k, kdt, s->varlen, kv_outer, sk, s->heads_kv, s->head_dim, stk);
    set_tensor(&a->v, c->v, kdt, s->varlen, kv_outer, sk, s->heads_kv, s->head_dim, stv);
    set_tensor(&a->out, c->out, odt, s->varlen, outer, sq, s->heads_q, s->head_dim, sto);
    return 0;
}

/* FP8 descales (2^u, u uniform in [-2, 2): every product stays exact in
 * the reference) and amax outputs, as the shape asks. */
static int init_fp8(kit_case *c, uint64_t *rng)
{
    const kit_shape *s = &c->s;
    fc_descale *d[3] = {&c->args.q_descale, &c->args.k_descale, &c->args.v_descale};
    for (int i = 0; i < 3 && s->descale; i++) {
        if (i == 0 && !is_fp8(s->dtype)) continue; /* q takes one only when it is FP8 */
        const int64_t n = kit_descale_count(s);
        c->descale[i] = malloc((size_t)n * sizeof(float));
        if (!c->descale[i]) return -1;
        for (int64_t x = 0; x < n; x++) {
            const float v = exp2f((float)(kit_rand_u64(rng) % 4096) / 1024.0f - 2.0f);
            c->descale[i][x] = s->descale == 3 && x % 4 == 1 ? 0.0f : s->descale == 3 && x % 4 == 3 ? -v : v;
        }
        d[i]->data = c->descale[i];
        d[i]->batch_stride = n > 1 ? s->heads_kv : 0;
        d[i]->head_stride = n > 1 ? 1 : 0;
    }
    if (!s->amax) return 0;
    c->amax = malloc(2 * sizeof(float));
    if (!c->amax) return -1;
    c->amax[0] = c->amax[1] = NAN; /* poisoned: the call must write both */
    c->args.out_amax = &c->amax[0];
    c->args.p_amax = &c->amax[1];
    return 0;
}

/* lse when asked for: dense [batch, heads_q, seqlen_q], varlen [heads_q, total_q]. */
static int init_lse(kit_case *c)
{
    const kit_shape *s = &c->s;
    if (!s->want_lse) return 0;
    const int64_t sq = s->varlen ? c->total_q : s->seqlen_q;
    int64_t nl = (int64_t)s->heads_q * (s->varlen ? sq : (int64_t)s->batch * sq);
    c->lse_bytes = (size_t)(nl > 0 ? nl : 1) * sizeof(float);
    c->lse = malloc(c->lse_bytes);
    if (!c->lse) return -1;
    fc_tensor *l = &c->args.lse;
    l->data = c->lse;
    l->dtype = FC_DTYPE_F32;
    if (s->varlen) {
        l->ndim = 2;
        l->shape[0] = s->heads_q; l->shape[1] = sq;
        l->stride[0] = sq; l->stride[1] = 1;
    } else {
        l->ndim = 3;
        l->shape[0] = s->batch; l->shape[1] = s->heads_q; l->shape[2] = sq;
        l->stride[0] = (int64_t)s->heads_q * sq; l->stride[1] = sq; l->stride[2] = 1;
    }
    return 0;
}

static void set_options(kit_case *c)
{
    const kit_shape *s = &c->s;
    fc_attention_args *a = &c->args;
    a->scale = s->scale;
    a->softcap = s->softcap;
    a->causal = s->causal;
    a->window_left = s->window_left;
    a->window_right = s->window_right;
    if (s->varlen) {
        a->cu_seqlens_q = c->cu_q;
        a->cu_seqlens_k = c->cu_k;
        a->num_seqs = s->batch;
        a->max_seqlen_q = s->seqlen_q;
        a->max_seqlen_k = s->seqlen_k;
    }
}

int kit_case_init(kit_case *c, const kit_shape *s, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->s = *s;
    if (!shape_ok(s)) return -1;
    fc_attention_args_init(&c->args);
    uint64_t rng = seed * 0x2545F4914F6CDD1Dull + 12345;
    /* the paged structure draws from a stream of its own: dense cases keep
     * the inputs they always had */
    if ((s->varlen && init_varlen(c, &rng)) || kit_paged_setup(c, seed) || init_tensors(c, &rng) ||
        init_lse(c) || init_fp8(c, &rng)) {
        kit_case_free(c);
        return -1;
    }
    set_options(c);
    if (kit_append_setup(c, seed)) {
        kit_case_free(c);
        return -1;
    }
    kit_paged_nan_unused(c);
    kit_poison(c->out, c->out_bytes, kit_out_dtype(s), c->lse, c->lse_bytes);
    return 0;
}

void kit_case_free(kit_case *c)
{
    if (!c) return;
    free(c->q); free(c->k); free(c->v); free(c->out); free(c->lse);
    free(c->cu_q); free(c->cu_k);
    free(c->block_table); free(c->seqused_k);
    free(c->k_new); free(c->v_new); free(c->rot_cos); free(c->rot_sin);
    free(c->descale[0]); free(c->descale[1]); free(c->descale[2]); free(c->amax);
    memset(c, 0, sizeof *c);
}

/* ---- gates ------------------------------------------------------------------- */

kit_gate kit_gate_for(fc_dtype dtype)
{
    kit_gate g;
    switch (dtype) {
    case FC_DTYPE_F32:
        /* fp32 inputs, fp32 accumulation: only summation-order error. */
        g.max_abs = 1e-4; g.rel_l2 = 2e-5; g.pct_bad = 0.0;
        g.atol = 1e-5; g.rtol = 1e-4;
        g.lse_atol = 1e-4; g.lse_rtol = 1e-5;
        break;
    case FC_DTYPE_F16:
        /* output rounding (2^-11 relative) plus P rounded to f16 before P.V */
        g.max_abs = 5e-3; g.rel_l2 = 2e-3; g.pct_bad = 1.0;
        g.atol = 1e-3; g.rtol = 2e-3;
        g.lse_atol = 1e-3; g.lse_rtol = 1e-4;
        break;
    case FC_DTYPE_BF16:
    default:
        /* output rounding (2^-8 relative) plus P rounded to bf16 before P.V */
        g.max_abs = 3e-2; g.rel_l2 = 1.6e-2; g.pct_bad = 1.0;
        g.atol = 8e-3; g.rtol = 1.6e-2;
        g.lse_atol = 1e-3; g.lse_rtol = 1e-4;
        break;
    }
    return g;
}

/* Visit every logical element of out (and lse) in the case's layout. */
void kit_compare(const kit_case *c, const void *out, const float *lse, const void *ref_out,
                 const float *ref_lse, const kit_gate *g, kit_metrics *m)
{
    memset(m, 0, sizeof *m);
    const fc_tensor *o = &c->args.out;
    fc_dtype dt = kit_out_dtype(&c->s);
    int64_t rows = c->s.varlen ? c->total_q : (int64_t)c->s.batch * c->s.seqlen_q;
    double err2 = 0, ref2 = 0;
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = c->s.varlen ? 0 : r / (c->s.seqlen_q ? c->s.seqlen_q : 1);
        int64_t sidx = c->s.varlen ? r : r % (c->s.seqlen_q ? c->s.seqlen_q : 1);
        int64_t base = c->s.varlen ? sidx * o->stride[0] : b * o->stride[0] + sidx * o->stride[1];
        int64_t hstride = c->s.varlen ? o->stride[1] : o->stride[2];
        for (int h = 0; h < c->s.heads_q; h++) {
            for (int d = 0; d < c->s.head_dim; d++) {
                int64_t idx = base + h * hstride + d;
                m->n++;
                if (kit_is_poison(out, dt, idx)) { m->unwritten++; continue; }
                double x = kit_load(out, dt, idx), y = kit_load(ref_out, dt, idx);
                if (!isfinite(x) && isfinite(y)) { m->nonfinite++; continue; }
                if (!isfinite(y)) continue; /* reference itself non-finite: NaN input */
                double e = fabs(x - y);
                if (e > m->max_abs) m->max_abs = e;
                err2 += e * e;
                ref2 += y * y;
                if (e > g->atol + g->rtol * fabs(y)) bad++;
            }
        }
    }
    m->rel_l2 = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    m->pct_bad = m->n ? 100.0 * (double)bad / (double)m->n : 0.0;
    if (lse && ref_lse) {
        int64_t nl = (int64_t)(c->lse_bytes / sizeof(float));
        if (c->s.heads_q * rows < nl) nl = c->s.heads_q * rows;
        for (int64_t i = 0; i < nl; i++) {
            uint32_t bits;
            memcpy(&bits, &lse[i], 4);
            if (bits == KIT_POISON_F32) { m->lse_bad++; continue; }
            double x = lse[i], y = ref_lse[i];
            if (isinf(y) && y < 0) { if (!(isinf(x) && x < 0)) m->lse_bad++; continue; }
            if (!isfinite(y)) continue;
            double e = fabs(x - y);
            if (!(e <= g->lse_atol + g->lse_rtol * fabs(y))) m->lse_bad++;
            if (e > m->lse_max_abs || e != e) m->lse_max_abs = e;
        }
    }
}

/* The masking rule as flashcore.h states it (independent of the library's
 * own copy): is any key of a (sq, sk) sequence visible to query i? */
static int row_has_key(int64_t i, int64_t sq, int64_t sk, const kit_shape *s)
{
    int64_t diag = i + sk - sq;
    int64_t wr = s->causal ? 0 : s->window_right;
    int64_t lo = 0, hi = sk - 1; /* visible keys: [lo, hi] */
    if (wr >= 0 && diag + wr < hi) hi = diag + wr;
    if (s->window_left >= 0 && diag - s->window_left > lo) lo = diag - s->window_left;
    return lo <= hi;
}

/* Elements of row i, head h of sequence b (query tokens from t0) that break
 * the empty-row rule: out not exactly 0 (or never written), lse not -inf. */
static int64_t empty_row_bad(const kit_case *c, const void *out, const float *lse, int b, int64_t t0, int64_t i,
                             int h)
{
    const kit_shape *s = &c->s;
    const fc_tensor *o = &c->args.out, *l = &c->args.lse;
    int64_t bad = 0;
    const int64_t base = s->varlen ? (t0 + i) * o->stride[0] + h * o->stride[1]
                                   : b * o->stride[0] + i * o->stride[1] + h * o->stride[2];
    for (int d = 0; d < s->head_dim; d++)
        if (kit_is_poison(out, kit_out_dtype(s), base + d) || kit_load(out, kit_out_dtype(s), base + d) != 0.0f) bad++;
    if (lse) {
        const int64_t li = s->varlen ? h * l->stride[0] + (t0 + i) * l->stride[1]
                                     : b * l->stride[0] + h * l->stride[1] + i * l->stride[2];
        if (!(isinf(lse[li]) && lse[li] < 0)) bad++;
    }
    return bad;
}

int64_t kit_empty_rows(const kit_case *c, const void *out, const float *lse, int64_t *empty)
{
    const kit_shape *s = &c->s;
    int64_t bad = 0;
    *empty = 0;
    for (int b = 0; b < s->batch; b++) {
        const int64_t t0 = s->varlen ? c->cu_q[b] : 0;
        const int64_t sq = s->varlen ? c->cu_q[b + 1] - t0 : s->seqlen_q, sk = kit_case_keys(c, b);
        for (int64_t i = 0; i < sq; i++) {
            if (row_has_key(i, sq, sk, s)) continue;
            *empty += s->heads_q;
            for (int h = 0; h < s->heads_q; h++) bad += empty_row_bad(c, out, lse, b, t0, i, h);
        }
    }
    return bad;
}

int64_t kit_stray_writes(const kit_case *c, const void *out)
{
    const kit_shape *s = &c->s;
    const fc_tensor *o = &c->args.out;
    const fc_dtype odt = kit_out_dtype(s);
    const int64_t n = (int64_t)(c->out_bytes / kit_dtype_size(odt));
    unsigned char *logical = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!logical) return -1;
    const int64_t rows = s->varlen ? c->total_q : (int64_t)s->batch * s->seqlen_q;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = s->varlen ? 0 : r / s->seqlen_q, i = s->varlen ? r : r % s->seqlen_q;
        const int64_t base = s->varlen ? i * o->stride[0] : b * o->stride[0] + i * o->stride[1];
        const int64_t hs = s->varlen ? o->stride[1] : o->stride[2];
        for (int h = 0; h < s->heads_q; h++)
            for (int dd = 0; dd < s->head_dim; dd++) logical[base + h * hs + dd] = 1;
    }
    int64_t stray = 0;
    for (int64_t k = 0; k < n; k++)
        if (!logical[k] && !kit_is_poison(out, odt, k)) stray++;
    free(logical);
    return stray;
}

int kit_gate_pass(const kit_metrics *m, const kit_gate *g)
{
    return m->unwritten == 0 && m->nonfinite == 0 && m->lse_bad == 0 && m->max_abs <= g->max_abs &&
           m->rel_l2 <= g->rel_l2 && m->pct_bad <= g->pct_bad;
}

double kit_flops_nominal(const kit_shape *s)
{
    double f = 4.0 * s->batch * s->heads_q * (double)s->seqlen_q * s->seqlen_k * s->head_dim;
    if (s->causal && s->seqlen_q == s->seqlen_k) f *= 0.5;
    return f;
}

double kit_flops_backward(const kit_shape *s) { return 2.5 * kit_flops_nominal(s); }

double kit_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kit_percentile(const double *v, int n, double pct)
{
    if (n <= 0) return NAN;
    double *t = malloc((size_t)n * sizeof *t);
    if (!t) return NAN;
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double pos = pct / 100.0 * (n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : lo;
    double r = t[lo] + (t[hi] - t[lo]) * (pos - lo);
    free(t);
    return r;
}

/* ---- tuning hooks from the environment ------------------------------------------ */

fc_status kit_tuning_from_env(fc_context *ctx)
{
    char info[1024];
    fc_status st = fc_context_tuning_info(ctx, info, sizeof info, NULL);
    if (st != FC_OK) {
        fprintf(stderr, "%s", info);
        return st;
    }
    const char *trace = getenv("FLASHCORE_SM90_TRACE_FILE");
    if (!trace || !*trace) return FC_OK;
    fc_tuning t;
    fc_context_get_tuning(ctx, &t);
    t.sm90_trace_file = trace;
    st = fc_context_set_tuning(ctx, &t);
    if (st != FC_OK) fprintf(stderr, "FLASHCORE_SM90_TRACE_FILE: %s\n", fc_last_error(ctx));
    return st;
}
