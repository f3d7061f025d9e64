/*
 * kit_internal.h -- what the kit's own files share and the tests and the
 * CLI do not call: the paged half of kit_case_init, the normal fill.
 */
#ifndef FC_KIT_INTERNAL_H
#define FC_KIT_INTERNAL_H

#include <stdint.h>

#include "kit.h"

/* For a paged or seqused_k shape (c->s), before k and v are allocated:
 * num_pages, max_pages, the shuffled block table and seqused_k, drawn from
 * a stream of their own (seed), and their fields in c->args. Nothing for a
 * plain shape. 0, or -1 when out of memory (kit_case_free cleans up). */
int kit_paged_setup(kit_case *c, uint64_t seed);
/* After the inputs are drawn: NaN in every k/v row no sequence uses (past
 * a cache's length, spare pages), so a kernel that reads one shows. */
void kit_paged_nan_unused(const kit_case *c);

/* N(0,1)*scale values, redrawn where one rounds to 0 in the dtype (kit.c). */
void kit_fill_normal(void *buf, fc_dtype dt, int64_t n, uint64_t *rng, float scale);

#endif /* FC_KIT_INTERNAL_H */
