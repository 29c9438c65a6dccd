/* rdma.c - the RDMA data plane's bookkeeping: the registered buffer pool
 * and the send credits, plain C that make test checks without a device
 * (the queue pairs that use them: verbs.c). */
#include <stdlib.h>
#include <string.h>

#include "proto/dplane/dplane.h"

ecs_err_t dplane_pool_init(dplane_pool_t *p, void *base, size_t bytes, size_t buf_bytes,
                           int32_t *free_list, int max_bufs)
{
    memset(p, 0, sizeof *p);
    if (!base || !free_list || buf_bytes == 0 || max_bufs < 1)
        return ecs_error(ECS_ERR_INVAL, "rdma pool: bad arguments");
    const size_t n = bytes / buf_bytes;
    if (n < 1)
        return ecs_error(ECS_ERR_RANGE, "rdma pool: %zu bytes hold no buffer of %zu", bytes,
                         buf_bytes);
    p->base = base;
    p->buf_bytes = buf_bytes;
    p->n = n < (size_t)max_bufs ? (int)n : max_bufs;
    p->free_list = free_list;
    /* the stack hands out 0, 1, 2, ... first: low addresses stay warm */
    for (int i = 0; i < p->n; i++)
        free_list[i] = p->n - 1 - i;
    p->n_free = p->n;
    return ECS_OK;
}

int dplane_pool_get(dplane_pool_t *p)
{
    return p->n_free > 0 ? p->free_list[--p->n_free] : -1;
}

void *dplane_pool_buf(const dplane_pool_t *p, int i)
{
    return i >= 0 && i < p->n ? p->base + (size_t)i * p->buf_bytes : NULL;
}

ecs_err_t dplane_pool_put(dplane_pool_t *p, int i)
{
    if (i < 0 || i >= p->n)
        return ecs_error(ECS_ERR_INVAL, "rdma pool: buffer %d of %d", i, p->n);
    /* a double put would hand one buffer to two messages: refuse it (O(n),
     * n is the handful of buffers a queue pair keeps posted) */
    for (int k = 0; k < p->n_free; k++)
        if (p->free_list[k] == i)
            return ecs_error(ECS_ERR_INVAL, "rdma pool: buffer %d returned twice", i);
    p->free_list[p->n_free++] = i;
    return ECS_OK;
}

void dplane_credits_init(dplane_credits_t *c, uint32_t window)
{
    *c = (dplane_credits_t){.credits = window, .window = window};
}

bool dplane_credits_take(dplane_credits_t *c)
{
    if (!c->credits)
        return false;
    c->credits--;
    c->sent++;
    return true;
}

ecs_err_t dplane_credits_return(dplane_credits_t *c, uint32_t n)
{
    if (c->returned + n > c->sent || c->credits + (uint64_t)n > c->window)
        return ecs_error(ECS_ERR_RANGE,
                         "rdma credits: peer returns %u with %llu sent, %llu returned "
                         "(window %u)", n, (unsigned long long)c->sent,
                         (unsigned long long)c->returned, c->window);
    c->returned += n;
    c->credits += n;
    return ECS_OK;
}
