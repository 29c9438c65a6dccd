/* phase.c - ecs-plan's measurements of a layout as it runs: the routings
 * ecs-run --bench computes (recorded through the local experts), and the
 * expert phase of one MoE layer with the layout's real workers, timed
 * inside the model's own steps (measure.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arch.h"
#include "coordinator/dispatch/dispatch.h"
#include "coordinator/sampler/sampler.h"
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

static const model_experts_ops rec_ops = {rec_submit, rec_wait, 1, NULL};

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

/* ecs-run --bench's prompt: xorshift64 from seed 1234 */
static void bench_prompt(const model_t *m, int pp, int32_t *toks)
{
    uint64_t s = 1234 * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < pp; i++)
        toks[i] = (int32_t)(meas_rnd(&s) % (uint64_t)model_n_vocab(m));
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
    bench_prompt(m, pp, toks);
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

/* ---- the expert phase with real workers, inside the model's own steps ---- */

/* A backend around the dispatcher that times each MoE layer's expert
 * phase: submit's start to the end of wait (the calls out, the shared
 * experts computed meanwhile, the answers summed), with the dispatcher's
 * figures of the slowest call. Only the calls of the step being timed
 * count (mode), and of a prompt step only those of its `pp_rows` rows
 * (its last layer takes one row: forward.c). */
enum { PH_SKIP, PH_DEC, PH_PP };

typedef struct {
    dispatch_t *d;
    int mode, pp_rows, rows;
    double t_sub, t_sub_end, t_wait;
    dispatch_stats_t s0;
    /* per mode (PH_DEC, PH_PP): sums of phase, rtt, compute, shared part */
    double sum[3][4];
    int n[3];
} phase_ctx_t;

static ecs_err_t ph_submit(void *ctx, int tag, int layer, int n_tok, const float *x, int k,
                           const int32_t *ids, const float *w)
{
    phase_ctx_t *p = ctx;
    dispatch_stats(p->d, &p->s0);
    p->rows = n_tok;
    p->t_sub = meas_now();
    const ecs_err_t rc = dispatch_experts_ops.submit(p->d, tag, layer, n_tok, x, k, ids, w);
    p->t_sub_end = meas_now();
    return rc;
}

static ecs_err_t ph_wait(void *ctx, int tag, int layer, float *out)
{
    phase_ctx_t *p = ctx;
    p->t_wait = meas_now();
    const ecs_err_t rc = dispatch_experts_ops.wait(p->d, tag, layer, out);
    const double t1 = meas_now();
    const int m = p->mode;
    if (rc == ECS_OK && (m == PH_DEC || (m == PH_PP && p->rows == p->pp_rows))) {
        dispatch_stats_t s1;
        dispatch_stats(p->d, &s1);
        p->sum[m][0] += t1 - p->t_sub;
        p->sum[m][1] += (double)(s1.ns_rtt_max - p->s0.ns_rtt_max) * 1e-9;
        p->sum[m][2] += (double)(s1.ns_compute_of_max - p->s0.ns_compute_of_max) * 1e-9;
        p->sum[m][3] += p->t_wait - p->t_sub_end;
        p->n[m]++;
    }
    return rc;
}

/* the shared experts go where the layout's runs put them (on the worker
 * that takes a decode call, --shared-experts auto): inside the phase */
static bool ph_took_shared(void *ctx, int tag, float *sh)
{
    return dispatch_experts_ops.took_shared(((phase_ctx_t *)ctx)->d, tag, sh);
}

/* one submit out at a time (the planner runs no micro-batches): the
 * timestamps above belong to that one */
static const model_experts_ops ph_ops = {ph_submit, ph_wait, 1, ph_took_shared};

int meas_phase(model_t *m, model_t *coord, int n_workers, int threads, int replication,
               const char *worker_repack, int pp, int tg, bool quick, meas_pages_t *pg,
               meas_phase_t *o)
{
    const int V = model_n_vocab(coord);
    memset(o, 0, sizeof *o);
    o->n_workers = n_workers, o->threads = threads;
    o->pp_rows = pp < PLAN_STEP_ROWS ? pp : PLAN_STEP_ROWS;
    int32_t *toks = malloc((size_t)(pp > 0 ? pp : 1) * sizeof *toks);
    float *logits = malloc((size_t)V * sizeof *logits);
    phase_ctx_t p = {0};
    model_ctx_t *c = NULL;
    dispatch_t *d = NULL;
    int rc = -1;
    if (!toks || !logits || pp < 1 || tg < 1)
        goto done;
    dispatch_opts_t dopt = {.spawn_workers = n_workers, .worker_threads = threads,
                            .replication = replication, .worker_repack = worker_repack,
                            .quiet = true};
    /* room in the page cache for the workers' copies before they map
     * (and read) them; once they are up, those copies read in: a timing
     * of cold copies would time the disk */
    if (pg)
        meas_pages_before_start(m, pg, meas_copies(n_workers, replication), &o->pages);
    if (dispatch_start(coord, &dopt, &d) != ECS_OK)
        goto done;
    if (pg && meas_pages_warm(m, d, &o->pages)) {
        ecs_error(ECS_ERR_IO, "the workers' decode copies could not be listed or read");
        goto done;
    }
    if (model_ctx_new(coord, pp + tg + 8, 0, &c) != ECS_OK)
        goto done;
    bench_prompt(coord, pp, toks);
    p.d = d;
    p.pp_rows = o->pp_rows;
    model_set_experts(coord, &ph_ops, &p);
    /* what ecs-run --bench runs: a warm-up (the prompt, a few tokens),
     * then per round the prompt, tg tokens after it and tg tokens from an
     * empty context; the prompt's first PLAN_STEP_ROWS rows are one step */
    p.mode = PH_SKIP;
    if (model_eval(c, toks, o->pp_rows, logits, false) != ECS_OK ||
        greedy(c, sampler_argmax(logits, V), 4, logits, V))
        goto done;
    double dec_wall = 0, pp_wall = 0;
    int dec_tok = 0, pp_steps = 0;
    for (int r = 0; r < (quick ? 1 : 2); r++) {
        model_ctx_reset(c);
        p.mode = PH_PP;
        double t0 = meas_now();
        if (model_eval(c, toks, o->pp_rows, logits, false) != ECS_OK)
            goto done;
        pp_wall += meas_now() - t0;
        pp_steps++;
        p.mode = PH_DEC;
        t0 = meas_now();
        if (greedy(c, sampler_argmax(logits, V), tg, logits, V))
            goto done;
        model_ctx_reset(c);
        if (greedy(c, toks[0], tg, logits, V))
            goto done;
        dec_wall += meas_now() - t0;
        dec_tok += 2 * tg;
        p.mode = PH_SKIP;
    }
    if (!p.n[PH_DEC] || !p.n[PH_PP]) {
        ecs_error(ECS_ERR_INTERNAL, "no expert calls of the steps timed");
        goto done;
    }
    const double nd = p.n[PH_DEC], np = p.n[PH_PP];
    o->calls_dec = p.n[PH_DEC], o->calls_pp = p.n[PH_PP];
    o->dec_phase_s = p.sum[PH_DEC][0] / nd, o->dec_rtt_s = p.sum[PH_DEC][1] / nd;
    o->dec_compute_s = p.sum[PH_DEC][2] / nd, o->dec_shexp_s = p.sum[PH_DEC][3] / nd;
    o->dec_handoff_s = o->dec_rtt_s - o->dec_compute_s;
    o->pp_phase_s = p.sum[PH_PP][0] / np, o->pp_rtt_s = p.sum[PH_PP][1] / np;
    o->pp_compute_s = p.sum[PH_PP][2] / np, o->pp_shexp_s = p.sum[PH_PP][3] / np;
    o->pp_handoff_s = o->pp_rtt_s - o->pp_compute_s;
    /* the same steps' time outside the expert phases (the coordinator's
     * own work with its experts out: printed beside what the prediction
     * takes for it, the null backend's) */
    o->dec_outside_s = (dec_wall - p.sum[PH_DEC][0]) / dec_tok;
    o->pp_outside_s = (pp_wall - p.sum[PH_PP][0]) / pp_steps;
    if (pg)
        meas_pages_after(m, pg, &o->pages);
    rc = 0;
done:
    meas_files_free(&o->pages.files);
    if (rc)
        fprintf(stderr, "ecs-plan: the expert phase with %d workers: %s\n", n_workers,
                ecs_errmsg());
    model_ctx_free(c);
    dispatch_free(d); /* m back to its local experts */
    free(toks);
    free(logits);
    return rc;
}
