/* sched_int.h - the scheduler's private state, shared by sched.c (the
 * interface other threads call) and step.c (the scheduler thread). */
#ifndef ECS_SCHED_INT_H
#define ECS_SCHED_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "sched.h"

struct sched_req {
    atomic_int refs;
    atomic_bool cancel;
    sched_t *s;
    void *user;
    sched_params_t p;
    /* scheduler thread only */
    struct sched_req *next;   /* wait queue (under s->mu), then running list */
    int slot;
    int n_fed;                /* prompt tokens evaluated (or taken from the cache) */
    int n_cached;             /* prompt tokens taken from the prefix cache */
    int chunk_i, n_chunks;
    bool decoding;
    int32_t next_tok;
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

struct sched {
    model_t *m;
    const tok_t *tok;
    sched_opts_t o;
    int n_vocab;
    int n_slots;
    size_t slot_bytes;
    model_ctx_t **slots;
    int n_free;
    /* slots.c: the tokens each slot holds, how many of them may be reused
     * (slot_exp), when it was last released, whether a request holds it */
    int32_t **slot_toks;
    int *slot_n, *slot_exp;
    uint64_t *slot_used, tick;
    bool *slot_busy;
    bool mla;
    float *logits;            /* n_slots rows of n_vocab */
    float *lp_row;            /* one row kept for logprobs */
    model_row_t *rows;
    sched_req_t **row_req;
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
ecs_err_t sched_slots_init(sched_t *s);
void sched_slots_free(sched_t *s);
/* Gives r the free slot with the longest usable cached prefix (else the
 * least recently used one) and starts r's prompt after that prefix. */
void sched_slot_take(sched_t *s, sched_req_t *r);
/* r's slot becomes free; keep: its rows stay cached for later prefixes. */
void sched_slot_give_back(sched_t *s, sched_req_t *r, bool keep);
void *sched_main(void *arg);
void sched_mark_ready_locked(sched_t *s, sched_req_t *r);
void sched_note_token_locked(sched_t *s, sched_req_t *r, double now);

#endif
