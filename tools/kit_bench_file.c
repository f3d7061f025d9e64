/*
 * kit_bench_file.c -- the bench result files that `flashcore bench` and
 * bench/peers.py write and `flashcore compare` reads (kit_json.h), read
 * through the kit's JSON reader.
 */
#include "kit_json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kit_dtype_normalize(const char *name)
{
    static const struct { const char *from, *to; } map[] = {
        {"float16", "f16"}, {"fp16", "f16"}, {"f16", "f16"}, {"half", "f16"},
        {"bfloat16", "bf16"}, {"bf16", "bf16"},
        {"float32", "f32"}, {"fp32", "f32"}, {"f32", "f32"}, {"float", "f32"},
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(name, map[i].from) == 0) return map[i].to;
    return name;
}

typedef struct bf_ctx {
    char *err;
    size_t err_len;
    char where[64]; /* "rows[3]" or "rows[3].torch-cudnn" */
    char pass[4];   /* the file's: meta.pass, else "fwd" */
} bf_ctx;

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

/* Optional string member: absent or null is fine; another type is an error. */
static int bf_str(bf_ctx *c, const kit_json *o, const char *key, char *dst, size_t n)
{
    const kit_json *v = kit_json_get(o, key);
    if (!v || v->type == KIT_JSON_NULL) return 0;
    if (v->type != KIT_JSON_STRING) {
        snprintf(c->err, c->err_len, "%s.%s: expected a string", c->where, key);
        return -1;
    }
    copy_str(dst, n, v->string);
    return 0;
}

/* Optional number member (null = unknown). */
static int bf_num(bf_ctx *c, const kit_json *o, const char *key, double *dst)
{
    const kit_json *v = kit_json_get(o, key);
    if (!v || v->type == KIT_JSON_NULL) return 0;
    if (v->type != KIT_JSON_NUMBER) {
        snprintf(c->err, c->err_len, "%s.%s: expected a number", c->where, key);
        return -1;
    }
    *dst = v->number;
    return 0;
}

/* A "pass" member of o (a row or meta) into dst: absent keeps dst. */
static int bf_pass(bf_ctx *c, const kit_json *o, char *dst, size_t n)
{
    char v[8] = "";
    if (bf_str(c, o, "pass", v, sizeof(v))) return -1;
    if (!v[0]) return 0;
    if (strcmp(v, "fwd") != 0 && strcmp(v, "bwd") != 0) {
        snprintf(c->err, c->err_len, "%s.pass: expected \"fwd\" or \"bwd\", got \"%s\"", c->where, v);
        return -1;
    }
    copy_str(dst, n, v);
    return 0;
}

static int bf_dim(bf_ctx *c, const kit_json *o, const char *key, int *dst)
{
    double v = NAN;
    if (bf_num(c, o, key, &v)) return -1;
    if (isnan(v)) return 0;
    if (v < 0 || v > 2147483647.0 || v != floor(v)) {
        snprintf(c->err, c->err_len, "%s.%s: expected a non-negative integer, got %g", c->where, key, v);
        return -1;
    }
    *dst = (int)v;
    return 0;
}

/* Timing fields of a flat row or of one system's entry in an anchor row. */
static int bf_timing(bf_ctx *c, const kit_json *o, kit_bench_row *row)
{
    if (bf_num(c, o, "p50_us", &row->p50_us) || bf_num(c, o, "p90_us", &row->p90_us) ||
        bf_num(c, o, "mean_us", &row->mean_us) || bf_num(c, o, "std_us", &row->std_us) ||
        bf_num(c, o, "graph_us", &row->graph_us) || bf_num(c, o, "tflops", &row->tflops))
        return -1;
    /* the peers' names for the same quantities */
    if (isnan(row->p50_us) && bf_num(c, o, "us", &row->p50_us)) return -1;
    if (isnan(row->graph_us) && bf_num(c, o, "us_graph", &row->graph_us)) return -1;
    double it = NAN;
    if (bf_num(c, o, "iters", &it)) return -1;
    row->iters = isnan(it) ? -1 : (int64_t)it;
    char check[16] = "";
    if (bf_str(c, o, "check", check, sizeof(check))) return -1;
    row->check_failed = check[0] && strcmp(check, "ok") != 0;
    return 0;
}

/* An anchor-style system entry: an object holding a time or an error. */
static int is_system_entry(const kit_json *v)
{
    return v->type == KIT_JSON_OBJECT && (kit_json_get(v, "us") || kit_json_get(v, "p50_us") ||
                                          kit_json_get(v, "us_graph") || kit_json_get(v, "error"));
}

static int bf_push(kit_bench_file *f, int *cap, const kit_bench_row *row, bf_ctx *c)
{
    if (f->n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        kit_bench_row *r = realloc(f->rows, (size_t)nc * sizeof(*r));
        if (!r) {
            snprintf(c->err, c->err_len, "out of memory");
            return -1;
        }
        f->rows = r;
        *cap = nc;
    }
    f->rows[f->n++] = *row;
    return 0;
}

static int bf_row(bf_ctx *c, const kit_json *o, kit_bench_file *f, int *cap)
{
    if (o->type != KIT_JSON_OBJECT) {
        snprintf(c->err, c->err_len, "%s: expected an object", c->where);
        return -1;
    }
    kit_bench_row base;
    memset(&base, 0, sizeof(base));
    base.B = base.Hq = base.Hkv = base.Sq = base.Sk = base.D = -1;
    base.causal = -1;
    base.iters = -1;
    base.p50_us = base.p90_us = base.mean_us = base.std_us = base.graph_us = base.tflops = NAN;

    const kit_json *shape = kit_json_get(o, "shape");
    if (!shape || shape->type != KIT_JSON_STRING || shape->string[0] == '\0') {
        snprintf(c->err, c->err_len, "%s: missing string \"shape\"", c->where);
        return -1;
    }
    copy_str(base.shape, sizeof(base.shape), shape->string);
    copy_str(base.pass, sizeof(base.pass), c->pass);
    char dtype[32] = "";
    if (bf_str(c, o, "system", base.system, sizeof(base.system)) ||
        bf_str(c, o, "backend", base.backend, sizeof(base.backend)) ||
        bf_str(c, o, "kernel", base.kernel, sizeof(base.kernel)) ||
        bf_str(c, o, "dtype", dtype, sizeof(dtype)) || bf_pass(c, o, base.pass, sizeof(base.pass)) ||
        bf_dim(c, o, "B", &base.B) ||
        bf_dim(c, o, "Hq", &base.Hq) || bf_dim(c, o, "Hkv", &base.Hkv) ||
        bf_dim(c, o, "Sq", &base.Sq) || bf_dim(c, o, "Sk", &base.Sk) || bf_dim(c, o, "D", &base.D))
        return -1;
    if (base.Sk < 0 && bf_dim(c, o, "Skv", &base.Sk)) return -1;
    copy_str(base.dtype, sizeof(base.dtype), kit_dtype_normalize(dtype));
    const kit_json *causal = kit_json_get(o, "causal");
    if (causal && causal->type == KIT_JSON_BOOL) base.causal = causal->boolean;
    else if (causal && causal->type == KIT_JSON_NUMBER) base.causal = causal->number != 0;
    else if (causal && causal->type != KIT_JSON_NULL) {
        snprintf(c->err, c->err_len, "%s.causal: expected a boolean", c->where);
        return -1;
    }
    if (!base.system[0] && base.backend[0])
        snprintf(base.system, sizeof(base.system), "flashcore-%s", base.backend);

    /* A flat row that recorded an error has no times to compare. */
    if (kit_json_get(o, "error") && !kit_json_get(o, "p50_us") && !kit_json_get(o, "us")) {
        f->n_errors++;
        return 0;
    }
    /* Anchor layout: no "system", one object member per system. */
    int nested = 0;
    char where[64];
    copy_str(where, sizeof(where), c->where);
    for (size_t i = 0; i < o->n && !kit_json_get(o, "system"); i++) {
        const kit_json *v = &o->items[i];
        if (!is_system_entry(v)) continue;
        nested = 1;
        snprintf(c->where, sizeof(c->where), "%.30s.%.30s", where, o->keys[i]);
        if (kit_json_get(v, "error")) {
            f->n_errors++;
            continue;
        }
        kit_bench_row row = base;
        copy_str(row.system, sizeof(row.system), o->keys[i]);
        if (bf_timing(c, v, &row)) return -1;
        if (bf_push(f, cap, &row, c)) return -1;
    }
    copy_str(c->where, sizeof(c->where), where);
    if (nested) return 0;
    if (bf_timing(c, o, &base)) return -1;
    return bf_push(f, cap, &base, c);
}

int kit_bench_file_parse(const char *text, size_t len, kit_bench_file *f, char *err,
                         size_t err_len)
{
    memset(f, 0, sizeof(*f));
    kit_json *root = NULL;
    char msg[300];
    if (kit_json_parse(text, len, &root, msg, sizeof(msg))) {
        snprintf(err, err_len, "malformed JSON: %s", msg);
        return -1;
    }
    bf_ctx c = {err, err_len, "", "fwd"};
    int cap = 0, rc = -1;
    const kit_json *rows = root;
    if (root->type == KIT_JSON_OBJECT) {
        rows = kit_json_get(root, "rows");
        const kit_json *meta = kit_json_get(root, "meta");
        const kit_json *dev = meta ? kit_json_get(meta, "device_name") : kit_json_get(root, "device");
        if (dev && dev->type == KIT_JSON_STRING) copy_str(f->device, sizeof(f->device), dev->string);
        const kit_json *sha = meta ? kit_json_get(meta, "git_sha") : NULL;
        if (sha && sha->type == KIT_JSON_STRING) copy_str(f->git_sha, sizeof(f->git_sha), sha->string);
        snprintf(c.where, sizeof(c.where), "meta");
        if (meta && meta->type == KIT_JSON_OBJECT && bf_pass(&c, meta, c.pass, sizeof(c.pass))) goto done;
    }
    if (!rows || rows->type != KIT_JSON_ARRAY) {
        snprintf(err, err_len, "not a bench file: expected an object with a \"rows\" array (or an array of rows)");
        goto done;
    }
    for (size_t i = 0; i < rows->n; i++) {
        snprintf(c.where, sizeof(c.where), "rows[%zu]", i);
        if (bf_row(&c, &rows->items[i], f, &cap)) goto done;
    }
    rc = 0;
done:
    kit_json_free(root);
    if (rc) kit_bench_file_free(f);
    return rc;
}

/* Upper bound on a file's size: bench files are kilobytes; this only stops
 * a wrong path (a disk image, /dev/zero) from eating memory. */
#define KIT_JSON_MAX_FILE (256u << 20)

/* Reads a whole file into a malloc'ed buffer. */
static int read_whole_file(const char *path, char **out, size_t *out_len, char *err, size_t err_len)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) { snprintf(err, err_len, "%s: out of memory", path); goto fail; }
    for (;;) {
        if (n == cap) {
            if (cap >= KIT_JSON_MAX_FILE) {
                snprintf(err, err_len, "%s: larger than %u MiB, not a bench file", path, KIT_JSON_MAX_FILE >> 20);
                goto fail;
            }
            char *b = realloc(buf, cap * 2);
            if (!b) { snprintf(err, err_len, "%s: out of memory", path); goto fail; }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) { snprintf(err, err_len, "%s: read error: %s", path, strerror(errno)); goto fail; }
    fclose(f);
    *out = buf;
    *out_len = n;
    return 0;
fail:
    free(buf);
    fclose(f);
    return -1;
}

int kit_bench_file_read(const char *path, kit_bench_file *f, char *err, size_t err_len)
{
    char *buf;
    size_t n;
    memset(f, 0, sizeof(*f));
    if (read_whole_file(path, &buf, &n, err, err_len)) return -1;
    char msg[400];
    int rc = kit_bench_file_parse(buf, n, f, msg, sizeof(msg));
    if (rc) snprintf(err, err_len, "%s: %s", path, msg);
    free(buf);
    return rc;
}

void kit_bench_file_free(kit_bench_file *f)
{
    free(f->rows);
    memset(f, 0, sizeof(*f));
}
