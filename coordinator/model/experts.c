/* experts.c - the in-process routed-expert backend (the default, and the
 * reference every distributed configuration must equal): the model's
 * stacked expert tensors cut into per-expert views and handed to the
 * model-free grouped expert FFN (kernels/moe), which ecs-worker runs too.
 * All k slots of every row are computed here; kmoe_sum adds them in slot
 * order. The model's default path calls the pieces below directly, to put
 * the shared experts into the same parallel regions (forward.c). */
#include <stdlib.h>

#include "coordinator/model/model_int.h"

int model_experts_local_max_jobs(const model_t *m) { return model_hparams(m)->n_expert + 1; }

ecs_err_t model_experts_local_new(const model_t *m, ecs_threadpool_t *tp,
                                  model_experts_local_t **out)
{
    *out = NULL;
    const arch_hparams_t *hp = model_hparams(m);
    const model_weights_t *w = model_weights(m);
    const size_t X = (size_t)hp->n_expert, L = (size_t)hp->n_layer;
    model_experts_local_t *l = calloc(1, sizeof *l);
    kmoe_expert_t *ex = calloc(L * X > 0 ? L * X : 1, sizeof *ex);
    const kmoe_expert_t **layers = calloc(L ? L : 1, sizeof *layers);
    if (!l || !ex || !layers) {
        free(l);
        free(ex);
        free(layers);
        return ecs_error(ECS_ERR_NOMEM, "experts: out of memory");
    }
    l->experts = ex;
    l->layers = layers;
    l->tp = tp;
    l->n_embd = hp->n_embd;
    l->k_used = hp->n_expert_used;
    l->status = ECS_ERR_INVAL;
    for (size_t il = 0; il < L; il++) {
        const model_layer_t *ly = &w->layers[il];
        if (!ly->moe)
            continue;
        kmoe_split(&ly->gate_exps, &ly->up_exps, &ly->down_exps, hp->n_expert, ex + il * X);
        layers[il] = ex + il * X;
    }
    const kmoe_shape_t s = {.n_embd = hp->n_embd, .n_ff_exp = hp->n_ff_exp,
                            .n_expert = hp->n_expert, .k = hp->n_expert_used,
                            .max_rows = MODEL_MAX_BATCH};
    ecs_err_t e = kmoe_new(&s, layers, hp->n_layer, tp, &l->moe);
    if (e != ECS_OK) {
        model_experts_local_free(l);
        return e;
    }
    *out = l;
    return ECS_OK;
}

size_t model_experts_local_bytes(const model_experts_local_t *l)
{
    return l ? kmoe_bytes(l->moe) : 0;
}

void model_experts_local_free(model_experts_local_t *l)
{
    if (!l)
        return;
    kmoe_free(l->moe);
    free(l->layers);
    free(l->experts);
    free(l);
}

ecs_err_t model_experts_local_prepare(model_experts_local_t *l, int layer, int n_tok,
                                      const float *x, int k, const int32_t *ids)
{
    if (k != l->k_used)
        return ecs_error(ECS_ERR_INVAL, "experts: %d experts per row (the model routes to %d)",
                         k, l->k_used);
    MODEL_TRY(kmoe_prepare(l->moe, layer, n_tok, x, n_tok * k, NULL, ids));
    l->n_tok = n_tok;
    l->k = k;
    l->layer = layer;
    return ECS_OK;
}

void model_experts_local_finish(model_experts_local_t *l, const float *w, float *out)
{
    kmoe_sum(l->tp, l->n_tok, l->k, l->n_embd, kmoe_outs(l->moe), kmoe_where(l->moe), w, out);
}

static ecs_err_t local_submit(void *ctx, int tag, int layer, int n_tok, const float *x, int k,
                              const int32_t *ids, const float *w)
{
    model_experts_local_t *l = ctx;
    (void)tag; /* one slot: always 0 */
    l->status = ECS_ERR_INVAL;
    MODEL_TRY(model_experts_local_prepare(l, layer, n_tok, x, k, ids));
    kmoe_compute(l->moe);
    l->w = w;
    l->status = ECS_OK;
    return ECS_OK;
}

static ecs_err_t local_wait(void *ctx, int tag, int layer, float *out)
{
    model_experts_local_t *l = ctx;
    (void)tag;
    if (l->status != ECS_OK || layer != l->layer)
        return ecs_error(ECS_ERR_INVAL, "experts: wait for layer %d without a successful submit",
                         layer);
    l->status = ECS_ERR_INVAL;
    model_experts_local_finish(l, l->w, out);
    return ECS_OK;
}

const model_experts_ops model_experts_local_ops = {local_submit, local_wait, 1, NULL};
