/* bench_attn_depth.c - the decode attention core of one ds2-lite layer at
 * depth (16 query heads against T cached latent rows [c 512 | k_pe 64]),
 * one thread, with the model_simd() kernels in the two orders the decode
 * key split (attn.c) has used:
 *   two-pass: scores for all keys, softmax, then P.V re-reading the cache
 *             64 value columns at a time (the split before 2026-12-02 03:40);
 *   one-pass: per block of MODEL_SPLIT_KEYS keys scores, block softmax and
 *             P.V while the block is in L2, then the blocks merged.
 * The caches rotate over NC layers (27 x 4.7 MB at T 4096 in BF16: more
 * than L3, as on the full model); ns per key and query head, best and
 * median of the repetitions. Timing only: the bits are test_attn's.
 *
 * usage: bench_attn_depth [T] [bf16|f16] [NC] [REPS] [B: keys per block] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator/model/model_int.h"

#define NQ 16
#define DK 576
#define DV 512

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

int main(int argc, char **argv)
{
    const int T = argc > 1 ? atoi(argv[1]) : 4096;
    const model_kvt_t kt = argc > 2 && !strcmp(argv[2], "f16") ? MODEL_KV_F16 : MODEL_KV_BF16;
    const int NC = argc > 3 ? atoi(argv[3]) : 27, REPS = argc > 4 ? atoi(argv[4]) : 10;
    const int B = argc > 5 ? atoi(argv[5]) : MODEL_SPLIT_KEYS;
    if (T < 16 || NC < 1 || REPS < 1 || B < 16 || B % 16) {
        fprintf(stderr, "usage: bench_attn_depth [T] [bf16|f16] [NC] [REPS] [B]\n");
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
    double *tm[2], ph[3] = {0, 0, 0}; /* one-pass: scores, softmax, P.V */
    for (int v = 0; v < 2; v++)
        tm[v] = malloc((size_t)REPS * sizeof(double));
    for (int r = 0; r < REPS; r++)
        for (int v = 0; v < 2; v++) {
            const double t0 = now();
            for (int c = 0; c < NC; c++) {
                const char *K = kv + (size_t)c * T * row;
                if (v == 0) {
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
                        sd->scores_t(QT, NQ, K + (size_t)t0b * row, DK, kt, DK, n, scale, S,
                                     B + 16, kbuf);
                        for (int j = 0; j < NQ; j++)
                            rl[j] = n;
                        const double b1 = now();
                        sd->softmax(S, NQ, B + 16, rl, n, kt, mx, mx + NQ);
                        const double b2 = now();
                        sd->pv(S, NQ, B + 16, K + (size_t)t0b * row, DK, kt, DV, rl, Ob, DV,
                               false);
                        ph[0] += b1 - a, ph[1] += b2 - b1, ph[2] += now() - b2;
                    }
                    for (int j = 0; j < NQ; j++) { /* the merge, as split_merge */
                        float M = -INFINITY;
                        double L = 0.0;
                        for (int b = 0; b < nb; b++)
                            M = fmaxf(M, O[(size_t)b * NQ * (DV + 2) + NQ * DV + j]);
                        float *o = out + (size_t)j * DV;
                        memset(o, 0, DV * sizeof *o);
                        for (int b = 0; b < nb; b++) {
                            const float *Ob = O + (size_t)b * NQ * (DV + 2);
                            const float w = expf(Ob[NQ * DV + j] - M);
                            L += (double)w * Ob[NQ * DV + NQ + j];
                            for (int d = 0; d < DV; d++)
                                o[d] += w * Ob[(size_t)j * DV + d];
                        }
                        for (int d = 0; d < DV; d++)
                            o[d] *= (float)(1.0 / L);
                    }
                }
            }
            tm[v][r] = (now() - t0) / NC;
        }
    printf("bench_attn_depth: T %d, %s cache, %d layers rotated (%.1f MB each), %d reps, blocks of %d keys, 1 thread\n",
           T, kt == MODEL_KV_BF16 ? "bf16" : "f16", NC, (double)T * row / 1e6, REPS, B);
    for (int v = 0; v < 2; v++) {
        qsort(tm[v], (size_t)REPS, sizeof(double), cmpd);
        printf("  %-9s ms/layer best %.3f median %.3f  ns/key/head best %.2f median %.2f\n",
               v ? "one-pass" : "two-pass", 1e3 * tm[v][0], 1e3 * tm[v][REPS / 2],
               1e9 * tm[v][0] / T / NQ, 1e9 * tm[v][REPS / 2] / T / NQ);
    }
    const double all = ph[0] + ph[1] + ph[2];
    printf("  one-pass shares: scores %.0f %%, block softmax %.0f %%, P.V %.0f %% (the rest: the merge)\n",
           100 * ph[0] / all, 100 * ph[1] / all, 100 * ph[2] / all);
    free(tm[0]), free(tm[1]), free(q), free(out), free(O), free(kbuf), free(S), free(QT), free(kv);
    return 0;
}
