/* test_netem.c - the mux's test-only network emulation (ECS_TEST_NET:
 * delay, jitter and loss of expert calls and replies) and mux_call_cancel,
 * which is how a caller gets a lost call back to send it again. Criterion
 * runs each test in its own process, so setenv stays inside the test. */
#include "mux_fixture.h"

static ecs_err_t mux_with(const char *spec, mux_t **m)
{
    setenv("ECS_TEST_NET", spec, 1);
    return mux_new(&(mux_opts_t){0}, m);
}

/* A mux under spec connected to srv (started here unless already). */
static void rig(tserver_t *srv, bool start, const char *spec, mux_t **m, int *peer)
{
    if (start) {
        server_start(srv, "tcp://127.0.0.1:*");
        server_run(srv);
    }
    cr_assert_eq(mux_with(spec, m), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(mux_peer_connect(*m, mux_server_endpoint(srv->s), peer), ECS_OK);
}

/* A fresh server, a mux under spec connected to it, and one call t sent. */
static mux_call_t *rig_call(tserver_t *srv, const char *spec, mux_t **m, int *peer, tcall_t *t,
                            uint32_t rows, float seed)
{
    rig(srv, true, spec, m, peer);
    tcall_make(t, rows, seed);
    mux_call_t *c;
    cr_assert_eq(mux_submit(*m, *peer, &t->c, &c), ECS_OK);
    return c;
}

Test(netem, bad_specs_are_refused_with_the_reason)
{
    static const struct { const char *spec, *says; ecs_err_t err; } bad[] = {
        {"drop=2", "drop=2", ECS_ERR_RANGE},       {"delay_ms=-1", "delay_ms", ECS_ERR_RANGE},
        {"delay_ms=1.5", "delay_ms", ECS_ERR_RANGE}, {"loss=0.1", "unknown key 'loss'", ECS_ERR_INVAL},
        {"drop", "not key=value", ECS_ERR_INVAL},  {"jitter_ms=abc", "not a number", ECS_ERR_INVAL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mux_t *m = (mux_t *)1;
        cr_assert_eq(mux_with(bad[i].spec, &m), bad[i].err, "%s: %s", bad[i].spec, ecs_errmsg());
        cr_assert_null(m);
        cr_assert(strstr(ecs_errmsg(), bad[i].says), "%s: '%s'", bad[i].spec, ecs_errmsg());
    }
    mux_t *m;
    cr_assert_eq(mux_with("", &m), ECS_OK); /* empty: off */
    mux_free(m);
    cr_assert_eq(mux_with("delay_ms=0,drop=0,seed=3,", &m), ECS_OK, "%s", ecs_errmsg());
    mux_free(m);
}

/* Every call lost: it stays in flight until cancelled, then fails with
 * ECS_ERR_IO ("cancelled") and leaves nothing in flight. */
Test(netem, lost_calls_stay_in_flight_until_cancelled)
{
    tserver_t srv;
    mux_t *m;
    int peer;
    tcall_t t;
    mux_call_t *c = rig_call(&srv, "drop=1", &m, &peer, &t, 3, 5);
    cr_assert_eq(mux_wait(m, &c, 1, 200), 1, "a dropped call completed");
    cr_assert_eq(mux_peer_inflight(m, peer), 1);
    cr_assert_eq(mux_call_cancel(m, c), ECS_OK);
    cr_assert_eq(mux_call_cancel(m, c), ECS_OK); /* twice: no effect */
    cr_assert_eq(mux_wait(m, &c, 1, 10000), 0);
    const mux_result_t *r = mux_call_result(c);
    cr_assert_eq(r->err, ECS_ERR_IO);
    cr_assert(strstr(r->message, "cancelled"), "%s", r->message);
    cr_assert_eq(mux_call_cancel(m, c), ECS_OK); /* completed: no effect */
    mux_call_release(c);
    mux_peer_stats_t st;
    cr_assert_eq(mux_peer_stats(m, peer, &st), ECS_OK);
    cr_assert_eq(st.calls_in_flight, 0);
    cr_assert_eq(st.rows_in_flight, 0);
    cr_assert_eq(st.calls_failed, 1);
    cr_assert_eq(st.calls_sent, 0); /* lost before the socket */
    mux_free(m);
    wire_stats_t ws;
    mux_server_stats(srv.s, &ws);
    cr_assert_eq(ws.calls, 0);
    server_stop(&srv);
}

/* Delayed and jittered both ways: every call still gets its own answer
 * (replies overtake each other), never sooner than the two delays. */
Test(netem, delayed_calls_get_their_own_answers)
{
    tserver_t srv;
    mux_t *m;
    int peer;
    rig(&srv, true, "delay_ms=20,jitter_ms=30,seed=11", &m, &peer);
    enum { N = 40 };
    static tcall_t t[N];
    mux_call_t *c[N];
    for (int i = 0; i < N; i++) {
        tcall_make(&t[i], 1 + (uint32_t)i % 7, (float)(3 * i));
        cr_assert_eq(mux_submit(m, peer, &t[i].c, &c[i]), ECS_OK);
    }
    cr_assert_eq(mux_wait(m, c, N, 30000), 0);
    for (int i = 0; i < N; i++) {
        check_result(&t[i], c[i]);
        cr_assert_geq(mux_call_result(c[i])->rtt_ns, 40 * 1000000ull, "call %d came back in %llu ns",
                      i, (unsigned long long)mux_call_result(c[i])->rtt_ns);
        mux_call_release(c[i]);
    }
    mux_peer_stats_t st;
    cr_assert_eq(mux_peer_stats(m, peer, &st), ECS_OK);
    cr_assert_eq(st.calls_ok, N);
    cr_assert_eq(st.unknown_ids + st.duplicate_replies + st.bad_messages, 0);
    mux_free(m);
    server_stop(&srv);
}

/* A call cancelled while the emulated link still holds it is never sent;
 * one lost half the time is answered after enough tries. */
Test(netem, cancel_while_held_and_retry_until_answered)
{
    tserver_t srv;
    mux_t *m;
    int peer;
    tcall_t t;
    mux_call_t *c = rig_call(&srv, "delay_ms=10000", &m, &peer, &t, 2, 9);
    cr_assert_eq(mux_call_cancel(m, c), ECS_OK);
    cr_assert_eq(mux_wait(m, &c, 1, 10000), 0);
    cr_assert_eq(mux_call_result(c)->err, ECS_ERR_IO);
    mux_call_release(c);
    mux_free(m); /* frees what is still held */

    rig(&srv, false, "drop=0.5,seed=5", &m, &peer);
    int tries = 0;
    for (;;) {
        cr_assert_lt(tries++, 200, "never answered");
        cr_assert_eq(mux_submit(m, peer, &t.c, &c), ECS_OK);
        if (mux_wait(m, &c, 1, 100) == 0 && mux_call_result(c)->err == ECS_OK)
            break;
        mux_call_cancel(m, c);
        mux_wait(m, &c, 1, 10000);
        mux_call_release(c);
    }
    check_result(&t, c);
    mux_call_release(c);
    mux_free(m);
    server_stop(&srv);
}
