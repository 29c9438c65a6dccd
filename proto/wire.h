/* wire.h - ECS's wire messages: a fixed header, a protobuf-c body and, for
 * data messages, a payload frame; encoding, decoding and validation.
 *
 * Contract. A message is one ZeroMQ frame [header | body] plus, for
 * WIRE_CALL and WIRE_RESULT only, exactly one payload frame:
 *
 *   header (WIRE_HEADER_SIZE = 12 bytes, little endian)
 *     u32 magic   WIRE_MAGIC ("ECSP")
 *     u16 version protocol version of the sender (WIRE_VERSION)
 *     u8  kind    wire_kind_t (== ecs.Kind in proto/ecs.proto)
 *     u8  flags   0 (reserved; a set bit is rejected)
 *     u32 length  body bytes that follow; the frame is exactly 12 + length
 *   body     the packed protobuf message the kind names (proto/ecs.proto)
 *   payload  CALL: n_rows activation rows; RESULT: one row per entry
 *
 * Random bytes can decode as a "valid" protobuf, so wire_decode() trusts
 * nothing: magic, version, kind, flags, exact length, the protobuf itself,
 * then every count, id, dtype, range and the payload's size are checked
 * before a caller may touch the payload. A failure returns ECS_ERR_FORMAT
 * (ECS_ERR_UNSUPPORTED for a version this side does not speak) and a message
 * that names the field; out->kind and the request id (if the body got that
 * far) are still filled so that the receiver can answer the right call.
 * wire_encode() runs the same checks, so nothing a peer would reject is sent.
 *
 * A decoded message points into the frames it came from (payload) and into
 * memory it owns (arrays, strings): keep the frames alive while using it,
 * and release it with wire_msg_clear().
 *
 * Usage (send a call, decode what comes back):
 *
 *   wire_msg_t m = {.kind = WIRE_CALL, .call = {.request_id = 7, .layer = 3,
 *       .n_rows = 2, .n_embd = 2048, .dtype = ECS_TYPE_F32, .k = 6,
 *       .n_experts = 1, .experts = &e, .expert_counts = &cnt,
 *       .n_entries = 2, .row_index = rows, .slot = slots,
 *       .result_dtype = ECS_TYPE_F32, .payload = x,
 *       .payload_bytes = 2 * wire_row_bytes(ECS_TYPE_F32, 2048)}};
 *   size_t n;  wire_frame_size(&m, &n);  buf = malloc(n);
 *   if (wire_encode(&m, buf, n, &n) != ECS_OK) puts(ecs_errmsg());
 *   ... send buf (n bytes) with ZMQ_SNDMORE, then x (payload_bytes) ...
 *
 *   wire_msg_t r;
 *   if (wire_decode(frame0, len0, frame1, len1, true, &r) == ECS_OK &&
 *       r.kind == WIRE_RESULT) use(r.result.payload);
 *   wire_msg_clear(&r);
 */
#ifndef ECS_PROTO_WIRE_H
#define ECS_PROTO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/quant.h"

#define WIRE_MAGIC 0x50534345u /* bytes 'E' 'C' 'S' 'P' */
#define WIRE_VERSION 1u        /* highest protocol version this build speaks */
#define WIRE_VERSION_MIN 1u    /* lowest one */
#define WIRE_HEADER_SIZE 12u
/* Heartbeat intervals (Welcome.heartbeat_ms) a peer may stay silent before
 * the other side declares it gone: the coordinator declares the worker
 * dead, the worker registers again. Sane range 3-10. */
#define WIRE_LIVENESS 4u
/* The transport (mux.h) hands out every payload (a call's rows on the
 * worker, a result's rows on the coordinator) at an address aligned to
 * this; wire_decode itself takes the frames where they are. */
#define WIRE_PAYLOAD_ALIGN 8u

/* Bounds every decoder enforces (a peer cannot make us allocate or loop
 * beyond these). */
#define WIRE_MAX_BODY (1u << 20)            /* protobuf body bytes */
#define WIRE_MAX_PAYLOAD ((size_t)1 << 30)  /* payload frame bytes */
#define WIRE_MAX_ROWS 65536u                /* activation rows per call */
#define WIRE_MAX_EMBD 65536u                /* values per row */
#define WIRE_MAX_SLOTS 64u                  /* routing slots per row (k) */
#define WIRE_MAX_LAYERS 1024u
#define WIRE_MAX_THREADS 1024u              /* a call's thread count (a worker's --threads) */
#define WIRE_MAX_EXPERTS 4096u              /* expert ids are < this */
#define WIRE_MAX_STRING 1024u               /* any string field, bytes */
#define WIRE_MAX_FINGERPRINT 64u            /* model fingerprint bytes */

typedef enum {
    WIRE_NONE = 0,
    WIRE_HELLO = 1,     /* worker -> coordinator (control) */
    WIRE_WELCOME = 2,   /* coordinator -> worker (control) */
    WIRE_ASSIGN = 3,    /* coordinator -> worker (control) */
    WIRE_READY = 4,     /* worker -> coordinator (control) */
    WIRE_HEARTBEAT = 5, /* either way (control) */
    WIRE_DRAIN = 6,     /* coordinator -> worker (control) */
    WIRE_ERROR = 7,     /* either way (control or data) */
    WIRE_STATS = 8,     /* worker -> coordinator (control) */
    WIRE_CALL = 9,      /* coordinator -> worker (data, + payload frame) */
    WIRE_RESULT = 10,   /* worker -> coordinator (data, + payload frame) */
    WIRE_KIND_COUNT
} wire_kind_t;

/* ExpertResult.status and Error.code (== ecs.Status). */
typedef enum {
    WIRE_ST_OK = 0,
    WIRE_ST_BAD_MESSAGE = 1,
    WIRE_ST_VERSION = 2,
    WIRE_ST_FINGERPRINT = 3,
    WIRE_ST_NOT_ASSIGNED = 4,
    WIRE_ST_OVER_BUDGET = 5,
    WIRE_ST_NOT_READY = 6,
    WIRE_ST_DRAINING = 7,
    WIRE_ST_INTERNAL = 8,
    WIRE_ST_UNSUPPORTED = 9,
    WIRE_ST_COUNT
} wire_status_t;

/* Hello.capabilities bits (== 1 << ecs.Capability). */
#define WIRE_CAP_RESULT_BF16 (1u << 1)
#define WIRE_CAP_INPUT_Q8 (1u << 2)
/* Holds the shared experts on Assign.shared and computes them with the
 * routed ones (ExpertCall.shared). */
#define WIRE_CAP_SHARED (1u << 3)
/* Data planes (GPU work): payloads beside ZeroMQ (proto/dplane). */
#define WIRE_CAP_NCCL (1ull << 16)
#define WIRE_CAP_RDMA (1ull << 17)
/* Same host: calls and results through a shared-memory segment (proto/dplane). */
#define WIRE_CAP_SHM (1ull << 18)

/* Welcome.data_plane (== ecs.DataPlane). */
typedef enum { WIRE_PLANE_ZMQ = 0, WIRE_PLANE_NCCL = 1, WIRE_PLANE_RDMA = 2, WIRE_PLANE_SHM = 3,
               WIRE_PLANE_COUNT } wire_plane_t;
#define WIRE_NCCL_ID_BYTES 128u   /* sizeof(ncclUniqueId) */
#define WIRE_MAX_RDMA_EP 64u      /* bytes of a queue pair's address */

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint8_t kind;
    uint8_t flags;
    uint32_t body_len;
} wire_header_t;

/* Strings are NUL-terminated, at most WIRE_MAX_STRING bytes; NULL encodes
 * as "" and decodes as "" (never NULL). */
typedef struct {
    uint32_t min_version, max_version;
    const uint8_t *fingerprint; /* 1..WIRE_MAX_FINGERPRINT bytes */
    size_t fingerprint_len;
    const char *worker_id;      /* non-empty */
    const char *host;
    uint32_t pid;
    uint32_t threads;           /* >= 1 */
    uint64_t mem_budget;        /* bytes */
    const char *device;
    uint64_t capabilities;      /* WIRE_CAP_* */
    const char *data_endpoint;  /* non-empty: where the worker's ROUTER listens */
    const uint8_t *rdma_ep;     /* CAP_RDMA: 0..WIRE_MAX_RDMA_EP bytes (proto/dplane) */
    size_t rdma_ep_len;
    uint64_t vram_budget;       /* bytes of device memory for experts, 0: none */
    const char *curve_public;   /* the ROUTER's CURVE public key (40 Z85 chars), or ""/NULL:
                                 * plaintext. Trusted as much as the control link it came on */
} wire_hello_t;

typedef struct {
    uint32_t version;           /* negotiated, WIRE_VERSION_MIN..WIRE_VERSION */
    const char *coordinator_id;
    uint32_t heartbeat_ms;      /* <= 3600000 */
    wire_plane_t data_plane;    /* < WIRE_PLANE_COUNT */
    const uint8_t *nccl_id;     /* NCCL: exactly WIRE_NCCL_ID_BYTES; otherwise none */
    size_t nccl_id_len;
    const uint8_t *rdma_ep;     /* RDMA: 1..WIRE_MAX_RDMA_EP bytes; otherwise none */
    size_t rdma_ep_len;
    const char *shm_name;       /* SHM: the segment, "/name" (< 64 bytes); otherwise "" */
} wire_welcome_t;

/* Pairs (layers[i], experts[i]) strictly increasing by (layer, expert). */
typedef struct {
    uint64_t generation;
    size_t n;
    const uint32_t *layers;     /* < WIRE_MAX_LAYERS */
    const uint32_t *experts;    /* < WIRE_MAX_EXPERTS */
    bool shared;                /* also every MoE layer's shared experts (WIRE_CAP_SHARED) */
} wire_assign_t;

typedef struct {
    uint64_t generation, bytes_mapped, load_ns;
} wire_ready_t;

typedef struct {
    uint64_t seq, time_ns;
    uint32_t calls_in_flight;
} wire_heartbeat_t;

typedef struct {
    const char *reason;
    uint32_t deadline_ms;
} wire_drain_t;

typedef struct {
    wire_status_t code;         /* != WIRE_ST_OK */
    const char *message;
    uint64_t request_id;        /* the call it is about, 0: none */
    wire_kind_t about;          /* kind of the offending message, WIRE_NONE: unknown */
} wire_error_t;

typedef struct {
    uint64_t calls, rows, bytes_in, bytes_out, compute_ns, bad_messages, dropped;
    /* a worker on a device: its expert cache (kernels/tier), 0 elsewhere */
    uint64_t tier_uses, tier_hits, tier_streamed, tier_cpu, tier_prefetched,
        tier_prefetch_used;
    uint32_t tier_slots;
} wire_stats_t;

/* One layer's rows for one worker. The payload holds n_rows rows of n_embd
 * values of dtype (wire_row_bytes each; F32, F16, BF16, Q8_0 or Q8_K), each
 * row once. Entry j = (row_index[j], slot[j], weight[j]) asks for the
 * output of one expert on one row: expert i owns entries
 * [sum(expert_counts[0..i)), + expert_counts[i]). Checked: request_id != 0,
 * layer < WIRE_MAX_LAYERS, 1 <= n_rows <= WIRE_MAX_ROWS, 1 <= k <=
 * WIRE_MAX_SLOTS, 1 <= n_experts, experts strictly increasing and <
 * WIRE_MAX_EXPERTS, every count >= 1, counts summing to n_entries <= n_rows
 * * k, row_index[j] < n_rows and strictly increasing within an expert,
 * slot[j] < k, weight NULL or finite, result_dtype F32 or BF16, and
 * payload_bytes == n_rows * wire_row_bytes(dtype, n_embd) == the payload
 * frame's size. The result has one row per entry, in entry order, then
 * with `shared` one row per activation row, in row order: the layer's
 * shared experts on it (wire_call_result_rows counts them all). */
typedef struct {
    uint64_t request_id;
    uint32_t layer, n_rows, n_embd, dtype, k;
    size_t n_experts;
    const uint32_t *experts, *expert_counts;
    size_t n_entries;
    const uint32_t *row_index, *slot;
    const float *weight;        /* n_entries values, or NULL */
    uint32_t result_dtype;
    /* threads to compute with: 0 the worker's own, else 1..WIRE_MAX_THREADS
     * (the worker refuses more than its --threads: UNSUPPORTED) */
    uint32_t threads;
    bool shared;                /* the shared experts too (WIRE_CAP_SHARED) */
    const void *payload;
    size_t payload_bytes;
    /* Prefetch hint (optional): experts predicted for prefetch_layer
     * (< WIRE_MAX_LAYERS), n_prefetch <= WIRE_MAX_EXPERTS ids < WIRE_MAX_EXPERTS,
     * strictly increasing. n_prefetch 0: no hint. */
    uint32_t prefetch_layer;
    size_t n_prefetch;
    const uint32_t *prefetch;
} wire_call_t;

/* Rows a call's result holds: n_entries, + n_rows with shared. */
size_t wire_call_result_rows(const wire_call_t *c);

/* status OK: n_entries rows of n_embd values of dtype (F32 or BF16),
 * payload_bytes == n_entries * wire_row_bytes(dtype, n_embd) == the frame's
 * size. Otherwise n_entries == 0, an empty payload frame, and message says
 * why. Whether n_entries and n_embd match the call is the caller's check
 * (mux does it when told the expected size). */
typedef struct {
    uint64_t request_id;
    wire_status_t status;
    uint64_t compute_ns;
    uint32_t n_entries, n_embd, dtype;
    const char *message;
    const void *payload;
    size_t payload_bytes;
} wire_result_t;

typedef struct {
    wire_kind_t kind;
    uint32_t version;           /* decoded: the header's; ignored by wire_encode */
    union {
        wire_hello_t hello;
        wire_welcome_t welcome;
        wire_assign_t assign;
        wire_ready_t ready;
        wire_heartbeat_t heartbeat;
        wire_drain_t drain;
        wire_error_t error;
        wire_stats_t stats;
        wire_call_t call;
        wire_result_t result;
    };
    void *pb_;                  /* private: the unpacked protobuf, owned */
} wire_msg_t;

/* Bytes of one row of n values of an activation or result type on the wire;
 * 0 if the type is not a wire type or n is not a multiple of its block. */
size_t wire_row_bytes(uint32_t dtype, uint32_t n);

/* The quantized type a layer's activation rows may travel in to a worker
 * that advertises WIRE_CAP_INPUT_Q8, from the layer's ffn_gate_exps and
 * ffn_up_exps weight types: their vec_dot type (the rows kmoe_prepare_q
 * takes, the same bits as f32) when both take the same one and it is Q8_0
 * or Q8_K; else ECS_TYPE_F32. Coordinator and worker both decide with it. */
uint32_t wire_act_type(uint32_t gate_type, uint32_t up_type, uint32_t n_embd);

bool wire_kind_has_payload(wire_kind_t kind);
const char *wire_kind_name(wire_kind_t kind);     /* "?" if unknown */
const char *wire_status_name(wire_status_t st);   /* "?" if unknown */

/* The highest version in both [min_a, max_a] and [min_b, max_b]; 0: none. */
uint32_t wire_negotiate(uint32_t min_a, uint32_t max_a, uint32_t min_b, uint32_t max_b);

/* Checks m's fields as wire_decode would (payload given by the call's or
 * result's payload/payload_bytes). */
ecs_err_t wire_check(const wire_msg_t *m);

/* Bytes of m's first frame (header + body). Does not validate. */
ecs_err_t wire_frame_size(const wire_msg_t *m, size_t *len);

/* Validates m and writes its first frame (header + body, version
 * WIRE_VERSION) into buf; *len receives its size. The payload is not copied:
 * it is the second frame. ECS_ERR_RANGE if cap is too small. */
ecs_err_t wire_encode(const wire_msg_t *m, void *buf, size_t cap, size_t *len);

/* Parses and checks only the fixed header of a frame. */
ecs_err_t wire_peek(const void *frame, size_t len, wire_header_t *h);

/* Decodes a message: frame is the first frame; has_payload says whether a
 * second frame came (payload, payload_len). A payload frame is required for
 * CALL and RESULT and refused for every other kind. On failure *out holds no
 * memory (wire_msg_clear is still safe) and kind / request id are set as far
 * as known. */
ecs_err_t wire_decode(const void *frame, size_t len, const void *payload, size_t payload_len,
                      bool has_payload, wire_msg_t *out);

/* Frees what a decoded message owns; safe on a zeroed or failed message. */
void wire_msg_clear(wire_msg_t *m);

#endif
