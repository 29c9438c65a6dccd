/* fairq.c - round robin between senders, FIFO within one (fairq.h).
 *
 * Items live in a node pool linked per sender; the senders with items
 * queued wait in a ring buffer in round order: pop serves the front
 * sender's oldest item and moves the sender to the back if it has more.
 * A push looks its sender up among the active ones by a linear scan: they
 * are the coordinators with calls queued, a handful. */
#include "proto/fairq.h"

#include <stdlib.h>
#include <string.h>

#define FAIRQ_NONE UINT32_MAX

typedef struct {
    uint32_t item, next;
} fq_node_t;

typedef struct {
    uint8_t key[FAIRQ_KEY_MAX];
    uint8_t len;
    uint32_t head, tail; /* nodes, FAIRQ_NONE: empty */
} fq_sender_t;

struct fairq {
    uint32_t cap, len;
    fq_node_t *node;       /* [cap] */
    uint32_t free_node;    /* free list through next */
    fq_sender_t *sender;   /* [cap] records, at most one per queued item */
    uint32_t *free_sender; /* [cap] stack of unused records */
    uint32_t n_free_sender;
    uint32_t *ring;        /* [cap] active senders in round order */
    uint32_t ring_head, ring_len;
};

ecs_err_t fairq_new(uint32_t cap, fairq_t **out)
{
    *out = NULL;
    if (cap < 1 || cap > (1u << 20))
        return ecs_error(ECS_ERR_RANGE, "fairq: capacity %u (1 to %u)", cap, 1u << 20);
    fairq_t *q = calloc(1, sizeof *q);
    if (!q)
        return ecs_error(ECS_ERR_NOMEM, "fairq: out of memory");
    q->cap = cap;
    q->node = malloc(cap * sizeof *q->node);
    q->sender = malloc(cap * sizeof *q->sender);
    q->free_sender = malloc(cap * sizeof *q->free_sender);
    q->ring = malloc(cap * sizeof *q->ring);
    if (!q->node || !q->sender || !q->free_sender || !q->ring) {
        fairq_free(q);
        return ecs_error(ECS_ERR_NOMEM, "fairq: out of memory");
    }
    for (uint32_t i = 0; i < cap; i++) {
        q->node[i].next = i + 1 < cap ? i + 1 : FAIRQ_NONE;
        q->free_sender[i] = cap - 1 - i;
    }
    q->free_node = 0;
    q->n_free_sender = cap;
    *out = q;
    return ECS_OK;
}

void fairq_free(fairq_t *q)
{
    if (!q)
        return;
    free(q->node);
    free(q->sender);
    free(q->free_sender);
    free(q->ring);
    free(q);
}

static uint32_t ring_at(const fairq_t *q, uint32_t i) { return q->ring[(q->ring_head + i) % q->cap]; }

static void ring_push_back(fairq_t *q, uint32_t s)
{
    q->ring[(q->ring_head + q->ring_len) % q->cap] = s;
    q->ring_len++;
}

ecs_err_t fairq_push(fairq_t *q, const void *key, size_t key_len, uint32_t item)
{
    if (key_len > FAIRQ_KEY_MAX)
        return ecs_error(ECS_ERR_INVAL, "fairq: key of %zu bytes (at most %d)", key_len,
                         FAIRQ_KEY_MAX);
    if (q->len >= q->cap)
        return ecs_error(ECS_ERR_RANGE, "fairq: full (%u items)", q->cap);
    uint32_t s = FAIRQ_NONE;
    for (uint32_t i = 0; i < q->ring_len && s == FAIRQ_NONE; i++) {
        const fq_sender_t *c = &q->sender[ring_at(q, i)];
        if (c->len == key_len && !memcmp(c->key, key, key_len))
            s = ring_at(q, i);
    }
    if (s == FAIRQ_NONE) { /* a new sender joins at the end of the round */
        s = q->free_sender[--q->n_free_sender];
        fq_sender_t *c = &q->sender[s];
        memcpy(c->key, key, key_len);
        c->len = (uint8_t)key_len;
        c->head = c->tail = FAIRQ_NONE;
        ring_push_back(q, s);
    }
    const uint32_t n = q->free_node;
    q->free_node = q->node[n].next;
    q->node[n] = (fq_node_t){.item = item, .next = FAIRQ_NONE};
    fq_sender_t *c = &q->sender[s];
    if (c->tail == FAIRQ_NONE)
        c->head = n;
    else
        q->node[c->tail].next = n;
    c->tail = n;
    q->len++;
    return ECS_OK;
}

bool fairq_pop(fairq_t *q, uint32_t *item)
{
    if (!q->ring_len)
        return false;
    const uint32_t s = q->ring[q->ring_head];
    q->ring_head = (q->ring_head + 1) % q->cap;
    q->ring_len--;
    fq_sender_t *c = &q->sender[s];
    const uint32_t n = c->head;
    *item = q->node[n].item;
    c->head = q->node[n].next;
    q->node[n].next = q->free_node;
    q->free_node = n;
    q->len--;
    if (c->head == FAIRQ_NONE) /* leaves the round */
        q->free_sender[q->n_free_sender++] = s;
    else
        ring_push_back(q, s);
    return true;
}

uint32_t fairq_len(const fairq_t *q) { return q->len; }
uint32_t fairq_senders(const fairq_t *q) { return q->ring_len; }
