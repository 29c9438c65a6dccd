/* test_model_isa.c - the model's logits do not depend on how the CPU
 * computes them: every ISA's kernels against the plain loops, any thread
 * count, the packed Q8_0 W_kT of the absorbed path on every ISA, and the
 * interleaved decode copy (repack.c) bit for bit, found again and remade. */
#include "tests/unit/model_fixture.h"

/* ------------------------------------------------- SIMD and thread counts */

/* Logits of every position with the kernels of one ISA, of a spec'd model
 * (s) or of a model file (s NULL). */
static float *eval_isa(const spec_t *s, const char *path, kcpu_isa_t isa, unsigned flags,
                       const int32_t *toks, int n)
{
    kcpu_set_isa(isa);
    model_t *m = s ? load_spec(s, 128) : load(path, 128);
    float *l = eval_all(m, flags, toks, n);
    model_free(m);
    kcpu_set_isa(kcpu_isa_detect());
    return l;
}

static void check_isa_paths(const spec_t *s, unsigned flags)
{
    int32_t toks[37]; /* not a multiple of any block: every tail runs */
    random_tokens(toks, 37, s->n_vocab, 21);
    float *a = eval_isa(s, NULL, kcpu_isa_detect(), flags, toks, 37);
    float *b = eval_isa(s, NULL, KCPU_ISA_SCALAR, flags, toks, 37);
    const size_t cnt = (size_t)37 * s->n_vocab;
    /* F32 caches: summation order only. F16: a query or probability that
     * lands on the other side of an F16 rounding boundary moves by 5e-4
     * relative, so the bound is that of the F16 cache tests (2e-3, e.g.
     * mla.absorbed_equals_expanded_f32 in test_model_batch.c). BF16: the
     * attention products are the same bits on both ISAs; what differs
     * elsewhere may cross a BF16 rounding (4e-3 relative of one value),
     * and stays within the same bound on these models. */
    const double tol = flags & MODEL_CTX_KV_F32 ? 1e-5 : 2e-3;
    cr_assert(max_diff(a, b, cnt) <= tol * fmax(1.0, max_abs(b, cnt)),
              "%s flags %u: detected ISA vs scalar: %g", s->arch, flags, max_diff(a, b, cnt));
    free(a), free(b);
}

Test(simd, detected_isa_equals_plain_loops)
{
    if (kcpu_isa_detect() < KCPU_ISA_AVX512)
        cr_log_warn("no AVX-512 on this CPU: the comparison covers %s only",
                    kcpu_isa_name(kcpu_isa_detect()));
    spec_t s = ds2_spec();
    check_isa_paths(&s, 0);
    check_isa_paths(&s, MODEL_CTX_KV_F32);
    check_isa_paths(&s, MODEL_CTX_MLA_ABSORBED);
    check_isa_paths(&s, MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_F32);
    check_isa_paths(&s, MODEL_CTX_MLA_EXPANDED);
    check_isa_paths(&s, MODEL_CTX_MLA_EXPANDED | MODEL_CTX_KV_F32);
    /* BF16: AVX-512 BF16 kernels against the plain loops a CPU without
     * them runs (the attention the same bits, test_kv_bf16.c) */
    check_isa_paths(&s, MODEL_CTX_KV_BF16);
    check_isa_paths(&s, MODEL_CTX_MLA_ABSORBED | MODEL_CTX_KV_BF16);
    check_isa_paths(&s, MODEL_CTX_MLA_EXPANDED | MODEL_CTX_KV_BF16);
    s = qwen_spec();
    check_isa_paths(&s, 0);
    check_isa_paths(&s, MODEL_CTX_KV_F32);
    check_isa_paths(&s, MODEL_CTX_KV_BF16);
}

Test(threads, logits_do_not_depend_on_the_thread_count)
{
    /* the prompt step expands the latent; the absorbed flag covers the
     * absorbed prompt path */
    const unsigned flags[2] = {0, MODEL_CTX_MLA_ABSORBED};
    for (int f = 0; f < 2; f++) {
        const int n = N_PROMPT;
        float *l[3];
        const int threads[3] = {1, 2, 3};
        for (int i = 0; i < 3; i++) {
            model_t *m = load_opts(DS2_Q8, (model_opts_t){.n_ctx = 64, .n_threads = threads[i]});
            l[i] = eval_all(m, flags[f], PROMPT, n);
            model_free(m);
        }
        const size_t cnt = (size_t)n * 102400;
        cr_assert_eq(max_diff(l[0], l[1], cnt), 0.0, "flags %u: 1 vs 2 threads", flags[f]);
        cr_assert_eq(max_diff(l[0], l[2], cnt), 0.0, "flags %u: 1 vs 3 threads", flags[f]);
        for (int i = 0; i < 3; i++)
            free(l[i]);
    }
}

/* ---- the absorbed path's packed Q8_0 W_kT (model_simd_t.dot_q8p) */

Test(mla, packed_wkt_same_on_every_isa)
{
    /* the packed product itself gives the same bits on every ISA; what
     * remains is the other kernels' float summation order (2.4e-7 when
     * written), where a wrong lane or block would cost the absorbed form's
     * whole accuracy (absorbed_close_to_expanded_q8: 0.08) */
    enum { N = 21 };
    int32_t toks[N];
    model_t *m = load(DS2_Q8, 128);
    const int vocab = model_n_vocab(m);
    model_free(m);
    random_tokens(toks, N, vocab, 33);
    float *a = eval_isa(NULL, DS2_Q8, kcpu_isa_detect(), MODEL_CTX_MLA_ABSORBED, toks, N);
    float *b = eval_isa(NULL, DS2_Q8, KCPU_ISA_SCALAR, MODEL_CTX_MLA_ABSORBED, toks, N);
    const size_t cnt = (size_t)N * vocab;
    cr_log_info("packed W_kT, detected ISA vs scalar: max %g mean %g", max_diff(a, b, cnt),
                mean_diff(a, b, cnt));
    cr_assert(max_diff(a, b, cnt) < 1e-4, "detected ISA vs scalar: %g", max_diff(a, b, cnt));
    cr_assert(mean_diff(a, b, cnt) < 1e-5, "mean diff %g", mean_diff(a, b, cnt));
    free(a), free(b);
}

/* ---------------------------------------------- decode copy (repack.c) */

static size_t file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (size_t)st.st_size : 0;
}

/* A Q8_0 deepseek2 whose matrices of 256-value rows get a decode copy:
 * logits bit for bit those without it (one token per step, batched, with
 * prompt tiles from the copy), the copy found again, remade when damaged,
 * and refused (the model still runs) when memory is short. Here, unlike
 * the integration test, under the sanitizers too. */
Test(repack, decode_copy_same_bits_and_cache)
{
    if (!kcpu_gemm(ECS_TYPE_Q8_0).r16) {
        cr_log_warn("no interleaved kernels on this CPU: the copy is never made");
        return;
    }
    spec_t s = ds2_spec();
    s.n_embd = 256, s.q8 = true;
    char path[128], dir[] = "/tmp/ecs_repack_XXXXXX", copy[256];
    write_model(&s, path, sizeof path, 7);
    cr_assert_not_null(mkdtemp(dir));
    snprintf(copy, sizeof copy, "%s/%s.r16", dir, strrchr(path, '/') + 1);
    int32_t toks[20];
    random_tokens(toks, 20, s.n_vocab, 5);
    const size_t cnt = (size_t)20 * s.n_vocab;
    const model_opts_t plain = {.n_ctx = 64, .n_threads = 2};
    model_opts_t o = plain;
    o.repack_dir = dir;

    model_t *m = load_opts(path, plain);
    float *ref1 = eval_one_by_one(m, 0, toks, 20), *refb = eval_all(m, 0, toks, 20);
    model_free(m);

    bool made;
    const char *where;
    for (int round = 0; round < 4; round++) {
        /* 0: made, 1: found, 2: damaged -> made, 3: memory for the copy and the
         * rest of the GGUF only */
        if (round == 2) {
            FILE *f = fopen(copy, "r+b");
            cr_assert_not_null(f);
            fputs("XXXXXXXX", f);
            fclose(f);
        }
        o.repack_ram = round == 3 ? file_size(path) + file_size(copy) - 1 : 0;
        m = load_opts(path, o);
        cr_assert_null(model_repack_note(m), "round %d: %s", round, model_repack_note(m));
        cr_assert_gt(model_repack_bytes(m, &where, &made), 0, "round %d: no copy", round);
        cr_assert_str_eq(where, copy);
        cr_assert_eq(made, round == 0 || round == 2, "round %d: made %d", round, made);
        float *a = eval_one_by_one(m, 0, toks, 20), *b = eval_all(m, 0, toks, 20);
        cr_assert_eq(memcmp(a, ref1, cnt * sizeof *a), 0, "round %d: decode logits differ", round);
        cr_assert_eq(memcmp(b, refb, cnt * sizeof *b), 0, "round %d: batched logits differ", round);
        free(a), free(b);
        model_free(m);
    }
    o.repack_ram = 1000; /* nothing fits: no copy, a reason, same results */
    m = load_opts(path, o);
    cr_assert_not_null(model_repack_note(m));
    cr_assert_eq(model_repack_bytes(m, NULL, NULL), 0);
    float *a = eval_one_by_one(m, 0, toks, 20);
    cr_assert_eq(memcmp(a, ref1, cnt * sizeof *a), 0, "logits differ without the copy");
    free(a);
    model_free(m);
    free(ref1), free(refb);
    unlink(copy), unlink(path), rmdir(dir);
}
