/* opts.c - the dispatcher's command-line options, shared by every program
 * that can run its experts on workers (ecs-run, ecs-coordinator), so they
 * spell and check them the same way. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli.h"
#include "coordinator/dispatch/dispatch.h"

static const char *const with_value[] = {"--control",    "--spawn-workers",  "--replication",
                                         "--placement",  "--min-workers",    "--worker-threads",
                                         "--worker-mem-budget", "--worker-bin", "--call-timeout",
                                         "--call-retry", "--curve-key", "--curve-clients",
                                         "--wire-act", "--wire-result", "--micro-batches",
                                         "--data-plane", "--shared-experts", "--pin-threads"};

int dispatch_plane_mode(const char *v)
{
    return !v || !*v ? 0 : !strcmp(v, "zmq") ? 1 : !strcmp(v, "auto") ? 2
                          : !strcmp(v, "shm") ? 3 : -1;
}

int dispatch_plane_of(const dispatch_opts_t *o)
{
    if (o->data_plane > 0)
        return o->data_plane;
    const int env = dispatch_plane_mode(getenv("ECS_DATA_PLANE"));
    /* auto by default: on the full ds2-lite a worker through shared memory
     * decoded at 1.02x/0.90x of one process against ZeroMQ's 1.15x/0.84x,
     * 2 workers 0.93x/0.72x against 0.78x/0.52x (docs/benchmarks.md,
     * "Quiet run of 2026-12-02") */
    return env > 0 ? env : 2;
}

int dispatch_shared_mode(const char *v)
{
    return !strcmp(v, "auto") ? 0 : !strcmp(v, "coordinator") ? 1 : !strcmp(v, "worker") ? 2 : -1;
}

int dispatch_pin_mode(const char *v)
{
    return !strcmp(v, "auto") ? 0 : !strcmp(v, "off") ? 1 : !strcmp(v, "on") ? 2 : -1;
}

bool dispatch_opt_takes_value(const char *opt)
{
    for (size_t i = 0; i < sizeof with_value / sizeof *with_value; i++)
        if (!strcmp(opt, with_value[i]))
            return true;
    return false;
}

int dispatch_parse_opt(dispatch_opts_t *o, const char *opt, const char *v)
{
    if (!dispatch_opt_takes_value(opt))
        return 0;
    if (!v) {
        ecs_error(ECS_ERR_INVAL, "%s needs a value", opt);
        return -1;
    }
    if (!strcmp(opt, "--control")) {
        if (strncmp(v, "tcp://", 6) && strncmp(v, "ipc://", 6)) {
            ecs_error(ECS_ERR_INVAL, "--control: '%s' is not tcp://HOST:PORT or ipc://PATH", v);
            return -1;
        }
        o->control = v;
    } else if (!strcmp(opt, "--spawn-workers")) {
        if (!ecs_parse_int(v, 0, 256, &o->spawn_workers))
            goto bad;
    } else if (!strcmp(opt, "--replication")) {
        if (!strcmp(v, "auto")) {
            o->replication = 0;
        } else if (!ecs_parse_int(v, 1, PLACEMENT_MAX_HOLDERS, &o->replication)) {
            ecs_error(ECS_ERR_RANGE, "--replication: bad value '%s' (auto, or 1 to %d holders "
                      "per expert)", v, PLACEMENT_MAX_HOLDERS);
            return -1;
        }
    } else if (!strcmp(opt, "--min-workers")) {
        if (!ecs_parse_int(v, 1, PLACEMENT_MAX_WORKERS, &o->min_workers))
            goto bad;
    } else if (!strcmp(opt, "--worker-threads")) {
        if (!ecs_parse_int(v, 1, 1024, &o->worker_threads))
            goto bad;
    } else if (!strcmp(opt, "--data-plane")) {
        if ((o->data_plane = dispatch_plane_mode(v)) < 0)
            goto bad;
    } else if (!strcmp(opt, "--shared-experts")) {
        if ((o->shared_experts = dispatch_shared_mode(v)) < 0) {
            ecs_error(ECS_ERR_RANGE, "--shared-experts: bad value '%s' (auto, worker or "
                      "coordinator)", v);
            return -1;
        }
    } else if (!strcmp(opt, "--pin-threads")) {
        if ((o->pin_threads = dispatch_pin_mode(v)) < 0) {
            ecs_error(ECS_ERR_RANGE, "--pin-threads: bad value '%s' (auto, on or off)", v);
            return -1;
        }
    } else if (!strcmp(opt, "--worker-bin")) {
        o->worker_bin = v;
    } else if (!strcmp(opt, "--call-timeout")) {
        if (!ecs_parse_int(v, 1, 3600 * 1000, &o->call_timeout_ms))
            goto bad;
    } else if (!strcmp(opt, "--call-retry")) {
        if (!ecs_parse_int(v, 1, 3600 * 1000, &o->call_retry_ms))
            goto bad;
    } else if (!strcmp(opt, "--curve-key")) {
        o->curve_key = v;
    } else if (!strcmp(opt, "--curve-clients")) {
        o->curve_clients = v;
    } else if (!strcmp(opt, "--worker-mem-budget")) {
        o->worker_budget = v; /* the worker checks it */
    } else if (!strcmp(opt, "--wire-act")) {
        if (strcmp(v, "q8") && strcmp(v, "f32"))
            goto bad;
        o->wire_f32 = !strcmp(v, "f32");
    } else if (!strcmp(opt, "--wire-result")) {
        if (strcmp(v, "f32") && strcmp(v, "bf16"))
            goto bad;
        o->wire_bf16 = !strcmp(v, "bf16");
    } else if (!strcmp(opt, "--micro-batches")) {
        if (!ecs_parse_int(v, 1, MODEL_MAX_MICRO, &o->micro_batches))
            goto bad;
    } else if (!strcmp(opt, "--placement")) {
        o->placement_file = NULL;
        if (!strcmp(v, "uniform"))
            o->weighting = DISPATCH_UNIFORM;
        else if (!strcmp(v, "capacity"))
            o->weighting = DISPATCH_CAPACITY;
        else
            o->placement_file = v;
    }
    return 1;
bad:
    ecs_error(ECS_ERR_RANGE, "%s: bad value '%s'", opt, v);
    return -1;
}

bool dispatch_wanted(const dispatch_opts_t *o) { return o->control || o->spawn_workers > 0; }

ecs_err_t dispatch_opts_check(const dispatch_opts_t *o)
{
    /* the local experts run inside the step's own regions: no call is
     * ever out, so there is nothing for another micro-batch to overlap */
    if (o->micro_batches > 1 && !dispatch_wanted(o))
        return ecs_error(ECS_ERR_INVAL, "--micro-batches %d needs expert workers (--spawn-workers "
                         "or --control): with the experts in this process there are no calls "
                         "to overlap", o->micro_batches);
    /* a misspelt environment value would otherwise pick auto silently */
    const char *env = getenv("ECS_DATA_PLANE");
    if (dispatch_wanted(o) && o->data_plane == 0 && dispatch_plane_mode(env) < 0)
        return ecs_error(ECS_ERR_INVAL, "ECS_DATA_PLANE='%s': expected zmq, auto or shm", env);
    return ECS_OK;
}
