/* kv.c - the scheduler's paged KV: one pool of MODEL_KV_BLOCK-token blocks
 * made at start-up, a block table per running request that grows block by
 * block, and the prefix cache of full blocks (coordinator/kvcache keeps
 * the refcounts, keys and LRU order; the tokens of each published block
 * are kept here and compared on every hit).
 *
 * Keys chain over the model identity (the GGUF fingerprint and the cache's
 * row layout) and each block's token ids, so a block is found only after
 * its whole prefix. Shared blocks are full and never written: a request
 * that takes k cached blocks starts computing at position k * 64.
 *
 * Reuse never changes a request's tokens. Qwen3-MoE's attention is
 * batch-invariant: any full block serves, prompt or generated. A deepseek2
 * row depends on whether its step attended in the expanded form (at least
 * MODEL_MLA_EXPAND_ROWS rows of its sequence): a prompt of n >= 64 tokens
 * computes all its rows so, whatever the cut, so only blocks of such
 * prompts' rows are published, and a hit leaves at least 64 prompt rows
 * to compute so that they run expanded as in a cold run; a shorter prompt
 * reuses and publishes nothing. */
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "sched_int.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        ecs_err_t e_ = (expr);                                                                     \
        if (e_ != ECS_OK)                                                                          \
            return e_;                                                                             \
    } while (0)

int sched_blocks_for(int n) { return (n + MODEL_KV_BLOCK - 1) / MODEL_KV_BLOCK; }

int32_t sched_req_token(const sched_req_t *r, int p)
{
    return p < r->p.n_prompt ? r->p.prompt[p] : r->gen[p - r->p.n_prompt];
}

/* The chain's root: the model fingerprint and the rows' layout (their
 * type too: F16 and BF16 blocks have the same size). */
static uint64_t identity(const sched_t *s)
{
    uint8_t fp[GGUF_FINGERPRINT_BYTES];
    gguf_fingerprint(model_gguf(s->m), fp);
    uint64_t geo[3] = {s->block_bytes, MODEL_KV_BLOCK, s->o.kv_flag};
    return ecs_hash64(geo, sizeof geo, ecs_hash64(fp, sizeof fp, 0x6b76));
}

ecs_err_t sched_kv_init(sched_t *s)
{
    s->mla = model_hparams(s->m)->arch == ARCH_DEEPSEEK2;
    s->block_bytes = model_kv_block_bytes(s->m, s->o.kv_flag);
    s->seed = identity(s);
    const size_t nb = (size_t)s->n_blocks;
    s->blk_toks = malloc(nb * MODEL_KV_BLOCK * sizeof *s->blk_toks);
    s->blk_parent = calloc(nb, sizeof *s->blk_parent);
    s->ctxs = calloc((size_t)s->o.max_running, sizeof *s->ctxs);
    s->ctx_free = malloc((size_t)s->o.max_running * sizeof *s->ctx_free);
    if (!s->blk_toks || !s->blk_parent || !s->ctxs || !s->ctx_free)
        return ecs_error(ECS_ERR_NOMEM, "sched: out of memory");
    TRY(model_kvpool_new(s->m, s->n_blocks, s->o.kv_flag, &s->pool));
    TRY(kvc_new(s->n_blocks, &s->kvc));
    for (int i = s->o.max_running - 1; i >= 0; i--) {
        TRY(model_ctx_new_paged(s->pool, s->o.n_ctx, &s->ctxs[i]));
        s->ctx_free[s->n_ctx_free++] = i;
    }
    return ECS_OK;
}

void sched_kv_free(sched_t *s)
{
    for (int i = 0; s->ctxs && i < s->o.max_running; i++)
        model_ctx_free(s->ctxs[i]);
    free(s->ctxs);
    free(s->ctx_free);
    kvc_free(s->kvc);
    model_kvpool_free(s->pool);
    free(s->blk_toks);
    free(s->blk_parent);
}

/* Tokens of r's prompt a cached prefix may cover (see the file comment). */
static int reuse_limit(const sched_t *s, const sched_req_t *r)
{
    const int n = r->p.n_prompt;
    if (!s->o.prefix_cache)
        return 0;
    if (s->mla)
        return n >= MODEL_MLA_EXPAND_ROWS ? n - MODEL_MLA_EXPAND_ROWS : 0;
    return n - 1;
}

/* Block b published under key after parent, holding toks? */
static bool block_holds(const sched_t *s, int b, uint64_t parent, const int32_t *toks)
{
    return s->blk_parent[b] == parent &&
           !memcmp(s->blk_toks + (size_t)b * MODEL_KV_BLOCK, toks, MODEL_KV_BLOCK * sizeof *toks);
}

int sched_chunk_for(const sched_t *s, int rest)
{
    bool dec = s->o.slice_units > 0;
    for (const sched_req_t *q = s->running; q && !dec; q = q->next)
        dec = q->decoding;
    if (!dec)
        return s->o.idle_chunk > 0 ? s->o.idle_chunk : s->o.chunk;
    if (s->o.slice_chunk <= 0 || rest <= s->o.chunk ||
        (s->o.slice_budget <= 0 && s->o.slice_units <= 0))
        return s->o.chunk;
    return s->o.slice_chunk;
}

bool sched_kv_admit(sched_t *s, sched_req_t *r)
{
    if (s->n_ctx_free == 0)
        return false;
    const int limit = reuse_limit(s, r);
    int32_t *tab = model_ctx_table(s->ctxs[s->ctx_free[s->n_ctx_free - 1]]);
    int k = 0;
    uint64_t key = s->seed;
    while ((k + 1) * MODEL_KV_BLOCK <= limit) {
        const int32_t *toks = r->p.prompt + (size_t)k * MODEL_KV_BLOCK;
        const uint64_t next = kvc_chain(key, toks, MODEL_KV_BLOCK);
        const int b = kvc_lookup(s->kvc, next);
        if (b < 0 || !block_holds(s, b, key, toks))
            break;
        kvc_ref(s->kvc, b);
        tab[k++] = b;
        key = next;
    }
    const int start = k * MODEL_KV_BLOCK, rest = r->p.n_prompt - start;
    const int chunk = sched_chunk_for(s, rest);
    const int n_chunks = (rest + chunk - 1) / chunk;
    const int first = rest / n_chunks + (rest % n_chunks > 0);
    if (kvc_n_available(s->kvc) < sched_blocks_for(start + first) - k) {
        for (int i = 0; i < k; i++)
            kvc_unref(s->kvc, tab[i]);
        return false;
    }
    r->slot = s->ctx_free[--s->n_ctx_free];
    r->ctx = s->ctxs[r->slot];
    r->n_blk = r->n_pub = k;
    r->pub_key = key;
    model_ctx_set_blocks(r->ctx, k, start);
    r->n_fed = r->n_start = start;
    r->chunk_i = 0;
    r->n_chunks = n_chunks;
    r->rest0 = rest;
    r->cut = chunk;
    r->decoding = false;
    r->replay = 0;
    if (!r->admitted_once) { /* a recomputation is not a new lookup */
        r->admitted_once = true;
        r->n_cached = start;
        pthread_mutex_lock(&s->mu);
        s->stats.prefix_hit_tokens += (uint64_t)start;
        s->stats.prefix_lookup_tokens += (uint64_t)r->p.n_prompt;
        pthread_mutex_unlock(&s->mu);
    }
    return true;
}

bool sched_kv_reserve(sched_t *s, sched_req_t *r, int upto)
{
    int32_t *tab = model_ctx_table(r->ctx);
    bool ok = true;
    while (r->n_blk * MODEL_KV_BLOCK < upto) {
        const int b = kvc_alloc(s->kvc);
        if (b < 0) {
            ok = false;
            break;
        }
        tab[r->n_blk++] = b;
    }
    model_ctx_set_blocks(r->ctx, r->n_blk, model_ctx_n_past(r->ctx));
    return ok;
}

void sched_kv_release(sched_t *s, sched_req_t *r)
{
    if (r->slot < 0)
        return;
    const int32_t *tab = model_ctx_table(r->ctx);
    for (int i = 0; i < r->n_blk; i++)
        kvc_unref(s->kvc, tab[i]);
    r->n_blk = r->n_pub = 0;
    model_ctx_set_blocks(r->ctx, 0, 0);
    s->ctx_free[s->n_ctx_free++] = r->slot;
    r->slot = -1;
    r->ctx = NULL;
}

void sched_kv_publish(sched_t *s, sched_req_t *r)
{
    if (!s->o.prefix_cache)
        return;
    int done = model_ctx_n_past(r->ctx);
    if (s->mla)
        done = r->p.n_prompt < MODEL_MLA_EXPAND_ROWS ? 0 : done < r->p.n_prompt ? done : r->p.n_prompt;
    const int32_t *tab = model_ctx_table(r->ctx);
    while ((r->n_pub + 1) * MODEL_KV_BLOCK <= done) {
        int32_t toks[MODEL_KV_BLOCK];
        for (int i = 0; i < MODEL_KV_BLOCK; i++)
            toks[i] = sched_req_token(r, r->n_pub * MODEL_KV_BLOCK + i);
        const uint64_t key = kvc_chain(r->pub_key, toks, MODEL_KV_BLOCK);
        const int b = tab[r->n_pub];
        if (kvc_publish(s->kvc, b, key)) { /* else an equal block is cached already */
            memcpy(s->blk_toks + (size_t)b * MODEL_KV_BLOCK, toks, sizeof toks);
            s->blk_parent[b] = r->pub_key;
        }
        r->pub_key = key;
        r->n_pub++;
    }
}
