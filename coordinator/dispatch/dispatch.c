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
 * backend whatever the placement. A layer call per tag may be out at
 * once (the model's micro-batches, --micro-batches): each tag has its own
 * call state (dispatch_batch_t), and a placement change waits until no tag
 * is busy. Everything is sized at start-up; a
 * step allocates nothing here but the transport's messages, into which
 * the rows are gathered directly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator/dispatch/dispatch_int.h"
#include "kernels/cpu/cpu.h"
#include "kernels/moe/moe.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The type a layer's activation rows travel in to a worker taking
 * quantized rows (wire_act_type of its gate and up), F32: none. */
static uint32_t layer_act_type(const dispatch_t *d, int il)
{
    const gguf_tensor_t *g, *u;
    const gguf_file_t *f = model_gguf(d->m);
    if (d->o.wire_f32 || arch_exps_tensor(f, &d->hp, il, ARCH_EXPS_GATE, &g) != ECS_OK ||
        arch_exps_tensor(f, &d->hp, il, ARCH_EXPS_UP, &u) != ECS_OK)
        return ECS_TYPE_F32;
    return wire_act_type(g->type, u->type, (uint32_t)d->hp.n_embd);
}

/* Bytes of the widest quantized activation row (0: none travel so). */
static ecs_err_t act_types_new(dispatch_t *d, size_t *row)
{
    *row = 0;
    d->act_type = calloc((size_t)d->hp.n_layer, sizeof *d->act_type);
    if (!d->act_type)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
    for (int il = 0; il < d->hp.n_layer; il++) {
        d->act_type[il] = arch_layer_moe(&d->hp, il) ? layer_act_type(d, il) : ECS_TYPE_F32;
        if (d->act_type[il] != ECS_TYPE_F32) {
            const size_t r = wire_row_bytes(d->act_type[il], (uint32_t)d->hp.n_embd);
            *row = r > *row ? r : *row;
        }
    }
    return ECS_OK;
}

/* Worker wi's rows of this layer: their type and bytes per row; the rows
 * quantized once per submit for every worker that takes them. */
static const void *act_rows(dispatch_t *d, int wi, uint32_t *dtype, size_t *row)
{
    const uint32_t t = d->act_type[d->b->layer];
    const size_t E = (size_t)d->hp.n_embd;
    if (t == ECS_TYPE_F32 || !(atomic_load(&d->w[wi].caps) & WIRE_CAP_INPUT_Q8)) {
        *dtype = ECS_TYPE_F32;
        *row = E * sizeof(float);
        return d->b->x;
    }
    const gguf_tensor_t *g; /* found when act_type was set */
    if (!d->b->xq_done) {
        if (arch_exps_tensor(model_gguf(d->m), &d->hp, d->b->layer, ARCH_EXPS_GATE, &g) != ECS_OK) {
            *dtype = ECS_TYPE_F32;
            *row = E * sizeof(float);
            return d->b->x;
        }
        kcpu_quantize_rows(d->b->n_tok >= 8 ? model_threadpool(d->m) : NULL, g->type, d->b->x,
                           (int64_t)E, d->b->n_tok, (int64_t)E, d->b->xq);
        d->b->xq_done = true;
    }
    *dtype = t;
    *row = wire_row_bytes(t, (uint32_t)E);
    return d->b->xq;
}

/* A batch's buffers (the results' pages are touched only as far as its
 * rows go: a micro-batch's share). */
static ecs_err_t batch_new(dispatch_t *d, dispatch_batch_t *b, size_t xq_row)
{
    const size_t nb = MODEL_MAX_BATCH, k = (size_t)d->hp.n_expert_used;
    const size_t X = (size_t)d->hp.n_expert, E = (size_t)d->hp.n_embd;
    b->calls = calloc(X, sizeof *b->calls);
    b->call_worker = calloc(X, sizeof *b->call_worker);
    b->call_nent = calloc(X, sizeof *b->call_nent);
    b->call_t0 = calloc(X, sizeof *b->call_t0);
    b->pair_call = calloc(nb * k, sizeof *b->pair_call);
    b->pair_pos = calloc(nb * k, sizeof *b->pair_pos);
    b->exp_slot = calloc(X, sizeof *b->exp_slot);
    b->todo = calloc(X, sizeof *b->todo);
    b->order = calloc(nb * k, sizeof *b->order);
    b->start = calloc(X + 1, sizeof *b->start);
    b->d = calloc(nb * k * E, sizeof *b->d);
    b->xq = xq_row ? malloc(xq_row * nb) : NULL;
    if (!b->calls || !b->call_worker || !b->call_nent || !b->call_t0 || !b->pair_call ||
        !b->pair_pos || !b->exp_slot || !b->todo || !b->order || !b->start || !b->d ||
        (xq_row && !b->xq))
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory for the call buffers");
    for (size_t e = 0; e < X; e++)
        b->exp_slot[e] = -1;
    for (size_t i = 0; i < nb * k; i++)
        b->pair_call[i] = -1;
    return ECS_OK;
}

ecs_err_t dispatch_layers_new(dispatch_t *d)
{
    ecs_err_t rc = act_types_new(d, &d->xq_row);
    return rc != ECS_OK ? rc : dispatch_shared_new(d);
}

ecs_err_t dispatch_buffers_new(dispatch_t *d)
{
    const size_t nb = MODEL_MAX_BATCH, k = (size_t)d->hp.n_expert_used;
    const size_t X = (size_t)d->hp.n_expert, W = (size_t)d->n_workers;
    d->pairs_tmp = calloc(nb * k, sizeof *d->pairs_tmp);
    d->choice = calloc(X, sizeof *d->choice);
    d->rows_now = calloc(W, sizeof *d->rows_now);
    d->local = calloc(nb, sizeof *d->local);
    d->c_experts = calloc(X, sizeof *d->c_experts);
    d->c_counts = calloc(X, sizeof *d->c_counts);
    d->c_rows = calloc(nb * k, sizeof *d->c_rows);
    d->c_slots = calloc(nb * k, sizeof *d->c_slots);
    d->ident = calloc(nb * k, sizeof *d->ident);
    if (!d->pairs_tmp || !d->choice || !d->rows_now || !d->local || !d->c_experts ||
        !d->c_counts || !d->c_rows || !d->c_slots || !d->ident)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory for the call buffers");
    for (size_t i = 0; i < nb * k; i++)
        d->ident[i] = (int32_t)i;
    ecs_err_t rc = ECS_OK;
    for (int t = 0; t < MODEL_MAX_MICRO && rc == ECS_OK; t++)
        rc = batch_new(d, &d->bt[t], d->xq_row);
    d->share_threads = dispatch_share_threads(d);
    if (rc != ECS_OK)
        return rc;
    d->b = &d->bt[0];
    return ECS_OK;
}

void dispatch_buffers_free(dispatch_t *d)
{
    void *bufs[] = {d->pairs_tmp, d->choice, d->rows_now, d->local,   d->c_experts,
                    d->c_counts,  d->c_rows, d->c_slots,  d->ident,   d->act_type,
                    d->sh_layer};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    for (int t = 0; t < MODEL_MAX_MICRO; t++) {
        dispatch_batch_t *b = &d->bt[t];
        void *bb[] = {b->calls, b->call_worker, b->call_nent, b->call_t0, b->pair_call,
                      b->pair_pos, b->exp_slot, b->todo, b->order, b->start, b->d, b->xq};
        for (size_t i = 0; i < sizeof bb / sizeof bb[0]; i++)
            free(bb[i]);
    }
}

/* Counting sort of the pairs by expert: order lists pair indices t*k+j,
 * by expert, ascending t within one. */
static void group_pairs(dispatch_t *d, int n_pairs, const int32_t *ids)
{
    const int X = d->hp.n_expert;
    memset(d->b->start, 0, ((size_t)X + 1) * sizeof *d->b->start);
    for (int p = 0; p < n_pairs; p++)
        d->b->start[ids[p] + 1]++;
    for (int e = 0; e < X; e++)
        d->b->start[e + 1] += d->b->start[e];
    for (int p = 0; p < n_pairs; p++)
        d->b->order[d->b->start[ids[p]]++] = p;
    for (int e = X; e > 0; e--)
        d->b->start[e] = d->b->start[e - 1];
    d->b->start[0] = 0;
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
        const int peer = atomic_load(&d->w[wi].peer);
        if (atomic_load(&d->w[wi].state) != DW_LIVE || peer < 0)
            continue;
        const uint32_t fl = mux_peer_inflight(d->mux, peer);
        if (best < 0 || fl < best_fl || (fl == best_fl && d->rows_now[wi] < d->rows_now[best])) {
            best = wi;
            best_fl = fl;
        }
    }
    return best;
}

static int free_slot(const dispatch_t *d)
{
    for (int s = 0; s < d->hp.n_expert; s++)
        if (!d->b->calls[s])
            return s;
    return -1;
}

/* Builds and sends worker wi's call from the experts to send that were
 * chosen for it (shared: with the layer's shared experts on every row):
 * the rows are gathered straight into the transport's message. Those
 * experts are no longer to send, unless the worker died under us (then
 * they stay to send, and this is no error). */
static ecs_err_t send_worker(dispatch_t *d, int wi, bool shared)
{
    const int X = d->hp.n_expert, k = d->b->k;
    const size_t E = (size_t)d->hp.n_embd;
    uint32_t dtype;
    size_t row;
    const char *x = act_rows(d, wi, &dtype, &row);
    for (int t = 0; t < d->b->n_tok; t++)
        d->local[t] = shared ? 0 : -1;
    for (int e = 0; e < X; e++)
        if (d->b->todo[e] && d->choice[e] == wi)
            for (int q = d->b->start[e]; q < d->b->start[e + 1]; q++)
                d->local[d->b->order[q] / k] = 0;
    uint32_t n_rows = 0;
    for (int t = 0; t < d->b->n_tok; t++)
        if (d->local[t] == 0)
            d->local[t] = (int32_t)n_rows++;
    size_t n_exp = 0, n_ent = 0;
    for (int e = 0; e < X; e++) {
        if (!d->b->todo[e] || d->choice[e] != wi)
            continue;
        d->c_experts[n_exp] = (uint32_t)e;
        d->c_counts[n_exp++] = (uint32_t)(d->b->start[e + 1] - d->b->start[e]);
        for (int q = d->b->start[e]; q < d->b->start[e + 1]; q++, n_ent++) {
            const int p = d->b->order[q];
            d->c_rows[n_ent] = (uint32_t)d->local[p / k];
            d->c_slots[n_ent] = (uint32_t)(p % k);
            d->pairs_tmp[n_ent] = p;
        }
    }
    const int slot = free_slot(d);
    if (slot < 0)
        return ecs_error(ECS_ERR_INTERNAL, "dispatch: no free call slot");
    wire_call_t c = {.layer = (uint32_t)d->b->layer, .n_rows = n_rows, .n_embd = (uint32_t)E,
                     .dtype = dtype, .k = (uint32_t)k, .n_experts = n_exp,
                     .experts = d->c_experts, .expert_counts = d->c_counts, .n_entries = n_ent,
                     .row_index = d->c_rows, .slot = d->c_slots,
                     .result_dtype = d->o.wire_bf16 && (atomic_load(&d->w[wi].caps) &
                                                        WIRE_CAP_RESULT_BF16)
                                         ? ECS_TYPE_BF16
                                         : ECS_TYPE_F32,
                     .threads = dispatch_call_threads(d, wi), .shared = shared,
                     .payload_bytes = n_rows * row};
    mux_call_t *call;
    void *payload;
    ecs_err_t rc = mux_call_prepare(d->mux, atomic_load(&d->w[wi].peer), &c, &payload, &call);
    if (rc == ECS_OK) {
        for (int t = 0; t < d->b->n_tok; t++)
            if (d->local[t] >= 0)
                memcpy((char *)payload + (size_t)d->local[t] * row, x + (size_t)t * row, row);
        rc = mux_call_send(d->mux, call);
        if (rc != ECS_OK) {
            mux_call_release(call);
            call = NULL;
        }
    }
    if (rc != ECS_OK) {
        if (atomic_load(&d->w[wi].state) != DW_LIVE)
            return ECS_OK; /* it died meanwhile: its experts stay to send */
        return ecs_error(rc, "dispatch: layer %d to worker %s: %s", d->b->layer, d->w[wi].id,
                         ecs_errmsg());
    }
    d->b->calls[slot] = call;
    d->b->call_t0[slot] = dispatch_now_ms();
    d->b->call_worker[slot] = wi;
    d->b->call_nent[slot] = (int)n_ent;
    if (shared)
        dispatch_shared_sent(d, slot);
    for (size_t q = 0; q < n_ent; q++) {
        d->b->pair_call[d->pairs_tmp[q]] = slot;
        d->b->pair_pos[d->pairs_tmp[q]] = (int32_t)q;
    }
    for (size_t i = 0; i < n_exp; i++) {
        d->b->todo[d->c_experts[i]] = false;
        d->b->exp_slot[d->c_experts[i]] = slot;
    }
    d->w[wi].calls++;
    d->w[wi].rows += n_rows;
    return ECS_OK;
}

static void release_calls(dispatch_t *d)
{
    for (int s = 0; s < d->hp.n_expert; s++)
        if (d->b->calls[s]) {
            mux_call_release(d->b->calls[s]);
            d->b->calls[s] = NULL;
        }
}

/* The current batch done with (waited for, failed or abandoned): its
 * calls released, and placement changes may run once no batch is busy. */
static void batch_end(dispatch_t *d)
{
    release_calls(d);
    if (d->b->busy) {
        d->b->busy = false;
        dispatch_layer_end(d);
    }
}

/* The batch of tag as the current one (NULL: no such tag). */
static dispatch_batch_t *batch_of(dispatch_t *d, int tag)
{
    if (tag < 0 || tag >= MODEL_MAX_MICRO)
        return NULL;
    return d->b = &d->bt[tag];
}

/* Pinned beside the workers (cluster.c: pin_threads), a call that goes to
 * one worker alone takes all the cores: before it leaves, this pool's idle
 * thread hands its CPU to that worker's thread there, which is then awake
 * when the call comes (the worker hands the cores back the same way). */
static void hand_over(dispatch_t *d)
{
    int one = -1, n = 0;
    for (int wi = 0; wi < d->n_workers; wi++)
        if (d->rows_now[wi])
            one = wi, n++;
    _Atomic uint32_t *own, *theirs;
    if (d->pinned && n == 1 && mux_peer_pool_words(d->mux, atomic_load(&d->w[one].peer), &own,
                                                   &theirs))
        ecs_threadpool_handoff(model_threadpool(d->m), theirs, own);
}

/* Gives every expert still to send to a live holder and sends one call
 * per chosen worker; experts without a live holder stay to send. *busiest:
 * the most rows given to one worker. */
static ecs_err_t send_todo(dispatch_t *d, int *busiest, int *sent)
{
    const int X = d->hp.n_expert;
    memset(d->rows_now, 0, (size_t)d->n_workers * sizeof *d->rows_now);
    d->rr++;
    *sent = 0;
    const int one = dispatch_choose_whole(d);
    for (int e = 0; e < X; e++) {
        d->choice[e] = -1;
        if (!d->b->todo[e])
            continue;
        const int wi = one >= 0 ? one : choose(d, d->b->layer, e);
        if (wi < 0)
            continue;
        d->choice[e] = wi;
        d->rows_now[wi] += d->b->start[e + 1] - d->b->start[e];
    }
    dispatch_note_whole(d, one);
    hand_over(d);
    const int carrier = dispatch_shared_carrier(d);
    *busiest = 0;
    for (int wi = 0; wi < d->n_workers; wi++) {
        if (!d->rows_now[wi])
            continue;
        *busiest = d->rows_now[wi] > *busiest ? d->rows_now[wi] : *busiest;
        ecs_err_t rc = send_worker(d, wi, wi == carrier);
        if (rc != ECS_OK)
            return rc;
        (*sent)++;
    }
    return ECS_OK;
}

static ecs_err_t dispatch_submit(void *ctx, int tag, int layer, int n_tok, const float *x,
                                 int k, const int32_t *ids, const float *w)
{
    dispatch_t *d = ctx;
    const uint64_t t_submit = now_ns();
    if (!batch_of(d, tag))
        return ecs_error(ECS_ERR_INVAL, "dispatch: submit with tag %d (0..%d)", tag,
                         MODEL_MAX_MICRO - 1);
    batch_end(d); /* one never waited for */
    dispatch_layer_begin(d);
    d->b->busy = true;
    const int X = d->hp.n_expert;
    if (layer < 0 || layer >= d->hp.n_layer || !arch_layer_moe(&d->hp, layer) || n_tok < 1 ||
        n_tok > MODEL_MAX_BATCH || k != d->hp.n_expert_used) {
        batch_end(d);
        return ecs_error(ECS_ERR_INVAL, "dispatch: layer %d, %d rows x %d slots", layer, n_tok,
                         k);
    }
    for (int p = 0; p < n_tok * k; p++)
        if (ids[p] < 0 || ids[p] >= X) {
            batch_end(d);
            return ecs_error(ECS_ERR_RANGE, "dispatch: expert id %d out of range", ids[p]);
        }
    d->b->layer = layer;
    d->b->n_tok = n_tok;
    d->b->k = k;
    d->b->x = x;
    d->b->wts = w;
    d->b->xq_done = false;
    group_pairs(d, n_tok * k, ids);
    for (int e = 0; e < X; e++) {
        d->b->todo[e] = d->b->start[e + 1] > d->b->start[e];
        d->b->exp_slot[e] = -1;
    }
    for (int p = 0; p < n_tok * k; p++)
        d->b->pair_call[p] = -1;
    dispatch_shared_begin(d);
    int busiest, sent;
    ecs_err_t rc = send_todo(d, &busiest, &sent);
    if (rc != ECS_OK) {
        batch_end(d);
        return rc;
    }
    pthread_mutex_lock(&d->lock);
    d->layer_calls++;
    d->overlapped += d->in_layer > 1;
    d->alone_calls += d->whole;
    d->step_rows += (uint64_t)n_tok;
    d->imbalance_sum += (double)busiest * d->n_workers / (double)(n_tok * k);
    pthread_mutex_unlock(&d->lock);
    d->t_submit_ns = t_submit;
    d->t_submitted_ns = now_ns();
    return ECS_OK;
}

/* Takes the answers of completed calls: rows of an answered call go to
 * their pairs; a call failed by a dead worker's disconnect puts its
 * experts back to send. Anything else is an error. */
static ecs_err_t collect(dispatch_t *d, int *resend, uint64_t *rtt_max, uint64_t *compute)
{
    const size_t E = (size_t)d->hp.n_embd, row = E * sizeof(float);
    const int n_pairs = d->b->n_tok * d->b->k;
    for (int s = 0; s < d->hp.n_expert; s++) {
        if (!d->b->calls[s] || !mux_call_done(d->b->calls[s]))
            continue;
        const dispatch_worker_t *wk = &d->w[d->b->call_worker[s]];
        const mux_result_t *r = mux_call_result(d->b->calls[s]);
        ecs_err_t rc = ECS_OK;
        if (r->rtt_ns > *rtt_max) {
            *rtt_max = r->rtt_ns;
            *compute = r->compute_ns;
        }
        if (r->err == ECS_ERR_IO) {
            dispatch_shared_failed(d, s);
            for (int e = 0; e < d->hp.n_expert; e++)
                if (d->b->exp_slot[e] == s) {
                    d->b->todo[e] = true;
                    d->b->exp_slot[e] = -1;
                    (*resend)++;
                }
        } else if (r->err != ECS_OK || r->status != WIRE_ST_OK) {
            rc = ecs_error(r->err != ECS_OK ? r->err : ECS_ERR_INTERNAL,
                           "dispatch: layer %d: worker %s: %s%s%s", d->b->layer, wk->id,
                           r->err != ECS_OK ? ecs_errname(r->err) : wire_status_name(r->status),
                           r->message[0] ? ": " : "", r->message);
        } else if ((int)r->n_entries !=
                       d->b->call_nent[s] + (s == d->b->sh_slot ? d->b->n_tok : 0) ||
                   r->n_embd != E ||
                   (r->dtype != ECS_TYPE_F32 && !d->o.wire_bf16)) {
            rc = ecs_error(ECS_ERR_FORMAT, "dispatch: layer %d: worker %s sent %u rows of %u "
                           "%s, want %d of %zu", d->b->layer, wk->id, r->n_entries, r->n_embd,
                           ecs_type_name((ecs_type_t)r->dtype), d->b->call_nent[s], E);
        } else if (r->dtype == ECS_TYPE_BF16) { /* --wire-result bf16: inexact */
            const ecs_bf16_t *b = r->payload;
            for (int p = 0; p < n_pairs; p++)
                if (d->b->pair_call[p] == s)
                    for (size_t c = 0; c < E; c++)
                        d->b->d[(size_t)p * E + c] =
                            ecs_bf16_to_f32(b[(size_t)d->b->pair_pos[p] * E + c]);
            for (int e = 0; e < d->hp.n_expert; e++)
                if (d->b->exp_slot[e] == s)
                    d->b->exp_slot[e] = -1;
        } else {
            for (int p = 0; p < n_pairs; p++)
                if (d->b->pair_call[p] == s)
                    memcpy(d->b->d + (size_t)p * E,
                           (const char *)r->payload + (size_t)d->b->pair_pos[p] * row, row);
            dispatch_shared_collect(d, s,
                                    (const char *)r->payload + (size_t)d->b->call_nent[s] * row);
            for (int e = 0; e < d->hp.n_expert; e++)
                if (d->b->exp_slot[e] == s)
                    d->b->exp_slot[e] = -1;
        }
        if (rc != ECS_OK)
            return rc;
        for (int p = 0; p < n_pairs; p++)
            if (d->b->pair_call[p] == s)
                d->b->pair_call[p] = -1;
        mux_call_release(d->b->calls[s]);
        d->b->calls[s] = NULL;
    }
    return ECS_OK;
}

/* Why the layer cannot finish: the experts still missing, each with its
 * holders and their states. */
static ecs_err_t missing_error(dispatch_t *d, ecs_err_t code, const char *what)
{
    char list[768];
    size_t len = 0;
    int n = 0;
    list[0] = 0;
    pthread_mutex_lock(&d->lock);
    for (int e = 0; e < d->hp.n_expert; e++) {
        if (!d->b->todo[e] && d->b->exp_slot[e] < 0)
            continue;
        if (n++ >= 4 || len >= sizeof list)
            continue;
        const int16_t *h;
        const int nh = placement_holders(d->pl, d->b->layer, e, &h);
        int w = snprintf(list + len, sizeof list - len, "%s%d/%d (", len ? ", " : "", d->b->layer,
                         e);
        len += w > 0 ? (size_t)w : 0;
        for (int i = 0; i < nh && len < sizeof list; i++) {
            const dispatch_worker_t *wk = &d->w[h[i]];
            const int st = atomic_load(&wk->state);
            w = snprintf(list + len, sizeof list - len, "%s%s %s%s%s", i ? "; " : "", wk->id,
                         st == DW_LIVE ? "live" : st == DW_LOADING ? "loading"
                         : st == DW_DEAD ? "dead" : "given up",
                         wk->why[0] && st != DW_LIVE ? ": " : "", st != DW_LIVE ? wk->why : "");
            len += w > 0 ? (size_t)w : 0;
        }
        if (len < sizeof list) {
            w = snprintf(list + len, sizeof list - len, ")");
            len += w > 0 ? (size_t)w : 0;
        }
    }
    pthread_mutex_unlock(&d->lock);
    return ecs_error(code, "dispatch: layer %d: %s; %d experts missing (layer/expert): %s%s",
                     d->b->layer, what, n, list, n > 4 ? ", ..." : "");
}

/* Whether an expert still to send has lost every holder for good. */
static bool orphaned(const dispatch_t *d)
{
    for (int e = 0; e < d->hp.n_expert; e++) {
        if (!d->b->todo[e])
            continue;
        const int16_t *h;
        const int nh = placement_holders(d->pl, d->b->layer, e, &h);
        bool hope = false;
        for (int i = 0; i < nh; i++)
            hope |= atomic_load(&d->w[h[i]].state) != DW_FAILED;
        if (!hope)
            return true;
    }
    return false;
}

/* Every expert's rows, however many workers die meanwhile: calls failed
 * by a death are sent again to a live holder, or wait for one (a replica,
 * the restarted worker) until the deadline. The sum runs only when every
 * pair is answered, so the bits are those of a run without the failure. */
static ecs_err_t dispatch_wait(void *ctx, int tag, int layer, float *out)
{
    dispatch_t *d = ctx;
    if (!batch_of(d, tag))
        return ecs_error(ECS_ERR_INVAL, "dispatch: wait with tag %d (0..%d)", tag,
                         MODEL_MAX_MICRO - 1);
    if (!d->b->busy || layer != d->b->layer) {
        batch_end(d);
        return ecs_error(ECS_ERR_INVAL, "dispatch: wait for layer %d, submitted %d", layer,
                         d->b->layer);
    }
    const int timeout = d->o.call_timeout_ms > 0 ? d->o.call_timeout_ms : 120000;
    const uint64_t t0 = dispatch_now_ms(), deadline = t0 + (uint64_t)timeout;
    uint64_t retry = (uint64_t)(d->o.call_retry_ms > 0 ? d->o.call_retry_ms
                                : DISPATCH_HEARTBEAT_MS * (int)WIRE_LIVENESS);
    int resent = 0, retried = 0;
    bool held = false;
    const uint64_t w0 = now_ns();
    uint64_t rtt_max = 0, compute = 0;
    ecs_err_t rc = ECS_OK;
    mux_call_t *list[PLACEMENT_MAX_WORKERS];
    /* the workers compute now, on the cores this process shares with them:
     * the pool's idle threads sleep rather than spin for the next product */
    ecs_threadpool_park(model_threadpool(d->m));
    for (;;) {
        int n = 0;
        uint64_t wake = deadline;
        for (int s = 0; s < d->hp.n_expert && n < PLACEMENT_MAX_WORKERS; s++)
            if (d->b->calls[s]) {
                list[n++] = d->b->calls[s];
                if (d->b->call_t0[s] + retry < wake)
                    wake = d->b->call_t0[s] + retry;
            }
        uint64_t now = dispatch_now_ms();
        if (n && now < wake)
            mux_wait(d->mux, list, n, (int)(wake - now));
        /* a call unanswered that long while its worker lives: the call or
         * its reply was lost (or the worker is slow). Workers hold no
         * state, so it is sent again; each retry of a layer waits twice
         * as long, so a slow worker is not flooded. */
        now = dispatch_now_ms();
        bool cancelled = false;
        for (int s = 0; s < d->hp.n_expert; s++)
            if (d->b->calls[s] && !mux_call_done(d->b->calls[s]) &&
                now >= d->b->call_t0[s] + retry &&
                now < deadline) {
                mux_call_cancel(d->mux, d->b->calls[s]);
                d->b->call_t0[s] = deadline; /* once */
                cancelled = true;
                retried++;
            }
        if (cancelled) {
            retry *= 2;
            continue; /* the cancelled calls complete at once, failed: collect them */
        }
        int again = 0;
        if ((rc = collect(d, &again, &rtt_max, &compute)) != ECS_OK)
            break;
        resent += again;
        bool pending = false, todo = false;
        for (int e = 0; e < d->hp.n_expert; e++) {
            pending |= d->b->exp_slot[e] >= 0;
            todo |= d->b->todo[e];
        }
        if (!pending && !todo)
            break;
        if (todo) {
            uint64_t gen;
            pthread_mutex_lock(&d->lock);
            gen = d->state_gen;
            pthread_mutex_unlock(&d->lock);
            int busiest, sent;
            if ((rc = send_todo(d, &busiest, &sent)) != ECS_OK)
                break;
            if (!sent && !pending) {
                if (orphaned(d)) {
                    rc = missing_error(d, ECS_ERR_IO, "every holder was given up on");
                    break;
                }
                /* held: sleep until a worker's state changes */
                held = true;
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 200 * 1000000L;
                ts.tv_sec += ts.tv_nsec / 1000000000L;
                ts.tv_nsec %= 1000000000L;
                pthread_mutex_lock(&d->lock);
                if (d->state_gen == gen)
                    pthread_cond_timedwait(&d->cond, &d->lock, &ts);
                pthread_mutex_unlock(&d->lock);
            }
        }
        if (dispatch_now_ms() >= deadline) {
            char what[64];
            snprintf(what, sizeof what, "no answer in %d ms", timeout);
            rc = missing_error(d, ECS_ERR_IO, what);
            break;
        }
    }
    batch_end(d);
    if (rc != ECS_OK)
        return rc;
    d->ns_submit += d->t_submitted_ns - d->t_submit_ns;
    d->ns_overlap += w0 - d->t_submitted_ns;
    d->ns_blocked += now_ns() - w0;
    d->ns_rtt_max += rtt_max;
    d->ns_compute_of_max += compute;
    const bool sh_here = dispatch_shared_finish(d);
    if (resent || held)
        dispatch_log(d, "layer %d: %d experts sent again after a worker died or a message was "
                     "lost (%d calls retried)%s%s; the layer took %llu ms", layer, resent, retried,
                     held ? ", held until a holder was back" : "",
                     sh_here ? ", the shared experts computed here (no holder of them left to "
                               "send them to)" : "",
                     (unsigned long long)(dispatch_now_ms() - t0));
    kmoe_sum(model_threadpool(d->m), d->b->n_tok, d->b->k, (int)d->hp.n_embd, d->b->d, d->ident,
             d->b->wts, out);
    return ECS_OK;
}

const model_experts_ops dispatch_experts_ops = {dispatch_submit, dispatch_wait, MODEL_MAX_MICRO,
                                                dispatch_took_shared};

const placement_t *dispatch_placement(const dispatch_t *d) { return d->pl; }

void dispatch_stats(const dispatch_t *d, dispatch_stats_t *s)
{
    pthread_mutex_lock((pthread_mutex_t *)&d->lock);
    s->n_workers = d->n_workers;
    s->layer_calls = d->layer_calls;
    s->overlapped = d->overlapped;
    s->whole_calls = d->alone_calls;
    s->imbalance = d->layer_calls ? d->imbalance_sum / (double)d->layer_calls : 0;
    s->ns_submit = d->ns_submit;
    s->ns_overlap = d->ns_overlap;
    s->ns_blocked = d->ns_blocked;
    s->ns_rtt_max = d->ns_rtt_max;
    s->ns_compute_of_max = d->ns_compute_of_max;
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
    pthread_mutex_lock((pthread_mutex_t *)&d->lock);
    out->pairs_held = placement_held(d->hold ? d->hold : d->pl, wi);
    const int st = atomic_load(&w->state);
    const bool reloading = w->ready_gen != w->assign_gen;
    out->state = st == DW_LOADING ? "loading" : st == DW_DEAD ? "dead" : st == DW_FAILED ? "failed"
                 : w->drained ? (reloading || w->bytes_held ? "draining" : "drained")
                 : reloading ? "reloading" : "live";
    if (st != DW_LIVE)
        snprintf(out->why, sizeof out->why, "%s", w->why);
    out->restarts = w->child >= 0 && d->children ? d->children[w->child].restarts
                                                 : w->registrations;
    out->deaths = w->deaths;
    out->spawned = w->child >= 0;
    out->last_heard_ms = w->last_seen_ms ? (int64_t)(dispatch_now_ms() - w->last_seen_ms) : -1;
    pthread_mutex_unlock((pthread_mutex_t *)&d->lock);
    out->calls = w->calls;
    out->rows = w->rows;
    const int peer = atomic_load(&w->peer);
    if (peer >= 0) {
        mux_peer_stats_t ps;
        if (mux_peer_stats(d->mux, peer, &ps) == ECS_OK) {
            out->calls_in_flight = ps.calls_in_flight;
            out->rows_in_flight = ps.rows_in_flight;
            out->bytes_out = ps.bytes_out;
            out->bytes_in = ps.bytes_in;
            out->latency_p50_us = mux_latency_quantile(ps.latency_us, 0.5);
            out->latency_p99_us = mux_latency_quantile(ps.latency_us, 0.99);
            _Static_assert(DISPATCH_LAT_BUCKETS == MUX_LAT_BUCKETS, "latency buckets");
            memcpy(out->latency_hist, ps.latency_us, sizeof out->latency_hist);
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
    fprintf(f, "dispatch: %d workers, %llu layer calls (%llu overlapped, %llu whole to one "
            "replica), %.0f tokens, imbalance (busiest / mean rows) %.2f\n", st.n_workers,
            (unsigned long long)st.layer_calls, (unsigned long long)st.overlapped,
            (unsigned long long)st.whole_calls, tokens, st.imbalance);
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
    if (d->sh_calls)
        fprintf(f, "  shared experts computed by the workers in %llu of the layer calls (%llu "
                "here after all: their call failed)\n", (unsigned long long)d->sh_calls,
                (unsigned long long)d->sh_here);
    if (st.layer_calls)
        fprintf(f, "  per layer call: %.0f us overlapped work (shared experts) after submit, "
                "%.0f us blocked in wait; slowest call %.0f us round trip, %.0f us of it its "
                "worker's compute\n", d->ns_overlap / 1e3 / st.layer_calls,
                d->ns_blocked / 1e3 / st.layer_calls, d->ns_rtt_max / 1e3 / st.layer_calls,
                d->ns_compute_of_max / 1e3 / st.layer_calls);
}
