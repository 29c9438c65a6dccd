/* test_mux_server.c - the worker's side of the transport on real sockets:
 * every kind of bad call gets the answer docs/protocol.md gives and the
 * server keeps serving; silent peers (ZeroMQ and raw TCP) block nothing;
 * control messages go both ways and bad ones are answered with Error. */
#include "mux_fixture.h"

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

