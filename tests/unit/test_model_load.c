/* test_model_load.c - what model_load sets up and refuses: the phase
 * profile, the KV and decode byte budgets (a full context is a clear error,
 * steps allocate no kernel scratch), bad files as clear errors, and the
 * hyperparameters of the tiny models. */
#include "tests/unit/model_fixture.h"

/* -------------------------------------------------------------- profile */

Test(profile, phases_are_timed_only_when_asked)
{
    model_t *m = load_opts(DS2_Q8, (model_opts_t){.n_ctx = 64, .n_threads = 2, .profile = true});
    float *l = eval_all(m, 0, PROMPT, 8);
    model_prof_t p[MODEL_PH_COUNT];
    model_profile(m, p);
    const model_phase_t used[] = {MODEL_PH_EMBED, MODEL_PH_NORM, MODEL_PH_ATTN_IN,
                                  MODEL_PH_ATTN_CORE, MODEL_PH_ATTN_OUT, MODEL_PH_ROUTER,
                                  MODEL_PH_FFN_UP, MODEL_PH_FFN_DOWN, MODEL_PH_MOE_SUM,
                                  MODEL_PH_DENSE, MODEL_PH_OUTPUT};
    for (size_t i = 0; i < sizeof used / sizeof used[0]; i++) {
        cr_assert(p[used[i]].calls > 0 && p[used[i]].wall_s > 0, "phase %s", p[used[i]].name);
        cr_assert_not_null(p[used[i]].name);
    }
    /* one step of 8 rows: every layer's attention core is one call */
    cr_assert_eq(p[MODEL_PH_ATTN_CORE].calls, 4);
    cr_assert_eq(p[MODEL_PH_DENSE].calls, 1);
    cr_assert_eq(p[MODEL_PH_ROUTER].calls, 3);
    model_profile_reset(m);
    model_profile(m, p);
    for (int i = 0; i < MODEL_PH_COUNT; i++)
        cr_assert_eq(p[i].calls, 0);
    free(l);
    model_free(m);

    m = load(DS2_Q8, 64);
    l = eval_all(m, 0, PROMPT, 8);
    model_profile(m, p);
    for (int i = 0; i < MODEL_PH_COUNT; i++)
        cr_assert(p[i].calls == 0 && p[i].wall_s == 0, "not asked for: %s", p[i].name);
    free(l);
    model_free(m);
}

/* Weights a decoded token reads: attention, dense and shared FFNs, router
 * and head whole, 1/4 of the expert tensors (4 of 16), one embedding row;
 * the latent path reads W_kT (Q8_0) instead of W_kv_b's k rows. */
Test(budget, decode_bytes_of_the_tiny_model)
{
    model_t *m = load(DS2_Q8, 32);
    const arch_hparams_t *hp = model_hparams(m);
    const model_weights_t *w = model_weights(m);
    const gguf_file_t *f = model_gguf(m);
    size_t all = 0, experts = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        all += t->nbytes;
        if (strstr(t->name, "_exps."))
            experts += t->nbytes;
    }
    const size_t embd = (size_t)hp->n_vocab * w->token_embd.row_bytes;
    const size_t heads = (size_t)hp->n_layer * hp->n_head;
    const size_t kb_rows = heads * hp->qk_nope * w->layers[0].wkv_b.row_bytes;
    /* W_kT: per layer n_head * kv_lora rows of qk_nope values in Q8_0 */
    const size_t wkt = heads * hp->kv_lora_rank * (hp->qk_nope / 32) * 34;
    const size_t want =
        all - embd + w->token_embd.row_bytes - experts + experts / 4 - kb_rows + wkt;
    cr_assert_eq(model_decode_bytes(m), want);
    model_free(m);
}

/* -------------------------------------------------------------- budgets */

Test(budget, context_full_is_a_clear_error)
{
    model_t *m = load(DS2_Q8, 16);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, 32, 0, &c), ECS_ERR_RANGE, "larger than the loaded n_ctx");
    cr_assert_eq(model_ctx_new(m, 8, 0, &c), ECS_OK);
    /* whole blocks of MODEL_KV_BLOCK tokens */
    cr_assert_eq(model_ctx_bytes(m, 8, 0), (size_t)4 * MODEL_KV_BLOCK * (64 + 16) * 2,
                 "latent: 80 F16 per token per layer");
    cr_assert_eq(model_ctx_bytes(m, 8, MODEL_CTX_MLA_EXPANDED),
                 (size_t)4 * MODEL_KV_BLOCK * (4 * 48 + 4 * 32) * 2);
    float *l = malloc((size_t)model_n_vocab(m) * sizeof *l);
    cr_assert_eq(model_eval(c, PROMPT, 6, l, false), ECS_OK);
    cr_assert_eq(model_eval(c, PROMPT, 3, l, false), ECS_ERR_NOMEM);
    cr_assert(strstr(ecs_errmsg(), "context"), "message: %s", ecs_errmsg());
    cr_assert_eq(model_ctx_n_past(c), 6, "nothing evaluated");
    cr_assert_eq(model_eval(c, PROMPT, 2, l, false), ECS_OK);
    cr_assert_eq(model_ctx_n_past(c), 8);
    model_row_t row = {c, 5, true};
    cr_assert_eq(model_eval_batch(m, &row, 1, l), ECS_ERR_NOMEM);
    model_ctx_reset(c);
    cr_assert_eq(model_ctx_n_past(c), 0);
    cr_assert_eq(model_eval(c, PROMPT, 8, l, false), ECS_OK);
    cr_assert_eq(model_ctx_truncate(c, 9), ECS_ERR_RANGE);
    cr_assert_eq(model_ctx_truncate(c, 3), ECS_OK);
    cr_assert_eq(model_eval(c, PROMPT + 3, 5, l, false), ECS_OK, "room again after truncating");
    const int32_t bad = model_n_vocab(m);
    model_ctx_reset(c);
    cr_assert_eq(model_eval(c, &bad, 1, l, false), ECS_ERR_RANGE);
    cr_assert_eq(model_ctx_n_past(c), 0);
    free(l);
    model_ctx_free(c);
    model_free(m);
}

/* ----------------------------------------------------------- load errors */

Test(load, bad_files_are_clear_errors)
{
    model_t *m = (model_t *)1;
    model_opts_t o = {.n_ctx = 16, .n_threads = 1};
    cr_assert_eq(model_load("/nonexistent/x.gguf", &o, &m), ECS_ERR_IO);
    cr_assert_null(m);
    cr_assert_eq(model_load("../shared/reference/quant-samples.gguf", &o, &m), ECS_ERR_UNSUPPORTED);
    cr_assert(strstr(ecs_errmsg(), "architecture"), "%s", ecs_errmsg());

    char path[128];
    spec_t s = ds2_spec();
    s.skip = "blk.2.ffn_down_exps.weight";
    write_model(&s, path, sizeof path, 1);
    cr_assert_eq(model_load(path, &o, &m), ECS_ERR_NOTFOUND);
    cr_assert(strstr(ecs_errmsg(), "blk.2.ffn_down_exps.weight"), "%s", ecs_errmsg());
    unlink(path);

    s = ds2_spec();
    s.n_used = 9; /* more experts used than exist */
    write_model(&s, path, sizeof path, 1);
    cr_assert_eq(model_load(path, &o, &m), ECS_ERR_RANGE);
    unlink(path);

    s = ds2_spec();
    s.groups = 3; /* 8 experts do not split into 3 groups */
    s.groups_used = 1;
    write_model(&s, path, sizeof path, 1);
    cr_assert_eq(model_load(path, &o, &m), ECS_ERR_RANGE);
    unlink(path);
}

Test(load, describes_the_tiny_models)
{
    model_t *m = load(DS2_Q8, 32);
    const arch_hparams_t *hp = model_hparams(m);
    cr_assert_eq(hp->arch, ARCH_DEEPSEEK2);
    cr_assert_eq(hp->n_layer, 4);
    cr_assert_eq(hp->q_lora_rank, 128);
    cr_assert_eq(hp->kv_lora_rank, 64);
    cr_assert_eq(hp->qk_nope, 32);
    cr_assert_eq(hp->n_ff_shexp, 256);
    cr_assert_eq(hp->n_layer_dense, 1);
    cr_assert_eq(hp->n_vocab, 102400);
    cr_assert(!hp->tied_output && !hp->expert_weights_norm);
    const model_weights_t *w = model_weights(m);
    cr_assert_eq(w->layers[1].gate_exps.nrows, 16 * 128);
    cr_assert_eq(w->layers[1].gate_inp.type, ECS_TYPE_F32);
    cr_assert_eq(w->layers[1].wkv_b.type, ECS_TYPE_Q8_0);
    cr_assert(!w->layers[0].moe && w->layers[3].moe);
    model_free(m);

    m = load(QWEN_Q8, 32);
    hp = model_hparams(m);
    cr_assert_eq(hp->arch, ARCH_QWEN3MOE);
    cr_assert_eq(hp->n_head_kv, 2);
    cr_assert_eq(hp->rope.mode, ARCH_ROPE_NEOX);
    cr_assert(hp->expert_weights_norm);
    cr_assert_float_eq(hp->kq_scale, 1.0f / sqrtf(32.0f), 1e-7);
    model_free(m);
}

/* ------------------------------------------------ memory budgeted at load */

/* The kernels' scratch is reserved by model_load: prompt steps (expanded
 * attention, 64+ rows) and decode steps allocate none. */
static void check_no_scratch_growth(const char *path)
{
    enum { N = MODEL_MLA_EXPAND_ROWS + 8 };
    model_t *m = load(path, N + 16);
    int32_t toks[N];
    random_tokens(toks, N, model_n_vocab(m), 4);
    float *logits = malloc((size_t)model_n_vocab(m) * sizeof *logits);
    cr_assert_not_null(logits);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, N + 16, 0, &c), ECS_OK);
    const uint64_t before = kcpu_scratch_grows();
    cr_assert_eq(model_eval(c, toks, N, logits, false), ECS_OK, "%s", ecs_errmsg());
    for (int i = 0; i < 4; i++)
        cr_assert_eq(model_eval(c, toks + i, 1, logits, false), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(kcpu_scratch_grows(), before, "%s: a step allocated kernel scratch", path);
    model_ctx_free(c);
    free(logits);
    model_free(m);
}

Test(budget, steps_allocate_no_kernel_scratch)
{
    check_no_scratch_growth(DS2_Q8);
    check_no_scratch_growth(QWEN_Q8);
}
