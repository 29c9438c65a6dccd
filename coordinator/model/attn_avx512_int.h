/* attn_avx512_int.h - private to the AVX-512 attention files of
 * coordinator/model (simd_avx512.c: F32/F16 keys; attn_bf16_avx512.c: BF16
 * keys, vdpbf16ps), and only for files built with the AVX-512 flags: the
 * block of query-key scores both write the same way, and the order in
 * which both run their P.V kernels over blocks of rows and keys. */
#ifndef ECS_MODEL_ATTN_AVX512_INT_H
#define ECS_MODEL_ATTN_AVX512_INT_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>

/* Defines qk_block (S[j][t0 .. t0+16) = scale * Q[j] . 16 keys, for 8
 * queries, or 4 when four), qk_pair8 (8 queries and two panels of 16 keys:
 * each query's broadcast feeds both, 10 loads for 16 products where
 * qk_block takes 9 for 8, which its loads, not its products, bound) and
 * qk_blocks, which runs them over every block of queries for the keys t0
 * .. t0+16 (panel one) or t0 .. t0+32 (two: both panels), skipping the
 * panels none of a block's queries sees (seen[j / 8]: the keys queries j
 * .. j+8 see). The keys come transposed (kbuf): np steps, each a vector of
 * the 16 keys' next dimension(s) of type KT (KV(k, at): _mm512_load_ps or
 * _mm512_load_si512 of it into k); the second panel `panel` KT further.
 * Each query has its own accumulators, so there are no reductions, and
 * each score is the same sum in either kernel. The two files differ only
 * in QT (the queries' element), LDQ (the type of the distance between
 * query rows), KT, KV, QB(j) (query j's part of step p, p, Q and ldq in
 * scope) and DOT(a, k, q) (a plus the products of k and q). A macro, not
 * a function taking the step, so each file's code stays what it was when
 * the loop was written out in it (accumulators in registers, the step
 * inlined). */
#define MODEL_QK_BLOCK(QT, LDQ, KT, KV, QB, DOT)                                                   \
    static inline __attribute__((always_inline)) void qk_block(                                   \
        const QT *Q, LDQ ldq, const KT *kt, int np, float scale, float *S, int lds, bool four)    \
    {                                                                                              \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,    \
               a7 = a0;                                                                            \
        for (int p = 0; p < np; p++) {                                                             \
            KV(k, kt + (size_t)p * 16);                                                            \
            a0 = DOT(a0, k, QB(0)), a1 = DOT(a1, k, QB(1));                                        \
            a2 = DOT(a2, k, QB(2)), a3 = DOT(a3, k, QB(3));                                        \
            if (!four) {                                                                           \
                a4 = DOT(a4, k, QB(4)), a5 = DOT(a5, k, QB(5));                                    \
                a6 = DOT(a6, k, QB(6)), a7 = DOT(a7, k, QB(7));                                    \
            }                                                                                      \
        }                                                                                          \
        const __m512 sc = _mm512_set1_ps(scale);                                                   \
        const __m512 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};                                    \
        for (int j = 0; j < (four ? 4 : 8); j++)                                                   \
            _mm512_storeu_ps(S + (size_t)j * lds, _mm512_mul_ps(acc[j], sc));                      \
    }                                                                                              \
                                                                                                   \
    static void qk_pair8(const QT *Q, LDQ ldq, const KT *kt, size_t panel, int np, float scale,   \
                         float *S, int lds)                                                        \
    {                                                                                              \
        __m512 a[8], b[8];                                                                         \
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) a[j] = b[j] = _mm512_setzero_ps();    \
        for (int p = 0; p < np; p++) {                                                             \
            KV(k, kt + (size_t)p * 16);                                                            \
            KV(l, kt + panel + (size_t)p * 16);                                                    \
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)                                    \
            {                                                                                      \
                const __typeof__(QB(0)) q = QB(j);                                                 \
                a[j] = DOT(a[j], k, q);                                                            \
                b[j] = DOT(b[j], l, q);                                                            \
            }                                                                                      \
        }                                                                                          \
        const __m512 sc = _mm512_set1_ps(scale);                                                   \
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)                                        \
        {                                                                                          \
            _mm512_storeu_ps(S + (size_t)j * lds, _mm512_mul_ps(a[j], sc));                        \
            _mm512_storeu_ps(S + (size_t)j * lds + 16, _mm512_mul_ps(b[j], sc));                   \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void qk_blocks(const QT *Q, LDQ ldq, const KT *kt, size_t panel, int np, bool two,     \
                          const int *seen, int nq, int t0, float scale, float *S, int lds)         \
    {                                                                                              \
        int j = 0;                                                                                 \
        for (; j + 8 <= nq; j += 8) {                                                              \
            float *s = S + (size_t)j * lds + t0;                                                   \
            if (two && seen[j / 8] > t0 + 16)                                                      \
                qk_pair8(Q + (size_t)j * ldq, ldq, kt, panel, np, scale, s, lds);                  \
            else if (seen[j / 8] > t0)                                                             \
                qk_block(Q + (size_t)j * ldq, ldq, kt, np, scale, s, lds, false);                  \
        }                                                                                          \
        for (int h = 0; h < 1 + two && j < nq; h++)                                                \
            if (seen[j / 8] > t0 + 16 * h)                                                         \
                qk_block(Q + (size_t)j * ldq, ldq, kt + h * panel, np, scale,                      \
                         S + (size_t)j * lds + t0 + 16 * h, lds, true);                            \
    }

/* The most of len[j0 .. j1). */
static inline int model_max_len(const int *len, int j0, int j1)
{
    int m = 0;
    for (int j = j0; j < j1; j++)
        m = len[j] > m ? len[j] : m;
    return m;
}

/* seen[b]: the keys queries 8b .. 8b+8 (of nq) see, the most of their
 * len; qk_blocks skips a block's panels past it. */
static inline void model_qk_seen(const int *len, int nq, int *seen)
{
    for (int j = 0, b = 0; j < nq; j += 8, b++)
        seen[b] = model_max_len(len, j, j + 8 <= nq ? j + 8 : nq);
}

/* A P.V kernel: rows 6 or 4 (its own), output columns d0 .. d0+64, keys
 * [0, nt) of P's rows and V's; acc: continue the sums in O. */
typedef void (*model_pv_fn)(const float *P, int ldp, const void *V, size_t vs, int dv, int d0,
                            int nt, float *O, int ldo, bool acc);

/* Keys per block of model_pv_blocks: a head's 256 V rows of 128 F16 values
 * are 64 KB (even: BF16's kernels pair keys t, t+1 from an even t). */
#define MODEL_PV_KEYS 256

/* P.V over nq rows (a multiple of 4) with the kernels six and four, V's
 * elements eb bytes: blocks of MODEL_PV_KEYS keys, each through every
 * block of rows before the next, so that its V rows stay in L2 for all of
 * them instead of streaming from memory for each (at depth a head's V is
 * megabytes); the sums go on block after block in key order, so the bits
 * are those of one pass. Blocks of six rows where what is left still
 * splits into sixes and fours, each over the keys its rows see (the first
 * key block always: it sets the sums). */
static inline void model_pv_blocks(const float *P, int nq, int ldp, const void *V, size_t vs,
                                   size_t eb, int dv, const int *len, float *O, int ldo, bool acc,
                                   model_pv_fn six, model_pv_fn four)
{
    const int most = model_max_len(len, 0, nq);
    for (int k0 = 0; k0 == 0 || k0 < most; k0 += MODEL_PV_KEYS)
        for (int j = 0; j < nq;) {
            const int left = nq - j, rows = left >= 6 && left != 8 ? 6 : 4;
            const int nt = model_max_len(len, j, j + rows) - k0;
            if (k0 == 0 || nt > 0)
                for (int d0 = 0; d0 < dv; d0 += 64)
                    (rows == 6 ? six : four)(
                        P + (size_t)j * ldp + k0, ldp, (const char *)V + (size_t)k0 * vs * eb, vs,
                        dv, d0, nt < 0 ? 0 : nt < MODEL_PV_KEYS ? nt : MODEL_PV_KEYS,
                        O + (size_t)j * ldo, ldo, acc || k0 > 0);
            j += rows;
        }
}

#endif
