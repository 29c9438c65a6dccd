/* bench.c - ecs-run --bench: prompt processing and decode speeds from an
 * empty context and after the prompt, against the measured read bandwidth
 * of the mapped weights (the decode roofline), with memory use. */
#include <emmintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/ecs-run/run.h"


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
        double t0 = run_now_s();
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
        const double secs = run_now_s() - t0;
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
    w->wall0 = run_now_s();
    w->cpu0 = cpu_s();
}

static void sw_stop(stopwatch_t *w)
{
    w->wall = run_now_s() - w->wall0;
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

/* The dispatcher's figures summed over the decode runs only (the line
 * dispatch_print_stats prints at the end mixes in the prompts' calls):
 * what a decode step's expert phase costs per MoE layer call, beside
 * ecs-plan's phase (docs/planner.md). */
static dispatch_stats_t g_dec;

static void dec_stats(const dispatch_t *d, dispatch_stats_t *before, bool end)
{
    if (!d)
        return;
    dispatch_stats_t s;
    dispatch_stats(d, &s);
    if (!end) {
        *before = s;
        return;
    }
    g_dec.layer_calls += s.layer_calls - before->layer_calls;
    g_dec.ns_submit += s.ns_submit - before->ns_submit;
    g_dec.ns_overlap += s.ns_overlap - before->ns_overlap;
    g_dec.ns_blocked += s.ns_blocked - before->ns_blocked;
    g_dec.ns_rtt_max += s.ns_rtt_max - before->ns_rtt_max;
    g_dec.ns_compute_of_max += s.ns_compute_of_max - before->ns_compute_of_max;
}

static void print_dec_stats(void)
{
    const double n = (double)g_dec.layer_calls;
    if (n <= 0)
        return;
    const double sub = g_dec.ns_submit / n, ov = g_dec.ns_overlap / n, bl = g_dec.ns_blocked / n;
    printf("decode steps' expert phase: %.0f layer calls, per call %.0f us from submit to "
           "the end of wait = %.0f submit + %.0f overlapped (shared experts) + %.0f blocked; "
           "slowest call %.0f us round trip = %.0f its worker's compute + %.0f hand-offs\n", n,
           (sub + ov + bl) / 1e3, sub / 1e3, ov / 1e3, bl / 1e3, g_dec.ns_rtt_max / n / 1e3,
           g_dec.ns_compute_of_max / n / 1e3,
           ((double)g_dec.ns_rtt_max - (double)g_dec.ns_compute_of_max) / n / 1e3);
}

/* Decodes n tokens greedily after whatever c holds, starting from first. */
static int bench_decode(model_ctx_t *c, int32_t first, int n, float *logits, int V,
                        stopwatch_t *sw)
{
    sw_start(sw);
    int32_t id = first;
    for (int i = 0; i < n; i++) {
        if (model_eval(c, &id, 1, logits, false) != ECS_OK)
            return run_fail("eval: %s", ecs_errmsg());
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

/* The phase table of the last timed run, per token (per step of a batch). */
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

/* --tg-batch: n sequences from empty contexts, each starting from its own
 * token of toks, decoded greedily together for steps steps of n rows: what
 * a server's decode step costs with n running streams. */
static int bench_batch(model_t *m, const args_t *a, const int32_t *toks, int n_tok, int nth)
{
    const int n = a->tg_batch, steps = a->tg, V = model_n_vocab(m);
    model_ctx_t **cs = calloc((size_t)n, sizeof *cs);
    model_row_t *rows = calloc((size_t)n, sizeof *rows);
    float *logits = malloc((size_t)n * (size_t)V * sizeof *logits);
    int rc = 0;
    if (!cs || !rows || !logits)
        rc = run_fail("out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        if (model_ctx_new(m, steps, run_ctx_flags(a), &cs[i]) != ECS_OK)
            rc = run_fail("%s", ecs_errmsg());
        rows[i] = (model_row_t){.ctx = cs[i], .token = toks[i % n_tok], .want_logits = true};
    }
    /* an untimed step first, as the one-sequence runs warm up */
    for (int warm = 1; warm >= 0 && rc == 0; warm--) {
        stopwatch_t sw;
        model_profile_reset(m);
        sw_start(&sw);
        for (int s = 0; s < (warm ? 1 : steps) && rc == 0; s++) {
            if (model_eval_batch(m, rows, n, logits) != ECS_OK) {
                rc = run_fail("eval: %s", ecs_errmsg());
                break;
            }
            for (int i = 0; i < n; i++)
                rows[i].token = sampler_argmax(logits + (size_t)i * V, V);
        }
        sw_stop(&sw);
        if (warm) {
            for (int i = 0; i < n; i++) {
                model_ctx_reset(cs[i]);
                rows[i].token = toks[i % n_tok];
            }
            continue;
        }
        if (rc)
            break;
        char what[64];
        snprintf(what, sizeof what, "tg%dx%d", steps, n);
        print_speed(what, steps * n, &sw, 0, 0, nth);
        printf("%-22s %8.2f ms per step of %d rows (%d sequences, aggregate tok/s above)\n", "",
               1e3 * sw.wall / steps, n, n);
        if (a->profile)
            print_profile(m, what, steps, nth);
    }
    for (int i = 0; cs && i < n; i++)
        model_ctx_free(cs[i]);
    free(cs);
    free(rows);
    free(logits);
    return rc;
}

int run_bench(model_t *m, model_ctx_t *c, const args_t *a, const dispatch_t *d)
{
    const arch_hparams_t *hp = model_hparams(m);
    const int V = model_n_vocab(m), n_ctx = model_ctx_n_ctx(c);
    if (a->pp + a->tg > n_ctx)
        return run_fail("--pp %d + --tg %d do not fit in the context of %d (raise --ctx)", a->pp, a->tg,
                    n_ctx);
    const int n_tok = a->pp > 0 ? a->pp : 1;
    /* --tg-batch's sequences each start from their own token */
    const int n_rand = n_tok > a->tg_batch ? n_tok : a->tg_batch;
    int32_t *toks = malloc((size_t)n_rand * sizeof *toks);
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!toks || !logits) {
        free(toks);
        free(logits);
        return run_fail("out of memory");
    }
    /* xorshift64: the same random prompt for a seed on every machine */
    uint64_t s = (a->seed_given ? a->sp.seed : 1234) * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n_rand; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        toks[i] = (int32_t)(s % (uint64_t)V);
    }
    const double gb_tok = (double)model_decode_bytes(m) / 1e9;
    const int nth = ecs_threadpool_size(model_threadpool(m));
    printf("bench: %s  arch %s  layers %d  threads %d  ctx %d  kv %s  attention %s\n", a->model,
           hp->arch == ARCH_DEEPSEEK2 ? "deepseek2" : "qwen3moe", hp->n_layer,
           nth, n_ctx, model_kv_type_name(a->mcli.kv_flag),
           hp->arch != ARCH_DEEPSEEK2 ? "gqa"
           : a->expanded                   ? "mla-expanded"
           : a->absorbed                   ? "mla-latent (absorbed)"
                                           : "mla-latent (expanded prompts)");
    printf("weights read per decoded token: %.4f GB (attention, dense, router, shared, %d of %d "
           "routed experts per MoE layer, output head)\n", gb_tok, hp->n_expert_used, hp->n_expert);
    printf("prefault: %.2f s\n", model_prefault(m, dispatch_wanted(&a->dispatch)));
    const double bw = read_bandwidth(m, nth);
    printf("read bandwidth of the mapped weights, %d threads: %.2f GB/s = decode roofline %.2f "
           "tok/s\n", nth, bw, bw / gb_tok);
    /* warm-up, untimed: the whole prompt once (the first pass over a fresh
     * process's buffers runs ~2-4 % slower; llama-bench warms up the same
     * way) and a few decode steps */
    int rc = 0;
    stopwatch_t sw;
    if (model_eval(c, toks, n_tok, logits, false) != ECS_OK)
        rc = run_fail("eval: %s", ecs_errmsg());
    if (rc == 0)
        rc = bench_decode(c, sampler_argmax(logits, V), 4, logits, V, &sw);
    model_profile_reset(m);
    for (int r = 0; r < a->reps && rc == 0; r++) {
        char what[64];
        model_ctx_reset(c);
        if (a->pp > 0) {
            sw_start(&sw);
            if (model_eval(c, toks, a->pp, logits, false) != ECS_OK) {
                rc = run_fail("eval: %s", ecs_errmsg());
                break;
            }
            sw_stop(&sw);
            snprintf(what, sizeof what, "pp%d", a->pp);
            print_speed(what, a->pp, &sw, 0, bw, nth);
            if (a->profile)
                print_profile(m, what, a->pp, nth);
            if (a->tg > 0) {
                dispatch_stats_t ds;
                dec_stats(d, &ds, false);
                if ((rc = bench_decode(c, sampler_argmax(logits, V), a->tg, logits, V, &sw)))
                    break;
                dec_stats(d, &ds, true);
                snprintf(what, sizeof what, "tg%d @ depth %d", a->tg, a->pp);
                print_speed(what, a->tg, &sw, gb_tok, bw, nth);
                if (a->profile)
                    print_profile(m, what, a->tg, nth);
            }
        }
        if (a->tg > 0) {
            model_ctx_reset(c);
            dispatch_stats_t ds;
            dec_stats(d, &ds, false);
            if ((rc = bench_decode(c, toks[0], a->tg, logits, V, &sw)))
                break;
            dec_stats(d, &ds, true);
            snprintf(what, sizeof what, "tg%d", a->tg);
            print_speed(what, a->tg, &sw, gb_tok, bw, nth);
            if (a->profile)
                print_profile(m, what, a->tg, nth);
        }
        if (a->tg_batch > 1 && (rc = bench_batch(m, a, toks, n_rand, nth)))
            break;
        fflush(stdout);
    }
    print_dec_stats();
    mem_kb_t mk;
    read_mem(&mk);
    const double MiB = 1024.0 * 1024.0;
    const unsigned flags =
        run_ctx_flags(a);
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
