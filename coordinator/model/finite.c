/* finite.c - where non-finite activations started, for an error that blames
 * the model file instead of a symptom downstream ("expert id -1 out of
 * range" from routing NaN logits, "logit N is NaN" in the sampler).
 *
 * Every layer's residual is checked, all rows (forward.c: n_embd floats a
 * row, nothing beside the layer's products), and model_eval_batch checks the
 * final residual rows and the logits of every step (the residual keeps a NaN
 * once one enters it, even where quantized products turn NaN inputs into
 * finite garbage); when they or the step fail, model_diagnose_step reruns the step once with a checking expert
 * backend wrapped around the installed one. Its hooks run
 * at every MoE layer between attention and FFN (submit) and after the
 * experts (wait), where the workspace still holds that layer's
 * intermediates, so the first non-finite one names the layer, the phase and
 * the tensor. The rerun rewrites the same K/V rows (the context's n_past
 * has not moved) with the same values. */
#include <math.h>
#include <stdio.h>

#include "coordinator/model/model_int.h"

bool model_all_finite(const float *x, size_t n)
{
    /* x - x is 0 for finite x and NaN otherwise: sums in independent lanes
     * (which the compiler vectorizes) with no branch per value */
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int c = 0; c < 16; c++)
            acc[c] += x[i + c] - x[i + c];
    for (; i < n; i++)
        acc[0] += x[i] - x[i];
    float all = 0.0f;
    for (int c = 0; c < 16; c++)
        all += acc[c];
    return all == 0.0f;
}

typedef struct {
    model_t *m;
    const model_experts_ops *ops; /* the backend the model had */
    void *ctx;
    int n_tok;          /* rows of the layer in flight */
    int checked_layer;  /* last layer whose FFN output was finite (-1: none) */
    bool found;
} diag_t;

static ecs_err_t found(diag_t *d, int layer, const char *phase, const char *tensors)
{
    d->found = true;
    char names[160];
    snprintf(names, sizeof names, tensors, layer, layer, layer);
    return ecs_error(ECS_ERR_FORMAT,
                     "%s: non-finite activations start in layer %d, %s (%s): the model file is "
                     "likely damaged (a weight's values, type or offset)",
                     gguf_path(d->m->file), layer, phase, names);
}

/* Rows' worth of floats of a workspace buffer, checked. */
#define OK(buf, width) model_all_finite((buf), (size_t)d->n_tok * (size_t)(width))

static ecs_err_t check_attention(diag_t *d, int layer)
{
    const arch_hparams_t *hp = &d->m->hp;
    const model_ws_t *ws = &d->m->ws;
    const bool ds2 = hp->arch == ARCH_DEEPSEEK2;
    /* queries from a finite residual are the first thing attention makes;
     * non-finite ones after unchecked (dense) layers may be theirs */
    const bool q_ok = OK(ws->q, hp->n_head * hp->head_k);
    if (!q_ok && d->checked_layer != layer - 1)
        return found(d, layer, "attention queries, or a leading dense FFN before this layer",
                     "blk.%d.attn_norm, blk.%d.attn_q*, blk.*.ffn_gate/ffn_up/ffn_down");
    if (!q_ok)
        return found(d, layer, "attention queries",
                     ds2 ? "blk.%d.attn_norm, blk.%d.attn_q_a/attn_q_a_norm/attn_q_b"
                         : "blk.%d.attn_norm, blk.%d.attn_q, blk.%d.attn_q_norm");
    if (!OK(ws->attv, hp->n_head * hp->head_v))
        return found(d, layer, "attention keys and values",
                     ds2 ? "blk.%d.attn_kv_a_mqa, blk.%d.attn_kv_a_norm, blk.%d.attn_kv_b"
                         : "blk.%d.attn_k, blk.%d.attn_v, blk.%d.attn_k_norm");
    if (!OK(ws->tmp, hp->n_embd))
        return found(d, layer, "attention output", "blk.%d.attn_output");
    return found(d, layer, "residual after attention", "blk.%d.attn_output");
}

static ecs_err_t diag_submit(void *ctx, int tag, int layer, int n_tok, const float *x, int k,
                             const int32_t *ids, const float *w)
{
    diag_t *d = ctx;
    const arch_hparams_t *hp = &d->m->hp;
    const model_ws_t *ws = &d->m->ws;
    d->n_tok = n_tok;
    if (!OK(ws->x, hp->n_embd))
        return check_attention(d, layer);
    if (!OK(x, hp->n_embd))
        return found(d, layer, "FFN input norm", "blk.%d.ffn_norm");
    if (!OK(ws->router, hp->n_expert))
        return found(d, layer, "router", "blk.%d.ffn_gate_inp");
    if (!OK(w, k))
        return found(d, layer, "routing weights", "blk.%d.ffn_gate_inp, blk.%d.exp_probs_b");
    return d->ops->submit(d->ctx, tag, layer, n_tok, x, k, ids, w);
}

static ecs_err_t diag_wait(void *ctx, int tag, int layer, float *out)
{
    diag_t *d = ctx;
    const arch_hparams_t *hp = &d->m->hp;
    MODEL_TRY(d->ops->wait(d->ctx, tag, layer, out));
    if (d->m->w.layers[layer].gate_shexp.nrows > 0 && !OK(d->m->ws.sh, hp->n_embd))
        return found(d, layer, "shared experts", "blk.%d.ffn_gate/up/down_shexp");
    if (!OK(out, hp->n_embd))
        return found(d, layer, "routed experts", "blk.%d.ffn_gate/up/down_exps");
    d->checked_layer = layer;
    return ECS_OK;
}

/* one slot: the rerun is not cut into micro-batches (n_tok is the step's) */
static const model_experts_ops diag_ops = {diag_submit, diag_wait, 1, NULL};

ecs_err_t model_diagnose_step(model_t *m, const model_step_row_t *rows, int n,
                              const int *out_rows, int n_out, float *logits, ecs_err_t e)
{
    /* a failure with finite activations (a backend's own error) is not ours
     * to explain, and not worth a second run */
    if (e != ECS_OK && model_all_finite(m->ws.x, (size_t)n * (size_t)m->hp.n_embd) &&
        model_all_finite(m->ws.router, (size_t)n * (size_t)m->hp.n_expert))
        return e;
    diag_t d = {m, m->ex_ops, m->ex_ctx, 0, -1, false};
    m->ex_ops = &diag_ops;
    m->ex_ctx = &d;
    ecs_err_t e2 = model_forward(m, rows, n, out_rows, n_out, logits);
    m->ex_ops = d.ops;
    m->ex_ctx = d.ctx;
    if (d.found)
        return e2;
    const size_t res = (size_t)(n_out > 0 ? n_out : n) * (size_t)m->hp.n_embd;
    if (e2 == ECS_OK && !model_all_finite(m->ws.x, res))
        return ecs_error(ECS_ERR_FORMAT,
                         "%s: non-finite residual after layer %d (its sum overflowed): the model "
                         "file is likely damaged", gguf_path(m->file), m->hp.n_layer - 1);
    if (e2 == ECS_OK && logits &&
        !model_all_finite(logits, (size_t)n_out * (size_t)m->hp.n_vocab))
        return ecs_error(ECS_ERR_FORMAT,
                         "%s: non-finite logits from finite activations: output head "
                         "(output_norm, output): the model file is likely damaged",
                         gguf_path(m->file));
    return e != ECS_OK ? e : e2;
}
