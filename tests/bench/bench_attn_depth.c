/* bench_attn_depth.c - the decode attention core of one ds2-lite layer at
 * depth (16 query heads against T cached latent rows [c 512 | k_pe 64]),
 * one thread, with the model_simd() kernels in the two orders the decode
 * key split (attn.c) has used:
 *   two-pass: scores for all keys, softmax, then P.V re-reading the cache
 *             64 value columns at a time (the split before 2026-12-02 03:40);
 *   one-pass: per block of MODEL_SPLIT_KEYS keys scores, block softmax and
 *             P.V while the block is in L2, then the blocks merged (as
 *             attn.c: the weights, then model_simd_t.wsum).
 * The caches rotate over NC layers (27 x 4.7 MB at T 4096 in BF16: more
 * than L3, as on the full model); ns per key and query head, best and
 * median of the repetitions. Timing only: the bits are test_attn's.
 * With TH > 1 the one pass also runs on a pool of TH threads as attn.c
 * runs it (kcpu_par_for over the blocks, then over the queries for the
 * merge), alternating with 1 thread in the same process, and says where
 * the threads' time went (busy in items, the merge, the rest waiting).
 *
 * With "amx" (BF16 only) the one pass's two products run on the tile unit
 * (attn_amx.c, as attn.c on a CPU with AMX-BF16) instead of model_simd().
 *
 * A third pass, alternating with the two, only reads each layer's cache
 * (512-bit loads, summed): the memory's floor for the same bytes, so the
 * one pass's distance from the memory is read off in one run.
 *
 * usage: bench_attn_depth [T] [bf16|f16] [NC] [REPS] [B: keys per block] [TH] [amx|vec] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>

#include "common/threadpool.h"
#include "coordinator/model/model_int.h"
#include "kernels/cpu/cpu.h"

#define NQ 16
#define DK 576
#define DV 512


/* Query j's merge of nb blocks (O: per block NQ rows of DV, the max, the
 * sum), as attn.c's split_merge: the weights, then model_simd_t.wsum. */
static void merge(const model_simd_t *sd, const float *O, int nb, int j, float *out)
{
    const size_t bs = (size_t)NQ * (DV + 2);
    float w[1024];
    float M = -INFINITY;
    double L = 0.0;
    for (int b = 0; b < nb; b++)
        M = fmaxf(M, O[b * bs + NQ * DV + j]);
    for (int b = 0; b < nb; b++) {
        w[b] = expf(O[b * bs + NQ * DV + j] - M);
        L += (double)w[b] * O[b * bs + NQ * DV + NQ + j];
    }
    sd->wsum(out + (size_t)j * DV, DV, O + (size_t)j * DV, bs, w, nb, (float)(1.0 / L));
}

#define MAXTH 8

static bool use_amx; /* the one pass's products on the tile unit */
static void *amx_stage[MAXTH];

/* One block's scores into S (rows B + 16 apart), as attn.c's block. */
static void block_scores(const model_simd_t *sd, model_kvt_t kt, const float *QT, const char *K,
                         int n, float scale, float *S, int B, float *kbuf)
{
    if (use_amx)
        model_amx_scores(QT, NQ, K, DK, DK, n, scale, S, B + 16, kbuf);
    else
        sd->scores_t(QT, NQ, K, DK, kt, DK, n, scale, S, B + 16, kbuf);
}

/* Its P.V into Ob (NQ rows of DV). */
static void block_pv(const model_simd_t *sd, model_kvt_t kt, const float *S, int B, const char *K,
                     int n, const int *rl, float *Ob, int ith)
{
    if (use_amx) {
        const void *vr[1] = {K};
        model_amx_pv(S, NQ, B + 16, vr, &n, 1, DK, DV, Ob, DV, false, amx_stage[ith]);
    } else {
        sd->pv(S, NQ, B + 16, K, DK, kt, DV, rl, Ob, DV, false);
    }
}

/* The pool's run of one layer's one pass: blocks, then the merge. */
typedef struct {
    const model_simd_t *sd;
    model_kvt_t kt;
    const char *K;
    const float *QT;
    int T, B, nb;
    float scale;
    float *S[MAXTH], *kbuf[MAXTH], *O, *out;
    double busy[MAXTH]; /* seconds inside block items, per thread */
    int items[MAXTH];
} pool_run_t;

static double now(void);

static void pool_block(void *arg, int b, int ith)
{
    pool_run_t *p = arg;
    const double a = now();
    const int t0 = b * p->B, n = p->T - t0 < p->B ? p->T - t0 : p->B;
    float *Ob = p->O + (size_t)b * NQ * (DV + 2), *mx = Ob + NQ * DV;
    int rl[NQ];
    for (int j = 0; j < NQ; j++)
        rl[j] = n;
    block_scores(p->sd, p->kt, p->QT, p->K + (size_t)t0 * DK * 2, n, p->scale, p->S[ith], p->B,
                 p->kbuf[ith]);
    p->sd->softmax(p->S[ith], NQ, p->B + 16, rl, n, p->kt, mx, mx + NQ);
    block_pv(p->sd, p->kt, p->S[ith], p->B, p->K + (size_t)t0 * DK * 2, n, rl, Ob, ith);
    p->busy[ith] += now() - a;
    p->items[ith]++;
}

static void pool_merge(void *arg, int j, int ith)
{
    const pool_run_t *p = arg;
    (void)ith;
    merge(p->sd, p->O, p->nb, j, p->out);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmpd(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The one pass of NC layers at 1 and th threads, alternating per rep. */
static int pool_bench(const model_simd_t *sd, model_kvt_t kt, const char *kv, const float *QT,
                      int T, int B, int NC, int REPS, int th, float scale, float *O, float *out)
{
    ecs_threadpool_t *tp = NULL;
    if (ecs_threadpool_create(th, &tp) != ECS_OK) {
        fprintf(stderr, "bench_attn_depth: no thread pool\n");
        return 1;
    }
    pool_run_t p = {.sd = sd, .kt = kt, .QT = QT, .T = T, .B = B, .nb = (T + B - 1) / B,
                    .scale = scale, .O = O, .out = out};
    for (int i = 0; i < th; i++) {
        p.S[i] = aligned_alloc(64, (size_t)NQ * (B + 16) * sizeof(float));
        p.kbuf[i] = aligned_alloc(64, (size_t)16 * DK * sizeof(float));
        if (!p.S[i] || !p.kbuf[i]) {
            fprintf(stderr, "bench_attn_depth: out of memory\n");
            return 1;
        }
    }
    double *tm[2], blk = 0, mrg = 0, busy = 0, bmax = 0;
    int items[MAXTH] = {0};
    for (int v = 0; v < 2; v++)
        tm[v] = malloc((size_t)REPS * sizeof(double));
    for (int r = 0; r < REPS; r++)
        for (int v = 0; v < 2; v++) {
            ecs_threadpool_t *pool = v ? tp : NULL;
            memset(p.items, 0, sizeof p.items);
            const double t0 = now();
            for (int c = 0; c < NC; c++) {
                p.K = kv + (size_t)c * T * DK * 2;
                memset(p.busy, 0, sizeof p.busy);
                const double a = now();
                kcpu_par_for(pool, p.nb, pool_block, &p);
                const double b = now();
                kcpu_par_for(pool, NQ, pool_merge, &p);
                if (v) {
                    blk += b - a, mrg += now() - b;
                    double mx = 0;
                    for (int i = 0; i < th; i++)
                        busy += p.busy[i], mx = p.busy[i] > mx ? p.busy[i] : mx;
                    bmax += mx;
                }
            }
            tm[v][r] = (now() - t0) / NC;
            if (v)
                for (int i = 0; i < th; i++)
                    items[i] += p.items[i];
        }
    double sum[2] = {0, 0};
    for (int v = 0; v < 2; v++)
        for (int r = 0; r < REPS; r++)
            sum[v] += tm[v][r];
    printf("  pool, %d blocks a layer, 1 vs %d threads alternating:\n", p.nb, th);
    for (int v = 0; v < 2; v++) {
        qsort(tm[v], (size_t)REPS, sizeof(double), cmpd);
        printf("    %d thread(s) ms/layer best %.3f median %.3f mean %.3f\n", v ? th : 1,
               1e3 * tm[v][0], 1e3 * tm[v][REPS / 2], 1e3 * sum[v] / REPS);
    }
    const double n = (double)REPS * NC;
    printf("    %d threads: speed-up best %.2f median %.2f; per layer: blocks region %.3f ms, "
           "merge region %.3f ms, busy in blocks %.3f ms of %d threads (slowest thread %.3f), "
           "items per thread",
           th, tm[0][0] / tm[1][0], tm[0][REPS / 2] / tm[1][REPS / 2], 1e3 * blk / n, 1e3 * mrg / n,
           1e3 * busy / n, th, 1e3 * bmax / n);
    for (int i = 0; i < th; i++)
        printf(" %.1f", items[i] / n);
    printf("\n");
    for (int i = 0; i < th; i++)
        free(p.S[i]), free(p.kbuf[i]);
    free(tm[0]), free(tm[1]);
    ecs_threadpool_destroy(tp);
    return 0;
}

/* Every byte of n at p, four chains of 512-bit loads (the floor); the
 * checksum keeps the loads. */
__attribute__((target("avx512f"))) static int read_floor(const char *p, size_t n)
{
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
    for (size_t i = 0; i + 256 <= n; i += 256)
        for (int j = 0; j < 4; j++)
            a[j] = _mm512_add_epi32(a[j], _mm512_load_si512(p + i + 64 * j));
    return _mm512_reduce_add_epi32(
        _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3])));
}

int main(int argc, char **argv)
{
    const int T = argc > 1 ? atoi(argv[1]) : 4096;
    const model_kvt_t kt = argc > 2 && !strcmp(argv[2], "f16") ? MODEL_KV_F16 : MODEL_KV_BF16;
    const int NC = argc > 3 ? atoi(argv[3]) : 27, REPS = argc > 4 ? atoi(argv[4]) : 10;
    const int B = argc > 5 ? atoi(argv[5]) : MODEL_SPLIT_KEYS;
    const int TH = argc > 6 ? atoi(argv[6]) : 1;
    use_amx = argc > 7 && !strcmp(argv[7], "amx");
    if (use_amx && (kt != MODEL_KV_BF16 || !model_cpu_amx())) {
        fprintf(stderr, "bench_attn_depth: amx needs a bf16 cache and a CPU with AMX-BF16\n");
        return 2;
    }
    for (int i = 0; i < MAXTH; i++)
        if (use_amx && !(amx_stage[i] = aligned_alloc(64, model_amx_pv_stage(NQ, B, DV)))) {
            fprintf(stderr, "bench_attn_depth: out of memory\n");
            return 1;
        }
    if (T < 16 || NC < 1 || REPS < 1 || B < 16 || B % 16 || TH < 1 || TH > MAXTH ||
        (T + B - 1) / B > 1024) {
        fprintf(stderr, "usage: bench_attn_depth [T] [bf16|f16] [NC] [REPS] [B] [TH]\n");
        return 2;
    }
    const model_simd_t *sd = model_simd();
    const size_t row = (size_t)DK * 2, tp = (size_t)(T + 15) & ~(size_t)15;
    const int nb = (T + B - 1) / B;
    char *kv = aligned_alloc(64, (size_t)NC * T * row);
    float *QT = aligned_alloc(64, (size_t)NQ * DK * sizeof(float));
    float *S = aligned_alloc(64, (size_t)NQ * ((tp > (size_t)B ? tp : (size_t)B) + 16) * sizeof(float));
    float *kbuf = aligned_alloc(64, (size_t)16 * DK * sizeof(float));
    float *O = aligned_alloc(64, (size_t)nb * NQ * (DV + 2) * sizeof(float));
    float *out = aligned_alloc(64, (size_t)NQ * DV * sizeof(float));
    float *q = malloc((size_t)DK * sizeof(float));
    if (!kv || !QT || !S || !kbuf || !O || !out || !q) {
        fprintf(stderr, "bench_attn_depth: out of memory\n");
        return 1;
    }
    srand(1);
    float x[DK];
    for (size_t t = 0; t < (size_t)NC * T; t++) {
        for (int d = 0; d < DK; d++)
            x[d] = (float)rand() / RAND_MAX - 0.5f;
        if (kt == MODEL_KV_BF16)
            sd->to_bf16((ecs_bf16_t *)(kv + t * row), x, DK);
        else
            sd->to_f16((ecs_fp16_t *)(kv + t * row), x, DK);
    }
    memset(QT, 0, (size_t)NQ * DK * sizeof(float));
    for (int j = 0; j < NQ; j++) {
        for (int d = 0; d < DK; d++)
            q[d] = (float)rand() / RAND_MAX - 0.5f;
        if (kt == MODEL_KV_BF16) {
            ecs_bf16_t qb[DK];
            sd->to_bf16(qb, q, DK);
            model_qt_bf16(QT, j, DK, qb);
        } else {
            for (int d = 0; d < DK; d++)
                QT[(size_t)d * 16 + j] = q[d];
        }
    }
    int len[NQ], rl[NQ];
    for (int j = 0; j < NQ; j++)
        len[j] = T;
    const float scale = 1.0f / sqrtf(192.0f);
    double *tm[3], ph[3] = {0, 0, 0}; /* one-pass: scores, softmax, P.V */
    for (int v = 0; v < 3; v++)
        if (!(tm[v] = malloc((size_t)REPS * sizeof(double)))) {
            fprintf(stderr, "bench_attn_depth: out of memory\n");
            return 1;
        }
    unsigned rd = 0;
    for (int r = 0; r < REPS; r++)
        for (int v = 0; v < 3; v++) {
            const double t0 = now();
            for (int c = 0; c < NC; c++) {
                const char *K = kv + (size_t)c * T * row;
                if (v == 2) {
                    rd += (unsigned)read_floor(K, (size_t)T * row);
                } else if (v == 0) {
                    for (int t = 0; t < T; t += 512)
                        sd->scores_t(QT, NQ, K + (size_t)t * row, DK, kt, DK,
                                     T - t < 512 ? T - t : 512, scale, S + t, (int)tp, kbuf);
                    sd->softmax(S, NQ, (int)tp, len, T, kt, NULL, NULL);
                    for (int d0 = 0; d0 < DV; d0 += 64)
                        sd->pv(S, NQ, (int)tp, K + (size_t)d0 * 2, DK, kt, 64, len, out + d0, DV,
                               false);
                } else {
                    for (int b = 0; b < nb; b++) {
                        const int t0b = b * B, n = T - t0b < B ? T - t0b : B;
                        float *Ob = O + (size_t)b * NQ * (DV + 2), *mx = Ob + NQ * DV;
                        const double a = now();
                        block_scores(sd, kt, QT, K + (size_t)t0b * row, n, scale, S, B, kbuf);
                        for (int j = 0; j < NQ; j++)
                            rl[j] = n;
                        const double b1 = now();
                        sd->softmax(S, NQ, B + 16, rl, n, kt, mx, mx + NQ);
                        const double b2 = now();
                        block_pv(sd, kt, S, B, K + (size_t)t0b * row, n, rl, Ob, 0);
                        ph[0] += b1 - a, ph[1] += b2 - b1, ph[2] += now() - b2;
                    }
                    for (int j = 0; j < NQ; j++)
                        merge(sd, O, nb, j, out);
                }
            }
            tm[v][r] = (now() - t0) / NC;
        }
    printf("bench_attn_depth: T %d, %s cache, %d layers rotated (%.1f MB each), %d reps, blocks of %d keys, 1 thread, one pass on %s\n",
           T, kt == MODEL_KV_BF16 ? "bf16" : "f16", NC, (double)T * row / 1e6, REPS, B,
           use_amx ? "the tile unit (AMX)" : "vector kernels");
    for (int v = 0; v < 3; v++) {
        qsort(tm[v], (size_t)REPS, sizeof(double), cmpd);
        printf("  %-9s ms/layer best %.3f median %.3f  ns/key/head best %.2f median %.2f\n",
               v == 2 ? "read" : v ? "one-pass" : "two-pass", 1e3 * tm[v][0],
               1e3 * tm[v][REPS / 2], 1e9 * tm[v][0] / T / NQ, 1e9 * tm[v][REPS / 2] / T / NQ);
    }
    printf("  one-pass / read (median): %.2f; read %.1f GB/s (median; checksum %u)\n",
           tm[1][REPS / 2] / tm[2][REPS / 2], (double)T * row / tm[2][REPS / 2] / 1e9,
           rd & 1);
    const double all = ph[0] + ph[1] + ph[2];
    printf("  one-pass shares: scores %.0f %%, block softmax %.0f %%, P.V %.0f %% (the rest: the merge)\n",
           100 * ph[0] / all, 100 * ph[1] / all, 100 * ph[2] / all);
    if (TH > 1 && pool_bench(sd, kt, kv, QT, T, B, NC, REPS, TH, scale, O, out) != 0)
        return 1;
    free(tm[0]), free(tm[1]), free(tm[2]), free(q), free(out), free(O), free(kbuf), free(S), free(QT), free(kv);
    return 0;
}
