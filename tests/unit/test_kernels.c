/* test_kernels.c - every SIMD kernel this CPU can run against the scalar
 * references of common/quant.h:
 *  - exact: random weight bits with scales chosen so every float step is
 *    exact; SIMD and reference dot products must be equal, which checks that
 *    the integer sums are the same;
 *  - realistic: quantized random data; results within 1e-6 relative to the
 *    magnitude of the accumulated terms (only the float order differs);
 *  - activation quantizers: byte-identical to ecs_quantize_row, ties and
 *    special values included;
 *  - kcpu_matmul_q / kcpu_matmul for nb in {1,2,3,7,64}, 1 and 2 threads;
 *  - the batched (gemm) kernels that kcpu_matmul_q uses from KCPU_GEMM_MIN_NB
 *    rows on: integer sums exact for every nb from 1 to 64 and odd shapes
 *    (rows not a multiple of the microkernel, legacy rows that end inside a
 *    256-value superblock), realistic data within the float tolerance, the
 *    same bits for any thread count and tiling. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static const ecs_type_t WTYPES[] = {
    ECS_TYPE_F32,  ECS_TYPE_F16,  ECS_TYPE_BF16, ECS_TYPE_Q4_0, ECS_TYPE_Q4_1,
    ECS_TYPE_Q5_0, ECS_TYPE_Q5_1, ECS_TYPE_Q8_0, ECS_TYPE_Q2_K, ECS_TYPE_Q3_K,
    ECS_TYPE_Q4_K, ECS_TYPE_Q5_K, ECS_TYPE_Q6_K,
};
#define NWTYPES (sizeof(WTYPES) / sizeof(WTYPES[0]))

/* ---- helpers ---- */

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rng_u64(rng_t *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_unif(rng_t *r) /* [-1, 1) */
{
    return (float)((double)(rng_u64(r) >> 11) * 0x1.0p-52 - 1.0);
}

static int rng_int(rng_t *r, int lo, int hi) /* inclusive */
{
    return lo + (int)(rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* roughly normal, with occasional outliers as real activations have */
static float rng_act(rng_t *r)
{
    float v = (rng_unif(r) + rng_unif(r) + rng_unif(r)) * 0.6f;
    if (rng_u64(r) % 97 == 0)
        v *= 12.0f;
    return v;
}

static void *xalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    cr_assert_not_null(p);
    return p;
}

static const ecs_type_traits_t *traits(ecs_type_t t)
{
    const ecs_type_traits_t *tr = ecs_type_traits(t);
    cr_assert_not_null(tr, "type %d", (int)t);
    return tr;
}

static ecs_type_t vdt_of(ecs_type_t t)
{
    return traits(t)->vec_dot_type;
}

/* Lengths to test: odd multiples of the block size (float types: odd
 * lengths that leave vector tails). */
static int test_lengths(ecs_type_t t, int64_t *out)
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

static kcpu_isa_t best_isa(void)
{
    return kcpu_isa_detect();
}

static void quantize_floats(ecs_type_t t, const float *x, void *dst, int64_t n)
{
    ecs_quantize_row(t, x, dst, n);
}

static void random_floats(rng_t *r, float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_act(r) * scale;
}

/* The scale of the rounding error a reordered float accumulation may make:
 * the magnitude of the terms the kernels add up. Per element that is
 * |w_i * a_i| plus, for the types with mins, |min * a_i| twice (the scaled
 * levels and the min term are accumulated separately and cancel); a block's
 * largest |w| bounds its min for data made by the reference quantizers. */
static double magnitude(ecs_type_t t, const void *w, const void *a, int64_t n)
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

static bool close_to_ref(ecs_type_t t, float got, float ref, const void *w, const void *a,
                         int64_t n, double *rel)
{
    *rel = 0;
    if (got == ref)
        return true;
    *rel = fabs((double)got - (double)ref) / (magnitude(t, w, a, n) + 1e-30);
    return *rel <= 1e-6;
}

static kcpu_kernel_t kernel_at(ecs_type_t t, kcpu_isa_t isa)
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
static int64_t level_bound(ecs_type_t t)
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
static int scale_fields(ecs_type_t t, size_t off[2])
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
static void exact_weights(rng_t *r, ecs_type_t t, void *w, int64_t n)
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
static void exact_act(rng_t *r, ecs_type_t vdt, void *a, int64_t n, int amp)
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

Test(kernels, vec_dot_integer_sums_exact)
{
    rng_t r = {1};
    int checked = 0;
    for (size_t ti = 0; ti < NWTYPES; ti++) {
        const ecs_type_t t = WTYPES[ti];
        int64_t lens[8];
        const int nl = test_lengths(t, lens);
        for (int li = 0; li < nl; li++) {
            const int64_t n = lens[li];
            /* weight scales up to 2: keep 2 * n * bound * amp below 2^24 */
            int64_t amp = ((1 << 24) - 1) / (2 * n * level_bound(t));
            if (amp > 64)
                amp = 64;
            if (amp < 1)
                continue; /* too long to be exact for this type */
            void *w = xalloc(ecs_row_size(t, n));
            void *a = xalloc(ecs_row_size(vdt_of(t), n) * KCPU_MAX_NA);
            const size_t as = ecs_row_size(vdt_of(t), n);
            for (int rep = 0; rep < 4; rep++) {
                exact_weights(&r, t, w, n);
                float ref[KCPU_MAX_NA];
                for (int j = 0; j < KCPU_MAX_NA; j++) {
                    exact_act(&r, vdt_of(t), (uint8_t *)a + j * as, n, (int)amp);
                    ref[j] = ecs_vec_dot_ref(t, n, w, (uint8_t *)a + j * as);
                }
                for (int isa = 0; isa <= (int)best_isa(); isa++) {
                    const kcpu_kernel_t k = kernel_at(t, (kcpu_isa_t)isa);
                    cr_assert_not_null(k.dot, "%s has no %s kernel", ecs_type_name(t),
                                       kcpu_isa_name((kcpu_isa_t)isa));
                    const float got = k.dot(n, w, a);
                    cr_assert_eq(got, ref[0], "%s %s n=%lld: %.9g != ref %.9g", ecs_type_name(t),
                                 kcpu_isa_name((kcpu_isa_t)isa), (long long)n, got, ref[0]);
                    checked++;
                    if (!k.multi)
                        continue;
                    for (int na = 1; na <= KCPU_MAX_NA; na++) {
                        float out[KCPU_MAX_NA];
                        k.multi(n, w, a, as, na, out);
                        for (int j = 0; j < na; j++)
                            cr_assert_eq(out[j], ref[j], "%s %s n=%lld na=%d row %d: %.9g != %.9g",
                                         ecs_type_name(t), kcpu_isa_name((kcpu_isa_t)isa),
                                         (long long)n, na, j, out[j], ref[j]);
                    }
                }
            }
            free(w);
            free(a);
        }
    }
    cr_assert_gt(checked, 0);
    cr_log_info("exact vec_dot: %d comparisons up to %s", checked, kcpu_isa_name(best_isa()));
}

/* ---- realistic data, float tolerance ---- */

Test(kernels, vec_dot_realistic_within_1e6)
{
    rng_t r = {2};
    double worst = 0;
    for (size_t ti = 0; ti < NWTYPES; ti++) {
        const ecs_type_t t = WTYPES[ti];
        const ecs_type_t vdt = vdt_of(t);
        int64_t lens[8];
        const int nl = test_lengths(t, lens);
        for (int li = 0; li < nl; li++) {
            const int64_t n = lens[li];
            float *x = xalloc((size_t)n * sizeof(float));
            void *w = xalloc(ecs_row_size(t, n));
            void *a = xalloc(ecs_row_size(vdt, n));
            for (int rep = 0; rep < 3; rep++) {
                random_floats(&r, x, n, 0.05f);
                quantize_floats(t, x, w, n);
                random_floats(&r, x, n, 3.0f);
                quantize_floats(vdt, x, a, n);
                const float ref = ecs_vec_dot_ref(t, n, w, a);
                for (int isa = 1; isa <= (int)best_isa(); isa++) {
                    const float got = kcpu_vec_dot_for(t, (kcpu_isa_t)isa)(n, w, a);
                    double err;
                    const bool ok = close_to_ref(t, got, ref, w, a, n, &err);
                    if (err > worst)
                        worst = err;
                    cr_assert(ok, "%s %s n=%lld: %.9g vs ref %.9g (rel %.3g)",
                                  ecs_type_name(t), kcpu_isa_name((kcpu_isa_t)isa), (long long)n,
                                  got, ref, err);
                }
            }
            free(x);
            free(w);
            free(a);
        }
    }
    cr_log_info("realistic vec_dot: worst relative difference %.3g", worst);
}

/* ---- activation quantizers ---- */

/* Blocks of 32 that hit every rounding corner the references define. */
static void special_values(rng_t *r, float *x, int64_t n, int kind)
{
    for (int64_t b = 0; b < n / ECS_QK; b++) {
        float *v = x + b * ECS_QK;
        switch ((kind + b) % 6) {
        case 0: /* scale 1 (Q8_0: amax 127; Q8_K: max -127): exact .5 ties */
            for (int j = 0; j < ECS_QK; j++)
                v[j] = (float)rng_int(r, -126, 125) + 0.5f;
            v[rng_int(r, 0, ECS_QK - 1)] = (b & 2) ? -127.0f : 127.0f;
            break;
        case 1: /* all zero */
            memset(v, 0, ECS_QK * sizeof(float));
            break;
        case 2: /* equal magnitudes of both signs: the first one sets the sign */
            for (int j = 0; j < ECS_QK; j++)
                v[j] = rng_unif(r);
            v[3] = 5.0f;
            v[9] = -5.0f;
            break;
        case 3: /* tiny values: scale underflows */
            for (int j = 0; j < ECS_QK; j++)
                v[j] = rng_unif(r) * 1e-42f;
            break;
        case 4: /* NaN and infinity */
            for (int j = 0; j < ECS_QK; j++)
                v[j] = rng_unif(r);
            v[5] = NAN;
            if (b & 1)
                v[11] = -INFINITY;
            break;
        default:
            for (int j = 0; j < ECS_QK; j++)
                v[j] = rng_act(r) * 10.0f;
            break;
        }
    }
}

Test(kernels, quantize_act_matches_reference)
{
    static const ecs_type_t vdts[] = {ECS_TYPE_Q8_0, ECS_TYPE_Q8_1, ECS_TYPE_Q8_K,
                                      ECS_TYPE_F32,  ECS_TYPE_F16,  ECS_TYPE_BF16};
    static const int64_t lens[] = {256, 768, 2816, 4096};
    rng_t r = {3};
    int checked = 0;
    for (size_t vi = 0; vi < sizeof(vdts) / sizeof(vdts[0]); vi++) {
        const ecs_type_t vdt = vdts[vi];
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            const int64_t n = lens[li];
            const size_t bytes = ecs_row_size(vdt, n);
            float *x = xalloc((size_t)n * sizeof(float));
            uint8_t *ref = xalloc(bytes), *got = xalloc(bytes);
            for (int kind = 0; kind < 8; kind++) {
                if (kind < 6)
                    special_values(&r, x, n, kind);
                else
                    random_floats(&r, x, n, kind == 6 ? 1.0f : 1e-3f);
                ecs_quantize_row(vdt, x, ref, n);
                for (int isa = 0; isa <= (int)best_isa(); isa++) {
                    cr_assert_eq(kcpu_set_isa((kcpu_isa_t)isa), (kcpu_isa_t)isa);
                    memset(got, 0xA5, bytes);
                    kcpu_quantize_act(vdt, x, got, n);
                    size_t at = 0;
                    while (at < bytes && got[at] == ref[at])
                        at++;
                    cr_assert_eq(at, bytes, "%s %s n=%lld kind %d: byte %zu differs (%d vs %d)",
                                 ecs_type_name(vdt), kcpu_isa_name((kcpu_isa_t)isa), (long long)n,
                                 kind, at, at < bytes ? got[at] : 0, at < bytes ? ref[at] : 0);
                    checked++;
                }
            }
            free(x);
            free(ref);
            free(got);
        }
    }
    cr_assert_gt(checked, 0);
}

/* ---- matmul ---- */

typedef struct {
    int64_t nrows, ncols;
} shape_t;

/* Scale and min j of a Q4_K block's 12 packed bytes (written here apart
 * from the kernels' own unpacking). */
static void k4_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The arithmetic of every AVX-512 Q4_K product (k4_avx512.c), in scalar C:
 * integer sums per 256-value block scaled by the 6-bit scales, the mins'
 * integer term, then two fused float operations per block in order. */
static float q4_K_exact(int64_t ncols, const void *w, const void *a)
{
    const ecs_block_q4_K *x = w;
    const ecs_block_q8_K *y = a;
    float acc = 0.0f;
    for (int64_t b = 0; b < ncols / ECS_QK_K; b++) {
        int32_t I = 0, M = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(j, x[b].scales, &sc, &m);
            int32_t s = 0, sum = 0;
            for (int i = 0; i < 32; i++) {
                const uint8_t byte = x[b].qs[32 * (j / 2) + i];
                const int8_t v = y[b].qs[32 * j + i];
                s += (j % 2 ? byte >> 4 : byte & 15) * v;
                sum += v;
            }
            I += sc * s;
            M += m * sum;
        }
        const float d = ecs_fp16_to_f32(x[b].d), dmin = ecs_fp16_to_f32(x[b].dmin);
        const float xb = fmaf((float)I, d, -((float)M * dmin));
        acc = fmaf(xb, y[b].d, acc);
    }
    return acc;
}

/* What kcpu_matmul_q computes where the ISA in use has the shared-layout
 * kernels and rows are at least a superblock long (for any nb: the row
 * kernel and the tiles compute alike), done as one tile of all rows, or,
 * for the types on interleaved row groups, the scalar version of their
 * arithmetic; false otherwise (then the row kernels are the expectation).
 * y: nb x nrows. */
static bool gemm_direct(const kcpu_mat_t *w, const void *act, int nb, float *y)
{
    const kcpu_gemm_t g = kcpu_gemm(w->type);
    const size_t rb = w->row_bytes, qb = ecs_row_size(vdt_of(w->type), w->ncols);
    if (g.grp_pack) {
        cr_assert_eq(w->type, ECS_TYPE_Q4_K, "no scalar version for %s", ecs_type_name(w->type));
        for (int b = 0; b < nb; b++)
            for (int64_t i = 0; i < w->nrows; i++)
                y[b * w->nrows + i] = q4_K_exact(w->ncols, (const uint8_t *)w->data + i * rb,
                                                 (const uint8_t *)act + b * qb);
        return true;
    }
    if (!g.w_sb || w->ncols < KCPU_GEMM_SB)
        return false;
    const int64_t nsb = (w->ncols + g.sb_cols - 1) / g.sb_cols;
    const size_t as = ecs_row_size(vdt_of(w->type), w->ncols);
    uint8_t *wu = xalloc((size_t)nsb * g.w_sb * (size_t)w->nrows);
    uint8_t *ap = xalloc((size_t)nsb * g.a_sb * (size_t)nb);
    for (int64_t i = 0; i < w->nrows; i++)
        g.unpack_w((const uint8_t *)w->data + (size_t)i * w->row_bytes, w->ncols,
                   wu + (size_t)i * (size_t)nsb * g.w_sb);
    for (int b = 0; b < nb; b++)
        g.pack_act((const uint8_t *)act + (size_t)b * as, w->ncols,
                   ap + (size_t)b * (size_t)nsb * g.a_sb);
    g.tile(wu, (int)w->nrows, ap, nb, nsb, y, w->nrows);
    free(wu);
    free(ap);
    return true;
}

static void check_matmul(rng_t *r, ecs_type_t t, shape_t s, ecs_threadpool_t *tp, kcpu_isa_t isa)
{
    static const int nbs[] = {1, 2, 3, 7, 64};
    const ecs_type_t vdt = vdt_of(t);
    const size_t rb = ecs_row_size(t, s.ncols), as = ecs_row_size(vdt, s.ncols);
    const int64_t ldx = s.ncols + 3, ldy = s.nrows + 5;
    uint8_t *wdata = xalloc(rb * (size_t)s.nrows);
    float *x = xalloc(sizeof(float) * (size_t)(ldx * 64));
    for (int64_t i = 0; i < s.nrows; i++) {
        random_floats(r, x, s.ncols, 0.05f);
        quantize_floats(t, x, wdata + (size_t)i * rb, s.ncols);
    }
    const kcpu_mat_t w = {t, s.ncols, s.nrows, rb, wdata, NULL};
    const kcpu_vec_dot_fn dot = kcpu_vec_dot_for(t, isa);
    cr_assert_not_null(dot);
    float *yg = xalloc(sizeof(float) * (size_t)(s.nrows * 64));
    uint8_t *act = xalloc(kcpu_act_bytes(t, s.ncols, 64)), *rowq = xalloc(as);
    void *scratch = xalloc(kcpu_act_bytes(t, s.ncols, 64));
    float *y = xalloc(sizeof(float) * (size_t)(ldy * 64));
    float *y2 = xalloc(sizeof(float) * (size_t)(ldy * 64));
    for (size_t bi = 0; bi < sizeof(nbs) / sizeof(nbs[0]); bi++) {
        const int nb = nbs[bi];
        random_floats(r, x, ldx * nb, 2.0f);
        kcpu_quantize_rows(tp, t, x, ldx, nb, s.ncols, act);
        for (int b = 0; b < nb; b++) {
            ecs_quantize_row(vdt, x + b * ldx, rowq, s.ncols);
            cr_assert_eq(memcmp(rowq, act + (size_t)b * as, as), 0, "%s quantize_rows row %d",
                         ecs_type_name(t), b);
        }
        for (int64_t i = 0; i < ldy * nb; i++)
            y[i] = y2[i] = -12345.0f; /* sentinel: the gaps must stay untouched */
        kcpu_matmul_q(tp, &w, act, nb, y, ldy);
        kcpu_matmul(tp, &w, x, ldx, nb, y2, ldy, scratch);
        const bool gemm = gemm_direct(&w, act, nb, yg);
        for (int b = 0; b < nb; b++) {
            const uint8_t *ab = act + (size_t)b * as;
            for (int64_t i = 0; i < s.nrows; i++) {
                const void *wr = wdata + (size_t)i * rb;
                const float got = y[b * ldy + i];
                /* the batched path: the same bits as one tile of all rows */
                const float same_isa = gemm ? yg[b * s.nrows + i] : dot(s.ncols, wr, ab);
                const float ref = ecs_vec_dot_ref(t, s.ncols, wr, ab);
                cr_assert_eq(got, same_isa, "%s %s nb=%d threads=%d y[%d][%lld]=%.9g, dot %.9g",
                             ecs_type_name(t), kcpu_isa_name(isa), nb, ecs_threadpool_size(tp), b,
                             (long long)i, got, same_isa);
                cr_assert_eq(y2[b * ldy + i], got, "%s kcpu_matmul differs", ecs_type_name(t));
                double rel;
                cr_assert(close_to_ref(t, got, ref, wr, ab, s.ncols, &rel),
                          "%s %s nb=%d: %.9g vs ref %.9g (rel %.3g)", ecs_type_name(t),
                          kcpu_isa_name(isa), nb, got, ref, rel);
            }
            for (int64_t i = s.nrows; i < ldy && b + 1 < nb; i++)
                cr_assert_eq(y[b * ldy + i], -12345.0f, "gap written at row %d col %lld", b,
                             (long long)i);
        }
    }
    free(wdata);
    free(x);
    free(act);
    free(rowq);
    free(scratch);
    free(y);
    free(y2);
    free(yg);
}

static int64_t cols_for(ecs_type_t t, int blocks)
{
    const int64_t blk = traits(t)->blck_size;
    return blk == 1 ? 61 * blocks : blk * blocks;
}

static void matmul_all_types(int nthreads, int64_t nrows, int blocks, bool only_common)
{
    ecs_threadpool_t *tp = NULL;
    cr_assert_eq(ecs_threadpool_create(nthreads, &tp), ECS_OK);
    rng_t r = {(uint64_t)(10 + nthreads + nrows)};
    /* the large shapes test the chunking, which does not depend on the ISA */
    for (int isa = only_common ? (int)best_isa() : 0; isa <= (int)best_isa(); isa++) {
        cr_assert_eq(kcpu_set_isa((kcpu_isa_t)isa), (kcpu_isa_t)isa);
        for (size_t ti = 0; ti < NWTYPES; ti++) {
            const ecs_type_t t = WTYPES[ti];
            if (only_common && t != ECS_TYPE_Q8_0 && t != ECS_TYPE_Q4_K && t != ECS_TYPE_Q6_K &&
                t != ECS_TYPE_F16)
                continue;
            shape_t s = {nrows, cols_for(t, blocks)};
            check_matmul(&r, t, s, tp, (kcpu_isa_t)isa);
        }
    }
    ecs_threadpool_destroy(tp);
}

Test(kernels, matmul_small_1_thread)
{
    matmul_all_types(1, 37, 3, false);
}

Test(kernels, matmul_small_2_threads)
{
    matmul_all_types(2, 37, 3, false);
}

/* Large enough for several chunks per thread. */
Test(kernels, matmul_chunked_2_threads)
{
    matmul_all_types(2, 301, 5, true);
}

Test(kernels, matmul_chunked_1_thread)
{
    matmul_all_types(1, 301, 5, true);
}

/* Rows of several KB: a chunk spans several of matmul's L2 tiles. */
Test(kernels, matmul_wide_rows)
{
    rng_t r = {77};
    for (int nth = 1; nth <= 2; nth++) {
        ecs_threadpool_t *tp = NULL;
        cr_assert_eq(ecs_threadpool_create(nth, &tp), ECS_OK);
        check_matmul(&r, ECS_TYPE_Q8_0, (shape_t){301, 2048}, tp, kcpu_isa());
        check_matmul(&r, ECS_TYPE_F16, (shape_t){301, 2048}, tp, kcpu_isa());
        ecs_threadpool_destroy(tp);
    }
}

/* ---- batched products: every nb ---- */

static const ecs_type_t QTYPES[] = {
    ECS_TYPE_Q4_0, ECS_TYPE_Q4_1, ECS_TYPE_Q5_0, ECS_TYPE_Q5_1, ECS_TYPE_Q8_0,
    ECS_TYPE_Q2_K, ECS_TYPE_Q3_K, ECS_TYPE_Q4_K, ECS_TYPE_Q5_K, ECS_TYPE_Q6_K,
};
#define NQTYPES (sizeof(QTYPES) / sizeof(QTYPES[0]))

/* Row lengths: k-quants one, three or four blocks (the shared layout pairs
 * blocks into 512-value superblocks: odd counts end with a half one);
 * legacy rows below the shared layout's minimum (32), ending inside a
 * superblock (288; 1408 = 2.75 x 512, the experts' down projection) or
 * whole (1024). */
static int test_cols(ecs_type_t t, int64_t *out)
{
    if (traits(t)->blck_size == ECS_QK_K) {
        out[0] = 256, out[1] = 768, out[2] = 1024;
        return 3;
    }
    out[0] = 32, out[1] = 288, out[2] = 1408, out[3] = 1024;
    return 4;
}

/* Every batch size up to 64, then a few up to KCPU_MAX_BATCH (65, 133, 269,
 * 512: odd sizes end in partial microkernels). */
static int next_nb(int nb)
{
    if (nb < 64)
        return nb + 1;
    if (nb >= KCPU_MAX_BATCH)
        return KCPU_MAX_BATCH + 1;
    return 2 * nb + 3 < KCPU_MAX_BATCH ? 2 * nb + 3 : KCPU_MAX_BATCH;
}

/* A weight matrix and KCPU_MAX_BATCH activation rows of exact data (as in
 * vec_dot_integer_sums_exact) and the reference dot of every pair. */
typedef struct {
    kcpu_mat_t w;
    uint8_t *act;
    size_t as;
    float *ref; /* [KCPU_MAX_BATCH][nrows] */
} exact_case_t;

static bool exact_case(rng_t *r, ecs_type_t t, int64_t nrows, int64_t ncols, exact_case_t *c)
{
    int64_t amp = ((1 << 24) - 1) / (2 * ncols * level_bound(t));
    if (amp > 64)
        amp = 64;
    if (amp < 1)
        return false;
    const size_t rb = ecs_row_size(t, ncols);
    c->as = ecs_row_size(vdt_of(t), ncols);
    uint8_t *wd = xalloc(rb * (size_t)nrows);
    for (int64_t i = 0; i < nrows; i++)
        exact_weights(r, t, wd + (size_t)i * rb, ncols);
    c->w = (kcpu_mat_t){t, ncols, nrows, rb, wd, NULL};
    c->act = xalloc(c->as * KCPU_MAX_BATCH);
    c->ref = xalloc(sizeof(float) * (size_t)(nrows * KCPU_MAX_BATCH));
    for (int b = 0; b < KCPU_MAX_BATCH; b++) {
        exact_act(r, vdt_of(t), c->act + (size_t)b * c->as, ncols, (int)amp);
        for (int64_t i = 0; i < nrows; i++)
            c->ref[b * nrows + i] =
                ecs_vec_dot_ref(t, ncols, wd + (size_t)i * rb, c->act + (size_t)b * c->as);
    }
    return true;
}

static void exact_case_free(exact_case_t *c)
{
    free((void *)c->w.data);
    free(c->act);
    free(c->ref);
}

Test(kernels, matmul_every_nb_integer_sums_exact)
{
    static const int64_t nrows[] = {1, 5, 13};
    rng_t r = {41};
    ecs_threadpool_t *tp = NULL;
    cr_assert_eq(ecs_threadpool_create(2, &tp), ECS_OK);
    int checked = 0;
    for (size_t ti = 0; ti < NQTYPES; ti++) {
        const ecs_type_t t = QTYPES[ti];
        int64_t cols[4];
        const int nc = test_cols(t, cols);
        for (int ci = 0; ci < nc; ci++) {
            for (size_t ri = 0; ri < sizeof(nrows) / sizeof(nrows[0]); ri++) {
                exact_case_t c;
                if (!exact_case(&r, t, nrows[ri], cols[ci], &c))
                    continue;
                const int64_t ldy = nrows[ri] + 1;
                float *y = xalloc(sizeof(float) * (size_t)(ldy * KCPU_MAX_BATCH));
                for (int nb = 1; nb <= KCPU_MAX_BATCH; nb = next_nb(nb)) {
                    kcpu_matmul_q(tp, &c.w, c.act, nb, y, ldy);
                    for (int b = 0; b < nb; b++)
                        for (int64_t i = 0; i < nrows[ri]; i++)
                            cr_assert_eq(y[b * ldy + i], c.ref[b * nrows[ri] + i],
                                         "%s %lld x %lld nb=%d y[%d][%lld] = %.9g, ref %.9g",
                                         ecs_type_name(t), (long long)nrows[ri],
                                         (long long)cols[ci], nb, b, (long long)i,
                                         y[b * ldy + i], c.ref[b * nrows[ri] + i]);
                    checked++;
                }
                free(y);
                exact_case_free(&c);
            }
        }
    }
    ecs_threadpool_destroy(tp);
    cr_assert_gt(checked, 0);
    cr_log_info("every nb exact: %d products, isa %s, batched kernels for q4_K: %s", checked,
                kcpu_isa_name(kcpu_isa()), kcpu_gemm(ECS_TYPE_Q4_K).w_sb ? "yes" : "no");
}

/* Realistic data, every nb: close to the reference, and bit for bit the
 * same with 1 and 2 threads and in every batch (a row's value depends
 * neither on the chunking nor on the other rows it came with), on every
 * SIMD level. */
static void every_nb_realistic(kcpu_isa_t isa)
{
    rng_t r = {43};
    cr_assert_eq(kcpu_set_isa(isa), isa);
    ecs_threadpool_t *tp1 = NULL, *tp2 = NULL;
    cr_assert_eq(ecs_threadpool_create(1, &tp1), ECS_OK);
    cr_assert_eq(ecs_threadpool_create(2, &tp2), ECS_OK);
    /* the float types: several weight rows per pass (kcpu_kernel_t.rows)
     * and single rows (the 301st; chunk and tile ends) must agree */
    static const ecs_type_t types[] = {ECS_TYPE_Q4_K, ECS_TYPE_Q8_0, ECS_TYPE_Q5_0, ECS_TYPE_Q6_K,
                                       ECS_TYPE_Q4_1, ECS_TYPE_F32,  ECS_TYPE_F16,  ECS_TYPE_BF16};
    double worst = 0;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const ecs_type_t t = types[ti], vdt = vdt_of(t);
        const int bs = traits(t)->blck_size;
        const int64_t nrows = 301, ncols = bs == ECS_QK ? 1408 : bs == 1 ? 770 : 768;
        const int64_t ldy = nrows + 2;
        const size_t rb = ecs_row_size(t, ncols), as = ecs_row_size(vdt, ncols);
        float *x = xalloc(sizeof(float) * (size_t)ncols);
        uint8_t *wd = xalloc(rb * (size_t)nrows), *act = xalloc(as * KCPU_MAX_BATCH);
        for (int64_t i = 0; i < nrows; i++) {
            random_floats(&r, x, ncols, 0.05f);
            quantize_floats(t, x, wd + (size_t)i * rb, ncols);
        }
        for (int b = 0; b < KCPU_MAX_BATCH; b++) {
            random_floats(&r, x, ncols, 2.0f);
            quantize_floats(vdt, x, act + (size_t)b * as, ncols);
        }
        const kcpu_mat_t w = {t, ncols, nrows, rb, wd, NULL};
        /* reference and tolerance scale of every pair, once */
        float *ref = xalloc(sizeof(float) * (size_t)(nrows * KCPU_MAX_BATCH));
        double *mag = xalloc(sizeof(double) * (size_t)(nrows * KCPU_MAX_BATCH));
        for (int b = 0; b < KCPU_MAX_BATCH; b++)
            for (int64_t i = 0; i < nrows; i++) {
                const void *wr = wd + (size_t)i * rb, *ab = act + (size_t)b * as;
                ref[b * nrows + i] = ecs_vec_dot_ref(t, ncols, wr, ab);
                mag[b * nrows + i] = magnitude(t, wr, ab, ncols) + 1e-30;
            }
        float *y1 = xalloc(sizeof(float) * (size_t)(ldy * KCPU_MAX_BATCH));
        float *y2 = xalloc(sizeof(float) * (size_t)(ldy * KCPU_MAX_BATCH));
        float *all = xalloc(sizeof(float) * (size_t)(ldy * KCPU_MAX_BATCH));
        kcpu_matmul_q(tp2, &w, act, KCPU_MAX_BATCH, all, ldy);
        for (int nb = 1; nb <= KCPU_MAX_BATCH; nb = next_nb(nb)) {
            for (int64_t i = 0; i < ldy * nb; i++)
                y1[i] = y2[i] = -12345.0f;
            kcpu_matmul_q(tp1, &w, act, nb, y1, ldy);
            kcpu_matmul_q(tp2, &w, act, nb, y2, ldy);
            for (int b = 0; b < nb; b++) {
                for (int64_t i = 0; i < nrows; i++) {
                    const float got = y2[b * ldy + i];
                    cr_assert_eq(got, y1[b * ldy + i], "%s %s nb=%d y[%d][%lld]: 2 threads %.9g, "
                                 "1 thread %.9g", ecs_type_name(t), kcpu_isa_name(isa), nb, b,
                                 (long long)i, got, y1[b * ldy + i]);
                    cr_assert_eq(got, all[b * ldy + i], "%s %s nb=%d y[%d][%lld] = %.9g, in the "
                                 "biggest batch: %.9g", ecs_type_name(t), kcpu_isa_name(isa), nb, b,
                                 (long long)i, got, all[b * ldy + i]);
                    const double rel = fabs((double)got - ref[b * nrows + i]) / mag[b * nrows + i];
                    cr_assert(rel <= 1e-6, "%s %s nb=%d y[%d][%lld] = %.9g, ref %.9g (rel %.3g)",
                              ecs_type_name(t), kcpu_isa_name(isa), nb, b, (long long)i, got,
                              ref[b * nrows + i], rel);
                    if (rel > worst)
                        worst = rel;
                }
                cr_assert_eq(y2[b * ldy + nrows], -12345.0f, "gap written");
                cr_assert_eq(y2[b * ldy + nrows + 1], -12345.0f, "gap written");
            }
        }
        free(x), free(wd), free(act), free(y1), free(y2), free(all), free(ref), free(mag);
    }
    ecs_threadpool_destroy(tp1);
    ecs_threadpool_destroy(tp2);
    cr_log_info("every nb realistic, %s: worst relative difference %.3g", kcpu_isa_name(isa),
                worst);
}

/* kcpu_kernel_t.rows: each (weight row, activation row) pair equals multi's
 * result for that weight row, bit for bit, at every length (masked ends). */
Test(kernels, float_rows_equal_multi)
{
    if (best_isa() < KCPU_ISA_AVX512)
        cr_skip_test("no AVX-512 on this CPU: kcpu_kernel_t.rows is AVX-512 only");
    rng_t r = {61};
    static const ecs_type_t types[] = {ECS_TYPE_F32, ECS_TYPE_F16, ECS_TYPE_BF16};
    static const int64_t lens[] = {1, 15, 16, 17, 100, 2048};
    float x[2048];
    int checked = 0;
    for (size_t ti = 0; ti < 3; ti++) {
        const ecs_type_t t = types[ti];
        const kcpu_kernel_t k = kcpu_kernel_avx512(t);
        cr_assert(k.rows && k.multi, "%s has no rows kernel", ecs_type_name(t));
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t n = lens[li];
            /* rows apart by more than a row */
            const size_t rb = ecs_row_size(t, n) + 64, as = ecs_row_size(vdt_of(t), n) + 64;
            uint8_t *w = xalloc(rb * KCPU_ROWS_W), *a = xalloc(as * KCPU_MAX_NA);
            for (int i = 0; i < KCPU_ROWS_W; i++) {
                random_floats(&r, x, n, 0.05f);
                quantize_floats(t, x, w + (size_t)i * rb, n);
            }
            for (int j = 0; j < KCPU_MAX_NA; j++) {
                random_floats(&r, x, n, 2.0f);
                quantize_floats(vdt_of(t), x, a + (size_t)j * as, n);
            }
            for (int na = 1; na <= KCPU_MAX_NA; na++) {
                float got[KCPU_ROWS_W * KCPU_MAX_NA], want[KCPU_MAX_NA];
                k.rows(n, w, rb, a, as, na, got);
                for (int m = 0; m < KCPU_ROWS_W; m++) {
                    k.multi(n, w + (size_t)m * rb, a, as, na, want);
                    for (int j = 0; j < na; j++, checked++)
                        cr_assert_eq(got[m * KCPU_MAX_NA + j], want[j],
                                     "%s n=%lld na=%d row %d act %d: %.9g != %.9g",
                                     ecs_type_name(t), (long long)n, na, m, j,
                                     got[m * KCPU_MAX_NA + j], want[j]);
                }
            }
            free(w), free(a);
        }
    }
    cr_assert_gt(checked, 0);
}

Test(kernels, matmul_every_nb_realistic_and_invariant)
{
    every_nb_realistic(best_isa());
}

Test(kernels, matmul_every_nb_realistic_and_invariant_avx2)
{
    if (best_isa() < KCPU_ISA_AVX2)
        cr_skip_test("no AVX2 on this CPU");
    every_nb_realistic(KCPU_ISA_AVX2);
}

/* ---- dispatch ---- */

Test(kernels, isa_selection)
{
    const kcpu_isa_t best = kcpu_isa_detect();
    cr_assert_leq(kcpu_isa(), best);
    cr_assert_eq(kcpu_set_isa(KCPU_ISA_SCALAR), KCPU_ISA_SCALAR);
    cr_assert_eq(kcpu_isa(), KCPU_ISA_SCALAR);
    cr_assert_eq(kcpu_set_isa(KCPU_ISA_AVX512), best, "never above the detected ISA");
    cr_assert_eq(kcpu_isa(), best);
    cr_assert_str_eq(kcpu_isa_name(KCPU_ISA_AVX2), "avx2");
    cr_assert_str_eq(kcpu_isa_name(KCPU_ISA_SCALAR), "scalar");
    cr_assert_str_eq(kcpu_isa_name(KCPU_ISA_AVX512), "avx512");
    for (int isa = 0; isa <= (int)KCPU_ISA_AVX512; isa++) {
        for (size_t ti = 0; ti < NWTYPES; ti++) {
            const kcpu_vec_dot_fn f = kcpu_vec_dot_for(WTYPES[ti], (kcpu_isa_t)isa);
            if (isa <= (int)best)
                cr_assert_not_null(f, "%s at %d", ecs_type_name(WTYPES[ti]), isa);
            else
                cr_assert_null(f, "no kernels above the detected ISA");
        }
        cr_assert_null(kcpu_vec_dot_for(ECS_TYPE_Q8_K, (kcpu_isa_t)isa));
        cr_assert_null(kcpu_vec_dot_for((ecs_type_t)4, (kcpu_isa_t)isa));
    }
    cr_log_info("detected ISA: %s", kcpu_isa_name(best));
}

Test(kernels, isa_from_environment)
{
    /* each Criterion test runs in its own process: kcpu_isa() is fresh */
    setenv("ECS_ISA", "scalar", 1);
    cr_assert_eq(kcpu_isa(), KCPU_ISA_SCALAR);
}

Test(kernels, isa_environment_never_raises)
{
    setenv("ECS_ISA", "avx512", 1);
    cr_assert_eq(kcpu_isa(), kcpu_isa_detect());
}

Test(kernels, act_bytes)
{
    cr_assert_eq(kcpu_act_bytes(ECS_TYPE_Q4_K, 512, 3), 3 * 2 * sizeof(ecs_block_q8_K));
    cr_assert_eq(kcpu_act_bytes(ECS_TYPE_Q4_1, 64, 2), 2 * 2 * sizeof(ecs_block_q8_1));
    cr_assert_eq(kcpu_act_bytes(ECS_TYPE_Q5_0, 64, 1), 2 * sizeof(ecs_block_q8_0));
    cr_assert_eq(kcpu_act_bytes(ECS_TYPE_F16, 7, 5), 7 * 5 * sizeof(ecs_fp16_t));
    cr_assert_eq(kcpu_act_bytes(ECS_TYPE_F32, 7, 1), 7 * sizeof(float));
    cr_assert_eq(kcpu_act_bytes(ECS_TYPE_Q4_K, 100, 1), 0, "not a whole block");
    cr_assert_eq(kcpu_act_bytes((ecs_type_t)5, 256, 1), 0, "unknown type");
}

/* A type with no kernel must not leave stale numbers behind. */
Test(kernels, matmul_unknown_type_gives_nan)
{
    uint8_t data[64] = {0}, act[64] = {0};
    const kcpu_mat_t w = {(ecs_type_t)5, 32, 2, 32, data, NULL};
    float y[2] = {1.0f, 2.0f};
    kcpu_matmul_q(NULL, &w, act, 1, y, 2);
    cr_assert(isnan(y[0]) && isnan(y[1]));
}

/* The pair product on bad input: a type without kernels fills both
 * outputs with NaN like kcpu_matmul_q; no rows (nb = 0) or an empty
 * matrix writes nothing. */
Test(kernels, matmul_pair_bad_input)
{
    uint8_t data[64] = {0}, act[64] = {0};
    const kcpu_mat_t w = {(ecs_type_t)5, 32, 2, 32, data, NULL};
    float y1[2] = {1.0f, 2.0f}, y2[2] = {3.0f, 4.0f};
    kcpu_matmul_q_pair(&w, &w, act, 1, y1, y2, 2);
    cr_assert(isnan(y1[0]) && isnan(y1[1]) && isnan(y2[0]) && isnan(y2[1]));
    const kcpu_mat_t f = {ECS_TYPE_F32, 8, 2, 32, data, NULL};
    float z1[2] = {1.0f, 2.0f}, z2[2] = {3.0f, 4.0f};
    kcpu_matmul_q_pair(&f, &f, act, 0, z1, z2, 2);
    const kcpu_mat_t empty = {ECS_TYPE_F32, 8, 0, 32, data, NULL};
    kcpu_matmul_q_pair(&empty, &empty, act, 1, z1, z2, 2);
    cr_assert(z1[0] == 1.0f && z1[1] == 2.0f && z2[0] == 3.0f && z2[1] == 4.0f);
}

/* Scratch reserved up front: bad batch sizes are refused, and a product
 * within what was reserved allocates nothing. */
Test(kernels, matmul_reserve)
{
    rng_t r = {5};
    exact_case_t c;
    cr_assert(exact_case(&r, ECS_TYPE_Q4_K, 40, 1024, &c));
    ecs_threadpool_t *tp;
    cr_assert_eq(ecs_threadpool_create(2, &tp), ECS_OK);
    cr_assert_eq(kcpu_matmul_reserve(tp, &c.w, 0), ECS_ERR_INVAL);
    cr_assert_eq(kcpu_matmul_reserve(tp, &c.w, KCPU_MAX_BATCH + 1), ECS_ERR_INVAL);
    cr_assert_neq(strlen(ecs_errmsg()), 0);
    cr_assert_gt(kcpu_matmul_scratch(&c.w, 64), kcpu_matmul_scratch(&c.w, 1));
    cr_assert_eq(kcpu_matmul_reserve(tp, &c.w, 64), ECS_OK, "%s", ecs_errmsg());
    const uint64_t before = kcpu_scratch_grows();
    float *y = xalloc(sizeof(float) * 40 * 64);
    for (int nb = 1; nb <= 64; nb *= 4)
        kcpu_matmul_q(tp, &c.w, c.act, nb, y, 40);
    cr_assert_eq(kcpu_scratch_grows(), before, "a reserved product allocated");
    free(y);
    exact_case_free(&c);
    ecs_threadpool_destroy(tp);
}

/* ---- row-interleaved weights ---- */

Test(kernels, r16_shapes)
{
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q4_K, 16, 256), KCPU_R16_Q4_K_BLOCK);
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q4_K, 48, 2048), 3 * 8 * KCPU_R16_Q4_K_BLOCK);
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q4_K, 15, 256), 0, "rows not a multiple of 16");
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q4_K, 16, 300), 0, "partial block");
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q4_K, 0, 256), 0);
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q5_0, 16, 256), 8 * KCPU_R16_Q5_0_BLOCK);
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q8_0, 32, 1408), 2 * 44 * KCPU_R16_Q8_0_BLOCK);
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q5_0, 16, 288), 0, "odd block count");
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q8_0, 16, 128), 0, "shorter than KCPU_GEMM_SB");
    /* same bytes as the rows */
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q5_0, 16, 512), 16 * ecs_row_size(ECS_TYPE_Q5_0, 512));
    cr_assert_eq(kcpu_r16_bytes(ECS_TYPE_Q8_0, 16, 512), 16 * ecs_row_size(ECS_TYPE_Q8_0, 512));
    cr_assert(kcpu_r16_fits(ECS_TYPE_Q4_K, 1408, 2048));
    cr_assert_not(kcpu_r16_fits(ECS_TYPE_Q6_K, 16, 256), "no layout for Q6_K");
    cr_assert_not(kcpu_r16_fits(ECS_TYPE_Q4_0, 16, 256), "no layout for Q4_0");
}

/* One interleaved case: nrows rows (realistic data or the exact-sum data),
 * their interleaved copy, R16_ACT_ROWS activation rows. */
#define R16_ACT_ROWS 16

typedef struct {
    kcpu_mat_t w;  /* the rows, r16 NULL */
    kcpu_mat_t wi; /* the same with r16 */
    uint8_t *act;
    size_t as;
} r16_case_t;

static void r16_case(rng_t *r, ecs_type_t t, int64_t nrows, int64_t ncols, bool exact,
                     r16_case_t *c)
{
    const ecs_type_t vdt = vdt_of(t);
    const size_t rb = ecs_row_size(t, ncols);
    c->as = ecs_row_size(vdt, ncols);
    uint8_t *wd = xalloc(rb * (size_t)nrows);
    float *x = xalloc(sizeof(float) * (size_t)ncols);
    for (int64_t i = 0; i < nrows; i++) {
        if (exact) {
            exact_weights(r, t, wd + (size_t)i * rb, ncols);
        } else {
            random_floats(r, x, ncols, 0.05f);
            quantize_floats(t, x, wd + (size_t)i * rb, ncols);
        }
    }
    c->act = xalloc(c->as * R16_ACT_ROWS);
    int64_t amp = ((1 << 24) - 1) / (2 * ncols * level_bound(t)); /* as exact_case */
    amp = amp > 64 ? 64 : amp < 1 ? 1 : amp;
    for (int b = 0; b < R16_ACT_ROWS; b++) {
        if (exact) {
            exact_act(r, vdt, c->act + (size_t)b * c->as, ncols, (int)amp);
        } else {
            random_floats(r, x, ncols, 2.0f);
            quantize_floats(vdt, x, c->act + (size_t)b * c->as, ncols);
        }
    }
    c->w = (kcpu_mat_t){t, ncols, nrows, rb, wd, NULL};
    const size_t bytes = kcpu_r16_bytes(t, nrows, ncols);
    cr_assert_gt(bytes, 0);
    void *packed = aligned_alloc(64, bytes);
    cr_assert_not_null(packed);
    kcpu_r16_pack(&c->w, 0, nrows, packed);
    c->wi = c->w;
    c->wi.r16 = packed;
    free(x);
}

static void r16_case_free(r16_case_t *c)
{
    free((void *)c->w.data);
    free((void *)c->wi.r16);
    free(c->act);
}

/* y = w x act row b, every way the kernels can take it: the interleaved
 * copy must give the bits of the rows (and of a batch of 4), on any thread
 * count and for views that start inside the matrix. */
static void r16_check(const r16_case_t *c, ecs_threadpool_t *tp, int b)
{
    const int64_t n = c->w.nrows;
    float *plain = xalloc(sizeof(float) * (size_t)n), *got = xalloc(sizeof(float) * (size_t)n);
    float *batch = xalloc(sizeof(float) * (size_t)n * 4);
    const uint8_t *a = c->act + (size_t)b * c->as;
    kcpu_matmul_q(tp, &c->w, a, 1, plain, n);
    /* 2 rows: the copy one row at a time; 3: the rows. The same bits. */
    for (int nb = 2; nb <= 3; nb++) {
        kcpu_matmul_q(tp, &c->wi, a, nb, batch, n);
        for (int j = 0; j < nb; j++) {
            kcpu_matmul_q(tp, &c->w, a + (size_t)j * c->as, 1, got, n);
            for (int64_t i = 0; i < n; i++)
                cr_assert_eq(batch[(int64_t)j * n + i], got[i],
                             "%s nb=%d row %d/%lld: interleaved %.9g, rows %.9g",
                             ecs_type_name(c->w.type), nb, j, (long long)i,
                             batch[(int64_t)j * n + i], got[i]);
        }
    }
    kcpu_matmul_q(tp, &c->w, a, 4, batch, n); /* batched tiles from the rows */
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(batch[i], plain[i], "row %lld: tiles from the rows %.9g, one by one %.9g",
                     (long long)i, batch[i], plain[i]);
    /* more rows: the copy's groups take six at a time (Q5_0 from 13 rows
     * rewritten once per group), the rows' tiles all */
    float *g8 = xalloc(sizeof(float) * (size_t)n * R16_ACT_ROWS);
    float *t8 = xalloc(sizeof(float) * (size_t)n * R16_ACT_ROWS);
    for (int nb = 8; nb <= R16_ACT_ROWS; nb += R16_ACT_ROWS - 8) {
        kcpu_matmul_q(tp, &c->wi, c->act, nb, g8, n);
        kcpu_matmul_q(tp, &c->w, c->act, nb, t8, n);
        for (int64_t i = 0; i < n * nb; i++)
            cr_assert_eq(g8[i], t8[i], "%s value %lld of %d rows: copy %.9g, rows %.9g",
                         ecs_type_name(c->w.type), (long long)i, nb, g8[i], t8[i]);
    }
    free(g8), free(t8);
    kcpu_matmul_q(tp, &c->wi, a, 1, got, n);
    kcpu_matmul_q(tp, &c->wi, a, 4, batch, n);
    for (int64_t i = 0; i < n; i++) {
        cr_assert_eq(got[i], plain[i], "%s %lld x %lld row %lld: interleaved %.9g, rows %.9g",
                     ecs_type_name(c->w.type), (long long)n, (long long)c->w.ncols, (long long)i,
                     got[i], plain[i]);
        cr_assert_eq(got[i], batch[i], "row %lld: interleaved %.9g, in a batch of 4 %.9g",
                     (long long)i, got[i], batch[i]);
    }
    /* views: aligned (keeps r16), unaligned (drops it), a partial last group */
    static const int64_t views[][2] = {{16, 16}, {5, 20}, {0, 9}, {16, 23}};
    for (size_t v = 0; v < sizeof views / sizeof views[0]; v++) {
        const int64_t r0 = views[v][0], len = views[v][1];
        if (r0 + len > n)
            continue;
        const kcpu_mat_t sub = kcpu_mat_rows(&c->wi, r0, len);
        cr_assert_eq(sub.r16 != NULL, r0 % KCPU_R16_ROWS == 0, "view at %lld", (long long)r0);
        kcpu_matmul_q(tp, &sub, a, 1, got, len);
        for (int64_t i = 0; i < len; i++)
            cr_assert_eq(got[i], plain[r0 + i], "view [%lld, +%lld) row %lld: %.9g vs %.9g",
                         (long long)r0, (long long)len, (long long)i, got[i], plain[r0 + i]);
        kcpu_matmul_q(tp, &sub, a, 2, batch, len); /* two rows: row 0 is a */
        for (int64_t i = 0; i < len; i++)
            cr_assert_eq(batch[i], plain[r0 + i], "view [%lld, +%lld) nb=2 row %lld",
                         (long long)r0, (long long)len, (long long)i);
    }
    free(plain), free(got), free(batch);
}

static void r16_same_bits(ecs_type_t t, const int64_t (*shapes)[2], size_t nshapes)
{
    rng_t r = {47};
    ecs_threadpool_t *tp1 = NULL, *tp2 = NULL;
    cr_assert_eq(ecs_threadpool_create(1, &tp1), ECS_OK);
    cr_assert_eq(ecs_threadpool_create(2, &tp2), ECS_OK);
    const bool have = kcpu_gemm(t).r16 != NULL;
    for (size_t s = 0; s < nshapes; s++) {
        for (int exact = 0; exact < 2; exact++) {
            r16_case_t c;
            r16_case(&r, t, shapes[s][0], shapes[s][1], exact, &c);
            for (int b = 0; b < 3; b++) {
                r16_check(&c, tp1, b);
                r16_check(&c, tp2, b);
            }
            if (exact) { /* integer sums: the reference's value exactly */
                float *y = xalloc(sizeof(float) * (size_t)c.w.nrows);
                kcpu_matmul_q(tp2, &c.wi, c.act, 1, y, c.w.nrows);
                for (int64_t i = 0; i < c.w.nrows; i++)
                    cr_assert_eq(y[i], ecs_vec_dot_ref(t, c.w.ncols,
                                                       (const uint8_t *)c.w.data +
                                                           (size_t)i * c.w.row_bytes,
                                                       c.act),
                                 "%s exact sums, row %lld", ecs_type_name(t), (long long)i);
                free(y);
            }
            r16_case_free(&c);
        }
    }
    ecs_threadpool_destroy(tp1);
    ecs_threadpool_destroy(tp2);
    cr_log_info("interleaved %s kernel on this ISA: %s", ecs_type_name(t),
                have ? "yes" : "no (rows used)");
}

Test(kernels, r16_same_bits_as_rows_q4_K)
{
    static const int64_t shapes[][2] = {{16, 256}, {48, 512}, {32, 768}, {64, 2048}, {1408, 2048}};
    r16_same_bits(ECS_TYPE_Q4_K, shapes, sizeof shapes / sizeof shapes[0]);
}

/* Q5_0 / Q8_0: whole and short superblocks (1408 = 2 x 512 + 384, 576 =
 * 512 + 64), the ds2 expert down shape. */
Test(kernels, r16_same_bits_as_rows_legacy)
{
    static const int64_t shapes[][2] = {{16, 256}, {48, 1408}, {32, 576}, {64, 2048},
                                        {16, 320}, {2048, 1408}};
    r16_same_bits(ECS_TYPE_Q5_0, shapes, sizeof shapes / sizeof shapes[0]);
    r16_same_bits(ECS_TYPE_Q8_0, shapes, sizeof shapes / sizeof shapes[0]);
}

/* kcpu_matmul_q_pair gives, bit for bit, the two products it stands for:
 * with and without the copy, for one, a few and many rows, and for a pair
 * that cannot share its packing (copy on one side only). */
Test(kernels, matmul_pair_equals_two_products)
{
    static const ecs_type_t types[] = {ECS_TYPE_Q4_K, ECS_TYPE_Q5_0, ECS_TYPE_Q8_0};
    rng_t r = {41};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        r16_case_t a, b;
        r16_case(&r, types[ti], 48, 1408 / 256 * 256, false, &a);
        r16_case(&r, types[ti], 32, 1408 / 256 * 256, false, &b);
        const kcpu_mat_t pairs[][2] = {{a.w, b.w}, {a.wi, b.wi}, {a.wi, b.w}};
        float *y1 = xalloc(sizeof(float) * 48 * R16_ACT_ROWS);
        float *y2 = xalloc(sizeof(float) * 48 * R16_ACT_ROWS);
        float *r1 = xalloc(sizeof(float) * 48 * R16_ACT_ROWS);
        float *r2 = xalloc(sizeof(float) * 48 * R16_ACT_ROWS);
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
            for (int nb = 1; nb <= R16_ACT_ROWS; nb += 7) {
                kcpu_matmul_q_pair(&pairs[p][0], &pairs[p][1], a.act, nb, y1, y2, 48);
                kcpu_matmul_q(NULL, &pairs[p][0], a.act, nb, r1, 48);
                kcpu_matmul_q(NULL, &pairs[p][1], a.act, nb, r2, 48);
                for (int j = 0; j < nb; j++) {
                    cr_assert_eq(memcmp(y1 + 48 * j, r1 + 48 * j, 48 * sizeof(float)), 0,
                                 "%s pair %zu nb=%d row %d: first product",
                                 ecs_type_name(types[ti]), p, nb, j);
                    cr_assert_eq(memcmp(y2 + 48 * j, r2 + 48 * j, 32 * sizeof(float)), 0,
                                 "%s pair %zu nb=%d row %d: second product",
                                 ecs_type_name(types[ti]), p, nb, j);
                }
            }
        }
        free(y1), free(y2), free(r1), free(r2);
        r16_case_free(&a);
        r16_case_free(&b);
    }
}

/* Q4_K: rows packed into the interleaved layout on the fly (products of
 * matrices without the copy) are byte for byte the copy's groups, and a
 * partial group is the copy of its rows followed by zero rows. */
Test(kernels, r16_grp_pack_equals_copy)
{
    const kcpu_gemm_t g = kcpu_gemm(ECS_TYPE_Q4_K);
    if (!g.grp_pack) {
        cr_log_warn("q4_K: products on interleaved groups not on this ISA (%s): skipped",
                    kcpu_isa_name(kcpu_isa()));
        return;
    }
    static const int64_t cols[] = {256, 512, 768, 2048};
    rng_t r = {59};
    for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) {
        r16_case_t c;
        r16_case(&r, ECS_TYPE_Q4_K, 32, cols[ci], false, &c);
        const size_t gb = kcpu_r16_bytes(ECS_TYPE_Q4_K, 16, cols[ci]);
        uint8_t *a = aligned_alloc(64, gb), *z = aligned_alloc(64, gb);
        uint8_t *rows = calloc(16, c.w.row_bytes);
        cr_assert(a && z && rows);
        for (int grp = 0; grp < 2; grp++) {
            memset(a, 0xA5, gb);
            g.grp_pack((const uint8_t *)c.w.data + (size_t)16 * grp * c.w.row_bytes,
                       c.w.row_bytes, 16, cols[ci], a);
            cr_assert_eq(memcmp(a, (const uint8_t *)c.wi.r16 + (size_t)grp * gb, gb), 0,
                         "%lld cols, group %d: packed rows differ from the copy",
                         (long long)cols[ci], grp);
        }
        for (int nr = 1; nr < 16; nr += 7) { /* rows 0..nr-1, then zeros */
            memcpy(rows, c.w.data, (size_t)nr * c.w.row_bytes);
            const kcpu_mat_t part = {ECS_TYPE_Q4_K, cols[ci], 16, c.w.row_bytes, rows, NULL};
            kcpu_r16_pack(&part, 0, 16, z);
            memset(a, 0xA5, gb);
            g.grp_pack(c.w.data, c.w.row_bytes, nr, cols[ci], a);
            cr_assert_eq(memcmp(a, z, gb), 0, "%lld cols, %d rows: partial group differs",
                         (long long)cols[ci], nr);
        }
        free(a), free(z), free(rows);
        r16_case_free(&c);
    }
}

/* Which matrices' rows the products may still read once the copy exists
 * (the model leaves the others' GGUF bytes alone). */
Test(kernels, r16_reads_rows)
{
    static const uint8_t fake[1];
    const ecs_type_t types[] = {ECS_TYPE_Q4_K, ECS_TYPE_Q8_0, ECS_TYPE_Q5_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        kcpu_mat_t w = {types[i], 2048, 64, ecs_row_size(types[i], 2048), fake, NULL};
        cr_assert(kcpu_mat_reads_rows(&w), "%s without a copy", ecs_type_name(types[i]));
        if (!kcpu_gemm(types[i]).r16)
            continue;
        w.r16 = fake;
        cr_assert(!kcpu_mat_reads_rows(&w), "%s with the copy", ecs_type_name(types[i]));
        w.ncols = 128; /* rows shorter than a superblock: the row kernels */
        w.row_bytes = ecs_row_size(types[i], 128);
        cr_assert(kcpu_mat_reads_rows(&w), "%s, 128 columns", ecs_type_name(types[i]));
    }
}

/* Q4_K at the integer extremes: every level 15, every 6-bit scale and min
 * 63, every activation -128 (then +127): the largest scaled group sums a
 * block can have (2^24.9). Every path, with and without the copy, for 1-8
 * activation rows, must give the exact value: a kernel that scales its
 * integer sums up (e.g. the high nibbles taken unshifted, 16 x the level,
 * tried in docs/benchmarks.md) overflows int32 from x 128 on, which this
 * catches (x 256: 6656960 for -57802752). */
Test(kernels, r16_q4_K_extreme_levels_exact)
{
    enum { NR = 16, NC = 512, NA = 8 };
    const size_t rb = ecs_row_size(ECS_TYPE_Q4_K, NC), ab = ecs_row_size(ECS_TYPE_Q8_K, NC);
    ecs_block_q4_K *w = xalloc(rb * NR);
    ecs_block_q8_K *act = xalloc(ab * NA);
    const ecs_fp16_t one = ecs_f32_to_fp16(1.0f);
    for (int i = 0; i < NR * NC / 256; i++) {
        w[i].d = w[i].dmin = one;
        memset(w[i].scales, 0xFF, sizeof w[i].scales);
        memset(w[i].qs, 0xFF, sizeof w[i].qs);
    }
    void *packed = aligned_alloc(64, kcpu_r16_bytes(ECS_TYPE_Q4_K, NR, NC));
    cr_assert_not_null(packed);
    kcpu_mat_t m = {ECS_TYPE_Q4_K, NC, NR, rb, w, NULL};
    kcpu_r16_pack(&m, 0, NR, packed);
    kcpu_mat_t mi = m;
    mi.r16 = packed;
    float y[NA * NR];
    for (int sign = 0; sign < 2; sign++) {
        const int q = sign ? 127 : -128;
        for (int i = 0; i < NA * NC / 256; i++) {
            act[i].d = 1.0f;
            memset(act[i].qs, (uint8_t)(int8_t)q, sizeof act[i].qs);
            for (int j = 0; j < 16; j++)
                act[i].bsums[j] = (int16_t)(16 * q);
        }
        /* per block: I = 8 x 63 x 32 x 15 q, M = 8 x 63 x 32 q; all exact in float */
        const double blk = 8.0 * 63 * 32 * q * (15 - 1);
        const float want = (float)(blk * (NC / 256));
        for (int copy = 0; copy < 2; copy++) {
            for (int nb = 1; nb <= NA; nb++) {
                kcpu_matmul_q(NULL, copy ? &mi : &m, act, nb, y, NR);
                for (int i = 0; i < nb * NR; i++)
                    cr_assert_eq(y[i], want, "q=%d copy=%d nb=%d value %d: %.9g, want %.9g", q,
                                 copy, nb, i, y[i], want);
            }
        }
    }
    free(w), free(act), free(packed);
}

/* Q5_0's fifth bits, one at a time: the copy's kernel picks each value's
 * bit out of the row's qh word (gemm_avx512.c q5_fifth; a layout that moves
 * them, tried in docs/benchmarks.md, must keep this), so a bit taken for
 * another value's must show. Row r's block b has
 * the single bit (r + 5 b) % 32 set (every position 0..31 over the 16 rows),
 * then every bit but that one; random low nibbles, distinct activations.
 * Every path, with and without the copy, 1-8 activation rows, 1 and 2
 * threads: the reference's value exactly (integer sums, scales 1). */
Test(kernels, r16_q5_0_fifth_bits_exact)
{
    enum { NR = 32, NC = 512, NA = 8 };
    const size_t rb = ecs_row_size(ECS_TYPE_Q5_0, NC), ab = ecs_row_size(ECS_TYPE_Q8_0, NC);
    ecs_block_q5_0 *w = xalloc(rb * NR);
    ecs_block_q8_0 *act = xalloc(ab * NA);
    rng_t r = {91};
    const ecs_fp16_t one = ecs_f32_to_fp16(1.0f);
    for (int i = 0; i < NA * NC / ECS_QK; i++) {
        act[i].d = one;
        for (int j = 0; j < ECS_QK; j++)
            act[i].qs[j] = (int8_t)rng_int(&r, -127, 127);
    }
    ecs_threadpool_t *tp2 = NULL;
    cr_assert_eq(ecs_threadpool_create(2, &tp2), ECS_OK);
    void *packed = aligned_alloc(64, kcpu_r16_bytes(ECS_TYPE_Q5_0, NR, NC));
    cr_assert_not_null(packed);
    float want[NA * NR], y[NA * NR];
    for (int inv = 0; inv < 2; inv++) {
        for (int row = 0; row < NR; row++) {
            for (int b = 0; b < NC / ECS_QK; b++) {
                ecs_block_q5_0 *x = &w[row * (NC / ECS_QK) + b];
                x->d = one;
                const uint32_t bit = 1u << ((row + 5 * b) % 32), qh = inv ? ~bit : bit;
                memcpy(x->qh, &qh, 4);
                for (int j = 0; j < ECS_QK / 2; j++)
                    x->qs[j] = (uint8_t)rng_int(&r, 0, 255);
            }
        }
        for (int a = 0; a < NA; a++)
            for (int row = 0; row < NR; row++)
                want[a * NR + row] = ecs_vec_dot_ref(ECS_TYPE_Q5_0, NC, (uint8_t *)w + row * rb,
                                                     (uint8_t *)act + a * ab);
        kcpu_mat_t m = {ECS_TYPE_Q5_0, NC, NR, rb, w, NULL};
        kcpu_r16_pack(&m, 0, NR, packed);
        kcpu_mat_t mi = m;
        mi.r16 = packed;
        for (int copy = 0; copy < 2; copy++) {
            for (int nb = 1; nb <= NA; nb++) {
                for (int th = 1; th <= 2; th++) {
                    kcpu_matmul_q(th == 2 ? tp2 : NULL, copy ? &mi : &m, act, nb, y, NR);
                    for (int i = 0; i < nb * NR; i++)
                        cr_assert_eq(y[i], want[i], "inv=%d copy=%d nb=%d th=%d value %d: %.9g, "
                                     "want %.9g", inv, copy, nb, th, i, y[i], want[i]);
                }
            }
        }
    }
    ecs_threadpool_destroy(tp2);
    free(w), free(act), free(packed);
}

/* ---- log-sum-exp (a sampled row's log-probabilities) ---- */

/* Every ISA within a few float ulps of a long double reference (the
 * scalar path is libm's exp in double, the scheduler's loop before; AVX-512
 * the vector exp), each giving the same bits every call. Lengths with and
 * without a tail, -inf values (masked tokens), one finite value. */
Test(kernels, logsumexp_matches_reference)
{
    const int lens[] = {1, 15, 16, 17, 1000, 102400};
    float *x = malloc(102400 * sizeof *x);
    cr_assert(x);
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int n = lens[li];
        for (int i = 0; i < n; i++)
            x[i] = (i % 97 == 5) ? -INFINITY : 30.0f * sinf(0.37f * (float)i) - 4.0f;
        long double top = x[0], z = 0;
        for (int i = 1; i < n; i++)
            top = fmaxl(top, x[i]);
        for (int i = 0; i < n; i++)
            z += expl((long double)x[i] - top);
        const float want = (float)(top + logl(z));
        for (int isa = 0; isa <= (int)best_isa(); isa++) {
            kcpu_set_isa((kcpu_isa_t)isa);
            const float got = kcpu_logsumexp(x, n), again = kcpu_logsumexp(x, n);
            cr_assert(!memcmp(&got, &again, sizeof got), "n %d isa %d: not deterministic", n, isa);
            cr_assert_float_eq(got, want, 4e-6f * fabsf(want) + 1e-6f, "n %d isa %d: %.9g vs %.9Lg",
                               n, isa, got, (long double)want);
        }
        kcpu_set_isa(best_isa());
    }
    x[0] = 3.5f; /* one finite value among -inf: log(e^0) exactly */
    for (int i = 1; i < 40; i++)
        x[i] = -INFINITY;
    for (int isa = 0; isa <= (int)best_isa(); isa++) {
        kcpu_set_isa((kcpu_isa_t)isa);
        cr_assert_eq(kcpu_logsumexp(x, 40), 3.5f, "isa %d", isa);
    }
    free(x);
}
