/*
 * append.cu -- the append step of a CUDA forward call, one kernel ahead of
 * the attention on the same stream: k_new / v_new written into the cache
 * (dense or paged) after each sequence's seqused_k keys, k_new and q
 * rotated when rotary tables are given (fp32, rounded once to the dtype),
 * and the attention's key counts seqused_k + seqlen_new. The CPU step
 * (cpu/append.c) is its oracle. One thread per element: the step moves
 * (2 batch seqlen_new heads_kv + batch seqlen_q heads_q) head_dim elements,
 * a few hundred KiB for a decoding step.
 */
#include <climits>
#include <cstdint>
#include <cstdio>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/append.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"

namespace {

constexpr int kThreads = 256;

template <class T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ __half from_f32(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32(float x) { return __float2bfloat16_rn(x); }

/* Element d of the row at src, rotated to position pos (cpu/append.c's
 * pairing). A position past the tables (only with the host checks off:
 * out of contract) leaves the element unrotated rather than read outside. */
template <class T>
__device__ float rotated(const fc_append_params &ap, const T *src, int d, int64_t pos)
{
    const float x = to_f32(src[d]);
    if (!ap.cos || d >= ap.rotary_dim || pos >= ap.seqlen_ro) return x;
    const int half = ap.rotary_dim / 2;
    int i, partner;
    bool first;
    if (ap.interleaved) {
        i = d >> 1, partner = d ^ 1, first = (d & 1) == 0;
    } else {
        first = d < half;
        i = first ? d : d - half, partner = first ? d + half : d - half;
    }
    const float c = to_f32(static_cast<const T *>(ap.cos)[pos * ap.cos_row_stride + i]);
    const float s = to_f32(static_cast<const T *>(ap.sin)[pos * ap.sin_row_stride + i]);
    const float y = to_f32(src[partner]);
    return first ? x * c - y * s : x * c + y * s;
}

/* Element d of k_new / v_new row (b, t, h) into the cache. Keys past the
 * cache or pages outside the pool (host checks off: out of contract) are
 * skipped, never written. */
template <class T>
__device__ void append_elem(const fc_fwd_params &p, bool is_v, int64_t r, int d)
{
    const fc_append_params &ap = p.app;
    const int64_t h = r % p.heads_kv, bt = r / p.heads_kv, t = bt % ap.seqlen_new, b = bt / ap.seqlen_new;
    const int64_t j = (int64_t)p.seqused_k[b] + t;
    if (j >= p.seqlen_k) return;
    int64_t blk = b, row = j;
    if (p.block_table) {
        blk = p.block_table[b * p.block_table_stride + j / p.page_size];
        row = j % p.page_size;
        if (blk < 0 || blk >= p.num_pages) return;
    }
    if (is_v) {
        const T *src = static_cast<const T *>(ap.v_new) + b * ap.vn_batch_stride + t * ap.vn_row_stride + h * ap.vn_head_stride;
        T *dst = (T *)p.v + blk * p.v_batch_stride + row * p.v_row_stride + h * p.v_head_stride;
        dst[d] = src[d];
    } else {
        const T *src = static_cast<const T *>(ap.k_new) + b * ap.kn_batch_stride + t * ap.kn_row_stride + h * ap.kn_head_stride;
        T *dst = (T *)p.k + blk * p.k_batch_stride + row * p.k_row_stride + h * p.k_head_stride;
        dst[d] = from_f32<T>(rotated(ap, src, d, j));
    }
}

/* Element d of q row (b, i, h), rotated, into q_rot [batch, seqlen_q, heads_q, d]. */
template <class T>
__device__ void rotate_q_elem(const fc_fwd_params &p, T *q_rot, int q_step, int64_t r, int d)
{
    const int64_t h = r % p.heads_q, bi = r / p.heads_q, i = bi % p.seqlen_q, b = bi / p.seqlen_q;
    const T *src = static_cast<const T *>(p.q) + b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
    q_rot[r * p.head_dim + d] = from_f32<T>(rotated(p.app, src, d, (int64_t)p.seqused_k[b] + i * q_step));
}

template <class T>
__global__ void __launch_bounds__(kThreads) append_kernel(const fc_fwd_params p, T *q_rot, int32_t *used, int q_step)
{
    fc_grid_dep_sync();
    const int64_t kv_rows = (int64_t)p.batch * p.app.seqlen_new * p.heads_kv;
    const int64_t q_rows = q_rot ? (int64_t)p.batch * p.seqlen_q * p.heads_q : 0;
    const int64_t total = (2 * kv_rows + q_rows) * p.head_dim;
    for (int64_t e = blockIdx.x * (int64_t)kThreads + threadIdx.x; e < total; e += (int64_t)gridDim.x * kThreads) {
        const int d = (int)(e % p.head_dim);
        const int64_t r = e / p.head_dim;
        if (r < 2 * kv_rows)
            append_elem<T>(p, r >= kv_rows, r % kv_rows, d);
        else
            rotate_q_elem<T>(p, q_rot, q_step, r - 2 * kv_rows, d);
    }
    if (blockIdx.x == 0)
        for (int b = threadIdx.x; b < p.batch; b += kThreads)
            used[b] = min(p.seqused_k[b] + p.app.seqlen_new, p.seqlen_k);
}

/* The rotated q's room in the scratch (16-bit elements), the counts after it. */
int64_t q_rot_room(const fc_fwd_params *p)
{
    const int64_t q = p->app.cos ? (int64_t)p->batch * p->seqlen_q * p->heads_q * p->head_dim * 2 : 0;
    return (q + 255) / 256 * 256;
}

} /* namespace */

extern "C" int64_t fc_cuda_append_scratch_bytes(const fc_fwd_params *p)
{
    return q_rot_room(p) + (int64_t)p->batch * (int64_t)sizeof(int32_t);
}

extern "C" fc_status fc_cuda_append(const fc_fwd_params *p, void *scratch, int pdl, void *stream,
                                    fc_fwd_params *lp, char *err, size_t err_len)
{
    void *q_rot = p->app.cos ? scratch : nullptr;
    int32_t *used = reinterpret_cast<int32_t *>(static_cast<char *>(scratch) + q_rot_room(p));
    const int64_t rows = 2 * (int64_t)p->batch * p->app.seqlen_new * p->heads_kv +
                         (q_rot ? (int64_t)p->batch * p->seqlen_q * p->heads_q : 0);
    int64_t blocks = (rows * p->head_dim + kThreads - 1) / kThreads;
    blocks = blocks < 1 ? 1 : blocks > 65536 ? 65536 : blocks; /* grid-stride beyond */
    const int step = fc_rotary_q_step(p);
    cudaError_t e = p->dtype == FC_DTYPE_BF16
                        ? fc_launch(append_kernel<__nv_bfloat16>, (unsigned)blocks, kThreads, 0, (cudaStream_t)stream,
                                    pdl != 0, *p, static_cast<__nv_bfloat16 *>(q_rot), used, step)
                        : fc_launch(append_kernel<__half>, (unsigned)blocks, kThreads, 0, (cudaStream_t)stream,
                                    pdl != 0, *p, static_cast<__half *>(q_rot), used, step);
    const fc_status st = fc_cuda_check(e, "append kernel launch", err, err_len);
    if (st) return st;
    fc_append_result(p, lp, q_rot, used);
    return FC_OK;
}
