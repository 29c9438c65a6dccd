/* curve.h - ZeroMQ CURVE keys and client authentication for ECS links
 * (coordinator <-> worker control and data sockets, the admin endpoint).
 *
 * Contract. A key pair lives in two files made by curve_keygen(PREFIX):
 *   PREFIX.pub  one line, the Z85 public key (40 characters): give it to
 *               peers (a server's .pub to its clients; a client's .pub goes
 *               into the server's allow-list directory)
 *   PREFIX.key  mode 0600, two lines "public Z85" and "secret Z85"
 * curve_load_keypair() refuses a .key file that group or others may read,
 * a malformed key, or a public key that does not belong to the secret one.
 * Every load error names the file and what was wrong.
 *
 * A server socket (curve_server_setup, before bind) then speaks only CURVE:
 * a plaintext peer or one that does not know the server's public key never
 * completes the handshake. Which *clients* may talk is decided by the ZAP
 * handler: curve_auth_start() runs one thread that owns the context's
 * inproc://zeromq.zap.01 socket and accepts exactly the public keys of its
 * allow list; every refusal is counted and reported to on_refuse (called on
 * the handler's thread). One handler per ZeroMQ context, started before the
 * server sockets bind. The thread sleeps in zmq_poll between requests.
 *
 * Usage:
 *
 *   curve_keygen("/etc/ecs/coord");                 // coord.pub, coord.key
 *   curve_keypair_t kp;  curve_load_keypair("/etc/ecs/coord.key", &kp);
 *   curve_auth_t *auth;  curve_auth_start_dir(zctx, "/etc/ecs/clients", NULL, NULL, &auth);
 *   curve_server_setup(router, &kp);  zmq_bind(router, "tcp://0.0.0.0:5550");
 *   ...                                              // client side:
 *   char spub[41];  curve_load_public("/etc/ecs/coord.pub", spub);
 *   curve_client_setup(dealer, &my_kp, spub);  zmq_connect(dealer, ...);
 *   ...
 *   curve_auth_stop(auth);                          // before zmq_ctx_term
 */
#ifndef ECS_PROTO_CURVE_H
#define ECS_PROTO_CURVE_H

#include <stdint.h>

#include "common/err.h"

#define CURVE_Z85_LEN 40 /* characters of a Z85-encoded 32-byte key */

typedef struct {
    char pub[CURVE_Z85_LEN + 1], sec[CURVE_Z85_LEN + 1];
} curve_keypair_t;

/* True when the linked libzmq was built with CURVE. */
int curve_available(void);

/* Writes PREFIX.pub and PREFIX.key (0600). Refuses to overwrite either. */
ecs_err_t curve_keygen(const char *prefix);

ecs_err_t curve_load_keypair(const char *key_path, curve_keypair_t *kp);

/* The public key in a .pub file (or the "public" line of a .key file). */
ecs_err_t curve_load_public(const char *pub_path, char z85[CURVE_Z85_LEN + 1]);

/* Socket options; call before bind / connect. */
ecs_err_t curve_server_setup(void *sock, const curve_keypair_t *kp);
ecs_err_t curve_client_setup(void *sock, const curve_keypair_t *kp, const char *server_pub);

typedef struct curve_auth curve_auth_t;

/* Called on the handler's thread for each refused client: its address and
 * Z85 public key (or "-" for a non-CURVE mechanism). */
typedef void (*curve_refuse_fn)(void *user, const char *address, const char *key_z85);

/* Starts the ZAP handler accepting the n Z85 keys of allowed (copied). */
ecs_err_t curve_auth_start(void *zctx, const char *const *allowed, int n, curve_refuse_fn on_refuse,
                           void *user, curve_auth_t **out);
/* Same, allowing the key of every *.pub file in dir (at most 4096). */
ecs_err_t curve_auth_start_dir(void *zctx, const char *dir, curve_refuse_fn on_refuse, void *user,
                               curve_auth_t **out);
uint64_t curve_auth_refused(const curve_auth_t *a);
uint64_t curve_auth_accepted(const curve_auth_t *a);
void curve_auth_stop(curve_auth_t *a);

#endif
