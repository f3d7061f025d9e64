/*
 * cli_check.c -- `flashcore check`: the correctness runner. Named shapes (the
 * benchmark shapes, scaled down where the fp64 reference would take too long,
 * and edge shapes) plus random configurations, each run on the chosen backend
 * and compared with FC_BACKEND_CPU_REFERENCE through the kit's per-dtype gates.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* A named check case. Scaled-down benchmark shapes say how in their name
 * ("/small": fewer heads and shorter sequences; "/sq128": the full key
 * length with 128 queries). Every case asks for lse. */
typedef struct check_named {
    cli_named_shape dims; /* name and dimensions, as the bench shapes (cli_shapes.c) */
    int quick;            /* part of --quick */
    int wl, wr;
    float softcap;
    int varlen;
    kit_layout layout;
    float scale, input_scale;
    int page;             /* > 0: k/v through a paged cache of this page size (forward only) */
    kit_seqused used;     /* seqused_k (forward only) */
    int kv8;              /* FP8 K/V cache (FC_DTYPE_E4M3/E5M2) under this row's q */
} check_named;

#define F16 FC_DTYPE_F16
#define BF16 FC_DTYPE_BF16
#define F32 FC_DTYPE_F32
#define BSHD KIT_LAYOUT_BSHD
#define BHSD KIT_LAYOUT_BHSD
#define PAD KIT_LAYOUT_PADDED
#define FULL KIT_SEQUSED_FULL
#define RND KIT_SEQUSED_RANDOM

/* Columns: {name, B, Hq, Hkv, Sq, Sk, D, c = causal, dtype}, q = quick, window
 * left/right, softcap, vl = varlen, layout, scale, in = input_scale; the
 * forward-only rows last add page (page size, 0 dense) and seqused_k. */
static const check_named k_named[] = {
    /* name                       B  Hq  Hkv  Sq    Sk     D    c  dtype           q  wl   wr  cap  vl  lay   scale  in */
    /* The benchmark shapes (full where the reference is fast enough) */
    {{"mission",                  1, 8,  8,   512,  512,   64,  0, F16},           1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"mission-causal",           1, 8,  8,   512,  512,   64,  1, F16},           1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"s512-d64/small",           1, 4,  4,   512,  512,   64,  0, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"s2k-d128/small",           1, 1,  1,   1024, 1024,  128, 0, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"s2k-d128-causal/small",    1, 2,  2,   1024, 1024,  128, 1, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"s8k-d128/sq128",           1, 1,  1,   128,  8192,  128, 0, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"s8k-d128-causal/sq128",    1, 2,  2,   128,  8192,  128, 1, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"s16k-d64/sq64",            1, 2,  2,   64,   16384, 64,  0, F16},           0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"s4k-d256/small",           1, 1,  1,   512,  512,   256, 0, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"gqa-prefill/small",        1, 8,  2,   512,  512,   128, 1, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"gqa-decode/b4",            4, 32, 8,   1,    8192,  128, 0, BF16},          1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"gqa-train/small",          2, 8,  2,   384,  384,   128, 1, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    /* sequence lengths */
    {{"seqlen-1",                 2, 4,  4,   1,    1,     64,  0, F16},           1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"seqlen-17",                1, 4,  2,   17,   17,    64,  0, F16},           1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"seqlen-17-causal-d96",     1, 4,  2,   17,   17,    96,  1, BF16},          1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"seqlen-1000",              1, 2,  1,   1000, 1000,  64,  0, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"seqlen-1000-causal",       1, 2,  2,   1000, 1000,  128, 1, F16},           0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"sq<sk-causal",             2, 4,  4,   100,  300,   64,  1, F16},           1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"sq>sk-causal(empty-rows)", 2, 4,  4,   300,  100,   64,  1, F16},           1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"decode-causal-sk777",      1, 8,  8,   1,    777,   128, 1, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    /* windows */
    {{"window-64-0",              1, 4,  4,   400,  400,   64,  0, F16},           1, 64,  0,  0,   0,  BSHD, 0,     0},
    {{"window-32-32",             1, 4,  2,   400,  400,   128, 0, BF16},          0, 32,  32, 0,   0,  BSHD, 0,     0},
    {{"window-left-100",          1, 2,  2,   300,  500,   64,  0, F16},           0, 100, -1, 0,   0,  BSHD, 0,     0},
    {{"window-right-16-f32",      1, 2,  2,   300,  300,   64,  0, F32},           0, -1,  16, 0,   0,  BSHD, 0,     0},
    {{"window-sq>sk(empty-rows)", 1, 2,  2,   300,  100,   64,  0, F16},           1, 10,  10, 0,   0,  BSHD, 0,     0},
    {{"causal-window-128",        1, 4,  4,   600,  600,   64,  1, BF16},          0, 128, -1, 0,   0,  BSHD, 0,     0},
    /* softcap, scale, large inputs */
    {{"softcap-30",               1, 4,  4,   256,  256,   64,  0, F16},           1, -1,  -1, 30,  0,  BSHD, 0,     4},
    {{"softcap-50-causal-bf16",   1, 4,  2,   300,  300,   128, 1, BF16},          0, -1,  -1, 50,  0,  BSHD, 0,     4},
    {{"scale-0.5",                1, 4,  4,   256,  256,   64,  0, F16},           0, -1,  -1, 0,   0,  BSHD, 0.5f,  0},
    {{"large-inputs-x8",          1, 4,  4,   256,  256,   64,  0, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     8},
    /* GQA / MQA */
    {{"gqa-4",                    2, 8,  2,   200,  200,   64,  0, F16},           1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"gqa-8-causal",             1, 16, 2,   300,  300,   128, 1, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"mqa",                      1, 8,  1,   256,  256,   64,  0, F16},           0, -1,  -1, 0,   0,  BSHD, 0,     0},
    /* varlen (kit: random lengths, some sequences empty) */
    {{"varlen-empty-seqs",        5, 4,  4,   300,  300,   64,  0, F16},           1, -1,  -1, 0,   1,  BSHD, 0,     0},
    {{"varlen-causal-gqa",        6, 8,  2,   257,  300,   128, 1, BF16},          0, -1,  -1, 0,   1,  BSHD, 0,     0},
    {{"varlen-window-32-0",       4, 4,  4,   200,  200,   64,  0, F16},           0, 32,  0,  0,   1,  BSHD, 0,     0},
    /* layouts */
    {{"layout-bhsd",              2, 4,  4,   200,  300,   64,  0, F16},           1, -1,  -1, 0,   0,  BHSD, 0,     0},
    {{"layout-bhsd-causal-gqa",   1, 8,  2,   300,  300,   128, 1, BF16},          0, -1,  -1, 0,   0,  BHSD, 0,     0},
    {{"layout-padded",            2, 4,  2,   200,  200,   64,  0, F16},           1, -1,  -1, 0,   0,  PAD,  0,     0},
    {{"layout-padded-varlen",     3, 4,  4,   200,  200,   64,  0, BF16},          0, -1,  -1, 0,   1,  PAD,  0,     0},
    /* dtypes and head dims */
    {{"f32-d64",                  1, 4,  4,   256,  256,   64,  0, F32},           1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"f32-causal-d128",          1, 2,  2,   300,  300,   128, 1, F32},           0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"d32",                      1, 4,  4,   256,  256,   32,  0, F16},           0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"d80",                      1, 2,  2,   128,  128,   80,  0, F16},           0, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"d256-causal",              1, 2,  2,   256,  256,   256, 1, BF16},          0, -1,  -1, 0,   0,  BSHD, 0,     0},
    /* FP8 (forward only): descales per (batch, kv head), the amax outputs; out bf16 under FP8 q */
    {{"fp8-e4m3",                 1, 2,  2,   64,   64,    64,  0, FC_DTYPE_E4M3}, 1, -1,  -1, 0,   0,  BSHD, 0,     0},
    {{"fp8-e5m2-causal-gqa",      2, 8,  2,   130,  130,   128, 1, FC_DTYPE_E5M2}, 0, -1,  -1, 0,   0,  BHSD, 0,     0},
    {{"fp8-e4m3-varlen-softcap",  4, 4,  2,   100,  120,   64,  0, FC_DTYPE_E4M3}, 0, -1,  -1, 30,  1,  BSHD, 0,     0},
    /* paged KV cache (shuffled pages, spare ones) and seqused_k: forward only                            page  used */
    {{"paged-decode-p16",         4, 32, 8,   1,    1000,  128, 0, BF16},          1, -1,  -1, 0,   0,  BSHD, 0,     0, 16,  RND},
    {{"paged-spec-p3-causal",     3, 8,  2,   4,    500,   64,  1, F16},           1, -1,  -1, 0,   0,  BHSD, 0,     0, 3,   RND},
    {{"paged-chunk-p64-causal",   2, 8,  2,   128,  640,   128, 1, BF16},          0, -1,  -1, 0,   0,  PAD,  0,     0, 64,  FULL},
    {{"paged-p1-window-32-0",     2, 4,  4,   8,    300,   64,  0, F16},           0, 32,  0,  0,   0,  BSHD, 0,     0, 1,   RND},
    {{"paged-p256-softcap-f32",   2, 4,  1,   2,    700,   64,  0, F32},           0, -1,  -1, 30,  0,  BHSD, 0,     0, 256, FULL},
    {{"seqused-dense-decode",     4, 8,  2,   1,    800,   128, 0, BF16},          1, -1,  -1, 0,   0,  BSHD, 0,     0, 0,   RND},
    /* an FP8 K/V cache under bf16 / f16 q                                                                     kv8 */
    {{"fp8kv-e4m3-paged-decode",  4, 32, 8,   1,    1000,  128, 0, BF16},          1, -1,  -1, 0,   0,  BSHD, 0,     0, 16,  RND, FC_DTYPE_E4M3},
    {{"fp8kv-e5m2-causal",        1, 8,  2,   200,  300,   64,  1, F16},           0, -1,  -1, 0,   0,  BHSD, 0,     0, 0,   0,   FC_DTYPE_E5M2},
};
#define NUM_NAMED ((int)(sizeof(k_named) / sizeof(k_named[0])))

/* The fp64 reference runs at roughly a GFLOP/s: random configurations stay
 * under this many nominal FLOPs so a seed costs a fraction of a second. */
#define RANDOM_FLOP_BUDGET 1.5e8

typedef struct check_case {
    char name[48];
    kit_shape s;
    uint64_t seed;
} check_case;

/* An FP8 case (FP8 q, or fp8_kv): bf16 out under FP8 q, descales per
 * (batch, kv head) and the amax outputs; a plain one: none of that. */
static void fp8_fields(kit_shape *s)
{
    const int q8 = s->dtype == FC_DTYPE_E4M3 || s->dtype == FC_DTYPE_E5M2;
    s->fp8_out = q8 ? FC_DTYPE_BF16 : FC_DTYPE_F32;
    s->descale = q8 || s->fp8_kv ? 2 : 0;
    s->amax = q8; /* (FP8 q runs on the CPU alone; the CUDA kernels write no amax yet) */
}

static kit_shape shape_of(const check_named *n)
{
    kit_shape s = cli_shape_from_named(&n->dims);
    s.window_left = n->wl;
    s.window_right = n->wr;
    s.softcap = n->softcap;
    s.scale = n->scale;
    s.varlen = n->varlen;
    s.layout = n->layout;
    s.want_lse = 1;
    s.input_scale = n->input_scale;
    s.page_size = n->page;
    s.seqused = n->used;
    s.fp8_kv = n->kv8;
    fp8_fields(&s);
    return s;
}

/* 1 if s runs the forward only (a paged cache, seqused_k, FP8). */
static int forward_only(const kit_shape *s)
{
    return s->page_size > 0 || s->seqused != KIT_SEQUSED_NONE || s->fp8_kv || s->descale;
}

static int pick(uint64_t *rng, int n) { return (int)(kit_rand_u64(rng) % (uint64_t)n); }

static int rand_len(uint64_t *rng)
{
    int r = pick(rng, 10);
    if (r == 0) return 1;                  /* decode-like */
    if (r < 4) return 1 + pick(rng, 64);   /* shorter than one tile */
    return 1 + pick(rng, 400);             /* a few tiles, ragged end */
}

/* A random configuration from seed: every option, within the FLOP budget. */
static kit_shape random_shape(uint64_t seed)
{
    static const int dims[] = {32, 64, 64, 96, 128, 128, 256};
    static const fc_dtype dts[] = {FC_DTYPE_F16, FC_DTYPE_BF16, FC_DTYPE_F32};
    /* scramble the seed: splitmix streams of seeds s and s+1 started from
     * s*golden would be the same stream shifted by one draw */
    uint64_t t = seed ^ 0xC2B2AE3D27D4EB4Full;
    uint64_t rng = kit_rand_u64(&t);
    kit_shape s;
    memset(&s, 0, sizeof(s));
    s.batch = 1 + pick(&rng, 3);
    s.heads_kv = 1 << pick(&rng, 3);
    s.heads_q = s.heads_kv << pick(&rng, 3);
    s.seqlen_q = rand_len(&rng);
    s.seqlen_k = pick(&rng, 4) == 0 ? s.seqlen_q : rand_len(&rng);
    s.head_dim = dims[pick(&rng, (int)(sizeof(dims) / sizeof(dims[0])))];
    s.dtype = dts[pick(&rng, 3)];
    s.causal = pick(&rng, 10) < 3;
    s.window_left = s.window_right = -1;
    if (pick(&rng, 10) < 2) {
        s.window_left = pick(&rng, 3) == 0 ? -1 : pick(&rng, s.seqlen_k + 1);
        if (!s.causal) s.window_right = pick(&rng, 3) == 0 ? -1 : pick(&rng, 65);
    }
    if (pick(&rng, 100) < 15) s.softcap = 10.0f + (float)pick(&rng, 41);
    if (pick(&rng, 10) < 2) s.scale = (float)(0.05 + 0.45 * kit_rand_uniform(&rng));
    if (pick(&rng, 10) < 2) s.input_scale = 2.0f + (float)pick(&rng, 5);
    s.varlen = pick(&rng, 10) < 2;
    if (s.varlen) s.batch += 2;
    s.layout = (kit_layout)pick(&rng, 3);
    s.want_lse = pick(&rng, 10) < 8;
    /* drawn last, so every earlier field is what the seed always gave */
    if (!s.varlen && pick(&rng, 10) < 2) {
        static const int pages[] = {1, 3, 16, 64, 256};
        s.page_size = pick(&rng, 4) ? pages[pick(&rng, 5)] : 0;
        s.seqused = s.page_size ? (kit_seqused)pick(&rng, 3) : pick(&rng, 2) ? KIT_SEQUSED_RANDOM : KIT_SEQUSED_FULL;
    }
    while (kit_flops_nominal(&s) > RANDOM_FLOP_BUDGET) {
        if (s.seqlen_q >= s.seqlen_k && s.seqlen_q > 1) s.seqlen_q = (s.seqlen_q + 1) / 2;
        else if (s.seqlen_k > 1) s.seqlen_k = (s.seqlen_k + 1) / 2;
        else if (s.heads_q > s.heads_kv) s.heads_q /= 2;
        else break;
    }
    return s;
}

static void describe(const kit_shape *s, char *buf, size_t n)
{
    int k = snprintf(buf, n, "B=%d Hq=%d Hkv=%d Sq=%d Sk=%d D=%d %s%s", s->batch, s->heads_q, s->heads_kv,
                     s->seqlen_q, s->seqlen_k, s->head_dim, kit_dtype_name(s->dtype), s->causal ? " causal" : "");
    if (k < 0 || (size_t)k >= n) return;
    if (s->window_left >= 0 || s->window_right >= 0)
        k += snprintf(buf + k, n - (size_t)k, " window=(%d,%d)", s->window_left, s->window_right);
    if ((size_t)k < n && s->softcap > 0) k += snprintf(buf + k, n - (size_t)k, " softcap=%g", s->softcap);
    if ((size_t)k < n && s->scale > 0) k += snprintf(buf + k, n - (size_t)k, " scale=%g", s->scale);
    if ((size_t)k < n && s->input_scale > 0) k += snprintf(buf + k, n - (size_t)k, " inputs*%g", s->input_scale);
    if ((size_t)k < n && s->varlen) k += snprintf(buf + k, n - (size_t)k, " varlen");
    if ((size_t)k < n && s->page_size) k += snprintf(buf + k, n - (size_t)k, " paged=%d", s->page_size);
    if ((size_t)k < n && s->seqused)
        k += snprintf(buf + k, n - (size_t)k, " seqused_k=%s", s->seqused == KIT_SEQUSED_FULL ? "seqlen_k" : "random");
    if ((size_t)k < n && s->descale)
        k += snprintf(buf + k, n - (size_t)k, " k/v %s out %s descales", kit_dtype_name(kit_kv_dtype(s)),
                      kit_dtype_name(kit_out_dtype(s)));
    if ((size_t)k < n && s->append)
        k += snprintf(buf + k, n - (size_t)k, " append=%d rotary=%d%s", s->append, s->rotary_dim,
                      s->rotary_interleaved ? " interleaved" : "");
    if ((size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, " %s%s", kit_layout_name(s->layout), s->want_lse ? " lse" : "");
}

static void help(void)
{
    printf("usage: flashcore check [--bwd] [--quick] [--seeds N] [--backend B[,B...]] [--dtype f32|f16|bf16]\n"
           "                       [--filter TEXT] [--page-size N] [--append N] [--threads N] [--list]\n\n"
           "Runs named shapes and random configurations on a backend and compares each\n"
           "output (and lse) with the fp64 reference through the per-dtype gates (max abs\n"
           "error, rel L2, %% elements over tolerance, unwritten elements, lse). With --bwd\n"
           "the same cases check the backward: the backend's forward gives out and lse,\n"
           "then its dq, dk, dv are compared with the fp64 reference backward on that out\n"
           "and lse through the backward's gates (error relative to the largest reference\n"
           "gradient, rel L2, %% elements over tolerance; every element written, nothing\n"
           "past it); the row shows the worst of dq, dk, dv.\n"
           "Named shapes: the benchmark shapes (scaled down where the reference would be\n"
           "too slow; the name says how) and edge shapes: seqlen 1/17/1000, sq != sk\n"
           "causal, windows, softcap, GQA 4/8, MQA, varlen with empty sequences, BHSD and\n"
           "padded layouts, f32/f16/bf16, head dims 32..256, paged KV caches and seqused_k\n"
           "(forward only: --bwd leaves those rows out and keeps its random cases dense).\n\n"
           "  --bwd            check the backward instead of the forward\n"
           "  --quick          a subset of the named shapes and 5 random configurations\n"
           "  --seeds N        random configurations rand-1..rand-N (default 20; 5 with --quick)\n"
           "  --backend B      auto (default: cuda if usable, else cpu), cpu, cuda, reference;\n"
           "                   several comma-separated: every case on each\n"
           "  --dtype T        run every case in this dtype instead of its own\n"
           "  --filter TEXT    only cases whose name contains TEXT\n"
           "  --page-size N    the forward through a paged KV cache: every case's k and v in\n"
           "                   pages of N keys (shuffled, with spare pages), seqused_k = seqlen_k\n"
           "                   unless the case has its own; varlen cases are left out\n"
           "  --append N       the forward with the append step: N new keys (k_new, v_new) per\n"
           "                   sequence written into the cache after seqused_k, q and k_new\n"
           "                   rotated (RoPE over the head dim); varlen cases and caches shorter\n"
           "                   than N are left out; with --page-size, into the pages\n"
           "  --threads N      CPU worker threads (default 0 = one per core)\n"
           "  --list           print the selected cases and exit\n\n"
           "A combination the library does not support (FC_ERR_UNSUPPORTED) is a SKIP with\n"
           "the library's message, not a failure. Output: one row per case and backend,\n"
           "then '(K skipped)' and 'N passed, M failed'. Exit status 1 if any case failed.\n");
}

#define MAX_BACKENDS 4

typedef struct check_opts {
    fc_backend backends[MAX_BACKENDS];
    int num_backends;
    long long seeds, threads, page, append;
    int quick, list, have_dtype, bwd;
    fc_dtype dtype;
    const char *filter;
} check_opts;

/* "cpu,cuda" -> backends; -1 with a message on error. */
static int parse_backends(const char *v, check_opts *o)
{
    o->num_backends = 0;
    for (;;) {
        char name[32];
        size_t len = strcspn(v, ",");
        if (len == 0 || len >= sizeof(name) || o->num_backends == MAX_BACKENDS) {
            fprintf(stderr, "flashcore check: --backend: expected up to %d comma-separated backends\n", MAX_BACKENDS);
            return -1;
        }
        memcpy(name, v, len);
        name[len] = '\0';
        if (cli_parse_backend("check", name, &o->backends[o->num_backends++])) return -1;
        if (!v[len]) return 0;
        v += len + 1; /* past the comma: a name must follow */
    }
}

/* 0, or the exit status (usage error, or --help done). */
static int parse_opts(int argc, char **argv, check_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->backends[0] = FC_BACKEND_AUTO;
    o->num_backends = 1;
    o->seeds = -1;
    o->dtype = FC_DTYPE_F16;
    cli_args a;
    cli_args_init(&a, "check", argc, argv);
    for (const char *arg; (arg = cli_next(&a));) {
        if (cli_is(&a, arg, "--help") || cli_is(&a, arg, "-h")) {
            help();
            return -1;
        } else if (cli_is(&a, arg, "--quick")) {
            if (cli_no_value(&a, arg)) return CLI_EXIT_USAGE;
            o->quick = 1;
        } else if (cli_is(&a, arg, "--list")) {
            if (cli_no_value(&a, arg)) return CLI_EXIT_USAGE;
            o->list = 1;
        } else if (cli_is(&a, arg, "--bwd")) {
            if (cli_no_value(&a, arg)) return CLI_EXIT_USAGE;
            o->bwd = 1;
        } else if (cli_is(&a, arg, "--seeds")) {
            if (cli_int(&a, arg, 0, 100000, &o->seeds)) return CLI_EXIT_USAGE;
        } else if (cli_is(&a, arg, "--threads")) {
            if (cli_int(&a, arg, 0, 4096, &o->threads)) return CLI_EXIT_USAGE;
        } else if (cli_is(&a, arg, "--backend")) {
            const char *v = cli_value(&a, arg);
            if (!v || parse_backends(v, o)) return CLI_EXIT_USAGE;
        } else if (cli_is(&a, arg, "--dtype")) {
            const char *v = cli_value(&a, arg);
            if (!v) return CLI_EXIT_USAGE;
            if (kit_dtype_parse(v, &o->dtype)) {
                fprintf(stderr, "flashcore check: --dtype: expected f32, f16 or bf16, got '%s'\n", v);
                return CLI_EXIT_USAGE;
            }
            o->have_dtype = 1;
        } else if (cli_is(&a, arg, "--filter")) {
            if (!(o->filter = cli_value(&a, arg))) return CLI_EXIT_USAGE;
        } else if (cli_is(&a, arg, "--page-size")) {
            if (cli_int(&a, arg, 1, 1 << 20, &o->page)) return CLI_EXIT_USAGE;
        } else if (cli_is(&a, arg, "--append")) {
            if (cli_int(&a, arg, 1, 1 << 16, &o->append)) return CLI_EXIT_USAGE;
        } else {
            return cli_unknown(&a, arg);
        }
    }
    if (o->bwd && (o->page || o->append)) {
        fprintf(stderr, "flashcore check: --%s: the backward takes no %s (forward only)\n",
                o->page ? "page-size" : "append", o->page ? "paged cache" : "append step");
        return CLI_EXIT_USAGE;
    }
    if (o->seeds < 0) o->seeds = o->quick ? 5 : 20;
    return 0;
}

/* Adds the case unless the options leave it out: the backward has no paged
 * form (named forward-only rows are dropped, random ones made dense), and
 * --page-size puts every dense case's k/v through pages of that size
 * (seqused_k seqlen_k unless the case draws its own; varlen ones drop). */
static void add_case(const check_opts *o, check_case *cases, int *n, const char *name, kit_shape s, uint64_t seed,
                     int named)
{
    if (o->bwd && forward_only(&s)) {
        if (named) return;
        s.page_size = 0;
        s.seqused = KIT_SEQUSED_NONE;
    }
    if ((o->page || o->append) && s.varlen) return;
    if (o->append && forward_only(&s) && s.descale) return; /* the append writes no FP8 cache */
    if (o->append > s.seqlen_k) return; /* no room in the cache */
    check_case *c = &cases[(*n)++];
    snprintf(c->name, sizeof(c->name), "%s", name);
    if (o->page) {
        snprintf(c->name, sizeof(c->name), "%s+p%lld", name, o->page);
        s.page_size = (int)o->page;
        if (s.seqused == KIT_SEQUSED_NONE) s.seqused = KIT_SEQUSED_FULL;
    }
    if (o->append) { /* rotary over the whole head dim, the pairing by seed */
        size_t k = strlen(c->name);
        snprintf(c->name + k, sizeof(c->name) - k, "+a%lld", o->append);
        kit_shape_append(&s, (int)o->append, (int)(seed & 1));
    }
    c->s = s;
    c->seed = seed;
}

/* The selected cases (named, then random); *n of them, NULL on no memory. */
static check_case *select_cases(const check_opts *o, int *n)
{
    int cap = NUM_NAMED + (int)o->seeds;
    check_case *cases = calloc((size_t)cap, sizeof(*cases));
    *n = 0;
    if (!cases) return NULL;
    for (int i = 0; i < NUM_NAMED; i++) {
        if (o->quick && !k_named[i].quick) continue;
        if (o->filter && !strstr(k_named[i].dims.name, o->filter)) continue;
        add_case(o, cases, n, k_named[i].dims.name, shape_of(&k_named[i]), 1000 + (uint64_t)i, 1);
    }
    for (long long i = 1; i <= o->seeds; i++) {
        char name[32];
        snprintf(name, sizeof(name), "rand-%lld", i);
        if (o->filter && !strstr(name, o->filter)) continue;
        add_case(o, cases, n, name, random_shape((uint64_t)i), (uint64_t)i, 0);
    }
    for (int i = 0; i < *n; i++) {
        cases[i].s.name = cases[i].name;
        if (o->have_dtype) { /* (an f32/f16/bf16 type: FP8 rows become plain ones) */
            cases[i].s.dtype = o->dtype;
            cases[i].s.fp8_kv = cases[i].s.descale = 0;
            fp8_fields(&cases[i].s);
        }
    }
    return cases;
}

/* The row's error figures: the forward's, or the worst gradient's. 0 if none. */
static int row_figures(const cli_check_result *r, int bwd, double v[3])
{
    if (!bwd) {
        v[0] = r->m.max_abs, v[1] = r->m.rel_l2, v[2] = r->m.pct_bad;
        return r->m.n > 0;
    }
    int64_t n = 0;
    v[0] = v[1] = v[2] = 0;
    for (int i = 0; i < 3; i++) {
        n += r->bm[i].n;
        v[0] = r->bm[i].max_rel > v[0] ? r->bm[i].max_rel : v[0];
        v[1] = r->bm[i].rel_l2 > v[1] ? r->bm[i].rel_l2 : v[1];
        v[2] = r->bm[i].pct_bad > v[2] ? r->bm[i].pct_bad : v[2];
    }
    return n > 0;
}

static void print_result(const check_case *cc, fc_backend be, int bwd, const cli_check_result *r)
{
    char kern[160];
    double v[3];
    snprintf(kern, sizeof(kern), "%s/%s", cli_backend_name(be), r->info.name[0] ? r->info.name : "-");
    const char *verdict = r->verdict == CLI_PASS ? "PASS" : r->verdict == CLI_SKIP ? "SKIP" : "FAIL";
    if (row_figures(r, bwd, v))
        printf("%-26s %-36s %-5s %10.3e %10.3e %7.3f  %s\n", cc->name, kern, kit_dtype_name(cc->s.dtype), v[0], v[1],
               v[2], verdict);
    else
        printf("%-26s %-36s %-5s %10s %10s %7s  %s\n", cc->name, kern, kit_dtype_name(cc->s.dtype), "-", "-", "-",
               verdict);
    if (r->verdict != CLI_PASS) {
        char d[256];
        describe(&cc->s, d, sizeof(d));
        printf("    %s: %s\n    case: %s (seed %llu)\n", verdict, r->note, d, (unsigned long long)cc->seed);
    }
    fflush(stdout);
}

/* One case on one backend, its inputs built from the case's seed. */
static void check_one(fc_context *ctx, const check_case *cc, fc_backend be, int bwd, cli_check_result *r)
{
    kit_bwd_case b;
    memset(&b, 0, sizeof(b));
    if (bwd ? kit_bwd_case_init(&b, &cc->s, cc->seed) : kit_case_init(&b.c, &cc->s, cc->seed)) {
        memset(r, 0, sizeof(*r));
        r->verdict = CLI_FAIL;
        snprintf(r->note, sizeof(r->note), "case init failed (out of host memory or bad shape)");
        return;
    }
    if (bwd) {
        /* varlen: an empty sequence on each side and tokens past the last
         * offset, which the backward must leave alone */
        kit_bwd_varlen_edges(&b);
        cli_check_bwd_case(ctx, &b, be, r);
    } else {
        cli_check_case(ctx, &b.c, be, r);
    }
    kit_bwd_case_free(&b);
}

/* Runs every case on every backend; the number that failed. */
static int run_cases(fc_context *ctx, const check_opts *o, const check_case *cases, int n)
{
    printf("flashcore %s check%s: %d cases on backend", fc_version_string(), o->bwd ? " --bwd" : "", n);
    for (int j = 0; j < o->num_backends; j++) printf("%s %s", j ? "," : "", cli_backend_name(o->backends[j]));
    printf(", vs the fp64 reference%s\n", o->bwd ? " backward" : "");
    printf("%-26s %-36s %-5s %10s %10s %7s  %s\n", "name", "backend/kernel", "dtype", o->bwd ? "max_rel" : "max_abs",
           "rel_l2", "%bad", "result");
    int passed = 0, failed = 0, skipped = 0;
    double t0 = kit_now();
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < o->num_backends; j++) {
            cli_check_result r;
            cli_progress(i * o->num_backends + j + 1, n * o->num_backends, cases[i].name);
            check_one(ctx, &cases[i], o->backends[j], o->bwd, &r);
            cli_progress_done();
            print_result(&cases[i], o->backends[j], o->bwd, &r);
            passed += r.verdict == CLI_PASS;
            skipped += r.verdict == CLI_SKIP;
            failed += r.verdict == CLI_FAIL;
        }
    }
    printf("(%d skipped, %.1f s)\n%d passed, %d failed\n", skipped, kit_now() - t0, passed, failed);
    return failed;
}

int cli_check(int argc, char **argv)
{
    check_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc < 0 ? CLI_EXIT_OK : rc;
    int n = 0;
    check_case *cases = select_cases(&o, &n);
    if (!cases) {
        fprintf(stderr, "flashcore check: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    if (n == 0) {
        fprintf(stderr, "flashcore check: no case selected%s%s%s\n", o.filter ? " (--filter '" : "",
                o.filter ? o.filter : "", o.filter ? "')" : "");
        free(cases);
        return CLI_EXIT_USAGE;
    }
    if (o.list) {
        char d[256];
        for (int i = 0; i < n; i++) {
            describe(&cases[i].s, d, sizeof(d));
            printf("%-26s %s\n", cases[i].name, d);
        }
        free(cases);
        return CLI_EXIT_OK;
    }
    fc_context *ctx = cli_context("check", (int)o.threads);
    rc = ctx ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    for (int j = 0; j < o.num_backends && rc == CLI_EXIT_OK; j++) {
        o.backends[j] = cli_resolve_backend(o.backends[j]);
        if (cli_require_backend("check", ctx, o.backends[j])) rc = CLI_EXIT_FAIL;
    }
    if (rc == CLI_EXIT_OK && run_cases(ctx, &o, cases, n)) rc = CLI_EXIT_FAIL;
    fc_context_free(ctx);
    free(cases);
    return rc;
}
