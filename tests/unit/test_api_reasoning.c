/* test_api_reasoning.c - reasoning with templates that think
 * (coordinator/api/reasoning.c): the prompt as Qwen3's template renders it
 * (enable_thinking false, old reasoning dropped before the last query and
 * kept in a tool loop after it, reasoning_content, Anthropic thinking
 * blocks), nothing changed for other templates, each mistake named, and
 * the output split into reasoning and answer, whole and streamed (what a
 * stream holds back, an unclosed think, a think and then a tool call),
 * in both APIs' shapes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_fixture.h"

/* The ChatML text of a parsed request as a template that thinks (or not)
 * renders it, the answer's start included. */
static char *prompt_of(api_route_t route, const char *json, bool thinks, bool open)
{
    api_req_t r;
    cr_assert_eq(parse(route, json, &r), ECS_OK, "%s -> %s", json, err);
    tok_chat_msg_t *msgs;
    const char *prefill;
    cr_assert_eq(api_think_view(&r, thinks, open, &msgs, &prefill), ECS_OK);
    size_t len = 0;
    cr_assert_eq(tok_chat_apply(TOK_CHAT_CHATML, msgs, r.n_msgs, true, NULL, 0, &len), ECS_ERR_RANGE);
    size_t pl = prefill ? strlen(prefill) : 0;
    char *out = malloc(len + pl + 1);
    cr_assert(out);
    cr_assert_eq(tok_chat_apply(TOK_CHAT_CHATML, msgs, r.n_msgs, true, out, len + 1, &len), ECS_OK);
    memcpy(out + len, prefill ? prefill : "", pl + 1);
    free(msgs);
    api_req_free(&r);
    return out;
}

#define U(x) "<|im_start|>user\n" x "<|im_end|>\n"
#define A(x) "<|im_start|>assistant\n" x "<|im_end|>\n"
#define GEN "<|im_start|>assistant\n"

Test(api_reasoning, thinking_off_ends_the_prompt_with_an_empty_think)
{
#define UMSG "\"messages\":[{\"role\":\"user\",\"content\":\"u\"}]"
    static const char EMPTY[] = U("u") GEN "<think>\n\n</think>\n\n", ON[] = U("u") GEN;
    struct { api_route_t route; const char *json; bool thinks; const char *want; } cases[] = {
        {API_ROUTE_CHAT, "{" UMSG ",\"chat_template_kwargs\":{\"enable_thinking\":false}}", true,
         EMPTY},
        /* a template that does not think: as before */
        {API_ROUTE_CHAT, "{" UMSG ",\"chat_template_kwargs\":{\"enable_thinking\":false}}", false, ON},
        {API_ROUTE_CHAT, "{" UMSG ",\"chat_template_kwargs\":{\"enable_thinking\":true,\"x\":1}}",
         true, ON},
        {API_ROUTE_MESSAGES, "{\"max_tokens\":9," UMSG ",\"thinking\":{\"type\":\"disabled\"}}",
         true, EMPTY},
        {API_ROUTE_MESSAGES, "{\"max_tokens\":9," UMSG ",\"thinking\":{\"type\":\"enabled\","
         "\"budget_tokens\":1024}}", true, ON},
        /* JSON mode's grammar starts at the first token: no room to think */
        {API_ROUTE_CHAT, "{" UMSG ",\"response_format\":{\"type\":\"json_object\"}}", true, EMPTY},
        {API_ROUTE_CHAT, "{" UMSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
         "\"a\"}}],\"tool_choice\":\"required\"}", true, U("u") GEN "<think>\n\n</think>\n\n"
         "<tool_call>\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *p = prompt_of(cases[i].route, cases[i].json, cases[i].thinks, false);
        const size_t n = strlen(p), w = strlen(cases[i].want);
        /* the end (the tools' system turn comes first) */
        cr_assert(n >= w && !strcmp(p + n - w, cases[i].want), "%s: %s", cases[i].json, p);
        free(p);
    }
    /* a template whose assistant prompt opens the think block: the prompt
     * ends as it renders it, the empty block instead with thinking off */
    char *p = prompt_of(API_ROUTE_CHAT, "{" UMSG "}", true, true);
    cr_assert_str_eq(p, U("u") GEN "<think>\n");
    free(p);
    p = prompt_of(API_ROUTE_CHAT, "{" UMSG ",\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                  true, true);
    cr_assert_str_eq(p, EMPTY);
    free(p);
    p = prompt_of(API_ROUTE_CHAT, "{" UMSG "}", false, true); /* not a thinking template */
    cr_assert_str_eq(p, ON);
    free(p);
    const char *open = "{{- '<|im_start|>assistant\\n<think>\\n' }}",
               *hybrid = "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + r }}";
    cr_assert(tok_chat_detect_think_open(open, strlen(open)));
    cr_assert(!tok_chat_detect_think_open(hybrid, strlen(hybrid)));
}

Test(api_reasoning, old_reasoning_is_dropped_before_the_last_query)
{
    const char *j =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q1\"},"
        "{\"role\":\"assistant\",\"content\":\"<think>\\nr1\\n</think>\\n\\na1\"},"
        "{\"role\":\"assistant\",\"content\":\"x</think>y</think>\\n\\nz\"},"
        "{\"role\":\"user\",\"content\":\"q2\"}]}";
    char *p = prompt_of(API_ROUTE_CHAT, j, true, false);
    cr_assert_str_eq(p, U("q1") A("a1") A("z") U("q2") GEN, "%s", p);
    free(p);
    p = prompt_of(API_ROUTE_CHAT, j, false, false); /* other templates: verbatim */
    cr_assert_str_eq(p, U("q1") A("<think>\nr1\n</think>\n\na1") A("x</think>y</think>\n\nz")
                     U("q2") GEN, "%s", p);
    free(p);
    /* reasoning_content before the last query: dropped too */
    p = prompt_of(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q1\"},"
                  "{\"role\":\"assistant\",\"content\":\"a1\",\"reasoning_content\":\"r\"},"
                  "{\"role\":\"user\",\"content\":\"q2\"}]}", true, false);
    cr_assert_str_eq(p, U("q1") A("a1") U("q2") GEN, "%s", p);
    free(p);
}

Test(api_reasoning, reasoning_is_kept_in_a_tool_loop)
{
    /* after the last query: a turn with reasoning keeps it, the last turn
     * always has a think block, one without reasoning stays bare; the
     * call follows the content with "\n" only when content is left */
    const char *j =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"\\nplan\\n\",\"tool_calls\":"
        "[{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"r1\"},"
        "{\"role\":\"assistant\",\"content\":\"Let me see.\",\"tool_calls\":"
        "[{\"id\":\"2\",\"type\":\"function\",\"function\":{\"name\":\"b\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"r2\"},"
        "{\"role\":\"assistant\",\"content\":\"<think>\\nthink\\n</think>\\n\\n\",\"tool_calls\":"
        "[{\"id\":\"3\",\"type\":\"function\",\"function\":{\"name\":\"c\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"r3\"},"
        "{\"role\":\"assistant\",\"content\":\"\\n<think>\\nmore\\n</think>\\n\\nDone.\"}]}";
    char *p = prompt_of(API_ROUTE_CHAT, j, true, false);
    cr_assert_str_eq(p,
        "<|im_start|>system\nS<|im_end|>\n" U("q")
        A("<think>\nplan\n</think>\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>")
        U("<tool_response>\nr1\n</tool_response>")
        A("Let me see.\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>")
        U("<tool_response>\nr2\n</tool_response>")
        A("<think>\nthink\n</think>\n\n<tool_call>\n{\"name\": \"c\", \"arguments\": {}}\n</tool_call>")
        U("<tool_response>\nr3\n</tool_response>")
        A("<think>\nmore\n</think>\n\nDone.") GEN, "%s", p);
    free(p);
    /* the last message with no reasoning still gets its (empty) block */
    p = prompt_of(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                  "{\"role\":\"assistant\",\"content\":\"\\n\\nhi\"}]}", true, false);
    cr_assert_str_eq(p, U("q") A("<think>\n\n</think>\n\nhi") GEN, "%s", p);
    free(p);
    /* no user query at all: nothing is kept */
    p = prompt_of(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"hi\","
                  "\"reasoning_content\":\"r\"}]}", true, false);
    cr_assert_str_eq(p, A("hi") GEN, "%s", p);
    free(p);
}

Test(api_reasoning, anthropic_thinking_blocks)
{
    const char *j =
        "{\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"q1\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t1\","
        "\"signature\":\"s\"},{\"type\":\"text\",\"text\":\"a1\"}]},"
        "{\"role\":\"user\",\"content\":\"q2\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t2\",\"signature\":\"\"},"
        "{\"type\":\"redacted_thinking\",\"data\":\"xx\"},{\"type\":\"text\",\"text\":\"a2\"},"
        "{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"x\",\"input\":{}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\","
        "\"content\":\"r\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"redacted_thinking\",\"data\":\"xx\"}]}]}";
    char *p = prompt_of(API_ROUTE_MESSAGES, j, true, false);
    cr_assert_str_eq(p, U("q1") A("a1") U("q2")
                     A("<think>\nt2\n</think>\n\na2\n<tool_call>\n{\"name\": \"x\", \"arguments\": {}}"
                       "\n</tool_call>")
                     U("<tool_response>\nr\n</tool_response>") A("<think>\n\n</think>\n\n") GEN,
                     "%s", p);
    free(p);
    p = prompt_of(API_ROUTE_MESSAGES, j, false, false); /* the thinking left out */
    cr_assert_str_eq(p, U("q1") A("a1") U("q2")
                     A("a2\n<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>")
                     U("<tool_response>\nr\n</tool_response>") A("") GEN, "%s", p);
    free(p);
}

Test(api_reasoning, mistakes_are_named)
{
    const char *u = "\"messages\":[{\"role\":\"user\",\"content\":\"u\"}]";
    char j[512];
    struct { api_route_t route; const char *extra, *needle; } cases[] = {
        {API_ROUTE_CHAT, "\"chat_template_kwargs\":5", "'chat_template_kwargs' must be an object, not a number"},
        {API_ROUTE_CHAT, "\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}",
         "'chat_template_kwargs'.enable_thinking must be a boolean, not a string"},
        {API_ROUTE_MESSAGES, "\"max_tokens\":9,\"thinking\":true", "'thinking' must be {\"type\""},
        {API_ROUTE_MESSAGES, "\"max_tokens\":9,\"thinking\":{\"type\":\"on\"}", "'thinking' must be"},
        {API_ROUTE_MESSAGES, "\"max_tokens\":9,\"thinking\":{\"type\":\"enabled\"}",
         "'thinking'.budget_tokens must be a positive integer"},
        {API_ROUTE_MESSAGES, "\"max_tokens\":9,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":0}",
         "budget_tokens must be"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(j, sizeof j, "{%s,%s}", u, cases[i].extra);
        expect_error(cases[i].route, j, ECS_ERR_INVAL, cases[i].needle);
    }
    expect_error(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\","
                 "\"reasoning_content\":[1]}]}", ECS_ERR_INVAL,
                 "messages[0].reasoning_content must be a string, not an array");
    expect_error(API_ROUTE_MESSAGES, "{\"max_tokens\":9,\"messages\":[{\"role\":\"assistant\","
                 "\"content\":[{\"type\":\"thinking\",\"thinking\":5}]}]}", ECS_ERR_INVAL,
                 "messages[0].content[0].thinking must be a string");
    /* a user's thinking block is no more text than before */
    expect_error(API_ROUTE_MESSAGES, "{\"max_tokens\":9,\"messages\":[{\"role\":\"user\","
                 "\"content\":[{\"type\":\"thinking\",\"thinking\":\"t\"}]}]}", ECS_ERR_UNSUPPORTED,
                 "'thinking' is not supported");
    /* completions: not a chat, the field is not read */
    api_req_t r;
    cr_assert_eq(parse(API_ROUTE_COMPLETION, "{\"prompt\":\"x\",\"chat_template_kwargs\":5}", &r),
                 ECS_OK, "%s", err);
    cr_assert(!api_think_splits(&r, true));
    api_req_free(&r);
}

Test(api_reasoning, which_requests_split)
{
    api_req_t r = {.route = API_ROUTE_CHAT};
    cr_assert(api_think_splits(&r, true));
    cr_assert(!api_think_splits(&r, false));
    r.think_off = true;
    cr_assert(!api_think_splits(&r, true));
    r = (api_req_t){.route = API_ROUTE_MESSAGES, .json = true};
    cr_assert(!api_think_splits(&r, true));
    /* a template thinks when its text writes <think> (the kind must be ChatML too) */
    const char *q = "{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}";
    cr_assert(tok_chat_detect_thinks(q, strlen(q)));
    cr_assert(!tok_chat_detect_thinks("<|im_start|>", 12));
    cr_assert(!tok_chat_detect_thinks(NULL, 0));
}

static api_think_span_t split_as(const char *t, bool open, bool partial)
{
    api_think_span_t s;
    api_think_split(t, strlen(t), open, partial, &s);
    cr_assert(s.r_off <= s.r_end && s.r_end <= s.c_off && s.c_off <= strlen(t), "%s", t);
    return s;
}

static api_think_span_t split(const char *t, bool partial) { return split_as(t, true, partial); }

static void expect_span_as(const char *t, bool open, bool partial, const char *reasoning,
                           const char *answer, bool closed)
{
    api_think_span_t s = split_as(t, open, partial);
    cr_assert_eq(s.r_end - s.r_off, strlen(reasoning), "%s: reasoning %zu..%zu", t, s.r_off, s.r_end);
    cr_assert_eq(memcmp(t + s.r_off, reasoning, strlen(reasoning)), 0, "%s", t);
    cr_assert_str_eq(t + s.c_off, answer, "%s", t);
    cr_assert_eq(s.closed, closed, "%s", t);
}

/* With the think block opened by the prompt (or the output's own). */
static void expect_span(const char *t, bool partial, const char *reasoning, const char *answer,
                        bool closed)
{
    expect_span_as(t, true, partial, reasoning, answer, closed);
}

Test(api_reasoning, output_split)
{
    expect_span("<think>\nabc\n</think>\n\nHello", false, "abc", "Hello", true);
    expect_span("\n<think>\n\nabc\n\n</think>\n\nHello\n", false, "abc", "Hello\n", true);
    expect_span("abc</think>Hi", false, "abc", "Hi", true); /* the template wrote <think> */
    expect_span("<think>\n\n</think>\n\nHi", false, "", "Hi", true);
    expect_span("<think>\nab</think>c</think>d", false, "ab", "c</think>d", true);
    /* cut before </think> (max_tokens): all of it is reasoning */
    expect_span("<think>\nabc\n", false, "abc\n", "", false);
    expect_span("plain", false, "plain", "", false);
    expect_span("", false, "", "", false);
    /* streamed: an opening tag, a partial </think> and the newlines that
     * may end the reasoning are held back */
    expect_span("", true, "", "", false);
    expect_span("\n<thi", true, "", "", false);
    expect_span("<think>", true, "", "", false);
    expect_span("<think>\nab", true, "ab", "", false);
    expect_span("<think>\nab\n", true, "ab", "", false);
    expect_span("<think>\nab\n</thi", true, "ab", "", false);
    expect_span("<think>\nab <", true, "ab ", "", false);
    expect_span("<think>\nab\n</think>\n", true, "ab", "", true);
    expect_span("<think>\nab\n</think>\n\nH", true, "ab", "H", true);
    expect_span("<tx", true, "<tx", "", false);
    /* the prompt did not open it: only an output that opens it thinks */
    expect_span_as("<think>\nabc\n</think>\n\nHello", false, false, "abc", "Hello", true);
    expect_span_as("abc</think>Hi", false, false, "", "abc</think>Hi", true);
    expect_span_as("plain", false, false, "", "plain", true);
    expect_span_as("\nplain", false, true, "", "\nplain", true);
    expect_span_as("\n<thi", false, true, "", "", false); /* it may still open */
    expect_span_as("<tx", false, true, "", "<tx", true);
    expect_span_as("<think>\nab", false, true, "ab", "", false);
    /* whether there is a think block (Anthropic's thinking block), and while
     * it may still open, not known */
    struct { const char *t; bool open, partial, opened, closed; } o[] = {
        {"<think>\nab", false, true, true, false},   {"plain", false, true, false, true},
        {"\n<thi", false, true, false, false},         {"", false, true, false, false},
        {"\n<thi", false, false, false, true},         {"", false, false, false, true},
        {"ab", true, true, true, false},              {"", true, true, true, false},
        {"<think>\n</think>hi", false, false, true, true},
    };
    for (size_t k = 0; k < sizeof o / sizeof o[0]; k++) {
        api_think_span_t x = split_as(o[k].t, o[k].open, o[k].partial);
        cr_assert(x.opened == o[k].opened && x.closed == o[k].closed, "%zu: '%s' opened %d closed %d",
                  k, o[k].t, x.opened, x.closed);
    }
    /* a think, then a call: the call is read from the answer */
    const char *t = "<think>\nr\n</think>\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n"
                    "</tool_call>";
    api_think_span_t s = split(t, false);
    api_req_t r = {.route = API_ROUTE_CHAT, .tool_mode = API_TOOLS_AUTO};
    size_t tl;
    json_t *c = api_tools_calls(&r, "x", t + s.c_off, strlen(t) - s.c_off, &tl);
    cr_assert(c);
    cr_assert_eq(json_array_size(c), 1);
    cr_assert_eq(tl, 0);
    json_decref(c);
    /* and streamed, the call's tag is held back after the reasoning */
    s = split("<think>\nr\n</think>\n\nok <tool_ca", true);
    cr_assert_eq(api_tools_text_len(&r, "<think>\nr\n</think>\n\nok <tool_ca" + s.c_off, 11), 3);
}

/* ---- the replies (reply.c): a job and the scheduler's view by hand ---- */

static api_job_t *job(api_route_t route, bool stream, bool think)
{
    api_job_t *j = calloc(1, sizeof *j);
    cr_assert(j);
    j->req.route = route;
    j->req.stream = stream;
    j->req.top_logprobs = -1;
    j->req.tool_mode = API_TOOLS_AUTO;
    j->think = think;
    j->think_open = think; /* as a prompt that opened the block: see no_think_block_is_content */
    strcpy(j->id, "id1");
    return j;
}

static sched_view_t view(const char *text, sched_finish_t f)
{
    return (sched_view_t){.text = text, .text_len = strlen(text), .finish = f, .stop_index = -1};
}

static json_t *full(api_route_t route, bool think, const char *text)
{
    api_job_t *j = job(route, false, think);
    api_buf_t b = {0};
    sched_view_t v = view(text, SCHED_FINISH_EOG);
    api_reply_full(j, &b, &v, "m", NULL);
    cr_assert(!b.failed);
    json_t *o = json_loadb(b.p, b.len, 0, NULL);
    cr_assert(o, "%.*s", (int)b.len, b.p);
    api_buf_free(&b);
    free(j);
    return o;
}

#define JS(o, ...) json_string_value(json_object_get(o, __VA_ARGS__))

Test(api_reasoning, whole_replies)
{
    json_t *o = full(API_ROUTE_CHAT, true, "<think>\nr\n</think>\n\nHi");
    json_t *m = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    cr_assert_str_eq(JS(m, "reasoning_content"), "r");
    cr_assert_str_eq(JS(m, "content"), "Hi");
    json_decref(o);
    o = full(API_ROUTE_CHAT, false, "<think>\nr\n</think>\n\nHi"); /* not split */
    m = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    cr_assert_null(json_object_get(m, "reasoning_content"));
    cr_assert_str_eq(JS(m, "content"), "<think>\nr\n</think>\n\nHi");
    json_decref(o);
    o = full(API_ROUTE_CHAT, true, "<think>\nr\n</think>\n\n<tool_call>\n{\"name\": \"f\", "
             "\"arguments\": {}}\n</tool_call>");
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    m = json_object_get(ch, "message");
    cr_assert_str_eq(JS(m, "reasoning_content"), "r");
    cr_assert(json_is_null(json_object_get(m, "content")));
    cr_assert_eq(json_array_size(json_object_get(m, "tool_calls")), 1);
    cr_assert_str_eq(JS(ch, "finish_reason"), "tool_calls");
    json_decref(o);
    o = full(API_ROUTE_MESSAGES, true, "<think>\nr\n</think>\n\nHi");
    json_t *c = json_object_get(o, "content");
    cr_assert_eq(json_array_size(c), 2);
    cr_assert_str_eq(JS(json_array_get(c, 0), "type"), "thinking");
    cr_assert_str_eq(JS(json_array_get(c, 0), "thinking"), "r");
    cr_assert_str_eq(JS(json_array_get(c, 0), "signature"), "");
    cr_assert_str_eq(JS(json_array_get(c, 1), "text"), "Hi");
    json_decref(o);
    o = full(API_ROUTE_MESSAGES, true, "<think>\ncut short"); /* unclosed: all reasoning */
    c = json_object_get(o, "content");
    cr_assert_str_eq(JS(json_array_get(c, 0), "thinking"), "cut short");
    cr_assert_str_eq(JS(json_array_get(c, 1), "text"), "");
    json_decref(o);
}

/* A stream's events for text growing through cuts (prefix lengths), as
 * one string: each event's type and its delta's text. */
static char *stream_as(api_route_t route, const char *text, bool open, const size_t *cuts,
                       size_t n_cuts)
{
    api_job_t *j = job(route, true, true);
    j->think_open = open;
    api_buf_t b = {0};
    api_reply_stream_start(j, &b, 3, "m");
    for (size_t k = 0; k < n_cuts; k++) {
        char *pre = strndup(text, cuts[k]);
        sched_view_t v = view(pre, SCHED_RUNNING);
        api_reply_stream_delta(j, &b, &v, "m", NULL);
        free(pre);
    }
    sched_view_t v = view(text, SCHED_FINISH_EOG);
    api_reply_stream_end(j, &b, &v, "m", NULL);
    cr_assert(!b.failed);
    api_buf_add(&b, "", 1);
    api_buf_t out = {0};
    for (char *line = strtok(b.p, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: {", 7))
            continue;
        json_t *o = json_loads(line + 6, 0, NULL);
        cr_assert(o, "%s", line);
        json_t *d = json_object_get(o, "delta");
        if (route == API_ROUTE_CHAT) {
            d = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta");
            const char *key = json_object_get(d, "reasoning_content") ? "reasoning_content"
                              : json_object_get(d, "content") ? "content" : NULL;
            if (key && *JS(d, key))
                api_buf_printf(&out, "%c[%s]", key[0], JS(d, key));
        } else {
            const char *ty = JS(o, "type");
            json_t *cb = json_object_get(o, "content_block");
            api_buf_printf(&out, "%s%lld", !strcmp(ty, "content_block_start") ? JS(cb, "type")
                           : !strcmp(ty, "content_block_delta") ? JS(d, "type") : ty,
                           (long long)json_integer_value(json_object_get(o, "index")));
            if (d && (JS(d, "thinking") || JS(d, "text")))
                api_buf_printf(&out, "[%s]", JS(d, "thinking") ? JS(d, "thinking") : JS(d, "text"));
            api_buf_puts(&out, " ");
        }
        json_decref(o);
    }
    api_buf_add(&out, "", 1);
    api_buf_free(&b);
    free(j);
    return out.p;
}

static char *stream(api_route_t route, const char *text, const size_t *cuts, size_t n_cuts)
{
    return stream_as(route, text, true, cuts, n_cuts);
}

Test(api_reasoning, streams)
{
    const char *t = "<think>\nab\n</think>\n\nHi <tool_call> no";
    const size_t cuts[] = {3, 9, 12, 16, 22, 24, 28};
    char *s = stream(API_ROUTE_CHAT, t, cuts, 7);
    /* the reasoning first, without the newlines around it; "<tool_call>"
     * held back until the end shows it is no call */
    cr_assert_str_eq(s, "r[a]r[b]c[H]c[i ]c[<tool_call> no]", "%s", s);
    free(s);
    s = stream(API_ROUTE_MESSAGES, t, cuts, 7);
    cr_assert_str_eq(s, "message_start0 thinking0 ping0 thinking_delta0[a] thinking_delta0[b] "
                     "content_block_stop0 text1 text_delta1[H] text_delta1[i ] "
                     "text_delta1[<tool_call> no] content_block_stop1 message_delta0 message_stop0 ",
                     "%s", s);
    free(s);
    /* unclosed: all reasoning; the text block comes empty at the end */
    const size_t c2[] = {10};
    s = stream(API_ROUTE_MESSAGES, "<think>\nlong\n\n", c2, 1);
    cr_assert_str_eq(s, "message_start0 thinking0 ping0 thinking_delta0[lo] thinking_delta0[ng] thinking_delta0[\n\n] "
                     "content_block_stop0 text1 content_block_stop1 message_delta0 message_stop0 ",
                     "%s", s);
    free(s);
    /* a call after the reasoning: Anthropic's tool_use block at index 2 */
    const char *call = "<think>\nr\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n"
                       "</tool_call>";
    const size_t c3[] = {25};
    s = stream(API_ROUTE_MESSAGES, call, c3, 1);
    cr_assert_str_eq(s, "message_start0 thinking0 ping0 thinking_delta0[r] content_block_stop0 "
                     "text1 content_block_stop1 tool_use2 input_json_delta2 content_block_stop2 "
                     "message_delta0 message_stop0 ", "%s", s);
    free(s);
}

/* A model that does not open a think block (the prompt did not either):
 * its answer is content, whole and streamed alike. */
Test(api_reasoning, no_think_block_is_content)
{
    api_job_t *j = job(API_ROUTE_CHAT, false, true);
    j->think_open = false;
    api_buf_t b = {0};
    sched_view_t v = view("Hello </think> x", SCHED_FINISH_EOG);
    api_reply_full(j, &b, &v, "m", NULL);
    json_t *o = json_loadb(b.p, b.len, 0, NULL);
    cr_assert(o);
    json_t *m = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    cr_assert_null(json_object_get(m, "reasoning_content"));
    cr_assert_str_eq(JS(m, "content"), "Hello </think> x");
    json_decref(o);
    api_buf_free(&b);
    free(j);
    const size_t cuts[] = {1, 3, 6};
    char *s = stream_as(API_ROUTE_CHAT, "Hello </think> x", false, cuts, 3);
    cr_assert_str_eq(s, "c[H]c[el]c[lo ]c[</think> x]", "%s", s);
    free(s);
    s = stream_as(API_ROUTE_MESSAGES, "Hi", false, cuts, 1);
    /* Anthropic: no thinking block, the text block alone (as the whole reply) */
    cr_assert_str_eq(s, "message_start0 ping0 text0 text_delta0[H] text_delta0[i] "
                     "content_block_stop0 message_delta0 message_stop0 ", "%s", s);
    free(s);
    /* an answer that opens one gets the thinking block once its tag is whole */
    const size_t cuts2[] = {3, 9, 18};
    s = stream_as(API_ROUTE_MESSAGES, "<think>\nr</think>Hi", false, cuts2, 3);
    cr_assert_str_eq(s, "message_start0 ping0 thinking0 thinking_delta0[r] content_block_stop0 text1 "
                     "text_delta1[H] text_delta1[i] content_block_stop1 message_delta0 "
                     "message_stop0 ", "%s", s);
    free(s);
    /* a stream that ends while the tag could still come: the text block */
    const size_t cuts3[] = {2};
    s = stream_as(API_ROUTE_MESSAGES, "<t", false, cuts3, 1);
    cr_assert_str_eq(s, "message_start0 ping0 text0 text_delta0[<t] content_block_stop0 "
                     "message_delta0 message_stop0 ", "%s", s);
    free(s);
}
