/*
 * cli_tune_search.c -- the tuner's search for one shape (cli_tune.c runs
 * it over a list): the candidates the planners could legally run, pruned
 * by the split chooser's wave model; each captured as a CUDA graph, its
 * output checked against the planner's; all timed in interleaved rounds;
 * then a second round of the two best with rotation, tail balancing, more
 * mask code and PDL off tried on each. kit_tune_decide gives the verdict;
 * an entry that loses the verify pass is dropped again (cli_tune.c): PDL
 * flips have won a search by 1-2% and lost its verify pass.
 */
#include <stdlib.h>
#include <string.h>

#include "cli_tune.h"

/* ---- candidates --------------------------------------------------------------- */

static void cand_init(tune_cand *c, int32_t path)
{
    memset(c, 0, sizeof *c);
    c->path = path;
    fc_tuning_init(&c->t);
}

/* Put candidate c into the list unless the library refuses it or another
 * candidate already makes the same plan (the kernel name says all but PDL:
 * path, row, rotation, tail, splits, mask code). */
static void cand_add(tune_state *ts, const tune_cand *c, int allow_dup)
{
    if (ts->n >= TUNE_MAX_CANDS) return;
    fc_kernel_info info;
    if (fc_context_set_cuda_path(ts->ctx, c->path) || fc_context_set_tuning(ts->ctx, &c->t) ||
        cli_exec_supported(ts->ctx, ts->e, &info) != FC_OK)
        return;
    for (int i = 0; i < ts->n && !allow_dup; i++)
        if (strcmp(ts->c[i].name, info.name) == 0 && (ts->c[i].t.pdl == 0) == (c->t.pdl == 0)) return;
    ts->c[ts->n] = *c;
    ts->c[ts->n].graph = NULL; /* a copy's graph belongs to its original */
    memcpy(ts->c[ts->n].name, info.name, sizeof info.name);
    ts->n++;
}

/* Split counts worth timing on a row of block_m query rows: only when the
 * unsplit grid leaves SMs idle, at least two KV blocks per split, and a
 * wave efficiency within 80% of the best (the split chooser's model,
 * src/dispatch.c). */
static int split_counts(const kit_shape *s, int block_m, int block_n, int sms, int *out)
{
    const int64_t tiles = (int64_t)s->batch * s->heads_q * ((s->seqlen_q + block_m - 1) / block_m);
    const int nb = (s->seqlen_k + block_n - 1) / block_n;
    if (tiles <= 0 || sms <= 0 || tiles >= sms || nb < 4) return 0;
    static const int cand[] = {2, 3, 4, 6, 8, 12, 16, 24, 32};
    double eff[9], best = 0;
    for (int i = 0; i < 9; i++) {
        const int64_t cta = tiles * cand[i];
        eff[i] = cand[i] * 2 > nb ? 0 : (double)cta / (double)(((cta + sms - 1) / sms) * sms);
        if (eff[i] > best) best = eff[i];
    }
    int n = 0;
    for (int i = 0; i < 9; i++)
        if (eff[i] > 0 && eff[i] >= 0.8 * best) out[n++] = cand[i];
    return n;
}

/* Stage 1: the planner twice, then each row of either path that fits the
 * head dim (the sm80-class rows of the device's own class), and split
 * counts on the planner's row and on each Hopper row. */
void tune_stage1(tune_state *ts)
{
    tune_cand c;
    cand_init(&c, 0);
    ts->n = 0;
    cand_add(ts, &c, 0);
    cand_add(ts, &c, 1); /* the noise probe */
    const int D = ts->e->c->s.head_dim;
    int splits[16];
    for (int path = 90; path >= 80; path -= 10) {
        if (path == 90 && ts->cc != 90) continue;
        cand_init(&c, path);
        cand_add(ts, &c, 0);
        fc_tile_row r;
        for (int i = 0; fc_tuning_row_info(path, i, &r) == FC_OK; i++) {
            if (r.head_dim != D || (path == 80 && r.arch_class != ts->arch_class)) continue;
            cand_init(&c, path);
            *(path == 90 ? &c.t.sm90_config : &c.t.sm80_config) = i;
            cand_add(ts, &c, 0);
            const int ns = split_counts(&ts->e->c->s, r.block_m, r.block_n, ts->sms, splits);
            for (int k = 0; k < ns; k++) {
                c.t.splits = splits[k];
                cand_add(ts, &c, 0);
            }
            c.t.splits = 1; /* no split where the planner would split */
            cand_add(ts, &c, 0);
        }
    }
}

/* Stage 2: the planner twice, the two best alternatives of stage 1, and
 * each of them with the rotated loop and tail balancing flipped, with more
 * mask code (the instances differ in code layout only) and PDL off. */
void tune_stage2(tune_state *ts, const double *medians)
{
    int best[2] = {-1, -1};
    for (int i = 2; i < ts->n; i++) {
        if (best[0] < 0 || medians[i] < medians[best[0]]) best[1] = best[0], best[0] = i;
        else if (best[1] < 0 || medians[i] < medians[best[1]]) best[1] = i;
    }
    tune_cand base[3] = {ts->c[0]}; /* the planner, then the two best */
    int nb = 1;
    for (int k = 0; k < 2; k++)
        if (best[k] >= 0) base[nb++] = ts->c[best[k]];
    ts->n = 0;
    cand_add(ts, &base[0], 0);
    cand_add(ts, &base[0], 1);
    for (int k = 1; k < nb; k++) cand_add(ts, &base[k], 0);
    for (int k = 0; k < nb; k++) {
        for (int flip = 0; flip < 2; flip++) {
            tune_cand v = base[k];
            int32_t *f = flip == 0 ? &v.t.sm90_rotate : &v.t.sm90_tail;
            for (int val = 0; val <= 1; val++) {
                *f = val;
                cand_add(ts, &v, 0);
            }
        }
        for (int m = 1; m <= 2; m++) {
            tune_cand v = base[k];
            v.t.masks = m;
            cand_add(ts, &v, 0);
        }
        tune_cand v = base[k];
        v.t.pdl = 0;
        cand_add(ts, &v, 0);
    }
}

/* ---- graphs and timing ------------------------------------------------------------ */

/* The context that runs c, steered to c's plan. */
static fc_context *steer(tune_state *ts, const tune_cand *c, char *err, size_t n)
{
    if (c->own) return c->own;
    if (fc_context_set_cuda_path(ts->ctx, c->path) || fc_context_set_tuning(ts->ctx, &c->t)) {
        snprintf(err, n, "%s", fc_last_error(ts->ctx));
        return NULL;
    }
    return ts->ctx;
}

/* The candidate's plan, run once: every output element written and within
 * a loose distance of the planner's output (ref, same dtype). */
static int cand_check(tune_state *ts, tune_cand *c, const void *ref, char *err, size_t n)
{
    cli_exec *e = ts->e;
    fc_context *ctx = steer(ts, c, err, n);
    if (!ctx || cli_exec_poison(e, err, n) || cli_exec_run(ctx, e, NULL, err, n) != FC_OK ||
        cli_exec_fetch(e, err, n))
        return -1;
    if (!ref) return 0;
    const kit_gate g = kit_gate_for(kit_out_dtype(&e->c->s));
    kit_metrics m;
    kit_compare(e->c, e->c->out, NULL, ref, NULL, &g, &m);
    /* 1% relative L2: far above rounding, far below a wrong kernel */
    if (m.unwritten || m.nonfinite || !(m.rel_l2 <= 0.01)) {
        snprintf(err, n, "%s: against the planner's output %lld unwritten, %lld non-finite, relative L2 %.3g", c->name,
                 (long long)m.unwritten, (long long)m.nonfinite, m.rel_l2);
        return -1;
    }
    return 0;
}

static int capture(tune_state *ts, tune_cand *c, char *err, size_t n)
{
    cli_exec *e = ts->e;
    fc_context *ctx = steer(ts, c, err, n);
    if (!ctx || cli_cuda_capture_begin(e->stream, err, n)) return -1;
    for (int i = 0; i < ts->calls; i++)
        if (cli_exec_call(ctx, e, NULL) != FC_OK) {
            snprintf(err, n, "%s: %s", c->name, fc_last_error(ctx));
            cli_cuda_capture_end(e->stream, 0, &c->graph, err + strlen(err), n - strlen(err));
            return -1;
        }
    return cli_cuda_capture_end(e->stream, 1, &c->graph, err, n);
}

void tune_release(tune_state *ts)
{
    for (int i = 0; i < ts->n; i++) {
        cli_cuda_graph_destroy(ts->c[i].graph);
        ts->c[i].graph = NULL;
    }
}

/* One replay of g, timed: microseconds per call. */
static int replay(tune_state *ts, void *g, cli_cuda_timer *tm, double *us, char *err, size_t n)
{
    float ms = 0;
    if (cli_cuda_timer_start(tm, ts->e->stream, err, n) || cli_cuda_graph_launch(g, ts->e->stream, err, n) ||
        cli_cuda_timer_stop(tm, ts->e->stream, &ms, err, n))
        return -1;
    *us = ms * 1e3 / ts->calls;
    return 0;
}

/* Check and capture every candidate (a refused or wrong one is dropped),
 * then time them in `rounds` interleaved rounds, each starting one
 * candidate later; medians[i] per call. */
int tune_measure(tune_state *ts, const void *ref, int rounds, double *medians, char *err, size_t n)
{
    int kept = 0;
    for (int i = 0; i < ts->n; i++) {
        char why[400];
        tune_cand c = ts->c[i];
        if (cand_check(ts, &c, i ? ref : NULL, why, sizeof why) || capture(ts, &c, why, sizeof why)) {
            if (i < 2) { /* the planner itself */
                snprintf(err, n, "%s", why);
                ts->n = kept;
                return -1;
            }
            fprintf(stderr, "flashcore tune: %s: candidate dropped: %s\n", ts->shape, why);
            continue;
        }
        ts->c[kept++] = c;
    }
    ts->n = kept;
    cli_cuda_timer tm = {0};
    double *us = malloc((size_t)ts->n * rounds * sizeof(double));
    if (!us || cli_cuda_timer_create(&tm, err, n)) {
        if (!us) snprintf(err, n, "out of memory");
        free(us);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < ts->n && !rc; i++) /* the first replay uploads the graph */
        rc = cli_cuda_graph_launch(ts->c[i].graph, ts->e->stream, err, n);
    for (int r = 0; r < rounds && !rc; r++)
        for (int j = 0; j < ts->n && !rc; j++) {
            const int i = (j + r) % ts->n;
            rc = replay(ts, ts->c[i].graph, &tm, &us[i * rounds + r], err, n);
        }
    for (int i = 0; i < ts->n && !rc; i++) medians[i] = kit_percentile(&us[i * rounds], rounds, 50.0);
    cli_cuda_timer_destroy(&tm);
    free(us);
    return rc;
}
