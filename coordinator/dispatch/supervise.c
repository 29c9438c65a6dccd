/* supervise.c - the control thread: heartbeats both ways, failure
 * detection, re-registration and the restart of spawned workers.
 *
 * A worker is declared dead when it has been silent for WIRE_LIVENESS
 * heartbeat intervals (a hung or SIGSTOPped process, a lost link), or at
 * once when a worker spawned here exits (waitpid) or its data connection
 * drops (the transport's socket monitor: a remote worker's process died). Declaring it dead
 * disconnects its data peer: the mux fails its calls in flight (ECS_ERR_IO)
 * and drops any late reply with the socket, so the model thread re-sends
 * those experts to a live replica or holds them until the worker is back.
 *
 * A worker is back when:
 *   - a new process registers with its id (a restart): it gets its old
 *     assignment again, and its data peer is connected anew on Ready;
 *   - the same process speaks again (SIGCONT, a healed link): it still
 *     holds its experts, so only the data peer is connected anew.
 * A spawned worker that exits is restarted after a delay that doubles
 * with every exit before Ready (DISPATCH_RESTART_MIN_MS up to _MAX_MS);
 * after DISPATCH_CRASH_LIMIT such exits in a row it is reported and left
 * alone (FAILED), and steps that need experts only it held fail at once. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "coordinator/dispatch/dispatch_int.h"

void dispatch_state_changed(dispatch_t *d)
{
    pthread_mutex_lock(&d->lock);
    d->state_gen++;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

static void declare_dead(dispatch_t *d, int wi, const char *why, uint64_t now)
{
    dispatch_worker_t *w = &d->w[wi];
    const int st = atomic_load(&w->state);
    if (st == DW_DEAD || st == DW_FAILED)
        return;
    atomic_store(&w->state, DW_DEAD);
    w->died_ms = now;
    w->deaths++;
    pthread_mutex_lock(&d->lock);
    snprintf(w->why, sizeof w->why, "%s", why);
    pthread_mutex_unlock(&d->lock);
    const int peer = atomic_load(&w->peer);
    if (peer >= 0)
        mux_peer_disconnect(d->mux, peer); /* fails its calls in flight */
    fprintf(stderr, "dispatch: worker %s declared dead: %s (last heard %llu ms ago)\n", w->id,
            why, (unsigned long long)(now - w->last_seen_ms));
    dispatch_state_changed(d);
}

/* Connects a fresh data peer to worker wi and lets calls reach it. */
static void make_live(dispatch_t *d, int wi, uint64_t now, const char *how)
{
    dispatch_worker_t *w = &d->w[wi];
    const int old = atomic_load(&w->peer);
    if (old >= 0)
        mux_peer_disconnect(d->mux, old);
    int peer;
    if (dispatch_connect_peer(d, wi, &peer) != ECS_OK) {
        fprintf(stderr, "dispatch: worker %s: data endpoint %s: %s\n", w->id, w->endpoint,
                ecs_errmsg());
        return;
    }
    atomic_store(&w->peer, peer);
    atomic_store(&w->state, DW_LIVE);
    if (w->child >= 0) {
        d->children[w->child].ready = true;
        d->children[w->child].fails = 0;
        d->children[w->child].backoff_ms = DISPATCH_RESTART_MIN_MS;
    }
    fprintf(stderr, "dispatch: worker %s is back (%s), %llu ms after it was declared dead\n",
            w->id, how, (unsigned long long)(w->died_ms ? now - w->died_ms : 0));
    dispatch_state_changed(d);
}

static void logmsg_ready(const dispatch_t *d, const dispatch_worker_t *w, const wire_ready_t *r)
{
    dispatch_log(d, "worker %s holds its new assignment %llu (%.1f MiB, loaded in %.0f ms)", w->id,
                 (unsigned long long)r->generation, r->bytes_mapped / 1048576.0, r->load_ns / 1e6);
}

static int worker_by_route(const dispatch_t *d, const mux_route_t *r)
{
    for (int i = 0; i < d->n_workers; i++)
        if (d->w[i].route.len == r->len && !memcmp(d->w[i].route.id, r->id, r->len))
            return i;
    return -1;
}

static void on_message(dispatch_t *d, const mux_route_t *from, const wire_msg_t *m, uint64_t now)
{
    int wi;
    if (m->kind == WIRE_HELLO) {
        bool renewed;
        const int before = dispatch_find_worker(d, m->hello.worker_id);
        if (before < 0) {
            /* the placement is made: no new workers (a later issue) */
            wi = dispatch_on_hello(d, from, &m->hello, d->n_workers, &renewed);
            return;
        }
        const int st = atomic_load(&d->w[before].state);
        if (st == DW_FAILED)
            return;
        wi = dispatch_on_hello(d, from, &m->hello, d->n_workers, &renewed);
        if (wi < 0)
            return;
        if (renewed) { /* a new process: it holds nothing yet */
            declare_dead(d, wi, "replaced by a new process", now);
            d->w[wi].registrations++;
            atomic_store(&d->w[wi].state, DW_LOADING);
            if (dispatch_send_assign(d, wi) != ECS_OK)
                fprintf(stderr, "%s\n", ecs_errmsg());
        } else if (st == DW_DEAD) {
            make_live(d, wi, now, "registered again, same process");
        }
        return;
    }
    if ((wi = worker_by_route(d, from)) < 0)
        return;
    dispatch_worker_t *w = &d->w[wi];
    w->last_seen_ms = now;
    const int st = atomic_load(&w->state);
    if (m->kind == WIRE_READY) {
        pthread_mutex_lock(&d->lock);
        if (m->ready.generation <= w->assign_gen)
            w->ready_gen = m->ready.generation;
        w->bytes_held = m->ready.bytes_mapped;
        pthread_mutex_unlock(&d->lock);
    }
    if (m->kind == WIRE_READY && st == DW_LOADING) {
        fprintf(stderr, "dispatch: worker %s reloaded its experts (%.1f MiB) in %.0f ms\n", w->id,
                m->ready.bytes_mapped / 1048576.0, m->ready.load_ns / 1e6);
        make_live(d, wi, now, "restarted and loaded");
    } else if (m->kind == WIRE_READY) {
        logmsg_ready(d, w, &m->ready);
        dispatch_state_changed(d);
    } else if (m->kind == WIRE_ERROR) {
        fprintf(stderr, "dispatch: worker %s says %s: %s\n", w->id,
                wire_status_name(m->error.code), m->error.message);
    } else if (st == DW_DEAD) {
        make_live(d, wi, now, "speaking again, same process");
    }
}

/* Spawned workers that exited: declared dead at once, restarted later. */
static void reap(dispatch_t *d, uint64_t now)
{
    for (int i = 0; i < d->n_spawned; i++) {
        dispatch_child_t *c = &d->children[i];
        int st;
        if (c->pid <= 0 || waitpid(c->pid, &st, WNOHANG) != c->pid)
            continue;
        char why[96];
        if (WIFEXITED(st))
            snprintf(why, sizeof why, "pid %d exited with status %d", (int)c->pid,
                     WEXITSTATUS(st));
        else
            snprintf(why, sizeof why, "pid %d was killed by signal %d", (int)c->pid,
                     WTERMSIG(st));
        c->pid = 0;
        char id[16];
        snprintf(id, sizeof id, "w%d", i);
        const int wi = dispatch_find_worker(d, id);
        if (wi >= 0)
            declare_dead(d, wi, why, now);
        if (!c->ready) { /* died at start: wait twice as long each time */
            c->fails++;
            c->backoff_ms *= 2;
            if (c->backoff_ms > DISPATCH_RESTART_MAX_MS)
                c->backoff_ms = DISPATCH_RESTART_MAX_MS;
        } else {
            c->fails = 0;
            c->backoff_ms = DISPATCH_RESTART_MIN_MS;
        }
        if (c->fails >= DISPATCH_CRASH_LIMIT) {
            c->given_up = true;
            fprintf(stderr, "dispatch: worker %s keeps dying at start (%d times in a row, last: "
                    "%s): not restarting it\n", id, c->fails, why);
            if (wi >= 0) {
                pthread_mutex_lock(&d->lock);
                snprintf(d->w[wi].why, sizeof d->w[wi].why,
                         "crash loop: died at start %d times in a row, last: %s", c->fails, why);
                pthread_mutex_unlock(&d->lock);
                atomic_store(&d->w[wi].state, DW_FAILED);
                dispatch_state_changed(d);
            }
            continue;
        }
        c->restart_at_ms = now + c->backoff_ms;
        fprintf(stderr, "dispatch: restarting worker %s in %u ms\n", id, c->backoff_ms);
    }
}

static void restart_due(dispatch_t *d, uint64_t now)
{
    for (int i = 0; i < d->n_spawned; i++) {
        dispatch_child_t *c = &d->children[i];
        if (c->pid > 0 || c->given_up || !c->restart_at_ms || now < c->restart_at_ms)
            continue;
        c->restart_at_ms = 0;
        c->restarts++;
        if (dispatch_spawn_one(d, i) != ECS_OK) {
            fprintf(stderr, "dispatch: restarting worker w%d: %s\n", i, ecs_errmsg());
            c->restart_at_ms = now + DISPATCH_RESTART_MAX_MS;
        }
    }
}

static void check_liveness(dispatch_t *d, uint64_t now)
{
    const uint64_t limit = (uint64_t)DISPATCH_HEARTBEAT_MS * WIRE_LIVENESS;
    for (int i = 0; i < d->n_workers; i++) {
        const int st = atomic_load(&d->w[i].state);
        const int peer = atomic_load(&d->w[i].peer);
        if (st == DW_LIVE && peer >= 0 && mux_peer_drops(d->mux, peer) > 0) {
            declare_dead(d, i, "its data connection dropped", now);
            continue;
        }
        /* not while loading: the worker's control loop waits for its load */
        if (st == DW_LIVE && d->w[i].ready_gen == d->w[i].assign_gen &&
            now - d->w[i].last_seen_ms > limit) {
            char why[96];
            snprintf(why, sizeof why, "silent for %u heartbeats of %d ms", WIRE_LIVENESS,
                     DISPATCH_HEARTBEAT_MS);
            declare_dead(d, i, why, now);
        }
    }
}

void *dispatch_control_loop(void *arg)
{
    dispatch_t *d = arg;
    while (!atomic_load(&d->stop)) {
        mux_route_t from;
        wire_msg_t m;
        if (mux_ctrl_recv(d->mux, &from, &m, DISPATCH_TICK_MS) == ECS_OK &&
            m.kind != WIRE_NONE) {
            on_message(d, &from, &m, dispatch_now_ms());
            wire_msg_clear(&m);
        }
        const uint64_t now = dispatch_now_ms();
        reap(d, now);
        restart_due(d, now);
        check_liveness(d, now);
        dispatch_heartbeat_all(d, now);
        dispatch_ops_tick(d, now);
    }
    return NULL;
}
