/*
 * arena.c -- the memory of one fuzzed call: one allocation holding every
 * buffer, poison bytes everywhere nothing was placed, a snapshot to tell
 * what the call changed, and a mask of the bytes it may change. The call's
 * arena is managed memory in the CUDA fuzz build (fuzz/device.c).
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kit.h"

/* A byte pattern no buffer holds by chance (f16 0xA5C3 is a plain finite
 * number, so reading it is harmless; writing it is not expected). */
static const uint8_t k_fill[4] = {0xC3, 0xA5, 0x5A, 0x3C};

int fz_arena_init(fz_arena *a, size_t size, int on_device)
{
    memset(a, 0, sizeof *a);
    a->size = size ? size : 1;
    a->on_device = on_device;
    /* 256-byte aligned like cudaMallocManaged's (offsets place a workspace);
     * the exact size, so that ASan sees a read past the end */
    void *host = NULL;
    if (!on_device && posix_memalign(&host, 256, a->size)) host = NULL;
    a->base = on_device ? fz_device_alloc(a->size) : host;
    a->mask = calloc(a->size, 1);
    a->copy = malloc(a->size);
    if (!a->base || !a->mask || !a->copy) { fz_arena_free(a); return -1; }
    for (size_t i = 0; i < a->size; i++) a->base[i] = k_fill[i & 3];
    return 0;
}

void fz_arena_free(fz_arena *a)
{
    if (a->on_device && a->base) fz_device_free(a->base);
    else free(a->base);
    free(a->mask);
    free(a->copy);
    memset(a, 0, sizeof *a);
}

void fz_arena_snapshot(fz_arena *a) { memcpy(a->copy, a->base, a->size); }

int64_t fz_arena_changed(const fz_arena *a, int outside_outputs)
{
    for (size_t i = 0; i < a->size; i++)
        if (a->base[i] != a->copy[i] && !(outside_outputs && a->mask[i])) return (int64_t)i;
    return -1;
}

/* Enumerating more than this means the shape is not one the generator
 * means to be valid; such tensors are never enumerated. */
#define FZ_MAX_ELEMS ((int64_t)1 << 22)

int64_t fz_tensor_offsets(const fc_tensor *t, int64_t **offs)
{
    *offs = NULL;
    if (t->ndim < 1 || t->ndim > 4) return -1;
    int64_t n = 1, sh[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || t->shape[i] > 4096) return -1;
        n *= t->shape[i];
        if (n > FZ_MAX_ELEMS) return -1;
        sh[4 - t->ndim + i] = t->shape[i];
        st[4 - t->ndim + i] = t->stride[i];
    }
    int64_t *o = malloc((size_t)(n ? n : 1) * sizeof *o), k = 0;
    if (!o) return -1;
    for (int64_t a = 0; a < sh[0]; a++)
        for (int64_t b = 0; b < sh[1]; b++)
            for (int64_t c = 0; c < sh[2]; c++)
                for (int64_t d = 0; d < sh[3]; d++)
                    o[k++] = a * st[0] + b * st[1] + c * st[2] + d * st[3];
    *offs = o;
    return n;
}

size_t fz_dtype_size(int dt)
{
    size_t s = kit_dtype_size((fc_dtype)dt);
    return s ? s : 1;
}

double fz_load(const void *base, fc_dtype dt, int64_t idx)
{
    const uint8_t *p = (const uint8_t *)base + idx * (int64_t)fz_dtype_size(dt);
    if (dt == FC_DTYPE_F32) { float f; memcpy(&f, p, 4); return f; }
    if (dt == FC_DTYPE_F64) { double d; memcpy(&d, p, 8); return d; }
    if (dt == FC_DTYPE_E4M3 || dt == FC_DTYPE_E5M2) return kit_fp8_to_f32(*p, dt);
    uint16_t h;
    memcpy(&h, p, 2);
    return dt == FC_DTYPE_F16 ? kit_f16_to_f32(h) : kit_bf16_to_f32(h);
}

void fz_store(void *base, fc_dtype dt, int64_t idx, float v)
{
    uint8_t *p = (uint8_t *)base + idx * (int64_t)fz_dtype_size(dt);
    if (dt == FC_DTYPE_F32) { memcpy(p, &v, 4); return; }
    if (dt == FC_DTYPE_F64) { const double d = v; memcpy(p, &d, 8); return; }
    if (dt == FC_DTYPE_F16 || dt == FC_DTYPE_BF16) {
        uint16_t h = dt == FC_DTYPE_F16 ? kit_f32_to_f16(v) : kit_f32_to_bf16(v);
        memcpy(p, &h, 2);
        return;
    }
    if (dt == FC_DTYPE_E4M3 || dt == FC_DTYPE_E5M2) { *p = kit_f32_to_fp8(v, dt); return; }
    uint32_t u; /* an unknown dtype: the float's top byte will do, nothing reads it as a number */
    memcpy(&u, &v, 4);
    *p = (uint8_t)(u >> 24);
}

/* f64 elements (a corrupted dtype may name f64): a NaN with a payload the
 * kit's patterns do not use. */
#define FZ_POISON_F64 0x7FF8DEAD7FC0DEADull

/* The kit's poison patterns, written through a small aligned buffer. */
void fz_poison(void *base, fc_dtype dt, int64_t idx)
{
    size_t es = fz_dtype_size(dt);
    uint64_t w[1] = {0};
    if (es == 8) w[0] = FZ_POISON_F64;
    else kit_poison(w, es, dt == FC_DTYPE_F32 || es != 2 ? FC_DTYPE_F32 : dt, NULL, 0);
    memcpy((uint8_t *)base + idx * (int64_t)es, w, es);
}

int fz_is_poison(const void *base, fc_dtype dt, int64_t idx)
{
    size_t es = fz_dtype_size(dt);
    uint64_t w[1] = {0};
    memcpy(w, (const uint8_t *)base + idx * (int64_t)es, es);
    if (es == 8) return w[0] == FZ_POISON_F64;
    return kit_is_poison(w, dt == FC_DTYPE_F32 || es != 2 ? FC_DTYPE_F32 : dt, 0);
}
