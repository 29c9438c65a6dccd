/* chan.c - the ordered one-way channel of a data plane and the plane
 * negotiation. The channel is a ring of `depth` slots indexed by payload
 * number: a submit fills slot seq % depth (any thread, under the lock), the
 * channel's thread waits on a condition variable (asleep, never spinning)
 * until the slot of the next number is filled, runs it on the transport
 * outside the lock, completes it and moves on. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/dplane/dplane.h"

typedef struct {
    bool full;
    uint64_t seq;
    void *buf;
    size_t n;
} op_t;

struct dplane_chan {
    dplane_transport_t t;
    dplane_dir_t dir;
    int depth;
    dplane_done_fn done;
    void *arg;
    op_t *ring;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, stopping, aborted;
    uint64_t next; /* the number the thread runs next */
    char why[128];
};

uint64_t dplane_local_caps(const dplane_env_t *e)
{
    uint64_t caps = 0;
    if (e->gpu && e->want_nccl) {
        uint8_t probe[DPLANE_NCCL_ID_BYTES];
        /* a unique id needs libnccl and nothing else: a cheap proof it loads */
        if (dplane_nccl_unique_id(probe) == ECS_OK)
            caps |= WIRE_CAP_NCCL;
    }
    if (e->want_rdma && dplane_rdma_available())
        caps |= WIRE_CAP_RDMA;
    return caps;
}

wire_plane_t dplane_choose(uint64_t worker_caps, uint64_t coordinator_caps)
{
    const uint64_t both = worker_caps & coordinator_caps;
    if (both & WIRE_CAP_NCCL)
        return WIRE_PLANE_NCCL;
    if (both & WIRE_CAP_RDMA)
        return WIRE_PLANE_RDMA;
    return WIRE_PLANE_ZMQ;
}

wire_plane_t dplane_choose_host(uint64_t worker_caps, uint64_t coordinator_caps, bool same_host)
{
    const wire_plane_t p = dplane_choose(worker_caps, coordinator_caps);
    if (p == WIRE_PLANE_ZMQ && same_host && (worker_caps & coordinator_caps & WIRE_CAP_SHM))
        return WIRE_PLANE_SHM;
    return p;
}

const char *dplane_plane_name(wire_plane_t p)
{
    switch (p) {
    case WIRE_PLANE_ZMQ: return "zmq";
    case WIRE_PLANE_NCCL: return "nccl";
    case WIRE_PLANE_RDMA: return "rdma";
    case WIRE_PLANE_SHM: return "shm";
    default: return "?";
    }
}

/* After an abort: every queued operation fails at once, in any order (a
 * gap in the numbers must not keep a caller waiting). Called locked. */
static void fail_queued(dplane_chan_t *c)
{
    for (int i = 0; i < c->depth; i++) {
        if (!c->ring[i].full)
            continue;
        const uint64_t seq = c->ring[i].seq;
        c->ring[i].full = false;
        pthread_mutex_unlock(&c->mu);
        c->done(c->arg, seq,
                ecs_error(ECS_ERR_IO, "data plane %s: aborted (%s)", c->t.name, c->why));
        pthread_mutex_lock(&c->mu);
    }
}

static void *chan_main(void *arg)
{
    dplane_chan_t *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        op_t *o = &c->ring[c->next % (uint64_t)c->depth];
        while (!c->stopping && !c->aborted && !(o->full && o->seq == c->next))
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->aborted) {
            fail_queued(c);
            while (!c->stopping)
                pthread_cond_wait(&c->cv, &c->mu);
            break;
        }
        if (c->stopping)
            break;
        const op_t op = *o;
        pthread_mutex_unlock(&c->mu);
        const ecs_err_t rc = c->dir == DPLANE_SEND ? c->t.send(c->t.ctx, op.buf, op.n)
                                                   : c->t.recv(c->t.ctx, op.buf, op.n);
        pthread_mutex_lock(&c->mu);
        o->full = false;
        c->next++;
        pthread_mutex_unlock(&c->mu);
        c->done(c->arg, op.seq, rc); /* unlocked: it may submit the next one */
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

ecs_err_t dplane_chan_new(const dplane_transport_t *t, dplane_dir_t dir, int depth,
                          dplane_done_fn done, void *arg, dplane_chan_t **out)
{
    *out = NULL;
    if (!t || !t->send || !t->recv || !t->abort || !done || depth < 1 || depth > 65536) {
        if (t && t->close)
            t->close(t->ctx);
        return ecs_error(ECS_ERR_INVAL, "data plane: bad channel options (depth %d)", depth);
    }
    dplane_chan_t *c = calloc(1, sizeof *c);
    op_t *ring = calloc((size_t)depth, sizeof *ring);
    if (!c || !ring) {
        free(c);
        free(ring);
        if (t->close)
            t->close(t->ctx);
        return ecs_error(ECS_ERR_NOMEM, "data plane: no memory for a channel of %d", depth);
    }
    *c = (dplane_chan_t){.t = *t, .dir = dir, .depth = depth, .done = done, .arg = arg,
                         .ring = ring};
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->thread, NULL, chan_main, c) != 0) {
        dplane_chan_free(c);
        return ecs_error(ECS_ERR_NOMEM, "data plane: cannot start the channel's thread");
    }
    c->started = true;
    *out = c;
    return ECS_OK;
}

ecs_err_t dplane_chan_submit(dplane_chan_t *c, uint64_t seq, void *buf, size_t n)
{
    ecs_err_t rc = ECS_OK;
    pthread_mutex_lock(&c->mu);
    if (c->stopping || c->aborted)
        rc = ecs_error(ECS_ERR_IO, "data plane %s: %s", c->t.name,
                       c->aborted ? c->why : "channel closed");
    else if (seq < c->next)
        rc = ecs_error(ECS_ERR_INVAL, "data plane %s: payload %llu already ran (next %llu)",
                       c->t.name, (unsigned long long)seq, (unsigned long long)c->next);
    else if (seq - c->next >= (uint64_t)c->depth)
        rc = ecs_error(ECS_ERR_RANGE, "data plane %s: payload %llu is %llu ahead (depth %d)",
                       c->t.name, (unsigned long long)seq,
                       (unsigned long long)(seq - c->next), c->depth);
    else if (c->ring[seq % (uint64_t)c->depth].full)
        rc = ecs_error(ECS_ERR_INVAL, "data plane %s: payload %llu submitted twice", c->t.name,
                       (unsigned long long)seq);
    else {
        c->ring[seq % (uint64_t)c->depth] = (op_t){true, seq, buf, n};
        if (seq == c->next)
            pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

uint64_t dplane_chan_next(dplane_chan_t *c)
{
    pthread_mutex_lock(&c->mu);
    const uint64_t n = c->next;
    pthread_mutex_unlock(&c->mu);
    return n;
}

void dplane_chan_abort(dplane_chan_t *c, const char *why)
{
    pthread_mutex_lock(&c->mu);
    const bool first = !c->aborted;
    if (first) {
        c->aborted = true;
        snprintf(c->why, sizeof c->why, "%s", why ? why : "aborted");
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (first) /* outside the lock: it wakes a send / recv blocked on the thread */
        c->t.abort(c->t.ctx);
}

bool dplane_chan_aborted(dplane_chan_t *c)
{
    pthread_mutex_lock(&c->mu);
    const bool a = c->aborted;
    pthread_mutex_unlock(&c->mu);
    return a;
}

void dplane_chan_free(dplane_chan_t *c)
{
    if (!c)
        return;
    if (c->started) {
        dplane_chan_abort(c, "channel closed");
        pthread_mutex_lock(&c->mu);
        c->stopping = true;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
        /* what never ran is completed, so no caller waits for it forever */
        for (int i = 0; i < c->depth; i++)
            if (c->ring[i].full)
                c->done(c->arg, c->ring[i].seq,
                        ecs_error(ECS_ERR_IO, "data plane %s: closed before it ran", c->t.name));
    }
    if (c->t.close)
        c->t.close(c->t.ctx);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->ring);
    free(c);
}
