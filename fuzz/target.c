/*
 * target.c -- the fuzz target: input bytes in, one entry point exercised
 * and checked, plus what every entry point shares (the byte reader, the
 * skip switch, status checks, failure reports). LLVMFuzzerTestOneInput is
 * the libFuzzer entry; fuzz/driver.c feeds fz_run_one from a PRNG instead.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

unsigned fz_skip;
void (*fz_describe)(void);
void (*fz_on_failure)(void);
int fz_verbose;

/* Entry points, one function each; the first input byte picks one: 250 and
 * up the merge, 248 the tuning cache's file, the rest forward or backward by
 * parity (as before the merge came; no corpus input starts with 248). */
static const fz_entry_fn k_entries[] = {fz_entry_forward, fz_entry_backward};
#define FZ_N_ENTRIES (sizeof k_entries / sizeof k_entries[0])
#define FZ_MERGE_BYTE 250u
#define FZ_TUNING_BYTE 248u

static const struct { const char *name; unsigned bit; } k_skip_names[] = {
    {"cu_in_out", FZ_SKIP_CU_IN_OUT},
    {"extreme", FZ_SKIP_EXTREME},
    {"max_seqlen", FZ_SKIP_MAX_SEQLEN},
    {"misaligned", FZ_SKIP_MISALIGNED},
    {"odd_cu", FZ_SKIP_ODD_CU},
    {"odd_stride", FZ_SKIP_ODD_STRIDE},
};

unsigned fz_byte(fz_in *in) { return in->i < in->n ? in->p[in->i++] : 0u; }

uint32_t fz_u32(fz_in *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 8 | fz_byte(in);
    return v;
}

uint64_t fz_u64(fz_in *in) { return (uint64_t)fz_u32(in) << 32 | fz_u32(in); }

int fz_range(fz_in *in, int lo, int hi)
{
    uint32_t span = (uint32_t)(hi - lo) + 1u;
    uint32_t r = span <= 256 ? fz_byte(in) : fz_u32(in);
    return lo + (int)(r % span);
}

int fz_chance(fz_in *in, int pct) { return fz_byte(in) >= 256u - (unsigned)pct * 256u / 100u; }

void fz_init(void)
{
    if (fz_cuda_mode && !fc_cuda_available()) {
        fprintf(stderr, "fuzz: this is the CUDA fuzz build and there is no usable CUDA device\n");
        exit(2);
    }
    const char *e = getenv("FC_FUZZ_SKIP");
    char buf[256];
    if (!e || !*e) return;
    snprintf(buf, sizeof buf, "%s", e);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        size_t i = 0;
        while (i < sizeof k_skip_names / sizeof k_skip_names[0] && strcmp(tok, k_skip_names[i].name)) i++;
        if (i == sizeof k_skip_names / sizeof k_skip_names[0]) {
            fprintf(stderr, "FC_FUZZ_SKIP: unknown class '%s' (cu_in_out, extreme, max_seqlen, misaligned, odd_cu, odd_stride)\n", tok);
            exit(2);
        }
        fz_skip |= k_skip_names[i].bit;
        fprintf(stderr, "fuzz: skipping input class %s\n", tok);
    }
}

void fz_fail(const char *cls, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "\n==== FUZZ FAILURE [%s]: ", cls);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    if (fz_describe) fz_describe();
    if (fz_on_failure) fz_on_failure();
    fflush(stderr);
    abort();
}

void fz_check_status(fc_context *ctx, fc_status st, const char *what)
{
    if (st < FC_OK || st > FC_ERR_INTERNAL)
        fz_fail("status", "%s returned %d, not an fc_status", what, (int)st);
    if (st == FC_ERR_INTERNAL)
        fz_fail("status", "%s returned FC_ERR_INTERNAL: %s", what, fc_last_error(ctx));
    if (st == FC_ERR_CUDA) /* the harness's memory is valid: a failing CUDA call is a finding */
        fz_fail("cuda", "%s returned FC_ERR_CUDA: %s", what, fc_last_error(ctx));
    if (st != FC_OK && !fc_last_error(ctx)[0])
        fz_fail("status", "%s returned %s with an empty fc_last_error", what, fc_status_string(st));
}

/* Sanitizer defaults of every fuzz binary. An allocation above 256 MiB
 * fails instead of being mapped lazily: no fuzzed call needs that much, so
 * an oversized request shows as the library's out-of-memory answer (which
 * the checks judge) rather than as minutes of shadow-memory clearing. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "max_allocation_size_mb=256:allocator_may_return_null=1"; }
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) { return "print_stacktrace=1"; }

int fz_run_one(const uint8_t *data, size_t size)
{
    fz_in in = {data, size, 0};
    const unsigned pick = fz_byte(&in);
    if (pick >= FZ_MERGE_BYTE) fz_entry_merge(&in);
    else if (pick == FZ_TUNING_BYTE) fz_entry_tuning(&in);
    else k_entries[pick % FZ_N_ENTRIES](&in);
    fz_describe = NULL;
    return 0;
}

#ifdef FZ_LIBFUZZER
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fz_run_one(data, size); }
#endif
