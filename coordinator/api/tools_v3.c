/* tools_v3.c - tool calls in DeepSeek-V3's form (tools.c does Qwen's).
 *
 * A call is <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME, a newline and
 * the arguments in a ```json fence, then <｜tool▁call▁end｜>; an answer's
 * calls sit between <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>, after
 * its text. Past calls and results are messages of their own (roles
 * "tool_call" and "tool") that tok_chat.c renders with the template's
 * markup, so the markup is control tokens where the vocabulary has them.
 * V3's template has no place for the tool list: it goes into the system
 * turn the way llama.cpp's minja fills in tools for such templates (the
 * list as indented JSON, then an example call). A forced call names its
 * function before the JSON, so only a call to one known function can be
 * forced: its answer starts with the call's markup up to the fence, and
 * JSON mode constrains the arguments to the tool's parameters. */
#include <string.h>

#include "api_int.h"

#define V3_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define V3_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define V3_SEP "<｜tool▁sep｜>"
#define V3_CALL_END "<｜tool▁call▁end｜>"
#define V3_CALLS_END "<｜tool▁calls▁end｜>"
#define V3_FENCE "```"

const char api_v3_calls_begin[] = V3_CALLS_BEGIN;
const char *const api_v3_markup[API_V3_N_MARKUP] = {V3_CALLS_BEGIN, V3_CALL_BEGIN, V3_SEP,
                                                    V3_CALL_END, V3_CALLS_END};

char *api_v3_tools_text(json_t *defs)
{
    char *list = json_dumps(defs, JSON_INDENT(2));
    api_buf_t b = {0};
    if (!list)
        return NULL;
    api_buf_puts(&b, "You can call any of the following tools to satisfy the user's requests: ");
    api_buf_puts(&b, list);
    api_buf_puts(&b, "\n\nExample tool call syntax:\n\n" V3_CALLS_BEGIN V3_CALL_BEGIN "function" V3_SEP
                     "tool_name\n" V3_FENCE "json\n{\"arg1\": \"some_value\"}\n" V3_FENCE V3_CALL_END
                     V3_CALLS_END);
    api_buf_add(&b, "", 1);
    free(list);
    if (b.failed) {
        api_buf_free(&b);
        return NULL;
    }
    return b.p;
}

char *api_v3_call_text(const char *name, json_t *args)
{
    api_buf_t b = {0};
    api_buf_printf(&b, "%s\n" V3_FENCE "json\n", name);
    if (json_is_string(args)) {
        api_buf_add(&b, json_string_value(args), json_string_length(args));
    } else {
        char *s = args ? json_dumps(args, JSON_ENCODE_ANY) : NULL;
        api_buf_puts(&b, s ? s : "{}");
        b.failed |= args && !s;
        free(s);
    }
    api_buf_puts(&b, "\n" V3_FENCE);
    api_buf_add(&b, "", 1);
    if (b.failed) {
        api_buf_free(&b);
        return NULL;
    }
    return b.p;
}

char *api_v3_forced_open(const char *name)
{
    api_buf_t b = {0};
    api_buf_printf(&b, V3_CALLS_BEGIN V3_CALL_BEGIN "function" V3_SEP "%s\n" V3_FENCE "json\n", name);
    api_buf_add(&b, "", 1);
    if (b.failed) {
        api_buf_free(&b);
        return NULL;
    }
    return b.p;
}

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t'))
        i++;
    return i;
}

static bool eat(const char *s, size_t *i, size_t n, const char *tag)
{
    size_t m = strlen(tag);
    if (n - *i < m || memcmp(s + *i, tag, m))
        return false;
    *i += m;
    return true;
}

/* The arguments at s[*i..n): a JSON value, compact, or NULL. */
static char *read_args(const char *s, size_t *i, size_t n)
{
    json_error_t je;
    json_t *v = json_loadb(s + *i, n - *i, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
    if (!v)
        return NULL;
    *i += (size_t)je.position;
    char *a = json_is_object(v) ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return a;
}

/* One call after its <｜tool▁call▁begin｜>: type, name, fenced arguments,
 * <｜tool▁call▁end｜>. */
static json_t *read_call(const char *s, size_t *i, size_t n, const char *id, size_t k)
{
    const char *sep = memmem(s + *i, n - *i, V3_SEP, strlen(V3_SEP));
    if (!sep || sep - (s + *i) > 16) /* the call's type: "function" */
        return NULL;
    *i = (size_t)(sep - s) + strlen(V3_SEP);
    const char *nl = memchr(s + *i, '\n', n - *i);
    char name[65];
    size_t nn = nl ? (size_t)(nl - (s + *i)) : 0;
    if (!nl || nn == 0 || nn >= sizeof name)
        return NULL;
    memcpy(name, s + *i, nn);
    name[nn] = '\0';
    if (!api_tools_name_ok(name))
        return NULL;
    *i = skip_ws(s, *i + nn + 1, n);
    if (eat(s, i, n, V3_FENCE))
        (void)eat(s, i, n, "json");
    *i = skip_ws(s, *i, n);
    char *args = read_args(s, i, n);
    *i = skip_ws(s, *i, n);
    (void)eat(s, i, n, V3_FENCE);
    *i = skip_ws(s, *i, n);
    json_t *call = args && eat(s, i, n, V3_CALL_END) ? api_tools_call_json(id, k, name, args) : NULL;
    free(args);
    return call;
}

json_t *api_v3_calls(const api_req_t *r, const char *id, const char *s, size_t n, size_t *text_len)
{
    *text_len = n;
    if (r->tool_mode == API_TOOLS_FORCED) { /* the answer is the arguments */
        size_t i = skip_ws(s, 0, n);
        char *args = read_args(s, &i, n);
        json_t *call = args && skip_ws(s, i, n) == n ? api_tools_call_json(id, 0, r->call_name, args)
                                                     : NULL;
        free(args);
        json_t *calls = call ? json_array() : NULL;
        if (calls && json_array_append_new(calls, call))
            json_decref(calls), calls = NULL;
        if (!calls)
            json_decref(call);
        else
            *text_len = 0;
        return calls;
    }
    const char *p = memmem(s, n, V3_CALLS_BEGIN, strlen(V3_CALLS_BEGIN));
    if (!p)
        return NULL;
    size_t i = (size_t)(p - s) + strlen(V3_CALLS_BEGIN);
    json_t *calls = json_array();
    for (size_t k = 0; calls; k++) {
        i = skip_ws(s, i, n);
        json_t *c = eat(s, &i, n, V3_CALL_BEGIN) ? read_call(s, &i, n, id, k) : NULL;
        if (!c || json_array_append_new(calls, c))
            goto fail;
        i = skip_ws(s, i, n);
        if (r->one_call)
            break;
        if (eat(s, &i, n, V3_CALLS_END) || i == n) { /* closed, or the answer stopped after a call */
            if (skip_ws(s, i, n) != n)
                goto fail;
            break;
        }
    }
    if (!calls)
        return NULL;
    size_t t = (size_t)(p - s);
    while (t > 0 && (s[t - 1] == ' ' || s[t - 1] == '\n' || s[t - 1] == '\r' || s[t - 1] == '\t'))
        t--;
    *text_len = t;
    return calls;
fail:
    json_decref(calls);
    return NULL;
}
