/* test_kvcache.c - the KV block bookkeeping (coordinator/kvcache): blocks
 * handed out once, refcounts, every block back after release, published
 * blocks cached and found by key, LRU eviction of unreferenced cached
 * blocks only, duplicate keys refused; and the key chain: keys depend on
 * every earlier token, on the seed, and on order. */
#include <criterion/criterion.h>
#include <stdbool.h>

#include "coordinator/kvcache/kvcache.h"

static kvc_t *make(int n)
{
    kvc_t *c = NULL;
    cr_assert_eq(kvc_new(n, &c), ECS_OK, "%s", ecs_errmsg());
    return c;
}

Test(kvcache, blocks_are_handed_out_once_and_all_come_back)
{
    kvc_t *c = make(8);
    bool seen[8] = {false};
    int got[8];
    for (int i = 0; i < 8; i++) {
        got[i] = kvc_alloc(c);
        cr_assert(got[i] >= 0 && got[i] < 8);
        cr_assert(!seen[got[i]], "block %d handed out twice", got[i]);
        seen[got[i]] = true;
    }
    cr_assert_eq(kvc_alloc(c), -1, "none left");
    cr_assert_eq(kvc_n_used(c), 8);
    cr_assert_eq(kvc_n_available(c), 0);
    kvc_ref(c, got[3]);
    kvc_unref(c, got[3]);
    cr_assert_eq(kvc_refs(c, got[3]), 1, "a second reference keeps it");
    for (int i = 0; i < 8; i++)
        kvc_unref(c, got[i]);
    cr_assert_eq(kvc_n_used(c), 0);
    cr_assert_eq(kvc_n_free(c), 8);
    kvc_unref(c, got[0]); /* an extra unref changes nothing */
    cr_assert_eq(kvc_n_free(c), 8);
    kvc_free(c);
    cr_assert_eq(kvc_new(0, &c), ECS_ERR_RANGE);
}

Test(kvcache, published_blocks_are_cached_found_and_evicted_lru)
{
    kvc_t *c = make(3);
    int a = kvc_alloc(c), b = kvc_alloc(c), d = kvc_alloc(c);
    cr_assert(kvc_publish(c, a, 100));
    cr_assert(kvc_publish(c, b, 200));
    cr_assert(!kvc_publish(c, d, 100), "a key names one block");
    cr_assert(!kvc_publish(c, a, 300), "a block has one key");
    uint64_t k;
    cr_assert(kvc_key(c, a, &k) && k == 100);
    cr_assert(!kvc_key(c, d, &k));
    kvc_unref(c, a); /* cached, older */
    kvc_unref(c, b); /* cached, newer */
    kvc_unref(c, d); /* unpublished: free */
    cr_assert_eq(kvc_n_cached(c), 2);
    cr_assert_eq(kvc_n_free(c), 1);
    cr_assert_eq(kvc_n_available(c), 3);
    cr_assert_eq(kvc_lookup(c, 100), a);
    cr_assert_eq(kvc_lookup(c, 999), -1);
    /* the lookup made a the most recently used: b goes first, after the free one */
    cr_assert_eq(kvc_alloc(c), d, "free blocks before cached ones");
    cr_assert_eq(kvc_alloc(c), b, "then the least recently used cached one");
    cr_assert_eq(kvc_lookup(c, 200), -1, "an evicted block is forgotten");
    cr_assert_eq(kvc_evictions(c), 1);
    kvc_ref(c, a); /* a hit takes the cached block back into use */
    cr_assert_eq(kvc_n_cached(c), 0);
    cr_assert_eq(kvc_alloc(c), -1, "referenced blocks are never evicted");
    kvc_unref(c, a);
    cr_assert_eq(kvc_lookup(c, 100), a, "still cached after its last user");
    kvc_free(c);
}

Test(kvcache, a_free_block_can_be_published_as_cached)
{
    kvc_t *c = make(2);
    cr_assert(kvc_publish(c, 1, 42)); /* restored from disk */
    cr_assert_eq(kvc_n_free(c), 1);
    cr_assert_eq(kvc_n_cached(c), 1);
    cr_assert_eq(kvc_alloc(c), 0);
    cr_assert_eq(kvc_lookup(c, 42), 1);
    kvc_free(c);
}

Test(kvcache, key_chain_covers_the_whole_prefix)
{
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++)
        a[i] = b[i] = i * 3;
    const uint64_t ka = kvc_chain(7, a, 64);
    cr_assert_eq(ka, kvc_chain(7, b, 64), "same tokens, same key");
    cr_assert_neq(ka, kvc_chain(8, a, 64), "another seed (model)");
    b[63] = 1;
    cr_assert_neq(ka, kvc_chain(7, b, 64), "one token differs");
    b[63] = a[63];
    b[0] = a[1], b[1] = a[0];
    cr_assert_neq(ka, kvc_chain(7, b, 64), "order matters");
    /* the second block's key depends on the first block's tokens */
    const uint64_t k2 = kvc_chain(ka, a, 64), k2b = kvc_chain(kvc_chain(7, b, 64), a, 64);
    cr_assert_neq(k2, k2b);
}

Test(kvcache, recent_lists_in_use_then_cached_newest_first)
{
    kvc_t *c = make(5);
    int b[5];
    for (int i = 0; i < 5; i++) {
        b[i] = kvc_alloc(c);
        cr_assert(kvc_publish(c, b[i], 100 + (uint64_t)i));
    }
    kvc_unref(c, b[0]);
    kvc_unref(c, b[1]);
    kvc_unref(c, b[2]);
    cr_assert_eq(kvc_lookup(c, 100), b[0], "b0 now the most recently used cached");
    int out[5];
    cr_assert_eq(kvc_recent(c, out), 5);
    cr_assert(out[0] == b[3] && out[1] == b[4], "referenced first");
    cr_assert(out[2] == b[0] && out[3] == b[2] && out[4] == b[1], "then cached, newest first");
    cr_assert_eq(kvc_find(c, 101), b[1]);
    cr_assert_eq(kvc_find(c, 999), -1);
    int again[5];
    kvc_recent(c, again);
    cr_assert_arr_eq(out, again, sizeof out, "kvc_find changes no recency");
    kvc_free(c);
}

Test(kvcache, restored_blocks_are_older_than_used_ones_first_restored_newest)
{
    kvc_t *c = make(4);
    const int used = kvc_alloc(c);
    cr_assert(kvc_publish(c, used, 1));
    kvc_unref(c, used); /* cached before the restore: used since the start */
    const int r1 = kvc_restore(c, 10), r2 = kvc_restore(c, 20), r3 = kvc_restore(c, 30);
    cr_assert(r1 >= 0 && r2 >= 0 && r3 >= 0);
    cr_assert_eq(kvc_restore(c, 40), -1, "no free block: nothing evicted");
    cr_assert_eq(kvc_find(c, 1), used, "the used block stays");
    cr_assert_eq(kvc_n_cached(c), 4);
    cr_assert_eq(kvc_restore(c, 10), -1, "a published key is not restored twice");
    int out[4];
    cr_assert_eq(kvc_recent(c, out), 4);
    cr_assert(out[0] == used && out[1] == r1 && out[2] == r2 && out[3] == r3,
              "used, then restored in file order: %d %d %d %d", out[0], out[1], out[2], out[3]);
    cr_assert_eq(kvc_alloc(c), r3, "the last restored goes first");
    kvc_free(c);
}
