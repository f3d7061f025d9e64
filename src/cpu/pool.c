/*
 * pool.c -- the worker threads of the tiled CPU paths (see pool.h).
 */
#define _POSIX_C_SOURCE 200809L /* sysconf */

#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fc_pool_threads(int num_threads, int cap, int64_t nitems, int64_t macs, int64_t min_macs)
{
    int64_t nt = num_threads > 0 ? num_threads : (int64_t)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt > cap) nt = cap;
    if (nt > nitems) nt = nitems;
    if (nt > macs / min_macs) nt = macs / min_macs;
    return nt < 1 ? 1 : (int)nt;
}

typedef struct pool_job {
    fc_pool_fn fn;
    void *arg;
    int64_t nitems;
    atomic_llong next; /* next unclaimed item */
} pool_job;

typedef struct pool_worker {
    pool_job *job;
    int index;
    pthread_t tid;
} pool_worker;

/* Claim items until none is left. */
static void *worker_main(void *p)
{
    pool_worker *w = p;
    pool_job *job = w->job;
    for (;;) {
        const int64_t item = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (item >= job->nitems) break;
        job->fn(job->arg, w->index, item);
    }
    return NULL;
}

void fc_pool_run(int nt, int64_t nitems, fc_pool_fn fn, void *arg)
{
    pool_job job;
    job.fn = fn;
    job.arg = arg;
    job.nitems = nitems;
    atomic_init(&job.next, 0);
    pool_worker *w = nt > 1 ? calloc((size_t)nt, sizeof *w) : NULL;
    pool_worker self = {.job = &job, .index = 0};
    if (!w) { /* one worker, or no memory for more: all on this thread */
        worker_main(&self);
        return;
    }
    int started = 1;
    for (int x = 0; x < nt; x++) {
        w[x].job = &job;
        w[x].index = x;
    }
    for (; started < nt; started++)
        if (pthread_create(&w[started].tid, NULL, worker_main, &w[started]) != 0) break;
    worker_main(&w[0]);
    for (int x = 1; x < started; x++) pthread_join(w[x].tid, NULL);
    free(w);
}

void **fc_pool_blocks(int nt, size_t bytes)
{
    void **b = calloc((size_t)nt, sizeof *b);
    if (!b) return NULL;
    for (int x = 0; x < nt; x++) {
        b[x] = aligned_alloc(64, bytes);
        if (!b[x]) {
            fc_pool_blocks_free(b, x);
            return NULL;
        }
        memset(b[x], 0, bytes); /* pad rows and columns must read as 0 */
    }
    return b;
}

void fc_pool_blocks_free(void **blocks, int nt)
{
    if (!blocks) return;
    for (int x = 0; x < nt; x++) free(blocks[x]);
    free(blocks);
}
