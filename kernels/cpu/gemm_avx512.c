/* gemm_avx512.c - quantized products in a layout that all quant types share
 * (AVX-512 VNNI): batched products (several activation rows against one
 * weight matrix: prompt processing, experts in prefill) and, with the same
 * arithmetic, the row kernel that decode uses.
 *
 * matmul.c packs the activation rows once per call, unpacks a tile of
 * weight rows once, and a register-blocked microkernel (GEMM_MR weight rows
 * x GEMM_NR activation rows) does all pairs:
 *
 *  - a superblock is sixteen groups of values that share a scale (and a
 *    min): 16 values (Q2_K, Q3_K, Q6_K: 256-value superblocks, 4 vectors)
 *    or 32 values (every other type: 512-value superblocks of two k-quant
 *    blocks or sixteen legacy blocks, 8 vectors). The levels are stored
 *    transposed so that the 32-bit lane L of each vector holds four values
 *    of the same group: the vpdpbusd of a superblock chain into one register
 *    whose lanes are whole group sums (no scale per vector);
 *  - weights are unsigned levels (Q8_0: w + 128); each level offset (Q4_0:
 *    8, Q5_0: 16, Q8_0: 128, Q3_K: 4, Q6_K: 32) is taken off in integers by
 *    starting the chain at -offset * (group sum of the activations), which
 *    the activation packing stores. Group sums are then exactly the scalar
 *    reference's integer sums (a group sum is below 2^21);
 *  - per pair and superblock: one vpdpbusd per 64 values, then one
 *    int->float conversion, one multiply (weight scales x activation scales,
 *    per lane) and one FMA, plus one FMA for the types with mins (Q4_1, Q5_1,
 *    Q2_K, Q4_K, Q5_K). Zen 4 issues the vpdpbusd and the float multiplies
 *    to the same two pipes, so 32-value groups (8 vpdpbusd per 4 float
 *    operations, against 4 per 4) are what brings the products near the
 *    int8 peak.
 *
 * Each set of four vectors is transposed with a 4x4 transpose of 32-bit
 * words inside each 128-bit lane; for 32-value groups the unpacking puts the
 * two 16-value halves of a group at the same place of two sets (A: the
 * first four vectors, B: the last four), so the transposed sets line up.
 *
 * The row kernel (fewer than KCPU_GEMM_MIN_NB activation rows) unpacks one
 * weight row at a time in registers and does the same float operations in
 * the same order, so a product's bits do not depend on the batch it is in.
 * Only the float scaling and accumulation order differ from the reference.
 * A row whose length is not a multiple of the superblock ends with a
 * zero-padded superblock. */
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

/* Where group g of an activation superblock starts: block g / gpb (bsize
 * bytes apart, values at qs_off), value gcols * (g % gpb) of it. */
typedef struct {
    const uint8_t *p;
    size_t bsize, qs_off;
    int gpb, gcols;
} agrp_t;

INLINE const uint8_t *agroup(agrp_t a, int g)
{
    return a.p + (size_t)(g / a.gpb) * a.bsize + a.qs_off + (size_t)a.gcols * (size_t)(g % a.gpb);
}

/* The activation vectors of one superblock in the weights' group order,
 * transposed unless natural (the layout of single rows of 32-value groups,
 * see row1_sb). 16-value groups load 32 bytes at a time. */
INLINE void act_vectors(ecs_type_t T, agrp_t a, bool natural, __m512i v[8])
{
    const uint8_t *groups = type_groups(T);
    const int KV = type_kv(T);
#pragma GCC unroll 8
    for (int set = 0; set < KV / 4; set++) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const uint8_t *g = groups + 4 * k;
#define AT(q) (agroup(a, g[q]) + 16 * set)
            if (KV == 4) {
                v[k] = join256(_mm256_loadu_si256((const __m256i *)AT(0)),
                               _mm256_loadu_si256((const __m256i *)AT(2)));
            } else {
                __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)AT(0)));
                x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)AT(1)), 1);
                x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)AT(2)), 2);
                v[4 * set + k] = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)AT(3)), 3);
            }
#undef AT
        }
    }
    if (!natural)
        transpose_sets(KV, v);
}

/* Group sums of transposed values, as int32 per lane. */
INLINE __m512i group_sums(int KV, const __m512i *v)
{
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int k = 0; k < KV; k++)
        s = _mm512_dpbusd_epi32(s, ones, v[k]);
    return s;
}

INLINE void store_act(int KV, uint8_t *o, const __m512i *v, __m512i init, __m512 sc)
{
#pragma GCC unroll 8
    for (int k = 0; k < KV; k++)
        _mm512_store_si512((void *)(o + 64 * k), v[k]);
    _mm512_store_si512((void *)(o + a_init(KV)), init);
    _mm512_store_ps((void *)(o + a_sc(KV)), sc);
}

static const ecs_block_q8_K Q8K_ZERO;

/* Q8_K rows (k-quant weights): one scale and sixteen 16-value sums
 * (bsums) per block; one block per superblock (16-value groups) or two. */
INLINE void pack_q8_K_sb(ecs_type_t T, const ecs_block_q8_K *x0, const ecs_block_q8_K *x1,
                         __m512i lg, bool natural, uint8_t *o)
{
    const int KV = type_kv(T);
    const int off = level_offset(T);
    const agrp_t a = {(const uint8_t *)x0, sizeof *x0, offsetof(ecs_block_q8_K, qs), KV == 4 ? 16 : 8,
                      KV == 4 ? 16 : 32};
    __m512i v[8];
    act_vectors(T, a, natural, v);
    __m512i gs;
    __m512 d;
    if (KV == 4) {
        gs = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)x0->bsums));
        d = _mm512_set1_ps(x0->d);
    } else { /* x1 follows x0 in memory unless it is the zero block */
        gs = _mm512_madd_epi16(join256(_mm256_loadu_si256((const __m256i *)x0->bsums),
                                       _mm256_loadu_si256((const __m256i *)x1->bsums)),
                               _mm512_set1_epi16(1));
        d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(x0->d), _mm512_set1_ps(x1->d));
    }
    gs = _mm512_permutexvar_epi32(lg, gs);
    const __m512 sc = _mm512_permutexvar_ps(lg, d);
    const __m512i init =
        off ? _mm512_mullo_epi32(gs, _mm512_set1_epi32(-off)) : _mm512_setzero_si512();
    store_act(KV, o, v, init, sc);
    if (type_has_min(T))
        _mm512_store_ps((void *)(o + a_mn(KV)), _mm512_mul_ps(_mm512_cvtepi32_ps(gs), sc));
}

INLINE void pack_q8_K(ecs_type_t T, const void *a, int64_t ncols, bool natural, void *out)
{
    const int KV = type_kv(T), nbk = KV / 4;
    const bool min = type_has_min(T);
    const __m512i lg = lane_groups(T);
    const ecs_block_q8_K *x = a;
    const int64_t nblk = ncols / QK_K;
    uint8_t *o = out;
    for (int64_t b = 0; b < nblk; b += nbk, o += a_sb_bytes(KV, min)) {
        if (nbk == 1 || b + 1 < nblk) { /* a pair needs x[b + 1] next to x[b] */
            pack_q8_K_sb(T, x + b, x + b + nbk - 1, lg, natural, o);
            continue;
        }
        ecs_block_q8_K last[2];
        last[0] = x[b];
        last[1] = Q8K_ZERO;
        pack_q8_K_sb(T, &last[0], &last[1], lg, natural, o);
    }
}

/* Q8_0 / Q8_1 rows (legacy weights): sixteen blocks, group g = block g. */
INLINE void pack_legacy_sb(ecs_type_t T, const uint8_t *blk, __m512i lg, bool natural,
                           uint8_t *o)
{
    const bool q8_1 = type_has_min(T);
    const size_t bsize = q8_1 ? sizeof(ecs_block_q8_1) : sizeof(ecs_block_q8_0);
    const size_t qs_off = q8_1 ? offsetof(ecs_block_q8_1, qs) : offsetof(ecs_block_q8_0, qs);
    __m512i v[8];
    act_vectors(T, (agrp_t){blk, bsize, qs_off, 1, 32}, natural, v);
    const int off = level_offset(T);
    /* group sums in lane order: of the transposed vectors */
    __m512i tv[8];
    for (int k = 0; k < 8; k++)
        tv[k] = v[k];
    if (natural)
        transpose_sets(8, tv);
    const __m512i init = off ? _mm512_mullo_epi32(group_sums(8, tv), _mm512_set1_epi32(-off))
                             : _mm512_setzero_si512();
    const sbsrc_t src = {blk, 16};
    store_act(8, o, v, init, _mm512_permutexvar_ps(lg, legacy_f16x16(src, bsize, 0)));
    if (q8_1) /* s = d * sum(qs) of a block */
        _mm512_store_ps((void *)(o + a_mn(8)),
                        _mm512_permutexvar_ps(
                            lg, legacy_f16x16(src, bsize, offsetof(ecs_block_q8_1, s))));
}

/* The blocks of an activation row's last, short superblock (legacy types),
 * followed by zero blocks: zero scales and values (once per call; the
 * weights read their short superblocks with masked loads instead). */
typedef struct {
    _Alignas(64) uint8_t b[10 * 64]; /* >= 16 blocks of Q8_0 / Q8_1 */
} tail_t;

INLINE const uint8_t *short_sb(const uint8_t *blk, size_t bsize, int64_t nblk, tail_t *t)
{
    const int64_t bytes = nblk * (int64_t)bsize;
    for (int i = 0; i < 10; i++)
        _mm512_store_si512((void *)(t->b + 64 * i),
                           _mm512_maskz_loadu_epi8(first_bytes(bytes - 64 * i), blk + 64 * i));
    return t->b;
}

INLINE void pack_q8_legacy(ecs_type_t T, const void *a, int64_t ncols, bool natural, void *out)
{
    const bool q8_1 = type_has_min(T);
    const size_t bsize = q8_1 ? sizeof(ecs_block_q8_1) : sizeof(ecs_block_q8_0);
    const __m512i lg = lane_groups(T);
    const uint8_t *in = a;
    uint8_t *o = out;
    for (int64_t sb = 0; sb < ncols / 512; sb++, o += a_sb_bytes(8, q8_1), in += 16 * bsize)
        pack_legacy_sb(T, in, lg, natural, o);
    if (ncols % 512) {
        tail_t t;
        pack_legacy_sb(T, short_sb(in, bsize, (ncols % 512) / QK, &t), lg, natural, o);
    }
}

/* ------------------------------------------------------------------------ */
/* Microkernel                                                               */
/* ------------------------------------------------------------------------ */

#define FOR_M(m) _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
#define FOR_N(n) _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++)

/* y[n * ldy + m] = dot(weight row m, activation row n), m < MR, n < NR.
 * w: unpacked rows wrow bytes apart; a: packed rows arow bytes apart. */
INLINE void micro(int MR, int NR, int KV, bool MIN, const uint8_t *w, size_t wrow,
                  const uint8_t *a, size_t arow, int64_t nsb, float *y, int64_t ldy)
{
    const size_t wsb = w_sb_bytes(KV, MIN), asb = a_sb_bytes(KV, MIN);
    __m512 acc[GEMM_MR][GEMM_NR];
    FOR_M(m) FOR_N(n) acc[m][n] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *ws = w + (size_t)s * wsb, *as = a + (size_t)s * asb;
        __m512i t[GEMM_MR][GEMM_NR];
        FOR_N(n) {
            const __m512i init = _mm512_load_si512((const void *)(as + n * arow + a_init(KV)));
            FOR_M(m) t[m][n] = init;
        }
#pragma GCC unroll 8
        for (int k = 0; k < KV; k++) {
            __m512i wv[GEMM_MR];
            FOR_M(m) wv[m] = _mm512_load_si512((const void *)(ws + m * wrow + 64 * k));
            FOR_N(n) {
                const __m512i av = _mm512_load_si512((const void *)(as + n * arow + 64 * k));
                FOR_M(m) t[m][n] = _mm512_dpbusd_epi32(t[m][n], wv[m], av);
            }
        }
        FOR_M(m) {
            const __m512 sc = _mm512_load_ps((const void *)(ws + m * wrow + w_sc(KV)));
            FOR_N(n) {
                const __m512 s2 =
                    _mm512_mul_ps(sc, _mm512_load_ps((const void *)(as + n * arow + a_sc(KV))));
                acc[m][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[m][n]), s2, acc[m][n]);
            }
        }
        if (MIN) {
            FOR_M(m) {
                const __m512 mn = _mm512_load_ps((const void *)(ws + m * wrow + w_mn(KV)));
                FOR_N(n) acc[m][n] = _mm512_fmadd_ps(
                    mn, _mm512_load_ps((const void *)(as + n * arow + a_mn(KV))), acc[m][n]);
            }
        }
    }
    FOR_M(m) FOR_N(n) y[n * ldy + m] = reduce16(acc[m][n]);
}

typedef void (*micro_fn)(const uint8_t *w, size_t wrow, const uint8_t *a, size_t arow,
                         int64_t nsb, float *y, int64_t ldy);

#define MICRO(KV, MIN, MR, NR)                                                                \
    static void micro_##KV##_##MIN##_##MR##_##NR(const uint8_t *w, size_t wrow,               \
                                                 const uint8_t *a, size_t arow, int64_t nsb,  \
                                                 float *y, int64_t ldy)                       \
    {                                                                                         \
        micro(MR, NR, KV, MIN, w, wrow, a, arow, nsb, y, ldy);                                \
    }
#define MICRO_ROW(KV, MIN, MR)                                                                \
    MICRO(KV, MIN, MR, 1) MICRO(KV, MIN, MR, 2) MICRO(KV, MIN, MR, 3) MICRO(KV, MIN, MR, 4)
#define MICRO_ALL(KV, MIN)                                                                    \
    MICRO_ROW(KV, MIN, 1) MICRO_ROW(KV, MIN, 2) MICRO_ROW(KV, MIN, 3) MICRO_ROW(KV, MIN, 4)
MICRO_ALL(4, 0)
MICRO_ALL(4, 1)
MICRO_ALL(8, 0)
MICRO_ALL(8, 1)

#define MICRO_REF(KV, MIN, MR)                                                                \
    {micro_##KV##_##MIN##_##MR##_1, micro_##KV##_##MIN##_##MR##_2,                           \
     micro_##KV##_##MIN##_##MR##_3, micro_##KV##_##MIN##_##MR##_4}
#define MICRO_SET(KV, MIN)                                                                    \
    {MICRO_REF(KV, MIN, 1), MICRO_REF(KV, MIN, 2), MICRO_REF(KV, MIN, 3), MICRO_REF(KV, MIN, 4)}
/* [8-vector superblocks][mins][MR - 1][NR - 1] */
static const micro_fn MICROS[2][2][GEMM_MR][GEMM_NR] = {
    {MICRO_SET(4, 0), MICRO_SET(4, 1)},
    {MICRO_SET(8, 0), MICRO_SET(8, 1)},
};

INLINE void tile(int KV, bool min, const void *w, int nw, const void *a, int na, int64_t nsb,
                 float *y, int64_t ldy)
{
    const size_t wrow = (size_t)nsb * w_sb_bytes(KV, min), arow = (size_t)nsb * a_sb_bytes(KV, min);
    for (int n0 = 0; n0 < na; n0 += GEMM_NR) {
        const int nr = na - n0 < GEMM_NR ? na - n0 : GEMM_NR;
        for (int m0 = 0; m0 < nw; m0 += GEMM_MR) {
            const int mr = nw - m0 < GEMM_MR ? nw - m0 : GEMM_MR;
            MICROS[KV == 8][min][mr - 1][nr - 1]((const uint8_t *)w + (size_t)m0 * wrow, wrow,
                                                 (const uint8_t *)a + (size_t)n0 * arow, arow,
                                                 nsb, y + (int64_t)n0 * ldy + m0, ldy);
        }
    }
}

#define TILE_FN(KV, MIN)                                                                      \
    static void tile_##KV##_##MIN(const void *w, int nw, const void *a, int na, int64_t nsb,  \
                                  float *y, int64_t ldy)                                      \
    {                                                                                         \
        tile(KV, MIN, w, nw, a, na, nsb, y, ldy);                                             \
    }
TILE_FN(4, 0)
TILE_FN(4, 1)
TILE_FN(8, 0)
TILE_FN(8, 1)

/* ------------------------------------------------------------------------ */
/* Row kernel (few activation rows, decode)                                  */
/* ------------------------------------------------------------------------ */

/* One superblock of a weight row, unpacked and transposed in registers,
 * against NA packed activation rows: the microkernel's arithmetic exactly,
 * so that a product does not depend on how many rows came with it. */
INLINE void rows_sb(ecs_type_t T, int NA, sbsrc_t src, __m512i lg, const uint8_t *a, size_t as,
                    __m512 *acc)
{
    const int KV = type_kv(T);
    const bool min = type_has_min(T);
    wsb_t u;
    unpack_sb(T, src, lg, &u);
    transpose_sets(KV, u.q);
    FOR_ROWS(r) {
        const uint8_t *ap = a + (size_t)r * as;
        /* two chains: half the latency, the same integer sums */
        __m512i t = _mm512_load_si512((const void *)(ap + a_init(KV)));
        __m512i t2 = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int k = 0; k < KV; k += 2) {
            t = _mm512_dpbusd_epi32(t, u.q[k], _mm512_load_si512((const void *)(ap + 64 * k)));
            t2 = _mm512_dpbusd_epi32(t2, u.q[k + 1],
                                     _mm512_load_si512((const void *)(ap + 64 * k + 64)));
        }
        t = _mm512_add_epi32(t, t2);
        const __m512 s2 = _mm512_mul_ps(u.sc, _mm512_load_ps((const void *)(ap + a_sc(KV))));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), s2, acc[r]);
        if (min)
            acc[r] = _mm512_fmadd_ps(u.mn, _mm512_load_ps((const void *)(ap + a_mn(KV))), acc[r]);
    }
}

/* The same for one activation row of 32-value groups, packed untransposed
 * (pack_act1): the two halves of a group chain into the same lanes, and the
 * four chains are transposed and added instead of the eight weight vectors
 * being transposed. The integer sums and the float operations are those of
 * rows_sb. */
INLINE void row1_sb(ecs_type_t T, sbsrc_t src, __m512i lg, const uint8_t *a, __m512 *acc)
{
    const bool min = type_has_min(T);
    wsb_t u;
    unpack_sb(T, src, lg, &u);
    __m512i t[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++)
        t[v] = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), u.q[v],
                                _mm512_load_si512((const void *)(a + 64 * v))),
            u.q[4 + v], _mm512_load_si512((const void *)(a + 256 + 64 * v)));
    transpose_groups(t);
    const __m512i s = _mm512_add_epi32(_mm512_add_epi32(t[0], t[1]), _mm512_add_epi32(t[2], t[3]));
    const __m512i tt = _mm512_add_epi32(s, _mm512_load_si512((const void *)(a + a_init(8))));
    const __m512 s2 = _mm512_mul_ps(u.sc, _mm512_load_ps((const void *)(a + a_sc(8))));
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tt), s2, *acc);
    if (min)
        *acc = _mm512_fmadd_ps(u.mn, _mm512_load_ps((const void *)(a + a_mn(8))), *acc);
}

INLINE float row1_impl(ecs_type_t T, int64_t n, const void *w, const void *a)
{
    const int nbk = sb_blocks(T);
    const size_t sbb = (size_t)nbk * block_bytes(T), asb = a_sb_bytes(8, type_has_min(T));
    const int64_t full = n / 512;
    const __m512i lg = lane_groups(T);
    __m512 acc = _mm512_setzero_ps();
    const uint8_t *in = w;
    for (int64_t sb = 0; sb < full; sb++, in += sbb)
        row1_sb(T, (sbsrc_t){in, nbk}, lg, (const uint8_t *)a + (size_t)sb * asb, &acc);
    if (n % 512)
        row1_sb(T, (sbsrc_t){in, (int)(n % 512 / block_cols(T))}, lg,
                (const uint8_t *)a + (size_t)full * asb, &acc);
    return reduce16(acc);
}

INLINE void rows_impl(ecs_type_t T, int NA, int64_t n, const void *w, const void *a, size_t as,
                      float *out)
{
    if (NA == 1 && !is_g16(T)) {
        out[0] = row1_impl(T, n, w, a);
        return;
    }
    const int KV = type_kv(T), nbk = sb_blocks(T);
    const bool min = type_has_min(T);
    const size_t sbb = (size_t)nbk * block_bytes(T), asb = a_sb_bytes(KV, min);
    const int64_t full = n / (64 * KV);
    const __m512i lg = lane_groups(T);
    __m512 acc[KCPU_MAX_NA];
    FOR_ROWS(r)
        acc[r] = _mm512_setzero_ps();
    const uint8_t *in = w;
    for (int64_t sb = 0; sb < full; sb++, in += sbb)
        rows_sb(T, NA, (sbsrc_t){in, nbk}, lg, (const uint8_t *)a + (size_t)sb * asb, as, acc);
    if (n % (64 * KV))
        rows_sb(T, NA, (sbsrc_t){in, (int)(n % (64 * KV) / block_cols(T))}, lg,
                (const uint8_t *)a + (size_t)full * asb, as, acc);
    FOR_ROWS(r)
        out[r] = reduce16(acc[r]);
}

/* ------------------------------------------------------------------------ */
/* Row-interleaved Q5_0 / Q8_0 (decode; Q4_K: k4_avx512.c)                   */
/* ------------------------------------------------------------------------ */

/* 16 weight rows (kcpu_r16_pack) against one activation row in the pack_act1
 * layout. Lane r of every vector is row r: a block's chain broadcasts four
 * activation bytes per vpdpbusd, and each block G of the 512-value
 * superblock keeps its own float sum (acc[G]), which is lane G's of the row
 * kernels' sum after their transpose; the sixteen are added in reduce16's
 * tree at the end. So every float operation of row1_sb is done in the same
 * order and the bits are the same. */

/* Lane of group G after the transpose (lane_groups inverted). */
INLINE int grp_lane(int G)
{
    return 4 * (G % 4) + G / 4;
}

/* Byte offset of value v (0..31) of group G in a pack_act1 superblock:
 * vector 4 (v / 16) + G / 4, 128-bit lane G % 4. */
INLINE size_t grp_act_off(int G, int v)
{
    return (size_t)(64 * (4 * (v / 16) + G / 4) + 16 * (G % 4) + v % 16);
}

INLINE float act_lane_f(const uint8_t *a, size_t off, int L)
{
    float x;
    memcpy(&x, a + off + 4 * (size_t)L, 4);
    return x;
}

/* acc[G] for G in lane order, summed as row1_impl's reduce16 does. */
INLINE void r16_store(__m512 *acc, float *out)
{
    __m512 lanes[16];
#pragma GCC unroll 16
    for (int L = 0; L < 16; L++)
        lanes[L] = acc[4 * (L % 4) + L / 4];
    _mm512_storeu_ps(out, reduce16_v(lanes));
}

/* Q5_0's fifth bits of word k (half h: values 16 h + 4 k ..) of 16 rows as
 * a byte mask (bit 4 r + j: value 16 h + 4 k + j of row r), from the rows'
 * 32-bit qh words: the byte holding the four bits is copied to the lane's
 * four bytes, byte j tests bit j of them. */
INLINE __mmask64 q5_fifth(__m512i qh, int k, int h)
{
    const int bit = 16 * h + 4 * k, byte = bit / 8, sh = bit % 8;
    /* pshufb works within 128-bit lanes (four rows each) */
    const __m512i idx = _mm512_add_epi8(
        _mm512_set1_epi8((char)byte),
        _mm512_broadcast_i32x4(_mm_set_epi8(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0)));
    return _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, idx),
                                 _mm512_set1_epi32((int)(0x08040201u << sh)));
}

/* Q5_0 levels (0..31) of block h of a pair of 16-row blocks, values 4 k ..
 * 4 k + 3 of every row in q[k]: the low nibbles give values 0..15, the high
 * ones 16..31, the fifth bits come from the qh words. */
INLINE void q5_levels(const uint8_t *pair, int h, __m512i q[8])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), b16 = _mm512_set1_epi8(16);
    const uint8_t *qp = pair + 256 * h;
    const __m512i qh = _mm512_load_si512((const void *)(pair + 512 + 64 * h));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m512i x = _mm512_load_si512((const void *)(qp + 64 * k));
        const __m512i lo = _mm512_and_si512(x, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        q[k] = _mm512_mask_add_epi8(lo, q5_fifth(qh, k, 0), lo, b16);
        q[4 + k] = _mm512_mask_add_epi8(hi, q5_fifth(qh, k, 1), hi, b16);
    }
}

/* Q5_0 / Q8_0 (r16.c's pairs of blocks; u: the superblock's first pair):
 * block G's levels for the 16 rows, once for NA activation rows (pack_act1
 * layout, as bytes apart). Each row's chain starts, as the row kernels'
 * does, at the activation's -offset x group sum, then one scale multiply
 * and one FMA into acc[n][G], as in row1_sb. */
INLINE void r16_legacy_group(ecs_type_t T, int NA, const uint8_t *u, const uint8_t *a, size_t as,
                             int G, __m512 (*acc)[16])
{
    const bool q5 = T == ECS_TYPE_Q5_0;
    const int W = q5 ? 4 : 8, L = grp_lane(G), h = G % 2;
    const uint8_t *pair = u + (size_t)(G / 2) * 2 * (q5 ? KCPU_R16_Q5_0_BLOCK : KCPU_R16_Q8_0_BLOCK);
    const uint8_t *qp = pair + 64 * W * h;
    const uint8_t *dp = pair + 128 * W + (q5 ? 128 : 0) + 32 * h;
    __m512i q[8]; /* levels of values 4 k .. 4 k + 3 (Q5_0: k < 4 low nibbles, then high) */
    if (q5) {
        q5_levels(pair, h, q);
    } else {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            q[k] = _mm512_load_si512((const void *)(qp + 64 * k));
    }
    const __m512 sc = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dp));
#pragma GCC unroll 4
    for (int n = 0; n < NA; n++) {
        const uint8_t *an = a + (size_t)n * as;
        int32_t init;
        memcpy(&init, an + a_init(8) + 4 * L, 4);
        /* two chains of exact integer sums (half the latency), added */
        __m512i t2[2] = {_mm512_set1_epi32(init), _mm512_setzero_si512()};
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) /* Q5_0: the order of the row kernels' chain */
            t2[k % 2] = dpbusd_bcast(t2[k % 2], q[q5 ? (k % 2) * 4 + k / 2 : k],
                                     an + grp_act_off(G, q5 ? 16 * (k % 2) + 4 * (k / 2) : 4 * k));
        const __m512i t = _mm512_add_epi32(t2[0], t2[1]);
        const __m512 s2 = _mm512_mul_ps(sc, _mm512_set1_ps(act_lane_f(an, a_sc(8), L)));
        acc[n][G] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), s2, acc[n][G]);
    }
}

/* One 512-value superblock at u: up to 16 Q5_0 / Q8_0 blocks; returns the
 * bytes it took. */
INLINE size_t r16_sb(ecs_type_t T, int NA, const uint8_t *u, int64_t left, const uint8_t *a,
                     size_t as, __m512 (*acc)[16])
{
    const int ub = left < 16 ? (int)left : 16;
#pragma GCC unroll 16
    for (int G = 0; G < 16; G++)
        if (G < ub)
            r16_legacy_group(T, NA, u, a, as, G, acc);
    return (size_t)ub * (T == ECS_TYPE_Q5_0 ? KCPU_R16_Q5_0_BLOCK : KCPU_R16_Q8_0_BLOCK);
}

/* y[n * ldy + r] for the group's 16 rows r against NA activation rows. */
INLINE void r16_impl(ecs_type_t T, int NA, const void *w, int64_t ncols, const void *a, size_t as,
                     float *y, int64_t ldy, const void *pf, size_t pfb)
{
    const int64_t nblk = ncols / QK, nsb = (nblk + 15) / 16;
    const size_t asb = a_sb_bytes(8, type_has_min(T));
    const uint8_t *u = w;
    __m512 acc[NA][16]; /* NA is a constant: registers for one row */
#pragma GCC unroll 4
    for (int n = 0; n < NA; n++)
#pragma GCC unroll 16
        for (int G = 0; G < 16; G++)
            acc[n][G] = _mm512_setzero_ps();
    const size_t step = pf ? prefetch_step(pfb, nsb) : 0;
    for (int64_t b = 0; b < nblk; b += 16) {
        prefetch_slice(pf, pfb, step, b / 16, NA <= PREFETCH_L1_MAX_NA);
        u += r16_sb(T, NA, u, nblk - b, (const uint8_t *)a + (size_t)(b / 16) * asb, as, acc);
    }
#pragma GCC unroll 4
    for (int n = 0; n < NA; n++)
        r16_store(acc[n], y + (int64_t)n * ldy);
}

#define R16_GRP(name, T)                                                                      \
    static void name##_grp(const void *g, int64_t ncols, const void *a, size_t as, int na,    \
                           float *y, int64_t ldy, const void *pf, size_t pfb)                 \
    {                                                                                         \
        switch (na) {                                                                         \
        case 1: r16_impl(T, 1, g, ncols, a, as, y, ldy, pf, pfb); break;                      \
        case 2: r16_impl(T, 2, g, ncols, a, as, y, ldy, pf, pfb); break;                      \
        case 3: r16_impl(T, 3, g, ncols, a, as, y, ldy, pf, pfb); break;                      \
        case 4: r16_impl(T, 4, g, ncols, a, as, y, ldy, pf, pfb); break;                      \
        case 5: r16_impl(T, 5, g, ncols, a, as, y, ldy, pf, pfb); break;                      \
        default: r16_impl(T, 6, g, ncols, a, as, y, ldy, pf, pfb); break;                     \
        }                                                                                     \
    }                                                                                         \
    static void name##_r16(const void *w, int64_t ncols, const void *a, float *out)           \
    {                                                                                         \
        r16_impl(T, 1, w, ncols, a, 0, out, 0, NULL, 0);                                      \
    }
R16_GRP(q5_0, ECS_TYPE_Q5_0)
R16_GRP(q8_0, ECS_TYPE_Q8_0)

/* A Q5_0 group rewritten in the Q8_0 group layout, its levels (0..31) one
 * byte each, for q8_0_grp: with the activations packed for Q5_0 (their
 * chains start at -16 x the group sums) that is the same arithmetic, the
 * integer sums in another order but exact, so the same bits; the fifth bits
 * are decoded once per group instead of once per pass. */
static void q5_0_grp_unpack(const void *group, int64_t ncols, void *out)
{
    const uint8_t *u = group;
    uint8_t *o = out;
    for (int64_t p = 0; p < ncols / QK / 2; p++) {
        for (int h = 0; h < 2; h++) {
            __m512i q[8];
            q5_levels(u, h, q);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                _mm512_store_si512((void *)(o + 512 * h + 64 * k), q[k]);
            memcpy(o + 1024 + 32 * h, u + 640 + 32 * h, 32);
        }
        u += 2 * KCPU_R16_Q5_0_BLOCK;
        o += 2 * KCPU_R16_Q8_0_BLOCK;
    }
}

/* ------------------------------------------------------------------------ */

#define GEMM_TYPE(name, T, pack)                                                              \
    static void name##_unpack(const void *w, int64_t ncols, void *out)                        \
    {                                                                                         \
        unpack_row(T, w, ncols, out);                                                         \
    }                                                                                         \
    static void name##_pack(const void *a, int64_t ncols, void *out)                          \
    {                                                                                         \
        pack(T, a, ncols, false, out);                                                        \
    }                                                                                         \
    static void name##_pack1(const void *a, int64_t ncols, void *out)                         \
    {                                                                                         \
        pack(T, a, ncols, !is_g16(T), out);                                                   \
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
GEMM_TYPE(q5_K, ECS_TYPE_Q5_K, pack_q8_K)
GEMM_TYPE(q6_K, ECS_TYPE_Q6_K, pack_q8_K)

kcpu_gemm_t kcpu_gemm_avx512(ecs_type_t wtype)
{
#define G(name, T, tl)                                                                        \
    (kcpu_gemm_t)                                                                             \
    {                                                                                         \
        .w_sb = w_sb_bytes(type_kv(T), type_has_min(T)),                                      \
        .a_sb = a_sb_bytes(type_kv(T), type_has_min(T)), .sb_cols = 64 * type_kv(T),          \
        .mr = GEMM_MR, .unpack_w = name##_unpack, .pack_act = name##_pack,                    \
        .pack_act1 = name##_pack1, .tile = tl, .multi = name##_multi                          \
    }
/* with the decode copy: its kernel for any number of rows (six per pass
 * share a group's decoding; bench_matvec --only prefill: faster than the
 * tiles up to 64 rows and more) */
#define GC(name, T)                                                                           \
    (kcpu_gemm_t)                                                                             \
    {                                                                                         \
        .w_sb = w_sb_bytes(8, false), .a_sb = a_sb_bytes(8, false), .sb_cols = 512,           \
        .mr = GEMM_MR, .unpack_w = name##_unpack, .pack_act = name##_pack,                    \
        .pack_act1 = name##_pack1, .tile = tile_8_0, .multi = name##_multi, .r16 = name##_r16, \
        .grp = name##_grp, .grp_na = 6                                                        \
    }
    switch (wtype) {
    case ECS_TYPE_Q4_0: return G(q4_0, ECS_TYPE_Q4_0, tile_8_0);
    case ECS_TYPE_Q4_1: return G(q4_1, ECS_TYPE_Q4_1, tile_8_1);
    case ECS_TYPE_Q5_0: {
        kcpu_gemm_t g = GC(q5_0, ECS_TYPE_Q5_0);
        g.grp_unpack = q5_0_grp_unpack;
        g.grp_unpacked = q8_0_grp;
        return g;
    }
    case ECS_TYPE_Q5_1: return G(q5_1, ECS_TYPE_Q5_1, tile_8_1);
    case ECS_TYPE_Q8_0: return GC(q8_0, ECS_TYPE_Q8_0);
    case ECS_TYPE_Q2_K: return G(q2_K, ECS_TYPE_Q2_K, tile_4_1);
    case ECS_TYPE_Q3_K: return G(q3_K, ECS_TYPE_Q3_K, tile_4_0);
    case ECS_TYPE_Q4_K: return kcpu_gemm_q4_K_avx512(); /* k4_avx512.c */
    case ECS_TYPE_Q5_K: return G(q5_K, ECS_TYPE_Q5_K, tile_8_1);
    case ECS_TYPE_Q6_K: return G(q6_K, ECS_TYPE_Q6_K, tile_4_0);
    default: return (kcpu_gemm_t){0};
    }
#undef G
#undef GC
}
