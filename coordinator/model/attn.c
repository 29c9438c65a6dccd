/* attn.c - the attention core of a layer over the KV caches, after the
 * step's own K/V rows are stored.
 *
 * Work items are (tile of consecutive rows of one sequence) x (group of
 * query heads sharing one cached head): the item's queries (at most
 * MODEL_ATT_QMAX) attend together, so each cached K/V row is loaded once
 * per item. Per item: S = Q K^T (scaled), softmax per query over its own
 * causal length, O = P V (simd.c / simd_avx512.c).
 *
 * deepseek2 latent (absorbed) attention: the cache holds [c | k_pe] per
 * token, one head shared by all queries. Before the items, each head's
 * q_nope is absorbed into the latent space with the transposed W_k
 * (q_abs = W_k^T q_nope, one matrix product per head, load.c builds W_kT;
 * its rows of 128 values are too short for the row kernels, so in Q8_0 it
 * is packed for model_simd_t.dot_q8p, 16 rows per SIMD vector);
 * after them, each head's latent output goes through its W_v rows of W_kv_b.
 * Prompt steps run these as three regions (per-head products batched over
 * the rows); decode steps run each group of heads through all three in one
 * item, so the layer's attention core is a single region. Rows deep enough
 * take the key split instead (attn_split.c), each row by its own depth.
 * Prompt steps of latent contexts mostly attend in the expanded form
 * instead (attn_exp.c), through model_attend_kv here.
 * Numerics as llama.cpp's F16 cache: the query is rounded to F16 before
 * Q.K and the probabilities before P.V (ggml converts the F32 operand of an
 * F16 product); likewise to BF16 for a BF16 cache (whose products sum in
 * pairs, model_kvt_t); with an F32 cache nothing is rounded. */
#include <math.h>
#include <string.h>

#include "coordinator/model/attn_int.h"





float *attn_thr(model_t *m, int ith) { return m->ws.thr + (size_t)ith * m->ws.thr_stride; }

/* Values [off, off + n) of a query row q = src: rounded to F16 for an F16
 * cache, BF16 values (the row's elements) for a BF16 one, F32 otherwise. */
static void put_query(const model_simd_t *sd, float *q, int off, const float *src, int n,
                      model_kvt_t kt)
{
    if (kt == MODEL_KV_BF16)
        sd->to_bf16((ecs_bf16_t *)q + off, src, n);
    else if (kt == MODEL_KV_F16)
        sd->round_f16(q + off, src, n);
    else
        memcpy(q + off, src, (size_t)n * sizeof *q);
}

/* The cached rows of one layer of c: the pool's rows of that layer,
 * located through c's table. */
model_kv_t attn_ctx_kv(const model_ctx_t *c, int layer)
{
    const model_kv_geom_t *g = &c->pool->g;
    const char *base = c->pool->mem + (size_t)layer * g->lay_stride;
    return (model_kv_t){.k = base, .v = base + g->v_base, .k_row = c->k_row, .v_row = c->v_row,
                        .kvt = c->kvt, .tab = c->tab};
}

/* Contiguous runs of the cached rows: [t0, t0 + *run) of kv start at
 * *kr / *vr (one run of nt when kv is not paged, else one per run of
 * consecutive block ids). elt: bytes per element. */
void attn_kv_run(const model_kv_t *kv, const char *k, const char *v, size_t elt, int t0, int nt,
                 const char **kr, const char **vr, int *run)
{
    if (!kv->tab) {
        *kr = k, *vr = v, *run = nt - t0;
        return;
    }
    int b = t0 / MODEL_KV_BLOCK, end = (b + 1) * MODEL_KV_BLOCK;
    while (end < nt && kv->tab[b + 1] == kv->tab[b] + 1)
        b++, end += MODEL_KV_BLOCK;
    const size_t row = (size_t)kv->tab[t0 / MODEL_KV_BLOCK] * MODEL_KV_BLOCK + t0 % MODEL_KV_BLOCK;
    *kr = k + row * kv->k_row * elt, *vr = v + row * kv->v_row * elt;
    *run = (end < nt ? end : nt) - t0;
}

/* The kernels prefetch the keys ahead of them within a run; the first
 * keys of the next run (another block) are asked for here, into L2, so a
 * run boundary does not stall on them (16: the kernels' tile). */
void attn_prefetch_next_run(const model_kv_t *kv, const char *k, const char *v, size_t elt,
                            int t0, int nt, int dk)
{
    if (!kv->tab || t0 >= nt)
        return;
    const char *kr, *vr;
    int run;
    attn_kv_run(kv, k, v, elt, t0, nt, &kr, &vr, &run);
    const size_t row = kv->k_row * elt, bytes = (size_t)dk * elt;
    for (int i = 0; i < (run < 16 ? run : 16); i++)
        for (size_t o = 0; o < bytes; o += 64)
            __builtin_prefetch(kr + (size_t)i * row + o, 0, 2);
}

/* len of the queries within the run [t0, t0 + run). */
void attn_run_len(const int *len, int nq, int t0, int run, int *out)
{
    for (int j = 0; j < nq; j++) {
        const int l = len[j] - t0;
        out[j] = l < 0 ? 0 : l > run ? run : l;
    }
}

/* Query j of tile tl x heads [h0, h0 + hg) into q (dk values, as
 * put_query stores them for kt); returns the keys it sees. */
int attn_get_query(const attn_run_t *a, const tile_t *tl, int h0, int j, model_kvt_t kt,
                   float *q)
{
    const arch_hparams_t *hp = &a->m->hp;
    const model_simd_t *sd = model_simd();
    const int nh = hp->n_head, hk = hp->head_k, kvl = hp->kv_lora_rank;
    const int r = tl->row0 + j / a->hg, h = h0 + j % a->hg;
    const float *src = a->q + (size_t)r * nh * hk + (size_t)h * hk;
    if (a->latent) {
        put_query(sd, q, 0, a->m->ws.att + ((size_t)r * nh + h) * kvl, kvl, kt);
        put_query(sd, q, kvl, src + hp->qk_nope, hp->rope.n_rot, kt);
    } else {
        put_query(sd, q, 0, src, hk, kt);
    }
    return a->rows[r].pos + 1;
}

bool model_attn_amx(const model_t *m) { return !m->opts.no_amx && model_cpu_amx(); }

/* Whether run a on a cache of type kt takes the tile unit: a BF16 cache
 * where model_attn_amx, shapes the tiles take, and att_qmax a multiple of
 * 16 (ws_layout rounds it so), so any item's groups of 16 queries fit the
 * scratch. Nothing about the step (its rows, the item's tile): a query's
 * kernels, hence its bits, must not depend on what else the step holds. */
bool attn_amx_takes(const attn_run_t *a, model_kvt_t kt)
{
    const model_ws_t *ws = &a->m->ws;
    return kt == MODEL_KV_BF16 && ws->amx_stride && a->dk % 2 == 0 && a->dk >= 32 &&
           a->dv % 64 == 0 && ws->att_qmax % 16 == 0;
}

/* attend() on the tile unit: the queries transposed into groups of 16
 * (model_qt_bf16), scores run by run, the softmax, then P.V in chunks of
 * MODEL_SPLIT_KEYS keys (the staging's size) at fixed key positions, so a
 * query's bits depend on nothing but its own query and keys. */
static void attend_amx(const attn_run_t *a, const tile_t *tl, int h0, int ith,
                       const model_kv_t *kv)
{
    model_t *m = a->m;
    const model_ws_t *ws = &m->ws;
    const size_t elt = sizeof(ecs_bf16_t);
    const int nq = tl->nrows * a->hg, nqp = (nq + 3) & ~3;
    float *QT = attn_thr(m, ith);
    float *S = QT + (size_t)ws->att_qmax * ws->dkp;
    float *kbuf = S + (size_t)ws->att_qmax * ws->t_pad;
    float *O = kbuf + (size_t)32 * ws->dkp;
    int len[MODEL_ATT_QMAX] = {0}, run;
    memset(QT, 0, (size_t)(nq + 15) / 16 * 16 * a->dk * sizeof(float));
    for (int j = 0; j < nq; j++) { /* kbuf: the query as put_query rounds it */
        len[j] = attn_get_query(a, tl, h0, j, MODEL_KV_BF16, kbuf);
        model_qt_bf16(QT, j, a->dk, (const ecs_bf16_t *)kbuf);
    }
    const int nt = a->rows[tl->row0 + tl->nrows - 1].pos + 1, kvh = h0 / a->group;
    const char *K = (const char *)kv->k + (size_t)kvh * a->dk * elt;
    const char *V = (const char *)kv->v + (size_t)kvh * a->dv * elt;
    const char *kr, *vr;
    for (int t0 = 0; t0 < nt; t0 += run) {
        attn_kv_run(kv, K, V, elt, t0, nt, &kr, &vr, &run);
        attn_prefetch_next_run(kv, K, V, elt, t0 + run, nt, a->dk);
        model_amx_scores(QT, nq, kr, kv->k_row, a->dk, run, m->hp.kq_scale, S + t0, ws->t_pad,
                         kbuf);
    }
    model_simd()->softmax(S, nqp, ws->t_pad, len, nt, MODEL_KV_BF16, NULL, NULL);
    for (int c0 = 0; c0 < nt; c0 += MODEL_SPLIT_KEYS) {
        const int end = nt - c0 < MODEL_SPLIT_KEYS ? nt : c0 + MODEL_SPLIT_KEYS;
        const void *vrs[MODEL_SPLIT_KEYS / MODEL_KV_BLOCK + 1];
        int rn[MODEL_SPLIT_KEYS / MODEL_KV_BLOCK + 1], nrun = 0;
        for (int t = c0; t < end; t += run, nrun++) {
            attn_kv_run(kv, K, V, elt, t, end, &kr, &vr, &run);
            vrs[nrun] = vr, rn[nrun] = run;
        }
        model_amx_pv(S + c0, nq, ws->t_pad, vrs, rn, nrun, kv->v_row, a->dv, O, ws->dvp, c0 > 0,
                     ws->amx_stage + (size_t)ith * ws->amx_stride);
    }
    for (int j = 0; j < nq; j++) {
        const int r = tl->row0 + j / a->hg, h = h0 + j % a->hg;
        memcpy(a->out + (size_t)r * a->out_ld + (size_t)h * a->dv, O + (size_t)j * ws->dvp,
               (size_t)a->dv * sizeof(float));
    }
}

/* Queries of tile tl x heads [h0, h0 + hg) against the tile's cache. */
static void attend(const attn_run_t *a, const tile_t *tl, int h0, int ith)
{
    model_t *m = a->m;
    const arch_hparams_t *hp = &m->hp;
    const model_ws_t *ws = &m->ws;
    const model_kv_t kv = a->kv ? *a->kv : attn_ctx_kv(a->rows[tl->row0].ctx, a->layer);
    const model_kvt_t kt = kv.kvt;
    if (attn_amx_takes(a, kt)) {
        attend_amx(a, tl, h0, ith, &kv);
        return;
    }
    const size_t elt = model_kvt_size(kt);
    /* this run's keys padded, not the widest (ds2's expanded rows are a
     * third of the latent ones) */
    const int dkp = (a->dk + 15) & ~15;
    const int nq = tl->nrows * a->hg, nqp = (nq + 3) & ~3;
    float *Q = attn_thr(m, ith);
    float *S = Q + (size_t)ws->att_qmax * ws->dkp;
    float *kbuf = S + (size_t)ws->att_qmax * ws->t_pad;
    float *O = kbuf + (size_t)32 * ws->dkp;
    int len[MODEL_ATT_QMAX];
    const model_simd_t *sd = model_simd();
    for (int j = 0; j < nqp; j++) {
        float *q = Q + (size_t)j * dkp;
        memset(q, 0, (size_t)dkp * sizeof *q);
        len[j] = j < nq ? attn_get_query(a, tl, h0, j, kt, q) : 0;
    }
    const int nt = a->rows[tl->row0 + tl->nrows - 1].pos + 1;
    const int kvh = h0 / a->group;
    const char *K = (const char *)kv.k + (size_t)kvh * a->dk * elt;
    const char *V = (const char *)kv.v + (size_t)kvh * a->dv * elt;
    /* per contiguous run of keys (KV blocks): a score is one query's
     * product with one key, and P.V continues its sums run after run, so
     * the results are those of one run over all keys, bit for bit */
    int rl[MODEL_ATT_QMAX], run;
    const char *kr, *vr;
    for (int t0 = 0; t0 < nt; t0 += run) {
        attn_kv_run(&kv, K, V, elt, t0, nt, &kr, &vr, &run);
        attn_run_len(len, nqp, t0, run, rl);
        attn_prefetch_next_run(&kv, K, V, elt, t0 + run, nt, a->dk);
        sd->scores(Q, nqp, dkp, kr, kv.k_row, kt, a->dk, dkp, rl, run, hp->kq_scale, S + t0,
                   ws->t_pad, kbuf);
    }
    sd->softmax(S, nqp, ws->t_pad, len, nt, kt, NULL, NULL);
    for (int t0 = 0; t0 < nt; t0 += run) {
        attn_kv_run(&kv, K, V, elt, t0, nt, &kr, &vr, &run);
        attn_run_len(len, nqp, t0, run, rl);
        sd->pv(S + t0, nqp, ws->t_pad, vr, kv.v_row, kt, a->dv, rl, O, ws->dvp, t0 > 0);
    }
    for (int j = 0; j < nq; j++) {
        const int r = tl->row0 + j / a->hg, h = h0 + j % a->hg;
        memcpy(a->out + (size_t)r * a->out_ld + (size_t)h * a->dv, O + (size_t)j * ws->dvp,
               (size_t)a->dv * sizeof(float));
    }
}

void attn_item(void *arg, int item, int ith)
{
    const attn_run_t *a = arg;
    /* the last tiles attend to the most keys: hand them out first */
    attend(a, &a->tiles[a->n_tiles - 1 - item / a->n_hg], (item % a->n_hg) * a->hg, ith);
}

/* Largest divisor of g that is at most cap. */
static int divisor_at_most(int g, int cap)
{
    for (int d = cap < g ? cap : g; d > 1; d--)
        if (g % d == 0)
            return d;
    return 1;
}

/* Runs of consecutive rows of one sequence at consecutive positions, at
 * most max_rows each, of the rows f takes (f.only's, all when NULL; with
 * f.min > 0 those seeing at least f.min keys when f.deep, else fewer);
 * returns the count. */
int attn_make_tiles(const model_step_row_t *rows, int n, attn_rows_t f, int max_rows, tile_t *t)
{
    int nt = 0;
    for (int i = 0; i < n; i++) {
        const bool deep = rows[i].pos + 1 >= f.min;
        if ((f.only && rows[i].ctx != f.only) || (f.min > 0 && deep != f.deep))
            continue;
        tile_t *last = nt ? &t[nt - 1] : NULL;
        if (last && last->nrows < max_rows && last->row0 + last->nrows == i &&
            rows[i].ctx == rows[i - 1].ctx && rows[i].pos == rows[i - 1].pos + 1)
            last->nrows++;
        else
            t[nt++] = (tile_t){i, 1};
    }
    return nt;
}

/* Sets up a run: heads per item as many as share a cached head (each K
 * block is converted once for all of them), but at least one item per
 * thread. */
void attn_plan_run(attn_run_t *a, model_t *m, const model_step_row_t *rows, int n, int layer,
                   int group, int dk, int dv, bool latent, float *out, int64_t out_ld,
                   tile_t *tiles)
{
    const int nh = m->hp.n_head, qmax = m->ws.att_qmax, nth = ecs_threadpool_size(m->tp);
    int hg = divisor_at_most(group, qmax);
    while (hg > 1 && (int64_t)n * (nh / hg) < nth)
        hg = divisor_at_most(group, hg - 1);
    const int n_tiles = attn_make_tiles(rows, n, (attn_rows_t){0}, qmax / hg, tiles);
    *a = (attn_run_t){.m = m, .rows = rows, .q = m->ws.q, .layer = layer, .tiles = tiles,
                      .n_tiles = n_tiles, .hg = hg, .n_hg = nh / hg, .group = group, .dk = dk,
                      .dv = dv, .latent = latent, .out = out, .out_ld = out_ld};
}

/* ------------------------------------------------------------ latent MLA */

typedef struct {
    ecs_type_t wtype;
    const float *x;
    int64_t ldx, hstride, ncols;
    int n;
    char *dst;
    size_t dst_hstride;
} qheads_t;

static void qheads_item(void *arg, int h, int ith)
{
    const qheads_t *q = arg;
    (void)ith;
    kcpu_quantize_rows(NULL, q->wtype, q->x + (size_t)h * q->hstride, q->ldx, q->n, q->ncols,
                       q->dst + (size_t)h * q->dst_hstride);
}

/* Each head's rows (n rows of ncols, ldx apart, head h at h * hstride)
 * quantized for wtype into its own block of dst. */
static void quantize_heads(model_t *m, const qheads_t *q)
{
    if (q->n * m->hp.n_head >= 64)
        kcpu_par_for(m->tp, m->hp.n_head, qheads_item, (void *)q);
    else
        for (int h = 0; h < m->hp.n_head; h++)
            qheads_item((void *)q, h, 0);
}

/* Head h's block of quantized rows in a per-head activation buffer. */
static char *head_act(void *base, size_t row, int h)
{
    return (char *)base + (size_t)h * MODEL_MAX_BATCH * row;
}

/* q_abs = W_kT q_nope for head h's n quantized rows (in ws->qn_act). */
static void absorb_mul(model_t *m, const model_layer_ext_t *ex, int h, int n)
{
    model_ws_t *ws = &m->ws;
    const int nh = m->hp.n_head, kvl = m->hp.kv_lora_rank;
    const void *act = head_act(ws->qn_act, ws->qn_row, h);
    const kcpu_mat_t w = model_expert_mat(&ex->wkt, h, kvl);
    float *y = ws->att + (size_t)h * kvl;
    if (ex->packed)
        model_simd()->dot_q8p(w.data, kvl, (int)(w.ncols / ECS_QK), act, ws->qn_row, n, y,
                   (int64_t)nh * kvl);
    else
        kcpu_matmul_q(NULL, &w, act, n, y, (int64_t)nh * kvl);
}

/* Head h of the latent path: q_abs = W_kT q_nope, and the values W_v o. */
void attn_absorb_head(model_t *m, const model_layer_ext_t *ex, const float *q, int h, int n)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    kcpu_quantize_rows(NULL, ex->wkt.type, q + (size_t)h * hp->head_k,
                       (int64_t)hp->n_head * hp->head_k, n, hp->qk_nope,
                       head_act(ws->qn_act, ws->qn_row, h));
    absorb_mul(m, ex, h, n);
}

typedef struct {
    model_t *m;
    const model_layer_ext_t *ex;
    int n;
} absorb_t;

static void absorb_item(void *arg, int h, int ith)
{
    const absorb_t *a = arg;
    (void)ith;
    absorb_mul(a->m, a->ex, h, a->n);
}

/* Head h's W_v: the head_v rows after its qk_nope W_k rows in W_kv_b. */
static kcpu_mat_t wv_head(const arch_hparams_t *hp, const kcpu_mat_t *wb, int h)
{
    return kcpu_mat_rows(wb, (int64_t)h * (hp->qk_nope + hp->head_v) + hp->qk_nope, hp->head_v);
}

void attn_values_head(model_t *m, const model_layer_t *ly, float *attv, int h, int n)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, kvl = hp->kv_lora_rank;
    char *act = head_act(ws->att_act, ws->att_row, h);
    kcpu_quantize_rows(NULL, ly->wkv_b.type, ws->ato + (size_t)h * kvl, (int64_t)nh * kvl, n, kvl,
                       act);
    const kcpu_mat_t wv = wv_head(hp, &ly->wkv_b, h);
    kcpu_matmul_q(NULL, &wv, act, n, attv + (size_t)h * hp->head_v, (int64_t)nh * hp->head_v);
}



/* Decode: one item = a group of heads through absorption, attention and
 * values, so the whole attention core is one parallel region. */
static void fused_item(void *arg, int item, int ith)
{
    const fused_t *f = arg;
    const int h0 = item * f->a.hg;
    for (int h = h0; h < h0 + f->a.hg; h++)
        attn_absorb_head(f->a.m, f->ex, f->a.q, h, f->n);
    for (int t = 0; t < f->a.n_tiles; t++)
        attend(&f->a, &f->a.tiles[t], h0, ith);
    for (int h = h0; h < h0 + f->a.hg; h++)
        attn_values_head(f->a.m, f->ly, f->attv, h, f->n);
}

void model_attn_absorbed(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                         const model_step_row_t *rows, int n, int layer, const float *q,
                         float *attv)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const int nh = hp->n_head, hk = hp->head_k, nope = hp->qk_nope, kvl = hp->kv_lora_rank;
    const int hv = hp->head_v;
    kcpu_job_t *jobs = ws->jobs;
    tile_t tiles[MODEL_MAX_BATCH];
    /* the key split per row, by its own depth; an 8-bit cache's products
     * are the split's only (every row takes it) */
    const int min = rows[0].ctx->kvt == MODEL_KV_Q8 ? 1 : attn_split_min(m);
    int n_deep = 0;
    for (int i = 0; i < n; i++)
        n_deep += rows[i].pos + 1 >= min;
    if (n_deep > 0 && attn_split_max_rows(m, n) > 0) {
        if (n_deep == n)
            attn_split_run(m, ly, ex, rows, n, layer, q, attv);
        else
            attn_split_mixed(m, ly, ex, rows, n, layer, q, attv, min);
        return;
    }
    if (n <= MODEL_FUSED_ROWS) {
        fused_t f = {.ly = ly, .ex = ex, .attv = attv, .n = n};
        attn_plan_run(&f.a, m, rows, n, layer, nh, kvl + hp->rope.n_rot, kvl, true, ws->ato,
                      (int64_t)nh * kvl, tiles);
        f.a.q = q;
        kcpu_par_for(m->tp, f.a.n_hg, fused_item, &f);
        return;
    }

    /* q_abs = W_kT q_nope per head */
    const qheads_t qn = {ex->wkt.type, q, (int64_t)nh * hk, hk, nope, n, (char *)ws->qn_act,
                         MODEL_MAX_BATCH * ws->qn_row};
    quantize_heads(m, &qn);
    if (ex->packed) {
        absorb_t ab = {m, ex, n};
        kcpu_par_for(m->tp, nh, absorb_item, &ab);
    } else {
        for (int h = 0; h < nh; h++) {
            const kcpu_mat_t w = model_expert_mat(&ex->wkt, h, kvl);
            jobs[h] = kcpu_job_mm(&w, head_act(ws->qn_act, ws->qn_row, h), n,
                             ws->att + (size_t)h * kvl, (int64_t)nh * kvl);
        }
        kcpu_run_jobs(m->tp, &ws->plan, jobs, nh);
    }

    attn_run_t a;
    attn_plan_run(&a, m, rows, n, layer, nh, kvl + hp->rope.n_rot, kvl, true, ws->ato,
                  (int64_t)nh * kvl, tiles);
    a.q = q;
    kcpu_par_for(m->tp, a.n_tiles * a.n_hg, attn_item, &a);

    /* values = W_v (sum_t p_t c_t) per head */
    const kcpu_mat_t *wb = &ly->wkv_b;
    const qheads_t ao = {wb->type, ws->ato, (int64_t)nh * kvl, kvl, kvl, n, (char *)ws->att_act,
                         MODEL_MAX_BATCH * ws->att_row};
    quantize_heads(m, &ao);
    for (int h = 0; h < nh; h++) {
        const kcpu_mat_t wv = wv_head(hp, wb, h);
        jobs[h] = kcpu_job_mm(&wv, head_act(ws->att_act, ws->att_row, h), n, attv + (size_t)h * hv,
                         (int64_t)nh * hv);
    }
    kcpu_run_jobs(m->tp, &ws->plan, jobs, nh);
}

void model_attention(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                     const model_step_row_t *rows, int n, int layer)
{
    const model_ctx_t *c = rows[0].ctx;
    if (c->latent) {
        model_attn_mla(m, ly, ex, rows, n, layer);
        return;
    }
    const int nh = m->hp.n_head;
    tile_t tiles[MODEL_MAX_BATCH];
    attn_run_t a;
    attn_plan_run(&a, m, rows, n, layer, nh / c->n_kv_head, c->dk, c->dv, false, m->ws.attv,
                  (int64_t)nh * c->dv, tiles);
    kcpu_par_for(m->tp, a.n_tiles * a.n_hg, attn_item, &a);
}

void model_attend_kv(model_t *m, const model_step_row_t *rows, int n, const model_ctx_t *only,
                     const model_kv_t *kv, int dk, int dv)
{
    const int nh = m->hp.n_head;
    tile_t tiles[MODEL_MAX_BATCH];
    attn_run_t a = {.m = m, .rows = rows, .q = m->ws.q, .kv = kv, .tiles = tiles, .hg = 1,
                    .n_hg = nh, .group = 1, .dk = dk, .dv = dv, .out = m->ws.attv,
                    .out_ld = (int64_t)nh * dv};
    a.n_tiles = attn_make_tiles(rows, n, (attn_rows_t){.only = only}, m->ws.att_qmax, tiles);
    kcpu_par_for(m->tp, a.n_tiles * a.n_hg, attn_item, &a);
}

void model_cache_put(const model_step_row_t *r, int layer, const float *k, const float *v)
{
    model_ctx_t *c = r->ctx;
    void *kd = model_kv_krow(c, layer, r->pos), *vd = v ? model_kv_vrow(c, layer, r->pos) : NULL;
    if (c->kvt == MODEL_KV_F32) {
        memcpy(kd, k, c->k_row * sizeof(float));
        if (v)
            memcpy(vd, v, c->v_row * sizeof(float));
        return;
    }
    if (c->kvt == MODEL_KV_Q8) { /* latent only: [c | k_pe] */
        model_q8_put(kd, k, c->m->hp.kv_lora_rank, c->m->hp.kv_lora_rank + c->m->hp.rope.n_rot);
        return;
    }
    const model_simd_t *sd = model_simd();
    if (c->kvt == MODEL_KV_BF16) {
        sd->to_bf16(kd, k, (int64_t)c->k_row);
        if (v)
            sd->to_bf16(vd, v, (int64_t)c->v_row);
        return;
    }
    sd->to_f16(kd, k, (int64_t)c->k_row);
    if (v)
        sd->to_f16(vd, v, (int64_t)c->v_row);
}
