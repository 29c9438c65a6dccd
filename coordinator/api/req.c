/* req.c - a request body (OpenAI chat / completions, Anthropic messages)
 * from JSON into api_req_t, with a message naming the field for every
 * mistake (wrong type, out of range, unsupported feature). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_int.h"

#define MAX_MESSAGES 4096
#define MAX_PROMPT_IDS (1 << 22)

ecs_err_t api_bad(api_perr_t *e, ecs_err_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, e->cap, fmt, ap);
    va_end(ap);
    e->code = code;
    return code;
}

const char *api_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

json_t *api_field(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

#define bad api_bad
#define type_name api_type_name
#define field api_field
typedef api_perr_t perr_t;

static ecs_err_t get_num(perr_t *e, json_t *o, const char *k, double lo, double hi, float *out)
{
    json_t *v = field(o, k);
    if (!v)
        return ECS_OK;
    if (!json_is_number(v))
        return bad(e, ECS_ERR_INVAL, "'%s' must be a number, not %s", k, type_name(v));
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return bad(e, ECS_ERR_INVAL, "'%s' must be between %g and %g (got %g)", k, lo, hi, d);
    *out = (float)d;
    return ECS_OK;
}

static ecs_err_t get_int(perr_t *e, json_t *o, const char *k, long long lo, long long hi,
                         long long *out, bool *given)
{
    json_t *v = field(o, k);
    if (given)
        *given = v != NULL;
    if (!v)
        return ECS_OK;
    double d = json_is_real(v) ? json_real_value(v) : 0;
    if (!json_is_integer(v) && !(json_is_real(v) && d == floor(d) && fabs(d) < 9e15))
        return bad(e, ECS_ERR_INVAL, "'%s' must be an integer, not %s", k, type_name(v));
    long long x = json_is_integer(v) ? (long long)json_integer_value(v) : (long long)d;
    if (x < lo || x > hi)
        return bad(e, ECS_ERR_INVAL, "'%s' must be between %lld and %lld (got %lld)", k, lo, hi, x);
    *out = x;
    return ECS_OK;
}

static ecs_err_t get_bool(perr_t *e, json_t *o, const char *k, bool *out)
{
    json_t *v = field(o, k);
    if (!v)
        return ECS_OK;
    if (!json_is_boolean(v))
        return bad(e, ECS_ERR_INVAL, "'%s' must be a boolean, not %s", k, type_name(v));
    *out = json_is_true(v);
    return ECS_OK;
}

static ecs_err_t add_stop(perr_t *e, api_req_t *r, const char *k, json_t *v)
{
    if (!json_is_string(v))
        return bad(e, ECS_ERR_INVAL, "'%s' entries must be strings, not %s", k, type_name(v));
    size_t n = json_string_length(v);
    if (n == 0)
        return ECS_OK;
    if (n > SAMPLER_MAX_STOP_LEN)
        return bad(e, ECS_ERR_INVAL, "'%s': a stop string is %zu bytes, at most %d are allowed", k,
                   n, SAMPLER_MAX_STOP_LEN);
    if (r->n_stops == SAMPLER_MAX_STOPS)
        return bad(e, ECS_ERR_INVAL, "'%s': at most %d stop strings", k, SAMPLER_MAX_STOPS);
    if (!(r->stops[r->n_stops] = strndup(json_string_value(v), n)))
        return bad(e, ECS_ERR_NOMEM, "out of memory");
    if (strlen(r->stops[r->n_stops]) != n) { /* an embedded NUL */
        free(r->stops[r->n_stops]);
        return bad(e, ECS_ERR_INVAL, "'%s': a stop string contains a NUL character", k);
    }
    r->n_stops++;
    return ECS_OK;
}

static ecs_err_t get_stops(perr_t *e, json_t *o, const char *k, api_req_t *r)
{
    json_t *v = field(o, k);
    if (!v)
        return ECS_OK;
    if (json_is_string(v))
        return add_stop(e, r, k, v);
    if (!json_is_array(v))
        return bad(e, ECS_ERR_INVAL, "'%s' must be a string or an array of strings, not %s", k,
                   type_name(v));
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) if (add_stop(e, r, k, s))
        return e->code;
    return ECS_OK;
}

/* Message content: a string, or an array of text parts (OpenAI
 * {"type":"text","text":...}, Anthropic the same), joined. */
ecs_err_t api_content_text(api_perr_t *e, json_t *c, size_t idx, char **out)
{
    if (!c) {
        *out = strdup("");
    } else if (json_is_string(c)) {
        *out = strndup(json_string_value(c), json_string_length(c));
    } else if (json_is_array(c)) {
        size_t total = 1, i;
        json_t *p;
        json_array_foreach(c, i, p) {
            json_t *t = json_object_get(p, "type"), *x = json_object_get(p, "text");
            if (!json_is_object(p) || !json_is_string(t))
                return bad(e, ECS_ERR_INVAL, "messages[%zu].content[%zu] must be an object with a 'type'",
                           idx, i);
            if (strcmp(json_string_value(t), "text") != 0)
                return bad(e, ECS_ERR_UNSUPPORTED,
                           "messages[%zu].content[%zu]: content type '%.40s' is not supported (text only)",
                           idx, i, json_string_value(t));
            if (!json_is_string(x))
                return bad(e, ECS_ERR_INVAL, "messages[%zu].content[%zu].text must be a string", idx, i);
            total += json_string_length(x);
        }
        if ((*out = malloc(total)))
            for (total = 0, i = 0; i < json_array_size(c); i++) {
                json_t *x = json_object_get(json_array_get(c, i), "text");
                memcpy(*out + total, json_string_value(x), json_string_length(x));
                total += json_string_length(x);
                (*out)[total] = '\0';
            }
        if (*out && json_array_size(c) == 0)
            **out = '\0';
    } else {
        return bad(e, ECS_ERR_INVAL, "messages[%zu].content must be a string or an array of parts, not %s",
                   idx, type_name(c));
    }
    if (!*out)
        return bad(e, ECS_ERR_NOMEM, "out of memory");
    return ECS_OK;
}

/* Room for more messages (DeepSeek-V3's tool calls and results are one
 * message each); bounded by the body's size. */
static bool grow_msgs(api_req_t *r)
{
    int cap = r->cap_msgs * 2;
    tok_chat_msg_t *m = realloc(r->msgs, (size_t)cap * sizeof *m);
    if (!m)
        return false;
    r->msgs = m;
    api_msg_x_t *x = realloc(r->mx, (size_t)cap * sizeof *x);
    if (!x)
        return false;
    r->mx = x;
    r->cap_msgs = cap;
    return true;
}

ecs_err_t api_push_msg(api_perr_t *e, api_req_t *r, const char *role, char *text)
{
    if (!text)
        return bad(e, ECS_ERR_NOMEM, "out of memory");
    char *ro = strdup(role);
    if (!ro || (r->n_msgs == r->cap_msgs && !grow_msgs(r))) {
        free(ro);
        free(text);
        return bad(e, ECS_ERR_NOMEM, "out of memory");
    }
    r->msgs[r->n_msgs].role = ro;
    r->msgs[r->n_msgs].content = text;
    r->mx[r->n_msgs] = (api_msg_x_t){.text_len = strlen(text)};
    r->n_msgs++;
    return ECS_OK;
}

static ecs_err_t get_message(perr_t *e, json_t *msg, size_t i, api_req_t *r);

static ecs_err_t get_messages(perr_t *e, json_t *o, api_req_t *r)
{
    bool anthropic = r->route == API_ROUTE_MESSAGES;
    json_t *m = field(o, "messages");
    if (!m)
        return bad(e, ECS_ERR_INVAL, "'messages' is required");
    if (!json_is_array(m))
        return bad(e, ECS_ERR_INVAL, "'messages' must be an array, not %s", type_name(m));
    size_t n = json_array_size(m);
    if (n == 0)
        return bad(e, ECS_ERR_INVAL, "'messages' must not be empty");
    if (n > MAX_MESSAGES)
        return bad(e, ECS_ERR_INVAL, "'messages' has %zu entries, at most %d are allowed", n, MAX_MESSAGES);
    /* + system, + the tools' system turn */
    if (!(r->msgs = calloc(n + 2, sizeof *r->msgs)) || !(r->mx = calloc(n + 2, sizeof *r->mx)))
        return bad(e, ECS_ERR_NOMEM, "out of memory");
    r->cap_msgs = (int)n + 2;
    json_t *sys = anthropic ? field(o, "system") : NULL;
    if (sys) {
        char *t = NULL;
        if (api_content_text(e, sys, 0, &t)) {
            snprintf(e->err, e->cap, "'system' must be a string or an array of text blocks");
            return e->code;
        }
        if (api_push_msg(e, r, "system", t))
            return e->code;
    }
    size_t i;
    json_t *msg;
    json_array_foreach(m, i, msg) {
        if (!json_is_object(msg))
            return bad(e, ECS_ERR_INVAL, "messages[%zu] must be an object, not %s", i, type_name(msg));
        json_t *use = NULL;
        char *reasoning = NULL;
        if (api_think_message(e, msg, i, r, &use, &reasoning))
            return e->code;
        const int before = r->n_msgs;
        ecs_err_t rc = get_message(e, use, i, r);
        json_decref(use);
        if (!rc && reasoning && r->n_msgs > before) /* the assistant's turn */
            r->mx[r->n_msgs - 1].reasoning = reasoning;
        else
            free(reasoning);
        if (rc)
            return rc;
    }
    if (api_tools_system(e, r))
        return e->code;
    return api_think_history(e, r);
}

/* One message of 'messages' (its thinking blocks taken out) into r. */
static ecs_err_t get_message(perr_t *e, json_t *msg, size_t i, api_req_t *r)
{
    const bool anthropic = r->route == API_ROUTE_MESSAGES;
    bool done = false;
    if (api_tools_message(e, msg, i, r, &done))
        return e->code;
    if (done)
        return ECS_OK;
    json_t *role = json_object_get(msg, "role");
    if (!json_is_string(role))
        return bad(e, ECS_ERR_INVAL, "messages[%zu].role must be a string", i);
    const char *ro = json_string_value(role);
    if (!strcmp(ro, "developer"))
        ro = "system";
    bool ok = !strcmp(ro, "user") || !strcmp(ro, "assistant") || (!anthropic && !strcmp(ro, "system"));
    if (!ok && !strcmp(ro, "function"))
        return bad(e, ECS_ERR_UNSUPPORTED, "messages[%zu]: role 'function' (the deprecated "
                   "functions API) is not supported: use tools and role 'tool'", i);
    if (!ok)
        return bad(e, ECS_ERR_INVAL, "messages[%zu].role '%.40s' is not one of %s", i, ro,
                   anthropic ? "user, assistant" : "system, developer, user, assistant");
    char *t = NULL;
    if (api_content_text(e, json_object_get(msg, "content"), i, &t) || api_push_msg(e, r, ro, t))
        return e->code;
    return ECS_OK;
}

static ecs_err_t get_prompt(perr_t *e, json_t *o, api_req_t *r)
{
    json_t *p = field(o, "prompt");
    if (!p)
        return bad(e, ECS_ERR_INVAL, "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* ["text"] or [[ids]] */
    if (json_is_string(p)) {
        if (!(r->prompt = strndup(json_string_value(p), json_string_length(p))))
            return bad(e, ECS_ERR_NOMEM, "out of memory");
        if (strlen(r->prompt) != json_string_length(p))
            return bad(e, ECS_ERR_INVAL, "'prompt' contains a NUL character");
        return ECS_OK;
    }
    if (!json_is_array(p))
        return bad(e, ECS_ERR_INVAL, "'prompt' must be a string or an array of token ids, not %s",
                   type_name(p));
    size_t n = json_array_size(p), i;
    if (n == 0)
        return bad(e, ECS_ERR_INVAL, "'prompt' must not be empty");
    if (!json_is_integer(json_array_get(p, 0)))
        return bad(e, ECS_ERR_UNSUPPORTED, "'prompt': several prompts in one request are not supported");
    if (n > MAX_PROMPT_IDS)
        return bad(e, ECS_ERR_INVAL, "'prompt' has too many token ids");
    if (!(r->prompt_ids = malloc(n * sizeof *r->prompt_ids)))
        return bad(e, ECS_ERR_NOMEM, "out of memory");
    json_t *v;
    json_array_foreach(p, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return bad(e, ECS_ERR_INVAL, "'prompt'[%zu] must be a token id (a non-negative integer)", i);
        r->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    r->n_prompt_ids = (int)n;
    return ECS_OK;
}

static ecs_err_t unsupported_fields(perr_t *e, json_t *o)
{
    static const char *const old_api[] = {"functions", "function_call"};
    for (size_t i = 0; i < sizeof old_api / sizeof old_api[0]; i++) {
        json_t *v = field(o, old_api[i]);
        if (v && !(json_is_array(v) && json_array_size(v) == 0))
            return bad(e, ECS_ERR_UNSUPPORTED, "'%s' (the deprecated functions API) is not "
                       "supported: use 'tools' and 'tool_choice'", old_api[i]);
    }
    long long n = 1;
    if (get_int(e, o, "n", 1, 1000000, &n, NULL))
        return e->code;
    if (n != 1)
        return bad(e, ECS_ERR_UNSUPPORTED, "'n' is %lld: only one choice per request (n = 1) is supported", n);
    long long bo = 1;
    if (get_int(e, o, "best_of", 1, 1000000, &bo, NULL))
        return e->code;
    if (bo != 1)
        return bad(e, ECS_ERR_UNSUPPORTED, "'best_of' > 1 is not supported");
    return ECS_OK;
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100], ...}, added to
 * the token's logit before anything else (sampler.h). */
static ecs_err_t get_logit_bias(perr_t *e, json_t *o, sampler_params_t *sp)
{
    json_t *v = field(o, "logit_bias");
    if (!v)
        return ECS_OK;
    if (!json_is_object(v))
        return bad(e, ECS_ERR_INVAL, "'logit_bias' must be an object, not %s", type_name(v));
    if (json_object_size(v) > SAMPLER_MAX_BIAS)
        return bad(e, ECS_ERR_INVAL, "'logit_bias' has %zu entries, at most %d are allowed",
                   json_object_size(v), SAMPLER_MAX_BIAS);
    const char *k;
    json_t *b;
    json_object_foreach(v, k, b) {
        char *end;
        const long id = strtol(k, &end, 10);
        if (!*k || *end || k[0] == '-' || k[0] == '+' || k[0] == ' ' || id > INT32_MAX)
            return bad(e, ECS_ERR_INVAL, "'logit_bias': key '%.32s' is not a token id", k);
        if (!json_is_number(b) || !(json_number_value(b) >= -100 && json_number_value(b) <= 100))
            return bad(e, ECS_ERR_INVAL, "'logit_bias': the bias of token %ld must be a number "
                       "between -100 and 100", id);
        for (int i = 0; i < sp->n_bias; i++)
            if (sp->bias_id[i] == id)
                return bad(e, ECS_ERR_INVAL, "'logit_bias': token %ld is given twice", id);
        sp->bias_id[sp->n_bias] = (int32_t)id;
        sp->bias[sp->n_bias++] = (float)json_number_value(b);
    }
    return ECS_OK;
}

/* json_schema: {"name", "schema", "strict", "description"}, the schema
 * compiled (sampler.h: its subset; what is outside it is refused by name,
 * not ignored); no schema: any object, as json_object. */
static ecs_err_t get_json_schema(perr_t *e, json_t *rf, api_req_t *r)
{
    json_t *js = json_object_get(rf, "json_schema");
    if (!js || !json_is_object(js))
        return bad(e, ECS_ERR_INVAL, "'response_format': type 'json_schema' needs a "
                   "'json_schema' object");
    r->json = true;
    json_t *sch = json_object_get(js, "schema");
    if (!sch || json_is_null(sch))
        return ECS_OK;
    char *text = json_dumps(sch, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!text)
        return bad(e, ECS_ERR_NOMEM, "out of memory");
    const ecs_err_t rc = sampler_schema_new(text, strlen(text), &r->schema);
    free(text);
    if (rc != ECS_OK)
        return bad(e, rc == ECS_ERR_NOMEM ? rc : ECS_ERR_INVAL, "'response_format': %s",
                   ecs_errmsg());
    return ECS_OK;
}

/* response_format: text (the default), json_object (JSON mode: the output
 * is one JSON object, sampler.h) or json_schema. */
static ecs_err_t get_response_format(perr_t *e, json_t *o, api_req_t *r)
{
    json_t *v = field(o, "response_format");
    if (!v)
        return ECS_OK;
    json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
    if (!t || !json_is_string(t))
        return bad(e, ECS_ERR_INVAL, "'response_format' must be an object with a string 'type'");
    const char *s = json_string_value(t);
    if (!strcmp(s, "json_object")) {
        r->json = true;
        return ECS_OK;
    }
    if (!strcmp(s, "json_schema"))
        return get_json_schema(e, v, r);
    if (strcmp(s, "text"))
        return bad(e, ECS_ERR_INVAL, "'response_format': unknown type '%.32s' (text, "
                   "json_object, json_schema)", s);
    return ECS_OK;
}

static ecs_err_t parse_obj(perr_t *e, json_t *o, api_req_t *r)
{
    json_t *model = json_object_get(o, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model))
            return bad(e, ECS_ERR_INVAL, "'model' must be a string, not %s", type_name(model));
        if (!(r->model = strdup(json_string_value(model))))
            return bad(e, ECS_ERR_NOMEM, "out of memory");
    }
    if (unsupported_fields(e, o) || get_bool(e, o, "stream", &r->stream) ||
        get_bool(e, o, "ignore_eos", &r->ignore_eos))
        return e->code;
    json_t *so = field(o, "stream_options");
    if (so && !json_is_object(so))
        return bad(e, ECS_ERR_INVAL, "'stream_options' must be an object, not %s", type_name(so));
    if (so && get_bool(e, so, "include_usage", &r->include_usage))
        return e->code;
    long long mt = -1, seed = 0, topk = 0;
    bool seed_given = false, mt_given = false;
    const char *mt_key = r->route == API_ROUTE_CHAT && field(o, "max_completion_tokens")
                             ? "max_completion_tokens" : "max_tokens";
    if (get_int(e, o, mt_key, 1, INT32_MAX, &mt, &mt_given))
        return e->code;
    if (r->route == API_ROUTE_MESSAGES && !mt_given)
        return bad(e, ECS_ERR_INVAL, "'max_tokens' is required");
    r->max_tokens = (int)mt;
    sampler_params_t *sp = &r->sp;
    if (get_num(e, o, "temperature", 0, 2, &sp->temp) || get_num(e, o, "top_p", 0, 1, &sp->top_p) ||
        get_num(e, o, "min_p", 0, 1, &sp->min_p) ||
        get_num(e, o, "presence_penalty", -2, 2, &sp->presence_penalty) ||
        get_num(e, o, "frequency_penalty", -2, 2, &sp->freq_penalty) ||
        get_num(e, o, "repetition_penalty", 1e-3, 100, &sp->repeat_penalty) ||
        get_num(e, o, "repeat_penalty", 1e-3, 100, &sp->repeat_penalty) ||
        get_int(e, o, "top_k", 0, INT32_MAX, &topk, NULL) ||
        get_int(e, o, "seed", INT64_MIN, INT64_MAX, &seed, &seed_given))
        return e->code;
    sp->top_k = (int32_t)topk;
    sp->seed = (uint64_t)seed;
    r->seed_given = seed_given;
    if (get_stops(e, o, r->route == API_ROUTE_MESSAGES ? "stop_sequences" : "stop", r))
        return e->code;
    if (r->route != API_ROUTE_MESSAGES &&
        (get_logit_bias(e, o, sp) || get_response_format(e, o, r)))
        return e->code;
    long long top = -1;
    if (r->route == API_ROUTE_CHAT) {
        bool lp = false;
        if (get_bool(e, o, "logprobs", &lp) ||
            get_int(e, o, "top_logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &top, NULL))
            return e->code;
        if (top >= 0 && !lp)
            return bad(e, ECS_ERR_INVAL, "'top_logprobs' needs 'logprobs': true");
        r->top_logprobs = lp ? (top < 0 ? 0 : (int)top) : -1;
    } else if (r->route == API_ROUTE_COMPLETION) {
        if (get_int(e, o, "logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &top, NULL))
            return e->code;
        r->top_logprobs = (int)top;
        bool echo = false;
        if (get_bool(e, o, "echo", &echo))
            return e->code;
        if (echo)
            return bad(e, ECS_ERR_UNSUPPORTED, "'echo' is not supported");
        if (field(o, "suffix"))
            return bad(e, ECS_ERR_UNSUPPORTED, "'suffix' is not supported");
    }
    if (api_tools_get(e, o, r) || api_think_get(e, o, r))
        return e->code;
    return r->route == API_ROUTE_COMPLETION ? get_prompt(e, o, r) : get_messages(e, o, r);
}

ecs_err_t api_req_parse(api_route_t route, tok_chat_kind_t chat, const char *body, size_t len,
                        api_req_t *r, char *err, size_t err_cap)
{
    perr_t e = {err, err_cap, ECS_OK};
    memset(r, 0, sizeof *r);
    r->route = route;
    r->chat = chat;
    r->max_tokens = -1;
    r->top_logprobs = -1;
    r->think_budget = API_THINK_BUDGET_DEFAULT;
    r->sp = sampler_params_default();
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        snprintf(err, err_cap, "the body is not valid JSON: %s (line %d, column %d)", je.text,
                 je.line, je.column);
        return ECS_ERR_INVAL;
    }
    ecs_err_t rc = json_is_object(o) ? parse_obj(&e, o, r)
                                     : bad(&e, ECS_ERR_INVAL, "the body must be a JSON object, not %s",
                                           type_name(o));
    json_decref(o);
    if (rc != ECS_OK)
        api_req_free(r);
    return rc;
}

void api_req_free(api_req_t *r)
{
    free(r->model);
    for (int i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    for (int i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
        free(r->mx[i].reasoning);
        free(r->mx[i].think);
    }
    free(r->msgs);
    free(r->mx);
    free(r->prompt);
    free(r->prompt_ids);
    free(r->tools_text);
    free(r->call_open);
    free(r->call_name);
    sampler_schema_free(r->schema);
    memset(r, 0, sizeof *r);
}
