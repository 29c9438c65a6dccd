/* test_arch.c - common/arch: hyperparameters of both architectures from
 * GGUF metadata, the routed experts' tensor names and shape checks. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/arch.h"
#include "tests/unit/fuzz_seed.h"

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

/* ---- fuzz_arch's seeds ----
 * A tiny file of each architecture, every key arch_read_hparams reads and
 * the MoE layers' expert tensors (F32, shapes from the keys), that reads
 * back here. With ECS_WRITE_FUZZ_CORPUS=DIR set they are also written there
 * (the checked-in seeds of tests/fuzz/corpus/fuzz_arch came from it). */

typedef struct {
    const char *key;
    char kind; /* u: u32, f: f32, b: bool, s: string */
    double v;
    const char *s;
} seed_kv_t;

/* Tensor k of a MoE layer's six (the routed gate, up, down stacks, then
 * the shared experts' three): its shape into ne; 0 when the model has none. */
static int seed_tensor_shape(int k, int64_t n_embd, int64_t ff, int64_t n_expert, int64_t ff_sh,
                             int64_t ne[3])
{
    const int64_t width = k < 3 ? ff : ff_sh;
    ne[0] = k % 3 == 2 ? width : n_embd;
    ne[1] = k % 3 == 2 ? n_embd : width;
    ne[2] = k < 3 ? n_expert : 1;
    return width ? (k < 3 ? 3 : 2) : 0;
}

static void write_seed(const char *path, const seed_kv_t *kv, int n_kv, int n_layer, int dense,
                       int64_t n_embd, int64_t ff, int64_t n_expert, int64_t ff_sh)
{
    gguf_writer_t *w;
    cr_assert_eq(gguf_writer_new(&w), ECS_OK);
    for (int i = 0; i < n_kv; i++) {
        ecs_err_t rc = kv[i].kind == 'u'   ? gguf_writer_set_u32(w, kv[i].key, (uint32_t)kv[i].v)
                       : kv[i].kind == 'f' ? gguf_writer_set_f32(w, kv[i].key, (float)kv[i].v)
                       : kv[i].kind == 'b' ? gguf_writer_set_bool(w, kv[i].key, kv[i].v != 0)
                                           : gguf_writer_set_str(w, kv[i].key, kv[i].s);
        cr_assert_eq(rc, ECS_OK, "%s", kv[i].key);
    }
    static const char *const what[] = {"gate", "up", "down"};
    int64_t ne[3];
    for (int il = dense; il < n_layer; il++)
        for (int k = 0; k < 6; k++) {
            const int dims = seed_tensor_shape(k, n_embd, ff, n_expert, ff_sh, ne);
            char name[64];
            snprintf(name, sizeof name, "blk.%d.ffn_%s_%s.weight", il, what[k % 3],
                     k < 3 ? "exps" : "shexp");
            if (dims)
                cr_assert_eq(gguf_writer_add_tensor(w, name, ECS_TYPE_F32, (uint32_t)dims, ne),
                             ECS_OK);
        }
    cr_assert_eq(gguf_writer_begin(w, path), ECS_OK, "%s", ecs_errmsg());
    /* the largest tensor: a routed stack or the shared experts' matrix */
    float *zero = calloc((size_t)(n_embd * (ff * n_expert > ff_sh ? ff * n_expert : ff_sh)),
                         sizeof(float));
    cr_assert(zero);
    for (int il = dense; il < n_layer; il++)
        for (int k = 0; k < 6; k++)
            if (seed_tensor_shape(k, n_embd, ff, n_expert, ff_sh, ne))
                cr_assert_eq(gguf_writer_write_tensor(w, zero, (size_t)(ne[0] * ne[1] * ne[2]) *
                                                                   sizeof(float)),
                             ECS_OK, "%s", ecs_errmsg());
    free(zero);
    cr_assert_eq(gguf_writer_finish(w), ECS_OK, "%s", ecs_errmsg());
    gguf_writer_free(w);
}

Test(arch, fuzz_seed_files)
{
    const seed_kv_t ds2[] = {
        {"general.architecture", 's', 0, "deepseek2"},
        {"deepseek2.block_count", 'u', 3, 0},
        {"deepseek2.context_length", 'u', 256, 0},
        {"deepseek2.embedding_length", 'u', 8, 0},
        {"deepseek2.attention.head_count", 'u', 2, 0},
        {"deepseek2.attention.layer_norm_rms_epsilon", 'f', 1e-6, 0},
        {"deepseek2.attention.key_length", 'u', 6, 0},
        {"deepseek2.attention.value_length", 'u', 4, 0},
        {"deepseek2.rope.dimension_count", 'u', 2, 0},
        {"deepseek2.rope.freq_base", 'f', 10000, 0},
        {"deepseek2.rope.scaling.type", 's', 0, "yarn"},
        {"deepseek2.rope.scaling.factor", 'f', 40, 0},
        {"deepseek2.rope.scaling.original_context_length", 'u', 64, 0},
        {"deepseek2.rope.scaling.yarn_log_multiplier", 'f', 0.0707, 0},
        {"deepseek2.expert_count", 'u', 8, 0},
        {"deepseek2.expert_used_count", 'u', 2, 0},
        {"deepseek2.expert_group_count", 'u', 4, 0},
        {"deepseek2.expert_group_used_count", 'u', 2, 0},
        {"deepseek2.leading_dense_block_count", 'u', 1, 0},
        {"deepseek2.feed_forward_length", 'u', 16, 0},
        {"deepseek2.attention.kv_lora_rank", 'u', 4, 0},
        {"deepseek2.expert_feed_forward_length", 'u', 4, 0},
        {"deepseek2.expert_shared_count", 'u', 1, 0},
        {"deepseek2.expert_weights_scale", 'f', 2.5, 0},
        {"deepseek2.expert_weights_norm", 'b', 1, 0},
        {"deepseek2.expert_gating_func", 'u', 2, 0},
    };
    const seed_kv_t qwen[] = {
        {"general.architecture", 's', 0, "qwen3moe"},
        {"qwen3moe.block_count", 'u', 2, 0},
        {"qwen3moe.context_length", 'u', 256, 0},
        {"qwen3moe.embedding_length", 'u', 8, 0},
        {"qwen3moe.attention.head_count", 'u', 4, 0},
        {"qwen3moe.attention.head_count_kv", 'u', 2, 0},
        {"qwen3moe.attention.layer_norm_rms_epsilon", 'f', 1e-6, 0},
        {"qwen3moe.attention.key_length", 'u', 4, 0},
        {"qwen3moe.attention.value_length", 'u', 4, 0},
        {"qwen3moe.rope.freq_base", 'f', 1e6, 0},
        {"qwen3moe.expert_count", 'u', 4, 0},
        {"qwen3moe.expert_used_count", 'u', 2, 0},
        {"qwen3moe.expert_feed_forward_length", 'u', 4, 0},
        {"qwen3moe.expert_weights_norm", 'b', 1, 0},
    };
    const struct {
        const char *name;
        const seed_kv_t *kv;
        int n_kv, n_layer, dense, n_expert, ff_sh;
        arch_id_t arch;
    } seeds[] = {
        {"deepseek2", ds2, sizeof ds2 / sizeof ds2[0], 3, 1, 8, 4, ARCH_DEEPSEEK2},
        {"qwen3moe", qwen, sizeof qwen / sizeof qwen[0], 2, 0, 4, 0, ARCH_QWEN3MOE},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char path[] = "/tmp/ecs_arch_seed_XXXXXX";
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        close(fd);
        write_seed(path, seeds[i].kv, seeds[i].n_kv, seeds[i].n_layer, seeds[i].dense, 8, 4,
                   seeds[i].n_expert, seeds[i].ff_sh);
        gguf_file_t *f;
        cr_assert_eq(gguf_open(path, &f), ECS_OK, "%s", ecs_errmsg());
        arch_hparams_t hp;
        cr_assert_eq(arch_read_hparams(f, &hp), ECS_OK, "%s: %s", seeds[i].name, ecs_errmsg());
        cr_assert_eq(hp.arch, seeds[i].arch);
        cr_assert_eq(hp.n_ff_shexp, seeds[i].ff_sh);
        const gguf_tensor_t *t;
        for (int il = seeds[i].dense; il < seeds[i].n_layer; il++)
            for (int w = ARCH_EXPS_GATE; w <= ARCH_EXPS_DOWN; w++) {
                cr_assert_eq(arch_exps_tensor(f, &hp, il, (arch_exps_t)w, &t), ECS_OK, "%s",
                             ecs_errmsg());
                cr_assert_eq(arch_shexp_tensor(f, &hp, il, (arch_exps_t)w, &t),
                             seeds[i].ff_sh ? ECS_OK : ECS_ERR_NOTFOUND, "%s", ecs_errmsg());
            }
        gguf_close(f);
        fuzz_seed_copy(path, seeds[i].name); /* before the case below rewrites path */
        if (seeds[i].arch == ARCH_DEEPSEEK2) {
            /* the shared experts' width is their count times the experts'
             * width: each key is range-checked before it is read, so the
             * product cannot overflow (fuzz_arch found it could, in
             * ecs-worker, which did not check the ranges) */
            seed_kv_t big[sizeof ds2 / sizeof ds2[0]];
            memcpy(big, ds2, sizeof big);
            for (size_t k = 0; k < sizeof ds2 / sizeof ds2[0]; k++) {
                if (strstr(big[k].key, "expert_shared_count"))
                    big[k].v = 1 << 20;
                if (strstr(big[k].key, "expert_feed_forward_length"))
                    big[k].v = 922746879;
            }
            write_seed(path, big, seeds[i].n_kv, 1, 1, 8, 4, 8, 0);
            cr_assert_eq(gguf_open(path, &f), ECS_OK, "%s", ecs_errmsg());
            cr_assert_eq(arch_read_hparams(f, &hp), ECS_ERR_RANGE);
            cr_assert(strstr(ecs_errmsg(), "metadata deepseek2.expert_feed_forward_length = "
                                           "922746879 is out of range (1..1048576)"),
                      "%s", ecs_errmsg());
            gguf_close(f);
        }
        unlink(path);
    }
}
