/*
 * cli_rows.c -- `flashcore rows`: the CUDA paths' tile-table rows, one line
 * each, from the library (fc_tuning_row_info, fc_tuning_bwd_row_info), so
 * scripts force rows by index (fc_tuning's sm80_config / sm90_config, and
 * the backward's sm80_bwd_config / sm90_bwd_config) without reading the
 * C++ tables.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void help(void)
{
    printf("usage: flashcore rows [--path 80|90] [--bwd]\n\n"
           "Print the rows of a CUDA tile table, one per line:\n"
           "  index head_dim block_m block_n threads stages ctas kvsplit tall arch_class variant kernel\n"
           "Without --path both tables, each after a \"# path N\" line.\n"
           "index is what a tuning cache's sm90_config / sm80_config take; kernel is the first\n"
           "row with the same kernel; kvsplit and tall are the Hopper table's, arch_class and\n"
           "variant the sm80 table's (0 where a path has no such column).\n"
           "--bwd: the backward's tables instead (sm80_bwd_config / sm90_bwd_config take\n"
           "their indices; path 80's stages is 2, the Q and dO buffers; path 90's its\n"
           "Q/dO ring).\n\n"
           "Exit status: 0 listed, 1 this build has no CUDA backend, 2 bad usage.\n");
}

int cli_rows(int argc, char **argv)
{
    cli_args a;
    cli_args_init(&a, "rows", argc, argv);
    long long only = 0;
    int bwd = 0;
    const char *arg;
    while ((arg = cli_next(&a))) {
        if (cli_is(&a, arg, "--help") || cli_is(&a, arg, "-h")) {
            help();
            return CLI_EXIT_OK;
        } else if (cli_is(&a, arg, "--path")) {
            if (cli_int(&a, "--path", 80, 90, &only)) return CLI_EXIT_USAGE;
            if (only != 80 && only != 90) {
                fprintf(stderr, "flashcore rows: --path: use 80 or 90\n");
                return CLI_EXIT_USAGE;
            }
        } else if (cli_is(&a, arg, "--bwd")) {
            bwd = 1;
        } else {
            cli_unknown(&a, arg);
            return CLI_EXIT_USAGE;
        }
    }
    const int paths[2] = {90, 80};
    for (int k = 0; k < 2; k++) {
        if (only && paths[k] != only) continue;
        fc_tile_row r;
        fc_status st;
        int i = 0;
        if (!only) printf("# path %d\n", paths[k]);
        while ((st = bwd ? fc_tuning_bwd_row_info(paths[k], i, &r) : fc_tuning_row_info(paths[k], i, &r)) == FC_OK) {
            printf("%d %d %d %d %d %d %d %d %d %d %d %d\n", i, (int)r.head_dim, (int)r.block_m,
                   (int)r.block_n, (int)r.threads, (int)r.stages, (int)r.ctas, (int)r.kvsplit, (int)r.tall,
                   (int)r.arch_class, (int)r.variant, (int)r.kernel);
            i++;
        }
        if (st == FC_ERR_UNSUPPORTED) {
            fprintf(stderr, "flashcore rows: this build has no CUDA backend, so no tile tables\n");
            return CLI_EXIT_FAIL;
        }
    }
    return CLI_EXIT_OK;
}
