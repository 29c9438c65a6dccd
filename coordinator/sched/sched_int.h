/* sched_int.h - the scheduler's private state, shared by sched.c (the
 * interface other threads call) and step.c (the scheduler thread). */
#ifndef ECS_SCHED_INT_H
#define ECS_SCHED_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "coordinator/kvcache/kvcache.h"
#include "sched.h"

struct sched_req {
    atomic_int refs;
    atomic_bool cancel;
    sched_t *s;
    void *user;
    sched_params_t p;
    /* scheduler thread only */
    struct sched_req *next;   /* wait queue (under s->mu), then running list */
    int slot;                 /* its sequence (s->ctxs), -1: none */
    model_ctx_t *ctx;
    int n_blk;                /* KV blocks it holds (the table's first entries) */
    int n_pub;                /* leading blocks whose prefix-cache keys are known */
    uint64_t pub_key;         /* key of block n_pub - 1 (the seed when none) */
    int n_fed;                /* prompt tokens evaluated (or taken from the cache) */
    int n_cached;             /* prompt tokens taken from the prefix cache (first admission) */
    int n_start;              /* this admission's cached prompt tokens (chunks cut the rest) */
    int chunk_i, n_chunks;
    bool decoding;
    bool admitted_once;
    int replay, replay_end;   /* after a preemption: generated tokens re-fed so far, of */
    int step_rows;            /* rows in the step being built */
    int32_t next_tok;
    int32_t *gen;             /* generated ids [max_tokens] (recomputation re-feeds them) */
    sampler_t *smp;
    sampler_stops_t *stops;
    tok_decoder_t dec;
    char *text;
    size_t text_cap, text_len, emit_end;
    sched_token_t *toks;
    int n_gen;
    double t_submit, t_last;
    /* published, under s->mu */
    size_t pub_text;
    int pub_gen, pub_gen_toks;
    sched_finish_t pub_finish;
    int stop_index;
    double ttft;
    char error[256];
    bool pending;
    struct sched_req *next_ready;
};

/* A logits row's sampling, done in parallel over a step's rows (step.c):
 * it touches only its own request's sampler and this record. */
typedef struct sched_pick {
    struct sched_req *r;
    float *l;           /* the row (penalties are applied to it in place) */
    sched_token_t rec;  /* logprobs, where the request asked for them */
    int32_t id;
    bool failed;
    char msg[200];      /* why, when it failed */
} sched_pick_t;

#define SCHED_DEC_RING 9
#define SCHED_UNIT_KINDS 5 /* step.c's kinds of work in a slice */

struct sched {
    model_t *m;
    const tok_t *tok;
    sched_opts_t o;
    int n_vocab;
    /* kv.c: the block pool, its bookkeeping and the prefix cache */
    model_kvpool_t *pool;
    kvc_t *kvc;
    int n_blocks;
    size_t block_bytes;
    int32_t *blk_toks;        /* [n_blocks][MODEL_KV_BLOCK] tokens of published blocks */
    uint64_t *blk_parent;     /* [n_blocks] key of the block before a published one */
    uint64_t seed;            /* the model's identity: root of every key chain */
    bool mla;
    model_ctx_t **ctxs;       /* [max_running] sequences, free ones on ctx_free */
    int *ctx_free, n_ctx_free;
    float *logits;            /* n_slots rows of n_vocab */
    /* per pool thread, a copy of the row it is sampling (the logprob of
     * the chosen token is read from the row as the model gave it) */
    float *lp_rows;           /* [pool threads][n_vocab] */
    struct sched_pick *picks; /* [max_running]: each logits row's token */
    model_row_t *rows;
    sched_req_t **row_req;
    /* layer-sliced prefill (step.c): the request whose chunk is part way
     * through the model, its next unit (model_slice_units: half layers), its
     * residual rows [chunk][n_embd]; the time (seconds) of a recent
     * decode-only step, and per kind of unit (step.c, unit_kind) the
     * recent seconds per unit of work (unit_work: rows, times keys for an
     * attention half), so that a unit deep into a prompt is predicted
     * from shallower ones */
    sched_req_t *slicing;
    int slice_u, n_units;
    float *slice_resid;
    double t_dec, c_unit[SCHED_UNIT_KINDS];
    /* the last decode-only steps' times (t_dec: their median, so that one
     * step slowed by the host does not stretch the next slices) */
    double dec_ring[SCHED_DEC_RING];
    int dec_n, dec_i; /* how many are there (up to the ring), the next one's place */
    bool slice_log; /* ECS_SLICE_LOG set: each slice and step, rows and times, on stderr */
    sched_req_t *running, *running_tail; /* scheduler thread only */
    int n_running;
    pthread_t thread;
    bool started, inited;
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit, warm, warm_err, notify_due;
    char warm_msg[256];
    sched_req_t *wait_head, *wait_tail;
    int n_waiting, n_running_pub;
    sched_req_t *ready_head, *ready_tail;
    sched_stats_t stats;
};

double sched_now(void);
/* kv.c */
ecs_err_t sched_kv_init(sched_t *s);
void sched_kv_free(sched_t *s);
/* Blocks a context of n tokens needs. */
int sched_blocks_for(int n);
/* Gives r a sequence and its longest cached prefix (full blocks), and cuts
 * the rest of its prompt into chunks; false (nothing taken) when no
 * sequence is free or the blocks of its first chunk are not available. */
bool sched_kv_admit(sched_t *s, sched_req_t *r);
/* Makes r's blocks hold positions [0, upto); false when the pool cannot. */
bool sched_kv_reserve(sched_t *s, sched_req_t *r, int upto);
/* Every block of r comes back (cached if published), its sequence too. */
void sched_kv_release(sched_t *s, sched_req_t *r);
/* Publishes r's full blocks that a later prompt may reuse. */
void sched_kv_publish(sched_t *s, sched_req_t *r);
/* Token at position p of r's sequence (prompt, then generated). */
int32_t sched_req_token(const sched_req_t *r, int p);
void *sched_main(void *arg);

/* kvfile.c: the prefix cache's file format (persist.c keeps the pool's
 * blocks in it; tests/fuzz/fuzz_kvblocks.c feeds it any bytes) */
typedef struct {
    uint64_t seed;        /* the model identity every key chains from */
    size_t block_bytes;   /* one block's rows */
    uint32_t kv_type;     /* their element type (sched_opts_t.kv_flag) */
    int n_vocab;          /* token ids are below it */
} sched_kvfile_id_t;
typedef struct {
    uint64_t key, parent;
    int32_t toks[MODEL_KV_BLOCK];
    void *data;           /* block_bytes of rows */
} sched_kvrec_t;
/* Fills record i (its rows into rec->data, the caller's buffer). */
typedef void (*sched_kvfile_get_fn)(void *arg, int i, sched_kvrec_t *rec);
/* Takes a sound record: 1 kept, 0 not (counted skipped), -1 no room (the
 * reading stops). */
typedef int (*sched_kvfile_put_fn)(void *arg, const sched_kvrec_t *rec);
/* Header and n records got by get (data: block_bytes of scratch); false
 * on a write error. */
bool sched_kvfile_write(FILE *f, const sched_kvfile_id_t *id, int n, sched_kvfile_get_fn get,
                        void *arg, void *data);
/* Every sound record of f for id through put (see kvfile.c for what is
 * skipped); an error only when one block's rows cannot be allocated. */
ecs_err_t sched_kvfile_read(FILE *f, const sched_kvfile_id_t *id, sched_kvfile_put_fn put, void *arg,
                            int *n_loaded, int *n_skipped);
void sched_mark_ready_locked(sched_t *s, sched_req_t *r);
void sched_note_token_locked(sched_t *s, sched_req_t *r, double now);

#endif
