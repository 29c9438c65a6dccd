/* quant_legacy.c - the 32-element block quants Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
 * and Q8_1: reference quantizers (ggml's quantize_row_*_ref arithmetic, so
 * the blocks match what llama.cpp writes), dequantization and the scalar
 * dot products with Q8_0 / Q8_1 activations.
 *
 * Every weight block is first unpacked into integer levels q[j], a scale d
 * and (for the *_1 types) an offset m, value = d*q[j] + m. Dequantization and
 * the dot products both work from that one description of the layout, so
 * they cannot disagree about bit positions. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "common/quant_impl.h"

#define QK ECS_QK

typedef struct {
    float d, m;
    bool has_min; /* the *_1 types: value = d*q + m */
    int8_t q[QK];
} legacy_block_t;

/* C's float-to-int truncation, but defined for every input (NaN gives lo):
 * ggml converts with (int8_t)/(uint8_t) casts that only ever see in-range
 * values for finite data. */
static int trunc_clamp(float v, int lo, int hi)
{
    if (!(v > (float)lo))
        return lo;
    if (v >= (float)hi)
        return hi;
    return (int)v;
}

/* roundf (half away from zero), clamped and NaN-safe. */
static int round_clamp(float v, int lo, int hi)
{
    if (v != v)
        return 0;
    return trunc_clamp(roundf(v), lo, hi);
}

/* ---- packing of 4-bit and 5-bit levels ---- */

/* Low nibbles hold elements 0..15, high nibbles 16..31. */
static void pack_nibbles(const uint8_t *L, uint8_t qs[QK / 2])
{
    for (int j = 0; j < QK / 2; j++)
        qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + QK / 2] & 0x0F) << 4));
}

static void unpack_nibbles(const uint8_t qs[QK / 2], int8_t *q)
{
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (int8_t)(qs[j] & 0x0F);
        q[j + QK / 2] = (int8_t)(qs[j] >> 4);
    }
}

/* Bit e of the little-endian 32-bit qh is the fifth bit of element e. */
static void pack_high_bits(const uint8_t *L, uint8_t qh[4])
{
    memset(qh, 0, 4);
    for (int e = 0; e < QK; e++)
        qh[e / 8] |= (uint8_t)(((L[e] >> 4) & 1) << (e % 8));
}

static void add_high_bits(const uint8_t qh[4], int8_t *q)
{
    for (int e = 0; e < QK; e++)
        q[e] = (int8_t)(q[e] + 16 * ((qh[e / 8] >> (e % 8)) & 1));
}

/* ---- shared quantizer arithmetic ---- */

/* Q4_0/Q5_0: the element of largest magnitude maps to level 0 exactly
 * (d = max / -half keeps its sign); levels are q + half in [0, 2*half). */
static float quantize_symmetric(const float *x, int half, uint8_t *L)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    const float d = max / (float)-half;
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK; j++)
        L[j] = (uint8_t)trunc_clamp(x[j] * id + ((float)half + 0.5f), 0, 2 * half - 1);
    return d;
}

/* Q4_1/Q5_1: levels 0..nmax spread from min to max. */
static void quantize_affine(const float *x, int nmax, uint8_t *L, float *d_out, float *min_out)
{
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK; j++) {
        if (x[j] < min)
            min = x[j];
        if (x[j] > max)
            max = x[j];
    }
    const float d = (max - min) / (float)nmax;
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK; j++)
        L[j] = (uint8_t)trunc_clamp((x[j] - min) * id + 0.5f, 0, nmax);
    *d_out = d;
    *min_out = min;
}

/* Q8_0/Q8_1: symmetric round to nearest over [-127, 127]. */
static float quantize_q8(const float *x, int8_t *qs)
{
    float amax = 0.0f;
    for (int j = 0; j < QK; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK; j++)
        qs[j] = (int8_t)round_clamp(x[j] * id, -128, 127);
    return d;
}

/* ---- per type: quantize one block, unpack one block ---- */

static void q4_0_quantize(const float *x, void *blk)
{
    ecs_block_q4_0 *y = blk;
    uint8_t L[QK];
    y->d = ecs_f32_to_fp16(quantize_symmetric(x, 8, L));
    pack_nibbles(L, y->qs);
}

static void q4_0_unpack(const void *blk, legacy_block_t *u)
{
    const ecs_block_q4_0 *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->m = 0.0f;
    u->has_min = false;
    unpack_nibbles(b->qs, u->q);
    for (int j = 0; j < QK; j++)
        u->q[j] = (int8_t)(u->q[j] - 8);
}

static void q4_1_quantize(const float *x, void *blk)
{
    ecs_block_q4_1 *y = blk;
    uint8_t L[QK];
    float d, min;
    quantize_affine(x, 15, L, &d, &min);
    y->d = ecs_f32_to_fp16(d);
    y->m = ecs_f32_to_fp16(min);
    pack_nibbles(L, y->qs);
}

static void q4_1_unpack(const void *blk, legacy_block_t *u)
{
    const ecs_block_q4_1 *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->m = ecs_fp16_to_f32(b->m);
    u->has_min = true;
    unpack_nibbles(b->qs, u->q);
}

static void q5_0_quantize(const float *x, void *blk)
{
    ecs_block_q5_0 *y = blk;
    uint8_t L[QK];
    y->d = ecs_f32_to_fp16(quantize_symmetric(x, 16, L));
    pack_nibbles(L, y->qs);
    pack_high_bits(L, y->qh);
}

static void q5_0_unpack(const void *blk, legacy_block_t *u)
{
    const ecs_block_q5_0 *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->m = 0.0f;
    u->has_min = false;
    unpack_nibbles(b->qs, u->q);
    add_high_bits(b->qh, u->q);
    for (int j = 0; j < QK; j++)
        u->q[j] = (int8_t)(u->q[j] - 16);
}

static void q5_1_quantize(const float *x, void *blk)
{
    ecs_block_q5_1 *y = blk;
    uint8_t L[QK];
    float d, min;
    quantize_affine(x, 31, L, &d, &min);
    y->d = ecs_f32_to_fp16(d);
    y->m = ecs_f32_to_fp16(min);
    pack_nibbles(L, y->qs);
    pack_high_bits(L, y->qh);
}

static void q5_1_unpack(const void *blk, legacy_block_t *u)
{
    const ecs_block_q5_1 *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->m = ecs_fp16_to_f32(b->m);
    u->has_min = true;
    unpack_nibbles(b->qs, u->q);
    add_high_bits(b->qh, u->q);
}

static void q8_0_quantize(const float *x, void *blk)
{
    ecs_block_q8_0 *y = blk;
    y->d = ecs_f32_to_fp16(quantize_q8(x, y->qs));
}

static void q8_0_unpack(const void *blk, legacy_block_t *u)
{
    const ecs_block_q8_0 *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->m = 0.0f;
    u->has_min = false;
    memcpy(u->q, b->qs, QK);
}

/* s = d*sum(qs) lets a *_1 weight add its offset m without touching qs;
 * ggml forms it from the unrounded d. */
static void q8_1_quantize(const float *x, void *blk)
{
    ecs_block_q8_1 *y = blk;
    const float d = quantize_q8(x, y->qs);
    int sum = 0;
    for (int j = 0; j < QK; j++)
        sum += y->qs[j];
    y->d = ecs_f32_to_fp16(d);
    y->s = ecs_f32_to_fp16((float)sum * d);
}

static void q8_1_unpack(const void *blk, legacy_block_t *u)
{
    const ecs_block_q8_1 *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->m = 0.0f;
    u->has_min = false;
    memcpy(u->q, b->qs, QK);
}

/* ---- generic row loops ---- */

typedef struct {
    size_t size; /* bytes per block */
    void (*quantize)(const float *x, void *blk);
    void (*unpack)(const void *blk, legacy_block_t *u);
    bool act_q8_1; /* activation type: Q8_1 (else Q8_0) */
} legacy_type_t;

static void legacy_to_float(const legacy_type_t *t, const void *src, float *dst, int64_t nb)
{
    const uint8_t *p = src;
    legacy_block_t u;
    for (int64_t i = 0; i < nb; i++, p += t->size, dst += QK) {
        t->unpack(p, &u);
        if (u.has_min) {
            for (int j = 0; j < QK; j++)
                dst[j] = (float)u.q[j] * u.d + u.m;
        } else {
            for (int j = 0; j < QK; j++)
                dst[j] = (float)u.q[j] * u.d;
        }
    }
}

static void legacy_from_float(const legacy_type_t *t, const float *src, void *dst, int64_t nb)
{
    uint8_t *p = dst;
    for (int64_t i = 0; i < nb; i++, p += t->size, src += QK)
        t->quantize(src, p);
}

/* Integer dot product per block, scaled once by d_w*d_a; a *_1 weight adds
 * m_w*s_a. (ggml's generic code does the same sums; the order of the final
 * float multiply varies slightly between its types, we use (d_w*d_a)*sumi
 * throughout, as its SIMD kernels do.) */
static float legacy_vec_dot(const legacy_type_t *t, int64_t nb, const void *w, const void *a)
{
    const uint8_t *pw = w;
    float sum = 0.0f;
    legacy_block_t u;
    for (int64_t i = 0; i < nb; i++, pw += t->size) {
        t->unpack(pw, &u);
        const int8_t *aq;
        float da, sa = 0.0f;
        if (t->act_q8_1) {
            const ecs_block_q8_1 *b = (const ecs_block_q8_1 *)a + i;
            aq = b->qs;
            da = ecs_fp16_to_f32(b->d);
            sa = ecs_fp16_to_f32(b->s);
        } else {
            const ecs_block_q8_0 *b = (const ecs_block_q8_0 *)a + i;
            aq = b->qs;
            da = ecs_fp16_to_f32(b->d);
        }
        int32_t sumi = 0;
        for (int j = 0; j < QK; j++)
            sumi += (int32_t)u.q[j] * aq[j];
        sum += (u.d * da) * (float)sumi;
        if (u.has_min)
            sum += u.m * sa;
    }
    return sum;
}

#define LEGACY_OPS(name, block, act_is_q8_1)                                                  \
    static const legacy_type_t name##_type = {sizeof(block), name##_quantize, name##_unpack,  \
                                              act_is_q8_1};                                   \
    static void name##_to_float(const void *src, float *dst, int64_t nb)                      \
    {                                                                                         \
        legacy_to_float(&name##_type, src, dst, nb);                                          \
    }                                                                                         \
    static void name##_from_float(const float *src, void *dst, int64_t nb)                    \
    {                                                                                         \
        legacy_from_float(&name##_type, src, dst, nb);                                        \
    }                                                                                         \
    static float name##_vec_dot(int64_t nb, const void *w, const void *a)                     \
    {                                                                                         \
        return legacy_vec_dot(&name##_type, nb, w, a);                                        \
    }                                                                                         \
    const quant_ops_t quant_ops_##name = {name##_to_float, name##_from_float, name##_vec_dot};

LEGACY_OPS(q4_0, ecs_block_q4_0, false)
LEGACY_OPS(q4_1, ecs_block_q4_1, true)
LEGACY_OPS(q5_0, ecs_block_q5_0, false)
LEGACY_OPS(q5_1, ecs_block_q5_1, true)
LEGACY_OPS(q8_0, ecs_block_q8_0, false)
LEGACY_OPS(q8_1, ecs_block_q8_1, true)
