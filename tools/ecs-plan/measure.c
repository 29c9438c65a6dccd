/* measure.c - ecs-plan's measurements: every input of the planner's
 * arithmetic is timed here, on this machine, under its present load (the
 * figures it predicts are taken under the same load). Medians: other
 * sessions share the cores (see quantile()). */
#include "tools/ecs-plan/measure.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/arch.h"
#include "coordinator/dispatch/dispatch.h"
#include "coordinator/sampler/sampler.h"
#include "kernels/moe/moe.h"
#include "proto/mux.h"

double meas_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile of v[0..n) (sorts v). ecs-plan takes medians: the
 * typical figure under the machine's present load, which it estimates
 * alongside (meas_expert_t.cpu_share) and which bench_plan.sh's measured
 * runs see too. */
static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[(int)(q * (n - 1))];
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* ---- the link: a mux server with empty compute in a child ---- */

static mux_server_t *g_srv;
static void on_term(int sig)
{
    (void)sig;
    if (g_srv)
        mux_server_stop(g_srv);
}

static void on_call(void *ctx, const wire_call_t *c, mux_reply_t *r)
{
    (void)ctx;
    (void)c;
    (void)r; /* the reply's rows go back as allocated: only the transport is timed */
}

int meas_server_start(const char *bind, meas_server_t *s)
{
    int p[2];
    if (pipe(p))
        return -1;
    s->pid = fork();
    if (s->pid == 0) {
        close(p[0]);
        mux_server_opts_t o = {.data_bind = bind};
        mux_server_ops_t ops = {.on_call = on_call};
        if (mux_server_new(&o, &ops, NULL, &g_srv) != ECS_OK)
            _exit(1);
        char ep[256];
        snprintf(ep, sizeof ep, "%s", mux_server_endpoint(g_srv));
        signal(SIGTERM, on_term);
        if (write(p[1], ep, sizeof ep) != (ssize_t)sizeof ep)
            _exit(1);
        mux_server_run(g_srv);
        mux_server_free(g_srv);
        _exit(0);
    }
    close(p[1]);
    const int ok = s->pid > 0 && read(p[0], s->endpoint, 256) == 256;
    close(p[0]);
    if (!ok) {
        if (s->pid > 0)
            meas_server_stop(s);
        s->pid = 0;
        return -1;
    }
    return 0;
}

void meas_server_stop(meas_server_t *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGTERM);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    if (!strncmp(s->endpoint, "ipc://", 6))
        unlink(s->endpoint + 6);
}

/* One call shaped like an expert call: `rows` rows, each through `slots`
 * experts (expert j takes slot j of every row). */
static int one_call(mux_t *m, int peer, const float *x, int rows, int slots, int n_embd,
                    uint32_t *idx, uint32_t *slot, double *secs)
{
    uint32_t experts[64], counts[64];
    for (int j = 0; j < slots; j++) {
        experts[j] = (uint32_t)j;
        counts[j] = (uint32_t)rows;
        for (int i = 0; i < rows; i++) {
            idx[j * rows + i] = (uint32_t)i;
            slot[j * rows + i] = (uint32_t)j;
        }
    }
    wire_call_t c = {.layer = 1, .n_rows = (uint32_t)rows, .n_embd = (uint32_t)n_embd,
                     .dtype = ECS_TYPE_F32, .k = (uint32_t)slots, .n_experts = (size_t)slots,
                     .experts = experts, .expert_counts = counts,
                     .n_entries = (size_t)rows * (size_t)slots, .row_index = idx, .slot = slot,
                     .result_dtype = ECS_TYPE_F32, .payload = x,
                     .payload_bytes = (size_t)rows * (size_t)n_embd * sizeof(float)};
    const double t0 = meas_now();
    mux_call_t *call;
    if (mux_submit(m, peer, &c, &call) != ECS_OK)
        return -1;
    const int left = mux_wait(m, &call, 1, 30000);
    const mux_result_t *r = mux_call_result(call);
    const int ok = left == 0 && r && r->err == ECS_OK && r->status == WIRE_ST_OK;
    mux_call_release(call);
    *secs = meas_now() - t0;
    return ok ? 0 : -1;
}

int meas_link(const char *endpoint, int n_embd, int k, bool quick, meas_link_t *o)
{
    /* the expert calls' sizes: one decode row to a worker with one or all
     * k of its experts, and prompt steps of 32 .. 512 rows */
    const int rows[MEAS_LINK_POINTS] = {1, 1, 8, 32, 128, 512};
    const int mult[MEAS_LINK_POINTS] = {1, k, k, k, k, k};
    const int iters[MEAS_LINK_POINTS] = {300, 300, 100, 40, 12, 6};
    memset(o, 0, sizeof *o);
    const size_t max_ent = (size_t)512 * (size_t)k;
    float *x = aligned_alloc(64, (size_t)512 * (size_t)n_embd * sizeof(float));
    uint32_t *idx = malloc(max_ent * sizeof *idx), *slot = malloc(max_ent * sizeof *slot);
    double *t = malloc(300 * sizeof *t);
    mux_t *m = NULL;
    int peer, rc = -1;
    if (!x || !idx || !slot || !t || mux_new(NULL, &m) != ECS_OK ||
        mux_peer_connect(m, endpoint, &peer) != ECS_OK)
        goto done;
    for (size_t i = 0; i < (size_t)512 * (size_t)n_embd; i++)
        x[i] = (float)(i % 97);
    for (int p = 0; p < MEAS_LINK_POINTS; p++) {
        const int n = quick ? (iters[p] + 3) / 4 : iters[p];
        const int ent = rows[p] * mult[p];
        for (int i = -2; i < n; i++) { /* two warm-up calls (the connection) */
            double s;
            if (one_call(m, peer, x, rows[p], mult[p], n_embd, idx, slot, &s))
                goto done;
            if (i >= 0)
                t[i] = s;
        }
        o->rows[p] = rows[p];
        o->entries[p] = ent;
        o->bytes[p] = (double)(rows[p] + ent) * n_embd * sizeof(float);
        o->med_s[p] = quantile(t, n, 0.5);
    }
    o->n = MEAS_LINK_POINTS;
    /* beta from a line through all points; alpha from the smallest call,
     * which is what a decode step sends */
    double X[MEAS_LINK_POINTS * 2], c[2];
    for (int p = 0; p < o->n; p++) {
        X[2 * p] = 1;
        X[2 * p + 1] = o->bytes[p];
    }
    if (plan_lsq(X, o->med_s, o->n, 2, c) != ECS_OK)
        goto done;
    o->beta_s = c[1] > 0 ? c[1] : 0;
    o->alpha_s = o->med_s[0] - o->beta_s * o->bytes[0];
    rc = 0;
done:
    mux_free(m);
    free(x);
    free(idx);
    free(slot);
    free(t);
    return rc;
}

/* ---- the coordinator's share: a null expert backend ---- */

typedef struct {
    int n_tok, n_embd;
    long sleep_ns; /* wait() sleeps this long, as for a worker's reply */
    double waited; /* seconds spent in wait() */
} null_ctx_t;

static ecs_err_t null_submit(void *ctx, int tag, int layer, int n_tok, const float *x, int k,
                             const int32_t *ids, const float *w)
{
    (void)tag, (void)layer, (void)x, (void)k, (void)ids, (void)w;
    ((null_ctx_t *)ctx)->n_tok = n_tok;
    return ECS_OK;
}

static ecs_err_t null_wait(void *ctx, int tag, int layer, float *out)
{
    (void)tag, (void)layer;
    null_ctx_t *c = ctx;
    const double t0 = meas_now();
    if (c->sleep_ns > 0)
        nanosleep(&(struct timespec){0, c->sleep_ns}, NULL);
    memset(out, 0, (size_t)c->n_tok * (size_t)c->n_embd * sizeof(float));
    c->waited += meas_now() - t0;
    return ECS_OK;
}

static const model_experts_ops null_ops = {null_submit, null_wait, 1};

/* Shared experts of the steps since the last reset: in the non-local path
 * the FFN_DOWN phase is submit + shared experts + wait, and a null backend
 * takes no time. */
static void shared_part(model_t *m, double *wall, double *cpu)
{
    model_prof_t p[MODEL_PH_COUNT];
    model_profile(m, p);
    *wall = p[MODEL_PH_FFN_DOWN].wall_s;
    *cpu = p[MODEL_PH_FFN_DOWN].cpu_s;
    model_profile_reset(m);
}

static int decode(model_ctx_t *c, const int32_t *toks, int n, float *logits)
{
    for (int i = 0; i < n; i++)
        if (model_eval(c, &toks[i], 1, logits, false) != ECS_OK)
            return -1;
    return 0;
}

int meas_coord(model_t *m, int pp, int tg, int reps, long sleep_ns, meas_coord_t *o)
{
    const int V = model_n_vocab(m), B = 8;
    null_ctx_t nc = {0, model_hparams(m)->n_embd, sleep_ns, 0};
    model_ctx_t *c = NULL, *bc[8] = {0};
    int32_t *toks = malloc((size_t)(pp + tg) * sizeof *toks);
    float *logits = malloc((size_t)V * B * sizeof *logits);
    double *v = calloc((size_t)reps * 6, sizeof *v);
    int rc = -1;
    memset(o, 0, sizeof *o);
    o->pp = pp, o->tg = tg, o->batch = B;
    if (!toks || !logits || !v || model_ctx_new(m, pp + tg + 8, 0, &c) != ECS_OK)
        goto done;
    for (int i = 0; i < B; i++)
        if (model_ctx_new(m, tg + 8, 0, &bc[i]) != ECS_OK)
            goto done;
    uint64_t s = 1234 * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < pp + tg; i++)
        toks[i] = (int32_t)(rnd(&s) % (uint64_t)V);
    model_set_experts(m, &null_ops, &nc);
    /* warm-up, untimed, as ecs-run --bench does */
    if (model_eval(c, toks, pp, logits, false) != ECS_OK || decode(c, toks, 4, logits))
        goto done;
    double sh_w = 0, sh_c = 0, cpu_w = 0, cpu_c = 0;
    for (int r = 0; r < reps; r++) {
        double t0, w, cp;
        model_ctx_reset(c);
        shared_part(m, &w, &cp);
        t0 = meas_now() + (nc.waited = 0);
        if (model_eval(c, toks, pp, logits, false) != ECS_OK)
            goto done;
        v[r * 6 + 0] = meas_now() - t0 - nc.waited;
        shared_part(m, &w, &cp);
        w -= nc.waited; /* the FFN_DOWN phase holds wait() too */
        v[r * 6 + 3] = w;
        cpu_w += w, cpu_c += cp;
        t0 = meas_now() + (nc.waited = 0);
        if (decode(c, toks + pp, tg, logits))
            goto done;
        v[r * 6 + 2] = (meas_now() - t0 - nc.waited) / tg;
        shared_part(m, &w, &cp);
        model_ctx_reset(c);
        t0 = meas_now() + (nc.waited = 0);
        if (decode(c, toks, tg, logits))
            goto done;
        v[r * 6 + 1] = (meas_now() - t0 - nc.waited) / tg;
        shared_part(m, &w, &cp);
        w -= nc.waited;
        v[r * 6 + 4] = w / tg;
        sh_w += w, sh_c += cp;
        /* B sequences decoding together: the cost of more rows per step */
        for (int i = 0; i < B; i++)
            model_ctx_reset(bc[i]);
        model_row_t rows[8];
        t0 = meas_now() + (nc.waited = 0);
        for (int step = 0; step < tg; step++) {
            for (int i = 0; i < B; i++)
                rows[i] = (model_row_t){bc[i], toks[(step * B + i) % (pp + tg)], true};
            if (model_eval_batch(m, rows, B, logits) != ECS_OK)
                goto done;
        }
        v[r * 6 + 5] = (meas_now() - t0 - nc.waited) / tg;
        shared_part(m, &w, &cp);
    }
    double col[6][64];
    for (int j = 0; j < 6; j++) {
        for (int r = 0; r < reps && r < 64; r++)
            col[j][r] = v[r * 6 + j];
    }
    const int n = reps < 64 ? reps : 64;
    o->pp_s = quantile(col[0], n, 0.5);
    o->tg0_s = quantile(col[1], n, 0.5);
    o->tgd_s = quantile(col[2], n, 0.5);
    o->sh_pp_s = quantile(col[3], n, 0.5);
    o->sh_tg_s = quantile(col[4], n, 0.5);
    o->batch_s = quantile(col[5], n, 0.5);
    o->sh_cpu_ratio = cpu_w + sh_w > 0 ? (cpu_c + sh_c) / (cpu_w + sh_w) : 0;
    rc = 0;
done:
    model_set_experts(m, NULL, NULL);
    for (int i = 0; i < B; i++)
        model_ctx_free(bc[i]);
    model_ctx_free(c);
    free(toks);
    free(logits);
    free(v);
    return rc;
}

/* ---- the experts' share: kmoe on random routings ---- */

/* k distinct random experts for each of n rows, those >= limit dropped:
 * returns the pair count; ids[p], row[p] for the kept pairs. */
static int routing(uint64_t *s, int n, int k, int n_expert, int limit, int32_t *row,
                   int32_t *ids, int *touched)
{
    int p = 0;
    char seen[4096] = {0};
    *touched = 0;
    for (int t = 0; t < n; t++) {
        int32_t pick[64];
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = (int)(rnd(s) % (uint64_t)n_expert);
                dup = 0;
                for (int q = 0; q < j; q++)
                    dup |= pick[q] == e;
            } while (dup);
            pick[j] = e;
            if (e >= limit)
                continue;
            row[p] = t;
            ids[p++] = e;
            if (!seen[e]) {
                seen[e] = 1;
                (*touched)++;
            }
        }
    }
    return p;
}

/* x0 + xe e + xp p through the points, each weighted by 1/time (relative
 * errors: the one-row calls matter as much as the big ones); a coefficient
 * that comes out negative (noise) is dropped and the rest refitted. */
static int fit_nonneg(const meas_expert_t *o, double c[3])
{
    bool use[3] = {true, true, true};
    for (int round = 0; round < 3; round++) {
        double Xm[MEAS_EXPERT_CALLS * 3], y[MEAS_EXPERT_CALLS], cc[3];
        int np = 0, map[3];
        for (int j = 0; j < 3; j++)
            if (use[j])
                map[np++] = j;
        for (int i = 0; i < o->n; i++) {
            const double wgt = 1.0 / o->wall_s[i], v[3] = {1, o->experts[i], o->pairs[i]};
            for (int j = 0; j < np; j++)
                Xm[i * np + j] = v[map[j]] * wgt;
            y[i] = 1.0;
        }
        if (plan_lsq(Xm, y, o->n, np, cc) != ECS_OK)
            return -1;
        c[0] = c[1] = c[2] = 0;
        int worst = -1;
        for (int j = 0; j < np; j++) {
            c[map[j]] = cc[j];
            if (cc[j] < 0 && (worst < 0 || cc[j] < c[worst]))
                worst = map[j];
        }
        if (worst < 0)
            return 0;
        use[worst] = false;
        c[worst] = 0;
    }
    return -1;
}

int meas_experts(model_t *m, int threads, const meas_trace_t *tr, bool quick, meas_expert_t *o)
{
    const arch_hparams_t *hp = model_hparams(m);
    const model_weights_t *w = model_weights(m);
    const int L = hp->n_layer, X = hp->n_expert, k = hp->n_expert_used, E = hp->n_embd;
    const int R = PLAN_STEP_ROWS;
    memset(o, 0, sizeof *o);
    if (X > 4096 || k > 64)
        return -1;
    kmoe_expert_t *ex = calloc((size_t)L * (size_t)X, sizeof *ex);
    const kmoe_expert_t **layers = calloc((size_t)L, sizeof *layers);
    int *moe = malloc((size_t)L * sizeof *moe), n_moe = 0;
    float *x = malloc((size_t)R * (size_t)E * sizeof *x);
    int32_t *row = malloc((size_t)R * (size_t)k * sizeof *row),
            *ids = malloc((size_t)R * (size_t)k * sizeof *ids);
    ecs_threadpool_t *tp = NULL;
    kmoe_t *km = NULL;
    int rc = -1;
    if (!ex || !layers || !moe || !x || !row || !ids ||
        ecs_threadpool_create(threads, &tp) != ECS_OK)
        goto done;
    for (int l = 0; l < L; l++) {
        const model_layer_t *ly = &w->layers[l];
        if (!ly->moe)
            continue;
        kmoe_split(&ly->gate_exps, &ly->up_exps, &ly->down_exps, X, ex + (size_t)l * X);
        layers[l] = ex + (size_t)l * X;
        moe[n_moe++] = l;
    }
    kmoe_shape_t shape = {.n_embd = E, .n_ff_exp = hp->n_ff_exp, .n_expert = X, .k = k,
                          .max_rows = R};
    if (n_moe == 0 || kmoe_new(&shape, layers, L, tp, &km) != ECS_OK)
        goto done;
    uint64_t s = 0x5EEDull * 0x9E3779B97F4A7C15ull + (uint64_t)threads;
    for (size_t i = 0; i < (size_t)R * (size_t)E; i++)
        x[i] = (float)((int)(rnd(&s) % 2001) - 1000) * 1e-3f;
    /* (rows, expert limit, calls): one decode row through 1 or k experts,
     * a full prompt step through all experts or through a third of them
     * (a worker's share) */
    const int kinds[4][3] = {{1, 0, 24}, {1, X, 24}, {R, X, 5}, {R, (X + 2) / 3, 5}};
    double cpu = 0, wall = 0;
    int li = 0, ti = 0;
    for (int kind = 0; kind < 4; kind++) {
        const int calls = quick ? (kinds[kind][2] + 2) / 3 : kinds[kind][2];
        double t[24];
        int ne = 0, np = 0;
        for (int c = -1; c < calls; c++) { /* the first call warms up */
            int layer = moe[li++ % n_moe];
            int touched, p;
            const int j = kinds[kind][1] == X ? meas_trace_next(tr, kinds[kind][0], &ti) : -1;
            if (kind == 0) { /* one expert */
                row[0] = 0;
                ids[0] = (int32_t)(rnd(&s) % (uint64_t)X);
                p = touched = 1;
            } else if (j >= 0) { /* all k slots of the rows: the model's routing */
                char seen[4096] = {0};
                layer = tr->layer[j];
                p = kinds[kind][0] * k;
                touched = 0;
                for (int q = 0; q < p; q++) {
                    row[q] = q / k;
                    ids[q] = tr->ids[tr->off[j] + (size_t)q];
                    touched += !seen[ids[q]];
                    seen[ids[q]] = 1;
                }
            } else {
                p = routing(&s, kinds[kind][0], k, X, kinds[kind][1], row, ids, &touched);
            }
            const double w0 = meas_now(), c0 = cpu_now();
            if (kmoe_prepare(km, layer, kinds[kind][0], x, p, row, ids) != ECS_OK)
                goto done;
            kmoe_compute(km);
            const double dw = meas_now() - w0, dc = cpu_now() - c0;
            if (c < 0)
                continue;
            t[c] = dw;
            ne += touched, np += p;
            wall += dw, cpu += dc;
        }
        o->experts[o->n] = (ne + calls / 2) / calls;
        o->pairs[o->n] = (np + calls / 2) / calls;
        o->wall_s[o->n] = quantile(t, calls, 0.5);
        o->n++;
    }
    /* x0 + xe e + xp p through the four points, each weighted by 1/time
     * (relative errors: the one-row calls matter as much as the big ones);
     * x0 is what one call costs beyond its work (the pool's wake-ups) */
    double c[3];
    if (fit_nonneg(o, c))
        goto done;
    o->cost = (plan_expert_cost_t){c[0], c[1], c[2], threads};
    o->cpu_share = wall > 0 ? cpu / wall / threads : 0;
    rc = 0;
done:
    kmoe_free(km);
    ecs_threadpool_destroy(tp);
    free(ex);
    free(layers);
    free(moe);
    free(x);
    free(row);
    free(ids);
    return rc;
}

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
        toks[i] = (int32_t)(rnd(&s) % (uint64_t)V);
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

int meas_phase(model_t *m, int n_workers, int threads, const char *worker_repack,
               double gap_dec_s, double gap_pp_s, const meas_trace_t *tr, bool quick,
               meas_phase_t *o)
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
                            .worker_repack = worker_repack, .quiet = true};
    if (dispatch_start(m, &dopt, &d) != ECS_OK)
        goto done;
    uint64_t s = 0xF00Dull * 0x9E3779B97F4A7C15ull + (uint64_t)n_workers;
    for (size_t i = 0; i < (size_t)R * (size_t)E; i++)
        x[i] = (float)((int)(rnd(&s) % 2001) - 1000) * 1e-3f;
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
                (void)routing(&s, rows, k, X, X, row, ids, &touched);
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
            med[j] = quantile(col[j], n, 0.5);
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
    rc = 0;
done:
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
