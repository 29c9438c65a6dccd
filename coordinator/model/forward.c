/* forward.c - one forward step over up to MODEL_MAX_BATCH rows: embedding,
 * per layer RMSNorm -> attention (MLA or GQA) -> residual -> RMSNorm ->
 * dense FFN or router + experts -> residual, then the output head.
 *
 * Numerics follow llama.cpp's CPU graph: activations are quantized to the
 * weight's vec_dot type inside kcpu_matmul, the KV cache is F16, the query
 * is rounded to F16 before Q.K and the probabilities before P.V (ggml's
 * F16 mul_mat converts its F32 operand), RMSNorm and softmax sum in double.
 *
 * deepseek2 attention runs by default in the latent space (weight
 * absorption): with W_kv_b = per head [W_k (qk_nope x kv_lora) ; W_v],
 * q_nope.(W_k c) = (W_k^T q_nope).c and sum_t p_t W_v c_t = W_v sum_t p_t c_t,
 * so the cache holds only the normalised latent c and the rope'd k_pe per
 * token, and attention is multi-query over rows [c | k_pe]. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "coordinator/model/model_int.h"

static float f16_table[1 << 16];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static void f16_fill(void)
{
    for (uint32_t i = 0; i < (1u << 16); i++)
        f16_table[i] = ecs_fp16_to_f32((ecs_fp16_t)i);
}

void model_f16_init(void) { pthread_once(&f16_once, f16_fill); }

/* ------------------------------------------------------------ small pieces */

/* ggml_rms_norm followed by the weight multiply. y may alias x. */
static void rmsnorm(const float *x, const float *w, float *y, int n, float eps)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++)
        y[i] = (x[i] * scale) * w[i];
}

static void to_f16(const float *x, ecs_fp16_t *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = ecs_f32_to_fp16(x[i]);
}

static void add_into(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

static void mm(model_t *m, const kcpu_mat_t *w, const float *x, int64_t ldx, int nb, float *y,
               int64_t ldy)
{
    kcpu_matmul(m->tp, w, x, ldx, nb, y, ldy, m->ws.act);
}

/* y = silu(a) * b, ggml's SwiGLU (PAR) composition. */
static void swiglu(float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

/* -------------------------------------------------------------- attention */

typedef struct {
    model_t *m;
    const model_step_row_t *rows;
    int n, layer;
    int n_head, group;   /* query heads per cached head */
    const ecs_fp16_t *q; /* [row][head][qh_w] */
    float *out;          /* [row][head][dv] */
} attn_job_t;

static float *thr_f32(model_t *m, int ith) { return m->ws.thr + (size_t)ith * m->ws.thr_stride; }

/* softmax(q.K^T * scale) V for one (row, head) over positions 0..pos. */
static void attend_one(model_t *m, const attn_job_t *a, int i, int h, int ith)
{
    const model_ctx_t *c = a->rows[i].ctx;
    const int pos = a->rows[i].pos, dk = c->dk, dv = c->dv, kvh = h / a->group;
    const ecs_fp16_t *K = c->k + (size_t)a->layer * c->k_layer + (size_t)kvh * dk;
    const ecs_fp16_t *V = c->v + (size_t)a->layer * c->v_layer + (size_t)kvh * dv;
    const ecs_fp16_t *q = a->q + ((size_t)i * a->n_head + h) * m->ws.qh_w;
    float *s = thr_f32(m, ith);
    const float scale = m->hp.kq_scale;
    float mx = -INFINITY;
    for (int t = 0; t <= pos; t++) {
        s[t] = m->dot_f16(dk, K + (size_t)t * c->k_row, q) * scale;
        mx = s[t] > mx ? s[t] : mx;
    }
    double sum = 0.0;
    for (int t = 0; t <= pos; t++) {
        s[t] = expf(s[t] - mx);
        sum += (double)s[t];
    }
    const float inv = (float)(1.0 / sum);
    float *o = a->out + ((size_t)i * a->n_head + h) * dv;
    memset(o, 0, (size_t)dv * sizeof *o);
    for (int t = 0; t <= pos; t++) {
        const float p = f16_table[ecs_f32_to_fp16(s[t] * inv)];
        const ecs_fp16_t *vr = V + (size_t)t * c->v_row;
        for (int d = 0; d < dv; d++)
            o[d] += p * f16_table[vr[d]];
    }
}

static void attn_worker(void *arg, int ith, int nth)
{
    const attn_job_t *a = arg;
    const int jobs = a->n * a->n_head;
    for (int j = ith; j < jobs; j += nth)
        attend_one(a->m, a, j / a->n_head, j % a->n_head, ith);
}

static void attention(model_t *m, const model_step_row_t *rows, int n, int layer, float *out)
{
    const model_ctx_t *c = rows[0].ctx;
    attn_job_t a = {m, rows, n, layer, m->hp.n_head, m->hp.n_head / c->n_kv_head, m->ws.qh, out};
    ecs_threadpool_run(m->tp, attn_worker, &a);
}

static void cache_put(const model_step_row_t *r, int layer, const float *k, const float *v)
{
    model_ctx_t *c = r->ctx;
    to_f16(k, c->k + (size_t)layer * c->k_layer + (size_t)r->pos * c->k_row, (int)c->k_row);
    if (v)
        to_f16(v, c->v + (size_t)layer * c->v_layer + (size_t)r->pos * c->v_row, (int)c->v_row);
}

/* ------------------------------------------------------------ MLA (ds2) */

typedef struct {
    model_t *m;
    const model_layer_t *ly;
    int n;
} mla_job_t;

/* q_abs = W_k^T q_nope per head, written with q_pe as the F16 query row
 * [q_abs | q_pe] of the latent attention. W_k rows are dequantized once per
 * step and applied to every row of the batch. */
static void absorb_worker(void *arg, int ith, int nth)
{
    const mla_job_t *a = arg;
    model_t *m = a->m;
    const model_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, hk = hp->head_k, nope = hp->qk_nope, kvl = hp->kv_lora_rank;
    const int nrot = hp->rope.n_rot;
    const kcpu_mat_t *wb = &a->ly->wkv_b;
    float *row = thr_f32(m, ith) + m->opts.n_ctx;
    for (int h = ith; h < nh; h += nth) {
        for (int i = 0; i < a->n; i++)
            memset(ws->att + ((size_t)i * nh + h) * kvl, 0, (size_t)kvl * sizeof(float));
        for (int d = 0; d < nope; d++) {
            const size_t r = (size_t)h * (nope + hp->head_v) + d;
            ecs_dequantize_row(wb->type, (const char *)wb->data + r * wb->row_bytes, row, kvl);
            for (int i = 0; i < a->n; i++) {
                const float qd = ws->q[(size_t)i * nh * hk + (size_t)h * hk + d];
                float *acc = ws->att + ((size_t)i * nh + h) * kvl;
                for (int j = 0; j < kvl; j++)
                    acc[j] += qd * row[j];
            }
        }
        for (int i = 0; i < a->n; i++) {
            ecs_fp16_t *qh = ws->qh + ((size_t)i * nh + h) * ws->qh_w;
            to_f16(ws->att + ((size_t)i * nh + h) * kvl, qh, kvl);
            to_f16(ws->q + (size_t)i * nh * hk + (size_t)h * hk + nope, qh + kvl, nrot);
        }
    }
}

/* Per head: values = W_v (sum_t p_t c_t), a batched matmul over the rows. */
static void vproj_worker(void *arg, int ith, int nth)
{
    const mla_job_t *a = arg;
    model_t *m = a->m;
    const model_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, nope = hp->qk_nope, hv = hp->head_v, kvl = hp->kv_lora_rank;
    const kcpu_mat_t *wb = &a->ly->wkv_b;
    const size_t act_row = kcpu_act_bytes(wb->type, kvl, 1);
    for (int h = ith; h < nh; h += nth) {
        kcpu_mat_t wv = *wb;
        wv.nrows = hv;
        wv.data = (const char *)wb->data + ((size_t)h * (nope + hv) + nope) * wb->row_bytes;
        void *act = (char *)ws->att_act + (size_t)h * MODEL_MAX_BATCH * act_row;
        kcpu_quantize_rows(NULL, wb->type, ws->att + (size_t)h * kvl, (int64_t)nh * kvl, a->n, kvl,
                           act);
        kcpu_matmul_q(NULL, &wv, act, a->n, ws->attv + (size_t)h * hv, (int64_t)nh * hv);
    }
}

static void mla_query(model_t *m, const model_layer_t *ly, int n)
{
    const model_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int qw = hp->n_head * hp->head_k;
    if (hp->q_lora_rank > 0) {
        const int ql = hp->q_lora_rank;
        mm(m, &ly->wq_a, ws->xn, hp->n_embd, n, ws->qa, ql);
        for (int i = 0; i < n; i++)
            rmsnorm(ws->qa + (size_t)i * ql, ly->q_a_norm, ws->qa + (size_t)i * ql, ql, hp->rms_eps);
        mm(m, &ly->wq_b, ws->qa, ql, n, ws->q, qw);
    } else {
        mm(m, &ly->wq, ws->xn, hp->n_embd, n, ws->q, qw);
    }
}

/* Expanded (llama.cpp) layout: per head K = [W_k c | k_pe], V = W_v c. */
static void mla_expand_put(model_t *m, const model_layer_t *ly, const model_step_row_t *rows,
                           int n, int layer)
{
    const model_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, nope = hp->qk_nope, hv = hp->head_v, hk = hp->head_k;
    const int kvl = hp->kv_lora_rank, nrot = hp->rope.n_rot, kvw = ws->kv_w;
    const int bw = nh * (nope + hv);
    mm(m, &ly->wkv_b, ws->kv, kvw, n, ws->kvb, bw);
    for (int i = 0; i < n; i++) {
        float *K = ws->kvrow, *V = ws->kvrow + (size_t)nh * hk;
        const float *b = ws->kvb + (size_t)i * bw;
        for (int h = 0; h < nh; h++) {
            memcpy(K + (size_t)h * hk, b + (size_t)h * (nope + hv), (size_t)nope * sizeof *K);
            memcpy(K + (size_t)h * hk + nope, ws->kv + (size_t)i * kvw + kvl,
                   (size_t)nrot * sizeof *K);
            memcpy(V + (size_t)h * hv, b + (size_t)h * (nope + hv) + nope, (size_t)hv * sizeof *V);
        }
        cache_put(&rows[i], layer, K, V);
        for (int h = 0; h < nh; h++)
            to_f16(ws->q + (size_t)i * nh * hk + (size_t)h * hk,
                   ws->qh + ((size_t)i * nh + h) * ws->qh_w, hk);
    }
}

static void attn_mla(model_t *m, const model_layer_t *ly, const model_step_row_t *rows, int n,
                     int layer)
{
    const model_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, hk = hp->head_k, nope = hp->qk_nope, kvl = hp->kv_lora_rank;
    const int nrot = hp->rope.n_rot, kvw = ws->kv_w;
    mla_query(m, ly, n);
    mm(m, &ly->wkv_a, ws->xn, hp->n_embd, n, ws->kv, kvw);
    for (int i = 0; i < n; i++) {
        const float *cs = ws->rope + (size_t)i * nrot;
        float *kv = ws->kv + (size_t)i * kvw;
        rmsnorm(kv, ly->kv_a_norm, kv, kvl, hp->rms_eps);
        model_rope_apply(&hp->rope, cs, kv + kvl);
        for (int h = 0; h < nh; h++)
            model_rope_apply(&hp->rope, cs, ws->q + (size_t)i * nh * hk + (size_t)h * hk + nope);
    }
    mla_job_t job = {m, ly, n};
    if (rows[0].ctx->latent) {
        for (int i = 0; i < n; i++)
            cache_put(&rows[i], layer, ws->kv + (size_t)i * kvw, NULL);
        ecs_threadpool_run(m->tp, absorb_worker, &job);
        attention(m, rows, n, layer, ws->att);
        ecs_threadpool_run(m->tp, vproj_worker, &job);
    } else {
        mla_expand_put(m, ly, rows, n, layer);
        attention(m, rows, n, layer, ws->attv);
    }
}

/* ----------------------------------------------------------- GQA (qwen3) */

static void attn_gqa(model_t *m, const model_layer_t *ly, const model_step_row_t *rows, int n,
                     int layer)
{
    const model_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, nkv = hp->n_head_kv, D = hp->head_k;
    mm(m, &ly->wq, ws->xn, hp->n_embd, n, ws->q, nh * D);
    mm(m, &ly->wk, ws->xn, hp->n_embd, n, ws->kv, nkv * D);
    mm(m, &ly->wv, ws->xn, hp->n_embd, n, ws->v, nkv * D);
    for (int i = 0; i < n; i++) {
        const float *cs = ws->rope + (size_t)i * hp->rope.n_rot;
        for (int h = 0; h < nh; h++) {
            float *q = ws->q + ((size_t)i * nh + h) * D;
            rmsnorm(q, ly->q_norm, q, D, hp->rms_eps);
            model_rope_apply(&hp->rope, cs, q);
            to_f16(q, ws->qh + ((size_t)i * nh + h) * ws->qh_w, D);
        }
        for (int h = 0; h < nkv; h++) {
            float *k = ws->kv + ((size_t)i * nkv + h) * D;
            rmsnorm(k, ly->k_norm, k, D, hp->rms_eps);
            model_rope_apply(&hp->rope, cs, k);
        }
        cache_put(&rows[i], layer, ws->kv + (size_t)i * nkv * D, ws->v + (size_t)i * nkv * D);
    }
    attention(m, rows, n, layer, ws->attv);
}

/* -------------------------------------------------------------------- FFN */

static void ffn_swiglu(model_t *m, const kcpu_mat_t *gate, const kcpu_mat_t *up,
                       const kcpu_mat_t *down, const float *x, int n, float *out)
{
    model_ws_t *ws = &m->ws;
    const int E = m->hp.n_embd, F = (int)gate->nrows;
    mm(m, gate, x, E, n, ws->ffa, F);
    mm(m, up, x, E, n, ws->ffb, F);
    swiglu(ws->ffa, ws->ffb, (size_t)n * F);
    mm(m, down, ws->ffa, F, n, out, E);
}

static ecs_err_t ffn_moe(model_t *m, const model_layer_t *ly, int n, int layer)
{
    const model_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int E = hp->n_embd, X = hp->n_expert, k = hp->n_expert_used;
    mm(m, &ly->gate_inp, ws->xn, E, n, ws->router, X);
    for (int i = 0; i < n; i++)
        model_route(hp, ws->router + (size_t)i * X, ly->exp_probs_b, ws->ids + (size_t)i * k,
                    ws->w + (size_t)i * k, ws->route_scratch);
    ecs_err_t e = m->ex_ops->submit(m->ex_ctx, layer, n, ws->xn, k, ws->ids, ws->w);
    if (e != ECS_OK)
        return e;
    const bool shared = ly->gate_shexp.nrows > 0;
    if (shared)
        ffn_swiglu(m, &ly->gate_shexp, &ly->up_shexp, &ly->down_shexp, ws->xn, n, ws->sh);
    e = m->ex_ops->wait(m->ex_ctx, layer, ws->moe);
    if (e != ECS_OK)
        return e;
    const size_t tot = (size_t)n * E;
    if (shared)
        add_into(ws->moe, ws->sh, tot);
    add_into(ws->x, ws->moe, tot);
    return ECS_OK;
}

/* ---------------------------------------------------------------- driver */

static ecs_err_t layer_forward(model_t *m, const model_step_row_t *rows, int n, int il)
{
    const model_hparams_t *hp = &m->hp;
    const model_layer_t *ly = &m->w.layers[il];
    model_ws_t *ws = &m->ws;
    const int E = hp->n_embd;
    const size_t tot = (size_t)n * E;
    for (int i = 0; i < n; i++)
        rmsnorm(ws->x + (size_t)i * E, ly->attn_norm, ws->xn + (size_t)i * E, E, hp->rms_eps);
    if (hp->arch == MODEL_ARCH_DEEPSEEK2)
        attn_mla(m, ly, rows, n, il);
    else
        attn_gqa(m, ly, rows, n, il);
    mm(m, &ly->wo, ws->attv, (int64_t)hp->n_head * hp->head_v, n, ws->tmp, E);
    add_into(ws->x, ws->tmp, tot);

    for (int i = 0; i < n; i++)
        rmsnorm(ws->x + (size_t)i * E, ly->ffn_norm, ws->xn + (size_t)i * E, E, hp->rms_eps);
    if (ly->moe)
        return ffn_moe(m, ly, n, il);
    ffn_swiglu(m, &ly->ffn_gate, &ly->ffn_up, &ly->ffn_down, ws->xn, n, ws->tmp);
    add_into(ws->x, ws->tmp, tot);
    return ECS_OK;
}

ecs_err_t model_forward(model_t *m, const model_step_row_t *rows, int n, const int *out_rows,
                        int n_out, float *logits)
{
    const model_hparams_t *hp = &m->hp;
    const model_weights_t *w = &m->w;
    model_ws_t *ws = &m->ws;
    const int E = hp->n_embd;
    for (int i = 0; i < n; i++) {
        const char *er = (const char *)w->token_embd.data + (size_t)rows[i].token * w->token_embd.row_bytes;
        ecs_dequantize_row(w->token_embd.type, er, ws->x + (size_t)i * E, E);
        model_rope_cache(&hp->rope, rows[i].pos, ws->rope + (size_t)i * hp->rope.n_rot);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        ecs_err_t e = layer_forward(m, rows, n, il);
        if (e != ECS_OK)
            return e;
    }
    if (n_out == 0)
        return ECS_OK;
    for (int j = 0; j < n_out; j++)
        rmsnorm(ws->x + (size_t)out_rows[j] * E, w->output_norm, ws->xn + (size_t)j * E, E,
                hp->rms_eps);
    mm(m, &w->output, ws->xn, E, n_out, logits, hp->n_vocab);
    return ECS_OK;
}
