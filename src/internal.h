/*
 * internal.h -- what crosses between the API layer (src/api.c), the
 * selection function (src/dispatch.c) and the backends (src/cpu/, src/cuda/).
 *
 * fc_fwd_params is the plain-data struct that crosses the C/CUDA line: no
 * pointers to host structures, no C++ types. The API layer fills it after
 * every argument check, so backends may trust it.
 */
#ifndef FC_INTERNAL_H
#define FC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "constants.h"
#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FC_ERRMSG_LEN 512

/* Index convention for all strides: element offsets (not bytes).
 * Dense:  q element (b, s, h, d) at q + b*q_batch_stride + s*q_row_stride + h*q_head_stride + d
 * Varlen: token t (global index over all sequences) at q + t*q_row_stride + h*q_head_stride + d,
 *         sequence b owns tokens cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1, batch strides are 0.
 * lse:    dense (b, h, s) at lse + b*lse_batch_stride + h*lse_head_stride + s*lse_row_stride;
 *         varlen (h, t)   at lse + h*lse_head_stride + t*lse_row_stride.          */
/* The append step (k_new non-NULL; fc_attention_args has the rules).
 * fc_run consumes it before any attention kernel runs (fc_cpu_append,
 * cuda/append.h): the kernels get the rotated q, seqused_k + seqlen_new
 * and app zeroed. */
typedef struct fc_append_params {
    const void *k_new, *v_new; /* [batch, seqlen_new, heads_kv, head_dim]  */
    int64_t kn_batch_stride, kn_row_stride, kn_head_stride;
    int64_t vn_batch_stride, vn_row_stride, vn_head_stride;
    int32_t seqlen_new;
    const void *cos, *sin;     /* [seqlen_ro, rotary_dim / 2]; NULL: none */
    int64_t cos_row_stride, sin_row_stride;
    int32_t rotary_dim, seqlen_ro, interleaved;
} fc_append_params;

typedef struct fc_fwd_params {
    const void *q, *k, *v;
    void *o;
    float *lse; /* NULL: not requested */

    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int64_t lse_batch_stride, lse_head_stride, lse_row_stride;

    int32_t batch;
    int32_t heads_q, heads_kv, head_dim;
    int32_t seqlen_q, seqlen_k; /* dense: the sizes; varlen: max_seqlen_q/k */
    int32_t dtype;              /* fc_dtype of q; of k, v, out too unless FP8 (below) */

    float scale;      /* resolved: never 0 here                                  */
    float softcap;    /* 0 = off                                                  */
    int32_t causal;   /* 1 if the caller asked for causal (window_right is then 0)*/
    int32_t window_left, window_right; /* -1 = unbounded; causal folded in        */

    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* NULL = dense; backend memory   */
    int64_t total_q, total_k;                   /* varlen token counts            */

    /* Paged KV (block_table non-NULL): k/v's batch stride steps pages, the
     * row stride rows of a page; seqlen_k = max_pages * page_size. Key j of
     * sequence b: fc_key_slot_of. seqused_k: keys in use per sequence (dense
     * or paged; NULL = seqlen_k). All in the backend's memory space. */
    const int32_t *block_table;
    int64_t block_table_stride;
    int32_t page_size, num_pages, max_pages;
    const int32_t *seqused_k;

    /* Filled by the CUDA layer for split-KV; 0/NULL otherwise. */
    int32_t num_splits;
    float *o_accum;   /* [num_splits, batch*heads_q, seqlen_q, head_dim] fp32 */
    float *lse_accum; /* [num_splits, batch*heads_q, seqlen_q] fp32            */

    /* Append and rotary (fc_append_params): last in the struct, so the
     * kernels' parameter layout stays put. */
    fc_append_params app;

    /* FP8 (fc_attention_args has the rules): k/v's and out's dtypes (equal
     * to dtype unless an FP8 call), the descales (data NULL: 1) and the
     * amax outputs (NULL: not requested). Last, as app. */
    int32_t kv_dtype, o_dtype;
    fc_descale q_descale, k_descale, v_descale;
    float *out_amax, *p_amax;
} fc_fwd_params;

/* 1 for the FP8 element types. */
static inline int fc_dtype_is_fp8(int dt) { return dt == FC_DTYPE_E4M3 || dt == FC_DTYPE_E5M2; }
static inline int fc_dtype_is_16bit(int dt) { return dt == FC_DTYPE_F16 || dt == FC_DTYPE_BF16; }

/* max(a, x), NaN as soon as either is NaN (the FP8 amax outputs must show
 * it); order-free, so any thread count gives the same bits. Exact for
 * float arguments too. */
static inline double fc_nan_max(double a, double x) { return x != x || x > a ? x : a; }

/* Descale of (sequence b, kv head g): 1 when not given. */
static inline float fc_descale_at(const fc_descale *d, int64_t b, int64_t g)
{
    return d->data ? d->data[b * d->batch_stride + g * d->head_stride] : 1.0f;
}

/* The backward's plain-data params. f carries q, k, v, out (f.o, read here),
 * lse (f.lse, read, never NULL), the shapes and the resolved options, all as
 * in the forward; dout has out's layout, dq q's, dk and dv k's/v's (same
 * index convention, own strides). Filled after every check, like f. */
typedef struct fc_bwd_params {
    fc_fwd_params f;
    const void *dout;
    void *dq, *dk, *dv;
    int64_t do_batch_stride, do_row_stride, do_head_stride;
    int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
    int32_t g_dtype;        /* dq, dk, dv: f.dtype, or f32 (f16/bf16 inputs) */
    int32_t deterministic;  /* 1: bitwise-reproducible dq/dk/dv             */
    void *workspace;        /* the caller's scratch, or NULL (library's)    */
    int64_t workspace_bytes;
} fc_bwd_params;

/* A causal-like band (right bound, no left one): a query block's key range,
 * and a key block's query range, grow with the block index, so both paths
 * order their work longest first. */
static inline int fc_causal_like(const fc_fwd_params *p) { return p->window_right >= 0 && p->window_left < 0; }

/* "f32", "f16", "bf16", "e4m3", "e5m2", "f64", or "unknown". Inline: the
 * CUDA kernels' library uses it and links nothing of the core. */
static inline const char *fc_dtype_name(int dt)
{
    static const char *const names[] = {"f32", "f16", "bf16", "e4m3", "e5m2", "f64"};
    return dt >= FC_DTYPE_F32 && dt <= FC_DTYPE_F64 ? names[dt] : "unknown";
}

/* Bytes per element of a known dtype. Inline, as fc_dtype_name. */
static inline int64_t fc_dtype_bytes(int dt)
{
    return dt == FC_DTYPE_F64 ? 8 : dt == FC_DTYPE_F32 ? 4 : dt <= FC_DTYPE_BF16 ? 2 : 1;
}

/* out takes 16-byte stores: 16-byte aligned, its row and head strides
 * multiples of 8 elements, and its batch stride where it steps (dense,
 * batch > 1); else element stores (both paths' epilogues). */
static inline int fc_o_vec_ok(const fc_fwd_params *p)
{
    return ((uintptr_t)p->o & 15) == 0 && p->o_row_stride % 8 == 0 && p->o_head_stride % 8 == 0 &&
           (p->cu_seqlens_q || p->batch <= 1 || p->o_batch_stride % 8 == 0);
}

/* Key j of sequence b: paged, its page and its row in the page; dense or
 * varlen, (b, j). Its element offset in k (or v: pass v's strides) is
 * fc_key_offset: base (a varlen sequence's first token, else 0) +
 * blk * batch stride + row * row stride (varlen batch strides are 0). The
 * CPU paths call it per key, once for K and V; the kernels unroll the
 * same rule. */
typedef struct fc_key_slot {
    int64_t blk, row;
} fc_key_slot;
static inline fc_key_slot fc_key_slot_of(const fc_fwd_params *p, int64_t b, int64_t j)
{
    fc_key_slot s = {b, j};
    if (p->block_table) {
        s.blk = p->block_table[b * p->block_table_stride + j / p->page_size];
        s.row = j % p->page_size;
    }
    return s;
}
static inline int64_t fc_key_offset(fc_key_slot s, int64_t base, int64_t row_stride, int64_t batch_stride)
{
    return base + s.blk * batch_stride + s.row * row_stride;
}

/* Rotary positions of q: row i of sequence b is at seqused_k[b] (before
 * the append) + i * step, step 1 when a mask makes the rows' positions
 * matter (causal or a window), else 0 (flash-attn's rule). */
static inline int fc_rotary_q_step(const fc_fwd_params *p) { return p->window_left >= 0 || p->window_right >= 0; }

/* Keys sequence b uses: its varlen length, seqused_k, or all seqlen_k. */
static inline int64_t fc_used_keys(const fc_fwd_params *p, int64_t b)
{
    if (p->cu_seqlens_k) return (int64_t)p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
    return p->seqused_k ? p->seqused_k[b] : p->seqlen_k;
}

/* The visibility rule, shared by every backend so they cannot disagree.
 * i: query row within its sequence, j: key column, sq/sk: that sequence's
 * lengths. Returns 1 if key j contributes to query i. */
#if defined(__CUDACC__)
#define FC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FC_HOST_DEVICE static inline
#endif
FC_HOST_DEVICE int fc_key_visible(int64_t i, int64_t j, int64_t sq, int64_t sk, int wl, int wr)
{
    int64_t diag = i + sk - sq; /* bottom-right alignment */
    if (wr >= 0 && j > diag + wr) return 0;
    if (wl >= 0 && j < diag - wl) return 0;
    return 1;
}

/* ---- CPU backend (src/cpu/) -------------------------------------------- */
/* The tiled paths' workers take num_threads (<= 0: one per online core) and
 * pool, the context's parked workers and their scratch (cpu/pool.h; NULL:
 * the calling thread alone). */
struct fc_pool;
/* Double-precision reference. Handles every dtype/option of fc_fwd_params.
 * On failure writes a message to err and returns a status; nothing written. */
fc_status fc_cpu_reference_forward(const fc_fwd_params *p, char *err, size_t err_len);
/* Tiled online-softmax path, multithreaded over (batch, head, query tile). */
fc_status fc_cpu_tiled_forward(const fc_fwd_params *p, int num_threads, struct fc_pool *pool, char *err,
                                size_t err_len);

/* What the attention takes after the append step (both backends): p with
 * q_rot (non-NULL: the rotated q, contiguous [batch, seqlen_q, heads_q,
 * head_dim]), the counts seqused_k + seqlen_new, the step cleared. */
static inline void fc_append_result(const fc_fwd_params *p, fc_fwd_params *lp, const void *q_rot, const int32_t *used)
{
    *lp = *p;
    if (q_rot) {
        lp->q = q_rot;
        lp->q_head_stride = p->head_dim;
        lp->q_row_stride = (int64_t)p->heads_q * p->head_dim;
        lp->q_batch_stride = (int64_t)p->seqlen_q * lp->q_row_stride;
    }
    lp->seqused_k = used;
    memset(&lp->app, 0, sizeof lp->app);
}

/* The append step on host memory (append.c): k_new/v_new (rotated) into
 * the cache, then *lp = p for the attention: q rotated into new scratch
 * (when rotary), seqused_k + seqlen_new, app cleared. *scratch (free() it
 * after the attention) holds both. */
fc_status fc_cpu_append(const fc_fwd_params *p, fc_fwd_params *lp, void **scratch, char *err, size_t err_len);

/* Backward: the fp64 oracle (dq, dk, dv each rounded once) and the tiled
 * multithreaded path. Both deterministic; both allocate their own scratch. */
fc_status fc_cpu_reference_backward(const fc_bwd_params *p, char *err, size_t err_len);
fc_status fc_cpu_tiled_backward(const fc_bwd_params *p, int num_threads, struct fc_pool *pool, char *err,
                                 size_t err_len);

/* Merging partial results (fc_attention_merge, src/merge.c): checked
 * parts, rows addressed as [batch][seq][head] (variable length: batch 1,
 * seq = the token count, batch strides 0). Strides in elements. The CUDA
 * launcher (cuda/merge.h) takes the same struct: its arrays in host
 * memory, the tensors' data on the device. */
typedef struct fc_merge_tensor {
    const void *data;
    int32_t dtype;                /* the output dtype (lse: f32)            */
    int64_t batch_stride, row_stride, head_stride;
} fc_merge_tensor;

typedef struct fc_merge_params {
    int32_t num_parts;
    const fc_merge_tensor *parts_out, *parts_lse; /* num_parts each          */
    fc_merge_tensor out, lse;     /* lse.data NULL: not written             */
    int64_t batch, seqlen, heads, head_dim;
} fc_merge_params;

/* The merge on host memory (src/cpu/merge.c), multithreaded over rows; the
 * sum of each element in part order (the result is independent of the
 * thread count). */
fc_status fc_cpu_merge(const fc_merge_params *m, int num_threads, struct fc_pool *pool, char *err, size_t err_len);

/* ---- CUDA layer (src/cuda/, or src/cuda_stub.c without CUDA) -------------- */
typedef struct fc_cuda_device {
    int id;
    int cc_major, cc_minor;
    int sm_count;
    int64_t smem_optin;   /* max dynamic shared memory per block (opt-in)  */
    int64_t l2_bytes;
    int driver_version, runtime_version;
    char name[128];
} fc_cuda_device;

/* A kernel choice made by the selection function for the CUDA backend. */
typedef enum fc_cuda_path { FC_CUDA_PATH_SM80 = 1, FC_CUDA_PATH_SM90 = 2 } fc_cuda_path;
typedef struct fc_cuda_choice {
    int32_t path;           /* fc_cuda_path                                   */
    int32_t config;         /* index into that path's tile table              */
    int32_t num_splits;     /* 1 = no split-KV                                */
    int32_t pack_gqa;       /* 1 = query heads sharing a KV head in one tile  */
    int32_t pack_refused;   /* sm90: pack-GQA would pay, but these kernels
                             * cannot pack the ratio (dispatch.c then tries
                             * the sm80-class kernel, which can)            */
    int32_t rotate;         /* sm90: the rotated tile loop (plan.cu)          */
    int32_t tail;           /* sm90: the last tiles' KV blocks dealt out evenly
                             * over the CTAs (tail balancing, plan.cu); its
                             * workspace is in workspace_bytes              */
    int32_t masks;          /* blocks that may need softcap/mask code: 0
                             * none, 1 a tile's first only (sm90), 2 any;
                             * picks the kernel instance (each plan.cu)    */
    int32_t pdl;            /* launch the kernels as programmatic dependents
                             * of the previous kernel (common/pdl.cuh): an
                             * sm_90+ device and tuning.pdl not 0; decided
                             * once per call, here, for forward and combine */
    int32_t group_splits;   /* backward: a key block's GQA group dealt to
                             * this many CTAs (fc_bwd_group_splits); 0 or
                             * 1: none                                      */
    int32_t grid_cap;       /* sm90: at most this many persistent CTAs
                             * (tuning.sm90_grid), 0 = no cap               */
    const char *trace_file; /* sm90 trace builds: where the trace goes
                             * (tuning.sm90_trace_file, owned by the
                             * context), NULL = nowhere                     */
    int64_t workspace_bytes;
    char name[96];
} fc_cuda_choice;

/* 1 if CUDA support is compiled in. */
int fc_cuda_compiled(void);
/* Comma-separated list of compiled SM architectures, e.g. "80,86,89,90a". */
const char *fc_cuda_compiled_archs(void);
/* 1 if this build has SASS of architecture floor (e.g. 89) or newer that runs
 * on a device of capability major.minor (kernels needing sm_89 instructions). */
int fc_cuda_compiled_from(int major, int minor, int floor);
/* Describe device (device < 0: current device). FC_ERR_NO_DEVICE if none. */
fc_status fc_cuda_get_device(int device, fc_cuda_device *dev, char *err, size_t err_len);
/* Whether launches on dev take programmatic dependent launch (dispatch.c:
 * the forward's, the backward's and the merge's one rule). */
int fc_cuda_pdl_on(const fc_cuda_device *dev, const fc_tuning *tune);
/* Stream-ordered scratch of `bytes` on stream (runtime.c), so it works inside
 * graph capture and is reused without a device-wide sync: for a forward
 * call on device, from a per-device pool that keeps up to 64 MiB across
 * synchronisations; device -1 (the backward, whose fp32 dQ can be large),
 * or where that pool cannot be made: cudaMallocAsync's default pool. Freed
 * with cudaFreeAsync. FC_ERR_OUT_OF_MEMORY / FC_ERR_CUDA with a message
 * naming `what`, *ws NULL. */
fc_status fc_cuda_ws_alloc(void **ws, int64_t bytes, int device, void *stream, const char *what, char *err,
                           size_t err_len);
/* Where a call's pointers live: memory_space.h (src/cuda/pointers.c). */
/* Synchronous device->host copy on stream (used to validate cu_seqlens). */
fc_status fc_cuda_copy_to_host(void *dst, const void *src, size_t bytes, void *stream,
                               char *err, size_t err_len);
/* 1 if stream is being captured into a graph. */
int fc_cuda_stream_is_capturing(void *stream);
/* Per-path planners: does this path have a kernel for p on dev? If yes fill
 * choice->config/name/pack_gqa and return FC_OK; if not return
 * FC_ERR_UNSUPPORTED with the reason (e.g. the list of head dims). They do
 * not choose num_splits: dispatch.c does, through fc_choose_num_splits.
 * tune: the context's hooks (a forced row is still checked against p). */
fc_status fc_sm80_plan(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                       fc_cuda_choice *choice, char *why, size_t why_len);
fc_status fc_sm90_plan(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                       fc_cuda_choice *choice, char *why, size_t why_len);
/* Tile rows/columns of sm90 config `config` (src/cuda/sm90/plan.cu; 1x1 for
 * an index outside the table). */
void fc_sm90_tile_shape(int config, int *block_m, int *block_n);
/* Row i of the Hopper / sm80-class table: 1 and *row filled, or 0 when i is
 * past the end (sm90/tile_rows.cu, sm80/plan.cu). */
int fc_sm90_tile_row(int i, fc_tile_row *row);
int fc_sm90_bwd_tile_row(int i, fc_tile_row *row);
int fc_sm80_tile_row(int i, fc_tile_row *row);
/* Row i of the sm80-class backward table (sm80/bwd_plan.cu), as above. */
int fc_sm80_bwd_tile_row(int i, fc_tile_row *row);
/* Rows (M) and columns (N) of one tile of a planned config, so the split
 * count can be derived from the grid size. */
void fc_cuda_tile_shape(const fc_cuda_choice *choice, int *block_m, int *block_n);
/* Path launchers, called by fc_cuda_forward (src/cuda/launch.cu) after it
 * has set up the split-KV workspace in p. Each checks every CUDA return code
 * and the last error after each launch. Without FC_HAVE_SM90 the sm90 pair is
 * a stub answering FC_ERR_UNSUPPORTED. */
fc_status fc_sm80_forward(const fc_fwd_params *p, const fc_cuda_choice *choice,
                          const fc_cuda_device *dev, void *stream, char *err, size_t err_len);
fc_status fc_sm90_forward(const fc_fwd_params *p, const fc_cuda_choice *choice,
                          const fc_cuda_device *dev, void *stream, char *err, size_t err_len);
/* Run a planned choice. Allocates the split-KV workspace stream-ordered
 * (fc_cuda_ws_malloc) when num_splits > 1, launches, checks every return code
 * and the launch error. */
fc_status fc_cuda_forward(const fc_fwd_params *p, const fc_cuda_choice *choice,
                          const fc_cuda_device *dev, void *stream, char *err, size_t err_len);

/* Backward planner of the sm80-class path (runs on sm_80 and newer): as the
 * forward planners, for p; fills choice->config/name and workspace_bytes
 * (the scratch the run needs, from p's shapes and p->deterministic). */
fc_status fc_sm80_bwd_plan(const fc_bwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                           fc_cuda_choice *choice, char *why, size_t why_len);
/* Backward planner of the Hopper path (sm90/bwd_plan.cu; an sm_90 device):
 * as fc_sm80_bwd_plan. Without FC_HAVE_SM90 a stub answering
 * FC_ERR_UNSUPPORTED. */
fc_status fc_sm90_bwd_plan(const fc_bwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                           fc_cuda_choice *choice, char *why, size_t why_len);
/* The Hopper backward's path launcher (sm90/bwd_plan.cu), as
 * fc_sm80_backward. */
fc_status fc_sm90_backward(const fc_bwd_params *p, const fc_cuda_choice *choice, const fc_cuda_device *dev,
                           void *workspace, void *stream, char *err, size_t err_len);
/* The sm80-class backward's path launcher (sm80/bwd_plan.cu): preprocess,
 * main and convert kernels of the planned row, with `workspace` (at least
 * choice->workspace_bytes, 256-byte aligned). */
fc_status fc_sm80_backward(const fc_bwd_params *p, const fc_cuda_choice *choice, const fc_cuda_device *dev,
                           void *workspace, void *stream, char *err, size_t err_len);
/* Run a planned backward: uses p->workspace when the caller gave one, else
 * allocates choice->workspace_bytes stream-ordered and frees it after the
 * launches; checks every return code and the last error after each launch. */
fc_status fc_cuda_backward(const fc_bwd_params *p, const fc_cuda_choice *choice,
                           const fc_cuda_device *dev, void *stream, char *err, size_t err_len);

/* Bytes of the fp32 split-KV workspace (o_accum + lse_accum) for p with
 * `splits` splits; computed in one place for dispatch and launcher. */
int64_t fc_cuda_split_workspace_bytes(const fc_fwd_params *p, int splits);

/* ---- selection (src/dispatch.c) -------------------------------------------- */
/* Split-KV count for a grid of `tiles` CTAs over `n_blocks` KV blocks on a
 * device with sm_count SMs (1 = no split); streaming: tiles of at most 16
 * query rows, bound by reading K/V. */
int fc_choose_num_splits(int64_t tiles, int n_blocks, int sm_count, int max_splits, int streaming);

#ifdef __cplusplus
}
#endif
#endif /* FC_INTERNAL_H */
