/*
 * kit.h -- the test and CLI kit: builds attention problems on the host with
 * random inputs, poisons outputs, compares against the reference with
 * per-dtype gates, counts FLOPs, reads a clock. Shared by tools/ (CLI) and
 * tests/ so both judge results the same way. Not part of the public API.
 */
#ifndef FC_KIT_H
#define FC_KIT_H

#include <stddef.h>
#include <stdint.h>

#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Memory layouts a case can be built in (all with the last dim contiguous). */
typedef enum kit_layout {
    KIT_LAYOUT_BSHD = 0,   /* [batch, seq, heads, dim] contiguous (the API's order)     */
    KIT_LAYOUT_BHSD = 1,   /* [batch, heads, seq, dim] contiguous (torch's order)       */
    KIT_LAYOUT_PADDED = 2  /* BSHD with padding between heads and rows (non-contiguous) */
} kit_layout;

/* seqused_k of a dense or paged case (kit_paged.c). */
typedef enum kit_seqused {
    KIT_SEQUSED_NONE = 0,  /* NULL: every sequence uses all its keys (paged: the whole capacity) */
    KIT_SEQUSED_FULL = 1,  /* seqlen_k for every sequence                                     */
    KIT_SEQUSED_RANDOM = 2, /* per sequence in [0, capacity]: 0, 1 and the capacity each 1/8,
                             * else uniform                                                    */
    KIT_SEQUSED_EMPTY = 3,  /* 0 for every sequence                                            */
    KIT_SEQUSED_FEW = 4     /* b % 4 for sequence b (at most the capacity): empty causal rows  */
} kit_seqused;

typedef struct kit_shape {
    const char *name;            /* may be NULL                                         */
    int batch, heads_q, heads_kv;
    int seqlen_q, seqlen_k;      /* varlen: the maximum lengths                         */
    int head_dim;
    fc_dtype dtype;
    int causal;
    int window_left, window_right; /* -1 = unbounded                                    */
    float softcap;               /* 0 = off                                             */
    float scale;                 /* 0 = default                                         */
    int varlen;                  /* 1: random lengths in [0, seqlen], some empty        */
    kit_layout layout;
    int odd_out;                 /* 1: out (and a backward case's dout) gets odd element
                                  * strides whatever `layout` says: rows only 2-byte
                                  * aligned (valid input; the 16-byte paths must cope) */
    int want_lse;
    float input_scale;           /* inputs are N(0,1)*input_scale; 0 means 1            */
    int page_size;               /* > 0: k and v are a paged cache of pages of this many
                                  * keys (kit_paged.c); 0: dense. Not with varlen.       */
    kit_seqused seqused;         /* seqused_k (dense or paged); not with varlen         */
    int append;                  /* > 0 (with seqused): keys each sequence appends
                                  * (k_new, v_new; kit_append.c): seqused_k leaves room
                                  * for them and kit_case_keys counts them                */
    int rotary_dim;              /* with append: > 0 rotates q and k_new (RoPE tables)  */
    int rotary_interleaved;      /* 1: GPT-J pairs (2i, 2i+1), 0: GPT-NeoX halves       */
    /* FP8 (dtype E4M3/E5M2: q, k and v in it; or fp8_kv with an f32/f16/bf16
     * dtype: an FP8 K/V cache under q). Inputs are N(0,1)*input_scale
     * rounded to the FP8 type; not with append. */
    int fp8_kv;                  /* 0, or FC_DTYPE_E4M3 / FC_DTYPE_E5M2: k and v's type */
    fc_dtype fp8_out;            /* FP8 q: out's dtype (f32, f16, bf16)                 */
    int descale;                 /* FP8: 0 none, 1 one value per tensor, 2 one per
                                  * (batch, kv head); each 2^u, u uniform in [-2, 2);
                                  * 3 as 2 with every fourth 0 and every fourth < 0    */
    int amax;                    /* FP8: 1 asks for out_amax and p_amax                 */
} kit_shape;

/* The dtypes of a case's k/v and out (kit_shape's FP8 fields). */
fc_dtype kit_kv_dtype(const kit_shape *s);
fc_dtype kit_out_dtype(const kit_shape *s);
/* Floats in each of a case's descale arrays: batch * heads_kv, or 1. */
int64_t kit_descale_count(const kit_shape *s);

/* A problem with its host buffers. args holds host pointers into them. */
typedef struct kit_case {
    kit_shape s;
    fc_attention_args args;
    void *q, *k, *v, *out;
    float *lse;
    size_t q_bytes, k_bytes, v_bytes, out_bytes, lse_bytes; /* allocation sizes */
    int32_t *cu_q, *cu_k;                                   /* varlen offsets, batch+1 */
    int64_t total_q, total_k;
    /* Paged cases: k and v are [num_pages, page_size, heads_kv, head_dim] in
     * the case's layout (BHSD: [num_pages, heads_kv, page_size, head_dim]
     * storage, the strided view), every page random, spare pages that no
     * sequence uses; block_table rows table_stride entries apart (the args
     * may say 0 for max_pages), pages in random order, and every entry a
     * sequence does not use (past its seqused_k, or row padding) out of
     * range: the library must never read it. */
    int32_t *block_table, *seqused_k;                       /* NULL when not used  */
    int32_t num_pages, max_pages;
    int64_t table_stride;
    size_t table_bytes, used_bytes;                         /* allocation sizes    */
    /* s.append > 0: k_new, v_new [batch, append, heads_kv, head_dim] and,
     * with s.rotary_dim, the RoPE tables [seqlen_ro, rotary_dim / 2] over
     * every position the call reaches, contiguous, N(0,1) / base 10000;
     * args points at them. */
    void *k_new, *v_new, *rot_cos, *rot_sin;               /* NULL when not used  */
    size_t new_bytes, rot_bytes;
    int64_t seqlen_ro;
    /* FP8: the q, k, v descales ([batch, heads_kv] contiguous; NULL when
     * not used) and the amax outputs ([2]: out, p), args points at them. */
    float *descale[3], *amax;
} kit_case;

/* A contiguous [n0, n1, n2, n3] tensor at data; trailing sizes of 0 drop
 * their dimensions (n3 = 0: 3-D [n0, n1, n2]; n2 = n3 = 0: 2-D). */
fc_tensor kit_contiguous(void *data, fc_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3);
/* s with the append step: n new keys per sequence, rotary over the head
 * dim (its even part), seqused_k = the cache's length less n unless s has
 * its own counts. */
void kit_shape_append(kit_shape *s, int n, int interleaved);
/* The append step's inputs of c (kit_append.c); 0, or -1 on no memory. */
int kit_append_setup(kit_case *c, uint64_t seed);

/* Allocate and fill a case (inputs N(0,1) from seed, never 0). Returns 0, or
 * -1 on allocation failure / bad shape (with nothing left allocated). */
int kit_case_init(kit_case *c, const kit_shape *s, uint64_t seed);
void kit_case_free(kit_case *c);
/* Fill out and lse with the poison pattern (a NaN payload no kernel produces). */
void kit_poison(void *out, size_t out_bytes, fc_dtype dtype, float *lse, size_t lse_bytes);
/* 1 if the element at byte buffer index holds the poison pattern. */
int kit_is_poison(const void *buf, fc_dtype dtype, int64_t idx);

/* Element access: any supported dtype to/from float. */
float kit_load(const void *buf, fc_dtype dtype, int64_t idx);
void kit_store(void *buf, fc_dtype dtype, int64_t idx, float v);
/* f to an FP8 type (E4M3/E5M2), round to nearest even (e5m2 through f16:
 * rounded twice, fine for drawing inputs), saturating at the largest finite
 * value (NaN stays NaN); and back, exactly. */
uint8_t kit_f32_to_fp8(float f, fc_dtype dtype);
float kit_fp8_to_f32(uint8_t x, fc_dtype dtype);
uint16_t kit_f32_to_f16(float f);
float kit_f16_to_f32(uint16_t h);
uint16_t kit_f32_to_bf16(float f);
float kit_bf16_to_f32(uint16_t h);
size_t kit_dtype_size(fc_dtype dtype);
const char *kit_dtype_name(fc_dtype dtype);
const char *kit_layout_name(kit_layout layout); /* "bshd", "bhsd", "padded" */
int kit_dtype_parse(const char *s, fc_dtype *out); /* "f32","fp16","f16","bf16"; 0 ok */

/* Result of comparing an output (and lse) to the reference over the logical
 * elements of the case (padding is not compared). */
typedef struct kit_metrics {
    int64_t n;             /* elements compared                              */
    double max_abs;        /* max |out - ref|                                */
    double rel_l2;         /* ||out - ref|| / ||ref||                         */
    double pct_bad;        /* % elements with |d| > atol + rtol*|ref|          */
    int64_t unwritten;     /* elements still holding the poison               */
    int64_t nonfinite;     /* NaN/Inf where the reference is finite           */
    double lse_max_abs;    /* max |lse - ref_lse| over finite refs (0 if none) */
    int64_t lse_bad;       /* lse elements out of tolerance (incl. unwritten) */
} kit_metrics;

/* Per-dtype gates; these are the project's error bounds. Never loosen one to
 * make a test pass: a failing gate is a bug to find. */
typedef struct kit_gate {
    double max_abs, rel_l2, pct_bad; /* limits on the metrics                 */
    double atol, rtol;               /* per-element tolerance for pct_bad     */
    double lse_atol, lse_rtol;       /* per-element tolerance for lse         */
} kit_gate;
kit_gate kit_gate_for(fc_dtype dtype);

/* Keys a sequence's cache holds: the pages' capacity (max_pages *
 * page_size), or seqlen_k. */
int64_t kit_case_capacity(const kit_case *c);
/* Keys sequence b of c uses: its cu_seqlens_k length, seqused_k[b] (plus
 * the keys it appends), the paged capacity (max_pages * page_size) or
 * seqlen_k. */
int64_t kit_case_keys(const kit_case *c, int b);
/* Element offset of key j of sequence b in k, and in v (the kit gives both
 * the same strides): dense, varlen or through the block table. */
int64_t kit_key_offset(const kit_case *c, int b, int64_t j);
/* Rows of c with no visible key (by the masking rule as flashcore.h states
 * it, each sequence with its kit_case_keys) must hold exactly 0 in out and
 * -inf in lse (when given). Counts such rows (times heads) into *empty;
 * returns the number of elements that break the rule. */
int64_t kit_empty_rows(const kit_case *c, const void *out, const float *lse, int64_t *empty);
/* Elements of out (poisoned before the call) outside its logical ones
 * (padding) that were written; -1 when out of memory. */
int64_t kit_stray_writes(const kit_case *c, const void *out);
/* The reference checked against itself on a paged or seqused_k case c:
 * each sequence's used keys gathered into a dense [batch, max_used, heads,
 * dim] twin (same q, the same seqused_k), whose fp64 reference must equal
 * ref_out/ref_lse (c's reference, poisoned first) bit for bit: the same
 * sums in the same order. 1 equal, 0 not, -1 error; why says what. */
int kit_paged_reference_check(fc_context *ctx, const kit_case *c, const void *ref_out, const float *ref_lse,
                              char *why, size_t why_len);

/* Compare out/lse (laid out as in c) with ref_out/ref_lse (same layout). */
void kit_compare(const kit_case *c, const void *out, const float *lse, const void *ref_out,
                 const float *ref_lse, const kit_gate *g, kit_metrics *m);
/* 1 if every gate holds (and nothing unwritten / non-finite). */
int kit_gate_pass(const kit_metrics *m, const kit_gate *g);

/* ---- backward cases (tools/kit_bwd.c) -------------------------------------------- */

/* A backward problem: a forward case c (lse always requested) plus dout
 * (laid out like out, N(0,1) from the seed) and the gradients dq, dk, dv,
 * each with the layout, strides and allocation size of q, k, v (BSHD, BHSD,
 * padded, varlen). args.fwd is c.args; args.dout/dq/dk/dv point at the
 * buffers; deterministic 0, no workspace. The forward's out and lse are not
 * computed by init: run kit_bwd_forward (or fill them some other way). */
typedef struct kit_bwd_case {
    kit_case c;
    fc_attention_backward_args args;
    void *dout, *dq, *dk, *dv;
    size_t dout_bytes, dq_bytes, dk_bytes, dv_bytes; /* = out, q, k, v bytes */
} kit_bwd_case;

/* Allocate and fill (inputs and dout random, dq/dk/dv poisoned). 0, or -1
 * on allocation failure / bad shape (nothing left allocated). */
int kit_bwd_case_init(kit_bwd_case *b, const kit_shape *s, uint64_t seed);
void kit_bwd_case_free(kit_bwd_case *b);
/* Varlen cases only (else nothing): query sequence 1 and key sequence 2
 * made empty (their tokens go to a neighbour) and one token of each side
 * left past the last offset (not written by a backward); max_seqlen_q/k
 * follow. Call before kit_bwd_forward. */
void kit_bwd_varlen_edges(kit_bwd_case *b);
/* The forward on the case's host buffers with this backend (out and lse
 * poisoned first): what the backward reads as out and lse. */
fc_status kit_bwd_forward(fc_context *ctx, kit_bwd_case *b, fc_backend backend);
/* Fill dq, dk and dv with the poison pattern. */
void kit_bwd_poison(kit_bwd_case *b);
/* The fp64 reference backward of b's inputs into ref[0..2] (dq, dk, dv;
 * buffers of dq_bytes/dk_bytes/dv_bytes in b's layouts), poisoned first.
 * b's own buffers are not touched. */
fc_status kit_bwd_reference(fc_context *ctx, const kit_bwd_case *b, void *const ref[3]);

/* Errors of one gradient against the reference, over its logical elements.
 * Relative figures are taken against ref_max, the largest |reference|
 * element of that gradient (gradients have no natural unit). */
typedef struct kit_bwd_metrics {
    int64_t n;          /* logical elements compared                          */
    double max_abs;     /* max |g - ref|                                      */
    double ref_max;     /* max |ref|                                          */
    double max_rel;     /* max_abs / ref_max (max_abs when ref_max is 0)      */
    double rel_l2;      /* ||g - ref|| / ||ref||                              */
    double pct_bad;     /* % elements over atol + atol_rel*ref_max + rtol*|ref| */
    int64_t unwritten;  /* logical elements still holding the poison          */
    int64_t nonfinite;  /* NaN/Inf where the reference is finite              */
    int64_t stray;      /* elements outside the logical ones (padding, varlen
                         * tokens past the last offset) that were written     */
} kit_bwd_metrics;

/* The backward's gates: the project's error bounds for gradients (the
 * table and how each row was derived: kit_bwd.c). Never loosened to pass. */
typedef struct kit_bwd_gate {
    double max_rel, rel_l2, pct_bad; /* limits on the metrics                     */
    double atol, atol_rel, rtol;     /* per-element tolerance for pct_bad          */
} kit_bwd_gate;
/* Which implementation is judged: the CPU paths accumulate in fp32 and
 * round once; the CUDA kernels also round P and dS to the dtype. */
typedef enum kit_bwd_path { KIT_BWD_CPU = 0, KIT_BWD_CUDA = 1 } kit_bwd_path;
kit_bwd_gate kit_bwd_gate_for(fc_dtype dtype, kit_bwd_path path);

/* Compare got[i] with ref[i] (i = 0 dq, 1 dk, 2 dv; buffers laid out as in
 * b, poisoned before the runs) into m[i]. */
void kit_bwd_compare(const kit_bwd_case *b, const void *const got[3], const void *const ref[3],
                     const kit_bwd_gate *g, kit_bwd_metrics m[3]);
/* 1 if all three gradients pass every gate (nothing unwritten, non-finite
 * or stray). */
int kit_bwd_gate_pass(const kit_bwd_metrics m[3], const kit_bwd_gate *g);
/* "dq max_rel .. rel_l2 .. bad ..% [unwritten/nonfinite/stray] | dk .. | dv .." */
void kit_bwd_describe(const kit_bwd_metrics m[3], char *buf, size_t len);
const char *kit_grad_name(int i); /* "dq", "dk", "dv" */

/* FLOPs by the docs/PERF.md convention: 4*B*Hq*Sq*Sk*D, halved for causal
 * with Sq == Sk (masks and varlen lengths are not counted). */
double kit_flops_nominal(const kit_shape *s);
/* The backward's FLOPs by the same convention: 2.5x the forward's, its five
 * matrix products (S recomputed, dV, dP, dQ, dK) against the forward's two. */
double kit_flops_backward(const kit_shape *s);

/* Monotonic clock in seconds. */
double kit_now(void);
/* Deterministic random: splitmix64 stream, uniform and normal. */
uint64_t kit_rand_u64(uint64_t *state);
double kit_rand_uniform(uint64_t *state); /* [0,1) */
double kit_rand_normal(uint64_t *state);

/* Percentile (0..100) of n doubles (sorts a copy). */
double kit_percentile(const double *v, int n, double pct);

/* What the environment says about a new context, for the CLI and the
 * tests: a FLASHCORE_TUNING_CACHE file the library could not load is an
 * error here (a script that names one means it: forcing rows for a test
 * matrix, docs/TUNING.md), and FLASHCORE_SM90_TRACE_FILE sets the trace
 * hook of trace builds. FC_OK, or the failing status with a message on
 * stderr. */
fc_status kit_tuning_from_env(fc_context *ctx);

/* The tuner's verdict over candidates timed in interleaved rounds
 * (kit_tune.c). Candidates 0 and 1 are both the planner's choice (two
 * graphs of it: their difference is the noise of the measurement); the
 * rest are alternatives. */
typedef struct kit_tune_verdict {
    int best;          /* the fastest alternative (>= 2), or 0 if none is
                        * faster than the planner                              */
    double best_gain;  /* planner_us / its median                              */
    int winner;        /* best when recorded, else 0 (the planner)             */
    double planner_us; /* mean of candidates 0 and 1's medians                */
    double winner_us;
    double gain;       /* planner_us / winner_us (1 when not recorded)         */
    double noise;      /* |m0 - m1| / planner_us                               */
    int recorded;      /* 1: the winner beats the planner by more than
                        * max(min_gain, 2 * noise) (relative)                  */
} kit_tune_verdict;
/* medians[c]: candidate c's median time per call. Ties keep the lower
 * index, so the planner wins every tie and equal alternatives resolve the
 * same way in every process. */
void kit_tune_decide(const double *medians, int n, double min_gain, kit_tune_verdict *v);

#ifdef __cplusplus
}
#endif
#endif /* FC_KIT_H */
