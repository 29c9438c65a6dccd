/* moe.c - the grouped routed-expert FFN (moe.h).
 *
 * A call's (row, expert) pairs are grouped by expert (counting sort) and
 * the input rows quantized once; each expert with work gets its rows
 * gathered into one activation batch, so its gate and up are one batched
 * product (SwiGLU applied chunk by chunk, the hidden rows quantized for
 * down there when the down type's blocks are small) and its down another:
 * every expert's weights are read once per call. All experts' gate/up go
 * into one parallel region and all downs into another (kernels/cpu
 * par.c), which a caller may share with its own products. Each pair's
 * result is kept apart; kmoe_sum adds them in slot order, as llama.cpp
 * does, so the result does not depend on how rows were grouped. */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "kernels/moe/moe.h"

/* Rows (pairs) per work item of the gather and the sum. */
#define PAR_ROWS 32
/* Largest max_rows: keeps every pair index in an int32. */
#define KMOE_MAX_ROWS (1 << 16)

struct kmoe {
    kmoe_shape_t s;
    const kmoe_expert_t **layers; /* [n_layer], kmoe_new's copy */
    int n_layer;
    ecs_threadpool_t *tp;
    /* the current call */
    const kmoe_expert_t *ex; /* its layer's experts */
    int n_rows, n_pairs;
    const int32_t *row;    /* prepare's row list (NULL: p / k); only read during prepare */
    int32_t *start;        /* [n_expert+1] first list entry of each expert */
    int32_t *list;         /* [pairs] pair index, grouped by expert */
    int32_t *where;        /* [pairs] list entry of each pair */
    void *xq, *xq_up;      /* the rows quantized for gate / up */
    void *gq, *gq_up;      /* the same, gathered in list order */
    size_t st_in, st_up, st_h; /* this layer's bytes per gate / up input and hidden row */
    bool same;             /* gate and up take the same activations */
    ecs_type_t down_type;
    float *g, *u;          /* [pairs][n_ff_exp] gate (then h) and up */
    void *hq;              /* [pairs] h quantized for down */
    float *d;              /* [pairs][n_embd] down outputs, list order */
    bool hq_fused;         /* the gate/up region quantized h */
    kcpu_job_t *jobs;      /* kmoe_compute's regions */
    kcpu_plan_t plan;
    void *mem;
    size_t bytes;
};

static size_t up64(size_t x) { return (x + 63) & ~(size_t)63; }

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

void kmoe_split(const kcpu_mat_t *gate, const kcpu_mat_t *up, const kcpu_mat_t *down,
                int n_expert, kmoe_expert_t *out)
{
    const int64_t F = n_expert > 0 ? gate->nrows / n_expert : 0;
    const int64_t E = n_expert > 0 ? down->nrows / n_expert : 0;
    for (int e = 0; e < n_expert; e++)
        out[e] = (kmoe_expert_t){kcpu_mat_rows(gate, e * F, F), kcpu_mat_rows(up, e * F, F),
                                 kcpu_mat_rows(down, e * E, E)};
}

static bool held(const kmoe_expert_t *x) { return x->gate.nrows > 0; }

static ecs_err_t check_expert(const kmoe_shape_t *s, const kmoe_expert_t *x, int l, int e)
{
    const kcpu_mat_t *g = &x->gate, *u = &x->up, *d = &x->down;
    if (g->nrows != s->n_ff_exp || g->ncols != s->n_embd || u->nrows != s->n_ff_exp ||
        u->ncols != s->n_embd || d->nrows != s->n_embd || d->ncols != s->n_ff_exp)
        return ecs_error(ECS_ERR_INVAL,
                         "kmoe: layer %d expert %d: gate %lldx%lld, up %lldx%lld, down "
                         "%lldx%lld; want %dx%d, %dx%d, %dx%d",
                         l, e, (long long)g->nrows, (long long)g->ncols, (long long)u->nrows,
                         (long long)u->ncols, (long long)d->nrows, (long long)d->ncols,
                         s->n_ff_exp, s->n_embd, s->n_ff_exp, s->n_embd, s->n_embd, s->n_ff_exp);
    if (!ecs_type_traits(g->type) || !ecs_type_traits(u->type) || !ecs_type_traits(d->type))
        return ecs_error(ECS_ERR_INVAL, "kmoe: layer %d expert %d: unknown weight type", l, e);
    return ECS_OK;
}

/* Widest activation rows of the held experts, and whether gate and up
 * ever take different activations; reserves the kernels' scratch. */
static ecs_err_t scan_layers(const kmoe_shape_t *s, const kmoe_expert_t *const *layers,
                             int n_layer, ecs_threadpool_t *tp, size_t *row_in, size_t *row_h,
                             bool *two)
{
    const int nb = s->max_rows * s->k < KCPU_MAX_BATCH ? s->max_rows * s->k : KCPU_MAX_BATCH;
    for (int l = 0; l < n_layer; l++) {
        if (!layers[l])
            continue;
        bool reserved = false;
        for (int e = 0; e < s->n_expert; e++) {
            const kmoe_expert_t *x = &layers[l][e];
            if (!held(x))
                continue;
            ecs_err_t err = check_expert(s, x, l, e);
            if (err != ECS_OK)
                return err;
            *row_in = max_z(*row_in, kcpu_act_row(x->gate.type, s->n_embd));
            *row_in = max_z(*row_in, kcpu_act_row(x->up.type, s->n_embd));
            *row_h = max_z(*row_h, kcpu_act_row(x->down.type, s->n_ff_exp));
            *two |= ecs_type_traits(x->gate.type)->vec_dot_type !=
                    ecs_type_traits(x->up.type)->vec_dot_type;
            if (reserved)
                continue;
            const kcpu_mat_t *mats[] = {&x->gate, &x->up, &x->down};
            for (int i = 0; i < 3; i++)
                if ((err = kcpu_matmul_reserve(tp, mats[i], nb)) != ECS_OK)
                    return err;
            reserved = true;
        }
    }
    return ECS_OK;
}

ecs_err_t kmoe_new(const kmoe_shape_t *s, const kmoe_expert_t *const *layers, int n_layer,
                   ecs_threadpool_t *tp, kmoe_t **out)
{
    *out = NULL;
    if (s->n_embd < 1 || s->n_ff_exp < 1 || s->n_expert < 1 || s->k < 1 ||
        s->k > s->n_expert || s->max_rows < 1 || s->max_rows > KMOE_MAX_ROWS || n_layer < 1)
        return ecs_error(ECS_ERR_INVAL,
                         "kmoe: bad shape: n_embd %d, n_ff_exp %d, n_expert %d, k %d, "
                         "max_rows %d (1..%d), %d layers",
                         s->n_embd, s->n_ff_exp, s->n_expert, s->k, s->max_rows, KMOE_MAX_ROWS,
                         n_layer);
    size_t row_in = 0, row_h = 0;
    bool two = false;
    ecs_err_t err = scan_layers(s, layers, n_layer, tp, &row_in, &row_h, &two);
    if (err != ECS_OK)
        return err;
    const size_t nb = (size_t)s->max_rows, np = nb * (size_t)s->k;
    const size_t E = (size_t)s->n_embd, F = (size_t)s->n_ff_exp, X = (size_t)s->n_expert;
    const size_t chunk_cap = KCPU_PLAN_CHUNKS(X);
    const size_t sizes[] = {
        up64((X + 1) * sizeof(int32_t)), up64(np * sizeof(int32_t)), up64(np * sizeof(int32_t)),
        up64(nb * row_in), up64(two ? nb * row_in : 0), up64(np * row_in),
        up64(two ? np * row_in : 0), up64(np * F * sizeof(float)), up64(np * F * sizeof(float)),
        up64(np * row_h), up64(np * E * sizeof(float)), up64(X * sizeof(kcpu_job_t)),
        up64(chunk_cap * sizeof(kcpu_chunk_t)),
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        total += sizes[i];
    kmoe_t *m = calloc(1, sizeof *m);
    char *p = ecs_alloc_huge(total);
    const kmoe_expert_t **lc = malloc((size_t)n_layer * sizeof *lc);
    if (!m || !p || !lc) {
        free(m);
        free(p);
        free(lc);
        return ecs_error(ECS_ERR_NOMEM, "kmoe: cannot allocate %zu bytes", total);
    }
    memcpy(lc, layers, (size_t)n_layer * sizeof *lc);
    m->s = *s;
    m->layers = lc;
    m->n_layer = n_layer;
    m->tp = tp;
    m->mem = p;
    m->bytes = total;
    void **slots[] = {(void **)&m->start, (void **)&m->list, (void **)&m->where, &m->xq,
                      &m->xq_up, &m->gq, &m->gq_up, (void **)&m->g, (void **)&m->u, &m->hq,
                      (void **)&m->d, (void **)&m->jobs, (void **)&m->plan.chunks};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *slots[i] = p;
        p += sizes[i];
    }
    m->plan.cap = (int)chunk_cap;
    *out = m;
    return ECS_OK;
}

void kmoe_free(kmoe_t *m)
{
    if (!m)
        return;
    free(m->mem);
    free(m->layers);
    free(m);
}

size_t kmoe_bytes(const kmoe_t *m) { return m ? m->bytes : 0; }

int kmoe_max_jobs(const kmoe_t *m) { return m->s.n_expert; }

static int32_t row_of(const kmoe_t *m, int p) { return m->row ? m->row[p] : p / m->s.k; }

/* Counting sort of the pairs by expert id (stable). */
static void group_by_expert(kmoe_t *m, const int32_t *ids)
{
    const int X = m->s.n_expert, n = m->n_pairs;
    memset(m->start, 0, ((size_t)X + 1) * sizeof *m->start);
    for (int j = 0; j < n; j++)
        m->start[ids[j] + 1]++;
    for (int e = 0; e < X; e++)
        m->start[e + 1] += m->start[e];
    for (int j = 0; j < n; j++) {
        m->where[j] = m->start[ids[j]]++;
        m->list[m->where[j]] = j;
    }
    for (int e = X; e > 0; e--)
        m->start[e] = m->start[e - 1];
    m->start[0] = 0;
}

static void gather_item(void *arg, int item, int ith)
{
    kmoe_t *m = arg;
    (void)ith;
    const int n = m->n_pairs;
    const int p1 = (item + 1) * PAR_ROWS < n ? (item + 1) * PAR_ROWS : n;
    for (int p = item * PAR_ROWS; p < p1; p++) {
        const size_t t = (size_t)row_of(m, m->list[p]);
        memcpy((char *)m->gq + p * m->st_in, (const char *)m->xq + t * m->st_in, m->st_in);
        if (!m->same)
            memcpy((char *)m->gq_up + p * m->st_up, (const char *)m->xq_up + t * m->st_up,
                   m->st_up);
    }
}

static ecs_err_t check_call(const kmoe_t *m, int layer, int n_rows, int n_pairs,
                            const int32_t *row, const int32_t *expert)
{
    const kmoe_shape_t *s = &m->s;
    if (layer < 0 || layer >= m->n_layer || !m->layers[layer])
        return ecs_error(ECS_ERR_INVAL, "kmoe: layer %d has no routed experts", layer);
    if (n_rows < 1 || n_rows > s->max_rows || n_pairs < 0 || n_pairs > n_rows * s->k ||
        (!row && n_pairs != n_rows * s->k))
        return ecs_error(ECS_ERR_INVAL, "kmoe: %d rows, %d pairs (at most %d rows, %d per row%s)",
                         n_rows, n_pairs, s->max_rows, s->k, row ? "" : ", all of them");
    const kmoe_expert_t *ex = m->layers[layer];
    for (int p = 0; p < n_pairs; p++) {
        if (expert[p] < 0 || expert[p] >= s->n_expert || !held(&ex[expert[p]]))
            return ecs_error(ECS_ERR_RANGE, "kmoe: layer %d: expert id %d %s", layer, expert[p],
                             expert[p] < 0 || expert[p] >= s->n_expert ? "out of range"
                                                                       : "not held here");
        if (row && (row[p] < 0 || row[p] >= n_rows))
            return ecs_error(ECS_ERR_RANGE, "kmoe: pair %d: row %d out of range (%d rows)", p,
                             row[p], n_rows);
    }
    return ECS_OK;
}

/* kmoe_prepare (x) or kmoe_prepare_q (xq, xq_up). */
static ecs_err_t prepare(kmoe_t *m, int layer, int n_rows, const float *x, const void *xq,
                         const void *xq_up, int n_pairs, const int32_t *row,
                         const int32_t *expert)
{
    m->n_pairs = 0;
    ecs_err_t err = check_call(m, layer, n_rows, n_pairs, row, expert);
    if (err != ECS_OK)
        return err;
    const int E = m->s.n_embd;
    m->ex = m->layers[layer];
    m->n_rows = n_rows;
    m->n_pairs = n_pairs;
    group_by_expert(m, expert);
    if (n_pairs == 0)
        return ECS_OK;
    /* the experts of a layer share its types (one stacked tensor each) */
    const kmoe_expert_t *x0 = &m->ex[expert[0]];
    m->down_type = x0->down.type;
    m->row = row;
    ecs_threadpool_t *tp = n_rows >= 8 ? m->tp : NULL;
    m->same = ecs_type_traits(x0->gate.type)->vec_dot_type ==
              ecs_type_traits(x0->up.type)->vec_dot_type;
    m->st_in = kcpu_act_row(x0->gate.type, E);
    m->st_up = kcpu_act_row(x0->up.type, E);
    m->st_h = kcpu_act_row(x0->down.type, m->s.n_ff_exp);
    if (x) {
        kcpu_quantize_rows(tp, x0->gate.type, x, E, n_rows, E, m->xq);
        if (!m->same)
            kcpu_quantize_rows(tp, x0->up.type, x, E, n_rows, E, m->xq_up);
    } else {
        memcpy(m->xq, xq, (size_t)n_rows * m->st_in);
        if (!m->same)
            memcpy(m->xq_up, xq_up, (size_t)n_rows * m->st_up);
    }
    /* one row (decode): every expert reads it where it is */
    const int items = n_rows == 1 ? 0 : (n_pairs + PAR_ROWS - 1) / PAR_ROWS;
    if (items > 1)
        kcpu_par_for(m->tp, items, gather_item, m);
    else if (items == 1)
        gather_item(m, 0, 0);
    m->row = NULL; /* the caller's array is not kept */
    return ECS_OK;
}

ecs_err_t kmoe_prepare(kmoe_t *m, int layer, int n_rows, const float *x, int n_pairs,
                       const int32_t *row, const int32_t *expert)
{
    return prepare(m, layer, n_rows, x, NULL, NULL, n_pairs, row, expert);
}

ecs_err_t kmoe_prepare_q(kmoe_t *m, int layer, int n_rows, const void *xq, const void *xq_up,
                         int n_pairs, const int32_t *row, const int32_t *expert)
{
    if (!xq)
        return ecs_error(ECS_ERR_INVAL, "kmoe: no quantized rows");
    ecs_err_t err = prepare(m, layer, n_rows, NULL, xq, xq_up, n_pairs, row, expert);
    if (err == ECS_OK && n_pairs > 0 && !m->same && !xq_up) {
        m->n_pairs = 0;
        return ecs_error(ECS_ERR_INVAL, "kmoe: layer %d: up takes other activations than gate: "
                         "its rows are missing", layer);
    }
    return err;
}

void kmoe_gate_up(kmoe_t *m, kcpu_jobs_t *j)
{
    const int F = m->s.n_ff_exp;
    m->hq_fused = false;
    if (m->n_pairs == 0)
        return;
    for (int e = 0; e < m->s.n_expert; e++) {
        const int s = m->start[e], cnt = m->start[e + 1] - s;
        if (cnt == 0)
            continue;
        const kmoe_expert_t *x = &m->ex[e];
        const bool one = m->n_rows == 1; /* not gathered: see prepare */
        const void *ag = one ? m->xq : (const char *)m->gq + (size_t)s * m->st_in;
        const void *au = m->same ? ag
                         : one   ? m->xq_up
                                 : (const char *)m->gq_up + (size_t)s * m->st_up;
        kcpu_job_t job = kcpu_job_swiglu(&x->gate, &x->up, &x->down, ag, au, cnt,
                                         m->g + (size_t)s * F, m->u + (size_t)s * F, F,
                                         (char *)m->hq + (size_t)s * m->st_h);
        m->hq_fused = job.hq != NULL;
        j->jobs[j->n++] = job;
    }
}

void kmoe_down(kmoe_t *m, kcpu_jobs_t *j)
{
    const int E = m->s.n_embd, F = m->s.n_ff_exp, rows = m->n_pairs;
    if (rows == 0)
        return;
    if (!m->hq_fused)
        kcpu_quantize_rows(rows >= 8 ? m->tp : NULL, m->down_type, m->g, F, rows, F, m->hq);
    for (int e = 0; e < m->s.n_expert; e++) {
        const int s = m->start[e], cnt = m->start[e + 1] - s;
        if (cnt == 0)
            continue;
        const kmoe_expert_t *x = &m->ex[e];
        j->jobs[j->n++] = kcpu_job_mm(&x->down, (const char *)m->hq + (size_t)s * m->st_h, cnt,
                                      m->d + (size_t)s * E, E);
    }
}

void kmoe_compute(kmoe_t *m)
{
    kcpu_jobs_t j = {m->jobs, 0};
    kmoe_gate_up(m, &j);
    kcpu_run_jobs(m->tp, &m->plan, j.jobs, j.n);
    j.n = 0;
    kmoe_down(m, &j);
    kcpu_run_jobs(m->tp, &m->plan, j.jobs, j.n);
}

const float *kmoe_outs(const kmoe_t *m) { return m->d; }

const int32_t *kmoe_where(const kmoe_t *m) { return m->where; }

/* ---------------------------------------------------------------- the sum */

typedef struct {
    int n_rows, k;
    size_t E;
    const float *d;
    const int32_t *where;
    const float *w;
    float *out;
} sum_t;

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

static void sum_item(void *arg, int item, int ith)
{
    const sum_t *f = arg;
    (void)ith;
    const size_t E = f->E;
    const int k = f->k;
    const int t1 = (item + 1) * PAR_ROWS < f->n_rows ? (item + 1) * PAR_ROWS : f->n_rows;
    for (int t = item * PAR_ROWS; t < t1; t++)
        for (size_t c = 0; c < E; c += SUM_BLOCK)
            weighted_block(f->out + (size_t)t * E, f->d, f->where + (size_t)t * k,
                           f->w + (size_t)t * k, k, E, c, E - c < SUM_BLOCK ? E - c : SUM_BLOCK);
}

void kmoe_sum(ecs_threadpool_t *tp, int n_rows, int k, int n_embd, const float *d,
              const int32_t *where, const float *w, float *out)
{
    if (n_rows < 1 || k < 1)
        return;
    sum_t f = {n_rows, k, (size_t)n_embd, d, where, w, out};
    const int items = (n_rows + PAR_ROWS - 1) / PAR_ROWS;
    if (items > 1)
        kcpu_par_for(tp, items, sum_item, &f);
    else
        sum_item(&f, 0, 0);
}
