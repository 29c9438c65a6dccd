/* test_tokenizer.c - the tokenizer against llama.cpp's test vectors for the
 * DeepSeek LLM and Coder vocabularies, BPE semantics on hand-made
 * vocabularies, round trips of random UTF-8, the streaming decoder's UTF-8
 * guarantees, chat templates and the BPE trainer. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/tokenizer/tokenizer.h"

#define LLM_VOCAB "../shared/reference/tokenizer/ggml-vocab-deepseek-llm.gguf"
#define CODER_VOCAB "../shared/reference/tokenizer/ggml-vocab-deepseek-coder.gguf"
#define CORPUS "coordinator/tokenizer/corpus.txt"
#define DS_BOS "<｜begin▁of▁sentence｜>"
#define DS_EOS "<｜end▁of▁sentence｜>"

/* ---- helpers ---- */

static char *slurp(const char *path, size_t *n)
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

static tok_t *load_path(const char *path, ecs_err_t *err)
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

static tok_t *load_vocab(const char *path)
{
    ecs_err_t err;
    tok_t *t = load_path(path, &err);
    cr_assert(t, "loading %s: %s", path, ecs_errmsg());
    return t;
}

static int32_t *encode(const tok_t *t, const char *s, size_t len, bool add, bool parse, size_t *n)
{
    size_t cap = tok_encode_bound(len);
    int32_t *ids = malloc(cap * sizeof *ids);
    cr_assert(ids);
    ecs_err_t err = tok_encode(t, s, len, add, parse, ids, cap, n);
    cr_assert_eq(err, ECS_OK, "encode: %s", ecs_errmsg());
    return ids;
}

static char *decode(const tok_t *t, const int32_t *ids, size_t n, bool render, size_t *len)
{
    size_t cap = 64 + n * tok_decoder_max_out(t);
    char *s = malloc(cap);
    cr_assert(s);
    ecs_err_t err = tok_decode(t, ids, n, render, s, cap, len);
    cr_assert_eq(err, ECS_OK, "decode: %s", ecs_errmsg());
    return s;
}

/* Strict UTF-8 check written independently of the module. */
static bool utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + len > n)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        unsigned min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

static size_t put_utf8(unsigned cp, char *o)
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

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random valid UTF-8 mixing ASCII words, spaces, newlines, digits,
 * non-ASCII whitespace and 2-, 3- and 4-byte code points. */
static size_t random_text(uint64_t *rng, char *out, size_t max_cps)
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
static unsigned gpt2_cp(unsigned b)
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
static tok_t *load_custom_typed(const char *model, const char *pre, int skip_byte, const char *const *extra,
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

static tok_t *load_custom(const char *model, const char *pre, int skip_byte, const char *const *extra,
                          int n_extra, const char *const *merges, int n_merges, ecs_err_t *err)
{
    return load_custom_typed(model, pre, skip_byte, extra, NULL, n_extra, merges, n_merges, err);
}

static int32_t id_of(const tok_t *t, const char *s)
{
    int32_t id = tok_find(t, s, strlen(s));
    cr_assert(id >= 0, "no token '%s'", s);
    return id;
}

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

/* ---- BPE semantics on hand-made vocabularies ---- */

static void expect_ids(const tok_t *t, const char *text, const char *const *want, size_t nw)
{
    size_t n;
    int32_t *ids = encode(t, text, strlen(text), false, false, &n);
    cr_assert_eq(n, nw, "'%s': %zu tokens, expected %zu", text, n, nw);
    for (size_t i = 0; i < nw; i++)
        cr_assert_eq(ids[i], id_of(t, want[i]), "'%s' token %zu", text, i);
    free(ids);
}

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

/* ---- round trips and the streaming decoder ---- */

Test(tokenizer, random_utf8_round_trip)
{
    const char *vocabs[] = { LLM_VOCAB, CODER_VOCAB };
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    char buf[4096];
    for (int v = 0; v < 2; v++) {
        tok_t *t = load_vocab(vocabs[v]);
        for (int i = 0; i < 150; i++) {
            size_t len = random_text(&rng, buf, 600), n, dl;
            cr_assert(utf8_valid(buf, len));
            int32_t *ids = encode(t, buf, len, v == 0, false, &n);
            char *d = decode(t, ids, n, false, &dl);
            cr_assert(dl == len && memcmp(d, buf, len) == 0, "%s: text %d does not round-trip", vocabs[v], i);
            free(d);
            free(ids);
        }
        tok_free(t);
    }
}

Test(tokenizer, streaming_decoder_emits_only_complete_utf8)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    uint64_t rng = 42;
    char text[4096];
    size_t cap = tok_decoder_max_out(t);
    char *chunk = malloc(cap), *all = malloc(8192);
    cr_assert(chunk && all);
    for (int i = 0; i < 100; i++) {
        size_t len = random_text(&rng, text, 400), n, k, total = 0;
        int32_t *ids = encode(t, text, len, false, false, &n);
        tok_decoder_t d;
        tok_decoder_init(&d, t, false);
        for (size_t j = 0; j <= n; j++) {
            ecs_err_t err = j < n ? tok_decoder_push(&d, ids[j], chunk, cap, &k) : tok_decoder_flush(&d, chunk, cap, &k);
            cr_assert_eq(err, ECS_OK, "%s", ecs_errmsg());
            cr_assert(utf8_valid(chunk, k), "chunk after token %zu is not valid UTF-8", j);
            memcpy(all + total, chunk, k);
            total += k;
        }
        cr_assert(total == len && memcmp(all, text, len) == 0, "streamed text %d differs", i);
        free(ids);
    }
    /* random ids, many of them partial sequences: output is still valid */
    for (int i = 0; i < 50; i++) {
        tok_decoder_t d;
        size_t k, total = 0;
        tok_decoder_init(&d, t, i & 1);
        for (int j = 0; j <= 60; j++) {
            int32_t id = (int32_t)(rng_next(&rng) % (uint64_t)tok_n_vocab(t));
            ecs_err_t err = j < 60 ? tok_decoder_push(&d, id, chunk, cap, &k) : tok_decoder_flush(&d, chunk, cap, &k);
            cr_assert_eq(err, ECS_OK, "%s", ecs_errmsg());
            cr_assert(utf8_valid(chunk, k), "random chunk %d/%d is not valid UTF-8", i, j);
            total += k;
        }
        cr_assert(total > 0);
    }
    free(chunk);
    free(all);
    tok_free(t);
}

Test(tokenizer, decoder_holds_back_partial_sequences)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    char out[256];
    size_t k;
    tok_decoder_t d;
    /* a 4-byte emoji spelled as three tokens */
    const char *llama = "\xf0\x9f\xa6\x99";
    size_t n;
    int32_t *ids = encode(t, llama, 4, false, false, &n);
    cr_assert(n >= 2, "the emoji should need several tokens in this vocabulary");
    tok_decoder_init(&d, t, false);
    for (size_t j = 0; j + 1 < n; j++) {
        cr_assert_eq(tok_decoder_push(&d, ids[j], out, sizeof out, &k), ECS_OK);
        cr_assert_eq(k, 0, "partial emoji must be held back");
    }
    cr_assert_eq(tok_decoder_push(&d, ids[n - 1], out, sizeof out, &k), ECS_OK);
    cr_assert(k == 4 && memcmp(out, llama, 4) == 0);
    free(ids);

    /* lead byte 0xE2 ('â' in GPT-2's mapping) then 'A': the lead can never
     * complete, so it becomes U+FFFD as soon as 'A' arrives */
    char lead[3];
    lead[put_utf8(gpt2_cp(0xE2), lead)] = '\0';
    tok_decoder_init(&d, t, false);
    cr_assert_eq(tok_decoder_push(&d, id_of(t, lead), out, sizeof out, &k), ECS_OK);
    cr_assert_eq(k, 0);
    cr_assert_eq(tok_decoder_push(&d, id_of(t, "A"), out, sizeof out, &k), ECS_OK);
    cr_assert(k == 4 && memcmp(out, "\xef\xbf\xbd" "A", 4) == 0);
    /* an unfinished sequence at the end is flushed as U+FFFD */
    cr_assert_eq(tok_decoder_push(&d, id_of(t, lead), out, sizeof out, &k), ECS_OK);
    cr_assert_eq(k, 0);
    cr_assert_eq(tok_decoder_flush(&d, out, sizeof out, &k), ECS_OK);
    cr_assert(k == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0);
    cr_assert_eq(tok_decoder_flush(&d, out, sizeof out, &k), ECS_OK);
    cr_assert_eq(k, 0);
    /* too small a buffer: error, nothing lost */
    int32_t hello = id_of(t, "Hello");
    cr_assert_eq(tok_decoder_push(&d, hello, out, 2, &k), ECS_ERR_RANGE);
    cr_assert_eq(tok_decoder_push(&d, hello, out, sizeof out, &k), ECS_OK);
    cr_assert(k == 5 && memcmp(out, "Hello", 5) == 0);
    cr_assert_eq(tok_decoder_push(&d, tok_n_vocab(t), out, sizeof out, &k), ECS_ERR_RANGE);
    tok_free(t);
}

/* Long inputs: one huge word and a huge whitespace run finish and round-trip
 * (regex backtracking and merging stay near-linear). */
Test(tokenizer, long_inputs)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    size_t len = 200000, n, dl;
    char *s = malloc(len + 1);
    cr_assert(s);
    for (size_t i = 0; i < len; i++)
        s[i] = "abcdefghij"[i % 10];
    int32_t *ids = encode(t, s, len, false, false, &n);
    char *d = decode(t, ids, n, false, &dl);
    cr_assert(dl == len && memcmp(d, s, len) == 0);
    free(ids);
    free(d);
    memset(s, ' ', len);
    s[len - 1] = '7';
    ids = encode(t, s, len, false, false, &n);
    d = decode(t, ids, n, false, &dl);
    cr_assert(dl == len && memcmp(d, s, len) == 0);
    free(ids);
    free(d);
    free(s);
    tok_free(t);
}

typedef struct {
    const tok_t *t;
    const char *text;
    size_t len, n;
    int32_t *ids;
} job_t;

static void *encode_job(void *arg)
{
    job_t *j = arg;
    size_t cap = tok_encode_bound(j->len);
    j->ids = malloc(cap * sizeof *j->ids);
    if (j->ids && tok_encode(j->t, j->text, j->len, true, false, j->ids, cap, &j->n) != ECS_OK)
        j->n = 0;
    return NULL;
}

Test(tokenizer, concurrent_encoding_agrees)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    size_t len;
    char *text = slurp(CORPUS, &len);
    job_t jobs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (job_t){ t, text, len, 0, NULL };
        cr_assert_eq(pthread_create(&th[i], NULL, encode_job, &jobs[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    cr_assert(jobs[0].n > 0);
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(jobs[i].n, jobs[0].n);
        cr_assert_eq(memcmp(jobs[i].ids, jobs[0].ids, jobs[0].n * sizeof(int32_t)), 0);
    }
    for (int i = 0; i < 3; i++)
        free(jobs[i].ids);
    free(text);
    tok_free(t);
}

/* ---- chat templates ---- */

static const tok_chat_msg_t CONVO[] = {
    { "system", "Be brief." },
    { "user", "Hi" },
    { "assistant", "Hello!" },
    { "user", "2+2?" },
};

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
