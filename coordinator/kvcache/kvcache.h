/* kvcache.h - the bookkeeping of a paged KV pool: which blocks are free,
 * who references them, and the prefix cache of full blocks.
 *
 * Contract:
 *   - Blocks are ids 0..n-1 (the memory is the model's, model_kvpool_t);
 *     this module never touches KV bytes, so it is a plain data structure
 *     that one thread (the scheduler) owns.
 *   - A block is free, referenced (refs > 0: part of running sequences), or
 *     cached: unreferenced but published under a key, kept for later
 *     prefixes and evicted least recently used when a block is needed.
 *   - A published block is full and immutable: its key is a hash chain
 *     (kvc_chain) over the model identity, every earlier block's tokens and
 *     its own, so equal keys mean equal prefixes; the owner also keeps the
 *     tokens and checks them on lookup, so a hash collision cannot serve
 *     wrong rows.
 *   - Nothing allocates after kvc_new.
 *
 * Usage:
 *   kvc_new(n_blocks, &c);
 *   uint64_t h = kvc_chain(seed, toks, 64);      // first block's key
 *   int b = kvc_lookup(c, h);                    // cached? (then kvc_ref)
 *   b = kvc_alloc(c);                            // refs 1, -1: none left
 *   kvc_publish(c, b, h);                        // once the block is full
 *   kvc_unref(c, b);                             // cached (or free) again
 */
#ifndef ECS_KVCACHE_H
#define ECS_KVCACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

typedef struct kvc kvc_t;

ecs_err_t kvc_new(int n_blocks, kvc_t **out);
void kvc_free(kvc_t *c);

/* Key of a block holding toks[0, n) after the block whose key is parent
 * (the first block: parent = the model identity seed). */
uint64_t kvc_chain(uint64_t parent, const int32_t *toks, int n);

/* A block with one reference: a free one, else the least recently used
 * cached one (unpublished first); -1 when every block is referenced. */
int kvc_alloc(kvc_t *c);
void kvc_ref(kvc_t *c, int b);
/* Drops a reference; at zero the block is cached (if published) or free. */
void kvc_unref(kvc_t *c, int b);
/* Publishes full block b under key; false (nothing changes) when another
 * block already has that key or b has one. A free block published this way
 * (restored from disk) is cached as the least recently used: restore the
 * most recent first. */
bool kvc_publish(kvc_t *c, int b, uint64_t key);
/* A free block published under key as the least recently used cached
 * block (a block read back from disk: restore the most recent first); -1
 * when no block is free (nothing is evicted) or key is published. */
int kvc_restore(kvc_t *c, uint64_t key);
/* The block published under key, -1 if none; changes nothing. */
int kvc_find(const kvc_t *c, uint64_t key);
/* The published blocks into out[n_blocks], most recent first: the
 * referenced ones, then the cached ones from the most recently used;
 * returns how many. */
int kvc_recent(const kvc_t *c, int *out);
/* The block published under key, -1 if none; marks it recently used. */
int kvc_lookup(kvc_t *c, uint64_t key);
/* Whether b is published, and its key. */
bool kvc_key(const kvc_t *c, int b, uint64_t *key);
int kvc_refs(const kvc_t *c, int b);

int kvc_n_blocks(const kvc_t *c);
int kvc_n_used(const kvc_t *c);      /* referenced */
int kvc_n_cached(const kvc_t *c);    /* unreferenced, published */
int kvc_n_free(const kvc_t *c);      /* unreferenced, unpublished */
/* Blocks kvc_alloc can still hand out: free + cached. */
int kvc_n_available(const kvc_t *c);
uint64_t kvc_evictions(const kvc_t *c);

#endif
