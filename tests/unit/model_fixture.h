/* model_fixture.h - what the test_model_*.c files share: the tiny Q8_0
 * models and a prompt, load and evaluation helpers, logit comparisons, and
 * small random F32 models written to /tmp (every architecture variant:
 * q-LoRA or not, tied head, sigmoid gating with groups and bias, GQA, an
 * odd width) so that paths which must be mathematically equal can be
 * compared without activation quantization. */
#ifndef ECS_TEST_MODEL_FIXTURE_H
#define ECS_TEST_MODEL_FIXTURE_H

/* each test file uses some of these */
#define FX static __attribute__((unused))

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
FX const int32_t PROMPT[] = {100000, 549, 3399, 10176, 32431, 33747, 855, 254, 24547, 5025,
                             3345, 254, 7257, 8144, 6185, 13, 82987, 32840, 94838, 62990};
#define N_PROMPT ((int)(sizeof PROMPT / sizeof PROMPT[0]))

/* ------------------------------------------------------------- helpers */

FX model_t *load_opts(const char *path, model_opts_t o)
{
    model_t *m = NULL;
    ecs_err_t e = model_load(path, &o, &m);
    cr_assert_eq(e, ECS_OK, "model_load(%s): %s", path, ecs_errmsg());
    return m;
}

FX model_t *load(const char *path, int n_ctx)
{
    model_opts_t o = {.n_ctx = n_ctx, .n_threads = 2};
    model_t *m = NULL;
    ecs_err_t e = model_load(path, &o, &m);
    cr_assert_eq(e, ECS_OK, "model_load(%s): %s", path, ecs_errmsg());
    return m;
}

FX float *eval_all(model_t *m, unsigned flags, const int32_t *toks, int n)
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

FX float *eval_one_by_one(model_t *m, unsigned flags, const int32_t *toks, int n)
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

FX double max_abs(const float *a, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(a[i]));
    return mx;
}

FX double max_diff(const float *a, const float *b, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(isfinite(a[i]) && isfinite(b[i]), "non-finite value at %zu", i);
        mx = fmax(mx, fabs((double)a[i] - b[i]));
    }
    return mx;
}

FX double mean_diff(const float *a, const float *b, size_t n)
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

FX spec_t ds2_spec(void)
{
    return (spec_t){.arch = "deepseek2", .n_layer = 3, .n_embd = 64, .n_head = 4, .n_head_kv = 4,
                    .head_k = 24, .head_v = 16, .n_rot = 8, .n_vocab = 160, .q_lora = 32,
                    .kv_lora = 32, .n_dense = 1, .n_ff = 96, .n_expert = 8, .n_used = 3,
                    .n_ff_exp = 32, .n_shared = 1, .gating = 1, .scale = 1.0f, .yarn = true};
}

FX spec_t qwen_spec(void)
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

FX uint64_t rng_state;
FX float urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

FX int add_t(tdesc_t *t, int n, const char *name, int nd, int64_t a, int64_t b, int64_t c,
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
FX int describe(const spec_t *s, tdesc_t *t)
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

FX void set_meta(gguf_writer_t *w, const spec_t *s)
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
FX ecs_type_t tensor_type(const spec_t *s, const tdesc_t *t)
{
    return s->q8 && t->n_dims >= 2 && t->ne[0] % 32 == 0 ? ECS_TYPE_Q8_0 : ECS_TYPE_F32;
}

/* Writes a random F32 model for s to a fresh temporary path. */
FX void write_model(const spec_t *s, char *path, size_t cap, uint64_t seed)
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

FX model_t *load_spec_threads(const spec_t *s, int n_ctx, int n_threads)
{
    char path[128];
    write_model(s, path, sizeof path, 42);
    model_t *m = load_opts(path, (model_opts_t){.n_ctx = n_ctx, .n_threads = n_threads});
    unlink(path); /* the mapping stays valid */
    return m;
}

FX model_t *load_spec(const spec_t *s, int n_ctx) { return load_spec_threads(s, n_ctx, 2); }

FX void random_tokens(int32_t *t, int n, int vocab, uint64_t seed)
{
    rng_state = seed;
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)((urand() * 0.5f + 0.5f) * (vocab - 1));
}

/* A width that is not a multiple of the 16-value blocks of the weighted
 * sum and the residual adds, so their remainders run too. */
FX spec_t odd_width_spec(void)
{
    spec_t s = ds2_spec();
    s.n_embd = 72;
    return s;
}

#endif /* ECS_TEST_MODEL_FIXTURE_H */
