/* shard_fixture.h - what test_shard.c and test_worker_dev.c share: the
 * tiny deepseek2 model opened with every routed (layer, expert) pair in
 * one Assign, as a worker holding the whole model gets it. */
#ifndef ECS_TEST_SHARD_FIXTURE_H
#define ECS_TEST_SHARD_FIXTURE_H

#include <criterion/criterion.h>
#include <stdlib.h>

#include "worker/worker_int.h"

#define DS2 "../shared/models/tiny-ds2-q8_0.gguf"

typedef struct {
    gguf_file_t *f;
    arch_hparams_t hp;
    ecs_threadpool_t *tp; /* 2 threads */
    uint32_t *layers, *experts;
    wire_assign_t a;      /* every routed pair, generation 1 */
    int l0, l1;           /* the first two layers with routed experts (-1: none) */
} shard_model_t;

static __attribute__((unused)) void shard_model_open(shard_model_t *x)
{
    memset(x, 0, sizeof *x);
    cr_assert_eq(gguf_open(DS2, &x->f), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(arch_read_hparams(x->f, &x->hp), ECS_OK);
    cr_assert_eq(ecs_threadpool_create(2, &x->tp), ECS_OK);
    const size_t cells = (size_t)x->hp.n_layer * (size_t)x->hp.n_expert;
    x->layers = calloc(cells, sizeof *x->layers);
    x->experts = calloc(cells, sizeof *x->experts);
    cr_assert(x->layers && x->experts);
    size_t n = 0;
    x->l0 = x->l1 = -1;
    for (int l = 0; l < x->hp.n_layer; l++) {
        if (!arch_layer_moe(&x->hp, l))
            continue;
        if (x->l0 < 0)
            x->l0 = l;
        else if (x->l1 < 0)
            x->l1 = l;
        for (int e = 0; e < x->hp.n_expert; e++, n++) {
            x->layers[n] = (uint32_t)l;
            x->experts[n] = (uint32_t)e;
        }
    }
    x->a = (wire_assign_t){.generation = 1, .n = n, .layers = x->layers, .experts = x->experts};
}

static __attribute__((unused)) void shard_model_close(shard_model_t *x)
{
    ecs_threadpool_destroy(x->tp);
    gguf_close(x->f);
    free(x->layers);
    free(x->experts);
}

#endif
