/* ecs-plan - the capacity planner: measures on this machine what the
 * coordinator's step costs without its routed experts, what kmoe costs per
 * expert and per row with each thread count, and what a mux round trip
 * costs per call and per byte; prints those inputs, then predicts decode
 * and prompt tok/s and each worker's load for the layouts asked for
 * (coordinator/plan/plan.h gives the model, docs/planner.md explains it).
 *
 * usage: ecs-plan -m MODEL.gguf [--workers 0,1,2,3] [--worker-threads N]
 *        [--replication R] [--threads N] [--cores N] [--pp N] [--tg N]
 *        [--batch B] [--transport ipc|tcp] [--reps R] [--ext-threads N] [--quick]
 *        [--repack DIR | --no-repack] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/dispatch/dispatch.h"
#include "kernels/repack/repack.h"
#include "proto/wire.h"
#include "tools/ecs-plan/measure.h"
#include "common/mem.h"
#include "common/resident.h"

#define MAX_LAYOUTS 16

typedef struct {
    const char *model, *repack_dir, *transport;
    bool no_repack, quick;
    int workers[MAX_LAYOUTS], n_layouts;
    int worker_threads, threads, cores, replication, pp, tg, batch, reps;
    double ext_threads; /* < 0: estimated */
} args_t;

/* Bytes of an activation row to a worker as the dispatcher sends it by
 * default (wire_act_type of the first MoE layer's gate and up). */
static double wire_act_bytes(const model_t *m)
{
    const arch_hparams_t *hp = model_hparams(m);
    const gguf_tensor_t *g, *u;
    if (arch_exps_tensor(model_gguf(m), hp, hp->n_layer_dense, ARCH_EXPS_GATE, &g) != ECS_OK ||
        arch_exps_tensor(model_gguf(m), hp, hp->n_layer_dense, ARCH_EXPS_UP, &u) != ECS_OK)
        return 4.0 * hp->n_embd;
    const uint32_t n = (uint32_t)hp->n_embd;
    return (double)wire_row_bytes(wire_act_type(g->type, u->type, n), n);
}

/* The holders per expert of a layout of n workers: --replication capped
 * at n; auto (0), like the dispatcher's for spawned workers without a
 * budget, every worker holding every expert. */
static int layout_replication(const args_t *a, int n)
{
    const int r = a->replication > 0 ? a->replication : PLAN_MAX_REPLICATION;
    return r < n ? r : n;
}

static int usage(FILE *f)
{
    fprintf(f,
            "usage: ecs-plan -m MODEL.gguf [options]\n"
            "  --workers LIST      layouts to predict: worker counts, 0 = one process\n"
            "                      (default 0,1,2,3)\n"
            "  --worker-threads N  threads per worker (default: cores / workers, >= 1,\n"
            "                      as ecs-run --spawn-workers)\n"
            "  --replication R     holders per expert, or auto (default: every worker holds\n"
            "                      every expert, as ecs-run --spawn-workers; capped at the\n"
            "                      workers)\n"
            "  --threads N         the coordinator's threads (default: all CPUs)\n"
            "  --cores N           cores all processes share (default: online CPUs)\n"
            "  --pp N              prompt tokens (default 512, at most 512)\n"
            "  --tg N              decode tokens timed per run (default 32)\n"
            "  --batch B           also predict decode steps of B sequences (default 1)\n"
            "  --transport T       ipc (default, what --spawn-workers uses) or tcp\n"
            "  --reps R            repetitions of the coordinator's timing (default 5)\n"
            "  --ext-threads N     other processes' runnable threads to assume (default:\n"
            "                      estimated from the share of the cores the timings got;\n"
            "                      0: a quiet machine)\n"
            "  --repack DIR / --no-repack   the decode copy, as ecs-run\n"
            "  --quick             fewer repetitions (a smoke run)\n");
    return f == stderr ? 2 : 0;
}

static int parse(int argc, char **argv, args_t *a)
{
    memset(a, 0, sizeof *a);
    a->transport = "ipc";
    a->replication = 0, a->pp = 512, a->tg = 32, a->batch = 1, a->reps = 5;
    a->n_layouts = 4;
    a->ext_threads = -1;
    for (int i = 0; i < 4; i++)
        a->workers[i] = i;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "-h") || !strcmp(o, "--help"))
            return usage(stdout), 1;
        if (!strcmp(o, "--quick")) { a->quick = true; continue; }
        if (!strcmp(o, "--no-repack")) { a->no_repack = true; continue; }
        static const char *const with_value[] = {
            "--worker-threads", "--threads", "--cores", "--replication", "--pp", "--tg",
            "--batch", "--reps", "-m", "--model", "--repack", "--transport", "--workers",
            "--ext-threads"};
        bool known = false;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
            known |= !strcmp(o, with_value[k]);
        if (!known) {
            fprintf(stderr, "ecs-plan: unknown option %s\n", o);
            return usage(stderr);
        }
        if (!v) {
            fprintf(stderr, "ecs-plan: %s needs a value\n", o);
            return usage(stderr);
        }
        i++;
        int *num = !strcmp(o, "--worker-threads") ? &a->worker_threads
                 : !strcmp(o, "--threads")        ? &a->threads
                 : !strcmp(o, "--cores")          ? &a->cores
                 : !strcmp(o, "--replication")    ? &a->replication
                 : !strcmp(o, "--pp")             ? &a->pp
                 : !strcmp(o, "--tg")             ? &a->tg
                 : !strcmp(o, "--batch")          ? &a->batch
                 : !strcmp(o, "--reps")           ? &a->reps
                                                  : NULL;
        if (num == &a->replication && !strcmp(v, "auto")) {
            a->replication = 0;
        } else if (num) {
            char *end;
            long l = strtol(v, &end, 10);
            if (*end || l < 1 || l > 4096) {
                fprintf(stderr, "ecs-plan: %s: bad value '%s'\n", o, v);
                return 2;
            }
            *num = (int)l;
        } else if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
            a->model = v;
        } else if (!strcmp(o, "--ext-threads")) {
            char *end;
            a->ext_threads = strtod(v, &end);
            if (*end || !(a->ext_threads >= 0 && a->ext_threads <= 1e6)) {
                fprintf(stderr, "ecs-plan: --ext-threads: bad count '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(o, "--repack")) {
            a->repack_dir = v;
        } else if (!strcmp(o, "--transport")) {
            if (strcmp(v, "ipc") && strcmp(v, "tcp")) {
                fprintf(stderr, "ecs-plan: --transport: ipc or tcp, not '%s'\n", v);
                return 2;
            }
            a->transport = v;
        } else if (!strcmp(o, "--workers")) {
            a->n_layouts = 0;
            for (const char *p = v; *p;) {
                char *end;
                long l = strtol(p, &end, 10);
                if (end == p || l < 0 || l > PLAN_MAX_WORKERS || a->n_layouts == MAX_LAYOUTS ||
                    (*end && *end != ',')) {
                    fprintf(stderr, "ecs-plan: --workers: bad list '%s'\n", v);
                    return 2;
                }
                a->workers[a->n_layouts++] = (int)l;
                p = *end ? end + 1 : end;
            }
        } else {
            fprintf(stderr, "ecs-plan: unknown option %s\n", o);
            return usage(stderr);
        }
    }
    if (!a->model) {
        fprintf(stderr, "ecs-plan: -m MODEL is required\n");
        return usage(stderr);
    }
    if (a->pp > PLAN_STEP_ROWS || a->batch > PLAN_STEP_ROWS) {
        fprintf(stderr, "ecs-plan: --pp and --batch are at most %d\n", PLAN_STEP_ROWS);
        return 2;
    }
    if (!a->cores)
        a->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (!a->threads)
        a->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return 0;
}

static int wthreads(const args_t *a, int n)
{
    if (a->worker_threads)
        return a->worker_threads;
    const int t = (int)sysconf(_SC_NPROCESSORS_ONLN) / (n > 0 ? n : 1);
    return t > 0 ? t : 1;
}

/* The dispatcher's placement of the layout, as a holders table. */
static int16_t *holders(const arch_hparams_t *hp, int n, int r)
{
    dispatch_shape_t s = {.n_layer = hp->n_layer, .first_moe = hp->n_layer_dense,
                          .n_expert = hp->n_expert};
    placement_worker_t w[PLAN_MAX_WORKERS];
    char ids[PLAN_MAX_WORKERS][16];
    for (int i = 0; i < n; i++) {
        snprintf(ids[i], sizeof ids[i], "w%d", i);
        w[i] = (placement_worker_t){ids[i], 1};
    }
    placement_t *p;
    if (placement_make(&s, w, n, r, &p) != ECS_OK)
        return NULL;
    const int L = hp->n_layer - hp->n_layer_dense;
    int16_t *h = malloc((size_t)L * (size_t)hp->n_expert * (size_t)r * sizeof *h);
    for (int l = 0; h && l < L; l++)
        for (int e = 0; e < hp->n_expert; e++) {
            const int16_t *hw;
            const int nh = placement_holders(p, hp->n_layer_dense + l, e, &hw);
            for (int j = 0; j < r; j++)
                h[((size_t)l * hp->n_expert + e) * r + j] = nh > 0 ? hw[j % nh] : 0;
        }
    placement_free(p);
    return h;
}

static void print_layout_name(char *buf, size_t cap, const plan_layout_t *l)
{
    if (!l->n_workers)
        snprintf(buf, cap, "one process, %d threads", l->coord_threads);
    else
        snprintf(buf, cap, "%d worker%s x %d thr%s", l->n_workers, l->n_workers > 1 ? "s" : "",
                 l->worker_threads, l->replication > 1 ? ", repl" : "");
}

#define GB(x) ((double)(x) / 1e9)

/* The memory arithmetic of the files every layout reads (pages.c): a
 * warning when they exceed what the page cache can hold together. */
static void print_memory(const args_t *a, const meas_pages_t *pg, bool spawnable)
{
    const uint64_t room = ecs_mem_available(), mine = pg->gguf_bytes + pg->copy_bytes;
    uint64_t layouts = 0, largest = 0;
    for (int i = 0; spawnable && i < a->n_layouts; i++) {
        const int n = a->workers[i], r = layout_replication(a, n);
        const uint64_t b =
            n && !pg->no_repack ? pg->routed_bytes * (uint64_t)meas_copies(n, r) : 0;
        layouts += b;
        largest = b > largest ? b : largest;
    }
    printf("memory: %.2f GB available to the page cache; the model's files %.2f GB (GGUF %.2f + "
           "one-process decode copy %.2f), the worker layouts' decode copies %.2f GB (largest "
           "%.2f; routed experts %.2f GB a copy)\n", GB(room), GB(mine), GB(pg->gguf_bytes),
           GB(pg->copy_bytes), GB(layouts), GB(largest), GB(pg->routed_bytes));
    if (room && (double)(mine + layouts) > PLAN_PAGES_FILL * (double)room)
        printf("  warning: these files (%.2f GB) exceed %.0f %% of the memory available (%.2f "
               "GB): each layout's phase is timed with its own copies read in first, the pages "
               "no later timing reads dropped when they would not fit (the planner's routed "
               "experts, the layouts timed before); a timing with cold copies gives no "
               "prediction\n", GB(mine + layouts), 100 * PLAN_PAGES_FILL, GB(room));
    if (room && (double)(largest + pg->keep_bytes) > PLAN_PAGES_FILL * (double)room)
        printf("  warning: the largest layout's copies alone (%.2f GB) do not fit: its timing "
               "will read cold pages\n", GB(largest));
}

/* The page cache around a layout's phase timing (pages.c). */
static void print_pages(const meas_pages_use_t *u)
{
    const plan_pages_t *p = &u->pages;
    printf("      pages: %d decode cop%s %.2f GB (%s) read in %.1f s, reclaim settled %.1f s "
           "later; resident %.1f %% before and %.1f %% after the timing%s\n", u->n_files,
           u->n_files == 1 ? "y" : "ies", GB(u->bytes),
           u->n_files ? "the workers' own" : "none: the GGUF's routed experts", u->warm_s,
           u->settle_s, 100 * u->before, 100 * u->after,
           u->warm ? "" : ": COLD, timed from the disk: no prediction for this layout");
    printf("        (room %.2f GB x %.1f; needs %.2f + the planner's %.2f; resident: the "
           "planner's routed experts %.2f, the layouts timed before %.2f => %s%s%s)\n",
           GB(p->room), PLAN_PAGES_FILL, GB(p->need), GB(p->keep), GB(p->own_routed),
           GB(p->others), u->evict & (PLAN_EVICT_OWN | PLAN_EVICT_OTHERS) ? "dropped" : "fits",
           u->evict & PLAN_EVICT_OWN ? " the planner's routed experts" : "",
           u->evict & PLAN_EVICT_OTHERS ? " the earlier layouts' copies" : "");
    if (u->evict & PLAN_NO_ROOM)
        printf("        warning: its copies alone exceed the room\n");
}

int main(int argc, char **argv)
{
    ecs_mem_keep_large(); /* multi-MB messages every layer (mem.h) */
    args_t a;
    int prc = parse(argc, argv, &a);
    if (prc)
        return prc == 1 ? 0 : prc;
    /* the link's server first: fork before any thread or ZeroMQ context */
    char bind[128];
    if (!strcmp(a.transport, "ipc"))
        snprintf(bind, sizeof bind, "ipc:///tmp/ecs-plan-%d.data", (int)getpid());
    else
        snprintf(bind, sizeof bind, "tcp://127.0.0.1:*");
    meas_server_t srv;
    if (meas_server_start(bind, &srv)) {
        fprintf(stderr, "ecs-plan: the round-trip server on %s did not start\n", bind);
        return 1;
    }
    char cache[4096];
    meas_pages_t pg = {0};
    model_opts_t mo = {.n_ctx = a.pp + a.tg + 16, .n_threads = a.threads, .profile = true,
                       .repack_dir = a.no_repack ? NULL
                                     : a.repack_dir ? a.repack_dir
                                                    : krepack_default_dir(cache, sizeof cache)};
    model_t *m, *mr = NULL;
    if (model_load(a.model, &mo, &m) != ECS_OK) {
        fprintf(stderr, "ecs-plan: %s\n", ecs_errmsg());
        meas_server_stop(&srv);
        return 1;
    }
    /* the pages ecs-run --bench touches before it times (the experts'
     * timings below would otherwise count first-touch page faults) */
    const double pf_s = model_prefault(m, false);
    const arch_hparams_t *hp = model_hparams(m);
    double load[3] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = 0;
        fclose(la);
    }
    printf("ecs-plan: %s  %s, %d layers (%d MoE), %d routed experts, k %d, n_embd %d\n", a.model,
           hp->arch == ARCH_DEEPSEEK2 ? "deepseek2" : "qwen3moe", hp->n_layer,
           hp->n_layer - hp->n_layer_dense, hp->n_expert, hp->n_expert_used, hp->n_embd);
    printf("machine: %d cores shared by every process; load average %.2f %.2f %.2f\n", a.cores,
           load[0], load[1], load[2]);

    plan_inputs_t in = {.n_layer_moe = hp->n_layer - hp->n_layer_dense,
                        .n_expert = hp->n_expert, .k = hp->n_expert_used, .n_embd = hp->n_embd};
    int rc = 1;
    bool cold[MAX_LAYOUTS] = {false}; /* phase timed from cold copies: no prediction */
    meas_trace_t tr = {0};
    bool have_trace = false;
    in.act_row_bytes = wire_act_bytes(m);
    printf("activations on the wire: %.0f bytes per row (f32: %d)\n", in.act_row_bytes,
           4 * hp->n_embd);
    printf("prefault: %.2f s (every page the one process reads, as ecs-run --bench)\n", pf_s);
    /* only a layout this machine runs as asked can be timed: spawned
     * workers on its own cores, over ipc as --spawn-workers connects them */
    const bool spawnable = a.cores == (int)sysconf(_SC_NPROCESSORS_ONLN) &&
                           !strcmp(a.transport, "ipc");
    meas_pages_init(m, a.no_repack, &pg);
    print_memory(&a, &pg, spawnable);
    /* 1. the link */
    meas_link_t lk;
    if (meas_link(srv.endpoint, hp->n_embd, hp->n_expert_used, a.quick, &lk)) {
        fprintf(stderr, "ecs-plan: round trips to %s failed\n", srv.endpoint);
        goto out;
    }
    meas_server_stop(&srv);
    in.alpha_s = lk.alpha_s, in.beta_s = lk.beta_s;
    printf("\ninputs, measured now:\n");
    printf("  link (%s, mux round trip, empty compute, median):", a.transport);
    for (int p = 0; p < lk.n; p++)
        printf("%s%d rows + %d results %.0f us", p ? ", " : " ", lk.rows[p], lk.entries[p],
               lk.med_s[p] * 1e6);
    printf("\n    => alpha %.1f us per call + beta %.3f ms per MB (both ways)\n", lk.alpha_s * 1e6,
           lk.beta_s * 1e9);
    /* 2. the coordinator: as one process (its experts in line), and with
     * its experts out (wait() sleeps a round trip per MoE layer, not
     * counted), for the layouts with workers */
    plan_inputs_t in_remote;
    /* the coordinator of the layouts with workers, loaded as ecs-run
     * --spawn-workers loads it (its own decode copy without the routed
     * experts, those pages touched first): its timing and the phases run
     * on it. Timed on the one-process model instead, the full ds2-lite's
     * phase took 2.47 ms a decode call with 1 worker where ecs-run's took
     * ~1.6 (docs/benchmarks.md, "The planner's worker decode phase"). */
    bool any_workers = false;
    for (int i = 0; i < a.n_layouts; i++)
        any_workers |= a.workers[i] > 0;
    if (any_workers) {
        model_opts_t mro = mo;
        mro.experts_remote = true;
        if (model_load(a.model, &mro, &mr) != ECS_OK) {
            fprintf(stderr, "ecs-plan: the coordinator with remote experts: %s\n", ecs_errmsg());
            goto out;
        }
        (void)model_prefault(mr, true);
    }
    for (int remote = 0; remote < 2; remote++) {
        meas_coord_t mc;
        if (remote && !mr)
            mr = m; /* no layout with workers: its figures are printed, never used */
        if (meas_coord(remote ? mr : m, a.pp, a.tg, a.quick ? 1 : a.reps,
                       remote ? (long)(lk.alpha_s * 1e9) : 0, &mc)) {
            fprintf(stderr, "ecs-plan: timing the coordinator: %s\n", ecs_errmsg());
            goto out;
        }
        plan_inputs_t *p = remote ? &in_remote : &in;
        if (remote)
            *p = in;
        const double d0 = (a.tg - 1) / 2.0;
        p->dec_ctx_s = (mc.tgd_s - mc.tg0_s) / a.pp > 0 ? (mc.tgd_s - mc.tg0_s) / a.pp : 0;
        p->dec_s = mc.tg0_s - d0 * p->dec_ctx_s;
        p->dec_row_s = (mc.batch_s - mc.tg0_s) / (mc.batch - 1) > 0
                           ? (mc.batch_s - mc.tg0_s) / (mc.batch - 1) : 0;
        p->pp_row_s = mc.pp_s / a.pp;
        p->shexp_dec_s = mc.sh_tg_s > 0 ? mc.sh_tg_s : 0;
        p->shexp_pp_row_s = mc.sh_pp_s > 0 ? mc.sh_pp_s / a.pp : 0;
        /* what the threads demand of the cores: a busy machine's share
         * (printed) is in every wall time measured */
        p->coord_cpu_ratio = a.threads;
        printf("  coordinator (%d threads, a null expert backend%s; median of %d):\n", a.threads,
               remote ? " whose wait sleeps alpha per MoE layer, as with workers"
                      : " returning at once, as one process",
               a.quick ? 1 : a.reps);
        printf("    decode step %.3f ms at depth 0 + %.3f us per cached token; +%.3f ms per extra "
               "row (%d rows: %.3f ms)\n", p->dec_s * 1e3, p->dec_ctx_s * 1e6, p->dec_row_s * 1e3,
               mc.batch, mc.batch_s * 1e3);
        printf("    prompt step of %d rows %.1f ms = %.3f ms per row\n", a.pp, mc.pp_s * 1e3,
               p->pp_row_s * 1e3);
        printf("    shared experts within: %.3f ms per decode step, %.3f ms per prompt row (got %.0f "
               "%% of %d threads' time)\n", p->shexp_dec_s * 1e3, p->shexp_pp_row_s * 1e3,
               100 * mc.sh_cpu_ratio / a.threads, a.threads);
    }
    const double d0 = (a.tg - 1) / 2.0;
    /* the routings the measured run computes, replayed to kmoe and the workers */
    have_trace = meas_trace(m, a.pp, a.tg, &tr) == 0;
    if (have_trace) {
        int dec = 0, pp = 0;
        for (int j = 0; j < tr.n; j++)
            dec += tr.rows[j] == 1, pp += tr.rows[j] == PLAN_STEP_ROWS;
        printf("  routings replayed (ecs-run --bench's prompt, greedy decode; the model's own "
               "router): %d one-row calls, %d calls of %d rows\n", dec, pp, PLAN_STEP_ROWS);
    } else {
        printf("  routings: uniform draws (recording the model's failed: %s)\n", ecs_errmsg());
    }
    /* 3. the experts, for every thread count a layout uses */
    bool need[PLAN_MAX_THREADS + 1] = {false};
    for (int i = 0; i < a.n_layouts; i++) {
        const int t = a.workers[i] ? wthreads(&a, a.workers[i]) : a.threads;
        if (t > PLAN_MAX_THREADS) {
            fprintf(stderr, "ecs-plan: at most %d threads\n", PLAN_MAX_THREADS);
            goto out;
        }
        need[t] = true;
    }
    int ext_from = -1;
    double ext = 0;
    printf("  routed experts (kmoe, the routings above for the calls through all k slots, "
           "uniform draws for the others; median call):\n");
    for (int t = 1; t <= PLAN_MAX_THREADS; t++) {
        if (!need[t])
            continue;
        meas_expert_t me;
        if (meas_experts(m, t, have_trace ? &tr : NULL, a.quick, &me)) {
            fprintf(stderr, "ecs-plan: timing kmoe with %d threads: %s\n", t, ecs_errmsg());
            goto out;
        }
        in.ex[t] = me.cost;
        printf("    %d thread%s:", t, t > 1 ? "s" : "");
        for (int i = 0; i < me.n; i++)
            printf("%s%d experts %d pairs %.3f ms", i ? ", " : " ", me.experts[i], me.pairs[i],
                   me.wall_s[i] * 1e3);
        printf("\n      => %.1f us per call + %.1f us per expert + %.2f us per pair (got %.0f %% of "
               "the threads' time)\n", me.cost.x0 * 1e6, me.cost.xe * 1e6, me.cost.xp * 1e6,
               100 * me.cpu_share);
        /* the other processes' runnable threads, from what this one got:
         * T threads each getting v = cores / (ext + T) of a core */
        if (ext_from < 0) {
            ext_from = t;
            if (me.cpu_share > 0 && me.cpu_share < 0.95)
                ext = a.cores / me.cpu_share - t;
            ext = ext > 0 ? ext : 0;
        }
    }
    in.ext_threads = a.ext_threads >= 0 ? a.ext_threads : ext;
    memcpy(in_remote.ex, in.ex, sizeof in.ex);
    in_remote.ext_threads = in.ext_threads;
    printf("  other processes' runnable threads: %.1f (%s)\n", in.ext_threads,
           a.ext_threads >= 0 ? "--ext-threads"
                              : "from the share of a core the kmoe threads got: cores / share - "
                                "threads");

    /* 4. the expert phase of each layout with workers, as it runs: real
     * ecs-worker processes behind the model's own steps */
    meas_phase_t ph[MAX_LAYOUTS];
    memset(ph, 0, sizeof ph);
    memset(cold, 0, sizeof cold);
    if (!spawnable)
        printf("  expert phase: modelled (--cores or --transport describe another machine than "
               "the one --spawn-workers would use here)\n");
    else
        printf("  expert phase per MoE layer call with the layout's own workers (real ecs-worker "
               "processes, the dispatcher's transport, inside the model's own steps: pp%d, "
               "tg%d after it, tg%d; mean per call):\n", a.pp, a.tg, a.tg);
    for (int i = 0; i < a.n_layouts; i++) {
        const int n = a.workers[i];
        if (!n)
            continue;
        if (!spawnable) /* the layout asked for is not this machine's: modelled */
            continue;
        /* the workers' threads as ecs-run --spawn-workers sizes them unless
         * --worker-threads: a pool of every core, each call on all of them
         * (a decode call sent whole to one replica) or on its share */
        if (meas_phase(m, mr, n, a.worker_threads, layout_replication(&a, n),
                       a.no_repack ? "" : mo.repack_dir, a.pp, a.tg, a.quick, &pg, &ph[i]))
            goto out;
        cold[i] = !ph[i].pages.warm;
        const meas_phase_t *q = &ph[i];
        printf("    %d worker%s x %d thr: decode %.3f ms (slowest call %.3f ms round trip = "
               "%.3f compute + %.3f hand-offs; shared experts %.3f) | %d rows %.2f ms (%.2f = "
               "%.2f + %.2f; %.2f) [%d, %d calls]\n", n, n > 1 ? "s" : "", wthreads(&a, n),
               q->dec_phase_s * 1e3, q->dec_rtt_s * 1e3, q->dec_compute_s * 1e3,
               q->dec_handoff_s * 1e3, q->dec_shexp_s * 1e3, q->pp_rows, q->pp_phase_s * 1e3,
               q->pp_rtt_s * 1e3, q->pp_compute_s * 1e3, q->pp_handoff_s * 1e3,
               q->pp_shexp_s * 1e3, q->calls_dec, q->calls_pp);
        /* the coordinator's part of those steps, beside the null backend's
         * that the prediction takes (a check of the sum, not an input) */
        const double null_dec = in_remote.dec_s + (d0 + a.pp / 2.0) * in_remote.dec_ctx_s -
                                in_remote.shexp_dec_s; /* at the runs' mean depth */
        printf("      outside the phases: %.3f ms a token, %.1f ms a prompt step (null backend: "
               "%.3f, %.1f)\n", q->dec_outside_s * 1e3, q->pp_outside_s * 1e3, null_dec * 1e3,
               (in_remote.pp_row_s - in_remote.shexp_pp_row_s) * q->pp_rows * 1e3);
        print_pages(&q->pages);
    }

    /* 5. the predictions */
    printf("\npredictions (decode: tg%d from an empty context and after the %d-token prompt; "
           "prompt: pp%d):\n", a.tg, a.pp, a.pp);
    printf("  %-28s %10s %12s %10s %9s %10s\n", "layout", "decode", "decode@pp", "prompt",
           "busiest/", "link/step");
    printf("  %-28s %10s %12s %10s %9s %10s\n", "", "tok/s", "tok/s", "tok/s", "mean", "decode");
    plan_pred_t dec[MAX_LAYOUTS], decd, pr[MAX_LAYOUTS];
    plan_layout_t lay[MAX_LAYOUTS];
    int16_t *hold[MAX_LAYOUTS] = {0};
    for (int i = 0; i < a.n_layouts; i++) {
        const int n = a.workers[i];
        const int r = n ? layout_replication(&a, n) : 1;
        if (n)
            hold[i] = holders(hp, n, r);
        lay[i] = (plan_layout_t){.n_workers = n, .worker_threads = n ? wthreads(&a, n) : 0,
                                 .coord_threads = a.threads, .replication = r, .cores = a.cores,
                                 .batch = 1, .depth = (int)d0, .pp = a.pp, .holders = hold[i],
                                 .samples = 64, .seed = 7, .phase_dec_s = ph[i].dec_phase_s,
                                 .phase_pp_s = ph[i].pp_phase_s,
                                 .phase_pp_rows = ph[i].pp_rows};
        plan_layout_t ld = lay[i];
        ld.depth = a.pp + (int)d0;
        const plan_inputs_t *pi = n ? &in_remote : &in;
        if ((n && !hold[i]) || plan_decode(pi, &lay[i], &dec[i]) != ECS_OK ||
            plan_decode(pi, &ld, &decd) != ECS_OK || plan_prompt(pi, &lay[i], &pr[i]) != ECS_OK) {
            fprintf(stderr, "ecs-plan: %s\n", ecs_errmsg());
            goto out;
        }
        char name[64];
        print_layout_name(name, sizeof name, &lay[i]);
        if (cold[i]) { /* a figure from disk reads would be wrong, not slow */
            printf("  %-28s no prediction: its phase was timed from cold copies (resident %.0f "
                   "%% before, %.0f %% after)\n", name, 100 * ph[i].pages.before,
                   100 * ph[i].pages.after);
            printf("PLAN workers %d threads %d replication %d cold resident %.3f %.3f\n", n,
                   lay[i].worker_threads, r, ph[i].pages.before, ph[i].pages.after);
            continue;
        }
        printf("  %-28s %10.2f %12.2f %10.1f %9.2f %8.3fms\n", name, dec[i].tok_s, decd.tok_s,
               pr[i].tok_s, dec[i].imbalance, dec[i].link_s * 1e3);
        printf("PLAN workers %d threads %d replication %d decode %.3f decode_depth %.3f pp %.2f\n",
               n, lay[i].worker_threads ? lay[i].worker_threads : a.threads, r, dec[i].tok_s,
               decd.tok_s, pr[i].tok_s);
        if (a.batch > 1) {
            plan_layout_t lb = lay[i];
            lb.batch = a.batch;
            plan_pred_t pb;
            if (plan_decode(pi, &lb, &pb) == ECS_OK)
                printf("  %-28s batch %d: %.2f tok/s (%.3f ms per step)\n", "", a.batch,
                       pb.tok_s, pb.step_s * 1e3);
        }
    }
    printf("\nwhere the time goes (per decoded token | per %d-token prompt):\n", a.pp);
    for (int i = 0; i < a.n_layouts; i++) {
        if (cold[i])
            continue;
        char name[64];
        print_layout_name(name, sizeof name, &lay[i]);
        printf("  %s: step %.2f ms = coordinator %.2f + expert phases %.2f%s (modelled "
               "%.2f) | %.0f ms = %.0f + %.0f (modelled %.0f)\n", name, dec[i].step_s * 1e3,
               dec[i].coord_s * 1e3, dec[i].expert_s * 1e3,
               lay[i].n_workers ? " (shared experts overlapped inside)" : "",
               dec[i].model_expert_s * 1e3, pr[i].step_s * 1e3, pr[i].coord_s * 1e3,
               pr[i].expert_s * 1e3, pr[i].model_expert_s * 1e3);
        for (int w = 0; w < dec[i].n_workers; w++)
            printf("    w%d: decode %.2f pairs %.2f ms busy (%.0f %% of the step), %.1f KB out "
                   "%.1f KB back | prompt %.0f pairs %.0f ms busy (%.0f %%), %.1f MB out %.1f MB "
                   "back\n", w, dec[i].pairs[w], dec[i].busy_s[w] * 1e3,
                   100 * dec[i].busy_s[w] / dec[i].step_s, dec[i].bytes_out[w] / 1e3,
                   dec[i].bytes_in[w] / 1e3, pr[i].pairs[w], pr[i].busy_s[w] * 1e3,
                   100 * pr[i].busy_s[w] / pr[i].step_s, pr[i].bytes_out[w] / 1e6,
                   pr[i].bytes_in[w] / 1e6);
    }
    /* 6. micro-batch overlap: the prompt step cut in two halves, the
     * coordinator's half a against the experts' half f; f from the
     * planner's own prompt of half the rows (each expert's weights read
     * once per half, a call per half: what cutting costs) */
    printf("\nmicro-batch overlap (the %d-token step as 2 micro-batches in ping-pong, "
           "--micro-batches 2):\n", a.pp);
    for (int i = 0; i < a.n_layouts; i++) {
        if (!lay[i].n_workers || cold[i])
            continue;
        const plan_pred_t *p = &pr[i];
        plan_layout_t hl = lay[i];
        plan_pred_t h;
        hl.pp = a.pp / 2 > 0 ? a.pp / 2 : 1;
        if (plan_prompt(&in_remote, &hl, &h) != ECS_OK) {
            fprintf(stderr, "ecs-plan: %s\n", ecs_errmsg());
            goto out;
        }
        double busiest = 0, work = 0, hbusiest = 0;
        for (int w = 0; w < p->n_workers; w++) {
            busiest = p->busy_s[w] > busiest ? p->busy_s[w] : busiest;
            hbusiest = h.busy_s[w] > hbusiest ? h.busy_s[w] : hbusiest;
            work += h.busy_s[w] * in.ex[lay[i].worker_threads].cpu_ratio;
        }
        const double A = p->coord_s, F = busiest + p->link_s, Fh = hbusiest + h.link_s;
        const double busy_f = Fh > 0 ? work / Fh : 0, serial = A + F;
        const double here = plan_overlap(A / 2, Fh, in_remote.coord_cpu_ratio, busy_f, 2, a.cores);
        const double apart = plan_overlap(A / 2, Fh, in_remote.coord_cpu_ratio, busy_f, 2, 1 << 20);
        char name[64];
        print_layout_name(name, sizeof name, &lay[i]);
        printf("  %s: coordinator %.0f ms + experts %.0f ms = %.0f ms serial (cut in two: "
               "experts 2 x %.0f ms); ping-pong on %d shared cores %.0f ms (%+.0f %% time); "
               "experts on cores of their own %.0f ms (%+.0f %%)\n",
               name, A * 1e3, F * 1e3, serial * 1e3, Fh * 1e3, a.cores, here * 1e3,
               100 * (here / serial - 1), apart * 1e3, 100 * (apart / serial - 1));
    }
    rc = 0;
out:
    if (have_trace)
        meas_trace_free(&tr);
    meas_server_stop(&srv);
    for (int i = 0; i < a.n_layouts; i++)
        free(hold[i]);
    meas_pages_free(&pg);
    if (mr != m)
        model_free(mr);
    model_free(m);
    return rc;
}
