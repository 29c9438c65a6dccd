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
 * zero-padded superblock.
 *
 * The layout's helpers and the weight unpacking are in gemm_avx512_int.h,
 * the row-interleaved Q5_0 / Q8_0 kernels in gemm_r16_avx512.c (split for
 * size: this file held all three). */
#include "kernels/cpu/gemm_avx512_int.h"

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
/* with the decode copy (gemm_r16_avx512.c adds its kernels): its kernel for any number of rows (six per pass
 * share a group's decoding; bench_matvec --only prefill: faster than the
 * tiles up to 64 rows and more) */
#define GC(name, T)                                                                           \
    (kcpu_gemm_t)                                                                             \
    {                                                                                         \
        .w_sb = w_sb_bytes(8, false), .a_sb = a_sb_bytes(8, false), .sb_cols = 512,           \
        .mr = GEMM_MR, .unpack_w = name##_unpack, .pack_act = name##_pack,                    \
        .pack_act1 = name##_pack1, .tile = tile_8_0, .multi = name##_multi, .grp_na = 6       \
    }
    switch (wtype) {
    case ECS_TYPE_Q4_0: return G(q4_0, ECS_TYPE_Q4_0, tile_8_0);
    case ECS_TYPE_Q4_1: return G(q4_1, ECS_TYPE_Q4_1, tile_8_1);
    case ECS_TYPE_Q5_0: {
        kcpu_gemm_t g = GC(q5_0, ECS_TYPE_Q5_0);
        kcpu_gemm_r16_avx512(wtype, &g); /* gemm_r16_avx512.c */
        return g;
    }
    case ECS_TYPE_Q5_1: return G(q5_1, ECS_TYPE_Q5_1, tile_8_1);
    case ECS_TYPE_Q8_0: {
        kcpu_gemm_t g = GC(q8_0, ECS_TYPE_Q8_0);
        kcpu_gemm_r16_avx512(wtype, &g);
        return g;
    }
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
