/*
 * bwd_gen.c -- input bytes to one backward call: the forward's call
 * (fwd_gen.c: context, q..lse, options) plus dout, dq, dk, dv in layouts of
 * their own, deterministic, and the workspace (none, or a caller buffer
 * that may be too small, misaligned or overlapping: place.c). out and lse
 * are what the reference forward gives for those inputs; where it refuses
 * the arguments (some are valid for the backward alone: out over q,
 * cu_seqlens inside out) they are random and only writes are judged.
 */
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "kit.h"

/* dout and dq shaped like q, dk and dv like k, each corrupted now and then. */
static void gen_grads(fz_in *in, fz_call *c, int ok[FB_N])
{
    static const int like[4] = {0, 0, 1, 1};
    const int nd = 4 - c->varlen;
    for (int i = 0; i < 4; i++) fz_gen_tensor(in, &c->grad[i], c->dtype, nd, c->shape[like[i]], &ok[FB_DOUT + i]);
    c->deterministic = fz_chance(in, 97) ? fz_chance(in, 35) : (int32_t[]){-1, 2, INT32_MAX}[fz_range(in, 0, 2)];
}

/* Mostly none; else a caller buffer of some size (about what a kernel's
 * fp32 dq and row sums take, or less, or more), or an invalid pair: a
 * buffer of 0 bytes, a size without a buffer, a negative size. */
static void gen_workspace(fz_in *in, fz_call *c)
{
    const int nd = 4 - c->varlen;
    const int64_t *q = c->shape[0];
    const int64_t rows = c->varlen ? q[0] : q[0] * q[1];
    int64_t est = rows * q[nd - 2] * (q[nd - 1] + 2) * 4;
    if (est < 256) est = 256;
    const int64_t sizes[] = {1, 255, 4096, (int64_t)1 << 16, est / 2, est, 2 * est};
    switch (fz_pick(in, (const int[]){55, 35, 4, 3, 3}, 5)) {
    case 0: return;
    case 1: c->ws_bytes = sizes[fz_range(in, 0, 6)]; break;
    case 2: c->ws_bytes = 0; break;
    case 3: c->ws_bytes = 4096; return; /* no buffer */
    default: c->ws_bytes = -fz_range(in, 1, 256); break;
    }
    c->ws_alloc = c->ws_bytes > 0 ? c->ws_bytes : 256;
    if (c->ws_alloc > FZ_ARENA_MAX) c->ws_alloc = c->ws_bytes = FZ_ARENA_MAX;
}

static void copy_elements(fz_call *c, const fz_arena *r, int b)
{
    const fc_tensor *t = fz_tensor_of(c, b);
    int64_t *offs, n = fz_tensor_offsets(t, &offs);
    const int64_t es = (int64_t)fz_dtype_size(t->dtype);
    uint8_t *to = t->data;
    const uint8_t *from = fz_rebase(c, r, t->data);
    for (int64_t i = 0; i < n; i++) memcpy(to + offs[i] * es, from + offs[i] * es, (size_t)es);
    free(offs);
}

/* out and lse from the reference forward of the inputs now in the arena
 * (a host copy of it), or random: out N(0,1), lse N(0,1) * 3. */
static void fill_forward_outputs(fz_call *c, const int ok[FB_N], uint64_t seed)
{
    const int have[2] = {ok[FB_O] && c->off[FB_O] >= 0, ok[FB_LSE] && c->off[FB_LSE] >= 0};
    fz_arena r = {0};
    char why[FC_FUZZ_MSG];
    c->fwd_real = have[0] && have[1] && fz_reference_forward(c, c->ar.base, &r, why, sizeof why) == FC_OK;
    if (c->fwd_real) {
        copy_elements(c, &r, FB_O);
        copy_elements(c, &r, FB_LSE);
    }
    if (r.base) fz_arena_free(&r);
    if (c->fwd_real) return;
    uint64_t rng = seed;
    if (have[0]) fz_fill_input(c, FB_O, &rng, 1.0, 0, 0);
    if (have[1]) fz_fill_input(c, FB_LSE, &rng, 3.0, 0, 0);
}

/* Inputs, then the forward's outputs (which read the offsets), then the
 * gradients' poison, then the offsets and descales once more, so that
 * offsets placed inside an output hold valid values when the call reads them. */
int fz_bwd_build(fz_in *in, fz_call *c)
{
    memset(c, 0, sizeof *c);
    c->bwd = 1;
    int ok[FB_N] = {0};
    fz_gen_forward(in, c, ok);
    gen_grads(in, c, ok);
    gen_workspace(in, c);
    int64_t size = fz_place_call(in, c);
    fz_fill_plan_read(in, c);
    const uint64_t seed = fz_u64(in) ^ 0x13198A2E03707344ull;
    size = fz_gen_paged(in, c, ok, size);
    if (fz_alloc_call(c, size)) return -1;
    fz_fill_inputs(c, ok);
    fz_write_arrays(c);
    fill_forward_outputs(c, ok, seed);
    fz_scrub_inputs(c, ok);
    for (int b = FB_DQ; b <= FB_DV; b++)
        if (ok[b] && c->off[b] >= 0) fz_poison_output(c, b);
    if (c->off[FB_WS] >= 0) memset(c->ar.mask + c->off[FB_WS], 1, (size_t)c->ws_alloc);
    fz_write_arrays(c);
    return 0;
}
