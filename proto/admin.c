/* admin.c - encoding and validating admin requests (see admin.h); the
 * replies are built by the coordinator and read by ecsctl with jansson. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "proto/admin.h"

static const char *const names[ADMIN_N_CMDS] = {"status", "workers", "placement",
                                                "drain",  "undrain", "restart"};

const char *admin_cmd_name(admin_cmd_t c)
{
    return (unsigned)c < ADMIN_N_CMDS ? names[c] : "?";
}

int admin_cmd_parse(const char *s)
{
    for (int i = 0; s && i < ADMIN_N_CMDS; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

bool admin_cmd_needs_worker(admin_cmd_t c)
{
    return c == ADMIN_DRAIN || c == ADMIN_UNDRAIN || c == ADMIN_RESTART;
}

static bool id_ok(const char *s, size_t n)
{
    if (n == 0 || n >= ADMIN_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 127)
            return false;
    return true;
}

static ecs_err_t bad(char *err, size_t cap, const char *msg)
{
    snprintf(err, cap, "bad admin request: %s", msg);
    return ecs_error(ECS_ERR_INVAL, "%s", err);
}

ecs_err_t admin_req_decode(const void *buf, size_t len, admin_req_t *out, char *err, size_t cap)
{
    memset(out, 0, sizeof *out);
    if (len == 0 || len > ADMIN_MAX_REQUEST)
        return bad(err, cap, "empty or over 4096 bytes");
    json_error_t je;
    json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    ecs_err_t rc = ECS_OK;
    if (!o)
        return bad(err, cap, "not JSON");
    const char *key;
    json_t *v;
    bool have_cmd = false, have_v = false;
    if (!json_is_object(o)) {
        rc = bad(err, cap, "not a JSON object");
        goto done;
    }
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "v")) {
            if (!json_is_integer(v) || json_integer_value(v) != ADMIN_VERSION) {
                rc = bad(err, cap, "\"v\" must be 1");
                goto done;
            }
            have_v = true;
        } else if (!strcmp(key, "cmd")) {
            const int c = json_is_string(v) ? admin_cmd_parse(json_string_value(v)) : -1;
            if (c < 0) {
                rc = bad(err, cap, "unknown \"cmd\" (status, workers, placement, drain, "
                                   "undrain, restart)");
                goto done;
            }
            out->cmd = (admin_cmd_t)c;
            have_cmd = true;
        } else if (!strcmp(key, "worker")) {
            if (!json_is_string(v) || !id_ok(json_string_value(v), json_string_length(v))) {
                rc = bad(err, cap, "\"worker\" must be a worker id (printable, no spaces, "
                                   "1-63 bytes)");
                goto done;
            }
            memcpy(out->worker, json_string_value(v), json_string_length(v) + 1);
        } else {
            rc = bad(err, cap, "unknown member (allowed: v, cmd, worker)");
            goto done;
        }
    }
    if (!have_v || !have_cmd)
        rc = bad(err, cap, "\"v\" and \"cmd\" are required");
    else if (admin_cmd_needs_worker(out->cmd) != (out->worker[0] != 0))
        rc = bad(err, cap, admin_cmd_needs_worker(out->cmd) ? "this command needs \"worker\""
                                                            : "this command takes no \"worker\"");
done:
    json_decref(o);
    if (rc != ECS_OK)
        memset(out, 0, sizeof *out);
    return rc;
}

char *admin_req_encode(const admin_req_t *r)
{
    if ((unsigned)r->cmd >= ADMIN_N_CMDS)
        return NULL;
    json_t *o = json_pack("{s:i,s:s}", "v", ADMIN_VERSION, "cmd", names[r->cmd]);
    if (o && admin_cmd_needs_worker(r->cmd) &&
        json_object_set_new(o, "worker", json_string(r->worker)) != 0) {
        json_decref(o);
        return NULL;
    }
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}
