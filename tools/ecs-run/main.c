/* ecs-run - run a model from the command line: generate text from a prompt
 * (streamed as it is decoded, speeds on stderr), evaluate a token sequence
 * and dump per-position top logits as JSON (teacher forcing, for comparing
 * against other engines), print a prompt's token ids, or benchmark prompt
 * processing and decoding (--bench). */
#include <emmintrin.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator/dispatch/dispatch.h"
#include "coordinator/model/model.h"
#include "coordinator/sampler/sampler.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "kernels/repack/repack.h"

#define MAX_TOKENS_ARG (1 << 20)
#define MAX_TOP 4096

typedef struct {
    const char *model, *prompt, *tokens, *dump, *logits_of, *repack_dir;
    int n_predict, threads, ctx, top, pp, tg, reps, step;
    bool chat, tokenize, ignore_eos, expanded, absorbed, kv_f32, bench, seed_given, profile;
    bool no_repack, print_placement;
    sampler_params_t sp;
    dispatch_opts_t dispatch;
} args_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ecs-run -m MODEL.gguf (-p PROMPT | --tokens ID,ID,...) [options]\n"
            "       ecs-run -m MODEL.gguf --bench [--pp N] [--tg N] [--reps R] [options]\n"
            "  -n N               tokens to generate (default 64)\n"
            "  --chat             wrap the prompt in the model's chat template\n"
            "  --threads N        compute threads (default: all CPUs)\n"
            "  --ctx N            context size (default: min(trained, 4096))\n"
            "  --temp T           temperature (default 0.8; 0 = greedy)\n"
            "  --top-k K          (default 40)   --top-p P (default 0.95)   --min-p P (default 0.05)\n"
            "  --seed S           sampling seed (default: time)\n"
            "  --ignore-eos       keep generating after an end-of-generation token\n"
            "  --tokenize         print the prompt's token ids as a JSON array and exit\n"
            "  --dump-logits FILE evaluate the tokens (teacher forcing) and write each\n"
            "                     position's top logits as JSON\n"
            "  --top K            entries per position in --dump-logits (default 5)\n"
            "  --logits-of IDS    also dump the logits of these ids at every position\n"
            "  --step N           --dump-logits evaluates N tokens per step (default: as\n"
            "                     many as a step takes; 1: every token a decode step)\n"
            "  --mla-expanded     deepseek2: cache expanded K/V (reference path)\n"
            "  --mla-absorbed     deepseek2: absorbed attention for prompt steps too\n"
            "  --kv-f32           keep the KV cache in F32 (exact attention, for references)\n"
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
            "  --profile          with --bench: time per phase of the forward pass\n"
            "experts on workers (the results are the same bits):\n" DISPATCH_USAGE
            "  --print-placement  print which worker holds which experts\n");
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ecs-run: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}

static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

/* Parses "1,2,3" into a malloc'd array. */
static int parse_ids(const char *s, int32_t **out, int *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    if (cap > MAX_TOKENS_ARG)
        return fail("too many ids in '%.40s...'", s);
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return fail("out of memory");
    int k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return fail("bad token id list '%s'", s);
        }
        ids[k++] = (int32_t)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) {
            free(ids);
            return fail("bad token id list '%s'", s);
        }
    }
    if (k == 0) {
        free(ids);
        return fail("empty token id list");
    }
    *out = ids;
    *n = k;
    return 0;
}

static bool takes_value(const char *o)
{
    static const char *const opts[] = {"-m", "-p", "-n", "--tokens", "--dump-logits",
                                       "--logits-of", "--threads", "--ctx", "--top", "--top-k",
                                       "--seed", "--temp", "--top-p", "--min-p", "--pp", "--tg",
                                       "--reps", "--repack", "--step"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (!strcmp(o, opts[i]))
            return true;
    return dispatch_opt_takes_value(o);
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
        if (!strcmp(o, "--kv-f32")) { a->kv_f32 = true; continue; }
        if (!strcmp(o, "--bench")) { a->bench = true; continue; }
        if (!strcmp(o, "--profile")) { a->profile = true; continue; }
        if (!strcmp(o, "--no-repack")) { a->no_repack = true; continue; }
        if (!strcmp(o, "--print-placement")) { a->print_placement = true; continue; }
        if (!takes_value(o))
            return fail("unknown option %s (see --help)", o);
        if (i + 1 >= argc)
            return fail("%s needs a value", o);
        const char *v = argv[++i];
        long l;
        float f;
        const int dr = dispatch_parse_opt(&a->dispatch, o, v);
        if (dr < 0)
            return fail("%s", ecs_errmsg());
        if (dr > 0)
            continue;
        if (!strcmp(o, "-m")) a->model = v;
        else if (!strcmp(o, "-p")) a->prompt = v;
        else if (!strcmp(o, "--tokens")) a->tokens = v;
        else if (!strcmp(o, "--dump-logits")) a->dump = v;
        else if (!strcmp(o, "--logits-of")) a->logits_of = v;
        else if (!strcmp(o, "--repack")) a->repack_dir = v;
        else if (!strcmp(o, "-n")) {
            if (!parse_long(v, 0, MODEL_MAX_CTX, &l)) return fail("-n: bad count '%s'", v);
            a->n_predict = (int)l;
        } else if (!strcmp(o, "--threads")) {
            if (!parse_long(v, 1, 1024, &l)) return fail("--threads: bad count '%s'", v);
            a->threads = (int)l;
        } else if (!strcmp(o, "--ctx")) {
            if (!parse_long(v, 1, MODEL_MAX_CTX, &l)) return fail("--ctx: bad size '%s'", v);
            a->ctx = (int)l;
        } else if (!strcmp(o, "--pp") || !strcmp(o, "--tg")) {
            if (!parse_long(v, 0, MODEL_MAX_CTX, &l)) return fail("%s: bad count '%s'", o, v);
            *(o[3] == 'p' ? &a->pp : &a->tg) = (int)l;
        } else if (!strcmp(o, "--step")) {
            if (!parse_long(v, 1, MODEL_MAX_BATCH, &l)) return fail("--step: bad count '%s'", v);
            a->step = (int)l;
        } else if (!strcmp(o, "--reps")) {
            if (!parse_long(v, 1, 1000, &l)) return fail("--reps: bad count '%s'", v);
            a->reps = (int)l;
        } else if (!strcmp(o, "--top")) {
            if (!parse_long(v, 1, MAX_TOP, &l)) return fail("--top: bad count '%s'", v);
            a->top = (int)l;
        } else if (!strcmp(o, "--top-k")) {
            if (!parse_long(v, 0, INT32_MAX, &l)) return fail("--top-k: bad value '%s'", v);
            a->sp.top_k = (int32_t)l;
        } else if (!strcmp(o, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') return fail("--seed: bad value '%s'", v);
            a->sp.seed = s;
            a->seed_given = true;
        } else if (!strcmp(o, "--temp")) {
            if (!parse_float(v, &f)) return fail("--temp: bad value '%s'", v);
            a->sp.temp = f;
        } else if (!strcmp(o, "--top-p")) {
            if (!parse_float(v, &f)) return fail("--top-p: bad value '%s'", v);
            a->sp.top_p = f;
        } else if (!strcmp(o, "--min-p")) {
            if (!parse_float(v, &f)) return fail("--min-p: bad value '%s'", v);
            a->sp.min_p = f;
        } else {
            return fail("unknown option %s (see --help)", o);
        }
    }
    if (!a->model)
        return fail("no model given (-m FILE)");
    if (a->bench) {
        if (a->prompt || a->tokens || a->dump || a->tokenize)
            return fail("--bench makes its own random tokens: no -p, --tokens, --dump-logits");
        if (a->pp + a->tg == 0)
            return fail("--bench needs --pp or --tg above 0");
        return 0;
    }
    if (!!a->prompt + !!a->tokens != 1)
        return fail("give exactly one of -p PROMPT and --tokens IDS");
    if (a->tokenize && !a->prompt)
        return fail("--tokenize needs -p PROMPT");
    if (a->logits_of && !a->dump)
        return fail("--logits-of needs --dump-logits");
    if (a->step && !a->dump)
        return fail("--step needs --dump-logits");
    if (sampler_params_check(&a->sp) != ECS_OK)
        return fail("%s", ecs_errmsg());
    return 0;
}

static double now_s(void)
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
        size_t len = 0;
        ecs_err_t e = tok_chat_format(tok, fb, &msg, 1, true, NULL, 0, &len);
        if (e != ECS_OK && e != ECS_ERR_RANGE)
            return fail("chat template: %s", ecs_errmsg());
        chat = malloc(len + 1);
        if (!chat || tok_chat_format(tok, fb, &msg, 1, true, chat, len + 1, &len) != ECS_OK) {
            free(chat);
            return fail("chat template: %s", ecs_errmsg());
        }
        text = chat;
    }
    size_t len = strlen(text), cap = tok_encode_bound(len), got = 0;
    int32_t *out = malloc((cap ? cap : 1) * sizeof *out);
    ecs_err_t e = out ? tok_encode(tok, text, len, true, a->chat, out, cap, &got) : ECS_ERR_NOMEM;
    free(chat);
    if (e != ECS_OK || got == 0 || got > INT32_MAX) {
        free(out);
        return fail("tokenize: %s", e == ECS_OK ? "empty prompt" : ecs_errmsg());
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
        return fail("%s", ecs_errmsg());
    if (tok_load(f, &tok) != ECS_OK) {
        gguf_close(f);
        return fail("%s: tokenizer: %s", a->model, ecs_errmsg());
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
            int rc = fail("--logits-of: id %" PRId32 " outside the vocabulary", extra[i]);
            free(extra);
            return rc;
        }
    FILE *f = fopen(a->dump, "w");
    int k = a->top < V ? a->top : V;
    float *buf = malloc((size_t)MODEL_MAX_BATCH * V * sizeof *buf);
    int32_t *ids = malloc((size_t)k * sizeof *ids);
    /* --logits-of values are kept per position so the sequence is evaluated once */
    float *xv = malloc(((size_t)n * n_extra + 1) * sizeof *xv);
    if (!f || !buf || !ids || !xv) {
        if (f)
            fclose(f);
        free(buf);
        free(ids);
        free(xv);
        free(extra);
        return fail("%s: %s", a->dump, f ? "out of memory" : strerror(errno));
    }
    int rc = 0;
    fprintf(f, "{\"n_vocab\": %d, \"tokens\": [", V);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%" PRId32, i ? ", " : "", toks[i]);
    fprintf(f, "],\n \"positions\": [\n");
    const int step = a->step ? a->step : MODEL_MAX_BATCH;
    for (int s = 0; s < n && rc == 0; s += step) {
        const int nb = n - s < step ? n - s : step;
        if (model_eval(c, toks + s, nb, buf, true) != ECS_OK) {
            rc = fail("eval: %s", ecs_errmsg());
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
    if (fclose(f) != 0 && rc == 0)
        rc = fail("%s: %s", a->dump, strerror(errno));
    free(buf);
    free(ids);
    free(xv);
    free(extra);
    return rc;
}

static void emit(tok_decoder_t *d, int32_t id, char *out, size_t cap)
{
    size_t n = 0;
    if (tok_decoder_push(d, id, out, cap, &n) == ECS_OK && n) {
        fwrite(out, 1, n, stdout);
        fflush(stdout);
    }
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
        return fail("sampler: %s", ecs_errmsg());
    }
    tok_decoder_t dec;
    tok_decoder_init(&dec, tok, false);
    int rc = 0, n_gen = 0;
    double t0 = now_s();
    if (model_eval(c, toks, n, logits, false) != ECS_OK)
        rc = fail("eval: %s", ecs_errmsg());
    double t1 = now_s();
    while (rc == 0 && n_gen < a->n_predict) {
        int32_t id;
        if (sampler_sample(s, logits, &id) != ECS_OK) {
            rc = fail("sample: %s", ecs_errmsg());
            break;
        }
        sampler_accept(s, id);
        n_gen++;
        if (!a->ignore_eos && tok_is_eog(tok, id))
            break;
        emit(&dec, id, text, cap);
        if (n_gen == a->n_predict)
            break;
        if (model_eval(c, &id, 1, logits, false) != ECS_OK)
            rc = fail("eval: %s", ecs_errmsg());
    }
    size_t nf = 0;
    if (tok_decoder_flush(&dec, text, cap, &nf) == ECS_OK && nf)
        fwrite(text, 1, nf, stdout);
    printf("\n");
    double t2 = now_s();
    fprintf(stderr, "prompt: %d tokens in %.3f s (%.2f tok/s)\n", n, t1 - t0,
            n / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    fprintf(stderr, "generation: %d tokens in %.3f s (%.2f tok/s)\n", n_gen, t2 - t1,
            n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
    sampler_free(s);
    free(logits);
    free(text);
    return rc;
}

/* ------------------------------------------------------------------ bench */

/* kB values of /proc/self/status and smaps_rollup lines, -1 where absent. */
typedef struct {
    long hwm, rss, anon, file, file_pmd;
} mem_kb_t;

static void read_mem(mem_kb_t *m)
{
    *m = (mem_kb_t){-1, -1, -1, -1, -1};
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            long v;
            if (sscanf(line, "VmHWM: %ld", &v) == 1) m->hwm = v;
            else if (sscanf(line, "VmRSS: %ld", &v) == 1) m->rss = v;
            else if (sscanf(line, "RssAnon: %ld", &v) == 1) m->anon = v;
            else if (sscanf(line, "RssFile: %ld", &v) == 1) m->file = v;
        }
        fclose(f);
    }
    /* how much of the mapping the kernel maps with 2 MB pages (fewer TLB
     * misses while streaming the weights) */
    f = fopen("/proc/self/smaps_rollup", "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            long v;
            if (sscanf(line, "FilePmdMapped: %ld", &v) == 1) m->file_pmd = v;
        }
        fclose(f);
    }
}

/* Touches every page of every tensor, so that timed runs measure the
 * engine, not page faults of a freshly mapped file (llama-bench's warm-up
 * run does the same for the pages it uses). */
static double prefault(const model_t *m)
{
    const gguf_file_t *f = model_gguf(m);
    volatile unsigned char sink = 0;
    unsigned char acc = 0;
    double t0 = now_s();
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        const unsigned char *p = t->data;
        if (model_repack_has(m, t->data)) /* read from the copy instead */
            continue;
        for (size_t o = 0; o < t->nbytes; o += 4096)
            acc ^= p[o];
    }
    const unsigned char *r = model_repack_map(m); /* the decode copy */
    for (size_t o = 0, n = model_repack_bytes(m, NULL, NULL); r && o < n; o += 4096)
        acc ^= r[o];
    sink = acc;
    (void)sink;
    return now_s() - t0;
}

/* ---- read bandwidth of the mapped weights: the decode roofline ---- */

#define BW_BYTES ((size_t)2 << 30) /* streamed per pass, split over the threads */

typedef struct {
    const unsigned char *p; /* 64-byte aligned */
    size_t n;               /* multiple of 64 */
    __m128i sum;
} bw_slice_t;

/* One sequential stream per thread, as decode reads a matrix, with 16-byte
 * loads (SSE2 is baseline x86-64) and prefetching 1 KB ahead. */
static void *bw_read(void *arg)
{
    bw_slice_t *s = arg;
    __m128i a = _mm_setzero_si128(), b = a, c = a, d = a;
    for (size_t off = 0; off < s->n; off += 64) {
        const __m128i *v = (const __m128i *)(s->p + off);
        _mm_prefetch((const char *)v + 1024, _MM_HINT_T0);
        a = _mm_xor_si128(a, _mm_load_si128(v));
        b = _mm_xor_si128(b, _mm_load_si128(v + 1));
        c = _mm_xor_si128(c, _mm_load_si128(v + 2));
        d = _mm_xor_si128(d, _mm_load_si128(v + 3));
    }
    s->sum = _mm_xor_si128(_mm_xor_si128(a, b), _mm_xor_si128(c, d));
    return NULL;
}

/* GB/s of nth threads streaming disjoint slices of the weights (no
 * arithmetic), best of 3 passes: what decode could reach if it only read. */
static double read_bandwidth(const model_t *m, int nth)
{
    const gguf_file_t *f = model_gguf(m);
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        lo = (uintptr_t)t->data < lo ? (uintptr_t)t->data : lo;
        hi = (uintptr_t)t->data + t->nbytes > hi ? (uintptr_t)t->data + t->nbytes : hi;
    }
    if (model_repack_map(m)) { /* decode reads the copy, and the GGUF less */
        lo = (uintptr_t)model_repack_map(m);
        hi = lo + model_repack_bytes(m, NULL, NULL);
    }
    lo = (lo + 63) & ~(uintptr_t)63;
    const size_t bytes = hi - lo < BW_BYTES ? (hi - lo) & ~(size_t)63 : BW_BYTES;
    bw_slice_t sl[64];
    pthread_t th[64];
    nth = nth < 1 ? 1 : nth > 64 ? 64 : nth;
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = now_s();
        int started = 0;
        for (int i = 0; i < nth; i++) {
            const size_t per = bytes / (size_t)nth / 64 * 64;
            sl[i].p = (const unsigned char *)(lo + (size_t)i * per);
            sl[i].n = per;
            if (i > 0 && pthread_create(&th[i], NULL, bw_read, &sl[i]) != 0)
                break;
            started = i + 1;
        }
        bw_read(&sl[0]);
        for (int i = 1; i < started; i++)
            pthread_join(th[i], NULL);
        const double secs = now_s() - t0;
        if (started == nth && secs > 0 && bytes / secs / 1e9 > best)
            best = bytes / secs / 1e9;
    }
    return best;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wall and process CPU time of a timed phase: the share of the cores the
 * run got tells a quiet machine from one where other jobs took turns. */
typedef struct {
    double wall0, cpu0, wall, cpu;
} stopwatch_t;

static void sw_start(stopwatch_t *w)
{
    w->wall0 = now_s();
    w->cpu0 = cpu_s();
}

static void sw_stop(stopwatch_t *w)
{
    w->wall = now_s() - w->wall0;
    w->cpu = cpu_s() - w->cpu0;
}

/* "  [busy machine: got N% of the cores]" when under 90 %, else "". */
static const char *busy_note(const stopwatch_t *w, int nth, char *buf, size_t cap)
{
    const double share = w->cpu / (w->wall * nth > 0 ? w->wall * nth : 1e-9);
    buf[0] = 0;
    if (share < 0.9)
        snprintf(buf, cap, "  [busy machine: got %.0f%% of the cores]", 100 * share);
    return buf;
}

/* Decodes n tokens greedily after whatever c holds, starting from first. */
static int bench_decode(model_ctx_t *c, int32_t first, int n, float *logits, int V,
                        stopwatch_t *sw)
{
    sw_start(sw);
    int32_t id = first;
    for (int i = 0; i < n; i++) {
        if (model_eval(c, &id, 1, logits, false) != ECS_OK)
            return fail("eval: %s", ecs_errmsg());
        id = sampler_argmax(logits, V);
    }
    sw_stop(sw);
    return 0;
}

static void print_speed(const char *what, int n, const stopwatch_t *sw, double gb_tok, double roof,
                        int nth)
{
    char busy[64], bw[96] = "";
    const double tps = n / (sw->wall > 0 ? sw->wall : 1e-9);
    if (gb_tok > 0)
        snprintf(bw, sizeof bw, "  %6.2f GB/s of weights, %5.1f %% of the roofline", gb_tok * tps,
                 100 * gb_tok * tps / (roof > 0 ? roof : 1e-9));
    printf("%-22s %8.2f tok/s  (%d tokens in %.3f s)%s%s\n", what, tps, n, sw->wall, bw,
           busy_note(sw, nth, busy, sizeof busy));
}

/* The phase table of the last timed run, per token. */
static void print_profile(model_t *m, const char *what, int n_tok, int nth)
{
    model_prof_t p[MODEL_PH_COUNT];
    model_profile(m, p);
    double tot = 0;
    for (int i = 0; i < MODEL_PH_COUNT; i++)
        tot += p[i].wall_s;
    printf("  profile of %s (per token; cpu = CPU time / (wall x %d threads)):\n", what, nth);
    for (int i = 0; i < MODEL_PH_COUNT; i++) {
        if (p[i].calls == 0)
            continue;
        printf("    %-10s %8.3f ms  %5.1f %%  cpu %5.1f %%  %6.1f regions\n", p[i].name,
               1e3 * p[i].wall_s / n_tok, 100 * p[i].wall_s / (tot > 0 ? tot : 1),
               100 * p[i].cpu_s / (p[i].wall_s * nth > 0 ? p[i].wall_s * nth : 1),
               (double)p[i].regions / n_tok);
    }
    model_profile_reset(m);
}

static unsigned ctx_flags(const args_t *a)
{
    return (a->expanded ? MODEL_CTX_MLA_EXPANDED : 0) | (a->absorbed ? MODEL_CTX_MLA_ABSORBED : 0) |
           (a->kv_f32 ? MODEL_CTX_KV_F32 : 0);
}

static int cmd_bench(model_t *m, model_ctx_t *c, const args_t *a)
{
    const arch_hparams_t *hp = model_hparams(m);
    const int V = model_n_vocab(m), n_ctx = model_ctx_n_ctx(c);
    if (a->pp + a->tg > n_ctx)
        return fail("--pp %d + --tg %d do not fit in the context of %d (raise --ctx)", a->pp, a->tg,
                    n_ctx);
    const int n_tok = a->pp > 0 ? a->pp : 1;
    int32_t *toks = malloc((size_t)n_tok * sizeof *toks);
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!toks || !logits) {
        free(toks);
        free(logits);
        return fail("out of memory");
    }
    /* xorshift64: the same random prompt for a seed on every machine */
    uint64_t s = (a->seed_given ? a->sp.seed : 1234) * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n_tok; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        toks[i] = (int32_t)(s % (uint64_t)V);
    }
    const double gb_tok = (double)model_decode_bytes(m) / 1e9;
    const int nth = ecs_threadpool_size(model_threadpool(m));
    printf("bench: %s  arch %s  layers %d  threads %d  ctx %d  kv %s  attention %s\n", a->model,
           hp->arch == ARCH_DEEPSEEK2 ? "deepseek2" : "qwen3moe", hp->n_layer,
           nth, n_ctx, a->kv_f32 ? "f32" : "f16",
           hp->arch != ARCH_DEEPSEEK2 ? "gqa"
           : a->expanded                   ? "mla-expanded"
           : a->absorbed                   ? "mla-latent (absorbed)"
                                           : "mla-latent (expanded prompts)");
    printf("weights read per decoded token: %.4f GB (attention, dense, router, shared, %d of %d "
           "routed experts per MoE layer, output head)\n", gb_tok, hp->n_expert_used, hp->n_expert);
    printf("prefault: %.2f s\n", prefault(m));
    const double bw = read_bandwidth(m, nth);
    printf("read bandwidth of the mapped weights, %d threads: %.2f GB/s = decode roofline %.2f "
           "tok/s\n", nth, bw, bw / gb_tok);
    /* warm-up, untimed: the whole prompt once (the first pass over a fresh
     * process's buffers runs ~2-4 % slower; llama-bench warms up the same
     * way) and a few decode steps */
    int rc = 0;
    stopwatch_t sw;
    if (model_eval(c, toks, n_tok, logits, false) != ECS_OK)
        rc = fail("eval: %s", ecs_errmsg());
    if (rc == 0)
        rc = bench_decode(c, sampler_argmax(logits, V), 4, logits, V, &sw);
    model_profile_reset(m);
    for (int r = 0; r < a->reps && rc == 0; r++) {
        char what[64];
        model_ctx_reset(c);
        if (a->pp > 0) {
            sw_start(&sw);
            if (model_eval(c, toks, a->pp, logits, false) != ECS_OK) {
                rc = fail("eval: %s", ecs_errmsg());
                break;
            }
            sw_stop(&sw);
            snprintf(what, sizeof what, "pp%d", a->pp);
            print_speed(what, a->pp, &sw, 0, bw, nth);
            if (a->profile)
                print_profile(m, what, a->pp, nth);
            if (a->tg > 0) {
                if ((rc = bench_decode(c, sampler_argmax(logits, V), a->tg, logits, V, &sw)))
                    break;
                snprintf(what, sizeof what, "tg%d @ depth %d", a->tg, a->pp);
                print_speed(what, a->tg, &sw, gb_tok, bw, nth);
                if (a->profile)
                    print_profile(m, what, a->tg, nth);
            }
        }
        if (a->tg > 0) {
            model_ctx_reset(c);
            if ((rc = bench_decode(c, toks[0], a->tg, logits, V, &sw)))
                break;
            snprintf(what, sizeof what, "tg%d", a->tg);
            print_speed(what, a->tg, &sw, gb_tok, bw, nth);
            if (a->profile)
                print_profile(m, what, a->tg, nth);
        }
        fflush(stdout);
    }
    mem_kb_t mk;
    read_mem(&mk);
    const double MiB = 1024.0 * 1024.0;
    const unsigned flags =
        ctx_flags(a);
    printf("memory: VmHWM %.0f MiB, VmRSS %.0f MiB = RssFile %.0f MiB (mapped weights, %.0f MiB "
           "of it in 2 MB pages) + RssAnon %.0f MiB; budgeted at start-up: workspace %.1f MiB + KV "
           "%.1f MiB for %d tokens\n",
           mk.hwm / 1024.0, mk.rss / 1024.0, mk.file / 1024.0, mk.file_pmd / 1024.0,
           mk.anon / 1024.0, model_workspace_bytes(m) / MiB, model_ctx_bytes(m, n_ctx, flags) / MiB,
           n_ctx);
    free(toks);
    free(logits);
    return rc;
}

/* The decode copy's directory: --repack, else the environment's cache
 * directory; NULL (none) with --no-repack or without any. */
static const char *repack_dir(const args_t *a, char *buf, size_t cap)
{
    if (a->no_repack)
        return NULL;
    if (a->repack_dir)
        return a->repack_dir;
    return krepack_default_dir(buf, cap);
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
    if (model_repack_cleaned(m))
        fprintf(stderr, "repack: removed %d temporary file(s) of killed loads\n",
                model_repack_cleaned(m));
}

int main(int argc, char **argv)
{
    args_t a;
    if (parse_args(argc, argv, &a))
        return 1;
    if (a.tokenize)
        return cmd_tokenize(&a);
    model_t *m;
    char cache[4096];
    model_opts_t opts = {.n_ctx = a.ctx, .n_threads = a.threads, .profile = a.profile,
                         .repack_dir = repack_dir(&a, cache, sizeof cache)};
    const char *ram = getenv("ECS_REPACK_RAM"); /* bytes to assume (tests, ops) */
    if (ram && *ram)
        opts.repack_ram = (size_t)strtoull(ram, NULL, 10);
    const double t0 = now_s();
    if (model_load(a.model, &opts, &m) != ECS_OK)
        return fail("%s", ecs_errmsg());
    repack_report(m, now_s() - t0);
    dispatch_t *dsp = NULL;
    if (dispatch_wanted(&a.dispatch)) {
        a.dispatch.worker_repack = opts.repack_dir ? opts.repack_dir : "";
        if (dispatch_start(m, &a.dispatch, &dsp) != ECS_OK) {
            int rc = fail("%s", ecs_errmsg());
            model_free(m);
            return rc;
        }
        if (a.print_placement)
            placement_write(dispatch_placement(dsp), stdout);
    }
    const unsigned flags =
        ctx_flags(&a);
    if (a.bench) {
        model_ctx_t *c = NULL;
        int rc = model_ctx_new(m, model_n_ctx_max(m), flags, &c) != ECS_OK
                     ? fail("%s", ecs_errmsg())
                     : cmd_bench(m, c, &a);
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
        rc = fail("%s: tokenizer: %s", a.model, ecs_errmsg());
    if (rc == 0)
        rc = a.prompt ? encode_prompt(tok, &a, model_hparams(m)->arch, &toks, &n)
                      : parse_ids(a.tokens, &toks, &n);
    for (int i = 0; rc == 0 && i < n; i++)
        if (toks[i] >= model_n_vocab(m))
            rc = fail("token id %" PRId32 " outside the vocabulary (0..%d)", toks[i],
                      model_n_vocab(m) - 1);
    model_ctx_t *c = NULL;
    if (rc == 0) {
        int need = n + (a.dump ? 0 : a.n_predict);
        int n_ctx = model_n_ctx_max(m);
        if (need > n_ctx)
            rc = fail("%d prompt tokens + -n %d do not fit in the context of %d (raise --ctx)", n, a.n_predict, model_n_ctx_max(m));
        else if (model_ctx_new(m, n_ctx, flags, &c) != ECS_OK)
            rc = fail("%s", ecs_errmsg());
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
