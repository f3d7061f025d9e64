/*
 * test_ring.h -- the C ring's ranks as threads of one process, for
 * test_cp.c and test_cp_varlen.c: a rank's comm.user is its ring_seat, and
 * the exchange hands every rank's buffer to the next one through shared
 * slots (or, with fail set, returns fail without copying).
 */
#ifndef FC_TEST_RING_H
#define FC_TEST_RING_H

#include <pthread.h>
#include <string.h>

#include "flashcore.h"

enum { RING_MAX_RANKS = 8 };

typedef struct test_ring {
    int size;
    pthread_barrier_t bar; /* size parties */
    const void *slot[RING_MAX_RANKS];
    fc_status fail; /* what the exchange returns (FC_OK: it works) */
} test_ring;

typedef struct ring_seat {
    test_ring *r;
    int rank;
} ring_seat;

static fc_status ring_exchange(void *user, const void *send, void *recv, size_t bytes, void *stream)
{
    (void)stream;
    const ring_seat *s = user;
    test_ring *r = s->r;
    r->slot[s->rank] = send;
    pthread_barrier_wait(&r->bar);
    if (r->fail == FC_OK) memcpy(recv, r->slot[(s->rank + r->size - 1) % r->size], bytes);
    pthread_barrier_wait(&r->bar);
    return r->fail;
}

/* The comm of the rank at seat s. */
static inline fc_cp_comm ring_comm(ring_seat *s)
{
    const fc_cp_comm c = {s->rank, s->r->size, s, ring_exchange};
    return c;
}

#endif /* FC_TEST_RING_H */
