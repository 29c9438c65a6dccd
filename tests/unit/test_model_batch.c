/* test_model_batch.c - paths through the model that must give the same
 * logits: the absorbed MLA path against the expanded one, prompt steps over
 * a latent cache at any cut, batched against token-by-token evaluation (also
 * across the 512-row step and at an odd width), multi-sequence steps, rows
 * without logits, truncation, and F32 KV caches. */
#include "tests/unit/model_fixture.h"

/* ------------------------------------------------------- MLA equivalence */

/* The latent cache in both forms (absorbed throughout; the default, whose
 * prompt steps expand it) against the expanded cache. */
static void check_absorbed_vs_expanded(model_t *m, const int32_t *toks, int n, double tol_rel)
{
    const size_t cnt = (size_t)n * model_n_vocab(m);
    float *a = eval_all(m, MODEL_CTX_MLA_ABSORBED, toks, n);
    float *b = eval_all(m, MODEL_CTX_MLA_EXPANDED, toks, n);
    float *c = eval_all(m, 0, toks, n);
    const double d = max_diff(a, b, cnt), scale = max_abs(b, cnt);
    cr_assert(d <= tol_rel * scale, "absorbed vs expanded: max diff %g (max |logit| %g)", d, scale);
    cr_assert(max_diff(c, b, cnt) <= tol_rel * scale, "latent, expanded prompt vs expanded: %g",
              max_diff(c, b, cnt));
    cr_assert(max_diff(c, a, cnt) <= tol_rel * scale, "latent, expanded prompt vs absorbed: %g",
              max_diff(c, a, cnt));
    cr_assert(max_diff(c, a, cnt) > 0, "the prompt must not have run absorbed");
    free(a), free(b), free(c);
}

Test(mla, absorbed_equals_expanded_f32)
{
    enum { N = MODEL_MLA_EXPAND_ROWS + 36 };
    int32_t toks[N];
    spec_t s = ds2_spec();
    random_tokens(toks, N, s.n_vocab, 3);
    model_t *m = load_spec(&s, 128);
    /* F32 weights: no activation quantization, only the F16 caches differ */
    check_absorbed_vs_expanded(m, toks, N, 2e-3);
    model_free(m);
    s.q_lora = 0; /* V2-Lite: single attn_q */
    m = load_spec(&s, 128);
    cr_assert_eq(model_hparams(m)->q_lora_rank, 0);
    check_absorbed_vs_expanded(m, toks, N, 2e-3);
    model_free(m);
}

Test(mla, absorbed_close_to_expanded_q8)
{
    enum { N = MODEL_MLA_EXPAND_ROWS + 4 };
    int32_t toks[N];
    model_t *m = load(DS2_Q8, 128);
    random_tokens(toks, N, model_n_vocab(m), 5);
    const size_t cnt = (size_t)N * model_n_vocab(m);
    float *a = eval_all(m, MODEL_CTX_MLA_ABSORBED, toks, N);
    float *b = eval_all(m, MODEL_CTX_MLA_EXPANDED, toks, N);
    float *c = eval_all(m, 0, toks, N);
    /* Q8_0 activations are quantized at different points, and the absorbed
     * form reads W_k requantized (transposed) to Q8_0: engine-level noise
     * that grows with the context (0.043 at 20 positions, 0.051 at 68) */
    cr_assert(max_diff(a, b, cnt) < 0.08, "max diff %g", max_diff(a, b, cnt));
    cr_assert(mean_diff(a, b, cnt) < 0.01, "mean diff %g", mean_diff(a, b, cnt));
    /* the expanded prompt quantizes c from the F16 latent, the expanded
     * cache from F32: the same noise again */
    cr_assert(max_diff(c, b, cnt) < 0.08, "expanded prompt vs expanded cache %g",
              max_diff(c, b, cnt));
    cr_assert(mean_diff(c, b, cnt) < 0.01, "mean diff %g", mean_diff(c, b, cnt));
    cr_assert(max_diff(c, a, cnt) < 0.08, "expanded prompt vs absorbed %g", max_diff(c, a, cnt));
    cr_assert(mean_diff(c, a, cnt) < 0.01, "mean diff %g", mean_diff(c, a, cnt));
    cr_assert(max_diff(c, a, cnt) > 0, "the prompt must not have run absorbed");
    free(a), free(b), free(c);
    model_free(m);
}

/* Logits of every position with the tokens fed in steps of cuts[0],
 * cuts[1], ... (cycling, the last step takes what is left). */
static float *eval_steps(model_t *m, unsigned flags, const int32_t *toks, int n, const int *cuts,
                         int n_cuts)
{
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, model_n_ctx_max(m), flags, &c), ECS_OK, "%s", ecs_errmsg());
    const size_t V = (size_t)model_n_vocab(m);
    float *l = malloc((size_t)n * V * sizeof *l);
    cr_assert_not_null(l);
    for (int s = 0, i = 0; s < n; i++) {
        const int k = cuts[i % n_cuts] < n - s ? cuts[i % n_cuts] : n - s;
        cr_assert_geq(k, MODEL_MLA_EXPAND_ROWS, "every step must expand");
        cr_assert_eq(model_eval(c, toks + s, k, l + s * V, true), ECS_OK, "%s", ecs_errmsg());
        s += k;
    }
    model_ctx_free(c);
    return l;
}

/* Every cut of toks into steps of at least MODEL_MLA_EXPAND_ROWS rows gives the
 * logits of the whole prompt in one step (or in MODEL_MAX_BATCH steps),
 * bit for bit. */
static void check_cuts(model_t *m, unsigned flags, const int32_t *toks, int n, const int *cuts,
                       const int *n_cuts, int n_sets)
{
    const size_t cnt = (size_t)n * model_n_vocab(m);
    float *ref = eval_all(m, flags, toks, n);
    for (int i = 0, o = 0; i < n_sets; o += n_cuts[i++]) {
        float *l = eval_steps(m, flags, toks, n, cuts + o, n_cuts[i]);
        cr_assert_eq(max_diff(ref, l, cnt), 0.0, "flags %u, cut set %d: %g", flags, i,
                     max_diff(ref, l, cnt));
        free(l);
    }
    free(ref);
}

Test(mla, prompt_steps_do_not_change_logits)
{
    enum { N = 3 * MODEL_MLA_EXPAND_ROWS + 8, E = MODEL_MLA_EXPAND_ROWS };
    int32_t toks[N];
    spec_t s = ds2_spec();
    random_tokens(toks, N, s.n_vocab, 8);
    model_t *m = load_spec(&s, N + 8);
    const int cuts[] = {E, E + 6, E + 2, N / 2, E + 4, E, E, E + 8};
    const int n_cuts[] = {3, 1, 1, 3};
    check_cuts(m, 0, toks, N, cuts, n_cuts, 4);
    check_cuts(m, MODEL_CTX_KV_F32, toks, N, cuts, n_cuts, 4);
    model_free(m);

    m = load(DS2_Q8, N + 8);
    random_tokens(toks, N, model_n_vocab(m), 9);
    const int q_cuts[] = {E, E + 8, N / 2, E + 3};
    const int q_n[] = {2, 1, 1};
    check_cuts(m, 0, toks, N, q_cuts, q_n, 3);
    model_free(m);
}

Test(mla, prompt_steps_across_expansion_blocks)
{
    /* 600 positions: the expansion runs in blocks of MODEL_MAX_BATCH rows;
     * model_eval cuts 512 + 88, the sets below elsewhere. 1 and 2 threads
     * agree (the expansion's row work goes to the pool in big blocks). */
    enum { N = 600 };
    static int32_t toks[N];
    spec_t s = ds2_spec();
    random_tokens(toks, N, s.n_vocab, 13);
    model_t *m = load_spec(&s, N + 8);
    const int cuts[] = {100, 250, 250, 300, MODEL_MLA_EXPAND_ROWS, 236};
    const int n_cuts[] = {3, 3};
    check_cuts(m, 0, toks, N, cuts, n_cuts, 2);
    float *two = eval_all(m, 0, toks, N);
    model_free(m);
    m = load_spec_threads(&s, N + 8, 1);
    float *one = eval_all(m, 0, toks, N);
    cr_assert_eq(max_diff(one, two, (size_t)N * s.n_vocab), 0.0, "1 vs 2 threads");
    free(one), free(two);
    model_free(m);
}

Test(mla, absorbed_flag)
{
    model_t *m = load(DS2_Q8, 64);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, 16, MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_F32, &c), ECS_OK);
    model_ctx_free(c);
    cr_assert_eq(model_ctx_new(m, 16, 1u << 7, &c), ECS_ERR_INVAL, "unknown flag");
    cr_assert_eq(model_ctx_bytes(m, 16, MODEL_CTX_MLA_ABSORBED), model_ctx_bytes(m, 16, 0),
                 "same latent cache");
    model_free(m);
}

/* ------------------------------------------------ batched vs incremental */

static void check_batched(model_t *m, unsigned flags, const int32_t *toks, int n, double tol)
{
    const size_t cnt = (size_t)n * model_n_vocab(m);
    float *a = eval_all(m, flags, toks, n);
    float *b = eval_one_by_one(m, flags, toks, n);
    const double d = max_diff(a, b, cnt);
    cr_assert(d <= tol, "batched vs one by one: max diff %g", d);
    free(a);
    free(b);
}

Test(batch, prefill_equals_token_by_token_ds2)
{
    model_t *m = load(DS2_Q8, 64);
    check_batched(m, MODEL_CTX_MLA_ABSORBED, PROMPT, N_PROMPT, 1e-4);
    check_batched(m, MODEL_CTX_MLA_EXPANDED, PROMPT, N_PROMPT, 1e-4);
    /* default: the prompt step expands, one-by-one decode is absorbed; as
     * close as the two forms (absorbed_close_to_expanded_q8) */
    check_batched(m, 0, PROMPT, N_PROMPT, 0.05);
    model_free(m);
}

Test(batch, prefill_equals_token_by_token_qwen3moe)
{
    model_t *m = load(QWEN_Q8, 64);
    cr_assert_eq(model_hparams(m)->arch, ARCH_QWEN3MOE);
    check_batched(m, 0, PROMPT, N_PROMPT, 1e-4);
    model_free(m);
}

Test(batch, longer_than_one_step)
{
    /* two steps: MODEL_MAX_BATCH rows, then the rest */
    enum { N = MODEL_MAX_BATCH + 88 };
    static int32_t toks[N];
    spec_t s = qwen_spec();
    random_tokens(toks, N, s.n_vocab, 11);
    model_t *m = load_spec(&s, N + 8);
    check_batched(m, 0, toks, N, 1e-4);
    model_free(m);
    s = ds2_spec(); /* latent attention over a whole step, F32 cache */
    random_tokens(toks, N, s.n_vocab, 12);
    m = load_spec(&s, N + 8);
    check_batched(m, MODEL_CTX_KV_F32 | MODEL_CTX_MLA_ABSORBED, toks, N, 1e-4);
    /* expanded prompt steps vs absorbed decode: F32 rounding only */
    check_batched(m, MODEL_CTX_KV_F32, toks, N, 1e-4);
    model_free(m);
}

Test(batch, variants_f32)
{
    enum { N = MODEL_MLA_EXPAND_ROWS + 8 };
    int32_t toks[N];
    spec_t s = ds2_spec();
    s.tied = true;
    s.gating = 2;
    s.groups = 4;
    s.groups_used = 2;
    s.bias = true;
    s.norm = true;
    s.scale = 2.5f;
    s.n_shared = 0;
    random_tokens(toks, N, s.n_vocab, 5);
    model_t *m = load_spec(&s, N + 8);
    const arch_hparams_t *hp = model_hparams(m);
    cr_assert(hp->tied_output);
    cr_assert_eq(model_weights(m)->output.data, model_weights(m)->token_embd.data);
    cr_assert_eq(hp->gating, ARCH_GATING_SIGMOID);
    cr_assert_eq(hp->n_expert_groups, 4);
    cr_assert_not_null(model_weights(m)->layers[1].exp_probs_b);
    cr_assert_eq(hp->n_ff_shexp, 0);
    check_batched(m, MODEL_CTX_MLA_ABSORBED, toks, N, 1e-4);
    check_absorbed_vs_expanded(m, toks, N, 2e-3);
    model_free(m);
}

Test(batch, multi_sequence_step)
{
    model_t *m = load(QWEN_Q8, 64);
    const int V = model_n_vocab(m);
    model_ctx_t *c1, *c2;
    cr_assert_eq(model_ctx_new(m, 64, 0, &c1), ECS_OK);
    cr_assert_eq(model_ctx_new(m, 64, 0, &c2), ECS_OK);
    float *ref1 = eval_all(m, 0, PROMPT, 6);
    float *ref2 = eval_all(m, 0, PROMPT + 8, 5);
    /* interleave the two prompts in one step; logits for each last token */
    model_row_t rows[11];
    int r = 0;
    for (int i = 0; i < 6; i++) {
        rows[r++] = (model_row_t){c1, PROMPT[i], i == 5};
        if (i < 5)
            rows[r++] = (model_row_t){c2, PROMPT[8 + i], i == 4};
    }
    float *out = malloc(2 * (size_t)V * sizeof *out);
    cr_assert_eq(model_eval_batch(m, rows, r, out), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_ctx_n_past(c1), 6);
    cr_assert_eq(model_ctx_n_past(c2), 5);
    /* row order: c2's last row (index 9) precedes c1's (index 10) */
    cr_assert(max_diff(out, ref2 + 4 * (size_t)V, V) <= 1e-4);
    cr_assert(max_diff(out + V, ref1 + 5 * (size_t)V, V) <= 1e-4);
    free(out), free(ref1), free(ref2);
    model_ctx_free(c1);
    model_ctx_free(c2);
    model_free(m);
}

Test(batch, multi_sequence_step_ds2)
{
    /* c1 (N1 rows) expands, c2 (3 rows) and c3 (5 rows, absorbed flag) run
     * absorbed, gathered: each as it would alone */
    enum { N1 = MODEL_MLA_EXPAND_ROWS + 2 };
    model_t *m = load(DS2_Q8, 96);
    const size_t V = (size_t)model_n_vocab(m);
    int32_t toks[N1];
    random_tokens(toks, N1, (int)V, 21);
    model_ctx_t *c1, *c2, *c3;
    cr_assert_eq(model_ctx_new(m, 96, 0, &c1), ECS_OK);
    cr_assert_eq(model_ctx_new(m, 96, 0, &c2), ECS_OK);
    cr_assert_eq(model_ctx_new(m, 96, MODEL_CTX_MLA_ABSORBED, &c3), ECS_OK);
    float *ref1 = eval_all(m, 0, toks, N1);
    float *ref2 = eval_all(m, 0, PROMPT + 8, 3);
    float *ref3 = eval_all(m, MODEL_CTX_MLA_ABSORBED, PROMPT + 12, 5);
    model_row_t rows[N1 + 8];
    int r = 0;
    for (int i = 0; i < N1; i++) {
        rows[r++] = (model_row_t){c1, toks[i], true};
        if (i < 3)
            rows[r++] = (model_row_t){c2, PROMPT[8 + i], true};
        if (i < 5)
            rows[r++] = (model_row_t){c3, PROMPT[12 + i], true};
    }
    float *out = malloc((size_t)r * V * sizeof *out);
    cr_assert_eq(model_eval_batch(m, rows, r, out), ECS_OK, "%s", ecs_errmsg());
    int i1 = 0, i2 = 0, i3 = 0;
    for (int i = 0; i < r; i++) {
        const float *o = out + (size_t)i * V;
        if (rows[i].ctx == c1)
            cr_assert_eq(max_diff(o, ref1 + V * i1++, V), 0.0, "c1 row %d", i);
        else if (rows[i].ctx == c2)
            cr_assert_eq(max_diff(o, ref2 + V * i2++, V), 0.0, "c2 row %d", i);
        else
            cr_assert_eq(max_diff(o, ref3 + V * i3++, V), 0.0, "c3 row %d", i);
    }
    free(out), free(ref1), free(ref2), free(ref3);
    model_ctx_free(c1), model_ctx_free(c2), model_ctx_free(c3);
    model_free(m);
}

/* The last layer runs in full only for the rows that want logits (the
 * others store their K/V): the last row's logits, and the next token's
 * after it, must be those of a step where every row wants logits, bit for
 * bit; for prompts of one step and of two (the first wants none). */
static void check_last_row_only(model_t *m, unsigned flags, const int32_t *toks, int n)
{
    const size_t V = (size_t)model_n_vocab(m);
    float *all = malloc((size_t)(n + 1) * V * sizeof *all), *last = malloc(2 * V * sizeof *last);
    cr_assert(all && last);
    model_ctx_t *a, *b;
    cr_assert_eq(model_ctx_new(m, model_n_ctx_max(m), flags, &a), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_ctx_new(m, model_n_ctx_max(m), flags, &b), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_eval(a, toks, n, all, true), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_eval(b, toks, n, last, false), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(max_diff(last, all + (size_t)(n - 1) * V, V), 0.0, "flags %u, last row: %g",
                 flags, max_diff(last, all + (size_t)(n - 1) * V, V));
    cr_assert_eq(model_eval(a, toks, 1, all + (size_t)n * V, false), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_eval(b, toks, 1, last + V, false), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(max_diff(last + V, all + (size_t)n * V, V), 0.0, "flags %u, next token: %g",
                 flags, max_diff(last + V, all + (size_t)n * V, V));
    model_ctx_free(a), model_ctx_free(b);
    free(all), free(last);
}

Test(batch, last_layer_only_for_rows_with_logits)
{
    enum { N = MODEL_MAX_BATCH + 40 };
    static int32_t toks[N];
    model_t *m = load(DS2_Q8, N + 8);
    random_tokens(toks, N, model_n_vocab(m), 31);
    const unsigned flags[] = {0, MODEL_CTX_MLA_EXPANDED, MODEL_CTX_MLA_ABSORBED, MODEL_CTX_KV_F32};
    for (int f = 0; f < 4; f++) {
        check_last_row_only(m, flags[f], toks, MODEL_MLA_EXPAND_ROWS + 3);
        check_last_row_only(m, flags[f], toks, 7);
    }
    check_last_row_only(m, 0, toks, N);
    model_free(m);
    m = load(QWEN_Q8, 64);
    check_last_row_only(m, 0, toks, 40);
    model_free(m);
}

/* A step whose rows want logits here and there: each as in a step where
 * all want them (the expanded sequence stays expanded in the last layer). */
Test(batch, some_rows_with_logits_ds2)
{
    enum { N1 = MODEL_MLA_EXPAND_ROWS + 6 };
    model_t *m = load(DS2_Q8, 96);
    const size_t V = (size_t)model_n_vocab(m);
    int32_t toks[N1];
    random_tokens(toks, N1, (int)V, 23);
    float *ref1 = eval_all(m, 0, toks, N1), *ref2 = eval_all(m, 0, PROMPT, 4);
    model_ctx_t *c1, *c2;
    cr_assert_eq(model_ctx_new(m, 96, 0, &c1), ECS_OK);
    cr_assert_eq(model_ctx_new(m, 96, 0, &c2), ECS_OK);
    model_row_t rows[N1 + 4];
    int r = 0, want[4], w = 0;
    for (int i = 0; i < N1; i++) {
        const bool out1 = i == 5 || i == N1 - 1;
        if (out1)
            want[w++] = i;
        rows[r++] = (model_row_t){c1, toks[i], out1};
        if (i < 4) {
            if (i == 2)
                want[w++] = 1000 + i;
            rows[r++] = (model_row_t){c2, PROMPT[i], i == 2};
        }
    }
    float *out = malloc((size_t)w * V * sizeof *out);
    cr_assert_not_null(out);
    cr_assert_eq(model_eval_batch(m, rows, r, out), ECS_OK, "%s", ecs_errmsg());
    for (int j = 0; j < w; j++) {
        const float *ref = want[j] >= 1000 ? ref2 + V * (size_t)(want[j] - 1000)
                                           : ref1 + V * (size_t)want[j];
        cr_assert_eq(max_diff(out + V * (size_t)j, ref, V), 0.0, "output %d", j);
    }
    free(out), free(ref1), free(ref2);
    model_ctx_free(c1), model_ctx_free(c2);
    model_free(m);
}

Test(batch, truncate_and_continue)
{
    model_t *m = load(DS2_Q8, 64);
    const size_t V = (size_t)model_n_vocab(m);
    float *ref = eval_all(m, 0, PROMPT, 12);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, 64, 0, &c), ECS_OK);
    float *l = malloc(V * sizeof *l);
    int32_t other[5] = {17, 18, 19, 20, 21};
    cr_assert_eq(model_eval(c, PROMPT, 7, NULL, false), ECS_OK);
    cr_assert_eq(model_eval(c, other, 5, NULL, false), ECS_OK);
    cr_assert_eq(model_ctx_truncate(c, 7), ECS_OK);
    cr_assert_eq(model_eval(c, PROMPT + 7, 5, l, false), ECS_OK);
    cr_assert(max_diff(l, ref + 11 * V, V) <= 1e-4, "the dropped tokens must not leak");
    free(l);
    free(ref);
    model_ctx_free(c);
    model_free(m);
}

/* ----------------------------------------------------------- F32 caches */

Test(kv_f32, absorbed_equals_expanded_exactly)
{
    int32_t toks[40];
    spec_t s = ds2_spec();
    random_tokens(toks, 40, s.n_vocab, 3);
    model_t *m = load_spec(&s, 128);
    const size_t cnt = (size_t)40 * model_n_vocab(m);
    float *a = eval_all(m, MODEL_CTX_KV_F32 | MODEL_CTX_MLA_ABSORBED, toks, 40);
    float *b = eval_all(m, MODEL_CTX_KV_F32 | MODEL_CTX_MLA_EXPANDED, toks, 40);
    float *c = eval_all(m, MODEL_CTX_MLA_ABSORBED, toks, 40);
    float *d = eval_all(m, MODEL_CTX_KV_F32, toks, 40);
    const double scale = max_abs(b, cnt);
    /* F32 weights and cache: the two forms differ by float rounding only
     * (the F16 cache alone moves logits ~1e3 times more) */
    cr_assert(max_diff(a, b, cnt) <= 2e-6 * scale, "absorbed vs expanded, f32: %g (scale %g)",
              max_diff(a, b, cnt), scale);
    cr_assert(max_diff(d, b, cnt) <= 2e-6 * scale, "expanded prompt vs expanded, f32: %g",
              max_diff(d, b, cnt));
    cr_assert(max_diff(a, c, cnt) > 0, "the F16 cache must round something");
    cr_assert_eq(model_ctx_bytes(m, 16, MODEL_CTX_KV_F32), 2 * model_ctx_bytes(m, 16, 0));
    free(a), free(b), free(c), free(d);
    model_free(m);
}

/* The odd width through the whole model: batched equals one by one, and
 * the thread count changes nothing. */
Test(batch, odd_width_decode_and_threads)
{
    enum { N = 9 };
    int32_t toks[N];
    spec_t s = odd_width_spec();
    random_tokens(toks, N, s.n_vocab, 3);
    model_t *m1 = load_spec_threads(&s, N + 8, 1), *m2 = load_spec_threads(&s, N + 8, 2);
    const size_t cnt = (size_t)N * model_n_vocab(m1);
    check_batched(m2, MODEL_CTX_MLA_ABSORBED, toks, N, 1e-4);
    float *a = eval_one_by_one(m1, MODEL_CTX_MLA_ABSORBED, toks, N);
    float *b = eval_one_by_one(m2, MODEL_CTX_MLA_ABSORBED, toks, N);
    cr_assert_eq(max_diff(a, b, cnt), 0.0, "1 vs 2 threads");
    free(a), free(b);
    model_free(m1);
    model_free(m2);
}
