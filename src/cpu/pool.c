/*
 * pool.c -- the worker threads of the tiled CPU paths (see pool.h).
 *
 * A call publishes its job under the mutex with a new generation number
 * and wakes the workers; workers 1 .. active-1 run it (worker 0 is the
 * caller) and count themselves out; the caller returns once the count is
 * 0, so a job's stack frame outlives every worker that reads it. A worker
 * started for a call is handed the generation before that call's, so it
 * cannot miss the job it was started for.
 */
#define _POSIX_C_SOURCE 200809L /* sysconf, getpid */

#include "pool.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct pool_job {
    fc_pool_fn fn;
    void *arg;
    int64_t nitems;
    atomic_llong next; /* next unclaimed item */
} pool_job;

typedef struct pool_worker {
    fc_pool *pool;
    int index;
    uint64_t seen; /* the last generation this worker has looked at */
    pthread_t tid;
} pool_worker;

struct fc_pool {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* workers: a new generation, or stop        */
    pthread_cond_t done; /* the caller: remaining reached 0           */
    uint64_t gen;
    pool_job *job;       /* the current generation's job              */
    int active;          /* workers 0 .. active-1 run the current job */
    int remaining;       /* of workers 1 .. active-1, those not done  */
    int stop;
    int started;         /* workers 1 .. started-1 exist               */
    int cap;             /* length of workers[]                        */
    pool_worker **workers;
    pid_t pid;           /* the process whose threads these are        */
    void **blocks;       /* scratch kept between calls                 */
    size_t block_bytes;  /* each block's size                          */
    int nblocks;
    size_t used_bytes;   /* what the current call's layout uses of one */
    unsigned char *dirty; /* per block: to be zeroed by its worker      */
};

int fc_pool_threads(int num_threads, int cap, int64_t nitems, int64_t macs, int64_t min_macs)
{
    int64_t nt = num_threads > 0 ? num_threads : (int64_t)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt > cap) nt = cap;
    if (nt > nitems) nt = nitems;
    if (nt > macs / min_macs) nt = macs / min_macs;
    return nt < 1 ? 1 : (int)nt;
}

/* Zero this worker's block if the call handed it out since (each worker
 * its own, so the pages are touched in parallel), then claim items until
 * none is left. */
static void run_job(fc_pool *pool, pool_job *job, int index)
{
    if (pool && index < pool->nblocks && pool->dirty[index]) {
        memset(pool->blocks[index], 0, pool->used_bytes); /* pad rows and columns must read as 0 */
        pool->dirty[index] = 0;
    }
    for (;;) {
        const int64_t item = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (item >= job->nitems) break;
        job->fn(job->arg, index, item);
    }
}

static void *worker_main(void *p)
{
    pool_worker *w = p;
    fc_pool *pool = w->pool;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (pool->gen == w->seen && !pool->stop) pthread_cond_wait(&pool->wake, &pool->mu);
        if (pool->stop) break;
        w->seen = pool->gen;
        if (w->index >= pool->active) continue; /* not this job's */
        pool_job *job = pool->job;
        pthread_mutex_unlock(&pool->mu);
        run_job(pool, job, w->index);
        pthread_mutex_lock(&pool->mu);
        if (--pool->remaining == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

fc_pool *fc_pool_create(void)
{
    fc_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    if (pthread_mutex_init(&pool->mu, NULL) != 0) goto no_mutex;
    if (pthread_cond_init(&pool->wake, NULL) != 0) goto no_wake;
    if (pthread_cond_init(&pool->done, NULL) != 0) goto no_done;
    pool->started = 1;
    pool->pid = getpid();
    return pool;
no_done:
    pthread_cond_destroy(&pool->wake);
no_wake:
    pthread_mutex_destroy(&pool->mu);
no_mutex:
    free(pool);
    return NULL;
}

static void free_blocks(void **b, int n)
{
    if (!b) return;
    for (int x = 0; x < n; x++) free(b[x]);
    free(b);
}

void fc_pool_destroy(fc_pool *pool)
{
    if (!pool || pool->pid != getpid()) return; /* a fork's child: the threads were the parent's */
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int x = 1; x < pool->started; x++) {
        pthread_join(pool->workers[x]->tid, NULL);
        free(pool->workers[x]);
    }
    free(pool->workers);
    free_blocks(pool->blocks, pool->nblocks);
    free(pool->dirty);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

/* Start workers until nt exist (or one cannot be started); each is handed
 * the current generation, before the job it is started for. They start
 * with every signal blocked: the host's signals stay on its own threads. */
static void grow(fc_pool *pool, int nt)
{
    if (pool->started >= nt) return; /* every call after the first: no signal-mask calls */
    if (nt > pool->cap) {
        pool_worker **w = realloc(pool->workers, (size_t)nt * sizeof *w);
        if (!w) return;
        pool->workers = w;
        pool->cap = nt;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (pool->started < nt) {
        pool_worker *w = calloc(1, sizeof *w);
        if (!w) break;
        w->pool = pool;
        w->index = pool->started;
        w->seen = pool->gen;
        if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
            free(w);
            break;
        }
        pool->workers[pool->started++] = w;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void fc_pool_run(fc_pool *pool, int nt, int64_t nitems, fc_pool_fn fn, void *arg)
{
    pool_job job;
    job.fn = fn;
    job.arg = arg;
    job.nitems = nitems;
    atomic_init(&job.next, 0);
    if (pool && pool->pid != getpid()) pool = NULL; /* a fork's child: no workers here */
    if (pool && nt > 1) grow(pool, nt); /* the mutex is free: no worker runs between calls */
    const int active = pool && nt > 1 ? (nt < pool->started ? nt : pool->started) : 1;
    if (active > 1) {
        pthread_mutex_lock(&pool->mu);
        pool->job = &job;
        pool->active = active;
        pool->remaining = active - 1;
        pool->gen++;
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mu);
    }
    run_job(pool, &job, 0);
    if (active > 1) {
        pthread_mutex_lock(&pool->mu);
        while (pool->remaining > 0) pthread_cond_wait(&pool->done, &pool->mu);
        pthread_mutex_unlock(&pool->mu);
    }
}

/* nt blocks of bytes; zeroed here when `zero` (no pool to zero them). */
static void **alloc_blocks(int nt, size_t bytes, int zero)
{
    void **b = calloc((size_t)nt, sizeof *b);
    if (!b) return NULL;
    for (int x = 0; x < nt; x++) {
        if (!(b[x] = aligned_alloc(64, bytes))) {
            free_blocks(b, x);
            return NULL;
        }
        if (zero) memset(b[x], 0, bytes);
    }
    return b;
}

void **fc_pool_blocks(fc_pool *pool, int nt, size_t bytes)
{
    if (!pool) return alloc_blocks(nt, bytes, 1);
    if (nt > pool->nblocks || bytes > pool->block_bytes) {
        const int n = nt > pool->nblocks ? nt : pool->nblocks;
        const size_t sz = bytes > pool->block_bytes ? bytes : pool->block_bytes;
        void **b = alloc_blocks(n, sz, 0);
        unsigned char *d = b ? realloc(pool->dirty, (size_t)n) : NULL;
        if (!d) { /* the old blocks stay for later calls */
            free_blocks(b, n);
            return NULL;
        }
        free_blocks(pool->blocks, pool->nblocks);
        pool->blocks = b;
        pool->dirty = d;
        pool->nblocks = n;
        pool->block_bytes = sz;
    }
    pool->used_bytes = bytes;
    memset(pool->dirty, 1, (size_t)nt);
    return pool->blocks;
}

void fc_pool_blocks_free(fc_pool *pool, void **blocks, int nt)
{
    if (!pool) free_blocks(blocks, nt); /* else the pool's, kept */
}
