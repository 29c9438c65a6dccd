/* test_kv_q8.c - the 8-bit latent cache (MODEL_CTX_KV_Q8): its VNNI
 * kernels give the bits of the plain loops (levels, scores, P.V over runs
 * of keys), rows round-trip within half a level, and whole ds2 models
 * with an 8-bit cache stay near the F32 cache's logits, pick the same
 * greedy tokens where the F32 cache's choice is clear and give the same
 * bits for every thread count; other models and layouts refuse it. */
#include "tests/unit/kv_fixture.h"

static bool vnni_or_skip(void)
{
    if (!model_cpu_q8()) {
        cr_log_warn("no AVX-512 VNNI and VBMI on this CPU: the 8-bit cache runs the plain loops "
                    "(kernel comparison skipped)");
        return false;
    }
    return true;
}

/* nt rows of width dk (c part dc), ks bytes apart, random with a wider
 * k_pe part and a few outliers, as model_cache_put stores them. */
static uint8_t *rows(int nt, int dc, int dk, size_t ks)
{
    uint8_t *K = calloc((size_t)nt + 4, ks);
    cr_assert_not_null(K);
    float x[MODEL_Q8_MAXDK];
    for (int t = 0; t < nt; t++) {
        for (int d = 0; d < dk; d++)
            x[d] = frand() * (d < dc ? 1.0f : 4.0f) * (d % 97 == 5 ? 8.0f : 1.0f);
        model_q8_put(K + (size_t)t * ks, x, dc, dk);
    }
    return K;
}

Test(q8_kernels, levels_equal_plain)
{
    if (!vnni_or_skip())
        return;
    const int ns[] = {512, 64, 17, 5, 1};
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++)
        for (int off = 0; off <= 128; off += 128) {
            const int n = ns[c];
            float x[512];
            uint8_t a[512], b[512];
            for (int i = 0; i < n; i++)
                x[i] = frand() * 3.0f;
            x[n / 2] = 0.5f * (float)(n / 2) / 127.0f; /* ties for the rounding */
            int32_t sa, sb;
            const float fa = model_q8_levels_ref(x, n, off, a, &sa);
            const float fb = model_q8_levels_avx512(x, n, off, b, &sb);
            cr_assert(fa == fb && sa == sb && !memcmp(a, b, (size_t)n), "n %d off %d", n, off);
        }
    float z[16] = {0};
    uint8_t lv[16];
    int32_t s;
    cr_assert_eq(model_q8_levels_avx512(z, 16, 128, lv, &s), 0.0f);
    cr_assert(s == 0 && lv[0] == 128 && lv[15] == 128);
}

Test(q8_kernels, rows_round_trip_within_half_a_level)
{
    const int dc = 512, dk = 576;
    const size_t ks = model_q8_row_bytes(dk);
    cr_assert_eq(ks, 592);
    float x[576], y[576];
    for (int d = 0; d < dk; d++)
        x[d] = frand() * (d < dc ? 1.0f : 5.0f);
    uint8_t r[592];
    model_q8_put(r, x, dc, dk);
    model_q8_get(y, r, 0, dk, dc, dk);
    for (int part = 0; part < 2; part++) {
        const int a = part ? dc : 0, e = part ? dk : dc;
        float m = 0;
        for (int d = a; d < e; d++)
            m = fmaxf(m, fabsf(x[d]));
        for (int d = a; d < e; d++)
            cr_assert(fabsf(y[d] - x[d]) <= 0.5f * m / 127.0f * 1.0001f, "d %d: %g vs %g", d, y[d],
                      x[d]);
    }
    float one[3];
    model_q8_get(one, r, dc - 1, 3, dc, dk); /* across the parts */
    cr_assert(one[0] == y[dc - 1] && one[1] == y[dc] && one[2] == y[dc + 1]);
}

/* Scores of nq queries against nt keys: the VNNI kernel equals the plain
 * loops bit for bit (ds2's rows, whose stride the kernel takes as a
 * constant, and a narrower shape). */
static void check_scores(int nq, int nt, int dc, int dk)
{
    const size_t ks = model_q8_row_bytes(dk);
    uint8_t *K = rows(nt, dc, dk, ks);
    void *QT = calloc(1, model_q8_query_bytes(nq, dk));
    const int lds = ((nt + 15) & ~15) + 16;
    float *S[2] = {calloc((size_t)nq * lds, sizeof(float)), calloc((size_t)nq * lds, sizeof(float))};
    void *kbuf = malloc(16 * ks);
    cr_assert(QT && S[0] && S[1] && kbuf);
    float q[MODEL_Q8_MAXDK];
    for (int j = 0; j < nq; j++) {
        for (int d = 0; d < dk; d++)
            q[d] = frand() * (d < dc ? 2.0f : 0.5f);
        model_q8_query(QT, nq, j, dc, dk, q);
    }
    model_q8_scores_ref(QT, nq, dc, dk, K, ks, nt, 0.07f, S[0], lds);
    model_q8_scores_avx512(QT, nq, dc, dk, K, ks, nt, 0.07f, S[1], lds, kbuf);
    for (int j = 0; j < nq; j++)
        for (int t = 0; t < nt; t++)
            cr_assert(S[0][(size_t)j * lds + t] == S[1][(size_t)j * lds + t],
                      "nq %d nt %d dk %d: S[%d][%d] %a vs %a", nq, nt, dk, j, t,
                      S[1][(size_t)j * lds + t], S[0][(size_t)j * lds + t]);
    free(K), free(QT), free(S[0]), free(S[1]), free(kbuf);
}

Test(q8_kernels, scores_equal_plain_bit_for_bit)
{
    if (!vnni_or_skip())
        return;
    check_scores(16, 256, 512, 576);
    check_scores(4, 37, 512, 576);
    check_scores(48, 100, 512, 576);
    check_scores(20, 33, 64, 96);
}

/* P.V over the keys of runs (rn rows each, the runs scattered in one
 * buffer) for nq queries with probabilities zero past each one's length:
 * the VNNI kernel equals the plain loops bit for bit. */
static void check_pv(int nq, const int *rn, int nrun, int dc, int dk)
{
    const size_t ks = model_q8_row_bytes(dk);
    int nt = 0;
    for (int r = 0; r < nrun; r++)
        nt += rn[r];
    uint8_t *K = rows(nt + 8 * nrun, dc, dk, ks);
    const void *vr[8];
    for (int r = 0, at = 0; r < nrun; at += rn[r] + 8, r++) /* gaps between the runs */
        vr[r] = K + (size_t)at * ks;
    const int ldp = nt + 16, ldo = dc + 16;
    float *P = calloc((size_t)nq * ldp, sizeof *P);
    float *O[2] = {calloc((size_t)nq * ldo, sizeof(float)), calloc((size_t)nq * ldo, sizeof(float))};
    void *scr = malloc(model_q8_pv_scratch(nq));
    cr_assert(P && O[0] && O[1] && scr);
    for (int j = 0; j < nq; j++) {
        const int len = j % 3 == 1 ? nt - j % 5 : nt;
        for (int t = 0; t < len; t++)
            P[(size_t)j * ldp + t] = fabsf(frand()) * (t % 11 == 3 ? 1.0f : 0.2f);
    }
    model_q8_pv_ref(P, nq, ldp, vr, rn, nrun, ks, dc, dk, O[0], ldo, scr);
    model_q8_pv_avx512(P, nq, ldp, vr, rn, nrun, ks, dc, dk, O[1], ldo, scr);
    for (int j = 0; j < nq; j++)
        for (int d = 0; d < dc; d++)
            cr_assert(O[0][(size_t)j * ldo + d] == O[1][(size_t)j * ldo + d],
                      "nq %d nt %d: O[%d][%d] %a vs %a", nq, nt, j, d, O[1][(size_t)j * ldo + d],
                      O[0][(size_t)j * ldo + d]);
    free(K), free(P), free(O[0]), free(O[1]), free(scr);
}

Test(q8_kernels, pv_equals_plain_bit_for_bit)
{
    if (!vnni_or_skip())
        return;
    const int one[] = {256}, three[] = {64, 128, 37}, tiny[] = {3}, two[] = {64, 5};
    check_pv(16, one, 1, 512, 576);
    check_pv(16, three, 3, 512, 576);
    check_pv(4, tiny, 1, 512, 576);
    check_pv(40, two, 2, 512, 576);
    check_pv(12, three, 3, 64, 96);
}

/* ------------------------------------------------------- whole models */

/* The 8-bit cache against the F32 cache on the F32 cache's greedy tokens
 * (kv_near; the BF16 cache's error logged beside it); with 1 and 2
 * threads the same bits and greedy tokens. */
static void check_model(unsigned extra, double tol)
{
    model_t *m = kv_load(DS2_Q8, 2);
    const size_t V = (size_t)model_n_vocab(m), rows = N_PROMPT + (size_t)N_GEN, cnt = rows * V;
    int32_t g32[N_GEN], g8[N_GEN], g81[N_GEN];
    float *f32 = kv_run(m, extra | MODEL_CTX_KV_F32, N_GEN, NULL, g32);
    float *bf = kv_run(m, extra | MODEL_CTX_KV_BF16, N_GEN, g32, NULL);
    float *q8 = kv_run(m, extra | MODEL_CTX_KV_Q8, N_GEN, g32, NULL);
    float *q8g = kv_run(m, extra | MODEL_CTX_KV_Q8, N_GEN, NULL, g8);
    /* ds2-lite's row: 592 bytes against 1152 (its 8 scale bytes weigh more
     * in this tiny model's short rows) */
    cr_assert(model_ctx_bytes(m, 64, MODEL_CTX_KV_Q8) < model_ctx_bytes(m, 64, 0));
    model_free(m);
    m = kv_load(DS2_Q8, 1);
    float *q8g1 = kv_run(m, extra | MODEL_CTX_KV_Q8, N_GEN, NULL, g81);
    model_free(m);
    char what[64];
    snprintf(what, sizeof what, "ds2 flags %u, q8 vs f32", extra);
    kv_near(what, f32, q8, rows, V, tol);
    snprintf(what, sizeof what, "ds2 flags %u, bf16 vs f32", extra);
    kv_near(what, f32, bf, rows, V, tol);
    cr_assert(memcmp(q8g, q8g1, cnt * sizeof *q8g) == 0, "1 and 2 threads differ");
    cr_assert(memcmp(g8, g81, sizeof g8) == 0);
    free(f32), free(bf), free(q8), free(q8g), free(q8g1);
}

/* The tolerance: measured (cr_log_info) against the BF16 cache's in the
 * same runs; the bound is test_kv_bf16.c's 6e-2 of the largest logit. */
Test(q8_model, ds2_near_f32_same_tokens_same_bits, .timeout = 120)
{
    check_model(0, 6e-2);
    check_model(MODEL_CTX_MLA_ABSORBED, 6e-2);
}

Test(q8_model, refused_where_there_is_no_latent_cache)
{
    model_t *m = kv_load(QWEN_Q8, 1);
    model_ctx_t *c = NULL;
    cr_assert_eq(model_ctx_new(m, 16, MODEL_CTX_KV_Q8, &c), ECS_ERR_UNSUPPORTED);
    cr_assert(strstr(ecs_errmsg(), "q8") && strstr(ecs_errmsg(), "deepseek2"), "%s", ecs_errmsg());
    model_free(m);
    m = kv_load(DS2_Q8, 1);
    cr_assert_eq(model_ctx_new(m, 16, MODEL_CTX_KV_Q8 | MODEL_CTX_MLA_EXPANDED, &c),
                 ECS_ERR_UNSUPPORTED);
    cr_assert_neq(model_ctx_new(m, 16, MODEL_CTX_KV_Q8 | MODEL_CTX_KV_BF16, &c), ECS_OK);
    cr_assert_eq(model_kv_type_flag("q8"), (int)MODEL_CTX_KV_Q8);
    cr_assert_str_eq(model_kv_type_name(MODEL_CTX_KV_Q8 | MODEL_CTX_MLA_ABSORBED), "q8");
    model_free(m);
}

/* A step of several sequences (decode rows and a short prompt chunk: tiles
 * of one sequence each in the key split) gives each sequence the bits it
 * gets alone. */
Test(q8_model, rows_same_bits_alone_and_in_a_step_of_others, .timeout = 120)
{
    model_t *m = kv_load(DS2_Q8, 2);
    const size_t V = (size_t)model_n_vocab(m);
    enum { NS = 3 };
    const int hist[NS] = {5, 12, 17}, step[NS] = {1, 1, 3};
    model_ctx_t *a[NS], *b[NS];
    float *scratch = malloc((size_t)N_PROMPT * V * sizeof *scratch);
    float *alone = malloc(5 * V * sizeof *alone), *out = malloc(5 * V * sizeof *out);
    cr_assert(scratch && alone && out);
    model_row_t rows[5];
    int r = 0;
    for (int s = 0; s < NS; s++) {
        cr_assert_eq(model_ctx_new(m, 64, MODEL_CTX_KV_Q8, &a[s]), ECS_OK, "%s", ecs_errmsg());
        cr_assert_eq(model_ctx_new(m, 64, MODEL_CTX_KV_Q8, &b[s]), ECS_OK, "%s", ecs_errmsg());
        cr_assert_eq(model_eval(a[s], PROMPT, hist[s], scratch, false), ECS_OK);
        cr_assert_eq(model_eval(b[s], PROMPT, hist[s], scratch, false), ECS_OK);
        for (int i = 0; i < step[s]; i++)
            rows[r++] = (model_row_t){a[s], PROMPT[hist[s] + i], true};
    }
    cr_assert_eq(model_eval_batch(m, rows, r, out), ECS_OK, "%s", ecs_errmsg());
    for (int s = 0, at = 0; s < NS; at += step[s], s++) {
        cr_assert_eq(model_eval(b[s], PROMPT + hist[s], step[s], alone, true), ECS_OK);
        cr_assert(memcmp(out + (size_t)at * V, alone, (size_t)step[s] * V * sizeof *out) == 0,
                  "sequence %d: its rows in a step of others differ from alone", s);
    }
    for (int s = 0; s < NS; s++)
        model_ctx_free(a[s]), model_ctx_free(b[s]);
    free(scratch), free(alone), free(out);
    model_free(m);
}
