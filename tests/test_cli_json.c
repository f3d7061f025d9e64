/*
 * test_cli_json.c -- the kit's JSON writer/reader (tools/kit_json.c) and the
 * bench file reader behind `flashcore compare`: round trips (strings with
 * every escape, numbers that must read back bit-exact), writer misuse,
 * malformed documents (each must be rejected with a line/column message,
 * never crash), and bench files in flashcore, peer and anchor layouts.
 */
#define _POSIX_C_SOURCE 200809L /* mkstemp, fdopen */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "kit_json.h"

/* this file's messages are short: show the failed condition too */
#define TEST_UTIL_SHOW_COND
#include "test_util.h"

static void test_round_trip(void)
{
    /* strings: quotes, backslash, control characters, DEL, UTF-8 */
    const char *strings[] = {
        "", "plain", "quote \" backslash \\ slash /", "ctl \n\r\t\b\f \x01\x1f end", "del \x7f",
        "utf8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "torch-flash(FA2)",
    };
    const double numbers[] = {0.0, -0.0, 1.0, -1.5, 0.1, 1.0 / 3.0, 123456789.123456789, 1e-300, 1.7976931348623157e308,
                              5e-324, 42.0, 6.02214076e23};
    const int ns = (int)(sizeof(strings) / sizeof(strings[0])), nn = (int)(sizeof(numbers) / sizeof(numbers[0]));
    for (int pretty = 0; pretty < 2; pretty++) {
        kit_jw w;
        kit_jw_init(&w, pretty);
        kit_jw_object_begin(&w);
        kit_jw_key(&w, "strings");
        kit_jw_array_begin(&w);
        for (int i = 0; i < ns; i++) kit_jw_string(&w, strings[i]);
        kit_jw_array_end(&w);
        kit_jw_key(&w, "numbers");
        kit_jw_array_begin(&w);
        for (int i = 0; i < nn; i++) kit_jw_number(&w, numbers[i]);
        kit_jw_array_end(&w);
        kit_jw_kv_int(&w, "int", -9007199254740991LL);
        kit_jw_kv_bool(&w, "t", 1);
        kit_jw_kv_bool(&w, "f", 0);
        kit_jw_kv_number(&w, "nan", NAN);
        kit_jw_kv_number(&w, "inf", INFINITY);
        kit_jw_key(&w, "empty_obj");
        kit_jw_object_begin(&w);
        kit_jw_object_end(&w);
        kit_jw_key(&w, "empty_arr");
        kit_jw_array_begin(&w);
        kit_jw_array_end(&w);
        kit_jw_kv_string(&w, "key \"with\" escapes\n", "v");
        kit_jw_object_end(&w);
        const char *doc = kit_jw_result(&w);
        CHECK(doc != NULL, "writer failed (pretty=%d)", pretty);
        if (!doc) {
            kit_jw_free(&w);
            continue;
        }
        kit_json *j = NULL;
        char err[256];
        int rc = kit_json_parse(doc, strlen(doc), &j, err, sizeof(err));
        CHECK(rc == 0, "parse of written document failed: %s\n%s", err, doc);
        if (rc == 0) {
            const kit_json *s = kit_json_get(j, "strings");
            CHECK(s && s->type == KIT_JSON_ARRAY && s->n == (size_t)ns, "strings array");
            for (int i = 0; s && i < ns && (size_t)i < s->n; i++)
                CHECK(s->items[i].type == KIT_JSON_STRING && strcmp(s->items[i].string, strings[i]) == 0,
                      "string %d differs after round trip", i);
            const kit_json *num = kit_json_get(j, "numbers");
            CHECK(num && num->n == (size_t)nn, "numbers array");
            for (int i = 0; num && i < nn && (size_t)i < num->n; i++)
                CHECK(num->items[i].type == KIT_JSON_NUMBER && num->items[i].number == numbers[i] &&
                          signbit(num->items[i].number) == signbit(numbers[i]),
                      "number %d: wrote %.17g, read %.17g", i, numbers[i], num->items[i].number);
            const kit_json *v = kit_json_get(j, "int");
            CHECK(v && v->type == KIT_JSON_NUMBER && v->number == -9007199254740991.0, "int");
            v = kit_json_get(j, "t");
            CHECK(v && v->type == KIT_JSON_BOOL && v->boolean == 1, "true");
            v = kit_json_get(j, "f");
            CHECK(v && v->type == KIT_JSON_BOOL && v->boolean == 0, "false");
            v = kit_json_get(j, "nan");
            CHECK(v && v->type == KIT_JSON_NULL, "NaN must be written as null");
            v = kit_json_get(j, "inf");
            CHECK(v && v->type == KIT_JSON_NULL, "Inf must be written as null");
            v = kit_json_get(j, "empty_obj");
            CHECK(v && v->type == KIT_JSON_OBJECT && v->n == 0, "empty object");
            v = kit_json_get(j, "empty_arr");
            CHECK(v && v->type == KIT_JSON_ARRAY && v->n == 0, "empty array");
            v = kit_json_get(j, "key \"with\" escapes\n");
            CHECK(v && v->type == KIT_JSON_STRING && strcmp(v->string, "v") == 0, "escaped key");
            CHECK(kit_json_get(j, "missing") == NULL, "missing key");
        }
        kit_json_free(j);
        kit_jw_free(&w);
    }
}

static void test_writer_misuse(void)
{
    kit_jw w;
    kit_jw_init(&w, 0);
    kit_jw_object_begin(&w);
    kit_jw_string(&w, "value without key");
    CHECK(kit_jw_result(&w) == NULL, "a value without a key in an object must fail");
    kit_jw_free(&w);

    kit_jw_init(&w, 0);
    kit_jw_array_begin(&w);
    kit_jw_key(&w, "k");
    CHECK(kit_jw_result(&w) == NULL, "a key in an array must fail");
    kit_jw_free(&w);

    kit_jw_init(&w, 0);
    kit_jw_object_begin(&w);
    CHECK(kit_jw_result(&w) == NULL, "an open container is not a document");
    kit_jw_array_end(&w);
    CHECK(kit_jw_result(&w) == NULL, "mismatched close must fail");
    kit_jw_free(&w);

    kit_jw_init(&w, 0);
    for (int i = 0; i < KIT_JW_MAX_DEPTH + 1; i++) kit_jw_array_begin(&w);
    CHECK(w.failed, "nesting past KIT_JW_MAX_DEPTH must fail");
    kit_jw_free(&w);

    kit_jw_init(&w, 0);
    kit_jw_int(&w, 1);
    kit_jw_int(&w, 2);
    CHECK(kit_jw_result(&w) == NULL, "two root values must fail");
    kit_jw_free(&w);
}

static void test_parser_accepts(void)
{
    const char *ok[] = {
        "0", "-0", "1e5", "-1.25E-3", "\"\"", "null", "true", "false", " [ ] ", "{}",
        "{\"a\":[1,{\"b\":null}],\"c\":\"\\u00e9\\ud83d\\ude00\"}", "[\"\\u0000\"]",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        kit_json *j = NULL;
        char err[256];
        int rc = kit_json_parse(ok[i], strlen(ok[i]), &j, err, sizeof(err));
        CHECK(rc == 0 && j != NULL, "valid input %zu '%s' rejected: %s", i, ok[i], err);
        kit_json_free(j);
    }
    /* \u00e9 decodes to U+00E9; surrogate halves to U+FFFD each */
    kit_json *j = NULL;
    char err[256];
    const char *s = "{\"c\":\"\\u00e9\\ud83d\\ude00\"}";
    if (kit_json_parse(s, strlen(s), &j, err, sizeof(err)) == 0) {
        const kit_json *c = kit_json_get(j, "c");
        CHECK(c && strcmp(c->string, "\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd") == 0, "\\u escapes decode to UTF-8");
    }
    kit_json_free(j);
    /* the text need not be NUL-terminated: only len bytes are read */
    const char buf[] = {'[', '1', '2', ']', 'x'};
    j = NULL;
    CHECK(kit_json_parse(buf, 4, &j, err, sizeof(err)) == 0 && j->items[0].number == 12.0, "length-bounded parse");
    kit_json_free(j);
}

static void test_parser_rejects(void)
{
    static char deep[4096];
    memset(deep, '[', sizeof(deep) - 1);
    const char *bad[] = {
        "", "   ", "{", "[", "[1,]", "[1 2]", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{a:1}", "{\"a\":1 \"b\":2}",
        "[01]", "[1.]", "[.5]", "[1e]", "[-]", "[+1]", "[NaN]", "[Infinity]", "[1e999]", "tru", "nul", "[true false]",
        "\"unterminated", "\"bad \\x escape\"", "\"ctl \x01 char\"", "\"\\u12G4\"", "{} {}", "[1] x", "\"\\", "{\"rows\": [1, 2,", deep,
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kit_json *j = (kit_json *)1;
        char err[256] = "";
        int rc = kit_json_parse(bad[i], strlen(bad[i]), &j, err, sizeof(err));
        CHECK(rc != 0 && j == NULL, "malformed input %zu accepted: '%.40s'", i, bad[i]);
        CHECK(strncmp(err, "line ", 5) == 0, "input %zu: error lacks a position: '%s'", i, err);
    }
    /* the position points at the fault */
    kit_json *j = NULL;
    char err[256];
    const char *s = "{\n  \"a\": 1,\n  \"b\": x\n}";
    kit_json_parse(s, strlen(s), &j, err, sizeof(err));
    CHECK(strstr(err, "line 3, column 8") != NULL, "position of the fault: got '%s'", err);
}

static void test_bench_files(void)
{
    char err[512];
    kit_bench_file f;

    /* flashcore's own layout */
    const char *ours =
        "{\"meta\": {\"git_sha\": \"abc123\", \"device_name\": \"NVIDIA H100\"}, \"rows\": ["
        "{\"shape\": \"mission\", \"system\": \"flashcore-cuda\", \"B\": 1, \"Hq\": 8, \"Hkv\": 8, \"Sq\": 512, "
        "\"Sk\": 512, \"D\": 64, \"causal\": false, \"dtype\": \"f16\", \"backend\": \"cuda\", \"kernel\": \"k\", "
        "\"p50_us\": 10.5, \"p90_us\": 11, \"mean_us\": 10.7, \"std_us\": 0.2, \"graph_us\": null, \"tflops\": 51.1, "
        "\"iters\": 200},"
        "{\"shape\": \"gqa-decode\", \"backend\": \"cpu\", \"p50_us\": 3}]}";
    int rc = kit_bench_file_parse(ours, strlen(ours), &f, err, sizeof(err));
    CHECK(rc == 0, "flashcore layout rejected: %s", err);
    if (rc == 0) {
        CHECK(f.n == 2, "rows: %d", f.n);
        CHECK(strcmp(f.git_sha, "abc123") == 0 && strcmp(f.device, "NVIDIA H100") == 0, "meta");
        CHECK(f.rows[0].p50_us == 10.5 && f.rows[0].p90_us == 11 && isnan(f.rows[0].graph_us), "timings");
        CHECK(f.rows[0].Sk == 512 && f.rows[0].causal == 0 && strcmp(f.rows[0].dtype, "f16") == 0, "dims");
        CHECK(strcmp(f.rows[1].system, "flashcore-cpu") == 0, "system from backend: '%s'", f.rows[1].system);
        CHECK(f.rows[1].B == -1 && f.rows[1].causal == -1 && isnan(f.rows[1].tflops), "unknowns");
        kit_bench_file_free(&f);
    }

    /* a peer: one "system" per row, its own field names */
    const char *peer = "{\"rows\": [{\"shape\": \"mission\", \"system\": \"torch-cudnn\", \"us\": 9.1, "
                       "\"us_graph\": 8.9, \"Skv\": 512, \"dtype\": \"float16\", \"causal\": true}]}";
    rc = kit_bench_file_parse(peer, strlen(peer), &f, err, sizeof(err));
    CHECK(rc == 0, "peer layout rejected: %s", err);
    if (rc == 0) {
        CHECK(f.n == 1 && strcmp(f.rows[0].system, "torch-cudnn") == 0, "peer system");
        CHECK(f.rows[0].p50_us == 9.1 && f.rows[0].graph_us == 8.9 && f.rows[0].Sk == 512, "peer aliases");
        CHECK(strcmp(f.rows[0].dtype, "f16") == 0 && f.rows[0].causal == 1, "peer dtype/causal");
        kit_bench_file_free(&f);
    }

    /* the anchors: one object per system inside a row; errors are counted */
    const char *anchor = "{\"device\": \"NVIDIA H200\", \"rows\": [{\"shape\": \"seed-mission\", \"B\": 1, "
                         "\"torch-flash(FA2)\": {\"us\": 46.78, \"us_graph\": 9.89, \"tflops\": 54.3}, "
                         "\"torch-cudnn\": {\"us\": 46.98, \"us_graph\": 8.91, \"tflops\": 60.3}, "
                         "\"torch-flex(Triton)\": {\"error\": \"unsupported\"}}]}";
    rc = kit_bench_file_parse(anchor, strlen(anchor), &f, err, sizeof(err));
    CHECK(rc == 0, "anchor layout rejected: %s", err);
    if (rc == 0) {
        CHECK(f.n == 2 && f.n_errors == 1, "anchor rows %d errors %d", f.n, f.n_errors);
        CHECK(strcmp(f.rows[1].system, "torch-cudnn") == 0 && f.rows[1].graph_us == 8.91 && f.rows[1].B == 1,
              "anchor row content");
        CHECK(strcmp(f.device, "NVIDIA H200") == 0, "anchor device");
        kit_bench_file_free(&f);
    }

    /* bench/peers.py rows: flat, "error" rows are not loaded, "check" is kept,
     * an object member of a row with "system" is not a system entry */
    const char *peers = "{\"meta\": {}, \"rows\": ["
                        "{\"system\": \"flashcore-sm90\", \"shape\": \"mission\", \"p50_us\": 8.5, "
                        "\"graph_us\": 8.5, \"check\": \"ok\", \"extra\": {\"us\": 1}},"
                        "{\"system\": \"torch-cudnn\", \"shape\": \"mission\", \"p50_us\": 9, \"check\": \"FAIL\"},"
                        "{\"system\": \"fa4\", \"shape\": \"mission\", \"error\": \"unavailable: no wheel\"}]}";
    rc = kit_bench_file_parse(peers, strlen(peers), &f, err, sizeof(err));
    CHECK(rc == 0, "peers.py layout rejected: %s", err);
    if (rc == 0) {
        CHECK(f.n == 2 && f.n_errors == 1, "peers rows %d errors %d", f.n, f.n_errors);
        CHECK(strcmp(f.rows[0].system, "flashcore-sm90") == 0 && !f.rows[0].check_failed, "peers row 0");
        CHECK(f.rows[1].check_failed == 1 && f.rows[1].p50_us == 9, "peers row 1: check FAIL kept and marked");
        kit_bench_file_free(&f);
    }

    /* the pass: a row's own, else meta's, else "fwd"; anything else is refused */
    const char *passes = "{\"meta\": {\"pass\": \"bwd\"}, \"rows\": ["
                         "{\"shape\": \"gqa-train\", \"system\": \"flashcore-cuda\", \"p50_us\": 1},"
                         "{\"shape\": \"gqa-train\", \"system\": \"flashcore-cuda\", \"pass\": \"fwd\", \"p50_us\": 2}]}";
    rc = kit_bench_file_parse(passes, strlen(passes), &f, err, sizeof(err));
    CHECK(rc == 0 && f.n == 2, "pass rows: %s", err);
    if (rc == 0) {
        CHECK(strcmp(f.rows[0].pass, "bwd") == 0, "pass from meta: '%s'", f.rows[0].pass);
        CHECK(strcmp(f.rows[1].pass, "fwd") == 0, "a row's pass over meta's: '%s'", f.rows[1].pass);
        kit_bench_file_free(&f);
    }
    rc = kit_bench_file_parse(ours, strlen(ours), &f, err, sizeof(err));
    CHECK(rc == 0 && strcmp(f.rows[0].pass, "fwd") == 0, "no pass anywhere reads as fwd");
    if (rc == 0) kit_bench_file_free(&f);
    const char *bad_pass[] = {
        "{\"meta\": {\"pass\": \"backward\"}, \"rows\": []}",
        "{\"rows\": [{\"shape\": \"x\", \"pass\": \"both\"}]}",
        "{\"rows\": [{\"shape\": \"x\", \"pass\": 2}]}",
    };
    for (size_t i = 0; i < sizeof(bad_pass) / sizeof(bad_pass[0]); i++) {
        err[0] = '\0';
        rc = kit_bench_file_parse(bad_pass[i], strlen(bad_pass[i]), &f, err, sizeof(err));
        CHECK(rc != 0 && f.rows == NULL && strstr(err, "pass"), "bad pass %zu: rc %d '%s'", i, rc, err);
    }

    /* the bwd anchor file: the root is an array of rows */
    const char *bwd = "[{\"shape\": \"s512-d64\", \"torch-cudnn\": {\"us\": 921.0, \"tflops\": 186.5}}]";
    rc = kit_bench_file_parse(bwd, strlen(bwd), &f, err, sizeof(err));
    CHECK(rc == 0 && f.n == 1 && f.rows[0].p50_us == 921.0, "root array of rows: %s", err);
    if (rc == 0) kit_bench_file_free(&f);

    /* malformed or wrong-typed bench files: rejected with a message */
    const char *bad[] = {
        "{\"rows\": [",                                        /* truncated JSON */
        "{\"meta\": {}}",                                      /* no rows */
        "{\"rows\": {}}",                                      /* rows not an array */
        "{\"rows\": [1]}",                                     /* row not an object */
        "{\"rows\": [{\"p50_us\": 1}]}",                       /* no shape */
        "{\"rows\": [{\"shape\": 7}]}",                        /* shape not a string */
        "{\"rows\": [{\"shape\": \"x\", \"p50_us\": \"fast\"}]}", /* number expected */
        "{\"rows\": [{\"shape\": \"x\", \"B\": -1}]}",         /* bad dimension */
        "{\"rows\": [{\"shape\": \"x\", \"B\": 1.5}]}",        /* bad dimension */
        "{\"rows\": [{\"shape\": \"x\", \"causal\": \"yes\"}]}", /* bad causal */
        "{\"rows\": [{\"shape\": \"x\", \"sys\": {\"us\": []}}]}", /* nested timing wrong type */
        "garbage\x01\x02",
        "\"just a string\"",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        rc = kit_bench_file_parse(bad[i], strlen(bad[i]), &f, err, sizeof(err));
        CHECK(rc != 0 && f.rows == NULL && f.n == 0, "bad bench file %zu accepted", i);
        CHECK(err[0] != '\0', "bad bench file %zu: no message", i);
    }

    /* files: missing, and a malformed one on disk */
    rc = kit_bench_file_read("/nonexistent/dir/bench.json", &f, err, sizeof(err));
    CHECK(rc != 0 && strstr(err, "cannot open") != NULL, "missing file: '%s'", err);
    char path[] = "/tmp/test_cli_json_XXXXXX";
    int fd = mkstemp(path);
    FILE *fp = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(fp != NULL, "cannot create a temporary file");
    if (fp) {
        fputs("{\"rows\": [{\"shape\": \"mission\", \"p50_us\": 1,}]}", fp);
        fclose(fp);
        rc = kit_bench_file_read(path, &f, err, sizeof(err));
        CHECK(rc != 0 && strstr(err, "malformed JSON") && strstr(err, "line 1"), "malformed file: '%s'", err);
        remove(path);
    }
}

int main(void)
{
    test_round_trip();
    test_writer_misuse();
    test_parser_accepts();
    test_parser_rejects();
    test_bench_files();
    return test_summary();
}
