/* attn_amx.c - the two products of a block of the decode key split
 * (attn.c split_block) over a BF16 cache with AMX: tdpbf16ps adds to a
 * 16 x 16 F32 tile the products of a 16 x 32 BF16 tile and a 32 x 16 one,
 * 8192 products an instruction where vdpbf16ps takes 32. At depth the
 * latent attention is compute-bound on vdpbf16ps (16 heads x 1088 products
 * a key and layer on 1152 bytes); on the tile unit it is bound by reading
 * the cache.
 *
 * Scores: C[key][query] = K . Q^T, the keys as A tiles straight from the
 * cache (16 rows ks apart, 32 dimensions), the queries as B tiles:
 * model_qt_bf16's transposed groups are the pairs layout B wants (row p:
 * dimensions 2p, 2p+1 of 16 queries). Four tiles of keys at once, so four
 * accumulations are in flight (one tile's sums depend on each other).
 * P.V: O[query][d] = P V, the probabilities (BF16 values already) as A
 * tiles (16 queries x 32 keys), the values as B tiles, which want keys t
 * and t+1 interleaved column by column: a staging copy per block, built
 * from the rows the scores just brought to L2.
 *
 * The tile unit sums each dot product in its own order, not vdpbf16ps's
 * pair by pair (test_attn_tiles measures it), so results differ from the
 * other kernels' in the last bits. They depend on nothing but the query,
 * the keys and the tiles' fixed cut of them (16 keys, 32 dimensions): not
 * on the thread count, the step's other rows or timing. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "common/simd_avx512.h"
#include "coordinator/model/model_int.h"

typedef ecs_bf16_t bf16;

/* Palette 1, every tile 16 rows of 64 bytes. */
static void tiles_config(void)
{
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } __attribute__((packed, aligned(64))) c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++)
        c.colsb[i] = 64, c.rows[i] = 16;
    _tile_loadconfig(&c);
}

/* ------------------------------------------------------------ scores */

/* Keys [0, nk) of kr (rows rs bytes apart), dimensions [32 c, dk) of
 * each (fewer than 32) into rows of 32 at buf, zero after them: a last
 * chunk of dimensions the tile cannot read from the row (past it lies the
 * next row, whatever its bits, and 0 x NaN is NaN). */
static void tail_chunk(bf16 *buf, const char *kr, size_t rs, int nk, int c, int dk)
{
    const __mmask32 m = (__mmask32)((1u << (dk - 32 * c)) - 1u);
    for (int i = 0; i < nk; i++)
        _mm512_store_si512(buf + 32 * i,
                           _mm512_maskz_loadu_epi16(m, kr + (size_t)i * rs + (size_t)c * 64));
}

/* Tiles 0..3 = keys [0, 64) from kr (rows rs bytes apart) . the group of
 * queries at qt, over dk dimensions (buf: 64 rows of 32 for a last
 * partial chunk). */
static void qk_tiles4(const char *kr, size_t rs, const char *qt, int dk, bf16 *buf,
                      const char *pf)
{
    const int nc = (dk + 31) / 32;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int c = 0; c < nc; c++) {
        const char *k = kr + (size_t)c * 64;
        size_t r = rs;
        if (32 * c + 32 > dk) {
            tail_chunk(buf, kr, rs, 64, c, dk);
            k = (const char *)buf, r = 64;
        }
        if (pf) /* line c of 64 keys ahead: the tiles wait on misses */
            for (int i = 0; i < 64; i++)
                _mm_prefetch(pf + (size_t)i * rs + (size_t)c * 64, _MM_HINT_T1);
        _tile_loadd(4, qt + (size_t)c * 1024, 64);
        _tile_loadd(5, k, r);
        _tile_dpbf16ps(0, 5, 4);
        _tile_loadd(6, k + 16 * r, r);
        _tile_dpbf16ps(1, 6, 4);
        _tile_loadd(7, k + 32 * r, r);
        _tile_dpbf16ps(2, 7, 4);
        _tile_loadd(5, k + 48 * r, r);
        _tile_dpbf16ps(3, 5, 4);
    }
}

/* Tile 0 = keys [0, 16) . the queries. */
static void qk_tile1(const char *kr, size_t rs, const char *qt, int dk, bf16 *buf)
{
    const int nc = (dk + 31) / 32;
    _tile_zero(0);
    for (int c = 0; c < nc; c++) {
        const char *k = kr + (size_t)c * 64;
        size_t r = rs;
        if (32 * c + 32 > dk) {
            tail_chunk(buf, kr, rs, 16, c, dk);
            k = (const char *)buf, r = 64;
        }
        _tile_loadd(4, qt + (size_t)c * 1024, 64);
        _tile_loadd(5, k, r);
        _tile_dpbf16ps(0, 5, 4);
    }
}

/* S[j][0..16) = scale * c[..][j] for j < nj: a tile of 16 keys x 16
 * queries transposed into the queries' rows. */
static void put_scores(const float *c, int nj, float scale, float *S, int lds)
{
    __m512i v[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        v[i] = _mm512_load_si512(c + 16 * i);
    ecs_transpose16_epi32(v);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int j = 0; j < nj; j++)
        _mm512_storeu_ps(S + (size_t)j * lds, _mm512_mul_ps(_mm512_castsi512_ps(v[j]), sc));
}

void model_amx_scores(const float *QT, int nq, const void *K, size_t ks, int dk, int nt,
                      float scale, float *S, int lds, float *kbuf)
{
    float c[4][256] __attribute__((aligned(64)));
    bf16 buf[64 * 32] __attribute__((aligned(64)));
    const size_t rs = ks * sizeof(bf16);
    tiles_config();
    for (int t0 = 0; t0 < nt;) {
        const char *kr = (const char *)K + (size_t)t0 * rs;
        const int four = nt - t0 >= 64;
        if (!four && nt - t0 < 16) { /* the last keys, zero rows after them */
            bf16 *z = (bf16 *)kbuf;
            memset(z, 0, (size_t)16 * dk * sizeof *z);
            for (int i = 0; i < nt - t0; i++)
                memcpy(z + (size_t)i * dk, kr + (size_t)i * rs, (size_t)dk * sizeof *z);
            kr = (const char *)z;
        }
        const size_t r = kr == (const char *)kbuf ? (size_t)dk * sizeof(bf16) : rs;
        for (int g = 0; g * 16 < nq; g++) {
            const char *qt = (const char *)(QT + (size_t)g * dk * 16);
            const int nj = nq - g * 16 < 16 ? nq - g * 16 : 16;
            if (four) {
                /* keys [t0 + 128, t0 + 192) into L2, while this group is the
                 * first (bench_attn_depth at depth 4096: 64 keys ahead into
                 * L1 1.66-1.72 ms a layer, every other line; this 1.25-1.54) */
                qk_tiles4(kr, r, qt, dk, buf, g == 0 && nt - t0 >= 192 ? kr + 128 * rs : NULL);
                _tile_stored(0, c[0], 64);
                _tile_stored(1, c[1], 64);
                _tile_stored(2, c[2], 64);
                _tile_stored(3, c[3], 64);
            } else {
                qk_tile1(kr, r, qt, dk, buf);
                _tile_stored(0, c[0], 64);
            }
            for (int i = 0; i < (four ? 4 : 1); i++)
                put_scores(c[i], nj, scale, S + (size_t)g * 16 * lds + t0 + 16 * i, lds);
        }
        t0 += four ? 64 : 16;
    }
    _tile_release();
}

/* --------------------------------------------------------------- P.V */

/* Word indices interleaving two rows of 32 BF16 values column by column:
 * the first 16 columns' pairs, then the last 16's. */
static const uint16_t PAIR_LO[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                     37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                     11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
static const uint16_t PAIR_HI[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                     53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                     27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
/* The high halves of 32 floats: their BF16 values. */
static const uint16_t HIGH[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                  23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                  45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

/* B tiles of 64 columns of the values: tile (kc, i) holds keys [32 kc,
 * 32 kc + 32) x columns [d0 + 16 i, d0 + 16 i + 16), row r the pair of
 * keys 32 kc + 2r, +1 (32 KB for a block's 256 keys: the staging stays in
 * L1 while the tiles read it; all 512 columns at once, 256 KB, went
 * through L2 twice and cost more than the products). */
static bf16 *b_tile(bf16 *stage, int kc, int i) { return stage + ((size_t)kc * 4 + i) * 512; }

/* Columns [d0, d0 + 64) of the values' runs (vr[r]: rn[r] rows vs
 * elements apart, every run but the last an even count) into B tiles,
 * pairs past the keys zero up to nkc chunks of 32 keys. */
static void stage_values(bf16 *stage, const bf16 *const *vr, const int *rn, int nrun, size_t vs,
                         int d0, int nkc)
{
    const __m512i lo = _mm512_loadu_si512(PAIR_LO), hi = _mm512_loadu_si512(PAIR_HI);
    int pi = 0; /* pairs so far */
    for (int r = 0; r < nrun; r++)
        for (int t = 0; t < rn[r]; t += 2, pi++) {
            const bf16 *v0 = vr[r] + (size_t)t * vs + d0, *v1 = v0 + vs;
            const bool two = t + 1 < rn[r];
            bf16 *dst = b_tile(stage, pi / 16, 0) + (size_t)(pi % 16) * 32;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i x = _mm512_loadu_si512(v0 + 32 * h);
                const __m512i y = two ? _mm512_loadu_si512(v1 + 32 * h) : _mm512_setzero_si512();
                _mm512_store_si512(dst + (size_t)(2 * h) * 512,
                                   _mm512_permutex2var_epi16(x, lo, y));
                _mm512_store_si512(dst + (size_t)(2 * h + 1) * 512,
                                   _mm512_permutex2var_epi16(x, hi, y));
            }
        }
    for (; pi < nkc * 16; pi++)
        for (int i = 0; i < 4; i++)
            _mm512_store_si512(b_tile(stage, pi / 16, i) + (size_t)(pi % 16) * 32,
                               _mm512_setzero_si512());
}

/* A tiles of the probabilities: tile (g, kc) holds queries [16 g, 16 g +
 * 16) x keys [32 kc, 32 kc + 32) as BF16, zero past nq and nt. */
static void stage_probs(bf16 *a, const float *P, int nq, int ldp, int nt, int ng, int nkc)
{
    const __m512i high = _mm512_loadu_si512(HIGH);
    for (int g = 0; g < ng; g++)
        for (int kc = 0; kc < nkc; kc++)
            for (int i = 0; i < 16; i++) {
                const int q = 16 * g + i, t = 32 * kc;
                __m512i row = _mm512_setzero_si512();
                if (q < nq) {
                    const int n0 = nt - t, n1 = nt - t - 16;
                    const __mmask16 m0 = n0 >= 16 ? 0xFFFF : (__mmask16)((1u << n0) - 1u);
                    const __mmask16 m1 = n1 >= 16   ? 0xFFFF
                                         : n1 <= 0 ? 0
                                                   : (__mmask16)((1u << n1) - 1u);
                    const float *p = P + (size_t)q * ldp + t;
                    row = _mm512_permutex2var_epi16(
                        _mm512_castps_si512(_mm512_maskz_loadu_ps(m0, p)), high,
                        _mm512_castps_si512(_mm512_maskz_loadu_ps(m1, p + 16)));
                }
                _mm512_store_si512(a + (((size_t)g * nkc + kc) * 16 + i) * 32, row);
            }
}

/* O rows [16 g, 16 g + 16) x 64 columns (+)= the A tiles of group g .
 * the B tiles of those columns, over nkc chunks of keys. */
static void pv_tiles4(const bf16 *a, const bf16 *stage, int nkc, float *O, size_t ldo_bytes,
                      bool acc)
{
    if (acc) {
        _tile_loadd(0, O, ldo_bytes);
        _tile_loadd(1, O + 16, ldo_bytes);
        _tile_loadd(2, O + 32, ldo_bytes);
        _tile_loadd(3, O + 48, ldo_bytes);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int kc = 0; kc < nkc; kc++) {
        _tile_loadd(4, a + (size_t)kc * 512, 64);
        _tile_loadd(5, b_tile((bf16 *)stage, kc, 0), 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, b_tile((bf16 *)stage, kc, 1), 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, b_tile((bf16 *)stage, kc, 2), 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, b_tile((bf16 *)stage, kc, 3), 64);
        _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, O, ldo_bytes);
    _tile_stored(1, O + 16, ldo_bytes);
    _tile_stored(2, O + 32, ldo_bytes);
    _tile_stored(3, O + 48, ldo_bytes);
}

size_t model_amx_pv_stage(int nq, int nt, int dv)
{
    const size_t nkc = (size_t)(nt + 31) / 32, ng = (size_t)(nq + 15) / 16;
    (void)dv;
    return (nkc * 4 + ng * nkc) * 512 * sizeof(bf16);
}

void model_amx_pv(const float *P, int nq, int ldp, const void *const *vr, const int *rn, int nrun,
                  size_t vs, int dv, float *O, int ldo, bool acc, void *stage)
{
    int nt = 0;
    for (int r = 0; r < nrun; r++)
        nt += rn[r];
    const int nkc = (nt + 31) / 32, ng = (nq + 15) / 16;
    bf16 *b = stage, *a = b + (size_t)nkc * 4 * 512;
    stage_probs(a, P, nq, ldp, nt, ng, nkc);
    tiles_config();
    for (int d0 = 0; d0 < dv; d0 += 64) {
        stage_values(b, (const bf16 *const *)vr, rn, nrun, vs, d0, nkc);
        for (int g = 0; g < ng; g++)
            pv_tiles4(a + (size_t)g * nkc * 512, b, nkc, O + (size_t)g * 16 * ldo + d0,
                      (size_t)ldo * sizeof(float), acc);
    }
    _tile_release();
}
