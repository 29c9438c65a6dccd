/* routes.c - what each route does: authentication, the small routes,
 * and generation requests (parse, tokenize, submit to the scheduler, then
 * answer from its published progress, streamed or whole). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_int.h"

/* Constant time in the key's contents: every configured key is compared
 * over its whole length, whatever matched before. */
static bool key_ok(const api_server_t *srv, const char *given)
{
    if (!srv->o.api_keys || !srv->o.api_keys[0])
        return true;
    size_t gl = given ? strlen(given) : 0;
    unsigned ok = 0;
    for (const char *const *k = srv->o.api_keys; *k; k++) {
        size_t kl = strlen(*k);
        unsigned diff = (unsigned)(gl ^ kl) | (gl == 0);
        for (size_t i = 0; i < kl; i++)
            diff |= (unsigned char)(*k)[i] ^ (unsigned char)(gl ? given[i < gl ? i : 0] : 0);
        ok |= diff == 0;
    }
    return ok != 0;
}

static const char *given_key(const api_http_t *h)
{
    const char *x = api_http_header(h, "x-api-key");
    if (x)
        return x;
    const char *a = api_http_header(h, "authorization");
    if (a && strncasecmp(a, "Bearer ", 7) == 0)
        return a + 7;
    return NULL;
}

static void send_json(api_conn_t *c, const char *body)
{
    api_send_simple(c, 200, "application/json", body, strlen(body));
    api_conn_done(c);
}

static void fail(api_conn_t *c, api_route_t route, int status, const char *msg)
{
    api_send_error(c, route, status, msg);
    api_conn_done(c);
}

static void job_free(api_server_t *srv, api_job_t *j)
{
    if (j->r) {
        sched_release(j->r);
        srv->n_jobs--;
    }
    api_req_free(&j->req);
    free(j);
}

void api_job_abandon(api_server_t *srv, api_job_t *j)
{
    j->c = NULL;
    sched_cancel(srv->sched, j->r);
}

static void write_chunk(api_conn_t *c, const api_buf_t *b)
{
    if (b->failed || b->len == 0)
        return;
    char hdr[24];
    int n = snprintf(hdr, sizeof hdr, "%zx\r\n", b->len);
    api_conn_write(c, hdr, (size_t)n);
    api_conn_write(c, b->p, b->len);
    api_conn_write(c, "\r\n", 2);
}

/* Turns a request into prompt ids (at most n_ctx - 1), or answers with
 * the error. */
static bool tokenize(api_conn_t *c, api_req_t *q, int n_ctx, int32_t **ids, int *n)
{
    api_server_t *srv = c->srv;
    ecs_err_t e;
    if (q->route != API_ROUTE_COMPLETION) {
        tok_chat_msg_t *msgs = NULL;
        const char *prefill = NULL;
        e = q->tool_parts ? api_tools_template(tok_chat_kind(srv->tok)) : ECS_OK;
        if (e == ECS_OK)
            e = api_think_view(q, tok_chat_thinks(srv->tok), tok_chat_think_open(srv->tok), &msgs,
                               &prefill);
        if (e == ECS_OK)
            e = api_prompt_chat(srv->tok, &srv->specials, msgs, q->n_msgs, q->sys_own, prefill,
                                n_ctx, ids, n);
        free(msgs);
    } else if (q->prompt) {
        e = api_prompt_text(srv->tok, q->prompt, n_ctx, ids, n);
    } else {
        if (q->n_prompt_ids >= n_ctx) {
            e = ecs_error(ECS_ERR_RANGE, "the prompt is %d tokens; this server's context holds %d "
                          "(prompt and at least one generated token)", q->n_prompt_ids, n_ctx);
        } else {
            *ids = q->prompt_ids;
            *n = q->n_prompt_ids;
            q->prompt_ids = NULL;
            q->n_prompt_ids = 0;
            e = ECS_OK;
        }
    }
    if (e == ECS_OK)
        return true;
    int status = e == ECS_ERR_NOMEM ? 503 : e == ECS_ERR_INTERNAL ? 500 : 400;
    fail(c, q->route, status, ecs_errmsg());
    return false;
}

/* The request's model, if it names one, must be this server's (else a 404). */
static bool model_ok(api_conn_t *c, const api_req_t *q)
{
    const char *id = c->srv->o.model_id;
    if (!q->model || !strcmp(q->model, id))
        return true;
    char err[512];
    snprintf(err, sizeof err, "model '%.200s' not found: this server serves '%.200s'", q->model, id);
    fail(c, q->route, 404, err);
    return false;
}

/* POST /v1/messages/count_tokens (Anthropic): the prompt a Messages request
 * would give the model (system, tools, messages, the template's tokens),
 * counted: {"input_tokens": N}. It takes no max_tokens; a prompt longer
 * than the context is counted too, up to a bound the body's size sets
 * (a token holds at least a byte of the rendered prompt). */
static void count_tokens(api_conn_t *c)
{
    size_t len;
    const char *body = api_http_body(c->http, &len);
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    char *text = NULL, err[512];
    if (json_is_object(o)) { /* what a generation request needs and counting does not */
        if (!json_object_get(o, "max_tokens"))
            json_object_set_new(o, "max_tokens", json_integer(1));
        json_object_del(o, "stream");
        if (!(text = json_dumps(o, JSON_COMPACT))) {
            json_decref(o);
            fail(c, API_ROUTE_MESSAGES, 503, "out of memory");
            return;
        }
    }
    json_decref(o);
    api_req_t q;
    ecs_err_t e = api_req_parse(API_ROUTE_MESSAGES, tok_chat_kind(c->srv->tok),
                                text ? text : body, text ? strlen(text) : len, &q, err, sizeof err);
    const size_t bound = 2 * (text ? strlen(text) : len) + 4096;
    free(text);
    if (e != ECS_OK) {
        fail(c, API_ROUTE_MESSAGES, 400, err);
        return;
    }
    int32_t *ids = NULL;
    int n = 0, n_ctx = sched_n_ctx(c->srv->sched);
    if (bound > (size_t)n_ctx)
        n_ctx = bound < (1u << 22) ? (int)bound : 1 << 22;
    if (model_ok(c, &q) && tokenize(c, &q, n_ctx + 1, &ids, &n)) {
        char out[48];
        snprintf(out, sizeof out, "{\"input_tokens\":%d}", n);
        send_json(c, out);
    }
    free(ids);
    api_req_free(&q);
}

static void generate(api_conn_t *c, api_route_t route)
{
    api_server_t *srv = c->srv;
    size_t len;
    const char *body = api_http_body(c->http, &len);
    char err[512];
    api_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        fail(c, route, 503, "out of memory");
        return;
    }
    if (api_req_parse(route, tok_chat_kind(srv->tok), body, len, &j->req, err, sizeof err) !=
        ECS_OK) {
        free(j);
        fail(c, route, 400, err);
        return;
    }
    api_req_t *q = &j->req;
    if (!model_ok(c, q)) {
        job_free(srv, j);
        return;
    }
    sched_params_t p = {.top_logprobs = q->top_logprobs, .ignore_eos = q->ignore_eos, .sp = q->sp,
                        .json = q->json, .schema = q->schema};
    p.n_keep = api_tools_keep(q, srv->tok, p.keep);
    if (!tokenize(c, q, sched_n_ctx(srv->sched), &p.prompt, &p.n_prompt)) {
        job_free(srv, j);
        return;
    }
    p.max_tokens = q->max_tokens > 0 ? q->max_tokens : sched_n_ctx(srv->sched);
    if (!q->seed_given)
        p.sp.seed = (uint64_t)time(NULL) * 6364136223846793005ull + ++srv->seq;
    for (int i = 0; i < q->n_stops; i++)
        p.stops[i] = q->stops[i];
    p.n_stops = q->n_stops;
    j->think = api_think_splits(q, tok_chat_thinks(srv->tok));
    j->think_open = j->think && tok_chat_think_open(srv->tok);
    if (j->think && api_think_budget(q, srv->tok, j->think_open, srv->o.reasoning_budget,
                                   &p.think) != ECS_OK) {
        free(p.prompt);
        job_free(srv, j);
        fail(c, route, 500, ecs_errmsg());
        return;
    }
    j->created = (long)time(NULL);
    snprintf(j->id, sizeof j->id, "%s%llx%llx",
             route == API_ROUTE_MESSAGES ? "msg_" : route == API_ROUTE_CHAT ? "chatcmpl-" : "cmpl-",
             (unsigned long long)j->created, (unsigned long long)++srv->seq);
    int n_prompt = p.n_prompt;
    ecs_err_t e = sched_submit(srv->sched, &p, j, &j->r);
    if (e == ECS_OK) {
        srv->n_jobs++;
        q->schema = NULL; /* the scheduler's now */
    }
    if (e != ECS_OK) {
        free(p.prompt);
        job_free(srv, j);
        fail(c, route, e == ECS_ERR_NOMEM ? 503 : 400, ecs_errmsg());
        return;
    }
    j->c = c;
    c->job = j;
    if (!q->stream)
        return;
    const char *hdr = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                      "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    api_conn_write(c, hdr, strlen(hdr));
    api_buf_t b = {0};
    api_reply_stream_start(j, &b, n_prompt, srv->o.model_id);
    write_chunk(c, &b);
    api_buf_free(&b);
}

void api_on_update(void *arg, sched_req_t *r)
{
    api_server_t *srv = arg;
    api_job_t *j = sched_req_user(r);
    sched_view_t v = sched_req_view(r);
    bool done = v.finish != SCHED_RUNNING;
    api_conn_t *c = j->c;
    if (!c) { /* answered already, or the client is gone */
        if (v.last)
            job_free(srv, j);
        return;
    }
    api_buf_t b = {0};
    if (j->req.stream) {
        if (done)
            api_reply_stream_end(j, &b, &v, srv->o.model_id, srv->tok);
        else
            api_reply_stream_delta(j, &b, &v, srv->o.model_id, srv->tok);
        write_chunk(c, &b);
        if (done) {
            api_conn_write(c, "0\r\n\r\n", 5);
            api_count(srv, c->m_route, v.finish == SCHED_FINISH_ERROR ? 500 : 200);
        }
    } else if (done) {
        if (v.finish == SCHED_FINISH_ERROR || v.finish == SCHED_FINISH_CANCELLED) {
            api_send_error(c, j->req.route, 500,
                           v.finish == SCHED_FINISH_ERROR ? v.error : "the server is shutting down");
        } else {
            api_reply_full(j, &b, &v, srv->o.model_id, srv->tok);
            api_send_simple(c, 200, "application/json", b.failed ? "{}" : b.p, b.failed ? 2 : b.len);
        }
    }
    api_buf_free(&b);
    if (!done) {
        api_conn_kick(c);
        return;
    }
    j->c = NULL; /* answered: a queued update for it only frees it */
    if (v.last)
        job_free(srv, j);
    api_conn_done(c);
    api_conn_kick(c);
}

/* GET /v1/models (the list: this server's one model) and /v1/models/ID
 * (that model, or a 404). */
static void models(api_conn_t *c, const char *id)
{
    char one[512], body[1024];
    snprintf(one, sizeof one, "{\"id\":\"%s\",\"object\":\"model\",\"created\":0,"
             "\"owned_by\":\"ecs\",\"context_length\":%d}",
             c->srv->o.model_id, sched_n_ctx(c->srv->sched));
    if (id && strcmp(id, c->srv->o.model_id)) {
        snprintf(body, sizeof body, "model '%.200s' not found: this server serves '%.200s'", id,
                 c->srv->o.model_id);
        fail(c, API_ROUTE_CHAT, 404, body);
        return;
    }
    if (!id)
        snprintf(body, sizeof body, "{\"object\":\"list\",\"data\":[%s]}", one);
    send_json(c, id ? one : body);
}

void api_handle(api_conn_t *c)
{
    api_server_t *srv = c->srv;
    const char *path = api_http_path(c->http), *method = api_http_method(c->http);
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    static const struct {
        const char *path;
        int m;
        bool post;
    } table[] = {
        {"/v1/chat/completions", API_M_CHAT, true}, {"/v1/completions", API_M_COMPLETIONS, true},
        {"/v1/messages", API_M_MESSAGES, true},     {"/v1/models", API_M_MODELS, false},
        {"/v1/messages/count_tokens", API_M_COUNT_TOKENS, true},
        {"/health", API_M_HEALTH, false},           {"/ready", API_M_READY, false},
        {"/metrics", API_M_METRICS, false},         {"/console", API_M_CONSOLE, false},
        {"/console/state", API_M_CONSOLE_STATE, false},
        {"/tokenize", API_M_TOKENIZE, true},        {"/detokenize", API_M_DETOKENIZE, true},
    };
    int k = -1;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(path, table[i].path))
            k = (int)i;
    if (k < 0 && !strncmp(path, "/v1/models/", 11)) /* retrieve a model: by its id */
        k = 3;
    api_route_t route = k == 2 || (k >= 0 && table[k].m == API_M_COUNT_TOKENS) ? API_ROUTE_MESSAGES
                        : k == 1 ? API_ROUTE_COMPLETION : API_ROUTE_CHAT;
    c->m_route = k < 0 ? API_M_OTHER : table[k].m;
    if (k < 0) {
        char msg[600];
        snprintf(msg, sizeof msg, "no route for %s %.500s", method, path);
        fail(c, route, 404, msg);
        return;
    }
    if (table[k].post ? !post : !get) {
        char msg[100];
        snprintf(msg, sizeof msg, "%s needs %s", table[k].path, table[k].post ? "POST" : "GET");
        fail(c, route, 405, msg);
        return;
    }
    if ((!strncmp(path, "/v1/", 4) || table[k].post) && !key_ok(srv, given_key(c->http))) {
        fail(c, route, 401, "a valid API key is required (Authorization: Bearer KEY or x-api-key)");
        return;
    }
    if (srv->draining && (table[k].post || table[k].m == API_M_READY)) {
        /* shutting down: the balancer sends these elsewhere */
        static char retry[48];
        snprintf(retry, sizeof retry, "Retry-After: %d\r\n", api_retry_after(srv));
        c->extra_hdr = retry;
        if (table[k].m == API_M_READY) {
            const char *body = "{\"status\":\"shutting down\"}";
            api_send_simple(c, 503, "application/json", body, strlen(body));
            api_conn_done(c);
        } else {
            fail(c, route, 503, "the server is shutting down: try again elsewhere or later");
        }
        return;
    }
    switch (table[k].m) {
    case API_M_HEALTH: send_json(c, "{\"status\":\"ok\"}"); return;
    case API_M_READY: send_json(c, "{\"status\":\"ready\"}"); return;
    case API_M_CONSOLE: api_console_page(c); return;
    case API_M_CONSOLE_STATE: api_console_state(c); return;
    case API_M_MODELS: models(c, path[10] == '/' ? path + 11 : NULL); return;
    case API_M_COUNT_TOKENS: count_tokens(c); return;
    case API_M_TOKENIZE: api_tokenize(c, false); return;
    case API_M_DETOKENIZE: api_tokenize(c, true); return;
    case API_M_METRICS: {
        api_buf_t b = {0};
        api_metrics_text(srv, &b);
        api_send_simple(c, b.failed ? 500 : 200, "text/plain; version=0.0.4",
                        b.failed ? "" : b.p, b.failed ? 0 : b.len);
        api_buf_free(&b);
        api_conn_done(c);
        return;
    }
    default: generate(c, route);
    }
}
