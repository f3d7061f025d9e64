/*
 * fwd_entry.c -- the forward entry point of the fuzz target and the
 * description of its call that every failure report carries.
 */
#include <stdio.h>

#include "fwd.h"
#include "kit.h"

static const fz_fwd *g_cur;

static void describe_tensor(const fz_fwd *c, const char *name, const fc_tensor *t)
{
    const uint8_t *p = t->data;
    fprintf(stderr, "  %-4s data=", name);
    if (p) fprintf(stderr, "arena+%lld (addr%%16=%u)", (long long)(p - c->ar.base), (unsigned)((uintptr_t)p % 16));
    else fprintf(stderr, "NULL");
    fprintf(stderr, " dtype=%d ndim=%d shape=[", (int)t->dtype, (int)t->ndim);
    for (int i = 0; i < 4; i++) fprintf(stderr, "%lld%s", (long long)t->shape[i], i < 3 ? "," : "]");
    fprintf(stderr, " stride=[");
    for (int i = 0; i < 4; i++) fprintf(stderr, "%lld%s", (long long)t->stride[i], i < 3 ? "," : "]\n");
}

static void describe_cu(const fz_fwd *c, const char *name, const int32_t *p, const int32_t *v)
{
    fprintf(stderr, "  %s=", name);
    if (!p) { fprintf(stderr, "NULL\n"); return; }
    fprintf(stderr, "arena+%lld {", (long long)((const uint8_t *)p - c->ar.base));
    for (int i = 0; i <= c->nseq; i++) fprintf(stderr, "%d%s", v[i], i < c->nseq ? "," : "}\n");
}

void fz_fwd_describe(const fz_fwd *c)
{
    const fc_attention_args *a = &c->a;
    fprintf(stderr, "forward call%s: backend=%d threads=%d cuda_path=%d device=%d arena=%zu bytes\n",
            c->args_null ? " with args=NULL" : "", (int)a->backend, c->threads, c->cuda_path, c->device,
            c->ar.size);
    if (c->tuned)
        fprintf(stderr, "  tuning: sm90_config=%d sm80_config=%d rotate=%d tail=%d grid=%d splits=%d pdl=%d\n",
                c->tun.sm90_config, c->tun.sm80_config, c->tun.sm90_rotate, c->tun.sm90_tail, c->tun.sm90_grid,
                c->tun.splits, c->tun.pdl);
    describe_tensor(c, "q", &a->q);
    describe_tensor(c, "k", &a->k);
    describe_tensor(c, "v", &a->v);
    describe_tensor(c, "out", &a->out);
    describe_tensor(c, "lse", &a->lse);
    fprintf(stderr, "  scale=%.9g softcap=%.9g causal=%d window=(%d,%d)\n", (double)a->scale, (double)a->softcap,
            (int)a->causal, (int)a->window_left, (int)a->window_right);
    if (c->varlen) {
        fprintf(stderr, "  varlen: num_seqs=%d max_seqlen_q=%d max_seqlen_k=%d\n", (int)a->num_seqs,
                (int)a->max_seqlen_q, (int)a->max_seqlen_k);
        describe_cu(c, "cu_seqlens_q", a->cu_seqlens_q, c->cu[0]);
        describe_cu(c, "cu_seqlens_k", a->cu_seqlens_k, c->cu[1]);
    }
    if (a->q_descale || a->k_descale || a->v_descale) fprintf(stderr, "  a descale pointer is set\n");
}

static void describe_current(void)
{
    if (g_cur) fz_fwd_describe(g_cur);
}

void fz_entry_forward(fz_in *in)
{
    fz_fwd c;
    if (fz_fwd_build(in, &c)) return;
    g_cur = &c;
    if (fz_verbose) fz_fwd_describe(&c);
    else fz_describe = describe_current;
    fz_fwd_check(&c);
    g_cur = NULL;
    fz_arena_free(&c.ar);
}
