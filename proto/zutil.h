/* zutil.h - private to proto/: ZeroMQ helpers that mux.c (the coordinator's
 * I/O thread) and server.c (the worker's loop) share. Every function here
 * runs on the thread that owns the socket it is given. */
#ifndef ECS_PROTO_ZUTIL_H
#define ECS_PROTO_ZUTIL_H

#include <stdint.h>
#include <time.h>
#include <zmq.h>

#include "proto/mux.h"
#include "proto/wire.h"

/* Most frames one message may have: routing id + header + payload. */
#define ZU_MAX_PARTS 3

uint64_t zu_now_ns(void);
/* Asks the scheduler for a short time slice for the calling thread (an I/O
 * thread that runs microseconds per wake-up): on Linux 6.12+ (EEVDF) a
 * woken thread with a shorter slice than the running one preempts it at
 * once instead of waiting out its slice, which on cores busy with compute
 * threads is up to milliseconds per hand-off. Keeps the thread's nice
 * value; does nothing where the kernel has no such setting. */
void zu_short_slice(void);
/* The calling thread's slice in ns (0: the kernel's default). */
void zu_slice_self(uint64_t ns);
/* The same for this process's ZeroMQ I/O threads ("ZMQbg/IO/N"), which
 * carry every message between a socket and its owner: call it once a
 * context has its first socket (ZeroMQ starts them then). */
void zu_short_slice_zmq(void);
/* The time timeout_ms (>= 0; a negative one counts as 0) from now on clk,
 * for pthread_cond_timedwait. */
void zu_deadline(clockid_t clk, int timeout_ms, struct timespec *ts);

/* A socket with the mux's options: hwm both ways, linger_ms on close. */
ecs_err_t zu_socket(void *zctx, int type, int hwm, int linger_ms, void **out);

/* The endpoint a socket is bound to (tcp "*" resolved). */
void zu_last_endpoint(void *sock, char *buf, size_t cap);

/* Unbinds a socket from ep and removes an ipc socket file (ZeroMQ leaves
 * it behind). */
void zu_unbind(void *sock, const char *ep);

/* Receives one whole message without blocking. Returns 1 and the first
 * min(total, ZU_MAX_PARTS) frames in parts[] (initialised; close them with
 * zu_close_parts), *nparts = the message's real frame count and *bytes its
 * size; 0 when nothing is waiting; -1 on a socket error. */
int zu_recv(void *sock, zmq_msg_t parts[ZU_MAX_PARTS], int *nparts, size_t *bytes);
void zu_close_parts(zmq_msg_t *parts, int n);

/* Makes a payload frame's data WIRE_PAYLOAD_ALIGN-aligned: ZeroMQ hands
 * out frames at any address inside its receive buffer, so a misaligned one
 * is copied into an aligned frame. ECS_ERR_NOMEM if that fails. */
ecs_err_t zu_align(zmq_msg_t *msg);

/* Encodes m's first frame into a new message. */
ecs_err_t zu_encode(const wire_msg_t *m, zmq_msg_t *out);

/* Sends [route]? + m's frame (+ payload for CALL/RESULT), without blocking;
 * returns 0 or the errno of the failed send. */
int zu_send(void *sock, const mux_route_t *route, const wire_msg_t *m, size_t *bytes);

/* Sends an Error (code, about, request_id, message) the same way. */
int zu_send_error(void *sock, const mux_route_t *route, wire_status_t code, wire_kind_t about,
                  uint64_t request_id, const char *message);

/* The status a decode failure maps to (VERSION for ECS_ERR_UNSUPPORTED). */
wire_status_t zu_status_of(ecs_err_t e);

/* ---- CURVE (linksec.c) ---- */

/* With c->key: starts the ZAP handler of zctx admitting c->allowed (each
 * refusal logged as `who: refused ...`) and makes sock a CURVE server;
 * before bind. Without a key: nothing (*auth NULL). */
ecs_err_t zu_curve_server(void *zctx, void *sock, const mux_curve_t *c, const char *who,
                          curve_auth_t **auth);
/* With c->key: makes sock a CURVE client of server_pub; before connect. */
ecs_err_t zu_curve_client(void *sock, const mux_curve_t *c, const char *server_pub,
                          const char *who);
/* A PAIR receiving sock's failed-handshake events (and extra_events); NULL
 * if monitoring is not possible. */
void *zu_handshake_monitor(void *zctx, void *sock, int extra_events);
/* Reads one event from such a monitor without blocking: its number (0 if
 * none) and *value; failed handshakes are logged as `who: ENDPOINT: ...`. */
int zu_monitor_event(void *mon, const char *who, uint32_t *value);

/* Latency histogram bucket of a round trip. */
int zu_lat_bucket(uint64_t ns);

#endif
