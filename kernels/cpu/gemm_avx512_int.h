/* gemm_avx512_int.h - private to gemm_avx512.c and gemm_r16_avx512.c (and
 * only for files built with the AVX-512 flags): the layout of the shared
 * superblocks (sizes and offsets per quant type, the order of the groups)
 * and the unpacking of weight superblocks into it. Every helper is INLINE
 * (always_inline), as it was when all of this was one file, so each kernel
 * inlines the same code; the layout itself is described in gemm_avx512.c. */
#ifndef ECS_KCPU_GEMM_AVX512_INT_H
#define ECS_KCPU_GEMM_AVX512_INT_H

#include "kernels/cpu/simd_avx512.h"

/* Loops over a compile-time number of rows, unrolled: accumulators in registers. */
#define FOR_ROWS(r) _Pragma("GCC unroll 4") for (int r = 0; r < NA; r++)
/* Microkernel size: 16 pairs, 4 weight and 4 activation vectors per step;
 * the 32 accumulators (chains and float sums) use every register and a few
 * spills, which measured faster than 4 x 3 or 3 x 4 (docs/benchmarks.md). */
#define GEMM_MR 4 /* weight rows per microkernel */
#define GEMM_NR 4 /* activation rows per microkernel */

INLINE bool type_has_min(ecs_type_t T)
{
    return T == ECS_TYPE_Q4_1 || T == ECS_TYPE_Q5_1 || T == ECS_TYPE_Q2_K || T == ECS_TYPE_Q4_K ||
           T == ECS_TYPE_Q5_K;
}

/* A scale per 16 values (else per 32). */
INLINE bool is_g16(ecs_type_t T)
{
    return T == ECS_TYPE_Q2_K || T == ECS_TYPE_Q3_K || T == ECS_TYPE_Q6_K;
}

/* Vectors of levels per superblock (KV below): 4 or 8. */
INLINE int type_kv(ecs_type_t T)
{
    return is_g16(T) ? 4 : 8;
}

/* Byte offsets inside a superblock of KV vectors. Weights: levels, per-lane
 * scales, per-lane mins. Activations: values, chain start, per-lane scales,
 * per-lane terms the mins multiply. */
INLINE size_t w_sc(int KV) { return 64 * (size_t)KV; }
INLINE size_t w_mn(int KV) { return 64 * (size_t)KV + 64; }
INLINE size_t a_init(int KV) { return 64 * (size_t)KV; }
INLINE size_t a_sc(int KV) { return 64 * (size_t)KV + 64; }
INLINE size_t a_mn(int KV) { return 64 * (size_t)KV + 128; }

INLINE size_t w_sb_bytes(int KV, bool min)
{
    return 64 * (size_t)KV + (min ? 128 : 64);
}

INLINE size_t a_sb_bytes(int KV, bool min)
{
    return 64 * (size_t)KV + (min ? 192 : 128);
}

/* Which group (0..15 in the superblock) each 128-bit lane of the first four
 * unpacked vectors holds before the transpose: entry 4 v + q is lane q of
 * vector v (for 32-value groups, the second four vectors hold the second
 * halves at the same places). Each type takes the order its bits unpack to
 * cheapest; the activations are packed to match. */
static const uint8_t GROUPS_NATURAL[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
/* Q4_K / Q5_K: low and high nibbles of qs bytes 0-15, 32-47, 64-79, 96-111
 * of the two blocks (bytes 16-31, ... the second halves) */
static const uint8_t GROUPS_K4[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};

INLINE const uint8_t *type_groups(ecs_type_t T)
{
    return T == ECS_TYPE_Q4_K || T == ECS_TYPE_Q5_K ? GROUPS_K4 : GROUPS_NATURAL;
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

INLINE void transpose_sets(int KV, __m512i *v)
{
    transpose_groups(v);
    if (KV == 8)
        transpose_groups(v + 4);
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

/* Values per block of the type, and blocks per superblock. */
INLINE int block_cols(ecs_type_t T)
{
    return is_k_quant(T) ? QK_K : QK;
}

INLINE int sb_blocks(ecs_type_t T)
{
    return 64 * type_kv(T) / block_cols(T);
}

/* ------------------------------------------------------------------------ */
/* Weights                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    __m512i q[8];  /* unsigned levels, groups as type_groups() says */
    __m512 sc, mn; /* per lane (after the transpose): scale, min term */
} wsb_t;

INLINE __m512 lanes_ps(__m512i idx, __m512i v, float mul)
{
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(idx, v)),
                         _mm512_set1_ps(mul));
}

/* A superblock's source: its first nblk blocks exist. The last superblock
 * of a row may be short: loads from its missing blocks are not made (zeros:
 * zero scales and levels), nothing past the row is touched. For whole
 * superblocks nblk is a constant and the checks fold away. */
typedef struct {
    const uint8_t *p;
    int nblk;
} sbsrc_t;

/* Q4_K / Q5_K scales and mins (8 x 6 bits each in 12 bytes) of two blocks
 * (s0, s1: their scales), each as 16 bytes [scale 0..7, min 0..7]: bytes 0..3 hold scales 0..3 and (bits 6, 7) the
 * high bits of scales 4..7, bytes 4..7 mins 0..3 and the high bits of mins
 * 4..7, bytes 8..11 the low bits of scales (low nibble) and mins (high) 4..7.
 * The 16-byte load stays inside the block (qs follows the scales). */
INLINE __m256i k4_scales_mins(const uint8_t *s0, const uint8_t *s1)
{
    const __m256i q = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)s0)),
        _mm_loadu_si128((const __m128i *)s1), 1);
    const __m256i a = _mm256_shuffle_epi8(
        q, _mm256_set_epi8(11, 10, 9, 8, 7, 6, 5, 4, 11, 10, 9, 8, 3, 2, 1, 0, 11, 10, 9, 8, 7, 6,
                           5, 4, 11, 10, 9, 8, 3, 2, 1, 0));
    const __m256i b = _mm256_shuffle_epi8(
        q, _mm256_set_epi8(7, 6, 5, 4, -1, -1, -1, -1, 3, 2, 1, 0, -1, -1, -1, -1, 7, 6, 5, 4, -1,
                           -1, -1, -1, 3, 2, 1, 0, -1, -1, -1, -1));
    const __m256i lo = _mm256_and_si256(
        _mm256_mask_blend_epi8(0xF000F000, a, _mm256_srli_epi16(a, 4)),
        _mm256_set_epi32(0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F,
                         0x0F0F0F0F, 0x3F3F3F3F));
    return _mm256_or_si256(lo, _mm256_and_si256(_mm256_srli_epi16(b, 2), _mm256_set1_epi8(0x30)));
}

/* 16-byte lanes 0, 2 of a and 0, 2 of b; or 1, 3 and 1, 3 */
#define LANES_EVEN 0x88
#define LANES_ODD 0xDD

/* A byte per 128-bit lane q: bit 2q (odd: 2q + 1) */
INLINE __m512i lane_bits(bool odd)
{
    const unsigned s = odd ? 1 : 0;
#define L(q) (int)(0x01010101u << (2 * (q) + s))
    return _mm512_set_epi32(L(3), L(3), L(3), L(3), L(2), L(2), L(2), L(2), L(1), L(1), L(1),
                            L(1), L(0), L(0), L(0), L(0));
#undef L
}

INLINE __m512i add16_where(__m512i q, __m512i h, __m512i bits)
{
    return _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(h, bits), q, _mm512_set1_epi8(16));
}

/* Block j (0, 1) of a Q4_K / Q5_K superblock pair from its qs bytes 0-63
 * (x0) and 64-127 (x1): bytes 0-15, 32-47, 64-79, 96-111 hold values 0-15
 * of sub-blocks 0, 2, 4, 6 (low nibbles) and 1, 3, 5, 7 (high); bytes
 * 16-31, ... their values 16-31. qh: Q5_K's fifth bits (NULL for Q4_K). */
INLINE void k4_block_v(__m512i x0, __m512i x1, const uint8_t *qh, int j, wsb_t *u)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i x = _mm512_shuffle_i64x2(x0, x1, LANES_EVEN);
    const __m512i y = _mm512_shuffle_i64x2(x0, x1, LANES_ODD);
    u->q[2 * j] = _mm512_and_si512(x, m4);
    u->q[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
    u->q[4 + 2 * j] = _mm512_and_si512(y, m4);
    u->q[5 + 2 * j] = _mm512_and_si512(_mm512_srli_epi16(y, 4), m4);
    if (qh) { /* bit s of qh[i]: sub-block s, value i */
        const __m512i ha = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qh));
        const __m512i hb = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(qh + 16)));
        u->q[2 * j] = add16_where(u->q[2 * j], ha, lane_bits(false));
        u->q[2 * j + 1] = add16_where(u->q[2 * j + 1], ha, lane_bits(true));
        u->q[4 + 2 * j] = add16_where(u->q[4 + 2 * j], hb, lane_bits(false));
        u->q[5 + 2 * j] = add16_where(u->q[5 + 2 * j], hb, lane_bits(true));
    }
}

INLINE void unpack_k4_block(bool five, const uint8_t *b, int j, wsb_t *u)
{
    const size_t o_qs = five ? offsetof(ecs_block_q5_K, qs) : offsetof(ecs_block_q4_K, qs);
    k4_block_v(_mm512_loadu_si512((const void *)(b + o_qs)),
               _mm512_loadu_si512((const void *)(b + o_qs + 64)),
               five ? b + offsetof(ecs_block_q5_K, qh) : NULL, j, u);
}

/* The scales and mins of a block pair (raw: k4_scales_mins' layout, one
 * 16-byte [scale 0..7, min 0..7] per block) and their d, dmin words h0, h1
 * into u's per-lane factors. */
INLINE void k4_factors(__m256i raw, uint32_t h0, uint32_t h1, bool two, __m512i lg, wsb_t *u)
{
    const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_set_epi32(0, 0, (int)h1, (int)h0)),
                                 _mm_set_ps(-1, 1, -1, 1)); /* d0, -dmin0, d1, -dmin1 */
    /* group g = 8 j + sub-block: [scales of block 0, of block 1], mins alike */
    __m256i sm = _mm256_permute4x64_epi64(raw, 0xD8);
    if (!two)
        sm = _mm256_and_si256(sm, _mm256_set_epi64x(0, -1, 0, -1));
    /* straight to the lanes' order: bytes by pshufb (both halves), the
     * block factors by one permute each (lane L: block lg[L] / 8) */
    const __m128i lg8 = _mm512_cvtepi32_epi8(lg);
    sm = _mm256_shuffle_epi8(sm, _mm256_broadcastsi128_si256(lg8));
    const __m512i blk2 = _mm512_slli_epi32(_mm512_srli_epi32(lg, 3), 1);
    const __m512 dv = _mm512_castps128_ps512(dd);
    const __m512 fd = _mm512_permutexvar_ps(blk2, dv);
    const __m512 fm = _mm512_permutexvar_ps(_mm512_add_epi32(blk2, _mm512_set1_epi32(1)), dv);
    u->sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(sm))),
                          fd);
    u->mn = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(sm, 1))), fm);
}

/* Two Q4_K / Q5_K blocks (the second missing at the end of an odd row). */
INLINE void unpack_k4(bool five, sbsrc_t s, __m512i lg, wsb_t *u)
{
    const size_t bs = five ? sizeof(ecs_block_q5_K) : sizeof(ecs_block_q4_K);
    const size_t o_sc = five ? offsetof(ecs_block_q5_K, scales) : offsetof(ecs_block_q4_K, scales);
    const bool two = s.nblk > 1;
    const uint8_t *b1 = two ? s.p + bs : s.p; /* a stand-in, zeroed below */
    unpack_k4_block(five, s.p, 0, u);
    if (two) {
        unpack_k4_block(five, b1, 1, u);
    } else {
        u->q[2] = u->q[3] = u->q[6] = u->q[7] = _mm512_setzero_si512();
    }
    /* d, dmin of both blocks: the first fields of both block types */
    uint32_t h0, h1 = 0;
    memcpy(&h0, s.p, 4);
    if (two)
        memcpy(&h1, b1, 4);
    k4_factors(k4_scales_mins(s.p + o_sc, b1 + o_sc), h0, h1, two, lg, u);
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

/* Legacy types: a superblock is 16 blocks of 32 values. */
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

/* The fp16 at offset off of the sixteen blocks of a superblock, as floats. */
INLINE __m512 legacy_f16x16(sbsrc_t s, size_t bsize, size_t off)
{
    const sbsrc_t hi = {s.p + 8 * bsize, s.nblk - 8};
    return _mm512_insertf32x8(_mm512_castps256_ps512(legacy_f16x8(s, bsize, off)),
                              legacy_f16x8(hi, bsize, off), 1);
}

/* The fifth bits of blocks b..b+3 for their values 0-15 (second: 16-31),
 * 16 bits per block, as a byte mask. */
INLINE __mmask64 fifth_bits(sbsrc_t s, int b, size_t bsize, size_t off, bool second)
{
    uint64_t m = 0;
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        const uint32_t h = ld_u32(s, b + q, bsize, off);
        m |= (uint64_t)(second ? h >> 16 : h & 0xFFFF) << (16 * q);
    }
    return m;
}

/* Sixteen blocks, group g = block g: vector v (4 + v) holds values 0-15
 * (16-31) of blocks 4v .. 4v + 3. */
INLINE void unpack_legacy(ecs_type_t T, sbsrc_t s, __m512i lg, wsb_t *u)
{
    const size_t bsize = block_bytes(T);
    u->sc = _mm512_permutexvar_ps(lg, legacy_f16x16(s, bsize, 0));
    u->mn = _mm512_setzero_ps();
    if (T == ECS_TYPE_Q4_1 || T == ECS_TYPE_Q5_1) /* m follows d in both */
        u->mn = _mm512_permutexvar_ps(lg, legacy_f16x16(s, bsize, sizeof(ecs_fp16_t)));
    if (T == ECS_TYPE_Q8_0) {
        const size_t o = offsetof(ecs_block_q8_0, qs);
        const __m512i flip = _mm512_set1_epi8(-128); /* w + 128 */
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const __m512i lo = join256(ld256(s, 4 * v, bsize, o), ld256(s, 4 * v + 1, bsize, o));
            const __m512i hi =
                join256(ld256(s, 4 * v + 2, bsize, o), ld256(s, 4 * v + 3, bsize, o));
            u->q[v] = _mm512_xor_si512(_mm512_shuffle_i64x2(lo, hi, LANES_EVEN), flip);
            u->q[4 + v] = _mm512_xor_si512(_mm512_shuffle_i64x2(lo, hi, LANES_ODD), flip);
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
    const bool five = T == ECS_TYPE_Q5_0 || T == ECS_TYPE_Q5_1;
    const __m512i m4 = _mm512_set1_epi8(0x0F), b16 = _mm512_set1_epi8(16);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m512i q = legacy_x4(s, 4 * v, bsize, qs_off);
        __m512i lo = _mm512_and_si512(q, m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        if (five) {
            lo = _mm512_mask_add_epi8(lo, fifth_bits(s, 4 * v, bsize, qh_off, false), lo, b16);
            hi = _mm512_mask_add_epi8(hi, fifth_bits(s, 4 * v, bsize, qh_off, true), hi, b16);
        }
        u->q[v] = lo;
        u->q[4 + v] = hi;
    }
}

INLINE void unpack_sb(ecs_type_t T, sbsrc_t s, __m512i lg, wsb_t *u)
{
    switch (T) {
    case ECS_TYPE_Q4_K: unpack_k4(false, s, lg, u); break;
    case ECS_TYPE_Q5_K: unpack_k4(true, s, lg, u); break;
    case ECS_TYPE_Q6_K: unpack_k16(K_Q6, s.p, lg, u); break;
    case ECS_TYPE_Q3_K: unpack_k16(K_Q3, s.p, lg, u); break;
    case ECS_TYPE_Q2_K: unpack_k16(K_Q2, s.p, lg, u); break;
    default: unpack_legacy(T, s, lg, u); break;
    }
}

INLINE void store_wsb(int KV, bool min, const wsb_t *u, uint8_t *o)
{
    __m512i q[8];
#pragma GCC unroll 8
    for (int k = 0; k < KV; k++)
        q[k] = u->q[k];
    transpose_sets(KV, q);
#pragma GCC unroll 8
    for (int k = 0; k < KV; k++)
        _mm512_store_si512((void *)(o + 64 * k), q[k]);
    _mm512_store_ps((void *)(o + w_sc(KV)), u->sc);
    if (min)
        _mm512_store_ps((void *)(o + w_mn(KV)), u->mn);
}

INLINE void unpack_row(ecs_type_t T, const void *row, int64_t ncols, void *out)
{
    const int KV = type_kv(T), nbk = sb_blocks(T);
    const bool min = type_has_min(T);
    const size_t sbb = (size_t)nbk * block_bytes(T);
    const int64_t full = ncols / (64 * KV);
    const __m512i lg = lane_groups(T);
    const uint8_t *in = row;
    uint8_t *o = out;
    wsb_t u;
    for (int64_t sb = 0; sb < full; sb++, o += w_sb_bytes(KV, min), in += sbb) {
        unpack_sb(T, (sbsrc_t){in, nbk}, lg, &u);
        store_wsb(KV, min, &u, o);
    }
    if (ncols % (64 * KV)) {
        unpack_sb(T, (sbsrc_t){in, (int)(ncols % (64 * KV) / block_cols(T))}, lg, &u);
        store_wsb(KV, min, &u, o);
    }
}

#endif
