/* test_tokenizer_vectors.c - the tokenizer against llama.cpp's test vectors
 * for the DeepSeek LLM and Coder vocabularies, the metadata and reference
 * prompts of the LLM vocabulary, FIM tokens, and the encode options
 * (special tokens added or parsed, capacity, invalid UTF-8). */
#include "tests/unit/tokenizer_fixture.h"

/* ---- llama.cpp's test vectors ---- */

static void check_vectors(const char *vocab)
{
    tok_t *t = load_vocab(vocab);
    char path[512];
    size_t ni, no;
    snprintf(path, sizeof path, "%s.inp", vocab);
    char *inp = slurp(path, &ni);
    snprintf(path, sizeof path, "%s.out", vocab);
    char *out = slurp(path, &no);

    /* texts: split on "\n__ggml_vocab_test__\n" exactly as test-tokenizer-0 */
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sl = strlen(sep), pos = 0, n_texts = 0, n_lines = 0, bad = 0;
    const char *texts[256];
    size_t lens[256];
    while (pos < ni && n_texts < 256) {
        const char *nx = memmem(inp + pos, ni - pos, sep, sl);
        texts[n_texts] = inp + pos;
        lens[n_texts++] = nx ? (size_t)(nx - (inp + pos)) : ni - pos;
        if (!nx)
            break;
        pos = (size_t)(nx - inp) + sl;
    }
    char *lines[256];
    for (char *p = out; *p && n_lines < 256;) {
        char *e = strchr(p, '\n');
        lines[n_lines++] = p;
        if (!e)
            break;
        *e = '\0';
        p = e + 1;
    }
    cr_assert_eq(n_texts, n_lines, "%zu texts, %zu expected lines", n_texts, n_lines);
    cr_assert(n_texts >= 40, "only %zu test texts in %s.inp", n_texts, vocab);

    for (size_t i = 0; i < n_texts; i++) {
        int32_t want[4096];
        size_t nw = 0, n;
        for (char *p = lines[i], *end; nw < 4096; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            want[nw++] = (int32_t)v;
        }
        int32_t *got = encode(t, texts[i], lens[i], false, false, &n);
        bool same = n == nw && memcmp(got, want, n * sizeof *got) == 0;
        cr_expect(same, "%s case %zu ('%.*s'): %zu ids, expected %zu", vocab, i, (int)lens[i], texts[i], n, nw);
        bad += !same;
        size_t dl;
        char *back = decode(t, got, n, false, &dl);
        cr_expect(dl == lens[i] && memcmp(back, texts[i], dl) == 0, "%s case %zu does not decode back",
                  vocab, i);
        free(back);
        free(got);
    }
    cr_assert_eq(bad, 0, "%zu of %zu cases differ from llama.cpp", bad, n_texts);
    free(inp);
    free(out);
    tok_free(t);
}

Test(tokenizer, deepseek_llm_vectors) { check_vectors(LLM_VOCAB); }
Test(tokenizer, deepseek_coder_vectors) { check_vectors(CODER_VOCAB); }

Test(tokenizer, deepseek_llm_metadata)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    gguf_file_t *f;
    cr_assert_eq(gguf_open(LLM_VOCAB, &f), ECS_OK);
    uint32_t bos, eos;
    const gguf_value_t *toks;
    cr_assert_eq(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos), ECS_OK);
    cr_assert_eq(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &eos), ECS_OK);
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks), ECS_OK);
    cr_assert_eq((uint64_t)tok_n_vocab(t), toks->arr.n);
    cr_assert_eq(tok_bos(t), (int32_t)bos);
    cr_assert_eq(tok_eos(t), (int32_t)eos);
    cr_assert_str_eq(tok_token_text(t, tok_bos(t)), DS_BOS);
    cr_assert(tok_add_bos(t));
    cr_assert(!tok_add_eos(t));
    /* no eot key: found by name, like llama.cpp */
    cr_assert_eq(tok_eot(t), tok_eos(t));
    cr_assert(tok_is_eog(t, tok_eos(t)));
    cr_assert(!tok_is_eog(t, tok_bos(t)));
    cr_assert(!tok_is_eog(t, -1));
    cr_assert(!tok_is_eog(t, tok_n_vocab(t)));
    cr_assert_str_eq(tok_pre_name(t), "deepseek-llm");
    cr_assert_eq(tok_chat_kind(t), TOK_CHAT_NONE);
    cr_assert_eq(tok_token_type(t, tok_bos(t)), TOK_TYPE_CONTROL);
    cr_assert_null(tok_token_text(t, tok_n_vocab(t)));
    /* every token text read back equals the file's */
    for (uint64_t i = 0; i < toks->arr.n; i += 997) {
        gguf_str_t s = toks->arr.strs[i];
        const char *txt = tok_token_text(t, (int32_t)i);
        cr_assert(strlen(txt) == s.len && memcmp(txt, s.ptr, s.len) == 0);
        cr_assert_eq(tok_find(t, s.ptr, s.len), (int32_t)i);
    }
    gguf_close(f);
    tok_free(t);
}

/* llama.cpp's and ik_llama.cpp's prompt ids for the tiny reference models:
 * decoding them and encoding the text again (BOS added, as they did) gives
 * the same ids, with the tokenizer read from the model files themselves. */
static void check_prompt_ids(const char *model, const char *json)
{
    tok_t *t = load_vocab(model);
    size_t len;
    char *js = slurp(json, &len);
    int found = 0;
    for (char *p = strstr(js, "\"prompt_ids\""); p; p = strstr(p + 1, "\"prompt_ids\"")) {
        int32_t want[1024];
        size_t nw = 0, n, dl;
        char *q = strchr(p, '[');
        cr_assert(q);
        for (q++; nw < 1024;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q)
                break;
            want[nw++] = (int32_t)v;
            q = end + strspn(end, ", \n");
        }
        cr_assert(nw >= 2 && want[0] == tok_bos(t));
        char *text = decode(t, want, nw, false, &dl);
        int32_t *got = encode(t, text, dl, true, false, &n);
        cr_assert(n == nw && memcmp(got, want, n * sizeof *got) == 0, "%s prompt %d: '%s'", json, found, text);
        free(text);
        free(got);
        found++;
    }
    cr_assert(found >= 3, "%d prompts in %s", found, json);
    free(js);
    tok_free(t);
}

Test(tokenizer, reference_model_prompts)
{
    check_prompt_ids("../shared/models/tiny-ds2-q8_0.gguf", "../shared/reference/tiny-ds2-q8_0.llamacpp.json");
    check_prompt_ids("../shared/models/tiny-qwen3moe-q8_0.gguf",
                     "../shared/reference/tiny-qwen3moe-q8_0.ik_llama.json");
}

/* As llama.cpp: FIM tokens found by name become CONTROL (matched only with
 * parse_special); other user-defined tokens keep matching in plain text. */
Test(tokenizer, fim_tokens_become_control)
{
    tok_t *t = load_vocab(CODER_VOCAB);
    int32_t fim = id_of(t, "<｜fim▁begin｜>"), user = id_of(t, "<|User|>");
    cr_assert_eq(tok_token_type(t, fim), TOK_TYPE_CONTROL);
    cr_assert_eq(tok_token_type(t, user), TOK_TYPE_USER_DEFINED);
    const char *s = "x<｜fim▁begin｜>y<|User|>z";
    size_t n;
    int32_t *ids = encode(t, s, strlen(s), false, false, &n);
    bool has_fim = false, has_user = false;
    for (size_t i = 0; i < n; i++) {
        has_fim |= ids[i] == fim;
        has_user |= ids[i] == user;
    }
    cr_assert(!has_fim && has_user);
    free(ids);
    ids = encode(t, s, strlen(s), false, true, &n);
    cr_assert_eq(n, 5);
    cr_assert(ids[1] == fim && ids[3] == user);
    free(ids);
    tok_free(t);
}

/* ---- encode options ---- */

Test(tokenizer, add_special_and_capacity)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    const char *s = "Hello, world! 12345";
    size_t n0, n1;
    int32_t *plain = encode(t, s, strlen(s), false, false, &n0);
    int32_t *with = encode(t, s, strlen(s), true, false, &n1);
    cr_assert_eq(n1, n0 + 1);
    cr_assert_eq(with[0], tok_bos(t));
    cr_assert_eq(memcmp(with + 1, plain, n0 * sizeof *plain), 0);

    int32_t small[2];
    size_t need;
    cr_assert_eq(tok_encode(t, s, strlen(s), true, false, small, 2, &need), ECS_ERR_RANGE);
    cr_assert_eq(need, n1, "needed count is reported");
    cr_assert_eq(small[0], tok_bos(t));
    cr_assert_eq(tok_encode(t, s, strlen(s), true, false, small, 0, &need), ECS_ERR_RANGE);
    cr_assert_eq(need, n1);

    /* empty text: nothing, or just BOS */
    cr_assert_eq(tok_encode(t, "", 0, false, false, small, 2, &need), ECS_OK);
    cr_assert_eq(need, 0);
    cr_assert_eq(tok_encode(t, "", 0, true, false, small, 2, &need), ECS_OK);
    cr_assert_eq(need, 1);
    cr_assert_eq(small[0], tok_bos(t));
    free(plain);
    free(with);
    tok_free(t);
}

Test(tokenizer, special_tokens_in_text)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    const char *s = "Hi" DS_EOS "there";
    size_t np, nr;
    int32_t *parsed = encode(t, s, strlen(s), false, true, &np);
    int32_t *raw = encode(t, s, strlen(s), false, false, &nr);
    size_t nh, nt;
    int32_t *hi = encode(t, "Hi", 2, false, false, &nh);
    int32_t *there = encode(t, "there", 5, false, false, &nt);
    cr_assert_eq(np, nh + 1 + nt);
    cr_assert_eq(memcmp(parsed, hi, nh * sizeof *hi), 0);
    cr_assert_eq(parsed[nh], tok_eos(t));
    cr_assert_eq(memcmp(parsed + nh + 1, there, nt * sizeof *there), 0);
    /* without parse_special the control token is just text */
    for (size_t i = 0; i < nr; i++)
        cr_assert_neq(raw[i], tok_eos(t));
    size_t dl;
    char *d = decode(t, raw, nr, false, &dl);
    cr_assert_str_eq(d, s);
    free(d);
    /* control tokens render only on request */
    d = decode(t, parsed, np, false, &dl);
    cr_assert_str_eq(d, "Hithere");
    free(d);
    d = decode(t, parsed, np, true, &dl);
    cr_assert_str_eq(d, s);
    free(d);
    /* user-defined tokens are matched even without parse_special */
    int32_t udef = id_of(t, "ü");
    cr_assert_eq(tok_token_type(t, udef), TOK_TYPE_USER_DEFINED);
    int32_t *u = encode(t, "über", strlen("über"), false, false, &nr);
    cr_assert_eq(u[0], udef);
    free(u);
    free(parsed);
    free(raw);
    free(hi);
    free(there);
    tok_free(t);
}

Test(tokenizer, invalid_utf8_input_becomes_replacement)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    const char s[] = "a\xff" "b\xe2\x82" "c";
    size_t n, dl;
    int32_t *ids = encode(t, s, sizeof s - 1, false, false, &n);
    char *d = decode(t, ids, n, false, &dl);
    cr_assert_str_eq(d, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd" "c");
    free(d);
    free(ids);
    tok_free(t);
}
