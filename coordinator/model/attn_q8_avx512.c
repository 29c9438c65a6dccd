/* attn_q8_avx512.c - the decode key split's products over the 8-bit
 * latent cache with VNNI (vpdpbusd: 16 lanes, each adding four u8 x s8
 * products), the same bits as attn_q8.c's plain loops: the integer sums
 * are exact and every float step is theirs, in their order. Called only
 * where model_cpu_q8() holds (vpermb is AVX-512 VBMI's). */
#include <immintrin.h>
#include <string.h>

#include "common/simd_avx512.h"
#include "coordinator/model/model_int.h"

/* acc[i] += key i's bytes [4 p0, 4 p1) . the 16 queries' levels (a key's
 * 4 bytes broadcast, 16 queries' 4 levels a vector); the next 16 rows
 * (pfn of them, ks bytes apart from pf) prefetched spread over the pass. */
/* acc + the u8 x s8 products (vpdpbusd) in place: GCC's intrinsic had the
 * accumulators copied between registers around every instruction */
static inline __attribute__((always_inline)) __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
    return acc;
}

/* ds2's rows (576 values): rs as a constant, so the 16 rows are one
 * pointer and 16 displacements (as attn_bf16_avx512.c's qt_pass) */
#define Q8_LATENT_ROW 592

static inline __attribute__((always_inline)) void
dots(__m512i acc[16], const int8_t *qt, const uint8_t *kr, size_t rs, int p0, int p1,
     const char *pf, size_t ks, int pfn, const size_t RSC)
{
    if (RSC)
        rs = RSC;
    for (int p = p0; p < p1; p++) {
        const size_t line = (size_t)(p >> 4) * 128;
        if ((p & 15) < pfn && line < ks) {
            _mm_prefetch(pf + (size_t)(p & 15) * ks + line, _MM_HINT_T0);
            _mm_prefetch(pf + (size_t)(p & 15) * ks + line + 64, _MM_HINT_T0);
        }
        const __m512i q = _mm512_loadu_si512(qt + (size_t)p * 64);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            int32_t v;
            memcpy(&v, kr + (size_t)i * rs + 4 * (size_t)p, 4);
            acc[i] = dpbusd(acc[i], _mm512_set1_epi32(v), q);
        }
    }
}

void model_q8_scores_avx512(const void *QT, int nq, int dc, int dk, const void *K, size_t ks,
                            int nt, float scale, float *S, int lds, void *kbuf)
{
    const int8_t *qt;
    const float *sq;
    const int32_t *corr;
    model_q8_query_parts((void *)QT, nq, dk, &qt, &sq, &corr);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int t0 = 0; t0 < nt; t0 += 16) {
        const uint8_t *kr = (const uint8_t *)K + (size_t)t0 * ks;
        size_t rs = ks;
        int pfn = nt - t0 - 16 < 16 ? nt - t0 - 16 : 16;
        const char *pf = (const char *)(kr + 16 * ks);
        if (t0 + 16 > nt) { /* the last keys, zero rows (scales 0) after them */
            uint8_t *z = kbuf;
            memset(z, 0, 16 * ks);
            memcpy(z, kr, (size_t)(nt - t0) * ks);
            kr = z;
        }
        for (int g = 0; g * 16 < nq; g++, pfn = 0) {
            const int8_t *q = qt + (size_t)g * 16 * dk;
            const __m512 sqc = _mm512_loadu_ps(sq + (size_t)g * 32);
            const __m512 sqr = _mm512_loadu_ps(sq + (size_t)g * 32 + 16);
            const __m512i cc = _mm512_loadu_si512(corr + (size_t)g * 32);
            const __m512i cr = _mm512_loadu_si512(corr + (size_t)g * 32 + 16);
            __m512i acc[16];
            __m512 part[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                acc[i] = _mm512_setzero_si512();
            if (rs == Q8_LATENT_ROW)
                dots(acc, q, kr, rs, 0, dc / 4, pf, ks, pfn, Q8_LATENT_ROW);
            else
                dots(acc, q, kr, rs, 0, dc / 4, pf, ks, pfn, 0);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                float s[2];
                memcpy(s, kr + (size_t)i * rs + dk, sizeof s);
                part[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i], cc)),
                                        _mm512_mul_ps(sqc, _mm512_set1_ps(s[0])));
                acc[i] = _mm512_setzero_si512();
            }
            if (rs == Q8_LATENT_ROW)
                dots(acc, q, kr, rs, dc / 4, dk / 4, pf, ks, 0, Q8_LATENT_ROW);
            else
                dots(acc, q, kr, rs, dc / 4, dk / 4, pf, ks, 0, 0);
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                float s[2];
                memcpy(s, kr + (size_t)i * rs + dk, sizeof s);
                r[i] = _mm512_castps_si512(
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i], cr)),
                                    _mm512_mul_ps(sqr, _mm512_set1_ps(s[1])), part[i]));
            }
            ecs_transpose16_epi32(r);
            const int nj = nq - g * 16 < 16 ? nq - g * 16 : 16;
            for (int j = 0; j < nj; j++)
                _mm512_storeu_ps(S + (size_t)(g * 16 + j) * lds + t0,
                                 _mm512_mul_ps(_mm512_castsi512_ps(r[j]), sc));
        }
    }
}

/* The probabilities as levels (model_q8_pv_levels' arithmetic, 16 keys a
 * vector): returns the keys rounded up to 4; pu per group of 16 queries
 * and 4 keys, the queries' 4 levels in turn (64 bytes: one pointer and
 * constant displacements for the products), queries past nq zero. */
static int pv_levels(const float *P, int nq, int ldp, const uint8_t *const *row, int nt, int dk,
                     uint8_t *pu, float *sv, float *ps)
{
    const int ng = (nq + 15) / 16;
    memset(pu, 0, (size_t)ng * 16 * (size_t)((nt + 3) & ~3));
    const int nt4 = (nt + 3) & ~3;
    for (int t = 0; t < nt4; t++) {
        sv[t] = 0.0f;
        if (t < nt)
            memcpy(&sv[t], row[t] + dk, sizeof(float));
    }
    for (int j = 0; j < nq; j++) {
        const float *p = P + (size_t)j * ldp;
        __m512 m = _mm512_setzero_ps();
        for (int t = 0; t < nt; t += 16) {
            const __mmask16 k = nt - t >= 16 ? 0xFFFF : (__mmask16)((1u << (nt - t)) - 1u);
            m = _mm512_max_ps(m, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + t),
                                               _mm512_maskz_loadu_ps(k, sv + t)));
        }
        const float mx = _mm512_reduce_max_ps(m);
        ps[j] = mx / 255.0f;
        const __m512 inv = _mm512_set1_ps(mx > 0.0f ? 255.0f / mx : 0.0f);
        uint8_t *u = pu + (size_t)(j / 16) * 16 * nt4 + (size_t)(j % 16) * 4;
        for (int t = 0; t < nt4; t += 16) {
            const int n = nt - t < 16 ? (nt - t > 0 ? nt - t : 0) : 16;
            const __mmask16 k = n == 16 ? 0xFFFF : (__mmask16)((1u << n) - 1u);
            const __m512 x = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + t),
                                                         _mm512_maskz_loadu_ps(k, sv + t)), inv);
            int32_t w[4];
            _mm_storeu_si128((__m128i *)w, _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(x)));
            for (int q = 0; q < 4 && t + 4 * q < nt4; q++)
                memcpy(u + (size_t)(t / 4 + q) * 64, &w[q], 4);
        }
    }
    return nt4;
}

__attribute__((target("avx512vbmi"))) void
model_q8_pv_avx512(const float *P, int nq, int ldp, const void *const *vr, const int *rn,
                   int nrun, size_t ks, int dc, int dk, float *O, int ldo, void *scratch)
{
    const uint8_t *row[MODEL_SPLIT_KEYS + 4];
    int nt = 0;
    for (int r = 0; r < nrun; r++)
        for (int i = 0; i < rn[r]; i++)
            row[nt++] = (const uint8_t *)vr[r] + (size_t)i * ks;
    const int ng = (nq + 15) / 16;
    uint8_t *pu = scratch;
    float *sv = (float *)(pu + (size_t)ng * 16 * (MODEL_SPLIT_KEYS + 4)), ps[MODEL_ATT_QMAX + 16];
    const int nt4 = pv_levels(P, nq, ldp, row, nt, dk, pu, sv, ps);
    /* the last group of 4 keys, short: its missing rows zero (their
     * levels are zero too) */
    _Alignas(64) uint8_t tail[4][MODEL_Q8_MAXDK];
    const int full = nt & ~3;
    if (full < nt) {
        memset(tail, 0, sizeof tail);
        for (int t = full; t < nt; t++)
            memcpy(tail[t - full], row[t], (size_t)dc);
        for (int t = full; t < nt4; t++)
            row[t] = tail[t - full];
    }
    uint8_t idx[64];
    for (int i = 0; i < 16; i++)
        for (int b = 0; b < 4; b++)
            idx[4 * i + b] = (uint8_t)(b * 16 + i);
    const __m512i perm = _mm512_loadu_si512(idx), flip = _mm512_set1_epi8((char)0x80);
    for (int g = 0; g < ng; g++) {
        const int nj = nq - g * 16 < 16 ? nq - g * 16 : 16;
        const uint8_t *u = pu + (size_t)g * 16 * nt4; /* 64 bytes per 4 keys */
        for (int d0 = 0; d0 < dc; d0 += 16) {
            __m512i a[16];
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++)
                a[j] = _mm512_setzero_si512();
            for (int t = 0; t < nt4; t += 4) {
                /* 4 keys' 16 bytes, lane i = column d0 + i's 4 keys, as s8 */
                __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(row[t] + d0)));
                x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(row[t + 1] + d0)), 1);
                x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(row[t + 2] + d0)), 2);
                x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(row[t + 3] + d0)), 3);
                const __m512i w = _mm512_xor_si512(_mm512_permutexvar_epi8(perm, x), flip);
                const uint8_t *pw = u + (size_t)t * 16;
#pragma GCC unroll 16
                for (int j = 0; j < 16; j++) {
                    int32_t pv;
                    memcpy(&pv, pw + 4 * j, 4);
                    a[j] = dpbusd(a[j], _mm512_set1_epi32(pv), w);
                }
            }
            for (int j = 0; j < nj; j++)
                _mm512_storeu_ps(O + (size_t)(g * 16 + j) * ldo + d0,
                                 _mm512_mul_ps(_mm512_cvtepi32_ps(a[j]),
                                               _mm512_set1_ps(ps[g * 16 + j])));
        }
    }
}

float model_q8_levels_avx512(const float *x, int n, int off, uint8_t *lv, int32_t *sum)
{
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(k, x + i)));
    }
    const float mx = _mm512_reduce_max_ps(m);
    const __m512 inv = _mm512_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    const __m512i o = _mm512_set1_epi32(off);
    __m512i s = _mm512_setzero_si512();
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
        v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
        s = _mm512_add_epi32(s, v);
        _mm_mask_storeu_epi8(lv + i, k, _mm512_cvtepi32_epi8(_mm512_add_epi32(v, o)));
    }
    *sum = _mm512_reduce_add_epi32(s);
    return mx / 127.0f;
}
