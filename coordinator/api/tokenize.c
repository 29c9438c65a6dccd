/* tokenize.c - POST /tokenize and /detokenize in llama-server's shapes,
 * for the token ids logit_bias takes and for counting a prompt's tokens:
 *   {"content": TEXT, "add_special": false, "parse_special": true,
 *    "with_pieces": false}  ->  {"tokens": [ID, ...]}
 *   (with_pieces: [{"id": ID, "piece": TEXT}, ...])
 *   {"tokens": [ID, ...]}  ->  {"content": TEXT}
 * The body's size is bounded by --max-body, so is everything made here. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_int.h"

static void answer(api_conn_t *c, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s)
        api_send_simple(c, 200, "application/json", s, strlen(s));
    else
        api_send_error(c, API_ROUTE_CHAT, 500, "out of memory");
    free(s);
    api_conn_done(c);
}

static void refuse(api_conn_t *c, const char *msg)
{
    api_send_error(c, API_ROUTE_CHAT, 400, msg);
    api_conn_done(c);
}

static bool flag(json_t *o, const char *k, bool dflt, bool *ok)
{
    json_t *v = json_object_get(o, k);
    if (v && !json_is_boolean(v))
        *ok = false;
    return v && json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* A piece as JSON text, through the streaming decoder: a token that holds
 * part of a UTF-8 character shows as U+FFFD. */
static json_t *piece_json(const tok_t *tok, int32_t id)
{
    const size_t cap = 2 * tok_decoder_max_out(tok) + 8;
    char *out = malloc(cap);
    size_t n = 0, k = 0;
    tok_decoder_t d;
    tok_decoder_init(&d, tok, true);
    if (!out || tok_decoder_push(&d, id, out, cap, &n) != ECS_OK ||
        tok_decoder_flush(&d, out + n, cap - n, &k) != ECS_OK)
        n = k = 0;
    json_t *v = out ? json_stringn(out, n + k) : NULL;
    free(out);
    return v;
}

static void tokenize(api_conn_t *c, json_t *o)
{
    json_t *t = json_object_get(o, "content");
    bool ok = true;
    const bool add = flag(o, "add_special", false, &ok), parse = flag(o, "parse_special", true, &ok),
               pieces = flag(o, "with_pieces", false, &ok);
    if (!t || !json_is_string(t) || !ok) {
        refuse(c, "/tokenize takes {\"content\": string} and the booleans add_special, "
                  "parse_special, with_pieces");
        return;
    }
    const size_t len = json_string_length(t), cap = tok_encode_bound(len);
    int32_t *ids = cap < (1u << 26) ? malloc(cap * sizeof *ids) : NULL;
    size_t n = 0;
    const tok_t *tok = c->srv->tok;
    if (!ids || tok_encode(tok, json_string_value(t), len, add, parse, ids, cap, &n) != ECS_OK) {
        free(ids);
        refuse(c, ids ? ecs_errmsg() : "out of memory");
        return;
    }
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) {
        json_t *e = pieces ? json_pack("{s:i,s:o}", "id", (json_int_t)ids[i], "piece",
                                       piece_json(tok, ids[i]))
                           : json_integer(ids[i]);
        if (json_array_append_new(a, e) != 0) {
            json_decref(a);
            a = NULL;
        }
    }
    free(ids);
    answer(c, a ? json_pack("{s:o}", "tokens", a) : NULL);
}

static void detokenize(api_conn_t *c, json_t *o)
{
    json_t *a = json_object_get(o, "tokens");
    const tok_t *tok = c->srv->tok;
    if (!a || !json_is_array(a)) {
        refuse(c, "/detokenize takes {\"tokens\": [id, ...]}");
        return;
    }
    const size_t n = json_array_size(a);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        refuse(c, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        const json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= tok_n_vocab(tok)) {
            char msg[128];
            snprintf(msg, sizeof msg, "tokens[%zu] is not a token id (0..%d)", i,
                     tok_n_vocab(tok) - 1);
            free(ids);
            refuse(c, msg);
            return;
        }
        ids[i] = (int32_t)id;
    }
    const size_t cap = n * tok_decoder_max_out(tok) + tok_decoder_max_out(tok) + 1;
    char *text = malloc(cap);
    size_t len = 0;
    if (!text || tok_decode(tok, ids, n, true, text, cap, &len) != ECS_OK) {
        free(ids);
        free(text);
        refuse(c, text ? ecs_errmsg() : "out of memory");
        return;
    }
    free(ids);
    answer(c, json_pack("{s:s%}", "content", text, len));
    free(text);
}

void api_tokenize(api_conn_t *c, bool detok)
{
    size_t len = 0;
    const char *body = api_http_body(c->http, &len);
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        char msg[300];
        snprintf(msg, sizeof msg, "the body is not a JSON object: %s", o ? "" : je.text);
        json_decref(o);
        refuse(c, msg);
        return;
    }
    if (detok)
        detokenize(c, o);
    else
        tokenize(c, o);
    json_decref(o);
}
