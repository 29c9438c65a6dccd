/* test_err.c - the thread-local error message: a message that wraps the
 * previous one (ecs_errmsg() as an argument) keeps it whole. */
#include <criterion/criterion.h>
#include <string.h>

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
