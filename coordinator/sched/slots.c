/* slots.c - the KV slots and the prefix cache that lives in them.
 *
 * A slot is one whole-context KV cache made at start-up. When a request
 * ends its slot keeps what it computed (the token ids are recorded next to
 * it), so a later request whose prompt starts the same way truncates the
 * slot to the shared prefix and computes only the rest. A waiting request
 * takes the free slot with the longest usable prefix, else the one used
 * longest ago (LRU eviction).
 *
 * Reuse never changes a request's tokens. Qwen3-MoE's attention is
 * batch-invariant, so any cached row serves. deepseek2 rows depend on
 * whether their step attended in the expanded form (MODEL_MLA_EXPAND_ROWS
 * rows of the sequence or more): a cold prompt of n >= 64 tokens runs every
 * row expanded, so only rows that were themselves computed expanded (the
 * prompt rows of a prompt of at least 64 tokens) are reused, and at least
 * 64 rows are left to compute so the rest runs expanded too; a shorter
 * prompt reuses nothing. */
#include <stdlib.h>

#include "sched_int.h"

ecs_err_t sched_slots_init(sched_t *s)
{
    size_t n = (size_t)s->n_slots;
    s->slot_toks = calloc(n, sizeof *s->slot_toks);
    s->slot_n = calloc(n, sizeof *s->slot_n);
    s->slot_exp = calloc(n, sizeof *s->slot_exp);
    s->slot_used = calloc(n, sizeof *s->slot_used);
    s->slot_busy = calloc(n, sizeof *s->slot_busy);
    if (!s->slot_toks || !s->slot_n || !s->slot_exp || !s->slot_used || !s->slot_busy)
        return ecs_error(ECS_ERR_NOMEM, "sched: out of memory");
    for (size_t i = 0; i < n; i++)
        if (!(s->slot_toks[i] = malloc((size_t)s->o.n_ctx * sizeof **s->slot_toks)))
            return ecs_error(ECS_ERR_NOMEM, "sched: out of memory");
    s->n_free = s->n_slots;
    s->mla = model_hparams(s->m)->arch == ARCH_DEEPSEEK2;
    return ECS_OK;
}

void sched_slots_free(sched_t *s)
{
    for (int i = 0; s->slot_toks && i < s->n_slots; i++)
        free(s->slot_toks[i]);
    free(s->slot_toks);
    free(s->slot_n);
    free(s->slot_exp);
    free(s->slot_used);
    free(s->slot_busy);
}

/* Cached rows of slot i that request r may take over. */
static int usable(const sched_t *s, int i, const sched_req_t *r)
{
    int n = r->p.n_prompt, lim;
    if (!s->o.prefix_cache)
        return 0;
    if (s->mla) {
        if (n < MODEL_MLA_EXPAND_ROWS)
            return 0;
        lim = s->slot_exp[i] < n - MODEL_MLA_EXPAND_ROWS ? s->slot_exp[i] : n - MODEL_MLA_EXPAND_ROWS;
    } else {
        lim = s->slot_n[i] < n - 1 ? s->slot_n[i] : n - 1;
    }
    const int32_t *a = s->slot_toks[i], *b = r->p.prompt;
    int c = 0;
    while (c < lim && a[c] == b[c])
        c++;
    return c;
}

void sched_slot_take(sched_t *s, sched_req_t *r)
{
    int best = -1, best_u = -1;
    for (int i = 0; i < s->n_slots; i++) {
        if (s->slot_busy[i])
            continue;
        int u = usable(s, i, r);
        if (u > best_u || (u == best_u && s->slot_used[i] < s->slot_used[best]))
            best = i, best_u = u;
    }
    s->slot_busy[best] = true;
    s->n_free--;
    r->slot = best;
    if (model_ctx_truncate(s->slots[best], best_u) != ECS_OK) { /* cannot happen: be safe */
        model_ctx_reset(s->slots[best]);
        best_u = 0;
    }
    s->slot_n[best] = best_u;
    if (s->slot_exp[best] > best_u)
        s->slot_exp[best] = best_u;
    r->n_fed = r->n_cached = best_u;
    r->chunk_i = 0;
    r->n_chunks = (r->p.n_prompt - best_u + s->o.chunk - 1) / s->o.chunk;
    s->stats.prefix_hit_tokens += (uint64_t)best_u;
    s->stats.prefix_lookup_tokens += (uint64_t)r->p.n_prompt;
}

void sched_slot_give_back(sched_t *s, sched_req_t *r, bool keep)
{
    int i = r->slot;
    model_ctx_t *c = s->slots[i];
    if (!keep || !s->o.prefix_cache)
        model_ctx_reset(c);
    int n = model_ctx_n_past(c);
    s->slot_n[i] = n;
    if (s->mla)
        s->slot_exp[i] = r->p.n_prompt >= MODEL_MLA_EXPAND_ROWS ? (r->n_fed < n ? r->n_fed : n) : 0;
    else
        s->slot_exp[i] = n;
    s->slot_used[i] = ++s->tick;
    s->slot_busy[i] = false;
    s->n_free++;
    r->slot = -1;
}
