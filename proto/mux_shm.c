/* mux_shm.c - the coordinator's side of the same-host data plane: a call
 * goes straight from the submitting thread into the peer's call ring and
 * the waiting thread takes the results off the result ring itself, so a
 * layer's call crosses one thread boundary each way (the worker's serve
 * thread) instead of the mux I/O thread and two ZeroMQ I/O threads.
 *
 * Threads: any number submit (serialised by tx: the ring has one
 * producer), any number wait (serialised by rx: one consumer; the one that
 * drains completes everybody's calls and kicks the ring's publish word so
 * that the others wake and look). The call table of the plane (calls in
 * flight by request id) is under rx. A plane lives until its peer closes
 * and the last call sent on it is freed (refs). */
#include "mux_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/dplane/dplane.h"
#include "zutil.h"

#define SHM_HASH 256
#define SHM_RECENT 256
#define SHM_RESULT_FRAME 1024u /* room for a Result's header and body (a message < 256) */
#define SHM_WAIT_SLICE_MS 100  /* a sleeper looks at the deadline and the plane this often */
#define SHM_POOL 8             /* result buffers kept for reuse per plane */
#define SHM_BUF_HDR 64         /* before a pooled buffer's bytes: its size and plane */

struct mux_shm {
    dplane_shm_t *seg;
    atomic_int refs;
    pthread_mutex_t tx, rx;
    bool closed;                   /* under rx (and tx to send) */
    mux_call_t *table[SHM_HASH];   /* under rx */
    uint64_t recent[SHM_RECENT];   /* ids completed lately: a late reply is a duplicate */
    unsigned recent_pos;
    uint8_t *frame;                /* rx: the frame copied out of the ring to decode */
    size_t frame_cap;
    int peer;
    /* Result rows leave the ring in buffers kept here between calls: a
     * fresh allocation per result had glibc grow and trim the heap by the
     * result's size on every call (4 ms a 512 KiB round trip). A buffer
     * holds a reference to the plane while a caller has it. */
    pthread_mutex_t pool_mu;
    uint8_t *pool[SHM_POOL];
    int n_pool;
};

typedef struct {
    size_t cap;
    mux_shm_t *s;
} pool_hdr_t;

static void close_plane(mux_t *m, mux_shm_t *s, const char *why);

void mux_shm_put(mux_shm_t *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    dplane_shm_free(s->seg);
    pthread_mutex_destroy(&s->tx);
    pthread_mutex_destroy(&s->rx);
    for (int i = 0; i < s->n_pool; i++)
        free(s->pool[i]);
    pthread_mutex_destroy(&s->pool_mu);
    free(s->frame);
    free(s);
}

/* A buffer of at least n bytes (64-byte aligned) from the plane's pool, or
 * a new one; NULL when out of memory. */
static uint8_t *pool_get(mux_shm_t *s, size_t n)
{
    uint8_t *b = NULL;
    pthread_mutex_lock(&s->pool_mu);
    for (int i = 0; i < s->n_pool && !b; i++)
        if (((pool_hdr_t *)s->pool[i])->cap >= n) {
            b = s->pool[i];
            s->pool[i] = s->pool[--s->n_pool];
        }
    pthread_mutex_unlock(&s->pool_mu);
    if (!b) {
        const size_t cap = (n + 65535) / 65536 * 65536; /* a few sizes, reused */
        if (!(b = aligned_alloc(64, SHM_BUF_HDR + cap)))
            return NULL;
        *(pool_hdr_t *)b = (pool_hdr_t){.cap = cap, .s = s};
    }
    atomic_fetch_add(&s->refs, 1);
    return b + SHM_BUF_HDR;
}

/* zmq_msg_t's free function of a pooled buffer: back to the pool (or
 * freed when it is full), then the plane's reference goes. */
static void pool_put(void *data, void *hint)
{
    (void)hint;
    uint8_t *b = (uint8_t *)data - SHM_BUF_HDR;
    mux_shm_t *s = ((pool_hdr_t *)b)->s;
    pthread_mutex_lock(&s->pool_mu);
    if (s->n_pool < SHM_POOL) {
        s->pool[s->n_pool++] = b;
        b = NULL;
    }
    pthread_mutex_unlock(&s->pool_mu);
    free(b);
    mux_shm_put(s);
}

ecs_err_t mux_peer_set_shm(mux_t *m, int peer, struct dplane_shm *seg)
{
    peer_t *p = mux_get_peer(m, peer);
    if (!p || !atomic_load(&p->connected)) {
        dplane_shm_free(seg);
        return ecs_error(ECS_ERR_INVAL, "mux: peer %d is not connected", peer);
    }
    mux_shm_t *s = calloc(1, sizeof *s);
    if (!s) {
        dplane_shm_free(seg);
        return ecs_error(ECS_ERR_NOMEM, "mux: out of memory");
    }
    s->seg = seg;
    s->peer = peer;
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->tx, NULL);
    pthread_mutex_init(&s->rx, NULL);
    pthread_mutex_init(&s->pool_mu, NULL);
    dplane_shm_unlink(seg); /* attached: the name is needed no more */
    const char *sw = getenv("ECS_SHM_SHORT_WAKE");
    dplane_shm_short_wake(seg, sw && !strcmp(sw, "1"));
    pthread_mutex_lock(&m->lock);
    mux_shm_t *old = p->shm;
    p->shm = s;
    pthread_mutex_unlock(&m->lock);
    if (old)
        close_plane(m, old, "replaced");
    return ECS_OK;
}

/* The plane's table; called with rx held. */
static void put_call(mux_shm_t *s, mux_call_t *c)
{
    mux_call_t **b = &s->table[c->id % SHM_HASH];
    c->hnext = *b;
    *b = c;
}

/* remember: a later reply with this id is a duplicate (not for a call
 * that never left) */
static mux_call_t *take_call(mux_shm_t *s, uint64_t id, bool remember)
{
    for (mux_call_t **pp = &s->table[id % SHM_HASH]; *pp; pp = &(*pp)->hnext)
        if ((*pp)->id == id) {
            mux_call_t *c = *pp;
            *pp = c->hnext;
            if (remember)
                s->recent[s->recent_pos++ % SHM_RECENT] = id;
            return c;
        }
    return NULL;
}

/* Fails every call in flight on the plane and closes it; rx held. */
static void fail_all(mux_t *m, mux_shm_t *s, ecs_err_t err, const char *why)
{
    s->closed = true;
    for (int b = 0; b < SHM_HASH; b++)
        while (s->table[b]) {
            mux_call_t *c = s->table[b];
            s->table[b] = c->hnext;
            char msg[256];
            snprintf(msg, sizeof msg, "shared-memory plane: %s", why);
            mux_call_abort(m, c, err, msg);
        }
}

bool mux_shm_send(mux_t *m, peer_t *p, mux_call_t *c)
{
    if (m->net.on) /* the emulated network acts on ZeroMQ only: tests keep using it */
        return false;
    pthread_mutex_lock(&m->lock);
    mux_shm_t *s = p->shm;
    if (s)
        atomic_fetch_add(&s->refs, 1);
    pthread_mutex_unlock(&m->lock);
    if (!s)
        return false;
    const size_t hdr = zmq_msg_size(&c->hdr), pay = zmq_msg_size(&c->payload);
    const size_t res = (size_t)c->n_entries * wire_row_bytes(c->result_dtype, c->n_embd);
    const size_t half = dplane_shm_ring_bytes(s->seg) / 2;
    /* a call or result that would take over half a ring (a long prompt's)
     * goes on ZeroMQ: the ring stays free for the next step's calls */
    if (dplane_shm_entry_bytes(hdr, pay) > half ||
        dplane_shm_entry_bytes(SHM_RESULT_FRAME, res) > half) {
        mux_shm_put(s);
        return false;
    }
    c->shm = s; /* the call's reference from now on */
    pthread_mutex_lock(&s->rx);
    const bool closed = s->closed;
    if (!closed)
        put_call(s, c); /* before it is published: the result may come at once */
    pthread_mutex_unlock(&s->rx);
    dplane_entry_t e;
    ecs_err_t rc = ECS_ERR_IO;
    if (!closed) {
        pthread_mutex_lock(&s->tx);
        rc = dplane_ring_reserve(s->seg, DPLANE_CALLS, hdr, pay, &e);
        if (rc == ECS_OK) {
            memcpy(e.frame, zmq_msg_data(&c->hdr), hdr);
            if (pay)
                memcpy(e.payload, zmq_msg_data(&c->payload), pay);
            dplane_ring_commit(s->seg, DPLANE_CALLS, &e, hdr);
        }
        pthread_mutex_unlock(&s->tx);
    }
    if (rc == ECS_OK) {
        ADD(p->bytes_out, hdr + pay);
        ADD(p->calls_sent, 1);
        ADD(p->calls_shm, 1);
        return true;
    }
    /* full or gone: ZeroMQ takes it (the worker serves both) */
    bool mine = closed;
    if (!closed) {
        pthread_mutex_lock(&s->rx);
        mine = take_call(s, c->id, false) == c;
        pthread_mutex_unlock(&s->rx);
    }
    if (!mine) /* completed meanwhile by a close: nothing left to send */
        return true;
    c->shm = NULL;
    mux_shm_put(s);
    return false;
}

bool mux_peer_pool_words(mux_t *m, int peer, _Atomic uint32_t **own, _Atomic uint32_t **theirs)
{
    peer_t *p = mux_get_peer(m, peer);
    if (!p)
        return false;
    pthread_mutex_lock(&m->lock);
    mux_shm_t *s = p->shm;
    if (s) {
        *own = dplane_shm_pool_word(s->seg, false);
        *theirs = dplane_shm_pool_word(s->seg, true);
    }
    pthread_mutex_unlock(&m->lock);
    return s != NULL;
}

bool mux_shm_cancel(mux_t *m, mux_call_t *c)
{
    mux_shm_t *s = c->shm;
    if (!s)
        return false;
    pthread_mutex_lock(&s->rx);
    mux_call_t *t = take_call(s, c->id, true);
    if (t)
        mux_call_abort(m, t, ECS_ERR_IO, "cancelled: no reply in time");
    pthread_mutex_unlock(&s->rx);
    if (t) /* its waiter may sleep on the ring */
        dplane_ring_kick(s->seg, DPLANE_RESULTS);
    return true;
}

/* One result entry: decode a copy of its frame, match it, complete the
 * call. rx held. */
static void result_in(mux_t *m, mux_shm_t *s, peer_t *p, const dplane_entry_t *e)
{
    wire_msg_t w;
    ADD(p->bytes_in, e->frame_len + e->payload_len);
    ecs_err_t rc = dplane_entry_decode(e, &s->frame, &s->frame_cap, &w);
    if (rc == ECS_OK && w.kind != WIRE_RESULT && w.kind != WIRE_ERROR)
        rc = ecs_error(ECS_ERR_FORMAT, "unexpected %s on the shared-memory plane",
                       wire_kind_name(w.kind));
    const uint64_t id = w.kind == WIRE_ERROR ? w.error.request_id
                        : w.kind == WIRE_RESULT ? w.result.request_id : 0;
    mux_call_t *c = id ? take_call(s, id, true) : NULL;
    if (rc != ECS_OK) {
        ADD(p->bad_messages, 1);
        mux_set_last_error(m, p, ecs_errmsg());
        if (c) {
            char msg[256];
            snprintf(msg, sizeof msg, "bad reply: %s", ecs_errmsg());
            mux_call_abort(m, c, ECS_ERR_FORMAT, msg);
        }
        wire_msg_clear(&w);
        return;
    }
    if (!c) {
        bool dup = false;
        for (int i = 0; i < SHM_RECENT && !dup; i++)
            dup = s->recent[i] == id;
        mux_reply_unmatched(m, p, &w, dup);
        return;
    }
    /* the rows leave the ring now: the caller keeps them until release */
    zmq_msg_t rows;
    const size_t n = w.kind == WIRE_RESULT ? w.result.payload_bytes : 0;
    uint8_t *buf = n ? pool_get(s, n) : NULL;
    if (n && !buf) {
        wire_msg_clear(&w);
        mux_call_abort(m, c, ECS_ERR_NOMEM, "no memory for a result");
        return;
    }
    if (n) {
        memcpy(buf, e->payload, n);
        zmq_msg_init_data(&rows, buf, n, pool_put, NULL);
    } else {
        zmq_msg_init(&rows);
    }
    mux_reply_apply(m, p, c, &w, &rows);
    zmq_msg_close(&rows);
    mux_call_complete(m, c);
}

/* Takes every result published so far; rx held. */
static void drain(mux_t *m, mux_shm_t *s)
{
    peer_t *p = m->peers[s->peer];
    int done = 0;
    while (!s->closed) {
        dplane_entry_t e;
        const ecs_err_t rc = dplane_ring_peek(s->seg, DPLANE_RESULTS, &e);
        if (rc == ECS_ERR_NOTFOUND)
            break;
        if (rc != ECS_OK) { /* corrupt: the ring cannot be trusted again */
            ADD(p->bad_messages, 1);
            mux_set_last_error(m, p, ecs_errmsg());
            fprintf(stderr, "mux: peer %s: %s; the shared-memory plane is closed, ZeroMQ "
                    "carries its calls\n", p->endpoint, ecs_errmsg());
            fail_all(m, s, ECS_ERR_IO, "corrupt result ring");
            dplane_shm_abort(s->seg);
            break;
        }
        result_in(m, s, p, &e);
        dplane_ring_release(s->seg, DPLANE_RESULTS, &e);
        done++;
    }
    if (!s->closed && dplane_shm_aborted(s->seg)) /* the worker gave up on it */
        fail_all(m, s, ECS_ERR_IO, "aborted by the worker");
    if (done) /* others may sleep on the ring for calls this thread completed */
        dplane_ring_kick(s->seg, DPLANE_RESULTS);
}

void mux_shm_wait(mux_t *m, mux_call_t *c, uint64_t deadline_ns)
{
    mux_shm_t *s = c->shm;
    while (!atomic_load(&c->done)) {
        const uint32_t seen = dplane_ring_seq(s->seg, DPLANE_RESULTS, false);
        pthread_mutex_lock(&s->rx);
        drain(m, s);
        pthread_mutex_unlock(&s->rx);
        if (atomic_load(&c->done))
            return;
        int ms = SHM_WAIT_SLICE_MS;
        if (deadline_ns) {
            const uint64_t now = zu_now_ns();
            if (now >= deadline_ns)
                return;
            if ((deadline_ns - now) / 1000000ull < (uint64_t)ms)
                ms = (int)((deadline_ns - now) / 1000000ull) + 1;
        }
        dplane_ring_wait(s->seg, DPLANE_RESULTS, false, seen, ms);
    }
}

static void close_plane(mux_t *m, mux_shm_t *s, const char *why)
{
    pthread_mutex_lock(&s->tx); /* no send is half done */
    pthread_mutex_lock(&s->rx);
    fail_all(m, s, ECS_ERR_IO, why);
    pthread_mutex_unlock(&s->rx);
    pthread_mutex_unlock(&s->tx);
    dplane_shm_abort(s->seg); /* the worker's serve thread and our sleepers wake */
    mux_shm_put(s);
}

void mux_shm_close(mux_t *m, peer_t *p, const char *why)
{
    pthread_mutex_lock(&m->lock);
    mux_shm_t *s = p->shm;
    p->shm = NULL;
    pthread_mutex_unlock(&m->lock);
    if (s)
        close_plane(m, s, why);
}
