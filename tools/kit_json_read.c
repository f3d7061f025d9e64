/*
 * kit_json_read.c -- the JSON reader of the kit (kit_json.h): the RFC 8259
 * grammar by recursive descent into a tree, with "line L, column C" on every
 * error, as much as `flashcore compare` needs to read bench files that the
 * CLI and bench/peers.py write. String bytes are kept as they are (not
 * checked as UTF-8); a \u escape of a surrogate half reads as U+FFFD.
 */
#include "kit_json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
                if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd; /* names compare reads are ASCII */
                /* \uXXXX is 6 source bytes, its UTF-8 at most 3: the
                 * buffer bound holds. */
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
        o[n++] = (char)c;
        r->pos++;
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
