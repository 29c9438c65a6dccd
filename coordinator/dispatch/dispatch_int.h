/* dispatch_int.h - inside the dispatch module: the registry of workers
 * (cluster.c: registration and spawning; supervise.c: the control thread,
 * heartbeats, failure detection and restarts) shared with the expert
 * backend (dispatch.c).
 *
 * Threads: the control thread alone changes a worker's state and data
 * peer after start-up; the model thread (dispatch.c) reads them through
 * the atomics below and sleeps on `cond` (under `lock`) while a dead
 * worker's experts wait for a holder; every state change bumps
 * `state_gen` and broadcasts `cond`. */
#ifndef ECS_DISPATCH_INT_H
#define ECS_DISPATCH_INT_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "common/arch.h"
#include "common/gguf.h"
#include "coordinator/dispatch/dispatch.h"
#include "proto/mux.h"

/* Heartbeats both ways (the Paranoid Pirate pattern: any control message
 * counts as a sign of life). Sane ranges: interval 100-5000 ms (shorter
 * floods the control socket, longer slows detection); liveness
 * (WIRE_LIVENESS, shared with the worker) 3-10 intervals: a worker silent
 * that long is dead. A call must not take longer than interval * liveness
 * (the worker heartbeats between a call's regions of
 * SHARD_REGION_JOBS experts, worker/worker_int.h: one region must fit). */
#define DISPATCH_HEARTBEAT_MS 500
/* Each ring of a same-host plane: a decode step's call takes a few KiB,
 * its result 48 KiB a row; what takes over half a ring (a prompt's
 * calls: pp64's result is 3 MiB) goes on ZeroMQ (mux_peer_set_shm), where
 * prefill measured faster (docs/benchmarks.md). */
#define DISPATCH_SHM_RING ((size_t)2 << 20)
/* A call of at most this many rows (a decode step's) whose experts all
 * have one live spawned holder in common goes whole to one of them, which
 * computes it with all the host's cores (dispatch_share_threads): one
 * hand-off each way instead of one per worker. 16 rows' results (768 KiB
 * on ds2-lite) stay on a shared-memory ring (over half of it goes on
 * ZeroMQ). */
#define DISPATCH_ALONE_ROWS 16
/* Connects worker wi's data peer (and its shared-memory plane when the
 * worker attached the segment of its last Welcome); *peer is its id. */
ecs_err_t dispatch_connect_peer(dispatch_t *d, int wi, int *peer);
#define DISPATCH_TICK_MS 50           /* control loop: liveness, exits, restarts */
#define DISPATCH_RESTART_MIN_MS 100   /* first restart delay, doubled per failed start */
#define DISPATCH_RESTART_MAX_MS 5000
#define DISPATCH_CRASH_LIMIT 5        /* failed starts in a row before giving up */

typedef enum {
    DW_LOADING = 0, /* registered, assignment sent, not Ready yet */
    DW_LIVE = 1,    /* takes calls */
    DW_DEAD = 2,    /* declared dead: its calls go elsewhere or wait */
    DW_FAILED = 3,  /* given up on (crash loop): its experts fail at once */
} dispatch_wstate_t;

typedef struct {
    pid_t pid;                  /* 0: not running */
    uint64_t started_ms, restart_at_ms;
    unsigned backoff_ms;
    int fails;                  /* exits before Ready, in a row */
    int restarts;
    bool ready;                 /* Ready since its last start */
    bool given_up;
} dispatch_child_t;

typedef struct {
    char id[PLACEMENT_ID_MAX];
    char endpoint[256];
    char curve_pub[CURVE_Z85_LEN + 1]; /* its data socket's CURVE key, "" : plaintext */
    mux_route_t route;          /* on the control socket */
    int pid, threads;
    uint64_t mem_budget, bytes_held;
    atomic_int peer;            /* mux data peer, -1: not connected */
    atomic_int state;           /* dispatch_wstate_t */
    bool ready;
    uint64_t calls, rows;
    /* control thread only */
    uint64_t last_seen_ms, last_hb_ms, died_ms;
    int child;                  /* index in children, -1: not spawned here */
    int deaths;
    char why[256];              /* why it died (under lock) */
    _Atomic uint64_t caps;      /* Hello.capabilities (WIRE_CAP_*); control thread writes */
    atomic_bool sh_held;        /* its Assign asked it to hold the shared experts (shared.c) */
    struct dplane_shm *shm;     /* the segment its last Welcome named, until its data peer
                                 * connects (control thread) */
    uint64_t assign_gen, ready_gen; /* last Assign sent, last Ready heard: reloading if != */
    int registrations;          /* Hellos of new processes with its id */
    bool drained;               /* holds nothing on purpose (under lock) */
} dispatch_worker_t;

/* One batch's layer call, from its submit() to its wait(). */
typedef struct {
    bool busy;                  /* submitted, not waited for */
    int layer, n_tok, k;
    const float *x, *wts;       /* the model's, valid until wait() returns */
    mux_call_t **calls;         /* [n_expert] slots, NULL: free */
    int *call_worker, *call_nent;  /* [n_expert] */
    uint64_t *call_t0;          /* [n_expert] when the slot's call was sent (ms) */
    int32_t *pair_call, *pair_pos; /* [MODEL_MAX_BATCH * k] pair -> slot, entry in it */
    int *exp_slot;              /* [n_expert] slot holding the expert's call, -1 */
    bool *todo;                 /* [n_expert] rows not sent (or to send again) */
    int32_t *order, *start;     /* [MODEL_MAX_BATCH * k], [n_expert + 1]: pairs by expert */
    float *d;                   /* [MODEL_MAX_BATCH * k * n_embd] results, pair order */
    void *xq;                   /* [MODEL_MAX_BATCH] rows of this layer in act_type */
    bool xq_done;               /* xq holds this submit's rows */
    /* the layer's shared experts on a worker (shared.c) */
    bool sh_todo;               /* to send with the next call to a worker holding them */
    int sh_slot;                /* the call slot carrying them, -1: none */
    float *sh;                  /* the model's rows for them (took_shared), NULL: the model
                                 * computes them itself */
} dispatch_batch_t;

/* An operator's request (drain.c), queued for the control thread. */
typedef struct dispatch_op {
    dispatch_op_kind_t kind;
    char worker[PLACEMENT_ID_MAX];
    dispatch_op_done_fn done;
    void *arg;
    struct dispatch_op *next;
} dispatch_op_t;

struct dispatch {
    model_t *m;
    dispatch_opts_t o;
    arch_hparams_t hp;
    uint8_t fp[GGUF_FINGERPRINT_BYTES];
    char dir[256];              /* private directory of the ipc endpoints, "" if none */
    mux_t *mux;
    mux_curve_keys_t keys;      /* CURVE on the worker links (off: plaintext) */
    placement_t *pl;
    int n_workers;
    dispatch_worker_t *w;       /* [n_workers] in placement order */
    dispatch_child_t *children; /* [spawn_workers] */
    int n_spawned;
    char bin[4096];             /* the worker program */
    pthread_cond_t cond;        /* state changes, with lock */
    uint64_t state_gen;         /* under lock */
    uint64_t hb_seq;            /* heartbeats sent (the thread that owns control) */
    pthread_t ctl;              /* drains control messages while serving */
    bool ctl_started;
    atomic_bool stop;
    pthread_mutex_t lock;       /* stats read by other threads */

    /* Placement changes (drain.c). The model thread routes by pl; pl is
     * replaced by pl_next (under lock) only between layers (in_layer
     * false), by the model thread at its next submit or by the control
     * thread when the model is idle. hold: what each worker must hold
     * while a change runs (the union of old and new), NULL: pl. Threads
     * other than the model's read pl under lock. */
    placement_t *pl_next, *hold;
    int in_layer;               /* batches between submit and wait (under lock) */
    dispatch_op_t *ops;         /* queued (under lock) */
    dispatch_op_t *op;          /* running (control thread) */
    int op_phase, op_wi;
    placement_t *op_target;
    uint64_t op_deadline_ms;
    int op_pid;
    uint64_t started_ms;

    /* A layer call per batch (the model's micro-batches, one slot each,
     * MODEL_MAX_MICRO at most); b: the one submit() or wait() works on
     * (the model thread's). Calls in flight hold disjoint experts within
     * a batch: a call slot per expert at most. */
    dispatch_batch_t bt[MODEL_MAX_MICRO];
    dispatch_batch_t *b;
    int32_t *pairs_tmp;         /* [MODEL_MAX_BATCH * k] */
    int *choice;                /* [n_expert] worker of each expert this call, -1 */
    int *rows_now;              /* [n_workers] rows given this call */
    int32_t *local;             /* [MODEL_MAX_BATCH] row -> row of the worker's payload */
    uint32_t *c_experts, *c_counts, *c_rows, *c_slots;
    int32_t *ident;             /* [MODEL_MAX_BATCH * k] 0, 1, 2, ... */
    unsigned rr;
    int share_threads;          /* dispatch_share_threads, fixed at start-up */
    bool pinned;                /* --pin-threads in effect: this pool pinned, spawned
                                 * workers too, a lone call hands the cores over */
    cpu_set_t allowed;          /* when pinned: the CPUs before, a spawned worker's (the
                                 * forking thread may be pinned to one) */
    bool alone;                 /* this submit's calls: one, to a spawned worker with no
                                 * other spawned worker busy (it takes all the cores) */
    bool whole;                 /* this submit went whole to one replica, alone */
    int last_whole;             /* the worker of the last such submit (ties go to it) */
    uint64_t alone_calls;       /* such submits (under lock) */
    uint64_t layer_calls, step_rows, overlapped;
    double imbalance_sum;
    /* where a layer's time goes (model thread; read by dispatch_print_stats
     * after the run): submit's end to wait's start (the model's overlapped
     * work: the shared experts), wait blocked on the calls, and per layer
     * the slowest call's round trip and its worker's compute time */
    uint64_t t_submit_ns, t_submitted_ns, ns_submit, ns_overlap, ns_blocked, ns_rtt_max,
        ns_compute_of_max;
    /* activations as the kernels compute from them (dispatch.c: act_rows) */
    uint32_t *act_type;         /* [n_layer] the rows' type for a worker taking q8, F32: none */
    size_t xq_row;              /* bytes of the widest quantized activation row, 0: none */
    bool *sh_layer;             /* [n_layer] its shared experts may go with a call (shared.c) */
    bool sh_any;                /* some layer's may */
    uint64_t sh_calls, sh_here; /* layer calls whose shared experts a worker computed; of
                                 * those, computed here after all (their call failed) */
};

void dispatch_log(const dispatch_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t dispatch_now_ms(void);

/* cluster.c */
ecs_err_t dispatch_cluster_start(dispatch_t *d);
void dispatch_cluster_stop(dispatch_t *d);
ecs_err_t dispatch_spawn_one(dispatch_t *d, int i);
/* The threads of a spawned worker's call when calls to several spawned
 * workers are out at once (cores / spawned workers); 0: every call runs
 * on the worker's own count (--worker-threads given, or none spawned). */
int dispatch_share_threads(const dispatch_t *d);
ecs_err_t dispatch_send_assign(dispatch_t *d, int wi);
int dispatch_find_worker(const dispatch_t *d, const char *id);
/* Checks a Hello and records the worker (welcomed), or refuses it:
 * the worker's index, -1 if refused. *renewed: a known id from another
 * process (a restart). */
int dispatch_on_hello(dispatch_t *d, const mux_route_t *from, const wire_hello_t *h, int cap,
                      bool *renewed);
void dispatch_heartbeat_all(dispatch_t *d, uint64_t now);
/* drain.c: operators' requests, run by the control thread each tick */
void dispatch_ops_tick(dispatch_t *d, uint64_t now);
void dispatch_ops_cancel(dispatch_t *d);
/* The model thread, at a layer's start: takes pl_next if one waits. */
void dispatch_layer_begin(dispatch_t *d);
void dispatch_layer_end(dispatch_t *d);
/* supervise.c: the control thread */
void *dispatch_control_loop(void *arg);
void dispatch_state_changed(dispatch_t *d);
/* shared.c: the layers' shared experts computed by a worker with the
 * routed ones of a decode-sized call (ExpertCall.shared), when the workers
 * share this host's cores (--shared-experts). dispatch_shared_new sizes
 * it at start-up; wants: whether worker wi's Assign asks it to hold them;
 * begin: at a submit, whether this batch's call may carry them; carrier:
 * in send_todo, which of the workers given rows (rows_now) takes them, -1:
 * none; sent: the call in slot s took them; collect: an answered call's
 * shared rows (ECS_ERR_FORMAT: missing), or its failure (they are to send
 * again); finish: at the end of wait, computes them here when no call
 * could carry them again (true: it did). */
ecs_err_t dispatch_shared_new(dispatch_t *d);
bool dispatch_shared_wanted(dispatch_t *d, int wi);
void dispatch_shared_begin(dispatch_t *d);
int dispatch_shared_carrier(dispatch_t *d);
void dispatch_shared_sent(dispatch_t *d, int slot);
void dispatch_shared_failed(dispatch_t *d, int slot);
void dispatch_shared_collect(dispatch_t *d, int slot, const void *rows);
bool dispatch_shared_finish(dispatch_t *d);
bool dispatch_took_shared(void *ctx, int tag, float *sh);
/* whole.c: the current batch's call whole to one replica. Whether wi is
 * a live spawned worker whose threads this coordinator sized; the replica
 * that takes the whole call (-1: deal it per expert); the thread count of
 * wi's call in this submit (after d->alone is set). */
bool dispatch_shares_cores(dispatch_t *d, int wi);
int dispatch_choose_whole(dispatch_t *d);
uint32_t dispatch_call_threads(dispatch_t *d, int wi);
void dispatch_note_whole(dispatch_t *d, int one);
/* dispatch.c: per-layer facts the Assigns need (before any worker
 * registers), then the call buffers (once the workers are known) */
ecs_err_t dispatch_layers_new(dispatch_t *d);
ecs_err_t dispatch_buffers_new(dispatch_t *d);
void dispatch_buffers_free(dispatch_t *d);

#endif
