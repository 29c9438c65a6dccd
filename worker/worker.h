/* worker.h - the expert worker daemon (ecs-worker): holds a shard of a
 * model's routed experts and turns activation rows into expert outputs for
 * any coordinator that calls it.
 *
 * Life of a worker: it maps the GGUF (only its experts' pages are ever
 * read), connects to the coordinator's control endpoint and says Hello
 * (protocol versions, model fingerprint, id, threads, memory budget, its
 * data endpoint). The coordinator answers Welcome, then Assign: the
 * (layer, expert) pairs to hold. The worker checks them against its memory
 * budget (refusing with an OVER_BUDGET Error, which the coordinator shows),
 * prefaults their bytes so the first call is not slow, and says Ready.
 * Then each ExpertCall on the data socket runs the grouped expert FFN
 * (kernels/moe, the same code as the coordinator's local backend, so the
 * bits are the same) and is answered with one f32 row per entry. The worker
 * holds no request state. A bad message is answered or dropped and
 * counted; it never stops the worker. Given several coordinators it
 * registers with each and serves them all, round robin between their
 * queued calls, with one shard (worker.c says how it stays one). With
 * --device cuda:N the experts that fit the VRAM budget are resident on the
 * GPU and the rest streamed or computed on the host (kernels/tier); such a
 * worker sends Stats with its cache's hit counts every WORKER_STATS_MS.
 *
 *     worker_opts_t o = {.model = "m.gguf", .coordinator = "ipc:///tmp/c.ctl",
 *                        .id = "w0", .threads = 2};
 *     signal handler: worker_stop(w);
 *     worker_t *w;
 *     if (worker_new(&o, &w) != ECS_OK) die(ecs_errmsg());
 *     ecs_err_t rc = worker_run(w);      // until worker_stop or a fatal refusal
 *     worker_free(w);
 */
#ifndef ECS_WORKER_H
#define ECS_WORKER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

#define WORKER_DEFAULT_BUDGET ((uint64_t)0) /* 0: no limit but the machine's */
#define WORKER_MAX_COORDINATORS 8             /* coordinators one worker registers with */

typedef struct {
    const char *model;       /* GGUF path */
    const char *coordinator; /* control endpoint, tcp://HOST:PORT or ipc://PATH */
    const char *const *coordinators; /* more of them (M:N: it registers with each, serves all,
                                      * holds the first one's assignment) */
    int n_coordinators;
    const char *listen;      /* data endpoint to bind; NULL: chosen (see worker.c) */
    const char *id;          /* unique per coordinator; NULL: host-pid */
    const char *device;      /* "cpu" (NULL), "cuda:N" (a GPU: experts tiered between its
                              * VRAM and the host, worker/device.c) or "emu" (the same
                              * path on kgpu's host emulation, for tests) */
    uint64_t vram_budget;    /* device bytes for experts and buffers; 0: 90% of free */
    int threads;             /* compute threads, >= 1 */
    uint64_t mem_budget;     /* bytes of expert weights it may hold; 0: unlimited */
    const char *repack_dir;  /* where the interleaved copy of its experts is cached; NULL: none */
    bool quiet;              /* no log lines on stderr but errors */
    bool pin_threads;        /* thread i on the i-th CPU, handing the cores to and from a
                              * coordinator pinned the same way (ecs_threadpool_pin): a
                              * worker spawned beside it on the same cores */
    const char *curve_key;   /* CURVE: this worker's PREFIX.key; NULL: plaintext links */
    const char *curve_server_key; /* the coordinator's public key file (needed with a key) */
    const char *curve_clients; /* *.pub of the coordinators allowed to call; NULL: that one */
} worker_opts_t;

typedef struct worker worker_t;

/* Opens the model and the sockets (nothing is sent yet). */
ecs_err_t worker_new(const worker_opts_t *o, worker_t **out);
/* Registers and serves until worker_stop(). Returns ECS_OK after a stop,
 * or an error when the coordinator refused this worker for good (another
 * model, no common protocol version): the message says why. */
ecs_err_t worker_run(worker_t *w);
/* Makes worker_run return soon: any thread, async-signal-safe. */
void worker_stop(worker_t *w);
void worker_free(worker_t *w);

#endif
