/* step.c - the scheduler thread: admits waiting requests (a sequence and
 * the KV blocks of their first chunk, kv.c), builds each step (every
 * decoding request's next token, then prompt chunks in admission order
 * within the step's budget, the blocks for every row reserved first),
 * evaluates it, and turns each row's logits into a token, text and a
 * published update.
 *
 * When the pool runs out, a request that needs a block takes the blocks
 * of the most recently admitted running request (preemption): that one
 * goes back to the head of the queue and is later recomputed, its prompt
 * as prompt chunks and then its generated tokens in chunks of their own
 * (replay_rows: cut so that every row is computed in the form it was
 * first computed in), so its rows and tokens are the same bits (its
 * sampler state is kept, the re-fed tokens are not sampled again: the
 * last one's logits give the next token).
 *
 * Layer-sliced prefill: while streams decode, the first chunk of a prompt
 * longer than one chunk runs apart from the decode rows through a slice of
 * the model's units (half layers, model_eval_slice), one slice per step,
 * until its last slice gives its logits; such chunks after it wait (a
 * one-chunk prompt joins the decode batch). A slice runs pieces (units,
 * and parts of a deepseek2 attention unit's expansion of the earlier
 * keys ahead of it) while the next one's time, predicted by its kind,
 * fits (slice_budget - 1) recent decode-only steps. The chunk's rows are
 * the same rows in any slicing, so its bits are those of one step. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "sched_int.h"

/* The i-th chunk of the prompt's uncached part cut into n_chunks chunks as
 * evenly as possible: a function of the prompt and the cache alone. */
static int chunk_len(const sched_req_t *r)
{
    int n = r->p.n_prompt - r->n_start, k = r->n_chunks;
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

/* Under s->mu: the pool's figures for sched_stats. */
static void kv_stats_locked(sched_t *s)
{
    s->stats.kv_blocks_used = kvc_n_used(s->kvc);
    s->stats.kv_blocks_cached = kvc_n_cached(s->kvc);
    s->stats.kv_evictions = kvc_evictions(s->kvc);
}

/* Ends a running request however it ends: its slot comes back, the final
 * state is published, the scheduler drops its reference. */
static void finish(sched_t *s, sched_req_t *r, sched_finish_t f, const char *err)
{
    if (s->slicing == r) /* a chunk part way through the model: dropped */
        s->slicing = NULL;
    sched_kv_release(s, r);
    running_remove(s, r);
    pthread_mutex_lock(&s->mu);
    r->pub_finish = f;
    kv_stats_locked(s); /* whoever sees it end sees its blocks back */
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
    while (s->wait_head && s->n_running < s->o.max_running) {
        sched_req_t *r = s->wait_head;
        pthread_mutex_unlock(&s->mu); /* admit takes it for the prefix counters */
        const bool in = sched_kv_admit(s, r);
        pthread_mutex_lock(&s->mu);
        if (!in)
            break; /* first come first served: nobody overtakes it */
        s->wait_head = r->next;
        if (!s->wait_head)
            s->wait_tail = NULL;
        s->n_waiting--;
        r->next = NULL;
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
 * chosen token's later, the top alternatives now. The log-sum-exp by the
 * kernels' vector exp: 8 rows' libm exp took ~2.6 ms of a ~41 ms step of 8
 * streams on the ds2-lite cut (~0.65 ms a row, two threads). */
static void logprobs_top(const float *l, int V, int k, sched_token_t *rec, float *lse_out)
{
    const float lse = kcpu_logsumexp(l, V);
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

/* The next token the reasoning budget puts in, or -1 (sched_think_budget_t). */
static int32_t budget_token(sched_req_t *r)
{
    const sched_think_budget_t *t = &r->p.think;
    if (r->n_closed == 0) {
        if (t->budget < 0 || r->n_gen < t->budget || t->n_close == 0)
            return -1;
        size_t i = 0, ol = strlen(t->open_tag), cl = strlen(t->close_tag);
        while (i < r->text_len && r->text[i] == '\n')
            i++;
        const bool open = t->opened || (r->text_len - i >= ol && !memcmp(r->text + i, t->open_tag, ol));
        if (!open || memmem(r->text, r->text_len, t->close_tag, cl))
            return -1;
    }
    return r->n_closed < t->n_close ? t->close_ids[r->n_closed++] : -1;
}

/* The half of a logits row's handling that touches only its request (its
 * sampler) and p: logprobs and the draw. lp: this thread's row buffer. */
static void pick_row(const sched_t *s, sched_pick_t *p, float *lp)
{
    sched_req_t *r = p->r;
    float lse = 0;
    p->rec = (sched_token_t){0};
    if (r->toks) { /* sampling applies penalties in place: keep the model's row */
        memcpy(lp, p->l, (size_t)s->n_vocab * sizeof *lp);
        logprobs_top(p->l, s->n_vocab, r->p.top_logprobs, &p->rec, &lse);
    }
    const int32_t put = budget_token(r);
    if (put >= 0) { /* the budget ran out: the think block's end is written for the model */
        p->id = put;
        p->failed = false;
        if (r->toks)
            p->rec.logprob = lp[put] - lse;
        return;
    }
    if (r->p.json) /* after the logprobs: those are the model's */
        sched_json_mask(s, r, p->l);
    p->failed = sampler_sample(r->smp, p->l, &p->id) != ECS_OK;
    if (p->failed)
        snprintf(p->msg, sizeof p->msg, "sampling failed: %s", ecs_errmsg());
    else if (r->toks)
        p->rec.logprob = lp[p->id] - lse;
}

/* kcpu_par_for's item: logits row j on pool thread ith. */
static void pick_item(void *arg, int j, int ith)
{
    sched_t *s = arg;
    pick_row(s, &s->picks[j], s->lp_rows + (size_t)ith * (size_t)s->n_vocab);
}

/* The serial half: the token's text, stops, and what the request publishes. */
static void on_pick(sched_t *s, const sched_pick_t *p)
{
    sched_req_t *r = p->r;
    sched_token_t rec = p->rec;
    const int32_t id = p->id;
    if (p->failed) {
        finish(s, r, SCHED_FINISH_ERROR, p->msg);
        return;
    }
    sampler_accept(r->smp, id);
    r->gen[r->n_gen++] = id;
    const size_t mo = tok_decoder_max_out(s->tok);
    bool eog = !r->p.ignore_eos && tok_is_eog(s->tok, id);
    const bool json_done = r->p.json && sched_json_take(s, r, id);
    bool last = eog || json_done || r->n_gen >= r->p.max_tokens;
    size_t before = r->text_len, k = 0;
    if (!eog && tok_decoder_push(&r->dec, id, r->text + r->text_len, mo, &k) == ECS_OK)
        r->text_len += k;
    if (last && tok_decoder_flush(&r->dec, r->text + r->text_len, mo, &k) == ECS_OK)
        r->text_len += k;
    if (r->toks) {
        rec.id = id;
        rec.text_off = before;
        r->toks[r->n_gen - 1] = rec;
    }
    sampler_stop_result_t st = sampler_stops_check(r->stops, r->text, r->text_len, r->emit_end, last);
    r->emit_end = st.emit_end;
    sched_finish_t f = st.finish == SAMPLER_STOP_STRING ? SCHED_FINISH_STOP
                       : eog || json_done               ? SCHED_FINISH_EOG
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

/* Under no lock: r loses its blocks and sequence and waits at the head of
 * the queue to be recomputed. */
static void preempt(sched_t *s, sched_req_t *r)
{
    if (s->slicing == r) /* its chunk starts again from the first unit */
        s->slicing = NULL;
    sched_kv_release(s, r);
    running_remove(s, r);
    r->n_fed = r->chunk_i = r->replay = 0;
    r->replay_end = r->n_gen;
    r->decoding = false;
    pthread_mutex_lock(&s->mu);
    r->next = s->wait_head;
    s->wait_head = r;
    if (!s->wait_tail)
        s->wait_tail = r;
    s->n_waiting++;
    s->n_running_pub = s->n_running;
    s->stats.preemptions++;
    pthread_mutex_unlock(&s->mu);
}

/* Blocks for r's positions [0, upto): taken from the running requests
 * admitted after r, newest first, when the pool has none left. */
static bool reserve(sched_t *s, sched_req_t *r, int upto)
{
    while (!sched_kv_reserve(s, r, upto)) {
        sched_req_t *victim = NULL;
        for (sched_req_t *q = r->next; q; q = q->next)
            if (q->n_blk > 0)
                victim = q;
        if (!victim)
            return false;
        preempt(s, victim);
    }
    return true;
}

/* After a preemption, generated tokens still to re-feed. */
static bool replaying(const sched_req_t *r) { return r->replay < r->replay_end; }

/* Whether r's prompt chunks run in slices beside decoding streams: a
 * prompt of several chunks (what is left after its cached prefix), or
 * every prompt with o.slice_units. A one-chunk prompt joins the decode
 * rows' batch as before: sliced, it would read the experts apart from
 * them, and a burst of short prompts (many clients starting at once)
 * would be admitted one at a time (8 streams of 100-token prompts: 23
 * tok/s aggregate sliced, 31 batched, on ds2-lite). */
static bool sliceable(const sched_t *s, const sched_req_t *r)
{
    return s->o.slice_units > 0 || r->n_chunks > 1;
}

/* Rows of r's next chunk of re-fed generated tokens. They were first
 * computed one per step: for deepseek2 in the absorbed form, whose rows
 * are the same bits however many of a sequence share a step as long as
 * they stay under MODEL_MLA_EXPAND_ROWS (from there the step would attend
 * in the expanded form); other architectures' attention is batch-
 * invariant, so a prompt chunk's size. Within the step's budget like a
 * prompt chunk. */
static int replay_rows(const sched_t *s, const sched_req_t *r)
{
    const int cap = s->mla ? MODEL_MLA_EXPAND_ROWS - 1 : s->o.chunk;
    const int left = r->replay_end - r->replay;
    return left < cap ? left : cap;
}

/* The rest of r's prompt cut again when the running requests have changed
 * the chunk its prompt takes (sched_chunk_for: streams started or stopped
 * decoding), between two of its chunks: any cut gives the same bits. */
static void recut(sched_t *s, sched_req_t *r)
{
    const int rest = r->p.n_prompt - r->n_fed;
    if (r->decoding || r == s->slicing || rest <= 0)
        return;
    const int chunk = sched_chunk_for(s, r->rest0);
    if (chunk == r->cut)
        return;
    r->cut = chunk;
    r->n_start = r->n_fed;
    r->n_chunks = (rest + chunk - 1) / chunk;
    r->chunk_i = 0;
}

/* Each running request's rows of this step, blocks reserved: a decoding
 * request that cannot have its block is preempted itself (the oldest
 * always can: the pool holds a whole context), a prompt chunk (or a chunk
 * of re-fed tokens) that cannot waits, and so do the chunks after it. */
static int plan(sched_t *s)
{
    /* every decode row has its place, wherever it is in the list: chunks
     * share what the decode rows leave of the batch (sched_new keeps a
     * whole chunk beside max_running decode rows) */
    int n_dec = 0;
    for (sched_req_t *r = s->running; r; r = r->next)
        n_dec += r->decoding && !replaying(r);
    /* slicing beside decode rows: one sliceable prompt chunk a step, the
     * one part way through the model, else the first (slice_pick); the
     * other sliceable ones neither run nor take blocks */
    const bool one = (s->o.slice_budget > 0 || s->o.slice_units > 0) &&
                     (s->slicing || n_dec > 0 || s->o.slice_units > 0);
    int n = 0, n_chunk = 0;
    bool prompts_wait = false, taken = false;
    for (sched_req_t *r = s->running, *next; r; r = next) {
        next = r->next;
        r->step_rows = 0;
        recut(s, r);
        const bool chunk = !r->decoding || replaying(r);
        const int want = !r->decoding ? chunk_len(r) : chunk ? replay_rows(s, r) : 1;
        if (!r->decoding && one && sliceable(s, r) && (taken || (s->slicing && r != s->slicing)))
            continue;
        if (chunk && (prompts_wait || n_chunk + want > MODEL_MAX_BATCH - n_dec)) {
            prompts_wait = true;
            continue;
        }
        const bool ok = reserve(s, r, model_ctx_n_past(r->ctx) + want);
        next = r->next; /* reserve's victims were after r */
        if (!ok) {
            if (!chunk)
                preempt(s, r);
            else
                prompts_wait = true;
            continue;
        }
        r->step_rows = want;
        n += want;
        n_chunk += chunk ? want : 0;
        taken |= !r->decoding && sliceable(s, r);
    }
    return n;
}

/* The prompt chunk that runs in slices this step (NULL: every chunk
 * runs through all layers in the step's batch): the one part way through,
 * else the step's chunk when a stream decodes beside it (always with
 * o.slice_units); plan gave no other chunk rows then. */
static sched_req_t *slice_pick(sched_t *s, bool *dec)
{
    sched_req_t *pick = NULL;
    *dec = false;
    for (sched_req_t *r = s->running; r; r = r->next) {
        *dec |= r->step_rows > 0 && r->decoding;
        if (!pick && r->step_rows > 0 && !r->decoding && sliceable(s, r))
            pick = r;
    }
    /* a chunk cut with nothing decoding (idle_chunk) is longer than the
     * residual buffer: recut cuts the rest again before any step could
     * slice it, and a chunk that is longer all the same runs whole */
    if (!pick || (s->o.slice_budget <= 0 && s->o.slice_units <= 0) ||
        (!s->slicing && !*dec && s->o.slice_units <= 0) || pick->step_rows > s->o.chunk)
        return NULL;
    return pick;
}

/* Recent times: the last ones weigh half. */
static void time_note(double *avg, double t) { *avg = *avg > 0 ? 0.5 * *avg + 0.5 * t : t; }

/* A decode-only step took t: t_dec becomes the median of the last
 * SCHED_DEC_RING (an EMA followed the host's stalls: on the full ds2-lite
 * at load 9 it swung from ~50 to ~300 ms, and the slices' budget with it). */
static void dec_note(sched_t *s, double t)
{
    s->dec_ring[s->dec_i] = t;
    s->dec_i = (s->dec_i + 1) % SCHED_DEC_RING;
    s->dec_n += s->dec_n < SCHED_DEC_RING;
    const int n = s->dec_n;
    double v[SCHED_DEC_RING];
    memcpy(v, s->dec_ring, (size_t)n * sizeof *v);
    for (int i = 1; i < n; i++) /* insertion sort of a few */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            const double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    s->t_dec = v[n / 2];
}

/* Kinds of work in a slice, each with its own cost per unit of work
 * (c_unit): the half layers (model_slice_units; the last one with and
 * without the row that wants logits), and a part of a deepseek2
 * attention unit's expansion of the earlier positions run ahead of it
 * (model_slice_expand). */
enum { UNIT_ATTN, UNIT_FFN, UNIT_LAST, UNIT_LAST_OUT, UNIT_EXPAND, UNIT_KINDS };
_Static_assert(UNIT_KINDS == SCHED_UNIT_KINDS, "sched_t.c_unit has a cost per kind");

static int unit_kind(const sched_t *s, int u, bool out)
{
    return u < s->n_units - 1 ? (u & 1 ? UNIT_FFN : UNIT_ATTN) : out ? UNIT_LAST_OUT : UNIT_LAST;
}

/* Keys' worth of a row's projections (Q, the latent, the output): an
 * attention half at depth 0 still costs a few ms a chunk. */
#define SLICE_ATTN_FIXED_KEYS 1024
/* Fewest positions of an expansion part (a few ms at most). */
#define SLICE_EXPAND_MIN 128

/* What a kind of work for a chunk of rows rows, past earlier positions
 * (n: the positions of an expansion part), costs in the kind's units:
 * the attention half grows with rows x keys, the FFN with the rows, the
 * last layer (K/V of every row, and with logits the attention of one
 * row, expanding every key) with rows and keys. At depth one attention
 * half costs several FFN halves (126 rows at ~3.4k keys on ds2-lite:
 * ~60 ms against ~40), which one average over all units under-predicted. */
static double unit_work(int kind, int rows, int past, int n)
{
    switch (kind) {
    case UNIT_ATTN: return (double)rows * (double)(past + rows + SLICE_ATTN_FIXED_KEYS);
    case UNIT_FFN: return (double)rows;
    case UNIT_EXPAND: return (double)n;
    default: return (double)(rows + past + rows);
    }
}

/* Predicted seconds (0: the kind not timed yet). */
static double unit_predict(const sched_t *s, int kind, int rows, int past, int n)
{
    return s->c_unit[kind] * unit_work(kind, rows, past, n);
}

/* The slice's budget in seconds: (budget - 1) decode steps; 0 when not
 * known yet or not by budget (one unit, or o.slice_units). */
static double slice_budget_s(const sched_t *s, bool dec)
{
    return dec && s->o.slice_units <= 0 && s->t_dec > 0 ? (s->o.slice_budget - 1) * s->t_dec : 0;
}

/* Positions of the next expansion part of unit u (0: none): o.slice_expand
 * with o.slice_units, else as many as the time left fits (at least
 * SLICE_EXPAND_MIN, all when the kind has no time yet or less than a
 * quarter would be left). */
static int expand_part(const sched_t *s, int keys, int done, double left)
{
    const int rest = keys - done;
    if (rest <= 0 || (s->o.slice_units > 0 && s->o.slice_expand <= 0))
        return 0;
    if (s->o.slice_units > 0)
        return s->o.slice_expand < rest ? s->o.slice_expand : rest;
    const double c = s->c_unit[UNIT_EXPAND];
    const double fit = c > 0 && left > 0 ? left / c : c > 0 ? 0 : rest;
    const int n = fit > rest ? rest : fit < SLICE_EXPAND_MIN ? SLICE_EXPAND_MIN : (int)fit;
    /* a tail under a quarter joins this part rather than take a step */
    return n < rest && 4 * (rest - n) >= rest ? n : rest;
}

/* The next slice of r's chunk, its rows at rows[0 ..): true when it was
 * the last (the chunk is computed, logits in out if its last row wants
 * them). Work: o.slice_units units at once (after the expansion parts of
 * o.slice_expand positions, one a slice, of its first unit); else all
 * units left when nothing decodes; else one piece at a time (a unit, or
 * a part of the expansion ahead of an attention unit) while the next
 * one's predicted time still fits the budget (at least one piece; a kind
 * with no time yet runs first or not at all), each timed for its kind. */
static ecs_err_t slice_run(sched_t *s, sched_req_t *r, bool dec, model_row_t *rows, float *out,
                           bool *done)
{
    if (s->slicing != r) { /* a new chunk: nothing of another is kept */
        s->slicing = r;
        s->slice_u = 0;
        model_slice_expand_drop(s->m);
    }
    const int R = r->step_rows, P = model_ctx_n_past(r->ctx), u_first = s->slice_u;
    const bool want_out = rows[R - 1].want_logits;
    const int left = s->n_units - s->slice_u;
    const int whole = s->o.slice_units > 0 ? (s->o.slice_units < left ? s->o.slice_units : left)
                      : !dec                 ? left
                                             : 0; /* 0: a piece at a time, by the budget */
    const double budget = slice_budget_s(s, dec), t0 = sched_now();
    bool first = true;
    for (double t = t0;; first = false) {
        const int u = s->slice_u;
        int x0 = 0;
        const int keys =
            !dec && s->o.slice_units <= 0 ? 0 : model_slice_expand_keys(s->m, rows, R, u, &x0);
        const int nx = expand_part(s, keys, x0, budget - (t - t0));
        const int k = nx > 0 ? 0 : whole > 0 ? whole : 1;
        const int kind = nx > 0 ? UNIT_EXPAND : unit_kind(s, u, want_out);
        const double pred = unit_predict(s, kind, R, P, nx);
        if (!first && (whole > 0 || pred <= 0 || t - t0 + pred > budget))
            break;
        const ecs_err_t e = nx > 0 ? model_slice_expand(s->m, rows, R, u, x0, x0 + nx)
                                   : model_eval_slice(s->m, rows, R, u, u + k, s->slice_resid, out);
        if (e != ECS_OK)
            return e;
        const double t1 = sched_now();
        if (k <= 1)
            time_note(&s->c_unit[kind], (t1 - t) / unit_work(kind, R, P, nx));
        if (s->slice_log)
            fprintf(stderr, "slice: unit %d%s %s rows %d past %d%s: %.1f ms (predicted %.1f, "
                    "budget %.1f, decode step %.1f)\n", u, k > 1 ? "+" : "",
                    (const char *[]){"attn", "ffn", "last", "last+out", "expand"}[kind], R, P,
                    nx > 0 ? " part" : "", (t1 - t) * 1e3, pred * 1e3, budget * 1e3,
                    s->t_dec * 1e3);
        t = t1;
        s->slice_u += k;
        if (s->slice_u == s->n_units || (whole > 0 && k > 0))
            break;
    }
    *done = s->slice_u == s->n_units;
    if (*done)
        s->slicing = NULL;
    if (u_first > 0 || !*done) {
        pthread_mutex_lock(&s->mu);
        s->stats.prefill_slices++;
        pthread_mutex_unlock(&s->mu);
    }
    return ECS_OK;
}

/* r's prompt chunk has gone through the whole model. */
static void chunk_done(sched_req_t *r)
{
    r->n_fed += chunk_len(r);
    r->chunk_i++;
    if (r->chunk_i == r->n_chunks && r->n_gen > 0) /* recomputed: re-feed the rest */
        r->decoding = true;
}

/* Rows of r's prompt chunk from rows[n]; the count. */
static int chunk_rows(sched_t *s, sched_req_t *r, int n)
{
    const int c = r->step_rows;
    const bool final = r->chunk_i + 1 == r->n_chunks;
    for (int j = 0; j < c; j++) {
        s->rows[n + j] = (model_row_t){r->ctx, r->p.prompt[r->n_fed + j],
                                       final && j + 1 == c && r->n_gen == 0};
        s->row_req[n + j] = r;
    }
    return c;
}

static void step_failed(sched_t *s, sched_req_t **req, int n)
{
    char msg[200];
    snprintf(msg, sizeof msg, "model step failed: %s", ecs_errmsg());
    for (int i = 0; i < n; i++)
        if (i == 0 || req[i] != req[i - 1])
            if (req[i]->slot >= 0)
                finish(s, req[i], SCHED_FINISH_ERROR, msg);
}

static void step(sched_t *s)
{
    for (sched_req_t *r = s->running, *next; r; r = next) {
        next = r->next;
        if (atomic_load(&r->cancel))
            finish(s, r, SCHED_FINISH_CANCELLED, NULL);
    }
    if (plan(s) == 0)
        return;
    bool dec;
    sched_req_t *sl = slice_pick(s, &dec);
    int n = 0, n_prompt_rows = 0;
    bool dec_only = true; /* no re-fed chunk: the step times a decode step */
    for (sched_req_t *r = s->running; r; r = r->next)
        if (r->step_rows && r->decoding) {
            dec_only &= !replaying(r);
            /* after a preemption: a chunk of generated tokens, the last
             * one's logits giving the next token; else the next token */
            for (int j = 0, g = r->replay; j < r->step_rows; j++, g++) {
                const bool rp = replaying(r);
                s->rows[n] = (model_row_t){r->ctx, rp ? r->gen[g] : r->next_tok,
                                           !rp || g + 1 == r->replay_end};
                s->row_req[n++] = r;
            }
        }
    for (sched_req_t *r = s->running; r; r = r->next)
        if (r->step_rows && !r->decoding && r != sl) {
            const int c = chunk_rows(s, r, n);
            n += c;
            n_prompt_rows += c;
        }
    int n_out = 0;
    if (n > 0) {
        const double t0 = sched_now();
        if (model_eval_batch(s->m, s->rows, n, s->logits) != ECS_OK) {
            step_failed(s, s->row_req, n);
            return;
        }
        const double t1 = sched_now();
        if (dec_only && n_prompt_rows == 0)
            dec_note(s, t1 - t0);
        if (s->slice_log) {
            pthread_mutex_lock(&s->mu);
            const int n_wait = s->n_waiting;
            pthread_mutex_unlock(&s->mu);
            fprintf(stderr, "step: %d rows (%d prompt), %d waiting: %.1f ms at %.3f s\n", n,
                    n_prompt_rows, n_wait, (t1 - t0) * 1e3, t1);
        }
        for (int i = 0; i < n; i++)
            n_out += s->rows[i].want_logits;
    }
    bool sl_done = false;
    if (sl) {
        const int c = chunk_rows(s, sl, n);
        if (slice_run(s, sl, dec, s->rows + n, s->logits + (size_t)n_out * (size_t)s->n_vocab,
                      &sl_done) != ECS_OK) {
            step_failed(s, s->row_req + n, c);
            sl = NULL;
        } else if (sl_done) {
            n += c;
            n_prompt_rows += c;
        }
    }
    int n_re_tok = 0, n_re_req = 0;
    for (int i = 0; i < n; i++) {
        sched_req_t *r = s->row_req[i];
        if (i > 0 && s->row_req[i - 1] == r)
            continue;
        if (r->decoding) {
            if (replaying(r)) {
                r->replay += r->step_rows;
                n_re_tok += r->step_rows;
                n_re_req++;
            }
        } else {
            chunk_done(r);
        }
        sched_kv_publish(s, r);
    }
    pthread_mutex_lock(&s->mu);
    s->stats.steps++;
    s->stats.prompt_tokens += (uint64_t)n_prompt_rows;
    s->stats.recomputed_tokens += (uint64_t)n_re_tok;
    s->stats.recompute_steps += (uint64_t)n_re_req;
    pthread_mutex_unlock(&s->mu);
    /* each row's logprobs and draw (~0.2 ms for a 100k vocabulary) on the
     * pool, idle between steps: a step of 8 streams spends ~0.8 ms on them
     * with two threads (serially, with libm's exp, it was ~4 ms) */
    int n_pick = 0;
    for (int i = 0; i < n; i++)
        if (s->rows[i].want_logits) {
            s->picks[n_pick] = (sched_pick_t){.r = s->row_req[i],
                                              .l = s->logits + (size_t)n_pick * (size_t)s->n_vocab};
            n_pick++;
        }
    kcpu_par_for(model_threadpool(s->m), n_pick, pick_item, s);
    for (int j = 0; j < n_pick; j++)
        on_pick(s, &s->picks[j]);
}

/* One prompt chunk (the largest: idle_chunk) and one decode row on a
 * sequence of free blocks, so the scheduler thread's kernel scratch is
 * grown before the first request; the blocks come back unpublished. */
static ecs_err_t warm_up(sched_t *s)
{
    sched_req_t r = {.slot = -1};
    const int most = s->o.idle_chunk > s->o.chunk ? s->o.idle_chunk : s->o.chunk;
    int n = most < s->o.n_ctx - 1 ? most : s->o.n_ctx - 1;
    r.slot = s->ctx_free[--s->n_ctx_free];
    r.ctx = s->ctxs[r.slot];
    ecs_err_t e = sched_kv_reserve(s, &r, n + 1)
                      ? ECS_OK
                      : ecs_error(ECS_ERR_NOMEM, "sched: no KV blocks for the warm-up");
    for (int i = 0; i < n; i++)
        s->rows[i] = (model_row_t){r.ctx, i % s->n_vocab, i + 1 == n};
    if (e == ECS_OK && n > 0)
        e = model_eval_batch(s->m, s->rows, n, s->logits);
    if (e == ECS_OK) {
        s->rows[0] = (model_row_t){r.ctx, 0, true};
        e = model_eval_batch(s->m, s->rows, 1, s->logits);
    }
    sched_kv_release(s, &r);
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
        pthread_mutex_lock(&s->mu);
        kv_stats_locked(s);
        pthread_mutex_unlock(&s->mu);
        notify(s);
        pthread_mutex_lock(&s->mu);
    }
    /* shutting down: every request ends, cancelled */
    pthread_mutex_unlock(&s->mu);
    while (s->running)
        finish(s, s->running, SCHED_FINISH_CANCELLED, NULL);
    pthread_mutex_lock(&s->mu);
    kv_stats_locked(s);
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
