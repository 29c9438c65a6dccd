/* measure.h - what ecs-plan measures on this machine before it predicts:
 * mux round trips (a server process with empty compute), the
 * coordinator's step with a null expert backend, kmoe on random routings. */
#ifndef ECS_PLAN_MEASURE_H
#define ECS_PLAN_MEASURE_H

#include <stdbool.h>
#include <sys/types.h>

#include "coordinator/model/model.h"
#include "coordinator/plan/plan.h"

double meas_now(void);

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

#define MEAS_EXPERT_CALLS 64
typedef struct {
    int n;
    int experts[MEAS_EXPERT_CALLS], pairs[MEAS_EXPERT_CALLS];
    double wall_s[MEAS_EXPERT_CALLS];
    plan_expert_cost_t cost; /* cpu_ratio: the threads (what they demand of the cores) */
    double cpu_share;        /* CPU time / (wall x threads): the share of the cores got */
} meas_expert_t;
/* kmoe over m's experts with `threads` threads on random routings: one-row
 * calls of 1 and k experts, full-step calls of all and a third of them. */
int meas_experts(model_t *m, int threads, bool quick, meas_expert_t *out);

#endif
