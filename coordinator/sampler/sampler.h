/* sampler.h - token sampling and stop conditions for one generation stream.
 *
 * A sampler turns one row of output-head logits into a token id. It follows
 * llama.cpp's semantics and order so that the same settings behave the same:
 *
 *   logit bias -> penalties (repetition / frequency / presence over the
 *   last N accepted tokens) -> top-k -> top-p -> min-p -> temperature -> draw from softmax.
 *
 * top-p and min-p therefore look at the distribution before temperature, as
 * llama.cpp's default chain does. temp == 0 (or top_k == 1) is greedy: the
 * argmax of the penalised logits, ties going to the lowest id.
 *
 * All memory (n_vocab-sized scratch, the penalty window) is allocated by
 * sampler_new; sampling a token allocates nothing. A sampler is owned by one
 * request and is not thread-safe; different samplers are independent.
 *
 * The stop-string helpers (sampler_stops_*) are separate from the sampler:
 * they look at detokenized text and say how much of it may be streamed. */
#ifndef ECS_SAMPLER_H
#define ECS_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Bounds that keep allocations driven by request parameters finite. */
#define SAMPLER_MAX_VOCAB          (1 << 24)
#define SAMPLER_MAX_PENALTY_LAST_N (1 << 20)
#define SAMPLER_MAX_STOPS          16
#define SAMPLER_MAX_STOP_LEN       256
#define SAMPLER_MAX_BIAS           1024 /* logit_bias entries */

typedef struct {
    float temp;             /* >= 0; 0 = greedy */
    int32_t top_k;          /* >= 0; 0 = off */
    float top_p;            /* [0, 1]; 1 = off; 0 keeps only the top token */
    float min_p;            /* [0, 1]; 0 = off */
    float repeat_penalty;   /* > 0; 1 = off */
    float freq_penalty;     /* finite; 0 = off */
    float presence_penalty; /* finite; 0 = off */
    int32_t penalty_last_n; /* [0, SAMPLER_MAX_PENALTY_LAST_N]; 0 = no penalties */
    uint64_t seed;          /* same seed + same inputs = same tokens */
    int32_t n_bias;         /* [0, SAMPLER_MAX_BIAS]: logit_bias entries */
    int32_t bias_id[SAMPLER_MAX_BIAS];  /* distinct ids in [0, n_vocab) */
    float bias[SAMPLER_MAX_BIAS];       /* finite; added to the logit first */
} sampler_params_t;

typedef struct sampler sampler_t;

/* Neutral settings: temp 1, no truncation, no penalties, window 64, seed 0. */
sampler_params_t sampler_params_default(void);

/* Checks every field; ECS_ERR_INVAL with a message naming the bad one. */
ecs_err_t sampler_params_check(const sampler_params_t *p);

ecs_err_t sampler_new(const sampler_params_t *p, int32_t n_vocab, sampler_t **out);
void sampler_free(sampler_t *s);

/* Forgets the accepted tokens and restarts the random stream from the seed. */
void sampler_reset(sampler_t *s);

/* Records a token as generated (or as prompt context, if the caller wants the
 * prompt to count for penalties). Ids outside [0, n_vocab) are rejected. */
ecs_err_t sampler_accept(sampler_t *s, int32_t token);

/* Applies the repetition / frequency / presence penalties in place, exactly
 * as sampler_sample does after the logit bias. Exposed for callers that report logprobs. */
void sampler_apply_penalties(sampler_t *s, float *logits);

/* Picks the next token from logits[n_vocab] (modified: penalties are applied
 * in place). Does not accept the token: call sampler_accept with it.
 * -INFINITY masks a token. ECS_ERR_RANGE if a logit is NaN or +inf, or if
 * every logit is -inf. */
ecs_err_t sampler_sample(sampler_t *s, float *logits, int32_t *token);

/* The index of the largest of n logits, the lowest on ties (NaNs never
 * win; 0 when nothing compares). What greedy sampling picks. */
int32_t sampler_argmax(const float *l, int32_t n);

/* ---- JSON mode (response_format {"type": "json_object"}) ----
 * A recogniser of the byte prefixes of one JSON object (RFC 8259; unpaired
 * surrogate escapes refused, as strict parsers do). The scheduler tries
 * each token's bytes on a copy of a request's state, masks the tokens that
 * fail, and ends the request when the object is complete. Whitespace
 * between tokens is bounded (SAMPLER_JSON_MAX_WS bytes in a row: a model
 * that loops on newlines would otherwise run to max_tokens), nesting to
 * SAMPLER_JSON_MAX_DEPTH. Plain data: copy it to try bytes.
 *
 *   sampler_json_t j, t;
 *   sampler_json_init(&j);
 *   t = j;
 *   if (!sampler_json_feed(&t, piece, len)) logits[id] = -INFINITY;
 */
#define SAMPLER_JSON_MAX_DEPTH 64
#define SAMPLER_JSON_MAX_WS    64
#define SAMPLER_SCHEMA_MAX_DEPTH 8     /* objects / arrays a schema follows inside each other */
#define SAMPLER_SCHEMA_MAX_NODES 1024

/* A compiled JSON Schema (response_format json_schema): immutable, shared
 * by every state that follows it. */
typedef struct sampler_schema sampler_schema_t;

typedef struct {
    uint64_t stack;         /* bit d: the container at depth d + 1 is an array */
    uint16_t hex;           /* a \u escape's digits so far */
    uint8_t depth, state, ws, aux, lit, key, low;
    /* with a schema: the nodes of the containers it follows, the value
     * expected next, the scalar being read, and a key's or an enum's
     * candidates (64-bit sets) with the bytes matched so far */
    const sampler_schema_t *sc;
    uint16_t vnode, cur, off;
    uint8_t sdepth, any;
    uint64_t cand, dup;     /* dup: a free key's seen properties it may still repeat */
    uint16_t fnode[SAMPLER_SCHEMA_MAX_DEPTH];
    uint64_t fseen[SAMPLER_SCHEMA_MAX_DEPTH];
} sampler_json_t;

/* Compiles a JSON Schema (its JSON text). The subset is OpenAI structured
 * outputs': type (one or a list), properties, required,
 * additionalProperties, items, enum / const of scalars, anyOf / oneOf whose
 * alternatives differ in JSON type (objects may also differ by a tag: the
 * same first property, required, each with its own string const; the
 * output writes it first), $ref to #, #/$defs/X, #/definitions/X
 * (recursion too); annotations ignored. Anything else is
 * ECS_ERR_UNSUPPORTED naming the keyword; the root must take an object.
 * Enum and const values must appear as their compact JSON text. */
ecs_err_t sampler_schema_new(const char *text, size_t len, sampler_schema_t **out);
void sampler_schema_free(sampler_schema_t *s);

void sampler_json_init(sampler_json_t *j);
/* The same, for text that must also match schema s (kept, not copied). */
void sampler_json_init_schema(sampler_json_t *j, const sampler_schema_t *s);
/* Feeds n bytes; false: they leave no JSON object prefix (j is then
 * undefined: feed a copy). */
bool sampler_json_feed(sampler_json_t *j, const char *b, size_t n);
/* Whether the object is complete (nothing more may follow). */
bool sampler_json_done(const sampler_json_t *j);
/* Whether j is inside a string, where bytes other than '"', '\\' and
 * control characters are taken without changing the state: a caller that
 * knows which tokens hold only such bytes need not feed them. */
bool sampler_json_in_string(const sampler_json_t *j);

/* ---- stop conditions on detokenized text ---- */

typedef struct sampler_stops sampler_stops_t;

typedef enum {
    SAMPLER_GO = 0,       /* keep generating */
    SAMPLER_STOP_EOG,     /* the caller reported an end-of-generation token */
    SAMPLER_STOP_STRING,  /* a stop string completed */
} sampler_finish_t;

typedef struct {
    sampler_finish_t finish;
    size_t emit_end;   /* text[0, emit_end) may be sent; the stop string and
                          anything after it never are */
    size_t hold;       /* GO only: bytes at the end held back because they
                          might be the start of a stop string */
    int stop_index;    /* STOP_STRING: which stop string; else -1 */
} sampler_stop_result_t;

/* Copies up to SAMPLER_MAX_STOPS non-empty strings of at most
 * SAMPLER_MAX_STOP_LEN bytes. n == 0 is allowed (only EOG stops). */
ecs_err_t sampler_stops_new(const char *const *stops, size_t n, sampler_stops_t **out);
void sampler_stops_free(sampler_stops_t *st);

/* Looks at text[0, len), the whole generated text so far (without the
 * text of an end-of-generation token). `from` is the emit_end returned by
 * the previous call for this stream (0 at the start): no stop string can
 * start before it, so each byte is scanned a bounded number of times.
 * A stop string found in the text wins over is_eog (it comes earlier);
 * otherwise is_eog flushes everything held back. */
sampler_stop_result_t sampler_stops_check(const sampler_stops_t *st, const char *text,
                                          size_t len, size_t from, bool is_eog);

#endif
