/* test_kernels_matmul.c - kcpu_matmul_q / kcpu_matmul for nb in
 * {1,2,3,7,64}, 1 and 2 threads; the batched (gemm) kernels used from
 * KCPU_GEMM_MIN_NB rows on: integer sums exact for every nb from 1 to 64 and
 * odd shapes (rows not a multiple of the microkernel, legacy rows that end
 * inside a 256-value superblock), realistic data within the float tolerance,
 * the same bits for any thread count and tiling; ISA selection and the
 * entry points' bad input. */
#include "tests/unit/kernels_fixture.h"

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
