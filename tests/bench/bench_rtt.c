/* bench_rtt.c - round trip of one ExpertCall with an empty computation
 * through the transport (mux -> mux_server -> mux), next to a raw libzmq
 * DEALER/ROUTER ping-pong of the same payload sizes, over ipc and tcp.
 * Each server runs in its own process (forked before any ZeroMQ context
 * exists); the client measures one call at a time, so this is latency, not
 * throughput. Prints median and p99 per size, and mux/raw of the medians.
 * The third block ("curve") runs the mux over tcp with CURVE on both ends
 * against the same plaintext raw ping-pong: mux/raw there is CURVE's cost.
 * The fourth ("shm") runs the mux over ipc with the same-host shared-memory
 * plane (proto/dplane: calls and results in rings, futex wake-ups) against
 * the ipc raw ping-pong.
 *
 * The raw and the mux round trips alternate call by call (one of each per
 * iteration), so that a change of load on a shared host weighs on both.
 *
 * usage: bench_rtt [--quick] [--iters N] [--only ipc,tcp,curve,shm] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/dplane/dplane.h"
#include "proto/mux.h"

#define EMBD 2048
#define MAX_ROWS 64

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- the servers (child processes) ---- */

static mux_server_t *g_srv;
static curve_keypair_t g_skp, g_ckp; /* the worker's and the coordinator's, made in main */
static bool g_curve;                 /* the next mux server speaks CURVE */
static const char *g_shm;            /* the next mux server attaches this segment */
static void on_term(int sig)
{
    (void)sig;
    if (g_srv)
        mux_server_stop(g_srv);
}

/* The empty computation: the reply's rows are left as allocated. */
static void on_call(void *ctx, const wire_call_t *c, mux_reply_t *r)
{
    (void)ctx;
    (void)c;
    (void)r;
}

static void serve_mux(const char *bind, int wfd)
{
    const char *allowed[1] = {g_ckp.pub};
    mux_server_opts_t o = {.data_bind = bind};
    if (g_curve)
        o.curve = (mux_curve_t){.key = &g_skp, .allowed = allowed, .n_allowed = 1};
    mux_server_ops_t ops = {.on_call = on_call};
    if (mux_server_new(&o, &ops, NULL, &g_srv) != ECS_OK) {
        fprintf(stderr, "mux server: %s\n", ecs_errmsg());
        _exit(1);
    }
    int conn;
    /* a plane belongs to a coordinator connection: one that never answers */
    if (g_shm && (mux_server_connect(g_srv, "ipc:///tmp/ecs-bench-rtt-nobody", &conn) ||
                  mux_server_attach_shm(g_srv, conn, g_shm))) {
        fprintf(stderr, "mux server: %s\n", ecs_errmsg());
        _exit(1);
    }
    char ep[256];
    snprintf(ep, sizeof ep, "%s", mux_server_endpoint(g_srv));
    if (write(wfd, ep, sizeof ep) != (ssize_t)sizeof ep)
        _exit(1);
    signal(SIGTERM, on_term);
    mux_server_run(g_srv);
    mux_server_free(g_srv);
    _exit(0);
}

/* Echoes every message back to its sender (the frames are moved, not
 * copied: the best case libzmq allows). Ends by SIGTERM's default action. */
static void serve_raw(const char *bind, int wfd)
{
    void *ctx = zmq_ctx_new(), *r = zmq_socket(ctx, ZMQ_ROUTER);
    if (zmq_bind(r, bind) != 0)
        _exit(1);
    char ep[256];
    size_t len = sizeof ep;
    zmq_getsockopt(r, ZMQ_LAST_ENDPOINT, ep, &len);
    if (write(wfd, ep, sizeof ep) != (ssize_t)sizeof ep)
        _exit(1);
    for (;;) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, r, 0) < 0 || zmq_msg_recv(&body, r, 0) < 0) {
            zmq_msg_close(&id);
            zmq_msg_close(&body);
            continue;
        }
        zmq_msg_send(&id, r, ZMQ_SNDMORE);
        zmq_msg_send(&body, r, 0);
    }
}

static pid_t spawn(void (*serve)(const char *, int), const char *bind, char *ep)
{
    int p[2];
    if (pipe(p))
        exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        serve(bind, p[1]);
    }
    close(p[1]);
    if (pid < 0 || read(p[0], ep, 256) != 256) {
        fprintf(stderr, "server for %s did not start\n", bind);
        exit(1);
    }
    close(p[0]);
    return pid;
}

static void reap(pid_t pid, const char *ep)
{
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    if (!strncmp(ep, "ipc://", 6))
        unlink(ep + 6); /* a killed binder leaves its socket file */
}

/* ---- the client ---- */

typedef struct {
    uint64_t med, p99;
} stat_t;

static stat_t summarize(uint64_t *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_u64);
    return (stat_t){t[n / 2], t[(int)((double)n * 0.99)]};
}

/* One raw round trip (payload echoed by serve_raw); ns. */
static uint64_t raw_once(void *dealer, const float *x, size_t bytes)
{
    const uint64_t t0 = now_ns();
    zmq_send(dealer, x, bytes, 0);
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, dealer, 0);
    if (zmq_msg_size(&m) != bytes)
        fprintf(stderr, "raw: short echo\n");
    zmq_msg_close(&m);
    return now_ns() - t0;
}

/* One ExpertCall of `rows` rows through the mux; ns. */
static uint64_t mux_once(mux_t *m, int peer, const float *x, int rows)
{
    uint32_t expert = 5, count = (uint32_t)rows, idx[MAX_ROWS], slot[MAX_ROWS];
    for (int i = 0; i < rows; i++) {
        idx[i] = (uint32_t)i;
        slot[i] = 0;
    }
    wire_call_t c = {.layer = 1, .n_rows = (uint32_t)rows, .n_embd = EMBD,
                     .dtype = ECS_TYPE_F32, .k = 1, .n_experts = 1, .experts = &expert,
                     .expert_counts = &count, .n_entries = (size_t)rows, .row_index = idx,
                     .slot = slot, .result_dtype = ECS_TYPE_F32, .payload = x,
                     .payload_bytes = (size_t)rows * EMBD * sizeof(float)};
    const uint64_t t0 = now_ns();
    mux_call_t *call;
    if (mux_submit(m, peer, &c, &call) != ECS_OK) {
        fprintf(stderr, "submit: %s\n", ecs_errmsg());
        exit(1);
    }
    if (mux_wait(m, &call, 1, 10000) != 0 || mux_call_result(call)->err != ECS_OK ||
        mux_call_result(call)->status != WIRE_ST_OK) {
        fprintf(stderr, "call failed\n");
        exit(1);
    }
    mux_call_release(call);
    return now_ns() - t0;
}

/* raw and mux round trips alternating, one of each per iteration (a
 * change of load on the shared host hits both alike); tr[0..n) raw,
 * tq[0..n) mux. */
static void run_pair(void *dealer, mux_t *m, int peer, const float *x, int rows, int iters,
                     uint64_t *tr, uint64_t *tq, stat_t *r, stat_t *q)
{
    const size_t bytes = (size_t)rows * EMBD * sizeof(float);
    for (int i = -iters / 10; i < iters; i++) { /* the first tenth warms up */
        const uint64_t a = raw_once(dealer, x, bytes), b = mux_once(m, peer, x, rows);
        if (i >= 0) {
            tr[i] = a;
            tq[i] = b;
        }
    }
    *r = summarize(tr, iters);
    *q = summarize(tq, iters);
}

int main(int argc, char **argv)
{
    int iters = 2000;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            iters = 200;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
    }
    if (iters < 10)
        iters = 10;
    float *x = aligned_alloc(64, (size_t)MAX_ROWS * EMBD * sizeof(float));
    uint64_t *t = malloc((size_t)iters * sizeof *t), *t2 = malloc((size_t)iters * sizeof *t2);
    if (!x || !t || !t2)
        return 1;
    for (int i = 0; i < MAX_ROWS * EMBD; i++)
        x[i] = (float)i;
    char load[64] = "?";
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (!fgets(load, sizeof load, lf))
            snprintf(load, sizeof load, "?");
        fclose(lf);
        load[strcspn(load, "\n")] = '\0';
    }
    printf("round trip of one call, %d values per row, %d calls per size (one at a time); "
           "load average %s\n", EMBD, iters, load);
    printf("%-4s %5s %9s %10s %10s %10s %10s %7s\n", "", "rows", "bytes", "raw med", "raw p99",
           "mux med", "mux p99", "mux/raw");
    const char *tr[4] = {"ipc", "tcp", "curve", "shm"};
    if (zmq_curve_keypair(g_skp.pub, g_skp.sec) || zmq_curve_keypair(g_ckp.pub, g_ckp.sec))
        return 1;
    for (int k = 0; k < 4; k++) {
        if (only && !strstr(only, tr[k]))
            continue;
        g_curve = k == 2;
        char bind_raw[128], bind_mux[128], ep_raw[256], ep_mux[256];
        dplane_shm_t *seg = NULL;
        if (k == 3) { /* made before the fork: the server attaches it by name */
            if (dplane_shm_create((size_t)8 << 20, &seg) != ECS_OK) {
                fprintf(stderr, "shm: %s\n", ecs_errmsg());
                return 1;
            }
            g_shm = dplane_shm_name(seg);
        }
        if (k == 0 || k == 3) {
            snprintf(bind_raw, sizeof bind_raw, "ipc:///tmp/ecs-bench-rtt-%d-raw", (int)getpid());
            snprintf(bind_mux, sizeof bind_mux, "ipc:///tmp/ecs-bench-rtt-%d-mux", (int)getpid());
        } else {
            snprintf(bind_raw, sizeof bind_raw, "tcp://127.0.0.1:*");
            snprintf(bind_mux, sizeof bind_mux, "tcp://127.0.0.1:*");
        }
        pid_t praw = spawn(serve_raw, bind_raw, ep_raw); /* plaintext in every block */
        pid_t pmux = spawn(serve_mux, bind_mux, ep_mux);
        void *zctx = zmq_ctx_new(), *dealer = zmq_socket(zctx, ZMQ_DEALER);
        const int zero = 0;
        zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
        mux_t *m;
        int peer;
        mux_opts_t mo = {.curve = {.key = g_curve ? &g_ckp : NULL}};
        if (zmq_connect(dealer, ep_raw) || mux_new(&mo, &m) ||
            mux_peer_connect_key(m, ep_mux, g_skp.pub, &peer)) {
            fprintf(stderr, "connect: %s\n", ecs_errmsg());
            return 1;
        }
        if (seg) {
            for (int i = 0; i < 500 && !dplane_shm_attached(seg); i++)
                usleep(10000);
            if (!dplane_shm_attached(seg) || mux_peer_set_shm(m, peer, seg) != ECS_OK) {
                fprintf(stderr, "shm: the server did not attach\n");
                return 1;
            }
            g_shm = NULL;
        }
        for (int rows = 1; rows <= MAX_ROWS; rows *= 2) {
            const int n = rows >= 16 ? iters / 4 : iters;
            stat_t r, q;
            run_pair(dealer, m, peer, x, rows, n, t, t2, &r, &q);
            printf("%-4s %5d %9zu %8.1fus %8.1fus %8.1fus %8.1fus %7.2f\n", tr[k], rows,
                   (size_t)rows * EMBD * sizeof(float), r.med / 1e3, r.p99 / 1e3, q.med / 1e3,
                   q.p99 / 1e3, (double)q.med / (double)r.med);
            fflush(stdout);
        }
        mux_free(m);
        zmq_close(dealer);
        zmq_ctx_term(zctx);
        reap(praw, ep_raw);
        reap(pmux, ep_mux);
    }
    free(x);
    free(t);
    free(t2);
    return 0;
}
