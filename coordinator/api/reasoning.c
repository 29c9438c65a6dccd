/* reasoning.c - reasoning ("thinking") with templates that think (Qwen3's:
 * ChatML whose text writes <think>, tok_chat_thinks). Such a model starts
 * its answer with "<think>\n...\n</think>\n\n"; this file does what Qwen3's
 * Jinja template and llama-server / vLLM do around that:
 *   - the switch: OpenAI chat_template_kwargs.enable_thinking, Anthropic
 *     thinking {type: enabled | disabled}; on by default (the template then
 *     adds nothing), off ends the prompt with an empty think block;
 *   - history: an assistant turn's reasoning (reasoning_content, Anthropic
 *     thinking blocks, or a think block in its content) is kept only after
 *     the last user query (a tool loop in progress) and dropped before it,
 *     byte for byte as the template renders it;
 *   - output: the reasoning (up to "</think>") split from the answer, for
 *     reasoning_content / thinking blocks (reply.c).
 * Everything is computed at parse time; whether the model's template
 * thinks is known only when the request is tokenized (api_think_view), so
 * other templates render the messages exactly as before. */
#include <stdlib.h>
#include <string.h>

#include "api_int.h"

/* What Qwen3's template appends to the assistant prompt with
 * enable_thinking false. */
#define THINK_EMPTY API_THINK_OPEN "\n\n" API_THINK_CLOSE "\n\n"

/* ------------------------------------------------------------ request */

static ecs_err_t anthropic_thinking(api_perr_t *e, json_t *t, api_req_t *r)
{
    json_t *ty = json_is_object(t) ? api_field(t, "type") : NULL;
    const char *s = json_is_string(ty) ? json_string_value(ty) : "";
    if (!strcmp(s, "disabled")) {
        r->think_off = true;
        return ECS_OK;
    }
    if (strcmp(s, "enabled"))
        return api_bad(e, ECS_ERR_INVAL, "'thinking' must be {\"type\": \"enabled\", "
                       "\"budget_tokens\": N} or {\"type\": \"disabled\"}");
    json_t *b = api_field(t, "budget_tokens");
    if (!json_is_integer(b) || json_integer_value(b) < 1 || json_integer_value(b) > INT32_MAX)
        return api_bad(e, ECS_ERR_INVAL, "'thinking'.budget_tokens must be a positive integer");
    r->think_budget = (int)json_integer_value(b);
    return ECS_OK;
}

ecs_err_t api_think_get(api_perr_t *e, json_t *o, api_req_t *r)
{
    if (r->route == API_ROUTE_MESSAGES) {
        json_t *t = api_field(o, "thinking");
        return t ? anthropic_thinking(e, t, r) : ECS_OK;
    }
    if (r->route != API_ROUTE_CHAT)
        return ECS_OK;
    json_t *b = api_field(o, "thinking_budget_tokens"); /* llama-server's field */
    if (b && (!json_is_integer(b) || json_integer_value(b) < -1 || json_integer_value(b) > INT32_MAX))
        return api_bad(e, ECS_ERR_INVAL, "'thinking_budget_tokens' must be an integer: -1 (no "
                       "budget), 0 (the reasoning ends at once) or the reasoning's tokens");
    if (b)
        r->think_budget = (int)json_integer_value(b);
    json_t *k = api_field(o, "chat_template_kwargs");
    if (!k)
        return ECS_OK;
    if (!json_is_object(k))
        return api_bad(e, ECS_ERR_INVAL, "'chat_template_kwargs' must be an object, not %s",
                       api_type_name(k));
    json_t *on = api_field(k, "enable_thinking");
    if (on && !json_is_boolean(on))
        return api_bad(e, ECS_ERR_INVAL, "'chat_template_kwargs'.enable_thinking must be a "
                       "boolean, not %s", api_type_name(on));
    r->think_off = json_is_false(on);
    return ECS_OK;
}

/* Anthropic: the thinking blocks' text, joined, and the content without
 * thinking / redacted_thinking blocks (*kept NULL: there were none). */
static ecs_err_t thinking_blocks(api_perr_t *e, json_t *content, size_t i, json_t **kept,
                                 char **reasoning)
{
    api_buf_t b = {0};
    bool any = false, given = false; /* any block; a thinking block's text */
    size_t k;
    json_t *blk;
    *kept = NULL;
    json_array_foreach(content, k, blk) {
        json_t *ty = json_is_object(blk) ? api_field(blk, "type") : NULL;
        const char *s = json_is_string(ty) ? json_string_value(ty) : "";
        if (!strcmp(s, "redacted_thinking")) { /* encrypted: nothing to show the model */
            any = true;
            continue;
        }
        if (strcmp(s, "thinking"))
            continue;
        json_t *t = api_field(blk, "thinking");
        if (!json_is_string(t)) {
            api_buf_free(&b);
            return api_bad(e, ECS_ERR_INVAL, "messages[%zu].content[%zu].thinking must be a "
                           "string", i, k);
        }
        if (given)
            api_buf_puts(&b, "\n");
        api_buf_add(&b, json_string_value(t), json_string_length(t));
        any = given = true;
    }
    if (!any)
        return ECS_OK;
    json_t *rest = json_array();
    json_array_foreach(content, k, blk) {
        json_t *ty = json_is_object(blk) ? api_field(blk, "type") : NULL;
        const char *s = json_is_string(ty) ? json_string_value(ty) : "";
        if (rest && strcmp(s, "thinking") && strcmp(s, "redacted_thinking") &&
            json_array_append(rest, blk))
            json_decref(rest), rest = NULL;
    }
    if (given)
        api_buf_add(&b, "", 1);
    if (!rest || b.failed) {
        json_decref(rest);
        api_buf_free(&b);
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    }
    *kept = rest;
    *reasoning = b.p; /* NULL with redacted blocks only: no reasoning given */
    return ECS_OK;
}

ecs_err_t api_think_message(api_perr_t *e, json_t *msg, size_t i, const api_req_t *r,
                            json_t **use, char **reasoning)
{
    json_t *role = api_field(msg, "role");
    *use = NULL;
    *reasoning = NULL;
    if (!json_is_string(role) || strcmp(json_string_value(role), "assistant")) {
        *use = json_incref(msg);
        return ECS_OK;
    }
    if (r->route != API_ROUTE_MESSAGES) {
        json_t *rc = api_field(msg, "reasoning_content");
        if (rc && !json_is_string(rc))
            return api_bad(e, ECS_ERR_INVAL, "messages[%zu].reasoning_content must be a string, "
                           "not %s", i, api_type_name(rc));
        if (rc && !(*reasoning = strndup(json_string_value(rc), json_string_length(rc))))
            return api_bad(e, ECS_ERR_NOMEM, "out of memory");
        *use = json_incref(msg);
        return ECS_OK;
    }
    json_t *content = api_field(msg, "content"), *kept = NULL;
    if (json_is_array(content) && thinking_blocks(e, content, i, &kept, reasoning))
        return e->code;
    if (!kept) {
        *use = json_incref(msg);
        return ECS_OK;
    }
    if (!(*use = json_copy(msg)) || json_object_set_new(*use, "content", kept)) {
        json_decref(*use);
        free(*reasoning);
        *use = NULL, *reasoning = NULL;
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    }
    return ECS_OK;
}

/* ------------------------------------------------------------ history */

static bool starts(const char *s, size_t n, const char *p)
{
    return strlen(p) <= n && !memcmp(s, p, strlen(p));
}

static bool ends(const char *s, size_t n, const char *p)
{
    return strlen(p) <= n && !memcmp(s + n - strlen(p), p, strlen(p));
}

/* The last occurrence of tag in s[0, n), or NULL. */
static const char *last_of(const char *s, size_t n, const char *tag)
{
    const char *found = NULL, *p = s;
    while ((p = memmem(p, n - (size_t)(p - s), tag, strlen(tag)))) {
        found = p;
        p += strlen(tag);
    }
    return found;
}

/* Qwen3's template (its Jinja, in C): reasoning = reasoning_content if
 * given, else if '</think>' in content: content.split('</think>')[0]
 * .rstrip('\n').split('<think>')[-1].lstrip('\n'), and content =
 * content.split('</think>')[-1].lstrip('\n'). After the last query, and
 * for the last message or one with reasoning: '<think>\n' +
 * reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n'); else
 * content. The calls follow ("\n" before them when content is left). */
static void render_turn(api_buf_t *b, const char *c, const api_msg_x_t *x, bool keep, bool last)
{
    const char *rs = x->reasoning ? x->reasoning : "", *calls = c + x->text_len;
    size_t rl = strlen(rs), cl = x->text_len;
    const char *close = x->reasoning ? NULL : memmem(c, cl, API_THINK_CLOSE, strlen(API_THINK_CLOSE));
    if (close) {
        const char *after = last_of(c, cl, API_THINK_CLOSE) + strlen(API_THINK_CLOSE);
        size_t re = (size_t)(close - c);
        while (re > 0 && c[re - 1] == '\n')
            re--;
        const char *open = last_of(c, re, API_THINK_OPEN);
        rs = open ? open + strlen(API_THINK_OPEN) : c;
        rl = (size_t)(c + re - rs);
        cl -= (size_t)(after - c);
        c = after;
        while (cl > 0 && *c == '\n')
            c++, cl--;
        while (rl > 0 && *rs == '\n')
            rs++, rl--;
    }
    if (keep && (last || rl > 0)) {
        while (rl > 0 && *rs == '\n')
            rs++, rl--;
        while (rl > 0 && rs[rl - 1] == '\n')
            rl--;
        api_buf_puts(b, API_THINK_OPEN "\n");
        api_buf_add(b, rs, rl);
        api_buf_puts(b, "\n" API_THINK_CLOSE "\n\n");
        const char *t = c;
        while (t < c + cl && *t == '\n')
            t++;
        api_buf_add(b, t, cl - (size_t)(t - c));
    } else {
        api_buf_add(b, c, cl);
    }
    if (*calls) { /* tools.c wrote "\n" before them when the raw content was not empty */
        calls += x->text_len > 0 && *calls == '\n';
        api_buf_puts(b, cl > 0 ? "\n" : "");
        api_buf_puts(b, calls);
    }
    api_buf_add(b, "", 1);
}

ecs_err_t api_think_history(api_perr_t *e, api_req_t *r)
{
    /* ns.last_query_index: the last user turn that is not tool results */
    int last_query = r->n_msgs - 1;
    for (int i = r->n_msgs - 1; i >= 0; i--) {
        const char *c = r->msgs[i].content;
        size_t n = strlen(c);
        if (!strcmp(r->msgs[i].role, "user") &&
            !(starts(c, n, "<tool_response>") && ends(c, n, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < r->n_msgs; i++) {
        if (strcmp(r->msgs[i].role, "assistant"))
            continue;
        api_buf_t b = {0};
        render_turn(&b, r->msgs[i].content, &r->mx[i], i > last_query, i == r->n_msgs - 1);
        if (b.failed) {
            api_buf_free(&b);
            return api_bad(e, ECS_ERR_NOMEM, "out of memory");
        }
        r->mx[i].think = b.p;
    }
    return ECS_OK;
}

bool api_think_splits(const api_req_t *r, bool thinks)
{
    return thinks && r->route != API_ROUTE_COMPLETION && !r->think_off && !r->json;
}

ecs_err_t api_think_view(const api_req_t *r, bool thinks, bool open, tok_chat_msg_t **msgs,
                         const char **prefill)
{
    const bool forced = r->tool_mode == API_TOOLS_FORCED;
    *prefill = !forced ? NULL : r->call_open ? r->call_open : API_TOOL_CALL_OPEN;
    if (thinks && open) /* the template's own assistant prompt */
        *prefill = API_THINK_OPEN "\n";
    /* thinking off, or a grammar from the first token: an empty think
     * block, as the template writes it for enable_thinking false */
    if (thinks && (r->think_off || r->json))
        *prefill = forced ? THINK_EMPTY API_TOOL_CALL_OPEN : THINK_EMPTY;
    if (!(*msgs = malloc(((size_t)r->n_msgs + 1) * sizeof **msgs)))
        return ecs_error(ECS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < r->n_msgs; i++) {
        (*msgs)[i] = r->msgs[i];
        if (thinks && r->mx[i].think)
            (*msgs)[i].content = r->mx[i].think;
    }
    return ECS_OK;
}

/* ------------------------------------------------------------- output */

static size_t skip_nl(const char *s, size_t i, size_t n)
{
    while (i < n && s[i] == '\n')
        i++;
    return i;
}

void api_think_split(const char *t, size_t n, bool open, bool partial, api_think_span_t *s)
{
    const size_t ol = strlen(API_THINK_OPEN), cl = strlen(API_THINK_CLOSE);
    size_t i = skip_nl(t, 0, n);
    s->opened = true;
    if (n - i >= ol && !memcmp(t + i, API_THINK_OPEN, ol)) {
        i = skip_nl(t, i + ol, n);
    } else if (partial && n - i < ol && !memcmp(t + i, API_THINK_OPEN, n - i)) { /* it may be arriving */
        i = n;
        s->opened = open;
    } else if (!open) { /* no think block: all of it is the answer */
        *s = (api_think_span_t){0, 0, 0, true, false};
        return;
    }
    s->r_off = i;
    const char *p = memmem(t + i, n - i, API_THINK_CLOSE, cl);
    size_t end = p ? (size_t)(p - t) : n;
    if (!p && partial)
        end -= api_tag_tail(t + i, n - i, API_THINK_CLOSE);
    if (p || partial) /* the newlines before the tag are not reasoning */
        while (end > i && t[end - 1] == '\n')
            end--;
    s->r_end = end;
    s->closed = p != NULL;
    s->c_off = p ? skip_nl(t, (size_t)(p - t) + cl, n) : n;
}
