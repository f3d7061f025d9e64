/*
 * test_pool.c -- the CPU workers' pool (src/cpu/pool.h) on its own:
 *   1. over many calls of one pool, with worker counts 1-8 in varying
 *      order and item counts from 0 up, every item runs exactly once and
 *      each worker index stays in range;
 *   2. the scratch given to a call is zeroed for each running worker,
 *      after the previous call wrote into it, once per fc_pool_blocks (a
 *      second run of the same call keeps what the first wrote); blocks
 *      grow and are kept;
 *   3. a NULL pool runs a call on the calling thread alone;
 *   4. in a fork's child the parent's pool still completes calls (on the
 *      calling thread), and destroying it there returns;
 *   5. the workers run with every signal blocked (the host's stay its own).
 * Run under ThreadSanitizer by hand (-fsanitize=thread) when pool.c changes.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu/pool.h"
#include "test_util.h"

#define MAX_ITEMS 5000
#define MAX_WORKERS 8

typedef struct count_job {
    atomic_int runs[MAX_ITEMS];
    atomic_int bad_worker;
    int nt;
    void **blocks;
    size_t bytes;
    atomic_int dirty; /* a worker found its block not zeroed */
    atomic_int on_caller_only; /* every item ran on the calling thread */
    atomic_int worker_unmasked; /* a worker thread could take SIGINT or SIGTERM */
    pthread_t caller;
    int slow; /* each item sleeps 1 ms: the workers get some */
} count_job;

static void count_item(void *arg, int worker, int64_t item)
{
    count_job *j = arg;
    atomic_fetch_add(&j->runs[item], 1);
    if (j->slow) nanosleep(&(struct timespec){0, 1000000}, NULL);
    if (worker < 0 || worker >= j->nt) atomic_store(&j->bad_worker, 1);
    if (!pthread_equal(pthread_self(), j->caller)) {
        atomic_store(&j->on_caller_only, 0);
        sigset_t cur;
        pthread_sigmask(SIG_BLOCK, NULL, &cur);
        if (!sigismember(&cur, SIGINT) || !sigismember(&cur, SIGTERM)) atomic_store(&j->worker_unmasked, 1);
    }
    if (j->blocks) {
        unsigned char *b = j->blocks[worker];
        /* zeroed before the worker's first item; each item writes its first byte */
        for (size_t x = 1; x < j->bytes; x++)
            if (b[x]) {
                atomic_store(&j->dirty, 1);
                break;
            }
        b[0] = 0xA5;
    }
}

static void no_op(void *arg, int worker, int64_t item)
{
    (void)arg, (void)worker, (void)item;
}

/* A run of nt workers and 8 items that touch no scratch. */
static void one_run_plain(fc_pool *pool, int nt) { fc_pool_run(pool, nt, 8, no_op, NULL); }

/* One call of nt workers and n items; 1 when every item ran once. */
static int one_call(fc_pool *pool, int nt, int64_t n, size_t bytes, count_job *j)
{
    memset(j, 0, sizeof *j);
    for (int64_t x = 0; x < MAX_ITEMS; x++) atomic_init(&j->runs[x], 0);
    atomic_init(&j->bad_worker, 0);
    atomic_init(&j->dirty, 0);
    atomic_init(&j->on_caller_only, 1);
    atomic_init(&j->worker_unmasked, 0);
    j->nt = nt;
    j->caller = pthread_self();
    j->bytes = bytes;
    j->blocks = bytes ? fc_pool_blocks(pool, nt, bytes) : NULL;
    if (bytes && !j->blocks) return 0;
    if (j->blocks && pool) /* dirty every kept block, as an earlier call may (a NULL pool's are fresh) */
        for (int w = 0; w < nt; w++) memset(j->blocks[w], 0x5A, bytes);
    fc_pool_run(pool, nt, n, count_item, j);
    int ok = !atomic_load(&j->bad_worker) && !atomic_load(&j->dirty) && !atomic_load(&j->worker_unmasked);
    for (int64_t x = 0; x < n; x++) ok = ok && atomic_load(&j->runs[x]) == 1;
    for (int64_t x = n; x < MAX_ITEMS; x++) ok = ok && atomic_load(&j->runs[x]) == 0;
    if (j->blocks) fc_pool_blocks_free(pool, j->blocks, nt);
    return ok;
}

int main(void)
{
    static count_job job;
    fc_pool *pool = fc_pool_create();
    CHECK(pool != NULL, "fc_pool_create");
    if (!pool) return 1;

    /* 1, 2: many calls on one pool */
    const int nts[] = {1, 4, 2, 8, 3, 8, 1, 5, 7, 2};
    const int64_t ns[] = {0, 1, 7, 64, 1000, MAX_ITEMS, 3, 250, 9, 4999};
    const size_t sizes[] = {0, 64, 4096, 64, 1 << 16, 0, 128, 1 << 16, 192, 64};
    int all = 1;
    for (int rep = 0; rep < 20; rep++)
        for (int c = 0; c < 10; c++) {
            const int nt = nts[(c + rep) % 10];
            const int ok = one_call(pool, nt, ns[c], sizes[(c + 3 * rep) % 10], &job);
            if (!ok)
                printf("  call nt=%d n=%lld bytes=%zu failed\n", nt, (long long)ns[c], sizes[(c + 3 * rep) % 10]);
            all = all && ok;
        }
    CHECK(all, "200 calls: every item once, worker indices in range, scratch zeroed per worker, "
               "workers with signals blocked");

    /* zeroed once per fc_pool_blocks: a second run keeps the first's writes */
    {
        void **b = fc_pool_blocks(pool, 2, 128);
        int kept = 0;
        if (b) {
            memset(b[0], 0x5A, 128);
            one_run_plain(pool, 2);
            const int zeroed = ((unsigned char *)b[0])[5] == 0;
            ((unsigned char *)b[0])[5] = 7;
            one_run_plain(pool, 2);
            kept = zeroed && ((unsigned char *)b[0])[5] == 7;
        }
        CHECK(kept, "a block is zeroed at the first run after fc_pool_blocks, not at the next");
    }

    /* the workers take part (items slow enough that the caller cannot take them all) */
    memset(&job, 0, sizeof job);
    {
        count_job *j = &job;
        for (int64_t x = 0; x < MAX_ITEMS; x++) atomic_init(&j->runs[x], 0);
        atomic_init(&j->on_caller_only, 1);
        atomic_init(&j->bad_worker, 0);
        atomic_init(&j->worker_unmasked, 0);
        j->nt = 4;
        j->slow = 1;
        j->caller = pthread_self();
        fc_pool_run(pool, 4, 64, count_item, j);
        int once = 1;
        for (int x = 0; x < 64; x++) once = once && atomic_load(&j->runs[x]) == 1;
        CHECK(once && !atomic_load(&j->on_caller_only) && !atomic_load(&j->worker_unmasked),
              "4 workers, 64 slow items: each once, some on the pool's threads, signals blocked there");
    }

    /* 3: NULL pool */
    CHECK(one_call(NULL, 4, 100, 256, &job) && atomic_load(&job.on_caller_only),
          "a NULL pool runs every item on the calling thread");

    /* 4: a fork's child */
    fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
        int ok = one_call(pool, 4, 300, 0, &job) && atomic_load(&job.on_caller_only);
        fc_pool_destroy(pool); /* returns: the threads are the parent's */
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "in a fork's child the pool's calls complete on the calling thread");
    CHECK(one_call(pool, 6, 500, 64, &job), "the parent's pool still works after the fork");

    fc_pool_destroy(pool);
    fc_pool_destroy(NULL);
    return test_summary();
}
