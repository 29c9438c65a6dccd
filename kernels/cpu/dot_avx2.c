/* dot_avx2.c - AVX2 (+FMA, F16C) dot products of weight rows with quantized
 * activation rows, and the SIMD activation quantizers.
 *
 * Integer parts use vpmaddubsw (unsigned weight levels x signed activations,
 * pairs summed into int16) and vpmaddwd (pairs times a scale into int32).
 * Levels are at most 63 and activations at least -128, so the int16 pair
 * sums never saturate: the integer sums are exactly the scalar reference's,
 * only the final float accumulation order differs.
 *
 * Every kernel takes NA activation rows (a compile-time constant) and decodes
 * each weight block once for all of them. */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/kscales.h"

#define INLINE static inline __attribute__((always_inline))
#define QK ECS_QK
#define QK_K ECS_QK_K
/* Loops over the NA activation rows must be unrolled: their accumulators
 * then live in registers instead of a stack array. */
#define FOR_ROWS(r) _Pragma("GCC unroll 8") for (int r = 0; r < NA; r++)

INLINE float h2f(ecs_fp16_t h)
{
    return _cvtsh_ss(h);
}

INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

INLINE int hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* sum over pairs of u8 x s8 products, scaled per int16 lane pair, as int32 */
INLINE __m256i dot_scaled(__m256i u8, __m256i s8, __m256i scale16)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), scale16);
}

/* Moves bit `from` of every byte to bit `to`; callers mask out the other
 * bits, and the kept bit always comes from the same byte despite the 16-bit
 * shift. */
INLINE __m256i move_bit(__m256i v, int from, int to)
{
    const int d = to - from;
    return d >= 0 ? _mm256_slli_epi16(v, d) : _mm256_srli_epi16(v, -d);
}

/* ------------------------------------------------------------------------ */
/* Legacy 32-element blocks, one per 256-bit vector                          */
/* ------------------------------------------------------------------------ */

/* [qs & 15, qs >> 4]: the block's element order */
INLINE __m256i nibbles(const uint8_t *qs)
{
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(0x0F));
}

/* Byte e = 16 if bit e of the little-endian 32-bit qh is set, else 0. */
INLINE __m256i fifth_bits(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i sel = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                          0x0101010101010101, 0x0000000000000000);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sel);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

typedef struct {
    __m256i u;    /* unsigned levels, or magnitudes of signed levels */
    __m256i sgn;  /* signed levels (their signs are applied to the activations) */
    float d, m;
} wblock_t;

INLINE bool has_min(ecs_type_t T)
{
    return T == ECS_TYPE_Q4_1 || T == ECS_TYPE_Q5_1;
}

INLINE void decode_block(ecs_type_t T, const uint8_t *w, int64_t ib, wblock_t *b)
{
    __m256i lv = _mm256_setzero_si256();
    b->m = 0.0f;
    switch (T) {
    case ECS_TYPE_Q4_0: {
        const ecs_block_q4_0 *x = (const ecs_block_q4_0 *)w + ib;
        b->d = h2f(x->d);
        lv = _mm256_sub_epi8(nibbles(x->qs), _mm256_set1_epi8(8));
        break;
    }
    case ECS_TYPE_Q5_0: {
        const ecs_block_q5_0 *x = (const ecs_block_q5_0 *)w + ib;
        b->d = h2f(x->d);
        lv = _mm256_sub_epi8(_mm256_or_si256(nibbles(x->qs), fifth_bits(x->qh)),
                             _mm256_set1_epi8(16));
        break;
    }
    case ECS_TYPE_Q8_0: {
        const ecs_block_q8_0 *x = (const ecs_block_q8_0 *)w + ib;
        b->d = h2f(x->d);
        lv = _mm256_loadu_si256((const __m256i *)x->qs);
        break;
    }
    case ECS_TYPE_Q4_1: {
        const ecs_block_q4_1 *x = (const ecs_block_q4_1 *)w + ib;
        b->d = h2f(x->d);
        b->m = h2f(x->m);
        b->u = nibbles(x->qs);
        return;
    }
    case ECS_TYPE_Q5_1: {
        const ecs_block_q5_1 *x = (const ecs_block_q5_1 *)w + ib;
        b->d = h2f(x->d);
        b->m = h2f(x->m);
        b->u = _mm256_or_si256(nibbles(x->qs), fifth_bits(x->qh));
        return;
    }
    default: b->d = 0.0f; break;
    }
    b->sgn = lv;
    b->u = _mm256_abs_epi8(lv);
}

INLINE void legacy_dot(ecs_type_t T, int NA, int64_t n, const void *w, const void *a, size_t as,
                       float *out)
{
    const int64_t nb = n / QK;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[KCPU_MAX_NA];
    float msum[KCPU_MAX_NA];
    FOR_ROWS(r) {
        acc[r] = _mm256_setzero_ps();
        msum[r] = 0.0f;
    }
    for (int64_t ib = 0; ib < nb; ib++) {
        wblock_t b;
        decode_block(T, w, ib, &b);
        FOR_ROWS(r) {
            const uint8_t *ar = (const uint8_t *)a + (size_t)r * as;
            __m256i av;
            float da;
            if (has_min(T)) {
                const ecs_block_q8_1 *y = (const ecs_block_q8_1 *)ar + ib;
                av = _mm256_loadu_si256((const __m256i *)y->qs);
                da = h2f(y->d);
                msum[r] += b.m * h2f(y->s);
            } else {
                const ecs_block_q8_0 *y = (const ecs_block_q8_0 *)ar + ib;
                av = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), b.sgn);
                da = h2f(y->d);
            }
            const __m256i s = dot_scaled(b.u, av, ones);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(b.d * da), acc[r]);
        }
    }
    FOR_ROWS(r)
        out[r] = hsum(acc[r]) + msum[r];
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
/* K-quants against Q8_K: 256 values = eight 32-byte vectors                 */
/* ------------------------------------------------------------------------ */

INLINE const ecs_block_q8_K *act_k(const void *a, size_t as, int r, int64_t i)
{
    return (const ecs_block_q8_K *)((const uint8_t *)a + (size_t)r * as) + i;
}

INLINE __m256i act_vec(const ecs_block_q8_K *b, int m)
{
    return _mm256_loadu_si256((const __m256i *)(b->qs + 32 * m));
}

/* s16 = eight int16 scales in both 128-bit halves; the result holds scale
 * `lo` in the low half and `hi` in the high half, every lane. */
INLINE __m256i pick_scales(__m256i s16, int lo, int hi)
{
    const __m128i il = _mm_set1_epi16((short)(0x0100 + 0x0202 * lo));
    const __m128i ih = _mm_set1_epi16((short)(0x0100 + 0x0202 * hi));
    return _mm256_shuffle_epi8(s16, _mm256_set_m128i(ih, il));
}

INLINE __m256i bcast_scales8(__m128i s8x8_as16)
{
    return _mm256_broadcastsi128_si256(s8x8_as16);
}


INLINE void q45k_dot(bool five, int NA, int64_t n, const void *w, const void *a, size_t as,
                     float *out)
{
    const int64_t nb = n / QK_K;
    __m256 acc[KCPU_MAX_NA];
    FOR_ROWS(r)
        acc[r] = _mm256_setzero_ps();
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
        const __m256i s16 = bcast_scales8(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        const __m128i mv = _mm_cvtsi64_si128((long long)mn8);
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
        const __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        __m256i isum[KCPU_MAX_NA];
        FOR_ROWS(r)
            isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * k));
            const __m256i m4 = _mm256_set1_epi8(0x0F);
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {
                const __m256i b4 = _mm256_set1_epi8(0x10);
                lo = _mm256_or_si256(lo, _mm256_and_si256(move_bit(hbits, 2 * k, 4), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(move_bit(hbits, 2 * k + 1, 4), b4));
            }
            const __m256i sl = pick_scales(s16, 2 * k, 2 * k);
            const __m256i sh = pick_scales(s16, 2 * k + 1, 2 * k + 1);
            FOR_ROWS(r) {
                const ecs_block_q8_K *y = act_k(a, as, r, i);
                isum[r] = _mm256_add_epi32(isum[r], dot_scaled(lo, act_vec(y, 2 * k), sl));
                isum[r] = _mm256_add_epi32(isum[r], dot_scaled(hi, act_vec(y, 2 * k + 1), sh));
            }
        }
        FOR_ROWS(r) {
            const ecs_block_q8_K *y = act_k(a, as, r, i);
            const __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums),
                                                mins16);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(d * y->d), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmin * y->d), acc[r]);
        }
    }
    FOR_ROWS(r)
        out[r] = hsum(acc[r]);
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

/* Q2_K, Q3_K and Q6_K: 16 groups of 16 with one scale each (two groups per
 * vector), levels stored with an offset (Q3_K: -4, Q6_K: -32) or with
 * per-group mins (Q2_K) that the Q8_K bsums settle per group. */
typedef enum { K_Q2, K_Q3, K_Q6 } k16_kind_t;

typedef struct {
    __m256i s16_lo, s16_hi; /* group scales 0..7 / 8..15 as int16, in both halves */
    __m256i corr16;         /* per-group factor applied to bsums: mins or scales */
    int corr_shift;         /* Q3_K: *4, Q6_K: *32 (level offset) */
    float d, dmin;
} k16_hdr_t;

INLINE void k16_header(k16_kind_t K, const void *blk, k16_hdr_t *h)
{
    __m128i s8;
    h->dmin = 0.0f;
    h->corr_shift = 0;
    if (K == K_Q2) {
        const ecs_block_q2_K *x = blk;
        const __m128i raw = _mm_loadu_si128((const __m128i *)x->scales);
        s8 = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
        h->corr16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
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
    h->s16_lo = bcast_scales8(_mm_cvtepi8_epi16(s8));
    h->s16_hi = bcast_scales8(_mm_cvtepi8_epi16(_mm_srli_si128(s8, 8)));
}

/* Levels (unsigned, offset not yet removed) of the m-th 32 values. */
INLINE __m256i k16_levels(k16_kind_t K, const void *blk, int m, __m256i hm)
{
    const int half = m / 4, j = m % 4;
    if (K == K_Q6) {
        const ecs_block_q6_K *x = blk;
        const __m256i l = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * half + 32 * (j & 1)));
        const __m256i h = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * half));
        const __m256i lv = _mm256_and_si256(j < 2 ? l : _mm256_srli_epi16(l, 4),
                                            _mm256_set1_epi8(0x0F));
        return _mm256_or_si256(lv, _mm256_and_si256(move_bit(h, 2 * j, 4), _mm256_set1_epi8(0x30)));
    }
    const uint8_t *qs = K == K_Q2 ? ((const ecs_block_q2_K *)blk)->qs
                                  : ((const ecs_block_q3_K *)blk)->qs;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * half));
    __m256i lv = _mm256_and_si256(move_bit(q, 2 * j, 0), _mm256_set1_epi8(3));
    if (K == K_Q3) /* bit (4*half + j) of hmask is the third bit */
        lv = _mm256_or_si256(lv, _mm256_and_si256(move_bit(hm, m, 2), _mm256_set1_epi8(4)));
    return lv;
}

INLINE void k16_dot(k16_kind_t K, int NA, int64_t n, const void *w, const void *a, size_t as,
                    float *out)
{
    const int64_t nb = n / QK_K;
    const size_t bsize = K == K_Q2   ? sizeof(ecs_block_q2_K)
                         : K == K_Q3 ? sizeof(ecs_block_q3_K)
                                     : sizeof(ecs_block_q6_K);
    __m256 acc[KCPU_MAX_NA];
    FOR_ROWS(r)
        acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const void *blk = (const uint8_t *)w + (size_t)i * bsize;
        k16_hdr_t h;
        k16_header(K, blk, &h);
        const __m256i hm = K == K_Q3 ? _mm256_loadu_si256(
                                           (const __m256i *)((const ecs_block_q3_K *)blk)->hmask)
                                     : _mm256_setzero_si256();
        __m256i isum[KCPU_MAX_NA];
        FOR_ROWS(r)
            isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) {
            const __m256i wq = k16_levels(K, blk, m, hm);
            const __m256i sc = pick_scales(m < 4 ? h.s16_lo : h.s16_hi, 2 * (m % 4), 2 * (m % 4) + 1);
            FOR_ROWS(r)
                isum[r] = _mm256_add_epi32(isum[r], dot_scaled(wq, act_vec(act_k(a, as, r, i), m), sc));
        }
        FOR_ROWS(r) {
            const ecs_block_q8_K *y = act_k(a, as, r, i);
            const __m256i c = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums),
                                                h.corr16);
            if (K == K_Q2)
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(h.dmin * y->d),
                                          acc[r]);
            else
                isum[r] = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(c, h.corr_shift));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(h.d * y->d),
                                     acc[r]);
        }
    }
    FOR_ROWS(r)
        out[r] = hsum(acc[r]);
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

INLINE __m256 load_f8(ecs_type_t T, const void *p, int64_t i)
{
    if (T == ECS_TYPE_F32)
        return _mm256_loadu_ps((const float *)p + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (T == ECS_TYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE float load_f1(ecs_type_t T, const void *p, int64_t i)
{
    if (T == ECS_TYPE_F32)
        return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    if (T == ECS_TYPE_F16)
        return _cvtsh_ss(h);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

INLINE void float_dot(ecs_type_t T, int NA, int64_t n, const void *w, const void *a, size_t as,
                      float *out)
{
    __m256 acc[KCPU_MAX_NA];
    FOR_ROWS(r)
        acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 wv = load_f8(T, w, i);
        FOR_ROWS(r)
            acc[r] = _mm256_fmadd_ps(wv, load_f8(T, (const uint8_t *)a + (size_t)r * as, i), acc[r]);
    }
    FOR_ROWS(r) {
        float tail = 0.0f;
        for (int64_t j = i; j < n; j++)
            tail += load_f1(T, w, j) * load_f1(T, (const uint8_t *)a + (size_t)r * as, j);
        out[r] = hsum(acc[r]) + tail;
    }
}

#define FLOAT_IMPL(name, T)                                                                   \
    INLINE void name##_impl(int NA, int64_t n, const void *w, const void *a, size_t as,       \
                            float *out)                                                       \
    {                                                                                         \
        float_dot(T, NA, n, w, a, as, out);                                                   \
    }                                                                                         \
    KCPU_DEFINE_KERNEL(name, name##_impl)

FLOAT_IMPL(f32, ECS_TYPE_F32)
FLOAT_IMPL(f16, ECS_TYPE_F16)
FLOAT_IMPL(bf16, ECS_TYPE_BF16)

kcpu_kernel_t kcpu_kernel_avx2(ecs_type_t wtype)
{
#define K(name) (kcpu_kernel_t){name##_dot, name##_multi, NULL}
    switch (wtype) {
    case ECS_TYPE_F32: return K(f32);
    case ECS_TYPE_F16: return K(f16);
    case ECS_TYPE_BF16: return K(bf16);
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
}

/* ------------------------------------------------------------------------ */
/* Activation quantizers                                                     */
/* ------------------------------------------------------------------------ */

INLINE __m256 abs_ps(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/* roundf(): half away from zero, which the Q8_0/Q8_1 references use;
 * NaN -> 0 and clamped to the int8 range like the reference. */
INLINE __m256i round_q8(__m256 v)
{
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(abs_ps(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
    __m256 r = _mm256_add_ps(t, _mm256_and_ps(up, one));
    r = _mm256_and_ps(r, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(r);
}

/* Four vectors of 8 int32 (each in int8 range) stored as 32 int8 in order. */
INLINE void store_i8x32(int8_t *dst, __m256i q0, __m256i q1, __m256i q2, __m256i q3)
{
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(p, order));
}

INLINE float absmax(const float *x, int n)
{
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) /* max(new, acc) skips NaN like fmaxf */
        m = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + j)), m);
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* Q8_0 and Q8_1 share the level arithmetic; Q8_1 adds s = d * sum(qs). */
static void quantize_q8_legacy(bool q8_1, const float *x, void *out, int64_t n)
{
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        const float d = absmax(x, QK) / 127.0f;
        const __m256 id = _mm256_set1_ps(d ? 1.0f / d : 0.0f);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = round_q8(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id));
        int8_t *qs = q8_1 ? ((ecs_block_q8_1 *)out)[i].qs : ((ecs_block_q8_0 *)out)[i].qs;
        store_i8x32(qs, q[0], q[1], q[2], q[3]);
        if (q8_1) {
            ecs_block_q8_1 *b = (ecs_block_q8_1 *)out + i;
            const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]),
                                                      _mm256_add_epi32(q[2], q[3])));
            b->d = ecs_f32_to_fp16(d);
            b->s = ecs_f32_to_fp16((float)sum * d);
        } else {
            ((ecs_block_q8_0 *)out)[i].d = ecs_f32_to_fp16(d);
        }
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
        for (int j = 0; j < QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(
                _mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + j)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int g = 0; g < QK_K / 32; g++) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * k), vs);
                v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN -> 0 */
                q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(v), _mm256_set1_epi32(127));
            }
            store_i8x32(y->qs + 32 * g, q[0], q[1], q[2], q[3]);
            y->bsums[2 * g] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
            y->bsums[2 * g + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q[2], q[3]));
        }
        y->d = 1.0f / iscale;
    }
}

bool kcpu_quantize_act_avx2(ecs_type_t vdt, const float *x, void *out, int64_t n)
{
    switch (vdt) {
    case ECS_TYPE_Q8_0: quantize_q8_legacy(false, x, out, n); return true;
    case ECS_TYPE_Q8_1: quantize_q8_legacy(true, x, out, n); return true;
    case ECS_TYPE_Q8_K: quantize_q8_K(x, out, n); return true;
    default: return false;
    }
}
