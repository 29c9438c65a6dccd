/* quant_float.c - IEEE half (fp16) and bfloat16 conversions, and the row
 * operations of the unquantized types F32, F16 and BF16.
 *
 * The conversions are exact bit manipulations (no reliance on compiler or
 * CPU half-precision support) so that every build rounds identically:
 * round to nearest, ties to even; subnormals are kept; NaN stays NaN (quiet,
 * sign and top payload bits kept), never turning into an infinity. */
#include <math.h>
#include <string.h>

#include "common/quant_impl.h"

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float ecs_fp16_to_f32(ecs_fp16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    if (exp == 0x1F) /* inf / NaN: widen the payload, quieting a NaN as F16C does */
        return bits_f32(sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0u));
    if (exp == 0) { /* zero / subnormal: mant * 2^-24, exact in float */
        const float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    /* normal: rebias the exponent from 15 to 127 */
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Shifts m right by s (1..31) rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t m, unsigned s)
{
    const uint32_t q = m >> s;
    const uint32_t rem = m & ((1u << s) - 1);
    const uint32_t half = 1u << (s - 1);
    return q + (rem > half || (rem == half && (q & 1)));
}

ecs_fp16_t ecs_f32_to_fp16(float f)
{
    const uint32_t x = f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7FFFFFFFu;

    if (ax > 0x7F800000u) /* NaN: force quiet so it cannot read as inf */
        return sign | 0x7E00u | (uint16_t)((ax >> 13) & 0x3FFu);
    if (ax >= 0x477FF000u) /* >= 65520, halfway past the largest half: inf */
        return sign | 0x7C00u;
    if (ax >= 0x38800000u) { /* >= 2^-14: a normal half */
        /* rebias in place; a mantissa carry correctly bumps the exponent */
        const uint32_t r = ax - (112u << 23);
        return sign | (uint16_t)shift_rne(r, 13);
    }
    if (ax <= 0x33000000u) /* <= 2^-25: rounds to (signed) zero, ties to even */
        return sign;
    /* subnormal half: the result is round(|f| * 2^24), at most 0x400 (which
     * is the smallest normal's encoding, so rounding up is still right) */
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    return sign | (uint16_t)shift_rne(m, 126 - e);
}

float ecs_bf16_to_f32(ecs_bf16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

ecs_bf16_t ecs_f32_to_bf16(float f)
{
    const uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: truncating could give inf */
        return (ecs_bf16_t)((x >> 16) | 0x40u);
    /* round the low 16 bits away, ties to even; overflow carries into inf */
    return (ecs_bf16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/* ---- F32 ---- */

static void f32_to_float(const void *src, float *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f32_from_float(const float *src, void *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

/* The float types accumulate in double, as ggml's vec_dot_f32/f16/bf16 do. */
static float f32_vec_dot(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(x[i] * y[i]);
    return (float)sum;
}

/* ---- F16 ---- */

static void f16_to_float(const void *src, float *dst, int64_t n)
{
    const ecs_fp16_t *x = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = ecs_fp16_to_f32(x[i]);
}

static void f16_from_float(const float *src, void *dst, int64_t n)
{
    ecs_fp16_t *y = dst;
    for (int64_t i = 0; i < n; i++)
        y[i] = ecs_f32_to_fp16(src[i]);
}

static float f16_vec_dot(int64_t n, const void *w, const void *a)
{
    const ecs_fp16_t *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(ecs_fp16_to_f32(x[i]) * ecs_fp16_to_f32(y[i]));
    return (float)sum;
}

/* ---- BF16 ---- */

static void bf16_to_float(const void *src, float *dst, int64_t n)
{
    const ecs_bf16_t *x = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = ecs_bf16_to_f32(x[i]);
}

static void bf16_from_float(const float *src, void *dst, int64_t n)
{
    ecs_bf16_t *y = dst;
    for (int64_t i = 0; i < n; i++)
        y[i] = ecs_f32_to_bf16(src[i]);
}

static float bf16_vec_dot(int64_t n, const void *w, const void *a)
{
    const ecs_bf16_t *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(ecs_bf16_to_f32(x[i]) * ecs_bf16_to_f32(y[i]));
    return (float)sum;
}

const quant_ops_t quant_ops_f32 = {f32_to_float, f32_from_float, f32_vec_dot};
const quant_ops_t quant_ops_f16 = {f16_to_float, f16_from_float, f16_vec_dot};
const quant_ops_t quant_ops_bf16 = {bf16_to_float, bf16_from_float, bf16_vec_dot};
