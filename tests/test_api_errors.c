/*
 * test_api_errors.c -- the table of bad inputs. Each row starts from a valid
 * small CPU problem, breaks exactly one thing, and checks that
 *   - fc_attention_forward returns the expected status on every CPU-side
 *     backend request (CPU, AUTO, CPU_REFERENCE),
 *   - fc_last_error names the argument (an expected substring),
 *   - fc_attention_supported answers the same status and the same message
 *     (one selection function for both),
 *   - nothing was written: out and lse still hold their poison, and the
 *     inputs are unchanged (byte-compared with copies taken before the call).
 * The rows include the paged KV cache and seqused_k (entries and counts out
 * of range, the scalars, misaligned or overlapping arrays, either with
 * cu_seqlens), whose arrays are in the snapshot too. Then valid cu_seqlens
 * placed inside out and lse (rejected) and right next to out in one buffer
 * (accepted and correct), the context setters, NULL
 * context/args, the CUDA request without a usable GPU, and pure supported()
 * probes with dummy pointers (offsets that overflow int64; and offsets
 * beyond 2^31 that must be accepted).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"

#include "test_util.h"

/* Room for a copy of a last-error message (the library keeps up to 512 bytes). */
#define FC_MSG_COPY 1024

/* ---- the base problems -------------------------------------------------------- */

enum {
    F_F32 = 1 << 0,    /* base case in f32 (default f16)                                  */
    F_VARLEN = 1 << 1, /* base case is varlen (3 sequences)                               */
    F_KEEPB = 1 << 2,  /* the row sets args.backend itself: do not loop over backends     */
    F_D600 = 1 << 3,   /* base case with head_dim 600                                     */
    F_PAGED = 1 << 4,  /* base case with a paged k/v cache (page 3) and seqused_k         */
    F_USED = 1 << 5,   /* base case with dense k/v and seqused_k                          */
    F_APPEND = 1 << 6, /* with F_USED or F_PAGED: 2 keys appended (k_new, v_new), rotary on
                        * half the head dim                                               */
};

/* The appended keys and rotary tables of F_APPEND cases: [2, 2, 2, 16]
 * and [16, 4], zeros (valid values; the rows break shapes and pointers). */
static float g_new[2][2 * 2 * 2 * 16], g_rot[2][16 * 4];

static void attach_append(fc_attention_args *a)
{
    a->k_new = kit_contiguous(g_new[0], a->q.dtype, 2, 2, 2, 16);
    a->v_new = kit_contiguous(g_new[1], a->q.dtype, 2, 2, 2, 16);
    a->rotary_cos = kit_contiguous(g_rot[0], a->q.dtype, 16, 4, 0, 0);
    a->rotary_sin = kit_contiguous(g_rot[1], a->q.dtype, 16, 4, 0, 0);
}

static kit_shape base_shape(int flags)
{
    const fc_dtype dt = flags & F_F32 ? FC_DTYPE_F32 : FC_DTYPE_F16;
    kit_shape s = test_shape(flags & F_VARLEN ? 3 : 2, 4, 2, 5, 7, 16, dt);
    s.name = "base";
    s.varlen = flags & F_VARLEN ? 1 : 0;
    /* every sequence uses seqlen_k 7 of its 3 pages of 3: each row's
     * entries are all used, so each is checked */
    s.page_size = flags & F_PAGED ? 3 : 0;
    s.seqused = flags & (F_PAGED | F_USED) ? KIT_SEQUSED_FULL : KIT_SEQUSED_NONE;
    s.append = flags & F_APPEND ? 2 : 0; /* the kit leaves room: seqused_k 5, the call sees 7 keys */
    if (flags & F_D600) {
        s.batch = 1; s.heads_q = 1; s.heads_kv = 1; s.seqlen_q = 2; s.seqlen_k = 3; s.head_dim = 600;
    }
    return s;
}

/* ---- the rows: each mutation breaks one thing of a valid case ------------------------ */

typedef void (*mutate_fn)(kit_case *c, fc_attention_args *a);
#define MUT(fn, body)                                          \
    static void fn(kit_case *c, fc_attention_args *a)          \
    {                                                          \
        (void)c;                                               \
        (void)a;                                               \
        body                                                   \
    }

static float f_nan(void) { return nanf(""); }

/* null pointers */
MUT(m_q_null, a->q.data = NULL;)
MUT(m_k_null, a->k.data = NULL;)
MUT(m_v_null, a->v.data = NULL;)
MUT(m_out_null, a->out.data = NULL;)
/* dtypes */
MUT(m_k_dtype, a->k.dtype = FC_DTYPE_F32;)
MUT(m_k_dtype_f16, a->k.dtype = FC_DTYPE_F16;)
MUT(m_v_dtype, a->v.dtype = FC_DTYPE_BF16;)
MUT(m_out_dtype, a->out.dtype = FC_DTYPE_BF16;)
MUT(m_lse_dtype, a->lse.dtype = FC_DTYPE_F16;)
MUT(m_q_dtype_99, a->q.dtype = (fc_dtype)99;)
MUT(m_k_dtype_99, a->k.dtype = (fc_dtype)99;)
MUT(m_lse_dtype_99, a->lse.dtype = (fc_dtype)99;)
MUT(m_q_dtype_neg, a->q.dtype = (fc_dtype)-1;)
/* FP8: the dtype combinations, descales and amax outputs (fc_attention_args) */
static void fp8_all(fc_attention_args *a, fc_dtype dt) { a->q.dtype = a->k.dtype = a->v.dtype = dt; }
MUT(m_fp8_out_e4m3, fp8_all(a, FC_DTYPE_E4M3); a->out.dtype = FC_DTYPE_E4M3;)
MUT(m_fp8_out_f64, fp8_all(a, FC_DTYPE_E5M2); a->out.dtype = FC_DTYPE_F64;)
MUT(m_fp8_mixed, fp8_all(a, FC_DTYPE_E4M3); a->v.dtype = FC_DTYPE_E5M2;)
MUT(m_fp8_q_other, fp8_all(a, FC_DTYPE_E5M2); a->q.dtype = FC_DTYPE_E4M3;)
MUT(m_fp8_kv_out, a->k.dtype = a->v.dtype = FC_DTYPE_E4M3; a->out.dtype = FC_DTYPE_BF16;)
MUT(m_fp8_kv_q64, a->k.dtype = a->v.dtype = FC_DTYPE_E4M3; a->q.dtype = a->out.dtype = FC_DTYPE_F64;)
static const float k_one = 1.0f;
static const float k_one_pair[2] = {1.0f, 1.0f};
static float g_amax[2];
MUT(m_q_descale, a->q_descale.data = &k_one;)
MUT(m_k_descale, a->k_descale.data = &k_one;)
MUT(m_v_descale, a->v_descale.data = &k_one;)
MUT(m_descale_kv_only, a->k.dtype = a->v.dtype = FC_DTYPE_E4M3; a->q_descale.data = &k_one;)
MUT(m_descale_stride, fp8_all(a, FC_DTYPE_E4M3); a->k_descale.data = &k_one; a->k_descale.head_stride = -1;)
MUT(m_descale_huge, fp8_all(a, FC_DTYPE_E4M3); a->v_descale.data = &k_one; a->v_descale.batch_stride = INT64_MAX / 2;)
MUT(m_amax_f16, a->out_amax = &g_amax[0];)
MUT(m_amax_misaligned, fp8_all(a, FC_DTYPE_E4M3); a->p_amax = (float *)(void *)((char *)&g_amax[0] + 2);)
MUT(m_amax_same, fp8_all(a, FC_DTYPE_E4M3); a->p_amax = a->out_amax = &g_amax[1];)
MUT(m_amax_in_out, fp8_all(a, FC_DTYPE_E4M3); a->out_amax = (float *)c->out + 1;)
MUT(m_amax_on_q, fp8_all(a, FC_DTYPE_E4M3); a->p_amax = (float *)c->q;)
/* ndim */
MUT(m_q_ndim3, a->q.ndim = 3;)
MUT(m_k_ndim5, a->k.ndim = 5;)
MUT(m_v_ndim0, a->v.ndim = 0;)
MUT(m_out_ndim_neg, a->out.ndim = -4;)
MUT(m_lse_ndim2, a->lse.ndim = 2;)
MUT(m_varlen_q_ndim4, a->q.ndim = 4;)
MUT(m_varlen_lse_ndim3, a->lse.ndim = 3;)
/* strides */
MUT(m_q_last_stride2, a->q.stride[3] = 2;)
MUT(m_k_last_stride0, a->k.stride[3] = 0;)
MUT(m_out_last_stride, a->out.stride[3] = 16;)
MUT(m_lse_last_stride, a->lse.stride[2] = 2;)
MUT(m_varlen_v_last_stride, a->v.stride[2] = 3;)
MUT(m_k_neg_stride, a->k.stride[1] = -a->k.stride[1];)
MUT(m_q_neg_stride, a->q.stride[0] = -1;)
MUT(m_out_neg_stride, a->out.stride[2] = -16;)
MUT(m_out_head_overlap, a->out.stride[2] = 8;) /* head stride 8 < head_dim 16 */
MUT(m_out_row_zero, a->out.stride[1] = 0;)     /* every row on the same memory */
MUT(m_out_batch_overlap, a->out.stride[0] = a->out.stride[1];)
MUT(m_lse_overlap, a->lse.stride[1] = 1;)      /* heads and rows interleave */
MUT(m_varlen_out_overlap, a->out.stride[0] = 16;) /* token stride covers one head only */
/* outputs aliasing inputs or each other */
MUT(m_out_is_q, a->out.data = c->q;)
/* (k moves into out's buffer rather than out into k's: out's extent is the
 * larger, so a library without the check could not run off an allocation) */
MUT(m_out_is_k, a->k.data = c->out;)
MUT(m_lse_is_v, a->lse.data = c->v;)
MUT(m_lse_in_out, a->lse.data = (char *)c->out + 64;)
/* sizes: zero and negative in every dim */
MUT(m_q_batch0, a->q.shape[0] = 0;)
MUT(m_q_seq0, a->q.shape[1] = 0;)
MUT(m_q_heads0, a->q.shape[2] = 0;)
MUT(m_q_dim0, a->q.shape[3] = 0;)
MUT(m_k_batch0, a->k.shape[0] = 0;)
MUT(m_k_seq0, a->k.shape[1] = 0;)
MUT(m_k_heads0, a->k.shape[2] = 0;)
MUT(m_v_dim0, a->v.shape[3] = 0;)
MUT(m_out_seq0, a->out.shape[1] = 0;)
MUT(m_lse_heads0, a->lse.shape[1] = 0;)
MUT(m_q_batch_neg, a->q.shape[0] = -1;)
MUT(m_q_seq_neg, a->q.shape[1] = -5;)
MUT(m_q_heads_neg, a->q.shape[2] = -4;)
MUT(m_q_dim_neg, a->q.shape[3] = -16;)
MUT(m_k_seq_neg, a->k.shape[1] = -7;)
MUT(m_varlen_q_total_neg, a->q.shape[0] = -1;)
MUT(m_varlen_k_heads0, a->k.shape[1] = 0;)
MUT(m_varlen_q_dim0, a->q.shape[2] = 0;)
MUT(m_varlen_lse_heads0, a->lse.shape[0] = 0;)
/* shape relations */
MUT(m_gqa_3_2, a->q.shape[2] = 3; a->out.shape[2] = 3; a->lse.shape[1] = 3;)
MUT(m_gqa_4_3, a->k.shape[2] = 3; a->v.shape[2] = 3;)
MUT(m_kv_seq_mismatch, a->v.shape[1] = 6;)
MUT(m_kv_heads_mismatch, a->v.shape[2] = 1;)
MUT(m_kv_dim_mismatch, a->v.shape[3] = 8;)
MUT(m_qk_dim_mismatch, a->k.shape[3] = 8; a->v.shape[3] = 8;)
MUT(m_qk_batch_mismatch, a->k.shape[0] = 1; a->v.shape[0] = 1;)
MUT(m_out_shape, a->out.shape[1] = 4;)
MUT(m_out_heads, a->out.shape[2] = 2;)
MUT(m_lse_shape_seq, a->lse.shape[2] = 4;)
MUT(m_lse_shape_batch, a->lse.shape[0] = 1;)
MUT(m_varlen_lse_shape, a->lse.shape[1] = a->lse.shape[1] - 1;)
MUT(m_varlen_out_tokens, a->out.shape[0] = a->out.shape[0] - 1;)
/* limits */
MUT(m_q_seq_huge, a->q.shape[1] = (int64_t)INT32_MAX + 1;)
MUT(m_k_heads_huge, a->k.shape[2] = (int64_t)1 << 40; a->v.shape[2] = (int64_t)1 << 40;)
MUT(m_k_offset_overflow, a->k.shape[1] = 4; a->v.shape[1] = 4; a->k.stride[1] = (int64_t)1 << 62;)
MUT(m_out_offset_overflow, a->out.stride[0] = INT64_MAX / 2 + 1;)
/* 2^61 elements fit int64, but 2^63 bytes of f32 do not */
MUT(m_lse_byte_overflow, a->lse.stride[0] = (int64_t)1 << 61;)
/* options */
MUT(m_window_left_m2, a->window_left = -2;)
MUT(m_window_right_m5, a->window_right = -5;)
MUT(m_window_left_min, a->window_left = INT32_MIN;)
MUT(m_causal_2, a->causal = 2;)
MUT(m_causal_neg, a->causal = -1;)
MUT(m_causal_wr, a->causal = 1; a->window_right = 3;)
MUT(m_softcap_neg, a->softcap = -1.0f;)
MUT(m_softcap_nan, a->softcap = f_nan();)
MUT(m_softcap_inf, a->softcap = INFINITY;)
MUT(m_scale_nan, a->scale = f_nan();)
MUT(m_scale_inf, a->scale = INFINITY;)
MUT(m_scale_ninf, a->scale = -INFINITY;)
/* finite options past the ranges that keep fp32 finite (constants.h) */
MUT(m_scale_2e38, a->scale = 2e38f;)
MUT(m_scale_n3e38, a->scale = -3e38f;)
MUT(m_scale_past_max, a->scale = nextafterf(1e25f, INFINITY);)
MUT(m_scale_1e30, a->scale = 1e30f;)
MUT(m_scale_tiny, a->scale = nextafterf(1e-25f, 0.0f);)
MUT(m_scale_denormal, a->scale = -1e-40f;)
MUT(m_softcap_3e38, a->softcap = 3e38f;)
MUT(m_softcap_past_max, a->softcap = nextafterf(1e3f, INFINITY);)
MUT(m_softcap_1e_40, a->softcap = 1e-40f;)
MUT(m_softcap_tiny, a->softcap = nextafterf(1e-13f, 0.0f);)
/* misaligned pointers: one byte past an element boundary (rejected before
 * anything is read, so the extent past the buffer is never touched) */
MUT(m_q_misaligned, a->q.data = (char *)c->q + 1;)
MUT(m_k_misaligned, a->k.data = (char *)c->k + 2;)
MUT(m_out_misaligned, a->out.data = (char *)c->out + 1;)
MUT(m_lse_misaligned, a->lse.data = (char *)c->lse + 2;)
MUT(m_cu_q_misaligned, a->cu_seqlens_q = (const int32_t *)(const void *)((char *)c->cu_q + 2);)
MUT(m_cu_k_misaligned, a->cu_seqlens_k = (const int32_t *)(const void *)((char *)c->cu_k + 1);)
MUT(m_q_descale_misaligned, fp8_all(a, FC_DTYPE_E4M3);
    a->q_descale.data = (const float *)(const void *)((const char *)&k_one_pair[0] + 1);)
/* an output over an array the call reads (cu_seqlens, descales) */
MUT(m_cu_q_in_out, a->cu_seqlens_q = (const int32_t *)c->out + 8;)
MUT(m_cu_k_in_lse, a->cu_seqlens_k = (const int32_t *)c->lse;)
MUT(m_q_descale_in_out, fp8_all(a, FC_DTYPE_E5M2); a->q_descale.data = (const float *)c->out;)
MUT(m_v_descale_in_lse, fp8_all(a, FC_DTYPE_E4M3); a->v_descale.data = c->lse + 3;)
/* varlen */
static const int32_t k_cu_dummy[4] = {0, 1, 2, 3};
MUT(m_dense_with_cu_q, a->cu_seqlens_q = k_cu_dummy;)
MUT(m_varlen_no_cu_k, a->cu_seqlens_k = NULL;)
MUT(m_varlen_no_cu_q, a->cu_seqlens_q = NULL;)
MUT(m_cu_q_start1, c->cu_q[0] = 1;)
MUT(m_cu_k_start_neg, c->cu_k[0] = -1;)
MUT(m_cu_q_decreasing, c->cu_q[2] = c->cu_q[1] - 1;)
MUT(m_cu_k_decreasing, c->cu_k[3] = c->cu_k[2] - 1;)
MUT(m_max_seqlen_q_short, a->max_seqlen_q = a->max_seqlen_q - 1;)
MUT(m_max_seqlen_k_short, a->max_seqlen_k = a->max_seqlen_k - 1;)
/* max_seqlen_q 0 while sequences have tokens: must not pass as "nothing to do" */
MUT(m_max_seqlen_q_zero, a->max_seqlen_q = 0;)
MUT(m_max_seqlen_neg, a->max_seqlen_k = -1;)
MUT(m_cu_q_beyond, a->q.shape[0] -= 1; a->out.shape[0] -= 1; a->lse.shape[1] -= 1;)
MUT(m_cu_k_beyond, a->k.shape[0] -= 1; a->v.shape[0] -= 1;)
MUT(m_num_seqs0, a->num_seqs = 0;)
MUT(m_num_seqs_neg, a->num_seqs = -3;)
/* paged KV cache and seqused_k: table entries and counts, the scalars,
 * pointers, and the combinations no backend takes */
MUT(m_table_neg, c->block_table[0] = -1;)
MUT(m_table_past, c->block_table[c->table_stride + 2] = c->num_pages;)
MUT(m_used_neg, c->seqused_k[1] = -1;)
MUT(m_used_past_pages, c->seqused_k[0] = c->max_pages * c->s.page_size + 1;)
MUT(m_used_past_keys, c->seqused_k[1] = (int32_t)c->s.seqlen_k + 1;)
MUT(m_max_pages0, a->max_pages_per_seq = 0;)
MUT(m_max_pages_neg, a->max_pages_per_seq = -2;)
MUT(m_table_stride_short, a->block_table_stride = a->max_pages_per_seq - 1;)
MUT(m_table_stride_neg, a->block_table_stride = -1;)
MUT(m_table_stride_huge, a->block_table_stride = (int64_t)INT32_MAX + 1;)
MUT(m_pages_keys_huge, a->max_pages_per_seq = INT32_MAX / (int32_t)c->s.page_size + 1; a->block_table_stride = 0;)
MUT(m_table_misaligned, a->block_table = (const int32_t *)(const void *)((char *)c->block_table + 2);)
MUT(m_used_misaligned, a->seqused_k = (const int32_t *)(const void *)((char *)c->seqused_k + 1);)
/* the arrays inside an output: refused on the overlap, before their
 * contents (the poison run_row puts there) are read */
MUT(m_table_in_out, a->block_table = (const int32_t *)c->out;)
MUT(m_used_in_lse, a->seqused_k = (const int32_t *)c->lse;)
static const int32_t k_table_dummy[4] = {0, 1, 2, 0};
MUT(m_varlen_table, a->block_table = k_table_dummy; a->max_pages_per_seq = 1;)
/* the append step: k_new / v_new and the rotary tables */
MUT(m_new_no_used, a->seqused_k = NULL;)
MUT(m_new_v_null, a->v_new.data = NULL;)
MUT(m_new_dtype, a->k_new.dtype = FC_DTYPE_BF16;)
MUT(m_new_heads, a->k_new.shape[2] = 1; a->v_new.shape[2] = 1;)
MUT(m_new_last_stride, a->v_new.stride[3] = 2;)
MUT(m_new_is_k, a->k_new.data = c->k;)
MUT(m_new_past_cache, c->seqused_k[1] += 1;)
MUT(m_new_past_pages, c->seqused_k[1] += 3;) /* 3 pages of 3 hold 9 */
MUT(m_v_is_k, a->v.data = a->k.data;)
MUT(m_new_longer_than_cache, a->k_new.shape[1] = a->v_new.shape[1] = 8;) /* seqlen_k is 7 */
MUT(m_v_next_to_k, a->v.data = (char *)a->k.data + kit_dtype_size(a->k.dtype);) /* one element on */
MUT(m_rot_only, a->k_new.data = NULL; a->v_new.data = NULL;)
MUT(m_rot_sin_null, a->rotary_sin.data = NULL;)
MUT(m_rot_too_wide, a->rotary_cos.shape[1] = a->rotary_sin.shape[1] = 9;)
MUT(m_rot_too_short, a->rotary_cos.shape[0] = a->rotary_sin.shape[0] = 6;)
MUT(m_rot_interleaved, a->rotary_interleaved = 2;)
MUT(m_rot_varlen, attach_append(a);)
MUT(m_varlen_used, a->seqused_k = k_table_dummy;)
/* backend */
MUT(m_backend_7, a->backend = (fc_backend)7;)
MUT(m_backend_neg, a->backend = (fc_backend)-1;)
/* nothing broken: used with F_D600 (valid, but beyond the CPU limit) */
MUT(m_none, ;)

typedef struct row {
    const char *name;
    mutate_fn mutate;
    int flags;
    fc_status want;
    const char *substr; /* must appear in fc_last_error */
} row;

#define INV FC_ERR_INVALID_ARGUMENT
#define UNS FC_ERR_UNSUPPORTED

static const row k_rows[] = {
    {"q.data NULL", m_q_null, 0, INV, "q.data"},
    {"k.data NULL", m_k_null, 0, INV, "k.data"},
    {"v.data NULL", m_v_null, F_F32, INV, "v.data"},
    {"out.data NULL", m_out_null, 0, INV, "out.data"},
    {"varlen q.data NULL", m_q_null, F_VARLEN, INV, "q.data"},
    {"k dtype f32 vs q f16", m_k_dtype, 0, INV, "k f32"},
    {"k dtype f16 vs q f32", m_k_dtype_f16, F_F32, INV, "k f16"},
    {"v dtype bf16", m_v_dtype, 0, INV, "v bf16"},
    {"out dtype bf16", m_out_dtype, F_F32, INV, "out bf16"},
    {"lse dtype f16", m_lse_dtype, 0, INV, "lse.dtype"},
    {"q dtype 99", m_q_dtype_99, 0, INV, "q.dtype 99"},
    {"k dtype 99", m_k_dtype_99, 0, INV, "k.dtype 99 is not a valid"},
    {"lse dtype 99", m_lse_dtype_99, 0, INV, "lse.dtype"},
    {"q dtype -1", m_q_dtype_neg, 0, INV, "q.dtype -1"},
    {"fp8 out e4m3", m_fp8_out_e4m3, 0, INV, "out.dtype is e4m3"},
    {"fp8 out f64", m_fp8_out_f64, F_F32, INV, "out.dtype is f64"},
    {"fp8 k e4m3, v e5m2", m_fp8_mixed, 0, INV, "one FP8 type"},
    {"fp8 q e4m3, k/v e5m2", m_fp8_q_other, 0, INV, "one FP8 type"},
    {"fp8 k/v, out differs from q", m_fp8_kv_out, 0, INV, "q and out must be one"},
    {"fp8 k/v under f64 q", m_fp8_kv_q64, F_F32, INV, "out.dtype is f64"},
    {"q_descale on f16 q", m_q_descale, 0, INV, "q_descale is set but q is f16"},
    {"k_descale on f16 k", m_k_descale, 0, INV, "k_descale is set but k is f16"},
    {"v_descale on f32 v", m_v_descale, F_F32, INV, "v_descale is set but v is f32"},
    {"q_descale, fp8 k/v only", m_descale_kv_only, 0, INV, "q_descale is set but q is f16"},
    {"descale stride -1", m_descale_stride, 0, INV, "must be >= 0"},
    {"descale stride overflows", m_descale_huge, F_VARLEN, INV, "overflow"},
    {"out_amax on an f16 call", m_amax_f16, 0, INV, "statistics of FP8"},
    {"p_amax misaligned", m_amax_misaligned, 0, INV, "p_amax"},
    {"out_amax and p_amax alias", m_amax_same, 0, INV, "p_amax overlaps out_amax"},
    {"out_amax inside out", m_amax_in_out, 0, INV, "out_amax overlaps out"},
    {"p_amax over q", m_amax_on_q, F_F32, INV, "p_amax overlaps q"},
    {"q ndim 3 (dense)", m_q_ndim3, 0, INV, "q.ndim"},
    {"k ndim 5", m_k_ndim5, 0, INV, "k.ndim"},
    {"v ndim 0", m_v_ndim0, 0, INV, "v.ndim"},
    {"out ndim -4", m_out_ndim_neg, 0, INV, "out.ndim"},
    {"lse ndim 2 (dense)", m_lse_ndim2, 0, INV, "lse.ndim"},
    {"varlen q ndim 4", m_varlen_q_ndim4, F_VARLEN, INV, "q.ndim"},
    {"varlen lse ndim 3", m_varlen_lse_ndim3, F_VARLEN, INV, "lse.ndim"},
    {"q last stride 2", m_q_last_stride2, 0, INV, "q.stride[3]"},
    {"k last stride 0", m_k_last_stride0, 0, INV, "k.stride[3]"},
    {"out last stride 16", m_out_last_stride, F_F32, INV, "out.stride[3]"},
    {"lse last stride 2", m_lse_last_stride, 0, INV, "lse.stride[2]"},
    {"varlen v last stride 3", m_varlen_v_last_stride, F_VARLEN, INV, "v.stride[2]"},
    {"k negative row stride", m_k_neg_stride, 0, INV, "k.stride[1]"},
    {"q negative batch stride", m_q_neg_stride, 0, INV, "q.stride[0]"},
    {"out negative head stride", m_out_neg_stride, 0, INV, "out.stride[2]"},
    {"out head stride < head_dim", m_out_head_overlap, 0, INV, "out: strides make elements overlap"},
    {"out row stride 0", m_out_row_zero, 0, INV, "out: strides make elements overlap"},
    {"out batch stride = row", m_out_batch_overlap, F_F32, INV, "out: strides make elements overlap"},
    {"lse heads/rows overlap", m_lse_overlap, 0, INV, "lse: strides make elements overlap"},
    {"varlen out token overlap", m_varlen_out_overlap, F_VARLEN, INV, "out: strides make elements overlap"},
    {"out aliases q", m_out_is_q, 0, INV, "out overlaps q"},
    {"out aliases k", m_out_is_k, F_F32, INV, "out overlaps k"},
    {"lse aliases v", m_lse_is_v, 0, INV, "lse overlaps v"},
    {"lse inside out", m_lse_in_out, 0, INV, "lse overlaps out"},
    {"q batch 0", m_q_batch0, 0, INV, "q.shape[0] (batch)"},
    {"q seqlen 0", m_q_seq0, 0, INV, "q.shape[1] (seqlen_q)"},
    {"q heads 0", m_q_heads0, 0, INV, "q.shape[2] (heads_q)"},
    {"q head_dim 0", m_q_dim0, 0, INV, "q.shape[3] (head_dim)"},
    {"k batch 0", m_k_batch0, 0, INV, "k.shape[0] (batch)"},
    {"k seqlen 0", m_k_seq0, 0, INV, "k.shape[1] (seqlen_k)"},
    {"k heads 0", m_k_heads0, 0, INV, "k.shape[2] (heads_kv)"},
    {"v head_dim 0", m_v_dim0, 0, INV, "v.shape[3] (head_dim)"},
    {"out seqlen 0", m_out_seq0, 0, INV, "out.shape[1] (seqlen_q)"},
    {"lse heads 0", m_lse_heads0, 0, INV, "lse.shape[1] (heads_q)"},
    {"q batch -1", m_q_batch_neg, 0, INV, "q.shape[0] (batch)"},
    {"q seqlen -5", m_q_seq_neg, 0, INV, "q.shape[1] (seqlen_q)"},
    {"q heads -4", m_q_heads_neg, F_F32, INV, "q.shape[2] (heads_q)"},
    {"q head_dim -16", m_q_dim_neg, 0, INV, "q.shape[3] (head_dim)"},
    {"k seqlen -7", m_k_seq_neg, 0, INV, "k.shape[1] (seqlen_k)"},
    {"varlen total_q -1", m_varlen_q_total_neg, F_VARLEN, INV, "q.shape[0] (total_q)"},
    {"varlen k heads 0", m_varlen_k_heads0, F_VARLEN, INV, "k.shape[1] (heads_kv)"},
    {"varlen q head_dim 0", m_varlen_q_dim0, F_VARLEN, INV, "q.shape[2] (head_dim)"},
    {"varlen lse heads 0", m_varlen_lse_heads0, F_VARLEN, INV, "lse.shape[0] (heads_q)"},
    {"heads_q 3 / heads_kv 2", m_gqa_3_2, 0, INV, "heads_q"},
    {"heads_q 4 / heads_kv 3", m_gqa_4_3, F_F32, INV, "heads_kv"},
    {"v seqlen != k seqlen", m_kv_seq_mismatch, 0, INV, "v.shape"},
    {"v heads != k heads", m_kv_heads_mismatch, 0, INV, "v.shape"},
    {"v head_dim != k head_dim", m_kv_dim_mismatch, 0, INV, "v.shape"},
    {"k head_dim != q head_dim", m_qk_dim_mismatch, 0, INV, "head_dim"},
    {"k batch != q batch", m_qk_batch_mismatch, 0, INV, "batch"},
    {"out seqlen != q seqlen", m_out_shape, 0, INV, "out.shape"},
    {"out heads != q heads", m_out_heads, F_F32, INV, "out.shape"},
    {"lse seqlen wrong", m_lse_shape_seq, 0, INV, "lse.shape"},
    {"lse batch wrong", m_lse_shape_batch, 0, INV, "lse.shape"},
    {"varlen lse tokens wrong", m_varlen_lse_shape, F_VARLEN, INV, "lse.shape"},
    {"varlen out tokens wrong", m_varlen_out_tokens, F_VARLEN, INV, "out.shape"},
    {"q seqlen > INT32_MAX", m_q_seq_huge, 0, INV, "q.shape[1] (seqlen_q)"},
    {"k heads 2^40", m_k_heads_huge, 0, INV, "k.shape[2] (heads_kv)"},
    {"k offsets overflow int64", m_k_offset_overflow, 0, INV, "overflow"},
    {"out offsets overflow int64", m_out_offset_overflow, 0, INV, "overflow"},
    {"lse byte offsets overflow", m_lse_byte_overflow, 0, INV, "lse: shape and strides"},
    {"window_left -2", m_window_left_m2, 0, INV, "window"},
    {"window_right -5", m_window_right_m5, 0, INV, "window"},
    {"window_left INT32_MIN", m_window_left_min, 0, INV, "window"},
    {"causal 2", m_causal_2, 0, INV, "causal"},
    {"causal -1", m_causal_neg, 0, INV, "causal"},
    {"causal + window_right 3", m_causal_wr, 0, INV, "window_right"},
    {"softcap -1", m_softcap_neg, 0, INV, "softcap"},
    {"softcap NaN", m_softcap_nan, 0, INV, "softcap"},
    {"softcap Inf", m_softcap_inf, F_F32, INV, "softcap"},
    {"scale NaN", m_scale_nan, 0, INV, "scale"},
    {"scale Inf", m_scale_inf, 0, INV, "scale"},
    {"scale -Inf", m_scale_ninf, F_F32, INV, "scale"},
    {"scale 2e38", m_scale_2e38, 0, INV, "scale 2e+38 is out of range"},
    {"scale -3e38", m_scale_n3e38, F_F32, INV, "|scale| <= 1e+25"},
    {"scale just past 1e25", m_scale_past_max, 0, INV, "scale"},
    {"scale 1e30 varlen", m_scale_1e30, F_VARLEN, INV, "scale"},
    {"scale just under 1e-25", m_scale_tiny, 0, INV, "1e-25 <= |scale|"},
    {"scale -1e-40 (denormal)", m_scale_denormal, F_F32, INV, "scale"},
    {"softcap 3e38", m_softcap_3e38, 0, INV, "softcap 3e+38 is out of range"},
    {"softcap just past 1e3", m_softcap_past_max, F_F32, INV, "[1e-13, 1000]"},
    {"softcap 1e-40", m_softcap_1e_40, 0, INV, "softcap"},
    {"softcap just under 1e-13", m_softcap_tiny, F_VARLEN, INV, "softcap"},
    {"q misaligned (f16, +1 byte)", m_q_misaligned, 0, INV, "q.data"},
    {"k misaligned (f32, +2 bytes)", m_k_misaligned, F_F32, INV, "k.data"},
    {"out misaligned (f16, +1 byte)", m_out_misaligned, F_VARLEN, INV, "out.data"},
    {"lse misaligned (+2 bytes)", m_lse_misaligned, 0, INV, "lse.data"},
    {"cu_seqlens_q misaligned", m_cu_q_misaligned, F_VARLEN, INV, "cu_seqlens_q"},
    {"cu_seqlens_k misaligned", m_cu_k_misaligned, F_VARLEN | F_F32, INV, "cu_seqlens_k"},
    {"q_descale misaligned", m_q_descale_misaligned, 0, INV, "q_descale"},
    {"cu_seqlens_q inside out", m_cu_q_in_out, F_VARLEN, INV, "out overlaps cu_seqlens_q"},
    {"cu_seqlens_k inside lse", m_cu_k_in_lse, F_VARLEN | F_F32, INV, "lse overlaps cu_seqlens_k"},
    {"q_descale inside out", m_q_descale_in_out, 0, INV, "out overlaps q_descale"},
    {"v_descale inside lse", m_v_descale_in_lse, F_F32, INV, "lse overlaps v_descale"},
    {"dense with cu_seqlens_q only", m_dense_with_cu_q, 0, INV, "cu_seqlens_q"},
    {"varlen without cu_seqlens_k", m_varlen_no_cu_k, F_VARLEN, INV, "cu_seqlens_k"},
    {"varlen without cu_seqlens_q", m_varlen_no_cu_q, F_VARLEN, INV, "cu_seqlens_q"},
    {"cu_seqlens_q[0] = 1", m_cu_q_start1, F_VARLEN, INV, "cu_seqlens_q[0]"},
    {"cu_seqlens_k[0] = -1", m_cu_k_start_neg, F_VARLEN, INV, "cu_seqlens_k[0]"},
    {"cu_seqlens_q decreasing", m_cu_q_decreasing, F_VARLEN, INV, "cu_seqlens_q is not non-decreasing"},
    {"cu_seqlens_k decreasing", m_cu_k_decreasing, F_VARLEN | F_F32, INV, "cu_seqlens_k is not non-decreasing"},
    {"seq longer than max_seqlen_q", m_max_seqlen_q_short, F_VARLEN, INV, "max_seqlen"},
    {"seq longer than max_seqlen_k", m_max_seqlen_k_short, F_VARLEN, INV, "cu_seqlens_k"},
    {"max_seqlen_q 0 with tokens", m_max_seqlen_q_zero, F_VARLEN, INV, "max_seqlen"},
    {"max_seqlen_k -1", m_max_seqlen_neg, F_VARLEN, INV, "max_seqlen"},
    {"cu_seqlens_q beyond q tokens", m_cu_q_beyond, F_VARLEN, INV, "exceeds"},
    {"cu_seqlens_k beyond k tokens", m_cu_k_beyond, F_VARLEN, INV, "cu_seqlens_k"},
    {"num_seqs 0", m_num_seqs0, F_VARLEN, INV, "num_seqs"},
    {"num_seqs -3", m_num_seqs_neg, F_VARLEN, INV, "num_seqs"},
    {"block_table entry -1", m_table_neg, F_PAGED, INV, "block_table[0][0] is -1"},
    {"block_table entry num_pages", m_table_past, F_PAGED | F_F32, INV, "block_table[1][2]"},
    {"seqused_k -1", m_used_neg, F_PAGED, INV, "seqused_k[1] is -1"},
    {"seqused_k past the pages", m_used_past_pages, F_PAGED, INV, "seqused_k[0] is 10"},
    {"seqused_k past seqlen_k (dense)", m_used_past_keys, F_USED, INV, "seqused_k[1] is 8"},
    {"seqused_k -1 (dense)", m_used_neg, F_USED | F_F32, INV, "seqused_k[1]"},
    {"max_pages_per_seq 0", m_max_pages0, F_PAGED, INV, "max_pages_per_seq is 0"},
    {"max_pages_per_seq -2", m_max_pages_neg, F_PAGED, INV, "max_pages_per_seq"},
    {"block_table_stride < max_pages", m_table_stride_short, F_PAGED, INV, "block_table_stride 2"},
    {"block_table_stride -1", m_table_stride_neg, F_PAGED, INV, "block_table_stride -1"},
    {"block_table_stride > INT32_MAX", m_table_stride_huge, F_PAGED, INV, "block_table_stride"},
    {"max_pages x page_size > INT32_MAX", m_pages_keys_huge, F_PAGED, INV, "max_pages_per_seq 715827883 x page_size"},
    {"block_table misaligned", m_table_misaligned, F_PAGED, INV, "block_table"},
    {"seqused_k misaligned", m_used_misaligned, F_PAGED | F_F32, INV, "seqused_k"},
    {"seqused_k misaligned (dense)", m_used_misaligned, F_USED, INV, "seqused_k"},
    {"block_table inside out", m_table_in_out, F_PAGED, INV, "out overlaps block_table"},
    {"seqused_k inside lse", m_used_in_lse, F_PAGED, INV, "lse overlaps seqused_k"},
    {"block_table with cu_seqlens", m_varlen_table, F_VARLEN, UNS, "block_table with cu_seqlens"},
    {"seqused_k with cu_seqlens", m_varlen_used, F_VARLEN, INV, "seqused_k with cu_seqlens"},
    {"k_new without seqused_k", m_new_no_used, F_USED | F_APPEND, INV, "k_new needs seqused_k"},
    {"k_new without v_new", m_new_v_null, F_PAGED | F_APPEND, INV, "k_new and v_new go together"},
    {"k_new dtype bf16", m_new_dtype, F_USED | F_APPEND, INV, "k_new (bf16)"},
    {"k_new heads 1 of 2", m_new_heads, F_PAGED | F_APPEND | F_F32, INV, "k_new.shape"},
    {"v_new last stride 2", m_new_last_stride, F_USED | F_APPEND, INV, "v_new.stride[3]"},
    {"k_new is the cache", m_new_is_k, F_USED | F_APPEND, INV, "k overlaps k_new"},
    {"appended keys past the cache", m_new_past_cache, F_USED | F_APPEND, INV, "before seqlen_new keys"},
    {"seqlen_new past the cache", m_new_longer_than_cache, F_USED | F_APPEND, INV, "the cache holds 7 keys (seqlen_k)"},
    {"appended-to v is k", m_v_is_k, F_USED | F_APPEND, INV, "v shares elements with k"},
    {"appended-to v one element past k", m_v_next_to_k, F_PAGED | F_APPEND, INV, "v shares elements with k"},
    {"appended keys past the pages", m_new_past_pages, F_PAGED | F_APPEND, INV, "seqused_k[1] is 8"},
    {"rotary without k_new", m_rot_only, F_USED | F_APPEND, INV, "set k_new and v_new"},
    {"rotary_sin NULL", m_rot_sin_null, F_PAGED | F_APPEND, INV, "rotary_sin.data is NULL"},
    {"rotary_dim 18 > head_dim", m_rot_too_wide, F_USED | F_APPEND, INV, "exceeds head_dim"},
    {"rotary tables too short", m_rot_too_short, F_USED | F_APPEND | F_F32, INV, "rotary position 6"},
    {"rotary_interleaved 2", m_rot_interleaved, F_USED | F_APPEND, INV, "rotary_interleaved is 2"},
    {"k_new with cu_seqlens", m_rot_varlen, F_VARLEN, UNS, "k_new/v_new with cu_seqlens"},
    {"backend 7", m_backend_7, F_KEEPB, INV, "backend"},
    {"backend -1", m_backend_neg, F_KEEPB, INV, "backend"},
    {"head_dim 600 on cpu", m_none, F_D600, UNS, "supported 1 to 512"},
    {"head_dim 600 on cpu f32", m_none, F_D600 | F_F32, UNS, "head_dim 600"},
};

/* ---- running one row --------------------------------------------------------------- */

/* Every buffer of a case, to prove a failing call wrote nothing. */
static int snapshot_take(tu_snapshot *s, kit_case *c)
{
    void *buf[7] = {c->q, c->k, c->v, c->out, c->lse, c->block_table, c->seqused_k};
    const size_t bytes[7] = {c->q_bytes, c->k_bytes, c->v_bytes, c->out_bytes, c->lse ? c->lse_bytes : 0,
                             c->table_bytes, c->used_bytes};
    return tu_snapshot_take(s, 7, buf, bytes);
}

static const char *const k_buf_names[7] = {"q", "k", "v", "out", "lse", "block_table", "seqused_k"};

static const char *backend_str(fc_backend b)
{
    switch (b) {
    case FC_BACKEND_AUTO: return "AUTO";
    case FC_BACKEND_CPU: return "CPU";
    case FC_BACKEND_CUDA: return "CUDA";
    case FC_BACKEND_CPU_REFERENCE: return "CPU_REFERENCE";
    }
    return "invalid";
}

/* Check that supported and forward both reject args with the expected
 * status and the same message naming the argument, and that no buffer of c
 * changed. want2 is a second acceptable status (or want). supported() runs
 * first: if it accepts the broken args, forward is not called, since running
 * a kernel on them could write anywhere (e.g. offsets that overflow). */
static void expect_failure(fc_context *ctx, const char *what, kit_case *c, const fc_attention_args *a,
                           fc_status want, fc_status want2, const char *substr)
{
    tu_snapshot snap;
    if (snapshot_take(&snap, c)) {
        CHECK(0, "%s: out of host memory for the snapshot", what);
        tu_snapshot_free(&snap);
        return;
    }
    fc_kernel_info info;
    memset(&info, 0, sizeof info);
    fc_status st = fc_attention_supported(ctx, a, &info);
    char msg[FC_MSG_COPY];
    snprintf(msg, sizeof msg, "%s", fc_last_error(ctx));
    CHECK(st == want || st == want2, "%s: supported returned %d (%s), expected %d; message '%s'", what,
          (int)st, fc_status_string(st), (int)want, msg);
    CHECK(msg[0] != 0, "%s: rejected with an empty last-error message", what);
    CHECK(!substr || strstr(msg, substr), "%s: message '%s' does not contain '%s'", what, msg,
          substr ? substr : "");
    int d = tu_snapshot_diff(&snap);
    CHECK(d < 0, "%s: supported changed %s", what, d >= 0 ? k_buf_names[d] : "");
    if (st == FC_OK) {
        CHECK(0, "%s: forward not called: supported accepted the broken args", what);
        tu_snapshot_free(&snap);
        return;
    }

    fc_status st2 = fc_attention_forward(ctx, a, NULL, &info);
    const char *msg2 = fc_last_error(ctx);
    CHECK(st2 == st, "%s: forward returned %d, supported %d", what, (int)st2, (int)st);
    CHECK(strcmp(msg2, msg) == 0, "%s: forward says '%s', supported said '%s'", what, msg2, msg);
    d = tu_snapshot_diff(&snap);
    CHECK(d < 0, "%s: failing forward changed %s", what, d >= 0 ? k_buf_names[d] : "");
    tu_snapshot_free(&snap);
}

static void run_row(fc_context *ctx, const row *r, uint64_t seed)
{
    kit_shape s = base_shape(r->flags);
    kit_case c;
    if (kit_case_init(&c, &s, seed)) {
        CHECK(0, "%s: kit_case_init failed", r->name);
        return;
    }
    fc_attention_args a = c.args;
    if (r->flags & F_APPEND) attach_append(&a);
    /* the unbroken case must be accepted (except the d600 row, whose whole
     * point is a valid request beyond the CPU limit) */
    if (!(r->flags & F_D600)) {
        a.backend = FC_BACKEND_CPU;
        fc_status st = fc_attention_supported(ctx, &a, NULL);
        CHECK(st == FC_OK, "%s: the unbroken base case is rejected: %s", r->name, fc_last_error(ctx));
    }
    r->mutate(&c, &a);
    kit_poison(c.out, c.out_bytes, s.dtype, c.lse, c.lse_bytes);
    static const fc_backend backends[] = {FC_BACKEND_CPU, FC_BACKEND_AUTO, FC_BACKEND_CPU_REFERENCE};
    int nb = r->flags & F_KEEPB ? 1 : 3;
    for (int i = 0; i < nb; i++) {
        char what[160];
        if (!(r->flags & F_KEEPB)) a.backend = backends[i];
        snprintf(what, sizeof what, "[%s] %s (%s)", backend_str(a.backend), r->name,
                 kit_dtype_name(s.dtype));
        expect_failure(ctx, what, &c, &a, r->want, r->want, r->substr);
    }
    kit_case_free(&c);
}

/* ---- the other groups ----------------------------------------------------------------- */

static void test_null_ctx_args(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    kit_shape s = base_shape(0);
    kit_case c;
    if (kit_case_init(&c, &s, 7)) { CHECK(0, "kit_case_init failed"); return; }
    c.args.backend = FC_BACKEND_CPU;
    tu_snapshot snap;
    if (snapshot_take(&snap, &c)) { CHECK(0, "snapshot failed"); kit_case_free(&c); return; }
    fc_kernel_info info;
    CHECK(fc_attention_forward(NULL, &c.args, NULL, &info) == FC_ERR_INVALID_ARGUMENT,
          "forward with ctx NULL is not FC_ERR_INVALID_ARGUMENT");
    CHECK(fc_attention_supported(NULL, &c.args, &info) == FC_ERR_INVALID_ARGUMENT,
          "supported with ctx NULL is not FC_ERR_INVALID_ARGUMENT");
    CHECK(tu_snapshot_diff(&snap) < 0, "forward with ctx NULL wrote something");
    const char *m = fc_last_error(NULL);
    CHECK(m && m[0], "fc_last_error(NULL) is empty");
    tu_snapshot_free(&snap);

    expect_failure(ctx, "args NULL", &c, NULL, FC_ERR_INVALID_ARGUMENT, FC_ERR_INVALID_ARGUMENT, "args");
    /* and NULL args with NULL ctx */
    CHECK(fc_attention_forward(NULL, NULL, NULL, NULL) == FC_ERR_INVALID_ARGUMENT,
          "forward(NULL, NULL) is not FC_ERR_INVALID_ARGUMENT");
    CHECK(fc_attention_supported(NULL, NULL, NULL) == FC_ERR_INVALID_ARGUMENT,
          "supported(NULL, NULL) is not FC_ERR_INVALID_ARGUMENT");
    kit_case_free(&c);
    group_done("null ctx/args", p0, f0);
}

static void test_rows(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    int n = (int)(sizeof k_rows / sizeof k_rows[0]);
    for (int i = 0; i < n; i++) run_row(ctx, &k_rows[i], 100 + (uint64_t)i);
    printf("(%d rows)\n", n);
    group_done("bad-input rows", p0, f0);
}

/* Bytes from a tensor's first element to the end of its last. */
static size_t extent_bytes(const fc_tensor *t)
{
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += (t->shape[i] - 1) * t->stride[i];
    return (size_t)(off + 1) * kit_dtype_size(t->dtype);
}

/* cu_seqlens with valid offsets inside out or lse (the offsets a CPU worker
 * was still reading when another overwrote them): rejected by supported and
 * forward alike, naming both, nothing written. */
static void cu_inside_outputs(fc_context *ctx, kit_case *c)
{
    const size_t cu_bytes = (size_t)(c->s.batch + 1) * sizeof(int32_t);
    static const fc_backend backends[] = {FC_BACKEND_CPU, FC_BACKEND_CPU_REFERENCE};
    for (int i = 0; i < 2; i++) {
        fc_attention_args a = c->args;
        a.backend = backends[i];
        kit_poison(c->out, c->out_bytes, c->s.dtype, c->lse, c->lse_bytes);
        int32_t *in_out = (int32_t *)((char *)c->out + 64);
        memcpy(in_out, c->cu_q, cu_bytes);
        a.cu_seqlens_q = in_out;
        expect_failure(ctx, "valid cu_seqlens_q inside out", c, &a, INV, INV, "out overlaps cu_seqlens_q");
        a = c->args;
        a.backend = backends[i];
        memcpy(c->lse, c->cu_k, cu_bytes);
        a.cu_seqlens_k = (const int32_t *)c->lse;
        expect_failure(ctx, "valid cu_seqlens_k inside lse", c, &a, INV, INV, "lse overlaps cu_seqlens_k");
    }
}

/* The same arrays right next to out, in one buffer: cu_seqlens_k ending at
 * out's first byte, cu_seqlens_q starting after its last. Accepted, the
 * answer matches the reference, and the arrays are unchanged. */
static void cu_next_to_out(fc_context *ctx, kit_case *c)
{
    const size_t cu_bytes = (size_t)(c->s.batch + 1) * sizeof(int32_t);
    const size_t ext = extent_bytes(&c->args.out); /* a multiple of 4 here: H*D*2 */
    char *buf = malloc(cu_bytes + ext + cu_bytes);
    void *ref = malloc(c->out_bytes);
    float *ref_lse = malloc(c->lse_bytes);
    if (!buf || !ref || !ref_lse || test_reference(ctx, c, ref, ref_lse) != FC_OK) {
        CHECK(0, "cu next to out: setup failed: %s", fc_last_error(ctx));
        free(buf); free(ref); free(ref_lse);
        return;
    }
    int32_t *cu_k = (int32_t *)buf, *cu_q = (int32_t *)(buf + cu_bytes + ext);
    static const fc_backend backends[] = {FC_BACKEND_CPU, FC_BACKEND_CPU_REFERENCE};
    for (int i = 0; i < 2; i++) {
        memcpy(cu_k, c->cu_k, cu_bytes);
        memcpy(cu_q, c->cu_q, cu_bytes);
        kit_poison(buf + cu_bytes, ext, c->s.dtype, c->lse, c->lse_bytes);
        fc_attention_args a = c->args;
        a.backend = backends[i];
        a.out.data = buf + cu_bytes;
        a.cu_seqlens_q = cu_q;
        a.cu_seqlens_k = cu_k;
        fc_status st = fc_attention_forward(ctx, &a, NULL, NULL);
        CHECK(st == FC_OK, "[%s] cu_seqlens next to out rejected: %s", backend_str(a.backend), fc_last_error(ctx));
        kit_gate g = kit_gate_for(c->s.dtype);
        kit_metrics m;
        kit_compare(c, buf + cu_bytes, c->lse, ref, ref_lse, &g, &m);
        CHECK(st != FC_OK || kit_gate_pass(&m, &g), "[%s] cu_seqlens next to out: max_abs %.2e unwritten %lld",
              backend_str(a.backend), m.max_abs, (long long)m.unwritten);
        CHECK(!memcmp(cu_k, c->cu_k, cu_bytes) && !memcmp(cu_q, c->cu_q, cu_bytes),
              "[%s] cu_seqlens next to out were changed", backend_str(a.backend));
    }
    free(buf); free(ref); free(ref_lse);
}

static void test_read_aliasing(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    kit_shape s = base_shape(F_VARLEN);
    s.seqlen_q = s.seqlen_k = 40; /* every sequence may be empty at 7; 40 leaves out room for 64 + 16 bytes */
    kit_case c;
    if (kit_case_init(&c, &s, 23)) { CHECK(0, "kit_case_init failed"); return; }
    if (c.out_bytes < 64 + 16 || c.lse_bytes < 16) {
        CHECK(0, "read aliasing: the case has too few tokens (%lld)", (long long)c.total_q);
    } else {
        cu_inside_outputs(ctx, &c);
        cu_next_to_out(ctx, &c);
    }
    kit_case_free(&c);
    group_done("outputs vs read arrays", p0, f0);
}

/* Every row (b, j, h) of k (t 0) and v (t 1) against the same row of kv,
 * [batch][seqlen_k][2][heads_kv][head_dim]: copied into kv (copy), else
 * compared; returns 1 if all equal (or copied). */
static int kv_rows(const fc_tensor *k, const fc_tensor *v, char *kv, int copy)
{
    const size_t es = kit_dtype_size(k->dtype);
    const int64_t B = k->shape[0], S = k->shape[1], H = k->shape[2], D = k->shape[3];
    int same = 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < S; j++)
            for (int64_t h = 0; h < H; h++)
                for (int t = 0; t < 2; t++) {
                    const fc_tensor *x = t ? v : k;
                    char *row = kv + (size_t)((((b * S + j) * 2 + t) * H + h) * D) * es;
                    char *src = (char *)x->data + (size_t)(b * x->stride[0] + j * x->stride[1] + h * x->stride[2]) * es;
                    if (copy) memcpy(row, src, (size_t)D * es);
                    else same &= !memcmp(row, src, (size_t)D * es);
                }
    return same;
}

/* An appended-to k and v interleaved in one buffer (kv_rows' layout):
 * accepted, and the append and the attention give the separate tensors'
 * answer bit for bit (the reference backend both times). */
static void test_kv_interleaved(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    kit_shape s = base_shape(F_USED | F_APPEND);
    kit_case c;
    if (kit_case_init(&c, &s, 29)) { CHECK(0, "kit_case_init failed"); return; }
    const fc_tensor *k = &c.args.k, *v = &c.args.v;
    const size_t es = kit_dtype_size(k->dtype);
    const int64_t S = k->shape[1], H = k->shape[2], D = k->shape[3];
    char *kv = malloc((size_t)(k->shape[0] * S * 2 * H * D) * es), *out = malloc(c.out_bytes);
    if (!kv || !out) { CHECK(0, "kv interleaved: out of memory"); free(kv); free(out); kit_case_free(&c); return; }
    kv_rows(k, v, kv, 1);
    fc_attention_args a = c.args;
    a.backend = FC_BACKEND_CPU_REFERENCE;
    a.out.data = out;
    a.k.data = kv;
    a.v.data = kv + (size_t)(H * D) * es;
    a.k.stride[0] = a.v.stride[0] = S * 2 * H * D;
    a.k.stride[1] = a.v.stride[1] = 2 * H * D;
    a.k.stride[2] = a.v.stride[2] = D;
    a.k.stride[3] = a.v.stride[3] = 1;
    const fc_status st = fc_attention_forward(ctx, &a, NULL, NULL);
    CHECK(st == FC_OK, "interleaved k and v rejected: %s", fc_last_error(ctx));
    fc_attention_args r = c.args;
    r.backend = FC_BACKEND_CPU_REFERENCE;
    const fc_status rs = fc_attention_forward(ctx, &r, NULL, NULL);
    CHECK(rs == FC_OK, "separate k and v: %s", fc_last_error(ctx));
    CHECK(st != FC_OK || rs != FC_OK || !memcmp(out, c.out, c.out_bytes), "interleaved k and v: another answer");
    CHECK(kv_rows(k, v, kv, 0), "interleaved k and v: another cache after the append");
    free(kv);
    free(out);
    kit_case_free(&c);
    group_done("interleaved k and v", p0, f0);
}

/* FC_BACKEND_CUDA on host buffers. Without a usable GPU (or without the CUDA
 * backend compiled in) the answer is FC_ERR_NO_DEVICE or FC_ERR_UNSUPPORTED
 * with a message; with one, host pointers are an invalid argument. */
static void test_cuda_request(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    kit_shape s = base_shape(0);
    kit_case c;
    if (kit_case_init(&c, &s, 11)) { CHECK(0, "kit_case_init failed"); return; }
    fc_attention_args a = c.args;
    a.backend = FC_BACKEND_CUDA;
    if (fc_cuda_available())
        expect_failure(ctx, "cuda backend on host pointers", &c, &a, FC_ERR_INVALID_ARGUMENT,
                       FC_ERR_INVALID_ARGUMENT, "host");
    else
        expect_failure(ctx, "cuda backend without a gpu", &c, &a, FC_ERR_NO_DEVICE, FC_ERR_UNSUPPORTED,
                       NULL);
    kit_case_free(&c);
    group_done("cuda request", p0, f0);
}

typedef fc_status (*setter_fn)(fc_context *ctx, int value);

static void test_setters(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    /* rejected values; where substr is set the message must name it */
    static const struct {
        const char *name;
        setter_fn set;
        int value;
        const char *substr;
    } bad[] = {
        {"set_num_threads(-1)", fc_context_set_num_threads, -1, "num_threads"},
        {"set_device(-2)", fc_context_set_device, -2, "device"},
        {"set_cuda_path(70)", fc_context_set_cuda_path, 70, "path"},
        {"set_num_threads(INT32_MIN)", fc_context_set_num_threads, INT32_MIN, NULL},
        {"set_device(INT32_MIN)", fc_context_set_device, INT32_MIN, NULL},
        {"set_cuda_path(-1)", fc_context_set_cuda_path, -1, NULL},
        {"set_cuda_path(89)", fc_context_set_cuda_path, 89, NULL},
        {"set_check_device_arrays(2)", fc_context_set_check_device_arrays, 2, "check_device_arrays"},
        {"set_check_device_arrays(-1)", fc_context_set_check_device_arrays, -1, NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fc_status st = bad[i].set(ctx, bad[i].value);
        CHECK(st == FC_ERR_INVALID_ARGUMENT, "%s returned %d", bad[i].name, (int)st);
        if (bad[i].substr)
            CHECK(strstr(fc_last_error(ctx), bad[i].substr) != NULL, "%s: message '%s' does not name '%s'",
                  bad[i].name, fc_last_error(ctx), bad[i].substr);
    }
    /* NULL contexts: an error status, no crash */
    static const struct {
        const char *name;
        setter_fn set;
        int value;
    } null_ctx[] = {
        {"set_num_threads", fc_context_set_num_threads, 1},
        {"set_device", fc_context_set_device, 0},
        {"set_cuda_path", fc_context_set_cuda_path, 0},
        {"set_check_device_arrays", fc_context_set_check_device_arrays, 1},
    };
    for (size_t i = 0; i < sizeof null_ctx / sizeof null_ctx[0]; i++)
        CHECK(null_ctx[i].set(NULL, null_ctx[i].value) == FC_ERR_INVALID_ARGUMENT, "%s(NULL) not invalid",
              null_ctx[i].name);
    char buf[64];
    CHECK(fc_cuda_device_info(NULL, buf, sizeof buf) == FC_ERR_INVALID_ARGUMENT,
          "cuda_device_info(NULL ctx) not invalid");
    fc_status st = fc_cuda_device_info(ctx, NULL, 0);
    CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), "buf"),
          "cuda_device_info(buf NULL) gave %d '%s'", (int)st, fc_last_error(ctx));
    /* a rejected setting leaves the context usable with its previous value */
    kit_shape s = base_shape(F_F32);
    kit_case c;
    if (!kit_case_init(&c, &s, 3)) {
        c.args.backend = FC_BACKEND_CPU;
        st = fc_attention_forward(ctx, &c.args, NULL, NULL);
        CHECK(st == FC_OK, "forward after rejected settings failed: %s", fc_last_error(ctx));
        kit_case_free(&c);
    }
    group_done("context setters", p0, f0);
}

/* A tensor description with dummy (never dereferenced) pointers. */
static void dummy_tensor(fc_tensor *t, uintptr_t addr, fc_dtype dt, int ndim, const int64_t *shape,
                         const int64_t *stride)
{
    memset(t, 0, sizeof *t);
    t->data = (void *)addr;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->stride[i] = stride[i];
    }
}

/* Dummy addresses 2^44 apart: every extent below stays in its own range, so
 * the output/input overlap check sees distinct buffers. Only supported() is
 * called on these: it touches no tensor data. */
#define DUMMY(i) ((uintptr_t)1 << 44) * (uintptr_t)(i + 1)

static void dense_dummy_args(fc_attention_args *a, int64_t q_batch_stride, int64_t k_row_stride)
{
    fc_attention_args_init(a);
    const int64_t B = 2, S = 5, H = 4, D = 16;
    int64_t shape[4] = {B, S, H, D};
    int64_t qs[4] = {q_batch_stride, H * D, D, 1};
    int64_t ks[4] = {S * k_row_stride, k_row_stride, D, 1};
    int64_t os[4] = {S * H * D, H * D, D, 1};
    dummy_tensor(&a->q, DUMMY(0), FC_DTYPE_F16, 4, shape, qs);
    dummy_tensor(&a->k, DUMMY(1), FC_DTYPE_F16, 4, shape, ks);
    dummy_tensor(&a->v, DUMMY(2), FC_DTYPE_F16, 4, shape, ks);
    dummy_tensor(&a->out, DUMMY(3), FC_DTYPE_F16, 4, shape, os);
    int64_t lshape[3] = {B, H, S}, ls[3] = {H * S, S, 1};
    dummy_tensor(&a->lse, DUMMY(4), FC_DTYPE_F32, 3, lshape, ls);
}

static void test_offsets(fc_context *ctx)
{
    int p0 = g_pass, f0 = g_fail;
    fc_attention_args a;
    fc_kernel_info info;
    static const fc_backend backends[] = {FC_BACKEND_CPU, FC_BACKEND_CPU_REFERENCE, FC_BACKEND_AUTO};

    /* Positive control: element offsets beyond 2^31 (q batch stride 2^33,
     * k/v row stride 2^32 + 64) are accepted. Every backend indexes with
     * 64-bit offsets (fc_fwd_params strides are int64_t), so tensors larger
     * than 2^31 elements are valid requests, not something to reject. */
    dense_dummy_args(&a, (int64_t)1 << 33, ((int64_t)1 << 32) + 64);
    for (int i = 0; i < 3; i++) {
        a.backend = backends[i];
        fc_status st = fc_attention_supported(ctx, &a, &info);
        CHECK(st == FC_OK, "[%s] offsets beyond 2^31 rejected: %s", backend_str(a.backend), fc_last_error(ctx));
        if (st == FC_OK)
            CHECK(info.backend == (a.backend == FC_BACKEND_AUTO ? FC_BACKEND_CPU : a.backend),
                  "[%s] info.backend %d", backend_str(a.backend), (int)info.backend);
    }
    /* ...and offsets far larger: q batch stride 2^60 (2^61 bytes of f16). q
     * moves above the other dummies so its extent covers none of them. */
    dense_dummy_args(&a, ((int64_t)1 << 60), 64);
    a.q.data = (void *)((uintptr_t)1 << 47);
    a.backend = FC_BACKEND_CPU;
    CHECK(fc_attention_supported(ctx, &a, NULL) == FC_OK, "q batch stride 2^60 rejected: %s",
          fc_last_error(ctx));

    /* Overflow of int64 element offsets: stride 2^62 with shape 4. */
    struct {
        const char *name;
        int which; /* 0 q, 1 k (and v shape), 2 out, 3 lse */
    } ov[] = {{"q", 0}, {"k", 1}, {"out", 2}, {"lse", 3}};
    for (int t = 0; t < 4; t++) {
        dense_dummy_args(&a, 5 * 4 * 16, 4 * 16);
        fc_tensor *x = ov[t].which == 0 ? &a.q : ov[t].which == 1 ? &a.k : ov[t].which == 2 ? &a.out : &a.lse;
        if (ov[t].which == 3) {
            x->shape[2] = 4; /* lse seqlen 4: q/out must agree, but the overflow is reported first */
            x->stride[1] = (int64_t)1 << 62;
        } else {
            x->shape[1] = 4;
            x->stride[1] = (int64_t)1 << 62;
            if (ov[t].which == 1) a.v.shape[1] = 4;
        }
        for (int i = 0; i < 3; i++) {
            a.backend = backends[i];
            fc_status st = fc_attention_supported(ctx, &a, &info);
            const char *m = fc_last_error(ctx);
            CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(m, "overflow") && strncmp(m, ov[t].name, strlen(ov[t].name)) == 0,
                  "[%s] %s stride 2^62 x shape 4: got %d '%s'", backend_str(a.backend), ov[t].name, (int)st, m);
        }
    }
    /* An overflow in the sum, not in any single term: 2^62 + 4 * 2^60. */
    dense_dummy_args(&a, (int64_t)1 << 62, 64);
    a.q.stride[1] = (int64_t)1 << 60;
    a.backend = FC_BACKEND_CPU;
    fc_status st = fc_attention_supported(ctx, &a, NULL);
    CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), "overflow"),
          "q offsets summing past int64 gave %d '%s'", (int)st, fc_last_error(ctx));
    group_done("offsets (dummy ptrs)", p0, f0);
}

int main(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK || !ctx) return test_give_up("FAIL: fc_context_create");
    test_null_ctx_args(ctx);
    test_rows(ctx);
    test_read_aliasing(ctx);
    test_kv_interleaved(ctx);
    test_cuda_request(ctx);
    test_setters(ctx);
    test_offsets(ctx);
    fc_context_free(ctx);
    return test_summary();
}
