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
 * coordinator's reason; any other Error is logged and serving goes on. */
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

struct worker {
    worker_opts_t o;
    char id[64], host[64], device[32], listen[512];
    gguf_file_t *f;
    arch_hparams_t hp;
    uint8_t fp[GGUF_FINGERPRINT_BYTES];
    ecs_threadpool_t *tp;
    mux_server_t *srv;
    int conn;
    shard_t shard;
    bool welcomed;
    uint32_t heartbeat_ms;
    uint64_t hb_seq, last_sent_ns, last_recv_ns;
    uint64_t hello_gap_ms;
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
    va_start(ap, fmt);
    fprintf(stderr, "ecs-worker %s: ", w->id);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static ecs_err_t send_msg(worker_t *w, const wire_msg_t *m)
{
    ecs_err_t rc = mux_server_send(w->srv, w->conn, m);
    if (rc != ECS_OK)
        logf_(w, true, "cannot send %s: %s", wire_kind_name(m->kind), ecs_errmsg());
    else
        w->last_sent_ns = now_ns();
    return rc;
}

static void send_hello(worker_t *w)
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
                              .capabilities = WIRE_CAP_INPUT_Q8 | WIRE_CAP_RESULT_BF16,
                              .data_endpoint = w->listen}};
    send_msg(w, &m);
    w->hello_gap_ms = w->hello_gap_ms ? w->hello_gap_ms * 2 : WORKER_HELLO_MS;
    if (w->hello_gap_ms > WORKER_HELLO_MAX_MS)
        w->hello_gap_ms = WORKER_HELLO_MAX_MS;
}

static void send_error(worker_t *w, wire_status_t code, wire_kind_t about, const char *msg)
{
    wire_msg_t m = {.kind = WIRE_ERROR, .error = {.code = code, .message = msg, .about = about}};
    send_msg(w, &m);
}

static void on_assign(worker_t *w, const wire_assign_t *a)
{
    uint64_t bytes = 0, load_ns = 0;
    ecs_err_t rc = shard_assign(&w->shard, a, w->o.mem_budget, w->tp, w->o.repack_dir, &bytes,
                                &load_ns);
    if (rc != ECS_OK) {
        logf_(w, true, "refusing assignment %llu: %s", (unsigned long long)a->generation,
              ecs_errmsg());
        send_error(w, rc == ECS_ERR_NOMEM ? WIRE_ST_OVER_BUDGET : WIRE_ST_BAD_MESSAGE,
                   WIRE_ASSIGN, ecs_errmsg());
        return;
    }
    logf_(w, false, "holds %zu experts (%.1f MiB), loaded in %.0f ms", a->n, bytes / 1048576.0,
          load_ns / 1e6);
    wire_msg_t m = {.kind = WIRE_READY,
                    .ready = {.generation = a->generation, .bytes_mapped = bytes,
                              .load_ns = load_ns}};
    send_msg(w, &m);
}

static void on_ctrl(void *ctx, int conn, const wire_msg_t *m)
{
    worker_t *w = ctx;
    (void)conn;
    w->last_recv_ns = now_ns(); /* any message is a sign of life */
    switch (m->kind) {
    case WIRE_WELCOME:
        w->welcomed = true;
        w->hello_gap_ms = 0;
        w->heartbeat_ms = m->welcome.heartbeat_ms;
        logf_(w, false, "registered with %s (protocol %u)", m->welcome.coordinator_id,
              m->welcome.version);
        break;
    case WIRE_ASSIGN:
        on_assign(w, &m->assign);
        w->last_recv_ns = now_ns(); /* nothing was read while loading */
        break;
    case WIRE_ERROR:
        if (m->error.code == WIRE_ST_FINGERPRINT || m->error.code == WIRE_ST_VERSION) {
            w->fatal = m->error.code == WIRE_ST_VERSION ? ECS_ERR_UNSUPPORTED : ECS_ERR_INVAL;
            snprintf(w->fatal_msg, sizeof w->fatal_msg, "the coordinator refused this worker: %s",
                     m->error.message);
            mux_server_stop(w->srv);
        } else {
            logf_(w, true, "coordinator says %s: %s", wire_status_name(m->error.code),
                  m->error.message);
        }
        break;
    case WIRE_DRAIN:
        logf_(w, false, "drained (%s): stopping", m->drain.reason);
        mux_server_stop(w->srv);
        break;
    default:
        break; /* heartbeats: any message is a sign of life */
    }
}

static void on_tick(void *ctx)
{
    worker_t *w = ctx;
    const uint64_t t = now_ns();
    if (w->welcomed && w->heartbeat_ms &&
        t - w->last_recv_ns > (uint64_t)w->heartbeat_ms * WIRE_LIVENESS * 1000000u) {
        logf_(w, true, "the coordinator has been silent for %llu ms: registering again",
              (unsigned long long)((t - w->last_recv_ns) / 1000000u));
        w->welcomed = false;
        w->hello_gap_ms = 0;
        send_hello(w);
        return;
    }
    if (!w->welcomed) {
        if (t - w->last_sent_ns >= w->hello_gap_ms * 1000000u)
            send_hello(w);
        return;
    }
    if (w->heartbeat_ms && t - w->last_sent_ns >= (uint64_t)w->heartbeat_ms * 1000000u) {
        wire_msg_t m = {.kind = WIRE_HEARTBEAT, .heartbeat = {.seq = ++w->hb_seq, .time_ns = t}};
        send_msg(w, &m);
    }
}

/* Between a call's regions (shard.c): the heartbeat, if one is due, so
 * that a long call does not look like a hung worker. Only heartbeats: the
 * control messages wait for the serve loop. */
static void beat(void *ctx)
{
    worker_t *w = ctx;
    const uint64_t t = now_ns();
    if (w->welcomed && w->heartbeat_ms &&
        t - w->last_sent_ns >= (uint64_t)w->heartbeat_ms * 1000000u) {
        wire_msg_t m = {.kind = WIRE_HEARTBEAT, .heartbeat = {.seq = ++w->hb_seq, .time_ns = t}};
        send_msg(w, &m);
    }
}

static void on_call(void *ctx, const wire_call_t *c, mux_reply_t *r)
{
    worker_t *w = ctx;
    const uint64_t t0 = now_ns();
    w->shard.tick = beat;
    w->shard.tick_ctx = w;
    shard_call(&w->shard, c, r);
    /* the coordinator's messages were not read meanwhile: its silence is
     * counted only while this worker listens */
    if (w->last_recv_ns)
        w->last_recv_ns += now_ns() - t0;
    /* the next call comes after the coordinator's attention at the earliest:
     * a spinning pool would take the core the coordinator needs for it */
    ecs_threadpool_park(w->tp);
}

/* The data endpoint: --listen, else beside an ipc control socket, else
 * an ephemeral loopback port (a remote coordinator needs --listen). */
static void pick_listen(worker_t *w)
{
    if (w->o.listen) {
        snprintf(w->listen, sizeof w->listen, "%s", w->o.listen);
        return;
    }
    const char *c = w->o.coordinator;
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
    if (!o->model || !o->coordinator)
        return ecs_error(ECS_ERR_INVAL, "worker: a model and a coordinator address are needed");
    if (o->threads < 1 || o->threads > 1024)
        return ecs_error(ECS_ERR_RANGE, "worker: --threads %d (1 to 1024)", o->threads);
    if (o->device && strcmp(o->device, "cpu"))
        return ecs_error(ECS_ERR_UNSUPPORTED,
                         "worker: --device %s: this build runs experts on the CPU only "
                         "(use --device cpu)", o->device);
    worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return ecs_error(ECS_ERR_NOMEM, "worker: out of memory");
    w->o = *o;
    if (gethostname(w->host, sizeof w->host) != 0)
        snprintf(w->host, sizeof w->host, "localhost");
    w->host[sizeof w->host - 1] = 0;
    if (o->id)
        snprintf(w->id, sizeof w->id, "%s", o->id);
    else
        snprintf(w->id, sizeof w->id, "%.40s-%d", w->host, (int)getpid());
    snprintf(w->device, sizeof w->device, "cpu");
    pick_listen(w);
    ecs_err_t rc;
    if ((rc = gguf_open(o->model, &w->f)) != ECS_OK || (rc = arch_read_hparams(w->f, &w->hp)) ||
        (rc = shard_open(&w->shard, w->f, &w->hp)) != ECS_OK)
        goto fail;
    gguf_fingerprint(w->f, w->fp);
    if ((rc = ecs_threadpool_create(o->threads, &w->tp)) != ECS_OK)
        goto fail;
    mux_server_opts_t so = {.data_bind = w->listen, .tick_ms = WORKER_TICK_MS};
    mux_server_ops_t ops = {.on_call = on_call, .on_ctrl = on_ctrl, .on_tick = on_tick};
    if ((rc = mux_server_new(&so, &ops, w, &w->srv)) != ECS_OK)
        goto fail;
    snprintf(w->listen, sizeof w->listen, "%s", mux_server_endpoint(w->srv));
    if ((rc = mux_server_connect(w->srv, o->coordinator, &w->conn)) != ECS_OK)
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
    logf_(w, false, "model %s (fingerprint %s...), %d threads, data on %s, registering with %s",
          w->o.model, fp, w->o.threads, w->listen, w->o.coordinator);
    send_hello(w);
    ecs_err_t rc = mux_server_run(w->srv);
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
    shard_close(&w->shard);
    ecs_threadpool_destroy(w->tp);
    gguf_close(w->f);
    free(w);
}
