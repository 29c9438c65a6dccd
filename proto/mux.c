/* mux.c - the coordinator's socket work (control ROUTER, one DEALER per
 * peer), run by the holder of the I/O role (mux.h): the I/O thread, or a
 * caller that found the role free. It takes commands from the queue
 * (mux_api.c), sends calls, matches replies to calls through a hash table
 * keyed by request id, and completes them. */
#include "mux_impl.h"

#include <errno.h>
#include <poll.h>
#include <sys/epoll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zutil.h"

/* The I/O thread's completion: remembers the id (a later reply is a
 * duplicate, not an unknown id). */
static void call_finish(mux_t *m, mux_call_t *c)
{
    const unsigned slot = m->recent_pos++ % MUX_RECENT;
    m->recent[slot].id = c->id;
    m->recent[slot].peer = c->peer;
    mux_call_complete(m, c);
}

static void call_fail(mux_t *m, mux_call_t *c, ecs_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void call_fail(mux_t *m, mux_call_t *c, ecs_err_t err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msgbuf, sizeof c->msgbuf, fmt, ap);
    va_end(ap);
    const unsigned slot = m->recent_pos++ % MUX_RECENT;
    m->recent[slot].id = c->id;
    m->recent[slot].peer = c->peer;
    mux_call_abort(m, c, err, c->msgbuf);
}

static void table_put(mux_t *m, mux_call_t *c)
{
    mux_call_t **b = &m->table[c->id & (MUX_HASH - 1)];
    c->hnext = *b;
    *b = c;
}

/* Removes and returns the call with this id if it is in flight on peer. */
static mux_call_t *table_take(mux_t *m, uint64_t id, int peer)
{
    for (mux_call_t **pp = &m->table[id & (MUX_HASH - 1)]; *pp; pp = &(*pp)->hnext) {
        mux_call_t *c = *pp;
        if (c->id == id && c->peer == peer) {
            *pp = c->hnext;
            return c;
        }
    }
    return NULL;
}

/* Fails every call in flight on peer (all peers if peer < 0). */
static void table_fail(mux_t *m, int peer, const char *why)
{
    for (int b = 0; b < MUX_HASH; b++) {
        mux_call_t **pp = &m->table[b];
        while (*pp) {
            mux_call_t *c = *pp;
            if (peer < 0 || c->peer == peer) {
                *pp = c->hnext;
                call_fail(m, c, ECS_ERR_IO, "%s", why);
            } else {
                pp = &c->hnext;
            }
        }
    }
}

void mux_set_last_error(mux_t *m, peer_t *p, const char *msg)
{
    pthread_mutex_lock(&m->lock);
    snprintf(p->last_error, sizeof p->last_error, "%s", msg);
    pthread_mutex_unlock(&m->lock);
}

static void cmd_done(mux_t *m, cmd_t *c, ecs_err_t err, const char *msg)
{
    pthread_mutex_lock(&m->lock);
    c->err = err;
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg ? msg : "");
    c->finished = true;
    pthread_cond_broadcast(&m->cmd_cond);
    pthread_mutex_unlock(&m->lock);
}

/* ---- I/O thread: sending ---- */

/* 0, or the errno of the first frame's send (nothing was sent then). */
static int call_try_send(peer_t *p, mux_call_t *c)
{
    const size_t bytes = zmq_msg_size(&c->hdr) + zmq_msg_size(&c->payload);
    p->sock_dirty = true; /* a send may take the wake-up command of a reply */
    if (zmq_msg_send(&c->hdr, p->sock, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return zmq_errno();
    /* the rest of a message always follows its first frame */
    zmq_msg_send(&c->payload, p->sock, ZMQ_DONTWAIT);
    ADD(p->bytes_out, bytes);
    ADD(p->calls_sent, 1);
    return 0;
}

static void peer_flush(mux_t *m, peer_t *p)
{
    while (p->pend_head) {
        mux_call_t *c = p->pend_head;
        const int err = call_try_send(p, c);
        if (err == EAGAIN)
            return;
        p->pend_head = c->pnext;
        if (!p->pend_head)
            p->pend_tail = NULL;
        if (err) {
            mux_call_t *t = table_take(m, c->id, c->peer);
            if (t)
                call_fail(m, t, ECS_ERR_IO, "send failed: %s", zmq_strerror(err));
        }
    }
}

/* Sends a call that is in the table, or queues it behind the HWM. */
static void call_send_now(mux_t *m, mux_call_t *c)
{
    peer_t *p = m->peers[c->peer];
    if (!p->pend_head) {
        const int err = call_try_send(p, c);
        if (err == 0)
            return;
        if (err != EAGAIN) {
            table_take(m, c->id, c->peer);
            call_fail(m, c, ECS_ERR_IO, "send failed: %s", zmq_strerror(err));
            return;
        }
    }
    c->pnext = NULL; /* above the HWM: keep order, send when there is room */
    if (p->pend_tail)
        p->pend_tail->pnext = c;
    else
        p->pend_head = c;
    p->pend_tail = c;
}

static void do_call(mux_t *m, mux_call_t *c)
{
    peer_t *p = m->peers[c->peer];
    if (!p->sock) {
        call_fail(m, c, ECS_ERR_IO, "peer %s is disconnected", p->endpoint);
        return;
    }
    table_put(m, c);
    if (m->net.on && mux_netem_out(m, c))
        return;
    call_send_now(m, c);
}

/* mux_call_cancel: a call still in flight fails (ECS_ERR_IO) as if its
 * peer had gone; its reply, if one comes, is dropped as a duplicate. */
static void do_cancel(mux_t *m, mux_call_t *c)
{
    if (!atomic_load(&c->done) && table_take(m, c->id, c->peer)) {
        peer_t *p = m->peers[c->peer];
        for (mux_call_t **pp = &p->pend_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->pnext)
            if (*pp == c) { /* not sent yet (above the HWM) */
                *pp = c->pnext;
                if (p->pend_tail == c)
                    p->pend_tail = prev;
                break;
            }
        call_fail(m, c, ECS_ERR_IO, "cancelled: no reply in time");
    }
    mux_call_unref(c); /* the reference mux_call_cancel took */
}

static void do_connect(mux_t *m, cmd_t *c)
{
    const int n = atomic_load(&m->n_peers);
    if (n >= MUX_MAX_PEERS) {
        cmd_done(m, c, ECS_ERR_RANGE, "too many peers");
        return;
    }
    peer_t *p = calloc(1, sizeof *p);
    void *s = NULL;
    if (!p) {
        cmd_done(m, c, ECS_ERR_NOMEM, "out of memory");
        return;
    }
    if (zu_socket(m->zctx, ZMQ_DEALER, m->hwm, 0, &s) != ECS_OK) {
        cmd_done(m, c, ECS_ERR_IO, ecs_errmsg());
        free(p);
        return;
    }
    if (zu_curve_client(s, &m->curve, c->server_pub, c->endpoint) != ECS_OK) {
        zmq_close(s);
        free(p);
        cmd_done(m, c, ECS_ERR_INVAL, ecs_errmsg());
        return;
    }
    /* the connection's drops, seen at once (a dead worker's socket closes
     * before any heartbeat is missed); without a monitor, no drops. Watched
     * before the connect: a connection made first would send its CONNECTED
     * to nobody and its drop would never count. */
    p->mon = zu_handshake_monitor(m->zctx, s, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED);
    if (zmq_connect(s, c->endpoint) != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "connect %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
        if (p->mon) {
            zmq_socket_monitor(s, NULL, 0);
            zmq_close(p->mon);
        }
        zmq_close(s);
        free(p);
        cmd_done(m, c, ECS_ERR_IO, msg);
        return;
    }
    zu_short_slice_zmq(); /* the context's I/O threads exist now */
    p->sock = s;
    p->sock_dirty = p->mon_dirty = true;
    m->sock_gen++;
    snprintf(p->endpoint, sizeof p->endpoint, "%s", c->endpoint);
    atomic_store(&p->connected, true);
    m->peers[n] = p;
    atomic_store_explicit(&m->n_peers, n + 1, memory_order_release);
    c->peer = n;
    cmd_done(m, c, ECS_OK, NULL);
}

static void peer_close(mux_t *m, int id, const char *why)
{
    peer_t *p = m->peers[id];
    if (!p->sock)
        return;
    atomic_store(&p->connected, false);
    p->pend_head = p->pend_tail = NULL; /* those calls are in the table too */
    table_fail(m, id, why);
    mux_shm_close(m, p, why);
    zmq_socket_monitor(p->sock, NULL, 0);
    zmq_close(p->sock);
    p->sock = NULL;
    m->sock_gen++;
    if (p->mon)
        zmq_close(p->mon);
    p->mon = NULL;
}

/* One monitor event of peer id: a DISCONNECTED after a CONNECTED counts a
 * drop (ZeroMQ keeps reconnecting; the caller decides what a drop means). */
static void monitor_in(mux_t *m, int id)
{
    peer_t *p = m->peers[id];
    p->mon_dirty = false;
    for (int i = 0; p->mon; i++) {
        if (i == MUX_BATCH) { /* more may wait, unsignalled */
            p->mon_dirty = true;
            return;
        }
        const int event = zu_monitor_event(p->mon, "coordinator data", NULL);
        if (!event)
            return;
        if (event == ZMQ_EVENT_CONNECTED) {
            p->was_connected = true;
        } else if (event == ZMQ_EVENT_DISCONNECTED && p->was_connected) {
            p->was_connected = false;
            ADD(p->drops, 1);
        }
    }
}

static void do_ctrl_send(mux_t *m, cmd_t *c)
{
    if (!m->ctrl) {
        zmq_msg_close(&c->frame);
        cmd_done(m, c, ECS_ERR_INVAL, "this mux has no control socket");
        return;
    }
    m->ctrl_dirty = true;
    if (zmq_send(m->ctrl, c->route->id, c->route->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_msg_send(&c->frame, m->ctrl, ZMQ_DONTWAIT) < 0) {
        const int err = zmq_errno();
        zmq_msg_close(&c->frame);
        char msg[160];
        snprintf(msg, sizeof msg, "control send: %s",
                 err == EHOSTUNREACH ? "that worker is not connected" : zmq_strerror(err));
        cmd_done(m, c, ECS_ERR_IO, msg);
        return;
    }
    cmd_done(m, c, ECS_OK, NULL);
}

static void drain_queue(mux_t *m)
{
    pthread_mutex_lock(&m->lock);
    cmd_t *c = m->q_head;
    m->q_head = m->q_tail = NULL;
    pthread_mutex_unlock(&m->lock);
    while (c) {
        cmd_t *next = c->next; /* c may be gone once done */
        switch (c->kind) {
        case CMD_CALL:
            do_call(m, c->call);
            break;
        case CMD_CONNECT:
            do_connect(m, c);
            break;
        case CMD_DISCONNECT:
            if (c->peer < 0 || c->peer >= atomic_load(&m->n_peers))
                cmd_done(m, c, ECS_ERR_INVAL, "no such peer");
            else {
                peer_close(m, c->peer, "peer disconnected");
                cmd_done(m, c, ECS_OK, NULL);
            }
            break;
        case CMD_CTRL_SEND:
            do_ctrl_send(m, c);
            break;
        case CMD_CANCEL:
            do_cancel(m, c->call);
            break;
        case CMD_STOP:
            m->stopping = true;
            cmd_done(m, c, ECS_OK, NULL);
            break;
        }
        c = next;
    }
}

/* ---- I/O thread: receiving ---- */

/* One message from a peer's data socket: a Result completes its call, an
 * Error with a request id fails it, everything else is dropped and counted
 * (a reply is never answered: that is how loops start). */
static void data_msg(mux_t *m, int id, zmq_msg_t *parts, int n)
{
    peer_t *p = m->peers[id];
    wire_msg_t w;
    ecs_err_t e;
    if (n > 2) {
        e = ecs_error(ECS_ERR_FORMAT, "reply of %d frames (at most 2)", n);
        memset(&w, 0, sizeof w);
    } else {
        e = wire_decode(zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0]),
                        n == 2 ? zmq_msg_data(&parts[1]) : NULL,
                        n == 2 ? zmq_msg_size(&parts[1]) : 0, n == 2, &w);
    }
    if (e) {
        ADD(p->bad_messages, 1);
        mux_set_last_error(m, p, ecs_errmsg());
        mux_call_t *c = w.kind == WIRE_RESULT && w.result.request_id
                            ? table_take(m, w.result.request_id, id) : NULL;
        if (c)
            call_fail(m, c, ECS_ERR_FORMAT, "bad reply: %s", ecs_errmsg());
        wire_msg_clear(&w);
        return;
    }
    if (w.kind != WIRE_ERROR && w.kind != WIRE_RESULT) {
        ADD(p->bad_messages, 1);
        char msg[128];
        snprintf(msg, sizeof msg, "unexpected %s on a data socket", wire_kind_name(w.kind));
        mux_set_last_error(m, p, msg);
        wire_msg_clear(&w);
        return;
    }
    const uint64_t rid = w.kind == WIRE_ERROR ? w.error.request_id : w.result.request_id;
    mux_call_t *c = rid ? table_take(m, rid, id) : NULL;
    if (!c) {
        bool dup = false;
        for (int i = 0; i < MUX_RECENT && !dup; i++)
            dup = m->recent[i].id == rid && m->recent[i].peer == id;
        mux_reply_unmatched(m, p, &w, dup);
        return;
    }
    mux_reply_apply(m, p, c, &w, n == 2 ? &parts[1] : NULL);
    call_finish(m, c);
}

static void data_in(mux_t *m, int id)
{
    peer_t *p = m->peers[id];
    zmq_msg_t parts[ZU_MAX_PARTS];
    int n;
    size_t bytes;
    p->sock_dirty = false; /* a read that ends in EAGAIN leaves ZMQ_FD to signal the next */
    for (int i = 0; p->sock; i++) {
        if (i == MUX_BATCH) {
            p->sock_dirty = true;
            return;
        }
        if (zu_recv(p->sock, parts, &n, &bytes) <= 0)
            return;
        ADD(p->bytes_in, bytes);
        if (!m->net.on || !mux_netem_in(m, id, parts, n))
            data_msg(m, id, parts, n);
        zu_close_parts(parts, n);
    }
}

static void inbox_push(mux_t *m, const mux_route_t *from, wire_msg_t *w)
{
    inbox_item_t *it = NULL;
    pthread_mutex_lock(&m->lock);
    if (m->in_count < MUX_INBOX_MAX && (it = malloc(sizeof *it))) {
        it->next = NULL;
        it->from = *from;
        it->msg = *w;
        if (m->in_tail)
            m->in_tail->next = it;
        else
            m->in_head = it;
        m->in_tail = it;
        m->in_count++;
        pthread_cond_broadcast(&m->ctrl_cond);
    }
    pthread_mutex_unlock(&m->lock);
    if (!it) { /* nobody reads the control messages: drop, count */
        ADD(m->ctrl_bad, 1);
        wire_msg_clear(w);
    }
}

/* Control messages from workers: valid ones go to the inbox; bad ones are
 * answered with an Error (unless they are an Error) and counted. */
static void ctrl_in(mux_t *m)
{
    zmq_msg_t parts[ZU_MAX_PARTS];
    int n;
    size_t bytes;
    m->ctrl_dirty = false; /* as in data_in */
    for (int i = 0;; i++) {
        if (i == MUX_BATCH) {
            m->ctrl_dirty = true;
            return;
        }
        if (zu_recv(m->ctrl, parts, &n, &bytes) <= 0)
            return;
        mux_route_t from = {.len = (uint8_t)zmq_msg_size(&parts[0])};
        memcpy(from.id, zmq_msg_data(&parts[0]), from.len);
        wire_msg_t w;
        memset(&w, 0, sizeof w);
        ecs_err_t e;
        if (n != 2 && n != 3)
            e = ecs_error(ECS_ERR_FORMAT, "control message of %d frames (1 wanted)", n - 1);
        else
            e = wire_decode(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]),
                            n == 3 ? zmq_msg_data(&parts[2]) : NULL,
                            n == 3 ? zmq_msg_size(&parts[2]) : 0, n == 3, &w);
        if (!e && wire_kind_has_payload(w.kind))
            e = ecs_error(ECS_ERR_FORMAT, "%s on the control socket", wire_kind_name(w.kind));
        if (e) {
            ADD(m->ctrl_bad, 1);
            if (w.kind != WIRE_ERROR)
                zu_send_error(m->ctrl, &from, zu_status_of(e), w.kind,
                              w.kind == WIRE_CALL ? w.call.request_id : 0, ecs_errmsg());
            wire_msg_clear(&w);
        } else {
            inbox_push(m, &from, &w);
        }
        zu_close_parts(parts, n);
    }
}

static int build_items(mux_t *m)
{
    int n = 0;
    m->items[n] = (zmq_pollitem_t){.fd = m->efd, .events = ZMQ_POLLIN};
    m->item_peer[n++] = -1;
    if (m->ctrl) {
        m->items[n] = (zmq_pollitem_t){.socket = m->ctrl, .events = ZMQ_POLLIN};
        m->item_peer[n++] = -2;
    }
    if (m->ctrl_mon) {
        m->items[n] = (zmq_pollitem_t){.socket = m->ctrl_mon, .events = ZMQ_POLLIN};
        m->item_peer[n++] = MUX_ITEM_CTRL_MON;
    }
    const int np = atomic_load(&m->n_peers);
    for (int i = 0; i < np; i++) {
        peer_t *p = m->peers[i];
        if (!p->sock)
            continue;
        m->items[n] = (zmq_pollitem_t){.socket = p->sock,
                                       .events = ZMQ_POLLIN | (p->pend_head ? ZMQ_POLLOUT : 0)};
        m->item_peer[n++] = i;
        if (p->mon) {
            m->items[n] = (zmq_pollitem_t){.socket = p->mon, .events = ZMQ_POLLIN};
            m->item_peer[n++] = -3 - i;
        }
    }
    return n;
}

/* The dirty flag of item i's socket; NULL for the eventfd. */
static bool *item_dirty(mux_t *m, int i)
{
    const int who = m->item_peer[i];
    return who == -1                  ? NULL
           : who == -2                ? &m->ctrl_dirty
           : who == MUX_ITEM_CTRL_MON ? &m->ctrl_mon_dirty
           : who <= -3                ? &m->peers[-3 - who]->mon_dirty
                                      : &m->peers[who]->sock_dirty;
}

/* Handles item i (its readiness rev, ZMQ_POLL* bits). */
static void item_in(mux_t *m, int i, short rev)
{
    const int who = m->item_peer[i];
    if (who == -1) {
        uint64_t v;
        if (read(m->efd, &v, sizeof v) < 0) { /* spurious: nothing to reset */ }
        drain_queue(m);
    } else if (who == -2) {
        ctrl_in(m);
    } else if (who == MUX_ITEM_CTRL_MON) { /* logs refused handshakes */
        m->ctrl_mon_dirty = false;
        int k = 0;
        while (k < MUX_BATCH && zu_monitor_event(m->ctrl_mon, "coordinator control", NULL))
            k++;
        m->ctrl_mon_dirty = k == MUX_BATCH;
    } else if (who <= -3) {
        if (m->peers[-3 - who]->sock)
            monitor_in(m, -3 - who);
    } else {
        if (rev & ZMQ_POLLIN)
            data_in(m, who);
        if ((rev & ZMQ_POLLOUT) && m->peers[who]->sock)
            peer_flush(m, m->peers[who]);
    }
}

/* zmq_poll (ZMQ_EVENTS of every socket, then poll()): what a socket
 * waiting for room below its HWM (POLLOUT) and ECS_TEST_NET need. */
static int io_pass_zmq(mux_t *m, int timeout_ms)
{
    const int n = build_items(m);
    const int got = zmq_poll(m->items, n, timeout_ms);
    if (got < 0)
        return zmq_errno() == EINTR ? 0 : -1;
    for (int i = 0; i < n; i++) /* ZMQ_EVENTS found nothing: clean (before any send below) */
        if (!m->items[i].revents && item_dirty(m, i))
            *item_dirty(m, i) = false;
    if (m->held)
        mux_netem_release(m, call_send_now, data_msg);
    for (int i = 0; i < n; i++)
        if (m->items[i].revents)
            item_in(m, i, m->items[i].revents);
    return got;
}

static bool any_pending(mux_t *m)
{
    const int np = atomic_load(&m->n_peers);
    for (int i = 0; i < np; i++)
        if (m->peers[i]->pend_head)
            return true;
    return false;
}

/* One poll() of the eventfd and every socket's ZMQ_FD, and a read of each
 * socket whose fd fired or that is dirty. zmq_poll would ask each socket
 * its ZMQ_EVENTS before and after sleeping, two system calls a socket each
 * time (~2 us each on this VM): a clean socket, read to EAGAIN, needs no
 * asking, its ZMQ_FD fires on the next message. */
int mux_io_pass(mux_t *m, int timeout_ms)
{
    if (m->net.on || any_pending(m))
        return io_pass_zmq(m, timeout_ms);
    const int n = build_items(m);
    struct pollfd pf[2 * MUX_MAX_PEERS + 3];
    bool dirty = false;
    for (int i = 0; i < n; i++) {
        int fd = m->items[i].fd;
        size_t len = sizeof fd;
        if (m->items[i].socket && zmq_getsockopt(m->items[i].socket, ZMQ_FD, &fd, &len) != 0)
            fd = -1; /* poll() skips it */
        pf[i] = (struct pollfd){.fd = fd, .events = POLLIN};
        dirty |= item_dirty(m, i) && *item_dirty(m, i);
    }
    if (poll(pf, (nfds_t)n, dirty ? 0 : timeout_ms) < 0)
        return errno == EINTR ? 0 : -1;
    int got = 0;
    for (int i = 0; i < n; i++) {
        bool *d = item_dirty(m, i);
        if (pf[i].revents || (d && *d)) {
            got++;
            item_in(m, i, ZMQ_POLLIN);
        }
    }
    return got;
}

/* Role held: handles what is queued and reads every dirty socket, without
 * poll(): after it every socket is read to EAGAIN, and ZeroMQ signals its
 * ZMQ_FD on the next change (the I/O thread, asleep in epoll on those, or
 * the next leader's poll() sees it). What came meanwhile on a clean socket
 * waits for them. */
static void settle(mux_t *m)
{
    if (m->net.on || any_pending(m)) {
        for (int i = 0; i < 64 && !m->stopping && io_pass_zmq(m, 0) > 0; i++) {
        }
        return;
    }
    for (int r = 0; r < 64 && !m->stopping; r++) {
        pthread_mutex_lock(&m->lock);
        bool busy = m->q_head != NULL;
        pthread_mutex_unlock(&m->lock);
        if (busy) {
            uint64_t v;
            if (read(m->efd, &v, sizeof v) < 0) { /* its write is yet to come */ }
            drain_queue(m);
        }
        const int n = build_items(m);
        for (int i = 0; i < n; i++) {
            bool *d = item_dirty(m, i);
            if (d && *d) {
                busy = true;
                item_in(m, i, ZMQ_POLLIN);
            }
        }
        if (!busy)
            return;
    }
}

bool mux_role_try(mux_t *m)
{
    if (m->net.on || pthread_mutex_trylock(&m->role) != 0)
        return false;
    if (m->stopping) {
        pthread_mutex_unlock(&m->role);
        return false;
    }
    return true;
}

/* The I/O thread's sockets in its epoll set: on (EPOLLIN) or off. */
static void io_arm(mux_t *m, bool on)
{
    struct epoll_event ev = {.events = on ? EPOLLIN : 0};
    if (m->io_inner >= 0 && epoll_ctl(m->io_ep, EPOLL_CTL_MOD, m->io_inner, &ev) == 0)
        m->io_disarmed = !on;
}

void mux_role_lead(mux_t *m) { io_arm(m, false); }

void mux_role_put(mux_t *m)
{
    settle(m);
    if (m->io_disarmed) /* level-triggered: what came after settle wakes it */
        io_arm(m, true);
    /* a socket opened or closed while held: its command's eventfd count
     * was read here, and an I/O thread already woken by it finds the
     * eventfd clean and sleeps on in its old set (epoll rechecks a
     * level-triggered fd), deaf to the new socket. Wake it to rebuild. */
    if (m->io_gen != m->sock_gen) {
        const uint64_t one = 1;
        if (write(m->efd, &one, sizeof one) < 0) { /* counter overflow only: already awake */ }
    }
    /* else its set is current: a command queued meanwhile (the stop, a
     * call) wakes it through the queue's eventfd, which it always watches */
    pthread_mutex_unlock(&m->role);
}

void mux_role_call(mux_t *m, mux_call_t *c)
{
    drain_queue(m); /* the caller's earlier calls, queued while the role was taken */
    do_call(m, c);
}

/* Role held: a fresh io_inner with the ZMQ_FD of every socket (ZeroMQ's
 * documented way to wait on a socket from an event loop; a plain fd, safe
 * to wait on while another thread uses the socket), in io_ep. */
static void io_rebuild(mux_t *m)
{
    if (m->io_inner >= 0)
        close(m->io_inner); /* leaves io_ep with it */
    m->io_inner = epoll_create1(EPOLL_CLOEXEC);
    m->io_disarmed = false;
    m->io_gen = m->sock_gen;
    if (m->io_inner < 0)
        return;
    const int n = build_items(m);
    for (int i = 0; i < n; i++) {
        int fd = m->items[i].fd;
        size_t len = sizeof fd;
        if (m->items[i].socket && zmq_getsockopt(m->items[i].socket, ZMQ_FD, &fd, &len) != 0)
            continue;
        if (fd == m->efd)
            continue; /* in io_ep itself: a leader never disarms it */
        struct epoll_event ev = {.events = EPOLLIN};
        epoll_ctl(m->io_inner, EPOLL_CTL_ADD, fd, &ev);
    }
    struct epoll_event ev = {.events = EPOLLIN};
    if (epoll_ctl(m->io_ep, EPOLL_CTL_ADD, m->io_inner, &ev) != 0) {
        close(m->io_inner);
        m->io_inner = -1;
    }
}

void *mux_io_main(void *arg)
{
    mux_t *m = arg;
    /* every call and reply passes through this thread when no caller holds
     * the role: woken while the caller's compute threads hold the cores, it
     * must run at once */
    zu_short_slice();
    pthread_mutex_lock(&m->role);
    while (!m->stopping) {
        if (m->net.on || m->io_ep < 0) { /* ECS_TEST_NET (held messages need a timer): keep the role */
            if (mux_io_pass(m, m->held ? mux_netem_timeout(m) : -1) < 0)
                break;
            continue;
        }
        mux_io_pass(m, 0); /* what woke it, the eventfd read (an error: settle goes on) */
        settle(m);
        if (m->stopping)
            break;
        if (m->io_inner < 0 || m->io_gen != m->sock_gen)
            io_rebuild(m);
        if (m->io_inner < 0) {
            close(m->io_ep);
            m->io_ep = -1;
            continue;
        }
        pthread_mutex_unlock(&m->role);
        struct epoll_event ev[2];
        if (epoll_wait(m->io_ep, ev, 2, -1) < 0 && errno != EINTR) {
            pthread_mutex_lock(&m->role);
            break;
        }
        pthread_mutex_lock(&m->role);
    }
    /* stop: refuse new commands, fail what is queued and in flight */
    pthread_mutex_lock(&m->lock);
    m->closed = true;
    pthread_mutex_unlock(&m->lock);
    drain_queue(m);
    const int np = atomic_load(&m->n_peers);
    for (int i = 0; i < np; i++)
        peer_close(m, i, "mux stopped");
    table_fail(m, -1, "mux stopped");
    mux_netem_free(m);
    pthread_mutex_unlock(&m->role); /* stopping: no caller takes it now */
    return NULL;
}
