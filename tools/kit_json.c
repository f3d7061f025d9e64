/*
 * kit_json.c -- JSON writer/reader and the bench result file format (see
 * kit_json.h). Plain C11, no dependencies; the reader never trusts its input:
 * depth, sizes and every byte are checked, and errors carry line and column.
 */
#include "kit_json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ============================ writer ======================================= */

void kit_jw_init(kit_jw *w, int pretty)
{
    memset(w, 0, sizeof(*w));
    w->pretty = pretty;
}

void kit_jw_free(kit_jw *w)
{
    free(w->buf);
    memset(w, 0, sizeof(*w));
}

static void jw_put(kit_jw *w, const char *s, size_t n)
{
    if (w->failed) return;
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n + 1) {
            if (cap > ((size_t)-1) / 2) { w->failed = 1; return; }
            cap *= 2;
        }
        char *b = realloc(w->buf, cap);
        if (!b) { w->failed = 1; return; }
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

static void jw_puts(kit_jw *w, const char *s) { jw_put(w, s, strlen(s)); }

static void jw_newline(kit_jw *w)
{
    if (!w->pretty) return;
    jw_put(w, "\n", 1);
    for (int i = 0; i < w->depth; i++) jw_put(w, "  ", 2);
}

/* Called before every value and key: separators and indentation, and the
 * misuse checks (a bare value inside an object, a key inside an array). */
static void jw_before(kit_jw *w, int is_key)
{
    if (w->failed) return;
    if (w->after_key) {
        if (is_key) { w->failed = 1; return; }
        w->after_key = 0;
        return; /* the value follows its key on the same line */
    }
    if (w->depth == 0) {
        if (w->len > 0 || is_key) w->failed = 1; /* one root value only */
        return;
    }
    if (w->in_object[w->depth] != is_key) { w->failed = 1; return; }
    if (w->has_items[w->depth]) jw_put(w, ",", 1);
    w->has_items[w->depth] = 1;
    jw_newline(w);
}

static void jw_escaped(kit_jw *w, const char *s)
{
    jw_put(w, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char tmp[8];
        switch (*p) {
        case '"': jw_put(w, "\\\"", 2); break;
        case '\\': jw_put(w, "\\\\", 2); break;
        case '\n': jw_put(w, "\\n", 2); break;
        case '\r': jw_put(w, "\\r", 2); break;
        case '\t': jw_put(w, "\\t", 2); break;
        case '\b': jw_put(w, "\\b", 2); break;
        case '\f': jw_put(w, "\\f", 2); break;
        default:
            if (*p < 0x20 || *p == 0x7f) {
                snprintf(tmp, sizeof(tmp), "\\u%04x", *p);
                jw_puts(w, tmp);
            } else {
                jw_put(w, (const char *)p, 1);
            }
        }
    }
    jw_put(w, "\"", 1);
}

static void jw_open(kit_jw *w, int object)
{
    jw_before(w, 0);
    if (w->failed) return;
    if (w->depth >= KIT_JW_MAX_DEPTH) { w->failed = 1; return; }
    jw_put(w, object ? "{" : "[", 1);
    w->depth++;
    w->in_object[w->depth] = (unsigned char)object;
    w->has_items[w->depth] = 0;
}

static void jw_close(kit_jw *w, int object)
{
    if (w->failed) return;
    if (w->depth == 0 || w->after_key || w->in_object[w->depth] != object) {
        w->failed = 1;
        return;
    }
    int had = w->has_items[w->depth];
    w->depth--;
    if (had) jw_newline(w);
    jw_put(w, object ? "}" : "]", 1);
}

void kit_jw_object_begin(kit_jw *w) { jw_open(w, 1); }
void kit_jw_object_end(kit_jw *w) { jw_close(w, 1); }
void kit_jw_array_begin(kit_jw *w) { jw_open(w, 0); }
void kit_jw_array_end(kit_jw *w) { jw_close(w, 0); }

void kit_jw_key(kit_jw *w, const char *key)
{
    jw_before(w, 1);
    if (w->failed) return;
    if (!key) { w->failed = 1; return; }
    jw_escaped(w, key);
    jw_put(w, w->pretty ? ": " : ":", w->pretty ? 2 : 1);
    w->after_key = 1;
}

void kit_jw_string(kit_jw *w, const char *s)
{
    if (!s) { kit_jw_null(w); return; }
    jw_before(w, 0);
    jw_escaped(w, s);
}

void kit_jw_number(kit_jw *w, double v)
{
    if (!isfinite(v)) { kit_jw_null(w); return; }
    char tmp[40];
    /* Shortest of %.15g..%.17g that reads back exactly: readable files and
     * exact round trips both. */
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    jw_before(w, 0);
    jw_puts(w, tmp);
}

void kit_jw_int(kit_jw *w, int64_t v)
{
    char tmp[32];
    snprintf(tmp, sizeof(tmp), "%lld", (long long)v);
    jw_before(w, 0);
    jw_puts(w, tmp);
}

void kit_jw_bool(kit_jw *w, int v)
{
    jw_before(w, 0);
    jw_puts(w, v ? "true" : "false");
}

void kit_jw_null(kit_jw *w)
{
    jw_before(w, 0);
    jw_puts(w, "null");
}

void kit_jw_kv_string(kit_jw *w, const char *key, const char *s) { kit_jw_key(w, key); kit_jw_string(w, s); }
void kit_jw_kv_number(kit_jw *w, const char *key, double v) { kit_jw_key(w, key); kit_jw_number(w, v); }
void kit_jw_kv_int(kit_jw *w, const char *key, int64_t v) { kit_jw_key(w, key); kit_jw_int(w, v); }
void kit_jw_kv_bool(kit_jw *w, const char *key, int v) { kit_jw_key(w, key); kit_jw_bool(w, v); }

const char *kit_jw_result(const kit_jw *w)
{
    if (w->failed || w->depth != 0 || w->after_key || !w->buf) return NULL;
    return w->buf;
}

/* ============================ reader ======================================= */

typedef struct jr {
    const char *s;
    size_t len, pos;
    char *err;
    size_t err_len;
    int failed;
} jr;

static void jr_fail(jr *r, const char *fmt, ...)
{
    if (r->failed) return;
    r->failed = 1;
    /* line/column of the current position, 1-based; columns count bytes */
    size_t line = 1, col = 1;
    for (size_t i = 0; i < r->pos && i < r->len; i++) {
        if (r->s[i] == '\n') { line++; col = 1; } else col++;
    }
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (r->err && r->err_len) snprintf(r->err, r->err_len, "line %zu, column %zu: %s", line, col, msg);
}

static void jr_ws(jr *r)
{
    while (r->pos < r->len) {
        char c = r->s[r->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') r->pos++;
        else break;
    }
}

/* A printable description of the byte at pos, for error messages. */
static const char *jr_here(jr *r, char *buf, size_t n)
{
    if (r->pos >= r->len) return "end of input";
    unsigned char c = (unsigned char)r->s[r->pos];
    if (c >= 0x20 && c < 0x7f) snprintf(buf, n, "'%c'", c);
    else snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static void json_free_contents(kit_json *j)
{
    if (j->type == KIT_JSON_STRING) free(j->string);
    if (j->type == KIT_JSON_ARRAY || j->type == KIT_JSON_OBJECT) {
        for (size_t i = 0; i < j->n; i++) {
            json_free_contents(&j->items[i]);
            if (j->keys) free(j->keys[i]);
        }
        free(j->items);
        free(j->keys);
    }
    memset(j, 0, sizeof(*j));
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int jr_hex4(jr *r, unsigned *out)
{
    if (r->len - r->pos < 4) { jr_fail(r, "truncated \\u escape"); return -1; }
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(r->s[r->pos + i]);
        if (h < 0) { jr_fail(r, "bad hex digit in \\u escape"); return -1; }
        v = v * 16 + (unsigned)h;
    }
    r->pos += 4;
    *out = v;
    return 0;
}

/* Length of a valid UTF-8 sequence starting at p (max n bytes), 0 if invalid
 * (overlong forms, surrogates and code points past U+10FFFF included). */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t k;
    unsigned cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) { k = 2; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { k = 3; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { k = 4; cp = c & 0x07; }
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
    if (cp >= 0xd800 && cp <= 0xdfff) return 0;
    return k;
}

static size_t utf8_put(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Parses a string at pos (which holds '"'); *out receives a malloc'ed copy. */
static int jr_string(jr *r, char **out, size_t *out_len)
{
    r->pos++; /* opening quote */
    /* The decoded string is never longer than its source text. */
    size_t start = r->pos, end = start;
    while (end < r->len && r->s[end] != '"') end += (r->s[end] == '\\') ? 2 : 1;
    if (end >= r->len) {
        jr_fail(r, "unterminated string");
        return -1;
    }
    char *o = malloc(end - start + 1);
    if (!o) { jr_fail(r, "out of memory"); return -1; }
    size_t n = 0;
    while (r->pos < r->len) {
        unsigned char c = (unsigned char)r->s[r->pos];
        if (c == '"') {
            r->pos++;
            o[n] = '\0';
            *out = o;
            if (out_len) *out_len = n;
            return 0;
        }
        if (c < 0x20) { jr_fail(r, "control character 0x%02x in string (must be escaped)", c); break; }
        if (c == '\\') {
            r->pos++;
            if (r->pos >= r->len) { jr_fail(r, "unterminated escape"); break; }
            char e = r->s[r->pos++];
            switch (e) {
            case '"': o[n++] = '"'; break;
            case '\\': o[n++] = '\\'; break;
            case '/': o[n++] = '/'; break;
            case 'b': o[n++] = '\b'; break;
            case 'f': o[n++] = '\f'; break;
            case 'n': o[n++] = '\n'; break;
            case 'r': o[n++] = '\r'; break;
            case 't': o[n++] = '\t'; break;
            case 'u': {
                unsigned cp;
                if (jr_hex4(r, &cp)) goto fail;
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    unsigned lo;
                    if (r->len - r->pos < 2 || r->s[r->pos] != '\\' || r->s[r->pos + 1] != 'u') {
                        jr_fail(r, "high surrogate \\u%04x without its low half", cp);
                        goto fail;
                    }
                    r->pos += 2;
                    if (jr_hex4(r, &lo)) goto fail;
                    if (lo < 0xdc00 || lo > 0xdfff) { jr_fail(r, "bad low surrogate \\u%04x", lo); goto fail; }
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                    jr_fail(r, "lone low surrogate \\u%04x", cp);
                    goto fail;
                }
                /* \uXXXX is 6 source bytes, its UTF-8 at most 3 (4 for a
                 * 12-byte pair): the buffer bound holds. */
                n += utf8_put(o + n, cp);
                break;
            }
            default:
                r->pos--;
                jr_fail(r, "bad escape '\\%c'", (e >= 0x20 && e < 0x7f) ? e : '?');
                goto fail;
            }
            continue;
        }
        size_t k = utf8_len((const unsigned char *)r->s + r->pos, r->len - r->pos);
        if (k == 0) { jr_fail(r, "invalid UTF-8 in string"); break; }
        memcpy(o + n, r->s + r->pos, k);
        n += k;
        r->pos += k;
    }
fail:
    free(o);
    return -1;
}

static int jr_number(jr *r, double *out)
{
    size_t p = r->pos;
    const char *s = r->s;
    if (p < r->len && s[p] == '-') p++;
    if (p >= r->len) { jr_fail(r, "truncated number"); return -1; }
    if (s[p] == '0') {
        p++;
    } else if (s[p] >= '1' && s[p] <= '9') {
        while (p < r->len && s[p] >= '0' && s[p] <= '9') p++;
    } else {
        jr_fail(r, "bad number");
        return -1;
    }
    if (p < r->len && s[p] == '.') {
        p++;
        if (p >= r->len || s[p] < '0' || s[p] > '9') { r->pos = p; jr_fail(r, "digit expected after '.'"); return -1; }
        while (p < r->len && s[p] >= '0' && s[p] <= '9') p++;
    }
    if (p < r->len && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        if (p < r->len && (s[p] == '+' || s[p] == '-')) p++;
        if (p >= r->len || s[p] < '0' || s[p] > '9') { r->pos = p; jr_fail(r, "digit expected in exponent"); return -1; }
        while (p < r->len && s[p] >= '0' && s[p] <= '9') p++;
    }
    /* strtod needs a NUL-terminated copy: the text may not be terminated. */
    char tmp[64];
    size_t n = p - r->pos;
    char *buf = n < sizeof(tmp) ? tmp : malloc(n + 1);
    if (!buf) { jr_fail(r, "out of memory"); return -1; }
    memcpy(buf, s + r->pos, n);
    buf[n] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    if (buf != tmp) free(buf);
    if (!isfinite(v)) { jr_fail(r, "number out of range"); return -1; }
    *out = v;
    r->pos = p;
    return 0;
}

static int jr_literal(jr *r, const char *word)
{
    size_t n = strlen(word);
    if (r->len - r->pos < n || memcmp(r->s + r->pos, word, n) != 0) {
        jr_fail(r, "invalid literal (expected %s)", word);
        return -1;
    }
    r->pos += n;
    return 0;
}

/* Append a slot to a container; returns its index or -1 (out of memory). */
static long jr_grow(jr *r, kit_json *j, size_t *cap, int with_key)
{
    if (j->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        if (nc > ((size_t)-1) / sizeof(kit_json)) { jr_fail(r, "too many elements"); return -1; }
        kit_json *it = realloc(j->items, nc * sizeof(kit_json));
        if (!it) { jr_fail(r, "out of memory"); return -1; }
        j->items = it;
        if (with_key) {
            char **k = realloc(j->keys, nc * sizeof(char *));
            if (!k) { jr_fail(r, "out of memory"); return -1; }
            j->keys = k;
        }
        *cap = nc;
    }
    memset(&j->items[j->n], 0, sizeof(kit_json));
    if (with_key) j->keys[j->n] = NULL;
    return (long)j->n++;
}

static int jr_value(jr *r, kit_json *j, int depth)
{
    char here[24];
    jr_ws(r);
    if (r->pos >= r->len) { jr_fail(r, "unexpected end of input, a value was expected"); return -1; }
    char c = r->s[r->pos];
    if (c == '{' || c == '[') {
        int obj = (c == '{');
        if (depth >= KIT_JSON_MAX_DEPTH) { jr_fail(r, "nesting deeper than %d", KIT_JSON_MAX_DEPTH); return -1; }
        j->type = obj ? KIT_JSON_OBJECT : KIT_JSON_ARRAY;
        r->pos++;
        size_t cap = 0;
        jr_ws(r);
        if (r->pos < r->len && r->s[r->pos] == (obj ? '}' : ']')) { r->pos++; return 0; }
        for (;;) {
            jr_ws(r);
            char *key = NULL;
            if (obj) {
                if (r->pos >= r->len || r->s[r->pos] != '"') {
                    jr_fail(r, "expected a string key, found %s", jr_here(r, here, sizeof(here)));
                    return -1;
                }
                if (jr_string(r, &key, NULL)) return -1;
                jr_ws(r);
                if (r->pos >= r->len || r->s[r->pos] != ':') {
                    free(key);
                    jr_fail(r, "expected ':' after key, found %s", jr_here(r, here, sizeof(here)));
                    return -1;
                }
                r->pos++;
            }
            long i = jr_grow(r, j, &cap, obj);
            if (i < 0) { free(key); return -1; }
            if (obj) j->keys[i] = key;
            if (jr_value(r, &j->items[i], depth + 1)) return -1;
            jr_ws(r);
            if (r->pos < r->len && r->s[r->pos] == ',') { r->pos++; continue; }
            if (r->pos < r->len && r->s[r->pos] == (obj ? '}' : ']')) { r->pos++; return 0; }
            jr_fail(r, "expected ',' or '%c', found %s", obj ? '}' : ']', jr_here(r, here, sizeof(here)));
            return -1;
        }
    }
    if (c == '"') {
        j->type = KIT_JSON_STRING;
        return jr_string(r, &j->string, &j->string_len);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        j->type = KIT_JSON_NUMBER;
        return jr_number(r, &j->number);
    }
    if (c == 't' || c == 'f') {
        j->type = KIT_JSON_BOOL;
        j->boolean = (c == 't');
        return jr_literal(r, c == 't' ? "true" : "false");
    }
    if (c == 'n') {
        j->type = KIT_JSON_NULL;
        return jr_literal(r, "null");
    }
    jr_fail(r, "expected a value, found %s", jr_here(r, here, sizeof(here)));
    return -1;
}

int kit_json_parse(const char *text, size_t len, kit_json **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err && err_len) err[0] = '\0';
    jr r = {text, len, 0, err, err_len, 0};
    if (!text) { jr_fail(&r, "no input"); return -1; }
    /* A UTF-8 byte order mark is tolerated (editors add one). */
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0) r.pos = 3;
    kit_json *root = calloc(1, sizeof(*root));
    if (!root) { jr_fail(&r, "out of memory"); return -1; }
    if (jr_value(&r, root, 0) == 0) {
        jr_ws(&r);
        if (r.pos < r.len) jr_fail(&r, "unexpected data after the document");
    }
    if (r.failed) {
        kit_json_free(root);
        return -1;
    }
    *out = root;
    return 0;
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

int kit_json_parse_file(const char *path, kit_json **out, char *err, size_t err_len)
{
    char *buf;
    size_t n;
    *out = NULL;
    if (read_whole_file(path, &buf, &n, err, err_len)) return -1;
    char msg[300];
    int rc = kit_json_parse(buf, n, out, msg, sizeof(msg));
    if (rc) snprintf(err, err_len, "%s: malformed JSON: %s", path, msg);
    free(buf);
    return rc;
}

void kit_json_free(kit_json *j)
{
    if (!j) return;
    json_free_contents(j);
    free(j);
}

const kit_json *kit_json_get(const kit_json *j, const char *key)
{
    if (!j || j->type != KIT_JSON_OBJECT) return NULL;
    for (size_t i = 0; i < j->n; i++)
        if (strcmp(j->keys[i], key) == 0) return &j->items[i];
    return NULL;
}

/* ======================= bench result files ================================= */

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
    char dtype[32] = "";
    if (bf_str(c, o, "system", base.system, sizeof(base.system)) ||
        bf_str(c, o, "backend", base.backend, sizeof(base.backend)) ||
        bf_str(c, o, "kernel", base.kernel, sizeof(base.kernel)) ||
        bf_str(c, o, "dtype", dtype, sizeof(dtype)) || bf_dim(c, o, "B", &base.B) ||
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
    bf_ctx c = {err, err_len, ""};
    int cap = 0, rc = -1;
    const kit_json *rows = root;
    if (root->type == KIT_JSON_OBJECT) {
        rows = kit_json_get(root, "rows");
        const kit_json *meta = kit_json_get(root, "meta");
        const kit_json *dev = meta ? kit_json_get(meta, "device_name") : kit_json_get(root, "device");
        if (dev && dev->type == KIT_JSON_STRING) copy_str(f->device, sizeof(f->device), dev->string);
        const kit_json *sha = meta ? kit_json_get(meta, "git_sha") : NULL;
        if (sha && sha->type == KIT_JSON_STRING) copy_str(f->git_sha, sizeof(f->git_sha), sha->string);
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
