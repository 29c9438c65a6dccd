/* test_api_tools_v3.c - tool calls in DeepSeek-V3's form
 * (coordinator/api/tools_v3.c): the tool list in the system turn, past
 * calls and results as messages of their own for the template, forced
 * calls (one named function; a choice among several is refused by name),
 * and the output read back into calls (malformed stays text, what a
 * stream holds back). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "api_fixture.h"

#define V3 TOK_CHAT_DEEPSEEK3
#define CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define CALL_BEGIN "<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
#define CALL_END "<｜tool▁call▁end｜>"
#define CALLS_END "<｜tool▁calls▁end｜>"

#define WEATHER                                                                              \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"W\","    \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"unit\":{\"enum\":[\"c\",\"f\"]}},"  \
    "\"required\":[\"unit\"],\"additionalProperties\":false}}}"
#define OTHER "{\"type\":\"function\",\"function\":{\"name\":\"b\"}}"

Test(api_tools_v3, the_tool_list_and_past_calls_and_results)
{
    api_req_t r;
    cr_assert_eq(parse_for(API_ROUTE_CHAT, V3, "{\"tools\":[" WEATHER "],\"messages\":["
                           "{\"role\":\"user\",\"content\":\"Weather?\"},"
                           "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
                           "{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                           "\"arguments\":\"{\\\"unit\\\": \\\"c\\\"}\"}},"
                           "{\"id\":\"2\",\"type\":\"function\",\"function\":{\"name\":\"b\","
                           "\"arguments\":\"{}\"}}]},"
                           "{\"role\":\"tool\",\"tool_call_id\":\"1\",\"content\":\"sunny\"},"
                           "{\"role\":\"tool\",\"tool_call_id\":\"2\",\"content\":\"ok\"},"
                           "{\"role\":\"assistant\",\"content\":\"Sunny.\"},"
                           "{\"role\":\"user\",\"content\":\"Thanks\"}]}", &r),
                 ECS_OK, "%s", err);
    const char *want[][2] = {
        {"system", NULL},
        {"user", "Weather?"},
        {"assistant", ""},
        {"tool_call", "get_weather\n```json\n{\"unit\": \"c\"}\n```"},
        {"tool_call", "b\n```json\n{}\n```"},
        {"tool", "sunny"},
        {"tool", "ok"},
        {"assistant", "Sunny."},
        {"user", "Thanks"},
    };
    cr_assert_eq(r.n_msgs, 9);
    for (int i = 0; i < 9; i++) {
        cr_assert_str_eq(r.msgs[i].role, want[i][0], "message %d", i);
        if (want[i][1])
            cr_assert_str_eq(r.msgs[i].content, want[i][1], "message %d", i);
    }
    const char *sys = r.msgs[0].content;
    cr_assert(strstr(sys, "You can call any of the following tools to satisfy the user's "
                          "requests: [\n  {\n    \"type\": \"function\""), "%s", sys);
    cr_assert(strstr(sys, "\"name\": \"get_weather\""), "%s", sys);
    cr_assert(strstr(sys, "Example tool call syntax:\n\n" CALLS_BEGIN CALL_BEGIN "tool_name\n```json\n"),
              "%s", sys);
    cr_assert_eq(r.tool_mode, API_TOOLS_AUTO);
    cr_assert(api_tools_render_special(&r)); /* the calls' markup must reach the output */
    api_req_free(&r);
    /* the same request for Qwen's form keeps its messages whole */
    cr_assert_eq(parse(API_ROUTE_CHAT, "{\"tools\":[" WEATHER "],\"messages\":[{\"role\":\"user\","
                       "\"content\":\"u\"}]}", &r), ECS_OK, "%s", err);
    cr_assert(!api_tools_render_special(&r));
    api_req_free(&r);
}

Test(api_tools_v3, anthropic_blocks)
{
    api_req_t r;
    cr_assert_eq(parse_for(API_ROUTE_MESSAGES, V3, "{\"max_tokens\":8,\"messages\":["
                           "{\"role\":\"user\",\"content\":\"Weather?\"},"
                           "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Let me "
                           "look.\"},{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"get_weather\","
                           "\"input\":{\"unit\":\"c\"}},{\"type\":\"tool_use\",\"id\":\"t2\","
                           "\"name\":\"b\"}]},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
                           "\"t1\",\"content\":\"sunny\"},{\"type\":\"tool_result\",\"tool_use_id\":"
                           "\"t2\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]},"
                           "{\"type\":\"text\",\"text\":\"And?\"}]}]}", &r),
                 ECS_OK, "%s", err);
    const char *want[][2] = {
        {"user", "Weather?"},
        {"assistant", "Let me look."},
        {"tool_call", "get_weather\n```json\n{\"unit\": \"c\"}\n```"},
        {"tool_call", "b\n```json\n{}\n```"},
        {"tool", "sunny"},
        {"tool", "ok"},
        {"user", "And?"},
    };
    cr_assert_eq(r.n_msgs, 7);
    for (int i = 0; i < 7; i++) {
        cr_assert_str_eq(r.msgs[i].role, want[i][0], "message %d", i);
        cr_assert_str_eq(r.msgs[i].content, want[i][1], "message %d", i);
    }
    api_req_free(&r);
}

/* More calls and results than the request has messages: the list grows. */
Test(api_tools_v3, many_calls_in_one_message)
{
    char body[16384];
    int n = snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
                     "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[");
    for (int k = 0; k < 40; k++)
        n += snprintf(body + n, sizeof body - (size_t)n, "%s{\"id\":\"%d\",\"type\":\"function\","
                      "\"function\":{\"name\":\"f%d\",\"arguments\":\"{}\"}}", k ? "," : "", k, k);
    n += snprintf(body + n, sizeof body - (size_t)n, "]}");
    for (int k = 0; k < 40; k++)
        n += snprintf(body + n, sizeof body - (size_t)n, ",{\"role\":\"tool\",\"tool_call_id\":\"%d\","
                      "\"content\":\"r%d\"}", k, k);
    snprintf(body + n, sizeof body - (size_t)n, "]}");
    api_req_t r;
    cr_assert_eq(parse_for(API_ROUTE_CHAT, V3, body, &r), ECS_OK, "%s", err);
    cr_assert_eq(r.n_msgs, 82);
    cr_assert_str_eq(r.msgs[41].content, "f39\n```json\n{}\n```");
    cr_assert_str_eq(r.msgs[81].role, "tool");
    cr_assert_str_eq(r.msgs[81].content, "r39");
    api_req_free(&r);
}

Test(api_tools_v3, forced_calls)
{
    api_req_t r;
    cr_assert_eq(parse_for(API_ROUTE_CHAT, V3, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                           "\"tools\":[" WEATHER "," OTHER "],\"tool_choice\":{\"type\":\"function\","
                           "\"function\":{\"name\":\"get_weather\"}}}", &r), ECS_OK, "%s", err);
    cr_assert_eq(r.tool_mode, API_TOOLS_FORCED);
    cr_assert_str_eq(r.call_open, CALLS_BEGIN CALL_BEGIN "get_weather\n```json\n");
    cr_assert_str_eq(r.call_name, "get_weather");
    cr_assert(r.json && r.schema);
    /* the schema is the parameters' alone: the name is in the markup */
    cr_assert(schema_takes(&r, "{\"unit\": \"f\"}"));
    cr_assert(!schema_takes(&r, "{\"unit\": \"k\"}"));
    cr_assert(!schema_takes(&r, "{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"f\"}}"));
    cr_assert(!api_tools_render_special(&r));
    api_req_free(&r);
    /* required with a single tool: that one */
    cr_assert_eq(parse_for(API_ROUTE_CHAT, V3, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                           "\"tools\":[" OTHER "],\"tool_choice\":\"required\"}", &r), ECS_OK, "%s", err);
    cr_assert_str_eq(r.call_name, "b");
    cr_assert(schema_takes(&r, "{\"any\": [1]}"));
    api_req_free(&r);
    /* among several: the function must be named */
    expect_error_for(API_ROUTE_CHAT, V3, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                     "\"tools\":[" WEATHER "," OTHER "],\"tool_choice\":\"required\"}",
                     ECS_ERR_UNSUPPORTED, "any of 2 tools cannot be forced with DeepSeek-V3's chat "
                     "template");
    expect_error_for(API_ROUTE_MESSAGES, V3, "{\"max_tokens\":8,\"messages\":[{\"role\":\"user\","
                     "\"content\":\"u\"}],\"tools\":[{\"name\":\"a\",\"input_schema\":{}},"
                     "{\"name\":\"b\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"any\"}}",
                     ECS_ERR_UNSUPPORTED, "name the function");
    expect_error_for(API_ROUTE_CHAT, V3, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                     "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"p\",\"parameters\":"
                     "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"pattern\":"
                     "\"a+\"}}}}}],\"tool_choice\":\"required\"}",
                     ECS_ERR_UNSUPPORTED, "the parameters of 'p' cannot constrain");
}

static json_t *calls(api_tool_mode_t mode, bool one, const char *text, size_t *tl)
{
    api_req_t r = {.tool_mode = mode, .chat = V3, .one_call = one, .call_name = (char *)"fx"};
    return api_tools_calls(&r, "x", text, strlen(text), tl);
}

static const char *call_field(json_t *c, size_t k, const char *f)
{
    return json_string_value(json_object_get(json_object_get(json_array_get(c, k), "function"), f));
}

Test(api_tools_v3, output_read_back)
{
    size_t tl;
    json_t *c = calls(API_TOOLS_AUTO, false, "Sure.\n" CALLS_BEGIN CALL_BEGIN "get_weather\n```json\n"
                      "{\"unit\": \"c\"}\n```" CALL_END "\n" CALL_BEGIN "b\n```json\n{}\n```" CALL_END
                      CALLS_END, &tl);
    cr_assert(c);
    cr_assert_eq(json_array_size(c), 2);
    cr_assert_eq(tl, 5);
    cr_assert_str_eq(call_field(c, 0, "name"), "get_weather");
    cr_assert_str_eq(call_field(c, 0, "arguments"), "{\"unit\":\"c\"}");
    cr_assert_str_eq(call_field(c, 1, "name"), "b");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(c, 1), "id")), "call_x_1");
    json_decref(c);
    /* stopped after a call (no closing), and without a fence */
    c = calls(API_TOOLS_AUTO, false, CALLS_BEGIN CALL_BEGIN "a\n{\"k\": [1]}" CALL_END "\n", &tl);
    cr_assert(c);
    cr_assert_eq(tl, 0);
    cr_assert_str_eq(call_field(c, 0, "arguments"), "{\"k\":[1]}");
    json_decref(c);
    /* parallel calls off: the first only */
    c = calls(API_TOOLS_AUTO, true, CALLS_BEGIN CALL_BEGIN "a\n```json\n{}\n```" CALL_END "\n"
              CALL_BEGIN "b\n```json\n{}\n```" CALL_END CALLS_END, &tl);
    cr_assert_eq(json_array_size(c), 1);
    json_decref(c);
    /* forced: the output is the arguments of the named function */
    c = calls(API_TOOLS_FORCED, false, " {\"u\": \"c\"}\n", &tl);
    cr_assert(c);
    cr_assert_eq(tl, 0);
    cr_assert_str_eq(call_field(c, 0, "name"), "fx");
    cr_assert_str_eq(call_field(c, 0, "arguments"), "{\"u\":\"c\"}");
    json_decref(c);
    cr_assert_null(calls(API_TOOLS_FORCED, false, "{\"u\": \"c", &tl)); /* cut by length */
    const char *text[] = {
        "no call here",
        CALLS_BEGIN,
        CALLS_BEGIN CALL_BEGIN "a\n```json\n{}\n```",                           /* not closed */
        CALLS_BEGIN CALL_BEGIN "a\n```json\n{}\n```" CALL_END CALLS_END " more", /* text after */
        CALLS_BEGIN CALL_BEGIN "a b\n```json\n{}\n```" CALL_END,                 /* bad name */
        CALLS_BEGIN CALL_BEGIN "\n```json\n{}\n```" CALL_END,                    /* no name */
        CALLS_BEGIN CALL_BEGIN "a\n```json\n[1]\n```" CALL_END,                  /* not an object */
        CALLS_BEGIN CALL_BEGIN "a\n```json\n{\"k\": \n```" CALL_END,
        CALLS_BEGIN "<｜tool▁call▁begin｜>a very long type that is no type<｜tool▁sep｜>a\n{}"
            CALL_END,
        "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>",          /* Qwen's form */
    };
    for (size_t i = 0; i < sizeof text / sizeof text[0]; i++) {
        cr_assert_null(calls(API_TOOLS_AUTO, false, text[i], &tl), "%s", text[i]);
        cr_assert_eq(tl, strlen(text[i]));
    }
}

Test(api_tools_v3, stream_holds_back_the_calls)
{
    api_req_t r = {.tool_mode = API_TOOLS_AUTO, .chat = V3};
    const char *t = "abc " CALLS_BEGIN CALL_BEGIN "a";
    cr_assert_eq(api_tools_text_len(&r, t, strlen(t)), 4);
    cr_assert_eq(api_tools_text_len(&r, t, 4 + 5), 4); /* the tag's first bytes */
    cr_assert_eq(api_tools_text_len(&r, "abc <tool_call>", 15), 15);
    cr_assert_eq(api_tools_template(V3), ECS_OK);
}
