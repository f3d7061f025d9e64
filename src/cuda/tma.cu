/*
 * tma.cu -- host side of TMA: building CUtensorMap descriptors, and the
 * layout test that says whether TMA can load a tensor view at all. Used by
 * the Hopper path (Q/K/V/O maps) and by the sm80-class path's kVarTma rows
 * (K/V maps); a common source, so built whatever FLASHCORE_CUDA_ARCHS holds.
 *
 * cuTensorMapEncodeTiled is a driver API function. FlashCore links only the
 * CUDA runtime (no -lcuda), so the function is fetched at run time through
 * cudaGetDriverEntryPointByVersion, pinned to the 12.0 ABI of the call.
 *
 * A descriptor is a pure function of the encode arguments, and encoding
 * costs host time on every forward call (4 maps, ~0.25 us each on an H100
 * host), so each thread keeps its last few
 * descriptors and reuses one whose arguments are all equal.
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled_v12000 */

#include "cuda/common/tma_map.h"

namespace {

struct Encoder {
    PFN_cuTensorMapEncodeTiled_v12000 fn;
    char why[160];
};

Encoder load_encoder()
{
    Encoder e;
    e.fn = nullptr;
    e.why[0] = '\0';
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t st = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                      cudaEnableDefault, &q);
    if (st != cudaSuccess) {
        snprintf(e.why, sizeof e.why, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled) failed: %s",
                 cudaGetErrorString(st));
        cudaGetLastError(); /* do not leave it as the sticky "last error" of the next launch */
    } else if (q != cudaDriverEntryPointSuccess || !fn) {
        snprintf(e.why, sizeof e.why,
                 "the CUDA driver has no cuTensorMapEncodeTiled (query result %d): a 12.0+ driver is needed",
                 (int)q);
    } else {
        e.fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    return e;
}

/* C++ guarantees a thread-safe one-time initialisation of a local static. */
const Encoder &encoder()
{
    static const Encoder e = load_encoder();
    return e;
}

/* Everything cuTensorMapEncodeTiled receives that varies (the rest is
 * constant below); unused dims are zero so that whole keys compare. */
struct MapKey {
    const void *base;
    uint64_t dims[5], strides[4];
    uint32_t box[6];                 /* [5] unused: keeps the struct free of */
    int32_t rank, bf16, swizzle, pad_; /* padding bytes, so memcmp is exact  */
};
static_assert(sizeof(MapKey) == 8 + 40 + 32 + 24 + 16, "MapKey must have no padding (memcmp)");

struct MapCache {
    static constexpr int N = 8; /* a call needs 4 (q, k, v, o); 2 calls' worth */
    MapKey key[N];
    CUtensorMap map[N];
    int used, next;
};

thread_local MapCache t_maps;

MapKey make_key(const void *base, int bf16, int rank, const uint64_t *dims, const uint64_t *strides,
                const uint32_t *box, int swizzle)
{
    MapKey k;
    memset(&k, 0, sizeof k);
    k.base = base;
    k.rank = rank;
    k.bf16 = bf16 != 0;
    k.swizzle = swizzle;
    for (int i = 0; i < rank; ++i) {
        k.dims[i] = dims[i];
        k.box[i] = box[i];
        if (i < rank - 1) k.strides[i] = strides[i];
    }
    return k;
}

} /* namespace */

fc_status fc_tma_encode_map(CUtensorMap *map, const char *what, const void *base, int bf16, int rank,
                             const uint64_t *dims, const uint64_t *strides_bytes, const uint32_t *box,
                             int swizzle_bytes, char *err, size_t err_len)
{
    if (rank < 1 || rank > 5) {
        snprintf(err, err_len, "%s: tensor map rank %d outside 1..5", what, rank);
        return FC_ERR_INTERNAL;
    }
    /* The limits TMA imposes (cuTensorMapEncodeTiled documentation); checked
     * here so that the message names the tensor instead of a bare
     * CUDA_ERROR_INVALID_VALUE. plan.cu checks the user-visible ones first. */
    if (((uintptr_t)base & 15) != 0) {
        snprintf(err, err_len, "%s: base address %p is not 16-byte aligned (TMA)", what, base);
        return FC_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < rank; ++i) {
        if (dims[i] == 0 || dims[i] > (1ull << 32)) {
            snprintf(err, err_len, "%s: dimension %d of size %llu is outside TMA's 1..2^32", what, i,
                     (unsigned long long)dims[i]);
            return FC_ERR_UNSUPPORTED;
        }
        if (box[i] == 0 || box[i] > 256) {
            snprintf(err, err_len, "%s: box dimension %d = %u is outside TMA's 1..256", what, i, box[i]);
            return FC_ERR_INTERNAL;
        }
    }
    for (int i = 0; i < rank - 1; ++i) {
        if (strides_bytes[i] % 16 != 0 || strides_bytes[i] >= (1ull << 40)) {
            snprintf(err, err_len,
                     "%s: stride %d of %llu bytes is not a multiple of 16 below 2^40 (TMA)", what, i + 1,
                     (unsigned long long)strides_bytes[i]);
            return FC_ERR_UNSUPPORTED;
        }
    }
    if (box[0] * 2 > (uint32_t)swizzle_bytes) {
        snprintf(err, err_len, "%s: box inner extent %u B exceeds the %d-byte swizzle span", what,
                 box[0] * 2, swizzle_bytes);
        return FC_ERR_INTERNAL;
    }
    const MapKey key = make_key(base, bf16, rank, dims, strides_bytes, box, swizzle_bytes);
    MapCache &c = t_maps;
    for (int i = 0; i < c.used; ++i) {
        if (memcmp(&c.key[i], &key, sizeof key) == 0) {
            *map = c.map[i];
            return FC_OK;
        }
    }
    const Encoder &e = encoder();
    if (!e.fn) {
        snprintf(err, err_len, "%s: %s", what, e.why);
        return FC_ERR_CUDA;
    }
    const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
    const CUtensorMapSwizzle swz =
        swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    memset(map, 0, sizeof *map);
    CUresult r = e.fn(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                      (cuuint32_t)rank,
                      const_cast<void *>(base), reinterpret_cast<const cuuint64_t *>(dims),
                      reinterpret_cast<const cuuint64_t *>(strides_bytes),
                      reinterpret_cast<const cuuint32_t *>(box), elem_strides,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        char d[160] = "", s[160] = "", b[96] = "";
        size_t ud = 0, us = 0, ub = 0;
        for (int i = 0; i < rank; ++i) {
            ud += (size_t)snprintf(d + ud, sizeof d - ud, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
            ub += (size_t)snprintf(b + ub, sizeof b - ub, "%s%u", i ? ", " : "", box[i]);
            if (i < rank - 1)
                us += (size_t)snprintf(s + us, sizeof s - us, "%s%llu", i ? ", " : "",
                                       (unsigned long long)strides_bytes[i]);
            if (ud >= sizeof d || us >= sizeof s || ub >= sizeof b) break;
        }
        snprintf(err, err_len, "%s: cuTensorMapEncodeTiled failed (CUresult %d) for dims {%s}, strides {%s} B, box {%s}",
                 what, (int)r, d, s, b);
        return FC_ERR_CUDA;
    }
    c.key[c.next] = key;
    c.map[c.next] = *map;
    c.next = (c.next + 1) % MapCache::N;
    if (c.used < MapCache::N) ++c.used;
    return FC_OK;
}

bool fc_tma_layout_ok(const char *name, const void *ptr, const int64_t stride[3], const int64_t size[3],
                      const char *who, char *why, size_t why_len)
{
    static const char *const dim_name[3] = {"row", "head", "batch"};
    if (((uintptr_t)ptr & 15) != 0) {
        snprintf(why, why_len, "%s at %p is not 16-byte aligned: %s", name, ptr, who);
        return false;
    }
    for (int i = 0; i < 3; ++i) {
        if (size[i] <= 1) continue;
        const int64_t s = stride[i];
        if (s <= 0 || s % 8 != 0 || s >= (int64_t)1 << 39) {
            snprintf(why, why_len,
                     "%s %s stride %lld elements (%lld bytes) is not a positive multiple of 16 bytes: %s",
                     name, dim_name[i], (long long)s, (long long)(2 * s), who);
            return false;
        }
    }
    return true;
}

void fc_tma_map_strides(const int64_t *stride, const int64_t *size, int n, int head_dim, uint64_t *out)
{
    uint64_t fill = (uint64_t)head_dim * 2;
    for (int i = 0; i < n; ++i)
        if (size[i] > 1 && (uint64_t)stride[i] * 2 > fill) fill = (uint64_t)stride[i] * 2;
    fill = (fill + 15) & ~(uint64_t)15;
    for (int i = 0; i < n; ++i) out[i] = size[i] > 1 ? (uint64_t)stride[i] * 2 : fill;
}

bool fc_tma_kv_ok(const fc_fwd_params *p, const char *who, char *why, size_t why_len)
{
    const int64_t rows = fc_tma_k_rows(p);
    if (rows >= ((int64_t)1 << 31) - 256) {
        snprintf(why, why_len, "%lld key rows: TMA coordinates are int32 (limit 2^31 - 256): %s", (long long)rows,
                 who);
        return false;
    }
    if (rows == 0) return true;
    const int64_t n[3] = {rows, p->heads_kv, fc_tma_kv_batches(p)};
    const int64_t ks[3] = {p->k_row_stride, p->k_head_stride, p->k_batch_stride};
    const int64_t vs[3] = {p->v_row_stride, p->v_head_stride, p->v_batch_stride};
    return fc_tma_layout_ok("k", p->k, ks, n, who, why, why_len) &&
           fc_tma_layout_ok("v", p->v, vs, n, who, why, why_len);
}

bool fc_tma_q_ok(const fc_fwd_params *p, const char *name, const void *ptr, const int64_t stride[3], const char *who,
                 char *why, size_t why_len)
{
    const int64_t rows = fc_tma_q_rows(p);
    if (rows >= ((int64_t)1 << 31) - 256) {
        snprintf(why, why_len, "%lld query rows: TMA coordinates are int32 (limit 2^31 - 256): %s", (long long)rows,
                 who);
        return false;
    }
    const int64_t n[3] = {rows, p->heads_q, fc_tma_q_batches(p)};
    return fc_tma_layout_ok(name, ptr, stride, n, who, why, why_len);
}

fc_status fc_tma_encode_rows(CUtensorMap *map, const char *what, const void *base, int bf16, const int64_t stride[3],
                             int64_t rows, int64_t heads, int64_t batches, int head_dim, int box_rows, int swizzle,
                             char *err, size_t err_len)
{
    const int64_t n[3] = {rows, heads, batches};
    uint64_t sb[3];
    fc_tma_map_strides(stride, n, 3, head_dim, sb);
    const uint64_t dims[4] = {(uint64_t)head_dim, (uint64_t)rows, (uint64_t)heads, (uint64_t)batches};
    const uint32_t box[4] = {(uint32_t)swizzle / 2, (uint32_t)box_rows, 1, 1};
    return fc_tma_encode_map(map, what, base, bf16, 4, dims, sb, box, swizzle, err, err_len);
}
