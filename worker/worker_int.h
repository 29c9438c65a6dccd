/* worker_int.h - inside the worker module: the shard (experts held, their
 * compute) that worker.c's serve loop drives. */
#ifndef ECS_WORKER_INT_H
#define ECS_WORKER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/arch.h"
#include "common/gguf.h"
#include "common/threadpool.h"
#include "kernels/moe/moe.h"
#include "kernels/repack/repack.h"
#include "kernels/tier/tier.h"
#include "proto/mux.h"
#include "proto/wire.h"

typedef struct shard_dev shard_dev_t;
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
    krepack_t *sh_copy;            /* of the shared experts held, or NULL */
    const gguf_file_t *f;
    int32_t *row, *expert;         /* [KCPU_MAX_BATCH * k] a call's pairs */
    size_t n_held;
    uint64_t bytes;
    uint64_t calls, rows;
    shard_dev_t *dev;              /* --device cuda:N / emu: calls run there (device.c) */
    /* a call's products in regions of SHARD_REGION_JOBS experts, with
     * tick(tick_ctx) between them (the worker's heartbeat: a long call
     * must not look like a hung worker) */
    ecs_threadpool_t *tp;
    kcpu_job_t *jobs;              /* [n_expert + 1] */
    /* Assign.shared: every MoE layer's shared experts (gate.nrows 0: not
     * held), computed for calls with ExpertCall.shared */
    kmoe_expert_t *shexp;          /* [n_layer], views of the GGUF (and of the copy) */
    bool shared;
    kmoe_ffn_t *ffn;               /* their scratch while held */
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
/* Whether the shard holds the pairs of a and no others, and the shared
 * experts if and only if a asks (an Assign that changes nothing: answered
 * Ready without loading). */
bool shard_holds_exactly(const shard_t *s, const wire_assign_t *a);
void shard_call(shard_t *s, const wire_call_t *c, mux_reply_t *r);
/* The quantized activation type layer l's calls may carry (F32: none). */
uint32_t shard_act_type(const shard_t *s, int l);

/* device.c: the experts on a GPU (or kgpu's host emulation, "emu"), tiered
 * by kernels/tier. Open at start-up (budget 0: 90% of the free VRAM);
 * shard_dev_assign after every shard_assign sizes and allocates all device
 * memory and uploads what fits (info: a line for the log); shard_dev_call
 * allocates nothing. */
ecs_err_t shard_dev_open(const char *device, uint64_t vram_budget, int n_expert,
                         shard_dev_t **out);
void shard_dev_close(shard_dev_t *d);
const char *shard_dev_name(const shard_dev_t *d);
uint64_t shard_dev_budget(const shard_dev_t *d);
ecs_err_t shard_dev_assign(shard_dev_t *d, shard_t *s, char *info, size_t info_n);
void shard_dev_call(shard_dev_t *d, const wire_call_t *c, mux_reply_t *r);
/* Adds the expert cache's counters to w. */
void shard_dev_stats(const shard_dev_t *d, wire_stats_t *w);
/* Device bytes the current tiers hold, and allocations made through the
 * device since it was opened (the request path adds none). */
void shard_dev_usage(const shard_dev_t *d, uint64_t *dev_bytes, size_t *n_allocs);

#endif
