/* model.h - MoE transformer forward pass for `deepseek2` (MLA) and
 * `qwen3moe` (GQA) GGUF models, with llama.cpp's numerics.
 *
 * model_load() maps a GGUF, reads the architecture's metadata and describes
 * the model as a plain struct of tensor views (model_weights_t) pointing into
 * the mapping: weights are never copied. All scratch memory for a forward
 * step of up to MODEL_MAX_BATCH rows is allocated at load. KV rows live in
 * blocks of MODEL_KV_BLOCK tokens: a sequence reads and writes them through
 * its block table, over blocks of a shared pool (model_kvpool_new; the
 * serving scheduler hands them out) or of a pool of its own
 * (model_ctx_new, one whole context). Evaluating tokens allocates nothing.
 *
 * Routed experts are computed behind model_experts_ops, so the same model
 * code runs with experts in-process (the local backend, the default) or on
 * remote workers. */
#ifndef ECS_MODEL_H
#define ECS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/arch.h"
#include "common/gguf.h"
#include "common/threadpool.h"
#include "kernels/cpu/cpu.h"

/* Rows per forward step. A long prompt is evaluated in steps this big, so
 * that each routed expert sees many rows per step (its weights are read
 * once per step); the products run in tiles of KCPU_MAX_BATCH rows. */
#define MODEL_MAX_BATCH 512
#define MODEL_MAX_CTX (1 << 22)

/* One layer's tensors. Norm vectors are F32 pointers into the mapping; every
 * matrix is a kcpu_mat_t view (nrows = output width, ncols = input width).
 * Members an architecture or layer does not use are zero / NULL. */
typedef struct {
    const float *attn_norm;      /* [n_embd] */
    /* deepseek2 */
    kcpu_mat_t wq;               /* n_embd -> n_head*head_k (no q-LoRA) */
    kcpu_mat_t wq_a;             /* n_embd -> q_lora_rank */
    const float *q_a_norm;       /* [q_lora_rank] */
    kcpu_mat_t wq_b;             /* q_lora_rank -> n_head*head_k */
    kcpu_mat_t wkv_a;            /* n_embd -> kv_lora_rank + n_rot */
    const float *kv_a_norm;      /* [kv_lora_rank] */
    kcpu_mat_t wkv_b;            /* kv_lora_rank -> n_head*(qk_nope + head_v),
                                    per head [k_nope | v] */
    /* qwen3moe (wq above is shared) */
    kcpu_mat_t wk, wv;           /* n_embd -> n_head_kv*head_k */
    const float *q_norm, *k_norm;/* [head_k], per-head RMSNorm before rope */
    kcpu_mat_t wo;               /* n_head*head_v -> n_embd */

    const float *ffn_norm;       /* [n_embd] */
    bool moe;
    /* dense FFN */
    kcpu_mat_t ffn_gate, ffn_up; /* n_embd -> n_ff */
    kcpu_mat_t ffn_down;         /* n_ff -> n_embd */
    /* MoE */
    kcpu_mat_t gate_inp;         /* n_embd -> n_expert (router) */
    const float *exp_probs_b;    /* [n_expert] selection bias, or NULL */
    kcpu_mat_t gate_exps, up_exps; /* all experts stacked: n_expert*n_ff_exp rows */
    kcpu_mat_t down_exps;        /* n_expert*n_embd rows of n_ff_exp */
    kcpu_mat_t gate_shexp, up_shexp; /* n_embd -> n_ff_shexp (nrows 0 if none) */
    kcpu_mat_t down_shexp;       /* n_ff_shexp -> n_embd */
} model_layer_t;

typedef struct {
    kcpu_mat_t token_embd;       /* n_vocab rows of n_embd */
    const float *output_norm;    /* [n_embd] */
    kcpu_mat_t output;           /* n_embd -> n_vocab (== token_embd if tied) */
    model_layer_t *layers;       /* [n_layer] */
} model_weights_t;

/* Expert e's slice of a stacked expert tensor with rows_per_expert rows. */
kcpu_mat_t model_expert_mat(const kcpu_mat_t *stack, int e, int rows_per_expert);

typedef struct model model_t;
typedef struct model_ctx model_ctx_t;

typedef struct {
    int n_ctx;      /* largest context any model_ctx may have; <= 0: min(n_ctx_train, 4096) */
    int n_threads;  /* <= 0: online CPUs */
    bool profile;   /* time the phases of each step (model_profile) */
    /* Directory of the decode copy of the weights: the matrices that have
     * the kernels' row-interleaved layout (kcpu_r16_pack) are copied into a
     * cache file there on first load (a few seconds per GB, the size of the
     * matrices again on disk) and mapped, as the GGUF is, on later loads
     * while the GGUF is unchanged. Results are bit for bit the same, decode
     * and prompts are faster. Products of the copied matrices then read the
     * copy alone (their GGUF bytes are never touched), so the copy and the
     * rest of the GGUF must fit in repack_ram bytes (0: 90 % of the
     * physical memory); else there is no copy and the model says why
     * (model_repack_note). NULL: everything is read from the GGUF. */
    const char *repack_dir;
    size_t repack_ram;
    /* Rows of deepseek2 latent contexts in the absorbed form split the
     * attention core by keys (fixed runs, each thread taking all heads)
     * once the row sees this many keys; below it, by heads. The split
     * reads the cache once instead of once per group of heads. The two
     * differ in their last bits (the split's online softmax), so the
     * choice is each row's own, whatever else its step holds. 0: 512;
     * < 0: never (tests use 1 to cover the split on short contexts). */
    int attn_split_min;
    /* The decode key split's products on the tile unit (AMX-BF16) where
     * the CPU has it and the cache is BF16 (attn_amx.c): results within
     * rounding of the vector kernels', not their bits. true: never
     * (--no-amx, to compare). */
    bool no_amx;
    /* The routed experts run in workers (coordinator/dispatch): the decode
     * copy leaves them out (its own file, <gguf>.coord.r16) and nothing here
     * reads their bytes, so a coordinator holds attention, shared experts
     * and the output head in memory, not the expert shards as well. */
    bool experts_remote;
} model_opts_t;

/* Whether tensor data (a routed-expert stack of this model) is read only by
 * the workers when opts.experts_remote. */
bool model_is_routed_expert(const model_t *m, const void *data);

/* Maps and validates path; every tensor the architecture needs must exist
 * with the right shape and a type the CPU kernels support. */
ecs_err_t model_load(const char *path, const model_opts_t *opts, model_t **out);
void model_free(model_t *m);

const arch_hparams_t *model_hparams(const model_t *m);
const model_weights_t *model_weights(const model_t *m);
int model_n_vocab(const model_t *m);
int model_n_ctx_max(const model_t *m);
/* The mapped file (tokenizer metadata lives there too). */
const gguf_file_t *model_gguf(const model_t *m);
ecs_threadpool_t *model_threadpool(const model_t *m);
/* Bytes of scratch and derived tensors allocated at load (workspace, the
 * transposed W_k of deepseek2's latent attention, the local expert
 * backend, the kernels' per-thread scratch), KV caches not included. The
 * kernel scratch is reserved for the pool's threads, the loading thread
 * among them: steps run from that thread allocate nothing (another thread
 * grows its own scratch on its first step). */
size_t model_workspace_bytes(const model_t *m);
/* What the load found odd but not fatal (NULL if nothing), e.g. tensors in
 * the file the architecture does not use: for the user to see. */
const char *model_load_warning(const model_t *m);
/* What the load did about weights the page cache held in small folios
 * (read back so that they map with 2 MB pages: decode at depth read them
 * 4-20 % slower through 4 KB pages, docs/benchmarks.md session 32), NULL
 * if nothing: for the user to see. */
const char *model_pages_note(const model_t *m);
/* Why the decode copy asked for by opts.repack_dir is not in use (NULL if
 * it is, or was not asked for): the model then runs from the GGUF alone. */
const char *model_repack_note(const model_t *m);
/* Bytes of the mapped decode copy (0: none); its path, and whether this
 * load made it, where path / made are not NULL. */
size_t model_repack_bytes(const model_t *m, const char **path, bool *made);
/* Why this load made the decode copy ("none found", "the old one was made
 * from another file, or the GGUF changed since", "the old one is damaged
 * (...)"); NULL when it found a good one or there is none. */
const char *model_repack_made_why(const model_t *m);
/* Temporary copies of killed loads this load removed. */
int model_repack_cleaned(const model_t *m);
/* The decode copy's mapping (NULL: none), model_repack_bytes long. */
const void *model_repack_map(const model_t *m);
/* Whether the tensor whose data starts at data is read from the copy alone
 * (its GGUF bytes never read). */
bool model_repack_has(const model_t *m, const void *data);
/* Touches every page the model reads (every tensor not read from the
 * decode copy, and the copy; the routed experts left out when
 * skip_routed: the workers read those), so that timed runs measure the
 * engine, not the page faults of a freshly mapped file (ecs-run --bench,
 * ecs-plan). Returns the seconds it took. */
double model_prefault(const model_t *m, bool skip_routed);
/* Phases of a forward step, as model_profile reports them. */
typedef enum {
    MODEL_PH_EMBED,     /* embedding rows, rope tables */
    MODEL_PH_NORM,      /* RMSNorms before attention and FFN */
    MODEL_PH_ATTN_IN,   /* Q and KV projections, rope, KV cache writes */
    MODEL_PH_ATTN_CORE, /* Q.K, softmax, P.V (and ds2 absorption / W_v) */
    MODEL_PH_ATTN_OUT,  /* W_o and the residual add */
    MODEL_PH_ROUTER,    /* router logits and top-k */
    MODEL_PH_FFN_UP,    /* gate/up of routed + shared experts (SwiGLU) */
    MODEL_PH_FFN_DOWN,  /* down of routed + shared experts */
    MODEL_PH_MOE_SUM,   /* weighted sum of the experts, residual add */
    MODEL_PH_DENSE,     /* dense FFN layers */
    MODEL_PH_OUTPUT,    /* final norm and output head */
    MODEL_PH_COUNT
} model_phase_t;

typedef struct {
    const char *name;
    double wall_s;     /* wall-clock time in the phase */
    double cpu_s;      /* process CPU time in it: cpu / (wall x threads) is the pool's use */
    uint64_t regions;  /* parallel regions (pool wake-ups) started in it */
    uint64_t calls;
} model_prof_t;

/* Fills out[MODEL_PH_COUNT] with the totals since load or the last reset;
 * all zero unless the model was loaded with opts.profile. */
void model_profile(const model_t *m, model_prof_t out[MODEL_PH_COUNT]);
void model_profile_reset(model_t *m);

/* Bytes of weights one decoded token reads (default latent attention):
 * every tensor of the attention, dense and shared FFNs, the router, the
 * n_expert_used / n_expert share of each stacked expert tensor, the output
 * head and one embedding row. Decode speed x this = weight bandwidth. */
size_t model_decode_bytes(const model_t *m);

/* ---- routed-expert backend ----
 * For one layer and n_tok rows, submit() hands over the rows (normalised
 * FFN input x, n_tok x n_embd), the chosen experts ids (n_tok x k) and their
 * weights w (n_tok x k); wait() returns in out (n_tok x n_embd) the per-row
 * weighted sum of the routed experts' outputs, summed in slot order
 * (slot 0 first). x, ids and w stay valid until wait() returns. The model
 * computes the shared experts between the two calls, unless the backend
 * took them: took_shared (optional, NULL: never), asked right after a
 * submit of a layer with shared experts, says whether that call computes
 * them too; then its wait() also writes their n_tok rows into sh, the
 * bits model_shared_ffn would give.
 *
 * A backend with slots > 1 takes that many submits outstanding at once,
 * each with its own tag (0 .. slots - 1) that its wait() names: the model
 * then runs one micro-batch's attention while another's experts are out
 * (model_set_micro_batches). Every submit is followed by a wait of its tag,
 * failed steps included. slots 0 or 1: one at a time, tag always 0. */
typedef struct model_experts_ops {
    ecs_err_t (*submit)(void *ctx, int tag, int layer, int n_tok, const float *x, int k,
                        const int32_t *ids, const float *w);
    ecs_err_t (*wait)(void *ctx, int tag, int layer, float *out);
    int slots;
    bool (*took_shared)(void *ctx, int tag, float *sh);
} model_experts_ops;

/* Layer's shared experts on n rows of x (n_tok x n_embd) into out: what
 * the model adds beside the routed experts (nothing to do in a layer
 * without them). For a backend that took them and then cannot compute
 * them elsewhere; on the model's thread, between submit and wait. */
void model_shared_ffn(model_t *m, int layer, int n, const float *x, float *out);

/* Micro-batches a step may be cut into (--micro-batches). */
#define MODEL_MAX_MICRO 4

/* Steps of several rows are cut into up to n micro-batches (1: whole, the
 * default) of about equal rows, at sequence boundaries where one lies
 * near, in ping-pong per layer: micro-batch b's attention, router and
 * shared experts run while the routed experts of the others are out. Only
 * while the backend takes that many submits at once (ops.slots; the local
 * backend takes one: nothing to overlap). The logits are the same bits
 * however a step is cut (every row's products are batch-invariant and the
 * deepseek2 attention form is chosen by the sequence's rows in the whole
 * step). ECS_ERR_RANGE outside 1 .. MODEL_MAX_MICRO. */
ecs_err_t model_set_micro_batches(model_t *m, int n);

/* Use another expert backend (ops NULL: back to the built-in local one). */
void model_set_experts(model_t *m, const model_experts_ops *ops, void *ctx);

/* The in-process backend: the rows routed to each expert are grouped into
 * one batched matmul, so each expert's weights are read once per step. */
typedef struct model_experts_local model_experts_local_t;
ecs_err_t model_experts_local_new(const model_t *m, ecs_threadpool_t *tp,
                                  model_experts_local_t **out);
void model_experts_local_free(model_experts_local_t *l);
size_t model_experts_local_bytes(const model_experts_local_t *l);
extern const model_experts_ops model_experts_local_ops;

/* ---- sequences ---- */

enum {
    /* deepseek2: cache the expanded per-head K and V (as llama.cpp does)
     * instead of the compact latent. A reference path for tests; the
     * default absorbed-latent path is mathematically equal. Ignored by
     * architectures without MLA. */
    MODEL_CTX_MLA_EXPANDED = 1u << 0,
    /* Keep K and V in F32 and attend in F32 (no F16 rounding of the query
     * or the probabilities): exact attention, for comparing against a
     * float64 reference. Twice the KV memory. */
    MODEL_CTX_KV_F32 = 1u << 1,
    /* deepseek2 latent cache: always attend in the absorbed form. By
     * default a sequence with at least MODEL_MLA_EXPAND_ROWS rows in a step
     * (a prompt) attends in the expanded form instead, from K and V expanded
     * from the latent cache for the step: fewer FLOPs, slightly different
     * rounding. With this flag every step's rows give bit-identical results
     * however the rows were batched (tests compare batched and one-by-one
     * runs). */
    MODEL_CTX_MLA_ABSORBED = 1u << 2,
    /* Keep K and V in BF16 (round to nearest even, as ggml's fp32->bf16)
     * and attend as ggml does over a BF16 cache: the query and the
     * probabilities rounded to BF16, products of BF16 pairs summed in F32
     * (AVX-512 BF16's vdpbf16ps where the CPU has it: twice the products
     * per instruction of an F32 FMA). Same KV memory as F16; not with
     * MODEL_CTX_KV_F32. */
    MODEL_CTX_KV_BF16 = 1u << 3,
    /* deepseek2's latent cache in 8 bits (model_int.h, MODEL_KV_Q8): about
     * half a BF16 row's bytes, and the decode attention's products on
     * VNNI (twice vdpbf16ps's per instruction) at every depth; prompts
     * expand it to BF16. Less precise: tests/unit/test_kv_q8.c states the
     * logits' distance to a BF16 cache. Only with the latent cache (not
     * MODEL_CTX_MLA_EXPANDED nor qwen3moe), alone of the KV types. */
    MODEL_CTX_KV_Q8 = 1u << 4,
};

/* The KV flag of a cache type's name ("f16": 0, "bf16", "f32", "q8"), or -1 for
 * an unknown name; and the name of flags' cache type. */
int model_kv_type_flag(const char *name);
const char *model_kv_type_name(unsigned flags);

/* The options of a model's run that ecs-run and ecs-coordinator share
 * (opts.c): --kv-type f16|bf16|f32|q8, --kv-f32, --repack DIR, --no-repack,
 * --no-amx. */
typedef struct {
    unsigned kv_flag;       /* MODEL_CTX_KV_F32 / _BF16 or 0 (--kv-type) */
    const char *repack_dir; /* --repack */
    bool no_repack;
    bool no_amx;            /* --no-amx (model_opts_t.no_amx) */
} model_cli_t;
/* An option without a value: true if opt is one of them (o updated). */
bool model_cli_flag(model_cli_t *o, const char *opt);
bool model_cli_takes_value(const char *opt);
/* An option with its value v: 1 if opt is one of them and v good (o
 * updated), 0 if opt is none of them, -1 for a bad value (message set). */
int model_cli_opt(model_cli_t *o, const char *opt, const char *v);
/* The decode copy's directory: NULL with --no-repack, --repack's, else
 * krepack_default_dir's (written to buf). */
const char *model_cli_repack_dir(const model_cli_t *o, char *buf, size_t cap);

/* deepseek2 latent cache: a sequence's rows in a step attend in the expanded
 * form from this many rows on. Expanding costs about as much per cached
 * position as the absorbed form costs per query row and cached position, so
 * it pays from ~70 rows whatever the depth. A row's result depends only on
 * whether its step had this many rows of its sequence: a prompt cut into
 * steps of at least this many rows gives the same logits however it is cut. */
#define MODEL_MLA_EXPAND_ROWS 64

/* Tokens per KV block. 64: a multiple of the attention kernels' 16-key
 * tiles, so a block is whole tiles and each run of blocks (consecutive
 * ids are contiguous rows) one contiguous run for them, long enough that the per-run overhead is lost
 * in the work (a decode query reads ~72 KB of a V2-Lite latent block per
 * layer); MODEL_MLA_EXPAND_ROWS, the least a deepseek2 prompt chunk
 * computes, so prefix-cache blocks line up with what prompts compute; and
 * small enough that a request wastes under one block per sequence and the
 * prefix cache shares conversations at 64-token granularity. */
#define MODEL_KV_BLOCK 64

/* ---- paged KV ---- */
typedef struct model_kvpool model_kvpool_t;
/* Bytes of one block (every layer's K and V rows of MODEL_KV_BLOCK tokens)
 * for contexts with flags. */
size_t model_kv_block_bytes(const model_t *m, unsigned flags);
/* n_blocks blocks allocated at once (ECS_ERR_NOMEM if they cannot be). */
ecs_err_t model_kvpool_new(model_t *m, int n_blocks, unsigned flags, model_kvpool_t **out);
void model_kvpool_free(model_kvpool_t *p);
int model_kvpool_n_blocks(const model_kvpool_t *p);
/* Block b's rows as model_kv_block_bytes bytes (every layer's K rows,
 * then its V rows), e.g. to keep it on disk; put writes them back. */
void model_kvpool_block_get(const model_kvpool_t *p, int b, void *out);
void model_kvpool_block_put(model_kvpool_t *p, int b, const void *in);
/* A sequence over p's blocks: its table (model_ctx_table, n_ctx /
 * MODEL_KV_BLOCK entries rounded up) is filled by the caller, which keeps
 * model_ctx_set_blocks up to date; a step that would write past the filled
 * blocks fails with ECS_ERR_NOMEM and changes nothing. */
ecs_err_t model_ctx_new_paged(model_kvpool_t *p, int n_ctx, model_ctx_t **out);
int32_t *model_ctx_table(model_ctx_t *c);
/* The first n_blk table entries are the sequence's blocks, and its first
 * n_past tokens are cached in them (<= n_blk * MODEL_KV_BLOCK; e.g. full
 * blocks another sequence computed: shared blocks are only read). */
ecs_err_t model_ctx_set_blocks(model_ctx_t *c, int n_blk, int n_past);

/* KV bytes model_ctx_new(m, n_ctx, flags) allocates (whole blocks). */
size_t model_ctx_bytes(const model_t *m, int n_ctx, unsigned flags);
ecs_err_t model_ctx_new(model_t *m, int n_ctx, unsigned flags, model_ctx_t **out);
void model_ctx_free(model_ctx_t *c);
/* Forget the sequence (keeps the memory). */
void model_ctx_reset(model_ctx_t *c);
/* Keep only the first n_keep tokens (e.g. a shared prompt prefix);
 * ECS_ERR_RANGE if n_keep is negative or more than are cached. */
ecs_err_t model_ctx_truncate(model_ctx_t *c, int n_keep);
int model_ctx_n_past(const model_ctx_t *c);
int model_ctx_n_ctx(const model_ctx_t *c);
/* The cached rows [0, n) as bytes, e.g. to keep a prefix on disk:
 * model_ctx_rows_bytes(c, n) bytes in the cache's own element type, for
 * contexts of the same model and flags only. Export: ECS_ERR_RANGE past
 * n_past. Import replaces the sequence with those n rows. */
size_t model_ctx_rows_bytes(const model_ctx_t *c, int n);
ecs_err_t model_ctx_export(const model_ctx_t *c, int n, void *out);
ecs_err_t model_ctx_import(model_ctx_t *c, int n, const void *in);

/* Appends n tokens to c's sequence (split into steps of MODEL_MAX_BATCH).
 * logits may be NULL; else it receives n_vocab floats for the last token, or
 * n*n_vocab (row i for token i) when all is true. ECS_ERR_NOMEM (nothing
 * evaluated, the sequence unchanged) when the tokens do not fit in the
 * context; ECS_ERR_RANGE for a token id outside the vocabulary. An expert
 * backend error stops at the failing step: the sequence keeps the steps
 * before it. A model runs one step at a time (not thread-safe). */
ecs_err_t model_eval(model_ctx_t *c, const int32_t *tokens, int n, float *logits, bool all);

/* One step of 1..MODEL_MAX_BATCH rows of possibly different sequences:
 * each row appends token to ctx (rows of one ctx take consecutive positions
 * in order). Rows with want_logits write n_vocab floats each, in row order,
 * to logits. On any error no sequence advances. Latent and expanded
 * (MODEL_CTX_MLA_EXPANDED) contexts cannot share a step. */
typedef struct {
    model_ctx_t *ctx;
    int32_t token;
    bool want_logits;
} model_row_t;
ecs_err_t model_eval_batch(model_t *m, const model_row_t *rows, int n, float *logits);

/* The same step in layer slices: each call runs the rows (as
 * model_eval_batch's) through units [u0, u1) of the model_slice_units
 * (unit 2l: layer l's attention with its residual add, 2l + 1: its FFN;
 * the last layer is one unit), so that a long prompt chunk advances a
 * part of the model at a time while other steps run between its slices
 * (the serving scheduler decodes streams there). resid (the caller's,
 * model_slice_bytes(m, n) bytes) keeps the rows' residual stream from one
 * slice to the next: u0 0 starts from the embeddings, u1
 * model_slice_units ends as model_eval_batch does (logits of the rows that
 * want them; the sequences advance). Each slice writes its layers' K/V
 * rows, but the sequences advance only at the end, so steps between the
 * slices must leave these sequences alone, and a step dropped midway
 * leaves them as they were. The same rows give the same bits however
 * their units are cut (and whatever shares a model_eval_batch with them).
 * ECS_ERR_INVAL for units outside 0..model_slice_units or no resid where
 * one is needed. */
int model_slice_units(const model_t *m);
/* A deepseek2 attention unit of a deep chunk spends about half its time
 * expanding the earlier positions' latent K/V into per-head K and V
 * (attn_exp.c); these run that part ahead, in parts, so that it can fall
 * into other steps. model_slice_expand_keys: how many earlier positions
 * unit u of these rows (one sequence's, as the next model_eval_slice
 * takes them) can take expanded ahead (0: none; its n_past else), and in
 * *done how many are (those of the last calls below, unless dropped).
 * model_slice_expand: expands positions [t0, t1), t0 = *done: the next
 * model_eval_slice running unit u over these rows expands only the
 * positions after t1. Bits: those of unit u run without it. The expansion
 * lives in the model's step scratch: any expanded attention of another
 * step in between (a prompt chunk of MODEL_MLA_EXPAND_ROWS rows in a
 * batch), a change to the sequence (a step that advances it,
 * model_ctx_set_blocks other than more blocks after the same n_past,
 * _reset, _truncate, _import, _free) or
 * model_slice_expand_drop drops it (unit u then expands it all itself:
 * slower, the same bits). ECS_ERR_INVAL for a unit or range that cannot
 * be taken. */
int model_slice_expand_keys(const model_t *m, const model_row_t *rows, int n, int u, int *done);
ecs_err_t model_slice_expand(model_t *m, const model_row_t *rows, int n, int u, int t0, int t1);
void model_slice_expand_drop(model_t *m);
size_t model_slice_bytes(const model_t *m, int n);
ecs_err_t model_eval_slice(model_t *m, const model_row_t *rows, int n, int u0, int u1,
                           float *resid, float *logits);

/* ---- helpers exposed for tests and other backends ---- */

/* cos/sin pairs for position pos: cs[2i], cs[2i+1] for i < n_rot/2, as
 * ggml's rope cache (YaRN ramp and magnitude included). */
void model_rope_cache(const arch_rope_t *r, int pos, float *cs);
/* Rotates the first n_rot values of x in place with a cache from above. */
void model_rope_apply(const arch_rope_t *r, const float *cs, float *x);
/* ggml_rope_yarn_corr_dims: the dims range where YaRN blends. */
void model_rope_yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast,
                               float beta_slow, float dims[2]);

/* Routing for one row: router logits[n_expert] -> k expert ids and weights,
 * with the gating function, selection bias (may be NULL), group limit,
 * normalisation and scaling of hp. scratch holds 3*n_expert floats. */
void model_route(const arch_hparams_t *hp, const float *logits, const float *bias,
                 int32_t *ids, float *w, float *scratch);

#endif
