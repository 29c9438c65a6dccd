/* dispatch.h - expert placement and the pooled dispatcher.
 *
 * Placement says which workers hold each routed expert (layer, expert):
 * made uniform or weighted by each worker's capacity with a replication
 * factor, or read from a placement file. The dispatcher (below, once the
 * workers exist) sends each expert's rows to its least busy live holder.
 *
 * Placement file (docs/operations.md): one line per rule,
 *     WORKER LAYERS EXPERTS        # comment
 * WORKER is a worker id (ecs-worker --id; spawned workers are w0, w1, ...),
 * LAYERS and EXPERTS are comma lists of `a`, `a-b` (inclusive) or `*`.
 * Rules add holders; dense layers are skipped; every (MoE layer, expert)
 * must end up with a holder, else loading fails naming the first missing
 * pair. placement_write() prints a placement in this format.
 *
 *     dispatch_shape_t s = {.n_layer = 27, .first_moe = 1, .n_expert = 64};
 *     placement_worker_t w[] = {{"w0", 1}, {"w1", 1}, {"w2", 2}};
 *     placement_t *p;
 *     if (placement_make(&s, w, 3, 2, &p) != ECS_OK) die(ecs_errmsg());
 *     const int16_t *h;
 *     int n = placement_holders(p, 5, 17, &h);  // h[0..n) hold layer 5 expert 17
 *     placement_free(p);
 */
#ifndef ECS_DISPATCH_H
#define ECS_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"

#define PLACEMENT_MAX_WORKERS 1024
#define PLACEMENT_MAX_HOLDERS 8
#define PLACEMENT_ID_MAX 64
#define PLACEMENT_LINE_MAX 65536

typedef struct {
    int n_layer;   /* all layers */
    int first_moe; /* layers below it are dense (no routed experts) */
    int n_expert;  /* routed experts per MoE layer */
} dispatch_shape_t;

typedef struct {
    const char *id; /* unique, < PLACEMENT_ID_MAX bytes */
    double weight;  /* relative capacity (> 0): twice the weight, twice the experts */
} placement_worker_t;

typedef struct placement placement_t;

/* Deals every (MoE layer, expert) to `replication` distinct workers, shares
 * proportional to the weights in every layer; deterministic. */
ecs_err_t placement_make(const dispatch_shape_t *s, const placement_worker_t *w, int n_workers,
                         int replication, placement_t **out);
/* Reads a placement file naming the workers in w (see above). */
ecs_err_t placement_load(const dispatch_shape_t *s, const char *path,
                         const placement_worker_t *w, int n_workers, placement_t **out);
void placement_free(placement_t *p);
/* ECS_ERR_NOTFOUND naming the pairs without a holder; sets the replication
 * (the least number of holders of any pair). */
ecs_err_t placement_check(placement_t *p);

/* Holders of (layer, expert): their worker indices in *workers. */
int placement_holders(const placement_t *p, int layer, int expert, const int16_t **workers);
int placement_n_workers(const placement_t *p);
int placement_replication(const placement_t *p);
const char *placement_worker_id(const placement_t *p, int wi);
/* How many (layer, expert) pairs worker wi holds. */
int placement_held(const placement_t *p, int wi);
/* Worker wi's pairs as (layer, expert) int pairs into pairs[2*cap], in
 * layer then expert order; returns the count (may exceed cap). */
int placement_worker_pairs(const placement_t *p, int wi, int32_t *pairs, int cap);
/* The placement in the file format above. */
ecs_err_t placement_write(const placement_t *p, FILE *f);

#endif
