/*
 * flashcore.c -- the `flashcore` command: subcommand dispatch, --help and
 * --version. Each subcommand lives in tools/cli_<name>.c and is a client of
 * the public API (flashcore.h) and the kit only.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command k_commands[] = {
    {"demo", cli_demo, "run the headline shape on the best backend, check it, time it"},
    {"check", cli_check, "correctness runner: named and random shapes vs the fp64 reference"},
    {"bench", cli_bench, "timing runner: the benchmark shapes or custom ones, JSON output"},
    {"compare", cli_compare, "Markdown speedup table of two bench JSON files"},
    {"rows", cli_rows, "the CUDA tile-table rows, one per line (for scripts)"},
    {"tune", cli_tune, "measure kernel choices for shapes, write a tuning cache file"},
};
#define NUM_COMMANDS ((int)(sizeof(k_commands) / sizeof(k_commands[0])))

static void usage(FILE *f)
{
    fprintf(f,
            "usage: flashcore <command> [options]\n"
            "       flashcore --version | --help\n"
            "       flashcore help <command>\n\n"
            "FlashCore %s: fused exact attention, forward and backward.\n\ncommands:\n",
            fc_version_string());
    for (int i = 0; i < NUM_COMMANDS; i++) fprintf(f, "  %-9s %s\n", k_commands[i].name, k_commands[i].summary);
    fprintf(f,
            "\nEvery command takes --help. Exit status: 0 success, 1 a check failed or the\n"
            "library reported an error, 2 bad usage or unreadable input.\n");
}

static void version(void)
{
    printf("flashcore %s\n%s\n", fc_version_string(), fc_build_info());
    printf("cuda available: %s\n", fc_cuda_available() ? "yes" : "no");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        version();
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "help") == 0) {
        if (argc < 3) {
            usage(stdout);
            return CLI_EXIT_OK;
        }
        for (int i = 0; i < NUM_COMMANDS; i++) {
            if (strcmp(argv[2], k_commands[i].name) == 0) {
                char help[] = "--help";
                char *args[] = {help, NULL};
                return k_commands[i].run(1, args);
            }
        }
        fprintf(stderr, "flashcore: no command '%s'\n", argv[2]);
        return CLI_EXIT_USAGE;
    }
    for (int i = 0; i < NUM_COMMANDS; i++)
        if (strcmp(cmd, k_commands[i].name) == 0) return k_commands[i].run(argc - 2, argv + 2);
    fprintf(stderr, "flashcore: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
