/* attn_avx512_int.h - private to the AVX-512 attention files of
 * coordinator/model (simd_avx512.c: F32/F16 keys; attn_bf16_avx512.c: BF16
 * keys, vdpbf16ps), and only for files built with the AVX-512 flags: the
 * block of query-key scores both write the same way. */
#ifndef ECS_MODEL_ATTN_AVX512_INT_H
#define ECS_MODEL_ATTN_AVX512_INT_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>

/* Defines qk_block (S[j][t0 .. t0+16) = scale * Q[j] . 16 keys, for 8
 * queries, or 4 when four) and its two uses qk_block8 and qk_block4. The
 * keys come transposed (kbuf): np steps, each a vector of the 16 keys' next
 * dimension(s) of type KT (KV: _mm512_load_ps or _mm512_load_si512 of it);
 * each query has its own accumulator, so there are no reductions. The two
 * files differ only in QT (the queries' element), LDQ (the type of the
 * distance between query rows), KT, KV and ROW(a, j), which adds query j's
 * part of step p to accumulator a (p, k, Q and ldq in scope). A macro, not a
 * function taking the step, so each file's code stays what it was when the
 * loop was written out in it (accumulators in registers, the step inlined). */
#define MODEL_QK_BLOCK(QT, LDQ, KT, KV, ROW)                                                       \
    static inline __attribute__((always_inline)) void qk_block(                                   \
        const QT *Q, LDQ ldq, const KT *kt, int np, float scale, float *S, int lds, bool four)    \
    {                                                                                              \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,    \
               a7 = a0;                                                                            \
        for (int p = 0; p < np; p++) {                                                             \
            const KV(kt + (size_t)p * 16);                                                         \
            ROW(a0, 0), ROW(a1, 1), ROW(a2, 2), ROW(a3, 3);                                        \
            if (!four)                                                                             \
                ROW(a4, 4), ROW(a5, 5), ROW(a6, 6), ROW(a7, 7);                                    \
        }                                                                                          \
        const __m512 sc = _mm512_set1_ps(scale);                                                   \
        const __m512 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};                                    \
        for (int j = 0; j < (four ? 4 : 8); j++)                                                   \
            _mm512_storeu_ps(S + (size_t)j * lds, _mm512_mul_ps(acc[j], sc));                      \
    }                                                                                              \
                                                                                                   \
    static void qk_block8(const QT *Q, LDQ ldq, const KT *kt, int np, float scale, float *S,      \
                          int lds)                                                                 \
    {                                                                                              \
        qk_block(Q, ldq, kt, np, scale, S, lds, false);                                            \
    }                                                                                              \
                                                                                                   \
    static void qk_block4(const QT *Q, LDQ ldq, const KT *kt, int np, float scale, float *S,      \
                          int lds)                                                                 \
    {                                                                                              \
        qk_block(Q, ldq, kt, np, scale, S, lds, true);                                             \
    }

#endif
