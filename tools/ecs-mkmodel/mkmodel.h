/* mkmodel.h - private interface between the parts of ecs-mkmodel.
 *
 * spec.c knows the architectures: presets, hyperparameter checks, the
 * metadata keys and the tensor list with llama.cpp's per-tensor type rules.
 * gen.c turns a tensor list into seeded random weights, quantized and
 * streamed into a GGUF writer. main.c parses the command line and wires the
 * tokenizer source in. */
#ifndef ECS_MKMODEL_H
#define ECS_MKMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/quant.h"

typedef enum { MK_ARCH_DEEPSEEK2, MK_ARCH_QWEN3MOE } mk_arch_t;

/* The --types choices; values are llama.cpp's general.file_type. */
typedef enum { MK_FT_F32 = 0, MK_FT_Q8_0 = 7, MK_FT_Q4_K_M = 15 } mk_ftype_t;

/* Every hyperparameter a flag can override. Integers are int64 so that a
 * flag value is range-checked before anything is multiplied. */
typedef struct {
    int64_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_ff_exp;
    int64_t n_expert, n_expert_used, n_shared, n_dense;
    int64_t kv_lora_rank, q_lora_rank, qk_rope, qk_nope, v_head, head_dim;
    int64_t vocab_size; /* 0: take the tokenizer's token count */
    int64_t ctx, yarn_orig_ctx, gating_func, expert_weights_norm;
    double rope_base, rms_eps, yarn_factor, yarn_log_mul, expert_weights_scale;
} mk_hparams_t;

/* One hyperparameter flag: its name without "--" and where it lives. */
typedef struct {
    const char *flag;
    size_t offset;
    bool is_float;
    const char *help;
} mk_param_t;

#define MK_MAX_PARAMS 64
extern const mk_param_t mk_params[];
extern const int mk_n_params;

/* What a tensor's values are. */
typedef enum { MK_INIT_NORMAL, MK_INIT_ONES } mk_init_t;

typedef struct {
    char name[64];
    uint32_t n_dims;
    int64_t ne[3];
    ecs_type_t type;
    mk_init_t init;
} mk_tensor_t;

ecs_err_t mk_parse_arch(const char *s, mk_arch_t *out);
ecs_err_t mk_parse_ftype(const char *s, mk_ftype_t *out);
const char *mk_arch_name(mk_arch_t arch);

/* Fills hp with the preset's values (ECS_ERR_INVAL for an unknown preset or
 * one that does not exist for arch). */
ecs_err_t mk_preset(mk_arch_t arch, const char *preset, mk_hparams_t *hp);

/* Checks hp for arch once flags are applied and vocab_size is known.
 * q_lora_explicit: --q-lora-rank was given (deepseek2 with 27 layers has no
 * q-LoRA, so a preset's rank is dropped there but an explicit one is an error). */
ecs_err_t mk_validate(mk_arch_t arch, mk_hparams_t *hp, bool q_lora_explicit);

/* Adds the architecture keys (not tokenizer.*) for hp. Keys come in the order
 * llama.cpp's tools write them; tokenizer keys go between the two calls. */
ecs_err_t mk_write_meta_head(gguf_writer_t *w, mk_arch_t arch, mk_ftype_t ft,
                             const mk_hparams_t *hp, const char *name);
ecs_err_t mk_write_meta_tail(gguf_writer_t *w, mk_arch_t arch, mk_ftype_t ft);

/* The tensor list in file order with each tensor's type chosen as
 * llama-quantize would for ft. *out is malloc'ed. Fails if a tensor's row
 * cannot be stored in the chosen type. */
ecs_err_t mk_tensor_list(mk_arch_t arch, mk_ftype_t ft, const mk_hparams_t *hp,
                         mk_tensor_t **out, int *n_out);

/* Declares every tensor, begins the file, then generates, quantizes and
 * writes each tensor in turn with nthreads threads. The values depend only
 * on (seed, tensor name, row), never on nthreads. */
ecs_err_t mk_generate(gguf_writer_t *w, const char *path, const mk_tensor_t *t, int n,
                      uint64_t seed, float stddev, int nthreads);

#endif
