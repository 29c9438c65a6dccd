/* tokenizer.c - loading a GPT-2 style BPE vocabulary from GGUF, encoding
 * (special-token partition, regex pre-tokenization, rank-ordered merges) and
 * the streaming UTF-8-safe detokenizer.
 *
 * Merges are kept as a hash map from the pair of symbol ids to (rank, merged
 * id). Strings that occur in merges but are not tokens get "virtual" ids
 * above n_vocab so that a chain of merges through them behaves as it does in
 * llama.cpp, which merges by string. Encoding a word uses a heap of candidate
 * pairs, O(n log n) in the word length. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

#define TOK_FLAG_EOG 1u

typedef struct {
    int32_t first; /* first child, -1 if none */
    int32_t next;  /* next sibling, -1 if none */
    int32_t tok;   /* token whose text ends here, -1 if none */
    uint8_t byte;
} trie_node_t;

struct tok {
    int32_t n_vocab;
    const char **text;
    uint32_t *text_len;
    const char **piece;
    uint32_t *piece_len;
    uint8_t *type;
    uint8_t *flags;
    uint32_t max_piece_len;

    tok_strmap_t vocab;  /* text -> id, plus virtual merge strings */
    int32_t n_virtual;
    tok_u64map_t ranks;  /* (left id, right id) -> rank << 32 | merged id */
    int32_t byte_tok[256];
    tok_pretok_t *pre;

    int32_t bos, eos, eot, eom, pad;
    bool add_bos, add_eos;

    trie_node_t *trie;   /* special tokens matched in raw text */
    size_t n_trie, trie_cap;
    int32_t trie_root[256];

    tok_chat_kind_t chat;
    char chat_line[96];
    tok_arena_t arena;
};

/* ---- small accessors ---- */

int32_t tok_n_vocab(const tok_t *t) { return t->n_vocab; }
int32_t tok_bos(const tok_t *t) { return t->bos; }
int32_t tok_eos(const tok_t *t) { return t->eos; }
int32_t tok_eot(const tok_t *t) { return t->eot; }
int32_t tok_pad(const tok_t *t) { return t->pad; }
bool tok_add_bos(const tok_t *t) { return t->add_bos; }
bool tok_add_eos(const tok_t *t) { return t->add_eos; }
const char *tok_pre_name(const tok_t *t) { return tok_pretok_name(t->pre); }
tok_chat_kind_t tok_chat_kind(const tok_t *t) { return t->chat; }
const char *tok_chat_first_line(const struct tok *t) { return t->chat_line; }

static bool valid_id(const tok_t *t, int32_t id) { return id >= 0 && id < t->n_vocab; }

bool tok_is_eog(const tok_t *t, int32_t id)
{
    return valid_id(t, id) && (t->flags[id] & TOK_FLAG_EOG);
}

const char *tok_token_text(const tok_t *t, int32_t id)
{
    return valid_id(t, id) ? t->text[id] : NULL;
}

int tok_token_type(const tok_t *t, int32_t id)
{
    return valid_id(t, id) ? t->type[id] : TOK_TYPE_UNDEFINED;
}

const char *tok_token_piece(const tok_t *t, int32_t id, size_t *len)
{
    if (!valid_id(t, id))
        return NULL;
    *len = t->piece_len[id];
    return t->piece[id];
}

int32_t tok_find(const tok_t *t, const char *text, size_t len)
{
    int32_t id = tok_strmap_get(&t->vocab, text, len);
    return id < t->n_vocab ? id : -1;
}

size_t tok_encode_bound(size_t len)
{
    /* an invalid byte becomes U+FFFD (3 bytes), each byte at most one token */
    return len > (SIZE_MAX - 2) / 3 ? SIZE_MAX : 3 * len + 2;
}

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
        trie_node_t *n = cap < INT32_MAX ? realloc(t->trie, cap * sizeof *n) : NULL;
        if (!n)
            return -1;
        t->trie = n;
        t->trie_cap = cap;
    }
    t->trie[t->n_trie] = (trie_node_t){ -1, -1, -1, byte };
    return (int32_t)t->n_trie++;
}

static int32_t trie_child(const tok_t *t, int32_t node, uint8_t byte)
{
    for (int32_t c = t->trie[node].first; c >= 0; c = t->trie[c].next)
        if (t->trie[c].byte == byte)
            return c;
    return -1;
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
        int32_t c = trie_child(t, node, s[i]);
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
    t->chat_line[0] = '\0';
    if (!gguf_find(f, "tokenizer.chat_template"))
        return ECS_OK;
    ecs_err_t err = gguf_get_str(f, "tokenizer.chat_template", &s);
    if (err)
        return err;
    t->chat = tok_chat_detect(s.ptr, s.len);
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

/* ---- encoding ---- */

typedef struct {
    int32_t start, len, id, prev, next;
} sym_t;

typedef struct {
    uint64_t key; /* rank << 32 | left index: smaller pops first */
    int32_t right, size, result;
} bigram_t;

typedef struct {
    const tok_t *t;
    int32_t *out;
    size_t cap, n;
    sym_t *sym;
    bigram_t *heap;
    size_t sym_cap, heap_n;
} enc_t;

static void emit(enc_t *e, int32_t id)
{
    if (e->n < e->cap)
        e->out[e->n] = id;
    e->n++;
}

static void heap_push(enc_t *e, bigram_t b)
{
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (e->heap[p].key <= b.key)
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = b;
}

static bigram_t heap_pop(enc_t *e)
{
    bigram_t top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && e->heap[c + 1].key < e->heap[c].key)
            c++;
        if (last.key <= e->heap[c].key)
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = last;
    return top;
}

static void add_bigram(enc_t *e, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const sym_t *L = &e->sym[l], *R = &e->sym[r];
    uint64_t key = (uint64_t)(uint32_t)L->id << 32 | (uint32_t)R->id;
    const uint64_t *v = tok_u64map_get(&e->t->ranks, key);
    if (!v)
        return;
    heap_push(e, (bigram_t){ (*v >> 32) << 32 | (uint32_t)l, r, L->len + R->len, (int32_t)(uint32_t)*v });
}

static ecs_err_t enc_reserve(enc_t *e, size_t n)
{
    if (n <= e->sym_cap)
        return ECS_OK;
    size_t cap = e->sym_cap ? e->sym_cap : 64;
    while (cap < n)
        cap *= 2;
    sym_t *s = realloc(e->sym, cap * sizeof *s);
    if (s)
        e->sym = s;
    /* each merge pushes at most two pairs: 3n covers all pushes */
    bigram_t *h = s ? realloc(e->heap, 3 * cap * sizeof *h) : NULL;
    if (!s || !h)
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte word", n);
    e->heap = h;
    e->sym_cap = cap;
    return ECS_OK;
}

/* Byte-level BPE of one pre-tokenized word. */
static ecs_err_t bpe_word(void *ud, const char *w, size_t n)
{
    enc_t *e = ud;
    const tok_t *t = e->t;
    const uint8_t *b = (const uint8_t *)w;
    if (n == 1) {
        emit(e, t->byte_tok[b[0]]);
        return ECS_OK;
    }
    ecs_err_t err = enc_reserve(e, n);
    if (err)
        return err;
    for (size_t i = 0; i < n; i++)
        e->sym[i] = (sym_t){ (int32_t)i, 1, t->byte_tok[b[i]], (int32_t)i - 1,
                             i + 1 < n ? (int32_t)i + 1 : -1 };
    e->heap_n = 0;
    for (size_t i = 1; i < n; i++)
        add_bigram(e, (int32_t)i - 1, (int32_t)i);
    while (e->heap_n) {
        bigram_t g = heap_pop(e);
        int32_t l = (int32_t)(uint32_t)g.key;
        sym_t *L = &e->sym[l], *R = &e->sym[g.right];
        /* stale if either side was merged since the pair was queued */
        if (L->len == 0 || R->len == 0 || L->len + R->len != g.size)
            continue;
        L->len += R->len;
        L->id = g.result;
        R->len = 0;
        L->next = R->next;
        if (R->next >= 0)
            e->sym[R->next].prev = l;
        add_bigram(e, L->prev, l);
        add_bigram(e, l, L->next);
    }
    for (int32_t i = 0; i >= 0; i = e->sym[i].next) {
        const sym_t *s = &e->sym[i];
        if (s->id < t->n_vocab) {
            emit(e, s->id);
        } else { /* merged into a string that is no token: spell it in bytes */
            for (int32_t j = 0; j < s->len; j++)
                emit(e, t->byte_tok[b[s->start + j]]);
        }
    }
    return ECS_OK;
}

static ecs_err_t encode_raw(enc_t *e, const char *text, size_t len)
{
    const char *s;
    size_t n;
    char *owned;
    ecs_err_t err = tok_u8_sanitize(text, len, &s, &n, &owned);
    if (err)
        return err;
    err = tok_pretok_split(e->t->pre, s, n, bpe_word, e);
    free(owned);
    return err;
}

typedef struct {
    uint32_t pos, len;
    int32_t tok;
} occ_t;

static int occ_priority(const void *pa, const void *pb)
{
    const occ_t *a = pa, *b = pb;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    if (a->tok != b->tok)
        return a->tok < b->tok ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static int occ_position(const void *pa, const void *pb)
{
    const occ_t *a = pa, *b = pb;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static bool allowed(const tok_t *t, int32_t id, bool parse_special)
{
    return parse_special || t->type[id] == TOK_TYPE_USER_DEFINED;
}

/* Every place a special token's text occurs in text. */
static ecs_err_t find_occurrences(const tok_t *t, const uint8_t *s, size_t len, bool parse_special,
                                  occ_t **out, size_t *n_out)
{
    occ_t *v = NULL;
    size_t n = 0, cap = 0;
    for (size_t p = 0; p < len; p++) {
        int32_t node = t->trie_root[s[p]];
        for (size_t d = 1; node >= 0; d++) {
            int32_t id = t->trie[node].tok;
            if (id >= 0 && allowed(t, id, parse_special)) {
                if (n == cap) {
                    size_t nc = cap ? cap * 2 : 16;
                    occ_t *nv = realloc(v, nc * sizeof *nv);
                    if (!nv) {
                        free(v);
                        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory");
                    }
                    v = nv;
                    cap = nc;
                }
                v[n++] = (occ_t){ (uint32_t)p, (uint32_t)d, id };
            }
            if (p + d >= len)
                break;
            node = trie_child(t, node, s[p + d]);
        }
    }
    *out = v;
    *n_out = n;
    return ECS_OK;
}

/* llama.cpp's partition: longest special token text first, each token's
 * occurrences left to right, skipping those overlapping one already taken;
 * the text between taken occurrences is encoded as ordinary text. */
static ecs_err_t encode_text(enc_t *e, const char *text, size_t len, bool parse_special)
{
    const tok_t *t = e->t;
    occ_t *occ = NULL;
    size_t n_occ = 0;
    ecs_err_t err = find_occurrences(t, (const uint8_t *)text, len, parse_special, &occ, &n_occ);
    if (err)
        return err;
    if (n_occ == 0)
        return encode_raw(e, text, len);
    uint8_t *used = calloc(len, 1);
    if (!used) {
        free(occ);
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory");
    }
    qsort(occ, n_occ, sizeof *occ, occ_priority);
    size_t n_taken = 0;
    for (size_t i = 0; i < n_occ; i++) {
        bool free_span = true;
        for (uint32_t j = 0; j < occ[i].len && free_span; j++)
            free_span = !used[occ[i].pos + j];
        if (!free_span)
            continue;
        memset(used + occ[i].pos, 1, occ[i].len);
        occ[n_taken++] = occ[i];
    }
    free(used);
    qsort(occ, n_taken, sizeof *occ, occ_position);
    size_t at = 0;
    for (size_t i = 0; i < n_taken && !err; i++) {
        if (occ[i].pos > at)
            err = encode_raw(e, text + at, occ[i].pos - at);
        emit(e, occ[i].tok);
        at = occ[i].pos + occ[i].len;
    }
    if (!err && at < len)
        err = encode_raw(e, text + at, len - at);
    free(occ);
    return err;
}

ecs_err_t tok_encode(const tok_t *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *out, size_t cap, size_t *n_out)
{
    *n_out = 0;
    if ((!text && len) || (!out && cap))
        return ecs_error(ECS_ERR_INVAL, "tok_encode: NULL buffer");
    if (len > TOK_MAX_TEXT)
        return ecs_error(ECS_ERR_RANGE, "tok_encode: text of %zu bytes exceeds the %zu-byte limit",
                         len, TOK_MAX_TEXT);
    enc_t e = { .t = t, .out = out, .cap = cap };
    ecs_err_t err = ECS_OK;
    if (add_special && t->add_bos)
        emit(&e, t->bos);
    if (len)
        err = encode_text(&e, text, len, parse_special);
    if (add_special && t->add_eos)
        emit(&e, t->eos);
    free(e.sym);
    free(e.heap);
    if (err)
        return err;
    *n_out = e.n;
    if (e.n > cap)
        return ecs_error(ECS_ERR_RANGE, "tok_encode: %zu tokens do not fit in %zu", e.n, cap);
    return ECS_OK;
}

/* ---- decoding ---- */

void tok_decoder_init(tok_decoder_t *d, const tok_t *t, bool render_special)
{
    d->tok = t;
    d->render_special = render_special;
    d->n_pending = 0;
}

size_t tok_decoder_max_out(const tok_t *t)
{
    /* every byte (held back ones included) can turn into a 3-byte U+FFFD */
    return 3 * ((size_t)t->max_piece_len + 3);
}

static const char REPLACEMENT[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

typedef struct {
    char *out;
    size_t cap, n;
} sink_t;

static bool sink_put(sink_t *k, const void *p, size_t n)
{
    if (n > k->cap - k->n)
        return false;
    memcpy(k->out + k->n, p, n);
    k->n += n;
    return true;
}

/* Emits the complete sequences of pending ++ p, replacing invalid subparts;
 * a valid but unfinished tail is saved in tail (unless final). */
static ecs_err_t dec_run(const uint8_t *pend, size_t np, const uint8_t *p, size_t n, bool final,
                         sink_t *k, uint8_t tail[3], size_t *n_tail)
{
    size_t total = np + n, i = 0;
    *n_tail = 0;
    while (i < total) {
        uint8_t seq[4];
        const uint8_t *s;
        size_t avail = total - i;
        if (i >= np) {
            s = p + (i - np);
        } else {
            avail = avail < 4 ? avail : 4;
            for (size_t j = 0; j < avail; j++)
                seq[j] = i + j < np ? pend[i + j] : p[i + j - np];
            s = seq;
        }
        int r = tok_u8_strict(s, avail);
        bool ok = true;
        if (r > 0) {
            ok = sink_put(k, s, (size_t)r);
            i += (size_t)r;
        } else if (r == 0 && !final) { /* unfinished: hold back (at most 3 bytes) */
            for (size_t j = 0; j < avail; j++)
                tail[j] = s[j];
            *n_tail = avail;
            break;
        } else {
            ok = sink_put(k, REPLACEMENT, 3);
            i += r == 0 ? avail : (size_t)-r;
        }
        if (!ok)
            return ecs_error(ECS_ERR_RANGE, "tok_decoder: output buffer of %zu bytes too small", k->cap);
    }
    return ECS_OK;
}

static ecs_err_t decoder_feed(tok_decoder_t *d, const char *p, size_t n, bool final, char *out,
                              size_t cap, size_t *n_out)
{
    sink_t k = { out, cap, 0 };
    uint8_t tail[3];
    size_t n_tail;
    *n_out = 0;
    ecs_err_t err = dec_run(d->pending, d->n_pending, (const uint8_t *)p, n, final, &k, tail, &n_tail);
    if (err)
        return err;
    memcpy(d->pending, tail, n_tail);
    d->n_pending = (uint8_t)n_tail;
    *n_out = k.n;
    return ECS_OK;
}

ecs_err_t tok_decoder_push(tok_decoder_t *d, int32_t id, char *out, size_t cap, size_t *n)
{
    const tok_t *t = d->tok;
    *n = 0;
    if (!valid_id(t, id))
        return ecs_error(ECS_ERR_RANGE, "tok_decoder: token id %d outside the vocabulary (%d)", id,
                         t->n_vocab);
    int ty = t->type[id];
    if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN) && !d->render_special)
        return ECS_OK;
    return decoder_feed(d, t->piece[id], t->piece_len[id], false, out, cap, n);
}

ecs_err_t tok_decoder_flush(tok_decoder_t *d, char *out, size_t cap, size_t *n)
{
    return decoder_feed(d, NULL, 0, true, out, cap, n);
}

ecs_err_t tok_decode(const tok_t *t, const int32_t *ids, size_t n, bool render_special,
                     char *out, size_t cap, size_t *len)
{
    tok_decoder_t d;
    size_t m = tok_decoder_max_out(t), total = 0, k;
    char *buf = malloc(m);
    ecs_err_t err = ECS_OK;
    *len = 0;
    if (!buf)
        return ecs_error(ECS_ERR_NOMEM, "tok_decode: out of memory");
    tok_decoder_init(&d, t, render_special);
    for (size_t i = 0; i <= n && !err; i++) {
        err = i < n ? tok_decoder_push(&d, ids[i], buf, m, &k) : tok_decoder_flush(&d, buf, m, &k);
        if (!err && total + k < cap)
            memcpy(out + total, buf, k);
        total += err ? 0 : k;
    }
    free(buf);
    if (err)
        return err;
    *len = total;
    if (total >= cap)
        return ecs_error(ECS_ERR_RANGE, "tok_decode: %zu bytes do not fit in %zu", total + 1, cap);
    out[total] = '\0';
    return ECS_OK;
}
