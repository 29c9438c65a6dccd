/* ecs-run - run a model from the command line: generate text from a prompt
 * (streamed as it is decoded, speeds on stderr), evaluate a token sequence
 * and dump per-position top logits as JSON (teacher forcing, for comparing
 * against other engines), print a prompt's token ids, or benchmark prompt
 * processing and decoding (--bench). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cli.h"
#include "common/threadpool.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tools/ecs-run/run.h"
#include "common/mem.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ecs-run -m MODEL.gguf (-p PROMPT | -f FILE | --tokens ID,ID,...) [options]\n"
            "       ecs-run -m MODEL.gguf --bench [--pp N] [--tg N] [--tg-batch N] [--reps R] [options]\n"
            "  -f FILE            read the prompt from FILE (- : standard input)\n"
            "  -n N               tokens to generate (default 64)\n"
            "  --chat             wrap the prompt in the model's chat template\n"
            "  --chat-template NAME  --chat with a built-in template instead of the model's:\n"
            "                     deepseek2, deepseek3 or chatml\n"
            "  --threads N        compute threads, 1..%d (default: all CPUs)\n"
            "  --ctx N            context size (default: min(trained, 4096))\n"
            "  --temp T           temperature (default 0.8; 0 = greedy)\n"
            "  --top-k K          (default 40)   --top-p P (default 0.95)   --min-p P (default 0.05)\n"
            "  --seed S           sampling seed (default: time)\n"
            "  --ignore-eos       keep generating after an end-of-generation token\n"
            "  --tokenize         print the prompt's token ids as a JSON array and exit\n"
            "  --dump-logits FILE evaluate the tokens (teacher forcing) and write each\n"
            "                     position's top logits as JSON (whole or not at all: a\n"
            "                     temporary file renamed when complete)\n"
            "  --top K            entries per position in --dump-logits (default 5)\n"
            "  --logits-of IDS    also dump the logits of these ids at every position\n"
            "  --step N           --dump-logits evaluates N tokens per step (default: as\n"
            "                     many as a step takes; 1: every token a decode step)\n"
            "  --mla-expanded     deepseek2: cache expanded K/V (reference path)\n"
            "  --mla-absorbed     deepseek2: absorbed attention for prompt steps too\n"
            "  --kv-type T        KV cache type: f16 (default, llama.cpp's), bf16 (attention\n"
            "                     with AVX-512 BF16 where the CPU has it), f32 (exact), q8\n"
            "                     (deepseek2: half the bytes, decode attention on VNNI;\n"
            "                     less precise)\n"
            "  --kv-f32           --kv-type f32 (exact attention, for references)\n"
            "  --attn-split N     deepseek2 decode: split attention by keys from depth N\n"
            "                     on (default 512; -1: never)\n"
            "  --no-amx           deepseek2 decode at depth with a BF16 cache: the vector\n"
            "                     kernels instead of the tile unit (AMX-BF16), to compare\n"
            "  --repack DIR       where the decode copy of the weights is cached (default:\n"
            "                     $ECS_CACHE_DIR, else $XDG_CACHE_HOME/ecs, else ~/.cache/ecs);\n"
            "                     made on first use: a copy of the Q4_K, Q5_0, Q8_0 matrices\n"
            "  --no-repack        decode from the GGUF alone (same results, slower); also\n"
            "                     when the copy and the rest of the GGUF would not fit in 90 %% of\n"
            "                     the memory (ECS_REPACK_RAM=bytes: assume that much)\n"
            "  --bench            time prompt processing of --pp random tokens (default 512)\n"
            "                     and decoding of --tg tokens (default 64) from an empty\n"
            "                     context and after the prompt, after an untimed pass over\n"
            "                     the prompt; --reps R runs (default 1);\n"
            "                     prints tok/s, GB/s of weights per decoded token against\n"
            "                     the measured read bandwidth of the mapping, and RSS\n"
            "  --tg-batch N       with --bench: also decode --tg tokens in each of N\n"
            "                     sequences together, one step of N rows per token (as the\n"
            "                     server batches N streams): aggregate tok/s\n"
            "  --profile          with --bench: time per phase of the forward pass\n"
            "experts on workers (the results are the same bits):\n" DISPATCH_USAGE
            "  --print-placement  print which worker holds which experts\n"
            "exit status: 0 done, 1 error (a message on stderr, also when the output\n"
            "could not be written), 128+N after signal N (SIGINT, SIGTERM)\n",
            ECS_THREADPOOL_MAX);
}

int run_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ecs-run: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}

/* Parses "1,2,3" into a malloc'd array. */
static int parse_ids(const char *s, int32_t **out, int *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    if (cap > MAX_TOKENS_ARG)
        return run_fail("too many ids in '%.40s...'", s);
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return run_fail("out of memory");
    int k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return run_fail("bad token id list '%s'", s);
        }
        ids[k++] = (int32_t)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) {
            free(ids);
            return run_fail("bad token id list '%s'", s);
        }
    }
    if (k == 0) {
        free(ids);
        return run_fail("empty token id list");
    }
    *out = ids;
    *n = k;
    return 0;
}

static bool takes_value(const char *o)
{
    static const char *const opts[] = {"-m", "-p", "-f", "-n", "--tokens", "--dump-logits",
                                       "--logits-of", "--threads", "--ctx", "--top", "--top-k",
                                       "--seed", "--temp", "--top-p", "--min-p", "--pp", "--tg", "--tg-batch",
                                       "--reps", "--step", "--attn-split", "--chat-template"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (!strcmp(o, opts[i]))
            return true;
    return dispatch_opt_takes_value(o) || model_cli_takes_value(o);
}

static int parse_args(int argc, char **argv, args_t *a)
{
    *a = (args_t){.n_predict = 64, .top = 5, .pp = 512, .tg = 64, .reps = 1};
    a->sp = sampler_params_default();
    a->sp.temp = 0.8f;
    a->sp.top_k = 40;
    a->sp.top_p = 0.95f;
    a->sp.min_p = 0.05f;
    a->sp.seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(o, "--chat")) { a->chat = true; continue; }
        if (!strcmp(o, "--tokenize")) { a->tokenize = true; continue; }
        if (!strcmp(o, "--ignore-eos")) { a->ignore_eos = true; continue; }
        if (!strcmp(o, "--mla-expanded")) { a->expanded = true; continue; }
        if (!strcmp(o, "--mla-absorbed")) { a->absorbed = true; continue; }
        if (!strcmp(o, "--bench")) { a->bench = true; continue; }
        if (!strcmp(o, "--profile")) { a->profile = true; continue; }
        if (!strcmp(o, "--print-placement")) { a->print_placement = true; continue; }
        if (model_cli_flag(&a->mcli, o))
            continue;
        if (!takes_value(o))
            return run_fail("unknown option %s (see --help)", o);
        if (i + 1 >= argc)
            return run_fail("%s needs a value", o);
        const char *v = argv[++i];
        long l;
        float f;
        const int dr = dispatch_parse_opt(&a->dispatch, o, v);
        const int mr = dr ? 0 : model_cli_opt(&a->mcli, o, v);
        if (dr < 0 || mr < 0)
            return run_fail("%s", ecs_errmsg());
        if (dr > 0 || mr > 0)
            continue;
        if (!strcmp(o, "-m")) a->model = v;
        else if (!strcmp(o, "-p")) a->prompt = v;
        else if (!strcmp(o, "-f")) a->prompt_file = v;
        else if (!strcmp(o, "--tokens")) a->tokens = v;
        else if (!strcmp(o, "--dump-logits")) a->dump = v;
        else if (!strcmp(o, "--logits-of")) a->logits_of = v;
        else if (!strcmp(o, "--chat-template")) {
            if ((a->chat_template = tok_chat_by_name(v)) == TOK_CHAT_UNKNOWN)
                return run_fail("--chat-template: bad value '%s' (expected deepseek2, deepseek3 "
                                "or chatml)", v);
            a->chat = true;
        } else if (!strcmp(o, "-n")) {
            if (!ecs_parse_long(v, 0, MODEL_MAX_CTX, &l)) return run_fail("-n: bad count '%s'", v);
            a->n_predict = (int)l;
        } else if (!strcmp(o, "--threads")) {
            if (!ecs_parse_long(v, 1, ECS_THREADPOOL_MAX, &l))
                return run_fail("--threads: bad count '%s' (1..%d)", v, ECS_THREADPOOL_MAX);
            a->threads = (int)l;
        } else if (!strcmp(o, "--ctx")) {
            if (!ecs_parse_long(v, 1, MODEL_MAX_CTX, &l)) return run_fail("--ctx: bad size '%s'", v);
            a->ctx = (int)l;
        } else if (!strcmp(o, "--pp") || !strcmp(o, "--tg")) {
            if (!ecs_parse_long(v, 0, MODEL_MAX_CTX, &l)) return run_fail("%s: bad count '%s'", o, v);
            *(o[3] == 'p' ? &a->pp : &a->tg) = (int)l;
        } else if (!strcmp(o, "--tg-batch")) {
            if (!ecs_parse_long(v, 1, MODEL_MAX_BATCH, &l))
                return run_fail("--tg-batch: bad count '%s' (1..%d)", v, MODEL_MAX_BATCH);
            a->tg_batch = (int)l;
        } else if (!strcmp(o, "--step")) {
            if (!ecs_parse_long(v, 1, MODEL_MAX_BATCH, &l)) return run_fail("--step: bad count '%s'", v);
            a->step = (int)l;
        } else if (!strcmp(o, "--attn-split")) {
            if (!ecs_parse_long(v, -1, MODEL_MAX_CTX, &l))
                return run_fail("--attn-split: bad depth '%s'", v);
            a->attn_split = (int)l;
        } else if (!strcmp(o, "--reps")) {
            if (!ecs_parse_long(v, 1, 1000, &l)) return run_fail("--reps: bad count '%s'", v);
            a->reps = (int)l;
        } else if (!strcmp(o, "--top")) {
            if (!ecs_parse_long(v, 1, MAX_TOP, &l)) return run_fail("--top: bad count '%s'", v);
            a->top = (int)l;
        } else if (!strcmp(o, "--top-k")) {
            if (!ecs_parse_long(v, 0, INT32_MAX, &l)) return run_fail("--top-k: bad value '%s'", v);
            a->sp.top_k = (int32_t)l;
        } else if (!strcmp(o, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') return run_fail("--seed: bad value '%s'", v);
            a->sp.seed = s;
            a->seed_given = true;
        } else if (!strcmp(o, "--temp")) {
            if (!ecs_parse_float(v, &f)) return run_fail("--temp: bad value '%s'", v);
            a->sp.temp = f;
        } else if (!strcmp(o, "--top-p")) {
            if (!ecs_parse_float(v, &f)) return run_fail("--top-p: bad value '%s'", v);
            a->sp.top_p = f;
        } else if (!strcmp(o, "--min-p")) {
            if (!ecs_parse_float(v, &f)) return run_fail("--min-p: bad value '%s'", v);
            a->sp.min_p = f;
        } else {
            return run_fail("unknown option %s (see --help)", o);
        }
    }
    if (!a->model)
        return run_fail("no model given (-m FILE)");
    if (a->tg_batch > 1 && !a->bench)
        return run_fail("--tg-batch needs --bench");
    if (a->bench) {
        if (a->tg_batch > 1 && a->tg == 0)
            return run_fail("--tg-batch needs --tg above 0");
        if (a->prompt || a->prompt_file || a->tokens || a->dump || a->tokenize)
            return run_fail("--bench makes its own random tokens: no -p, -f, --tokens, --dump-logits");
        if (a->pp + a->tg == 0)
            return run_fail("--bench needs --pp or --tg above 0");
        return 0;
    }
    if (!!a->prompt + !!a->prompt_file + !!a->tokens != 1)
        return run_fail("give exactly one of -p PROMPT, -f FILE and --tokens IDS");
    if (a->tokenize && a->tokens)
        return run_fail("--tokenize needs -p PROMPT or -f FILE");
    if (a->logits_of && !a->dump)
        return run_fail("--logits-of needs --dump-logits");
    if (a->step && !a->dump)
        return run_fail("--step needs --dump-logits");
    if (sampler_params_check(&a->sp) != ECS_OK)
        return run_fail("%s", ecs_errmsg());
    return 0;
}

double run_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The prompt's ids (chat-formatted when asked). */
static int encode_prompt(const tok_t *tok, const args_t *a, arch_id_t arch, int32_t **ids,
                         int *n)
{
    const char *text = a->prompt;
    char *chat = NULL;
    if (a->chat) {
        tok_chat_msg_t msg = {"user", a->prompt};
        tok_chat_kind_t fb = arch == ARCH_QWEN3MOE ? TOK_CHAT_CHATML : TOK_CHAT_DEEPSEEK2;
        const tok_chat_kind_t k = (tok_chat_kind_t)a->chat_template; /* NONE: the model's */
        size_t len = 0;
        ecs_err_t e = k ? tok_chat_apply(k, &msg, 1, true, NULL, 0, &len)
                        : tok_chat_format(tok, fb, &msg, 1, true, NULL, 0, &len);
        if (e != ECS_OK && e != ECS_ERR_RANGE)
            return run_fail("chat template: %s", ecs_errmsg());
        chat = malloc(len + 1);
        if (!chat || (k ? tok_chat_apply(k, &msg, 1, true, chat, len + 1, &len)
                        : tok_chat_format(tok, fb, &msg, 1, true, chat, len + 1, &len)) != ECS_OK) {
            free(chat);
            return run_fail("chat template: %s", ecs_errmsg());
        }
        text = chat;
    }
    size_t len = strlen(text), cap = tok_encode_bound(len), got = 0;
    int32_t *out = malloc((cap ? cap : 1) * sizeof *out);
    ecs_err_t e = out ? tok_encode(tok, text, len, true, a->chat, out, cap, &got) : ECS_ERR_NOMEM;
    free(chat);
    if (e != ECS_OK || got == 0 || got > INT32_MAX) {
        free(out);
        return run_fail("tokenize: %s", e == ECS_OK ? "empty prompt" : ecs_errmsg());
    }
    *ids = out;
    *n = (int)got;
    return 0;
}

static int cmd_tokenize(const args_t *a)
{
    gguf_file_t *f;
    tok_t *tok;
    if (gguf_open(a->model, &f) != ECS_OK)
        return run_fail("%s", ecs_errmsg());
    if (tok_load(f, &tok) != ECS_OK) {
        gguf_close(f);
        return run_fail("%s: tokenizer: %s", a->model, ecs_errmsg());
    }
    gguf_str_t arch = {"", 0};
    gguf_get_str(f, "general.architecture", &arch);
    int32_t *ids;
    int n;
    int rc = encode_prompt(tok, a, gguf_str_eq(arch, "qwen3moe") ? ARCH_QWEN3MOE
                                                                 : ARCH_DEEPSEEK2, &ids, &n);
    if (rc == 0) {
        printf("[");
        for (int i = 0; i < n; i++)
            printf("%s%" PRId32, i ? ", " : "", ids[i]);
        printf("]\n");
        free(ids);
        rc = run_stdout_check();
    }
    tok_free(tok);
    gguf_close(f);
    return rc;
}

/* Top k (id, logit) of one row, best first, ties to the lower id. */
static void top_k(const float *l, int V, int k, int32_t *ids)
{
    int n = 0;
    for (int v = 0; v < V; v++) {
        if (n == k && !(l[v] > l[ids[k - 1]]))
            continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && l[v] > l[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = v;
    }
}

static int cmd_dump(model_t *m, model_ctx_t *c, const args_t *a, const int32_t *toks, int n)
{
    const int V = model_n_vocab(m);
    int32_t *extra = NULL;
    int n_extra = 0;
    if (a->logits_of && parse_ids(a->logits_of, &extra, &n_extra))
        return 1;
    for (int i = 0; i < n_extra; i++)
        if (extra[i] >= V) {
            int rc = run_fail("--logits-of: id %" PRId32 " outside the vocabulary", extra[i]);
            free(extra);
            return rc;
        }
    run_out_t out;
    if (run_out_open(&out, a->dump)) {
        free(extra);
        return 1;
    }
    FILE *f = out.f;
    int k = a->top < V ? a->top : V;
    float *buf = malloc((size_t)MODEL_MAX_BATCH * V * sizeof *buf);
    int32_t *ids = malloc((size_t)k * sizeof *ids);
    /* --logits-of values are kept per position so the sequence is evaluated once */
    float *xv = malloc(((size_t)n * n_extra + 1) * sizeof *xv);
    if (!buf || !ids || !xv) {
        run_out_abort(&out);
        free(buf);
        free(ids);
        free(xv);
        free(extra);
        return run_fail("out of memory");
    }
    int rc = 0;
    fprintf(f, "{\"n_vocab\": %d, \"tokens\": [", V);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%" PRId32, i ? ", " : "", toks[i]);
    fprintf(f, "],\n \"positions\": [\n");
    const int step = a->step ? a->step : MODEL_MAX_BATCH;
    for (int s = 0; s < n && rc == 0; s += step) {
        const int nb = n - s < step ? n - s : step;
        if (run_stopped()) {
            rc = 128 + run_stopped();
            break;
        }
        if (model_eval(c, toks + s, nb, buf, true) != ECS_OK) {
            rc = run_fail("eval: %s", ecs_errmsg());
            break;
        }
        for (int i = 0; i < nb; i++) {
            const float *l = buf + (size_t)i * V;
            top_k(l, V, k, ids);
            fprintf(f, "  [");
            for (int j = 0; j < k; j++)
                fprintf(f, "%s[%" PRId32 ", %.9g]", j ? ", " : "", ids[j], l[ids[j]]);
            fprintf(f, "]%s\n", s + i + 1 < n ? "," : "");
            for (int j = 0; j < n_extra; j++)
                xv[(size_t)(s + i) * n_extra + j] = l[extra[j]];
        }
    }
    fprintf(f, " ]");
    if (n_extra > 0 && rc == 0) {
        fprintf(f, ",\n \"logits_of\": {\"ids\": [");
        for (int j = 0; j < n_extra; j++)
            fprintf(f, "%s%" PRId32, j ? ", " : "", extra[j]);
        fprintf(f, "], \"values\": [\n");
        for (int i = 0; i < n; i++) {
            fprintf(f, "  [");
            for (int j = 0; j < n_extra; j++)
                fprintf(f, "%s%.9g", j ? ", " : "", xv[(size_t)i * n_extra + j]);
            fprintf(f, "]%s\n", i + 1 < n ? "," : "");
        }
        fprintf(f, " ]}");
    }
    fprintf(f, "\n}\n");
    if (rc == 0 && run_stopped())
        rc = 128 + run_stopped();
    if (rc == 0)
        rc = run_out_commit(&out);
    else
        run_out_abort(&out);
    free(buf);
    free(ids);
    free(xv);
    free(extra);
    return rc;
}

/* Streams a token's text; false when standard output fails (closed, full
 * disk): the text would be lost, so generation stops. */
static bool emit(tok_decoder_t *d, int32_t id, char *out, size_t cap)
{
    size_t n = 0;
    if (tok_decoder_push(d, id, out, cap, &n) == ECS_OK && n)
        return fwrite(out, 1, n, stdout) == n && fflush(stdout) == 0;
    return true;
}

static int cmd_generate(model_t *m, model_ctx_t *c, const args_t *a, const tok_t *tok,
                        const int32_t *toks, int n)
{
    const int V = model_n_vocab(m);
    sampler_t *s = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    size_t cap = tok_decoder_max_out(tok);
    char *text = malloc(cap);
    if (!logits || !text || sampler_new(&a->sp, V, &s) != ECS_OK) {
        free(logits);
        free(text);
        return run_fail("sampler: %s", ecs_errmsg());
    }
    tok_decoder_t dec;
    tok_decoder_init(&dec, tok, false);
    int rc = 0, n_gen = 0;
    double t0 = run_now_s();
    /* a step at a time, so that a signal stops a long prompt between steps
     * (the last step's logits are the prompt's) */
    for (int s0 = 0; s0 < n && rc == 0; s0 += MODEL_MAX_BATCH) {
        if (run_stopped())
            rc = 128 + run_stopped();
        else if (model_eval(c, toks + s0, n - s0 < MODEL_MAX_BATCH ? n - s0 : MODEL_MAX_BATCH,
                            logits, false) != ECS_OK)
            rc = run_fail("eval: %s", ecs_errmsg());
    }
    double t1 = run_now_s();
    while (rc == 0 && n_gen < a->n_predict) {
        int32_t id;
        if (run_stopped()) {
            rc = 128 + run_stopped();
            break;
        }
        if (sampler_sample(s, logits, &id) != ECS_OK) {
            rc = run_fail("sample: %s", ecs_errmsg());
            break;
        }
        sampler_accept(s, id);
        n_gen++;
        if (!a->ignore_eos && tok_is_eog(tok, id))
            break;
        if (!emit(&dec, id, text, cap)) {
            rc = run_stdout_check();
            break;
        }
        if (n_gen == a->n_predict)
            break;
        if (model_eval(c, &id, 1, logits, false) != ECS_OK)
            rc = run_fail("eval: %s", ecs_errmsg());
    }
    size_t nf = 0;
    if (tok_decoder_flush(&dec, text, cap, &nf) == ECS_OK && nf)
        fwrite(text, 1, nf, stdout);
    printf("\n");
    if (rc == 0 || rc > 128) {
        const int wr = run_stdout_check();
        rc = rc ? rc : wr;
    }
    double t2 = run_now_s();
    fprintf(stderr, "prompt: %d tokens in %.3f s (%.2f tok/s)\n", n, t1 - t0,
            n / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    fprintf(stderr, "generation: %d tokens in %.3f s (%.2f tok/s)\n", n_gen, t2 - t1,
            n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
    sampler_free(s);
    free(logits);
    free(text);
    return rc;
}

unsigned run_ctx_flags(const args_t *a)
{
    return (a->expanded ? MODEL_CTX_MLA_EXPANDED : 0) | (a->absorbed ? MODEL_CTX_MLA_ABSORBED : 0) |
           a->mcli.kv_flag;
}

/* Says what became of the decode copy: made now (it took the load's time),
 * or not in use and why. */
static void repack_report(const model_t *m, double load_s)
{
    const char *path, *note = model_repack_note(m);
    bool made;
    const size_t bytes = model_repack_bytes(m, &path, &made);
    if (note)
        fprintf(stderr, "ecs-run: warning: %s; running from the GGUF alone\n", note);
    else if (made)
        fprintf(stderr, "repack: wrote %s (%.1f MB) in %.1f s (%s)\n", path, (double)bytes / 1e6,
                load_s, model_repack_made_why(m));
    if (model_pages_note(m))
        fprintf(stderr, "ecs-run: note: %s\n", model_pages_note(m));
    if (model_repack_cleaned(m))
        fprintf(stderr, "repack: removed %d temporary file(s) of killed loads\n",
                model_repack_cleaned(m));
}

static int run_args(const args_t *ap)
{
    const args_t a = *ap;
    if (a.tokenize)
        return cmd_tokenize(&a);
    if (dispatch_opts_check(&a.dispatch) != ECS_OK)
        return run_fail("%s", ecs_errmsg());
    model_t *m;
    char cache[4096];
    model_opts_t opts = {.n_ctx = a.ctx, .n_threads = a.threads, .profile = a.profile,
                         .repack_dir = model_cli_repack_dir(&a.mcli, cache, sizeof cache),
                         .attn_split_min = a.attn_split, .no_amx = a.mcli.no_amx,
                         .experts_remote = dispatch_wanted(&a.dispatch)};
    const char *ram = getenv("ECS_REPACK_RAM"); /* bytes to assume (tests, ops) */
    if (ram && *ram)
        opts.repack_ram = (size_t)strtoull(ram, NULL, 10);
    const double t0 = run_now_s();
    if (model_load(a.model, &opts, &m) != ECS_OK)
        return run_fail("%s", ecs_errmsg());
    if (model_load_warning(m))
        fprintf(stderr, "ecs-run: warning: %s\n", model_load_warning(m));
    repack_report(m, run_now_s() - t0);
    dispatch_t *dsp = NULL;
    if (dispatch_wanted(&a.dispatch)) {
        dispatch_opts_t d = a.dispatch;
        d.worker_repack = opts.repack_dir ? opts.repack_dir : "";
        if (dispatch_start(m, &d, &dsp) != ECS_OK) {
            int rc = run_fail("%s", ecs_errmsg());
            model_free(m);
            return rc;
        }
        if (a.print_placement)
            placement_write(dispatch_placement(dsp), stdout);
    }
    const unsigned flags =
        run_ctx_flags(&a);
    if (a.bench) {
        model_ctx_t *c = NULL;
        int rc = model_ctx_new(m, model_n_ctx_max(m), flags, &c) != ECS_OK
                     ? run_fail("%s", ecs_errmsg())
                     : run_bench(m, c, &a, dsp);
        if (rc == 0)
            rc = run_stdout_check();
        if (dsp)
            dispatch_print_stats(dsp, stderr);
        model_ctx_free(c);
        dispatch_free(dsp);
        model_free(m);
        return rc;
    }
    tok_t *tok = NULL;
    int32_t *toks = NULL;
    int n = 0, rc = 0;
    bool need_tok = a.prompt || !a.dump;
    if (need_tok && tok_load(model_gguf(m), &tok) != ECS_OK)
        rc = run_fail("%s: tokenizer: %s", a.model, ecs_errmsg());
    if (rc == 0)
        rc = a.prompt ? encode_prompt(tok, &a, model_hparams(m)->arch, &toks, &n)
                      : parse_ids(a.tokens, &toks, &n);
    for (int i = 0; rc == 0 && i < n; i++)
        if (toks[i] >= model_n_vocab(m))
            rc = run_fail("token id %" PRId32 " outside the vocabulary (0..%d)", toks[i],
                      model_n_vocab(m) - 1);
    model_ctx_t *c = NULL;
    if (rc == 0) {
        int need = n + (a.dump ? 0 : a.n_predict);
        int n_ctx = model_n_ctx_max(m);
        if (need > n_ctx && a.dump)
            rc = run_fail("%d tokens do not fit in the context of %d (raise --ctx)", n, n_ctx);
        else if (need > n_ctx)
            rc = run_fail("%d prompt tokens + -n %d do not fit in the context of %d (raise --ctx)",
                          n, a.n_predict, n_ctx);
        else if (model_ctx_new(m, n_ctx, flags, &c) != ECS_OK)
            rc = run_fail("%s", ecs_errmsg());
    }
    if (rc == 0)
        rc = a.dump ? cmd_dump(m, c, &a, toks, n) : cmd_generate(m, c, &a, tok, toks, n);
    model_ctx_free(c);
    free(toks);
    tok_free(tok);
    dispatch_free(dsp);
    model_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    ecs_mem_keep_large(); /* multi-MB messages every layer (mem.h) */
    args_t a;
    if (parse_args(argc, argv, &a))
        return 1;
    /* only --dump-logits writes elsewhere: every other mode's output would
     * be lost on a closed standard output */
    if (run_guard_stdout(!a.dump || a.bench || a.tokenize))
        return 1;
    char *text = NULL;
    if (a.prompt_file) {
        if (run_read_prompt(a.prompt_file, &text))
            return 1;
        a.prompt = text;
    }
    if (!a.bench) /* --bench's timed loops keep the default: Ctrl-C ends them */
        run_catch_signals();
    const int rc = run_args(&a);
    free(text);
    return rc;
}
