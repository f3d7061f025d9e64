/*
 * pool.h -- the worker threads of the tiled CPU paths (forward tiled.c,
 * backward tiled_bwd.c): work items claimed in order from an atomic
 * counter, workers started inside the call and joined before it returns.
 */
#ifndef FC_CPU_POOL_H
#define FC_CPU_POOL_H

#include <stddef.h>
#include <stdint.h>

/* Below this many multiply-adds per thread, starting a thread costs more
 * than it saves. */
#define FC_POOL_MIN_MACS ((int64_t)1 << 18)

/* One work item: fn(arg, worker, item). worker in [0, nt) names the
 * worker's own scratch; item in [0, nitems). */
typedef void (*fc_pool_fn)(void *arg, int worker, int64_t item);

/* Workers for a call: num_threads (<= 0: one per online core), at most cap
 * and nitems, and no more than one per min_macs of the call's macs (below
 * that, starting a thread costs more than it saves); at least 1. */
int fc_pool_threads(int num_threads, int cap, int64_t nitems, int64_t macs, int64_t min_macs);

/* Run every item once on nt workers, worker 0 on the calling thread. A
 * thread that cannot be created is no error: the others claim its share.
 * Which worker runs an item must not change its result (that is the
 * caller's part of determinism). */
void fc_pool_run(int nt, int64_t nitems, fc_pool_fn fn, void *arg);

/* nt zeroed scratch blocks of `bytes` (a multiple of 64) each, 64-byte
 * aligned, in an array; NULL when any allocation fails (nothing left). */
void **fc_pool_blocks(int nt, size_t bytes);
void fc_pool_blocks_free(void **blocks, int nt);

#endif /* FC_CPU_POOL_H */
