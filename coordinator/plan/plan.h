/* plan.h - the capacity planner's arithmetic (ecs-plan): from measured
 * costs, the decode and prompt speed of a layout (workers, threads each,
 * replication, cores) and each worker's load. Pure functions: the
 * measuring lives in tools/ecs-plan; known inputs give known outputs.
 *
 * The model of one forward step of r rows (docs/planner.md):
 *   coordinator   C(r, depth): everything but the routed experts (attention,
 *                 router, dense and shared FFNs, head), measured with the
 *                 experts elsewhere; S of it is the shared experts, which
 *                 run while the routed experts are out.
 *   experts       a worker holding e touched experts and p (row, expert)
 *                 pairs of a layer takes t = x0 + xe e + xp p seconds
 *                 with T threads (kmoe on random routings), keeping
 *                 cpu_ratio threads busy on average.
 *   link          one call per worker per layer: alpha + beta (bytes out
 *                 + bytes back) (a mux round trip with empty compute).
 *   one process   step = C + sum over MoE layers of t(all experts, Tc) - x0
 *                 (the local experts' jobs run in the shared experts'
 *                 regions: no wake-ups of their own).
 *   N workers     step = C - S + sum over MoE layers of
 *                   max(S_l, max_i (link_i + t_i),
 *                       (S_l busy_c + sum_i t_i busy_i) / cores)
 *                 the last term: every process time-shares the same cores,
 *                 so the CPU work of the layer cannot finish faster than
 *                 its CPU-seconds over what its threads get of the cores
 *                 (busy = threads; with ext_threads other runnable threads
 *                 a thread gets v(n) = min(1, cores / (ext + n)) of a core
 *                 when n of ours run: a time measured with n threads is
 *                 n v(n) core-seconds per second).
 *   measured      a layout whose expert phase was timed with its own
 *                 workers (plan_layout_t.phase_*): step = C - S + layers x
 *                 that phase, for a step of the rows it was timed with.
 * Routings are drawn at random (k distinct experts per row, uniform), each
 * expert's rows go to one holder the way the dispatcher picks (fewest rows
 * so far in this call, ties by rotation), and the times are averaged over
 * samples: the busiest worker, not the mean one, sets the layer's time.
 *
 *     plan_inputs_t in = {...measured...};
 *     plan_layout_t l = {.n_workers = 2, .worker_threads = 1, .coord_threads = 2,
 *                        .cores = 2, .replication = 1, .batch = 1, .depth = 16};
 *     plan_pred_t p;
 *     if (plan_decode(&in, &l, &p) != ECS_OK) die(ecs_errmsg());
 *     printf("%.1f tok/s\n", p.tok_s);
 */
#ifndef ECS_PLAN_H
#define ECS_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

#define PLAN_MAX_THREADS 64
#define PLAN_MAX_WORKERS 64
#define PLAN_MAX_REPLICATION 8
#define PLAN_MAX_EXPERTS 1024
#define PLAN_MAX_K 64
#define PLAN_STEP_ROWS 512 /* rows per prompt step (MODEL_MAX_BATCH) */

/* Routed-expert compute of one call with T threads. */
typedef struct {
    double x0;        /* s per call */
    double xe;        /* s per expert touched */
    double xp;        /* s per (row, expert) pair */
    double cpu_ratio; /* CPU seconds per wall second while computing (busy threads) */
} plan_expert_cost_t;

typedef struct {
    /* shape */
    int n_layer_moe;   /* layers with routed experts */
    int n_expert;      /* routed experts per layer */
    int k;             /* experts per row */
    int n_embd;        /* values per activation row (f32 on the wire) */
    /* coordinator, experts elsewhere, coord_threads threads */
    double dec_s;      /* one decode step of one row at depth 0 */
    double dec_ctx_s;  /* more per cached token per row */
    double dec_row_s;  /* more per extra row in a decode step */
    double pp_row_s;   /* per row of a full prompt step at depth 0 */
    double shexp_dec_s;    /* shared experts in a one-row step (all layers) */
    double shexp_pp_row_s; /* shared experts per prompt row (all layers) */
    double coord_cpu_ratio;/* busy threads while it computes the shared experts */
    /* routed experts, by thread count (xe == xp == 0: not measured) */
    plan_expert_cost_t ex[PLAN_MAX_THREADS + 1];
    /* the link to a worker */
    double alpha_s;    /* per round trip */
    double beta_s;     /* per byte, both ways together */
    /* other processes' runnable threads while the times above were taken
     * (0: a quiet machine): each runnable thread gets min(1, cores / (ext +
     * ours)) of a core, so a layout that keeps more threads runnable gets
     * more of a busy machine */
    double ext_threads;
    /* bytes of one activation row to a worker (the quantized rows the
     * kernels take, ecs-run's default); 0: f32, 4 * n_embd. Results are
     * f32 either way. */
    double act_row_bytes;
} plan_inputs_t;

typedef struct {
    int n_workers;      /* 0: one process (local experts) */
    int worker_threads; /* per worker, >= 1 */
    int coord_threads;  /* the coordinator's (and the one process's) */
    int replication;    /* holders per expert, 1 .. min(n_workers, PLAN_MAX_REPLICATION) */
    int cores;          /* cores every process shares */
    int batch;          /* decode: rows (sequences) per step */
    int depth;          /* decode: cached tokens per row */
    int pp;             /* prompt: tokens (steps of PLAN_STEP_ROWS rows) */
    /* holders[(l * n_expert + e) * replication + r]: worker index of the
     * r-th holder of expert e in MoE layer l; NULL: expert e's holders are
     * (e + r) % n_workers (a uniform placement) */
    const int16_t *holders;
    /* The expert phase of one MoE layer as measured with this layout's own
     * workers (ecs-plan: real ecs-worker processes with their threads,
     * the dispatcher's transport, the coordinator computing the shared
     * experts meanwhile; median per layer call), for a one-row step
     * (phase_dec_s) and a step of phase_pp_rows rows (phase_pp_s). It holds
     * what the model above leaves out: the hand-offs' wake-ups when the
     * cores are busy, a worker's own memory bandwidth with its thread
     * count, and the time-sharing as the scheduler does it. A step of
     * those rows charges it in place of the modelled phase (0: modelled). */
    double phase_dec_s, phase_pp_s;
    int phase_pp_rows;
    int samples;        /* routings drawn per layer (0: 64) */
    uint64_t seed;      /* of the draws (0: 1) */
} plan_layout_t;

typedef struct {
    double step_s;        /* one step */
    double tok_s;         /* rows per second */
    double coord_s;       /* the coordinator's own compute per step (shared experts included) */
    double expert_s;      /* routed-expert phase per step, all MoE layers */
    double model_expert_s;/* the same from the model alone (== expert_s unless the layout's
                           * phase was measured for this step's rows) */
    double link_s;        /* round trips of the busiest worker per step */
    double imbalance;     /* mean over layers of busiest / mean pairs per worker */
    int n_workers;
    double busy_s[PLAN_MAX_WORKERS];   /* expert compute per step */
    double pairs[PLAN_MAX_WORKERS];    /* (row, expert) pairs per step */
    double bytes_out[PLAN_MAX_WORKERS];/* activations sent to it per step */
    double bytes_in[PLAN_MAX_WORKERS]; /* results it sends back per step */
} plan_pred_t;

/* One decode step of layout->batch rows at layout->depth. */
ecs_err_t plan_decode(const plan_inputs_t *in, const plan_layout_t *layout, plan_pred_t *out);
/* A prompt of layout->pp tokens (tok_s: prompt tokens per second; step_s:
 * the whole prompt). */
ecs_err_t plan_prompt(const plan_inputs_t *in, const plan_layout_t *layout, plan_pred_t *out);

/* The expert cost model for T threads: x0 + xe e + xp p. */
double plan_expert_time(const plan_expert_cost_t *c, int experts, int pairs);

/* Two micro-batches of a step in ping-pong (attention of one while the
 * other's experts are out, MegaScale-Infer): serial a + f per micro-batch
 * against the ideal pipeline a + f + (q - 1) max(a, f), and the CPU bound
 * q (a busy_a + f busy_f) / cores when both sides share the cores. Returns
 * the best step time of q micro-batches of a and f seconds each. */
double plan_overlap(double a_s, double f_s, double busy_a, double busy_f, int q, int cores);

/* Least squares: the n_par coefficients c minimizing sum over i < n of
 * (y[i] - sum_j x[i * n_par + j] c[j])^2; n_par <= 4. ECS_ERR_INVAL when
 * the points do not determine them. */
ecs_err_t plan_lsq(const double *x, const double *y, int n, int n_par, double *c);

/* Expected distinct experts a batch touches: E (1 - (1 - k/E)^rows). */
double plan_touched(int n_expert, int k, int rows);

/* ---- the page cache while layouts' phases are timed (ecs-plan) ----
 * A layout's phase timing reads its workers' weights (their decode copies)
 * through the page cache; on the full model the GGUF, the one-process copy
 * and every layout's worker copies do not fit together (docs/planner.md,
 * "The page cache"). Sizes in bytes. */
typedef struct {
    uint64_t room;       /* what file pages can have: MemAvailable, taken when asked */
    uint64_t keep;       /* the planner's own pages it still reads (the weights other than
                          * the routed experts: shared experts, attention) */
    uint64_t own_routed; /* its resident routed-expert pages (GGUF and one-process copy):
                          * read by the one-process timings, never again */
    uint64_t others;     /* resident pages of the layouts timed before (workers gone) */
    uint64_t need;       /* the files this layout's workers read, all of them */
} plan_pages_t;

#define PLAN_EVICT_OWN 1    /* drop the planner's routed-expert pages */
#define PLAN_EVICT_OTHERS 2 /* drop the layouts' timed before */
#define PLAN_NO_ROOM 4      /* need + keep alone exceed the room: it will read cold pages */
/* Share of room the files may fill (the rest: other processes, slack). */
#define PLAN_PAGES_FILL 0.9
/* What to drop before timing a layout so that its files fit beside what
 * the planner keeps: nothing while everything fits in PLAN_PAGES_FILL of
 * room; else the planner's routed pages first; then, if still over, the
 * other layouts'. PLAN_EVICT_* bits, PLAN_NO_ROOM added when need + keep
 * exceed the fill on their own. */
int plan_pages_evict(const plan_pages_t *p);

/* A timing counts as warm when at least this share of the pages it reads
 * was resident just before and just after it. */
#define PLAN_WARM_MIN 0.98
/* Whether a phase timing read warm pages, from the resident shares of its
 * files before and after it (0..1; out of range or NaN: not warm). */
bool plan_phase_warm(double before, double after);

#endif
