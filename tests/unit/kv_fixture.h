/* kv_fixture.h - what the KV cache type tests (test_kv_bf16.c,
 * test_kv_q8.c) share: random values for kernel inputs, and whole-model
 * runs of one cache type against another on the same tokens, with the
 * checks every rounded cache must pass against the F32 one. */
#ifndef ECS_TEST_KV_FIXTURE_H
#define ECS_TEST_KV_FIXTURE_H

#include "tests/unit/model_fixture.h"
#include "coordinator/model/model_int.h"

/* U(-1, 1), a fixed sequence (model_fixture.h's generator, seeded). */
FX float frand(void)
{
    if (!rng_state)
        rng_state = 0x9E3779B97F4A7C15ull;
    return urand();
}

/* Decode steps of a whole-model comparison. */
#define N_GEN 24

FX model_t *kv_load(const char *path, int threads)
{
    return load_opts(path, (model_opts_t){.n_ctx = 256, .n_threads = threads});
}

/* Logits of the prompt's rows (one prompt step), then of n_gen decode
 * steps of one row each: the argmax of the last logits when gen is NULL
 * (greedy; the tokens go to out), else gen's tokens (so two caches are
 * compared on the same sequence). Returns (N_PROMPT + n_gen) rows. */
FX float *kv_run(model_t *m, unsigned flags, int n_gen, const int32_t *gen, int32_t *out)
{
    const size_t V = (size_t)model_n_vocab(m);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, 256, flags, &c), ECS_OK, "%s", ecs_errmsg());
    float *l = malloc((N_PROMPT + (size_t)n_gen) * V * sizeof *l);
    cr_assert_not_null(l);
    cr_assert_eq(model_eval(c, PROMPT, N_PROMPT, l, true), ECS_OK, "%s", ecs_errmsg());
    const float *last = l + (N_PROMPT - 1) * V;
    for (int i = 0; i < n_gen; i++) {
        int32_t best = 0;
        for (size_t v = 1; v < V; v++)
            best = last[v] > last[best] ? (int32_t)v : best;
        if (out)
            out[i] = best;
        const int32_t tok = gen ? gen[i] : best;
        float *o = l + (N_PROMPT + (size_t)i) * V;
        cr_assert_eq(model_eval(c, &tok, 1, o, false), ECS_OK, "%s", ecs_errmsg());
        last = o;
    }
    model_ctx_free(c);
    return l;
}

/* x against the F32 cache's logits ref (rows of V): x rounds something,
 * stays within tol of the largest logit, and takes the same argmax
 * wherever ref's best logit leads the next by more than twice the error.
 * Returns the error. */
FX double kv_near(const char *what, const float *ref, const float *x, size_t rows, size_t V,
                  double tol)
{
    const size_t cnt = rows * V;
    const double scale = max_abs(ref, cnt), e = max_diff(x, ref, cnt);
    cr_assert(e > 0, "%s: the cache must round something", what);
    cr_assert(e <= tol * scale, "%s: %g of %g", what, e, scale);
    int firm = 0;
    for (size_t r = 0; r < rows; r++) {
        const float *a = ref + r * V, *b = x + r * V;
        size_t i1 = 0, i2 = 1, jb = 0;
        for (size_t v = 0; v < V; v++) {
            if (a[v] > a[i1])
                i2 = i1, i1 = v;
            else if (v != i1 && a[v] > a[i2])
                i2 = v;
            jb = b[v] > b[jb] ? v : jb;
        }
        if (a[i1] - a[i2] > 2 * e) {
            firm++;
            cr_assert_eq(jb, i1, "%s row %zu: argmax %zu, the F32 cache's %zu", what, r, jb, i1);
        }
    }
    cr_log_info("%s: max |logit| %g, error %.3g (%.2e of it); %d of %zu rows' argmax decided "
                "beyond it, all equal", what, scale, e, e / scale, firm, rows);
    return e;
}

#endif
