/*
 * fill.c -- what a fuzzed call's buffers hold: random inputs from a seed the
 * bytes give (scaled, sparse, now and then a NaN or Inf), kit poison in every
 * output element (marked in the arena's mask as the call's to write), and
 * the varlen offsets and descales in their buffers.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "kit.h"

void fz_fill_input(fz_call *c, int b, uint64_t *rng, double scale, int sparse, int special)
{
    const fc_tensor *t = fz_tensor_of(c, b);
    int64_t *offs, n = fz_tensor_offsets(t, &offs);
    for (int64_t i = 0; i < n; i++) {
        double x = kit_rand_normal(rng) * scale;
        if (sparse && (kit_rand_u64(rng) & 7) == 0) x = 0.0;
        fz_store(t->data, t->dtype, offs[i], (float)x);
    }
    if (special && n > 0) fz_store(t->data, t->dtype, offs[kit_rand_u64(rng) % (uint64_t)n],
                                   (kit_rand_u64(rng) & 1) ? NAN : INFINITY);
    free(offs);
}

void fz_poison_output(fz_call *c, int b)
{
    const fc_tensor *t = fz_tensor_of(c, b);
    int64_t *offs, n = fz_tensor_offsets(t, &offs);
    const int64_t es = (int64_t)fz_dtype_size(t->dtype);
    for (int64_t i = 0; i < n; i++) {
        fz_poison(t->data, t->dtype, offs[i]);
        memset(c->ar.mask + ((uint8_t *)t->data - c->ar.base) + offs[i] * es, 1, (size_t)es);
    }
    free(offs);
}

/* q and k scaled together (the logits' size), v and dout at unit scale.
 * The bytes are read before the arena exists (paged decisions follow them). */
void fz_fill_plan_read(fz_in *in, fz_call *c)
{
    static const double isc[] = {1.0, 1.0, 1.0, 0.1, 4.0, 30.0};
    c->fill.rng = fz_u64(in) ^ 0x243F6A8885A308D3ull;
    c->fill.qk_scale = isc[fz_range(in, 0, 5)];
    c->fill.sparse = fz_chance(in, 10);
    c->special = fz_chance(in, 2);
}

void fz_fill_inputs(fz_call *c, const int ok[FB_N])
{
    uint64_t rng = c->fill.rng;
    const int sparse = c->fill.sparse, special = c->special;
    for (int b = FB_Q; b <= FB_V; b++)
        if (ok[b] && c->off[b] >= 0) fz_fill_input(c, b, &rng, b == FB_V ? 1.0 : c->fill.qk_scale, sparse, special);
    if (c->bwd && ok[FB_DOUT] && c->off[FB_DOUT] >= 0) fz_fill_input(c, FB_DOUT, &rng, 1.0, sparse, special);
}

/* Whether element idx of base is the dtype's plain quiet NaN (the bits
 * fz_store writes for NAN: payload 0, sign clear). */
static int plain_nan(const void *base, fc_dtype dt, int64_t idx)
{
    uint8_t plain[8] = {0};
    fz_store(plain, dt, 0, NAN);
    const size_t es = fz_dtype_size(dt);
    return !memcmp((const uint8_t *)base + idx * (int64_t)es, plain, es);
}

/* Every NaN of the inputs made the dtype's plain quiet NaN, in each view
 * of the bytes that buffers share, until a pass changes nothing (a write
 * in one dtype's view can make a NaN in another's). A NaN keeps its
 * payload through the arithmetic into an output element (an input of
 * another buffer's bytes: dout over lse's floats), and one whose bits
 * there land on the poison pattern, its sign flipped (-D) or an f32
 * payload rounded to f16, reads as unwritten; a plain NaN cannot. The
 * forward's out and lse are outputs. */
void fz_scrub_inputs(fz_call *c, const int ok[FB_N])
{
    static const int inputs[] = {FB_Q, FB_K, FB_V, FB_O, FB_LSE, FB_DOUT};
    for (int pass = 0, changed = 1; changed && pass < 8; pass++) {
        changed = 0;
        for (int i = 0; i < (c->bwd ? 6 : 3); i++) {
            if (!ok[inputs[i]] || c->off[inputs[i]] < 0) continue;
            const fc_tensor *t = fz_tensor_of(c, inputs[i]);
            /* lse is placed in 4-byte units: another dtype (refused) is not read */
            if (inputs[i] == FB_LSE && t->dtype != FC_DTYPE_F32) continue;
            int64_t *offs, n = fz_tensor_offsets(t, &offs);
            for (int64_t e = 0; e < n; e++)
                if (isnan(fz_load(t->data, t->dtype, offs[e])) && !plain_nan(t->data, t->dtype, offs[e])) {
                    fz_store(t->data, t->dtype, offs[e], NAN);
                    changed = 1;
                }
            free(offs);
        }
    }
}

void fz_write_arrays(fz_call *c)
{
    for (int b = FB_CUQ; b <= FB_CUK; b++)
        if (c->off[b] >= 0) memcpy(c->ar.base + c->off[b], c->cu[b - FB_CUQ], 4 * (size_t)(c->nseq + 1));
    const float d = c->desc_value;
    if (c->off[FB_DESC] >= 0) memcpy(c->ar.base + c->off[FB_DESC], (const float[]){d, d, d}, 12);
    fz_write_paged(c);
}
