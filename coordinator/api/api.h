/* api.h - the HTTP front of ecs-coordinator: OpenAI and Anthropic routes
 * over libev, libhttp-parser and libjansson, streamed as server-sent events.
 *
 * Contract:
 *   - One event-loop thread (the caller of api_server_run) owns every
 *     socket. Generation requests go to the scheduler (sched.h); its
 *     progress comes back through an ev_async wake-up, never by polling.
 *   - Routes: POST /v1/chat/completions, /v1/completions, /v1/messages;
 *     GET /v1/models, /health, /ready, /metrics, /console (the live console,
 *     console.html compiled in) and /console/state. Errors are each API's
 *     error JSON with a message naming what was wrong.
 *   - HTTP/1.1 keep-alive and pipelining (one request at a time per
 *     connection, answered in order), chunked request bodies, limits on
 *     header and body bytes (431 / 413), a read timeout from a request's
 *     first byte to its end (408) and an idle timeout between requests.
 *     A client that goes away cancels its request at once.
 *   - Tools (function calling) in Qwen's Hermes form, where the model's
 *     template is ChatML or absent: described in the system turn, calls
 *     read back from the output, a forced call constrained to its schema.
 *   - Reasoning where the template thinks (Qwen3's, tok_chat_thinks): the
 *     output's <think> part returned apart, thinking switched off on
 *     request, past reasoning rendered as the template does (reasoning.c).
 *   - Chat messages are tokenized so that text inside a message that spells
 *     a control token stays plain text (it cannot forge a turn); a raw
 *     /v1/completions prompt parses control-token text as llama-server does.
 *   - API keys (optional) are compared in constant time.
 *
 * Usage:
 *   api_opts_t o = api_opts_default(); o.host = "127.0.0.1"; o.port = 8080;
 *   api_server_t *srv; api_server_new(&o, model, tok, sched, &srv);
 *   api_server_run(srv);        // until SIGINT/SIGTERM or api_server_stop
 *   api_server_free(srv);
 */
#ifndef ECS_API_H
#define ECS_API_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/dispatch/dispatch.h"
#include "coordinator/model/model.h"
#include "coordinator/sampler/sampler.h"
#include "coordinator/sched/sched.h"
#include "coordinator/tokenizer/tokenizer.h"

#define API_THINK_BUDGET_DEFAULT (-2) /* api_req_t.think_budget: the server's applies */

typedef struct {
    const char *host;        /* address to bind (default 127.0.0.1) */
    int port;
    const char *model_id;    /* the name /v1/models reports and requests must use */
    size_t max_body;         /* bytes of a request body (413 past it) */
    size_t max_header;       /* bytes of the request line and headers (431 past it) */
    double read_timeout_s;   /* first byte to complete request (408 past it) */
    double idle_timeout_s;   /* a kept-alive connection with nothing to do is closed */
    int max_conns;           /* accepted connections at once (503 past it) */
    const char *const *api_keys; /* NULL or NULL-terminated list */
    bool handle_signals;     /* SIGINT/SIGTERM stop the loop */
    /* Graceful shutdown (with handle_signals): on the first SIGTERM or
     * SIGINT new generation requests get 503 with Retry-After and /ready
     * turns 503, running ones finish for up to grace_s seconds (then they
     * are cancelled), and the loop ends; a second signal ends it at once.
     * grace_s 0: stop at once. *shutting_down (if given) is set then. */
    double grace_s;
    atomic_bool *shutting_down;
    /* Reasoning budget of a request to a thinking template that names none
     * (llama-server's --reasoning-budget): -1 none (default), 0 the think
     * block ends at once, N after N tokens. */
    int reasoning_budget;
    /* GET /console/state: the console's JSON (malloc'd), NULL: 404 */
    char *(*state_json)(void *arg);
    void *state_arg;
} api_opts_t;

api_opts_t api_opts_default(void);

typedef struct api_server api_server_t;

/* Binds and listens (ECS_ERR_IO with the reason when it cannot). */
ecs_err_t api_server_new(const api_opts_t *o, model_t *m, const tok_t *tok, sched_t *sched,
                         api_server_t **out);
/* Runs the loop until stopped; then closes every connection. */
ecs_err_t api_server_run(api_server_t *srv);
/* From any thread. */
void api_server_stop(api_server_t *srv);
/* The dispatcher whose per-worker figures /metrics shows (NULL: none);
 * before api_server_run. */
void api_server_set_dispatch(api_server_t *srv, const dispatch_t *d);
/* The port actually bound (for port 0). */
int api_server_port(const api_server_t *srv);
void api_server_free(api_server_t *srv);

/* ---- request parsing (exposed for the fuzz target and tests) ---- */

typedef enum {
    API_ROUTE_CHAT = 0,      /* /v1/chat/completions */
    API_ROUTE_COMPLETION,    /* /v1/completions */
    API_ROUTE_MESSAGES,      /* /v1/messages (Anthropic) */
} api_route_t;

/* How a request's output is read for tool calls (tools.c). */
typedef enum {
    API_TOOLS_OFF = 0,  /* no tools, or tool_choice none: all text */
    API_TOOLS_AUTO,     /* the model may call: <tool_call> blocks at the end */
    API_TOOLS_FORCED,   /* one call of a named function: the output is its JSON */
} api_tool_mode_t;

/* A message as a reasoning ("thinking") template renders it differently
 * (reasoning.c): parallel to api_req_t's msgs. */
typedef struct {
    char *reasoning;   /* assistant: reasoning_content / thinking blocks, NULL: none given */
    size_t text_len;   /* bytes of the content before its tool calls */
    char *think;       /* assistant: the content as Qwen3's template renders it, else NULL */
} api_msg_x_t;

typedef struct {
    api_route_t route;
    char *model;
    bool stream, include_usage, ignore_eos;
    int max_tokens;          /* -1: as many as the context allows */
    sampler_params_t sp;
    bool seed_given;
    char *stops[SAMPLER_MAX_STOPS];
    int n_stops;
    int top_logprobs;        /* -1: no logprobs */
    bool json;               /* response_format json_object or json_schema */
    sampler_schema_t *schema; /* json_schema's, compiled (api_req_free frees it) */
    tok_chat_msg_t *msgs;    /* chat and messages (system first when given) */
    int n_msgs;
    char *prompt;            /* completions: text prompt */
    int32_t *prompt_ids;     /* completions: a prompt given as token ids */
    int n_prompt_ids;
    api_tool_mode_t tool_mode;
    char *tools_text;        /* the tools as the system turn describes them, NULL: none */
    size_t sys_own;          /* the last sys_own bytes of msgs[0] (the system turn) are this
                                server's (the tools text): control-token text there is those
                                tokens, as llama-server's rendered template gives them */
    bool tool_parts;         /* tools, calls or results: the template needs a place for them */
    int tool_turn_end;       /* parsing: n_msgs just after a turn of tool results, else 0 */
    bool one_call;           /* parallel_tool_calls false / disable_parallel_tool_use: the first call only */
    api_msg_x_t *mx;         /* per message (n_msgs of them), for a thinking template */
    bool think_off;          /* enable_thinking false / thinking disabled */
    int think_budget;        /* reasoning budget in tokens: Anthropic thinking.budget_tokens,
                                OpenAI thinking_budget_tokens (-1: none, 0: the think block
                                ends at once); API_THINK_BUDGET_DEFAULT: not given */
    tok_chat_kind_t chat;    /* the template's kind: which form tool calls take */
    int cap_msgs;            /* room in msgs and mx */
    char *call_open;         /* a forced call's answer starts with this (NULL: API_TOOL_CALL_OPEN) */
    char *call_name;         /* DeepSeek-V3, forced: the function called (its answer: the arguments) */
} api_req_t;

/* Where a thinking model's output (thinking on) holds its reasoning and
 * its answer (reasoning.c): text[r_off, r_end) and text[c_off, len).
 * The reasoning is there when the output opens with "<think>" or the
 * prompt opened it (open); an output that does not is all answer (a
 * model that chose not to think, or does not: llama.cpp's rule).
 * closed: "</think>" came, or there was no think block (else all of it is
 * reasoning). partial: the output is still growing, so an opening tag, a
 * partial "</think>" and newlines that may end the reasoning are held back
 * (r_end before them). opened: there is a think block (the output or the
 * prompt opened it); neither opened nor closed: an opening tag may be
 * arriving (partial only). */
typedef struct {
    size_t r_off, r_end, c_off;
    bool closed, opened;
} api_think_span_t;
void api_think_split(const char *text, size_t len, bool open, bool partial, api_think_span_t *s);

/* Parses a JSON body for route into r, its tool calls and results in the
 * form of the model's chat template of kind chat (DeepSeek-V3's, else
 * Qwen's ChatML form). On failure returns ECS_ERR_INVAL (or
 * ECS_ERR_UNSUPPORTED for a feature this server cannot do, e.g. n > 1)
 * and writes a message for the client into err; r is then already freed. */
ecs_err_t api_req_parse(api_route_t route, tok_chat_kind_t chat, const char *body, size_t len,
                        api_req_t *r, char *err, size_t err_cap);
void api_req_free(api_req_t *r);

/* Incremental HTTP/1.1 request parser with limits (one connection's). */
typedef struct api_http api_http_t;
typedef enum {
    API_HTTP_MORE = 0,       /* need more bytes */
    API_HTTP_DONE,           /* a request is complete (api_http_* accessors) */
    API_HTTP_ERR,            /* malformed: answer 400 and close */
    API_HTTP_TOO_LARGE_HDR,  /* 431 */
    API_HTTP_TOO_LARGE_BODY, /* 413 */
} api_http_status_t;

ecs_err_t api_http_new(size_t max_header, size_t max_body, api_http_t **out);
void api_http_free(api_http_t *h);
/* Feeds bytes; *used says how many were consumed (the rest belongs to the
 * next, pipelined, request: feed it again after api_http_next). */
api_http_status_t api_http_feed(api_http_t *h, const char *buf, size_t len, size_t *used);
/* Forgets the completed request, ready for the next. */
void api_http_next(api_http_t *h);
bool api_http_started(const api_http_t *h);
/* True once per request that sent "Expect: 100-continue" (answer it). */
bool api_http_take_continue(api_http_t *h);
const char *api_http_method(const api_http_t *h);
const char *api_http_path(const api_http_t *h);   /* URL without the query */
/* Value of a header (case-insensitive name), NULL if absent. */
const char *api_http_header(const api_http_t *h, const char *name);
const char *api_http_body(const api_http_t *h, size_t *len);
bool api_http_keep_alive(const api_http_t *h);

#endif
