/*
 * plan_checks.h -- what both sm80-class planners share (the forward's
 * plan.cu and the backward's bwd_plan.cu): the preconditions, implemented
 * in plan.cu (one message for each, whichever call meets it), and how a
 * table row is listed for the tools.
 */
#ifndef FC_SM80_PLAN_CHECKS_H
#define FC_SM80_PLAN_CHECKS_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor the kernels move in 16-byte chunks: its name, base and strides. */
typedef struct fc_sm80_tensor_ref {
    const char *name;
    const void *ptr;
    int64_t bs, rs, hs; /* batch, row, head strides (elements) */
} fc_sm80_tensor_ref;

/* The device's architecture class (tiles.cuh, ArchClass) into *cls; a
 * positive scale unless softcap; sequence lengths within int32 key
 * indexing; 16-byte aligned bases and strides of q, k, v (loaded in 16-byte
 * chunks) and the n_extra tensors of extra. The forward's out is not among
 * them: its epilogue stores any valid layout. FC_OK, or FC_ERR_UNSUPPORTED
 * and why. */
fc_status fc_sm80_common_checks(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_sm80_tensor_ref *extra,
                                int n_extra, int *cls, char *why, size_t why_len);

/* A row of either sm80-class table as the tools list it (fc_tile_row):
 * cls is the table's ArchClass (tiles.cuh), kernel the first row with the
 * same kernel. */
static inline fc_tile_row fc_sm80_listed_row(int head_dim, int block_m, int block_n, int warps, int stages,
                                             int ctas, int cls, int variant, int kernel)
{
    static const int class_sm[3] = {80, 86, 90}; /* kClassSm80/86/90 */
    fc_tile_row r = {0};
    r.head_dim = head_dim;
    r.block_m = block_m;
    r.block_n = block_n;
    r.threads = 32 * warps;
    r.stages = stages;
    r.ctas = ctas;
    r.arch_class = class_sm[cls];
    r.variant = variant;
    r.kernel = kernel;
    return r;
}

#ifdef __cplusplus
}
#endif
#endif /* FC_SM80_PLAN_CHECKS_H */
