/* dot_avx512.c - AVX-512 (F/BW/VL/DQ + VNNI) dot products of weight rows with
 * quantized activation rows, and the SIMD activation quantizers.
 *
 * Integer parts use vpdpbusd (unsigned weight levels x signed activations,
 * four products per 32-bit lane). A lane holds at most 4*63*128 < 2^15, so a
 * lane can be multiplied by a sub-block scale with vpmaddwd against a vector
 * whose upper 16 bits are zero: the integer sums are exactly the scalar
 * reference's, only the final float accumulation order differs.
 *
 * Every kernel takes NA activation rows (a compile-time constant) and decodes
 * each weight block once for all of them. */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/simd_avx512.h"

/* Loops over the NA activation rows must be unrolled: their accumulators
 * then live in registers instead of a stack array. */
#define FOR_ROWS(r) _Pragma("GCC unroll 8") for (int r = 0; r < NA; r++)

/* lanes 0..7 = lo, lanes 8..15 = hi */
INLINE __m512 halves_ps(float lo, float hi)
{
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(lo), 0xFF00, _mm_set_ss(hi));
}

/* (P * S) per 32-bit lane, P in int16 range, S's upper 16 bits zero. */
INLINE __m512i scale_lanes(__m512i p, __m512i s)
{
    return _mm512_madd_epi16(p, s);
}

INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

INLINE __m512i dpbusd(__m512i u8, __m512i s8)
{
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u8, s8);
}

/* ------------------------------------------------------------------------ */
/* Legacy 32-element blocks, two per 512-bit vector                          */
/* ------------------------------------------------------------------------ */

INLINE bool has_min(ecs_type_t T)
{
    return T == ECS_TYPE_Q4_1 || T == ECS_TYPE_Q5_1;
}

INLINE size_t legacy_bytes(ecs_type_t T)
{
    switch (T) {
    case ECS_TYPE_Q4_0: return sizeof(ecs_block_q4_0);
    case ECS_TYPE_Q4_1: return sizeof(ecs_block_q4_1);
    case ECS_TYPE_Q5_0: return sizeof(ecs_block_q5_0);
    case ECS_TYPE_Q5_1: return sizeof(ecs_block_q5_1);
    default: return sizeof(ecs_block_q8_0);
    }
}

/* Weight levels are taken unsigned (Q8_0: w + 128); the offset comes off in
 * integers as offset * (sum of the activations), which vpdpbusd gives too.
 * Cheaper than making the levels signed (abs, sign mask, negating the
 * activations) once a row has few activation rows. */
INLINE int legacy_offset(ecs_type_t T)
{
    return T == ECS_TYPE_Q4_0 ? 8 : T == ECS_TYPE_Q5_0 ? 16 : T == ECS_TYPE_Q8_0 ? 128 : 0;
}

INLINE uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* The fp16 at p, p + stride, p + 2 stride, p + 3 stride as floats */
INLINE __m128 f16x4(const uint8_t *p, size_t stride)
{
    return _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, (short)ld16(p + 3 * stride),
                                      (short)ld16(p + 2 * stride), (short)ld16(p + stride),
                                      (short)ld16(p)));
}

typedef struct {
    __m512i q[2]; /* unsigned levels of blocks (0, 1) and (2, 3) */
    __m128 d, m;  /* per block */
} wquad_t;

/* Decodes four consecutive blocks of type T starting at blk. */
INLINE void decode_quad(ecs_type_t T, const uint8_t *blk, wquad_t *w)
{
    const size_t bs = legacy_bytes(T);
    w->d = f16x4(blk, bs);
    w->m = has_min(T) ? f16x4(blk + sizeof(ecs_fp16_t), bs) : _mm_setzero_ps();
    for (int h = 0; h < 2; h++) {
        const uint8_t *b0 = blk + 2 * h * bs, *b1 = b0 + bs;
        switch (T) {
        case ECS_TYPE_Q8_0: {
            const size_t o = offsetof(ecs_block_q8_0, qs);
            w->q[h] = _mm512_xor_si512(join256(_mm256_loadu_si256((const __m256i *)(b0 + o)),
                                               _mm256_loadu_si256((const __m256i *)(b1 + o))),
                                       _mm512_set1_epi8(-128));
            break;
        }
        case ECS_TYPE_Q4_0:
        case ECS_TYPE_Q4_1: {
            const size_t o = T == ECS_TYPE_Q4_0 ? offsetof(ecs_block_q4_0, qs)
                                                : offsetof(ecs_block_q4_1, qs);
            w->q[h] = nibbles_pair(b0 + o, b1 + o);
            break;
        }
        default: { /* Q5_0, Q5_1 */
            const size_t o = T == ECS_TYPE_Q5_0 ? offsetof(ecs_block_q5_0, qs)
                                                : offsetof(ecs_block_q5_1, qs);
            const size_t oh = T == ECS_TYPE_Q5_0 ? offsetof(ecs_block_q5_0, qh)
                                                 : offsetof(ecs_block_q5_1, qh);
            w->q[h] = add_fifth_bit(nibbles_pair(b0 + o, b1 + o), b0 + oh, b1 + oh);
            break;
        }
        }
    }
}

/* Four blocks (weights from blk, activations from block ib of each row: Q8_0,
 * or Q8_1 for the types with a min) against NA activation rows. */
INLINE void legacy_quad(ecs_type_t T, int NA, const uint8_t *blk, const uint8_t *a, size_t as,
                        int64_t ib, __m512 *acc, __m128 *macc)
{
    const __m512i lo = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(2));
    const size_t abs_ = has_min(T) ? sizeof(ecs_block_q8_1) : sizeof(ecs_block_q8_0);
    const size_t qo = has_min(T) ? offsetof(ecs_block_q8_1, qs) : offsetof(ecs_block_q8_0, qs);
    const int off = legacy_offset(T);
    wquad_t w;
    decode_quad(T, blk, &w);
    FOR_ROWS(r) {
        const uint8_t *ab = a + (size_t)r * as + (size_t)ib * abs_;
        const __m512 sc = _mm512_castps128_ps512(_mm_mul_ps(w.d, f16x4(ab, abs_)));
        if (has_min(T))
            macc[r] = _mm_fmadd_ps(w.m, f16x4(ab + offsetof(ecs_block_q8_1, s), abs_), macc[r]);
        for (int h = 0; h < 2; h++) {
            const uint8_t *q0 = ab + 2 * h * abs_ + qo;
            const __m512i av = join256(_mm256_loadu_si256((const __m256i *)q0),
                                       _mm256_loadu_si256((const __m256i *)(q0 + abs_)));
            __m512i s = dpbusd(w.q[h], av);
            if (off)
                s = _mm512_sub_epi32(s, dpbusd(_mm512_set1_epi8((char)off), av));
            acc[2 * r + h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                             _mm512_permutexvar_ps(h ? hi : lo, sc),
                                             acc[2 * r + h]);
        }
    }
}

INLINE void legacy_dot(ecs_type_t T, int NA, int64_t n, const void *w, const void *a, size_t as,
                       float *out)
{
    const int64_t nb = n / QK;
    const size_t bs = legacy_bytes(T);
    const size_t abs_ = has_min(T) ? sizeof(ecs_block_q8_1) : sizeof(ecs_block_q8_0);
    __m512 acc[2 * KCPU_MAX_NA]; /* two chains per row: blocks (0, 1) and (2, 3) */
    __m128 macc[KCPU_MAX_NA];
    FOR_ROWS(r) {
        acc[2 * r] = acc[2 * r + 1] = _mm512_setzero_ps();
        macc[r] = _mm_setzero_ps();
    }
    int64_t ib = 0;
    for (; ib + 4 <= nb; ib += 4)
        legacy_quad(T, NA, (const uint8_t *)w + (size_t)ib * bs, a, as, ib, acc, macc);
    if (ib < nb) { /* 1..3 blocks left: padded with zero blocks (scale 0) */
        _Alignas(64) uint8_t wt[4 * sizeof(ecs_block_q8_1)] = {0}; /* >= 4 of any */
        const size_t left = (size_t)(nb - ib);
        memcpy(wt, (const uint8_t *)w + (size_t)ib * bs, left * bs);
        _Alignas(64) uint8_t at[KCPU_MAX_NA][4 * sizeof(ecs_block_q8_1)] = {{0}};
        FOR_ROWS(r)
            memcpy(at[r], (const uint8_t *)a + (size_t)r * as + (size_t)ib * abs_, left * abs_);
        legacy_quad(T, NA, wt, at[0], sizeof(at[0]), 0, acc, macc);
    }
    FOR_ROWS(r) {
        __m128 m = macc[r];
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[2 * r], acc[2 * r + 1])) +
                 _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
    }
}

#define LEGACY_IMPL(name, T)                                                                  \
    INLINE void name##_impl(int NA, int64_t n, const void *w, const void *a, size_t as,       \
                            float *out)                                                       \
    {                                                                                         \
        legacy_dot(T, NA, n, w, a, as, out);                                                  \
    }                                                                                         \
    KCPU_DEFINE_KERNEL(name, name##_impl)

LEGACY_IMPL(q4_0, ECS_TYPE_Q4_0)
LEGACY_IMPL(q4_1, ECS_TYPE_Q4_1)
LEGACY_IMPL(q5_0, ECS_TYPE_Q5_0)
LEGACY_IMPL(q5_1, ECS_TYPE_Q5_1)
LEGACY_IMPL(q8_0, ECS_TYPE_Q8_0)

/* ------------------------------------------------------------------------ */
/* K-quants against Q8_K: 256 values = four 64-byte vectors                  */
/* ------------------------------------------------------------------------ */

INLINE const ecs_block_q8_K *act_k(const void *a, size_t as, int r, int64_t i)
{
    return (const ecs_block_q8_K *)((const uint8_t *)a + (size_t)r * as) + i;
}

INLINE __m512i act_vec(const ecs_block_q8_K *b, int k)
{
    return _mm512_loadu_si512((const void *)(b->qs + 64 * k));
}

/* Scale vector for the k-th 64 values: lane i gets all[first + i / per]
 * (per = lanes per scale group), upper 16 bits cleared for scale_lanes. */
INLINE __m512i group_scales(__m512i all, int k, int per)
{
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(k * (16 / per)),
                                         _mm512_srli_epi32(lane, per == 8 ? 3 : 2));
    return _mm512_permutexvar_epi32(idx, all);
}

INLINE __m512i lo16(__m512i v)
{
    return _mm512_and_si512(v, _mm512_set1_epi32(0xFFFF));
}
/* Q4_K and Q5_K (same scales; Q5_K adds a fifth bit from qh). */
INLINE void q45k_dot(bool five, int NA, int64_t n, const void *w, const void *a, size_t as,
                     float *out)
{
    const int64_t nb = n / QK_K;
    __m512 acc[KCPU_MAX_NA];
    __m256 macc[KCPU_MAX_NA];
    FOR_ROWS(r) {
        acc[r] = _mm512_setzero_ps();
        macc[r] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *scales, *qs, *qh = NULL;
        float d, dmin;
        if (five) {
            const ecs_block_q5_K *x = (const ecs_block_q5_K *)w + i;
            scales = x->scales, qs = x->qs, qh = x->qh;
            d = h2f(x->d), dmin = h2f(x->dmin);
        } else {
            const ecs_block_q4_K *x = (const ecs_block_q4_K *)w + i;
            scales = x->scales, qs = x->qs;
            d = h2f(x->d), dmin = h2f(x->dmin);
        }
        uint64_t sc8, mn8;
        k4_scales(scales, &sc8, &mn8);
        const __m512i sc_all = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8));
        const __m128i mv = _mm_cvtsi64_si128((long long)mn8);
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
        __m512i hbits = _mm512_setzero_si512();
        if (five) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            hbits = join256(h, _mm256_srli_epi16(h, 1));
        }
        __m512i isum[KCPU_MAX_NA];
        FOR_ROWS(r)
            isum[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * k));
            __m512i wq = _mm512_and_si512(join256(q, _mm256_srli_epi16(q, 4)),
                                          _mm512_set1_epi8(0x0F));
            if (five)
                wq = _mm512_or_si512(wq, _mm512_and_si512(move_bit(hbits, 2 * k, 4),
                                                          _mm512_set1_epi8(0x10)));
            const __m512i sc = group_scales(sc_all, k, 8);
            FOR_ROWS(r)
                isum[r] = _mm512_add_epi32(
                    isum[r], scale_lanes(dpbusd(wq, act_vec(act_k(a, as, r, i), k)), sc));
        }
        FOR_ROWS(r) {
            const ecs_block_q8_K *y = act_k(a, as, r, i);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_set1_ps(d * y->d), acc[r]);
            const __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums),
                                                mins16);
            macc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmin * y->d), macc[r]);
        }
    }
    FOR_ROWS(r)
        out[r] = _mm512_reduce_add_ps(acc[r]) - hsum256(macc[r]);
}

INLINE void q4k_impl(int NA, int64_t n, const void *w, const void *a, size_t as, float *out)
{
    q45k_dot(false, NA, n, w, a, as, out);
}
INLINE void q5k_impl(int NA, int64_t n, const void *w, const void *a, size_t as, float *out)
{
    q45k_dot(true, NA, n, w, a, as, out);
}
KCPU_DEFINE_KERNEL(q4_K, q4k_impl)
KCPU_DEFINE_KERNEL(q5_K, q5k_impl)

/* Q2_K, Q3_K and Q6_K share the shape: 16 groups of 16 with one scale each
 * (four lanes per group), levels stored with an offset (Q3_K: -4, Q6_K: -32)
 * or with per-group mins (Q2_K) that the Q8_K bsums settle per group. */
typedef struct {
    __m512i sc_all;   /* 16 group scales as 32-bit lanes, upper halves zero */
    __m256i corr16;   /* per-group factor applied to bsums: mins or scales */
    int corr_shift;   /* Q3_K: *4, Q6_K: *32 (levels offset); Q2_K: separate */
    float d, dmin;
} k16_hdr_t;

INLINE void k16_header(k16_kind_t K, const void *blk, k16_hdr_t *h)
{
    __m128i s8;
    h->dmin = 0.0f;
    if (K == K_Q2) {
        const ecs_block_q2_K *x = blk;
        const __m128i raw = _mm_loadu_si128((const __m128i *)x->scales);
        s8 = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
        h->corr16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
        h->corr_shift = 0;
        h->d = h2f(x->d);
        h->dmin = h2f(x->dmin);
    } else if (K == K_Q3) {
        const ecs_block_q3_K *x = blk;
        s8 = k3_scales(x->scales);
        h->corr16 = _mm256_cvtepi8_epi16(s8);
        h->corr_shift = 2;
        h->d = h2f(x->d);
    } else {
        const ecs_block_q6_K *x = blk;
        s8 = _mm_loadu_si128((const __m128i *)x->scales);
        h->corr16 = _mm256_cvtepi8_epi16(s8);
        h->corr_shift = 5;
        h->d = h2f(x->d);
    }
    h->sc_all = lo16(_mm512_cvtepi8_epi32(s8));
}

INLINE void k16_dot(k16_kind_t K, int NA, int64_t n, const void *w, const void *a, size_t as,
                    float *out)
{
    const int64_t nb = n / QK_K;
    const size_t bsize = K == K_Q2   ? sizeof(ecs_block_q2_K)
                         : K == K_Q3 ? sizeof(ecs_block_q3_K)
                                     : sizeof(ecs_block_q6_K);
    __m512 acc[KCPU_MAX_NA];
    __m256 macc[KCPU_MAX_NA];
    FOR_ROWS(r) {
        acc[r] = _mm512_setzero_ps();
        macc[r] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        const void *blk = (const uint8_t *)w + (size_t)i * bsize;
        k16_hdr_t h;
        k16_header(K, blk, &h);
        __m512i hm = _mm512_setzero_si512();
        if (K == K_Q3) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)((const ecs_block_q3_K *)blk)->hmask);
            hm = join256(v, _mm256_srli_epi16(v, 1));
        }
        __m512i isum[KCPU_MAX_NA];
        FOR_ROWS(r)
            isum[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m512i wq = k16_levels(K, blk, k, hm);
            const __m512i sc = group_scales(h.sc_all, k, 4);
            FOR_ROWS(r)
                isum[r] = _mm512_add_epi32(
                    isum[r], scale_lanes(dpbusd(wq, act_vec(act_k(a, as, r, i), k)), sc));
        }
        FOR_ROWS(r) {
            const ecs_block_q8_K *y = act_k(a, as, r, i);
            const __m256i c = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums),
                                                h.corr16);
            if (K == K_Q2)
                macc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(h.dmin * y->d),
                                          macc[r]);
            else
                isum[r] = _mm512_sub_epi32(
                    isum[r], _mm512_zextsi256_si512(_mm256_slli_epi32(c, h.corr_shift)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_set1_ps(h.d * y->d),
                                     acc[r]);
        }
    }
    FOR_ROWS(r)
        out[r] = _mm512_reduce_add_ps(acc[r]) - (K == K_Q2 ? hsum256(macc[r]) : 0.0f);
}

INLINE void q2k_impl(int NA, int64_t n, const void *w, const void *a, size_t as, float *out)
{
    k16_dot(K_Q2, NA, n, w, a, as, out);
}
INLINE void q3k_impl(int NA, int64_t n, const void *w, const void *a, size_t as, float *out)
{
    k16_dot(K_Q3, NA, n, w, a, as, out);
}
INLINE void q6k_impl(int NA, int64_t n, const void *w, const void *a, size_t as, float *out)
{
    k16_dot(K_Q6, NA, n, w, a, as, out);
}
KCPU_DEFINE_KERNEL(q2_K, q2k_impl)
KCPU_DEFINE_KERNEL(q3_K, q3k_impl)
KCPU_DEFINE_KERNEL(q6_K, q6k_impl)

/* ------------------------------------------------------------------------ */
/* Float weights                                                             */
/* ------------------------------------------------------------------------ */

/* 16 values of type T at element i, the lanes outside mask zero. */
INLINE __m512 load_f(ecs_type_t T, const void *p, int64_t i, __mmask16 m)
{
    if (T == ECS_TYPE_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (T == ECS_TYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE void float_dot(ecs_type_t T, int NA, int64_t n, const void *w, const void *a, size_t as,
                      float *out)
{
    __m512 acc[KCPU_MAX_NA];
    FOR_ROWS(r)
        acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 wv = load_f(T, w, i, m);
        FOR_ROWS(r)
            acc[r] = _mm512_fmadd_ps(wv, load_f(T, (const uint8_t *)a + (size_t)r * as, i, m),
                                     acc[r]);
    }
    FOR_ROWS(r)
        out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* float_dot for KCPU_ROWS_W weight rows at once: every (row, activation
 * row) pair keeps its own chain in the same order, so the same bits; one
 * weight load per NA FMAs and one activation load per four (float_dot:
 * NA + 1 loads per NA FMAs held it at ~40 % of the FMA peak). */
INLINE void float_dot_rows(ecs_type_t T, int NA, int64_t n, const void *w, size_t ws,
                           const void *a, size_t as, float *out)
{
    __m512 acc[KCPU_ROWS_W][KCPU_MAX_NA];
#pragma GCC unroll 4
    for (int m = 0; m < KCPU_ROWS_W; m++)
        FOR_ROWS(r)
            acc[m][r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 wv[KCPU_ROWS_W];
#pragma GCC unroll 4
        for (int m = 0; m < KCPU_ROWS_W; m++)
            wv[m] = load_f(T, (const uint8_t *)w + (size_t)m * ws, i, k);
        FOR_ROWS(r) {
            const __m512 av = load_f(T, (const uint8_t *)a + (size_t)r * as, i, k);
#pragma GCC unroll 4
            for (int m = 0; m < KCPU_ROWS_W; m++)
                acc[m][r] = _mm512_fmadd_ps(wv[m], av, acc[m][r]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < KCPU_ROWS_W; m++)
        FOR_ROWS(r)
            out[m * KCPU_MAX_NA + r] = _mm512_reduce_add_ps(acc[m][r]);
}

#define FLOAT_IMPL(name, T)                                                                   \
    INLINE void name##_impl(int NA, int64_t n, const void *w, const void *a, size_t as,       \
                            float *out)                                                       \
    {                                                                                         \
        float_dot(T, NA, n, w, a, as, out);                                                   \
    }                                                                                         \
    KCPU_DEFINE_KERNEL(name, name##_impl)                                                     \
    static void name##_rows(int64_t n, const void *w, size_t ws, const void *a, size_t as,    \
                            int na, float *out)                                               \
    {                                                                                         \
        switch (na) {                                                                         \
        case 1: float_dot_rows(T, 1, n, w, ws, a, as, out); break;                            \
        case 2: float_dot_rows(T, 2, n, w, ws, a, as, out); break;                            \
        case 3: float_dot_rows(T, 3, n, w, ws, a, as, out); break;                            \
        default: float_dot_rows(T, 4, n, w, ws, a, as, out); break;                           \
        }                                                                                     \
    }

FLOAT_IMPL(f32, ECS_TYPE_F32)
FLOAT_IMPL(f16, ECS_TYPE_F16)
FLOAT_IMPL(bf16, ECS_TYPE_BF16)

kcpu_kernel_t kcpu_kernel_avx512(ecs_type_t wtype)
{
#define K(name) (kcpu_kernel_t){name##_dot, name##_multi, NULL}
#define KR(name) (kcpu_kernel_t){name##_dot, name##_multi, name##_rows}
    switch (wtype) {
    case ECS_TYPE_F32: return KR(f32);
    case ECS_TYPE_F16: return KR(f16);
    case ECS_TYPE_BF16: return KR(bf16);
    case ECS_TYPE_Q4_0: return K(q4_0);
    case ECS_TYPE_Q4_1: return K(q4_1);
    case ECS_TYPE_Q5_0: return K(q5_0);
    case ECS_TYPE_Q5_1: return K(q5_1);
    case ECS_TYPE_Q8_0: return K(q8_0);
    case ECS_TYPE_Q2_K: return K(q2_K);
    case ECS_TYPE_Q3_K: return K(q3_K);
    case ECS_TYPE_Q4_K: return K(q4_K);
    case ECS_TYPE_Q5_K: return K(q5_K);
    case ECS_TYPE_Q6_K: return K(q6_K);
    default: return (kcpu_kernel_t){NULL, NULL, NULL};
    }
#undef K
#undef KR
}

/* ------------------------------------------------------------------------ */
/* Activation quantizers                                                     */
/* ------------------------------------------------------------------------ */

/* roundf(): half away from zero, which the Q8_0/Q8_1 references use. */
INLINE __m512 round_away(__m512 v)
{
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 one = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
    return _mm512_mask_add_ps(t, up, t, one);
}

/* 16 values * id rounded like the reference (NaN -> 0, clamp to int8),
 * stored as int8; returns their int32 values. */
INLINE __m512i q8_16(const float *x, __m512 id, int8_t *dst)
{
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), id);
    __m512 r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), round_away(v));
    r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
    const __m512i q = _mm512_cvtps_epi32(r);
    _mm_storeu_si128((__m128i *)dst, _mm512_cvtsepi32_epi8(q));
    return q;
}

INLINE float absmax(const float *x, int n)
{
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) /* max(new, acc) skips NaN like fmaxf */
        m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + j)), m);
    return _mm512_reduce_max_ps(m);
}

/* Lane b: absmax(x + 32 b, 32) for 16 consecutive blocks, the lanes'
 * maxima gathered by one transpose instead of 16 reductions (max is exact:
 * the order does not matter). */
INLINE __m512 absmax16(const float *x)
{
    __m512i m[16];
#pragma GCC unroll 16
    for (int b = 0; b < 16; b++) {
        const __m512 v = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + QK * b)),
                                       _mm512_setzero_ps());
        m[b] = _mm512_castps_si512(
            _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + QK * b + 16)), v));
    }
    ecs_transpose16_epi32(m);
    __m512 r = _mm512_castsi512_ps(m[0]);
#pragma GCC unroll 15
    for (int i = 1; i < 16; i++)
        r = _mm512_max_ps(_mm512_castsi512_ps(m[i]), r);
    return r;
}

/* Sixteen Q8_0 blocks: the scales, their inverses and their F16 form for
 * all of them at once (the same IEEE operations as one block at a time). */
static void quantize_q8_0_x16(const float *x, ecs_block_q8_0 *y)
{
    const __m512 d = _mm512_div_ps(absmax16(x), _mm512_set1_ps(127.0f));
    const __mmask16 nz = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    float id[16];
    _mm512_storeu_ps(id, _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d));
    uint16_t dh[16];
    _mm256_storeu_si256((__m256i *)dh,
                        _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (int b = 0; b < 16; b++, x += QK) {
        const __m512 v = _mm512_set1_ps(id[b]);
        q8_16(x, v, y[b].qs);
        q8_16(x + 16, v, y[b].qs + 16);
        memcpy(&y[b].d, &dh[b], sizeof dh[b]);
    }
}

/* Q8_0 and Q8_1 share the level arithmetic; Q8_1 adds s = d * sum(qs). */
static void quantize_q8_legacy(bool q8_1, const float *x, void *out, int64_t n)
{
    int64_t i = 0;
    if (!q8_1)
        for (; i + 16 <= n / QK; i += 16, x += 16 * QK)
            quantize_q8_0_x16(x, (ecs_block_q8_0 *)out + i);
    for (; i < n / QK; i++, x += QK) {
        const float d = absmax(x, QK) / 127.0f;
        const __m512 id = _mm512_set1_ps(d ? 1.0f / d : 0.0f);
        int8_t *qs = q8_1 ? ((ecs_block_q8_1 *)out)[i].qs : ((ecs_block_q8_0 *)out)[i].qs;
        const __m512i s = _mm512_add_epi32(q8_16(x, id, qs), q8_16(x + 16, id, qs + 16));
        if (q8_1) {
            ecs_block_q8_1 *b = (ecs_block_q8_1 *)out + i;
            b->d = ecs_f32_to_fp16(d);
            b->s = ecs_f32_to_fp16((float)_mm512_reduce_add_epi32(s) * d);
        } else {
            ((ecs_block_q8_0 *)out)[i].d = ecs_f32_to_fp16(d);
        }
    }
}

/* y->bsums from y->qs (levels within +-127): each 8 levels + 128 summed by
 * vpsadbw, adjacent sums added, the offset taken off; a 16-lane reduction
 * per 16 values cost more than the levels themselves. */
INLINE void q8_K_bsums(ecs_block_q8_K *y)
{
    const __m512i off = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
    for (int k = 0; k < QK_K / 64; k++) {
        const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(y->qs + 64 * k), off);
        const __m512i s8 = _mm512_sad_epu8(u, _mm512_setzero_si512());
        const __m512i s16 = _mm512_add_epi64(s8, _mm512_shuffle_epi32(s8, _MM_PERM_BADC));
        int64_t v[8];
        _mm512_storeu_si512(v, s16);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
            y->bsums[4 * k + g] = (int16_t)(v[2 * g] - 16 * 128);
    }
}

/* Q8_K: scale from the signed value of largest magnitude (the first one on
 * ties), levels rounded to nearest even (NaN -> 0), capped at 127. */
static void quantize_q8_K(const float *x, void *out, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        ecs_block_q8_K *y = (ecs_block_q8_K *)out + i;
        const float amax = absmax(x, QK_K);
        if (!(amax > 0.0f)) {
            memset(y, 0, sizeof(*y));
            continue;
        }
        float max = 0.0f;
        for (int j = 0; j < QK_K; j += 16) {
            const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)),
                                                     _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (hit) {
                max = x[j + __builtin_ctz(hit)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m512 vs = _mm512_set1_ps(iscale);
        for (int g = 0; g < QK_K / 16; g++) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * g), vs);
            v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v); /* NaN -> 0 */
            const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(y->qs + 16 * g), _mm512_cvtsepi32_epi8(q));
        }
        q8_K_bsums(y);
        y->d = 1.0f / iscale;
    }
}

bool kcpu_quantize_act_avx512(ecs_type_t vdt, const float *x, void *out, int64_t n)
{
    switch (vdt) {
    case ECS_TYPE_Q8_0: quantize_q8_legacy(false, x, out, n); return true;
    case ECS_TYPE_Q8_1: quantize_q8_legacy(true, x, out, n); return true;
    case ECS_TYPE_Q8_K: quantize_q8_K(x, out, n); return true;
    default: return false;
    }
}
