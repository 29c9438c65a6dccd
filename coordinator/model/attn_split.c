/* attn_split.c - the decode key split of deepseek2's absorbed attention
 * (docs/architecture.md "Decode steps"): each item takes all heads of a
 * tile and one fixed block of keys, blocks merged by an online softmax;
 * on a BF16 cache with AMX its products run on the tile unit
 * (attn_amx.c). Which rows take it is each row's own (its depth), never
 * the step's. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "coordinator/model/attn_int.h"

/* ------------------------------------------- decode at depth: key split
 * Split by heads, every thread converts (and reads) each key for its own
 * heads; at depth that costs more than the products. The split run gives
 * each item all heads of a tile and one fixed block of MODEL_SPLIT_KEYS
 * keys, through scores, a block softmax and P.V while the block is in L2
 * (one pass over the cache: the latent values are the keys' first dv
 * values); then each query's blocks are merged in block order, rescaled
 * to the common max (an online softmax, as flash attention). With one
 * tile (one sequence) a layer is three regions: per head its absorption;
 * the blocks, after thread 0 has put the queries for them (serially: the
 * transposed queries of a tile share their cache lines, so threads putting
 * them at once pass each line back and forth, ~2x the serial time); per
 * head the merge of its queries and its W_v. Item boundaries depend on
 * neither the thread count nor the timing, so neither do the bits.
 * Rounding stays llama.cpp's: the query to the cache type before Q.K,
 * each probability before P.V (here exp(s - the block's max), the
 * division by the sum after P.V, in F32). */

typedef struct {
    const attn_run_t *a;
    model_kv_t kv;
    float *QT;         /* shared: the transposed queries */
    float *O;          /* per block: att_qmax rows of dvp, max and sum (ws.split_o) */
    int nq, nqp, nt, nblk;
    float *out0;       /* the tile's first output row */
    int len[MODEL_ATT_QMAX];
} split_t;

static float *blk_o(const split_t *sp, int b)
{
    const model_ws_t *ws = &sp->a->m->ws;
    return sp->O + (size_t)b * ws->att_qmax * (ws->dvp + 2);
}


/* split_block on the tile unit: scores run by run, the block's softmax,
 * then one P.V over all its runs (its staging is per call). */
static void split_block_amx(const split_t *sp, int t0, int end, float *S, int lds, float *kbuf,
                            float *O, float *mx, float *sum, int ith)
{
    const attn_run_t *a = sp->a;
    const model_ws_t *ws = &a->m->ws;
    const size_t elt = sizeof(ecs_bf16_t);
    const void *vr[MODEL_SPLIT_KEYS / MODEL_KV_BLOCK + 1];
    int rn[MODEL_SPLIT_KEYS / MODEL_KV_BLOCK + 1], nrun = 0, len[MODEL_ATT_QMAX], run;
    const char *kr, *v;
    for (int t = t0; t < end; t += run, nrun++) {
        attn_kv_run(&sp->kv, sp->kv.k, sp->kv.v, elt, t, end, &kr, &v, &run);
        attn_prefetch_next_run(&sp->kv, sp->kv.k, sp->kv.v, elt, t + run, end, a->dk);
        model_amx_scores(sp->QT, sp->nq, kr, sp->kv.k_row, a->dk, run, a->m->hp.kq_scale,
                         S + (t - t0), lds, kbuf);
        vr[nrun] = v, rn[nrun] = run;
    }
    attn_run_len(sp->len, sp->nqp, t0, end - t0, len);
    model_simd()->softmax(S, sp->nqp, lds, len, end - t0, MODEL_KV_BF16, mx, sum);
    model_amx_pv(S, sp->nq, lds, vr, rn, nrun, sp->kv.v_row, a->dv, O, ws->dvp, false,
                 ws->amx_stage + (size_t)ith * ws->amx_stride);
}

/* split_block on an 8-bit cache (attn_q8.c): scores run by run, the
 * block's softmax in F32, then one P.V over all its runs (its levels are
 * per block). kbuf: the scores' 16 tail rows, then P.V's scratch. */
static void split_block_q8(const split_t *sp, int t0, int end, float *S, int lds, float *kbuf,
                           float *O, float *mx, float *sum)
{
    const attn_run_t *a = sp->a;
    const size_t ks = sp->kv.k_row; /* bytes */
    const void *vr[MODEL_SPLIT_KEYS / MODEL_KV_BLOCK + 1];
    int rn[MODEL_SPLIT_KEYS / MODEL_KV_BLOCK + 1], nrun = 0, len[MODEL_ATT_QMAX], run;
    const char *kr, *v;
    for (int t = t0; t < end; t += run, nrun++) {
        attn_kv_run(&sp->kv, sp->kv.k, sp->kv.v, 1, t, end, &kr, &v, &run);
        attn_prefetch_next_run(&sp->kv, sp->kv.k, sp->kv.v, 1, t + run, end, (int)ks);
        model_q8_scores(sp->QT, sp->nq, a->dv, a->dk, kr, ks, run, a->m->hp.kq_scale,
                        S + (t - t0), lds, kbuf);
        vr[nrun] = kr, rn[nrun] = run;
    }
    attn_run_len(sp->len, sp->nqp, t0, end - t0, len);
    model_simd()->softmax(S, sp->nqp, lds, len, end - t0, MODEL_KV_F32, mx, sum);
    model_q8_pv(S, sp->nq, lds, vr, rn, nrun, ks, a->dv, a->dk, O, a->m->ws.dvp,
                (char *)kbuf + 16 * ks + 64);
}

static void split_block(void *arg, int item, int ith)
{
    const split_t *sp = arg;
    const attn_run_t *a = sp->a;
    const model_ws_t *ws = &a->m->ws;
    const model_simd_t *sd = model_simd();
    const model_kvt_t kt = sp->kv.kvt;
    const size_t elt = model_kvt_size(kt);
    const int t0 = item * MODEL_SPLIT_KEYS;
    const int end = sp->nt - t0 < MODEL_SPLIT_KEYS ? sp->nt : t0 + MODEL_SPLIT_KEYS;
    float *S = attn_thr(a->m, ith) + (size_t)ws->att_qmax * ws->dkp;
    float *kbuf = S + (size_t)ws->att_qmax * ws->t_pad;
    float *O = blk_o(sp, item), *mx = O + (size_t)ws->att_qmax * ws->dvp, *sum = mx + ws->att_qmax;
    /* rows a little over the block: 16 rows 1 KB apart would share L1 sets */
    const int lds = ws->t_pad < MODEL_SPLIT_KEYS + 16 ? ws->t_pad : MODEL_SPLIT_KEYS + 16;
    if (attn_amx_takes(a, kt)) {
        split_block_amx(sp, t0, end, S, lds, kbuf, O, mx, sum, ith);
        return;
    }
    if (kt == MODEL_KV_Q8) {
        split_block_q8(sp, t0, end, S, lds, kbuf, O, mx, sum);
        return;
    }
    /* per contiguous run of KV blocks inside the item: a score is one
     * query's product with one key, the same however the keys are cut */
    const char *kr, *vr;
    int run, len[MODEL_ATT_QMAX], rl[MODEL_ATT_QMAX];
    for (int t = t0; t < end; t += run) {
        attn_kv_run(&sp->kv, sp->kv.k, sp->kv.v, elt, t, end, &kr, &vr, &run);
        attn_prefetch_next_run(&sp->kv, sp->kv.k, sp->kv.v, elt, t + run, end, a->dk);
        sd->scores_t(sp->QT, sp->nq, kr, sp->kv.k_row, kt, a->dk, run, a->m->hp.kq_scale,
                     S + (t - t0), lds, kbuf);
    }
    attn_run_len(sp->len, sp->nqp, t0, end - t0, len);
    sd->softmax(S, sp->nqp, lds, len, end - t0, kt, mx, sum);
    /* P.V continues its sums run after run (KV blocks, even lengths) */
    for (int t = t0; t < end; t += run) {
        attn_kv_run(&sp->kv, sp->kv.k, sp->kv.v, elt, t, end, &kr, &vr, &run);
        attn_run_len(len, sp->nqp, t - t0, run, rl);
        sd->pv(S + (t - t0), sp->nqp, lds, vr, sp->kv.v_row, kt, a->dv, rl, O, ws->dvp, t > t0);
    }
}

/* Query j: its blocks' outputs, each scaled by exp(its max - the max),
 * summed in block order and divided by the sum of the blocks' sums so
 * scaled (model_simd_t.wsum: one read of each block's row, o written
 * once). The blocks it sees are the first ceil(len / block) ones (the
 * others' max is -inf). */
static void split_merge(void *arg, int j, int ith)
{
    const split_t *sp = arg;
    const model_ws_t *ws = &sp->a->m->ws;
    const int q = ws->att_qmax;
    const size_t bs = (size_t)q * (ws->dvp + 2); /* floats between blocks */
    const int nb = (sp->len[j] + MODEL_SPLIT_KEYS - 1) / MODEL_SPLIT_KEYS;
    const float *mx = sp->O + (size_t)q * ws->dvp + j;
    /* the weights, in this thread's scores scratch (idle in this region) */
    float *w = attn_thr(sp->a->m, ith) + (size_t)q * ws->dkp;
    float M = -INFINITY;
    for (int b = 0; b < nb; b++)
        M = mx[b * bs] > M ? mx[b * bs] : M;
    double L = 0.0;
    for (int b = 0; b < nb; b++) {
        w[b] = expf(mx[b * bs] - M);
        L += (double)w[b] * (double)mx[b * bs + q];
    }
    model_simd()->wsum(sp->out0 + (size_t)j * sp->a->dv, sp->a->dv, sp->O + (size_t)j * ws->dvp,
               bs, w, nb, (float)(1.0 / L));
}

/* Tile tl (all heads: a->hg == n_head) by the key split: sp's fields,
 * its transposed queries (thread 0's scratch) zeroed, none put yet. */
static void split_prepare(const attn_run_t *a, const tile_t *tl, split_t *sp)
{
    model_t *m = a->m;
    const model_ws_t *ws = &m->ws;
    *sp = (split_t){.a = a, .kv = attn_ctx_kv(a->rows[tl->row0].ctx, a->layer), .O = ws->split_o};
    sp->QT = attn_thr(m, 0);
    sp->nq = tl->nrows * a->hg;
    sp->nqp = (sp->nq + 3) & ~3;
    sp->nt = a->rows[tl->row0 + tl->nrows - 1].pos + 1;
    sp->nblk = (sp->nt + MODEL_SPLIT_KEYS - 1) / MODEL_SPLIT_KEYS;
    sp->out0 = a->out + (size_t)tl->row0 * a->out_ld;
    const int ng = (sp->nq + 15) / 16;
    memset(sp->QT, 0, (size_t)ng * 16 * a->dk * sizeof(float));
    memset(sp->len, 0, sizeof sp->len);
}

/* Query j of tile tl into sp's transposed queries; tmp: dk floats of
 * the calling thread's. */
static void split_query(split_t *sp, const tile_t *tl, int j, float *tmp)
{
    const attn_run_t *a = sp->a;
    sp->len[j] = attn_get_query(a, tl, 0, j, sp->kv.kvt, tmp);
    if (sp->kv.kvt == MODEL_KV_Q8) {
        model_q8_query(sp->QT, sp->nq, j, a->dv, a->dk, tmp);
        return;
    }
    if (sp->kv.kvt == MODEL_KV_BF16) {
        model_qt_bf16(sp->QT, j, a->dk, (const ecs_bf16_t *)tmp);
        return;
    }
    float *qt = sp->QT + (size_t)(j / 16) * a->dk * 16 + j % 16;
    for (int d = 0; d < a->dk; d++)
        qt[(size_t)d * 16] = tmp[d];
}

/* A thread's scratch for split_query: its scores (idle until the blocks;
 * thread 0's queries lie before them). */
static float *split_tmp(model_t *m, int ith)
{
    return attn_thr(m, ith) + (size_t)m->ws.att_qmax * m->ws.dkp;
}

/* Tile tl by the key split, its queries put here: the region of its
 * blocks into sp; the merge (split_merge over sp->nq queries) is the
 * caller's. */
static void split_attend(const attn_run_t *a, const tile_t *tl, split_t *sp)
{
    split_prepare(a, tl, sp);
    for (int j = 0; j < sp->nq; j++)
        split_query(sp, tl, j, split_tmp(a->m, 0));
    kcpu_par_for(a->m->tp, sp->nblk, split_block, sp);
}

/* Region items over heads of a fused_t: absorption, then the values. */
static void split_absorb(void *arg, int h, int ith)
{
    const fused_t *f = arg;
    (void)ith;
    attn_absorb_head(f->a.m, f->ex, f->a.q, h, f->n);
}

static void split_values(void *arg, int h, int ith)
{
    const fused_t *f = arg;
    (void)ith;
    attn_values_head(f->a.m, f->ly, f->attv, h, f->n);
}

typedef struct {
    const fused_t *f;
    split_t *sp;
} merge_values_t;

/* One tile: head h's queries (row r: query r * n_head + h) merged, then
 * its values, in one item: a region fewer per layer, and the merged rows
 * are quantized where they were written. */
static void split_merge_values(void *arg, int h, int ith)
{
    const merge_values_t *mv = arg;
    for (int j = h; j < mv->sp->nq; j += mv->f->a.hg)
        split_merge((void *)mv->sp, j, ith);
    attn_values_head(mv->f->a.m, mv->f->ly, mv->f->attv, h, mv->f->n);
}

/* Rows at position p with p + 1 >= this take the key split (m's
 * attn_split_min: 0 means 512, < 0 never). */
int attn_split_min(const model_t *m)
{
    const int o = m->opts.attn_split_min;
    return o < 0 ? INT_MAX : o ? o : 512;
}

/* Rows a tile of all heads holds in the scratch (0: the key split cannot
 * run: fewer than one row's heads fit att_qmax). */
int attn_split_max_rows(const model_t *m, int n)
{
    int r = 0;
    while (r < n && ((r + 1) * m->hp.n_head + 15) / 16 * 16 <= m->ws.att_qmax)
        r++;
    return r;
}

/* The fused_t of the key split over all n rows (absorption and values
 * for every row; tiles set by the caller). */
static fused_t split_fused(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                           const model_step_row_t *rows, int n, int layer, const float *q,
                           float *attv, tile_t *tiles)
{
    const arch_hparams_t *hp = &m->hp;
    const int nh = hp->n_head;
    return (fused_t){.a = {.m = m, .rows = rows, .q = q, .layer = layer, .tiles = tiles, .hg = nh,
                           .n_hg = 1, .group = nh, .dk = hp->kv_lora_rank + hp->rope.n_rot,
                           .dv = hp->kv_lora_rank, .latent = true, .out = m->ws.ato,
                           .out_ld = (int64_t)nh * hp->kv_lora_rank},
                     .ly = ly, .ex = ex, .attv = attv, .n = n};
}

/* The key split for a step whose rows all take it (any row count):
 * returns false (nothing done) when a tile of all heads does not fit the
 * scratch. */
bool attn_split_run(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                    const model_step_row_t *rows, int n, int layer, const float *q, float *attv)
{
    const int nh = m->hp.n_head, max_rows = attn_split_max_rows(m, n);
    if (max_rows == 0)
        return false;
    tile_t tiles[MODEL_MAX_BATCH];
    fused_t f = split_fused(m, ly, ex, rows, n, layer, q, attv, tiles);
    f.a.n_tiles = attn_make_tiles(rows, n, (attn_rows_t){0}, max_rows, tiles);
    split_t sp;
    kcpu_par_for(m->tp, nh, split_absorb, &f);
    if (f.a.n_tiles == 1) { /* 3 regions: absorption, blocks, merge and values */
        split_attend(&f.a, &tiles[0], &sp);
        const merge_values_t mv = {&f, &sp};
        kcpu_par_for(m->tp, nh, split_merge_values, (void *)&mv);
        return true;
    }
    /* tiles share the blocks' outputs (ws.split_o): each merged first */
    for (int t = 0; t < f.a.n_tiles; t++) {
        split_attend(&f.a, &tiles[t], &sp);
        kcpu_par_for(m->tp, sp.nq, split_merge, &sp);
    }
    kcpu_par_for(m->tp, nh, split_values, &f);
    return true;
}

/* A step of deep and shallow rows: each row's attention as it would be
 * alone (the key split and the head split differ in their last bits, and
 * a request's tokens must not depend on what else a step holds): the
 * absorption of every row, the deep rows' tiles by the key split, the
 * others' by the head split's items, then every row's values. */
void attn_split_mixed(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                      const model_step_row_t *rows, int n, int layer, const float *q, float *attv,
                      int min)
{
    const int nh = m->hp.n_head;
    tile_t deep[MODEL_MAX_BATCH], shallow[MODEL_MAX_BATCH];
    fused_t f = split_fused(m, ly, ex, rows, n, layer, q, attv, deep);
    const attn_rows_t deep_rows = {.min = min, .deep = true};
    f.a.n_tiles = attn_make_tiles(rows, n, deep_rows, attn_split_max_rows(m, n), deep);
    kcpu_par_for(m->tp, nh, split_absorb, &f);
    split_t sp;
    for (int t = 0; t < f.a.n_tiles; t++) {
        split_attend(&f.a, &deep[t], &sp);
        kcpu_par_for(m->tp, sp.nq, split_merge, &sp);
    }
    attn_run_t a;
    attn_plan_run(&a, m, rows, n, layer, nh, f.a.dk, f.a.dv, true, m->ws.ato, f.a.out_ld, shallow);
    a.q = q;
    a.n_tiles = attn_make_tiles(rows, n, (attn_rows_t){.min = min}, m->ws.att_qmax / a.hg, shallow);
    kcpu_par_for(m->tp, a.n_tiles * a.n_hg, attn_item, &a);
    kcpu_par_for(m->tp, nh, split_values, &f);
}
