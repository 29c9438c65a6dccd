/* test_gpu.c - the CUDA backend's host side: the element decoders the
 * kernels use against common/quant.h's dequantization (bit for bit, so the
 * GPU decodes what the CPU decodes), the kernel's lane passes and shuffle
 * sums run on the CPU against the reference, the CPU reference of the
 * grouped FFN against a float64 computation, the call checks, the loader's errors and
 * the host emulation; on a machine with a GPU, the kernels against the
 * reference for every weight type and 1..256 rows (skipped by name, with
 * the reason, everywhere else). */
#include <stdio.h>

#include "kernels/gpu/deq.h"
#include "tests/unit/gpu_fixture.h"

static const ecs_type_t kernel_types[] = {ECS_TYPE_Q4_K, ECS_TYPE_Q5_K, ECS_TYPE_Q6_K,
                                          ECS_TYPE_Q5_0, ECS_TYPE_Q8_0, ECS_TYPE_F16,
                                          ECS_TYPE_BF16};
#define N_KERNEL_TYPES (sizeof kernel_types / sizeof kernel_types[0])

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- decoders ---- */

/* Random bytes with every half-precision field made finite (a scale that
 * is NaN or inf decodes to NaN in both, and NaN bits may differ). */
static void random_row(ecs_type_t t, uint8_t *row, size_t bytes, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < bytes; i++)
        row[i] = (uint8_t)fx_next(&s);
    const size_t bs = ecs_type_traits(t)->type_size;
    for (size_t b = 0; b < bytes; b += bs) {
        switch (t) {
        case ECS_TYPE_F16:
            row[b + 1] &= 0xBB; /* exponent below 31 */
            break;
        case ECS_TYPE_BF16:
            row[b + 1] &= 0xBF; /* exponent below 255 */
            break;
        case ECS_TYPE_Q6_K:
            row[b + 209] &= 0xBB;
            break;
        case ECS_TYPE_Q4_K:
        case ECS_TYPE_Q5_K:
            row[b + 3] &= 0xBB; /* dmin; d is at 0 as in the legacy types */
            __attribute__((fallthrough));
        default:
            row[b + 1] &= 0xBB;
        }
    }
}

Test(deq, every_element_bit_exact_with_reference)
{
    const int n = 1024;
    float *ref = fx_alloc(sizeof(float) * n), *src = fx_alloc(sizeof(float) * n);
    for (size_t k = 0; k < N_KERNEL_TYPES; k++) {
        const ecs_type_t t = kernel_types[k];
        const size_t bytes = ecs_row_size(t, n);
        uint8_t *row = fx_alloc(bytes);
        for (int trial = 0; trial < 4; trial++) {
            if (trial < 2) { /* what a quantizer writes */
                uint64_t s = 77 + trial;
                for (int i = 0; i < n; i++)
                    src[i] = fx_bell(&s) * (trial ? 1e-3f : 30.0f) * (i % 97 == 1 ? 50.0f : 1.0f);
                ecs_quantize_row(t, src, row, n);
            } else { /* every bit pattern of quants and scales */
                random_row(t, row, bytes, 1000 + trial);
            }
            ecs_dequantize_row(t, row, ref, n);
            for (int i = 0; i < n; i++) {
                const float v = kgpu_deq(t, row, i);
                cr_assert_eq(bits(v), bits(ref[i]), "%s trial %d element %d: %a, reference %a",
                             ecs_type_name(t), trial, i, (double)v, (double)ref[i]);
            }
        }
        free(row);
    }
    free(ref);
    free(src);
}

Test(deq, half_conversion_matches_common_for_all_finite_and_inf)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF))
            continue; /* NaN payloads are not compared */
        cr_assert_eq(bits(kgpu_h2f((uint16_t)h)), bits(ecs_fp16_to_f32((uint16_t)h)),
                     "half 0x%04x", h);
    }
}

Test(deq, row_bytes_match_common_and_refuse_other_types)
{
    for (size_t k = 0; k < N_KERNEL_TYPES; k++)
        for (int64_t n = 256; n <= 4096; n += 256)
            cr_assert_eq((size_t)kgpu_row_bytes(kernel_types[k], n),
                         ecs_row_size(kernel_types[k], n), "%s", ecs_type_name(kernel_types[k]));
    const ecs_type_t other[] = {ECS_TYPE_F32, ECS_TYPE_Q4_0, ECS_TYPE_Q4_1, ECS_TYPE_Q5_1,
                                ECS_TYPE_Q2_K, ECS_TYPE_Q3_K, ECS_TYPE_Q8_K};
    for (size_t k = 0; k < sizeof other / sizeof other[0]; k++) {
        cr_assert_eq(kgpu_row_bytes(other[k], 256), 0);
        cr_assert(!kgpu_type_supported(other[k]));
    }
}

/* ---- the CPU reference ---- */

/* float64 FFN of one row through expert e, weights decoded by kgpu_deq. */
static void ffn_f64(const fx_shard_t *s, int e, const float *x, double *y)
{
    const size_t rg = ecs_row_size(s->tg, s->E), ru = ecs_row_size(s->tu, s->E);
    const size_t rd = ecs_row_size(s->td, s->F);
    double *h = fx_alloc(sizeof(double) * s->F);
    for (int o = 0; o < s->F; o++) {
        double g = 0, u = 0;
        for (int i = 0; i < s->E; i++) {
            g += (double)kgpu_deq(s->tg, s->gate + s->bg * e + rg * o, i) * x[i];
            u += (double)kgpu_deq(s->tu, s->up + s->bu * e + ru * o, i) * x[i];
        }
        h[o] = g / (1.0 + exp(-g)) * u;
    }
    for (int o = 0; o < s->E; o++) {
        double acc = 0;
        for (int i = 0; i < s->F; i++)
            acc += (double)kgpu_deq(s->td, s->down + s->bd * e + rd * o, i) * h[i];
        y[o] = acc;
    }
    free(h);
}

Test(ffn_ref, matches_float64_for_every_type)
{
    const int E = 512, F = 256, R = 3;
    float *x = fx_acts(R, E, 5), *h = fx_alloc(sizeof(float) * R * F);
    float *y = fx_alloc(sizeof(float) * R * E);
    double *y64 = fx_alloc(sizeof(double) * E);
    for (size_t k = 0; k < N_KERNEL_TYPES; k++) {
        const ecs_type_t t = kernel_types[k];
        fx_shard_t s = fx_shard(t, t, t, E, F, 2, 10 + k);
        const kgpu_seg_t segs[] = {fx_seg(&s, 1, 0, 2), fx_seg(&s, 0, 2, 1)};
        const kgpu_ffn_t f = {t, t, t, E, F, segs, 2, R, x, h, y};
        cr_assert_eq(kgpu_ffn_ref(&f), ECS_OK, "%s", ecs_errmsg());
        for (int r = 0; r < R; r++) {
            ffn_f64(&s, r < 2 ? 1 : 0, x + (size_t)r * E, y64);
            double m = 0, d = 0;
            for (int o = 0; o < E; o++) {
                m = fmax(m, fabs(y64[o]));
                d = fmax(d, fabs(y64[o] - y[(size_t)r * E + o]));
            }
            cr_assert(m > 0.1 && d <= 1e-4 * m, "%s row %d: |f32 - f64| %g of %g",
                      ecs_type_name(t), r, d, m);
        }
        fx_shard_free(&s);
    }
    free(x);
    free(h);
    free(y);
    free(y64);
}

/* One grouped product as the kernel kc_grouped computes it: per segment and
 * output feature, passes of KGPU_PASS_ROWS rows; each pass runs
 * kgpu_lane_pass for the 32 lanes and sums them with the shuffle butterfly
 * (lane l adds lane l ^ off, off = 16 .. 1); lane 0's sums are written. */
static void emulate_kernel(const kgpu_ffn_t *f, bool glu)
{
    const int n_out = glu ? f->n_ff : f->n_embd, n_in = glu ? f->n_embd : f->n_ff;
    const ecs_type_t ta = glu ? f->gate_type : f->down_type, tb = glu ? f->up_type : ta;
    const size_t ra = ecs_row_size(ta, n_in), rb = ecs_row_size(tb, n_in);
    const float *in = glu ? f->x : f->h;
    float *out = glu ? f->h : f->y;
    float a[32][KGPU_PASS_ROWS], b[32][KGPU_PASS_ROWS], ta_[32], tb_[32];
    for (int si = 0; si < f->n_segs; si++) {
        const kgpu_seg_t s = f->segs[si];
        for (int o = 0; o < n_out; o++) {
            const uint8_t *wa = (const uint8_t *)(glu ? s.gate : s.down) + (size_t)o * ra;
            const uint8_t *wb = glu ? (const uint8_t *)s.up + (size_t)o * rb : wa;
            for (int r0 = 0; r0 < s.n_rows; r0 += KGPU_PASS_ROWS) {
                const int nr = s.n_rows - r0 < KGPU_PASS_ROWS ? s.n_rows - r0 : KGPU_PASS_ROWS;
                const float *x = in + (size_t)(s.row0 + r0) * n_in;
                for (int l = 0; l < 32; l++)
                    kgpu_lane_pass(ta, wa, tb, wb, glu, n_in, x, nr, l, a[l], b[l]);
                for (int r = 0; r < KGPU_PASS_ROWS; r++) {
                    for (int off = 16; off > 0; off >>= 1) {
                        for (int l = 0; l < 32; l++) {
                            ta_[l] = a[l][r] + a[l ^ off][r];
                            tb_[l] = b[l][r] + b[l ^ off][r];
                        }
                        for (int l = 0; l < 32; l++) {
                            a[l][r] = ta_[l];
                            b[l][r] = tb_[l];
                        }
                    }
                }
                for (int r = 0; r < nr; r++)
                    out[(size_t)(s.row0 + r0 + r) * n_out + o] =
                        glu ? kgpu_swiglu(a[0][r], b[0][r]) : a[0][r];
            }
        }
    }
}

Test(ffn_ref, kernel_lane_passes_match_reference_for_every_type)
{
    const int E = 256, F = 256, R = 27;
    float *x = fx_acts(R, E, 8), *h = fx_alloc(sizeof(float) * R * F);
    float *y = fx_alloc(sizeof(float) * R * E), *yk = fx_alloc(sizeof(float) * R * E);
    for (size_t k = 0; k < N_KERNEL_TYPES; k++) {
        const ecs_type_t t = kernel_types[k], td = kernel_types[(k + 2) % N_KERNEL_TYPES];
        fx_shard_t s = fx_shard(t, kernel_types[(k + 1) % N_KERNEL_TYPES], td, E, F, 3, 20 + k);
        /* partial passes (9 = 8 + 1, 17 = 2 x 8 + 1) and a one-row segment */
        const kgpu_seg_t segs[] = {fx_seg(&s, 2, 0, 9), fx_seg(&s, 0, 9, 1),
                                   fx_seg(&s, 1, 10, 17)};
        kgpu_ffn_t f = {s.tg, s.tu, s.td, E, F, segs, 3, R, x, h, y};
        cr_assert_eq(kgpu_ffn_ref(&f), ECS_OK, "%s", ecs_errmsg());
        f.y = yk;
        emulate_kernel(&f, true);
        emulate_kernel(&f, false);
        const double err = fx_rel_err(yk, y, (size_t)R * E);
        cr_assert(err <= 1e-4, "%s/%s/%s: lane passes vs reference %.3g", ecs_type_name(s.tg),
                  ecs_type_name(s.tu), ecs_type_name(s.td), err);
        fx_shard_free(&s);
    }
    free(x);
    free(h);
    free(y);
    free(yk);
}

Test(ffn_ref, grouped_call_equals_one_call_per_expert)
{
    const int E = 256, F = 512, R = 9;
    fx_shard_t s = fx_shard(ECS_TYPE_Q4_K, ECS_TYPE_Q4_K, ECS_TYPE_Q6_K, E, F, 3, 3);
    float *x = fx_acts(R, E, 9), *h = fx_alloc(sizeof(float) * R * F);
    float *y = fx_alloc(sizeof(float) * R * E), *y1 = fx_alloc(sizeof(float) * R * E);
    const kgpu_seg_t segs[] = {fx_seg(&s, 2, 0, 4), fx_seg(&s, 0, 4, 1), fx_seg(&s, 1, 5, 4)};
    kgpu_ffn_t f = {s.tg, s.tu, s.td, E, F, segs, 3, R, x, h, y};
    cr_assert_eq(kgpu_ffn_ref(&f), ECS_OK, "%s", ecs_errmsg());
    for (int i = 0; i < 3; i++) {
        kgpu_seg_t one = segs[i];
        f.segs = &one;
        f.n_segs = 1;
        f.y = y1;
        cr_assert_eq(kgpu_ffn_ref(&f), ECS_OK);
    }
    cr_assert(memcmp(y, y1, sizeof(float) * R * E) == 0, "grouping changed a result");
    fx_shard_free(&s);
    free(x);
    free(h);
    free(y);
    free(y1);
}

Test(ffn_ref, rejects_bad_calls_with_a_message)
{
    const int E = 256, F = 256;
    fx_shard_t s = fx_shard(ECS_TYPE_Q8_0, ECS_TYPE_Q8_0, ECS_TYPE_Q8_0, E, F, 1, 4);
    float *x = fx_acts(4, E, 1), *h = fx_alloc(sizeof(float) * 4 * F);
    float *y = fx_alloc(sizeof(float) * 4 * E);
    kgpu_seg_t seg = fx_seg(&s, 0, 2, 3); /* rows 2..4 of 4: out of range */
    kgpu_ffn_t f = {s.tg, s.tu, s.td, E, F, &seg, 1, 4, x, h, y};
    cr_assert_eq(kgpu_ffn_ref(&f), ECS_ERR_RANGE);
    cr_assert(strstr(ecs_errmsg(), "segment 0"), "%s", ecs_errmsg());
    seg.row0 = 1;
    cr_assert_eq(kgpu_ffn_check(&f), ECS_OK, "%s", ecs_errmsg());
    f.down_type = ECS_TYPE_Q4_0;
    cr_assert_eq(kgpu_ffn_check(&f), ECS_ERR_UNSUPPORTED);
    cr_assert(strstr(ecs_errmsg(), "q4_0"), "%s", ecs_errmsg());
    f.down_type = ECS_TYPE_Q4_K;
    f.n_ff = 288; /* not whole Q4_K blocks */
    cr_assert_eq(kgpu_ffn_check(&f), ECS_ERR_INVAL);
    f.n_ff = F;
    f.down_type = s.td;
    seg.up = NULL;
    cr_assert_eq(kgpu_ffn_check(&f), ECS_ERR_INVAL);
    f.n_segs = 0; /* an empty call is valid */
    cr_assert_eq(kgpu_ffn_ref(&f), ECS_OK);
    fx_shard_free(&s);
    free(x);
    free(h);
    free(y);
}

/* ---- loader and emulation ---- */

/* Frees n device buffers and closes the device. */
static void free_dev(kgpu_t *g, void **dev, int n)
{
    for (int i = 0; i < n; i++)
        kgpu_free(g, dev[i]);
    kgpu_close(g);
}

Test(loader, missing_library_names_the_path)
{
    kgpu_opts_t o = {.device = 0, .max_segs = 4, .lib = "/nonexistent/libecs_cuda.so"};
    kgpu_t *g = (kgpu_t *)1;
    cr_assert_eq(kgpu_open(&o, &g), ECS_ERR_UNSUPPORTED);
    cr_assert_null(g);
    cr_assert(strstr(ecs_errmsg(), "no GPU backend: cannot load /nonexistent/libecs_cuda.so"),
              "%s", ecs_errmsg());
}

Test(loader, library_without_entry_is_refused)
{
    kgpu_opts_t o = {.device = 0, .max_segs = 4, .lib = "libm.so.6"};
    kgpu_t *g;
    cr_assert_eq(kgpu_open(&o, &g), ECS_ERR_UNSUPPORTED);
    cr_assert(strstr(ecs_errmsg(), "no " KGPU_ENTRY), "%s", ecs_errmsg());
    o.lib = NULL;
    o.max_segs = 0;
    cr_assert_eq(kgpu_open(&o, &g), ECS_ERR_INVAL);
}

Test(loader, emulated_device_runs_the_reference)
{
    const int E = 256, F = 256, R = 5;
    kgpu_opts_t o = {.device = 0, .max_segs = 2, .emulate = true};
    kgpu_t *g;
    cr_assert_eq(kgpu_open(&o, &g), ECS_OK, "%s", ecs_errmsg());
    cr_assert_str_eq(kgpu_name(g), "host emulation");
    fx_shard_t s = fx_shard(ECS_TYPE_Q5_K, ECS_TYPE_Q5_K, ECS_TYPE_Q5_0, E, F, 2, 6);
    float *x = fx_acts(R, E, 2), *h = fx_alloc(sizeof(float) * R * F);
    float *y = fx_alloc(sizeof(float) * R * E), *yd = fx_alloc(sizeof(float) * R * E);
    void *dw, *dx, *dh, *dy;
    cr_assert_eq(kgpu_alloc(g, s.bg * 2, &dw), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, sizeof(float) * R * E, &dx), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, sizeof(float) * R * F, &dh), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, sizeof(float) * R * E, &dy), ECS_OK);
    size_t na, nb;
    kgpu_alloc_stats(g, &na, &nb);
    cr_assert(na == 4 && nb == s.bg * 2 + sizeof(float) * R * (2 * E + F), "%zu, %zu", na, nb);
    cr_assert_eq(kgpu_copy(g, dw, s.gate, s.bg * 2, KGPU_H2D, KGPU_UPLOAD), ECS_OK);
    cr_assert_eq(kgpu_copy(g, dx, x, sizeof(float) * R * E, KGPU_H2D, KGPU_COMPUTE), ECS_OK);
    cr_assert_eq(kgpu_fence(g), ECS_OK);
    kgpu_seg_t hs[] = {fx_seg(&s, 0, 0, 2), fx_seg(&s, 1, 2, 3)}, ds[2];
    memcpy(ds, hs, sizeof hs);
    ds[0].gate = dw;
    ds[1].gate = (uint8_t *)dw + s.bg;
    kgpu_ffn_t f = {s.tg, s.tu, s.td, E, F, ds, 2, R, dx, dh, dy};
    cr_assert_eq(kgpu_ffn(g, &f), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(kgpu_copy(g, yd, dy, sizeof(float) * R * E, KGPU_D2H, KGPU_COMPUTE), ECS_OK);
    cr_assert_eq(kgpu_sync(g, KGPU_COMPUTE), ECS_OK);
    kgpu_ffn_t fr = {s.tg, s.tu, s.td, E, F, hs, 2, R, x, h, y};
    cr_assert_eq(kgpu_ffn_ref(&fr), ECS_OK);
    cr_assert(memcmp(y, yd, sizeof(float) * R * E) == 0);
    kgpu_seg_t three[3] = {ds[0], ds[1], ds[1]};
    f.segs = three;
    f.n_segs = 3; /* more than opened for */
    cr_assert_eq(kgpu_ffn(g, &f), ECS_ERR_RANGE);
    void *dev[] = {dw, dx, dh, dy};
    free_dev(g, dev, 4);
    fx_shard_free(&s);
    free(x);
    free(h);
    free(y);
    free(yd);
}

/* ---- on a GPU: the kernels against the reference ---- */

static kgpu_t *open_gpu(int max_segs)
{
    kgpu_opts_t o = {.device = 0, .max_segs = max_segs};
    kgpu_t *g = NULL;
    if (kgpu_open(&o, &g) != ECS_OK)
        return NULL;
    return g;
}

Test(gpu_device, opens_or_says_why_not)
{
    kgpu_t *g = open_gpu(4);
    if (!g) {
        cr_assert(strncmp(ecs_errmsg(), "no GPU", 6) == 0, "unclear message: %s", ecs_errmsg());
        return;
    }
    fprintf(stderr, "CHECK gpu_open: %s, %zu MiB free\n", kgpu_name(g), kgpu_mem_free(g) >> 20);
    cr_assert(strlen(kgpu_name(g)) > 0);
    kgpu_close(g);
}

#define MAX_ROWS 256

/* Rows 0..n-1 of x go to expert (r * 5 + r / 7) % X; for every n in
 * 1..MAX_ROWS the GPU computes them in one grouped call and every output
 * is compared with the reference of the same row. */
static void device_check(ecs_type_t tg, ecs_type_t tu, ecs_type_t td, int E, int F)
{
    kgpu_t *g = open_gpu(64);
    if (!g)
        cr_skip_test("%s", ecs_errmsg());
    const int X = 8, R = MAX_ROWS;
    fx_shard_t s = fx_shard(tg, tu, td, E, F, X, (uint64_t)tg * 31 + td);
    float *x = fx_acts(R, E, 42), *xg = fx_alloc(sizeof(float) * R * E);
    float *h = fx_alloc(sizeof(float) * R * F), *yref = fx_alloc(sizeof(float) * R * E);
    float *yg = fx_alloc(sizeof(float) * R * E), *yo = fx_alloc(sizeof(float) * R * E);
    int *order = fx_alloc(sizeof(int) * R), cnt[8];
    kgpu_seg_t segs[8], dsegs[8];
    void *dg, *du, *dd, *dx, *dh, *dy;
    cr_assert_eq(kgpu_alloc(g, s.bg * X, &dg), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(kgpu_alloc(g, s.bu * X, &du), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, s.bd * X, &dd), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, sizeof(float) * R * E, &dx), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, sizeof(float) * R * F, &dh), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, sizeof(float) * R * E, &dy), ECS_OK);
    cr_assert_eq(kgpu_copy(g, dg, s.gate, s.bg * X, KGPU_H2D, KGPU_UPLOAD), ECS_OK);
    cr_assert_eq(kgpu_copy(g, du, s.up, s.bu * X, KGPU_H2D, KGPU_UPLOAD), ECS_OK);
    cr_assert_eq(kgpu_copy(g, dd, s.down, s.bd * X, KGPU_H2D, KGPU_UPLOAD), ECS_OK);
    cr_assert_eq(kgpu_fence(g), ECS_OK);
    double worst = 0;
    for (int n = R; n >= 1; n--) { /* n = R first: its reference serves every n */
        int ns = 0, j = 0;
        memset(cnt, 0, sizeof cnt);
        for (int r = 0; r < n; r++)
            cnt[(r * 5 + r / 7) % X]++;
        for (int e = 0; e < X; e++) {
            if (!cnt[e])
                continue;
            segs[ns] = fx_seg(&s, e, j, cnt[e]);
            dsegs[ns] = (kgpu_seg_t){(uint8_t *)dg + s.bg * e, (uint8_t *)du + s.bu * e,
                                     (uint8_t *)dd + s.bd * e, j, cnt[e]};
            ns++;
            for (int r = 0; r < n; r++)
                if ((r * 5 + r / 7) % X == e)
                    order[j++] = r;
        }
        for (int i = 0; i < n; i++)
            memcpy(xg + (size_t)i * E, x + (size_t)order[i] * E, sizeof(float) * E);
        if (n == R) {
            kgpu_ffn_t fr = {tg, tu, td, E, F, segs, ns, n, xg, h, yg};
            cr_assert_eq(kgpu_ffn_ref(&fr), ECS_OK, "%s", ecs_errmsg());
            for (int i = 0; i < n; i++)
                memcpy(yref + (size_t)order[i] * E, yg + (size_t)i * E, sizeof(float) * E);
        }
        kgpu_ffn_t f = {tg, tu, td, E, F, dsegs, ns, n, dx, dh, dy};
        cr_assert_eq(kgpu_copy(g, dx, xg, sizeof(float) * n * E, KGPU_H2D, KGPU_COMPUTE),
                     ECS_OK);
        cr_assert_eq(kgpu_ffn(g, &f), ECS_OK, "%s", ecs_errmsg());
        cr_assert_eq(kgpu_copy(g, yg, dy, sizeof(float) * n * E, KGPU_D2H, KGPU_COMPUTE),
                     ECS_OK);
        cr_assert_eq(kgpu_sync(g, KGPU_COMPUTE), ECS_OK, "%s", ecs_errmsg());
        for (int i = 0; i < n; i++)
            memcpy(yo + (size_t)order[i] * E, yg + (size_t)i * E, sizeof(float) * E);
        const double err = fx_rel_err(yo, yref, (size_t)n * E);
        cr_assert(err <= GPU_TOL, "%s/%s/%s %d rows: relative error %.3g > %g",
                  ecs_type_name(tg), ecs_type_name(tu), ecs_type_name(td), n, err, GPU_TOL);
        worst = fmax(worst, err);
    }
    fprintf(stderr, "CHECK gpu_kernels %s/%s/%s %dx%d: rows 1..%d ok, max rel err %.2e (tol %g)\n",
            ecs_type_name(tg), ecs_type_name(tu), ecs_type_name(td), E, F, R, worst, GPU_TOL);
    void *dev[] = {dg, du, dd, dx, dh, dy};
    free_dev(g, dev, 6);
    fx_shard_free(&s);
    free(x);
    free(xg);
    free(h);
    free(yref);
    free(yg);
    free(yo);
    free(order);
}

#define DEVICE_TEST(name, tg, tu, td, E, F)                                                        \
    Test(gpu_device, name) { device_check(ECS_TYPE_##tg, ECS_TYPE_##tu, ECS_TYPE_##td, E, F); }

DEVICE_TEST(kernels_q4_K, Q4_K, Q4_K, Q4_K, 512, 256)
DEVICE_TEST(kernels_q5_K, Q5_K, Q5_K, Q5_K, 512, 256)
DEVICE_TEST(kernels_q6_K, Q6_K, Q6_K, Q6_K, 512, 256)
DEVICE_TEST(kernels_q5_0, Q5_0, Q5_0, Q5_0, 512, 352)
DEVICE_TEST(kernels_q8_0, Q8_0, Q8_0, Q8_0, 512, 352)
DEVICE_TEST(kernels_f16, F16, F16, F16, 512, 352)
DEVICE_TEST(kernels_bf16, BF16, BF16, BF16, 512, 352)
/* DeepSeek-V2-Lite Q4_K_M's mixes: its n_ff of 1408 is not whole k-quant
 * blocks, so down is Q5_0 / Q8_0 there; Q6_K where the shape allows */
DEVICE_TEST(kernels_q4_K_q5_0, Q4_K, Q4_K, Q5_0, 512, 1408)
DEVICE_TEST(kernels_q4_K_q6_K, Q4_K, Q4_K, Q6_K, 512, 512)
