/* measure.h - what ecs-plan measures on this machine before it predicts:
 * mux round trips (a server process with empty compute), the
 * coordinator's step with a null expert backend, kmoe on random routings. */
#ifndef ECS_PLAN_MEASURE_H
#define ECS_PLAN_MEASURE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "coordinator/dispatch/dispatch.h"
#include "coordinator/model/model.h"
#include "coordinator/plan/plan.h"

double meas_now(void);
/* The q-quantile of v[0..n) (sorts v). */
double meas_quantile(double *v, int n, double q);
/* xorshift64 */
uint64_t meas_rnd(uint64_t *s);
/* k distinct random experts for each of n rows, those >= limit dropped:
 * returns the pair count; ids[p], row[p] for the kept pairs, *touched the
 * distinct experts. */
int meas_routing(uint64_t *s, int n, int k, int n_expert, int limit, int32_t *row,
                 int32_t *ids, int *touched);

/* A mux server with empty compute in a child process (fork before any
 * ZeroMQ context or thread exists). */
typedef struct {
    pid_t pid;
    char endpoint[256];
} meas_server_t;
int meas_server_start(const char *bind, meas_server_t *s);
void meas_server_stop(meas_server_t *s);

#define MEAS_LINK_POINTS 6
typedef struct {
    int rows[MEAS_LINK_POINTS], entries[MEAS_LINK_POINTS];
    double bytes[MEAS_LINK_POINTS], med_s[MEAS_LINK_POINTS];
    int n;
    double alpha_s, beta_s;
} meas_link_t;
/* Round trips of calls of the sizes of the model's expert calls. */
int meas_link(const char *endpoint, int n_embd, int k, bool quick, meas_link_t *out);

typedef struct {
    double pp_s, tg0_s, tgd_s, batch_s; /* pp step, decode per token at depth ~0 and ~pp,
                                         * one step of `batch` rows */
    double sh_pp_s, sh_tg_s;            /* shared experts within pp and a depth-0 token */
    double sh_cpu_ratio;                /* CPU / wall while in the shared experts */
    int pp, tg, batch;
} meas_coord_t;
/* The coordinator's share: steps of m with a null expert backend, whose
 * wait() sleeps sleep_ns per MoE layer (0: returns at once), as the
 * coordinator sleeps while its experts are out; the time in wait() is not
 * counted. Sleeping matters on a busy machine: a process that sleeps now
 * and then gets its turn on the cores sooner than one that never does. */
int meas_coord(model_t *m, int pp, int tg, int reps, long sleep_ns, meas_coord_t *out);

typedef struct meas_trace meas_trace_t;
#define MEAS_EXPERT_CALLS 64
typedef struct {
    int n;
    int experts[MEAS_EXPERT_CALLS], pairs[MEAS_EXPERT_CALLS];
    double wall_s[MEAS_EXPERT_CALLS];
    plan_expert_cost_t cost; /* cpu_ratio: the threads (what they demand of the cores) */
    double cpu_share;        /* CPU time / (wall x threads): the share of the cores got */
} meas_expert_t;
/* kmoe over m's experts with `threads` threads on random routings: one-row
 * calls of 1 and k experts, full-step calls of all and a third of them;
 * the calls through all k slots replay tr's routings where it has calls
 * of those rows (tr NULL: uniform draws). */
int meas_experts(model_t *m, int threads, const meas_trace_t *tr, bool quick,
                 meas_expert_t *out);

/* The routings ecs-run --bench computes: the same random prompt (seed
 * 1234), pp tokens, then tg greedy tokens after it and tg greedy tokens
 * from an empty context, recorded per expert call (the local experts
 * compute meanwhile, so the routings are those of the real run, bit for
 * bit). A model's routing is not uniform: consecutive decode steps reuse
 * experts (whose weights may still be in the caches), a prompt touches
 * some experts more; the timings below replay these instead of uniform
 * draws. */
struct meas_trace {
    int n, cap, k;
    int *layer, *rows;
    size_t *off;  /* into ids: the call's rows x k expert ids */
    int32_t *ids;
    size_t n_ids, cap_ids;
};
int meas_trace(model_t *m, int pp, int tg, meas_trace_t *out);
void meas_trace_free(meas_trace_t *t);
/* The trace's next call of `rows` rows from *cursor on, cyclic (advances
 * the cursor past it): its index, -1 if none (t may be NULL). */
int meas_trace_next(const meas_trace_t *t, int rows, int *cursor);

/* ---- the page cache around the phase timings (pages.c) ----
 * A layout's workers read their decode copies through the page cache; on
 * the full model the GGUF, the planner's one-process copy and every
 * layout's worker copies do not fit in it together, and a phase timed
 * with cold copies times the disk (50 ms a layer call instead of ~1.5:
 * docs/benchmarks.md, "Quiet run of 2026-12-02"). So before a layout
 * starts, what nothing reads any more is dropped when everything would
 * not fit (plan_pages_evict: the planner's own routed-expert pages, then
 * the layouts timed before); once its workers are up their files are read
 * in, and their resident share is taken before and after the timing. */
typedef struct {
    char **path;
    int n;
} meas_files_t;
void meas_files_free(meas_files_t *fs);

typedef struct {
    bool no_repack;        /* the workers read the GGUF's routed experts themselves */
    uint64_t routed_bytes; /* the GGUF's routed experts (what each copy of them holds) */
    uint64_t keep_bytes;   /* the GGUF's other tensors (what the planner still reads) */
    uint64_t gguf_bytes, copy_bytes; /* the GGUF, the one-process decode copy */
    meas_files_t done;     /* the files of the layouts timed so far */
} meas_pages_t;

typedef struct {
    plan_pages_t pages;    /* the arithmetic before the layout started */
    int evict;             /* PLAN_EVICT_* done, PLAN_NO_ROOM */
    meas_files_t files;    /* its workers' copies (none: the GGUF's routed experts) */
    int n_files;
    uint64_t bytes;        /* what they read */
    double warm_s;         /* reading them in */
    double settle_s;       /* then waiting for the kernel's reclaim to stop */
    double before, after;  /* resident shares before and after the timing */
    bool warm;             /* plan_phase_warm(before, after) */
} meas_pages_use_t;

void meas_pages_init(model_t *m, bool no_repack, meas_pages_t *pg);
void meas_pages_free(meas_pages_t *pg);
/* How many times n_workers workers with `replication` holders per expert
 * hold the routed experts in their decode copies: a copy is named after
 * its worker's experts, so when every worker holds every expert
 * (replication n_workers, --replication auto's spawned layout) they all
 * map one file, else R different ones. */
int meas_copies(int n_workers, int replication);
/* Before a layout whose workers' decode copies hold every routed expert
 * `copies` times starts its workers: the arithmetic and the drops. */
void meas_pages_before_start(model_t *m, meas_pages_t *pg, int copies, meas_pages_use_t *u);
/* Its workers are up: finds their files, reads them in, takes the
 * resident share (-1: a worker's files could not be listed or read). */
int meas_pages_warm(model_t *m, const dispatch_t *d, meas_pages_use_t *u);
/* After the timing: the resident share again, whether it was warm; the
 * layout's files join pg->done. */
void meas_pages_after(model_t *m, meas_pages_t *pg, meas_pages_use_t *u);

/* The expert phase of one MoE layer as a layout with workers runs it,
 * timed inside the model's own steps: n_workers real ecs-worker processes
 * spawned through the dispatcher (its transport, its placement, each
 * worker with `threads` threads and its own prefaulted shard) behind the
 * model, which runs what ecs-run --bench runs (a warm-up; then the prompt
 * of pp rows, tg greedy tokens after it, tg from an empty context; twice,
 * once with quick). Per MoE layer call, from submit's start to the end of
 * wait: the calls out, the coordinator's shared experts meanwhile, the
 * answers summed (the phase); the slowest call's round trip and its
 * worker's compute (the worker's own figure) from the dispatcher. Means
 * over the decode steps' calls and over the prompt steps' calls of pp rows
 * (a step's time is the sum of its calls: the mean, not the median, is
 * what adds up). An imitation of a step (the coordinator's threads spun
 * between calls that replayed recorded routings, the shared experts as a
 * kmoe call) timed the decode phase 20-40 % slower than real steps do: the
 * workers' wake-ups and the scheduler's choices depend on what the
 * coordinator does around the call (docs/planner.md, "What it measures",
 * 5.). dec_outside_s / pp_outside_s: the same steps' time outside
 * the phases per token / per prompt step (the coordinator's own work with
 * its experts out), printed beside the null backend's figure the
 * prediction takes. */
typedef struct {
    int n_workers, threads, calls_dec, calls_pp, pp_rows;
    double dec_phase_s, dec_rtt_s, dec_compute_s, dec_shexp_s;
    double pp_phase_s, pp_rtt_s, pp_compute_s, pp_shexp_s;
    double dec_handoff_s, pp_handoff_s; /* mean round trip - compute of the slowest call */
    double dec_outside_s, pp_outside_s;
    meas_pages_use_t pages; /* the page cache around it (pg NULL: not looked at) */
} meas_phase_t;
/* m: the planner's one-process model (its pages, pg); coord: the
 * coordinator the steps run on, loaded as ecs-run --spawn-workers loads
 * it (experts_remote); threads: each worker's (--worker-threads), 0: the
 * dispatcher's default (dispatch_share_threads). */
int meas_phase(model_t *m, model_t *coord, int n_workers, int threads, int replication,
               const char *worker_repack, int pp, int tg, bool quick, meas_pages_t *pg,
               meas_phase_t *out);

#endif
