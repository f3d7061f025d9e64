/*
 * test_fastdiv.c -- the plan-time divisors of the tile decode
 * (src/cuda/common/fastdiv.h) against plain integer division: every divisor
 * up to 4096, the divisors around each power of two up to 2^30 and the
 * largest ones, each with numerators at both ends of the range (0.., ..2^31-1),
 * around multiples of the divisor, and random ones. Runs on the CPU: the
 * device code is the same expression with __umulhi for the high word.
 */
#include <stdint.h>
#include <stdio.h>

#include "cuda/common/fastdiv.h"
#include "test_util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng31(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 33); /* 31 bits */
}

/* Returns the number of wrong quotients for divisor d (the first one printed). */
static int check_divisor(int32_t d)
{
    const fc_fastdiv f = fc_fastdiv_make(d);
    int bad = 0;
    int32_t ns[96];
    int k = 0;
    for (int i = 0; i < 8; ++i) ns[k++] = i;                        /* small         */
    for (int i = 0; i < 8; ++i) ns[k++] = INT32_MAX - i;            /* the top       */
    for (int i = -2; i <= 2; ++i) {                                 /* around q * d  */
        const int64_t q = (int64_t)(INT32_MAX / d) - 1, m = q * d + i;
        if (m >= 0 && m <= INT32_MAX) ns[k++] = (int32_t)m;
        const int64_t m2 = (int64_t)d + i, m3 = 2 * (int64_t)d + i;
        if (m2 >= 0 && m2 <= INT32_MAX) ns[k++] = (int32_t)m2;
        if (m3 >= 0 && m3 <= INT32_MAX) ns[k++] = (int32_t)m3;
    }
    while (k < 96) ns[k++] = (int32_t)rng31();
    for (int i = 0; i < k; ++i) {
        const int32_t got = fc_fastdiv_div(ns[i], f), want = ns[i] / d;
        if (got != want) {
            if (!bad) printf("FAIL fastdiv: %d / %d = %d, expected %d\n", ns[i], d, got, want);
            ++bad;
        }
    }
    return bad;
}

int main(void)
{
    int p0 = g_pass, f0 = g_fail;
    int bad = 0, n = 0;
    for (int32_t d = 1; d <= 4096; ++d, ++n) bad += check_divisor(d) != 0;
    for (int s = 12; s <= 30; ++s)
        for (int i = -3; i <= 3; ++i, ++n) bad += check_divisor((int32_t)((1 << s) + i)) != 0;
    for (int i = 0; i < 4; ++i, ++n) bad += check_divisor(INT32_MAX - i) != 0;
    for (int i = 0; i < 2000; ++i, ++n) bad += check_divisor((int32_t)(rng31() | 1)) != 0;
    CHECK(bad == 0, "%d of %d divisors gave a wrong quotient", bad, n);
    /* A divisor below 1 is taken as 1 (never a division by zero). */
    CHECK(fc_fastdiv_make(0).d == 1 && fc_fastdiv_div(12345, fc_fastdiv_make(0)) == 12345,
          "divisor 0 must act as 1");
    group_done("fastdiv", p0, f0);
    return test_summary();
}
