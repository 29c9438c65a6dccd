/* test_mux.c - the transport on real sockets (ipc in /tmp and tcp on
 * loopback): many calls in flight answered in shuffled order find their
 * callers; bad replies (unknown and duplicate ids, wrong frame counts,
 * truncated or random frames, wrong version, rows that do not match the
 * call) are dropped and counted while good ones still complete; a worker
 * server answers every kind of bad call as docs/protocol.md says and keeps
 * serving; silent peers, disconnects and shutdown fail calls cleanly. */
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
static void tcall_make(tcall_t *t, uint32_t n_rows, float seed)
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
static void compute(const wire_call_t *c, float *out)
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

static void check_result(const tcall_t *t, mux_call_t *call)
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

static void ipc_path(char *buf, size_t cap, const char *tag)
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

static void on_call(void *ctx, const wire_call_t *c, mux_reply_t *r)
{
    (void)ctx;
    if (c->layer == 99) { /* the test's way to ask for a refusal */
        r->status = WIRE_ST_NOT_ASSIGNED;
        snprintf(r->message, sizeof r->message, "layer 99 is not held here");
        return;
    }
    cr_assert_eq((uintptr_t)c->payload % WIRE_PAYLOAD_ALIGN, 0, "call payload misaligned");
    compute(c, r->rows);
}

static void on_ctrl(void *ctx, int conn, const wire_msg_t *m)
{
    (void)conn;
    tserver_t *t = ctx;
    atomic_store(&t->last_ctrl_kind, m->kind);
    atomic_fetch_add(&t->ctrl_seen, 1);
}

static void *server_main(void *p)
{
    tserver_t *t = p;
    cr_assert_eq(mux_server_run(t->s), ECS_OK);
    return NULL;
}

static void server_start(tserver_t *t, const char *bind)
{
    memset(t, 0, sizeof *t);
    mux_server_opts_t o = {.data_bind = bind, .tick_ms = 50};
    mux_server_ops_t ops = {.on_call = on_call, .on_ctrl = on_ctrl};
    cr_assert_eq(mux_server_new(&o, &ops, t, &t->s), ECS_OK, "%s", ecs_errmsg());
}

static void server_run(tserver_t *t)
{
    cr_assert_eq(pthread_create(&t->th, NULL, server_main, t), 0);
}

static void server_stop(tserver_t *t)
{
    mux_server_stop(t->s);
    pthread_join(t->th, NULL);
    mux_server_free(t->s);
}

/* ---- many calls in flight through a real server, tcp and ipc ---- */

typedef struct {
    mux_t *m;
    int peer;
    int n;
    float seed;
} submitter_t;

static void *submitter(void *p)
{
    submitter_t *s = p;
    tcall_t *t = calloc((size_t)s->n, sizeof *t);
    mux_call_t **calls = calloc((size_t)s->n, sizeof *calls);
    cr_assert(t && calls);
    for (int i = 0; i < s->n; i++) {
        tcall_make(&t[i], 1 + (uint32_t)(i % 8), s->seed + (float)i);
        cr_assert_eq(mux_submit(s->m, s->peer, &t[i].c, &calls[i]), ECS_OK, "%s", ecs_errmsg());
    }
    cr_assert_eq(mux_wait(s->m, calls, s->n, 20000), 0);
    for (int i = 0; i < s->n; i++) {
        check_result(&t[i], calls[i]);
        mux_call_release(calls[i]);
    }
    free(t);
    free(calls);
    return NULL;
}

static void many_through_server(const char *bind)
{
    tserver_t srv;
    server_start(&srv, bind);
    server_run(&srv);
    mux_t *m;
    cr_assert_eq(mux_new(NULL, &m), ECS_OK, "%s", ecs_errmsg());
    int peer;
    cr_assert_eq(mux_peer_connect(m, mux_server_endpoint(srv.s), &peer), ECS_OK, "%s",
                 ecs_errmsg());
    submitter_t sub[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        sub[i] = (submitter_t){m, peer, 200, (float)(1000 * i)};
        cr_assert_eq(pthread_create(&th[i], NULL, submitter, &sub[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    mux_peer_stats_t st;
    cr_assert_eq(mux_peer_stats(m, peer, &st), ECS_OK);
    cr_assert_eq(st.calls_sent, 600);
    cr_assert_eq(st.calls_ok, 600);
    cr_assert_eq(st.calls_in_flight, 0);
    cr_assert_eq(st.rows_in_flight, 0);
    cr_assert_eq(st.unknown_ids + st.duplicate_replies + st.bad_messages, 0);
    cr_assert_gt(st.bytes_out, 600 * EMBD * 4);
    cr_assert_gt(st.bytes_in, 600 * EMBD * 4);
    uint64_t hist_total = 0;
    for (int i = 0; i < MUX_LAT_BUCKETS; i++)
        hist_total += st.latency_us[i];
    cr_assert_eq(hist_total, 600);
    cr_assert_gt(mux_latency_quantile(st.latency_us, 0.99), 0);
    wire_stats_t ws;
    mux_server_stats(srv.s, &ws);
    cr_assert_eq(ws.calls, 600);
    cr_assert_eq(ws.bad_messages, 0);
    mux_free(m);
    server_stop(&srv);
}

Test(mux, many_in_flight_ipc) {
    char ep[128];
    ipc_path(ep, sizeof ep, "many");
    many_through_server(ep);
}

Test(mux, many_in_flight_tcp) { many_through_server("tcp://127.0.0.1:*"); }

/* ---- a hand-driven worker: shuffled replies and bad replies ---- */

typedef struct {
    zmq_msg_t route, hdr, payload;
} rawcall_t;

static void raw_recv_call(void *router, rawcall_t *rc, wire_msg_t *w)
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

static void raw_close(rawcall_t *rc)
{
    zmq_msg_close(&rc->route);
    zmq_msg_close(&rc->hdr);
    zmq_msg_close(&rc->payload);
}

/* Sends frames [route, f...] where f are (ptr, len) pairs. */
static void raw_send(void *router, const zmq_msg_t *route, int n, const void **f, const size_t *len)
{
    cr_assert_geq(zmq_send(router, zmq_msg_data((zmq_msg_t *)route), zmq_msg_size((zmq_msg_t *)route),
                           n ? ZMQ_SNDMORE : 0), 0);
    for (int i = 0; i < n; i++)
        cr_assert_geq(zmq_send(router, f[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0), 0);
}

/* The good reply to w, possibly with fields changed. */
static void raw_reply(void *router, const zmq_msg_t *route, const wire_call_t *c,
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

static void raw_router_close(void *r, const char *ep)
{
    zmq_unbind(r, ep);
    zmq_close(r);
    unlink(ep + strlen("ipc://")); /* ZeroMQ leaves the socket file */
}

static void *raw_router(void *zctx, const char *ep)
{
    void *r = zmq_socket(zctx, ZMQ_ROUTER);
    const int zero = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    cr_assert_eq(zmq_bind(r, ep), 0, "bind %s", ep);
    return r;
}

Test(mux, shuffled_replies_find_their_calls)
{
    enum { N = 64 };
    char ep[128];
    ipc_path(ep, sizeof ep, "shuf");
    void *zctx = zmq_ctx_new();
    void *router = raw_router(zctx, ep);
    mux_t *m;
    cr_assert_eq(mux_new(NULL, &m), ECS_OK);
    int peer;
    cr_assert_eq(mux_peer_connect(m, ep, &peer), ECS_OK);
    static tcall_t t[N];
    mux_call_t *calls[N];
    for (int i = 0; i < N; i++) {
        tcall_make(&t[i], 1 + (uint32_t)(i % 8), (float)(7 * i));
        cr_assert_eq(mux_submit(m, peer, &t[i].c, &calls[i]), ECS_OK, "%s", ecs_errmsg());
    }
    cr_assert_eq(mux_peer_inflight(m, peer), N);
    static rawcall_t rc[N];
    static wire_msg_t w[N];
    for (int i = 0; i < N; i++)
        raw_recv_call(router, &rc[i], &w[i]);
    int order[N];
    for (int i = 0; i < N; i++)
        order[i] = i;
    srand(12345);
    for (int i = N - 1; i > 0; i--) {
        int j = rand() % (i + 1), x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
    cr_assert_neq(order[0], 0, "the shuffle should move the first call");
    for (int i = 0; i < N; i++) {
        const wire_call_t *c = &w[order[i]].call;
        raw_reply(router, &rc[order[i]].route, c, c->request_id, (uint32_t)c->n_entries,
                  WIRE_VERSION);
    }
    cr_assert_eq(mux_wait(m, calls, N, 10000), 0);
    for (int i = 0; i < N; i++) {
        check_result(&t[i], calls[i]);
        mux_call_release(calls[i]);
        wire_msg_clear(&w[i]);
        raw_close(&rc[i]);
    }
    mux_free(m);
    raw_router_close(router, ep);
    zmq_ctx_term(zctx);
}

Test(mux, bad_replies_are_dropped_and_counted)
{
    char ep[128];
    ipc_path(ep, sizeof ep, "badrep");
    void *zctx = zmq_ctx_new();
    void *router = raw_router(zctx, ep);
    mux_t *m;
    cr_assert_eq(mux_new(NULL, &m), ECS_OK);
    int peer;
    cr_assert_eq(mux_peer_connect(m, ep, &peer), ECS_OK);
    tcall_t a, b, c;
    tcall_make(&a, 3, 10);
    tcall_make(&b, 2, 20);
    tcall_make(&c, 4, 30);
    mux_call_t *ca, *cb, *cc;
    cr_assert_eq(mux_submit(m, peer, &a.c, &ca), ECS_OK);
    cr_assert_eq(mux_submit(m, peer, &b.c, &cb), ECS_OK);
    cr_assert_eq(mux_submit(m, peer, &c.c, &cc), ECS_OK);
    rawcall_t ra, rb, rcc;
    wire_msg_t wa, wb, wc;
    raw_recv_call(router, &ra, &wa);
    raw_recv_call(router, &rb, &wb);
    raw_recv_call(router, &rcc, &wc);
    const zmq_msg_t *route = &ra.route;

    /* 1. unknown request id */
    raw_reply(router, route, &wa.call, 0xdead0000ull, (uint32_t)wa.call.n_entries, WIRE_VERSION);
    /* 2. wrong protocol version (dropped: no call is touched) */
    raw_reply(router, route, &wa.call, wa.call.request_id, (uint32_t)wa.call.n_entries, 7);
    /* 3. random bytes, one frame and two */
    uint8_t junk[300];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    const void *f[4] = {junk, junk, junk, junk};
    size_t len[4] = {sizeof junk, 40, 5, 0};
    raw_send(router, route, 1, f, len);
    raw_send(router, route, 2, f, len);
    /* 4. four frames */
    raw_send(router, route, 4, f, len);
    /* 5. a truncated Result header: the call is unknown to decoding, dropped */
    {
        uint8_t buf[4096];
        size_t n;
        float rows[3 * EMBD] = {0};
        wire_msg_t r = {.kind = WIRE_RESULT,
                        .result = {.request_id = wa.call.request_id, .n_entries = 3,
                                   .n_embd = EMBD, .dtype = ECS_TYPE_F32, .payload = rows,
                                   .payload_bytes = sizeof rows}};
        cr_assert_eq(wire_encode(&r, buf, sizeof buf, &n), ECS_OK);
        const void *g[2] = {buf, rows};
        size_t gl[2] = {n - 3, sizeof rows};
        raw_send(router, route, 2, g, gl);
    }
    cr_assert_not(mux_call_done(ca), "a bad reply must not complete a call");

    /* 6. the good reply to a, then the same reply again (duplicate) */
    raw_reply(router, route, &wa.call, wa.call.request_id, (uint32_t)wa.call.n_entries,
              WIRE_VERSION);
    cr_assert_eq(mux_wait(m, &ca, 1, 10000), 0);
    check_result(&a, ca);
    raw_reply(router, route, &wa.call, wa.call.request_id, (uint32_t)wa.call.n_entries,
              WIRE_VERSION);
    /* 7. b's reply with the wrong number of rows: b fails with a format error */
    raw_reply(router, route, &wb.call, wb.call.request_id, (uint32_t)wb.call.n_entries + 1,
              WIRE_VERSION);
    cr_assert_eq(mux_wait(m, &cb, 1, 10000), 0);
    const mux_result_t *rb_res = mux_call_result(cb);
    cr_assert_eq(rb_res->err, ECS_ERR_FORMAT);
    cr_assert(strstr(rb_res->message, "the call wants"), "%s", rb_res->message);
    /* 8. an Error about c: c completes with the worker's status */
    {
        uint8_t buf[512];
        size_t n;
        wire_msg_t e = {.kind = WIRE_ERROR,
                        .error = {WIRE_ST_DRAINING, "draining", wc.call.request_id, WIRE_CALL}};
        cr_assert_eq(wire_encode(&e, buf, sizeof buf, &n), ECS_OK);
        const void *g[1] = {buf};
        size_t gl[1] = {n};
        raw_send(router, route, 1, g, gl);
    }
    cr_assert_eq(mux_wait(m, &cc, 1, 10000), 0);
    cr_assert_eq(mux_call_result(cc)->err, ECS_OK);
    cr_assert_eq(mux_call_result(cc)->status, WIRE_ST_DRAINING);
    cr_assert_str_eq(mux_call_result(cc)->message, "draining");

    /* the mux still serves: a fresh call answered normally */
    tcall_t d;
    tcall_make(&d, 5, 40);
    mux_call_t *cd;
    cr_assert_eq(mux_submit(m, peer, &d.c, &cd), ECS_OK);
    rawcall_t rd;
    wire_msg_t wd;
    raw_recv_call(router, &rd, &wd);
    raw_reply(router, &rd.route, &wd.call, wd.call.request_id, (uint32_t)wd.call.n_entries,
              WIRE_VERSION);
    cr_assert_eq(mux_wait(m, &cd, 1, 10000), 0);
    check_result(&d, cd);

    mux_peer_stats_t st;
    cr_assert_eq(mux_peer_stats(m, peer, &st), ECS_OK);
    cr_assert_eq(st.unknown_ids, 1);
    cr_assert_eq(st.duplicate_replies, 1);
    /* version, random x2, four frames, truncated, wrong rows */
    cr_assert_eq(st.bad_messages, 6, "bad_messages %llu", (unsigned long long)st.bad_messages);
    cr_assert_eq(st.errors_received, 1);
    cr_assert_eq(st.calls_ok, 2);
    cr_assert_eq(st.calls_failed, 2);
    cr_assert_eq(st.calls_in_flight, 0);
    cr_assert_str_eq(st.last_error, "draining");
    mux_call_t *all[4] = {ca, cb, cc, cd};
    for (int i = 0; i < 4; i++)
        mux_call_release(all[i]);
    wire_msg_clear(&wa);
    wire_msg_clear(&wb);
    wire_msg_clear(&wc);
    wire_msg_clear(&wd);
    raw_close(&ra);
    raw_close(&rb);
    raw_close(&rcc);
    raw_close(&rd);
    mux_free(m);
    raw_router_close(router, ep);
    zmq_ctx_term(zctx);
}

/* ---- bad calls to a worker server ---- */

typedef struct {
    void *zctx, *dealer;
} client_t;

static void client_open(client_t *c, const char *ep)
{
    c->zctx = zmq_ctx_new();
    c->dealer = zmq_socket(c->zctx, ZMQ_DEALER);
    const int zero = 0, tmo = 10000;
    zmq_setsockopt(c->dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->dealer, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    cr_assert_eq(zmq_connect(c->dealer, ep), 0);
}

static void client_close(client_t *c)
{
    zmq_close(c->dealer);
    zmq_ctx_term(c->zctx);
}

static void client_send(client_t *c, int n, const void **f, const size_t *len)
{
    for (int i = 0; i < n; i++)
        cr_assert_geq(zmq_send(c->dealer, f[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0), 0);
}

/* Receives one reply (1 or 2 frames) and decodes it. */
static void client_recv(client_t *c, wire_msg_t *w, zmq_msg_t *f0, zmq_msg_t *f1)
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
static void expect_answer(client_t *c, wire_kind_t kind, wire_status_t st, uint64_t id,
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

static size_t encode_call(tcall_t *t, uint64_t id, uint8_t *buf, size_t cap)
{
    t->c.request_id = id;
    wire_msg_t m = {.kind = WIRE_CALL, .call = t->c};
    size_t n;
    cr_assert_eq(wire_encode(&m, buf, cap, &n), ECS_OK, "%s", ecs_errmsg());
    return n;
}

/* A good call through the raw client; its answer must be right. */
static void client_good_call(client_t *cl, uint64_t id)
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

Test(mux, server_answers_bad_calls_and_keeps_serving)
{
    char ep[128];
    ipc_path(ep, sizeof ep, "srvbad");
    tserver_t srv;
    server_start(&srv, ep);
    server_run(&srv);
    client_t cl;
    client_open(&cl, ep);
    client_good_call(&cl, 1);

    tcall_t t;
    tcall_make(&t, 3, 5);
    uint8_t buf[4096], bad[4096];
    const size_t n = encode_call(&t, 42, buf, sizeof buf);
    const size_t pl = t.c.payload_bytes;
    int nbad = 0;
    /* call without its payload frame: refused by id */
    {
        const void *f[1] = {buf};
        const size_t len[1] = {n};
        client_send(&cl, 1, f, len);
        expect_answer(&cl, WIRE_RESULT, WIRE_ST_BAD_MESSAGE, 42, "payload frame missing");
        nbad++;
    }
    /* three frames */
    {
        const void *f[3] = {buf, t.x, t.x};
        const size_t len[3] = {n, pl, pl};
        client_send(&cl, 3, f, len);
        expect_answer(&cl, WIRE_RESULT, WIRE_ST_BAD_MESSAGE, 42, "of 3 frames");
        nbad++;
    }
    /* payload one row short */
    {
        const void *f[2] = {buf, t.x};
        const size_t len[2] = {n, pl - EMBD * sizeof(float)};
        client_send(&cl, 2, f, len);
        expect_answer(&cl, WIRE_RESULT, WIRE_ST_BAD_MESSAGE, 42, "the frame has");
        nbad++;
    }
    /* truncated header frame: no id to answer, an Error */
    {
        const void *f[2] = {buf, t.x};
        const size_t len[2] = {n - 1, pl};
        client_send(&cl, 2, f, len);
        expect_answer(&cl, WIRE_ERROR, WIRE_ST_BAD_MESSAGE, 0, "body bytes");
        nbad++;
    }
    /* wrong protocol version */
    {
        memcpy(bad, buf, n);
        bad[4] = 9;
        const void *f[2] = {bad, t.x};
        const size_t len[2] = {n, pl};
        client_send(&cl, 2, f, len);
        expect_answer(&cl, WIRE_ERROR, WIRE_ST_VERSION, 0, "protocol version 9");
        nbad++;
    }
    /* oversized counts: n_rows beyond the limit */
    {
        tcall_t o;
        tcall_make(&o, 3, 5);
        uint8_t ob[4096]; /* the encoder refuses n_rows > WIRE_MAX_ROWS: patch a body */
        const size_t on = encode_call(&o, 43, ob, sizeof ob);
        /* field 3 (n_rows) is varint 0x18 0x03 in the body: make it 0x18 <huge> */
        size_t at = 0;
        for (size_t i = WIRE_HEADER_SIZE; i + 1 < on; i++)
            if (ob[i] == 0x18 && ob[i + 1] == 3) {
                at = i;
                break;
            }
        cr_assert(at, "n_rows field not found");
        uint8_t big[4096];
        memcpy(big, ob, at + 1);
        const uint8_t v[3] = {0x81, 0x80, 0x08}; /* 131073 */
        memcpy(big + at + 1, v, 3);
        memcpy(big + at + 4, ob + at + 2, on - at - 2);
        const size_t bn = on + 2;
        big[8] = (uint8_t)(bn - WIRE_HEADER_SIZE);
        big[9] = (uint8_t)((bn - WIRE_HEADER_SIZE) >> 8);
        const void *f[2] = {big, o.x};
        const size_t len[2] = {bn, o.c.payload_bytes};
        client_send(&cl, 2, f, len);
        expect_answer(&cl, WIRE_RESULT, WIRE_ST_BAD_MESSAGE, 43, "n_rows 131073");
        nbad++;
    }
    /* random bytes */
    {
        uint8_t junk[200];
        for (size_t i = 0; i < sizeof junk; i++)
            junk[i] = (uint8_t)(i * 91 + 7);
        const void *f[2] = {junk, junk};
        const size_t len[2] = {sizeof junk, 50};
        client_send(&cl, 2, f, len);
        expect_answer(&cl, WIRE_ERROR, WIRE_ST_BAD_MESSAGE, 0, "bad magic");
        nbad++;
    }
    /* a Hello on the data socket */
    {
        const uint8_t fp[4] = {1, 2, 3, 4};
        wire_msg_t h = {.kind = WIRE_HELLO,
                        .hello = {.min_version = 1, .max_version = 1, .fingerprint = fp,
                                  .fingerprint_len = 4, .worker_id = "x", .threads = 1,
                                  .data_endpoint = "ipc:///tmp/none"}};
        size_t hn;
        cr_assert_eq(wire_encode(&h, bad, sizeof bad, &hn), ECS_OK);
        const void *f[1] = {bad};
        const size_t len[1] = {hn};
        client_send(&cl, 1, f, len);
        expect_answer(&cl, WIRE_ERROR, WIRE_ST_BAD_MESSAGE, 0, "Hello on the data socket");
        nbad++;
    }
    /* an Error is never answered (the next answer is the good call's) */
    {
        wire_msg_t e = {.kind = WIRE_ERROR, .error = {WIRE_ST_INTERNAL, "x", 0, WIRE_NONE}};
        size_t en;
        cr_assert_eq(wire_encode(&e, bad, sizeof bad, &en), ECS_OK);
        const void *f[1] = {bad};
        const size_t len[1] = {en};
        client_send(&cl, 1, f, len);
    }
    /* a refusal by the handler comes back as the call's status */
    {
        tcall_t r;
        tcall_make(&r, 2, 9);
        r.c.layer = 99;
        uint8_t rb[4096];
        const size_t rn = encode_call(&r, 44, rb, sizeof rb);
        const void *f[2] = {rb, r.x};
        const size_t len[2] = {rn, r.c.payload_bytes};
        client_send(&cl, 2, f, len);
        expect_answer(&cl, WIRE_RESULT, WIRE_ST_NOT_ASSIGNED, 44, "not held");
    }
    client_good_call(&cl, 2);
    wire_stats_t ws;
    mux_server_stats(srv.s, &ws);
    cr_assert_eq(ws.bad_messages, (uint64_t)nbad);
    cr_assert_eq(ws.calls, 3);
    client_close(&cl);
    server_stop(&srv);
}

/* Peers that connect and say nothing: a ZeroMQ DEALER, and a plain TCP
 * socket that never even completes the ZeroMQ handshake. The server keeps
 * serving others. */
Test(mux, silent_peers_do_not_block_the_server)
{
    tserver_t srv;
    server_start(&srv, "tcp://127.0.0.1:*");
    server_run(&srv);
    const char *ep = mux_server_endpoint(srv.s);
    client_t quiet, cl;
    client_open(&quiet, ep);
    int port = atoi(strrchr(ep, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    client_open(&cl, ep);
    for (uint64_t id = 1; id <= 5; id++)
        client_good_call(&cl, id);
    close(fd);
    client_close(&quiet);
    client_close(&cl);
    server_stop(&srv);
}

/* A peer nobody answers: the wait times out, disconnect fails the call, a
 * call to a disconnected peer is refused at once. */
Test(mux, silent_worker_timeout_and_disconnect)
{
    char ep[128];
    ipc_path(ep, sizeof ep, "silent");
    void *zctx = zmq_ctx_new();
    void *router = raw_router(zctx, ep); /* takes calls, never answers */
    mux_t *m;
    cr_assert_eq(mux_new(NULL, &m), ECS_OK);
    int peer;
    cr_assert_eq(mux_peer_connect(m, ep, &peer), ECS_OK);
    tcall_t t;
    tcall_make(&t, 2, 1);
    mux_call_t *c;
    cr_assert_eq(mux_submit(m, peer, &t.c, &c), ECS_OK);
    cr_assert_eq(mux_wait(m, &c, 1, 100), 1);
    cr_assert_not(mux_call_done(c));
    cr_assert_null(mux_call_result(c));
    cr_assert_eq(mux_peer_disconnect(m, peer), ECS_OK);
    cr_assert_eq(mux_wait(m, &c, 1, 10000), 0);
    cr_assert_eq(mux_call_result(c)->err, ECS_ERR_IO);
    cr_assert(strstr(mux_call_result(c)->message, "disconnected"));
    mux_call_release(c);
    mux_call_t *c2;
    cr_assert_eq(mux_submit(m, peer, &t.c, &c2), ECS_ERR_INVAL);
    cr_assert_null(c2);
    mux_peer_stats_t st;
    cr_assert_eq(mux_peer_stats(m, peer, &st), ECS_OK);
    cr_assert_not(st.connected);
    cr_assert_eq(st.calls_failed, 1);
    cr_assert_eq(st.calls_in_flight, 0);
    mux_free(m);
    raw_router_close(router, ep);
    zmq_ctx_term(zctx);
}

/* mux_free with calls in flight fails them; handles outlive the mux; a
 * call released while in flight is dropped when its reply would come. */
Test(mux, shutdown_with_calls_in_flight)
{
    char ep[128];
    ipc_path(ep, sizeof ep, "shut");
    void *zctx = zmq_ctx_new();
    void *router = raw_router(zctx, ep);
    mux_t *m;
    cr_assert_eq(mux_new(NULL, &m), ECS_OK);
    int peer;
    cr_assert_eq(mux_peer_connect(m, ep, &peer), ECS_OK);
    tcall_t t;
    tcall_make(&t, 2, 1);
    mux_call_t *c[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(mux_submit(m, peer, &t.c, &c[i]), ECS_OK);
    mux_call_release(c[2]); /* abandoned */
    mux_free(m);
    for (int i = 0; i < 2; i++) {
        cr_assert(mux_call_done(c[i]));
        cr_assert_eq(mux_call_result(c[i])->err, ECS_ERR_IO);
        mux_call_release(c[i]);
    }
    raw_router_close(router, ep);
    zmq_ctx_term(zctx);
}

/* ---- control: Hello up, Welcome down, bad control messages answered ---- */

Test(mux, control_round_trip_and_bad_control)
{
    char cep[128], dep[128];
    ipc_path(cep, sizeof cep, "ctl");
    ipc_path(dep, sizeof dep, "dat");
    mux_t *m;
    cr_assert_eq(mux_new(&(mux_opts_t){.control_bind = cep}, &m), ECS_OK, "%s", ecs_errmsg());
    cr_assert_str_eq(mux_control_endpoint(m), cep);
    tserver_t srv;
    server_start(&srv, dep);
    int conn;
    cr_assert_eq(mux_server_connect(srv.s, cep, &conn), ECS_OK);
    const uint8_t fp[32] = {7};
    wire_msg_t hello = {.kind = WIRE_HELLO,
                        .hello = {.min_version = 1, .max_version = 1, .fingerprint = fp,
                                  .fingerprint_len = 32, .worker_id = "w0", .host = "h",
                                  .pid = 1, .threads = 2, .mem_budget = 1 << 30,
                                  .device = "cpu", .data_endpoint = mux_server_endpoint(srv.s)}};
    cr_assert_eq(mux_server_send(srv.s, conn, &hello), ECS_OK, "%s", ecs_errmsg());
    server_run(&srv);
    mux_route_t from;
    wire_msg_t got;
    cr_assert_eq(mux_ctrl_recv(m, &from, &got, 10000), ECS_OK);
    cr_assert_eq(got.kind, WIRE_HELLO);
    cr_assert_str_eq(got.hello.worker_id, "w0");
    cr_assert_str_eq(got.hello.data_endpoint, dep);
    cr_assert_arr_eq(got.hello.fingerprint, fp, 32);
    wire_msg_clear(&got);
    wire_msg_t wel = {.kind = WIRE_WELCOME, .welcome = {1, "coord", 100}};
    cr_assert_eq(mux_ctrl_send(m, &from, &wel), ECS_OK, "%s", ecs_errmsg());
    for (int i = 0; i < 1000 && atomic_load(&srv.ctrl_seen) == 0; i++)
        usleep(10000);
    cr_assert_eq(atomic_load(&srv.ctrl_seen), 1);
    cr_assert_eq(atomic_load(&srv.last_ctrl_kind), WIRE_WELCOME);
    /* to a worker that is not there */
    mux_route_t nobody = {.len = 3, .id = {1, 2, 3}};
    cr_assert_eq(mux_ctrl_send(m, &nobody, &wel), ECS_ERR_IO);
    cr_assert(strstr(ecs_errmsg(), "not connected"), "%s", ecs_errmsg());
    /* bad control messages from a raw client get an Error; nothing reaches
     * mux_ctrl_recv */
    client_t cl;
    client_open(&cl, cep);
    uint8_t junk[64] = {'E', 'C', 'S', 'P', 1, 0, WIRE_HEARTBEAT, 0, 52, 0, 0, 0, 0xff, 0xff};
    const void *f[2] = {junk, junk};
    size_t len[2] = {sizeof junk, 4};
    client_send(&cl, 1, f, len);
    expect_answer(&cl, WIRE_ERROR, WIRE_ST_BAD_MESSAGE, 0, "not a valid ecs.Heartbeat");
    client_send(&cl, 2, f, len);
    expect_answer(&cl, WIRE_ERROR, WIRE_ST_BAD_MESSAGE, 0, "");
    junk[4] = 5;
    client_send(&cl, 1, f, len);
    expect_answer(&cl, WIRE_ERROR, WIRE_ST_VERSION, 0, "protocol version 5");
    cr_assert_eq(mux_ctrl_bad(m), 3);
    cr_assert_eq(mux_ctrl_recv(m, &from, &got, 50), ECS_OK);
    cr_assert_eq(got.kind, WIRE_NONE, "a bad message reached the inbox");
    client_close(&cl);
    server_stop(&srv);
    mux_free(m);
}
