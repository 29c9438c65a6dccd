/* shared.c - a layer's shared experts computed by the worker that takes
 * its decode call, fused with the routed experts in the worker's two
 * product regions (ExpertCall.shared, --shared-experts).
 *
 * Why: workers spawned here share this host's cores with the coordinator,
 * so computing the shared experts here while the call is out overlaps
 * nothing; it only adds a region on each side and splits the cores
 * between two processes. Fused on the worker they cost what they cost in
 * one process (the profile of docs/benchmarks.md, session 24: 251 us a
 * layer call here against ~186 us more on the worker's fused regions).
 *
 * Exactness: the worker computes them with the model's products on the
 * same rows (kernels/moe/ffn.c: the same bits); they come back as f32 rows
 * after the call's entries and go where the model would have put its own.
 * A call that carried them and failed sends them again with the next call
 * to a worker holding them; when none is left to send, they are computed
 * here (model_shared_ffn), so a failure changes no bit either. */
#include <stdlib.h>
#include <string.h>

#include "coordinator/dispatch/dispatch_int.h"

static ecs_type_t vdt_of(const gguf_tensor_t *t)
{
    const ecs_type_traits_t *tr = ecs_type_traits(t->type);
    return tr ? tr->vec_dot_type : ECS_TYPE_COUNT;
}

/* Whether layer il's shared experts can go with its calls: the worker
 * computes them from the rows a call carries, f32 or quantized for the
 * routed gate/up (then the shared gate and up must take that type too). */
static bool layer_ok(dispatch_t *d, int il)
{
    const gguf_file_t *f = model_gguf(d->m);
    const gguf_tensor_t *g, *u;
    if (!arch_layer_moe(&d->hp, il) ||
        arch_shexp_tensor(f, &d->hp, il, ARCH_EXPS_GATE, &g) != ECS_OK ||
        arch_shexp_tensor(f, &d->hp, il, ARCH_EXPS_UP, &u) != ECS_OK)
        return false;
    const uint32_t t = d->act_type[il];
    return t == ECS_TYPE_F32 || (vdt_of(g) == (ecs_type_t)t && vdt_of(u) == (ecs_type_t)t);
}

ecs_err_t dispatch_shared_new(dispatch_t *d)
{
    d->sh_layer = calloc((size_t)d->hp.n_layer, sizeof *d->sh_layer);
    if (!d->sh_layer)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
    for (int il = 0; il < d->hp.n_layer; il++) {
        d->sh_layer[il] = d->hp.n_ff_shexp > 0 && layer_ok(d, il);
        d->sh_any |= d->sh_layer[il];
    }
    ecs_clear_error();
    return ECS_OK;
}

bool dispatch_shared_wanted(dispatch_t *d, int wi)
{
    /* bf16 results are the inexact option; the shared rows come back f32 */
    if (!d->sh_any || d->o.wire_bf16 || !(atomic_load(&d->w[wi].caps) & WIRE_CAP_SHARED))
        return false;
    if (d->o.shared_experts != 0)
        return d->o.shared_experts == 2;
    return d->w[wi].child >= 0 && !d->o.worker_budget;
}

void dispatch_shared_begin(dispatch_t *d)
{
    dispatch_batch_t *b = d->b;
    b->sh_slot = -1;
    b->sh = NULL;
    b->sh_todo = d->sh_layer[b->layer] && b->n_tok <= DISPATCH_ALONE_ROWS;
}

int dispatch_shared_carrier(dispatch_t *d)
{
    if (!d->b->sh_todo)
        return -1;
    int best = -1;
    for (int wi = 0; wi < d->n_workers; wi++)
        if (d->rows_now[wi] && atomic_load(&d->w[wi].sh_held) &&
            (best < 0 || d->rows_now[wi] < d->rows_now[best]))
            best = wi;
    return best;
}

void dispatch_shared_sent(dispatch_t *d, int slot)
{
    d->b->sh_slot = slot;
    d->b->sh_todo = false;
}

bool dispatch_took_shared(void *ctx, int tag, float *sh)
{
    dispatch_t *d = ctx;
    if (tag < 0 || tag >= MODEL_MAX_MICRO)
        return false;
    dispatch_batch_t *b = &d->bt[tag];
    if (!b->busy || b->sh_slot < 0) {
        b->sh_todo = false; /* the model computes them */
        return false;
    }
    b->sh = sh;
    pthread_mutex_lock(&d->lock);
    d->sh_calls++;
    pthread_mutex_unlock(&d->lock);
    return true;
}

void dispatch_shared_failed(dispatch_t *d, int slot)
{
    if (slot != d->b->sh_slot)
        return;
    d->b->sh_slot = -1;
    d->b->sh_todo = d->b->sh != NULL;
}

void dispatch_shared_collect(dispatch_t *d, int slot, const void *rows)
{
    if (slot != d->b->sh_slot)
        return;
    if (d->b->sh)
        memcpy(d->b->sh, rows, (size_t)d->b->n_tok * (size_t)d->hp.n_embd * sizeof(float));
    d->b->sh_slot = -1;
}

bool dispatch_shared_finish(dispatch_t *d)
{
    dispatch_batch_t *b = d->b;
    if (!b->sh || !b->sh_todo)
        return false;
    model_shared_ffn(d->m, b->layer, b->n_tok, b->x, b->sh);
    b->sh_todo = false;
    pthread_mutex_lock(&d->lock);
    d->sh_here++;
    pthread_mutex_unlock(&d->lock);
    return true;
}
