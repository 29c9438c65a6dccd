/* test_model_experts.c - the model's routing and expert layer: rope/YaRN and
 * routing on known values, the local expert backend against a naive
 * per-token loop (a batch of rows and one row alone), a custom backend used
 * on both paths with the same logits, micro-batches with the same bits, and
 * a backend's error or non-finite output reported with its layer. */
#include "tests/unit/model_fixture.h"

/* ------------------------------------------------------------ rope, YaRN */

Test(rope, yarn_corr_dims_known_values)
{
    float d[2];
    /* n_dims 16, n_ctx_orig 4096, base 1e4: corr_dim(32) = 2.62 -> floor 2,
     * corr_dim(1) = 5.63 -> ceil 6 */
    model_rope_yarn_corr_dims(16, 4096, 10000.0f, 32.0f, 1.0f, d);
    cr_assert_float_eq(d[0], 2.0f, 0);
    cr_assert_float_eq(d[1], 6.0f, 0);
    /* DeepSeek-V2-Lite: 64 dims -> corr_dim(32) = 10.47, corr_dim(1) = 22.5 */
    model_rope_yarn_corr_dims(64, 4096, 10000.0f, 32.0f, 1.0f, d);
    cr_assert_float_eq(d[0], 10.0f, 0);
    cr_assert_float_eq(d[1], 23.0f, 0);
}

Test(rope, plain_rope_known_angles)
{
    arch_rope_t r = {.n_rot = 16, .mode = ARCH_ROPE_NORM, .n_ctx_orig = 4096,
                      .freq_base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 1.0f,
                      .beta_fast = 32.0f, .beta_slow = 1.0f};
    float cs[16];
    model_rope_cache(&r, 0, cs);
    for (int i = 0; i < 16; i += 2) {
        cr_assert_float_eq(cs[i], 1.0f, 0);
        cr_assert_float_eq(cs[i + 1], 0.0f, 0);
    }
    model_rope_cache(&r, 1, cs);
    /* theta_i = base^(-2i/16): 1, 0.3162278, 0.1, ... */
    cr_assert_float_eq(cs[0], 0.5403023f, 1e-6);
    cr_assert_float_eq(cs[1], 0.8414710f, 1e-6);
    cr_assert_float_eq(cs[2], 0.9504153f, 1e-6);
    cr_assert_float_eq(cs[3], 0.3109836f, 1e-6);
    cr_assert_float_eq(cs[4], 0.9950042f, 1e-6);
    cr_assert_float_eq(cs[5], 0.0998334f, 1e-6);
}

Test(rope, norm_and_neox_pairs)
{
    arch_rope_t r = {.n_rot = 4, .mode = ARCH_ROPE_NORM, .n_ctx_orig = 4096,
                      .freq_base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 1.0f,
                      .beta_fast = 32.0f, .beta_slow = 1.0f};
    float cs[4];
    model_rope_cache(&r, 1, cs);
    float x[5] = {1, 0, 0, 0, 7};
    model_rope_apply(&r, cs, x);
    cr_assert_float_eq(x[0], cosf(1.0f), 1e-6);
    cr_assert_float_eq(x[1], sinf(1.0f), 1e-6);
    cr_assert_float_eq(x[2], 0.0f, 0);
    cr_assert_float_eq(x[4], 7.0f, 0); /* past n_rot: untouched */
    r.mode = ARCH_ROPE_NEOX;
    float y[4] = {1, 0, 0, 0};
    model_rope_apply(&r, cs, y);
    cr_assert_float_eq(y[0], cosf(1.0f), 1e-6);
    cr_assert_float_eq(y[1], 0.0f, 0);
    cr_assert_float_eq(y[2], sinf(1.0f), 1e-6);
}

Test(rope, deepseek2_yarn_from_the_file)
{
    model_t *m = load(DS2_Q8, 64);
    const arch_hparams_t *hp = model_hparams(m);
    cr_assert_eq(hp->rope.mode, ARCH_ROPE_NORM);
    cr_assert_float_eq(hp->rope.freq_scale, 0.025f, 1e-7);
    cr_assert_float_eq(hp->rope.ext_factor, 1.0f, 0);
    /* kq_scale = (1 + 0.0707 ln 40)^2 / sqrt(48) */
    cr_assert_float_eq(hp->kq_scale, 1.260811f * 1.260811f / sqrtf(48.0f), 1e-5);
    float cs[16];
    model_rope_cache(&hp->rope, 1, cs);
    for (int i = 0; i < 16; i += 2) /* attn_factor cancels the YaRN magnitude */
        cr_assert_float_eq(hypotf(cs[i], cs[i + 1]), 1.0f, 1e-6);
    /* dims below corr_dims[0] = 2 extrapolate (theta = pos * base^(-i0/16)),
     * dims from corr_dims[1] = 6 on interpolate (theta * freq_scale) */
    cr_assert_float_eq(atan2f(cs[1], cs[0]), 1.0f, 1e-6);
    cr_assert_float_eq(atan2f(cs[3], cs[2]), powf(10000.0f, -2.0f / 16), 1e-6);
    cr_assert_float_eq(atan2f(cs[15], cs[14]), 0.025f * powf(10000.0f, -14.0f / 16), 1e-7);
    /* in between: a blend of the two */
    const float ext = powf(10000.0f, -8.0f / 16), mix = 1.0f - (4.0f - 2.0f) / 4.0f;
    cr_assert_float_eq(atan2f(cs[9], cs[8]), ext * 0.025f * (1 - mix) + ext * mix, 1e-6);
    model_free(m);
}

/* ---------------------------------------------------------------- routing */

static arch_hparams_t route_hp(void)
{
    return (arch_hparams_t){.n_expert = 8, .n_expert_used = 2, .gating = ARCH_GATING_SOFTMAX,
                             .expert_weights_scale = 1.0f};
}

Test(route, softmax_top_k)
{
    arch_hparams_t hp = route_hp();
    const float logits[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t ids[2];
    float w[2], scratch[24];
    model_route(&hp, logits, NULL, ids, w, scratch);
    double z = 0;
    for (int i = 0; i < 8; i++)
        z += exp(i);
    cr_assert_eq(ids[0], 7);
    cr_assert_eq(ids[1], 6);
    cr_assert_float_eq(w[0], exp(7) / z, 1e-6);
    cr_assert_float_eq(w[1], exp(6) / z, 1e-6);
    hp.expert_weights_norm = true;
    model_route(&hp, logits, NULL, ids, w, scratch);
    cr_assert_float_eq(w[0], exp(1) / (1 + exp(1)), 1e-6);
    cr_assert_float_eq(w[1], 1 / (1 + exp(1)), 1e-6);
}

Test(route, sigmoid_groups_bias_scale)
{
    arch_hparams_t hp = route_hp();
    hp.gating = ARCH_GATING_SIGMOID;
    hp.expert_weights_norm = true;
    hp.expert_weights_scale = 2.5f;
    /* groups of 2: sums of sigmoids 1.0, 1.462, 1.245, 0.538; the best single
     * expert (0) sits in a weak group */
    const float logits[8] = {3, -3, 1, 1, 0.5f, 0.5f, -1, -1};
    int32_t ids[2];
    float w[2], scratch[24];
    model_route(&hp, logits, NULL, ids, w, scratch);
    cr_assert_eq(ids[0], 0, "no group limit: expert 0 wins");
    hp.n_expert_groups = 4;
    hp.n_group_used = 2;
    model_route(&hp, logits, NULL, ids, w, scratch);
    cr_assert_eq(ids[0], 2, "groups 1 and 2 kept; tie goes to the lower id");
    cr_assert_eq(ids[1], 3);
    cr_assert_float_eq(w[0], 1.25f, 1e-6);
    cr_assert_float_eq(w[1], 1.25f, 1e-6);
    /* a bias changes the choice but not the weights */
    float bias[8] = {0};
    bias[5] = 0.2f;
    model_route(&hp, logits, bias, ids, w, scratch);
    cr_assert_eq(ids[0], 5);
    cr_assert_eq(ids[1], 2);
    const float s5 = 1 / (1 + expf(-0.5f)), s2 = 1 / (1 + expf(-1.0f));
    cr_assert_float_eq(w[0], 2.5f * s5 / (s5 + s2), 1e-6);
    cr_assert_float_eq(w[1], 2.5f * s2 / (s5 + s2), 1e-6);
}

/* --------------------------------------------------------- expert backend */

static void naive_experts(const model_t *m, int layer, int n, const float *x, const int32_t *ids,
                          const float *w, float *out)
{
    const arch_hparams_t *hp = model_hparams(m);
    const model_layer_t *ly = &model_weights(m)->layers[layer];
    const int E = hp->n_embd, F = hp->n_ff_exp, k = hp->n_expert_used;
    float *g = malloc(F * sizeof *g), *u = malloc(F * sizeof *u), *d = malloc(E * sizeof *d);
    size_t sb = kcpu_act_bytes(ly->gate_exps.type, E, 1), sd = kcpu_act_bytes(ly->down_exps.type, F, 1);
    void *scratch = malloc(sb > sd ? sb : sd);
    cr_assert(g && u && d && scratch);
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * E;
        for (int j = 0; j < k; j++) {
            const int e = ids[t * k + j];
            kcpu_mat_t G = model_expert_mat(&ly->gate_exps, e, F);
            kcpu_mat_t U = model_expert_mat(&ly->up_exps, e, F);
            kcpu_mat_t D = model_expert_mat(&ly->down_exps, e, E);
            kcpu_matmul(NULL, &G, x + (size_t)t * E, E, 1, g, F, scratch);
            kcpu_matmul(NULL, &U, x + (size_t)t * E, E, 1, u, F, scratch);
            for (int i = 0; i < F; i++)
                g[i] = g[i] / (1 + expf(-g[i])) * u[i];
            kcpu_matmul(NULL, &D, g, F, 1, d, E, scratch);
            for (int c = 0; c < E; c++)
                o[c] = j == 0 ? d[c] * w[t * k + j] : o[c] + d[c] * w[t * k + j];
        }
    }
    free(g);
    free(u);
    free(d);
    free(scratch);
}

/* Rows, expert choices and weights for a backend test: n rows of the
 * model's width, ids[t k + j] = (a t + b j + c) mod n_expert (distinct per
 * row when b and n_expert are coprime), w = w0 + wj j + wt t. */
typedef struct {
    int n, E, k;
    float *x, *w, *a, *b;
    int32_t *ids;
} experts_case_t;

static experts_case_t experts_case(const model_t *m, int n, uint64_t seed, const int abc[3],
                                   const float w3[3])
{
    const arch_hparams_t *hp = model_hparams(m);
    experts_case_t c = {.n = n, .E = hp->n_embd, .k = hp->n_expert_used};
    const size_t nE = (size_t)n * c.E, nk = (size_t)n * c.k;
    c.x = malloc(nE * sizeof *c.x), c.w = malloc(nk * sizeof *c.w);
    c.a = malloc(nE * sizeof *c.a), c.b = malloc(nE * sizeof *c.b);
    c.ids = malloc(nk * sizeof *c.ids);
    cr_assert(c.x && c.w && c.a && c.b && c.ids);
    rng_state = seed;
    for (size_t i = 0; i < nE; i++)
        c.x[i] = urand();
    for (int t = 0; t < n; t++)
        for (int j = 0; j < c.k; j++) {
            c.ids[t * c.k + j] = (abc[0] * t + abc[1] * j + abc[2]) % hp->n_expert;
            c.w[t * c.k + j] = w3[0] + w3[1] * j + w3[2] * t;
        }
    return c;
}

static void experts_case_free(experts_case_t *c)
{
    free(c->x), free(c->w), free(c->a), free(c->b), free(c->ids);
}

/* c->a (the backend's result) against the naive loop's c->b. */
static void check_experts_case(model_t *m, int layer, experts_case_t *c, const char *what)
{
    naive_experts(m, layer, c->n, c->x, c->ids, c->w, c->b);
    const size_t nE = (size_t)c->n * c->E;
    const double d = max_diff(c->a, c->b, nE);
    cr_assert(d <= 1e-5 * fmax(1.0, max_abs(c->b, nE)), "%s vs naive: %g", what, d);
    cr_assert_gt(max_abs(c->b, nE), 0.0);
}

Test(experts, local_backend_equals_naive_loop)
{
    model_t *m = load(DS2_Q8, 64);
    const int layer = 2;
    /* several rows per expert */
    experts_case_t c =
        experts_case(m, 7, 7, (const int[]){1, 3, 0}, (const float[]){0.1f, 0.2f, 0.01f});
    model_experts_local_t *l;
    cr_assert_eq(model_experts_local_new(m, model_threadpool(m), &l), ECS_OK);
    cr_assert_eq(model_experts_local_ops.submit(l, 0, layer, c.n, c.x, c.k, c.ids, c.w), ECS_OK,
                 "%s", ecs_errmsg());
    cr_assert_eq(model_experts_local_ops.wait(l, 0, layer, c.a), ECS_OK);
    check_experts_case(m, layer, &c, "local");
    /* bad input is refused, not computed */
    c.ids[3] = model_hparams(m)->n_expert;
    cr_assert_eq(model_experts_local_ops.submit(l, 0, layer, c.n, c.x, c.k, c.ids, c.w),
                 ECS_ERR_RANGE);
    cr_assert_neq(model_experts_local_ops.wait(l, 0, layer, c.a), ECS_OK);
    cr_assert_eq(model_experts_local_ops.submit(l, 0, 0, c.n, c.x, c.k, c.ids, c.w), ECS_ERR_INVAL,
                 "layer 0 is dense");
    model_experts_local_free(l);
    experts_case_free(&c);
    model_free(m);
}

/* A backend that forwards to the local one and counts calls: the model
 * must produce the same logits through it. */
typedef struct {
    model_experts_local_t *l;
    int submits, waits, last_layer;
} spy_t;

static ecs_err_t spy_submit(void *ctx, int tag, int layer, int n, const float *x, int k, const int32_t *ids,
                            const float *w)
{
    spy_t *s = ctx;
    s->submits++;
    s->last_layer = layer;
    return model_experts_local_ops.submit(s->l, tag, layer, n, x, k, ids, w);
}

static ecs_err_t spy_wait(void *ctx, int tag, int layer, float *out)
{
    spy_t *s = ctx;
    s->waits++;
    return model_experts_local_ops.wait(s->l, tag, layer, out);
}

Test(experts, custom_backend_is_used)
{
    model_t *m = load(DS2_Q8, 64);
    float *ref = eval_all(m, 0, PROMPT, 10);
    spy_t spy = {0};
    cr_assert_eq(model_experts_local_new(m, model_threadpool(m), &spy.l), ECS_OK);
    static const model_experts_ops ops = {spy_submit, spy_wait, 1, NULL};
    model_set_experts(m, &ops, &spy);
    float *got = eval_all(m, 0, PROMPT, 10);
    const arch_hparams_t *hp = model_hparams(m);
    cr_assert_eq(spy.submits, hp->n_layer - hp->n_layer_dense, "one submit per MoE layer");
    cr_assert_eq(spy.waits, spy.submits);
    cr_assert_eq(spy.last_layer, hp->n_layer - 1);
    cr_assert_eq(max_diff(ref, got, (size_t)10 * model_n_vocab(m)), 0.0);
    model_set_experts(m, NULL, NULL);
    model_experts_local_free(spy.l);
    free(ref);
    free(got);
    model_free(m);
}

/* A backend with two slots that computes each submit through the local
 * one at its tag's wait, from the rows, ids and weights the model handed
 * over (which must stay valid until then): the model's micro-batches
 * (model_set_micro_batches) must give the whole step's bits, with two
 * submits outstanding at a time. */
typedef struct {
    model_experts_local_t *l;
    const float *x[2], *w[2];
    const int32_t *ids[2];
    int n_tok[2], layer[2], k;
    bool busy[2];
    int most_out, overlapped;
} slots_t;

static ecs_err_t slots_submit(void *ctx, int tag, int layer, int n, const float *x, int k,
                              const int32_t *ids, const float *w)
{
    slots_t *s = ctx;
    cr_assert(tag >= 0 && tag < 2 && !s->busy[tag], "tag %d", tag);
    s->busy[tag] = true;
    s->x[tag] = x, s->ids[tag] = ids, s->w[tag] = w;
    s->n_tok[tag] = n, s->layer[tag] = layer, s->k = k;
    const int now = s->busy[0] + s->busy[1];
    s->most_out = now > s->most_out ? now : s->most_out;
    s->overlapped += now > 1;
    return ECS_OK;
}

static ecs_err_t slots_wait(void *ctx, int tag, int layer, float *out)
{
    slots_t *s = ctx;
    cr_assert(tag >= 0 && tag < 2 && s->busy[tag] && s->layer[tag] == layer);
    s->busy[tag] = false;
    ecs_err_t e = model_experts_local_ops.submit(s->l, 0, layer, s->n_tok[tag], s->x[tag], s->k,
                                                 s->ids[tag], s->w[tag]);
    return e != ECS_OK ? e : model_experts_local_ops.wait(s->l, 0, layer, out);
}

/* One step of three sequences (70, 3 and 20 rows; 70 attends in the
 * expanded form in ds2), every row wanting logits, in rows or interleaved. */
static float *micro_step(model_t *m, bool interleave)
{
    static const int len[3] = {70, 3, 20};
    model_ctx_t *c[3];
    model_row_t rows[93];
    int r = 0;
    for (int q = 0; q < 3; q++)
        cr_assert_eq(model_ctx_new(m, 128, 0, &c[q]), ECS_OK);
    for (int i = 0; i < 70; i++)
        for (int q = 0; q < 3; q++)
            if (i < len[q] && (interleave || q == 0))
                rows[r++] = (model_row_t){c[q], (int32_t)((i * 37 + q * 11) % 1900 + 1), true};
    for (int q = 1; q < 3 && !interleave; q++)
        for (int i = 0; i < len[q]; i++)
            rows[r++] = (model_row_t){c[q], (int32_t)((i * 37 + q * 11) % 1900 + 1), true};
    cr_assert_eq(r, 93);
    float *out = malloc((size_t)r * model_n_vocab(m) * sizeof *out);
    cr_assert_not_null(out);
    cr_assert_eq(model_eval_batch(m, rows, r, out), ECS_OK, "%s", ecs_errmsg());
    for (int q = 0; q < 3; q++)
        model_ctx_free(c[q]);
    return out;
}

static void check_micro(const char *path)
{
    model_t *m = load(path, 128);
    const size_t n = (size_t)93 * model_n_vocab(m) * sizeof(float);
    slots_t s = {0};
    cr_assert_eq(model_experts_local_new(m, model_threadpool(m), &s.l), ECS_OK);
    static const model_experts_ops ops = {slots_submit, slots_wait, 2, NULL};
    for (int il = 0; il < 2; il++) {
        float *ref = micro_step(m, il);
        model_set_experts(m, &ops, &s);
        for (int nm = 1; nm <= 3; nm++) {
            cr_assert_eq(model_set_micro_batches(m, nm), ECS_OK);
            s.most_out = s.overlapped = 0;
            float *got = micro_step(m, il);
            cr_assert_eq(memcmp(ref, got, n), 0, "%s, %d micro-batches%s: other logits", path, nm,
                         il ? ", interleaved" : "");
            /* three asked, two slots: two */
            cr_assert_eq(s.most_out, nm > 1 ? 2 : 1, "%d micro-batches", nm);
            cr_assert(nm == 1 || s.overlapped > 0);
            free(got);
        }
        cr_assert_eq(model_set_micro_batches(m, 1), ECS_OK);
        model_set_experts(m, NULL, NULL);
        free(ref);
    }
    cr_assert_eq(model_set_micro_batches(m, 0), ECS_ERR_RANGE);
    cr_assert_eq(model_set_micro_batches(m, MODEL_MAX_MICRO + 1), ECS_ERR_RANGE);
    model_experts_local_free(s.l);
    model_free(m);
}

Test(experts, micro_batches_same_bits_ds2) { check_micro(DS2_Q8); }
Test(experts, micro_batches_same_bits_qwen) { check_micro(QWEN_Q8); }

static ecs_err_t failing_submit(void *ctx, int tag, int layer, int n, const float *x, int k,
                                const int32_t *ids, const float *w)
{
    (void)ctx, (void)tag, (void)n, (void)x, (void)k, (void)ids, (void)w;
    return ecs_error(ECS_ERR_IO, "worker for layer %d is gone", layer);
}

Test(experts, backend_error_is_reported)
{
    model_t *m = load(DS2_Q8, 64);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, 64, 0, &c), ECS_OK);
    static const model_experts_ops ops = {failing_submit, spy_wait, 1, NULL};
    model_set_experts(m, &ops, NULL);
    cr_assert_eq(model_eval(c, PROMPT, 4, NULL, false), ECS_ERR_IO);
    cr_assert(strstr(ecs_errmsg(), "is gone"));
    cr_assert_eq(model_ctx_n_past(c), 0, "a failed step leaves the sequence unchanged");
    model_set_experts(m, NULL, NULL);
    cr_assert_eq(model_eval(c, PROMPT, 4, NULL, false), ECS_OK);
    cr_assert_eq(model_ctx_n_past(c), 4);
    model_ctx_free(c);
    model_free(m);
}

/* A backend whose layer-2 output turns NaN on every row (a damaged expert
 * tensor): the step fails with an error naming that layer and the routed
 * experts, not a symptom downstream, and the sequence is unchanged. */
typedef struct {
    model_experts_local_t *l;
    int n_tok, E;
    int only_row; /* -1: every row */
} nan_backend_t;

static ecs_err_t nan_submit(void *ctx, int tag, int layer, int n, const float *x, int k, const int32_t *ids,
                            const float *w)
{
    nan_backend_t *b = ctx;
    b->n_tok = n;
    return model_experts_local_ops.submit(b->l, tag, layer, n, x, k, ids, w);
}

static ecs_err_t nan_wait(void *ctx, int tag, int layer, float *out)
{
    nan_backend_t *b = ctx;
    const ecs_err_t e = model_experts_local_ops.wait(b->l, tag, layer, out);
    for (int r = 0; layer == 2 && r < b->n_tok; r++)
        if (b->only_row < 0 || r == b->only_row)
            out[(size_t)r * b->E + 5] = NAN;
    return e;
}

static void check_nan_named(int only_row)
{
    model_t *m = load(DS2_Q8, 64);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, 64, 0, &c), ECS_OK);
    nan_backend_t b = {NULL, 0, model_hparams(m)->n_embd, only_row};
    cr_assert_eq(model_experts_local_new(m, model_threadpool(m), &b.l), ECS_OK);
    static const model_experts_ops ops = {nan_submit, nan_wait, 1, NULL};
    model_set_experts(m, &ops, &b);
    float *logits = malloc((size_t)model_n_vocab(m) * sizeof *logits);
    cr_assert_not_null(logits);
    cr_assert_eq(model_eval(c, PROMPT, 4, logits, false), ECS_ERR_FORMAT, "%s", ecs_errmsg());
    cr_assert(strstr(ecs_errmsg(), "layer 2, routed experts") && strstr(ecs_errmsg(), "model file"),
              "%s", ecs_errmsg());
    cr_assert_eq(model_ctx_n_past(c), 0);
    model_set_experts(m, NULL, NULL);
    cr_assert_eq(model_eval(c, PROMPT, 4, logits, false), ECS_OK, "%s", ecs_errmsg());
    model_experts_local_free(b.l);
    free(logits);
    model_ctx_free(c);
    model_free(m);
}

Test(experts, non_finite_output_names_layer) { check_nan_named(-1); }

/* Only the prompt's first row (no logits wanted) goes NaN: the per-layer
 * check of every row still names the layer. */
Test(experts, non_finite_in_a_row_without_logits_names_layer) { check_nan_named(0); }

/* One row alone skips the gather (every expert reads it in place); it must
 * give what the naive loop gives, as a batch of rows does. */
Test(experts, one_row_equals_naive_loop)
{
    spec_t s = odd_width_spec();
    model_t *m = load_spec(&s, 16);
    const int layer = 1;
    experts_case_t c =
        experts_case(m, 5, 11, (const int[]){2, 3, 1}, (const float[]){0.3f, 0.1f, -0.02f});
    model_experts_local_t *l;
    cr_assert_eq(model_experts_local_new(m, model_threadpool(m), &l), ECS_OK);
    for (int t = 0; t < c.n; t++) {
        cr_assert_eq(model_experts_local_ops.submit(l, 0, layer, 1, c.x + (size_t)t * c.E, c.k,
                                                    c.ids + (size_t)t * c.k,
                                                    c.w + (size_t)t * c.k),
                     ECS_OK, "%s", ecs_errmsg());
        cr_assert_eq(model_experts_local_ops.wait(l, 0, layer, c.a + (size_t)t * c.E), ECS_OK);
    }
    check_experts_case(m, layer, &c, "one row");
    model_experts_local_free(l);
    experts_case_free(&c);
    model_free(m);
}
