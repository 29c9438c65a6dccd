/* forward.c - one forward step over up to MODEL_MAX_BATCH rows: embedding,
 * per layer RMSNorm -> attention (MLA or GQA) -> residual -> RMSNorm ->
 * dense FFN or router + experts -> residual, then the output head.
 *
 * Numerics follow llama.cpp's CPU graph: activations are quantized to the
 * weight's vec_dot type inside the products, the KV cache is F16 (attn.c
 * rounds the query and the probabilities as ggml does), RMSNorm and softmax
 * sum in double, the routed experts' outputs are weighted and summed in slot
 * order.
 *
 * Scheduling: every matrix product runs in a parallel region (par.c);
 * products that share an input share one region and one quantization of it
 * (wq + wkv_a; router + shared gate/up; all routed experts' gate/up, then
 * all downs with the shared down), and gate/up regions apply SwiGLU (and
 * quantize for the down projection) chunk by chunk. A step of up to
 * MODEL_MAX_BATCH rows reads each weight once per region: a 512-token
 * prompt gives each of 64 experts ~48 rows per product.
 *
 * deepseek2 attention runs by default over a latent cache (weight absorption
 * for decode, see attn.c; prompt steps expand the latent rows, attn_exp.c);
 * MODEL_CTX_MLA_EXPANDED caches per-head K and V as llama.cpp does. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "coordinator/model/model_int.h"

/* Per-row work (norms, rope, routing) goes to the pool from this many rows. */
#define ROWS_PAR 32
#define ROWS_PER_ITEM 8

/* ------------------------------------------------------------ small pieces */

/* Squares summed in double in NORM_LANES interleaved chains, added in lane
 * order at the end: a fixed order (so any batch gives the same bits) that
 * the compiler vectorises, where one chain in element order (ggml's) is a
 * serial dependency of double adds (~1 % of a prompt step). */
#define NORM_LANES 16

static double sum_squares(const float *x, int n)
{
    double lane[NORM_LANES] = {0};
    int i = 0;
    for (; i + NORM_LANES <= n; i += NORM_LANES)
        for (int c = 0; c < NORM_LANES; c++)
            lane[c] += (double)(x[i + c] * x[i + c]);
    for (int c = 0; i < n; i++, c++)
        lane[c] += (double)(x[i] * x[i]);
    double sum = 0.0;
    for (int c = 0; c < NORM_LANES; c++)
        sum += lane[c];
    return sum;
}

/* ggml_rms_norm followed by the weight multiply. y may alias x. */
static void rmsnorm(const float *x, const float *w, float *y, int n, float eps)
{
    const double sum = sum_squares(x, n);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++)
        y[i] = (x[i] * scale) * w[i];
}

/* Values per block of the elementwise loops: a fixed trip count lets the
 * compiler vectorize them at -O2 (decode runs them on one thread while
 * the other waits). */
#define ADD_BLOCK 16

/* x += y, or x += y + z (y + z rounded first, as llama.cpp adds the
 * shared experts to the routed sum before the residual) when z is set. */
static void add_into(float *restrict x, const float *restrict y, const float *restrict z,
                     size_t n)
{
    size_t i = 0;
    if (z)
        for (; i + ADD_BLOCK <= n; i += ADD_BLOCK)
            for (int c = 0; c < ADD_BLOCK; c++)
                x[i + c] += y[i + c] + z[i + c];
    else
        for (; i + ADD_BLOCK <= n; i += ADD_BLOCK)
            for (int c = 0; c < ADD_BLOCK; c++)
                x[i + c] += y[i + c];
    for (; i < n; i++)
        x[i] += z ? y[i] + z[i] : y[i];
}

/* fn(ctx, row) for every row, on the pool for big steps. */
typedef void (*row_fn)(model_t *m, void *ctx, int row);

typedef struct {
    model_t *m;
    row_fn fn;
    void *ctx;
    int n;
} rows_job_t;

static void rows_item(void *arg, int item, int ith)
{
    const rows_job_t *j = arg;
    (void)ith;
    const int r1 = (item + 1) * ROWS_PER_ITEM < j->n ? (item + 1) * ROWS_PER_ITEM : j->n;
    for (int r = item * ROWS_PER_ITEM; r < r1; r++)
        j->fn(j->m, j->ctx, r);
}

static void for_rows(model_t *m, int n, row_fn fn, void *ctx)
{
    if (n < ROWS_PAR) {
        for (int r = 0; r < n; r++)
            fn(m, ctx, r);
        return;
    }
    rows_job_t j = {m, fn, ctx, n};
    kcpu_par_for(m->tp, (n + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM, rows_item, &j);
}

typedef struct {
    const float *w; /* norm weights */
    const float *x;
    float *y;
    int ldx, ldy, n; /* row strides, values per row */
} norm_job_t;

static void norm_row(model_t *m, void *ctx, int r)
{
    const norm_job_t *j = ctx;
    rmsnorm(j->x + (size_t)r * j->ldx, j->w, j->y + (size_t)r * j->ldy, j->n, m->hp.rms_eps);
}

static void norm_rows(model_t *m, const float *w, const float *x, int ldx, float *y, int ldy,
                      int len, int n)
{
    norm_job_t j = {w, x, y, ldx, ldy, len};
    for_rows(m, n, norm_row, &j);
}

static bool same_vdt(const kcpu_mat_t *a, const kcpu_mat_t *b)
{
    return ecs_type_traits(a->type)->vec_dot_type == ecs_type_traits(b->type)->vec_dot_type;
}

/* y = w x as one region. */
static void mm(model_t *m, const kcpu_mat_t *w, const float *x, int64_t ldx, int nb, float *y,
               int64_t ldy)
{
    kcpu_job_t j = kcpu_job_mm(w, model_act(m->tp, w, x, ldx, nb, m->ws.act), nb, y, ldy);
    kcpu_run_jobs(m->tp, &m->ws.plan, &j, 1);
}

/* y1 = w1 x and y2 = w2 x: one region and one quantization when the two
 * take the same activation type (they do in every quant mix we know). */
static void mm_pair(model_t *m, const kcpu_mat_t *w1, float *y1, int64_t ld1, const kcpu_mat_t *w2,
                    float *y2, int64_t ld2, const float *x, int64_t ldx, int nb)
{
    if (!same_vdt(w1, w2)) {
        mm(m, w1, x, ldx, nb, y1, ld1);
        mm(m, w2, x, ldx, nb, y2, ld2);
        return;
    }
    const void *act = model_act(m->tp, w1, x, ldx, nb, m->ws.act);
    kcpu_job_t j[2] = {kcpu_job_mm(w1, act, nb, y1, ld1), kcpu_job_mm(w2, act, nb, y2, ld2)};
    kcpu_run_jobs(m->tp, &m->ws.plan, j, 2);
}

/* ------------------------------------------------------------------- FFN */

/* A gate/up region job for a SwiGLU FFN into ffa / ffb / ffq. */
static kcpu_job_t swiglu_job(model_t *m, const kcpu_mat_t *gate, const kcpu_mat_t *up,
                            const kcpu_mat_t *down, const void *act, const void *act_up, int nb)
{
    model_ws_t *ws = &m->ws;
    return kcpu_job_swiglu(gate, up, down, act, act_up, nb, ws->ffa, ws->ffb, gate->nrows, ws->ffq);
}

/* Activations of the up projection: act itself when gate's serve, else
 * x quantized again into the second half of ws->act. */
static const void *up_act(model_t *m, const kcpu_mat_t *gate, const kcpu_mat_t *up,
                          const void *act, const float *x, int nb)
{
    if (same_vdt(gate, up))
        return act;
    char *buf = (char *)m->ws.act + kcpu_act_row(gate->type, gate->ncols) * MODEL_MAX_BATCH;
    return model_act(m->tp, up, x, m->hp.n_embd, nb, buf);
}

/* The down projection's input: ffq when the gate/up region quantized it. */
static const void *down_act(model_t *m, const kcpu_job_t *gu, const kcpu_mat_t *down, int nb)
{
    if (gu->hq)
        return gu->hq;
    return model_act(m->tp, down, m->ws.ffa, down->ncols, nb, m->ws.ffq);
}

/* out = down(silu(gate x) * up x) for n rows, in passes that fit ffa. */
static void ffn_swiglu(model_t *m, const kcpu_mat_t *gate, const kcpu_mat_t *up,
                       const kcpu_mat_t *down, const float *x, int n, float *out)
{
    model_ws_t *ws = &m->ws;
    const int E = m->hp.n_embd;
    const int per = (int)(ws->ff_cap / (size_t)gate->nrows);
    for (int r0 = 0; r0 < n; r0 += per) {
        const int nb = n - r0 < per ? n - r0 : per;
        const float *xr = x + (size_t)r0 * E;
        const void *act = model_act(m->tp, gate, xr, E, nb, ws->act);
        kcpu_job_t gu = swiglu_job(m, gate, up, down, act, up_act(m, gate, up, act, xr, nb), nb);
        kcpu_run_jobs(m->tp, &ws->plan, &gu, 1);
        kcpu_job_t d = kcpu_job_mm(down, down_act(m, &gu, down, nb), nb, out + (size_t)r0 * E, E);
        kcpu_run_jobs(m->tp, &ws->plan, &d, 1);
    }
}

typedef struct {
    const model_layer_t *ly;
} route_job_t;

static void route_row(model_t *m, void *ctx, int r)
{
    const route_job_t *j = ctx;
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int k = hp->n_expert_used;
    const size_t X = (size_t)hp->n_expert;
    model_route(hp, ws->router + r * X, j->ly->exp_probs_b, ws->ids + (size_t)r * k,
                ws->w + (size_t)r * k, ws->route_scratch + r * 3 * X);
}

typedef struct {
    float *x;
    const float *moe, *sh;
    int E;
} resid_job_t;

/* x += moe + shared, summed in llama.cpp's order. */
static void resid_row(model_t *m, void *ctx, int r)
{
    const resid_job_t *j = ctx;
    (void)m;
    const size_t o = (size_t)r * j->E;
    add_into(j->x + o, j->moe + o, j->sh ? j->sh + o : NULL, (size_t)j->E);
}

/* Routed experts through the built-in backend, fused with the shared
 * experts: gate/up of all of them in one region, then all downs. */
static ecs_err_t moe_local(model_t *m, const model_layer_t *ly, int n, int layer, bool shared,
                           prof_mark_t *pm)
{
    model_ws_t *ws = &m->ws;
    model_experts_local_t *l = m->ex_ctx;
    const int k = m->hp.n_expert_used;
    MODEL_TRY(model_experts_local_prepare(l, layer, n, ws->xn, k, ws->ids));
    kcpu_jobs_t jobs = {ws->jobs, 0};
    kcpu_job_t gu = {0};
    if (shared) {
        const void *act = model_act(m->tp, &ly->gate_shexp, ws->xn, m->hp.n_embd, n, ws->act);
        gu = swiglu_job(m, &ly->gate_shexp, &ly->up_shexp, &ly->down_shexp, act,
                        up_act(m, &ly->gate_shexp, &ly->up_shexp, act, ws->xn, n), n);
        jobs.jobs[jobs.n++] = gu;
    }
    kmoe_gate_up(l->moe, &jobs);
    kcpu_run_jobs(m->tp, &ws->plan, jobs.jobs, jobs.n);
    prof_end(m, MODEL_PH_FFN_UP, pm);
    jobs.n = 0;
    if (shared)
        jobs.jobs[jobs.n++] = kcpu_job_mm(&ly->down_shexp, down_act(m, &gu, &ly->down_shexp, n), n,
                                     ws->sh, m->hp.n_embd);
    kmoe_down(l->moe, &jobs);
    kcpu_run_jobs(m->tp, &ws->plan, jobs.jobs, jobs.n);
    prof_end(m, MODEL_PH_FFN_DOWN, pm);
    model_experts_local_finish(l, ws->w, ws->moe);
    return ECS_OK;
}

/* The MoE FFN up to the routed experts' submit (tag: the micro-batch's
 * backend slot): router, then the local experts fused with the shared
 * ones, or a backend's submit with the shared experts while it computes.
 * ffn_moe_finish waits for them and adds the residual. */
static ecs_err_t ffn_moe_start(model_t *m, const model_layer_t *ly, int n, int layer, int tag,
                               prof_mark_t *pm)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int E = hp->n_embd, X = hp->n_expert;
    const bool shared = ly->gate_shexp.nrows > 0;
    mm(m, &ly->gate_inp, ws->xn, E, n, ws->router, X);
    route_job_t rj = {ly};
    for_rows(m, n, route_row, &rj);
    prof_end(m, MODEL_PH_ROUTER, pm);
    if (m->ex_ops == &model_experts_local_ops)
        return moe_local(m, ly, n, layer, shared, pm);
    const int k = hp->n_expert_used;
    MODEL_TRY(m->ex_ops->submit(m->ex_ctx, tag, layer, n, ws->xn, k, ws->ids, ws->w));
    if (shared && !(m->ex_ops->took_shared && m->ex_ops->took_shared(m->ex_ctx, tag, ws->sh)))
        ffn_swiglu(m, &ly->gate_shexp, &ly->up_shexp, &ly->down_shexp, ws->xn, n, ws->sh);
    prof_end(m, MODEL_PH_FFN_DOWN, pm);
    return ECS_OK;
}

void model_shared_ffn(model_t *m, int layer, int n, const float *x, float *out)
{
    const model_layer_t *ly = &m->w.layers[layer];
    if (ly->gate_shexp.nrows > 0)
        ffn_swiglu(m, &ly->gate_shexp, &ly->up_shexp, &ly->down_shexp, x, n, out);
}

static ecs_err_t ffn_moe_finish(model_t *m, const model_layer_t *ly, int n, int layer, int tag)
{
    model_ws_t *ws = &m->ws;
    const bool shared = ly->gate_shexp.nrows > 0;
    prof_mark_t pm;
    prof_start(m, &pm);
    if (m->ex_ops != &model_experts_local_ops) {
        MODEL_TRY(m->ex_ops->wait(m->ex_ctx, tag, layer, ws->moe));
        prof_end(m, MODEL_PH_FFN_DOWN, &pm);
    }
    resid_job_t r = {ws->x, ws->moe, shared ? ws->sh : NULL, m->hp.n_embd};
    for_rows(m, n, resid_row, &r);
    prof_end(m, MODEL_PH_MOE_SUM, &pm);
    return ECS_OK;
}

/* ------------------------------------------------------------ attention */

typedef struct {
    const model_layer_t *ly;
    const model_step_row_t *rows;
    int layer;
    bool kv_only; /* the rows' K/V for the cache, no queries */
} rope_job_t;

/* ds2: normalise the latent, rotate k_pe and every head's q_pe; store the
 * latent row when the cache is latent. */
static void mla_row(model_t *m, void *ctx, int i)
{
    const rope_job_t *j = ctx;
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, hk = hp->head_k, kvl = hp->kv_lora_rank, nrot = hp->rope.n_rot;
    const float *cs = ws->rope + (size_t)i * nrot;
    float *kv = ws->kv + (size_t)i * ws->kv_w;
    rmsnorm(kv, j->ly->kv_a_norm, kv, kvl, hp->rms_eps);
    model_rope_apply(&hp->rope, cs, kv + kvl);
    for (int h = 0; h < nh && !j->kv_only; h++)
        model_rope_apply(&hp->rope, cs, ws->q + (size_t)i * nh * hk + (size_t)h * hk + hp->qk_nope);
    if (j->rows[i].ctx->latent)
        model_cache_put(&j->rows[i], j->layer, kv, NULL);
}

/* Expanded (llama.cpp) layout: per head K = [W_k c | k_pe], V = W_v c. */
static void expand_row(model_t *m, void *ctx, int i)
{
    const rope_job_t *j = ctx;
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, nope = hp->qk_nope, hv = hp->head_v, hk = hp->head_k;
    const int kvl = hp->kv_lora_rank, nrot = hp->rope.n_rot, bw = nh * (nope + hv);
    float *K = ws->kvrow, *V = ws->kvrow + (size_t)nh * hk;
    const float *b = ws->kvb + (size_t)i * bw;
    for (int h = 0; h < nh; h++) {
        memcpy(K + (size_t)h * hk, b + (size_t)h * (nope + hv), (size_t)nope * sizeof *K);
        memcpy(K + (size_t)h * hk + nope, ws->kv + (size_t)i * ws->kv_w + kvl,
               (size_t)nrot * sizeof *K);
        memcpy(V + (size_t)h * hv, b + (size_t)h * (nope + hv) + nope, (size_t)hv * sizeof *V);
    }
    model_cache_put(&j->rows[i], j->layer, K, V);
}

static void attn_mla(model_t *m, const model_layer_t *ly, const model_step_row_t *rows, int n,
                     int layer, bool kv_only, prof_mark_t *pm)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int qw = hp->n_head * hp->head_k, E = hp->n_embd;
    if (kv_only) {
        mm(m, &ly->wkv_a, ws->xn, E, n, ws->kv, ws->kv_w);
    } else if (hp->q_lora_rank > 0) {
        const int ql = hp->q_lora_rank;
        mm_pair(m, &ly->wq_a, ws->qa, ql, &ly->wkv_a, ws->kv, ws->kv_w, ws->xn, E, n);
        norm_rows(m, ly->q_a_norm, ws->qa, ql, ws->qa, ql, ql, n);
        mm(m, &ly->wq_b, ws->qa, ql, n, ws->q, qw);
    } else {
        mm_pair(m, &ly->wq, ws->q, qw, &ly->wkv_a, ws->kv, ws->kv_w, ws->xn, E, n);
    }
    rope_job_t rj = {ly, rows, layer, kv_only};
    for_rows(m, n, mla_row, &rj);
    if (!rows[0].ctx->latent) {
        const int64_t bw = (int64_t)hp->n_head * (hp->qk_nope + hp->head_v);
        mm(m, &ly->wkv_b, ws->kv, ws->kv_w, n, ws->kvb, bw);
        for (int i = 0; i < n; i++) /* one shared row buffer: serial */
            expand_row(m, &rj, i);
    }
    prof_end(m, MODEL_PH_ATTN_IN, pm);
    if (kv_only)
        return;
    model_attention(m, ly, &m->ext[layer], rows, n, layer);
    prof_end(m, MODEL_PH_ATTN_CORE, pm);
}

static void gqa_row(model_t *m, void *ctx, int i)
{
    const rope_job_t *j = ctx;
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, nkv = hp->n_head_kv, D = hp->head_k;
    const float *cs = ws->rope + (size_t)i * hp->rope.n_rot;
    for (int h = 0; h < nh && !j->kv_only; h++) {
        float *q = ws->q + ((size_t)i * nh + h) * D;
        rmsnorm(q, j->ly->q_norm, q, D, hp->rms_eps);
        model_rope_apply(&hp->rope, cs, q);
    }
    for (int h = 0; h < nkv; h++) {
        float *k = ws->kv + ((size_t)i * nkv + h) * D;
        rmsnorm(k, j->ly->k_norm, k, D, hp->rms_eps);
        model_rope_apply(&hp->rope, cs, k);
    }
    const size_t o = (size_t)i * nkv * D;
    model_cache_put(&j->rows[i], j->layer, ws->kv + o, ws->v + o);
}

static void attn_gqa(model_t *m, const model_layer_t *ly, const model_step_row_t *rows, int n,
                     int layer, bool kv_only, prof_mark_t *pm)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, nkv = hp->n_head_kv, D = hp->head_k, E = hp->n_embd;
    if (kv_only) {
        mm_pair(m, &ly->wk, ws->kv, nkv * D, &ly->wv, ws->v, nkv * D, ws->xn, E, n);
    } else if (same_vdt(&ly->wq, &ly->wk) && same_vdt(&ly->wq, &ly->wv)) {
        const void *act = model_act(m->tp, &ly->wq, ws->xn, E, n, ws->act);
        kcpu_job_t j[3] = {kcpu_job_mm(&ly->wq, act, n, ws->q, nh * D),
                          kcpu_job_mm(&ly->wk, act, n, ws->kv, nkv * D),
                          kcpu_job_mm(&ly->wv, act, n, ws->v, nkv * D)};
        kcpu_run_jobs(m->tp, &ws->plan, j, 3);
    } else {
        mm(m, &ly->wq, ws->xn, E, n, ws->q, nh * D);
        mm_pair(m, &ly->wk, ws->kv, nkv * D, &ly->wv, ws->v, nkv * D, ws->xn, E, n);
    }
    rope_job_t rj = {ly, rows, layer, kv_only};
    for_rows(m, n, gqa_row, &rj);
    prof_end(m, MODEL_PH_ATTN_IN, pm);
    if (kv_only)
        return;
    model_attention(m, ly, NULL, rows, n, layer);
    prof_end(m, MODEL_PH_ATTN_CORE, pm);
}

/* ---------------------------------------------------------------- driver */

typedef struct {
    float *x;
    const float *y;
    int E;
} add_job_t;

static void add_row(model_t *m, void *ctx, int r)
{
    const add_job_t *j = ctx;
    (void)m;
    add_into(j->x + (size_t)r * j->E, j->y + (size_t)r * j->E, NULL, (size_t)j->E);
}

/* The halves of a layer layer_start runs: the attention (with its
 * residual add), the FFN, or both (a layer sliced in two runs each alone,
 * model_eval_slice). */
enum { HALF_ATTN = 1, HALF_FFN = 2, HALF_BOTH = 3 };

/* Layer il for n rows up to its routed experts' submit (*out: a submit
 * of tag is outstanding; layer_finish waits for it); kv_only: only as far
 * as the rows' K/V in the cache. */
static ecs_err_t layer_start(model_t *m, const model_step_row_t *rows, int n, int il, int tag,
                             bool kv_only, int halves, bool *out)
{
    const arch_hparams_t *hp = &m->hp;
    const model_layer_t *ly = &m->w.layers[il];
    model_ws_t *ws = &m->ws;
    const int E = hp->n_embd;
    add_job_t aj = {ws->x, ws->tmp, E};
    prof_mark_t pm;
    prof_start(m, &pm);
    if (halves & HALF_ATTN) {
        norm_rows(m, ly->attn_norm, ws->x, E, ws->xn, E, E, n);
        prof_end(m, MODEL_PH_NORM, &pm);
        if (hp->arch == ARCH_DEEPSEEK2)
            attn_mla(m, ly, rows, n, il, kv_only, &pm);
        else
            attn_gqa(m, ly, rows, n, il, kv_only, &pm);
        if (kv_only)
            return ECS_OK;
        mm(m, &ly->wo, ws->attv, (int64_t)hp->n_head * hp->head_v, n, ws->tmp, E);
        for_rows(m, n, add_row, &aj);
        prof_end(m, MODEL_PH_ATTN_OUT, &pm);
    }
    if (!(halves & HALF_FFN))
        return ECS_OK;
    norm_rows(m, ly->ffn_norm, ws->x, E, ws->xn, E, E, n);
    prof_end(m, MODEL_PH_NORM, &pm);
    if (ly->moe) {
        MODEL_TRY(ffn_moe_start(m, ly, n, il, tag, &pm));
        *out = m->ex_ops != &model_experts_local_ops;
        return ECS_OK;
    }
    ffn_swiglu(m, &ly->ffn_gate, &ly->ffn_up, &ly->ffn_down, ws->xn, n, ws->tmp);
    for_rows(m, n, add_row, &aj);
    prof_end(m, MODEL_PH_DENSE, &pm);
    return ECS_OK;
}

/* The rest of layer il (the routed experts' wait and residual add of a
 * MoE layer); out: its submit was outstanding. Below the last layer, every
 * row is checked once: a NaN in a row that wants no logits would otherwise
 * reach the cache and show up steps later; the caller's diagnosis
 * (finite.c) names where it started. */
static ecs_err_t layer_finish(model_t *m, int n, int il, int tag, bool *out)
{
    if (m->w.layers[il].moe) {
        *out = false;
        MODEL_TRY(ffn_moe_finish(m, &m->w.layers[il], n, il, tag));
    }
    if (il < m->hp.n_layer - 1 &&
        !model_all_finite(m->ws.x, (size_t)n * (size_t)m->hp.n_embd))
        return ecs_error(ECS_ERR_FORMAT, "model: non-finite activations after layer %d", il);
    return ECS_OK;
}

static ecs_err_t layer_forward(model_t *m, const model_step_row_t *rows, int n, int il,
                               bool kv_only, int halves)
{
    bool out = false;
    MODEL_TRY(layer_start(m, rows, n, il, 0, kv_only, halves, &out));
    return kv_only || !(halves & HALF_FFN) ? ECS_OK : layer_finish(m, n, il, 0, &out);
}

typedef struct {
    const model_step_row_t *rows;
} embd_job_t;

static void embd_row(model_t *m, void *ctx, int i)
{
    const embd_job_t *j = ctx;
    const kcpu_mat_t *te = &m->w.token_embd;
    const int E = m->hp.n_embd;
    ecs_dequantize_row(te->type, (const char *)te->data + (size_t)j->rows[i].token * te->row_bytes,
                       m->ws.x + (size_t)i * E, E);
    model_rope_cache(&m->hp.rope, j->rows[i].pos, m->ws.rope + (size_t)i * m->hp.rope.n_rot);
}

/* The rows out_rows (ascending) of the step moved to the front: their
 * residual stream and rope rows in the workspace, their step rows in kept. */
static const model_step_row_t *keep_rows(model_t *m, const model_step_row_t *rows,
                                         const int *out_rows, int n_out, model_step_row_t *kept)
{
    model_ws_t *ws = &m->ws;
    const size_t E = (size_t)m->hp.n_embd, R = (size_t)m->hp.rope.n_rot;
    for (int j = 0; j < n_out; j++) {
        const size_t r = (size_t)out_rows[j];
        kept[j] = rows[r];
        memmove(ws->x + j * E, ws->x + r * E, E * sizeof *ws->x);
        memmove(ws->rope + j * R, ws->rope + r * R, R * sizeof *ws->rope);
    }
    return kept;
}

/* ------------------------------------------------------- micro-batches */

typedef struct {
    int r0, n; /* the step's rows [r0, r0 + n) */
    bool out;  /* a submit of this micro-batch's tag is outstanding */
    int layer; /* the layer of its last start */
} micro_t;

/* Cuts the step into up to m->n_micro micro-batches (as many as the
 * backend has slots) of about equal rows: each cut at the sequence
 * boundary nearest its even share, within half a share, else at the share
 * itself inside a sequence (its earlier rows are then in the earlier
 * micro-batch, which stores their K/V first in every layer; the attention
 * form stays the whole step's, model_step_row_t.seq_rows). */
static int split_micro(const model_t *m, const model_step_row_t *rows, int n, micro_t *mb)
{
    int want = m->n_micro < m->ex_ops->slots ? m->n_micro : m->ex_ops->slots;
    want = want < n ? want : n;
    int r0 = 0, k = 0;
    for (int b = 1; b < want; b++) {
        const int target = (int)((int64_t)n * b / want), reach = n / (2 * want);
        int cut = target;
        for (int d = 0; d <= reach; d++) {
            if (target - d > r0 && rows[target - d - 1].ctx != rows[target - d].ctx) {
                cut = target - d;
                break;
            }
            if (target + d < n && rows[target + d - 1].ctx != rows[target + d].ctx) {
                cut = target + d;
                break;
            }
        }
        if (cut <= r0 || cut >= n)
            continue;
        mb[k++] = (micro_t){r0, cut - r0, false, 0};
        r0 = cut;
    }
    mb[k++] = (micro_t){r0, n - r0, false, 0};
    return k;
}

/* The workspace rows a micro-batch keeps from its layer's start to its
 * finish (residual, FFN input, routing, expert outputs, rope rows) moved
 * to its rows, r0 on of base's; the rest is scratch of one start at a
 * time. r0 0: the step's own. */
static void micro_rows(model_t *m, const model_ws_t *base, int r0)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const size_t r = (size_t)r0, E = (size_t)hp->n_embd, k = (size_t)hp->n_expert_used;
    ws->x = base->x + r * E;
    ws->xn = base->xn + r * E;
    ws->sh = base->sh + r * E;
    ws->moe = base->moe + r * E;
    ws->ids = base->ids + r * k;
    ws->w = base->w + r * k;
    ws->rope = base->rope + r * (size_t)hp->rope.n_rot;
}

/* Layers [l0, l1) for every row, in ping-pong: each micro-batch finishes
 * its previous layer and starts the next one while the submits of the
 * others are out. With one micro-batch this is start, finish, start, ...
 * of the whole step. A failure waits out every submit still outstanding. */
static ecs_err_t layers_micro(model_t *m, const model_step_row_t *rows, int n, int l0, int l1)
{
    micro_t mb[MODEL_MAX_MICRO];
    const int nmb = split_micro(m, rows, n, mb);
    const model_ws_t base = m->ws;
    ecs_err_t e = ECS_OK;
    for (int il = l0; il <= l1 && e == ECS_OK; il++)
        for (int b = 0; b < nmb && e == ECS_OK; b++) {
            micro_rows(m, &base, mb[b].r0);
            if (il > l0)
                e = layer_finish(m, mb[b].n, il - 1, b, &mb[b].out);
            mb[b].layer = il;
            if (e == ECS_OK && il < l1)
                e = layer_start(m, rows + mb[b].r0, mb[b].n, il, b, false, HALF_BOTH, &mb[b].out);
        }
    for (int b = 0; b < nmb; b++)
        if (mb[b].out) { /* the backend's own error is the one that counts */
            char why[512];
            snprintf(why, sizeof why, "%s", ecs_errmsg());
            micro_rows(m, &base, mb[b].r0);
            (void)m->ex_ops->wait(m->ex_ctx, b, mb[b].layer, m->ws.moe);
            ecs_error(e, "%s", why);
        }
    micro_rows(m, &base, 0);
    return e;
}

typedef struct {
    const model_step_row_t *rows;
} rope_rows_job_t;

/* A later slice's rope rows (embd_row makes them with the embedding). */
static void rope_row(model_t *m, void *ctx, int i)
{
    const rope_rows_job_t *j = ctx;
    model_rope_cache(&m->hp.rope, j->rows[i].pos, m->ws.rope + (size_t)i * m->hp.rope.n_rot);
}

int model_slice_units(const model_t *m) { return 2 * m->hp.n_layer - 1; }

/* Units [u0, u1) (model_slice_units: unit 2l is layer l's attention half,
 * 2l + 1 its FFN half, the last layer one unit, as it runs in full only
 * for the rows that want logits). */
ecs_err_t model_forward_layers(model_t *m, const model_step_row_t *rows, int n, int u0, int u1,
                               float *resid, const int *out_rows, int n_out, float *logits)
{
    const arch_hparams_t *hp = &m->hp;
    const model_weights_t *w = &m->w;
    model_ws_t *ws = &m->ws;
    const int E = hp->n_embd, last = hp->n_layer - 1;
    const size_t res = (size_t)n * (size_t)E * sizeof *ws->x;
    prof_mark_t pm;
    prof_start(m, &pm);
    if (u0 == 0) {
        embd_job_t ej = {rows};
        for_rows(m, n, embd_row, &ej);
    } else { /* a later slice: the residual its last slice left */
        memcpy(ws->x, resid, res);
        rope_rows_job_t rj = {rows};
        for_rows(m, n, rope_row, &rj);
    }
    prof_end(m, MODEL_PH_EMBED, &pm);
    int u = u0;
    if (u & 1) { /* the FFN half of a layer whose attention ran last slice */
        MODEL_TRY(layer_forward(m, rows, n, u / 2, false, HALF_FFN));
        u++;
    }
    const bool end = u1 == model_slice_units(m);
    /* whole layers in ping-pong; at the end every layer when every row
     * wants logits (decode), else all but the last, which runs in full only
     * for the rows that want logits; the kept rows store their K/V once
     * more in the full pass: the same values, a few rows' worth of work */
    const int upto = !end ? u1 / 2 : n_out == n ? hp->n_layer : last;
    if (u / 2 < upto)
        MODEL_TRY(layers_micro(m, rows, n, u / 2, upto));
    if (!end) { /* the next slice goes on from here */
        if (u1 & 1)
            MODEL_TRY(layer_forward(m, rows, n, u1 / 2, false, HALF_ATTN));
        memcpy(resid, ws->x, res);
        return ECS_OK;
    }
    if (n_out < n) {
        model_step_row_t kept[MODEL_MAX_BATCH];
        MODEL_TRY(layer_forward(m, rows, n, last, true, HALF_BOTH));
        rows = keep_rows(m, rows, out_rows, n_out, kept);
        n = n_out;
        if (n == 0)
            return ECS_OK;
        MODEL_TRY(layer_forward(m, rows, n, last, false, HALF_BOTH));
    }
    prof_start(m, &pm);
    for (int j = 0; j < n_out; j++)
        rmsnorm(ws->x + (size_t)j * E, w->output_norm, ws->xn + (size_t)j * E, E, hp->rms_eps);
    mm(m, &w->output, ws->xn, E, n_out, logits, hp->n_vocab);
    prof_end(m, MODEL_PH_OUTPUT, &pm);
    return ECS_OK;
}

ecs_err_t model_forward(model_t *m, const model_step_row_t *rows, int n, const int *out_rows,
                        int n_out, float *logits)
{
    return model_forward_layers(m, rows, n, 0, model_slice_units(m), NULL, out_rows, n_out,
                                logits);
}
