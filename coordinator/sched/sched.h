/* sched.h - continuous batching of generation requests over one model.
 *
 * Contract:
 *   - One scheduler thread owns the model and runs steps of
 *     model_eval_batch: every running request's next token plus chunks of
 *     waiting prompts, within a token budget (chunked prefill mixed with
 *     decode, so a long prompt never freezes running streams).
 *   - A prompt is cut into chunks of at most sched_opts_t.chunk rows (or
 *     slice_chunk, below; idle_chunk while no stream decodes, cut again
 *     between chunks when that changes), as even as possible, so a deepseek2 chunk has
 *     at least MODEL_MLA_EXPAND_ROWS rows unless the whole prompt is
 *     shorter: a request's tokens never depend on the cut, so not on what
 *     else is running.
 *   - While streams decode, the first waiting prompt chunk advances a slice
 *     of layers per step beside the decode rows (sched_opts_t.slice_budget),
 *     the chunks after it waiting; its rows' residual stream waits in a
 *     buffer allocated at sched_new (a deepseek2 chunk's expansion of
 *     the earlier keys, run ahead of its attention unit in parts, in the
 *     model's scratch). A prompt admitted so is cut into smaller chunks
 *     (sched_opts_t.slice_chunk). Slicing changes no bits.
 *   - Admission is first come, first served: a prompt chunk that does not fit
 *     in this step's budget waits, and no later request overtakes it.
 *   - Memory is fixed at sched_new: one pool of KV blocks of MODEL_KV_BLOCK
 *     tokens (from the --kv-mem budget, at least one whole context),
 *     max_running block tables, the logits rows of one step. A request's
 *     table grows block by block; its blocks come back however it ends.
 *     Full blocks stay cached after it (prefix cache, kv.c): a later
 *     prompt with the same start reuses them without changing its tokens.
 *     When blocks run out, new requests wait and the newest running one is
 *     preempted (recomputed later, same tokens). Past max_running requests
 *     wait in the queue (bounded by max_queue; past that, submit says
 *     ECS_ERR_NOMEM); per request, only buffers bounded by the context size
 *     are allocated (sampler, text, token records).
 *   - Other threads talk to it through two queues: sched_submit /
 *     sched_cancel hand work in (a condition variable wakes the scheduler, it
 *     never spins); progress is published under the scheduler's lock and the
 *     notify callback (e.g. an ev_async_send) tells the owner of the requests
 *     to call sched_drain.
 *
 * Usage:
 *   sched_new(model, tok, &opts, &s);           // allocates the KV block pool
 *   sched_start(s);                             // starts the thread
 *   sched_req_t *r; sched_submit(s, &params, user, &r);
 *   ... notify() -> sched_drain(s, on_update, arg): read sched_req_view(r)
 *   sched_cancel(s, r);  sched_release(r);      // when the client is gone
 *   sched_stop(s); sched_free(s);
 */
#ifndef ECS_SCHED_H
#define ECS_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/model/model.h"
#include "coordinator/sampler/sampler.h"
#include "coordinator/tokenizer/tokenizer.h"

#define SCHED_MAX_TOP_LOGPROBS 20

typedef struct sched sched_t;
typedef struct sched_req sched_req_t;

typedef struct {
    int n_ctx;        /* tokens per request context (<= model_n_ctx_max) */
    size_t kv_mem;    /* bytes for the KV block pool; 0: max_running contexts,
                         at most half the available memory */
    int max_running;  /* requests decoding at once (>= 1) */
    int max_queue;    /* requests waiting for a slot before submit refuses */
    int chunk;        /* prompt rows per chunk while a stream decodes, and the
                         longest prompt that joins the decode batch whole
                         (>= 2 * MODEL_MLA_EXPAND_ROWS) */
    /* Prompt rows per chunk while no stream decodes: a prompt alone runs
     * in steps as large as the batch allows, which computes each expert's
     * rows together and expands a deepseek2 sequence's earlier keys once
     * per chunk. The rest of a prompt is cut again between two chunks
     * when streams start or stop decoding. chunk..MODEL_MAX_BATCH -
     * max_running; 0: chunk. */
    int idle_chunk;
    bool prefix_cache; /* full KV blocks stay cached for later requests' prefixes */
    /* Layer-sliced prefill: while streams decode, a prompt chunk runs
     * through a few half layers per step (model_slice_units; its residual
     * kept aside, its K/V written layer by layer; the same bits as in one
     * step), so that a step carrying it takes about slice_budget decode
     * steps' time: pieces (units, and parts of a deepseek2 attention
     * unit's expansion of the earlier keys, model_slice_expand) run while
     * the next one's time, predicted by its kind from the recent pieces,
     * fits (slice_budget - 1) recent decode steps (at least one piece).
     * ECS_SLICE_LOG in the environment prints each piece on stderr, and
     * each step's rows (prompt rows among them), waiting requests, time.
     * 0: off (a chunk runs through every
     * layer in the step that carries it); else >= 1. With nothing decoding
     * a chunk runs through every layer at once. */
    double slice_budget;
    /* > 0: exactly this many units per slice, and slices even when nothing
     * decodes (tests, to cut prompts the same way every run) */
    int slice_units;
    /* With slice_units (tests): before a deepseek2 attention unit that
     * starts a slice, its expansion of the earlier positions runs ahead in
     * parts of this many positions, one part a slice (by budget the parts
     * are sized by time). 0: none. */
    int slice_expand;
    /* Rows per chunk of a prompt of several chunks admitted while a stream
     * decodes (always with slice_units): smaller chunks make the smallest
     * slice (the attention half layer of a chunk deep into its prompt)
     * shorter, at the cost of expanding the earlier rows' deepseek2 K/V
     * once per chunk. 2 * MODEL_MLA_EXPAND_ROWS .. chunk; 0: chunk. The
     * bits are those of any cut (see the contract above). */
    int slice_chunk;
    unsigned kv_flag;  /* the cache type: 0 (F16), MODEL_CTX_KV_BF16 or _F32 */
    void (*notify)(void *arg); /* called (any thread) when sched_drain has work */
    void *notify_arg;
} sched_opts_t;

typedef enum {
    SCHED_RUNNING = 0,
    SCHED_FINISH_LENGTH,    /* max_tokens or the context is full */
    SCHED_FINISH_EOG,       /* the model ended its turn */
    SCHED_FINISH_STOP,      /* a stop string (stop_index) */
    SCHED_FINISH_CANCELLED,
    SCHED_FINISH_ERROR,     /* error holds the message */
} sched_finish_t;

#define SCHED_MAX_CLOSE 16

/* A reasoning budget: once `budget` tokens are generated inside an open
 * think block (open_tag opened it, or the prompt did: opened) that has
 * not written close_tag, the next tokens are close_ids (the tag and what
 * follows it, as the template writes it), then drawing resumes: the model
 * answers. The tags are static strings. */
typedef struct {
    int budget;             /* < 0, or n_close 0: none */
    bool opened;
    const char *open_tag, *close_tag;
    int32_t close_ids[SCHED_MAX_CLOSE];
    int n_close;
} sched_think_budget_t;

typedef struct {
    int32_t *prompt;        /* taken over by sched_submit (freed by it) */
    int n_prompt;
    int max_tokens;         /* >= 1 */
    bool ignore_eos;
    sampler_params_t sp;
    const char *stops[SAMPLER_MAX_STOPS];
    int n_stops;
    int top_logprobs;       /* -1: no logprobs; else 0..SCHED_MAX_TOP_LOGPROBS alternatives */
    bool json;              /* JSON mode: the output is one JSON object, and ends with it
                               (finish EOG); tokens that would break it are never drawn */
    sampler_schema_t *schema; /* with json: the object also follows this schema; taken
                               over by a successful sched_submit (freed by it) */
    int32_t keep[TOK_KEEP_MAX]; /* control tokens whose text goes into the output (a
                               template whose tool calls are control tokens: DeepSeek-V3's);
                               no other control token's does */
    int n_keep;
    sched_think_budget_t think; /* a reasoning budget (think.budget < 0: none) */
} sched_params_t;

/* A generated token as published to the owner. */
typedef struct {
    int32_t id;
    float logprob;          /* log-softmax of the model's logits */
    size_t text_off;        /* where its text starts in the request's text */
    int32_t top_id[SCHED_MAX_TOP_LOGPROBS];
    float top_lp[SCHED_MAX_TOP_LOGPROBS];
} sched_token_t;

/* What has been published so far; valid inside the sched_drain callback and
 * afterwards until the next sched_drain (the text and tokens below n_* are
 * never rewritten). */
typedef struct {
    const char *text;       /* generated text that may be sent (stop strings cut) */
    size_t text_len;
    const sched_token_t *tokens;
    int n_tokens;           /* generated tokens (those with logprobs records) */
    int n_prompt, n_gen;
    int n_cached;           /* prompt tokens served by the prefix cache */
    sched_finish_t finish;
    int stop_index;
    const char *error;
    double ttft_s;          /* seconds from submit to the first token (0: none yet) */
    /* finished, and no later sched_drain call will name this request again
     * (a call can already see the final state while another is queued):
     * the owner may drop what it keeps for it */
    bool last;
} sched_view_t;

typedef struct {
    int running, waiting;
    int kv_blocks;              /* the pool: blocks of MODEL_KV_BLOCK tokens */
    int kv_blocks_used;         /* referenced by requests */
    int kv_blocks_cached;       /* unreferenced, kept for the prefix cache */
    size_t kv_bytes, kv_block_bytes;
    const char *kv_type;        /* "f16", "bf16", "f32" */
    uint64_t kv_evictions;      /* cached blocks reused for others */
    uint64_t steps, prompt_tokens, gen_tokens, preemptions;
    uint64_t prefill_slices;    /* model calls that ran part of a chunk's layers */
    /* after preemptions: generated tokens re-fed, and the (request, step)
     * pairs that re-fed them (tokens / steps: how many a step recomputes) */
    uint64_t recomputed_tokens, recompute_steps;
    uint64_t prefix_hit_tokens, prefix_lookup_tokens; /* cached / looked-up prompt tokens */
    /* histogram buckets (cumulative counts written by sched_stats) */
    uint64_t ttft_count, tbt_count;
    double ttft_sum, tbt_sum;
    uint64_t ttft_bucket[12], tbt_bucket[12];
} sched_stats_t;
/* Upper bounds (seconds) of the histogram buckets above. */
extern const double sched_hist_bounds[12];

ecs_err_t sched_new(model_t *m, const tok_t *tok, const sched_opts_t *o, sched_t **out);
/* Sets (or replaces, before sched_start) the notify hook of the options. */
void sched_set_notify(sched_t *s, void (*notify)(void *arg), void *arg);
/* Starts the scheduler thread; a warm-up step there grows its scratch. */
ecs_err_t sched_start(sched_t *s);
/* Cancels everything, joins the thread. */
void sched_stop(sched_t *s);
void sched_free(sched_t *s);

int sched_n_ctx(const sched_t *s);

/* Queues a request. ECS_ERR_NOMEM when max_queue requests already wait,
 * ECS_ERR_RANGE when the prompt does not fit the context. The request holds
 * two references: the caller's (sched_release) and the scheduler's. */
ecs_err_t sched_submit(sched_t *s, sched_params_t *p, void *user, sched_req_t **out);
/* Stops a request at its next step and frees its blocks; idempotent. */
void sched_cancel(sched_t *s, sched_req_t *r);
void sched_release(sched_req_t *r);
void *sched_req_user(const sched_req_t *r);
/* Calls fn for each request with unseen progress (the caller's thread). */
void sched_drain(sched_t *s, void (*fn)(void *arg, sched_req_t *r), void *arg);
sched_view_t sched_req_view(sched_req_t *r);

void sched_stats(sched_t *s, sched_stats_t *out);

/* The prefix cache on disk: save (after sched_stop) writes every published
 * KV block to DIR/kv-blocks.ecs; load (after sched_start, before the first
 * request) reads back into free blocks those made for this model (a whole
 * file of another model counts as one skipped, so does each damaged
 * record). Counts are blocks; tokens = blocks x MODEL_KV_BLOCK. */
ecs_err_t sched_cache_save(sched_t *s, const char *dir, int *n_saved, long *n_tokens);
ecs_err_t sched_cache_load(sched_t *s, const char *dir, int *n_loaded, int *n_skipped, long *n_tokens);

#endif
