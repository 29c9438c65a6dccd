/* test_model.c - the model module: rope/YaRN and routing on known values,
 * the local expert backend against a naive per-token loop, the absorbed MLA
 * path against the expanded one, prompt steps over a latent cache (expanded
 * form) against the absorbed form and against other cuts of the prompt,
 * batched against token-by-token evaluation
 * (also across the 512-row step), multi-sequence steps, F32 KV caches, the
 * AVX-512 attention/SwiGLU kernels against the plain ones, thread-count
 * independence, the phase profile, the KV budget, and load errors.
 *
 * Besides the shared tiny Q8_0 models, the tests write small random F32
 * models (every architecture variant: q-LoRA or not, tied head, sigmoid
 * gating with groups and bias, GQA) so that paths which must be
 * mathematically equal can be compared without activation quantization. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gguf.h"
#include "coordinator/model/model.h"

#define DS2_Q8 "../shared/models/tiny-ds2-q8_0.gguf"
#define QWEN_Q8 "../shared/models/tiny-qwen3moe-q8_0.gguf"

/* The english_sentence prompt of the reference files plus a few ids. */
static const int32_t PROMPT[] = {100000, 549, 3399, 10176, 32431, 33747, 855, 254, 24547, 5025,
                                 3345, 254, 7257, 8144, 6185, 13, 82987, 32840, 94838, 62990};
#define N_PROMPT ((int)(sizeof PROMPT / sizeof PROMPT[0]))

/* ------------------------------------------------------------- helpers */

static model_t *load_opts(const char *path, model_opts_t o)
{
    model_t *m = NULL;
    ecs_err_t e = model_load(path, &o, &m);
    cr_assert_eq(e, ECS_OK, "model_load(%s): %s", path, ecs_errmsg());
    return m;
}

static model_t *load(const char *path, int n_ctx)
{
    model_opts_t o = {.n_ctx = n_ctx, .n_threads = 2};
    model_t *m = NULL;
    ecs_err_t e = model_load(path, &o, &m);
    cr_assert_eq(e, ECS_OK, "model_load(%s): %s", path, ecs_errmsg());
    return m;
}

static float *eval_all(model_t *m, unsigned flags, const int32_t *toks, int n)
{
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, model_n_ctx_max(m), flags, &c), ECS_OK, "%s", ecs_errmsg());
    float *l = malloc((size_t)n * model_n_vocab(m) * sizeof *l);
    cr_assert_not_null(l);
    cr_assert_eq(model_eval(c, toks, n, l, true), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_ctx_n_past(c), n);
    model_ctx_free(c);
    return l;
}

static float *eval_one_by_one(model_t *m, unsigned flags, const int32_t *toks, int n)
{
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, model_n_ctx_max(m), flags, &c), ECS_OK, "%s", ecs_errmsg());
    const size_t V = (size_t)model_n_vocab(m);
    float *l = malloc((size_t)n * V * sizeof *l);
    cr_assert_not_null(l);
    for (int i = 0; i < n; i++)
        cr_assert_eq(model_eval(c, toks + i, 1, l + i * V, false), ECS_OK, "%s", ecs_errmsg());
    model_ctx_free(c);
    return l;
}

static double max_abs(const float *a, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(a[i]));
    return mx;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(isfinite(a[i]) && isfinite(b[i]), "non-finite value at %zu", i);
        mx = fmax(mx, fabs((double)a[i] - b[i]));
    }
    return mx;
}

static double mean_diff(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += fabs((double)a[i] - b[i]);
    return s / (double)n;
}

/* ------------------------------------------------ random F32 test models */

typedef struct {
    const char *arch;
    int n_layer, n_embd, n_head, n_head_kv, head_k, head_v, n_rot, n_vocab;
    int q_lora, kv_lora, n_dense, n_ff;
    int n_expert, n_used, n_ff_exp, n_shared, groups, groups_used, gating;
    bool norm, tied, bias, yarn;
    float scale;
    const char *skip; /* a tensor left out, to test the error */
    bool q8;          /* matrices with rows of a multiple of 32 in Q8_0 */
} spec_t;

static spec_t ds2_spec(void)
{
    return (spec_t){.arch = "deepseek2", .n_layer = 3, .n_embd = 64, .n_head = 4, .n_head_kv = 4,
                    .head_k = 24, .head_v = 16, .n_rot = 8, .n_vocab = 160, .q_lora = 32,
                    .kv_lora = 32, .n_dense = 1, .n_ff = 96, .n_expert = 8, .n_used = 3,
                    .n_ff_exp = 32, .n_shared = 1, .gating = 1, .scale = 1.0f, .yarn = true};
}

static spec_t qwen_spec(void)
{
    return (spec_t){.arch = "qwen3moe", .n_layer = 2, .n_embd = 64, .n_head = 4, .n_head_kv = 2,
                    .head_k = 16, .head_v = 16, .n_rot = 16, .n_vocab = 160, .n_expert = 8,
                    .n_used = 2, .n_ff_exp = 32, .norm = true, .scale = 1.0f};
}

typedef struct {
    char name[64];
    int n_dims;
    int64_t ne[3];
    float amp, base; /* values base + amp * U(-1, 1) */
} tdesc_t;

static uint64_t rng_state;
static float urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static int add_t(tdesc_t *t, int n, const char *name, int nd, int64_t a, int64_t b, int64_t c,
                 float amp, float base)
{
    snprintf(t[n].name, sizeof t[n].name, "%s", name);
    t[n].n_dims = nd;
    t[n].ne[0] = a;
    t[n].ne[1] = b;
    t[n].ne[2] = c;
    t[n].amp = amp;
    t[n].base = base;
    return n + 1;
}

/* The tensor list of a spec, in llama.cpp's names and ne order. */
static int describe(const spec_t *s, tdesc_t *t)
{
    const int64_t E = s->n_embd, H = s->n_head, X = s->n_expert, F = s->n_ff_exp;
    const bool ds2 = !strcmp(s->arch, "deepseek2");
    const float w = 0.15f; /* larger than real init so that routing and attention vary */
    char b[64];
    int n = 0;
    n = add_t(t, n, "token_embd.weight", 2, E, s->n_vocab, 1, 1.0f, 0);
    n = add_t(t, n, "output_norm.weight", 1, E, 1, 1, 0.1f, 1.0f);
    if (!s->tied)
        n = add_t(t, n, "output.weight", 2, E, s->n_vocab, 1, w, 0);
    for (int il = 0; il < s->n_layer; il++) {
#define T(nm, nd, a, bb, c, amp, base)                                                             \
    do {                                                                                           \
        snprintf(b, sizeof b, "blk.%d." nm, il);                                                   \
        n = add_t(t, n, b, nd, a, bb, c, amp, base);                                               \
    } while (0)
        T("attn_norm.weight", 1, E, 1, 1, 0.1f, 1.0f);
        T("ffn_norm.weight", 1, E, 1, 1, 0.1f, 1.0f);
        if (ds2) {
            const int64_t KV = s->kv_lora, nope = s->head_k - s->n_rot;
            if (s->q_lora) {
                T("attn_q_a.weight", 2, E, s->q_lora, 1, w, 0);
                T("attn_q_a_norm.weight", 1, s->q_lora, 1, 1, 0.1f, 1.0f);
                T("attn_q_b.weight", 2, s->q_lora, H * s->head_k, 1, w, 0);
            } else {
                T("attn_q.weight", 2, E, H * s->head_k, 1, w, 0);
            }
            T("attn_kv_a_mqa.weight", 2, E, KV + s->n_rot, 1, w, 0);
            T("attn_kv_a_norm.weight", 1, KV, 1, 1, 0.1f, 1.0f);
            T("attn_kv_b.weight", 2, KV, H * (nope + s->head_v), 1, w, 0);
        } else {
            T("attn_q.weight", 2, E, H * s->head_k, 1, w, 0);
            T("attn_k.weight", 2, E, s->n_head_kv * s->head_k, 1, w, 0);
            T("attn_v.weight", 2, E, s->n_head_kv * s->head_k, 1, w, 0);
            T("attn_q_norm.weight", 1, s->head_k, 1, 1, 0.1f, 1.0f);
            T("attn_k_norm.weight", 1, s->head_k, 1, 1, 0.1f, 1.0f);
        }
        T("attn_output.weight", 2, H * s->head_v, E, 1, w, 0);
        if (il < s->n_dense) {
            T("ffn_gate.weight", 2, E, s->n_ff, 1, w, 0);
            T("ffn_up.weight", 2, E, s->n_ff, 1, w, 0);
            T("ffn_down.weight", 2, s->n_ff, E, 1, w, 0);
            continue;
        }
        T("ffn_gate_inp.weight", 2, E, X, 1, 0.5f, 0);
        T("ffn_gate_exps.weight", 3, E, F, X, w, 0);
        T("ffn_up_exps.weight", 3, E, F, X, w, 0);
        T("ffn_down_exps.weight", 3, F, E, X, w, 0);
        if (s->bias) {
            snprintf(b, sizeof b, "blk.%d.exp_probs_b.bias", il);
            n = add_t(t, n, b, 1, X, 1, 1, 0.3f, 0);
        }
        if (s->n_shared) {
            T("ffn_gate_shexp.weight", 2, E, F * s->n_shared, 1, w, 0);
            T("ffn_up_shexp.weight", 2, E, F * s->n_shared, 1, w, 0);
            T("ffn_down_shexp.weight", 2, F * s->n_shared, E, 1, w, 0);
        }
#undef T
    }
    return n;
}

static void set_meta(gguf_writer_t *w, const spec_t *s)
{
    char k[96];
#define U32(key, v)                                                                                \
    do {                                                                                           \
        snprintf(k, sizeof k, "%s." key, s->arch);                                                 \
        cr_assert_eq(gguf_writer_set_u32(w, k, (uint32_t)(v)), ECS_OK);                            \
    } while (0)
#define F32(key, v)                                                                                \
    do {                                                                                           \
        snprintf(k, sizeof k, "%s." key, s->arch);                                                 \
        cr_assert_eq(gguf_writer_set_f32(w, k, (v)), ECS_OK);                                      \
    } while (0)
    gguf_writer_set_str(w, "general.architecture", s->arch);
    U32("block_count", s->n_layer);
    U32("context_length", 4096);
    U32("embedding_length", s->n_embd);
    U32("feed_forward_length", s->n_ff ? s->n_ff : 128);
    U32("attention.head_count", s->n_head);
    U32("attention.head_count_kv", s->n_head_kv);
    F32("rope.freq_base", 10000.0f);
    F32("attention.layer_norm_rms_epsilon", 1e-6f);
    U32("expert_used_count", s->n_used);
    U32("expert_count", s->n_expert);
    U32("expert_feed_forward_length", s->n_ff_exp);
    U32("attention.key_length", s->head_k);
    U32("attention.value_length", s->head_v);
    U32("rope.dimension_count", s->n_rot);
    if (!strcmp(s->arch, "deepseek2")) {
        U32("leading_dense_block_count", s->n_dense);
        if (s->q_lora)
            U32("attention.q_lora_rank", s->q_lora);
        U32("attention.kv_lora_rank", s->kv_lora);
        U32("expert_shared_count", s->n_shared);
        F32("expert_weights_scale", s->scale);
        snprintf(k, sizeof k, "%s.expert_weights_norm", s->arch);
        gguf_writer_set_bool(w, k, s->norm);
        U32("expert_gating_func", s->gating);
        if (s->groups) {
            U32("expert_group_count", s->groups);
            U32("expert_group_used_count", s->groups_used);
        }
        if (s->yarn) {
            snprintf(k, sizeof k, "%s.rope.scaling.type", s->arch);
            gguf_writer_set_str(w, k, "yarn");
            F32("rope.scaling.factor", 40.0f);
            U32("rope.scaling.original_context_length", 4096);
            F32("rope.scaling.yarn_log_multiplier", 0.0707f);
        }
    }
#undef U32
#undef F32
}

/* F32, or Q8_0 for s->q8 matrices whose rows split into blocks. */
static ecs_type_t tensor_type(const spec_t *s, const tdesc_t *t)
{
    return s->q8 && t->n_dims >= 2 && t->ne[0] % 32 == 0 ? ECS_TYPE_Q8_0 : ECS_TYPE_F32;
}

/* Writes a random F32 model for s to a fresh temporary path. */
static void write_model(const spec_t *s, char *path, size_t cap, uint64_t seed)
{
    static int seq;
    snprintf(path, cap, "/tmp/ecs_test_model_%d_%d.gguf", (int)getpid(), seq++);
    tdesc_t *t = calloc(64 * (size_t)s->n_layer + 8, sizeof *t);
    cr_assert_not_null(t);
    int n = describe(s, t);
    gguf_writer_t *w;
    cr_assert_eq(gguf_writer_new(&w), ECS_OK);
    set_meta(w, s);
    for (int i = 0; i < n; i++)
        if (!s->skip || strcmp(t[i].name, s->skip))
            cr_assert_eq(gguf_writer_add_tensor(w, t[i].name, tensor_type(s, &t[i]),
                                                (uint32_t)t[i].n_dims, t[i].ne),
                         ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(gguf_writer_begin(w, path), ECS_OK, "%s", ecs_errmsg());
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n; i++) {
        if (s->skip && !strcmp(t[i].name, s->skip))
            continue;
        size_t cnt = (size_t)(t[i].ne[0] * t[i].ne[1] * t[i].ne[2]);
        float *d = malloc(cnt * sizeof *d);
        cr_assert_not_null(d);
        for (size_t j = 0; j < cnt; j++)
            d[j] = t[i].base + t[i].amp * urand();
        size_t bytes = cnt * sizeof *d;
        if (tensor_type(s, &t[i]) == ECS_TYPE_Q8_0) { /* rows quantized in place */
            const size_t rs = ecs_row_size(ECS_TYPE_Q8_0, t[i].ne[0]);
            const size_t rows = cnt / (size_t)t[i].ne[0];
            uint8_t *q = malloc(rs * rows);
            cr_assert_not_null(q);
            for (size_t r = 0; r < rows; r++)
                ecs_quantize_row(ECS_TYPE_Q8_0, d + r * (size_t)t[i].ne[0], q + r * rs,
                                 t[i].ne[0]);
            memcpy(d, q, rs * rows);
            free(q);
            bytes = rs * rows;
        }
        cr_assert_eq(gguf_writer_write_tensor(w, d, bytes), ECS_OK, "%s", ecs_errmsg());
        free(d);
    }
    cr_assert_eq(gguf_writer_finish(w), ECS_OK, "%s", ecs_errmsg());
    gguf_writer_free(w);
    free(t);
}

static model_t *load_spec_threads(const spec_t *s, int n_ctx, int n_threads)
{
    char path[128];
    write_model(s, path, sizeof path, 42);
    model_t *m = load_opts(path, (model_opts_t){.n_ctx = n_ctx, .n_threads = n_threads});
    unlink(path); /* the mapping stays valid */
    return m;
}

static model_t *load_spec(const spec_t *s, int n_ctx) { return load_spec_threads(s, n_ctx, 2); }

static void random_tokens(int32_t *t, int n, int vocab, uint64_t seed)
{
    rng_state = seed;
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)((urand() * 0.5f + 0.5f) * (vocab - 1));
}

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
    static const model_experts_ops ops = {spy_submit, spy_wait, 1};
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
    static const model_experts_ops ops = {slots_submit, slots_wait, 2};
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
    static const model_experts_ops ops = {failing_submit, spy_wait, 1};
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
    static const model_experts_ops ops = {nan_submit, nan_wait, 1};
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

/* ------------------------------------------------- SIMD and thread counts */

/* Logits of every position with the kernels of one ISA, of a spec'd model
 * (s) or of a model file (s NULL). */
static float *eval_isa(const spec_t *s, const char *path, kcpu_isa_t isa, unsigned flags,
                       const int32_t *toks, int n)
{
    kcpu_set_isa(isa);
    model_t *m = s ? load_spec(s, 128) : load(path, 128);
    float *l = eval_all(m, flags, toks, n);
    model_free(m);
    kcpu_set_isa(kcpu_isa_detect());
    return l;
}

static void check_isa_paths(const spec_t *s, unsigned flags)
{
    int32_t toks[37]; /* not a multiple of any block: every tail runs */
    random_tokens(toks, 37, s->n_vocab, 21);
    float *a = eval_isa(s, NULL, kcpu_isa_detect(), flags, toks, 37);
    float *b = eval_isa(s, NULL, KCPU_ISA_SCALAR, flags, toks, 37);
    const size_t cnt = (size_t)37 * s->n_vocab;
    /* F32 caches: summation order only. F16: a query or probability that
     * lands on the other side of an F16 rounding boundary moves by 5e-4
     * relative, so the bound is that of the F16 tests above. BF16: the
     * attention products are the same bits on both ISAs; what differs
     * elsewhere may cross a BF16 rounding (4e-3 relative of one value),
     * and stays within the same bound on these models. */
    const double tol = flags & MODEL_CTX_KV_F32 ? 1e-5 : 2e-3;
    cr_assert(max_diff(a, b, cnt) <= tol * fmax(1.0, max_abs(b, cnt)),
              "%s flags %u: detected ISA vs scalar: %g", s->arch, flags, max_diff(a, b, cnt));
    free(a), free(b);
}

Test(simd, detected_isa_equals_plain_loops)
{
    if (kcpu_isa_detect() < KCPU_ISA_AVX512)
        cr_log_warn("no AVX-512 on this CPU: the comparison covers %s only",
                    kcpu_isa_name(kcpu_isa_detect()));
    spec_t s = ds2_spec();
    check_isa_paths(&s, 0);
    check_isa_paths(&s, MODEL_CTX_KV_F32);
    check_isa_paths(&s, MODEL_CTX_MLA_ABSORBED);
    check_isa_paths(&s, MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_F32);
    check_isa_paths(&s, MODEL_CTX_MLA_EXPANDED);
    check_isa_paths(&s, MODEL_CTX_MLA_EXPANDED | MODEL_CTX_KV_F32);
    /* BF16: AVX-512 BF16 kernels against the plain loops a CPU without
     * them runs (the attention the same bits, test_kv_bf16.c) */
    check_isa_paths(&s, MODEL_CTX_KV_BF16);
    check_isa_paths(&s, MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_BF16);
    check_isa_paths(&s, MODEL_CTX_MLA_EXPANDED | MODEL_CTX_KV_BF16);
    s = qwen_spec();
    check_isa_paths(&s, 0);
    check_isa_paths(&s, MODEL_CTX_KV_F32);
    check_isa_paths(&s, MODEL_CTX_KV_BF16);
}

Test(threads, logits_do_not_depend_on_the_thread_count)
{
    /* the prompt step expands the latent; the absorbed flag covers the
     * absorbed prompt path */
    const unsigned flags[2] = {0, MODEL_CTX_MLA_ABSORBED};
    for (int f = 0; f < 2; f++) {
        const int n = N_PROMPT;
        float *l[3];
        const int threads[3] = {1, 2, 3};
        for (int i = 0; i < 3; i++) {
            model_t *m = load_opts(DS2_Q8, (model_opts_t){.n_ctx = 64, .n_threads = threads[i]});
            l[i] = eval_all(m, flags[f], PROMPT, n);
            model_free(m);
        }
        const size_t cnt = (size_t)n * 102400;
        cr_assert_eq(max_diff(l[0], l[1], cnt), 0.0, "flags %u: 1 vs 2 threads", flags[f]);
        cr_assert_eq(max_diff(l[0], l[2], cnt), 0.0, "flags %u: 1 vs 3 threads", flags[f]);
        for (int i = 0; i < 3; i++)
            free(l[i]);
    }
}

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

/* ---- the absorbed path's packed Q8_0 W_kT (model_simd_t.dot_q8p) */

Test(mla, packed_wkt_same_on_every_isa)
{
    /* the packed product itself gives the same bits on every ISA; what
     * remains is the other kernels' float summation order (2.4e-7 when
     * written), where a wrong lane or block would cost the absorbed form's
     * whole accuracy (absorbed_close_to_expanded_q8: 0.08) */
    enum { N = 21 };
    int32_t toks[N];
    model_t *m = load(DS2_Q8, 128);
    const int vocab = model_n_vocab(m);
    model_free(m);
    random_tokens(toks, N, vocab, 33);
    float *a = eval_isa(NULL, DS2_Q8, kcpu_isa_detect(), MODEL_CTX_MLA_ABSORBED, toks, N);
    float *b = eval_isa(NULL, DS2_Q8, KCPU_ISA_SCALAR, MODEL_CTX_MLA_ABSORBED, toks, N);
    const size_t cnt = (size_t)N * vocab;
    cr_log_info("packed W_kT, detected ISA vs scalar: max %g mean %g", max_diff(a, b, cnt),
                mean_diff(a, b, cnt));
    cr_assert(max_diff(a, b, cnt) < 1e-4, "detected ISA vs scalar: %g", max_diff(a, b, cnt));
    cr_assert(mean_diff(a, b, cnt) < 1e-5, "mean diff %g", mean_diff(a, b, cnt));
    free(a), free(b);
}

/* ------------------------------------------------ decode paths  */

/* A width that is not a multiple of the 16-value blocks of the weighted
 * sum and the residual adds, so their remainders run too. */
static spec_t odd_width_spec(void)
{
    spec_t s = ds2_spec();
    s.n_embd = 72;
    return s;
}

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

/* ---------------------------------------------- decode copy (repack.c) */

static size_t file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (size_t)st.st_size : 0;
}

/* A Q8_0 deepseek2 whose matrices of 256-value rows get a decode copy:
 * logits bit for bit those without it (one token per step, batched, with
 * prompt tiles from the copy), the copy found again, remade when damaged,
 * and refused (the model still runs) when memory is short. Here, unlike
 * the integration test, under the sanitizers too. */
Test(repack, decode_copy_same_bits_and_cache)
{
    if (!kcpu_gemm(ECS_TYPE_Q8_0).r16) {
        cr_log_warn("no interleaved kernels on this CPU: the copy is never made");
        return;
    }
    spec_t s = ds2_spec();
    s.n_embd = 256, s.q8 = true;
    char path[128], dir[] = "/tmp/ecs_repack_XXXXXX", copy[256];
    write_model(&s, path, sizeof path, 7);
    cr_assert_not_null(mkdtemp(dir));
    snprintf(copy, sizeof copy, "%s/%s.r16", dir, strrchr(path, '/') + 1);
    int32_t toks[20];
    random_tokens(toks, 20, s.n_vocab, 5);
    const size_t cnt = (size_t)20 * s.n_vocab;
    const model_opts_t plain = {.n_ctx = 64, .n_threads = 2};
    model_opts_t o = plain;
    o.repack_dir = dir;

    model_t *m = load_opts(path, plain);
    float *ref1 = eval_one_by_one(m, 0, toks, 20), *refb = eval_all(m, 0, toks, 20);
    model_free(m);

    bool made;
    const char *where;
    for (int round = 0; round < 4; round++) {
        /* 0: made, 1: found, 2: damaged -> made, 3: memory for the copy and the
         * rest of the GGUF only */
        if (round == 2) {
            FILE *f = fopen(copy, "r+b");
            cr_assert_not_null(f);
            fputs("XXXXXXXX", f);
            fclose(f);
        }
        o.repack_ram = round == 3 ? file_size(path) + file_size(copy) - 1 : 0;
        m = load_opts(path, o);
        cr_assert_null(model_repack_note(m), "round %d: %s", round, model_repack_note(m));
        cr_assert_gt(model_repack_bytes(m, &where, &made), 0, "round %d: no copy", round);
        cr_assert_str_eq(where, copy);
        cr_assert_eq(made, round == 0 || round == 2, "round %d: made %d", round, made);
        float *a = eval_one_by_one(m, 0, toks, 20), *b = eval_all(m, 0, toks, 20);
        cr_assert_eq(memcmp(a, ref1, cnt * sizeof *a), 0, "round %d: decode logits differ", round);
        cr_assert_eq(memcmp(b, refb, cnt * sizeof *b), 0, "round %d: batched logits differ", round);
        free(a), free(b);
        model_free(m);
    }
    o.repack_ram = 1000; /* nothing fits: no copy, a reason, same results */
    m = load_opts(path, o);
    cr_assert_not_null(model_repack_note(m));
    cr_assert_eq(model_repack_bytes(m, NULL, NULL), 0);
    float *a = eval_one_by_one(m, 0, toks, 20);
    cr_assert_eq(memcmp(a, ref1, cnt * sizeof *a), 0, "logits differ without the copy");
    free(a);
    model_free(m);
    free(ref1), free(refb);
    unlink(copy), unlink(path), rmdir(dir);
}
