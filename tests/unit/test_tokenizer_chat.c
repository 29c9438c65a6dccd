/* test_tokenizer_chat.c - chat templates (detection, rendering, a model
 * without one) and the BPE trainer (the corpus vocabulary, deterministic and
 * bounded output, unknown templates as clear errors). */
#include "tests/unit/tokenizer_fixture.h"

/* ---- chat templates ---- */

Test(chat, detect)
{
    const char *chatml = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
    const char *ds3 = "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + "
                      "m['content'] }}{% else %}{{ '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' }}"
                      "{% endif %}{% endfor %}";
    cr_assert_eq(tok_chat_detect(tok_deepseek2_template, strlen(tok_deepseek2_template)), TOK_CHAT_DEEPSEEK2);
    cr_assert_eq(tok_chat_detect(chatml, strlen(chatml)), TOK_CHAT_CHATML);
    cr_assert_eq(tok_chat_detect(ds3, strlen(ds3)), TOK_CHAT_DEEPSEEK3);
    cr_assert_eq(tok_chat_detect("{{ messages }}", 14), TOK_CHAT_UNKNOWN);
    cr_assert_eq(tok_chat_detect("chatml", 6), TOK_CHAT_CHATML);
    cr_assert_eq(tok_chat_detect("deepseek2", 9), TOK_CHAT_DEEPSEEK2);
    cr_assert_eq(tok_chat_detect("", 0), TOK_CHAT_NONE);
}

Test(chat, render_formats)
{
    char out[512];
    size_t len;
    cr_assert_eq(tok_chat_apply(TOK_CHAT_DEEPSEEK2, CONVO, 4, true, out, sizeof out, &len), ECS_OK);
    cr_assert_str_eq(out, "Be brief.\n\nUser: Hi\n\nAssistant: Hello!" DS_EOS "User: 2+2?\n\nAssistant:");
    cr_assert_eq(len, strlen(out));
    cr_assert_eq(tok_chat_apply(TOK_CHAT_DEEPSEEK2, CONVO + 1, 1, false, out, sizeof out, &len), ECS_OK);
    cr_assert_str_eq(out, "User: Hi\n\n");
    cr_assert_eq(tok_chat_apply(TOK_CHAT_CHATML, CONVO, 4, true, out, sizeof out, &len), ECS_OK);
    cr_assert_str_eq(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                          "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                          "<|im_start|>assistant\n");
    cr_assert_eq(tok_chat_apply(TOK_CHAT_DEEPSEEK3, CONVO, 4, true, out, sizeof out, &len), ECS_OK);
    cr_assert_str_eq(out, "Be brief.\n\n<｜User｜>Hi<｜Assistant｜>Hello!" DS_EOS "<｜User｜>2+2?<｜Assistant｜>");

    size_t full = len;
    cr_assert_eq(tok_chat_apply(TOK_CHAT_DEEPSEEK3, CONVO, 4, true, out, 10, &len), ECS_ERR_RANGE);
    cr_assert_eq(len, full, "needed size is reported");
    tok_chat_msg_t bad = { "tool", "x" };
    cr_assert_eq(tok_chat_apply(TOK_CHAT_DEEPSEEK2, &bad, 1, false, out, sizeof out, &len), ECS_ERR_INVAL);
    cr_assert_eq(tok_chat_apply(TOK_CHAT_CHATML, &bad, 1, false, out, sizeof out, &len), ECS_OK);
    cr_assert_eq(tok_chat_apply(TOK_CHAT_UNKNOWN, CONVO, 1, false, out, sizeof out, &len), ECS_ERR_INVAL);
}

/* DeepSeek-V3's tool turns: calls inside their answer, a run of results as
 * one outputs block, the answer right after it (no assistant tag). */
Test(chat, deepseek3_tool_turns)
{
    static const tok_chat_msg_t m[] = {
        {"user", "Weather?"},
        {"assistant", ""},
        {"tool_call", "get\n```json\n{\"c\": 1}\n```"},
        {"tool_call", "put\n```json\n{}\n```"},
        {"tool", "sunny"},
        {"tool", "ok"},
        {"assistant", "Sunny."},
        {"user", "Thanks"},
        {"assistant", "I will check."},
        {"tool_call", "get\n```json\n{}\n```"},
        {"tool", "rain"},
    };
    char out[2048];
    size_t len;
    cr_assert_eq(tok_chat_apply(TOK_CHAT_DEEPSEEK3, m, 11, true, out, sizeof out, &len), ECS_OK);
    cr_assert_str_eq(out,
        "<｜User｜>Weather?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
        "<｜tool▁sep｜>get\n```json\n{\"c\": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>"
        "function<｜tool▁sep｜>put\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>" DS_EOS
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>\n"
        "<｜tool▁output▁begin｜>ok<｜tool▁output▁end｜><｜tool▁outputs▁end｜>Sunny." DS_EOS
        "<｜User｜>Thanks<｜Assistant｜>I will check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
        "function<｜tool▁sep｜>get\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>" DS_EOS
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>rain<｜tool▁output▁end｜>"
        "<｜tool▁outputs▁end｜>");
    /* a prompt that does not end with results ends with the assistant tag */
    cr_assert_eq(tok_chat_apply(TOK_CHAT_DEEPSEEK3, m, 8, true, out, sizeof out, &len), ECS_OK);
    cr_assert(len > 13 && !strcmp(out + len - strlen("<｜Assistant｜>"), "<｜Assistant｜>"));
    /* the other templates have no such roles */
    cr_assert_eq(tok_chat_apply(TOK_CHAT_DEEPSEEK2, m, 3, true, out, sizeof out, &len), ECS_ERR_INVAL);
    cr_assert(strstr(ecs_errmsg(), "'tool_call'"), "%s", ecs_errmsg());
}

Test(chat, model_without_template_needs_fallback)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    char out[512];
    size_t len, n;
    cr_assert_eq(tok_chat_format(t, TOK_CHAT_NONE, CONVO, 4, true, out, sizeof out, &len), ECS_ERR_NOTFOUND);
    cr_assert_eq(tok_chat_format(t, TOK_CHAT_DEEPSEEK2, CONVO, 4, true, out, sizeof out, &len), ECS_OK);
    /* encoded as documented: BOS added, the end-of-sentence text parsed */
    int32_t *ids = encode(t, out, len, true, true, &n);
    cr_assert_eq(ids[0], tok_bos(t));
    size_t eos_count = 0;
    for (size_t i = 0; i < n; i++)
        eos_count += ids[i] == tok_eos(t);
    cr_assert_eq(eos_count, 1, "one finished assistant turn");
    free(ids);
    tok_free(t);
}

/* ---- the trainer ---- */

static char *train_to_file(const char *text, size_t len, int merges, const char *chat_override,
                           uint32_t *n_vocab)
{
    static char path[64];
    strcpy(path, "/tmp/ecs_tok_train_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    gguf_writer_t *w;
    cr_assert_eq(gguf_writer_new(&w), ECS_OK);
    cr_assert_eq(tok_train_to_gguf(text, len, merges, w, n_vocab), ECS_OK, "%s", ecs_errmsg());
    if (chat_override)
        cr_assert_eq(gguf_writer_set_str(w, "tokenizer.chat_template", chat_override), ECS_OK);
    cr_assert_eq(gguf_writer_begin(w, path), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(gguf_writer_finish(w), ECS_OK, "%s", ecs_errmsg());
    gguf_writer_free(w);
    return path;
}

Test(train, corpus_vocabulary)
{
    size_t len;
    char *text = slurp(CORPUS, &len);
    cr_assert(len >= 20000 && len <= 60000, "corpus is %zu bytes", len);
    uint32_t nv;
    char *path = train_to_file(text, len, 2000, NULL, &nv);
    cr_assert(nv > 258 + 1000 && nv <= 258 + 2000, "%u tokens", nv);

    gguf_file_t *f;
    cr_assert_eq(gguf_open(path, &f), ECS_OK, "%s", ecs_errmsg());
    gguf_str_t s;
    cr_assert_eq(gguf_get_str(f, "tokenizer.ggml.model", &s), ECS_OK);
    cr_assert(gguf_str_eq(s, "gpt2"));
    cr_assert_eq(gguf_get_str(f, "tokenizer.ggml.pre", &s), ECS_OK);
    cr_assert(gguf_str_eq(s, "deepseek-llm"));
    uint32_t pad;
    cr_assert_eq(gguf_get_u32(f, "tokenizer.ggml.padding_token_id", &pad), ECS_OK);
    tok_t *t;
    cr_assert_eq(tok_load(f, &t), ECS_OK, "%s", ecs_errmsg());
    gguf_close(f);
    unlink(path);

    cr_assert_eq((uint32_t)tok_n_vocab(t), nv);
    cr_assert_str_eq(tok_token_text(t, tok_bos(t)), DS_BOS);
    cr_assert_str_eq(tok_token_text(t, tok_eos(t)), DS_EOS);
    cr_assert_eq((int32_t)pad, tok_eos(t));
    cr_assert_eq(tok_token_type(t, tok_bos(t)), TOK_TYPE_CONTROL);
    cr_assert_eq(tok_token_type(t, tok_eos(t)), TOK_TYPE_CONTROL);
    cr_assert(tok_add_bos(t) && !tok_add_eos(t));
    cr_assert(tok_is_eog(t, tok_eos(t)));
    cr_assert_eq(tok_chat_kind(t), TOK_CHAT_DEEPSEEK2);
    cr_assert_str_eq(tok_token_text(t, 0), "!", "byte tokens in GPT-2 order");

    /* round trip of the whole corpus and of random text */
    size_t n, dl;
    int32_t *ids = encode(t, text, len, true, false, &n);
    cr_assert_eq(ids[0], tok_bos(t));
    cr_assert(n < len / 2, "%zu tokens for %zu bytes: merges were learned", n, len);
    char *d = decode(t, ids, n, false, &dl);
    cr_assert(dl == len && memcmp(d, text, len) == 0);
    free(ids);
    free(d);
    uint64_t rng = 7;
    char buf[4096];
    for (int i = 0; i < 30; i++) {
        size_t l = random_text(&rng, buf, 500);
        ids = encode(t, buf, l, false, false, &n);
        d = decode(t, ids, n, false, &dl);
        cr_assert(dl == l && memcmp(d, buf, l) == 0);
        free(ids);
        free(d);
    }
    /* frequent words became single tokens */
    const char *words[] = { " the", " and", " of", " to", " a", " in", " is" };
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        ids = encode(t, words[i], strlen(words[i]), false, false, &n);
        cr_assert_eq(n, 1, "'%s' is %zu tokens", words[i], n);
        free(ids);
    }
    /* chat prompt in the trained vocabulary, end of turn parsed */
    char out[512];
    size_t cl;
    cr_assert_eq(tok_chat_format(t, TOK_CHAT_NONE, CONVO, 4, true, out, sizeof out, &cl), ECS_OK);
    ids = encode(t, out, cl, true, true, &n);
    size_t eos = 0;
    for (size_t i = 0; i < n; i++)
        eos += ids[i] == tok_eos(t);
    cr_assert_eq(eos, 1);
    free(ids);
    free(text);
    tok_free(t);
}

Test(train, deterministic_and_bounded)
{
    size_t len;
    char *text = slurp(CORPUS, &len);
    uint32_t n1, n2;
    char p1[64], p2[64];
    strcpy(p1, train_to_file(text, len, 300, NULL, &n1));
    strcpy(p2, train_to_file(text, len, 300, NULL, &n2));
    cr_assert_eq(n1, n2);
    gguf_file_t *f;
    const gguf_value_t *mv;
    cr_assert_eq(gguf_open(p1, &f), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &mv), ECS_OK);
    cr_assert_eq(mv->arr.n, 300, "a large corpus reaches the target exactly");
    cr_assert(n1 > 258 && n1 <= 258 + 300);
    gguf_close(f);
    size_t l1, l2;
    char *a = slurp(p1, &l1), *b = slurp(p2, &l2);
    cr_assert(l1 == l2 && memcmp(a, b, l1) == 0, "same input, same file");
    unlink(p1);
    unlink(p2);
    free(a);
    free(b);
    /* no pair occurs twice: nothing to merge */
    uint32_t nv;
    char *p = train_to_file("abcdef", 6, 100, NULL, &nv);
    unlink(p);
    cr_assert_eq(nv, 258);
    /* "aaaa" x 3: (a,a) merges to "aa", then (aa,aa) to "aaaa" */
    p = train_to_file("aaaa aaaa aaaa", 14, 100, NULL, &nv);
    ecs_err_t err;
    tok_t *t = load_path(p, &err);
    unlink(p);
    cr_assert(t, "%s", ecs_errmsg());
    expect_ids(t, "aaaa", (const char *[]){ "aaaa" }, 1);
    expect_ids(t, "aaa", (const char *[]){ "aa", "a" }, 2);
    tok_free(t);
    free(text);
}

Test(train, unknown_template_is_a_clear_error)
{
    uint32_t nv;
    char *p = train_to_file("hello hello world", 17, 10, "{% for m in msgs %}{{ m.text }}\nsecond line", &nv);
    ecs_err_t err;
    tok_t *t = load_path(p, &err);
    unlink(p);
    cr_assert(t, "%s", ecs_errmsg());
    cr_assert_eq(tok_chat_kind(t), TOK_CHAT_UNKNOWN);
    char out[256];
    size_t len;
    cr_assert_eq(tok_chat_format(t, TOK_CHAT_CHATML, CONVO, 2, true, out, sizeof out, &len), ECS_ERR_UNSUPPORTED);
    cr_assert(strstr(ecs_errmsg(), "{% for m in msgs %}{{ m.text }}"), "%s", ecs_errmsg());
    cr_assert_null(strstr(ecs_errmsg(), "second line"));
    tok_free(t);
}
