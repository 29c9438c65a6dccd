/* test_plan.c - the capacity planner's arithmetic (coordinator/plan): known
 * inputs give the step times worked out by hand in each test, including
 * the time-sharing of cores, the link, the dispatcher's choice among
 * replicas and the imbalance of random routings. */
#include <criterion/criterion.h>
#include <math.h>

#include "coordinator/plan/plan.h"

#define NEAR(a, b) (fabs((double)(a) - (double)(b)) <= 1e-9 + 1e-9 * fabs((double)(b)))

/* Every row takes every expert (k == n_expert): the routing is fixed, so
 * the times are exact. Per layer and call: x0 1 ms, 0.1 ms per expert,
 * 0.01 ms per pair. */
static plan_inputs_t fixed_inputs(void)
{
    plan_inputs_t in = {.n_layer_moe = 2, .n_expert = 4, .k = 4, .n_embd = 256,
                        .dec_s = 10e-3, .dec_ctx_s = 1e-6, .dec_row_s = 1e-3,
                        .pp_row_s = 2e-3, .shexp_dec_s = 2e-3, .shexp_pp_row_s = 0,
                        .coord_cpu_ratio = 2};
    for (int t = 1; t <= 2; t++)
        in.ex[t] = (plan_expert_cost_t){1e-3, 1e-4, 1e-5, t};
    return in;
}

Test(plan, lsq_recovers_exact_coefficients)
{
    const double x2[] = {1, 0, 1, 1, 1, 2, 1, 5};
    const double y2[] = {2, 5, 8, 17};
    double c[3];
    cr_assert_eq(plan_lsq(x2, y2, 4, 2, c), ECS_OK);
    cr_assert(NEAR(c[0], 2) && NEAR(c[1], 3), "%g %g", c[0], c[1]);
    /* y = 1 + 2 e + 0.5 p */
    const double x3[] = {1, 1, 1, 1, 6, 6, 1, 64, 3072, 1, 21, 1024};
    double y3[4];
    for (int i = 0; i < 4; i++)
        y3[i] = 1 + 2 * x3[3 * i + 1] + 0.5 * x3[3 * i + 2];
    cr_assert_eq(plan_lsq(x3, y3, 4, 3, c), ECS_OK);
    cr_assert(fabs(c[0] - 1) < 1e-6 && fabs(c[1] - 2) < 1e-6 && fabs(c[2] - 0.5) < 1e-9,
              "%g %g %g", c[0], c[1], c[2]);
    /* two equal points cannot give a line */
    const double xd[] = {1, 3, 1, 3};
    cr_assert_eq(plan_lsq(xd, y2, 2, 2, c), ECS_ERR_INVAL);
    cr_assert_eq(plan_lsq(x2, y2, 1, 2, c), ECS_ERR_INVAL);
}

Test(plan, touched_experts)
{
    cr_assert(NEAR(plan_touched(64, 6, 1), 6));
    cr_assert(NEAR(plan_touched(64, 6, 0), 0));
    /* the seeds' example: 64 tokens x 8 of 128 experts touch ~112 */
    cr_assert(fabs(plan_touched(128, 8, 64) - 128 * (1 - pow(1 - 8.0 / 128, 64))) < 1e-9);
    cr_assert(plan_touched(64, 6, 512) > 63.99);
}

Test(plan, overlap_pipeline_and_shared_cores)
{
    /* the seeds' exercise: 4 micro-batches, attention 2 ms, FFN 3 ms:
     * serial 20 ms, ideal pipeline 2 + 3 + 3 x 3 = 14 ms */
    cr_assert(NEAR(plan_overlap(2, 3, 1, 1, 4, 1 << 20), 14));
    /* both sides keep 2 threads busy on 2 shared cores: the CPU work is
     * 4 x (2 + 3) x 2 / 2 = 20: nothing gained */
    cr_assert(NEAR(plan_overlap(2, 3, 2, 2, 4, 2), 20));
    /* one thread each on 2 cores: bound 10 < pipeline 14 */
    cr_assert(NEAR(plan_overlap(2, 3, 1, 1, 4, 2), 14));
    cr_assert(NEAR(plan_overlap(2, 3, 1, 1, 1, 2), 5));
}

Test(plan, one_process_is_coordinator_plus_experts)
{
    plan_inputs_t in = fixed_inputs();
    plan_layout_t l = {.n_workers = 0, .coord_threads = 2, .cores = 2, .batch = 1,
                       .depth = 100};
    plan_pred_t p;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK, "%s", ecs_errmsg());
    /* C = 10 ms + 100 x 1 us; per layer 4 x 0.1 + 4 x 0.01 = 0.44 ms (the
     * 1 ms per call is not paid: the local experts run in the shared
     * experts' regions) */
    cr_assert(NEAR(p.coord_s, 10.1e-3), "%g", p.coord_s);
    cr_assert(NEAR(p.expert_s, 2 * 0.44e-3), "%g", p.expert_s);
    cr_assert(NEAR(p.step_s, 10.98e-3), "%g", p.step_s);
    cr_assert(NEAR(p.tok_s, 1 / 10.98e-3));
    /* 3 rows: C + 2 x dec_row, 3 x 100 cached; pairs 12 per layer */
    l.batch = 3;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.step_s, 10e-3 + 2e-3 + 300e-6 + 2 * (0.44e-3 + 8 * 1e-5)), "%g", p.step_s);
    cr_assert(NEAR(p.tok_s, 3 / p.step_s));
}

Test(plan, one_worker_link_and_shared_experts_overlap)
{
    plan_inputs_t in = fixed_inputs();
    in.alpha_s = 1e-4;
    in.beta_s = 1e-9;
    plan_layout_t l = {.n_workers = 1, .worker_threads = 1, .coord_threads = 2, .cores = 4,
                       .replication = 1, .batch = 1, .depth = 100};
    plan_pred_t p;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK, "%s", ecs_errmsg());
    /* per layer: link 0.1 ms + (1 row + 4 results) x 1 KB x 1 ns, then
     * 1.44 ms of experts, against 1 ms of shared experts (S / 2 layers)
     * and a CPU bound of (1 ms x 2 + 1.44 ms x 1) / 4 cores */
    const double link = 1e-4 + 5 * 1024 * 1e-9, phase = link + 1.44e-3;
    cr_assert(NEAR(p.link_s, 2 * link), "%g", p.link_s);
    cr_assert(NEAR(p.expert_s, 2 * phase), "%g", p.expert_s);
    cr_assert(NEAR(p.step_s, 10.1e-3 - 2e-3 + 2 * phase), "%g", p.step_s);
    cr_assert_eq(p.n_workers, 1);
    cr_assert(NEAR(p.pairs[0], 8));
    cr_assert(NEAR(p.bytes_out[0], 2 * 1024) && NEAR(p.bytes_in[0], 8 * 1024));
    cr_assert(NEAR(p.busy_s[0], 2 * 1.44e-3));
    cr_assert(NEAR(p.imbalance, 1));
    /* on 1 core the shared experts and the worker take turns: 1 ms (its
     * 2 threads already shared the one core when it was measured) + 1.44
     * ms per layer */
    l.cores = 1;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.step_s, 10.1e-3 - 2e-3 + 2 * 2.44e-3), "%g", p.step_s);
}

Test(plan, a_busy_machine_gives_more_runnable_threads_more)
{
    plan_inputs_t in = fixed_inputs();
    plan_layout_t l = {.n_workers = 1, .worker_threads = 2, .coord_threads = 2, .cores = 2,
                       .replication = 1, .batch = 1};
    plan_pred_t p;
    /* quiet: the shared experts (1 ms a layer) and the worker (1.44 ms),
     * 2 threads each, take turns on the 2 cores */
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.expert_s, 2 * 2.44e-3), "%g", p.expert_s);
    /* 22 other runnable threads: measured with 2 threads, each side got
     * 2/24 of a core per thread, 1/6 core-second per second; with 4 of ours
     * running they get 4 x 2/26: the layer's (1 + 1.44) / 6 core-seconds
     * take (2.44 / 6) / (8 / 26) ms, less than the 1.44 ms critical path */
    in.ext_threads = 22;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(2.44e-3 / 6 / (8.0 / 26) < 1.44e-3);
    cr_assert(NEAR(p.expert_s, 2 * 1.44e-3), "%g", p.expert_s);
    /* one process is C + experts whatever the load: its times were measured
     * under it */
    l.n_workers = 0;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.step_s, 10.88e-3), "%g", p.step_s);
}

Test(plan, workers_time_share_the_cores)
{
    plan_inputs_t in = fixed_inputs();
    in.shexp_dec_s = 0;
    plan_layout_t l = {.n_workers = 2, .worker_threads = 1, .coord_threads = 2, .cores = 2,
                       .replication = 1, .batch = 1};
    plan_pred_t p;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    /* uniform holders e % 2: 2 experts, 2 pairs each, 1.22 ms, in parallel */
    const double t = 1e-3 + 2e-4 + 2e-5;
    cr_assert(NEAR(p.expert_s, 2 * t), "%g", p.expert_s);
    cr_assert(NEAR(p.busy_s[0], 2 * t) && NEAR(p.busy_s[1], 2 * t));
    /* one core: they take turns */
    l.cores = 1;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.expert_s, 4 * t), "%g", p.expert_s);
    /* two threads each on two cores: each worker's 2 busy threads share
     * them too */
    l.cores = 2;
    l.worker_threads = 2;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.expert_s, 4 * t), "%g", p.expert_s);
}

Test(plan, a_measured_phase_replaces_the_modelled_one_for_its_rows)
{
    plan_inputs_t in = fixed_inputs();
    plan_layout_t l = {.n_workers = 2, .worker_threads = 1, .coord_threads = 2, .cores = 2,
                       .replication = 1, .batch = 1, .pp = 512, .phase_dec_s = 3e-3,
                       .phase_pp_s = 50e-3, .phase_pp_rows = 512};
    plan_pred_t p;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK, "%s", ecs_errmsg());
    /* C - S + 2 layers x 3 ms: 10 ms - 2 ms + 6 ms; the model's figure is
     * kept beside it: the shared experts (1 ms a layer) against 1.22 ms of
     * experts per worker, in parallel on the 2 cores, and the CPU bound
     * (1 x 2 + 1.22 + 1.22) / 2 = 2.22 ms a layer */
    cr_assert(NEAR(p.expert_s, 6e-3), "%g", p.expert_s);
    cr_assert(NEAR(p.step_s, 14e-3), "%g", p.step_s);
    cr_assert(NEAR(p.model_expert_s, 2 * 2.22e-3), "%g", p.model_expert_s);
    /* a prompt of 512 rows: 512 x 2 ms (no shared experts per row here) +
     * 50 ms for the first layer's 512 rows + 3 ms for the last layer's one
     * row (the one whose logits the step returns) */
    cr_assert_eq(plan_prompt(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.step_s, 512 * 2e-3 + 50e-3 + 3e-3), "%g", p.step_s);
    cr_assert(NEAR(p.tok_s, 512 / p.step_s));
    /* other rows than those measured, and one process: modelled */
    l.pp = 256;
    cr_assert_eq(plan_prompt(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.expert_s, p.model_expert_s));
    l.batch = 2;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.expert_s, p.model_expert_s));
    l.batch = 1;
    l.n_workers = 0;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.step_s, 10.88e-3), "%g", p.step_s);
}

Test(plan, replicas_split_an_experts_rows_the_dispatchers_way)
{
    plan_inputs_t in = fixed_inputs();
    in.shexp_dec_s = 0;
    /* both workers hold every expert: the least loaded so far takes the
     * next expert, so each gets 2 of the 4 */
    plan_layout_t l = {.n_workers = 2, .worker_threads = 1, .coord_threads = 2, .cores = 4,
                       .replication = 2, .batch = 1};
    plan_pred_t p;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.pairs[0], 4) && NEAR(p.pairs[1], 4), "%g %g", p.pairs[0], p.pairs[1]);
    cr_assert(NEAR(p.imbalance, 1));
    /* an explicit table that gives every expert to worker 1 alone */
    int16_t h[2 * 4 * 1];
    for (int i = 0; i < 8; i++)
        h[i] = 1;
    l.replication = 1;
    l.holders = h;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(NEAR(p.pairs[0], 0) && NEAR(p.pairs[1], 8));
    cr_assert(NEAR(p.imbalance, 2));
    cr_assert(NEAR(p.expert_s, 2 * 1.44e-3));
}

Test(plan, random_routing_busiest_worker_above_mean)
{
    plan_inputs_t in = fixed_inputs();
    in.n_expert = 64;
    in.k = 6;
    in.n_layer_moe = 26;
    plan_layout_t l = {.n_workers = 3, .worker_threads = 1, .coord_threads = 2, .cores = 2,
                       .replication = 1, .batch = 1, .samples = 200, .seed = 3};
    plan_pred_t p;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    /* 6 pairs over 3 workers: the busiest gets more than 2 on average */
    cr_assert(p.imbalance > 1.2 && p.imbalance < 3, "%g", p.imbalance);
    double sum = 0;
    for (int i = 0; i < 3; i++)
        sum += p.pairs[i];
    cr_assert(fabs(sum - 26 * 6) < 1e-6, "%g", sum);
    /* 512 rows: nearly even */
    l.batch = 512;
    l.samples = 8;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_OK);
    cr_assert(p.imbalance >= 1 && p.imbalance < 1.1, "%g", p.imbalance);
}

Test(plan, prompt_in_steps_of_512)
{
    plan_inputs_t in = fixed_inputs();
    plan_layout_t l = {.n_workers = 0, .coord_threads = 2, .cores = 2, .pp = 1024};
    plan_pred_t p;
    cr_assert_eq(plan_prompt(&in, &l, &p), ECS_OK);
    /* two steps of 512 rows: 512 x 2 ms + (0.4 + 2048 x 0.01) ms for the
     * first layer, and the last layer for the one row whose logits the
     * step returns: 0.4 + 4 x 0.01 ms */
    const double step = 512 * 2e-3 + (4e-4 + 2048 * 1e-5) + (4e-4 + 4 * 1e-5);
    cr_assert(NEAR(p.step_s, 2 * step), "%g", p.step_s);
    cr_assert(NEAR(p.tok_s, 1024 / (2 * step)));
}

Test(plan, refuses_what_it_cannot_predict)
{
    plan_inputs_t in = fixed_inputs();
    plan_pred_t p;
    plan_layout_t l = {.n_workers = 1, .worker_threads = 3, .coord_threads = 2, .cores = 2,
                       .replication = 1, .batch = 1};
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_ERR_NOTFOUND); /* no costs for 3 threads */
    l.worker_threads = 1;
    l.replication = 2;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_ERR_INVAL);
    l.replication = 1;
    l.cores = 0;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_ERR_INVAL);
    l.cores = 2;
    l.pp = 0;
    cr_assert_eq(plan_prompt(&in, &l, &p), ECS_ERR_INVAL);
    l.batch = 513;
    cr_assert_eq(plan_decode(&in, &l, &p), ECS_ERR_INVAL);
}

/* The page cache of ecs-plan's phase timings: the full model's case of
 * 2026-12-02 (room ~21 GB: the planner's one-process copy 9.7 GB of routed
 * experts resident, the 1-worker copy 9.7 GB, 0.5 GB the planner keeps)
 * must drop the planner's routed pages, the next layout the first one's
 * too; the 4-layer cut's files fit and nothing is dropped. */
Test(plan, pages_dropped_only_when_they_do_not_fit)
{
    const uint64_t G = 1000000000ull;
    plan_pages_t p = {.room = 21 * G, .keep = G / 2, .own_routed = 9700000000ull, .others = 0,
                      .need = 9700000000ull};
    cr_assert_eq(plan_pages_evict(&p), PLAN_EVICT_OWN);
    /* the next layout: the planner's pages gone, the first layout's resident */
    p.own_routed = 0;
    p.others = 9700000000ull;
    cr_assert_eq(plan_pages_evict(&p), PLAN_EVICT_OTHERS);
    /* both over: both dropped */
    p.own_routed = 9700000000ull;
    cr_assert_eq(plan_pages_evict(&p), PLAN_EVICT_OWN | PLAN_EVICT_OTHERS);
    /* dropping the planner's pages is enough: the others stay */
    p.others = G;
    cr_assert_eq(plan_pages_evict(&p), PLAN_EVICT_OWN);
    /* the 4-layer cut: everything fits, nothing dropped */
    plan_pages_t cut = {.room = 21 * G, .keep = G / 10, .own_routed = 1400000000ull,
                        .others = 2 * 1400000000ull, .need = 1400000000ull};
    cr_assert_eq(plan_pages_evict(&cut), 0);
    /* exactly at the fill: fits; one byte over: the planner's pages go */
    plan_pages_t edge = {.room = 10 * G, .keep = G, .own_routed = 4 * G, .need = 4 * G};
    cr_assert_eq(plan_pages_evict(&edge), 0);
    edge.own_routed++;
    cr_assert_eq(plan_pages_evict(&edge), PLAN_EVICT_OWN);
    /* the layout alone exceeds the room: said, with what can be dropped */
    plan_pages_t big = {.room = 10 * G, .keep = G, .own_routed = G, .others = G, .need = 9 * G};
    cr_assert_eq(plan_pages_evict(&big), PLAN_EVICT_OWN | PLAN_EVICT_OTHERS | PLAN_NO_ROOM);
    big.own_routed = big.others = 0;
    cr_assert_eq(plan_pages_evict(&big), PLAN_NO_ROOM);
    /* nothing known about the memory (room 0): anything is over */
    plan_pages_t unknown = {.room = 0, .need = 1};
    cr_assert_eq(plan_pages_evict(&unknown), PLAN_NO_ROOM);
}

Test(plan, a_timing_is_warm_only_with_its_pages_resident_around_it)
{
    cr_assert(plan_phase_warm(1.0, 1.0));
    cr_assert(plan_phase_warm(PLAN_WARM_MIN, 0.999));
    /* the full model's cold timing: copies read in, then evicted while timed */
    cr_assert(!plan_phase_warm(1.0, 0.43));
    cr_assert(!plan_phase_warm(0.43, 1.0));
    cr_assert(!plan_phase_warm(0.97, 1.0));
    cr_assert(!plan_phase_warm(0, 0));
    cr_assert(!plan_phase_warm(NAN, 1.0));
    cr_assert(!plan_phase_warm(1.0, NAN));
    cr_assert(!plan_phase_warm(1.5, 1.0));
}
