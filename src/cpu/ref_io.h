/*
 * ref_io.h -- element access of the double-precision references (forward
 * reference.c, backward reference_bwd.c): rows loaded exactly as doubles,
 * results rounded once from double to the output dtype. One copy, so both
 * references round the same way.
 */
#ifndef FC_CPU_REF_IO_H
#define FC_CPU_REF_IO_H

#include <math.h>
#include <stdint.h>

#include "cpu_dtype.h"
#include "flashcore.h"

/* Elements off .. off+n-1 of a q/k/v tensor of the given dtype, exactly, as
 * doubles (the dtype switch is outside the loop so the conversion runs at
 * memory speed: the references are slow enough as it is). */
static inline void fc_ref_load_row(const void *base, int32_t dtype, int64_t off, int64_t n, double *dst)
{
    if (dtype == FC_DTYPE_F16) {
        const uint16_t *s = (const uint16_t *)base + off;
        for (int64_t x = 0; x < n; x++) dst[x] = fc_f16_to_f32(s[x]);
    } else if (dtype == FC_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)base + off;
        for (int64_t x = 0; x < n; x++) dst[x] = fc_bf16_to_f32(s[x]);
    } else if (dtype == FC_DTYPE_E4M3) {
        const uint8_t *s = (const uint8_t *)base + off;
        for (int64_t x = 0; x < n; x++) dst[x] = fc_e4m3_to_f32(s[x]);
    } else if (dtype == FC_DTYPE_E5M2) {
        const uint8_t *s = (const uint8_t *)base + off;
        for (int64_t x = 0; x < n; x++) dst[x] = fc_e5m2_to_f32(s[x]);
    } else if (dtype == FC_DTYPE_F64) {
        const double *s = (const double *)base + off;
        for (int64_t x = 0; x < n; x++) dst[x] = s[x];
    } else {
        const float *s = (const float *)base + off;
        for (int64_t x = 0; x < n; x++) dst[x] = s[x];
    }
}

/* d rounded to the nearest number with `mant` fraction bits, normal exponents
 * >= emin (below that: the subnormal quantum 2^(emin-mant)) and <= emax,
 * ties to even; past the largest finite value: infinity. The result is exact
 * in the target format (and so in float). Done in integer-valued doubles so
 * that it rounds once, from double, whatever the FPU rounding mode. */
static inline double fc_ref_round_to_format(double d, int mant, int emin, int emax)
{
    if (!isfinite(d) || d == 0.0) return d;
    int e;
    (void)frexp(d, &e); /* |d| = f * 2^e, f in [0.5, 1): leading bit at 2^(e-1) */
    int ex = e - 1 < emin ? emin : e - 1;
    double x = ldexp(fabs(d), mant - ex); /* |d| in units of the quantum, < 2^(mant+1) */
    double whole = floor(x);
    double frac = x - whole; /* exact: x has at most 53 significant bits */
    if (frac > 0.5 || (frac == 0.5 && fmod(whole, 2.0) != 0.0)) whole += 1.0;
    double r = ldexp(whole, ex - mant);
    if (r >= ldexp(1.0, emax + 1)) r = INFINITY;
    return copysign(r, d);
}

/* Store d into element idx of base, rounded once to the dtype. */
static inline void fc_ref_store(void *base, int32_t dtype, int64_t idx, double d)
{
    switch (dtype) {
    case FC_DTYPE_F16:
        ((uint16_t *)base)[idx] = fc_f32_to_f16((float)fc_ref_round_to_format(d, 10, -14, 15));
        break;
    case FC_DTYPE_BF16:
        ((uint16_t *)base)[idx] = fc_f32_to_bf16((float)fc_ref_round_to_format(d, 7, -126, 127));
        break;
    case FC_DTYPE_F64: ((double *)base)[idx] = d; break;
    default: ((float *)base)[idx] = (float)fc_ref_round_to_format(d, 23, -126, 127); break;
    }
}

#endif /* FC_CPU_REF_IO_H */
