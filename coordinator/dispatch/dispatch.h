/* dispatch.h - expert placement and the pooled dispatcher.
 *
 * Placement says which workers hold each routed expert (layer, expert):
 * made uniform or weighted by each worker's capacity with a replication
 * factor, or read from a placement file. The dispatcher (below) is a
 * model_experts_ops backend: it registers the expert workers (starting
 * them itself with spawn_workers), hands out the placement, and per layer
 * sends each worker exactly one call with the rows of its experts, each
 * expert to its least busy holder. Workers return one f32 row per (row,
 * slot); the sum runs here, in slot order, with the local backend's code
 * (kmoe_sum): the logits do not depend on where the experts ran.
 *
 * Placement file (docs/operations.md): one line per rule,
 *     WORKER LAYERS EXPERTS        # comment
 * WORKER is a worker id (ecs-worker --id; spawned workers are w0, w1, ...),
 * LAYERS and EXPERTS are comma lists of `a`, `a-b` (inclusive) or `*`.
 * Rules add holders; dense layers are skipped; every (MoE layer, expert)
 * must end up with a holder, else loading fails naming the first missing
 * pair. placement_write() prints a placement in this format.
 *
 *     dispatch_shape_t s = {.n_layer = 27, .first_moe = 1, .n_expert = 64};
 *     placement_worker_t w[] = {{"w0", 1}, {"w1", 1}, {"w2", 2}};
 *     placement_t *p;
 *     if (placement_make(&s, w, 3, 2, &p) != ECS_OK) die(ecs_errmsg());
 *     const int16_t *h;
 *     int n = placement_holders(p, 5, 17, &h);  // h[0..n) hold layer 5 expert 17
 *     placement_free(p);
 */
#ifndef ECS_DISPATCH_H
#define ECS_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "coordinator/model/model.h"

#define PLACEMENT_MAX_WORKERS 1024
#define PLACEMENT_MAX_HOLDERS 8
#define PLACEMENT_ID_MAX 64
#define PLACEMENT_LINE_MAX 65536

typedef struct {
    int n_layer;   /* all layers */
    int first_moe; /* layers below it are dense (no routed experts) */
    int n_expert;  /* routed experts per MoE layer */
} dispatch_shape_t;

typedef struct {
    const char *id; /* unique, < PLACEMENT_ID_MAX bytes */
    double weight;  /* relative capacity (> 0): twice the weight, twice the experts */
} placement_worker_t;

typedef struct placement placement_t;

/* Deals every (MoE layer, expert) to `replication` distinct workers, shares
 * proportional to the weights in every layer; deterministic. */
ecs_err_t placement_make(const dispatch_shape_t *s, const placement_worker_t *w, int n_workers,
                         int replication, placement_t **out);
/* --replication auto: workers this process spawned (spawned: all of them)
 * share its host's page cache, so every one holds every expert (R =
 * n_workers, at most PLACEMENT_MAX_HOLDERS) unless a worker's budget[wi]
 * (bytes, 0: none) cannot hold its placement_make share, an expert of
 * layer l weighing expert_bytes[l]: then the largest R whose shares fit,
 * 1 at least (a deal over a budget at 1 is the workers' to refuse, naming
 * the experts). Workers started by hand: 1. */
ecs_err_t placement_auto_replication(const dispatch_shape_t *s, const placement_worker_t *w,
                                     int n_workers, bool spawned, const uint64_t *budget,
                                     const uint64_t *expert_bytes, int *out);
/* Reads a placement file naming the workers in w (see above). */
ecs_err_t placement_load(const dispatch_shape_t *s, const char *path,
                         const placement_worker_t *w, int n_workers, placement_t **out);
/* The same from an open stream; name is what its errors call it. */
ecs_err_t placement_read(const dispatch_shape_t *s, FILE *f, const char *name,
                         const placement_worker_t *w, int n_workers, placement_t **out);
void placement_free(placement_t *p);
/* ECS_ERR_NOTFOUND naming the pairs without a holder; sets the replication
 * (the least number of holders of any pair). */
ecs_err_t placement_check(placement_t *p);

/* Holders of (layer, expert): their worker indices in *workers. */
int placement_holders(const placement_t *p, int layer, int expert, const int16_t **workers);
int placement_n_workers(const placement_t *p);
int placement_replication(const placement_t *p);
const char *placement_worker_id(const placement_t *p, int wi);
/* How many (layer, expert) pairs worker wi holds. */
int placement_held(const placement_t *p, int wi);
/* Worker wi's pairs as (layer, expert) int pairs into pairs[2*cap], in
 * layer then expert order; returns the count (may exceed cap). */
int placement_worker_pairs(const placement_t *p, int wi, int32_t *pairs, int cap);
/* The placement in the file format above. */
ecs_err_t placement_write(const placement_t *p, FILE *f);

/* New placements from p, for drain and undrain (p is untouched; the
 * replication is kept, usable[n_workers] says which workers may take
 * pairs). clone: a copy. union: every holder of a or of b. without:
 * worker wi holds nothing, each of its pairs goes to the usable worker not
 * holding it that holds the fewest of that layer (ECS_ERR_NOTFOUND if a
 * pair would lose its last holder; a pair every usable worker holds
 * already keeps one holder fewer). with: wi holds again each pair below
 * the replication, then takes pairs from the usable holders with the most
 * of each layer until the layer is even.
 * same_share: whether wi holds the same pairs in a and b. */
ecs_err_t placement_clone(const placement_t *p, placement_t **out);
ecs_err_t placement_union(const placement_t *a, const placement_t *b, placement_t **out);
ecs_err_t placement_without(const placement_t *p, int wi, const bool *usable, placement_t **out);
ecs_err_t placement_with(const placement_t *p, int wi, const bool *usable, placement_t **out);
bool placement_same_share(const placement_t *a, const placement_t *b, int wi);

/* ---- the dispatcher ---- */

typedef enum {
    DISPATCH_UNIFORM = 0,  /* every worker the same share */
    DISPATCH_CAPACITY = 1, /* shares by declared memory budget (if every worker
                            * declares one), else by threads */
} dispatch_weighting_t;

typedef struct {
    const char *control;        /* control endpoint to bind; NULL: ipc in a private dir */
    int spawn_workers;          /* local ecs-worker processes to start (0: none) */
    const char *worker_bin;     /* NULL: ecs-worker beside this program */
    int worker_threads;         /* per spawned worker; 0: cores / spawn_workers, >= 1 */
    const char *worker_budget;  /* --mem-budget for spawned workers, NULL: none */
    const char *worker_repack;  /* spawned workers' --repack DIR; "": --no-repack; NULL: theirs */
    int min_workers;            /* registrations to wait for; 0: spawn_workers or 1 */
    int replication;            /* holders per expert; 0: auto (when every worker is one
                                 * this process spawned, each holds every expert if its
                                 * budget lets it, else the most that fit; otherwise 1) */
    dispatch_weighting_t weighting;
    const char *placement_file; /* explicit placement (worker ids); NULL: made */
    int start_timeout_ms;       /* registration and loading; 0: 300 s */
    int call_timeout_ms;        /* how long a layer waits for its experts' answers, re-sends
                                 * to a replica or a restarted worker included; 0: 120 s */
    const char *curve_key;      /* CURVE on the worker links: this side's PREFIX.key; NULL:
                                 * plaintext (proto/curve.h, docs/operations.md) */
    const char *curve_clients;  /* directory of the workers' *.pub allowed to register */
    int call_retry_ms;          /* a call unanswered this long is sent again (lost message,
                                 * see mux_call_cancel), doubling per retry; 0: heartbeat
                                 * interval * liveness */
    bool quiet;                 /* log only errors */
    bool wire_f32;              /* --wire-act f32: activations as f32 even to workers that
                                 * take the quantized rows (same bits, ~3.5x the bytes) */
    bool wire_bf16;             /* --wire-result bf16: results back as bf16 from workers that
                                 * can (half the bytes; INEXACT: docs/benchmarks.md) */
    int data_plane;             /* --data-plane (dispatch_plane_mode): 1 zmq (every call on
                                 * ZeroMQ), 2 auto (a worker on this host gets a
                                 * shared-memory plane, docs/protocol.md), 3 shm (the same,
                                 * and says so when a worker cannot take it); 0: the
                                 * environment's ECS_DATA_PLANE, else auto */
    size_t shm_ring_bytes;      /* each ring of a shared-memory plane; 0: DISPATCH_SHM_RING */
    int micro_batches;          /* --micro-batches: steps cut into this many, attention of
                                 * one while another's experts are out; 0: 1 */
    int shared_experts;         /* --shared-experts (dispatch_shared_mode): 1 coordinator
                                 * (computed here while the calls are out), 2 worker (a
                                 * decode-sized call's worker computes them with its routed
                                 * experts, where it can), 0 auto: worker when the workers
                                 * are spawned here without a budget (they share these
                                 * cores: nothing to overlap), else coordinator */
    int pin_threads;            /* --pin-threads (dispatch_pin_mode): 1 off, 2 on (this
                                 * pool's thread i on the i-th CPU, spawned workers told
                                 * to do the same, the cores handed over CPU by CPU), 0
                                 * auto: on when one spawned worker takes all of this
                                 * process's CPUs, as its pool does */
} dispatch_opts_t;

typedef struct dispatch dispatch_t;

/* Binds the control endpoint, starts the spawned workers, waits for
 * min_workers registrations (each checked: protocol version, model
 * fingerprint, unique id), places the experts, assigns them and waits
 * until every worker is Ready; then m computes its routed experts through
 * the workers. Fails, saying which experts have no holder, when a worker
 * refuses its assignment (over its budget) or the wait times out. */
ecs_err_t dispatch_start(model_t *m, const dispatch_opts_t *o, dispatch_t **out);
/* While m runs, a control thread supervises the workers: a worker that
 * dies (silent for WIRE_LIVENESS heartbeats, exited, its connection
 * dropped) has its calls re-sent to a live replica or held until it is
 * back; spawned workers are restarted with backoff (supervise.c). */
/* m back to its local experts; workers it spawned are stopped (SIGTERM,
 * then SIGKILL), by pid. */
void dispatch_free(dispatch_t *d);
extern const model_experts_ops dispatch_experts_ops;

const placement_t *dispatch_placement(const dispatch_t *d);
const char *dispatch_control_endpoint(const dispatch_t *d);

typedef struct {
    char id[PLACEMENT_ID_MAX];
    int pid;                     /* as the worker declared it */
    int threads;
    uint64_t mem_budget, bytes_held;
    int pairs_held;
    uint64_t calls_in_flight, rows_in_flight, calls, rows, bytes_out, bytes_in;
    uint64_t latency_p50_us, latency_p99_us;
    const char *state;           /* "loading", "live", "dead", "failed", "draining",
                                  * "drained", "reloading" */
    int restarts;                /* restarts by the supervisor or new processes registered */
    int deaths;
    int64_t last_heard_ms;       /* ms since its last message, -1: never */
    char why[256];               /* why it died, if it is not live */
    bool spawned;
    /* round trips of completed calls: bucket i counts [2^i, 2^(i+1)) us
     * (bucket 0 also those under 1 us), for a histogram on /metrics */
#define DISPATCH_LAT_BUCKETS 32
    uint64_t latency_hist[DISPATCH_LAT_BUCKETS];
} dispatch_worker_stats_t;

typedef struct {
    int n_workers;
    uint64_t layer_calls;        /* submits */
    uint64_t overlapped;         /* submits while another micro-batch's calls were out */
    uint64_t whole_calls;        /* submits sent whole to one replica with all the cores
                                  * (DISPATCH_ALONE_ROWS, dispatch.c) */
    double imbalance;            /* mean over submits of busiest / mean rows per worker */
    /* where the layers' time went, summed over submits (ns): submit
     * itself (grouping, the activations, the sends), submit's end to
     * wait's start (the model's overlapped work), wait blocked on the
     * calls, the slowest call's round trip and its worker's compute time
     * (the planner's hand-off cost is the round trip less the compute) */
    uint64_t ns_submit, ns_overlap, ns_blocked, ns_rtt_max, ns_compute_of_max;
} dispatch_stats_t;

void dispatch_stats(const dispatch_t *d, dispatch_stats_t *s);

/* ---- operators' requests (ecsctl through the admin endpoint) ----
 * drain: the worker's experts go to the other live workers (Assign, wait
 * for Ready), then calls stop going to it (between two layers, so no call
 * in flight is lost), then it is told to hold nothing; it stays
 * registered, idle. undrain: it takes an even share of every layer again,
 * the same way round. restart: a spawned worker gets SIGTERM and the
 * supervisor starts it again; a remote one is sent Drain (it exits and
 * systemd starts it again); done when it is back and loaded. One request
 * runs at a time, others queue; done(arg, rc, message) is called once,
 * from the control thread (or from dispatch_free with ECS_ERR_IO). */
typedef enum { DISPATCH_OP_DRAIN, DISPATCH_OP_UNDRAIN, DISPATCH_OP_RESTART } dispatch_op_kind_t;
typedef void (*dispatch_op_done_fn)(void *arg, ecs_err_t rc, const char *msg);
ecs_err_t dispatch_op_start(dispatch_t *d, dispatch_op_kind_t kind, const char *worker,
                            dispatch_op_done_fn done, void *arg);
int dispatch_n_workers(const dispatch_t *d);
/* The placement now (file format), malloc'd text; what a drain in
 * progress has changed so far included. */
ecs_err_t dispatch_placement_text(dispatch_t *d, char **out);
/* Experts of each MoE layer each worker holds now (malloc'd):
 * counts[(layer - *first) * n_workers + worker], *n_layer MoE layers. */
ecs_err_t dispatch_layer_counts(dispatch_t *d, int **counts, int *first, int *n_layer);
/* "" when no request runs, else e.g. "drain w1: moving its experts". */
void dispatch_op_status(dispatch_t *d, char *buf, size_t cap);

/* ---- command-line options (ecs-run, ecs-coordinator) ---- */

#define DISPATCH_USAGE                                                                       \
    "  --spawn-workers N  run the routed experts on N local ecs-worker processes\n"          \
    "  --control ADDR     take workers' registrations here (tcp://HOST:PORT, ipc://PATH;\n"  \
    "                     workers started by hand: ecs-worker --coordinator ADDR)\n"         \
    "  --min-workers N    workers to wait for before serving (default: the spawned, or 1)\n" \
    "  --replication R|auto  holders per expert, 1-8; auto (default): spawned workers\n"  \
    "                     each hold every expert (they share this host's page cache),\n"  \
    "                     fewer if --worker-mem-budget is too small; by hand: 1\n"        \
    "  --placement P      uniform (default), capacity (shares by memory budget or\n"         \
    "                     threads), or a placement file (docs/operations.md)\n"              \
    "  --worker-threads N threads of each spawned worker (default: cores / N)\n"             \
    "  --worker-mem-budget SIZE  --mem-budget of each spawned worker\n"                     \
    "  --worker-bin PATH  the program spawned workers run (default: ecs-worker beside this)\n" \
    "  --call-timeout MS  a layer's expert calls may wait this long for a live holder\n"    \
    "                     (a dead worker's replica or restart; default 120000)\n"    \
    "  --call-retry MS    send a call again if unanswered this long (a lost message;\n"  \
    "                     doubles per retry; default 2000)\n"                            \
    "  --curve-key FILE   CURVE on the worker links: this coordinator's key pair\n"     \
    "                     (PREFIX.key; spawned workers get it too)\n"                   \
    "  --curve-clients DIR  the workers' public keys (*.pub) allowed to register\n"     \
    "  --wire-act q8|f32  activation rows to the workers: q8 (default; the rows the\n"     \
    "                     kernels compute from, to workers that take them) or f32\n"     \
    "  --wire-result f32|bf16  result rows back: f32 (default, exact) or bf16 (half the\n" \
    "                     bytes, logits no longer bit-identical to one process)\n"    \
    "  --data-plane auto|shm|zmq  auto (default): workers on this host take their\n"     \
    "                     decode calls through shared memory, others ZeroMQ; shm: the\n"    \
    "                     same, saying when a worker cannot; zmq: every call on ZeroMQ\n"   \
    "  --micro-batches N  cut each step of several rows into N (1-4, default 1): one's\n" \
    "                     attention runs while another's experts are out (same logits)\n" \
    "  --shared-experts auto|worker|coordinator  where a decode step's shared experts\n" \
    "                     run: worker (with its routed ones, one product pass), or here\n" \
    "                     while the calls are out; auto (default): worker when the\n"     \
    "                     workers are spawned here without a budget (same logits)\n"     \
    "  --pin-threads auto|on|off  thread i of this process and of spawned workers on the\n" \
    "                     i-th CPU, the cores handed over CPU by CPU while one waits\n" \
    "                     for the other; auto (default): on when one spawned worker\n" \
    "                     shares all of this process's CPUs with it\n"

/* "auto" 0, "coordinator" 1, "worker" 2; -1 for anything else. */
int dispatch_shared_mode(const char *v);
/* "auto" 0, "off" 1, "on" 2; -1 for anything else. */
int dispatch_pin_mode(const char *v);
/* Whether opt is one of the options above that takes a value. */
bool dispatch_opt_takes_value(const char *opt);
/* "zmq" 1, "auto" 2, "shm" 3, NULL or "" 0; -1 for anything else. */
int dispatch_plane_mode(const char *v);
/* The plane o asks for: --data-plane, else ECS_DATA_PLANE, else 2 (auto:
 * a worker on another host, or one that cannot map the segment, keeps
 * ZeroMQ, so auto is never worse than zmq for correctness). */
int dispatch_plane_of(const dispatch_opts_t *o);
/* Applies opt (and its value v) to o: 1 taken, 0 not a dispatcher
 * option, -1 bad value (ecs_errmsg says why). */
int dispatch_parse_opt(dispatch_opts_t *o, const char *opt, const char *v);
/* Whether o asks for workers at all. */
bool dispatch_wanted(const dispatch_opts_t *o);
/* Options that need workers given without them, or with workers an
 * ECS_DATA_PLANE that is not zmq/auto/shm (ECS_ERR_INVAL, saying so). */
ecs_err_t dispatch_opts_check(const dispatch_opts_t *o);
ecs_err_t dispatch_worker_stats(const dispatch_t *d, int wi, dispatch_worker_stats_t *out);
/* A few lines: per worker calls, rows, bytes each way, latency; bytes per
 * token; the imbalance. */
void dispatch_print_stats(const dispatch_t *d, FILE *f);

#endif
