/* par.c - parallel regions: several matrix products
 * (and their SwiGLU epilogues) in one pool run, cut into guided chunks;
 * and a plain parallel loop over work items.
 *
 * Decode reads ~1.6 GB of weights per token through a few hundred small
 * products. Running each as its own pool call costs a wake-up and, worse,
 * a tail where one thread idles while the other finishes its last chunk.
 * Grouping the products that share an input (wq + wkv_a, router + shared
 * gate/up, every routed expert's gate/up) into one region, with chunks that
 * shrink towards the end, keeps both threads streaming. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* Smallest chunk, in weight bytes: big enough that handing it out (an
 * atomic on a shared line) and packing its activations are noise, small
 * enough to even out the tail. A decode region streams its weights at
 * ~10 GB/s per thread and ends when both threads are done, so its last
 * chunk is idle time for the other thread, ~200 regions a token: small
 * batches get smaller chunks (a 16 KiB chunk still costs ~1.5 us against
 * well under 1 us of overhead). */
#define PAR_MIN_BYTES (64 * 1024)
#define PAR_MIN_BYTES_SMALL (16 * 1024)
#define PAR_SMALL_NB 4

static _Atomic uint64_t n_regions;

uint64_t kcpu_regions(void) { return atomic_load_explicit(&n_regions, memory_order_relaxed); }

static void count_region(void) { atomic_fetch_add_explicit(&n_regions, 1, memory_order_relaxed); }

kcpu_job_t kcpu_job_mm(const kcpu_mat_t *w, const void *act, int nb, float *y, int64_t ldy)
{
    return (kcpu_job_t){.kind = KCPU_JOB_MM, .w = *w, .act = act,
                       .act_stride = kcpu_act_row(w->type, w->ncols), .nb = nb, .y = y,
                       .ldy = ldy};
}

kcpu_job_t kcpu_job_swiglu(const kcpu_mat_t *gate, const kcpu_mat_t *up, const kcpu_mat_t *down,
                     const void *act, const void *act_up, int nb, float *y, float *y2, int64_t ldy,
                     void *hq)
{
    kcpu_job_t j = kcpu_job_mm(gate, act, nb, y, ldy);
    j.kind = KCPU_JOB_SWIGLU;
    j.w2 = *up;
    j.act2 = act_up;
    j.act2_stride = kcpu_act_row(up->type, up->ncols);
    j.y2 = y2;
    /* chunks quantize their own columns only for small blocks: 256-value
     * blocks would make the chunks too coarse to balance */
    const ecs_type_t vdt = ecs_type_traits(down->type)->vec_dot_type;
    if (hq && vdt != ECS_TYPE_F32 && ecs_type_traits(vdt)->blck_size <= 32) {
        j.hq = hq;
        j.hq_stride = kcpu_act_row(down->type, down->ncols);
        j.hq_vdt = vdt;
    }
    return j;
}

size_t kcpu_act_row(ecs_type_t wtype, int64_t ncols)
{
    const ecs_type_traits_t *tr = ecs_type_traits(wtype);
    return tr ? ecs_row_size(tr->vec_dot_type, ncols) : 0;
}

/* ---------------------------------------------------------------- chunks */

static int64_t job_mats(const kcpu_job_t *j) { return j->kind == KCPU_JOB_SWIGLU ? 2 : 1; }

/* Relative cost of one weight row: its bytes stream once, and each
 * activation row adds compute. */
static double row_cost(const kcpu_job_t *j)
{
    return (double)j->w.row_bytes * (double)job_mats(j) * (double)(j->nb + 3);
}

/* Chunks start at multiples of this: whole blocks of the fused
 * quantization, whole groups of interleaved rows (both powers of two). */
static int64_t job_align(const kcpu_job_t *j)
{
    int64_t a = 1;
    if (j->kind == KCPU_JOB_SWIGLU && j->hq)
        a = ecs_type_traits(j->hq_vdt)->blck_size;
    if (j->w.r16 && a < KCPU_R16_ROWS)
        a = KCPU_R16_ROWS;
    return a;
}

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* Rows of the smallest chunk of a job. */
static int64_t job_min_rows(const kcpu_job_t *j)
{
    const double min_bytes = j->nb <= PAR_SMALL_NB ? PAR_MIN_BYTES_SMALL : PAR_MIN_BYTES;
    return round_up(
        (int64_t)(min_bytes / ((double)j->w.row_bytes * (double)job_mats(j))) + 1, job_align(j));
}

/* Jobs whose smallest chunk costs most are planned first, so that the
 * region ends on the finest chunks: a decode step's shared expert (8-row
 * chunks) after the routed experts (32-row chunks aligned for their fused
 * quantization), a prompt step's experts with few rows after those with
 * many. Stable; job order when there are too many jobs to sort here. */
#define PAR_SORT_MAX 1024

static void order_jobs(const kcpu_job_t *jobs, int n, int *order)
{
    double key[PAR_SORT_MAX];
    for (int j = 0; j < n; j++) {
        const double c = (double)job_min_rows(&jobs[j]) * row_cost(&jobs[j]);
        int i = j;
        for (; i > 0 && key[i - 1] < c; i--) {
            key[i] = key[i - 1];
            order[i] = order[i - 1];
        }
        key[i] = c;
        order[i] = j;
    }
}

/* Cuts the jobs into chunks of decreasing size (remaining / (2 nth), at
 * least job_min_rows); returns the count. */
static int plan_chunks(kcpu_plan_t *p, const kcpu_job_t *jobs, int n, int nth)
{
    int order[PAR_SORT_MAX];
    const bool sorted = n <= PAR_SORT_MAX;
    if (sorted)
        order_jobs(jobs, n, order);
    double rem = 0;
    for (int j = 0; j < n; j++)
        if (jobs[j].nb > 0)
            rem += row_cost(&jobs[j]) * (double)jobs[j].w.nrows;
    int nc = 0;
    for (int o = 0; o < n; o++) {
        const int j = sorted ? order[o] : o;
        const kcpu_job_t *jb = &jobs[j];
        if (jb->nb <= 0 || jb->w.nrows <= 0)
            continue;
        const double rc = row_cost(jb);
        const int64_t align = job_align(jb), rows = jb->w.nrows, min_rows = job_min_rows(jb);
        for (int64_t r = 0; r < rows;) {
            int64_t want = (int64_t)ceil(rem / (2.0 * nth) / rc);
            want = round_up(want > min_rows ? want : min_rows, align);
            /* the last chunks of a plan that is full take what is left */
            if (nc >= p->cap - (n - o) || r + want + min_rows / 2 > rows)
                want = rows - r;
            p->chunks[nc++] = (kcpu_chunk_t){j, r, r + want};
            rem -= rc * (double)want;
            r += want;
        }
    }
    return nc;
}

/* ---------------------------------------------------------------- running */

typedef struct {
    const kcpu_job_t *jobs;
    const kcpu_chunk_t *chunks;
    int n;
    _Atomic int next;
} par_task_t;

/* y[., r0:r1) = w[r0:r1) act over every activation row, in tiles of
 * KCPU_MAX_BATCH rows (the chunk's weights stay in cache between tiles);
 * with w2, also y2 = w2 act, the activations packed once for both. */
static void mm_part(const kcpu_job_t *j, const kcpu_mat_t *w, const kcpu_mat_t *w2, const void *act,
                    size_t stride, float *y, float *y2, int64_t r0, int64_t r1)
{
    const kcpu_mat_t s1 = kcpu_mat_rows(w, r0, r1 - r0);
    const kcpu_mat_t s2 = w2 ? kcpu_mat_rows(w2, r0, r1 - r0) : s1;
    for (int b = 0; b < j->nb; b += KCPU_MAX_BATCH) {
        const int nb = j->nb - b < KCPU_MAX_BATCH ? j->nb - b : KCPU_MAX_BATCH;
        const void *a = (const char *)act + (size_t)b * stride;
        const int64_t o = (int64_t)b * j->ldy + r0;
        if (w2)
            kcpu_matmul_q_pair(&s1, &s2, a, nb, y + o, y2 + o, j->ldy);
        else
            kcpu_matmul_q(NULL, &s1, a, nb, y + o, j->ldy);
    }
}

static void run_chunk(const par_task_t *t, const kcpu_chunk_t *c)
{
    const kcpu_job_t *j = &t->jobs[c->job];
    /* a SwiGLU's gate and up on the same activations: one packing */
    const bool pair = j->kind == KCPU_JOB_SWIGLU && j->act2 == j->act &&
                      j->act2_stride == j->act_stride;
    mm_part(j, &j->w, pair ? &j->w2 : NULL, j->act, j->act_stride, j->y, pair ? j->y2 : NULL,
            c->r0, c->r1);
    if (j->kind != KCPU_JOB_SWIGLU)
        return;
    if (!pair)
        mm_part(j, &j->w2, NULL, j->act2, j->act2_stride, j->y2, NULL, c->r0, c->r1);
    const int64_t w = c->r1 - c->r0;
    const ecs_type_traits_t *qt = j->hq ? ecs_type_traits(j->hq_vdt) : NULL;
    for (int b = 0; b < j->nb; b++) {
        float *g = j->y + (int64_t)b * j->ldy + c->r0;
        kcpu_swiglu(g, j->y2 + (int64_t)b * j->ldy + c->r0, w);
        if (qt)
            kcpu_quantize_act(j->hq_vdt, g,
                              (char *)j->hq + (size_t)b * j->hq_stride +
                                  (size_t)(c->r0 / qt->blck_size) * qt->type_size,
                              w);
    }
}

static void par_worker(void *arg, int ith, int nth)
{
    par_task_t *t = arg;
    (void)ith, (void)nth;
    for (;;) {
        const int c = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (c >= t->n)
            break;
        run_chunk(t, &t->chunks[c]);
    }
}

void kcpu_run_jobs(ecs_threadpool_t *tp, kcpu_plan_t *plan, const kcpu_job_t *jobs, int n)
{
    const int nth = ecs_threadpool_size(tp);
    par_task_t t = {.jobs = jobs, .chunks = plan->chunks};
    t.n = plan_chunks(plan, jobs, n, nth);
    atomic_init(&t.next, 0);
    if (t.n == 0)
        return;
    if (nth == 1 || t.n == 1) {
        par_worker(&t, 0, 1);
    } else {
        count_region();
        ecs_threadpool_run_shared(tp, par_worker, &t);
    }
}

/* ---------------------------------------------------------------- par_for */

typedef struct {
    kcpu_item_fn fn;
    void *arg;
    int n;
    _Atomic int next;
} for_task_t;

static void for_worker(void *arg, int ith, int nth)
{
    for_task_t *t = arg;
    (void)nth;
    for (;;) {
        const int i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (i >= t->n)
            break;
        t->fn(t->arg, i, ith);
    }
}

void kcpu_par_for(ecs_threadpool_t *tp, int n, kcpu_item_fn fn, void *arg)
{
    if (n <= 0)
        return;
    for_task_t t = {.fn = fn, .arg = arg, .n = n};
    atomic_init(&t.next, 0);
    if (n == 1 || ecs_threadpool_size(tp) == 1) {
        for_worker(&t, 0, 1);
    } else {
        count_region();
        ecs_threadpool_run_shared(tp, for_worker, &t);
    }
}

/* ---------------------------------------------------------------- SwiGLU */

static void swiglu_plain(float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void kcpu_swiglu(float *g, const float *u, int64_t n)
{
    if (kcpu_isa() >= KCPU_ISA_AVX512 && kcpu_swiglu_avx512(g, u, n))
        return;
    swiglu_plain(g, u, n);
}

/* ---------------------------------------------------------- log-sum-exp */

/* libm's exp of each value less the max, in double: the sampled rows'
 * log-probabilities as they were before kcpu_logsumexp. */
static float logsumexp_plain(const float *x, int64_t n)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += exp((double)(x[i] - mx));
    return mx + (float)log(sum);
}

float kcpu_logsumexp(const float *x, int64_t n)
{
    float out;
    if (kcpu_isa() >= KCPU_ISA_AVX512 && kcpu_logsumexp_avx512(x, n, &out))
        return out;
    return logsumexp_plain(x, n);
}
