/* verbs.c - the RDMA transport of a data plane: one RC queue pair per
 * one-way channel, payloads copied through a registered buffer pool in
 * chunks, receives kept posted and announced to the sender by credits.
 *
 * The sender spends a credit per chunk (dplane_credits) and regains them
 * from zero-length messages whose immediate data is the count the receiver
 * re-posted; so a send never meets a queue pair without a posted receive
 * (RNR). Completions are waited for on a completion channel with poll()
 * and a short timeout (asleep, never spinning; the timeout lets an abort
 * be noticed). libibverbs is loaded with dlopen; the inline verbs
 * (post_send, post_recv, poll_cq, req_notify_cq) go through the device's
 * ops table and need no symbol. Compiled only where <infiniband/verbs.h>
 * exists. Without an RDMA device here (no rxe module), this file is
 * compiled but not run: its pool, credits and endpoint encoding are the
 * tested parts (rdma.c). */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/dplane/dplane.h"

void dplane_rdma_ep_encode(const dplane_rdma_ep_t *e, uint8_t out[DPLANE_RDMA_EP_BYTES])
{
    uint32_t v[4] = {e->qpn, e->psn, e->lid, (uint32_t)e->port | (uint32_t)e->mtu << 8};
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 4; b++)
            out[i * 4 + b] = (uint8_t)(v[i] >> (8 * b));
    memcpy(out + 16, e->gid, 16);
}

ecs_err_t dplane_rdma_ep_decode(const uint8_t *b, size_t n, dplane_rdma_ep_t *e)
{
    if (n != DPLANE_RDMA_EP_BYTES)
        return ecs_error(ECS_ERR_FORMAT, "rdma endpoint of %zu bytes (want %d)", n,
                         DPLANE_RDMA_EP_BYTES);
    uint32_t v[4];
    for (int i = 0; i < 4; i++)
        v[i] = (uint32_t)b[i * 4] | (uint32_t)b[i * 4 + 1] << 8 | (uint32_t)b[i * 4 + 2] << 16 |
               (uint32_t)b[i * 4 + 3] << 24;
    if (v[0] == 0 || v[0] >= (1u << 24) || v[1] >= (1u << 24) || v[2] > 0xffff ||
        (v[3] & 0xff) == 0 || (v[3] >> 8) < 1 || (v[3] >> 8) > 5 || v[3] >> 16)
        return ecs_error(ECS_ERR_FORMAT, "rdma endpoint: qpn %u psn %u lid %u port %u mtu %u",
                         v[0], v[1], v[2], v[3] & 0xff, v[3] >> 8);
    *e = (dplane_rdma_ep_t){.qpn = v[0], .psn = v[1], .lid = (uint16_t)v[2],
                            .port = (uint8_t)(v[3] & 0xff), .mtu = (uint8_t)(v[3] >> 8)};
    memcpy(e->gid, b + 16, 16);
    return ECS_OK;
}

#if defined(__has_include)
#if __has_include(<infiniband/verbs.h>)
#define DPLANE_HAVE_VERBS 1
#endif
#endif

#ifndef DPLANE_HAVE_VERBS
ecs_err_t dplane_rdma_open(const dplane_rdma_opts_t *o, dplane_rdma_t **out,
                           dplane_rdma_ep_t *local)
{
    (void)o;
    (void)local;
    *out = NULL;
    return ecs_error(ECS_ERR_UNSUPPORTED, "rdma: built without libibverbs-dev");
}
ecs_err_t dplane_rdma_connect(dplane_rdma_t *r, const dplane_rdma_ep_t *peer,
                              dplane_transport_t *out)
{
    (void)r;
    (void)peer;
    (void)out;
    return ecs_error(ECS_ERR_UNSUPPORTED, "rdma: built without libibverbs-dev");
}
void dplane_rdma_close(dplane_rdma_t *r) { (void)r; }
bool dplane_rdma_available(void) { return false; }
#else
#include <infiniband/verbs.h>

/* The library's entry points (restated by name; macros of verbs.h that
 * wrap some of them are not used). */
static struct {
    struct ibv_device **(*get_list)(int *);
    void (*free_list)(struct ibv_device **);
    const char *(*dev_name)(struct ibv_device *);
    struct ibv_context *(*open)(struct ibv_device *);
    int (*close)(struct ibv_context *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_comp_channel *(*create_chan)(struct ibv_context *);
    int (*destroy_chan)(struct ibv_comp_channel *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
    void (*ack_cq_events)(struct ibv_cq *, unsigned int);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*destroy_qp)(struct ibv_qp *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
} vb;
static _Atomic int vb_state; /* 0: not tried, 1: loaded, -1: failed */

static bool vb_load_syms(void)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return false;
    const struct {
        void **slot;
        const char *name;
    } syms[] = {
        {(void **)&vb.get_list, "ibv_get_device_list"},
        {(void **)&vb.free_list, "ibv_free_device_list"},
        {(void **)&vb.dev_name, "ibv_get_device_name"},
        {(void **)&vb.open, "ibv_open_device"},
        {(void **)&vb.close, "ibv_close_device"},
        {(void **)&vb.alloc_pd, "ibv_alloc_pd"},
        {(void **)&vb.dealloc_pd, "ibv_dealloc_pd"},
        {(void **)&vb.reg_mr, "ibv_reg_mr"},
        {(void **)&vb.dereg_mr, "ibv_dereg_mr"},
        {(void **)&vb.create_chan, "ibv_create_comp_channel"},
        {(void **)&vb.destroy_chan, "ibv_destroy_comp_channel"},
        {(void **)&vb.create_cq, "ibv_create_cq"},
        {(void **)&vb.destroy_cq, "ibv_destroy_cq"},
        {(void **)&vb.get_cq_event, "ibv_get_cq_event"},
        {(void **)&vb.ack_cq_events, "ibv_ack_cq_events"},
        {(void **)&vb.create_qp, "ibv_create_qp"},
        {(void **)&vb.destroy_qp, "ibv_destroy_qp"},
        {(void **)&vb.modify_qp, "ibv_modify_qp"},
        {(void **)&vb.query_port, "ibv_query_port"},
        {(void **)&vb.query_gid, "ibv_query_gid"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
        if (!(*syms[i].slot = dlsym(h, syms[i].name)))
            return false;
    return true;
}

static ecs_err_t vb_load(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (atomic_load(&vb_state) == 0)
        atomic_store(&vb_state, vb_load_syms() ? 1 : -1);
    pthread_mutex_unlock(&mu);
    return atomic_load(&vb_state) > 0
               ? ECS_OK
               : ecs_error(ECS_ERR_UNSUPPORTED, "rdma: cannot load libibverbs.so.1");
}

bool dplane_rdma_available(void)
{
    if (vb_load() != ECS_OK)
        return false;
    int n = 0;
    struct ibv_device **l = vb.get_list(&n);
    if (l)
        vb.free_list(l);
    return l && n > 0;
}

struct dplane_rdma {
    dplane_rdma_opts_t o;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    uint8_t *region;
    int32_t *free_list;
    dplane_pool_t pool;
    dplane_credits_t credits;
    dplane_rdma_ep_t local;
    atomic_bool abort;
};

enum { WR_CREDIT = 1 << 30 }; /* wr_id of credit messages; below: buffer index */

static ecs_err_t post_recv(dplane_rdma_t *r, int buf)
{
    struct ibv_sge sge = {(uintptr_t)dplane_pool_buf(&r->pool, buf), (uint32_t)r->o.buf_bytes,
                          r->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)buf, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(r->qp, &wr, &bad))
        return ecs_error(ECS_ERR_IO, "rdma: cannot post a receive");
    return ECS_OK;
}

/* The next completion, waiting on the channel (50 ms naps to see an abort). */
static ecs_err_t next_wc(dplane_rdma_t *r, struct ibv_wc *wc)
{
    for (;;) {
        const int n = ibv_poll_cq(r->cq, 1, wc);
        if (n < 0)
            return ecs_error(ECS_ERR_IO, "rdma: poll_cq failed");
        if (n == 1) {
            if (wc->status != IBV_WC_SUCCESS)
                return ecs_error(ECS_ERR_IO, "rdma: work request failed (status %d)",
                                 (int)wc->status);
            return ECS_OK;
        }
        if (atomic_load(&r->abort))
            return ecs_error(ECS_ERR_IO, "rdma: aborted");
        if (ibv_req_notify_cq(r->cq, 0))
            return ecs_error(ECS_ERR_IO, "rdma: req_notify_cq failed");
        if (ibv_poll_cq(r->cq, 1, wc) == 1) /* one that came before the request */
            return wc->status == IBV_WC_SUCCESS
                       ? ECS_OK
                       : ecs_error(ECS_ERR_IO, "rdma: work request failed (status %d)",
                                   (int)wc->status);
        struct pollfd p = {r->chan->fd, POLLIN, 0};
        if (poll(&p, 1, 50) > 0) {
            struct ibv_cq *cq;
            void *cctx;
            if (vb.get_cq_event(r->chan, &cq, &cctx) == 0)
                vb.ack_cq_events(cq, 1);
        }
    }
}

static ecs_err_t post_send(dplane_rdma_t *r, int buf, size_t n, bool credit, uint32_t imm)
{
    struct ibv_sge sge = {buf >= 0 ? (uintptr_t)dplane_pool_buf(&r->pool, buf) : 0,
                          (uint32_t)n, r->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = credit ? WR_CREDIT : (uint64_t)buf,
                             .sg_list = n ? &sge : NULL, .num_sge = n ? 1 : 0,
                             .opcode = credit ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED};
    wr.imm_data = htonl(imm);
    struct ibv_send_wr *bad;
    if (ibv_post_send(r->qp, &wr, &bad))
        return ecs_error(ECS_ERR_IO, "rdma: cannot post a send");
    return ECS_OK;
}

/* Sender: per chunk, a credit (waiting for the receiver's returns), a
 * buffer, the send and its completion. */
static ecs_err_t t_send(void *ctx, const void *src, size_t n)
{
    dplane_rdma_t *r = ctx;
    for (size_t off = 0; off < n || (n == 0 && off == 0); off += r->o.buf_bytes) {
        const size_t len = n - off < r->o.buf_bytes ? n - off : r->o.buf_bytes;
        struct ibv_wc wc;
        ecs_err_t e;
        while (!dplane_credits_take(&r->credits)) {
            if ((e = next_wc(r, &wc)) != ECS_OK)
                return e;
            if (wc.opcode == IBV_WC_RECV && (e = dplane_credits_return(
                                                 &r->credits, ntohl(wc.imm_data))) != ECS_OK)
                return e;
            if (wc.opcode == IBV_WC_RECV && (e = post_recv(r, (int)wc.wr_id)) != ECS_OK)
                return e;
        }
        const int b = dplane_pool_get(&r->pool);
        if (b < 0)
            return ecs_error(ECS_ERR_INTERNAL, "rdma: no free send buffer");
        memcpy(dplane_pool_buf(&r->pool, b), (const uint8_t *)src + off, len);
        if ((e = post_send(r, b, len, false, 0)) != ECS_OK)
            return e;
        do { /* its completion; credit returns met meanwhile are kept */
            if ((e = next_wc(r, &wc)) != ECS_OK)
                return e;
            if (wc.opcode == IBV_WC_RECV &&
                ((e = dplane_credits_return(&r->credits, ntohl(wc.imm_data))) != ECS_OK ||
                 (e = post_recv(r, (int)wc.wr_id)) != ECS_OK))
                return e;
        } while (wc.opcode != IBV_WC_SEND);
        dplane_pool_put(&r->pool, b);
        if (n == 0)
            break;
    }
    return ECS_OK;
}

/* Receiver: per chunk, the next receive, its bytes out, the buffer
 * re-posted and one credit returned. */
static ecs_err_t t_recv(void *ctx, void *dst, size_t n)
{
    dplane_rdma_t *r = ctx;
    for (size_t off = 0; off < n || (n == 0 && off == 0); off += r->o.buf_bytes) {
        const size_t len = n - off < r->o.buf_bytes ? n - off : r->o.buf_bytes;
        struct ibv_wc wc;
        ecs_err_t e;
        do { /* skipping the send completions of credit messages */
            if ((e = next_wc(r, &wc)) != ECS_OK)
                return e;
        } while (wc.opcode != IBV_WC_RECV);
        if (wc.byte_len != len)
            return ecs_error(ECS_ERR_FORMAT, "rdma: a chunk of %u bytes, %zu expected",
                             wc.byte_len, len);
        memcpy((uint8_t *)dst + off, dplane_pool_buf(&r->pool, (int)wc.wr_id), len);
        if ((e = post_recv(r, (int)wc.wr_id)) != ECS_OK ||
            (e = post_send(r, -1, 0, true, 1)) != ECS_OK)
            return e;
        if (n == 0)
            break;
    }
    return ECS_OK;
}

static void t_abort(void *ctx) { atomic_store(&((dplane_rdma_t *)ctx)->abort, true); }
static void t_close(void *ctx) { dplane_rdma_close(ctx); }

void dplane_rdma_close(dplane_rdma_t *r)
{
    if (!r)
        return;
    if (r->qp)
        vb.destroy_qp(r->qp);
    if (r->cq)
        vb.destroy_cq(r->cq);
    if (r->chan)
        vb.destroy_chan(r->chan);
    if (r->mr)
        vb.dereg_mr(r->mr);
    if (r->pd)
        vb.dealloc_pd(r->pd);
    if (r->ctx)
        vb.close(r->ctx);
    free(r->region);
    free(r->free_list);
    free(r);
}

static ecs_err_t open_device(dplane_rdma_t *r)
{
    int n = 0;
    struct ibv_device **l = vb.get_list(&n);
    if (!l || n < 1) {
        if (l)
            vb.free_list(l);
        return ecs_error(ECS_ERR_UNSUPPORTED, "rdma: no RDMA device");
    }
    for (int i = 0; i < n && !r->ctx; i++)
        if (!r->o.device || !strcmp(vb.dev_name(l[i]), r->o.device))
            r->ctx = vb.open(l[i]);
    vb.free_list(l);
    if (!r->ctx)
        return ecs_error(ECS_ERR_UNSUPPORTED, "rdma: cannot open device %s",
                         r->o.device ? r->o.device : "(first)");
    return ECS_OK;
}

ecs_err_t dplane_rdma_open(const dplane_rdma_opts_t *o, dplane_rdma_t **out,
                           dplane_rdma_ep_t *local)
{
    *out = NULL;
    ecs_err_t e = vb_load();
    if (e != ECS_OK)
        return e;
    if (o->buf_bytes < 64 || o->buf_bytes > (1u << 30) || o->n_bufs < 2 || o->n_bufs > 4096)
        return ecs_error(ECS_ERR_INVAL, "rdma: %d buffers of %zu bytes", o->n_bufs,
                         o->buf_bytes);
    dplane_rdma_t *r = calloc(1, sizeof *r);
    if (!r)
        return ecs_error(ECS_ERR_NOMEM, "rdma: no memory");
    r->o = *o;
    const size_t bytes = o->buf_bytes * (size_t)o->n_bufs;
    r->region = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    r->free_list = malloc((size_t)o->n_bufs * sizeof *r->free_list);
    if (!r->region || !r->free_list) {
        e = ecs_error(ECS_ERR_NOMEM, "rdma: no memory for %zu bytes of buffers", bytes);
        goto fail;
    }
    if ((e = open_device(r)) != ECS_OK)
        goto fail;
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof pa);
    union ibv_gid gid;
    memset(&gid, 0, sizeof gid);
    if (!(r->pd = vb.alloc_pd(r->ctx)) || !(r->chan = vb.create_chan(r->ctx)) ||
        !(r->cq = vb.create_cq(r->ctx, 2 * o->n_bufs + 4, NULL, r->chan, 0)) ||
        !(r->mr = vb.reg_mr(r->pd, r->region, bytes, IBV_ACCESS_LOCAL_WRITE)) ||
        vb.query_port(r->ctx, 1, &pa) != 0 || vb.query_gid(r->ctx, 1, o->gid_index, &gid) != 0) {
        e = ecs_error(ECS_ERR_IO, "rdma: cannot set up the device (pd, cq, mr, port 1)");
        goto fail;
    }
    struct ibv_qp_init_attr qa = {.send_cq = r->cq, .recv_cq = r->cq,
                                  .cap = {.max_send_wr = (uint32_t)o->n_bufs + 2,
                                          .max_recv_wr = (uint32_t)o->n_bufs + 2,
                                          .max_send_sge = 1, .max_recv_sge = 1},
                                  .qp_type = IBV_QPT_RC};
    struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                               .qp_access_flags = 0};
    if (!(r->qp = vb.create_qp(r->pd, &qa)) ||
        vb.modify_qp(r->qp, &init,
                     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
        e = ecs_error(ECS_ERR_IO, "rdma: cannot create an RC queue pair");
        goto fail;
    }
    /* half the buffers receive, half send: each side keeps its receives
     * posted from now on, before the peer can send */
    if ((e = dplane_pool_init(&r->pool, r->region, bytes, o->buf_bytes, r->free_list,
                              o->n_bufs)) != ECS_OK)
        goto fail;
    const int n_recv = o->n_bufs / 2;
    for (int i = 0; i < n_recv; i++) {
        const int b = dplane_pool_get(&r->pool);
        if ((e = post_recv(r, b)) != ECS_OK)
            goto fail;
    }
    dplane_credits_init(&r->credits, (uint32_t)n_recv);
    r->local = (dplane_rdma_ep_t){.qpn = r->qp->qp_num, .psn = (uint32_t)(random() & 0xffffff),
                                  .lid = pa.lid, .port = 1,
                                  .mtu = (uint8_t)(pa.active_mtu ? pa.active_mtu : IBV_MTU_1024)};
    memcpy(r->local.gid, gid.raw, 16);
    *local = r->local;
    *out = r;
    return ECS_OK;
fail:
    dplane_rdma_close(r);
    return e;
}

ecs_err_t dplane_rdma_connect(dplane_rdma_t *r, const dplane_rdma_ep_t *peer,
                              dplane_transport_t *out)
{
    struct ibv_qp_attr rtr = {.qp_state = IBV_QPS_RTR, .path_mtu = (enum ibv_mtu)peer->mtu,
                              .dest_qp_num = peer->qpn, .rq_psn = peer->psn,
                              .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
                              .ah_attr = {.dlid = peer->lid, .port_num = peer->port}};
    if (peer->lid == 0) { /* RoCE: routed by GID */
        rtr.ah_attr.is_global = 1;
        memcpy(rtr.ah_attr.grh.dgid.raw, peer->gid, 16);
        rtr.ah_attr.grh.sgid_index = (uint8_t)r->o.gid_index;
        rtr.ah_attr.grh.hop_limit = 1;
    }
    struct ibv_qp_attr rts = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
                              .rnr_retry = 7, .sq_psn = r->local.psn, .max_rd_atomic = 1};
    if (vb.modify_qp(r->qp, &rtr,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) ||
        vb.modify_qp(r->qp, &rts,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        return ecs_error(ECS_ERR_IO, "rdma: cannot connect the queue pair to qpn %u",
                         peer->qpn);
    *out = (dplane_transport_t){"rdma", t_send, t_recv, t_abort, t_close, r};
    return ECS_OK;
}
#endif
