/* admin.h - the admin protocol between ecsctl and ecs-coordinator's admin
 * endpoint (a ZeroMQ ROUTER; ecsctl connects a DEALER).
 *
 * Contract: one request is one ZeroMQ message holding one small JSON
 * object (at most ADMIN_MAX_REQUEST bytes), and gets exactly one reply
 * message, also one JSON object:
 *     {"v":1,"cmd":"workers"}
 *     {"v":1,"cmd":"drain","worker":"w1"}
 *     -> {"ok":true,"result":{...}}   or   {"ok":false,"error":"why"}
 * Commands: status, workers, placement (read-only), drain, undrain,
 * restart (these name a worker). admin_req_decode validates everything
 * (a JSON object, a known command, version 1, a worker id of printable
 * ASCII without spaces, 1 to ADMIN_ID_MAX-1 bytes, only where the
 * command takes one, no other members) and says what is wrong; it is
 * fuzzed (tests/fuzz/fuzz_admin.c). docs/operations.md lists the replies.
 *
 *     admin_req_t r = {.cmd = ADMIN_DRAIN};  snprintf(r.worker, ..., "w1");
 *     char *json = admin_req_encode(&r);     // send it, free it
 *     ...
 *     char err[256];
 *     if (admin_req_decode(buf, len, &r, err, sizeof err) != ECS_OK) reply_error(err);
 */
#ifndef ECS_PROTO_ADMIN_H
#define ECS_PROTO_ADMIN_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define ADMIN_VERSION 1
#define ADMIN_MAX_REQUEST 4096
#define ADMIN_ID_MAX 64

typedef enum {
    ADMIN_STATUS = 0,
    ADMIN_WORKERS,
    ADMIN_PLACEMENT,
    ADMIN_DRAIN,
    ADMIN_UNDRAIN,
    ADMIN_RESTART,
    ADMIN_N_CMDS
} admin_cmd_t;

typedef struct {
    admin_cmd_t cmd;
    char worker[ADMIN_ID_MAX]; /* "" unless the command names a worker */
} admin_req_t;

const char *admin_cmd_name(admin_cmd_t c);
/* The command spelled s, -1 if none. */
int admin_cmd_parse(const char *s);
bool admin_cmd_needs_worker(admin_cmd_t c);
/* ECS_ERR_INVAL with a message in err when buf is not a valid request. */
ecs_err_t admin_req_decode(const void *buf, size_t len, admin_req_t *out, char *err, size_t cap);
/* The request as JSON (malloc'd), NULL when out of memory or invalid. */
char *admin_req_encode(const admin_req_t *r);

#endif
