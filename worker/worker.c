/* worker.c - registration, heartbeats and the serve loop of ecs-worker.
 *
 * Everything runs on one thread, the mux server's: it owns the data ROUTER
 * and the control DEALER, so calls, control messages and ticks are handled
 * in turn and no socket is shared. Compute inside a call uses the pool.
 *
 * Until the coordinator's Welcome arrives the worker repeats its Hello,
 * WORKER_HELLO_MS apart at first and doubling up to WORKER_HELLO_MAX_MS
 * (the coordinator may start after it, or be gone for a while). The
 * coordinator heartbeats too: silent for WIRE_LIVENESS of its intervals,
 * it is taken for gone and the worker registers again, keeping the experts
 * it holds and serving calls meanwhile. A refusal
 * for good (another model, no common version) ends worker_run with the
 * coordinator's reason; any other Error is logged and serving goes on.
 *
 * Several coordinators (M:N, --coordinator repeated): the worker registers
 * with each on its own control DEALER, with its own Hello backoff,
 * heartbeats and liveness, and serves the calls of all (fairly: the
 * server's queue takes them round robin per coordinator). It holds one
 * shard: the coordinators compute the same placement from the same worker
 * set (placement is deterministic: docs/operations.md), so the second
 * coordinator's Assign equals the first's and is answered Ready without
 * loading anything. An Assign that differs from what the worker holds is
 * taken only when no other live coordinator calls the experts held now
 * (was answered Ready for them); otherwise it is refused with an Error
 * naming that coordinator, so a coordinator that disagrees never makes a
 * worker drop experts another one calls. A refusal
 * for good from one coordinator ends the talk with that one; the worker
 * ends when every coordinator refused it. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/hash.h"
#include "worker/worker.h"
#include "worker/worker_int.h"

#define WORKER_HELLO_MS 500
#define WORKER_HELLO_MAX_MS 8000
#define WORKER_TICK_MS 100
#define WORKER_STATS_MS 5000 /* Stats of a worker on a device (its hit rate) */

/* One coordinator this worker registers with. */
typedef struct {
    const char *addr;
    int conn;                   /* mux server control connection */
    bool welcomed, refused;     /* refused: for good (another model, version) */
    bool uses_shard;            /* answered Ready for the experts held now */
    uint32_t heartbeat_ms;
    uint64_t hb_seq, last_sent_ns, last_recv_ns;
    uint64_t hello_gap_ms;
} worker_coord_t;

struct worker {
    worker_opts_t o;
    char id[64], host[64], device[32], listen[512];
    gguf_file_t *f;
    arch_hparams_t hp;
    uint8_t fp[GGUF_FINGERPRINT_BYTES];
    ecs_threadpool_t *tp;
    mux_server_t *srv;
    mux_curve_keys_t keys;   /* CURVE on the links (off: plaintext) */
    worker_coord_t co[WORKER_MAX_COORDINATORS];
    int n_co;
    shard_t shard;
    shard_dev_t *dev;
    uint64_t last_stats_ns;
    ecs_err_t fatal;
    char fatal_msg[512];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void logf_(const worker_t *w, bool err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logf_(const worker_t *w, bool err, const char *fmt, ...)
{
    if (w->o.quiet && !err)
        return;
    va_list ap;
    char prefix[128];
    snprintf(prefix, sizeof prefix, "ecs-worker %s: ", w->id);
    va_start(ap, fmt);
    ecs_logv(prefix, fmt, ap);
    va_end(ap);
}

static ecs_err_t send_msg(worker_t *w, worker_coord_t *c, const wire_msg_t *m)
{
    ecs_err_t rc = mux_server_send(w->srv, c->conn, m);
    if (rc != ECS_OK)
        logf_(w, true, "cannot send %s to %s: %s", wire_kind_name(m->kind), c->addr,
              ecs_errmsg());
    else
        c->last_sent_ns = now_ns();
    return rc;
}

static void send_hello(worker_t *w, worker_coord_t *c)
{
    wire_msg_t m = {.kind = WIRE_HELLO,
                    .hello = {.min_version = WIRE_VERSION_MIN,
                              .max_version = WIRE_VERSION,
                              .fingerprint = w->fp,
                              .fingerprint_len = sizeof w->fp,
                              .worker_id = w->id,
                              .host = w->host,
                              .pid = (uint32_t)getpid(),
                              .threads = (uint32_t)w->o.threads,
                              .mem_budget = w->o.mem_budget,
                              .device = w->device,
                              /* the device path takes f32 rows and returns f32 */
                              .capabilities = WIRE_CAP_SHM |
                                  (w->dev ? 0 : WIRE_CAP_INPUT_Q8 | WIRE_CAP_RESULT_BF16 |
                                                    WIRE_CAP_SHARED),
                              .data_endpoint = w->listen,
                              .vram_budget = w->dev ? shard_dev_budget(w->dev) : 0,
                              .curve_public = w->keys.on ? w->keys.key.pub : ""}};
    send_msg(w, c, &m);
    c->hello_gap_ms = c->hello_gap_ms ? c->hello_gap_ms * 2 : WORKER_HELLO_MS;
    if (c->hello_gap_ms > WORKER_HELLO_MAX_MS)
        c->hello_gap_ms = WORKER_HELLO_MAX_MS;
}

static void send_error(worker_t *w, worker_coord_t *c, wire_status_t code, wire_kind_t about,
                       const char *msg)
{
    wire_msg_t m = {.kind = WIRE_ERROR, .error = {.code = code, .message = msg, .about = about}};
    send_msg(w, c, &m);
}

/* The expert cache's counters and the device allocations so far (which
 * calls never add to: tests/integration/test_gpu_worker.sh reads this). */
static void log_cache(const worker_t *w)
{
    wire_stats_t st = {0};
    uint64_t dev_bytes;
    size_t n_allocs;
    shard_dev_stats(w->dev, &st);
    shard_dev_usage(w->dev, &dev_bytes, &n_allocs);
    logf_(w, false, "expert cache: hit rate %.1f%% (%llu hits of %llu uses; misses: %llu "
          "streamed, %llu on the host; %llu prefetched, %llu of them used), %u slots, "
          "%.1f MiB of VRAM, %zu device allocations",
          st.tier_uses ? 100.0 * (double)st.tier_hits / (double)st.tier_uses : 0.0,
          (unsigned long long)st.tier_hits, (unsigned long long)st.tier_uses,
          (unsigned long long)st.tier_streamed, (unsigned long long)st.tier_cpu,
          (unsigned long long)st.tier_prefetched, (unsigned long long)st.tier_prefetch_used,
          st.tier_slots, dev_bytes / 1048576.0, n_allocs);
}

/* Stats with the cache's counters to every registered coordinator. */
static void send_stats(worker_t *w)
{
    wire_msg_t m = {.kind = WIRE_STATS};
    mux_server_stats(w->srv, &m.stats);
    shard_dev_stats(w->dev, &m.stats);
    for (int i = 0; i < w->n_co; i++)
        if (w->co[i].welcomed && !w->co[i].refused)
            send_msg(w, &w->co[i], &m);
    w->last_stats_ns = now_ns();
    log_cache(w);
}

/* After a load: the device's tiers for the new shard (all its memory
 * allocated and checked against --vram-budget here). */
static ecs_err_t assign_device(worker_t *w, uint64_t *load_ns)
{
    char info[512];
    const uint64_t t0 = now_ns();
    ecs_err_t rc = shard_dev_assign(w->dev, &w->shard, info, sizeof info);
    if (rc != ECS_OK) {
        w->shard.n_held = 0; /* shard_call refuses until a good assignment */
        kmoe_free(w->shard.moe);
        w->shard.moe = NULL;
        return rc;
    }
    *load_ns += now_ns() - t0;
    logf_(w, false, "%s", info);
    log_cache(w);
    w->last_stats_ns = now_ns();
    return ECS_OK;
}

/* Another coordinator, registered and alive, that calls the experts held
 * now (they must not change under it): its index, -1 if none. */
static int other_user(const worker_t *w, int ci)
{
    for (int i = 0; i < w->n_co; i++)
        if (i != ci && w->co[i].welcomed && !w->co[i].refused && w->co[i].uses_shard)
            return i;
    return -1;
}

static void on_assign(worker_t *w, int ci, const wire_assign_t *a)
{
    worker_coord_t *c = &w->co[ci];
    uint64_t bytes = 0, load_ns = 0;
    char why[600];
    int other;
    if (shard_holds_exactly(&w->shard, a)) { /* e.g. the second coordinator's, M:N */
        bytes = w->shard.bytes;
        logf_(w, false, "assignment %llu from %s: already holds these %zu experts",
              (unsigned long long)a->generation, c->addr, a->n);
    } else if ((other = other_user(w, ci)) >= 0) {
        snprintf(why, sizeof why,
                 "worker %s holds %zu experts that coordinator %s calls; this "
                 "coordinator's placement differs (%zu experts): coordinators sharing workers "
                 "must place the same worker set with the same options",
                 w->id, w->shard.n_held, w->co[other].addr, a->n);
        logf_(w, true, "refusing assignment %llu from %s: %s", (unsigned long long)a->generation,
              c->addr, why);
        send_error(w, c, WIRE_ST_UNSUPPORTED, WIRE_ASSIGN, why);
        return;
    } else {
        ecs_err_t rc = shard_assign(&w->shard, a, w->o.mem_budget, w->tp, w->o.repack_dir,
                                    &bytes, &load_ns);
        if (rc == ECS_OK && w->dev)
            rc = assign_device(w, &load_ns);
        if (rc != ECS_OK) {
            if (!w->shard.n_held) /* failed after letting the old shard go */
                for (int i = 0; i < w->n_co; i++)
                    w->co[i].uses_shard = false;
            logf_(w, true, "refusing assignment %llu: %s", (unsigned long long)a->generation,
                  ecs_errmsg());
            send_error(w, c, rc == ECS_ERR_NOMEM ? WIRE_ST_OVER_BUDGET : WIRE_ST_BAD_MESSAGE,
                       WIRE_ASSIGN, ecs_errmsg());
            return;
        }
        for (int i = 0; i < w->n_co; i++) /* the old shard is gone */
            w->co[i].uses_shard = false;
        logf_(w, false, "holds %zu experts%s (%.1f MiB), loaded in %.0f ms", a->n,
              w->shard.shared ? " and the shared experts" : "", bytes / 1048576.0, load_ns / 1e6);
    }
    wire_msg_t m = {.kind = WIRE_READY,
                    .ready = {.generation = a->generation, .bytes_mapped = bytes,
                              .load_ns = load_ns}};
    send_msg(w, c, &m);
    c->uses_shard = true;
}

static int coord_of(const worker_t *w, int conn)
{
    for (int i = 0; i < w->n_co; i++)
        if (w->co[i].conn == conn)
            return i;
    return -1;
}

static void on_ctrl(void *ctx, int conn, const wire_msg_t *m)
{
    worker_t *w = ctx;
    const int ci = coord_of(w, conn);
    if (ci < 0)
        return;
    worker_coord_t *c = &w->co[ci];
    c->last_recv_ns = now_ns(); /* any message is a sign of life */
    switch (m->kind) {
    case WIRE_WELCOME:
        c->welcomed = true;
        c->hello_gap_ms = 0;
        c->heartbeat_ms = m->welcome.heartbeat_ms;
        logf_(w, false, "registered with %s at %s (protocol %u)", m->welcome.coordinator_id,
              c->addr, m->welcome.version);
        if (m->welcome.data_plane == WIRE_PLANE_SHM) {
            /* the coordinator sees whether we attached (the segment's word) */
            if (mux_server_attach_shm(w->srv, conn, m->welcome.shm_name) != ECS_OK)
                logf_(w, true, "coordinator %s: shared-memory plane refused (%s): calls stay "
                      "on ZeroMQ", c->addr, ecs_errmsg());
            else
                logf_(w, false, "coordinator %s: calls and results through shared memory",
                      c->addr);
        } else {
            mux_server_attach_shm(w->srv, conn, NULL); /* a plane of an earlier Welcome */
            if (m->welcome.data_plane != WIRE_PLANE_ZMQ) /* it offered none (proto/dplane) */
                logf_(w, true, "coordinator %s chose data plane %u, which this worker did not "
                      "offer: payloads stay on ZeroMQ", c->addr,
                      (unsigned)m->welcome.data_plane);
        }
        break;
    case WIRE_ASSIGN:
        on_assign(w, ci, &m->assign);
        for (int i = 0; i < w->n_co; i++) /* nothing was read while loading */
            w->co[i].last_recv_ns = now_ns();
        break;
    case WIRE_ERROR:
        if (m->error.code == WIRE_ST_FINGERPRINT || m->error.code == WIRE_ST_VERSION) {
            c->refused = true;
            c->welcomed = false;
            logf_(w, true, "coordinator %s refused this worker: %s", c->addr, m->error.message);
            bool all = true;
            for (int i = 0; i < w->n_co; i++)
                all &= w->co[i].refused;
            if (all) {
                w->fatal = m->error.code == WIRE_ST_VERSION ? ECS_ERR_UNSUPPORTED : ECS_ERR_INVAL;
                snprintf(w->fatal_msg, sizeof w->fatal_msg,
                         "the coordinator refused this worker: %s", m->error.message);
                mux_server_stop(w->srv);
            }
        } else {
            logf_(w, true, "coordinator %s says %s: %s", c->addr,
                  wire_status_name(m->error.code), m->error.message);
        }
        break;
    case WIRE_DRAIN:
        if (w->dev)
            send_stats(w);
        logf_(w, false, "drained (%s): stopping", m->drain.reason);
        mux_server_stop(w->srv);
        break;
    default:
        break; /* heartbeats: any message is a sign of life */
    }
}

static void heartbeat_if_due(worker_t *w, worker_coord_t *c, uint64_t t)
{
    if (c->welcomed && !c->refused && c->heartbeat_ms &&
        t - c->last_sent_ns >= (uint64_t)c->heartbeat_ms * 1000000u) {
        wire_msg_t m = {.kind = WIRE_HEARTBEAT, .heartbeat = {.seq = ++c->hb_seq, .time_ns = t}};
        send_msg(w, c, &m);
    }
}

static void tick_one(worker_t *w, worker_coord_t *c)
{
    const uint64_t t = now_ns();
    if (c->refused)
        return;
    if (c->welcomed && c->heartbeat_ms &&
        t - c->last_recv_ns > (uint64_t)c->heartbeat_ms * WIRE_LIVENESS * 1000000u) {
        logf_(w, true, "coordinator %s has been silent for %llu ms: registering again", c->addr,
              (unsigned long long)((t - c->last_recv_ns) / 1000000u));
        c->welcomed = false;
        c->uses_shard = false; /* a coordinator that comes back assigns again */
        c->hello_gap_ms = 0;
        send_hello(w, c);
        return;
    }
    if (!c->welcomed) {
        if (t - c->last_sent_ns >= c->hello_gap_ms * 1000000u)
            send_hello(w, c);
        return;
    }
    heartbeat_if_due(w, c, t);
}

static void on_tick(void *ctx)
{
    worker_t *w = ctx;
    for (int i = 0; i < w->n_co; i++)
        tick_one(w, &w->co[i]);
    if (w->dev && w->shard.n_held && now_ns() - w->last_stats_ns >= WORKER_STATS_MS * 1000000ull)
        send_stats(w);
}

/* Between a call's regions (shard.c): the heartbeat, if one is due, so
 * that a long call does not look like a hung worker. Only heartbeats: the
 * control messages wait for the serve loop. */
static void beat(void *ctx)
{
    worker_t *w = ctx;
    const uint64_t t = now_ns();
    for (int i = 0; i < w->n_co; i++)
        heartbeat_if_due(w, &w->co[i], t);
}

static void on_call(void *ctx, const wire_call_t *c, mux_reply_t *r)
{
    worker_t *w = ctx;
    const uint64_t t0 = now_ns();
    /* heartbeats during a long call leave by the loop thread's sockets: a
     * call from a shared-memory plane runs on that plane's thread, and its
     * calls are short (the long ones stay on ZeroMQ, mux_peer_set_shm) */
    w->shard.tick = mux_server_in_loop(w->srv) ? beat : NULL;
    w->shard.tick_ctx = w;
    /* the call's thread count: all the pool for a call this worker takes
     * alone, a share when the coordinator split it among workers on the
     * same cores (ExpertCall.threads); the pool is whole again after it,
     * for assignments' loading and reserving */
    const int cap = ecs_threadpool_capacity(w->tp);
    if (c->threads > (uint32_t)cap) {
        r->status = WIRE_ST_UNSUPPORTED;
        snprintf(r->message, sizeof r->message,
                 "%u threads asked for a call: this worker runs %d (--threads)", c->threads, cap);
        return;
    }
    ecs_threadpool_set_active(w->tp, c->threads ? (int)c->threads : cap); /* in range */
    shard_call(&w->shard, c, r);
    ecs_threadpool_set_active(w->tp, cap);
    /* the coordinator's messages were not read meanwhile: its silence is
     * counted only while this worker listens (each coordinator's) */
    const uint64_t spent = now_ns() - t0;
    for (int i = 0; i < w->n_co; i++)
        if (w->co[i].last_recv_ns)
            w->co[i].last_recv_ns += spent;
    /* the next call comes after the coordinator's attention at the earliest:
     * a spinning pool would take the core the coordinator needs for it;
     * pinned beside it, the pool hands each core to its thread there */
    if (w->o.pin_threads && r->pool_own)
        ecs_threadpool_handoff(w->tp, r->pool_peer, r->pool_own);
    else
        ecs_threadpool_park(w->tp);
}

/* The data endpoint: --listen, else beside the first coordinator's ipc
 * control socket, else an ephemeral loopback port (a remote coordinator
 * needs --listen). */
static void pick_listen(worker_t *w)
{
    if (w->o.listen) {
        snprintf(w->listen, sizeof w->listen, "%s", w->o.listen);
        return;
    }
    const char *c = w->co[0].addr;
    const char *slash = strrchr(c, '/');
    if (!strncmp(c, "ipc://", 6) && slash && slash > c + 6)
        snprintf(w->listen, sizeof w->listen, "%.*s/%s-%d.data", (int)(slash - c), c, w->id,
                 (int)getpid());
    else
        snprintf(w->listen, sizeof w->listen, "tcp://127.0.0.1:*");
}

ecs_err_t worker_new(const worker_opts_t *o, worker_t **out)
{
    *out = NULL;
    const int n_co = (o->coordinator ? 1 : 0) + (o->n_coordinators > 0 ? o->n_coordinators : 0);
    if (!o->model || n_co < 1)
        return ecs_error(ECS_ERR_INVAL, "worker: a model and a coordinator address are needed");
    if (n_co > WORKER_MAX_COORDINATORS)
        return ecs_error(ECS_ERR_RANGE, "worker: %d coordinators (at most %d)", n_co,
                         WORKER_MAX_COORDINATORS);
    if (o->threads < 1 || o->threads > 1024)
        return ecs_error(ECS_ERR_RANGE, "worker: --threads %d (1 to 1024)", o->threads);
    worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return ecs_error(ECS_ERR_NOMEM, "worker: out of memory");
    w->o = *o;
    if (o->coordinator)
        w->co[w->n_co++].addr = o->coordinator;
    for (int i = 0; i < o->n_coordinators; i++)
        w->co[w->n_co++].addr = o->coordinators[i];
    for (int i = 0; i < w->n_co; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(w->co[i].addr, w->co[j].addr)) {
                ecs_err_t e = ecs_error(ECS_ERR_INVAL, "worker: coordinator %s given twice",
                                        w->co[i].addr);
                free(w);
                return e;
            }
    if (gethostname(w->host, sizeof w->host) != 0)
        snprintf(w->host, sizeof w->host, "localhost");
    w->host[sizeof w->host - 1] = 0;
    if (o->id)
        snprintf(w->id, sizeof w->id, "%s", o->id);
    else
        snprintf(w->id, sizeof w->id, "%.40s-%d", w->host, (int)getpid());
    snprintf(w->device, sizeof w->device, "%s", o->device ? o->device : "cpu");
    pick_listen(w);
    ecs_err_t rc;
    if ((rc = gguf_open(o->model, &w->f)) != ECS_OK || (rc = arch_read_hparams(w->f, &w->hp)) ||
        (rc = shard_open(&w->shard, w->f, &w->hp)) != ECS_OK)
        goto fail;
    if (strcmp(w->device, "cpu")) {
        if ((rc = shard_dev_open(w->device, o->vram_budget, w->hp.n_expert, &w->dev)) != ECS_OK)
            goto fail;
        w->shard.dev = w->dev;
        logf_(w, false, "device %s: %s, VRAM budget %.1f MiB", w->device,
              shard_dev_name(w->dev), shard_dev_budget(w->dev) / 1048576.0);
    }
    gguf_fingerprint(w->f, w->fp);
    if ((rc = ecs_threadpool_create(o->threads, &w->tp)) != ECS_OK)
        goto fail;
    if (o->pin_threads && (rc = ecs_threadpool_pin(w->tp)) != ECS_OK) {
        rc = ecs_error(rc, "worker: --pin-threads: %s", ecs_errmsg());
        goto fail;
    }
    if (o->curve_key && !o->curve_server_key) {
        rc = ecs_error(ECS_ERR_INVAL, "worker: --curve-key needs --curve-server-key (the "
                       "coordinator's public key)");
        goto fail;
    }
    if ((rc = mux_curve_load(&w->keys, o->curve_key, o->curve_server_key, o->curve_clients,
                             false)) != ECS_OK) {
        rc = ecs_error(rc, "worker: %s", ecs_errmsg());
        goto fail;
    }
    mux_server_opts_t so = {.data_bind = w->listen, .tick_ms = WORKER_TICK_MS,
                            .curve = mux_curve_view(&w->keys), .shm_no_spin = o->pin_threads};
    mux_server_ops_t ops = {.on_call = on_call, .on_ctrl = on_ctrl, .on_tick = on_tick};
    if ((rc = mux_server_new(&so, &ops, w, &w->srv)) != ECS_OK)
        goto fail;
    snprintf(w->listen, sizeof w->listen, "%s", mux_server_endpoint(w->srv));
    for (int i = 0; i < w->n_co; i++)
        if ((rc = mux_server_connect(w->srv, w->co[i].addr, &w->co[i].conn)) != ECS_OK)
            goto fail;
    *out = w;
    return ECS_OK;
fail:
    worker_free(w);
    return rc;
}

ecs_err_t worker_run(worker_t *w)
{
    char fp[2 * GGUF_FINGERPRINT_BYTES + 1];
    ecs_hex(w->fp, 8, fp);
    for (int i = 0; i < w->n_co; i++) {
        logf_(w, false, "model %s (fingerprint %s...), %d threads, data on %s, registering with %s",
              w->o.model, fp, w->o.threads, w->listen, w->co[i].addr);
        send_hello(w, &w->co[i]);
    }
    ecs_err_t rc = mux_server_run(w->srv);
    if (w->dev)
        log_cache(w);
    if (rc != ECS_OK)
        return rc;
    if (w->fatal != ECS_OK)
        return ecs_error(w->fatal, "%s", w->fatal_msg);
    return ECS_OK;
}

void worker_stop(worker_t *w)
{
    if (w && w->srv)
        mux_server_stop(w->srv);
}

void worker_free(worker_t *w)
{
    if (!w)
        return;
    mux_server_free(w->srv);
    shard_dev_close(w->dev); /* before the shard: its callbacks read it */
    mux_curve_keys_free(&w->keys);
    shard_close(&w->shard);
    ecs_threadpool_destroy(w->tp);
    gguf_close(w->f);
    free(w);
}
