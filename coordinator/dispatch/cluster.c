/* cluster.c - bringing up the expert workers: spawning local ones,
 * registration (version, fingerprint, unique id), placement, assignment.
 *
 * Registration runs on the thread that calls dispatch_start(); after it
 * the control thread (supervise.c) is the only reader of control messages
 * and the only one that spawns or reaps workers. A spawned worker that
 * exits before the first start-up is done fails the start at once, with
 * its exit status, instead of waiting out the timeout. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/hash.h"
#include "coordinator/dispatch/dispatch_int.h"
#include "proto/dplane/dplane.h"

uint64_t dispatch_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#define now_ms dispatch_now_ms
#define logmsg dispatch_log

void dispatch_log(const dispatch_t *d, const char *fmt, ...)
{
    if (d->o.quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    ecs_logv("dispatch: ", fmt, ap);
    va_end(ap);
}

/* ecs-worker beside the running program, unless given. */
static ecs_err_t worker_path(const dispatch_t *d, char *out, size_t cap)
{
    if (d->o.worker_bin) {
        snprintf(out, cap, "%s", d->o.worker_bin);
        return ECS_OK;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return ecs_error(ECS_ERR_IO, "dispatch: cannot find this program's path: %s",
                         strerror(errno));
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    if ((size_t)snprintf(out, cap, "%.*s/ecs-worker", (int)(cap - 16), self) >= cap)
        return ecs_error(ECS_ERR_RANGE, "dispatch: path too long");
    if (access(out, X_OK) != 0)
        return ecs_error(ECS_ERR_NOTFOUND, "dispatch: no ecs-worker beside this program (%s)",
                         out);
    return ECS_OK;
}

/* Spawned workers share this host's cores. Without --worker-threads each
 * runs a pool of all of them and every call says how many to use
 * (ExpertCall.threads, dispatch.c): all for a call that is the only one
 * out (a decode call sent to one replica), the share
 * (dispatch_share_threads) when calls to several are out at once (a
 * prompt's), so that they never oversubscribe the cores. */
static int spawn_threads(const dispatch_t *d)
{
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (d->o.worker_threads > 0)
        return d->o.worker_threads;
    return cores > 0 ? (int)cores : 1;
}

int dispatch_share_threads(const dispatch_t *d)
{
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int n = d->o.spawn_workers;
    if (d->o.worker_threads > 0 || n < 1)
        return 0;
    return cores / n > 0 ? (int)(cores / n) : 1;
}

/* --pin-threads: auto pins when one spawned worker's pool and this one
 * each span exactly the CPUs this process may use, over a plane that can
 * be shared memory (the hand-offs go through its words): then the two
 * processes take turns on the same cores and thread i of each can live on
 * CPU i. A decode call handed over that way costs ~0.1 ms less a layer
 * here (docs/benchmarks.md, session 35). Not with several workers: a
 * prompt's calls run on all of them at once, each on its share of the
 * threads, and pinned their calling threads would all share the first CPU
 * (pp512 with 2 workers fell from 0.82 to 0.57 of one process). */
static ecs_err_t pin_threads(dispatch_t *d)
{
    ecs_threadpool_t *tp = model_threadpool(d->m);
    cpu_set_t set;
    const int cpus = sched_getaffinity(0, sizeof set, &set) ? 0 : CPU_COUNT(&set);
    const bool fits = d->o.spawn_workers == 1 && !d->o.worker_threads &&
                      spawn_threads(d) == cpus && ecs_threadpool_capacity(tp) == cpus &&
                      dispatch_plane_of(&d->o) != 1;
    if (d->o.pin_threads == 1 || (d->o.pin_threads == 0 && !fits))
        return ECS_OK;
    if (ecs_threadpool_pin(tp) != ECS_OK)
        return ecs_error(ECS_ERR_INVAL, "dispatch: --pin-threads: %s", ecs_errmsg());
    d->pinned = true;
    d->allowed = set;
    logmsg(d, "threads pinned: thread i of this process and of each spawned worker on CPU i");
    return ECS_OK;
}

/* Starts spawned worker i (id w<i>). */
ecs_err_t dispatch_spawn_one(dispatch_t *d, int i)
{
    const char *bin = d->bin, *model = gguf_path(model_gguf(d->m));
    char id[16], th[16];
    snprintf(id, sizeof id, "w%d", i);
    snprintf(th, sizeof th, "%d", spawn_threads(d));
    const char *argv[24] = {bin, "-m", model, "--coordinator", mux_control_endpoint(d->mux),
                            "--id", id, "--threads", th};
    int a = 9;
    if (d->o.curve_key) { /* a child on this host shares the coordinator's key pair */
        argv[a++] = "--curve-key";
        argv[a++] = d->o.curve_key;
        argv[a++] = "--curve-server-key";
        argv[a++] = d->o.curve_key;
    }
    if (d->o.worker_budget) {
        argv[a++] = "--mem-budget";
        argv[a++] = d->o.worker_budget;
    }
    if (d->o.worker_repack && !d->o.worker_repack[0]) {
        argv[a++] = "--no-repack";
    } else if (d->o.worker_repack) {
        argv[a++] = "--repack";
        argv[a++] = d->o.worker_repack;
    }
    if (d->o.quiet)
        argv[a++] = "-q";
    if (d->pinned)
        argv[a++] = "--pin-threads";
    argv[a] = NULL;
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return ecs_error(ECS_ERR_IO, "dispatch: fork: %s", strerror(errno));
    if (pid == 0) {
        /* the worker goes when this process goes, however it goes; and in
         * a process group of its own, so a terminal's Ctrl-C reaches only
         * the coordinator, which drains and then stops its workers (the
         * group's SIGINT killed them mid-drain, and the supervisor set out
         * to restart them) */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        setpgid(0, 0);
        if (d->pinned) /* not the forking thread's one CPU: the worker pins its own */
            sched_setaffinity(0, sizeof d->allowed, &d->allowed);
        if (getppid() != parent)
            _exit(127);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    dispatch_child_t *c = &d->children[i];
    c->pid = pid;
    c->started_ms = now_ms();
    c->ready = false;
    return ECS_OK;
}

static ecs_err_t spawn(dispatch_t *d)
{
    const int n = d->o.spawn_workers;
    d->children = calloc((size_t)n, sizeof *d->children);
    if (!d->children)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
    for (int i = 0; i < n; i++) {
        d->children[i].backoff_ms = DISPATCH_RESTART_MIN_MS;
        ecs_err_t rc = dispatch_spawn_one(d, i);
        if (rc != ECS_OK)
            return rc;
        d->n_spawned++;
    }
    logmsg(d, "started %d workers (%s, %d threads each, %d for a call split among them)", n,
           d->bin, spawn_threads(d), dispatch_share_threads(d) ? dispatch_share_threads(d)
                                                                : spawn_threads(d));
    return ECS_OK;
}

static void stop_spawned(dispatch_t *d)
{
    for (int i = 0; i < d->n_spawned; i++)
        if (d->children[i].pid > 0) {
            kill(d->children[i].pid, SIGTERM);
            kill(d->children[i].pid, SIGCONT); /* a stopped one too */
        }
    const uint64_t deadline = now_ms() + 5000;
    for (int i = 0; i < d->n_spawned; i++) {
        pid_t *pid = &d->children[i].pid;
        while (*pid > 0) {
            pid_t r = waitpid(*pid, NULL, WNOHANG);
            if (r == *pid || (r < 0 && errno != EINTR)) {
                *pid = 0;
                break;
            }
            if (now_ms() > deadline) {
                kill(*pid, SIGKILL);
                waitpid(*pid, NULL, 0);
                *pid = 0;
                break;
            }
            usleep(10000);
        }
    }
}

/* A spawned worker that already exited: its description, for the error. */
static bool spawned_died(dispatch_t *d, char *why, size_t cap)
{
    for (int i = 0; i < d->n_spawned; i++) {
        int st;
        const pid_t pid = d->children[i].pid;
        if (pid > 0 && waitpid(pid, &st, WNOHANG) == pid) {
            if (WIFEXITED(st))
                snprintf(why, cap, "worker w%d (pid %d) exited with status %d at start", i,
                         (int)pid, WEXITSTATUS(st));
            else
                snprintf(why, cap, "worker w%d (pid %d) was killed by signal %d at start", i,
                         (int)pid, WTERMSIG(st));
            d->children[i].pid = 0;
            return true;
        }
    }
    return false;
}

static void send_error(dispatch_t *d, const mux_route_t *to, wire_status_t code,
                       wire_kind_t about, const char *msg)
{
    wire_msg_t m = {.kind = WIRE_ERROR, .error = {.code = code, .message = msg, .about = about}};
    mux_ctrl_send(d->mux, to, &m);
}

int dispatch_find_worker(const dispatch_t *d, const char *id)
{
    for (int i = 0; i < d->n_workers; i++)
        if (!strcmp(d->w[i].id, id))
            return i;
    return -1;
}

static void offer_shm(dispatch_t *d, dispatch_worker_t *w, const wire_hello_t *h,
                      wire_welcome_t *wel);

int dispatch_on_hello(dispatch_t *d, const mux_route_t *from, const wire_hello_t *h, int cap,
                      bool *renewed)
{
    *renewed = false;
    char msg[512];
    const uint32_t v = wire_negotiate(h->min_version, h->max_version, WIRE_VERSION_MIN,
                                      WIRE_VERSION);
    if (!v) {
        snprintf(msg, sizeof msg, "worker %s speaks protocol %u-%u, this coordinator %u-%u",
                 h->worker_id, h->min_version, h->max_version, WIRE_VERSION_MIN, WIRE_VERSION);
        send_error(d, from, WIRE_ST_VERSION, WIRE_HELLO, msg);
        logmsg(d, "refused: %s", msg);
        return -1;
    }
    if (h->fingerprint_len != sizeof d->fp || memcmp(h->fingerprint, d->fp, sizeof d->fp)) {
        char mine[17], theirs[17] = "?";
        ecs_hex(d->fp, 8, mine);
        if (h->fingerprint_len >= 8)
            ecs_hex(h->fingerprint, 8, theirs);
        snprintf(msg, sizeof msg, "worker %s holds another model (fingerprint %s...) than this "
                 "coordinator (%s...)", h->worker_id, theirs, mine);
        send_error(d, from, WIRE_ST_FINGERPRINT, WIRE_HELLO, msg);
        logmsg(d, "refused: %s", msg);
        return -1;
    }
    if (d->keys.on && (!h->curve_public || !h->curve_public[0])) {
        snprintf(msg, sizeof msg, "worker %s announced no CURVE key for its data socket, and "
                 "this coordinator's links use CURVE", h->worker_id);
        send_error(d, from, WIRE_ST_BAD_MESSAGE, WIRE_HELLO, msg);
        logmsg(d, "refused: %s", msg);
        return -1;
    }
    int wi = dispatch_find_worker(d, h->worker_id);
    if (wi < 0) {
        if (d->n_workers >= cap || strlen(h->worker_id) >= PLACEMENT_ID_MAX) {
            send_error(d, from, WIRE_ST_BAD_MESSAGE, WIRE_HELLO,
                       "no room for another worker (or its id is too long)");
            return -1;
        }
        wi = d->n_workers++;
        atomic_init(&d->w[wi].peer, -1);
        atomic_init(&d->w[wi].state, DW_LOADING);
        d->w[wi].child = -1;
        if (!strncmp(h->worker_id, "w", 1) && d->n_spawned)
            for (int i = 0; i < d->n_spawned; i++) {
                char cid[16];
                snprintf(cid, sizeof cid, "w%d", i);
                if (!strcmp(cid, h->worker_id))
                    d->w[wi].child = i;
            }
    } else if (d->w[wi].pid != (int)h->pid) {
        /* the same id from another process: a restart (the newer one wins) */
        logmsg(d, "worker %s registered again (pid %d, was %d)", h->worker_id, (int)h->pid,
               d->w[wi].pid);
        *renewed = true;
    }
    dispatch_worker_t *w = &d->w[wi];
    if (!w->id[0]) /* the model thread reads it: written once */
        snprintf(w->id, sizeof w->id, "%s", h->worker_id);
    snprintf(w->endpoint, sizeof w->endpoint, "%s", h->data_endpoint);
    snprintf(w->curve_pub, sizeof w->curve_pub, "%s", h->curve_public ? h->curve_public : "");
    w->route = *from;
    w->pid = (int)h->pid;
    w->threads = (int)h->threads;
    w->mem_budget = h->mem_budget;
    atomic_store(&w->caps, h->capabilities);
    w->last_seen_ms = w->last_hb_ms = now_ms();
    wire_msg_t m = {.kind = WIRE_WELCOME,
                    .welcome = {.version = v, .coordinator_id = "ecs-coordinator",
                                .heartbeat_ms = DISPATCH_HEARTBEAT_MS}};
    offer_shm(d, w, h, &m.welcome);
    mux_ctrl_send(d->mux, from, &m);
    logmsg(d, "worker %s registered (pid %d, %d threads, data %s)", w->id, w->pid, w->threads,
           w->endpoint);
    return wi;
}

ecs_err_t dispatch_connect_peer(dispatch_t *d, int wi, int *peer)
{
    dispatch_worker_t *w = &d->w[wi];
    ecs_err_t rc = mux_peer_connect_key(d->mux, w->endpoint, w->curve_pub, peer);
    dplane_shm_t *seg = w->shm;
    w->shm = NULL;
    if (rc != ECS_OK) {
        dplane_shm_free(seg);
        return rc;
    }
    if (!seg)
        return ECS_OK;
    if (!dplane_shm_attached(seg)) { /* the worker could not open it: another host */
        if (dispatch_plane_of(&d->o) == 3)
            fprintf(stderr, "dispatch: worker %s did not attach its shared-memory plane: its "
                    "calls go on ZeroMQ\n", w->id);
        dplane_shm_free(seg);
        return ECS_OK;
    }
    if (mux_peer_set_shm(d->mux, *peer, seg) != ECS_OK) /* it took seg either way */
        fprintf(stderr, "dispatch: worker %s: %s\n", w->id, ecs_errmsg());
    return ECS_OK;
}

/* Heartbeats to the workers not heard from in an interval (any message
 * counts, both ways). */
void dispatch_heartbeat_all(dispatch_t *d, uint64_t now)
{
    for (int i = 0; i < d->n_workers; i++) {
        dispatch_worker_t *w = &d->w[i];
        if (atomic_load(&w->state) == DW_FAILED || now - w->last_hb_ms < DISPATCH_HEARTBEAT_MS)
            continue;
        wire_msg_t m = {.kind = WIRE_HEARTBEAT,
                        .heartbeat = {.seq = ++d->hb_seq, .time_ns = now * 1000000u}};
        mux_ctrl_send(d->mux, &w->route, &m);
        w->last_hb_ms = now;
    }
}

/* A worker on this host that offers it gets a shared-memory plane: the
 * segment is made now, named in Welcome and handed to the mux when the
 * data peer connects (dispatch_connect_peer) if the worker attached it. */
static void offer_shm(dispatch_t *d, dispatch_worker_t *w, const wire_hello_t *h,
                      wire_welcome_t *wel)
{
    dplane_shm_free(w->shm); /* an earlier Welcome's, never connected */
    w->shm = NULL;
    char host[256];
    const int mode = dispatch_plane_of(&d->o);
    if (mode < 2 || gethostname(host, sizeof host) != 0)
        return;
    host[sizeof host - 1] = 0;
    const bool same = h->host && !strcmp(h->host, host);
    if (dplane_choose_host(h->capabilities, WIRE_CAP_SHM, same) != WIRE_PLANE_SHM) {
        if (mode == 3)
            fprintf(stderr, "dispatch: worker %s %s: its calls go on ZeroMQ\n", h->worker_id,
                    same ? "offers no shared-memory plane" : "runs on another host");
        return;
    }
    const size_t ring = d->o.shm_ring_bytes ? d->o.shm_ring_bytes : DISPATCH_SHM_RING;
    if (dplane_shm_create(ring, &w->shm) != ECS_OK) {
        fprintf(stderr, "dispatch: worker %s: %s: its calls go on ZeroMQ\n", h->worker_id,
                ecs_errmsg());
        return;
    }
    if (d->pinned) /* the worker's thread on this CPU needs it: waiting here is sleeping */
        dplane_shm_spin(w->shm, 0);
    wel->data_plane = WIRE_PLANE_SHM;
    wel->shm_name = dplane_shm_name(w->shm);
}

static ecs_err_t wait_registrations(dispatch_t *d, int want, uint64_t deadline)
{
    char why[256];
    while (d->n_workers < want) {
        if (spawned_died(d, why, sizeof why))
            return ecs_error(ECS_ERR_IO, "dispatch: %s", why);
        if (now_ms() > deadline)
            return ecs_error(ECS_ERR_IO, "dispatch: %d of %d workers registered on %s in time",
                             d->n_workers, want, mux_control_endpoint(d->mux));
        mux_route_t from;
        wire_msg_t m;
        if (mux_ctrl_recv(d->mux, &from, &m, 100) != ECS_OK)
            continue;
        bool renewed;
        if (m.kind == WIRE_HELLO)
            dispatch_on_hello(d, &from, &m.hello, want, &renewed);
        dispatch_heartbeat_all(d, now_ms());
        wire_msg_clear(&m);
    }
    return ECS_OK;
}

static int by_id(const void *a, const void *b)
{
    return strcmp(((const dispatch_worker_t *)a)->id, ((const dispatch_worker_t *)b)->id);
}

/* Whether every registered worker is a process this one spawned (its id
 * and its pid), so on this host, mapping the same files. */
static bool all_spawned(const dispatch_t *d)
{
    for (int i = 0; i < d->n_workers; i++) {
        const int c = d->w[i].child;
        if (c < 0 || c >= d->n_spawned || d->children[c].pid != d->w[i].pid)
            return false;
    }
    return d->n_workers > 0;
}

/* --replication auto. Spawned workers map the GGUF (and, holding the same
 * experts, the same decode copy) from this host's page cache, so a replica
 * costs no memory and takes each expert's rows to its least busy holder:
 * 2 workers decoded the full ds2-lite at 0.87x/0.85x of one process
 * replicated against 0.82x/0.79x uniform (docs/benchmarks.md). Only their
 * declared --mem-budget can limit it. Workers started by hand may be on
 * other hosts (or in containers whose hostname says nothing about the
 * page cache): they keep 1, the memory an operator sized them for. */
static ecs_err_t auto_replication(dispatch_t *d, const dispatch_shape_t *s,
                                  const placement_worker_t *pw, int *repl)
{
    uint64_t budget[PLACEMENT_MAX_WORKERS], bytes[ARCH_MAX_LAYERS] = {0}, copy = 0, least = 0;
    for (int i = 0; i < d->n_workers; i++) {
        budget[i] = d->w[i].mem_budget;
        least = budget[i] && (!least || budget[i] < least) ? budget[i] : least;
    }
    for (int l = s->first_moe; l < s->n_layer; l++)
        for (int k = ARCH_EXPS_GATE; k <= ARCH_EXPS_DOWN; k++) {
            const gguf_tensor_t *t;
            ecs_err_t rc = arch_exps_tensor(model_gguf(d->m), &d->hp, l, (arch_exps_t)k, &t);
            if (rc != ECS_OK)
                return ecs_error(rc, "dispatch: %s", ecs_errmsg());
            bytes[l] += t->nbytes / (uint64_t)s->n_expert;
            copy += t->nbytes;
        }
    const bool spawned = all_spawned(d);
    ecs_err_t rc = placement_auto_replication(s, pw, d->n_workers, spawned, budget, bytes, repl);
    if (rc != ECS_OK)
        return rc;
    if (!spawned)
        logmsg(d, "replication: auto -> 1 (workers this coordinator did not spawn may not "
               "share its page cache; --replication R to replicate)");
    else if (*repl >= d->n_workers || *repl >= PLACEMENT_MAX_HOLDERS)
        logmsg(d, "replication: auto -> %d (spawned workers on one host share the page cache)",
               *repl);
    else
        logmsg(d, "replication: auto -> %d (a whole copy of the routed experts, %.1f MiB, is "
               "over the workers' --mem-budget of %.1f MiB)", *repl, copy / 1048576.0,
               least / 1048576.0);
    return ECS_OK;
}

/* The placement depends on the worker set and the options only, never on
 * the order the workers registered in: coordinators that share workers
 * (M:N) compute the same one, so a worker is never asked to hold two
 * (docs/operations.md). Runs before any other thread reads d->w. */
static ecs_err_t make_placement(dispatch_t *d)
{
    qsort(d->w, (size_t)d->n_workers, sizeof *d->w, by_id);
    placement_worker_t pw[PLACEMENT_MAX_WORKERS];
    bool budgets = true;
    for (int i = 0; i < d->n_workers; i++)
        budgets &= d->w[i].mem_budget > 0;
    for (int i = 0; i < d->n_workers; i++) {
        pw[i].id = d->w[i].id;
        pw[i].weight = d->o.weighting == DISPATCH_UNIFORM ? 1.0
                       : budgets ? (double)d->w[i].mem_budget / 1048576.0
                                 : (double)(d->w[i].threads > 0 ? d->w[i].threads : 1);
    }
    dispatch_shape_t s = {.n_layer = d->hp.n_layer, .first_moe = d->hp.n_layer_dense,
                          .n_expert = d->hp.n_expert};
    if (d->o.placement_file)
        return placement_load(&s, d->o.placement_file, pw, d->n_workers, &d->pl);
    int repl = d->o.replication;
    ecs_err_t rc = repl > 0 ? ECS_OK : auto_replication(d, &s, pw, &repl);
    if (rc != ECS_OK)
        return rc;
    return placement_make(&s, pw, d->n_workers, repl, &d->pl);
}

/* Sends worker wi what it must hold now (hold while a placement change
 * runs, else pl) under a new generation. */
ecs_err_t dispatch_send_assign(dispatch_t *d, int wi)
{
    pthread_mutex_lock(&d->lock);
    const placement_t *pl = d->hold ? d->hold : d->pl;
    const int n = placement_held(pl, wi);
    int32_t *pairs = malloc(2 * (size_t)(n > 0 ? n : 1) * sizeof *pairs);
    uint32_t *ls = malloc((size_t)(n > 0 ? n : 1) * sizeof *ls);
    uint32_t *es = malloc((size_t)(n > 0 ? n : 1) * sizeof *es);
    ecs_err_t rc = ECS_OK;
    if (pairs)
        placement_worker_pairs(pl, wi, pairs, n);
    d->w[wi].assign_gen++;
    pthread_mutex_unlock(&d->lock);
    if (!pairs || !ls || !es) {
        rc = ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        ls[i] = (uint32_t)pairs[2 * i];
        es[i] = (uint32_t)pairs[2 * i + 1];
    }
    /* a worker left with no expert (drained) holds nothing at all */
    const bool shared = n > 0 && dispatch_shared_wanted(d, wi);
    atomic_store(&d->w[wi].sh_held, shared);
    wire_msg_t m = {.kind = WIRE_ASSIGN,
                    .assign = {.generation = d->w[wi].assign_gen, .n = (size_t)n, .layers = ls,
                               .experts = es, .shared = shared}};
    if ((rc = mux_ctrl_send(d->mux, &d->w[wi].route, &m)) != ECS_OK)
        rc = ecs_error(rc, "dispatch: assigning worker %s: %s", d->w[wi].id, ecs_errmsg());
done:
    free(pairs);
    free(ls);
    free(es);
    return rc;
}

/* Which experts lose every holder if the refusing workers hold nothing. */
static void describe_orphans(const dispatch_t *d, const bool *refused, char *out, size_t cap)
{
    int missing = 0;
    size_t len = 0;
    out[0] = 0;
    for (int l = d->hp.n_layer_dense; l < d->hp.n_layer; l++)
        for (int e = 0; e < d->hp.n_expert; e++) {
            const int16_t *h;
            const int n = placement_holders(d->pl, l, e, &h);
            bool alive = false;
            for (int i = 0; i < n; i++)
                alive |= !refused[h[i]];
            if (alive)
                continue;
            if (missing++ < 8 && len < cap) {
                int w = snprintf(out + len, cap - len, "%s%d/%d", len ? ", " : "", l, e);
                len += w > 0 ? (size_t)w : 0;
            }
        }
    if (missing > 8 && len < cap)
        snprintf(out + len, cap - len, ", ... (%d pairs in all)", missing);
}

static ecs_err_t wait_ready(dispatch_t *d, uint64_t deadline)
{
    bool refused[PLACEMENT_MAX_WORKERS] = {0};
    char reason[512] = "";
    int ready = 0, n_refused = 0;
    while (ready + n_refused < d->n_workers) {
        char why[256];
        if (spawned_died(d, why, sizeof why))
            return ecs_error(ECS_ERR_IO, "dispatch: %s", why);
        if (now_ms() > deadline)
            return ecs_error(ECS_ERR_IO, "dispatch: %d of %d workers ready in time", ready,
                             d->n_workers);
        mux_route_t from;
        wire_msg_t m;
        dispatch_heartbeat_all(d, now_ms());
        if (mux_ctrl_recv(d->mux, &from, &m, 100) != ECS_OK)
            continue;
        int wi = -1;
        for (int i = 0; i < d->n_workers; i++)
            if (d->w[i].route.len == from.len && !memcmp(d->w[i].route.id, from.id, from.len))
                wi = i;
        if (wi >= 0)
            d->w[wi].last_seen_ms = now_ms();
        if (wi >= 0 && m.kind == WIRE_READY && !d->w[wi].ready) {
            d->w[wi].ready = true;
            d->w[wi].ready_gen = m.ready.generation;
            d->w[wi].bytes_held = m.ready.bytes_mapped;
            ready++;
            logmsg(d, "worker %s ready: %d experts, %.1f MiB, loaded in %.0f ms", d->w[wi].id,
                   placement_held(d->pl, wi), m.ready.bytes_mapped / 1048576.0,
                   m.ready.load_ns / 1e6);
        } else if (wi >= 0 && m.kind == WIRE_ERROR && !refused[wi] && !d->w[wi].ready) {
            refused[wi] = true;
            n_refused++;
            snprintf(reason, sizeof reason, "worker %s refused its assignment: %s", d->w[wi].id,
                     m.error.message);
            fprintf(stderr, "dispatch: %s\n", reason);
        }
        wire_msg_clear(&m);
    }
    if (n_refused) {
        char orphans[512];
        describe_orphans(d, refused, orphans, sizeof orphans);
        return ecs_error(ECS_ERR_NOMEM, "dispatch: %s; %s%s", reason,
                         orphans[0] ? "experts (layer/expert) without a holder: "
                                    : "every expert still has a holder",
                         orphans);
    }
    return ECS_OK;
}

ecs_err_t dispatch_cluster_start(dispatch_t *d)
{
    char ep[300];
    const char *bind = d->o.control;
    if (!bind) {
        snprintf(d->dir, sizeof d->dir, "/tmp/ecs-%d-XXXXXX", (int)getpid());
        if (!mkdtemp(d->dir))
            return ecs_error(ECS_ERR_IO, "dispatch: cannot make a directory for the endpoints: "
                             "%s", strerror(errno));
        snprintf(ep, sizeof ep, "ipc://%s/control", d->dir);
        bind = ep;
    }
    ecs_err_t rc = mux_curve_load(&d->keys, d->o.curve_key, NULL, d->o.curve_clients,
                                  d->o.spawn_workers > 0);
    if (rc != ECS_OK)
        return ecs_error(rc, "dispatch: %s", ecs_errmsg());
    rc = mux_new(&(mux_opts_t){.control_bind = bind, .curve = mux_curve_view(&d->keys)}, &d->mux);
    if (rc != ECS_OK)
        return ecs_error(rc, "dispatch: control endpoint %s: %s", bind, ecs_errmsg());
    if (d->keys.on)
        logmsg(d, "CURVE on the worker links: %d worker keys allowed", d->keys.n_allowed);
    const int timeout = d->o.start_timeout_ms > 0 ? d->o.start_timeout_ms : 300000;
    const uint64_t deadline = now_ms() + (uint64_t)timeout;
    if ((rc = pin_threads(d)) != ECS_OK)
        return rc;
    if (d->o.spawn_workers > 0 &&
        ((rc = worker_path(d, d->bin, sizeof d->bin)) != ECS_OK || (rc = spawn(d)) != ECS_OK))
        return rc;
    int want = d->o.min_workers > 0 ? d->o.min_workers
               : d->o.spawn_workers > 0 ? d->o.spawn_workers : 1;
    if (want > PLACEMENT_MAX_WORKERS)
        return ecs_error(ECS_ERR_RANGE, "dispatch: %d workers (at most %d)", want,
                         PLACEMENT_MAX_WORKERS);
    d->w = calloc((size_t)want, sizeof *d->w);
    if (!d->w)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
    logmsg(d, "waiting for %d workers on %s", want, mux_control_endpoint(d->mux));
    if ((rc = wait_registrations(d, want, deadline)) != ECS_OK || (rc = make_placement(d)))
        return rc;
    for (int i = 0; i < d->n_workers; i++)
        if ((rc = dispatch_send_assign(d, i)) != ECS_OK)
            return rc;
    if ((rc = wait_ready(d, deadline)) != ECS_OK)
        return rc;
    for (int i = 0; i < d->n_workers; i++) {
        int peer;
        if ((rc = dispatch_connect_peer(d, i, &peer)))
            return ecs_error(rc, "dispatch: worker %s's data endpoint %s: %s", d->w[i].id,
                             d->w[i].endpoint, ecs_errmsg());
        atomic_store(&d->w[i].peer, peer);
        atomic_store(&d->w[i].state, DW_LIVE);
        d->w[i].last_seen_ms = now_ms();
        if (d->w[i].child >= 0)
            d->children[d->w[i].child].ready = true;
    }
    d->started_ms = now_ms();
    if (pthread_create(&d->ctl, NULL, dispatch_control_loop, d) != 0)
        return ecs_error(ECS_ERR_INTERNAL, "dispatch: cannot start the control thread");
    d->ctl_started = true;
    return ECS_OK;
}

void dispatch_cluster_stop(dispatch_t *d)
{
    atomic_store(&d->stop, true);
    if (d->ctl_started)
        pthread_join(d->ctl, NULL);
    d->ctl_started = false;
    dispatch_ops_cancel(d);
    for (int i = 0; i < d->n_workers; i++) { /* segments offered, never connected */
        dplane_shm_free(d->w[i].shm);
        d->w[i].shm = NULL;
    }
    mux_free(d->mux);
    d->mux = NULL;
    mux_curve_keys_free(&d->keys);
    if (d->children)
        stop_spawned(d);
    free(d->children);
    d->children = NULL;
    if (d->dir[0])
        rmdir(d->dir); /* the workers' sockets are gone with them */
}

const char *dispatch_control_endpoint(const dispatch_t *d)
{
    return d->mux ? mux_control_endpoint(d->mux) : "";
}

ecs_err_t dispatch_start(model_t *m, const dispatch_opts_t *o, dispatch_t **out)
{
    *out = NULL;
    if (o->spawn_workers < 0 || o->spawn_workers > 256)
        return ecs_error(ECS_ERR_RANGE, "dispatch: --spawn-workers %d (0 to 256)",
                         o->spawn_workers);
    dispatch_t *d = calloc(1, sizeof *d);
    if (!d)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
    d->m = m;
    d->o = *o;
    d->hp = *model_hparams(m);
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    gguf_fingerprint(model_gguf(m), d->fp);
    ecs_err_t rc = dispatch_layers_new(d);
    if (rc == ECS_OK)
        rc = dispatch_cluster_start(d);
    if (rc == ECS_OK)
        rc = dispatch_buffers_new(d);
    if (rc != ECS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ecs_errmsg());
        dispatch_free(d);
        return ecs_error(rc, "%s", msg);
    }
    model_set_experts(m, &dispatch_experts_ops, d);
    (void)model_set_micro_batches(m, o->micro_batches > 0 ? o->micro_batches : 1); /* parsed 1..4 */
    *out = d;
    return ECS_OK;
}

void dispatch_free(dispatch_t *d)
{
    if (!d)
        return;
    if (d->m)
        model_set_experts(d->m, NULL, NULL);
    for (int t = 0; t < MODEL_MAX_MICRO; t++)
        for (int i = 0; d->bt[t].calls && i < d->hp.n_expert; i++)
            if (d->bt[t].calls[i]) {
                mux_call_release(d->bt[t].calls[i]);
                d->bt[t].calls[i] = NULL;
            }
    dispatch_cluster_stop(d);
    if (d->pinned && d->m) /* the model may run on alone, or under another layout */
        ecs_threadpool_unpin(model_threadpool(d->m));
    dispatch_buffers_free(d);
    placement_free(d->pl);
    free(d->w);
    pthread_mutex_destroy(&d->lock);
    pthread_cond_destroy(&d->cond);
    free(d);
}
