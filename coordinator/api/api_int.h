/* api_int.h - the HTTP front's private state, shared by its files:
 * server.c (loop, connections, limits, timeouts), routes.c (handlers),
 * reply.c (JSON and SSE bodies), prompt.c (tokenizing requests), req.c
 * (request bodies), tools.c (tool calls in and out), reasoning.c
 * (thinking in and out), buf.c (buffers). */
#ifndef ECS_API_INT_H
#define ECS_API_INT_H

#include <ev.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>

#include "api.h"

typedef struct {
    int32_t id;
    const char *text;
    size_t len;
} api_special_t;

typedef struct {
    api_special_t *v; /* longest text first */
    int n;
} api_specials_t;

ecs_err_t api_specials_init(const tok_t *tok, api_specials_t *sp);
void api_specials_free(api_specials_t *sp);
ecs_err_t api_prompt_text(const tok_t *tok, const char *text, int n_ctx, int32_t **out, int *n_out);
/* prefill (NULL: none): text the answer starts with, after the template's
 * assistant prompt (a forced tool call's tag). sys_own: the last bytes of
 * msgs[0]'s content that are the server's own text (api_req_t.sys_own), 0
 * for none. */
ecs_err_t api_prompt_chat(const tok_t *tok, const api_specials_t *sp, const tok_chat_msg_t *msgs,
                          int n, size_t sys_own, const char *prefill, int n_ctx, int32_t **out,
                          int *n_out);

/* Request parsing (req.c, tools.c): the client's message for a mistake. */
typedef struct {
    char *err;
    size_t cap;
    ecs_err_t code;
} api_perr_t;
/* Writes the message, returns code. */
ecs_err_t api_bad(api_perr_t *e, ecs_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *api_type_name(const json_t *v); /* "an object", "a string", ... */
json_t *api_field(json_t *o, const char *k); /* present and not null, or NULL */
/* A message's content (a string or text parts, joined) into *out (malloc'd). */
ecs_err_t api_content_text(api_perr_t *e, json_t *c, size_t idx, char **out);
/* Appends a message (takes text, even on failure). */
ecs_err_t api_push_msg(api_perr_t *e, api_req_t *r, const char *role, char *text);

/* Tools (tools.c; Qwen's Hermes form in a ChatML template, tools_v3.c
 * DeepSeek-V3's). A forced call's answer starts with r->call_open, or
 * API_TOOL_CALL_OPEN when that is NULL. */
#define API_TOOL_CALL_OPEN "<tool_call>\n"
/* tools / tool_choice of a chat (OpenAI) or messages (Anthropic) body. */
ecs_err_t api_tools_get(api_perr_t *e, json_t *o, api_req_t *r);
/* A message that carries tool calls or results (OpenAI role tool or
 * assistant tool_calls, Anthropic tool_use / tool_result blocks): its
 * rendering appended to r's messages, *done set; else *done false. */
ecs_err_t api_tools_message(api_perr_t *e, json_t *msg, size_t i, api_req_t *r, bool *done);
/* After the messages: the tools' description joins the system turn. */
ecs_err_t api_tools_system(api_perr_t *e, api_req_t *r);
/* ECS_OK when a template of kind k (NONE: the ChatML fallback) has a place
 * for tools; else the error, naming the template. */
ecs_err_t api_tools_template(tok_chat_kind_t k);
/* Whether r's output must keep the text of its calls' markup tokens
 * (DeepSeek-V3's calls are control tokens). */
bool api_tools_render_special(const api_req_t *r);
/* Those tokens' ids in tok's vocabulary (prompt.c: the tokenizer's side),
 * for sched_params_t.keep; returns the count, 0 when r keeps none. */
int api_tools_keep(const api_req_t *r, const tok_t *tok, int32_t keep[TOK_KEEP_MAX]);
/* OpenAI's rule for function names: 1-64 of [A-Za-z0-9_.-]. */
bool api_tools_name_ok(const char *s);
/* One call in OpenAI's shape: id "call_<id>_<k>", the arguments' text. */
json_t *api_tools_call_json(const char *id, size_t k, const char *name, const char *args);

/* DeepSeek-V3's form (tools_v3.c). Results are NULL when out of memory. */
extern const char api_v3_calls_begin[];
/* The markup a call is written with, for the output to keep. */
#define API_V3_N_MARKUP 5
extern const char *const api_v3_markup[API_V3_N_MARKUP];
/* The tools (OpenAI's shape) as the system turn describes them. */
char *api_v3_tools_text(json_t *defs);
/* A past call as a "tool_call" message's content (tok_chat.c). */
char *api_v3_call_text(const char *name, json_t *args);
/* A forced call's answer start: the markup up to the arguments' fence. */
char *api_v3_forced_open(const char *name);
/* api_tools_calls for V3 (forced: the output is the arguments of
 * r->call_name). */
json_t *api_v3_calls(const api_req_t *r, const char *id, const char *s, size_t n, size_t *text_len);

/* Bytes at the end of s[0, n) that begin tag (it may be arriving). */
size_t api_tag_tail(const char *s, size_t n, const char *tag);
/* Bytes of the output that may go out as text while streaming (a call's
 * tag and what follows it are held back). */
size_t api_tools_text_len(const api_req_t *r, const char *text, size_t len);
/* The output's calls as OpenAI tool_calls (ids from id), or NULL when it
 * holds none (then all of it is text); *text_len: the text before them. */
json_t *api_tools_calls(const api_req_t *r, const char *id, const char *text, size_t len,
                        size_t *text_len);

/* Reasoning (reasoning.c) for templates that think (tok_chat_thinks):
 * chat_template_kwargs.enable_thinking (OpenAI) / thinking (Anthropic). */
ecs_err_t api_think_get(api_perr_t *e, json_t *o, api_req_t *r);
/* An assistant message's reasoning (reasoning_content, thinking blocks;
 * *reasoning NULL when none) and the message to render (*use, a new
 * reference: Anthropic's without its thinking / redacted_thinking blocks). */
ecs_err_t api_think_message(api_perr_t *e, json_t *msg, size_t i, const api_req_t *r,
                            json_t **use, char **reasoning);
/* After the messages: each assistant turn as Qwen3's template renders it
 * (mx[i].think). */
ecs_err_t api_think_history(api_perr_t *e, api_req_t *r);
/* The messages (*msgs, malloc'd; the strings are r's) and the answer's
 * start (*prefill, static or NULL) to render for r, with a thinking
 * template or not (open: one whose assistant prompt opens the think
 * block, tok_chat_think_open). */
ecs_err_t api_think_view(const api_req_t *r, bool thinks, bool open, tok_chat_msg_t **msgs,
                         const char **prefill);
/* Qwen3's think tags (reasoning.c splits on them; api_think_budget closes). */
#define API_THINK_OPEN "<think>"
#define API_THINK_CLOSE "</think>"
/* r's reasoning budget (its own, or dflt, the server's, where it gives
 * none) for the scheduler: the tokens of "\n</think>\n\n" written for the
 * model once the budget runs out (open: the prompt opened the think
 * block). t->budget < 0: none. */
ecs_err_t api_think_budget(const api_req_t *r, const tok_t *tok, bool open, int dflt,
                           sched_think_budget_t *t);
/* Whether r's output is split into reasoning and answer with a template
 * that thinks or not: thinking on, a chat, and no JSON mode (a forced
 * call's or response_format's grammar starts at the first token). */
bool api_think_splits(const api_req_t *r, bool thinks);

/* A growable byte buffer; `failed` latches an allocation failure. */
typedef struct {
    char *p;
    size_t len, cap;
    bool failed;
} api_buf_t;
void api_buf_add(api_buf_t *b, const char *s, size_t n);
void api_buf_puts(api_buf_t *b, const char *s);
void api_buf_printf(api_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void api_buf_free(api_buf_t *b);

/* Metrics: route label index of a request and counts per status. */
enum { API_M_CHAT, API_M_COMPLETIONS, API_M_MESSAGES, API_M_MODELS, API_M_HEALTH, API_M_READY,
       API_M_METRICS, API_M_OTHER, API_M_CONSOLE, API_M_CONSOLE_STATE, API_M_TOKENIZE,
       API_M_DETOKENIZE, API_M_COUNT_TOKENS, API_M_ROUTES };
#define API_M_STATUSES 10

typedef struct api_conn api_conn_t;
typedef struct api_job api_job_t;

struct api_server {
    const dispatch_t *dispatch; /* workers' figures for /metrics (NULL: local experts) */
    api_opts_t o;
    model_t *m;
    const tok_t *tok;
    sched_t *sched;
    api_specials_t specials;
    struct ev_loop *loop;
    ev_io accept_w;
    ev_timer accept_pause;
    ev_async wake, stop_w;
    ev_signal sigint_w, sigterm_w;
    int fd, port;
    api_conn_t *conns;
    int n_conns;
    char **keys;
    size_t n_keys;
    uint64_t seq;
    uint64_t req_count[API_M_ROUTES][API_M_STATUSES];
    uint64_t conns_total, disconnects;
    /* graceful shutdown (server.c) */
    int n_jobs;             /* requests handed to the scheduler, not yet freed */
    bool draining;
    double drain_deadline;
    ev_timer drain_w;
};

struct api_conn {
    api_server_t *srv;
    int fd;
    ev_io rio, wio;
    ev_timer timer;
    api_http_t *http;
    char *in;
    size_t in_len, in_cap;
    api_buf_t out;
    size_t out_off;
    bool busy, close_after, reading;
    double req_t0, last_t;
    int m_route;
    api_job_t *job;
    const char *extra_hdr;  /* one more header line for the next answer, "" */
    api_conn_t *prev, *next;
};

struct api_job {
    api_conn_t *c;          /* NULL once the client is gone */
    sched_req_t *r;
    api_req_t req;
    char id[48];
    long created;
    size_t sent_text;
    int sent_toks;
    bool think;             /* the output is split into reasoning and answer */
    bool think_open;        /* the prompt opened the think block (tok_chat_think_open) */
    bool think_done;        /* stream: the reasoning is all sent (Anthropic: its block closed) */
    int think_block;        /* Anthropic stream: 1 a thinking block (index 0), -1 none, 0 not
                               known yet (the answer may still open one) */
};

/* server.c */
void api_conn_write(api_conn_t *c, const char *s, size_t n);
/* The current request is answered (its bytes are queued). */
void api_conn_done(api_conn_t *c);
/* Sends what is queued and goes on with pipelined requests; c may be
 * closed (freed) on return. */
void api_conn_kick(api_conn_t *c);
void api_send_simple(api_conn_t *c, int status, const char *ctype, const char *body, size_t n);
void api_send_error(api_conn_t *c, api_route_t route, int status, const char *msg);
void api_count(api_server_t *srv, int m_route, int status);
const char *api_status_text(int status);

/* console.c: GET /console and /console/state */
void api_console_page(api_conn_t *c);
void api_console_state(api_conn_t *c);
/* Seconds a client should wait before trying again (while shutting down). */
int api_retry_after(const api_server_t *srv);

/* routes.c */
/* tokenize.c: POST /tokenize (detok false) and /detokenize, answered at once */
void api_tokenize(api_conn_t *c, bool detok);
void api_handle(api_conn_t *c);
void api_on_update(void *arg, sched_req_t *r);
void api_job_abandon(api_server_t *srv, api_job_t *j);

/* reply.c: bodies for each API */
void api_reply_stream_start(api_job_t *j, api_buf_t *b, int n_prompt, const char *model);
void api_reply_stream_delta(api_job_t *j, api_buf_t *b, const sched_view_t *v, const char *model,
                            const tok_t *tok);
void api_reply_stream_end(api_job_t *j, api_buf_t *b, const sched_view_t *v, const char *model,
                          const tok_t *tok);
void api_reply_full(api_job_t *j, api_buf_t *b, const sched_view_t *v, const char *model,
                    const tok_t *tok);
void api_error_body(api_buf_t *b, api_route_t route, int status, const char *msg);
void api_metrics_text(api_server_t *srv, api_buf_t *b);
/* metrics_workers.c: the dispatcher's per-worker figures (nothing when
 * the experts run in-process). */
void api_metrics_workers(const api_server_t *srv, api_buf_t *b);

#endif
