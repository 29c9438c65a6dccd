/* tok_load.c - tok_load: a GPT-2 style BPE vocabulary from GGUF (tokens,
 * merges, special ids, decoded pieces, the trie of special tokens, the chat
 * template's kind) into a struct tok, and tok_free. Split from tokenizer.c
 * (encoding, decoding) because loading is a pass of its own, run once; the
 * struct both sides use is in tok_impl.h. */
#include "tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

void tok_free(tok_t *t)
{
    if (!t)
        return;
    free(t->text);
    free(t->text_len);
    free(t->piece);
    free(t->piece_len);
    free(t->type);
    free(t->flags);
    free(t->trie);
    tok_strmap_free(&t->vocab);
    tok_u64map_free(&t->ranks);
    tok_pretok_free(t->pre);
    tok_arena_free(&t->arena);
    free(t);
}


/* ---- loading ---- */

static ecs_err_t load_nomem(void) { return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory"); }

static ecs_err_t load_tokens(tok_t *t, const gguf_file_t *f)
{
    const gguf_value_t *toks, *types = NULL;
    ecs_err_t err = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks);
    if (err)
        return err;
    uint64_t n = toks->arr.n;
    if (n == 0 || n > ((uint64_t)1 << 26))
        return ecs_error(ECS_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
                         gguf_path(f), (unsigned long long)n);
    if (gguf_find(f, "tokenizer.ggml.token_type")) {
        if ((err = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types)))
            return err;
        if (types->arr.n < n)
            return ecs_error(ECS_ERR_FORMAT, "%s: %llu token types for %llu tokens", gguf_path(f),
                             (unsigned long long)types->arr.n, (unsigned long long)n);
    }
    t->n_vocab = (int32_t)n;
    t->text = calloc(n, sizeof *t->text);
    t->text_len = calloc(n, sizeof *t->text_len);
    t->piece = calloc(n, sizeof *t->piece);
    t->piece_len = calloc(n, sizeof *t->piece_len);
    t->type = calloc(n, 1);
    t->flags = calloc(n, 1);
    if (!t->text || !t->text_len || !t->piece || !t->piece_len || !t->type || !t->flags)
        return load_nomem();
    if ((err = tok_strmap_init(&t->vocab, n + 1024)))
        return err;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str_t s = toks->arr.strs[i];
        char tmp[32];
        if (s.len == 0) { /* as llama.cpp: give empty tokens a unique name */
            s.len = (uint64_t)snprintf(tmp, sizeof tmp, "[EMPTY_%llu]", (unsigned long long)i);
            s.ptr = tmp;
        }
        char *p = tok_arena_put(&t->arena, s.ptr, s.len);
        if (!p || s.len > UINT32_MAX)
            return load_nomem();
        int32_t prev;
        if ((err = tok_strmap_put(&t->vocab, p, s.len, (int32_t)i, &prev)))
            return err;
        if (prev >= 0)
            return ecs_error(ECS_ERR_FORMAT, "%s: duplicate token '%.40s' at ids %d and %llu",
                             gguf_path(f), p, prev, (unsigned long long)i);
        t->text[i] = p;
        t->text_len[i] = (uint32_t)s.len;
        int64_t ty = types ? gguf_arr_i64(types, i) : TOK_TYPE_NORMAL;
        if (ty < TOK_TYPE_UNDEFINED || ty > TOK_TYPE_BYTE)
            return ecs_error(ECS_ERR_FORMAT, "%s: tokenizer.ggml.token_type of token %llu is %lld, "
                             "not a known type (%d..%d)", gguf_path(f), (unsigned long long)i,
                             (long long)ty, TOK_TYPE_UNDEFINED, TOK_TYPE_BYTE);
        t->type[i] = (uint8_t)ty;
    }
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t k = tok_u8_put(tok_byte_to_cp((uint8_t)b), u);
        t->byte_tok[b] = tok_strmap_get(&t->vocab, u, k);
        if (t->byte_tok[b] < 0)
            return ecs_error(ECS_ERR_FORMAT, "%s: vocabulary has no token for byte 0x%02X",
                             gguf_path(f), b);
    }
    return ECS_OK;
}

/* Id of a merge operand: the token with that text, or a virtual id. */
static ecs_err_t symbol_id(tok_t *t, const char *a, size_t n, const char *b, size_t m, int32_t *id)
{
    char buf[256];
    const char *key = a;
    char *heap = NULL;
    if (m) {
        if (n + m <= sizeof buf) {
            key = buf;
        } else if (!(key = heap = malloc(n + m))) {
            return load_nomem();
        }
        memcpy((char *)key, a, n);
        memcpy((char *)key + n, b, m);
    }
    *id = tok_strmap_get(&t->vocab, key, n + m);
    free(heap);
    if (*id >= 0)
        return ECS_OK;
    if (t->n_virtual >= INT32_MAX - t->n_vocab)
        return ecs_error(ECS_ERR_FORMAT, "tokenizer: too many merge strings");
    char *p = tok_arena_put2(&t->arena, a, n, b, m);
    if (!p)
        return load_nomem();
    *id = t->n_vocab + t->n_virtual++;
    return tok_strmap_put(&t->vocab, p, n + m, *id, NULL);
}

static ecs_err_t load_merges(tok_t *t, const gguf_file_t *f)
{
    const gguf_value_t *mv;
    ecs_err_t err = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &mv);
    if (err)
        return err;
    if (mv->arr.n >= INT32_MAX)
        return ecs_error(ECS_ERR_FORMAT, "%s: too many merges", gguf_path(f));
    if (mv->arr.n == 0)
        return ecs_error(ECS_ERR_FORMAT, "%s: tokenizer.ggml.merges is empty (a BPE vocabulary "
                         "needs its merges)", gguf_path(f));
    uint64_t strays = 0; /* merges whose result is no token */
    if ((err = tok_u64map_init(&t->ranks, mv->arr.n)))
        return err;
    for (uint64_t i = 0; i < mv->arr.n; i++) {
        gguf_str_t s = mv->arr.strs[i];
        /* split at the first space after the first byte, as llama.cpp does */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) { /* llama.cpp records it as an unreachable ("", "") pair */
            strays++;
            continue;
        }
        size_t nl = (size_t)(sp - s.ptr), nr = s.len - nl - 1;
        int32_t l, r, m;
        if ((err = symbol_id(t, s.ptr, nl, NULL, 0, &l)) || (err = symbol_id(t, sp + 1, nr, NULL, 0, &r)) ||
            (err = symbol_id(t, s.ptr, nl, sp + 1, nr, &m)))
            return err;
        strays += m >= t->n_vocab;
        uint64_t *v;
        bool added;
        uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
        if ((err = tok_u64map_upsert(&t->ranks, key, i << 32 | (uint32_t)m, &v, &added)))
            return err;
    }
    /* a few results outside the vocabulary are legal (llama.cpp merges by
     * string); most of them, in a list long enough to tell (real ones have
     * thousands), means the merges belong to no vocabulary */
    if (mv->arr.n >= 100 && strays * 2 > mv->arr.n)
        return ecs_error(ECS_ERR_FORMAT, "%s: tokenizer.ggml.merges: %llu of %llu merges make "
                         "strings that are not tokens (garbage merges?)", gguf_path(f),
                         (unsigned long long)strays, (unsigned long long)mv->arr.n);
    return ECS_OK;
}

static ecs_err_t get_id(const gguf_file_t *f, const char *key, int32_t n_vocab, int32_t *id)
{
    uint32_t v;
    *id = -1;
    if (!gguf_find(f, key))
        return ECS_OK;
    ecs_err_t err = gguf_get_u32(f, key, &v);
    if (err)
        return err;
    if (v < (uint32_t)n_vocab) /* out of range: ignored, as llama.cpp does */
        *id = (int32_t)v;
    return ECS_OK;
}

/* Token texts llama.cpp treats as end-of-turn / end-of-generation. */
static const char *const EOT_NAMES[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
};
static const char *const EOG_NAMES[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
    "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>",
};

/* Fill-in-the-middle tokens llama.cpp finds by name when no key gives their
 * id, and then treats as CONTROL (so they stop matching in plain text). */
static const char *const FIM_KEYS[3][2] = {
    { "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id" },
    { "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id" },
    { "tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id" },
};
static const char *const FIM_NAMES[3][8] = {
    { "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
      "<|code_prefix|>", "<|prefix|>" },
    { "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
      "<|code_suffix|>", "<|suffix|>" },
    { "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
      "<|code_middle|>", "<|middle|>" },
};

/* The first of names[0..n) in the vocabulary (-1 if none) becomes CONTROL. */
static int32_t find_by_name(tok_t *t, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok_find(t, names[i], strlen(names[i]));
        if (id >= 0) {
            t->type[id] = TOK_TYPE_CONTROL; /* llama.cpp overrides the type too */
            return id;
        }
    }
    return -1;
}

static ecs_err_t load_specials(tok_t *t, const gguf_file_t *f)
{
    ecs_err_t err;
    if ((err = get_id(f, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos)) ||
        (err = get_id(f, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos)) ||
        (err = get_id(f, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot)) ||
        (err = get_id(f, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom)) ||
        (err = get_id(f, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad)))
        return err;
    if ((err = gguf_get_bool_or(f, "tokenizer.ggml.add_bos_token", false, &t->add_bos)) ||
        (err = gguf_get_bool_or(f, "tokenizer.ggml.add_eos_token", false, &t->add_eos)))
        return err;
    if (t->add_bos && t->bos < 0)
        return ecs_error(ECS_ERR_FORMAT, "%s: add_bos_token is true but there is no valid bos_token_id",
                         gguf_path(f));
    if (t->add_eos && t->eos < 0)
        return ecs_error(ECS_ERR_FORMAT, "%s: add_eos_token is true but there is no valid eos_token_id",
                         gguf_path(f));
    if (t->eot < 0)
        t->eot = find_by_name(t, EOT_NAMES, sizeof EOT_NAMES / sizeof *EOT_NAMES);
    for (size_t i = 0; i < sizeof EOG_NAMES / sizeof *EOG_NAMES; i++) {
        int32_t id = find_by_name(t, &EOG_NAMES[i], 1);
        if (id >= 0)
            t->flags[id] |= TOK_FLAG_EOG;
    }
    for (int k = 0; k < 3; k++)
        if (!gguf_find(f, FIM_KEYS[k][0]) && !gguf_find(f, FIM_KEYS[k][1]))
            (void)find_by_name(t, FIM_NAMES[k], 8);
    int32_t ends[3] = { t->eos, t->eot, t->eom };
    for (int i = 0; i < 3; i++)
        if (ends[i] >= 0)
            t->flags[ends[i]] |= TOK_FLAG_EOG;
    return ECS_OK;
}

/* What a token stands for when decoded (llama.cpp's token_to_piece). */
static ecs_err_t make_piece(tok_t *t, int32_t id, char *buf)
{
    const char *s = t->text[id];
    size_t n = t->text_len[id], o = 0;
    switch (t->type[id]) {
    case TOK_TYPE_NORMAL:
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = tok_u8_lenient((const uint8_t *)s + i, n - i, &cp);
            int b = k ? tok_cp_to_byte(cp) : -1;
            if (b >= 0) {
                buf[o++] = (char)b;
            } else { /* not a byte-level character: keep it as it is */
                k = k ? k : 1;
                memcpy(buf + o, s + i, k);
                o += k;
            }
            i += k;
        }
        break;
    case TOK_TYPE_CONTROL:
    case TOK_TYPE_UNKNOWN:
    case TOK_TYPE_USER_DEFINED:
        memcpy(buf, s, n);
        o = n;
        break;
    case TOK_TYPE_BYTE: {
        unsigned v;
        if (n == 6 && sscanf(s, "<0x%2X>", &v) == 1) {
            buf[o++] = (char)v;
        } else {
            memcpy(buf, s, n);
            o = n;
        }
        break;
    }
    default: /* UNUSED, UNDEFINED: nothing */
        break;
    }
    char *p = tok_arena_put(&t->arena, buf, o);
    if (!p)
        return load_nomem();
    t->piece[id] = p;
    t->piece_len[id] = (uint32_t)o;
    if (o > t->max_piece_len)
        t->max_piece_len = (uint32_t)o;
    return ECS_OK;
}

static ecs_err_t make_pieces(tok_t *t)
{
    uint32_t max_text = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->text_len[i] > max_text)
            max_text = t->text_len[i];
    char *buf = malloc((size_t)max_text + 1);
    if (!buf)
        return load_nomem();
    ecs_err_t err = ECS_OK;
    for (int32_t i = 0; i < t->n_vocab && !err; i++)
        err = make_piece(t, i, buf);
    free(buf);
    return err;
}

/* ---- special-token trie ---- */

static int32_t trie_new_node(tok_t *t, uint8_t byte)
{
    if (t->n_trie == t->trie_cap) {
        size_t cap = t->trie_cap ? t->trie_cap * 2 : 1024;
        tok_trie_node_t *n = cap < INT32_MAX ? realloc(t->trie, cap * sizeof *n) : NULL;
        if (!n)
            return -1;
        t->trie = n;
        t->trie_cap = cap;
    }
    t->trie[t->n_trie] = (tok_trie_node_t){ -1, -1, -1, byte };
    return (int32_t)t->n_trie++;
}

static ecs_err_t trie_insert(tok_t *t, int32_t id)
{
    const uint8_t *s = (const uint8_t *)t->text[id];
    size_t n = t->text_len[id];
    int32_t node = t->trie_root[s[0]];
    if (node < 0) {
        if ((node = trie_new_node(t, s[0])) < 0)
            return load_nomem();
        t->trie_root[s[0]] = node;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t c = tok_trie_child(t, node, s[i]);
        if (c < 0) {
            if ((c = trie_new_node(t, s[i])) < 0)
                return load_nomem();
            t->trie[c].next = t->trie[node].first;
            t->trie[node].first = c;
        }
        node = c;
    }
    t->trie[node].tok = id;
    return ECS_OK;
}

static bool is_special_type(int type)
{
    return type == TOK_TYPE_CONTROL || type == TOK_TYPE_USER_DEFINED || type == TOK_TYPE_UNKNOWN;
}

static ecs_err_t build_trie(tok_t *t)
{
    for (int i = 0; i < 256; i++)
        t->trie_root[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!is_special_type(t->type[id]))
            continue;
        ecs_err_t err = trie_insert(t, id);
        if (err)
            return err;
    }
    return ECS_OK;
}

static ecs_err_t load_chat(tok_t *t, const gguf_file_t *f)
{
    gguf_str_t s;
    t->chat = TOK_CHAT_NONE;
    t->chat_thinks = false;
    t->chat_think_open = false;
    t->chat_line[0] = '\0';
    if (!gguf_find(f, "tokenizer.chat_template"))
        return ECS_OK;
    ecs_err_t err = gguf_get_str(f, "tokenizer.chat_template", &s);
    if (err)
        return err;
    t->chat = tok_chat_detect(s.ptr, s.len);
    t->chat_thinks = tok_chat_detect_thinks(s.ptr, s.len);
    t->chat_think_open = tok_chat_detect_think_open(s.ptr, s.len);
    size_t n = 0;
    while (n < s.len && n + 1 < sizeof t->chat_line && s.ptr[n] != '\n' && s.ptr[n] != '\r')
        n++;
    memcpy(t->chat_line, s.ptr, n);
    t->chat_line[n] = '\0';
    return ECS_OK;
}

ecs_err_t tok_load(const gguf_file_t *f, tok_t **out)
{
    gguf_str_t model, pre = { "", 0 };
    *out = NULL;
    ecs_err_t err = gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (err)
        return err;
    if (!gguf_str_eq(model, "gpt2"))
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: tokenizer model '%.*s' is not supported (only gpt2 BPE)",
                         gguf_path(f), (int)(model.len > 64 ? 64 : model.len), model.ptr);
    if (gguf_find(f, "tokenizer.ggml.pre") && (err = gguf_get_str(f, "tokenizer.ggml.pre", &pre)))
        return err;
    tok_t *t = calloc(1, sizeof *t);
    if (!t)
        return load_nomem();
    t->bos = t->eos = t->eot = t->eom = t->pad = -1;
    if ((err = tok_pretok_new(pre.ptr, pre.len, &t->pre)) || (err = load_tokens(t, f)) ||
        (err = load_merges(t, f)) || (err = load_specials(t, f)) || (err = make_pieces(t)) ||
        (err = build_trie(t)) || (err = load_chat(t, f))) {
        tok_free(t);
        return err;
    }
    *out = t;
    return ECS_OK;
}
