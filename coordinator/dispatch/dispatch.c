/* dispatch.c - the pooled dispatcher: a model_experts_ops backend over the
 * expert workers.
 *
 * submit() groups the step's (row, slot) pairs by expert, gives each
 * expert to one of its holders (fewest calls in flight, then fewest rows
 * given in this call, then round robin) and sends every chosen worker
 * exactly one call: the rows it needs, each once, and its entries grouped
 * by expert. The model computes the shared experts meanwhile. wait()
 * collects one f32 row per pair and sums each row's slots in slot order
 * with kmoe_sum, the local backend's code: the same bits as the local
 * backend whatever the placement. Everything is sized at start-up; a
 * step allocates nothing here but the transport's messages, into which
 * the rows are gathered directly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/dispatch/dispatch_int.h"
#include "kernels/moe/moe.h"

ecs_err_t dispatch_buffers_new(dispatch_t *d)
{
    const size_t nb = MODEL_MAX_BATCH, k = (size_t)d->hp.n_expert_used;
    const size_t X = (size_t)d->hp.n_expert, E = (size_t)d->hp.n_embd, W = (size_t)d->n_workers;
    d->calls = calloc(W, sizeof *d->calls);
    d->call_worker = calloc(W, sizeof *d->call_worker);
    d->call_first = calloc(W + 1, sizeof *d->call_first);
    d->pair_of = calloc(nb * k, sizeof *d->pair_of);
    d->order = calloc(nb * k, sizeof *d->order);
    d->start = calloc(X + 1, sizeof *d->start);
    d->choice = calloc(X, sizeof *d->choice);
    d->rows_now = calloc(W, sizeof *d->rows_now);
    d->local = calloc(nb, sizeof *d->local);
    d->c_experts = calloc(X, sizeof *d->c_experts);
    d->c_counts = calloc(X, sizeof *d->c_counts);
    d->c_rows = calloc(nb * k, sizeof *d->c_rows);
    d->c_slots = calloc(nb * k, sizeof *d->c_slots);
    d->d = calloc(nb * k * E, sizeof *d->d);
    d->ident = calloc(nb * k, sizeof *d->ident);
    if (!d->calls || !d->call_worker || !d->call_first || !d->pair_of || !d->order || !d->start ||
        !d->choice || !d->rows_now || !d->local || !d->c_experts || !d->c_counts || !d->c_rows ||
        !d->c_slots || !d->d || !d->ident)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory for the call buffers");
    for (size_t i = 0; i < nb * k; i++)
        d->ident[i] = (int32_t)i;
    return ECS_OK;
}

void dispatch_buffers_free(dispatch_t *d)
{
    void *bufs[] = {d->calls,     d->call_worker, d->call_first, d->pair_of,   d->order,
                    d->start,     d->choice,      d->rows_now,   d->local,     d->c_experts,
                    d->c_counts,  d->c_rows,      d->c_slots,    d->d,
                    d->ident};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

/* Counting sort of the pairs by expert: order lists pair indices t*k+j,
 * by expert, ascending t within one. */
static void group_pairs(dispatch_t *d, int n_pairs, const int32_t *ids)
{
    const int X = d->hp.n_expert;
    memset(d->start, 0, ((size_t)X + 1) * sizeof *d->start);
    for (int p = 0; p < n_pairs; p++)
        d->start[ids[p] + 1]++;
    for (int e = 0; e < X; e++)
        d->start[e + 1] += d->start[e];
    for (int p = 0; p < n_pairs; p++)
        d->order[d->start[ids[p]]++] = p;
    for (int e = X; e > 0; e--)
        d->start[e] = d->start[e - 1];
    d->start[0] = 0;
}

/* The holder of (layer, e) that gets its rows in this call. */
static int choose(dispatch_t *d, int layer, int e)
{
    const int16_t *h;
    const int n = placement_holders(d->pl, layer, e, &h);
    int best = -1;
    uint32_t best_fl = 0;
    for (int i = 0; i < n; i++) {
        const int wi = h[(i + (int)(d->rr % (unsigned)n)) % n];
        if (d->w[wi].peer < 0)
            continue;
        const uint32_t fl = mux_peer_inflight(d->mux, d->w[wi].peer);
        if (best < 0 || fl < best_fl || (fl == best_fl && d->rows_now[wi] < d->rows_now[best])) {
            best = wi;
            best_fl = fl;
        }
    }
    return best;
}

/* Builds and sends worker wi's call from the experts chosen for it: the
 * rows are gathered straight into the transport's message. */
static ecs_err_t send_worker(dispatch_t *d, int wi, const float *x)
{
    const int X = d->hp.n_expert, k = d->k;
    const size_t E = (size_t)d->hp.n_embd;
    for (int t = 0; t < d->n_tok; t++)
        d->local[t] = -1;
    for (int e = 0; e < X; e++)
        if (d->choice[e] == wi)
            for (int q = d->start[e]; q < d->start[e + 1]; q++)
                d->local[d->order[q] / k] = 0;
    uint32_t n_rows = 0;
    for (int t = 0; t < d->n_tok; t++)
        if (d->local[t] == 0)
            d->local[t] = (int32_t)n_rows++;
    size_t n_exp = 0, n_ent = 0;
    int32_t *pairs = d->pair_of + d->call_first[d->n_calls];
    for (int e = 0; e < X; e++) {
        if (d->choice[e] != wi)
            continue;
        d->c_experts[n_exp] = (uint32_t)e;
        d->c_counts[n_exp++] = (uint32_t)(d->start[e + 1] - d->start[e]);
        for (int q = d->start[e]; q < d->start[e + 1]; q++, n_ent++) {
            const int p = d->order[q];
            d->c_rows[n_ent] = (uint32_t)d->local[p / k];
            d->c_slots[n_ent] = (uint32_t)(p % k);
            pairs[n_ent] = p;
        }
    }
    wire_call_t c = {.layer = (uint32_t)d->layer, .n_rows = n_rows, .n_embd = (uint32_t)E,
                     .dtype = ECS_TYPE_F32, .k = (uint32_t)k, .n_experts = n_exp,
                     .experts = d->c_experts, .expert_counts = d->c_counts, .n_entries = n_ent,
                     .row_index = d->c_rows, .slot = d->c_slots, .result_dtype = ECS_TYPE_F32,
                     .payload_bytes = n_rows * E * sizeof(float)};
    mux_call_t *call;
    void *payload;
    ecs_err_t rc = mux_call_prepare(d->mux, d->w[wi].peer, &c, &payload, &call);
    if (rc == ECS_OK) {
        for (int t = 0; t < d->n_tok; t++)
            if (d->local[t] >= 0)
                memcpy((float *)payload + (size_t)d->local[t] * E, x + (size_t)t * E,
                       E * sizeof(float));
        d->calls[d->n_calls] = call; /* released with the others, even if the send fails */
        d->call_worker[d->n_calls] = wi;
        d->call_first[d->n_calls + 1] = d->call_first[d->n_calls] + (int)n_ent;
        d->n_calls++;
        rc = mux_call_send(d->mux, call);
    }
    if (rc != ECS_OK)
        return ecs_error(rc, "dispatch: layer %d to worker %s: %s", d->layer, d->w[wi].id,
                         ecs_errmsg());
    d->w[wi].calls++;
    d->w[wi].rows += n_rows;
    return ECS_OK;
}

static void release_calls(dispatch_t *d)
{
    for (int i = 0; i < d->n_calls; i++)
        mux_call_release(d->calls[i]);
    d->n_calls = 0;
}

static ecs_err_t dispatch_submit(void *ctx, int layer, int n_tok, const float *x, int k,
                                 const int32_t *ids, const float *w)
{
    dispatch_t *d = ctx;
    release_calls(d);
    const int X = d->hp.n_expert;
    if (layer < 0 || layer >= d->hp.n_layer || !arch_layer_moe(&d->hp, layer) || n_tok < 1 ||
        n_tok > MODEL_MAX_BATCH || k != d->hp.n_expert_used)
        return ecs_error(ECS_ERR_INVAL, "dispatch: layer %d, %d rows x %d slots", layer, n_tok,
                         k);
    for (int p = 0; p < n_tok * k; p++)
        if (ids[p] < 0 || ids[p] >= X)
            return ecs_error(ECS_ERR_RANGE, "dispatch: expert id %d out of range", ids[p]);
    d->layer = layer;
    d->n_tok = n_tok;
    d->k = k;
    d->wts = w;
    group_pairs(d, n_tok * k, ids);
    memset(d->rows_now, 0, (size_t)d->n_workers * sizeof *d->rows_now);
    d->rr++;
    for (int e = 0; e < X; e++) {
        d->choice[e] = -1;
        const int cnt = d->start[e + 1] - d->start[e];
        if (!cnt)
            continue;
        const int wi = choose(d, layer, e);
        if (wi < 0)
            return ecs_error(ECS_ERR_NOTFOUND, "dispatch: layer %d expert %d has no live holder",
                             layer, e);
        d->choice[e] = wi;
        d->rows_now[wi] += cnt;
    }
    d->call_first[0] = 0;
    int busiest = 0, used = 0;
    for (int wi = 0; wi < d->n_workers; wi++) {
        if (!d->rows_now[wi])
            continue;
        used++;
        busiest = d->rows_now[wi] > busiest ? d->rows_now[wi] : busiest;
        ecs_err_t rc = send_worker(d, wi, x);
        if (rc != ECS_OK)
            return rc;
    }
    pthread_mutex_lock(&d->lock);
    d->layer_calls++;
    d->step_rows += (uint64_t)n_tok;
    d->imbalance_sum += (double)busiest * d->n_workers / (double)(n_tok * k);
    pthread_mutex_unlock(&d->lock);
    (void)used;
    return ECS_OK;
}

static ecs_err_t dispatch_wait(void *ctx, int layer, float *out)
{
    dispatch_t *d = ctx;
    if (layer != d->layer)
        return ecs_error(ECS_ERR_INVAL, "dispatch: wait for layer %d, submitted %d", layer,
                         d->layer);
    const int timeout = d->o.call_timeout_ms > 0 ? d->o.call_timeout_ms : 120000;
    const int left = mux_wait(d->mux, d->calls, d->n_calls, timeout);
    ecs_err_t rc = ECS_OK;
    const size_t E = (size_t)d->hp.n_embd, row = E * sizeof(float);
    for (int i = 0; i < d->n_calls && rc == ECS_OK; i++) {
        const dispatch_worker_t *wk = &d->w[d->call_worker[i]];
        const mux_result_t *r = mux_call_result(d->calls[i]);
        const int n_ent = d->call_first[i + 1] - d->call_first[i];
        if (!r) {
            rc = ecs_error(ECS_ERR_IO, "dispatch: layer %d: no answer from worker %s in %d ms "
                           "(%d of %d calls missing)", layer, wk->id, timeout, left, d->n_calls);
        } else if (r->err != ECS_OK || r->status != WIRE_ST_OK) {
            rc = ecs_error(r->err != ECS_OK ? r->err : ECS_ERR_INTERNAL,
                           "dispatch: layer %d: worker %s: %s%s%s", layer, wk->id,
                           r->err != ECS_OK ? ecs_errname(r->err) : wire_status_name(r->status),
                           r->message[0] ? ": " : "", r->message);
        } else if ((int)r->n_entries != n_ent || r->n_embd != E) {
            rc = ecs_error(ECS_ERR_FORMAT, "dispatch: layer %d: worker %s sent %u rows of %u, "
                           "want %d of %zu", layer, wk->id, r->n_entries, r->n_embd, n_ent, E);
        } else {
            const int32_t *pairs = d->pair_of + d->call_first[i];
            for (int q = 0; q < n_ent; q++)
                memcpy(d->d + (size_t)pairs[q] * E, (const char *)r->payload + (size_t)q * row,
                       row);
        }
    }
    release_calls(d);
    if (rc != ECS_OK)
        return rc;
    kmoe_sum(model_threadpool(d->m), d->n_tok, d->k, (int)E, d->d, d->ident, d->wts, out);
    return ECS_OK;
}

const model_experts_ops dispatch_experts_ops = {dispatch_submit, dispatch_wait};

const placement_t *dispatch_placement(const dispatch_t *d) { return d->pl; }

void dispatch_stats(const dispatch_t *d, dispatch_stats_t *s)
{
    pthread_mutex_lock((pthread_mutex_t *)&d->lock);
    s->n_workers = d->n_workers;
    s->layer_calls = d->layer_calls;
    s->imbalance = d->layer_calls ? d->imbalance_sum / (double)d->layer_calls : 0;
    pthread_mutex_unlock((pthread_mutex_t *)&d->lock);
}

ecs_err_t dispatch_worker_stats(const dispatch_t *d, int wi, dispatch_worker_stats_t *out)
{
    if (wi < 0 || wi >= d->n_workers)
        return ecs_error(ECS_ERR_RANGE, "dispatch: no worker %d", wi);
    const dispatch_worker_t *w = &d->w[wi];
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", w->id);
    out->pid = w->pid;
    out->threads = w->threads;
    out->mem_budget = w->mem_budget;
    out->bytes_held = w->bytes_held;
    out->pairs_held = placement_held(d->pl, wi);
    out->calls = w->calls;
    out->rows = w->rows;
    if (w->peer >= 0) {
        mux_peer_stats_t ps;
        if (mux_peer_stats(d->mux, w->peer, &ps) == ECS_OK) {
            out->calls_in_flight = ps.calls_in_flight;
            out->rows_in_flight = ps.rows_in_flight;
            out->bytes_out = ps.bytes_out;
            out->bytes_in = ps.bytes_in;
            out->latency_p50_us = mux_latency_quantile(ps.latency_us, 0.5);
            out->latency_p99_us = mux_latency_quantile(ps.latency_us, 0.99);
        }
    }
    return ECS_OK;
}

void dispatch_print_stats(const dispatch_t *d, FILE *f)
{
    dispatch_stats_t st;
    dispatch_stats(d, &st);
    const int moe_layers = d->hp.n_layer - d->hp.n_layer_dense;
    const double tokens = moe_layers > 0 ? (double)d->step_rows / moe_layers : 0;
    uint64_t out = 0, in = 0;
    fprintf(f, "dispatch: %d workers, %llu layer calls, %.0f tokens, imbalance (busiest / mean "
            "rows) %.2f\n", st.n_workers, (unsigned long long)st.layer_calls, tokens,
            st.imbalance);
    for (int i = 0; i < d->n_workers; i++) {
        dispatch_worker_stats_t w;
        if (dispatch_worker_stats(d, i, &w) != ECS_OK)
            continue;
        out += w.bytes_out;
        in += w.bytes_in;
        fprintf(f, "  worker %-12s pid %-7d %3d threads %5d experts  %8llu calls %10llu rows  "
                "out %8.1f MB in %8.1f MB  latency p50 %llu us p99 %llu us\n", w.id, w.pid,
                w.threads, w.pairs_held, (unsigned long long)w.calls,
                (unsigned long long)w.rows, w.bytes_out / 1e6, w.bytes_in / 1e6,
                (unsigned long long)w.latency_p50_us, (unsigned long long)w.latency_p99_us);
    }
    if (tokens > 0)
        fprintf(f, "  per token: %.1f KB to the workers, %.1f KB back\n", out / tokens / 1e3,
                in / tokens / 1e3);
}
