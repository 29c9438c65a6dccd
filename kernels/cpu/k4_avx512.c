/* k4_avx512.c - every Q4_K product (AVX-512 VNNI) on groups of 16 rows in
 * the interleaved layout (cpu.h: KCPU_R16_*, r16.c), whatever the number of
 * activation rows: from the decode copy where the matrix has one, else from
 * rows packed into that layout on the fly.
 *
 * Why not the shared layout of gemm_avx512.c: there each 32-value group's
 * sum is scaled in floats (a convert, a multiply by weight x activation
 * scale, an FMA, and an FMA for the min), and on Zen 4 the multiplies and
 * FMAs take a cycle of vpdpbusd's pipes each (bench_pipes_avx512): 24 per
 * 64 vpdpbusd held the batched products at ~62 % of the int8 peak. Here a group's sum is scaled by its
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
#include <math.h>

#include "kernels/cpu/simd_avx512.h"

#define K4_D KCPU_R16_Q4_K_D
#define K4_DMIN KCPU_R16_Q4_K_DMIN
#define K4_SC KCPU_R16_Q4_K_SC
#define K4_MN KCPU_R16_Q4_K_MN
#define K4_QS KCPU_R16_Q4_K_QS
#define K4_BLOCK KCPU_R16_Q4_K_BLOCK

/* A packed activation block (256 values): the Q8_K values in the row
 * kernel's order (act_pos), the eight 32-value group sums as int16 (|sum| <=
 * 32 * 127), the scale. */
#define ACT_QS 0
#define ACT_B 256
#define ACT_D 272
#define ACT_BYTES 288

/* Where value v of a block sits: four 64-byte vectors that match the nibbles
 * of a row's two 64-byte halves of qs (bytes 32 c + i hold values 64 c + i
 * and 64 c + 32 + i): [0-31 | 64-95], [32-63 | 96-127], [128-159 |
 * 192-223], [160-191 | 224-255]. */
INLINE int act_pos(int v)
{
    return 64 * ((v / 128) * 2 + (v % 64) / 32) + 32 * ((v % 128) / 64) + v % 32;
}

/* Q8_K row -> packed blocks. */
static void k4_pack_act(const void *a, int64_t ncols, void *out)
{
    const ecs_block_q8_K *x = a;
    uint8_t *o = out;
    for (int64_t b = 0; b < ncols / QK_K; b++, o += ACT_BYTES) {
        for (int v = 0; v < QK_K; v += 32)
            memcpy(o + ACT_QS + act_pos(v), x[b].qs + v, 32);
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
        __m512i lo[KCPU_GRP_MAX_NA], hi[KCPU_GRP_MAX_NA];
#pragma GCC unroll 8
        for (int n = 0; n < NA; n++)
            lo[n] = hi[n] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i q = _mm512_load_si512((const void *)(blk + K4_QS + 64 * (8 * c + k)));
            const __m512i ql = _mm512_and_si512(q, m4);
            const __m512i qh = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
#pragma GCC unroll 8
            for (int n = 0; n < NA; n++) {
                const uint8_t *an = a + (size_t)n * as + ACT_QS;
                lo[n] = dpbusd_bcast(lo[n], ql, an + act_pos(64 * c + 4 * k));
                hi[n] = dpbusd_bcast(hi[n], qh, an + act_pos(64 * c + 32 + 4 * k));
            }
        }
        const __m512i s0 =
            _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(blk + K4_SC + 32 * c)));
        const __m512i s1 =
            _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(blk + K4_SC + 32 * c + 16)));
#pragma GCC unroll 8
        for (int n = 0; n < NA; n++)
            I[n] = _mm512_add_epi32(I[n], _mm512_add_epi32(_mm512_mullo_epi32(lo[n], s0),
                                                           _mm512_mullo_epi32(hi[n], s1)));
    }
}

/* y[n * ldy + r] = row r of the group . activation row n, r < 16, n < NA. */
INLINE void grp_impl(int NA, const uint8_t *g, int64_t ncols, const uint8_t *a, size_t as,
                     float *y, int64_t ldy, const void *pf, size_t pfb)
{
    __m512 acc[KCPU_GRP_MAX_NA];
#pragma GCC unroll 8
    for (int n = 0; n < NA; n++)
        acc[n] = _mm512_setzero_ps();
    const size_t step = pf ? prefetch_step(pfb, ncols / QK_K) : 0;
    const bool l1 = pf && prefetch_into_l1(NA);
    for (int64_t b = 0; b < ncols / QK_K; b++) {
        const uint8_t *blk = g + (size_t)b * K4_BLOCK, *ab = a + (size_t)b * ACT_BYTES;
        prefetch_slice(pf, pfb, step, b, l1);
        __m512i I[KCPU_GRP_MAX_NA];
#pragma GCC unroll 8
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
                M = dpwssd_bcast(M, mw[p], an + ACT_B + 4 * p);
            float da;
            memcpy(&da, an + ACT_D, 4);
            const __m512 x = _mm512_fmsub_ps(_mm512_cvtepi32_ps(I[n]), d,
                                             _mm512_mul_ps(_mm512_cvtepi32_ps(M), dmin));
            acc[n] = _mm512_fmadd_ps(x, _mm512_set1_ps(da), acc[n]);
        }
    }
#pragma GCC unroll 8
    for (int n = 0; n < NA; n++)
        _mm512_storeu_ps(y + (int64_t)n * ldy, acc[n]);
}

static void k4_grp(const void *g, int64_t ncols, const void *a, size_t as, int na, float *y,
                   int64_t ldy, const void *pf, size_t pfb)
{
    switch (na) {
    case 1: grp_impl(1, g, ncols, a, as, y, ldy, pf, pfb); break;
    case 2: grp_impl(2, g, ncols, a, as, y, ldy, pf, pfb); break;
    case 3: grp_impl(3, g, ncols, a, as, y, ldy, pf, pfb); break;
    case 4: grp_impl(4, g, ncols, a, as, y, ldy, pf, pfb); break;
    case 5: grp_impl(5, g, ncols, a, as, y, ldy, pf, pfb); break;
    default: grp_impl(6, g, ncols, a, as, y, ldy, pf, pfb); break;
    }
}

/* The copy's kernel for one activation row (kcpu_gemm_t.r16). */
static void k4_r16(const void *w, int64_t ncols, const void *a, float *out)
{
    grp_impl(1, w, ncols, a, 0, out, 0, NULL, 0);
}

/* ---- one row at a time (no copy, few activation rows) ---- */

INLINE int32_t hsum_epi32(__m512i v)
{
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    q = _mm_add_epi32(q, _mm_unpackhi_epi64(q, q));
    return _mm_cvtsi128_si32(q) + _mm_extract_epi32(q, 1);
}

/* Per-lane scales for the four chains of a block: bytes [sc_j x 8, sc_j' x 8]
 * for (j, j') = (0, 2), (1, 3), (4, 6), (5, 7). */
INLINE void row_scales(__m128i scmn, __m512i s[4])
{
    static const uint8_t pick[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m128i idx = _mm_unpacklo_epi64(_mm_set1_epi8((char)pick[i][0]),
                                               _mm_set1_epi8((char)pick[i][1]));
        s[i] = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(scmn, idx));
    }
}

/* The same integer sums as block_isums and the same float operations, for
 * one weight row against NA activation rows: the rows' levels in registers
 * (no transposes), lane sums scaled per group and added horizontally (exact
 * in integers, so their order is free). */
INLINE void k4_rows(int NA, int64_t n, const void *w, const void *a, size_t as, float *out)
{
    const ecs_block_q4_K *x = w;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    float acc[KCPU_MAX_NA] = {0};
    for (int64_t b = 0; b < n / QK_K; b++) {
        const __m512i q0 = _mm512_loadu_si512((const void *)x[b].qs);
        const __m512i q1 = _mm512_loadu_si512((const void *)(x[b].qs + 64));
        const __m512i lv[4] = {_mm512_and_si512(q0, m4),
                               _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4),
                               _mm512_and_si512(q1, m4),
                               _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4)};
        uint64_t sc, mn;
        k4_scales(x[b].scales, &sc, &mn);
        __m512i s[4];
        row_scales(_mm_set_epi64x((long long)mn, (long long)sc), s);
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn));
        const float d = h2f(x[b].d), dmin = h2f(x[b].dmin);
#pragma GCC unroll 4
        for (int r = 0; r < NA; r++) {
            const uint8_t *ab = (const uint8_t *)a + (size_t)r * as + (size_t)b * ACT_BYTES;
            __m512i I = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const __m512i t = _mm512_dpbusd_epi32(
                    _mm512_setzero_si512(), lv[i],
                    _mm512_loadu_si512((const void *)(ab + ACT_QS + 64 * i)));
                I = _mm512_add_epi32(I, _mm512_mullo_epi32(t, s[i]));
            }
            const __m128i m = _mm_madd_epi16(mins, _mm_loadu_si128((const __m128i *)(ab + ACT_B)));
            const int32_t M = _mm_cvtsi128_si32(m) + _mm_extract_epi32(m, 1) +
                              _mm_extract_epi32(m, 2) + _mm_extract_epi32(m, 3);
            float da;
            memcpy(&da, ab + ACT_D, 4);
            const float xb = fmaf((float)hsum_epi32(I), d, -((float)M * dmin));
            acc[r] = fmaf(xb, da, acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NA; r++)
        out[r] = acc[r];
}

KCPU_DEFINE_MULTI(k4, k4_rows)

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
        ecs_transpose16_epi32(v);
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
        .multi = k4_multi,
        .r16 = k4_r16,
        .grp = k4_grp,
        .grp_na = 6,
        .grp_pack = k4_grp_pack,
    };
}
