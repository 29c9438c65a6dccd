/* test_model_opts.c - the options of a model's run that ecs-run and
 * ecs-coordinator share (coordinator/model/opts.c). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "coordinator/model/model.h"

/* The options ecs-run and ecs-coordinator share (opts.c): each sets its
 * field, others are left to the caller, a bad --kv-type is an error, and
 * the repack directory is --no-repack's NULL before --repack's before the
 * default. */
Test(model_cli, options_and_repack_dir)
{
    model_cli_t o = {0};
    char buf[256];
    cr_assert(!model_cli_flag(&o, "--kv-type"));
    cr_assert(model_cli_takes_value("--kv-type") && model_cli_takes_value("--repack"));
    cr_assert(!model_cli_takes_value("--kv-f32") && !model_cli_takes_value("--threads"));
    cr_assert_eq(model_cli_opt(&o, "--threads", "2"), 0);
    cr_assert_eq(model_cli_opt(&o, "--kv-type", "bf16"), 1);
    cr_assert_eq(o.kv_flag, (unsigned)MODEL_CTX_KV_BF16);
    cr_assert_eq(model_cli_opt(&o, "--kv-type", "f8"), -1);
    cr_assert(strstr(ecs_errmsg(), "'f8'"), "%s", ecs_errmsg());
    cr_assert_eq(o.kv_flag, (unsigned)MODEL_CTX_KV_BF16, "a bad value changes nothing");
    cr_assert(model_cli_flag(&o, "--kv-f32"));
    cr_assert_eq(o.kv_flag, (unsigned)MODEL_CTX_KV_F32);
    cr_assert_eq(model_cli_opt(&o, "--kv-type", "f16"), 1);
    cr_assert_eq(o.kv_flag, 0u);

    setenv("ECS_CACHE_DIR", "/tmp/ecs-test-cli-cache", 1);
    cr_assert_str_eq(model_cli_repack_dir(&o, buf, sizeof buf), "/tmp/ecs-test-cli-cache");
    cr_assert_eq(model_cli_opt(&o, "--repack", "/x/y"), 1);
    cr_assert_str_eq(model_cli_repack_dir(&o, buf, sizeof buf), "/x/y");
    cr_assert(model_cli_flag(&o, "--no-repack"));
    cr_assert_null(model_cli_repack_dir(&o, buf, sizeof buf));
    unsetenv("ECS_CACHE_DIR");
}
