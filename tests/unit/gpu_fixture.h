/* gpu_fixture.h - random experts and activations for the GPU backend's
 * tests (test_gpu.c, test_tier.c), and the comparison they share. A shard
 * is X experts of one (gate, up, down) type triple, quantized by the
 * reference quantizers from deterministic bell-shaped values. */
#ifndef ECS_TEST_GPU_FIXTURE_H
#define ECS_TEST_GPU_FIXTURE_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "kernels/gpu/gpu.h"

/* Relative tolerance of GPU results against kgpu_ffn_ref: the two sum the
 * same f32 products in different orders (lane-strided partial sums, FMA),
 * which moves a result of n terms by about sqrt(n) * 2^-24 of the sum of
 * their magnitudes; 1e-3 of the call's largest output leaves a wide margin
 * for n <= 2048 while any decoding error (a wrong bit, scale or offset)
 * changes outputs by far more. */
#define GPU_TOL 1e-3

static uint64_t fx_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* About [-1, 1], bell-shaped. */
static float fx_bell(uint64_t *s)
{
    const uint64_t r = fx_next(s);
    const int32_t sum = (int32_t)(r & 0xFFFF) + (int32_t)((r >> 16) & 0xFFFF) +
                        (int32_t)((r >> 32) & 0xFFFF) + (int32_t)(r >> 48) - 131070;
    return (float)sum * 0x1p-17f;
}

static void *fx_alloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    cr_assert(p, "out of memory (%zu bytes)", n);
    return p;
}

typedef struct {
    ecs_type_t tg, tu, td;
    int E, F, X;
    size_t bg, bu, bd; /* bytes of one expert's gate, up, down */
    uint8_t *gate, *up, *down; /* X experts back to back */
} fx_shard_t;

/* A matrix of rows x cols of type t from bell values scaled by 1/sqrt(cols)
 * (outputs of order one), with a few rows of larger and smaller scale. */
static void fx_matrix(ecs_type_t t, int rows, int cols, uint64_t seed, uint8_t *dst)
{
    float *v = fx_alloc(sizeof(float) * (size_t)cols);
    const size_t rb = ecs_row_size(t, cols);
    uint64_t s = seed;
    for (int r = 0; r < rows; r++) {
        const float sc = (r % 7 == 3 ? 8.0f : r % 11 == 5 ? 0.125f : 1.0f) / sqrtf((float)cols);
        for (int i = 0; i < cols; i++)
            v[i] = fx_bell(&s) * sc * 1.7f;
        ecs_quantize_row(t, v, dst + (size_t)r * rb, cols);
    }
    free(v);
}

static fx_shard_t fx_shard(ecs_type_t tg, ecs_type_t tu, ecs_type_t td, int E, int F, int X,
                           uint64_t seed)
{
    fx_shard_t s = {tg, tu, td, E, F, X, 0, 0, 0, NULL, NULL, NULL};
    s.bg = ecs_row_size(tg, E) * (size_t)F;
    s.bu = ecs_row_size(tu, E) * (size_t)F;
    s.bd = ecs_row_size(td, F) * (size_t)E;
    cr_assert(s.bg && s.bu && s.bd, "bad fixture shape %d x %d", E, F);
    s.gate = fx_alloc(s.bg * X);
    s.up = fx_alloc(s.bu * X);
    s.down = fx_alloc(s.bd * X);
    for (int e = 0; e < X; e++) {
        fx_matrix(tg, F, E, seed * 1000 + e * 3 + 0, s.gate + s.bg * e);
        fx_matrix(tu, F, E, seed * 1000 + e * 3 + 1, s.up + s.bu * e);
        fx_matrix(td, E, F, seed * 1000 + e * 3 + 2, s.down + s.bd * e);
    }
    return s;
}

static void fx_shard_free(fx_shard_t *s)
{
    free(s->gate);
    free(s->up);
    free(s->down);
}

__attribute__((unused)) static kgpu_seg_t fx_seg(const fx_shard_t *s, int e, int row0, int n)
{
    return (kgpu_seg_t){s->gate + s->bg * e, s->up + s->bu * e, s->down + s->bd * e, row0, n};
}

static float *fx_acts(int rows, int E, uint64_t seed)
{
    float *x = fx_alloc(sizeof(float) * (size_t)rows * E);
    uint64_t s = seed;
    for (size_t i = 0; i < (size_t)rows * E; i++)
        x[i] = fx_bell(&s) * 2.0f;
    return x;
}

/* max |a - b| / max |b| over n values (infinite if a has a NaN or inf). */
__attribute__((unused)) static double fx_rel_err(const float *a, const float *b, size_t n)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        m = fmax(m, fabs((double)b[i]));
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    }
    return m > 0 ? d / m : d;
}

#endif
