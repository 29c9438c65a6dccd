/* attn_exp.c - deepseek2 attention over a latent cache in the expanded form,
 * for prompt steps, and the choice between it and the absorbed form.
 *
 * The latent cache keeps [c | k_pe] per token. The absorbed form (attn.c)
 * scores each query against the 576-wide latent rows and sends every
 * head's latent output through W_v: cheap for a few rows, but for a prompt
 * step about three times the FLOPs of expanding the sequence's cached rows
 * once per step and layer into per-head K = [W_k c | k_pe] and V = W_v c
 * (one int8 product on W_kv_b, as the MODEL_CTX_MLA_EXPANDED path computes
 * per token) and attending over them with dk = qk_nope + n_rot and
 * dv = head_v, as ik_llama.cpp's mla=3 does for prompts.
 *
 * Choice, per sequence of a step: the expanded form when the sequence has
 * at least MODEL_MLA_EXPAND_ROWS rows in the step (expanding costs about
 * as much per cached position as the absorbed form per query row and
 * cached position: it pays from ~70 rows, whatever the depth) and its
 * positions fit the expansion scratch; the absorbed form otherwise, or
 * always for contexts made with MODEL_CTX_MLA_ABSORBED. The expansion of
 * position p is the same product row whatever the step (kcpu_matmul_q is
 * batch-invariant), so a query's result does not depend on how a prompt was
 * cut into steps as long as each had at least MODEL_MLA_EXPAND_ROWS rows,
 * nor on which of the step's rows attend (the last layer's are those that
 * want logits). Sequences expand in turn into the one scratch; the absorbed
 * rows of a mixed step are gathered and attend first.
 *
 * Numerics: those of an expanded cache of the same element type: with an
 * F16 cache K and V are rounded to F16 (c was rounded to F16 in the latent
 * cache first, which the MODEL_CTX_MLA_EXPANDED path does not do); with an
 * F32 cache the expansion is that path's. */
#include <string.h>

#include "coordinator/model/model_int.h"

/* Most bytes of expansion scratch; longer sequences attend absorbed. */
#define EXP_MAX_BYTES ((size_t)128 << 20)
/* Rows per item of the latent load and the K/V store. */
#define EXP_ROWS_PER_ITEM 16

static size_t exp_row_f32(const arch_hparams_t *hp)
{
    return (size_t)hp->n_head * (size_t)(hp->head_k + hp->head_v) * sizeof(float);
}

int model_exp_positions(const arch_hparams_t *hp, int n_ctx)
{
    if (hp->arch != ARCH_DEEPSEEK2 || n_ctx <= 0)
        return 0;
    const size_t cap = EXP_MAX_BYTES / exp_row_f32(hp);
    return (size_t)n_ctx < cap ? n_ctx : (int)cap;
}

/* Positions of c one expansion holds: F16 rows take half an F32 row. */
static int exp_capacity(const model_t *m, const model_ctx_t *c)
{
    return (int)((size_t)m->ws.ex_pos * sizeof(float) / model_kvt_size(model_kvt_expanded(c->kvt)));
}

/* ------------------------------------------------------------ expansion */

typedef struct {
    model_t *m;
    const model_ctx_t *c;
    int layer;
    int t0, nb; /* positions [t0, t0 + nb) */
} block_t;

/* Latent row t of c at layer, [c | k_pe]. */
static const char *latent_row(const block_t *b, int t)
{
    return model_kv_krow(b->c, b->layer, t);
}

/* The block's latent rows as F32 in ws->exc. */
static void load_rows(const block_t *b, int r0, int r1)
{
    const int kvl = b->m->hp.kv_lora_rank;
    for (int r = r0; r < r1; r++) {
        float *dst = b->m->ws.exc + (size_t)r * kvl;
        if (b->c->kvt == MODEL_KV_F32)
            memcpy(dst, latent_row(b, b->t0 + r), (size_t)kvl * sizeof *dst);
        else if (b->c->kvt == MODEL_KV_Q8)
            model_q8_get(dst, latent_row(b, b->t0 + r), 0, kvl, kvl,
                         kvl + b->m->hp.rope.n_rot);
        else
            ecs_dequantize_row(b->c->kvt == MODEL_KV_BF16 ? ECS_TYPE_BF16 : ECS_TYPE_F16,
                               latent_row(b, b->t0 + r), dst, kvl);
    }
}

/* dst (of the cache's type) = src. */
static void put(const model_simd_t *sd, char *dst, const float *src, int n, model_kvt_t kt)
{
    if (kt == MODEL_KV_F16)
        sd->to_f16((ecs_fp16_t *)dst, src, n);
    else if (kt == MODEL_KV_BF16)
        sd->to_bf16((ecs_bf16_t *)dst, src, n);
    else
        memcpy(dst, src, (size_t)n * sizeof *src);
}

/* The block's products (ws->kvb, per head [k_nope | v]) and the cached
 * k_pe into per-head K and V rows of the scratch. */
static void store_rows(const block_t *b, int r0, int r1)
{
    const arch_hparams_t *hp = &b->m->hp;
    const model_ws_t *ws = &b->m->ws;
    const model_simd_t *sd = model_simd();
    const int nh = hp->n_head, nope = hp->qk_nope, hv = hp->head_v, hk = hp->head_k;
    const model_kvt_t kt = model_kvt_expanded(b->c->kvt);
    const size_t elt = model_kvt_size(kt);
    _Alignas(64) char kq[MODEL_Q8_MAXDK * sizeof(ecs_bf16_t)]; /* an 8-bit row's k_pe, expanded */
    for (int r = r0; r < r1; r++) {
        const int t = b->t0 + r;
        const float *e = ws->kvb + (size_t)r * nh * (nope + hv);
        const char *kpe = latent_row(b, t) + (size_t)hp->kv_lora_rank * elt;
        if (b->c->kvt == MODEL_KV_Q8) {
            float f[MODEL_Q8_MAXDK];
            const int kvl = hp->kv_lora_rank;
            model_q8_get(f, latent_row(b, t), kvl, hp->rope.n_rot, kvl, kvl + hp->rope.n_rot);
            put(sd, kq, f, hp->rope.n_rot, kt);
            kpe = kq;
        }
        char *K = (char *)ws->exk + (size_t)t * nh * hk * elt;
        char *V = (char *)ws->exv + (size_t)t * nh * hv * elt;
        for (int h = 0; h < nh; h++) {
            const float *eh = e + (size_t)h * (nope + hv);
            char *kh = K + (size_t)h * hk * elt;
            put(sd, kh, eh, nope, kt);
            memcpy(kh + (size_t)nope * elt, kpe, (size_t)hp->rope.n_rot * elt);
            put(sd, V + (size_t)h * hv * elt, eh + nope, hv, kt);
        }
    }
}

typedef struct {
    const block_t *b;
    void (*fn)(const block_t *b, int r0, int r1);
} rows_run_t;

static void rows_item(void *arg, int item, int ith)
{
    const rows_run_t *r = arg;
    (void)ith;
    const int r0 = item * EXP_ROWS_PER_ITEM;
    r->fn(r->b, r0, r0 + EXP_ROWS_PER_ITEM < r->b->nb ? r0 + EXP_ROWS_PER_ITEM : r->b->nb);
}

static void for_block_rows(const block_t *b, void (*fn)(const block_t *b, int r0, int r1))
{
    if (b->nb <= 2 * EXP_ROWS_PER_ITEM) {
        fn(b, 0, b->nb);
        return;
    }
    rows_run_t r = {b, fn};
    kcpu_par_for(b->m->tp, (b->nb + EXP_ROWS_PER_ITEM - 1) / EXP_ROWS_PER_ITEM, rows_item, &r);
}

/* K and V of positions [from, end) of c at layer into ws->exk / ws->exv,
 * in blocks of MODEL_MAX_BATCH rows through ws->exc, ws->act and ws->kvb:
 * each position's row is the same bits whatever block it is in, so a
 * range expanded in parts equals it expanded at once. */
static void expand(model_t *m, const model_layer_t *ly, const model_ctx_t *c, int layer, int from,
                   int end)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int64_t bw = (int64_t)hp->n_head * (hp->qk_nope + hp->head_v);
    for (int t0 = from; t0 < end; t0 += MODEL_MAX_BATCH) {
        const int nb = end - t0 < MODEL_MAX_BATCH ? end - t0 : MODEL_MAX_BATCH;
        const block_t b = {m, c, layer, t0, nb};
        for_block_rows(&b, load_rows);
        const void *act = model_act(m->tp, &ly->wkv_b, ws->exc, hp->kv_lora_rank, b.nb, ws->act);
        const kcpu_job_t j = kcpu_job_mm(&ly->wkv_b, act, b.nb, ws->kvb, bw);
        kcpu_run_jobs(m->tp, &ws->plan, &j, 1);
        for_block_rows(&b, store_rows);
    }
}

/* ------------------------------------------------------------ selection */

/* The end of c's rows in the step (last position + 1). */
static int seq_end(const model_step_row_t *rows, int n, const model_ctx_t *c)
{
    int end = 0;
    for (int i = 0; i < n; i++)
        if (rows[i].ctx == c && rows[i].pos + 1 > end)
            end = rows[i].pos + 1;
    return end;
}

/* By the sequence's rows in the whole step (seq_rows; the step's rows
 * take positions n_past ..), not in rows: the last layer attends for the
 * rows that want logits only, in the same form. */
static bool use_expanded(const model_t *m, const model_step_row_t *r)
{
    const model_ctx_t *c = r->ctx;
    if (c->flags & MODEL_CTX_MLA_ABSORBED)
        return false;
    return r->seq_rows >= MODEL_MLA_EXPAND_ROWS && c->n_past + r->seq_rows <= exp_capacity(m, c);
}

/* First row of rows[i]'s sequence. */
static int first_row(const model_step_row_t *rows, int i)
{
    int j = 0;
    while (rows[j].ctx != rows[i].ctx)
        j++;
    return j;
}

/* The rows not marked expanded, gathered, through the absorbed form. */
static void absorbed_subset(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                            const model_step_row_t *rows, int n, int layer, const bool *expd)
{
    model_ws_t *ws = &m->ws;
    const size_t qw = (size_t)m->hp.n_head * m->hp.head_k, vw = (size_t)m->hp.n_head * m->hp.head_v;
    model_step_row_t sub[MODEL_MAX_BATCH] = {{0}};
    int idx[MODEL_MAX_BATCH], k = 0;
    for (int i = 0; i < n; i++) {
        if (expd[i])
            continue;
        sub[k] = rows[i];
        idx[k] = i;
        memcpy(ws->qsub + k * qw, ws->q + i * qw, qw * sizeof(float));
        k++;
    }
    model_attn_absorbed(m, ly, ex, sub, k, layer, ws->qsub, ws->attvsub);
    for (int j = 0; j < k; j++)
        memcpy(ws->attv + idx[j] * vw, ws->attvsub + j * vw, vw * sizeof(float));
}

void model_attn_mla(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                    const model_step_row_t *rows, int n, int layer)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    bool expd[MODEL_MAX_BATCH];
    int n_exp = 0;
    for (int i = 0; i < n; i++) {
        const int f = i == 0 || rows[i].ctx == rows[0].ctx ? 0 : first_row(rows, i);
        expd[i] = f < i ? expd[f] : use_expanded(m, &rows[i]);
        n_exp += expd[i];
    }
    if (n_exp == 0) {
        model_attn_absorbed(m, ly, ex, rows, n, layer, ws->q, ws->attv);
        return;
    }
    if (n_exp < n)
        absorbed_subset(m, ly, ex, rows, n, layer, expd);
    for (int i = 0; i < n; i++) {
        const model_ctx_t *c = rows[i].ctx;
        if (!expd[i] || (i > 0 && first_row(rows, i) < i))
            continue;
        /* the earlier positions model_slice_expand left for c here */
        const bool pre = ws->exp_ctx == c && ws->exp_layer == layer && ws->exp_past == c->n_past;
        expand(m, ly, c, layer, pre ? ws->exp_n : 0, seq_end(rows, n, c));
        ws->exp_ctx = NULL; /* taken, or overwritten */
        const model_kv_t kv = {.k = ws->exk, .v = ws->exv,
                               .k_row = (size_t)hp->n_head * hp->head_k,
                               .v_row = (size_t)hp->n_head * hp->head_v,
                               .kvt = model_kvt_expanded(c->kvt)};
        model_attend_kv(m, rows, n, c, &kv, hp->head_k, hp->head_v);
    }
}

/* ------------------------------------------------- slices (model.h) */

/* The layer of slice unit u when its attention would take earlier
 * positions expanded ahead (the rows' one sequence, in the expanded form;
 * at the last unit only the rows that want logits attend); -1 if not. */
static int pre_layer(const model_t *m, const model_row_t *rows, int n, int u)
{
    const int nu = 2 * m->hp.n_layer - 1;
    if (m->hp.arch != ARCH_DEEPSEEK2 || n <= 0 || u < 0 || u >= nu || (u & 1))
        return -1;
    const model_ctx_t *c = rows[0].ctx;
    bool out = false;
    for (int i = 0; i < n; i++) {
        if (rows[i].ctx != c)
            return -1;
        out |= rows[i].want_logits;
    }
    if (!c->latent || (c->flags & MODEL_CTX_MLA_ABSORBED) || n < MODEL_MLA_EXPAND_ROWS ||
        c->n_past + n > exp_capacity(m, c) || (u == nu - 1 && !out))
        return -1;
    return u / 2;
}

/* Positions of c already expanded ahead for layer. */
static int pre_done(const model_t *m, const model_ctx_t *c, int layer)
{
    const model_ws_t *ws = &m->ws;
    return layer >= 0 && ws->exp_ctx == c && ws->exp_layer == layer && ws->exp_past == c->n_past
               ? ws->exp_n
               : 0;
}

int model_slice_expand_keys(const model_t *m, const model_row_t *rows, int n, int u, int *done)
{
    const int layer = pre_layer(m, rows, n, u);
    *done = layer < 0 ? 0 : pre_done(m, rows[0].ctx, layer);
    return layer < 0 ? 0 : rows[0].ctx->n_past;
}

ecs_err_t model_slice_expand(model_t *m, const model_row_t *rows, int n, int u, int t0, int t1)
{
    model_ws_t *ws = &m->ws;
    const int layer = pre_layer(m, rows, n, u);
    const model_ctx_t *c = n > 0 ? rows[0].ctx : NULL;
    const int have = pre_done(m, c, layer);
    if (layer < 0 || t0 != have || t1 < t0 || t1 > c->n_past)
        return ecs_error(ECS_ERR_INVAL, "model: slice unit %d cannot take positions [%d, %d) "
                         "expanded ahead (%d are)", u, t0, t1, have);
    expand(m, &m->w.layers[layer], c, layer, t0, t1);
    ws->exp_ctx = c;
    ws->exp_layer = layer;
    ws->exp_past = c->n_past;
    ws->exp_n = t1;
    return ECS_OK;
}

void model_slice_expand_drop(model_t *m) { m->ws.exp_ctx = NULL; }
