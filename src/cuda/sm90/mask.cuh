/*
 * mask.cuh -- which keys a query row sees: the causal/local band as key
 * limits, exactly fc_key_visible() intersected with [0, sk). Host-callable,
 * so the scheduler and mask logic can be checked on the CPU.
 */
#ifndef FC_SM90_MASK_CUH
#define FC_SM90_MASK_CUH

namespace fc90 {

/* Visible keys of query row r (within its sequence) are [key_lo, key_hi),
 * for sq query and sk key rows and window bounds wl, wr (-1: unbounded). */
__host__ __device__ __forceinline__ int key_hi(int r, int sq, int sk, int wr)
{
    long long hi = sk;
    if (wr >= 0) {
        long long d = (long long)r + sk - sq + wr + 1;
        hi = d < hi ? d : hi;
    }
    return hi < 0 ? 0 : (int)hi;
}
__host__ __device__ __forceinline__ int key_lo(int r, int sq, int sk, int wl)
{
    if (wl < 0) return 0;
    long long lo = (long long)r + sk - sq - wl;
    return lo < 0 ? 0 : (lo > sk ? sk : (int)lo);
}

/* The visible key range of the two accumulator rows a thread holds. */
struct MaskRows {
    int lo[2], hi[2];
};

} /* namespace fc90 */

#endif /* FC_SM90_MASK_CUH */
