/* ecsctl - the operator's tool: talks to an ecs-coordinator's admin
 * endpoint (proto/admin.h; a ZeroMQ DEALER, one request, one reply) and
 * prints the answer. Links proto and common only. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/cli.h"
#include "proto/admin.h"
#include "proto/curve.h"

#define DEFAULT_ADMIN "ipc:///tmp/ecs-admin-8080"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ecsctl [--admin ADDR] [--key FILE --server-key FILE] [--timeout S] [--json]\n"
            "              COMMAND [ARG]\n"
            "  status             the coordinator: workers live, requests, KV, tokens\n"
            "  workers            each worker: state, experts held, calls in flight, latency,\n"
            "                     restarts, last heartbeat\n"
            "  placement          which worker holds which experts (placement file format)\n"
            "  drain WORKER       move its experts to the other workers, then release it\n"
            "                     (no call fails; waits until done)\n"
            "  undrain WORKER     give it an even share of experts again\n"
            "  restart WORKER     restart it (a spawned worker; a remote one is asked to exit\n"
            "                     so that its service manager starts it again)\n"
            "  keygen PREFIX      make a CURVE key pair: PREFIX.pub (give it to peers) and\n"
            "                     PREFIX.key (mode 0600, keep it); for --admin-key, workers'\n"
            "                     and coordinators' keys and this tool's --key\n"
            "  --admin ADDR       the coordinator's --admin endpoint (default $ECS_ADMIN, else\n"
            "                     " DEFAULT_ADMIN ": a coordinator on --http port 8080)\n"
            "  --timeout S        seconds to wait for the answer (default 10; drain, undrain\n"
            "                     and restart 600)\n"
            "  --json             print the answer's JSON as it came\n"
            "  --key FILE         this client's key pair (keygen) for an admin endpoint with\n"
            "                     --admin-key; its .pub must be in the coordinator's\n"
            "                     --admin-clients directory\n"
            "  --server-key FILE  the admin endpoint's public key (the coordinator's .pub)\n");
}

static int die(const char *msg)
{
    fprintf(stderr, "ecsctl: %s\n", msg);
    return 1;
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static long long num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long long)json_integer_value(v)
           : json_is_real(v)  ? (long long)json_real_value(v) : 0;
}

static void print_status(json_t *r)
{
    json_t *w = json_object_get(r, "workers"), *q = json_object_get(r, "requests"),
           *kv = json_object_get(r, "kv"), *pc = json_object_get(r, "prefix_cache"),
           *t = json_object_get(r, "tokens");
    printf("model          %s (experts: %s)\n", str(r, "model"), str(r, "experts"));
    printf("uptime         %lld s%s\n", num(r, "uptime_s"),
           json_is_true(json_object_get(r, "shutting_down")) ? " (shutting down)" : "");
    printf("workers        %lld live of %lld\n", num(w, "live"), num(w, "total"));
    printf("operation      %s\n", str(r, "operation")[0] ? str(r, "operation") : "-");
    printf("requests       %lld running, %lld waiting\n", num(q, "running"), num(q, "waiting"));
    printf("kv blocks      %lld of %lld used (%.1f MB)\n", num(kv, "used"), num(kv, "blocks"),
           (double)num(kv, "bytes") / 1e6);
    printf("prefix cache   %lld of %lld prompt tokens served from it\n", num(pc, "hit_tokens"),
           num(pc, "lookup_tokens"));
    printf("tokens         %lld prompt, %lld generated in %lld steps\n", num(t, "prompt"),
           num(t, "generated"), num(r, "steps"));
}

static void print_workers(json_t *r)
{
    printf("%-12s %-10s %7s %7s %8s %10s %9s %9s %8s %9s  %s\n", "WORKER", "STATE", "PID",
           "EXPERTS", "INFLIGHT", "CALLS", "P50_US", "P99_US", "RESTARTS", "HEARD_MS", "NOTE");
    size_t i;
    json_t *w;
    json_array_foreach(r, i, w) {
        printf("%-12s %-10s %7lld %7lld %8lld %10lld %9lld %9lld %8lld %9lld  %s\n", str(w, "id"),
               str(w, "state"), num(w, "pid"), num(w, "experts"), num(w, "calls_in_flight"),
               num(w, "calls"), num(w, "latency_p50_us"), num(w, "latency_p99_us"),
               num(w, "restarts"), num(w, "last_heartbeat_ms"), str(w, "why"));
    }
}

/* Sends the request and waits for its reply (malloc'd, NUL-terminated). */
typedef struct {
    const char *key, *server_key;
} creds_t;

static int call(const char *ep, const creds_t *cr, const char *req, int timeout_ms, char **out)
{
    void *ctx = zmq_ctx_new(), *s = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
    int rc = 1, linger = 0;
    char msg[600];
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (!s) {
        rc = die("cannot make a ZeroMQ socket");
        goto done;
    }
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (cr->key) {
        curve_keypair_t kp;
        char spub[CURVE_Z85_LEN + 1];
        if (curve_load_keypair(cr->key, &kp) != ECS_OK ||
            curve_load_public(cr->server_key, spub) != ECS_OK ||
            curve_client_setup(s, &kp, spub) != ECS_OK) {
            rc = die(ecs_errmsg());
            goto done;
        }
    }
    if (zmq_connect(s, ep) != 0) {
        snprintf(msg, sizeof msg, "--admin %s: %s", ep, zmq_strerror(zmq_errno()));
        rc = die(msg);
        goto done;
    }
    if (zmq_send(s, req, strlen(req), 0) < 0) {
        rc = die("cannot send the request");
        goto done;
    }
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, timeout_ms) <= 0 || zmq_msg_recv(&m, s, 0) < 0) {
        snprintf(msg, sizeof msg, "no answer from %s in %d s (is the coordinator running with "
                 "--admin %s?)", ep, timeout_ms / 1000, ep);
        rc = die(msg);
        goto done;
    }
    const size_t n = zmq_msg_size(&m);
    if (!(*out = malloc(n + 1))) {
        rc = die("out of memory");
        goto done;
    }
    memcpy(*out, zmq_msg_data(&m), n);
    (*out)[n] = 0;
    rc = 0;
done:
    zmq_msg_close(&m);
    if (s)
        zmq_close(s);
    if (ctx)
        zmq_ctx_term(ctx);
    return rc;
}

int main(int argc, char **argv)
{
    const char *ep = getenv("ECS_ADMIN") ? getenv("ECS_ADMIN") : DEFAULT_ADMIN;
    int timeout_s = 0, i = 1;
    bool raw = false;
    creds_t cr = {0};
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            raw = true;
        } else if (!strcmp(argv[i], "--admin") && i + 1 < argc) {
            ep = argv[++i];
        } else if (!strcmp(argv[i], "--key") && i + 1 < argc) {
            cr.key = argv[++i];
        } else if (!strcmp(argv[i], "--server-key") && i + 1 < argc) {
            cr.server_key = argv[++i];
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            if (!ecs_parse_int(argv[++i], 1, 86400, &timeout_s))
                return die("--timeout: seconds from 1 to 86400");
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[i], "keygen")) {
        if (argc - i != 2) {
            fprintf(stderr, "ecsctl: keygen takes a PREFIX (PREFIX.pub and PREFIX.key)\n");
            return 2;
        }
        if (curve_keygen(argv[i + 1]) != ECS_OK)
            return die(ecs_errmsg());
        printf("wrote %s.pub (public: give it to peers) and %s.key (secret, mode 0600)\n",
               argv[i + 1], argv[i + 1]);
        return 0;
    }
    if ((cr.key != NULL) != (cr.server_key != NULL))
        return die("--key and --server-key go together");
    const int c = admin_cmd_parse(argv[i]);
    if (c < 0) {
        fprintf(stderr, "ecsctl: unknown command '%s'\n", argv[i]);
        usage(stderr);
        return 2;
    }
    admin_req_t q = {.cmd = (admin_cmd_t)c};
    const bool needs = admin_cmd_needs_worker(q.cmd);
    if (argc - i - 1 != (needs ? 1 : 0)) {
        fprintf(stderr, "ecsctl: %s %s\n", argv[i], needs ? "takes a worker id" : "takes no argument");
        return 2;
    }
    if (needs) {
        if (strlen(argv[i + 1]) >= sizeof q.worker)
            return die("worker id too long");
        snprintf(q.worker, sizeof q.worker, "%s", argv[i + 1]);
    }
    char *req = admin_req_encode(&q), *reply = NULL;
    if (!req)
        return die("bad worker id (printable, no spaces)");
    const int ms = (timeout_s ? timeout_s : needs ? 600 : 10) * 1000;
    int rc = call(ep, &cr, req, ms, &reply);
    free(req);
    if (rc)
        return rc;
    json_error_t je;
    json_t *o = json_loads(reply, 0, &je), *res = json_object_get(o, "result");
    if (!json_is_object(o)) {
        rc = die("the answer is not JSON");
    } else if (!json_is_true(json_object_get(o, "ok"))) {
        fprintf(stderr, "ecsctl: %s %s: %s\n", argv[i], needs ? argv[i + 1] : "",
                str(o, "error"));
        rc = 1;
    } else if (raw) {
        char *s = json_dumps(res, JSON_INDENT(2));
        printf("%s\n", s ? s : "null");
        free(s);
    } else if (q.cmd == ADMIN_STATUS) {
        print_status(res);
    } else if (q.cmd == ADMIN_WORKERS) {
        print_workers(res);
    } else if (q.cmd == ADMIN_PLACEMENT) {
        fputs(str(res, "text"), stdout);
    } else {
        printf("%s %s: %s\n", argv[i], argv[i + 1], str(res, "message"));
    }
    json_decref(o);
    free(reply);
    return rc;
}
