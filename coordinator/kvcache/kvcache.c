/* kvcache.c - block states, refcounts, the key index (chained hash table
 * over block ids) and the LRU list of cached blocks (doubly linked through
 * block ids: alloc takes its head, unref appends, lookup moves a block to
 * the tail). */
#include "kvcache.h"

#include <stdlib.h>

#include "common/hash.h"

struct kvc {
    int n;
    int *refs;
    uint64_t *key;
    bool *published;
    int *hnext;        /* chain of a bucket */
    int *bucket;       /* [nbucket] first block of a chain, -1 */
    uint32_t nbucket;  /* power of two */
    int *prev, *next;  /* LRU list of cached blocks (refs 0, published) */
    int lru_head, lru_tail, n_cached;
    int *free_stack, n_free; /* refs 0, unpublished */
    int n_used;
    uint64_t evictions;
};

ecs_err_t kvc_new(int n_blocks, kvc_t **out)
{
    *out = NULL;
    if (n_blocks < 1)
        return ecs_error(ECS_ERR_RANGE, "kvcache: %d blocks", n_blocks);
    kvc_t *c = calloc(1, sizeof *c);
    if (!c)
        return ecs_error(ECS_ERR_NOMEM, "kvcache: out of memory");
    c->n = n_blocks;
    c->nbucket = 1;
    while (c->nbucket < (uint32_t)n_blocks * 2)
        c->nbucket <<= 1;
    const size_t n = (size_t)n_blocks;
    c->refs = calloc(n, sizeof *c->refs);
    c->key = calloc(n, sizeof *c->key);
    c->published = calloc(n, sizeof *c->published);
    c->hnext = malloc(n * sizeof *c->hnext);
    c->bucket = malloc(c->nbucket * sizeof *c->bucket);
    c->prev = malloc(n * sizeof *c->prev);
    c->next = malloc(n * sizeof *c->next);
    c->free_stack = malloc(n * sizeof *c->free_stack);
    if (!c->refs || !c->key || !c->published || !c->hnext || !c->bucket || !c->prev || !c->next ||
        !c->free_stack) {
        kvc_free(c);
        return ecs_error(ECS_ERR_NOMEM, "kvcache: out of memory");
    }
    for (uint32_t i = 0; i < c->nbucket; i++)
        c->bucket[i] = -1;
    for (int i = 0; i < n_blocks; i++) /* low ids first */
        c->free_stack[i] = n_blocks - 1 - i;
    c->n_free = n_blocks;
    c->lru_head = c->lru_tail = -1;
    *out = c;
    return ECS_OK;
}

void kvc_free(kvc_t *c)
{
    if (!c)
        return;
    free(c->refs);
    free(c->key);
    free(c->published);
    free(c->hnext);
    free(c->bucket);
    free(c->prev);
    free(c->next);
    free(c->free_stack);
    free(c);
}

uint64_t kvc_chain(uint64_t parent, const int32_t *toks, int n)
{
    return ecs_hash64(toks, (size_t)n * sizeof *toks, parent);
}

static uint32_t slot_of(const kvc_t *c, uint64_t key)
{
    return (uint32_t)(key ^ (key >> 32)) & (c->nbucket - 1);
}

static void lru_unlink(kvc_t *c, int b)
{
    if (c->prev[b] >= 0)
        c->next[c->prev[b]] = c->next[b];
    else
        c->lru_head = c->next[b];
    if (c->next[b] >= 0)
        c->prev[c->next[b]] = c->prev[b];
    else
        c->lru_tail = c->prev[b];
    c->n_cached--;
}

static void lru_append(kvc_t *c, int b)
{
    c->prev[b] = c->lru_tail;
    c->next[b] = -1;
    if (c->lru_tail >= 0)
        c->next[c->lru_tail] = b;
    else
        c->lru_head = b;
    c->lru_tail = b;
    c->n_cached++;
}

/* A restored block is older than anything used since the start, and the
 * restore goes most recent first: each one goes before the rest. */
static void lru_prepend(kvc_t *c, int b)
{
    c->prev[b] = -1;
    c->next[b] = c->lru_head;
    if (c->lru_head >= 0)
        c->prev[c->lru_head] = b;
    else
        c->lru_tail = b;
    c->lru_head = b;
    c->n_cached++;
}

static void unpublish(kvc_t *c, int b)
{
    for (int *p = &c->bucket[slot_of(c, c->key[b])]; *p >= 0; p = &c->hnext[*p])
        if (*p == b) {
            *p = c->hnext[b];
            break;
        }
    c->published[b] = false;
}

int kvc_alloc(kvc_t *c)
{
    int b;
    if (c->n_free > 0) {
        b = c->free_stack[--c->n_free];
    } else if (c->lru_head >= 0) {
        b = c->lru_head;
        lru_unlink(c, b);
        unpublish(c, b);
        c->evictions++;
    } else {
        return -1;
    }
    c->refs[b] = 1;
    c->n_used++;
    return b;
}

void kvc_ref(kvc_t *c, int b)
{
    if (c->refs[b]++ == 0) { /* a cached block taken back into use */
        lru_unlink(c, b);
        c->n_used++;
    }
}

void kvc_unref(kvc_t *c, int b)
{
    if (c->refs[b] <= 0 || --c->refs[b] > 0)
        return;
    c->n_used--;
    if (c->published[b])
        lru_append(c, b);
    else
        c->free_stack[c->n_free++] = b;
}

int kvc_lookup(kvc_t *c, uint64_t key)
{
    for (int b = c->bucket[slot_of(c, key)]; b >= 0; b = c->hnext[b])
        if (c->key[b] == key) {
            if (c->refs[b] == 0) { /* most recently used now */
                lru_unlink(c, b);
                lru_append(c, b);
            }
            return b;
        }
    return -1;
}

bool kvc_publish(kvc_t *c, int b, uint64_t key)
{
    if (c->published[b])
        return false;
    for (int i = c->bucket[slot_of(c, key)]; i >= 0; i = c->hnext[i])
        if (c->key[i] == key)
            return false;
    c->key[b] = key;
    c->published[b] = true;
    const uint32_t s = slot_of(c, key);
    c->hnext[b] = c->bucket[s];
    c->bucket[s] = b;
    if (c->refs[b] == 0) { /* published while free (restored from disk) */
        for (int i = 0; i < c->n_free; i++)
            if (c->free_stack[i] == b) {
                c->free_stack[i] = c->free_stack[--c->n_free];
                break;
            }
        lru_prepend(c, b);
    }
    return true;
}

int kvc_restore(kvc_t *c, uint64_t key)
{
    if (c->n_free == 0 || kvc_find(c, key) >= 0)
        return -1;
    const int b = c->free_stack[c->n_free - 1];
    kvc_publish(c, b, key);
    return b;
}

int kvc_find(const kvc_t *c, uint64_t key)
{
    for (int b = c->bucket[slot_of(c, key)]; b >= 0; b = c->hnext[b])
        if (c->key[b] == key)
            return b;
    return -1;
}

int kvc_recent(const kvc_t *c, int *out)
{
    int n = 0;
    for (int b = 0; b < c->n; b++)
        if (c->published[b] && c->refs[b] > 0)
            out[n++] = b;
    for (int b = c->lru_tail; b >= 0; b = c->prev[b])
        out[n++] = b;
    return n;
}

bool kvc_key(const kvc_t *c, int b, uint64_t *key)
{
    *key = c->key[b];
    return c->published[b];
}

int kvc_refs(const kvc_t *c, int b) { return c->refs[b]; }
int kvc_n_blocks(const kvc_t *c) { return c->n; }
int kvc_n_used(const kvc_t *c) { return c->n_used; }
int kvc_n_cached(const kvc_t *c) { return c->n_cached; }
int kvc_n_free(const kvc_t *c) { return c->n_free; }
int kvc_n_available(const kvc_t *c) { return c->n_free + c->n_cached; }
uint64_t kvc_evictions(const kvc_t *c) { return c->evictions; }
