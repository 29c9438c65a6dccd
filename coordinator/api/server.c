/* server.c - the event loop: listening socket, connections (non-blocking,
 * one libev watcher pair each), request framing with limits, read and idle
 * timeouts, output queues, and the ev_async wake-ups from the scheduler. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api_int.h"

#define IN_CAP (64 * 1024)
#define TICK_S 0.25

api_opts_t api_opts_default(void)
{
    return (api_opts_t){.host = "127.0.0.1", .port = 8080, .model_id = "model",
                        .max_body = 8u << 20, .max_header = 16u << 10, .read_timeout_s = 30,
                        .idle_timeout_s = 60, .max_conns = 1024, .handle_signals = true,
                        .reasoning_budget = -1};
}

/* ---- connections ---- */

static void conn_close(api_conn_t *c)
{
    api_server_t *srv = c->srv;
    if (c->job) { /* the client is gone: its request stops now */
        api_job_abandon(srv, c->job);
        c->job = NULL;
        srv->disconnects++;
    }
    ev_io_stop(srv->loop, &c->rio);
    ev_io_stop(srv->loop, &c->wio);
    ev_timer_stop(srv->loop, &c->timer);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->n_conns--;
    api_http_free(c->http);
    api_buf_free(&c->out);
    free(c->in);
    free(c);
}

/* Writes what is queued; false if the connection was closed. */
static bool conn_flush(api_conn_t *c)
{
    while (c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ev_io_start(c->srv->loop, &c->wio);
            return true;
        }
        if (n <= 0) {
            conn_close(c);
            return false;
        }
        c->out_off += (size_t)n;
    }
    c->out.len = c->out_off = 0;
    ev_io_stop(c->srv->loop, &c->wio);
    if (c->close_after && !c->busy) {
        conn_close(c);
        return false;
    }
    return true;
}

void api_conn_write(api_conn_t *c, const char *s, size_t n)
{
    api_buf_add(&c->out, s, n);
    if (c->out.failed) {
        c->close_after = true;
        c->busy = false;
        c->out.len = c->out_off;
    }
}

static void pump(api_conn_t *c);

void api_conn_kick(api_conn_t *c)
{
    pump(c);
}

static void conn_write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    api_conn_t *c = w->data;
    if (conn_flush(c) && !c->busy)
        pump(c);
}

const char *api_status_text(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
    }
}

static const int status_list[API_M_STATUSES] = {200, 400, 401, 404, 405, 408, 413, 431, 500, 503};

void api_count(api_server_t *srv, int m_route, int status)
{
    for (int i = 0; i < API_M_STATUSES; i++)
        if (status_list[i] == status || i == API_M_STATUSES - 1) {
            srv->req_count[m_route][status_list[i] == status ? i : 8]++;
            return;
        }
}

void api_send_simple(api_conn_t *c, int status, const char *ctype, const char *body, size_t n)
{
    /* after a timeout or a request too large to read, the stream is lost */
    bool keep = !c->close_after && status != 408 && status != 413 && status != 431;
    char hdr[256];
    int hn = snprintf(hdr, sizeof hdr,
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s\r\n",
                      status, api_status_text(status), ctype, n,
                      keep ? "" : "Connection: close\r\n", c->extra_hdr ? c->extra_hdr : "");
    c->extra_hdr = NULL;
    api_conn_write(c, hdr, (size_t)hn);
    api_conn_write(c, body, n);
    if (!keep)
        c->close_after = true;
    api_count(c->srv, c->m_route, status);
}

void api_send_error(api_conn_t *c, api_route_t route, int status, const char *msg)
{
    api_buf_t b = {0};
    api_error_body(&b, route, status, msg);
    api_send_simple(c, status, "application/json", b.failed ? "{}" : b.p, b.failed ? 2 : b.len);
    api_buf_free(&b);
}

void api_conn_done(api_conn_t *c)
{
    c->busy = false;
    c->job = NULL;
    if (!api_http_keep_alive(c->http))
        c->close_after = true;
    api_http_next(c->http);
    c->req_t0 = c->in_len ? ev_now(c->srv->loop) : 0;
    c->last_t = ev_now(c->srv->loop);
    if (!c->reading && !c->close_after) {
        ev_io_start(c->srv->loop, &c->rio);
        c->reading = true;
    }
}

/* Parses buffered bytes into requests while the connection is free. */
static void pump(api_conn_t *c)
{
    while (!c->busy && !c->close_after && c->in_len > 0) {
        size_t used = 0;
        api_http_status_t st = api_http_feed(c->http, c->in, c->in_len, &used);
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
        if (api_http_take_continue(c->http))
            api_conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        if (st == API_HTTP_MORE)
            break;
        c->m_route = API_M_OTHER;
        api_route_t rt = strncmp(api_http_path(c->http), "/v1/messages", 12) == 0
                             ? API_ROUTE_MESSAGES : API_ROUTE_CHAT;
        if (st == API_HTTP_DONE) {
            c->busy = true;
            api_handle(c); /* may answer at once (api_conn_done) or later */
            continue;
        }
        c->close_after = true;
        if (st == API_HTTP_TOO_LARGE_HDR)
            api_send_error(c, rt, 431, "the request line and headers exceed the server's limit");
        else if (st == API_HTTP_TOO_LARGE_BODY)
            api_send_error(c, rt, 413, "the request body exceeds the server's limit");
        else
            api_send_error(c, rt, 400, "malformed HTTP request");
    }
    if (c->busy && c->in_len == c->in_cap && c->reading) {
        ev_io_stop(c->srv->loop, &c->rio); /* pipelined bytes wait their turn */
        c->reading = false;
    }
    conn_flush(c);
}

static void conn_read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)revents;
    api_conn_t *c = w->data;
    if (c->in_len == c->in_cap) {
        ev_io_stop(loop, &c->rio);
        c->reading = false;
        return;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) { /* closed or reset: cancel whatever it asked for */
        conn_close(c);
        return;
    }
    c->last_t = ev_now(loop);
    if (!c->busy && c->req_t0 == 0)
        c->req_t0 = ev_now(loop);
    c->in_len += (size_t)n;
    if (!c->close_after)
        pump(c);
}

static void conn_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    api_conn_t *c = w->data;
    double now = ev_now(loop);
    if (c->busy)
        return;
    if (c->req_t0 > 0 && now - c->req_t0 > c->srv->o.read_timeout_s && !c->close_after) {
        c->close_after = true;
        c->m_route = API_M_OTHER;
        api_send_error(c, API_ROUTE_CHAT, 408, "the request was not completed in time");
        conn_flush(c);
        return;
    }
    if (c->req_t0 == 0 && c->out.len == 0 && now - c->last_t > c->srv->o.idle_timeout_s)
        conn_close(c);
    else if (c->close_after && now - c->last_t > c->srv->o.idle_timeout_s)
        conn_close(c); /* a client that never reads its answer */
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)revents;
    api_server_t *srv = w->data;
    for (;;) {
        int fd = accept4(srv->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
            /* out of descriptors: the listening socket stays readable, so
             * pause accepting for a moment instead of spinning on it */
            ev_io_stop(loop, &srv->accept_w);
            ev_timer_start(loop, &srv->accept_pause);
            return;
        }
        if (fd < 0)
            return;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        api_conn_t *c = calloc(1, sizeof *c);
        if (!c || !(c->in = malloc(IN_CAP)) || api_http_new(srv->o.max_header, srv->o.max_body,
                                                           &c->http) != ECS_OK) {
            if (c)
                free(c->in);
            free(c);
            close(fd);
            continue;
        }
        c->srv = srv;
        c->fd = fd;
        c->in_cap = IN_CAP;
        c->last_t = ev_now(loop);
        ev_io_init(&c->rio, conn_read_cb, fd, EV_READ);
        ev_io_init(&c->wio, conn_write_cb, fd, EV_WRITE);
        ev_timer_init(&c->timer, conn_timer_cb, TICK_S, TICK_S);
        c->rio.data = c->wio.data = c->timer.data = c;
        c->next = srv->conns;
        if (srv->conns)
            srv->conns->prev = c;
        srv->conns = c;
        srv->n_conns++;
        srv->conns_total++;
        ev_timer_start(loop, &c->timer);
        if (srv->n_conns > srv->o.max_conns) {
            c->close_after = true;
            c->m_route = API_M_OTHER;
            api_send_error(c, API_ROUTE_CHAT, 503, "too many connections");
            conn_flush(c);
            continue;
        }
        ev_io_start(loop, &c->rio);
        c->reading = true;
    }
}

static void accept_resume_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    api_server_t *srv = w->data;
    ev_io_start(loop, &srv->accept_w);
}

static void wake_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)loop;
    (void)revents;
    api_server_t *srv = w->data;
    sched_drain(srv->sched, api_on_update, srv);
}

static void stop_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

/* The grace period runs on the monotonic clock: ev_now() is wall-clock
 * time, which may jump. */
static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A balancer's health check takes this server out within seconds: a retry
 * after the rest of the grace period, at most API_RETRY_AFTER_S, goes
 * elsewhere. */
#define API_RETRY_AFTER_S 10
int api_retry_after(const api_server_t *srv)
{
    const double left = srv->drain_deadline - mono_now();
    return left > API_RETRY_AFTER_S ? API_RETRY_AFTER_S : left > 1 ? (int)(left + 0.999) : 1;
}

/* Whether every answer queued so far has been written. */
static bool all_sent(const api_server_t *srv)
{
    for (const api_conn_t *c = srv->conns; c; c = c->next)
        if (c->out.len > c->out_off)
            return false;
    return true;
}

/* While shutting down: ends the loop when the last request has been
 * answered, or when the grace period is over (api_server_run then
 * cancels what is left). */
static void drain_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    api_server_t *srv = w->data;
    if (srv->n_jobs == 0 && all_sent(srv)) {
        fprintf(stderr, "ecs-coordinator: every running request finished\n");
        ev_break(loop, EVBREAK_ALL);
    } else if (mono_now() >= srv->drain_deadline) {
        fprintf(stderr, "ecs-coordinator: grace period over: cancelling %d requests\n",
                srv->n_jobs);
        ev_break(loop, EVBREAK_ALL);
    }
}

static void signal_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)revents;
    api_server_t *srv = w->data;
    if (srv->draining || srv->o.grace_s <= 0) {
        ev_break(loop, EVBREAK_ALL);
        return;
    }
    srv->draining = true;
    if (srv->o.shutting_down)
        atomic_store(srv->o.shutting_down, true);
    srv->drain_deadline = mono_now() + srv->o.grace_s;
    fprintf(stderr, "ecs-coordinator: %s: not taking new requests; %d running get up to %.0f s "
            "to finish (another signal stops at once)\n", w->signum == SIGINT ? "SIGINT" : "SIGTERM",
            srv->n_jobs, srv->o.grace_s);
    /* a short poll only while shutting down: the end is two conditions */
    ev_timer_init(&srv->drain_w, drain_cb, 0, 0.05);
    srv->drain_w.data = srv;
    ev_timer_start(loop, &srv->drain_w);
}

static void sched_notify(void *arg)
{
    api_server_t *srv = arg;
    ev_async_send(srv->loop, &srv->wake);
}


static ecs_err_t listen_on(api_server_t *srv)
{
    char port[16];
    snprintf(port, sizeof port, "%d", srv->o.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    int rc = getaddrinfo(srv->o.host, port, &hints, &ai);
    if (rc != 0)
        return ecs_error(ECS_ERR_IO, "--http %s:%d: %s", srv->o.host, srv->o.port, gai_strerror(rc));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 512) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return ecs_error(ECS_ERR_IO, "cannot listen on %s:%d: %s", srv->o.host, srv->o.port,
                         strerror(e));
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    srv->fd = fd;
    return ECS_OK;
}

ecs_err_t api_server_new(const api_opts_t *o, model_t *m, const tok_t *tok, sched_t *sched,
                         api_server_t **out)
{
    *out = NULL;
    api_server_t *srv = calloc(1, sizeof *srv);
    if (!srv)
        return ecs_error(ECS_ERR_NOMEM, "out of memory");
    srv->o = *o;
    srv->m = m;
    srv->tok = tok;
    srv->sched = sched;
    srv->fd = -1;
    if (api_specials_init(tok, &srv->specials) != ECS_OK ||
        !(srv->loop = ev_loop_new(EVFLAG_AUTO))) {
        api_server_free(srv);
        return ecs_error(ECS_ERR_NOMEM, "cannot create the event loop");
    }
    ecs_err_t e = listen_on(srv);
    if (e != ECS_OK) {
        api_server_free(srv);
        return e;
    }
    ev_io_init(&srv->accept_w, accept_cb, srv->fd, EV_READ);
    ev_timer_init(&srv->accept_pause, accept_resume_cb, 0.1, 0);
    srv->accept_pause.data = srv;
    ev_async_init(&srv->wake, wake_cb);
    ev_async_init(&srv->stop_w, stop_cb);
    srv->accept_w.data = srv->wake.data = srv->stop_w.data = srv;
    ev_io_start(srv->loop, &srv->accept_w);
    ev_async_start(srv->loop, &srv->wake);
    ev_async_start(srv->loop, &srv->stop_w);
    sched_set_notify(sched, sched_notify, srv);
    if (o->handle_signals) {
        ev_signal_init(&srv->sigint_w, signal_cb, SIGINT);
        ev_signal_init(&srv->sigterm_w, signal_cb, SIGTERM);
        srv->sigint_w.data = srv->sigterm_w.data = srv;
        ev_signal_start(srv->loop, &srv->sigint_w);
        ev_signal_start(srv->loop, &srv->sigterm_w);
    }
    *out = srv;
    return ECS_OK;
}

ecs_err_t api_server_run(api_server_t *srv)
{
    ev_run(srv->loop, 0);
    ev_timer_stop(srv->loop, &srv->drain_w);
    while (srv->conns)
        conn_close(srv->conns);
    return ECS_OK;
}

void api_server_stop(api_server_t *srv)
{
    ev_async_send(srv->loop, &srv->stop_w);
}

int api_server_port(const api_server_t *srv)
{
    return srv->port;
}

void api_server_free(api_server_t *srv)
{
    if (!srv)
        return;
    while (srv->conns)
        conn_close(srv->conns);
    if (srv->sched) /* the last updates free the abandoned requests */
        sched_drain(srv->sched, api_on_update, srv);
    if (srv->fd >= 0)
        close(srv->fd);
    if (srv->loop)
        ev_loop_destroy(srv->loop);
    api_specials_free(&srv->specials);
    free(srv);
}
