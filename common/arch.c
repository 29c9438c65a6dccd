/* arch.c - the architectures' hyperparameters from GGUF metadata, and the
 * routed experts' tensor names (arch.h).
 *
 * Defaults and key names follow llama.cpp's loader (c392e509 for deepseek2,
 * ik_llama.cpp for qwen3moe): see shared/reference/model-shapes-*.md. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/arch.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        ecs_err_t err_ = (expr);                                                                   \
        if (err_ != ECS_OK)                                                                        \
            return err_;                                                                           \
    } while (0)

/* ---------------------------------------------------------------- metadata */

typedef struct {
    const gguf_file_t *f;
    const char *arch;
} meta_t;

static ecs_err_t key_u32(const meta_t *mt, const char *suffix, bool required, uint32_t def,
                         int *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    uint32_t v = def;
    ecs_err_t e = required ? gguf_get_u32(mt->f, key, &v) : gguf_get_u32_or(mt->f, key, def, &v);
    if (e != ECS_OK)
        return ecs_error(e, "%s: metadata %s: %s", gguf_path(mt->f), key, ecs_errmsg());
    if (v > (1u << 30))
        return ecs_error(ECS_ERR_RANGE, "%s: metadata %s = %u is out of range", gguf_path(mt->f),
                         key, v);
    *out = (int)v;
    return ECS_OK;
}

static ecs_err_t key_f32(const meta_t *mt, const char *suffix, bool required, float def,
                         float *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    ecs_err_t e = required ? gguf_get_f32(mt->f, key, out) : gguf_get_f32_or(mt->f, key, def, out);
    if (e != ECS_OK)
        return ecs_error(e, "%s: metadata %s: %s", gguf_path(mt->f), key, ecs_errmsg());
    if (!isfinite(*out))
        return ecs_error(ECS_ERR_RANGE, "%s: metadata %s is not finite", gguf_path(mt->f), key);
    return ECS_OK;
}

static ecs_err_t key_bool(const meta_t *mt, const char *suffix, bool def, bool *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", mt->arch, suffix);
    ecs_err_t e = gguf_get_bool_or(mt->f, key, def, out);
    if (e != ECS_OK)
        return ecs_error(e, "%s: metadata %s: %s", gguf_path(mt->f), key, ecs_errmsg());
    return ECS_OK;
}


/* Rope scaling keys shared by both architectures (llama.cpp semantics:
 * freq_scale = 1/factor whatever the type; YaRN turns on ext_factor). */
static ecs_err_t read_rope(const meta_t *mt, arch_hparams_t *hp)
{
    arch_rope_t *r = &hp->rope;
    TRY(key_f32(mt, "rope.freq_base", false, 10000.0f, &r->freq_base));
    float factor = 0.0f;
    TRY(key_f32(mt, "rope.scaling.factor", false, 0.0f, &factor));
    if (factor < 0.0f)
        return ecs_error(ECS_ERR_RANGE, "%s: rope.scaling.factor %g < 0", gguf_path(mt->f), factor);
    r->freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", mt->arch);
    gguf_str_t type = {"linear", 6};
    if (gguf_find(mt->f, key) && gguf_get_str(mt->f, key, &type) != ECS_OK)
        return ecs_error(ECS_ERR_TYPE, "%s: %s is not a string", gguf_path(mt->f), key);
    r->ext_factor = gguf_str_eq(type, "yarn") ? 1.0f : 0.0f;
    TRY(key_u32(mt, "rope.scaling.original_context_length", false, (uint32_t)hp->n_ctx_train,
                &r->n_ctx_orig));
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    r->attn_factor = 1.0f;
    if (r->freq_base <= 0.0f)
        return ecs_error(ECS_ERR_RANGE, "%s: rope.freq_base %g <= 0", gguf_path(mt->f), r->freq_base);
    return ECS_OK;
}

static ecs_err_t read_common(const meta_t *mt, arch_hparams_t *hp)
{
    TRY(key_u32(mt, "block_count", true, 0, &hp->n_layer));
    TRY(key_u32(mt, "context_length", true, 0, &hp->n_ctx_train));
    TRY(key_u32(mt, "embedding_length", true, 0, &hp->n_embd));
    TRY(key_u32(mt, "attention.head_count", true, 0, &hp->n_head));
    TRY(key_f32(mt, "attention.layer_norm_rms_epsilon", true, 0, &hp->rms_eps));
    if (hp->n_layer < 1 || hp->n_layer > ARCH_MAX_LAYERS || hp->n_embd < 1 || hp->n_head < 1)
        return ecs_error(ECS_ERR_RANGE, "%s: bad block_count %d / embedding_length %d / head_count %d",
                         gguf_path(mt->f), hp->n_layer, hp->n_embd, hp->n_head);
    TRY(key_u32(mt, "attention.head_count_kv", false, (uint32_t)hp->n_head, &hp->n_head_kv));
    TRY(key_u32(mt, "attention.key_length", false, (uint32_t)(hp->n_embd / hp->n_head), &hp->head_k));
    TRY(key_u32(mt, "attention.value_length", false, (uint32_t)(hp->n_embd / hp->n_head),
                &hp->head_v));
    TRY(key_u32(mt, "rope.dimension_count", false, (uint32_t)hp->head_k, &hp->rope.n_rot));
    TRY(key_u32(mt, "expert_count", false, 0, &hp->n_expert));
    TRY(key_u32(mt, "expert_used_count", false, 0, &hp->n_expert_used));
    TRY(key_u32(mt, "expert_group_count", false, 0, &hp->n_expert_groups));
    TRY(key_u32(mt, "expert_group_used_count", false, 0, &hp->n_group_used));
    TRY(read_rope(mt, hp));
    if (hp->head_k < 1 || hp->head_v < 1 || hp->head_k > 4096 || hp->head_v > 4096 ||
        hp->n_head_kv < 1 || hp->n_head > 4096 || hp->rope.n_rot < 0 || hp->rope.n_rot > hp->head_k)
        return ecs_error(ECS_ERR_RANGE, "%s: bad attention shape: %d heads (%d kv), key %d, value %d, "
                         "rope %d", gguf_path(mt->f), hp->n_head, hp->n_head_kv, hp->head_k,
                         hp->head_v, hp->rope.n_rot);
    return ECS_OK;
}

static ecs_err_t read_deepseek2(const meta_t *mt, arch_hparams_t *hp, bool q_lora)
{
    hp->arch = ARCH_DEEPSEEK2;
    TRY(key_u32(mt, "leading_dense_block_count", true, 0, &hp->n_layer_dense));
    TRY(key_u32(mt, "feed_forward_length", hp->n_layer_dense > 0, 0, &hp->n_ff));
    TRY(key_u32(mt, "attention.kv_lora_rank", true, 0, &hp->kv_lora_rank));
    if (q_lora) {
        TRY(key_u32(mt, "attention.q_lora_rank", true, 0, &hp->q_lora_rank));
        if (hp->q_lora_rank < 1)
            return ecs_error(ECS_ERR_RANGE, "%s: q_lora_rank is 0 but attn_q_a exists",
                             gguf_path(mt->f));
    }
    TRY(key_u32(mt, "expert_feed_forward_length", true, 0, &hp->n_ff_exp));
    TRY(key_u32(mt, "expert_shared_count", true, 0, &hp->n_expert_shared));
    TRY(key_f32(mt, "expert_weights_scale", false, 1.0f, &hp->expert_weights_scale));
    TRY(key_bool(mt, "expert_weights_norm", false, &hp->expert_weights_norm));
    int gating = 0;
    TRY(key_u32(mt, "expert_gating_func", false, 0, &gating));
    if (gating != 0 && gating != ARCH_GATING_SOFTMAX && gating != ARCH_GATING_SIGMOID)
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: expert_gating_func %d is not supported",
                         gguf_path(mt->f), gating);
    hp->gating = gating == 0 ? ARCH_GATING_SOFTMAX : (arch_gating_t)gating;
    float yarn_log_mul = 0.0f;
    TRY(key_f32(mt, "rope.scaling.yarn_log_multiplier", false, 0.0f, &yarn_log_mul));

    hp->n_head_kv = hp->n_head; /* MLA: every head has its own K/V */
    hp->rope.mode = ARCH_ROPE_NORM;
    hp->n_ff_shexp = hp->n_ff_exp * hp->n_expert_shared; /* <= 2^26: check_ranges */
    if (hp->rope.n_rot < 2 || hp->rope.n_rot >= hp->head_k || hp->rope.n_rot % 2 ||
        hp->kv_lora_rank < 1)
        return ecs_error(ECS_ERR_RANGE, "%s: bad MLA dims: key_length %d, rope dims %d, kv_lora %d",
                         gguf_path(mt->f), hp->head_k, hp->rope.n_rot, hp->kv_lora_rank);
    hp->qk_nope = hp->head_k - hp->rope.n_rot;
    /* build_deepseek2 pre-scales: attention logits by mscale^2 and the rope
     * by 1/(1 + 0.1 ln(1/freq_scale)), which cancels the magnitude ggml's
     * YaRN rope applies internally. */
    const float fs = hp->rope.freq_scale;
    const float mscale = 1.0f * (1.0f + yarn_log_mul * logf(1.0f / fs));
    hp->kq_scale = mscale * mscale / sqrtf((float)hp->head_k);
    hp->rope.attn_factor = 1.0f / (1.0f + 0.1f * logf(1.0f / fs));
    return ECS_OK;
}

static ecs_err_t read_qwen3moe(const meta_t *mt, arch_hparams_t *hp)
{
    hp->arch = ARCH_QWEN3MOE;
    TRY(key_u32(mt, "feed_forward_length", false, 0, &hp->n_ff));
    int fallback = hp->n_expert_used > 0 ? hp->n_ff / hp->n_expert_used : 0;
    TRY(key_u32(mt, "expert_feed_forward_length", false, (uint32_t)fallback, &hp->n_ff_exp));
    TRY(key_bool(mt, "expert_weights_norm", true, &hp->expert_weights_norm));
    hp->expert_weights_scale = 1.0f;
    hp->gating = ARCH_GATING_SOFTMAX;
    hp->n_layer_dense = 0;
    hp->rope.mode = ARCH_ROPE_NEOX;
    hp->kq_scale = 1.0f / sqrtf((float)hp->head_k);
    if (hp->head_k != hp->head_v || hp->rope.n_rot != hp->head_k || hp->head_k % 2)
        return ecs_error(ECS_ERR_UNSUPPORTED,
                         "%s: qwen3moe needs key_length == value_length == rope dims (got %d, %d, %d)",
                         gguf_path(mt->f), hp->head_k, hp->head_v, hp->rope.n_rot);
    if (hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv)
        return ecs_error(ECS_ERR_RANGE, "%s: head_count %d is not a multiple of head_count_kv %d",
                         gguf_path(mt->f), hp->n_head, hp->n_head_kv);
    return ECS_OK;
}

static ecs_err_t check_moe(const gguf_file_t *f, const arch_hparams_t *hp)
{
    if (hp->n_expert < 1 || hp->n_expert > ARCH_MAX_EXPERTS || hp->n_expert_used < 1 ||
        hp->n_expert_used > hp->n_expert || hp->n_ff_exp < 1)
        return ecs_error(ECS_ERR_RANGE, "%s: bad MoE shape: %d experts, %d used, width %d",
                         gguf_path(f), hp->n_expert, hp->n_expert_used, hp->n_ff_exp);
    if (hp->n_expert_groups > 1) {
        int per = hp->n_expert / hp->n_expert_groups;
        if (hp->n_expert % hp->n_expert_groups || hp->n_group_used < 1 ||
            hp->n_group_used > hp->n_expert_groups || per * hp->n_group_used < hp->n_expert_used)
            return ecs_error(ECS_ERR_RANGE,
                             "%s: bad expert groups: %d experts in %d groups, %d groups used, %d "
                             "experts used",
                             gguf_path(f), hp->n_expert, hp->n_expert_groups, hp->n_group_used,
                             hp->n_expert_used);
    }
    if (hp->n_layer_dense > hp->n_layer || (hp->n_layer_dense > 0 && hp->n_ff < 1))
        return ecs_error(ECS_ERR_RANGE, "%s: bad leading_dense_block_count %d", gguf_path(f),
                         hp->n_layer_dense);
    return ECS_OK;
}

/* ------------------------------------------------------------- key ranges */

typedef struct {
    const char *suffix;
    double lo, hi;
    bool lo_open; /* lo itself is out of range */
} range_t;

/* Widths are bounded well below 2^31 / the largest factor they are
 * multiplied by in int (n_ff_exp * expert_shared_count). */
#define DIM_MAX (1 << 20)

static const range_t INT_KEYS[] = {
    {"block_count", 1, ARCH_MAX_LAYERS, false},
    {"context_length", 1, 1 << 30, false},
    {"embedding_length", 1, 1 << 16, false},
    {"feed_forward_length", 0, DIM_MAX, false},
    {"attention.head_count", 1, 4096, false},
    {"attention.head_count_kv", 1, 4096, false},
    {"attention.key_length", 1, 4096, false},
    {"attention.value_length", 1, 4096, false},
    {"attention.q_lora_rank", 0, 1 << 16, false},
    {"attention.kv_lora_rank", 1, 1 << 16, false},
    {"rope.dimension_count", 0, 4096, false},
    {"rope.scaling.original_context_length", 1, 1 << 30, false},
    {"expert_count", 0, ARCH_MAX_EXPERTS, false},
    {"expert_used_count", 0, ARCH_MAX_EXPERTS, false},
    {"expert_feed_forward_length", 1, DIM_MAX, false},
    {"expert_shared_count", 0, 64, false},
    {"leading_dense_block_count", 0, ARCH_MAX_LAYERS, false},
};

static const range_t FLOAT_KEYS[] = {
    {"attention.layer_norm_rms_epsilon", 0, 1e-2, true},
    {"rope.freq_base", 1, 1e10, false},
    {"rope.scaling.factor", 0, 1024, false},
    {"rope.scaling.yarn_log_multiplier", 0, 10, false},
    {"expert_weights_scale", 0, 100, false},
};

static ecs_err_t out_of_range(const gguf_file_t *f, const char *key, double v, const range_t *r)
{
    return ecs_error(ECS_ERR_RANGE, "%s: metadata %s = %g is out of range %s%g, %g]",
                     gguf_path(f), key, v, r->lo_open ? "(" : "[", r->lo, r->hi);
}

/* Every numeric key the loaders use inside a sane range, before any is
 * read (also keeps the shape arithmetic far from int overflow). */
static ecs_err_t check_ranges(const gguf_file_t *f)
{
    gguf_str_t arch;
    if (gguf_get_str(f, "general.architecture", &arch) != ECS_OK || arch.len > 32)
        return ECS_OK; /* the loader says what is wrong */
    char key[192];
    for (size_t i = 0; i < sizeof INT_KEYS / sizeof INT_KEYS[0]; i++) {
        const range_t *r = &INT_KEYS[i];
        snprintf(key, sizeof key, "%.*s.%s", (int)arch.len, arch.ptr, r->suffix);
        const gguf_value_t *v = gguf_find(f, key);
        uint64_t u;
        if (!v || gguf_get_u64(f, key, &u) != ECS_OK)
            continue; /* absent or not an unsigned integer: the loader's error */
        if ((double)u < r->lo || (double)u > r->hi)
            return ecs_error(ECS_ERR_RANGE, "%s: metadata %s = %llu is out of range (%.0f..%.0f)",
                             gguf_path(f), key, (unsigned long long)u, r->lo, r->hi);
    }
    for (size_t i = 0; i < sizeof FLOAT_KEYS / sizeof FLOAT_KEYS[0]; i++) {
        const range_t *r = &FLOAT_KEYS[i];
        snprintf(key, sizeof key, "%.*s.%s", (int)arch.len, arch.ptr, r->suffix);
        float x;
        if (!gguf_find(f, key) || gguf_get_f32(f, key, &x) != ECS_OK)
            continue;
        if (!(x >= r->lo) || (r->lo_open && x == r->lo) || !(x <= r->hi))
            return out_of_range(f, key, x, r);
    }
    return ECS_OK;
}

ecs_err_t arch_read_hparams(const gguf_file_t *f, arch_hparams_t *hp)
{
    memset(hp, 0, sizeof *hp);
    TRY(check_ranges(f));
    gguf_str_t arch;
    if (gguf_get_str(f, "general.architecture", &arch) != ECS_OK)
        return ecs_error(ECS_ERR_FORMAT, "%s: no general.architecture string", gguf_path(f));
    meta_t mt = {f, NULL};
    if (gguf_str_eq(arch, "deepseek2"))
        mt.arch = "deepseek2";
    else if (gguf_str_eq(arch, "qwen3moe"))
        mt.arch = "qwen3moe";
    else
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: architecture '%.*s' is not supported "
                         "(deepseek2, qwen3moe)", gguf_path(f), (int)(arch.len > 64 ? 64 : arch.len),
                         arch.ptr);
    TRY(read_common(&mt, hp));
    if (mt.arch[0] == 'd') {
        /* q-LoRA is present exactly when the layers have attn_q_a (llama.cpp
         * infers its absence from n_layer == 27, which the files agree with). */
        bool q_lora = gguf_find_tensor(f, "blk.0.attn_q_a.weight") != NULL;
        TRY(read_deepseek2(&mt, hp, q_lora));
    } else {
        TRY(read_qwen3moe(&mt, hp));
    }
    return check_moe(f, hp);
}

/* ----------------------------------------------------------- expert stacks */

bool arch_layer_moe(const arch_hparams_t *hp, int il)
{
    return il >= hp->n_layer_dense && il < hp->n_layer;
}

const char *arch_exps_name(char *buf, size_t n, int layer, arch_exps_t which)
{
    static const char *const what[] = {"gate", "up", "down"};
    snprintf(buf, n, "blk.%d.ffn_%s_exps.weight", layer, what[which]);
    return buf;
}

/* name's tensor, of shape [ff or n_embd (down), n_embd or ff (down), stack]. */
static ecs_err_t ffn_tensor(const gguf_file_t *f, const arch_hparams_t *hp, const char *name,
                            arch_exps_t which, int64_t ff, int64_t stack,
                            const gguf_tensor_t **out)
{
    const gguf_tensor_t *t = gguf_find_tensor(f, name);
    if (!t)
        return ecs_error(ECS_ERR_NOTFOUND, "%s: missing tensor %s", gguf_path(f), name);
    const int64_t cols = which == ARCH_EXPS_DOWN ? ff : hp->n_embd;
    const int64_t rows = which == ARCH_EXPS_DOWN ? hp->n_embd : ff;
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != stack || t->ne[3] != 1)
        return ecs_error(ECS_ERR_FORMAT,
                         "%s: tensor %s has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                         gguf_path(f), name, (long long)t->ne[0], (long long)t->ne[1],
                         (long long)t->ne[2], (long long)cols, (long long)rows, (long long)stack);
    *out = t;
    return ECS_OK;
}

ecs_err_t arch_exps_tensor(const gguf_file_t *f, const arch_hparams_t *hp, int layer,
                           arch_exps_t which, const gguf_tensor_t **out)
{
    char name[96];
    arch_exps_name(name, sizeof name, layer, which);
    return ffn_tensor(f, hp, name, which, hp->n_ff_exp, hp->n_expert, out);
}

ecs_err_t arch_shexp_tensor(const gguf_file_t *f, const arch_hparams_t *hp, int layer,
                            arch_exps_t which, const gguf_tensor_t **out)
{
    static const char *const what[] = {"gate", "up", "down"};
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_%s_shexp.weight", layer, what[which]);
    if (hp->n_ff_shexp <= 0)
        return ecs_error(ECS_ERR_NOTFOUND, "%s: the model has no shared experts (%s)",
                         gguf_path(f), name);
    return ffn_tensor(f, hp, name, which, hp->n_ff_shexp, 1, out);
}
