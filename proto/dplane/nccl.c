/* nccl.c - the NCCL transport of a data plane: a 2-rank communicator per
 * one-way channel, ncclSend / ncclRecv of bytes on a stream of its own.
 *
 * libnccl and libcudart are loaded with dlopen (their declarations are
 * restated here, only what is used), so nothing links them. The channel's
 * thread is the only one that touches the communicator: abort() only sets
 * a flag, and that thread, waiting for its stream (cudaStreamQuery and a
 * short sleep: it must notice the flag, and a blocking wait could not be
 * interrupted), aborts the communicator itself. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/dplane/dplane.h"

typedef struct {
    char internal[DPLANE_NCCL_ID_BYTES];
} nccl_id_t;
typedef void *nccl_comm_t;
typedef void *cuda_stream_t;
enum { NCCL_OK = 0, NCCL_UINT8 = 1, CUDA_OK = 0, CUDA_NOT_READY = 600, STREAM_NONBLOCKING = 1 };

typedef struct {
    void *nccl, *cudart;
    int (*get_unique_id)(nccl_id_t *);
    int (*comm_init_rank)(nccl_comm_t *, int, nccl_id_t, int);
    int (*send)(const void *, size_t, int, int, nccl_comm_t, cuda_stream_t);
    int (*recv)(void *, size_t, int, int, nccl_comm_t, cuda_stream_t);
    int (*comm_abort)(nccl_comm_t);
    int (*comm_destroy)(nccl_comm_t);
    int (*async_error)(nccl_comm_t, int *);
    const char *(*nccl_str)(int);
    int (*set_device)(int);
    int (*stream_create)(cuda_stream_t *, unsigned);
    int (*stream_query)(cuda_stream_t);
    int (*stream_destroy)(cuda_stream_t);
    const char *(*cuda_str)(int);
} nccl_api_t;

static nccl_api_t api;
static _Atomic int api_state; /* 0: not tried, 1: loaded, -1: failed */
static char api_why[512];

static void *open_first(const char *env, const char *const *names, char *why, size_t n)
{
    const char *e = getenv(env);
    if (e && *e) {
        void *h = dlopen(e, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            snprintf(why, n, "%s", dlerror());
        return h;
    }
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        snprintf(why, n, "%s", dlerror());
    }
    return NULL;
}

static bool load_syms(void)
{
    static const char *const nccl_names[] = {"libnccl.so.2", "libnccl.so",
                                             "/usr/local/cuda/lib64/libnccl.so.2", NULL};
    static const char *const cudart_names[] = {"libcudart.so.13", "libcudart.so.12",
                                               "libcudart.so",
                                               "/usr/local/cuda/lib64/libcudart.so", NULL};
    char why[256] = "";
    if (!(api.cudart = open_first("ECS_CUDART_LIB", cudart_names, why, sizeof why))) {
        snprintf(api_why, sizeof api_why, "no libcudart: %s", why);
        return false;
    }
    if (!(api.nccl = open_first("ECS_NCCL_LIB", nccl_names, why, sizeof why))) {
        snprintf(api_why, sizeof api_why, "no libnccl: %s", why);
        return false;
    }
    /* the POSIX idiom: a function pointer's storage written through void ** */
    const struct {
        void **slot;
        bool cuda;
        const char *name;
    } syms[] = {
        {(void **)&api.get_unique_id, false, "ncclGetUniqueId"},
        {(void **)&api.comm_init_rank, false, "ncclCommInitRank"},
        {(void **)&api.send, false, "ncclSend"},
        {(void **)&api.recv, false, "ncclRecv"},
        {(void **)&api.comm_abort, false, "ncclCommAbort"},
        {(void **)&api.comm_destroy, false, "ncclCommDestroy"},
        {(void **)&api.async_error, false, "ncclCommGetAsyncError"},
        {(void **)&api.nccl_str, false, "ncclGetErrorString"},
        {(void **)&api.set_device, true, "cudaSetDevice"},
        {(void **)&api.stream_create, true, "cudaStreamCreateWithFlags"},
        {(void **)&api.stream_query, true, "cudaStreamQuery"},
        {(void **)&api.stream_destroy, true, "cudaStreamDestroy"},
        {(void **)&api.cuda_str, true, "cudaGetErrorString"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
        if (!(*syms[i].slot = dlsym(syms[i].cuda ? api.cudart : api.nccl, syms[i].name))) {
            snprintf(api_why, sizeof api_why, "%s has no %s",
                     syms[i].cuda ? "libcudart" : "libnccl", syms[i].name);
            return false;
        }
    return true;
}

/* Loads both libraries once (any thread; a failure is remembered). */
static ecs_err_t load(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    if (atomic_load(&api_state) == 0) {
        pthread_mutex_lock(&mu);
        if (atomic_load(&api_state) == 0)
            atomic_store(&api_state, load_syms() ? 1 : -1);
        pthread_mutex_unlock(&mu);
    }
    if (atomic_load(&api_state) < 0)
        return ecs_error(ECS_ERR_UNSUPPORTED, "nccl data plane: %s", api_why);
    return ECS_OK;
}

typedef struct {
    nccl_comm_t comm;
    cuda_stream_t stream;
    int rank, device;
    atomic_bool abort;
    bool comm_aborted;
} nccl_ctx_t;

ecs_err_t dplane_nccl_unique_id(uint8_t id[DPLANE_NCCL_ID_BYTES])
{
    ecs_err_t e = load();
    if (e != ECS_OK)
        return e;
    nccl_id_t u;
    const int rc = api.get_unique_id(&u);
    if (rc != NCCL_OK)
        return ecs_error(ECS_ERR_IO, "ncclGetUniqueId: %s", api.nccl_str(rc));
    memcpy(id, u.internal, sizeof u.internal);
    return ECS_OK;
}

/* Waits for the stream, watching the abort flag and NCCL's async errors. */
static ecs_err_t wait_stream(nccl_ctx_t *c, const char *what)
{
    const struct timespec nap = {0, 20000};
    for (;;) {
        const int q = api.stream_query(c->stream);
        if (q == CUDA_OK)
            return ECS_OK;
        if (q != CUDA_NOT_READY)
            return ecs_error(ECS_ERR_IO, "nccl %s: %s", what, api.cuda_str(q));
        int ae = NCCL_OK;
        if (atomic_load(&c->abort) || (api.async_error(c->comm, &ae) == NCCL_OK && ae != NCCL_OK)) {
            if (!c->comm_aborted) {
                api.comm_abort(c->comm);
                c->comm_aborted = true;
            }
            return ecs_error(ECS_ERR_IO, "nccl %s: %s", what,
                             ae != NCCL_OK ? api.nccl_str(ae) : "aborted");
        }
        nanosleep(&nap, NULL);
    }
}

static ecs_err_t nccl_move(nccl_ctx_t *c, void *buf, size_t n, bool send)
{
    if (atomic_load(&c->abort) || c->comm_aborted)
        return ecs_error(ECS_ERR_IO, "nccl: communicator aborted");
    api.set_device(c->device);
    const int peer = 1 - c->rank;
    const int rc = send ? api.send(buf, n, NCCL_UINT8, peer, c->comm, c->stream)
                        : api.recv(buf, n, NCCL_UINT8, peer, c->comm, c->stream);
    if (rc != NCCL_OK)
        return ecs_error(ECS_ERR_IO, "nccl %s of %zu bytes: %s", send ? "send" : "recv", n,
                         api.nccl_str(rc));
    return wait_stream(c, send ? "send" : "recv");
}

static ecs_err_t t_send(void *ctx, const void *buf, size_t n)
{
    return nccl_move(ctx, (void *)buf, n, true);
}
static ecs_err_t t_recv(void *ctx, void *buf, size_t n) { return nccl_move(ctx, buf, n, false); }
static void t_abort(void *ctx) { atomic_store(&((nccl_ctx_t *)ctx)->abort, true); }

static void t_close(void *ctx)
{
    nccl_ctx_t *c = ctx;
    if (!c)
        return;
    api.set_device(c->device);
    if (c->comm) {
        if (atomic_load(&c->abort) || c->comm_aborted) {
            if (!c->comm_aborted) /* a dead peer: no handshake */
                api.comm_abort(c->comm);
        } else {
            api.comm_destroy(c->comm);
        }
    }
    if (c->stream)
        api.stream_destroy(c->stream);
    free(c);
}

ecs_err_t dplane_nccl_open(const uint8_t id[DPLANE_NCCL_ID_BYTES], int rank, int device,
                           dplane_transport_t *out)
{
    memset(out, 0, sizeof *out);
    if (rank != 0 && rank != 1)
        return ecs_error(ECS_ERR_INVAL, "nccl data plane: rank %d (0 or 1)", rank);
    ecs_err_t e = load();
    if (e != ECS_OK)
        return e;
    nccl_ctx_t *c = calloc(1, sizeof *c);
    if (!c)
        return ecs_error(ECS_ERR_NOMEM, "nccl data plane: no memory");
    c->rank = rank;
    c->device = device;
    int rc = api.set_device(device);
    if (rc == CUDA_OK)
        rc = api.stream_create(&c->stream, STREAM_NONBLOCKING);
    if (rc != CUDA_OK) {
        e = ecs_error(ECS_ERR_IO, "nccl data plane: cuda:%d: %s", device, api.cuda_str(rc));
        t_close(c);
        return e;
    }
    nccl_id_t u;
    memcpy(u.internal, id, sizeof u.internal);
    /* blocks until the peer's rank joins: both sides open at registration */
    if ((rc = api.comm_init_rank(&c->comm, 2, u, rank)) != NCCL_OK) {
        e = ecs_error(ECS_ERR_IO, "ncclCommInitRank (rank %d): %s", rank, api.nccl_str(rc));
        c->comm = NULL;
        t_close(c);
        return e;
    }
    *out = (dplane_transport_t){"nccl", t_send, t_recv, t_abort, t_close, c};
    return ECS_OK;
}
