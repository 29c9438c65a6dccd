/* test_kernels_r16.c - row-interleaved (r16) weights: which shapes get a
 * layout, the same bits as the plain rows for every thread count (exact and
 * realistic data, Q4_K and the legacy types), the pair product, packing,
 * reading rows back, and the extreme levels and fifth bits exactly. */
#include "tests/unit/kernels_fixture.h"

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
