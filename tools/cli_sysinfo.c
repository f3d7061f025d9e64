/*
 * cli_sysinfo.c -- what a benchmark record says about the machine and the
 * build: CPU model, core count, host, date, git SHA, GPU clock/temperature.
 * Everything here degrades to "unknown" rather than failing a run.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

void cli_cpu_model(char *buf, size_t n)
{
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *p = strchr(line, ':');
        if (!p) break;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        snprintf(buf, n, "%s", p);
        buf[strcspn(buf, "\r\n")] = '\0';
        break;
    }
    fclose(f);
}

int cli_online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void cli_hostname(char *buf, size_t n)
{
    if (n == 0) return;
    if (gethostname(buf, n) != 0) snprintf(buf, n, "unknown");
    buf[n - 1] = '\0';
}

void cli_utc_now_iso8601(char *buf, size_t n)
{
    time_t t = time(NULL);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) snprintf(buf, n, "unknown");
}

void cli_git_sha(char *buf, size_t n)
{
    /* fc_build_info() reads "flashcore X git <sha>; ..." */
    const char *info = fc_build_info();
    const char *p = info ? strstr(info, " git ") : NULL;
    if (!p) {
        snprintf(buf, n, "unknown");
        return;
    }
    p += 5;
    size_t len = strcspn(p, "; ");
    snprintf(buf, n, "%.*s", (int)len, p);
}

void cli_gpu_clock_temp(char *buf, size_t n)
{
    buf[0] = '\0';
    /* nvidia-smi is the one place these are read without linking NVML; its
     * absence is normal (CPU machines) and leaves the field empty. */
    FILE *p = popen("nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader,nounits "
                    "2>/dev/null",
                    "r");
    if (!p) return;
    char line[128];
    if (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\r\n")] = '\0';
        unsigned mhz = 0, temp = 0;
        if (sscanf(line, "%u, %u", &mhz, &temp) == 2) snprintf(buf, n, "sm %u MHz, %u C", mhz, temp);
    }
    pclose(p);
}

const char *cli_compiler(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown compiler";
#endif
}
