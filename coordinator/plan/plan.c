/* plan.c - the capacity planner's arithmetic: coordinator time plus, per
 * MoE layer, the routed-expert phase of drawn routings, with every process
 * time-sharing the same cores (plan.h gives the model). */
#include "coordinator/plan/plan.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

double plan_expert_time(const plan_expert_cost_t *c, int experts, int pairs)
{
    if (pairs <= 0)
        return 0;
    return c->x0 + c->xe * experts + c->xp * pairs;
}

double plan_touched(int n_expert, int k, int rows)
{
    if (n_expert <= 0 || k <= 0 || rows <= 0)
        return 0;
    const double q = 1.0 - (double)k / n_expert;
    return n_expert * (1.0 - pow(q < 0 ? 0 : q, rows));
}

double plan_overlap(double a_s, double f_s, double busy_a, double busy_f, int q, int cores)
{
    if (q < 1)
        q = 1;
    const double serial = q * (a_s + f_s);
    const double pipe = a_s + f_s + (q - 1) * (a_s > f_s ? a_s : f_s);
    const double cpu = cores > 0 ? q * (a_s * busy_a + f_s * busy_f) / cores : 0;
    const double best = pipe > cpu ? pipe : cpu;
    return best < serial ? best : serial;
}

ecs_err_t plan_lsq(const double *x, const double *y, int n, int n_par, double *c)
{
    if (n_par < 1 || n_par > 4 || n < n_par)
        return ecs_error(ECS_ERR_INVAL, "plan: %d points for %d coefficients", n, n_par);
    double a[4][5] = {{0}};
    for (int i = 0; i < n; i++)
        for (int r = 0; r < n_par; r++) {
            for (int s = 0; s < n_par; s++)
                a[r][s] += x[i * n_par + r] * x[i * n_par + s];
            a[r][n_par] += x[i * n_par + r] * y[i];
        }
    double scale = 0;
    for (int r = 0; r < n_par; r++)
        scale = fabs(a[r][r]) > scale ? fabs(a[r][r]) : scale;
    for (int col = 0; col < n_par; col++) { /* Gauss-Jordan, partial pivoting */
        int piv = col;
        for (int r = col + 1; r < n_par; r++)
            if (fabs(a[r][col]) > fabs(a[piv][col]))
                piv = r;
        if (!(fabs(a[piv][col]) > 1e-12 * scale))
            return ecs_error(ECS_ERR_INVAL, "plan: the points do not determine coefficient %d",
                             col);
        for (int s = 0; s <= n_par; s++) {
            const double t = a[col][s];
            a[col][s] = a[piv][s];
            a[piv][s] = t;
        }
        for (int r = 0; r < n_par; r++) {
            if (r == col)
                continue;
            const double f = a[r][col] / a[col][col];
            for (int s = col; s <= n_par; s++)
                a[r][s] -= f * a[col][s];
        }
    }
    for (int r = 0; r < n_par; r++)
        c[r] = a[r][n_par] / a[r][r];
    return ECS_OK;
}

/* ---- one step ---- */

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

typedef struct {
    const plan_inputs_t *in;
    const plan_layout_t *l;
    int R;
    int count[PLAN_MAX_EXPERTS];   /* pairs per expert in the drawn call */
    int choice[PLAN_MAX_EXPERTS];  /* its holder */
    int rows_now[PLAN_MAX_WORKERS];
    int experts[PLAN_MAX_WORKERS];
    int rows[PLAN_MAX_WORKERS];    /* distinct rows sent */
    int stamp[PLAN_MAX_WORKERS];
    uint32_t rr;                   /* the dispatcher's rotation */
} sim_t;

static int holder(const sim_t *s, int layer, int e, int r)
{
    const plan_layout_t *l = s->l;
    if (!l->holders)
        return (e + r) % l->n_workers;
    return l->holders[((size_t)layer * (size_t)s->in->n_expert + (size_t)e) * (size_t)s->R +
                      (size_t)r];
}

/* Draws the routing of `rows` rows (k distinct experts each) into
 * s->count (and the per-worker distinct rows, when workers exist). */
static void draw(sim_t *s, uint64_t *seed, int rows, int32_t *row_ids)
{
    const int E = s->in->n_expert, k = s->in->k;
    memset(s->count, 0, (size_t)E * sizeof *s->count);
    for (int t = 0; t < rows; t++) {
        int32_t *ids = row_ids + (size_t)t * (size_t)k;
        for (int j = 0; j < k; j++) {
            int e;
            bool dup;
            do { /* k << E: rejection is cheap */
                e = (int)(rnd(seed) % (uint64_t)E);
                dup = false;
                for (int q = 0; q < j; q++)
                    dup |= ids[q] == e;
            } while (dup);
            ids[j] = e;
            s->count[e]++;
        }
    }
}

/* Gives each touched expert's rows to one holder, as dispatch_submit does:
 * the holder with the fewest rows so far in this call, ties by rotation. */
static void assign(sim_t *s, int layer)
{
    const int E = s->in->n_expert, R = s->R, N = s->l->n_workers;
    memset(s->rows_now, 0, (size_t)N * sizeof *s->rows_now);
    memset(s->experts, 0, (size_t)N * sizeof *s->experts);
    s->rr++;
    for (int e = 0; e < E; e++) {
        s->choice[e] = -1;
        if (!s->count[e])
            continue;
        int best = -1;
        for (int i = 0; i < R; i++) {
            const int wi = holder(s, layer, e, (int)((i + s->rr % (uint32_t)R) % (uint32_t)R));
            if (best < 0 || s->rows_now[wi] < s->rows_now[best])
                best = wi;
        }
        s->choice[e] = best;
        s->rows_now[best] += s->count[e];
        s->experts[best]++;
    }
}

static ecs_err_t check(const plan_inputs_t *in, const plan_layout_t *l)
{
    if (in->n_layer_moe < 0 || in->n_expert < 1 || in->n_expert > PLAN_MAX_EXPERTS || in->k < 1 ||
        in->k > in->n_expert || in->k > PLAN_MAX_K || in->n_embd < 1)
        return ecs_error(ECS_ERR_INVAL, "plan: bad shape (%d experts, k %d, n_embd %d)",
                         in->n_expert, in->k, in->n_embd);
    if (l->n_workers < 0 || l->n_workers > PLAN_MAX_WORKERS)
        return ecs_error(ECS_ERR_INVAL, "plan: %d workers (at most %d)", l->n_workers,
                         PLAN_MAX_WORKERS);
    if (l->cores < 1 || l->coord_threads < 1 || l->coord_threads > PLAN_MAX_THREADS)
        return ecs_error(ECS_ERR_INVAL, "plan: %d cores, %d coordinator threads", l->cores,
                         l->coord_threads);
    const int T = l->n_workers ? l->worker_threads : l->coord_threads;
    if (T < 1 || T > PLAN_MAX_THREADS)
        return ecs_error(ECS_ERR_INVAL, "plan: %d threads per worker", T);
    if (in->ex[T].xe <= 0 && in->ex[T].xp <= 0)
        return ecs_error(ECS_ERR_NOTFOUND, "plan: no expert costs measured for %d threads", T);
    if (l->n_workers &&
        (l->replication < 1 || l->replication > l->n_workers ||
         l->replication > PLAN_MAX_REPLICATION))
        return ecs_error(ECS_ERR_INVAL, "plan: replication %d with %d workers", l->replication,
                         l->n_workers);
    return ECS_OK;
}

/* What one runnable thread of ours gets of a core when n of ours run. */
static double speed(const plan_inputs_t *in, int cores, double n)
{
    const double v = cores / (in->ext_threads + n);
    return v < 1 ? v : 1;
}

/* One step of `rows` rows: coordinator time C (shared experts S of it)
 * plus the expert phases of every MoE layer, averaged over the draws. */
/* The layout's expert phase measured with its workers for a layer of r
 * rows (0: not measured). */
static double measured_phase(const plan_layout_t *l, int r)
{
    if (!l->n_workers)
        return 0;
    return r == 1 ? l->phase_dec_s : r == l->phase_pp_rows ? l->phase_pp_s : 0;
}

/* rows_all rows through every MoE layer but the last, which takes
 * rows_last (a prompt step computes its last layer only for the rows whose
 * logits it returns: forward.c) */
static ecs_err_t step(const plan_inputs_t *in, const plan_layout_t *l, int rows_all,
                      int rows_last, double C, double S, plan_pred_t *o)
{
    ecs_err_t rc = check(in, l);
    if (rc != ECS_OK)
        return rc;
    memset(o, 0, sizeof *o);
    const int N = l->n_workers, L = in->n_layer_moe, k = in->k;
    const int T = N ? l->worker_threads : l->coord_threads;
    const plan_expert_cost_t *xc = &in->ex[T];
    const double busy_w = xc->cpu_ratio > 0 ? xc->cpu_ratio : T;
    const double busy_c = in->coord_cpu_ratio > 0 ? in->coord_cpu_ratio : l->coord_threads;
    const double row_bytes = 4.0 * in->n_embd;
    const double act_bytes = in->act_row_bytes > 0 ? in->act_row_bytes : row_bytes;
    const int samples = l->samples > 0 ? l->samples : 64;
    sim_t *s = calloc(1, sizeof *s);
    int32_t *ids = malloc((size_t)rows_all * (size_t)k * sizeof *ids);
    if (!s || !ids) {
        free(s);
        free(ids);
        return ecs_error(ECS_ERR_NOMEM, "plan: out of memory");
    }
    s->in = in;
    s->l = l;
    s->R = N ? l->replication : 1;
    uint64_t seed = l->seed ? l->seed : 1;
    const double S_l = L > 0 ? S / L : 0;
    double phases = 0, links = 0, imb = 0, meas = 0;
    bool all_measured = true;
    for (int layer = 0; layer < L; layer++) {
        const int rows = layer == L - 1 ? rows_last : rows_all;
        const double mp = measured_phase(l, rows);
        all_measured &= mp > 0;
        meas += mp;
        for (int d = 0; d < samples; d++) {
            draw(s, &seed, rows, ids);
            if (!N) { /* local experts: their jobs join the shared experts'
                       * regions (forward.c), whose wake-ups C already holds:
                       * the work without the per-call cost */
                int touched = 0;
                for (int e = 0; e < in->n_expert; e++)
                    touched += s->count[e] > 0;
                phases += plan_expert_time(xc, touched, rows * k) - xc->x0;
                continue;
            }
            assign(s, layer);
            for (int i = 0; i < N; i++)
                s->rows[i] = 0, s->stamp[i] = -1;
            for (int t = 0; t < rows; t++)
                for (int j = 0; j < k; j++) {
                    const int wi = s->choice[ids[(size_t)t * (size_t)k + (size_t)j]];
                    if (s->stamp[wi] != t) {
                        s->stamp[wi] = t;
                        s->rows[wi]++;
                    }
                }
            /* CPU work in core-seconds (each time was measured with its
             * own threads running), over what the threads running now get */
            double crit = S_l, worst_link = 0, n_run = S_l > 0 ? busy_c : 0;
            double cpu = S_l * busy_c * speed(in, l->cores, busy_c);
            int busiest = 0;
            for (int i = 0; i < N; i++) {
                if (!s->rows_now[i])
                    continue;
                const double t = plan_expert_time(xc, s->experts[i], s->rows_now[i]);
                const double bo = s->rows[i] * act_bytes, bi = s->rows_now[i] * row_bytes;
                const double link = in->alpha_s + in->beta_s * (bo + bi);
                crit = link + t > crit ? link + t : crit;
                worst_link = link > worst_link ? link : worst_link;
                cpu += t * busy_w * speed(in, l->cores, busy_w);
                n_run += busy_w;
                o->busy_s[i] += t;
                o->pairs[i] += s->rows_now[i];
                o->bytes_out[i] += bo;
                o->bytes_in[i] += bi;
                busiest = s->rows_now[i] > busiest ? s->rows_now[i] : busiest;
            }
            cpu = n_run > 0 ? cpu / (n_run * speed(in, l->cores, n_run)) : 0;
            phases += crit > cpu ? crit : cpu;
            links += worst_link;
            imb += (double)busiest * N / ((double)rows * k);
        }
    }
    free(ids);
    free(s);
    const double per = 1.0 / samples;
    o->n_workers = N;
    o->coord_s = C;
    o->model_expert_s = phases * per;
    /* the layout's phase measured with its own workers, for these rows */
    o->expert_s = N && L > 0 && all_measured ? meas : o->model_expert_s;
    o->link_s = links * per;
    o->imbalance = N && L ? imb * per / L : 1;
    for (int i = 0; i < N; i++) {
        o->busy_s[i] *= per;
        o->pairs[i] *= per;
        o->bytes_out[i] *= per;
        o->bytes_in[i] *= per;
    }
    /* one process: C then the experts; workers: C less the shared experts,
     * which ran inside each layer's expert phase */
    o->step_s = N ? C - S + o->expert_s : C + o->expert_s;
    o->tok_s = o->step_s > 0 ? rows_all / o->step_s : 0;
    return ECS_OK;
}

ecs_err_t plan_decode(const plan_inputs_t *in, const plan_layout_t *l, plan_pred_t *out)
{
    const int b = l->batch > 0 ? l->batch : 1;
    if (b > PLAN_STEP_ROWS)
        return ecs_error(ECS_ERR_INVAL, "plan: %d rows in a decode step (at most %d)", b,
                         PLAN_STEP_ROWS);
    const double C = in->dec_s + (b - 1) * in->dec_row_s + (double)b * l->depth * in->dec_ctx_s;
    double S = b * in->shexp_pp_row_s;
    S = S > in->shexp_dec_s ? S : in->shexp_dec_s;
    return step(in, l, b, b, C, S, out);
}

ecs_err_t plan_prompt(const plan_inputs_t *in, const plan_layout_t *l, plan_pred_t *out)
{
    if (l->pp < 1)
        return ecs_error(ECS_ERR_INVAL, "plan: a prompt of %d tokens", l->pp);
    plan_pred_t part;
    memset(out, 0, sizeof *out);
    for (int done = 0; done < l->pp;) {
        const int r = l->pp - done < PLAN_STEP_ROWS ? l->pp - done : PLAN_STEP_ROWS;
        ecs_err_t rc = step(in, l, r, 1, r * in->pp_row_s, r * in->shexp_pp_row_s, &part);
        if (rc != ECS_OK)
            return rc;
        out->step_s += part.step_s;
        out->coord_s += part.coord_s;
        out->expert_s += part.expert_s;
        out->model_expert_s += part.model_expert_s;
        out->link_s += part.link_s;
        out->imbalance += part.imbalance * r / l->pp;
        out->n_workers = part.n_workers;
        for (int i = 0; i < part.n_workers; i++) {
            out->busy_s[i] += part.busy_s[i];
            out->pairs[i] += part.pairs[i];
            out->bytes_out[i] += part.bytes_out[i];
            out->bytes_in[i] += part.bytes_in[i];
        }
        done += r;
    }
    out->tok_s = out->step_s > 0 ? l->pp / out->step_s : 0;
    return ECS_OK;
}

int plan_pages_evict(const plan_pages_t *p)
{
    const double fill = PLAN_PAGES_FILL * (double)p->room;
    const double base = (double)p->need + (double)p->keep;
    int r = 0;
    if (base + (double)p->own_routed + (double)p->others <= fill)
        return 0;
    if (p->own_routed)
        r |= PLAN_EVICT_OWN;
    if (base + (double)p->others > fill && p->others)
        r |= PLAN_EVICT_OTHERS;
    if (base > fill)
        r |= PLAN_NO_ROOM;
    return r;
}

bool plan_phase_warm(double before, double after)
{
    /* NaN compares false: not warm */
    return before >= PLAN_WARM_MIN && after >= PLAN_WARM_MIN && before <= 1.0 && after <= 1.0;
}
