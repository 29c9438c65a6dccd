/* test_paged.c - paged KV in the model: a sequence whose blocks lie
 * scattered over a shared pool gives the same logits, bit for bit, as one
 * with a contiguous cache of its own (prompt steps, decode, both
 * architectures, F16 and F32 rows); full blocks computed by one sequence
 * serve another's prefix unchanged; a step past a sequence's blocks is a
 * clear error that changes nothing. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/model/model.h"

#define DS2_Q8 "../shared/models/tiny-ds2-q8_0.gguf"
#define QWEN_Q8 "../shared/models/tiny-qwen3moe-q8_0.gguf"
#define N_CTX 512
#define NP 300 /* prompt tokens: 4 full blocks and a part */
#define ND 40  /* decode tokens: across a block boundary */

/* split_min: the depth from which decode splits the keys (0: default) */
static model_t *load(const char *path, int split_min)
{
    model_opts_t o = {.n_ctx = N_CTX, .n_threads = 2, .attn_split_min = split_min};
    model_t *m = NULL;
    cr_assert_eq(model_load(path, &o, &m), ECS_OK, "model_load(%s): %s", path, ecs_errmsg());
    return m;
}

static void tokens(const model_t *m, int32_t *t, int n)
{
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(((uint32_t)i * 7919u + 13u) % (uint32_t)model_n_vocab(m));
}

/* Tokens [from, NP) as a prompt in steps of at least 64 rows (cut at cut),
 * then ND decode tokens one at a time; out: logits of the prompt's last
 * row, then of every decode row. */
static void run(model_t *m, model_ctx_t *c, const int32_t *t, int from, int cut, float *out)
{
    const size_t V = (size_t)model_n_vocab(m);
    cr_assert_eq(model_eval(c, t + from, cut - from, NULL, false), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_eval(c, t + cut, NP - cut, out, false), ECS_OK, "%s", ecs_errmsg());
    for (int i = 0; i < ND; i++)
        cr_assert_eq(model_eval(c, t + NP + i, 1, out + (size_t)(i + 1) * V, false), ECS_OK, "%s",
                     ecs_errmsg());
}

/* The same run over a contiguous context and over a pool whose blocks are
 * handed out in a scrambled order (some consecutive): the same bits. */
static void scrambled(const char *path, unsigned flags, int split_min)
{
    model_t *m = load(path, split_min);
    const size_t V = (size_t)model_n_vocab(m), n_out = (size_t)(ND + 1) * V;
    int32_t t[NP + ND];
    tokens(m, t, NP + ND);
    float *a = malloc(n_out * sizeof *a), *b = malloc(n_out * sizeof *b);
    cr_assert(a && b);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, N_CTX, flags, &c), ECS_OK, "%s", ecs_errmsg());
    run(m, c, t, 0, 130, a);
    model_ctx_free(c);

    const int nb = N_CTX / MODEL_KV_BLOCK + 3;
    model_kvpool_t *p;
    cr_assert_eq(model_kvpool_new(m, nb, flags, &p), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_kvpool_n_blocks(p), nb);
    cr_assert_eq(model_ctx_new_paged(p, N_CTX, &c), ECS_OK, "%s", ecs_errmsg());
    int32_t *tab = model_ctx_table(c);
    const int need = (NP + ND + MODEL_KV_BLOCK - 1) / MODEL_KV_BLOCK;
    /* runs of consecutive ids (read as one run) and lone blocks */
    static const int32_t perm[] = {4, 5, 6, 0, 9, 10, 2, 3, 1, 7, 8};
    cr_assert(need <= (int)(sizeof perm / sizeof perm[0]) && nb == 11);
    for (int i = 0; i < need; i++)
        tab[i] = perm[i];
    cr_assert_eq(model_ctx_set_blocks(c, need, 0), ECS_OK, "%s", ecs_errmsg());
    run(m, c, t, 0, 130, b);
    cr_assert_eq(memcmp(a, b, n_out * sizeof *a), 0, "%s flags %u: paged logits differ", path, flags);
    model_ctx_free(c);
    model_kvpool_free(p);
    free(a);
    free(b);
    model_free(m);
}

Test(paged, scattered_blocks_same_bits_ds2) { scrambled(DS2_Q8, 0, 0); }
Test(paged, scattered_blocks_same_bits_ds2_f32) { scrambled(DS2_Q8, MODEL_CTX_KV_F32, 0); }
Test(paged, scattered_blocks_same_bits_ds2_absorbed) { scrambled(DS2_Q8, MODEL_CTX_MLA_ABSORBED, 0); }
Test(paged, scattered_blocks_same_bits_ds2_expanded) { scrambled(DS2_Q8, MODEL_CTX_MLA_EXPANDED, 0); }
Test(paged, scattered_blocks_same_bits_qwen3moe) { scrambled(QWEN_Q8, 0, 0); }
Test(paged, scattered_blocks_same_bits_qwen3moe_f32) { scrambled(QWEN_Q8, MODEL_CTX_KV_F32, 0); }
/* decode of a latent context split by keys (attn.c's split_run) from depth
 * 64: its items cross block runs (scores) and walk all runs (P.V) */
Test(paged, scattered_blocks_same_bits_ds2_key_split) { scrambled(DS2_Q8, 0, 64); }
Test(paged, scattered_blocks_same_bits_ds2_key_split_f32) { scrambled(DS2_Q8, MODEL_CTX_KV_F32, 64); }

/* Sequence B takes A's first two full blocks as its prefix and computes
 * only the rest: the logits of a cold run. */
static void shared_prefix(const char *path)
{
    model_t *m = load(path, 0);
    const size_t V = (size_t)model_n_vocab(m), n_out = (size_t)(ND + 1) * V;
    int32_t t[NP + ND];
    tokens(m, t, NP + ND);
    float *cold = malloc(n_out * sizeof *cold), *warm = malloc(n_out * sizeof *warm);
    cr_assert(cold && warm);
    model_kvpool_t *p;
    const int per = (NP + ND + MODEL_KV_BLOCK - 1) / MODEL_KV_BLOCK;
    cr_assert_eq(model_kvpool_new(m, 2 * per, 0, &p), ECS_OK, "%s", ecs_errmsg());
    model_ctx_t *a, *b;
    cr_assert_eq(model_ctx_new_paged(p, N_CTX, &a), ECS_OK);
    cr_assert_eq(model_ctx_new_paged(p, N_CTX, &b), ECS_OK);
    for (int i = 0; i < per; i++) {
        model_ctx_table(a)[i] = i;
        model_ctx_table(b)[i] = i < 2 ? i : per + i;
    }
    cr_assert_eq(model_ctx_set_blocks(a, per, 0), ECS_OK);
    run(m, a, t, 0, 130, cold); /* cut: each step at least 64 rows */
    cr_assert_eq(model_ctx_set_blocks(b, per, 2 * MODEL_KV_BLOCK), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_ctx_n_past(b), 2 * MODEL_KV_BLOCK);
    run(m, b, t, 2 * MODEL_KV_BLOCK, 2 * MODEL_KV_BLOCK + 80, warm);
    cr_assert_eq(memcmp(cold, warm, n_out * sizeof *cold), 0, "%s: a shared prefix changed logits", path);
    model_ctx_free(a);
    model_ctx_free(b);
    model_kvpool_free(p);
    free(cold);
    free(warm);
    model_free(m);
}

Test(paged, shared_prefix_blocks_ds2) { shared_prefix(DS2_Q8); }
Test(paged, shared_prefix_blocks_qwen3moe) { shared_prefix(QWEN_Q8); }

Test(paged, past_the_blocks_is_a_clear_error)
{
    model_t *m = load(QWEN_Q8, 0);
    model_kvpool_t *p;
    cr_assert_eq(model_kvpool_new(m, 0, 0, &p), ECS_ERR_RANGE);
    cr_assert_eq(model_kvpool_new(m, 2, 1u << 7, &p), ECS_ERR_INVAL);
    cr_assert_eq(model_kvpool_new(m, 2, 0, &p), ECS_OK);
    cr_assert_eq(model_kv_block_bytes(m, 0), model_ctx_bytes(m, MODEL_KV_BLOCK, 0));
    const size_t bb = model_kv_block_bytes(m, 0);
    unsigned char *x = malloc(bb), *y = malloc(bb);
    cr_assert(x && y);
    for (size_t i = 0; i < bb; i++)
        x[i] = (unsigned char)(i * 31 + 7);
    model_kvpool_block_put(p, 1, x);
    model_kvpool_block_get(p, 1, y);
    cr_assert_eq(memcmp(x, y, bb), 0, "a block's bytes round-trip");
    free(x);
    free(y);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new_paged(p, N_CTX, &c), ECS_OK);
    int32_t t[MODEL_KV_BLOCK + 1];
    tokens(m, t, MODEL_KV_BLOCK + 1);
    float *l = malloc((size_t)model_n_vocab(m) * sizeof *l);
    cr_assert_not_null(l);
    cr_assert_eq(model_eval(c, t, 1, l, false), ECS_ERR_NOMEM, "no blocks yet");
    model_ctx_table(c)[0] = 2;
    cr_assert_eq(model_ctx_set_blocks(c, 1, 0), ECS_ERR_RANGE, "block outside the pool");
    model_ctx_table(c)[0] = 1;
    cr_assert_eq(model_ctx_set_blocks(c, 1, MODEL_KV_BLOCK + 1), ECS_ERR_RANGE);
    cr_assert_eq(model_ctx_set_blocks(c, 1, 0), ECS_OK);
    cr_assert_eq(model_eval(c, t, MODEL_KV_BLOCK, l, false), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(model_eval(c, t + MODEL_KV_BLOCK, 1, l, false), ECS_ERR_NOMEM);
    cr_assert(strstr(ecs_errmsg(), "blocks"), "message: %s", ecs_errmsg());
    cr_assert_eq(model_ctx_n_past(c), MODEL_KV_BLOCK, "nothing evaluated");
    free(l);
    model_ctx_free(c);
    model_kvpool_free(p);
    model_free(m);
}
