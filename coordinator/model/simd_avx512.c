/* simd_avx512.c - AVX-512 versions of the model's hot loops (see simd.c
 * for what each computes): a vector exp for softmax, and
 * register-blocked attention products over an F16 or F32 KV cache: Q.K on
 * blocks of 32 keys transposed once (8 queries x 32 keys per kernel), P.V
 * with 6 (or 4) queries x 64 values of accumulators over blocks of 256
 * keys (attn_avx512_int.h). A BF16 cache goes to attn_bf16_avx512.c where
 * the CPU has AVX-512 BF16, else to the plain loops. Every output element
 * is a sequential sum whatever the blocking, so results do not depend on
 * how many queries or rows a call holds. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "common/simd_avx512.h"
#include "coordinator/model/attn_avx512_int.h"
#include "coordinator/model/model_int.h"

/* Round to nearest even, no exceptions (F16 conversions). */
#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* r[i] becomes column i of the 16 x 16 block whose rows were r[0..15]
 * (the words moved as integers: the same bits). */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16])
{
    __m512i v[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        v[i] = _mm512_castps_si512(r[i]);
    ecs_transpose16_epi32(v);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_castsi512_ps(v[i]);
}

/* Keys t0 .. t0+16 transposed: kt[d * 16 + i] = K[t0 + i][d], zero past dk
 * and past nt. The next 16 keys are prefetched meanwhile: read 64 bytes at
 * a time across 16 rows, they are 16 streams too short for the hardware
 * prefetcher (the latent attention at depth 512 took ~25 % longer). */
static void load_kt(float *kt, const void *K, size_t ks, bool f16, int dk, int dkp, int t0,
                    int nt)
{
    const int tb = nt - t0 < 16 ? nt - t0 : 16;
    const int tn = nt - t0 - 16 < 16 ? nt - t0 - 16 : 16;
    const size_t eb = f16 ? sizeof(ecs_fp16_t) : sizeof(float);
    for (int d = 0; d < dkp; d += 16) {
        const __mmask16 k = ecs_tail_mask16(dk - d);
        __m512 r[16];
        for (int i = 0; i < tn; i++)
            _mm_prefetch((const char *)K + ((size_t)(t0 + 16 + i) * ks + (size_t)d) * eb,
                         _MM_HINT_T0);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const size_t off = (size_t)(t0 + i) * ks + (size_t)d;
            if (i >= tb)
                r[i] = _mm512_setzero_ps();
            else if (f16)
                r[i] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, (const ecs_fp16_t *)K + off));
            else
                r[i] = _mm512_maskz_loadu_ps(k, (const float *)K + off);
        }
        transpose16(r);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            _mm512_store_ps(kt + (size_t)(d + i) * 16, r[i]);
    }
}

#define QK_QUERY(j) _mm512_set1_ps(Q[(size_t)(j) * ldq + p])
#define QK_DOT(a, k, q) _mm512_fmadd_ps(q, k, a)
#define QK_KEYS(k, at) const __m512 k = _mm512_load_ps(at)
/* np = dkp dimensions. */
MODEL_QK_BLOCK(float, int, float, QK_KEYS, QK_QUERY, QK_DOT)

/* Each block of 32 keys (or 16 at the end) is transposed once, then every
 * query takes one broadcast FMA per dimension and key panel, no
 * reductions. A score is the same sequential sum over dimensions however
 * many queries or keys a block holds, so batched and one-by-one evaluation
 * agree bit for bit. */
/* A block of queries skips the keys that none of them sees (a prompt's
 * causal mask spares an item's first rows most of its last keys). */
static void scores_avx512(const float *Q, int nq, int ldq, const void *K, size_t ks,
                          model_kvt_t kt, int dk, int dkp, const int *len, int nt, float scale,
                          float *S, int lds, float *kbuf)
{
    if (kt == MODEL_KV_BF16) {
        if (model_cpu_bf16())
            model_bf16_scores(Q, nq, ldq, K, ks, dk, dkp, len, nt, scale, S, lds, kbuf);
        else
            model_simd_plain()->scores(Q, nq, ldq, K, ks, kt, dk, dkp, len, nt, scale, S, lds,
                                       kbuf);
        return;
    }
    const bool kf16 = kt == MODEL_KV_F16;
    int seen[MODEL_ATT_QMAX / 4]; /* keys each block of (up to) 8 queries sees */
    model_qk_seen(len, nq, seen);
    const size_t panel = (size_t)16 * dkp;
    for (int t0 = 0; t0 < nt; t0 += 32) {
        const bool two = t0 + 16 < nt; /* S rows hold nt rounded up to 16 */
        load_kt(kbuf, K, ks, kf16, dk, dkp, t0, nt);
        if (two)
            load_kt(kbuf + panel, K, ks, kf16, dk, dkp, t0 + 16, nt);
        qk_blocks(Q, ldq, kbuf, panel, dkp, two, seen, nq, t0, scale, S, lds);
    }
}

/* Keys t0 .. t0+16 as F32 rows of dk floats in kbuf (zero rows past nt);
 * the next block's rows are prefetched meanwhile. */
static void load_k_rows(float *kbuf, const void *K, size_t ks, bool f16, int dk, int t0, int nt)
{
    const size_t eb = f16 ? sizeof(ecs_fp16_t) : sizeof(float);
    for (int i = 0; i < 16; i++) {
        float *dst = kbuf + (size_t)i * dk;
        const char *row = (const char *)K + (size_t)(t0 + i) * ks * eb;
        if (t0 + i >= nt) {
            memset(dst, 0, (size_t)dk * sizeof *dst);
            continue;
        }
        if (t0 + 16 + i < nt)
            for (size_t b = 0; b < (size_t)dk * eb; b += 64)
                _mm_prefetch(row + 16 * ks * eb + b, _MM_HINT_T0);
        for (int d = 0; d < dk; d += 16) {
            const __mmask16 k = ecs_tail_mask16(dk - d);
            const __m512 v =
                f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, (const ecs_fp16_t *)row + d))
                    : _mm512_maskz_loadu_ps(k, (const float *)row + d);
            _mm512_mask_storeu_ps(dst + d, k, v);
        }
    }
}

#define QT_KEY(i) acc[i] = _mm512_fmadd_ps(q, _mm512_set1_ps(kbuf[(size_t)(i) * dk + d]), acc[i])

/* 16 queries (one transposed group) x 16 keys: one accumulator per key
 * holds the 16 queries, so each FMA is q_j[d] * k_t[d] added to score
 * (j, t) in order of d, as qk_block's; a transposition of the sums turns
 * them into the queries' rows. */
static void scores_t_avx512(const float *QT, int nq, const void *K, size_t ks, model_kvt_t kt,
                            int dk, int nt, float scale, float *S, int lds, float *kbuf)
{
    if (kt == MODEL_KV_BF16) {
        if (model_cpu_bf16())
            model_bf16_scores_t(QT, nq, K, ks, dk, nt, scale, S, lds, kbuf);
        else
            model_simd_plain()->scores_t(QT, nq, K, ks, kt, dk, nt, scale, S, lds, kbuf);
        return;
    }
    const bool kf16 = kt == MODEL_KV_F16;
    const __m512 sc = _mm512_set1_ps(scale);
    for (int t0 = 0; t0 < nt; t0 += 16) {
        load_k_rows(kbuf, K, ks, kf16, dk, t0, nt);
        for (int g = 0; g * 16 < nq; g++) {
            const float *qt = QT + (size_t)g * dk * 16;
            __m512 acc[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                acc[i] = _mm512_setzero_ps();
            for (int d = 0; d < dk; d++) {
                const __m512 q = _mm512_load_ps(qt + (size_t)d * 16);
                QT_KEY(0), QT_KEY(1), QT_KEY(2), QT_KEY(3), QT_KEY(4), QT_KEY(5), QT_KEY(6);
                QT_KEY(7), QT_KEY(8), QT_KEY(9), QT_KEY(10), QT_KEY(11), QT_KEY(12);
                QT_KEY(13), QT_KEY(14), QT_KEY(15);
            }
            transpose16(acc);
            const int nj = nq - g * 16 < 16 ? nq - g * 16 : 16;
            for (int j = 0; j < nj; j++)
                _mm512_storeu_ps(S + (size_t)(g * 16 + j) * lds + t0, _mm512_mul_ps(acc[j], sc));
        }
    }
}

/* x rounded to the nearest BF16 value, ties to even (x finite) */
static inline __m512 round_bf16(__m512 x)
{
    const __m512i b = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}

static void softmax_avx512(float *S, int nq, int lds, const int *len, int nt, model_kvt_t kt,
                           float *mxo, float *sumo)
{
    for (int j = 0; j < nq; j++) {
        float *s = S + (size_t)j * lds;
        const int n = len[j];
        __m512 vmx = _mm512_set1_ps(-INFINITY);
        for (int t = 0; t < n; t += 16)
            vmx = _mm512_max_ps(vmx, _mm512_mask_loadu_ps(vmx, ecs_tail_mask16(n - t), s + t));
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
        __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
        for (int t = 0; t < n; t += 16) {
            const __mmask16 k = ecs_tail_mask16(n - t);
            const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), mx);
            const __m512 e = _mm512_maskz_mov_ps(k, ecs_exp512_ps(x));
            _mm512_mask_storeu_ps(s + t, k, e);
            const __m256 e_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
            lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
            hi = _mm512_add_pd(hi, _mm512_cvtps_pd(e_hi));
        }
        const double sum = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
        if (mxo)
            mxo[j] = _mm512_cvtss_f32(mx), sumo[j] = (float)sum;
        const __m512 inv = _mm512_set1_ps(mxo ? 1.0f : n > 0 ? (float)(1.0 / sum) : 0.0f);
        for (int t = 0; t < nt; t += 16) {
            const __mmask16 k = ecs_tail_mask16(nt - t);
            __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(ecs_tail_mask16(n - t), s + t), inv);
            if (kt == MODEL_KV_F16)
                p = _mm512_cvtph_ps(_mm512_cvtps_ph(p, RNE));
            else if (kt == MODEL_KV_BF16)
                p = round_bf16(p);
            _mm512_mask_storeu_ps(s + t, k, p);
        }
    }
}

/* 16 values of V row t at column d (F16 or F32), zero where m is clear. */
static inline __attribute__((always_inline)) __m512 load_v(const void *V, size_t off, __mmask16 m,
                                                           bool f16)
{
    return f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const ecs_fp16_t *)V + off))
               : _mm512_maskz_loadu_ps(m, (const float *)V + off);
}

#define PV_ROW(a0, a1, a2, a3, prow)                                                               \
    do {                                                                                           \
        const __m512 p = _mm512_set1_ps((prow)[t]);                                                \
        a0 = _mm512_fmadd_ps(p, v0, a0);                                                           \
        a1 = _mm512_fmadd_ps(p, v1, a1);                                                           \
        a2 = _mm512_fmadd_ps(p, v2, a2);                                                           \
        a3 = _mm512_fmadd_ps(p, v3, a3);                                                           \
    } while (0)

/* Four (or six) output rows of 64 values: O[a][d0 .. d0+64) = sum_t P[a][t]
 * V[t][..], the accumulators in registers and each V row converted once
 * for all of them. */
static inline __attribute__((always_inline)) void
pv_block(const float *P, int ldp, const void *V, size_t vs, bool vf16, int dv, int d0, int nt,
         float *O, int ldo, bool six, bool acc)
{
    const __mmask16 m0 = ecs_tail_mask16(dv - d0), m1 = ecs_tail_mask16(dv - d0 - 16);
    const __mmask16 m2 = ecs_tail_mask16(dv - d0 - 32), m3 = ecs_tail_mask16(dv - d0 - 48);
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    __m512 a40 = a00, a41 = a00, a42 = a00, a43 = a00;
    __m512 a50 = a00, a51 = a00, a52 = a00, a53 = a00;
/* OP(accumulator, row, column) for each accumulator in use */
#define PV_EACH(OP)                                                                                \
    do {                                                                                           \
        OP(a00, 0, 0), OP(a01, 0, 1), OP(a02, 0, 2), OP(a03, 0, 3);                               \
        OP(a10, 1, 0), OP(a11, 1, 1), OP(a12, 1, 2), OP(a13, 1, 3);                               \
        OP(a20, 2, 0), OP(a21, 2, 1), OP(a22, 2, 2), OP(a23, 2, 3);                               \
        OP(a30, 3, 0), OP(a31, 3, 1), OP(a32, 3, 2), OP(a33, 3, 3);                               \
        if (six) {                                                                                 \
            OP(a40, 4, 0), OP(a41, 4, 1), OP(a42, 4, 2), OP(a43, 4, 3);                           \
            OP(a50, 5, 0), OP(a51, 5, 1), OP(a52, 5, 2), OP(a53, 5, 3);                           \
        }                                                                                          \
    } while (0)
#define PV_LOAD(a, r, c) a = _mm512_maskz_loadu_ps(m##c, O + (size_t)(r) * ldo + d0 + 16 * (c))
    if (acc) /* continue the sums of earlier keys */
        PV_EACH(PV_LOAD);
    const float *p0 = P, *p1 = P + ldp, *p2 = P + 2 * (size_t)ldp, *p3 = P + 3 * (size_t)ldp;
    const float *p4 = P + 4 * (size_t)ldp, *p5 = P + 5 * (size_t)ldp;
    const size_t eb = vf16 ? sizeof(ecs_fp16_t) : sizeof(float);
    for (int t = 0; t < nt; t++) {
        const size_t off = (size_t)t * vs + (size_t)d0;
        /* the rows are 64 values of a long stride apart: a stream the
         * hardware prefetcher follows late (decode at depth 4096 spent
         * 3x the cached time here) */
        const char *ahead = (const char *)V + (off + 8 * vs) * eb;
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
        if (!vf16) {
            _mm_prefetch(ahead + 128, _MM_HINT_T0);
            _mm_prefetch(ahead + 192, _MM_HINT_T0);
        }
        const __m512 v0 = load_v(V, off, m0, vf16), v1 = load_v(V, off + 16, m1, vf16);
        const __m512 v2 = load_v(V, off + 32, m2, vf16), v3 = load_v(V, off + 48, m3, vf16);
        PV_ROW(a00, a01, a02, a03, p0);
        PV_ROW(a10, a11, a12, a13, p1);
        PV_ROW(a20, a21, a22, a23, p2);
        PV_ROW(a30, a31, a32, a33, p3);
        if (six) {
            PV_ROW(a40, a41, a42, a43, p4);
            PV_ROW(a50, a51, a52, a53, p5);
        }
    }
#define PV_STORE(a, r, c) _mm512_mask_storeu_ps(O + (size_t)(r) * ldo + d0 + 16 * (c), m##c, a)
    PV_EACH(PV_STORE);
#undef PV_STORE
#undef PV_LOAD
#undef PV_EACH
}

#define PV_VARIANT(name, f16, six)                                                                 \
    static void name(const float *P, int ldp, const void *V, size_t vs, int dv, int d0, int nt,    \
                     float *O, int ldo, bool acc)                                                  \
    {                                                                                              \
        pv_block(P, ldp, V, vs, f16, dv, d0, nt, O, ldo, six, acc);                                \
    }
PV_VARIANT(pv4_f16, true, false)
PV_VARIANT(pv6_f16, true, true)
PV_VARIANT(pv4_f32, false, false)
PV_VARIANT(pv6_f32, false, true)

static void pv_avx512(const float *P, int nq, int ldp, const void *V, size_t vs, model_kvt_t kt,
                      int dv, const int *len, float *O, int ldo, bool acc)
{
    if (kt == MODEL_KV_BF16) {
        if (model_cpu_bf16())
            model_bf16_pv(P, nq, ldp, V, vs, dv, len, O, ldo, acc);
        else
            model_simd_plain()->pv(P, nq, ldp, V, vs, kt, dv, len, O, ldo, acc);
        return;
    }
    const bool vf16 = kt == MODEL_KV_F16;
    model_pv_blocks(P, nq, ldp, V, vs, vf16 ? sizeof(ecs_fp16_t) : sizeof(float), dv, len, O, ldo,
                    acc, vf16 ? pv6_f16 : pv6_f32, vf16 ? pv4_f16 : pv4_f32);
}

static void round_f16_avx512(float *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = ecs_tail_mask16(n - i);
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i), RNE);
        _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(h));
    }
}

static void to_f16_avx512(ecs_fp16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = ecs_tail_mask16(n - i);
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i), RNE);
        _mm256_mask_storeu_epi16(dst + i, k, h);
    }
}

/* ecs_f32_to_bf16 on 16 lanes: nearest even, a NaN kept quiet */
static void to_bf16_avx512(ecs_bf16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = ecs_tail_mask16(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(k, src + i);
        const __m512i b = _mm512_castps_si512(x);
        const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        __m512i r = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(x)), 16);
        r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
        _mm256_mask_storeu_epi16(dst + i, k, _mm512_cvtepi32_epi16(r));
    }
}

/* Activation rows the packed Q8_0 product takes at once: a group's
 * weights, loaded from memory for the first, come from L1 for the rest. */
#define Q8P_NA 4

/* One group of MODEL_Q8P_ROWS rows against activation row a: each block's
 * levels (4 per row per load) meet the row's 4 matching activations,
 * broadcast; the +128 of the weights comes off as 128 * sum(block). */
static inline __m512 q8p_group(const uint8_t *g, int nblk, const ecs_block_q8_0 *a,
                               const int32_t *corr, const float *da)
{
    const size_t lv = MODEL_Q8P_ROWS * sizeof(ecs_fp16_t);
    const size_t bb = lv + (size_t)MODEL_Q8P_ROWS * ECS_QK;
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nblk; b++) {
        const uint8_t *blk = g + (size_t)b * bb;
        const int8_t *q = a[b].qs;
        __m512i s0 = _mm512_set1_epi32(-corr[b]), s1 = _mm512_setzero_si512();
        for (int k = 0; k < ECS_QK / 4; k += 2) {
            int32_t q0, q1;
            memcpy(&q0, q + 4 * k, 4);
            memcpy(&q1, q + 4 * k + 4, 4);
            s0 = _mm512_dpbusd_epi32(s0, _mm512_loadu_si512(blk + lv + (size_t)k * 64),
                                     _mm512_set1_epi32(q0));
            s1 = _mm512_dpbusd_epi32(s1, _mm512_loadu_si512(blk + lv + (size_t)k * 64 + 64),
                                     _mm512_set1_epi32(q1));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                              _mm512_mul_ps(dw, _mm512_set1_ps(da[b])), acc);
    }
    return acc;
}

static void dot_q8p_avx512(const void *w, int nrows, int nblk, const void *a, size_t as, int na,
                           float *y, int64_t ldy)
{
    const size_t gb = (size_t)nblk * MODEL_Q8P_ROWS * (sizeof(ecs_fp16_t) + ECS_QK);
    for (int j0 = 0; j0 < na; j0 += Q8P_NA) {
        const int nj = na - j0 < Q8P_NA ? na - j0 : Q8P_NA;
        int32_t corr[Q8P_NA][MODEL_Q8P_MAXBLK];
        float da[Q8P_NA][MODEL_Q8P_MAXBLK];
        const ecs_block_q8_0 *ar[Q8P_NA];
        for (int j = 0; j < nj; j++) {
            ar[j] = (const void *)((const uint8_t *)a + (size_t)(j0 + j) * as);
            for (int b = 0; b < nblk; b++) {
                int32_t sum = 0;
                for (int i = 0; i < ECS_QK; i++)
                    sum += ar[j][b].qs[i];
                corr[j][b] = 128 * sum;
                da[j][b] = ecs_fp16_to_f32(ar[j][b].d);
            }
        }
        for (int r = 0; r < nrows; r += MODEL_Q8P_ROWS) {
            const uint8_t *g = (const uint8_t *)w + (size_t)(r / MODEL_Q8P_ROWS) * gb;
            for (int j = 0; j < nj; j++)
                _mm512_storeu_ps(y + (int64_t)(j0 + j) * ldy + r,
                                 q8p_group(g, nblk, ar[j], corr[j], da[j]));
        }
    }
}

/* 64 values at a time in registers over all blocks: each block's row is
 * read once and o written once (the plain loop's order: a product, then
 * the sum, no FMA). */
static void wsum_avx512(float *o, int n, const float *x, size_t xs, const float *w, int nb,
                        float scale)
{
    const __m512 sc = _mm512_set1_ps(scale);
    for (int d0 = 0; d0 < n; d0 += 64) {
        __mmask16 m[4];
        __m512 a[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const int k = n - d0 - 16 * c;
            m[c] = k >= 16 ? 0xFFFF : k <= 0 ? 0 : (__mmask16)((1u << k) - 1u);
            a[c] = _mm512_setzero_ps();
        }
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)b * xs + d0;
            const __m512 wb = _mm512_set1_ps(w[b]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[c] = _mm512_add_ps(a[c], _mm512_mul_ps(wb, _mm512_maskz_loadu_ps(m[c], xb + 16 * c)));
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(o + d0 + 16 * c, m[c], _mm512_mul_ps(a[c], sc));
    }
}

static const model_simd_t avx512 = {scores_avx512,    scores_t_avx512, softmax_avx512,
                                    pv_avx512,        round_f16_avx512, to_f16_avx512,
                                    to_bf16_avx512,   dot_q8p_avx512,  wsum_avx512};

const model_simd_t *model_simd_avx512(void) { return &avx512; }
