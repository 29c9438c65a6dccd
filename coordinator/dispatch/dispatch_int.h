/* dispatch_int.h - inside the dispatch module: the registry of workers
 * (cluster.c: registration, spawning, the control thread) shared with the
 * expert backend (dispatch.c). */
#ifndef ECS_DISPATCH_INT_H
#define ECS_DISPATCH_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "common/arch.h"
#include "common/gguf.h"
#include "coordinator/dispatch/dispatch.h"
#include "proto/mux.h"

typedef struct {
    char id[PLACEMENT_ID_MAX];
    char endpoint[256];
    mux_route_t route;          /* on the control socket */
    int pid, threads;
    uint64_t mem_budget, bytes_held;
    int peer;                   /* mux data peer, -1: not connected */
    bool ready;
    uint64_t calls, rows;
} dispatch_worker_t;

struct dispatch {
    model_t *m;
    dispatch_opts_t o;
    arch_hparams_t hp;
    uint8_t fp[GGUF_FINGERPRINT_BYTES];
    char dir[256];              /* private directory of the ipc endpoints, "" if none */
    mux_t *mux;
    placement_t *pl;
    int n_workers;
    dispatch_worker_t *w;       /* [n_workers] in placement order */
    pid_t *spawned;             /* [spawn_workers] */
    int n_spawned;
    pthread_t ctl;              /* drains control messages while serving */
    bool ctl_started;
    atomic_bool stop;
    pthread_mutex_t lock;       /* stats read by other threads */

    /* one layer call at a time (the model runs one step at a time) */
    int layer, n_tok, k;
    const float *wts;
    int n_calls;
    mux_call_t **calls;         /* [n_workers] */
    int *call_worker;           /* [n_workers] */
    int *call_first;            /* [n_workers + 1] offsets into pair_of */
    int32_t *pair_of;           /* [MODEL_MAX_BATCH * k] entry -> row * k + slot */
    int32_t *order, *start;     /* [MODEL_MAX_BATCH * k], [n_expert + 1]: pairs by expert */
    int *choice;                /* [n_expert] worker of each expert this call, -1 */
    int *rows_now;              /* [n_workers] rows given this call */
    int32_t *local;             /* [MODEL_MAX_BATCH] row -> row of the worker's payload */
    uint32_t *c_experts, *c_counts, *c_rows, *c_slots;
    float *d;                   /* [MODEL_MAX_BATCH * k * n_embd] results, pair order */
    int32_t *ident;             /* [MODEL_MAX_BATCH * k] 0, 1, 2, ... */
    unsigned rr;
    uint64_t layer_calls, step_rows;
    double imbalance_sum;
};

/* cluster.c */
ecs_err_t dispatch_cluster_start(dispatch_t *d);
void dispatch_cluster_stop(dispatch_t *d);
/* dispatch.c */
ecs_err_t dispatch_buffers_new(dispatch_t *d);
void dispatch_buffers_free(dispatch_t *d);

#endif
