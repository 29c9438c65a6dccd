/* measure.c - ecs-plan's measurements: every input of the planner's
 * arithmetic is timed here, on this machine, under its present load (the
 * figures it predicts are taken under the same load). Medians: other
 * sessions share the cores (see meas_quantile()). */
#include "tools/ecs-plan/measure.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/arch.h"
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
double meas_quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[(int)(q * (n - 1))];
}

uint64_t meas_rnd(uint64_t *s)
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
        o->med_s[p] = meas_quantile(t, n, 0.5);
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

static const model_experts_ops null_ops = {null_submit, null_wait, 1, NULL};

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
        toks[i] = (int32_t)(meas_rnd(&s) % (uint64_t)V);
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
    o->pp_s = meas_quantile(col[0], n, 0.5);
    o->tg0_s = meas_quantile(col[1], n, 0.5);
    o->tgd_s = meas_quantile(col[2], n, 0.5);
    o->sh_pp_s = meas_quantile(col[3], n, 0.5);
    o->sh_tg_s = meas_quantile(col[4], n, 0.5);
    o->batch_s = meas_quantile(col[5], n, 0.5);
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
int meas_routing(uint64_t *s, int n, int k, int n_expert, int limit, int32_t *row,
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
                e = (int)(meas_rnd(s) % (uint64_t)n_expert);
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
        x[i] = (float)((int)(meas_rnd(&s) % 2001) - 1000) * 1e-3f;
    /* (rows, expert limit, calls): one decode row through 1 or k experts,
     * a full prompt step through all experts or through a third of them
     * (a worker's share) */
    const int kinds[4][3] = {{1, 0, 96}, {1, X, 96}, {R, X, 5}, {R, (X + 2) / 3, 5}};
    double cpu = 0, wall = 0;
    int li = 0, ti = 0;
    for (int kind = 0; kind < 4; kind++) {
        const int calls = quick ? (kinds[kind][2] + 2) / 3 : kinds[kind][2];
        double t[96];
        int ne = 0, np = 0;
        for (int c = -1; c < calls; c++) { /* the first call warms up */
            int layer = moe[li++ % n_moe];
            int touched, p;
            const int j = kinds[kind][1] == X ? meas_trace_next(tr, kinds[kind][0], &ti) : -1;
            if (kind == 0) { /* one expert */
                row[0] = 0;
                ids[0] = (int32_t)(meas_rnd(&s) % (uint64_t)X);
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
                p = meas_routing(&s, kinds[kind][0], k, X, kinds[kind][1], row, ids, &touched);
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
        o->wall_s[o->n] = meas_quantile(t, calls, 0.5);
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
