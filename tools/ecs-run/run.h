/* run.h - what the files of ecs-run share: the parsed command line and
 * small helpers (main.c), the benchmark (bench.c), the output side: signals,
 * --dump-logits files written whole or not at all, prompts from files
 * (out.c). */
#ifndef ECS_RUN_H
#define ECS_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "coordinator/dispatch/dispatch.h"
#include "coordinator/model/model.h"
#include "coordinator/sampler/sampler.h"

#define MAX_TOKENS_ARG (1 << 20)
#define MAX_TOP 4096

typedef struct {
    const char *model, *prompt, *prompt_file, *tokens, *dump, *logits_of;
    int n_predict, threads, ctx, top, pp, tg, reps, step;
    int tg_batch; /* --bench: sequences decoded together (0, 1: none) */
    bool chat, tokenize, ignore_eos, expanded, absorbed, bench, seed_given, profile;
    int chat_template; /* tok_chat_kind_t; TOK_CHAT_NONE: the model's */
    model_cli_t mcli; /* --kv-type, --kv-f32, --repack, --no-repack, --no-amx */
    bool print_placement;
    int attn_split; /* model_opts_t.attn_split_min */
    sampler_params_t sp;
    dispatch_opts_t dispatch;
} args_t;

/* main.c */
int run_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double run_now_s(void);
unsigned run_ctx_flags(const args_t *a);

/* bench.c: --bench (d: the dispatcher when the experts run on workers, else NULL) */
int run_bench(model_t *m, model_ctx_t *c, const args_t *a, const dispatch_t *d);

/* out.c */
/* SIGINT / SIGTERM set a flag (no SA_RESTART) instead of killing the
 * process, so that loops stop between steps and clean up; run_stopped()
 * is the signal number, 0 while none came. */
void run_catch_signals(void);
int run_stopped(void);
/* Reads a whole prompt file ("-" = standard input) into a malloc'd
 * NUL-terminated string. 0 or run_fail()'s 1. */
int run_read_prompt(const char *path, char **out);
/* An output file that appears complete or not at all: a regular (or new)
 * path is written under a temporary name in its directory and renamed by
 * run_out_commit; other paths (devices, FIFOs) are written directly. */
typedef struct {
    FILE *f;
    const char *path;
    char tmp[4096]; /* "" when written directly */
} run_out_t;
int run_out_open(run_out_t *o, const char *path);
/* Flushes, checks every write and renames; 0 or 1 (with a message). */
int run_out_commit(run_out_t *o);
/* Closes and removes the temporary file (after a failure or a signal). */
void run_out_abort(run_out_t *o);
/* Checks standard output's writes and final flush: 0 or 1 with a message. */
int run_stdout_check(void);
/* A closed standard output (fd 1): 1 with a message when the mode writes
 * to it (needed), else /dev/null is put there, so that no file opened
 * later takes fd 1 and receives stray output. */
int run_guard_stdout(bool needed);

#endif
