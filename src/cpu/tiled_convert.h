/*
 * tiled_convert.h -- conversion in and out of the tiled CPU paths: rows of
 * any dtype to fp32 scratch and fp32 results rounded once to the dtype.
 * Compiled once per instruction-set variant like tiled_item.h (included by
 * it and by tiled_bwd_item.h with FC_ISA(name) set), so there is
 * deliberately no include guard.
 */
#ifndef FC_ISA
#error "tiled_convert.h: define FC_ISA(name) before including"
#endif

/* ---- conversion in and out --------------------------------------------------- */

/* dst[x] = element off + x of src, for x < n, as float (exact). */
static void FC_ISA(load_f32)(const void *src, int32_t dtype, int64_t off, int64_t n, float *dst)
{
    int64_t x = 0;
#if defined(FC_ISA_AVX2)
    x = widen_avx2(src, dtype, off, n, dst); /* whole vectors of f16, bf16, f32 */
#endif
    if (dtype == FC_DTYPE_F16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (; x < n; x++) dst[x] = fc_f16_to_f32(s[x]);
    } else if (dtype == FC_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (; x < n; x++) dst[x] = fc_bf16_to_f32(s[x]);
    } else if (dtype == FC_DTYPE_E4M3) {
        const uint8_t *s = (const uint8_t *)src + off;
        for (; x < n; x++) dst[x] = fc_e4m3_to_f32(s[x]);
    } else if (dtype == FC_DTYPE_E5M2) {
        const uint8_t *s = (const uint8_t *)src + off;
        for (; x < n; x++) dst[x] = fc_e5m2_to_f32(s[x]);
    } else {
        const float *s = (const float *)src + off;
        for (; x < n; x++) dst[x] = s[x];
    }
}

/* Elements off .. off+n-1 of dst = src[x] / l, rounded once to the dtype;
 * src NULL: zeros (a row that sees no key). */
static void FC_ISA(store_row)(void *dst, int32_t dtype, int64_t off, int64_t n, const float *src, float l)
{
    if (dtype == FC_DTYPE_F16) {
        uint16_t *d = (uint16_t *)dst + off;
        for (int64_t x = 0; x < n; x++) d[x] = fc_f32_to_f16(src ? src[x] / l : 0.0f);
    } else if (dtype == FC_DTYPE_BF16) {
        uint16_t *d = (uint16_t *)dst + off;
        for (int64_t x = 0; x < n; x++) d[x] = fc_f32_to_bf16(src ? src[x] / l : 0.0f);
    } else {
        float *d = (float *)dst + off;
        for (int64_t x = 0; x < n; x++) d[x] = src ? src[x] / l : 0.0f;
    }
}
