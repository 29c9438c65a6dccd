/* experts.c - the in-process routed-expert backend (the default, and the
 * reference every distributed configuration must equal).
 *
 * A step's (row, slot) pairs are grouped by expert and the input rows
 * quantized once; each expert with work gets its rows gathered into one
 * activation batch, so its gate and up are one batched product (SwiGLU
 * applied chunk by chunk) and its down another: every expert's weights
 * are read once per step. All experts' gate/up go into one parallel region
 * and all downs into another (par.c); the model adds the shared experts to
 * the same regions (forward.c). Each (row, slot) result is kept apart and
 * the weighted sum runs in slot order, as llama.cpp does, so the result
 * does not depend on how rows were grouped. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/model/model_int.h"

#define PAR_ROWS 32

struct model_experts_local {
    const model_t *m;
    ecs_threadpool_t *tp;
    int n_tok, k;
    ecs_err_t status;      /* of the last submit, reported by wait */
    int layer;
    const float *w;        /* submit's weights, summed by wait */
    int32_t *start;        /* [n_expert+1] first list entry of each expert */
    int32_t *list;         /* [nb*k] row*k + slot, grouped by expert */
    int32_t *where;        /* [nb*k] list entry of each row*k + slot */
    void *xq, *xq_up;      /* the step's rows quantized for gate / up */
    void *gq, *gq_up;      /* the same, gathered in list order */
    size_t st_in, st_up, st_h; /* this layer's bytes per gate / up input and hidden row */
    bool same;             /* gate and up take the same activations */
    float *g, *u;          /* [nb*k][n_ff_exp] gate (then h) and up */
    void *hq;              /* [nb*k] h quantized for down */
    float *d;              /* [nb*k][n_embd] down outputs, list order */
    bool hq_fused;         /* the gate/up region quantized h */
    par_job_t *jobs;
    par_plan_t plan;
    void *mem;
    size_t bytes;
};

static size_t up64(size_t x) { return (x + 63) & ~(size_t)63; }

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

int model_experts_local_max_jobs(const model_t *m) { return model_hparams(m)->n_expert + 1; }

ecs_err_t model_experts_local_new(const model_t *m, ecs_threadpool_t *tp,
                                  model_experts_local_t **out)
{
    *out = NULL;
    const model_hparams_t *hp = model_hparams(m);
    const model_weights_t *w = model_weights(m);
    const size_t nb = MODEL_MAX_BATCH, E = (size_t)hp->n_embd, F = (size_t)hp->n_ff_exp;
    const size_t k = (size_t)hp->n_expert_used, X = (size_t)hp->n_expert;
    size_t row_in = 0, row_h = 0;
    bool two = false;
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer_t *ly = &w->layers[il];
        if (!ly->moe)
            continue;
        row_in = max_z(row_in, model_act_row(ly->gate_exps.type, (int64_t)E));
        row_in = max_z(row_in, model_act_row(ly->up_exps.type, (int64_t)E));
        row_h = max_z(row_h, model_act_row(ly->down_exps.type, (int64_t)F));
        two |= ecs_type_traits(ly->gate_exps.type)->vec_dot_type !=
               ecs_type_traits(ly->up_exps.type)->vec_dot_type;
    }
    const size_t chunk_cap = 64 * (X + 1) + 1024;
    const size_t sizes[] = {
        up64((X + 1) * sizeof(int32_t)), up64(nb * k * sizeof(int32_t)),
        up64(nb * k * sizeof(int32_t)), up64(nb * row_in), up64(two ? nb * row_in : 0),
        up64(nb * k * row_in), up64(two ? nb * k * row_in : 0), up64(nb * k * F * sizeof(float)),
        up64(nb * k * F * sizeof(float)), up64(nb * k * row_h), up64(nb * k * E * sizeof(float)),
        up64((X + 1) * sizeof(par_job_t)), up64(chunk_cap * sizeof(par_chunk_t)),
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        total += sizes[i];
    model_experts_local_t *l = calloc(1, sizeof *l);
    char *p = model_alloc_huge(total);
    if (!l || !p) {
        free(l);
        free(p);
        return ecs_error(ECS_ERR_NOMEM, "experts: cannot allocate %zu bytes", total);
    }
    l->m = m;
    l->tp = tp;
    l->mem = p;
    l->bytes = total;
    void **slots[] = {(void **)&l->start, (void **)&l->list, (void **)&l->where, &l->xq,
                      &l->xq_up, &l->gq, &l->gq_up, (void **)&l->g, (void **)&l->u, &l->hq,
                      (void **)&l->d, (void **)&l->jobs, (void **)&l->plan.chunks};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *slots[i] = p;
        p += sizes[i];
    }
    l->plan.cap = (int)chunk_cap;
    l->status = ECS_ERR_INVAL;
    *out = l;
    return ECS_OK;
}

size_t model_experts_local_bytes(const model_experts_local_t *l) { return l ? l->bytes : 0; }

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
    for (int j = 0; j < n_tok * k; j++) {
        l->where[j] = l->start[ids[j]]++;
        l->list[l->where[j]] = j;
    }
    for (int e = X; e > 0; e--)
        l->start[e] = l->start[e - 1];
    l->start[0] = 0;
}

static void gather_item(void *arg, int item, int ith)
{
    model_experts_local_t *l = arg;
    (void)ith;
    const int n = l->n_tok * l->k;
    const int p1 = (item + 1) * PAR_ROWS < n ? (item + 1) * PAR_ROWS : n;
    for (int p = item * PAR_ROWS; p < p1; p++) {
        const size_t t = (size_t)(l->list[p] / l->k);
        memcpy((char *)l->gq + p * l->st_in, (const char *)l->xq + t * l->st_in, l->st_in);
        if (!l->same)
            memcpy((char *)l->gq_up + p * l->st_up, (const char *)l->xq_up + t * l->st_up,
                   l->st_up);
    }
}

ecs_err_t model_experts_local_prepare(model_experts_local_t *l, int layer, int n_tok,
                                      const float *x, int k, const int32_t *ids)
{
    const model_hparams_t *hp = model_hparams(l->m);
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
    ecs_threadpool_t *tp = n_tok >= 8 ? l->tp : NULL;
    l->same = ecs_type_traits(ly->gate_exps.type)->vec_dot_type ==
              ecs_type_traits(ly->up_exps.type)->vec_dot_type;
    l->st_in = model_act_row(ly->gate_exps.type, E);
    l->st_up = model_act_row(ly->up_exps.type, E);
    l->st_h = model_act_row(ly->down_exps.type, hp->n_ff_exp);
    kcpu_quantize_rows(tp, ly->gate_exps.type, x, E, n_tok, E, l->xq);
    if (!l->same)
        kcpu_quantize_rows(tp, ly->up_exps.type, x, E, n_tok, E, l->xq_up);
    /* one row (decode): every expert reads it where it is */
    const int items = n_tok == 1 ? 0 : (n_tok * k + PAR_ROWS - 1) / PAR_ROWS;
    if (items > 1)
        par_for(l->tp, items, gather_item, l);
    else if (items == 1)
        gather_item(l, 0, 0);
    return ECS_OK;
}

static const model_layer_t *cur_layer(const model_experts_local_t *l)
{
    return &model_weights(l->m)->layers[l->layer];
}

void model_experts_local_gate_up(model_experts_local_t *l, model_jobs_t *j)
{
    const model_hparams_t *hp = model_hparams(l->m);
    const model_layer_t *ly = cur_layer(l);
    const int E = hp->n_embd, F = hp->n_ff_exp;
    l->hq_fused = false;
    for (int e = 0; e < hp->n_expert; e++) {
        const int s = l->start[e], cnt = l->start[e + 1] - s;
        if (cnt == 0)
            continue;
        const kcpu_mat_t G = model_expert_mat(&ly->gate_exps, e, F);
        const kcpu_mat_t U = model_expert_mat(&ly->up_exps, e, F);
        const kcpu_mat_t D = model_expert_mat(&ly->down_exps, e, E);
        const bool one = l->n_tok == 1; /* not gathered: see prepare */
        const void *ag = one ? l->xq : (const char *)l->gq + (size_t)s * l->st_in;
        const void *au = l->same ? ag
                         : one   ? l->xq_up
                                 : (const char *)l->gq_up + (size_t)s * l->st_up;
        par_job_t job = par_swiglu(&G, &U, &D, ag, au, cnt, l->g + (size_t)s * F,
                                   l->u + (size_t)s * F, F, (char *)l->hq + (size_t)s * l->st_h);
        l->hq_fused = job.hq != NULL;
        j->jobs[j->n++] = job;
    }
}

void model_experts_local_down(model_experts_local_t *l, model_jobs_t *j)
{
    const model_hparams_t *hp = model_hparams(l->m);
    const model_layer_t *ly = cur_layer(l);
    const int E = hp->n_embd, F = hp->n_ff_exp, rows = l->n_tok * l->k;
    if (!l->hq_fused)
        kcpu_quantize_rows(rows >= 8 ? l->tp : NULL, ly->down_exps.type, l->g, F, rows, F, l->hq);
    for (int e = 0; e < hp->n_expert; e++) {
        const int s = l->start[e], cnt = l->start[e + 1] - s;
        if (cnt == 0)
            continue;
        const kcpu_mat_t D = model_expert_mat(&ly->down_exps, e, E);
        j->jobs[j->n++] = par_mm(&D, (const char *)l->hq + (size_t)s * l->st_h, cnt,
                                 l->d + (size_t)s * E, E);
    }
}

typedef struct {
    const model_experts_local_t *l;
    const float *w;
    float *out;
} finish_t;

/* Values per block of the weighted sum: a fixed trip count lets the
 * compiler vectorize at -O2 (it will not for a run-time count), and the
 * block's partial sum stays in registers across the k slots. */
#define SUM_BLOCK 16

/* acc = sum over slots j < k (in slot order) of w[j] * (row at d + where[j] *
 * E), columns [c0, c0 + len); inlined with len = SUM_BLOCK it vectorises. */
static inline __attribute__((always_inline)) void
weighted_cols(float *restrict acc, const float *restrict d, const int32_t *where, const float *w,
              int k, size_t E, size_t c0, size_t len)
{
    const float *restrict r = d + (size_t)where[0] * E + c0;
    for (size_t c = 0; c < len; c++)
        acc[c] = r[c] * w[0];
    for (int j = 1; j < k; j++) {
        r = d + (size_t)where[j] * E + c0;
        for (size_t c = 0; c < len; c++)
            acc[c] += r[c] * w[j];
    }
}

/* o[c0, c0 + len) = the weighted sum above, len <= SUM_BLOCK. */
static void weighted_block(float *restrict o, const float *restrict d, const int32_t *where,
                           const float *w, int k, size_t E, size_t c0, size_t len)
{
    float acc[SUM_BLOCK];
    if (len == SUM_BLOCK)
        weighted_cols(acc, d, where, w, k, E, c0, SUM_BLOCK);
    else
        weighted_cols(acc, d, where, w, k, E, c0, len);
    memcpy(o + c0, acc, len * sizeof *o);
}

static void finish_item(void *arg, int item, int ith)
{
    const finish_t *f = arg;
    const model_experts_local_t *l = f->l;
    (void)ith;
    const size_t E = (size_t)model_hparams(l->m)->n_embd;
    const int k = l->k;
    const int t1 = (item + 1) * PAR_ROWS < l->n_tok ? (item + 1) * PAR_ROWS : l->n_tok;
    for (int t = item * PAR_ROWS; t < t1; t++)
        for (size_t c = 0; c < E; c += SUM_BLOCK)
            weighted_block(f->out + (size_t)t * E, l->d, l->where + (size_t)t * k,
                           f->w + (size_t)t * k, k, E, c, E - c < SUM_BLOCK ? E - c : SUM_BLOCK);
}

void model_experts_local_finish(model_experts_local_t *l, const float *w, float *out)
{
    finish_t f = {l, w, out};
    const int items = (l->n_tok + PAR_ROWS - 1) / PAR_ROWS;
    if (items > 1)
        par_for(l->tp, items, finish_item, &f);
    else
        finish_item(&f, 0, 0);
}

static ecs_err_t local_submit(void *ctx, int layer, int n_tok, const float *x, int k,
                              const int32_t *ids, const float *w)
{
    model_experts_local_t *l = ctx;
    l->status = ECS_ERR_INVAL;
    MODEL_TRY(model_experts_local_prepare(l, layer, n_tok, x, k, ids));
    model_jobs_t jobs = {l->jobs, 0};
    model_experts_local_gate_up(l, &jobs);
    par_run(l->tp, &l->plan, jobs.jobs, jobs.n);
    jobs.n = 0;
    model_experts_local_down(l, &jobs);
    par_run(l->tp, &l->plan, jobs.jobs, jobs.n);
    l->w = w;
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
    model_experts_local_finish(l, l->w, out);
    return ECS_OK;
}

const model_experts_ops model_experts_local_ops = {local_submit, local_wait};
