/* test_tokenizer_bpe.c - BPE semantics on hand-made vocabularies: merge rank
 * order and ties, special tokens partitioning the text, wide whitespace as
 * llama.cpp splits it, load errors, and every pretokenizer round-tripping. */
#include "tests/unit/fuzz_seed.h"
#include "tests/unit/tokenizer_fixture.h"

/* ---- BPE semantics on hand-made vocabularies ---- */

Test(tokenizer, bpe_rank_order_and_ties)
{
    const char *extra[] = { "bc", "ab", "aa", "xyz" };
    /* rank 0 "b c" beats rank 1 "a b" although "a b" is further left;
     * "x y" makes the non-token "xy", which still merges on into "xyz" */
    const char *merges[] = { "b c", "a b", "a a", "x y", "xy z" };
    ecs_err_t err;
    tok_t *t = load_custom("gpt2", "gpt2", -1, extra, 4, merges, 5, &err);
    cr_assert(t, "%s", ecs_errmsg());
    expect_ids(t, "abc", (const char *[]){ "a", "bc" }, 2);
    expect_ids(t, "ab", (const char *[]){ "ab" }, 1);
    expect_ids(t, "aaa", (const char *[]){ "aa", "a" }, 2);     /* leftmost first */
    expect_ids(t, "aaaaa", (const char *[]){ "aa", "aa", "a" }, 3);
    expect_ids(t, "xyz", (const char *[]){ "xyz" }, 1);
    expect_ids(t, "xy", (const char *[]){ "x", "y" }, 2);        /* "xy" is no token: bytes */
    expect_ids(t, "ab abc", (const char *[]){ "ab", "Ġ", "a", "bc" }, 4);
    tok_free(t);
}

static void expect_ids_special(const tok_t *t, const char *text, bool parse, const char *const *want,
                               size_t nw)
{
    size_t n;
    int32_t *ids = encode(t, text, strlen(text), false, parse, &n);
    cr_assert_eq(n, nw, "'%s': %zu tokens, expected %zu", text, n, nw);
    for (size_t i = 0; i < nw; i++)
        cr_assert_eq(ids[i], id_of(t, want[i]), "'%s' token %zu", text, i);
    free(ids);
}

/* llama.cpp's partition: the longest special text is taken first even if a
 * shorter one starts further left; user-defined tokens always match, control
 * tokens only with parse_special. */
Test(tokenizer, special_partition_order)
{
    const char *extra[] = { "ab", "bcd", "<c>" };
    const int32_t types[] = { TOK_TYPE_USER_DEFINED, TOK_TYPE_USER_DEFINED, TOK_TYPE_CONTROL };
    const char *merges[] = { "x y" };
    ecs_err_t err;
    tok_t *t = load_custom_typed("gpt2", "qwen2", -1, extra, types, 3, merges, 1, &err);
    cr_assert(t, "%s", ecs_errmsg());
    expect_ids_special(t, "abcd", false, (const char *[]){ "a", "bcd" }, 2);
    expect_ids_special(t, "abab", false, (const char *[]){ "ab", "ab" }, 2);
    expect_ids_special(t, "zab<c>", false, (const char *[]){ "z", "ab", "<", "c", ">" }, 5);
    expect_ids_special(t, "zab<c>", true, (const char *[]){ "z", "ab", "<c>" }, 3);
    tok_free(t);
}

/* Non-ASCII whitespace is seen as whitespace by the regexes, as in llama.cpp
 * (which maps it to U+000B first): in "!<U+3000>!" deepseek-llm's CJK block
 * regex (whose range includes U+3000) must not split off the ideographic
 * space, so the words are "!" and "<U+3000>!", and the latter merges whole. */
Test(tokenizer, wide_whitespace_like_llama_cpp)
{
    /* U+3000 is E3 80 80: GPT-2 characters U+00E3 U+0122 U+0122 */
    const char *extra[] = { "ãĢ", "ãĢĢ", "ãĢĢ!" };
    const char *merges[] = { "ã Ģ", "ãĢ Ģ", "ãĢĢ !" };
    ecs_err_t err;
    tok_t *t = load_custom("gpt2", "deepseek-llm", -1, extra, 3, merges, 3, &err);
    cr_assert(t, "%s", ecs_errmsg());
    expect_ids(t, "!\xe3\x80\x80!", (const char *[]){ "!", "ãĢĢ!" }, 2);
    tok_free(t);
}

Test(tokenizer, load_errors)
{
    const char *merges[] = { "a b" };
    ecs_err_t err;
    cr_assert_null(load_custom("llama", NULL, -1, NULL, 0, merges, 1, &err));
    cr_assert_eq(err, ECS_ERR_UNSUPPORTED);
    cr_assert_null(load_custom("gpt2", "no-such-pre", -1, NULL, 0, merges, 1, &err));
    cr_assert_eq(err, ECS_ERR_UNSUPPORTED);
    cr_assert(strstr(ecs_errmsg(), "no-such-pre"), "message names it: %s", ecs_errmsg());
    cr_assert_null(load_custom("gpt2", "qwen2", 'q', NULL, 0, merges, 1, &err));
    cr_assert_eq(err, ECS_ERR_FORMAT);
    const char *dup[] = { "a" };
    cr_assert_null(load_custom("gpt2", "qwen2", -1, dup, 1, merges, 1, &err));
    cr_assert_eq(err, ECS_ERR_FORMAT, "duplicate token");
    /* no pre key: llama.cpp's default list */
    tok_t *t = load_custom("gpt2", NULL, -1, NULL, 0, merges, 1, &err);
    cr_assert(t, "%s", ecs_errmsg());
    cr_assert_str_eq(tok_pre_name(t), "default");
    tok_free(t);
}

/* A token type outside the enum and an empty merge list are load errors
 * naming the key, not silently "undefined" tokens or an unmerged BPE. */
Test(tokenizer, load_errors_types_merges)
{
    const char *merges[] = { "a b" };
    const char *extra[] = { "zz" };
    const int32_t bad[] = { 99 };
    ecs_err_t err;
    cr_assert_null(load_custom_typed("gpt2", "qwen2", -1, extra, bad, 1, merges, 1, &err));
    cr_assert_eq(err, ECS_ERR_FORMAT);
    cr_assert(strstr(ecs_errmsg(), "token_type") && strstr(ecs_errmsg(), "99"), "%s", ecs_errmsg());
    cr_assert_null(load_custom("gpt2", "qwen2", -1, NULL, 0, merges, 0, &err));
    cr_assert_eq(err, ECS_ERR_FORMAT);
    cr_assert(strstr(ecs_errmsg(), "merges is empty"), "%s", ecs_errmsg());
}

/* Pre-tokenizers that have no reference vectors here still split text into
 * pieces that cover it exactly: every byte comes back, in order. */
Test(tokenizer, every_pretokenizer_round_trips)
{
    const char *pres[] = { "deepseek-llm", "deepseek-coder", "deepseek-v3", "qwen2", "gpt-2", "default" };
    const char *merges[] = { "Ġ t", "h e", "Ġt he" };
    const char *extra[] = { "Ġt", "he", "Ġthe" };
    uint64_t rng = 0x1234567u;
    char buf[2048];
    for (size_t p = 0; p < sizeof pres / sizeof *pres; p++) {
        ecs_err_t err;
        tok_t *t = load_custom("gpt2", pres[p], -1, extra, 3, merges, 3, &err);
        cr_assert(t, "%s: %s", pres[p], ecs_errmsg());
        cr_assert_str_eq(tok_pre_name(t), pres[p]);
        expect_ids(t, " the", (const char *[]){ "Ġthe" }, 1);
        for (int i = 0; i < 40; i++) {
            size_t len = random_text(&rng, buf, 300), n, dl;
            int32_t *ids = encode(t, buf, len, false, false, &n);
            char *d = decode(t, ids, n, false, &dl);
            cr_assert(dl == len && memcmp(d, buf, len) == 0, "%s: round trip %d", pres[p], i);
            free(d);
            free(ids);
        }
        tok_free(t);
    }
}

/* ---- fuzz_tok_load's seeds ----
 * Small vocabularies of each pre-tokenizer and chat template, with control,
 * user-defined and special-id keys, that load and encode here. With
 * ECS_WRITE_FUZZ_CORPUS=DIR set they are also written there (the checked-in
 * seeds of tests/fuzz/corpus/fuzz_tok_load came from it). */

static void write_seed_vocab(const char *path, const char *pre, const char *tmpl,
                             const char *const *extra, const int32_t *extra_types, int n_extra)
{
    static char bytes[256][5];
    const char *toks[300];
    int32_t types[300];
    int n = 0;
    for (unsigned b = 0; b < 256; b++) {
        bytes[b][put_utf8(gpt2_cp(b), bytes[b])] = '\0';
        types[n] = TOK_TYPE_NORMAL;
        toks[n++] = bytes[b];
    }
    for (int i = 0; i < n_extra; i++) {
        types[n] = extra_types[i];
        toks[n++] = extra[i];
    }
    const char *merges[] = { "h e", "l l", "he ll", "Ġ w", "o r", "Ġw or" };
    gguf_writer_t *w;
    cr_assert_eq(gguf_writer_new(&w), ECS_OK);
    cr_assert_eq(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"), ECS_OK);
    cr_assert_eq(gguf_writer_set_str(w, "tokenizer.ggml.pre", pre), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types,
                                     (uint64_t)n), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 6), ECS_OK);
    cr_assert_eq(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 256 + 6), ECS_OK);
    cr_assert_eq(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256 + 7), ECS_OK);
    cr_assert_eq(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true), ECS_OK);
    if (tmpl)
        cr_assert_eq(gguf_writer_set_str(w, "tokenizer.chat_template", tmpl), ECS_OK);
    cr_assert_eq(gguf_writer_begin(w, path), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(gguf_writer_finish(w), ECS_OK, "%s", ecs_errmsg());
    gguf_writer_free(w);
}

Test(tokenizer, fuzz_seed_vocabularies)
{
    const char *extra[] = { "he", "ll", "hell", "Ġw", "or", "Ġwor",
                            "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                            "<|im_start|>", "<|im_end|>", "<think>" };
    const int32_t types[] = { 1, 1, 1, 1, 1, 1, TOK_TYPE_CONTROL, TOK_TYPE_CONTROL,
                              TOK_TYPE_CONTROL, TOK_TYPE_CONTROL, TOK_TYPE_USER_DEFINED };
    const struct {
        const char *name, *pre, *tmpl;
        tok_chat_kind_t kind;
    } seeds[] = {
        { "deepseek-llm", "deepseek-llm", "deepseek2", TOK_CHAT_DEEPSEEK2 },
        { "deepseek-coder", "deepseek-coder", NULL, TOK_CHAT_NONE },
        { "deepseek-v3", "deepseek-v3", "deepseek3", TOK_CHAT_DEEPSEEK3 },
        { "qwen2", "qwen2", "chatml", TOK_CHAT_CHATML },
        { "gpt2", "gpt2", "{{ unknown template }}", TOK_CHAT_UNKNOWN },
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char path[] = "/tmp/ecs_tok_seed_XXXXXX";
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        close(fd);
        write_seed_vocab(path, seeds[i].pre, seeds[i].tmpl, extra, types, 11);
        ecs_err_t err;
        tok_t *t = load_path(path, &err);
        cr_assert(t, "%s: %s", seeds[i].name, ecs_errmsg());
        cr_assert_eq(tok_chat_kind(t), seeds[i].kind, "%s", seeds[i].name);
        cr_assert_eq(tok_bos(t), id_of(t, DS_BOS));
        expect_ids(t, "hello world", (const char *[]){ "hell", "o", "Ġwor", "l", "d" }, 5);
        size_t n;
        int32_t *ids = encode(t, "<|im_end|><think>", 17, true, true, &n);
        cr_assert(n == 3 && ids[0] == tok_bos(t) && ids[1] == id_of(t, "<|im_end|>") &&
                  ids[2] == id_of(t, "<think>"), "%s: %zu ids", seeds[i].name, n);
        free(ids);
        tok_free(t);
        fuzz_seed_copy(path, seeds[i].name);
        unlink(path);
    }
}
