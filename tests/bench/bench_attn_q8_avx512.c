/* bench_attn_q8_avx512.c - an experiment, not a kernel of the runtime:
 * what an 8-bit latent cache would make of the decode key split's core
 * (issue 16, docs/benchmarks.md "Decode at depth: prefetch, loop order
 * and an 8-bit latent cache"). One ds2-lite layer at depth T: 16 query
 * heads, rows [c 512 | k_pe 64]; NC caches rotated (27 x 4.7 MB in BF16:
 * more than L3, as the full model).
 *   BF16: model_simd()->scores_t and ->pv over blocks of 256 keys, as
 *         attn.c's split_block runs them (block softmax not timed: it is
 *         the same for both).
 *   int8: rows stored u8 = round(x / s) + 128 with one F32 scale per row
 *         and part (c, k_pe): 576 + 8 B a row (and 8 of padding) against
 *         1152. Q.K with vpdpbusd (the key's 4 bytes broadcast, 16 queries'
 *         s8 values a vector; the +128 taken off with 128 x the query's
 *         sum), scaled per part. P.V: each probability times its row's
 *         scale, to u8 per query (scale max / 255), vpdpbusd over 4 keys a
 *         lane (4 rows' bytes interleaved, s8 = u8 ^ 0x80).
 * Prints ms per layer (best, median; 1 thread) and the error of the
 * scores, the probabilities and the outputs against F64 on uniform
 * random data (a real cache's outlier channels would widen the int8
 * error: the logit error needs the whole path, not built).
 *
 * usage: bench_attn_q8_avx512 [T] [NC] [REPS] (skips itself, saying so,
 * without AVX-512 VNNI and BF16) */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/simd_avx512.h"
#include "coordinator/model/model_int.h"

#define NQ 16
#define DK 576
#define DC 512
#define ROW8 592 /* 576 u8, 2 float scales, pad to 16 */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* acc[i] += key i's bytes . the queries over groups of 4 dimensions
 * [p0, p1); the next 16 rows (pfn of them) at pf prefetched meanwhile, 2
 * lines a group (10 lines a row). */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) static inline void
dots(__m512i acc[16], const int8_t *QT8, const uint8_t *kr, int p0, int p1, const char *pf, int pfn)
{
    for (int p = p0; p < p1; p++) {
        if ((p & 15) < pfn && (p >> 4) < 5) {
            _mm_prefetch(pf + (size_t)(p & 15) * ROW8 + (size_t)(p >> 4) * 128, _MM_HINT_T0);
            _mm_prefetch(pf + (size_t)(p & 15) * ROW8 + (size_t)(p >> 4) * 128 + 64, _MM_HINT_T0);
        }
        const __m512i q = _mm512_load_si512(QT8 + (size_t)p * 64);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            int32_t v;
            memcpy(&v, kr + (size_t)i * ROW8 + 4 * p, 4);
            acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_set1_epi32(v), q);
        }
    }
}

/* QT8[p4 * 64 + j * 4 + k] = q8[j][4 p4 + k]; sq[part][j]; corr[part][j] = 128 sum q8 */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
qk8(const int8_t *QT8, const float *sq, const int32_t *corr, const uint8_t *K, int nt, float scale,
    float *S, int lds)
{
    float part[16][16] __attribute__((aligned(64)));
    const __m512 sqc = _mm512_loadu_ps(sq), sqp = _mm512_loadu_ps(sq + 16);
    const __m512i cc = _mm512_loadu_si512(corr), cp = _mm512_loadu_si512(corr + 16);
    for (int t0 = 0; t0 < nt; t0 += 16) {
        const uint8_t *kr = K + (size_t)t0 * ROW8;
        const char *pf = (const char *)(kr + 16 * ROW8);
        const int pfn = nt - t0 - 16 >= 16 ? 16 : nt - t0 - 16 > 0 ? nt - t0 - 16 : 0;
        __m512i acc[16];
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_setzero_si512();
        dots(acc, QT8, kr, 0, DC / 4, pf, pfn);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const float *sc = (const float *)(kr + (size_t)i * ROW8 + DK);
            _mm512_store_ps(part[i], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i], cc)),
                                                   _mm512_mul_ps(sqc, _mm512_set1_ps(sc[0]))));
            acc[i] = _mm512_setzero_si512();
        }
        dots(acc, QT8, kr, DC / 4, DK / 4, pf, 0);
        __m512i r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const float *sc = (const float *)(kr + (size_t)i * ROW8 + DK);
            r[i] = _mm512_castps_si512(_mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i], cp)),
                _mm512_mul_ps(sqp, _mm512_set1_ps(sc[1])), _mm512_load_ps(part[i])));
        }
        ecs_transpose16_epi32(r);
        const __m512 s = _mm512_set1_ps(scale);
        for (int j = 0; j < NQ; j++)
            _mm512_storeu_ps(S + (size_t)j * lds + t0, _mm512_mul_ps(_mm512_castsi512_ps(r[j]), s));
    }
}

/* P.V over a block of nt keys (nt % 4 == 0) of the 8-bit cache: the
 * probabilities p[j][t] times the rows' scales, to u8 per query (scale
 * ps[j] = max / 255); vpdpbusd on 4 keys a lane (the rows' bytes
 * interleaved, s8 = u8 ^ 0x80); O[j][d] = ps[j] * sum. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
pv8(const float *P, int ldp, const uint8_t *V, int nt, float *O)
{
    static uint8_t pu[NQ][1024] __attribute__((aligned(64)));
    static float sv[1024] __attribute__((aligned(64)));
    float ps[NQ];
    for (int t = 0; t < nt; t++)
        memcpy(&sv[t], V + (size_t)t * ROW8 + DK, 4);
    for (int j = 0; j < NQ; j++) {
        __m512 m = _mm512_setzero_ps();
        for (int t = 0; t < nt; t += 16)
            m = _mm512_max_ps(m, _mm512_mul_ps(_mm512_loadu_ps(P + (size_t)j * ldp + t),
                                               _mm512_load_ps(sv + t)));
        const float mx = _mm512_reduce_max_ps(m);
        ps[j] = mx / 255.0f;
        const __m512 inv = _mm512_set1_ps(mx > 0 ? 255.0f / mx : 0);
        for (int t = 0; t < nt; t += 16) {
            const __m512 x = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(P + (size_t)j * ldp + t),
                                                         _mm512_load_ps(sv + t)), inv);
            _mm_store_si128((__m128i *)&pu[j][t], _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(x)));
        }
    }
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int d0 = 0; d0 < DC; d0 += 64)
        for (int j0 = 0; j0 < NQ;) {
            const int rows = NQ - j0 >= 6 && NQ - j0 != 8 ? 6 : 4;
            __m512i a[6][4];
            for (int r = 0; r < 6; r++)
                for (int c = 0; c < 4; c++)
                    a[r][c] = _mm512_setzero_si512();
            for (int t = 0; t < nt; t += 4) {
                const uint8_t *v0 = V + (size_t)t * ROW8 + d0;
                _mm_prefetch((const char *)(v0 + 8 * ROW8), _MM_HINT_T0);
                _mm_prefetch((const char *)(v0 + 9 * ROW8), _MM_HINT_T0);
                _mm_prefetch((const char *)(v0 + 10 * ROW8), _MM_HINT_T0);
                _mm_prefetch((const char *)(v0 + 11 * ROW8), _MM_HINT_T0);
                const __m512i r0 = _mm512_xor_si512(_mm512_loadu_si512(v0), flip);
                const __m512i r1 = _mm512_xor_si512(_mm512_loadu_si512(v0 + ROW8), flip);
                const __m512i r2 = _mm512_xor_si512(_mm512_loadu_si512(v0 + 2 * ROW8), flip);
                const __m512i r3 = _mm512_xor_si512(_mm512_loadu_si512(v0 + 3 * ROW8), flip);
                const __m512i l01 = _mm512_unpacklo_epi8(r0, r1), h01 = _mm512_unpackhi_epi8(r0, r1);
                const __m512i l23 = _mm512_unpacklo_epi8(r2, r3), h23 = _mm512_unpackhi_epi8(r2, r3);
                const __m512i w[4] = {_mm512_unpacklo_epi16(l01, l23), _mm512_unpackhi_epi16(l01, l23),
                                      _mm512_unpacklo_epi16(h01, h23), _mm512_unpackhi_epi16(h01, h23)};
#pragma GCC unroll 6
                for (int r = 0; r < rows; r++) {
                    int32_t pv;
                    memcpy(&pv, &pu[j0 + r][t], 4);
                    const __m512i p = _mm512_set1_epi32(pv);
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++)
                        a[r][c] = _mm512_dpbusd_epi32(a[r][c], p, w[c]);
                }
            }
            static const int32_t I0[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
            static const int32_t I1[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
            static const int32_t J0[16] = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
            static const int32_t J1[16] = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
            const __m512i i0 = _mm512_loadu_si512(I0), i1 = _mm512_loadu_si512(I1);
            const __m512i k0 = _mm512_loadu_si512(J0), k1 = _mm512_loadu_si512(J1);
            for (int r = 0; r < rows; r++) {
                const __m512 s = _mm512_set1_ps(ps[j0 + r]);
                __m512 f[4];
                for (int c = 0; c < 4; c++)
                    f[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(a[r][c]), s);
                float *o = O + (size_t)(j0 + r) * DC + d0;
                for (int h = 0; h < 2; h++) {
                    const __m512i ii = h ? i1 : i0;
                    const __m512 t01 = _mm512_permutex2var_ps(f[0], ii, f[1]);
                    const __m512 t23 = _mm512_permutex2var_ps(f[2], ii, f[3]);
                    _mm512_storeu_ps(o + 32 * h, _mm512_permutex2var_ps(t01, k0, t23));
                    _mm512_storeu_ps(o + 32 * h + 16, _mm512_permutex2var_ps(t01, k1, t23));
                }
            }
            j0 += rows;
        }
}

static int cmpd(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const int T = argc > 1 ? atoi(argv[1]) : 4096, NC = argc > 2 ? atoi(argv[2]) : 27;
    const int REPS = argc > 3 ? atoi(argv[3]) : 10, B = 256;
    if (!__builtin_cpu_supports("avx512vnni") || !model_cpu_bf16()) {
        printf("bench_attn_q8_avx512: skipped, no AVX-512 VNNI and BF16 on this CPU\n");
        return 0;
    }
    if (T < B || T % B || NC < 1 || REPS < 1) {
        fprintf(stderr, "usage: bench_attn_q8_avx512 [T: a multiple of 256] [NC] [REPS]\n");
        return 2;
    }
    const model_simd_t *sd = model_simd();
    char *kb = aligned_alloc(64, (size_t)NC * T * DK * 2);
    uint8_t *k8 = aligned_alloc(64, (size_t)NC * T * ROW8 + 64 * ROW8);
    float *kf = malloc((size_t)T * DK * sizeof(float)); /* layer 0 in F32 */
    float *QT = aligned_alloc(64, (size_t)NQ * DK * sizeof(float));
    int8_t *QT8 = aligned_alloc(64, (size_t)NQ * DK);
    float *S = aligned_alloc(64, (size_t)NQ * (B + 16) * sizeof(float) * 2);
    float *S0 = malloc((size_t)NQ * T * sizeof(float)), *S1 = malloc((size_t)NQ * T * sizeof(float));
    float *kbuf = aligned_alloc(64, (size_t)16 * DK * sizeof(float));
    float q[NQ][DK], sq[32];
    int32_t corr[32];
    if (!kb || !k8 || !kf || !QT || !QT8 || !S || !S0 || !S1 || !kbuf) {
        fprintf(stderr, "bench_attn_q8_avx512: out of memory\n");
        return 1;
    }
    srand(1);
    /* keys as a latent cache might look: c ~ normalized, k_pe wider */
    for (size_t t = 0; t < (size_t)NC * T; t++) {
        float x[DK];
        for (int d = 0; d < DK; d++)
            x[d] = ((float)rand() / RAND_MAX - 0.5f) * (d < DC ? 1.0f : 4.0f);
        sd->to_bf16((ecs_bf16_t *)(kb + t * DK * 2), x, DK);
        if (t < (size_t)T)
            memcpy(kf + t * DK, x, sizeof x);
        uint8_t *r = k8 + t * ROW8;
        for (int part = 0; part < 2; part++) {
            const int a = part ? DC : 0, e = part ? DK : DC;
            float m = 0;
            for (int d = a; d < e; d++)
                m = fmaxf(m, fabsf(x[d]));
            const float s = m / 127.0f;
            for (int d = a; d < e; d++)
                r[d] = (uint8_t)(lrintf(x[d] / s) + 128);
            memcpy(r + DK + 4 * part, &s, 4);
        }
    }
    memset(QT, 0, (size_t)NQ * DK * sizeof(float));
    for (int j = 0; j < NQ; j++) {
        for (int d = 0; d < DK; d++)
            q[j][d] = ((float)rand() / RAND_MAX - 0.5f) * (d < DC ? 1.0f : 4.0f);
        ecs_bf16_t qb[DK];
        sd->to_bf16(qb, q[j], DK);
        model_qt_bf16(QT, j, DK, qb);
        for (int part = 0; part < 2; part++) {
            const int a = part ? DC : 0, e = part ? DK : DC;
            float m = 0;
            for (int d = a; d < e; d++)
                m = fmaxf(m, fabsf(q[j][d]));
            sq[16 * part + j] = m / 127.0f;
            int32_t sum = 0;
            for (int d = a; d < e; d++) {
                const int v = (int)lrintf(q[j][d] / sq[16 * part + j]);
                QT8[(d / 4) * 64 + j * 4 + d % 4] = (int8_t)v;
                sum += v;
            }
            corr[16 * part + j] = 128 * sum;
        }
    }
    const float scale = 1.0f / sqrtf(192.0f);
    double *tm[4];
    for (int v = 0; v < 4; v++)
        tm[v] = malloc(REPS * sizeof(double));
    float *O = aligned_alloc(64, (size_t)NQ * DC * sizeof(float));
    float *Pt = aligned_alloc(64, (size_t)NQ * (B + 16) * sizeof(float));
    double *ex = malloc((size_t)T * sizeof(double));
    if (!tm[0] || !tm[1] || !tm[2] || !tm[3] || !O || !Pt || !ex) {
        fprintf(stderr, "bench_attn_q8_avx512: out of memory\n");
        return 1;
    }
    int rl[NQ];
    for (int j = 0; j < NQ; j++) {
        rl[j] = B;
        for (int t = 0; t < B + 16; t++) { /* BF16 values, as the block softmax leaves them */
            Pt[j * (B + 16) + t] =
                ecs_bf16_to_f32(ecs_f32_to_bf16(expf(-(float)((t * 7 + j) % 23) / 5.0f)));
        }
    }
    for (int r = 0; r < REPS; r++)
        for (int v = 0; v < 4; v++) {
            const double a = now();
            for (int c = 0; c < NC; c++)
                for (int t0 = 0; t0 < T; t0 += B) {
                    if (v == 2) {
                        sd->scores_t(QT, NQ, kb + ((size_t)c * T + t0) * DK * 2, DK, MODEL_KV_BF16,
                                     DK, B, scale, S, B + 16, kbuf);
                        sd->pv(Pt, NQ, B + 16, kb + ((size_t)c * T + t0) * DK * 2, DK, MODEL_KV_BF16,
                               DC, rl, O, DC, false);
                    } else if (v == 3) {
                        qk8(QT8, sq, corr, k8 + ((size_t)c * T + t0) * ROW8, B, scale, S, B + 16);
                        pv8(Pt, B + 16, k8 + ((size_t)c * T + t0) * ROW8, B, O);
                    }
                    else if (v == 0)
                        sd->scores_t(QT, NQ, kb + ((size_t)c * T + t0) * DK * 2, DK, MODEL_KV_BF16,
                                     DK, B, scale, S, B + 16, kbuf);
                    else
                        qk8(QT8, sq, corr, k8 + ((size_t)c * T + t0) * ROW8, B, scale, S, B + 16);
                }
            tm[v][r] = (now() - a) / NC;
        }
    for (int v = 0; v < 4; v++) {
        qsort(tm[v], REPS, sizeof(double), cmpd);
        printf("%s %s, T %d, %d caches rotated: ms/layer best %.3f median %.3f\n",
               v & 1 ? "int8 (VNNI)" : "BF16       ", v < 2 ? "Q.K" : "Q.K then P.V of each block", T, NC, 1e3 * tm[v][0], 1e3 * tm[v][REPS / 2]);
    }
    /* error of layer 0's scores against F64 */
    for (int t0 = 0; t0 < T; t0 += B) {
        sd->scores_t(QT, NQ, kb + (size_t)t0 * DK * 2, DK, MODEL_KV_BF16, DK, B, scale, S, B + 16,
                     kbuf);
        for (int j = 0; j < NQ; j++)
            memcpy(S0 + (size_t)j * T + t0, S + (size_t)j * (B + 16), B * sizeof(float));
        qk8(QT8, sq, corr, k8 + (size_t)t0 * ROW8, B, scale, S, B + 16);
        for (int j = 0; j < NQ; j++)
            memcpy(S1 + (size_t)j * T + t0, S + (size_t)j * (B + 16), B * sizeof(float));
    }
    double e0 = 0, e1 = 0, m0 = 0, m1 = 0, rms = 0, pe0 = 0, pe1 = 0;
    for (int j = 0; j < NQ; j++) {
        double mx = -1e30, mx0 = -1e30, mx1 = -1e30;
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int d = 0; d < DK; d++)
                s += (double)q[j][d] * kf[(size_t)t * DK + d];
            ex[t] = s * scale;
            rms += ex[t] * ex[t];
            const double d0 = S0[(size_t)j * T + t] - ex[t], d1 = S1[(size_t)j * T + t] - ex[t];
            e0 += d0 * d0, e1 += d1 * d1;
            m0 = fmax(m0, fabs(d0)), m1 = fmax(m1, fabs(d1));
            mx = fmax(mx, ex[t]), mx0 = fmax(mx0, S0[(size_t)j * T + t]), mx1 = fmax(mx1, S1[(size_t)j * T + t]);
        }
        double z = 0, z0 = 0, z1 = 0;
        for (int t = 0; t < T; t++)
            z += exp(ex[t] - mx), z0 += exp(S0[(size_t)j * T + t] - mx0), z1 += exp(S1[(size_t)j * T + t] - mx1);
        for (int t = 0; t < T; t++) {
            const double p = exp(ex[t] - mx) / z;
            pe0 = fmax(pe0, fabs(exp(S0[(size_t)j * T + t] - mx0) / z0 - p) / p);
            pe1 = fmax(pe1, fabs(exp(S1[(size_t)j * T + t] - mx1) / z1 - p) / p);
        }
    }
    const double n = (double)NQ * T;
    printf("scores vs F64 (rms of scores %.3f): BF16 rms err %.5f max %.5f; int8 rms err %.5f max %.5f\n",
           sqrt(rms / n), sqrt(e0 / n), m0, sqrt(e1 / n), m1);
    printf("softmax probabilities, max relative error: BF16 %.4f, int8 %.4f\n", pe0, pe1);
    /* P.V error on the first NB keys of layer 0 as one block: exact p */
    for (int NB = 256; NB <= 1024 && NB <= T; NB *= 4) {
        double eb = 0, e8 = 0, ro = 0;
        float *P = malloc((size_t)NQ * NB * sizeof(float));
        float *O8 = malloc((size_t)NQ * DC * sizeof(float));
        double *pex = malloc((size_t)NQ * NB * sizeof(double)), zs[NQ];
        if (!P || !O8 || !pex) {
            fprintf(stderr, "bench_attn_q8_avx512: out of memory\n");
            return 1;
        }
        for (int j = 0; j < NQ; j++) {
            double mx = -1e30;
            for (int t = 0; t < NB; t++) {
                double s = 0;
                for (int d = 0; d < DK; d++)
                    s += (double)q[j][d] * kf[(size_t)t * DK + d];
                pex[(size_t)j * NB + t] = s * scale * 8; /* sharper than the random data's */
                mx = fmax(mx, pex[(size_t)j * NB + t]);
            }
            zs[j] = 0;
            for (int t = 0; t < NB; t++) {
                pex[(size_t)j * NB + t] = exp(pex[(size_t)j * NB + t] - mx);
                zs[j] += pex[(size_t)j * NB + t];
                P[(size_t)j * NB + t] = (float)pex[(size_t)j * NB + t];
            }
        }
        pv8(P, NB, k8, NB, O8);
        for (int j = 0; j < NQ; j++)
            for (int d = 0; d < DC; d++) {
                double ox = 0, ob = 0;
                for (int t = 0; t < NB; t++) {
                    const double p = pex[(size_t)j * NB + t];
                    ox += p * kf[(size_t)t * DK + d];
                    ob += ecs_bf16_to_f32(ecs_f32_to_bf16((float)p)) *
                          ecs_bf16_to_f32(((const ecs_bf16_t *)kb)[(size_t)t * DK + d]);
                }
                ox /= zs[j], ob /= zs[j];
                const double y = O8[(size_t)j * DC + d] / zs[j];
                ro += ox * ox, eb += (ob - ox) * (ob - ox), e8 += (y - ox) * (y - ox);
            }
        printf("P.V over %d keys vs F64 (rms of outputs %.5f): BF16 rms err %.6f (%.2f %%), int8 %.6f (%.2f %%)\n",
               NB, sqrt(ro / (NQ * DC)), sqrt(eb / (NQ * DC)), 100 * sqrt(eb / ro),
               sqrt(e8 / (NQ * DC)), 100 * sqrt(e8 / ro));
        free(P), free(O8), free(pex);
    }
    for (int v = 0; v < 4; v++)
        free(tm[v]);
    free(ex), free(Pt), free(O), free(kbuf), free(S1), free(S0), free(S), free(QT8), free(QT);
    free(kf), free(k8), free(kb);
    return 0;
}
