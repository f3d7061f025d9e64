/*
 * dispatch.c -- the one selection function. fc_attention_supported and
 * fc_attention_forward both call fc_select, so "supported?" and "what runs"
 * can never disagree. It picks the backend (from the request and where the
 * pointers live), the kernel family and tile config (through the per-path
 * planners), and the split-KV count; or it says why nothing fits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "memory_space.h"
#include "tuning_cache.h"
#include "validate.h"

static int choose_num_splits(int64_t tiles, int n_blocks, int sm_count, int max_splits, int streaming);

int fc_choose_num_splits(int64_t tiles, int n_blocks, int sm_count, int max_splits, int streaming)
{
    /* The search below costs ~0.3 us for a decode call; a loop of eager
     * calls asks the same question each time, so each thread keeps its
     * last answer. */
    static _Thread_local struct { int64_t tiles; int n_blocks, sm_count, max_splits, streaming, splits; } last = {
        -1, 0, 0, 0, 0, 1};
    if (tiles != last.tiles || n_blocks != last.n_blocks || sm_count != last.sm_count ||
        max_splits != last.max_splits || streaming != last.streaming) {
        last.splits = choose_num_splits(tiles, n_blocks, sm_count, max_splits, streaming);
        last.tiles = tiles;
        last.n_blocks = n_blocks;
        last.sm_count = sm_count;
        last.max_splits = max_splits;
        last.streaming = streaming;
    }
    return last.splits;
}

static int choose_num_splits(int64_t tiles, int n_blocks, int sm_count, int max_splits, int streaming)
{
    /* A grid that already fills most of the SMs gains nothing from splitting;
     * nor does a KV range of a few blocks (the combine pass would cost more).
     * Tiles of a few query rows stream K/V (memory-bound): half the SMs come
     * near the copy rate, and 64 tiles on 132 SMs ran 1.05-1.20x faster
     * unsplit than in 2 splits (4 shapes, H100 and H200). */
    const int full_pct = streaming ? 45 : 80;
    if (tiles <= 0 || sm_count <= 0 || tiles >= (int64_t)sm_count * full_pct / 100 || n_blocks <= 4) return 1;
    if (max_splits > n_blocks) max_splits = n_blocks;
    if (max_splits > FC_MAX_SPLITS) max_splits = FC_MAX_SPLITS;
    /* Wave efficiency of s splits: the fraction of SM slots busy over the
     * waves the grid needs. Take the smallest s within 85% of the best. */
    double eff[FC_MAX_SPLITS + 1] = {0};
    double best = 0;
    for (int s = 1; s <= max_splits; s++) {
        double waves = (double)(tiles * s) / sm_count;
        double full = (double)((tiles * s + sm_count - 1) / sm_count);
        eff[s] = waves / full;
        if (eff[s] > best) best = eff[s];
    }
    for (int s = 1; s <= max_splits; s++)
        if (eff[s] >= 0.85 * best) return s;
    return 1;
}

static const char *backend_name(fc_backend b)
{
    switch (b) {
    case FC_BACKEND_AUTO: return "auto";
    case FC_BACKEND_CPU: return "cpu";
    case FC_BACKEND_CUDA: return "cuda";
    case FC_BACKEND_CPU_REFERENCE: return "cpu-reference";
    }
    return "?";
}

/* Every pointer a call reads or writes, with its name, and whether it is
 * device memory (memory_space.h). */
typedef struct call_pointers {
    const void *ptr[FC_MAX_CALL_POINTERS];
    const char *name[FC_MAX_CALL_POINTERS];
    unsigned char is_device[FC_MAX_CALL_POINTERS];
    int n;
} call_pointers;

static void add_pointer(call_pointers *c, const void *ptr, const char *name)
{
    c->ptr[c->n] = ptr;
    c->name[c->n++] = name;
}

/* b: the backward's params (p is then &b->f), else NULL. q comes first: AUTO
 * picks the backend from it. */
static void locate_pointers(const fc_fwd_params *p, const fc_bwd_params *b, call_pointers *c)
{
    c->n = 0;
    add_pointer(c, p->q, "q");
    add_pointer(c, p->k, "k");
    add_pointer(c, p->v, "v");
    add_pointer(c, p->o, "out");
    if (p->lse) add_pointer(c, p->lse, "lse");
    if (p->cu_seqlens_q) {
        add_pointer(c, p->cu_seqlens_q, "cu_seqlens_q");
        add_pointer(c, p->cu_seqlens_k, "cu_seqlens_k");
    }
    if (p->block_table) add_pointer(c, p->block_table, "block_table");
    if (p->seqused_k) add_pointer(c, p->seqused_k, "seqused_k");
    if (p->app.k_new) {
        add_pointer(c, p->app.k_new, "k_new");
        add_pointer(c, p->app.v_new, "v_new");
    }
    if (p->app.cos) {
        add_pointer(c, p->app.cos, "rotary_cos");
        add_pointer(c, p->app.sin, "rotary_sin");
    }
    const fc_descale *ds[3] = {&p->q_descale, &p->k_descale, &p->v_descale};
    static const char *const dn[3] = {"q_descale", "k_descale", "v_descale"};
    for (int i = 0; i < 3; i++)
        if (ds[i]->data) add_pointer(c, ds[i]->data, dn[i]);
    if (p->out_amax) add_pointer(c, p->out_amax, "out_amax");
    if (p->p_amax) add_pointer(c, p->p_amax, "p_amax");
    if (b) {
        add_pointer(c, b->dout, "dout");
        add_pointer(c, b->dq, "dq");
        add_pointer(c, b->dk, "dk");
        add_pointer(c, b->dv, "dv");
        if (b->workspace) add_pointer(c, b->workspace, "workspace");
    }
    fc_cuda_device_pointers(c->ptr, c->n, c->is_device); /* all 0 without CUDA (cuda_stub.c) */
}

/* All pointers must live where the backend runs. Without the CUDA runtime
 * compiled in every pointer is host memory. */
static fc_status check_memory_space(fc_context *ctx, const call_pointers *c, int want_device)
{
    for (int i = 0; i < c->n; i++)
        if (c->is_device[i] != want_device)
            return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                                "%s is %s memory but the %s backend needs %s pointers", c->name[i],
                                c->is_device[i] ? "device" : "host", want_device ? "cuda" : "cpu",
                                want_device ? "device" : "host");
    return FC_OK;
}

static fc_status select_cpu(fc_context *ctx, const fc_fwd_params *p, const call_pointers *ptrs, fc_backend b,
                            fc_plan *plan)
{
    if (p->dtype == FC_DTYPE_F64 && b == FC_BACKEND_CPU)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "dtype f64 runs on the cpu-reference backend only (backend auto sends host f64 "
                            "calls there): the tiled cpu backend takes f32, f16, bf16");
    if (p->head_dim > FC_CPU_MAX_HEAD_DIM)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "head_dim %d is not supported by the cpu backend: supported 1 to %d",
                            (int)p->head_dim, FC_CPU_MAX_HEAD_DIM);
    fc_status st = check_memory_space(ctx, ptrs, 0);
    if (st) return st;
    /* Always validated on the host (cheap), even when nothing is to be done:
     * "nothing" may rest on max_seqlen_q == 0, which only cu_seqlens confirm. */
    if (p->cu_seqlens_q) {
        st = fc_check_varlen(ctx, p, p->cu_seqlens_q, p->cu_seqlens_k);
        if (st) return st;
    }
    if (p->block_table || p->seqused_k) {
        st = fc_check_paged(ctx, p, p->seqused_k, p->block_table);
        if (st) return st;
    }
    plan->backend = b;
    snprintf(plan->name, sizeof plan->name, "%s", b == FC_BACKEND_CPU ? "cpu_tiled" : "cpu_reference");
    plan->num_splits = 1;
    return FC_OK;
}

/* Validate device-resident cu_seqlens through one small synchronous copy.
 * While the stream is being captured a copy would break the capture, so the
 * check is skipped (documented in docs/API.md). */
static fc_status check_device_varlen(fc_context *ctx, const fc_fwd_params *p, void *stream)
{
    if (ctx->trust_arrays || fc_cuda_stream_is_capturing(stream)) return FC_OK;
    size_t bytes = ((size_t)p->batch + 1) * sizeof(int32_t);
    int32_t *h = malloc(2 * bytes);
    if (!h) return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", 2 * bytes);
    fc_status st = fc_cuda_copy_to_host(h, p->cu_seqlens_q, bytes, stream, ctx->err, sizeof ctx->err);
    if (!st) st = fc_cuda_copy_to_host(h + p->batch + 1, p->cu_seqlens_k, bytes, stream, ctx->err, sizeof ctx->err);
    if (!st) st = fc_check_varlen(ctx, p, h, h + p->batch + 1);
    free(h);
    return st;
}

/* Validate device-resident seqused_k and block table the same way: the
 * counts first, then the table rows (the pages each sequence uses). */
static fc_status check_device_paged(fc_context *ctx, const fc_fwd_params *p, void *stream)
{
    if (ctx->trust_arrays || fc_cuda_stream_is_capturing(stream)) return FC_OK;
    const size_t used_n = p->seqused_k ? (size_t)p->batch : 0;
    const size_t table_n = p->block_table ? (size_t)(p->batch - 1) * (size_t)p->block_table_stride + (size_t)p->max_pages : 0;
    int32_t *h = malloc((used_n + table_n + 1) * sizeof(int32_t));
    if (!h)
        return fc_set_error(ctx, FC_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory",
                            (used_n + table_n + 1) * sizeof(int32_t));
    fc_status st = FC_OK;
    if (used_n) st = fc_cuda_copy_to_host(h, p->seqused_k, used_n * sizeof(int32_t), stream, ctx->err, sizeof ctx->err);
    if (!st && table_n)
        st = fc_cuda_copy_to_host(h + used_n, p->block_table, table_n * sizeof(int32_t), stream, ctx->err, sizeof ctx->err);
    if (!st) st = fc_check_paged(ctx, p, used_n ? h : NULL, table_n ? h + used_n : NULL);
    free(h);
    return st;
}

/* q's dtype: f16 or bf16 on every CUDA kernel (k/v may be FP8 under it),
 * and out, dq, dk, dv in it; first, so that an FP8 q with host-side amax
 * outputs hears why. */
static fc_status cuda_dtype(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *b)
{
    if (!fc_dtype_is_16bit(p->dtype))
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "dtype %s (q) is not supported by the cuda kernels: supported f16, bf16 (FP8 k/v may "
                            "sit under them); the cpu backend takes f32 and FP8 q, cpu-reference f64",
                            fc_dtype_name(p->dtype));
    const int o = b ? b->g_dtype : p->o_dtype;
    if (o != p->dtype)
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED,
                            "%s in %s under %s inputs: the cuda kernels write q's dtype (the cpu backends take it)",
                            b ? "dq, dk, dv" : "out", fc_dtype_name(o), fc_dtype_name(p->dtype));
    return FC_OK;
}

/* What every CUDA plan needs: the device, every pointer in device memory,
 * a dtype the kernels take, and valid cu_seqlens whenever they are given,
 * forward and backward, whatever the token counts: with no query token
 * nothing is written, but bad offsets are still an error, as on the CPU
 * backends, so that every backend answers a call alike. */
static fc_status cuda_common(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *b,
                             const call_pointers *ptrs, void *stream, fc_plan *plan)
{
    fc_status st = fc_cuda_get_device(ctx->device, &plan->dev, ctx->err, sizeof ctx->err);
    if (st) return st;
    st = cuda_dtype(ctx, p, b);
    if (st) return st;
    st = check_memory_space(ctx, ptrs, 1);
    if (st) return st;
    if (p->block_table || p->seqused_k) return check_device_paged(ctx, p, stream);
    return p->cu_seqlens_q ? check_device_varlen(ctx, p, stream) : FC_OK;
}

/* The plan's name: the kernel's, then "+split<n>" or "+tail". Copied, not
 * formatted: snprintf costs a tenth of a microsecond per call here. */
static void name_cuda_plan(char name[96], const char *kernel, int splits, int tail)
{
    char suffix[16] = "";
    if (splits > 1) {
        memcpy(suffix, "+split", 6);
        int n = 6;
        if (splits >= 10) suffix[n++] = (char)('0' + splits / 10 % 10);
        suffix[n++] = (char)('0' + splits % 10);
        suffix[n] = 0;
    } else if (tail) {
        memcpy(suffix, "+tail", 6);
    }
    const size_t ns = strlen(suffix);
    size_t nk = strlen(kernel); /* NUL-terminated within its 96 bytes */
    if (nk > 95 - ns) nk = 95 - ns;
    memcpy(name, kernel, nk);
    memcpy(name + nk, suffix, ns + 1);
}

/* A decode-like forward whose GQA ratio the Hopper kernels cannot pack
 * (not a power of two) reads each KV block once per query head there; the
 * sm80-class kernel packs any ratio and reads it once per KV head: 1.5-3.0x
 * on 5:1 and 7:1 decode (H200, bench/decode-sweep.txt). Replaces *ch with
 * that plan when it packs, else leaves *ch. */
static void packed_on_sm80(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                          fc_cuda_choice *ch)
{
    fc_cuda_choice alt;
    char why[FC_ERRMSG_LEN];
    memset(&alt, 0, sizeof alt);
    if (fc_sm80_plan(p, dev, tune, &alt, why, sizeof why) != FC_OK || !alt.pack_gqa) return;
    *ch = alt;
    ch->path = FC_CUDA_PATH_SM80;
}

/* The CUDA kernel family of a call, forward (b NULL) or backward (b, p =
 * &b->f): the Hopper planner on an sm_90 device (cuda path 0 or 90), else
 * the sm80-class one (path 0 or 80); the reasons of both when neither takes
 * it. Fills plan->cuda, programmatic dependent launch included. */
static fc_status choose_cuda_path(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *b,
                                  const fc_tuning *tune, int path, fc_plan *plan)
{
    const fc_cuda_device *dev = &plan->dev;
    const int hopper = dev->cc_major == 9 && dev->cc_minor == 0;
    const int try90 = path == 90 || (path == 0 && hopper);
    const int try80 = path != 90;
    char why90[FC_ERRMSG_LEN], why80[FC_ERRMSG_LEN];
    why90[0] = why80[0] = 0; /* not zeroed whole: 1 KB a call */
    fc_cuda_choice *ch = &plan->cuda;
    memset(ch, 0, sizeof *ch);
    fc_status st = FC_ERR_UNSUPPORTED;
    if (try90) {
        if (!hopper) {
            snprintf(why90, sizeof why90, "the sm90 path needs an sm_90 device, this is %s (sm_%d%d)",
                     dev->name, dev->cc_major, dev->cc_minor);
        } else {
            st = b ? fc_sm90_bwd_plan(b, dev, tune, ch, why90, sizeof why90)
                   : fc_sm90_plan(p, dev, tune, ch, why90, sizeof why90);
            if (st == FC_OK) ch->path = FC_CUDA_PATH_SM90;
        }
    }
    if (st == FC_OK && path == 0 && ch->pack_refused) packed_on_sm80(p, dev, tune, ch);
    if (st != FC_OK && try80) {
        memset(ch, 0, sizeof *ch);
        st = b ? fc_sm80_bwd_plan(b, dev, tune, ch, why80, sizeof why80)
               : fc_sm80_plan(p, dev, tune, ch, why80, sizeof why80);
        if (st == FC_OK) ch->path = FC_CUDA_PATH_SM80;
    }
    if (st != FC_OK) {
        if (st != FC_ERR_UNSUPPORTED) /* a real error (e.g. CUDA) from a planner */
            return fc_set_error(ctx, st, "%s", why90[0] && !try80 ? why90 : (why80[0] ? why80 : why90));
        /* both paths' reasons, once where they are the same (the backward
         * planners share their first checks) */
        if (try90 && try80 && strcmp(why90, why80) != 0)
            return fc_set_error(ctx, FC_ERR_UNSUPPORTED, "%s; %s", why90, why80);
        return fc_set_error(ctx, FC_ERR_UNSUPPORTED, "%s", try90 ? why90 : why80);
    }
    ch->pdl = fc_cuda_pdl_on(dev, tune);
    return FC_OK;
}

/* Programmatic dependent launch (common/pdl.cuh): sm_90 or newer (a 9.x
 * device runs only this library's sm_90/90a images, each compiled with the
 * kernel-side wait), unless tuning.pdl is 0. */
int fc_cuda_pdl_on(const fc_cuda_device *dev, const fc_tuning *tune)
{
    return dev->cc_major >= 9 && tune->pdl != 0;
}

/* The backward on CUDA: one kernel family's plan, no split. */
static fc_status select_cuda_bwd(fc_context *ctx, const fc_bwd_params *b, const fc_tuning *tune, int path,
                                 fc_plan *plan)
{
    const fc_status st = choose_cuda_path(ctx, &b->f, b, tune, path, plan);
    if (st) return st;
    fc_cuda_choice *ch = &plan->cuda;
    ch->num_splits = 1;
    if (b->workspace && b->workspace_bytes < ch->workspace_bytes)
        return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT,
                            "workspace_bytes %lld is too small: this call needs %lld (see "
                            "fc_attention_backward_supported)", (long long)b->workspace_bytes,
                            (long long)ch->workspace_bytes);
    plan->backend = FC_BACKEND_CUDA;
    plan->num_splits = 1;
    plan->workspace_bytes = ch->workspace_bytes;
    name_cuda_plan(plan->name, ch->name, 1, 0);
    return FC_OK;
}

static fc_status select_cuda(fc_context *ctx, const fc_fwd_params *p, const fc_tuning *tune, int path,
                             fc_plan *plan)
{
    const fc_cuda_device *dev = &plan->dev;
    fc_status st = choose_cuda_path(ctx, p, NULL, tune, path, plan);
    if (st) return st;
    fc_cuda_choice *ch = &plan->cuda;
    /* Split-KV when the grid would leave SMs idle (decode above all). Varlen
     * problems are not split: their per-sequence lengths are only known on
     * the device. */
    int bm = 1, bn = 1;
    fc_cuda_tile_shape(ch, &bm, &bn);
    int64_t rows = ch->pack_gqa ? (int64_t)p->seqlen_q * (p->heads_q / p->heads_kv) : p->seqlen_q;
    int64_t heads = ch->pack_gqa ? p->heads_kv : p->heads_q;
    int64_t tiles = (int64_t)p->batch * heads * ((rows + bm - 1) / bm);
    int n_blocks = (int)((p->seqlen_k + bn - 1) / bn);
    const int streaming = (rows < bm ? rows : bm) <= 16; /* query rows per tile */
    int splits = p->cu_seqlens_q ? 1 : fc_choose_num_splits(tiles, n_blocks, dev->sm_count, FC_MAX_SPLITS, streaming);
    /* tuning.splits (an A/B hook): that many splits instead, at most one per
     * KV block; the plan name shows it. */
    const int forced_splits = tune->splits;
    if (!p->cu_seqlens_q && forced_splits >= 1)
        splits = forced_splits < n_blocks ? forced_splits : (n_blocks > 0 ? n_blocks : 1);
    ch->num_splits = splits;
    /* A split replaces the planner's tail balancing (for unsplit grids of
     * several rounds; otherwise its workspace came with the plan). */
    if (splits > 1) {
        ch->tail = 0;
        ch->workspace_bytes = fc_cuda_split_workspace_bytes(p, splits);
    }
    plan->backend = FC_BACKEND_CUDA;
    plan->num_splits = splits;
    plan->workspace_bytes = ch->workspace_bytes;
    name_cuda_plan(plan->name, ch->name, splits, ch->tail);
    return FC_OK;
}

/* ctx's hooks, with the fields they leave to the planner taken from the
 * cache entry c; and the path, the context's unless it leaves it open. */
static void merge_choice(const fc_context *ctx, const fc_tune_choice *c, fc_tuning *t, int *path)
{
    *t = ctx->tuning;
    for (int i = 0; i < FC_TUNE_NUM_FIELDS; i++) {
        const fc_tune_field *f = &fc_tune_fields[i];
        if (fc_tune_get(t, f) == f->def) *fc_tune_at(t, f) = fc_tune_get(&c->t, f);
    }
    *path = ctx->cuda_path ? ctx->cuda_path : c->path;
}

/* Did the plan take what entry c chose: its path, its row, its split
 * count? (rotation, tail balancing and the grid cap are taken where the
 * row can, as the hooks are.) */
static int plan_takes(const fc_tune_choice *c, const fc_plan *plan, int bwd)
{
    const fc_cuda_choice *ch = &plan->cuda;
    const int path = ch->path == FC_CUDA_PATH_SM90 ? 90 : 80;
    const int32_t row80 = bwd ? c->t.sm80_bwd_config : c->t.sm80_config;
    const int32_t row90 = bwd ? c->t.sm90_bwd_config : c->t.sm90_config;
    return (!c->path || c->path == path) && (row90 < 0 || (path == 90 && ch->config == row90)) &&
           (row80 < 0 || (path == 80 && ch->config == row80)) && (c->t.splits < 1 || c->t.splits == ch->num_splits);
}

/* The CUDA plan: with the tuning cache's entry for the call when there is
 * one and the call can take it whole, else as the planners choose. The
 * entry is looked up after every legality check, and the planners check it
 * again, so a cache never makes a call run a kernel that cannot run it. */
static fc_status select_cuda_tuned(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *b, fc_plan *plan)
{
    const fc_tune_entry *e = ctx->tune ? fc_tune_find(ctx->tune, &plan->dev, fc_tune_key(p, b)) : NULL;
    if (e) {
        fc_tuning t;
        int path;
        merge_choice(ctx, &e->choice, &t, &path);
        const fc_status st = b ? select_cuda_bwd(ctx, b, &t, path, plan) : select_cuda(ctx, p, &t, path, plan);
        if (st == FC_OK && plan_takes(&e->choice, plan, b != NULL)) {
            plan->tuned = 1;
            return FC_OK;
        }
        ctx->err[0] = 0; /* the entry's refusal is not the call's */
    }
    return b ? select_cuda_bwd(ctx, b, &ctx->tuning, ctx->cuda_path, plan)
             : select_cuda(ctx, p, &ctx->tuning, ctx->cuda_path, plan);
}

fc_status fc_select(fc_context *ctx, const fc_fwd_params *p, const fc_bwd_params *bwd, fc_backend requested,
                    void *stream, fc_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    call_pointers ptrs;
    locate_pointers(p, bwd, &ptrs);
    fc_backend b = requested;
    if (b == FC_BACKEND_AUTO) b = ptrs.is_device[0] ? FC_BACKEND_CUDA : FC_BACKEND_CPU; /* where q lives */
    /* f64 exists for gradient checks: only the double-precision oracle takes it. */
    if (requested == FC_BACKEND_AUTO && b == FC_BACKEND_CPU && p->dtype == FC_DTYPE_F64) b = FC_BACKEND_CPU_REFERENCE;
    switch (b) {
    case FC_BACKEND_CPU:
    case FC_BACKEND_CPU_REFERENCE: return select_cpu(ctx, p, &ptrs, b, plan);
    case FC_BACKEND_CUDA: {
        fc_status st = cuda_common(ctx, p, bwd, &ptrs, stream, plan);
        if (st) return st;
        return select_cuda_tuned(ctx, p, bwd, plan);
    }
    default: return fc_set_error(ctx, FC_ERR_INVALID_ARGUMENT, "backend %s is invalid", backend_name(b));
    }
}

static fc_status run_cpu(fc_context *ctx, const fc_fwd_params *p, const fc_plan *plan)
{
    if (plan->backend == FC_BACKEND_CPU_REFERENCE) return fc_cpu_reference_forward(p, ctx->err, sizeof ctx->err);
    return fc_cpu_tiled_forward(p, ctx->num_threads, fc_context_cpu_pool(ctx), ctx->err, sizeof ctx->err);
}

fc_status fc_run(fc_context *ctx, const fc_fwd_params *p, const fc_plan *plan, void *stream)
{
    switch (plan->backend) {
    case FC_BACKEND_CPU_REFERENCE:
    case FC_BACKEND_CPU: {
        if (!p->app.k_new) return run_cpu(ctx, p, plan);
        fc_fwd_params lp;
        void *scratch = NULL;
        fc_status st = fc_cpu_append(p, &lp, &scratch, ctx->err, sizeof ctx->err);
        if (!st) st = run_cpu(ctx, &lp, plan);
        free(scratch);
        return st;
    }
    case FC_BACKEND_CUDA: {
        fc_fwd_params q = *p;
        q.num_splits = plan->num_splits;
        return fc_cuda_forward(&q, &plan->cuda, &plan->dev, stream, ctx->err, sizeof ctx->err);
    }
    default:
        return fc_set_error(ctx, FC_ERR_INTERNAL, "plan has no backend (%s)", backend_name(plan->backend));
    }
}

fc_status fc_run_backward(fc_context *ctx, const fc_bwd_params *p, const fc_plan *plan, void *stream)
{
    switch (plan->backend) {
    case FC_BACKEND_CPU_REFERENCE: return fc_cpu_reference_backward(p, ctx->err, sizeof ctx->err);
    case FC_BACKEND_CPU:
        return fc_cpu_tiled_backward(p, ctx->num_threads, fc_context_cpu_pool(ctx), ctx->err, sizeof ctx->err);
    case FC_BACKEND_CUDA: return fc_cuda_backward(p, &plan->cuda, &plan->dev, stream, ctx->err, sizeof ctx->err);
    default:
        return fc_set_error(ctx, FC_ERR_INTERNAL, "plan has no backend (%s)", backend_name(plan->backend));
    }
}
