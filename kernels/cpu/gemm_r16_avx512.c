/* gemm_r16_avx512.c - the row-interleaved Q5_0 / Q8_0 kernels (16 weight
 * rows a group, kcpu_r16_pack) that decode and small prefills use; Q4_K's
 * are in k4_avx512.c. Split from gemm_avx512.c (the batched tiles and the
 * row kernel) because they share only the superblock layout
 * (gemm_avx512_int.h); kcpu_gemm_r16_avx512 adds them to a type's
 * kcpu_gemm_t. */
#include "kernels/cpu/gemm_avx512_int.h"

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

/* A 64-bit byte mask stored at p (a mask register load). */
INLINE __mmask64 mask_at(const uint8_t *p)
{
    uint64_t m;
    memcpy(&m, p, 8);
    return _cvtu64_mask64(m);
}

/* Q5_0 levels (0..31) of block h of a pair of 16-row blocks, values 4 k ..
 * 4 k + 3 of every row in q[k]: the low nibbles give values 0..15, the high
 * ones 16..31, the fifth bits come as one byte mask per vector (r16.c). */
INLINE void q5_levels(const uint8_t *pair, int h, __m512i q[8])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), b16 = _mm512_set1_epi8(16);
    const uint8_t *qp = pair + 256 * h, *mp = pair + 512 + 64 * h;
    /* (nibble & 15) | fifth bit: one vpternlogd (0xEA: (a & b) | c) on a
     * zero-masked 16, where a masked add would need a copy first */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m512i x = _mm512_load_si512((const void *)(qp + 64 * k));
        const __m512i f0 = _mm512_maskz_mov_epi8(mask_at(mp + 8 * k), b16);
        const __m512i f1 = _mm512_maskz_mov_epi8(mask_at(mp + 8 * (4 + k)), b16);
        q[k] = _mm512_ternarylogic_epi32(x, m4, f0, 0xEA);
        q[4 + k] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(x, 4), m4, f1, 0xEA);
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
    const bool l1 = pf && prefetch_into_l1(NA);
    for (int64_t b = 0; b < nblk; b += 16) {
        prefetch_slice(pf, pfb, step, b / 16, l1);
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

void kcpu_gemm_r16_avx512(ecs_type_t wtype, kcpu_gemm_t *g)
{
    switch (wtype) {
    case ECS_TYPE_Q5_0:
        g->r16 = q5_0_r16;
        g->grp = q5_0_grp;
        g->grp_unpack = q5_0_grp_unpack;
        g->grp_unpacked = q8_0_grp;
        break;
    case ECS_TYPE_Q8_0:
        g->r16 = q8_0_r16;
        g->grp = q8_0_grp;
        break;
    default: break;
    }
}
