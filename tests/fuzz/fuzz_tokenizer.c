/* fuzz_tokenizer.c - libFuzzer target for the tokenizer, what a user's text
 * meets right after the request parser (coordinator/tokenizer/). The first
 * byte picks a real vocabulary (DeepSeek-LLM's and DeepSeek-Coder's
 * reference vocabularies, the tiny Qwen3-MoE model's ChatML one, read from
 * $ECS_SHARED, default ../shared, at start-up) and the switches; the rest
 * is the text. Any text must encode, with and without BOS and control-token
 * parsing, into ids in range within tok_encode_bound; valid UTF-8 encoded
 * without control-token parsing must decode back to itself byte for byte;
 * the text read as token ids must stream out of the decoder as valid UTF-8,
 * never more than tok_decoder_max_out a push, and an invalid id must be
 * refused with the decoder unchanged; the text as a user's message must
 * render with the vocabulary's chat template and encode. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/tokenizer/tokenizer.h"
#include "tests/unit/utf8_check.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const VOCABS[] = {
    "reference/tokenizer/ggml-vocab-deepseek-llm.gguf",
    "reference/tokenizer/ggml-vocab-deepseek-coder.gguf",
    "models/tiny-qwen3moe-q8_0.gguf",
};
enum { N_VOCABS = sizeof VOCABS / sizeof VOCABS[0] };
static tok_t *g_tok[N_VOCABS];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *shared = getenv("ECS_SHARED") ? getenv("ECS_SHARED") : "../shared";
    for (int i = 0; i < N_VOCABS; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", shared, VOCABS[i]);
        gguf_file_t *f;
        if (gguf_open(path, &f) != ECS_OK || tok_load(f, &g_tok[i]) != ECS_OK) {
            fprintf(stderr, "fuzz_tokenizer: cannot load the vocabulary of %s: %s\n", path,
                    ecs_errmsg());
            exit(2);
        }
        gguf_close(f);
    }
    return 0;
}

/* Encodes text; every id in range, the count within the bound. */
static int32_t *encode_checked(const tok_t *t, const char *text, size_t len, int add, int parse,
                               size_t *n)
{
    const size_t cap = tok_encode_bound(len);
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return NULL;
    if (tok_encode(t, text, len, add, parse, ids, cap, n) != ECS_OK || *n > cap)
        __builtin_trap();
    for (size_t i = 0; i < *n; i++)
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(t))
            __builtin_trap();
    return ids;
}

/* Valid UTF-8 without control-token parsing comes back as it went in (BOS
 * is a control token: it renders as nothing). */
static void check_round_trip(const tok_t *t, const char *text, size_t len, const int32_t *ids,
                             size_t n)
{
    const size_t cap = 64 + n * tok_decoder_max_out(t);
    char *out = malloc(cap);
    size_t got;
    if (!out)
        return;
    if (tok_decode(t, ids, n, false, out, cap, &got) != ECS_OK || got != len ||
        memcmp(out, text, len) != 0)
        __builtin_trap();
    free(out);
}

/* The input read as ids (3 bytes each) through the streaming decoder. */
static void check_stream(const tok_t *t, const uint8_t *p, size_t len, int render)
{
    const size_t max = tok_decoder_max_out(t);
    char *chunk = malloc(max);
    uint8_t *all = malloc(len / 3 * max + max + 1);
    if (!chunk || !all)
        goto done;
    tok_decoder_t d;
    tok_decoder_init(&d, t, render);
    size_t total = 0, n;
    for (size_t i = 0; i + 3 <= len; i += 3) {
        const int32_t id = (int32_t)((p[i] | p[i + 1] << 8 | (uint32_t)p[i + 2] << 16) %
                                     (uint32_t)tok_n_vocab(t));
        if (tok_decoder_push(&d, id, chunk, max, &n) != ECS_OK || n > max)
            __builtin_trap();
        memcpy(all + total, chunk, n);
        total += n;
        const tok_decoder_t before = d;
        if (tok_decoder_push(&d, tok_n_vocab(t), chunk, max, &n) != ECS_ERR_RANGE ||
            memcmp(&before, &d, sizeof d) != 0)
            __builtin_trap(); /* an invalid id: refused, nothing held back lost */
    }
    if (tok_decoder_flush(&d, chunk, max, &n) != ECS_OK || n > max)
        __builtin_trap();
    memcpy(all + total, chunk, n);
    total += n;
    if (!utf8_valid((const char *)all, total))
        __builtin_trap();
done:
    free(chunk);
    free(all);
}

/* The text as a user's message in the vocabulary's template (its first NUL
 * ends it: messages are C strings), then encoded as the server does. */
static void check_chat(const tok_t *t, const char *text, size_t len)
{
    char *user = strndup(text, len);
    if (!user)
        return;
    const tok_chat_msg_t msg[] = {{"system", "Be brief."}, {"user", user}};
    size_t need = 0, got, n;
    if (tok_chat_format(t, TOK_CHAT_DEEPSEEK2, msg, 2, true, NULL, 0, &need) != ECS_ERR_RANGE)
        __builtin_trap();
    char *out = malloc(need + 1);
    if (out) {
        if (tok_chat_format(t, TOK_CHAT_DEEPSEEK2, msg, 2, true, out, need + 1, &got) != ECS_OK ||
            got != need || !strstr(out, user))
            __builtin_trap();
        free(encode_checked(t, out, got, 1, 1, &n));
    }
    free(out);
    free(user);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const tok_t *t = g_tok[data[0] % N_VOCABS];
    const int add = data[0] >> 2 & 1, parse = data[0] >> 3 & 1, render = data[0] >> 4 & 1;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    size_t n;
    int32_t *ids = encode_checked(t, text, len, add, parse, &n);
    if (!ids)
        return 0;
    if (!parse && utf8_valid(text, len))
        check_round_trip(t, text, len, ids, n);
    free(ids);
    check_stream(t, (const uint8_t *)text, len, render);
    check_chat(t, text, len);
    return 0;
}
