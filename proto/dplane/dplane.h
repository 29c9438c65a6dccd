/* dplane.h - data planes beside ZeroMQ: the payload bytes of expert calls
 * and results over NCCL (GPU to GPU) or RDMA (CPU hosts), while request
 * ids and headers stay on ZeroMQ (proto/wire.h, proto/mux.h).
 *
 * Contract
 * - Negotiation: each side states what it could carry (dplane_local_caps:
 *   WIRE_CAP_NCCL when it computes on a GPU and libnccl loads, WIRE_CAP_RDMA
 *   when libibverbs finds a device); the worker sends its bits in Hello, the
 *   coordinator picks with dplane_choose (NCCL, then RDMA, else ZeroMQ) and
 *   says so in Welcome. ZeroMQ is always the fallback: a failure to set a
 *   plane up is logged and the pair stays on ZeroMQ.
 * - A channel carries one direction of one pair (calls coordinator ->
 *   worker, results worker -> coordinator), over its own communicator or
 *   queue pair, driven by exactly one thread. Two one-way channels per pair
 *   rather than one two-way: a communicator needs both ranks to issue
 *   matching operations in one order, and no side knows in advance how
 *   results (finished out of order) interleave with calls; each one-way
 *   order is fixed by its sender's headers on ZeroMQ, which keep their
 *   order per connection, and the two directions cannot block each other.
 * - Ordering: the sender numbers its payloads 0, 1, 2, ... in the order it
 *   sends their headers and puts the number in the header; the receiver
 *   submits the receive with the number from the header. Any thread may
 *   submit, in any order; the channel's thread runs operation n only after
 *   n - 1, so both ends issue sends and receives in the same order.
 * - Bounded: a channel holds `depth` operations (allocated at creation);
 *   dplane_chan_submit never allocates and refuses a number more than
 *   depth ahead of the next one to run (ECS_ERR_RANGE: the caller keeps at
 *   most depth payloads in flight, which its call window already does).
 * - Teardown: dplane_chan_abort (the peer died, or shutdown) aborts the
 *   transport (ncclCommAbort, QP to error), completes every queued and
 *   later operation with ECS_ERR_IO and leaves the thread idle;
 *   dplane_chan_free joins it. A replacement worker gets new channels and a
 *   new communicator; calls of the dead one are re-sent by the supervisor
 *   as before.
 * - Transports are a vtable; NCCL and verbs are loaded with dlopen, so a
 *   CPU-only build and user never need either library.
 *
 * Usage (the receiving side of a pair on NCCL)
 *   dplane_transport_t t;
 *   dplane_nccl_open(id, 1, device, &t);             // id from Welcome, rank 1
 *   dplane_chan_t *c;
 *   dplane_chan_new(&t, DPLANE_RECV, 64, on_done, ctx, &c);
 *   on a call header with payload number n:  dplane_chan_submit(c, n, dev_buf, bytes);
 *   on_done(ctx, n, rc) runs on the channel's thread when the bytes are in.
 *   dplane_chan_abort(c, "worker gone"); dplane_chan_free(c);
 */
#ifndef ECS_DPLANE_H
#define ECS_DPLANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/err.h"
#include "proto/wire.h"

/* ---- negotiation ---- */

typedef struct {
    bool gpu;       /* this side computes on a GPU (its payloads live in VRAM) */
    bool want_nccl; /* allowed to offer NCCL */
    bool want_rdma; /* allowed to offer RDMA */
} dplane_env_t;

/* The WIRE_CAP_NCCL / WIRE_CAP_RDMA bits this process can honour (probes
 * libnccl / libibverbs with dlopen; never fails). */
uint64_t dplane_local_caps(const dplane_env_t *e);
/* The plane for a pair: NCCL if both have it, else RDMA if both, else the
 * shared-memory plane if both offer it (WIRE_CAP_SHM) and are on one host,
 * else ZeroMQ. */
wire_plane_t dplane_choose_host(uint64_t worker_caps, uint64_t coordinator_caps, bool same_host);
/* The plane for a pair: NCCL if both have it, else RDMA if both, else ZeroMQ. */
wire_plane_t dplane_choose(uint64_t worker_caps, uint64_t coordinator_caps);
const char *dplane_plane_name(wire_plane_t p);

/* ---- transports ---- */

/* Blocking one-way byte moves; abort (any thread) makes a blocked or later
 * send / recv fail. */
typedef struct {
    const char *name;
    ecs_err_t (*send)(void *ctx, const void *buf, size_t n);
    ecs_err_t (*recv)(void *ctx, void *buf, size_t n);
    void (*abort)(void *ctx);
    void (*close)(void *ctx); /* after the channel's thread has stopped */
    void *ctx;
} dplane_transport_t;

/* NCCL (libnccl.so.2 and libcudart loaded with dlopen): a 2-rank
 * communicator on `device`; rank 0 is the coordinator. Buffers given to
 * the channel are device memory. */
#define DPLANE_NCCL_ID_BYTES 128
ecs_err_t dplane_nccl_unique_id(uint8_t id[DPLANE_NCCL_ID_BYTES]);
ecs_err_t dplane_nccl_open(const uint8_t id[DPLANE_NCCL_ID_BYTES], int rank, int device,
                           dplane_transport_t *out);

/* ---- the ordered channel ---- */

typedef enum { DPLANE_SEND = 0, DPLANE_RECV = 1 } dplane_dir_t;
typedef void (*dplane_done_fn)(void *arg, uint64_t seq, ecs_err_t rc);
typedef struct dplane_chan dplane_chan_t;

/* Starts the channel's thread. t is copied; the channel owns it from now
 * on (closed by dplane_chan_free, also when this fails). */
ecs_err_t dplane_chan_new(const dplane_transport_t *t, dplane_dir_t dir, int depth,
                          dplane_done_fn done, void *arg, dplane_chan_t **out);
/* Queues payload number seq (buf, n bytes: kept until done(seq) ran). */
ecs_err_t dplane_chan_submit(dplane_chan_t *c, uint64_t seq, void *buf, size_t n);
/* The next number the thread will run (all below it have run; the
 * last one's done() may still be running). */
uint64_t dplane_chan_next(dplane_chan_t *c);
void dplane_chan_abort(dplane_chan_t *c, const char *why);
bool dplane_chan_aborted(dplane_chan_t *c);
/* Aborts if needed, joins the thread, closes the transport. */
void dplane_chan_free(dplane_chan_t *c);

/* ---- RDMA: registered buffers and send credits (rdma.c) ----
 * The pure bookkeeping of the verbs plane, tested without a device: a
 * region registered once at start-up is cut into n fixed-size buffers
 * handed out and returned without allocation; a sender spends one credit
 * per message and regains the credits the receiver returns after it has
 * re-posted its buffers, so a send never finds the peer without a posted
 * receive (an RC queue pair would fail with RNR otherwise). */
typedef struct {
    uint8_t *base;
    size_t buf_bytes;
    int n;
    int32_t *free_list; /* a stack of free buffer indices */
    int n_free;
} dplane_pool_t;

ecs_err_t dplane_pool_init(dplane_pool_t *p, void *base, size_t bytes, size_t buf_bytes,
                           int32_t *free_list, int max_bufs);
/* A free buffer's index (its memory: dplane_pool_buf), or -1 when none. */
int dplane_pool_get(dplane_pool_t *p);
void *dplane_pool_buf(const dplane_pool_t *p, int i);
/* Returns buffer i; ECS_ERR_INVAL for an index out of range or already free. */
ecs_err_t dplane_pool_put(dplane_pool_t *p, int i);

typedef struct {
    uint32_t credits;  /* sends allowed now */
    uint32_t window;   /* receives the peer keeps posted */
    uint64_t sent, returned;
} dplane_credits_t;

void dplane_credits_init(dplane_credits_t *c, uint32_t window);
/* Takes a credit for one send; false when none is left (wait for a return). */
bool dplane_credits_take(dplane_credits_t *c);
/* The peer says it re-posted n receives; ECS_ERR_RANGE if that would
 * exceed what was sent (a confused or hostile peer). */
ecs_err_t dplane_credits_return(dplane_credits_t *c, uint32_t n);

/* The verbs plane (verbs.c; built where <infiniband/verbs.h> exists,
 * libibverbs loaded with dlopen): true when a device is present. */
bool dplane_rdma_available(void);

/* A queue pair's address as Hello / Welcome carry it (rdma_endpoint):
 * little-endian qpn, psn, lid, port | mtu << 8, then the 16-byte GID. */
#define DPLANE_RDMA_EP_BYTES 32
typedef struct {
    uint32_t qpn, psn; /* 24-bit */
    uint16_t lid;      /* 0 on RoCE: routed by gid */
    uint8_t port, mtu; /* mtu: enum ibv_mtu, 1..5 */
    uint8_t gid[16];
} dplane_rdma_ep_t;
void dplane_rdma_ep_encode(const dplane_rdma_ep_t *e, uint8_t out[DPLANE_RDMA_EP_BYTES]);
ecs_err_t dplane_rdma_ep_decode(const uint8_t *b, size_t n, dplane_rdma_ep_t *e);

typedef struct {
    const char *device; /* ibv device name; NULL: the first */
    size_t buf_bytes;   /* one registered buffer: a payload moves in chunks of this */
    int n_bufs;         /* registered buffers: half stay posted for receives */
    int gid_index;      /* RoCE GID table index (0 usually) */
} dplane_rdma_opts_t;
typedef struct dplane_rdma dplane_rdma_t;

/* Opens the device, registers the buffers once, creates an RC queue pair
 * (INIT) with its receives posted; *local is what to send the peer. */
ecs_err_t dplane_rdma_open(const dplane_rdma_opts_t *o, dplane_rdma_t **out,
                           dplane_rdma_ep_t *local);
/* Moves the queue pair to RTR / RTS against the peer's address and hands
 * out the transport (which owns r from then: its close frees it). */
ecs_err_t dplane_rdma_connect(dplane_rdma_t *r, const dplane_rdma_ep_t *peer,
                              dplane_transport_t *out);
/* Frees an r that was never connected. */
void dplane_rdma_close(dplane_rdma_t *r);

/* ---- same host: a shared-memory segment of two rings (shm.c) ----
 * The coordinator creates the segment (a POSIX shared-memory object named
 * "/ecs-PID-N-RAND", mode 0600) and sends the name in Welcome; the worker
 * attaches (checks the header, sets the attached word, unlinks the name).
 * Ring DPLANE_CALLS carries calls (coordinator -> worker), DPLANE_RESULTS
 * the results; each is single producer / single consumer (a side with
 * several producing threads serialises them itself). An entry is one wire
 * frame (header + body, exactly the bytes ZeroMQ's first frame carries)
 * and its payload, 64-byte aligned; entries are consumed in order and a
 * consumer holds at most the oldest until release. Everything read from
 * the segment is checked against this side's own sizes and indices:
 * ECS_ERR_FORMAT means the peer corrupted it (abort the plane). Sleeping:
 * dplane_ring_wait spins at most ~20 us, then FUTEX_WAIT on a shared word.
 * dplane_shm_abort (either side; the peer died, or shutdown) wakes every
 * sleeper and makes the rings refuse new entries. */
#define DPLANE_SHM_NAME 64
#define DPLANE_SHM_MAX_RING ((size_t)1 << 30)
#define DPLANE_SHM_MAX_FRAME (WIRE_HEADER_SIZE + WIRE_MAX_BODY)

typedef struct dplane_shm dplane_shm_t;
typedef enum { DPLANE_CALLS = 0, DPLANE_RESULTS = 1 } dplane_ring_t;
typedef struct {
    uint8_t *frame;      /* reserve: room for frame_len bytes; peek: the frame */
    size_t frame_len;
    uint8_t *payload;    /* payload_len bytes, 64-byte aligned */
    size_t payload_len;
    size_t size_, off_;  /* private */
    uint64_t next_;
    uint8_t *at_;
} dplane_entry_t;

/* Coordinator: a new segment of two rings of ring_bytes each (rounded up
 * to pages). */
ecs_err_t dplane_shm_create(size_t ring_bytes, dplane_shm_t **out);
/* Worker: maps the segment the Welcome named; ECS_ERR_IO when it does not
 * exist here (another host), ECS_ERR_FORMAT when it is not one of ours. */
ecs_err_t dplane_shm_attach(const char *name, dplane_shm_t **out);
const char *dplane_shm_name(const dplane_shm_t *s);
/* The pid of the worker that attached, 0 while none has. */
uint32_t dplane_shm_attached(const dplane_shm_t *s);
void dplane_shm_unlink(dplane_shm_t *s);
size_t dplane_shm_ring_bytes(const dplane_shm_t *s);
/* Bytes an entry with room for frame_cap frame bytes and payload takes. */
size_t dplane_shm_entry_bytes(size_t frame_cap, size_t payload);
/* Sleep in dplane_ring_wait with a 0.1 ms EEVDF slice, restored on waking,
 * so that the wake-up preempts a computing thread at once (off by default;
 * ECS_SHM_SHORT_WAKE=1 turns it on where the planes are made). */
void dplane_shm_short_wake(dplane_shm_t *s, bool on);
/* How long dplane_ring_wait spins before it sleeps, ns (< 0: the default,
 * 20 us or ECS_SHM_SPIN_US): 0 where the peer's thread shares this one's
 * CPU (ecs_threadpool_pin), which a spin would only keep from it. */
void dplane_shm_spin(dplane_shm_t *s, int64_t ns);
/* The futex word this side's thread pool parks on (peer false) or the
 * other side's: ecs_threadpool_handoff hands the cores over through them.
 * They stay valid after dplane_shm_free, which then keeps the header page
 * mapped (4 KiB) and gives back only the rings: a pool may touch them
 * once more after the plane is gone. */
_Atomic uint32_t *dplane_shm_pool_word(dplane_shm_t *s, bool peer);
void dplane_shm_abort(dplane_shm_t *s);
bool dplane_shm_aborted(const dplane_shm_t *s);
/* Unlinks (if still named) and unmaps; no thread may use s any more. */
void dplane_shm_free(dplane_shm_t *s);

/* Producer: room for an entry (e->frame, e->payload to fill), then commit
 * with the frame's real length (<= frame_cap). ECS_ERR_NOMEM: no room now
 * (wait with room = true, or go another way); ECS_ERR_RANGE: it can never
 * fit; ECS_ERR_IO: aborted. Nothing is visible before commit. */
ecs_err_t dplane_ring_reserve(dplane_shm_t *s, dplane_ring_t r, size_t frame_cap,
                              size_t payload, dplane_entry_t *e);
void dplane_ring_commit(dplane_shm_t *s, dplane_ring_t r, dplane_entry_t *e, size_t frame_len);
/* Consumer: the oldest entry, checked (ECS_ERR_NOTFOUND: empty,
 * ECS_ERR_FORMAT: corrupt); release it when done with its bytes. The
 * frame is in shared memory: copy it before decoding. */
ecs_err_t dplane_ring_peek(dplane_shm_t *s, dplane_ring_t r, dplane_entry_t *e);
void dplane_ring_release(dplane_shm_t *s, dplane_ring_t r, const dplane_entry_t *e);
/* wire_decode of a peeked entry: its frame copied into *buf (grown as
 * needed, *cap its size; free it when done), its payload in place. */
ecs_err_t dplane_entry_decode(const dplane_entry_t *e, uint8_t **buf, size_t *cap,
                              wire_msg_t *out);
/* Waiting: read the sequence (room = false: entries published; true:
 * entries released), check the condition, then wait until the sequence
 * moves, the plane is aborted or timeout_ms passes (< 0: no limit).
 * dplane_ring_kick moves the publish sequence without an entry (wakes the
 * consumer side's other sleepers). */
uint32_t dplane_ring_seq(dplane_shm_t *s, dplane_ring_t r, bool room);
void dplane_ring_wait(dplane_shm_t *s, dplane_ring_t r, bool room, uint32_t seen, int timeout_ms);
void dplane_ring_kick(dplane_shm_t *s, dplane_ring_t r);

#endif
