/* test_tier.c - the expert tiers: slot budget, cost line fit and the
 * CPU-versus-stream choice, LRU eviction and pinning, prefetch, statistics,
 * bad input; a random workload checked against the cache's invariants; the
 * executor on the host-emulated device (every result bit-identical to the
 * reference, a VRAM budget below the shard) and, on a GPU, the same
 * workload on the device (skipped by name without one). */
#include <stdio.h>

#include "kernels/tier/tier.h"
#include "tests/unit/gpu_fixture.h"

/* Streaming always pays / never pays. */
static const ktier_cost_t always = {1e9, 1e9, 0, 0, 0};
static const ktier_cost_t never = {0, 0, 1e9, 1e9, 1e9};

static ktier_t *mk(int layers, int experts, int slots, int max_prefetch, ktier_cost_t c)
{
    ktier_opts_t o = {layers, experts, slots, max_prefetch, c};
    ktier_t *t;
    cr_assert_eq(ktier_new(&o, &t), ECS_OK, "%s", ecs_errmsg());
    return t;
}

static void plan(ktier_t *t, int layer, int n, const int32_t *ex, int rows, ktier_place_t *out)
{
    int32_t r[64];
    for (int i = 0; i < n; i++)
        r[i] = rows;
    cr_assert_eq(ktier_plan(t, layer, n, ex, r, out), ECS_OK, "%s", ecs_errmsg());
}

Test(tier, slots_from_budget)
{
    cr_assert_eq(ktier_slots(1000, 100, 300), 3);
    cr_assert_eq(ktier_slots(100, 100, 1), 0);
    cr_assert_eq(ktier_slots(50, 100, 1), 0);
    cr_assert_eq(ktier_slots(1000, 0, 0), 0);
}

Test(tier, cost_fit_and_crossover)
{
    const int rows[] = {1, 8, 64};
    const double us[] = {7, 21, 133}; /* 5 + 2 * rows */
    double a, b;
    cr_assert_eq(ktier_cost_fit(3, rows, us, &a, &b), ECS_OK);
    cr_assert(fabs(a - 5) < 1e-9 && fabs(b - 2) < 1e-9, "fit %g + %g r", a, b);
    const int same[] = {8, 8};
    cr_assert_eq(ktier_cost_fit(2, same, us, &a, &b), ECS_ERR_INVAL);
    const double bad[] = {1, NAN, 3};
    cr_assert_eq(ktier_cost_fit(3, rows, bad, &a, &b), ECS_ERR_INVAL);
    /* CPU 10 + 10 r against upload 100 + GPU 20 + 0.1 r: crossover at 11.2 rows */
    const ktier_cost_t c = {10, 10, 20, 0.1, 100};
    cr_assert(!ktier_stream_pays(&c, 1));
    cr_assert(!ktier_stream_pays(&c, 11));
    cr_assert(ktier_stream_pays(&c, 12));
    cr_assert(ktier_stream_pays(&c, 256));
}

Test(tier, lru_eviction_and_hits)
{
    ktier_t *t = mk(1, 8, 4, 0, always);
    ktier_place_t p[4];
    const int32_t first[] = {0, 1, 2, 3};
    plan(t, 0, 4, first, 1, p);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(p[i].where, KTIER_STREAM);
    const int slot2 = ktier_slot_of(t, 0, 2);
    const int32_t again[] = {1, 0};
    plan(t, 0, 2, again, 1, p);
    cr_assert(p[0].where == KTIER_HIT && p[0].slot == ktier_slot_of(t, 0, 1));
    cr_assert(p[1].where == KTIER_HIT && p[1].slot == ktier_slot_of(t, 0, 0));
    const int32_t miss[] = {5};
    plan(t, 0, 1, miss, 1, p); /* least recently used: expert 2 */
    cr_assert_eq(p[0].where, KTIER_STREAM);
    cr_assert_eq(p[0].slot, slot2);
    cr_assert_eq(ktier_slot_of(t, 0, 2), -1);
    cr_assert_eq(ktier_slot_of(t, 0, 5), slot2);
    ktier_stats_t s;
    ktier_stats(t, &s);
    cr_assert(s.calls == 3 && s.uses == 7 && s.hits == 2 && s.misses == 5 && s.streamed == 5 &&
              s.evicted == 1 && s.cpu == 0);
    cr_assert(fabs(s.hit_rate - 2.0 / 7.0) < 1e-12);
    ktier_free(t);
}

Test(tier, a_call_never_evicts_its_own_experts)
{
    ktier_t *t = mk(1, 8, 2, 0, always);
    ktier_place_t p[3];
    const int32_t ab[] = {0, 1};
    plan(t, 0, 2, ab, 4, p);
    /* C is listed first but the hit on A is placed first: C takes B's slot */
    const int32_t ca[] = {2, 0};
    plan(t, 0, 2, ca, 4, p);
    cr_assert_eq(p[1].where, KTIER_HIT);
    cr_assert_eq(p[0].where, KTIER_STREAM);
    cr_assert_eq(ktier_slot_of(t, 0, 1), -1);
    /* three misses, two slots: the third runs on the CPU */
    const int32_t three[] = {3, 4, 5};
    plan(t, 0, 3, three, 4, p);
    cr_assert(p[0].where == KTIER_STREAM && p[1].where == KTIER_STREAM && p[0].slot != p[1].slot);
    cr_assert_eq(p[2].where, KTIER_CPU);
    cr_assert_eq(p[2].slot, -1);
    ktier_free(t);
}

Test(tier, cpu_misses_leave_the_cache_alone)
{
    ktier_t *t = mk(2, 4, 2, 0, never);
    ktier_place_t p[2];
    const int32_t ex[] = {0, 3};
    plan(t, 1, 2, ex, 64, p);
    cr_assert(p[0].where == KTIER_CPU && p[1].where == KTIER_CPU);
    cr_assert(ktier_slot_of(t, 1, 0) == -1 && ktier_slot_of(t, 1, 3) == -1);
    ktier_free(t);
    t = mk(2, 4, 0, 0, always); /* no VRAM at all */
    plan(t, 0, 2, ex, 64, p);
    cr_assert(p[0].where == KTIER_CPU && p[1].where == KTIER_CPU);
    ktier_stats_t s;
    ktier_stats(t, &s);
    cr_assert(s.cpu == 2 && s.misses == 2 && s.hit_rate == 0);
    ktier_free(t);
}

Test(tier, prefetch_loads_capped_counted_and_pinned)
{
    ktier_t *t = mk(2, 8, 4, 2, always);
    ktier_load_t l[4];
    const int32_t pred[] = {5, 6, 7};
    cr_assert_eq(ktier_prefetch(t, 1, 3, pred, l), 2);
    cr_assert(l[0].layer == 1 && l[0].expert == 5 && l[1].expert == 6 && l[0].slot != l[1].slot);
    cr_assert_eq(ktier_slot_of(t, 1, 5), l[0].slot);
    ktier_place_t p[2];
    const int32_t used[] = {6};
    plan(t, 1, 1, used, 1, p);
    cr_assert(p[0].where == KTIER_HIT && p[0].slot == l[1].slot);
    /* resident: touched, not loaded again */
    cr_assert_eq(ktier_prefetch(t, 1, 1, used, l), 0);
    ktier_stats_t s;
    ktier_stats(t, &s);
    cr_assert(s.prefetched == 2 && s.prefetch_used == 1 && s.hits == 1);
    ktier_free(t);
    /* the call in flight keeps its slots: a prefetch cannot take them */
    t = mk(2, 8, 2, 2, always);
    const int32_t ab[] = {0, 1};
    plan(t, 0, 2, ab, 1, p);
    const int32_t next[] = {2};
    cr_assert_eq(ktier_prefetch(t, 1, 1, next, l), 0);
    cr_assert_eq(ktier_slot_of(t, 0, 0), p[0].slot);
    ktier_free(t);
}

Test(tier, bad_input_changes_nothing)
{
    ktier_t *t = mk(2, 8, 4, 0, always);
    ktier_place_t p[3];
    ktier_load_t l[3];
    int32_t rows[] = {1, 1, 1};
    const int32_t dup[] = {1, 2, 1};
    cr_assert_eq(ktier_plan(t, 0, 3, dup, rows, p), ECS_ERR_INVAL);
    cr_assert(strstr(ecs_errmsg(), "twice"), "%s", ecs_errmsg());
    const int32_t far[] = {1, 8};
    cr_assert_eq(ktier_plan(t, 0, 2, far, rows, p), ECS_ERR_RANGE);
    cr_assert_eq(ktier_plan(t, 2, 1, far, rows, p), ECS_ERR_RANGE);
    rows[0] = 0;
    cr_assert_eq(ktier_plan(t, 0, 1, far, rows, p), ECS_ERR_INVAL);
    cr_assert_eq(ktier_prefetch(t, 0, 2, far, l), -1);
    for (int e = 0; e < 8; e++)
        cr_assert_eq(ktier_slot_of(t, 0, e), -1);
    ktier_stats_t s;
    ktier_stats(t, &s);
    cr_assert(s.uses == 0 && s.prefetched == 0);
    ktier_opts_t o = {0, 8, 4, 0, always};
    ktier_t *u = (ktier_t *)1;
    cr_assert_eq(ktier_new(&o, &u), ECS_ERR_INVAL);
    cr_assert_null(u);
    ktier_free(t);
}

/* Skewed routing (a few hot experts per layer), random row counts, a cost
 * model with a crossover, prefetch of half the next call's experts: after
 * every call the map and the slots agree, the budget holds, and the
 * counters add up. */
Test(tier, random_workload_keeps_invariants)
{
    const int L = 4, X = 32, S = 24;
    const ktier_cost_t c = {10, 10, 20, 0.1, 100};
    ktier_t *t = mk(L, X, S, 4, c);
    uint64_t rng = 99;
    int32_t ex[8], rows[8];
    ktier_place_t p[8];
    ktier_load_t l[8];
    uint64_t uses = 0;
    for (int call = 0; call < 2000; call++) {
        const int layer = call % L, n = 1 + (int)(fx_next(&rng) % 8);
        int k = 0;
        while (k < n) {
            const int e = (int)(fx_next(&rng) % 4 ? fx_next(&rng) % 6 : fx_next(&rng) % X);
            bool dup = false;
            for (int i = 0; i < k; i++)
                dup |= ex[i] == e;
            if (!dup) {
                ex[k] = e;
                rows[k++] = 1 + (int)(fx_next(&rng) % 32);
            }
        }
        cr_assert_eq(ktier_plan(t, layer, n, ex, rows, p), ECS_OK, "%s", ecs_errmsg());
        uses += (uint64_t)n;
        for (int i = 0; i < n; i++) {
            if (p[i].where == KTIER_CPU)
                continue;
            cr_assert(p[i].slot >= 0 && p[i].slot < S);
            cr_assert_eq(ktier_slot_of(t, layer, ex[i]), p[i].slot);
            for (int j = 0; j < i; j++)
                cr_assert(p[j].where == KTIER_CPU || p[j].slot != p[i].slot);
            if (p[i].where == KTIER_STREAM)
                cr_assert(ktier_stream_pays(&c, rows[i]));
        }
        const int32_t pred[] = {(int32_t)(fx_next(&rng) % 6), (int32_t)(6 + fx_next(&rng) % 6)};
        const int nl = ktier_prefetch(t, (layer + 1) % L, 2, pred, l);
        cr_assert(nl >= 0 && nl <= 2);
        for (int i = 0; i < n; i++) /* the call's experts survived the prefetch */
            if (p[i].where != KTIER_CPU)
                cr_assert_eq(ktier_slot_of(t, layer, ex[i]), p[i].slot);
    }
    int resident = 0;
    for (int la = 0; la < L; la++)
        for (int e = 0; e < X; e++)
            resident += ktier_slot_of(t, la, e) >= 0;
    cr_assert(resident <= S);
    ktier_stats_t s;
    ktier_stats(t, &s);
    cr_assert(s.uses == uses && s.hits + s.misses == uses && s.streamed + s.cpu == s.misses);
    cr_assert(s.hits > 0 && s.streamed > 0 && s.cpu > 0 && s.prefetch_used > 0);
    ktier_free(t);
}

/* ---- the executor ---- */

typedef struct {
    fx_shard_t *layers;
} shard_ctx_t;

static ecs_err_t shard_expert(void *ctx, int layer, int e, ktier_expert_t *out)
{
    const fx_shard_t *s = &((shard_ctx_t *)ctx)->layers[layer];
    const kgpu_seg_t g = fx_seg(s, e, 0, 0);
    *out = (ktier_expert_t){s->tg, s->tu, s->td, g.gate, g.up, g.down};
    return ECS_OK;
}

#define TL 3   /* layers */
#define TX 12  /* experts per layer: the shard */
#define TS 9   /* VRAM slots: a quarter of the shard */

/* Runs 40 layer calls through ex (device g) and compares every output with
 * kgpu_ffn_ref: bit for bit when exact (emulation), else within GPU_TOL. */
static void run_tiered(kgpu_t *g, bool exact, const char *label)
{
    const int E = 256, F = 256, R = 64;
    fx_shard_t layers[TL];
    for (int la = 0; la < TL; la++)
        layers[la] = fx_shard(ECS_TYPE_Q4_K, ECS_TYPE_Q4_K, la == 1 ? ECS_TYPE_Q8_0 : ECS_TYPE_Q6_K,
                              E, F, TX, 50 + la);
    shard_ctx_t sc = {layers};
    size_t slot = 0;
    for (int la = 0; la < TL; la++)
        slot = slot > layers[la].bg + layers[la].bu + layers[la].bd
                   ? slot
                   : layers[la].bg + layers[la].bu + layers[la].bd;
    ktier_exec_opts_t o = {E, F, R, 8, slot, shard_expert, NULL, &sc};
    /* a VRAM budget for TS slots and a bit: what fits is TS slots */
    const size_t budget = ktier_exec_fixed_bytes(&o) + TS * slot + slot / 2;
    cr_assert_eq(ktier_slots(budget, ktier_exec_fixed_bytes(&o), slot), TS);
    /* streaming pays from 6 rows up (rows per expert: 1..9) */
    ktier_t *t = mk(TL, TX, TS, 4, (ktier_cost_t){10, 10, 5, 0.5, 50});
    ktier_exec_t *ex;
    size_t n0, b0, n1, b1;
    kgpu_alloc_stats(g, &n0, &b0);
    cr_assert_eq(ktier_exec_new(g, t, &o, &ex), ECS_OK, "%s", ecs_errmsg());
    kgpu_alloc_stats(g, &n1, &b1);
    cr_assert(b1 - b0 <= budget, "executor took %zu bytes of VRAM, budget %zu", b1 - b0, budget);
    float *x = fx_acts(R, E, 7), *h = fx_alloc(sizeof(float) * R * F);
    float *y = fx_alloc(sizeof(float) * R * E), *yr = fx_alloc(sizeof(float) * R * E);
    uint64_t rng = 5;
    int32_t ex_ids[8], row0[8], nr[8];
    kgpu_seg_t segs[8];
    double worst = 0;
    for (int call = 0; call < 40; call++) {
        const int la = call % TL, n = 2 + (int)(fx_next(&rng) % 6);
        int k = 0, rows = 0;
        while (k < n) {
            const int e = (int)(fx_next(&rng) % 3 ? fx_next(&rng) % 5 : fx_next(&rng) % TX);
            bool dup = false;
            for (int i = 0; i < k; i++)
                dup |= ex_ids[i] == e;
            if (dup)
                continue;
            ex_ids[k] = e;
            nr[k] = 1 + (int)(fx_next(&rng) % 9);
            row0[k] = rows;
            rows += nr[k];
            segs[k] = fx_seg(&layers[la], e, row0[k], nr[k]);
            k++;
        }
        cr_assert_eq(ktier_exec_call(ex, la, n, ex_ids, row0, nr, rows, x, y), ECS_OK, "%s",
                     ecs_errmsg());
        const int32_t pred[] = {(int32_t)(fx_next(&rng) % 5), (int32_t)(fx_next(&rng) % TX)};
        cr_assert_eq(ktier_exec_prefetch(ex, (la + 1) % TL, 2, pred), ECS_OK, "%s",
                     ecs_errmsg());
        const fx_shard_t *s = &layers[la];
        kgpu_ffn_t f = {s->tg, s->tu, s->td, E, F, segs, n, rows, x, h, yr};
        cr_assert_eq(kgpu_ffn_ref(&f), ECS_OK);
        if (exact) {
            cr_assert(memcmp(y, yr, sizeof(float) * rows * E) == 0, "call %d differs", call);
        } else {
            const double err = fx_rel_err(y, yr, (size_t)rows * E);
            cr_assert(err <= GPU_TOL, "call %d: relative error %.3g", call, err);
            worst = fmax(worst, err);
        }
    }
    size_t n2, b2;
    kgpu_alloc_stats(g, &n2, &b2);
    cr_assert(n2 == n1 && b2 == b1, "calls allocated: %zu -> %zu allocations", n1, n2);
    ktier_stats_t st;
    ktier_stats(t, &st);
    cr_assert(st.hits + st.misses == st.uses && st.hits > 0 && st.streamed > 0 && st.cpu > 0);
    fprintf(stderr,
            "CHECK %s: %d of %d experts fit (%.2f of %.2f MiB VRAM budget used, no allocation "
            "after start-up), %llu uses: hit rate %.1f%%, %llu streamed, %llu on CPU, %llu "
            "prefetched (%llu used), max rel err %.2e\n",
            label, TS, TL * TX, (double)(b1 - b0) / (1 << 20), (double)budget / (1 << 20),
            (unsigned long long)st.uses, 100 * st.hit_rate,
            (unsigned long long)st.streamed, (unsigned long long)st.cpu,
            (unsigned long long)st.prefetched, (unsigned long long)st.prefetch_used, worst);
    if (!exact) { /* what the cost model measures here (the CPU tier is the f32 reference) */
        ktier_cost_t c;
        cr_assert_eq(ktier_exec_calibrate(ex, 0, 0, &c), ECS_OK, "%s", ecs_errmsg());
        fprintf(stderr, "CHECK gpu_calibrate %dx%d q4_K/q6_K: cpu %.1f + %.2f us/row, gpu %.1f + "
                "%.2f us/row, upload %.1f us\n", E, F, c.cpu_us0, c.cpu_us_row, c.gpu_us0,
                c.gpu_us_row, c.upload_us);
    }
    ktier_exec_free(ex);
    ktier_free(t);
    for (int la = 0; la < TL; la++)
        fx_shard_free(&layers[la]);
    free(x);
    free(h);
    free(y);
    free(yr);
}

Test(tier_exec, emulated_budget_below_shard_exact)
{
    kgpu_opts_t o = {.device = 0, .max_segs = 8, .emulate = true};
    kgpu_t *g;
    cr_assert_eq(kgpu_open(&o, &g), ECS_OK);
    run_tiered(g, true, "tier_emulated");
    kgpu_close(g);
}

Test(tier_exec, bad_calls_are_refused)
{
    kgpu_opts_t go = {.device = 0, .max_segs = 2, .emulate = true};
    kgpu_t *g;
    cr_assert_eq(kgpu_open(&go, &g), ECS_OK);
    fx_shard_t s = fx_shard(ECS_TYPE_Q8_0, ECS_TYPE_Q8_0, ECS_TYPE_Q8_0, 64, 64, 2, 1);
    shard_ctx_t sc = {&s};
    ktier_t *t = mk(1, 2, 1, 0, always);
    ktier_exec_opts_t o = {64, 64, 4, 3, s.bg + s.bu + s.bd - 1, shard_expert, NULL, &sc};
    ktier_exec_t *ex;
    /* more experts per call than the device takes segments */
    cr_assert_eq(ktier_exec_new(g, t, &o, &ex), ECS_ERR_INVAL);
    cr_assert(strstr(ecs_errmsg(), "segments"), "%s", ecs_errmsg());
    o.max_experts = 2;
    cr_assert_eq(ktier_exec_new(g, t, &o, &ex), ECS_OK);
    float *x = fx_acts(4, 64, 1), *y = fx_alloc(sizeof(float) * 4 * 64);
    const int32_t e[] = {0, 1}, r0[] = {0, 2}, nr[] = {2, 3};
    cr_assert_eq(ktier_exec_call(ex, 0, 2, e, r0, nr, 4, x, y), ECS_ERR_RANGE); /* rows 2..4 */
    const int32_t nr_ok[] = {2, 2};
    /* slots one byte too small for an expert */
    cr_assert_eq(ktier_exec_call(ex, 0, 2, e, r0, nr_ok, 4, x, y), ECS_ERR_RANGE);
    cr_assert(strstr(ecs_errmsg(), "needs"), "%s", ecs_errmsg());
    cr_assert_eq(ktier_slot_of(t, 0, 0), -1); /* nothing half-loaded stays mapped */
    ktier_exec_free(ex);
    ktier_free(t);
    kgpu_close(g);
    fx_shard_free(&s);
    free(x);
    free(y);
}

Test(tier_exec, gpu_budget_below_shard)
{
    kgpu_opts_t o = {.device = 0, .max_segs = 8};
    kgpu_t *g;
    if (kgpu_open(&o, &g) != ECS_OK)
        cr_skip_test("%s", ecs_errmsg());
    run_tiered(g, false, "gpu_tiered");
    kgpu_close(g);
}
