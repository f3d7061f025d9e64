/*
 * fastdiv.h -- division of a non-negative int by a divisor fixed at plan
 * time, as one multiply-high, one add and one shift.
 *
 * Why: both forward kernels decode their tile index (M tile, split, head,
 * batch) with divisions by run-time values, per CTA on the sm80-class path
 * and per tile on the persistent Hopper path. The GPU has no integer divide:
 * each one is a ~30-instruction software routine (reciprocal, multiply,
 * two corrections), and a short-KV tile runs ~5 of them in its fixed cost
 * (Nsight Compute source counters, s512-d64, H100).
 *
 * Method (the round-up multiplier of Granlund and Montgomery): for a divisor
 * d >= 1 let s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1 (< 2^32).
 * Then for 0 <= n < 2^31
 *     n / d = (hi32(n * m) + n) >> s
 * (hi32(n * m) <= n, so the sum fits in 32 bits). tests/test_fastdiv.c checks
 * it against plain division over divisors and numerators up to 2^31 - 1.
 *
 * Plain data (crosses the C/CUDA line inside the kernels' parameter structs);
 * usable from C11 host code and from CUDA host or device code.
 */
#ifndef FC_FASTDIV_H
#define FC_FASTDIV_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FC_FASTDIV_FN static __host__ __device__ __forceinline__
#else
#define FC_FASTDIV_FN static inline
#endif

typedef struct fc_fastdiv {
    int32_t d;     /* the divisor, >= 1 */
    uint32_t mul;  /* m above            */
    int32_t shift; /* s above            */
} fc_fastdiv;

/* d >= 1 (a caller passing d < 1 gets the divisor 1). */
FC_FASTDIV_FN fc_fastdiv fc_fastdiv_make(int32_t d)
{
    fc_fastdiv f;
    int s = 0;
    if (d < 1) d = 1;
    while (((int64_t)1 << s) < d) ++s;
    f.d = d;
    f.shift = s;
    f.mul = (uint32_t)(((uint64_t)1 << 32) * (((uint64_t)1 << s) - (uint64_t)d) / (uint64_t)d + 1);
    return f;
}

/* n / f.d for 0 <= n < 2^31. */
FC_FASTDIV_FN int32_t fc_fastdiv_div(int32_t n, fc_fastdiv f)
{
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi((uint32_t)n, f.mul);
#else
    const uint32_t hi = (uint32_t)(((uint64_t)(uint32_t)n * f.mul) >> 32);
#endif
    return (int32_t)((hi + (uint32_t)n) >> f.shift);
}

#undef FC_FASTDIV_FN
#endif /* FC_FASTDIV_H */
