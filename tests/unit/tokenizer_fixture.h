/* tokenizer_fixture.h - what the test_tokenizer_*.c files share: the
 * reference vocabularies and corpus, encode/decode wrappers, UTF-8 checks
 * and random text, hand-made vocabularies written to /tmp, expected token
 * lists, and a chat conversation. */
#ifndef ECS_TEST_TOKENIZER_FIXTURE_H
#define ECS_TEST_TOKENIZER_FIXTURE_H

/* each test file uses some of these */
#define FX static __attribute__((unused))

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/tokenizer/tokenizer.h"
#include "tests/unit/utf8_check.h"

#define LLM_VOCAB "../shared/reference/tokenizer/ggml-vocab-deepseek-llm.gguf"
#define CODER_VOCAB "../shared/reference/tokenizer/ggml-vocab-deepseek-coder.gguf"
#define CORPUS "coordinator/tokenizer/corpus.txt"
#define DS_BOS "<｜begin▁of▁sentence｜>"
#define DS_EOS "<｜end▁of▁sentence｜>"

/* ---- helpers ---- */

FX char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s (tests run from the repository root)", path);
    cr_assert(fseek(f, 0, SEEK_END) == 0);
    long len = ftell(f);
    cr_assert(len >= 0);
    rewind(f);
    char *buf = malloc((size_t)len + 1);
    cr_assert(buf);
    *n = fread(buf, 1, (size_t)len, f);
    cr_assert_eq(*n, (size_t)len);
    buf[*n] = '\0';
    fclose(f);
    return buf;
}

FX tok_t *load_path(const char *path, ecs_err_t *err)
{
    gguf_file_t *f;
    tok_t *t = NULL;
    *err = gguf_open(path, &f);
    if (*err)
        return NULL;
    *err = tok_load(f, &t);
    gguf_close(f);
    return t;
}

FX tok_t *load_vocab(const char *path)
{
    ecs_err_t err;
    tok_t *t = load_path(path, &err);
    cr_assert(t, "loading %s: %s", path, ecs_errmsg());
    return t;
}

FX int32_t *encode(const tok_t *t, const char *s, size_t len, bool add, bool parse, size_t *n)
{
    size_t cap = tok_encode_bound(len);
    int32_t *ids = malloc(cap * sizeof *ids);
    cr_assert(ids);
    ecs_err_t err = tok_encode(t, s, len, add, parse, ids, cap, n);
    cr_assert_eq(err, ECS_OK, "encode: %s", ecs_errmsg());
    return ids;
}

FX char *decode(const tok_t *t, const int32_t *ids, size_t n, bool render, size_t *len)
{
    size_t cap = 64 + n * tok_decoder_max_out(t);
    char *s = malloc(cap);
    cr_assert(s);
    ecs_err_t err = tok_decode(t, ids, n, render, s, cap, len);
    cr_assert_eq(err, ECS_OK, "decode: %s", ecs_errmsg());
    return s;
}

FX size_t put_utf8(unsigned cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

FX uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random valid UTF-8 mixing ASCII words, spaces, newlines, digits,
 * non-ASCII whitespace and 2-, 3- and 4-byte code points. */
FX size_t random_text(uint64_t *rng, char *out, size_t max_cps)
{
    static const unsigned spaces[] = { ' ', ' ', ' ', '\n', '\t', 0x85, 0xA0, 0x2028, 0x3000 };
    size_t n = rng_next(rng) % (max_cps + 1), o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned r = (unsigned)(rng_next(rng) % 100), cp;
        if (r < 35)
            cp = 'a' + (unsigned)(rng_next(rng) % 26);
        else if (r < 45)
            cp = spaces[rng_next(rng) % (sizeof spaces / sizeof *spaces)];
        else if (r < 52)
            cp = '0' + (unsigned)(rng_next(rng) % 10);
        else if (r < 60)
            cp = 0x21 + (unsigned)(rng_next(rng) % 94);
        else if (r < 72)
            cp = 0x80 + (unsigned)(rng_next(rng) % (0x800 - 0x80));
        else if (r < 88)
            do
                cp = 0x800 + (unsigned)(rng_next(rng) % (0x10000 - 0x800));
            while (cp >= 0xD800 && cp <= 0xDFFF);
        else
            cp = 0x10000 + (unsigned)(rng_next(rng) % (0x110000 - 0x10000));
        o += put_utf8(cp, out + o);
    }
    return o;
}

/* GPT-2's byte -> code point table, from its definition. */
FX unsigned gpt2_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
            n++;
    return 256 + n;
}

/* A GGUF with the 256 byte tokens (minus skip_byte, if >= 0), extra tokens
 * and merges; returns the loaded tokenizer or NULL with *err. */
FX tok_t *load_custom_typed(const char *model, const char *pre, int skip_byte, const char *const *extra,
                            const int32_t *extra_types, int n_extra, const char *const *merges,
                            int n_merges, ecs_err_t *err)
{
    static char bytes[256][5];
    const char *toks[512];
    int32_t types[512];
    int n = 0;
    for (unsigned b = 0; b < 256; b++) {
        if ((int)b == skip_byte)
            continue;
        size_t k = put_utf8(gpt2_cp(b), bytes[b]);
        bytes[b][k] = '\0';
        toks[n++] = bytes[b];
    }
    for (int i = 0; i < n; i++)
        types[i] = TOK_TYPE_NORMAL;
    for (int i = 0; i < n_extra; i++) {
        types[n] = extra_types ? extra_types[i] : TOK_TYPE_NORMAL;
        toks[n++] = extra[i];
    }
    char path[] = "/tmp/ecs_tok_test_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    gguf_writer_t *w;
    cr_assert_eq(gguf_writer_new(&w), ECS_OK);
    cr_assert_eq(gguf_writer_set_str(w, "tokenizer.ggml.model", model), ECS_OK);
    if (pre)
        cr_assert_eq(gguf_writer_set_str(w, "tokenizer.ggml.pre", pre), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges), ECS_OK);
    cr_assert_eq(gguf_writer_begin(w, path), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(gguf_writer_finish(w), ECS_OK, "%s", ecs_errmsg());
    gguf_writer_free(w);
    tok_t *t = load_path(path, err);
    unlink(path);
    return t;
}

FX tok_t *load_custom(const char *model, const char *pre, int skip_byte, const char *const *extra,
                      int n_extra, const char *const *merges, int n_merges, ecs_err_t *err)
{
    return load_custom_typed(model, pre, skip_byte, extra, NULL, n_extra, merges, n_merges, err);
}

FX int32_t id_of(const tok_t *t, const char *s)
{
    int32_t id = tok_find(t, s, strlen(s));
    cr_assert(id >= 0, "no token '%s'", s);
    return id;
}

FX void expect_ids(const tok_t *t, const char *text, const char *const *want, size_t nw)
{
    size_t n;
    int32_t *ids = encode(t, text, strlen(text), false, false, &n);
    cr_assert_eq(n, nw, "'%s': %zu tokens, expected %zu", text, n, nw);
    for (size_t i = 0; i < nw; i++)
        cr_assert_eq(ids[i], id_of(t, want[i]), "'%s' token %zu", text, i);
    free(ids);
}

FX const tok_chat_msg_t CONVO[] = {
    { "system", "Be brief." },
    { "user", "Hi" },
    { "assistant", "Hello!" },
    { "user", "2+2?" },
};

#endif /* ECS_TEST_TOKENIZER_FIXTURE_H */
