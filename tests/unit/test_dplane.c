/* test_dplane.c - the data planes of proto/dplane: negotiation, the ordered
 * one-way channel over a fake transport that behaves like NCCL (a send
 * blocks until the peer's receive takes it; sizes must match), abort and
 * teardown, the RDMA buffer pool and credits; and, where a GPU and libnccl
 * are present, the NCCL transport between two ranks (skipped by name
 * otherwise). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kernels/gpu/gpu.h"
#include "proto/dplane/dplane.h"

/* ---- the fake transport: a rendezvous between two ends ---- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const void *data; /* the send waiting to be taken */
    size_t n;
    bool taken, aborted;
    ecs_err_t size_error;
    atomic_int in_use; /* threads inside send / recv at once: must stay <= 1 per end */
} pipe_t;

typedef struct {
    pipe_t *p;
    atomic_int busy;
    int max_busy;
} end_t;

static void pipe_init(pipe_t *p)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
}

static void enter(end_t *e)
{
    const int b = atomic_fetch_add(&e->busy, 1) + 1;
    if (b > e->max_busy)
        e->max_busy = b;
}

static ecs_err_t f_send(void *ctx, const void *buf, size_t n)
{
    end_t *e = ctx;
    pipe_t *p = e->p;
    enter(e);
    pthread_mutex_lock(&p->mu);
    ecs_err_t rc = ECS_OK;
    while (p->data && !p->aborted)
        pthread_cond_wait(&p->cv, &p->mu);
    if (!p->aborted) {
        p->data = buf;
        p->n = n;
        p->taken = false;
        pthread_cond_broadcast(&p->cv);
        while (!p->taken && !p->aborted)
            pthread_cond_wait(&p->cv, &p->mu);
    }
    if (p->aborted && !p->taken)
        rc = ecs_error(ECS_ERR_IO, "fake: aborted");
    p->data = NULL;
    p->taken = false;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    atomic_fetch_sub(&e->busy, 1);
    return rc;
}

static ecs_err_t f_recv(void *ctx, void *buf, size_t n)
{
    end_t *e = ctx;
    pipe_t *p = e->p;
    enter(e);
    pthread_mutex_lock(&p->mu);
    ecs_err_t rc = ECS_OK;
    while ((!p->data || p->taken) && !p->aborted)
        pthread_cond_wait(&p->cv, &p->mu);
    if (p->aborted) {
        rc = ecs_error(ECS_ERR_IO, "fake: aborted");
    } else {
        if (p->n != n) /* NCCL would hang or corrupt: the test must never see it */
            p->size_error = ECS_ERR_RANGE;
        memcpy(buf, p->data, n < p->n ? n : p->n);
        p->taken = true;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    atomic_fetch_sub(&e->busy, 1);
    return rc;
}

static void f_abort(void *ctx)
{
    pipe_t *p = ((end_t *)ctx)->p;
    pthread_mutex_lock(&p->mu);
    p->aborted = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static dplane_transport_t fake(end_t *e) { return (dplane_transport_t){"fake", f_send, f_recv, f_abort, NULL, e}; }

/* ---- completions ---- */

#define N_OPS 200
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t order[N_OPS * 2];
    ecs_err_t rc[N_OPS * 2];
    int n;
} log_t;

static void log_init(log_t *l)
{
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
}

static void on_done(void *arg, uint64_t seq, ecs_err_t rc)
{
    log_t *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n < N_OPS * 2) {
        l->order[l->n] = seq;
        l->rc[l->n] = rc;
        l->n++;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static bool wait_n(log_t *l, int n)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 30;
    pthread_mutex_lock(&l->mu);
    while (l->n < n && pthread_cond_timedwait(&l->cv, &l->mu, &dl) == 0)
        ;
    const bool ok = l->n >= n;
    pthread_mutex_unlock(&l->mu);
    return ok;
}

Test(dplane, choose)
{
    cr_assert_eq(dplane_choose(WIRE_CAP_NCCL | WIRE_CAP_RDMA, WIRE_CAP_NCCL | WIRE_CAP_RDMA),
                 WIRE_PLANE_NCCL);
    cr_assert_eq(dplane_choose(WIRE_CAP_NCCL | WIRE_CAP_RDMA, WIRE_CAP_RDMA), WIRE_PLANE_RDMA);
    cr_assert_eq(dplane_choose(WIRE_CAP_NCCL, WIRE_CAP_RDMA), WIRE_PLANE_ZMQ);
    cr_assert_eq(dplane_choose(0, WIRE_CAP_NCCL), WIRE_PLANE_ZMQ);
    cr_assert_eq(dplane_choose(WIRE_CAP_RESULT_BF16 | WIRE_CAP_INPUT_Q8, ~0ull), WIRE_PLANE_ZMQ);
    cr_assert_str_eq(dplane_plane_name(WIRE_PLANE_NCCL), "nccl");
    /* a host that computes on the CPU never offers NCCL, whatever is installed */
    const dplane_env_t cpu = {.gpu = false, .want_nccl = true, .want_rdma = false};
    cr_assert_eq(dplane_local_caps(&cpu) & WIRE_CAP_NCCL, 0);
    const dplane_env_t none = {.gpu = true, .want_nccl = false, .want_rdma = false};
    cr_assert_eq(dplane_local_caps(&none), 0);
}

/* Submitters on two threads, each in its own scrambled order: both ends
 * still move payload n as the n-th transfer, one thread per end. */
typedef struct {
    dplane_chan_t *c;
    uint8_t (*bufs)[64];
    int first, step;
    bool reverse;
} submitter_t;

static void *submit_main(void *arg)
{
    submitter_t *s = arg;
    for (int k = 0; k < N_OPS / 2; k++) {
        const int i = s->reverse ? N_OPS - 1 - (s->first + k * s->step)
                                 : s->first + k * s->step;
        const size_t n = 1 + (size_t)i % 64;
        while (dplane_chan_submit(s->c, (uint64_t)i, s->bufs[i], n) == ECS_ERR_RANGE) {
            const struct timespec nap = {0, 100000}; /* more than depth ahead: wait */
            nanosleep(&nap, NULL);
        }
    }
    return NULL;
}

Test(dplane, ordered_over_fake)
{
    pipe_t p;
    pipe_init(&p);
    end_t es = {.p = &p}, er = {.p = &p};
    log_t ls, lr;
    log_init(&ls);
    log_init(&lr);
    static uint8_t sbuf[N_OPS][64], rbuf[N_OPS][64];
    for (int i = 0; i < N_OPS; i++)
        for (int j = 0; j < 64; j++)
            sbuf[i][j] = (uint8_t)(i * 31 + j);
    memset(rbuf, 0, sizeof rbuf);
    dplane_chan_t *cs, *cr;
    dplane_transport_t ts = fake(&es), tr = fake(&er);
    cr_assert_eq(dplane_chan_new(&ts, DPLANE_SEND, N_OPS, on_done, &ls, &cs), ECS_OK);
    cr_assert_eq(dplane_chan_new(&tr, DPLANE_RECV, N_OPS, on_done, &lr, &cr), ECS_OK);
    /* evens ascending and odds descending on one end, the other way round
     * on the other */
    submitter_t sub[4] = {{cs, sbuf, 0, 2, false}, {cs, sbuf, 0, 2, true},
                          {cr, rbuf, 1, 2, true}, {cr, rbuf, 1, 2, false}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, submit_main, &sub[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    cr_assert(wait_n(&ls, N_OPS) && wait_n(&lr, N_OPS), "sent %d, received %d of %d", ls.n, lr.n,
              N_OPS);
    for (int i = 0; i < N_OPS; i++) {
        cr_assert_eq(ls.order[i], (uint64_t)i, "send %d ran as %llu", i,
                     (unsigned long long)ls.order[i]);
        cr_assert_eq(lr.order[i], (uint64_t)i);
        cr_assert_eq(ls.rc[i], ECS_OK);
        cr_assert_eq(lr.rc[i], ECS_OK);
        cr_assert_eq(memcmp(sbuf[i], rbuf[i], 1 + (size_t)i % 64), 0, "payload %d differs", i);
    }
    cr_assert_eq(p.size_error, ECS_OK, "a send met a receive of another size");
    cr_assert_eq(es.max_busy, 1, "two threads drove the sending end at once");
    cr_assert_eq(er.max_busy, 1, "two threads drove the receiving end at once");
    cr_assert_eq(dplane_chan_next(cr), (uint64_t)N_OPS);
    cr_assert_eq(dplane_chan_submit(cr, 3, rbuf[0], 1), ECS_ERR_INVAL, "a past number");
    cr_assert_eq(dplane_chan_submit(cr, 2 * N_OPS, rbuf[0], 1), ECS_ERR_RANGE, "past the depth");
    cr_assert_eq(dplane_chan_submit(cr, N_OPS + 1, rbuf[0], 1), ECS_OK);
    cr_assert_eq(dplane_chan_submit(cr, N_OPS + 1, rbuf[1], 1), ECS_ERR_INVAL, "a duplicate");
    /* N_OPS never came: N_OPS + 1 waits behind it; freeing completes it with an error */
    dplane_chan_free(cr);
    cr_assert(wait_n(&lr, N_OPS + 1));
    cr_assert_eq(lr.order[N_OPS], (uint64_t)N_OPS + 1);
    cr_assert_eq(lr.rc[N_OPS], ECS_ERR_IO);
    dplane_chan_free(cs);
}

/* The peer dies: a receive blocked in the transport returns, queued ones
 * (with a gap before them) fail at once, later submits are refused. */
Test(dplane, abort_tears_down)
{
    pipe_t p;
    pipe_init(&p);
    end_t er = {.p = &p};
    log_t lr;
    log_init(&lr);
    static uint8_t rbuf[8][16];
    dplane_transport_t tr = fake(&er);
    dplane_chan_t *cr;
    cr_assert_eq(dplane_chan_new(&tr, DPLANE_RECV, 8, on_done, &lr, &cr), ECS_OK);
    cr_assert_eq(dplane_chan_submit(cr, 0, rbuf[0], 16), ECS_OK);
    cr_assert_eq(dplane_chan_submit(cr, 3, rbuf[3], 16), ECS_OK);
    cr_assert_eq(dplane_chan_submit(cr, 5, rbuf[5], 16), ECS_OK);
    while (atomic_load(&er.busy) == 0) { /* wait for 0 to block in the transport */
        const struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    cr_assert_eq(lr.n, 0);
    dplane_chan_abort(cr, "worker w0 died");
    cr_assert(wait_n(&lr, 3), "%d of 3 completions after the abort", lr.n);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(lr.rc[i], ECS_ERR_IO);
    cr_assert(dplane_chan_aborted(cr));
    cr_assert_eq(dplane_chan_submit(cr, 1, rbuf[1], 16), ECS_ERR_IO);
    cr_assert(strstr(ecs_errmsg(), "worker w0 died"), "%s", ecs_errmsg());
    dplane_chan_free(cr);
    cr_assert_eq(lr.n, 3, "completed once each");
}

Test(dplane, rdma_pool)
{
    static uint8_t region[10 * 100 + 7];
    int32_t fl[16];
    dplane_pool_t p;
    cr_assert_eq(dplane_pool_init(&p, region, sizeof region, 100, fl, 16), ECS_OK);
    cr_assert_eq(p.n, 10);
    bool seen[10] = {0};
    for (int k = 0; k < 10; k++) {
        const int i = dplane_pool_get(&p);
        cr_assert(i >= 0 && i < 10 && !seen[i], "buffer %d", i);
        seen[i] = true;
        cr_assert_eq(dplane_pool_buf(&p, i), region + (size_t)i * 100);
    }
    cr_assert_eq(dplane_pool_get(&p), -1, "an empty pool hands out nothing");
    cr_assert_eq(dplane_pool_put(&p, 4), ECS_OK);
    cr_assert_eq(dplane_pool_put(&p, 4), ECS_ERR_INVAL, "returned twice");
    cr_assert_eq(dplane_pool_put(&p, 10), ECS_ERR_INVAL);
    cr_assert_eq(dplane_pool_put(&p, -1), ECS_ERR_INVAL);
    cr_assert_eq(dplane_pool_get(&p), 4);
    cr_assert_null(dplane_pool_buf(&p, 10));
    cr_assert_eq(dplane_pool_init(&p, region, 99, 100, fl, 16), ECS_ERR_RANGE);
    cr_assert_eq(dplane_pool_init(&p, region, sizeof region, 100, fl, 4), ECS_OK);
    cr_assert_eq(p.n, 4, "no more buffers than the free list holds");
}

Test(dplane, rdma_credits)
{
    dplane_credits_t c;
    dplane_credits_init(&c, 3);
    cr_assert(dplane_credits_take(&c) && dplane_credits_take(&c) && dplane_credits_take(&c));
    cr_assert_not(dplane_credits_take(&c), "no send without a posted receive");
    cr_assert_eq(dplane_credits_return(&c, 2), ECS_OK);
    cr_assert(dplane_credits_take(&c));
    cr_assert_eq(dplane_credits_return(&c, 3), ECS_ERR_RANGE, "more than was sent");
    cr_assert_eq(dplane_credits_return(&c, 2), ECS_OK);
    cr_assert_eq(c.credits, 3);
    cr_assert_eq(c.sent, 4);
    cr_assert_eq(c.returned, 4);
}

Test(dplane, rdma_endpoint_and_open)
{
    dplane_rdma_ep_t e = {.qpn = 0x123456, .psn = 0xabcdef, .lid = 7, .port = 1, .mtu = 3};
    for (int i = 0; i < 16; i++)
        e.gid[i] = (uint8_t)(0xf0 + i);
    uint8_t b[DPLANE_RDMA_EP_BYTES], c[DPLANE_RDMA_EP_BYTES];
    dplane_rdma_ep_encode(&e, b);
    cr_assert_leq(DPLANE_RDMA_EP_BYTES, WIRE_MAX_RDMA_EP, "it must fit Hello's field");
    dplane_rdma_ep_t d;
    cr_assert_eq(dplane_rdma_ep_decode(b, sizeof b, &d), ECS_OK, "%s", ecs_errmsg());
    dplane_rdma_ep_encode(&d, c);
    cr_assert_arr_eq(b, c, sizeof b);
    cr_assert_eq(d.qpn, e.qpn);
    cr_assert_eq(d.psn, e.psn);
    cr_assert_eq(d.lid, 7);
    cr_assert_eq(d.mtu, 3);
    cr_assert_eq(dplane_rdma_ep_decode(b, sizeof b - 1, &d), ECS_ERR_FORMAT);
    b[3] = 1; /* a qpn of 25 bits */
    cr_assert_eq(dplane_rdma_ep_decode(b, sizeof b, &d), ECS_ERR_FORMAT);
    dplane_rdma_ep_encode(&e, b);
    b[13] = 9; /* mtu 9 */
    cr_assert_eq(dplane_rdma_ep_decode(b, sizeof b, &d), ECS_ERR_FORMAT);
    /* without a device (no rxe here) opening says so; with one it works */
    dplane_rdma_opts_t o = {.buf_bytes = 4096, .n_bufs = 8};
    dplane_rdma_t *r;
    dplane_rdma_ep_t local;
    const ecs_err_t rc = dplane_rdma_open(&o, &r, &local);
    if (!dplane_rdma_available()) {
        cr_assert_eq(rc, ECS_ERR_UNSUPPORTED);
        cr_assert(strstr(ecs_errmsg(), "rdma"), "%s", ecs_errmsg());
    } else {
        cr_assert_eq(rc, ECS_OK, "%s", ecs_errmsg());
        cr_assert_gt(local.qpn, 0);
        dplane_rdma_close(r);
    }
    o.n_bufs = 1;
    cr_assert_neq(dplane_rdma_open(&o, &r, &local), ECS_OK, "one buffer cannot send and receive");
}

/* ---- the NCCL transport, two ranks of one process (GPU only) ---- */

typedef struct {
    const uint8_t *id;
    int rank;
    dplane_transport_t t;
    ecs_err_t rc;
    char msg[512];
} opener_t;

static void *open_main(void *arg)
{
    opener_t *o = arg;
    o->rc = dplane_nccl_open(o->id, o->rank, 0, &o->t);
    if (o->rc != ECS_OK)
        snprintf(o->msg, sizeof o->msg, "%s", ecs_errmsg());
    return NULL;
}

Test(dplane, gpu_nccl_pair, .timeout = 120)
{
    kgpu_t *g;
    kgpu_opts_t go = {.device = 0, .max_segs = 1};
    if (kgpu_open(&go, &g) != ECS_OK)
        cr_skip_test("%s", ecs_errmsg());
    uint8_t id[DPLANE_NCCL_ID_BYTES];
    if (dplane_nccl_unique_id(id) != ECS_OK) {
        kgpu_close(g);
        cr_skip_test("%s", ecs_errmsg());
    }
    opener_t o[2] = {{id, 0, {0}, ECS_OK, ""}, {id, 1, {0}, ECS_OK, ""}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, open_main, &o[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    if (o[0].rc != ECS_OK || o[1].rc != ECS_OK) {
        for (int i = 0; i < 2; i++)
            if (o[i].rc == ECS_OK)
                o[i].t.close(o[i].t.ctx);
        kgpu_close(g);
        /* NCCL refuses two ranks on one device ("duplicate GPU") */
        cr_skip_test("two ranks on cuda:0: %s", o[0].rc != ECS_OK ? o[0].msg : o[1].msg);
    }
    enum { N = 16, BYTES = 1 << 20 };
    uint8_t *sdev, *rdev, *host, *back;
    cr_assert_eq(kgpu_alloc(g, (size_t)N * BYTES, (void **)&sdev), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, (size_t)N * BYTES, (void **)&rdev), ECS_OK);
    cr_assert_eq(kgpu_host_alloc(g, (size_t)N * BYTES, (void **)&host), ECS_OK);
    cr_assert_eq(kgpu_host_alloc(g, (size_t)N * BYTES, (void **)&back), ECS_OK);
    for (size_t i = 0; i < (size_t)N * BYTES; i++)
        host[i] = (uint8_t)(i * 2654435761u >> 13);
    cr_assert_eq(kgpu_copy(g, sdev, host, (size_t)N * BYTES, KGPU_H2D, KGPU_COMPUTE), ECS_OK);
    cr_assert_eq(kgpu_sync(g, KGPU_COMPUTE), ECS_OK);
    log_t ls, lr;
    log_init(&ls);
    log_init(&lr);
    dplane_chan_t *cs, *cr;
    cr_assert_eq(dplane_chan_new(&o[0].t, DPLANE_SEND, N, on_done, &ls, &cs), ECS_OK);
    cr_assert_eq(dplane_chan_new(&o[1].t, DPLANE_RECV, N, on_done, &lr, &cr), ECS_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = N - 1; i >= 0; i--) /* receives first, in reverse: the order still holds */
        cr_assert_eq(dplane_chan_submit(cr, (uint64_t)i, rdev + (size_t)i * BYTES,
                                        BYTES - (size_t)i), ECS_OK);
    for (int i = 0; i < N; i++)
        cr_assert_eq(dplane_chan_submit(cs, (uint64_t)i, sdev + (size_t)i * BYTES,
                                        BYTES - (size_t)i), ECS_OK);
    cr_assert(wait_n(&ls, N) && wait_n(&lr, N), "sent %d, received %d", ls.n, lr.n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int i = 0; i < N; i++)
        cr_assert(ls.rc[i] == ECS_OK && lr.rc[i] == ECS_OK && lr.order[i] == (uint64_t)i);
    cr_assert_eq(kgpu_copy(g, back, rdev, (size_t)N * BYTES, KGPU_D2H, KGPU_COMPUTE), ECS_OK);
    cr_assert_eq(kgpu_sync(g, KGPU_COMPUTE), ECS_OK);
    for (int i = 0; i < N; i++)
        cr_assert_eq(memcmp(back + (size_t)i * BYTES, host + (size_t)i * BYTES,
                            BYTES - (size_t)i), 0, "payload %d differs", i);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("CHECK dplane_nccl: %d payloads of ~1 MiB in order between two ranks, %.2f GB/s\n", N,
           (double)N * BYTES / s / 1e9);
    dplane_chan_abort(cs, "test done"); /* the teardown path of a dead worker */
    dplane_chan_free(cs);
    dplane_chan_free(cr);
    kgpu_free(g, sdev);
    kgpu_free(g, rdev);
    kgpu_host_free(g, host);
    kgpu_host_free(g, back);
    kgpu_close(g);
}
