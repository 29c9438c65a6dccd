/* load.c - reading a deepseek2 / qwen3moe GGUF into hyperparameters and
 * tensor views (model_weights_t) pointing into the mapping.
 *
 * Defaults and key names follow llama.cpp's loader (c392e509 for deepseek2,
 * ik_llama.cpp for qwen3moe): see shared/reference/model-shapes-*.md. Every
 * tensor's shape is checked against the hyperparameters, so the sizes the
 * workspace is later built from are bounded by the file itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "coordinator/model/model_int.h"

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
static ecs_err_t read_rope(const meta_t *mt, model_hparams_t *hp)
{
    model_rope_t *r = &hp->rope;
    MODEL_TRY(key_f32(mt, "rope.freq_base", false, 10000.0f, &r->freq_base));
    float factor = 0.0f;
    MODEL_TRY(key_f32(mt, "rope.scaling.factor", false, 0.0f, &factor));
    if (factor < 0.0f)
        return ecs_error(ECS_ERR_RANGE, "%s: rope.scaling.factor %g < 0", gguf_path(mt->f), factor);
    r->freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", mt->arch);
    gguf_str_t type = {"linear", 6};
    if (gguf_find(mt->f, key) && gguf_get_str(mt->f, key, &type) != ECS_OK)
        return ecs_error(ECS_ERR_TYPE, "%s: %s is not a string", gguf_path(mt->f), key);
    r->ext_factor = gguf_str_eq(type, "yarn") ? 1.0f : 0.0f;
    MODEL_TRY(key_u32(mt, "rope.scaling.original_context_length", false, (uint32_t)hp->n_ctx_train,
                &r->n_ctx_orig));
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    r->attn_factor = 1.0f;
    if (r->freq_base <= 0.0f)
        return ecs_error(ECS_ERR_RANGE, "%s: rope.freq_base %g <= 0", gguf_path(mt->f), r->freq_base);
    return ECS_OK;
}

static ecs_err_t read_common(const meta_t *mt, model_hparams_t *hp)
{
    MODEL_TRY(key_u32(mt, "block_count", true, 0, &hp->n_layer));
    MODEL_TRY(key_u32(mt, "context_length", true, 0, &hp->n_ctx_train));
    MODEL_TRY(key_u32(mt, "embedding_length", true, 0, &hp->n_embd));
    MODEL_TRY(key_u32(mt, "attention.head_count", true, 0, &hp->n_head));
    MODEL_TRY(key_f32(mt, "attention.layer_norm_rms_epsilon", true, 0, &hp->rms_eps));
    if (hp->n_layer < 1 || hp->n_layer > MODEL_MAX_LAYERS || hp->n_embd < 1 || hp->n_head < 1)
        return ecs_error(ECS_ERR_RANGE, "%s: bad block_count %d / embedding_length %d / head_count %d",
                         gguf_path(mt->f), hp->n_layer, hp->n_embd, hp->n_head);
    MODEL_TRY(key_u32(mt, "attention.head_count_kv", false, (uint32_t)hp->n_head, &hp->n_head_kv));
    MODEL_TRY(key_u32(mt, "attention.key_length", false, (uint32_t)(hp->n_embd / hp->n_head), &hp->head_k));
    MODEL_TRY(key_u32(mt, "attention.value_length", false, (uint32_t)(hp->n_embd / hp->n_head),
                &hp->head_v));
    MODEL_TRY(key_u32(mt, "rope.dimension_count", false, (uint32_t)hp->head_k, &hp->rope.n_rot));
    MODEL_TRY(key_u32(mt, "expert_count", false, 0, &hp->n_expert));
    MODEL_TRY(key_u32(mt, "expert_used_count", false, 0, &hp->n_expert_used));
    MODEL_TRY(key_u32(mt, "expert_group_count", false, 0, &hp->n_expert_groups));
    MODEL_TRY(key_u32(mt, "expert_group_used_count", false, 0, &hp->n_group_used));
    MODEL_TRY(read_rope(mt, hp));
    if (hp->head_k < 1 || hp->head_v < 1 || hp->head_k > 4096 || hp->head_v > 4096 ||
        hp->n_head_kv < 1 || hp->n_head > 4096 || hp->rope.n_rot < 0 || hp->rope.n_rot > hp->head_k)
        return ecs_error(ECS_ERR_RANGE, "%s: bad attention shape: %d heads (%d kv), key %d, value %d, "
                         "rope %d", gguf_path(mt->f), hp->n_head, hp->n_head_kv, hp->head_k,
                         hp->head_v, hp->rope.n_rot);
    return ECS_OK;
}

static ecs_err_t read_deepseek2(const meta_t *mt, model_hparams_t *hp, bool q_lora)
{
    hp->arch = MODEL_ARCH_DEEPSEEK2;
    MODEL_TRY(key_u32(mt, "leading_dense_block_count", true, 0, &hp->n_layer_dense));
    MODEL_TRY(key_u32(mt, "feed_forward_length", hp->n_layer_dense > 0, 0, &hp->n_ff));
    MODEL_TRY(key_u32(mt, "attention.kv_lora_rank", true, 0, &hp->kv_lora_rank));
    if (q_lora) {
        MODEL_TRY(key_u32(mt, "attention.q_lora_rank", true, 0, &hp->q_lora_rank));
        if (hp->q_lora_rank < 1)
            return ecs_error(ECS_ERR_RANGE, "%s: q_lora_rank is 0 but attn_q_a exists",
                             gguf_path(mt->f));
    }
    MODEL_TRY(key_u32(mt, "expert_feed_forward_length", true, 0, &hp->n_ff_exp));
    MODEL_TRY(key_u32(mt, "expert_shared_count", true, 0, &hp->n_expert_shared));
    MODEL_TRY(key_f32(mt, "expert_weights_scale", false, 1.0f, &hp->expert_weights_scale));
    MODEL_TRY(key_bool(mt, "expert_weights_norm", false, &hp->expert_weights_norm));
    int gating = 0;
    MODEL_TRY(key_u32(mt, "expert_gating_func", false, 0, &gating));
    if (gating != 0 && gating != MODEL_GATING_SOFTMAX && gating != MODEL_GATING_SIGMOID)
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: expert_gating_func %d is not supported",
                         gguf_path(mt->f), gating);
    hp->gating = gating == 0 ? MODEL_GATING_SOFTMAX : (model_gating_t)gating;
    float yarn_log_mul = 0.0f;
    MODEL_TRY(key_f32(mt, "rope.scaling.yarn_log_multiplier", false, 0.0f, &yarn_log_mul));

    hp->n_head_kv = hp->n_head; /* MLA: every head has its own K/V */
    hp->rope.mode = MODEL_ROPE_NORM;
    hp->n_ff_shexp = hp->n_ff_exp * hp->n_expert_shared;
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

static ecs_err_t read_qwen3moe(const meta_t *mt, model_hparams_t *hp)
{
    hp->arch = MODEL_ARCH_QWEN3MOE;
    MODEL_TRY(key_u32(mt, "feed_forward_length", false, 0, &hp->n_ff));
    int fallback = hp->n_expert_used > 0 ? hp->n_ff / hp->n_expert_used : 0;
    MODEL_TRY(key_u32(mt, "expert_feed_forward_length", false, (uint32_t)fallback, &hp->n_ff_exp));
    MODEL_TRY(key_bool(mt, "expert_weights_norm", true, &hp->expert_weights_norm));
    hp->expert_weights_scale = 1.0f;
    hp->gating = MODEL_GATING_SOFTMAX;
    hp->n_layer_dense = 0;
    hp->rope.mode = MODEL_ROPE_NEOX;
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

static ecs_err_t check_moe(const gguf_file_t *f, const model_hparams_t *hp)
{
    if (hp->n_expert < 1 || hp->n_expert > MODEL_MAX_EXPERTS || hp->n_expert_used < 1 ||
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

/* ----------------------------------------------------------------- tensors */

static ecs_err_t find(const gguf_file_t *f, const char *name, const gguf_tensor_t **t)
{
    *t = gguf_find_tensor(f, name);
    if (!*t)
        return ecs_error(ECS_ERR_NOTFOUND, "%s: missing tensor %s", gguf_path(f), name);
    return ECS_OK;
}

static ecs_err_t bad_shape(const gguf_file_t *f, const gguf_tensor_t *t, int64_t a, int64_t b,
                           int64_t c)
{
    return ecs_error(ECS_ERR_FORMAT,
                     "%s: tensor %s has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                     gguf_path(f), t->name, (long long)t->ne[0], (long long)t->ne[1],
                     (long long)t->ne[2], (long long)a, (long long)b, (long long)c);
}

/* A matrix of n3 stacked [nrows x ncols] slices (n3 = 1: plain matrix). */
static ecs_err_t load_mat(const gguf_file_t *f, const char *name, int64_t ncols, int64_t nrows,
                          int64_t n3, kcpu_mat_t *m)
{
    const gguf_tensor_t *t;
    MODEL_TRY(find(f, name, &t));
    if (t->ne[0] != ncols || t->ne[1] != nrows || t->ne[2] != n3 || t->ne[3] != 1)
        return bad_shape(f, t, ncols, nrows, n3);
    size_t rb = ecs_row_size(t->type, ncols);
    if (rb == 0 || !kcpu_vec_dot_for(t->type, KCPU_ISA_SCALAR))
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: tensor %s has type %s, not supported for matmul",
                         gguf_path(f), name, ecs_type_name(t->type));
    m->type = t->type;
    m->ncols = ncols;
    m->nrows = nrows * n3;
    m->row_bytes = rb;
    m->data = t->data;
    m->r16 = NULL;
    return ECS_OK;
}

static ecs_err_t load_vec(const gguf_file_t *f, const char *name, int64_t n, const float **v)
{
    const gguf_tensor_t *t;
    MODEL_TRY(find(f, name, &t));
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return bad_shape(f, t, n, 1, 1);
    if (t->type != ECS_TYPE_F32)
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: tensor %s has type %s, expected f32",
                         gguf_path(f), name, ecs_type_name(t->type));
    *v = t->data;
    return ECS_OK;
}

static const char *tname(char *buf, size_t n, int layer, const char *what)
{
    snprintf(buf, n, "blk.%d.%s.weight", layer, what);
    return buf;
}

static ecs_err_t load_ffn(const gguf_file_t *f, const model_hparams_t *hp, int il,
                          model_layer_t *ly)
{
    char b[128];
    const int64_t E = hp->n_embd;
    MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "ffn_norm"), E, &ly->ffn_norm));
    ly->moe = il >= hp->n_layer_dense;
    if (!ly->moe) {
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_gate"), E, hp->n_ff, 1, &ly->ffn_gate));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_up"), E, hp->n_ff, 1, &ly->ffn_up));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_down"), hp->n_ff, E, 1, &ly->ffn_down));
        return ECS_OK;
    }
    const int64_t X = hp->n_expert, F = hp->n_ff_exp;
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_gate_inp"), E, X, 1, &ly->gate_inp));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_gate_exps"), E, F, X, &ly->gate_exps));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_up_exps"), E, F, X, &ly->up_exps));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_down_exps"), F, E, X, &ly->down_exps));
    snprintf(b, sizeof b, "blk.%d.exp_probs_b.bias", il);
    if (gguf_find_tensor(f, b))
        MODEL_TRY(load_vec(f, b, X, &ly->exp_probs_b));
    if (hp->n_ff_shexp > 0) {
        const int64_t S = hp->n_ff_shexp;
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_gate_shexp"), E, S, 1, &ly->gate_shexp));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_up_shexp"), E, S, 1, &ly->up_shexp));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_down_shexp"), S, E, 1, &ly->down_shexp));
    }
    return ECS_OK;
}

static ecs_err_t load_attn_ds2(const gguf_file_t *f, const model_hparams_t *hp, int il,
                               model_layer_t *ly)
{
    char b[128];
    const int64_t E = hp->n_embd, H = hp->n_head, KV = hp->kv_lora_rank;
    if (hp->q_lora_rank > 0) {
        const int64_t Q = hp->q_lora_rank;
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_q_a"), E, Q, 1, &ly->wq_a));
        MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_q_a_norm"), Q, &ly->q_a_norm));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_q_b"), Q, H * hp->head_k, 1, &ly->wq_b));
    } else {
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_q"), E, H * hp->head_k, 1, &ly->wq));
    }
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_kv_a_mqa"), E, KV + hp->rope.n_rot, 1, &ly->wkv_a));
    MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_kv_a_norm"), KV, &ly->kv_a_norm));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_kv_b"), KV, H * (hp->qk_nope + hp->head_v), 1,
                 &ly->wkv_b));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_output"), H * hp->head_v, E, 1, &ly->wo));
    return ECS_OK;
}

static ecs_err_t load_attn_qwen(const gguf_file_t *f, const model_hparams_t *hp, int il,
                                model_layer_t *ly)
{
    char b[128];
    const int64_t E = hp->n_embd, D = hp->head_k;
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_q"), E, hp->n_head * D, 1, &ly->wq));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_k"), E, hp->n_head_kv * D, 1, &ly->wk));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_v"), E, hp->n_head_kv * D, 1, &ly->wv));
    MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_q_norm"), D, &ly->q_norm));
    MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_k_norm"), D, &ly->k_norm));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_output"), hp->n_head * D, E, 1, &ly->wo));
    return ECS_OK;
}

ecs_err_t model_load_weights(model_t *m)
{
    const gguf_file_t *f = m->file;
    model_hparams_t *hp = &m->hp;
    model_weights_t *w = &m->w;
    const gguf_tensor_t *te;
    MODEL_TRY(find(f, "token_embd.weight", &te));
    if (te->ne[0] != hp->n_embd || te->ne[1] < 1 || te->ne[1] > INT32_MAX || te->ne[2] != 1)
        return bad_shape(f, te, hp->n_embd, te->ne[1], 1);
    hp->n_vocab = (int)te->ne[1];
    MODEL_TRY(load_mat(f, "token_embd.weight", hp->n_embd, hp->n_vocab, 1, &w->token_embd));
    MODEL_TRY(load_vec(f, "output_norm.weight", hp->n_embd, &w->output_norm));
    hp->tied_output = gguf_find_tensor(f, "output.weight") == NULL;
    if (hp->tied_output)
        w->output = w->token_embd;
    else
        MODEL_TRY(load_mat(f, "output.weight", hp->n_embd, hp->n_vocab, 1, &w->output));

    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    if (!w->layers)
        return ecs_error(ECS_ERR_NOMEM, "model: no memory for %d layers", hp->n_layer);
    char b[128];
    for (int il = 0; il < hp->n_layer; il++) {
        model_layer_t *ly = &w->layers[il];
        MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_norm"), hp->n_embd, &ly->attn_norm));
        if (hp->arch == MODEL_ARCH_DEEPSEEK2)
            MODEL_TRY(load_attn_ds2(f, hp, il, ly));
        else
            MODEL_TRY(load_attn_qwen(f, hp, il, ly));
        MODEL_TRY(load_ffn(f, hp, il, ly));
    }
    return ECS_OK;
}

ecs_err_t model_read_hparams(model_t *m)
{
    const gguf_file_t *f = m->file;
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
    model_hparams_t *hp = &m->hp;
    MODEL_TRY(read_common(&mt, hp));
    if (mt.arch[0] == 'd') {
        /* q-LoRA is present exactly when the layers have attn_q_a (llama.cpp
         * infers its absence from n_layer == 27, which the files agree with). */
        bool q_lora = gguf_find_tensor(f, "blk.0.attn_q_a.weight") != NULL;
        MODEL_TRY(read_deepseek2(&mt, hp, q_lora));
    } else {
        MODEL_TRY(read_qwen3moe(&mt, hp));
    }
    return check_moe(f, hp);
}

/* ------------------------------------------------------- derived tensors */

/* The transposed W_k keeps an exact float type as it is; a quantized
 * W_kv_b becomes Q8_0 (what llama.cpp's converter makes of attn_k_b), or
 * F32 when qk_nope is not a multiple of Q8_0's block. */
static ecs_type_t wkt_type(ecs_type_t t, int nope)
{
    if (t == ECS_TYPE_F32 || t == ECS_TYPE_F16 || t == ECS_TYPE_BF16)
        return t;
    return nope % 32 == 0 ? ECS_TYPE_Q8_0 : ECS_TYPE_F32;
}

/* Short Q8_0 rows go in the packed layout (model_simd_t.dot_q8p), whose
 * groups of rows must not straddle heads. */
static bool wkt_packed(ecs_type_t t, int nope, int kvl)
{
    return t == ECS_TYPE_Q8_0 && nope / 32 <= MODEL_Q8P_MAXBLK && kvl % MODEL_Q8P_ROWS == 0;
}

/* Head h of W_kv_b's W_k (nope rows of kvl), transposed into kvl rows of
 * nope values of wkt's type. w holds nope * kvl + 2 * nope floats. */
static void transpose_head(const kcpu_mat_t *wb, const model_hparams_t *hp, int h, float *w,
                           kcpu_mat_t *wkt, bool packed)
{
    const int nope = hp->qk_nope, kvl = hp->kv_lora_rank;
    float *col = w + (size_t)nope * kvl;
    void *row = col + nope; /* a packed row before it is spread */
    for (int d = 0; d < nope; d++) {
        const size_t r = (size_t)h * (nope + hp->head_v) + (size_t)d;
        ecs_dequantize_row(wb->type, (const char *)wb->data + r * wb->row_bytes,
                           w + (size_t)d * kvl, kvl);
    }
    for (int j = 0; j < kvl; j++) {
        char *dst = (char *)wkt->data + ((size_t)h * kvl + (size_t)j) * wkt->row_bytes;
        for (int d = 0; d < nope; d++)
            col[d] = w[(size_t)d * kvl + (size_t)j];
        if (wkt->type == ECS_TYPE_F32) {
            memcpy(dst, col, (size_t)nope * sizeof *col);
        } else if (wkt->type == ECS_TYPE_F16) {
            for (int d = 0; d < nope; d++)
                ((ecs_fp16_t *)dst)[d] = ecs_f32_to_fp16(col[d]);
        } else if (wkt->type == ECS_TYPE_BF16) {
            for (int d = 0; d < nope; d++)
                ((ecs_bf16_t *)dst)[d] = ecs_f32_to_bf16(col[d]);
        } else if (packed) {
            ecs_quantize_row(wkt->type, col, row, nope);
            model_q8p_put((char *)wkt->data + (size_t)h * kvl * wkt->row_bytes, j, nope / 32, row);
        } else {
            ecs_quantize_row(wkt->type, col, dst, nope);
        }
    }
}

#define EXT_HUGE ((size_t)2 << 20)

ecs_err_t model_build_ext(model_t *m)
{
    const model_hparams_t *hp = &m->hp;
    m->ext = calloc((size_t)hp->n_layer, sizeof *m->ext);
    if (!m->ext)
        return ecs_error(ECS_ERR_NOMEM, "model: no memory for %d layers", hp->n_layer);
    if (hp->arch != MODEL_ARCH_DEEPSEEK2)
        return ECS_OK;
    const int nope = hp->qk_nope, kvl = hp->kv_lora_rank, nh = hp->n_head;
    size_t total = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        kcpu_mat_t *t = &m->ext[il].wkt;
        t->type = wkt_type(m->w.layers[il].wkv_b.type, nope);
        t->ncols = nope;
        t->nrows = (int64_t)nh * kvl;
        t->row_bytes = ecs_row_size(t->type, nope);
        m->ext[il].packed = wkt_packed(t->type, nope, kvl);
        total += ((size_t)t->nrows * t->row_bytes + 63) & ~(size_t)63;
    }
    float *w = malloc(((size_t)nope * kvl + 2 * (size_t)nope) * sizeof *w);
    /* decode reads all of W_kT for every token (30 MB in V2-Lite): in 4 KB
     * pages that is a TLB miss every 4 KB, and its reads measured ~20 %
     * slower than in 2 MB pages (advice only: failure is harmless) */
    const size_t align = total >= EXT_HUGE ? EXT_HUGE : 64;
    total = (total + align - 1) & ~(align - 1);
    m->ext_mem = aligned_alloc(align, total);
    if (m->ext_mem && align == EXT_HUGE)
        madvise(m->ext_mem, total, MADV_HUGEPAGE);
    if (!w || !m->ext_mem) {
        free(w);
        return ecs_error(ECS_ERR_NOMEM, "model: cannot allocate %zu bytes for W_k^T", total);
    }
    m->ext_bytes = total;
    char *p = m->ext_mem;
    for (int il = 0; il < hp->n_layer; il++) {
        kcpu_mat_t *t = &m->ext[il].wkt;
        t->data = p;
        p += ((size_t)t->nrows * t->row_bytes + 63) & ~(size_t)63;
        for (int h = 0; h < nh; h++)
            transpose_head(&m->w.layers[il].wkv_b, hp, h, w, t, m->ext[il].packed);
    }
    free(w);
    return ECS_OK;
}
