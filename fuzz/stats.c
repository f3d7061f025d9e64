/*
 * stats.c -- what a fuzz run reached: per entry point the statuses its calls
 * returned and how the successful ones were judged, and which kernels ran
 * (a run that never reached a path has not fuzzed it).
 */
#include <stdio.h>
#include <string.h>

#include "fuzz.h"

fz_stats fz_stats_of[FZ_N_KINDS];

#define FZ_MAX_KERNELS 256
static struct { char name[96]; uint64_t n; } g_kernels[FZ_MAX_KERNELS];
static int g_nkernels;
static uint64_t g_other; /* kernels past the table's end */

static const char *const k_entry[FZ_N_KINDS] = {"forward", "backward", "merge", "tuning"};

void fz_note_kernel(int kind, const char *name)
{
    char key[96];
    snprintf(key, sizeof key, "%s %s", k_entry[kind], name);
    char *split = strstr(key, "+split"); /* +split2, +split17: one entry */
    if (split) split[6] = '\0';
    for (int i = 0; i < g_nkernels; i++)
        if (!strcmp(g_kernels[i].name, key)) { g_kernels[i].n++; return; }
    if (g_nkernels == FZ_MAX_KERNELS) { g_other++; return; }
    snprintf(g_kernels[g_nkernels].name, sizeof g_kernels[0].name, "%s", key);
    g_kernels[g_nkernels++].n = 1;
}

void fz_print_stats(void)
{
    static const char *const names[] = {"ok", "invalid", "unsupported", "oom", "cuda", "no_device", "internal"};
    for (int e = 0; e < FZ_N_KINDS; e++) {
        const fz_stats *s = &fz_stats_of[e];
        printf("%s statuses:", k_entry[e]);
        for (int st = FC_OK; st <= FC_ERR_INTERNAL; st++) printf(" %s %llu", names[st], (unsigned long long)s->status[st]);
        printf(" | ok judged: gated %llu, writes only %llu\n", (unsigned long long)s->gated,
               (unsigned long long)s->loose);
    }
    if (!g_nkernels) return;
    printf("kernels that ran (calls, name):\n");
    for (int i = 0; i < g_nkernels; i++) printf("  %8llu  %s\n", (unsigned long long)g_kernels[i].n, g_kernels[i].name);
    if (g_other) printf("  %8llu  (other kernels)\n", (unsigned long long)g_other);
}
