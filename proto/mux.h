/* mux.h - multiplexed expert calls over ZeroMQ (tcp:// and ipc://): the
 * coordinator's side (mux_t) and the worker's side (mux_server_t).
 *
 * Contract, coordinator side. mux_new() starts one I/O thread; the mux's
 * sockets are the control ROUTER (workers' Hello, Ready, Heartbeat, Error,
 * Stats come in there) and one DEALER per peer (a worker's data endpoint).
 * mux_submit() encodes the call's header and copies its payload into a
 * message in the calling thread. Any number of calls may be in flight per
 * peer; replies come back in any order and complete the call with the
 * same request id (the mux assigns ids, unique per mux). A reply whose id
 * is not in flight on that peer is dropped and counted (duplicate_replies
 * when the id completed recently, unknown_ids otherwise). Nothing spins.
 *
 * One thread at a time touches the sockets: the holder of the I/O role (a
 * mutex). The project's rule is one owner thread per socket, the others
 * handing it work through a queue; the role keeps the one owner but lets
 * the ownership move, explicitly, under the mutex, whose lock and unlock
 * are the full memory barriers ZeroMQ asks for to move a socket to
 * another thread. Why: with a fixed I/O thread every round trip paid two
 * hand-offs between threads (the caller woke the I/O thread through an
 * eventfd, the I/O thread woke the caller through a condition variable),
 * a scheduler wake-up each, which a raw libzmq client does not pay
 * (docs/benchmarks.md, "Transport round trip"). Now:
 *   - the I/O thread holds the role while it works and drops it while it
 *     sleeps, in epoll_wait on the queue's eventfd and every socket's
 *     ZMQ_FD (ZeroMQ's way to wait on a socket from an event loop: a plain
 *     fd, safe to wait on while another thread uses the socket);
 *   - mux_submit() that finds the role free sends from the caller's thread
 *     (after any of its calls queued earlier); otherwise it queues the call
 *     and wakes the holder through the eventfd, as before;
 *   - mux_wait() that finds the role free polls the sockets itself until
 *     its calls are done (handling whatever else comes: other threads'
 *     replies and commands, control messages), having first taken the
 *     sockets out of the I/O thread's epoll set so that its reply wakes
 *     one thread, not two; otherwise it sleeps on a condition variable and
 *     the holder completes its calls, as before;
 *   - the holder waits with one poll() on the sockets' ZMQ_FDs, not
 *     zmq_poll (which asks every socket its ZMQ_EVENTS before and after
 *     sleeping: two system calls a socket each time); a socket is read
 *     whenever its fd fired or it is "dirty": sent on, or a read stopped
 *     before EAGAIN (either may have taken ZeroMQ's wake-up command, so
 *     its fd would stay quiet over a waiting message); a read that ends
 *     in EAGAIN makes it clean again (the worker's loop does the same);
 *   - whoever gives the role back first reads every dirty socket and runs
 *     the queued commands, so that the next change of any socket shows
 *     on its ZMQ_FD, and puts the sockets back into the I/O thread's
 *     epoll set (level-triggered: what came meanwhile wakes it).
 *     Commands (connect, disconnect, stop) always go through the queue,
 *     whose eventfd the I/O thread always watches: it rebuilds its set
 *     when sockets came or went.
 * Under ECS_TEST_NET the I/O thread keeps the role (held messages need its
 * timer) and callers always go through the queue.
 *
 * A call completes exactly once, with one of:
 *   err ECS_OK, status WIRE_ST_OK   rows in payload: n_entries rows of n_embd
 *                                   values of the call's result_dtype, entry
 *                                   order (checked against the call)
 *   err ECS_OK, status != OK        the worker refused it (message says why)
 *   err ECS_ERR_FORMAT              the reply was malformed or did not match
 *                                   the call (message says what)
 *   err ECS_ERR_IO                  the peer was disconnected, the call was
 *                                   cancelled (mux_call_cancel) or the mux freed
 *                                   before a reply came
 * Payloads handed out (a result's rows here, a call's rows to on_call on
 * the worker) start at a WIRE_PAYLOAD_ALIGN (64-byte) aligned address: the
 * transport copies a frame that ZeroMQ received at another address.
 *
 * A call that never gets a reply (a dead or silent worker) stays in flight:
 * mux_wait() takes a timeout, and mux_peer_disconnect() fails every call in
 * flight on that peer so that the caller can send them elsewhere, and
 * mux_call_cancel() fails one call (a lost message, the peer still alive).
 *
 * Test only: ECS_TEST_NET="delay_ms=20,jitter_ms=5,drop=0.01,seed=7" makes
 * the I/O thread delay and drop expert calls and replies (not control
 * messages), to emulate a bad network; mux_new fails on a bad spec. See
 * proto/netem.c and docs/protocol.md.
 *
 * Usage (coordinator):
 *
 *   mux_t *m;  mux_new(&(mux_opts_t){.control_bind = "ipc:///tmp/ecs.ctl"}, &m);
 *   int w;     mux_peer_connect(m, hello.data_endpoint, &w);
 *   wire_call_t c = {...};               // see wire.h; request_id is set by mux
 *   mux_call_t *call;
 *   if (mux_submit(m, w, &c, &call)) die(ecs_errmsg());
 *   ... compute the shared experts ...
 *   if (mux_wait(m, &call, 1, 5000) == 0) {
 *       const mux_result_t *r = mux_call_result(call);
 *       if (r->err == ECS_OK && r->status == WIRE_ST_OK) sum(r->payload);
 *   }
 *   mux_call_release(call);
 *   mux_free(m);
 *
 * Contract, worker side. mux_server_run() runs the serve loop on the
 * calling thread, which owns the worker's data ROUTER (bound at data_bind,
 * any number of coordinators connect to it) and its control DEALERs (one
 * per coordinator, mux_server_connect). Each valid ExpertCall is handed to
 * ops.on_call on that thread, one at a time: each coordinator's calls in
 * arrival order, round robin between coordinators (server.c); its reply
 * goes back to the coordinator that sent it. A bad message never stops the
 * loop: a call whose request id could be read gets an ExpertResult with
 * status BAD_MESSAGE (or VERSION), anything else an Error, and every one is
 * counted (wire_stats_t.bad_messages); an Error is never answered. See
 * docs/protocol.md for the full table.
 *
 * Usage (worker):
 *
 *   static void on_call(void *ctx, const wire_call_t *c, mux_reply_t *r) {
 *       compute(c, r->rows);             // r->rows: wire_call_result_rows(c) rows
 *   }
 *   mux_server_t *s;
 *   mux_server_new(&(mux_server_opts_t){.data_bind = "tcp://0.0.0.0:5555"},
 *                  &(mux_server_ops_t){.on_call = on_call, .on_ctrl = on_ctrl},
 *                  ctx, &s);
 *   mux_server_connect(s, "tcp://coord:5550", &conn);
 *   mux_server_send(s, conn, &hello);     // before run, or from a callback
 *   mux_server_run(s);                    // until mux_server_stop (signal-safe)
 *   mux_server_free(s);
 */
#ifndef ECS_PROTO_MUX_H
#define ECS_PROTO_MUX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "proto/curve.h"
#include "proto/wire.h"

#define MUX_MAX_PEERS 4096      /* peer ids ever connected on one mux (ids are not reused) */
#define MUX_DEFAULT_HWM 1024    /* messages queued per socket and direction */
#define MUX_LAT_BUCKETS 32      /* latency histogram: bucket i counts [2^i, 2^(i+1)) us; 0 also < 1 us */

/* CURVE on a side's links (proto/curve.h); key NULL: plaintext. The side
 * that binds (the coordinator's control ROUTER, the worker's data ROUTER)
 * is the CURVE server with this keypair and admits only the client keys in
 * allowed[0..n_allowed) (a ZAP handler on its ZeroMQ context); the side
 * that connects is the client with the same keypair. Every refused peer is
 * logged on stderr: a listed-key refusal names the key, a failed handshake
 * (plaintext peer, wrong server key) names the endpoint. */
typedef struct {
    const curve_keypair_t *key;
    const char *const *allowed;
    int n_allowed;
    const char *server_pub;     /* worker side: the coordinator's public key, for
                                 * mux_server_connect; ignored by the coordinator's mux */
} mux_curve_t;

/* The key files of a command line, loaded: own key pair (PREFIX.key), the
 * coordinator's public key (a worker's), the allow list (every *.pub in a
 * directory). Owns what mux_curve_view() points at. */
typedef struct {
    bool on;
    curve_keypair_t key;
    char server_pub[CURVE_Z85_LEN + 1];
    char (*allowed)[CURVE_Z85_LEN + 1];
    const char **ptrs;
    int n_allowed;
} mux_curve_keys_t;

/* key_file NULL: plaintext (then the others must be NULL too). A worker
 * gives server_pub_file (the coordinator's .pub, or its .key); without
 * clients_dir the worker admits just that key on its data socket.
 * allow_self adds the own public key to the allow list (workers spawned
 * with the same key pair). Errors name the file and what is wrong. */
ecs_err_t mux_curve_load(mux_curve_keys_t *k, const char *key_file, const char *server_pub_file,
                         const char *clients_dir, bool allow_self);
mux_curve_t mux_curve_view(const mux_curve_keys_t *k);
void mux_curve_keys_free(mux_curve_keys_t *k);

/* ---- coordinator side ---- */

typedef struct mux mux_t;
typedef struct mux_call mux_call_t;

typedef struct {
    const char *control_bind;   /* ROUTER for workers' control messages; NULL: none */
    int hwm;                    /* 0: MUX_DEFAULT_HWM */
    mux_curve_t curve;          /* control bind as server; peers connected with
                                 * mux_peer_connect_key as client */
} mux_opts_t;

/* Starts the I/O thread (and binds control_bind). */
ecs_err_t mux_new(const mux_opts_t *opts, mux_t **out);
/* Fails every call in flight (ECS_ERR_IO), stops the I/O thread, closes the
 * sockets. Calls not yet released stay valid until mux_call_release(). */
void mux_free(mux_t *m);
/* The control endpoint as bound (a tcp "*" port resolved), or "" if none. */
const char *mux_control_endpoint(const mux_t *m);

/* Connects a DEALER to a worker's data endpoint (the connection itself is
 * made in the background and retried by ZeroMQ); *peer is its id. */
ecs_err_t mux_peer_connect(mux_t *m, const char *endpoint, int *peer);
/* The same over CURVE when the mux has a key: server_pub is the peer's Z85
 * public key (40 characters); ECS_ERR_INVAL if the mux has a key and
 * server_pub is missing. Without a key on the mux, server_pub is ignored. */
ecs_err_t mux_peer_connect_key(mux_t *m, const char *endpoint, const char *server_pub, int *peer);
/* Same host: from now on the calls to peer that fit go through seg's rings
 * (proto/dplane/dplane.h: the worker attached it after a Welcome that
 * named it); the rest, and everything while ECS_TEST_NET is on, stay on
 * ZeroMQ. The mux owns seg from this call on (also when it fails); the
 * caller of mux_wait reads the results off the ring itself. The plane dies
 * with the peer (mux_peer_disconnect, mux_free): its calls in flight fail
 * with ECS_ERR_IO like the socket's. A corrupt ring entry is counted
 * (bad_messages), aborts the plane and fails its calls in flight; the peer
 * stays on ZeroMQ. */
struct dplane_shm;
ecs_err_t mux_peer_set_shm(mux_t *m, int peer, struct dplane_shm *seg);
/* The park words of peer's shared-memory plane, this side's and the
 * worker's (dplane_shm_pool_word, for ecs_threadpool_handoff); false when
 * the peer has none. The words outlive the plane (dplane_shm_free keeps
 * its header page), so a hand-off that outlives it only costs a wake-up. */
bool mux_peer_pool_words(mux_t *m, int peer, _Atomic uint32_t **own, _Atomic uint32_t **theirs);
/* Closes the peer's socket and fails its calls in flight (ECS_ERR_IO).
 * Replies that arrive later are lost with the socket. */
ecs_err_t mux_peer_disconnect(mux_t *m, int peer);

/* Sends c to peer: validates it (wire_check), sets c->request_id to a fresh
 * id, encodes the header and copies the payload (c's arrays and payload may
 * be reused as soon as this returns). *out is the call's handle: release it
 * with mux_call_release(). ECS_ERR_INVAL for an unknown or disconnected
 * peer, ECS_ERR_FORMAT for a call that does not pass wire_check. */
ecs_err_t mux_submit(mux_t *m, int peer, wire_call_t *c, mux_call_t **out);

/* The same in two steps, for a caller that gathers its rows straight into
 * the message: prepare validates c (its payload pointer is not read; give
 * payload_bytes) and returns in *payload room for payload_bytes bytes; fill
 * it, then send. A prepared call that is not sent is freed by
 * mux_call_release. */
ecs_err_t mux_call_prepare(mux_t *m, int peer, wire_call_t *c, void **payload,
                           mux_call_t **out);
ecs_err_t mux_call_send(mux_t *m, mux_call_t *call);

/* Sleeps until every one of calls[0..n) has completed or timeout_ms passed
 * (< 0: no limit); returns how many have not completed (0: all). Several
 * threads may wait at once, each on its own calls (one waiter per call at a
 * time). */
int mux_wait(mux_t *m, mux_call_t *const *calls, int n, int timeout_ms);
bool mux_call_done(const mux_call_t *c);

typedef struct {
    ecs_err_t err;              /* see the table above */
    wire_status_t status;       /* the worker's, when err == ECS_OK */
    const char *message;        /* why, when not OK ("" otherwise) */
    uint64_t request_id;
    int peer;
    uint32_t n_entries, n_embd, dtype;
    const void *payload;        /* the reply's rows (64-byte aligned), valid until release */
    size_t payload_bytes;
    uint64_t compute_ns;        /* the worker's compute time */
    uint64_t rtt_ns;            /* submit to completion */
} mux_result_t;

/* The outcome of a completed call (NULL while in flight). */
const mux_result_t *mux_call_result(const mux_call_t *c);
/* Gives up on a call still in flight (a reply lost on the way, a worker
 * that stays silent): it completes soon with ECS_ERR_IO ("cancelled"), so
 * its caller can send it again; a reply that comes later is dropped and
 * counted as a duplicate. No effect on a completed call. */
ecs_err_t mux_call_cancel(mux_t *m, mux_call_t *c);
/* Frees the handle (and the reply's frames). Releasing a call still in
 * flight abandons it: its reply is consumed and dropped when it comes. */
void mux_call_release(mux_call_t *c);

typedef struct {
    bool connected;
    char endpoint[256];
    uint64_t calls_in_flight, rows_in_flight;
    uint64_t calls_sent, calls_ok, calls_failed;  /* failed: any outcome but err OK + status OK */
    uint64_t calls_shm;                            /* of calls_sent, those on the shared-memory plane */
    uint64_t bytes_out, bytes_in;                  /* all frames, headers included */
    uint64_t unknown_ids, duplicate_replies, bad_messages, errors_received;
    uint64_t latency_us[MUX_LAT_BUCKETS];          /* round trips of completed calls */
    char last_error[256];                           /* last Error or bad reply, "" if none */
} mux_peer_stats_t;

ecs_err_t mux_peer_stats(mux_t *m, int peer, mux_peer_stats_t *out);
/* Calls in flight on peer right now (cheap: for picking the least busy);
 * UINT32_MAX for an id that was never connected. */
uint32_t mux_peer_inflight(mux_t *m, int peer);
/* How many times the peer's connection was lost after it had been made
 * (a ZeroMQ socket monitor: the worker's process or link went away; ZeroMQ
 * keeps reconnecting). 0 for an id never connected. */
uint64_t mux_peer_drops(mux_t *m, int peer);
/* The latency below which fraction q of the histogram's round trips fall
 * (upper bucket edge, us); 0 if empty. */
uint64_t mux_latency_quantile(const uint64_t hist[MUX_LAT_BUCKETS], double q);

/* A worker's address on the control socket (ZeroMQ routing id). */
typedef struct {
    uint8_t len;
    uint8_t id[255];
} mux_route_t;

/* The next valid control message from any worker (Hello, Ready, Heartbeat,
 * Error, Stats...), decoded: release it with wire_msg_clear(). Sleeps up to
 * timeout_ms (< 0: no limit); msg->kind is WIRE_NONE if nothing came. Bad
 * control messages never show up here: the I/O thread answers them with an
 * Error and counts them (mux_ctrl_bad). */
ecs_err_t mux_ctrl_recv(mux_t *m, mux_route_t *from, wire_msg_t *msg, int timeout_ms);
/* Sends a control message (Welcome, Assign, Drain, Error...) to a worker;
 * ECS_ERR_IO if that worker is not connected. */
ecs_err_t mux_ctrl_send(mux_t *m, const mux_route_t *to, const wire_msg_t *msg);
/* Bad messages received on the control socket so far. */
uint64_t mux_ctrl_bad(mux_t *m);

/* ---- worker side ---- */

typedef struct mux_server mux_server_t;

/* What on_call fills. Preset: status OK, rows pointing at room for
 * wire_call_result_rows(call) rows (of the call's n_embd and result_dtype)
 * inside the reply's frame, compute_ns 0 (then the server measures on_call). On an
 * error status set message; the rows are not sent. */
typedef struct {
    wire_status_t status;
    char message[256];
    uint64_t compute_ns;
    void *rows;
    size_t rows_bytes;
    /* when the call came by a shared-memory plane: its park words, this
     * side's and the coordinator's (ecs_threadpool_handoff), else NULL */
    _Atomic uint32_t *pool_own, *pool_peer;
} mux_reply_t;

typedef struct {
    /* A valid call; runs on the server thread. */
    void (*on_call)(void *ctx, const wire_call_t *call, mux_reply_t *reply);
    /* A valid control message from coordinator conn (Welcome, Assign,
     * Drain, Heartbeat, Error...); msg is freed after the callback. */
    void (*on_ctrl)(void *ctx, int conn, const wire_msg_t *msg);
    /* Every tick_ms (for heartbeats); may be NULL. */
    void (*on_tick)(void *ctx);
} mux_server_ops_t;

typedef struct {
    const char *data_bind;      /* e.g. "tcp://127.0.0.1:*" or "ipc:///tmp/w0.data" */
    int tick_ms;                /* 0: 1000 */
    int hwm;                    /* 0: MUX_DEFAULT_HWM */
    mux_curve_t curve;          /* data bind as server, control connects as client */
    bool shm_no_spin;           /* the planes' threads sleep at once (dplane_shm_spin 0):
                                 * the pool is pinned beside the coordinator's threads */
} mux_server_opts_t;

ecs_err_t mux_server_new(const mux_server_opts_t *opts, const mux_server_ops_t *ops, void *ctx,
                         mux_server_t **out);
/* The data endpoint as bound (tcp port resolved): what Hello announces. */
const char *mux_server_endpoint(const mux_server_t *s);
/* Connects a DEALER to a coordinator's control endpoint; *conn is its id. Only
 * before mux_server_run or from a callback (the server thread). */
ecs_err_t mux_server_connect(mux_server_t *s, const char *endpoint, int *conn);
/* Sends a control message to coordinator conn; same thread rule. */
ecs_err_t mux_server_send(mux_server_t *s, int conn, const wire_msg_t *msg);
/* Serves until mux_server_stop(); ECS_ERR_IO if polling itself fails. */
ecs_err_t mux_server_run(mux_server_t *s);
/* Same host: serves coordinator conn's calls from the shared-memory segment
 * its Welcome named (proto/dplane/dplane.h), on a thread of its own that
 * calls on_call (every callback of the server runs under one lock, so
 * on_call never overlaps on_ctrl / on_tick; and only the loop thread may
 * touch a socket: mux_server_in_loop tells a callback where it runs). A
 * later attach on conn (a new Welcome) retires the old plane; name NULL
 * just retires it. ECS_ERR_IO: no such segment here (another host): the
 * calls stay on ZeroMQ. Only from the loop thread (a callback). */
ecs_err_t mux_server_attach_shm(mux_server_t *s, int conn, const char *name);
bool mux_server_in_loop(const mux_server_t *s);
/* Makes mux_server_run return soon; any thread, async-signal-safe. */
void mux_server_stop(mux_server_t *s);
/* Counters so far (calls, rows, bytes, bad messages, dropped replies). */
void mux_server_stats(const mux_server_t *s, wire_stats_t *out);
void mux_server_free(mux_server_t *s);

#endif
