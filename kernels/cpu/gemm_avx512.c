/* gemm_avx512.c - quantized products in a layout that all quant types share
 * (AVX-512 VNNI): batched products (several activation rows against one
 * weight matrix: prompt processing, experts in prefill) and, with the same
 * arithmetic, the row kernel that decode uses.
 *
 * The row kernels of dot_avx512.c decode every weight block again for each
 * group of four activation rows and scale every 64-value vector product
 * separately. Here matmul.c packs the activation rows once per call, unpacks
 * a tile of weight rows once, and a register-blocked microkernel (GEMM_MR
 * weight rows x GEMM_NR activation rows) does all pairs:
 *
 *  - a 256-value superblock is sixteen groups of 16 values; every quant type
 *    has one scale (and one min) per group or per 32 values. The levels are
 *    stored transposed so that the 32-bit lane L of each of the four vectors
 *    holds four values of the same group: the four vpdpbusd of a superblock
 *    chain into one register whose lanes are whole group sums (no scale per
 *    vector);
 *  - weights are unsigned levels (Q8_0: w + 128); each level offset (Q4_0:
 *    8, Q5_0: 16, Q8_0: 128, Q3_K: 4, Q6_K: 32) is taken off in integers by
 *    starting the chain at -offset * (group sum of the activations), which
 *    the activation packing stores. Group sums are then exactly the scalar
 *    reference's integer sums (a group sum is below 2^20);
 *  - per pair and superblock: 4 vpdpbusd, one int->float conversion, one
 *    multiply (weight scales x activation scales, per lane) and one FMA, plus
 *    one FMA for the types with mins (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K).
 *
 * The row kernel (fewer than KCPU_GEMM_MIN_NB activation rows) unpacks one
 * weight row at a time in registers and does the same float operations in
 * the same order, so a product's bits do not depend on the batch it is in.
 * Only the float scaling and accumulation order differ from the reference.
 * A row whose length is not a multiple of 256 (legacy types) ends with a
 * zero-padded superblock. */
#include "kernels/cpu/simd_avx512.h"

#define SB KCPU_GEMM_SB
/* Loops over a compile-time number of rows, unrolled: accumulators in registers. */
#define FOR_ROWS(r) _Pragma("GCC unroll 4") for (int r = 0; r < NA; r++)
/* Microkernel size: 16 pairs, 4 weight and 4 activation vectors per step;
 * the 32 accumulators (chains and float sums) use every register and a few
 * spills, which measured faster than 4 x 3 or 3 x 4 (docs/benchmarks.md). */
#define GEMM_MR 4 /* weight rows per microkernel */
#define GEMM_NR 4 /* activation rows per microkernel */

/* Byte offsets inside a superblock. Weights: levels, per-lane scales, per-
 * lane mins. Activations: values, chain start, per-lane scales, per-lane
 * terms the mins multiply. */
enum { W_SC = 256, W_MN = 320, A_INIT = 256, A_SC = 320, A_MN = 384 };

INLINE size_t w_sb_bytes(bool min)
{
    return min ? 384 : 320;
}

INLINE size_t a_sb_bytes(bool min)
{
    return min ? 448 : 384;
}

/* Which 16-value group (0..15 in the superblock) each 128-bit lane of the
 * unpacked vectors holds before the transpose: entry 4 v + q is lane q of
 * vector v. Each type takes the order its bits unpack to cheapest; the
 * activations are packed to match. */
static const uint8_t GROUPS_NATURAL[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
/* Q4_K / Q5_K: low and high nibbles of 64 bytes of qs */
static const uint8_t GROUPS_K4[16] = {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15};
/* Q4_0, Q4_1: low and high nibbles of the qs of four blocks (Q5_0, Q5_1 take
 * the natural order: their fifth bits are cheapest per pair of blocks) */
static const uint8_t GROUPS_NIB[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};

INLINE const uint8_t *type_groups(ecs_type_t T)
{
    switch (T) {
    case ECS_TYPE_Q4_K:
    case ECS_TYPE_Q5_K: return GROUPS_K4;
    case ECS_TYPE_Q4_0:
    case ECS_TYPE_Q4_1: return GROUPS_NIB;
    default: return GROUPS_NATURAL;
    }
}

/* After the transpose, 32-bit lane L = 4 q + v holds the values of the group
 * that lane q of vector v held: this maps lanes to groups. */
INLINE __m512i lane_groups(ecs_type_t T)
{
    const __m512i transpose =
        _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const __m512i g = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)type_groups(T)));
    return _mm512_permutexvar_epi32(transpose, g);
}

/* Four vectors, each 128-bit lane the 16 values of one group -> vector k,
 * lane L = values 4k..4k+3 of lane L's group (a 4x4 transpose of 32-bit
 * words within each 128 bits). */
INLINE void transpose_groups(__m512i v[4])
{
    const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
    v[0] = _mm512_unpacklo_epi64(t0, t2);
    v[1] = _mm512_unpackhi_epi64(t0, t2);
    v[2] = _mm512_unpacklo_epi64(t1, t3);
    v[3] = _mm512_unpackhi_epi64(t1, t3);
}

INLINE bool type_has_min(ecs_type_t T)
{
    return T == ECS_TYPE_Q4_1 || T == ECS_TYPE_Q5_1 || T == ECS_TYPE_Q2_K || T == ECS_TYPE_Q4_K ||
           T == ECS_TYPE_Q5_K;
}

INLINE size_t block_bytes(ecs_type_t T)
{
    switch (T) {
    case ECS_TYPE_Q4_0: return sizeof(ecs_block_q4_0);
    case ECS_TYPE_Q4_1: return sizeof(ecs_block_q4_1);
    case ECS_TYPE_Q5_0: return sizeof(ecs_block_q5_0);
    case ECS_TYPE_Q5_1: return sizeof(ecs_block_q5_1);
    case ECS_TYPE_Q8_0: return sizeof(ecs_block_q8_0);
    case ECS_TYPE_Q2_K: return sizeof(ecs_block_q2_K);
    case ECS_TYPE_Q3_K: return sizeof(ecs_block_q3_K);
    case ECS_TYPE_Q4_K: return sizeof(ecs_block_q4_K);
    case ECS_TYPE_Q5_K: return sizeof(ecs_block_q5_K);
    default: return sizeof(ecs_block_q6_K);
    }
}

INLINE bool is_k_quant(ecs_type_t T)
{
    return T == ECS_TYPE_Q2_K || T == ECS_TYPE_Q3_K || T == ECS_TYPE_Q4_K || T == ECS_TYPE_Q5_K ||
           T == ECS_TYPE_Q6_K;
}

/* ------------------------------------------------------------------------ */
/* Weights                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    __m512i q[4];  /* unsigned levels, groups as type_groups() says */
    __m512 sc, mn; /* per lane (after the transpose): scale, min term */
} wsb_t;

INLINE __m512 lanes_ps(__m512i idx, __m512i v, float mul)
{
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(idx, v)),
                         _mm512_set1_ps(mul));
}

/* Q4_K / Q5_K scales and mins (8 x 6 bits each in 12 bytes) as 16 bytes
 * [scale 0..7, min 0..7]: bytes 0..3 hold scales 0..3 and (bits 6, 7) the
 * high bits of scales 4..7, bytes 4..7 mins 0..3 and the high bits of mins
 * 4..7, bytes 8..11 the low bits of scales (low nibble) and mins (high) 4..7.
 * The 16-byte load stays inside the block (qs follows the scales). */
INLINE __m128i k4_scales_mins(const uint8_t *s)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)s);
    const __m128i a = _mm_shuffle_epi8(q, _mm_set_epi8(11, 10, 9, 8, 7, 6, 5, 4, 11, 10, 9, 8, 3,
                                                       2, 1, 0));
    const __m128i b = _mm_shuffle_epi8(q, _mm_set_epi8(7, 6, 5, 4, -1, -1, -1, -1, 3, 2, 1, 0, -1,
                                                       -1, -1, -1));
    const __m128i lo = _mm_and_si128(_mm_mask_blend_epi8(0xF000, a, _mm_srli_epi16(a, 4)),
                                     _mm_set_epi32(0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F));
    return _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30)));
}

INLINE void unpack_k4(bool five, const void *blk, __m512i lg, wsb_t *u)
{
    const uint8_t *scales, *qs, *qh = NULL;
    const ecs_fp16_t *dd; /* d, dmin */
    if (five) {
        const ecs_block_q5_K *x = blk;
        scales = x->scales, qs = x->qs, qh = x->qh, dd = &x->d;
    } else {
        const ecs_block_q4_K *x = blk;
        scales = x->scales, qs = x->qs, dd = &x->d;
    }
    /* [scales 0..7 * d, mins 0..7 * -dmin], then to the lanes' groups */
    uint32_t d2;
    memcpy(&d2, dd, 4);
    const __m512 f = _mm512_permutexvar_ps(
        _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
        _mm512_castps128_ps512(_mm_xor_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)d2)),
                                          _mm_castsi128_ps(_mm_set_epi32(0, 0, INT32_MIN, 0)))));
    const __m512 sm = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(k4_scales_mins(scales))), f);
    const __m512i sub = _mm512_srli_epi32(lg, 1); /* a scale per 32 values */
    u->sc = _mm512_permutexvar_ps(sub, sm);
    u->mn = _mm512_permutexvar_ps(_mm512_add_epi32(sub, _mm512_set1_epi32(8)), sm);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i a = _mm512_loadu_si512((const void *)qs);
    const __m512i b = _mm512_loadu_si512((const void *)(qs + 64));
    u->q[0] = _mm512_and_si512(a, m4);
    u->q[1] = _mm512_and_si512(_mm512_srli_epi16(a, 4), m4);
    u->q[2] = _mm512_and_si512(b, m4);
    u->q[3] = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
    if (five) { /* bit s of qh[i]: sub-block s, value i */
        const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            /* vector v: sub-blocks 4 (v / 2) + (v % 2) and that + 2 */
            const int s0 = 4 * (v / 2) + v % 2;
            const __m512i bits = join256(_mm256_set1_epi8((char)(1 << s0)),
                                         _mm256_set1_epi8((char)(1 << (s0 + 2))));
            u->q[v] = _mm512_mask_add_epi8(u->q[v], _mm512_test_epi8_mask(h, bits), u->q[v],
                                           _mm512_set1_epi8(16));
        }
    }
}

INLINE void unpack_k16(k16_kind_t K, const void *blk, __m512i lg, wsb_t *u)
{
    u->mn = _mm512_setzero_ps();
    __m512i hm = _mm512_setzero_si512();
    __m128i s8;
    float d;
    if (K == K_Q6) {
        const ecs_block_q6_K *x = blk;
        d = h2f(x->d);
        s8 = _mm_loadu_si128((const __m128i *)x->scales);
    } else if (K == K_Q3) {
        const ecs_block_q3_K *x = blk;
        d = h2f(x->d);
        s8 = k3_scales(x->scales);
        const __m256i v = _mm256_loadu_si256((const __m256i *)x->hmask);
        hm = join256(v, _mm256_srli_epi16(v, 1));
    } else {
        const ecs_block_q2_K *x = blk;
        d = h2f(x->d);
        const __m128i raw = _mm_loadu_si128((const __m128i *)x->scales);
        s8 = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
        u->mn = lanes_ps(lg, _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4),
                                                                _mm_set1_epi8(0x0F))),
                         -h2f(x->dmin));
    }
    u->sc = lanes_ps(lg, _mm512_cvtepi8_epi32(s8), d);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        u->q[k] = k16_levels(K, blk, k, hm);
}

/* Legacy types: a superblock is 8 blocks of 32 values. */
/* One superblock of a legacy type: its first nblk blocks exist. The last
 * superblock of a row may be short: loads from its missing blocks are not
 * made (zeros: zero scales and levels), nothing past the row is touched.
 * For whole superblocks nblk is the constant 8 and the checks fold away. */
typedef struct {
    const uint8_t *p;
    int nblk;
} sbsrc_t;

INLINE __mmask64 first_bytes(int64_t n) /* the first n of 64 */
{
    return n >= 64 ? ~(__mmask64)0 : n <= 0 ? 0 : ((__mmask64)1 << n) - 1;
}

/* 16 / 32 / 4 bytes at offset off of block b */
INLINE __m128i ld128(sbsrc_t s, int b, size_t bsize, size_t off)
{
    return b < s.nblk ? _mm_loadu_si128((const __m128i *)(s.p + (size_t)b * bsize + off))
                      : _mm_setzero_si128();
}

INLINE __m256i ld256(sbsrc_t s, int b, size_t bsize, size_t off)
{
    return b < s.nblk ? _mm256_loadu_si256((const __m256i *)(s.p + (size_t)b * bsize + off))
                      : _mm256_setzero_si256();
}

INLINE uint32_t ld_u32(sbsrc_t s, int b, size_t bsize, size_t off)
{
    uint32_t v = 0;
    if (b < s.nblk)
        memcpy(&v, s.p + (size_t)b * bsize + off, 4);
    return v;
}

/* The fp16 at offset off of eight consecutive blocks (a superblock), as
 * floats: two word permutes over the superblock's bytes, loaded masked so
 * that nothing past its end is touched. */
INLINE __m256 legacy_f16x8(sbsrc_t s, size_t bsize, size_t off)
{
    const int64_t bytes = s.nblk * (int64_t)bsize;
    __m512i z[4];
    for (int i = 0; i < 4; i++)
        z[i] = _mm512_maskz_loadu_epi8(first_bytes(bytes - 64 * i), s.p + 64 * i);
    /* word j: (off + j bsize) / 2 */
    const __m512i j = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       0, 0, 0, 0, 0, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_add_epi16(
        _mm512_mullo_epi16(j, _mm512_set1_epi16((short)(bsize / 2))),
        _mm512_set1_epi16((short)(off / 2)));
    const __m512i lo = _mm512_permutex2var_epi16(z[0], idx, z[1]);
    const __m512i hi =
        _mm512_permutex2var_epi16(z[2], _mm512_sub_epi16(idx, _mm512_set1_epi16(64)), z[3]);
    const __mmask32 use_hi = _mm512_cmpge_epi16_mask(idx, _mm512_set1_epi16(64));
    return _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_mask_mov_epi16(lo, use_hi, hi)));
}

/* 16 bytes at the same offset of four consecutive blocks, the first b */
INLINE __m512i legacy_x4(sbsrc_t s, int b, size_t bsize, size_t off)
{
    __m512i v = _mm512_castsi128_si512(ld128(s, b, bsize, off));
    v = _mm512_inserti32x4(v, ld128(s, b + 1, bsize, off), 1);
    v = _mm512_inserti32x4(v, ld128(s, b + 2, bsize, off), 2);
    return _mm512_inserti32x4(v, ld128(s, b + 3, bsize, off), 3);
}

INLINE void unpack_legacy(ecs_type_t T, sbsrc_t s, __m512i lg, wsb_t *u)
{
    const size_t bsize = block_bytes(T);
    const __m512i per_block = _mm512_srli_epi32(lg, 1);
    const __m512 d = _mm512_castps256_ps512(legacy_f16x8(s, bsize, 0));
    u->sc = _mm512_permutexvar_ps(per_block, d);
    u->mn = _mm512_setzero_ps();
    if (T == ECS_TYPE_Q8_0) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const size_t o = offsetof(ecs_block_q8_0, qs);
            const __m512i q = join256(ld256(s, 2 * v, bsize, o), ld256(s, 2 * v + 1, bsize, o));
            u->q[v] = _mm512_xor_si512(q, _mm512_set1_epi8(-128)); /* w + 128 */
        }
        return;
    }
    size_t qs_off, qh_off = 0;
    switch (T) {
    case ECS_TYPE_Q4_0: qs_off = offsetof(ecs_block_q4_0, qs); break;
    case ECS_TYPE_Q4_1: qs_off = offsetof(ecs_block_q4_1, qs); break;
    case ECS_TYPE_Q5_0:
        qs_off = offsetof(ecs_block_q5_0, qs), qh_off = offsetof(ecs_block_q5_0, qh);
        break;
    default: qs_off = offsetof(ecs_block_q5_1, qs), qh_off = offsetof(ecs_block_q5_1, qh); break;
    }
    if (T == ECS_TYPE_Q4_1 || T == ECS_TYPE_Q5_1) /* m follows d in both */
        u->mn = _mm512_permutexvar_ps(
            per_block, _mm512_castps256_ps512(legacy_f16x8(s, bsize, sizeof(ecs_fp16_t))));
    if (T == ECS_TYPE_Q5_0 || T == ECS_TYPE_Q5_1) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            u->q[v] = add_fifth_bit_v(nibbles_pair_v(ld128(s, 2 * v, bsize, qs_off),
                                                     ld128(s, 2 * v + 1, bsize, qs_off)),
                                      ld_u32(s, 2 * v, bsize, qh_off),
                                      ld_u32(s, 2 * v + 1, bsize, qh_off));
        }
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i q = legacy_x4(s, 4 * h, bsize, qs_off);
        u->q[2 * h] = _mm512_and_si512(q, m4);
        u->q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    }
}

/* One superblock; blk is its first (k-quants: only) block, nblk the legacy
 * blocks of it that exist (less than 8 at a row's end). */
INLINE void unpack_sb(ecs_type_t T, const uint8_t *blk, int nblk, __m512i lg, wsb_t *u)
{
    switch (T) {
    case ECS_TYPE_Q4_K: unpack_k4(false, blk, lg, u); break;
    case ECS_TYPE_Q5_K: unpack_k4(true, blk, lg, u); break;
    case ECS_TYPE_Q6_K: unpack_k16(K_Q6, blk, lg, u); break;
    case ECS_TYPE_Q3_K: unpack_k16(K_Q3, blk, lg, u); break;
    case ECS_TYPE_Q2_K: unpack_k16(K_Q2, blk, lg, u); break;
    default: unpack_legacy(T, (sbsrc_t){blk, nblk}, lg, u); break;
    }
}

INLINE void store_wsb(bool min, const wsb_t *u, uint8_t *o)
{
    __m512i q[4] = {u->q[0], u->q[1], u->q[2], u->q[3]};
    transpose_groups(q);
    for (int k = 0; k < 4; k++)
        _mm512_store_si512((void *)(o + 64 * k), q[k]);
    _mm512_store_ps((void *)(o + W_SC), u->sc);
    if (min)
        _mm512_store_ps((void *)(o + W_MN), u->mn);
}

/* The blocks of an activation row's last, short superblock (legacy types),
 * followed by zero blocks: zero scales and values (once per call; the
 * weights read their short superblocks with masked loads instead). */
typedef struct {
    _Alignas(64) uint8_t b[5 * 64]; /* >= 8 blocks of any legacy type */
} tail_t;

INLINE const uint8_t *short_sb(const uint8_t *blk, size_t bsize, int64_t nblk, tail_t *t)
{
    const int64_t bytes = nblk * (int64_t)bsize;
    for (int i = 0; i < 5; i++) {
        const int64_t left = bytes - 64 * i;
        const __mmask64 m = left >= 64 ? ~(__mmask64)0 : left <= 0 ? 0 : ((__mmask64)1 << left) - 1;
        _mm512_store_si512((void *)(t->b + 64 * i), _mm512_maskz_loadu_epi8(m, blk + 64 * i));
    }
    return t->b;
}

INLINE void unpack_row(ecs_type_t T, const void *row, int64_t ncols, void *out)
{
    const bool min = type_has_min(T);
    const size_t bsize = block_bytes(T), sbb = is_k_quant(T) ? bsize : 8 * bsize;
    const int64_t full = ncols / SB;
    const __m512i lg = lane_groups(T);
    uint8_t *o = out;
    const uint8_t *in = row;
    for (int64_t sb = 0; sb < full; sb++, o += w_sb_bytes(min), in += sbb) {
        wsb_t u;
        unpack_sb(T, in, 8, lg, &u);
        store_wsb(min, &u, o);
    }
    if (ncols % SB) {
        wsb_t u;
        unpack_sb(T, in, (int)((ncols % SB) / ECS_QK), lg, &u);
        store_wsb(min, &u, o);
    }
}

/* ------------------------------------------------------------------------ */
/* Activations                                                               */
/* ------------------------------------------------------------------------ */

/* The weight levels' offset, taken off through the chain start. */
INLINE int level_offset(ecs_type_t T)
{
    switch (T) {
    case ECS_TYPE_Q4_0: return 8;
    case ECS_TYPE_Q5_0: return 16;
    case ECS_TYPE_Q8_0: return 128;
    case ECS_TYPE_Q3_K: return 4;
    case ECS_TYPE_Q6_K: return 32;
    default: return 0;
    }
}

/* The activation vectors of one superblock in the weights' group order,
 * transposed; group g's 16 values at base + 16 g (Q8_K) or at block g / 2,
 * half g % 2 (Q8_0 / Q8_1: bsize, qs_off). Group orders that keep even and
 * odd groups together (all but GROUPS_NIB) load 32 bytes at a time. */
INLINE const uint8_t *group_at(const uint8_t *base, size_t bsize, size_t qs_off, int g)
{
    return bsize ? base + (size_t)(g / 2) * bsize + qs_off + 16 * (g % 2) : base + 16 * g;
}

INLINE void act_vectors(const uint8_t *groups, bool pairs, const uint8_t *base, size_t bsize,
                        size_t qs_off, __m512i v[4])
{
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const uint8_t *g = groups + 4 * k;
#define AT(q) group_at(base, bsize, qs_off, g[q])
        if (pairs) {
            v[k] = join256(_mm256_loadu_si256((const __m256i *)AT(0)),
                           _mm256_loadu_si256((const __m256i *)AT(2)));
        } else {
            __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)AT(0)));
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)AT(1)), 1);
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)AT(2)), 2);
            v[k] = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)AT(3)), 3);
        }
#undef AT
    }
    transpose_groups(v);
}

INLINE void store_act(uint8_t *o, const __m512i v[4], __m512i init, __m512 sc)
{
    for (int k = 0; k < 4; k++)
        _mm512_store_si512((void *)(o + 64 * k), v[k]);
    _mm512_store_si512((void *)(o + A_INIT), init);
    _mm512_store_ps((void *)(o + A_SC), sc);
}

/* Q8_K rows (k-quant weights): one scale per superblock, bsums per group. */
INLINE void pack_q8_K(ecs_type_t T, const void *a, int64_t ncols, void *out)
{
    const bool min = type_has_min(T);
    const int off = level_offset(T);
    const __m512i lg = lane_groups(T);
    uint8_t *o = out;
    for (int64_t sb = 0; sb < ncols / SB; sb++, o += a_sb_bytes(min)) {
        const ecs_block_q8_K *x = (const ecs_block_q8_K *)a + sb;
        __m512i v[4];
        act_vectors(type_groups(T), type_groups(T) != GROUPS_NIB, (const uint8_t *)x->qs, 0, 0, v);
        const __m512i bs = _mm512_permutexvar_epi32(
            lg, _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)x->bsums)));
        store_act(o, v, _mm512_mullo_epi32(bs, _mm512_set1_epi32(-off)), _mm512_set1_ps(x->d));
        if (min)
            _mm512_store_ps((void *)(o + A_MN),
                            _mm512_mul_ps(_mm512_cvtepi32_ps(bs), _mm512_set1_ps(x->d)));
    }
}

/* Group sums of transposed values, as int32 per lane. */
INLINE __m512i group_sums(const __m512i v[4])
{
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++)
        s = _mm512_dpbusd_epi32(s, ones, v[k]);
    return s;
}

INLINE void pack_legacy_sb(ecs_type_t T, const uint8_t *blk, __m512i lg, uint8_t *o)
{
    const bool q8_1 = type_has_min(T);
    const size_t bsize = q8_1 ? sizeof(ecs_block_q8_1) : sizeof(ecs_block_q8_0);
    const size_t qs_off = q8_1 ? offsetof(ecs_block_q8_1, qs) : offsetof(ecs_block_q8_0, qs);
    const __m512i per_block = _mm512_srli_epi32(lg, 1);
    __m512i v[4];
    act_vectors(type_groups(T), type_groups(T) != GROUPS_NIB, blk, bsize, qs_off, v);
    const __m512i init =
        _mm512_mullo_epi32(group_sums(v), _mm512_set1_epi32(-level_offset(T)));
    const sbsrc_t src = {blk, 8};
    const __m512 d = _mm512_castps256_ps512(legacy_f16x8(src, bsize, 0));
    store_act(o, v, init, _mm512_permutexvar_ps(per_block, d));
    if (q8_1) { /* s = d * sum(qs) of a block: to its even group, 0 to the odd */
        const __m512 s = _mm512_castps256_ps512(
            legacy_f16x8(src, bsize, offsetof(ecs_block_q8_1, s)));
        const __mmask16 even = _mm512_testn_epi32_mask(lg, _mm512_set1_epi32(1));
        _mm512_store_ps((void *)(o + A_MN), _mm512_maskz_permutexvar_ps(even, per_block, s));
    }
}

/* Q8_0 / Q8_1 rows (legacy weights): a scale per 32 values. */
INLINE void pack_q8_legacy(ecs_type_t T, const void *a, int64_t ncols, void *out)
{
    const bool q8_1 = type_has_min(T);
    const size_t bsize = q8_1 ? sizeof(ecs_block_q8_1) : sizeof(ecs_block_q8_0);
    const __m512i lg = lane_groups(T);
    const uint8_t *in = a;
    uint8_t *o = out;
    for (int64_t sb = 0; sb < ncols / SB; sb++, o += a_sb_bytes(q8_1), in += 8 * bsize)
        pack_legacy_sb(T, in, lg, o);
    if (ncols % SB) {
        tail_t t;
        pack_legacy_sb(T, short_sb(in, bsize, (ncols % SB) / ECS_QK, &t), lg, o);
    }
}

/* ------------------------------------------------------------------------ */
/* Microkernel                                                               */
/* ------------------------------------------------------------------------ */

#define FOR_M(m) _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
#define FOR_N(n) _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++)

/* y[n * ldy + m] = dot(weight row m, activation row n), m < MR, n < NR.
 * w: unpacked rows wrow bytes apart; a: packed rows arow bytes apart. */
INLINE void micro(int MR, int NR, bool MIN, const uint8_t *w, size_t wrow, const uint8_t *a,
                  size_t arow, int64_t nsb, float *y, int64_t ldy)
{
    const size_t wsb = w_sb_bytes(MIN), asb = a_sb_bytes(MIN);
    __m512 acc[GEMM_MR][GEMM_NR];
    FOR_M(m) FOR_N(n) acc[m][n] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *ws = w + (size_t)s * wsb, *as = a + (size_t)s * asb;
        __m512i t[GEMM_MR][GEMM_NR];
        FOR_N(n) {
            const __m512i init = _mm512_load_si512((const void *)(as + n * arow + A_INIT));
            FOR_M(m) t[m][n] = init;
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512i wv[GEMM_MR];
            FOR_M(m) wv[m] = _mm512_load_si512((const void *)(ws + m * wrow + 64 * k));
            FOR_N(n) {
                const __m512i av = _mm512_load_si512((const void *)(as + n * arow + 64 * k));
                FOR_M(m) t[m][n] = _mm512_dpbusd_epi32(t[m][n], wv[m], av);
            }
        }
        FOR_M(m) {
            const __m512 sc = _mm512_load_ps((const void *)(ws + m * wrow + W_SC));
            FOR_N(n) {
                const __m512 s2 =
                    _mm512_mul_ps(sc, _mm512_load_ps((const void *)(as + n * arow + A_SC)));
                acc[m][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[m][n]), s2, acc[m][n]);
            }
        }
        if (MIN) {
            FOR_M(m) {
                const __m512 mn = _mm512_load_ps((const void *)(ws + m * wrow + W_MN));
                FOR_N(n) acc[m][n] = _mm512_fmadd_ps(
                    mn, _mm512_load_ps((const void *)(as + n * arow + A_MN)), acc[m][n]);
            }
        }
    }
    FOR_M(m) FOR_N(n) y[n * ldy + m] = _mm512_reduce_add_ps(acc[m][n]);
}

typedef void (*micro_fn)(const uint8_t *w, size_t wrow, const uint8_t *a, size_t arow,
                         int64_t nsb, float *y, int64_t ldy);

#define MICRO(MIN, MR, NR)                                                                    \
    static void micro_##MIN##_##MR##_##NR(const uint8_t *w, size_t wrow, const uint8_t *a,     \
                                          size_t arow, int64_t nsb, float *y, int64_t ldy)     \
    {                                                                                         \
        micro(MR, NR, MIN, w, wrow, a, arow, nsb, y, ldy);                                    \
    }
#define MICRO_ROW(MIN, MR) MICRO(MIN, MR, 1) MICRO(MIN, MR, 2) MICRO(MIN, MR, 3) MICRO(MIN, MR, 4)
#define MICRO_ALL(MIN) MICRO_ROW(MIN, 1) MICRO_ROW(MIN, 2) MICRO_ROW(MIN, 3) MICRO_ROW(MIN, 4)
MICRO_ALL(0)
MICRO_ALL(1)

#define MICRO_REF(MIN, MR) \
    {micro_##MIN##_##MR##_1, micro_##MIN##_##MR##_2, micro_##MIN##_##MR##_3, micro_##MIN##_##MR##_4}
static const micro_fn MICROS[2][GEMM_MR][GEMM_NR] = {
    {MICRO_REF(0, 1), MICRO_REF(0, 2), MICRO_REF(0, 3), MICRO_REF(0, 4)},
    {MICRO_REF(1, 1), MICRO_REF(1, 2), MICRO_REF(1, 3), MICRO_REF(1, 4)},
};

INLINE void tile(bool min, const void *w, int nw, const void *a, int na, int64_t nsb, float *y,
                 int64_t ldy)
{
    const size_t wrow = (size_t)nsb * w_sb_bytes(min), arow = (size_t)nsb * a_sb_bytes(min);
    for (int n0 = 0; n0 < na; n0 += GEMM_NR) {
        const int nr = na - n0 < GEMM_NR ? na - n0 : GEMM_NR;
        for (int m0 = 0; m0 < nw; m0 += GEMM_MR) {
            const int mr = nw - m0 < GEMM_MR ? nw - m0 : GEMM_MR;
            MICROS[min][mr - 1][nr - 1]((const uint8_t *)w + (size_t)m0 * wrow, wrow,
                                        (const uint8_t *)a + (size_t)n0 * arow, arow, nsb,
                                        y + (int64_t)n0 * ldy + m0, ldy);
        }
    }
}

static void tile_plain(const void *w, int nw, const void *a, int na, int64_t nsb, float *y,
                       int64_t ldy)
{
    tile(false, w, nw, a, na, nsb, y, ldy);
}

static void tile_min(const void *w, int nw, const void *a, int na, int64_t nsb, float *y,
                     int64_t ldy)
{
    tile(true, w, nw, a, na, nsb, y, ldy);
}

/* ------------------------------------------------------------------------ */
/* Row kernel (few activation rows, decode)                                  */
/* ------------------------------------------------------------------------ */

/* One superblock of a weight row, unpacked and transposed in registers,
 * against NA packed activation rows: the microkernel's arithmetic exactly,
 * so that a product does not depend on how many rows came with it. */
INLINE void rows_sb(ecs_type_t T, int NA, const uint8_t *blk, int nblk, __m512i lg,
                    const uint8_t *a, size_t as, __m512 *acc)
{
    const bool min = type_has_min(T);
    wsb_t u;
    unpack_sb(T, blk, nblk, lg, &u);
    transpose_groups(u.q);
    FOR_ROWS(r) {
        const uint8_t *ap = a + (size_t)r * as;
        /* two chains: half the latency, the same integer sums */
        __m512i t = _mm512_load_si512((const void *)(ap + A_INIT));
        __m512i t2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u.q[2],
                                         _mm512_load_si512((const void *)(ap + 128)));
        t = _mm512_dpbusd_epi32(t, u.q[0], _mm512_load_si512((const void *)ap));
        t2 = _mm512_dpbusd_epi32(t2, u.q[3], _mm512_load_si512((const void *)(ap + 192)));
        t = _mm512_dpbusd_epi32(t, u.q[1], _mm512_load_si512((const void *)(ap + 64)));
        t = _mm512_add_epi32(t, t2);
        const __m512 s2 = _mm512_mul_ps(u.sc, _mm512_load_ps((const void *)(ap + A_SC)));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), s2, acc[r]);
        if (min)
            acc[r] = _mm512_fmadd_ps(u.mn, _mm512_load_ps((const void *)(ap + A_MN)), acc[r]);
    }
}

INLINE void rows_impl(ecs_type_t T, int NA, int64_t n, const void *w, const void *a, size_t as,
                      float *out)
{
    const bool min = type_has_min(T);
    const size_t bsize = block_bytes(T), sbb = is_k_quant(T) ? bsize : 8 * bsize;
    const size_t asb = a_sb_bytes(min);
    const int64_t full = n / SB;
    const __m512i lg = lane_groups(T);
    __m512 acc[KCPU_MAX_NA];
    FOR_ROWS(r)
        acc[r] = _mm512_setzero_ps();
    const uint8_t *in = w;
    for (int64_t sb = 0; sb < full; sb++, in += sbb)
        rows_sb(T, NA, in, 8, lg, (const uint8_t *)a + (size_t)sb * asb, as, acc);
    if (n % SB)
        rows_sb(T, NA, in, (int)((n % SB) / ECS_QK), lg,
                (const uint8_t *)a + (size_t)full * asb, as, acc);
    FOR_ROWS(r)
        out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* ------------------------------------------------------------------------ */

#define GEMM_TYPE(name, T, pack)                                                              \
    static void name##_unpack(const void *w, int64_t ncols, void *out)                        \
    {                                                                                         \
        unpack_row(T, w, ncols, out);                                                         \
    }                                                                                         \
    static void name##_pack(const void *a, int64_t ncols, void *out)                          \
    {                                                                                         \
        pack(T, a, ncols, out);                                                               \
    }                                                                                         \
    INLINE void name##_rows(int NA, int64_t n, const void *w, const void *a, size_t as,       \
                            float *out)                                                       \
    {                                                                                         \
        rows_impl(T, NA, n, w, a, as, out);                                                   \
    }                                                                                         \
    KCPU_DEFINE_MULTI(name, name##_rows)

GEMM_TYPE(q4_0, ECS_TYPE_Q4_0, pack_q8_legacy)
GEMM_TYPE(q4_1, ECS_TYPE_Q4_1, pack_q8_legacy)
GEMM_TYPE(q5_0, ECS_TYPE_Q5_0, pack_q8_legacy)
GEMM_TYPE(q5_1, ECS_TYPE_Q5_1, pack_q8_legacy)
GEMM_TYPE(q8_0, ECS_TYPE_Q8_0, pack_q8_legacy)
GEMM_TYPE(q2_K, ECS_TYPE_Q2_K, pack_q8_K)
GEMM_TYPE(q3_K, ECS_TYPE_Q3_K, pack_q8_K)
GEMM_TYPE(q4_K, ECS_TYPE_Q4_K, pack_q8_K)
GEMM_TYPE(q5_K, ECS_TYPE_Q5_K, pack_q8_K)
GEMM_TYPE(q6_K, ECS_TYPE_Q6_K, pack_q8_K)

kcpu_gemm_t kcpu_gemm_avx512(ecs_type_t wtype)
{
#define G(name, T)                                                                            \
    (kcpu_gemm_t)                                                                             \
    {                                                                                         \
        w_sb_bytes(type_has_min(T)), a_sb_bytes(type_has_min(T)), GEMM_MR, name##_unpack,    \
            name##_pack, type_has_min(T) ? tile_min : tile_plain, name##_multi               \
    }
    switch (wtype) {
    case ECS_TYPE_Q4_0: return G(q4_0, ECS_TYPE_Q4_0);
    case ECS_TYPE_Q4_1: return G(q4_1, ECS_TYPE_Q4_1);
    case ECS_TYPE_Q5_0: return G(q5_0, ECS_TYPE_Q5_0);
    case ECS_TYPE_Q5_1: return G(q5_1, ECS_TYPE_Q5_1);
    case ECS_TYPE_Q8_0: return G(q8_0, ECS_TYPE_Q8_0);
    case ECS_TYPE_Q2_K: return G(q2_K, ECS_TYPE_Q2_K);
    case ECS_TYPE_Q3_K: return G(q3_K, ECS_TYPE_Q3_K);
    case ECS_TYPE_Q4_K: return G(q4_K, ECS_TYPE_Q4_K);
    case ECS_TYPE_Q5_K: return G(q5_K, ECS_TYPE_Q5_K);
    case ECS_TYPE_Q6_K: return G(q6_K, ECS_TYPE_Q6_K);
    default: return (kcpu_gemm_t){0, 0, 0, NULL, NULL, NULL, NULL};
    }
#undef G
}
