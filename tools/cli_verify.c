/*
 * cli_verify.c -- the check of one case against the double precision
 * reference, forward or backward: supported() and the call must agree on
 * the kernel, outputs are poisoned before the run, and the kit's gates
 * judge what came back.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* supported(), poison, the call, the same kernel, fetch. 0 when the pass's
 * outputs are on the host to compare; else r says why not (SKIP or FAIL). */
static int run_checked(fc_context *ctx, cli_exec *e, cli_check_result *r)
{
    const char *call = e->b ? "backward()" : "forward()";
    char err[400];
    fc_kernel_info planned;
    memset(&planned, 0, sizeof(planned));
    /* supported() and the call run the same selection: they must agree */
    fc_status st = cli_exec_supported(ctx, e, &planned);
    if (st == FC_ERR_UNSUPPORTED || st == FC_ERR_NO_DEVICE) {
        r->verdict = CLI_SKIP;
        snprintf(r->note, sizeof(r->note), "%s", fc_last_error(ctx));
        return -1;
    }
    if (st != FC_OK) {
        snprintf(r->note, sizeof(r->note), "supported(): %s: %s", fc_status_string(st), fc_last_error(ctx));
        return -1;
    }
    if (cli_exec_poison(e, err, sizeof(err))) {
        snprintf(r->note, sizeof(r->note), "poison: %s", err);
        return -1;
    }
    st = cli_exec_run(ctx, e, &r->info, err, sizeof(err));
    if (st == FC_ERR_UNSUPPORTED) /* supported() said yes: a library bug */
        snprintf(r->note, sizeof(r->note), "supported() accepted but %s refused: %s", call, err);
    else if (st != FC_OK)
        snprintf(r->note, sizeof(r->note), "%s", err);
    else if (strcmp(planned.name, r->info.name) != 0)
        snprintf(r->note, sizeof(r->note), "supported() chose %s but %s ran %s", planned.name, call, r->info.name);
    else if (cli_exec_fetch(e, err, sizeof(err)))
        snprintf(r->note, sizeof(r->note), "fetch: %s", err);
    else
        return 0;
    return -1;
}

/* r cleared to a FAIL; 1 (with the note) when the exec's setup failed. */
static int begin(cli_check_result *r, int setup_rc, const cli_exec *e, const char *err)
{
    memset(r, 0, sizeof(*r));
    r->verdict = CLI_FAIL;
    if (setup_rc) {
        snprintf(r->note, sizeof(r->note), "setup: %s", err);
        return 1;
    }
    r->info.backend = e->backend;
    return 0;
}

/* ---- forward ------------------------------------------------------------------------ */

/* The reference on the case's host inputs, into separate buffers. */
static fc_status run_reference(fc_context *ctx, const kit_case *c, void *ref_out, float *ref_lse)
{
    fc_attention_args a = c->args;
    a.out.data = ref_out;
    a.lse.data = ref_lse;
    a.backend = FC_BACKEND_CPU_REFERENCE;
    return fc_attention_forward(ctx, &a, NULL, NULL);
}

/* Which gates a forward result missed, into r->note. */
static void fwd_note(cli_check_result *r)
{
    int k = 0;
    const kit_metrics *m = &r->m;
    const kit_gate *g = &r->g;
    r->note[0] = '\0';
#define NOTE(...) k += snprintf(r->note + k, sizeof(r->note) - (size_t)k, __VA_ARGS__); if (k >= (int)sizeof(r->note)) k = (int)sizeof(r->note) - 1
    if (m->unwritten) { NOTE("%lld unwritten; ", (long long)m->unwritten); }
    if (m->nonfinite) { NOTE("%lld non-finite; ", (long long)m->nonfinite); }
    if (m->lse_bad) { NOTE("%lld lse out of tolerance (max %.3g); ", (long long)m->lse_bad, m->lse_max_abs); }
    if (m->max_abs > g->max_abs) { NOTE("max_abs %.3g > %.3g; ", m->max_abs, g->max_abs); }
    if (m->rel_l2 > g->rel_l2) { NOTE("rel_l2 %.3g > %.3g; ", m->rel_l2, g->rel_l2); }
    if (m->pct_bad > g->pct_bad) { NOTE("%%bad %.3g > %.3g; ", m->pct_bad, g->pct_bad); }
#undef NOTE
}

/* The case's host cache (k, v) as it was before a CPU backend appended to
 * it, so that the reference starts from the same cache and a stray write
 * shows; NULL buffers (no append step, or CUDA's own copy) restore nothing. */
typedef struct cache_copy {
    void *k, *v;
} cache_copy;

static int cache_keep(cache_copy *cc, const kit_case *c, fc_backend backend)
{
    cc->k = cc->v = NULL;
    if (!c->k_new || backend == FC_BACKEND_CUDA) return 0;
    cc->k = malloc(c->k_bytes);
    cc->v = malloc(c->v_bytes);
    if (!cc->k || !cc->v) return -1;
    memcpy(cc->k, c->k, c->k_bytes);
    memcpy(cc->v, c->v, c->v_bytes);
    return 0;
}

static void cache_restore(const cache_copy *cc, kit_case *c)
{
    if (!cc->k) return;
    memcpy(c->k, cc->k, c->k_bytes);
    memcpy(c->v, cc->v, c->v_bytes);
}

void cli_check_case(fc_context *ctx, kit_case *c, fc_backend backend, cli_check_result *r)
{
    char err[400];
    cli_exec e;
    cache_copy cc = {NULL, NULL};
    if (begin(r, cli_exec_init(&e, c, backend, err, sizeof(err)), &e, err)) return;
    r->g = kit_gate_for(kit_out_dtype(&c->s));
    if (cache_keep(&cc, c, e.backend)) {
        snprintf(r->note, sizeof(r->note), "out of host memory for the cache copy");
        goto done;
    }
    if (run_checked(ctx, &e, r)) goto done;
    cache_restore(&cc, c);

    void *ref_out = malloc(c->out_bytes);
    float *ref_lse = c->lse ? malloc(c->lse_bytes) : NULL;
    if (!ref_out || (c->lse && !ref_lse)) {
        snprintf(r->note, sizeof(r->note), "out of host memory for the reference (%zu bytes)", c->out_bytes);
        free(ref_out);
        free(ref_lse);
        goto done;
    }
    /* poison the reference too: a reference that skips an element must not
     * pass by comparing uninitialised memory */
    kit_poison(ref_out, c->out_bytes, kit_out_dtype(&c->s), ref_lse, c->lse_bytes);
    fc_status st = run_reference(ctx, c, ref_out, ref_lse);
    if (st != FC_OK) {
        snprintf(r->note, sizeof(r->note), "reference: %s: %s", fc_status_string(st), fc_last_error(ctx));
    } else {
        kit_compare(c, c->out, c->lse, ref_out, ref_lse, &r->g, &r->m);
        if (kit_gate_pass(&r->m, &r->g)) r->verdict = CLI_PASS;
        else fwd_note(r);
    }
    free(ref_out);
    free(ref_lse);
done:
    free(cc.k);
    free(cc.v);
    cli_exec_free(&e);
}

/* ---- backward ----------------------------------------------------------------------- */

/* The reference backward (it poisons its buffers first) and the comparison. */
static void compare_bwd(fc_context *ctx, kit_bwd_case *b, cli_check_result *r)
{
    void *ref[3] = {malloc(b->dq_bytes), malloc(b->dk_bytes), malloc(b->dv_bytes)};
    if (!ref[0] || !ref[1] || !ref[2]) {
        snprintf(r->note, sizeof(r->note), "out of host memory for the reference gradients");
    } else {
        fc_status st = kit_bwd_reference(ctx, b, ref);
        if (st != FC_OK) {
            snprintf(r->note, sizeof(r->note), "reference: %s: %s", fc_status_string(st), fc_last_error(ctx));
        } else {
            const void *const got[3] = {b->dq, b->dk, b->dv};
            kit_bwd_compare(b, got, (const void *const *)ref, &r->bg, r->bm);
            if (kit_bwd_gate_pass(r->bm, &r->bg)) {
                r->verdict = CLI_PASS;
            } else {
                char d[400];
                kit_bwd_describe(r->bm, d, sizeof(d));
                snprintf(r->note, sizeof(r->note), "%s; gates: max_rel %.3g, rel_l2 %.3g, bad %.3g%%", d,
                         r->bg.max_rel, r->bg.rel_l2, r->bg.pct_bad);
            }
        }
    }
    for (int i = 0; i < 3; i++) free(ref[i]);
}

void cli_check_bwd_case(fc_context *ctx, kit_bwd_case *b, fc_backend backend, cli_check_result *r)
{
    char err[400];
    cli_exec e;
    if (begin(r, cli_exec_init_bwd(&e, b, backend, err, sizeof(err)), &e, err)) return;
    r->bg = kit_bwd_gate_for(b->c.s.dtype, e.backend == FC_BACKEND_CUDA ? KIT_BWD_CUDA : KIT_BWD_CPU);
    /* the out and lse the backward reads: this backend's forward */
    fc_status st = cli_exec_bwd_forward(ctx, &e, err, sizeof(err));
    if (st != FC_OK) {
        if (st == FC_ERR_UNSUPPORTED || st == FC_ERR_NO_DEVICE) r->verdict = CLI_SKIP;
        snprintf(r->note, sizeof(r->note), "forward: %s", err);
    } else if (run_checked(ctx, &e, r) == 0) {
        compare_bwd(ctx, b, r);
    }
    cli_exec_free(&e);
}
