/* test_mux.c - the coordinator's side of the transport on real sockets:
 * many calls in flight (from several threads, through a real worker server,
 * ipc and tcp) and calls answered in shuffled order find their callers; bad
 * replies (unknown and duplicate ids, wrong frame counts, truncated or
 * random frames, wrong version, rows that do not match the call) are
 * dropped and counted while good ones still complete; a silent worker,
 * a disconnect and shutdown fail calls cleanly. */
#include "mux_fixture.h"
#include "proto/dplane/dplane.h"

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
        if (i % 2) { /* half of them gathered straight into the message */
            void *pl;
            cr_assert_eq(mux_call_prepare(s->m, s->peer, &t[i].c, &pl, &calls[i]), ECS_OK, "%s",
                         ecs_errmsg());
            memcpy(pl, t[i].x, t[i].c.payload_bytes);
            cr_assert_eq(mux_call_send(s->m, calls[i]), ECS_OK, "%s", ecs_errmsg());
            cr_assert_eq(mux_call_send(s->m, calls[i]), ECS_ERR_INVAL, "sent twice");
        } else {
            cr_assert_eq(mux_submit(s->m, s->peer, &t[i].c, &calls[i]), ECS_OK, "%s",
                         ecs_errmsg());
        }
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

/* A same-host plane between m's peer and srv (before srv runs): the
 * server takes it on a coordinator connection that never answers. */
static void plane_between(mux_t *m, int peer, tserver_t *srv)
{
    dplane_shm_t *seg;
    cr_assert_eq(dplane_shm_create(1 << 20, &seg), ECS_OK, "%s", ecs_errmsg());
    char nobody[128];
    ipc_path(nobody, sizeof nobody, "nobody");
    int conn;
    cr_assert_eq(mux_server_connect(srv->s, nobody, &conn), ECS_OK);
    cr_assert_eq(mux_server_attach_shm(srv->s, conn, dplane_shm_name(seg)), ECS_OK, "%s",
                 ecs_errmsg());
    cr_assert_eq(dplane_shm_attached(seg), (uint32_t)getpid());
    cr_assert_eq(mux_peer_set_shm(m, peer, seg), ECS_OK, "%s", ecs_errmsg());
}

static void many_through_server(const char *bind, bool shm)
{
    tserver_t srv;
    server_start(&srv, bind);
    mux_t *m;
    cr_assert_eq(mux_new(NULL, &m), ECS_OK, "%s", ecs_errmsg());
    int peer;
    cr_assert_eq(mux_peer_connect(m, mux_server_endpoint(srv.s), &peer), ECS_OK, "%s",
                 ecs_errmsg());
    if (shm)
        plane_between(m, peer, &srv);
    server_run(&srv);
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
    cr_assert_eq(st.calls_shm, shm ? 600 : 0); /* every call fits the plane's rings */
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
    many_through_server(ep, false);
}

Test(mux, many_in_flight_tcp) { many_through_server("tcp://127.0.0.1:*", false); }

/* three threads submit and wait at once on one shared-memory plane: one
 * producer lock, one drainer at a time completing the others' calls */
Test(mux, many_in_flight_shm) { many_through_server("tcp://127.0.0.1:*", true); }

/* a peer disconnected (its worker declared dead) fails the calls in flight
 * on its plane at once, and the plane is gone: later calls to a new peer
 * of the same server go on ZeroMQ */
Test(mux, shm_disconnect_fails_in_flight, .timeout = 30)
{
    tserver_t srv;
    server_start(&srv, "tcp://127.0.0.1:*");
    mux_t *m;
    cr_assert_eq(mux_new(NULL, &m), ECS_OK);
    int peer;
    cr_assert_eq(mux_peer_connect(m, mux_server_endpoint(srv.s), &peer), ECS_OK);
    plane_between(m, peer, &srv);
    server_run(&srv);
    tcall_t t;
    tcall_make(&t, 2, 7);
    t.c.layer = 98; /* the test server sleeps 2 s on it */
    mux_call_t *call;
    cr_assert_eq(mux_submit(m, peer, &t.c, &call), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(mux_wait(m, &call, 1, 100), 1, "done before the worker answered");
    cr_assert_eq(mux_peer_disconnect(m, peer), ECS_OK);
    cr_assert_eq(mux_wait(m, &call, 1, 1000), 0, "not failed by the disconnect");
    cr_assert_eq(mux_call_result(call)->err, ECS_ERR_IO);
    mux_call_release(call);
    int p2;
    cr_assert_eq(mux_peer_connect(m, mux_server_endpoint(srv.s), &p2), ECS_OK);
    tcall_make(&t, 3, 9);
    cr_assert_eq(mux_submit(m, p2, &t.c, &call), ECS_OK);
    cr_assert_eq(mux_wait(m, &call, 1, 10000), 0);
    check_result(&t, call);
    mux_call_release(call);
    mux_peer_stats_t st;
    cr_assert_eq(mux_peer_stats(m, p2, &st), ECS_OK);
    cr_assert_eq(st.calls_shm, 0);
    mux_free(m);
    server_stop(&srv);
}

Test(mux, shuffled_replies_find_their_calls)
{
    enum { N = 64 };
    rig_t g;
    rig_open(&g, "shuf");
    static tcall_t t[N];
    mux_call_t *calls[N];
    for (int i = 0; i < N; i++) {
        tcall_make(&t[i], 1 + (uint32_t)(i % 8), (float)(7 * i));
        cr_assert_eq(mux_submit(g.m, g.peer, &t[i].c, &calls[i]), ECS_OK, "%s", ecs_errmsg());
    }
    cr_assert_eq(mux_peer_inflight(g.m, g.peer), N);
    static rawcall_t rc[N];
    static wire_msg_t w[N];
    for (int i = 0; i < N; i++)
        raw_recv_call(g.router, &rc[i], &w[i]);
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
        raw_reply(g.router, &rc[order[i]].route, c, c->request_id, (uint32_t)c->n_entries,
                  WIRE_VERSION);
    }
    cr_assert_eq(mux_wait(g.m, calls, N, 10000), 0);
    for (int i = 0; i < N; i++) {
        check_result(&t[i], calls[i]);
        mux_call_release(calls[i]);
        wire_msg_clear(&w[i]);
        raw_close(&rc[i]);
    }
    rig_close(&g);
}

Test(mux, bad_replies_are_dropped_and_counted)
{
    rig_t g;
    rig_open(&g, "badrep");
    tcall_t a, b, c;
    tcall_make(&a, 3, 10);
    tcall_make(&b, 2, 20);
    tcall_make(&c, 4, 30);
    mux_call_t *ca, *cb, *cc;
    cr_assert_eq(mux_submit(g.m, g.peer, &a.c, &ca), ECS_OK);
    cr_assert_eq(mux_submit(g.m, g.peer, &b.c, &cb), ECS_OK);
    cr_assert_eq(mux_submit(g.m, g.peer, &c.c, &cc), ECS_OK);
    rawcall_t ra, rb, rcc;
    wire_msg_t wa, wb, wc;
    raw_recv_call(g.router, &ra, &wa);
    raw_recv_call(g.router, &rb, &wb);
    raw_recv_call(g.router, &rcc, &wc);
    const zmq_msg_t *route = &ra.route;

    /* 1. unknown request id */
    raw_reply(g.router, route, &wa.call, 0xdead0000ull, (uint32_t)wa.call.n_entries, WIRE_VERSION);
    /* 2. wrong protocol version (dropped: no call is touched) */
    raw_reply(g.router, route, &wa.call, wa.call.request_id, (uint32_t)wa.call.n_entries, 7);
    /* 3. random bytes, one frame and two */
    uint8_t junk[300];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    const void *f[4] = {junk, junk, junk, junk};
    size_t len[4] = {sizeof junk, 40, 5, 0};
    raw_send(g.router, route, 1, f, len);
    raw_send(g.router, route, 2, f, len);
    /* 4. four frames */
    raw_send(g.router, route, 4, f, len);
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
        const void *fr[2] = {buf, rows};
        size_t gl[2] = {n - 3, sizeof rows};
        raw_send(g.router, route, 2, fr, gl);
    }
    cr_assert_not(mux_call_done(ca), "a bad reply must not complete a call");

    /* 6. the good reply to a, then the same reply again (duplicate) */
    raw_reply(g.router, route, &wa.call, wa.call.request_id, (uint32_t)wa.call.n_entries,
              WIRE_VERSION);
    cr_assert_eq(mux_wait(g.m, &ca, 1, 10000), 0);
    check_result(&a, ca);
    raw_reply(g.router, route, &wa.call, wa.call.request_id, (uint32_t)wa.call.n_entries,
              WIRE_VERSION);
    /* 7. b's reply with the wrong number of rows: b fails with a format error */
    raw_reply(g.router, route, &wb.call, wb.call.request_id, (uint32_t)wb.call.n_entries + 1,
              WIRE_VERSION);
    cr_assert_eq(mux_wait(g.m, &cb, 1, 10000), 0);
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
        const void *fr[1] = {buf};
        size_t gl[1] = {n};
        raw_send(g.router, route, 1, fr, gl);
    }
    cr_assert_eq(mux_wait(g.m, &cc, 1, 10000), 0);
    cr_assert_eq(mux_call_result(cc)->err, ECS_OK);
    cr_assert_eq(mux_call_result(cc)->status, WIRE_ST_DRAINING);
    cr_assert_str_eq(mux_call_result(cc)->message, "draining");

    /* the mux still serves: a fresh call answered normally */
    tcall_t d;
    tcall_make(&d, 5, 40);
    mux_call_t *cd;
    cr_assert_eq(mux_submit(g.m, g.peer, &d.c, &cd), ECS_OK);
    rawcall_t rd;
    wire_msg_t wd;
    raw_recv_call(g.router, &rd, &wd);
    raw_reply(g.router, &rd.route, &wd.call, wd.call.request_id, (uint32_t)wd.call.n_entries,
              WIRE_VERSION);
    cr_assert_eq(mux_wait(g.m, &cd, 1, 10000), 0);
    check_result(&d, cd);

    mux_peer_stats_t st;
    cr_assert_eq(mux_peer_stats(g.m, g.peer, &st), ECS_OK);
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
    rig_close(&g);
}

/* A peer nobody answers (the rig's router takes calls and never replies):
 * the wait times out, disconnect fails the call, a call to a disconnected
 * peer is refused at once. */
Test(mux, silent_worker_timeout_and_disconnect)
{
    rig_t g;
    rig_open(&g, "silent");
    tcall_t t;
    tcall_make(&t, 2, 1);
    mux_call_t *c;
    cr_assert_eq(mux_submit(g.m, g.peer, &t.c, &c), ECS_OK);
    cr_assert_eq(mux_wait(g.m, &c, 1, 100), 1);
    cr_assert_not(mux_call_done(c));
    cr_assert_null(mux_call_result(c));
    cr_assert_eq(mux_peer_disconnect(g.m, g.peer), ECS_OK);
    cr_assert_eq(mux_wait(g.m, &c, 1, 10000), 0);
    cr_assert_eq(mux_call_result(c)->err, ECS_ERR_IO);
    cr_assert(strstr(mux_call_result(c)->message, "disconnected"));
    mux_call_release(c);
    mux_call_t *c2;
    cr_assert_eq(mux_submit(g.m, g.peer, &t.c, &c2), ECS_ERR_INVAL);
    cr_assert_null(c2);
    mux_peer_stats_t st;
    cr_assert_eq(mux_peer_stats(g.m, g.peer, &st), ECS_OK);
    cr_assert_not(st.connected);
    cr_assert_eq(st.calls_failed, 1);
    cr_assert_eq(st.calls_in_flight, 0);
    rig_close(&g);
}

/* mux_free with calls in flight fails them; handles outlive the mux; a
 * call released while in flight is dropped when its reply would come. */
Test(mux, shutdown_with_calls_in_flight)
{
    rig_t g;
    rig_open(&g, "shut");
    tcall_t t;
    tcall_make(&t, 2, 1);
    mux_call_t *c[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(mux_submit(g.m, g.peer, &t.c, &c[i]), ECS_OK);
    mux_call_release(c[2]); /* abandoned */
    void *pl;
    mux_call_t *unsent;
    cr_assert_eq(mux_call_prepare(g.m, g.peer, &t.c, &pl, &unsent), ECS_OK);
    mux_call_release(unsent); /* prepared, never sent: freed (ASan checks) */
    mux_free(g.m);
    g.m = NULL;
    for (int i = 0; i < 2; i++) {
        cr_assert(mux_call_done(c[i]));
        cr_assert_eq(mux_call_result(c[i])->err, ECS_ERR_IO);
        mux_call_release(c[i]);
    }
    rig_close(&g);
}

/* The worker's side of the connection goes away: the peer counts a drop
 * (what the coordinator takes for a dead worker), a peer never connected
 * none. */
Test(mux, dropped_connection_is_counted)
{
    rig_t g;
    rig_open(&g, "drop");
    tcall_t t;
    tcall_make(&t, 2, 1);
    mux_call_t *c;
    cr_assert_eq(mux_submit(g.m, g.peer, &t.c, &c), ECS_OK);
    zmq_msg_t part;
    zmq_msg_init(&part);
    cr_assert_geq(zmq_msg_recv(&part, g.router, 0), 0); /* connected: the call arrived */
    zmq_msg_close(&part);
    cr_assert_eq(mux_peer_drops(g.m, g.peer), 0);
    raw_router_close(g.router, g.ep);
    /* the monitor's event comes through the I/O thread's poll: under ASan
     * on a loaded machine it once took longer than 5 s (CI, 2026-12-01) */
    for (int i = 0; i < 2000 && !mux_peer_drops(g.m, g.peer); i++)
        usleep(10000);
    cr_assert_eq(mux_peer_drops(g.m, g.peer), 1);
    cr_assert_eq(mux_peer_drops(g.m, 999), 0);
    mux_call_release(c);
    mux_free(g.m);
    zmq_ctx_term(g.zctx);
}
