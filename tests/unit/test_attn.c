/* test_attn.c - the decode split of latent attention (attn.c) and its
 * transposed-query scores kernel (model_simd_t.scores_t): the kernel gives
 * the bits of the scores kernel on every ISA, for every query count, key
 * count, width and cache type; the key split gives the same logits bit for
 * bit for every thread count and step size, near the head split's. The
 * AVX-512 P.V sums each key in key order (one fused multiply-add), in
 * whatever blocks of keys, rows and columns. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/model/model.h"
#include "coordinator/model/model_int.h"

#define DS2_Q8 "../shared/models/tiny-ds2-q8_0.gguf"

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* ------------------------------------------------------- scores_t kernel */

/* Scores of nq random queries against nt random keys of width dk by
 * scores (row-major queries) and scores_t (transposed groups) of sd and of
 * the plain loops; all must agree (the plain and SIMD ones up to float
 * summation order). */
static void check_scores_t(const model_simd_t *sd, int nq, int nt, int dk, model_kvt_t kt,
                           int wide)
{
    const model_simd_t *pl = model_simd_plain();
    const int dkp = (dk + 15) & ~15, nqp = (nq + 3) & ~3, ng = (nq + 15) / 16;
    const int lds = (nt + 15) & ~15;
    const size_t elt = model_kvt_size(kt);
    const int f16 = kt; /* in the messages: 0 F16, 1 BF16, 2 F32 */
    const size_t ks = (size_t)dk + wide; /* rows as wide as the keys, or wider */
    void *K = malloc((size_t)nt * ks * elt);
    float *Q = aligned_alloc(64, (size_t)nqp * dkp * sizeof(float));
    float *QT = aligned_alloc(64, (size_t)ng * 16 * dk * sizeof(float));
    float *S[3];
    float *kbuf = aligned_alloc(64, (size_t)32 * dkp * sizeof(float));
    cr_assert(K && Q && QT && kbuf);
    for (int i = 0; i < 3; i++) {
        S[i] = aligned_alloc(64, (size_t)nqp * lds * sizeof(float));
        cr_assert_not_null(S[i]);
    }
    for (size_t i = 0; i < (size_t)nt * ks; i++) {
        const float v = frand();
        if (kt == MODEL_KV_F16)
            ((ecs_fp16_t *)K)[i] = ecs_f32_to_fp16(v);
        else if (kt == MODEL_KV_BF16)
            ((ecs_bf16_t *)K)[i] = ecs_f32_to_bf16(v);
        else
            ((float *)K)[i] = v;
    }
    memset(Q, 0, (size_t)nqp * dkp * sizeof(float));
    memset(QT, 0, (size_t)ng * 16 * dk * sizeof(float));
    int len[MODEL_ATT_QMAX];
    for (int j = 0; j < nqp; j++) {
        len[j] = j < nq ? nt : 0;
        for (int d = 0; j < nq && d < dk; d++) {
            const float v = ecs_fp16_to_f32(ecs_f32_to_fp16(frand()));
            if (kt == MODEL_KV_BF16) {
                ((ecs_bf16_t *)(Q + (size_t)j * dkp))[d] = ecs_f32_to_bf16(v);
                continue;
            }
            Q[(size_t)j * dkp + d] = v;
            QT[(size_t)(j / 16) * dk * 16 + (size_t)d * 16 + j % 16] = v;
        }
        if (kt == MODEL_KV_BF16 && j < nq)
            model_qt_bf16(QT, j, dk, (const ecs_bf16_t *)(Q + (size_t)j * dkp));
    }
    const float scale = 0.125f;
    sd->scores(Q, nqp, dkp, K, ks, kt, dk, dkp, len, nt, scale, S[0], lds, kbuf);
    sd->scores_t(QT, nq, K, ks, kt, dk, nt, scale, S[1], lds, kbuf);
    pl->scores_t(QT, nq, K, ks, kt, dk, nt, scale, S[2], lds, kbuf);
    for (int j = 0; j < nq; j++)
        for (int t = 0; t < nt; t++) {
            const size_t i = (size_t)j * lds + t;
            cr_assert(S[0][i] == S[1][i], "nq %d nt %d dk %d f16 %d: (%d, %d) %a vs %a", nq, nt,
                      dk, f16, j, t, S[0][i], S[1][i]);
            /* BF16: the kernel sums in the plain loops' order, exactly */
            cr_assert(kt == MODEL_KV_BF16 ? S[2][i] == S[1][i]
                                          : fabsf(S[2][i] - S[1][i]) <= 1e-5f * (1.0f + fabsf(S[2][i])),
                      "plain vs %s: (%d, %d) %g vs %g", sd == pl ? "plain" : "simd", j, t, S[2][i],
                      S[1][i]);
        }
    /* the plain kernels define the results: the two plain forms agree exactly */
    pl->scores(Q, nqp, dkp, K, ks, kt, dk, dkp, len, nt, scale, S[0], lds, kbuf);
    for (int j = 0; j < nq; j++)
        for (int t = 0; t < nt; t++)
            cr_assert(S[0][(size_t)j * lds + t] == S[2][(size_t)j * lds + t]);
    for (int i = 0; i < 3; i++)
        free(S[i]);
    free(K), free(Q), free(QT), free(kbuf);
}

Test(scores_t, equals_scores_bit_for_bit)
{
    const model_simd_t *isas[2] = {model_simd_plain(), model_simd_avx512()};
    if (!isas[1] || kcpu_isa_detect() < KCPU_ISA_AVX512)
        cr_log_warn("no AVX-512 on this CPU: only the plain kernels are compared");
    const int nqs[] = {1, 4, 15, 16, 17, 36, 64};
    const int nts[] = {1, 15, 16, 17, 31, 33, 48, 100}; /* 32-key blocks and tails */
    const int dks[] = {16, 40, 576};
    for (int s = 0; s < 2; s++) {
        if (!isas[s] || (s == 1 && kcpu_isa_detect() < KCPU_ISA_AVX512))
            continue;
        for (size_t a = 0; a < sizeof nqs / sizeof *nqs; a++)
            for (size_t b = 0; b < sizeof nts / sizeof *nts; b++)
                for (size_t c = 0; c < sizeof dks / sizeof *dks; c++)
                    for (int f = 0; f < 3; f++)
                        /* wide 0 with dk 576: the BF16 kernel's constant stride */
                        for (int wide = 0; wide <= 3; wide += 3)
                            check_scores_t(isas[s], nqs[a], nts[b], dks[c], (model_kvt_t)f, wide);
    }
}

/* ------------------------------------------------------------- P.V kernel */

/* The AVX-512 P.V over an F16 or F32 cache against one fused multiply-add
 * per key in key order (the kernel's sums, whatever its blocking of rows,
 * columns and keys): query j sees len[j] keys (causal, a prompt's rows),
 * its probabilities past them zero as softmax leaves them; acc continues
 * sums already in O. */
static void check_pv(int nq, int nt, int dv, model_kvt_t kt, bool acc)
{
    const model_simd_t *sd = model_simd_avx512();
    const size_t vs = (size_t)dv + 5, elt = model_kvt_size(kt);
    const int ldp = (nt + 15) & ~15, ldo = dv + 3;
    void *V = malloc((size_t)nt * vs * elt);
    float *P = calloc((size_t)nq * ldp, sizeof *P), *O = malloc((size_t)nq * ldo * sizeof *O);
    float *want = malloc((size_t)nq * ldo * sizeof *want);
    cr_assert(V && P && O && want);
    for (size_t i = 0; i < (size_t)nt * vs; i++) {
        const float v = frand();
        if (kt == MODEL_KV_F16)
            ((ecs_fp16_t *)V)[i] = ecs_f32_to_fp16(v);
        else
            ((float *)V)[i] = v;
    }
    int len[MODEL_ATT_QMAX];
    for (int j = 0; j < nq; j++) {
        len[j] = nt - (nq - 1 - j) * 3 > 0 ? nt - (nq - 1 - j) * 3 : 1;
        for (int t = 0; t < len[j]; t++)
            P[(size_t)j * ldp + t] = (frand() + 1.0f) / (float)len[j];
        for (int d = 0; d < ldo; d++)
            O[(size_t)j * ldo + d] = want[(size_t)j * ldo + d] = acc ? frand() : 0.0f;
    }
    for (int j = 0; j < nq; j++)
        for (int d = 0; d < dv; d++) {
            float o = want[(size_t)j * ldo + d];
            for (int t = 0; t < len[j]; t++) {
                const size_t i = (size_t)t * vs + (size_t)d;
                const float v = kt == MODEL_KV_F16 ? ecs_fp16_to_f32(((ecs_fp16_t *)V)[i])
                                                   : ((float *)V)[i];
                o = fmaf(P[(size_t)j * ldp + t], v, o);
            }
            want[(size_t)j * ldo + d] = o;
        }
    sd->pv(P, nq, ldp, V, vs, kt, dv, len, O, ldo, acc);
    for (int j = 0; j < nq; j++)
        for (int d = 0; d < dv; d++)
            cr_assert(O[(size_t)j * ldo + d] == want[(size_t)j * ldo + d],
                      "nq %d nt %d dv %d f16 %d acc %d: O[%d][%d] %a vs %a", nq, nt, dv,
                      kt == MODEL_KV_F16, acc, j, d, O[(size_t)j * ldo + d],
                      want[(size_t)j * ldo + d]);
    free(V), free(P), free(O), free(want);
}

Test(pv, avx512_sums_each_key_in_order)
{
    if (!model_simd_avx512() || kcpu_isa_detect() < KCPU_ISA_AVX512) {
        cr_skip_test("no AVX-512 on this CPU");
        return;
    }
    const int nqs[] = {4, 12, 64}, nts[] = {1, 100, 256, 257, 700}, dvs[] = {128, 200};
    for (size_t a = 0; a < sizeof nqs / sizeof *nqs; a++)
        for (size_t b = 0; b < sizeof nts / sizeof *nts; b++)
            for (size_t c = 0; c < sizeof dvs / sizeof *dvs; c++)
                for (int f = 0; f < 2; f++)
                    check_pv(nqs[a], nts[b], dvs[c], f ? MODEL_KV_F32 : MODEL_KV_F16, b % 2);
}

/* ------------------------------------------------ key split vs head split */

/* The logits of each step's last row, evaluating step rows at a time
 * (a difference anywhere reaches them through the cache); *V: vocabulary. */
/* Logits of the last row of each step of `step` rows after the first
 * `pre` tokens, which go in one step (their logits dropped: the deep tests
 * need the cache, not its rows). */
static float *eval_steps(int split_min, int threads, unsigned flags, const int32_t *toks, int n,
                         int pre, int step, int n_ctx, size_t *V)
{
    model_opts_t o = {.n_ctx = n_ctx, .n_threads = threads, .attn_split_min = split_min};
    model_t *m = NULL;
    cr_assert_eq(model_load(DS2_Q8, &o, &m), ECS_OK, "%s", ecs_errmsg());
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, n_ctx, flags, &c), ECS_OK, "%s", ecs_errmsg());
    *V = (size_t)model_n_vocab(m);
    const int ns = (n - pre + step - 1) / step;
    float *l = malloc(((size_t)ns + 1) * *V * sizeof *l);
    cr_assert_not_null(l);
    if (pre > 0)
        cr_assert_eq(model_eval(c, toks, pre, l, false), ECS_OK, "%s", ecs_errmsg());
    toks += pre, n -= pre;
    for (int i = 0; i < ns; i++) {
        const int k = n - i * step < step ? n - i * step : step;
        cr_assert_eq(model_eval(c, toks + i * step, k, l + i * *V, false), ECS_OK, "%s",
                     ecs_errmsg());
    }
    model_ctx_free(c);
    model_free(m);
    return l;
}

/* The bound on the key split against the head split, relative to the
 * largest logit: that of a rounded cache against F32 (test_kv_bf16.c);
 * these tiny random models' flat logits amplify any rounding. Seen:
 * 2.1-4.1e-2. */
#define SPLIT_TOL 6e-2

/* max |a - b| over max |b| */
static double rel_diff(const float *a, const float *b, size_t cnt)
{
    double d = 0.0, mx = 0.0;
    for (size_t i = 0; i < cnt; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / mx;
}

/* The key split with 1, 2 and 3 threads: the same bits; against the head
 * split (the softmax over all keys at once) within tol: the key split's
 * online softmax sums its blocks in another order and rounds exp(s - the
 * block's max) instead of the normalized probability. With step > 1 also
 * the same bits as one row a step (each query's blocks are its own). */
static void check_split(unsigned flags, int n, int pre, int step, int n_ctx, double tol)
{
    int32_t *toks = malloc((size_t)n * sizeof *toks);
    cr_assert_not_null(toks);
    for (int i = 0; i < n; i++)
        toks[i] = (int32_t)((frand() * 0.5f + 0.5f) * 30000);
    size_t V;
    float *ref = eval_steps(-1, 2, flags, toks, n, pre, step, n_ctx, &V);
    const size_t cnt = (size_t)(n - pre + step - 1) / step * V;
    const int threads[3] = {1, 2, 3};
    float *first = NULL;
    for (int i = 0; i < 3; i++) {
        float *l = eval_steps(1, threads[i], flags, toks, n, pre, step, n_ctx, &V);
        if (!first) {
            first = l;
            const double d = rel_diff(l, ref, cnt);
            cr_log_info("flags %u step %d: key split vs head split %.2e", flags, step, d);
            cr_assert(d <= tol, "flags %u step %d: key split %.3e from the head split", flags,
                      step, d);
            continue;
        }
        cr_assert(memcmp(l, first, cnt * sizeof *l) == 0,
                  "flags %u step %d: key split, %d threads, differs from 1 thread", flags, step,
                  threads[i]);
        free(l);
    }
    if (step > 2) { /* rows ending a step of both sizes (both split: <= MODEL_FUSED_ROWS) */
        const int s2 = step - 1;
        float *l2 = eval_steps(1, 2, flags, toks, n, pre, s2, n_ctx, &V);
        int both = 0;
        for (int p = 0; p < n - pre; p++) /* p: rows after the first step */
            if ((p + 1) % step == 0 && (p + 1) % s2 == 0) {
                cr_assert(memcmp(l2 + (size_t)(p / s2) * V, first + (size_t)(p / step) * V,
                                 V * sizeof *l2) == 0,
                          "flags %u: key split, row %d: steps of %d and %d differ", flags, pre + p,
                          step, s2);
                both++;
            }
        cr_assert_gt(both, 0);
        free(l2);
    }
    free(first);
    free(ref);
    free(toks);
}

/* The key split on F16 and BF16 caches against the head split on an F32
 * cache (nothing rounded): within SPLIT_TOL, as any rounded cache. */
static void check_vs_f32(int n, int pre, int step, int n_ctx)
{
    int32_t *toks = malloc((size_t)n * sizeof *toks);
    cr_assert_not_null(toks);
    for (int i = 0; i < n; i++)
        toks[i] = (int32_t)((frand() * 0.5f + 0.5f) * 30000);
    size_t V;
    float *ref = eval_steps(-1, 2, MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_F32, toks, n, pre, step,
                            n_ctx, &V);
    const size_t cnt = (size_t)(n - pre + step - 1) / step * V;
    const unsigned kinds[2] = {0, MODEL_CTX_KV_BF16};
    for (int k = 0; k < 2; k++) {
        float *l = eval_steps(1, 2, MODEL_CTX_MLA_ABSORBED | kinds[k], toks, n, pre, step, n_ctx,
                              &V);
        const double d = rel_diff(l, ref, cnt);
        cr_log_info("key split, cache flags %u, vs F32: %.2e", kinds[k], d);
        cr_assert(d <= SPLIT_TOL, "key split, cache flags %u: %.3e from F32's", kinds[k], d);
        free(l);
    }
    free(ref);
    free(toks);
}

/* Decode steps of one row; steps of 3 rows of the absorbed path (one tile
 * of 3 rows); F16 and F32 caches. */
Test(split, same_bits_as_head_split_short)
{
    check_split(0, 24, 0, 1, 64, SPLIT_TOL);
    check_split(MODEL_CTX_KV_F32, 24, 0, 1, 64, SPLIT_TOL);
    check_split(MODEL_CTX_KV_BF16, 24, 0, 1, 64, SPLIT_TOL);
    check_split(MODEL_CTX_MLA_ABSORBED, 24, 0, 3, 64, SPLIT_TOL);
    check_split(MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_BF16, 24, 0, 3, 64, SPLIT_TOL);
}

/* Past one run of keys (512): several scores items, a partial last one.
 * The first 512 tokens go in one step (the steps of 4 before them cost
 * minutes under ASan and test nothing the short test does not). */
Test(split, same_bits_as_head_split_deep, .timeout = 300)
{
    check_split(MODEL_CTX_MLA_ABSORBED, 600, 512, 4, 640, SPLIT_TOL);
    check_split(MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_BF16, 600, 512, 4, 640, SPLIT_TOL);
    check_vs_f32(600, 512, 4, 640);
}

/* ------------------------------------------------ the merge: wsum kernel */

/* model_simd_t.wsum of the ISA against the plain loop, bit for bit, for
 * widths around the vector's and the register block's (64), and block
 * counts 1..17 (4096 keys of decode: 17 blocks). */
Test(wsum, equals_plain_bit_for_bit)
{
    const model_simd_t *pl = model_simd_plain(), *sd = model_simd();
    const int ns[] = {1, 15, 16, 17, 63, 64, 65, 100, 512};
    const int nbs[] = {1, 2, 5, 17};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof nbs / sizeof *nbs; b++) {
            const int n = ns[a], nb = nbs[b];
            const size_t xs = (size_t)n + 7;
            float *x = malloc(xs * nb * sizeof *x), w[17];
            float *o1 = malloc(((size_t)n + 1) * sizeof *o1), *o2 = malloc(((size_t)n + 1) * sizeof *o2);
            cr_assert(x && o1 && o2);
            for (size_t i = 0; i < xs * nb; i++)
                x[i] = frand() * 3.0f;
            for (int i = 0; i < nb; i++)
                w[i] = frand() * 0.5f + 0.5f;
            o1[n] = o2[n] = 42.0f; /* past n: untouched */
            const float sc = 1.0f / (1.0f + 10.0f * (frand() + 1.0f));
            pl->wsum(o1, n, x, xs, w, nb, sc);
            sd->wsum(o2, n, x, xs, w, nb, sc);
            cr_assert(memcmp(o1, o2, ((size_t)n + 1) * sizeof *o1) == 0, "wsum n %d nb %d", n, nb);
            cr_assert_eq(o2[n], 42.0f);
            double ref = 0.0;
            for (int i = 0; i < nb; i++)
                ref += (double)w[i] * x[(size_t)i * xs + n - 1];
            cr_assert(fabs(o1[n - 1] - ref * sc) <= 1e-5 * (1.0 + fabs(ref)), "wsum n %d nb %d", n,
                      nb);
            free(x), free(o1), free(o2);
        }
}

/* --------------------------------------- the key split's block softmax
 * With mx and sum asked for (the key split's blocks) the softmax stores
 * exp(s - max) rounded to the cache type, zero past each row's len up to
 * nt, and its max and sum are those of the unrounded exponentials: the F32
 * run's values rounded give the F16 and BF16 runs' bits. */
Test(softmax, block_rounds_each_exponential_as_stored)
{
    const model_simd_t *sd = model_simd();
    enum { NQ = 5, NT = 83, LDS = 96 };
    const int len[NQ] = {0, 1, 16, 47, NT};
    static float S[NQ * LDS], R[3][NQ * LDS];
    for (int i = 0; i < NQ * LDS; i++)
        S[i] = frand() * 8.0f;
    const model_kvt_t kts[3] = {MODEL_KV_F32, MODEL_KV_F16, MODEL_KV_BF16};
    float mx[3][NQ], sum[3][NQ];
    for (int k = 0; k < 3; k++) {
        memcpy(R[k], S, sizeof S);
        sd->softmax(R[k], NQ, LDS, len, NT, kts[k], mx[k], sum[k]);
    }
    for (int j = 0; j < NQ; j++) {
        for (int k = 1; k < 3; k++)
            cr_assert(mx[k][j] == mx[0][j] && sum[k][j] == sum[0][j], "row %d kt %d", j, k);
        for (int t = 0; t < NT; t++) {
            const float e = R[0][j * LDS + t];
            if (t >= len[j]) {
                for (int k = 0; k < 3; k++)
                    cr_assert(R[k][j * LDS + t] == 0.0f, "row %d key %d past len", j, t);
                continue;
            }
            cr_assert(e > 0.0f && e <= 1.0f, "row %d key %d: %g", j, t, e);
            const float h = ecs_fp16_to_f32(ecs_f32_to_fp16(e));
            const float b = ecs_bf16_to_f32(ecs_f32_to_bf16(e));
            cr_assert(memcmp(&R[1][j * LDS + t], &h, sizeof h) == 0, "F16 row %d key %d", j, t);
            cr_assert(memcmp(&R[2][j * LDS + t], &b, sizeof b) == 0, "BF16 row %d key %d", j, t);
        }
        for (int t = NT; t < LDS; t++) /* past nt: untouched */
            cr_assert(memcmp(&R[0][j * LDS + t], &S[j * LDS + t], sizeof(float)) == 0);
    }
}

/* ------------------------------------- several sequences in one decode step
 * Two sequences decoding in one step take the key split tile by tile (a
 * merge region per tile, then the values); one alone merges inside the
 * values' region: the same bits either way. */
static void two_sequences(unsigned flags, int threads)
{
    model_opts_t o = {.n_ctx = 640, .n_threads = threads, .attn_split_min = 1};
    model_t *m = NULL;
    cr_assert_eq(model_load(DS2_Q8, &o, &m), ECS_OK, "%s", ecs_errmsg());
    const size_t V = (size_t)model_n_vocab(m);
    const int lens[2] = {300, 530};
    model_ctx_t *c[2][2];
    int32_t *toks = malloc(540 * sizeof *toks);
    float *l = malloc(4 * V * sizeof *l);
    cr_assert(toks && l);
    for (int i = 0; i < 540; i++)
        toks[i] = (int32_t)((frand() * 0.5f + 0.5f) * 30000);
    for (int s = 0; s < 2; s++) /* s 0: alone, s 1: in one step */
        for (int q = 0; q < 2; q++) {
            cr_assert_eq(model_ctx_new(m, 640, flags, &c[s][q]), ECS_OK, "%s", ecs_errmsg());
            cr_assert_eq(model_eval(c[s][q], toks + q * 5, lens[q], NULL, false), ECS_OK, "%s",
                         ecs_errmsg());
        }
    for (int step = 0; step < 3; step++) {
        for (int q = 0; q < 2; q++)
            cr_assert_eq(model_eval(c[0][q], toks + 500 + step + q, 1, l + q * V, false), ECS_OK,
                         "%s", ecs_errmsg());
        const model_row_t rows[2] = {{c[1][0], toks[500 + step], true},
                                     {c[1][1], toks[501 + step], true}};
        cr_assert_eq(model_eval_batch(m, rows, 2, l + 2 * V), ECS_OK, "%s", ecs_errmsg());
        cr_assert(memcmp(l, l + 2 * V, 2 * V * sizeof *l) == 0,
                  "flags %u, %d threads, step %d: two sequences in one step differ from alone",
                  flags, threads, step);
    }
    for (int s = 0; s < 2; s++)
        for (int q = 0; q < 2; q++)
            model_ctx_free(c[s][q]);
    free(l), free(toks);
    model_free(m);
}

Test(split, two_sequences_one_step_same_bits, .timeout = 300)
{
    two_sequences(MODEL_CTX_MLA_ABSORBED, 2);
    two_sequences(MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_BF16, 3);
}

/* ------------------------------------- a row's attention, whatever the step
 * The key split and the head split differ in their last bits, so each row
 * takes the one its own depth picks (attn_split_min, 512 here, as by
 * default), whatever else the step holds: ns sequences at depths lens
 * decoded one row each in one step give each one's logits alone, bit for
 * bit. Failed when the deepest row chose for the whole step, and when
 * more than MODEL_FUSED_ROWS rows took the head split. */
static void step_vs_alone(unsigned flags, int threads, const int *lens, int ns)
{
    model_opts_t o = {.n_ctx = 640, .n_threads = threads, .attn_split_min = 512};
    model_t *m = NULL;
    cr_assert_eq(model_load(DS2_Q8, &o, &m), ECS_OK, "%s", ecs_errmsg());
    const size_t V = (size_t)model_n_vocab(m);
    enum { NS = 6 };
    cr_assert(ns <= NS);
    model_ctx_t *c[2][NS];
    int32_t *toks = malloc(600 * sizeof *toks);
    float *l = malloc(2 * NS * V * sizeof *l);
    cr_assert(toks && l);
    for (int i = 0; i < 600; i++)
        toks[i] = (int32_t)((frand() * 0.5f + 0.5f) * 30000);
    for (int s = 0; s < 2; s++) /* s 0: alone, s 1: in one step */
        for (int q = 0; q < ns; q++) {
            cr_assert_eq(model_ctx_new(m, 640, flags, &c[s][q]), ECS_OK, "%s", ecs_errmsg());
            cr_assert_eq(model_eval(c[s][q], toks + q * 3, lens[q], NULL, false), ECS_OK, "%s",
                         ecs_errmsg());
        }
    for (int step = 0; step < 2; step++) {
        model_row_t rows[NS];
        for (int q = 0; q < ns; q++) {
            const int32_t t = toks[560 + step + q];
            cr_assert_eq(model_eval(c[0][q], &t, 1, l + q * V, false), ECS_OK, "%s",
                         ecs_errmsg());
            rows[q] = (model_row_t){c[1][q], t, true};
        }
        cr_assert_eq(model_eval_batch(m, rows, ns, l + NS * V), ECS_OK, "%s", ecs_errmsg());
        for (int q = 0; q < ns; q++)
            cr_assert(memcmp(l + q * V, l + (NS + q) * V, V * sizeof *l) == 0,
                      "flags %u, %d threads, step %d: sequence %d (depth %d) in a step of %d "
                      "differs from alone",
                      flags, threads, step, q, lens[q], ns);
    }
    for (int s = 0; s < 2; s++)
        for (int q = 0; q < ns; q++)
            model_ctx_free(c[s][q]);
    free(l), free(toks);
    model_free(m);
}

Test(split, shallow_and_deep_in_one_step_as_alone, .timeout = 300)
{
    const int lens[2] = {300, 530};
    step_vs_alone(MODEL_CTX_MLA_ABSORBED, 2, lens, 2);
    step_vs_alone(MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_BF16, 1, lens, 2);
}

Test(split, deep_in_a_step_of_many_rows_as_alone, .timeout = 300)
{
    const int lens[6] = {530, 100, 120, 140, 160, 515};
    step_vs_alone(MODEL_CTX_MLA_ABSORBED, 2, lens, 6);
    step_vs_alone(MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_BF16, 2, lens, 6);
}
