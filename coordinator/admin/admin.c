/* admin.c - the admin endpoint's thread: one ZeroMQ ROUTER, requests
 * decoded by proto/admin.c, replies built from state.c; drain, undrain and
 * restart run on the dispatcher's control thread and come back through a
 * queue and an eventfd, so this thread never blocks on them. */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "coordinator/admin/admin.h"
#include "proto/admin.h"
#include "proto/curve.h"

#define ADMIN_ROUTE_MAX 256

/* An operation in progress: who asked, and (once done) the answer. */
typedef struct pending {
    struct admin *a;
    uint8_t route[ADMIN_ROUTE_MAX];
    size_t route_len;
    admin_cmd_t cmd;
    char worker[ADMIN_ID_MAX];
    ecs_err_t rc;
    char msg[512];
    struct pending *next;
} pending_t;

struct admin {
    admin_opts_t o;
    char endpoint[512];
    void *zctx, *sock;
    curve_auth_t *auth;
    int efd;
    pthread_t thread;
    bool started;
    atomic_bool stop;
    pthread_mutex_t lock;
    pending_t *done;        /* finished operations to answer (under lock) */
    int in_flight;          /* operations handed to the dispatcher (under lock) */
};

const char *admin_endpoint(const admin_t *a) { return a->endpoint; }

static void send_reply(admin_t *a, const uint8_t *route, size_t route_len, json_t *reply)
{
    char *s = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    json_decref(reply);
    if (!s)
        s = strdup("{\"ok\":false,\"error\":\"out of memory\"}");
    if (!s)
        return;
    /* a client gone meanwhile: the ROUTER drops the reply */
    if (zmq_send(a->sock, route, route_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
        zmq_send(a->sock, s, strlen(s), ZMQ_DONTWAIT);
    free(s);
}

static json_t *error_reply(const char *msg)
{
    return json_pack("{s:b,s:s}", "ok", 0, "error", msg);
}

static json_t *ok_reply(json_t *result)
{
    if (!result)
        return error_reply("out of memory");
    return json_pack("{s:b,s:o}", "ok", 1, "result", result);
}

static void on_done(void *arg, ecs_err_t rc, const char *msg)
{
    pending_t *p = arg;
    admin_t *a = p->a;
    p->rc = rc;
    snprintf(p->msg, sizeof p->msg, "%s", msg);
    pthread_mutex_lock(&a->lock);
    p->next = a->done;
    a->done = p;
    a->in_flight--;
    pthread_mutex_unlock(&a->lock);
    const uint64_t one = 1;
    if (write(a->efd, &one, sizeof one) < 0) {
        /* the counter cannot overflow here; nothing else to do */
    }
}

static void answer_done(admin_t *a)
{
    uint64_t n;
    if (read(a->efd, &n, sizeof n) < 0 && errno != EAGAIN)
        return;
    pthread_mutex_lock(&a->lock);
    pending_t *p = a->done;
    a->done = NULL;
    pthread_mutex_unlock(&a->lock);
    while (p) {
        pending_t *next = p->next;
        json_t *r = p->rc == ECS_OK
                        ? ok_reply(json_pack("{s:s,s:s,s:s}", "command", admin_cmd_name(p->cmd),
                                             "worker", p->worker, "message", p->msg))
                        : error_reply(p->msg);
        send_reply(a, p->route, p->route_len, r);
        free(p);
        p = next;
    }
}

static void handle(admin_t *a, const uint8_t *route, size_t route_len, const void *body,
                   size_t len)
{
    admin_req_t q;
    char err[256];
    if (admin_req_decode(body, len, &q, err, sizeof err) != ECS_OK) {
        send_reply(a, route, route_len, error_reply(err));
        return;
    }
    admin_src_t *src = a->o.src;
    switch (q.cmd) {
    case ADMIN_STATUS: send_reply(a, route, route_len, ok_reply(admin_status_obj(src))); return;
    case ADMIN_WORKERS: send_reply(a, route, route_len, ok_reply(admin_workers_obj(src))); return;
    case ADMIN_PLACEMENT:
        send_reply(a, route, route_len, ok_reply(admin_placement_obj(src)));
        return;
    default: break;
    }
    if (!src->dispatch) {
        send_reply(a, route, route_len,
                   error_reply("this coordinator runs its experts in-process: no workers"));
        return;
    }
    pending_t *p = calloc(1, sizeof *p);
    if (!p) {
        send_reply(a, route, route_len, error_reply("out of memory"));
        return;
    }
    p->a = a;
    memcpy(p->route, route, route_len);
    p->route_len = route_len;
    p->cmd = q.cmd;
    snprintf(p->worker, sizeof p->worker, "%s", q.worker);
    const dispatch_op_kind_t k = q.cmd == ADMIN_DRAIN     ? DISPATCH_OP_DRAIN
                                 : q.cmd == ADMIN_UNDRAIN ? DISPATCH_OP_UNDRAIN
                                                          : DISPATCH_OP_RESTART;
    pthread_mutex_lock(&a->lock);
    a->in_flight++;
    pthread_mutex_unlock(&a->lock);
    fprintf(stderr, "admin: %s %s requested\n", admin_cmd_name(q.cmd), q.worker);
    if (dispatch_op_start(src->dispatch, k, q.worker, on_done, p) != ECS_OK) {
        pthread_mutex_lock(&a->lock);
        a->in_flight--;
        pthread_mutex_unlock(&a->lock);
        send_reply(a, route, route_len, error_reply(ecs_errmsg()));
        free(p);
    }
}

/* One message from the ROUTER: [route][body] (a REQ client adds an empty
 * frame between; anything else is dropped). */
static void read_one(admin_t *a)
{
    zmq_msg_t f[3];
    int n = 0;
    int more = 1;
    size_t ml = sizeof more;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, a->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&tmp);
            break;
        }
        if (n < 3)
            f[n] = tmp;
        else
            zmq_msg_close(&tmp);
        n++;
        if (zmq_getsockopt(a->sock, ZMQ_RCVMORE, &more, &ml) != 0)
            more = 0;
    }
    const int kept = n < 3 ? n : 3;
    if (n == 2 || (n == 3 && zmq_msg_size(&f[1]) == 0)) {
        const size_t rl = zmq_msg_size(&f[0]);
        zmq_msg_t *b = &f[n - 1];
        if (rl > 0 && rl <= ADMIN_ROUTE_MAX)
            handle(a, zmq_msg_data(&f[0]), rl, zmq_msg_data(b), zmq_msg_size(b));
    }
    for (int i = 0; i < kept; i++)
        zmq_msg_close(&f[i]);
}

static void *loop(void *arg)
{
    admin_t *a = arg;
    while (!atomic_load(&a->stop)) {
        zmq_pollitem_t it[2] = {{.socket = a->sock, .events = ZMQ_POLLIN},
                                {.fd = a->efd, .events = ZMQ_POLLIN}};
        if (zmq_poll(it, 2, -1) < 0 && zmq_errno() != EINTR)
            break;
        if (it[1].revents & ZMQ_POLLIN)
            answer_done(a);
        if (it[0].revents & ZMQ_POLLIN) {
            int ev = 0;
            size_t el = sizeof ev;
            while (zmq_getsockopt(a->sock, ZMQ_EVENTS, &ev, &el) == 0 && (ev & ZMQ_POLLIN))
                read_one(a);
        }
    }
    return NULL;
}

static void on_refuse(void *user, const char *address, const char *key)
{
    (void)user;
    fprintf(stderr, "admin: refused a client at %s (key %s): not in the allowed keys\n", address,
            key);
}

ecs_err_t admin_start(const admin_opts_t *o, admin_t **out)
{
    *out = NULL;
    if (!o->endpoint || (strncmp(o->endpoint, "tcp://", 6) && strncmp(o->endpoint, "ipc://", 6)))
        return ecs_error(ECS_ERR_INVAL, "--admin: '%s' is not tcp://HOST:PORT or ipc://PATH",
                         o->endpoint ? o->endpoint : "");
    admin_t *a = calloc(1, sizeof *a);
    if (!a)
        return ecs_error(ECS_ERR_NOMEM, "admin: out of memory");
    a->o = *o;
    a->efd = -1;
    pthread_mutex_init(&a->lock, NULL);
    ecs_err_t rc = ECS_OK;
    const int maxmsg = ADMIN_MAX_REQUEST + 1024, linger = 0;
    if ((a->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 || !(a->zctx = zmq_ctx_new()) ||
        !(a->sock = zmq_socket(a->zctx, ZMQ_ROUTER))) {
        rc = ecs_error(ECS_ERR_IO, "admin: cannot make its socket: %s", strerror(errno));
        goto fail;
    }
    if ((o->key_file != NULL) != (o->clients_dir != NULL)) {
        rc = ecs_error(ECS_ERR_INVAL, "admin: --admin-key and --admin-clients go together (the "
                       "endpoint's key pair and the directory of the clients' .pub keys)");
        goto fail;
    }
    if (o->key_file) {
        curve_keypair_t kp;
        if ((rc = curve_load_keypair(o->key_file, &kp)) != ECS_OK ||
            (rc = curve_auth_start_dir(a->zctx, o->clients_dir, on_refuse, a, &a->auth)) !=
                ECS_OK ||
            (rc = curve_server_setup(a->sock, &kp)) != ECS_OK) {
            rc = ecs_error(rc, "admin: %s", ecs_errmsg());
            goto fail;
        }
        memset(&kp, 0, sizeof kp);
    }
    int64_t mm = maxmsg;
    zmq_setsockopt(a->sock, ZMQ_MAXMSGSIZE, &mm, sizeof mm);
    zmq_setsockopt(a->sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(a->sock, o->endpoint) != 0) {
        rc = ecs_error(ECS_ERR_IO, "admin: cannot bind %s: %s", o->endpoint,
                       zmq_strerror(zmq_errno()));
        goto fail;
    }
    size_t el = sizeof a->endpoint;
    if (zmq_getsockopt(a->sock, ZMQ_LAST_ENDPOINT, a->endpoint, &el) != 0)
        snprintf(a->endpoint, sizeof a->endpoint, "%s", o->endpoint);
    /* only this user may drain workers through a local socket file */
    if (!strncmp(a->endpoint, "ipc://", 6) && chmod(a->endpoint + 6, 0600) != 0) {
        rc = ecs_error(ECS_ERR_IO, "admin: chmod %s: %s", a->endpoint + 6, strerror(errno));
        goto fail;
    }
    if (pthread_create(&a->thread, NULL, loop, a) != 0) {
        rc = ecs_error(ECS_ERR_IO, "admin: cannot start its thread");
        goto fail;
    }
    a->started = true;
    *out = a;
    return ECS_OK;
fail:
    admin_stop(a);
    admin_free(a);
    return rc;
}

void admin_stop(admin_t *a)
{
    if (!a)
        return;
    if (a->started) {
        atomic_store(&a->stop, true);
        const uint64_t one = 1;
        if (write(a->efd, &one, sizeof one) < 0) {
            /* cannot happen with a fresh counter */
        }
        pthread_join(a->thread, NULL);
        a->started = false;
    }
    if (a->sock) {
        if (!strncmp(a->endpoint, "ipc://", 6))
            unlink(a->endpoint + 6);
        zmq_close(a->sock);
        a->sock = NULL;
    }
    curve_auth_stop(a->auth);
    a->auth = NULL;
    if (a->zctx)
        zmq_ctx_term(a->zctx);
    a->zctx = NULL;
}

void admin_free(admin_t *a)
{
    if (!a)
        return;
    admin_stop(a);
    pending_t *p = a->done;
    while (p) {
        pending_t *next = p->next;
        free(p);
        p = next;
    }
    if (a->efd >= 0)
        close(a->efd);
    pthread_mutex_destroy(&a->lock);
    free(a);
}
