/* worker_int.h - inside the worker module: the shard (experts held, their
 * compute) that worker.c's serve loop drives. */
#ifndef ECS_WORKER_INT_H
#define ECS_WORKER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "common/arch.h"
#include "common/gguf.h"
#include "common/threadpool.h"
#include "kernels/moe/moe.h"
#include "kernels/repack/repack.h"
#include "proto/mux.h"
#include "proto/wire.h"

/* Experts per parallel region of a call: a heartbeat can go out between
 * regions (a 512-row prompt call on one thread of a busy host outlasts the
 * coordinator's liveness window), and 8 experts keep a region wide
 * enough for the pool's threads. */
#define SHARD_REGION_JOBS 8

typedef struct {
    arch_hparams_t hp;
    kmoe_expert_t *all;            /* [n_layer * n_expert] every expert's matrices */
    kmoe_expert_t *held;           /* same shape; zeroed where not held */
    kmoe_expert_t **layers;        /* [n_layer] held + layer offset, NULL: none held */
    kmoe_t *moe;                   /* NULL until an assignment is loaded */
    krepack_t *copy;               /* interleaved copy of the held experts, or NULL */
    const gguf_file_t *f;
    int32_t *row, *expert;         /* [KCPU_MAX_BATCH * k] a call's pairs */
    size_t n_held;
    uint64_t bytes;
    uint64_t calls, rows;
    /* a call's products in regions of SHARD_REGION_JOBS experts, with
     * tick(tick_ctx) between them (the worker's heartbeat: a long call
     * must not look like a hung worker) */
    ecs_threadpool_t *tp;
    kcpu_job_t *jobs;              /* [n_expert] */
    kcpu_plan_t plan;
    void (*tick)(void *ctx);
    void *tick_ctx;
} shard_t;

ecs_err_t shard_open(shard_t *s, const gguf_file_t *f, const arch_hparams_t *hp);
void shard_close(shard_t *s);
size_t shard_expert_bytes(const kmoe_expert_t *e);
/* Checks the pairs and the budget (ECS_ERR_NOMEM: over it, nothing
 * changed), then holds exactly them and prefaults their bytes. */
ecs_err_t shard_assign(shard_t *s, const wire_assign_t *a, uint64_t budget, ecs_threadpool_t *tp,
                       const char *repack_dir, uint64_t *bytes, uint64_t *load_ns);
void shard_call(shard_t *s, const wire_call_t *c, mux_reply_t *r);
/* The quantized activation type layer l's calls may carry (F32: none). */
uint32_t shard_act_type(const shard_t *s, int l);

#endif
