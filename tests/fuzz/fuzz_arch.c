/* fuzz_arch.c - libFuzzer target for what ecs-worker and the coordinator
 * both read from a model file beyond the container (common/arch.c): the
 * architecture's hyperparameters and the shapes of the routed and shared
 * experts' tensors. Any GGUF bytes either give hyperparameters inside the
 * bounds a loader sizes its buffers by, or fail with a message; every
 * expert tensor a layer is given has exactly the shape the hyperparameters
 * say and lies inside the input. Seeds (tests/fuzz/corpus/fuzz_arch):
 * small deepseek2 and qwen3moe files written by test_arch's fuzz_seed_files
 * with ECS_WRITE_FUZZ_CORPUS=DIR. */
#include <stdint.h>

#include "common/arch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_hparams(const arch_hparams_t *hp)
{
    if (hp->n_layer < 1 || hp->n_layer > ARCH_MAX_LAYERS || hp->n_embd < 1 || hp->n_head < 1 ||
        hp->n_head_kv < 1 || hp->head_k < 1 || hp->head_v < 1 || hp->rope.n_rot < 0 ||
        hp->rope.n_rot > hp->head_k || hp->n_expert < 1 || hp->n_expert > ARCH_MAX_EXPERTS ||
        hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert || hp->n_ff_exp < 1 ||
        hp->n_ff_shexp < 0 || hp->n_layer_dense < 0 || hp->n_layer_dense > hp->n_layer)
        __builtin_trap();
    if (hp->arch == ARCH_DEEPSEEK2 &&
        (hp->kv_lora_rank < 1 || hp->qk_nope < 1 || hp->qk_nope + hp->rope.n_rot != hp->head_k))
        __builtin_trap();
}

static void check_tensor(const gguf_tensor_t *t, int64_t cols, int64_t rows, int64_t stack,
                         const uint8_t *data, size_t size)
{
    const uint8_t *p = t->data;
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != stack || t->ne[3] != 1 ||
        p < data || p + t->nbytes > data + size)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file_t *f;
    if (gguf_open_buffer(data, size, "fuzz", &f) != ECS_OK)
        return 0;
    arch_hparams_t hp;
    if (arch_read_hparams(f, &hp) != ECS_OK) {
        if (!ecs_errmsg()[0])
            __builtin_trap(); /* every refusal says why */
        gguf_close(f);
        return 0;
    }
    check_hparams(&hp);
    for (int il = 0; il < hp.n_layer; il++) {
        if (!arch_layer_moe(&hp, il))
            continue;
        for (int w = ARCH_EXPS_GATE; w <= ARCH_EXPS_DOWN; w++) {
            const int down = w == ARCH_EXPS_DOWN;
            const gguf_tensor_t *t;
            if (arch_exps_tensor(f, &hp, il, (arch_exps_t)w, &t) == ECS_OK)
                check_tensor(t, down ? hp.n_ff_exp : hp.n_embd, down ? hp.n_embd : hp.n_ff_exp,
                             hp.n_expert, data, size);
            if (arch_shexp_tensor(f, &hp, il, (arch_exps_t)w, &t) == ECS_OK)
                check_tensor(t, down ? hp.n_ff_shexp : hp.n_embd,
                             down ? hp.n_embd : hp.n_ff_shexp, 1, data, size);
        }
    }
    gguf_close(f);
    return 0;
}
