/* moe.h - the grouped routed-expert FFN, free of any model: the one code
 * path that computes routed experts, in the coordinator's local backend
 * and in ecs-worker alike, so both give the same bits.
 *
 * Input: a layer's experts (each a gate, up and down matrix; kmoe_split
 * cuts them out of the GGUF's stacked blk.N.ffn_{gate,up,down}_exps), a
 * step's activation rows (f32, n_embd wide) and a list of (row, expert)
 * pairs. Output: one f32 row of n_embd values per pair,
 *     down_e(silu(gate_e x_row) * up_e x_row),
 * with llama.cpp's numerics (x quantized once to each matrix's vec_dot
 * type, the hidden row quantized for down). The pairs are grouped by
 * expert so that each expert's weights are read once per call, all rows
 * of an expert in one batched product; a pair's result does not depend on
 * which other pairs or rows the call holds, nor on the thread count.
 *
 * A caller holding only some experts (a worker) leaves the others out
 * (gate.nrows == 0) and passes only pairs of held experts; the full
 * (row, slot) set of a step, as the local backend has it, is the case
 * row == NULL (pair p = row p / k, slot p % k).
 *
 * Summing: kmoe_sum adds a row's k pair outputs weighted, in slot order
 * (slot 0 first), from wherever they lie in a buffer. The local backend
 * sums kmoe's own output rows with it; a coordinator that got the pair
 * rows back from workers sums them with it too: same inputs, same order,
 * the same bits.
 *
 * Usage (one layer, all k slots of n rows, weighted sum into out):
 *
 *     kmoe_expert_t ex[N_EXPERT];
 *     kmoe_split(&gate_exps, &up_exps, &down_exps, N_EXPERT, ex);
 *     const kmoe_expert_t *layers[1] = {ex};
 *     kmoe_shape_t s = {.n_embd = E, .n_ff_exp = F, .n_expert = N_EXPERT,
 *                       .k = K, .max_rows = 512};
 *     kmoe_t *moe;
 *     if (kmoe_new(&s, layers, 1, tp, &moe) != ECS_OK) ...;
 *     if (kmoe_prepare(moe, 0, n, x, n * K, NULL, ids) != ECS_OK) ...;
 *     kmoe_compute(moe);
 *     kmoe_sum(tp, n, K, E, kmoe_outs(moe), kmoe_where(moe), weights, out);
 *     kmoe_free(moe);
 *
 * A caller that runs other products alongside (the model's shared
 * experts) appends kmoe_gate_up's and kmoe_down's jobs to its own
 * kcpu_run_jobs regions instead of calling kmoe_compute.
 *
 * Not thread-safe: one call (prepare .. outputs read) at a time per
 * kmoe_t; its threads come from the pool given to kmoe_new. */
#ifndef ECS_KERNELS_MOE_H
#define ECS_KERNELS_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/threadpool.h"
#include "kernels/cpu/cpu.h"

/* One expert's matrices (gate.nrows == 0: not held here). */
typedef struct {
    kcpu_mat_t gate, up; /* n_ff_exp rows of n_embd */
    kcpu_mat_t down;     /* n_embd rows of n_ff_exp */
} kmoe_expert_t;

typedef struct {
    int n_embd;
    int n_ff_exp;
    int n_expert;  /* experts per layer; expert ids are in [0, n_expert) */
    int k;         /* slots per row (n_expert_used): the pair count of a full call */
    int max_rows;  /* activation rows per call, 1 .. 65536 (scratch is sized for it) */
} kmoe_shape_t;

typedef struct kmoe kmoe_t;

/* Expert e of stacked tensors (gate, up: n_expert * n_ff_exp rows; down:
 * n_expert * n_embd rows, the GGUF's ffn_*_exps), e in [0, n_expert):
 * out[e] views rows of the stacks (and of their interleaved copies). */
void kmoe_split(const kcpu_mat_t *gate, const kcpu_mat_t *up, const kcpu_mat_t *down,
                int n_expert, kmoe_expert_t *out);

/* layers[l] (l < n_layer): n_expert experts, or NULL for a layer without
 * routed experts. The list of layers is copied; the expert arrays it points
 * to (and the weights) must outlive the kmoe_t. Checks every held expert's shape and types against s, sizes
 * the scratch for max_rows rows and max_rows * k pairs of the widest
 * types present, and reserves the kernels' scratch on tp's threads.
 * ECS_ERR_INVAL for a bad shape, ECS_ERR_NOMEM. */
ecs_err_t kmoe_new(const kmoe_shape_t *s, const kmoe_expert_t *const *layers, int n_layer,
                   ecs_threadpool_t *tp, kmoe_t **out);
void kmoe_free(kmoe_t *m);
/* Bytes of scratch allocated. */
size_t kmoe_bytes(const kmoe_t *m);
/* Most jobs one kmoe_gate_up or kmoe_down call appends (n_expert). */
int kmoe_max_jobs(const kmoe_t *m);

/* Starts a call: n_rows rows of x (n_embd floats each, contiguous) and
 * n_pairs pairs: pair p takes row[p] (row NULL: p / k) through expert
 * expert[p]. Checks the layer, every id and row (ECS_ERR_RANGE for an
 * expert out of range or not held, a row out of range; ECS_ERR_INVAL for
 * a layer without experts or counts over the shape), groups the pairs by
 * expert (stable: ascending expert id, pair order within one) and
 * quantizes the rows. x, row and expert are read only during this call. */
ecs_err_t kmoe_prepare(kmoe_t *m, int layer, int n_rows, const float *x, int n_pairs,
                       const int32_t *row, const int32_t *expert);
/* kmoe_prepare with the rows already quantized, as the kernels compute from
 * them (a wire may carry them: ~3.5x fewer bytes than f32 for Q8_K):
 * xq holds n_rows rows made by kcpu_quantize_rows(tp, gate_type, ...) for
 * the weight type of the layer's ffn_gate_exps (kcpu_act_row(gate_type,
 * n_embd) bytes apart), xq_up the same for ffn_up_exps' type when its
 * vec_dot type differs from gate's (else NULL). The same bits as
 * kmoe_prepare on the f32 rows. Both are copied: not read after the call. */
ecs_err_t kmoe_prepare_q(kmoe_t *m, int layer, int n_rows, const void *xq, const void *xq_up,
                         int n_pairs, const int32_t *row, const int32_t *expert);
/* Computes every pair's output: kmoe_gate_up's and kmoe_down's jobs as two
 * regions on the pool. */
void kmoe_compute(kmoe_t *m);
/* The two halves of kmoe_compute for a caller's own regions: append this
 * call's jobs (at most kmoe_max_jobs each) to j, run the gate/up region,
 * then kmoe_down's jobs in a later region. */
void kmoe_gate_up(kmoe_t *m, kcpu_jobs_t *j);
void kmoe_down(kmoe_t *m, kcpu_jobs_t *j);

/* After kmoe_compute (or the down region): the n_pairs output rows, n_embd
 * floats each, grouped by expert; pair p's row is kmoe_outs(m) +
 * kmoe_where(m)[p] * n_embd. Pairs passed sorted by expert id (as a
 * worker's per-expert row ranges are) have where[p] == p. Valid until the
 * next kmoe_prepare. */
const float *kmoe_outs(const kmoe_t *m);
const int32_t *kmoe_where(const kmoe_t *m);

/* out[t] (n_embd floats) = sum over slots j < k, slot 0 first, of
 * w[t * k + j] * d[where[t * k + j] * n_embd ...] for t < n_rows; on the
 * pool for big steps. The bits depend only on the rows' values, the
 * weights and k: not on where the rows lie, how they were grouped or the
 * thread count. */
void kmoe_sum(ecs_threadpool_t *tp, int n_rows, int k, int n_embd, const float *d,
              const int32_t *where, const float *w, float *out);

/* ---- a layer's shared experts (ffn.c) ----
 *
 * One dense SwiGLU FFN of n_ff on every row of a call (its matrices in a
 * kmoe_expert_t: gate, up n_ff x n_embd, down n_embd x n_ff), its two
 * products appended to the caller's regions beside kmoe's: what a worker
 * computes for ExpertCall.shared, with the coordinator model's products
 * (the same bits). Scratch for max_rows (<= KCPU_MAX_BATCH) rows.
 *
 *     kmoe_ffn_prepare(f, &shexp[layer], n, x_or_NULL, xq, xq_type, out);
 *     kmoe_ffn_gate_up(f, &jobs);  ... kmoe_gate_up(moe, &jobs); run region
 *     kmoe_ffn_down(f, &jobs);     ... kmoe_down(moe, &jobs);    run region
 *     // out: n rows of n_embd floats
 */
typedef struct kmoe_ffn kmoe_ffn_t;
ecs_err_t kmoe_ffn_new(int n_embd, int n_ff, int max_rows, ecs_threadpool_t *tp,
                       kmoe_ffn_t **out);
void kmoe_ffn_free(kmoe_ffn_t *f);
/* A call of n rows through e: x the f32 rows (NULL: none), xq the same rows
 * quantized as kcpu_quantize_rows makes them for a weight whose vec_dot
 * type is xq_type (NULL: none), used by each matrix taking that type; x
 * quantized for any other (ECS_ERR_UNSUPPORTED without x). out receives n
 * rows of n_embd after the down region. x, xq and out are read / written
 * until then. ECS_ERR_INVAL for matrices of another shape. */
ecs_err_t kmoe_ffn_prepare(kmoe_ffn_t *f, const kmoe_expert_t *e, int n, const float *x,
                           const void *xq, ecs_type_t xq_type, float *out);
void kmoe_ffn_gate_up(kmoe_ffn_t *f, kcpu_jobs_t *j); /* appends 1 job */
void kmoe_ffn_down(kmoe_ffn_t *f, kcpu_jobs_t *j);    /* after gate/up's region: 1 job */

#endif
