/* tok_chat.c - chat templates: recognising a model's Jinja chat_template the
 * way llama.cpp does (by tell-tale substrings) and rendering conversations as
 * llama.cpp's built-in renderer does for DeepSeek-V2, DeepSeek-V3 and ChatML.
 * No Jinja interpreter: a template we cannot recognise is an error. */
#include "tokenizer.h"

#include <string.h>

#include "tok_impl.h"

const char *const tok_deepseek2_template =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

#define DS_EOS "<｜end▁of▁sentence｜>"
#define DS_USER "<｜User｜>"
#define DS_ASSISTANT "<｜Assistant｜>"

static bool contains(const char *s, size_t n, const char *needle)
{
    size_t m = strlen(needle);
    return m <= n && memmem(s, n, needle, m) != NULL;
}

static bool equals(const char *s, size_t n, const char *name)
{
    return strlen(name) == n && memcmp(s, name, n) == 0;
}

const char *tok_chat_kind_name(tok_chat_kind_t k)
{
    switch (k) {
    case TOK_CHAT_NONE: return "none";
    case TOK_CHAT_UNKNOWN: return "unknown";
    case TOK_CHAT_DEEPSEEK2: return "deepseek2";
    case TOK_CHAT_DEEPSEEK3: return "deepseek3";
    case TOK_CHAT_CHATML: return "chatml";
    }
    return "unknown";
}

tok_chat_kind_t tok_chat_by_name(const char *name)
{
    for (tok_chat_kind_t k = TOK_CHAT_DEEPSEEK2; name && k <= TOK_CHAT_CHATML; k++)
        if (!strcmp(name, tok_chat_kind_name(k)))
            return k;
    return TOK_CHAT_UNKNOWN;
}

tok_chat_kind_t tok_chat_detect(const char *tmpl, size_t len)
{
    if (!tmpl || len == 0)
        return TOK_CHAT_NONE;
    for (tok_chat_kind_t k = TOK_CHAT_DEEPSEEK2; k <= TOK_CHAT_CHATML; k++)
        if (equals(tmpl, len, tok_chat_kind_name(k)))
            return k;
    /* the same order and tests as llama.cpp's llm_chat_detect_template */
    if (contains(tmpl, len, "<|im_start|>"))
        return contains(tmpl, len, "<|im_sep|>") || contains(tmpl, len, "<end_of_utterance>")
                   ? TOK_CHAT_UNKNOWN /* Phi-4 and SmolVLM, not ChatML */
                   : TOK_CHAT_CHATML;
    if (contains(tmpl, len, "'Assistant: ' + message['content'] + eos_token"))
        return TOK_CHAT_DEEPSEEK2;
    if (contains(tmpl, len, DS_ASSISTANT) && contains(tmpl, len, DS_USER) && contains(tmpl, len, DS_EOS))
        return TOK_CHAT_DEEPSEEK3;
    return TOK_CHAT_UNKNOWN;
}

bool tok_chat_detect_thinks(const char *tmpl, size_t len)
{
    return tmpl && contains(tmpl, len, "<think>");
}

bool tok_chat_detect_think_open(const char *tmpl, size_t len)
{
    /* the Jinja source's string literal, its newlines as \n escapes */
    return tmpl && contains(tmpl, len, "'<|im_start|>assistant\\n<think>\\n'");
}

/* Counts everything, writes what fits. */
typedef struct {
    char *out;
    size_t cap, n;
} cat_t;

static void put(cat_t *c, const char *s)
{
    size_t m = strlen(s);
    if (c->n < c->cap && m <= c->cap - c->n)
        memcpy(c->out + c->n, s, m);
    c->n = m > SIZE_MAX - c->n ? SIZE_MAX : c->n + m;
}

static ecs_err_t bad_role(tok_chat_kind_t kind, const char *role)
{
    return ecs_error(ECS_ERR_INVAL, "chat: role '%.40s' has no place in the %s template", role,
                     tok_chat_kind_name(kind));
}

/* DeepSeek-V3's tool markup (its template's, for past calls and results). */
#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALL_BEGIN "<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_CALLS_END "<｜tool▁calls▁end｜>"
#define DS_OUTPUTS_BEGIN "<｜tool▁outputs▁begin｜>"
#define DS_OUTPUT_BEGIN "<｜tool▁output▁begin｜>"
#define DS_OUTPUT_END "<｜tool▁output▁end｜>"
#define DS_OUTPUTS_END "<｜tool▁outputs▁end｜>"

static bool role_is(const tok_chat_msg_t *m, const char *role)
{
    return m && strcmp(m->role, role) == 0;
}

/* DeepSeek-V3's tool turns (tok_chat_msg_t): a run of "tool_call"
 * messages follows its assistant message inside one answer, a run of
 * "tool" results is one outputs block, and the model answers right after
 * it (no assistant tag: the template's add_generation_prompt is off after
 * tool results). Unlike the official template, which drops the calls'
 * closing after a single call and never resets its first-call flag, every
 * run of calls is closed, as the model writes them. */
static bool render_v3_tools(const tok_chat_msg_t *prev, const tok_chat_msg_t *m,
                            const tok_chat_msg_t *next, cat_t *c)
{
    if (role_is(m, "tool_call")) {
        if (role_is(prev, "tool_call")) {
            put(c, "\n");
        } else {
            if (!role_is(prev, "assistant") && !role_is(prev, "tool"))
                put(c, DS_ASSISTANT);
            put(c, DS_CALLS_BEGIN);
        }
        put(c, DS_CALL_BEGIN);
        put(c, m->content);
        put(c, DS_CALL_END);
        if (!role_is(next, "tool_call"))
            put(c, DS_CALLS_END DS_EOS);
        return true;
    }
    if (role_is(m, "tool")) {
        put(c, role_is(prev, "tool") ? "\n" : DS_OUTPUTS_BEGIN);
        put(c, DS_OUTPUT_BEGIN);
        put(c, m->content);
        put(c, DS_OUTPUT_END);
        if (!role_is(next, "tool"))
            put(c, DS_OUTPUTS_END);
        return true;
    }
    return false;
}

static ecs_err_t render_deepseek(tok_chat_kind_t kind, const tok_chat_msg_t *prev,
                                 const tok_chat_msg_t *m, const tok_chat_msg_t *next, cat_t *c)
{
    bool v3 = kind == TOK_CHAT_DEEPSEEK3;
    if (strcmp(m->role, "system") == 0) {
        put(c, m->content);
        put(c, "\n\n");
    } else if (strcmp(m->role, "user") == 0) {
        put(c, v3 ? DS_USER : "User: ");
        put(c, m->content);
        put(c, v3 ? "" : "\n\n");
    } else if (strcmp(m->role, "assistant") == 0) {
        if (!(v3 && role_is(prev, "tool"))) /* after results the answer follows at once */
            put(c, v3 ? DS_ASSISTANT : "Assistant: ");
        put(c, m->content);
        if (!(v3 && role_is(next, "tool_call"))) /* its calls end the answer */
            put(c, DS_EOS);
    } else if (!v3 || !render_v3_tools(prev, m, next, c)) {
        return bad_role(kind, m->role);
    }
    return ECS_OK;
}

static ecs_err_t render_chatml(const tok_chat_msg_t *m, cat_t *c)
{
    if (!m->role[0])
        return bad_role(TOK_CHAT_CHATML, m->role);
    put(c, "<|im_start|>");
    put(c, m->role);
    put(c, "\n");
    put(c, m->content);
    put(c, "<|im_end|>\n");
    return ECS_OK;
}

ecs_err_t tok_chat_apply(tok_chat_kind_t kind, const tok_chat_msg_t *msgs, int n,
                         bool add_assistant_prompt, char *out, size_t cap, size_t *len)
{
    cat_t c = { out, cap, 0 };
    *len = 0;
    if (kind != TOK_CHAT_DEEPSEEK2 && kind != TOK_CHAT_DEEPSEEK3 && kind != TOK_CHAT_CHATML)
        return ecs_error(ECS_ERR_INVAL, "chat: cannot render template kind '%s'", tok_chat_kind_name(kind));
    if (n < 0 || (n > 0 && !msgs) || (!out && cap))
        return ecs_error(ECS_ERR_INVAL, "chat: bad arguments");
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return ecs_error(ECS_ERR_INVAL, "chat: message %d has no role or content", i);
        const tok_chat_msg_t *prev = i > 0 ? &msgs[i - 1] : NULL;
        const tok_chat_msg_t *next = i + 1 < n ? &msgs[i + 1] : NULL;
        ecs_err_t err = kind == TOK_CHAT_CHATML ? render_chatml(&msgs[i], &c)
                                                : render_deepseek(kind, prev, &msgs[i], next, &c);
        if (err)
            return err;
    }
    const bool after_results = kind == TOK_CHAT_DEEPSEEK3 && n > 0 && role_is(&msgs[n - 1], "tool");
    if (add_assistant_prompt && !after_results)
        put(&c, kind == TOK_CHAT_CHATML    ? "<|im_start|>assistant\n"
                : kind == TOK_CHAT_DEEPSEEK3 ? DS_ASSISTANT
                                             : "Assistant:");
    *len = c.n;
    if (c.n >= cap)
        return ecs_error(ECS_ERR_RANGE, "chat: %zu bytes do not fit in %zu", c.n + 1, cap);
    out[c.n] = '\0';
    return ECS_OK;
}

ecs_err_t tok_chat_format(const tok_t *t, tok_chat_kind_t fallback, const tok_chat_msg_t *msgs,
                          int n, bool add_assistant_prompt, char *out, size_t cap, size_t *len)
{
    tok_chat_kind_t kind = tok_chat_kind(t);
    *len = 0;
    if (kind == TOK_CHAT_UNKNOWN)
        return ecs_error(ECS_ERR_UNSUPPORTED, "chat: the model's chat template is not supported: \"%s\"",
                         tok_chat_first_line(t));
    if (kind == TOK_CHAT_NONE) {
        if (fallback == TOK_CHAT_NONE || fallback == TOK_CHAT_UNKNOWN)
            return ecs_error(ECS_ERR_NOTFOUND,
                             "chat: the model has no tokenizer.chat_template and no fallback was given");
        kind = fallback;
    }
    return tok_chat_apply(kind, msgs, n, add_assistant_prompt, out, cap, len);
}
