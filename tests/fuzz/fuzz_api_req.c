/* fuzz_api_req.c - libFuzzer target for the request path of ecs-coordinator
 * before the model: bytes of one connection through the HTTP parser (fed in
 * two pieces, cut where the first byte says, pipelined requests included)
 * and each complete request's body through the JSON request parser of its
 * route, and through the reading of tool calls out of a model's output
 * (tools.c, tools_v3.c; both modes, both forms) and the split of its reasoning (reasoning.c). Limits are small so the size checks are reached. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "coordinator/api/api_int.h"

static void parse_body(api_http_t *h)
{
    const char *path = api_http_path(h);
    api_route_t route = strstr(path, "messages")      ? API_ROUTE_MESSAGES
                        : strstr(path, "/completions") && !strstr(path, "chat") ? API_ROUTE_COMPLETION
                                                                                 : API_ROUTE_CHAT;
    size_t len;
    const char *body = api_http_body(h, &len);
    (void)api_http_header(h, "authorization");
    (void)api_http_keep_alive(h);
    (void)api_http_method(h);
    api_req_t r;
    char err[256];
    /* tool calls in both forms: Qwen's (ChatML) and DeepSeek-V3's */
    const tok_chat_kind_t kind = len % 2 ? TOK_CHAT_DEEPSEEK3 : TOK_CHAT_CHATML;
    if (api_req_parse(route, kind, body, len, &r, err, sizeof err) == ECS_OK)
        api_req_free(&r);
    for (int mode = API_TOOLS_AUTO; mode <= 2 * API_TOOLS_FORCED; mode++) {
        const bool v3 = mode > API_TOOLS_FORCED;
        api_req_t t = {.tool_mode = (api_tool_mode_t)(v3 ? mode - API_TOOLS_FORCED : mode),
                       .chat = v3 ? TOK_CHAT_DEEPSEEK3 : TOK_CHAT_CHATML, .call_name = "f"};
        size_t tl = 0;
        json_t *c = api_tools_calls(&t, "f", body, len, &tl);
        if (tl > len || (c && !json_is_array(c)) || api_tools_text_len(&t, body, len) > len)
            __builtin_trap();
        json_decref(c);
    }
    for (int k = 0; k < 4; k++) { /* reasoning.c's split of an output: opened or not, partial */
        api_think_span_t s;
        api_think_split(body, len, k & 1, k >> 1, &s);
        if (s.r_off > s.r_end || s.r_end > s.c_off || s.c_off > len)
            __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t cut = data[0] % (size + 1) < size ? data[0] % (size + 1) : size;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    cut = cut < n ? cut : n;
    api_http_t *h;
    if (api_http_new(2048, 16384, &h) != ECS_OK)
        return 0;
    const char *piece[2] = {p, p + cut};
    size_t left[2] = {cut, n - cut};
    for (int k = 0; k < 2; k++) {
        while (left[k] > 0) {
            size_t used = 0;
            api_http_status_t st = api_http_feed(h, piece[k], left[k], &used);
            piece[k] += used;
            left[k] -= used;
            if (st == API_HTTP_DONE) {
                parse_body(h);
                api_http_next(h);
                continue;
            }
            if (st != API_HTTP_MORE)
                goto out;
            if (used == 0)
                break;
        }
    }
out:
    api_http_free(h);
    return 0;
}
