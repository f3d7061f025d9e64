/*
 * kit_json_write.c -- the JSON writer of the kit (kit_json.h): a document in
 * a growable buffer, numbers in their shortest round-trip form, non-finite
 * numbers as null, strings escaped per RFC 8259.
 */
#include "kit_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
