/* sched.c - the scheduler thread: admission into KV slots, step building
 * (decode rows first, then prompt chunks first come first served), one
 * model_eval_batch per step, sampling, detokenizing, stop strings, and
 * publishing progress to the thread that owns the clients. */
#include "sched.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sched_int.h"

const double sched_hist_bounds[12] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                      0.1,   0.25,   0.5,   1.0,  2.5,   INFINITY};

double sched_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void hist_add(uint64_t *bucket, uint64_t *count, double *sum, double v)
{
    for (int i = 0; i < 12; i++)
        if (v <= sched_hist_bounds[i])
            bucket[i]++;
    (*count)++;
    *sum += v;
}

/* Without --kv-mem: max_running whole contexts, but at most half of the
 * memory the system has available now (and at least one context). */
static size_t sched_default_blocks(size_t block_bytes, int per_ctx, int max_running)
{
    size_t want = (size_t)per_ctx * (size_t)max_running;
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0) {
        size_t cap = (size_t)pages * (size_t)psz / 2 / block_bytes;
        want = want < cap ? want : cap;
    }
    return want > (size_t)per_ctx ? want : (size_t)per_ctx;
}

int sched_n_ctx(const sched_t *s)
{
    return s->o.n_ctx;
}

ecs_err_t sched_new(model_t *m, const tok_t *tok, const sched_opts_t *o, sched_t **out)
{
    *out = NULL;
    if (o->n_ctx < 1 || o->n_ctx > model_n_ctx_max(m))
        return ecs_error(ECS_ERR_RANGE, "sched: context %d outside 1..%d", o->n_ctx,
                         model_n_ctx_max(m));
    if (o->max_running < 1 || o->max_running > MODEL_MAX_BATCH / 2)
        return ecs_error(ECS_ERR_RANGE, "sched: max running %d outside 1..%d", o->max_running,
                         MODEL_MAX_BATCH / 2);
    if (o->chunk < 2 * MODEL_MLA_EXPAND_ROWS || o->chunk + o->max_running > MODEL_MAX_BATCH)
        return ecs_error(ECS_ERR_RANGE, "sched: prompt chunk %d outside %d..%d", o->chunk,
                         2 * MODEL_MLA_EXPAND_ROWS, MODEL_MAX_BATCH - o->max_running);
    if (o->idle_chunk != 0 &&
        (o->idle_chunk < o->chunk || o->idle_chunk + o->max_running > MODEL_MAX_BATCH))
        return ecs_error(ECS_ERR_RANGE, "sched: idle chunk %d outside %d..%d (or 0)",
                         o->idle_chunk, o->chunk, MODEL_MAX_BATCH - o->max_running);
    if (o->slice_chunk != 0 &&
        (o->slice_chunk < 2 * MODEL_MLA_EXPAND_ROWS || o->slice_chunk > o->chunk))
        return ecs_error(ECS_ERR_RANGE, "sched: slice chunk %d outside %d..%d (or 0)",
                         o->slice_chunk, 2 * MODEL_MLA_EXPAND_ROWS, o->chunk);
    if (!(o->slice_budget == 0 || o->slice_budget >= 1) || o->slice_units < 0 ||
        o->slice_expand < 0)
        return ecs_error(ECS_ERR_RANGE, "sched: slice budget %g (0: off, else >= 1), slice "
                         "units %d or slice expand %d (>= 0) out of range", o->slice_budget,
                         o->slice_units, o->slice_expand);
    sched_t *s = calloc(1, sizeof *s);
    if (!s)
        return ecs_error(ECS_ERR_NOMEM, "sched: out of memory");
    s->m = m;
    s->tok = tok;
    s->o = *o;
    if (o->kv_flag & ~(unsigned)(MODEL_CTX_KV_BF16 | MODEL_CTX_KV_F32 | MODEL_CTX_KV_Q8))
        return ecs_error(ECS_ERR_INVAL, "sched: KV flag 0x%x is not a cache type", o->kv_flag);
    const size_t bb = model_kv_block_bytes(m, o->kv_flag);
    const int per_ctx = sched_blocks_for(o->n_ctx);
    size_t fit = o->kv_mem ? o->kv_mem / bb : sched_default_blocks(bb, per_ctx, o->max_running);
    if (fit < (size_t)per_ctx) {
        free(s);
        return ecs_error(ECS_ERR_NOMEM,
                         "sched: --kv-mem %zu bytes is less than one context of %d tokens (%d "
                         "blocks of %d tokens, %zu bytes)",
                         o->kv_mem, o->n_ctx, per_ctx, MODEL_KV_BLOCK, (size_t)per_ctx * bb);
    }
    s->n_blocks = fit > (size_t)INT32_MAX / MODEL_KV_BLOCK ? INT32_MAX / MODEL_KV_BLOCK : (int)fit;
    s->n_vocab = model_n_vocab(m);
    s->logits = malloc((size_t)o->max_running * (size_t)s->n_vocab * sizeof *s->logits);
    s->lp_rows = malloc((size_t)ecs_threadpool_size(model_threadpool(m)) * (size_t)s->n_vocab *
                        sizeof *s->lp_rows);
    s->json_tok = malloc((size_t)s->n_vocab);
    s->picks = malloc((size_t)o->max_running * sizeof *s->picks);
    s->rows = malloc(MODEL_MAX_BATCH * sizeof *s->rows);
    s->row_req = malloc(MODEL_MAX_BATCH * sizeof *s->row_req);
    s->n_units = model_slice_units(m);
    s->slice_log = getenv("ECS_SLICE_LOG") != NULL;
    if (o->slice_budget > 0 || o->slice_units > 0)
        s->slice_resid = malloc(model_slice_bytes(m, o->chunk));
    if (!s->logits || !s->lp_rows || !s->json_tok || !s->picks || !s->rows || !s->row_req ||
        ((o->slice_budget > 0 || o->slice_units > 0) && !s->slice_resid))
        goto nomem;
    sched_json_classify(s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->inited = true;
    if (sched_kv_init(s) != ECS_OK)
        goto fail;
    *out = s;
    return ECS_OK;
nomem:
    ecs_error(ECS_ERR_NOMEM, "sched: out of memory");
fail:
    sched_free(s);
    return ECS_ERR_NOMEM;
}

void sched_free(sched_t *s)
{
    if (!s)
        return;
    sched_stop(s);
    sched_kv_free(s);
    free(s->logits);
    free(s->lp_rows);
    free(s->json_tok);
    free(s->picks);
    free(s->rows);
    free(s->row_req);
    free(s->slice_resid);
    if (s->inited) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
    }
    free(s);
}

static void req_free(sched_req_t *r)
{
    sampler_free(r->smp);
    sampler_stops_free(r->stops);
    free(r->p.prompt);
    sampler_schema_free(r->p.schema);
    free(r->text);
    free(r->toks);
    free(r->gen);
    free(r);
}

void sched_release(sched_req_t *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1)
        req_free(r);
}

void *sched_req_user(const sched_req_t *r)
{
    return r->user;
}

ecs_err_t sched_submit(sched_t *s, sched_params_t *p, void *user, sched_req_t **out)
{
    *out = NULL;
    if (p->n_prompt < 1 || p->n_prompt >= s->o.n_ctx)
        return ecs_error(ECS_ERR_RANGE,
                         "the prompt has %d tokens; this server's context holds %d (prompt "
                         "and at least one generated token)",
                         p->n_prompt, s->o.n_ctx);
    if (p->max_tokens < 1 || p->top_logprobs > SCHED_MAX_TOP_LOGPROBS || p->n_stops < 0 ||
        p->n_stops > SAMPLER_MAX_STOPS)
        return ecs_error(ECS_ERR_INVAL, "sched: bad request parameters");
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->n_vocab)
            return ecs_error(ECS_ERR_RANGE, "token id %d outside the vocabulary (0..%d)",
                             p->prompt[i], s->n_vocab - 1);
    if (sampler_params_check(&p->sp) != ECS_OK)
        return ECS_ERR_INVAL;
    const sched_think_budget_t *t = &p->think;
    if (t->n_close < 0 || t->n_close > SCHED_MAX_CLOSE ||
        (t->n_close > 0 && (!t->open_tag || !t->close_tag)))
        return ecs_error(ECS_ERR_INVAL, "sched: bad reasoning budget");
    for (int i = 0; i < t->n_close; i++)
        if (t->close_ids[i] < 0 || t->close_ids[i] >= s->n_vocab)
            return ecs_error(ECS_ERR_RANGE, "token id %d outside the vocabulary (0..%d)",
                             t->close_ids[i], s->n_vocab - 1);
    int room = s->o.n_ctx - p->n_prompt;
    if (p->max_tokens > room)
        p->max_tokens = room;
    sched_req_t *r = calloc(1, sizeof *r);
    if (!r)
        return ecs_error(ECS_ERR_NOMEM, "out of memory");
    r->text_cap = (size_t)p->max_tokens * tok_decoder_max_out(s->tok) + 2 * tok_decoder_max_out(s->tok);
    r->text = malloc(r->text_cap);
    r->gen = malloc((size_t)p->max_tokens * sizeof *r->gen);
    if (p->top_logprobs >= 0)
        r->toks = malloc((size_t)p->max_tokens * sizeof *r->toks);
    if (!r->text || !r->gen || (p->top_logprobs >= 0 && !r->toks)) {
        req_free(r);
        return ecs_error(ECS_ERR_NOMEM, "out of memory");
    }
    if (sampler_new(&p->sp, s->n_vocab, &r->smp) != ECS_OK ||
        sampler_stops_new(p->stops, (size_t)p->n_stops, &r->stops) != ECS_OK) {
        req_free(r);
        return ECS_ERR_INVAL;
    }
    r->p = *p;
    p->prompt = NULL; /* ours now */
    p->schema = NULL;
    r->user = user;
    r->s = s;
    r->slot = -1;
    r->stop_index = -1;
    atomic_init(&r->refs, 2);
    atomic_init(&r->cancel, false);
    r->t_submit = sched_now();
    tok_decoder_init(&r->dec, s->tok, false);
    tok_decoder_keep(&r->dec, r->p.keep, r->p.n_keep);
    sampler_json_init_schema(&r->json, r->p.schema);
    pthread_mutex_lock(&s->mu);
    if (s->n_waiting >= s->o.max_queue || s->quit) {
        pthread_mutex_unlock(&s->mu);
        p->prompt = r->p.prompt; /* the caller keeps its prompt */
        r->p.prompt = NULL;
        p->schema = r->p.schema;
        r->p.schema = NULL;
        req_free(r);
        return ecs_error(ECS_ERR_NOMEM, "the server is busy: %d requests are waiting",
                         s->o.max_queue);
    }
    if (s->wait_tail)
        s->wait_tail->next = r;
    else
        s->wait_head = r;
    s->wait_tail = r;
    s->n_waiting++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    *out = r;
    return ECS_OK;
}

void sched_cancel(sched_t *s, sched_req_t *r)
{
    atomic_store(&r->cancel, true);
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

sched_view_t sched_req_view(sched_req_t *r)
{
    sched_view_t v;
    pthread_mutex_lock(&r->s->mu);
    v = (sched_view_t){.text = r->text, .text_len = r->pub_text, .tokens = r->toks,
                       .n_tokens = r->toks ? r->pub_gen_toks : 0, .n_prompt = r->p.n_prompt,
                       .n_gen = r->pub_gen, .n_cached = r->n_cached, .finish = r->pub_finish,
                       .stop_index = r->stop_index, .error = r->error, .ttft_s = r->ttft,
                       .last = r->pub_finish != SCHED_RUNNING && !r->pending};
    pthread_mutex_unlock(&r->s->mu);
    return v;
}

/* Under s->mu: queue r for the owner's next drain. */
void sched_mark_ready_locked(sched_t *s, sched_req_t *r)
{
    if (r->pending)
        return;
    r->pending = true;
    atomic_fetch_add(&r->refs, 1);
    r->next_ready = NULL;
    if (s->ready_tail)
        s->ready_tail->next_ready = r;
    else
        s->ready_head = r;
    s->ready_tail = r;
    s->notify_due = true;
}

void sched_drain(sched_t *s, void (*fn)(void *arg, sched_req_t *r), void *arg)
{
    pthread_mutex_lock(&s->mu);
    sched_req_t *r = s->ready_head;
    s->ready_head = s->ready_tail = NULL;
    for (sched_req_t *q = r; q; q = q->next_ready)
        q->pending = false;
    pthread_mutex_unlock(&s->mu);
    while (r) {
        sched_req_t *next = r->next_ready;
        fn(arg, r);
        sched_release(r);
        r = next;
    }
}

void sched_stats(sched_t *s, sched_stats_t *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->waiting = s->n_waiting;
    out->running = s->n_running_pub;
    out->kv_blocks = s->n_blocks;
    out->kv_block_bytes = s->block_bytes;
    out->kv_bytes = s->block_bytes * (size_t)s->n_blocks;
    out->kv_type = model_kv_type_name(s->o.kv_flag);
    pthread_mutex_unlock(&s->mu);
}

/* Under s->mu: records a finished or advanced request's numbers. */
void sched_note_token_locked(sched_t *s, sched_req_t *r, double now)
{
    if (r->n_gen == 1) {
        r->ttft = now - r->t_submit;
        hist_add(s->stats.ttft_bucket, &s->stats.ttft_count, &s->stats.ttft_sum, r->ttft);
    } else {
        hist_add(s->stats.tbt_bucket, &s->stats.tbt_count, &s->stats.tbt_sum, now - r->t_last);
    }
    r->t_last = now;
    s->stats.gen_tokens++;
}

void sched_set_notify(sched_t *s, void (*notify)(void *arg), void *arg)
{
    pthread_mutex_lock(&s->mu);
    s->o.notify = notify;
    s->o.notify_arg = arg;
    pthread_mutex_unlock(&s->mu);
}

ecs_err_t sched_start(sched_t *s)
{
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0)
        return ecs_error(ECS_ERR_INTERNAL, "sched: cannot start the scheduler thread");
    s->started = true;
    pthread_mutex_lock(&s->mu);
    while (!s->warm)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (s->warm_err)
        return ecs_error(ECS_ERR_INTERNAL, "sched: warm-up step failed: %s", s->warm_msg);
    return ECS_OK;
}

void sched_stop(sched_t *s)
{
    if (!s->started)
        return;
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = false;
}
