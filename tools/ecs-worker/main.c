/* ecs-worker - the expert worker daemon: holds a shard of a model's routed
 * experts and serves the coordinator's expert calls (worker/worker.h).
 * Links worker, proto, kernels and common only: never the coordinator. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cli.h"
#include "kernels/repack/repack.h"
#include "worker/worker.h"
#include "common/mem.h"

static worker_t *g_worker;

static void on_signal(int sig)
{
    (void)sig;
    worker_stop(g_worker);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ecs-worker -m MODEL.gguf --coordinator ADDR [options]\n"
            "  --coordinator ADDR  the coordinator's control endpoint (tcp://HOST:PORT, ipc://PATH);\n"
            "                      repeat it to serve several coordinators (M:N): it registers\n"
            "                      with each and holds the first one's assignment\n"
            "  --listen ADDR       where to take expert calls (default: beside an ipc\n"
            "                      coordinator, else tcp://127.0.0.1 on a free port; a\n"
            "                      remote coordinator needs e.g. tcp://0.0.0.0:5600)\n"
            "  --threads N         compute threads (default: all CPUs)\n"
            "  --mem-budget SIZE   most bytes of expert weights to hold (e.g. 12G, 512M);\n"
            "                      a larger assignment is refused (default: no limit)\n"
            "  --id NAME           this worker's id, unique per coordinator (default HOST-PID)\n"
            "  --device DEV        cpu (default); cuda:N: experts that fit --vram-budget stay\n"
            "                      in the GPU's memory, the rest are streamed or run on the\n"
            "                      CPU (needs libecs_cuda.so and a GPU); emu: the same path\n"
            "                      on a host emulation of the device (tests)\n"
            "  --vram-budget SIZE  device memory for experts and buffers (default: 90%% of free)\n"
            "  --repack DIR        cache of the interleaved copy of its experts (default:\n"
            "                      $ECS_CACHE_DIR, $XDG_CACHE_HOME/ecs or ~/.cache/ecs)\n"
            "  --no-repack         compute from the GGUF alone (same results, slower decode)\n"
            "  --pin-threads       thread i on the i-th CPU, handing the cores to and from a\n"
            "                      coordinator on the same cores pinned alike (a spawned\n"
            "                      worker gets it when its coordinator pins)\n"
            "  --curve-key FILE    CURVE on the coordinator links: this worker's key pair\n"
            "                      (PREFIX.key); needs --curve-server-key\n"
            "  --curve-server-key FILE  the coordinator's public key (PREFIX.pub)\n"
            "  --curve-clients DIR the coordinators' public keys (*.pub) allowed to call\n"
            "                      this worker (default: the --curve-server-key one)\n"
            "  -q, --quiet         log errors only\n");
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ecs-worker: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

int main(int argc, char **argv)
{
    ecs_mem_keep_large(); /* multi-MB messages every layer (mem.h) */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    worker_opts_t o = {.threads = ncpu > 0 ? (int)ncpu : 1};
    const char *coords[WORKER_MAX_COORDINATORS];
    int n_coords = 0;
    bool no_repack = false;
    char cache[4096];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o.quiet = true;
            continue;
        }
        if (!strcmp(a, "--no-repack")) {
            no_repack = true;
            continue;
        }
        if (!strcmp(a, "--pin-threads")) {
            o.pin_threads = true;
            continue;
        }
        static const char *const with_value[] = {"-m", "--coordinator", "--listen", "--threads",
                                                 "--mem-budget", "--id", "--device",
                                                 "--repack", "--vram-budget", "--curve-key",
                                                 "--curve-server-key", "--curve-clients"};
        bool known = false;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
            known |= !strcmp(a, with_value[k]);
        if (!known) {
            usage(stderr);
            return fail("unknown option '%s'", a);
        }
        if (i + 1 >= argc)
            return fail("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "-m")) o.model = v;
        else if (!strcmp(a, "--coordinator")) {
            if (n_coords >= WORKER_MAX_COORDINATORS)
                return fail("--coordinator: at most %d", WORKER_MAX_COORDINATORS);
            coords[n_coords++] = v;
        }
        else if (!strcmp(a, "--listen")) o.listen = v;
        else if (!strcmp(a, "--id")) o.id = v;
        else if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "--repack")) o.repack_dir = v;
        else if (!strcmp(a, "--curve-key")) o.curve_key = v;
        else if (!strcmp(a, "--curve-server-key")) o.curve_server_key = v;
        else if (!strcmp(a, "--curve-clients")) o.curve_clients = v;
        else if (!strcmp(a, "--threads")) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || end == v || n < 1 || n > 1024)
                return fail("--threads: bad count '%s' (1 to 1024)", v);
            o.threads = (int)n;
        } else if (!strcmp(a, "--mem-budget")) {
            if (!ecs_parse_size(v, &o.mem_budget))
                return fail("--mem-budget: bad size '%s' (e.g. 12G, 512M)", v);
        } else if (!strcmp(a, "--vram-budget")) {
            if (!ecs_parse_size(v, &o.vram_budget) || !o.vram_budget)
                return fail("--vram-budget: bad size '%s' (e.g. 40G, 512M)", v);
        }
    }
    if (!o.model)
        return fail("-m MODEL.gguf is required (see --help)");
    if (!n_coords)
        return fail("--coordinator ADDR is required (see --help)");
    o.coordinators = coords;
    o.n_coordinators = n_coords;
    if (o.vram_budget && (!o.device || !strcmp(o.device, "cpu")))
        return fail("--vram-budget needs --device cuda:N (or emu)");
    if (no_repack)
        o.repack_dir = NULL;
    else if (!o.repack_dir)
        o.repack_dir = krepack_default_dir(cache, sizeof cache);
    if (o.id && (!o.id[0] || strlen(o.id) >= 64))
        return fail("--id: 1 to 63 bytes");
    if (worker_new(&o, &g_worker) != ECS_OK)
        return fail("%s", ecs_errmsg());
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    ecs_err_t rc = worker_run(g_worker);
    if (rc != ECS_OK)
        fprintf(stderr, "ecs-worker: %s\n", ecs_errmsg());
    worker_free(g_worker);
    return rc == ECS_OK ? 0 : 1;
}
