/* attn_q8.c - the 8-bit latent cache (--kv-type q8, MODEL_KV_Q8): its
 * rows, the queries it takes, and the plain loops of the decode key
 * split's products over it, which attn_q8_avx512.c computes with VNNI to
 * the same bits (model_int.h gives the format and the arithmetic).
 *
 * Why: at depth, decode is bound by the attention's products, not by
 * bytes (docs/benchmarks.md "session 34"): 8-bit keys and values take
 * vpdpbusd, 64 products an instruction against vdpbf16ps's 32, and half
 * the bytes of a BF16 row. The price is precision (each part of a row,
 * each query and each block's probabilities quantized to 8 bits), which
 * tests/unit/test_kv_q8.c states against a BF16 cache. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "coordinator/model/model_int.h"

size_t model_q8_row_bytes(int dk) { return ((size_t)dk + 8 + 15) & ~(size_t)15; }

float model_q8_levels_ref(const float *x, int n, int off, uint8_t *lv, int32_t *sum)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;
    int32_t s = 0;
    for (int i = 0; i < n; i++) {
        long v = lrintf(x[i] * inv);
        v = v > 127 ? 127 : v < -127 ? -127 : v;
        lv[i] = (uint8_t)(v + off);
        s += (int32_t)v;
    }
    *sum = s;
    return m / 127.0f;
}

/* x[0..n) to levels in [-127, 127] plus off (0: s8, 128: u8), scale
 * max|x| / 127; *sum: the levels' sum. */
static float quant_part(const float *x, int n, int off, uint8_t *lv, int32_t *sum)
{
    if (kcpu_isa() >= KCPU_ISA_AVX512)
        return model_q8_levels_avx512(x, n, off, lv, sum);
    return model_q8_levels_ref(x, n, off, lv, sum);
}

void model_q8_put(void *row, const float *x, int dc, int dk)
{
    uint8_t *r = row;
    float sc[2];
    int32_t sum;
    sc[0] = quant_part(x, dc, 128, r, &sum);
    sc[1] = quant_part(x + dc, dk - dc, 128, r + dc, &sum);
    memcpy(r + dk, sc, sizeof sc);
    memset(r + dk + 8, 0, model_q8_row_bytes(dk) - (size_t)dk - 8);
}

void model_q8_get(float *dst, const void *row, int d0, int n, int dc, int dk)
{
    const uint8_t *r = row;
    float sc[2];
    memcpy(sc, r + dk, sizeof sc);
    for (int d = d0; d < d0 + n; d++)
        dst[d - d0] = (float)((int)r[d] - 128) * sc[d >= dc];
}

/* Where the parts of a query block lie (model_q8_query). */
static int8_t *q_levels(void *QT) { return QT; }
static float *q_scales(void *QT, int nq, int dk)
{
    return (float *)((char *)QT + (size_t)((nq + 15) / 16) * 16 * (size_t)dk);
}
static int32_t *q_corr(void *QT, int nq, int dk)
{
    return (int32_t *)(q_scales(QT, nq, dk) + (size_t)((nq + 15) / 16) * 32);
}

size_t model_q8_query_bytes(int nq, int dk)
{
    const size_t ng = (size_t)(nq + 15) / 16;
    return ng * 16 * (size_t)dk + ng * 32 * (sizeof(float) + sizeof(int32_t));
}

void model_q8_query(void *QT, int nq, int j, int dc, int dk, const float *q)
{
    uint8_t lv[MODEL_Q8_MAXDK];
    int32_t sum[2];
    const int g = j / 16, i = j % 16;
    float *sq = q_scales(QT, nq, dk) + (size_t)g * 32;
    int32_t *corr = q_corr(QT, nq, dk) + (size_t)g * 32;
    sq[i] = quant_part(q, dc, 0, lv, &sum[0]);
    sq[16 + i] = quant_part(q + dc, dk - dc, 0, lv + dc, &sum[1]);
    corr[i] = 128 * sum[0];
    corr[16 + i] = 128 * sum[1];
    int8_t *qt = q_levels(QT) + (size_t)g * 16 * dk;
    for (int p = 0; p < dk / 4; p++) /* 4 levels a word */
        memcpy(qt + (size_t)p * 64 + i * 4, lv + 4 * p, 4);
}

void model_q8_query_parts(void *QT, int nq, int dk, const int8_t **qt, const float **sq,
                          const int32_t **corr)
{
    *qt = q_levels(QT);
    *sq = q_scales(QT, nq, dk);
    *corr = q_corr(QT, nq, dk);
}

void model_q8_scores_ref(const void *QT, int nq, int dc, int dk, const void *K, size_t ks, int nt,
                         float scale, float *S, int lds)
{
    const int8_t *qt;
    const float *sq;
    const int32_t *corr;
    model_q8_query_parts((void *)QT, nq, dk, &qt, &sq, &corr);
    for (int t = 0; t < nt; t++) {
        const uint8_t *k = (const uint8_t *)K + (size_t)t * ks;
        float sk[2];
        memcpy(sk, k + dk, sizeof sk);
        for (int j = 0; j < nq; j++) {
            const int g = j / 16, i = j % 16;
            const int8_t *q = qt + (size_t)g * 16 * dk;
            int32_t acc[2] = {0, 0};
            for (int d = 0; d < dk; d++)
                acc[d >= dc] += (int32_t)q[(size_t)(d / 4) * 64 + i * 4 + d % 4] * (int32_t)k[d];
            const float *s = sq + (size_t)g * 32;
            const int32_t *c = corr + (size_t)g * 32;
            const float part = (float)(acc[0] - c[i]) * (s[i] * sk[0]);
            S[(size_t)j * lds + t] = fmaf((float)(acc[1] - c[16 + i]), s[16 + i] * sk[1], part) *
                                     scale;
        }
    }
}

/* Key t of the runs (rn[r] rows at vr[r] each): its row. */
static const uint8_t *run_row(const void *const *vr, const int *rn, int nrun, size_t ks, int t)
{
    for (int r = 0; r < nrun; t -= rn[r], r++)
        if (t < rn[r])
            return (const uint8_t *)vr[r] + (size_t)t * ks;
    return NULL;
}

int model_q8_pv_levels(const float *P, int nq, int ldp, const void *const *vr, const int *rn,
                       int nrun, size_t ks, int dk, uint8_t *pu, float *sv, float *ps)
{
    int nt = 0;
    for (int r = 0; r < nrun; r++)
        nt += rn[r];
    const int nt4 = (nt + 3) & ~3;
    for (int t = 0; t < nt4; t++) {
        sv[t] = 0.0f;
        if (t < nt)
            memcpy(&sv[t], run_row(vr, rn, nrun, ks, t) + dk, sizeof(float));
    }
    for (int j = 0; j < nq; j++) {
        const float *p = P + (size_t)j * ldp;
        float mx = 0.0f;
        for (int t = 0; t < nt; t++)
            mx = fmaxf(mx, p[t] * sv[t]);
        ps[j] = mx / 255.0f;
        const float inv = mx > 0.0f ? 255.0f / mx : 0.0f;
        for (int t = 0; t < nt4; t++) {
            const long v = t < nt ? lrintf(p[t] * sv[t] * inv) : 0;
            pu[(size_t)j * nt4 + t] = (uint8_t)(v > 255 ? 255 : v < 0 ? 0 : v);
        }
    }
    return nt4;
}

void model_q8_pv_ref(const float *P, int nq, int ldp, const void *const *vr, const int *rn,
                     int nrun, size_t ks, int dc, int dk, float *O, int ldo, void *scratch)
{
    uint8_t *pu = scratch;
    float *sv = (float *)(pu + (size_t)(nq + 15) / 16 * 16 * (MODEL_SPLIT_KEYS + 4));
    float ps[MODEL_ATT_QMAX];
    const int nt4 = model_q8_pv_levels(P, nq, ldp, vr, rn, nrun, ks, dk, pu, sv, ps);
    int nt = 0;
    for (int r = 0; r < nrun; r++)
        nt += rn[r];
    for (int j = 0; j < nq; j++)
        for (int d = 0; d < dc; d++) {
            int32_t acc = 0;
            for (int t = 0; t < nt; t++)
                acc += (int32_t)pu[(size_t)j * nt4 + t] *
                       ((int32_t)run_row(vr, rn, nrun, ks, t)[d] - 128);
            O[(size_t)j * ldo + d] = (float)acc * ps[j];
        }
}

size_t model_q8_pv_scratch(int nq)
{
    return (size_t)(nq + 15) / 16 * 16 * (MODEL_SPLIT_KEYS + 4) +
           (MODEL_SPLIT_KEYS + 4) * sizeof(float) + 64;
}

bool model_cpu_q8(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        v = kcpu_isa() >= KCPU_ISA_AVX512 && __builtin_cpu_supports("avx512vnni") &&
            __builtin_cpu_supports("avx512vbmi");
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

void model_q8_scores(const void *QT, int nq, int dc, int dk, const void *K, size_t ks, int nt,
                     float scale, float *S, int lds, void *kbuf)
{
    if (model_cpu_q8()) {
        model_q8_scores_avx512(QT, nq, dc, dk, K, ks, nt, scale, S, lds, kbuf);
        return;
    }
    model_q8_scores_ref(QT, nq, dc, dk, K, ks, nt, scale, S, lds);
}

void model_q8_pv(const float *P, int nq, int ldp, const void *const *vr, const int *rn, int nrun,
                 size_t ks, int dc, int dk, float *O, int ldo, void *scratch)
{
    if (model_cpu_q8()) {
        model_q8_pv_avx512(P, nq, ldp, vr, rn, nrun, ks, dc, dk, O, ldo, scratch);
        return;
    }
    model_q8_pv_ref(P, nq, ldp, vr, rn, nrun, ks, dc, dk, O, ldo, scratch);
}

bool model_q8_shape_ok(int dc, int dk)
{
    return dc > 0 && dc % 16 == 0 && dk > dc && dk % 4 == 0 && dk <= MODEL_Q8_MAXDK;
}
