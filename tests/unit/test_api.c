/* test_api.c - the serving front's parsers: a request body into api_req_t
 * (every field, each mistake named in the message, unsupported features),
 * and the HTTP framing (split anywhere, pipelining, chunked bodies, the
 * header and body limits, garbage). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "api_fixture.h"

Test(api_req, chat_fields)
{
    api_req_t r;
    const char *j = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                    "{\"type\":\"text\",\"text\":\"b\"}]}],\"max_tokens\":7,\"temperature\":0.5,"
                    "\"top_p\":0.9,\"top_k\":4,\"min_p\":0.1,\"presence_penalty\":0.5,"
                    "\"frequency_penalty\":-1,\"repetition_penalty\":1.1,\"seed\":42,"
                    "\"stop\":[\"x\",\"yy\"],\"logprobs\":true,\"top_logprobs\":3,\"stream\":true,"
                    "\"stream_options\":{\"include_usage\":true},\"ignore_eos\":true,\"n\":1}";
    cr_assert_eq(parse(API_ROUTE_CHAT, j, &r), ECS_OK, "%s", err);
    cr_assert_str_eq(r.model, "m");
    cr_assert_eq(r.n_msgs, 2);
    cr_assert_str_eq(r.msgs[0].role, "system");
    cr_assert_str_eq(r.msgs[1].content, "ab");
    cr_assert_eq(r.max_tokens, 7);
    cr_assert_float_eq(r.sp.temp, 0.5f, 1e-6);
    cr_assert_eq(r.sp.top_k, 4);
    cr_assert_float_eq(r.sp.freq_penalty, -1.0f, 1e-6);
    cr_assert_eq(r.sp.seed, 42u);
    cr_assert(r.seed_given && r.stream && r.include_usage && r.ignore_eos);
    cr_assert_eq(r.n_stops, 2);
    cr_assert_str_eq(r.stops[1], "yy");
    cr_assert_eq(r.top_logprobs, 3);
    api_req_free(&r);
}

Test(api_req, completion_prompt_forms)
{
    api_req_t r;
    cr_assert_eq(parse(API_ROUTE_COMPLETION, "{\"prompt\":[5,6,7],\"logprobs\":2}", &r), ECS_OK, "%s", err);
    cr_assert_eq(r.n_prompt_ids, 3);
    cr_assert_eq(r.prompt_ids[2], 7);
    cr_assert_eq(r.top_logprobs, 2);
    cr_assert_eq(r.max_tokens, -1);
    api_req_free(&r);
    cr_assert_eq(parse(API_ROUTE_COMPLETION, "{\"prompt\":[\"hi\"],\"stop\":\"q\"}", &r), ECS_OK, "%s", err);
    cr_assert_str_eq(r.prompt, "hi");
    cr_assert_eq(r.n_stops, 1);
    cr_assert_eq(r.top_logprobs, -1);
    api_req_free(&r);
    expect_error(API_ROUTE_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", ECS_ERR_UNSUPPORTED, "several prompts");
    expect_error(API_ROUTE_COMPLETION, "{\"prompt\":[1,-2]}", ECS_ERR_INVAL, "'prompt'[1]");
    expect_error(API_ROUTE_COMPLETION, "{}", ECS_ERR_INVAL, "'prompt' is required");
}

Test(api_req, anthropic_messages)
{
    api_req_t r;
    const char *j = "{\"model\":\"m\",\"max_tokens\":3,\"system\":[{\"type\":\"text\",\"text\":\"sys\"}],"
                    "\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"stop_sequences\":[\"s\"]}";
    cr_assert_eq(parse(API_ROUTE_MESSAGES, j, &r), ECS_OK, "%s", err);
    cr_assert_eq(r.n_msgs, 2);
    cr_assert_str_eq(r.msgs[0].role, "system");
    cr_assert_str_eq(r.msgs[0].content, "sys");
    cr_assert_eq(r.n_stops, 1);
    api_req_free(&r);
    expect_error(API_ROUTE_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}]}",
                 ECS_ERR_INVAL, "'max_tokens' is required");
    expect_error(API_ROUTE_MESSAGES,
                 "{\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":\"u\"}]}",
                 ECS_ERR_INVAL, "messages[0].role");
}

Test(api_req, mistakes_are_named)
{
    const char *m = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char j[512];
    expect_error(API_ROUTE_CHAT, "{\"messages\":[", ECS_ERR_INVAL, "not valid JSON");
    expect_error(API_ROUTE_CHAT, "[1]", ECS_ERR_INVAL, "must be a JSON object");
    expect_error(API_ROUTE_CHAT, "{\"a\":1,\"a\":2}", ECS_ERR_INVAL, "not valid JSON");
    snprintf(j, sizeof j, "{%s,\"max_tokens\":\"5\"}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_INVAL, "'max_tokens' must be an integer");
    snprintf(j, sizeof j, "{%s,\"max_tokens\":0}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_INVAL, "'max_tokens' must be between");
    snprintf(j, sizeof j, "{%s,\"temperature\":3}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_INVAL, "'temperature' must be between");
    snprintf(j, sizeof j, "{%s,\"top_p\":\"x\"}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_INVAL, "'top_p' must be a number");
    snprintf(j, sizeof j, "{%s,\"stream\":1}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_INVAL, "'stream' must be a boolean");
    snprintf(j, sizeof j, "{%s,\"stop\":[1]}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_INVAL, "'stop' entries must be strings");
    snprintf(j, sizeof j, "{%s,\"top_logprobs\":2}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_INVAL, "needs 'logprobs'");
    snprintf(j, sizeof j, "{%s,\"model\":5}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_INVAL, "'model' must be a string");
    expect_error(API_ROUTE_CHAT, "{\"messages\":[]}", ECS_ERR_INVAL, "must not be empty");
    expect_error(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":{}}]}", ECS_ERR_INVAL,
                 "messages[0].content must be");
    expect_error(API_ROUTE_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
                 ECS_ERR_UNSUPPORTED, "'image_url' is not supported");
}

Test(api_req, unsupported_features)
{
    const char *m = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char j[512];
    snprintf(j, sizeof j, "{%s,\"n\":3}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_UNSUPPORTED, "'n' is 3");
    snprintf(j, sizeof j, "{%s,\"tools\":[{\"type\":\"function\"}]}", m);
    expect_error(API_ROUTE_CHAT, j, ECS_ERR_INVAL, "'tools'[0].function must be an object");
    snprintf(j, sizeof j, "{%s,\"tools\":[]}", m); /* an empty list asks for nothing */
    api_req_t r;
    cr_assert_eq(parse(API_ROUTE_CHAT, j, &r), ECS_OK, "%s", err);
    api_req_free(&r);
    expect_error(API_ROUTE_CHAT, "{\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}",
                 ECS_ERR_UNSUPPORTED, "role 'function'");
}

/* Feeds s to a fresh parser in pieces of `step` bytes. */
static api_http_status_t feed_steps(api_http_t *h, const char *s, size_t step, size_t *consumed)
{
    size_t n = strlen(s), off = 0;
    api_http_status_t st = API_HTTP_MORE;
    while (off < n) {
        size_t len = n - off < step ? n - off : step, used = 0;
        st = api_http_feed(h, s + off, len, &used);
        off += used;
        if (st != API_HTTP_MORE)
            break;
    }
    *consumed = off;
    return st;
}

Test(api_http, split_anywhere_same_request)
{
    const char *req = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\n"
                      "Content-Length: 13\r\n\r\n{\"prompt\":\"\"}";
    for (size_t step = 1; step <= strlen(req); step += 7) {
        api_http_t *h;
        cr_assert_eq(api_http_new(4096, 4096, &h), ECS_OK);
        size_t used;
        cr_assert_eq(feed_steps(h, req, step, &used), API_HTTP_DONE, "step %zu", step);
        cr_assert_eq(used, strlen(req));
        cr_assert_str_eq(api_http_method(h), "POST");
        cr_assert_str_eq(api_http_path(h), "/v1/completions");
        cr_assert_str_eq(api_http_header(h, "x-api-key"), "k1");
        cr_assert_null(api_http_header(h, "authorization"));
        size_t bl;
        cr_assert_str_eq(api_http_body(h, &bl), "{\"prompt\":\"\"}");
        cr_assert(api_http_keep_alive(h));
        api_http_free(h);
    }
}

Test(api_http, pipelined_and_chunked)
{
    const char *two = "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                      "GET /b HTTP/1.1\r\nConnection: close\r\n\r\n";
    api_http_t *h;
    cr_assert_eq(api_http_new(4096, 4096, &h), ECS_OK);
    size_t used, bl;
    cr_assert_eq(api_http_feed(h, two, strlen(two), &used), API_HTTP_DONE);
    cr_assert_str_eq(api_http_body(h, &bl), "abcde");
    cr_assert_lt(used, strlen(two));
    api_http_next(h);
    size_t used2;
    cr_assert_eq(api_http_feed(h, two + used, strlen(two) - used, &used2), API_HTTP_DONE);
    cr_assert_str_eq(api_http_path(h), "/b");
    cr_assert_not(api_http_keep_alive(h));
    api_http_free(h);
}

Test(api_http, limits_and_garbage)
{
    api_http_t *h;
    size_t used;
    char big[2048];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char req[4096];
    snprintf(req, sizeof req, "GET / HTTP/1.1\r\nX: %s\r\n\r\n", big);
    cr_assert_eq(api_http_new(1024, 4096, &h), ECS_OK);
    cr_assert_eq(api_http_feed(h, req, strlen(req), &used), API_HTTP_TOO_LARGE_HDR);
    api_http_free(h);

    cr_assert_eq(api_http_new(1024, 100, &h), ECS_OK);
    const char *cl = "POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n";
    cr_assert_eq(api_http_feed(h, cl, strlen(cl), &used), API_HTTP_TOO_LARGE_BODY);
    api_http_free(h);

    cr_assert_eq(api_http_new(1024, 4, &h), ECS_OK);
    const char *ch = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n";
    cr_assert_eq(api_http_feed(h, ch, strlen(ch), &used), API_HTTP_TOO_LARGE_BODY);
    api_http_free(h);

    cr_assert_eq(api_http_new(1024, 4096, &h), ECS_OK);
    cr_assert_eq(api_http_feed(h, "\x01\x02 garbage\r\n\r\n", 14, &used), API_HTTP_ERR);
    api_http_free(h);
}
