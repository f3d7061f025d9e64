/*
 * kit_append.c -- the append step's inputs of a kit case (s.append > 0):
 * k_new and v_new, N(0,1), and with s.rotary_dim the RoPE tables (GPT-NeoX
 * frequencies, base 10000) over every position the call can reach (the
 * cache's capacity plus seqlen_q), all contiguous in the case's dtype; the
 * case's args point at them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kit.h"
#include "kit_internal.h"

fc_tensor kit_contiguous(void *data, fc_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    fc_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = n3 ? 4 : n2 ? 3 : 2;
    const int64_t sh[4] = {n0, n1, n2, n3};
    int64_t st = 1;
    for (int i = t.ndim - 1; i >= 0; i--) {
        t.shape[i] = sh[i];
        t.stride[i] = st;
        st *= sh[i];
    }
    return t;
}

static int rope_tables(kit_case *c)
{
    const kit_shape *s = &c->s;
    const int half = s->rotary_dim / 2;
    c->seqlen_ro = kit_case_capacity(c) + s->seqlen_q;
    c->rot_bytes = (size_t)(c->seqlen_ro * half) * kit_dtype_size(s->dtype);
    c->rot_cos = malloc(c->rot_bytes);
    c->rot_sin = malloc(c->rot_bytes);
    if (!c->rot_cos || !c->rot_sin) return -1;
    for (int64_t p = 0; p < c->seqlen_ro; p++)
        for (int i = 0; i < half; i++) {
            const double th = (double)p * pow(10000.0, -2.0 * i / s->rotary_dim);
            kit_store(c->rot_cos, s->dtype, p * half + i, (float)cos(th));
            kit_store(c->rot_sin, s->dtype, p * half + i, (float)sin(th));
        }
    c->args.rotary_cos = kit_contiguous(c->rot_cos, s->dtype, c->seqlen_ro, half, 0, 0);
    c->args.rotary_sin = kit_contiguous(c->rot_sin, s->dtype, c->seqlen_ro, half, 0, 0);
    return 0;
}

void kit_shape_append(kit_shape *s, int n, int interleaved)
{
    s->append = n;
    s->rotary_dim = s->head_dim / 2 * 2;
    s->rotary_interleaved = interleaved;
    if (s->seqused == KIT_SEQUSED_NONE) s->seqused = KIT_SEQUSED_FULL;
}

int kit_append_setup(kit_case *c, uint64_t seed)
{
    const kit_shape *s = &c->s;
    if (s->append <= 0) return 0;
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 77;
    const int64_t n = (int64_t)s->batch * s->append * s->heads_kv * s->head_dim;
    c->new_bytes = (size_t)n * kit_dtype_size(s->dtype);
    c->k_new = malloc(c->new_bytes);
    c->v_new = malloc(c->new_bytes);
    if (!c->k_new || !c->v_new) return -1;
    kit_fill_normal(c->k_new, s->dtype, n, &rng, 1.0f);
    kit_fill_normal(c->v_new, s->dtype, n, &rng, 1.0f);
    c->args.k_new = kit_contiguous(c->k_new, s->dtype, s->batch, s->append, s->heads_kv, s->head_dim);
    c->args.v_new = kit_contiguous(c->v_new, s->dtype, s->batch, s->append, s->heads_kv, s->head_dim);
    c->args.rotary_interleaved = s->rotary_interleaved;
    return s->rotary_dim > 0 ? rope_tables(c) : 0;
}
