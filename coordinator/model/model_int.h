/* model_int.h - private structures shared by the files of the model module
 * (loader, forward pass, local expert backend). Not part of the API. */
#ifndef ECS_MODEL_INT_H
#define ECS_MODEL_INT_H

#include "coordinator/model/model.h"

/* Scratch for one forward step of up to MODEL_MAX_BATCH rows; every buffer
 * is sized at load from the hyperparameters. Row-major, one row per token. */
typedef struct {
    float *x;        /* [nb][n_embd] residual stream */
    float *xn;       /* [nb][n_embd] normalised input of a block */
    float *q;        /* [nb][n_head*head_k] */
    float *qa;       /* [nb][q_lora_rank] */
    float *kv;       /* [nb][kv_w]: ds2 latent+k_pe, qwen K */
    float *v;        /* [nb][n_head_kv*head_v] qwen V */
    float *kvb;      /* [nb][n_head*(qk_nope+head_v)] ds2 expanded K/V */
    float *kvrow;    /* [n_head*(head_k+head_v)] one expanded K and V row */
    ecs_fp16_t *qh;  /* [nb][n_head][qh_w] queries as the attention reads them */
    float *att;      /* [nb][n_head][att_w] absorbed query, then latent attention output */
    float *attv;     /* [nb][n_head*head_v] attention output per head (input of W_o) */
    void *att_act;   /* n_head*nb quantized rows of kv_lora for W_v_b */
    float *ffa, *ffb;/* [nb][ff_w] gate / up of dense and shared FFNs */
    float *sh;       /* [nb][n_embd] shared experts output */
    float *moe;      /* [nb][n_embd] routed experts output */
    float *tmp;      /* [nb][n_embd] a block's output before the residual add */
    float *router;   /* [nb][n_expert] */
    int32_t *ids;    /* [nb][n_expert_used] */
    float *w;        /* [nb][n_expert_used] */
    float *route_scratch; /* [3*n_expert] */
    float *rope;     /* [nb][n_rot] cos/sin per row */
    void *act;       /* quantized activations for kcpu_matmul */
    float *thr;      /* per thread: scores [n_ctx_max], dequant row [kv_lora] */
    size_t thr_stride;
    int qh_w, att_w, kv_w, ff_w;
} model_ws_t;

struct model {
    gguf_file_t *file;
    model_hparams_t hp;
    model_weights_t w;
    model_opts_t opts;
    ecs_threadpool_t *tp;
    kcpu_vec_dot_fn dot_f16;

    model_ws_t ws;
    void *ws_mem;
    size_t ws_bytes;

    const model_experts_ops *ex_ops;
    void *ex_ctx;
    model_experts_local_t *ex_local;
};

/* KV cache geometry: per layer, token rows of k_row (and v_row) F16 values.
 * In the ds2 latent layout V aliases K (the first kv_lora values of a row). */
struct model_ctx {
    model_t *m;
    unsigned flags;
    int n_ctx;
    int n_past;
    bool latent;
    int n_kv_head;      /* heads stored; the latent has one shared by all */
    int dk, dv;         /* per head */
    size_t k_row, v_row;      /* elements per token */
    size_t k_layer, v_layer;  /* elements per layer */
    ecs_fp16_t *k, *v;
    ecs_fp16_t *mem;
    size_t bytes;
};

/* Row of a step: which sequence, at which position. */
typedef struct {
    model_ctx_t *ctx;
    int pos;
    int32_t token;
} model_step_row_t;

#define MODEL_TRY(expr)                                                                            \
    do {                                                                                           \
        ecs_err_t err_ = (expr);                                                                   \
        if (err_ != ECS_OK)                                                                        \
            return err_;                                                                           \
    } while (0)

/* load.c: hyperparameters, then tensor views (needs the former) */
ecs_err_t model_read_hparams(model_t *m);
ecs_err_t model_load_weights(model_t *m);

/* forward.c */
ecs_err_t model_forward(model_t *m, const model_step_row_t *rows, int n,
                        const int *out_rows, int n_out, float *logits);
void model_f16_init(void);

#endif
