/* test_moe.c - the model-free grouped expert FFN (kernels/moe): every
 * pair's output equals one expert applied to one row on its own (batched
 * products are batch-invariant), with and without the interleaved copy,
 * for several quant mixes and thread counts; a caller holding a subset of
 * the experts (a worker) gives the same rows bit for bit; kmoe_sum of rows
 * gathered from several such holders, in any buffer order, equals the
 * one-process sum bit for bit, and so do rows quantized by the caller;
 * bad calls are refused. Links only
 * kernels/ and common/. */
#include <criterion/criterion.h>
#include <malloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "kernels/moe/moe.h"

enum { E = 256, F = 512, X = 8, K = 3, NL = 2 };

static uint64_t rng = 1;

static float urand(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) & 0xFFFFFF) / (float)0x800000 - 1.0f;
}

/* A stacked expert tensor: X * rows_per rows of cols values of type t,
 * random, optionally with its interleaved copy. */
typedef struct {
    kcpu_mat_t m;
    void *data, *r16;
} stack_t;

static stack_t make_stack(ecs_type_t t, int rows_per, int cols, bool copy, float scale)
{
    stack_t s = {0};
    const int64_t nrows = (int64_t)X * rows_per;
    const size_t rb = ecs_row_size(t, cols);
    s.data = malloc((size_t)nrows * rb);
    float *row = malloc((size_t)cols * sizeof *row);
    cr_assert(s.data && row);
    for (int64_t r = 0; r < nrows; r++) {
        for (int c = 0; c < cols; c++)
            row[c] = urand() * scale;
        ecs_quantize_row(t, row, (char *)s.data + (size_t)r * rb, cols);
    }
    free(row);
    s.m = (kcpu_mat_t){.type = t, .ncols = cols, .nrows = nrows, .row_bytes = rb, .data = s.data};
    if (copy && kcpu_r16_fits(t, nrows, cols)) {
        const size_t n = kcpu_r16_bytes(t, nrows, cols);
        s.r16 = aligned_alloc(64, (n + 63) & ~(size_t)63);
        cr_assert(s.r16);
        kcpu_r16_pack(&s.m, 0, nrows, s.r16);
        s.m.r16 = s.r16;
    }
    return s;
}

typedef struct {
    stack_t g[NL], u[NL], d[NL];
    kmoe_expert_t ex[NL][X];
    const kmoe_expert_t *layers[NL + 1]; /* layer NL: no experts */
} weights_t;

static void make_weights(weights_t *w, ecs_type_t tg, ecs_type_t td, bool copy)
{
    rng = 7;
    for (int l = 0; l < NL; l++) {
        w->g[l] = make_stack(tg, F, E, copy, 0.1f);
        w->u[l] = make_stack(tg, F, E, copy, 0.1f);
        w->d[l] = make_stack(td, E, F, copy, 0.1f);
        kmoe_split(&w->g[l].m, &w->u[l].m, &w->d[l].m, X, w->ex[l]);
        w->layers[l] = w->ex[l];
    }
    w->layers[NL] = NULL;
}

static void free_weights(weights_t *w)
{
    for (int l = 0; l < NL; l++) {
        stack_t *s[] = {&w->g[l], &w->u[l], &w->d[l]};
        for (int i = 0; i < 3; i++)
            free(s[i]->data), free(s[i]->r16);
    }
}

/* One expert on one row, by single-row products: the reference. */
static void one_pair(const kmoe_expert_t *x, const float *in, float *out)
{
    float g[F], u[F];
    void *sc = malloc(kcpu_act_bytes(x->gate.type, E, 1) + kcpu_act_bytes(x->down.type, F, 1));
    cr_assert(sc);
    kcpu_matmul(NULL, &x->gate, in, E, 1, g, F, sc);
    kcpu_matmul(NULL, &x->up, in, E, 1, u, F, sc);
    kcpu_swiglu(g, u, F);
    kcpu_matmul(NULL, &x->down, g, F, 1, out, E, sc);
    free(sc);
}

static float *rand_rows(int n)
{
    float *x = malloc((size_t)n * E * sizeof *x);
    cr_assert(x);
    for (size_t i = 0; i < (size_t)n * E; i++)
        x[i] = urand();
    return x;
}

/* ids[t k + j]: distinct per row, spread over the experts. */
static void route(int n, int32_t *ids, float *w)
{
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            ids[t * K + j] = (5 * t + 3 * j + 1) % X;
            w[t * K + j] = 0.5f + 0.25f * urand();
        }
}

static void check_all_slots(ecs_type_t tg, ecs_type_t td, bool copy, int nth, int n)
{
    weights_t w;
    make_weights(&w, tg, td, copy);
    ecs_threadpool_t *tp;
    cr_assert_eq(ecs_threadpool_create(nth, &tp), ECS_OK);
    const kmoe_shape_t s = {.n_embd = E, .n_ff_exp = F, .n_expert = X, .k = K, .max_rows = 64};
    kmoe_t *moe;
    cr_assert_eq(kmoe_new(&s, w.layers, NL + 1, tp, &moe), ECS_OK, "%s", ecs_errmsg());
    float *x = rand_rows(n), wt[64 * K], *out = malloc((size_t)n * E * sizeof *out);
    float *exp_sum = malloc((size_t)n * E * sizeof *exp_sum);
    int32_t ids[64 * K];
    cr_assert(out && exp_sum);
    route(n, ids, wt);
    for (int l = 0; l < NL; l++) {
        cr_assert_eq(kmoe_prepare(moe, l, n, x, n * K, NULL, ids), ECS_OK, "%s", ecs_errmsg());
        kmoe_compute(moe);
        float ref[E];
        kmoe_sum(tp, n, K, E, kmoe_outs(moe), kmoe_where(moe), wt, out);
        for (int t = 0; t < n; t++) {
            float *sum = exp_sum + (size_t)t * E;
            for (int j = 0; j < K; j++) {
                const int p = t * K + j;
                one_pair(&w.ex[l][ids[p]], x + (size_t)t * E, ref);
                const float *got = kmoe_outs(moe) + (size_t)kmoe_where(moe)[p] * E;
                cr_assert_eq(memcmp(got, ref, sizeof ref), 0,
                             "%s/%s copy %d nth %d n %d: layer %d row %d slot %d differs",
                             ecs_type_name(tg), ecs_type_name(td), copy, nth, n, l, t, j);
                for (int c = 0; c < E; c++)
                    sum[c] = j == 0 ? ref[c] * wt[p] : sum[c] + ref[c] * wt[p];
            }
        }
        cr_assert_eq(memcmp(out, exp_sum, (size_t)n * E * sizeof *out), 0, "the sums");
    }
    kmoe_free(moe);
    ecs_threadpool_destroy(tp);
    free(x), free(out), free(exp_sum);
    free_weights(&w);
}

Test(moe, pairs_equal_single_row_products)
{
    static const ecs_type_t mix[][2] = {
        {ECS_TYPE_Q4_K, ECS_TYPE_Q6_K}, {ECS_TYPE_Q8_0, ECS_TYPE_Q8_0},
        {ECS_TYPE_Q4_K, ECS_TYPE_Q5_0}, {ECS_TYPE_F16, ECS_TYPE_F32}};
    for (size_t i = 0; i < sizeof mix / sizeof mix[0]; i++)
        for (int copy = 0; copy < 2; copy++) {
            check_all_slots(mix[i][0], mix[i][1], copy, 2, 1);
            check_all_slots(mix[i][0], mix[i][1], copy, 2, 37);
        }
    check_all_slots(ECS_TYPE_Q4_K, ECS_TYPE_Q6_K, true, 1, 37);
    check_all_slots(ECS_TYPE_Q4_K, ECS_TYPE_Q6_K, true, 3, 64);
}

/* Two holders with disjoint expert sets (even ids, odd ids), each given
 * only its pairs sorted by expert as a worker gets them; the rows they
 * return, put in one buffer in arrival order and summed by kmoe_sum,
 * equal the one-process kmoe's sum bit for bit. */
Test(moe, subsets_and_gathered_sum_equal_one_process)
{
    weights_t w;
    make_weights(&w, ECS_TYPE_Q4_K, ECS_TYPE_Q6_K, true);
    ecs_threadpool_t *tp;
    cr_assert_eq(ecs_threadpool_create(2, &tp), ECS_OK);
    const kmoe_shape_t s = {.n_embd = E, .n_ff_exp = F, .n_expert = X, .k = K, .max_rows = 64};
    const int n = 29, l = 1;
    kmoe_t *full;
    cr_assert_eq(kmoe_new(&s, w.layers, NL, tp, &full), ECS_OK);
    float *x = rand_rows(n), wt[64 * K];
    int32_t ids[64 * K];
    route(n, ids, wt);
    /* rows quantized by the caller (as a wire may carry them): same bits */
    const size_t qb = kcpu_act_row(w.ex[l][0].gate.type, E) * (size_t)n;
    void *xq = malloc(qb);
    float *viaq = malloc((size_t)n * K * E * sizeof *viaq);
    cr_assert(xq && viaq);
    kcpu_quantize_rows(tp, w.ex[l][0].gate.type, x, E, n, E, xq);
    cr_assert_eq(kmoe_prepare_q(full, l, n, xq, NULL, n * K, NULL, ids), ECS_OK, "%s",
                 ecs_errmsg());
    kmoe_compute(full);
    memcpy(viaq, kmoe_outs(full), (size_t)n * K * E * sizeof *viaq);
    cr_assert_eq(kmoe_prepare(full, l, n, x, n * K, NULL, ids), ECS_OK);
    kmoe_compute(full);
    cr_assert_eq(memcmp(viaq, kmoe_outs(full), (size_t)n * K * E * sizeof *viaq), 0,
                 "kmoe_prepare_q vs kmoe_prepare");
    free(xq), free(viaq);
    float *ref = malloc((size_t)n * E * sizeof *ref), *got = malloc((size_t)n * E * sizeof *got);
    float *buf = malloc((size_t)n * K * E * sizeof *buf);
    cr_assert(ref && got && buf);
    kmoe_sum(tp, n, K, E, kmoe_outs(full), kmoe_where(full), wt, ref);

    int32_t where[64 * K], next = 0;
    for (int part = 1; part >= 0; part--) { /* odd holder answers first */
        kmoe_expert_t sub[NL][X];
        const kmoe_expert_t *layers[NL];
        memset(sub, 0, sizeof sub);
        for (int ll = 0; ll < NL; ll++) {
            for (int e = part; e < X; e += 2)
                sub[ll][e] = w.ex[ll][e];
            layers[ll] = sub[ll];
        }
        kmoe_t *h;
        cr_assert_eq(kmoe_new(&s, layers, NL, tp, &h), ECS_OK);
        int32_t prow[64 * K], pexp[64 * K], pidx[64 * K];
        int np = 0;
        for (int e = part; e < X; e += 2)
            for (int p = 0; p < n * K; p++)
                if (ids[p] == e)
                    prow[np] = p / K, pexp[np] = e, pidx[np++] = p;
        cr_assert_eq(kmoe_prepare(h, l, n, x, np, prow, pexp), ECS_OK, "%s", ecs_errmsg());
        kmoe_compute(h);
        for (int q = 0; q < np; q++) {
            cr_assert_eq(kmoe_where(h)[q], q, "pairs sorted by expert come back in order");
            memcpy(buf + (size_t)next * E, kmoe_outs(h) + (size_t)q * E, E * sizeof *buf);
            where[pidx[q]] = next++;
        }
        /* an expert this holder lacks is refused */
        const int32_t r0 = 0, other = 1 - part;
        cr_assert_eq(kmoe_prepare(h, l, n, x, 1, &r0, &other), ECS_ERR_RANGE);
        kmoe_free(h);
    }
    cr_assert_eq(next, n * K);
    kmoe_sum(tp, n, K, E, buf, where, wt, got);
    cr_assert_eq(memcmp(got, ref, (size_t)n * E * sizeof *ref), 0);
    kmoe_free(full);
    ecs_threadpool_destroy(tp);
    free(x), free(ref), free(got), free(buf);
    free_weights(&w);
}

Test(moe, bad_calls_are_refused)
{
    weights_t w;
    make_weights(&w, ECS_TYPE_Q8_0, ECS_TYPE_Q8_0, false);
    kmoe_shape_t s = {.n_embd = E, .n_ff_exp = F, .n_expert = X, .k = K, .max_rows = 4};
    kmoe_t *moe = NULL;
    s.k = X + 1;
    cr_assert_eq(kmoe_new(&s, w.layers, NL, NULL, &moe), ECS_ERR_INVAL);
    s.k = K;
    s.n_ff_exp = F / 2;
    cr_assert_eq(kmoe_new(&s, w.layers, NL, NULL, &moe), ECS_ERR_INVAL, "shape mismatch");
    cr_assert(strstr(ecs_errmsg(), "layer 0 expert 0"), "%s", ecs_errmsg());
    s.n_ff_exp = F;
    cr_assert_eq(kmoe_new(&s, w.layers, NL + 1, NULL, &moe), ECS_OK);
    float *x = rand_rows(4);
    int32_t ids[4 * K] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}, row[2] = {0, 4};
    cr_assert_eq(kmoe_prepare(moe, NL, 4, x, 4 * K, NULL, ids), ECS_ERR_INVAL, "no experts");
    cr_assert_eq(kmoe_prepare(moe, -1, 4, x, 4 * K, NULL, ids), ECS_ERR_INVAL);
    cr_assert_eq(kmoe_prepare(moe, 0, 5, x, 5 * K, NULL, ids), ECS_ERR_INVAL, "over max_rows");
    cr_assert_eq(kmoe_prepare(moe, 0, 4, x, 4 * K - 1, NULL, ids), ECS_ERR_INVAL,
                 "all slots without a row list");
    cr_assert_eq(kmoe_prepare(moe, 0, 4, x, 2, row, ids), ECS_ERR_RANGE, "row 4 of 4");
    ids[5] = X;
    cr_assert_eq(kmoe_prepare(moe, 0, 4, x, 4 * K, NULL, ids), ECS_ERR_RANGE);
    ids[5] = -1;
    cr_assert_eq(kmoe_prepare(moe, 0, 4, x, 4 * K, NULL, ids), ECS_ERR_RANGE);
    /* no pairs: nothing to compute, nothing appended */
    cr_assert_eq(kmoe_prepare(moe, 0, 4, x, 0, row, ids), ECS_OK);
    kcpu_job_t jobs[X];
    kcpu_jobs_t j = {jobs, 0};
    kmoe_gate_up(moe, &j);
    kmoe_down(moe, &j);
    cr_assert_eq(j.n, 0);
    kmoe_free(moe);
    free(x);
    free_weights(&w);
}

/* The shared experts (kmoe_ffn: one SwiGLU FFN on every row) in the
 * regions of a routed call: each row equals the FFN applied to that row
 * on its own, from f32 rows or from the rows quantized by the caller (a
 * worker's payload), whatever the thread count, and the routed pairs
 * beside them are unchanged. */
static void check_shared(ecs_type_t tg, ecs_type_t td, bool copy, int nth, int n)
{
    weights_t w;
    make_weights(&w, tg, td, copy);
    const kmoe_expert_t *sh = &w.ex[1][X - 1]; /* an FFN of F: the test's shared experts */
    ecs_threadpool_t *tp;
    cr_assert_eq(ecs_threadpool_create(nth, &tp), ECS_OK);
    const kmoe_shape_t s = {.n_embd = E, .n_ff_exp = F, .n_expert = X, .k = K, .max_rows = 64};
    kmoe_t *moe;
    kmoe_ffn_t *f;
    cr_assert_eq(kmoe_new(&s, w.layers, NL + 1, tp, &moe), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(kmoe_ffn_new(E, F, 64, tp, &f), ECS_OK, "%s", ecs_errmsg());
    float *x = rand_rows(n), wt[64 * K], ref[E];
    float *out = malloc((size_t)n * E * sizeof *out);
    void *xq = malloc(kcpu_act_bytes(tg, E, n));
    int32_t ids[64 * K];
    cr_assert(out && xq);
    route(n, ids, wt);
    kcpu_quantize_rows(tp, tg, x, E, n, E, xq);
    const ecs_type_t vdt = ecs_type_traits(tg)->vec_dot_type;
    for (int quantized = 0; quantized < 2; quantized++) {
        memset(out, 0, (size_t)n * E * sizeof *out);
        cr_assert_eq(kmoe_prepare(moe, 0, n, x, n * K, NULL, ids), ECS_OK, "%s", ecs_errmsg());
        cr_assert_eq(kmoe_ffn_prepare(f, sh, n, quantized ? NULL : x, quantized ? xq : NULL, vdt,
                                      out), ECS_OK, "%s", ecs_errmsg());
        kcpu_job_t jobs[X + 1];
        kcpu_chunk_t chunks[KCPU_PLAN_CHUNKS(X + 1)];
        kcpu_plan_t plan = {chunks, KCPU_PLAN_CHUNKS(X + 1)};
        kcpu_jobs_t j = {jobs, 0};
        kmoe_ffn_gate_up(f, &j);
        kmoe_gate_up(moe, &j);
        cr_assert_eq(j.jobs[0].kind, KCPU_JOB_SWIGLU, "the shared experts' job comes first");
        kcpu_run_jobs(tp, &plan, jobs, j.n);
        j.n = 0;
        kmoe_ffn_down(f, &j);
        kmoe_down(moe, &j);
        kcpu_run_jobs(tp, &plan, jobs, j.n);
        for (int t = 0; t < n; t++) {
            one_pair(sh, x + (size_t)t * E, ref);
            cr_assert_eq(memcmp(out + (size_t)t * E, ref, sizeof ref), 0,
                         "%s/%s copy %d nth %d n %d quantized %d: shared row %d differs",
                         ecs_type_name(tg), ecs_type_name(td), copy, nth, n, quantized, t);
            for (int k = 0; k < K; k++) {
                const int p = t * K + k;
                one_pair(&w.ex[0][ids[p]], x + (size_t)t * E, ref);
                cr_assert_eq(memcmp(kmoe_outs(moe) + (size_t)kmoe_where(moe)[p] * E, ref,
                                    sizeof ref), 0, "routed pair %d beside the shared", p);
            }
        }
    }
    kmoe_ffn_free(f);
    kmoe_free(moe);
    ecs_threadpool_destroy(tp);
    free(x), free(out), free(xq);
    free_weights(&w);
}

Test(moe, shared_experts_equal_single_row_products)
{
    check_shared(ECS_TYPE_Q4_K, ECS_TYPE_Q6_K, true, 2, 1);
    check_shared(ECS_TYPE_Q4_K, ECS_TYPE_Q6_K, false, 2, 13);
    check_shared(ECS_TYPE_Q8_0, ECS_TYPE_Q8_0, false, 1, 16);
    check_shared(ECS_TYPE_Q4_K, ECS_TYPE_Q5_0, true, 3, 37);
    check_shared(ECS_TYPE_F16, ECS_TYPE_F32, false, 2, 5);
}

Test(moe, shared_experts_bad_calls_are_refused)
{
    weights_t w;
    make_weights(&w, ECS_TYPE_Q8_0, ECS_TYPE_Q8_0, false);
    kmoe_ffn_t *f = NULL;
    cr_assert_eq(kmoe_ffn_new(E, F, KCPU_MAX_BATCH + 1, NULL, &f), ECS_ERR_INVAL);
    cr_assert_null(f);
    cr_assert_eq(kmoe_ffn_new(E, F, 4, NULL, &f), ECS_OK);
    float *x = rand_rows(5), out[5 * E];
    void *q = malloc(kcpu_act_bytes(ECS_TYPE_Q4_K, E, 4));
    cr_assert(q);
    cr_assert_eq(kmoe_ffn_prepare(f, &w.ex[0][0], 5, x, NULL, ECS_TYPE_F32, out), ECS_ERR_RANGE,
                 "over max_rows");
    cr_assert_eq(kmoe_ffn_prepare(f, &w.ex[0][0], 0, x, NULL, ECS_TYPE_F32, out), ECS_ERR_RANGE);
    kmoe_expert_t other = w.ex[0][0];
    other.gate.nrows = F / 2;
    cr_assert_eq(kmoe_ffn_prepare(f, &other, 4, x, NULL, ECS_TYPE_F32, out), ECS_ERR_INVAL,
                 "another shape");
    cr_assert_eq(kmoe_ffn_prepare(f, &w.ex[0][0], 4, NULL, q, ECS_TYPE_Q8_K, out),
                 ECS_ERR_UNSUPPORTED, "rows quantized for another type, no f32 rows");
    cr_assert(strstr(ecs_errmsg(), "q8_K") || strstr(ecs_errmsg(), "Q8_K"), "%s", ecs_errmsg());
    cr_assert_eq(kmoe_ffn_prepare(f, &w.ex[0][0], 4, x, q, ECS_TYPE_Q8_K, out), ECS_OK,
                 "the f32 rows serve another type");
    kmoe_ffn_free(f);
    kmoe_ffn_free(NULL);
    free(x), free(q);
    free_weights(&w);
}

Test(mem, keep_large_keeps_big_blocks_in_the_heap)
{
    /* glibc's defaults would map a 16 MB block (and unmap it on free):
     * after ecs_mem_keep_large it comes from the heap, which keeps it */
#ifdef __SANITIZE_ADDRESS__
    cr_skip_test("AddressSanitizer's allocator replaces glibc's heap (mallopt has no effect)");
#endif
    ecs_mem_keep_large();
    const struct mallinfo2 a = mallinfo2();
    char *volatile p = malloc((size_t)16 << 20); /* volatile: not elided */
    cr_assert_not_null(p);
    p[0] = 1;
    const struct mallinfo2 b = mallinfo2();
    cr_assert_eq(b.hblks, a.hblks, "%zu mapped blocks, was %zu", b.hblks, a.hblks);
    free(p);
    const struct mallinfo2 c = mallinfo2();
    cr_assert_geq(c.arena, (size_t)16 << 20, "heap %zu bytes after free", c.arena);
}
