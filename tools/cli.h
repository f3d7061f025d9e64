/*
 * cli.h -- what the `flashcore` command's files share: the subcommands, flag
 * parsing helpers, the named shapes, running a case on a backend (host or
 * device buffers), timing, and the CUDA runtime wrappers the CLI needs for
 * device buffers and events. The CLI is a client of the public API only
 * (flashcore.h) plus the kit (kit.h, kit_json.h).
 *
 * Exit codes of every command: 0 success, 1 a check failed or the library
 * reported an error, 2 bad usage or unreadable input.
 */
#ifndef FC_CLI_H
#define FC_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "flashcore.h"
#include "kit.h"

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

/* ---- subcommands (cli_<name>.c) --------------------------------------------- */
int cli_demo(int argc, char **argv);
int cli_check(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_compare(int argc, char **argv);
int cli_rows(int argc, char **argv);
int cli_tune(int argc, char **argv);

/* ---- profiler ranges ------------------------------------------------------------ */
/* NVTX ranges (the toolkit's header-only nvtx3, FC_HAVE_NVTX from CMake);
 * empty without it. */
#if defined(FC_HAVE_NVTX) && FC_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#define CLI_RANGE_PUSH(name) nvtxRangePushA(name)
#define CLI_RANGE_POP() nvtxRangePop()
#else
#define CLI_RANGE_PUSH(name) ((void)0)
#define CLI_RANGE_POP() ((void)0)
#endif

/* ---- flags (cli_common.c) ----------------------------------------------------- */
/* A cursor over argv that understands "--flag value" and "--flag=value". */
typedef struct cli_args {
    int argc, i;
    char **argv;
    const char *cmd;       /* "bench": prefixes error messages */
    const char *inline_val; /* value after '=' of the current flag, or NULL */
} cli_args;

void cli_args_init(cli_args *a, const char *cmd, int argc, char **argv);
/* Next argument, or NULL at the end. A "--name=value" argument is returned as
 * "--name" with the value kept for cli_value(). */
const char *cli_next(cli_args *a);
/* 1 if arg (as returned by cli_next) is the flag name. */
int cli_is(const cli_args *a, const char *arg, const char *name);
/* The value of the current flag; prints an error and returns NULL if none. */
const char *cli_value(cli_args *a, const char *flag);
/* Strict number parsing with a range; print "cmd: flag: ..." on error. */
int cli_int(cli_args *a, const char *flag, long long lo, long long hi, long long *out);
int cli_double(cli_args *a, const char *flag, double lo, double hi, double *out);
/* Complains about a flag the command does not know (non-zero return). */
int cli_unknown(const cli_args *a, const char *arg);
/* A flag given without "=value" where none is allowed, e.g. --quick=1. */
int cli_no_value(cli_args *a, const char *flag);

/* "auto", "cpu", "cuda", "reference" -> backend. -1 on error (message printed). */
int cli_parse_backend(const char *cmd, const char *s, fc_backend *out);
const char *cli_backend_name(fc_backend b);
/* AUTO -> CUDA if fc_cuda_available(), else CPU. */
fc_backend cli_resolve_backend(fc_backend b);

/* For a resolved CUDA backend: fails (message from fc_cuda_device_info, or
 * "built without CUDA") unless a device is usable. 0 when usable/not CUDA. */
int cli_require_backend(const char *cmd, fc_context *ctx, fc_backend resolved);

/* A context with the given CPU thread count (0 = default); prints and returns
 * NULL on failure. */
fc_context *cli_context(const char *cmd, int threads);
/* "cmd: what: FC_ERR_...: <fc_last_error>" on stderr. */
void cli_report(const char *cmd, const char *what, fc_context *ctx, fc_status st);

/* Progress line on stderr: overwritten in place on a tty, one line each
 * otherwise. cli_progress_done clears the tty line. */
void cli_progress(int i, int n, const char *what);
void cli_progress_done(void);

/* ---- named shapes (cli_shapes.c) ------------------------------------------------ */
/* Which default set (`bench --all`, `bench --all --bwd`) a benchmark shape
 * belongs to; --shape names any of them for either pass. */
#define CLI_SET_FWD 1
#define CLI_SET_BWD 2

/* The benchmark shapes (docs/PERF.md). */
typedef struct cli_named_shape {
    const char *name;
    int B, Hq, Hkv, Sq, Sk, D, causal;
    fc_dtype dtype;
    int sets; /* CLI_SET_* bits (0 outside the benchmark table) */
} cli_named_shape;
extern const cli_named_shape cli_bench_shapes[];
extern const int cli_num_bench_shapes;
const cli_named_shape *cli_find_bench_shape(const char *name);
/* kit_shape of a named shape (random inputs, lse not requested, BSHD). */
kit_shape cli_shape_from_named(const cli_named_shape *n);
/* "B,Hq,Hkv,Sq,Sk,D[,causal][,wl=N][,wr=N][,softcap=X][,dtype]" (a window's
 * left and right edges; unset: -1) -> shape named "custom-..." into
 * name_buf. -1 with a message on error. */
int cli_parse_custom(const char *cmd, const char *spec, kit_shape *s, char *name_buf, size_t n);

/* ---- running a case on a backend (cli_run.c) ---------------------------------------- */
/* A case prepared for one backend and one pass: for CUDA its tensors live in
 * device buffers and args/bargs point at them; for the CPU backends at the
 * case's host buffers. A backward exec (b set) runs fc_attention_backward
 * with bargs, whose fwd is args; a forward exec runs fc_attention_forward. */
typedef struct cli_exec {
    kit_case *c;
    kit_bwd_case *b;        /* backward: the case (c = &b->c); NULL: forward */
    fc_backend backend;     /* resolved: CPU, CUDA or CPU_REFERENCE */
    fc_attention_args args; /* pointers in the backend's memory     */
    fc_attention_backward_args bargs; /* backward: the same, and the gradients */
    void *stream;           /* CUDA: the stream all work goes on    */
    void *dq, *dk, *dv, *dout, *dlse, *dcu_q, *dcu_k; /* device buffers */
    void *dtable, *dused;   /* device: the block table and seqused_k */
    void *dnew[4];          /* device: k_new, v_new, rotary_cos, rotary_sin */
    void *ddesc[3];         /* device: the FP8 q, k, v descales */
    struct { void *dout, *dq, *dk, *dv; } grad;       /* device: the backward's */
} cli_exec;

/* Prepare a forward exec (for CUDA: allocate, upload; err names the failing
 * call). On an error return nothing stays allocated. */
int cli_exec_init(cli_exec *e, kit_case *c, fc_backend backend, char *err, size_t err_len);
/* Prepare a backward exec: the forward's tensors as cli_exec_init, dout
 * uploaded, the gradients' buffers. out and lse are filled by
 * cli_exec_bwd_forward. */
int cli_exec_init_bwd(cli_exec *e, kit_bwd_case *b, fc_backend backend, char *err, size_t err_len);
void cli_exec_free(cli_exec *e);
/* The forward on the exec's backend (out/lse poisoned first, then fetched
 * into the case's host buffers): the out and lse the backward reads, the
 * same on the backend and, for the reference, on the host. */
fc_status cli_exec_bwd_forward(fc_context *ctx, cli_exec *e, char *err, size_t err_len);
/* Poison what the pass writes (out/lse, or dq/dk/dv) on the host and, for
 * CUDA, on the device. */
int cli_exec_poison(cli_exec *e, char *err, size_t err_len);
/* The pass's supported() query: same checks and selection as the call. */
fc_status cli_exec_supported(fc_context *ctx, const cli_exec *e, fc_kernel_info *info);
/* The pass's one library call on the exec's stream; no wait, no message. */
fc_status cli_exec_call(fc_context *ctx, cli_exec *e, fc_kernel_info *info);
/* cli_exec_call, then for CUDA a wait for the stream and its check; the
 * library's message in err on failure. */
fc_status cli_exec_run(fc_context *ctx, cli_exec *e, fc_kernel_info *info, char *err, size_t err_len);
/* Copy what the pass wrote back into the case's host buffers (no-op on the CPU). */
int cli_exec_fetch(cli_exec *e, char *err, size_t err_len);

/* Outcome of checking one case against the reference. */
typedef enum cli_verdict { CLI_PASS = 0, CLI_FAIL = 1, CLI_SKIP = 2 } cli_verdict;
typedef struct cli_check_result {
    cli_verdict verdict;
    kit_metrics m;          /* forward                                  */
    kit_gate g;
    kit_bwd_metrics bm[3];  /* backward: dq, dk, dv                     */
    kit_bwd_gate bg;
    fc_kernel_info info;
    char note[512];         /* why it failed or was skipped */
} cli_check_result;

/* Run c on backend and on FC_BACKEND_CPU_REFERENCE, compare with the dtype's
 * gates. UNSUPPORTED on the backend gives SKIP with the library's message. */
void cli_check_case(fc_context *ctx, kit_case *c, fc_backend backend, cli_check_result *r);
/* The same for the backward: the forward on backend gives out and lse, then
 * the backward there and the reference backward on the same out and lse,
 * judged by the backward's gates (kit_bwd_gate_for, the backend's path). */
void cli_check_bwd_case(fc_context *ctx, kit_bwd_case *b, fc_backend backend, cli_check_result *r);

/* ---- timing (cli_time.c) ----------------------------------------------------------- */
typedef struct cli_time_opts {
    double warmup_ms;       /* run for at least this long before timing      */
    int iters;              /* timed calls (upper bound when max_ms hits)    */
    double max_ms;          /* stop timing after this much (>= 3 calls)      */
    int graph;              /* CUDA: also time a captured graph of calls     */
    int flush_l2;           /* CUDA: overwrite L2 before each event-timed call */
} cli_time_opts;

#define CLI_GRAPH_CALLS 20  /* calls captured per graph (as the anchors do) */

typedef struct cli_timing {
    int iters;
    double p50_us, p90_us, mean_us, std_us, min_us;
    double graph_us;        /* per call; NaN if not measured                 */
    fc_host_profile host;   /* CUDA: medians of fc_last_host_profile over the
                             * event-timed calls; NaN on the CPU             */
    char graph_note[320];   /* why graph_us is missing                       */
} cli_timing;

/* Times e (already prepared). Returns FC_OK or the first failing status with
 * the message in err. */
fc_status cli_time_exec(fc_context *ctx, cli_exec *e, const cli_time_opts *o, cli_timing *t,
                        char *err, size_t err_len);

/* ---- CUDA runtime wrappers (cli_cuda.c; stubs without FC_HAVE_CUDA) ------------------ */
int cli_cuda_compiled(void);
/* Each returns 0, or -1 with "cudaXxx(...): <cuda error string>" in err. */
int cli_cuda_malloc(void **p, size_t bytes, const char *what, char *err, size_t n);
void cli_cuda_free(void *p);
int cli_cuda_h2d(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t n);
int cli_cuda_d2h(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t n);
int cli_cuda_stream_create(void **stream, char *err, size_t n);
void cli_cuda_stream_destroy(void *stream);
int cli_cuda_stream_sync(void *stream, char *err, size_t n);
/* Events: a pair reused across calls. */
typedef struct cli_cuda_timer { void *start, *stop; } cli_cuda_timer;
int cli_cuda_timer_create(cli_cuda_timer *t, char *err, size_t n);
void cli_cuda_timer_destroy(cli_cuda_timer *t);
int cli_cuda_timer_start(cli_cuda_timer *t, void *stream, char *err, size_t n);
/* Records stop, waits for it, gives the elapsed milliseconds. */
int cli_cuda_timer_stop(cli_cuda_timer *t, void *stream, float *ms, char *err, size_t n);
/* Graph capture of calls on stream. */
int cli_cuda_capture_begin(void *stream, char *err, size_t n);
/* Ends the capture; with ok=0 discards it. *exec receives an instantiated graph. */
int cli_cuda_capture_end(void *stream, int ok, void **exec, char *err, size_t n);
int cli_cuda_graph_launch(void *exec, void *stream, char *err, size_t n);
void cli_cuda_graph_destroy(void *exec);
/* Overwrites a scratch buffer of twice the L2 size on stream (lazily allocated). */
int cli_cuda_flush_l2(void *stream, char *err, size_t n);
void cli_cuda_release_scratch(void);
/* Device name, compute capability and driver/runtime versions. */
int cli_cuda_describe(char *name, size_t name_len, char *driver, size_t driver_len);
/* The current device's compute capability (major * 10 + minor) and SM
 * count; -1 without a device. */
int cli_cuda_props(int *cc, int *sms);

/* ---- system description (cli_sysinfo.c) ------------------------------------------------- */
void cli_cpu_model(char *buf, size_t n);
int cli_online_cpus(void);
void cli_hostname(char *buf, size_t n);
void cli_utc_now_iso8601(char *buf, size_t n);
/* The git SHA named in fc_build_info() ("git <sha>"), or "unknown". */
void cli_git_sha(char *buf, size_t n);
/* "sm_clock_mhz, temp_c" from nvidia-smi, or "" when unavailable. */
void cli_gpu_clock_temp(char *buf, size_t n);
/* Compiler and flags the CLI itself was built with. */
const char *cli_compiler(void);

#endif /* FC_CLI_H */
