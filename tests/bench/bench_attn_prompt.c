/* bench_attn_prompt.c - the two products of a deepseek2 prompt step's
 * attention in the expanded form (attn_exp.c) at depth, one thread: Q.K
 * (model_simd_t.scores: 64 query rows of a head, keys of 192 values) and
 * P.V (model_simd_t.pv: values of 128) over T keys of an F16 (or, with
 * ECS_KV=bf16, BF16) cache laid out as the expansion scratch (all 16 heads' rows side by side), the
 * heads in turn so that each reads its own columns. Prints the time per
 * head and the multiply-adds a second against one core's F32 FMA peak
 * (PEAK_GHZ x 32, default 3.4 GHz: two 512-bit FMAs a cycle, as
 * bench_pipes_avx512 measured on the AMD EPYC VM). Timing only: the bits
 * are test_attn's.
 *
 * usage: [ECS_KV=bf16] bench_attn_prompt [T ...]   (default 1024 4096 8192) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator/model/model_int.h"

#define NQ 64
#define NH 16
#define DK 192
#define DV 128
#define REPS 5

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A random value of the cache's type at element i of X. */
static void put(void *X, size_t i, model_kvt_t kt)
{
    const float v = (float)rand() / (float)RAND_MAX - 0.5f;
    if (kt == MODEL_KV_BF16)
        ((ecs_bf16_t *)X)[i] = ecs_f32_to_bf16(v);
    else
        ((ecs_fp16_t *)X)[i] = ecs_f32_to_fp16(v);
}

static int run(const model_simd_t *sd, model_kvt_t kt, int nt, double peak)
{
    const size_t ks = (size_t)NH * DK, vs = (size_t)NH * DV, lds = (size_t)(nt + 15) & ~15u;
    const size_t eb = model_kvt_size(kt);
    char *K = malloc((size_t)nt * ks * eb), *V = malloc((size_t)nt * vs * eb);
    float *Q = aligned_alloc(64, (size_t)NQ * DK * sizeof *Q);
    float *S = aligned_alloc(64, (size_t)NQ * lds * sizeof *S);
    float *kbuf = aligned_alloc(64, (size_t)32 * DK * sizeof *kbuf);
    float *O = aligned_alloc(64, (size_t)NQ * DV * sizeof *O);
    if (!K || !V || !Q || !S || !kbuf || !O) {
        fprintf(stderr, "bench_attn_prompt: out of memory at T %d\n", nt);
        return 1;
    }
    srand(1);
    for (size_t i = 0; i < (size_t)nt * ks; i++)
        put(K, i, kt);
    for (size_t i = 0; i < (size_t)nt * vs; i++)
        put(V, i, kt);
    for (int j = 0; j < NQ; j++) /* BF16: a row's first half holds its DK values */
        for (int d = 0; d < DK; d++)
            if (kt == MODEL_KV_BF16)
                put(Q + (size_t)j * DK, (size_t)d, kt);
            else
                Q[(size_t)j * DK + d] = (float)rand() / (float)RAND_MAX - 0.5f;
    int len[NQ]; /* the last NQ rows of a prompt at depth T: causal */
    for (int j = 0; j < NQ; j++)
        len[j] = nt - NQ + 1 + j > 1 ? nt - NQ + 1 + j : 1;
    double best_s = 1e9, best_p = 1e9;
    for (int r = 0; r < REPS; r++) {
        const double t0 = now();
        for (int h = 0; h < NH; h++)
            sd->scores(Q, NQ, DK, K + (size_t)h * DK * eb, ks, kt, DK, DK, len, nt, 0.1f, S,
                       (int)lds, kbuf);
        const double t1 = now();
        for (int j = 0; j < NQ; j++) /* probabilities, zero past each row's keys */
            for (size_t t = 0; t < lds; t++)
                S[(size_t)j * lds + t] = (int)t < len[j] ? 1.0f / (float)len[j] : 0.0f;
        const double t2 = now();
        for (int h = 0; h < NH; h++)
            sd->pv(S, NQ, (int)lds, V + (size_t)h * DV * eb, vs, kt, DV, len, O, DV, false);
        const double t3 = now();
        best_s = t1 - t0 < best_s ? t1 - t0 : best_s;
        best_p = t3 - t2 < best_p ? t3 - t2 : best_p;
    }
    const double macs_s = (double)NH * NQ * nt * DK, macs_p = (double)NH * NQ * nt * DV;
    printf("T %5d: Q.K %.3f ms a head, %.1f G multiply-adds/s (%.0f %% of peak); "
           "P.V %.3f ms, %.1f G/s (%.0f %%)\n",
           nt, best_s / NH * 1e3, macs_s / best_s * 1e-9, 100 * macs_s / best_s / peak,
           best_p / NH * 1e3, macs_p / best_p * 1e-9, 100 * macs_p / best_p / peak);
    free(K), free(V), free(Q), free(S), free(kbuf), free(O);
    return 0;
}

int main(int argc, char **argv)
{
    const model_simd_t *sd = model_simd();
    const char *g = getenv("PEAK_GHZ");
    const double peak = (g ? atof(g) : 3.4) * 1e9 * 32;
    const char *kv = getenv("ECS_KV");
    const model_kvt_t kt = kv && !strcmp(kv, "bf16") ? MODEL_KV_BF16 : MODEL_KV_F16;
    printf("bench_attn_prompt: %d query rows x %d heads, keys %d / values %d wide, %s, 1 thread, "
           "%s kernels; peak %.0f G multiply-adds/s (F32 FMAs)\n",
           NQ, NH, DK, DV, kt == MODEL_KV_BF16 ? "BF16" : "F16",
           sd == model_simd_plain() ? "plain" : "SIMD", peak * 1e-9);
    static const int def[] = {1024, 4096, 8192};
    const int n = argc > 1 ? argc - 1 : 3;
    for (int i = 0; i < n; i++) {
        const int nt = argc > 1 ? atoi(argv[i + 1]) : def[i];
        if (nt < NQ || nt > (1 << 20)) {
            fprintf(stderr, "bench_attn_prompt: T %s outside %d..%d\n", argv[i + 1], NQ, 1 << 20);
            return 2;
        }
        if (run(sd, kt, nt, peak))
            return 1;
    }
    return 0;
}
