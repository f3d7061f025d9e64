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
    int want_lse;
    float input_scale;           /* inputs are N(0,1)*input_scale; 0 means 1            */
} kit_shape;

/* A problem with its host buffers. args holds host pointers into them. */
typedef struct kit_case {
    kit_shape s;
    fc_attention_args args;
    void *q, *k, *v, *out;
    float *lse;
    size_t q_bytes, k_bytes, v_bytes, out_bytes, lse_bytes; /* allocation sizes */
    int32_t *cu_q, *cu_k;                                   /* varlen offsets, batch+1 */
    int64_t total_q, total_k;
} kit_case;

/* Allocate and fill a case (inputs N(0,1) from seed). Returns 0, or -1 on
 * allocation failure / bad shape (with nothing left allocated). */
int kit_case_init(kit_case *c, const kit_shape *s, uint64_t seed);
void kit_case_free(kit_case *c);
/* Fill out and lse with the poison pattern (a NaN payload no kernel produces). */
void kit_poison(void *out, size_t out_bytes, fc_dtype dtype, float *lse, size_t lse_bytes);
/* 1 if the element at byte buffer index holds the poison pattern. */
int kit_is_poison(const void *buf, fc_dtype dtype, int64_t idx);

/* Element access: any supported dtype to/from float. */
float kit_load(const void *buf, fc_dtype dtype, int64_t idx);
void kit_store(void *buf, fc_dtype dtype, int64_t idx, float v);
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

/* Compare out/lse (laid out as in c) with ref_out/ref_lse (same layout). */
void kit_compare(const kit_case *c, const void *out, const float *lse, const void *ref_out,
                 const float *ref_lse, const kit_gate *g, kit_metrics *m);
/* 1 if every gate holds (and nothing unwritten / non-finite). */
int kit_gate_pass(const kit_metrics *m, const kit_gate *g);

/* FLOPs by the docs/PERF.md convention: 4*B*Hq*Sq*Sk*D, halved for causal
 * with Sq == Sk (masks and varlen lengths are not counted). */
double kit_flops_nominal(const kit_shape *s);

/* Monotonic clock in seconds. */
double kit_now(void);
/* Deterministic random: splitmix64 stream, uniform and normal. */
uint64_t kit_rand_u64(uint64_t *state);
double kit_rand_uniform(uint64_t *state); /* [0,1) */
double kit_rand_normal(uint64_t *state);

/* Percentile (0..100) of n doubles (sorts a copy). */
double kit_percentile(const double *v, int n, double pct);

/* The tuning hooks (fc_tuning) from the environment, so that scripts steer
 * the CLI and the tests as docs/API.md says: FLASHCORE_SM90_CONFIG,
 * FLASHCORE_SM80_CONFIG, FLASHCORE_SM90_ROTATE, FLASHCORE_SM90_TAIL,
 * FLASHCORE_SM90_GRID, FLASHCORE_SPLITS, FLASHCORE_PDL (integers; unset or
 * empty: the default) and FLASHCORE_SM90_TRACE_FILE. The library itself
 * reads no environment. FC_OK, or the status of a value that is not an
 * integer or that fc_context_set_tuning rejects, with a message on stderr. */
fc_status kit_tuning_from_env(fc_context *ctx);

#ifdef __cplusplus
}
#endif
#endif /* FC_KIT_H */
