/*
 * tuning.c -- the tuning cache's file format under fuzzing, through the
 * public API: a text built from the input bytes (mostly from the format's
 * own words, then perhaps a few bytes flipped; or the raw bytes) is written
 * to a file and loaded with fc_context_load_tuning.
 *   Refused: a clear status and message, and the context keeps the cache
 *   it had (fc_context_tuning_info unchanged).
 *   Loaded: what fc_context_save_tuning writes loads again, and saving that
 *   gives the same bytes (the canonical form is a fixed point); the same
 *   text loaded from a second file name, into another context, saves to
 *   the same bytes as well (nothing in a load depends on the path or on
 *   the caches loaded before).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

enum { TEXT_CAP = 8192, INFO_CAP = 16384 };

static char g_text[TEXT_CAP];
static size_t g_len;
static char g_dir[64];

static void describe(void)
{
    fprintf(stderr, "tuning cache text (%zu bytes):\n%.*s\n", g_len, (int)g_len, g_text);
}

static void put(const char *s)
{
    const size_t n = strlen(s);
    if (g_len + n < TEXT_CAP) {
        memcpy(g_text + g_len, s, n);
        g_len += n;
    }
}

static void pick(fz_in *in, const char *const *words, int n) { put(words[fz_range(in, 0, n - 1)]); }

/* Whitespace between tokens: mostly one space, now and then tabs or runs. */
static void gap(fz_in *in)
{
    static const char *const g[] = {" ", " ", " ", "  ", "\t", " \t "};
    pick(in, g, 6);
}

static void device_line(fz_in *in)
{
    static const char *const names[] = {"library", "tables", "cc", "sms", "cudart", "gpu", "bogus"};
    static const char *const lib[] = {"*", FLASHCORE_VERSION_STRING, "0.0.9", ""};
    static const char *const cc[] = {"*", "9.0", "8.0", "8.9", "10.0", "9", "x"};
    static const char *const count[] = {"*", "132", "1", "0", "-3", "99999999999", "12a"};
    static const char *const gpu[] = {"*", "NVIDIA H100 80GB HBM3", "GPU = with = signs", ""};
    put("device");
    if (!fz_chance(in, 10)) { /* every field once, in order, with values it takes */
        gap(in);
        put(fz_chance(in, 80) ? "library=* tables=*" : "library=" FLASHCORE_VERSION_STRING " tables=*");
        gap(in);
        put(fz_chance(in, 50) ? "cc=* sms=* cudart=*" : "cc=9.0 sms=132 cudart=13000");
        gap(in);
        put("gpu=");
        return pick(in, gpu, 3);
    }
    const int nf = fz_range(in, 0, 7);
    for (int i = 0; i < nf; i++) {
        const int f = i < 6 && !fz_chance(in, 10) ? i : fz_range(in, 0, 6);
        gap(in);
        put(names[f]);
        put("=");
        if (f == 0 || f == 1) pick(in, lib, 4);
        else if (f == 2) pick(in, cc, 7);
        else if (f == 3 || f == 4) pick(in, count, 7);
        else if (f == 5) pick(in, gpu, 4);
        else put("1");
    }
}

/* A bucket field's value: mostly one the field takes, else any word. */
static void bucket_value(fz_in *in, int f)
{
    static const char *const any[] = {"*", "0", "1", "2", "3", "64", "128", "1023", "1024", "12", "5",
                                      "f16", "bf16", "e4m3", "f64", "x", "causal", "local", "none",
                                      "-", "sv", "pa", "q", "1099511627776", "-1", ""};
    static const char *const det[] = {"*", "0", "1"}, *const dt[] = {"*", "f16", "bf16", "f32", "e4m3"};
    static const char *const d[] = {"*", "64", "128"}, *const gqa[] = {"*", "1", "4"};
    static const char *const mask[] = {"*", "none", "causal", "local"}, *const fl[] = {"*", "-", "s", "sv", "vs"};
    static const char *const len[] = {"*", "1", "2", "3", "4", "1024", "1536"};
    if (fz_chance(in, 15)) return pick(in, any, 26);
    switch (f) {
    case 0: pick(in, det, 3); break;
    case 1:
    case 2: pick(in, dt, 5); break;
    case 3: pick(in, d, 3); break;
    case 4: pick(in, gqa, 3); break;
    case 5: pick(in, mask, 4); break;
    case 6: pick(in, fl, 5); break;
    default: pick(in, len, 7);
    }
}

static void entry_line(fz_in *in)
{
    static const char *const bucket[] = {"det", "dtype", "kv", "d", "gqa", "mask", "flags", "sq", "sk", "bh"};
    static const char *const choice[] = {"path", "sm90_config", "sm80_config", "sm90_rotate", "sm90_tail",
                                         "sm90_grid", "splits", "pdl", "sm80_bwd_config", "sm90_bwd_config",
                                         "masks", "nope"};
    static const char *const cval[] = {"0", "1", "2", "3", "-1", "80", "90", "7", "1023", "1024", "x", ""};
    static const char *const comment[] = {"", "  # measured", " #", " # a\tb", " # # two", " # trailing \r"};
    put(fz_chance(in, 50) ? "fwd" : "bwd");
    const int nb = fz_range(in, 0, 5), step = fz_range(in, 1, 9), f0 = fz_range(in, 0, 9);
    const int twice = fz_chance(in, 10); /* fields may repeat */
    for (int i = 0; i < nb; i++) {
        const int f = twice ? fz_range(in, 0, 9) : (f0 + i * (step == 5 ? 1 : step)) % 10;
        gap(in);
        put(bucket[f]);
        put("=");
        bucket_value(in, f);
    }
    if (!fz_chance(in, 5)) {
        gap(in);
        put(":");
    }
    const int nc = fz_chance(in, 10) ? 0 : fz_range(in, 1, 3), c0 = fz_range(in, 0, 11);
    for (int i = 0; i < nc; i++) {
        const int c = fz_chance(in, 10) ? fz_range(in, 0, 11) : (c0 + i) % 12;
        gap(in);
        put(choice[c]);
        put("=");
        if (fz_chance(in, 20)) pick(in, cval, 12);
        else if (c == 0) put(fz_chance(in, 50) ? "90" : "80");
        else pick(in, cval, 3);
    }
    pick(in, comment, 6);
}

/* The input's text: the format's words (with a few bytes flipped now and
 * then), or the rest of the input as it is. */
static void build_text(fz_in *in)
{
    g_len = 0;
    if (fz_chance(in, 10)) {
        while (in->i < in->n && g_len < TEXT_CAP) g_text[g_len++] = (char)in->p[in->i++];
        return;
    }
    if (!fz_chance(in, 5)) put(fz_chance(in, 3) ? "flashcore-tuning 2\n" : "flashcore-tuning 1  # hi\n");
    if (!fz_chance(in, 10)) {
        device_line(in);
        put("\n");
    }
    const int lines = fz_chance(in, 20) ? fz_range(in, 0, 12) : fz_range(in, 0, 4);
    size_t last = g_len;
    for (int l = 0; l < lines; l++) {
        const unsigned k = fz_byte(in) % 8;
        if (k != 6) last = g_len;
        if (k == 0) device_line(in);
        else if (k == 7) put(fz_chance(in, 50) ? "# a comment" : "   ");
        else if (k == 6 && l > 0 && last < g_len) { /* the line before again, perhaps one byte changed */
            const size_t a = last, n = g_len - last;
            if (g_len + n < TEXT_CAP) {
                memmove(g_text + g_len, g_text + a, n);
                if (fz_chance(in, 50)) g_text[g_len + fz_range(in, 0, (int)n - 1) % n] = fz_chance(in, 50) ? '*' : '0';
                g_len += n;
            }
            continue;
        } else entry_line(in);
        put(fz_chance(in, 5) ? "\r\n" : "\n");
    }
    const int flips = fz_chance(in, 20) ? fz_range(in, 1, 3) : 0;
    for (int i = 0; i < flips && g_len; i++) g_text[fz_range(in, 0, (int)g_len - 1) % g_len] = (char)fz_byte(in);
}

static void write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) fz_fail("tuning", "cannot write %s", path);
}

/* The whole file at path (NUL-terminated; *len its size). */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = malloc(1u << 20);
    if (!f || !buf) fz_fail("tuning", "cannot read %s", path);
    *len = fread(buf, 1, (1u << 20) - 1, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static void info(fc_context *ctx, char *buf)
{
    size_t need = 0;
    fc_context_tuning_info(ctx, buf, INFO_CAP, &need);
    if (need > INFO_CAP) fz_fail("tuning", "tuning info of %zu bytes (harness cap %d)", need, INFO_CAP);
}

static void save(fc_context *ctx, const char *path)
{
    const fc_status st = fc_context_save_tuning(ctx, path);
    fz_check_status(ctx, st, "fc_context_save_tuning");
    if (st != FC_OK) fz_fail("tuning", "saving a loaded cache failed: %s", fc_last_error(ctx));
}

static void load_ok(fc_context *ctx, const char *path, const char *what)
{
    const fc_status st = fc_context_load_tuning(ctx, path);
    fz_check_status(ctx, st, "fc_context_load_tuning");
    if (st != FC_OK) fz_fail("tuning", "%s did not load: %s", what, fc_last_error(ctx));
}

static void check_same(const char *a, const char *b, const char *what)
{
    size_t na, nb;
    char *x = read_file(a, &na), *y = read_file(b, &nb);
    if (na != nb || memcmp(x, y, na) != 0) fz_fail("tuning", "%s:\n--- %s\n%s--- %s\n%s", what, a, x, b, y);
    free(x);
    free(y);
}

static void check(fc_context *ctx, fc_context *other)
{
    char path[96], saved[96], again[96], twin[96], twin_saved[96];
    snprintf(path, sizeof path, "%s/in.tune", g_dir);
    snprintf(saved, sizeof saved, "%s/saved.tune", g_dir);
    snprintf(again, sizeof again, "%s/again.tune", g_dir);
    snprintf(twin, sizeof twin, "%s/twin.tune", g_dir);
    snprintf(twin_saved, sizeof twin_saved, "%s/twin-saved.tune", g_dir);
    /* ctx holds a cache from a valid file, so "left as it was" is visible */
    static const char k_base[] = "flashcore-tuning 1\ndevice library=* tables=* cc=* sms=* cudart=* gpu=*\n"
                                 "fwd d=64 : splits=2\n";
    write_file(saved, k_base, sizeof k_base - 1);
    load_ok(ctx, saved, "the harness's base cache");
    static char before[INFO_CAP], after[INFO_CAP];
    info(ctx, before);

    write_file(path, g_text, g_len);
    const fc_status st = fc_context_load_tuning(ctx, path);
    fz_check_status(ctx, st, "fc_context_load_tuning");
    fz_stats_of[FZ_TUNING].status[st]++;
    if (st != FC_OK) {
        if (st != FC_ERR_INVALID_ARGUMENT && st != FC_ERR_OUT_OF_MEMORY)
            fz_fail("tuning", "a bad file gave %s: %s", fc_status_string(st), fc_last_error(ctx));
        info(ctx, after);
        if (strcmp(before, after) != 0) fz_fail("tuning", "a refused load changed the cache:\n%s\n---\n%s", before, after);
        return;
    }
    save(ctx, saved);
    load_ok(other, saved, "a saved cache");
    save(other, again);
    check_same(saved, again, "saving a loaded save changed it");
    write_file(twin, g_text, g_len);
    load_ok(other, twin, "the same text under another name");
    save(other, twin_saved);
    check_same(saved, twin_saved, "the same text loaded under two names saved differently");
    fz_stats_of[FZ_TUNING].gated++;
}

void fz_entry_tuning(fz_in *in)
{
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/fc-fuzz-tune-XXXXXX");
        if (!mkdtemp(g_dir)) fz_fail("tuning", "cannot make a directory for the harness's files");
    }
    build_text(in);
    fz_describe = describe;
    fc_context *ctx = NULL, *other = NULL;
    if (fc_context_create(&ctx) == FC_OK && fc_context_create(&other) == FC_OK) {
        check(ctx, other);
    }
    fc_context_free(ctx);
    fc_context_free(other);
}
