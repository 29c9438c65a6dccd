/* deq.h - what one lane of the CUDA kernels computes: one weight element at
 * a time from the GGUF block layouts, and a lane's share of a pass over a
 * weight row. Shared by the kernels (compiled as device code by nvcc) and
 * the host: the unit tests check every decoder against common/quant.h's
 * reference dequantization, bit for bit, and run the lane passes of a whole
 * grouped call against the CPU reference, so the GPU computes what the CPU
 * checked without a GPU to test on.
 *
 * Each decoder reads only bytes (blocks are 2-byte aligned at best) and
 * computes the value with the operations, in the order, of common/quant.c:
 * k-quants (d * sc) * q - dmin * mn, legacy quants q * d. Products go
 * through kgpu_mul, which on the device is __fmul_rn: nvcc would otherwise
 * contract a product and a difference into one FMA and round differently.
 * Private to kernels/gpu and kernels/cuda. */
#ifndef ECS_KGPU_DEQ_H
#define ECS_KGPU_DEQ_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/quant.h"

#ifdef __CUDACC__
#define KGPU_HD __host__ __device__ __forceinline__
#else
#define KGPU_HD static inline
#endif
#ifdef __CUDA_ARCH__ /* device code: the host compiler does not know the pragma */
#define KGPU_UNROLL _Pragma("unroll")
#else
#define KGPU_UNROLL
#endif

KGPU_HD float kgpu_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
#define KGPU_MUL(a, b) kgpu_mul((a), (b))

KGPU_HD float kgpu_u2f(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

KGPU_HD uint16_t kgpu_ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* IEEE half to float, exact (subnormals as m * 2^-24). */
KGPU_HD float kgpu_h2f(uint16_t h)
{
    const uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float v = (float)m * (1.0f / 16777216.0f);
        return s ? -v : v;
    }
    if (e == 31)
        return kgpu_u2f(s | 0x7f800000u | (m << 13));
    return kgpu_u2f(s | ((e + 112u) << 23) | (m << 13));
}

/* Q4_K / Q5_K: scale and min j (0..7) of the 12 packed bytes. */
KGPU_HD void kgpu_scale_min_k4(const uint8_t *q, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Bytes of a row of n elements of t (a kernel type; n a whole number of
 * blocks, checked by kgpu_ffn_check), 0 for other types. */
KGPU_HD int64_t kgpu_row_bytes(ecs_type_t t, int64_t n)
{
    switch (t) {
    case ECS_TYPE_F16:
    case ECS_TYPE_BF16:
        return 2 * n;
    case ECS_TYPE_Q8_0:
        return n / 32 * 34;
    case ECS_TYPE_Q5_0:
        return n / 32 * 22;
    case ECS_TYPE_Q4_K:
        return n / 256 * 144;
    case ECS_TYPE_Q5_K:
        return n / 256 * 176;
    case ECS_TYPE_Q6_K:
        return n / 256 * 210;
    default:
        return 0;
    }
}

/* Element i of a row (a whole number of blocks of type t). */
KGPU_HD float kgpu_deq(ecs_type_t t, const uint8_t *row, int64_t i)
{
    switch (t) {
    case ECS_TYPE_F16:
        return kgpu_h2f(kgpu_ld16(row + 2 * i));
    case ECS_TYPE_BF16:
        return kgpu_u2f((uint32_t)kgpu_ld16(row + 2 * i) << 16);
    case ECS_TYPE_Q8_0: { /* d, qs[32] */
        const uint8_t *b = row + (i / 32) * 34;
        return KGPU_MUL((float)(int8_t)b[2 + i % 32], kgpu_h2f(kgpu_ld16(b)));
    }
    case ECS_TYPE_Q5_0: { /* d, qh[4], qs[16]: low nibbles elements 0..15, high 16..31 */
        const uint8_t *b = row + (i / 32) * 22;
        const int j = (int)(i % 32);
        const int lo = j < 16 ? b[6 + j] & 0xF : b[6 + j - 16] >> 4;
        const int hi = (b[2 + j / 8] >> (j % 8)) & 1;
        return KGPU_MUL((float)((lo | (hi << 4)) - 16), kgpu_h2f(kgpu_ld16(b)));
    }
    case ECS_TYPE_Q4_K:
    case ECS_TYPE_Q5_K: { /* d, dmin, scales[12], (qh[32],) qs[128] */
        const int q5 = t == ECS_TYPE_Q5_K;
        const uint8_t *b = row + (i / 256) * (q5 ? 176 : 144);
        const int e = (int)(i % 256), r = e % 64, sub = e / 32;
        const uint8_t *qs = b + (q5 ? 48 : 16);
        const uint8_t qb = qs[(e / 64) * 32 + r % 32];
        int q = r < 32 ? qb & 0xF : qb >> 4;
        if (q5)
            q += 16 * ((b[16 + e % 32] >> (e / 32)) & 1);
        int sc, mn;
        kgpu_scale_min_k4(b + 4, sub, &sc, &mn);
        const float v = KGPU_MUL(KGPU_MUL(kgpu_h2f(kgpu_ld16(b)), (float)sc), (float)q);
        return v - KGPU_MUL(kgpu_h2f(kgpu_ld16(b + 2)), (float)mn);
    }
    case ECS_TYPE_Q6_K: { /* ql[128], qh[64], scales[16] (int8), d */
        const uint8_t *b = row + (i / 256) * 210;
        const int e = (int)(i % 256), half = e / 128, r = e % 128, k = r / 32, l = r % 32;
        const uint8_t qlb = b[half * 64 + (k & 1) * 32 + l];
        const int lo = k < 2 ? qlb & 0xF : qlb >> 4;
        const int hi = (b[128 + half * 32 + l] >> (2 * k)) & 3;
        const int sc = (int8_t)b[192 + e / 16];
        return KGPU_MUL(KGPU_MUL(kgpu_h2f(kgpu_ld16(b + 208)), (float)sc),
                        (float)((lo | (hi << 4)) - 32));
    }
    default:
        return 0.0f; /* unsupported types are refused before any kernel runs */
    }
}

/* Activation rows per pass over a weight row (2 x this accumulators per lane). */
#define KGPU_PASS_ROWS 8

/* One lane's share of one pass of a warp over weight row wa (and, for gate
 * and up, wb): elements i = lane, lane + 32, ... of n_in against nr <=
 * KGPU_PASS_ROWS activation rows x (row stride n_in), so a warp reads
 * consecutive bytes. The warp then sums its 32 lanes' acc_a (acc_b) with a
 * butterfly of shuffles. */
KGPU_HD void kgpu_lane_pass(ecs_type_t ta, const uint8_t *wa, ecs_type_t tb, const uint8_t *wb,
                            int glu, int n_in, const float *x, int nr, int lane, float *acc_a,
                            float *acc_b)
{
    KGPU_UNROLL
    for (int r = 0; r < KGPU_PASS_ROWS; r++)
        acc_a[r] = acc_b[r] = 0.0f;
    for (int i = lane; i < n_in; i += 32) {
        const float a = kgpu_deq(ta, wa, i);
        const float b = glu ? kgpu_deq(tb, wb, i) : 0.0f;
        KGPU_UNROLL
        for (int r = 0; r < KGPU_PASS_ROWS; r++) {
            if (r < nr) {
                const float v = x[(size_t)r * n_in + i];
                acc_a[r] += a * v;
                if (glu)
                    acc_b[r] += b * v;
            }
        }
    }
}

KGPU_HD float kgpu_swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

#endif
