/* wire.c - the fixed header, the protobuf-c bodies of proto/ecs.proto and
 * the checks every message passes before anyone touches its payload. The
 * same wire_check() guards both directions, so an encoder cannot send what
 * a decoder would refuse. */
#include "wire.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/ecs.pb-c.h"

/* Each kind's protobuf descriptor; index = wire_kind_t. */
static const ProtobufCMessageDescriptor *const kind_desc[WIRE_KIND_COUNT] = {
    [WIRE_HELLO] = &ecs__hello__descriptor,
    [WIRE_WELCOME] = &ecs__welcome__descriptor,
    [WIRE_ASSIGN] = &ecs__assign__descriptor,
    [WIRE_READY] = &ecs__ready__descriptor,
    [WIRE_HEARTBEAT] = &ecs__heartbeat__descriptor,
    [WIRE_DRAIN] = &ecs__drain__descriptor,
    [WIRE_ERROR] = &ecs__error__descriptor,
    [WIRE_STATS] = &ecs__stats__descriptor,
    [WIRE_CALL] = &ecs__expert_call__descriptor,
    [WIRE_RESULT] = &ecs__expert_result__descriptor,
};

static const char *const kind_names[WIRE_KIND_COUNT] = {
    "none", "Hello", "Welcome", "Assign", "Ready", "Heartbeat",
    "Drain", "Error", "Stats", "ExpertCall", "ExpertResult",
};

static const char *const status_names[WIRE_ST_COUNT] = {
    "ok", "bad message", "version", "fingerprint", "not assigned",
    "over budget", "not ready", "draining", "internal", "unsupported",
};

/* The pb structs of every kind, for encoding on the stack. */
typedef union {
    ProtobufCMessage base;
    Ecs__Hello hello;
    Ecs__Welcome welcome;
    Ecs__Assign assign;
    Ecs__Ready ready;
    Ecs__Heartbeat heartbeat;
    Ecs__Drain drain;
    Ecs__Error error;
    Ecs__Stats stats;
    Ecs__ExpertCall call;
    Ecs__ExpertResult result;
} pb_any_t;

uint32_t wire_act_type(uint32_t gate_type, uint32_t up_type, uint32_t n_embd)
{
    const ecs_type_traits_t *tg = ecs_type_traits((ecs_type_t)gate_type);
    const ecs_type_traits_t *tu = ecs_type_traits((ecs_type_t)up_type);
    if (!tg || !tu || tg->vec_dot_type != tu->vec_dot_type)
        return ECS_TYPE_F32;
    const uint32_t t = (uint32_t)tg->vec_dot_type;
    if ((t != ECS_TYPE_Q8_0 && t != ECS_TYPE_Q8_K) || !wire_row_bytes(t, n_embd))
        return ECS_TYPE_F32;
    return t;
}

size_t wire_call_result_rows(const wire_call_t *c)
{
    return c->n_entries + (c->shared ? c->n_rows : 0);
}

size_t wire_row_bytes(uint32_t dtype, uint32_t n)
{
    switch (dtype) {
    case ECS_TYPE_F32: case ECS_TYPE_F16: case ECS_TYPE_BF16:
    case ECS_TYPE_Q8_0: case ECS_TYPE_Q8_K:
        return n ? ecs_row_size((ecs_type_t)dtype, n) : 0;
    default:
        return 0;
    }
}

bool wire_kind_has_payload(wire_kind_t kind)
{
    return kind == WIRE_CALL || kind == WIRE_RESULT;
}

const char *wire_kind_name(wire_kind_t kind)
{
    return (unsigned)kind < WIRE_KIND_COUNT ? kind_names[kind] : "?";
}

const char *wire_status_name(wire_status_t st)
{
    return (unsigned)st < WIRE_ST_COUNT ? status_names[st] : "?";
}

uint32_t wire_negotiate(uint32_t min_a, uint32_t max_a, uint32_t min_b, uint32_t max_b)
{
    uint32_t lo = min_a > min_b ? min_a : min_b;
    uint32_t hi = max_a < max_b ? max_a : max_b;
    return lo <= hi && lo >= 1 ? hi : 0;
}

/* ---- field checks ---- */

static ecs_err_t check_str(const char *kind, const char *field, const char *s, bool nonempty)
{
    size_t n = s ? strnlen(s, WIRE_MAX_STRING + 1) : 0;
    if (n > WIRE_MAX_STRING)
        return ecs_error(ECS_ERR_FORMAT, "%s: %s longer than %u bytes", kind, field,
                         WIRE_MAX_STRING);
    if (nonempty && n == 0)
        return ecs_error(ECS_ERR_FORMAT, "%s: %s is empty", kind, field);
    return ECS_OK;
}

static ecs_err_t check_hello(const wire_hello_t *h)
{
    ecs_err_t e;
    if (h->min_version < 1 || h->min_version > h->max_version)
        return ecs_error(ECS_ERR_FORMAT, "Hello: version range %u..%u is empty",
                         h->min_version, h->max_version);
    if (h->fingerprint_len < 1 || h->fingerprint_len > WIRE_MAX_FINGERPRINT || !h->fingerprint)
        return ecs_error(ECS_ERR_FORMAT, "Hello: model fingerprint of %zu bytes (1..%u)",
                         h->fingerprint_len, WIRE_MAX_FINGERPRINT);
    if (h->threads < 1)
        return ecs_error(ECS_ERR_FORMAT, "Hello: threads is 0");
    if ((e = check_str("Hello", "worker_id", h->worker_id, true)) ||
        (e = check_str("Hello", "host", h->host, false)) ||
        (e = check_str("Hello", "device", h->device, false)) ||
        (e = check_str("Hello", "data_endpoint", h->data_endpoint, true)))
        return e;
    if (h->rdma_ep_len > WIRE_MAX_RDMA_EP || (h->rdma_ep_len && !h->rdma_ep))
        return ecs_error(ECS_ERR_FORMAT, "Hello: rdma endpoint of %zu bytes (at most %u)",
                         h->rdma_ep_len, WIRE_MAX_RDMA_EP);
    const size_t klen = h->curve_public ? strnlen(h->curve_public, 41) : 0;
    if (klen != 0 && klen != 40)
        return ecs_error(ECS_ERR_FORMAT, "Hello: curve_public of %zu characters (40 Z85, or none)",
                         klen);
    return ECS_OK;
}

static ecs_err_t check_assign(const wire_assign_t *a)
{
    if (a->n && (!a->layers || !a->experts))
        return ecs_error(ECS_ERR_FORMAT, "Assign: %zu pairs without arrays", a->n);
    for (size_t i = 0; i < a->n; i++) {
        if (a->layers[i] >= WIRE_MAX_LAYERS || a->experts[i] >= WIRE_MAX_EXPERTS)
            return ecs_error(ECS_ERR_FORMAT, "Assign: pair %zu (%u, %u) out of range", i,
                             a->layers[i], a->experts[i]);
        if (i && (a->layers[i] < a->layers[i - 1] ||
                  (a->layers[i] == a->layers[i - 1] && a->experts[i] <= a->experts[i - 1])))
            return ecs_error(ECS_ERR_FORMAT,
                             "Assign: pair %zu (%u, %u) not after (%u, %u) (pairs must be "
                             "strictly increasing)", i, a->layers[i], a->experts[i],
                             a->layers[i - 1], a->experts[i - 1]);
    }
    return ECS_OK;
}

/* The data plane and exactly the parameters it needs. */
static ecs_err_t check_welcome_plane(const wire_welcome_t *w)
{
    if ((unsigned)w->data_plane >= WIRE_PLANE_COUNT)
        return ecs_error(ECS_ERR_FORMAT, "Welcome: data plane %u", (unsigned)w->data_plane);
    const bool nccl = w->data_plane == WIRE_PLANE_NCCL, rdma = w->data_plane == WIRE_PLANE_RDMA;
    if (w->nccl_id_len != (nccl ? WIRE_NCCL_ID_BYTES : 0) || (w->nccl_id_len && !w->nccl_id))
        return ecs_error(ECS_ERR_FORMAT, "Welcome: nccl id of %zu bytes with data plane %u",
                         w->nccl_id_len, (unsigned)w->data_plane);
    if ((rdma ? w->rdma_ep_len < 1 || w->rdma_ep_len > WIRE_MAX_RDMA_EP : w->rdma_ep_len != 0) ||
        (w->rdma_ep_len && !w->rdma_ep))
        return ecs_error(ECS_ERR_FORMAT, "Welcome: rdma endpoint of %zu bytes with data plane %u",
                         w->rdma_ep_len, (unsigned)w->data_plane);
    const char *shm = w->shm_name ? w->shm_name : "";
    const size_t sl = strlen(shm);
    if (w->data_plane == WIRE_PLANE_SHM
            ? sl < 2 || sl >= 64 || shm[0] != '/' || strchr(shm + 1, '/') : sl != 0)
        return ecs_error(ECS_ERR_FORMAT, "Welcome: shm name of %zu bytes with data plane %u",
                         sl, (unsigned)w->data_plane);
    return ECS_OK;
}

/* The optional prefetch hint of a call. */
static ecs_err_t check_prefetch(const wire_call_t *c)
{
    const unsigned long long id = (unsigned long long)c->request_id;
    if (!c->n_prefetch)
        return ECS_OK;
    if (c->prefetch_layer >= WIRE_MAX_LAYERS || c->n_prefetch > WIRE_MAX_EXPERTS || !c->prefetch)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: prefetch of %zu experts of layer %u",
                         id, c->n_prefetch, c->prefetch_layer);
    for (size_t i = 0; i < c->n_prefetch; i++)
        if (c->prefetch[i] >= WIRE_MAX_EXPERTS || (i && c->prefetch[i] <= c->prefetch[i - 1]))
            return ecs_error(ECS_ERR_FORMAT,
                             "ExpertCall %llu: prefetch expert %zu id %u (strictly increasing, "
                             "< %u)", id, i, c->prefetch[i], WIRE_MAX_EXPERTS);
    return ECS_OK;
}

static ecs_err_t check_call(const wire_call_t *c)
{
    if (c->request_id == 0)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall: request id 0");
    const uint64_t id = c->request_id;
    if (c->layer >= WIRE_MAX_LAYERS)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: layer %u >= %u",
                         (unsigned long long)id, c->layer, WIRE_MAX_LAYERS);
    if (c->n_rows < 1 || c->n_rows > WIRE_MAX_ROWS)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: n_rows %u (1..%u)",
                         (unsigned long long)id, c->n_rows, WIRE_MAX_ROWS);
    if (c->n_embd < 1 || c->n_embd > WIRE_MAX_EMBD)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: n_embd %u (1..%u)",
                         (unsigned long long)id, c->n_embd, WIRE_MAX_EMBD);
    if (c->k < 1 || c->k > WIRE_MAX_SLOTS)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: k %u (1..%u)",
                         (unsigned long long)id, c->k, WIRE_MAX_SLOTS);
    const size_t row = wire_row_bytes(c->dtype, c->n_embd);
    if (!row)
        return ecs_error(ECS_ERR_FORMAT,
                         "ExpertCall %llu: dtype %u is not an activation type for rows of %u "
                         "(f32, f16, bf16, q8_0, q8_K)", (unsigned long long)id, c->dtype,
                         c->n_embd);
    if (c->result_dtype != ECS_TYPE_F32 && c->result_dtype != ECS_TYPE_BF16)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: result dtype %u (f32 or bf16)",
                         (unsigned long long)id, c->result_dtype);
    if (c->threads > WIRE_MAX_THREADS)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: %u threads (0: the worker's own, "
                         "or 1..%u)", (unsigned long long)id, c->threads, WIRE_MAX_THREADS);
    if (c->n_experts < 1 || c->n_experts > WIRE_MAX_EXPERTS || !c->experts || !c->expert_counts)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: %zu experts (1..%u)",
                         (unsigned long long)id, c->n_experts, WIRE_MAX_EXPERTS);
    if (c->n_entries < 1 || c->n_entries > (size_t)c->n_rows * c->k || !c->row_index || !c->slot)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: %zu entries (1..n_rows*k = %zu)",
                         (unsigned long long)id, c->n_entries, (size_t)c->n_rows * c->k);
    size_t first = 0;
    for (size_t i = 0; i < c->n_experts; i++) {
        const uint32_t e = c->experts[i], n = c->expert_counts[i];
        if (e >= WIRE_MAX_EXPERTS || (i && e <= c->experts[i - 1]))
            return ecs_error(ECS_ERR_FORMAT,
                             "ExpertCall %llu: expert %zu id %u (ids strictly increasing, < %u)",
                             (unsigned long long)id, i, e, WIRE_MAX_EXPERTS);
        if (n < 1 || n > c->n_entries - first)
            return ecs_error(ECS_ERR_FORMAT,
                             "ExpertCall %llu: expert %u has %u entries, %zu of %zu left",
                             (unsigned long long)id, e, n, c->n_entries - first, c->n_entries);
        for (size_t j = first; j < first + n; j++) {
            if (c->row_index[j] >= c->n_rows || (j > first && c->row_index[j] <= c->row_index[j - 1]))
                return ecs_error(ECS_ERR_FORMAT,
                                 "ExpertCall %llu: entry %zu (expert %u) row %u (rows < %u, "
                                 "strictly increasing per expert)", (unsigned long long)id, j, e,
                                 c->row_index[j], c->n_rows);
            if (c->slot[j] >= c->k)
                return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: entry %zu slot %u >= k %u",
                                 (unsigned long long)id, j, c->slot[j], c->k);
            if (c->weight && !isfinite(c->weight[j]))
                return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: entry %zu weight not finite",
                                 (unsigned long long)id, j);
        }
        first += n;
    }
    if (first != c->n_entries)
        return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: expert counts sum to %zu, not %zu",
                         (unsigned long long)id, first, c->n_entries);
    const size_t want = (size_t)c->n_rows * row;
    if (want > WIRE_MAX_PAYLOAD || c->payload_bytes != want || (want && !c->payload))
        return ecs_error(ECS_ERR_FORMAT,
                         "ExpertCall %llu: payload of %zu bytes, %u rows of %u %s need %zu",
                         (unsigned long long)id, c->payload_bytes, c->n_rows, c->n_embd,
                         ecs_type_name((ecs_type_t)c->dtype), want);
    return check_prefetch(c);
}

static ecs_err_t check_result(const wire_result_t *r)
{
    const unsigned long long id = (unsigned long long)r->request_id;
    if (r->request_id == 0)
        return ecs_error(ECS_ERR_FORMAT, "ExpertResult: request id 0");
    if ((unsigned)r->status >= WIRE_ST_COUNT)
        return ecs_error(ECS_ERR_FORMAT, "ExpertResult %llu: unknown status %u", id,
                         (unsigned)r->status);
    ecs_err_t e = check_str("ExpertResult", "message", r->message, false);
    if (e)
        return e;
    if (r->status != WIRE_ST_OK) {
        if (r->n_entries || r->payload_bytes)
            return ecs_error(ECS_ERR_FORMAT,
                             "ExpertResult %llu: status %s with %u entries, %zu payload bytes",
                             id, wire_status_name(r->status), r->n_entries, r->payload_bytes);
        return ECS_OK;
    }
    if (r->n_entries < 1 || r->n_entries > WIRE_MAX_ROWS * WIRE_MAX_SLOTS)
        return ecs_error(ECS_ERR_FORMAT, "ExpertResult %llu: %u entries", id, r->n_entries);
    if (r->n_embd < 1 || r->n_embd > WIRE_MAX_EMBD)
        return ecs_error(ECS_ERR_FORMAT, "ExpertResult %llu: n_embd %u (1..%u)", id, r->n_embd,
                         WIRE_MAX_EMBD);
    if (r->dtype != ECS_TYPE_F32 && r->dtype != ECS_TYPE_BF16)
        return ecs_error(ECS_ERR_FORMAT, "ExpertResult %llu: dtype %u (f32 or bf16)", id,
                         r->dtype);
    const size_t want = (size_t)r->n_entries * wire_row_bytes(r->dtype, r->n_embd);
    if (want > WIRE_MAX_PAYLOAD || r->payload_bytes != want || !r->payload)
        return ecs_error(ECS_ERR_FORMAT,
                         "ExpertResult %llu: payload of %zu bytes, %u rows of %u %s need %zu", id,
                         r->payload_bytes, r->n_entries, r->n_embd,
                         ecs_type_name((ecs_type_t)r->dtype), want);
    return ECS_OK;
}

ecs_err_t wire_check(const wire_msg_t *m)
{
    ecs_err_t e;
    switch (m->kind) {
    case WIRE_HELLO:
        return check_hello(&m->hello);
    case WIRE_WELCOME:
        if (m->welcome.version < WIRE_VERSION_MIN || m->welcome.version > WIRE_VERSION)
            return ecs_error(ECS_ERR_FORMAT, "Welcome: version %u (this side speaks %u..%u)",
                             m->welcome.version, WIRE_VERSION_MIN, WIRE_VERSION);
        if (m->welcome.heartbeat_ms > 3600000u)
            return ecs_error(ECS_ERR_FORMAT, "Welcome: heartbeat every %u ms",
                             m->welcome.heartbeat_ms);
        if ((e = check_welcome_plane(&m->welcome)) != ECS_OK)
            return e;
        return check_str("Welcome", "coordinator_id", m->welcome.coordinator_id, false);
    case WIRE_ASSIGN:
        return check_assign(&m->assign);
    case WIRE_READY:
    case WIRE_HEARTBEAT:
    case WIRE_STATS:
        return ECS_OK;
    case WIRE_DRAIN:
        return check_str("Drain", "reason", m->drain.reason, false);
    case WIRE_ERROR:
        if (m->error.code == WIRE_ST_OK || (unsigned)m->error.code >= WIRE_ST_COUNT)
            return ecs_error(ECS_ERR_FORMAT, "Error: code %u", (unsigned)m->error.code);
        if ((unsigned)m->error.about >= WIRE_KIND_COUNT)
            return ecs_error(ECS_ERR_FORMAT, "Error: about kind %u", (unsigned)m->error.about);
        if ((e = check_str("Error", "message", m->error.message, false)))
            return e;
        return ECS_OK;
    case WIRE_CALL:
        return check_call(&m->call);
    case WIRE_RESULT:
        return check_result(&m->result);
    default:
        return ecs_error(ECS_ERR_FORMAT, "unknown message kind %u", (unsigned)m->kind);
    }
}

/* ---- wire struct <-> protobuf ---- */

static char *s_or_empty(const char *s) { return (char *)(s ? s : ""); }

/* Points pb at m's fields (no copies; pb lives only while encoding). */
static void to_pb(const wire_msg_t *m, pb_any_t *pb)
{
    switch (m->kind) {
    case WIRE_HELLO: {
        const wire_hello_t *h = &m->hello;
        ecs__hello__init(&pb->hello);
        pb->hello.min_version = h->min_version;
        pb->hello.max_version = h->max_version;
        pb->hello.model_fingerprint.data = (uint8_t *)h->fingerprint;
        pb->hello.model_fingerprint.len = h->fingerprint_len;
        pb->hello.worker_id = s_or_empty(h->worker_id);
        pb->hello.host = s_or_empty(h->host);
        pb->hello.pid = h->pid;
        pb->hello.threads = h->threads;
        pb->hello.mem_budget = h->mem_budget;
        pb->hello.device = s_or_empty(h->device);
        pb->hello.capabilities = h->capabilities;
        pb->hello.data_endpoint = s_or_empty(h->data_endpoint);
        pb->hello.rdma_endpoint.data = (uint8_t *)h->rdma_ep;
        pb->hello.rdma_endpoint.len = h->rdma_ep_len;
        pb->hello.vram_budget = h->vram_budget;
        pb->hello.curve_public = s_or_empty(h->curve_public);
        break;
    }
    case WIRE_WELCOME:
        ecs__welcome__init(&pb->welcome);
        pb->welcome.version = m->welcome.version;
        pb->welcome.coordinator_id = s_or_empty(m->welcome.coordinator_id);
        pb->welcome.heartbeat_ms = m->welcome.heartbeat_ms;
        pb->welcome.data_plane = (Ecs__DataPlane)m->welcome.data_plane;
        pb->welcome.nccl_id.data = (uint8_t *)m->welcome.nccl_id;
        pb->welcome.nccl_id.len = m->welcome.nccl_id_len;
        pb->welcome.rdma_endpoint.data = (uint8_t *)m->welcome.rdma_ep;
        pb->welcome.rdma_endpoint.len = m->welcome.rdma_ep_len;
        pb->welcome.shm_name = s_or_empty(m->welcome.shm_name);
        break;
    case WIRE_ASSIGN:
        ecs__assign__init(&pb->assign);
        pb->assign.generation = m->assign.generation;
        pb->assign.n_layers = pb->assign.n_experts = m->assign.n;
        pb->assign.layers = (uint32_t *)m->assign.layers;
        pb->assign.experts = (uint32_t *)m->assign.experts;
        pb->assign.shared = m->assign.shared;
        break;
    case WIRE_READY:
        ecs__ready__init(&pb->ready);
        pb->ready.generation = m->ready.generation;
        pb->ready.bytes_mapped = m->ready.bytes_mapped;
        pb->ready.load_ns = m->ready.load_ns;
        break;
    case WIRE_HEARTBEAT:
        ecs__heartbeat__init(&pb->heartbeat);
        pb->heartbeat.seq = m->heartbeat.seq;
        pb->heartbeat.time_ns = m->heartbeat.time_ns;
        pb->heartbeat.calls_in_flight = m->heartbeat.calls_in_flight;
        break;
    case WIRE_DRAIN:
        ecs__drain__init(&pb->drain);
        pb->drain.reason = s_or_empty(m->drain.reason);
        pb->drain.deadline_ms = m->drain.deadline_ms;
        break;
    case WIRE_ERROR:
        ecs__error__init(&pb->error);
        pb->error.code = (Ecs__Status)m->error.code;
        pb->error.message = s_or_empty(m->error.message);
        pb->error.request_id = m->error.request_id;
        pb->error.about = (Ecs__Kind)m->error.about;
        break;
    case WIRE_STATS: {
        const wire_stats_t *s = &m->stats;
        ecs__stats__init(&pb->stats);
        pb->stats.calls = s->calls;
        pb->stats.rows = s->rows;
        pb->stats.bytes_in = s->bytes_in;
        pb->stats.bytes_out = s->bytes_out;
        pb->stats.compute_ns = s->compute_ns;
        pb->stats.bad_messages = s->bad_messages;
        pb->stats.dropped = s->dropped;
        pb->stats.tier_uses = s->tier_uses;
        pb->stats.tier_hits = s->tier_hits;
        pb->stats.tier_streamed = s->tier_streamed;
        pb->stats.tier_cpu = s->tier_cpu;
        pb->stats.tier_prefetched = s->tier_prefetched;
        pb->stats.tier_prefetch_used = s->tier_prefetch_used;
        pb->stats.tier_slots = s->tier_slots;
        break;
    }
    case WIRE_CALL: {
        const wire_call_t *c = &m->call;
        Ecs__ExpertCall *p = &pb->call;
        ecs__expert_call__init(p);
        p->request_id = c->request_id;
        p->layer = c->layer;
        p->n_rows = c->n_rows;
        p->n_embd = c->n_embd;
        p->dtype = c->dtype;
        p->k = c->k;
        p->n_experts = p->n_expert_counts = c->n_experts;
        p->experts = (uint32_t *)c->experts;
        p->expert_counts = (uint32_t *)c->expert_counts;
        p->n_row_index = p->n_slot = c->n_entries;
        p->row_index = (uint32_t *)c->row_index;
        p->slot = (uint32_t *)c->slot;
        p->n_weight = c->weight ? c->n_entries : 0;
        p->weight = (float *)c->weight;
        p->payload_bytes = c->payload_bytes;
        p->result_dtype = c->result_dtype;
        p->threads = c->threads;
        p->shared = c->shared;
        p->prefetch_layer = c->prefetch_layer;
        p->n_prefetch_experts = c->n_prefetch;
        p->prefetch_experts = (uint32_t *)c->prefetch;
        break;
    }
    case WIRE_RESULT: {
        const wire_result_t *r = &m->result;
        Ecs__ExpertResult *p = &pb->result;
        ecs__expert_result__init(p);
        p->request_id = r->request_id;
        p->status = (Ecs__Status)r->status;
        p->compute_ns = r->compute_ns;
        p->n_entries = r->n_entries;
        p->n_embd = r->n_embd;
        p->dtype = r->dtype;
        p->payload_bytes = r->payload_bytes;
        p->message = s_or_empty(r->message);
        break;
    }
    default:
        break;
    }
}

/* Fills m from an unpacked pb; array fields must agree in length. */
static ecs_err_t from_pb(wire_msg_t *m, const ProtobufCMessage *any)
{
    switch (m->kind) {
    case WIRE_HELLO: {
        const Ecs__Hello *p = (const Ecs__Hello *)any;
        m->hello = (wire_hello_t){
            .min_version = p->min_version, .max_version = p->max_version,
            .fingerprint = p->model_fingerprint.data,
            .fingerprint_len = p->model_fingerprint.len, .worker_id = p->worker_id,
            .host = p->host, .pid = p->pid, .threads = p->threads,
            .mem_budget = p->mem_budget, .device = p->device,
            .capabilities = p->capabilities, .data_endpoint = p->data_endpoint,
            .rdma_ep = p->rdma_endpoint.data, .rdma_ep_len = p->rdma_endpoint.len,
            .vram_budget = p->vram_budget,
            .curve_public = p->curve_public};
        break;
    }
    case WIRE_WELCOME: {
        const Ecs__Welcome *p = (const Ecs__Welcome *)any;
        m->welcome = (wire_welcome_t){p->version, p->coordinator_id, p->heartbeat_ms,
                                      (wire_plane_t)p->data_plane, p->nccl_id.data,
                                      p->nccl_id.len, p->rdma_endpoint.data,
                                      p->rdma_endpoint.len, p->shm_name};
        break;
    }
    case WIRE_ASSIGN: {
        const Ecs__Assign *p = (const Ecs__Assign *)any;
        if (p->n_layers != p->n_experts)
            return ecs_error(ECS_ERR_FORMAT, "Assign: %zu layers but %zu experts", p->n_layers,
                             p->n_experts);
        m->assign = (wire_assign_t){p->generation, p->n_layers, p->layers, p->experts,
                                    p->shared};
        break;
    }
    case WIRE_READY: {
        const Ecs__Ready *p = (const Ecs__Ready *)any;
        m->ready = (wire_ready_t){p->generation, p->bytes_mapped, p->load_ns};
        break;
    }
    case WIRE_HEARTBEAT: {
        const Ecs__Heartbeat *p = (const Ecs__Heartbeat *)any;
        m->heartbeat = (wire_heartbeat_t){p->seq, p->time_ns, p->calls_in_flight};
        break;
    }
    case WIRE_DRAIN: {
        const Ecs__Drain *p = (const Ecs__Drain *)any;
        m->drain = (wire_drain_t){p->reason, p->deadline_ms};
        break;
    }
    case WIRE_ERROR: {
        const Ecs__Error *p = (const Ecs__Error *)any;
        m->error = (wire_error_t){(wire_status_t)p->code, p->message, p->request_id,
                                  (wire_kind_t)p->about};
        break;
    }
    case WIRE_STATS: {
        const Ecs__Stats *p = (const Ecs__Stats *)any;
        m->stats = (wire_stats_t){p->calls, p->rows, p->bytes_in, p->bytes_out,
                                  p->compute_ns, p->bad_messages, p->dropped,
                                  p->tier_uses, p->tier_hits, p->tier_streamed, p->tier_cpu,
                                  p->tier_prefetched, p->tier_prefetch_used, p->tier_slots};
        break;
    }
    case WIRE_CALL: {
        const Ecs__ExpertCall *p = (const Ecs__ExpertCall *)any;
        wire_call_t *c = &m->call;
        c->request_id = p->request_id;
        if (p->n_experts != p->n_expert_counts)
            return ecs_error(ECS_ERR_FORMAT, "ExpertCall %llu: %zu experts but %zu counts",
                             (unsigned long long)p->request_id, p->n_experts,
                             p->n_expert_counts);
        if (p->n_row_index != p->n_slot || (p->n_weight && p->n_weight != p->n_row_index))
            return ecs_error(ECS_ERR_FORMAT,
                             "ExpertCall %llu: %zu row indices, %zu slots, %zu weights",
                             (unsigned long long)p->request_id, p->n_row_index, p->n_slot,
                             p->n_weight);
        c->layer = p->layer;
        c->n_rows = p->n_rows;
        c->n_embd = p->n_embd;
        c->dtype = p->dtype;
        c->k = p->k;
        c->n_experts = p->n_experts;
        c->experts = p->experts;
        c->expert_counts = p->expert_counts;
        c->n_entries = p->n_row_index;
        c->row_index = p->row_index;
        c->slot = p->slot;
        c->weight = p->n_weight ? p->weight : NULL;
        c->result_dtype = p->result_dtype;
        c->threads = p->threads;
        c->shared = p->shared;
        c->prefetch_layer = p->prefetch_layer;
        c->n_prefetch = p->n_prefetch_experts;
        c->prefetch = p->prefetch_experts;
        /* the frame's real size; the field must agree (checked after) */
        if (p->payload_bytes != c->payload_bytes)
            return ecs_error(ECS_ERR_FORMAT,
                             "ExpertCall %llu: header says %llu payload bytes, the frame has %zu",
                             (unsigned long long)p->request_id,
                             (unsigned long long)p->payload_bytes, c->payload_bytes);
        break;
    }
    case WIRE_RESULT: {
        const Ecs__ExpertResult *p = (const Ecs__ExpertResult *)any;
        wire_result_t *r = &m->result;
        r->request_id = p->request_id;
        r->status = (wire_status_t)p->status;
        r->compute_ns = p->compute_ns;
        r->n_entries = p->n_entries;
        r->n_embd = p->n_embd;
        r->dtype = p->dtype;
        r->message = p->message;
        if (p->payload_bytes != r->payload_bytes)
            return ecs_error(ECS_ERR_FORMAT,
                             "ExpertResult %llu: header says %llu payload bytes, the frame has %zu",
                             (unsigned long long)p->request_id,
                             (unsigned long long)p->payload_bytes, r->payload_bytes);
        break;
    }
    default:
        return ecs_error(ECS_ERR_INTERNAL, "from_pb: kind %u", (unsigned)m->kind);
    }
    return ECS_OK;
}

/* ---- header ---- */

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

ecs_err_t wire_peek(const void *frame, size_t len, wire_header_t *h)
{
    const uint8_t *p = frame;
    memset(h, 0, sizeof *h);
    if (!p || len < WIRE_HEADER_SIZE)
        return ecs_error(ECS_ERR_FORMAT, "frame of %zu bytes is shorter than the %u-byte header",
                         len, WIRE_HEADER_SIZE);
    h->magic = rd32(p);
    h->version = (uint16_t)(p[4] | p[5] << 8);
    h->kind = p[6];
    h->flags = p[7];
    h->body_len = rd32(p + 8);
    if (h->magic != WIRE_MAGIC)
        return ecs_error(ECS_ERR_FORMAT, "bad magic 0x%08x (want 0x%08x, \"ECSP\")", h->magic,
                         WIRE_MAGIC);
    if (h->kind == WIRE_NONE || h->kind >= WIRE_KIND_COUNT)
        return ecs_error(ECS_ERR_FORMAT, "unknown message kind %u", h->kind);
    if (h->flags)
        return ecs_error(ECS_ERR_FORMAT, "%s: reserved flags 0x%02x set",
                         wire_kind_name(h->kind), h->flags);
    if (h->body_len > WIRE_MAX_BODY || (size_t)h->body_len != len - WIRE_HEADER_SIZE)
        return ecs_error(ECS_ERR_FORMAT, "%s: header says %u body bytes, the frame has %zu (max %u)",
                         wire_kind_name(h->kind), h->body_len, len - WIRE_HEADER_SIZE,
                         WIRE_MAX_BODY);
    /* A Hello's body decodes under every version (fields are append-only):
     * it is how the peers find a common one. Anything else must be spoken
     * in a version this side knows. */
    if (h->version < 1 || (h->kind != WIRE_HELLO &&
                           (h->version < WIRE_VERSION_MIN || h->version > WIRE_VERSION)))
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: protocol version %u (this side speaks %u..%u)",
                         wire_kind_name(h->kind), h->version, WIRE_VERSION_MIN, WIRE_VERSION);
    return ECS_OK;
}

ecs_err_t wire_frame_size(const wire_msg_t *m, size_t *len)
{
    if ((unsigned)m->kind == WIRE_NONE || (unsigned)m->kind >= WIRE_KIND_COUNT)
        return ecs_error(ECS_ERR_INVAL, "wire_frame_size: kind %u", (unsigned)m->kind);
    pb_any_t pb;
    to_pb(m, &pb);
    *len = WIRE_HEADER_SIZE + protobuf_c_message_get_packed_size(&pb.base);
    return ECS_OK;
}

ecs_err_t wire_encode(const wire_msg_t *m, void *buf, size_t cap, size_t *len)
{
    ecs_err_t e = wire_check(m);
    if (e)
        return e;
    pb_any_t pb;
    to_pb(m, &pb);
    const size_t body = protobuf_c_message_get_packed_size(&pb.base);
    if (body > WIRE_MAX_BODY)
        return ecs_error(ECS_ERR_RANGE, "%s: body of %zu bytes exceeds %u",
                         wire_kind_name(m->kind), body, WIRE_MAX_BODY);
    if (cap < WIRE_HEADER_SIZE + body)
        return ecs_error(ECS_ERR_RANGE, "%s: frame needs %zu bytes, buffer has %zu",
                         wire_kind_name(m->kind), WIRE_HEADER_SIZE + body, cap);
    uint8_t *p = buf;
    wr32(p, WIRE_MAGIC);
    p[4] = (uint8_t)WIRE_VERSION;
    p[5] = (uint8_t)(WIRE_VERSION >> 8);
    p[6] = (uint8_t)m->kind;
    p[7] = 0;
    wr32(p + 8, (uint32_t)body);
    if (protobuf_c_message_pack(&pb.base, p + WIRE_HEADER_SIZE) != body)
        return ecs_error(ECS_ERR_INTERNAL, "%s: packed size changed", wire_kind_name(m->kind));
    *len = WIRE_HEADER_SIZE + body;
    return ECS_OK;
}

ecs_err_t wire_decode(const void *frame, size_t len, const void *payload, size_t payload_len,
                      bool has_payload, wire_msg_t *out)
{
    memset(out, 0, sizeof *out);
    wire_header_t h;
    ecs_err_t e = wire_peek(frame, len, &h);
    if (h.magic == WIRE_MAGIC && h.kind > WIRE_NONE && h.kind < WIRE_KIND_COUNT)
        out->kind = (wire_kind_t)h.kind;
    if (e)
        return e;
    out->version = h.version;
    const char *name = wire_kind_name(out->kind);
    ProtobufCMessage *pb = protobuf_c_message_unpack(kind_desc[out->kind], NULL, h.body_len,
                                                     (const uint8_t *)frame + WIRE_HEADER_SIZE);
    if (!pb)
        return ecs_error(ECS_ERR_FORMAT, "%s: body of %u bytes is not a valid ecs.%s", name,
                         h.body_len, out->kind == WIRE_CALL     ? "ExpertCall"
                                     : out->kind == WIRE_RESULT ? "ExpertResult"
                                                                : name);
    out->pb_ = pb;
    /* the id first, so that a refusal can name the call it refuses */
    if (out->kind == WIRE_CALL)
        out->call.request_id = ((const Ecs__ExpertCall *)pb)->request_id;
    else if (out->kind == WIRE_RESULT)
        out->result.request_id = ((const Ecs__ExpertResult *)pb)->request_id;
    if (has_payload != wire_kind_has_payload(out->kind)) {
        e = ecs_error(ECS_ERR_FORMAT, "%s: %s", name,
                      has_payload ? "unexpected payload frame" : "payload frame missing");
        goto fail;
    }
    if (has_payload && payload_len > WIRE_MAX_PAYLOAD) {
        e = ecs_error(ECS_ERR_FORMAT, "%s: payload frame of %zu bytes exceeds %zu", name,
                      payload_len, WIRE_MAX_PAYLOAD);
        goto fail;
    }
    if (out->kind == WIRE_CALL) {
        out->call.payload = payload_len ? payload : NULL;
        out->call.payload_bytes = payload_len;
    } else if (out->kind == WIRE_RESULT) {
        out->result.payload = payload_len ? payload : NULL;
        out->result.payload_bytes = payload_len;
    }
    if ((e = from_pb(out, pb)) || (e = wire_check(out)))
        goto fail;
    return ECS_OK;
fail:;
    const wire_kind_t kind = out->kind;
    const uint64_t id = kind == WIRE_CALL ? out->call.request_id
                      : kind == WIRE_RESULT ? out->result.request_id : 0;
    wire_msg_clear(out);
    out->kind = kind;
    if (kind == WIRE_CALL)
        out->call.request_id = id;
    else if (kind == WIRE_RESULT)
        out->result.request_id = id;
    return e;
}

void wire_msg_clear(wire_msg_t *m)
{
    if (m->pb_)
        protobuf_c_message_free_unpacked(m->pb_, NULL);
    memset(m, 0, sizeof *m);
}
