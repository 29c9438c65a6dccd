/* test_kernels_dot.c - every SIMD dot product and activation quantizer this
 * CPU can run against the scalar references of common/quant.h: integer sums
 * exact on exact data, realistic quantized data within 1e-6 relative to the
 * magnitude of the accumulated terms (only the float order differs), the
 * activation quantizers byte-identical to ecs_quantize_row (ties and special
 * values included), and log-sum-exp against a long double reference. */
#include "tests/unit/kernels_fixture.h"

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
