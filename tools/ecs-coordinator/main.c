/* ecs-coordinator - the serving daemon: loads a model, budgets its memory
 * (weights mapped, workspace, KV slots) once at start-up and prints it, runs
 * the scheduler thread, and serves the OpenAI and Anthropic HTTP APIs from
 * one event-loop thread until SIGINT/SIGTERM (then shuts down cleanly).
 * Routed experts run in-process (the local backend), or on expert workers
 * (--spawn-workers N local ones, or --control ADDR for workers started by
 * hand): the same tokens either way. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/cli.h"
#include "coordinator/admin/admin.h"
#include "coordinator/api/api.h"
#include "coordinator/dispatch/dispatch.h"
#include "coordinator/model/model.h"
#include "coordinator/sched/sched.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "common/mem.h"

#define MAX_KEYS 256

typedef struct {
    const char *model, *http, *key_file, *model_id, *cache_dir, *admin,
               *admin_key, *admin_clients;
    double grace;
    int reasoning_budget;
    int threads, ctx, max_running, max_queue, chunk, idle_chunk, slice_units, slice_chunk;
    double slice_budget;
    model_cli_t mcli; /* --kv-type, --kv-f32, --repack, --no-repack, --no-amx */
    size_t kv_mem, max_body, max_header;
    double read_timeout, idle_timeout;
    bool no_prefix_cache, print_placement;
    tok_chat_kind_t chat_template; /* TOK_CHAT_NONE: the model's */
    dispatch_opts_t dispatch;
} args_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ecs-coordinator -m MODEL.gguf [--http HOST:PORT] [options]\n"
            "  --http HOST:PORT     address to serve on (default 127.0.0.1:8080; loopback\n"
            "                       unless you name another address)\n"
            "  --threads N          compute threads (default: all CPUs)\n"
            "  --ctx N              tokens per request context (default: min(trained, 4096))\n"
            "  --kv-type T          KV cache type: f16 (default), bf16 (AVX-512 BF16\n"
            "                       attention where the CPU has it), f32, q8 (deepseek2:\n"
            "                       half the bytes, faster deep decode, less precise);\n"
            "                       --kv-f32: f32\n"
            "  --kv-mem SIZE        bytes of the KV block pool, e.g. 512M, 4G (default: one\n"
            "                       context per --max-running, at most half the free memory)\n"
            "  --max-running N      requests generating at once (default 8)\n"
            "  --max-queue N        requests waiting before 503 (default 256)\n"
            "  --chunk N            prompt rows per chunk while streams decode; a prompt\n"
            "                       this short joins the decode batch whole (default 256)\n"
            "  --idle-chunk N       prompt rows per chunk while no stream decodes, --chunk\n"
            "                       .. 512 - --max-running (default: 512 - --max-running;\n"
            "                       larger is faster for long prompts)\n"
            "  --slice-budget X     while streams decode, a prompt chunk runs a few layers\n"
            "                       per step, so that a step takes about X decode steps\n"
            "                       (default 2.5; 0: off, a chunk runs every layer at once)\n"
            "  --slice-units N      exactly N half layers per slice, also with nothing\n"
            "                       decoding (for tests; default 0: by --slice-budget)\n"
            "  --slice-chunk N      prompt rows per chunk of a prompt that runs in slices\n"
            "                       (default 128; shorter slices, slower prompt; 0: --chunk)\n"
            "  --no-prefix-cache    full KV blocks are not kept (default: a later prompt\n"
            "                       with the same start reuses them)\n"
            "  --api-key-file FILE  require one of the keys in FILE (one per line)\n"
            "  --model-id NAME      model name of the API (default: the file name without .gguf)\n"
            "  --chat-template NAME render chats with a built-in template instead of the\n"
            "                       model's: deepseek2, deepseek3 or chatml (default: the\n"
            "                       model's, recognised; chatml when it has none)\n"
            "  --reasoning-budget N a thinking template's reasoning ends after N tokens when\n"
            "                       the request names no budget (-1: none, the default;\n"
            "                       0: at once)\n"
            "  --max-body SIZE      request body limit (default 8M)\n"
            "  --max-header SIZE    request line + headers limit (default 16K)\n"
            "  --read-timeout S     seconds to receive a whole request (default 30)\n"
            "  --idle-timeout S     seconds a kept-alive idle connection stays open (default 60)\n"
            "  --repack DIR         decode copy directory (see ecs-run); --no-repack: none\n"
            "  --no-amx             attention at depth without the tile unit (see ecs-run)\n"
            "  --prefix-cache-dir DIR  keep the prefix cache in DIR across restarts (written at\n"
            "                       a clean shutdown, read at start-up)\n"
            "  --admin ADDR         admin endpoint for ecsctl (default ipc:///tmp/ecs-admin-PORT,\n"
            "                       PORT the --http port; mode 0600); tcp://127.0.0.1:P; off\n"
            "  --admin-key FILE     CURVE key pair of the admin endpoint (ecsctl keygen); with\n"
            "  --admin-clients DIR  the *.pub keys of the ecsctl clients allowed in\n"
            "  --grace-period S     on SIGTERM/SIGINT, seconds running requests get to finish\n"
            "                       (default 30; new ones get 503 meanwhile; 0: stop at once)\n"
            "expert workers (default: experts in-process; the tokens are the same):\n"
            DISPATCH_USAGE
            "  --print-placement  print which worker holds which experts at start-up\n");
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ecs-coordinator: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}

static bool parse_size(const char *s, size_t *out)
{
    uint64_t v;
    if (!ecs_parse_size(s, &v) || v > SIZE_MAX)
        return false;
    *out = (size_t)v;
    return true;
}

static bool parse_secs(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0 && v < 1e7))
        return false;
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv, args_t *a)
{
    *a = (args_t){.http = "127.0.0.1:8080", .max_running = 8, .max_queue = 256, .chunk = 256,
                  .slice_budget = 2.5, .slice_chunk = 128,
                  .max_body = 8u << 20, .max_header = 16u << 10, .read_timeout = 30,
                  .idle_timeout = 60, .grace = 30, .reasoning_budget = -1};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (model_cli_flag(&a->mcli, o))
            continue;
        if (!strcmp(o, "--no-prefix-cache")) {
            a->no_prefix_cache = true;
            continue;
        }
        if (!strcmp(o, "--print-placement")) {
            a->print_placement = true;
            continue;
        }
        if (i + 1 >= argc)
            return fail("%s needs a value (see --help)", o);
        const char *v = argv[++i];
        const int dr = dispatch_parse_opt(&a->dispatch, o, v);
        const int mr = dr ? 0 : model_cli_opt(&a->mcli, o, v);
        if (dr < 0 || mr < 0)
            return fail("%s", ecs_errmsg());
        if (dr > 0 || mr > 0)
            continue;
        bool ok = true;
        if (!strcmp(o, "-m")) a->model = v;
        else if (!strcmp(o, "--http")) a->http = v;
        else if (!strcmp(o, "--api-key-file")) a->key_file = v;
        else if (!strcmp(o, "--model-id")) a->model_id = v;
        else if (!strcmp(o, "--chat-template"))
            ok = (a->chat_template = tok_chat_by_name(v)) != TOK_CHAT_UNKNOWN;
        else if (!strcmp(o, "--prefix-cache-dir")) a->cache_dir = v;
        else if (!strcmp(o, "--admin")) a->admin = v;
        else if (!strcmp(o, "--admin-key")) a->admin_key = v;
        else if (!strcmp(o, "--admin-clients")) a->admin_clients = v;
        else if (!strcmp(o, "--grace-period") && !strcmp(v, "0")) a->grace = 0;
        else if (!strcmp(o, "--grace-period")) ok = parse_secs(v, &a->grace);
        else if (!strcmp(o, "--reasoning-budget"))
            ok = ecs_parse_int(v, -1, INT32_MAX, &a->reasoning_budget);
        else if (!strcmp(o, "--threads")) ok = ecs_parse_int(v, 1, 1024, &a->threads);
        else if (!strcmp(o, "--ctx")) ok = ecs_parse_int(v, 2, MODEL_MAX_CTX, &a->ctx);
        else if (!strcmp(o, "--max-running")) ok = ecs_parse_int(v, 1, MODEL_MAX_BATCH / 2, &a->max_running);
        else if (!strcmp(o, "--max-queue")) ok = ecs_parse_int(v, 1, 1 << 20, &a->max_queue);
        else if (!strcmp(o, "--chunk")) ok = ecs_parse_int(v, 2 * MODEL_MLA_EXPAND_ROWS, MODEL_MAX_BATCH, &a->chunk);
        else if (!strcmp(o, "--idle-chunk")) ok = ecs_parse_int(v, 2 * MODEL_MLA_EXPAND_ROWS, MODEL_MAX_BATCH, &a->idle_chunk);
        else if (!strcmp(o, "--slice-budget") && !strcmp(v, "0")) a->slice_budget = 0;
        else if (!strcmp(o, "--slice-budget")) ok = parse_secs(v, &a->slice_budget) && a->slice_budget >= 1;
        else if (!strcmp(o, "--slice-units")) ok = ecs_parse_int(v, 0, 1 << 16, &a->slice_units);
        else if (!strcmp(o, "--slice-chunk") && !strcmp(v, "0")) a->slice_chunk = 0;
        else if (!strcmp(o, "--slice-chunk")) ok = ecs_parse_int(v, 2 * MODEL_MLA_EXPAND_ROWS, MODEL_MAX_BATCH, &a->slice_chunk);
        else if (!strcmp(o, "--kv-mem")) ok = parse_size(v, &a->kv_mem) && a->kv_mem > 0;
        else if (!strcmp(o, "--max-body")) ok = parse_size(v, &a->max_body) && a->max_body > 0;
        else if (!strcmp(o, "--max-header")) ok = parse_size(v, &a->max_header) && a->max_header >= 256;
        else if (!strcmp(o, "--read-timeout")) ok = parse_secs(v, &a->read_timeout);
        else if (!strcmp(o, "--idle-timeout")) ok = parse_secs(v, &a->idle_timeout);
        else return fail("unknown option %s (see --help)", o);
        if (!ok)
            return fail("%s: bad value '%s'%s", o, v, !strcmp(o, "--chat-template")
                        ? " (expected deepseek2, deepseek3 or chatml)" : "");
    }
    if (!a->model)
        return fail("-m MODEL.gguf is required (see --help)");
    if (a->cache_dir && a->no_prefix_cache)
        return fail("--prefix-cache-dir and --no-prefix-cache contradict each other");
    if (a->chunk + a->max_running > MODEL_MAX_BATCH)
        return fail("--chunk %d + --max-running %d exceed the %d rows of a step", a->chunk,
                    a->max_running, MODEL_MAX_BATCH);
    if (!a->idle_chunk)
        a->idle_chunk = MODEL_MAX_BATCH - a->max_running;
    if (a->idle_chunk < a->chunk || a->idle_chunk + a->max_running > MODEL_MAX_BATCH)
        return fail("--idle-chunk %d outside --chunk %d .. %d (512 - --max-running)",
                    a->idle_chunk, a->chunk, MODEL_MAX_BATCH - a->max_running);
    return 0;
}

/* "host:port", "[v6]:port" or ":port" (loopback). */
static int split_http(const char *s, char *host, size_t cap, int *port)
{
    const char *colon = strrchr(s, ':');
    if (!colon || !ecs_parse_int(colon + 1, 0, 65535, port))
        return fail("--http '%s': expected HOST:PORT", s);
    size_t n = (size_t)(colon - s);
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']')
        s++, n -= 2;
    if (n >= cap)
        return fail("--http '%s': host too long", s);
    if (n == 0)
        snprintf(host, cap, "127.0.0.1");
    else
        memcpy(host, s, n), host[n] = '\0';
    return 0;
}

/* One key per line; blank lines and lines starting with '#' are skipped. */
static int read_keys(const char *path, char ***out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return fail("--api-key-file %s: %s", path, strerror(errno));
    char **keys = calloc(MAX_KEYS + 1, sizeof *keys), line[4096];
    int n = 0, rc = 0, lineno = 0;
    while (keys && fgets(line, sizeof line, f)) {
        lineno++;
        /* a longer line would be cut into two keys, its first part accepted */
        if (!strchr(line, '\n') && !feof(f)) {
            rc = fail("--api-key-file %s: line %d is longer than %zu bytes", path, lineno,
                      sizeof line - 2);
            break;
        }
        size_t l = strcspn(line, "\r\n");
        line[l] = '\0';
        if (!l || line[0] == '#')
            continue;
        if (n == MAX_KEYS || !(keys[n++] = strdup(line))) {
            rc = fail("--api-key-file %s: too many keys or out of memory", path);
            break;
        }
    }
    fclose(f);
    if (!keys)
        return fail("out of memory");
    if (rc == 0 && n == 0)
        rc = fail("--api-key-file %s: no keys in it", path);
    *out = keys;
    return rc;
}

static void model_id_of(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf"))
        n -= 5;
    snprintf(out, cap, "%.*s", (int)n, b);
}

static char *state_json(void *arg) { return admin_state_json(arg); }

/* The admin endpoint (unless --admin off): ADDR, or ipc beside /tmp named
 * after the HTTP port. */
static int start_admin(const args_t *a, int port, admin_src_t *src, admin_t **out)
{
    char ep[300];
    if (a->admin && !strcmp(a->admin, "off"))
        return 0;
    if (a->admin)
        snprintf(ep, sizeof ep, "%s", a->admin);
    else
        snprintf(ep, sizeof ep, "ipc:///tmp/ecs-admin-%d", port);
    admin_opts_t ao = {.endpoint = ep, .src = src, .key_file = a->admin_key,
                       .clients_dir = a->admin_clients};
    if (admin_start(&ao, out) != ECS_OK)
        return fail("%s", ecs_errmsg());
    fprintf(stderr, "ecs-coordinator: admin endpoint %s (ecsctl --admin %s status)\n",
            admin_endpoint(*out), admin_endpoint(*out));
    return 0;
}

static int serve(const args_t *a, model_t *m, const tok_t *tok, char **keys, dispatch_t *dsp,
                 admin_src_t *src, admin_t **adm)
{
    char host[256], id[256];
    int port;
    if (split_http(a->http, host, sizeof host, &port))
        return 1;
    model_id_of(a->model, id, sizeof id);
    sched_opts_t so = {.n_ctx = model_n_ctx_max(m), .kv_mem = a->kv_mem,
                       .max_running = a->max_running, .max_queue = a->max_queue, .chunk = a->chunk,
                       .idle_chunk = a->idle_chunk,
                       .prefix_cache = !a->no_prefix_cache, .slice_budget = a->slice_budget,
                       .slice_units = a->slice_units,
                       .slice_chunk = a->slice_chunk < a->chunk ? a->slice_chunk : 0,
                       .kv_flag = a->mcli.kv_flag};
    sched_t *s = NULL;
    if (sched_new(m, tok, &so, &s) != ECS_OK)
        return fail("%s", ecs_errmsg());
    sched_stats_t st;
    sched_stats(s, &st);
    api_opts_t ao = api_opts_default();
    ao.host = host;
    ao.port = port;
    ao.model_id = a->model_id ? a->model_id : id;
    ao.max_body = a->max_body;
    ao.reasoning_budget = a->reasoning_budget;
    ao.max_header = a->max_header;
    ao.read_timeout_s = a->read_timeout;
    ao.idle_timeout_s = a->idle_timeout;
    ao.api_keys = (const char *const *)keys;
    ao.grace_s = a->grace;
    *src = (admin_src_t){.dispatch = dsp, .sched = s, .model_id = ao.model_id,
                         .started = admin_now()};
    ao.shutting_down = &src->shutting_down;
    ao.state_json = state_json;
    ao.state_arg = src;
    api_server_t *srv = NULL;
    int rc = 0;
    if (api_server_new(&ao, m, tok, s, &srv) != ECS_OK)
        rc = fail("%s", ecs_errmsg());
    else if (api_server_set_dispatch(srv, dsp), sched_start(s) != ECS_OK)
        rc = fail("%s", ecs_errmsg());
    else
        rc = start_admin(a, api_server_port(srv), src, adm);
    if (a->cache_dir) {
        int n_in, n_bad;
        long n_tok;
        if (sched_cache_load(s, a->cache_dir, &n_in, &n_bad, &n_tok) != ECS_OK)
            fprintf(stderr, "ecs-coordinator: warning: %s\n", ecs_errmsg());
        else
            fprintf(stderr, "prefix cache: %d blocks (%ld tokens) restored from %s%s\n", n_in, n_tok,
                    a->cache_dir, n_bad ? " (a file of another model or damaged blocks skipped)" : "");
    }
    struct stat sb;
    size_t wbytes = stat(a->model, &sb) == 0 ? (size_t)sb.st_size : 0;
    const int per_ctx = (so.n_ctx + MODEL_KV_BLOCK - 1) / MODEL_KV_BLOCK;
    fprintf(stderr,
            "memory: weights %.1f MB mapped, workspace %.1f MB, KV pool %d blocks x %d tokens = "
            "%.1f MB (%s, %zu bytes a block, %.1f KB/token, %s; %.1f contexts of %d tokens)%s\n",
            wbytes / 1e6, model_workspace_bytes(m) / 1e6, st.kv_blocks, MODEL_KV_BLOCK,
            st.kv_bytes / 1e6, st.kv_type, (size_t)st.kv_block_bytes,
            st.kv_block_bytes / 1e3 / MODEL_KV_BLOCK,
            a->kv_mem ? "--kv-mem" : "from free memory", (double)st.kv_blocks / per_ctx, so.n_ctx,
            st.kv_blocks < per_ctx * a->max_running
                ? " - less than --max-running whole contexts: long requests may wait or be preempted"
                : "");
    if (rc == 0) {
        fprintf(stderr, "ecs-coordinator: serving '%s' on http://%s:%d (context %d, %d running, "
                        "chat template %s)\n",
                ao.model_id, host, api_server_port(srv), so.n_ctx, a->max_running,
                tok_chat_kind_name(tok_chat_kind(tok)));
        fprintf(stderr,
                "  open  http://%s:%d/v1/models\n"
                "  try   curl -sN http://%s:%d/v1/chat/completions -H 'Content-Type: application/json' "
                "-d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}],"
                "\"max_tokens\":32,\"stream\":true}'\n"
                "  stop  Ctrl-C\n",
                host, api_server_port(srv), host, api_server_port(srv), ao.model_id);
        api_server_run(srv);
        fprintf(stderr, "ecs-coordinator: shutting down\n");
    }
    admin_stop(*adm); /* reads the scheduler: before it goes */
    sched_stop(s);
    if (a->cache_dir && rc == 0) {
        int n_out;
        long n_tok;
        if (sched_cache_save(s, a->cache_dir, &n_out, &n_tok) != ECS_OK)
            rc = fail("%s", ecs_errmsg());
        else
            fprintf(stderr, "prefix cache: %d blocks (%ld tokens) written to %s\n", n_out, n_tok,
                    a->cache_dir);
    }
    api_server_free(srv);
    sched_free(s);
    return rc;
}

int main(int argc, char **argv)
{
    ecs_mem_keep_large(); /* multi-MB messages every layer (mem.h) */
    args_t a;
    if (parse_args(argc, argv, &a))
        return 2;
    signal(SIGPIPE, SIG_IGN);
    char **keys = NULL;
    if (a.key_file && read_keys(a.key_file, &keys))
        return 2;
    char cache[4096];
    model_opts_t mo = {.n_ctx = a.ctx, .n_threads = a.threads,
                       .repack_dir = model_cli_repack_dir(&a.mcli, cache, sizeof cache),
                       .no_amx = a.mcli.no_amx,
                       .experts_remote = dispatch_wanted(&a.dispatch)};
    model_t *m = NULL;
    tok_t *tok = NULL;
    dispatch_t *dsp = NULL;
    admin_t *adm = NULL;
    static admin_src_t src; /* read by the admin thread until admin_stop */
    int rc = 0;
    a.dispatch.worker_repack = mo.repack_dir ? mo.repack_dir : "";
    if (dispatch_opts_check(&a.dispatch) != ECS_OK)
        rc = fail("%s", ecs_errmsg());
    else if (model_load(a.model, &mo, &m) != ECS_OK)
        rc = fail("%s", ecs_errmsg());
    else if (tok_load(model_gguf(m), &tok) != ECS_OK)
        rc = fail("%s: tokenizer: %s", a.model, ecs_errmsg());
    else if (dispatch_wanted(&a.dispatch) && dispatch_start(m, &a.dispatch, &dsp) != ECS_OK)
        rc = fail("%s", ecs_errmsg());
    if (rc == 0 && model_pages_note(m))
        fprintf(stderr, "ecs-coordinator: note: %s\n", model_pages_note(m));
    if (rc == 0 && a.chat_template != TOK_CHAT_NONE)
        tok_set_chat_kind(tok, a.chat_template);
    if (rc == 0 && dsp && a.print_placement)
        placement_write(dispatch_placement(dsp), stdout);
    if (rc == 0)
        rc = serve(&a, m, tok, keys, dsp, &src, &adm);
    if (m && model_repack_note(m))
        fprintf(stderr, "ecs-coordinator: note: %s\n", model_repack_note(m));
    tok_free(tok);
    dispatch_free(dsp); /* stops the workers it spawned */
    admin_free(adm);
    model_free(m);
    for (char **k = keys; k && *k; k++)
        free(*k);
    free(keys);
    return rc;
}
