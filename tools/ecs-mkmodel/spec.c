/* spec.c - what a deepseek2 / qwen3moe GGUF must contain, as llama.cpp
 * writes and loads it: presets, hyperparameter checks, metadata keys in
 * file order, tensor names and shapes (ggml ne order), and the per-tensor
 * type llama-quantize picks for f32 / q8_0 / q4_k_m. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/ecs-mkmodel/mkmodel.h"

#define P(f, fl, h) { f, offsetof(mk_hparams_t, fl), false, h }
#define PF(f, fl, h) { f, offsetof(mk_hparams_t, fl), true, h }
const mk_param_t mk_params[] = {
    P("n-layer", n_layer, "block count"),
    P("n-embd", n_embd, "hidden size"),
    P("n-head", n_head, "attention heads"),
    P("n-head-kv", n_head_kv, "KV heads (deepseek2: must equal n-head)"),
    P("n-ff", n_ff, "dense FFN width (deepseek2 leading dense blocks; qwen3moe: metadata only)"),
    P("n-ff-exp", n_ff_exp, "expert FFN width"),
    P("n-expert", n_expert, "routed experts"),
    P("n-expert-used", n_expert_used, "experts per token"),
    P("n-shared", n_shared, "shared experts (deepseek2)"),
    P("n-dense", n_dense, "leading dense blocks (deepseek2)"),
    P("kv-lora-rank", kv_lora_rank, "MLA latent rank (deepseek2)"),
    P("q-lora-rank", q_lora_rank, "q-LoRA rank (deepseek2; none with 27 layers)"),
    P("qk-rope", qk_rope, "rotary dims per head (deepseek2)"),
    P("qk-nope", qk_nope, "non-rotary q/k dims per head (deepseek2)"),
    P("v-head", v_head, "value dims per head (deepseek2)"),
    P("head-dim", head_dim, "head size (qwen3moe)"),
    P("vocab-size", vocab_size, "vocabulary rows (only without --vocab)"),
    P("ctx", ctx, "context_length"),
    PF("rope-base", rope_base, "rope.freq_base"),
    PF("rms-eps", rms_eps, "RMSNorm epsilon"),
    PF("yarn-factor", yarn_factor, "rope.scaling.factor (deepseek2)"),
    P("yarn-orig-ctx", yarn_orig_ctx, "rope.scaling.original_context_length (deepseek2)"),
    PF("yarn-log-mul", yarn_log_mul, "rope.scaling.yarn_log_multiplier (deepseek2)"),
    PF("expert-weights-scale", expert_weights_scale, "routed weight scale (deepseek2)"),
    P("expert-weights-norm", expert_weights_norm, "renormalise top-k weights, 0 or 1"),
    P("gating-func", gating_func, "expert_gating_func (deepseek2): 1 softmax, 2 sigmoid"),
};
const int mk_n_params = (int)(sizeof mk_params / sizeof mk_params[0]);
_Static_assert(sizeof mk_params / sizeof mk_params[0] <= MK_MAX_PARAMS, "raise MK_MAX_PARAMS");

/* Upper bound for any width or count: keeps every product of three of them
 * inside int64 and every name inside its buffer. */
#define MK_DIM_MAX ((int64_t)1 << 20)
#define MK_VOCAB_MAX ((int64_t)1 << 24)

static const mk_hparams_t ds2_tiny = {
    .n_layer = 4, .n_embd = 256, .n_head = 4, .n_head_kv = 4, .n_ff = 512, .n_ff_exp = 128,
    .n_expert = 16, .n_expert_used = 4, .n_shared = 2, .n_dense = 1,
    .kv_lora_rank = 64, .q_lora_rank = 128, .qk_rope = 16, .qk_nope = 32, .v_head = 32,
    .ctx = 4096, .yarn_orig_ctx = 4096, .gating_func = 1, .expert_weights_norm = 0,
    .rope_base = 10000.0, .rms_eps = 1e-6, .yarn_factor = 40.0, .yarn_log_mul = 0.0707,
    .expert_weights_scale = 1.0,
};

static const mk_hparams_t ds2_lite = {
    .n_layer = 27, .n_embd = 2048, .n_head = 16, .n_head_kv = 16, .n_ff = 10944, .n_ff_exp = 1408,
    .n_expert = 64, .n_expert_used = 6, .n_shared = 2, .n_dense = 1,
    .kv_lora_rank = 512, .q_lora_rank = 0, .qk_rope = 64, .qk_nope = 128, .v_head = 128,
    .vocab_size = 102400, .ctx = 163840, .yarn_orig_ctx = 4096, .gating_func = 1,
    .expert_weights_norm = 0, .rope_base = 10000.0, .rms_eps = 1e-6, .yarn_factor = 40.0,
    .yarn_log_mul = 0.0707, .expert_weights_scale = 1.0,
};

static const mk_hparams_t qwen_tiny = {
    .n_layer = 4, .n_embd = 256, .n_head = 8, .n_head_kv = 2, .n_ff = 512, .n_ff_exp = 128,
    .n_expert = 16, .n_expert_used = 4, .head_dim = 32, .ctx = 4096, .expert_weights_norm = 1,
    .rope_base = 1e6, .rms_eps = 1e-6,
};

/* Qwen3-30B-A3B's HF config: intermediate_size 6144, moe_intermediate_size
 * 768, max_position_embeddings 40960, vocab 151936 (padded). */
static const mk_hparams_t qwen_30b = {
    .n_layer = 48, .n_embd = 2048, .n_head = 32, .n_head_kv = 4, .n_ff = 6144, .n_ff_exp = 768,
    .n_expert = 128, .n_expert_used = 8, .head_dim = 128, .vocab_size = 151936, .ctx = 40960,
    .expert_weights_norm = 1, .rope_base = 1e6, .rms_eps = 1e-6,
};

ecs_err_t mk_parse_arch(const char *s, mk_arch_t *out)
{
    if (!strcmp(s, "deepseek2"))
        *out = MK_ARCH_DEEPSEEK2;
    else if (!strcmp(s, "qwen3moe"))
        *out = MK_ARCH_QWEN3MOE;
    else
        return ecs_error(ECS_ERR_INVAL, "unknown --arch '%s' (deepseek2, qwen3moe)", s);
    return ECS_OK;
}

ecs_err_t mk_parse_ftype(const char *s, mk_ftype_t *out)
{
    if (!strcmp(s, "f32"))
        *out = MK_FT_F32;
    else if (!strcmp(s, "q8_0"))
        *out = MK_FT_Q8_0;
    else if (!strcmp(s, "q4_k_m"))
        *out = MK_FT_Q4_K_M;
    else
        return ecs_error(ECS_ERR_INVAL, "unknown --types '%s' (f32, q8_0, q4_k_m)", s);
    return ECS_OK;
}

const char *mk_arch_name(mk_arch_t arch)
{
    return arch == MK_ARCH_DEEPSEEK2 ? "deepseek2" : "qwen3moe";
}

ecs_err_t mk_preset(mk_arch_t arch, const char *preset, mk_hparams_t *hp)
{
    const mk_hparams_t *src = NULL;
    if (arch == MK_ARCH_DEEPSEEK2) {
        if (!strcmp(preset, "tiny") || !strcmp(preset, "tiny-27l"))
            src = &ds2_tiny;
        else if (!strcmp(preset, "ds2-lite"))
            src = &ds2_lite;
    } else {
        if (!strcmp(preset, "tiny"))
            src = &qwen_tiny;
        else if (!strcmp(preset, "qwen3-30b-a3b"))
            src = &qwen_30b;
    }
    if (!src)
        return ecs_error(ECS_ERR_INVAL, "unknown --preset '%s' for %s (deepseek2: tiny, tiny-27l, "
                         "ds2-lite; qwen3moe: tiny, qwen3-30b-a3b)", preset, mk_arch_name(arch));
    *hp = *src;
    if (!strcmp(preset, "tiny-27l")) {
        hp->n_layer = 27;
        hp->q_lora_rank = 0;
    }
    return ECS_OK;
}

static ecs_err_t in_range(const char *what, int64_t v, int64_t lo, int64_t hi)
{
    if (v < lo || v > hi)
        return ecs_error(ECS_ERR_RANGE, "--%s %lld out of range [%lld, %lld]", what, (long long)v,
                         (long long)lo, (long long)hi);
    return ECS_OK;
}

static ecs_err_t positive(const char *what, double v)
{
    if (!(v > 0.0 && v < 1e30))
        return ecs_error(ECS_ERR_RANGE, "--%s %g must be positive and finite", what, v);
    return ECS_OK;
}

/* llama.cpp c392e509 picks V2-Lite attention (plain attn_q, no q-LoRA) by
 * n_layer == 27 alone. */
static bool ds2_lite_attn(const mk_hparams_t *hp) { return hp->n_layer == 27; }

static ecs_err_t validate_ds2(mk_hparams_t *hp, bool q_lora_explicit)
{
    ecs_err_t err;
    if (ds2_lite_attn(hp)) {
        if (q_lora_explicit && hp->q_lora_rank)
            return ecs_error(ECS_ERR_INVAL, "deepseek2 with 27 layers has no q-LoRA (llama.cpp "
                             "treats n_layer == 27 as V2-Lite): drop --q-lora-rank");
        hp->q_lora_rank = 0;
    } else if (hp->q_lora_rank <= 0) {
        return ecs_error(ECS_ERR_INVAL, "deepseek2 with %lld layers needs --q-lora-rank > 0 "
                         "(llama.cpp only allows no q-LoRA with exactly 27 layers)",
                         (long long)hp->n_layer);
    }
    if (hp->n_head_kv != hp->n_head)
        return ecs_error(ECS_ERR_INVAL, "deepseek2: --n-head-kv %lld must equal --n-head %lld (MLA)",
                         (long long)hp->n_head_kv, (long long)hp->n_head);
    if (hp->qk_rope % 2)
        return ecs_error(ECS_ERR_INVAL, "--qk-rope %lld must be even", (long long)hp->qk_rope);
    if ((err = in_range("n-dense", hp->n_dense, 0, hp->n_layer)) ||
        (err = in_range("q-lora-rank", hp->q_lora_rank, 0, MK_DIM_MAX)) ||
        (err = in_range("kv-lora-rank", hp->kv_lora_rank, 1, MK_DIM_MAX)) ||
        (err = in_range("qk-rope", hp->qk_rope, 2, 1024)) ||
        (err = in_range("qk-nope", hp->qk_nope, 1, 1024)) ||
        (err = in_range("v-head", hp->v_head, 1, 1024)) ||
        (err = in_range("n-shared", hp->n_shared, 1, 64)) ||
        (err = in_range("n-ff", hp->n_ff, hp->n_dense ? 1 : 0, MK_DIM_MAX)) ||
        (err = in_range("yarn-orig-ctx", hp->yarn_orig_ctx, 1, (int64_t)1 << 30)) ||
        (err = in_range("gating-func", hp->gating_func, 1, 2)) ||
        (err = positive("yarn-factor", hp->yarn_factor)) ||
        (err = positive("expert-weights-scale", hp->expert_weights_scale)))
        return err;
    if (!(hp->yarn_log_mul >= 0.0 && hp->yarn_log_mul < 1e6))
        return ecs_error(ECS_ERR_RANGE, "--yarn-log-mul %g must be >= 0", hp->yarn_log_mul);
    return ECS_OK;
}

static ecs_err_t validate_qwen(const mk_hparams_t *hp)
{
    ecs_err_t err;
    if ((err = in_range("head-dim", hp->head_dim, 2, 1024)))
        return err;
    if (hp->head_dim % 2)
        return ecs_error(ECS_ERR_INVAL, "--head-dim %lld must be even (NEOX rope)",
                         (long long)hp->head_dim);
    if (hp->n_head % hp->n_head_kv)
        return ecs_error(ECS_ERR_INVAL, "--n-head %lld must be a multiple of --n-head-kv %lld",
                         (long long)hp->n_head, (long long)hp->n_head_kv);
    return in_range("n-ff", hp->n_ff, 0, MK_DIM_MAX);
}

ecs_err_t mk_validate(mk_arch_t arch, mk_hparams_t *hp, bool q_lora_explicit)
{
    ecs_err_t err;
    if ((err = in_range("n-layer", hp->n_layer, 1, 4096)) ||
        (err = in_range("n-embd", hp->n_embd, 1, MK_DIM_MAX)) ||
        (err = in_range("n-head", hp->n_head, 1, 1024)) ||
        (err = in_range("n-head-kv", hp->n_head_kv, 1, hp->n_head)) ||
        (err = in_range("n-ff-exp", hp->n_ff_exp, 1, MK_DIM_MAX)) ||
        (err = in_range("n-expert", hp->n_expert, 1, 4096)) ||
        (err = in_range("n-expert-used", hp->n_expert_used, 1, hp->n_expert)) ||
        (err = in_range("vocab-size", hp->vocab_size, 1, MK_VOCAB_MAX)) ||
        (err = in_range("ctx", hp->ctx, 1, (int64_t)1 << 30)) ||
        (err = in_range("expert-weights-norm", hp->expert_weights_norm, 0, 1)) ||
        (err = positive("rope-base", hp->rope_base)) || (err = positive("rms-eps", hp->rms_eps)))
        return err;
    return arch == MK_ARCH_DEEPSEEK2 ? validate_ds2(hp, q_lora_explicit) : validate_qwen(hp);
}

/* ------------------------------------------------------------- metadata */

typedef struct {
    gguf_writer_t *w;
    const char *arch;
    ecs_err_t err;
} meta_t;

/* Arch-prefixed setters that remember the first error, so the key lists
 * below read as the tables in shared/reference/model-shapes-*.md. */
static void mu32(meta_t *m, const char *key, int64_t v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", m->arch, key);
    if (!m->err)
        m->err = gguf_writer_set_u32(m->w, k, (uint32_t)v);
}

static void mf32(meta_t *m, const char *key, double v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", m->arch, key);
    if (!m->err)
        m->err = gguf_writer_set_f32(m->w, k, (float)v);
}

static void mbool(meta_t *m, const char *key, bool v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", m->arch, key);
    if (!m->err)
        m->err = gguf_writer_set_bool(m->w, k, v);
}

static void mstr(meta_t *m, const char *key, const char *v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", m->arch, key);
    if (!m->err)
        m->err = gguf_writer_set_str(m->w, k, v);
}

static void general_file_type(meta_t *m, mk_ftype_t ft)
{
    if (!m->err)
        m->err = gguf_writer_set_u32(m->w, "general.file_type", (uint32_t)ft);
}

/* llama.cpp c392e509's llama-quantize re-appends general.file_type at the end
 * of a quantized deepseek2 file; the generator (and ik_llama.cpp's quantizer,
 * which made the qwen3moe files) keep it in place. */
static bool file_type_last(mk_arch_t arch, mk_ftype_t ft)
{
    return arch == MK_ARCH_DEEPSEEK2 && ft != MK_FT_F32;
}

/* The keys both architectures write first, in the converters' order. */
static void meta_common(meta_t *m, const mk_hparams_t *hp)
{
    mu32(m, "block_count", hp->n_layer);
    mu32(m, "context_length", hp->ctx);
    mu32(m, "embedding_length", hp->n_embd);
    mu32(m, "feed_forward_length", hp->n_ff);
    mu32(m, "attention.head_count", hp->n_head);
    mu32(m, "attention.head_count_kv", hp->n_head_kv);
    mf32(m, "rope.freq_base", hp->rope_base);
    mf32(m, "attention.layer_norm_rms_epsilon", hp->rms_eps);
    mu32(m, "expert_used_count", hp->n_expert_used);
}

static void meta_ds2(meta_t *m, mk_ftype_t ft, const mk_hparams_t *hp)
{
    meta_common(m, hp);
    if (!file_type_last(MK_ARCH_DEEPSEEK2, ft))
        general_file_type(m, ft);
    mu32(m, "leading_dense_block_count", hp->n_dense);
    mu32(m, "vocab_size", hp->vocab_size);
    if (hp->q_lora_rank)
        mu32(m, "attention.q_lora_rank", hp->q_lora_rank);
    mu32(m, "attention.kv_lora_rank", hp->kv_lora_rank);
    mu32(m, "attention.key_length", hp->qk_nope + hp->qk_rope);
    mu32(m, "attention.value_length", hp->v_head);
    mu32(m, "expert_feed_forward_length", hp->n_ff_exp);
    mu32(m, "expert_count", hp->n_expert);
    mu32(m, "expert_shared_count", hp->n_shared);
    mf32(m, "expert_weights_scale", hp->expert_weights_scale);
    mbool(m, "expert_weights_norm", hp->expert_weights_norm != 0);
    mu32(m, "expert_gating_func", hp->gating_func);
    mu32(m, "rope.dimension_count", hp->qk_rope);
    mstr(m, "rope.scaling.type", "yarn");
    mf32(m, "rope.scaling.factor", hp->yarn_factor);
    mu32(m, "rope.scaling.original_context_length", hp->yarn_orig_ctx);
    mf32(m, "rope.scaling.yarn_log_multiplier", hp->yarn_log_mul);
}

static void meta_qwen(meta_t *m, mk_ftype_t ft, const mk_hparams_t *hp)
{
    meta_common(m, hp);
    mu32(m, "attention.key_length", hp->head_dim);
    mu32(m, "attention.value_length", hp->head_dim);
    general_file_type(m, ft);
    mu32(m, "expert_count", hp->n_expert);
    mu32(m, "expert_feed_forward_length", hp->n_ff_exp);
    mbool(m, "expert_weights_norm", hp->expert_weights_norm != 0);
}

ecs_err_t mk_write_meta_head(gguf_writer_t *w, mk_arch_t arch, mk_ftype_t ft,
                             const mk_hparams_t *hp, const char *name)
{
    meta_t m = { w, mk_arch_name(arch), ECS_OK };
    if ((m.err = gguf_writer_set_str(w, "general.architecture", m.arch)) ||
        (m.err = gguf_writer_set_str(w, "general.type", "model")) ||
        (m.err = gguf_writer_set_str(w, "general.name", name)))
        return m.err;
    if (arch == MK_ARCH_DEEPSEEK2)
        meta_ds2(&m, ft, hp);
    else
        meta_qwen(&m, ft, hp);
    return m.err;
}

ecs_err_t mk_write_meta_tail(gguf_writer_t *w, mk_arch_t arch, mk_ftype_t ft)
{
    meta_t m = { w, mk_arch_name(arch), ECS_OK };
    m.err = gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (file_type_last(arch, ft))
        general_file_type(&m, ft);
    return m.err;
}

/* ---------------------------------------------------------- tensor types */

/* llama.cpp's "more bits" layers for the *_M mixes. Written with the same
 * integer arithmetic (C and C++ agree on / and % for negative operands). */
static bool use_more_bits(int64_t i, int64_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool has(const char *name, const char *part) { return strstr(name, part) != NULL; }

/* The type llama_tensor_get_type wants before shape fallbacks. layer is the
 * block index (-1 outside blocks). For attn_v, llama.cpp counts attn_v
 * tensors in its (layer-sorted) order, which equals the layer index here;
 * c392e509 does not count attn_kv_b as an attn_v-like tensor (later versions
 * do), matching the Q4_K_M table for V2-Lite in model-shapes-deepseek2.md. */
static ecs_type_t wanted_type(mk_ftype_t ft, const char *name, int64_t ne0, int layer,
                              const mk_hparams_t *hp)
{
    bool q4km = ft == MK_FT_Q4_K_M;
    ecs_type_t t = q4km ? ECS_TYPE_Q4_K : ECS_TYPE_Q8_0;
    if (!strcmp(name, "output.weight")) {
        if (ne0 % ecs_type_traits(t)->blck_size)
            return ECS_TYPE_Q8_0;
        return t == ECS_TYPE_Q8_0 ? t : ECS_TYPE_Q6_K;
    }
    if (!strcmp(name, "token_embd.weight"))
        return t;
    if (has(name, "attn_v.weight")) {
        if (q4km && use_more_bits(layer, hp->n_layer))
            t = ECS_TYPE_Q6_K;
        return hp->n_expert == 8 ? ECS_TYPE_Q8_0 : t;
    }
    if (has(name, "attn_k.weight"))
        return hp->n_expert == 8 ? ECS_TYPE_Q8_0 : t;
    if (has(name, "ffn_down"))
        return q4km && use_more_bits(layer, hp->n_layer) ? ECS_TYPE_Q6_K : t;
    if (has(name, "attn_output.weight"))
        return q4km && hp->n_expert == 8 ? ECS_TYPE_Q5_K : t;
    return t;
}

/* llama.cpp's fallback when the row length is not a multiple of the wanted
 * type's block: k-quant -> a 32-block type, then F16 if even that fails. */
static ecs_err_t fallback_type(const char *name, int64_t ne0, ecs_type_t want, ecs_type_t *out)
{
    if (ne0 % ecs_type_traits(want)->blck_size == 0) {
        *out = want;
        return ECS_OK;
    }
    ecs_type_t t;
    switch (want) {
    case ECS_TYPE_Q4_K: t = ECS_TYPE_Q5_0; break;
    case ECS_TYPE_Q5_K: t = ECS_TYPE_Q5_1; break;
    case ECS_TYPE_Q6_K: t = ECS_TYPE_Q8_0; break;
    default:
        return ecs_error(ECS_ERR_INVAL, "%s: row length %lld is not a multiple of %lld, which %s "
                         "needs (llama-quantize has no fallback for it)", name, (long long)ne0,
                         (long long)ecs_type_traits(want)->blck_size, ecs_type_name(want));
    }
    *out = ne0 % ecs_type_traits(t)->blck_size ? ECS_TYPE_F16 : t;
    return ECS_OK;
}

/* llama-quantize leaves 1-D tensors, norms and the router alone. */
static ecs_err_t choose_type(mk_ftype_t ft, mk_tensor_t *t, int layer, const mk_hparams_t *hp)
{
    if (ft == MK_FT_F32 || t->n_dims < 2 || has(t->name, "_norm.weight") ||
        has(t->name, "ffn_gate_inp.weight")) {
        t->type = ECS_TYPE_F32;
        return ECS_OK;
    }
    return fallback_type(t->name, t->ne[0], wanted_type(ft, t->name, t->ne[0], layer, hp), &t->type);
}

/* ---------------------------------------------------------- tensor list */

typedef struct {
    mk_tensor_t *t;
    int n, cap;
    mk_ftype_t ft;
    const mk_hparams_t *hp;
    ecs_err_t err;
} list_t;

/* Appends blk.<layer>.<base>.weight (or <base>.weight for layer < 0) with
 * ne = {a, b, c}; b == 0 means 1-D, c == 0 means 2-D. */
static void add(list_t *l, int layer, const char *base, int64_t a, int64_t b, int64_t c)
{
    if (l->err)
        return;
    if (l->n == l->cap) {
        l->err = ecs_error(ECS_ERR_INTERNAL, "tensor list overflow");
        return;
    }
    mk_tensor_t *t = &l->t[l->n];
    memset(t, 0, sizeof *t);
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, "blk.%d.%s.weight", layer, base);
    else
        snprintf(t->name, sizeof t->name, "%s.weight", base);
    t->ne[0] = a;
    t->ne[1] = b ? b : 1;
    t->ne[2] = c ? c : 1;
    t->n_dims = c ? 3 : b ? 2 : 1;
    t->init = has(t->name, "_norm.weight") ? MK_INIT_ONES : MK_INIT_NORMAL;
    l->err = choose_type(l->ft, t, layer, l->hp);
    l->n++;
}

static void ds2_block(list_t *l, int i)
{
    const mk_hparams_t *hp = l->hp;
    int64_t e = hp->n_embd, h = hp->n_head, k = hp->qk_nope + hp->qk_rope;
    add(l, i, "attn_norm", e, 0, 0);
    if (ds2_lite_attn(hp)) {
        add(l, i, "attn_q", e, h * k, 0);
    } else {
        add(l, i, "attn_q_a", e, hp->q_lora_rank, 0);
        add(l, i, "attn_q_a_norm", hp->q_lora_rank, 0, 0);
        add(l, i, "attn_q_b", hp->q_lora_rank, h * k, 0);
    }
    add(l, i, "attn_kv_a_mqa", e, hp->kv_lora_rank + hp->qk_rope, 0);
    add(l, i, "attn_kv_a_norm", hp->kv_lora_rank, 0, 0);
    add(l, i, "attn_kv_b", hp->kv_lora_rank, h * (hp->qk_nope + hp->v_head), 0);
    add(l, i, "attn_output", h * hp->v_head, e, 0);
    add(l, i, "ffn_norm", e, 0, 0);
    if (i < hp->n_dense) {
        add(l, i, "ffn_gate", e, hp->n_ff, 0);
        add(l, i, "ffn_up", e, hp->n_ff, 0);
        add(l, i, "ffn_down", hp->n_ff, e, 0);
        return;
    }
    int64_t f = hp->n_ff_exp, x = hp->n_expert, s = hp->n_ff_exp * hp->n_shared;
    add(l, i, "ffn_gate_inp", e, x, 0);
    add(l, i, "ffn_gate_exps", e, f, x);
    add(l, i, "ffn_up_exps", e, f, x);
    add(l, i, "ffn_down_exps", f, e, x);
    add(l, i, "ffn_gate_shexp", e, s, 0);
    add(l, i, "ffn_up_shexp", e, s, 0);
    add(l, i, "ffn_down_shexp", s, e, 0);
}

static void qwen_block(list_t *l, int i)
{
    const mk_hparams_t *hp = l->hp;
    int64_t e = hp->n_embd, d = hp->head_dim, f = hp->n_ff_exp, x = hp->n_expert;
    add(l, i, "attn_norm", e, 0, 0);
    add(l, i, "attn_q", e, hp->n_head * d, 0);
    add(l, i, "attn_k", e, hp->n_head_kv * d, 0);
    add(l, i, "attn_v", e, hp->n_head_kv * d, 0);
    add(l, i, "attn_output", hp->n_head * d, e, 0);
    add(l, i, "attn_q_norm", d, 0, 0);
    add(l, i, "attn_k_norm", d, 0, 0);
    add(l, i, "ffn_norm", e, 0, 0);
    add(l, i, "ffn_gate_inp", e, x, 0);
    add(l, i, "ffn_gate_exps", e, f, x);
    add(l, i, "ffn_up_exps", e, f, x);
    add(l, i, "ffn_down_exps", f, e, x);
}

ecs_err_t mk_tensor_list(mk_arch_t arch, mk_ftype_t ft, const mk_hparams_t *hp,
                         mk_tensor_t **out, int *n_out)
{
    enum { MAX_PER_BLOCK = 16 };
    list_t l = { .ft = ft, .hp = hp };
    l.cap = 3 + (int)hp->n_layer * MAX_PER_BLOCK;
    l.t = calloc((size_t)l.cap, sizeof *l.t);
    if (!l.t)
        return ecs_error(ECS_ERR_NOMEM, "tensor list: out of memory");
    add(&l, -1, "token_embd", hp->n_embd, hp->vocab_size, 0);
    for (int i = 0; i < (int)hp->n_layer; i++) {
        if (arch == MK_ARCH_DEEPSEEK2)
            ds2_block(&l, i);
        else
            qwen_block(&l, i);
    }
    add(&l, -1, "output_norm", hp->n_embd, 0, 0);
    add(&l, -1, "output", hp->n_embd, hp->vocab_size, 0);
    if (l.err) {
        free(l.t);
        return l.err;
    }
    *out = l.t;
    *n_out = l.n;
    return ECS_OK;
}
