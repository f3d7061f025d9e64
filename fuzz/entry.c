/*
 * entry.c -- the entry points of the fuzz target (forward, backward): each
 * builds a call from the bytes, runs its checks with the call's
 * description ready for a failure report, and frees it.
 */
#include <stdio.h>

#include "call.h"
#include "kit.h"

static const fz_call *g_cur;

static void describe_tensor(const fz_call *c, const char *name, const fc_tensor *t)
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

static void describe_cu(const fz_call *c, const char *name, const int32_t *p, const int32_t *v, int n)
{
    fprintf(stderr, "  %s=", name);
    if (!p) { fprintf(stderr, "NULL\n"); return; }
    fprintf(stderr, "arena+%lld {", (long long)((const uint8_t *)p - c->ar.base));
    for (int i = 0; i < n; i++) fprintf(stderr, "%d%s", v[i], i < n - 1 ? "," : "}\n");
}

/* block_table and seqused_k, where set, with what the generator meant. */
static void describe_paged(const fz_call *c)
{
    const fz_paged *g = &c->pg;
    const fc_attention_args *a = &c->a;
    if (g->table_on) {
        fprintf(stderr, "  block_table=");
        if (a->block_table) fprintf(stderr, "arena+%lld", (long long)((const uint8_t *)a->block_table - c->ar.base));
        else fprintf(stderr, "NULL");
        fprintf(stderr, " max_pages_per_seq=%d block_table_stride=%lld (meant: %d pages of %d keys, stride %lld, "
                "pool of %d)\n  rows:", (int)a->max_pages_per_seq, (long long)a->block_table_stride,
                (int)g->max_pages, (int)g->page_size, (long long)g->stride, (int)g->num_pages);
        for (int64_t i = 0; i < g->table_n && i < 48; i++)
            fprintf(stderr, "%s%d", i % g->stride ? "," : " | ", (int)g->table[i]);
        fprintf(stderr, "%s\n", g->table_n > 48 ? " ..." : "");
    }
    if (g->used_on) describe_cu(c, "seqused_k", a->seqused_k, g->used, g->batch);
    if (g->known) fprintf(stderr, "  expected: %s where the clean twin is accepted\n", fc_status_string(g->expect));
}

/* The backward's own arguments. */
static void describe_backward(const fz_call *c)
{
    static const char *const names[4] = {"dout", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) describe_tensor(c, names[i], &c->grad[i]);
    fprintf(stderr, "  deterministic=%d workspace=", (int)c->deterministic);
    if (c->off[FB_WS] >= 0) fprintf(stderr, "arena+%lld", (long long)c->off[FB_WS]);
    else fprintf(stderr, "NULL");
    fprintf(stderr, " workspace_bytes=%lld; out and lse %s\n", (long long)c->ws_bytes,
            c->fwd_real ? "from the reference forward" : "random");
}

void fz_describe_call(const fz_call *c)
{
    const fc_attention_args *a = &c->a;
    fprintf(stderr, "%s call%s: backend=%d threads=%d cuda_path=%d device=%d arena=%zu bytes\n",
            c->bwd ? "backward" : "forward", c->args_null ? " with args=NULL" : "", (int)a->backend, c->threads,
            c->cuda_path, c->device, c->ar.size);
    if (c->tuned)
        fprintf(stderr, "  tuning: sm90_config=%d sm80_config=%d rotate=%d tail=%d grid=%d splits=%d pdl=%d "
                        "sm80_bwd_config=%d sm90_bwd_config=%d masks=%d\n",
                c->tun.sm90_config, c->tun.sm80_config, c->tun.sm90_rotate, c->tun.sm90_tail, c->tun.sm90_grid,
                c->tun.splits, c->tun.pdl, c->tun.sm80_bwd_config, c->tun.sm90_bwd_config, c->tun.masks);
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
        describe_cu(c, "cu_seqlens_q", a->cu_seqlens_q, c->cu[0], c->nseq + 1);
        describe_cu(c, "cu_seqlens_k", a->cu_seqlens_k, c->cu[1], c->nseq + 1);
    }
    describe_paged(c);
    if (a->q_descale.data || a->k_descale.data || a->v_descale.data) fprintf(stderr, "  a descale pointer is set\n");
    if (c->bwd) describe_backward(c);
    if (c->kernel[0]) fprintf(stderr, "  kernel: %s\n", c->kernel);
}

static void describe_current(void)
{
    if (g_cur) fz_describe_call(g_cur);
}

static void run_call(fz_in *in, int (*build)(fz_in *, fz_call *), void (*check)(fz_call *))
{
    fz_call c;
    if (build(in, &c)) { fz_paged_free(&c); return; }
    g_cur = &c;
    if (fz_verbose) fz_describe_call(&c);
    else fz_describe = describe_current;
    check(&c);
    g_cur = NULL;
    fz_arena_free(&c.ar);
    fz_paged_free(&c);
}

void fz_entry_forward(fz_in *in) { run_call(in, fz_fwd_build, fz_fwd_check); }

void fz_entry_backward(fz_in *in) { run_call(in, fz_bwd_build, fz_bwd_check); }
