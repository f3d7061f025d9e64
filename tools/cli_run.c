/*
 * cli_run.c -- running a kit case on a backend: host pointers for the CPU
 * backends, device copies for CUDA (inputs uploaded, outputs poisoned on the
 * device, copied back), and the check of one case against the double
 * precision reference with the kit's gates.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cli_exec_free(cli_exec *e)
{
    cli_cuda_free(e->dq);
    cli_cuda_free(e->dk);
    cli_cuda_free(e->dv);
    cli_cuda_free(e->dout);
    cli_cuda_free(e->dlse);
    cli_cuda_free(e->dcu_q);
    cli_cuda_free(e->dcu_k);
    cli_cuda_stream_destroy(e->stream);
    memset(e, 0, sizeof(*e));
}

int cli_exec_init(cli_exec *e, kit_case *c, fc_backend backend, char *err, size_t err_len)
{
    memset(e, 0, sizeof(*e));
    e->c = c;
    e->backend = cli_resolve_backend(backend);
    e->args = c->args;
    e->args.backend = e->backend;
    if (e->backend != FC_BACKEND_CUDA) return 0;

    size_t cu_bytes = c->cu_q ? ((size_t)c->s.batch + 1) * sizeof(int32_t) : 0;
    if (cli_cuda_stream_create(&e->stream, err, err_len) ||
        cli_cuda_malloc(&e->dq, c->q_bytes, "q", err, err_len) ||
        cli_cuda_malloc(&e->dk, c->k_bytes, "k", err, err_len) ||
        cli_cuda_malloc(&e->dv, c->v_bytes, "v", err, err_len) ||
        cli_cuda_malloc(&e->dout, c->out_bytes, "out", err, err_len) ||
        (c->lse && cli_cuda_malloc(&e->dlse, c->lse_bytes, "lse", err, err_len)) ||
        (cu_bytes && cli_cuda_malloc(&e->dcu_q, cu_bytes, "cu_seqlens_q", err, err_len)) ||
        (cu_bytes && cli_cuda_malloc(&e->dcu_k, cu_bytes, "cu_seqlens_k", err, err_len)) ||
        cli_cuda_h2d(e->dq, c->q, c->q_bytes, e->stream, err, err_len) ||
        cli_cuda_h2d(e->dk, c->k, c->k_bytes, e->stream, err, err_len) ||
        cli_cuda_h2d(e->dv, c->v, c->v_bytes, e->stream, err, err_len) ||
        (cu_bytes && cli_cuda_h2d(e->dcu_q, c->cu_q, cu_bytes, e->stream, err, err_len)) ||
        (cu_bytes && cli_cuda_h2d(e->dcu_k, c->cu_k, cu_bytes, e->stream, err, err_len))) {
        cli_exec_free(e);
        return -1;
    }
    e->args.q.data = e->dq;
    e->args.k.data = e->dk;
    e->args.v.data = e->dv;
    e->args.out.data = e->dout;
    e->args.lse.data = c->lse ? e->dlse : NULL;
    if (cu_bytes) {
        e->args.cu_seqlens_q = e->dcu_q;
        e->args.cu_seqlens_k = e->dcu_k;
    }
    return 0;
}

int cli_exec_poison(cli_exec *e, char *err, size_t err_len)
{
    kit_case *c = e->c;
    kit_poison(c->out, c->out_bytes, c->s.dtype, c->lse, c->lse_bytes);
    if (e->backend != FC_BACKEND_CUDA) return 0;
    if (cli_cuda_h2d(e->dout, c->out, c->out_bytes, e->stream, err, err_len)) return -1;
    if (c->lse && cli_cuda_h2d(e->dlse, c->lse, c->lse_bytes, e->stream, err, err_len)) return -1;
    return 0;
}

fc_status cli_exec_run(fc_context *ctx, cli_exec *e, fc_kernel_info *info, char *err, size_t err_len)
{
    fc_status st = fc_attention_forward(ctx, &e->args, e->stream, info);
    if (st != FC_OK) {
        snprintf(err, err_len, "%s%s%s", fc_status_string(st), fc_last_error(ctx)[0] ? ": " : "",
                 fc_last_error(ctx));
        return st;
    }
    if (e->backend == FC_BACKEND_CUDA && cli_cuda_stream_sync(e->stream, err, err_len)) return FC_ERR_CUDA;
    return FC_OK;
}

int cli_exec_fetch(cli_exec *e, char *err, size_t err_len)
{
    kit_case *c = e->c;
    if (e->backend != FC_BACKEND_CUDA) return 0;
    if (cli_cuda_d2h(c->out, e->dout, c->out_bytes, e->stream, err, err_len)) return -1;
    if (c->lse && cli_cuda_d2h(c->lse, e->dlse, c->lse_bytes, e->stream, err, err_len)) return -1;
    return 0;
}

/* ---- check against the reference ------------------------------------------------- */

/* The reference on the case's host inputs, into separate buffers. */
static fc_status run_reference(fc_context *ctx, const kit_case *c, void *ref_out, float *ref_lse)
{
    fc_attention_args a = c->args;
    a.out.data = ref_out;
    a.lse.data = ref_lse;
    a.backend = FC_BACKEND_CPU_REFERENCE;
    return fc_attention_forward(ctx, &a, NULL, NULL);
}

void cli_check_case(fc_context *ctx, kit_case *c, fc_backend backend, cli_check_result *r)
{
    char err[400];
    memset(r, 0, sizeof(*r));
    r->g = kit_gate_for(c->s.dtype);
    r->verdict = CLI_FAIL;
    cli_exec e;
    if (cli_exec_init(&e, c, backend, err, sizeof(err))) {
        snprintf(r->note, sizeof(r->note), "setup: %s", err);
        return;
    }
    r->info.backend = e.backend;
    /* supported() and forward() run the same selection: they must agree */
    fc_kernel_info planned;
    memset(&planned, 0, sizeof(planned));
    fc_status st = fc_attention_supported(ctx, &e.args, &planned);
    if (st == FC_ERR_UNSUPPORTED || st == FC_ERR_NO_DEVICE) {
        r->verdict = CLI_SKIP;
        snprintf(r->note, sizeof(r->note), "%s", fc_last_error(ctx));
        goto done;
    }
    if (st != FC_OK) {
        snprintf(r->note, sizeof(r->note), "fc_attention_supported: %s: %s", fc_status_string(st),
                 fc_last_error(ctx));
        goto done;
    }
    if (cli_exec_poison(&e, err, sizeof(err))) {
        snprintf(r->note, sizeof(r->note), "poison: %s", err);
        goto done;
    }
    st = cli_exec_run(ctx, &e, &r->info, err, sizeof(err));
    if (st == FC_ERR_UNSUPPORTED) {
        /* supported() said yes: forward() disagreeing is a library bug */
        snprintf(r->note, sizeof(r->note), "supported() accepted but forward() refused: %s", err);
        goto done;
    }
    if (st != FC_OK) {
        snprintf(r->note, sizeof(r->note), "%s", err);
        goto done;
    }
    if (strcmp(planned.name, r->info.name) != 0) {
        snprintf(r->note, sizeof(r->note), "supported() chose %s but forward() ran %s", planned.name,
                 r->info.name);
        goto done;
    }
    if (cli_exec_fetch(&e, err, sizeof(err))) {
        snprintf(r->note, sizeof(r->note), "fetch: %s", err);
        goto done;
    }

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
    kit_poison(ref_out, c->out_bytes, c->s.dtype, ref_lse, c->lse_bytes);
    st = run_reference(ctx, c, ref_out, ref_lse);
    if (st != FC_OK) {
        snprintf(r->note, sizeof(r->note), "reference: %s: %s", fc_status_string(st), fc_last_error(ctx));
    } else {
        kit_compare(c, c->out, c->lse, ref_out, ref_lse, &r->g, &r->m);
        if (kit_gate_pass(&r->m, &r->g)) {
            r->verdict = CLI_PASS;
        } else {
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
    }
    free(ref_out);
    free(ref_lse);
done:
    cli_exec_free(&e);
}
