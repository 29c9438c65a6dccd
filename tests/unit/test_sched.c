/* test_sched.c - the scheduler's layer-sliced prefill: a request's tokens
 * and log-probabilities (bits of its logits) are the same whether its
 * prompt chunks run through every layer in one step or a slice of layers
 * per step beside another request's decode rows, on both architectures;
 * slices are counted; a request cancelled while its chunk is part way
 * through the layers gives every KV block back. A prompt alone runs in
 * chunks of idle_chunk rows (fewer steps, the same bits), and the rest of
 * it is cut again for slicing when a stream starts decoding. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/sched/sched.h"

#define DS2_Q8 "../shared/models/tiny-ds2-q8_0.gguf"
#define QWEN_Q8 "../shared/models/tiny-qwen3moe-q8_0.gguf"
#define N_CTX 1024
#define N_LONG 300  /* the long prompt: 2 chunks of 150 rows, 3 of 100 sliced */
#define N_SHORT 10  /* the stream's prompt */
#define GEN_LONG 8
#define GEN_SHORT 40

typedef struct {
    sched_req_t *r;
    sched_token_t toks[GEN_SHORT];
    int n;
    sched_finish_t finish;
    bool last;
} seen_t;

typedef struct {
    seen_t *req;
    int n;
} seen_set_t;

static void on_update(void *arg, sched_req_t *r)
{
    seen_set_t *set = arg;
    for (int i = 0; i < set->n; i++) {
        seen_t *q = &set->req[i];
        if (q->r != r)
            continue;
        sched_view_t v = sched_req_view(r);
        cr_assert_leq(v.n_tokens, GEN_SHORT);
        memcpy(q->toks, v.tokens, (size_t)v.n_tokens * sizeof *v.tokens);
        q->n = v.n_tokens;
        q->finish = v.finish;
        q->last |= v.last;
    }
}

typedef struct {
    model_t *m;
    tok_t *tok;
    sched_t *s;
} rig_t;

/* slice_units > 0: every chunk in slices of that many layers (expand >
 * 0: a deepseek2 attention unit's expansion of earlier positions ahead of
 * it in parts of that many positions); 0: by budget (the server's
 * default), 0 and budget 0: off. */
static rig_t rig_idle(const char *path, int slice_units, int expand, double budget,
                      int idle_chunk)
{
    rig_t g = {0};
    model_opts_t mo = {.n_ctx = N_CTX, .n_threads = 2};
    cr_assert_eq(model_load(path, &mo, &g.m), ECS_OK, "model_load(%s): %s", path, ecs_errmsg());
    cr_assert_eq(tok_load(model_gguf(g.m), &g.tok), ECS_OK, "%s", ecs_errmsg());
    sched_opts_t o = {.n_ctx = N_CTX, .max_running = 4, .max_queue = 8, .chunk = 256,
                      .prefix_cache = true, .slice_units = slice_units,
                      .slice_budget = budget, .slice_chunk = 128, .slice_expand = expand,
                      .idle_chunk = idle_chunk};
    cr_assert_eq(sched_new(g.m, g.tok, &o, &g.s), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(sched_start(g.s), ECS_OK, "%s", ecs_errmsg());
    return g;
}

static rig_t rig_opts(const char *path, int slice_units, int expand, double budget)
{
    return rig_idle(path, slice_units, expand, budget, 0);
}

static rig_t rig_budget(const char *path, int slice_units, double budget)
{
    return rig_opts(path, slice_units, 0, budget);
}

static rig_t rig(const char *path, int slice_units) { return rig_opts(path, slice_units, 0, 0); }

static void rig_free(rig_t *g)
{
    sched_free(g->s);
    tok_free(g->tok);
    model_free(g->m);
}

static sched_req_t *submit(rig_t *g, int n_prompt, int seed, int max_tokens)
{
    sched_params_t p = {.n_prompt = n_prompt, .max_tokens = max_tokens, .ignore_eos = true,
                        .sp = sampler_params_default(), .top_logprobs = 3};
    p.sp.temp = 0;
    p.prompt = malloc((size_t)n_prompt * sizeof *p.prompt);
    cr_assert(p.prompt);
    const uint32_t V = (uint32_t)model_n_vocab(g->m);
    for (int i = 0; i < n_prompt; i++)
        p.prompt[i] = (int32_t)(((uint32_t)(i + seed) * 7919u + 13u) % V);
    sched_req_t *r = NULL;
    cr_assert_eq(sched_submit(g->s, &p, NULL, &r), ECS_OK, "%s", ecs_errmsg());
    return r;
}

static void wait_all(rig_t *g, seen_set_t *set)
{
    for (;;) {
        sched_drain(g->s, on_update, set);
        bool done = true;
        for (int i = 0; i < set->n; i++)
            done &= set->req[i].last;
        if (done)
            return;
        usleep(1000);
    }
}

/* A stream with a short prompt (out[0]) and a long prompt of n_long rows
 * (out[1]), the stream submitted first unless long_first; the records of
 * both, the slices counted; the rig freed. */
static uint64_t run_pair(rig_t *g, bool long_first, int n_long, seen_t out[2])
{
    memset(out, 0, 2 * sizeof *out);
    for (int k = 0; k < 2; k++) {
        if ((k == 0) == long_first)
            out[1].r = submit(g, n_long, 2, GEN_LONG);
        else
            out[0].r = submit(g, N_SHORT, 1, GEN_SHORT);
    }
    seen_set_t set = {out, 2};
    wait_all(g, &set);
    sched_stats_t st;
    sched_stats(g->s, &st);
    cr_assert_eq(st.kv_blocks_used, 0, "%d KV blocks still used", st.kv_blocks_used);
    cr_assert_eq(st.prompt_tokens, (uint64_t)(N_SHORT + n_long));
    for (int i = 0; i < 2; i++)
        sched_release(out[i].r);
    rig_free(g);
    return st.prefill_slices;
}

/* A stream with a short prompt, then a long prompt while it decodes; the
 * records of both, and the slices counted (the model's units in *n_units). */
static uint64_t workload(const char *path, int slice_units, int expand, seen_t out[2],
                         int *n_units)
{
    rig_t g = rig_opts(path, slice_units, expand, 0);
    *n_units = model_slice_units(g.m);
    return run_pair(&g, false, N_LONG, out);
}

/* The same tokens and log-probabilities (bits) as whole. */
static void same_as(const seen_t whole[2], const seen_t sliced[2], int k, int expand)
{
    for (int i = 0; i < 2; i++) {
        const int want = i ? GEN_LONG : GEN_SHORT;
        cr_assert_eq(whole[i].n, want);
        cr_assert_eq(sliced[i].n, want, "request %d: %d tokens", i, sliced[i].n);
        cr_assert_eq(whole[i].finish, SCHED_FINISH_LENGTH);
        cr_assert_eq(sliced[i].finish, SCHED_FINISH_LENGTH);
        for (int t = 0; t < want; t++) {
            const sched_token_t *a = &whole[i].toks[t], *b = &sliced[i].toks[t];
            cr_assert_eq(a->id, b->id, "request %d token %d: %d vs %d sliced by %d (expand %d)",
                         i, t, a->id, b->id, k, expand);
            cr_assert(!memcmp(&a->logprob, &b->logprob, sizeof a->logprob) &&
                          !memcmp(a->top_lp, b->top_lp, sizeof a->top_lp) &&
                          !memcmp(a->top_id, b->top_id, sizeof a->top_id),
                      "request %d token %d: log-probabilities differ (%.9g vs %.9g) sliced "
                      "by %d (expand %d)", i, t, a->logprob, b->logprob, k, expand);
        }
    }
}

static void same_records(const char *path, bool mla)
{
    seen_t whole[2], sliced[2];
    int nu = 0;
    /* whole: the long prompt in 2 chunks of 150 rows (--chunk 256) */
    cr_assert_eq(workload(path, 0, 0, whole, &nu), 0, "slices counted with slicing off");
    for (int k = 1; k <= 3; k += 2) { /* units per slice: every cut; mixed cuts */
        const uint64_t n = workload(path, k, 0, sliced, &nu);
        /* sliced: the short prompt's chunk and the long one's 3 of 100
         * rows (slice_chunk 128), each in ceil(units / k) slices */
        const uint64_t want_n = (uint64_t)(1 + 3) * (uint64_t)((nu + k - 1) / k);
        cr_assert_eq(n, want_n, "%llu slices with %d units per slice, want %llu",
                     (unsigned long long)n, k, (unsigned long long)want_n);
        same_as(whole, sliced, k, 0);
    }
    /* one unit a slice, each deepseek2 attention unit's expansion of the
     * earlier positions ahead of it in parts of 37 (cut inside the
     * expansion's blocks): the long prompt's chunks 2 and 3 (at 100 and
     * 200 earlier positions) in 3 and 6 parts before each attention unit
     * (the last layer's only for the final chunk's logits row), a slice
     * each; the short prompt's chunk and the first one have none */
    const int x = 37, n_layer = (nu + 1) / 2;
    const uint64_t n = workload(path, 1, x, sliced, &nu);
    const uint64_t parts = !mla ? 0 : (uint64_t)(n_layer - 1) * 3 + (uint64_t)n_layer * 6;
    cr_assert_eq(n, (uint64_t)(1 + 3) * (uint64_t)nu + parts,
                 "%llu slices with expansion parts of %d, want %llu", (unsigned long long)n, x,
                 (unsigned long long)((1 + 3) * nu + parts));
    same_as(whole, sliced, 1, x);
}

Test(sched_slice, ds2_same_bits) { same_records(DS2_Q8, true); }
Test(sched_slice, qwen3moe_same_bits) { same_records(QWEN_Q8, false); }

/* Cancelled once its first slice ran (most likely part way through its
 * chunks; wherever it is, every block comes back). */
Test(sched_slice, cancel_frees_blocks)
{
    rig_t g = rig(DS2_Q8, 1);
    seen_t q[1] = {{0}};
    q[0].r = submit(&g, 900, 3, GEN_SHORT);
    sched_stats_t st;
    do {
        usleep(200);
        sched_stats(g.s, &st);
    } while (st.prefill_slices == 0);
    sched_cancel(g.s, q[0].r);
    seen_set_t set = {q, 1};
    wait_all(&g, &set);
    cr_assert_eq(q[0].finish, SCHED_FINISH_CANCELLED);
    sched_stats(g.s, &st);
    cr_assert_eq(st.kv_blocks_used, 0, "%d KV blocks still used", st.kv_blocks_used);
    cr_assert_lt(st.prompt_tokens, 900, "the prompt was computed before the cancel");
    sched_release(q[0].r);
    rig_free(&g);
}

/* By budget (slice_units 0), while a stream decodes: a prompt of one chunk
 * joins the decode batch whole (no slice), a prompt of several chunks runs
 * in slices; every block comes back. The stream is long (its tokens not
 * recorded) and cancelled at the end. */
/* on_update without the tokens (the stream outgrows seen_t.toks). */
static void on_progress(void *arg, sched_req_t *r)
{
    seen_set_t *set = arg;
    for (int i = 0; i < set->n; i++)
        if (set->req[i].r == r) {
            const sched_view_t v = sched_req_view(r);
            set->req[i].n = v.n_tokens;
            set->req[i].last |= v.last;
        }
}

/* Drains until request i is done or, with min_tokens, has that many. */
static void wait_progress(rig_t *g, seen_set_t *set, int i, int min_tokens)
{
    while (!set->req[i].last && !(min_tokens && set->req[i].n >= min_tokens)) {
        sched_drain(g->s, on_progress, set);
        usleep(1000);
    }
}

Test(sched_slice, budget_slices_only_prompts_of_several_chunks)
{
    rig_t g = rig_budget(DS2_Q8, 0, 2.5);
    seen_t q[3] = {{0}}; /* the stream, a one-chunk prompt, a three-chunk one */
    seen_set_t set = {q, 3};
    q[0].r = submit(&g, N_SHORT, 1, N_CTX - N_SHORT - 8);
    wait_progress(&g, &set, 0, 2); /* the stream decodes */
    q[1].r = submit(&g, 100, 4, GEN_LONG); /* one chunk (--chunk 256) */
    wait_progress(&g, &set, 1, 0);
    cr_assert(!q[0].last, "the stream ended before the test could use it");
    sched_stats_t st;
    sched_stats(g.s, &st);
    cr_assert_eq(st.prefill_slices, 0, "a one-chunk prompt ran in %llu slices",
                 (unsigned long long)st.prefill_slices);
    q[2].r = submit(&g, N_LONG, 5, GEN_LONG);
    wait_progress(&g, &set, 2, 0);
    cr_assert(!q[0].last, "the stream ended before the test could use it");
    sched_stats(g.s, &st);
    cr_assert_gt(st.prefill_slices, 0, "a prompt of three chunks beside a stream was not sliced");
    cr_assert_eq(q[1].n, GEN_LONG);
    cr_assert_eq(q[2].n, GEN_LONG);
    sched_cancel(g.s, q[0].r);
    wait_progress(&g, &set, 0, 0);
    sched_stats(g.s, &st);
    cr_assert_eq(st.kv_blocks_used, 0, "%d KV blocks still used", st.kv_blocks_used);
    for (int i = 0; i < 3; i++)
        sched_release(q[i].r);
    rig_free(&g);
}

/* A prompt alone, in chunks of idle_chunk rows: N_IDLE rows take 3 steps
 * of 400 (idle_chunk 400) instead of 4 of 256 (--chunk), the same bits. */
#define N_IDLE 900
static void idle_steps(const char *path)
{
    seen_t q[2][1];
    uint64_t prompt_steps[2];
    for (int k = 0; k < 2; k++) {
        rig_t g = rig_idle(path, 0, 0, 0, k ? 400 : 0);
        sched_stats_t st0, st;
        sched_stats(g.s, &st0);
        memset(q[k], 0, sizeof q[k]);
        q[k][0].r = submit(&g, N_IDLE, 6, GEN_LONG);
        seen_set_t set = {q[k], 1};
        wait_all(&g, &set);
        sched_stats(g.s, &st);
        cr_assert_eq(q[k][0].n, GEN_LONG);
        cr_assert_eq(st.kv_blocks_used, 0, "%d KV blocks still used", st.kv_blocks_used);
        /* the first token comes with the prompt's last chunk */
        prompt_steps[k] = st.steps - st0.steps - (GEN_LONG - 1);
        sched_release(q[k][0].r);
        rig_free(&g);
    }
    cr_assert_eq(prompt_steps[0], 4, "%llu steps for the prompt in chunks of 256",
                 (unsigned long long)prompt_steps[0]);
    cr_assert_eq(prompt_steps[1], 3, "%llu steps for the prompt in chunks of 400",
                 (unsigned long long)prompt_steps[1]);
    for (int t = 0; t < GEN_LONG; t++) {
        const sched_token_t *a = &q[0][0].toks[t], *b = &q[1][0].toks[t];
        cr_assert(a->id == b->id && !memcmp(&a->logprob, &b->logprob, sizeof a->logprob) &&
                      !memcmp(a->top_lp, b->top_lp, sizeof a->top_lp),
                  "token %d: %d (%.9g) in chunks of 256, %d (%.9g) in chunks of 400", t, a->id,
                  a->logprob, b->id, b->logprob);
    }
}

Test(sched_idle, ds2_fewer_steps_same_bits) { idle_steps(DS2_Q8); }
Test(sched_idle, qwen3moe_fewer_steps_same_bits) { idle_steps(QWEN_Q8); }

/* The long prompt first, alone (cut in chunks of idle_chunk 400, longer
 * than a slice's residual buffer of --chunk rows), then a stream: once it
 * decodes, the rest of the prompt is cut again (chunks of 128) and runs in
 * slices beside it. The same bits as both whole with slicing off. */
static void recut_for_stream(const char *path)
{
    seen_t whole[2], cut[2];
    rig_t g = rig(path, 0);
    const uint64_t plain = run_pair(&g, true, N_IDLE, whole);
    g = rig_idle(path, 0, 0, 2.5, 400);
    const uint64_t sliced = run_pair(&g, true, N_IDLE, cut);
    cr_assert_eq(plain, 0, "slices counted with slicing off");
    cr_assert_gt(sliced, 0, "the prompt's rest did not run in slices beside the stream");
    same_as(whole, cut, 0, 0);
}

Test(sched_idle, ds2_recut_when_a_stream_decodes) { recut_for_stream(DS2_Q8); }
Test(sched_idle, qwen3moe_recut_when_a_stream_decodes) { recut_for_stream(QWEN_Q8); }
