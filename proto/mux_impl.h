/* mux_impl.h - private to proto/: the coordinator mux's state, shared by
 * mux.c (the socket work, done by the holder of the I/O role: the I/O
 * thread or a caller that found the role free, see mux.h) and mux_api.c
 * (what caller threads run: submit, wait, stats, control inbox). "I/O
 * thread only" below means: the role's holder only. */
#ifndef ECS_PROTO_MUX_IMPL_H
#define ECS_PROTO_MUX_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "proto/mux.h"

#define MUX_HASH 1024      /* call table buckets (power of two) */
#define MUX_RECENT 1024    /* completed ids remembered to tell duplicates from unknown ids */
#define MUX_INBOX_MAX 4096 /* control messages queued for mux_ctrl_recv before dropping */
#define MUX_BATCH 256      /* messages taken from one socket before polling the others */
#define MUX_ITEM_CTRL_MON (-3 - MUX_MAX_PEERS) /* item_peer of the control monitor */

typedef struct waiter {
    pthread_cond_t cond;
    int remaining;
} waiter_t;

typedef enum { CMD_CALL, CMD_CONNECT, CMD_DISCONNECT, CMD_CTRL_SEND, CMD_STOP,
               CMD_CANCEL } cmd_kind_t;

typedef struct cmd {
    cmd_kind_t kind;
    struct cmd *next;
    mux_call_t *call;          /* CMD_CALL */
    int peer;                  /* CMD_CONNECT (out), CMD_DISCONNECT */
    const char *endpoint;      /* CMD_CONNECT */
    const char *server_pub;    /* CMD_CONNECT: the peer's CURVE key, NULL: none */
    const mux_route_t *route;  /* CMD_CTRL_SEND */
    zmq_msg_t frame;           /* CMD_CTRL_SEND: the encoded message */
    bool finished;             /* synchronous commands: done, with err/errmsg */
    ecs_err_t err;
    char errmsg[256];
} cmd_t;

typedef struct mux_shm mux_shm_t;

struct mux_call {
    atomic_int refs;           /* the caller's and the I/O thread's */
    cmd_t cmd;
    cmd_t cancel;              /* CMD_CANCEL: mux_call_cancel's */
    atomic_bool cancelling;    /* cancel was enqueued (at most once) */
    uint64_t id;
    int peer;
    uint32_t n_rows, n_entries, n_embd, result_dtype;
    uint64_t t_submit;
    zmq_msg_t hdr, payload;    /* to send; emptied by a successful send */
    atomic_bool done;          /* set under m->lock */
    waiter_t *waiter;          /* under m->lock */
    mux_result_t res;
    zmq_msg_t rpayload;        /* the reply's payload frame, kept for res.payload */
    bool has_rpayload;
    wire_msg_t reply;          /* owns res.message when it came from the peer */
    char msgbuf[256];
    mux_call_t *hnext, *pnext; /* call table chain, peer's send queue (I/O thread) */
    mux_shm_t *shm;            /* sent through this shared-memory plane (a reference), or NULL */
};

typedef struct {
    void *sock;                /* I/O thread only */
    char endpoint[256];
    atomic_bool connected;
    _Atomic uint64_t calls_in_flight, rows_in_flight, calls_sent, calls_ok, calls_failed, calls_shm;
    _Atomic uint64_t bytes_out, bytes_in, unknown_ids, duplicate_replies, bad_messages,
        errors_received;
    _Atomic uint64_t lat[MUX_LAT_BUCKETS];
    mux_call_t *pend_head, *pend_tail; /* waiting for room below the HWM (I/O thread) */
    void *mon;                 /* PAIR receiving sock's connect/disconnect events (I/O thread) */
    bool was_connected;        /* I/O thread */
    /* I/O thread: sock or mon may hold input that its ZMQ_FD will not
     * signal (a send on it, or a read stopped before EAGAIN, may have taken
     * ZeroMQ's wake-up command); false once a read ended in EAGAIN */
    bool sock_dirty, mon_dirty;
    _Atomic uint64_t drops;    /* connections lost after being made */
    char last_error[256];      /* under m->lock */
    mux_shm_t *shm;            /* same-host plane (mux_shm.c), NULL: none; under m->lock */
} peer_t;

/* ECS_TEST_NET (netem.c): test-only delay and loss on the data plane. */
typedef struct {
    bool on;
    int delay_ms, jitter_ms;
    double drop;
    uint64_t seed;             /* the random state (I/O thread) */
} mux_netem_t;

/* A call or a reply held back by the injected delay (I/O thread). */
typedef struct mux_held {
    struct mux_held *next;
    uint64_t due_ns;
    mux_call_t *call;          /* an outgoing call (a reference), or NULL: */
    int peer, n;               /* an incoming reply's frames */
    zmq_msg_t parts[3];        /* ZU_MAX_PARTS */
} mux_held_t;

typedef struct inbox_item {
    struct inbox_item *next;
    mux_route_t from;
    wire_msg_t msg;
} inbox_item_t;

struct mux {
    void *zctx;
    pthread_t thread;
    bool thread_started;
    int efd;
    int hwm;
    pthread_mutex_t lock;      /* queue, completions, inbox, command results, last_error */
    /* The I/O role (see mux.h): whoever holds it is the one thread that
     * touches the sockets and the "I/O thread only" fields below. The I/O
     * thread holds it but while it sleeps in poll(); a caller that finds it
     * free sends and receives itself. Lock and unlock are the full memory
     * barriers ZeroMQ asks for to move a socket between threads. Taken
     * before lock, never the other way. */
    pthread_mutex_t role;
    unsigned sock_gen;         /* bumped when a socket opens or closes (role) */
    /* The I/O thread sleeps in epoll_wait on io_ep: the eventfd and io_inner,
     * an epoll set of every socket's ZMQ_FD (rebuilt when sock_gen moves).
     * A caller that leads disarms io_inner there, so that the reply it
     * waits for does not wake the I/O thread too; mux_role_put re-arms it. */
    int io_ep, io_inner;
    unsigned io_gen;           /* sock_gen io_inner was built for */
    bool io_disarmed;          /* under role */
    pthread_cond_t cmd_cond, ctrl_cond;
    cmd_t *q_head, *q_tail;
    bool closed;               /* the I/O thread has stopped taking commands */
    _Atomic uint64_t next_id;
    peer_t *peers[MUX_MAX_PEERS];
    atomic_int n_peers;
    void *ctrl;
    char ctrl_ep[256];
    curve_keypair_t key;       /* CURVE: a copy of the keypair given */
    mux_curve_t curve;         /* .key points at key when CURVE is on */
    curve_auth_t *auth;        /* the ZAP handler of zctx, NULL: plaintext */
    void *ctrl_mon;            /* ctrl's failed handshakes (I/O thread), NULL: none */
    bool ctrl_dirty, ctrl_mon_dirty; /* as peer_t's sock_dirty (I/O thread) */
    inbox_item_t *in_head, *in_tail;
    size_t in_count;
    _Atomic uint64_t ctrl_bad;
    mux_netem_t net;           /* read-only after mux_new but for the random state */
    _Atomic uint64_t net_dropped, net_delayed;
    /* I/O thread only */
    mux_call_t *table[MUX_HASH];
    struct { uint64_t id; int peer; } recent[MUX_RECENT];
    unsigned recent_pos;
    bool stopping;
    mux_held_t *held;          /* by due time */
    zmq_pollitem_t items[2 * MUX_MAX_PEERS + 3];
    int item_peer[2 * MUX_MAX_PEERS + 3]; /* -1 eventfd, -2 control, >= 0 peer, <= -3 monitor,
                                           * MUX_ITEM_CTRL_MON the control's */
};

#define RELAXED memory_order_relaxed
#define ADD(x, v) atomic_fetch_add_explicit(&(x), (v), RELAXED)
#define SUB(x, v) atomic_fetch_sub_explicit(&(x), (v), RELAXED)
#define LOAD(x) atomic_load_explicit(&(x), RELAXED)

/* Completes c (outcome in c->res) and drops its completer's reference. */
void mux_call_complete(mux_t *m, mux_call_t *c);
/* Completes c with an error (err, status INTERNAL, why). */
void mux_call_abort(mux_t *m, mux_call_t *c, ecs_err_t err, const char *why);
/* Fills c's outcome from its decoded reply (see mux.c). */
void mux_reply_apply(mux_t *m, peer_t *p, mux_call_t *c, wire_msg_t *w, zmq_msg_t *payload);
void mux_set_last_error(mux_t *m, peer_t *p, const char *msg);
void mux_reply_unmatched(mux_t *m, peer_t *p, wire_msg_t *w, bool dup);

/* mux_shm.c: the same-host plane of a peer. */
/* Sends c through p's plane if it has one and c fits (the I/O thread's
 * reference goes to the plane); false: send it on ZeroMQ. */
bool mux_shm_send(mux_t *m, peer_t *p, mux_call_t *c);
/* Fails c if it is in flight on a plane (mux_call_cancel); false if it is not. */
bool mux_shm_cancel(mux_t *m, mux_call_t *c);
/* Waits for c (sent on a plane) until done or deadline (ns, 0: none). */
void mux_shm_wait(mux_t *m, mux_call_t *c, uint64_t deadline_ns);
/* Detaches p's plane: aborts it and fails its calls in flight. */
void mux_shm_close(mux_t *m, peer_t *p, const char *why);
/* Drops a call's reference to its plane (mux_call_unref). */
void mux_shm_put(mux_shm_t *s);

/* Drops one reference; the last one frees the call and its frames. */
void mux_call_unref(mux_call_t *c);
/* Hands a command to the I/O thread; false once it has stopped. */
bool mux_enqueue(mux_t *m, cmd_t *c);
/* Enqueues a synchronous command and sleeps until the I/O thread did it. */
ecs_err_t mux_run_sync(mux_t *m, cmd_t *c);
/* The I/O role for a caller thread: true if it was free (and the mux not
 * stopping, not emulating a network); the caller then does the I/O
 * itself and gives the role back with mux_role_put. */
bool mux_role_try(mux_t *m);
void mux_role_put(mux_t *m);
/* Role held, about to wait for replies: the I/O thread is not woken by
 * the sockets until mux_role_put. */
void mux_role_lead(mux_t *m);
/* Role held: runs the queued commands, then sends c (mux_call_send). */
void mux_role_call(mux_t *m, mux_call_t *c);
/* Role held: one poll of every socket's ZMQ_FD (timeout_ms, -1: no limit;
 * 0 while a socket is dirty) and what it found handled; the number of
 * sockets that had something. */
int mux_io_pass(mux_t *m, int timeout_ms);
/* NULL for an id that was never connected. */
peer_t *mux_get_peer(mux_t *m, int peer);
/* The I/O thread. */
void *mux_io_main(void *arg);

/* netem.c. Parses an ECS_TEST_NET spec (NULL or "": off). */
ecs_err_t mux_netem_parse(const char *spec, mux_netem_t *cfg);
/* An outgoing call (already in the call table): true if it was dropped or
 * held back, false to send it now. */
bool mux_netem_out(mux_t *m, mux_call_t *c);
/* A received message's frames: true if they were dropped or held back
 * (moved out: the caller closes parts either way), false to handle them now. */
bool mux_netem_in(mux_t *m, int peer, zmq_msg_t *parts, int n);
/* Milliseconds until the next held message is due; -1 if none. */
int mux_netem_timeout(const mux_t *m);
/* Sends or handles the held messages that are due. */
void mux_netem_release(mux_t *m, void (*send)(mux_t *, mux_call_t *),
                       void (*recv)(mux_t *, int, zmq_msg_t *, int));
/* Frees what is still held and logs the counts (I/O thread stopped). */
void mux_netem_free(mux_t *m);

#endif
