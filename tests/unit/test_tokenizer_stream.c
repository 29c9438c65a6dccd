/* test_tokenizer_stream.c - round trips of random UTF-8, the streaming
 * decoder's UTF-8 guarantees (only complete sequences, partial ones held
 * back; only the kept control tokens' text without render_special), long
 * inputs, and concurrent encoding agreeing with serial. */
#include "tests/unit/tokenizer_fixture.h"

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

Test(tokenizer, decoder_keeps_only_the_kept_control_tokens)
{
    tok_t *t = load_vocab(LLM_VOCAB);
    const int32_t bos = tok_bos(t), eos = tok_eos(t), a = id_of(t, "A");
    cr_assert(bos >= 0 && eos >= 0 && bos != eos);
    cr_assert_eq(tok_token_type(t, bos), TOK_TYPE_CONTROL);
    cr_assert_eq(tok_token_type(t, eos), TOK_TYPE_CONTROL);
    const int32_t seq[] = {a, bos, eos, a};
    char out[256], all[256];
    size_t k, piece_len;
    const char *piece = tok_token_piece(t, bos, &piece_len);
    for (int mode = 0; mode < 3; mode++) { /* nothing kept, BOS kept, all rendered */
        tok_decoder_t d;
        size_t total = 0;
        tok_decoder_init(&d, t, mode == 2);
        if (mode == 1)
            tok_decoder_keep(&d, &bos, 1);
        for (int j = 0; j < 4; j++) {
            cr_assert_eq(tok_decoder_push(&d, seq[j], out, sizeof out, &k), ECS_OK);
            memcpy(all + total, out, k);
            total += k;
        }
        all[total] = '\0';
        char want[256];
        snprintf(want, sizeof want, "A%s%sA", mode ? piece : "", mode == 2 ? DS_EOS : "");
        cr_assert_str_eq(all, want, "mode %d", mode);
    }
    /* a longer list keeps its first TOK_KEEP_MAX */
    int32_t many[TOK_KEEP_MAX + 2];
    for (int i = 0; i < TOK_KEEP_MAX + 2; i++)
        many[i] = i == TOK_KEEP_MAX ? bos : a;
    tok_decoder_t d;
    tok_decoder_init(&d, t, false);
    tok_decoder_keep(&d, many, TOK_KEEP_MAX + 2);
    cr_assert_eq(d.n_keep, TOK_KEEP_MAX);
    cr_assert_eq(tok_decoder_push(&d, bos, out, sizeof out, &k), ECS_OK);
    cr_assert_eq(k, 0, "BOS came past the kept list: not kept");
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
