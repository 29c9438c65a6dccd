/* mux_fixture.h - what test_mux.c and test_mux_server.c share: test calls
 * and the answer a worker must give, a worker server on its own thread, a
 * raw ROUTER that plays a worker by hand, a raw DEALER that plays a
 * coordinator by hand. Real sockets: ipc in /tmp, tcp on loopback. */
#ifndef ECS_TEST_MUX_FIXTURE_H
#define ECS_TEST_MUX_FIXTURE_H

/* each test file uses some of these */
#define FX static __attribute__((unused))

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/mux.h"

#define EMBD 32
#define K 4

/* ---- a call and its expected answer ---- */

typedef struct {
    float x[8 * EMBD];
    uint32_t experts[2], counts[2], rows[16], slots[16];
    wire_call_t c;
} tcall_t;

/* n_rows rows; expert e0 takes every row, expert e0 + 1 the odd ones. */
FX void tcall_make(tcall_t *t, uint32_t n_rows, float seed)
{
    memset(t, 0, sizeof *t);
    for (uint32_t i = 0; i < n_rows * EMBD; i++)
        t->x[i] = seed + (float)i;
    const uint32_t e0 = (uint32_t)seed % 100;
    size_t n = 0;
    for (uint32_t r = 0; r < n_rows; r++, n++) {
        t->rows[n] = r;
        t->slots[n] = r % K;
    }
    t->experts[0] = e0;
    t->counts[0] = n_rows;
    for (uint32_t r = 1; r < n_rows; r += 2, n++) {
        t->rows[n] = r;
        t->slots[n] = (r + 1) % K;
    }
    t->experts[1] = e0 + 1;
    t->counts[1] = (uint32_t)(n - n_rows);
    t->c = (wire_call_t){.layer = 2, .n_rows = n_rows, .n_embd = EMBD, .dtype = ECS_TYPE_F32,
                         .k = K, .n_experts = t->counts[1] ? 2 : 1, .experts = t->experts,
                         .expert_counts = t->counts, .n_entries = n, .row_index = t->rows,
                         .slot = t->slots, .result_dtype = ECS_TYPE_F32, .payload = t->x,
                         .payload_bytes = (size_t)n_rows * EMBD * sizeof(float)};
}

/* What a worker answers: entry j of expert e = x[row] * (e + 1) + slot.
 * Reads x with memcpy: the raw test workers below see frames where ZeroMQ
 * put them, at any address. */
FX void compute(const wire_call_t *c, float *out)
{
    const uint8_t *x = c->payload;
    size_t j = 0;
    for (size_t i = 0; i < c->n_experts; i++)
        for (uint32_t q = 0; q < c->expert_counts[i]; q++, j++)
            for (uint32_t v = 0; v < c->n_embd; v++) {
                float xv;
                memcpy(&xv, x + ((size_t)c->row_index[j] * c->n_embd + v) * sizeof xv, sizeof xv);
                out[j * c->n_embd + v] = xv * (float)(c->experts[i] + 1) + (float)c->slot[j];
            }
}

FX void check_result(const tcall_t *t, mux_call_t *call)
{
    const mux_result_t *r = mux_call_result(call);
    cr_assert_not_null(r, "call %llu not done", (unsigned long long)t->c.request_id);
    cr_assert_eq(r->err, ECS_OK, "%s", r->message);
    cr_assert_eq(r->status, WIRE_ST_OK, "%s", r->message);
    cr_assert_eq(r->request_id, t->c.request_id);
    cr_assert_eq(r->n_entries, t->c.n_entries);
    float want[16 * EMBD];
    compute(&t->c, want);
    cr_assert_eq(r->payload_bytes, t->c.n_entries * EMBD * sizeof(float));
    cr_assert_eq((uintptr_t)r->payload % WIRE_PAYLOAD_ALIGN, 0, "result payload misaligned");
    cr_assert_arr_eq(r->payload, want, r->payload_bytes, "call %llu got another call's rows",
                     (unsigned long long)t->c.request_id);
}

FX void ipc_path(char *buf, size_t cap, const char *tag)
{
    static atomic_int seq;
    snprintf(buf, cap, "ipc:///tmp/ecs-test-mux-%d-%s-%d", (int)getpid(), tag,
             atomic_fetch_add(&seq, 1));
}

/* ---- a worker server on its own thread ---- */

typedef struct {
    mux_server_t *s;
    pthread_t th;
    atomic_int ctrl_seen;
    atomic_int last_ctrl_kind;
} tserver_t;

FX void on_call(void *ctx, const wire_call_t *c, mux_reply_t *r)
{
    (void)ctx;
    if (c->layer == 98) /* the test's way to be slow */
        usleep(2000000);
    if (c->layer == 99) { /* the test's way to ask for a refusal */
        r->status = WIRE_ST_NOT_ASSIGNED;
        snprintf(r->message, sizeof r->message, "layer 99 is not held here");
        return;
    }
    cr_assert_eq((uintptr_t)c->payload % WIRE_PAYLOAD_ALIGN, 0, "call payload misaligned");
    compute(c, r->rows);
}

FX void on_ctrl(void *ctx, int conn, const wire_msg_t *m)
{
    (void)conn;
    tserver_t *t = ctx;
    atomic_store(&t->last_ctrl_kind, m->kind);
    atomic_fetch_add(&t->ctrl_seen, 1);
}

FX void *server_main(void *p)
{
    tserver_t *t = p;
    cr_assert_eq(mux_server_run(t->s), ECS_OK);
    return NULL;
}

FX void server_start(tserver_t *t, const char *bind)
{
    memset(t, 0, sizeof *t);
    mux_server_opts_t o = {.data_bind = bind, .tick_ms = 50};
    mux_server_ops_t ops = {.on_call = on_call, .on_ctrl = on_ctrl};
    cr_assert_eq(mux_server_new(&o, &ops, t, &t->s), ECS_OK, "%s", ecs_errmsg());
}

FX void server_run(tserver_t *t)
{
    cr_assert_eq(pthread_create(&t->th, NULL, server_main, t), 0);
}

FX void server_stop(tserver_t *t)
{
    mux_server_stop(t->s);
    pthread_join(t->th, NULL);
    mux_server_free(t->s);
}

/* ---- a hand-driven worker (raw ROUTER) ---- */

typedef struct {
    zmq_msg_t route, hdr, payload;
} rawcall_t;

FX void raw_recv_call(void *router, rawcall_t *rc, wire_msg_t *w)
{
    zmq_msg_init(&rc->route);
    zmq_msg_init(&rc->hdr);
    zmq_msg_init(&rc->payload);
    cr_assert_geq(zmq_msg_recv(&rc->route, router, 0), 0);
    cr_assert_geq(zmq_msg_recv(&rc->hdr, router, 0), 0);
    cr_assert(zmq_msg_more(&rc->hdr));
    cr_assert_geq(zmq_msg_recv(&rc->payload, router, 0), 0);
    cr_assert_eq(wire_decode(zmq_msg_data(&rc->hdr), zmq_msg_size(&rc->hdr),
                             zmq_msg_data(&rc->payload), zmq_msg_size(&rc->payload), true, w),
                 ECS_OK, "%s", ecs_errmsg());
}

FX void raw_close(rawcall_t *rc)
{
    zmq_msg_close(&rc->route);
    zmq_msg_close(&rc->hdr);
    zmq_msg_close(&rc->payload);
}

/* Sends frames [route, f...] where f are (ptr, len) pairs. */
FX void raw_send(void *router, const zmq_msg_t *route, int n, const void **f, const size_t *len)
{
    cr_assert_geq(zmq_send(router, zmq_msg_data((zmq_msg_t *)route), zmq_msg_size((zmq_msg_t *)route),
                           n ? ZMQ_SNDMORE : 0), 0);
    for (int i = 0; i < n; i++)
        cr_assert_geq(zmq_send(router, f[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0), 0);
}

/* The good reply to w, possibly with fields changed. */
FX void raw_reply(void *router, const zmq_msg_t *route, const wire_call_t *c,
                      uint64_t id, uint32_t n_entries, uint16_t version)
{
    static float rows[64 * EMBD];
    compute(c, rows);
    wire_msg_t r = {.kind = WIRE_RESULT,
                    .result = {.request_id = id, .status = WIRE_ST_OK, .n_entries = n_entries,
                               .n_embd = EMBD, .dtype = ECS_TYPE_F32, .payload = rows,
                               .payload_bytes = n_entries * EMBD * sizeof(float)}};
    uint8_t buf[4096];
    size_t n;
    cr_assert_eq(wire_encode(&r, buf, sizeof buf, &n), ECS_OK, "%s", ecs_errmsg());
    buf[4] = (uint8_t)version;
    const void *f[2] = {buf, rows};
    const size_t len[2] = {n, r.result.payload_bytes};
    raw_send(router, route, 2, f, len);
}

FX void raw_router_close(void *r, const char *ep)
{
    zmq_unbind(r, ep);
    zmq_close(r);
    unlink(ep + strlen("ipc://")); /* ZeroMQ leaves the socket file */
}

FX void *raw_router(void *zctx, const char *ep)
{
    void *r = zmq_socket(zctx, ZMQ_ROUTER);
    const int zero = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    cr_assert_eq(zmq_bind(r, ep), 0, "bind %s", ep);
    return r;
}

/* A mux with one peer: a raw ROUTER the test drives by hand. */
typedef struct {
    char ep[128];
    void *zctx, *router;
    mux_t *m;
    int peer;
} rig_t;

FX void rig_open(rig_t *g, const char *tag)
{
    ipc_path(g->ep, sizeof g->ep, tag);
    g->zctx = zmq_ctx_new();
    g->router = raw_router(g->zctx, g->ep);
    cr_assert_eq(mux_new(NULL, &g->m), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(mux_peer_connect(g->m, g->ep, &g->peer), ECS_OK, "%s", ecs_errmsg());
}

FX void rig_close(rig_t *g)
{
    mux_free(g->m); /* NULL-safe */
    raw_router_close(g->router, g->ep);
    zmq_ctx_term(g->zctx);
}

/* ---- a hand-driven coordinator (raw DEALER) ---- */

typedef struct {
    void *zctx, *dealer;
} client_t;

FX void client_open(client_t *c, const char *ep)
{
    c->zctx = zmq_ctx_new();
    c->dealer = zmq_socket(c->zctx, ZMQ_DEALER);
    const int zero = 0, tmo = 10000;
    zmq_setsockopt(c->dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->dealer, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    cr_assert_eq(zmq_connect(c->dealer, ep), 0);
}

FX void client_close(client_t *c)
{
    zmq_close(c->dealer);
    zmq_ctx_term(c->zctx);
}

FX void client_send(client_t *c, int n, const void **f, const size_t *len)
{
    for (int i = 0; i < n; i++)
        cr_assert_geq(zmq_send(c->dealer, f[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0), 0);
}

/* Receives one reply (1 or 2 frames) and decodes it. */
FX void client_recv(client_t *c, wire_msg_t *w, zmq_msg_t *f0, zmq_msg_t *f1)
{
    zmq_msg_init(f0);
    zmq_msg_init(f1);
    cr_assert_geq(zmq_msg_recv(f0, c->dealer, 0), 0, "no answer from the server");
    bool two = zmq_msg_more(f0);
    if (two)
        cr_assert_geq(zmq_msg_recv(f1, c->dealer, 0), 0);
    cr_assert_eq(wire_decode(zmq_msg_data(f0), zmq_msg_size(f0), two ? zmq_msg_data(f1) : NULL,
                             two ? zmq_msg_size(f1) : 0, two, w), ECS_OK, "%s", ecs_errmsg());
}

/* Expects an answer of kind `kind` with status/code `st`, mentioning needle. */
FX void expect_answer(client_t *c, wire_kind_t kind, wire_status_t st, uint64_t id,
                          const char *needle)
{
    wire_msg_t w;
    zmq_msg_t f0, f1;
    client_recv(c, &w, &f0, &f1);
    cr_assert_eq(w.kind, kind, "got %s", wire_kind_name(w.kind));
    const char *msg = kind == WIRE_RESULT ? w.result.message : w.error.message;
    cr_assert_eq(kind == WIRE_RESULT ? w.result.status : w.error.code, st, "%s", msg);
    if (kind == WIRE_RESULT)
        cr_assert_eq(w.result.request_id, id);
    cr_assert(strstr(msg, needle), "\"%s\" lacks \"%s\"", msg, needle);
    wire_msg_clear(&w);
    zmq_msg_close(&f0);
    zmq_msg_close(&f1);
}

FX size_t encode_call(tcall_t *t, uint64_t id, uint8_t *buf, size_t cap)
{
    t->c.request_id = id;
    wire_msg_t m = {.kind = WIRE_CALL, .call = t->c};
    size_t n;
    cr_assert_eq(wire_encode(&m, buf, cap, &n), ECS_OK, "%s", ecs_errmsg());
    return n;
}

/* A good call through the raw client; its answer must be right. */
FX void client_good_call(client_t *cl, uint64_t id)
{
    tcall_t t;
    tcall_make(&t, 3, (float)id);
    uint8_t buf[4096];
    size_t n = encode_call(&t, id, buf, sizeof buf);
    const void *f[2] = {buf, t.x};
    const size_t len[2] = {n, t.c.payload_bytes};
    client_send(cl, 2, f, len);
    wire_msg_t w;
    zmq_msg_t f0, f1;
    client_recv(cl, &w, &f0, &f1);
    cr_assert_eq(w.kind, WIRE_RESULT);
    cr_assert_eq(w.result.status, WIRE_ST_OK, "%s", w.result.message);
    cr_assert_eq(w.result.request_id, id);
    float want[16 * EMBD];
    compute(&t.c, want);
    cr_assert_arr_eq(w.result.payload, want, w.result.payload_bytes);
    wire_msg_clear(&w);
    zmq_msg_close(&f0);
    zmq_msg_close(&f1);
}

#endif
