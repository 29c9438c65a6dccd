/* server.c - the worker's side of the transport: one thread (the caller of
 * mux_server_run) owns the data ROUTER and the control DEALERs, hands each
 * valid call to on_call and sends the reply to whoever asked. Bad input is
 * answered or dropped and counted; nothing a peer sends ends the loop.
 *
 * Several coordinators may call one worker (M:N). Calls are read off the
 * data socket into a queue, one lane per coordinator (fairq.h), and served
 * one at a time round robin between the lanes, reading again between two
 * calls: a coordinator with a backlog cannot starve another. While the
 * queue is full the rest waits in ZeroMQ's buffers (its high-water mark
 * pushes back on the senders). */
#include "mux.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "fairq.h"
#include "proto/dplane/dplane.h"
#include "zutil.h"

#define SERVER_MAX_CONNS 16
#define SERVER_BATCH 64   /* control messages read before the others get a look */
#define SERVER_QUEUE 256  /* calls read off the data socket, not served yet */
#define PLANE_RESULT_FRAME 1024u /* ring room for a Result's header and body */
#define PLANE_SLICE_MS 200       /* a sleeping plane thread looks at its stop flag this often */

/* A coordinator's shared-memory plane: its own thread reads the call ring
 * and runs on_call (under ops_lock, like every callback) and writes the
 * result ring. */
typedef struct plane {
    struct mux_server *s;
    dplane_shm_t *seg;
    pthread_t th;
    atomic_bool stop;
    struct plane *next;   /* retired, to join */
    uint8_t *frame;       /* a call's frame copied out of the ring */
    size_t frame_cap;
} plane_t;

typedef struct {
    zmq_msg_t parts[ZU_MAX_PARTS];
    int n; /* the message's frame count (parts holds the first ZU_MAX_PARTS) */
} server_slot_t;

struct mux_server {
    void *zctx, *data;
    bool shm_no_spin;          /* mux_server_opts_t's: set at mux_server_new */
    char data_ep[256];
    void *ctl[SERVER_MAX_CONNS];
    int n_ctl;
    curve_keypair_t key;       /* CURVE: a copy of the keypair given */
    mux_curve_t curve;         /* .key points at key when CURVE is on */
    char server_pub[CURVE_Z85_LEN + 1];
    curve_auth_t *auth;        /* ZAP handler admitting the coordinators' keys */
    void *mon[SERVER_MAX_CONNS + 1]; /* failed handshakes: [0] data, [1 + i] ctl[i] */
    /* loop thread: the socket was last read to EAGAIN and not used since,
     * so its ZMQ_FD fires on the next message (false: it may hold input
     * that the fd will not signal: a send may have taken ZeroMQ's wake-up
     * command, or a read stopped early) */
    bool data_clean, ctl_clean[SERVER_MAX_CONNS], mon_clean[SERVER_MAX_CONNS + 1];
    int efd;
    int tick_ms, hwm;
    mux_server_ops_t ops;
    void *ctx;
    fairq_t *q;
    server_slot_t slot[SERVER_QUEUE];
    uint32_t free_slot[SERVER_QUEUE], n_free;
    atomic_bool stop;
    _Atomic uint64_t calls, rows, bytes_in, bytes_out, compute_ns, bad, dropped;
    /* every callback runs under ops_lock: the plane threads call on_call
     * beside the loop thread's on_ctrl / on_tick */
    pthread_mutex_t ops_lock;
    pthread_t loop;
    atomic_bool in_loop;
    plane_t *plane[SERVER_MAX_CONNS];
    plane_t *retired;     /* under ops_lock */
};

#define ADD(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)
#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

/* Sends [route] header [payload]: a reply that cannot leave at once (the
 * coordinator is gone or not reading) is dropped and counted; the caller's
 * timeout covers it. */
static void send_reply(mux_server_t *s, const mux_route_t *route, const wire_msg_t *w,
                       zmq_msg_t *payload)
{
    zmq_msg_t f;
    if (zu_encode(w, &f) != ECS_OK) {
        ADD(s->dropped, 1);
        return;
    }
    const size_t bytes = zmq_msg_size(&f) + zmq_msg_size(payload);
    if (zmq_send(s->data, route->id, route->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_msg_send(&f, s->data, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f);
        ADD(s->dropped, 1);
        return;
    }
    zmq_msg_send(payload, s->data, ZMQ_DONTWAIT);
    ADD(s->bytes_out, bytes);
}

static void reply_status(mux_server_t *s, const mux_route_t *route, uint64_t id,
                         wire_status_t st, const char *why)
{
    char msg[WIRE_MAX_STRING];
    snprintf(msg, sizeof msg, "%s", why);
    wire_msg_t w = {.kind = WIRE_RESULT,
                    .result = {.request_id = id, .status = st, .message = msg}};
    zmq_msg_t empty;
    zmq_msg_init(&empty);
    send_reply(s, route, &w, &empty);
    zmq_msg_close(&empty);
}

/* Runs on_call for c into rows (bytes), under ops_lock, and counts it. */
static void run_call(mux_server_t *s, const wire_call_t *c, void *rows, size_t bytes,
                     dplane_shm_t *seg, mux_reply_t *r)
{
    *r = (mux_reply_t){.status = WIRE_ST_OK, .rows = rows, .rows_bytes = bytes};
    if (seg) {
        r->pool_own = dplane_shm_pool_word(seg, false);
        r->pool_peer = dplane_shm_pool_word(seg, true);
    }
    const uint64_t t0 = zu_now_ns();
    pthread_mutex_lock(&s->ops_lock);
    if (s->ops.on_call)
        s->ops.on_call(s->ctx, c, r);
    else {
        r->status = WIRE_ST_UNSUPPORTED;
        snprintf(r->message, sizeof r->message, "this server takes no calls");
    }
    pthread_mutex_unlock(&s->ops_lock);
    if (!r->compute_ns)
        r->compute_ns = zu_now_ns() - t0;
    r->message[sizeof r->message - 1] = '\0';
    ADD(s->calls, 1);
    ADD(s->rows, c->n_rows);
    ADD(s->compute_ns, r->compute_ns);
}

/* The Result for call c answered by r (rows: the payload when OK). */
static wire_msg_t result_msg(const wire_call_t *c, const mux_reply_t *r, const void *rows,
                             size_t bytes)
{
    const bool ok = r->status == WIRE_ST_OK;
    return (wire_msg_t){.kind = WIRE_RESULT,
                        .result = {.request_id = c->request_id, .status = r->status,
                                   .compute_ns = ok ? r->compute_ns : 0,
                                   .n_entries = ok ? (uint32_t)wire_call_result_rows(c) : 0,
                                   .n_embd = ok ? c->n_embd : 0, .dtype = ok ? c->result_dtype : 0,
                                   .message = ok ? NULL : r->message,
                                   .payload = ok && bytes ? rows : NULL,
                                   .payload_bytes = ok ? bytes : 0}};
}

static void serve_call(mux_server_t *s, const mux_route_t *route, const wire_call_t *c)
{
    const size_t bytes = wire_call_result_rows(c) * wire_row_bytes(c->result_dtype, c->n_embd);
    zmq_msg_t out;
    if (zmq_msg_init_size(&out, bytes)) {
        reply_status(s, route, c->request_id, WIRE_ST_INTERNAL, "worker out of memory");
        return;
    }
    mux_reply_t r;
    run_call(s, c, zmq_msg_data(&out), bytes, NULL, &r);
    if (r.status != WIRE_ST_OK) {
        zmq_msg_close(&out);
        reply_status(s, route, c->request_id, r.status, r.message);
        return;
    }
    const wire_msg_t w = result_msg(c, &r, zmq_msg_data(&out), bytes);
    send_reply(s, route, &w, &out);
    zmq_msg_close(&out);
}

/* One message on the data socket: [route, header(, payload)]. */
static void data_msg(mux_server_t *s, zmq_msg_t *parts, int n)
{
    mux_route_t route = {.len = (uint8_t)zmq_msg_size(&parts[0])};
    memcpy(route.id, zmq_msg_data(&parts[0]), route.len);
    wire_msg_t w;
    memset(&w, 0, sizeof w);
    ecs_err_t e;
    if (n < 2)
        e = ecs_error(ECS_ERR_FORMAT, "empty message");
    else if (n >= 3 && (e = zu_align(&parts[2])))
        ;
    else {
        e = wire_decode(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]),
                        n >= 3 ? zmq_msg_data(&parts[2]) : NULL,
                        n >= 3 ? zmq_msg_size(&parts[2]) : 0, n >= 3, &w);
        if (!e && n > 3) {
            const uint64_t id = w.kind == WIRE_CALL ? w.call.request_id : 0;
            const wire_kind_t k = w.kind;
            wire_msg_clear(&w);
            w.kind = k;
            w.call.request_id = id;
            e = ecs_error(ECS_ERR_FORMAT, "%s of %d frames (at most 2)", wire_kind_name(k),
                          n - 1);
        }
    }
    if (!e && w.kind != WIRE_CALL && w.kind != WIRE_ERROR)
        e = ecs_error(ECS_ERR_FORMAT, "%s on the data socket (only ExpertCall)",
                      wire_kind_name(w.kind));
    if (e) {
        ADD(s->bad, 1);
        if (w.kind == WIRE_CALL && w.call.request_id)
            reply_status(s, &route, w.call.request_id, zu_status_of(e), ecs_errmsg());
        else if (w.kind != WIRE_ERROR && zu_send_error(s->data, &route, zu_status_of(e), w.kind,
                                                       0, ecs_errmsg()))
            ADD(s->dropped, 1);
    } else if (w.kind == WIRE_CALL) {
        serve_call(s, &route, &w.call);
    }
    /* an Error from a coordinator is noted by the counters only */
    wire_msg_clear(&w);
}

static void ctrl_msg(mux_server_t *s, int conn, zmq_msg_t *parts, int n)
{
    wire_msg_t w;
    memset(&w, 0, sizeof w);
    ecs_err_t e;
    if (n > 1)
        e = ecs_error(ECS_ERR_FORMAT, "control message of %d frames (1 wanted)", n);
    else
        e = wire_decode(zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0]), NULL, 0, false, &w);
    if (!e && wire_kind_has_payload(w.kind))
        e = ecs_error(ECS_ERR_FORMAT, "%s on the control socket", wire_kind_name(w.kind));
    if (e) {
        ADD(s->bad, 1);
        if (w.kind != WIRE_ERROR &&
            zu_send_error(s->ctl[conn], NULL, zu_status_of(e), w.kind, 0, ecs_errmsg()))
            ADD(s->dropped, 1);
    } else if (s->ops.on_ctrl) {
        pthread_mutex_lock(&s->ops_lock);
        s->ops.on_ctrl(s->ctx, conn, &w);
        pthread_mutex_unlock(&s->ops_lock);
    }
    wire_msg_clear(&w);
}

/* Control messages of coordinator conn. */
static void drain_ctrl(mux_server_t *s, int conn)
{
    zmq_msg_t parts[ZU_MAX_PARTS];
    int n;
    size_t bytes;
    s->ctl_clean[conn] = false;
    for (int i = 0; i < SERVER_BATCH && !atomic_load(&s->stop); i++) {
        if (zu_recv(s->ctl[conn], parts, &n, &bytes) <= 0) {
            s->ctl_clean[conn] = true;
            return;
        }
        ADD(s->bytes_in, bytes);
        ctrl_msg(s, conn, parts, n);
        zu_close_parts(parts, n);
    }
}

/* Whatever waits on the data socket (at most max messages), into its
 * sender's lane while there is room (checked when served: a bad message is
 * answered in its turn). */
static void enqueue_calls(mux_server_t *s, uint32_t max)
{
    size_t bytes;
    s->data_clean = false;
    for (uint32_t k = 0; k < max && s->n_free > 0; k++) {
        const uint32_t i = s->free_slot[s->n_free - 1];
        server_slot_t *sl = &s->slot[i];
        if (zu_recv(s->data, sl->parts, &sl->n, &bytes) <= 0) {
            s->data_clean = true;
            return;
        }
        ADD(s->bytes_in, bytes);
        /* a ROUTER message starts with the sender's routing id */
        if (fairq_push(s->q, zmq_msg_data(&sl->parts[0]), zmq_msg_size(&sl->parts[0]), i)) {
            ADD(s->bad, 1); /* a routing id over 255 bytes: ZeroMQ makes none */
            zu_close_parts(sl->parts, sl->n);
            continue;
        }
        s->n_free--;
    }
}

/* The next call in the round, if any. */
static void serve_next(mux_server_t *s)
{
    uint32_t i;
    if (!fairq_pop(s->q, &i))
        return;
    server_slot_t *sl = &s->slot[i];
    s->data_clean = false; /* it sends */
    data_msg(s, sl->parts, sl->n);
    zu_close_parts(sl->parts, sl->n);
    s->free_slot[s->n_free++] = i;
}

/* ---- the shared-memory plane (one per coordinator that offered it) ---- */

/* Room in the result ring for a Result of `bytes` rows, waiting while the
 * coordinator has not taken the earlier ones. */
static ecs_err_t plane_room(plane_t *pl, size_t bytes, dplane_entry_t *e)
{
    for (;;) {
        const uint32_t seen = dplane_ring_seq(pl->seg, DPLANE_RESULTS, true);
        const ecs_err_t rc = dplane_ring_reserve(pl->seg, DPLANE_RESULTS, PLANE_RESULT_FRAME,
                                                 bytes, e);
        if (rc != ECS_ERR_NOMEM || atomic_load(&pl->stop))
            return rc;
        dplane_ring_wait(pl->seg, DPLANE_RESULTS, true, seen, PLANE_SLICE_MS);
    }
}

/* Writes m (payload: e's, already filled, or none) as a result entry. */
static void plane_send(plane_t *pl, dplane_entry_t *e, const wire_msg_t *m)
{
    size_t len = 0;
    if (wire_encode(m, e->frame, PLANE_RESULT_FRAME, &len) != ECS_OK) {
        /* cannot happen for what this file builds; an empty Result says so */
        ADD(pl->s->dropped, 1);
        const wire_msg_t err = {.kind = WIRE_RESULT,
                                .result = {.request_id = m->result.request_id,
                                           .status = WIRE_ST_INTERNAL,
                                           .message = "worker: reply encoding failed"}};
        if (wire_encode(&err, e->frame, PLANE_RESULT_FRAME, &len) != ECS_OK)
            return;
    }
    e->payload_len = m->result.status == WIRE_ST_OK ? m->result.payload_bytes : 0;
    dplane_ring_commit(pl->seg, DPLANE_RESULTS, e, len);
    ADD(pl->s->bytes_out, len + e->payload_len);
}

static void plane_status(plane_t *pl, uint64_t id, wire_status_t st, const char *why)
{
    dplane_entry_t e;
    char msg[WIRE_MAX_STRING];
    snprintf(msg, sizeof msg, "%s", why);
    msg[255] = '\0'; /* the frame room holds a short message */
    if (plane_room(pl, 0, &e) != ECS_OK) {
        ADD(pl->s->dropped, 1);
        return;
    }
    const wire_msg_t w = {.kind = WIRE_RESULT,
                          .result = {.request_id = id, .status = st, .message = msg}};
    plane_send(pl, &e, &w);
}

/* One call entry: a private copy of its frame is decoded (the coordinator
 * could rewrite the ring meanwhile), its rows are read in place. */
static void plane_call(plane_t *pl, const dplane_entry_t *ce)
{
    mux_server_t *s = pl->s;
    ADD(s->bytes_in, ce->frame_len + ce->payload_len);
    wire_msg_t w;
    ecs_err_t e = dplane_entry_decode(ce, &pl->frame, &pl->frame_cap, &w);
    if (!e && w.kind != WIRE_CALL)
        e = ecs_error(ECS_ERR_FORMAT, "%s on the shared-memory plane (only ExpertCall)",
                      wire_kind_name(w.kind));
    if (e) {
        ADD(s->bad, 1);
        if (w.kind == WIRE_CALL && w.call.request_id)
            plane_status(pl, w.call.request_id, zu_status_of(e), ecs_errmsg());
        wire_msg_clear(&w);
        return;
    }
    const wire_call_t *c = &w.call;
    const size_t bytes = wire_call_result_rows(c) * wire_row_bytes(c->result_dtype, c->n_embd);
    dplane_entry_t re;
    const ecs_err_t rc = plane_room(pl, bytes, &re);
    if (rc == ECS_ERR_RANGE)
        plane_status(pl, c->request_id, WIRE_ST_INTERNAL, "result exceeds the result ring");
    else if (rc != ECS_OK)
        ADD(s->dropped, 1); /* stopping or aborted: the coordinator re-sends */
    else {
        mux_reply_t r;
        run_call(s, c, re.payload, bytes, pl->seg, &r);
        const wire_msg_t m = result_msg(c, &r, re.payload, bytes);
        plane_send(pl, &re, &m);
    }
    wire_msg_clear(&w);
}

static void *plane_main(void *arg)
{
    plane_t *pl = arg;
    while (!atomic_load(&pl->stop) && !dplane_shm_aborted(pl->seg)) {
        const uint32_t seen = dplane_ring_seq(pl->seg, DPLANE_CALLS, false);
        dplane_entry_t e;
        const ecs_err_t rc = dplane_ring_peek(pl->seg, DPLANE_CALLS, &e);
        if (rc == ECS_ERR_NOTFOUND) {
            dplane_ring_wait(pl->seg, DPLANE_CALLS, false, seen, PLANE_SLICE_MS);
            continue;
        }
        if (rc != ECS_OK) { /* a ring out of step cannot be resynchronised */
            ADD(pl->s->bad, 1);
            fprintf(stderr, "worker: %s; the shared-memory plane is closed (ZeroMQ goes on)\n",
                    ecs_errmsg());
            dplane_shm_abort(pl->seg);
            break;
        }
        plane_call(pl, &e);
        dplane_ring_release(pl->seg, DPLANE_CALLS, &e);
    }
    return NULL;
}

/* Joins and frees a list of stopped planes (no lock held). */
static void reap(plane_t *pl)
{
    while (pl) {
        plane_t *next = pl->next;
        pthread_join(pl->th, NULL);
        dplane_shm_free(pl->seg);
        free(pl->frame);
        free(pl);
        pl = next;
    }
}

static void plane_retire(mux_server_t *s, plane_t *pl)
{
    atomic_store(&pl->stop, true);
    dplane_shm_abort(pl->seg); /* wakes its thread; the coordinator's side fails over */
    pl->next = s->retired;
    s->retired = pl;
}

ecs_err_t mux_server_attach_shm(mux_server_t *s, int conn, const char *name)
{
    if (conn < 0 || conn >= s->n_ctl)
        return ecs_error(ECS_ERR_INVAL, "mux_server_attach_shm: no connection %d", conn);
    if (s->plane[conn]) { /* a new Welcome: the old segment is dead on the coordinator */
        plane_retire(s, s->plane[conn]);
        s->plane[conn] = NULL;
    }
    if (!name)
        return ECS_OK;
    plane_t *pl = calloc(1, sizeof *pl);
    if (!pl)
        return ecs_error(ECS_ERR_NOMEM, "worker: out of memory");
    pl->s = s;
    ecs_err_t e = dplane_shm_attach(name, &pl->seg);
    if (e) {
        free(pl);
        return e;
    }
    const char *sw = getenv("ECS_SHM_SHORT_WAKE");
    dplane_shm_short_wake(pl->seg, sw && !strcmp(sw, "1"));
    if (s->shm_no_spin)
        dplane_shm_spin(pl->seg, 0);
    if (pthread_create(&pl->th, NULL, plane_main, pl) != 0) {
        dplane_shm_abort(pl->seg);
        dplane_shm_free(pl->seg);
        free(pl);
        return ecs_error(ECS_ERR_INTERNAL, "worker: cannot start the plane's thread");
    }
    s->plane[conn] = pl;
    return ECS_OK;
}

bool mux_server_in_loop(const mux_server_t *s)
{
    return atomic_load(&((mux_server_t *)s)->in_loop) && pthread_equal(s->loop, pthread_self());
}

ecs_err_t mux_server_run(mux_server_t *s)
{
    zmq_pollitem_t items[2 * SERVER_MAX_CONNS + 3]; /* efd, data, controls, monitors */
    uint64_t next_tick = zu_now_ns() + (uint64_t)s->tick_ms * 1000000ull;
    /* a call must reach this thread as soon as it arrives, on cores that
     * other processes' compute threads hold: the context's I/O threads
     * preempt them at once (they still get only their fair share). Not this
     * thread: it computes, and preempted every 0.1 ms it was slower. */
    zu_short_slice_zmq();
    s->loop = pthread_self();
    atomic_store(&s->in_loop, true);
    while (!atomic_load(&s->stop)) {
        /* poll() on the sockets' ZMQ_FDs, not zmq_poll: that would ask each
         * socket its ZMQ_EVENTS before and after sleeping (two system calls
         * a socket each time, ~2 us each on a VM); a clean socket needs no
         * asking */
        int n = 0;
        bool *clean[2 * SERVER_MAX_CONNS + 3];
        clean[n] = NULL;
        items[n++] = (zmq_pollitem_t){.fd = s->efd, .events = ZMQ_POLLIN};
        clean[n] = &s->data_clean;
        items[n++] = (zmq_pollitem_t){.socket = s->data, .events = ZMQ_POLLIN};
        for (int i = 0; i < s->n_ctl; i++) {
            clean[n] = &s->ctl_clean[i];
            items[n++] = (zmq_pollitem_t){.socket = s->ctl[i], .events = ZMQ_POLLIN};
        }
        const int first_mon = n;
        for (int i = 0; i <= s->n_ctl; i++)
            if (s->mon[i]) {
                clean[n] = &s->mon_clean[i];
                items[n++] = (zmq_pollitem_t){.socket = s->mon[i], .events = ZMQ_POLLIN};
            }
        struct pollfd pf[2 * SERVER_MAX_CONNS + 3];
        bool dirty = false;
        for (int i = 0; i < n; i++) {
            int fd = items[i].fd;
            size_t len = sizeof fd;
            if (items[i].socket && zmq_getsockopt(items[i].socket, ZMQ_FD, &fd, &len) != 0)
                fd = -1; /* poll() skips it */
            pf[i] = (struct pollfd){.fd = fd, .events = POLLIN};
            dirty |= clean[i] && !*clean[i];
        }
        const uint64_t now = zu_now_ns();
        const long wait_ms = now >= next_tick || fairq_len(s->q) || dirty ? 0
                             : (long)((next_tick - now) / 1000000ull) + 1;
        if (poll(pf, (nfds_t)n, (int)wait_ms) < 0) {
            if (errno == EINTR)
                continue;
            return ecs_error(ECS_ERR_IO, "poll: %s", strerror(errno));
        }
        for (int i = 0; i < n; i++)
            items[i].revents = pf[i].revents || (clean[i] && !*clean[i]) ? ZMQ_POLLIN : 0;
        if (items[0].revents) {
            uint64_t v;
            if (read(s->efd, &v, sizeof v) < 0) { /* nothing to reset */ }
        }
        /* a call to an idle worker (nothing queued, the socket read to
         * EAGAIN before) is served before the read that would find the
         * socket empty: one read, then the next round reads the rest */
        if (items[1].revents)
            enqueue_calls(s, s->data_clean && !fairq_len(s->q) ? 1 : SERVER_QUEUE);
        const int n_ctl = s->n_ctl; /* a callback may connect another */
        for (int i = 0; i < n_ctl && 2 + i < n; i++)
            if (items[2 + i].revents)
                drain_ctrl(s, i);
        for (int i = first_mon; i < n; i++) { /* log refused or refusing peers */
            if (!items[i].revents)
                continue;
            int k = 0;
            while (k < SERVER_BATCH && zu_monitor_event(items[i].socket, i == first_mon && s->mon[0]
                                                        ? "worker data" : "worker control", NULL))
                k++;
            *clean[i] = k < SERVER_BATCH;
        }
        if (!atomic_load(&s->stop))
            serve_next(s);
        if (zu_now_ns() >= next_tick) {
            pthread_mutex_lock(&s->ops_lock);
            if (s->ops.on_tick)
                s->ops.on_tick(s->ctx);
            plane_t *old = s->retired;
            s->retired = NULL;
            pthread_mutex_unlock(&s->ops_lock);
            reap(old);
            next_tick = zu_now_ns() + (uint64_t)s->tick_ms * 1000000ull;
        }
    }
    atomic_store(&s->in_loop, false);
    return ECS_OK;
}

void mux_server_stop(mux_server_t *s)
{
    atomic_store(&s->stop, true);
    const uint64_t one = 1;
    if (write(s->efd, &one, sizeof one) < 0) { /* already signalled */ }
}

ecs_err_t mux_server_new(const mux_server_opts_t *opts, const mux_server_ops_t *ops, void *ctx,
                         mux_server_t **out)
{
    *out = NULL;
    if (!opts || !opts->data_bind)
        return ecs_error(ECS_ERR_INVAL, "mux_server_new: no data endpoint to bind");
    mux_server_t *s = calloc(1, sizeof *s);
    if (!s)
        return ecs_error(ECS_ERR_NOMEM, "mux_server: out of memory");
    pthread_mutex_init(&s->ops_lock, NULL);
    ecs_err_t e = ECS_OK;
    s->efd = -1;
    s->tick_ms = opts->tick_ms > 0 ? opts->tick_ms : 1000;
    s->hwm = opts->hwm > 0 ? opts->hwm : MUX_DEFAULT_HWM;
    s->shm_no_spin = opts->shm_no_spin;
    if (ops)
        s->ops = *ops;
    s->ctx = ctx;
    if (!(s->zctx = zmq_ctx_new())) {
        e = ecs_error(ECS_ERR_IO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if ((e = fairq_new(SERVER_QUEUE, &s->q)))
        goto fail;
    for (uint32_t i = 0; i < SERVER_QUEUE; i++)
        s->free_slot[i] = SERVER_QUEUE - 1 - i;
    s->n_free = SERVER_QUEUE;
    if ((s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        e = ecs_error(ECS_ERR_IO, "eventfd: %s", strerror(errno));
        goto fail;
    }
    if ((e = zu_socket(s->zctx, ZMQ_ROUTER, s->hwm, 0, &s->data)))
        goto fail;
    const int one = 1;
    zmq_setsockopt(s->data, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    if (opts->curve.key) {
        s->key = *opts->curve.key;
        s->curve = opts->curve;
        s->curve.key = &s->key;
        snprintf(s->server_pub, sizeof s->server_pub, "%s",
                 opts->curve.server_pub ? opts->curve.server_pub : "");
        s->curve.server_pub = s->server_pub;
        if ((e = zu_curve_server(s->zctx, s->data, &s->curve, "worker data", &s->auth)))
            goto fail;
        s->mon[0] = zu_handshake_monitor(s->zctx, s->data, 0);
    }
    if (zmq_bind(s->data, opts->data_bind) != 0) {
        e = ecs_error(ECS_ERR_IO, "bind %s: %s", opts->data_bind, zmq_strerror(zmq_errno()));
        goto fail;
    }
    zu_last_endpoint(s->data, s->data_ep, sizeof s->data_ep);
    *out = s;
    return ECS_OK;
fail:
    mux_server_free(s);
    return e;
}

const char *mux_server_endpoint(const mux_server_t *s) { return s->data_ep; }

ecs_err_t mux_server_connect(mux_server_t *s, const char *endpoint, int *conn)
{
    if (s->n_ctl >= SERVER_MAX_CONNS)
        return ecs_error(ECS_ERR_RANGE, "at most %d coordinators", SERVER_MAX_CONNS);
    void *sock;
    /* a last Stats or Error gets a moment to leave on close */
    ecs_err_t e = zu_socket(s->zctx, ZMQ_DEALER, s->hwm, 500, &sock);
    if (e)
        return e;
    if ((e = zu_curve_client(sock, &s->curve, s->curve.server_pub, endpoint))) {
        zmq_close(sock);
        return e;
    }
    if (zmq_connect(sock, endpoint) != 0) {
        e = ecs_error(ECS_ERR_IO, "connect %s: %s", endpoint, zmq_strerror(zmq_errno()));
        zmq_close(sock);
        return e;
    }
    if (s->curve.key)
        s->mon[1 + s->n_ctl] = zu_handshake_monitor(s->zctx, sock, 0);
    s->ctl[s->n_ctl] = sock;
    *conn = s->n_ctl++;
    return ECS_OK;
}

ecs_err_t mux_server_send(mux_server_t *s, int conn, const wire_msg_t *msg)
{
    if (conn < 0 || conn >= s->n_ctl)
        return ecs_error(ECS_ERR_INVAL, "mux_server_send: no connection %d", conn);
    if (wire_kind_has_payload(msg->kind))
        return ecs_error(ECS_ERR_INVAL, "mux_server_send: %s is not a control message",
                         wire_kind_name(msg->kind));
    if (wire_check(msg))
        return ECS_ERR_FORMAT;
    size_t bytes = 0;
    s->ctl_clean[conn] = false;
    const int err = zu_send(s->ctl[conn], NULL, msg, &bytes);
    if (err)
        return ecs_error(ECS_ERR_IO, "control send: %s", zmq_strerror(err));
    ADD(s->bytes_out, bytes);
    return ECS_OK;
}

void mux_server_stats(const mux_server_t *s_, wire_stats_t *o)
{
    mux_server_t *s = (mux_server_t *)s_;
    *o = (wire_stats_t){.calls = LOAD(s->calls), .rows = LOAD(s->rows),
                        .bytes_in = LOAD(s->bytes_in), .bytes_out = LOAD(s->bytes_out),
                        .compute_ns = LOAD(s->compute_ns), .bad_messages = LOAD(s->bad),
                        .dropped = LOAD(s->dropped)};
}

void mux_server_free(mux_server_t *s)
{
    if (!s)
        return;
    for (int c = 0; c < SERVER_MAX_CONNS; c++)
        if (s->plane[c])
            plane_retire(s, s->plane[c]);
    reap(s->retired);
    uint32_t i;
    while (s->q && fairq_pop(s->q, &i)) /* calls never served */
        zu_close_parts(s->slot[i].parts, s->slot[i].n);
    fairq_free(s->q);
    for (int c = 0; c < s->n_ctl; c++)
        zmq_close(s->ctl[c]);
    if (s->data) {
        zu_unbind(s->data, s->data_ep);
        zmq_close(s->data);
    }
    for (int i = 0; i <= SERVER_MAX_CONNS; i++)
        if (s->mon[i])
            zmq_close(s->mon[i]);
    curve_auth_stop(s->auth); /* before zmq_ctx_term: it owns a socket of zctx */
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    if (s->efd >= 0)
        close(s->efd);
    pthread_mutex_destroy(&s->ops_lock);
    free(s);
}
