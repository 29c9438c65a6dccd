/* test_wire.c - every message kind survives encode/decode unchanged; every
 * kind of broken frame (short, wrong magic/kind/flags/version/length, wrong
 * frame count, body that is not the named protobuf, counts, ids, ranges and
 * payload sizes that disagree) is refused with a message naming what was
 * wrong, and random bytes never get past the checks inconsistent.
 *
 * With ECS_WRITE_FUZZ_CORPUS=DIR set, wire.seeds also writes the encoded
 * messages there in fuzz_wire's input format (the checked-in seeds of
 * tests/fuzz/corpus/fuzz_wire came from it). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

#define EMBD 64

static uint8_t frame[1 << 16];

typedef struct {
    uint32_t experts[3], counts[3], rows[8], slots[8];
    float weights[8];
    float x[4 * EMBD];
} call_store_t;

/* A valid call: 4 rows, k = 2, experts 3 (rows 0, 2), 9 (rows 1, 2, 3),
 * 40 (rows 0, 1, 3). */
static wire_msg_t make_call(call_store_t *s)
{
    const uint32_t e[3] = {3, 9, 40}, c[3] = {2, 3, 3};
    const uint32_t r[8] = {0, 2, 1, 2, 3, 0, 1, 3}, sl[8] = {0, 1, 0, 0, 1, 1, 1, 0};
    memcpy(s->experts, e, sizeof e);
    memcpy(s->counts, c, sizeof c);
    memcpy(s->rows, r, sizeof r);
    memcpy(s->slots, sl, sizeof sl);
    for (int i = 0; i < 8; i++)
        s->weights[i] = 0.125f * (float)(i + 1);
    for (int i = 0; i < 4 * EMBD; i++)
        s->x[i] = (float)i * 0.5f - 3.0f;
    wire_msg_t m = {.kind = WIRE_CALL};
    m.call = (wire_call_t){.request_id = 0x123456789abcull, .layer = 7, .n_rows = 4,
                           .n_embd = EMBD, .dtype = ECS_TYPE_F32, .k = 2, .n_experts = 3,
                           .experts = s->experts, .expert_counts = s->counts, .n_entries = 8,
                           .row_index = s->rows, .slot = s->slots, .weight = s->weights,
                           .result_dtype = ECS_TYPE_F32, .threads = 3, .payload = s->x,
                           .payload_bytes = sizeof s->x};
    return m;
}

static size_t enc(const wire_msg_t *m)
{
    size_t n = 0, want = 0;
    cr_assert_eq(wire_frame_size(m, &want), ECS_OK);
    ecs_err_t e = wire_encode(m, frame, sizeof frame, &n);
    cr_assert_eq(e, ECS_OK, "encode %s: %s", wire_kind_name(m->kind), ecs_errmsg());
    cr_assert_eq(n, want);
    return n;
}

/* Decoding must fail, say something, and mention `needle`. */
static void expect_bad(const void *f, size_t len, const void *pl, size_t pll, bool has,
                       ecs_err_t code, const char *needle)
{
    wire_msg_t out;
    ecs_clear_error();
    ecs_err_t e = wire_decode(f, len, pl, pll, has, &out);
    cr_assert_eq(e, code, "want %s, got %s (%s)", ecs_errname(code), ecs_errname(e), ecs_errmsg());
    cr_assert(strstr(ecs_errmsg(), needle), "message \"%s\" does not mention \"%s\"",
              ecs_errmsg(), needle);
    cr_assert_null(out.pb_);
    wire_msg_clear(&out);
}

static void expect_bad_call(const wire_msg_t *m, const char *needle)
{
    size_t n;
    ecs_clear_error();
    cr_assert_neq(wire_encode(m, frame, sizeof frame, &n), ECS_OK, "encoder took it");
    cr_assert(strstr(ecs_errmsg(), needle), "encode: \"%s\" lacks \"%s\"", ecs_errmsg(), needle);
}

Test(wire, call_round_trip)
{
    call_store_t s;
    wire_msg_t m = make_call(&s);
    size_t n = enc(&m);
    wire_msg_t d;
    cr_assert_eq(wire_decode(frame, n, s.x, sizeof s.x, true, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.kind, WIRE_CALL);
    cr_assert_eq(d.version, WIRE_VERSION);
    const wire_call_t *c = &d.call;
    cr_assert_eq(c->request_id, m.call.request_id);
    cr_assert_eq(c->layer, 7);
    cr_assert_eq(c->n_rows, 4);
    cr_assert_eq(c->n_embd, EMBD);
    cr_assert_eq(c->k, 2);
    cr_assert_eq(c->n_experts, 3);
    cr_assert_eq(c->n_entries, 8);
    cr_assert_arr_eq(c->experts, s.experts, sizeof s.experts);
    cr_assert_arr_eq(c->expert_counts, s.counts, sizeof s.counts);
    cr_assert_arr_eq(c->row_index, s.rows, sizeof s.rows);
    cr_assert_arr_eq(c->slot, s.slots, sizeof s.slots);
    cr_assert_arr_eq(c->weight, s.weights, sizeof s.weights);
    cr_assert_eq(c->payload, s.x, "payload must point into the frame, not a copy");
    cr_assert_eq(c->payload_bytes, sizeof s.x);
    cr_assert_eq(c->threads, 3, "the call's thread count travels");
    cr_assert_not(c->shared);
    cr_assert_eq(wire_call_result_rows(c), 8, "one result row per entry");
    wire_msg_clear(&d);

    /* with the shared experts: the flag travels, and the result holds a
     * row per activation row after the entries' */
    m.call.shared = true;
    n = enc(&m);
    cr_assert_eq(wire_decode(frame, n, s.x, sizeof s.x, true, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert(d.call.shared);
    cr_assert_eq(wire_call_result_rows(&d.call), 8 + 4);
    wire_msg_clear(&d);
    m.call.shared = false;

    /* no weights, quantized rows */
    uint8_t q[4 * 34 * 2];
    memset(q, 1, sizeof q);
    m.call.weight = NULL;
    m.call.dtype = ECS_TYPE_Q8_0;
    m.call.payload = q;
    m.call.payload_bytes = 4 * wire_row_bytes(ECS_TYPE_Q8_0, EMBD);
    cr_assert_eq(m.call.payload_bytes, sizeof q);
    n = enc(&m);
    cr_assert_eq(wire_decode(frame, n, q, sizeof q, true, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_null(d.call.weight);
    cr_assert_eq(d.call.dtype, ECS_TYPE_Q8_0);
    wire_msg_clear(&d);
}

Test(wire, control_round_trips)
{
    const uint8_t fp[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, [31] = 0xff};
    const uint32_t layers[4] = {1, 1, 2, 5}, experts[4] = {0, 7, 7, 63};
    wire_msg_t ms[8] = {
        {.kind = WIRE_HELLO, .hello = {.min_version = 1, .max_version = 3, .fingerprint = fp,
                                       .fingerprint_len = 32, .worker_id = "w0",
                                       .host = "localhost", .pid = 4242, .threads = 2,
                                       .mem_budget = 12ull << 30, .device = "cpu",
                                       .capabilities = WIRE_CAP_RESULT_BF16,
                                       .data_endpoint = "ipc:///tmp/x"}},
        {.kind = WIRE_WELCOME, .welcome = {1, "coord", 500}},
        {.kind = WIRE_ASSIGN, .assign = {9, 4, layers, experts, true}},
        {.kind = WIRE_READY, .ready = {9, 1ull << 33, 123456}},
        {.kind = WIRE_HEARTBEAT, .heartbeat = {77, 1ull << 40, 3}},
        {.kind = WIRE_DRAIN, .drain = {"maintenance", 2500}},
        {.kind = WIRE_ERROR, .error = {WIRE_ST_OVER_BUDGET, "needs 13 GB, budget 12 GB", 0,
                                       WIRE_ASSIGN}},
        {.kind = WIRE_STATS, .stats = {1, 2, 3, 4, 5, 6, 7}},
    };
    for (int i = 0; i < 8; i++) {
        size_t n = enc(&ms[i]);
        wire_msg_t d;
        cr_assert_eq(wire_decode(frame, n, NULL, 0, false, &d), ECS_OK, "%s: %s",
                     wire_kind_name(ms[i].kind), ecs_errmsg());
        cr_assert_eq(d.kind, ms[i].kind);
        switch (d.kind) {
        case WIRE_HELLO:
            cr_assert_eq(d.hello.max_version, 3);
            cr_assert_eq(d.hello.fingerprint_len, 32);
            cr_assert_arr_eq(d.hello.fingerprint, fp, 32);
            cr_assert_str_eq(d.hello.worker_id, "w0");
            cr_assert_str_eq(d.hello.host, "localhost");
            cr_assert_str_eq(d.hello.device, "cpu");
            cr_assert_str_eq(d.hello.data_endpoint, "ipc:///tmp/x");
            cr_assert_eq(d.hello.pid, 4242);
            cr_assert_eq(d.hello.mem_budget, 12ull << 30);
            cr_assert_eq(d.hello.capabilities, WIRE_CAP_RESULT_BF16);
            break;
        case WIRE_WELCOME:
            cr_assert_str_eq(d.welcome.coordinator_id, "coord");
            cr_assert_eq(d.welcome.heartbeat_ms, 500);
            break;
        case WIRE_ASSIGN:
            cr_assert_eq(d.assign.n, 4);
            cr_assert_arr_eq(d.assign.layers, layers, sizeof layers);
            cr_assert_arr_eq(d.assign.experts, experts, sizeof experts);
            cr_assert(d.assign.shared, "Assign.shared travels");
            break;
        case WIRE_READY:
            cr_assert_eq(d.ready.bytes_mapped, 1ull << 33);
            break;
        case WIRE_HEARTBEAT:
            cr_assert_eq(d.heartbeat.seq, 77);
            cr_assert_eq(d.heartbeat.calls_in_flight, 3);
            break;
        case WIRE_DRAIN:
            cr_assert_str_eq(d.drain.reason, "maintenance");
            break;
        case WIRE_ERROR:
            cr_assert_eq(d.error.code, WIRE_ST_OVER_BUDGET);
            cr_assert_eq(d.error.about, WIRE_ASSIGN);
            cr_assert_str_eq(d.error.message, "needs 13 GB, budget 12 GB");
            break;
        case WIRE_STATS:
            cr_assert_eq(d.stats.dropped, 7);
            break;
        default:
            cr_assert_fail("kind %d", d.kind);
        }
        wire_msg_clear(&d);
        /* a control message never takes a payload frame */
        expect_bad(frame, n, "x", 1, true, ECS_ERR_FORMAT, "unexpected payload frame");
    }
}

Test(wire, result_round_trip_and_checks)
{
    float out[3 * EMBD];
    for (int i = 0; i < 3 * EMBD; i++)
        out[i] = (float)i;
    wire_msg_t m = {.kind = WIRE_RESULT,
                    .result = {.request_id = 5, .status = WIRE_ST_OK, .compute_ns = 999,
                               .n_entries = 3, .n_embd = EMBD, .dtype = ECS_TYPE_F32,
                               .payload = out, .payload_bytes = sizeof out}};
    size_t n = enc(&m);
    wire_msg_t d;
    cr_assert_eq(wire_decode(frame, n, out, sizeof out, true, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.result.compute_ns, 999);
    cr_assert_eq(d.result.payload, out);
    wire_msg_clear(&d);
    /* a payload frame that is one row short: refused, id still reported */
    expect_bad(frame, n, out, sizeof out - EMBD * 4, true, ECS_ERR_FORMAT, "payload");
    cr_assert_eq(wire_decode(frame, n, out, sizeof out - 4, true, &d), ECS_ERR_FORMAT);
    cr_assert_eq(d.kind, WIRE_RESULT);
    cr_assert_eq(d.result.request_id, 5);
    cr_assert_null(d.result.payload);
    wire_msg_clear(&d);
    expect_bad(frame, n, NULL, 0, false, ECS_ERR_FORMAT, "payload frame missing");

    /* an error result carries no rows */
    wire_msg_t er = {.kind = WIRE_RESULT,
                     .result = {.request_id = 6, .status = WIRE_ST_NOT_ASSIGNED,
                                .message = "layer 3 expert 9 is not held here"}};
    n = enc(&er);
    cr_assert_eq(wire_decode(frame, n, NULL, 0, true, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.result.status, WIRE_ST_NOT_ASSIGNED);
    cr_assert_str_eq(d.result.message, "layer 3 expert 9 is not held here");
    wire_msg_clear(&d);
    er.result.n_entries = 1;
    expect_bad_call(&er, "entries");
    m.result.dtype = ECS_TYPE_Q8_0;
    expect_bad_call(&m, "dtype");
    m.result.dtype = ECS_TYPE_F32;
    m.result.status = 99;
    expect_bad_call(&m, "status");
}

Test(wire, bad_calls_are_refused_naming_the_field)
{
    call_store_t s;
    wire_msg_t m;
#define BAD(mutation, needle) \
    do { m = make_call(&s); mutation; expect_bad_call(&m, needle); } while (0)
    BAD(m.call.request_id = 0, "request id 0");
    BAD(m.call.layer = WIRE_MAX_LAYERS, "layer");
    BAD(m.call.n_rows = 0, "n_rows");
    BAD(m.call.n_rows = WIRE_MAX_ROWS + 1, "n_rows");
    BAD(m.call.k = 0, "k 0");
    BAD(m.call.k = WIRE_MAX_SLOTS + 1, "k 65");
    BAD(m.call.dtype = ECS_TYPE_Q4_K, "dtype");
    BAD(m.call.dtype = 77, "dtype");
    BAD((m.call.dtype = ECS_TYPE_Q8_K, m.call.n_embd = 100), "dtype");
    BAD(m.call.result_dtype = ECS_TYPE_F16, "result dtype");
    BAD(s.experts[1] = 3, "strictly increasing");
    BAD(s.experts[2] = WIRE_MAX_EXPERTS, "strictly increasing");
    BAD(s.counts[0] = 0, "has 0 entries");
    BAD(s.counts[2] = 4, "entries");
    BAD(s.counts[2] = 2, "sum to 7");
    BAD(s.rows[3] = 4, "row 4");
    BAD(s.rows[1] = 0, "strictly increasing per expert");
    BAD(s.slots[5] = 2, "slot 2 >= k 2");
    BAD(s.weights[4] = NAN, "weight not finite");
    BAD(m.call.n_entries = 9, "entries");
    BAD(m.call.payload_bytes -= 4, "payload of");
    BAD(m.call.n_experts = 0, "0 experts");
    BAD(m.call.threads = WIRE_MAX_THREADS + 1, "1025 threads");
#undef BAD
}

/* The body must agree with the frames that came: decode a valid call with a
 * payload frame of another size, or the right size but a wrong header field. */
Test(wire, call_payload_frame_must_match)
{
    call_store_t s;
    wire_msg_t m = make_call(&s);
    size_t n = enc(&m);
    expect_bad(frame, n, s.x, sizeof s.x - 1, true, ECS_ERR_FORMAT, "the frame has");
    expect_bad(frame, n, s.x, sizeof s.x + 4, true, ECS_ERR_FORMAT, "the frame has");
    expect_bad(frame, n, NULL, 0, false, ECS_ERR_FORMAT, "payload frame missing");
    /* the request id of a refused call is known, so a worker can answer it */
    wire_msg_t d;
    cr_assert_eq(wire_decode(frame, n, s.x, 8, true, &d), ECS_ERR_FORMAT);
    cr_assert_eq(d.kind, WIRE_CALL);
    cr_assert_eq(d.call.request_id, m.call.request_id);
    wire_msg_clear(&d);
    /* ... also when the payload frame is missing altogether */
    cr_assert_eq(wire_decode(frame, n, NULL, 0, false, &d), ECS_ERR_FORMAT);
    cr_assert_eq(d.call.request_id, m.call.request_id);
    wire_msg_clear(&d);
}

Test(wire, header_checks)
{
    call_store_t s;
    wire_msg_t m = make_call(&s);
    const size_t n = enc(&m);
    uint8_t f[4096];
    cr_assert(n <= sizeof f);
    /* every truncation of a valid frame */
    for (size_t len = 0; len < n; len++)
        expect_bad(frame, len, s.x, sizeof s.x, true, ECS_ERR_FORMAT,
                   len < WIRE_HEADER_SIZE ? "shorter than" : "body bytes");
    /* one byte too many */
    memcpy(f, frame, n);
    f[n] = 0;
    expect_bad(f, n + 1, s.x, sizeof s.x, true, ECS_ERR_FORMAT, "body bytes");
#define MUT(i, v, code, needle) \
    do { memcpy(f, frame, n); f[i] = (v); \
         expect_bad(f, n, s.x, sizeof s.x, true, code, needle); } while (0)
    MUT(0, 'X', ECS_ERR_FORMAT, "bad magic");
    MUT(6, 0, ECS_ERR_FORMAT, "unknown message kind 0");
    MUT(6, WIRE_KIND_COUNT, ECS_ERR_FORMAT, "unknown message kind");
    MUT(7, 1, ECS_ERR_FORMAT, "reserved flags");
    MUT(4, WIRE_VERSION + 1, ECS_ERR_UNSUPPORTED, "protocol version 2");
    MUT(4, 0, ECS_ERR_UNSUPPORTED, "protocol version 0");
    MUT(11, 0x10, ECS_ERR_FORMAT, "body bytes"); /* body length 256 MiB + n */
    /* the header says Result but the body is a Call: fields disagree */
    MUT(6, WIRE_RESULT, ECS_ERR_FORMAT, "ExpertResult");
#undef MUT
    /* a Hello from a newer version still decodes (negotiation needs it) */
    const uint8_t fp[4] = {1, 2, 3, 4};
    wire_msg_t h = {.kind = WIRE_HELLO,
                    .hello = {.min_version = 1, .max_version = 2, .fingerprint = fp,
                              .fingerprint_len = 4, .worker_id = "w", .threads = 1,
                              .data_endpoint = "tcp://127.0.0.1:1"}};
    size_t hn = enc(&h);
    frame[4] = 2;
    wire_msg_t d;
    cr_assert_eq(wire_decode(frame, hn, NULL, 0, false, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.version, 2);
    cr_assert_eq(wire_negotiate(WIRE_VERSION_MIN, WIRE_VERSION, d.hello.min_version,
                                d.hello.max_version), 1);
    wire_msg_clear(&d);
    cr_assert_eq(wire_negotiate(1, 1, 2, 3), 0);
    cr_assert_eq(wire_negotiate(1, 4, 2, 3), 3);
}

Test(wire, bad_control_fields)
{
    const uint8_t fp[4] = {1, 2, 3, 4};
    const uint32_t l[2] = {1, 1}, e[2] = {5, 5};
    wire_msg_t h = {.kind = WIRE_HELLO,
                    .hello = {.min_version = 1, .max_version = 1, .fingerprint = fp,
                              .fingerprint_len = 4, .worker_id = "w", .threads = 1,
                              .data_endpoint = "tcp://127.0.0.1:1"}};
    wire_msg_t b = h;
    b.hello.worker_id = "";
    expect_bad_call(&b, "worker_id is empty");
    b = h;
    b.hello.fingerprint_len = 0;
    expect_bad_call(&b, "fingerprint");
    b = h;
    b.hello.min_version = 2;
    expect_bad_call(&b, "version range");
    b = h;
    b.hello.threads = 0;
    expect_bad_call(&b, "threads");
    b = h;
    b.hello.curve_public = "too-short-for-a-z85-key";
    expect_bad_call(&b, "curve_public of 23 characters");
    b = h; /* a 40-character key travels */
    b.hello.curve_public = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
    uint8_t kbuf[512];
    size_t kn;
    cr_assert_eq(wire_encode(&b, kbuf, sizeof kbuf, &kn), ECS_OK, "%s", ecs_errmsg());
    wire_msg_t kd;
    cr_assert_eq(wire_decode(kbuf, kn, NULL, 0, false, &kd), ECS_OK, "%s", ecs_errmsg());
    cr_assert_str_eq(kd.hello.curve_public, b.hello.curve_public);
    wire_msg_clear(&kd);
    char *big = malloc(WIRE_MAX_STRING + 2);
    cr_assert_not_null(big);
    memset(big, 'a', WIRE_MAX_STRING + 1);
    big[WIRE_MAX_STRING + 1] = 0;
    b = h;
    b.hello.host = big;
    expect_bad_call(&b, "host longer");
    free(big);
    wire_msg_t a = {.kind = WIRE_ASSIGN, .assign = {1, 2, l, e}};
    expect_bad_call(&a, "strictly increasing");
    wire_msg_t er = {.kind = WIRE_ERROR, .error = {WIRE_ST_OK, "x", 0, WIRE_NONE}};
    expect_bad_call(&er, "code 0");
    wire_msg_t w = {.kind = WIRE_WELCOME, .welcome = {WIRE_VERSION + 1, "c", 1}};
    expect_bad_call(&w, "version");
}

/* A hand-made body: Assign with 3 layers but 2 experts (valid protobuf,
 * inconsistent message). */
Test(wire, mismatched_parallel_arrays)
{
    const uint8_t body[] = {0x12, 3, 1, 2, 3, 0x1a, 2, 4, 5};
    uint8_t f[WIRE_HEADER_SIZE + sizeof body] = {'E', 'C', 'S', 'P', 1, 0, WIRE_ASSIGN, 0,
                                                 sizeof body, 0, 0, 0};
    memcpy(f + WIRE_HEADER_SIZE, body, sizeof body);
    expect_bad(f, sizeof f, NULL, 0, false, ECS_ERR_FORMAT, "3 layers but 2 experts");
    /* not a protobuf at all: field 0, wire type 7 */
    f[WIRE_HEADER_SIZE] = 0x07;
    expect_bad(f, sizeof f, NULL, 0, false, ECS_ERR_FORMAT, "not a valid ecs.Assign");
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random bodies behind a sound header, and random flips of a valid call:
 * either refused with a message or accepted and then consistent. */
Test(wire, random_bytes)
{
    call_store_t s;
    wire_msg_t m = make_call(&s);
    const size_t n = enc(&m);
    uint8_t good[4096], f[4096];
    memcpy(good, frame, n);
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        size_t len;
        if (it & 1) { /* flip 1..4 bytes of the body of a valid call */
            memcpy(f, good, n);
            len = n;
            for (int j = 0, nf = 1 + (int)(rnd() % 4); j < nf; j++)
                f[WIRE_HEADER_SIZE + rnd() % (n - WIRE_HEADER_SIZE)] ^= (uint8_t)(1 + rnd() % 255);
        } else {      /* a sound header of a random kind and a random body */
            size_t body = rnd() % 200;
            len = WIRE_HEADER_SIZE + body;
            memcpy(f, good, WIRE_HEADER_SIZE);
            f[6] = (uint8_t)(1 + rnd() % (WIRE_KIND_COUNT - 1));
            f[8] = (uint8_t)body;
            for (size_t j = 0; j < body; j++)
                f[WIRE_HEADER_SIZE + j] = (uint8_t)rnd();
        }
        const bool has = wire_kind_has_payload((wire_kind_t)f[6]);
        wire_msg_t d;
        ecs_clear_error();
        if (wire_decode(f, len, s.x, has ? sizeof s.x : 0, has, &d) == ECS_OK) {
            accepted++;
            cr_assert_eq(wire_check(&d), ECS_OK);
            if (d.kind == WIRE_CALL) {
                cr_assert_eq(d.call.payload_bytes,
                             d.call.n_rows * wire_row_bytes(d.call.dtype, d.call.n_embd));
                for (size_t j = 0; j < d.call.n_entries; j++)
                    cr_assert_lt(d.call.row_index[j], d.call.n_rows);
            }
        } else {
            cr_assert(ecs_errmsg()[0], "a refusal without a message");
        }
        wire_msg_clear(&d);
    }
    cr_assert_gt(accepted, 0, "nothing accepted: the mutations never kept a message valid");
}

/* fuzz_wire input: byte 0 bit 0 = a payload frame follows; bytes 1..4 = the
 * first frame's length (LE); then the first frame; the rest is the payload. */
static void write_seed(const char *dir, const char *name, const void *f0, size_t n0,
                       const void *pl, size_t npl, bool has)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "%s", path);
    uint8_t h[5] = {has, (uint8_t)n0, (uint8_t)(n0 >> 8), (uint8_t)(n0 >> 16), (uint8_t)(n0 >> 24)};
    fwrite(h, 1, 5, fp);
    fwrite(f0, 1, n0, fp);
    if (npl)
        fwrite(pl, 1, npl, fp);
    fclose(fp);
}

Test(wire, seeds)
{
    const char *dir = getenv("ECS_WRITE_FUZZ_CORPUS");
    call_store_t s;
    wire_msg_t m = make_call(&s);
    size_t n = enc(&m);
    if (dir)
        write_seed(dir, "call", frame, n, s.x, sizeof s.x, true);
    m.call.shared = true; /* the shared experts' flag set: its own seed */
    n = enc(&m);
    if (dir)
        write_seed(dir, "call_shared", frame, n, s.x, sizeof s.x, true);
    float out[2 * EMBD] = {0};
    wire_msg_t r = {.kind = WIRE_RESULT,
                    .result = {.request_id = 5, .n_entries = 2, .n_embd = EMBD,
                               .dtype = ECS_TYPE_F32, .payload = out,
                               .payload_bytes = sizeof out}};
    n = enc(&r);
    if (dir)
        write_seed(dir, "result", frame, n, out, sizeof out, true);
    const uint8_t fp[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint32_t l[2] = {0, 1}, e[2] = {3, 3};
    wire_msg_t ctl[4] = {
        {.kind = WIRE_HELLO, .hello = {.min_version = 1, .max_version = 1, .fingerprint = fp,
                                       .fingerprint_len = 8, .worker_id = "w", .threads = 1,
                                       .data_endpoint = "ipc:///tmp/w"}},
        {.kind = WIRE_ASSIGN, .assign = {1, 2, l, e, true}},
        {.kind = WIRE_ERROR, .error = {WIRE_ST_BAD_MESSAGE, "bad", 3, WIRE_CALL}},
        {.kind = WIRE_HEARTBEAT, .heartbeat = {1, 2, 3}},
    };
    for (int i = 0; i < 4; i++) {
        n = enc(&ctl[i]);
        if (dir)
            write_seed(dir, wire_kind_name(ctl[i].kind), frame, n, NULL, 0, false);
    }
}

/* The GPU work's appended fields: the prefetch hint of a call, the data
 * plane of a Welcome, a Hello's RDMA endpoint and VRAM budget, the tier
 * counters of Stats; round trips and the checks on them. */
Test(wire, gpu_fields)
{
    call_store_t s;
    wire_msg_t m = make_call(&s);
    const uint32_t pf[3] = {1, 4, 60};
    m.call.prefetch_layer = 8;
    m.call.n_prefetch = 3;
    m.call.prefetch = pf;
    size_t n = enc(&m);
    wire_msg_t d;
    cr_assert_eq(wire_decode(frame, n, s.x, sizeof s.x, true, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.call.prefetch_layer, 8);
    cr_assert_eq(d.call.n_prefetch, 3);
    cr_assert_arr_eq(d.call.prefetch, pf, sizeof pf);
    wire_msg_clear(&d);
    const uint32_t unordered[2] = {4, 4};
    m.call.n_prefetch = 2;
    m.call.prefetch = unordered;
    expect_bad_call(&m, "prefetch expert 1");
    m.call.prefetch_layer = WIRE_MAX_LAYERS;
    m.call.prefetch = pf;
    expect_bad_call(&m, "prefetch of 2 experts of layer");
    m.call.n_prefetch = 0; /* no hint: the layer is not looked at */
    n = enc(&m);
    cr_assert_eq(wire_decode(frame, n, s.x, sizeof s.x, true, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.call.n_prefetch, 0);
    wire_msg_clear(&d);

    uint8_t id[WIRE_NCCL_ID_BYTES], ep[WIRE_MAX_RDMA_EP + 1];
    for (size_t i = 0; i < sizeof id; i++)
        id[i] = (uint8_t)(i * 7 + 1);
    memset(ep, 0xab, sizeof ep);
    wire_msg_t w = {.kind = WIRE_WELCOME,
                    .welcome = {.version = 1, .coordinator_id = "c", .heartbeat_ms = 100,
                                .data_plane = WIRE_PLANE_NCCL, .nccl_id = id,
                                .nccl_id_len = sizeof id}};
    n = enc(&w);
    cr_assert_eq(wire_decode(frame, n, NULL, 0, false, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.welcome.data_plane, WIRE_PLANE_NCCL);
    cr_assert_eq(d.welcome.nccl_id_len, sizeof id);
    cr_assert_arr_eq(d.welcome.nccl_id, id, sizeof id);
    wire_msg_clear(&d);
    wire_msg_t b = w;
    b.welcome.nccl_id_len = 16;
    expect_bad_call(&b, "nccl id of 16 bytes");
    b = w;
    b.welcome.data_plane = WIRE_PLANE_ZMQ; /* an id without NCCL */
    expect_bad_call(&b, "nccl id");
    b = w;
    b.welcome.data_plane = WIRE_PLANE_RDMA;
    b.welcome.nccl_id_len = 0;
    expect_bad_call(&b, "rdma endpoint of 0 bytes");
    b.welcome.rdma_ep = ep;
    b.welcome.rdma_ep_len = WIRE_MAX_RDMA_EP;
    n = enc(&b);
    cr_assert_eq(wire_decode(frame, n, NULL, 0, false, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.welcome.rdma_ep_len, WIRE_MAX_RDMA_EP);
    wire_msg_clear(&d);
    b.welcome.data_plane = (wire_plane_t)7;
    expect_bad_call(&b, "data plane 7");

    const uint8_t fp[4] = {1, 2, 3, 4};
    wire_msg_t h = {.kind = WIRE_HELLO,
                    .hello = {.min_version = 1, .max_version = 1, .fingerprint = fp,
                              .fingerprint_len = 4, .worker_id = "w", .threads = 1,
                              .data_endpoint = "tcp://127.0.0.1:1", .device = "cuda:0",
                              .capabilities = WIRE_CAP_NCCL | WIRE_CAP_RDMA, .rdma_ep = ep,
                              .rdma_ep_len = 20, .vram_budget = 40ull << 30}};
    n = enc(&h);
    cr_assert_eq(wire_decode(frame, n, NULL, 0, false, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.hello.capabilities, WIRE_CAP_NCCL | WIRE_CAP_RDMA);
    cr_assert_eq(d.hello.rdma_ep_len, 20);
    cr_assert_eq(d.hello.vram_budget, 40ull << 30);
    wire_msg_clear(&d);
    h.hello.rdma_ep_len = WIRE_MAX_RDMA_EP + 1;
    expect_bad_call(&h, "rdma endpoint");

    wire_msg_t st = {.kind = WIRE_STATS,
                     .stats = {.calls = 5, .tier_uses = 100, .tier_hits = 60, .tier_streamed = 30,
                               .tier_cpu = 10, .tier_prefetched = 7, .tier_prefetch_used = 6,
                               .tier_slots = 24}};
    n = enc(&st);
    cr_assert_eq(wire_decode(frame, n, NULL, 0, false, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(d.stats.calls, 5);
    cr_assert_eq(d.stats.tier_uses, 100);
    cr_assert_eq(d.stats.tier_hits, 60);
    cr_assert_eq(d.stats.tier_streamed, 30);
    cr_assert_eq(d.stats.tier_cpu, 10);
    cr_assert_eq(d.stats.tier_prefetched, 7);
    cr_assert_eq(d.stats.tier_prefetch_used, 6);
    cr_assert_eq(d.stats.tier_slots, 24);
    wire_msg_clear(&d);
}

/* The quantized activation type both daemons derive from a layer's gate
 * and up: their common vec_dot type when the wire carries it. */
Test(wire, act_type_follows_the_weights)
{
    cr_assert_eq(wire_act_type(ECS_TYPE_Q4_K, ECS_TYPE_Q4_K, 2048), ECS_TYPE_Q8_K);
    cr_assert_eq(wire_act_type(ECS_TYPE_Q4_K, ECS_TYPE_Q6_K, 2048), ECS_TYPE_Q8_K);
    cr_assert_eq(wire_act_type(ECS_TYPE_Q8_0, ECS_TYPE_Q8_0, 256), ECS_TYPE_Q8_0);
    cr_assert_eq(wire_act_type(ECS_TYPE_Q4_0, ECS_TYPE_Q8_0, 256), ECS_TYPE_Q8_0);
    /* gate and up would take different rows: one payload cannot carry both */
    cr_assert_eq(wire_act_type(ECS_TYPE_Q4_K, ECS_TYPE_Q8_0, 2048), ECS_TYPE_F32);
    /* a width the type's blocks do not divide, float weights, unknown types */
    cr_assert_eq(wire_act_type(ECS_TYPE_Q4_K, ECS_TYPE_Q4_K, 2048 + 32), ECS_TYPE_F32);
    cr_assert_eq(wire_act_type(ECS_TYPE_F32, ECS_TYPE_F32, 2048), ECS_TYPE_F32);
    cr_assert_eq(wire_act_type(9999, ECS_TYPE_Q4_K, 2048), ECS_TYPE_F32);
}
