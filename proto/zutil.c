/* zutil.c - the ZeroMQ plumbing shared by both sides of the transport:
 * socket options, whole-message receive with a frame limit, and encoding a
 * wire message straight into a ZeroMQ frame. */
#include "zutil.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* struct sched_attr of sched_setattr(2), which glibc does not declare */
typedef struct {
    uint32_t size, sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
} zu_sched_attr_t;

static void set_slice(pid_t tid, uint64_t ns)
{
#ifdef SYS_sched_setattr
    errno = 0;
    const int nice = getpriority(PRIO_PROCESS, (id_t)tid);
    if (nice == -1 && errno)
        return;
    /* a kernel without custom slices ignores sched_runtime for SCHED_OTHER;
     * 0 is the default slice */
    zu_sched_attr_t a = {.size = sizeof a, .sched_policy = SCHED_OTHER, .sched_nice = nice,
                         .sched_runtime = ns};
    if (syscall(SYS_sched_setattr, tid, &a, 0) != 0) { /* not this kernel: nothing to do */ }
#else
    (void)tid;
    (void)ns;
#endif
}

/* the shortest slice EEVDF takes: 0.1 ms */
static void short_slice(pid_t tid) { set_slice(tid, 100000); }

void zu_short_slice(void) { short_slice(0); }

void zu_slice_self(uint64_t ns) { set_slice(0, ns); }

void zu_short_slice_zmq(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[64], comm[32] = "";
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%.20s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (!fgets(comm, sizeof comm, f))
            comm[0] = 0;
        fclose(f);
        if (!strncmp(comm, "ZMQbg/IO/", 9))
            short_slice((pid_t)atoi(e->d_name));
    }
    closedir(d);
}

uint64_t zu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void zu_deadline(clockid_t clk, int timeout_ms, struct timespec *ts)
{
    clock_gettime(clk, ts);
    if (timeout_ms <= 0)
        return;
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

ecs_err_t zu_socket(void *zctx, int type, int hwm, int linger_ms, void **out)
{
    void *s = zmq_socket(zctx, type);
    if (!s)
        return ecs_error(ECS_ERR_IO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    if (hwm <= 0)
        hwm = MUX_DEFAULT_HWM;
    if (zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) ||
        zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm) ||
        zmq_setsockopt(s, ZMQ_LINGER, &linger_ms, sizeof linger_ms)) {
        int err = zmq_errno();
        zmq_close(s);
        return ecs_error(ECS_ERR_IO, "zmq_setsockopt: %s", zmq_strerror(err));
    }
    /* a frame bigger than a whole call could be is refused by ZeroMQ itself,
     * before it allocates it */
    const int64_t maxmsg = (int64_t)WIRE_MAX_PAYLOAD + WIRE_HEADER_SIZE + WIRE_MAX_BODY;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    *out = s;
    return ECS_OK;
}

void zu_last_endpoint(void *sock, char *buf, size_t cap)
{
    size_t len = cap;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, buf, &len) != 0 && cap)
        buf[0] = '\0';
    if (cap)
        buf[cap - 1] = '\0';
}

void zu_unbind(void *sock, const char *ep)
{
    if (!ep[0])
        return;
    zmq_unbind(sock, ep);
    if (!strncmp(ep, "ipc://", 6) && ep[6] != '@')
        unlink(ep + 6);
}

void zu_close_parts(zmq_msg_t *parts, int n)
{
    for (int i = 0; i < n && i < ZU_MAX_PARTS; i++)
        zmq_msg_close(&parts[i]);
}

int zu_recv(void *sock, zmq_msg_t parts[ZU_MAX_PARTS], int *nparts, size_t *bytes)
{
    int n = 0;
    size_t total = 0;
    zmq_msg_t extra;
    for (;;) {
        zmq_msg_t *p = n < ZU_MAX_PARTS ? &parts[n] : &extra;
        zmq_msg_init(p);
        if (zmq_msg_recv(p, sock, n ? 0 : ZMQ_DONTWAIT) < 0) {
            const int err = zmq_errno();
            zmq_msg_close(p);
            zu_close_parts(parts, n);
            if (n == 0 && err == EAGAIN)
                return 0;
            *nparts = 0;
            return -1;
        }
        total += zmq_msg_size(p);
        const int more = zmq_msg_more(p);
        if (n >= ZU_MAX_PARTS)
            zmq_msg_close(&extra); /* counted, not kept */
        n++;
        if (!more)
            break;
    }
    *nparts = n;
    *bytes = total;
    return 1;
}

static void free_aligned(void *data, void *hint)
{
    (void)hint;
    free(data);
}

ecs_err_t zu_align(zmq_msg_t *msg)
{
    const size_t n = zmq_msg_size(msg);
    if (n == 0 || (uintptr_t)zmq_msg_data(msg) % WIRE_PAYLOAD_ALIGN == 0)
        return ECS_OK;
    void *p = aligned_alloc(WIRE_PAYLOAD_ALIGN, (n + WIRE_PAYLOAD_ALIGN - 1) /
                                                    WIRE_PAYLOAD_ALIGN * WIRE_PAYLOAD_ALIGN);
    if (!p)
        return ecs_error(ECS_ERR_NOMEM, "no memory for an aligned copy of %zu bytes", n);
    memcpy(p, zmq_msg_data(msg), n);
    zmq_msg_t copy;
    if (zmq_msg_init_data(&copy, p, n, free_aligned, NULL)) {
        free(p);
        return ecs_error(ECS_ERR_NOMEM, "zmq_msg_init_data failed");
    }
    zmq_msg_move(msg, &copy); /* releases the misaligned frame */
    zmq_msg_close(&copy);
    return ECS_OK;
}

ecs_err_t zu_encode(const wire_msg_t *m, zmq_msg_t *out)
{
    size_t n, len;
    ecs_err_t e = wire_frame_size(m, &n);
    if (e)
        return e;
    if (zmq_msg_init_size(out, n))
        return ecs_error(ECS_ERR_NOMEM, "zmq_msg_init_size(%zu) failed", n);
    if ((e = wire_encode(m, zmq_msg_data(out), n, &len))) {
        zmq_msg_close(out);
        return e;
    }
    return ECS_OK;
}

int zu_send(void *sock, const mux_route_t *route, const wire_msg_t *m, size_t *bytes)
{
    zmq_msg_t f;
    if (zu_encode(m, &f))
        return EINVAL;
    const void *pl = NULL;
    size_t npl = 0;
    const bool has = wire_kind_has_payload(m->kind);
    if (m->kind == WIRE_CALL) {
        pl = m->call.payload;
        npl = m->call.payload_bytes;
    } else if (m->kind == WIRE_RESULT) {
        pl = m->result.payload;
        npl = m->result.payload_bytes;
    }
    const size_t fsz = zmq_msg_size(&f);
    if (route && zmq_send(sock, route->id, route->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f);
        return zmq_errno();
    }
    /* after the first frame of a message went in, ZeroMQ takes the rest */
    if (zmq_msg_send(&f, sock, (has ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f);
        return zmq_errno();
    }
    if (has && zmq_send(sock, pl, npl, ZMQ_DONTWAIT) < 0)
        return zmq_errno();
    if (bytes)
        *bytes += fsz + npl;
    return 0;
}

int zu_send_error(void *sock, const mux_route_t *route, wire_status_t code, wire_kind_t about,
                  uint64_t request_id, const char *message)
{
    char msg[WIRE_MAX_STRING];
    snprintf(msg, sizeof msg, "%s", message ? message : "");
    wire_msg_t m = {.kind = WIRE_ERROR,
                    .error = {.code = code, .message = msg, .request_id = request_id,
                              .about = (unsigned)about < WIRE_KIND_COUNT ? about : WIRE_NONE}};
    return zu_send(sock, route, &m, NULL);
}

wire_status_t zu_status_of(ecs_err_t e)
{
    return e == ECS_ERR_UNSUPPORTED ? WIRE_ST_VERSION
         : e == ECS_ERR_NOMEM       ? WIRE_ST_INTERNAL
                                    : WIRE_ST_BAD_MESSAGE;
}

int zu_lat_bucket(uint64_t ns)
{
    uint64_t us = ns / 1000;
    int b = 0;
    while (us > 1 && b < MUX_LAT_BUCKETS - 1) {
        us >>= 1;
        b++;
    }
    return b;
}
