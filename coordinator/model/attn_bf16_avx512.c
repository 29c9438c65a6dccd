/* attn_bf16_avx512.c - the attention products over a BF16 KV cache with
 * AVX-512 BF16: vdpbf16ps takes 32 BF16 pairs' products per instruction
 * into 16 F32 sums (an F32 FMA: 16 products), lane i adding
 * a[2i+1] b[2i+1], then a[2i] b[2i]. The reductions pair neighbours: for
 * Q.K two dimensions of a key (as stored), for P.V two consecutive keys
 * (rows t and t+1 interleaved column by column). simd.c's plain loops sum
 * in the same order; model_simd_t (model_int.h) says what each computes.
 * Called only where model_cpu_bf16() holds. */
#include <immintrin.h>
#include <string.h>

#include "common/simd_avx512.h"
#include "coordinator/model/attn_avx512_int.h"
#include "coordinator/model/model_int.h"

typedef ecs_bf16_t bf16;

static inline __attribute__((always_inline)) __m512 dp(__m512 acc, __m512i a, __m512i b)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

/* The pair of BF16 values at p, broadcast to every lane. */
static inline __attribute__((always_inline)) __m512i pair(const bf16 *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

static inline __mmask32 tail32(int n) { return n >= 32 ? ~0u : n <= 0 ? 0u : (1u << n) - 1u; }

/* ------------------------------------------------ scores, keys transposed
 * Keys t0 .. t0+16 as pairs: kt[p * 16 + i] = K[t0 + i][2p, 2p+1] (a
 * 16 x 16 transposition of 32-bit words per 32 dimensions), zero past dk
 * and nt; the next 16 keys prefetched meanwhile. */
static void load_kt(int32_t *kt, const bf16 *K, size_t ks, int dk, int t0, int nt)
{
    const int tb = nt - t0 < 16 ? nt - t0 : 16;
    const int tn = nt - t0 - 16 < 16 ? nt - t0 - 16 : 16;
    for (int d = 0; d < dk; d += 32) {
        const __mmask32 k = tail32(dk - d);
        __m512i r[16];
        for (int i = 0; i < tn; i++)
            _mm_prefetch((const char *)(K + (size_t)(t0 + 16 + i) * ks + d), _MM_HINT_T0);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            r[i] = i < tb ? _mm512_maskz_loadu_epi16(k, K + (size_t)(t0 + i) * ks + d)
                          : _mm512_setzero_si512();
        ecs_transpose16_epi32(r);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            _mm512_store_si512(kt + (size_t)(d / 2 + i) * 16, r[i]);
    }
}

#define QK_QUERY(j) pair(Q + (size_t)(j) * ldq + 2 * (size_t)p)
#define QK_DOT(a, k, q) dp(a, k, q)
#define QK_KEYS(k, at) const __m512i k = _mm512_load_si512(at)
/* Q BF16 rows ldq values apart; np pairs of dimensions. */
MODEL_QK_BLOCK(bf16, size_t, int32_t, QK_KEYS, QK_QUERY, QK_DOT)

void model_bf16_scores(const float *Q, int nq, int ldq, const void *K, size_t ks, int dk, int dkp,
                       const int *len, int nt, float scale, float *S, int lds, float *kbuf)
{
    (void)dkp;
    const bf16 *Qb = (const bf16 *)Q;
    const size_t ldb = 2 * (size_t)ldq; /* BF16 values between query rows */
    int32_t *kt = (int32_t *)kbuf;
    int seen[MODEL_ATT_QMAX / 4]; /* keys each block of (up to) 8 queries sees */
    model_qk_seen(len, nq, seen);
    /* a panel of 16 keys: load_kt's rows of 16 pairs, 16 per 32 dimensions */
    const size_t panel = (size_t)((dk + 31) / 32) * 256;
    for (int t0 = 0; t0 < nt; t0 += 32) {
        const bool two = t0 + 16 < nt; /* S rows hold nt rounded up to 16 */
        load_kt(kt, K, ks, dk, t0, nt);
        if (two)
            load_kt(kt + panel, K, ks, dk, t0 + 16, nt);
        qk_blocks(Qb, ldb, kt, panel, dk / 2, two, seen, nq, t0, scale, S, lds);
    }
}

/* ------------------------------------------- scores, queries transposed
 * One accumulator per key holds 16 queries (a transposed group: each load
 * is one pair of dimensions of 16 queries), each key's pair broadcast from
 * its row as stored; a transposition of the sums gives the queries' rows.
 * At depth the keys come cold from memory (the cache of 27 layers is more
 * than L3): the next 16 keys' lines are prefetched one per pair of
 * dimensions, spread over the pass (row p % 16, line p / 16), not all at
 * its start, where a burst of 288 prefetches filled the miss queue and
 * stalled the products behind it (bench_attn_depth, T 4096 BF16 over 27
 * layers: 0.70-0.78 ms a layer bursting, 0.57-0.59 spread; two and four
 * groups ahead: 0.60-0.80, into L2 as well: no better). */
#define QT_KEY(i) acc[i] = dp(acc[i], q, pair(kr + (size_t)(i) * rs + 2 * (size_t)p))

/* deepseek's latent cache rows: kv_lora_rank 512 + rope 64 elements */
#define QT_LATENT_ROW 576

/* One group's pass over 16 keys' np pairs (rows rs apart) into acc, the
 * next keys' lines prefetched (pfn rows at pf, ks apart). RSC: rs as a
 * constant (0: not), so that the 16 rows are one pointer and 16
 * displacements instead of 16 registers and their spills (bench_attn_depth
 * at T 1024, one thread: 0.83-0.95x of the time; timed alone with the
 * keys in L2, 46 -> 57 products a cycle of 64). */
static inline __attribute__((always_inline)) void
qt_pass(const int32_t *qt, const bf16 *kr, size_t rs, size_t ks, int np, const char *pf, int pfn,
        __m512 acc[16], const size_t RSC)
{
    if (RSC)
        rs = RSC;
    for (int p = 0; p < np; p++) {
        if ((p & 15) < pfn)
            _mm_prefetch(pf + (size_t)(p & 15) * ks * sizeof(bf16) + (size_t)(p >> 4) * 64,
                         _MM_HINT_T0);
        const __m512i q = _mm512_loadu_si512(qt + (size_t)p * 16);
        QT_KEY(0), QT_KEY(1), QT_KEY(2), QT_KEY(3), QT_KEY(4), QT_KEY(5), QT_KEY(6);
        QT_KEY(7), QT_KEY(8), QT_KEY(9), QT_KEY(10), QT_KEY(11), QT_KEY(12);
        QT_KEY(13), QT_KEY(14), QT_KEY(15);
    }
}

void model_bf16_scores_t(const float *QT, int nq, const void *K, size_t ks, int dk, int nt,
                         float scale, float *S, int lds, float *kbuf)
{
    const __m512 sc = _mm512_set1_ps(scale);
    const int np = dk / 2;
    for (int t0 = 0; t0 < nt; t0 += 16) {
        const bf16 *kr = (const bf16 *)K + (size_t)t0 * ks;
        size_t rs = ks;
        /* the next keys' rows to prefetch (those before nt) */
        int pfn = nt - t0 - 16 < 16 ? nt - t0 - 16 : 16;
        const char *pf = (const char *)(kr + (size_t)16 * ks);
        if (t0 + 16 > nt) { /* the last keys, zero rows after them */
            bf16 *z = (bf16 *)kbuf;
            memset(z, 0, (size_t)16 * dk * sizeof *z);
            for (int i = 0; i < nt - t0; i++)
                memcpy(z + (size_t)i * dk, kr + (size_t)i * ks, (size_t)dk * sizeof *z);
            kr = z, rs = (size_t)dk;
        }
        for (int g = 0; g * 16 < nq; g++, pfn = 0) {
            const int32_t *qt = (const int32_t *)(QT + (size_t)g * dk * 16);
            __m512 acc[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                acc[i] = _mm512_setzero_ps();
            if (rs == QT_LATENT_ROW)
                qt_pass(qt, kr, rs, ks, np, pf, pfn, acc, QT_LATENT_ROW);
            else
                qt_pass(qt, kr, rs, ks, np, pf, pfn, acc, 0);
            __m512i v[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                v[i] = _mm512_castps_si512(acc[i]);
            ecs_transpose16_epi32(v);
            const int nj = nq - g * 16 < 16 ? nq - g * 16 : 16;
            for (int j = 0; j < nj; j++)
                _mm512_storeu_ps(S + (size_t)(g * 16 + j) * lds + t0,
                                 _mm512_mul_ps(_mm512_castsi512_ps(v[j]), sc));
        }
    }
}

/* ------------------------------------------------------------------ P.V
 * Rows t and t+1 of 32 columns interleaved by unpacklo/hi: the low
 * result's lane 4k+m holds column 8k+m's pair, the high's column 8k+4+m.
 * The accumulators keep that order; these indices turn two of them into
 * columns 0..15 / 16..31 (OUT) and back (IN). */
static const int32_t OUT0[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
static const int32_t OUT1[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
static const int32_t IN0[16] = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
static const int32_t IN1[16] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};

/* Keys per chunk of probabilities converted to BF16 pairs at once. */
#define PV_CHUNK 128

/* Rows (4 or 6) x 64 columns from d0: O[r][..] = sum over pairs of keys. */
static inline __attribute__((always_inline)) void
pv_block(const float *P, int ldp, const bf16 *V, size_t vs, int dv, int d0, int nt, float *O,
         int ldo, int rows, bool accum)
{
    const __mmask32 ma = tail32(dv - d0), mb = tail32(dv - d0 - 32);
    __mmask16 mo[4];
    for (int c = 0; c < 4; c++) {
        const int n = dv - d0 - 16 * c;
        mo[c] = n >= 16 ? 0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u);
    }
    const __m512i out0 = _mm512_loadu_si512(OUT0), out1 = _mm512_loadu_si512(OUT1);
    __m512 a[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            a[r][c] = _mm512_setzero_ps();
    if (accum) {
        const __m512i in0 = _mm512_loadu_si512(IN0), in1 = _mm512_loadu_si512(IN1);
#pragma GCC unroll 6
        for (int r = 0; r < rows; r++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const float *o = O + (size_t)r * ldo + d0 + 32 * h;
                const __m512 lo = _mm512_maskz_loadu_ps(mo[2 * h], o);
                const __m512 hi = _mm512_maskz_loadu_ps(mo[2 * h + 1], o + 16);
                a[r][2 * h] = _mm512_permutex2var_ps(lo, in0, hi);
                a[r][2 * h + 1] = _mm512_permutex2var_ps(lo, in1, hi);
            }
    }
    int32_t pp[6][PV_CHUNK / 2];
    for (int c0 = 0; c0 < nt; c0 += PV_CHUNK) {
        const int cn = nt - c0 < PV_CHUNK ? nt - c0 : PV_CHUNK;
        /* the probabilities are BF16 values already: their high halves,
         * paired, zero past nt */
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < cn; i += 16) {
                const __m512i x = _mm512_maskz_loadu_epi32(
                    (__mmask16)(cn - i >= 16 ? 0xFFFF : (1u << (cn - i)) - 1u),
                    P + (size_t)r * ldp + c0 + i);
                _mm256_storeu_si256((__m256i *)&pp[r][i / 2],
                                    _mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16)));
            }
        for (int i = 0; 2 * i < cn; i++) {
            const int t = c0 + 2 * i;
            const bf16 *v0 = V + (size_t)t * vs + d0;
            /* a long stride between rows: prefetch ahead (see simd_avx512.c) */
            _mm_prefetch((const char *)(v0 + 8 * vs), _MM_HINT_T0);
            _mm_prefetch((const char *)(v0 + 8 * vs) + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)(v0 + 9 * vs), _MM_HINT_T0);
            _mm_prefetch((const char *)(v0 + 9 * vs) + 64, _MM_HINT_T0);
            const __m512i x0 = _mm512_maskz_loadu_epi16(ma, v0);
            const __m512i x1 = _mm512_maskz_loadu_epi16(mb, v0 + 32);
            __m512i y0 = _mm512_setzero_si512(), y1 = y0;
            if (t + 1 < nt) {
                y0 = _mm512_maskz_loadu_epi16(ma, v0 + vs);
                y1 = _mm512_maskz_loadu_epi16(mb, v0 + vs + 32);
            }
            const __m512i w[4] = {_mm512_unpacklo_epi16(x0, y0), _mm512_unpackhi_epi16(x0, y0),
                                  _mm512_unpacklo_epi16(x1, y1), _mm512_unpackhi_epi16(x1, y1)};
#pragma GCC unroll 6
            for (int r = 0; r < rows; r++) {
                const __m512i p = _mm512_set1_epi32(pp[r][i]);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
                    a[r][c] = dp(a[r][c], w[c], p);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            float *o = O + (size_t)r * ldo + d0 + 32 * h;
            _mm512_mask_storeu_ps(o, mo[2 * h],
                                  _mm512_permutex2var_ps(a[r][2 * h], out0, a[r][2 * h + 1]));
            _mm512_mask_storeu_ps(o + 16, mo[2 * h + 1],
                                  _mm512_permutex2var_ps(a[r][2 * h], out1, a[r][2 * h + 1]));
        }
}

static void pv6(const float *P, int ldp, const void *V, size_t vs, int dv, int d0, int nt,
                float *O, int ldo, bool acc)
{
    pv_block(P, ldp, V, vs, dv, d0, nt, O, ldo, 6, acc);
}

static void pv4(const float *P, int ldp, const void *V, size_t vs, int dv, int d0, int nt,
                float *O, int ldo, bool acc)
{
    pv_block(P, ldp, V, vs, dv, d0, nt, O, ldo, 4, acc);
}

void model_bf16_pv(const float *P, int nq, int ldp, const void *V, size_t vs, int dv,
                   const int *len, float *O, int ldo, bool acc)
{
    model_pv_blocks(P, nq, ldp, V, vs, sizeof(bf16), dv, len, O, ldo, acc, pv6, pv4);
}
