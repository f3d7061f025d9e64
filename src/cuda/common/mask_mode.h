/*
 * mask_mode.h -- which KV blocks of a call may need the softcap or the mask
 * code of a forward kernel (fc_cuda_choice.masks), for both CUDA paths: the
 * launcher then picks the template instance compiled with only that code
 * (sm90/fwd_kernel.cuh MaskMode, sm80/fwd_kernel.cuh PLAIN). Both sit inline
 * in every KV block: on the Hopper kernels ~1.5-2 K of 4.3-5.9 K
 * instructions, branched over twice per block (dropping them: +2-5% on the
 * calls that allow it, H100).
 *
 * FIRST is for the Hopper kernels, whose tiles visit their KV blocks from the
 * highest, so a tile's first block is the highest one it sees (the sm80
 * kernel walks upwards and takes FIRST as ANY).
 *  NONE  no softcap, no window (causal included), a dense KV length of whole
 *        blocks: no block of any tile is masked.
 *  FIRST no softcap, no left window, dense whole blocks, and a right edge
 *        (causal: d = sk - sq + wr + 1) that falls only in a tile's highest
 *        block. With P = block_m >> shift query positions per tile the rows'
 *        key limits span [m0 + d, m0 + d + P - 1]; a lower block is masked
 *        iff a multiple of block_n lies inside (m0 + d, m0 + d + P - 1),
 *        which no tile sees iff block_n % P == 0 and d mod P <= 1 (and
 *        d >= 1: the first row sees a key). The clamp to sk only shortens
 *        the span.
 *  ANY   the rest (softcap, left windows, varlen or seqused_k, a KV tail,
 *        other edges).
 * tests/test_mask_mode.c checks NONE and FIRST against fc_key_visible over
 * every tile of random problems.
 *
 * Plain C (both planners and a C test include it).
 */
#ifndef FC_MASK_MODE_H
#define FC_MASK_MODE_H

#include <stdint.h>

#include "internal.h"

enum { FC_MASKS_NONE = 0, FC_MASKS_FIRST = 1, FC_MASKS_ANY = 2 };

/* FC_MASKS_* for p on a tile of block_m rows and block_n keys; shift: log2
 * of the query heads packed per tile row group (pack-GQA), else 0. */
static inline int fc_cuda_mask_mode(const fc_fwd_params *p, int block_m, int block_n, int shift)
{
    const int dense_whole = !p->cu_seqlens_k && !p->seqused_k && p->seqlen_k % block_n == 0;
    if (p->softcap != 0.0f || !dense_whole || p->window_left >= 0) return FC_MASKS_ANY;
    if (p->window_right < 0) return FC_MASKS_NONE;
    const int64_t d = (int64_t)p->seqlen_k - p->seqlen_q + p->window_right + 1;
    const int P = block_m >> shift;
    if (d < 1 || P < 1 || block_n % P != 0) return FC_MASKS_ANY;
    return d % P <= 1 ? FC_MASKS_FIRST : FC_MASKS_ANY;
}

#endif /* FC_MASK_MODE_H */
