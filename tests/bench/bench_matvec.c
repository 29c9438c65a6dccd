/* bench_matvec.c - how close the quantized matrix-vector kernels come to the
 * machine's memory bandwidth, and what batching buys.
 *
 * 1. A STREAM-like triad (a = b + s*c over arrays far larger than the caches)
 *    gives the bandwidth to compare against (STREAM's convention: 3 arrays
 *    counted once each); and a read probe (each thread reads its own
 *    contiguous slice of b and c, 16-byte loads, prefetching 1 KB ahead, no
 *    arithmetic: `ecs-run --bench`'s probe of the mapped weights), the
 *    ceiling a product that only reads its weights is held to.
 * 2. Decode-shaped products (nb = 1) over weight matrices far larger than the
 *    caches: GB/s of weights read, and that as a fraction of the triad;
 *    and paired (the form decode reads, at 2 threads): each kernel timed
 *    right after a triad, the median of 9 such ratios (the host's speed
 *    moves too much for one triad at the start to stand for all).
 * 3. Batched products (nb = 8, 32), which prompt processing and batched
 *    experts use: operations per second and the cost per activation row
 *    relative to nb = 1.
 * 4. Each kernel's compute ceiling: one thread, weights in L2.
 * 5. Prefill: the shapes of DeepSeek-V2-Lite's experts for nb = 1 .. 64,
 *    and with the copy at 48 rows from cache and from DRAM.
 * 6. The decode copy (kcpu_r16_*) against the rows for 1-3 activation rows
 *    (decode steps of 1-3 sequences), one thread, on the expert shapes:
 *    one matrix (cache-resident) and 40 of them (from DRAM).
 * 7. The thread pool's cost per ecs_threadpool_run (decode makes hundreds of
 *    calls per token), back to back, after serial gaps, and with work.
 * 8. Activation quantization (Q8_0, Q8_K): ns per 256 values.
 *
 * usage: bench_matvec [--quick] [--only triad|matvec|paired|batch|kernel|prefill|copy|pool|quant]
 *   --quick: small sizes (a smoke run; the arrays then fit in the caches)
 *   --only:  one section (matvec still measures the triad it compares to) */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <emmintrin.h>

#include "kernels/cpu/cpu.h"

typedef struct {
    size_t triad_bytes;   /* per array */
    size_t weight_bytes;  /* per matrix in the nb = 1 runs */
    int reps;
} config_t;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    double wall;  /* best wall-clock seconds of one call */
    double share; /* CPU time / (wall * threads) over all calls: < 1 if preempted */
    double total; /* wall-clock seconds of all calls */
} timing_t;

/* Best of reps calls after one warm-up call. The share is taken over all the
 * calls together: the kernel updates the CPU time of a thread running on the
 * other core only every few milliseconds, so a short run's share reads low
 * for no reason (busy_note ignores runs under 50 ms). */
static timing_t best_of(void (*fn)(void *), void *ctx, int reps, int nth)
{
    timing_t best = {1e30, 0, 0};
    double wall = 0, cpu = 0;
    for (int r = 0; r < reps + 1; r++) {
        const double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        fn(ctx);
        const double dw = clock_s(CLOCK_MONOTONIC) - w0;
        const double dc = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (r > 0) {
            wall += dw;
            cpu += dc;
            if (dw < best.wall)
                best.wall = dw;
        }
    }
    best.share = cpu / (wall * nth);
    best.total = wall;
    return best;
}

/* Marks numbers taken while other processes held the cores. */
static const char *busy_note(timing_t t)
{
    static char buf[64];
    if (t.share >= 0.9 || t.total < 0.05)
        return "";
    snprintf(buf, sizeof buf, "  [busy machine: got %.0f%% of the cores]", 100.0 * t.share);
    return buf;
}

static void *xmalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_matvec: cannot allocate %zu bytes\n", n);
        exit(1);
    }
    return p;
}

static void cpu_model(char *buf, size_t len)
{
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *c = strchr(line, ':');
            if (c) {
                snprintf(buf, len, "%s", c + 2);
                buf[strcspn(buf, "\n")] = 0;
            }
            break;
        }
    }
    fclose(f);
}

/* ---- triad ---- */

enum { TRIAD_INIT, TRIAD_RUN, TRIAD_READ };

typedef struct {
    double *a, *b, *c;
    size_t n;
    int mode;
    _Atomic unsigned sink; /* the read probe's xor, so that it is not optimized away */
} triad_t;

/* xor of [p, p + n) in 64-byte lines, the next KB prefetched */
static unsigned read_stream(const char *p, size_t n)
{
    __m128i x = _mm_setzero_si128(), y = x, z = x, u = x;
    for (size_t o = 0; o + 64 <= n; o += 64) {
        _mm_prefetch(p + o + 1024, _MM_HINT_T0);
        x = _mm_xor_si128(x, _mm_load_si128((const __m128i *)(p + o)));
        y = _mm_xor_si128(y, _mm_load_si128((const __m128i *)(p + o + 16)));
        z = _mm_xor_si128(z, _mm_load_si128((const __m128i *)(p + o + 32)));
        u = _mm_xor_si128(u, _mm_load_si128((const __m128i *)(p + o + 48)));
    }
    return (unsigned)_mm_cvtsi128_si32(_mm_xor_si128(_mm_xor_si128(x, y), _mm_xor_si128(z, u)));
}

static void triad_task(void *arg, int ith, int nth)
{
    triad_t *t = arg;
    const size_t lo = t->n * (size_t)ith / (size_t)nth / 8 * 8,
                 hi = ith + 1 == nth ? t->n : t->n * (size_t)(ith + 1) / (size_t)nth / 8 * 8;
    double *restrict a = t->a;
    const double *restrict b = t->b, *restrict c = t->c;
    if (t->mode == TRIAD_READ) {
        const size_t n = (hi - lo) * sizeof(double);
        atomic_fetch_xor_explicit(&t->sink,
                                  read_stream((const char *)(b + lo), n) ^
                                      read_stream((const char *)(c + lo), n),
                                  memory_order_relaxed);
        return;
    }
    if (t->mode == TRIAD_INIT) { /* first touch by the thread that will use the pages */
        for (size_t i = lo; i < hi; i++) {
            t->a[i] = 0.0;
            t->b[i] = 1.0;
            t->c[i] = 2.0;
        }
        return;
    }
    for (size_t i = lo; i < hi; i++)
        a[i] = b[i] + 3.0 * c[i];
}

typedef struct {
    ecs_threadpool_t *tp;
    triad_t *t;
} triad_run_t;

static void triad_run(void *p)
{
    triad_run_t *r = p;
    ecs_threadpool_run(r->tp, triad_task, r->t);
}

/* GB/s of the triad, and in *read those of the read probe over b and c
 * (*rtm its timing). */
static double triad_gbs(ecs_threadpool_t *tp, const config_t *cfg, timing_t *tm, double *read,
                        timing_t *rtm)
{
    triad_t t = {xmalloc(cfg->triad_bytes), xmalloc(cfg->triad_bytes), xmalloc(cfg->triad_bytes),
                 cfg->triad_bytes / sizeof(double), TRIAD_INIT, 0};
    ecs_threadpool_run(tp, triad_task, &t);
    t.mode = TRIAD_RUN;
    triad_run_t run = {tp, &t};
    *tm = best_of(triad_run, &run, cfg->reps, ecs_threadpool_size(tp));
    if (t.a[t.n / 2] != 7.0)
        fprintf(stderr, "bench_matvec: triad result wrong\n");
    t.mode = TRIAD_READ;
    *rtm = best_of(triad_run, &run, cfg->reps, ecs_threadpool_size(tp));
    *read = 2.0 * (double)(t.n * sizeof(double)) / rtm->wall * 1e-9;
    free(t.a);
    free(t.b);
    free(t.c);
    return 3.0 * (double)cfg->triad_bytes / tm->wall * 1e-9;
}

/* ---- weights ---- */

/* A matrix of `bytes` of realistic blocks: a few distinct quantized rows
 * tiled through the buffer (the kernels' speed does not depend on values,
 * but NaNs or denormals from random bits could). */
static kcpu_mat_t make_matrix(ecs_type_t type, int64_t ncols, size_t bytes)
{
    const size_t rb = ecs_row_size(type, ncols);
    const int64_t nrows = (int64_t)(bytes / rb);
    uint8_t *data = xmalloc(rb * (size_t)nrows);
    enum { DISTINCT = 16 };
    float *x = xmalloc(sizeof(float) * (size_t)ncols);
    uint64_t s = 12345;
    for (int r = 0; r < DISTINCT && r < nrows; r++) {
        for (int64_t i = 0; i < ncols; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((double)(s >> 40) / (double)(1 << 24) - 0.5) * 0.1f;
        }
        ecs_quantize_row(type, x, data + (size_t)r * rb, ncols);
    }
    for (int64_t r = DISTINCT; r < nrows; r++)
        memcpy(data + (size_t)r * rb, data + (size_t)(r % DISTINCT) * rb, rb);
    free(x);
    kcpu_mat_t m = {type, ncols, nrows, rb, data, NULL};
    return m;
}

/* The row-interleaved copy of w (decode products read it), where the
 * type has one; false otherwise. */
static bool add_r16(kcpu_mat_t *w)
{
    const size_t bytes = kcpu_r16_bytes(w->type, w->nrows / KCPU_R16_ROWS * KCPU_R16_ROWS,
                                        w->ncols);
    if (!bytes || !kcpu_gemm(w->type).r16)
        return false;
    w->nrows = w->nrows / KCPU_R16_ROWS * KCPU_R16_ROWS;
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p)
        return false;
    kcpu_r16_pack(w, 0, w->nrows, p);
    w->r16 = p;
    return true;
}

static void *make_act(ecs_type_t type, int64_t ncols, int nb)
{
    float *x = xmalloc(sizeof(float) * (size_t)(ncols * nb));
    for (int64_t i = 0; i < ncols * nb; i++)
        x[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
    void *act = xmalloc(kcpu_act_bytes(type, ncols, nb));
    kcpu_quantize_rows(NULL, type, x, ncols, nb, ncols, act);
    free(x);
    return act;
}

typedef struct {
    ecs_threadpool_t *tp;
    const kcpu_mat_t *w;
    const void *act;
    int nb;
    float *y;
} mm_run_t;

static void mm_run(void *p)
{
    mm_run_t *r = p;
    kcpu_matmul_q(r->tp, r->w, r->act, r->nb, r->y, r->w->nrows);
}

static timing_t time_matmul(ecs_threadpool_t *tp, const kcpu_mat_t *w, const void *act, int nb,
                            float *y, int reps)
{
    mm_run_t run = {tp, w, act, nb, y};
    return best_of(mm_run, &run, reps, ecs_threadpool_size(tp));
}

static void bench_decode(ecs_threadpool_t *const *pools, const int *nths, int npools,
                         const double *triad, const double *read, const config_t *cfg)
{
    static const ecs_type_t types[] = {ECS_TYPE_Q4_K, ECS_TYPE_Q6_K, ECS_TYPE_Q5_0, ECS_TYPE_Q8_0};
    const int64_t ncols = 4096;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        kcpu_mat_t w = make_matrix(types[ti], ncols, cfg->weight_bytes);
        void *act = make_act(types[ti], ncols, 1);
        float *y = xmalloc(sizeof(float) * (size_t)w.nrows);
        for (int il = 0; il < 2; il++) { /* rows, then the interleaved copy */
            if (il && !add_r16(&w))
                break;
            for (int p = 0; p < npools; p++) {
                const timing_t tm = time_matmul(pools[p], &w, act, 1, y, cfg->reps);
                const size_t bytes =
                    il ? kcpu_r16_bytes(w.type, w.nrows, ncols) : w.row_bytes * (size_t)w.nrows;
                const double gbs = (double)bytes / tm.wall * 1e-9;
                printf("matvec  %-5s%s nb=1  threads=%d  %7.2f GB/s  %5.1f%% of triad  %5.1f%% of "
                       "read  (%lld x %lld, %.1f MB, %.2f ms)%s\n",
                       ecs_type_name(types[ti]), il ? "/r16" : "", nths[p], gbs,
                       100.0 * gbs / triad[p], 100.0 * gbs / read[p], (long long)w.nrows,
                       (long long)ncols,
                       (double)bytes / 1e6, tm.wall * 1e3, busy_note(tm));
                fflush(stdout);
            }
        }
        free((void *)w.data);
        free((void *)w.r16);
        free(act);
        free(y);
    }
}

/* ---- paired: each decode kernel against a triad run just before it ----
 * The host's memory speed moves by up to 2x within minutes here, so a
 * kernel's % of triad is taken per pair (triad best of reps, then the
 * kernel best of reps) and the median over PAIRED_ROUNDS pairs printed,
 * for the form decode reads: the interleaved copies of Q4_K, Q5_0 and
 * Q8_0, the rows of Q6_K. */
#define PAIRED_ROUNDS 9

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench_paired(ecs_threadpool_t *tp, int nth, const config_t *cfg)
{
    static const struct {
        ecs_type_t type;
        bool r16;
    } forms[] = {{ECS_TYPE_Q4_K, true}, {ECS_TYPE_Q5_0, true}, {ECS_TYPE_Q8_0, true},
                 {ECS_TYPE_Q6_K, false}};
    const int64_t ncols = 4096;
    triad_t t = {xmalloc(cfg->triad_bytes), xmalloc(cfg->triad_bytes), xmalloc(cfg->triad_bytes),
                 cfg->triad_bytes / sizeof(double), TRIAD_INIT, 0};
    ecs_threadpool_run(tp, triad_task, &t);
    t.mode = TRIAD_RUN;
    triad_run_t run = {tp, &t};
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        kcpu_mat_t w = make_matrix(forms[f].type, ncols, cfg->weight_bytes);
        void *act = make_act(forms[f].type, ncols, 1);
        float *y = xmalloc(sizeof(float) * (size_t)w.nrows);
        if (forms[f].r16 && !add_r16(&w)) {
            printf("paired  %-5s/r16: no interleaved copy for this shape\n",
                   ecs_type_name(forms[f].type));
        } else {
            const size_t bytes = forms[f].r16 ? kcpu_r16_bytes(w.type, w.nrows, ncols)
                                              : w.row_bytes * (size_t)w.nrows;
            double ratio[PAIRED_ROUNDS], kg[PAIRED_ROUNDS], tg[PAIRED_ROUNDS];
            for (int r = 0; r < PAIRED_ROUNDS; r++) {
                const timing_t ttm = best_of(triad_run, &run, cfg->reps, nth);
                const timing_t ktm = time_matmul(tp, &w, act, 1, y, cfg->reps);
                tg[r] = 3.0 * (double)cfg->triad_bytes / ttm.wall * 1e-9;
                kg[r] = (double)bytes / ktm.wall * 1e-9;
                ratio[r] = kg[r] / tg[r];
            }
            qsort(ratio, PAIRED_ROUNDS, sizeof *ratio, cmp_double);
            qsort(kg, PAIRED_ROUNDS, sizeof *kg, cmp_double);
            qsort(tg, PAIRED_ROUNDS, sizeof *tg, cmp_double);
            printf("paired  %-5s%s threads=%d  median %5.1f%% of triad (%.1f-%.1f %%, %d pairs)  "
                   "kernel %.2f GB/s, triad %.2f GB/s (medians)\n",
                   ecs_type_name(forms[f].type), forms[f].r16 ? "/r16" : "    ", nth,
                   100.0 * ratio[PAIRED_ROUNDS / 2], 100.0 * ratio[0],
                   100.0 * ratio[PAIRED_ROUNDS - 1], PAIRED_ROUNDS, kg[PAIRED_ROUNDS / 2],
                   tg[PAIRED_ROUNDS / 2]);
            fflush(stdout);
        }
        free((void *)w.data);
        free((void *)w.r16);
        free(act);
        free(y);
    }
    free(t.a);
    free(t.b);
    free(t.c);
}

static void bench_batch(ecs_threadpool_t *const *pools, const int *nths, int npools,
                        const config_t *cfg)
{
    static const ecs_type_t types[] = {ECS_TYPE_Q4_K, ECS_TYPE_Q8_0};
    static const int nbs[] = {1, 8, 32};
    const int64_t ncols = 4096, nrows = cfg->weight_bytes >= (64u << 20) ? 4096 : 1024;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const kcpu_mat_t w =
            make_matrix(types[ti], ncols, ecs_row_size(types[ti], ncols) * (size_t)nrows);
        void *act = make_act(types[ti], ncols, 32);
        float *y = xmalloc(sizeof(float) * (size_t)(w.nrows * 32));
        for (int p = 0; p < npools; p++) {
            double per_row1 = 0;
            for (size_t bi = 0; bi < sizeof(nbs) / sizeof(nbs[0]); bi++) {
                const int nb = nbs[bi];
                const timing_t tm = time_matmul(pools[p], &w, act, nb, y, cfg->reps * 2);
                const double dt = tm.wall, per_row = dt / nb;
                if (nb == 1)
                    per_row1 = per_row;
                printf("batch   %-5s nb=%-2d threads=%d  %7.1f GOP/s  %9.0f act-rows/s  "
                       "%5.2f ms/call  %4.1fx faster per row than nb=1%s\n",
                       ecs_type_name(types[ti]), nb, nths[p],
                       2.0 * (double)w.nrows * (double)ncols * nb / dt * 1e-9, nb / dt, dt * 1e3,
                       per_row1 / per_row, busy_note(tm));
                fflush(stdout);
            }
        }
        free((void *)w.data);
        free(act);
        free(y);
    }
}

/* Compute ceiling of every kernel: one thread, weights resident in L2, so
 * memory bandwidth is out of the picture. Short runs, best of many: robust
 * against a busy machine. */
static void bench_kernels(void)
{
    static const ecs_type_t types[] = {
        ECS_TYPE_F32,  ECS_TYPE_F16,  ECS_TYPE_BF16, ECS_TYPE_Q4_0, ECS_TYPE_Q4_1,
        ECS_TYPE_Q5_0, ECS_TYPE_Q5_1, ECS_TYPE_Q8_0, ECS_TYPE_Q2_K, ECS_TYPE_Q3_K,
        ECS_TYPE_Q4_K, ECS_TYPE_Q5_K, ECS_TYPE_Q6_K,
    };
    const int64_t ncols = 4096, nrows = 64;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        kcpu_mat_t w = make_matrix(types[ti], ncols, ecs_row_size(types[ti], ncols) * nrows);
        void *act = make_act(types[ti], ncols, 4);
        float *y = xmalloc(sizeof(float) * (size_t)(nrows * 4));
        printf("kernel  %-5s", ecs_type_name(types[ti]));
        for (int nb = 1; nb <= 4; nb += 3) {
            const double dt = time_matmul(NULL, &w, act, nb, y, 200).wall;
            printf("  nb=%d %6.2f GB/s %5.2f ns/256 values/row", nb,
                   (double)(w.row_bytes * (size_t)nrows) / dt * 1e-9,
                   dt * 1e9 / ((double)(nrows * ncols) / 256 * nb));
        }
        if (add_r16(&w)) {
            const double dt = time_matmul(NULL, &w, act, 1, y, 200).wall;
            printf("  r16 nb=1 %6.2f GB/s %5.2f ns/256 values/row",
                   (double)kcpu_r16_bytes(w.type, nrows, ncols) / dt * 1e-9,
                   dt * 1e9 / ((double)(nrows * ncols) / 256));
        }
        printf("\n");
        fflush(stdout);
        free((void *)w.data);
        free((void *)w.r16);
        free(act);
        free(y);
    }
}

/* The copy of w for nb = 48 rows (an expert's share of a 512-token prompt),
 * one thread: from cache (one matrix again and again) and from DRAM (COLD_COPIES
 * copies in 2 MB pages, round robin, as a prompt step meets each expert's
 * weights once), GOP/s. */
#define COLD_COPIES 40
#define COLD_NB 48
static void bench_prefill_cold(const kcpu_mat_t *w, const void *act, float *y, int reps)
{
    const size_t bytes = kcpu_r16_bytes(w->type, w->nrows, w->ncols);
    const size_t huge = (size_t)2 << 20, alloc = (bytes + huge - 1) / huge * huge;
    kcpu_mat_t c[COLD_COPIES];
    int n = 0;
    for (; n < COLD_COPIES; n++) {
        void *p = aligned_alloc(huge, alloc);
        if (!p)
            break;
        madvise(p, alloc, MADV_HUGEPAGE);
        memcpy(p, w->r16, bytes);
        c[n] = *w;
        c[n].r16 = p;
    }
    const double ops = 2.0 * (double)w->nrows * (double)w->ncols * COLD_NB;
    const timing_t warm = time_matmul(NULL, w, act, COLD_NB, y, reps);
    double t = 0;
    for (int r = 0; r < 6; r++) /* the first round brings the copies to the page tables */
        for (int i = 0; i < n; i++) {
            const double t0 = clock_s(CLOCK_MONOTONIC);
            kcpu_matmul_q(NULL, &c[i], act, COLD_NB, y, w->nrows);
            if (r)
                t += clock_s(CLOCK_MONOTONIC) - t0;
        }
    printf("prefill %-5s %4lld x %4lld copy nb=%d threads=1  GOP/s: cached %.0f, from DRAM "
           "%.0f (%d copies round robin)\n",
           ecs_type_name(w->type), (long long)w->nrows, (long long)w->ncols, COLD_NB,
           ops / warm.wall * 1e-9, n ? ops * 5 * n / t * 1e-9 : 0.0, n);
    for (int i = 0; i < n; i++)
        free((void *)c[i].r16);
}

/* Prompt-processing shapes of DeepSeek-V2-Lite Q4_K_M (n_embd 2048, expert
 * n_ff 1408, two shared experts = 2816) for nb = 1 .. 64 activation rows
 * (an expert gets ~6 rows of a 64-token chunk): GOP/s at 1 thread (per
 * core) and 2. The matrices (1-3 MB) live in L2/L3, as an expert's weights
 * do while the rows of a prefill chunk go through it. */
static void bench_prefill(ecs_threadpool_t *const *pools, const int *nths, int npools, int reps)
{
    static const struct {
        ecs_type_t type;
        int64_t nrows, ncols;
        const char *what;
    } shapes[] = {
        {ECS_TYPE_Q4_K, 1408, 2048, "expert gate/up"},
        {ECS_TYPE_Q5_0, 2048, 1408, "expert down"},
        {ECS_TYPE_Q8_0, 2048, 1408, "expert down"},
        {ECS_TYPE_Q6_K, 2048, 2816, "shared down"},
    };
    static const int nbs[] = {1, 4, 6, 8, 16, 32, 64};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const ecs_type_t t = shapes[si].type;
        const int64_t nrows = shapes[si].nrows, ncols = shapes[si].ncols;
        kcpu_mat_t w = make_matrix(t, ncols, ecs_row_size(t, ncols) * (size_t)nrows);
        void *act = make_act(t, ncols, 64);
        float *y = xmalloc(sizeof(float) * (size_t)(nrows * 64));
        /* without, then with the decode copy (products of the types that
         * have one read it for any nb) */
        for (int run = 0; run < 2 * npools; run++) {
            const int p = run % npools;
            if (run == npools && !add_r16(&w))
                break;
            printf("prefill %-5s %4lld x %4lld %-14s %-5s threads=%d  GOP/s:", ecs_type_name(t),
                   (long long)nrows, (long long)ncols, shapes[si].what, w.r16 ? "copy" : "rows",
                   nths[p]);
            timing_t all = {0, 0, 0}; /* CPU share over the whole line */
            for (size_t bi = 0; bi < sizeof(nbs) / sizeof(nbs[0]); bi++) {
                const timing_t tm = time_matmul(pools[p], &w, act, nbs[bi], y, reps);
                printf(" nb=%d %.0f", nbs[bi],
                       2.0 * (double)nrows * (double)ncols * nbs[bi] / tm.wall * 1e-9);
                all.share += tm.share * tm.total;
                all.total += tm.total;
            }
            all.share /= all.total;
            printf("%s\n", busy_note(all));
            fflush(stdout);
        }
        if (w.r16)
            bench_prefill_cold(&w, act, y, reps);
        free((void *)w.data);
        free((void *)w.r16);
        free(act);
        free(y);
    }
}

/* ---- thread pool overhead ---- */

/* ms per call of one thread over nmat matrices of one expert shape, from
 * the rows and from the decode copy, for 1-3 activation rows. */
typedef struct {
    const kcpu_mat_t *w;
    int nmat, nb, copy;
    const void *act;
    float *y;
} copy_run_t;

static void copy_run(void *p)
{
    const copy_run_t *r = p;
    for (int i = 0; i < r->nmat; i++) {
        kcpu_mat_t v = r->w[i];
        if (!r->copy)
            v.r16 = NULL;
        kcpu_matmul_q(NULL, &v, r->act, r->nb, r->y, v.nrows);
    }
}

static void bench_copy(int reps)
{
    static const struct {
        ecs_type_t type;
        int64_t nrows, ncols;
    } shapes[] = {{ECS_TYPE_Q4_K, 1408, 2048}, {ECS_TYPE_Q5_0, 2048, 1408},
                  {ECS_TYPE_Q8_0, 2048, 1408}};
    static const int nmats[] = {1, 40};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const ecs_type_t t = shapes[si].type;
        const int64_t nrows = shapes[si].nrows, ncols = shapes[si].ncols;
        kcpu_mat_t w[40];
        bool ok = true;
        for (int i = 0; i < 40; i++) {
            w[i] = make_matrix(t, ncols, ecs_row_size(t, ncols) * (size_t)nrows);
            ok = ok && add_r16(&w[i]);
        }
        void *act = make_act(t, ncols, 3);
        float *y = xmalloc(sizeof(float) * (size_t)nrows * 3);
        for (size_t mi = 0; ok && mi < sizeof nmats / sizeof nmats[0]; mi++) {
            printf("copy    %-5s %4lld x %4lld x %-2d ms/call rows -> copy:", ecs_type_name(t),
                   (long long)nrows, (long long)ncols, nmats[mi]);
            for (int nb = 1; nb <= 3; nb++) {
                double ms[2];
                for (int c = 0; c < 2; c++) {
                    copy_run_t r = {w, nmats[mi], nb, c, act, y};
                    ms[c] = best_of(copy_run, &r, reps, 1).wall * 1e3;
                }
                printf("  nb=%d %.3f -> %.3f", nb, ms[0], ms[1]);
            }
            printf("\n");
            fflush(stdout);
        }
        if (!ok)
            printf("copy    %-5s: no decode copy on this ISA\n", ecs_type_name(t));
        for (int i = 0; i < 40; i++) {
            free((void *)w[i].data);
            free((void *)w[i].r16);
        }
        free(act);
        free(y);
    }
}

static void empty_task(void *arg, int ith, int nth)
{
    (void)arg, (void)ith, (void)nth;
}

/* Spins for about us microseconds (serial work between two pool calls, or
 * a share's work). */
static void busy_us(double us)
{
    const double end = clock_s(CLOCK_MONOTONIC) + us * 1e-6;
    while (clock_s(CLOCK_MONOTONIC) < end)
        ;
}

static void work_task(void *arg, int ith, int nth)
{
    busy_us(*(const double *)arg);
    (void)ith, (void)nth;
}

typedef struct {
    ecs_threadpool_t *tp;
    int calls;
    double gap_us;  /* serial work between calls */
    double work_us; /* each share's work */
} pool_run_t;

static void pool_run(void *p)
{
    pool_run_t *r = p;
    for (int i = 0; i < r->calls; i++) {
        if (r->gap_us > 0)
            busy_us(r->gap_us);
        if (r->work_us > 0)
            ecs_threadpool_run(r->tp, work_task, &r->work_us);
        else
            ecs_threadpool_run(r->tp, empty_task, NULL);
    }
}

/* What one ecs_threadpool_run costs beyond its shares' work: back to back;
 * after a short serial gap (workers still spinning, as between the kernel
 * calls of a decode step); after a gap longer than the spin window
 * (workers asleep: a futex wake); and with 2 us of work per share. */
static void bench_pool(ecs_threadpool_t *const *pools, const int *nths, int npools)
{
    static const struct {
        const char *what;
        double gap_us, work_us;
        int calls;
    } cases[] = {
        {"back to back    ", 0, 0, 20000},
        {"after 20 us gap ", 20, 0, 2000},
        {"after 500 us gap", 500, 0, 100},
        {"2 us per share  ", 0, 2, 5000},
    };
    for (int p = 0; p < npools; p++) {
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            pool_run_t run = {pools[p], cases[c].calls, cases[c].gap_us, cases[c].work_us};
            const timing_t tm = best_of(pool_run, &run, 5, 1);
            printf("pool    %s threads=%d  %7.2f us/call overhead\n", cases[c].what, nths[p],
                   (tm.wall / run.calls - (cases[c].gap_us + cases[c].work_us) * 1e-6) * 1e6);
        }
        fflush(stdout);
    }
}

/* ---- activation quantization ---- */

typedef struct {
    ecs_type_t vdt;
    const float *x;
    void *out;
    int64_t n;
    int rows;
} quant_run_t;

static void quant_run(void *ctx)
{
    const quant_run_t *q = ctx;
    const size_t row = ecs_row_size(q->vdt, q->n);
    for (int r = 0; r < q->rows; r++)
        kcpu_quantize_act(q->vdt, q->x + (size_t)r * (size_t)q->n, (char *)q->out + (size_t)r * row,
                          q->n);
}

/* ns per 256 values of kcpu_quantize_act, one thread: 64 rows of 2048
 * values (512 KB, in L2), and 512 rows (4 MB, a prompt step's rows, from
 * L3 and beyond). */
static void bench_quant(int reps)
{
    static const ecs_type_t vdts[] = {ECS_TYPE_Q8_0, ECS_TYPE_Q8_K};
    const int64_t n = 2048;
    float *x = xmalloc(sizeof(float) * (size_t)(n * 512));
    for (int64_t i = 0; i < n * 512; i++)
        x[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
    for (size_t v = 0; v < sizeof(vdts) / sizeof(vdts[0]); v++) {
        void *out = xmalloc(ecs_row_size(vdts[v], n) * 512);
        printf("quant   %-5s threads=1  ns per 256 values:", ecs_type_name(vdts[v]));
        for (int rows = 64; rows <= 512; rows *= 8) {
            quant_run_t q = {vdts[v], x, out, n, rows};
            const timing_t tm = best_of(quant_run, &q, reps, 1);
            printf(" %d rows %.1f", rows, tm.wall * 1e9 / ((double)rows * (double)n / 256.0));
        }
        printf("\n");
        fflush(stdout);
        free(out);
    }
    free(x);
}

static bool wanted(const char *only, const char *section)
{
    return !only || strcmp(only, section) == 0;
}

int main(int argc, char **argv)
{
    config_t cfg = {128u << 20, 400u << 20, 5};
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            cfg.triad_bytes = 16u << 20;
            cfg.weight_bytes = 32u << 20;
            cfg.reps = 2;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: %s [--quick] "
                    "[--only triad|matvec|paired|batch|kernel|prefill|copy|pool|quant]\n",
                    argv[0]);
            return 2;
        }
    }
    char model[256];
    cpu_model(model, sizeof model);
    double load = -1;
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fscanf(lf, "%lf", &load) != 1)
            load = -1;
        fclose(lf);
    }
    printf("bench_matvec: cpu \"%s\", isa %s, triad 3 x %zu MB, weights %zu MB per matrix, "
           "load average %.2f\n",
           model, kcpu_isa_name(kcpu_isa()), cfg.triad_bytes >> 20, cfg.weight_bytes >> 20, load);

    enum { NPOOLS = 2 };
    const int nths[NPOOLS] = {1, 2};
    ecs_threadpool_t *pools[NPOOLS];
    for (int p = 0; p < NPOOLS; p++) {
        if (ecs_threadpool_create(nths[p], &pools[p]) != ECS_OK) {
            fprintf(stderr, "bench_matvec: %s\n", ecs_errmsg());
            return 1;
        }
    }
    double triad[NPOOLS], read[NPOOLS];
    if (wanted(only, "triad") || wanted(only, "matvec")) {
        for (int p = 0; p < NPOOLS; p++) {
            timing_t tm, rtm;
            triad[p] = triad_gbs(pools[p], &cfg, &tm, &read[p], &rtm);
            printf("triad   threads=%d  %7.2f GB/s%s\n", nths[p], triad[p], busy_note(tm));
            printf("read    threads=%d  %7.2f GB/s%s\n", nths[p], read[p], busy_note(rtm));
            fflush(stdout);
        }
    }
    if (wanted(only, "matvec"))
        bench_decode(pools, nths, NPOOLS, triad, read, &cfg);
    if (wanted(only, "paired"))
        bench_paired(pools[NPOOLS - 1], nths[NPOOLS - 1], &cfg);
    if (wanted(only, "batch"))
        bench_batch(pools, nths, NPOOLS, &cfg);
    if (wanted(only, "kernel"))
        bench_kernels();
    if (wanted(only, "prefill"))
        bench_prefill(pools, nths, NPOOLS, cfg.reps * 4);
    if (wanted(only, "copy"))
        bench_copy(cfg.reps * 4);
    if (wanted(only, "pool"))
        bench_pool(pools, nths, NPOOLS);
    if (wanted(only, "quant"))
        bench_quant(cfg.reps * 4);
    for (int p = 0; p < NPOOLS; p++)
        ecs_threadpool_destroy(pools[p]);
    return 0;
}
