/* hparse.c - one connection's HTTP/1.1 request parser: libhttp-parser with
 * the server's limits on header and body bytes. The parser pauses at the
 * end of each request, so pipelined bytes wait until it is answered. */
#include <http_parser.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api.h"

struct api_http {
    http_parser p;
    size_t max_header, max_body;
    char *hdr;             /* url NUL, then name NUL value NUL pairs */
    size_t hdr_len;
    int last;              /* 0 url, 1 field, 2 value */
    size_t path_len;
    char *body;
    size_t body_len, body_cap;
    bool started, done, want_continue;
    api_http_status_t over;
};

static int hdr_add(api_http_t *h, const char *s, size_t n, int kind)
{
    if (h->hdr_len && kind != h->last) { /* a new piece begins: end the previous */
        if (h->hdr_len + 1 > h->max_header)
            goto over;
        h->hdr[h->hdr_len++] = '\0';
    }
    h->last = kind;
    if (n > h->max_header - h->hdr_len)
        goto over;
    memcpy(h->hdr + h->hdr_len, s, n);
    h->hdr_len += n;
    return 0;
over:
    h->over = API_HTTP_TOO_LARGE_HDR;
    return 1;
}

static int on_begin(http_parser *p)
{
    api_http_t *h = p->data;
    h->started = true;
    return 0;
}

static int on_url(http_parser *p, const char *s, size_t n)
{
    api_http_t *h = p->data;
    h->started = true;
    return hdr_add(h, s, n, 0);
}

static int on_field(http_parser *p, const char *s, size_t n)
{
    return hdr_add(p->data, s, n, 1);
}

static int on_value(http_parser *p, const char *s, size_t n)
{
    return hdr_add(p->data, s, n, 2);
}

static int on_headers(http_parser *p)
{
    api_http_t *h = p->data;
    if (h->hdr_len + 1 > h->max_header) {
        h->over = API_HTTP_TOO_LARGE_HDR;
        return 1;
    }
    h->hdr[h->hdr_len++] = '\0';
    h->last = 3;
    const char *url = h->hdr, *q = strchr(url, '?');
    h->path_len = q ? (size_t)(q - url) : strlen(url);
    if (!(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX &&
        p->content_length > h->max_body) {
        h->over = API_HTTP_TOO_LARGE_BODY;
        return 1;
    }
    const char *e = api_http_header(h, "expect");
    if (e && strcasecmp(e, "100-continue") == 0)
        h->want_continue = true;
    return 0;
}

static int on_body(http_parser *p, const char *s, size_t n)
{
    api_http_t *h = p->data;
    if (n > h->max_body - h->body_len) {
        h->over = API_HTTP_TOO_LARGE_BODY;
        return 1;
    }
    if (h->body_len + n + 1 > h->body_cap) {
        size_t cap = h->body_cap ? h->body_cap : 4096;
        while (cap < h->body_len + n + 1)
            cap *= 2;
        if (cap > h->max_body + 1)
            cap = h->max_body + 1;
        char *b = realloc(h->body, cap);
        if (!b) {
            h->over = API_HTTP_TOO_LARGE_BODY;
            return 1;
        }
        h->body = b;
        h->body_cap = cap;
    }
    memcpy(h->body + h->body_len, s, n);
    h->body_len += n;
    h->body[h->body_len] = '\0';
    return 0;
}

static int on_complete(http_parser *p)
{
    api_http_t *h = p->data;
    h->done = true;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_begin,
    .on_url = on_url,
    .on_header_field = on_field,
    .on_header_value = on_value,
    .on_headers_complete = on_headers,
    .on_body = on_body,
    .on_message_complete = on_complete,
};

ecs_err_t api_http_new(size_t max_header, size_t max_body, api_http_t **out)
{
    api_http_t *h = calloc(1, sizeof *h);
    if (!h || !(h->hdr = malloc(max_header + 1))) {
        free(h);
        return ecs_error(ECS_ERR_NOMEM, "http: out of memory");
    }
    h->max_header = max_header;
    h->max_body = max_body;
    http_parser_init(&h->p, HTTP_REQUEST);
    h->p.data = h;
    *out = h;
    return ECS_OK;
}

void api_http_free(api_http_t *h)
{
    if (!h)
        return;
    free(h->hdr);
    free(h->body);
    free(h);
}

api_http_status_t api_http_feed(api_http_t *h, const char *buf, size_t len, size_t *used)
{
    *used = 0;
    if (h->done)
        return API_HTTP_DONE;
    if (h->over)
        return h->over;
    size_t n = http_parser_execute(&h->p, &settings, buf, len);
    *used = n;
    if (h->over)
        return h->over;
    if (h->done)
        return API_HTTP_DONE;
    if (HTTP_PARSER_ERRNO(&h->p) != HPE_OK)
        return API_HTTP_ERR;
    if (n != len) /* the parser stopped without saying why */
        return API_HTTP_ERR;
    return API_HTTP_MORE;
}

void api_http_next(api_http_t *h)
{
    h->hdr_len = 0;
    h->last = 0;
    h->path_len = 0;
    h->body_len = 0;
    h->started = h->done = h->want_continue = false;
    http_parser_pause(&h->p, 0);
}

bool api_http_started(const api_http_t *h)
{
    return h->started;
}

bool api_http_take_continue(api_http_t *h)
{
    bool c = h->want_continue;
    h->want_continue = false;
    return c;
}

const char *api_http_method(const api_http_t *h)
{
    return http_method_str((enum http_method)h->p.method);
}

const char *api_http_path(const api_http_t *h)
{
    static __thread char path[512];
    size_t n = h->path_len < sizeof path - 1 ? h->path_len : sizeof path - 1;
    memcpy(path, h->hdr, n);
    path[n] = '\0';
    return path;
}

const char *api_http_header(const api_http_t *h, const char *name)
{
    if (h->last != 3)
        return NULL;
    const char *p = h->hdr + strlen(h->hdr) + 1, *end = h->hdr + h->hdr_len;
    while (p < end) {
        const char *v = p + strlen(p) + 1;
        if (v >= end)
            break;
        if (strcasecmp(p, name) == 0)
            return v;
        p = v + strlen(v) + 1;
    }
    return NULL;
}

const char *api_http_body(const api_http_t *h, size_t *len)
{
    *len = h->body_len;
    return h->body ? h->body : "";
}

bool api_http_keep_alive(const api_http_t *h)
{
    return http_should_keep_alive(&h->p) != 0;
}
