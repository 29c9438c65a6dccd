/* tok_impl.h - internals shared by the tokenizer's source files; not part of
 * the module's interface (that is tokenizer.h).
 *
 * Holds the GPT-2 byte<->code point mapping, UTF-8 helpers, a chunked string
 * arena, two open-addressing hash maps (byte string -> int32, u64 -> u64) and
 * the regex pre-tokenizer. */
#ifndef ECS_TOK_IMPL_H
#define ECS_TOK_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "tokenizer.h"

/* Largest text tok_encode / tok_train_to_gguf accept; keeps every offset in
 * 32 bits and every scratch allocation proportional to a sane input. */
#define TOK_MAX_TEXT ((size_t)1 << 28)

/* ---- GPT-2 byte-level mapping ---- */

/* The code point GPT-2's bytes_to_unicode() assigns to byte b. */
uint32_t tok_byte_to_cp(uint8_t b);
/* Inverse mapping; -1 if cp is not one of the 256 mapped code points. */
int tok_cp_to_byte(uint32_t cp);

/* ---- UTF-8 ---- */

/* Writes cp (<= 0x10FFFF) as UTF-8, returns the byte count (1..4). */
size_t tok_u8_put(uint32_t cp, char *out);
/* Decodes the code point at s[0..n) the way llama.cpp does: lead byte and
 * continuation bits are checked, overlong forms are accepted. Returns the
 * length consumed, or 0 when the bytes do not form a sequence (invalid lead,
 * bad continuation, truncated). *cp is set only on success. */
size_t tok_u8_lenient(const uint8_t *s, size_t n, uint32_t *cp);
/* Strict check of the sequence starting at s[0..n): returns its length if it
 * is complete and valid, 0 if it is a valid but truncated prefix (more bytes
 * could complete it), or -(k) where k >= 1 is the number of bytes forming the
 * maximal invalid subpart to replace with one U+FFFD. */
int tok_u8_strict(const uint8_t *s, size_t n);
/* Makes text valid UTF-8 as llama.cpp's tokenizer sees it: each byte that
 * does not start a sequence becomes U+FFFD, overlong forms are re-encoded,
 * surrogates and values above 0x10FFFF become U+FFFD. If text is already
 * valid, *out = text and *owned = NULL; otherwise *out = *owned = a new
 * buffer the caller frees. */
ecs_err_t tok_u8_sanitize(const char *text, size_t len, const char **out, size_t *out_len,
                          char **owned);

/* ---- arena: stable, NUL-terminated copies ---- */

typedef struct tok_arena_block tok_arena_block_t;
typedef struct {
    tok_arena_block_t *head;
} tok_arena_t;

/* Copies n bytes plus a NUL; NULL on allocation failure. */
char *tok_arena_put(tok_arena_t *a, const void *p, size_t n);
/* Copies a then b as one string. */
char *tok_arena_put2(tok_arena_t *a, const void *p, size_t n, const void *q, size_t m);
void tok_arena_free(tok_arena_t *a);

/* ---- byte string -> int32 map (keys are borrowed, must outlive the map) ---- */

typedef struct {
    const char *key;
    uint32_t len;
    uint32_t hash;
    int32_t val;
} tok_strent_t;

typedef struct {
    int32_t *slots; /* index into ents, -1 when empty */
    tok_strent_t *ents;
    size_t cap;     /* slots, power of two */
    size_t n, ents_cap;
} tok_strmap_t;

ecs_err_t tok_strmap_init(tok_strmap_t *m, size_t expect);
void tok_strmap_free(tok_strmap_t *m);
/* Value of key, or -1. */
int32_t tok_strmap_get(const tok_strmap_t *m, const char *key, size_t len);
/* Inserts key -> val; if present, leaves it and sets *existing (may be NULL)
 * to the old value. */
ecs_err_t tok_strmap_put(tok_strmap_t *m, const char *key, size_t len, int32_t val,
                         int32_t *existing);

/* ---- u64 -> u64 map; UINT64_MAX is reserved as the empty key ---- */

typedef struct {
    uint64_t *keys;
    uint64_t *vals;
    size_t cap, n;
} tok_u64map_t;

ecs_err_t tok_u64map_init(tok_u64map_t *m, size_t expect);
void tok_u64map_free(tok_u64map_t *m);
/* Pointer to the value of key, or NULL. */
uint64_t *tok_u64map_get(const tok_u64map_t *m, uint64_t key);
/* Pointer to the value of key, inserting def if absent (*added set). */
ecs_err_t tok_u64map_upsert(tok_u64map_t *m, uint64_t key, uint64_t def, uint64_t **val,
                            bool *added);

/* ---- regex pre-tokenizer ---- */

typedef struct tok_pretok tok_pretok_t;

/* Pre-tokenizer for a tokenizer.ggml.pre name (NULL or "" selects llama.cpp's
 * default list). ECS_ERR_UNSUPPORTED names an unknown pre-tokenizer. */
ecs_err_t tok_pretok_new(const char *name, size_t name_len, tok_pretok_t **out);
void tok_pretok_free(tok_pretok_t *p);
const char *tok_pretok_name(const tok_pretok_t *p);

typedef ecs_err_t (*tok_word_fn)(void *ud, const char *word, size_t len);
/* Splits valid UTF-8 text into words, in order, calling fn for each. */
ecs_err_t tok_pretok_split(const tok_pretok_t *p, const char *text, size_t len, tok_word_fn fn,
                           void *ud);

/* ---- between tokenizer.c and tok_chat.c ---- */

struct tok;
/* First line of the model's chat_template (for error messages), "" if none. */
const char *tok_chat_first_line(const struct tok *t);

/* ---- struct tok: filled by tok_load.c, read by tokenizer.c ---- */

#define TOK_FLAG_EOG 1u

typedef struct {
    int32_t first; /* first child, -1 if none */
    int32_t next;  /* next sibling, -1 if none */
    int32_t tok;   /* token whose text ends here, -1 if none */
    uint8_t byte;
} tok_trie_node_t;

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

    tok_trie_node_t *trie;   /* special tokens matched in raw text */
    size_t n_trie, trie_cap;
    int32_t trie_root[256];

    tok_chat_kind_t chat;
    bool chat_thinks;        /* the template's text writes <think> (Qwen3's) */
    bool chat_think_open;    /* its assistant prompt opens the think block */
    char chat_line[96];
    tok_arena_t arena;
};

/* The child of trie node node on byte, -1 if none. */
static inline int32_t tok_trie_child(const struct tok *t, int32_t node, uint8_t byte)
{
    for (int32_t c = t->trie[node].first; c >= 0; c = t->trie[c].next)
        if (t->trie[c].byte == byte)
            return c;
    return -1;
}

#endif
