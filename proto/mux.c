/* mux.c - the coordinator's side of the transport: one I/O thread owns the
 * control ROUTER and every peer's DEALER; callers hand it calls and control
 * messages through a mutex-protected queue woken by an eventfd, and sleep
 * on condition variables until their calls complete. Replies find their
 * call through a hash table keyed by request id, owned by the I/O thread. */
#include "mux.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "zutil.h"

#define MUX_HASH 1024      /* call table buckets (power of two) */
#define MUX_RECENT 1024    /* completed ids remembered to tell duplicates from unknown ids */
#define MUX_INBOX_MAX 4096 /* control messages queued for mux_ctrl_recv before dropping */
#define MUX_BATCH 256      /* messages taken from one socket before polling the others */

typedef struct waiter {
    pthread_cond_t cond;
    int remaining;
} waiter_t;

typedef enum { CMD_CALL, CMD_CONNECT, CMD_DISCONNECT, CMD_CTRL_SEND, CMD_STOP } cmd_kind_t;

typedef struct cmd {
    cmd_kind_t kind;
    struct cmd *next;
    mux_call_t *call;          /* CMD_CALL */
    int peer;                  /* CMD_CONNECT (out), CMD_DISCONNECT */
    const char *endpoint;      /* CMD_CONNECT */
    const mux_route_t *route;  /* CMD_CTRL_SEND */
    zmq_msg_t frame;           /* CMD_CTRL_SEND: the encoded message */
    bool finished;             /* synchronous commands: done, with err/errmsg */
    ecs_err_t err;
    char errmsg[256];
} cmd_t;

struct mux_call {
    atomic_int refs;           /* the caller's and the I/O thread's */
    cmd_t cmd;
    uint64_t id;
    int peer;
    uint32_t n_rows, n_entries, n_embd, result_dtype;
    uint64_t t_submit;
    zmq_msg_t hdr, payload;    /* to send; emptied by a successful send */
    atomic_bool done;          /* set under m->lock */
    waiter_t *waiter;          /* under m->lock */
    mux_result_t res;
    zmq_msg_t rpayload;        /* the reply's payload frame, kept for res.payload */
    bool has_rpayload;
    wire_msg_t reply;          /* owns res.message when it came from the peer */
    char msgbuf[256];
    mux_call_t *hnext, *pnext; /* call table chain, peer's send queue (I/O thread) */
};

typedef struct {
    void *sock;                /* I/O thread only */
    char endpoint[256];
    atomic_bool connected;
    _Atomic uint64_t calls_in_flight, rows_in_flight, calls_sent, calls_ok, calls_failed;
    _Atomic uint64_t bytes_out, bytes_in, unknown_ids, duplicate_replies, bad_messages,
        errors_received;
    _Atomic uint64_t lat[MUX_LAT_BUCKETS];
    mux_call_t *pend_head, *pend_tail; /* waiting for room below the HWM (I/O thread) */
    char last_error[256];      /* under m->lock */
} peer_t;

typedef struct inbox_item {
    struct inbox_item *next;
    mux_route_t from;
    wire_msg_t msg;
} inbox_item_t;

struct mux {
    void *zctx;
    pthread_t thread;
    bool thread_started;
    int efd;
    int hwm;
    pthread_mutex_t lock;      /* queue, completions, inbox, command results, last_error */
    pthread_cond_t cmd_cond, ctrl_cond;
    cmd_t *q_head, *q_tail;
    bool closed;               /* the I/O thread has stopped taking commands */
    _Atomic uint64_t next_id;
    peer_t *peers[MUX_MAX_PEERS];
    atomic_int n_peers;
    void *ctrl;
    char ctrl_ep[256];
    inbox_item_t *in_head, *in_tail;
    size_t in_count;
    _Atomic uint64_t ctrl_bad;
    /* I/O thread only */
    mux_call_t *table[MUX_HASH];
    struct { uint64_t id; int peer; } recent[MUX_RECENT];
    unsigned recent_pos;
    bool stopping;
    zmq_pollitem_t items[MUX_MAX_PEERS + 2];
    int item_peer[MUX_MAX_PEERS + 2];
};

#define RELAXED memory_order_relaxed
#define ADD(x, v) atomic_fetch_add_explicit(&(x), (v), RELAXED)
#define SUB(x, v) atomic_fetch_sub_explicit(&(x), (v), RELAXED)
#define LOAD(x) atomic_load_explicit(&(x), RELAXED)

/* ---- calls ---- */

static void call_unref(mux_call_t *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    zmq_msg_close(&c->hdr);
    zmq_msg_close(&c->payload);
    if (c->has_rpayload)
        zmq_msg_close(&c->rpayload);
    wire_msg_clear(&c->reply);
    free(c);
}

/* Records the outcome (err/status/message already in c->res), wakes the
 * waiter, drops the I/O thread's reference. I/O thread only. */
static void call_finish(mux_t *m, mux_call_t *c)
{
    peer_t *p = m->peers[c->peer];
    const uint64_t now = zu_now_ns();
    c->res.rtt_ns = now - c->t_submit;
    c->res.request_id = c->id;
    c->res.peer = c->peer;
    if (!c->res.message)
        c->res.message = "";
    SUB(p->calls_in_flight, 1);
    SUB(p->rows_in_flight, c->n_rows);
    if (c->res.err == ECS_OK && c->res.status == WIRE_ST_OK) {
        ADD(p->calls_ok, 1);
        ADD(p->lat[zu_lat_bucket(c->res.rtt_ns)], 1);
    } else {
        ADD(p->calls_failed, 1);
    }
    m->recent[m->recent_pos++ % MUX_RECENT].id = c->id;
    m->recent[(m->recent_pos - 1) % MUX_RECENT].peer = c->peer;
    pthread_mutex_lock(&m->lock);
    atomic_store_explicit(&c->done, true, memory_order_release);
    if (c->waiter) {
        if (--c->waiter->remaining == 0)
            pthread_cond_signal(&c->waiter->cond);
        c->waiter = NULL;
    }
    pthread_mutex_unlock(&m->lock);
    call_unref(c);
}

static void call_fail(mux_t *m, mux_call_t *c, ecs_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void call_fail(mux_t *m, mux_call_t *c, ecs_err_t err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msgbuf, sizeof c->msgbuf, fmt, ap);
    va_end(ap);
    c->res.err = err;
    c->res.status = WIRE_ST_INTERNAL;
    c->res.message = c->msgbuf;
    call_finish(m, c);
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

static void set_last_error(mux_t *m, peer_t *p, const char *msg)
{
    pthread_mutex_lock(&m->lock);
    snprintf(p->last_error, sizeof p->last_error, "%s", msg);
    pthread_mutex_unlock(&m->lock);
}

/* ---- the queue ---- */

static bool enqueue(mux_t *m, cmd_t *c)
{
    pthread_mutex_lock(&m->lock);
    if (m->closed) {
        pthread_mutex_unlock(&m->lock);
        return false;
    }
    const bool was_empty = !m->q_head;
    c->next = NULL;
    if (m->q_tail)
        m->q_tail->next = c;
    else
        m->q_head = c;
    m->q_tail = c;
    pthread_mutex_unlock(&m->lock);
    if (was_empty) {
        const uint64_t one = 1;
        if (write(m->efd, &one, sizeof one) < 0) { /* counter overflow only: already awake */ }
    }
    return true;
}

/* Enqueues a synchronous command and sleeps until the I/O thread did it. */
static ecs_err_t run_sync(mux_t *m, cmd_t *c)
{
    c->finished = false;
    if (!enqueue(m, c))
        return ecs_error(ECS_ERR_IO, "mux is shutting down");
    pthread_mutex_lock(&m->lock);
    while (!c->finished)
        pthread_cond_wait(&m->cmd_cond, &m->lock);
    pthread_mutex_unlock(&m->lock);
    if (c->err)
        return ecs_error(c->err, "%s", c->errmsg);
    return ECS_OK;
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

static void do_call(mux_t *m, mux_call_t *c)
{
    peer_t *p = m->peers[c->peer];
    if (!p->sock) {
        call_fail(m, c, ECS_ERR_IO, "peer %s is disconnected", p->endpoint);
        return;
    }
    table_put(m, c);
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
    if (zmq_connect(s, c->endpoint) != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "connect %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
        zmq_close(s);
        free(p);
        cmd_done(m, c, ECS_ERR_IO, msg);
        return;
    }
    p->sock = s;
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
    zmq_close(p->sock);
    p->sock = NULL;
}

static void do_ctrl_send(mux_t *m, cmd_t *c)
{
    if (!m->ctrl) {
        zmq_msg_close(&c->frame);
        cmd_done(m, c, ECS_ERR_INVAL, "this mux has no control socket");
        return;
    }
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
        set_last_error(m, p, ecs_errmsg());
        mux_call_t *c = w.kind == WIRE_RESULT && w.result.request_id
                            ? table_take(m, w.result.request_id, id) : NULL;
        if (c)
            call_fail(m, c, ECS_ERR_FORMAT, "bad reply: %s", ecs_errmsg());
        wire_msg_clear(&w);
        return;
    }
    if (w.kind == WIRE_ERROR) {
        ADD(p->errors_received, 1);
        set_last_error(m, p, w.error.message);
        mux_call_t *c = w.error.request_id ? table_take(m, w.error.request_id, id) : NULL;
        if (c) {
            c->res.err = ECS_OK;
            c->res.status = w.error.code;
            c->reply = w;
            c->res.message = w.error.message;
            call_finish(m, c);
        } else {
            wire_msg_clear(&w);
        }
        return;
    }
    if (w.kind != WIRE_RESULT) {
        ADD(p->bad_messages, 1);
        char msg[128];
        snprintf(msg, sizeof msg, "unexpected %s on a data socket", wire_kind_name(w.kind));
        set_last_error(m, p, msg);
        wire_msg_clear(&w);
        return;
    }
    const wire_result_t *r = &w.result;
    mux_call_t *c = table_take(m, r->request_id, id);
    if (!c) {
        bool dup = false;
        for (int i = 0; i < MUX_RECENT && !dup; i++)
            dup = m->recent[i].id == r->request_id && m->recent[i].peer == id;
        ADD(*(dup ? &p->duplicate_replies : &p->unknown_ids), 1);
        wire_msg_clear(&w);
        return;
    }
    c->res.compute_ns = r->compute_ns;
    c->res.status = r->status;
    if (r->status == WIRE_ST_OK &&
        (r->n_entries != c->n_entries || r->n_embd != c->n_embd || r->dtype != c->result_dtype)) {
        ADD(p->bad_messages, 1);
        snprintf(c->msgbuf, sizeof c->msgbuf,
                 "reply has %u rows of %u (type %u), the call wants %u rows of %u (type %u)",
                 r->n_entries, r->n_embd, r->dtype, c->n_entries, c->n_embd, c->result_dtype);
        set_last_error(m, p, c->msgbuf);
        c->res.err = ECS_ERR_FORMAT;
        c->res.message = c->msgbuf;
        wire_msg_clear(&w);
        call_finish(m, c);
        return;
    }
    c->res.err = ECS_OK;
    c->res.n_entries = r->n_entries;
    c->res.n_embd = r->n_embd;
    c->res.dtype = r->dtype;
    c->res.payload_bytes = r->payload_bytes;
    if (r->payload_bytes) {
        /* a small frame lives inside zmq_msg_t: take its address after the move */
        zmq_msg_init(&c->rpayload);
        zmq_msg_move(&c->rpayload, &parts[1]);
        c->has_rpayload = true;
        if (zu_align(&c->rpayload)) {
            snprintf(c->msgbuf, sizeof c->msgbuf, "%s", ecs_errmsg());
            c->res.err = ECS_ERR_NOMEM;
            c->res.message = c->msgbuf;
            wire_msg_clear(&w);
            call_finish(m, c);
            return;
        }
        c->res.payload = zmq_msg_data(&c->rpayload);
    }
    c->reply = w;
    c->res.message = c->reply.result.message;
    call_finish(m, c);
}

static void data_in(mux_t *m, int id)
{
    peer_t *p = m->peers[id];
    zmq_msg_t parts[ZU_MAX_PARTS];
    int n;
    size_t bytes;
    for (int i = 0; i < MUX_BATCH && p->sock; i++) {
        if (zu_recv(p->sock, parts, &n, &bytes) <= 0)
            return;
        ADD(p->bytes_in, bytes);
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
    for (int i = 0; i < MUX_BATCH; i++) {
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
    const int np = atomic_load(&m->n_peers);
    for (int i = 0; i < np; i++) {
        peer_t *p = m->peers[i];
        if (!p->sock)
            continue;
        m->items[n] = (zmq_pollitem_t){.socket = p->sock,
                                       .events = ZMQ_POLLIN | (p->pend_head ? ZMQ_POLLOUT : 0)};
        m->item_peer[n++] = i;
    }
    return n;
}

static void *io_main(void *arg)
{
    mux_t *m = arg;
    while (!m->stopping) {
        const int n = build_items(m);
        if (zmq_poll(m->items, n, -1) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            break;
        }
        for (int i = 0; i < n; i++) {
            const short rev = m->items[i].revents;
            if (!rev)
                continue;
            const int who = m->item_peer[i];
            if (who == -1) {
                uint64_t v;
                if (read(m->efd, &v, sizeof v) < 0) { /* spurious: nothing to reset */ }
                drain_queue(m);
            } else if (who == -2) {
                ctrl_in(m);
            } else {
                if (rev & ZMQ_POLLIN)
                    data_in(m, who);
                if ((rev & ZMQ_POLLOUT) && m->peers[who]->sock)
                    peer_flush(m, m->peers[who]);
            }
        }
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
    return NULL;
}

/* ---- public ---- */

ecs_err_t mux_new(const mux_opts_t *opts, mux_t **out)
{
    *out = NULL;
    mux_t *m = calloc(1, sizeof *m);
    if (!m)
        return ecs_error(ECS_ERR_NOMEM, "mux: out of memory");
    ecs_err_t e = ECS_OK;
    m->efd = -1;
    m->hwm = opts && opts->hwm > 0 ? opts->hwm : MUX_DEFAULT_HWM;
    atomic_init(&m->next_id, 1);
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->cmd_cond, NULL);
    pthread_cond_init(&m->ctrl_cond, NULL);
    if (!(m->zctx = zmq_ctx_new())) {
        e = ecs_error(ECS_ERR_IO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if ((m->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        e = ecs_error(ECS_ERR_IO, "eventfd: %s", strerror(errno));
        goto fail;
    }
    if (opts && opts->control_bind) {
        const int one = 1;
        /* a Drain or Error to a worker gets a moment to leave on close */
        if ((e = zu_socket(m->zctx, ZMQ_ROUTER, m->hwm, 200, &m->ctrl)))
            goto fail;
        zmq_setsockopt(m->ctrl, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
        if (zmq_bind(m->ctrl, opts->control_bind) != 0) {
            e = ecs_error(ECS_ERR_IO, "bind %s: %s", opts->control_bind,
                          zmq_strerror(zmq_errno()));
            goto fail;
        }
        zu_last_endpoint(m->ctrl, m->ctrl_ep, sizeof m->ctrl_ep);
    }
    if (pthread_create(&m->thread, NULL, io_main, m) != 0) {
        e = ecs_error(ECS_ERR_INTERNAL, "mux: cannot start the I/O thread");
        goto fail;
    }
    m->thread_started = true;
    *out = m;
    return ECS_OK;
fail:
    mux_free(m);
    return e;
}

void mux_free(mux_t *m)
{
    if (!m)
        return;
    if (m->thread_started) {
        cmd_t stop = {.kind = CMD_STOP};
        run_sync(m, &stop);
        pthread_join(m->thread, NULL);
    }
    if (m->ctrl) {
        zu_unbind(m->ctrl, m->ctrl_ep);
        zmq_close(m->ctrl);
    }
    const int np = atomic_load(&m->n_peers);
    for (int i = 0; i < np; i++)
        free(m->peers[i]);
    for (inbox_item_t *it = m->in_head, *next; it; it = next) {
        next = it->next;
        wire_msg_clear(&it->msg);
        free(it);
    }
    if (m->zctx)
        zmq_ctx_term(m->zctx);
    if (m->efd >= 0)
        close(m->efd);
    pthread_cond_destroy(&m->cmd_cond);
    pthread_cond_destroy(&m->ctrl_cond);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

const char *mux_control_endpoint(const mux_t *m) { return m->ctrl_ep; }

ecs_err_t mux_peer_connect(mux_t *m, const char *endpoint, int *peer)
{
    if (!endpoint || !*endpoint)
        return ecs_error(ECS_ERR_INVAL, "mux_peer_connect: empty endpoint");
    cmd_t c = {.kind = CMD_CONNECT, .endpoint = endpoint, .peer = -1};
    ecs_err_t e = run_sync(m, &c);
    if (e == ECS_OK)
        *peer = c.peer;
    return e;
}

ecs_err_t mux_peer_disconnect(mux_t *m, int peer)
{
    cmd_t c = {.kind = CMD_DISCONNECT, .peer = peer};
    return run_sync(m, &c);
}

static peer_t *get_peer(mux_t *m, int peer)
{
    if (peer < 0 || peer >= atomic_load_explicit(&m->n_peers, memory_order_acquire))
        return NULL;
    return m->peers[peer];
}

ecs_err_t mux_submit(mux_t *m, int peer, wire_call_t *wc, mux_call_t **out)
{
    *out = NULL;
    peer_t *p = get_peer(m, peer);
    if (!p || !atomic_load(&p->connected))
        return ecs_error(ECS_ERR_INVAL, "mux_submit: peer %d is not connected", peer);
    wc->request_id = atomic_fetch_add(&m->next_id, 1);
    wire_msg_t wm = {.kind = WIRE_CALL, .call = *wc};
    ecs_err_t e = wire_check(&wm);
    if (e)
        return e;
    mux_call_t *c = calloc(1, sizeof *c);
    if (!c)
        return ecs_error(ECS_ERR_NOMEM, "mux_submit: out of memory");
    zmq_msg_init(&c->hdr);
    zmq_msg_init(&c->payload);
    atomic_init(&c->refs, 2);
    c->id = wc->request_id;
    c->peer = peer;
    c->n_rows = wc->n_rows;
    c->n_entries = (uint32_t)wc->n_entries;
    c->n_embd = wc->n_embd;
    c->result_dtype = wc->result_dtype;
    c->cmd.kind = CMD_CALL;
    c->cmd.call = c;
    zmq_msg_close(&c->hdr);
    if ((e = zu_encode(&wm, &c->hdr))) {
        zmq_msg_init(&c->hdr);
        goto fail;
    }
    zmq_msg_close(&c->payload);
    if (zmq_msg_init_size(&c->payload, wc->payload_bytes)) {
        zmq_msg_init(&c->payload);
        e = ecs_error(ECS_ERR_NOMEM, "mux_submit: no memory for %zu payload bytes",
                      wc->payload_bytes);
        goto fail;
    }
    memcpy(zmq_msg_data(&c->payload), wc->payload, wc->payload_bytes);
    ADD(p->calls_in_flight, 1);
    ADD(p->rows_in_flight, wc->n_rows);
    c->t_submit = zu_now_ns();
    if (!enqueue(m, &c->cmd)) {
        SUB(p->calls_in_flight, 1);
        SUB(p->rows_in_flight, wc->n_rows);
        e = ecs_error(ECS_ERR_IO, "mux is shutting down");
        goto fail;
    }
    *out = c;
    return ECS_OK;
fail:
    atomic_store(&c->refs, 1);
    call_unref(c);
    return e;
}

int mux_wait(mux_t *m, mux_call_t *const *calls, int n, int timeout_ms)
{
    waiter_t w = {.remaining = 0};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cond, &ca);
    pthread_condattr_destroy(&ca);
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    if (timeout_ms >= 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < n; i++)
        if (!atomic_load(&calls[i]->done)) {
            calls[i]->waiter = &w;
            w.remaining++;
        }
    while (w.remaining > 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&w.cond, &m->lock);
        else if (pthread_cond_timedwait(&w.cond, &m->lock, &dl) == ETIMEDOUT)
            break;
    }
    for (int i = 0; i < n; i++)
        if (calls[i]->waiter == &w)
            calls[i]->waiter = NULL;
    const int left = w.remaining;
    pthread_mutex_unlock(&m->lock);
    pthread_cond_destroy(&w.cond);
    return left;
}

bool mux_call_done(const mux_call_t *c)
{
    return atomic_load_explicit(&((mux_call_t *)c)->done, memory_order_acquire);
}

const mux_result_t *mux_call_result(const mux_call_t *c)
{
    return mux_call_done(c) ? &c->res : NULL;
}

void mux_call_release(mux_call_t *c)
{
    if (c)
        call_unref(c);
}

ecs_err_t mux_peer_stats(mux_t *m, int peer, mux_peer_stats_t *o)
{
    peer_t *p = get_peer(m, peer);
    if (!p)
        return ecs_error(ECS_ERR_INVAL, "mux_peer_stats: no peer %d", peer);
    memset(o, 0, sizeof *o);
    o->connected = atomic_load(&p->connected);
    memcpy(o->endpoint, p->endpoint, sizeof o->endpoint);
    o->calls_in_flight = LOAD(p->calls_in_flight);
    o->rows_in_flight = LOAD(p->rows_in_flight);
    o->calls_sent = LOAD(p->calls_sent);
    o->calls_ok = LOAD(p->calls_ok);
    o->calls_failed = LOAD(p->calls_failed);
    o->bytes_out = LOAD(p->bytes_out);
    o->bytes_in = LOAD(p->bytes_in);
    o->unknown_ids = LOAD(p->unknown_ids);
    o->duplicate_replies = LOAD(p->duplicate_replies);
    o->bad_messages = LOAD(p->bad_messages);
    o->errors_received = LOAD(p->errors_received);
    for (int i = 0; i < MUX_LAT_BUCKETS; i++)
        o->latency_us[i] = LOAD(p->lat[i]);
    pthread_mutex_lock(&m->lock);
    memcpy(o->last_error, p->last_error, sizeof o->last_error);
    pthread_mutex_unlock(&m->lock);
    return ECS_OK;
}

uint32_t mux_peer_inflight(mux_t *m, int peer)
{
    peer_t *p = get_peer(m, peer);
    return p ? (uint32_t)LOAD(p->calls_in_flight) : UINT32_MAX;
}

uint64_t mux_latency_quantile(const uint64_t hist[MUX_LAT_BUCKETS], double q)
{
    uint64_t total = 0, acc = 0;
    for (int i = 0; i < MUX_LAT_BUCKETS; i++)
        total += hist[i];
    if (!total)
        return 0;
    for (int i = 0; i < MUX_LAT_BUCKETS; i++) {
        acc += hist[i];
        if ((double)acc >= q * (double)total)
            return 2ull << i;
    }
    return 2ull << (MUX_LAT_BUCKETS - 1);
}

ecs_err_t mux_ctrl_recv(mux_t *m, mux_route_t *from, wire_msg_t *msg, int timeout_ms)
{
    memset(msg, 0, sizeof *msg);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&m->lock);
    while (!m->in_head && !m->closed) {
        if (timeout_ms < 0)
            pthread_cond_wait(&m->ctrl_cond, &m->lock);
        else if (pthread_cond_timedwait(&m->ctrl_cond, &m->lock, &dl) == ETIMEDOUT)
            break;
    }
    inbox_item_t *it = m->in_head;
    if (it) {
        m->in_head = it->next;
        if (!m->in_head)
            m->in_tail = NULL;
        m->in_count--;
    }
    pthread_mutex_unlock(&m->lock);
    if (it) {
        *from = it->from;
        *msg = it->msg;
        free(it);
    }
    return ECS_OK;
}

ecs_err_t mux_ctrl_send(mux_t *m, const mux_route_t *to, const wire_msg_t *msg)
{
    if (wire_kind_has_payload(msg->kind))
        return ecs_error(ECS_ERR_INVAL, "mux_ctrl_send: %s is not a control message",
                         wire_kind_name(msg->kind));
    cmd_t c = {.kind = CMD_CTRL_SEND, .route = to};
    ecs_err_t e = zu_encode(msg, &c.frame);
    if (e)
        return e;
    if ((e = run_sync(m, &c)) == ECS_ERR_IO && !c.finished)
        zmq_msg_close(&c.frame); /* never reached the I/O thread */
    return e;
}

uint64_t mux_ctrl_bad(mux_t *m) { return LOAD(m->ctrl_bad); }
