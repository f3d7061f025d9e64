/*
 * driver.c -- the seeded random driver, for builds without libFuzzer: feeds
 * fz_run_one with PRNG bytes for a number of cases or seconds, or replays
 * input files. On a failure (the target's or a sanitizer's) it saves the
 * input as fuzz-crash-<seed>-<case>.bin, which replays with the same binary.
 * Every case is also written to fuzz-current.bin before it runs (removed
 * at a clean end): a sanitizer runtime that calls no death callback (gcc's
 * separate libubsan) still leaves the reproducer behind.
 *
 *     fc_fuzz_driver [--cases N] [--seconds S] [--seed X] [file...]
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "kit.h"

#if defined(FZ_SANITIZE) && defined(__has_include) /* the sanitized build links the runtime */
#if __has_include(<sanitizer/common_interface_defs.h>)
#include <sanitizer/common_interface_defs.h>
#define FZ_HAVE_SANITIZER_HOOK 1
#endif
#endif

static uint8_t g_buf[1024];
static size_t g_len;
static uint64_t g_seed, g_case;

static void save_input(void)
{
    char name[96];
    snprintf(name, sizeof name, "fuzz-crash-%llu-%llu.bin", (unsigned long long)g_seed, (unsigned long long)g_case);
    FILE *f = fopen(name, "wb");
    if (f) {
        fwrite(g_buf, 1, g_len, f);
        fclose(f);
    }
    const char *skip = getenv("FC_FUZZ_SKIP");
    fprintf(stderr, "reproducer: %s (replay: FC_FUZZ_SKIP=%s fc_fuzz_driver %s)\n", name, skip ? skip : "", name);
}

#ifdef FZ_HAVE_SANITIZER_HOOK
/* A sanitizer report: say which call it was, then keep the input. */
static void on_death(void)
{
    if (fz_describe) fz_describe();
    fflush(stderr);
    if (fz_on_failure) fz_on_failure();
}
#endif

static int replay(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); return 1; }
    g_len = fread(g_buf, 1, sizeof g_buf, f);
    fclose(f);
    fprintf(stderr, "replaying %s (%zu bytes)\n", path, g_len);
    return fz_run_one(g_buf, g_len);
}

int main(int argc, char **argv)
{
    long long cases = -1;
    double seconds = -1;
    int nfiles = 0;
    g_seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cases") && i + 1 < argc) cases = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) g_seed = strtoull(argv[++i], NULL, 0);
        else argv[++nfiles] = argv[i];
    }
    fz_init();
    fz_on_failure = nfiles ? NULL : save_input; /* a replayed file is its own reproducer */
#ifdef FZ_HAVE_SANITIZER_HOOK
    __sanitizer_set_death_callback(on_death);
#endif
    fz_verbose = nfiles > 0;
    for (int i = 1; i <= nfiles; i++)
        if (replay(argv[i])) return 1;
    if (nfiles > 1) fz_print_stats();
    if (nfiles) return 0;
    if (cases < 0 && seconds < 0) cases = 10000;
    const int cur = open("fuzz-current.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const double t0 = kit_now();
    /* The seed is mixed into the state: splitmix64 steps its state by a
     * constant, so seed s + d would replay seed s's stream d draws later
     * (nearby seeds, such as times, fell into the same cases). */
    uint64_t rng = g_seed;
    rng = kit_rand_u64(&rng);
    for (g_case = 0; cases < 0 || (long long)g_case < cases; g_case++) {
        if (seconds >= 0 && kit_now() - t0 >= seconds) break;
        g_len = 64 + kit_rand_u64(&rng) % (sizeof g_buf - 64);
        for (size_t i = 0; i < g_len; i++) g_buf[i] = (uint8_t)kit_rand_u64(&rng);
        if (cur >= 0 && (pwrite(cur, g_buf, g_len, 0) != (ssize_t)g_len || ftruncate(cur, (off_t)g_len))) {
            fprintf(stderr, "cannot write fuzz-current.bin\n");
            return 1;
        }
        fz_run_one(g_buf, g_len);
    }
    const double dt = kit_now() - t0;
    if (cur >= 0) { close(cur); unlink("fuzz-current.bin"); }
    printf("fuzz driver: seed %llu, %llu cases in %.1f s (%.0f exec/s), no failure\n", (unsigned long long)g_seed,
           (unsigned long long)g_case, dt, dt > 0 ? (double)g_case / dt : 0.0);
    fz_print_stats();
    return 0;
}
