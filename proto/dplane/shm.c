/* shm.c - the same-host data plane's segment and rings (dplane.h, "shared
 * memory"). The coordinator creates a POSIX shared-memory object, sizes it
 * and sends its name in Welcome; the worker opens it, checks the header,
 * marks itself attached and unlinks the name, so that nothing is left in
 * /dev/shm once both have it mapped (the coordinator unlinks too, whoever
 * comes first; a segment dies with the last mapping).
 *
 * Layout: one 4096-byte header page (magic, sizes, the attached and
 * aborted words, then each ring's indices on their own cache lines), then
 * the two rings' bytes. Each ring is single producer / single consumer;
 * head and tail are byte counts that only grow (position = count % size).
 * An entry starts on a 64-byte boundary with a 16-byte entry header
 * (size, frame length, payload offset, payload length), the wire frame
 * (header + protobuf body) after it and the payload at the offset given
 * (64-byte aligned). An entry never wraps: a producer that lacks room up
 * to the end writes a wrap marker (frame length UINT32_MAX) over the rest
 * and starts at 0.
 *
 * The peer writes half of these words and every entry, so nothing read
 * from the segment is trusted: the sizes come from this side's own copy,
 * each entry's fields are checked against what is published before a
 * pointer into it is handed out, and a bad one is ECS_ERR_FORMAT (the
 * caller aborts the plane: a ring cannot be resynchronised).
 *
 * Wake-ups: a waiter spins a few microseconds, then sleeps in FUTEX_WAIT on
 * the ring's 32-bit publish counter (shared futex: two processes); a
 * producer bumps the counter and calls FUTEX_WAKE only when the waiter
 * said it sleeps. The same for room: the producer sleeps on the consumer's
 * release counter. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "proto/dplane/dplane.h"
#include "proto/zutil.h"

#define SHM_MAGIC 0x4d485345u /* "ESHM" */
#define SHM_LAYOUT 2u /* 2: the pools' park words */
#define SHM_HDR_BYTES 4096u
#define ENT_HDR 16u
#define ENT_ALIGN 64u
#define WRAP_MARK UINT32_MAX
#define SPIN_NS 20000u /* busy-wait before sleeping: less than a wake-up costs, much less
                        * than a core lent away (ECS_SHM_SPIN_US overrides, 0-1000) */

typedef struct {
    _Alignas(64) _Atomic uint64_t tail; /* producer: bytes published */
    _Atomic uint32_t pub;               /* producer: publish counter (futex word) */
    _Atomic uint32_t sleepers;          /* consumer sleeps on pub */
    _Alignas(64) _Atomic uint64_t head; /* consumer: bytes released */
    _Atomic uint32_t freed;             /* consumer: release counter (futex word) */
    _Atomic uint32_t waiting;           /* producer sleeps on freed */
} ring_ctl_t;

typedef struct {
    uint32_t magic, layout;
    uint64_t seg_bytes, ring_bytes;
    _Atomic uint32_t attached_pid;
    _Atomic uint32_t aborted;
    _Alignas(64) ring_ctl_t ring[2];
    /* futex words the two processes' thread pools sleep on in a hand-off
     * of the cores (ecs_threadpool_handoff): the coordinator's, the
     * worker's. Only ever bumped and waited on: no value in them is read
     * as data, so a peer scribbling on them costs wake-ups, never safety. */
    _Alignas(64) _Atomic uint32_t pool[2];
} shm_hdr_t;

_Static_assert(sizeof(shm_hdr_t) <= SHM_HDR_BYTES, "shm header exceeds its page");

struct dplane_shm {
    shm_hdr_t *h;
    uint8_t *base;
    size_t seg_bytes, ring_bytes;   /* this side's copies: never re-read from the segment */
    bool owner;                     /* the coordinator: created it */
    bool unlinked;
    char name[DPLANE_SHM_NAME];
    uint64_t head[2], tail[2];      /* this side's own index of each ring it drives */
    bool short_wake;                /* sleep with a short slice (set_slice) */
    int64_t spin_ns;                /* dplane_shm_spin; < 0: the default */
    atomic_bool words_out;          /* dplane_shm_pool_word was asked: the header page stays */
};

static long futex(_Atomic uint32_t *w, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)w, op, val, ts, NULL, 0);
}

/* The calling thread's EEVDF slice: 0.1 ms while it sleeps for a ring, so
 * that the wake-up preempts whatever computes on the core it lands on (a
 * thread with a shorter slice gets the earlier deadline), as the ZeroMQ I/O
 * threads do (zu_short_slice_zmq); the default again once awake, since this
 * thread computes and a 0.1 ms slice would have it preempted all the time. */
static void set_slice(bool shortened) { zu_slice_self(shortened ? 100000 : 0); }

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static ecs_err_t map(int fd, size_t bytes, dplane_shm_t *s)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return ecs_error(ECS_ERR_IO, "shm %s: mmap %zu bytes: %s", s->name, bytes,
                         strerror(errno));
    s->h = p;
    s->base = (uint8_t *)p + SHM_HDR_BYTES;
    s->seg_bytes = bytes;
    return ECS_OK;
}

ecs_err_t dplane_shm_create(size_t ring_bytes, dplane_shm_t **out)
{
    static _Atomic unsigned serial;
    *out = NULL;
    ring_bytes = align_up(ring_bytes, 4096);
    if (ring_bytes < 4 * ENT_ALIGN || ring_bytes > DPLANE_SHM_MAX_RING)
        return ecs_error(ECS_ERR_RANGE, "shm: ring of %zu bytes (at most %zu)", ring_bytes,
                         (size_t)DPLANE_SHM_MAX_RING);
    dplane_shm_t *s = calloc(1, sizeof *s);
    if (!s)
        return ecs_error(ECS_ERR_NOMEM, "shm: out of memory");
    s->owner = true;
    s->spin_ns = -1;
    s->ring_bytes = ring_bytes;
    /* the pid and a counter: unique on the host; the random part keeps a
     * stale name from a crashed coordinator with a reused pid apart */
    snprintf(s->name, sizeof s->name, "/ecs-%d-%u-%08lx", (int)getpid(),
             atomic_fetch_add(&serial, 1), (unsigned long)(now_ns() & 0xffffffffu));
    const size_t bytes = SHM_HDR_BYTES + 2 * ring_bytes;
    const int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ecs_err_t e;
    if (fd < 0) {
        e = ecs_error(ECS_ERR_IO, "shm_open %s: %s", s->name, strerror(errno));
        free(s);
        return e;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        e = ecs_error(ECS_ERR_IO, "shm %s: ftruncate %zu: %s", s->name, bytes, strerror(errno));
        close(fd);
        dplane_shm_free(s);
        return e;
    }
    e = map(fd, bytes, s);
    close(fd);
    if (e) {
        dplane_shm_free(s);
        return e;
    }
    s->h->magic = SHM_MAGIC;
    s->h->layout = SHM_LAYOUT;
    s->h->seg_bytes = bytes;
    s->h->ring_bytes = ring_bytes;
    *out = s;
    return ECS_OK;
}

ecs_err_t dplane_shm_attach(const char *name, dplane_shm_t **out)
{
    *out = NULL;
    const size_t nl = name ? strlen(name) : 0;
    if (nl < 2 || nl >= DPLANE_SHM_NAME || name[0] != '/' || strchr(name + 1, '/'))
        return ecs_error(ECS_ERR_INVAL, "shm: bad segment name");
    dplane_shm_t *s = calloc(1, sizeof *s);
    if (!s)
        return ecs_error(ECS_ERR_NOMEM, "shm: out of memory");
    s->spin_ns = -1;
    memcpy(s->name, name, nl + 1);
    ecs_err_t e;
    const int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        e = ecs_error(ECS_ERR_IO, "shm_open %s: %s (not on this host?)", name, strerror(errno));
        if (fd >= 0)
            close(fd);
        free(s);
        return e;
    }
    const size_t bytes = (size_t)st.st_size;
    if (bytes < SHM_HDR_BYTES + 8 * ENT_ALIGN ||
        bytes > SHM_HDR_BYTES + 2 * (size_t)DPLANE_SHM_MAX_RING) {
        close(fd);
        free(s);
        return ecs_error(ECS_ERR_FORMAT, "shm %s: %zu bytes", name, bytes);
    }
    e = map(fd, bytes, s);
    close(fd);
    if (e) {
        free(s);
        return e;
    }
    const uint64_t rb = s->h->ring_bytes;
    if (s->h->magic != SHM_MAGIC || s->h->layout != SHM_LAYOUT || s->h->seg_bytes != bytes ||
        rb % 4096 || rb < 4 * ENT_ALIGN || SHM_HDR_BYTES + 2 * rb != bytes) {
        dplane_shm_free(s);
        return ecs_error(ECS_ERR_FORMAT, "shm %s: not an ECS segment of this layout", name);
    }
    s->ring_bytes = rb;
    /* what the coordinator published before we came would be stale */
    for (int d = 0; d < 2; d++)
        s->head[d] = s->tail[d] = 0;
    atomic_store(&s->h->attached_pid, (uint32_t)getpid());
    shm_unlink(name); /* the name is needed no more: no leftover if either side dies */
    s->unlinked = true;
    *out = s;
    return ECS_OK;
}

const char *dplane_shm_name(const dplane_shm_t *s) { return s->name; }

void dplane_shm_short_wake(dplane_shm_t *s, bool on) { s->short_wake = on; }

void dplane_shm_spin(dplane_shm_t *s, int64_t ns) { s->spin_ns = ns; }

_Atomic uint32_t *dplane_shm_pool_word(dplane_shm_t *s, bool peer)
{
    atomic_store(&s->words_out, true);
    return &s->h->pool[s->owner == peer];
}

uint32_t dplane_shm_attached(const dplane_shm_t *s)
{
    return atomic_load(&s->h->attached_pid);
}

void dplane_shm_unlink(dplane_shm_t *s)
{
    if (s && !s->unlinked) {
        shm_unlink(s->name);
        s->unlinked = true;
    }
}

size_t dplane_shm_ring_bytes(const dplane_shm_t *s) { return s->ring_bytes; }

void dplane_shm_abort(dplane_shm_t *s)
{
    atomic_store(&s->h->aborted, 1);
    for (int d = 0; d < 2; d++) { /* whoever sleeps on either ring wakes and sees it */
        atomic_fetch_add(&s->h->ring[d].pub, 1);
        atomic_fetch_add(&s->h->ring[d].freed, 1);
        futex(&s->h->ring[d].pub, FUTEX_WAKE, INT_MAX, NULL);
        futex(&s->h->ring[d].freed, FUTEX_WAKE, INT_MAX, NULL);
    }
}

bool dplane_shm_aborted(const dplane_shm_t *s) { return atomic_load(&s->h->aborted) != 0; }

void dplane_shm_free(dplane_shm_t *s)
{
    if (!s)
        return;
    dplane_shm_unlink(s);
    if (s->h && atomic_load(&s->words_out)) {
        /* a thread pool given the park words may still bump or read them
         * for a moment (a hand-off asked just before the plane closed, a
         * hand-off's sleep of up to 20 ms): the header page stays mapped
         * for good (4 KiB a closed plane, once per worker (re)start); the
         * rings' memory goes back now */
        uint8_t *rings = (uint8_t *)s->h + SHM_HDR_BYTES;
        madvise(rings, s->seg_bytes - SHM_HDR_BYTES, MADV_REMOVE);
        munmap(rings, s->seg_bytes - SHM_HDR_BYTES);
    } else if (s->h) {
        munmap(s->h, s->seg_bytes);
    }
    free(s);
}

size_t dplane_shm_entry_bytes(size_t frame_cap, size_t payload)
{
    return align_up(align_up(ENT_HDR + frame_cap, ENT_ALIGN) + payload, ENT_ALIGN);
}

ecs_err_t dplane_ring_reserve(dplane_shm_t *s, dplane_ring_t r, size_t frame_cap,
                              size_t payload, dplane_entry_t *e)
{
    const size_t R = s->ring_bytes;
    if (frame_cap > DPLANE_SHM_MAX_FRAME || payload > R)
        return ecs_error(ECS_ERR_RANGE, "shm: an entry of %zu + %zu bytes", frame_cap, payload);
    const size_t off = align_up(ENT_HDR + frame_cap, ENT_ALIGN);
    const size_t size = dplane_shm_entry_bytes(frame_cap, payload);
    if (size > R)
        return ecs_error(ECS_ERR_RANGE, "shm: an entry of %zu bytes in a ring of %zu", size, R);
    if (dplane_shm_aborted(s))
        return ecs_error(ECS_ERR_IO, "shm: the plane was aborted");
    ring_ctl_t *c = &s->h->ring[r];
    const uint64_t tail = s->tail[r];
    const uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
    if (head > tail || tail - head > R) {
        dplane_shm_abort(s);
        return ecs_error(ECS_ERR_FORMAT, "shm: the consumer's index is corrupt");
    }
    const size_t pos = (size_t)(tail % R);
    const size_t skip = R - pos < size ? R - pos : 0;
    if (tail + skip + size - head > R)
        return ecs_error(ECS_ERR_NOMEM, "shm: ring full");
    if (skip) {
        const uint32_t wrap[4] = {(uint32_t)skip, WRAP_MARK, 0, 0};
        memcpy(s->base + (size_t)r * R + pos, wrap, sizeof wrap);
    }
    uint8_t *at = s->base + (size_t)r * R + (skip ? 0 : pos);
    *e = (dplane_entry_t){.frame = at + ENT_HDR, .frame_len = frame_cap,
                          .payload = at + off, .payload_len = payload,
                          .size_ = size, .off_ = off, .next_ = tail + skip + size, .at_ = at};
    return ECS_OK;
}

void dplane_ring_commit(dplane_shm_t *s, dplane_ring_t r, dplane_entry_t *e, size_t frame_len)
{
    const uint32_t h[4] = {(uint32_t)e->size_, (uint32_t)frame_len, (uint32_t)e->off_,
                           (uint32_t)e->payload_len};
    memcpy(e->at_, h, sizeof h);
    ring_ctl_t *c = &s->h->ring[r];
    s->tail[r] = e->next_;
    atomic_store_explicit(&c->tail, e->next_, memory_order_release);
    atomic_fetch_add(&c->pub, 1);
    if (atomic_load(&c->sleepers))
        futex(&c->pub, FUTEX_WAKE, INT_MAX, NULL);
}

ecs_err_t dplane_ring_peek(dplane_shm_t *s, dplane_ring_t r, dplane_entry_t *e)
{
    const size_t R = s->ring_bytes;
    ring_ctl_t *c = &s->h->ring[r];
    for (;;) {
        const uint64_t head = s->head[r];
        const uint64_t tail = atomic_load_explicit(&c->tail, memory_order_acquire);
        if (tail == head)
            return ecs_error(ECS_ERR_NOTFOUND, "shm: ring empty");
        if (tail < head || tail - head > R)
            return ecs_error(ECS_ERR_FORMAT, "shm: the producer's index is corrupt (%llu "
                             "published, %llu consumed)", (unsigned long long)tail,
                             (unsigned long long)head);
        const size_t pos = (size_t)(head % R), avail = (size_t)(tail - head);
        uint32_t h[4];
        memcpy(h, s->base + (size_t)r * R + pos, sizeof h); /* read once: the peer may write */
        const size_t size = h[0], flen = h[1], off = h[2], plen = h[3];
        if (flen == WRAP_MARK) {
            if (size != R - pos || size > avail)
                return ecs_error(ECS_ERR_FORMAT, "shm: bad wrap marker (%zu bytes at %zu)",
                                 size, pos);
            s->head[r] = head + size;
            atomic_store_explicit(&c->head, head + size, memory_order_release);
            continue;
        }
        if (size < ENT_ALIGN || size % ENT_ALIGN || size > avail || size > R - pos ||
            flen > DPLANE_SHM_MAX_FRAME || off % ENT_ALIGN || off < ENT_HDR + flen ||
            off > size || plen > size - off)
            return ecs_error(ECS_ERR_FORMAT, "shm: bad entry at %zu (size %zu, frame %zu, "
                             "payload %zu at %zu)", pos, size, flen, plen, off);
        uint8_t *at = s->base + (size_t)r * R + pos;
        *e = (dplane_entry_t){.frame = at + ENT_HDR, .frame_len = flen, .payload = at + off,
                              .payload_len = plen, .size_ = size, .off_ = off,
                              .next_ = head + size, .at_ = at};
        return ECS_OK;
    }
}

ecs_err_t dplane_entry_decode(const dplane_entry_t *e, uint8_t **buf, size_t *cap,
                              wire_msg_t *out)
{
    memset(out, 0, sizeof *out);
    if (e->frame_len > *cap) {
        uint8_t *f = realloc(*buf, e->frame_len);
        if (!f)
            return ecs_error(ECS_ERR_NOMEM, "shm: no memory for a frame of %zu bytes",
                             e->frame_len);
        *buf = f;
        *cap = e->frame_len;
    }
    /* the peer could rewrite the ring under the decoder: decode a private copy */
    if (e->frame_len)
        memcpy(*buf, e->frame, e->frame_len);
    return wire_decode(*buf, e->frame_len, e->payload, e->payload_len, true, out);
}

void dplane_ring_release(dplane_shm_t *s, dplane_ring_t r, const dplane_entry_t *e)
{
    ring_ctl_t *c = &s->h->ring[r];
    s->head[r] = e->next_;
    atomic_store_explicit(&c->head, e->next_, memory_order_release);
    atomic_fetch_add(&c->freed, 1);
    if (atomic_load(&c->waiting))
        futex(&c->freed, FUTEX_WAKE, INT_MAX, NULL);
}

uint32_t dplane_ring_seq(dplane_shm_t *s, dplane_ring_t r, bool room)
{
    ring_ctl_t *c = &s->h->ring[r];
    return atomic_load(room ? &c->freed : &c->pub);
}

void dplane_ring_kick(dplane_shm_t *s, dplane_ring_t r)
{
    ring_ctl_t *c = &s->h->ring[r];
    atomic_fetch_add(&c->pub, 1);
    if (atomic_load(&c->sleepers))
        futex(&c->pub, FUTEX_WAKE, INT_MAX, NULL);
}

void dplane_ring_wait(dplane_shm_t *s, dplane_ring_t r, bool room, uint32_t seen, int timeout_ms)
{
    ring_ctl_t *c = &s->h->ring[r];
    _Atomic uint32_t *w = room ? &c->freed : &c->pub;
    _Atomic uint32_t *n = room ? &c->waiting : &c->sleepers;
    static _Atomic int64_t spin_ns = -1;
    if (atomic_load(&spin_ns) < 0) {
        const char *e = getenv("ECS_SHM_SPIN_US");
        const long us = e ? atol(e) : -1;
        atomic_store(&spin_ns, us >= 0 && us <= 1000 ? us * 1000 : (int64_t)SPIN_NS);
    }
    const uint64_t t0 = now_ns();
    const uint64_t spin = (uint64_t)(s->spin_ns >= 0 ? s->spin_ns : atomic_load(&spin_ns));
    while (now_ns() - t0 < spin) {
        if (atomic_load(w) != seen || atomic_load(&s->h->aborted))
            return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    if (timeout_ms == 0)
        return;
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000l};
    atomic_fetch_add(n, 1);
    if (atomic_load(w) == seen && !atomic_load(&s->h->aborted)) {
        if (s->short_wake)
            set_slice(true);
        futex(w, FUTEX_WAIT, seen, timeout_ms < 0 ? NULL : &ts);
        if (s->short_wake)
            set_slice(false);
    }
    atomic_fetch_sub(n, 1);
}
