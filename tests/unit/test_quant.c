/* test_quant.c - the element types of common/quant.h: the type table, the
 * fp16/bf16 conversions, dequantization of real llama.cpp blocks against an
 * independent (gguf-py numpy) dequantization, bit-exactness of the reference
 * quantizers against digests of ggml's quantize_row_*_ref output, round-trip
 * error bounds, and the scalar dot products against float dots. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/quant.h"

#define SAMPLES "../shared/reference/quant-samples.gguf"

/* Every type a model may store weights in, and every valid type. */
static const ecs_type_t weight_types[] = {
    ECS_TYPE_F32,  ECS_TYPE_F16,  ECS_TYPE_BF16, ECS_TYPE_Q4_0, ECS_TYPE_Q4_1,
    ECS_TYPE_Q5_0, ECS_TYPE_Q5_1, ECS_TYPE_Q8_0, ECS_TYPE_Q2_K, ECS_TYPE_Q3_K,
    ECS_TYPE_Q4_K, ECS_TYPE_Q5_K, ECS_TYPE_Q6_K,
};
#define N_WEIGHT_TYPES (sizeof weight_types / sizeof weight_types[0])

static const ecs_type_t all_types[] = {
    ECS_TYPE_F32,  ECS_TYPE_F16,  ECS_TYPE_BF16, ECS_TYPE_Q4_0, ECS_TYPE_Q4_1,
    ECS_TYPE_Q5_0, ECS_TYPE_Q5_1, ECS_TYPE_Q8_0, ECS_TYPE_Q8_1, ECS_TYPE_Q2_K,
    ECS_TYPE_Q3_K, ECS_TYPE_Q4_K, ECS_TYPE_Q5_K, ECS_TYPE_Q6_K, ECS_TYPE_Q8_K,
};
#define N_ALL_TYPES (sizeof all_types / sizeof all_types[0])

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- deterministic inputs ----
 * Only integer arithmetic and exact float scaling, so the same values come
 * out on every libm: the quantizer digests below depend on that. */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Bell-shaped in about [-1, 1]: a sum of four 16-bit uniforms, exact. */
static float rng_bell(uint64_t *s)
{
    const uint64_t r = rng_next(s);
    const int32_t sum = (int32_t)(r & 0xFFFF) + (int32_t)((r >> 16) & 0xFFFF) +
                        (int32_t)((r >> 32) & 0xFFFF) + (int32_t)(r >> 48) - 131070;
    return (float)sum * 0x1p-17f;
}

/* Each 256-element super-block gets a different shape, so that every code
 * path of the quantizers runs: plain bell data, outliers, all-positive and
 * all-negative blocks (Q*_1 / k-quant mins), zero and constant sub-blocks,
 * sparse data and extreme scales. */
static void gen_input(float *x, int64_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        const float b = rng_bell(&s);
        switch ((i / 256) % 8) {
        case 0: x[i] = b; break;
        case 1: x[i] = (i % 37 == 5) ? b * 64.0f : b * 0.02f; break;
        case 2: x[i] = fabsf(b) + 0.25f; break;
        case 3: x[i] = -fabsf(b) * 0x1p-12f - 0x1p-14f; break;
        case 4: x[i] = ((i / 16) % 3 == 0) ? 0.0f : b; break;
        case 5: x[i] = ((i / 32) % 2) ? 1.25f : b * 0x1p-20f; break;
        case 6: x[i] = (rng_next(&s) % 10 < 7) ? 0.0f : b * 100.0f; break;
        default: x[i] = b * 0x1p10f; break;
        }
    }
}

/* Gaussian-like data for the statistical tests (sum of four uniforms,
 * rescaled to unit variance: var of the bell is 4 * (1/12) * 2^-2 * 4 = 1/3). */
static void gen_bell(float *x, int64_t n, uint64_t seed, float scale)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_bell(&s) * 1.7320508f * scale;
}

static uint64_t fnv1a(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    cr_assert(p, "out of memory");
    return p;
}

/* ======================= type table ======================= */

typedef struct {
    ecs_type_t type;
    const char *name;
    int64_t blck;
    size_t size;
    ecs_type_t vec_dot;
    bool weight;
} expected_traits_t;

/* ggml's table (ggml.c type_traits / ggml-cpu's vec_dot_type). */
static const expected_traits_t expected[] = {
    {ECS_TYPE_F32, "f32", 1, 4, ECS_TYPE_F32, true},
    {ECS_TYPE_F16, "f16", 1, 2, ECS_TYPE_F16, true},
    {ECS_TYPE_Q4_0, "q4_0", 32, 18, ECS_TYPE_Q8_0, true},
    {ECS_TYPE_Q4_1, "q4_1", 32, 20, ECS_TYPE_Q8_1, true},
    {ECS_TYPE_Q5_0, "q5_0", 32, 22, ECS_TYPE_Q8_0, true},
    {ECS_TYPE_Q5_1, "q5_1", 32, 24, ECS_TYPE_Q8_1, true},
    {ECS_TYPE_Q8_0, "q8_0", 32, 34, ECS_TYPE_Q8_0, true},
    {ECS_TYPE_Q8_1, "q8_1", 32, 36, ECS_TYPE_Q8_1, false},
    {ECS_TYPE_Q2_K, "q2_K", 256, 84, ECS_TYPE_Q8_K, true},
    {ECS_TYPE_Q3_K, "q3_K", 256, 110, ECS_TYPE_Q8_K, true},
    {ECS_TYPE_Q4_K, "q4_K", 256, 144, ECS_TYPE_Q8_K, true},
    {ECS_TYPE_Q5_K, "q5_K", 256, 176, ECS_TYPE_Q8_K, true},
    {ECS_TYPE_Q6_K, "q6_K", 256, 210, ECS_TYPE_Q8_K, true},
    {ECS_TYPE_Q8_K, "q8_K", 256, 292, ECS_TYPE_Q8_K, false},
    {ECS_TYPE_BF16, "bf16", 1, 2, ECS_TYPE_BF16, true},
};

Test(quant_traits, every_type_matches_ggml)
{
    cr_assert_eq(sizeof expected / sizeof expected[0], N_ALL_TYPES);
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        const expected_traits_t *e = &expected[i];
        const ecs_type_traits_t *t = ecs_type_traits(e->type);
        cr_assert(t, "type %d has no traits", e->type);
        cr_assert(ecs_type_valid((uint32_t)e->type));
        cr_assert_str_eq(t->name, e->name);
        cr_assert_str_eq(ecs_type_name(e->type), e->name);
        cr_assert_eq(t->blck_size, e->blck, "%s block size", e->name);
        cr_assert_eq(t->type_size, e->size, "%s type size", e->name);
        cr_assert_eq(t->vec_dot_type, e->vec_dot, "%s vec_dot_type", e->name);
        cr_assert_eq(t->is_weight, e->weight, "%s is_weight", e->name);
        /* the activation type must itself be a valid, self-dotting type */
        const ecs_type_traits_t *a = ecs_type_traits(t->vec_dot_type);
        cr_assert(a && a->vec_dot_type == t->vec_dot_type);
    }
}

Test(quant_traits, row_size)
{
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        const expected_traits_t *e = &expected[i];
        cr_assert_eq(ecs_row_size(e->type, 0), 0);
        cr_assert_eq(ecs_row_size(e->type, e->blck), e->size, "%s", e->name);
        cr_assert_eq(ecs_row_size(e->type, 7168), (size_t)(7168 / e->blck) * e->size, "%s",
                     e->name);
        cr_assert_eq(ecs_row_size(e->type, -e->blck), 0, "%s negative", e->name);
        if (e->blck > 1) {
            cr_assert_eq(ecs_row_size(e->type, e->blck + 1), 0, "%s partial", e->name);
            cr_assert_eq(ecs_row_size(e->type, e->blck / 2), 0, "%s partial", e->name);
        }
    }
    cr_assert_eq(ecs_row_size(ECS_TYPE_F32, 3), 12);
    cr_assert_eq(ecs_row_size(ECS_TYPE_Q4_K, 512), 288);
    cr_assert_eq(ecs_row_size(ECS_TYPE_Q8_0, 4096), 4352);
    /* a count whose byte size does not fit size_t */
    cr_assert_eq(ecs_row_size(ECS_TYPE_F32, INT64_MAX), 0);
}

Test(quant_traits, unknown_ids_rejected)
{
    uint32_t bad[] = {4, 5, 31, 1000, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_not(ecs_type_valid(bad[i]), "id %u", bad[i]);
        cr_assert_null(ecs_type_traits((ecs_type_t)bad[i]));
        cr_assert_eq(ecs_row_size((ecs_type_t)bad[i], 256), 0);
        cr_assert_str_eq(ecs_type_name((ecs_type_t)bad[i]), "unknown");
    }
    for (uint32_t id = 16; id <= 29; id++) {
        cr_assert_not(ecs_type_valid(id), "id %u", id);
        cr_assert_null(ecs_type_traits((ecs_type_t)id));
        cr_assert_eq(ecs_row_size((ecs_type_t)id, 256), 0);
    }
    int n_valid = 0;
    for (uint32_t id = 0; id < 2 * ECS_TYPE_COUNT; id++)
        n_valid += ecs_type_valid(id);
    cr_assert_eq(n_valid, (int)N_ALL_TYPES);
}

/* Calls the row functions cannot report: dequantize fills NaN, the dot
 * product is NaN, quantize leaves the destination alone. */
Test(quant_traits, invalid_row_calls)
{
    float src[64], dst[64];
    uint8_t q[512];
    for (int i = 0; i < 64; i++)
        src[i] = (float)i;
    memset(q, 0x5A, sizeof q);

    ecs_dequantize_row(ECS_TYPE_Q8_0, q, dst, 33);
    for (int i = 0; i < 33; i++)
        cr_assert(isnan(dst[i]));
    ecs_dequantize_row((ecs_type_t)4, q, dst, 32);
    for (int i = 0; i < 32; i++)
        cr_assert(isnan(dst[i]));

    ecs_quantize_row(ECS_TYPE_Q4_K, src, q, 64); /* not a whole super-block */
    ecs_quantize_row((ecs_type_t)20, src, q, 32);
    for (size_t i = 0; i < sizeof q; i++)
        cr_assert_eq(q[i], 0x5A);

    cr_assert(isnan(ecs_vec_dot_ref(ECS_TYPE_Q4_0, 48, q, q)));
    cr_assert(isnan(ecs_vec_dot_ref((ecs_type_t)5, 32, q, q)));
}

/* ======================= fp16 / bf16 ======================= */

static bool f32_is_nan_bits(uint32_t u)
{
    return (u & 0x7FFFFFFFu) > 0x7F800000u;
}

Test(quant_float, fp16_exhaustive_round_trip)
{
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        const float f = ecs_fp16_to_f32((ecs_fp16_t)h);
        const bool h_nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
        if (h_nan) {
            cr_assert(isnan(f), "fp16 %04x should be NaN", h);
            const ecs_fp16_t back = ecs_f32_to_fp16(f);
            cr_assert((back & 0x7C00) == 0x7C00 && (back & 0x3FF), "NaN %04x -> %04x", h, back);
            cr_assert_eq(back & 0x8000, h & 0x8000, "NaN sign");
            continue;
        }
        cr_assert_eq(ecs_f32_to_fp16(f), h, "fp16 %04x -> %a -> %04x", h, f,
                     ecs_f32_to_fp16(f));
        /* the value itself, computed independently */
        const int e = (int)((h >> 10) & 0x1F), m = (int)(h & 0x3FF);
        double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
        if (h & 0x8000)
            v = -v;
        cr_assert(f == (float)v && !signbit(f) == !signbit(v), "fp16 %04x = %a, want %a", h, f, v);
    }
}

Test(quant_float, bf16_exhaustive_round_trip)
{
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        const float f = ecs_bf16_to_f32((ecs_bf16_t)h);
        cr_assert_eq(f2u(f), h << 16);
        if (f32_is_nan_bits(h << 16)) {
            const ecs_bf16_t back = ecs_f32_to_bf16(f);
            cr_assert(f32_is_nan_bits((uint32_t)back << 16), "NaN %04x -> %04x", h, back);
            continue;
        }
        cr_assert_eq(ecs_f32_to_bf16(f), h, "bf16 %04x", h);
    }
}

Test(quant_float, known_values)
{
    const struct { float f; uint16_t h; } fp16[] = {
        {0.0f, 0x0000},          {-0.0f, 0x8000},
        {1.0f, 0x3C00},          {-2.0f, 0xC000},
        {0.5f, 0x3800},          {65504.0f, 0x7BFF},
        {65519.996f, 0x7BFF},    {65520.0f, 0x7C00}, /* the tie above the largest half */
        {1e6f, 0x7C00},          {-1e6f, 0xFC00},
        {INFINITY, 0x7C00},      {-INFINITY, 0xFC00},
        {0x1p-14f, 0x0400},      {0x1p-24f, 0x0001}, /* smallest normal, subnormal */
        {0x1.ff8p-15f, 0x03FF},  {0x1.ffcp-15f, 0x0400}, /* largest subnormal, tie up */
        {0x1p-25f, 0x0000},      {0x1.000002p-25f, 0x0001}, /* tie to even zero / above */
        {0x1.8p-24f, 0x0002},    {0x1.4p-23f, 0x0002}, /* 1.5 -> 2, 2.5 -> 2 */
        {1e-10f, 0x0000},        {-1e-10f, 0x8000},
        {0.1f, 0x2E66},          {3.14159265f, 0x4248},
    };
    for (size_t i = 0; i < sizeof fp16 / sizeof fp16[0]; i++)
        cr_assert_eq(ecs_f32_to_fp16(fp16[i].f), fp16[i].h, "%a -> %04x, want %04x", fp16[i].f,
                     ecs_f32_to_fp16(fp16[i].f), fp16[i].h);
    cr_assert(ecs_fp16_to_f32(0x7E00) != ecs_fp16_to_f32(0x7E00)); /* NaN */
    cr_assert_eq(ecs_fp16_to_f32(0xFC00), -INFINITY);

    const struct { float f; uint16_t h; } bf16[] = {
        {1.0f, 0x3F80},  {-2.0f, 0xC000}, {0.1f, 0x3DCD}, {3.14159265f, 0x4049},
        {INFINITY, 0x7F80}, {0x1.fffffep127f, 0x7F80}, /* rounds up into inf */
        {0x1p-133f, 0x0001}, /* subnormal kept */
    };
    for (size_t i = 0; i < sizeof bf16 / sizeof bf16[0]; i++)
        cr_assert_eq(ecs_f32_to_bf16(bf16[i].f), bf16[i].h, "%a -> %04x, want %04x", bf16[i].f,
                     ecs_f32_to_bf16(bf16[i].f), bf16[i].h);
    cr_assert(f32_is_nan_bits((uint32_t)ecs_f32_to_bf16(NAN) << 16));
    /* a NaN whose payload lives only in the low 16 bits must not become inf */
    cr_assert(f32_is_nan_bits((uint32_t)ecs_f32_to_bf16(u2f(0x7F800001u)) << 16));
    cr_assert(isnan(ecs_fp16_to_f32(ecs_f32_to_fp16(u2f(0x7F800001u)))));
}

Test(quant_float, rounding_ties_to_even)
{
    /* halfway between consecutive halves: 1 + k*2^-10 + 2^-11 */
    for (int k = 0; k < 1024; k++) {
        const float tie = 1.0f + (float)k * 0x1p-10f + 0x1p-11f;
        const uint16_t want = (uint16_t)(0x3C00 + k + (k & 1)); /* to the even mantissa */
        cr_assert_eq(ecs_f32_to_fp16(tie), want, "tie %a", tie);
        cr_assert_eq(ecs_f32_to_fp16(-tie), want | 0x8000);
        /* one ulp either side of the tie goes to the nearer neighbour */
        cr_assert_eq(ecs_f32_to_fp16(nextafterf(tie, 0.0f)), 0x3C00 + k);
        cr_assert_eq(ecs_f32_to_fp16(nextafterf(tie, 2.0f)), 0x3C00 + k + 1);
    }
    /* bf16: 1 + k*2^-7 + 2^-8 */
    for (int k = 0; k < 128; k++) {
        const float tie = 1.0f + (float)k * 0x1p-7f + 0x1p-8f;
        cr_assert_eq(ecs_f32_to_bf16(tie), (uint16_t)(0x3F80 + k + (k & 1)), "tie %a", tie);
        cr_assert_eq(ecs_f32_to_bf16(nextafterf(tie, 0.0f)), 0x3F80 + k);
        cr_assert_eq(ecs_f32_to_bf16(nextafterf(tie, 2.0f)), 0x3F80 + k + 1);
    }
}

/* For a spread of float bit patterns, the conversion must give the nearest
 * representable value (ties to even), judged in double arithmetic. */
static void check_nearest(uint16_t (*to)(float), float (*from)(uint16_t), uint32_t f_bits)
{
    const float f = u2f(f_bits);
    if (isnan(f))
        return;
    const uint16_t h = to(f);
    const float v = from(h);
    if (isinf(v) && !isinf(f)) {
        /* overflow: only at or past the midpoint above the largest finite */
        const double top = fabs((double)from((uint16_t)(h - 1)));
        const double ulp = top - fabs((double)from((uint16_t)(h - 2)));
        cr_assert(fabs((double)f) >= top + ulp / 2, "%a overflowed", f);
        return;
    }
    const double err = fabs((double)f - v);
    for (int d = -1; d <= 1; d += 2) {
        const uint16_t nb = (uint16_t)(h + d);
        if ((nb ^ h) & 0x8000) /* stepped across zero: same value */
            continue;
        const float w = from(nb);
        if (isnan(w))
            continue;
        const double err_n = fabs((double)f - w);
        cr_assert(err < err_n || (err == err_n && (h & 1) == 0),
                  "%a -> %04x (%a) but %04x (%a) is nearer or an even tie", f, h, v, nb, w);
    }
}

static uint16_t to_fp16(float f) { return ecs_f32_to_fp16(f); }
static float from_fp16(uint16_t h) { return ecs_fp16_to_f32(h); }
static uint16_t to_bf16(float f) { return ecs_f32_to_bf16(f); }
static float from_bf16(uint16_t h) { return ecs_bf16_to_f32(h); }

Test(quant_float, nearest_over_all_floats_sampled)
{
    for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) {
        check_nearest(to_fp16, from_fp16, (uint32_t)u);
        check_nearest(to_bf16, from_bf16, (uint32_t)u);
    }
    /* densely around the fp16 subnormal/normal boundary and the overflow edge */
    for (uint32_t u = f2u(0x1p-26f); u <= f2u(0x1p-13f); u += 7)
        check_nearest(to_fp16, from_fp16, u);
    for (uint32_t u = f2u(65000.0f); u <= f2u(66000.0f); u++)
        check_nearest(to_fp16, from_fp16, u);
}

/* ======================= real llama.cpp blocks ======================= */

static gguf_file_t *open_samples(void)
{
    gguf_file_t *f = NULL;
    const ecs_err_t rc = gguf_open(SAMPLES, &f);
    cr_assert_eq(rc, ECS_OK, "cannot read %s (run the tests from the repo root): %s", SAMPLES,
                 ecs_errmsg());
    return f;
}

/* Each weight tensor NAME against NAME.f32 (gguf-py's numpy dequantization). */
Test(quant_real, dequantize_matches_reference)
{
    gguf_file_t *f = open_samples();
    bool checked[ECS_TYPE_COUNT] = {false};
    int n_pairs = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        const size_t len = strlen(t->name);
        if (len >= 4 && !strcmp(t->name + len - 4, ".f32"))
            continue;
        char ref_name[sizeof t->name + 8];
        snprintf(ref_name, sizeof ref_name, "%s.f32", t->name);
        const gguf_tensor_t *r = gguf_find_tensor(f, ref_name);
        cr_assert(r, "%s has no twin %s", t->name, ref_name);
        cr_assert_eq(r->type, ECS_TYPE_F32);
        cr_assert(ecs_type_valid((uint32_t)t->type), "%s: type %d", t->name, t->type);
        const int64_t n = t->ne[0];
        const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        cr_assert_eq(r->ne[0], n);
        cr_assert_eq(r->ne[1] * r->ne[2] * r->ne[3], rows);
        const size_t rs = ecs_row_size(t->type, n);
        cr_assert(rs > 0, "%s: row of %lld", t->name, (long long)n);
        cr_assert_eq(rs * (size_t)rows, t->nbytes, "%s byte size", t->name);

        float *out = xmalloc((size_t)n * sizeof *out);
        for (int64_t k = 0; k < rows; k++) {
            const float *ref = (const float *)r->data + k * n;
            ecs_dequantize_row(t->type, (const uint8_t *)t->data + k * rs, out, n);
            float amax = 0;
            for (int64_t j = 0; j < n; j++)
                amax = fmaxf(amax, fabsf(ref[j]));
            cr_assert(amax > 0, "%s row %lld is all zero: a useless sample", t->name, (long long)k);
            for (int64_t j = 0; j < n; j++)
                cr_assert(fabsf(out[j] - ref[j]) <= 1e-6f * amax,
                          "%s (%s) row %lld elem %lld: %g, reference %g", t->name,
                          ecs_type_name(t->type), (long long)k, (long long)j, out[j], ref[j]);
        }
        free(out);
        checked[t->type] = true;
        n_pairs++;
    }
    gguf_close(f);
    cr_assert(n_pairs > 0);
    for (size_t i = 0; i < N_WEIGHT_TYPES; i++) {
        if (weight_types[i] == ECS_TYPE_F32)
            continue; /* the twins themselves are F32 */
        cr_assert(checked[weight_types[i]], "no %s sample in %s", ecs_type_name(weight_types[i]),
                  SAMPLES);
    }
}

/* llama.cpp's legacy blocks are fixed points of the reference quantizer: the
 * element of largest magnitude (or the minimum, for *_1) dequantizes to a
 * value that reproduces the same scale, and every other element lands back on
 * its level. Requantizing the reference dequantization must therefore give
 * the file's bytes; for F16/BF16 the twin holds the exact values. */
Test(quant_real, legacy_blocks_requantize_identically)
{
    static const ecs_type_t fixed[] = {ECS_TYPE_Q4_0, ECS_TYPE_Q4_1, ECS_TYPE_Q5_0,
                                       ECS_TYPE_Q5_1, ECS_TYPE_Q8_0, ECS_TYPE_F16,
                                       ECS_TYPE_BF16};
    gguf_file_t *f = open_samples();
    int n_checked = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        bool want = false;
        for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++)
            want |= t->type == fixed[k];
        if (!want)
            continue;
        char ref_name[sizeof t->name + 8];
        snprintf(ref_name, sizeof ref_name, "%s.f32", t->name);
        const gguf_tensor_t *r = gguf_find_tensor(f, ref_name);
        cr_assert(r);
        const int64_t n = t->ne[0], rows = (int64_t)(t->nbytes / ecs_row_size(t->type, n));
        const size_t rs = ecs_row_size(t->type, n);
        uint8_t *q = xmalloc(rs);
        for (int64_t k = 0; k < rows; k++) {
            ecs_quantize_row(t->type, (const float *)r->data + k * n, q, n);
            cr_assert(!memcmp(q, (const uint8_t *)t->data + k * rs, rs),
                      "%s row %lld requantizes differently", t->name, (long long)k);
        }
        free(q);
        n_checked++;
    }
    gguf_close(f);
    cr_assert_eq(n_checked, (int)(sizeof fixed / sizeof fixed[0]));
}

/* ======================= quantizer bit-exactness ======================= */

/* FNV-1a digests of ggml's quantize_row_*_ref output (ggml-org/ggml
 * d99724f2, x86-64) on gen_input(x, 65536, 0x5EED0000 + type id), computed
 * outside the project with ggml's own code. Equal digests mean our blocks
 * are byte-identical to what llama.cpp's quantizer writes; the row is long
 * because some branches of the scale searches win only rarely. */
static const struct {
    ecs_type_t type;
    uint64_t digest;
} ggml_digests[] = {
    {ECS_TYPE_Q4_0, 0xbea5edeae35e7d30ull},
    {ECS_TYPE_Q4_1, 0x7c0a8b4de8c36cd3ull},
    {ECS_TYPE_Q5_0, 0xebfb8ebd532bc462ull},
    {ECS_TYPE_Q5_1, 0x956ffa3f3a299f3full},
    {ECS_TYPE_Q8_0, 0xf0f2478f690e6d9cull},
    {ECS_TYPE_Q8_1, 0x5447c97c0feb9140ull},
    {ECS_TYPE_Q2_K, 0x9fddcbd829398d89ull},
    {ECS_TYPE_Q3_K, 0x44fa278644ca10bcull},
    {ECS_TYPE_Q4_K, 0x6caf9cfe9effb837ull},
    {ECS_TYPE_Q5_K, 0x830ef5eb88b80831ull},
    {ECS_TYPE_Q6_K, 0xb77913ef1cf11b39ull},
    {ECS_TYPE_Q8_K, 0xb2c5d8e4a880f0d7ull},
};

Test(quant_exact, quantizers_match_ggml_digests)
{
    enum { N = 65536 };
    float *x = xmalloc(N * sizeof *x);
    uint8_t *q = xmalloc(ecs_row_size(ECS_TYPE_F32, N));
    int n_checked = 0;
    for (size_t i = 0; i < sizeof ggml_digests / sizeof ggml_digests[0]; i++) {
        const ecs_type_t t = ggml_digests[i].type;
        gen_input(x, N, 0x5EED0000u + (uint64_t)t);
        memset(q, 0xEE, ecs_row_size(ECS_TYPE_F32, N));
        ecs_quantize_row(t, x, q, N);
        const uint64_t h = fnv1a(q, ecs_row_size(t, N));
        cr_expect_eq(h, ggml_digests[i].digest, "%s: digest %016llx, ggml's %016llx",
                     ecs_type_name(t), (unsigned long long)h,
                     (unsigned long long)ggml_digests[i].digest);
        n_checked++;
    }
    free(x);
    free(q);
    /* every quantized type, the activation types included */
    cr_assert_eq(n_checked, 12);
}

/* ======================= round trip ======================= */

/* RMS(dequant(quant(x)) - x) / RMS(x) on bell data. Measured (n = 8192,
 * this generator, scales 0.02..300): f16 2.1e-4, bf16 1.7e-3, q4_0 0.082,
 * q4_1 0.076, q5_0 0.040, q5_1 0.036, q8_0 0.0050, q8_1 0.0051, q2_K 0.286,
 * q3_K 0.146, q4_K 0.069, q5_K 0.035, q6_K 0.017, q8_K 0.0062; the bounds
 * leave about 15% headroom. */
static double rms_bound(ecs_type_t t)
{
    switch (t) {
    case ECS_TYPE_F32: return 0.0;
    case ECS_TYPE_F16: return 2.5e-4;
    case ECS_TYPE_BF16: return 2.0e-3;
    case ECS_TYPE_Q4_0: return 0.095;
    case ECS_TYPE_Q4_1: return 0.088;
    case ECS_TYPE_Q5_0: return 0.046;
    case ECS_TYPE_Q5_1: return 0.042;
    case ECS_TYPE_Q8_0: return 0.0058;
    case ECS_TYPE_Q8_1: return 0.0059;
    case ECS_TYPE_Q2_K: return 0.33;
    case ECS_TYPE_Q3_K: return 0.17;
    case ECS_TYPE_Q4_K: return 0.080;
    case ECS_TYPE_Q5_K: return 0.041;
    case ECS_TYPE_Q6_K: return 0.020;
    case ECS_TYPE_Q8_K: return 0.0072;
    default: return -1;
    }
}

static double rel_rms(const float *x, const float *y, int64_t n)
{
    double se = 0, sx = 0;
    for (int64_t i = 0; i < n; i++) {
        se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        sx += (double)x[i] * x[i];
    }
    return sqrt(se / sx);
}

Test(quant_round_trip, error_bounds_every_type)
{
    enum { N = 8192 };
    float *x = xmalloc(N * sizeof *x), *y = xmalloc(N * sizeof *y);
    uint8_t *q = xmalloc(ecs_row_size(ECS_TYPE_F32, N));
    /* 0.02 is a typical weight scale. Much smaller data (~1e-3) pushes the
     * fp16 super-block scale of Q6_K / Q8_0 into fp16 subnormals, where the
     * format itself (not this code) loses precision. */
    static const float scales[] = {1.0f, 0.02f, 300.0f};
    for (size_t i = 0; i < N_ALL_TYPES; i++) {
        const ecs_type_t t = all_types[i];
        const double bound = rms_bound(t);
        cr_assert(bound >= 0, "no bound for %s", ecs_type_name(t));
        /* relative error must not depend on the data's scale */
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
            gen_bell(x, N, 1000 + i, scales[s]);
            ecs_quantize_row(t, x, q, N);
            ecs_dequantize_row(t, q, y, N);
            const double e = rel_rms(x, y, N);
            cr_assert(e <= bound, "%s at scale %g: rms error %.4g > %.4g", ecs_type_name(t),
                      scales[s], e, bound);
            if (t != ECS_TYPE_F32)
                cr_assert(e > 0, "%s: lossless on random data?", ecs_type_name(t));
        }
    }
    free(x);
    free(y);
    free(q);
}

/* Degenerate rows: all zero must come back all zero; constant and sparse
 * rows must come back finite and close. */
Test(quant_round_trip, degenerate_rows)
{
    enum { N = 512 };
    float x[N], y[N];
    uint8_t q[N * 4];
    for (size_t i = 0; i < N_ALL_TYPES; i++) {
        const ecs_type_t t = all_types[i];
        memset(x, 0, sizeof x);
        ecs_quantize_row(t, x, q, N);
        ecs_dequantize_row(t, q, y, N);
        for (int j = 0; j < N; j++)
            cr_assert(y[j] == 0.0f, "%s: zero row gave %g at %d", ecs_type_name(t), y[j], j);

        for (int j = 0; j < N; j++)
            x[j] = -0.75f;
        ecs_quantize_row(t, x, q, N);
        ecs_dequantize_row(t, q, y, N);
        for (int j = 0; j < N; j++)
            cr_assert(fabsf(y[j] - x[j]) <= 0.01f, "%s: constant row gave %g", ecs_type_name(t),
                      y[j]);

        for (int j = 0; j < N; j++)
            x[j] = (j % 97 == 3) ? 5.0f : 0.0f;
        ecs_quantize_row(t, x, q, N);
        ecs_dequantize_row(t, q, y, N);
        for (int j = 0; j < N; j++)
            cr_assert(isfinite(y[j]) && fabsf(y[j] - x[j]) <= 0.05f * 5.0f,
                      "%s: sparse row elem %d: %g vs %g", ecs_type_name(t), j, y[j], x[j]);
    }
}

/* The extra fields of the activation types: Q8_1's s is d * sum(qs) and
 * Q8_K's bsums are exact sums of 16 levels, with the largest magnitude at
 * +-127 in both. */
Test(quant_round_trip, activation_side_fields)
{
    enum { N = 1024 };
    float x[N];
    gen_bell(x, N, 42, 1.0f);
    ecs_block_q8_1 b1[N / ECS_QK];
    ecs_quantize_row(ECS_TYPE_Q8_1, x, b1, N);
    for (int b = 0; b < N / ECS_QK; b++) {
        int sum = 0, amax = 0;
        for (int j = 0; j < ECS_QK; j++) {
            sum += b1[b].qs[j];
            amax = abs(b1[b].qs[j]) > amax ? abs(b1[b].qs[j]) : amax;
        }
        const float d = ecs_fp16_to_f32(b1[b].d), s = ecs_fp16_to_f32(b1[b].s);
        if (d != 0.0f)
            cr_assert_eq(amax, 127, "q8_1 block %d", b);
        /* s is rounded to fp16 from the unrounded d */
        cr_assert(fabsf(s - d * (float)sum) <= 2e-3f * fabsf(d * (float)sum) + 1e-30f,
                  "q8_1 block %d: s %g, d*sum %g", b, s, d * (float)sum);
    }
    ecs_block_q8_K bk[N / ECS_QK_K];
    ecs_quantize_row(ECS_TYPE_Q8_K, x, bk, N);
    for (int b = 0; b < N / ECS_QK_K; b++) {
        int amax = 0;
        for (int g = 0; g < ECS_QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) {
                const int v = bk[b].qs[16 * g + j];
                sum += v;
                amax = abs(v) > amax ? abs(v) : amax;
            }
            cr_assert_eq(bk[b].bsums[g], sum, "q8_K block %d group %d", b, g);
        }
        cr_assert_eq(amax, 127, "q8_K block %d", b);
    }
}

/* ======================= dot products ======================= */

/* Every weight type against its activation type. The integer dot of the
 * quantized rows must equal the float dot of their dequantized values up to
 * float rounding (Q8_1's s adds its fp16 rounding); it must also stay close
 * to the dot of the original floats, within a few standard deviations of the
 * quantization noise. */
Test(quant_dot, vec_dot_matches_float_dot)
{
    enum { N = 4096 };
    float *w = xmalloc(N * sizeof *w), *a = xmalloc(N * sizeof *a);
    float *wd = xmalloc(N * sizeof *wd), *ad = xmalloc(N * sizeof *ad);
    uint8_t *qw = xmalloc(N * 4), *qa = xmalloc(N * 4);
    for (size_t i = 0; i < N_WEIGHT_TYPES; i++) {
        const ecs_type_t t = weight_types[i];
        const ecs_type_t at = ecs_type_traits(t)->vec_dot_type;
        for (int rep = 0; rep < 3; rep++) {
            gen_bell(w, N, 77 + i * 10 + (uint64_t)rep, 0.05f);
            gen_bell(a, N, 99 + i * 10 + (uint64_t)rep, 3.0f);
            if (rep == 1) /* positive weights: exercises the mins/offsets */
                for (int j = 0; j < N; j++)
                    w[j] = fabsf(w[j]) + 0.01f;
            if (rep == 2) /* mixed ranges across blocks */
                for (int j = 0; j < N; j++)
                    w[j] *= (float)(1 + (j / 256) % 5);
            ecs_quantize_row(t, w, qw, N);
            ecs_quantize_row(at, a, qa, N);
            ecs_dequantize_row(t, qw, wd, N);
            ecs_dequantize_row(at, qa, ad, N);
            double dq = 0, dabs = 0, df = 0, noise = 0;
            for (int j = 0; j < N; j++) {
                dq += (double)wd[j] * ad[j];
                dabs += fabs((double)wd[j] * ad[j]);
                df += (double)w[j] * a[j];
                noise += (double)w[j] * a[j] * w[j] * a[j];
            }
            const float v = ecs_vec_dot_ref(t, N, qw, qa);
            const double tol = (at == ECS_TYPE_Q8_1 ? 1e-4 : 2e-6) * dabs;
            cr_assert(fabs(v - dq) <= tol, "%s rep %d: vec_dot %.9g, dequantized dot %.9g",
                      ecs_type_name(t), rep, v, dq);
            const double rel = rms_bound(t) + rms_bound(at);
            cr_assert(fabs(v - df) <= 6 * rel * sqrt(noise) + 1e-6 * dabs,
                      "%s rep %d: vec_dot %.9g, float dot %.9g", ecs_type_name(t), rep, v, df);
        }
    }
    free(w);
    free(a);
    free(wd);
    free(ad);
    free(qw);
    free(qa);
}

/* The activation types dot with themselves too (each valid type has a
 * reference), and a row of several blocks sums per block. */
Test(quant_dot, activation_types_and_block_sums)
{
    enum { N = 1024 };
    float x[N], y[N], xd[N], yd[N];
    uint8_t qx[N * 2], qy[N * 2];
    static const ecs_type_t acts[] = {ECS_TYPE_Q8_0, ECS_TYPE_Q8_1, ECS_TYPE_Q8_K};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        const ecs_type_t t = acts[i];
        gen_bell(x, N, 5 + i, 1.0f);
        gen_bell(y, N, 6 + i, 1.0f);
        ecs_quantize_row(t, x, qx, N);
        ecs_quantize_row(t, y, qy, N);
        ecs_dequantize_row(t, qx, xd, N);
        ecs_dequantize_row(t, qy, yd, N);
        double dq = 0, dabs = 0;
        for (int j = 0; j < N; j++) {
            dq += (double)xd[j] * yd[j];
            dabs += fabs((double)xd[j] * yd[j]);
        }
        const float v = ecs_vec_dot_ref(t, N, qx, qy);
        cr_assert(fabs(v - dq) <= 2e-6 * dabs, "%s: %.9g vs %.9g", ecs_type_name(t), v, dq);
        /* split the row at a block boundary: the halves add up */
        const int64_t bl = ecs_type_traits(t)->blck_size, half = (N / bl / 2) * bl;
        const size_t off = ecs_row_size(t, half);
        const float v1 = ecs_vec_dot_ref(t, half, qx, qy);
        const float v2 = ecs_vec_dot_ref(t, N - half, qx + off, qy + off);
        cr_assert(fabsf(v1 + v2 - v) <= 1e-5f * (float)dabs, "%s split", ecs_type_name(t));
    }
}
