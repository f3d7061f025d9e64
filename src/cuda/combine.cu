/*
 * combine.cu -- split-KV combine. Split i of a row wrote O_i (fp32, already
 * normalised by its own softmax sum) and LSE_i (natural log; -inf when the
 * split saw no visible key). The row's result is
 *
 *     m = max_i LSE_i
 *     m == -inf: the row is fully masked -> out 0, lse -inf
 *     L = m + log(sum_i exp(LSE_i - m))
 *     O = sum_i exp(LSE_i - L) * O_i            (written in the output dtype)
 *
 * The sum runs over splits in index order, so results are bitwise
 * reproducible. Layouts (internal.h): o_accum [splits][batch*heads_q][seqlen_q][head_dim],
 * lse_accum [splits][batch*heads_q][seqlen_q], seqlen_q = max_seqlen_q for varlen.
 */
#include <climits>
#include <cstdint>
#include <cstdio>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/combine.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"

namespace {

constexpr int kThreads = 256;

/* The 4 output elements of a thread: one 8-byte store where the address
 * allows it (a contiguous row: d0 % 4 == 0); odd element strides, valid for
 * a 2-byte dtype, leave a row only 2-byte aligned: element stores there. */
__device__ __forceinline__ void store4(uint16_t *dst, uint2 v)
{
    if (((uintptr_t)dst & 7) == 0) {
        *reinterpret_cast<uint2 *>(dst) = v;
        return;
    }
    dst[0] = (uint16_t)(v.x & 0xffffu);
    dst[1] = (uint16_t)(v.x >> 16);
    dst[2] = (uint16_t)(v.y & 0xffffu);
    dst[3] = (uint16_t)(v.y >> 16);
}

/* One row per group of head_dim/4 threads; each thread owns 4 consecutive
 * columns (a float4 of every O_i, 8 bytes of output). */
__global__ void __launch_bounds__(kThreads) combine_kernel(const fc_fwd_params p, int rows_per_block)
{
    fc_grid_dep_sync(); /* o_accum / lse_accum come from the forward kernel just before */
    const int tpr = p.head_dim / 4; /* threads per row */
    const int64_t rows = (int64_t)p.batch * p.heads_q * p.seqlen_q;
    const int64_t row = (int64_t)blockIdx.x * rows_per_block + threadIdx.x / tpr;
    const int d0 = (threadIdx.x % tpr) * 4;
    if (threadIdx.x >= rows_per_block * tpr || row >= rows) return;

    /* row = (b * heads_q + h) * seqlen_q + i */
    const int i = (int)(row % p.seqlen_q);
    const int64_t bh = row / p.seqlen_q;
    const int h = (int)(bh % p.heads_q);
    const int b = (int)(bh / p.heads_q);
    int64_t q_start = 0, bq = b;
    if (p.cu_seqlens_q) {
        q_start = p.cu_seqlens_q[b];
        if (i >= p.cu_seqlens_q[b + 1] - q_start) return; /* past this sequence's end: never written */
        bq = 0;
    }

    const int splits = p.num_splits;
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, p.lse_accum[s * rows + row]);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    float lse = -INFINITY;
    if (m != -INFINITY) {
        float sum = 0.f;
        for (int s = 0; s < splits; ++s) sum += expf(p.lse_accum[s * rows + row] - m);
        lse = m + logf(sum);
        for (int s = 0; s < splits; ++s) {
            const float w = expf(p.lse_accum[s * rows + row] - lse);
            if (w == 0.f) continue; /* empty split (or negligible): skip its O_i */
            const float4 v = *reinterpret_cast<const float4 *>(p.o_accum + (s * rows + row) * p.head_dim + d0);
            acc[0] += w * v.x;
            acc[1] += w * v.y;
            acc[2] += w * v.z;
            acc[3] += w * v.w;
        }
    }

    const int64_t off = bq * p.o_batch_stride + (q_start + i) * p.o_row_stride + (int64_t)h * p.o_head_stride + d0;
    uint2 packed;
    if (p.dtype == FC_DTYPE_BF16) {
        __nv_bfloat162 lo = __floats2bfloat162_rn(acc[0], acc[1]), hi = __floats2bfloat162_rn(acc[2], acc[3]);
        packed.x = *reinterpret_cast<uint32_t *>(&lo);
        packed.y = *reinterpret_cast<uint32_t *>(&hi);
    } else {
        __half2 lo = __floats2half2_rn(acc[0], acc[1]), hi = __floats2half2_rn(acc[2], acc[3]);
        packed.x = *reinterpret_cast<uint32_t *>(&lo);
        packed.y = *reinterpret_cast<uint32_t *>(&hi);
    }
    store4(static_cast<uint16_t *>(p.o) + off, packed);
    if (p.lse && d0 == 0)
        p.lse[bq * p.lse_batch_stride + (int64_t)h * p.lse_head_stride + (q_start + i) * p.lse_row_stride] = lse;
}

} /* namespace */

extern "C" fc_status fc_cuda_combine_splits(const fc_fwd_params *p, int pdl, void *stream, char *err, size_t err_len)
{
    if (p->num_splits <= 1 || !p->o_accum || !p->lse_accum || p->head_dim % 4 != 0 || p->head_dim > 4 * kThreads ||
        (p->dtype != FC_DTYPE_F16 && p->dtype != FC_DTYPE_BF16)) {
        snprintf(err, err_len, "internal: split-KV combine called with splits %d, head_dim %d, dtype %d",
                 p->num_splits, p->head_dim, p->dtype);
        return FC_ERR_INTERNAL;
    }
    const int64_t rows = (int64_t)p->batch * p->heads_q * p->seqlen_q;
    if (rows == 0) return FC_OK;
    const int rows_per_block = kThreads / (p->head_dim / 4);
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    if (blocks > INT_MAX) {
        snprintf(err, err_len, "split-KV combine: %lld rows exceed the grid limit", (long long)rows);
        return FC_ERR_UNSUPPORTED;
    }
    return fc_cuda_check(fc_launch(combine_kernel, (unsigned)blocks, kThreads, 0, (cudaStream_t)stream, pdl != 0, *p,
                                   rows_per_block),
                         "split-KV combine kernel launch", err, err_len);
}
