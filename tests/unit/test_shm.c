/* test_shm.c - the same-host plane's segment and rings (proto/dplane/shm.c):
 * create / attach (the name is gone once attached), entries in order and
 * intact across many wraps with a producer that waits for room and a
 * consumer that sleeps, what can never fit, a corrupt entry or index seen
 * as ECS_ERR_FORMAT, and an abort that wakes a sleeper. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proto/dplane/dplane.h"

Test(shm, create_attach_unlink)
{
    dplane_shm_t *c, *w;
    cr_assert_eq(dplane_shm_create(8192, &c), ECS_OK, "%s", ecs_errmsg());
    char name[DPLANE_SHM_NAME];
    snprintf(name, sizeof name, "%s", dplane_shm_name(c));
    cr_assert_eq(dplane_shm_attached(c), 0);
    cr_assert_eq(dplane_shm_attach(name, &w), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(dplane_shm_attached(c), (uint32_t)getpid());
    cr_assert_eq(dplane_shm_ring_bytes(w), dplane_shm_ring_bytes(c));
    /* the worker unlinked it: nothing left in /dev/shm */
    cr_assert_lt(shm_open(name, O_RDWR, 0), 0);
    dplane_shm_t *x;
    cr_assert_eq(dplane_shm_attach(name, &x), ECS_ERR_IO);
    cr_assert_eq(dplane_shm_attach("no/slash", &x), ECS_ERR_INVAL);
    /* the pools' park words: two, the same memory seen from both sides,
     * each side's own the other's peer (the mappings differ) */
    _Atomic uint32_t *c_own = dplane_shm_pool_word(c, false), *c_peer = dplane_shm_pool_word(c, true);
    _Atomic uint32_t *w_own = dplane_shm_pool_word(w, false), *w_peer = dplane_shm_pool_word(w, true);
    cr_assert_neq(c_own, c_peer);
    atomic_fetch_add(c_own, 3);
    atomic_fetch_add(w_own, 5);
    cr_assert_eq(atomic_load(w_peer), 3);
    cr_assert_eq(atomic_load(c_peer), 5);
    dplane_shm_free(w);
    dplane_shm_free(c);
    /* a pool may bump them once more after the plane is gone: still mapped */
    atomic_fetch_add(c_own, 1);
    atomic_fetch_add(w_peer, 1);
    cr_assert_eq(atomic_load(c_own), 5);
}

Test(shm, never_fits)
{
    dplane_shm_t *c;
    cr_assert_eq(dplane_shm_create(4096, &c), ECS_OK);
    dplane_entry_t e;
    cr_assert_eq(dplane_ring_reserve(c, DPLANE_CALLS, 64, 4096, &e), ECS_ERR_RANGE);
    cr_assert_eq(dplane_ring_reserve(c, DPLANE_CALLS, 64, 1024, &e), ECS_OK);
    dplane_shm_free(c);
}

#define N_MSG 3000

typedef struct {
    dplane_shm_t *prod, *cons;
    int bad;
} pair_t;

static size_t msg_len(int i) { return (size_t)(i * 37) % 1500; }

static void *producer(void *arg)
{
    pair_t *p = arg;
    for (int i = 0; i < N_MSG; i++) {
        dplane_entry_t e;
        for (;;) {
            const uint32_t seen = dplane_ring_seq(p->prod, DPLANE_CALLS, true);
            const ecs_err_t rc = dplane_ring_reserve(p->prod, DPLANE_CALLS, 8, msg_len(i), &e);
            if (rc == ECS_OK)
                break;
            if (rc != ECS_ERR_NOMEM) {
                p->bad++;
                return NULL;
            }
            dplane_ring_wait(p->prod, DPLANE_CALLS, true, seen, 1000);
        }
        memcpy(e.frame, &i, sizeof i);
        memset(e.payload, i & 0xff, e.payload_len);
        dplane_ring_commit(p->prod, DPLANE_CALLS, &e, sizeof i);
    }
    return NULL;
}

Test(shm, order_and_content_across_wraps, .timeout = 60)
{
    pair_t p = {0};
    cr_assert_eq(dplane_shm_create(8192, &p.prod), ECS_OK);
    cr_assert_eq(dplane_shm_attach(dplane_shm_name(p.prod), &p.cons), ECS_OK);
    pthread_t th;
    pthread_create(&th, NULL, producer, &p);
    for (int i = 0; i < N_MSG; i++) {
        dplane_entry_t e;
        for (;;) {
            const uint32_t seen = dplane_ring_seq(p.cons, DPLANE_CALLS, false);
            const ecs_err_t rc = dplane_ring_peek(p.cons, DPLANE_CALLS, &e);
            if (rc == ECS_OK)
                break;
            cr_assert_eq(rc, ECS_ERR_NOTFOUND, "%s", ecs_errmsg());
            dplane_ring_wait(p.cons, DPLANE_CALLS, false, seen, 1000);
        }
        int got;
        cr_assert_eq(e.frame_len, sizeof got);
        memcpy(&got, e.frame, sizeof got);
        cr_assert_eq(got, i);
        cr_assert_eq(e.payload_len, msg_len(i));
        cr_assert_eq((uintptr_t)e.payload % 64, 0);
        for (size_t k = 0; k < e.payload_len; k++)
            if (e.payload[k] != (uint8_t)(i & 0xff))
                cr_assert_fail("message %d byte %zu", i, k);
        dplane_ring_release(p.cons, DPLANE_CALLS, &e);
    }
    pthread_join(th, NULL);
    cr_assert_eq(p.bad, 0);
    dplane_entry_t e;
    cr_assert_eq(dplane_ring_peek(p.cons, DPLANE_CALLS, &e), ECS_ERR_NOTFOUND);
    dplane_shm_free(p.cons);
    dplane_shm_free(p.prod);
}

Test(shm, corrupt_entry_is_format)
{
    dplane_shm_t *c, *w;
    cr_assert_eq(dplane_shm_create(4096, &c), ECS_OK);
    cr_assert_eq(dplane_shm_attach(dplane_shm_name(c), &w), ECS_OK);
    dplane_entry_t e;
    cr_assert_eq(dplane_ring_reserve(w, DPLANE_RESULTS, 16, 100, &e), ECS_OK);
    dplane_ring_commit(w, DPLANE_RESULTS, &e, 16);
    uint32_t *hdr = (uint32_t *)(e.frame - 16);
    const uint32_t good[4] = {hdr[0], hdr[1], hdr[2], hdr[3]};
    const uint32_t bad[][4] = {
        {good[0] * 4, good[1], good[2], good[3]},       /* beyond what was published */
        {good[0], 4096, good[2], good[3]},              /* frame over the payload */
        {good[0], good[1], good[2] + 1, good[3]},       /* payload misaligned */
        {good[0], good[1], good[2], good[0]},           /* payload past the entry */
        {good[0] + 1, good[1], good[2], good[3]},       /* size not a multiple of 64 */
        {8, UINT32_MAX, 0, 0},                          /* a wrap marker not at the end */
    };
    dplane_entry_t r;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memcpy(hdr, bad[i], sizeof bad[i]);
        cr_assert_eq(dplane_ring_peek(c, DPLANE_RESULTS, &r), ECS_ERR_FORMAT, "case %zu", i);
    }
    memcpy(hdr, good, sizeof good);
    cr_assert_eq(dplane_ring_peek(c, DPLANE_RESULTS, &r), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(r.payload_len, 100);
    dplane_shm_free(w);
    dplane_shm_free(c);
}

static void *sleeper(void *arg)
{
    dplane_shm_t *s = arg;
    const uint32_t seen = dplane_ring_seq(s, DPLANE_RESULTS, false);
    dplane_ring_wait(s, DPLANE_RESULTS, false, seen, -1); /* no limit: only the abort ends it */
    return NULL;
}

Test(shm, abort_wakes_sleeper, .timeout = 20)
{
    dplane_shm_t *c, *w;
    cr_assert_eq(dplane_shm_create(4096, &c), ECS_OK);
    cr_assert_eq(dplane_shm_attach(dplane_shm_name(c), &w), ECS_OK);
    pthread_t th;
    pthread_create(&th, NULL, sleeper, c);
    usleep(50000);
    dplane_shm_abort(w); /* the peer's side */
    pthread_join(th, NULL);
    cr_assert(dplane_shm_aborted(c));
    dplane_entry_t e;
    cr_assert_eq(dplane_ring_reserve(c, DPLANE_CALLS, 16, 0, &e), ECS_ERR_IO);
    dplane_shm_free(w);
    dplane_shm_free(c);
}
