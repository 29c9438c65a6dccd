/* arch.h - what every process serving a model must agree on about its
 * architecture: the hyperparameters read from the GGUF's metadata
 * (deepseek2, qwen3moe; llama.cpp's key names and defaults) and the names
 * and shapes of the routed experts' stacked tensors. The coordinator's
 * model and ecs-worker both read a model file through this, so they
 * cannot disagree on a shape or a tensor name.
 *
 *     gguf_file_t *f;  arch_hparams_t hp;  const gguf_tensor_t *t;
 *     if (gguf_open(path, &f) != ECS_OK ||
 *         arch_read_hparams(f, &hp) != ECS_OK) ... ecs_errmsg() says why
 *     for (int il = 0; il < hp.n_layer; il++)
 *         if (arch_layer_moe(&hp, il) &&
 *             arch_exps_tensor(f, &hp, il, ARCH_EXPS_DOWN, &t) == ECS_OK)
 *             ... t->data: n_expert stacked [n_embd x n_ff_exp] matrices
 */
#ifndef ECS_ARCH_H
#define ECS_ARCH_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "common/gguf.h"

/* Sanity bounds on metadata, so that a malformed file cannot ask for an
 * absurd allocation. */
#define ARCH_MAX_LAYERS 1024
#define ARCH_MAX_EXPERTS 4096

typedef enum {
    ARCH_DEEPSEEK2 = 0,
    ARCH_QWEN3MOE = 1,
} arch_id_t;

typedef enum {
    ARCH_GATING_SOFTMAX = 1,
    ARCH_GATING_SIGMOID = 2,
} arch_gating_t;

/* ggml's rope modes: NORM rotates adjacent pairs (x[2i], x[2i+1]); NEOX
 * rotates (x[i], x[i + n_rot/2]). */
typedef enum {
    ARCH_ROPE_NORM = 0,
    ARCH_ROPE_NEOX = 2,
} arch_rope_mode_t;

/* Rotary embedding parameters, as ggml_rope_ext takes them. */
typedef struct {
    int n_rot;            /* rotated dims (even) */
    arch_rope_mode_t mode;
    int n_ctx_orig;       /* YaRN: original training context */
    float freq_base;
    float freq_scale;     /* 1/factor for linear and YaRN scaling */
    float ext_factor;     /* YaRN extrapolation mix; 0 = off */
    float attn_factor;    /* magnitude factor passed to the rope */
    float beta_fast, beta_slow;
} arch_rope_t;

typedef struct {
    arch_id_t arch;
    int n_layer;
    int n_embd;
    int n_vocab;
    int n_ctx_train;
    int n_head;
    int n_head_kv;
    int head_k;           /* n_embd_head_k (deepseek2: qk_nope + n_rot) */
    int head_v;           /* n_embd_head_v */
    float rms_eps;

    /* deepseek2 MLA */
    int q_lora_rank;      /* 0: no q-LoRA (single attn_q, V2-Lite) */
    int kv_lora_rank;
    int qk_nope;          /* head_k - n_rot */

    /* FFN */
    int n_layer_dense;    /* leading dense layers */
    int n_ff;             /* dense FFN width */
    int n_expert;
    int n_expert_used;
    int n_ff_exp;
    int n_expert_shared;
    int n_ff_shexp;       /* n_ff_exp * n_expert_shared; 0 = none */
    int n_expert_groups;  /* 0/1 = no group limit */
    int n_group_used;
    arch_gating_t gating;
    bool expert_weights_norm;
    float expert_weights_scale; /* 0 or 1 = no scaling */

    float kq_scale;       /* softmax scale of Q.K */
    arch_rope_t rope;
    bool tied_output;     /* no output.weight: the head is token_embd */
} arch_hparams_t;

/* Reads general.architecture and the architecture's keys into hp (all of
 * it but n_vocab and tied_output, which come from the tensors: the model's
 * loader sets them). ECS_ERR_UNSUPPORTED for another architecture; every
 * error names the file and the key. */
ecs_err_t arch_read_hparams(const gguf_file_t *f, arch_hparams_t *hp);

/* Whether layer il has routed experts (the leading dense layers do not). */
bool arch_layer_moe(const arch_hparams_t *hp, int il);

/* The three stacked tensors of a MoE layer's routed experts. */
typedef enum {
    ARCH_EXPS_GATE = 0, /* blk.N.ffn_gate_exps.weight: [n_embd, n_ff_exp, n_expert] */
    ARCH_EXPS_UP = 1,   /* blk.N.ffn_up_exps.weight: [n_embd, n_ff_exp, n_expert] */
    ARCH_EXPS_DOWN = 2, /* blk.N.ffn_down_exps.weight: [n_ff_exp, n_embd, n_expert] */
} arch_exps_t;

/* The GGUF name of a layer's stack into buf (n bytes); returns buf. */
const char *arch_exps_name(char *buf, size_t n, int layer, arch_exps_t which);
/* That tensor, its shape checked against hp (ggml order: ne[0] is the row
 * length); ECS_ERR_NOTFOUND / ECS_ERR_FORMAT naming it otherwise. */
ecs_err_t arch_exps_tensor(const gguf_file_t *f, const arch_hparams_t *hp, int layer,
                           arch_exps_t which, const gguf_tensor_t **out);
/* The same for a MoE layer's shared experts (one SwiGLU FFN of n_ff_shexp:
 * blk.N.ffn_{gate,up,down}_shexp.weight, [n_embd, n_ff_shexp] and
 * [n_ff_shexp, n_embd]); ECS_ERR_NOTFOUND also when the model has none. */
ecs_err_t arch_shexp_tensor(const gguf_file_t *f, const arch_hparams_t *hp, int layer,
                            arch_exps_t which, const gguf_tensor_t **out);

#endif
