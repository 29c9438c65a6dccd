/* test_mux_role.c - the mux's I/O role (mux.h: a caller that finds the
 * role free does the socket work itself): its holder serves other threads'
 * commands and calls, and the I/O thread takes the role back.
 *
 * A binary of its own: run beside another test of test_mux (--jobs 2),
 * Criterion's runner leaked 48 bytes inside libcriterion at exit in most
 * runs (LeakSanitizer in the ASan run), which the harness counts as a
 * failure; alone it never did. */
#include <stdatomic.h>

#include "mux_fixture.h"

typedef struct {
    mux_t *m;
    mux_call_t *call;
    atomic_bool done;
} leader_t;

static void *leader_main(void *p)
{
    leader_t *l = p;
    cr_assert_eq(mux_wait(l->m, &l->call, 1, -1), 0);
    atomic_store(&l->done, true);
    return NULL;
}

/* One thread waits (no time limit) on a call to a hand-driven worker,
 * holding the I/O role if it found it free; meanwhile another thread
 * connects a real worker (a command the role's holder must run) and
 * completes a call through it (sent and received by whoever holds the
 * role). Then the hand-driven worker answers, the waiter returns the
 * role, and a call nobody waits for still completes: the I/O thread took
 * the role back and watches the socket connected while it had not. */
Test(mux, role_holder_serves_other_threads, .timeout = 60)
{
    rig_t g;
    rig_open(&g, "role");
    tcall_t t1, t2, t3;
    tcall_make(&t1, 2, 1);
    tcall_make(&t2, 3, 2);
    tcall_make(&t3, 5, 3);
    leader_t l = {.m = g.m};
    cr_assert_eq(mux_submit(g.m, g.peer, &t1.c, &l.call), ECS_OK, "%s", ecs_errmsg());
    rawcall_t rc;
    wire_msg_t w;
    raw_recv_call(g.router, &rc, &w); /* sent */
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, leader_main, &l), 0);
    usleep(50000); /* most runs: the waiter leads by now (either way must work) */

    tserver_t srv;
    char ep[128];
    ipc_path(ep, sizeof ep, "role-srv");
    server_start(&srv, ep);
    server_run(&srv);
    int peer2;
    cr_assert_eq(mux_peer_connect(g.m, mux_server_endpoint(srv.s), &peer2), ECS_OK, "%s",
                 ecs_errmsg());
    mux_call_t *c2;
    cr_assert_eq(mux_submit(g.m, peer2, &t2.c, &c2), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(mux_wait(g.m, &c2, 1, 20000), 0);
    check_result(&t2, c2);
    mux_call_release(c2);
    cr_assert_not(atomic_load(&l.done), "the first call was never answered");

    raw_reply(g.router, &rc.route, &w.call, w.call.request_id, (uint32_t)w.call.n_entries,
              WIRE_VERSION);
    raw_close(&rc);
    wire_msg_clear(&w);
    pthread_join(th, NULL);
    check_result(&t1, l.call);
    mux_call_release(l.call);

    mux_call_t *c3;
    cr_assert_eq(mux_submit(g.m, peer2, &t3.c, &c3), ECS_OK, "%s", ecs_errmsg());
    for (int i = 0; i < 2000 && !mux_call_done(c3); i++) /* nobody waits: the I/O thread */
        usleep(10000);
    cr_assert(mux_call_done(c3));
    check_result(&t3, c3);
    mux_call_release(c3);
    rig_close(&g);
    server_stop(&srv);
}

typedef struct {
    mux_t *m;
    int peer[2];
    int seed;
} stress_t;

static void *stress_main(void *p)
{
    stress_t *s = p;
    for (int i = 0; i < 200; i++) {
        tcall_t t[2];
        mux_call_t *c[2];
        for (int k = 0; k < 2; k++) {
            tcall_make(&t[k], 1 + (uint32_t)(i + k) % 8, (float)(s->seed * 1000 + i * 2 + k));
            cr_assert_eq(mux_submit(s->m, s->peer[k], &t[k].c, &c[k]), ECS_OK, "%s",
                         ecs_errmsg());
        }
        if (i % 5 == 4) { /* nobody waits: the I/O thread or another thread's wait */
            for (int w = 0; w < 10000 && !(mux_call_done(c[0]) && mux_call_done(c[1])); w++)
                usleep(1000);
        } else {
            cr_assert_eq(mux_wait(s->m, c, 2, 10000), 0, "a reply was left unread");
        }
        for (int k = 0; k < 2; k++) {
            check_result(&t[k], c[k]);
            mux_call_release(c[k]);
        }
    }
    return NULL;
}

/* Four threads submit and wait at once on two workers, a fifth of the
 * calls left for whoever holds the role: the role moves between them call
 * by call, each sends and reads, and a send may take ZeroMQ's wake-up
 * command of a reply another thread waits for (the "dirty" sockets of
 * mux.h). A reply left unread, its ZMQ_FD quiet, ends a wait at its time
 * limit or leaves a call undone. */
Test(mux, role_moves_under_contention, .timeout = 120)
{
    tserver_t srv[2];
    stress_t st[4];
    pthread_t th[4];
    mux_t *m;
    cr_assert_eq(mux_new(NULL, &m), ECS_OK, "%s", ecs_errmsg());
    int peer[2];
    for (int k = 0; k < 2; k++) {
        char ep[128];
        ipc_path(ep, sizeof ep, "stress");
        server_start(&srv[k], ep);
        server_run(&srv[k]);
        cr_assert_eq(mux_peer_connect(m, mux_server_endpoint(srv[k].s), &peer[k]), ECS_OK, "%s",
                     ecs_errmsg());
    }
    for (int i = 0; i < 4; i++) {
        st[i] = (stress_t){.m = m, .peer = {peer[0], peer[1]}, .seed = i};
        cr_assert_eq(pthread_create(&th[i], NULL, stress_main, &st[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    mux_peer_stats_t ps;
    cr_assert_eq(mux_peer_stats(m, peer[0], &ps), ECS_OK);
    cr_assert_eq(ps.calls_ok, 800);
    cr_assert_eq(ps.unknown_ids + ps.duplicate_replies + ps.bad_messages, 0);
    mux_free(m);
    for (int k = 0; k < 2; k++)
        server_stop(&srv[k]);
}
