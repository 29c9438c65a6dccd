/* tier.h - expert tiers for a worker on a GPU: which routed experts are
 * resident in VRAM (an expert cache), where a call's other experts run (on
 * the CPU, or streamed over PCIe into VRAM, whichever a measured cost model
 * says is faster for the row count), prefetch of the experts the router
 * predicts for the next layer, and an executor that carries a layer call
 * out on a kgpu device.
 *
 * Contract
 * - Everything is sized at start-up: ktier_new and ktier_exec_new allocate
 *   all host and device memory (VRAM: n_slots expert slots plus activation
 *   buffers for max_rows rows); planning, prefetching and calls allocate
 *   nothing and never use more slots than the budget gave.
 * - Eviction is LRU over slots: a hit, a stream or a prefetch moves a slot
 *   to the most-recently-used end; the victim is the least recently used
 *   slot that the current call does not use (slots of the call being
 *   computed, and those its prefetch loaded, are pinned until the next
 *   plan). LRU because routing in decode is bursty per layer and a stale
 *   expert should go first; frequency is left out on purpose, so a change
 *   of topic re-populates the cache within a few steps.
 * - A miss streams the expert when upload + GPU time for its rows is below
 *   the CPU time (ktier_stream_pays); otherwise it runs on the CPU and the
 *   cache is left as it was. The coefficients come from measurements
 *   (ktier_cost_fit, ktier_exec_calibrate), never from constants.
 * - Statistics count every (call, expert): hits + misses = uses; the hit
 *   rate is hits / uses; prefetched slots later used are counted apart.
 * - Not thread-safe: one thread (the worker's executor) owns a ktier_t.
 *
 * Usage
 *   ktier_opts_t o = {.n_layers = L, .n_experts = X,
 *                     .n_slots = ktier_slots(budget, fixed, expert_bytes), .cost = measured};
 *   ktier_t *t;  ktier_new(&o, &t);
 *   ktier_plan(t, layer, n, experts, rows, places);   // HIT / STREAM into slot / CPU
 *   ktier_prefetch(t, layer + 1, n_pred, predicted, loads); // uploads to start now
 */
#ifndef ECS_KTIER_H
#define ECS_KTIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/gpu/gpu.h"

/* Microseconds per expert for a given row count: t = us0 + us_row * rows. */
typedef struct {
    double cpu_us0, cpu_us_row; /* computing a host-resident expert on the CPU */
    double gpu_us0, gpu_us_row; /* computing a VRAM-resident expert on the GPU */
    double upload_us;           /* one expert's weights, pinned host -> VRAM */
} ktier_cost_t;

typedef struct {
    int n_layers, n_experts; /* keys (layer, expert) */
    int n_slots;             /* VRAM expert slots; 0: everything on the CPU */
    int max_prefetch;        /* loads one prefetch may start; 0: n_slots / 4 (at least 1) */
    ktier_cost_t cost;
} ktier_opts_t;

typedef enum { KTIER_HIT = 0, KTIER_STREAM = 1, KTIER_CPU = 2 } ktier_where_t;

typedef struct {
    ktier_where_t where;
    int slot; /* HIT, STREAM: the VRAM slot; CPU: -1 */
} ktier_place_t;

typedef struct {
    int slot, layer, expert;
} ktier_load_t;

typedef struct {
    uint64_t calls, uses, hits, misses; /* uses = hits + misses */
    uint64_t streamed, cpu;             /* how the misses ran */
    uint64_t prefetched, prefetch_used; /* loads started by prefetch; of those, later hit */
    uint64_t evicted;
    double hit_rate; /* hits / uses, 0 before any use */
} ktier_stats_t;

typedef struct ktier ktier_t;

/* Slots that fit: (budget - fixed) / expert_bytes, 0 if none. */
int ktier_slots(size_t budget, size_t fixed, size_t expert_bytes);

/* True when streaming one expert and computing `rows` rows on the GPU is
 * predicted faster than computing them on the CPU. */
bool ktier_stream_pays(const ktier_cost_t *c, int rows);

/* Least-squares line us = us0 + us_row * rows through n >= 2 measurements
 * with at least two distinct row counts. */
ecs_err_t ktier_cost_fit(int n, const int *rows, const double *us, double *us0, double *us_row);

ecs_err_t ktier_new(const ktier_opts_t *o, ktier_t **out);
void ktier_free(ktier_t *t);

/* Places one layer call: n distinct experts with their row counts; out[i]
 * is where experts[i] runs. A STREAM place's slot now maps to the expert
 * and the caller must upload it before computing. */
ecs_err_t ktier_plan(ktier_t *t, int layer, int n, const int32_t *experts, const int32_t *rows,
                     ktier_place_t *out);

/* Prefetch hint: experts predicted for `layer`. Writes the uploads to start
 * (at most n and max_prefetch) to loads and returns their count, or -1 on
 * bad input (message in ecs_errmsg). Experts already resident are touched. */
int ktier_prefetch(ktier_t *t, int layer, int n, const int32_t *experts, ktier_load_t *loads);

/* Replaces the cost model (after a calibration). */
void ktier_set_cost(ktier_t *t, const ktier_cost_t *c);
/* Forgets what slot holds (its memory was overwritten). */
void ktier_evict(ktier_t *t, int slot);

/* Slot holding (layer, expert), or -1. */
int ktier_slot_of(const ktier_t *t, int layer, int expert);
int ktier_n_slots(const ktier_t *t);
void ktier_stats(const ktier_t *t, ktier_stats_t *s);

/* ---- the executor: a layer call on a kgpu device, tiers applied ---- */

typedef struct {
    ecs_type_t gate_type, up_type, down_type;
    const void *gate, *up, *down; /* host copies (pinned memory lets uploads overlap) */
} ktier_expert_t;

typedef struct {
    int n_embd, n_ff;
    int max_rows;    /* rows per call */
    int max_experts; /* experts per call (and per prefetch) */
    size_t slot_bytes; /* one expert's gate + up + down, the largest in the model */
    /* The host weights of (layer, expert). */
    ecs_err_t (*expert)(void *ctx, int layer, int expert, ktier_expert_t *out);
    /* The CPU tier (host pointers); NULL: kgpu_ffn_ref. */
    ecs_err_t (*cpu_ffn)(void *ctx, const kgpu_ffn_t *f);
    void *ctx;
} ktier_exec_opts_t;

typedef struct ktier_exec ktier_exec_t;

/* Device bytes ktier_exec_new allocates besides the slots (activation
 * buffers for max_rows rows): the `fixed` of ktier_slots. */
size_t ktier_exec_fixed_bytes(const ktier_exec_opts_t *o);

/* Allocates the policy's n_slots slots and the activation buffers on g. */
ecs_err_t ktier_exec_new(kgpu_t *g, ktier_t *policy, const ktier_exec_opts_t *o,
                         ktier_exec_t **out);
void ktier_exec_free(ktier_exec_t *ex);

/* One layer call: rows [row0[i], row0[i] + n_rows[i]) of x (n_rows_total
 * rows, gathered by expert) go through experts[i]; y gets every row's
 * unweighted FFN output. Returns when y is complete. */
ecs_err_t ktier_exec_call(ktier_exec_t *ex, int layer, int n, const int32_t *experts,
                          const int32_t *row0, const int32_t *n_rows, int n_rows_total,
                          const float *x, float *y);

/* Starts the uploads for the experts predicted for `layer` on the upload
 * stream and returns. Called before ktier_exec_call of the layer in hand,
 * they overlap its compute; the next call's kernels wait for them. */
ecs_err_t ktier_exec_prefetch(ktier_exec_t *ex, int layer, int n, const int32_t *experts);

/* Measures the cost model on this machine (max_rows >= 8) with (layer, expert)'s weights:
 * CPU and GPU time for 1, 8 and 64 rows and one upload (a few runs each,
 * the fastest kept), writes it to *c and gives it to the policy. Uses VRAM
 * slot 0 (emptied afterwards) and needs at least one slot. Start-up only. */
ecs_err_t ktier_exec_calibrate(ktier_exec_t *ex, int layer, int expert, ktier_cost_t *c);

#endif
