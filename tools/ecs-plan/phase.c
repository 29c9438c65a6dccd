/* phase.c - ecs-plan's measurements of a layout as it runs: the routings
 * ecs-run --bench computes (recorded through the local experts), and the
 * expert phase of one MoE layer with the layout's real workers, replaying
 * them (measure.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arch.h"
#include "coordinator/dispatch/dispatch.h"
#include "coordinator/sampler/sampler.h"
#include "kernels/moe/moe.h"
#include "tools/ecs-plan/measure.h"

/* ---- the routings of ecs-run --bench ---- */

typedef struct {
    model_experts_local_t *loc;
    meas_trace_t *t;
    bool full;
} rec_ctx_t;

static ecs_err_t rec_submit(void *ctx, int tag, int layer, int n_tok, const float *x, int k,
                            const int32_t *ids, const float *w)
{
    rec_ctx_t *r = ctx;
    meas_trace_t *t = r->t;
    const size_t n = (size_t)n_tok * (size_t)k;
    if (t->n < t->cap && t->n_ids + n <= t->cap_ids) {
        t->layer[t->n] = layer;
        t->rows[t->n] = n_tok;
        t->off[t->n] = t->n_ids;
        memcpy(t->ids + t->n_ids, ids, n * sizeof *ids);
        t->n_ids += n;
        t->n++;
    } else {
        r->full = true;
    }
    return model_experts_local_ops.submit(r->loc, tag, layer, n_tok, x, k, ids, w);
}

static ecs_err_t rec_wait(void *ctx, int tag, int layer, float *out)
{
    return model_experts_local_ops.wait(((rec_ctx_t *)ctx)->loc, tag, layer, out);
}

static const model_experts_ops rec_ops = {rec_submit, rec_wait, 1};

void meas_trace_free(meas_trace_t *t)
{
    free(t->layer);
    free(t->rows);
    free(t->off);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

int meas_trace_next(const meas_trace_t *t, int rows, int *cursor)
{
    for (int tries = 0; t && t->n > 0 && tries < t->n; tries++) {
        const int j = (*cursor)++ % t->n;
        if (t->rows[j] == rows)
            return j;
    }
    return -1;
}

static int greedy(model_ctx_t *c, int32_t first, int n, float *logits, int V)
{
    int32_t id = first;
    for (int i = 0; i < n; i++) {
        if (model_eval(c, &id, 1, logits, false) != ECS_OK)
            return -1;
        id = sampler_argmax(logits, V);
    }
    return 0;
}

int meas_trace(model_t *m, int pp, int tg, meas_trace_t *t)
{
    const arch_hparams_t *hp = model_hparams(m);
    const int V = model_n_vocab(m), n_moe = hp->n_layer - hp->n_layer_dense;
    const int k = hp->n_expert_used;
    memset(t, 0, sizeof *t);
    t->k = k;
    t->cap = n_moe * (PLAN_STEP_ROWS + 2 * tg) + 1;
    t->cap_ids = (size_t)n_moe * (size_t)(pp + 2 * tg) * (size_t)k;
    t->layer = malloc((size_t)t->cap * sizeof *t->layer);
    t->rows = malloc((size_t)t->cap * sizeof *t->rows);
    t->off = malloc((size_t)t->cap * sizeof *t->off);
    t->ids = malloc(t->cap_ids * sizeof *t->ids);
    int32_t *toks = malloc((size_t)(pp > 0 ? pp : 1) * sizeof *toks);
    float *logits = malloc((size_t)V * sizeof *logits);
    rec_ctx_t r = {NULL, t, false};
    model_ctx_t *c = NULL;
    int rc = -1;
    if (!t->layer || !t->rows || !t->off || !t->ids || !toks || !logits ||
        model_experts_local_new(m, model_threadpool(m), &r.loc) != ECS_OK ||
        model_ctx_new(m, pp + tg + 8, 0, &c) != ECS_OK)
        goto done;
    /* ecs-run --bench's prompt: xorshift64 from seed 1234 */
    uint64_t s = 1234 * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < pp; i++)
        toks[i] = (int32_t)(meas_rnd(&s) % (uint64_t)V);
    model_set_experts(m, &rec_ops, &r);
    if (pp > 0 && (model_eval(c, toks, pp, logits, false) != ECS_OK ||
                   greedy(c, sampler_argmax(logits, V), tg, logits, V)))
        goto done;
    model_ctx_reset(c);
    if (greedy(c, pp > 0 ? toks[0] : 0, tg, logits, V) || r.full)
        goto done;
    rc = 0;
done:
    model_set_experts(m, NULL, NULL);
    model_ctx_free(c);
    model_experts_local_free(r.loc);
    free(toks);
    free(logits);
    if (rc)
        meas_trace_free(t);
    return rc;
}

/* ---- the expert phase with real workers ---- */

/* The shared experts of every MoE layer as a one-expert kmoe on the
 * model's threads: the work the coordinator does between submit and wait. */
typedef struct {
    kmoe_t *km; /* NULL: the model has no shared experts */
    kmoe_expert_t *ex;
    int32_t *ids;
} shexp_t;

static void shexp_free(shexp_t *sh)
{
    kmoe_free(sh->km);
    free(sh->ex);
    free(sh->ids);
    memset(sh, 0, sizeof *sh);
}

static int shexp_new(model_t *m, shexp_t *sh)
{
    const arch_hparams_t *hp = model_hparams(m);
    const model_weights_t *w = model_weights(m);
    const int L = hp->n_layer;
    memset(sh, 0, sizeof *sh);
    if (hp->n_ff_shexp <= 0)
        return 0;
    const kmoe_expert_t **layers = calloc((size_t)L, sizeof *layers);
    sh->ex = calloc((size_t)L, sizeof *sh->ex);
    sh->ids = calloc(PLAN_STEP_ROWS, sizeof *sh->ids); /* expert 0 for every row */
    int rc = -1;
    if (!layers || !sh->ex || !sh->ids)
        goto done;
    for (int l = 0; l < L; l++) {
        const model_layer_t *ly = &w->layers[l];
        if (!ly->moe || ly->gate_shexp.nrows == 0)
            continue;
        sh->ex[l] = (kmoe_expert_t){ly->gate_shexp, ly->up_shexp, ly->down_shexp};
        layers[l] = &sh->ex[l];
    }
    kmoe_shape_t shape = {.n_embd = hp->n_embd, .n_ff_exp = hp->n_ff_shexp, .n_expert = 1,
                          .k = 1, .max_rows = PLAN_STEP_ROWS};
    rc = kmoe_new(&shape, layers, L, model_threadpool(m), &sh->km) == ECS_OK ? 0 : -1;
done:
    free(layers); /* kmoe_new copied the list; sh->ex must outlive km */
    if (rc)
        shexp_free(sh);
    return rc;
}

static ecs_err_t shexp_run(shexp_t *sh, int layer, int rows, const float *x)
{
    if (!sh->km || !sh->ex[layer].gate.nrows)
        return ECS_OK;
    ecs_err_t rc = kmoe_prepare(sh->km, layer, rows, x, rows, NULL, sh->ids);
    if (rc == ECS_OK)
        kmoe_compute(sh->km);
    return rc;
}

/* The coordinator's own work between two MoE layers, as CPU time: every
 * thread of its pool busy until the deadline. */
static void spin_until(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    const double end = *(const double *)arg;
    while (meas_now() < end)
        ;
}

int meas_phase(model_t *m, int n_workers, int threads, int replication, const char *worker_repack,
               double gap_dec_s, double gap_pp_s, const meas_trace_t *tr, bool quick,
               meas_pages_t *pg, meas_phase_t *o)
{
    const arch_hparams_t *hp = model_hparams(m);
    const int L = hp->n_layer, X = hp->n_expert, k = hp->n_expert_used, E = hp->n_embd;
    const int R = PLAN_STEP_ROWS;
    memset(o, 0, sizeof *o);
    o->n_workers = n_workers, o->threads = threads;
    const int n_moe = L - hp->n_layer_dense;
    /* calls per size: a few rounds over the MoE layers, at least 48 decode
     * and 6 prompt calls (medians: other sessions share the cores) */
    const int rounds_dec = (48 + n_moe - 1) / n_moe, rounds_pp = (6 + n_moe - 1) / n_moe;
    const int calls[2] = {(quick ? 1 : rounds_dec) * n_moe, (quick ? 1 : rounds_pp) * n_moe};
    const int max_calls = calls[0] > calls[1] ? calls[0] : calls[1];
    float *x = malloc((size_t)R * (size_t)E * sizeof *x);
    float *out = malloc((size_t)R * (size_t)E * sizeof *out);
    float *wts = malloc((size_t)R * (size_t)k * sizeof *wts);
    int32_t *row = malloc((size_t)R * (size_t)k * sizeof *row);
    int32_t *ids = malloc((size_t)R * (size_t)k * sizeof *ids);
    double *v = malloc((size_t)max_calls * 5 * sizeof *v);
    shexp_t sh = {0};
    dispatch_t *d = NULL;
    int rc = -1;
    if (!x || !out || !wts || !row || !ids || !v || n_moe <= 0 || X > 4096 || k > 64 ||
        shexp_new(m, &sh))
        goto done;
    dispatch_opts_t dopt = {.spawn_workers = n_workers, .worker_threads = threads,
                            .replication = replication, .worker_repack = worker_repack,
                            .quiet = true};
    /* room in the page cache for the workers' copies before they map
     * (and read) them; once they are up, those copies read in: a timing
     * of cold copies would time the disk */
    if (pg)
        meas_pages_before_start(m, pg, replication, &o->pages);
    if (dispatch_start(m, &dopt, &d) != ECS_OK)
        goto done;
    if (pg && meas_pages_warm(m, d, &o->pages)) {
        ecs_error(ECS_ERR_IO, "the workers' decode copies could not be listed or read");
        goto done;
    }
    uint64_t s = 0xF00Dull * 0x9E3779B97F4A7C15ull + (uint64_t)n_workers;
    for (size_t i = 0; i < (size_t)R * (size_t)E; i++)
        x[i] = (float)((int)(meas_rnd(&s) % 2001) - 1000) * 1e-3f;
    for (int i = 0; i < R * k; i++)
        wts[i] = 1.0f / (float)k;
    for (int size = 0; size < 2; size++) {
        const int rows = size ? R : 1;
        /* one warm-up round over the layers (first touches, the workers'
         * caches), untimed */
        int ti = 0; /* the trace's next call of these rows */
        for (int c = -n_moe; c < calls[size]; c++) {
            int layer = hp->n_layer_dense + (c + n_moe) % n_moe;
            const int32_t *use = ids;
            const int j = meas_trace_next(tr, rows, &ti);
            if (j >= 0) { /* replay the model's routing */
                layer = tr->layer[j];
                use = tr->ids + tr->off[j];
            } else {
                int touched;
                (void)meas_routing(&s, rows, k, X, X, row, ids, &touched);
            }
            double end = meas_now() + (size ? gap_pp_s : gap_dec_s);
            ecs_threadpool_run(model_threadpool(m), spin_until, &end);
            dispatch_stats_t a, b;
            dispatch_stats(d, &a);
            const double t0 = meas_now();
            if (dispatch_experts_ops.submit(d, 0, layer, rows, x, k, use, wts) != ECS_OK)
                goto done;
            const double t1 = meas_now();
            if (shexp_run(&sh, layer, rows, x) != ECS_OK)
                goto done;
            const double t2 = meas_now();
            if (dispatch_experts_ops.wait(d, 0, layer, out) != ECS_OK)
                goto done;
            const double t3 = meas_now();
            dispatch_stats(d, &b);
            if (c < 0)
                continue;
            double *r = v + (size_t)c * 5;
            r[0] = t3 - t0;
            r[1] = (double)(b.ns_rtt_max - a.ns_rtt_max) * 1e-9;
            r[2] = (double)(b.ns_compute_of_max - a.ns_compute_of_max) * 1e-9;
            r[3] = t2 - t1;
            r[4] = r[1] - r[2];
        }
        double col[5][512];
        const int n = calls[size] < 512 ? calls[size] : 512;
        for (int j = 0; j < 5; j++)
            for (int c = 0; c < n; c++)
                col[j][c] = v[(size_t)c * 5 + (size_t)j];
        double med[5];
        for (int j = 0; j < 5; j++)
            med[j] = meas_quantile(col[j], n, 0.5);
        if (size == 0) {
            o->calls_dec = n;
            o->dec_phase_s = med[0], o->dec_rtt_s = med[1], o->dec_compute_s = med[2];
            o->dec_shexp_s = med[3], o->dec_handoff_s = med[4];
        } else {
            o->calls_pp = n;
            o->pp_phase_s = med[0], o->pp_rtt_s = med[1], o->pp_compute_s = med[2];
            o->pp_shexp_s = med[3], o->pp_handoff_s = med[4];
        }
    }
    if (pg)
        meas_pages_after(m, pg, &o->pages);
    rc = 0;
done:
    meas_files_free(&o->pages.files);
    if (rc)
        fprintf(stderr, "ecs-plan: the expert phase with %d workers: %s\n", n_workers,
                ecs_errmsg());
    dispatch_free(d);
    shexp_free(&sh);
    free(x);
    free(out);
    free(wts);
    free(row);
    free(ids);
    free(v);
    return rc;
}
