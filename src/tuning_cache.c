/*
 * tuning_cache.c -- the tuning cache's buckets and keys, its lookup (once
 * per CUDA call, after the legality checks: dispatch.c), recording, and the
 * registry through which contexts that load the same unchanged file share
 * one immutable copy.
 */
#define _POSIX_C_SOURCE 200809L /* strdup, stat's st_mtim */
#include "tuning_cache.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- buckets and keys ------------------------------------------------------ */

int fc_tune_bucket(int64_t x)
{
    if (x <= 0) return 0;
    if (x <= 2) return (int)x;
    /* 2^k < x <= 2^(k+1), k >= 1: the bounds 1.5 * 2^k (index 2k + 1) and
     * 2^(k+1) (index 2k + 2) */
    int k = 63 - __builtin_clzll((unsigned long long)(x - 1));
    const int64_t mid = (int64_t)3 << (k - 1);
    const int idx = x <= mid ? 2 * k + 1 : 2 * k + 2;
    return idx < 127 ? idx : 127;
}

int64_t fc_tune_bound(int index)
{
    if (index <= 2) return index < 0 ? 0 : index;
    const int k = (index - 1) / 2;
    if (k > 61) return INT64_MAX;
    return (index & 1) ? (int64_t)3 << (k - 1) : (int64_t)1 << (k + 1);
}

static uint64_t put(uint64_t v, int shift, int bits)
{
    const uint64_t max = ((uint64_t)1 << bits) - 1;
    return (v > max ? max : v) << shift;
}

uint64_t fc_tune_key(const fc_fwd_params *p, const fc_bwd_params *b)
{
    const int mask = p->window_left >= 0 ? 2 : (p->window_right >= 0 ? 1 : 0);
    const int flags = (p->softcap > 0.0f ? FC_TF_SOFTCAP : 0) | (p->cu_seqlens_q ? FC_TF_VARLEN : 0) |
                      (p->block_table ? FC_TF_PAGED : 0) | (p->app.k_new ? FC_TF_APPEND : 0);
    const int64_t ratio = p->heads_kv > 0 ? p->heads_q / p->heads_kv : 0;
#define PUT(name, v) put((uint64_t)(v), FC_TK_##name##_SHIFT, FC_TK_##name##_BITS)
    return PUT(PASS, b != NULL) | PUT(DET, b ? b->deterministic != 0 : 0) | PUT(DTYPE, p->dtype) |
           PUT(KV, p->kv_dtype) | PUT(D, p->head_dim) | PUT(GQA, ratio) | PUT(MASK, mask) | PUT(FLAGS, flags) |
           PUT(SQ, fc_tune_bucket(p->seqlen_q)) | PUT(SK, fc_tune_bucket(p->seqlen_k)) |
           PUT(BH, fc_tune_bucket((int64_t)p->batch * p->heads_q));
#undef PUT
}

/* ---- the build's tables ------------------------------------------------------ */

static char g_tables_id[16];
static pthread_once_t g_tables_once = PTHREAD_ONCE_INIT;

static uint32_t fnv(uint32_t h, const void *data, size_t n)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

static void tables_once(void)
{
    uint32_t h = 2166136261u;
    int (*const tables[4])(int, fc_tile_row *) = {fc_sm80_tile_row, fc_sm90_tile_row, fc_sm80_bwd_tile_row,
                                                  fc_sm90_bwd_tile_row};
    for (int t = 0; t < (int)(sizeof tables / sizeof tables[0]); t++) {
        fc_tile_row r;
        for (int i = 0; tables[t](i, &r); i++) h = fnv(h, &r, sizeof r);
        h = fnv(h, &t, sizeof t); /* table boundaries count */
    }
    snprintf(g_tables_id, sizeof g_tables_id, "%08x", fc_cuda_compiled() ? h : 0u);
}

const char *fc_tune_tables_id(void)
{
    pthread_once(&g_tables_once, tables_once);
    return g_tables_id;
}

/* ---- lookup ------------------------------------------------------------------ */

static int section_matches(const fc_tune_section *s, const fc_cuda_device *dev)
{
    return s->applies && (s->cc < 0 || s->cc == dev->cc_major * 10 + dev->cc_minor) &&
           (s->sms < 0 || s->sms == dev->sm_count) && (s->cudart < 0 || s->cudart == dev->runtime_version) &&
           (strcmp(s->gpu, "*") == 0 || strcmp(s->gpu, dev->name) == 0);
}

static const fc_tune_entry *find_exact(const fc_tune_section *s, uint64_t key)
{
    int lo = 0, hi = s->n_exact - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        const uint64_t k = s->exact[mid].key;
        if (k == key) return &s->exact[mid];
        if (k < key) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

const fc_tune_entry *fc_tune_find(const fc_tune_cache *c, const fc_cuda_device *dev, uint64_t key)
{
    if (!c) return NULL;
    for (int i = 0; i < c->n_sec; i++) {
        if (!c->sec[i].n_exact || !section_matches(&c->sec[i], dev)) continue;
        const fc_tune_entry *e = find_exact(&c->sec[i], key);
        if (e) return e;
    }
    for (int i = 0; i < c->n_sec; i++) {
        const fc_tune_section *s = &c->sec[i];
        if (!s->n_wild || !section_matches(s, dev)) continue;
        for (int j = 0; j < s->n_wild; j++)
            if ((key & ~s->wild[j].wild) == s->wild[j].key) return &s->wild[j];
    }
    return NULL;
}

#define FIELD(name, def, lo, hi, rows, passes) {#name, offsetof(fc_tuning, name), def, lo, hi, rows, passes}
const fc_tune_field fc_tune_fields[FC_TUNE_NUM_FIELDS] = {
    FIELD(sm90_config, -1, -1, 0, fc_sm90_tile_row, FC_TUNE_FWD),
    FIELD(sm80_config, -1, -1, 0, fc_sm80_tile_row, FC_TUNE_FWD),
    FIELD(sm80_bwd_config, -1, -1, 0, fc_sm80_bwd_tile_row, FC_TUNE_BWD),
    FIELD(sm90_bwd_config, -1, -1, 0, fc_sm90_bwd_tile_row, FC_TUNE_BWD),
    FIELD(sm90_rotate, -1, -1, 1, NULL, FC_TUNE_FWD),
    FIELD(sm90_tail, -1, -1, 1, NULL, FC_TUNE_FWD),
    FIELD(sm90_grid, 0, 0, INT32_MAX, NULL, FC_TUNE_FWD),
    FIELD(splits, 0, 0, FC_MAX_SPLITS, NULL, FC_TUNE_FWD),
    FIELD(pdl, -1, -1, 1, NULL, FC_TUNE_FWD | FC_TUNE_BWD),
    FIELD(masks, -1, -1, 2, NULL, FC_TUNE_FWD),
};
#undef FIELD

int32_t fc_tune_field_max(const fc_tune_field *f)
{
    if (!f->rows) return f->hi;
    fc_tile_row r;
    int32_t n = 0;
    while (f->rows(n, &r)) n++;
    return n - 1;
}

int fc_tune_choice_sets(const fc_tune_choice *c)
{
    int n = c->path != 0;
    for (int i = 0; i < FC_TUNE_NUM_FIELDS; i++) n += fc_tune_get(&c->t, &fc_tune_fields[i]) != fc_tune_fields[i].def;
    return n;
}

const char *fc_tune_choice_misfit(const fc_tune_choice *c, int bwd, char *buf, size_t n)
{
    for (int i = 0; i < FC_TUNE_NUM_FIELDS; i++) {
        const fc_tune_field *f = &fc_tune_fields[i];
        if (fc_tune_get(&c->t, f) == f->def || (f->passes & (bwd ? FC_TUNE_BWD : FC_TUNE_FWD))) continue;
        if (bwd) snprintf(buf, n, "a backward entry sets only path, sm80_bwd_config, sm90_bwd_config and pdl");
        else snprintf(buf, n, "%s is a backward field (on a fwd entry)", f->name);
        return buf;
    }
    return NULL;
}

/* ---- sections and entries ------------------------------------------------------ */

static int grow(void **buf, int *cap, int need, size_t size)
{
    if (need <= *cap) return 0;
    int n = *cap ? *cap * 2 : 8;
    while (n < need) n *= 2;
    void *p = realloc(*buf, (size_t)n * size);
    if (!p) return -1;
    *buf = p;
    *cap = n;
    return 0;
}

fc_status fc_tune_section_add(fc_tune_section *s, fc_tune_entry *e, int replace)
{
    if (e->wild) {
        for (int i = 0; i < s->n_wild; i++)
            if (s->wild[i].key == e->key && s->wild[i].wild == e->wild) {
                if (!replace) return FC_ERR_INVALID_ARGUMENT;
                free(s->wild[i].comment);
                s->wild[i] = *e;
                return FC_OK;
            }
        if (grow((void **)&s->wild, &s->cap_wild, s->n_wild + 1, sizeof *s->wild)) return FC_ERR_OUT_OF_MEMORY;
        s->wild[s->n_wild++] = *e;
        return FC_OK;
    }
    int lo = 0, hi = s->n_exact; /* first index with key >= e->key */
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (s->exact[mid].key < e->key) lo = mid + 1;
        else hi = mid;
    }
    if (lo < s->n_exact && s->exact[lo].key == e->key) {
        if (!replace) return FC_ERR_INVALID_ARGUMENT;
        free(s->exact[lo].comment);
        s->exact[lo] = *e;
        return FC_OK;
    }
    if (grow((void **)&s->exact, &s->cap_exact, s->n_exact + 1, sizeof *s->exact)) return FC_ERR_OUT_OF_MEMORY;
    memmove(&s->exact[lo + 1], &s->exact[lo], (size_t)(s->n_exact - lo) * sizeof *s->exact);
    s->exact[lo] = *e;
    s->n_exact++;
    return FC_OK;
}

void fc_tune_cache_free(fc_tune_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_sec; i++) {
        fc_tune_section *s = &c->sec[i];
        for (int j = 0; j < s->n_exact; j++) free(s->exact[j].comment);
        for (int j = 0; j < s->n_wild; j++) free(s->wild[j].comment);
        free(s->exact);
        free(s->wild);
    }
    free(c->sec);
    free(c->path);
    free(c);
}

/* A deep copy of c (NULL: an empty cache), private to its new owner. */
static fc_tune_cache *copy_cache(const fc_tune_cache *c)
{
    fc_tune_cache *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->refs = 1;
    if (!c) return n;
    if (c->path && !(n->path = strdup(c->path))) goto fail;
    if (grow((void **)&n->sec, &n->cap_sec, c->n_sec, sizeof *n->sec)) goto fail;
    for (int i = 0; i < c->n_sec; i++) {
        const fc_tune_section *s = &c->sec[i];
        fc_tune_section *d = &n->sec[n->n_sec++];
        *d = *s;
        d->exact = d->wild = NULL;
        d->n_exact = d->cap_exact = d->n_wild = d->cap_wild = 0;
        const fc_tune_entry *lists[2] = {s->exact, s->wild};
        const int counts[2] = {s->n_exact, s->n_wild};
        for (int l = 0; l < 2; l++)
            for (int j = 0; j < counts[l]; j++) {
                fc_tune_entry e = lists[l][j];
                if (e.comment && !(e.comment = strdup(e.comment))) goto fail;
                if (fc_tune_section_add(d, &e, 0)) {
                    free(e.comment);
                    goto fail;
                }
            }
    }
    return n;
fail:
    fc_tune_cache_free(n);
    return NULL;
}

/* The section of c for exactly dev on this build, made if missing and make
 * is set (else NULL). */
static fc_tune_section *device_section(fc_tune_cache *c, const fc_cuda_device *dev, int make)
{
    const int cc = dev->cc_major * 10 + dev->cc_minor;
    for (int i = 0; i < c->n_sec; i++) {
        fc_tune_section *s = &c->sec[i];
        if (s->applies && strcmp(s->library, FLASHCORE_VERSION_STRING) == 0 &&
            strcmp(s->tables, fc_tune_tables_id()) == 0 && s->cc == cc && s->sms == dev->sm_count &&
            s->cudart == dev->runtime_version && strcmp(s->gpu, dev->name) == 0)
            return s;
    }
    if (!make || grow((void **)&c->sec, &c->cap_sec, c->n_sec + 1, sizeof *c->sec)) return NULL;
    fc_tune_section *s = &c->sec[c->n_sec++];
    memset(s, 0, sizeof *s);
    snprintf(s->library, sizeof s->library, "%s", FLASHCORE_VERSION_STRING);
    snprintf(s->tables, sizeof s->tables, "%s", fc_tune_tables_id());
    snprintf(s->gpu, sizeof s->gpu, "%s", dev->name);
    s->cc = cc;
    s->sms = dev->sm_count;
    s->cudart = dev->runtime_version;
    s->applies = 1;
    return s;
}

/* ---- sharing ---------------------------------------------------------------------- */

/* Loaded caches by file identity, so that contexts share one copy. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static fc_tune_cache **g_loaded;
static int g_n_loaded, g_cap_loaded;

void fc_tune_cache_release(fc_tune_cache *c)
{
    if (!c) return;
    pthread_mutex_lock(&g_lock);
    const int left = --c->refs;
    if (left == 0 && c->shared)
        for (int i = 0; i < g_n_loaded; i++)
            if (g_loaded[i] == c) {
                g_loaded[i] = g_loaded[--g_n_loaded];
                break;
            }
    pthread_mutex_unlock(&g_lock);
    if (left == 0) fc_tune_cache_free(c);
}

/* Largest tuning file read (a cache of a few thousand entries is ~1 MB). */
#define FC_TUNE_MAX_FILE (64 << 20)

static fc_status read_file(const char *path, const struct stat *st, char **out, char *err, size_t err_len)
{
    if (!S_ISREG(st->st_mode)) {
        snprintf(err, err_len, "tuning cache %s is not a regular file", path);
        return FC_ERR_INVALID_ARGUMENT;
    }
    if (st->st_size > FC_TUNE_MAX_FILE) {
        snprintf(err, err_len, "tuning cache %s is %lld bytes: more than the %d a cache may have", path,
                 (long long)st->st_size, FC_TUNE_MAX_FILE);
        return FC_ERR_INVALID_ARGUMENT;
    }
    FILE *f = fopen(path, "rb");
    char *buf = malloc((size_t)st->st_size + 1);
    size_t n = f && buf ? fread(buf, 1, (size_t)st->st_size, f) : 0;
    const int ok = f && buf && n == (size_t)st->st_size;
    if (f) fclose(f);
    if (!ok) {
        free(buf);
        snprintf(err, err_len, "cannot read tuning cache %s%s", path, buf ? "" : ": out of memory");
        return buf ? FC_ERR_INVALID_ARGUMENT : FC_ERR_OUT_OF_MEMORY;
    }
    buf[n] = 0;
    *out = buf;
    return FC_OK;
}

static int same_file(const fc_tune_cache *c, const struct stat *st)
{
    return c->dev == (int64_t)st->st_dev && c->ino == (int64_t)st->st_ino && c->size == (int64_t)st->st_size &&
           c->mtime_ns == (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* A new reference to the cache of path: the registry's copy when the file
 * is unchanged since it was read, else a fresh parse added to it. */
static fc_status load_shared(const char *path, fc_tune_cache **out, char *err, size_t err_len)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, err_len, "cannot open tuning cache %s", path);
        return FC_ERR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n_loaded; i++)
        if (same_file(g_loaded[i], &st)) {
            g_loaded[i]->refs++;
            *out = g_loaded[i];
            pthread_mutex_unlock(&g_lock);
            return FC_OK;
        }
    pthread_mutex_unlock(&g_lock);
    char *text = NULL;
    fc_status s = read_file(path, &st, &text, err, err_len);
    fc_tune_cache *c = NULL;
    if (!s) s = fc_tune_parse(text, (size_t)st.st_size, path, &c, err, err_len);
    free(text);
    if (s) return s;
    c->dev = (int64_t)st.st_dev;
    c->ino = (int64_t)st.st_ino;
    c->size = (int64_t)st.st_size;
    c->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    c->shared = 1;
    pthread_mutex_lock(&g_lock);
    if (grow((void **)&g_loaded, &g_cap_loaded, g_n_loaded + 1, sizeof *g_loaded) == 0) g_loaded[g_n_loaded++] = c;
    else c->shared = 0; /* not shareable, still usable */
    pthread_mutex_unlock(&g_lock);
    *out = c;
    return FC_OK;
}

fc_status fc_tune_cache_load(fc_tune_cache **slot, const char *path, char *err, size_t err_len)
{
    fc_tune_cache *c = NULL;
    if (path) {
        const fc_status st = load_shared(path, &c, err, err_len);
        if (st) return st;
    }
    fc_tune_cache_release(*slot);
    *slot = c;
    return FC_OK;
}

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static fc_tune_cache *g_env;
static fc_status g_env_status;
static char g_env_err[FC_ERRMSG_LEN];

static void env_once(void)
{
    const char *path = getenv("FLASHCORE_TUNING_CACHE");
    if (!path || !*path) return;
    char why[FC_ERRMSG_LEN] = "";
    g_env_status = load_shared(path, &g_env, why, sizeof why);
    if (g_env_status)
        snprintf(g_env_err, sizeof g_env_err, "FLASHCORE_TUNING_CACHE: %s; contexts run without it", why);
}

fc_tune_cache *fc_tune_cache_from_env(fc_status *st, char *err, size_t err_len)
{
    pthread_once(&g_env_once, env_once);
    *st = g_env_status;
    if (g_env_status) snprintf(err, err_len, "%s", g_env_err);
    if (!g_env) return NULL;
    pthread_mutex_lock(&g_lock);
    g_env->refs++; /* the process keeps its own reference: read once */
    pthread_mutex_unlock(&g_lock);
    return g_env;
}

/* ---- recording ------------------------------------------------------------------ */

/* Remove key's exact entry from s (NULL: none), if there is one. */
static void forget(fc_tune_section *s, uint64_t key)
{
    fc_tune_entry *e = s ? (fc_tune_entry *)find_exact(s, key) : NULL;
    if (!e) return;
    free(e->comment);
    memmove(e, e + 1, (size_t)(s->n_exact - (int)(e - s->exact) - 1) * sizeof *e);
    s->n_exact--;
}

fc_status fc_tune_record(fc_tune_cache **slot, const fc_cuda_device *dev, uint64_t key, const fc_tune_choice *choice,
                         const char *comment, char *err, size_t err_len)
{
    fc_tune_cache *c = *slot;
    if (!c || c->shared) { /* copy on write: a private cache has one owner */
        fc_tune_cache *n = copy_cache(c);
        if (!n) {
            snprintf(err, err_len, "out of memory copying the tuning cache");
            return FC_ERR_OUT_OF_MEMORY;
        }
        fc_tune_cache_release(c);
        *slot = c = n;
    }
    fc_tune_section *s = device_section(c, dev, choice != NULL);
    if (!choice) {
        forget(s, key);
        return FC_OK;
    }
    fc_tune_entry e = {key, 0, *choice, NULL};
    e.choice.t.sm90_trace_file = NULL;
    if (!s || (comment && *comment && !(e.comment = strdup(comment))) || fc_tune_section_add(s, &e, 1)) {
        free(e.comment);
        snprintf(err, err_len, "out of memory recording a tuning entry");
        return FC_ERR_OUT_OF_MEMORY;
    }
    return FC_OK;
}
