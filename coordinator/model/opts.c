/* opts.c - the command-line options of a model's run that every program
 * running one (ecs-run, ecs-coordinator) shares, so they spell and check
 * them the same way (as coordinator/dispatch/opts.c does for the workers'
 * options): the KV cache's type and the decode copy's directory. */
#include <string.h>

#include "coordinator/model/model.h"
#include "kernels/repack/repack.h"

bool model_cli_flag(model_cli_t *o, const char *opt)
{
    if (!strcmp(opt, "--kv-f32"))
        o->kv_flag = MODEL_CTX_KV_F32;
    else if (!strcmp(opt, "--no-repack"))
        o->no_repack = true;
    else if (!strcmp(opt, "--no-amx"))
        o->no_amx = true;
    else
        return false;
    return true;
}

bool model_cli_takes_value(const char *opt)
{
    return !strcmp(opt, "--kv-type") || !strcmp(opt, "--repack");
}

int model_cli_opt(model_cli_t *o, const char *opt, const char *v)
{
    if (!strcmp(opt, "--repack")) {
        o->repack_dir = v;
        return 1;
    }
    if (strcmp(opt, "--kv-type"))
        return 0;
    const int fl = model_kv_type_flag(v);
    if (fl < 0) {
        ecs_error(ECS_ERR_INVAL, "--kv-type '%s': expected f16, bf16, f32 or q8", v);
        return -1;
    }
    o->kv_flag = (unsigned)fl;
    return 1;
}

const char *model_cli_repack_dir(const model_cli_t *o, char *buf, size_t cap)
{
    if (o->no_repack)
        return NULL;
    if (o->repack_dir)
        return o->repack_dir;
    return krepack_default_dir(buf, cap);
}
