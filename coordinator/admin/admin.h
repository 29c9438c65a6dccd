/* admin.h - ecs-coordinator's admin endpoint (what ecsctl talks to) and
 * the read-only state of the console (GET /console/state).
 *
 * Contract:
 *   - admin_start binds a ZeroMQ ROUTER at opts.endpoint (loopback tcp or
 *     an ipc path; an ipc socket file is made mode 0600) and runs one
 *     thread that owns it. Requests and replies are the JSON documents of
 *     proto/admin.h. Read-only commands (status, workers, placement) are
 *     answered at once from the dispatcher's and the scheduler's stats;
 *     drain, undrain and restart are handed to the dispatcher's control
 *     thread (dispatch_op_start) and answered when they are done, while
 *     other requests go on being answered. The thread sleeps in zmq_poll
 *     (the ROUTER and an eventfd the control thread writes when an
 *     operation ends).
 *   - With a key (opts.key_file, opts.clients_dir) the endpoint speaks
 *     only CURVE and a ZAP handler admits the listed client keys alone.
 *   - admin_state_json never touches a socket: any thread may call it.
 *     It holds no secret (no keys, no prompts).
 *
 * Usage:
 *   admin_src_t src = {.dispatch = d, .sched = s, .model_id = "m"};
 *   admin_t *a;  admin_start(&(admin_opts_t){.endpoint = "ipc:///tmp/x", .src = &src}, &a);
 *   char *json = admin_state_json(&src);  free(json);
 *   admin_stop(a);  dispatch_free(d);  admin_free(a);   // in this order
 */
#ifndef ECS_ADMIN_H
#define ECS_ADMIN_H

#include <stdatomic.h>
#include <stdbool.h>

#include "common/err.h"
#include "coordinator/dispatch/dispatch.h"
#include "coordinator/sched/sched.h"

typedef struct {
    dispatch_t *dispatch;    /* NULL: the experts run in-process */
    sched_t *sched;
    const char *model_id;
    double started;          /* CLOCK_MONOTONIC seconds at start-up */
    atomic_bool shutting_down; /* set by the HTTP server on SIGTERM */
} admin_src_t;

typedef struct {
    const char *endpoint;    /* tcp://127.0.0.1:PORT or ipc://PATH */
    admin_src_t *src;
    /* CURVE (proto/curve.h), both or neither: the endpoint's key pair
     * (ecsctl keygen) and a directory of the *.pub keys of the clients
     * allowed in; any other client is refused and logged */
    const char *key_file, *clients_dir;
} admin_opts_t;

typedef struct admin admin_t;

ecs_err_t admin_start(const admin_opts_t *o, admin_t **out);
/* Stops answering (joins the thread); operations still running complete
 * into the void. Call before dispatch_free, and admin_free after it. */
void admin_stop(admin_t *a);
void admin_free(admin_t *a);
const char *admin_endpoint(const admin_t *a);

/* Everything the console shows, as one JSON object (malloc'd), NULL when
 * out of memory. */
char *admin_state_json(admin_src_t *src);
/* The replies' results (jansson objects, new references). */
struct json_t;
struct json_t *admin_status_obj(admin_src_t *src);
struct json_t *admin_workers_obj(admin_src_t *src);
struct json_t *admin_placement_obj(admin_src_t *src);
double admin_now(void);

#endif
