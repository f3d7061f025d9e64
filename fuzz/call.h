/*
 * call.h -- one fuzzed call: what the generator decided (fwd_gen.c, and
 * bwd_gen.c on top of it for the backward) and what the checks need to
 * judge it (fwd_check.c, bwd_check.c).
 */
#ifndef FC_FUZZ_CALL_H
#define FC_FUZZ_CALL_H

#include "fuzz.h"

/* The buffers of a call, each placed somewhere in the arena: the forward's,
 * then those only a backward call has. */
enum {
    FB_Q, FB_K, FB_V, FB_O, FB_LSE, FB_CUQ, FB_CUK, FB_DESC,
    FB_DOUT, FB_DQ, FB_DK, FB_DV, FB_WS, FB_BT, FB_SU, FB_N
};

/* A call's block table and seqused_k (paged.c): what the arena holds, the
 * clean values a twin call gets, and the status a corruption must give. */
typedef struct fz_paged {
    int table_on, used_on;   /* block_table / seqused_k set (the pointer may be misplaced) */
    int pool;                /* k and v are page pools                                  */
    int batch;               /* rows of the table, entries of seqused_k                 */
    int32_t page_size, num_pages, max_pages; /* as meant                                */
    int64_t stride;          /* the row stride as meant (never 0)                        */
    int64_t clean_arg_stride; /* block_table_stride as meant (0: max_pages)             */
    int32_t arg_max_pages;   /* max_pages_per_seq and block_table_stride as passed      */
    int64_t arg_stride;
    int64_t table_n;         /* int32 entries placed for the table                       */
    int32_t *table, *clean;  /* what the arena holds; the valid table a twin reads       */
    int32_t used[4], used_clean[4];
    fc_status expect;        /* what the call must answer when its clean twin is accepted */
    int known;               /* expect holds                                             */
} fz_paged;

/* What fill.c draws from the bytes before the arena exists. */
typedef struct fz_fill_plan {
    uint64_t rng;
    double qk_scale;
    int sparse;
} fz_fill_plan;

typedef struct fz_call {
    fc_attention_args a;
    int bwd;                 /* a backward call: a is its fwd, plus the below  */
    fc_tensor grad[4];       /* backward: dout, dq, dk, dv (data in the arena)  */
    int32_t deterministic;
    int64_t ws_bytes;        /* backward: workspace_bytes passed                */
    int64_t ws_alloc;        /* backward: bytes of the FB_WS buffer; 0: NULL    */
    int fwd_real;            /* backward: out and lse are the reference forward's */
    char kernel[96];         /* what the call planned (fc_kernel_info.name)    */
    int args_null;           /* pass args == NULL                              */
    int threads;             /* fc_context_set_num_threads                     */
    int cuda_path, device;   /* fc_context_set_cuda_path / _set_device         */
    int tuned;               /* tun was handed to fc_context_set_tuning        */
    fc_tuning tun;
    int varlen, nseq;
    int32_t cu[2][4];        /* host copies of cu_seqlens_q / _k               */
    int32_t total_owned[2];  /* varlen: q and k tokens sequences own (cu[.][n]) */
    int64_t shape[2][4];     /* q's and k's shapes as meant (4 - varlen dims)  */
    fc_dtype dtype;          /* the dtype meant for every tensor but lse       */
    fc_dtype kv_dtype;       /* k's and v's: dtype, or FP8 (an FP8 K/V cache)  */
    float desc_value;        /* what FB_DESC holds (broadcast, strides 0)      */
    int special;             /* the inputs each hold one NaN or Inf            */
    fz_arena ar;
    int64_t off[FB_N];       /* byte offset of each buffer's data pointer; -1: NULL */
    int desc_which;          /* which descale pointer FB_DESC becomes                */
    fz_fill_plan fill;
    fz_paged pg;
} fz_call;

/* Larger tensors than this are never placed: a stride that would need more
 * is replaced by a contiguous layout (one that overflows int64 is kept,
 * because the library must reject it without addressing anything). */
#define FZ_ARENA_MAX ((int64_t)8 << 20)
/* rel_l2 is an average: over fewer elements than this, one rounding that
 * goes the other way on the largest (one f16 ulp, 2^-10, where the gate
 * allows 5e-4 on average), or one output whose terms cancel (an f32 row
 * averaging to 4e-4 from values of order 1 keeps its 0.5 ulp of 1 as 7e-5
 * of itself), decides it. Every element still meets its own tolerance. */
#define FZ_L2_MIN_ELEMS 512

/* ---- the forward's generator (fwd_gen.c), whose steps the backward's reuses */
/* Footprint in bytes of t around its data pointer, [lo, hi). 1: placed;
 * 0: an offset overflows int64 in elements or bytes, the library's limit,
 * so it must reject t without addressing anything (64 bytes are placed);
 * -1: valid but larger than the arena may be. */
int fz_footprint(const fc_tensor *t, int64_t *lo, int64_t *hi);
/* Index by weights summing to 100. */
int fz_pick(fz_in *in, const int *w, int n);
/* Context, tensors q..lse (ok[b]: b's elements may be listed) and options. */
void fz_gen_forward(fz_in *in, fz_call *c, int ok[FB_N]);
/* A tensor of the given shape: strides (padded, permuted) and, now and then,
 * a corruption; ok as above. */
void fz_gen_tensor(fz_in *in, fc_tensor *t, fc_dtype dt, int nd, const int64_t *shape, int *ok);
/* Place every buffer the call has (odd ones out: misaligned, aliased, NULL);
 * returns the arena size. Then fz_alloc_call allocates the arena and points
 * the arguments into it: 0, or -1 when the arena cannot be allocated. */
int64_t fz_place_call(fz_in *in, fz_call *c);
int fz_alloc_call(fz_call *c, int64_t size);
/* The tensor of buffer b (NULL for the arrays and the workspace). */
fc_tensor *fz_tensor_of(fz_call *c, int b);
/* Random inputs (q, k, v; dout for the backward) from a seed the bytes
 * give (read by fz_fill_plan_read before the arena exists); the varlen
 * offsets, descales and paged arrays written into their buffers. */
void fz_fill_plan_read(fz_in *in, fz_call *c);
void fz_fill_inputs(fz_call *c, const int ok[FB_N]);
void fz_fill_input(fz_call *c, int b, uint64_t *rng, double scale, int sparse, int special);
void fz_write_arrays(fz_call *c);
/* Inputs holding the poison pattern get a plain NaN instead (fill.c). */
void fz_scrub_inputs(fz_call *c, const int ok[FB_N]);
/* Poison every element of buffer b and mark its bytes as the call's to write. */
void fz_poison_output(fz_call *c, int b);

/* Build the call from the bytes: arguments, arena, inputs, poisoned outputs.
 * 0, or -1 when the arena cannot be allocated (the input is skipped). */
int fz_fwd_build(fz_in *in, fz_call *c);
/* Run supported and forward, then every check. */
void fz_fwd_check(fz_call *c);
/* Print the call's arguments (the reproducer a failure report carries). */
void fz_describe_call(const fz_call *c);

/* ---- shared by the checks (fwd_check.c) ------------------------------------ */
/* After a `supported` call (what names it): status valid, arena untouched. */
void fz_after_supported(fc_context *ctx, const fz_call *c, fc_status sup, const char *what);
/* After the call itself: status valid and counted for entry point kind,
 * the same as supported's (or out of memory), and the arena unchanged but
 * where the outputs lie (everywhere, if it failed). */
void fz_after_call(fc_context *ctx, const fz_call *c, int kind, fc_status sup, fc_status st, const char *what);
/* A context with the call's settings (each setting's status checked). */
fc_context *fz_make_context(const fz_call *c);
/* p, a pointer into c's arena, moved to the same offset in r. */
void *fz_rebase(const fz_call *c, const fz_arena *r, const void *p);
/* The forward of c's arguments on CPU_REFERENCE, in r: a fresh host copy of
 * `from` (c's arena or its snapshot). Returns its status (why: its message). */
#define FC_FUZZ_MSG 512
fc_status fz_reference_forward(const fz_call *c, const uint8_t *from, fz_arena *r, char *why, size_t why_len);
/* Element offset of row r (dense: batch * seqlen + position; varlen: the
 * token), head h, dim d of a [b, s, h, d] or [t, h, d] tensor. */
int64_t fz_elem_offset(const fc_tensor *t, int varlen, int64_t r, int64_t h, int64_t d);
/* Max |x| over a tensor's finite elements in the snapshot; *nonfinite (if
 * not NULL) set to 1 where one is not finite. */
double fz_max_abs(const fz_call *c, const fc_tensor *t, int *nonfinite);
/* |scale| as the call resolves it (0: 1/sqrt(head_dim)). */
double fz_abs_scale(const fz_call *c);
/* A bound on |scale * q.k| over the finite inputs of the snapshot. */
double fz_logit_bound(const fz_call *c);
/* 1 if the CUDA kernels' large-logit limit may be reached (docs/API.md). */
int fz_past_cuda_logit_limit(const fz_call *c, double bound);

/* ---- paged KV cache and seqused_k (paged.c, paged_check.c) ---------------- */
/* Decisions read after every older one (inputs made before paged calls
 * existed decode as they did): on a dense forward, sometimes k and v as
 * page pools with a block table and/or seqused_k, valid or corrupt; on a
 * varlen or backward call, the arrays it must refuse. Places the new
 * buffers past `size`; returns the arena size. */
int64_t fz_gen_paged(fz_in *in, fz_call *c, int ok[FB_N], int64_t size);
/* Cache rows no sequence uses get a NaN payload (after the inputs' fill). */
void fz_mark_unused_rows(fz_call *c, const int ok[FB_N]);
void fz_write_paged(fz_call *c);
void fz_paged_free(fz_call *c);
/* Keys sequence b reads (clamped to the cache) and the element offset of
 * its key j in t (k or v, paged or dense). */
int64_t fz_paged_keys(const fz_call *c, int b);
int64_t fz_paged_key_offset(const fz_call *c, const fc_tensor *t, int b, int64_t j);
/* Element idx of t set to a NaN payload nothing else holds. */
void fz_store_nan(const fc_tensor *t, int64_t idx);
/* Where the generator knows the status a corrupt call must get: the same
 * call with clean arrays (its twin, asked of `supported`) is accepted, so
 * st must be that status; refused, so st must not be FC_OK. */
typedef fc_status (*fz_twin_fn)(fc_context *ctx, const fz_call *c, const fc_attention_args *twin);
void fz_check_expected(fc_context *ctx, const fz_call *c, fc_status st, fz_twin_fn supported);
/* A paged or seqused_k forward that succeeded: the reference's answer in r
 * must equal, bit for bit, its answer on a dense copy of the used keys. */
void fz_paged_cross_check(const fz_call *c, const fz_arena *r);

/* ---- the backward (bwd_gen.c, bwd_check.c) -------------------------------------- */
/* As fz_fwd_build and fz_fwd_check, for fc_attention_backward. */
int fz_bwd_build(fz_in *in, fz_call *c);
void fz_bwd_check(fz_call *c);

#endif /* FC_FUZZ_CALL_H */
