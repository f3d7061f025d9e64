/*
 * cpu_dtype.h -- f16 / bf16 <-> f32 conversions (and FP8 -> f32) for the CPU backend, by bit
 * manipulation so they do not depend on compiler support for _Float16 or on
 * the F16C instruction set. Narrowing rounds to nearest, ties to even;
 * overflow gives infinity; NaN stays NaN (quieted, sign and top payload bits
 * kept). Widening is exact.
 */
#ifndef FC_CPU_DTYPE_H
#define FC_CPU_DTYPE_H

#include <stdint.h>
#include <string.h>

static inline float fc_bits_to_f32(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static inline uint32_t fc_f32_to_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

/* binary16 -> binary32, exact (every half is a float). Branch-free (the
 * three cases are combined with masks) so that conversion loops vectorize. */
static inline float fc_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = h & 0x7c00u;
    const uint32_t man = h & 0x3ffu;
    /* normal: exponent and mantissa move up 13 bits, exponent rebias 15 -> 127 */
    const uint32_t normal = ((uint32_t)(h & 0x7fffu) << 13) + 0x38000000u;
    /* inf / NaN: the payload moves to the top of the float mantissa */
    const uint32_t special = 0x7f800000u | (man << 13);
    /* zero or subnormal: man * 2^-24, exact in float */
    const uint32_t small = fc_f32_to_bits((float)(int32_t)man * 0x1p-24f);
    const uint32_t is_special = 0u - (uint32_t)(exp == 0x7c00u); /* all ones or zero */
    const uint32_t is_small = 0u - (uint32_t)(exp == 0u);
    return fc_bits_to_f32(sign | (special & is_special) | (small & is_small) |
                          (normal & ~(is_special | is_small)));
}

/* binary32 -> binary16, round to nearest even. */
static inline uint16_t fc_f32_to_f16(float f)
{
    uint32_t x = fc_f32_to_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf or NaN */
        if (ax == 0x7f800000u) return sign | 0x7c00u;
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* quiet NaN */
    }
    if (ax >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 (half-way past 65504) */
    if (ax >= 0x38800000u) {                       /* >= 2^-14: normal half */
        uint32_t r = ax - 0x38000000u;             /* exponent rebias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);            /* ties to even; carry may bump the exponent */
        return (uint16_t)(sign | (r >> 13));
    }
    if (ax <= 0x33000000u) return sign; /* <= 2^-25: rounds to zero (the tie goes to even 0) */
    /* subnormal half: value / 2^-24 rounded to an integer. value = mant * 2^(e-150) */
    uint32_t e = ax >> 23;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t res = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (res & 1u))) res++; /* 0x400 is the smallest normal: fine */
    return (uint16_t)(sign | res);
}

/* bfloat16 -> binary32, exact. */
static inline float fc_bf16_to_f32(uint16_t h) { return fc_bits_to_f32((uint32_t)h << 16); }

/* binary32 -> bfloat16, round to nearest even. */
static inline uint16_t fc_f32_to_bf16(float f)
{
    uint32_t x = fc_f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u); /* overflow past FLT_MAX carries into inf: correct */
    return (uint16_t)(x >> 16);
}

/* OCP FP8 e4m3fn -> binary32, exact: bias 7, no infinity, S.1111.111 is
 * NaN, subnormals m * 2^-9. */
static inline float fc_e4m3_to_f32(uint8_t x)
{
    const uint32_t e = (x >> 3) & 0xfu, m = x & 7u;
    float mag = e ? fc_bits_to_f32(((e + 120u) << 23) | (m << 20)) : (float)m * 0x1p-9f;
    if (e == 15 && m == 7) mag = fc_bits_to_f32(0x7fc00000u);
    return (x & 0x80u) ? -mag : mag;
}

/* OCP FP8 e5m2 -> binary32, exact: the top byte of a binary16. */
static inline float fc_e5m2_to_f32(uint8_t x) { return fc_f16_to_f32((uint16_t)(x << 8)); }

#endif /* FC_CPU_DTYPE_H */
