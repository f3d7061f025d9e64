/*
 * fwd_kernel.cuh -- the Hopper (sm_90a) attention forward kernel and its
 * launchers; included by the kernel TUs (fwd_<dtype>_d<dim>.cu) only.
 *
 * Persistent, warp-specialised CTA (one per SM):
 *   warpgroup 0      producer (producer.cuh): setmaxnreg.dec; one thread
 *                    issues the TMA loads.
 *   warpgroups 1..W  consumers (consumer.cuh), 64 query rows each:
 *                    setmaxnreg.inc; per KV block S = Q K^T, online softmax
 *                    in registers, O += P V (mainloop.cuh, softmax.cuh),
 *                    then the epilogue (epilogue.cuh).
 * Tiles come from scheduler.cuh; the shapes and layout from config.cuh and
 * the row of tiles.cuh.
 */
#ifndef FC_SM90_FWD_KERNEL_CUH
#define FC_SM90_FWD_KERNEL_CUH

#include <stdio.h>

#include "cuda/common/pdl.cuh"
#include "cuda/common/smem_optin.cuh"
#include "cuda/sm90/consumer.cuh"
#include "cuda/sm90/producer.cuh"

namespace fc90 {

template <int kCfg, bool kBF16, bool kRotate, int kMask, bool kTail, bool kPaged>
__global__ void __launch_bounds__(Cfg<kCfg>::THREADS, Cfg<kCfg>::CTAS) fc_sm90_fwd_kernel(const __grid_constant__ fc_sm90_params p)
{
    using C = Cfg<kCfg, kTail>;
    trace_gt(p, 0, 5, threadIdx.x == 0);
    extern __shared__ __align__(kSmemAlign) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + (kSmemAlign - 1u)) & ~(kSmemAlign - 1u);
    uint8_t *smem = smem_raw + (base - raw);
    Bars<C> bars;
    bars.base = base + C::OFF_BAR;

#if defined(FC_SM90_DEBUG) && FC_SM90_DEBUG
    {
        uint32_t dyn;
        asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dyn));
        FC90_ASSERT(dyn >= (uint32_t)C::SMEM);
        FC90_ASSERT(blockDim.x == (unsigned)C::THREADS);
    }
#endif

    if (threadIdx.x == 0) {
        /* The tensor maps are kernel parameters, not anything the previous
         * kernel writes: fetch them into the TMA unit before the PDL wait, so
         * that the first loads and the epilogue's first store do not wait
         * for a descriptor. */
        tma_prefetch_map(&p.tm_q);
        tma_prefetch_map(&p.tm_k);
        tma_prefetch_map(&p.tm_v);
        if (p.o_tma) tma_prefetch_map(&p.tm_o);
        init_bars<C>(bars);
    }
    __syncthreads();
    /* Everything above touches only this CTA's shared memory and the
     * parameters; from here on global memory (cu_seqlens, Q/K/V, O, LSE, the
     * tile counter) is read and written, so with programmatic dependent
     * launch (p.pdl) this is where the previous kernel must be complete. The
     * next kernel may start launching now: it cannot take an SM before one of
     * our CTAs leaves it (shared memory), and it waits in turn. */
    fc_grid_dep_sync();
    trace_gt(p, 0, 6, threadIdx.x == 0);

    /* Warp-uniform role (shfl makes it provably uniform to the compiler). */
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
    if (wg == 0) {
        if constexpr (C::SETMAXNREG) reg_dealloc<C::PRODUCER_REGS>();
        if (threadIdx.x == 0) producer<C, kPaged>(p, base, bars);
    } else {
        if constexpr (C::SETMAXNREG) reg_alloc<C::CONSUMER_REGS>();
        /* With one consumer warpgroup its index is the constant 0, which
         * keeps the named-barrier ids compile-time. */
        consumer<C, kBF16, kRotate, kMask>(p, C::WG == 1 ? 0 : wg - 1, base, smem, bars);
    }
}

template <int kCfg, bool kBF16, bool kRotate, int kMask, bool kTail = false, bool kPaged = false>
static fc_status launch(const fc_sm90_params *prm, int grid, int device, cudaStream_t stream, char *err,
                        size_t err_len)
{
    using C = Cfg<kCfg>;
    void (*kern)(const fc_sm90_params) = fc_sm90_fwd_kernel<kCfg, kBF16, kRotate, kMask, kTail, kPaged>;
    static std::atomic<unsigned long long> opted_in{0};
    const fc_status opt =
        fc_smem_opt_in(kern, C::SMEM, device, opted_in, "sm90 forward", kCfg, err, err_len, C::CTAS > 1);
    if (opt != FC_OK) return opt;
    const cudaError_t e = fc_launch(kern, (unsigned)grid, C::THREADS, (size_t)C::SMEM, stream, prm->pdl != 0, *prm);
    if (e != cudaSuccess) {
        snprintf(err, err_len, "sm90 forward (config %d): kernel launch (%d CTAs x %d threads, %d B smem): %s",
                 kCfg, grid, C::THREADS, C::SMEM, cudaGetErrorString(e));
        return FC_ERR_CUDA;
    }
    return FC_OK;
}

/* The kernel for prm's rotate, tail and mask-mode choices (plan.cu made
 * them; tail balancing comes without rotation and the any-block mask). */
template <int kCfg, bool kBF16, int kMask>
static fc_status launch_rot(const fc_sm90_params *prm, int grid, int device, cudaStream_t s, char *err,
                            size_t len)
{
    if (prm->tail_first < prm->num_tiles) {
        if constexpr (tail_row(kTiles[kCfg]) && kMask != kMaskAny) {
            if (!prm->rotate) return launch<kCfg, kBF16, false, kMask, true>(prm, grid, device, s, err, len);
        }
        snprintf(err, len, "sm90 forward (config %d): no tail-balanced instance for rotate %d, masks %d (planner bug)",
                 kCfg, prm->rotate, kMask);
        return FC_ERR_INTERNAL;
    }
    if constexpr (can_rotate(kTiles[kCfg])) {
        if (prm->rotate) return launch<kCfg, kBF16, true, kMask>(prm, grid, device, s, err, len);
    }
    return launch<kCfg, kBF16, false, kMask>(prm, grid, device, s, err, len);
}

/* Walk the table at compile time: instantiate every row of head dim kD and
 * launch row `config`, for prm's mask mode. */
template <bool kBF16, int kD, int I = 0>
fc_status launch_row(int config, const fc_sm90_params *prm, int grid, int device, cudaStream_t s, char *err,
                     size_t len)
{
    if constexpr (I >= kNumTiles) {
        snprintf(err, len, "sm90 forward: config %d has no d%d kernel (planner bug)", config, kD);
        return FC_ERR_INTERNAL;
    } else {
        if constexpr (kTiles[I].head_dim == kD) {
            if (config == I) {
                if (prm->block_table) { /* plan.cu: paged rows, any-block masks, not rotated */
                    if constexpr (paged_row(kTiles[I]))
                        return launch<I, kBF16, false, kMaskAny, false, true>(prm, grid, device, s, err, len);
                    snprintf(err, len, "sm90 forward: config %d takes no paged K/V (planner bug)", config);
                    return FC_ERR_INTERNAL;
                }
                if (prm->masks == kMaskNone) return launch_rot<I, kBF16, kMaskNone>(prm, grid, device, s, err, len);
                if (prm->masks == kMaskFirst) return launch_rot<I, kBF16, kMaskFirst>(prm, grid, device, s, err, len);
                return launch_rot<I, kBF16, kMaskAny>(prm, grid, device, s, err, len);
            }
        }
        return launch_row<kBF16, kD, I + 1>(config, prm, grid, device, s, err, len);
    }
}
} /* namespace fc90 */

/* The one symbol a kernel TU exports: the launcher of its (dtype, head dim)
 * (sm90.h declares it). tag is bf16 or f16, is_bf16 the matching 1/0. */
#define FC_SM90_DEFINE_LAUNCHER(tag, is_bf16, dim)                                                        \
    fc_status fc_sm90_launch_##tag##_d##dim(int config, const fc_sm90_params *prm, int grid, int device,   \
                                            cudaStream_t s, char *err, size_t len)                        \
    {                                                                                                     \
        return fc90::launch_row<(is_bf16) != 0, dim>(config, prm, grid, device, s, err, len);            \
    }

#endif /* FC_SM90_FWD_KERNEL_CUH */
