/* test_dispatch_opts.c - the wire options of the dispatcher's command line:
 * --wire-act (q8 default, f32) and --wire-result (f32 default, bf16) are
 * taken with their values and a bad value is refused naming the option;
 * --replication takes auto or 1..8;
 * --micro-batches needs workers; --data-plane defaults to auto;
 * --shared-experts takes auto (the default), worker or coordinator;
 * --pin-threads auto (the default), on or off. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/dispatch/dispatch.h"

Test(dispatch_opts, wire_act)
{
    dispatch_opts_t o = {0};
    cr_assert(dispatch_opt_takes_value("--wire-act"));
    cr_assert_eq(dispatch_parse_opt(&o, "--wire-act", "f32"), 1);
    cr_assert(o.wire_f32);
    cr_assert_eq(dispatch_parse_opt(&o, "--wire-act", "q8"), 1);
    cr_assert(!o.wire_f32);
    cr_assert_eq(dispatch_parse_opt(&o, "--wire-act", "q4"), -1);
    cr_assert(strstr(ecs_errmsg(), "--wire-act"), "%s", ecs_errmsg());
    cr_assert_eq(dispatch_parse_opt(&o, "--wire-act", NULL), -1);
}

Test(dispatch_opts, wire_result)
{
    dispatch_opts_t o = {0};
    cr_assert(dispatch_opt_takes_value("--wire-result"));
    cr_assert_eq(dispatch_parse_opt(&o, "--wire-result", "bf16"), 1);
    cr_assert(o.wire_bf16);
    cr_assert_eq(dispatch_parse_opt(&o, "--wire-result", "f32"), 1);
    cr_assert(!o.wire_bf16);
    cr_assert_eq(dispatch_parse_opt(&o, "--wire-result", "f16"), -1);
    cr_assert(strstr(ecs_errmsg(), "--wire-result"), "%s", ecs_errmsg());
    /* not a dispatcher option: left to the program */
    cr_assert_eq(dispatch_parse_opt(&o, "--wire", "x"), 0);
}

Test(dispatch_opts, shared_experts)
{
    dispatch_opts_t o = {0};
    cr_assert_eq(o.shared_experts, 0, "auto by default");
    cr_assert(dispatch_opt_takes_value("--shared-experts"));
    cr_assert_eq(dispatch_parse_opt(&o, "--shared-experts", "worker"), 1);
    cr_assert_eq(o.shared_experts, 2);
    cr_assert_eq(dispatch_parse_opt(&o, "--shared-experts", "coordinator"), 1);
    cr_assert_eq(o.shared_experts, 1);
    cr_assert_eq(dispatch_parse_opt(&o, "--shared-experts", "auto"), 1);
    cr_assert_eq(o.shared_experts, 0);
    cr_assert_eq(dispatch_parse_opt(&o, "--shared-experts", "gpu"), -1);
    cr_assert(strstr(ecs_errmsg(), "--shared-experts") && strstr(ecs_errmsg(), "gpu"), "%s",
              ecs_errmsg());
    cr_assert_eq(dispatch_parse_opt(&o, "--shared-experts", NULL), -1);
}

Test(dispatch_opts, pin_threads)
{
    dispatch_opts_t o = {0};
    cr_assert_eq(o.pin_threads, 0, "auto by default");
    cr_assert(dispatch_opt_takes_value("--pin-threads"));
    cr_assert_eq(dispatch_parse_opt(&o, "--pin-threads", "on"), 1);
    cr_assert_eq(o.pin_threads, 2);
    cr_assert_eq(dispatch_parse_opt(&o, "--pin-threads", "off"), 1);
    cr_assert_eq(o.pin_threads, 1);
    cr_assert_eq(dispatch_parse_opt(&o, "--pin-threads", "auto"), 1);
    cr_assert_eq(o.pin_threads, 0);
    cr_assert_eq(dispatch_parse_opt(&o, "--pin-threads", "yes"), -1);
    cr_assert(strstr(ecs_errmsg(), "--pin-threads") && strstr(ecs_errmsg(), "yes"), "%s",
              ecs_errmsg());
}

/* --micro-batches 1..MODEL_MAX_MICRO, and only with workers: the local
 * experts have no calls out to overlap. */
Test(dispatch_opts, micro_batches)
{
    dispatch_opts_t o = {0};
    cr_assert(dispatch_opt_takes_value("--micro-batches"));
    cr_assert_eq(dispatch_opts_check(&o), ECS_OK);
    cr_assert_eq(dispatch_parse_opt(&o, "--micro-batches", "2"), 1);
    cr_assert_eq(o.micro_batches, 2);
    cr_assert_eq(dispatch_opts_check(&o), ECS_ERR_INVAL);
    cr_assert(strstr(ecs_errmsg(), "needs expert workers"), "%s", ecs_errmsg());
    cr_assert_eq(dispatch_parse_opt(&o, "--spawn-workers", "1"), 1);
    cr_assert_eq(dispatch_opts_check(&o), ECS_OK);
    cr_assert_eq(dispatch_parse_opt(&o, "--micro-batches", "0"), -1);
    cr_assert_eq(dispatch_parse_opt(&o, "--micro-batches", "5"), -1);
    cr_assert(strstr(ecs_errmsg(), "--micro-batches"), "%s", ecs_errmsg());
}

/* --data-plane: auto is the default, then ECS_DATA_PLANE, then the option;
 * a bad value is refused naming the option. */
Test(dispatch_opts, data_plane)
{
    dispatch_opts_t o = {0};
    cr_assert(dispatch_opt_takes_value("--data-plane"));
    unsetenv("ECS_DATA_PLANE");
    cr_assert_eq(dispatch_plane_of(&o), 2, "the default is auto");
    setenv("ECS_DATA_PLANE", "zmq", 1);
    cr_assert_eq(dispatch_plane_of(&o), 1);
    setenv("ECS_DATA_PLANE", "bogus", 1);
    cr_assert_eq(dispatch_plane_of(&o), 2, "a bad environment value leaves the default");
    cr_assert_eq(dispatch_opts_check(&o), ECS_OK, "no workers: the plane is moot");
    o.spawn_workers = 2;
    cr_assert_eq(dispatch_opts_check(&o), ECS_ERR_INVAL, "with workers the check refuses it");
    cr_assert(strstr(ecs_errmsg(), "ECS_DATA_PLANE='bogus'"), "%s", ecs_errmsg());
    cr_assert_eq(dispatch_parse_opt(&o, "--data-plane", "shm"), 1);
    cr_assert_eq(dispatch_plane_of(&o), 3, "the option wins over the environment");
    cr_assert_eq(dispatch_opts_check(&o), ECS_OK, "and a bad environment value is then moot");
    cr_assert_eq(dispatch_parse_opt(&o, "--data-plane", "zmq"), 1);
    cr_assert_eq(dispatch_plane_of(&o), 1);
    cr_assert_eq(dispatch_parse_opt(&o, "--data-plane", "rdma"), -1);
    cr_assert(strstr(ecs_errmsg(), "--data-plane"), "%s", ecs_errmsg());
    unsetenv("ECS_DATA_PLANE");
}

/* --replication: auto (0, the default) or 1..PLACEMENT_MAX_HOLDERS; a bad
 * value is refused naming the option and what it takes. */
Test(dispatch_opts, replication)
{
    dispatch_opts_t o = {0};
    cr_assert(dispatch_opt_takes_value("--replication"));
    cr_assert_eq(o.replication, 0, "auto is the zero value");
    cr_assert_eq(dispatch_parse_opt(&o, "--replication", "2"), 1);
    cr_assert_eq(o.replication, 2);
    cr_assert_eq(dispatch_parse_opt(&o, "--replication", "auto"), 1);
    cr_assert_eq(o.replication, 0);
    cr_assert_eq(dispatch_parse_opt(&o, "--replication", "8"), 1);
    cr_assert_eq(o.replication, PLACEMENT_MAX_HOLDERS);
    const char *bad[] = {"0", "9", "-1", "two", "", "2x", "Auto"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        o.replication = 3;
        cr_assert_eq(dispatch_parse_opt(&o, "--replication", bad[i]), -1, "'%s'", bad[i]);
        cr_assert(strstr(ecs_errmsg(), "--replication: bad value") &&
                  strstr(ecs_errmsg(), "auto, or 1 to 8"), "%s", ecs_errmsg());
        cr_assert_eq(o.replication, 3, "'%s' left the value alone", bad[i]);
    }
    cr_assert_eq(dispatch_parse_opt(&o, "--replication", NULL), -1);
}
