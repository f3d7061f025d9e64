/*
 * cli_common.c -- flag parsing, backend names, context creation, error
 * reports and the progress line, shared by every subcommand.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* ---- flags ------------------------------------------------------------------------ */

void cli_args_init(cli_args *a, const char *cmd, int argc, char **argv)
{
    a->argc = argc;
    a->argv = argv;
    a->i = 0;
    a->cmd = cmd;
    a->inline_val = NULL;
}

const char *cli_next(cli_args *a)
{
    static char flag[128];
    a->inline_val = NULL;
    if (a->i >= a->argc) return NULL;
    const char *s = a->argv[a->i++];
    const char *eq = strncmp(s, "--", 2) == 0 ? strchr(s, '=') : NULL;
    if (eq && (size_t)(eq - s) < sizeof(flag)) {
        memcpy(flag, s, (size_t)(eq - s));
        flag[eq - s] = '\0';
        a->inline_val = eq + 1;
        return flag;
    }
    return s;
}

int cli_is(const cli_args *a, const char *arg, const char *name) { return strcmp(arg, name) == 0; }

const char *cli_value(cli_args *a, const char *flag)
{
    if (a->inline_val) {
        const char *v = a->inline_val;
        a->inline_val = NULL;
        return v;
    }
    /* "--json --iters 5" is a forgotten value, not a file named --iters
     * (a value that really starts with "--" can be given as --flag=--x) */
    if (a->i >= a->argc || strncmp(a->argv[a->i], "--", 2) == 0) {
        fprintf(stderr, "flashcore %s: %s needs a value (see flashcore %s --help)\n", a->cmd, flag, a->cmd);
        return NULL;
    }
    return a->argv[a->i++];
}

int cli_int(cli_args *a, const char *flag, long long lo, long long hi, long long *out)
{
    const char *v = cli_value(a, flag);
    if (!v) return -1;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end != '\0' || x < lo || x > hi) {
        fprintf(stderr, "flashcore %s: %s: expected an integer in [%lld, %lld], got '%s'\n", a->cmd,
                flag, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_double(cli_args *a, const char *flag, double lo, double hi, double *out)
{
    const char *v = cli_value(a, flag);
    if (!v) return -1;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end != '\0' || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "flashcore %s: %s: expected a number in [%g, %g], got '%s'\n", a->cmd, flag,
                lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_unknown(const cli_args *a, const char *arg)
{
    fprintf(stderr, "flashcore %s: unknown %s '%s' (see flashcore %s --help)\n", a->cmd,
            arg[0] == '-' ? "option" : "argument", arg, a->cmd);
    return CLI_EXIT_USAGE;
}

int cli_no_value(cli_args *a, const char *flag)
{
    if (!a->inline_val) return 0;
    fprintf(stderr, "flashcore %s: %s takes no value\n", a->cmd, flag);
    return -1;
}

/* ---- backends ----------------------------------------------------------------------- */

int cli_parse_backend(const char *cmd, const char *s, fc_backend *out)
{
    if (strcmp(s, "auto") == 0) *out = FC_BACKEND_AUTO;
    else if (strcmp(s, "cpu") == 0) *out = FC_BACKEND_CPU;
    else if (strcmp(s, "cuda") == 0 || strcmp(s, "gpu") == 0) *out = FC_BACKEND_CUDA;
    else if (strcmp(s, "reference") == 0 || strcmp(s, "ref") == 0) *out = FC_BACKEND_CPU_REFERENCE;
    else {
        fprintf(stderr, "flashcore %s: --backend: expected auto, cpu, cuda or reference, got '%s'\n", cmd, s);
        return -1;
    }
    return 0;
}

const char *cli_backend_name(fc_backend b)
{
    switch (b) {
    case FC_BACKEND_AUTO: return "auto";
    case FC_BACKEND_CPU: return "cpu";
    case FC_BACKEND_CUDA: return "cuda";
    case FC_BACKEND_CPU_REFERENCE: return "reference";
    }
    return "?";
}

fc_backend cli_resolve_backend(fc_backend b)
{
    if (b != FC_BACKEND_AUTO) return b;
    return fc_cuda_available() ? FC_BACKEND_CUDA : FC_BACKEND_CPU;
}

int cli_require_backend(const char *cmd, fc_context *ctx, fc_backend resolved)
{
    if (resolved != FC_BACKEND_CUDA) return 0;
    if (!fc_cuda_available()) {
        char buf[256];
        fc_status st = fc_cuda_device_info(ctx, buf, sizeof(buf));
        if (st == FC_OK) /* a device, but not of a compiled architecture */
            fprintf(stderr,
                    "flashcore %s: --backend cuda: %s: device %s: this build has no kernels for "
                    "its architecture (fc_cuda_available() is 0)\n",
                    cmd, fc_status_string(FC_ERR_NO_DEVICE), buf);
        else
            cli_report(cmd, "--backend cuda", ctx, st);
        return -1;
    }
    if (!cli_cuda_compiled()) {
        fprintf(stderr, "flashcore %s: --backend cuda: this CLI was built without the CUDA runtime\n", cmd);
        return -1;
    }
    return 0;
}

/* ---- library errors ------------------------------------------------------------------- */

fc_context *cli_context(const char *cmd, int threads)
{
    fc_context *ctx = NULL;
    fc_status st = fc_context_create(&ctx);
    if (st != FC_OK) {
        fprintf(stderr, "flashcore %s: fc_context_create: %s\n", cmd, fc_status_string(st));
        return NULL;
    }
    st = fc_context_set_num_threads(ctx, threads);
    if (st != FC_OK) {
        cli_report(cmd, "--threads", ctx, st);
        fc_context_free(ctx);
        return NULL;
    }
    if (kit_tuning_from_env(ctx) != FC_OK) {
        fc_context_free(ctx);
        return NULL;
    }
    return ctx;
}

void cli_report(const char *cmd, const char *what, fc_context *ctx, fc_status st)
{
    const char *msg = fc_last_error(ctx);
    fprintf(stderr, "flashcore %s: %s: %s%s%s\n", cmd, what, fc_status_string(st),
            msg && msg[0] ? ": " : "", msg ? msg : "");
}

/* ---- progress line -------------------------------------------------------------------- */

static int g_progress_tty = -1;
static int g_progress_shown;

void cli_progress(int i, int n, const char *what)
{
    if (g_progress_tty < 0) g_progress_tty = isatty(fileno(stderr));
    if (g_progress_tty) {
        /* \033[K clears what a longer previous line left behind */
        fprintf(stderr, "\r[%d/%d] %s ...\033[K", i, n, what);
        g_progress_shown = 1;
    } else {
        fprintf(stderr, "[%d/%d] %s ...\n", i, n, what);
    }
    fflush(stderr);
}

void cli_progress_done(void)
{
    if (g_progress_tty > 0 && g_progress_shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    g_progress_shown = 0;
}
