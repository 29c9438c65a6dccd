/* err.c - the thread-local error message behind ecs_error()/ecs_errmsg(). */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char errbuf[512];

ecs_err_t ecs_error(ecs_err_t code, const char *fmt, ...)
{
    /* formatted aside first: a message that wraps the previous one passes
     * ecs_errmsg(), i.e. errbuf itself, as an argument */
    char tmp[sizeof errbuf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(errbuf, tmp, sizeof errbuf);
    return code;
}

const char *ecs_errmsg(void) { return errbuf; }

void ecs_clear_error(void) { errbuf[0] = '\0'; }

const char *ecs_errname(ecs_err_t code)
{
    static const char *const names[] = {
        "ok", "invalid argument", "out of memory", "i/o error", "format error",
        "not found", "type error", "unsupported", "out of range", "internal error",
    };
    if ((unsigned)code < sizeof names / sizeof names[0])
        return names[code];
    return "unknown error";
}

void ecs_logv(const char *prefix, const char *fmt, va_list ap)
{
    char line[2048];
    int n = snprintf(line, sizeof line - 1, "%s", prefix);
    if (n < 0 || n >= (int)sizeof line - 1)
        n = 0;
    const int m = vsnprintf(line + n, sizeof line - 1 - (size_t)n, fmt, ap);
    n = m < 0 ? n : (n + m > (int)sizeof line - 2 ? (int)sizeof line - 2 : n + m);
    line[n++] = '\n';
    line[n] = 0;
    fputs(line, stderr);
}
