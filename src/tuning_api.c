/*
 * tuning_api.c -- the public face of the tuning cache: load, save, record
 * and describe a context's cache (tuning_cache.h has the cache itself;
 * dispatch.c consults it).
 */
#include <stdio.h>
#include <string.h>

#include "api_internal.h"
#include "tuning_cache.h"
#include "validate.h"

fc_status fc_context_load_tuning(fc_context *ctx, const char *path)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    if (path && !*path) return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "tuning cache path is empty");
    const fc_status st = fc_tune_cache_load(&ctx->tune, path, ctx->err, sizeof ctx->err);
    if (st == FC_OK) ctx->err[0] = 0;
    return st;
}

fc_status fc_context_save_tuning(fc_context *ctx, const char *path)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    if (!path || !*path) return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "tuning cache path is NULL or empty");
    const fc_status st = fc_tune_write(ctx->tune, path, ctx->err, sizeof ctx->err);
    if (st == FC_OK) ctx->err[0] = 0;
    return st;
}

/* The bucket key and device of a call, through the call's own checks. */
static fc_status call_key(fc_context *ctx, const fc_attention_args *args, const fc_attention_backward_args *bwd,
                          uint64_t *key, fc_cuda_device *dev)
{
    fc_bwd_params b;
    int nothing;
    fc_status st = bwd ? fc_build_bwd_params(ctx, bwd, &b, &nothing) : fc_build_params(ctx, args, &b.f, &nothing);
    if (st) return st;
    st = fc_cuda_get_device(ctx->device, dev, ctx->err, sizeof ctx->err);
    if (st) return st;
    *key = fc_tune_key(&b.f, bwd ? &b : NULL);
    return FC_OK;
}

/* A choice record_tuning can keep: fields in range, of the entry's pass,
 * setting something; a one-line comment. */
static fc_status check_choice(fc_context *ctx, const fc_tune_choice *c, int bwd, const char *comment)
{
    const fc_status st = fc_check_tuning(ctx, &c->t);
    if (st) return st;
    char why[96];
    if (fc_tune_choice_misfit(c, bwd, why, sizeof why))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "record_tuning: %s", why);
    if (!fc_tune_choice_sets(c))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "record_tuning: the choice sets nothing");
    if (comment && (strchr(comment, '\n') || strlen(comment) > 200))
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "record_tuning: the comment has a newline or is over "
                            "200 bytes");
    return FC_OK;
}

fc_status fc_context_record_tuning(fc_context *ctx, const fc_attention_args *args,
                                   const fc_attention_backward_args *bwd, int32_t cuda_path, const fc_tuning *choice,
                                   const char *comment)
{
    if (!ctx) return FC_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    if (!args == !bwd)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "record_tuning: give exactly one of args and bwd");
    if (cuda_path != 0 && cuda_path != 80 && cuda_path != 90)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "record_tuning: cuda_path %d: use 0, 80 or 90",
                            (int)cuda_path);
    fc_tune_choice c = {cuda_path, {0}};
    if (choice) c.t = *choice; /* fc_tune_record drops its trace file */
    fc_status st = choice ? check_choice(ctx, &c, bwd != NULL, comment) : FC_OK;
    if (st) return st;
    uint64_t key;
    fc_cuda_device dev;
    st = call_key(ctx, args, bwd, &key, &dev);
    if (st) return st;
    st = fc_tune_record(&ctx->tune, &dev, key, choice ? &c : NULL, comment, ctx->err, sizeof ctx->err);
    if (st == FC_OK) ctx->err[0] = 0;
    return st;
}

static size_t put(char *buf, size_t len, size_t at, const char *fmt, const char *a, long long x, long long y)
{
    /* counts past the end too: the caller learns the size it needs */
    const int n = snprintf(at < len ? buf + at : NULL, at < len ? len - at : 0, fmt, a, x, y);
    return n < 0 ? at : at + (size_t)n;
}

/* The description's text into buf (as much as fits); its full length. */
static size_t describe(const fc_context *ctx, char *buf, size_t len)
{
    size_t at = 0;
    const fc_tune_cache *c = ctx->tune;
    if (ctx->tune_env_status) at = put(buf, len, at, "%s\n", ctx->tune_env_err, 0, 0);
    if (!c) return put(buf, len, at, "%sno tuning cache: the planners choose every kernel\n", "", 0, 0);
    at = put(buf, len, at, "tuning cache %s: %lld sections", c->path ? c->path : "(recorded)", c->n_sec, 0);
    int ignored = 0;
    for (int i = 0; i < c->n_sec; i++) ignored += !c->sec[i].applies;
    at = put(buf, len, at, "%s, %lld for another build (ignored)\n", "", ignored, 0);
    for (int i = 0; i < c->n_sec; i++) {
        const fc_tune_section *s = &c->sec[i];
        at = put(buf, len, at, "  gpu=%s: %lld entries, %lld with wildcards", s->gpu, s->n_exact, s->n_wild);
        at = put(buf, len, at, "; library %s", s->library, 0, 0);
        at = put(buf, len, at, ", tables %s", s->tables, 0, 0);
        at = put(buf, len, at, "%s\n", s->applies ? "" : " (not this build's: ignored)", 0, 0);
    }
    return at;
}

fc_status fc_context_tuning_info(const fc_context *ctx, char *buf, size_t len, size_t *needed)
{
    if (!ctx || (!buf && len)) return FC_ERR_INVALID_ARGUMENT;
    if (len) buf[0] = 0;
    const size_t at = describe(ctx, buf, len);
    if (needed) *needed = at + 1;
    return ctx->tune_env_status;
}

