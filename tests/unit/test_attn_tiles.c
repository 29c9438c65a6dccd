/* test_attn_tiles.c - the decode key split's products on the tile unit
 * (attn_amx.c) against the plain loops, within float rounding of the same
 * products (the tile unit sums in its own order), for query counts around
 * the tile's 16, key counts around its 16 and 32 and the runs a paged cache
 * gives; each query's results the same bits whatever queries share its
 * tiles; and the whole model's decode at depth near the vector kernels'.
 * Every test is skipped by name on a CPU without AMX-BF16. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/model/model.h"
#include "coordinator/model/model_int.h"

#define DS2_Q8 "../shared/models/tiny-ds2-q8_0.gguf"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void need_amx(void)
{
    if (!model_cpu_amx())
        cr_skip_test("test_attn_tiles: this CPU (or kernel) has no AMX-BF16 tiles");
}

/* Relative bound of an F32 sum of n products against its exact value,
 * over the sum of the products' magnitudes: n roundings of 2^-24, with
 * room; the vector kernels' sum and the tile unit's each lie within it. */
static double sum_tol(int n) { return 4.0 * n * ldexp(1.0, -24); }

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    cr_assert_not_null(p);
    memset(p, 0, (bytes + 63) & ~(size_t)63);
    return p;
}

static ecs_bf16_t *rand_bf16(size_t n, float mag)
{
    ecs_bf16_t *x = xalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = ecs_f32_to_bf16(frand() * mag);
    return x;
}

/* ------------------------------------------------------------ scores */

/* nq queries x nt keys of width dk: the tile unit's scores against the
 * plain loops', each within sum_tol of the magnitudes; rows past nq and
 * the S columns of keys [nt, 16-rounded) aside, nothing else written. */
static void check_scores(int nq, int nt, int dk)
{
    const size_t ks = (size_t)dk + 32; /* rows apart, as a cache row's width */
    const int lds = ((nt + 15) & ~15) + 16;
    const model_simd_t *pl = model_simd_plain();
    ecs_bf16_t *K = rand_bf16((size_t)nt * ks, 1.0f), *Q = rand_bf16((size_t)nq * dk, 2.0f);
    const int ng = (nq + 15) / 16;
    float *QT = xalloc((size_t)ng * dk * 16 * sizeof(float));
    for (int j = 0; j < nq; j++)
        model_qt_bf16(QT, j, dk, Q + (size_t)j * dk);
    float *S[2], *kbuf = xalloc((size_t)16 * dk * sizeof(float));
    for (int i = 0; i < 2; i++) {
        S[i] = xalloc((size_t)(ng * 16 + 1) * lds * sizeof(float));
        for (size_t k = 0; k < (size_t)(ng * 16 + 1) * lds; k++)
            S[i][k] = 1234.5f;
    }
    const float scale = 0.125f;
    pl->scores_t(QT, nq, K, ks, MODEL_KV_BF16, dk, nt, scale, S[0], lds, kbuf);
    model_amx_scores(QT, nq, K, ks, dk, nt, scale, S[1], lds, kbuf);
    for (int j = 0; j < nq; j++)
        for (int t = 0; t < nt; t++) {
            double mag = 0;
            for (int d = 0; d < dk; d++)
                mag += fabs((double)ecs_bf16_to_f32(Q[(size_t)j * dk + d]) *
                            ecs_bf16_to_f32(K[(size_t)t * ks + d]));
            const double e = fabs((double)S[1][(size_t)j * lds + t] - S[0][(size_t)j * lds + t]);
            cr_assert(e <= sum_tol(dk) * mag * scale, "scores nq %d nt %d dk %d: [%d][%d] %.9g vs %.9g",
                      nq, nt, dk, j, t, S[1][(size_t)j * lds + t], S[0][(size_t)j * lds + t]);
        }
    for (int j = nq; j < ng * 16 + 1; j++) /* rows past nq untouched */
        for (int t = 0; t < lds; t++)
            cr_assert_eq(S[1][(size_t)j * lds + t], 1234.5f, "scores nq %d: row %d written", nq, j);
    free(K), free(Q), free(QT), free(S[0]), free(S[1]), free(kbuf);
}

Test(amx, scores_near_plain)
{
    need_amx();
    const int nqs[] = {4, 16, 20, 64}, nts[] = {1, 15, 16, 17, 63, 64, 65, 100, 256};
    for (size_t a = 0; a < sizeof nqs / sizeof *nqs; a++)
        for (size_t b = 0; b < sizeof nts / sizeof *nts; b++) {
            check_scores(nqs[a], nts[b], 576);
            check_scores(nqs[a], nts[b], 64);
            check_scores(nqs[a], nts[b], 80);  /* a last chunk of 16 dimensions */
            check_scores(nqs[a], nts[b], 192); /* ds2's expanded heads */
        }
}

/* ---------------------------------------------------------------- P.V */

/* P.V of nq queries over the keys of nrun runs (lengths rn) against the
 * plain loops run after run; query j sees len[j] keys (random, some 0). */
static void check_pv(int nq, const int *rn, int nrun, int dv)
{
    const size_t vs = (size_t)dv + 64; /* a cache row: values, then more */
    int nt = 0;
    for (int r = 0; r < nrun; r++)
        nt += rn[r];
    const int ldp = nt + 16, ng = (nq + 15) / 16;
    const model_simd_t *pl = model_simd_plain();
    ecs_bf16_t *V[8];
    const void *vr[8];
    for (int r = 0; r < nrun; r++)
        V[r] = rand_bf16((size_t)rn[r] * vs, 1.0f), vr[r] = V[r];
    float *P = xalloc((size_t)ng * 16 * ldp * sizeof(float));
    int len[64];
    for (int j = 0; j < nq; j++) {
        len[j] = j % 5 == 4 ? 0 : j % 3 ? nt : 1 + (int)((frand() * 0.5f + 0.5f) * (nt - 1));
        for (int t = 0; t < len[j]; t++) /* BF16 values, as the softmax leaves them */
            P[(size_t)j * ldp + t] = ecs_bf16_to_f32(ecs_f32_to_bf16(frand() * 0.5f + 0.5f));
    }
    for (int j = nq; j < ng * 16; j++) /* rows past nq: anything */
        for (int t = 0; t < ldp; t++)
            P[(size_t)j * ldp + t] = NAN;
    float *O[2];
    for (int i = 0; i < 2; i++)
        O[i] = xalloc((size_t)ng * 16 * dv * sizeof(float));
    int t0 = 0;
    for (int r = 0; r < nrun; r++) {
        int rl[64];
        for (int j = 0; j < nq; j++)
            rl[j] = len[j] - t0 < 0 ? 0 : len[j] - t0 > rn[r] ? rn[r] : len[j] - t0;
        pl->pv(P + t0, nq, ldp, V[r], vs, MODEL_KV_BF16, dv, rl, O[0], dv, r > 0);
        t0 += rn[r];
    }
    void *stage = xalloc(model_amx_pv_stage(nq, nt, dv));
    for (size_t k = 0; k < (size_t)ng * 16 * dv; k++)
        O[1][k] = 1234.5f;
    model_amx_pv(P, nq, ldp, vr, rn, nrun, vs, dv, O[1], dv, false, stage);
    for (int j = 0; j < ng * 16; j++)
        for (int d = 0; d < dv; d++) {
            const double got = O[1][(size_t)j * dv + d];
            if (j >= nq) {
                cr_assert_eq(got, 0.0, "pv nq %d: padding row %d not zero", nq, j);
                continue;
            }
            double mag = 0;
            for (int t = 0, r = 0, u = 0; t < len[j]; t++, u++) {
                if (u == rn[r])
                    r++, u = 0;
                mag += fabs((double)P[(size_t)j * ldp + t] * ecs_bf16_to_f32(V[r][(size_t)u * vs + d]));
            }
            cr_assert(fabs(got - O[0][(size_t)j * dv + d]) <= sum_tol(nt) * mag,
                      "pv nq %d nt %d: [%d][%d] %.9g vs %.9g", nq, nt, j, d, got,
                      O[0][(size_t)j * dv + d]);
        }
    for (int r = 0; r < nrun; r++)
        free(V[r]);
    free(P), free(O[0]), free(O[1]), free(stage);
}

Test(amx, pv_near_plain)
{
    need_amx();
    const int runs[][5] = {{1, 1},       {1, 2},      {1, 31},          {1, 32},
                           {1, 33},      {1, 256},    {2, 64, 37},      {4, 64, 64, 64, 64},
                           {3, 2, 2, 5}, {2, 128, 1}, {4, 64, 64, 64, 63}};
    const int nqs[] = {4, 16, 20, 64};
    for (size_t a = 0; a < sizeof nqs / sizeof *nqs; a++)
        for (size_t b = 0; b < sizeof runs / sizeof *runs; b++) {
            check_pv(nqs[a], runs[b] + 1, runs[b][0], 512);
            check_pv(nqs[a], runs[b] + 1, runs[b][0], 128);
            check_pv(nqs[a], runs[b] + 1, runs[b][0], 64);
        }
}

/* P.V over 300 keys in one call, and in calls over [0, 256) and [256,
 * 300) (runs 64, 64, 128 | 44), the second adding to the first's output
 * (acc): the same bits, as the head split's chunks rely on. */
Test(amx, pv_chunks_add_up_bit_for_bit)
{
    need_amx();
    const int nq = 20, dv = 128, nt = 300, ldp = 320;
    const size_t vs = 576;
    ecs_bf16_t *V = rand_bf16((size_t)nt * vs, 1.0f);
    float *P = xalloc((size_t)32 * ldp * sizeof(float)), *O[2];
    for (int j = 0; j < nq; j++)
        for (int t = 0; t < nt - j; t++)
            P[(size_t)j * ldp + t] = ecs_bf16_to_f32(ecs_f32_to_bf16(frand() * 0.5f + 0.5f));
    void *stage = xalloc(model_amx_pv_stage(nq, nt, dv));
    for (int i = 0; i < 2; i++)
        O[i] = xalloc((size_t)32 * dv * sizeof(float));
    const void *one[1] = {V};
    const int n_one[1] = {nt};
    model_amx_pv(P, nq, ldp, one, n_one, 1, vs, dv, O[0], dv, false, stage);
    const void *first[3] = {V, V + 64 * vs, V + 128 * vs}, *second[1] = {V + 256 * vs};
    const int n_first[3] = {64, 64, 128}, n_second[1] = {44};
    model_amx_pv(P, nq, ldp, first, n_first, 3, vs, dv, O[1], dv, false, stage);
    model_amx_pv(P + 256, nq, ldp, second, n_second, 1, vs, dv, O[1], dv, true, stage);
    cr_assert(memcmp(O[0], O[1], (size_t)nq * dv * sizeof(float)) == 0,
              "P.V in two chunks differs from one call");
    free(V), free(P), free(O[0]), free(O[1]), free(stage);
}

/* ------------------------------------------------ a query's own bits */

/* Query q's scores and P.V row alone (in a group of 16 with zero
 * queries) and as row 21 of 32 other random queries: the same bits, so a
 * request's attention does not depend on what else a step carries. */
Test(amx, query_bits_independent_of_neighbours)
{
    need_amx();
    const int dk = 576, dv = 512, nt = 200, lds = 224;
    ecs_bf16_t *K = rand_bf16((size_t)nt * dk, 1.0f), *Q = rand_bf16((size_t)40 * dk, 2.0f);
    float *QT[2], *S[2], *O[2], *kbuf = xalloc((size_t)16 * dk * sizeof(float));
    const void *vr[1] = {K};
    const int rn[1] = {nt};
    void *stage = xalloc(model_amx_pv_stage(48, nt, dv));
    for (int v = 0; v < 2; v++) {
        QT[v] = xalloc((size_t)3 * dk * 16 * sizeof(float));
        S[v] = xalloc((size_t)48 * lds * sizeof(float));
        O[v] = xalloc((size_t)48 * dv * sizeof(float));
    }
    model_qt_bf16(QT[0], 0, dk, Q); /* alone: query 0 */
    for (int j = 0; j < 40; j++)    /* among others: query 0 at row 21 */
        model_qt_bf16(QT[1], j, dk, Q + (size_t)(j == 21 ? 0 : j == 0 ? 21 : j) * dk);
    const int row[2] = {0, 21}, nq[2] = {1, 40};
    for (int v = 0; v < 2; v++) {
        model_amx_scores(QT[v], nq[v], K, dk, dk, nt, 0.1f, S[v], lds, kbuf);
        for (int j = 0; j < nq[v]; j++) /* as probabilities: BF16 values in [0, 1] */
            for (int t = 0; t < nt; t++) {
                float *s = &S[v][(size_t)j * lds + t];
                *s = ecs_bf16_to_f32(ecs_f32_to_bf16(1.0f / (1.0f + fabsf(*s))));
            }
        model_amx_pv(S[v], nq[v], lds, vr, rn, 1, dk, dv, O[v], dv, false, stage);
    }
    cr_assert(memcmp(S[0], S[1] + (size_t)row[1] * lds, nt * sizeof(float)) == 0,
              "a query's scores depend on the queries beside it");
    cr_assert(memcmp(O[0], O[1] + (size_t)row[1] * dv, dv * sizeof(float)) == 0,
              "a query's P.V depends on the queries beside it");
    for (int v = 0; v < 2; v++)
        free(QT[v]), free(S[v]), free(O[v]);
    free(K), free(Q), free(kbuf), free(stage);
}

/* ------------------------------------------------------- whole model */

/* The logits of a BF16-cache decode past one split block (the key split
 * from the first key), with the tile unit or not: the first PRE tokens in
 * one step (one row of logits; one row a step for all of them took minutes
 * under ASan), then one row a step. */
enum { PRE = 512 };
static float *decode_logits(bool no_amx, int threads, const int32_t *toks, int n, size_t *V,
                            bool *amx)
{
    model_opts_t o = {.n_ctx = 640, .n_threads = threads, .attn_split_min = 1, .no_amx = no_amx};
    model_t *m = NULL;
    cr_assert_eq(model_load(DS2_Q8, &o, &m), ECS_OK, "%s", ecs_errmsg());
    *amx = model_attn_amx(m);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, 640, MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_BF16, &c), ECS_OK,
                 "%s", ecs_errmsg());
    *V = (size_t)model_n_vocab(m);
    float *l = malloc((size_t)(n - PRE + 1) * *V * sizeof *l);
    cr_assert_not_null(l);
    cr_assert_eq(model_eval(c, toks, PRE, l, false), ECS_OK, "%s", ecs_errmsg());
    for (int i = PRE; i < n; i++)
        cr_assert_eq(model_eval(c, toks + i, 1, l + (i - PRE + 1) * *V, false), ECS_OK, "%s",
                     ecs_errmsg());
    model_ctx_free(c);
    model_free(m);
    return l;
}

/* The tile unit's decode: the same bits at 1, 2 and 3 threads; within the
 * tolerance test_attn.c allows a rounded cache (6e-2 of the largest logit
 * on these tiny random models) of the vector kernels'; and not their bits
 * (it ran). */
Test(amx, model_decode_near_vector_kernels, .timeout = 300)
{
    need_amx();
    enum { N = 560 };
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = (int32_t)((frand() * 0.5f + 0.5f) * 30000);
    size_t V;
    bool amx;
    float *vec = decode_logits(true, 2, toks, N, &V, &amx);
    cr_assert(!amx);
    float *first = NULL;
    for (int th = 1; th <= 3; th++) {
        float *l = decode_logits(false, th, toks, N, &V, &amx);
        cr_assert(amx, "the tiny model's shapes do not take the tile path");
        if (!first) {
            first = l;
            continue;
        }
        cr_assert(memcmp(l, first, (size_t)(N - PRE + 1) * V * sizeof *l) == 0,
                  "tile path: %d threads differ from 1", th);
        free(l);
    }
    double d = 0, mx = 0;
    for (size_t i = 0; i < (size_t)(N - PRE + 1) * V; i++)
        d = fmax(d, fabs((double)first[i] - vec[i])), mx = fmax(mx, fabs((double)vec[i]));
    cr_log_info("tile path vs vector kernels: %.2e of the largest logit", d / mx);
    cr_assert(d / mx <= 6e-2, "tile path %.3e from the vector kernels", d / mx);
    cr_assert(d > 0, "the tile path gave the vector kernels' bits: did it run?");
    free(first), free(vec);
}
