/* test_kv_bf16.c - the BF16 KV cache (MODEL_CTX_KV_BF16): its AVX-512 BF16
 * kernels give the bits of the plain loops (P.V here; the scores in
 * test_attn.c), conversions round as ecs_f32_to_bf16, and whole models
 * with a BF16 cache stay near the F32 cache's logits, pick the same greedy
 * tokens and give the same bits for every thread count. */
#include "tests/unit/kv_fixture.h"

static const model_simd_t *simd_or_skip(void)
{
    if (!model_cpu_bf16()) {
        cr_log_warn("no AVX-512 BF16 on this CPU: the BF16 cache runs the plain loops");
        return NULL;
    }
    return model_simd_avx512();
}

/* ---------------------------------------------------------------- P.V */

/* nq rows of probabilities (BF16 values, rows of different lengths, zero
 * past them) against nt BF16 value rows of width dv: the kernel's sums
 * equal the plain loops' bit for bit, also continued over two calls. */
static void check_pv(const model_simd_t *sd, int nq, int nt, int dv, int cut)
{
    const model_simd_t *pl = model_simd_plain();
    const int nqp = (nq + 3) & ~3, ldp = (nt + 15) & ~15, ldo = (dv + 15) & ~15;
    const size_t vs = (size_t)dv + 5;
    ecs_bf16_t *V = malloc((size_t)nt * vs * sizeof *V);
    float *P = calloc((size_t)nqp * ldp, sizeof *P);
    float *O[2] = {malloc((size_t)nqp * ldo * sizeof(float)), malloc((size_t)nqp * ldo * sizeof(float))};
    cr_assert(V && P && O[0] && O[1]);
    for (size_t i = 0; i < (size_t)nt * vs; i++)
        V[i] = ecs_f32_to_bf16(frand() * 4.0f);
    int len[MODEL_ATT_QMAX], l1[MODEL_ATT_QMAX], l2[MODEL_ATT_QMAX];
    for (int j = 0; j < nqp; j++) {
        len[j] = j >= nq ? 0 : j % 3 == 1 ? nt - j % 7 : nt;
        len[j] = len[j] < 0 ? 0 : len[j];
        for (int t = 0; t < len[j]; t++)
            P[(size_t)j * ldp + t] = ecs_bf16_to_f32(ecs_f32_to_bf16(frand() * 0.5f + 0.5f));
        l1[j] = len[j] < cut ? len[j] : cut;
        l2[j] = len[j] - l1[j];
    }
    const model_simd_t *k[2] = {pl, sd};
    for (int i = 0; i < 2; i++) {
        memset(O[i], 0xFF, (size_t)nqp * ldo * sizeof(float)); /* NaN: acc=false must not read */
        if (cut > 0 && cut < nt) { /* two calls, the second continuing */
            k[i]->pv(P, nqp, ldp, V, vs, MODEL_KV_BF16, dv, l1, O[i], ldo, false);
            k[i]->pv(P + cut, nqp, ldp, V + (size_t)cut * vs, vs, MODEL_KV_BF16, dv, l2, O[i], ldo,
                     true);
        } else {
            k[i]->pv(P, nqp, ldp, V, vs, MODEL_KV_BF16, dv, len, O[i], ldo, false);
        }
    }
    for (int j = 0; j < nq; j++)
        for (int d = 0; d < dv; d++) {
            const size_t i = (size_t)j * ldo + d;
            cr_assert(memcmp(&O[0][i], &O[1][i], sizeof(float)) == 0,
                      "nq %d nt %d dv %d cut %d: (%d, %d) plain %a simd %a", nq, nt, dv, cut, j, d,
                      O[0][i], O[1][i]);
        }
    free(V), free(P), free(O[0]), free(O[1]);
}

Test(bf16_kernels, pv_equals_plain_bit_for_bit)
{
    const model_simd_t *sd = simd_or_skip();
    if (!sd)
        return;
    const int nqs[] = {1, 4, 6, 8, 10, 16, 17, 64};
    const int nts[] = {1, 2, 15, 64, 129, 300};
    const int dvs[] = {2, 16, 40, 128, 512};
    for (size_t a = 0; a < sizeof nqs / sizeof *nqs; a++)
        for (size_t b = 0; b < sizeof nts / sizeof *nts; b++)
            for (size_t c = 0; c < sizeof dvs / sizeof *dvs; c++) {
                check_pv(sd, nqs[a], nts[b], dvs[c], 0);
                check_pv(sd, nqs[a], nts[b], dvs[c], 64); /* a run of one KV block */
            }
}

Test(bf16_kernels, conversions_round_as_ggml)
{
    const model_simd_t *sd = simd_or_skip();
    if (!sd)
        return;
    enum { N = 4099 };
    float *x = malloc(N * sizeof *x);
    ecs_bf16_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    cr_assert(x && a && b);
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)(rng_state >> 20) ^ (uint32_t)i * 2654435761u;
        frand();
        if (i % 5 == 0) /* ties */
            u = (u & 0xFFFF0000u) | 0x8000u;
        memcpy(&x[i], &u, sizeof u);
    }
    const float special[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, 3.0e38f};
    memcpy(x, special, sizeof special);
    sd->to_bf16(a, x, N);
    for (int i = 0; i < N; i++) {
        b[i] = ecs_f32_to_bf16(x[i]);
        cr_assert_eq(a[i], b[i], "%a: %04x vs %04x", x[i], a[i], b[i]);
    }
    /* softmax: probabilities are BF16 values, each within a BF16 rounding
     * of the F32 softmax */
    enum { T = 77 };
    float S[4][80], R[4][80];
    int len[4] = {T, 50, 1, 0};
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < 80; t++)
            S[j][t] = R[j][t] = frand() * 8.0f;
    sd->softmax(&S[0][0], 4, 80, len, T, MODEL_KV_BF16, NULL, NULL);
    model_simd_plain()->softmax(&R[0][0], 4, 80, len, T, MODEL_KV_F32, NULL, NULL);
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < T; t++) {
            cr_assert_eq(S[j][t], ecs_bf16_to_f32(ecs_f32_to_bf16(S[j][t])));
            cr_assert(fabsf(S[j][t] - R[j][t]) <= R[j][t] * 0x1p-8f * 1.001f, "(%d, %d) %g vs %g",
                      j, t, S[j][t], R[j][t]);
        }
    free(x), free(a), free(b);
}

/* ------------------------------------------------------- whole models */

/* BF16 against F32 caches on the F32 cache's greedy tokens (kv_near; the
 * F16 cache's error logged beside it); BF16 with 1 and 2 threads: the same
 * bits, the same greedy tokens. */
static void check_model(const char *path, unsigned extra, double tol)
{
    model_t *m = kv_load(path, 2);
    const size_t V = (size_t)model_n_vocab(m), rows = N_PROMPT + (size_t)N_GEN, cnt = rows * V;
    int32_t g32[N_GEN], gb[N_GEN], gb1[N_GEN], tmp[N_GEN];
    float *f32 = kv_run(m, extra | MODEL_CTX_KV_F32, N_GEN, NULL, g32);
    float *f16 = kv_run(m, extra, N_GEN, g32, NULL);
    float *bf = kv_run(m, extra | MODEL_CTX_KV_BF16, N_GEN, g32, tmp);
    float *bfg = kv_run(m, extra | MODEL_CTX_KV_BF16, N_GEN, NULL, gb);
    cr_assert_eq(model_ctx_bytes(m, 64, MODEL_CTX_KV_BF16), model_ctx_bytes(m, 64, 0));
    model_free(m);
    m = kv_load(path, 1);
    float *bfg1 = kv_run(m, extra | MODEL_CTX_KV_BF16, N_GEN, NULL, gb1);
    model_free(m);
    char what[256];
    snprintf(what, sizeof what, "%s flags %u, bf16 vs f32", path, extra);
    kv_near(what, f32, bf, rows, V, tol);
    const double e16 = max_diff(f16, f32, cnt);
    cr_log_info("%s flags %u: f16 vs f32 %.3g (%.2e of the largest logit)", path, extra, e16,
                e16 / max_abs(f32, cnt));
    cr_assert(memcmp(bfg, bfg1, cnt * sizeof *bfg) == 0, "%s: 1 and 2 threads differ", path);
    cr_assert(memcmp(gb, gb1, sizeof gb) == 0);
    free(f32), free(f16), free(bf), free(bfg), free(bfg1);
}

/* The tolerance: BF16 keeps 8 significant bits (F16: 11), but the F16
 * cache's error on these tiny random models is already 2-5 % of the
 * largest logit (flat logits amplify any rounding); measured (cr_log_info):
 * BF16 2.9e-2 (qwen3moe) / 3.4-3.5e-2 (ds2), F16 2.3e-2 / 3.0-5.0e-2. The
 * bound is 6e-2 of the largest logit. */
Test(bf16_model, ds2_near_f32_same_tokens_same_bits, .timeout = 120)
{
    check_model(DS2_Q8, 0, 6e-2);
    check_model(DS2_Q8, MODEL_CTX_MLA_ABSORBED, 6e-2);
    check_model(DS2_Q8, MODEL_CTX_MLA_EXPANDED, 6e-2);
}

Test(bf16_model, qwen3moe_near_f32_same_tokens_same_bits, .timeout = 120)
{
    check_model(QWEN_Q8, 0, 6e-2);
}

Test(bf16_model, flags)
{
    model_t *m = kv_load(DS2_Q8, 1);
    model_ctx_t *c = NULL;
    cr_assert_neq(model_ctx_new(m, 16, MODEL_CTX_KV_BF16 | MODEL_CTX_KV_F32, &c), ECS_OK);
    cr_assert_eq(model_kv_type_flag("bf16"), (int)MODEL_CTX_KV_BF16);
    cr_assert_eq(model_kv_type_flag("f32"), (int)MODEL_CTX_KV_F32);
    cr_assert_eq(model_kv_type_flag("f16"), 0);
    cr_assert_eq(model_kv_type_flag("q8_0"), -1);
    cr_assert_str_eq(model_kv_type_name(MODEL_CTX_KV_BF16 | MODEL_CTX_MLA_ABSORBED), "bf16");
    cr_assert_str_eq(model_kv_type_name(0), "f16");
    model_free(m);
}
