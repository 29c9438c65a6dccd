/* attn_int.h - private to coordinator/model's attention files (attn.c:
 * the work items, the head split and the entry points; attn_split.c: the
 * decode key split): the run of a layer's attention and the helpers both
 * use. Not part of model.h or model_int.h's contract.
 *
 * Usage (attn_split.c): attn_plan_run(&a, ...) sets up a head-split run
 * over a step's rows; attn_item(&a, i, ith) is its region item;
 * attn_get_query puts a query as the cache type wants it. */
#ifndef ECS_MODEL_ATTN_INT_H
#define ECS_MODEL_ATTN_INT_H

#include "coordinator/model/model_int.h"

/* Consecutive rows of one sequence attending together. */
typedef struct {
    int row0, nrows;
} tile_t;

/* One layer's attention over a step's tiles x groups of query heads. */
typedef struct {
    model_t *m;
    const model_step_row_t *rows;
    const float *q; /* queries: row r, head h at q + (r * n_head + h) * head_k */
    const model_kv_t *kv; /* NULL: each tile's context cache at layer */
    int layer;
    const tile_t *tiles;
    int n_tiles;
    int hg, n_hg;   /* query heads per item; groups per tile */
    int group;      /* query heads per cached head */
    int dk, dv;     /* per cached head */
    bool latent;
    float *out;     /* row r, head h: out + r * out_ld + h * dv */
    int64_t out_ld;
} attn_run_t;

/* A latent run with the layer's weights: absorption, attention, values. */
typedef struct {
    attn_run_t a;
    const model_layer_t *ly;
    const model_layer_ext_t *ex;
    float *attv;
    int n;
} fused_t;

/* Thread ith's attention scratch (model_ws_t.thr). */
float *attn_thr(model_t *m, int ith);
/* The cached rows of one layer of c. */
model_kv_t attn_ctx_kv(const model_ctx_t *c, int layer);
/* The contiguous run of kv's rows from t0 (before nt): *kr / *vr, *run. */
void attn_kv_run(const model_kv_t *kv, const char *k, const char *v, size_t elt, int t0, int nt,
                 const char **kr, const char **vr, int *run);
/* The first keys of the run from t0 asked for into L2. */
void attn_prefetch_next_run(const model_kv_t *kv, const char *k, const char *v, size_t elt,
                            int t0, int nt, int dk);
/* len of nq queries within the run [t0, t0 + run) into out. */
void attn_run_len(const int *len, int nq, int t0, int run, int *out);
/* Query j of tile tl x heads [h0, h0 + hg) into q as cache type kt wants
 * it; returns the keys it sees. */
int attn_get_query(const attn_run_t *a, const tile_t *tl, int h0, int j, model_kvt_t kt,
                   float *q);
/* Whether run a on a cache of type kt takes the AMX tile unit. */
bool attn_amx_takes(const attn_run_t *a, model_kvt_t kt);
/* A head-split region item: tile x group of heads (kcpu_par_for). */
void attn_item(void *arg, int item, int ith);
/* Which rows of a step a run's tiles hold: only's (all when NULL); with
 * min > 0 those seeing at least min keys (deep) or fewer (not deep). */
typedef struct {
    const model_ctx_t *only;
    int min;
    bool deep;
} attn_rows_t;
/* Runs of consecutive rows of one sequence that f takes, max_rows each. */
int attn_make_tiles(const model_step_row_t *rows, int n, attn_rows_t f, int max_rows, tile_t *t);
/* A head-split run over rows (its tiles into tiles). */
void attn_plan_run(attn_run_t *a, model_t *m, const model_step_row_t *rows, int n, int layer,
                   int group, int dk, int dv, bool latent, float *out, int64_t out_ld,
                   tile_t *tiles);
/* Head h's absorption (q_abs = W_kT q_nope) and values (W_v o), n rows. */
void attn_absorb_head(model_t *m, const model_layer_ext_t *ex, const float *q, int h, int n);
void attn_values_head(model_t *m, const model_layer_t *ly, float *attv, int h, int n);

/* attn_split.c. A row at position p takes the key split when p + 1 >=
 * attn_split_min(m) (INT_MAX: never); attn_split_max_rows: rows of a tile
 * of all heads (0: the split cannot run). attn_split_run: a step whose
 * rows all take it (false: it cannot run); attn_split_mixed: deep and
 * shallow rows, each as it would be alone. */
int attn_split_min(const model_t *m);
int attn_split_max_rows(const model_t *m, int n);
bool attn_split_run(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                    const model_step_row_t *rows, int n, int layer, const float *q, float *attv);
void attn_split_mixed(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                      const model_step_row_t *rows, int n, int layer, const float *q, float *attv,
                      int min);

#endif
