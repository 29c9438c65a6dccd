/* experts.c - the in-process routed-expert backend (the default, and the
 * reference every distributed configuration must equal).
 *
 * submit() groups the step's (row, slot) pairs by expert, quantizes the
 * input rows once, and for each expert with work gathers its rows into one
 * activation batch: gate and up are then one batched matmul each, so every
 * expert's weights are read once per step. Each (row, slot) result is kept
 * apart and wait() sums a row's slots in slot order, as llama.cpp does, so
 * the result does not depend on how rows were grouped. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/model/model_int.h"

struct model_experts_local {
    const model_t *m;
    ecs_threadpool_t *tp;
    int n_tok, k;
    ecs_err_t status;      /* of the last submit, reported by wait */
    int layer;
    int32_t *start;        /* [n_expert+1] first list entry of each expert */
    int32_t *list;         /* [nb*k] row*k + slot, grouped by expert */
    void *qx_gate, *qx_up; /* the step's rows quantized for gate / up */
    void *qg_gate, *qg_up; /* one expert's gathered rows */
    float *g, *u;          /* [nb][n_ff_exp] */
    float *d;              /* [nb][n_embd] */
    float *slots;          /* [nb][k][n_embd] weighted expert outputs */
    void *act;             /* down-projection activations */
    void *mem;
};

/* Bytes between packed activation rows for weights of type wtype. */
static size_t vdt_row(ecs_type_t wtype, int64_t ncols)
{
    return ecs_row_size(ecs_type_traits(wtype)->vec_dot_type, ncols);
}

static size_t up64(size_t x) { return (x + 63) & ~(size_t)63; }

ecs_err_t model_experts_local_new(const model_t *m, ecs_threadpool_t *tp,
                                  model_experts_local_t **out)
{
    *out = NULL;
    const model_hparams_t *hp = model_hparams(m);
    const model_weights_t *w = model_weights(m);
    const size_t nb = MODEL_MAX_BATCH, E = (size_t)hp->n_embd, F = (size_t)hp->n_ff_exp;
    const size_t k = (size_t)hp->n_expert_used;
    size_t row_in = 0, act = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer_t *ly = &w->layers[il];
        if (!ly->moe)
            continue;
        size_t a = vdt_row(ly->gate_exps.type, (int64_t)E), b = vdt_row(ly->up_exps.type, (int64_t)E);
        row_in = a > row_in ? a : row_in;
        row_in = b > row_in ? b : row_in;
        size_t c = kcpu_act_bytes(ly->down_exps.type, (int64_t)F, MODEL_MAX_BATCH);
        act = c > act ? c : act;
    }
    const size_t sizes[] = {
        up64(((size_t)hp->n_expert + 1) * sizeof(int32_t)),
        up64(nb * k * sizeof(int32_t)),
        up64(nb * row_in), up64(nb * row_in), up64(nb * row_in), up64(nb * row_in),
        up64(nb * F * sizeof(float)), up64(nb * F * sizeof(float)),
        up64(nb * E * sizeof(float)), up64(nb * k * E * sizeof(float)), up64(act),
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        total += sizes[i];
    model_experts_local_t *l = calloc(1, sizeof *l);
    char *p = total ? aligned_alloc(64, total) : NULL;
    if (!l || (total && !p)) {
        free(l);
        free(p);
        return ecs_error(ECS_ERR_NOMEM, "experts: cannot allocate %zu bytes", total);
    }
    l->m = m;
    l->tp = tp;
    l->mem = p;
    void **slots[] = {(void **)&l->start, (void **)&l->list, &l->qx_gate, &l->qx_up, &l->qg_gate,
                      &l->qg_up, (void **)&l->g, (void **)&l->u, (void **)&l->d,
                      (void **)&l->slots, &l->act};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *slots[i] = p;
        p += sizes[i];
    }
    l->status = ECS_ERR_INVAL;
    *out = l;
    return ECS_OK;
}

void model_experts_local_free(model_experts_local_t *l)
{
    if (!l)
        return;
    free(l->mem);
    free(l);
}

/* Counting sort of the (row, slot) pairs by expert id. */
static void group_by_expert(model_experts_local_t *l, int n_tok, int k, const int32_t *ids)
{
    const int X = model_hparams(l->m)->n_expert;
    memset(l->start, 0, ((size_t)X + 1) * sizeof *l->start);
    for (int j = 0; j < n_tok * k; j++)
        l->start[ids[j] + 1]++;
    for (int e = 0; e < X; e++)
        l->start[e + 1] += l->start[e];
    for (int j = 0; j < n_tok * k; j++)
        l->list[l->start[ids[j]]++] = j;
    for (int e = X; e > 0; e--)
        l->start[e] = l->start[e - 1];
    l->start[0] = 0;
}

static void gather(void *dst, const void *src, size_t row, const int32_t *list, int n, int k)
{
    for (int r = 0; r < n; r++)
        memcpy((char *)dst + (size_t)r * row, (const char *)src + (size_t)(list[r] / k) * row, row);
}

static void run_expert(model_experts_local_t *l, const model_layer_t *ly, int e, const float *w,
                       bool same_act)
{
    const model_hparams_t *hp = model_hparams(l->m);
    const int E = hp->n_embd, F = hp->n_ff_exp, k = l->k;
    const int32_t *lst = l->list + l->start[e];
    const int cnt = l->start[e + 1] - l->start[e];
    const kcpu_mat_t G = model_expert_mat(&ly->gate_exps, e, F);
    const kcpu_mat_t U = model_expert_mat(&ly->up_exps, e, F);
    const kcpu_mat_t D = model_expert_mat(&ly->down_exps, e, E);
    gather(l->qg_gate, l->qx_gate, vdt_row(G.type, E), lst, cnt, k);
    kcpu_matmul_q(l->tp, &G, l->qg_gate, cnt, l->g, F);
    if (!same_act)
        gather(l->qg_up, l->qx_up, vdt_row(U.type, E), lst, cnt, k);
    kcpu_matmul_q(l->tp, &U, same_act ? l->qg_gate : l->qg_up, cnt, l->u, F);
    for (size_t i = 0; i < (size_t)cnt * F; i++)
        l->g[i] = l->g[i] / (1.0f + expf(-l->g[i])) * l->u[i];
    kcpu_matmul(l->tp, &D, l->g, F, cnt, l->d, E, l->act);
    for (int r = 0; r < cnt; r++) {
        const float wt = w[lst[r]];
        float *dst = l->slots + (size_t)lst[r] * E;
        const float *src = l->d + (size_t)r * E;
        for (int c = 0; c < E; c++)
            dst[c] = src[c] * wt;
    }
}

static ecs_err_t local_submit(void *ctx, int layer, int n_tok, const float *x, int k,
                              const int32_t *ids, const float *w)
{
    model_experts_local_t *l = ctx;
    const model_hparams_t *hp = model_hparams(l->m);
    l->status = ECS_ERR_INVAL;
    if (layer < 0 || layer >= hp->n_layer || !model_weights(l->m)->layers[layer].moe)
        return ecs_error(ECS_ERR_INVAL, "experts: layer %d has no routed experts", layer);
    if (n_tok < 1 || n_tok > MODEL_MAX_BATCH || k != hp->n_expert_used)
        return ecs_error(ECS_ERR_INVAL, "experts: %d rows x %d experts (max %d x %d)", n_tok, k,
                         MODEL_MAX_BATCH, hp->n_expert_used);
    for (int j = 0; j < n_tok * k; j++)
        if (ids[j] < 0 || ids[j] >= hp->n_expert)
            return ecs_error(ECS_ERR_RANGE, "experts: expert id %d out of range", ids[j]);
    const model_layer_t *ly = &model_weights(l->m)->layers[layer];
    const int E = hp->n_embd;
    l->n_tok = n_tok;
    l->k = k;
    l->layer = layer;
    group_by_expert(l, n_tok, k, ids);
    const ecs_type_t tg = ly->gate_exps.type, tu = ly->up_exps.type;
    const bool same_act = ecs_type_traits(tg)->vec_dot_type == ecs_type_traits(tu)->vec_dot_type;
    kcpu_quantize_rows(l->tp, tg, x, E, n_tok, E, l->qx_gate);
    if (!same_act)
        kcpu_quantize_rows(l->tp, tu, x, E, n_tok, E, l->qx_up);
    for (int e = 0; e < hp->n_expert; e++)
        if (l->start[e + 1] > l->start[e])
            run_expert(l, ly, e, w, same_act);
    l->status = ECS_OK;
    return ECS_OK;
}

static ecs_err_t local_wait(void *ctx, int layer, float *out)
{
    model_experts_local_t *l = ctx;
    if (l->status != ECS_OK || layer != l->layer)
        return ecs_error(ECS_ERR_INVAL, "experts: wait for layer %d without a successful submit",
                         layer);
    l->status = ECS_ERR_INVAL;
    const size_t E = (size_t)model_hparams(l->m)->n_embd;
    for (int t = 0; t < l->n_tok; t++) {
        float *o = out + (size_t)t * E;
        const float *s = l->slots + (size_t)t * l->k * E;
        memcpy(o, s, E * sizeof *o);
        for (int j = 1; j < l->k; j++)
            for (size_t c = 0; c < E; c++)
                o[c] += s[(size_t)j * E + c];
    }
    return ECS_OK;
}

const model_experts_ops model_experts_local_ops = {local_submit, local_wait};
