/*
 * merge.cu -- fc_attention_merge on device memory, the same arithmetic as
 * src/cpu/merge.c row for row:
 *
 *     m = max_i lse_i (NaN ignored), any NaN lse noted
 *     m == -inf and no NaN: the row saw no key -> out 0, lse -inf
 *     w_i = exp(lse_i - m) for each part with lse_i != -inf (others not read)
 *     out = (sum_i w_i * out_i) / (sum_i w_i), lse = m + log(sum_i w_i)
 *
 * Every sum runs in part order in fp32, each product and sum rounded on its
 * own (no FMA: the CPU path's ISO C build does not contract them), and the
 * quotient is one IEEE division. exp and log are taken in double and
 * rounded once to float: the correctly rounded values, which the host
 * libm's expf/logf also return nearly always, so the two backends agree
 * bit for bit wherever their weights do.
 *
 * Layout: a group of G lanes (a power of two, G * 4 >= head_dim up to 32)
 * per (token, head) row, each lane 4 columns of a 4G-column chunk; a grid
 * of groups strides over the rows. The part descriptors (pointer and
 * strides of each part's out and lse) travel in the kernel's parameters for
 * up to kInline parts; beyond that in a table in the per-device scratch
 * pool, written on the stream by staging kernels whose parameters carry
 * them, so a captured graph holds every byte it needs (no host copy).
 */
#include <cstdint>
#include <cstdio>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"
#include "cuda/merge.h"

namespace {

constexpr int kThreads = 128;   /* threads per block                          */
constexpr int kCols = 4;        /* columns per lane: a float4, 8 bytes of f16  */
constexpr int kInline = 8;      /* parts carried in the merge kernel's params  */
constexpr int kStageParts = 48; /* parts per staging launch                    */
constexpr int kMinBlocks = 8;   /* per SM: 64 registers a thread, no spills    */

/* One tensor's rows [batch][seq][head] (fc_merge_tensor on the device). */
struct rows_desc {
    const void *data;
    int64_t batch_stride, row_stride, head_stride;
    int32_t dtype;
};

struct part_desc {
    rows_desc out, lse;
};

struct merge_args {
    rows_desc out, lse; /* lse.data NULL: not written */
    int64_t batch, seqlen, heads, head_dim;
    int64_t step_b, step_s, step_h; /* the grid's group count as rows (b, s, h) */
    int32_t num_parts;
    int32_t group;           /* lanes per row: 1, 2, 4, 8, 16 or 32 */
    const part_desc *table;  /* the parts in device memory, or NULL: in inl */
    part_desc inl[kInline];
};

struct stage_args {
    part_desc *dst;
    int32_t count;
    part_desc src[kStageParts];
};

/* The 4 KB that every CUDA version and architecture takes. */
static_assert(sizeof(merge_args) <= 4000 && sizeof(stage_args) <= 4000, "kernel parameters over 4 KB");

__device__ __forceinline__ int64_t row_offset(const rows_desc &t, int64_t b, int64_t s, int64_t h)
{
    return b * t.batch_stride + s * t.row_stride + h * t.head_stride;
}

__device__ __forceinline__ float lse_at(const part_desc &p, int64_t b, int64_t s, int64_t h)
{
    return static_cast<const float *>(p.lse.data)[row_offset(p.lse, b, s, h)];
}

/* exp and log in double, rounded once to float (see the file comment). */
__device__ __forceinline__ float weight(float lse, float mx)
{
    return __double2float_rn(exp(static_cast<double>(__fsub_rn(lse, mx))));
}

__device__ __forceinline__ float log_rn(float x) { return __double2float_rn(log(static_cast<double>(x))); }

__device__ __forceinline__ float from_bits(uint32_t bits, int32_t dtype)
{
    if (dtype == FC_DTYPE_BF16) return __uint_as_float(bits << 16);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

/* x[k] = column c0 + k of a part's row (c0 + k < d; others 0), exactly as
 * float: one vector load where the address allows, else element loads. */
__device__ __forceinline__ void load_cols(const void *row, int32_t dtype, int64_t c0, int64_t d, float x[kCols])
{
    const bool whole = c0 + kCols <= d;
    if (dtype == FC_DTYPE_F32) {
        const float *src = static_cast<const float *>(row) + c0;
        if (whole && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
            const float4 v = __ldg(reinterpret_cast<const float4 *>(src));
            x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
            return;
        }
#pragma unroll
        for (int k = 0; k < kCols; k++) x[k] = c0 + k < d ? __ldg(src + k) : 0.0f;
        return;
    }
    const unsigned short *src = static_cast<const unsigned short *>(row) + c0;
    if (whole && (reinterpret_cast<uintptr_t>(src) & 7) == 0) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(src));
        const uint32_t w[2] = {v.x, v.y};
#pragma unroll
        for (int k = 0; k < kCols; k++) x[k] = from_bits(k & 1 ? w[k / 2] >> 16 : w[k / 2] & 0xffffu, dtype);
        return;
    }
#pragma unroll
    for (int k = 0; k < kCols; k++) x[k] = c0 + k < d ? from_bits(__ldg(src + k), dtype) : 0.0f;
}

__device__ __forceinline__ uint32_t to_bits(float v, int32_t dtype)
{
    if (dtype == FC_DTYPE_BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    return __half_as_ushort(__float2half_rn(v));
}

/* Columns c0 .. c0+3 (those < d) of out's row = q[k], rounded once to the
 * dtype: one vector store where the address allows, else element stores. */
__device__ __forceinline__ void store_cols(void *row, int32_t dtype, int64_t c0, int64_t d, const float q[kCols])
{
    const bool whole = c0 + kCols <= d;
    if (dtype == FC_DTYPE_F32) {
        float *dst = static_cast<float *>(row) + c0;
        if (whole && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
            *reinterpret_cast<float4 *>(dst) = make_float4(q[0], q[1], q[2], q[3]);
            return;
        }
#pragma unroll
        for (int k = 0; k < kCols; k++)
            if (c0 + k < d) dst[k] = q[k];
        return;
    }
    unsigned short *dst = static_cast<unsigned short *>(row) + c0;
    if (whole && (reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
        uint32_t w[2];
#pragma unroll
        for (int k = 0; k < 2; k++) w[k] = to_bits(q[2 * k], dtype) | to_bits(q[2 * k + 1], dtype) << 16;
        *reinterpret_cast<uint2 *>(dst) = make_uint2(w[0], w[1]);
        return;
    }
#pragma unroll
    for (int k = 0; k < kCols; k++)
        if (c0 + k < d) dst[k] = static_cast<unsigned short>(to_bits(q[k], dtype));
}

/* One merged row (b, s, h) by a group of g lanes (this one gl of them;
 * gmask: the group's lanes, which take every branch below together). */
__device__ void merge_row(const merge_args &a, const part_desc *parts, int64_t b, int64_t s, int64_t h, int gl,
                          int g, unsigned gmask)
{
    const int n = a.num_parts;
    const int64_t d = a.head_dim;
    float mx = -INFINITY;
    int nan = 0; /* a NaN lse makes the row NaN (its weight is NaN) */
    for (int i = gl; i < n; i += g) {
        const float v = lse_at(parts[i], b, s, h);
        nan |= isnan(v);
        mx = fmaxf(mx, v); /* NaN ignored, as the CPU path's v > mx */
    }
    for (int o = g / 2; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(gmask, mx, o, g));
    nan = __any_sync(gmask, nan);
    const bool empty = mx == -INFINITY && !nan; /* no part saw a key */

    char *out_row = static_cast<char *>(const_cast<void *>(a.out.data)) +
                    row_offset(a.out, b, s, h) * (a.out.dtype == FC_DTYPE_F32 ? 4 : 2);
    for (int64_t base = 0; base < d; base += (int64_t)g * kCols) {
        const int64_t c0 = base + (int64_t)gl * kCols;
        float acc[kCols], x[kCols], sum = 0.0f;
#pragma unroll
        for (int k = 0; k < kCols; k++) acc[k] = 0.0f;
        /* Parts in blocks of g: each lane takes one part's weight (-1: the
         * part saw no key), then the group walks the block in part order. */
        for (int p0 = 0; p0 < n && !empty; p0 += g) {
            float wl = -1.0f;
            if (p0 + gl < n) {
                const float v = lse_at(parts[p0 + gl], b, s, h);
                if (v != -INFINITY) wl = weight(v, mx);
            }
            const int m = n - p0 < g ? n - p0 : g;
            for (int j = 0; j < m; j++) {
                const float w = __shfl_sync(gmask, wl, j, g);
                if (w < 0.0f) continue; /* its row is not read; a NaN weight is kept */
                sum = __fadd_rn(sum, w);
                if (c0 >= d) continue;
                const part_desc &p = parts[p0 + j];
                const char *row = static_cast<const char *>(p.out.data) +
                                  row_offset(p.out, b, s, h) * (p.out.dtype == FC_DTYPE_F32 ? 4 : 2);
                load_cols(row, p.out.dtype, c0, d, x);
#pragma unroll
                for (int k = 0; k < kCols; k++) acc[k] = __fadd_rn(acc[k], __fmul_rn(w, x[k]));
            }
        }
        if (c0 < d) {
#pragma unroll
            for (int k = 0; k < kCols; k++) acc[k] = empty ? 0.0f : __fdiv_rn(acc[k], sum);
            store_cols(out_row, a.out.dtype, c0, d, acc);
        }
        if (a.lse.data && base == 0 && gl == 0)
            static_cast<float *>(const_cast<void *>(a.lse.data))[row_offset(a.lse, b, s, h)] =
                empty ? -INFINITY : __fadd_rn(mx, log_rn(sum));
    }
}

/* The grid's groups stride over the rows (b, s, h) of the call, stepping
 * the three indices with carries: a 64-bit division would be a subroutine
 * call, whose saved registers spill. */
__global__ void __launch_bounds__(kThreads, kMinBlocks) merge_kernel(const __grid_constant__ merge_args a)
{
    fc_grid_dep_sync(); /* the parts (and the table) come from work queued before */
    const int g = a.group, lane = threadIdx.x & 31, gl = lane & (g - 1);
    const unsigned gmask = g == 32 ? 0xffffffffu : ((1u << g) - 1u) << (lane & ~(g - 1));
    const part_desc *parts = a.table ? a.table : a.inl;
    /* this group's first row: the grid has far fewer than 2^31 groups */
    const unsigned first = blockIdx.x * (kThreads / g) + threadIdx.x / g, t = first / (unsigned)a.heads;
    int64_t h = first % (unsigned)a.heads, s = t % (unsigned)a.seqlen, b = t / (unsigned)a.seqlen;
    while (b < a.batch) {
        merge_row(a, parts, b, s, h, gl, g, gmask);
        h += a.step_h;
        const int carry = h >= a.heads;
        if (carry) h -= a.heads;
        s += a.step_s + carry;
        b += a.step_b;
        if (s >= a.seqlen) {
            s -= a.seqlen;
            b++;
        }
    }
}

/* Copies a launch's share of the part table from its parameters. */
__global__ void __launch_bounds__(64) stage_kernel(const __grid_constant__ stage_args a)
{
    fc_grid_dep_sync(); /* the table's memory may have served a kernel just before */
    for (int i = threadIdx.x; i < a.count; i += blockDim.x) a.dst[i] = a.src[i];
}

rows_desc desc_of(const fc_merge_tensor &t) { return {t.data, t.batch_stride, t.row_stride, t.head_stride, t.dtype}; }

part_desc part_of(const fc_merge_params *m, int i) { return {desc_of(m->parts_out[i]), desc_of(m->parts_lse[i])}; }

/* The part table in device memory (table: merge_table_bytes of the
 * pool), written by staging launches. */
fc_status stage_parts(const fc_merge_params *m, part_desc *table, bool pdl, cudaStream_t stream, char *err,
                      size_t err_len)
{
    const int n = m->num_parts;
    stage_args s = {};
    for (int i0 = 0; i0 < n; i0 += kStageParts) {
        s.dst = table + i0;
        s.count = n - i0 < kStageParts ? n - i0 : kStageParts;
        for (int j = 0; j < s.count; j++) s.src[j] = part_of(m, i0 + j);
        FC_CUDA_TRY("merge part table kernel launch", fc_launch(stage_kernel, 1, 64, 0, stream, pdl, s));
    }
    return FC_OK;
}

/* Rows (b, s, h) of the call (0: nothing to write). */
int64_t merge_rows(const fc_merge_params *m) { return m->batch * m->seqlen * m->heads; }

} /* namespace */

extern "C" int64_t fc_cuda_merge_table_bytes(const fc_merge_params *m)
{
    return m->num_parts > kInline && merge_rows(m) > 0 ? (int64_t)m->num_parts * (int64_t)sizeof(part_desc) : 0;
}

extern "C" fc_status fc_cuda_merge_launch(const fc_merge_params *m, void *table, const fc_cuda_device *dev, int pdl,
                                          void *stream, char *err, size_t err_len)
{
    if (m->num_parts < 1 || m->num_parts > FC_MAX_MERGE_PARTS || m->head_dim < 1 ||
        (m->out.dtype != FC_DTYPE_F32 && m->out.dtype != FC_DTYPE_F16 && m->out.dtype != FC_DTYPE_BF16) ||
        (!table) != (fc_cuda_merge_table_bytes(m) == 0)) {
        snprintf(err, err_len, "internal: merge called with %d parts, head_dim %lld, out dtype %d, table %p",
                 (int)m->num_parts, (long long)m->head_dim, (int)m->out.dtype, table);
        return FC_ERR_INTERNAL;
    }
    const int64_t rows = merge_rows(m);
    if (rows == 0) return FC_OK; /* no token: nothing to write */
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    merge_args a = {};
    a.out = desc_of(m->out);
    a.lse = desc_of(m->lse);
    a.batch = m->batch;
    a.seqlen = m->seqlen;
    a.heads = m->heads;
    a.head_dim = m->head_dim;
    a.num_parts = m->num_parts;
    a.group = 1;
    while (a.group < 32 && (int64_t)a.group * kCols < m->head_dim) a.group *= 2;
    if (table) {
        a.table = static_cast<part_desc *>(table);
        const fc_status s = stage_parts(m, static_cast<part_desc *>(table), pdl != 0, st, err, err_len);
        if (s != FC_OK) return s;
    } else {
        for (int i = 0; i < m->num_parts; i++) a.inl[i] = part_of(m, i);
    }
    const int64_t per_block = kThreads / a.group;
    const int64_t wave = (int64_t)(dev->sm_count > 0 ? dev->sm_count : 1) * kMinBlocks;
    int64_t blocks = (rows + per_block - 1) / per_block;
    if (blocks > wave) blocks = wave; /* the groups stride over the rest */
    const int64_t groups = blocks * per_block;
    a.step_h = groups % m->heads;
    a.step_s = groups / m->heads % m->seqlen;
    a.step_b = groups / m->heads / m->seqlen;
    FC_CUDA_TRY("merge kernel launch", fc_launch(merge_kernel, dim3((unsigned)blocks), kThreads, 0, st, pdl != 0, a));
    return FC_OK;
}
