/* linksec.c - private to proto/: CURVE on the mux's links, shared by the
 * coordinator's mux (mux_api.c, mux.c) and the worker's server (server.c):
 * the ZAP handler with its refusal log, socket set-up, and a socket
 * monitor that logs handshakes that fail before ZAP is even asked (a
 * plaintext peer, a peer that has the wrong server key). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zutil.h"

/* A peer with a wrong key retries every 100 ms or so: one line per second
 * per source and kind of refusal at most, with the count of those left out. */
static bool log_allowed(const char *who, int kind, unsigned *suppressed)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static struct { const char *who; int kind; uint64_t last_ns; unsigned left_out; } slot[16];
    const uint64_t now = zu_now_ns();
    bool ok = true;
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < 15 && slot[i].who && (slot[i].who != who || slot[i].kind != kind))
        i++;
    const bool same = slot[i].who == who && slot[i].kind == kind;
    if (same && now - slot[i].last_ns < 1000000000ull) {
        slot[i].left_out++;
        ok = false;
    } else {
        *suppressed = same ? slot[i].left_out : 0;
        slot[i].who = who;
        slot[i].kind = kind;
        slot[i].last_ns = now;
        slot[i].left_out = 0;
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

static void log_refusal(void *user, const char *address, const char *key)
{
    unsigned more;
    if (log_allowed(user, 0, &more))
        fprintf(stderr, "%s: refused a CURVE peer from %s: its key %s is not allowed (%u more "
                "refusals in the last second)\n", (const char *)user,
                address && *address ? address : "?", key, more);
}

ecs_err_t zu_curve_server(void *zctx, void *sock, const mux_curve_t *c, const char *who,
                          curve_auth_t **auth)
{
    *auth = NULL;
    if (!c->key)
        return ECS_OK;
    if (!curve_available())
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: this libzmq has no CURVE", who);
    if (c->n_allowed < 1)
        return ecs_error(ECS_ERR_INVAL, "%s: CURVE without any allowed client key", who);
    ecs_err_t e = curve_auth_start(zctx, c->allowed, c->n_allowed, log_refusal, (void *)who,
                                   auth);
    if (e)
        return ecs_error(e, "%s: %s", who, ecs_errmsg());
    if ((e = curve_server_setup(sock, c->key))) {
        curve_auth_stop(*auth);
        *auth = NULL;
        return ecs_error(e, "%s: %s", who, ecs_errmsg());
    }
    return ECS_OK;
}

ecs_err_t zu_curve_client(void *sock, const mux_curve_t *c, const char *server_pub,
                          const char *who)
{
    if (!c->key)
        return ECS_OK;
    if (!server_pub || strlen(server_pub) != CURVE_Z85_LEN)
        return ecs_error(ECS_ERR_INVAL, "%s: CURVE is on but the peer's public key is %s", who,
                         server_pub && *server_pub ? "malformed" : "unknown");
    ecs_err_t e = curve_client_setup(sock, c->key, server_pub);
    return e ? ecs_error(e, "%s: %s", who, ecs_errmsg()) : ECS_OK;
}

void *zu_handshake_monitor(void *zctx, void *sock, int extra_events)
{
    static _Atomic unsigned seq;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://ecs-hs-%p-%u", sock, seq++);
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                         ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | extra_events) != 0)
        return NULL;
    void *mon = zmq_socket(zctx, ZMQ_PAIR);
    if (mon && zmq_connect(mon, ep) != 0) {
        zmq_close(mon);
        mon = NULL;
    }
    return mon;
}

int zu_monitor_event(void *mon, const char *who, uint32_t *value)
{
    zmq_msg_t ev, addr;
    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&ev);
        return 0;
    }
    uint16_t event = 0;
    uint32_t val = 0;
    if (zmq_msg_size(&ev) >= 6) {
        memcpy(&event, zmq_msg_data(&ev), 2);
        memcpy(&val, (const char *)zmq_msg_data(&ev) + 2, 4);
    }
    const bool more = zmq_msg_more(&ev);
    zmq_msg_close(&ev);
    char ep[128] = "?";
    if (more) { /* the endpoint frame */
        zmq_msg_init(&addr);
        if (zmq_msg_recv(&addr, mon, ZMQ_DONTWAIT) >= 0) {
            const size_t n = zmq_msg_size(&addr) < sizeof ep - 1 ? zmq_msg_size(&addr)
                                                                  : sizeof ep - 1;
            memcpy(ep, zmq_msg_data(&addr), n);
            ep[n] = 0;
        }
        zmq_msg_close(&addr);
    }
    if (value)
        *value = val;
    unsigned left_out = 0;
    const bool failed = event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
                        event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                        event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
    if (failed && log_allowed(who, event, &left_out))
        fprintf(stderr, "%s: %s: a connection failed its CURVE handshake: %s (%u more in the "
                "last second)\n", who, ep,
                event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                    ? "its key was refused by the allow list (or ours by the peer's)"
                : val == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                    ? "one side does not speak CURVE"
                    : "not CURVE with the right server key (plaintext, or a wrong key)", left_out);
    return event;
}

/* ---- key files for the command lines (mux.h) ---- */

static ecs_err_t allow(mux_curve_keys_t *k, const char *z85)
{
    if (k->n_allowed % 16 == 0) {
        char(*a)[CURVE_Z85_LEN + 1] = realloc(k->allowed, (size_t)(k->n_allowed + 16) *
                                                              sizeof *a);
        const char **p = realloc(k->ptrs, (size_t)(k->n_allowed + 16) * sizeof *p);
        if (a)
            k->allowed = a;
        if (p)
            k->ptrs = p;
        if (!a || !p)
            return ecs_error(ECS_ERR_NOMEM, "curve: out of memory");
    }
    snprintf(k->allowed[k->n_allowed], CURVE_Z85_LEN + 1, "%s", z85);
    k->n_allowed++;
    for (int i = 0; i < k->n_allowed; i++) /* realloc may have moved them */
        k->ptrs[i] = k->allowed[i];
    return ECS_OK;
}

static ecs_err_t allow_dir(mux_curve_keys_t *k, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return ecs_error(ECS_ERR_IO, "curve: allow list %s: %s", dir, strerror(errno));
    ecs_err_t e = ECS_OK;
    int found = 0;
    struct dirent *de;
    while (!e && (de = readdir(d))) {
        const size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 4, ".pub"))
            continue;
        char path[4096], z85[CURVE_Z85_LEN + 1];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (found++ >= 4096)
            e = ecs_error(ECS_ERR_RANGE, "curve: more than 4096 keys in %s", dir);
        else if (!(e = curve_load_public(path, z85)))
            e = allow(k, z85);
    }
    closedir(d);
    if (!e && !found)
        e = ecs_error(ECS_ERR_NOTFOUND, "curve: no *.pub file in the allow list %s", dir);
    return e;
}

ecs_err_t mux_curve_load(mux_curve_keys_t *k, const char *key_file, const char *server_pub_file,
                         const char *clients_dir, bool allow_self)
{
    memset(k, 0, sizeof *k);
    if (!key_file)
        return (server_pub_file || clients_dir)
                   ? ecs_error(ECS_ERR_INVAL, "curve: a server key or an allow list without "
                               "--curve-key (this side's own key pair)")
                   : ECS_OK;
    ecs_err_t e = curve_load_keypair(key_file, &k->key);
    if (!e && server_pub_file)
        e = curve_load_public(server_pub_file, k->server_pub);
    if (!e && clients_dir)
        e = allow_dir(k, clients_dir);
    if (!e && allow_self)
        e = allow(k, k->key.pub);
    if (!e && server_pub_file && !clients_dir) /* a worker: its coordinator may call it */
        e = allow(k, k->server_pub);
    if (!e && !k->n_allowed)
        e = ecs_error(ECS_ERR_INVAL, "curve: no client key is allowed: give an allow-list "
                      "directory of *.pub files");
    if (e) {
        mux_curve_keys_free(k);
        return e;
    }
    k->on = true;
    return ECS_OK;
}

mux_curve_t mux_curve_view(const mux_curve_keys_t *k)
{
    if (!k->on)
        return (mux_curve_t){0};
    return (mux_curve_t){.key = &k->key, .allowed = k->ptrs, .n_allowed = k->n_allowed,
                         .server_pub = k->server_pub[0] ? k->server_pub : NULL};
}

void mux_curve_keys_free(mux_curve_keys_t *k)
{
    free(k->allowed);
    free(k->ptrs);
    memset(k, 0, sizeof *k); /* the secret key too */
}
