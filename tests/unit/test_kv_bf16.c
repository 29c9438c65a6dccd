/* test_kv_bf16.c - the BF16 KV cache (MODEL_CTX_KV_BF16): its AVX-512 BF16
 * kernels give the bits of the plain loops (P.V here; the scores in
 * test_attn.c), conversions round as ecs_f32_to_bf16, and whole models
 * with a BF16 cache stay near the F32 cache's logits, pick the same greedy
 * tokens and give the same bits for every thread count. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/model/model.h"
#include "coordinator/model/model_int.h"

#define DS2_Q8 "../shared/models/tiny-ds2-q8_0.gguf"
#define QWEN_Q8 "../shared/models/tiny-qwen3moe-q8_0.gguf"

/* The english_sentence prompt of the reference files plus a few ids (as
 * model_fixture.h's). */
static const int32_t PROMPT[] = {100000, 549, 3399, 10176, 32431, 33747, 855, 254, 24547, 5025,
                                 3345, 254, 7257, 8144, 6185, 13, 82987, 32840, 94838, 62990};
#define N_PROMPT ((int)(sizeof PROMPT / sizeof PROMPT[0]))

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

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
        uint32_t u = (uint32_t)(rng >> 20) ^ (uint32_t)i * 2654435761u;
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

static model_t *load(const char *path, int threads)
{
    model_opts_t o = {.n_ctx = 256, .n_threads = threads};
    model_t *m = NULL;
    cr_assert_eq(model_load(path, &o, &m), ECS_OK, "model_load(%s): %s", path, ecs_errmsg());
    return m;
}

/* Logits of the prompt's rows (one prompt step), then of n_gen decode
 * steps of one row each: the argmax of the last logits when gen is NULL
 * (greedy; the tokens go to out), else gen's tokens (so two caches are
 * compared on the same sequence). Returns (N_PROMPT + n_gen) rows. */
static float *run(model_t *m, unsigned flags, int n_gen, const int32_t *gen, int32_t *out)
{
    const size_t V = (size_t)model_n_vocab(m);
    model_ctx_t *c;
    cr_assert_eq(model_ctx_new(m, 256, flags, &c), ECS_OK, "%s", ecs_errmsg());
    float *l = malloc((N_PROMPT + (size_t)n_gen) * V * sizeof *l);
    cr_assert_not_null(l);
    cr_assert_eq(model_eval(c, PROMPT, N_PROMPT, l, true), ECS_OK, "%s", ecs_errmsg());
    const float *last = l + (N_PROMPT - 1) * V;
    for (int i = 0; i < n_gen; i++) {
        int32_t best = 0;
        for (size_t v = 1; v < V; v++)
            best = last[v] > last[best] ? (int32_t)v : best;
        if (out)
            out[i] = best;
        const int32_t tok = gen ? gen[i] : best;
        float *o = l + (N_PROMPT + (size_t)i) * V;
        cr_assert_eq(model_eval(c, &tok, 1, o, false), ECS_OK, "%s", ecs_errmsg());
        last = o;
    }
    model_ctx_free(c);
    return l;
}

#define N_GEN 24

/* Largest |a - b| over n values. */
static double max_diff(const float *a, const float *b, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++)
        e = fmax(e, fabs((double)a[i] - b[i]));
    return e;
}

/* BF16 against F32 caches on the F32 cache's greedy tokens: logits within
 * tol of the largest, and the same argmax wherever the F32 cache's best
 * logit leads the next by more than twice the error; BF16 with 1 and 2
 * threads: the same bits, the same greedy tokens. */
static void check_model(const char *path, unsigned extra, double tol)
{
    model_t *m = load(path, 2);
    const size_t V = (size_t)model_n_vocab(m), cnt = (N_PROMPT + (size_t)N_GEN) * V;
    int32_t g32[N_GEN], gb[N_GEN], gb1[N_GEN], tmp[N_GEN];
    float *f32 = run(m, extra | MODEL_CTX_KV_F32, N_GEN, NULL, g32);
    float *f16 = run(m, extra, N_GEN, g32, NULL);
    float *bf = run(m, extra | MODEL_CTX_KV_BF16, N_GEN, g32, tmp);
    float *bfg = run(m, extra | MODEL_CTX_KV_BF16, N_GEN, NULL, gb);
    cr_assert_eq(model_ctx_bytes(m, 64, MODEL_CTX_KV_BF16), model_ctx_bytes(m, 64, 0));
    model_free(m);
    m = load(path, 1);
    float *bfg1 = run(m, extra | MODEL_CTX_KV_BF16, N_GEN, NULL, gb1);
    model_free(m);
    double scale = 0;
    for (size_t i = 0; i < cnt; i++)
        scale = fmax(scale, fabs(f32[i]));
    const double e_bf = max_diff(bf, f32, cnt), e_f16 = max_diff(f16, f32, cnt);
    cr_log_info("%s flags %u: max |logit| %g, bf16 vs f32 %.3g (%.2e of it), f16 vs f32 %.3g "
                "(%.2e)",
                path, extra, scale, e_bf, e_bf / scale, e_f16, e_f16 / scale);
    cr_assert(e_bf > 0, "the BF16 cache must round something");
    cr_assert(e_bf <= tol * scale, "%s: bf16 vs f32 cache: %g of %g", path, e_bf, scale);
    int firm = 0;
    for (size_t r = 0; r < N_PROMPT + (size_t)N_GEN; r++) {
        const float *a = f32 + r * V, *b = bf + r * V;
        size_t i1 = 0, i2 = 1, jb = 0;
        for (size_t v = 0; v < V; v++) {
            if (a[v] > a[i1])
                i2 = i1, i1 = v;
            else if (v != i1 && a[v] > a[i2])
                i2 = v;
            jb = b[v] > b[jb] ? v : jb;
        }
        if (a[i1] - a[i2] > 2 * e_bf) {
            firm++;
            cr_assert_eq(jb, i1, "%s row %zu: argmax %zu, the F32 cache's %zu", path, r, jb, i1);
        }
    }
    cr_log_info("%s: %d of %d rows' argmax decided beyond the error, all equal", path, firm,
                N_PROMPT + N_GEN);
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
    model_t *m = load(DS2_Q8, 1);
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
