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

/* Text published since the last reply, clipped at what the view allows. */
static json_t *new_text(api_job_t *j, const sched_view_t *v)
{
    size_t from = j->sent_text < v->text_len ? j->sent_text : v->text_len;
    j->sent_text = v->text_len;
    return jstr(v->text + from, v->text_len - from);
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

void api_reply_stream_start(api_job_t *j, api_buf_t *b, int n_prompt, const char *model)
{
    if (j->req.route == API_ROUTE_MESSAGES) {
        json_t *msg = json_pack("{s:s,s:s,s:s,s:[],s:s,s:n,s:n,s:{s:i,s:i}}", "id", j->id, "type",
                                "message", "role", "assistant", "content", "model", model,
                                "stop_reason", "stop_sequence", "usage", "input_tokens", n_prompt,
                                "output_tokens", 0);
        sse(b, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", msg));
        sse(b, "content_block_start",
            json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_start", "index", 0,
                      "content_block", "type", "text", "text", ""));
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
    if (v->text_len <= j->sent_text && !toks)
        return;
    json_t *text = new_text(j, v);
    if (j->req.route == API_ROUTE_MESSAGES) {
        sse(b, "content_block_delta",
            json_pack("{s:s,s:i,s:{s:s,s:o}}", "type", "content_block_delta", "index", 0, "delta",
                      "type", "text_delta", "text", text));
        return;
    }
    json_t *lp = toks ? logprobs_json(j, v, j->sent_toks, v->n_tokens, tok) : json_null();
    j->sent_toks = v->n_tokens;
    json_t *choice = j->req.route == API_ROUTE_CHAT
                         ? json_pack("{s:i,s:{s:o},s:o,s:n}", "index", 0, "delta", "content", text,
                                     "logprobs", lp, "finish_reason")
                         : json_pack("{s:i,s:o,s:o,s:n}", "index", 0, "text", text, "logprobs", lp,
                                     "finish_reason");
    sse(b, NULL, chunk_openai(j, model, choice));
}

static json_t *error_obj(api_route_t route, int status, const char *msg);

void api_reply_stream_end(api_job_t *j, api_buf_t *b, const sched_view_t *v, const char *model,
                          const tok_t *tok)
{
    api_reply_stream_delta(j, b, v, model, tok);
    bool err = v->finish == SCHED_FINISH_ERROR || v->finish == SCHED_FINISH_CANCELLED;
    const char *msg = v->finish == SCHED_FINISH_ERROR ? v->error : "the server is shutting down";
    if (j->req.route == API_ROUTE_MESSAGES) {
        if (err) {
            sse(b, "error", error_obj(API_ROUTE_MESSAGES, 500, msg));
            return;
        }
        sse(b, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", 0));
        json_t *seq = v->finish == SCHED_FINISH_STOP && v->stop_index >= 0
                          ? json_string(j->req.stops[v->stop_index]) : json_null();
        sse(b, "message_delta",
            json_pack("{s:s,s:{s:s,s:o},s:{s:i}}", "type", "message_delta", "delta", "stop_reason",
                      finish_anthropic(v->finish), "stop_sequence", seq, "usage", "output_tokens",
                      v->n_gen));
        sse(b, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        return;
    }
    if (err) {
        sse(b, NULL, error_obj(API_ROUTE_CHAT, 500, msg));
    } else {
        bool chat = j->req.route == API_ROUTE_CHAT;
        json_t *choice = chat ? json_pack("{s:i,s:{},s:n,s:s}", "index", 0, "delta", "logprobs",
                                          "finish_reason", finish_openai(v->finish))
                              : json_pack("{s:i,s:s,s:n,s:s}", "index", 0, "text", "", "logprobs",
                                          "finish_reason", finish_openai(v->finish));
        sse(b, NULL, chunk_openai(j, model, choice));
        if (j->req.include_usage) {
            json_t *c = chunk_openai(j, model, NULL);
            json_object_set_new(c, "usage", usage_openai(v));
            sse(b, NULL, c);
        }
    }
    api_buf_puts(b, "data: [DONE]\n\n");
}

void api_reply_full(api_job_t *j, api_buf_t *b, const sched_view_t *v, const char *model,
                    const tok_t *tok)
{
    json_t *text = new_text(j, v);
    if (j->req.route == API_ROUTE_MESSAGES) {
        json_t *seq = v->finish == SCHED_FINISH_STOP && v->stop_index >= 0
                          ? json_string(j->req.stops[v->stop_index]) : json_null();
        emit_json(b, json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:o}],s:s,s:o,s:{s:i,s:i,s:i}}", "id", j->id,
                               "type", "message", "role", "assistant", "model", model, "content",
                               "type", "text", "text", text, "stop_reason",
                               finish_anthropic(v->finish), "stop_sequence", seq, "usage",
                               "input_tokens", v->n_prompt - v->n_cached, "output_tokens", v->n_gen,
                               "cache_read_input_tokens", v->n_cached));
        return;
    }
    bool chat = j->req.route == API_ROUTE_CHAT;
    json_t *lp = j->req.top_logprobs >= 0 ? logprobs_json(j, v, 0, v->n_tokens, tok) : json_null();
    json_t *choice = chat ? json_pack("{s:i,s:{s:s,s:o},s:o,s:s}", "index", 0, "message", "role",
                                      "assistant", "content", text, "logprobs", lp,
                                      "finish_reason", finish_openai(v->finish))
                          : json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "text", text, "logprobs", lp,
                                      "finish_reason", finish_openai(v->finish));
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
        "/console",             "/console/state",  "/tokenize",   "/detokenize"};
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
