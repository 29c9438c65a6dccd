/* netem.c - private to proto/: test-only fault injection on the
 * coordinator mux's data plane, so tests can emulate a bad network where
 * the kernel has no `tc netem`. Off unless ECS_TEST_NET is set, e.g.
 *
 *     ECS_TEST_NET="delay_ms=20,jitter_ms=5,drop=0.01,seed=7"
 *
 * delay_ms (0-10000) holds every expert call on its way out and every
 * reply on its way in for that long (one way: a round trip gets it twice),
 * plus a uniform extra of 0..jitter_ms (0-10000), so messages may overtake
 * each other; drop (0-1) loses each call and each reply with that
 * probability, as a lossy link would (the call stays in flight: the
 * dispatcher's retry or deadline deals with it); seed fixes the random
 * sequence. Control messages (registration, heartbeats) are never touched:
 * the point is to exercise the data path's recovery, not detection.
 *
 * Everything below runs on the mux's I/O thread, except netem_parse. */
#include "mux_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zutil.h"

/* One "key=value" of the spec into cfg. */
static ecs_err_t parse_one(const char *kv, size_t len, mux_netem_t *cfg)
{
    char buf[64];
    if (len >= sizeof buf)
        return ecs_error(ECS_ERR_INVAL, "ECS_TEST_NET: '%.*s' is too long", (int)len, kv);
    memcpy(buf, kv, len);
    buf[len] = 0;
    char *eq = strchr(buf, '=');
    if (!eq || !eq[1])
        return ecs_error(ECS_ERR_INVAL, "ECS_TEST_NET: '%s' is not key=value", buf);
    *eq = 0;
    const char *v = eq + 1;
    char *end;
    const double x = strtod(v, &end);
    if (*end)
        return ecs_error(ECS_ERR_INVAL, "ECS_TEST_NET: %s=%s is not a number", buf, v);
    if (!strcmp(buf, "delay_ms") || !strcmp(buf, "jitter_ms")) {
        if (!(x >= 0 && x <= 10000) || x != (int)x)
            return ecs_error(ECS_ERR_RANGE, "ECS_TEST_NET: %s=%s (a whole 0-10000)", buf, v);
        *(buf[0] == 'd' ? &cfg->delay_ms : &cfg->jitter_ms) = (int)x;
    } else if (!strcmp(buf, "drop")) {
        if (!(x >= 0 && x <= 1))
            return ecs_error(ECS_ERR_RANGE, "ECS_TEST_NET: drop=%s (a probability 0-1)", v);
        cfg->drop = x;
    } else if (!strcmp(buf, "seed")) {
        if (!(x >= 0) || x != (double)(uint64_t)x)
            return ecs_error(ECS_ERR_RANGE, "ECS_TEST_NET: seed=%s (a whole number)", v);
        cfg->seed = (uint64_t)x;
    } else {
        return ecs_error(ECS_ERR_INVAL, "ECS_TEST_NET: unknown key '%s' (delay_ms, jitter_ms, "
                         "drop, seed)", buf);
    }
    return ECS_OK;
}

ecs_err_t mux_netem_parse(const char *spec, mux_netem_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    if (!spec || !*spec)
        return ECS_OK;
    cfg->seed = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ zu_now_ns();
    for (const char *p = spec; *p;) {
        const size_t len = strcspn(p, ",");
        if (len) {
            ecs_err_t e = parse_one(p, len, cfg);
            if (e)
                return e;
        }
        p += len + (p[len] == ',');
    }
    cfg->on = cfg->delay_ms || cfg->jitter_ms || cfg->drop > 0;
    if (!cfg->seed)
        cfg->seed = 1; /* xorshift's one bad state */
    return ECS_OK;
}

/* xorshift64*: uniform in [0, 1). */
static double rnd(mux_t *m)
{
    uint64_t x = m->net.seed;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    m->net.seed = x;
    return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

static uint64_t due_ns(mux_t *m)
{
    const double ms = m->net.delay_ms + (m->net.jitter_ms ? rnd(m) * m->net.jitter_ms : 0);
    return zu_now_ns() + (uint64_t)(ms * 1e6);
}

/* Keeps the held list sorted by due time (short: a few ms of traffic). */
static void hold(mux_t *m, mux_held_t *h)
{
    mux_held_t **pp = &m->held;
    while (*pp && (*pp)->due_ns <= h->due_ns)
        pp = &(*pp)->next;
    h->next = *pp;
    *pp = h;
}

bool mux_netem_out(mux_t *m, mux_call_t *c)
{
    if (m->net.drop > 0 && rnd(m) < m->net.drop) {
        ADD(m->net_dropped, 1);
        return true; /* in the table, never sent: lost on the wire */
    }
    if (!m->net.delay_ms && !m->net.jitter_ms)
        return false;
    mux_held_t *h = calloc(1, sizeof *h);
    if (!h)
        return false; /* no memory to emulate the delay: send now */
    h->due_ns = due_ns(m);
    h->call = c;
    h->peer = c->peer;
    atomic_fetch_add(&c->refs, 1); /* the held list's */
    ADD(m->net_delayed, 1);
    hold(m, h);
    return true;
}

bool mux_netem_in(mux_t *m, int peer, zmq_msg_t *parts, int n)
{
    if (m->net.drop > 0 && rnd(m) < m->net.drop) {
        ADD(m->net_dropped, 1);
        return true;
    }
    if (!m->net.delay_ms && !m->net.jitter_ms)
        return false;
    mux_held_t *h = calloc(1, sizeof *h);
    if (!h)
        return false;
    h->due_ns = due_ns(m);
    h->peer = peer;
    h->n = n;
    for (int i = 0; i < n && i < ZU_MAX_PARTS; i++) {
        zmq_msg_init(&h->parts[i]);
        zmq_msg_move(&h->parts[i], &parts[i]);
    }
    ADD(m->net_delayed, 1);
    hold(m, h);
    return true;
}

int mux_netem_timeout(const mux_t *m)
{
    if (!m->held)
        return -1;
    const uint64_t now = zu_now_ns();
    if (m->held->due_ns <= now)
        return 0;
    return (int)((m->held->due_ns - now + 999999) / 1000000);
}

static void held_free(mux_held_t *h)
{
    if (h->call)
        mux_call_unref(h->call);
    else
        zu_close_parts(h->parts, h->n < ZU_MAX_PARTS ? h->n : ZU_MAX_PARTS);
    free(h);
}

void mux_netem_release(mux_t *m, void (*send)(mux_t *, mux_call_t *),
                       void (*recv)(mux_t *, int, zmq_msg_t *, int))
{
    const uint64_t now = zu_now_ns();
    while (m->held && m->held->due_ns <= now) {
        mux_held_t *h = m->held;
        m->held = h->next;
        /* a call failed meanwhile (its peer closed, cancelled) is not sent;
         * a reply from a peer closed meanwhile went with its socket */
        if (h->call && !atomic_load(&h->call->done) && m->peers[h->peer]->sock)
            send(m, h->call);
        else if (!h->call && m->peers[h->peer]->sock)
            recv(m, h->peer, h->parts, h->n);
        held_free(h);
    }
}

void mux_netem_free(mux_t *m)
{
    while (m->held) {
        mux_held_t *h = m->held;
        m->held = h->next;
        held_free(h);
    }
    if (m->net.on)
        fprintf(stderr, "mux: ECS_TEST_NET injected: %llu messages dropped, %llu delayed\n",
                (unsigned long long)LOAD(m->net_dropped), (unsigned long long)LOAD(m->net_delayed));
}
