/* reply.c - response bodies in each API's shape: OpenAI chat.completion(.chunk)
 * and text_completion, Anthropic message and its stream events, error
 * objects, and the Prometheus text of /metrics. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api_int.h"

/* A JSON string of bytes that may not be valid UTF-8 (a token can hold part
 * of a character): invalid bytes become U+FFFD. */
static json_t *jstr(const char *s, size_t n)
{
    json_t *v = json_stringn(s, n);
    if (v)
        return v;
    char *t = malloc(3 * n + 1);
    size_t k = 0;
    if (!t)
        return json_string("");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x80) {
            t[k++] = (char)ch;
            continue;
        }
        int len = ch >= 0xF0 && ch < 0xF5 ? 4 : ch >= 0xE0 ? 3 : ch >= 0xC2 && ch < 0xE0 ? 2 : 0;
        json_t *probe = len && i + (size_t)len <= n ? json_stringn(s + i, (size_t)len) : NULL;
        if (probe) {
            memcpy(t + k, s + i, (size_t)len);
            k += (size_t)len;
            i += (size_t)len - 1;
            json_decref(probe);
        } else {
            memcpy(t + k, "\xEF\xBF\xBD", 3);
            k += 3;
        }
    }
    v = json_stringn(t, k);
    free(t);
    return v ? v : json_string("");
}

static void emit_json(api_buf_t *b, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (s)
        api_buf_puts(b, s);
    else
        b->failed = true;
    free(s);
    json_decref(o);
}

static const char *finish_openai(sched_finish_t f)
{
    return f == SCHED_FINISH_LENGTH ? "length" : "stop";
}

static const char *finish_anthropic(sched_finish_t f)
{
    return f == SCHED_FINISH_LENGTH ? "max_tokens" : f == SCHED_FINISH_STOP ? "stop_sequence" : "end_turn";
}

static json_t *usage_openai(const sched_view_t *v)
{
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", v->n_prompt, "completion_tokens",
                     v->n_gen, "total_tokens", v->n_prompt + v->n_gen, "prompt_tokens_details",
                     "cached_tokens", v->n_cached);
}

static json_t *token_bytes(const char *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* Logprobs of tokens [from, to): chat's {"content":[...]} or the legacy
 * completions shape. */
static json_t *logprobs_json(const api_job_t *j, const sched_view_t *v, int from, int to,
                             const tok_t *tok)
{
    bool chat = j->req.route == API_ROUTE_CHAT;
    json_t *content = json_array(), *toks = json_array(), *lps = json_array(),
           *tops = json_array(), *offs = json_array();
    for (int i = from; i < to; i++) {
        const sched_token_t *t = &v->tokens[i];
        size_t n = 0;
        const char *p = tok_token_piece(tok, t->id, &n);
        if (!p)
            p = "", n = 0;
        json_t *alts = chat ? json_array() : json_object();
        for (int k = 0; k < j->req.top_logprobs && t->top_id[k] >= 0; k++) {
            size_t an = 0;
            const char *ap = tok_token_piece(tok, t->top_id[k], &an);
            if (!ap)
                ap = "", an = 0;
            if (chat) {
                json_array_append_new(alts, json_pack("{s:o,s:f,s:o}", "token", jstr(ap, an),
                                                      "logprob", (double)t->top_lp[k], "bytes",
                                                      token_bytes(ap, an)));
            } else {
                json_t *key = jstr(ap, an);
                json_object_set_new(alts, json_string_value(key), json_real(t->top_lp[k]));
                json_decref(key);
            }
        }
        if (chat) {
            json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:o}", "token", jstr(p, n),
                                                     "logprob", (double)t->logprob, "bytes",
                                                     token_bytes(p, n), "top_logprobs", alts));
        } else {
            json_array_append_new(toks, jstr(p, n));
            json_array_append_new(lps, json_real(t->logprob));
            json_array_append_new(tops, alts);
            json_array_append_new(offs, json_integer((json_int_t)t->text_off));
        }
    }
    if (chat) {
        json_decref(toks), json_decref(lps), json_decref(tops), json_decref(offs);
        return json_pack("{s:o}", "content", content);
    }
    json_decref(content);
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs",
                     tops, "text_offset", offs);
}

/* Text of the output in [from, end) not sent yet (<= the view's). */
static json_t *new_span(api_job_t *j, const sched_view_t *v, size_t from, size_t end)
{
    from = from > j->sent_text ? from : j->sent_text;
    from = from < end ? from : end;
    j->sent_text = end > j->sent_text ? end : j->sent_text;
    return jstr(v->text + from, end - from);
}

/* Whether [from, end) holds text not sent yet. */
static bool unsent(const api_job_t *j, size_t from, size_t end)
{
    return end > (from > j->sent_text ? from : j->sent_text);
}

/* Where the reasoning and the answer lie (reasoning.c); without reasoning
 * all of the output is the answer. */
static api_think_span_t span(const api_job_t *j, const sched_view_t *v, bool partial)
{
    api_think_span_t s = {0, 0, 0, true, false};
    if (j->think)
        api_think_split(v->text, v->text_len, j->think_open, partial, &s);
    return s;
}

/* Anthropic's tool_use id for an OpenAI call id (call_...). */
static json_t *toolu_id(json_t *call)
{
    const char *id = json_string_value(json_object_get(call, "id"));
    char s[112];
    snprintf(s, sizeof s, "toolu_%s", id && !strncmp(id, "call_", 5) ? id + 5 : "0");
    return json_string(s);
}

/* A call's arguments as an object (Anthropic's input). */
static json_t *call_input(json_t *call)
{
    const char *a = json_string_value(json_object_get(json_object_get(call, "function"), "arguments"));
    json_t *o = a ? json_loads(a, JSON_DECODE_ANY, NULL) : NULL;
    return o ? o : json_object();
}

static json_t *call_name(json_t *call)
{
    return json_incref(json_object_get(json_object_get(call, "function"), "name"));
}

static void sse(api_buf_t *b, const char *event, json_t *o)
{
    if (event)
        api_buf_printf(b, "event: %s\n", event);
    api_buf_puts(b, "data: ");
    emit_json(b, o);
    api_buf_puts(b, "\n\n");
}

static json_t *chunk_openai(api_job_t *j, const char *model, json_t *choice)
{
    bool chat = j->req.route == API_ROUTE_CHAT;
    json_t *choices = json_array();
    if (choice)
        json_array_append_new(choices, choice);
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", j->id, "object",
                     chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)j->created, "model", model, "choices", choices);
}

static void text_block_start(api_buf_t *b, int index)
{
    sse(b, "content_block_start",
        json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_start", "index", index,
                  "content_block", "type", "text", "text", ""));
}

/* Anthropic: the text block's index (a thinking block is 0). */
static int text_index(const api_job_t *j)
{
    return j->think_block == 1 ? 1 : 0;
}

static void thinking_block_start(api_job_t *j, api_buf_t *b)
{
    sse(b, "content_block_start",
        json_pack("{s:s,s:i,s:{s:s,s:s,s:s}}", "type", "content_block_start", "index", 0,
                  "content_block", "type", "thinking", "thinking", "", "signature", ""));
    j->think_block = 1;
}

/* Anthropic, thinking: a thinking block once the answer has one (the
 * prompt opened it, or the answer does), else the text block alone, as
 * the whole reply has. False while an opening tag may be arriving. */
static bool think_block_known(api_job_t *j, api_buf_t *b, const api_think_span_t *s)
{
    if (j->req.route != API_ROUTE_MESSAGES || !j->think || j->think_block)
        return true;
    if (!s->opened && !s->closed)
        return false;
    if (s->opened) {
        thinking_block_start(j, b);
    } else {
        text_block_start(b, 0);
        j->think_block = -1;
        j->think_done = true;
    }
    return true;
}

static void block_delta(api_buf_t *b, int index, const char *type, const char *key, json_t *text)
{
    sse(b, "content_block_delta",
        json_pack("{s:s,s:i,s:{s:s,s:o}}", "type", "content_block_delta", "index", index, "delta",
                  "type", type, key, text));
}

static void block_stop(api_buf_t *b, int index)
{
    sse(b, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", index));
}

/* OpenAI chat: one delta of the answer (key content) or the reasoning
 * (reasoning_content); lp: its tokens' logprobs (taken; NULL: none). */
static void chat_delta(api_job_t *j, api_buf_t *b, const char *model, const char *key,
                       json_t *text, json_t *lp)
{
    sse(b, NULL, chunk_openai(j, model, json_pack("{s:i,s:{s:o},s:o,s:n}", "index", 0, "delta",
                                                  key, text, "logprobs", lp ? lp : json_null(),
                                                  "finish_reason")));
}

/* The reasoning up to s->r_end not sent yet; Anthropic: once it is closed,
 * its block too, and the text block opens. */
static void stream_reasoning(api_job_t *j, api_buf_t *b, const sched_view_t *v,
                             const api_think_span_t *s, const char *model, json_t *lp)
{
    const bool an = j->req.route == API_ROUTE_MESSAGES;
    if (unsent(j, s->r_off, s->r_end) || lp) {
        json_t *t = new_span(j, v, s->r_off, s->r_end);
        if (an)
            block_delta(b, 0, "thinking_delta", "thinking", t);
        else
            chat_delta(j, b, model, "reasoning_content", t, lp);
    }
    if (s->closed && !j->think_done) {
        if (an) {
            block_stop(b, 0);
            text_block_start(b, 1);
        }
        j->think_done = true;
    }
}

void api_reply_stream_start(api_job_t *j, api_buf_t *b, int n_prompt, const char *model)
{
    if (j->req.route == API_ROUTE_MESSAGES) {
        json_t *msg = json_pack("{s:s,s:s,s:s,s:[],s:s,s:n,s:n,s:{s:i,s:i}}", "id", j->id, "type",
                                "message", "role", "assistant", "content", "model", model,
                                "stop_reason", "stop_sequence", "usage", "input_tokens", n_prompt,
                                "output_tokens", 0);
        sse(b, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", msg));
        /* thinking, with a prompt that does not open the block: a block
         * once the answer shows whether it thinks (think_block_known) */
        if (j->think && j->think_open)
            thinking_block_start(j, b);
        else if (!j->think && j->req.tool_mode != API_TOOLS_FORCED) /* a forced call: no text */
            text_block_start(b, 0);
        sse(b, "ping", json_pack("{s:s}", "type", "ping"));
    } else if (j->req.route == API_ROUTE_CHAT) {
        json_t *choice = json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", 0, "delta", "role",
                                   "assistant", "content", "", "logprobs", "finish_reason");
        sse(b, NULL, chunk_openai(j, model, choice));
    }
}

void api_reply_stream_delta(api_job_t *j, api_buf_t *b, const sched_view_t *v, const char *model,
                            const tok_t *tok)
{
    bool toks = j->req.top_logprobs >= 0 && v->n_tokens > j->sent_toks;
    const api_think_span_t s = span(j, v, true);
    if (!think_block_known(j, b, &s))
        return;
    const size_t end = s.closed ? s.c_off + api_tools_text_len(&j->req, v->text + s.c_off,
                                                                v->text_len - s.c_off)
                                : s.c_off;
    const bool reason = j->think && unsent(j, s.r_off, s.r_end), answer = unsent(j, s.c_off, end);
    if (!reason && !answer && !toks && !(s.closed && j->think && !j->think_done))
        return;
    /* the tokens' logprobs go with the last chunk */
    json_t *lp = toks ? logprobs_json(j, v, j->sent_toks, v->n_tokens, tok) : NULL;
    j->sent_toks = toks ? v->n_tokens : j->sent_toks;
    if (j->think) {
        stream_reasoning(j, b, v, &s, model, answer ? NULL : lp);
        lp = answer ? lp : NULL;
        if (!answer)
            return;
    }
    json_t *text = new_span(j, v, s.c_off, end);
    if (j->req.route == API_ROUTE_MESSAGES) {
        block_delta(b, text_index(j), "text_delta", "text", text);
        return;
    }
    if (j->req.route == API_ROUTE_CHAT) {
        chat_delta(j, b, model, "content", text, lp);
        return;
    }
    sse(b, NULL, chunk_openai(j, model, json_pack("{s:i,s:o,s:o,s:n}", "index", 0, "text", text,
                                                  "logprobs", lp ? lp : json_null(),
                                                  "finish_reason")));
}

static json_t *error_obj(api_route_t route, int status, const char *msg);

/* The end of a stream's text that was held back for a call that did not
 * come (tools.c); the answer starts at from. */
static void stream_rest(api_job_t *j, api_buf_t *b, const sched_view_t *v, const char *model,
                        size_t from)
{
    if (!unsent(j, from, v->text_len))
        return;
    json_t *text = new_span(j, v, from, v->text_len);
    if (j->req.route == API_ROUTE_MESSAGES)
        block_delta(b, text_index(j), "text_delta", "text", text);
    else
        chat_delta(j, b, model, "content", text, NULL);
}

/* Anthropic: each call a tool_use block after the text's (index 0). */
static void stream_tool_use(api_buf_t *b, json_t *calls, int first)
{
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
        const int idx = (int)k + first;
        sse(b, "content_block_start",
            json_pack("{s:s,s:i,s:{s:s,s:o,s:o,s:{}}}", "type", "content_block_start", "index", idx,
                      "content_block", "type", "tool_use", "id", toolu_id(c), "name", call_name(c),
                      "input"));
        sse(b, "content_block_delta",
            json_pack("{s:s,s:i,s:{s:s,s:O}}", "type", "content_block_delta", "index", idx, "delta",
                      "type", "input_json_delta", "partial_json",
                      json_object_get(json_object_get(c, "function"), "arguments")));
        sse(b, "content_block_stop",
            json_pack("{s:s,s:i}", "type", "content_block_stop", "index", idx));
    }
}

/* OpenAI: the calls in one delta, each with its index. */
static void stream_tool_calls(api_job_t *j, api_buf_t *b, json_t *calls, const char *model)
{
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c)
        json_object_set_new(c, "index", json_integer((json_int_t)k));
    sse(b, NULL, chunk_openai(j, model, json_pack("{s:i,s:{s:O},s:n,s:n}", "index", 0, "delta",
                                                  "tool_calls", calls, "logprobs", "finish_reason")));
}

void api_reply_stream_end(api_job_t *j, api_buf_t *b, const sched_view_t *v, const char *model,
                          const tok_t *tok)
{
    api_reply_stream_delta(j, b, v, model, tok);
    bool err = v->finish == SCHED_FINISH_ERROR || v->finish == SCHED_FINISH_CANCELLED;
    const char *msg = v->finish == SCHED_FINISH_ERROR ? v->error : "the server is shutting down";
    api_think_span_t s = span(j, v, false);
    if (!err && j->think) { /* what was held back; an unclosed reasoning ends here */
        think_block_known(j, b, &s);
        s.closed = true;
        stream_reasoning(j, b, v, &s, model, NULL);
    }
    size_t tl = 0;
    json_t *calls = err ? NULL : api_tools_calls(&j->req, j->id, v->text + s.c_off,
                                                 v->text_len - s.c_off, &tl);
    /* Anthropic: a forced call's stream opened no text block */
    const bool text_block = j->req.route != API_ROUTE_MESSAGES ||
                            j->req.tool_mode != API_TOOLS_FORCED;
    const int ti = text_index(j);
    if (!err && !calls) {
        if (!text_block)
            text_block_start(b, ti);
        stream_rest(j, b, v, model, s.c_off);
    }
    if (j->req.route == API_ROUTE_MESSAGES) {
        if (err) {
            sse(b, "error", error_obj(API_ROUTE_MESSAGES, 500, msg));
            return;
        }
        if (text_block || !calls)
            block_stop(b, ti);
        if (calls)
            stream_tool_use(b, calls, text_block ? ti + 1 : 0);
        json_t *seq = v->finish == SCHED_FINISH_STOP && v->stop_index >= 0 && !calls
                          ? json_string(j->req.stops[v->stop_index]) : json_null();
        sse(b, "message_delta",
            json_pack("{s:s,s:{s:s,s:o},s:{s:i}}", "type", "message_delta", "delta", "stop_reason",
                      calls ? "tool_use" : finish_anthropic(v->finish), "stop_sequence", seq,
                      "usage", "output_tokens",
                      v->n_gen));
        sse(b, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        json_decref(calls);
        return;
    }
    if (err) {
        sse(b, NULL, error_obj(API_ROUTE_CHAT, 500, msg));
    } else {
        bool chat = j->req.route == API_ROUTE_CHAT;
        if (calls)
            stream_tool_calls(j, b, calls, model);
        json_t *choice = chat ? json_pack("{s:i,s:{},s:n,s:s}", "index", 0, "delta", "logprobs",
                                          "finish_reason",
                                          calls ? "tool_calls" : finish_openai(v->finish))
                              : json_pack("{s:i,s:s,s:n,s:s}", "index", 0, "text", "", "logprobs",
                                          "finish_reason", finish_openai(v->finish));
        sse(b, NULL, chunk_openai(j, model, choice));
        if (j->req.include_usage) {
            json_t *c = chunk_openai(j, model, NULL);
            json_object_set_new(c, "usage", usage_openai(v));
            sse(b, NULL, c);
        }
    }
    json_decref(calls);
    api_buf_puts(b, "data: [DONE]\n\n");
}

void api_reply_full(api_job_t *j, api_buf_t *b, const sched_view_t *v, const char *model,
                    const tok_t *tok)
{
    const api_think_span_t s = span(j, v, false);
    size_t tl = v->text_len - s.c_off;
    json_t *calls = api_tools_calls(&j->req, j->id, v->text + s.c_off, v->text_len - s.c_off, &tl);
    json_t *text = new_span(j, v, s.c_off, s.c_off + tl);
    json_t *reasoning = j->think && s.opened ? jstr(v->text + s.r_off, s.r_end - s.r_off) : NULL;
    if (j->req.route == API_ROUTE_MESSAGES) {
        json_t *seq = v->finish == SCHED_FINISH_STOP && v->stop_index >= 0 && !calls
                          ? json_string(j->req.stops[v->stop_index]) : json_null();
        json_t *content = json_array();
        if (reasoning) /* its signature: none (nothing here checks one) */
            json_array_append_new(content, json_pack("{s:s,s:o,s:s}", "type", "thinking",
                                                     "thinking", reasoning, "signature", ""));
        if (!calls || tl > 0)
            json_array_append_new(content, json_pack("{s:s,s:O}", "type", "text", "text", text));
        size_t k;
        json_t *c;
        json_array_foreach(calls, k, c)
            json_array_append_new(content, json_pack("{s:s,s:o,s:o,s:o}", "type", "tool_use", "id",
                                                     toolu_id(c), "name", call_name(c), "input",
                                                     call_input(c)));
        json_decref(text);
        json_decref(calls);
        emit_json(b, json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:o,s:{s:i,s:i,s:i}}", "id", j->id,
                               "type", "message", "role", "assistant", "model", model, "content",
                               content, "stop_reason",
                               calls ? "tool_use" : finish_anthropic(v->finish), "stop_sequence",
                               seq, "usage", "input_tokens", v->n_prompt - v->n_cached,
                               "output_tokens", v->n_gen, "cache_read_input_tokens", v->n_cached));
        return;
    }
    bool chat = j->req.route == API_ROUTE_CHAT;
    json_t *lp = j->req.top_logprobs >= 0 ? logprobs_json(j, v, 0, v->n_tokens, tok) : json_null();
    if (calls && tl == 0) {
        json_decref(text);
        text = json_null();
    }
    json_t *choice = chat ? json_pack("{s:i,s:{s:s,s:o},s:o,s:s}", "index", 0, "message", "role",
                                      "assistant", "content", text, "logprobs", lp,
                                      "finish_reason", calls ? "tool_calls" : finish_openai(v->finish))
                          : json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "text", text, "logprobs", lp,
                                      "finish_reason", finish_openai(v->finish));
    if (calls)
        json_object_set_new(json_object_get(choice, "message"), "tool_calls", calls);
    if (reasoning && s.r_end > s.r_off) /* as llama-server: only when there is some */
        json_object_set_new(json_object_get(choice, "message"), "reasoning_content", reasoning);
    else
        json_decref(reasoning);
    emit_json(b, json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", j->id, "object",
                           chat ? "chat.completion" : "text_completion", "created",
                           (json_int_t)j->created, "model", model, "choices", choice, "usage",
                           usage_openai(v)));
}

static json_t *error_obj(api_route_t route, int status, const char *msg)
{
    if (route == API_ROUTE_MESSAGES) {
        const char *t = status == 401 ? "authentication_error" : status == 404 ? "not_found_error"
                        : status == 413 ? "request_too_large" : status == 503 ? "overloaded_error"
                        : status >= 500 ? "api_error" : "invalid_request_error";
        return json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type", t, "message",
                         jstr(msg, strlen(msg)));
    }
    const char *t = status == 401 ? "authentication_error" : status == 404 ? "not_found_error"
                    : status >= 500 ? "server_error" : "invalid_request_error";
    return json_pack("{s:{s:o,s:s,s:n,s:n}}", "error", "message", jstr(msg, strlen(msg)), "type", t,
                     "param", "code");
}

void api_error_body(api_buf_t *b, api_route_t route, int status, const char *msg)
{
    emit_json(b, error_obj(route, status, msg));
}

static void hist(api_buf_t *b, const char *name, const char *help, const uint64_t *bucket,
                 uint64_t count, double sum)
{
    api_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < 12; i++) {
        if (isinf(sched_hist_bounds[i]))
            api_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)count);
        else
            api_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, sched_hist_bounds[i],
                           (unsigned long long)bucket[i]);
    }
    api_buf_printf(b, "%s_sum %.6f\n%s_count %llu\n", name, sum, name, (unsigned long long)count);
}

static void metric(api_buf_t *b, const char *name, const char *type, const char *help, double v)
{
    api_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

void api_metrics_text(api_server_t *srv, api_buf_t *b)
{
    static const char *const routes[API_M_ROUTES] = {
        "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/models",
        "/health",              "/ready",          "/metrics",     "other",
        "/console",             "/console/state",  "/tokenize",   "/detokenize",
        "/v1/messages/count_tokens"};
    static const int codes[API_M_STATUSES] = {200, 400, 401, 404, 405, 408, 413, 431, 500, 503};
    api_buf_puts(b, "# HELP ecs_http_requests_total HTTP requests answered, by route and status.\n"
                    "# TYPE ecs_http_requests_total counter\n");
    for (int r = 0; r < API_M_ROUTES; r++)
        for (int s = 0; s < API_M_STATUSES; s++)
            if (srv->req_count[r][s])
                api_buf_printf(b, "ecs_http_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
                               routes[r], codes[s], (unsigned long long)srv->req_count[r][s]);
    sched_stats_t st;
    sched_stats(srv->sched, &st);
    metric(b, "ecs_prompt_tokens_total", "counter", "Prompt tokens evaluated.", (double)st.prompt_tokens);
    metric(b, "ecs_generation_tokens_total", "counter", "Tokens generated.", (double)st.gen_tokens);
    metric(b, "ecs_steps_total", "counter", "Model steps run by the scheduler.", (double)st.steps);
    metric(b, "ecs_requests_running", "gauge", "Requests admitted (holding KV blocks).", st.running);
    metric(b, "ecs_requests_waiting", "gauge", "Requests waiting for admission.", st.waiting);
    metric(b, "ecs_kv_blocks", "gauge", "KV blocks in the pool allocated at start-up.", st.kv_blocks);
    metric(b, "ecs_kv_block_tokens", "gauge", "Tokens per KV block.", MODEL_KV_BLOCK);
    metric(b, "ecs_kv_blocks_used", "gauge", "KV blocks referenced by requests.", st.kv_blocks_used);
    metric(b, "ecs_kv_blocks_free", "gauge",
           "KV blocks no request references (free or kept by the prefix cache).",
           st.kv_blocks - st.kv_blocks_used);
    metric(b, "ecs_kv_blocks_cached", "gauge",
           "Unreferenced KV blocks kept by the prefix cache (evicted LRU when needed).",
           st.kv_blocks_cached);
    metric(b, "ecs_kv_cache_bytes", "gauge", "Bytes of the KV block pool.", (double)st.kv_bytes);
    metric(b, "ecs_kv_block_evictions_total", "counter",
           "Cached KV blocks reused for other requests.", (double)st.kv_evictions);
    metric(b, "ecs_preemptions_total", "counter",
           "Running requests preempted for KV blocks (recomputed later).", (double)st.preemptions);
    metric(b, "ecs_prefill_slices_total", "counter",
           "Prompt chunks' layer slices run between decode steps.", (double)st.prefill_slices);
    metric(b, "ecs_recomputed_tokens_total", "counter",
           "Generated tokens re-fed after a preemption.", (double)st.recomputed_tokens);
    metric(b, "ecs_recompute_steps_total", "counter",
           "Steps times requests that re-fed generated tokens after a preemption.",
           (double)st.recompute_steps);
    metric(b, "ecs_prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens served from the prefix cache.", (double)st.prefix_hit_tokens);
    metric(b, "ecs_prefix_cache_lookup_tokens_total", "counter",
           "Prompt tokens looked up in the prefix cache (every admitted prompt token).",
           (double)st.prefix_lookup_tokens);
    metric(b, "ecs_client_disconnects_total", "counter",
           "Requests cancelled because their client went away.", (double)srv->disconnects);
    metric(b, "ecs_http_connections", "gauge", "Open HTTP connections.", srv->n_conns);
    hist(b, "ecs_time_to_first_token_seconds", "Seconds from a request's arrival to its first token.",
         st.ttft_bucket, st.ttft_count, st.ttft_sum);
    hist(b, "ecs_time_between_tokens_seconds", "Seconds between two tokens of a stream.",
         st.tbt_bucket, st.tbt_count, st.tbt_sum);
    api_metrics_workers(srv, b);
}
