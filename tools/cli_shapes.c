/*
 * cli_shapes.c -- the benchmark shapes of docs/PERF.md by name, and the
 * parser of --custom shapes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define FWD CLI_SET_FWD
#define BWD CLI_SET_BWD

/* Names as in docs/PERF.md (the anchors prefix some with "seed-"/"fa3-";
 * compare matches those by dimensions). The backward's set is the prefill
 * shapes (a decode step has no backward) and two GQA training shapes:
 * a large one and a small decoder's step (bench/compiled.py's model; 32
 * key-block CTAs unless the group is split), which is in the forward's
 * set too (the model's attention call at inference). */
const cli_named_shape cli_bench_shapes[] = {
    /* name               B   Hq  Hkv  Sq     Sk     D    causal dtype         sets */
    {"mission",           1,  8,  8,   512,   512,   64,  0, FC_DTYPE_F16,  FWD | BWD},
    {"mission-causal",    1,  8,  8,   512,   512,   64,  1, FC_DTYPE_F16,  FWD | BWD},
    {"s512-d64",          32, 32, 32,  512,   512,   64,  0, FC_DTYPE_BF16, FWD | BWD},
    {"s2k-d128",          8,  16, 16,  2048,  2048,  128, 0, FC_DTYPE_BF16, FWD | BWD},
    {"s2k-d128-causal",   8,  16, 16,  2048,  2048,  128, 1, FC_DTYPE_BF16, FWD | BWD},
    {"s8k-d128",          2,  16, 16,  8192,  8192,  128, 0, FC_DTYPE_BF16, FWD | BWD},
    {"s8k-d128-causal",   2,  16, 16,  8192,  8192,  128, 1, FC_DTYPE_BF16, FWD | BWD},
    {"s16k-d64",          1,  32, 32,  16384, 16384, 64,  0, FC_DTYPE_F16,  FWD | BWD},
    {"s4k-d256",          4,  8,  8,   4096,  4096,  256, 0, FC_DTYPE_BF16, FWD | BWD},
    {"gqa-prefill",       1,  32, 8,   4096,  4096,  128, 1, FC_DTYPE_BF16, FWD | BWD},
    {"gqa-decode",        32, 32, 8,   1,     8192,  128, 0, FC_DTYPE_BF16, FWD},
    {"gqa-train",         4,  32, 8,   4096,  4096,  128, 1, FC_DTYPE_BF16, BWD},
    {"gqa-step",          4,  8,  2,   512,   512,   64,  1, FC_DTYPE_BF16, FWD | BWD},
};
const int cli_num_bench_shapes = (int)(sizeof(cli_bench_shapes) / sizeof(cli_bench_shapes[0]));

const cli_named_shape *cli_find_bench_shape(const char *name)
{
    for (int i = 0; i < cli_num_bench_shapes; i++)
        if (strcmp(cli_bench_shapes[i].name, name) == 0) return &cli_bench_shapes[i];
    return NULL;
}

kit_shape cli_shape_from_named(const cli_named_shape *n)
{
    kit_shape s;
    memset(&s, 0, sizeof(s));
    s.name = n->name;
    s.batch = n->B;
    s.heads_q = n->Hq;
    s.heads_kv = n->Hkv;
    s.seqlen_q = n->Sq;
    s.seqlen_k = n->Sk;
    s.head_dim = n->D;
    s.dtype = n->dtype;
    s.causal = n->causal;
    s.window_left = -1;
    s.window_right = -1; /* causal alone: the library folds it into window_right 0 */
    s.layout = KIT_LAYOUT_BSHD;
    return s;
}

/* "wl=N" / "wr=N" (a window edge, 0 to 2^30) or "softcap=X" (> 0): 0 when
 * tok is one of them (stored), -1 otherwise. */
static int option_field(const char *tok, long *wl, long *wr, double *softcap)
{
    char *end;
    if (strncmp(tok, "wl=", 3) == 0 || strncmp(tok, "wr=", 3) == 0) {
        errno = 0;
        const long x = strtol(tok + 3, &end, 10);
        if (errno || end == tok + 3 || *end || x < 0 || x > (1L << 30)) return -1;
        *(tok[1] == 'l' ? wl : wr) = x;
        return 0;
    }
    if (strncmp(tok, "softcap=", 8) == 0) {
        const double x = strtod(tok + 8, &end);
        if (end == tok + 8 || *end || !(x > 0) || x > 1e6) return -1;
        *softcap = x;
        return 0;
    }
    return -1;
}

/* The six leading dimensions B,Hq,Hkv,Sq,Sk,D into v; *rest past them
 * (after their comma). -1 (said why) on a bad field. */
static int custom_dims(const char *cmd, const char *spec, long v[6], const char **rest)
{
    static const char *dims[] = {"B", "Hq", "Hkv", "Sq", "Sk", "D"};
    const char *p = spec;
    for (int i = 0; i < 6; i++) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (*end == ',' && end[1] == '\0') {
            fprintf(stderr, "flashcore %s: --custom '%s': trailing ','\n", cmd, spec);
            return -1;
        }
        if (errno || end == p || x < 1 || x > (1L << 30) || (*end != ',' && !(*end == '\0' && i == 5))) {
            fprintf(stderr,
                    "flashcore %s: --custom '%s': field %d (%s) must be a positive integer; "
                    "expected B,Hq,Hkv,Sq,Sk,D[,causal][,dtype]\n",
                    cmd, spec, i + 1, dims[i]);
            return -1;
        }
        v[i] = x;
        p = *end ? end + 1 : end;
    }
    *rest = p;
    return 0;
}

/* The optional fields of a custom shape. */
typedef struct custom_opts {
    int causal;
    long wl, wr;
    double softcap;
    fc_dtype dt;
} custom_opts;

/* The optional fields after the dimensions, in any order: the causal
 * flag, window, softcap and dtype, into o. -1 (said why) on a bad one. */
static int custom_options(const char *cmd, const char *spec, const char *p, custom_opts *o)
{
    while (*p) {
        char tok[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof(tok)) {
            fprintf(stderr, "flashcore %s: --custom '%s': empty or overlong field\n", cmd, spec);
            return -1;
        }
        memcpy(tok, p, len);
        tok[len] = '\0';
        p += len;
        if (*p == ',' && !*++p) {
            fprintf(stderr, "flashcore %s: --custom '%s': trailing ','\n", cmd, spec);
            return -1;
        }
        if (strcmp(tok, "causal") == 0 || strcmp(tok, "1") == 0) o->causal = 1;
        else if (strcmp(tok, "nocausal") == 0 || strcmp(tok, "0") == 0) o->causal = 0;
        else if (option_field(tok, &o->wl, &o->wr, &o->softcap) == 0) continue;
        else if (kit_dtype_parse(tok, &o->dt) != 0) {
            fprintf(stderr,
                    "flashcore %s: --custom '%s': '%s' is neither causal/0/1, wl=N, wr=N, softcap=X nor a dtype "
                    "(f32, f16, bf16)\n",
                    cmd, spec, tok);
            return -1;
        }
    }
    return 0;
}

int cli_parse_custom(const char *cmd, const char *spec, kit_shape *s, char *name_buf, size_t n)
{
    long v[6];
    const char *rest;
    custom_opts o = {0, -1, -1, 0, FC_DTYPE_F16};
    memset(s, 0, sizeof(*s));
    if (custom_dims(cmd, spec, v, &rest) || custom_options(cmd, spec, rest, &o)) return -1;
    if (v[1] % v[2] != 0) {
        fprintf(stderr, "flashcore %s: --custom '%s': Hq (%ld) must be a multiple of Hkv (%ld)\n", cmd,
                spec, v[1], v[2]);
        return -1;
    }
    /* the kit sizes buffers in 64-bit element counts: keep every tensor far
     * from overflowing them (and from any memory a machine has) */
    double elems = (double)v[0] * (double)(v[3] > v[4] ? v[3] : v[4]) * (double)v[1] * (double)v[5];
    if (elems > 0x1p40) {
        fprintf(stderr, "flashcore %s: --custom '%s': %.3g elements per tensor is beyond any memory\n", cmd, spec,
                elems);
        return -1;
    }
    char extra[64] = "";
    if (o.wl >= 0 || o.wr >= 0) snprintf(extra, sizeof extra, "-w%ld:%ld", o.wl, o.wr);
    if (o.softcap > 0) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "-cap%g", o.softcap);
    snprintf(name_buf, n, "custom-%ldx%ldx%ld-q%ld-k%ld-d%ld%s%s-%s", v[0], v[1], v[2], v[3], v[4], v[5],
             o.causal ? "-causal" : "", extra, kit_dtype_name(o.dt));
    s->name = name_buf;
    s->batch = (int)v[0];
    s->heads_q = (int)v[1];
    s->heads_kv = (int)v[2];
    s->seqlen_q = (int)v[3];
    s->seqlen_k = (int)v[4];
    s->head_dim = (int)v[5];
    s->dtype = o.dt;
    s->causal = o.causal;
    s->window_left = (int)o.wl;
    s->window_right = (int)o.wr;
    s->softcap = (float)o.softcap;
    s->layout = KIT_LAYOUT_BSHD;
    return 0;
}
