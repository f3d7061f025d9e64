/*
 * tuning_file.c -- the tuning cache's text format (docs/TUNING.md): parse a
 * file into a cache, with "path:line: reason" for the first thing wrong,
 * and write a cache back in canonical order.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tuning_cache.h"

#define FC_TUNE_MAGIC "flashcore-tuning 1"
#define FC_TUNE_MAX_LINE 4096

static const char *const k_dtypes[] = {"f32", "f16", "bf16", "e4m3", "e5m2", "f64"};
static const char *const k_masks[] = {"none", "causal", "local"};
static const char k_flag_chars[] = "svpa"; /* FC_TF_* bits in order */

/* The parser's position, for messages. */
typedef struct parse_ctx {
    const char *path;
    int line;
    char *err;
    size_t err_len;
} parse_ctx;

static fc_status bad(parse_ctx *pc, const char *fmt, const char *a, const char *b)
{
    char msg[FC_ERRMSG_LEN];
    snprintf(msg, sizeof msg, fmt, a, b);
    snprintf(pc->err, pc->err_len, "tuning cache %s:%d: %s", pc->path, pc->line, msg);
    return FC_ERR_INVALID_ARGUMENT;
}

/* A decimal integer in [lo, hi] (the whole token); 0 on success. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int name_index(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

/* ---- the device line ------------------------------------------------------------- */

/* "9.0" -> 90, "*" -> -1. */
static int parse_cc(const char *s, long *out)
{
    if (strcmp(s, "*") == 0) return *out = -1, 0;
    if (strlen(s) != 3 || s[0] < '1' || s[0] > '9' || s[1] != '.' || s[2] < '0' || s[2] > '9') return -1;
    *out = (s[0] - '0') * 10 + (s[2] - '0');
    return 0;
}

static fc_status parse_device(parse_ctx *pc, char *rest, fc_tune_section *s)
{
    memset(s, 0, sizeof *s);
    static const char *const need[] = {"library", "tables", "cc", "sms", "cudart", "gpu"};
    int seen = 0;
    while (*rest) {
        while (*rest == ' ') rest++;
        if (!*rest) break;
        char *eq = strchr(rest, '=');
        if (!eq) return bad(pc, "device: '%s' is not name=value", rest, "");
        *eq = 0;
        char *val = eq + 1;
        const int f = name_index(rest, need, 6);
        if (f < 0) return bad(pc, "device: unknown field '%s'", rest, "");
        if (seen & (1 << f)) return bad(pc, "device: field '%s' given twice", rest, "");
        seen |= 1 << f;
        char *next = f == 5 ? val + strlen(val) : val + strcspn(val, " "); /* gpu= takes the rest */
        if (*next) *next++ = 0;
        long v = 0;
        switch (f) {
        case 0:
        case 1: {
            char *dst = f == 0 ? s->library : s->tables;
            const size_t cap = f == 0 ? sizeof s->library : sizeof s->tables;
            if (!*val || strlen(val) >= cap) return bad(pc, "device: %s '%s' is empty or too long", need[f], val);
            memcpy(dst, val, strlen(val) + 1);
            break;
        }
        case 2:
            if (parse_cc(val, &v)) return bad(pc, "device: cc '%s' is not major.minor (e.g. 9.0) or *", val, "");
            s->cc = (int32_t)v;
            break;
        case 3:
        case 4:
            if (strcmp(val, "*") == 0) v = -1;
            else if (parse_int(val, 1, 1L << 30, &v)) return bad(pc, "device: %s '%s' is not a count or *", need[f], val);
            if (f == 3) s->sms = (int32_t)v;
            else s->cudart = (int32_t)v;
            break;
        default:
            if (!*val || strlen(val) >= sizeof s->gpu) return bad(pc, "device: gpu '%s' is empty or too long", val, "");
            memcpy(s->gpu, val, strlen(val) + 1);
        }
        rest = next;
    }
    for (int f = 0; f < 6; f++)
        if (!(seen & (1 << f))) return bad(pc, "device: field '%s' is missing (use * for any)", need[f], "");
    s->applies = (strcmp(s->library, "*") == 0 || strcmp(s->library, FLASHCORE_VERSION_STRING) == 0) &&
                 (strcmp(s->tables, "*") == 0 || strcmp(s->tables, fc_tune_tables_id()) == 0);
    return FC_OK;
}

/* ---- entries ------------------------------------------------------------------------- */

/* The shape bucket's fields, in file order: where each sits in the key
 * and how its value reads and writes. */
typedef enum bucket_kind { BK_INT, BK_DTYPE, BK_MASK, BK_FLAGS, BK_LENGTH } bucket_kind;
static const struct bucket_field {
    const char *name;
    int shift, bits;
    bucket_kind kind;
    long lo, hi; /* BK_INT's range */
} k_bucket[] = {
    {"det", FC_TK_DET_SHIFT, FC_TK_DET_BITS, BK_INT, 0, 1},
    {"dtype", FC_TK_DTYPE_SHIFT, FC_TK_DTYPE_BITS, BK_DTYPE, 0, 0},
    {"kv", FC_TK_KV_SHIFT, FC_TK_KV_BITS, BK_DTYPE, 0, 0},
    {"d", FC_TK_D_SHIFT, FC_TK_D_BITS, BK_INT, 1, 1023},
    {"gqa", FC_TK_GQA_SHIFT, FC_TK_GQA_BITS, BK_INT, 1, 1023},
    {"mask", FC_TK_MASK_SHIFT, FC_TK_MASK_BITS, BK_MASK, 0, 0},
    {"flags", FC_TK_FLAGS_SHIFT, FC_TK_FLAGS_BITS, BK_FLAGS, 0, 0},
    {"sq", FC_TK_SQ_SHIFT, FC_TK_SQ_BITS, BK_LENGTH, 0, 0},
    {"sk", FC_TK_SK_SHIFT, FC_TK_SK_BITS, BK_LENGTH, 0, 0},
    {"bh", FC_TK_BH_SHIFT, FC_TK_BH_BITS, BK_LENGTH, 0, 0},
};
#define NUM_BUCKET ((int)(sizeof k_bucket / sizeof k_bucket[0]))

static uint64_t bucket_mask(const struct bucket_field *b) { return (((uint64_t)1 << b->bits) - 1) << b->shift; }

/* "-" or letters of k_flag_chars -> FC_TF_* bits, or -1. */
static long parse_flags(const char *val)
{
    if (strcmp(val, "-") == 0) return 0;
    long v = 0;
    for (const char *c = val; *c; c++) {
        const char *at = strchr(k_flag_chars, *c);
        if (!at) return -1;
        v |= 1L << (at - k_flag_chars);
    }
    return v;
}

/* One bucket field "name=value" into key (or wild for "*"). */
static fc_status bucket_field(parse_ctx *pc, const char *name, const char *val, fc_tune_entry *e, int *seen)
{
    int f = 0;
    while (f < NUM_BUCKET && strcmp(name, k_bucket[f].name) != 0) f++;
    if (f == NUM_BUCKET) return bad(pc, "unknown shape field '%s'", name, "");
    if (*seen & (1 << f)) return bad(pc, "shape field '%s' given twice", name, "");
    *seen |= 1 << f;
    const struct bucket_field *b = &k_bucket[f];
    if (strcmp(val, "*") == 0) {
        e->wild |= bucket_mask(b);
        return FC_OK;
    }
    long v = -1, n;
    switch (b->kind) {
    case BK_INT: parse_int(val, b->lo, b->hi, &v); break;
    case BK_DTYPE: v = name_index(val, k_dtypes, 6); break;
    case BK_MASK: v = name_index(val, k_masks, 3); break;
    case BK_FLAGS: v = parse_flags(val); break;
    case BK_LENGTH:
        if (parse_int(val, 0, 1L << 40, &n) != 0) break;
        if (fc_tune_bound(fc_tune_bucket(n)) != n) {
            char hint[48];
            snprintf(hint, sizeof hint, "%lld", (long long)fc_tune_bound(fc_tune_bucket(n)));
            return bad(pc, "'%s' is not a bucket bound (1, 2, 3, 4, 6, 8, 12, ...): the bucket of it ends at %s",
                       val, hint);
        }
        v = fc_tune_bucket(n);
    }
    if (v < 0) return bad(pc, "shape field %s: bad value '%s'", name, val);
    e->key |= (uint64_t)v << b->shift;
    return FC_OK;
}

/* One choice field into e->choice, in fc_tune_fields' ranges; a row is
 * checked against this build's table when the section applies to it (in a
 * build without that table, or for another build, any 10-bit index: nothing
 * here runs it). */
static fc_status choice_field(parse_ctx *pc, const char *name, const char *val, fc_tune_entry *e, int applies,
                              int *seen)
{
    int f = 0; /* 0: path, then fc_tune_fields[f - 1] */
    while (f <= FC_TUNE_NUM_FIELDS && strcmp(name, f ? fc_tune_fields[f - 1].name : "path") != 0) f++;
    if (f > FC_TUNE_NUM_FIELDS) return bad(pc, "unknown choice field '%s'", name, "");
    if (*seen & (1 << f)) return bad(pc, "choice field '%s' given twice", name, "");
    *seen |= 1 << f;
    const fc_tune_field *tf = f ? &fc_tune_fields[f - 1] : NULL;
    long lo = tf ? tf->lo : 0, hi = tf ? fc_tune_field_max(tf) : 90, v;
    if (tf && tf->rows && (!applies || hi < 0)) hi = 1023;
    if (parse_int(val, lo, hi, &v) || (!tf && v != 0 && v != 80 && v != 90)) {
        char range[64];
        if (!tf) snprintf(range, sizeof range, "0, 80 or 90");
        else snprintf(range, sizeof range, "%ld to %ld (this build)", lo, hi);
        snprintf(pc->err, pc->err_len, "tuning cache %s:%d: choice field %s: '%s' is out of range: use %s", pc->path,
                 pc->line, name, val, range);
        return FC_ERR_INVALID_ARGUMENT;
    }
    if (tf) *fc_tune_at(&e->choice.t, tf) = (int32_t)v;
    else e->choice.path = (int32_t)v;
    return FC_OK;
}

/* "fwd|bwd <bucket fields> : <choice fields> [# comment]" */
static fc_status parse_entry(parse_ctx *pc, char *line, const char *comment, fc_tune_section *s)
{
    fc_tune_entry e;
    memset(&e, 0, sizeof e);
    fc_tuning_init(&e.choice.t);
    const int bwd = strncmp(line, "bwd", 3) == 0;
    line += 3;
    e.key = (uint64_t)bwd << FC_TK_PASS_SHIFT;
    int in_choice = 0, seen_b = 0, seen_c = 0;
    char *save = NULL;
    for (char *tok = strtok_r(line, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (strcmp(tok, ":") == 0) {
            if (in_choice) return bad(pc, "a second ':'", "", "");
            in_choice = 1;
            continue;
        }
        char *eq = strchr(tok, '=');
        if (!eq) return bad(pc, "'%s' is not name=value", tok, "");
        *eq = 0;
        const fc_status st = in_choice ? choice_field(pc, tok, eq + 1, &e, s->applies, &seen_c)
                                       : bucket_field(pc, tok, eq + 1, &e, &seen_b);
        if (st) return st;
    }
    if (!in_choice) return bad(pc, "no ':' between the shape and the choice", "", "");
    if (!fc_tune_choice_sets(&e.choice)) return bad(pc, "the entry chooses nothing", "", "");
    if (!bwd && FC_TK_GET(e.key, DET)) return bad(pc, "det=1 on a forward entry", "", "");
    char why[96];
    if (fc_tune_choice_misfit(&e.choice, bwd, why, sizeof why)) return bad(pc, "%s", why, "");
    /* omitted shape fields are wildcards, as "*"; det only on backward
     * entries: a forward call has det 0, so there det=* is det=0 (one
     * bucket, as the file writes it: no det on a forward entry) */
    for (int f = bwd ? 0 : 1; f < NUM_BUCKET; f++)
        if (!(seen_b & (1 << f))) e.wild |= bucket_mask(&k_bucket[f]);
    if (!bwd) e.wild &= ~bucket_mask(&k_bucket[0]);
    e.key &= ~e.wild;
    if (comment && *comment && !(e.comment = strdup(comment))) return FC_ERR_OUT_OF_MEMORY;
    const fc_status st = fc_tune_section_add(s, &e, 0);
    if (st == FC_OK) return FC_OK;
    free(e.comment);
    return st == FC_ERR_INVALID_ARGUMENT ? bad(pc, "a second entry for the same shape bucket", "", "") : st;
}

/* ---- the file -------------------------------------------------------------------------- */

/* Split off a '#' comment and trim both (a CRLF line's CR too). */
static char *trim(char *line, char **comment)
{
    char *hash = strchr(line, '#');
    *comment = NULL;
    if (hash) {
        *hash = 0;
        char *c = hash + 1;
        while (*c == ' ' || *c == '\t') c++;
        *comment = c;
        for (char *end = c + strlen(c); end > c && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'); end--)
            end[-1] = 0;
    }
    while (*line == ' ' || *line == '\t') line++;
    for (char *end = line + strlen(line); end > line && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r');
         end--)
        end[-1] = 0;
    for (char *c = line; *c; c++)
        if (*c == '\t') *c = ' ';
    return line;
}

static fc_status parse_line(parse_ctx *pc, char *line, fc_tune_cache *c, int *magic)
{
    char *comment;
    line = trim(line, &comment);
    if (!*line) return FC_OK;
    if (!*magic) {
        if (strcmp(line, FC_TUNE_MAGIC) != 0)
            return bad(pc, "not a tuning cache: the first line must be '%s'", FC_TUNE_MAGIC, "");
        *magic = 1;
        return FC_OK;
    }
    if (strncmp(line, "device ", 7) == 0) {
        fc_tune_section s;
        const fc_status st = parse_device(pc, line + 7, &s);
        if (st) return st;
        if (c->n_sec == c->cap_sec) {
            const int n = c->cap_sec ? 2 * c->cap_sec : 4;
            fc_tune_section *p = realloc(c->sec, (size_t)n * sizeof *p);
            if (!p) return FC_ERR_OUT_OF_MEMORY;
            c->sec = p;
            c->cap_sec = n;
        }
        c->sec[c->n_sec++] = s;
        return FC_OK;
    }
    if ((strncmp(line, "fwd", 3) == 0 || strncmp(line, "bwd", 3) == 0) && (line[3] == ' ' || !line[3])) {
        if (!c->n_sec) return bad(pc, "an entry before any 'device' line", "", "");
        return parse_entry(pc, line, comment, &c->sec[c->n_sec - 1]);
    }
    return bad(pc, "'%.40s' is neither a device line nor an entry (fwd/bwd)", line, "");
}

fc_status fc_tune_parse(const char *text, size_t len, const char *path, fc_tune_cache **out, char *err, size_t err_len)
{
    parse_ctx pc = {path ? path : "(text)", 0, err, err_len};
    if (memchr(text, 0, len)) return bad(&pc, "the file holds NUL bytes (binary data)", "", "");
    fc_tune_cache *c = calloc(1, sizeof *c);
    char *line = malloc(FC_TUNE_MAX_LINE + 1);
    if (!c || !line || (path && !(c->path = strdup(path)))) {
        free(line);
        fc_tune_cache_free(c);
        snprintf(err, err_len, "out of memory reading a tuning cache");
        return FC_ERR_OUT_OF_MEMORY;
    }
    c->refs = 1;
    fc_status st = FC_OK;
    int magic = 0;
    for (size_t at = 0; at < len && st == FC_OK;) {
        const char *nl = memchr(text + at, '\n', len - at);
        const size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
        pc.line++;
        if (n > FC_TUNE_MAX_LINE) {
            st = bad(&pc, "line longer than 4096 bytes", "", "");
            break;
        }
        memcpy(line, text + at, n);
        line[n] = 0;
        st = parse_line(&pc, line, c, &magic);
        at += n + 1;
    }
    if (st == FC_OK && !magic) {
        pc.line = 1;
        st = bad(&pc, "empty file: a tuning cache starts with '%s'", FC_TUNE_MAGIC, "");
    }
    free(line);
    if (st == FC_ERR_OUT_OF_MEMORY) snprintf(err, err_len, "out of memory reading tuning cache %s", pc.path);
    if (st) {
        fc_tune_cache_free(c);
        return st;
    }
    *out = c;
    return FC_OK;
}

/* ---- writing ------------------------------------------------------------------------------ */

static void write_entry(FILE *f, const fc_tune_entry *e)
{
    const int bwd = FC_TK_GET(e->key, PASS);
    fprintf(f, "%s", bwd ? "bwd" : "fwd");
    for (int i = bwd ? 0 : 1; i < NUM_BUCKET; i++) {
        const struct bucket_field *b = &k_bucket[i];
        if (e->wild & bucket_mask(b)) continue;
        const int v = (int)((e->key & bucket_mask(b)) >> b->shift);
        fprintf(f, " %s=", b->name);
        switch (b->kind) {
        case BK_INT: fprintf(f, "%d", v); break;
        case BK_DTYPE: fprintf(f, "%s", k_dtypes[v % 6]); break;
        case BK_MASK: fprintf(f, "%s", k_masks[v % 3]); break;
        case BK_FLAGS:
            if (!v) fputc('-', f);
            for (int c = 0; c < 4; c++)
                if (v & (1 << c)) fputc(k_flag_chars[c], f);
            break;
        case BK_LENGTH: fprintf(f, "%lld", (long long)fc_tune_bound(v));
        }
    }
    fprintf(f, " :");
    if (e->choice.path) fprintf(f, " path=%d", e->choice.path);
    for (int i = 0; i < FC_TUNE_NUM_FIELDS; i++) {
        const int32_t v = fc_tune_get(&e->choice.t, &fc_tune_fields[i]);
        if (v != fc_tune_fields[i].def) fprintf(f, " %s=%d", fc_tune_fields[i].name, (int)v);
    }
    if (e->comment) fprintf(f, "  # %s", e->comment);
    fprintf(f, "\n");
}

static void write_section(FILE *f, const fc_tune_section *s)
{
    char cc[16] = "*", sms[16] = "*", rt[16] = "*";
    if (s->cc >= 0) snprintf(cc, sizeof cc, "%d.%d", s->cc / 10, s->cc % 10);
    if (s->sms >= 0) snprintf(sms, sizeof sms, "%d", s->sms);
    if (s->cudart >= 0) snprintf(rt, sizeof rt, "%d", s->cudart);
    fprintf(f, "\ndevice library=%s tables=%s cc=%s sms=%s cudart=%s gpu=%s\n", s->library, s->tables, cc, sms, rt,
            s->gpu);
    for (int j = 0; j < s->n_exact; j++) write_entry(f, &s->exact[j]);
    for (int j = 0; j < s->n_wild; j++) write_entry(f, &s->wild[j]);
}

fc_status fc_tune_write(const fc_tune_cache *c, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, err_len, "cannot write tuning cache %s", path);
        return FC_ERR_INVALID_ARGUMENT;
    }
    fprintf(f, "%s\n# flashcore %s; format: docs/TUNING.md\n", FC_TUNE_MAGIC, FLASHCORE_VERSION_STRING);
    for (int i = 0; c && i < c->n_sec; i++) write_section(f, &c->sec[i]);
    const int bad_write = ferror(f);
    if (fclose(f) != 0 || bad_write) {
        snprintf(err, err_len, "cannot write tuning cache %s (disk full?)", path);
        return FC_ERR_INVALID_ARGUMENT;
    }
    return FC_OK;
}
