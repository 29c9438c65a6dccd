/* buf.c - api_buf_t, the growable byte buffer the replies and the tool
 * renderings are built in (split from server.c so the request parser's
 * fuzz target links it without the event loop). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_int.h"

void api_buf_add(api_buf_t *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (n > b->cap - b->len || !b->p) {
        size_t cap = b->cap ? b->cap : 512;
        while (cap - b->len < n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

void api_buf_puts(api_buf_t *b, const char *s)
{
    api_buf_add(b, s, strlen(s));
}

void api_buf_printf(api_buf_t *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        api_buf_add(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->failed = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    api_buf_add(b, big, (size_t)n);
    free(big);
}

void api_buf_free(api_buf_t *b)
{
    free(b->p);
    *b = (api_buf_t){0};
}
