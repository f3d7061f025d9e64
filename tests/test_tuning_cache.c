/*
 * test_tuning_cache.c -- the tuning cache without a GPU (src/tuning_*.c):
 *  - buckets: every length maps to the smallest bound at or above it;
 *  - keys: what a bucket shares and what separates two buckets;
 *  - round trip: text -> cache -> text is a fixed point, and lookups on a
 *    fake device find the entries written;
 *  - keys of another build or device: loaded, reported, never applied;
 *  - corrupt files: each refused with its line named, the context's cache
 *    untouched; random mutations of a valid file never crash;
 *  - wildcards, and exact entries first;
 *  - sharing: contexts that load one unchanged file share one copy;
 *  - record without a device: a clear error, nothing changed;
 *  - the tuner's verdict (kit_tune_decide): noise, the smallest gain, and
 *    ties resolved to the planner, then to the earlier candidate.
 * The GPU side (an entry runs and matches the reference; an entry naming a
 * row that cannot run the call is ignored) is in test_cuda_tuning.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api_internal.h"
#include "test_util.h"
#include "tuning_cache.h"

static char g_dir[] = "/tmp/fc_tune_XXXXXX";

static void write_text(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(text, 1, n, f);
        fclose(f);
    }
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 20);
    if (buf && fread(buf, 1, (1 << 20) - 1, f) == 0) buf[0] = 0;
    fclose(f);
    return buf;
}

/* A device like the one the test's sections name. */
static fc_cuda_device fake_device(const char *name, int cc, int sms)
{
    fc_cuda_device d;
    memset(&d, 0, sizeof d);
    d.cc_major = cc / 10;
    d.cc_minor = cc % 10;
    d.sm_count = sms;
    d.runtime_version = 13000;
    snprintf(d.name, sizeof d.name, "%s", name);
    return d;
}

static fc_fwd_params params(int b, int hq, int hkv, int sq, int sk, int d, int causal)
{
    fc_fwd_params p;
    memset(&p, 0, sizeof p);
    p.batch = b;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    p.head_dim = d;
    p.dtype = p.kv_dtype = FC_DTYPE_BF16;
    p.window_left = -1;
    p.window_right = causal ? 0 : -1;
    p.causal = causal;
    return p;
}

static void test_buckets(void)
{
    int p0 = g_pass, f0 = g_fail;
    static const int64_t bounds[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256};
    for (int i = 0; i < (int)(sizeof bounds / sizeof bounds[0]); i++)
        CHECK(fc_tune_bound(i) == bounds[i], "bound(%d) = %lld, want %lld", i, (long long)fc_tune_bound(i),
              (long long)bounds[i]);
    int bad = 0;
    for (int64_t x = 0; x <= 300000; x++) {
        const int b = fc_tune_bucket(x);
        bad += !(fc_tune_bound(b) >= x && (b == 0 || fc_tune_bound(b - 1) < x));
    }
    CHECK(bad == 0, "%d lengths in 0..300000 not in the smallest bucket above them", bad);
    CHECK(fc_tune_bucket(1000) == fc_tune_bucket(1024) && fc_tune_bucket(1025) != fc_tune_bucket(1024),
          "1000 and 1024 share a bucket, 1025 does not");
    CHECK(fc_tune_bound(fc_tune_bucket((int64_t)1 << 40)) >= ((int64_t)1 << 40), "large counts bucket upward");
    group_done("buckets", p0, f0);
}

static void test_keys(void)
{
    int p0 = g_pass, f0 = g_fail;
    const fc_fwd_params a = params(2, 16, 16, 1000, 1000, 128, 1);
    fc_fwd_params b = a;
    b.seqlen_q = b.seqlen_k = 1024; /* same buckets */
    CHECK(fc_tune_key(&a, NULL) == fc_tune_key(&b, NULL), "1000 and 1024 tokens share a key");
    struct { const char *what; fc_fwd_params p; } diff[12];
    int n = 0;
#define DIFF(name, stmt)                                                                                          \
    do {                                                                                                          \
        diff[n].what = name;                                                                                      \
        diff[n].p = a;                                                                                            \
        fc_fwd_params *q = &diff[n++].p;                                                                          \
        stmt;                                                                                                     \
    } while (0)
    DIFF("seqlen_q", q->seqlen_q = 1100);
    DIFF("seqlen_k", q->seqlen_k = 2000);
    DIFF("batch", q->batch = 3);
    DIFF("head_dim", q->head_dim = 96);
    DIFF("gqa", q->heads_kv = 4);
    DIFF("dtype", q->dtype = q->kv_dtype = FC_DTYPE_F16);
    DIFF("kv dtype", q->kv_dtype = FC_DTYPE_E4M3);
    DIFF("no mask", (q->window_right = -1, q->causal = 0));
    DIFF("local window", q->window_left = 256);
    DIFF("softcap", q->softcap = 30.0f);
    DIFF("paged", (q->block_table = (const int32_t *)&a, q->page_size = 16));
    DIFF("varlen", q->cu_seqlens_q = (const int32_t *)&a);
#undef DIFF
    for (int i = 0; i < n; i++)
        CHECK(fc_tune_key(&diff[i].p, NULL) != fc_tune_key(&a, NULL), "a different %s must change the key",
              diff[i].what);
    fc_bwd_params bw;
    memset(&bw, 0, sizeof bw);
    bw.f = a;
    const uint64_t k0 = fc_tune_key(&a, &bw);
    bw.deterministic = 1;
    CHECK(k0 != fc_tune_key(&a, NULL) && k0 != fc_tune_key(&a, &bw), "pass and determinism separate keys");
    group_done("keys", p0, f0);
}

/* A valid cache text: a section for this build on an "H100-like" device
 * with two exact entries and one wildcard, and one for another build. */
static void valid_text(char *buf, size_t n)
{
    snprintf(buf, n,
             "flashcore-tuning 1\n"
             "# a comment line\n"
             "device library=%s tables=%s cc=9.0 sms=132 cudart=13000 gpu=Fake GPU 80GB\n"
             "fwd dtype=bf16 kv=bf16 d=128 gqa=1 mask=causal flags=- sq=1024 sk=1024 bh=32 : path=90 sm90_config=0 "
             "sm90_tail=1 splits=0  # 1.041x over the planner\n"
             "fwd dtype=bf16 kv=bf16 d=128 gqa=1 mask=none flags=- sq=1024 sk=1024 bh=32 : splits=2 pdl=0\n"
             "bwd det=1 dtype=bf16 d=128 : path=80\n"
             "fwd d=64 : splits=3 masks=2\n"
             "\n"
             "device library=0.0.0 tables=deadbeef cc=8.0 sms=108 cudart=12000 gpu=NVIDIA A100\n"
             "fwd dtype=f16 kv=f16 d=64 gqa=1 mask=none flags=- sq=512 sk=512 bh=64 : sm80_config=2\n",
             FLASHCORE_VERSION_STRING, fc_tune_tables_id());
}

/* valid_text in g_dir/name; its path in path (text gets the text). */
static void write_valid(const char *name, char *path, size_t n, char *text, size_t tn)
{
    valid_text(text, tn);
    snprintf(path, n, "%s/%s", g_dir, name);
    write_text(path, text, strlen(text));
}

static void test_round_trip(void)
{
    int p0 = g_pass, f0 = g_fail;
    char text[4096], p1[256], p2[256];
    write_valid("a.tune", p1, sizeof p1, text, sizeof text);
    snprintf(p2, sizeof p2, "%s/b.tune", g_dir);
    fc_context *ctx = NULL;
    fc_context_create(&ctx);
    fc_status st = fc_context_load_tuning(ctx, p1);
    CHECK(st == FC_OK, "load a valid cache: %s", fc_last_error(ctx));
    CHECK(fc_context_save_tuning(ctx, p2) == FC_OK, "save: %s", fc_last_error(ctx));
    char *t2 = read_text(p2);
    fc_context *ctx2 = NULL;
    fc_context_create(&ctx2);
    CHECK(fc_context_load_tuning(ctx2, p2) == FC_OK, "reload the saved cache: %s", fc_last_error(ctx2));
    CHECK(fc_context_save_tuning(ctx2, p1) == FC_OK, "save again");
    char *t1 = read_text(p1);
    CHECK(t1 && t2 && strcmp(t1, t2) == 0, "save(load(save(x))) == save(x):\n%s\n---\n%s", t1 ? t1 : "",
          t2 ? t2 : "");
    CHECK(t2 && strstr(t2, "# 1.041x over the planner") && strstr(t2, "gpu=NVIDIA A100"),
          "comments and the other build's section are kept");
    { /* the same file with CRLF line ends (an editor's) saves the same bytes */
        char crlf[8192], p3[256];
        size_t n = 0;
        for (const char *c = text; *c && n + 2 < sizeof crlf; c++) {
            if (*c == '\n') crlf[n++] = '\r';
            crlf[n++] = *c;
        }
        snprintf(p3, sizeof p3, "%s/crlf.tune", g_dir);
        write_text(p3, crlf, n);
        fc_context *ctx3 = NULL;
        fc_context_create(&ctx3);
        CHECK(fc_context_load_tuning(ctx3, p3) == FC_OK && fc_context_save_tuning(ctx3, p3) == FC_OK,
              "a CRLF cache loads and saves: %s", fc_last_error(ctx3));
        char *t3 = read_text(p3);
        CHECK(t3 && t2 && strcmp(t3, t2) == 0, "a CRLF cache saves as the LF one:\n%s\n---\n%s", t3 ? t3 : "",
              t2 ? t2 : "");
        free(t3);
        fc_context_free(ctx3);
    }

    /* lookups on the device the first section names */
    const fc_cuda_device dev = fake_device("Fake GPU 80GB", 90, 132);
    const fc_tune_cache *c = ctx2->tune;
    fc_fwd_params causal = params(2, 16, 16, 1000, 1000, 128, 1), plain = params(2, 16, 16, 1000, 1000, 128, 0);
    const fc_tune_entry *e = fc_tune_find(c, &dev, fc_tune_key(&causal, NULL));
    CHECK(e && e->choice.path == 90 && e->choice.t.sm90_config == 0 && e->choice.t.sm90_tail == 1 &&
              e->choice.t.sm90_rotate == -1,
          "the causal entry");
    e = fc_tune_find(c, &dev, fc_tune_key(&plain, NULL));
    CHECK(e && e->choice.t.splits == 2 && e->choice.t.pdl == 0 && e->choice.path == 0, "the unmasked entry");
    fc_bwd_params bw;
    memset(&bw, 0, sizeof bw);
    bw.f = plain;
    bw.deterministic = 1;
    e = fc_tune_find(c, &dev, fc_tune_key(&bw.f, &bw));
    CHECK(e && e->choice.path == 80, "the backward wildcard entry (det=1, any length)");
    bw.deterministic = 0;
    CHECK(!fc_tune_find(c, &dev, fc_tune_key(&bw.f, &bw)), "det=0 is another bucket");
    fc_fwd_params d64 = params(7, 5, 1, 333, 4321, 64, 0);
    e = fc_tune_find(c, &dev, fc_tune_key(&d64, NULL));
    CHECK(e && e->choice.t.splits == 3 && e->choice.t.masks == 2, "the d=64 wildcard entry matches any other field");
    fc_fwd_params d96 = params(2, 16, 16, 1000, 1000, 96, 1);
    CHECK(!fc_tune_find(c, &dev, fc_tune_key(&d96, NULL)), "no entry for d=96");

    char info[1024];
    size_t need = 0, need2 = 0;
    CHECK(fc_context_tuning_info(ctx2, info, sizeof info, &need) == FC_OK && strstr(info, "1 for another build"),
          "info reports the ignored section: %s", info);
    char small[8];
    CHECK(fc_context_tuning_info(ctx2, small, sizeof small, &need2) == FC_OK && strlen(small) == 7 &&
              need == strlen(info) + 1 && need2 == need && fc_context_tuning_info(ctx2, NULL, 0, &need2) == FC_OK &&
              need2 == need,
          "a short buffer gets a prefix and the size it needs: %zu %zu", need, need2);
    free(t1);
    free(t2);
    fc_context_free(ctx);
    fc_context_free(ctx2);
    group_done("round_trip", p0, f0);
}

static void test_other_keys(void)
{
    int p0 = g_pass, f0 = g_fail;
    char text[4096], path[256];
    write_valid("keys.tune", path, sizeof path, text, sizeof text);
    fc_context *ctx = NULL;
    fc_context_create(&ctx);
    CHECK(fc_context_load_tuning(ctx, path) == FC_OK, "load: %s", fc_last_error(ctx));
    const fc_fwd_params causal = params(2, 16, 16, 1000, 1000, 128, 1);
    const fc_fwd_params a100 = params(4, 16, 16, 512, 512, 64, 0);
    const uint64_t k = fc_tune_key(&causal, NULL);
    struct { const char *what; fc_cuda_device d; } devs[] = {
        {"another gpu name", fake_device("Fake GPU 94GB", 90, 132)},
        {"another SM count", fake_device("Fake GPU 80GB", 90, 114)},
        {"another compute capability", fake_device("Fake GPU 80GB", 89, 132)},
    };
    for (int i = 0; i < 3; i++) {
        const fc_tune_entry *e = fc_tune_find(ctx->tune, &devs[i].d, k);
        CHECK(!e || FC_TK_GET(e->wild, D) == 0 || e->choice.t.splits == 3, "%s: no entry applies", devs[i].what);
        CHECK(!e, "%s: nothing found", devs[i].what);
    }
    fc_cuda_device rt = fake_device("Fake GPU 80GB", 90, 132);
    rt.runtime_version = 12080;
    CHECK(!fc_tune_find(ctx->tune, &rt, k), "another CUDA runtime: nothing found");
    const fc_cuda_device a = fake_device("NVIDIA A100", 80, 108);
    CHECK(!fc_tune_find(ctx->tune, &a, fc_tune_key(&a100, NULL)),
          "the section of another library version and tables is never applied");
    fc_context_free(ctx);
    group_done("other_keys", p0, f0);
}

/* Each text is refused with its line in the message; the loaded cache stays. */
static void test_corrupt(void)
{
    int p0 = g_pass, f0 = g_fail;
    char good[4096], path[256], gpath[256];
    write_valid("good.tune", gpath, sizeof gpath, good, sizeof good);
    snprintf(path, sizeof path, "%s/bad.tune", g_dir);
    char dev_line[256];
    snprintf(dev_line, sizeof dev_line, "flashcore-tuning 1\ndevice library=* tables=* cc=* sms=* cudart=* gpu=*\n");
    static const struct { const char *body; const char *want; } cases[] = {
        {"", "empty file"},
        {"hello world\n", "not a tuning cache"},
        {"flashcore-tuning 2\n", "not a tuning cache"},
        {"flashcore-tuning 1\nfwd d=64 : splits=2\n", "before any 'device'"},
        {"@dev fwd d=64 extra\n", "not name=value"},
        {"@dev fwd2 d=64 : splits=2\n", "neither a device line"},
        {"@dev fwd d=64\n", "no ':'"},
        {"@dev fwd d=64 :\n", "chooses nothing"},
        {"@dev fwd d=64 : splits=2 : pdl=0\n", "second ':'"},
        {"@dev fwd d=64 : splits=99\n", "out of range"},
        {"@dev fwd d=64 : splits=two\n", "out of range"},
        {"@dev fwd d=64 : sm90_config=100000\n", "out of range"},
        {"@dev fwd d=64 : path=70\n", "out of range"},
        {"@dev fwd d=64 : pdl=2\n", "out of range"},
        {"@dev fwd d=64 : masks=3\n", "out of range"},
        {"@dev bwd d=64 : masks=2\n", "backward entry sets only"},
        {"@dev fwd d=64 : colour=blue\n", "unknown choice field"},
        {"@dev fwd d=64 d=96 : splits=2\n", "given twice"},
        {"@dev fwd size=64 : splits=2\n", "unknown shape field"},
        {"@dev fwd d=0 : splits=2\n", "bad value"},
        {"@dev fwd dtype=f8 : splits=2\n", "bad value"},
        {"@dev fwd mask=diagonal : splits=2\n", "bad value"},
        {"@dev fwd flags=x : splits=2\n", "bad value"},
        {"@dev fwd sq=1000 : splits=2\n", "not a bucket bound"},
        {"@dev fwd sq=-4 : splits=2\n", "bad value"},
        {"@dev fwd det=1 : splits=2\n", "det=1 on a forward"},
        {"@dev bwd : splits=2\n", "backward entry sets only"},
        {"@dev fwd : sm80_bwd_config=0\n", "backward field"},
        {"@dev fwd : sm90_bwd_config=0\n", "backward field"},
        {"@dev fwd d=64 : splits=2\nfwd d=64 : splits=3\n", "same shape bucket"},
        /* a forward call has det 0: det=* and det=0 are one bucket (else the
         * file saves as two equal lines, which no longer load) */
        {"@dev fwd d=64 det=* : splits=2\nfwd d=64 det=0 : splits=2\n", "same shape bucket"},
        {"@dev fwd dtype=bf16 kv=bf16 d=64 gqa=1 mask=none flags=- sq=8 sk=8 bh=8 : splits=2\n"
         "fwd dtype=bf16 kv=bf16 d=64 gqa=1 mask=none flags=- sq=8 sk=8 bh=8 : splits=3\n",
         "same shape bucket"},
        {"flashcore-tuning 1\ndevice library=* tables=* cc=9 sms=* cudart=* gpu=*\n", "cc '9'"},
        {"flashcore-tuning 1\ndevice library=* tables=* cc=* sms=0 cudart=* gpu=*\n", "sms '0'"},
        {"flashcore-tuning 1\ndevice library=* tables=* cc=* sms=*\n", "'cudart' is missing"},
        {"flashcore-tuning 1\ndevice library=* library=* tables=* cc=* sms=* cudart=* gpu=*\n", "given twice"},
        {"flashcore-tuning 1\ndevice nonsense\n", "not name=value"},
    };
    fc_context *ctx = NULL;
    fc_context_create(&ctx);
    CHECK(fc_context_load_tuning(ctx, gpath) == FC_OK, "the good file loads");
    const fc_tune_cache *before = ctx->tune;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        const char *body = cases[i].body;
        if (strncmp(body, "@dev ", 5) == 0) snprintf(text, sizeof text, "%s%s", dev_line, body + 5);
        else snprintf(text, sizeof text, "%s", body);
        write_text(path, text, strlen(text));
        const fc_status st = fc_context_load_tuning(ctx, path);
        const char *msg = fc_last_error(ctx);
        CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(msg, cases[i].want) && strstr(msg, "bad.tune:"),
              "case %zu (%s): status %d, message '%s'", i, cases[i].want, (int)st, msg);
        CHECK(ctx->tune == before, "case %zu: the loaded cache stays", i);
    }
    /* NUL bytes, an overlong line, no file, a directory */
    const char nul[] = "flashcore-tuning 1\n\0\n";
    write_text(path, nul, sizeof nul - 1);
    CHECK(fc_context_load_tuning(ctx, path) == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), "NUL"),
          "NUL bytes: %s", fc_last_error(ctx));
    char *longl = malloc(10000);
    if (longl) {
        memset(longl, 'x', 9999);
        memcpy(longl, "flashcore-tuning 1\n", 19);
        longl[9999] = 0;
        write_text(path, longl, strlen(longl));
        CHECK(fc_context_load_tuning(ctx, path) == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), "4096"),
              "an overlong line: %s", fc_last_error(ctx));
        free(longl);
    }
    char missing[300];
    snprintf(missing, sizeof missing, "%s/none.tune", g_dir);
    CHECK(fc_context_load_tuning(ctx, missing) == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), "cannot open"),
          "no file: %s", fc_last_error(ctx));
    CHECK(fc_context_load_tuning(ctx, g_dir) == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), "regular"),
          "a directory: %s", fc_last_error(ctx));
    CHECK(fc_context_load_tuning(ctx, "") == FC_ERR_INVALID_ARGUMENT, "an empty path");
    CHECK(ctx->tune == before, "the loaded cache survived them all");
    CHECK(fc_context_load_tuning(NULL, gpath) == FC_ERR_INVALID_ARGUMENT, "ctx NULL");
    CHECK(fc_context_load_tuning(ctx, NULL) == FC_OK && ctx->tune == NULL, "NULL drops the cache");

    /* mutations of the good text: refused or loaded, never a crash */
    uint64_t rng = 12345;
    int loaded = 0, refused = 0, other = 0;
    const size_t n = strlen(good);
    for (int it = 0; it < 3000; it++) {
        char text[4096];
        memcpy(text, good, n + 1);
        for (int m = 0; m < 1 + it % 4; m++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const size_t at = (size_t)(rng >> 33) % n;
            static const char alphabet[] = " =:#*\n-0123456789abcdefxyz.\t\r";
            text[at] = (rng >> 20) & 1 ? alphabet[(rng >> 8) % (sizeof alphabet - 1)] : (char)(rng >> 12);
        }
        const size_t len = strlen(text); /* a NUL ends the text early */
        fc_tune_cache *c = NULL;
        char err[FC_ERRMSG_LEN];
        const fc_status st = fc_tune_parse(text, len, "mut", &c, err, sizeof err);
        if (st == FC_OK) loaded++;
        else if (st == FC_ERR_INVALID_ARGUMENT && strstr(err, "mut:")) refused++;
        else other++;
        fc_tune_cache_free(c);
    }
    CHECK(other == 0 && loaded + refused == 3000, "mutations: %d loaded, %d refused, %d other", loaded, refused,
          other);
    fc_context_free(ctx);
    group_done("corrupt", p0, f0);
}

static void test_sharing(void)
{
    int p0 = g_pass, f0 = g_fail;
    char text[4096], path[256];
    write_valid("shared.tune", path, sizeof path, text, sizeof text);
    fc_context *a = NULL, *b = NULL;
    fc_context_create(&a);
    fc_context_create(&b);
    CHECK(fc_context_load_tuning(a, path) == FC_OK && fc_context_load_tuning(b, path) == FC_OK, "both load");
    CHECK(a->tune && a->tune == b->tune, "one copy for both contexts");
    const fc_tune_cache *first = a->tune;
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL); /* a later mtime */
    strcat(text, "fwd d=256 : splits=4\n");
    write_text(path, text, strlen(text));
    fc_context *c = NULL;
    fc_context_create(&c);
    CHECK(fc_context_load_tuning(c, path) == FC_OK && c->tune != first, "a changed file is read again");
    fc_context_free(a);
    CHECK(b->tune == first, "the first copy lives while a context holds it");
    fc_context_free(b);
    fc_context_free(c);
    group_done("sharing", p0, f0);
}

static void test_record_no_device(void)
{
    int p0 = g_pass, f0 = g_fail;
    fc_context *ctx = NULL;
    fc_context_create(&ctx);
    fc_tuning t;
    fc_tuning_init(&t);
    t.splits = 2;
    fc_attention_args args;
    fc_attention_args_init(&args);
    /* no choice: remove the call's entry, after the call's own checks */
    CHECK(fc_context_record_tuning(ctx, &args, NULL, 0, NULL, NULL) != FC_OK && fc_last_error(ctx)[0],
          "choice NULL on an empty call: %s", fc_last_error(ctx));
    CHECK(fc_context_record_tuning(ctx, NULL, NULL, 0, &t, NULL) == FC_ERR_INVALID_ARGUMENT, "no call");
    CHECK(fc_context_record_tuning(ctx, &args, NULL, 70, &t, NULL) == FC_ERR_INVALID_ARGUMENT, "path 70");
    fc_tuning none;
    fc_tuning_init(&none);
    CHECK(fc_context_record_tuning(ctx, &args, NULL, 0, &none, NULL) == FC_ERR_INVALID_ARGUMENT &&
              strstr(fc_last_error(ctx), "nothing"),
          "a choice that sets nothing: %s", fc_last_error(ctx));
    t.splits = 999;
    CHECK(fc_context_record_tuning(ctx, &args, NULL, 0, &t, NULL) == FC_ERR_INVALID_ARGUMENT &&
              strstr(fc_last_error(ctx), "splits"),
          "a field out of range: %s", fc_last_error(ctx));
    t.splits = 2;
    /* an incomplete call is refused by the call's own checks */
    const fc_status st = fc_context_record_tuning(ctx, &args, NULL, 0, &t, "x");
    CHECK(st != FC_OK && fc_last_error(ctx)[0], "an empty call: %d %s", (int)st, fc_last_error(ctx));
    CHECK(ctx->tune == NULL, "nothing recorded");
    char info[512];
    fc_context_tuning_info(ctx, info, sizeof info, NULL);
    CHECK(strstr(info, "no tuning cache") != NULL, "info: %s", info);
    fc_context_free(ctx);
    group_done("record_no_device", p0, f0);
}

static void test_decide(void)
{
    int p0 = g_pass, f0 = g_fail;
    kit_tune_verdict v;
    const double clear[] = {10, 10, 9.5, 9.8};
    kit_tune_decide(clear, 4, 0.01, &v);
    CHECK(v.recorded && v.winner == 2 && v.gain > 1.05 && v.noise == 0, "a clear win: %d %g", v.winner, v.gain);
    const double noisy[] = {10, 10.4, 9.9};
    kit_tune_decide(noisy, 3, 0.01, &v);
    CHECK(!v.recorded && v.winner == 0 && v.gain == 1.0 && v.best == 2 && v.noise > 0.03,
          "a gain under twice the noise is not recorded: %d %g %g", v.winner, v.gain, v.noise);
    const double small[] = {10, 10, 9.95};
    kit_tune_decide(small, 3, 0.01, &v);
    CHECK(!v.recorded && v.winner == 0, "a gain under min_gain is not recorded");
    const double tie[] = {10, 10, 9, 9, 9.5};
    kit_tune_decide(tie, 5, 0.01, &v);
    CHECK(v.recorded && v.winner == 2, "equal alternatives: the earlier wins (%d)", v.winner);
    const double same[] = {10, 10, 10};
    kit_tune_decide(same, 3, 0.0, &v);
    CHECK(!v.recorded && v.winner == 0 && v.best == 0, "an alternative equal to the planner: the planner");
    const double nan_c[] = {10, 10, NAN, 9};
    kit_tune_decide(nan_c, 4, 0.01, &v);
    CHECK(v.recorded && v.winner == 3, "a candidate without a time is skipped");
    group_done("decide", p0, f0);
}

/* Not a check: what a lookup costs in a cache of 1000 entries. */
static void report_lookup_cost(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/big.tune", g_dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "flashcore-tuning 1\ndevice library=* tables=* cc=9.0 sms=132 cudart=* gpu=Fake GPU 80GB\n");
    for (int i = 0; i < 1000; i++)
        fprintf(f, "fwd dtype=bf16 kv=bf16 d=128 gqa=1 mask=none flags=- sq=%lld sk=%lld bh=%lld : splits=%d\n",
                (long long)fc_tune_bound(1 + i % 20), (long long)fc_tune_bound(1 + (i / 20) % 10),
                (long long)fc_tune_bound(1 + i / 200), 1 + i % 7);
    fclose(f);
    fc_context *ctx = NULL;
    fc_context_create(&ctx);
    if (fc_context_load_tuning(ctx, path) != FC_OK) {
        CHECK(0, "the 1000-entry cache loads: %s", fc_last_error(ctx));
        fc_context_free(ctx);
        return;
    }
    const fc_cuda_device dev = fake_device("Fake GPU 80GB", 90, 132);
    fc_fwd_params p = params(1, 4, 4, 100, 30, 128, 0);
    struct timespec t0, t1;
    int hits = 0;
    const int n = 1000000;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        p.seqlen_q = 1 + (i & 1023);
        hits += fc_tune_find(ctx->tune, &dev, fc_tune_key(&p, NULL)) != NULL;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / n;
    printf("lookup: %.1f ns per key and lookup (1000 entries, %d of %d found)\n", ns, hits, n);
    CHECK(hits > 0, "some lookups hit");
    fc_context_free(ctx);
}

int main(void)
{
    if (!mkdtemp(g_dir)) return test_give_up("cannot make a temporary directory");
    test_buckets();
    test_keys();
    test_round_trip();
    test_other_keys();
    test_corrupt();
    test_sharing();
    test_record_no_device();
    test_decide();
    report_lookup_cost();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
    return test_summary();
}
