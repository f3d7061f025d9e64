/*
 * fwd.h -- one fuzzed forward call: what the generator decided (fwd_gen.c)
 * and what the checks need to judge it (fwd_check.c).
 */
#ifndef FC_FUZZ_FWD_H
#define FC_FUZZ_FWD_H

#include "fuzz.h"

/* The buffers of a call, each placed somewhere in the arena. */
enum { FB_Q, FB_K, FB_V, FB_O, FB_LSE, FB_CUQ, FB_CUK, FB_DESC, FB_N };

typedef struct fz_fwd {
    fc_attention_args a;
    int args_null;           /* pass args == NULL                              */
    int threads;             /* fc_context_set_num_threads                     */
    int cuda_path, device;   /* fc_context_set_cuda_path / _set_device         */
    int tuned;               /* tun was handed to fc_context_set_tuning        */
    fc_tuning tun;
    int varlen, nseq;
    int32_t cu[2][4];        /* host copies of cu_seqlens_q / _k               */
    int32_t total_owned;     /* varlen: query tokens sequences own (cu_q[n])   */
    int special;             /* q, k and v each hold one NaN or Inf            */
    fz_arena ar;
    int64_t off[FB_N];       /* byte offset of each buffer's data pointer; -1: NULL */
} fz_fwd;

/* Build the call from the bytes: arguments, arena, inputs, poisoned outputs.
 * 0, or -1 when the arena cannot be allocated (the input is skipped). */
int fz_fwd_build(fz_in *in, fz_fwd *c);
/* Run supported and forward, then every check. */
void fz_fwd_check(fz_fwd *c);
/* Print the call's arguments (the reproducer a failure report carries). */
void fz_fwd_describe(const fz_fwd *c);

#endif /* FC_FUZZ_FWD_H */
