/* test_err.c - the thread-local error message: a message that wraps the
 * previous one (ecs_errmsg() as an argument) keeps it whole; a log line is
 * prefix, message and newline, cut (still ending its line) when too long. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"

Test(err, wraps_previous_message)
{
    ecs_error(ECS_ERR_NOTFOUND, "f.gguf: missing metadata key '%s'", "x.block_count");
    ecs_err_t e = ecs_error(ECS_ERR_NOTFOUND, "f.gguf: metadata %s: %s", "x.block_count",
                            ecs_errmsg());
    cr_assert_eq(e, ECS_ERR_NOTFOUND);
    cr_assert_str_eq(ecs_errmsg(),
                     "f.gguf: metadata x.block_count: f.gguf: missing metadata key 'x.block_count'");
}

Test(err, wrap_truncates_safely)
{
    char big[600];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ecs_error(ECS_ERR_FORMAT, "%s", big);
    ecs_error(ECS_ERR_FORMAT, "outer: %s", ecs_errmsg());
    cr_assert_eq(strncmp(ecs_errmsg(), "outer: aaaa", 11), 0, "%s", ecs_errmsg());
    cr_assert_lt(strlen(ecs_errmsg()), 512);
}

static void log_line(const char *prefix, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(const char *prefix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ecs_logv(prefix, fmt, ap);
    va_end(ap);
}

/* What one call writes to stderr, read back through a pipe. */
static size_t logged(char *out, size_t cap, const char *prefix, const char *msg)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fflush(stderr);
    const int saved = dup(2);
    dup2(p[1], 2);
    log_line(prefix, "%s", msg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    const ssize_t n = read(p[0], out, cap - 1);
    char more;
    cr_assert_eq(read(p[0], &more, 1), 0, "nothing after the line");
    close(p[0]);
    cr_assert(n > 0);
    out[n] = 0;
    return (size_t)n;
}

Test(err, log_line_is_one_write_with_newline_and_cut_when_long)
{
    char got[4096];
    logged(got, sizeof got, "dispatch: ", "replication: auto -> 2");
    cr_assert_str_eq(got, "dispatch: replication: auto -> 2\n");
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    const size_t n = logged(got, sizeof got, "w0: ", big);
    cr_assert(n > 1000 && n < sizeof big, "cut: %zu", n);
    cr_assert_eq(got[n - 1], '\n', "a cut line still ends its line");
    cr_assert_eq(strncmp(got, "w0: xxx", 7), 0);
}
