/* k4_avx512.c - every Q4_K product (AVX-512 VNNI) on groups of 16 rows in
 * the interleaved layout (cpu.h: KCPU_R16_*, r16.c), whatever the number of
 * activation rows: from the decode copy where the matrix has one, else from
 * rows packed into that layout on the fly.
 *
 * Why not the shared layout of gemm_avx512.c: there each 32-value group's
 * sum is scaled in floats (a convert, a multiply by weight x activation
 * scale, an FMA, and an FMA for the min), and on Zen 4 those float
 * operations take the same two pipes as vpdpbusd: they held the batched
 * products at ~62 % of the int8 peak. Here a group's sum is scaled by its
 * 6-bit scale in integers (vpmulld), the mins' term is an integer dot of the
 * 6-bit mins with the activations' group sums (vpdpwssd), and each 256-value
 * block costs four float operations per 16 rows and activation row.
 *
 * The arithmetic, for weight row w and activation row a (Q8_K: d, qs, and
 * the group sums B_j of its 32-value groups), block by block in order:
 *   I_b = sum_j sc_j * sum_i q_ji * a_ji       (exact, int32)
 *   M_b = sum_j m_j * B_j                      (exact, int32)
 *   x_b = fma((float)I_b, d_b, -((float)M_b * dmin_b))
 *   acc = fma(x_b, a.d_b, acc)
 * Lane r of every vector is row r, so the float operations of a row are
 * these, in this order, for any number of activation rows and from either
 * source: a product's bits depend neither on the batch nor on the copy
 * (tests check them against a scalar version of the above). */
#include "kernels/cpu/simd_avx512.h"

#define K4_D KCPU_R16_Q4_K_D
#define K4_DMIN KCPU_R16_Q4_K_DMIN
#define K4_SC KCPU_R16_Q4_K_SC
#define K4_MN KCPU_R16_Q4_K_MN
#define K4_QS KCPU_R16_Q4_K_QS
#define K4_BLOCK KCPU_R16_Q4_K_BLOCK

/* A packed activation block (256 values): the Q8_K values, the eight
 * 32-value group sums as int16 (|sum| <= 32 * 127), the scale. */
#define ACT_QS 0
#define ACT_B 256
#define ACT_D 272
#define ACT_BYTES 288

INLINE __m512i bcast32(const uint8_t *p)
{
    int32_t x;
    memcpy(&x, p, 4);
    return _mm512_set1_epi32(x);
}

/* Q8_K row -> packed blocks. */
static void k4_pack_act(const void *a, int64_t ncols, void *out)
{
    const ecs_block_q8_K *x = a;
    uint8_t *o = out;
    for (int64_t b = 0; b < ncols / QK_K; b++, o += ACT_BYTES) {
        memcpy(o + ACT_QS, x[b].qs, QK_K);
        /* adjacent 16-value sums, added as int32 and narrowed (they fit) */
        const __m256i s = _mm256_madd_epi16(
            _mm256_loadu_si256((const __m256i *)x[b].bsums), _mm256_set1_epi16(1));
        _mm_storeu_si128((__m128i *)(o + ACT_B), _mm256_cvtepi32_epi16(s));
        memcpy(o + ACT_D, &x[b].d, 4);
        memset(o + ACT_D + 4, 0, ACT_BYTES - ACT_D - 4);
    }
}

/* The integer sums I_b (scaled group sums) of one block of a group for NA
 * activation rows (as bytes apart), added to I. */
INLINE void block_isums(int NA, const uint8_t *blk, const uint8_t *a, size_t as, __m512i *I)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* qs word 8 c + k: low nibbles group 2 c, high 2 c + 1 */
        __m512i lo[KCPU_MAX_NA], hi[KCPU_MAX_NA];
#pragma GCC unroll 4
        for (int n = 0; n < NA; n++)
            lo[n] = hi[n] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i q = _mm512_load_si512((const void *)(blk + K4_QS + 64 * (8 * c + k)));
            const __m512i ql = _mm512_and_si512(q, m4);
            const __m512i qh = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
#pragma GCC unroll 4
            for (int n = 0; n < NA; n++) {
                const uint8_t *an = a + (size_t)n * as + ACT_QS + 64 * c + 4 * k;
                lo[n] = _mm512_dpbusd_epi32(lo[n], ql, bcast32(an));
                hi[n] = _mm512_dpbusd_epi32(hi[n], qh, bcast32(an + 32));
            }
        }
        const __m512i s0 =
            _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(blk + K4_SC + 32 * c)));
        const __m512i s1 =
            _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(blk + K4_SC + 32 * c + 16)));
#pragma GCC unroll 4
        for (int n = 0; n < NA; n++)
            I[n] = _mm512_add_epi32(I[n], _mm512_add_epi32(_mm512_mullo_epi32(lo[n], s0),
                                                           _mm512_mullo_epi32(hi[n], s1)));
    }
}

/* y[n * ldy + r] = row r of the group . activation row n, r < 16, n < NA. */
INLINE void grp_impl(int NA, const uint8_t *g, int64_t ncols, const uint8_t *a, size_t as,
                     float *y, int64_t ldy)
{
    __m512 acc[KCPU_MAX_NA];
#pragma GCC unroll 4
    for (int n = 0; n < NA; n++)
        acc[n] = _mm512_setzero_ps();
    for (int64_t b = 0; b < ncols / QK_K; b++) {
        const uint8_t *blk = g + (size_t)b * K4_BLOCK, *ab = a + (size_t)b * ACT_BYTES;
        __m512i I[KCPU_MAX_NA];
#pragma GCC unroll 4
        for (int n = 0; n < NA; n++)
            I[n] = _mm512_setzero_si512();
        block_isums(NA, blk, ab, as, I);
        __m512i mw[4]; /* lanes (m_2p, m_2p+1) as int16 */
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const __m512i m0 =
                _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(blk + K4_MN + 32 * p)));
            const __m512i m1 = _mm512_cvtepu8_epi32(
                _mm_load_si128((const __m128i *)(blk + K4_MN + 32 * p + 16)));
            mw[p] = _mm512_or_si512(m0, _mm512_slli_epi32(m1, 16));
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(blk + K4_D)));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(blk + K4_DMIN)));
#pragma GCC unroll 4
        for (int n = 0; n < NA; n++) {
            const uint8_t *an = ab + (size_t)n * as;
            __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                M = _mm512_dpwssd_epi32(M, mw[p], bcast32(an + ACT_B + 4 * p));
            float da;
            memcpy(&da, an + ACT_D, 4);
            const __m512 x = _mm512_fmsub_ps(_mm512_cvtepi32_ps(I[n]), d,
                                             _mm512_mul_ps(_mm512_cvtepi32_ps(M), dmin));
            acc[n] = _mm512_fmadd_ps(x, _mm512_set1_ps(da), acc[n]);
        }
    }
#pragma GCC unroll 4
    for (int n = 0; n < NA; n++)
        _mm512_storeu_ps(y + (int64_t)n * ldy, acc[n]);
}

static void k4_grp(const void *g, int64_t ncols, const void *a, size_t as, int na, float *y,
                   int64_t ldy)
{
    switch (na) {
    case 1: grp_impl(1, g, ncols, a, as, y, ldy); break;
    case 2: grp_impl(2, g, ncols, a, as, y, ldy); break;
    case 3: grp_impl(3, g, ncols, a, as, y, ldy); break;
    default: grp_impl(4, g, ncols, a, as, y, ldy); break;
    }
}

/* The copy's kernel for one activation row (kcpu_gemm_t.r16). */
static void k4_r16(const void *w, int64_t ncols, const void *a, float *out)
{
    grp_impl(1, w, ncols, a, 0, out, 0);
}

static const ecs_block_q4_K ZERO_BLOCK;

/* Block b of nrows (<= 16) rows, row_bytes apart, into the interleaved
 * layout (kcpu_r16_pack's bytes); missing rows are zeros. */
static void pack_block(const uint8_t *rows, size_t row_bytes, int nrows, int64_t b, uint8_t *o)
{
    const ecs_block_q4_K *x[16];
    for (int r = 0; r < 16; r++)
        x[r] = r < nrows ? (const ecs_block_q4_K *)(rows + (size_t)r * row_bytes) + b
                         : &ZERO_BLOCK;
    __m512i v[16];
    __m128i s[16], t[16];
    uint16_t d[16], dm[16];
    for (int half = 0; half < 2; half++) { /* words 16 half .. 16 half + 15 */
        for (int r = 0; r < 16; r++)
            v[r] = _mm512_loadu_si512((const void *)(x[r]->qs + 64 * half));
        transpose16_epi32(v);
        for (int i = 0; i < 16; i++)
            _mm512_store_si512((void *)(o + K4_QS + 64 * (16 * half + i)), v[i]);
    }
    for (int r = 0; r < 16; r++) {
        uint64_t sc, mn;
        k4_scales(x[r]->scales, &sc, &mn);
        s[r] = _mm_set_epi64x((long long)mn, (long long)sc);
        memcpy(&d[r], &x[r]->d, 2);
        memcpy(&dm[r], &x[r]->dmin, 2);
    }
    transpose16_epi8(s, t); /* byte i of each row: scales 0..7, then mins */
    for (int i = 0; i < 16; i++)
        _mm_store_si128((__m128i *)(o + K4_SC + 16 * i), t[i]);
    memcpy(o + K4_D, d, sizeof d);
    memcpy(o + K4_DMIN, dm, sizeof dm);
}

static void k4_grp_pack(const void *rows, size_t row_bytes, int nrows, int64_t ncols, void *out)
{
    for (int64_t b = 0; b < ncols / QK_K; b++)
        pack_block(rows, row_bytes, nrows, b, (uint8_t *)out + (size_t)b * K4_BLOCK);
}

kcpu_gemm_t kcpu_gemm_q4_K_avx512(void)
{
    return (kcpu_gemm_t){
        .a_sb = ACT_BYTES,
        .sb_cols = QK_K,
        .mr = KCPU_R16_ROWS,
        .pack_act = k4_pack_act,
        .pack_act1 = k4_pack_act,
        .r16 = k4_r16,
        .grp = k4_grp,
        .grp_pack = k4_grp_pack,
    };
}
