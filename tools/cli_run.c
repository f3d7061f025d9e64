/*
 * cli_run.c -- running a kit case on a backend, forward or backward: host
 * pointers for the CPU backends, device copies for CUDA (inputs uploaded,
 * outputs poisoned on the device, copied back). The checks of a case
 * against the double precision reference are in cli_verify.c.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cli_exec_free(cli_exec *e)
{
    void *bufs[] = {e->dq, e->dk, e->dv, e->dout, e->dlse, e->dcu_q, e->dcu_k, e->dtable, e->dused,
                    e->dnew[0], e->dnew[1], e->dnew[2], e->dnew[3], e->ddesc[0], e->ddesc[1], e->ddesc[2],
                    e->grad.dout, e->grad.dq, e->grad.dk, e->grad.dv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cli_cuda_free(bufs[i]);
    cli_cuda_stream_destroy(e->stream);
    memset(e, 0, sizeof(*e));
}

/* The block table and seqused_k of a paged or seqused case, on the device. */
static int upload_paged(cli_exec *e, const kit_case *c, char *err, size_t err_len)
{
    return (c->block_table && (cli_cuda_malloc(&e->dtable, c->table_bytes, "block_table", err, err_len) ||
                               cli_cuda_h2d(e->dtable, c->block_table, c->table_bytes, e->stream, err, err_len))) ||
           (c->seqused_k && (cli_cuda_malloc(&e->dused, c->used_bytes, "seqused_k", err, err_len) ||
                             cli_cuda_h2d(e->dused, c->seqused_k, c->used_bytes, e->stream, err, err_len)));
}

/* The append step's tensors (k_new, v_new, the rotary tables), on the
 * device, the args pointed at them. */
static int upload_append(cli_exec *e, const kit_case *c, char *err, size_t err_len)
{
    const void *src[4] = {c->k_new, c->v_new, c->rot_cos, c->rot_sin};
    const size_t bytes[4] = {c->new_bytes, c->new_bytes, c->rot_bytes, c->rot_bytes};
    static const char *const names[4] = {"k_new", "v_new", "rotary_cos", "rotary_sin"};
    fc_tensor *t[4] = {&e->args.k_new, &e->args.v_new, &e->args.rotary_cos, &e->args.rotary_sin};
    for (int i = 0; i < 4; i++) {
        if (!src[i]) continue;
        if (cli_cuda_malloc(&e->dnew[i], bytes[i], names[i], err, err_len) ||
            cli_cuda_h2d(e->dnew[i], src[i], bytes[i], e->stream, err, err_len))
            return -1;
        t[i]->data = e->dnew[i];
    }
    return 0;
}

/* The FP8 descales, on the device, the args pointed at them (the amax
 * outputs stay on the host: no CUDA kernel writes them yet, a refusal). */
static int upload_descales(cli_exec *e, const kit_case *c, char *err, size_t err_len)
{
    const size_t bytes = (size_t)kit_descale_count(&c->s) * sizeof(float);
    fc_descale *d[3] = {&e->args.q_descale, &e->args.k_descale, &e->args.v_descale};
    for (int i = 0; i < 3; i++) {
        if (!c->descale[i]) continue;
        if (cli_cuda_malloc(&e->ddesc[i], bytes, "descale", err, err_len) ||
            cli_cuda_h2d(e->ddesc[i], c->descale[i], bytes, e->stream, err, err_len))
            return -1;
        d[i]->data = e->ddesc[i];
    }
    return 0;
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
        (cu_bytes && cli_cuda_h2d(e->dcu_k, c->cu_k, cu_bytes, e->stream, err, err_len)) ||
        upload_paged(e, c, err, err_len) || upload_append(e, c, err, err_len) ||
        upload_descales(e, c, err, err_len)) {
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
    e->args.block_table = e->dtable;
    e->args.seqused_k = e->dused;
    return 0;
}

int cli_exec_init_bwd(cli_exec *e, kit_bwd_case *b, fc_backend backend, char *err, size_t err_len)
{
    if (cli_exec_init(e, &b->c, backend, err, err_len)) return -1;
    e->b = b;
    e->bargs = b->args;
    e->bargs.fwd = e->args;
    if (e->backend != FC_BACKEND_CUDA) return 0;
    if (cli_cuda_malloc(&e->grad.dout, b->dout_bytes, "dout", err, err_len) ||
        cli_cuda_malloc(&e->grad.dq, b->dq_bytes, "dq", err, err_len) ||
        cli_cuda_malloc(&e->grad.dk, b->dk_bytes, "dk", err, err_len) ||
        cli_cuda_malloc(&e->grad.dv, b->dv_bytes, "dv", err, err_len) ||
        cli_cuda_h2d(e->grad.dout, b->dout, b->dout_bytes, e->stream, err, err_len)) {
        cli_exec_free(e);
        return -1;
    }
    e->bargs.dout.data = e->grad.dout;
    e->bargs.dq.data = e->grad.dq;
    e->bargs.dk.data = e->grad.dk;
    e->bargs.dv.data = e->grad.dv;
    return 0;
}

/* ---- what each pass writes --------------------------------------------------------- */

/* The host buffers a pass writes, their device twins and sizes; n of them. */
typedef struct pass_outputs {
    int n;
    void *host[3], *dev[3];
    size_t bytes[3];
} pass_outputs;

static pass_outputs outputs_of(const cli_exec *e, int bwd)
{
    const kit_case *c = e->c;
    const kit_bwd_case *b = e->b;
    if (bwd)
        return (pass_outputs){3, {b->dq, b->dk, b->dv}, {e->grad.dq, e->grad.dk, e->grad.dv},
                              {b->dq_bytes, b->dk_bytes, b->dv_bytes}};
    return (pass_outputs){c->lse ? 2 : 1, {c->out, c->lse}, {e->dout, e->dlse}, {c->out_bytes, c->lse_bytes}};
}

static int poison_pass(cli_exec *e, int bwd, char *err, size_t err_len)
{
    kit_case *c = e->c;
    if (bwd) kit_bwd_poison(e->b);
    else kit_poison(c->out, c->out_bytes, kit_out_dtype(&c->s), c->lse, c->lse_bytes);
    if (e->backend != FC_BACKEND_CUDA) return 0;
    pass_outputs o = outputs_of(e, bwd);
    for (int i = 0; i < o.n; i++)
        if (cli_cuda_h2d(o.dev[i], o.host[i], o.bytes[i], e->stream, err, err_len)) return -1;
    return 0;
}

static int fetch_pass(cli_exec *e, int bwd, char *err, size_t err_len)
{
    if (e->backend != FC_BACKEND_CUDA) return 0;
    pass_outputs o = outputs_of(e, bwd);
    for (int i = 0; i < o.n; i++)
        if (cli_cuda_d2h(o.host[i], o.dev[i], o.bytes[i], e->stream, err, err_len)) return -1;
    return 0;
}

/* A call's status into err with the library's message; for CUDA, a wait
 * for the stream and its check. */
static fc_status settle(fc_context *ctx, cli_exec *e, fc_status st, char *err, size_t err_len)
{
    if (st != FC_OK) {
        snprintf(err, err_len, "%s%s%s", fc_status_string(st), fc_last_error(ctx)[0] ? ": " : "",
                 fc_last_error(ctx));
        return st;
    }
    if (e->backend == FC_BACKEND_CUDA && cli_cuda_stream_sync(e->stream, err, err_len)) return FC_ERR_CUDA;
    return FC_OK;
}

/* ---- the pass's calls --------------------------------------------------------------- */

int cli_exec_poison(cli_exec *e, char *err, size_t err_len) { return poison_pass(e, e->b != NULL, err, err_len); }

int cli_exec_fetch(cli_exec *e, char *err, size_t err_len) { return fetch_pass(e, e->b != NULL, err, err_len); }

fc_status cli_exec_supported(fc_context *ctx, const cli_exec *e, fc_kernel_info *info)
{
    if (e->b) return fc_attention_backward_supported(ctx, &e->bargs, info);
    return fc_attention_supported(ctx, &e->args, info);
}

fc_status cli_exec_call(fc_context *ctx, cli_exec *e, fc_kernel_info *info)
{
    if (e->b) return fc_attention_backward(ctx, &e->bargs, e->stream, info);
    return fc_attention_forward(ctx, &e->args, e->stream, info);
}

fc_status cli_exec_run(fc_context *ctx, cli_exec *e, fc_kernel_info *info, char *err, size_t err_len)
{
    return settle(ctx, e, cli_exec_call(ctx, e, info), err, err_len);
}

fc_status cli_exec_bwd_forward(fc_context *ctx, cli_exec *e, char *err, size_t err_len)
{
    if (poison_pass(e, 0, err, err_len)) return FC_ERR_CUDA;
    fc_status st = settle(ctx, e, fc_attention_forward(ctx, &e->args, e->stream, NULL), err, err_len);
    if (st == FC_OK && fetch_pass(e, 0, err, err_len)) st = FC_ERR_CUDA;
    return st;
}
