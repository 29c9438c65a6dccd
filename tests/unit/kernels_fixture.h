/* kernels_fixture.h - what the test_kernels_*.c files share: the weight
 * types, a seeded generator, the scalar references of common/quant.h as
 * kernels, the float tolerance of a reordered sum, and the exact-sum data:
 * random weight bits with scales chosen so every float step is exact, so
 * that SIMD and reference products must be equal (the integer sums are). */
#ifndef ECS_TEST_KERNELS_FIXTURE_H
#define ECS_TEST_KERNELS_FIXTURE_H

/* each test file uses some of these */
#define FX static __attribute__((unused))

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

FX const ecs_type_t WTYPES[] = {
    ECS_TYPE_F32,  ECS_TYPE_F16,  ECS_TYPE_BF16, ECS_TYPE_Q4_0, ECS_TYPE_Q4_1,
    ECS_TYPE_Q5_0, ECS_TYPE_Q5_1, ECS_TYPE_Q8_0, ECS_TYPE_Q2_K, ECS_TYPE_Q3_K,
    ECS_TYPE_Q4_K, ECS_TYPE_Q5_K, ECS_TYPE_Q6_K,
};
#define NWTYPES (sizeof(WTYPES) / sizeof(WTYPES[0]))

/* ---- helpers ---- */

typedef struct {
    uint64_t s;
} rng_t;

FX uint64_t rng_u64(rng_t *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

FX float rng_unif(rng_t *r) /* [-1, 1) */
{
    return (float)((double)(rng_u64(r) >> 11) * 0x1.0p-52 - 1.0);
}

FX int rng_int(rng_t *r, int lo, int hi) /* inclusive */
{
    return lo + (int)(rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* roughly normal, with occasional outliers as real activations have */
FX float rng_act(rng_t *r)
{
    float v = (rng_unif(r) + rng_unif(r) + rng_unif(r)) * 0.6f;
    if (rng_u64(r) % 97 == 0)
        v *= 12.0f;
    return v;
}

FX void *xalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    cr_assert_not_null(p);
    return p;
}

FX const ecs_type_traits_t *traits(ecs_type_t t)
{
    const ecs_type_traits_t *tr = ecs_type_traits(t);
    cr_assert_not_null(tr, "type %d", (int)t);
    return tr;
}

FX ecs_type_t vdt_of(ecs_type_t t)
{
    return traits(t)->vec_dot_type;
}

/* Lengths to test: odd multiples of the block size (float types: odd
 * lengths that leave vector tails). */
FX int test_lengths(ecs_type_t t, int64_t *out)
{
    static const int64_t f[] = {1, 3, 8, 15, 17, 33, 255, 1001};
    static const int64_t l[] = {1, 3, 5, 9, 31, 127};
    static const int64_t k[] = {1, 3, 5, 13};
    const int64_t blk = traits(t)->blck_size;
    const int64_t *src = blk == 1 ? f : blk == ECS_QK ? l : k;
    const int cnt = blk == 1 ? 8 : blk == ECS_QK ? 6 : 4;
    for (int i = 0; i < cnt; i++)
        out[i] = src[i] * (blk == 1 ? 1 : blk);
    return cnt;
}

FX kcpu_isa_t best_isa(void)
{
    return kcpu_isa_detect();
}

FX void quantize_floats(ecs_type_t t, const float *x, void *dst, int64_t n)
{
    ecs_quantize_row(t, x, dst, n);
}

FX void random_floats(rng_t *r, float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_act(r) * scale;
}

/* The scale of the rounding error a reordered float accumulation may make:
 * the magnitude of the terms the kernels add up. Per element that is
 * |w_i * a_i| plus, for the types with mins, |min * a_i| twice (the scaled
 * levels and the min term are accumulated separately and cancel); a block's
 * largest |w| bounds its min for data made by the reference quantizers. */
FX double magnitude(ecs_type_t t, const void *w, const void *a, int64_t n)
{
    const int64_t blk = traits(t)->blck_size;
    float *fw = xalloc((size_t)n * sizeof(float)), *fa = xalloc((size_t)n * sizeof(float));
    ecs_dequantize_row(t, w, fw, n);
    ecs_dequantize_row(vdt_of(t), a, fa, n);
    double m = 0;
    for (int64_t b = 0; b < n; b += blk) {
        double wmax = 0;
        for (int64_t i = b; i < b + blk; i++)
            wmax = fmax(wmax, fabs((double)fw[i]));
        for (int64_t i = b; i < b + blk; i++)
            m += fabs((double)fa[i]) * (fabs((double)fw[i]) + (blk > 1 ? 2 * wmax : 0));
    }
    free(fw);
    free(fa);
    return m;
}

FX bool close_to_ref(ecs_type_t t, float got, float ref, const void *w, const void *a,
                     int64_t n, double *rel)
{
    *rel = 0;
    if (got == ref)
        return true;
    *rel = fabs((double)got - (double)ref) / (magnitude(t, w, a, n) + 1e-30);
    return *rel <= 1e-6;
}

FX kcpu_kernel_t kernel_at(ecs_type_t t, kcpu_isa_t isa)
{
    if (isa == KCPU_ISA_AVX512)
        return kcpu_kernel_avx512(t);
    if (isa == KCPU_ISA_AVX2)
        return kcpu_kernel_avx2(t);
    return (kcpu_kernel_t){kcpu_vec_dot_for(t, KCPU_ISA_SCALAR), NULL, NULL};
}

/* ---- exact integer sums ---- */

/* Largest |integer contribution| of one weight element (level x sub-block
 * scale, plus the min term), so that the test can keep every sum below 2^24
 * where float arithmetic on integers is exact. */
FX int64_t level_bound(ecs_type_t t)
{
    switch (t) {
    case ECS_TYPE_Q4_0: return 8;
    case ECS_TYPE_Q4_1: return 16;
    case ECS_TYPE_Q5_0: return 16;
    case ECS_TYPE_Q5_1: return 32;
    case ECS_TYPE_Q8_0: return 128;
    case ECS_TYPE_Q2_K: return 3 * 15 + 15;
    case ECS_TYPE_Q3_K: return 4 * 32;
    case ECS_TYPE_Q4_K: return 15 * 63 + 63;
    case ECS_TYPE_Q5_K: return 31 * 63 + 63;
    case ECS_TYPE_Q6_K: return 32 * 128;
    default: return 8; /* float types: small integers */
    }
}

/* Offsets of the fp16 scale fields (d, dmin / m) in a block of t. */
FX int scale_fields(ecs_type_t t, size_t off[2])
{
    switch (t) {
    case ECS_TYPE_Q4_0: off[0] = offsetof(ecs_block_q4_0, d); return 1;
    case ECS_TYPE_Q4_1:
        off[0] = offsetof(ecs_block_q4_1, d), off[1] = offsetof(ecs_block_q4_1, m);
        return 2;
    case ECS_TYPE_Q5_0: off[0] = offsetof(ecs_block_q5_0, d); return 1;
    case ECS_TYPE_Q5_1:
        off[0] = offsetof(ecs_block_q5_1, d), off[1] = offsetof(ecs_block_q5_1, m);
        return 2;
    case ECS_TYPE_Q8_0: off[0] = offsetof(ecs_block_q8_0, d); return 1;
    case ECS_TYPE_Q2_K:
        off[0] = offsetof(ecs_block_q2_K, d), off[1] = offsetof(ecs_block_q2_K, dmin);
        return 2;
    case ECS_TYPE_Q3_K: off[0] = offsetof(ecs_block_q3_K, d); return 1;
    case ECS_TYPE_Q4_K:
        off[0] = offsetof(ecs_block_q4_K, d), off[1] = offsetof(ecs_block_q4_K, dmin);
        return 2;
    case ECS_TYPE_Q5_K:
        off[0] = offsetof(ecs_block_q5_K, d), off[1] = offsetof(ecs_block_q5_K, dmin);
        return 2;
    case ECS_TYPE_Q6_K: off[0] = offsetof(ecs_block_q6_K, d); return 1;
    default: return 0;
    }
}

/* Weight row: random bits, fp16 scales 1 or 2 (float types: small ints). */
FX void exact_weights(rng_t *r, ecs_type_t t, void *w, int64_t n)
{
    const ecs_type_traits_t *tr = traits(t);
    if (tr->blck_size == 1) {
        float *x = xalloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)rng_int(r, -8, 8);
        quantize_floats(t, x, w, n);
        free(x);
        return;
    }
    const size_t bytes = ecs_row_size(t, n);
    uint8_t *p = w;
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)rng_u64(r);
    size_t off[2];
    const int nf = scale_fields(t, off);
    for (int64_t b = 0; b < n / tr->blck_size; b++)
        for (int f = 0; f < nf; f++) {
            const ecs_fp16_t h = ecs_f32_to_fp16(rng_u64(r) & 1 ? 2.0f : 1.0f);
            memcpy(p + (size_t)b * tr->type_size + off[f], &h, sizeof(h));
        }
}

/* Activation row of vdt with scale 1 and levels in [-amp, amp]. */
FX void exact_act(rng_t *r, ecs_type_t vdt, void *a, int64_t n, int amp)
{
    if (vdt == ECS_TYPE_F32 || vdt == ECS_TYPE_F16 || vdt == ECS_TYPE_BF16) {
        float *x = xalloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)rng_int(r, -8, 8);
        quantize_floats(vdt, x, a, n);
        free(x);
        return;
    }
    if (vdt == ECS_TYPE_Q8_K) {
        ecs_block_q8_K *b = a;
        for (int64_t i = 0; i < n / ECS_QK_K; i++) {
            b[i].d = 1.0f;
            for (int g = 0; g < ECS_QK_K / 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++)
                    s += b[i].qs[16 * g + j] = (int8_t)rng_int(r, -amp, amp);
                b[i].bsums[g] = (int16_t)s;
            }
        }
        return;
    }
    for (int64_t i = 0; i < n / ECS_QK; i++) {
        int8_t *qs = vdt == ECS_TYPE_Q8_0 ? ((ecs_block_q8_0 *)a)[i].qs : ((ecs_block_q8_1 *)a)[i].qs;
        int s = 0;
        for (int j = 0; j < ECS_QK; j++)
            s += qs[j] = (int8_t)rng_int(r, -amp, amp);
        if (vdt == ECS_TYPE_Q8_0) {
            ((ecs_block_q8_0 *)a)[i].d = ecs_f32_to_fp16(1.0f);
        } else {
            ((ecs_block_q8_1 *)a)[i].d = ecs_f32_to_fp16(1.0f);
            ((ecs_block_q8_1 *)a)[i].s = ecs_f32_to_fp16((float)s); /* |s| <= 2048: exact */
        }
    }
}

#endif /* ECS_TEST_KERNELS_FIXTURE_H */
