/* err.h - error codes and the thread-local error message shared by every module.
 *
 * A failing function returns an ecs_err_t and, through ecs_error(), leaves a
 * human-readable message (naming the file, field, offset...) that the caller
 * can print with ecs_errmsg(). Library code never exits. */
#ifndef ECS_ERR_H
#define ECS_ERR_H

#include <stdarg.h>

typedef enum {
    ECS_OK = 0,
    ECS_ERR_INVAL = 1,       /* bad argument or bad user input */
    ECS_ERR_NOMEM = 2,       /* allocation failed or budget exceeded */
    ECS_ERR_IO = 3,          /* open/read/write/mmap failed */
    ECS_ERR_FORMAT = 4,      /* malformed file or message */
    ECS_ERR_NOTFOUND = 5,    /* missing key, tensor, token... */
    ECS_ERR_TYPE = 6,        /* value has the wrong type */
    ECS_ERR_UNSUPPORTED = 7, /* valid but not implemented here */
    ECS_ERR_RANGE = 8,       /* value out of the allowed range */
    ECS_ERR_INTERNAL = 9,
} ecs_err_t;

/* Sets the thread's error message (printf format) and returns code, so that
 * error paths read `return ecs_error(ECS_ERR_FORMAT, "...", ...);`. The
 * arguments may include ecs_errmsg() to wrap the previous message:
 * `ecs_error(e, "%s: metadata %s: %s", path, key, ecs_errmsg())`. */
ecs_err_t ecs_error(ecs_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The last message set on this thread ("" if none). */
const char *ecs_errmsg(void);

/* Short name of a code, e.g. "format". */
const char *ecs_errname(ecs_err_t code);

void ecs_clear_error(void);

/* Writes "prefix" + the formatted message + "\n" to stderr in one write, so
 * that the lines of processes sharing a terminal (a coordinator and the
 * workers it spawned) do not interleave mid-line. Long lines are cut. */
void ecs_logv(const char *prefix, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

#endif
