/* test_arch.c - common/arch: hyperparameters of both architectures from
 * GGUF metadata, the routed experts' tensor names and shape checks. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/arch.h"

#define DS2_Q8 "../shared/models/tiny-ds2-q8_0.gguf"
#define QWEN_Q8 "../shared/models/tiny-qwen3moe-q8_0.gguf"

Test(arch, hparams_and_expert_stacks)
{
    const char *paths[] = {DS2_Q8, QWEN_Q8};
    for (int i = 0; i < 2; i++) {
        gguf_file_t *f;
        cr_assert_eq(gguf_open(paths[i], &f), ECS_OK, "%s", ecs_errmsg());
        arch_hparams_t hp;
        cr_assert_eq(arch_read_hparams(f, &hp), ECS_OK, "%s", ecs_errmsg());
        cr_assert_eq(hp.arch, i == 0 ? ARCH_DEEPSEEK2 : ARCH_QWEN3MOE);
        cr_assert(hp.n_layer > 0 && hp.n_expert >= hp.n_expert_used && hp.n_expert_used > 0);
        int moe = 0;
        for (int il = 0; il < hp.n_layer; il++) {
            cr_assert_eq(arch_layer_moe(&hp, il), il >= hp.n_layer_dense);
            if (!arch_layer_moe(&hp, il))
                continue;
            moe++;
            for (int w = ARCH_EXPS_GATE; w <= ARCH_EXPS_DOWN; w++) {
                const gguf_tensor_t *t;
                cr_assert_eq(arch_exps_tensor(f, &hp, il, (arch_exps_t)w, &t), ECS_OK, "%s",
                             ecs_errmsg());
                cr_assert_eq(t->ne[2], hp.n_expert);
                cr_assert_eq(t->ne[0], w == ARCH_EXPS_DOWN ? hp.n_ff_exp : hp.n_embd);
            }
        }
        cr_assert_gt(moe, 0);
        char b[64];
        cr_assert_str_eq(arch_exps_name(b, sizeof b, 3, ARCH_EXPS_UP), "blk.3.ffn_up_exps.weight");
        /* a shape that disagrees with the hyperparameters is named */
        const gguf_tensor_t *t;
        arch_hparams_t bad = hp;
        bad.n_ff_exp++;
        cr_assert_eq(arch_exps_tensor(f, &bad, hp.n_layer - 1, ARCH_EXPS_GATE, &t), ECS_ERR_FORMAT);
        cr_assert(strstr(ecs_errmsg(), "ffn_gate_exps"), "%s", ecs_errmsg());
        cr_assert_eq(arch_exps_tensor(f, &hp, hp.n_layer, ARCH_EXPS_GATE, &t), ECS_ERR_NOTFOUND);
        gguf_close(f);
    }
}
