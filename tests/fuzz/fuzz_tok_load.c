/* fuzz_tok_load.c - libFuzzer target for the tokenizer's reading of a model
 * file's tokenizer.* keys (tok_load), the part of a GGUF that fuzz_gguf's
 * container checks do not reach. Any bytes either open as GGUF and load a
 * tokenizer, or fail with a message; a loaded tokenizer encodes a fixed text
 * (both control-token modes) into ids in range, decodes them and its whole
 * vocabulary as valid UTF-8, answers its special ids in range, renders a
 * chat with its own template when it has a known one, and frees without a
 * leak. Seeds (tests/fuzz/corpus/fuzz_tok_load): small vocabularies of each
 * pre-tokenizer and template, written by test_tokenizer_bpe's
 * fuzz_seed_vocabularies with ECS_WRITE_FUZZ_CORPUS=DIR. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char TEXT[] = "Hello <｜begin▁of▁sentence｜>wörld<|im_end|> 123 \xff\n\n  x";

static void check_ids(const tok_t *t, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(t))
            __builtin_trap();
}

/* Every token's text through the decoder, rendered and not. */
static void check_decoder(const tok_t *t)
{
    const size_t max = tok_decoder_max_out(t);
    char *out = malloc(max);
    if (!out)
        return;
    for (int render = 0; render < 2; render++) {
        tok_decoder_t d;
        tok_decoder_init(&d, t, render);
        size_t n;
        for (int32_t id = 0; id < tok_n_vocab(t); id++)
            if (tok_decoder_push(&d, id, out, max, &n) != ECS_OK || n > max)
                __builtin_trap();
        if (tok_decoder_flush(&d, out, max, &n) != ECS_OK || n > max)
            __builtin_trap();
    }
    free(out);
}

static void check_chat(const tok_t *t)
{
    const tok_chat_msg_t msg[] = {{"user", "hi"}, {"assistant", "hello"}, {"user", "bye"}};
    char out[512];
    size_t len;
    const tok_chat_kind_t k = tok_chat_kind(t);
    const ecs_err_t rc = tok_chat_format(t, TOK_CHAT_NONE, msg, 3, true, out, sizeof out, &len);
    if ((k == TOK_CHAT_DEEPSEEK2 || k == TOK_CHAT_DEEPSEEK3 || k == TOK_CHAT_CHATML) != (rc == ECS_OK))
        __builtin_trap(); /* a known template renders; none or an unknown one says so */
    if (rc != ECS_OK && !ecs_errmsg()[0])
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file_t *f;
    if (gguf_open_buffer(data, size, "fuzz", &f) != ECS_OK)
        return 0;
    tok_t *t = NULL;
    const ecs_err_t rc = tok_load(f, &t);
    gguf_close(f); /* the tokenizer keeps copies of what it needs */
    if (rc != ECS_OK) {
        if (t || !ecs_errmsg()[0])
            __builtin_trap(); /* every failure says why, and leaves nothing */
        return 0;
    }
    const int32_t special[] = {tok_bos(t), tok_eos(t), tok_eot(t), tok_pad(t)};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        if (special[i] < -1 || special[i] >= tok_n_vocab(t))
            __builtin_trap();
    const size_t cap = tok_encode_bound(sizeof TEXT - 1);
    const size_t text_cap = 64 + cap * tok_decoder_max_out(t);
    int32_t *ids = malloc(cap * sizeof *ids);
    char *text = malloc(text_cap);
    if (ids && text) {
        for (int parse = 0; parse < 2; parse++) {
            size_t n, len;
            if (tok_encode(t, TEXT, sizeof TEXT - 1, true, parse, ids, cap, &n) != ECS_OK)
                __builtin_trap();
            check_ids(t, ids, n);
            if (tok_decode(t, ids, n, parse, text, text_cap, &len) != ECS_OK)
                __builtin_trap();
        }
    }
    free(ids);
    free(text);
    check_decoder(t);
    check_chat(t);
    tok_free(t);
    return 0;
}
