/*
 * pool.h -- the worker threads of the tiled CPU paths (forward tiled.c,
 * backward tiled_bwd.c, merge.c): a context's pool, created at its first
 * CPU call, whose workers stay parked on a condition variable between
 * calls and claim a call's work items in order from an atomic counter;
 * and the workers' scratch blocks, kept by the pool between calls.
 * Starting the threads and faulting in fresh scratch in every call cost
 * ~2 ms a call on a 16-core Xeon, more than the mission shape's work.
 */
#ifndef FC_CPU_POOL_H
#define FC_CPU_POOL_H

#include <stddef.h>
#include <stdint.h>

/* Below this many multiply-adds per thread, waking a thread costs more
 * than it saves. */
#define FC_POOL_MIN_MACS ((int64_t)1 << 18)

/* One work item: fn(arg, worker, item). worker in [0, nt) names the
 * worker's own scratch; item in [0, nitems). */
typedef void (*fc_pool_fn)(void *arg, int worker, int64_t item);

typedef struct fc_pool fc_pool;

/* A pool with no worker yet (they start as calls need them); NULL when
 * out of memory. Used by one thread at a time, as its context. */
fc_pool *fc_pool_create(void);

/* Stop and join the workers, free the scratch. In a child process of a
 * fork (the workers were the parent's) nothing is joined or freed. */
void fc_pool_destroy(fc_pool *pool);

/* Workers for a call: num_threads (<= 0: one per online core), at most cap
 * and nitems, and no more than one per min_macs of the call's macs; at
 * least 1. */
int fc_pool_threads(int num_threads, int cap, int64_t nitems, int64_t macs, int64_t min_macs);

/* nt zeroed scratch blocks of `bytes` (a multiple of 64) each, 64-byte
 * aligned, worker x's at [x], owned by the pool and reused by its next
 * calls (a NULL pool: allocated and zeroed for this call, released by
 * fc_pool_blocks_free). A pool's are zeroed by their workers at the next
 * fc_pool_run, each before its first item (its pages touched in parallel),
 * once per fc_pool_blocks. NULL when any allocation fails. */
void **fc_pool_blocks(fc_pool *pool, int nt, size_t bytes);
void fc_pool_blocks_free(fc_pool *pool, void **blocks, int nt);

/* Run every item once on nt workers, worker 0 on the calling thread; a
 * NULL pool runs them all on the calling thread. A worker that cannot be
 * started is no error: the others claim its share. Which worker runs an
 * item must not change its result (that is the caller's part of
 * determinism). */
void fc_pool_run(fc_pool *pool, int nt, int64_t nitems, fc_pool_fn fn, void *arg);

#endif /* FC_CPU_POOL_H */
