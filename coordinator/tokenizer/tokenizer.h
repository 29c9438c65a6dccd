/* tokenizer.h - byte-level BPE tokenizer read from GGUF metadata, streaming
 * detokenizer, chat templates, and a small BPE trainer for self-made models.
 *
 * Behaviour follows llama.cpp's "gpt2" vocabulary type so that prompts give
 * the same token ids:
 *   - tokenizer.ggml.pre selects the pre-tokenizer regex list (deepseek-llm,
 *     deepseek-coder, deepseek-v3, qwen2, gpt-2/gpt2, default); the regexes
 *     run one after the other, each splitting every piece the previous ones
 *     left (matches and the gaps between them both become pieces).
 *   - Before that, the text is partitioned on special tokens, longest text
 *     first: USER_DEFINED tokens are always matched, CONTROL and UNKNOWN
 *     tokens only when parse_special is set.
 *   - Merges apply lowest rank first (leftmost on ties).
 *   - Invalid UTF-8 input bytes are tokenized as U+FFFD.
 * A tok_t is immutable after tok_load: every function taking a const tok_t
 * may be called from many threads at once. */
#ifndef ECS_TOKENIZER_H
#define ECS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/gguf.h"

typedef struct tok tok_t;

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* Loads the tokenizer.* keys of f. The tokenizer copies what it needs, so f
 * may be closed afterwards. Errors: ECS_ERR_UNSUPPORTED for a model other
 * than "gpt2" or an unknown pre-tokenizer, ECS_ERR_FORMAT for a malformed
 * vocabulary (duplicate token, missing byte token, bad merge), NOTFOUND/TYPE
 * for missing or mistyped keys. */
ecs_err_t tok_load(const gguf_file_t *f, tok_t **out);
void tok_free(tok_t *t);

int32_t tok_n_vocab(const tok_t *t);
/* Special ids, -1 when the vocabulary has none. The EOT id comes from
 * tokenizer.ggml.eot_token_id or, like llama.cpp, from a token named e.g.
 * "<|im_end|>" or "<｜end▁of▁sentence｜>". */
int32_t tok_bos(const tok_t *t);
int32_t tok_eos(const tok_t *t);
int32_t tok_eot(const tok_t *t);
int32_t tok_pad(const tok_t *t);
bool tok_add_bos(const tok_t *t);
bool tok_add_eos(const tok_t *t);
/* End of generation: EOS, EOT, EOM and the tokens llama.cpp treats as such
 * by name ("<|im_end|>", "<|endoftext|>", ...). False for invalid ids. */
bool tok_is_eog(const tok_t *t, int32_t id);
/* Pre-tokenizer name in use ("deepseek-llm", "qwen2", "default", ...). */
const char *tok_pre_name(const tok_t *t);

/* The token's vocabulary string (GPT-2 byte-encoded form for NORMAL tokens,
 * e.g. "Ġthe"), NUL-terminated; NULL for an invalid id. */
const char *tok_token_text(const tok_t *t, int32_t id);
/* TOK_TYPE_* of id, TOK_TYPE_UNDEFINED for an invalid id. */
int tok_token_type(const tok_t *t, int32_t id);
/* The bytes the token stands for (may be part of a UTF-8 sequence; for
 * CONTROL/UNKNOWN tokens their text). NULL for an invalid id. */
const char *tok_token_piece(const tok_t *t, int32_t id, size_t *len);
/* Id of the token whose vocabulary string is exactly text, or -1. */
int32_t tok_find(const tok_t *t, const char *text, size_t len);

/* Token count tok_encode can reach for len input bytes (BOS/EOS included). */
size_t tok_encode_bound(size_t len);

/* Tokenizes text[0..len). add_special adds BOS/EOS as the model's
 * add_bos_token/add_eos_token ask; parse_special lets CONTROL tokens written
 * in the text (e.g. "<｜end▁of▁sentence｜>") become their ids. Writes up to
 * cap ids to out and the count to *n_out. If cap is too small it returns
 * ECS_ERR_RANGE with *n_out set to the count needed (out holds the first cap
 * ids); tok_encode_bound(len) always suffices. */
ecs_err_t tok_encode(const tok_t *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *out, size_t cap, size_t *n_out);

/* ---- streaming detokenizer ----
 * Takes ids one at a time and emits only complete, valid UTF-8: a sequence
 * split over several tokens is held back until it is complete; bytes that can
 * never form a valid sequence are replaced by U+FFFD (one per maximal invalid
 * subpart), so the output is always valid UTF-8. CONTROL/UNKNOWN tokens emit
 * their text only with render_special or when kept (tok_decoder_keep),
 * UNUSED tokens nothing. */
#define TOK_KEEP_MAX 8
typedef struct {
    const tok_t *tok;
    bool render_special;
    uint8_t n_pending;
    uint8_t pending[3];
    int n_keep;
    int32_t keep[TOK_KEEP_MAX];
} tok_decoder_t;

void tok_decoder_init(tok_decoder_t *d, const tok_t *t, bool render_special);
/* Control tokens whose text d emits even without render_special
 * (llama-server's "preserved tokens": a template's tool-call markup, which
 * the reply's parser reads back, while any other control token the model
 * writes stays out of the text). Up to TOK_KEEP_MAX ids (the first of a
 * longer list). */
void tok_decoder_keep(tok_decoder_t *d, const int32_t *ids, int n);
/* Output bytes one push or flush can produce at most; an out buffer of this
 * size never gets ECS_ERR_RANGE. */
size_t tok_decoder_max_out(const tok_t *t);
/* Feeds id; writes the newly completed text to out (not NUL-terminated) and
 * its length to *n. ECS_ERR_RANGE (decoder unchanged) if cap is too small,
 * ECS_ERR_RANGE for an invalid id. */
ecs_err_t tok_decoder_push(tok_decoder_t *d, int32_t id, char *out, size_t cap, size_t *n);
/* Emits what is still held back (as U+FFFD: it is an incomplete sequence)
 * and resets the decoder. */
ecs_err_t tok_decoder_flush(tok_decoder_t *d, char *out, size_t cap, size_t *n);

/* Whole-sequence convenience over the decoder: writes the text of ids and a
 * terminating NUL; ECS_ERR_RANGE with *len = bytes needed (without NUL) if
 * cap is too small. */
ecs_err_t tok_decode(const tok_t *t, const int32_t *ids, size_t n, bool render_special,
                     char *out, size_t cap, size_t *len);

/* ---- chat templates ----
 * The template is recognised from tokenizer.chat_template the way llama.cpp
 * recognises its built-in templates; the rendered text is what llama.cpp's
 * built-in renderer produces. It does NOT contain the BOS token: encode the
 * result with add_special = true (BOS as the model asks) and
 * parse_special = true (so "<｜end▁of▁sentence｜>" or "<|im_end|>" inside it
 * become their control ids). That gives the same ids as the Jinja template
 * (which writes bos_token itself) tokenized without adding BOS.
 *   DEEPSEEK2: [system "\n\n"] "User: " u "\n\n" "Assistant: " a "<｜end▁of▁sentence｜>" ...
 *              then "Assistant:" when an assistant prompt is asked for.
 *   DEEPSEEK3: [system "\n\n"] "<｜User｜>" u "<｜Assistant｜>" a "<｜end▁of▁sentence｜>" ...
 *              then "<｜Assistant｜>".
 *   CHATML:    "<|im_start|>" role "\n" content "<|im_end|>\n" per message,
 *              then "<|im_start|>assistant\n" (Qwen3 and other ChatML models). */
typedef enum {
    TOK_CHAT_NONE = 0,    /* the model has no tokenizer.chat_template */
    TOK_CHAT_UNKNOWN = 1, /* it has one this module cannot render */
    TOK_CHAT_DEEPSEEK2 = 2,
    TOK_CHAT_DEEPSEEK3 = 3,
    TOK_CHAT_CHATML = 4,
} tok_chat_kind_t;

typedef struct {
    const char *role;    /* "system", "user" or "assistant" (ChatML takes any role);
                          * deepseek3 also "tool_call" (content: the function's name,
                          * "\n```json\n", its arguments, "\n```"; after its assistant
                          * message) and "tool" (a result) */
    const char *content;
} tok_chat_msg_t;

/* Kind of a template string: a built-in name ("deepseek2", "deepseek3",
 * "chatml") or a Jinja template recognised by its content. */
tok_chat_kind_t tok_chat_detect(const char *tmpl, size_t len);
/* Kind detected from the model's tokenizer.chat_template at load. */
tok_chat_kind_t tok_chat_kind(const tok_t *t);
/* A reasoning ("thinking") template: ChatML (the model's, or set by
 * tok_set_chat_kind) whose text writes "<think>" (Qwen3's). The chat
 * renderer stays plain ChatML; what such a template does to past reasoning
 * and its enable_thinking switch are the HTTP front's
 * (coordinator/api/reasoning.c). */
bool tok_chat_thinks(const tok_t *t);
/* Whether a template's text holds "<think>" (what tok_chat_thinks tests
 * of the model's template, beside the kind). */
bool tok_chat_detect_thinks(const char *tmpl, size_t len);
/* A thinking template whose assistant prompt opens the think block itself
 * ('<|im_start|>assistant\n<think>\n', as Qwen3's thinking-only models'
 * do): the answer starts inside the reasoning. Qwen3's hybrid template
 * does not: its model writes "<think>" first. */
bool tok_chat_think_open(const tok_t *t);
bool tok_chat_detect_think_open(const char *tmpl, size_t len);
/* Short name of a kind ("deepseek2", ...; "none", "unknown"). */
const char *tok_chat_kind_name(tok_chat_kind_t k);
/* The built-in kind a name gives ("deepseek2", "deepseek3", "chatml"),
 * TOK_CHAT_UNKNOWN for any other string. */
tok_chat_kind_t tok_chat_by_name(const char *name);
/* Renders t's chats with built-in kind k instead of what its template was
 * recognised as (llama-server's --chat-template: a model whose template is
 * not recognised, or that has none). */
void tok_set_chat_kind(tok_t *t, tok_chat_kind_t k);

/* Renders msgs with the given kind; writes the text and a NUL. ECS_ERR_RANGE
 * with *len = bytes needed (without NUL) if cap is too small; ECS_ERR_INVAL
 * for a role the template has no place for or a kind that cannot render. */
ecs_err_t tok_chat_apply(tok_chat_kind_t kind, const tok_chat_msg_t *msgs, int n,
                         bool add_assistant_prompt, char *out, size_t cap, size_t *len);
/* Renders with the model's own template. fallback is used only when the model
 * has no chat_template key (pass TOK_CHAT_NONE to make that an error). A
 * template this module does not know is an ECS_ERR_UNSUPPORTED error quoting
 * its first line. */
ecs_err_t tok_chat_format(const tok_t *t, tok_chat_kind_t fallback, const tok_chat_msg_t *msgs,
                          int n, bool add_assistant_prompt, char *out, size_t cap, size_t *len);

/* ---- self-made vocabulary ----
 * Learns byte-level BPE merges from text (pre-tokenized like "deepseek-llm")
 * until n_merges_target merges exist or no pair occurs twice, and writes every
 * tokenizer.* key a real DeepSeek vocab GGUF has into w: model "gpt2", pre
 * "deepseek-llm", tokens (the 256 byte tokens in GPT-2 order, merged tokens,
 * then "<｜begin▁of▁sentence｜>" and "<｜end▁of▁sentence｜>" as CONTROL),
 * token_type, merges, bos/eos/padding ids, add_bos_token = true,
 * add_eos_token = false and the DeepSeek-V2 chat template. *n_vocab (may be
 * NULL) receives the token count, for the caller's embedding shapes.
 * Deterministic: the same text and target give the same vocabulary. */
ecs_err_t tok_train_to_gguf(const char *text, size_t len, int n_merges_target, gguf_writer_t *w,
                            uint32_t *n_vocab);

/* The DeepSeek-V2-Chat Jinja template string, as written by tok_train_to_gguf. */
extern const char *const tok_deepseek2_template;

#endif
