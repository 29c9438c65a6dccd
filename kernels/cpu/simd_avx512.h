/* simd_avx512.h - block decoding helpers shared by the AVX-512 kernel files
 * (dot_avx512.c: one row at a time; gemm_avx512.c: weight tiles unpacked
 * for batched products). Only for files built with the AVX-512 flags. */
#ifndef ECS_KCPU_SIMD_AVX512_H
#define ECS_KCPU_SIMD_AVX512_H

#include <immintrin.h>
#include <string.h>

#include "common/simd_avx512.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/kscales.h"

#define INLINE static inline __attribute__((always_inline))
#define QK ECS_QK
#define QK_K ECS_QK_K

INLINE float h2f(ecs_fp16_t h)
{
    return _cvtsh_ss(h);
}

/* acc += q (u8) . the dword at p broadcast (s8), and the same for int16
 * pairs: the broadcast as the instruction's memory operand. Compilers emit
 * a separate vpbroadcastd for _mm512_set1_epi32 of a load, one more
 * instruction per product for the front end and the schedulers (products
 * run ~3 % faster without). */
INLINE __m512i dpbusd_bcast(__m512i acc, __m512i q, const uint8_t *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(q), "m"(*(const int32_t *)p));
    return acc;
}

INLINE __m512i dpwssd_bcast(__m512i acc, __m512i q, const uint8_t *p)
{
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(q), "m"(*(const int32_t *)p));
    return acc;
}

/* Activation rows per kernel call up to which prefetch_slice loads into L1
 * (prefetcht0) rather than L2: a decode step's experts see 1-3 rows, so
 * their group is done with long before the next one is needed, and an L2
 * prefetch leaves each line's L2-to-L1 trip to the kernel's own loads
 * (ds2-lite-4l, 2026-12-02: 8-sequence steps +1 %, one-sequence decode
 * +5 %, `bench_matvec --only copy` Q5_0 from DRAM -15 % time); with more
 * rows the group in use stays in L1 over several passes, and filling L1
 * with the next one cost prompt steps 3 % (pp512; docs/benchmarks.md,
 * "Serving"). Measured where L1 holds 48 KB; on a smaller L1 all go to L2
 * (kcpu_prefetch_l1). */
#ifndef PREFETCH_L1_MAX_NA
#define PREFETCH_L1_MAX_NA 3
#endif

/* Whether a kernel call with NA activation rows prefetches into L1 (once
 * per call: the cache's size is read once per process). */
INLINE bool prefetch_into_l1(int NA)
{
    return NA <= PREFETCH_L1_MAX_NA && kcpu_prefetch_l1();
}

/* Lines [i * step, (i + 1) * step) of the bytes [pf, pf + bytes)
 * prefetched into L1 (l1) or L2 (step a multiple of 64; nothing when pf is
 * NULL). */
INLINE void prefetch_slice(const void *pf, size_t bytes, size_t step, int64_t i, bool l1)
{
    if (!pf)
        return;
    const size_t p0 = step * (size_t)i, p1 = p0 + step < bytes ? p0 + step : bytes;
    for (size_t o = p0; o < p1; o += 64) {
        if (l1)
            __builtin_prefetch((const char *)pf + o, 0, 3);
        else
            __builtin_prefetch((const char *)pf + o, 0, 2);
    }
}

/* The step that spreads bytes over n slices of whole lines. */
INLINE size_t prefetch_step(size_t bytes, int64_t n)
{
    return (bytes / (size_t)n + 63) / 64 * 64;
}

INLINE __m512i join256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* [x0 & 15, x0 >> 4, x1 & 15, x1 >> 4] for the 16 qs bytes x0, x1 of two
 * blocks: the element order of each block */
INLINE __m512i nibbles_pair_v(__m128i x0, __m128i x1)
{
    __m512i z = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(x0), 0xFF00, x1);
    z = _mm512_mask_srli_epi16(z, 0xFF00FF00, z, 4); /* 128-bit lanes 1 and 3 */
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}

/* qs1 NULL: a missing second block (zeros) */
INLINE __m512i nibbles_pair(const uint8_t *qs0, const uint8_t *qs1)
{
    return nibbles_pair_v(_mm_loadu_si128((const __m128i *)qs0),
                          qs1 ? _mm_loadu_si128((const __m128i *)qs1) : _mm_setzero_si128());
}

/* Adds 16 to the levels whose bit in the fifth-bit words h0 (first block)
 * and h1 (second) is set. */
INLINE __m512i add_fifth_bit_v(__m512i q, uint32_t h0, uint32_t h1)
{
    const __mmask64 k = ((uint64_t)h1 << 32) | h0;
    return _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16));
}

/* qh1 NULL: a missing second block */
INLINE __m512i add_fifth_bit(__m512i q, const uint8_t *qh0, const uint8_t *qh1)
{
    uint32_t h0, h1 = 0;
    memcpy(&h0, qh0, 4);
    if (qh1)
        memcpy(&h1, qh1, 4);
    return add_fifth_bit_v(q, h0, h1);
}

/* Moves bit `from` of every byte to bit `to` (from, to even, |to - from| <= 6);
 * callers mask out the other bits, and the kept bit always comes from the
 * same byte despite the 16-bit shift. */
INLINE __m512i move_bit(__m512i v, int from, int to)
{
    switch (to - from) {
    case 4: return _mm512_slli_epi16(v, 4);
    case 2: return _mm512_slli_epi16(v, 2);
    case 0: return v;
    case -2: return _mm512_srli_epi16(v, 2);
    case -4: return _mm512_srli_epi16(v, 4);
    default: return _mm512_srli_epi16(v, 6);
    }
}


/* Sum of the 16 lanes in a fixed tree (that of GCC's _mm512_reduce_add_ps,
 * written out so that no header decides it): kernels that keep the same
 * sums in other registers reproduce it lane for lane (reduce16_v). */
INLINE __m128 reduce16_tree4(__m512 v)
{
    const __m256 h = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    return _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
}

INLINE float reduce16(__m512 v)
{
    const __m128 q = reduce16_tree4(v);
    const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q)); /* q0 + q2, q1 + q3 */
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

/* reduce16 of sixteen vectors at once: lane r of the result is the tree sum
 * over L of lane r of v[L]. v is overwritten. */
INLINE __m512 reduce16_v(__m512 v[16])
{
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        v[i] = _mm512_add_ps(v[i + 8], v[i]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        v[i] = _mm512_add_ps(v[i + 4], v[i]);
    return _mm512_add_ps(_mm512_add_ps(v[0], v[2]), _mm512_add_ps(v[1], v[3]));
}


/* out[i] = column i of the 16 x 16 bytes whose rows are a[0..15]. */
INLINE void transpose16_epi8(const __m128i a[16], __m128i out[16])
{
    __m128i s1[16], s2[16], s3[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) { /* [half of the columns][row pair] */
        s1[i] = _mm_unpacklo_epi8(a[2 * i], a[2 * i + 1]);
        s1[8 + i] = _mm_unpackhi_epi8(a[2 * i], a[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) /* [column quad][row quad] */
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            s2[8 * h + i] = _mm_unpacklo_epi16(s1[8 * h + 2 * i], s1[8 * h + 2 * i + 1]);
            s2[8 * h + 4 + i] = _mm_unpackhi_epi16(s1[8 * h + 2 * i], s1[8 * h + 2 * i + 1]);
        }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) /* [column quad][row octet][column pair] */
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++) {
            s3[4 * c + 2 * i] = _mm_unpacklo_epi32(s2[4 * c + 2 * i], s2[4 * c + 2 * i + 1]);
            s3[4 * c + 2 * i + 1] = _mm_unpackhi_epi32(s2[4 * c + 2 * i], s2[4 * c + 2 * i + 1]);
        }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
            out[4 * c + 2 * p] = _mm_unpacklo_epi64(s3[4 * c + p], s3[4 * c + 2 + p]);
            out[4 * c + 2 * p + 1] = _mm_unpackhi_epi64(s3[4 * c + p], s3[4 * c + 2 + p]);
        }
}

/* The k-quants with 16 groups of 16 values, one scale each. */
typedef enum { K_Q2, K_Q3, K_Q6 } k16_kind_t;

/* Levels (unsigned, offset not yet removed) of the k-th 64 values. */
INLINE __m512i k16_levels(k16_kind_t K, const void *blk, int k, __m512i hm)
{
    const int half = k / 2, t = k % 2;
    if (K == K_Q6) {
        const ecs_block_q6_K *x = blk;
        const __m512i l = _mm512_loadu_si512((const void *)(x->ql + 64 * half));
        const __m256i h = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * half));
        const __m512i h2 = join256(h, _mm256_srli_epi16(h, 2)); /* [qh, qh >> 2] */
        const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
        if (t == 0)
            return _mm512_or_si512(_mm512_and_si512(l, m4),
                                   _mm512_and_si512(_mm512_slli_epi16(h2, 4), m30));
        return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                               _mm512_and_si512(h2, m30));
    }
    const uint8_t *qs = K == K_Q2 ? ((const ecs_block_q2_K *)blk)->qs
                                  : ((const ecs_block_q3_K *)blk)->qs;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * half));
    __m512i qq = join256(q, _mm256_srli_epi16(q, 2)); /* [q, q >> 2] */
    if (t)
        qq = _mm512_srli_epi16(qq, 4);
    __m512i lv = _mm512_and_si512(qq, _mm512_set1_epi8(3));
    if (K == K_Q3) /* hmask bit 2k of [hm, hm >> 1] is the third bit */
        lv = _mm512_or_si512(lv, _mm512_and_si512(move_bit(hm, 2 * k, 2), _mm512_set1_epi8(4)));
    return lv;
}

#endif
