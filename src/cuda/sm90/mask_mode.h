/*
 * mask_mode.h -- which KV blocks of a call may need the softcap or the mask
 * code of the Hopper kernel (fc_cuda_choice.masks): the launcher then picks
 * the template instance compiled with only that code (fwd_kernel.cuh,
 * MaskMode). Both sit inline between each block's S GEMM and its softmax:
 * ~1.5-2 K of a kernel's 4.3-5.9 K instructions, branched over twice per
 * block (dropping them: +2-5% on the calls that allow it, H100, session 6).
 *
 * A tile visits its KV blocks from the highest, so its first block is the
 * highest one it sees.
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
 *  ANY   the rest (softcap, left windows, varlen, a KV tail, other edges).
 * tests/test_mask_mode.c checks NONE and FIRST against fc_key_visible over
 * every tile of random problems.
 *
 * Plain C (the planner and a C test include it).
 */
#ifndef FC_SM90_MASK_MODE_H
#define FC_SM90_MASK_MODE_H

#include <stdint.h>

#include "internal.h"

enum { FC_SM90_MASKS_NONE = 0, FC_SM90_MASKS_FIRST = 1, FC_SM90_MASKS_ANY = 2 };

static inline int fc_sm90_mask_mode(const fc_fwd_params *p, int block_m, int block_n, int shift)
{
    const int dense_whole = !p->cu_seqlens_k && p->seqlen_k % block_n == 0;
    if (p->softcap != 0.0f || !dense_whole || p->window_left >= 0) return FC_SM90_MASKS_ANY;
    if (p->window_right < 0) return FC_SM90_MASKS_NONE;
    const int64_t d = (int64_t)p->seqlen_k - p->seqlen_q + p->window_right + 1;
    const int P = block_m >> shift;
    if (d < 1 || P < 1 || block_n % P != 0) return FC_SM90_MASKS_ANY;
    return d % P <= 1 ? FC_SM90_MASKS_FIRST : FC_SM90_MASKS_ANY;
}

#endif /* FC_SM90_MASK_MODE_H */
