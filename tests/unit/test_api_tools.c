/* test_api_tools.c - tool calls (coordinator/api/tools.c): tools and past
 * calls / results rendered as Qwen3's template renders them, tool_choice
 * (auto, none, forced by name, required / any), each
 * mistake named, and the output read back into calls (text before them,
 * several calls, anything malformed staying text, what a stream holds
 * back). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "api_fixture.h"

#define WEATHER                                                                              \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"W\","    \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"unit\":{\"enum\":[\"c\",\"f\"]}},"  \
    "\"required\":[\"unit\"]}}}"

/* Qwen3's system turn for the WEATHER tool (its template's text). */
static const char TOOLS_TURN[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"W\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"unit\": {\"enum\": [\"c\", \"f\"]}}, "
    "\"required\": [\"unit\"]}}}\n</tools>\n\nFor each function call, return a json object with "
    "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

Test(api_tools, tools_join_the_system_turn)
{
    api_req_t r;
    cr_assert_eq(parse(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                       "{\"role\":\"user\",\"content\":\"u\"}],\"tools\":[" WEATHER "]}", &r),
                 ECS_OK, "%s", err);
    cr_assert_eq(r.tool_mode, API_TOOLS_AUTO);
    cr_assert(r.tool_parts && !r.json);
    cr_assert_eq(r.n_msgs, 2);
    cr_assert_str_eq(r.msgs[0].role, "system");
    cr_assert_eq(strncmp(r.msgs[0].content, "S\n\n", 3), 0);
    cr_assert_str_eq(r.msgs[0].content + 3, TOOLS_TURN);
    api_req_free(&r);
    /* no system message: a system turn of its own, first */
    cr_assert_eq(parse(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                       "\"tools\":[" WEATHER "],\"tool_choice\":\"auto\"}", &r), ECS_OK, "%s", err);
    cr_assert_eq(r.n_msgs, 2);
    cr_assert_str_eq(r.msgs[0].role, "system");
    cr_assert_str_eq(r.msgs[0].content, TOOLS_TURN);
    cr_assert_str_eq(r.msgs[1].content, "u");
    api_req_free(&r);
    /* tool_choice none: not described, nothing read back */
    cr_assert_eq(parse(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                       "\"tools\":[" WEATHER "],\"tool_choice\":\"none\"}", &r), ECS_OK, "%s", err);
    cr_assert_eq(r.tool_mode, API_TOOLS_OFF);
    cr_assert(!r.tool_parts && !r.tools_text);
    cr_assert_eq(r.n_msgs, 1);
    api_req_free(&r);
}

Test(api_tools, past_calls_and_results_as_qwen3)
{
    api_req_t r;
    const char *j =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
        "{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"a\",\"arguments\":\"{\\\"x\\\": 1}\"}},"
        "{\"id\":\"2\",\"type\":\"function\",\"function\":{\"name\":\"b\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"1\",\"content\":\"r1\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"2\",\"content\":[{\"type\":\"text\",\"text\":\"r2\"}]},"
        "{\"role\":\"assistant\",\"content\":\"hi\",\"tool_calls\":["
        "{\"id\":\"3\",\"type\":\"function\",\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"r3\"},{\"role\":\"user\",\"content\":\"v\"}]}";
    cr_assert_eq(parse(API_ROUTE_CHAT, j, &r), ECS_OK, "%s", err);
    cr_assert_eq(r.n_msgs, 6);
    cr_assert(r.tool_parts);
    cr_assert_eq(r.tool_mode, API_TOOLS_OFF); /* no tools offered this turn */
    cr_assert_str_eq(r.msgs[1].role, "assistant");
    cr_assert_str_eq(r.msgs[1].content,
                     "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
                     "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>");
    cr_assert_str_eq(r.msgs[2].role, "user"); /* both results, one turn */
    cr_assert_str_eq(r.msgs[2].content, "<tool_response>\nr1\n</tool_response>\n"
                                        "<tool_response>\nr2\n</tool_response>");
    cr_assert_str_eq(r.msgs[3].content,
                     "hi\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>");
    cr_assert_str_eq(r.msgs[4].content, "<tool_response>\nr3\n</tool_response>");
    cr_assert_str_eq(r.msgs[5].role, "user");
    cr_assert_str_eq(r.msgs[5].content, "v");
    api_req_free(&r);
}

Test(api_tools, anthropic_blocks)
{
    api_req_t r;
    const char *j =
        "{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Let me see.\"},"
        "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"get_weather\",\"input\":{\"unit\":\"c\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\","
        "\"content\":\"18\"},{\"type\":\"text\",\"text\":\"and tomorrow?\"}]}],"
        "\"tools\":[{\"name\":\"get_weather\",\"description\":\"W\",\"input_schema\":{\"type\":"
        "\"object\",\"properties\":{\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"unit\"]}}],"
        "\"tool_choice\":{\"type\":\"any\"}}";
    cr_assert_eq(parse(API_ROUTE_MESSAGES, j, &r), ECS_OK, "%s", err);
    cr_assert_eq(r.tool_mode, API_TOOLS_FORCED); /* any, with one tool */
    cr_assert(r.json && r.schema);
    cr_assert_eq(r.n_msgs, 5);
    cr_assert_str_eq(r.msgs[0].content, TOOLS_TURN); /* the same description as OpenAI's */
    cr_assert_str_eq(r.msgs[2].content, "Let me see.\n<tool_call>\n{\"name\": \"get_weather\", "
                                        "\"arguments\": {\"unit\": \"c\"}}\n</tool_call>");
    cr_assert_str_eq(r.msgs[3].content, "<tool_response>\n18\n</tool_response>");
    cr_assert_str_eq(r.msgs[4].role, "user");
    cr_assert_str_eq(r.msgs[4].content, "and tomorrow?");
    api_req_free(&r);
}

Test(api_tools, forced_calls)
{
    api_req_t r;
    cr_assert_eq(parse(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                       "\"tools\":[" WEATHER ",{\"type\":\"function\",\"function\":{\"name\":\"b\"}}],"
                       "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}",
                       &r), ECS_OK, "%s", err);
    cr_assert_eq(r.tool_mode, API_TOOLS_FORCED);
    cr_assert(r.json && r.schema);
    api_req_free(&r);
    cr_assert_eq(parse(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                       "\"tools\":[" WEATHER "],\"tool_choice\":\"required\"}", &r), ECS_OK, "%s", err);
    cr_assert_eq(r.tool_mode, API_TOOLS_FORCED);
    cr_assert(!r.one_call);
    api_req_free(&r);
    cr_assert_eq(parse(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                       "\"tools\":[" WEATHER "],\"parallel_tool_calls\":false}", &r), ECS_OK, "%s", err);
    cr_assert(r.one_call);
    api_req_free(&r);
    cr_assert_eq(parse(API_ROUTE_MESSAGES, "{\"max_tokens\":8,\"messages\":[{\"role\":\"user\","
                       "\"content\":\"u\"}],\"tools\":[{\"name\":\"a\",\"input_schema\":{}},"
                       "{\"name\":\"b\",\"input_schema\":{\"type\":\"object\"}}],"
                       "\"tool_choice\":{\"type\":\"tool\",\"name\":\"b\","
                       "\"disable_parallel_tool_use\":true}}", &r), ECS_OK, "%s", err);
    cr_assert_eq(r.tool_mode, API_TOOLS_FORCED);
    cr_assert(r.one_call);
    api_req_free(&r);
}

Test(api_tools, required_among_several_tools_calls_one_of_them_by_its_schema)
{
    api_req_t r;
    cr_assert_eq(parse(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                       "\"tools\":[" WEATHER ",{\"type\":\"function\",\"function\":{\"name\":\"b\"}}],"
                       "\"tool_choice\":\"required\"}", &r), ECS_OK, "%s", err);
    cr_assert_eq(r.tool_mode, API_TOOLS_FORCED);
    cr_assert(r.json && r.schema);
    cr_assert(schema_takes(&r, "{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}"));
    cr_assert(schema_takes(&r, "{\"name\": \"b\", \"arguments\": {\"any\": [1]}}"));
    cr_assert(!schema_takes(&r, "{\"name\": \"get_weather\", \"arguments\": {}}"), "unit is required");
    cr_assert(!schema_takes(&r, "{\"name\": \"c\", \"arguments\": {}}"));
    api_req_free(&r);
    /* Anthropic's any; a tool's own $defs and "#" keep their meaning */
    cr_assert_eq(parse(API_ROUTE_MESSAGES, "{\"max_tokens\":8,\"messages\":[{\"role\":\"user\","
                       "\"content\":\"u\"}],\"tools\":[{\"name\":\"a\",\"input_schema\":{\"type\":"
                       "\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/P\"}},\"required\":[\"p\"],"
                       "\"additionalProperties\":false,\"$defs\":{\"P\":{\"type\":\"object\","
                       "\"properties\":{\"x\":{\"type\":\"integer\"},\"up\":{\"$ref\":\"#\"}},"
                       "\"additionalProperties\":false}}}},{\"name\":\"z\",\"input_schema\":{\"type\":"
                       "\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/P\"}},\"$defs\":{\"P\":"
                       "{\"type\":\"string\"}}}}],\"tool_choice\":{\"type\":\"any\"}}", &r),
                 ECS_OK, "%s", err);
    cr_assert_eq(r.tool_mode, API_TOOLS_FORCED);
    cr_assert(schema_takes(&r, "{\"name\":\"a\",\"arguments\":{\"p\":{\"x\":1,\"up\":{\"p\":{}}}}}"));
    cr_assert(schema_takes(&r, "{\"name\":\"z\",\"arguments\":{\"p\":\"s\"}}"));
    cr_assert(!schema_takes(&r, "{\"name\":\"a\",\"arguments\":{\"p\":\"s\"}}"), "a's P");
    cr_assert(!schema_takes(&r, "{\"name\":\"z\",\"arguments\":{\"p\":{\"x\":1}}}"), "z's P");
    cr_assert(!schema_takes(&r, "{\"name\":\"a\",\"arguments\":{\"p\":{\"up\":{}}}}"),
              "'#' is a's parameters: p is required");
    api_req_free(&r);
    /* more tools than a union tells apart */
    char j[16384];
    int n = snprintf(j, sizeof j, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
                     "\"tool_choice\":\"required\",\"tools\":[");
    for (int k = 0; k < 65; k++)
        n += snprintf(j + n, sizeof j - (size_t)n, "%s{\"type\":\"function\",\"function\":"
                      "{\"name\":\"f%d\"}}", k ? "," : "", k);
    snprintf(j + n, sizeof j - (size_t)n, "]}");
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_UNSUPPORTED, "at most 64");
}

Test(api_tools, mistakes_are_named)
{
    const char *u = "\"messages\":[{\"role\":\"user\",\"content\":\"u\"}]";
    char j[1024];
    struct { const char *extra, *needle; ecs_err_t code; } cases[] = {
        {"\"tools\":{}", "'tools' must be an array", ECS_ERR_INVAL},
        {"\"tools\":[5]", "'tools'[0] must be an object", ECS_ERR_INVAL},
        {"\"tools\":[{\"type\":\"x\"}]", "'tools'[0].type must be \"function\"", ECS_ERR_INVAL},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]", ".function.name must be",
         ECS_ERR_INVAL},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":3}}]",
         ".parameters must be", ECS_ERR_INVAL},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\","
         "\"function\":{\"name\":\"a\"}}]", "given twice", ECS_ERR_INVAL},
        {"\"tool_choice\":\"required\"", "'tool_choice' needs 'tools'", ECS_ERR_INVAL},
        {"\"tools\":[" WEATHER ",{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":"
         "{\"properties\":{\"s\":{\"pattern\":\"x\"}}}}}],\"tool_choice\":\"required\"",
         "the parameters of 'b' cannot constrain a forced call: json_schema: keyword 'pattern'",
         ECS_ERR_UNSUPPORTED},
        {"\"tools\":[" WEATHER "],\"tool_choice\":\"sometimes\"", "'tool_choice' must be", ECS_ERR_INVAL},
        {"\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"x\"}}",
         "'x' is not one of the tools", ECS_ERR_INVAL},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":"
         "\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"format\":\"date\"}}}}}],"
         "\"tool_choice\":\"required\"", "keyword 'format'", ECS_ERR_UNSUPPORTED},
        {"\"tools\":[" WEATHER "],\"tool_choice\":\"required\",\"response_format\":{\"type\":"
         "\"json_object\"}", "cannot be combined", ECS_ERR_INVAL},
        {"\"functions\":[{\"name\":\"a\"}]", "deprecated functions API", ECS_ERR_UNSUPPORTED},
        {"\"tools\":[" WEATHER "],\"parallel_tool_calls\":1", "'parallel_tool_calls' must be a boolean",
         ECS_ERR_INVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(j, sizeof j, "{%s,%s}", u, cases[i].extra);
        expect_error(API_ROUTE_CHAT, j, cases[i].code, cases[i].needle);
    }
    expect_error(API_ROUTE_COMPLETION, "{\"prompt\":\"x\",\"tools\":[" WEATHER "]}", ECS_ERR_INVAL,
                 "for chat requests");
    expect_error(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\",\"tool_calls\":"
                 "[{\"function\":{\"name\":\"a\"}}]}]}", ECS_ERR_INVAL, "only assistant messages");
    expect_error(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":"
                 "[{\"function\":{\"name\":5}}]}]}", ECS_ERR_INVAL, "tool_calls[0].function.name");
    expect_error(API_ROUTE_MESSAGES, "{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":"
                 "\"u\"}],\"tools\":[{\"name\":\"a\"}]}", ECS_ERR_INVAL, "input_schema is required");
    expect_error(API_ROUTE_MESSAGES, "{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":"
                 "\"u\"}],\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]}",
                 ECS_ERR_UNSUPPORTED, "server tools");
    expect_error(API_ROUTE_MESSAGES, "{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":"
                 "[{\"type\":\"tool_use\",\"id\":\"1\",\"name\":\"a\",\"input\":{}}]}]}",
                 ECS_ERR_UNSUPPORTED, "'tool_use' block");
}

static json_t *calls(api_tool_mode_t mode, const char *text, size_t *tl)
{
    api_req_t r = {.tool_mode = mode};
    return api_tools_calls(&r, "x", text, strlen(text), tl);
}

static const char *call_field(json_t *c, size_t k, const char *f)
{
    return json_string_value(json_object_get(json_object_get(json_array_get(c, k), "function"), f));
}

Test(api_tools, output_read_back)
{
    size_t tl;
    json_t *c = calls(API_TOOLS_AUTO, "Sure. \n<tool_call>\n{\"name\": \"a\", \"arguments\": "
                      "{\"x\": [1, 2]}}\n</tool_call>\n", &tl);
    cr_assert(c);
    cr_assert_eq(json_array_size(c), 1);
    cr_assert_eq(tl, 5); /* "Sure.", the blank before the call dropped */
    cr_assert_str_eq(call_field(c, 0, "name"), "a");
    cr_assert_str_eq(call_field(c, 0, "arguments"), "{\"x\":[1,2]}");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(c, 0), "id")), "call_x_0");
    json_decref(c);
    c = calls(API_TOOLS_AUTO, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n"
              "<tool_call>\n{\"name\":\"b\",\"arguments\":\"{\\\"k\\\":1}\"}\n</tool_call>", &tl);
    cr_assert(c);
    cr_assert_eq(json_array_size(c), 2);
    cr_assert_eq(tl, 0);
    cr_assert_str_eq(call_field(c, 1, "name"), "b");
    cr_assert_str_eq(call_field(c, 1, "arguments"), "{\"k\":1}"); /* a string: as given */
    json_decref(c);
    /* forced: the whole output is the call's object */
    c = calls(API_TOOLS_FORCED, " {\"name\": \"a\", \"arguments\": {\"u\": \"c\"}}", &tl);
    cr_assert(c);
    cr_assert_eq(tl, 0);
    cr_assert_str_eq(call_field(c, 0, "arguments"), "{\"u\":\"c\"}");
    json_decref(c);
    /* anything else stays text */
    const char *text[] = {
        "no call here",
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n", /* not closed */
        "<tool_call>{\"name\": \"a\"}</tool_call> and more",
        "<tool_call>{\"arguments\": {}}</tool_call>",          /* no name */
        "<tool_call>{\"name\": \"a\", \"arguments\": </tool_call>",
        "<tool_call>[1, 2]</tool_call>",
    };
    for (size_t i = 0; i < sizeof text / sizeof text[0]; i++) {
        cr_assert_null(calls(API_TOOLS_AUTO, text[i], &tl), "%s", text[i]);
        cr_assert_eq(tl, strlen(text[i]));
    }
    /* parallel_tool_calls false: the first call only */
    api_req_t one = {.tool_mode = API_TOOLS_AUTO, .one_call = true};
    const char *two = "<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":\"b\"}</tool_call>";
    c = api_tools_calls(&one, "x", two, strlen(two), &tl);
    cr_assert(c);
    cr_assert_eq(json_array_size(c), 1);
    cr_assert_str_eq(call_field(c, 0, "name"), "a");
    json_decref(c);
    cr_assert_null(calls(API_TOOLS_FORCED, "{\"name\": \"a\", \"argu", &tl)); /* cut by length */
    cr_assert_null(calls(API_TOOLS_OFF, "<tool_call>{\"name\":\"a\"}</tool_call>", &tl));
}

Test(api_tools, stream_holds_back_a_tag)
{
    api_req_t r = {.tool_mode = API_TOOLS_AUTO};
    struct { const char *t; size_t n; } cases[] = {
        {"plain text", 10}, {"abc <", 4}, {"abc <tool_ca", 4}, {"abc <tool_call>{\"na", 4},
        {"a <b> c", 7}, {"<tool_call", 0}, {"abc <tool_x", 11},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(api_tools_text_len(&r, cases[i].t, strlen(cases[i].t)), cases[i].n, "%s",
                     cases[i].t);
    r.tool_mode = API_TOOLS_FORCED;
    cr_assert_eq(api_tools_text_len(&r, "{\"name\"", 7), 0);
    r.tool_mode = API_TOOLS_OFF;
    cr_assert_eq(api_tools_text_len(&r, "abc <tool_call>", 15), 15);
}

Test(api_tools, templates_with_a_place_for_them)
{
    cr_assert_eq(api_tools_template(TOK_CHAT_CHATML), ECS_OK);
    cr_assert_eq(api_tools_template(TOK_CHAT_NONE), ECS_OK); /* the ChatML fallback */
    cr_assert_eq(api_tools_template(TOK_CHAT_DEEPSEEK2), ECS_ERR_UNSUPPORTED);
    cr_assert(strstr(ecs_errmsg(), "(deepseek2) has no place for tool calls"), "%s", ecs_errmsg());
    cr_assert_eq(api_tools_template(TOK_CHAT_DEEPSEEK3), ECS_OK); /* tools_v3.c */
}
