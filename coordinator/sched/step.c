/* step.c - the scheduler thread: admits waiting requests into free KV
 * slots, builds each step (every decoding request's next token, then prompt
 * chunks in admission order within the step's budget), evaluates it, and
 * turns each row's logits into a token, text and a published update. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sched_int.h"

/* The i-th chunk of the prompt's uncached part cut into n_chunks chunks as
 * evenly as possible: a function of the prompt and the cache alone. */
static int chunk_len(const sched_req_t *r)
{
    int n = r->p.n_prompt - r->n_cached, k = r->n_chunks;
    return n / k + (r->chunk_i < n % k);
}

static void running_remove(sched_t *s, sched_req_t *r)
{
    sched_req_t **pp = &s->running;
    s->running_tail = NULL;
    while (*pp) {
        if (*pp == r)
            *pp = r->next;
        else {
            s->running_tail = *pp;
            pp = &(*pp)->next;
        }
    }
    r->next = NULL;
    s->n_running--;
}

/* Ends a running request however it ends: its slot comes back, the final
 * state is published, the scheduler drops its reference. */
static void finish(sched_t *s, sched_req_t *r, sched_finish_t f, const char *err)
{
    if (r->slot >= 0)
        sched_slot_give_back(s, r, f != SCHED_FINISH_ERROR);
    running_remove(s, r);
    pthread_mutex_lock(&s->mu);
    r->pub_finish = f;
    r->pub_text = r->emit_end;
    r->pub_gen = r->n_gen;
    r->pub_gen_toks = r->n_gen;
    if (err)
        snprintf(r->error, sizeof r->error, "%s", err);
    s->n_running_pub = s->n_running;
    sched_mark_ready_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    sched_release(r);
}

/* Drops cancelled waiting requests, then moves waiting requests into free
 * slots in arrival order. */
static void admit(sched_t *s)
{
    sched_req_t *dropped = NULL;
    pthread_mutex_lock(&s->mu);
    for (sched_req_t **pp = &s->wait_head; *pp;) {
        sched_req_t *r = *pp;
        if (!atomic_load(&r->cancel)) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        s->n_waiting--;
        r->pub_finish = SCHED_FINISH_CANCELLED;
        sched_mark_ready_locked(s, r);
        r->next = dropped;
        dropped = r;
    }
    s->wait_tail = NULL;
    for (sched_req_t *r = s->wait_head; r; r = r->next)
        s->wait_tail = r;
    while (s->wait_head && s->n_free > 0 && s->n_running < s->o.max_running) {
        sched_req_t *r = s->wait_head;
        s->wait_head = r->next;
        if (!s->wait_head)
            s->wait_tail = NULL;
        s->n_waiting--;
        r->next = NULL;
        sched_slot_take(s, r);
        if (s->running_tail)
            s->running_tail->next = r;
        else
            s->running = r;
        s->running_tail = r;
        s->n_running++;
    }
    s->n_running_pub = s->n_running;
    pthread_mutex_unlock(&s->mu);
    while (dropped) {
        sched_req_t *next = dropped->next;
        sched_release(dropped);
        dropped = next;
    }
}

/* Log-probabilities of the model's distribution (before penalties): the
 * chosen token's later, the top alternatives now. */
static void logprobs_top(const float *l, int V, int k, sched_token_t *rec, float *lse_out)
{
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)(l[i] - mx));
    float lse = mx + (float)log(sum);
    *lse_out = lse;
    int n = 0;
    for (int i = 0; i < V && k > 0; i++) {
        if (n == k && l[i] <= l[rec->top_id[n - 1]])
            continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && l[rec->top_id[j - 1]] < l[i]) {
            rec->top_id[j] = rec->top_id[j - 1];
            j--;
        }
        rec->top_id[j] = i;
    }
    for (int i = 0; i < n; i++)
        rec->top_lp[i] = l[rec->top_id[i]] - lse;
    for (int i = n; i < SCHED_MAX_TOP_LOGPROBS; i++)
        rec->top_id[i] = -1;
}

static void on_logits(sched_t *s, sched_req_t *r, float *l)
{
    sched_token_t rec = {0};
    float lse = 0;
    if (r->toks) { /* sampling applies penalties in place: keep the model's row */
        memcpy(s->lp_row, l, (size_t)s->n_vocab * sizeof *l);
        logprobs_top(l, s->n_vocab, r->p.top_logprobs, &rec, &lse);
    }
    int32_t id;
    if (sampler_sample(r->smp, l, &id) != ECS_OK) {
        char msg[200];
        snprintf(msg, sizeof msg, "sampling failed: %s", ecs_errmsg());
        finish(s, r, SCHED_FINISH_ERROR, msg);
        return;
    }
    sampler_accept(r->smp, id);
    r->n_gen++;
    const size_t mo = tok_decoder_max_out(s->tok);
    bool eog = !r->p.ignore_eos && tok_is_eog(s->tok, id);
    bool last = eog || r->n_gen >= r->p.max_tokens;
    size_t before = r->text_len, k = 0;
    if (!eog && tok_decoder_push(&r->dec, id, r->text + r->text_len, mo, &k) == ECS_OK)
        r->text_len += k;
    if (last && tok_decoder_flush(&r->dec, r->text + r->text_len, mo, &k) == ECS_OK)
        r->text_len += k;
    if (r->toks) {
        rec.id = id;
        rec.logprob = s->lp_row[id] - lse;
        rec.text_off = before;
        r->toks[r->n_gen - 1] = rec;
    }
    sampler_stop_result_t st = sampler_stops_check(r->stops, r->text, r->text_len, r->emit_end, last);
    r->emit_end = st.emit_end;
    sched_finish_t f = st.finish == SAMPLER_STOP_STRING ? SCHED_FINISH_STOP
                       : eog                            ? SCHED_FINISH_EOG
                       : last                           ? SCHED_FINISH_LENGTH
                                                        : SCHED_RUNNING;
    double now = sched_now();
    pthread_mutex_lock(&s->mu);
    sched_note_token_locked(s, r, now);
    r->stop_index = st.stop_index;
    pthread_mutex_unlock(&s->mu);
    if (f != SCHED_RUNNING) {
        finish(s, r, f, NULL);
        return;
    }
    r->decoding = true;
    r->next_tok = id;
    pthread_mutex_lock(&s->mu);
    r->pub_text = r->emit_end;
    r->pub_gen = r->n_gen;
    r->pub_gen_toks = r->n_gen;
    sched_mark_ready_locked(s, r);
    pthread_mutex_unlock(&s->mu);
}

static void step(sched_t *s)
{
    for (sched_req_t *r = s->running, *next; r; r = next) {
        next = r->next;
        if (atomic_load(&r->cancel))
            finish(s, r, SCHED_FINISH_CANCELLED, NULL);
    }
    int n = 0;
    for (sched_req_t *r = s->running; r; r = r->next)
        if (r->decoding) {
            s->rows[n] = (model_row_t){s->slots[r->slot], r->next_tok, true};
            s->slot_toks[r->slot][model_ctx_n_past(s->slots[r->slot])] = r->next_tok;
            s->row_req[n++] = r;
        }
    int n_prompt_rows = 0;
    for (sched_req_t *r = s->running; r; r = r->next) {
        if (r->decoding)
            continue;
        int c = chunk_len(r);
        if (n + c > MODEL_MAX_BATCH)
            break; /* first come first served: nobody overtakes it */
        bool final = r->chunk_i + 1 == r->n_chunks;
        for (int j = 0; j < c; j++) {
            s->slot_toks[r->slot][r->n_fed + j] = r->p.prompt[r->n_fed + j];
            s->rows[n] = (model_row_t){s->slots[r->slot], r->p.prompt[r->n_fed + j],
                                       final && j + 1 == c};
            s->row_req[n++] = r;
        }
        n_prompt_rows += c;
    }
    if (n == 0)
        return;
    ecs_err_t e = model_eval_batch(s->m, s->rows, n, s->logits);
    if (e != ECS_OK) {
        char msg[200];
        snprintf(msg, sizeof msg, "model step failed: %s", ecs_errmsg());
        for (int i = 0; i < n; i++)
            if (i == 0 || s->row_req[i] != s->row_req[i - 1])
                if (s->row_req[i]->slot >= 0)
                    finish(s, s->row_req[i], SCHED_FINISH_ERROR, msg);
        return;
    }
    for (int i = 0; i < n; i++) {
        sched_req_t *r = s->row_req[i];
        if (!r->decoding && (i == 0 || s->row_req[i - 1] != r)) {
            r->n_fed += chunk_len(r);
            r->chunk_i++;
        }
    }
    pthread_mutex_lock(&s->mu);
    s->stats.steps++;
    s->stats.prompt_tokens += (uint64_t)n_prompt_rows;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0, j = 0; i < n; i++)
        if (s->rows[i].want_logits)
            on_logits(s, s->row_req[i], s->logits + (size_t)j++ * (size_t)s->n_vocab);
}

/* One prompt chunk and one decode row on slot 0, so the scheduler thread's
 * kernel scratch is grown before the first request. */
static ecs_err_t warm_up(sched_t *s)
{
    model_ctx_t *c = s->slots[0];
    int n = s->o.chunk < s->o.n_ctx - 1 ? s->o.chunk : s->o.n_ctx - 1;
    for (int i = 0; i < n; i++)
        s->rows[i] = (model_row_t){c, i % s->n_vocab, i + 1 == n};
    ecs_err_t e = n > 0 ? model_eval_batch(s->m, s->rows, n, s->logits) : ECS_OK;
    if (e == ECS_OK) {
        s->rows[0] = (model_row_t){c, 0, true};
        e = model_eval_batch(s->m, s->rows, 1, s->logits);
    }
    model_ctx_reset(c);
    return e;
}

static void notify(sched_t *s)
{
    pthread_mutex_lock(&s->mu);
    bool due = s->notify_due;
    s->notify_due = false;
    pthread_mutex_unlock(&s->mu);
    if (due && s->o.notify)
        s->o.notify(s->o.notify_arg);
}

void *sched_main(void *arg)
{
    sched_t *s = arg;
    ecs_err_t e = warm_up(s);
    pthread_mutex_lock(&s->mu);
    s->warm = true;
    s->warm_err = e != ECS_OK;
    if (e != ECS_OK)
        snprintf(s->warm_msg, sizeof s->warm_msg, "%s", ecs_errmsg());
    pthread_cond_broadcast(&s->cv);
    if (e != ECS_OK) {
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }
    for (;;) {
        while (!s->quit && !s->wait_head && !s->running)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit)
            break;
        pthread_mutex_unlock(&s->mu);
        admit(s);
        step(s);
        notify(s);
        pthread_mutex_lock(&s->mu);
    }
    /* shutting down: every request ends, cancelled */
    pthread_mutex_unlock(&s->mu);
    while (s->running)
        finish(s, s->running, SCHED_FINISH_CANCELLED, NULL);
    pthread_mutex_lock(&s->mu);
    sched_req_t *w = s->wait_head;
    s->wait_head = s->wait_tail = NULL;
    s->n_waiting = 0;
    for (sched_req_t *r = w; r; r = r->next) {
        r->pub_finish = SCHED_FINISH_CANCELLED;
        sched_mark_ready_locked(s, r);
    }
    pthread_mutex_unlock(&s->mu);
    while (w) {
        sched_req_t *next = w->next;
        sched_release(w);
        w = next;
    }
    notify(s);
    return NULL;
}
