/*
 * kit_json.h -- a small JSON writer and reader for the kit, and the bench
 * result file format that `flashcore bench` writes and `flashcore compare`
 * reads. Kept in the kit (not the CLI) so tests can exercise the exact code
 * the CLI runs. Not part of the public API.
 *
 * Writer: builds a document in a growable memory buffer; numbers are written
 * in the shortest form that reads back to the same double, non-finite numbers
 * as null, strings escaped per RFC 8259.
 * Reader (kit_json_read.c): the RFC 8259 grammar into a tree; malformed
 * input is rejected with "line L, column C: what was expected". String bytes
 * pass through unchecked; a \u escape of a surrogate half reads as U+FFFD
 * (the names compare reads are ASCII).
 * Writer: kit_json_write.c; bench files: kit_bench_file.c.
 */
#ifndef FC_KIT_JSON_H
#define FC_KIT_JSON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- writer ---------------------------------------------------------------- */

/* Nesting deeper than this is a misuse of the writer (it sets failed). */
#define KIT_JW_MAX_DEPTH 32

typedef struct kit_jw {
    char *buf;            /* NUL-terminated document so far (owned)          */
    size_t len, cap;
    int depth;
    int pretty;           /* 1: two-space indentation and newlines            */
    int failed;           /* out of memory or misuse: the document is invalid */
    unsigned char has_items[KIT_JW_MAX_DEPTH + 1]; /* per level: a value was written */
    unsigned char in_object[KIT_JW_MAX_DEPTH + 1]; /* per level: object (1) or array (0) */
    int after_key;        /* a key was written, its value comes next          */
} kit_jw;

void kit_jw_init(kit_jw *w, int pretty);
void kit_jw_free(kit_jw *w);
void kit_jw_object_begin(kit_jw *w);
void kit_jw_object_end(kit_jw *w);
void kit_jw_array_begin(kit_jw *w);
void kit_jw_array_end(kit_jw *w);
void kit_jw_key(kit_jw *w, const char *key);
void kit_jw_string(kit_jw *w, const char *s); /* s NULL writes null */
void kit_jw_number(kit_jw *w, double v);      /* NaN/Inf write null */
void kit_jw_int(kit_jw *w, int64_t v);
void kit_jw_bool(kit_jw *w, int v);
void kit_jw_null(kit_jw *w);
/* key + value in one call, for objects. */
void kit_jw_kv_string(kit_jw *w, const char *key, const char *s);
void kit_jw_kv_number(kit_jw *w, const char *key, double v);
void kit_jw_kv_int(kit_jw *w, const char *key, int64_t v);
void kit_jw_kv_bool(kit_jw *w, const char *key, int v);
/* The finished document (owned by w), or NULL if the writer failed or a
 * container is still open. */
const char *kit_jw_result(const kit_jw *w);

/* ---- reader ---------------------------------------------------------------- */

typedef enum kit_json_type {
    KIT_JSON_NULL = 0,
    KIT_JSON_BOOL,
    KIT_JSON_NUMBER,
    KIT_JSON_STRING,
    KIT_JSON_ARRAY,
    KIT_JSON_OBJECT
} kit_json_type;

/* Nesting deeper than this is rejected (guards the recursion on hostile input). */
#define KIT_JSON_MAX_DEPTH 64

typedef struct kit_json {
    kit_json_type type;
    int boolean;              /* KIT_JSON_BOOL                                  */
    double number;            /* KIT_JSON_NUMBER                                */
    char *string;             /* KIT_JSON_STRING: UTF-8, NUL-terminated         */
    size_t string_len;        /* bytes, without the NUL (strings may hold \u0000) */
    struct kit_json *items;   /* ARRAY/OBJECT: n values                         */
    char **keys;              /* OBJECT: n keys, parallel to items              */
    size_t n;
} kit_json;

/* Parse len bytes of text. On success *out receives a tree owned by the
 * caller (kit_json_free) and 0 is returned; on failure *out is NULL, err
 * holds "line L, column C: ..." and -1 is returned. */
int kit_json_parse(const char *text, size_t len, kit_json **out, char *err, size_t err_len);
void kit_json_free(kit_json *j);

/* Member of an object by key (first match), or NULL if j is not an object or
 * has no such key. */
const kit_json *kit_json_get(const kit_json *j, const char *key);

/* ---- bench result files ------------------------------------------------------ */

/* One timed configuration. Unknown numbers are NaN; unknown dims are -1. */
typedef struct kit_bench_row {
    char shape[64];
    char system[64];      /* "system" if present, else "flashcore-<backend>", else "" */
    char backend[32];
    char kernel[96];
    char dtype[16];       /* normalised: "f16", "bf16", "f32" or as written   */
    char pass[4];         /* "fwd" or "bwd": the row's "pass", else the file's
                           * meta.pass, else "fwd" (files from before the
                           * backward timed the forward)                     */
    int B, Hq, Hkv, Sq, Sk, D;
    int causal;           /* 0/1, -1 unknown                                  */
    double p50_us, p90_us, mean_us, std_us, graph_us, tflops;
    int64_t iters;        /* -1 unknown                                       */
    int check_failed;     /* the run recorded "check" other than "ok": its
                           * output was wrong, its time proves nothing      */
} kit_bench_row;

typedef struct kit_bench_file {
    kit_bench_row *rows;
    int n;
    int n_errors;         /* peer entries that recorded an error (not loaded) */
    char device[128];     /* meta.device_name, or top-level "device"          */
    char git_sha[64];
} kit_bench_file;

/* Accepted layouts:
 *  - flashcore bench: {"meta": {...}, "rows": [{"shape", ..., "p50_us", ...}]}
 *  - peer rows with a "system" member per row, same field names; "us" is read
 *    as p50_us, "us_graph" as graph_us, "Skv" as Sk;
 *  - the anchor files (rows without "system" holding one object per system:
 *    {"us", "us_graph", "tflops"} or {"error"}), with "rows" at the top or
 *    the root an array.
 * Rows (or system entries) carrying an "error" are counted in n_errors and
 * not loaded. A "check" member other than "ok" sets check_failed. "pass"
 * (a row's or meta's) must be "fwd" or "bwd".
 * Returns 0, or -1 with err set ("rows[3].p50_us: expected a number"). */
int kit_bench_file_parse(const char *text, size_t len, kit_bench_file *f, char *err,
                         size_t err_len);
int kit_bench_file_read(const char *path, kit_bench_file *f, char *err, size_t err_len);
void kit_bench_file_free(kit_bench_file *f);
/* "float16", "fp16", "half" -> "f16"; "bfloat16" -> "bf16"; "float32" -> "f32". */
const char *kit_dtype_normalize(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* FC_KIT_JSON_H */
