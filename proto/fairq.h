/* fairq.h - private to proto/: the worker's queue of calls waiting to be
 * served, fair between the coordinators that sent them.
 *
 * Several coordinators share one worker (M:N). Each call is queued under
 * its sender's key (the ZeroMQ routing id of the coordinator's data
 * DEALER); fairq_pop() takes the oldest call of the next sender in
 * round-robin order, so a coordinator with a hundred calls queued delays
 * another one's call by at most one call of each other sender, never by
 * its whole backlog. Within one sender the order is first in, first out.
 * A sender with nothing queued leaves the round and joins it at the end
 * when its next call comes. Items are opaque values (the server stores
 * slot indices); nothing is allocated after fairq_new.
 *
 *     fairq_t *q;
 *     if (fairq_new(256, &q)) die(ecs_errmsg());
 *     fairq_push(q, route.id, route.len, slot);   // ECS_ERR_RANGE when full
 *     uint32_t slot;
 *     while (fairq_pop(q, &slot)) serve(slot);
 *     fairq_free(q);
 */
#ifndef ECS_PROTO_FAIRQ_H
#define ECS_PROTO_FAIRQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define FAIRQ_KEY_MAX 255 /* a ZeroMQ routing id's longest */

typedef struct fairq fairq_t;

/* Room for cap items (1 to 1 << 20) under any number of keys. */
ecs_err_t fairq_new(uint32_t cap, fairq_t **out);
void fairq_free(fairq_t *q);
/* Queues item behind key's earlier items: ECS_ERR_RANGE when the queue
 * holds cap items, ECS_ERR_INVAL for a key longer than FAIRQ_KEY_MAX. */
ecs_err_t fairq_push(fairq_t *q, const void *key, size_t key_len, uint32_t item);
/* The next item in the round (false when empty). */
bool fairq_pop(fairq_t *q, uint32_t *item);
uint32_t fairq_len(const fairq_t *q);
/* Senders with something queued. */
uint32_t fairq_senders(const fairq_t *q);

#endif
