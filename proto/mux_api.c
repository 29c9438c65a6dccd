/* mux_api.c - the coordinator mux's functions that caller threads run:
 * lifecycle, the command queue, submit (encode and copy in the caller's
 * thread; sent from it too when the I/O role is free), wait (the role's
 * holder polls, the others sleep on condition variables, nothing spins),
 * results, counters and the control inbox. Sockets are touched only by the
 * role's holder (mux.c). */
#include "mux_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "zutil.h"

void mux_call_unref(mux_call_t *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    zmq_msg_close(&c->hdr);
    zmq_msg_close(&c->payload);
    if (c->has_rpayload)
        zmq_msg_close(&c->rpayload);
    wire_msg_clear(&c->reply);
    if (c->shm)
        mux_shm_put(c->shm);
    free(c);
}

bool mux_enqueue(mux_t *m, cmd_t *c)
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
ecs_err_t mux_run_sync(mux_t *m, cmd_t *c)
{
    c->finished = false;
    if (!mux_enqueue(m, c))
        return ecs_error(ECS_ERR_IO, "mux is shutting down");
    pthread_mutex_lock(&m->lock);
    while (!c->finished)
        pthread_cond_wait(&m->cmd_cond, &m->lock);
    pthread_mutex_unlock(&m->lock);
    if (c->err)
        return ecs_error(c->err, "%s", c->errmsg);
    return ECS_OK;
}

peer_t *mux_get_peer(mux_t *m, int peer)
{
    if (peer < 0 || peer >= atomic_load_explicit(&m->n_peers, memory_order_acquire))
        return NULL;
    return m->peers[peer];
}

ecs_err_t mux_new(const mux_opts_t *opts, mux_t **out)
{
    *out = NULL;
    mux_t *m = calloc(1, sizeof *m);
    if (!m)
        return ecs_error(ECS_ERR_NOMEM, "mux: out of memory");
    ecs_err_t e = ECS_OK;
    m->efd = m->io_ep = m->io_inner = -1;
    m->hwm = opts && opts->hwm > 0 ? opts->hwm : MUX_DEFAULT_HWM;
    atomic_init(&m->next_id, 1);
    pthread_mutex_init(&m->lock, NULL);
    pthread_mutex_init(&m->role, NULL);
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
    struct epoll_event ev = {.events = EPOLLIN};
    if ((m->io_ep = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        epoll_ctl(m->io_ep, EPOLL_CTL_ADD, m->efd, &ev) != 0) {
        e = ecs_error(ECS_ERR_IO, "epoll: %s", strerror(errno));
        goto fail;
    }
    if (opts && opts->curve.key) {
        m->key = *opts->curve.key;
        m->curve = opts->curve;
        m->curve.key = &m->key;
    }
    /* test only: an emulated bad network (netem.c) */
    if ((e = mux_netem_parse(getenv("ECS_TEST_NET"), &m->net)))
        goto fail;
    if (m->net.on)
        fprintf(stderr, "mux: ECS_TEST_NET: data plane delayed %d+0..%d ms each way, %.3g%% of "
                "messages dropped (test only)\n", m->net.delay_ms, m->net.jitter_ms,
                m->net.drop * 100);
    if (opts && opts->control_bind) {
        const int one = 1;
        /* a Drain or Error to a worker gets a moment to leave on close */
        if ((e = zu_socket(m->zctx, ZMQ_ROUTER, m->hwm, 200, &m->ctrl)))
            goto fail;
        zmq_setsockopt(m->ctrl, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
        if ((e = zu_curve_server(m->zctx, m->ctrl, &m->curve, "coordinator control", &m->auth)))
            goto fail;
        if (m->curve.key)
            m->ctrl_mon = zu_handshake_monitor(m->zctx, m->ctrl, 0);
        if (zmq_bind(m->ctrl, opts->control_bind) != 0) {
            e = ecs_error(ECS_ERR_IO, "bind %s: %s", opts->control_bind,
                          zmq_strerror(zmq_errno()));
            goto fail;
        }
        zu_last_endpoint(m->ctrl, m->ctrl_ep, sizeof m->ctrl_ep);
        /* dirty until first read to EAGAIN: a new pipe's first message
         * does not signal ZMQ_FD (its reader was never seen asleep), so the
         * monitor's first failed handshake went unread */
        m->ctrl_dirty = m->ctrl_mon_dirty = true;
    }
    if (pthread_create(&m->thread, NULL, mux_io_main, m) != 0) {
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
        mux_run_sync(m, &stop);
        pthread_join(m->thread, NULL);
    }
    if (m->ctrl) {
        zu_unbind(m->ctrl, m->ctrl_ep);
        zmq_close(m->ctrl);
    }
    if (m->ctrl_mon)
        zmq_close(m->ctrl_mon);
    curve_auth_stop(m->auth); /* before zmq_ctx_term: it owns a socket of zctx */
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
    if (m->io_inner >= 0)
        close(m->io_inner);
    if (m->io_ep >= 0)
        close(m->io_ep);
    pthread_cond_destroy(&m->cmd_cond);
    pthread_cond_destroy(&m->ctrl_cond);
    pthread_mutex_destroy(&m->lock);
    pthread_mutex_destroy(&m->role);
    free(m);
}

const char *mux_control_endpoint(const mux_t *m) { return m->ctrl_ep; }

ecs_err_t mux_peer_connect(mux_t *m, const char *endpoint, int *peer)
{
    return mux_peer_connect_key(m, endpoint, NULL, peer);
}

ecs_err_t mux_peer_connect_key(mux_t *m, const char *endpoint, const char *server_pub, int *peer)
{
    if (!endpoint || !*endpoint)
        return ecs_error(ECS_ERR_INVAL, "mux_peer_connect: empty endpoint");
    if (m->curve.key && (!server_pub || strlen(server_pub) != CURVE_Z85_LEN))
        return ecs_error(ECS_ERR_INVAL, "mux_peer_connect: CURVE is on and %s has no valid "
                         "public key", endpoint);
    cmd_t c = {.kind = CMD_CONNECT, .endpoint = endpoint, .server_pub = server_pub, .peer = -1};
    ecs_err_t e = mux_run_sync(m, &c);
    if (e == ECS_OK)
        *peer = c.peer;
    return e;
}

ecs_err_t mux_peer_disconnect(mux_t *m, int peer)
{
    cmd_t c = {.kind = CMD_DISCONNECT, .peer = peer};
    return mux_run_sync(m, &c);
}

ecs_err_t mux_call_prepare(mux_t *m, int peer, wire_call_t *wc, void **payload,
                           mux_call_t **out)
{
    *out = NULL;
    *payload = NULL;
    peer_t *p = mux_get_peer(m, peer);
    if (!p || !atomic_load(&p->connected))
        return ecs_error(ECS_ERR_INVAL, "mux: peer %d is not connected", peer);
    if (wc->payload_bytes > WIRE_MAX_PAYLOAD)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall: payload of %zu bytes exceeds %zu",
                         wc->payload_bytes, WIRE_MAX_PAYLOAD);
    mux_call_t *c = calloc(1, sizeof *c);
    if (!c)
        return ecs_error(ECS_ERR_NOMEM, "mux: out of memory");
    zmq_msg_init(&c->hdr);
    atomic_init(&c->refs, 1); /* the I/O thread's comes with mux_call_send */
    ecs_err_t e = ECS_OK;
    if (zmq_msg_init_size(&c->payload, wc->payload_bytes)) {
        zmq_msg_init(&c->payload);
        e = ecs_error(ECS_ERR_NOMEM, "mux: no memory for %zu payload bytes", wc->payload_bytes);
        goto fail;
    }
    wc->request_id = atomic_fetch_add(&m->next_id, 1);
    wire_msg_t wm = {.kind = WIRE_CALL, .call = *wc};
    wm.call.payload = wc->payload_bytes ? zmq_msg_data(&c->payload) : NULL;
    zmq_msg_close(&c->hdr);
    if ((e = zu_encode(&wm, &c->hdr))) { /* validates the call */
        zmq_msg_init(&c->hdr);
        goto fail;
    }
    c->id = wc->request_id;
    c->peer = peer;
    c->n_rows = wc->n_rows;
    c->n_entries = (uint32_t)wire_call_result_rows(wc);
    c->n_embd = wc->n_embd;
    c->result_dtype = wc->result_dtype;
    c->cmd.kind = CMD_CALL;
    c->cmd.call = c;
    *payload = wc->payload_bytes ? zmq_msg_data(&c->payload) : NULL;
    *out = c;
    return ECS_OK;
fail:
    mux_call_unref(c);
    return e;
}

ecs_err_t mux_call_send(mux_t *m, mux_call_t *c)
{
    peer_t *p = m->peers[c->peer];
    if (c->t_submit)
        return ecs_error(ECS_ERR_INVAL, "mux_call_send: call %llu was sent already",
                         (unsigned long long)c->id);
    atomic_fetch_add(&c->refs, 1);
    ADD(p->calls_in_flight, 1);
    ADD(p->rows_in_flight, c->n_rows);
    c->t_submit = zu_now_ns();
    if (mux_shm_send(m, p, c))
        return ECS_OK;
    if (mux_role_try(m)) { /* nobody does I/O now: send from this thread */
        mux_role_call(m, c);
        mux_role_put(m);
        return ECS_OK;
    }
    if (!mux_enqueue(m, &c->cmd)) {
        SUB(p->calls_in_flight, 1);
        SUB(p->rows_in_flight, c->n_rows);
        atomic_fetch_sub(&c->refs, 1);
        return ecs_error(ECS_ERR_IO, "mux is shutting down");
    }
    return ECS_OK;
}

ecs_err_t mux_submit(mux_t *m, int peer, wire_call_t *wc, mux_call_t **out)
{
    void *payload;
    ecs_err_t e = mux_call_prepare(m, peer, wc, &payload, out);
    if (e)
        return e;
    if (wc->payload_bytes)
        memcpy(payload, wc->payload, wc->payload_bytes);
    if ((e = mux_call_send(m, *out))) {
        mux_call_unref(*out);
        *out = NULL;
    }
    return e;
}

static bool all_done(mux_call_t *const *calls, int n)
{
    for (int i = 0; i < n; i++)
        if (!atomic_load_explicit(&calls[i]->done, memory_order_acquire))
            return false;
    return true;
}

/* The I/O role, if free: this thread polls the sockets itself until its
 * calls are done or the deadline (ns, 0: none) passed, handling whatever
 * comes (other threads' replies and commands too), then hands the role
 * back. No thread hand-off on the way: the reply wakes this thread. */
static void lead(mux_t *m, mux_call_t *const *calls, int n, uint64_t dl_ns)
{
    if (all_done(calls, n) || !mux_role_try(m))
        return;
    mux_role_lead(m);
    while (!all_done(calls, n) && !m->stopping) {
        int ms = -1;
        if (dl_ns) {
            const uint64_t now = zu_now_ns();
            if (now >= dl_ns)
                break;
            ms = (int)((dl_ns - now + 999999ull) / 1000000ull);
        }
        if (mux_io_pass(m, ms) < 0)
            break;
    }
    mux_role_put(m);
}

int mux_wait(mux_t *m, mux_call_t *const *calls, int n, int timeout_ms)
{
    /* calls on a shared-memory plane: this thread reads their results off
     * the ring itself (no I/O thread in between), one plane at a time */
    const uint64_t dl_ns = timeout_ms < 0 ? 0 : zu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (int i = 0; i < n; i++)
        if (calls[i]->shm && !atomic_load(&calls[i]->done))
            mux_shm_wait(m, calls[i], dl_ns);
    lead(m, calls, n, dl_ns);
    if (all_done(calls, n))
        return 0; /* the common case: no condition variable to set up */
    if (timeout_ms >= 0) {
        const uint64_t now = zu_now_ns();
        timeout_ms = now >= dl_ns ? 0 : (int)((dl_ns - now) / 1000000ull);
    }
    waiter_t w = {.remaining = 0};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cond, &ca);
    pthread_condattr_destroy(&ca);
    struct timespec dl;
    zu_deadline(CLOCK_MONOTONIC, timeout_ms, &dl);
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

ecs_err_t mux_call_cancel(mux_t *m, mux_call_t *c)
{
    if (!c->t_submit)
        return ecs_error(ECS_ERR_INVAL, "mux_call_cancel: call %llu was not sent",
                         (unsigned long long)c->id);
    if (mux_call_done(c) || mux_shm_cancel(m, c) || atomic_exchange(&c->cancelling, true))
        return ECS_OK;
    atomic_fetch_add(&c->refs, 1); /* until the I/O thread has seen it */
    c->cancel.kind = CMD_CANCEL;
    c->cancel.call = c;
    if (!mux_enqueue(m, &c->cancel)) {
        mux_call_unref(c);
        return ECS_OK; /* the mux is stopping: it fails every call itself */
    }
    return ECS_OK;
}

void mux_call_release(mux_call_t *c)
{
    if (c)
        mux_call_unref(c);
}

ecs_err_t mux_peer_stats(mux_t *m, int peer, mux_peer_stats_t *o)
{
    peer_t *p = mux_get_peer(m, peer);
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
    o->calls_shm = LOAD(p->calls_shm);
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
    peer_t *p = mux_get_peer(m, peer);
    return p ? (uint32_t)LOAD(p->calls_in_flight) : UINT32_MAX;
}

uint64_t mux_peer_drops(mux_t *m, int peer)
{
    peer_t *p = mux_get_peer(m, peer);
    return p ? LOAD(p->drops) : 0;
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
    zu_deadline(CLOCK_REALTIME, timeout_ms, &dl);
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
    if ((e = mux_run_sync(m, &c)) == ECS_ERR_IO && !c.finished)
        zmq_msg_close(&c.frame); /* never reached the I/O thread */
    return e;
}

uint64_t mux_ctrl_bad(mux_t *m) { return LOAD(m->ctrl_bad); }
