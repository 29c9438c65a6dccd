/* mux_call.c - a call's outcome, shared by the ZeroMQ plane (mux.c) and
 * the shared-memory plane (mux_shm.c): a decoded reply applied to its call,
 * a reply that matches no call, and the completion that wakes the waiter.
 * Any thread; the caller owns the call's completion. */
#include "mux_impl.h"

#include <stdio.h>
#include <string.h>

#include "zutil.h"

/* Records the outcome (err/status/message already in c->res), wakes the
 * waiter, drops the reference of whoever completed it (the I/O thread's,
 * or the shared-memory plane's: mux_shm.c). Any thread. */
void mux_call_complete(mux_t *m, mux_call_t *c)
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
    pthread_mutex_lock(&m->lock);
    atomic_store_explicit(&c->done, true, memory_order_release);
    if (c->waiter) {
        if (--c->waiter->remaining == 0)
            pthread_cond_signal(&c->waiter->cond);
        c->waiter = NULL;
    }
    pthread_mutex_unlock(&m->lock);
    mux_call_unref(c);
}

void mux_call_abort(mux_t *m, mux_call_t *c, ecs_err_t err, const char *why)
{
    if (why != c->msgbuf)
        snprintf(c->msgbuf, sizeof c->msgbuf, "%s", why);
    c->res.err = err;
    c->res.status = WIRE_ST_INTERNAL;
    c->res.message = c->msgbuf;
    mux_call_complete(m, c);
}

/* A reply whose call is not in flight: an Error is noted, a Result counted
 * as a duplicate (dup: its id completed lately) or an unknown id; w freed. */
void mux_reply_unmatched(mux_t *m, peer_t *p, wire_msg_t *w, bool dup)
{
    if (w->kind == WIRE_ERROR) {
        ADD(p->errors_received, 1);
        mux_set_last_error(m, p, w->error.message);
    } else {
        ADD(*(dup ? &p->duplicate_replies : &p->unknown_ids), 1);
    }
    wire_msg_clear(w);
}

/* Fills c's outcome from its decoded reply w (a Result or an Error: moved
 * into c) and the Result's payload frame (moved, aligned); the caller
 * completes c. Shared by both planes. */
void mux_reply_apply(mux_t *m, peer_t *p, mux_call_t *c, wire_msg_t *w, zmq_msg_t *payload)
{
    if (w->kind == WIRE_ERROR) {
        ADD(p->errors_received, 1);
        mux_set_last_error(m, p, w->error.message);
        c->res.err = ECS_OK;
        c->res.status = w->error.code;
        c->reply = *w;
        c->res.message = c->reply.error.message;
        return;
    }
    const wire_result_t *r = &w->result;
    c->res.compute_ns = r->compute_ns;
    c->res.status = r->status;
    if (r->status == WIRE_ST_OK &&
        (r->n_entries != c->n_entries || r->n_embd != c->n_embd || r->dtype != c->result_dtype)) {
        ADD(p->bad_messages, 1);
        snprintf(c->msgbuf, sizeof c->msgbuf,
                 "reply has %u rows of %u (type %u), the call wants %u rows of %u (type %u)",
                 r->n_entries, r->n_embd, r->dtype, c->n_entries, c->n_embd, c->result_dtype);
        mux_set_last_error(m, p, c->msgbuf);
        c->res.err = ECS_ERR_FORMAT;
        c->res.message = c->msgbuf;
        wire_msg_clear(w);
        return;
    }
    c->res.err = ECS_OK;
    c->res.n_entries = r->n_entries;
    c->res.n_embd = r->n_embd;
    c->res.dtype = r->dtype;
    c->res.payload_bytes = r->payload_bytes;
    if (r->payload_bytes && payload) {
        /* a small frame lives inside zmq_msg_t: take its address after the move */
        zmq_msg_init(&c->rpayload);
        zmq_msg_move(&c->rpayload, payload);
        c->has_rpayload = true;
        if (zu_align(&c->rpayload)) {
            snprintf(c->msgbuf, sizeof c->msgbuf, "%s", ecs_errmsg());
            c->res.err = ECS_ERR_NOMEM;
            c->res.message = c->msgbuf;
            wire_msg_clear(w);
            return;
        }
        c->res.payload = zmq_msg_data(&c->rpayload);
    }
    c->reply = *w;
    c->res.message = c->reply.result.message;
}
