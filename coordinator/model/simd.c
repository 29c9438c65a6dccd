/* simd.c - the model's hot loops outside the matrix products (attention
 * scores, softmax, probabilities x values; and the absorption
 * product of deepseek2's packed W_kT, whose layout this file defines) in
 * plain C, and the choice between them and the AVX-512 versions
 * (simd_avx512.c) by the ISA in use. The plain versions define the results; the SIMD ones may differ
 * only by float summation order and a last-place exp rounding, except over
 * a BF16 cache, whose products the plain loops sum in vdpbf16ps's order
 * (model_kvt_t) so that attn_bf16_avx512.c's kernels equal them exactly. */
#include <cpuid.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coordinator/model/model_int.h"

static float elt(const void *p, size_t i, model_kvt_t kt)
{
    return kt == MODEL_KV_F16 ? ecs_fp16_to_f32(((const ecs_fp16_t *)p)[i]) : ((const float *)p)[i];
}

/* A BF16 value as vdpbf16ps reads it: subnormals as zero. */
static float bf16_daz(ecs_bf16_t h)
{
    return (h & 0x7F80u) ? ecs_bf16_to_f32(h) : ((h & 0x8000u) ? -0.0f : 0.0f);
}

/* s plus the products of the BF16 vectors a and b (n even) pair by pair,
 * as vdpbf16ps sums: the odd element's product first. */
static float dot_bf16(float s, const ecs_bf16_t *a, const ecs_bf16_t *b, int n)
{
    for (int i = 0; i < n; i += 2) {
        s = fmaf(bf16_daz(a[i + 1]), bf16_daz(b[i + 1]), s);
        s = fmaf(bf16_daz(a[i]), bf16_daz(b[i]), s);
    }
    return s;
}

static void scores_plain(const float *Q, int nq, int ldq, const void *K, size_t ks, model_kvt_t kt,
                         int dk, int dkp, const int *len, int nt, float scale, float *S, int lds,
                         float *kbuf)
{
    (void)dkp;
    for (int t = 0; t < nt; t++) {
        if (kt != MODEL_KV_BF16)
            for (int d = 0; d < dk; d++)
                kbuf[d] = elt(K, (size_t)t * ks + (size_t)d, kt);
        for (int j = 0; j < nq; j++) {
            if (t >= len[j])
                continue;
            const float *q = Q + (size_t)j * ldq;
            float s = 0.0f;
            if (kt == MODEL_KV_BF16)
                s = dot_bf16(s, (const ecs_bf16_t *)q, (const ecs_bf16_t *)K + (size_t)t * ks, dk);
            else
                for (int d = 0; d < dk; d++)
                    s += q[d] * kbuf[d];
            S[(size_t)j * lds + t] = s * scale;
        }
    }
}

/* A pair of values is one 4-byte word in QT: moved as one (one store
 * per line of the group, not two: the key split's queries are put by
 * several threads at once into the same lines, each store a transfer). */
void model_qt_bf16(float *QT, int j, int dk, const ecs_bf16_t *q)
{
    ecs_bf16_t *g = (ecs_bf16_t *)(QT + (size_t)(j / 16) * dk * 16) + (size_t)(j % 16) * 2;
    int d = 0;
    for (; d + 1 < dk; d += 2)
        memcpy(g + (size_t)(d / 2) * 32, q + d, 2 * sizeof *q);
    if (d < dk)
        g[(size_t)(d / 2) * 32] = q[d];
}

/* scores_plain's sums, the queries read from their transposed groups. */
static void scores_t_plain(const float *QT, int nq, const void *K, size_t ks, model_kvt_t kt,
                           int dk, int nt, float scale, float *S, int lds, float *kbuf)
{
    for (int t = 0; t < nt; t++) {
        if (kt != MODEL_KV_BF16)
            for (int d = 0; d < dk; d++)
                kbuf[d] = elt(K, (size_t)t * ks + (size_t)d, kt);
        for (int j = 0; j < nq; j++) {
            float s = 0.0f;
            if (kt == MODEL_KV_BF16) {
                const ecs_bf16_t *g = (const ecs_bf16_t *)(QT + (size_t)(j / 16) * dk * 16);
                const ecs_bf16_t *k = (const ecs_bf16_t *)K + (size_t)t * ks;
                for (int d = 0; d < dk; d += 2) {
                    const ecs_bf16_t *q = g + (size_t)(d / 2) * 32 + (size_t)(j % 16) * 2;
                    s = dot_bf16(s, q, k + d, 2);
                }
            } else {
                const float *q = QT + (size_t)(j / 16) * dk * 16 + j % 16;
                for (int d = 0; d < dk; d++)
                    s += q[(size_t)d * 16] * kbuf[d];
            }
            S[(size_t)j * lds + t] = s * scale;
        }
    }
}

/* ggml's soft_max: subtract the max, exponentiate, sum in double, scale. */
static void softmax_plain(float *S, int nq, int lds, const int *len, int nt, model_kvt_t kt,
                          float *mxo, float *sumo)
{
    for (int j = 0; j < nq; j++) {
        float *s = S + (size_t)j * lds;
        const int n = len[j];
        float mx = -INFINITY;
        for (int t = 0; t < n; t++)
            mx = s[t] > mx ? s[t] : mx;
        double sum = 0.0;
        for (int t = 0; t < n; t++) {
            s[t] = expf(s[t] - mx);
            sum += (double)s[t];
        }
        if (mxo)
            mxo[j] = mx, sumo[j] = (float)sum;
        const float inv = mxo ? 1.0f : n > 0 ? (float)(1.0 / sum) : 0.0f;
        for (int t = 0; t < n; t++) {
            s[t] *= inv;
            if (kt == MODEL_KV_F16)
                s[t] = ecs_fp16_to_f32(ecs_f32_to_fp16(s[t]));
            else if (kt == MODEL_KV_BF16)
                s[t] = ecs_bf16_to_f32(ecs_f32_to_bf16(s[t]));
        }
        for (int t = n; t < nt; t++)
            s[t] = 0.0f;
    }
}

static void pv_plain(const float *P, int nq, int ldp, const void *V, size_t vs, model_kvt_t kt,
                     int dv, const int *len, float *O, int ldo, bool acc)
{
    for (int j = 0; j < nq; j++) {
        float *o = O + (size_t)j * ldo;
        const float *p = P + (size_t)j * ldp;
        if (!acc)
            memset(o, 0, (size_t)dv * sizeof *o);
        if (kt != MODEL_KV_BF16) {
            for (int t = 0; t < len[j]; t++)
                for (int d = 0; d < dv; d++)
                    o[d] += p[t] * elt(V, (size_t)t * vs + (size_t)d, kt);
            continue;
        }
        const ecs_bf16_t *v = V;
        for (int t = 0; t < len[j]; t += 2) {
            const bool two = t + 1 < len[j];
            const ecs_bf16_t pp[2] = {ecs_f32_to_bf16(p[t]), two ? ecs_f32_to_bf16(p[t + 1]) : 0};
            for (int d = 0; d < dv; d++) {
                const ecs_bf16_t vv[2] = {v[(size_t)t * vs + d], two ? v[(size_t)(t + 1) * vs + d] : 0};
                o[d] = dot_bf16(o[d], pp, vv, 2);
            }
        }
    }
}

static void round_f16_plain(float *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = ecs_fp16_to_f32(ecs_f32_to_fp16(src[i]));
}

static void to_f16_plain(ecs_fp16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = ecs_f32_to_fp16(src[i]);
}

static void to_bf16_plain(ecs_bf16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = ecs_f32_to_bf16(src[i]);
}

/* Bytes of one block of a packed group: scales, then levels. */
#define Q8P_BLOCK (MODEL_Q8P_ROWS * (sizeof(ecs_fp16_t) + ECS_QK))

/* Where level i of the row in lane sits among a packed block's levels. */
static size_t q8p_at(int lane, int i)
{
    return (size_t)(i / 4) * 4 * MODEL_Q8P_ROWS + (size_t)lane * 4 + (size_t)(i % 4);
}

void model_q8p_put(void *w, int r, int nblk, const void *row)
{
    const ecs_block_q8_0 *src = row;
    const int lane = r % MODEL_Q8P_ROWS;
    uint8_t *g = (uint8_t *)w + (size_t)(r / MODEL_Q8P_ROWS) * nblk * Q8P_BLOCK;
    for (int b = 0; b < nblk; b++) {
        uint8_t *blk = g + (size_t)b * Q8P_BLOCK;
        memcpy(blk + (size_t)lane * sizeof(ecs_fp16_t), &src[b].d, sizeof(ecs_fp16_t));
        uint8_t *lv = blk + MODEL_Q8P_ROWS * sizeof(ecs_fp16_t);
        for (int i = 0; i < ECS_QK; i++)
            lv[q8p_at(lane, i)] = (uint8_t)(src[b].qs[i] + 128);
    }
}

static void dot_q8p_plain(const void *w, int nrows, int nblk, const void *a, size_t as, int na,
                          float *y, int64_t ldy)
{
    for (int j = 0; j < na; j++) {
        const ecs_block_q8_0 *ar = (const void *)((const uint8_t *)a + (size_t)j * as);
        for (int r = 0; r < nrows; r++) {
            const int lane = r % MODEL_Q8P_ROWS;
            const uint8_t *g = (const uint8_t *)w + (size_t)(r / MODEL_Q8P_ROWS) * nblk * Q8P_BLOCK;
            float acc = 0.0f;
            for (int b = 0; b < nblk; b++) {
                const uint8_t *blk = g + (size_t)b * Q8P_BLOCK;
                ecs_fp16_t dw;
                memcpy(&dw, blk + (size_t)lane * sizeof dw, sizeof dw);
                const uint8_t *lv = blk + MODEL_Q8P_ROWS * sizeof(ecs_fp16_t);
                int32_t isum = 0;
                for (int i = 0; i < ECS_QK; i++)
                    isum += (lv[q8p_at(lane, i)] - 128) * ar[b].qs[i];
                acc = fmaf((float)isum, ecs_fp16_to_f32(dw) * ecs_fp16_to_f32(ar[b].d), acc);
            }
            y[(int64_t)j * ldy + r] = acc;
        }
    }
}

static void wsum_plain(float *o, int n, const float *x, size_t xs, const float *w, int nb,
                       float scale)
{
    memset(o, 0, (size_t)n * sizeof *o);
    for (int b = 0; b < nb; b++)
        for (int d = 0; d < n; d++)
            o[d] += w[b] * x[(size_t)b * xs + d];
    for (int d = 0; d < n; d++)
        o[d] *= scale;
}

static const model_simd_t plain = {scores_plain,    scores_t_plain, softmax_plain,
                                   pv_plain,        round_f16_plain, to_f16_plain,
                                   to_bf16_plain,   dot_q8p_plain,  wsum_plain};

const model_simd_t *model_simd_plain(void) { return &plain; }

bool model_cpu_bf16(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        unsigned a = 0, b, c, d;
        /* leaf 7, sub-leaf 1: EAX bit 5 is AVX512_BF16 */
        v = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v && kcpu_isa() >= KCPU_ISA_AVX512;
}

/* Linux's request for the tile data state (arch/x86/include/uapi/asm/prctl.h,
 * 5.16+): without it the first tile instruction kills the process. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

bool model_cpu_amx(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d = 0;
        /* leaf 7, sub-leaf 0: EDX bit 22 AMX-BF16, bit 24 AMX-TILE */
        v = model_cpu_bf16() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) &&
            (d & (1u << 24)) && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

const model_simd_t *model_simd(void)
{
    const model_simd_t *s = kcpu_isa() >= KCPU_ISA_AVX512 ? model_simd_avx512() : NULL;
    return s ? s : &plain;
}
