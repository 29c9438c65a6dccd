/* test_worker_dev.c - the worker's device path (worker/device.c) on kgpu's
 * host emulation, below the daemon: a call's rows against the CPU shard's
 * (bit for bit when no expert fits the budget, within quantization noise
 * when the device tier computes), the prefetch hint (uploads started,
 * counted, then hit), the VRAM budget (refused below the buffers, never
 * exceeded) and no device allocation per call. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/shard_fixture.h"

typedef struct {
    shard_model_t m; /* the model, every routed pair in m.a */
    shard_t cpu, dev;
    shard_dev_t *d;
    size_t fixed, per;
} fx_t;

/* Both shards hold every routed expert; the device one with `budget`
 * (0: learn the buffer and per-expert sizes with a large budget first). */
static void fx_open(fx_t *x, uint64_t budget)
{
    memset(x, 0, sizeof *x);
    shard_model_open(&x->m);
    cr_assert(x->m.l1 > 0, "the model needs two routed layers");
    uint64_t bytes, ns;
    cr_assert_eq(shard_open(&x->cpu, x->m.f, &x->m.hp), ECS_OK);
    cr_assert_eq(shard_assign(&x->cpu, &x->m.a, 0, x->m.tp, NULL, &bytes, &ns), ECS_OK);
    char info[512];
    if (!budget) { /* a probe: everything fits 1 GiB of emulated VRAM */
        cr_assert_eq(shard_dev_open("emu", 1u << 30, x->m.hp.n_expert, &x->d), ECS_OK, "%s",
                     ecs_errmsg());
        cr_assert_eq(shard_open(&x->dev, x->m.f, &x->m.hp), ECS_OK);
        x->dev.dev = x->d;
        cr_assert_eq(shard_assign(&x->dev, &x->m.a, 0, x->m.tp, NULL, &bytes, &ns), ECS_OK);
        cr_assert_eq(shard_dev_assign(x->d, &x->dev, info, sizeof info), ECS_OK, "%s",
                     ecs_errmsg());
        const char *p = strstr(info, "buffers ");
        cr_assert(p && sscanf(p, "buffers %zu bytes, %zu per expert", &x->fixed, &x->per) == 2,
                  "%s", info);
        return;
    }
    cr_assert_eq(shard_dev_open("emu", budget, x->m.hp.n_expert, &x->d), ECS_OK, "%s",
                 ecs_errmsg());
    cr_assert_eq(shard_open(&x->dev, x->m.f, &x->m.hp), ECS_OK);
    x->dev.dev = x->d;
    cr_assert_eq(shard_assign(&x->dev, &x->m.a, 0, x->m.tp, NULL, &bytes, &ns), ECS_OK);
}

static void fx_close(fx_t *x)
{
    shard_dev_close(x->d);
    shard_close(&x->dev);
    shard_close(&x->cpu);
    shard_model_close(&x->m);
}

/* The sizes of this model's buffers and experts on the device. */
static void sizes(size_t *fixed, size_t *per)
{
    fx_t x;
    fx_open(&x, 0);
    *fixed = x.fixed;
    *per = x.per;
    fx_close(&x);
}

enum { ROWS = 3, MAXE = 4 };
typedef struct {
    uint32_t experts[MAXE], counts[MAXE], rows[ROWS * MAXE], slots[ROWS * MAXE], pf[8];
    float *x;
    wire_call_t c;
} call_t;

/* Rows 0..2 through experts `ex` of `layer` (every row to every expert). */
static void make_call(call_t *k, const arch_hparams_t *hp, int layer, int n, const int *ex)
{
    memset(k, 0, sizeof *k);
    k->x = malloc(sizeof(float) * ROWS * (size_t)hp->n_embd);
    cr_assert(k->x);
    for (int i = 0; i < ROWS * hp->n_embd; i++)
        k->x[i] = sinf(0.37f * (float)i) * 0.5f;
    size_t q = 0;
    for (int i = 0; i < n; i++) {
        k->experts[i] = (uint32_t)ex[i];
        k->counts[i] = ROWS;
        for (int r = 0; r < ROWS; r++, q++) {
            k->rows[q] = (uint32_t)r;
            k->slots[q] = (uint32_t)i;
        }
    }
    k->c = (wire_call_t){.request_id = 1, .layer = (uint32_t)layer, .n_rows = ROWS,
                         .n_embd = (uint32_t)hp->n_embd, .dtype = ECS_TYPE_F32,
                         .k = (uint32_t)hp->n_expert_used, .n_experts = (size_t)n,
                         .experts = k->experts, .expert_counts = k->counts, .n_entries = q,
                         .row_index = k->rows, .slot = k->slots,
                         .result_dtype = ECS_TYPE_F32, .payload = k->x,
                         .payload_bytes = sizeof(float) * ROWS * (size_t)hp->n_embd};
}

/* Runs the call on a shard; the rows in out. */
static void run(shard_t *s, const wire_call_t *c, float *out)
{
    mux_reply_t r = {.status = WIRE_ST_OK, .rows = out,
                     .rows_bytes = c->n_entries * c->n_embd * sizeof(float)};
    shard_call(s, c, &r);
    cr_assert_eq(r.status, WIRE_ST_OK, "%s", r.message);
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(isfinite(a[i]) && isfinite(b[i]));
        m = fmax(m, fabs((double)b[i]));
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    }
    return m > 0 ? d / m : d;
}

Test(worker_dev, buffers_only_is_the_cpu_shard_bit_for_bit)
{
    size_t fixed, per;
    sizes(&fixed, &per);
    fx_t x;
    fx_open(&x, fixed); /* no expert slot: every expert on the host tier */
    char info[512];
    cr_assert_eq(shard_dev_assign(x.d, &x.dev, info, sizeof info), ECS_OK, "%s", ecs_errmsg());
    cr_assert(strstr(info, " 0 of "), "%s", info);
    const int ex[3] = {1, 5, 9};
    call_t k;
    make_call(&k, &x.m.hp, x.m.l1, 3, ex);
    const size_t n = k.c.n_entries * (size_t)x.m.hp.n_embd;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    cr_assert(a && b);
    run(&x.cpu, &k.c, a);
    run(&x.dev, &k.c, b);
    cr_assert_eq(memcmp(a, b, n * sizeof *a), 0, "the host tier must be the CPU worker's code");
    wire_stats_t st = {0};
    shard_dev_stats(x.d, &st);
    cr_assert_eq(st.tier_uses, 3);
    cr_assert_eq(st.tier_cpu, 3);
    free(a);
    free(b);
    free(k.x);
    fx_close(&x);
}

Test(worker_dev, prefetch_hint_budget_and_no_allocation)
{
    size_t fixed, per;
    sizes(&fixed, &per);
    fx_t x;
    const uint64_t budget = fixed + 4 * per + per / 2; /* four slots, and not a fifth */
    fx_open(&x, budget);
    char info[512];
    cr_assert_eq(shard_dev_assign(x.d, &x.dev, info, sizeof info), ECS_OK, "%s", ecs_errmsg());
    cr_assert(strstr(info, " 4 of "), "%s", info);
    uint64_t dev_bytes;
    size_t allocs0, allocs1;
    shard_dev_usage(x.d, &dev_bytes, &allocs0);
    cr_assert_leq(dev_bytes, budget, "%llu bytes of VRAM over a budget of %llu",
                  (unsigned long long)dev_bytes, (unsigned long long)budget);
    wire_stats_t st0 = {0}, st1 = {0}, st2 = {0};
    shard_dev_stats(x.d, &st0);
    cr_assert_eq(st0.tier_slots, 4);
    /* layer l0's call carries the hint for l1's experts 6 and 7 (not resident:
     * the first four experts of l0 are) */
    const int e0[2] = {0, 2}, e1[2] = {6, 7};
    call_t k0, k1;
    make_call(&k0, &x.m.hp, x.m.l0, 2, e0);
    make_call(&k1, &x.m.hp, x.m.l1, 2, e1);
    k0.pf[0] = 6;
    k0.pf[1] = 7;
    k0.c.prefetch_layer = (uint32_t)x.m.l1;
    k0.c.n_prefetch = 2;
    k0.c.prefetch = k0.pf;
    const size_t n = 2 * ROWS * (size_t)x.m.hp.n_embd;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    cr_assert(a && b);
    run(&x.dev, &k0.c, b);
    run(&x.cpu, &k0.c, a);
    const double err0 = rel_err(b, a, n);
    shard_dev_stats(x.d, &st1);
    cr_assert_eq(st1.tier_prefetched, st0.tier_prefetched + 2, "the hint started two uploads");
    cr_assert_eq(st1.tier_hits, 2, "l0's experts 0 and 2 were resident");
    run(&x.dev, &k1.c, b);
    run(&x.cpu, &k1.c, a);
    const double err1 = rel_err(b, a, n);
    shard_dev_stats(x.d, &st2);
    cr_assert_eq(st2.tier_hits, 4, "the prefetched experts were hits");
    cr_assert_eq(st2.tier_prefetch_used, st1.tier_prefetch_used + 2);
    /* f32 activations on the device tier, q8 on the CPU: close, not equal */
    cr_assert(err0 < 0.05 && err1 < 0.05, "relative errors %.3g, %.3g", err0, err1);
    shard_dev_usage(x.d, &dev_bytes, &allocs1);
    cr_assert_eq(allocs1, allocs0, "the calls allocated device memory");
    /* a hint for experts this worker does not hold or a layer out of range is ignored */
    k0.pf[0] = 60000;
    k0.c.n_prefetch = 1;
    run(&x.dev, &k0.c, b);
    k0.c.prefetch_layer = 1000;
    run(&x.dev, &k0.c, b);
    free(a);
    free(b);
    free(k0.x);
    free(k1.x);
    fx_close(&x);
}

Test(worker_dev, budget_below_the_buffers_is_refused)
{
    size_t fixed, per;
    sizes(&fixed, &per);
    fx_t x;
    fx_open(&x, fixed - 1);
    char info[512];
    cr_assert_eq(shard_dev_assign(x.d, &x.dev, info, sizeof info), ECS_ERR_NOMEM);
    cr_assert(strstr(ecs_errmsg(), "activation buffers"), "%s", ecs_errmsg());
    fx_close(&x);
    cr_assert_neq(shard_dev_open("cuda:x", 0, 4, &x.d), ECS_OK);
    cr_assert(strstr(ecs_errmsg(), "want cuda:N"), "%s", ecs_errmsg());
}
