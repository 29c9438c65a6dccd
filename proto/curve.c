/* curve.c - CURVE key files and the ZAP handler that admits only listed
 * client keys (RFC 27/ZAP). Key files are parsed strictly because a
 * mistyped key silently turns into "nobody can connect", which is the
 * hardest failure to diagnose in the field. */
#include "proto/curve.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#define KEY_FILE_MAX 4096
#define ALLOW_MAX 4096
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

int curve_available(void) { return zmq_has("curve"); }

static bool z85_key_ok(const char *z)
{
    uint8_t bin[32];
    return strlen(z) == CURVE_Z85_LEN && zmq_z85_decode(bin, z) != NULL;
}

static ecs_err_t write_new(const char *path, mode_t mode, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return ecs_error(ECS_ERR_IO, "%s: %s%s", path, strerror(errno),
                         errno == EEXIST ? " (refusing to overwrite a key file)" : "");
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int cerr = close(fd);
    if (w != (ssize_t)n || cerr != 0) {
        unlink(path);
        return ecs_error(ECS_ERR_IO, "%s: write failed", path);
    }
    return ECS_OK;
}

ecs_err_t curve_keygen(const char *prefix)
{
    if (!curve_available())
        return ecs_error(ECS_ERR_UNSUPPORTED, "this libzmq was built without CURVE");
    char pub[CURVE_Z85_LEN + 1], sec[CURVE_Z85_LEN + 1];
    if (zmq_curve_keypair(pub, sec) != 0)
        return ecs_error(ECS_ERR_INTERNAL, "zmq_curve_keypair: %s", zmq_strerror(errno));
    char kpath[4096], ppath[4096], text[128];
    if (snprintf(kpath, sizeof kpath, "%s.key", prefix) >= (int)sizeof kpath ||
        snprintf(ppath, sizeof ppath, "%s.pub", prefix) >= (int)sizeof ppath)
        return ecs_error(ECS_ERR_INVAL, "key prefix too long");
    snprintf(text, sizeof text, "public %s\nsecret %s\n", pub, sec);
    ecs_err_t e = write_new(kpath, 0600, text);
    if (e != ECS_OK)
        return e;
    snprintf(text, sizeof text, "%s\n", pub);
    e = write_new(ppath, 0644, text);
    if (e != ECS_OK)
        unlink(kpath);
    return e;
}

/* Reads a small text file whole; *mode gets its permission bits. */
static ecs_err_t read_small(const char *path, char *buf, size_t cap, mode_t *mode)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ecs_error(ECS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    ecs_err_t e = ECS_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        e = ecs_error(ECS_ERR_IO, "%s: not a regular file", path);
    else if (st.st_size >= (off_t)cap)
        e = ecs_error(ECS_ERR_FORMAT, "%s: %lld bytes, a key file has at most %zu", path,
                      (long long)st.st_size, cap - 1);
    ssize_t n = e == ECS_OK ? read(fd, buf, cap - 1) : 0;
    if (e == ECS_OK && n < 0)
        e = ecs_error(ECS_ERR_IO, "%s: %s", path, strerror(errno));
    close(fd);
    if (e != ECS_OK)
        return e;
    buf[n] = 0;
    if (mode)
        *mode = st.st_mode;
    return ECS_OK;
}

/* Finds "name KEY" on a line of text (or, with name NULL, a line that is
 * only a key) and copies KEY. */
static bool find_key(const char *text, const char *name, char out[CURVE_Z85_LEN + 1])
{
    for (const char *l = text; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        const char *k = l;
        if (name) {
            size_t nl = strlen(name);
            if (strncmp(l, name, nl) != 0 || l[nl] != ' ')
                continue;
            k = l + nl + 1;
        }
        size_t len = strcspn(k, "\r\n");
        if (len != CURVE_Z85_LEN)
            continue;
        memcpy(out, k, CURVE_Z85_LEN);
        out[CURVE_Z85_LEN] = 0;
        if (z85_key_ok(out))
            return true;
    }
    return false;
}

ecs_err_t curve_load_keypair(const char *key_path, curve_keypair_t *kp)
{
    char text[KEY_FILE_MAX];
    mode_t mode;
    ecs_err_t e = read_small(key_path, text, sizeof text, &mode);
    if (e != ECS_OK)
        return e;
    if (mode & 077)
        return ecs_error(ECS_ERR_INVAL, "%s: a secret key file must not be readable by others "
                         "(mode %03o; chmod 600 it)", key_path, (unsigned)(mode & 0777));
    if (!find_key(text, "public", kp->pub) || !find_key(text, "secret", kp->sec))
        return ecs_error(ECS_ERR_FORMAT, "%s: expected lines \"public Z85\" and \"secret Z85\" "
                         "with %d-character keys (made by ecsctl keygen)", key_path, CURVE_Z85_LEN);
    char derived[CURVE_Z85_LEN + 1];
    if (zmq_curve_public(derived, kp->sec) != 0 || strcmp(derived, kp->pub) != 0)
        return ecs_error(ECS_ERR_FORMAT, "%s: the public key does not belong to the secret key",
                         key_path);
    return ECS_OK;
}

ecs_err_t curve_load_public(const char *pub_path, char z85[CURVE_Z85_LEN + 1])
{
    char text[KEY_FILE_MAX];
    ecs_err_t e = read_small(pub_path, text, sizeof text, NULL);
    if (e != ECS_OK)
        return e;
    if (!find_key(text, NULL, z85) && !find_key(text, "public", z85))
        return ecs_error(ECS_ERR_FORMAT, "%s: no %d-character Z85 public key found", pub_path,
                         CURVE_Z85_LEN);
    return ECS_OK;
}

static ecs_err_t set_opt(void *sock, int opt, const void *v, size_t len, const char *what)
{
    if (zmq_setsockopt(sock, opt, v, len) != 0)
        return ecs_error(ECS_ERR_INVAL, "CURVE %s: %s", what, zmq_strerror(errno));
    return ECS_OK;
}

ecs_err_t curve_server_setup(void *sock, const curve_keypair_t *kp)
{
    int one = 1;
    ecs_err_t e = set_opt(sock, ZMQ_CURVE_SERVER, &one, sizeof one, "server");
    if (e == ECS_OK)
        e = set_opt(sock, ZMQ_CURVE_SECRETKEY, kp->sec, CURVE_Z85_LEN, "secret key");
    if (e == ECS_OK)
        e = set_opt(sock, ZMQ_ZAP_DOMAIN, "ecs", 3, "ZAP domain");
    return e;
}

ecs_err_t curve_client_setup(void *sock, const curve_keypair_t *kp, const char *server_pub)
{
    if (!z85_key_ok(server_pub))
        return ecs_error(ECS_ERR_INVAL, "CURVE server key: not a %d-character Z85 key",
                         CURVE_Z85_LEN);
    ecs_err_t e = set_opt(sock, ZMQ_CURVE_SERVERKEY, server_pub, CURVE_Z85_LEN, "server key");
    if (e == ECS_OK)
        e = set_opt(sock, ZMQ_CURVE_PUBLICKEY, kp->pub, CURVE_Z85_LEN, "public key");
    if (e == ECS_OK)
        e = set_opt(sock, ZMQ_CURVE_SECRETKEY, kp->sec, CURVE_Z85_LEN, "secret key");
    return e;
}

/* ---- ZAP handler ---- */

struct curve_auth {
    void *zap;      /* REP at ZAP_ENDPOINT: the thread's */
    void *stop_tx;  /* PAIR: the owner's */
    void *stop_rx;  /* PAIR: the thread's */
    pthread_t thr;
    uint8_t (*keys)[32];
    int n_keys;
    curve_refuse_fn on_refuse;
    void *user;
    _Atomic uint64_t refused, accepted;
};

#define ZAP_PARTS 8

static bool allowed(const curve_auth_t *a, const zmq_msg_t *cred)
{
    if (zmq_msg_size((zmq_msg_t *)cred) != 32)
        return false;
    const uint8_t *k = zmq_msg_data((zmq_msg_t *)cred);
    for (int i = 0; i < a->n_keys; i++)
        if (memcmp(a->keys[i], k, 32) == 0)
            return true;
    return false;
}

/* Copies frame f (at most cap-1 bytes) as a C string. */
static void frame_str(zmq_msg_t *f, char *out, size_t cap)
{
    size_t n = zmq_msg_size(f);
    if (n >= cap)
        n = cap - 1;
    memcpy(out, zmq_msg_data(f), n);
    out[n] = 0;
}

static void send_str(void *s, const char *v, size_t n, bool more)
{
    zmq_send(s, v, n, more ? ZMQ_SNDMORE : 0);
}

/* Answers one ZAP request: version, id, domain, address, identity,
 * mechanism, credentials... -> version, id, status, text, user, metadata. */
static void zap_handle(curve_auth_t *a)
{
    zmq_msg_t f[ZAP_PARTS];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, a->zap, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&tmp);
            break;
        }
        more = zmq_msg_more(&tmp);
        if (n < ZAP_PARTS)
            f[n++] = tmp;
        else
            zmq_msg_close(&tmp);
    }
    if (n < 6) { /* not a ZAP request: a REP must still answer something */
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
        send_str(a->zap, "1.0", 3, true);
        send_str(a->zap, "", 0, true);
        send_str(a->zap, "500", 3, true);
        send_str(a->zap, "malformed ZAP request", 21, true);
        send_str(a->zap, "", 0, true);
        send_str(a->zap, "", 0, false);
        return;
    }
    char mech[16], addr[64];
    frame_str(&f[5], mech, sizeof mech);
    frame_str(&f[3], addr, sizeof addr);
    bool ok = strcmp(mech, "CURVE") == 0 && n >= 7 && allowed(a, &f[6]);
    if (ok) {
        atomic_fetch_add(&a->accepted, 1);
    } else {
        atomic_fetch_add(&a->refused, 1);
        char key[CURVE_Z85_LEN + 1] = "-";
        if (strcmp(mech, "CURVE") == 0 && n >= 7 && zmq_msg_size(&f[6]) == 32)
            zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
        if (a->on_refuse)
            a->on_refuse(a->user, addr, key);
    }
    zmq_msg_send(&f[0], a->zap, ZMQ_SNDMORE); /* version */
    zmq_msg_send(&f[1], a->zap, ZMQ_SNDMORE); /* request id */
    send_str(a->zap, ok ? "200" : "400", 3, true);
    const char *text = ok ? "OK" : "client key not allowed";
    send_str(a->zap, text, strlen(text), true);
    send_str(a->zap, "", 0, true);
    send_str(a->zap, "", 0, false);
    for (int i = 2; i < n; i++)
        zmq_msg_close(&f[i]);
}

static void *zap_thread(void *arg)
{
    curve_auth_t *a = arg;
    for (;;) {
        zmq_pollitem_t it[2] = {{a->zap, 0, ZMQ_POLLIN, 0}, {a->stop_rx, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(it, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (it[1].revents)
            break;
        if (it[0].revents)
            zap_handle(a);
    }
    zmq_close(a->zap);
    zmq_close(a->stop_rx);
    return NULL;
}

static void auth_free(curve_auth_t *a)
{
    if (a->zap)
        zmq_close(a->zap);
    if (a->stop_rx)
        zmq_close(a->stop_rx);
    if (a->stop_tx)
        zmq_close(a->stop_tx);
    free(a->keys);
    free(a);
}

ecs_err_t curve_auth_start(void *zctx, const char *const *allowed_keys, int n,
                           curve_refuse_fn on_refuse, void *user, curve_auth_t **out)
{
    if (!curve_available())
        return ecs_error(ECS_ERR_UNSUPPORTED, "this libzmq was built without CURVE");
    if (n < 0 || n > ALLOW_MAX)
        return ecs_error(ECS_ERR_RANGE, "CURVE allow list: %d keys (at most %d)", n, ALLOW_MAX);
    curve_auth_t *a = calloc(1, sizeof *a);
    if (!a)
        return ecs_error(ECS_ERR_NOMEM, "CURVE auth: out of memory");
    a->on_refuse = on_refuse;
    a->user = user;
    ecs_err_t e = ECS_OK;
    a->keys = calloc(n ? (size_t)n : 1, sizeof *a->keys);
    if (!a->keys) {
        e = ecs_error(ECS_ERR_NOMEM, "CURVE auth: out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        if (!z85_key_ok(allowed_keys[i])) {
            e = ecs_error(ECS_ERR_INVAL, "CURVE allow list: entry %d is not a Z85 key", i);
            goto fail;
        }
        zmq_z85_decode(a->keys[i], allowed_keys[i]);
    }
    a->n_keys = n;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://ecs-curve-stop-%p", (void *)a);
    a->zap = zmq_socket(zctx, ZMQ_REP);
    a->stop_rx = zmq_socket(zctx, ZMQ_PAIR);
    a->stop_tx = zmq_socket(zctx, ZMQ_PAIR);
    if (!a->zap || !a->stop_rx || !a->stop_tx) {
        e = ecs_error(ECS_ERR_IO, "CURVE auth: socket: %s", zmq_strerror(errno));
        goto fail;
    }
    if (zmq_bind(a->zap, ZAP_ENDPOINT) != 0) {
        e = ecs_error(ECS_ERR_IO, "CURVE auth: bind %s: %s (one handler per context)",
                      ZAP_ENDPOINT, zmq_strerror(errno));
        goto fail;
    }
    if (zmq_bind(a->stop_rx, ep) != 0 || zmq_connect(a->stop_tx, ep) != 0) {
        e = ecs_error(ECS_ERR_IO, "CURVE auth: stop pipe: %s", zmq_strerror(errno));
        goto fail;
    }
    if (pthread_create(&a->thr, NULL, zap_thread, a) != 0) {
        e = ecs_error(ECS_ERR_INTERNAL, "CURVE auth: cannot start its thread");
        goto fail;
    }
    *out = a;
    return ECS_OK;
fail:
    auth_free(a);
    return e;
}

static int cmp_str(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

ecs_err_t curve_auth_start_dir(void *zctx, const char *dir, curve_refuse_fn on_refuse, void *user,
                               curve_auth_t **out)
{
    DIR *d = opendir(dir);
    if (!d)
        return ecs_error(ECS_ERR_IO, "CURVE clients directory %s: %s", dir, strerror(errno));
    char (*keys)[CURVE_Z85_LEN + 1] = calloc(ALLOW_MAX, sizeof *keys);
    char **ptrs = calloc(ALLOW_MAX, sizeof *ptrs);
    ecs_err_t e = ECS_OK;
    int n = 0;
    if (!keys || !ptrs) {
        e = ecs_error(ECS_ERR_NOMEM, "CURVE auth: out of memory");
        goto done;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".pub") != 0)
            continue;
        if (n == ALLOW_MAX) {
            e = ecs_error(ECS_ERR_RANGE, "%s: more than %d client keys", dir, ALLOW_MAX);
            goto done;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if ((e = curve_load_public(path, keys[n])) != ECS_OK)
            goto done;
        ptrs[n] = keys[n];
        n++;
    }
    qsort(ptrs, (size_t)n, sizeof *ptrs, cmp_str);
    e = curve_auth_start(zctx, (const char *const *)ptrs, n, on_refuse, user, out);
done:
    closedir(d);
    free(keys);
    free(ptrs);
    return e;
}

uint64_t curve_auth_refused(const curve_auth_t *a) { return atomic_load(&a->refused); }
uint64_t curve_auth_accepted(const curve_auth_t *a) { return atomic_load(&a->accepted); }

void curve_auth_stop(curve_auth_t *a)
{
    if (!a)
        return;
    zmq_send(a->stop_tx, "", 0, 0);
    pthread_join(a->thr, NULL);
    a->zap = a->stop_rx = NULL; /* closed by the thread */
    auth_free(a);
}
