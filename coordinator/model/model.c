/* model.c - the model object (load, workspace, expert backend) and the
 * evaluation entry points; sequences are in seq.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/resident.h"
#include "coordinator/model/model_int.h"

#define ALIGN 64

/* --------------------------------------------------------------- workspace */

typedef struct {
    char *base; /* NULL while measuring */
    size_t off;
} carve_t;

static void *carve(carve_t *c, size_t bytes)
{
    size_t at = (c->off + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    c->off = at + bytes;
    return c->base ? c->base + at : NULL;
}

static size_t act_need(const kcpu_mat_t *w, size_t cur)
{
    if (w->nrows == 0)
        return cur;
    size_t b = kcpu_act_row(w->type, w->ncols);
    return b > cur ? b : cur;
}

/* Widest quantized activation row of any product the model runs itself. */
static size_t act_row_max(const model_t *m)
{
    size_t need = act_need(&m->w.output, 0);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer_t *l = &m->w.layers[il];
        const kcpu_mat_t *all[] = {&l->wq, &l->wq_a, &l->wq_b, &l->wkv_a, &l->wkv_b, &l->wk,
                                   &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down,
                                   &l->gate_inp, &l->gate_shexp, &l->up_shexp, &l->down_shexp};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            need = act_need(all[i], need);
    }
    return need;
}

/* Bytes per quantized row of the latent path's per-head products: q_nope
 * for W_kT (which) or the latent output for W_v (!which). */
static size_t head_act_row(const model_t *m, bool wkt)
{
    if (m->hp.arch != ARCH_DEEPSEEK2)
        return 0;
    size_t need = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        size_t b = wkt ? kcpu_act_row(m->ext[il].wkt.type, m->hp.qk_nope)
                       : kcpu_act_row(m->w.layers[il].wkv_b.type, m->hp.kv_lora_rank);
        need = b > need ? b : need;
    }
    return need;
}

static int imax(int a, int b) { return a > b ? a : b; }

static int pad16(int x) { return (x + 15) & ~15; }

/* Rows of a step that the dense FFN (n_ff wide, 10944 on V2-Lite) takes
 * per pass: more would cost tens of MB of workspace for the first layer
 * only. */
#define DENSE_PASS_ROWS 64

/* The dense FFN's width where there are dense layers: feed_forward_length
 * is metadata only in qwen3moe and in deepseek2 models without leading dense
 * blocks, and must not size buffers there. */
static int dense_ff(const arch_hparams_t *hp) { return hp->n_layer_dense > 0 ? hp->n_ff : 0; }

/* Floats in ffa / ffb: all rows of a step through the widest shared FFN,
 * and at least DENSE_PASS_ROWS rows through the dense one (which then runs
 * in passes). */
static size_t ff_cap(const arch_hparams_t *hp)
{
    const size_t a = (size_t)MODEL_MAX_BATCH * (size_t)imax(hp->n_ff_shexp, 1);
    const size_t b = (size_t)DENSE_PASS_ROWS * (size_t)imax(imax(dense_ff(hp), hp->n_ff_shexp), 1);
    return a > b ? a : b;
}

/* Largest F among the FFNs the model runs itself, and its down's act row. */
static size_t ffq_row_max(const model_t *m)
{
    size_t need = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer_t *l = &m->w.layers[il];
        need = act_need(&l->ffn_down, need);
        need = act_need(&l->down_shexp, need);
    }
    return need;
}

static void ws_layout(model_t *m, carve_t *c)
{
    const arch_hparams_t *hp = &m->hp;
    model_ws_t *ws = &m->ws;
    const size_t nb = MODEL_MAX_BATCH, F = sizeof(float);
    const bool ds2 = hp->arch == ARCH_DEEPSEEK2;
    const int nrot = hp->rope.n_rot, kvl = hp->kv_lora_rank;
    ws->kv_w = ds2 ? kvl + nrot : hp->n_head_kv * hp->head_k;
    ws->att_w = ds2 ? imax(kvl, hp->head_v) : hp->head_v;
    ws->ff_w = imax(imax(dense_ff(hp), hp->n_ff_shexp), 1);
    ws->ff_cap = ff_cap(hp);
    const int nth = ecs_threadpool_size(m->tp);
    /* attention scratch per thread: queries, scores, a block of keys, output */
    ws->dkp = pad16(ds2 ? imax(kvl + nrot, hp->head_k) : hp->head_k);
    ws->dvp = pad16(ds2 ? imax(kvl, hp->head_v) : hp->head_v);
    ws->t_pad = pad16(m->opts.n_ctx);
    int qmax = (int)((size_t)(1 << 20) / (size_t)ws->t_pad) & ~3;
    if (qmax >= 16 && model_attn_amx(m)) /* whole groups of 16 (attn_amx.c) */
        qmax &= ~15;
    ws->att_qmax = qmax < 4 ? 4 : qmax > MODEL_ATT_QMAX ? MODEL_ATT_QMAX : qmax;
    ws->thr_stride = (size_t)ws->att_qmax * (size_t)(ws->dkp + ws->t_pad + ws->dvp) +
                     32 * (size_t)ws->dkp;
    ws->qn_row = head_act_row(m, true);
    ws->att_row = head_act_row(m, false);
    ws->jobs_cap = imax(hp->n_head, hp->n_expert + 2) + model_experts_local_max_jobs(m);
    ws->ex_pos = model_exp_positions(hp, m->opts.n_ctx);

    ws->x = carve(c, nb * hp->n_embd * F);
    ws->xn = carve(c, nb * hp->n_embd * F);
    ws->q = carve(c, nb * hp->n_head * hp->head_k * F);
    ws->qa = carve(c, nb * (size_t)imax(hp->q_lora_rank, 1) * F);
    ws->kv = carve(c, nb * ws->kv_w * F);
    ws->v = carve(c, nb * (size_t)hp->n_head_kv * hp->head_v * F);
    ws->kvb = carve(c, ds2 ? nb * hp->n_head * (size_t)(hp->qk_nope + hp->head_v) * F : 0);
    ws->kvrow = carve(c, ds2 ? (size_t)hp->n_head * (hp->head_k + hp->head_v) * F : 0);
    ws->att = carve(c, ds2 ? nb * hp->n_head * (size_t)kvl * F : 0);
    ws->ato = carve(c, ds2 ? nb * hp->n_head * (size_t)kvl * F : 0);
    ws->attv = carve(c, nb * hp->n_head * (size_t)hp->head_v * F);
    /* per block of keys: att_qmax output rows of dvp, then their max and sum */
    ws->split_o = carve(c, ds2 ? (size_t)((m->opts.n_ctx + MODEL_SPLIT_KEYS - 1) /
                                          MODEL_SPLIT_KEYS) *
                                     (size_t)ws->att_qmax * (size_t)(ws->dvp + 2) * F
                               : 0);
    ws->qn_act = carve(c, nb * hp->n_head * ws->qn_row);
    ws->att_act = carve(c, nb * hp->n_head * ws->att_row);
    ws->exk = carve(c, (size_t)ws->ex_pos * hp->n_head * (size_t)hp->head_k * F);
    ws->exv = carve(c, (size_t)ws->ex_pos * hp->n_head * (size_t)hp->head_v * F);
    ws->exc = carve(c, ds2 ? nb * (size_t)kvl * F : 0);
    ws->qsub = carve(c, ds2 ? nb * hp->n_head * (size_t)hp->head_k * F : 0);
    ws->attvsub = carve(c, ds2 ? nb * hp->n_head * (size_t)hp->head_v * F : 0);
    ws->ffa = carve(c, ws->ff_cap * F);
    ws->ffb = carve(c, ws->ff_cap * F);
    ws->ffq = carve(c, nb * ffq_row_max(m));
    ws->sh = carve(c, nb * hp->n_embd * F);
    ws->moe = carve(c, nb * hp->n_embd * F);
    ws->tmp = carve(c, nb * hp->n_embd * F);
    ws->router = carve(c, nb * hp->n_expert * F);
    ws->ids = carve(c, nb * hp->n_expert_used * sizeof(int32_t));
    ws->w = carve(c, nb * hp->n_expert_used * F);
    ws->route_scratch = carve(c, nb * 3 * (size_t)hp->n_expert * F);
    ws->rope = carve(c, nb * nrot * F);
    ws->act = carve(c, 2 * nb * act_row_max(m));
    ws->thr = carve(c, (size_t)nth * ws->thr_stride * F);
    /* the staging of P.V on the tile unit (model_amx_pv), chunks of
     * MODEL_SPLIT_KEYS keys */
    ws->amx_stride = model_attn_amx(m) ? (model_amx_pv_stage(ws->att_qmax, MODEL_SPLIT_KEYS,
                                                             ws->dvp) + 63) & ~(size_t)63
                                       : 0;
    ws->amx_stage = carve(c, (size_t)nth * ws->amx_stride);
    ws->jobs = carve(c, (size_t)ws->jobs_cap * sizeof(kcpu_job_t));
    ws->plan.cap = 64 * ws->jobs_cap + 4096;
    ws->plan.chunks = carve(c, (size_t)ws->plan.cap * sizeof(kcpu_chunk_t));
}

const void *model_act(ecs_threadpool_t *tp, const kcpu_mat_t *w, const float *x, int64_t ldx,
                      int nb, void *buf)
{
    const ecs_type_traits_t *tr = ecs_type_traits(w->type);
    if (tr && tr->vec_dot_type == ECS_TYPE_F32 && ldx == w->ncols)
        return x;
    kcpu_quantize_rows(nb >= 8 ? tp : NULL, w->type, x, ldx, nb, w->ncols, buf);
    return buf;
}

static ecs_err_t ws_alloc(model_t *m)
{
    carve_t c = {NULL, 0};
    ws_layout(m, &c);
    m->ws_bytes = c.off;
    m->ws_mem = ecs_alloc_huge(c.off);
    if (!m->ws_mem)
        return ecs_error(ECS_ERR_NOMEM,
                         "model: cannot allocate %zu bytes of workspace (for embedding_length "
                         "%d, feed_forward_length %d, expert_feed_forward_length %d x "
                         "expert_shared_count %d, expert_count %d, context %d)",
                         c.off, m->hp.n_embd, dense_ff(&m->hp), m->hp.n_ff_exp,
                         m->hp.n_expert_shared, m->hp.n_expert, m->opts.n_ctx);
    c.base = m->ws_mem;
    c.off = 0;
    ws_layout(m, &c);
    return ECS_OK;
}

/* ------------------------------------------------------------------- model */

/* Decode streams ~1.6 GB of weights per token through the file mapping;
 * with 4 KB pages that is a TLB miss every 4 KB. Where the kernel can fill
 * the page cache with 2 MB folios on faults (transparent huge pages for
 * files, large-folio file systems), this lets it map them with 2 MB pages.
 * Advice only: pages already cached keep their size, and failure is
 * harmless. */
static void advise_hugepages(const gguf_file_t *f)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        const uintptr_t a = (uintptr_t)t->data;
        lo = a < lo ? a : lo;
        hi = a + t->nbytes > hi ? a + t->nbytes : hi;
    }
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (hi > lo && page > 0)
        madvise((void *)(lo & ~(page - 1)), hi - (lo & ~(page - 1)), MADV_HUGEPAGE);
}

/* A whole-file mapping of path at base: its resident 2 MB regions that the
 * page cache holds in small folios read back into 2 MB ones
 * (ecs_huge_refresh); what was done is appended to m->pages_note. */
void model_pages_refresh(model_t *m, const void *base, size_t n, const char *path)
{
    ecs_huge_refresh_t hr;
    ecs_huge_refresh(base, n, path, &hr);
    if (!hr.refreshed) /* nothing done: nothing the user could act on */
        return;
    size_t used = strlen(m->pages_note);
    if (used && used + 2 < sizeof m->pages_note)
        used += (size_t)snprintf(m->pages_note + used, sizeof m->pages_note - used, "; ");
    if (used < sizeof m->pages_note)
        ecs_huge_refresh_say(&hr, path, m->pages_note + used, sizeof m->pages_note - used);
}

const char *model_pages_note(const model_t *m) { return m->pages_note[0] ? m->pages_note : NULL; }

/* The GGUF's mapping (the whole file from offset 0: gguf_open), when it
 * is a file. */
static void gguf_pages_refresh(model_t *m)
{
    const gguf_file_t *f = m->file;
    if (!gguf_stat(f) || gguf_n_tensors(f) == 0)
        return;
    const gguf_tensor_t *t = gguf_tensor_at(f, 0);
    const char *base = (const char *)t->data - gguf_data_offset(f) - t->offset;
    /* one mapping, advised as a whole: the header's pages share a 2 MB
     * region with the first tensors */
    madvise((void *)base, gguf_file_size(f), MADV_HUGEPAGE);
    model_pages_refresh(m, base, gguf_file_size(f), gguf_path(f));
}

/* Grows the kernels' per-thread scratch to what this matrix needs with up
 * to nb rows (nothing for absent matrices); keeps the largest need. */
static ecs_err_t reserve_mat(model_t *m, const kcpu_mat_t *w, int nb, size_t *most)
{
    if (w->nrows <= 0 || !w->data)
        return ECS_OK;
    nb = nb < KCPU_MAX_BATCH ? nb : KCPU_MAX_BATCH;
    const size_t need = kcpu_matmul_scratch(w, nb);
    *most = need > *most ? need : *most;
    return kcpu_matmul_reserve(m->tp, w, nb);
}

/* Every product's kernel scratch, grown now, so that steps never allocate
 * (the dense FFN runs in passes of ff_cap / n_ff rows). */
static ecs_err_t reserve_kernels(model_t *m)
{
    const arch_hparams_t *hp = &m->hp;
    const int nb = MODEL_MAX_BATCH, dense_nb = (int)(m->ws.ff_cap / (size_t)imax(dense_ff(hp), 1));
    size_t most = 0;
    ecs_err_t e = reserve_mat(m, &m->w.output, nb, &most);
    for (int il = 0; il < hp->n_layer && e == ECS_OK; il++) {
        const model_layer_t *ly = &m->w.layers[il];
        const kcpu_mat_t *full[] = {&ly->wq,         &ly->wq_a,      &ly->wq_b,     &ly->wkv_a,
                                    &ly->wkv_b,      &ly->wk,        &ly->wv,       &ly->wo,
                                    &ly->gate_inp,   &ly->gate_exps, &ly->up_exps,  &ly->down_exps,
                                    &ly->gate_shexp, &ly->up_shexp,  &ly->down_shexp};
        const kcpu_mat_t *dense[] = {&ly->ffn_gate, &ly->ffn_up, &ly->ffn_down};
        for (size_t i = 0; i < sizeof full / sizeof full[0] && e == ECS_OK; i++)
            e = reserve_mat(m, full[i], nb, &most);
        for (size_t i = 0; i < sizeof dense / sizeof dense[0] && e == ECS_OK; i++)
            e = reserve_mat(m, dense[i], dense_nb, &most);
        if (e == ECS_OK && m->ext)
            e = reserve_mat(m, &m->ext[il].wkt, nb, &most);
    }
    m->kscratch_bytes = most * (size_t)ecs_threadpool_size(m->tp);
    return e;
}

ecs_err_t model_load(const char *path, const model_opts_t *opts, model_t **out)
{
    *out = NULL;
    model_t *m = calloc(1, sizeof *m);
    if (!m)
        return ecs_error(ECS_ERR_NOMEM, "model: out of memory");
    ecs_err_t e = gguf_open(path, &m->file);
    if (e == ECS_OK)
        e = model_read_hparams(m); /* the keys' ranges first */
    if (e == ECS_OK)
        e = model_load_weights(m);
    if (e == ECS_OK)
        e = model_validate_tensors(m);
    if (e == ECS_OK) {
        advise_hugepages(m->file);
        gguf_pages_refresh(m);
    }
    if (e == ECS_OK) {
        m->opts = opts ? *opts : (model_opts_t){0};
        if (m->opts.n_ctx <= 0) /* n_ctx_train >= 1: arch_read_hparams */
            m->opts.n_ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
        if (m->opts.n_ctx > MODEL_MAX_CTX)
            e = ecs_error(ECS_ERR_RANGE, "model: n_ctx %d exceeds %d", m->opts.n_ctx, MODEL_MAX_CTX);
        if (m->opts.n_threads <= 0) {
            long n = sysconf(_SC_NPROCESSORS_ONLN);
            m->opts.n_threads = n > 0 ? (int)(n > 256 ? 256 : n) : 1;
        }
    }
    if (e == ECS_OK)
        e = ecs_threadpool_create(m->opts.n_threads, &m->tp);
    /* after the pool: the copy's checksums are checked on it */
    if (e == ECS_OK && m->opts.repack_dir && m->align_copy) /* the copy keys on file offsets */
        snprintf(m->r16_note, sizeof m->r16_note, "%s: %.1f MB of tensors copied to aligned memory "
                 "(general.alignment %u): no decode copy", gguf_path(m->file),
                 (double)m->align_bytes / 1e6, gguf_alignment(m->file));
    else if (e == ECS_OK && m->opts.repack_dir)
        model_repack(m, m->opts.repack_dir);
    if (e == ECS_OK)
        e = model_build_ext(m);
    if (e == ECS_OK)
        e = ws_alloc(m);
    if (e == ECS_OK)
        e = model_experts_local_new(m, m->tp, &m->ex_local);
    if (e == ECS_OK)
        e = reserve_kernels(m);
    if (e != ECS_OK) {
        model_free(m);
        return e;
    }
    model_set_experts(m, NULL, NULL);
    *out = m;
    return ECS_OK;
}

void model_free(model_t *m)
{
    if (!m)
        return;
    model_experts_local_free(m->ex_local);
    free(m->ws_mem);
    free(m->ext_mem);
    free(m->ext);
    ecs_threadpool_destroy(m->tp);
    free(m->w.layers);
    free(m->align_copy);
    model_repack_free(m);
    gguf_close(m->file);
    free(m);
}

const arch_hparams_t *model_hparams(const model_t *m) { return &m->hp; }
const model_weights_t *model_weights(const model_t *m) { return &m->w; }
int model_n_vocab(const model_t *m) { return m->hp.n_vocab; }
int model_n_ctx_max(const model_t *m) { return m->opts.n_ctx; }
const gguf_file_t *model_gguf(const model_t *m) { return m->file; }
ecs_threadpool_t *model_threadpool(const model_t *m) { return m->tp; }
size_t model_workspace_bytes(const model_t *m)
{
    return m->ws_bytes + m->ext_bytes + model_experts_local_bytes(m->ex_local) + m->kscratch_bytes +
           m->align_bytes;
}

/* What decode reads of w: its interleaved copy where it has one. */
static size_t mat_bytes(const kcpu_mat_t *w)
{
    return w->r16 ? kcpu_r16_bytes(w->type, w->nrows, w->ncols) : (size_t)w->nrows * w->row_bytes;
}

size_t model_decode_bytes(const model_t *m)
{
    const arch_hparams_t *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd * sizeof(float);
    size_t b = m->w.token_embd.row_bytes + E + mat_bytes(&m->w.output);
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer_t *l = &m->w.layers[il];
        const kcpu_mat_t *all[] = {&l->wq, &l->wq_a, &l->wq_b, &l->wkv_a, &l->wkv_b, &l->wk,
                                   &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down,
                                   &l->gate_inp, &l->gate_shexp, &l->up_shexp, &l->down_shexp};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            b += mat_bytes(all[i]);
        const size_t ex = mat_bytes(&l->gate_exps) + mat_bytes(&l->up_exps) +
                          mat_bytes(&l->down_exps);
        if (l->moe)
            b += ex / (size_t)hp->n_expert * (size_t)hp->n_expert_used;
        if (hp->arch == ARCH_DEEPSEEK2) { /* latent: W_kT replaces W_kv_b's k rows */
            b -= (size_t)hp->n_head * (size_t)hp->qk_nope * l->wkv_b.row_bytes;
            b += mat_bytes(&m->ext[il].wkt);
        }
        b += 2 * E; /* attention and FFN norms */
        b += (l->q_a_norm ? (size_t)hp->q_lora_rank : 0) * sizeof(float);
        b += (l->kv_a_norm ? (size_t)hp->kv_lora_rank : 0) * sizeof(float);
        b += (l->q_norm ? 2 * (size_t)hp->head_k : 0) * sizeof(float);
        b += (l->exp_probs_b ? (size_t)hp->n_expert : 0) * sizeof(float);
    }
    return b;
}

/* ----------------------------------------------------------------- profile */

static const char *const phase_names[MODEL_PH_COUNT] = {
    "embed", "norm", "attn_in", "attn_core", "attn_out", "router",
    "ffn_up", "ffn_down", "moe_sum", "dense", "output",
};

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void prof_start(const model_t *m, prof_mark_t *mk)
{
    if (!m->opts.profile)
        return;
    mk->wall = clock_s(CLOCK_MONOTONIC);
    mk->cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    mk->regions = kcpu_regions();
}

void prof_end(model_t *m, model_phase_t ph, prof_mark_t *mk)
{
    if (!m->opts.profile)
        return;
    prof_mark_t now;
    prof_start(m, &now);
    model_prof_t *p = &m->prof[ph];
    p->wall_s += now.wall - mk->wall;
    p->cpu_s += now.cpu - mk->cpu;
    p->regions += now.regions - mk->regions;
    p->calls++;
    *mk = now;
}

void model_profile(const model_t *m, model_prof_t out[MODEL_PH_COUNT])
{
    for (int i = 0; i < MODEL_PH_COUNT; i++) {
        out[i] = m->prof[i];
        out[i].name = phase_names[i];
    }
}

void model_profile_reset(model_t *m) { memset(m->prof, 0, sizeof m->prof); }

kcpu_mat_t model_expert_mat(const kcpu_mat_t *stack, int e, int rows_per_expert)
{
    return kcpu_mat_rows(stack, (int64_t)e * rows_per_expert, rows_per_expert);
}

ecs_err_t model_set_micro_batches(model_t *m, int n)
{
    if (n < 1 || n > MODEL_MAX_MICRO)
        return ecs_error(ECS_ERR_RANGE, "model: %d micro-batches (1..%d)", n, MODEL_MAX_MICRO);
    m->n_micro = n;
    return ECS_OK;
}

void model_set_experts(model_t *m, const model_experts_ops *ops, void *ctx)
{
    if (ops) {
        m->ex_ops = ops;
        m->ex_ctx = ctx;
    } else {
        m->ex_ops = &model_experts_local_ops;
        m->ex_ctx = m->ex_local;
    }
}

/* -------------------------------------------------------------- evaluation */

/* The step rows of rows (validated), and which want logits. */
static ecs_err_t step_rows(model_t *m, const model_row_t *rows, int n, float *logits,
                           model_step_row_t *st, int *out_rows, int *n_out)
{
    if (n < 1 || n > MODEL_MAX_BATCH)
        return ecs_error(ECS_ERR_INVAL, "model: a step takes 1..%d rows, got %d", MODEL_MAX_BATCH, n);
    bool latent = false;
    *n_out = 0;
    for (int i = 0; i < n; i++) {
        model_ctx_t *c = rows[i].ctx;
        if (!c || c->m != m)
            return ecs_error(ECS_ERR_INVAL, "model: row %d has no context of this model", i);
        if (rows[i].token < 0 || rows[i].token >= m->hp.n_vocab)
            return ecs_error(ECS_ERR_RANGE, "model: token id %d outside the vocabulary (0..%d)",
                             rows[i].token, m->hp.n_vocab - 1);
        if (i > 0 && c->latent != latent)
            return ecs_error(ECS_ERR_INVAL, "model: a step cannot mix latent and expanded contexts");
        latent = c->latent;
        int before = 0, same = 0; /* rows of c ahead of this one; in the step */
        for (int j = 0; j < n; j++)
            if (rows[j].ctx == c) {
                before += j < i;
                same++;
            }
        if (c->n_past + before >= c->n_ctx)
            return ecs_error(ECS_ERR_NOMEM, "model: context full (%d tokens); row %d does not fit",
                             c->n_ctx, i);
        if (c->n_past + before >= c->n_blk * MODEL_KV_BLOCK)
            return ecs_error(ECS_ERR_NOMEM, "model: row %d (position %d) is past the sequence's "
                             "%d KV blocks", i, c->n_past + before, c->n_blk);
        st[i] = (model_step_row_t){c, c->n_past + before, rows[i].token, same};
        if (rows[i].want_logits)
            out_rows[(*n_out)++] = i;
    }
    if (*n_out > 0 && !logits)
        return ecs_error(ECS_ERR_INVAL, "model: rows want logits but the output is NULL");
    return ECS_OK;
}

/* Units [u0, u1) of a validated step (model_slice_units); the sequences
 * advance after the last. */
static ecs_err_t eval_layers(model_t *m, model_step_row_t *st, int n, int u0, int u1,
                             float *resid, const int *out_rows, int n_out, float *logits)
{
    const bool end = u1 == model_slice_units(m);
    ecs_err_t e = model_forward_layers(m, st, n, u0, u1, resid, out_rows, n_out, logits);
    /* the residual keeps a NaN or inf once one enters it, where quantized
     * products may turn them into finite garbage: its last rows (the output
     * rows, else all after the last full layer) tell, with the logits; a
     * failed slice is diagnosed by a rerun of the whole step without
     * logits (the same rows' K/V written again, the same values) */
    const size_t res = (size_t)(end && n_out > 0 ? n_out : n) * (size_t)m->hp.n_embd;
    if (e != ECS_OK || !model_all_finite(end ? m->ws.x : resid, res) ||
        (end && !model_all_finite(logits, (size_t)n_out * (size_t)m->hp.n_vocab)))
        MODEL_TRY(model_diagnose_step(m, st, n, out_rows, end ? n_out : 0, logits, e));
    if (!end)
        return ECS_OK;
    for (int i = 0; i < n; i++) {
        model_ctx_touched(st[i].ctx);
        st[i].ctx->n_past = st[i].pos + 1 > st[i].ctx->n_past ? st[i].pos + 1 : st[i].ctx->n_past;
    }
    return ECS_OK;
}

ecs_err_t model_eval_batch(model_t *m, const model_row_t *rows, int n, float *logits)
{
    model_step_row_t st[MODEL_MAX_BATCH] = {{0}};
    int out_rows[MODEL_MAX_BATCH] = {0}, n_out = 0;
    MODEL_TRY(step_rows(m, rows, n, logits, st, out_rows, &n_out));
    return eval_layers(m, st, n, 0, model_slice_units(m), NULL, out_rows, n_out, logits);
}

size_t model_slice_bytes(const model_t *m, int n)
{
    return (size_t)n * (size_t)m->hp.n_embd * sizeof(float);
}

ecs_err_t model_eval_slice(model_t *m, const model_row_t *rows, int n, int u0, int u1,
                           float *resid, float *logits)
{
    const int nu = model_slice_units(m);
    if (u0 < 0 || u1 <= u0 || u1 > nu)
        return ecs_error(ECS_ERR_INVAL, "model: slice units [%d, %d) outside 0..%d", u0, u1, nu);
    if (!resid && (u0 > 0 || u1 < nu))
        return ecs_error(ECS_ERR_INVAL, "model: a slice of a step needs its residual buffer");
    model_step_row_t st[MODEL_MAX_BATCH] = {{0}};
    int out_rows[MODEL_MAX_BATCH] = {0}, n_out = 0;
    MODEL_TRY(step_rows(m, rows, n, logits, st, out_rows, &n_out));
    return eval_layers(m, st, n, u0, u1, resid, out_rows, n_out, logits);
}

ecs_err_t model_eval(model_ctx_t *c, const int32_t *tokens, int n, float *logits, bool all)
{
    if (n < 0 || (n > 0 && !tokens))
        return ecs_error(ECS_ERR_INVAL, "model: bad token array");
    if (n == 0)
        return ECS_OK;
    if (n > c->n_ctx - c->n_past)
        return ecs_error(ECS_ERR_NOMEM,
                         "model: context full: %d tokens in the cache + %d new exceed n_ctx %d",
                         c->n_past, n, c->n_ctx);
    model_t *m = c->m;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return ecs_error(ECS_ERR_RANGE, "model: token %d (position %d) outside the vocabulary "
                             "(0..%d)", tokens[i], i, m->hp.n_vocab - 1);
    model_row_t rows[MODEL_MAX_BATCH];
    const size_t V = (size_t)m->hp.n_vocab;
    for (int s = 0; s < n; s += MODEL_MAX_BATCH) {
        int nb = n - s < MODEL_MAX_BATCH ? n - s : MODEL_MAX_BATCH;
        bool last_chunk = s + nb == n;
        for (int i = 0; i < nb; i++)
            rows[i] = (model_row_t){c, tokens[s + i],
                                    logits && (all || (last_chunk && i == nb - 1))};
        float *out = !logits ? NULL : all ? logits + (size_t)s * V : logits;
        ecs_err_t e = model_eval_batch(m, rows, nb, out);
        if (e != ECS_OK)
            return e;
    }
    return ECS_OK;
}
