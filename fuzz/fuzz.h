/*
 * fuzz.h -- the fuzz target's pieces: a byte reader that turns fuzzer input
 * into decisions, an arena that holds every buffer of a call between poison
 * bytes, and the table of entry points the target exercises. One target
 * function (fz_run_one) serves libFuzzer and the seeded driver alike.
 */
#ifndef FC_FUZZ_H
#define FC_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "flashcore.h"

/* Input classes the generator can leave out (FC_FUZZ_SKIP, a comma list of
 * the names in fuzz/target.c), so a run can go past a class whose fix has
 * not landed yet. Default: nothing skipped. */
enum {
    FZ_SKIP_CU_IN_OUT = 1u << 0,   /* cu_seqlens placed inside out or lse    */
    FZ_SKIP_EXTREME = 1u << 1,     /* scale/softcap near the float limits    */
    FZ_SKIP_MAX_SEQLEN = 1u << 2,  /* max_seqlen far above the real lengths  */
    FZ_SKIP_MISALIGNED = 1u << 3,  /* data pointers off their dtype's alignment */
    FZ_SKIP_ODD_CU = 1u << 4,      /* a cu_seqlens entry made arbitrary      */
    FZ_SKIP_ODD_STRIDE = 1u << 5,  /* padding off a multiple of 8 elements   */
};
extern unsigned fz_skip;

/* ---- input bytes: reading past the end gives zeros, which mean "plain" -- */
typedef struct fz_in {
    const uint8_t *p;
    size_t n, i;
} fz_in;
unsigned fz_byte(fz_in *in);
uint32_t fz_u32(fz_in *in);
uint64_t fz_u64(fz_in *in);
int fz_range(fz_in *in, int lo, int hi); /* lo..hi inclusive             */
int fz_chance(fz_in *in, int pct);       /* 1 with pct% odds; 0 on zeros */

/* ---- where the call's memory lives (fuzz/device.c) ------------------------ */
/* 1 in the CUDA fuzz build (FZ_CUDA): arenas in managed memory, the device
 * synchronized after each call; 0 in the CPU build (plain host memory). */
extern const int fz_cuda_mode;
void *fz_device_alloc(size_t n); /* managed in the CUDA build; NULL: skip the input */
void fz_device_free(void *p);
/* Wait for the device and fail on any CUDA error, sticky or left behind
 * by the call named in `after` (nothing in the CPU build). */
void fz_device_sync(const char *after);

/* ---- the arena -------------------------------------------------------------- */
typedef struct fz_arena {
    uint8_t *base;  /* the call's memory: every buffer lives in here        */
    uint8_t *mask;  /* 1 where a byte belongs to an output element          */
    uint8_t *copy;  /* a snapshot of base                                   */
    size_t size;
    int on_device;  /* base came from fz_device_alloc                       */
} fz_arena;
/* base filled with poison bytes; on_device: where the call runs (the
 * reference always gets a host arena: the CPU backends refuse managed memory) */
int fz_arena_init(fz_arena *a, size_t size, int on_device);
void fz_arena_free(fz_arena *a);
void fz_arena_snapshot(fz_arena *a);
/* First byte where base differs from the snapshot (restricted to bytes
 * whose mask is 0 when outside_outputs), or -1. */
int64_t fz_arena_changed(const fz_arena *a, int outside_outputs);

/* Element offsets (in elements, logical row-major order) of a tensor whose
 * shape is small and non-negative; -1 when it is not (nothing enumerated). */
int64_t fz_tensor_offsets(const fc_tensor *t, int64_t **offs);
/* Element access through memcpy: pointers may be misaligned on purpose. */
double fz_load(const void *base, fc_dtype dt, int64_t idx);
void fz_store(void *base, fc_dtype dt, int64_t idx, float v);
void fz_poison(void *base, fc_dtype dt, int64_t idx);
int fz_is_poison(const void *base, fc_dtype dt, int64_t idx);
size_t fz_dtype_size(int dt); /* 1 for unknown values */

/* ---- reporting ---------------------------------------------------------- */
/* Print the failure with the call's arguments and stop the process (the
 * engine keeps the input as the reproducer). */
void fz_fail(const char *cls, const char *fmt, ...);
/* What fz_fail prints after the message: set by the entry point running. */
extern void (*fz_describe)(void);
/* Replays print the call before running it (a sanitizer may stop the
 * process without a callback). */
extern int fz_verbose;
/* Set by the seeded driver: saves the input before the process stops. */
extern void (*fz_on_failure)(void);

/* What the driver reports for each entry point: the statuses its calls
 * returned, and how the successful ones were judged against the reference. */
enum { FZ_FORWARD, FZ_BACKWARD, FZ_MERGE, FZ_TUNING, FZ_N_KINDS };
typedef struct fz_stats {
    uint64_t status[FC_ERR_INTERNAL + 1];
    uint64_t gated;  /* FC_OK, every element within the dtype's gates        */
    uint64_t loose;  /* FC_OK, ill-conditioned or non-finite inputs: writes
                      * (and finiteness where defined) judged only          */
} fz_stats;
extern fz_stats fz_stats_of[FZ_N_KINDS];
/* Count a kernel that ran for entry point kind (fc_kernel_info.name; a
 * split count is folded). */
void fz_note_kernel(int kind, const char *name);
/* The statuses, judgements and kernels seen so far, on stdout. */
void fz_print_stats(void);

/* A call's status must be a valid fc_status with a message on failure. */
void fz_check_status(fc_context *ctx, fc_status st, const char *what);

/* ---- entry points ------------------------------------------------------- */
/* One function per entry point: builds a call from the bytes and checks it. */
typedef void (*fz_entry_fn)(fz_in *in);
void fz_entry_forward(fz_in *in);
void fz_entry_backward(fz_in *in);
void fz_entry_merge(fz_in *in);  /* fuzz/merge.c */
void fz_entry_tuning(fz_in *in); /* fuzz/tuning.c */

/* The target: one input, every check; returns 0 (failures stop the process). */
int fz_run_one(const uint8_t *data, size_t size);
/* Parse FC_FUZZ_SKIP once; prints and exits on a name it does not know. */
void fz_init(void);

#endif /* FC_FUZZ_H */
