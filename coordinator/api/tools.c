/* tools.c - tool calls in the form Qwen's chat templates give them (the
 * "Hermes" form): the tools described as JSON lines inside <tools> in the
 * system turn, a call as <tool_call>{"name": ..., "arguments": ...}
 * </tool_call> at the end of an answer, results as <tool_response> blocks
 * in a user turn. The texts are Qwen3's template's, so a Qwen3 GGUF sees
 * what it was trained on; other templates have no place for tools (an
 * error naming the template). Both APIs' shapes: OpenAI (tools,
 * tool_choice, role "tool", tool_calls) and Anthropic (tools, tool_choice,
 * tool_use / tool_result blocks).
 *
 * A forced call (tool_choice naming a function, or required / any) starts
 * the answer with the call's tag and constrains the rest to {"name": that
 * function (or one of the tools), "arguments": its parameters' schema} through
 * JSON mode's recogniser (sampler.h), so the call always parses; its
 * parameters must lie in that recogniser's schema subset (else a 400
 * naming the keyword). With tool_choice auto the output is read after
 * generation: text, then one or more well-formed call blocks, is text plus
 * calls; anything else stays text. Streams hold back a call's tag and what
 * follows, and send the calls at the end. DeepSeek-V3's template takes its
 * own form (tools_v3.c); the request's parse (r->chat) picks it. */
#include <string.h>

#include "api_int.h"

#define MAX_TOOLS 128
#define CALL_OPEN "<tool_call>"
#define CALL_CLOSE "</tool_call>"

static const char TOOLS_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char TOOLS_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

/* OpenAI's rule for function names. */
bool api_tools_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] >= 'a' && s[i] <= 'z') && !(s[i] >= 'A' && s[i] <= 'Z') &&
            !(s[i] >= '0' && s[i] <= '9') && s[i] != '_' && s[i] != '-' && s[i] != '.')
            return false;
    return true;
}

/* Jinja's tojson as Hugging Face's templates use it (", " and ": ", keys
 * in the given order, UTF-8 as is). */
static char *tojson(const json_t *v)
{
    return json_dumps(v, JSON_ENCODE_ANY);
}

/* --------------------------------------------------------------- tools */

typedef struct {
    json_t *defs;       /* each tool in OpenAI's shape, as the system turn shows it */
    const char *forced; /* the tool a forced call must call; NULL: any of them */
} tools_t;

/* tools[i] into t->defs (OpenAI: as given; Anthropic: its name,
 * description and input_schema in OpenAI's shape). */
static ecs_err_t tool_def(api_perr_t *e, const api_req_t *r, json_t *tool, size_t i, tools_t *t)
{
    const bool an = r->route == API_ROUTE_MESSAGES;
    if (!json_is_object(tool))
        return api_bad(e, ECS_ERR_INVAL, "'tools'[%zu] must be an object, not %s", i,
                       api_type_name(tool));
    json_t *fn = tool, *ty = api_field(tool, "type");
    if (!an) {
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))
            return api_bad(e, ECS_ERR_INVAL, "'tools'[%zu].type must be \"function\"", i);
        if (!json_is_object(fn = api_field(tool, "function")))
            return api_bad(e, ECS_ERR_INVAL, "'tools'[%zu].function must be an object", i);
    } else if (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "custom"))) {
        return api_bad(e, ECS_ERR_UNSUPPORTED, "'tools'[%zu]: type '%.40s' is not supported "
                       "(server tools): only client tools, with an input_schema", i,
                       json_is_string(ty) ? json_string_value(ty) : "?");
    }
    json_t *name = api_field(fn, "name"), *desc = api_field(fn, "description");
    json_t *params = api_field(fn, an ? "input_schema" : "parameters");
    const char *pre = an ? "" : ".function";
    if (!json_is_string(name) || !api_tools_name_ok(json_string_value(name)))
        return api_bad(e, ECS_ERR_INVAL, "'tools'[%zu]%s.name must be a string of 1 to 64 "
                       "letters, digits, '_', '-' or '.'", i, pre);
    if (desc && !json_is_string(desc))
        return api_bad(e, ECS_ERR_INVAL, "'tools'[%zu]%s.description must be a string", i, pre);
    if (an ? !json_is_object(params) : params && !json_is_object(params))
        return api_bad(e, ECS_ERR_INVAL, "'tools'[%zu]%s.%s %s", i, pre,
                       an ? "input_schema" : "parameters",
                       an ? "is required: a JSON schema object" : "must be a JSON schema object");
    for (size_t k = 0; k < json_array_size(t->defs); k++) {
        json_t *f = json_object_get(json_array_get(t->defs, k), "function");
        if (!strcmp(json_string_value(json_object_get(f, "name")), json_string_value(name)))
            return api_bad(e, ECS_ERR_INVAL, "'tools': the name '%s' is given twice",
                           json_string_value(name));
    }
    json_t *def = an ? json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name)
                     : json_incref(tool);
    if (def && an) {
        json_t *f = json_object_get(def, "function");
        if (desc)
            json_object_set(f, "description", desc);
        json_object_set(f, "parameters", params);
    }
    if (!def || json_array_append_new(t->defs, def))
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    return ECS_OK;
}

/* The function a tool_choice forces, by name (it must be a tool). */
static ecs_err_t force(api_perr_t *e, tools_t *t, const char *name, api_tool_mode_t *mode)
{
    for (size_t k = 0; k < json_array_size(t->defs); k++) {
        json_t *f = json_object_get(json_array_get(t->defs, k), "function");
        if (!strcmp(json_string_value(json_object_get(f, "name")), name)) {
            t->forced = json_string_value(json_object_get(f, "name"));
            *mode = API_TOOLS_FORCED;
            return ECS_OK;
        }
    }
    return api_bad(e, ECS_ERR_INVAL, "'tool_choice': '%.64s' is not one of the tools", name);
}

/* OpenAI: "none" | "auto" | "required" | {"type": "function", "function":
 * {"name"}}; Anthropic: {"type": "auto" | "any" | "tool" | "none", "name"}. */
static ecs_err_t choice(api_perr_t *e, api_req_t *r, json_t *c, tools_t *t,
                        api_tool_mode_t *mode)
{
    const bool an = r->route == API_ROUTE_MESSAGES;
    *mode = API_TOOLS_AUTO;
    if (!c)
        return ECS_OK;
    json_t *ty = json_is_object(c) ? api_field(c, "type") : an ? NULL : c;
    const char *s = json_is_string(ty) ? json_string_value(ty) : NULL;
    const char *any = an ? "any" : "required";
    if (s && !strcmp(s, "none")) {
        *mode = API_TOOLS_OFF;
        return ECS_OK;
    }
    if (an && json_is_object(c)) {
        json_t *one = api_field(c, "disable_parallel_tool_use");
        if (one && !json_is_boolean(one))
            return api_bad(e, ECS_ERR_INVAL, "'tool_choice'.disable_parallel_tool_use must be a "
                           "boolean");
        r->one_call = json_is_true(one);
    }
    if (s && !strcmp(s, "auto"))
        return ECS_OK;
    if (s && !strcmp(s, any)) { /* a call to one of the tools, the model's pick */
        *mode = API_TOOLS_FORCED;
        return ECS_OK;
    }
    json_t *name = !s ? NULL : an && !strcmp(s, "tool") ? api_field(c, "name")
                   : !an && json_is_object(c) && !strcmp(s, "function")
                       ? api_field(api_field(c, "function"), "name") : NULL;
    if (json_is_string(name))
        return force(e, t, json_string_value(name), mode);
    return api_bad(e, ECS_ERR_INVAL, an ? "'tool_choice' must be {\"type\": \"auto\" | \"any\" | "
                   "\"none\"} or {\"type\": \"tool\", \"name\": ...}"
                   : "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                   "\"function\", \"function\": {\"name\": ...}}");
}

/* A $ref inside tool k's parameters, renamed for the call schema's root:
 * "#" is the parameters ("#/$defs/tK"), "#/$defs/X" its own definition X
 * ("#/$defs/tK.X"); anything else is left for the compiler to refuse. */
static void rename_refs(json_t *v, size_t k)
{
    const char *key;
    json_t *x;
    size_t i;
    if (json_is_array(v))
        json_array_foreach(v, i, x) rename_refs(x, k);
    if (!json_is_object(v))
        return;
    json_object_foreach(v, key, x) {
        const char *ref = json_is_string(x) && !strcmp(key, "$ref") ? json_string_value(x) : NULL;
        const char *def = !ref ? NULL : !strncmp(ref, "#/$defs/", 8) ? ref + 8
                          : !strncmp(ref, "#/definitions/", 14) ? ref + 14 : NULL;
        char to[160];
        if (ref && !strcmp(ref, "#"))
            snprintf(to, sizeof to, "#/$defs/t%zu", k);
        else if (def)
            snprintf(to, sizeof to, "#/$defs/t%zu.%.100s", k, def);
        if (ref && (def || !strcmp(ref, "#")))
            json_object_set_new(v, key, json_string(to));
        else
            rename_refs(x, k);
    }
}

/* Tool k's parameters into the root's $defs (see rename_refs). */
static bool hoist_params(json_t *defs, json_t *params, size_t k)
{
    json_t *p = params ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
    if (!p)
        return false;
    rename_refs(p, k);
    bool ok = true;
    for (int d = 0; d < 2; d++) {
        const char *key = d ? "definitions" : "$defs";
        const char *name;
        json_t *x;
        json_t *own = json_object_get(p, key);
        json_object_foreach(own, name, x) {
            char to[160];
            snprintf(to, sizeof to, "t%zu.%.100s", k, name);
            ok = ok && !json_object_set(defs, to, x);
        }
        json_object_del(p, key);
    }
    char self[32];
    snprintf(self, sizeof self, "t%zu", k);
    return !json_object_set_new(defs, self, p) && ok;
}

/* The forced call's schema text: {"name": const, "arguments": the
 * parameters} for the tool named only (or every tool when only is NULL:
 * required / any, an anyOf told apart by the name, json_schema.c's
 * discriminated union). Each tool's parameters live in the root's $defs
 * so that their $refs keep their meaning. */
static char *call_schema_text(const tools_t *t, const char *only)
{
    json_t *defs = json_object(), *alts = json_array(), *sch = NULL;
    for (size_t k = 0; defs && alts && k < json_array_size(t->defs); k++) {
        json_t *f = json_object_get(json_array_get(t->defs, k), "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        if (only && strcmp(name, only))
            continue;
        char ref[32];
        snprintf(ref, sizeof ref, "#/$defs/t%zu", k);
        if (!hoist_params(defs, json_object_get(f, "parameters"), k) ||
            json_array_append_new(alts, json_pack("{s:s,s:{s:{s:s},s:{s:s}},s:[s,s],s:b}", "type",
                                                  "object", "properties", "name", "const", name,
                                                  "arguments", "$ref", ref, "required", "name",
                                                  "arguments", "additionalProperties", 0)))
            goto done;
    }
    sch = json_array_size(alts) == 1 ? json_incref(json_array_get(alts, 0))
                                     : json_pack("{s:O}", "anyOf", alts);
    if (sch && json_object_set(sch, "$defs", defs))
        json_decref(sch), sch = NULL;
done:;
    char *text = sch ? json_dumps(sch, JSON_COMPACT) : NULL;
    json_decref(sch);
    json_decref(alts);
    json_decref(defs);
    return text;
}

static ecs_err_t compile_call(api_perr_t *e, api_req_t *r, const tools_t *t, const char *only)
{
    char *text = call_schema_text(t, only);
    if (!text)
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    ecs_err_t rc = sampler_schema_new(text, strlen(text), &r->schema);
    free(text);
    return rc;
}

static bool v3(const api_req_t *r)
{
    return r->chat == TOK_CHAT_DEEPSEEK3;
}

/* DeepSeek-V3 (tools_v3.c): the answer starts with the call's markup up to
 * the arguments' fence; JSON mode constrains the arguments alone. */
static ecs_err_t forced_v3(api_perr_t *e, api_req_t *r, const tools_t *t)
{
    json_t *f = NULL;
    for (size_t k = 0; k < json_array_size(t->defs); k++) {
        json_t *fk = json_object_get(json_array_get(t->defs, k), "function");
        if (t->forced ? !strcmp(json_string_value(json_object_get(fk, "name")), t->forced)
                      : json_array_size(t->defs) == 1)
            f = fk;
    }
    if (!f)
        return api_bad(e, ECS_ERR_UNSUPPORTED, "'tool_choice': a call to any of %zu tools cannot "
                       "be forced with DeepSeek-V3's chat template (a call names its function "
                       "before the arguments' JSON): name the function",
                       json_array_size(t->defs));
    const char *name = json_string_value(json_object_get(f, "name"));
    json_t *params = json_object_get(f, "parameters");
    char *text = params ? json_dumps(params, JSON_COMPACT) : strdup("{\"type\":\"object\"}");
    ecs_err_t rc = text ? sampler_schema_new(text, strlen(text), &r->schema) : ECS_ERR_NOMEM;
    free(text);
    if (rc)
        return api_bad(e, rc == ECS_ERR_NOMEM ? rc : ECS_ERR_UNSUPPORTED, "'tool_choice': the "
                       "parameters of '%s' cannot constrain a forced call: %s", name,
                       rc == ECS_ERR_NOMEM ? "out of memory" : ecs_errmsg());
    if (!(r->call_name = strdup(name)) || !(r->call_open = api_v3_forced_open(name)))
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    r->json = true;
    return ECS_OK;
}

/* The forced call's schema, compiled into r (JSON mode's recogniser). */
static ecs_err_t forced_schema(api_perr_t *e, api_req_t *r, const tools_t *t)
{
    if (r->json)
        return api_bad(e, ECS_ERR_INVAL, "'response_format' cannot be combined with a forced "
                       "tool call (the call's arguments follow the tool's schema)");
    if (v3(r))
        return forced_v3(e, r, t);
    ecs_err_t rc = compile_call(e, r, t, t->forced);
    const char *bad = t->forced;
    for (size_t k = 0; rc != ECS_OK && rc != ECS_ERR_NOMEM && !bad &&
                       k < json_array_size(t->defs); k++) {
        /* which tool's parameters are out of the subset, to name it */
        json_t *f = json_object_get(json_array_get(t->defs, k), "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ecs_errmsg());
        sampler_schema_t *one = r->schema;
        if (compile_call(e, r, t, name) != ECS_OK)
            bad = name;
        sampler_schema_free(r->schema);
        r->schema = one;
        if (!bad)
            ecs_error(rc, "%s", msg);
    }
    if (rc != ECS_OK && bad)
        return api_bad(e, rc == ECS_ERR_NOMEM ? rc : ECS_ERR_UNSUPPORTED,
                       "'tool_choice': the parameters of '%s' cannot constrain a forced call: %s",
                       bad, ecs_errmsg());
    if (rc != ECS_OK)
        return api_bad(e, rc == ECS_ERR_NOMEM ? rc : ECS_ERR_UNSUPPORTED,
                       "'tool_choice': a call to one of %zu tools cannot be constrained: %s",
                       json_array_size(t->defs), ecs_errmsg());
    r->json = true;
    return ECS_OK;
}

static ecs_err_t tools_text(api_perr_t *e, api_req_t *r, const tools_t *t)
{
    if (v3(r)) {
        if (!(r->tools_text = api_v3_tools_text(t->defs)))
            return api_bad(e, ECS_ERR_NOMEM, "out of memory");
        return ECS_OK;
    }
    api_buf_t b = {0};
    api_buf_puts(&b, TOOLS_HEAD);
    for (size_t k = 0; k < json_array_size(t->defs); k++) {
        char *s = tojson(json_array_get(t->defs, k));
        api_buf_puts(&b, "\n");
        if (!s)
            b.failed = true;
        else
            api_buf_puts(&b, s);
        free(s);
    }
    api_buf_puts(&b, TOOLS_TAIL);
    api_buf_add(&b, "", 1);
    if (b.failed) {
        api_buf_free(&b);
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    }
    r->tools_text = b.p;
    return ECS_OK;
}

ecs_err_t api_tools_get(api_perr_t *e, json_t *o, api_req_t *r)
{
    json_t *tools = api_field(o, "tools"), *c = api_field(o, "tool_choice");
    if (tools && json_is_array(tools) && json_array_size(tools) == 0)
        tools = NULL;
    if (r->route == API_ROUTE_COMPLETION) {
        if (tools || c)
            return api_bad(e, ECS_ERR_INVAL, "'%s' is for chat requests (/v1/chat/completions)",
                           tools ? "tools" : "tool_choice");
        return ECS_OK;
    }
    if (!tools) {
        json_t *ty = c && json_is_object(c) ? api_field(c, "type") : c;
        if (c && !(json_is_string(ty) && (!strcmp(json_string_value(ty), "none") ||
                                           !strcmp(json_string_value(ty), "auto"))))
            return api_bad(e, ECS_ERR_INVAL, "'tool_choice' needs 'tools'");
        return ECS_OK;
    }
    if (!json_is_array(tools))
        return api_bad(e, ECS_ERR_INVAL, "'tools' must be an array, not %s", api_type_name(tools));
    if (json_array_size(tools) > MAX_TOOLS)
        return api_bad(e, ECS_ERR_INVAL, "'tools' has %zu entries, at most %d are allowed",
                       json_array_size(tools), MAX_TOOLS);
    tools_t t = {json_array(), NULL};
    if (!t.defs)
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    ecs_err_t rc = ECS_OK;
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) if ((rc = tool_def(e, r, tool, i, &t)))
        break;
    json_t *par = api_field(o, "parallel_tool_calls");
    if (par && r->route != API_ROUTE_MESSAGES && !json_is_boolean(par))
        rc = api_bad(e, ECS_ERR_INVAL, "'parallel_tool_calls' must be a boolean, not %s",
                     api_type_name(par));
    r->one_call = json_is_false(par);
    if (!rc)
        rc = choice(e, r, c, &t, &r->tool_mode);
    if (!rc && r->tool_mode == API_TOOLS_FORCED)
        rc = forced_schema(e, r, &t);
    if (!rc && r->tool_mode != API_TOOLS_OFF) {
        r->tool_parts = true;
        rc = tools_text(e, r, &t);
    }
    json_decref(t.defs);
    return rc;
}

ecs_err_t api_tools_system(api_perr_t *e, api_req_t *r)
{
    if (!r->tools_text)
        return ECS_OK;
    r->sys_own = strlen(r->tools_text); /* it ends the system turn, either way */
    tok_chat_msg_t *m = r->msgs;
    if (r->n_msgs > 0 && !strcmp(m[0].role, "system")) {
        api_buf_t b = {0};
        api_buf_puts(&b, m[0].content);
        api_buf_puts(&b, "\n\n");
        api_buf_puts(&b, r->tools_text);
        api_buf_add(&b, "", 1);
        if (b.failed) {
            api_buf_free(&b);
            return api_bad(e, ECS_ERR_NOMEM, "out of memory");
        }
        free((char *)m[0].content);
        m[0].content = b.p;
        return ECS_OK;
    }
    char *text = strdup(r->tools_text);
    if (api_push_msg(e, r, "system", text))
        return e->code;
    m = r->msgs; /* the push may have moved it */
    tok_chat_msg_t sys = m[r->n_msgs - 1];
    memmove(m + 1, m, (size_t)(r->n_msgs - 1) * sizeof *m);
    m[0] = sys;
    api_msg_x_t x = r->mx[r->n_msgs - 1];
    memmove(r->mx + 1, r->mx, (size_t)(r->n_msgs - 1) * sizeof *r->mx);
    r->mx[0] = x;
    return ECS_OK;
}

/* ------------------------------------------------------- past messages */

/* One call as the template renders it, after a separator if not first. */
static void put_call(api_buf_t *b, bool sep, const char *name, json_t *args)
{
    if (sep)
        api_buf_puts(b, "\n");
    api_buf_printf(b, CALL_OPEN "\n{\"name\": \"%s\", \"arguments\": ", name);
    if (json_is_string(args)) {
        api_buf_add(b, json_string_value(args), json_string_length(args));
    } else if (!args) {
        api_buf_puts(b, "{}");
    } else {
        char *s = tojson(args);
        if (!s)
            b->failed = true;
        else
            api_buf_puts(b, s);
        free(s);
    }
    api_buf_puts(b, "}\n" CALL_CLOSE);
}

/* A tool's result joins the turn of results just before it, or opens one. */
static ecs_err_t put_result(api_perr_t *e, api_req_t *r, char *text)
{
    r->tool_parts = true;
    if (v3(r)) /* a message of its own (tok_chat.c) */
        return api_push_msg(e, r, "tool", text ? text : strdup(""));
    api_buf_t b = {0};
    const bool join = r->tool_turn_end > 0 && r->tool_turn_end == r->n_msgs;
    if (join) {
        api_buf_puts(&b, r->msgs[r->n_msgs - 1].content);
        api_buf_puts(&b, "\n");
    }
    api_buf_puts(&b, "<tool_response>\n");
    api_buf_puts(&b, text ? text : "");
    api_buf_puts(&b, "\n</tool_response>");
    api_buf_add(&b, "", 1);
    free(text);
    if (b.failed) {
        api_buf_free(&b);
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    }
    r->tool_parts = true;
    if (join) {
        free((char *)r->msgs[r->n_msgs - 1].content);
        r->msgs[r->n_msgs - 1].content = b.p;
    } else if (api_push_msg(e, r, "user", b.p)) {
        return e->code;
    }
    r->tool_turn_end = r->n_msgs;
    return ECS_OK;
}

/* DeepSeek-V3: the assistant's text (taken), then each call a message of
 * its own; calls: [{"function": {"name", "arguments"}}] (OpenAI's shape). */
static ecs_err_t v3_calls(api_perr_t *e, api_req_t *r, char *text, json_t *calls)
{
    r->tool_parts = true;
    if (api_push_msg(e, r, "assistant", text))
        return e->code;
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
        json_t *f = api_field(c, "function");
        if (api_push_msg(e, r, "tool_call", api_v3_call_text(json_string_value(api_field(f, "name")),
                                                             api_field(f, "arguments"))))
            return e->code;
    }
    return ECS_OK;
}

/* OpenAI: an assistant message's text and tool_calls. */
static ecs_err_t openai_calls(api_perr_t *e, json_t *msg, json_t *calls, size_t i, api_req_t *r)
{
    char *text = NULL;
    if (api_content_text(e, api_field(msg, "content"), i, &text))
        return e->code;
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
        json_t *f = json_is_object(c) ? api_field(c, "function") : NULL;
        json_t *name = f ? api_field(f, "name") : NULL;
        if (!json_is_string(name) || !api_tools_name_ok(json_string_value(name))) {
            free(text);
            return api_bad(e, ECS_ERR_INVAL, "messages[%zu].tool_calls[%zu].function.name must "
                           "be a function's name", i, k);
        }
    }
    if (v3(r))
        return v3_calls(e, r, text, calls);
    api_buf_t b = {0};
    api_buf_puts(&b, text);
    const bool had_text = text[0] != '\0';
    const size_t text_len = b.len;
    free(text);
    json_array_foreach(calls, k, c) {
        json_t *f = api_field(c, "function");
        put_call(&b, k > 0 || had_text, json_string_value(api_field(f, "name")),
                 api_field(f, "arguments"));
    }
    api_buf_add(&b, "", 1);
    if (b.failed) {
        api_buf_free(&b);
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    }
    r->tool_parts = true;
    if (api_push_msg(e, r, "assistant", b.p))
        return e->code;
    r->mx[r->n_msgs - 1].text_len = text_len; /* the calls follow (reasoning.c) */
    return ECS_OK;
}

/* Anthropic: a message whose content holds tool_use (assistant) or
 * tool_result (user) blocks, with its text blocks. */
static ecs_err_t anthropic_blocks(api_perr_t *e, json_t *content, const char *role, size_t i,
                                  api_req_t *r)
{
    const bool asst = !strcmp(role, "assistant");
    api_buf_t b = {0};
    size_t k, calls_at = SIZE_MAX;
    json_t *blk, *later = v3(r) ? json_array() : NULL; /* V3: calls after the text */
    int n = 0;
    if (v3(r) && !later)
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    json_array_foreach(content, k, blk) {
        json_t *ty = json_is_object(blk) ? api_field(blk, "type") : NULL;
        const char *s = json_is_string(ty) ? json_string_value(ty) : "";
        if (!strcmp(s, "text") && json_is_string(api_field(blk, "text"))) {
            api_buf_puts(&b, json_string_value(api_field(blk, "text")));
        } else if (asst && !strcmp(s, "tool_use")) {
            json_t *name = api_field(blk, "name");
            if (!json_is_string(name) || !api_tools_name_ok(json_string_value(name))) {
                api_buf_free(&b);
                json_decref(later);
                return api_bad(e, ECS_ERR_INVAL, "messages[%zu].content[%zu].name must be a "
                               "tool's name", i, k);
            }
            calls_at = calls_at == SIZE_MAX ? b.len : calls_at;
            if (!later)
                put_call(&b, b.len > 0, json_string_value(name), api_field(blk, "input"));
            else if (json_array_append_new(later, json_pack("{s:{s:O,s:O*}}", "function", "name",
                                                            name, "arguments",
                                                            api_field(blk, "input"))))
                b.failed = true;
        } else if (!asst && !strcmp(s, "tool_result")) {
            char *text = NULL;
            if (api_content_text(e, api_field(blk, "content"), i, &text)) {
                api_buf_free(&b);
                json_decref(later);
                return e->code;
            }
            ecs_err_t rc = put_result(e, r, text);
            if (rc) {
                api_buf_free(&b);
                json_decref(later);
                return rc;
            }
            n++;
        } else {
            api_buf_free(&b);
            json_decref(later);
            return api_bad(e, ECS_ERR_UNSUPPORTED, "messages[%zu].content[%zu]: a '%.40s' block "
                           "is not supported here", i, k, s);
        }
    }
    api_buf_add(&b, "", 1);
    if (b.failed) {
        api_buf_free(&b);
        json_decref(later);
        return api_bad(e, ECS_ERR_NOMEM, "out of memory");
    }
    r->tool_parts = true;
    if (b.len == 1 && n > 0) { /* only results */
        api_buf_free(&b);
        json_decref(later);
        return ECS_OK;
    }
    if (later && calls_at != SIZE_MAX) {
        ecs_err_t rc = v3_calls(e, r, b.p, later);
        json_decref(later);
        return rc;
    }
    json_decref(later);
    r->tool_turn_end = 0; /* the user's words, a turn after the results */
    if (api_push_msg(e, r, role, b.p))
        return e->code;
    if (calls_at != SIZE_MAX) /* where the calls begin (reasoning.c) */
        r->mx[r->n_msgs - 1].text_len = calls_at;
    return ECS_OK;
}

static bool has_tool_block(json_t *content)
{
    size_t k;
    json_t *blk;
    json_array_foreach(content, k, blk) {
        json_t *ty = json_is_object(blk) ? api_field(blk, "type") : NULL;
        if (json_is_string(ty) && (!strcmp(json_string_value(ty), "tool_use") ||
                                   !strcmp(json_string_value(ty), "tool_result")))
            return true;
    }
    return false;
}

ecs_err_t api_tools_message(api_perr_t *e, json_t *msg, size_t i, api_req_t *r, bool *done)
{
    json_t *role = api_field(msg, "role");
    const char *ro = json_is_string(role) ? json_string_value(role) : "";
    *done = false;
    if (r->route == API_ROUTE_MESSAGES) {
        json_t *c = api_field(msg, "content");
        if (!json_is_array(c) || !has_tool_block(c) ||
            (strcmp(ro, "user") && strcmp(ro, "assistant"))) {
            r->tool_turn_end = 0;
            return ECS_OK;
        }
        *done = true;
        return anthropic_blocks(e, c, ro, i, r);
    }
    if (!strcmp(ro, "tool")) {
        char *text = NULL;
        *done = true;
        if (api_content_text(e, api_field(msg, "content"), i, &text))
            return e->code;
        return put_result(e, r, text);
    }
    json_t *calls = api_field(msg, "tool_calls");
    r->tool_turn_end = 0;
    if (!calls || (json_is_array(calls) && json_array_size(calls) == 0))
        return ECS_OK;
    *done = true;
    if (strcmp(ro, "assistant"))
        return api_bad(e, ECS_ERR_INVAL, "messages[%zu]: only assistant messages have tool_calls", i);
    if (!json_is_array(calls))
        return api_bad(e, ECS_ERR_INVAL, "messages[%zu].tool_calls must be an array, not %s", i,
                       api_type_name(calls));
    return openai_calls(e, msg, calls, i, r);
}

/* ------------------------------------------------------------- output */

size_t api_tools_text_len(const api_req_t *r, const char *text, size_t len)
{
    if (r->tool_mode == API_TOOLS_OFF)
        return len;
    if (r->tool_mode == API_TOOLS_FORCED)
        return 0;
    const char *tag = v3(r) ? api_v3_calls_begin : CALL_OPEN;
    const char *p = memmem(text, len, tag, strlen(tag));
    if (p)
        return (size_t)(p - text);
    /* a tag may be arriving: hold back an end that begins one */
    return len - api_tag_tail(text, len, tag);
}

bool api_tools_render_special(const api_req_t *r)
{
    return v3(r) && r->tool_mode == API_TOOLS_AUTO;
}

size_t api_tag_tail(const char *s, size_t n, const char *tag)
{
    for (size_t k = strlen(tag) - 1; k > 0; k--)
        if (k <= n && !memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t'))
        i++;
    return i;
}

json_t *api_tools_call_json(const char *id, size_t k, const char *name, const char *args)
{
    char cid[96];
    snprintf(cid, sizeof cid, "call_%s_%zu", id, k);
    return json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", cid, "type", "function", "function", "name",
                     name, "arguments", args);
}

/* One call object at s[*i..n): {"name": string, "arguments": any}. */
static json_t *read_call(const char *s, size_t *i, size_t n, const char *id, size_t k)
{
    json_error_t je;
    json_t *o = json_loadb(s + *i, n - *i, JSON_DISABLE_EOF_CHECK, &je);
    if (!o)
        return NULL;
    *i += (size_t)je.position;
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    char *a = NULL;
    if (json_is_object(o) && json_is_string(name))
        a = json_is_string(args) ? strdup(json_string_value(args))
            : args              ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY)
                                : strdup("{}");
    json_t *call = a ? api_tools_call_json(id, k, json_string_value(name), a) : NULL;
    free(a);
    json_decref(o);
    return call;
}

json_t *api_tools_calls(const api_req_t *r, const char *id, const char *text, size_t len,
                        size_t *text_len)
{
    *text_len = len;
    if (r->tool_mode == API_TOOLS_OFF)
        return NULL;
    if (v3(r))
        return api_v3_calls(r, id, text, len, text_len);
    const bool forced = r->tool_mode == API_TOOLS_FORCED;
    const char *p = forced ? text : memmem(text, len, CALL_OPEN, strlen(CALL_OPEN));
    if (!p)
        return NULL;
    json_t *calls = json_array();
    size_t i = (size_t)(p - text);
    for (size_t k = 0; calls; k++) {
        if (!forced) {
            i += strlen(CALL_OPEN);
        }
        i = skip_ws(text, i, len);
        json_t *c = read_call(text, &i, len, id, k);
        if (!c || json_array_append_new(calls, c))
            goto fail;
        i = skip_ws(text, i, len);
        if (!forced) {
            if (len - i < strlen(CALL_CLOSE) || memcmp(text + i, CALL_CLOSE, strlen(CALL_CLOSE)))
                goto fail;
            i = skip_ws(text, i + strlen(CALL_CLOSE), len);
        }
        if (i == len || r->one_call)
            break;
        if (forced || len - i < strlen(CALL_OPEN) || memcmp(text + i, CALL_OPEN, strlen(CALL_OPEN)))
            goto fail;
    }
    if (!calls)
        return NULL;
    size_t t = (size_t)(p - text);
    while (t > 0 && (text[t - 1] == ' ' || text[t - 1] == '\n' || text[t - 1] == '\r' ||
                     text[t - 1] == '\t'))
        t--;
    *text_len = t;
    return calls;
fail:
    json_decref(calls);
    return NULL;
}
