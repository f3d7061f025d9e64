/*
 * cli_tune.h -- what the `flashcore tune` files share: the search state of
 * one shape (cli_tune_search.c) that the command (cli_tune.c) drives.
 */
#ifndef FC_CLI_TUNE_H
#define FC_CLI_TUNE_H

#include "cli.h"

#define TUNE_MAX_CANDS 96

/* One way to run the call: a CUDA path (0 the planner's) and hooks. */
typedef struct tune_cand {
    int32_t path;
    fc_tuning t;
    fc_context *own; /* non-NULL: run through this context as it is (its
                      * cache), ignoring path and t (the verify pass)   */
    char name[96]; /* the plan's kernel name (fc_kernel_info)         */
    void *graph;   /* captured calls (tune_measure), or NULL          */
} tune_cand;

typedef struct tune_state {
    fc_context *ctx;      /* no tuning cache: every plan is the planner's or forced */
    cli_exec *e;          /* the shape on the device                                */
    const char *shape;    /* its name, for messages                                 */
    int cc, sms;          /* the device                                             */
    int arch_class;       /* its sm80-table class (80, 86 or 90)                    */
    int calls;            /* calls per captured graph                               */
    int n;
    tune_cand c[TUNE_MAX_CANDS];
} tune_state;

/* The candidate lists (stage 2 from stage 1's medians). */
void tune_stage1(tune_state *ts);
void tune_stage2(tune_state *ts, const double *medians);
/* Check (against the planner's output ref, a host copy) and capture every
 * candidate, dropping those that fail, then time them in interleaved
 * rounds: medians[i] per call. 0, or -1 with err. */
int tune_measure(tune_state *ts, const void *ref, int rounds, double *medians, char *err, size_t n);
/* Destroy the candidates' graphs. */
void tune_release(tune_state *ts);

#endif /* FC_CLI_TUNE_H */
