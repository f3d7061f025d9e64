/*
 * flashcore.h -- the only public header of FlashCore, a fused exact attention
 * library (forward and backward pass) with a plain C API.
 *
 *     O = softmax(scale * Q K^T + mask) V
 *
 * computed tile by tile with an online softmax; the score matrix never
 * touches memory. Backends: CPU (always), CUDA (when built with it and a
 * device of a compiled architecture is present).
 *
 * Ownership: the library never takes ownership of caller memory. Every
 * tensor pointer is owned by the caller and must stay valid for the whole
 * call (for the CUDA backend: until the work queued on the stream has run).
 * Objects the library creates (fc_context) are freed with their *_free call.
 *
 * Memory spaces: tensors and cu_seqlens passed to the CPU backend are host
 * pointers; passed to the CUDA backend they are device pointers (or managed /
 * mapped pointers the device can read). With FC_BACKEND_AUTO the library asks
 * the CUDA runtime where q lives and picks the backend from that.
 *
 * Threads: an fc_context may be used by one thread at a time (its last-error
 * message is per context). Different contexts are fully independent and may
 * be used concurrently from different threads; the free functions that take
 * no context (fc_version*, fc_status_string, fc_attention_args_init) are
 * thread-safe. The CPU backend's worker threads belong to the context: started
 * at its first CPU call that needs them, parked between calls (no CPU time),
 * joined by fc_context_free, with their scratch memory. In the child of a
 * fork() a context made before it runs its CPU calls on the calling thread.
 *
 * Errors: every function that can fail returns an fc_status. On failure the
 * context's fc_last_error() names the argument and the limit. Argument checks
 * happen before any output is touched: a call that returns an error has not
 * written out or lse (backward: dq, dk, dv). The library never exits or
 * aborts its host process.
 */
#ifndef FLASHCORE_H
#define FLASHCORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHCORE_VERSION_MAJOR 0
#define FLASHCORE_VERSION_MINOR 1
#define FLASHCORE_VERSION_PATCH 0
#define FLASHCORE_VERSION_NUMBER \
    (FLASHCORE_VERSION_MAJOR * 10000 + FLASHCORE_VERSION_MINOR * 100 + FLASHCORE_VERSION_PATCH)
#define FLASHCORE_VERSION_STRING "0.1.0"

/* Export macro: FC_API marks the public symbols of the shared library. */
#if defined(_WIN32)
#  if defined(FLASHCORE_BUILDING_SHARED)
#    define FC_API __declspec(dllexport)
#  elif defined(FLASHCORE_SHARED)
#    define FC_API __declspec(dllimport)
#  else
#    define FC_API
#  endif
#elif defined(__GNUC__)
#  define FC_API __attribute__((visibility("default")))
#else
#  define FC_API
#endif

/* Status codes. The numeric values are pinned: they never change. */
typedef enum fc_status {
    FC_OK = 0,
    FC_ERR_INVALID_ARGUMENT = 1, /* a null pointer, bad shape/stride/dtype, ... */
    FC_ERR_UNSUPPORTED = 2,      /* valid request no built kernel handles      */
    FC_ERR_OUT_OF_MEMORY = 3,    /* host or device allocation failed           */
    FC_ERR_CUDA = 4,             /* a CUDA runtime call or launch failed       */
    FC_ERR_NO_DEVICE = 5,        /* CUDA asked for, but no usable device       */
    FC_ERR_INTERNAL = 6          /* a bug in FlashCore: please report it       */
} fc_status;

/* Element types. The values are pinned. FP8 (E4M3 = OCP e4m3fn: no
 * infinity, max 448; E5M2: IEEE-like, max 57344) are forward inputs with
 * descales (fc_attention_args, "FP8"): the CPU backends run every FP8 call;
 * CUDA runs an FP8 K/V cache under f16/bf16 q (sm_89+, head dims 64 and
 * 128) and answers FC_ERR_UNSUPPORTED for FP8 q. F64 runs on the
 * cpu-reference backend alone (gradient checks in double; lse stays f32):
 * backend AUTO sends host f64 calls there, CPU and CUDA refuse it. */
typedef enum fc_dtype {
    FC_DTYPE_F32 = 0,
    FC_DTYPE_F16 = 1,
    FC_DTYPE_BF16 = 2,
    FC_DTYPE_E4M3 = 3, /* FP8 inputs */
    FC_DTYPE_E5M2 = 4, /* FP8 inputs */
    FC_DTYPE_F64 = 5   /* cpu-reference only */
} fc_dtype;

/* Backends. The values are pinned. */
typedef enum fc_backend {
    FC_BACKEND_AUTO = 0,          /* CUDA if q is device memory, else CPU        */
    FC_BACKEND_CPU = 1,           /* fast tiled multithreaded CPU path           */
    FC_BACKEND_CUDA = 2,          /* GPU kernels                                 */
    FC_BACKEND_CPU_REFERENCE = 3  /* double-precision oracle: slow, simple      */
} fc_backend;

/* A strided tensor view; the caller owns data.
 *   ndim    4 for dense tensors, 3 for variable-length q/k/v/out
 *           ([total_tokens, heads, head_dim]), 3 for dense lse
 *           ([batch, heads_q, seqlen_q]) and 2 for variable-length lse
 *           ([heads_q, total_q]).
 *   shape   sizes, outermost first; entries past ndim are ignored.
 *   stride  in elements (not bytes); the last dimension must have stride 1.
 *           Any other strides work (BHSD as torch lays it out, padded or
 *           non-contiguous heads), as long as offsets fit int64 (in
 *           elements and bytes) and outputs overlap neither themselves,
 *           each other, nor an input. */
typedef struct fc_tensor {
    void *data;
    fc_dtype dtype;
    int32_t ndim;
    int64_t shape[4];
    int64_t stride[4];
} fc_tensor;

/* An FP8 tensor's dequantisation factors: one f32 per (batch, kv head),
 * element (b, g) at data[b * batch_stride + g * head_stride], in the
 * backend's memory space, 4-byte aligned, read by the call. Strides 0 give
 * one value for every batch (or head): {data, 0, 0} is a per-tensor scale.
 * data NULL means 1 (the default). b is the sequence index (dense, varlen
 * or paged); query head h uses group g = h / (heads_q / heads_kv). */
typedef struct fc_descale {
    const float *data;
    int64_t batch_stride, head_stride; /* elements, >= 0 */
} fc_descale;

/* Forward arguments. Always start from fc_attention_args_init(), which sets
 * every field to its default, then fill what you need.
 *
 *   q    [batch, seqlen_q, heads_q,  head_dim]  (varlen: [total_q, heads_q, d])
 *   k, v [batch, seqlen_k, heads_kv, head_dim]  (varlen: [total_k, heads_kv, d])
 *   out  like q, same dtype as q (FP8 q: its own, see "FP8" below), or
 *        f32 under f16/bf16 inputs (unrounded partials to merge; the CPU
 *        backends, FC_ERR_UNSUPPORTED on CUDA);
 *        written by the call
 *   lse  optional (lse.data == NULL: not written), f32,
 *        [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]);
 *        natural-log log-sum-exp of the (scaled, capped, masked) scores.
 *
 * Semantics (docs/API.md has the full text):
 *   scale         0 means 1/sqrt(head_dim); else 1e-25 <= |scale| <= 1e25.
 *   softcap       0 disables; else s = softcap * tanh(scale*qk / softcap),
 *                 softcap in [1e-13, 1e3].
 *   pointers      aligned to their element size (lse, cu_seqlens: 4 bytes);
 *                 out and lse overlap nothing the call reads, nor each other.
 *   causal        key j is visible to query i iff j <= i + seqlen_k - seqlen_q
 *                 (bottom-right aligned, as FlashAttention).
 *   window_left/right  -1 = unbounded; key j visible iff
 *                 i + (seqlen_k - seqlen_q) - window_left <= j
 *                 and j <= i + (seqlen_k - seqlen_q) + window_right.
 *                 causal is window_right = 0 combined with any window_left.
 *   GQA/MQA       heads_q % heads_kv == 0; query head h reads kv head
 *                 h / (heads_q / heads_kv).
 *   varlen        cu_seqlens_q/k non-NULL: int32 arrays of num_seqs+1
 *                 non-decreasing offsets starting at 0, in the backend's
 *                 memory space; max_seqlen_q/k bound every sequence. The
 *                 library reads them to validate (for CUDA: one small
 *                 synchronous copy, skipped while the stream is capturing).
 *   Rows with no visible key: out = 0, lse = -inf.
 */
typedef struct fc_attention_args {
    fc_tensor q, k, v, out, lse;
    float scale;
    float softcap;
    int32_t causal;
    int32_t window_left;
    int32_t window_right;
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int32_t num_seqs;     /* varlen: number of sequences (cu_seqlens hold num_seqs+1) */
    int32_t max_seqlen_q;
    int32_t max_seqlen_k;
    fc_backend backend;
    /* FP8 (docs/API.md, "FP8"). Inputs: q, k, v all FP8 of one type, out
     * f32, f16 or bf16; or an FP8 K/V cache: k and v FP8 of one type, q
     * and out f32, f16 or bf16 (equal; CUDA: f16 or bf16, k/v strides
     * multiples of 16 elements). The call computes
     * attention on the dequantised inputs x * descale, exactly as if they
     * had been passed in f32:
     *   s_ij  = scale * q_descale * k_descale * (q_i . k_j), then softcap;
     *   out_i = v_descale * sum_j P_ij v_j.
     * A descale may only be set for an FP8 tensor. out_amax and p_amax
     * (optional, FP8 calls only, one f32 each in the backend's memory space,
     * written): the largest |out| element written (0 if none), and the
     * largest softmax probability, max over rows of 1 / (the row's sum of
     * exp(s_ij - max_j s_ij)) (0 if no row sees a key) -- the statistics
     * delayed-scaling training recipes keep (CPU backends only today).
     * The forward only. */
    fc_descale q_descale, k_descale, v_descale;
    float *out_amax, *p_amax;
    /* Paged KV cache (docs/API.md, "Paged KV cache"). block_table non-NULL:
     * k and v are pages, [num_pages, page_size, heads_kv, head_dim] with any
     * strides (so [num_pages, heads_kv, page_size, head_dim] storage is the
     * strided view of it), page_size >= 1; block_table is int32
     * [batch, max_pages_per_seq] with rows block_table_stride elements apart
     * (0 = max_pages_per_seq), in the backend's memory space, and key j of
     * sequence b is row j % page_size of page
     * block_table[b * stride + j / page_size]. q, out and lse stay dense
     * (no cu_seqlens). The forward only: the backward refuses it. */
    const int32_t *block_table;
    int32_t max_pages_per_seq;
    int64_t block_table_stride;
    /* Keys in use per sequence (the cache lengths), int32 [batch] in the
     * backend's memory space, each in [0, seqlen_k] (paged: seqlen_k is
     * max_pages_per_seq * page_size); causal and windows align to them.
     * NULL: every sequence uses all seqlen_k keys. Dense calls only (varlen
     * has cu_seqlens_k); forward only. Block-table entries past a
     * sequence's used pages are never read. */
    const int32_t *seqused_k;
    /* Append (docs/API.md, "Appending to the cache"). k_new.data non-NULL:
     * k_new and v_new [batch, seqlen_new, heads_kv, head_dim], q's dtype,
     * are written into the cache (k, v; dense or paged) at keys
     * seqused_k[b] .. seqused_k[b] + seqlen_new - 1 before the attention,
     * which then sees seqused_k[b] + seqlen_new keys. seqused_k is required
     * (the lengths before the append) and is not updated. k and v are then
     * written: they may share an allocation (an interleaved K/V cache) but
     * no element, and overlap nothing else. Forward only, dense q.
     * Rotary (rotary_cos.data non-NULL, needs k_new): cos and sin
     * [seqlen_ro, rotary_dim / 2], q's dtype, rotate the first rotary_dim
     * dims (even, <= head_dim) of k_new (position seqused_k[b] + t) and of q
     * (position seqused_k[b] + i when causal or windowed, else
     * seqused_k[b]; q itself is not modified). rotary_interleaved 1 pairs
     * dims (2i, 2i+1) (GPT-J), 0 pairs (i, i + rotary_dim / 2) (GPT-NeoX).
     * Every position must be < seqlen_ro. */
    fc_tensor k_new, v_new;
    fc_tensor rotary_cos, rotary_sin;
    int32_t rotary_interleaved;
} fc_attention_args;

/* What the selection function chose (or would choose). */
typedef struct fc_kernel_info {
    fc_backend backend;   /* CPU, CUDA or CPU_REFERENCE                      */
    char name[96];        /* e.g. "sm80_fwd_bf16_d128_m128n64_s2", "cpu_tiled" */
    int32_t num_splits;   /* split-KV count (1 = no split)                   */
    int64_t workspace_bytes; /* scratch the library allocates for this call  */
    int32_t tuned;        /* 1: the kernel is the context's tuning cache's
                           * choice for the call (fc_context_load_tuning);
                           * 0: the planner's                                */
} fc_kernel_info;

typedef struct fc_context fc_context;

/* ---- version ------------------------------------------------------------ */
/* Runtime version as MAJOR*10000+MINOR*100+PATCH, and as a string. Static
 * storage; thread-safe. */
FC_API unsigned fc_version_number(void);
FC_API const char *fc_version_string(void);
/* Build description (compiler, flags, CUDA architectures, git SHA). Static
 * storage; thread-safe. */
FC_API const char *fc_build_info(void);

/* ---- status ------------------------------------------------------------- */
/* A static, human-readable name for a status ("FC_ERR_UNSUPPORTED: ...").
 * Unknown values give "unknown status". Thread-safe. */
FC_API const char *fc_status_string(fc_status status);

/* ---- context ------------------------------------------------------------ */
/* Create a context. *out receives a new context owned by the caller (free it
 * with fc_context_free). Returns FC_ERR_INVALID_ARGUMENT if out is NULL,
 * FC_ERR_OUT_OF_MEMORY if allocation fails (then *out is NULL). Creating a
 * context never touches the GPU. */
FC_API fc_status fc_context_create(fc_context **out);
/* Free a context; NULL is accepted and ignored. */
FC_API void fc_context_free(fc_context *ctx);
/* The last error message set on ctx by a failing call ("" if none). The
 * string is owned by ctx and valid until the next call on ctx. ctx NULL
 * gives a static message. */
FC_API const char *fc_last_error(const fc_context *ctx);
/* Number of worker threads for the CPU backend: 0 (default) = one per online
 * core. Negative values are rejected. A new value also stops the context's
 * parked workers and frees their scratch (the next CPU call starts what it
 * needs); setting the same value again keeps them. */
FC_API fc_status fc_context_set_num_threads(fc_context *ctx, int num_threads);
/* Which CUDA device the CUDA backend uses (default: the current device of
 * the calling thread at the time of the call, -1). */
FC_API fc_status fc_context_set_device(fc_context *ctx, int device);

/* Restrict the CUDA backend to one kernel family (for tests and tuning):
 * 0 = automatic (default), 80 = the Ampere-class path (mma.sync, runs on
 * sm_80 and newer), 90 = the Hopper path (wgmma/TMA, sm_90 only). A forced
 * path that cannot handle a request makes it FC_ERR_UNSUPPORTED (never a
 * silent fallback). */
FC_API fc_status fc_context_set_cuda_path(fc_context *ctx, int path);

/* Whether the CUDA backend checks the contents of the call's device int32
 * arrays (cu_seqlens_q/k, seqused_k, block_table) before it launches: 1
 * (default) copies them to the host synchronously and checks them (skipped
 * while the stream is capturing a graph); 0 trusts them, which removes a
 * host-device round trip from every such call (a decode step's ~100 us
 * becomes its kernel time) and makes invalid contents the caller's error:
 * out-of-range reads, undefined results, as in a captured call. The CPU
 * backends always check. */
FC_API fc_status fc_context_set_check_device_arrays(fc_context *ctx, int on);

/* ---- attention ---------------------------------------------------------- */
/* Fill *args with defaults: no tensors, scale 0 (=1/sqrt(d)), softcap 0,
 * causal 0, windows -1, no varlen, backend AUTO. Thread-safe. */
FC_API void fc_attention_args_init(fc_attention_args *args);

/* Would fc_attention_forward accept args, and with which kernel? Runs the
 * same checks and the same selection function as the forward call, touches
 * no tensor data (except that CUDA varlen reads cu_seqlens to validate them)
 * and launches nothing. info may be NULL. Returns FC_OK, or the error status
 * the forward call would return, with the reason in fc_last_error(ctx). */
FC_API fc_status fc_attention_supported(fc_context *ctx, const fc_attention_args *args,
                                        fc_kernel_info *info);

/* Compute the forward pass. stream is a cudaStream_t for the CUDA backend
 * (NULL = the legacy default stream) and is ignored by the CPU backends. The
 * CUDA backend is asynchronous with respect to the host: results are ready
 * when the stream's work completes; errors detected at launch are returned.
 * info, if not NULL, receives the kernel that ran. */
FC_API fc_status fc_attention_forward(fc_context *ctx, const fc_attention_args *args,
                                      void *stream, fc_kernel_info *info);

/* ---- backward ------------------------------------------------------------ */
/* Backward arguments: the gradients of a loss L with respect to q, k and v
 * given dL/dout. Always start from fc_attention_backward_args_init().
 *
 *   fwd        the forward call's arguments, unchanged: q, k, v, out (the
 *              forward's output, read here), lse (required: the forward's
 *              natural-log lse, read here) and every option (scale, softcap,
 *              causal, window, varlen, backend). The same checks apply.
 *   dout       like out (shape, dtype, any strides): dL/dout, read.
 *   dq, dk, dv like q, k, v (shape and dtype, or all three f32 under
 *              f16/bf16 inputs: the CPU backends, FC_ERR_UNSUPPORTED on
 *              CUDA): written. Each is the full
 *              gradient: dk/dv sum over the query heads that share a KV
 *              head (GQA/MQA); keys no query sees get 0. Varlen tokens past
 *              the last cu_seqlens offset are not written (as the forward).
 *   deterministic  0: dq may be summed with atomics, so its last bits may
 *              differ between runs; 1: dq, dk and dv are bitwise identical
 *              across runs on the same device, build and inputs. The CPU
 *              backends are always deterministic.
 *   workspace, workspace_bytes  the scratch (fp32 dq accumulator, row sums
 *              of dout*out): NULL/0 = the library allocates it (CUDA:
 *              cudaMallocAsync/cudaFreeAsync on the call's stream; CPU:
 *              inside the call) and frees it. Non-NULL: the caller's buffer,
 *              owned by the caller, in the backend's memory space, 256-byte
 *              aligned, at least the workspace_bytes that
 *              fc_attention_backward_supported reports for these arguments,
 *              overlapping nothing else of the call; the call's work owns it
 *              until it has run on the stream.
 * dq, dk, dv and the workspace overlap nothing the call reads, nor each
 * other. */
typedef struct fc_attention_backward_args {
    fc_attention_args fwd;
    fc_tensor dout;
    fc_tensor dq, dk, dv;
    int32_t deterministic;
    void *workspace;
    int64_t workspace_bytes;
} fc_attention_backward_args;

/* Defaults: fwd as fc_attention_args_init, no tensors, deterministic 0, no
 * workspace. Thread-safe. */
FC_API void fc_attention_backward_args_init(fc_attention_backward_args *args);

/* Would fc_attention_backward accept args, and with which kernel? The same
 * checks and selection as the call; launches nothing. info->workspace_bytes
 * is the scratch the call needs (the size a caller's workspace must have). */
FC_API fc_status fc_attention_backward_supported(fc_context *ctx,
                                                 const fc_attention_backward_args *args,
                                                 fc_kernel_info *info);

/* Compute dq, dk, dv. stream, asynchrony and info as fc_attention_forward. */
FC_API fc_status fc_attention_backward(fc_context *ctx, const fc_attention_backward_args *args,
                                       void *stream, fc_kernel_info *info);

/* ---- merging partial results --------------------------------------------- */
/* Attention over the union of disjoint key sets, from the attention over
 * each set (a part): with lse_i the log-sum-exp of a row's scores over part
 * i's keys (natural log, as fc_attention_forward writes it) and out_i its
 * output, the merged row is
 *     lse = log sum_i exp(lse_i),  out = sum_i exp(lse_i - lse) * out_i,
 * the terms added in fp32 in part order, so the result is bitwise the same
 * for the same inputs on any thread count. What split-KV over several
 * calls, a shared-prefix (cascade) decode and context parallelism build on:
 * each part is an fc_attention_forward with lse over one block of keys.
 *
 *   parts_out[i]  like the forward's out: [batch, seqlen_q, heads, head_dim]
 *                 (variable length: [total_q, heads, head_dim]); f32, f16 or
 *                 bf16, each part its own dtype; any strides with a
 *                 contiguous last dimension
 *   parts_lse[i]  f32 [batch, heads, seqlen_q] (variable length: [heads,
 *                 total_q]); -inf: the part saw no key of that row (its out
 *                 row is then not read)
 *   out           the merged output, the parts' shape; f32, f16 or bf16
 *   lse           optional (lse.data == NULL: not written), f32, the parts'
 *                 lse shape
 * A row whose every part is -inf gets out = 0 and lse = -inf; a +inf or NaN
 * lse gives a NaN row. out and lse overlap no part nor each other. Every
 * pointer of a call is on one side: host memory runs on the CPU backend
 * (threads as the context's), device or managed memory on the CUDA backend
 * (the context's device; queued on stream with no host synchronization, so
 * a CUDA graph can capture it). FC_BACKEND_CUDA with a host out, or in a
 * build without CUDA, is FC_ERR_UNSUPPORTED; any other pointer on the
 * wrong side is FC_ERR_INVALID_ARGUMENT naming it. */
#define FC_MAX_MERGE_PARTS 1024
typedef struct fc_attention_merge_args {
    int32_t num_parts;          /* 1 to FC_MAX_MERGE_PARTS                 */
    const fc_tensor *parts_out; /* num_parts tensors                        */
    const fc_tensor *parts_lse; /* num_parts tensors                        */
    fc_tensor out, lse;
    fc_backend backend;         /* AUTO: where out lives                    */
} fc_attention_merge_args;

/* Every field to its default: no parts, no tensors, FC_BACKEND_AUTO. */
FC_API void fc_attention_merge_args_init(fc_attention_merge_args *args);

/* Merge the parts into out (and lse). stream as fc_attention_forward's. A
 * refused call (a clear status and message) writes nothing. */
FC_API fc_status fc_attention_merge(fc_context *ctx, const fc_attention_merge_args *args, void *stream);

/* ---- context parallelism ------------------------------------------------- */
/* One attention call over a sequence cut across comm->size ranks (GPUs,
 * processes or threads of one process), each holding a slice: the K/V
 * slices travel round a ring while each rank attends to the one it holds,
 * and the partial results merge by their log-sum-exp (fc_attention_merge)
 * into fp32 in ring order, so a rerun gives the same bits. The caller's
 * transport moves the data:
 *   exchange(user, send, recv, bytes, stream): send `bytes` at send to
 *     rank (rank + 1) % size and receive `bytes` from rank (rank + size -
 *     1) % size into recv (never the same memory), after the work queued
 *     on stream before the call and complete before the work queued after
 *     it; with host memory (the CPU backend) complete on return. FC_OK, or
 *     an error status the call returns; a transport must then fail on
 *     every rank, or the others wait for it. */
typedef struct fc_cp_comm {
    int32_t rank, size;
    void *user;
    fc_status (*exchange)(void *user, const void *send, void *recv, size_t bytes, void *stream);
} fc_cp_comm;

/* The rank's slice, zigzag: the sequence of S tokens cut into 2 * size
 * chunks in order, rank r holding chunks r and 2 * size - 1 - r, in that
 * order, in q, k, v, out and lse (args' seqlen_q == seqlen_k), which gives
 * every rank the same work under a causal mask. Any S: the ring reads a
 * slice of n rows as ceil(n / 2) rows of its first chunk, then the rest,
 * which is the split where the first S % (2 * size) chunks have one row
 * more than the others (floor(S / (2 * size)) rows; ranks' slices may
 * differ in length by up to 2, and a chunk may be empty); no padding, no
 * rounding. Varlen (cu_seqlens_q equal to
 * cu_seqlens_k): every sequence of the batch split so, the slice holding
 * each sequence's chunks r and 2 * size - 1 - r in sequence order. args
 * are as fc_attention_forward's for the slice (any strides; lse
 * optional), with causal the whole sequence's mask; every rank passes the
 * same options and shapes. Paged, append, windows and FP8 are
 * FC_ERR_UNSUPPORTED, and so, for now, is device memory (the Python
 * ring, flashcore.distributed, runs on GPUs). Each pair's out is fp32
 * (the f32 out of f16/bf16 inputs), so out is rounded once. Before any
 * work the ranks shake hands (size - 1 exchanges of 32 bytes): where one
 * refuses the call, or the ranks' shapes or options differ, every rank
 * returns an error (the refusing one its own) and writes nothing; only a
 * bad comm (or NULL args) returns at once, leaving the others waiting.
 * A rank whose pair call fails later (out of memory) computes no more but
 * keeps the ring turning to the end, then returns that failure and writes
 * nothing; the others finish (the backward: a rank whose dK/dV sums lack
 * its share returns its status, and writes nothing). */
FC_API fc_status fc_cp_attention_forward(fc_context *ctx, const fc_attention_args *args, const fc_cp_comm *comm,
                                         void *stream);

/* Its backward: args as fc_attention_backward's for the rank's slice (the
 * same zigzag chunks in q, k, v, out, lse, dout, dq, dk, dv), out and lse
 * being the whole sequence's (fc_cp_attention_forward's). The K/V slices
 * go round the ring once more, each followed one step behind by its fp32
 * dK/dV sums, and every rank's dq sums its pairs in fp32; so dq, dk and dv
 * are each rounded once from fp32 sums, in ring order (a rerun gives the
 * same bits). The same limits as the forward (host memory, no window);
 * args.workspace is not used. */
FC_API fc_status fc_cp_attention_backward(fc_context *ctx, const fc_attention_backward_args *args,
                                          const fc_cp_comm *comm, void *stream);

/* ---- profiling ---------------------------------------------------------- */
/* Where the host time of a call goes (CLOCK_MONOTONIC, microseconds), for
 * the context's last fc_attention_forward or fc_attention_backward that
 * returned FC_OK: on the CUDA backend this is what the CPU spends before the
 * GPU can start. The CPU backends compute inside the launch phase. */
typedef struct fc_host_profile {
    double check_us;  /* argument checks and translation                     */
    double select_us; /* backend and kernel selection: device query, memory-
                       * space checks of the pointers, planning             */
    double launch_us; /* kernel arguments (TMA descriptors), workspace,
                       * launches (CPU backends: the whole computation)      */
    double total_us;  /* the call, entry to return                          */
} fc_host_profile;

/* Copy ctx's last profile into *out (all zeros before the first successful
 * forward call). FC_ERR_INVALID_ARGUMENT if ctx or out is NULL. */
FC_API fc_status fc_last_host_profile(const fc_context *ctx, fc_host_profile *out);

/* ---- devices ------------------------------------------------------------ */
/* 1 if this build has the CUDA backend and a device of a compiled
 * architecture is present, else 0 (never an error). */
FC_API int fc_cuda_available(void);
/* Describe the CUDA device in buf (name, compute capability, SM count,
 * driver). Returns FC_ERR_NO_DEVICE with a message when there is none. */
FC_API fc_status fc_cuda_device_info(fc_context *ctx, char *buf, size_t buf_size);

/* ---- experimental: tuning hooks ----------------------------------------- */
/* For tests, benchmarks and A/B runs of the kernels, not for production: the
 * fields and their meaning may change in any release. Set in a context they
 * override the planner (and any tuning cache entry) for every call; the
 * same fields make up a tuning cache entry's choice (below). */
typedef struct fc_tuning {
    int32_t sm90_config;  /* -1: the planner's row; else a row of the Hopper
                           * table, taken when it fits the call's head_dim */
    int32_t sm80_config;  /* -1: the planner's row; else a row of the sm80
                           * table, taken when it runs the call            */
    int32_t sm90_rotate;  /* -1: the planner decides; 0 off; 1 on where the
                           * row can rotate                                  */
    int32_t sm90_tail;    /* -1: the planner decides; 0 off; 1 on where the
                           * row and the call allow tail balancing           */
    int32_t sm90_grid;    /* 0: every CTA slot; else at most this many
                           * persistent CTAs (small grids get tails)         */
    int32_t splits;       /* 0: the planner's split-KV count; else this many
                           * (1 to 64, at most one per KV block) */
    int32_t pdl;          /* -1 or 1: programmatic dependent launch on sm_90+
                           * devices (the default); 0: off                   */
    int32_t sm80_bwd_config; /* -1: the planner's row; else a row of the
                           * sm80-class backward table, taken when it runs
                           * the call (fc_tuning_bwd_row_info)               */
    int32_t sm90_bwd_config; /* the same for the Hopper backward's table
                           * (fc_tuning_bwd_row_info path 90): taken when
                           * it has the call's head_dim (and softcap)       */
    int32_t masks;        /* -1: the planner's forward kernel instance; else
                           * one with at least this much mask code: 0 none,
                           * 1 each tile's first KV block (sm90; the sm80
                           * kernels take it as 2), 2 any block. Never less
                           * than the call needs.                            */
    const char *sm90_trace_file; /* trace builds only: where each call's
                           * trace goes; NULL or "": nowhere. Copied.        */
} fc_tuning;

/* Fill *t with the defaults above (every decision the planner's). */
FC_API void fc_tuning_init(fc_tuning *t);
/* Check every field of *t (FC_ERR_INVALID_ARGUMENT naming the field and its
 * range) and copy it, string included, into ctx. Applies to later calls. */
FC_API fc_status fc_context_set_tuning(fc_context *ctx, const fc_tuning *t);
/* Copy ctx's tuning into *out; out->sm90_trace_file points into ctx and is
 * valid until the next fc_context_set_tuning or fc_context_free. */
FC_API fc_status fc_context_get_tuning(const fc_context *ctx, fc_tuning *out);

/* One row of a CUDA path's tile table, as `flashcore rows` lists them. */
typedef struct fc_tile_row {
    int32_t head_dim, block_m, block_n;
    int32_t threads;     /* per CTA                                          */
    int32_t stages;      /* K/V pipeline depth                               */
    int32_t ctas;        /* CTAs per SM the row is sized for                 */
    int32_t kvsplit;     /* sm90: warpgroups sharing one tile's KV blocks    */
    int32_t tall;        /* sm90: the tall-row gain the planner weighs, or 0 */
    int32_t arch_class;  /* sm80: the row's architecture class: 80, 86 or 90 */
    int32_t variant;     /* sm80: code-variant bits, 0 for none              */
    int32_t kernel;      /* the first row with the same kernel (itself if none
                          * earlier)                                         */
} fc_tile_row;
/* Row `index` of path 80's or 90's tile table (the values fc_tuning's
 * sm80_config / sm90_config take). FC_ERR_INVALID_ARGUMENT for another path
 * or an index past the end; FC_ERR_UNSUPPORTED in a build without CUDA. */
FC_API fc_status fc_tuning_row_info(int path, int index, fc_tile_row *row);
/* The same for a backward table (the values of fc_tuning's sm80_bwd_config,
 * path 80: threads = 32 x warps, stages 2: Q and dO double-buffered;
 * kvsplit, tall and variant 0; or sm90_bwd_config, path 90: threads 384,
 * the Q/dO ring's stages, ctas 1, variant 0). */
FC_API fc_status fc_tuning_bwd_row_info(int path, int index, fc_tile_row *row);

/* ---- tuning cache ----------------------------------------------------------- */
/* Measured kernel choices for the shapes a model uses (`flashcore tune`
 * writes them), in a text file whose format docs/TUNING.md specifies. A
 * cache is keyed by this build (library version and tile tables) and the
 * device (name, SM count, compute capability, CUDA runtime); its entries by
 * a shape bucket (pass, dtypes, head dim, GQA ratio, mask class, softcap /
 * varlen / paged / append, and seqlen_q, seqlen_k, batch * heads_q rounded
 * up to 1, 2, 3, 4, 6, 8, 12, ...). Entries of another build or device are
 * never applied. The selection function consults the cache after its
 * legality checks and takes an entry only when the call can run its path,
 * row and split count; otherwise the planner chooses, so a cache cannot
 * make a call fail or run a kernel that does not fit it. fc_kernel_info's
 * `tuned` says which happened. Fields set with fc_context_set_tuning win
 * over the cache's.
 *
 * Every context created while FLASHCORE_TUNING_CACHE names a file starts
 * with that cache (read once per process, at the first fc_context_create;
 * fc_context_tuning_info reports a file that could not be loaded). A loaded
 * cache is read-only and shared by the contexts that load the same
 * unchanged file; lookup costs well under a microsecond per call. */

/* Load the cache at path into ctx, replacing its cache (NULL: drop it, the
 * planners choose). A file that cannot be read or is not a valid cache
 * (any line: the message names it) is an error and leaves ctx as it was. */
FC_API fc_status fc_context_load_tuning(fc_context *ctx, const char *path);
/* Write ctx's cache (what was loaded plus what was recorded, every device
 * section kept) to path, in canonical order. */
FC_API fc_status fc_context_save_tuning(fc_context *ctx, const char *path);
/* Record choice for the bucket of a call on ctx's CUDA device: args for a
 * forward call, or bwd for a backward call (exactly one), checked as the
 * call is. cuda_path 0, 80 or 90; choice's fields as fc_context_set_tuning
 * checks them (a backward entry sets only sm80_bwd_config, sm90_bwd_config
 * and pdl; trace
 * file ignored); comment (one line, <= 200 bytes) or NULL goes into the
 * file. Replaces the bucket's entry; ctx's cache becomes its own copy.
 * choice NULL removes the bucket's entry for this device and build, if any
 * (cuda_path and comment unused). */
FC_API fc_status fc_context_record_tuning(fc_context *ctx, const fc_attention_args *args,
                                          const fc_attention_backward_args *bwd, int32_t cuda_path,
                                          const fc_tuning *choice, const char *comment);
/* Describe ctx's cache in buf (sections, entries, which apply to this
 * build), cut to len - 1 bytes and NUL-terminated; buf may be NULL when len
 * is 0. needed (if not NULL) gets the bytes the whole text takes, its NUL
 * included. Returns FC_OK, or the status of a FLASHCORE_TUNING_CACHE file
 * that could not be loaded (the context works without it; the text says
 * why). */
FC_API fc_status fc_context_tuning_info(const fc_context *ctx, char *buf, size_t len, size_t *needed);

#ifdef __cplusplus
}
#endif
#endif /* FLASHCORE_H */
