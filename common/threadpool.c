/* threadpool.c - persistent worker threads for the compute kernels.
 *
 * Decode issues a few hundred short parallel calls per token, so a call must
 * cost microseconds: workers spin briefly on a generation counter after each
 * run (the next call usually comes within that window) and only then sleep on
 * a futex, so an idle pool burns no CPU. The caller runs share 0 itself and
 * waits for the others the same way (spin, then futex).
 *
 * Two processes that take turns on the same cores (a coordinator and its
 * spawned worker) pin their pools CPU by CPU and hand the cores over
 * thread by thread: the idle thread on CPU i wakes the other process's
 * thread on CPU i through a futex word both map, then sleeps. A wake-up on
 * the waker's own CPU costs 3-5 us on the VMs here, one that has to bring
 * an idle vCPU back 40-70 us (docs/benchmarks.md, session 35). */
#include "common/threadpool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() atomic_signal_fence(memory_order_seq_cst)
#endif

#define TP_MAX_THREADS ECS_THREADPOOL_MAX
/* How long a waiting thread spins before it sleeps: long enough to bridge the
 * serial work between two kernel calls in a decode step, short enough that an
 * idle pool stops using CPU almost at once. */
#define TP_SPIN_NS 100000
/* A hand-off's sleep on its park word: the other process's hand-off or
 * this pool's next run ends it sooner; the bound only keeps a peer that
 * stopped answering from holding a thread off its ordinary wait. */
#define TP_HANDOFF_SLEEP_NS 20000000
#define HO_ASKED (1ull << 32)
#define JOIN_CLOSED 0x80000000u
#define JOIN_ALL 0x40000000u

struct ecs_threadpool {
    int nthreads;
    _Atomic int active;        /* threads a run uses (ecs_threadpool_set_active) */
    pthread_t *threads;
    /* Written by the caller before it bumps gen; read by workers after. */
    ecs_task_fn fn;
    void *arg;
    _Atomic uint32_t gen;      /* bumped once per run (and once for shutdown) */
    _Atomic uint32_t pending;  /* workers still running the current run */
    _Atomic uint32_t sleepers; /* workers inside futex_wait on gen */
    _Atomic uint32_t caller_sleeping;
    /* The current run's generation (high half) and kind: JOIN_ALL, every
     * thread runs it (ecs_threadpool_run), else the count of the workers
     * that joined it (ecs_threadpool_run_shared; JOIN_CLOSED once the caller
     * has finished the work: later arrivals skip it); left_done: how many
     * of those have finished. A worker that finds another generation here
     * came after its shared run closed. */
    _Atomic uint64_t join;
    _Atomic uint32_t left_done;
    atomic_bool stop;
    atomic_bool parked;        /* ecs_threadpool_park: idle threads skip the spin */
    /* ecs_threadpool_handoff: HO_ASKED | the generation it was asked in
     * (0: none; the next run clears it), the words to wake and to sleep on
     * (futex words in memory shared with the other process), and how many
     * threads sleep on park. */
    _Atomic uint64_t ho_req;
    _Atomic(_Atomic uint32_t *) ho_peer, ho_park;
    _Atomic uint32_t ho_sleepers;
    /* ecs_threadpool_pin: the caller's CPU (-1: not pinned), the CPUs the
     * pinning thread could use (what ecs_threadpool_unpin gives back), and
     * a count of pins and unpins that tells a caller thread its own pin
     * (or unpin) is still to do */
    _Atomic int pin_caller;
    cpu_set_t allowed;
    _Atomic uint32_t pin_gen;
};

typedef struct {
    ecs_threadpool_t *tp;
    int ith;
} worker_arg_t;

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    /* Returns at once if *addr != val; spurious wake-ups are handled by the
     * callers' loops. */
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* The same on a word in memory another process maps (not _PRIVATE). */
static long futex_shared(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins until *addr != val or the spin budget is spent; true if it changed. */
static bool spin_while_equal(_Atomic uint32_t *addr, uint32_t val, atomic_bool *park)
{
    uint64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != val)
            return true;
        if (park && atomic_load_explicit(park, memory_order_relaxed))
            return false;
        cpu_relax();
        if ((i & 63) == 63) {
            uint64_t t = now_ns();
            if (deadline == 0)
                deadline = t + TP_SPIN_NS;
            else if (t > deadline)
                return false;
        }
    }
}

/* A hand-off asked for in generation seen (ecs_threadpool_handoff), taken
 * by this idle thread: it wakes the other process's threads from this CPU
 * and sleeps on its park word until they hand the cores back (or this
 * pool's next run comes), then spins for the run. True with the new
 * generation in *g when one came; false: wait as usual. */
static bool handoff(ecs_threadpool_t *tp, uint32_t seen, uint32_t *g)
{
    uint64_t want = HO_ASKED | seen;
    if (!atomic_compare_exchange_strong(&tp->ho_req, &want, 0))
        return false; /* none, taken by another thread, or a stale one */
    _Atomic uint32_t *peer = atomic_load(&tp->ho_peer), *park = atomic_load(&tp->ho_park);
    const uint32_t pv = atomic_load(park);
    atomic_fetch_add(peer, 1);
    futex_shared(peer, FUTEX_WAKE, INT_MAX, NULL);
    const struct timespec ts = {0, TP_HANDOFF_SLEEP_NS};
    /* seq_cst pairs with start_run's bump-then-check of ho_sleepers */
    atomic_fetch_add(&tp->ho_sleepers, 1);
    if (atomic_load(&tp->gen) == seen)
        futex_shared(park, FUTEX_WAIT, pv, &ts);
    atomic_fetch_sub(&tp->ho_sleepers, 1);
    if (atomic_load(&tp->gen) == seen && !spin_while_equal(&tp->gen, seen, NULL))
        return false;
    *g = atomic_load_explicit(&tp->gen, memory_order_acquire);
    return true;
}

/* Blocks until tp->gen differs from seen; returns the new generation.
 * spin false: sleeps at once (a thread left out of the last run: runs come
 * to it only after ecs_threadpool_set_active, not soon). */
static uint32_t wait_for_gen(ecs_threadpool_t *tp, uint32_t seen, bool spin)
{
    if (spin && spin_while_equal(&tp->gen, seen, &tp->parked))
        return atomic_load_explicit(&tp->gen, memory_order_acquire);
    for (;;) {
        uint32_t hg;
        if (handoff(tp, seen, &hg))
            return hg;
        /* seq_cst pairs with the caller's bump-then-check of sleepers: either
         * the caller sees us counted and wakes us, or we see the new gen. */
        atomic_fetch_add(&tp->sleepers, 1);
        if (atomic_load(&tp->gen) == seen && atomic_load(&tp->ho_req) != (HO_ASKED | seen))
            futex_wait(&tp->gen, seen);
        atomic_fetch_sub(&tp->sleepers, 1);
        uint32_t g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen)
            return g;
    }
}

/* A shared run of generation gen: counts this thread in, unless the run
 * is closed (or is already a later one: then gen's is closed too). */
static bool join_run(ecs_threadpool_t *tp, uint32_t gen)
{
    uint64_t j = atomic_load(&tp->join);
    const uint32_t most = (uint32_t)atomic_load_explicit(&tp->active, memory_order_relaxed) - 1;
    for (;;) {
        if ((uint32_t)(j >> 32) != gen || ((uint32_t)j & JOIN_CLOSED) ||
            ((uint32_t)j & ~(JOIN_CLOSED | JOIN_ALL)) >= most)
            return false; /* closed, or as many helpers as the run takes */
        if (atomic_compare_exchange_weak(&tp->join, &j, j + 1))
            return true;
    }
}

/* The caller's wait until *ctr == want (spin, then futex). */
static void wait_count(ecs_threadpool_t *tp, _Atomic uint32_t *ctr, uint32_t want)
{
    for (;;) {
        uint32_t v = atomic_load_explicit(ctr, memory_order_acquire);
        if (v == want)
            return;
        if (spin_while_equal(ctr, v, NULL))
            continue;
        /* seq_cst pairs with the worker's change-then-check of caller_sleeping */
        atomic_store(&tp->caller_sleeping, 1);
        if (atomic_load(ctr) == v)
            futex_wait(ctr, v);
        atomic_store(&tp->caller_sleeping, 0);
    }
}

/* cpu < 0: back to set. A refusal leaves the thread where it was: slower
 * only. */
static void pin_thread(pthread_t t, int cpu, const cpu_set_t *set)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    if (cpu >= 0)
        CPU_SET(cpu, &one);
    pthread_setaffinity_np(t, sizeof one, cpu >= 0 ? &one : set);
}

/* The pool whose pin (or unpin) this thread, a caller of its runs, has
 * applied to itself, and at which count. */
static _Thread_local const ecs_threadpool_t *caller_pool;
static _Thread_local uint32_t caller_gen;

static void pin_caller(ecs_threadpool_t *tp)
{
    const uint32_t g = atomic_load_explicit(&tp->pin_gen, memory_order_acquire);
    if (caller_pool == tp && caller_gen == g)
        return;
    const int cpu = atomic_load_explicit(&tp->pin_caller, memory_order_relaxed);
    if (cpu >= 0 || caller_pool == tp) /* pinned, or unpinned since this thread was */
        pin_thread(pthread_self(), cpu, &tp->allowed);
    caller_pool = tp;
    caller_gen = g;
}

static void *worker_main(void *p)
{
    worker_arg_t *wa = p;
    ecs_threadpool_t *tp = wa->tp;
    const int ith = wa->ith;
    free(wa);
    uint32_t seen = 0;
    bool left_out = false; /* of the last run (ecs_threadpool_set_active) */
    for (;;) {
        seen = wait_for_gen(tp, seen, !left_out);
        left_out = false;
        if (atomic_load_explicit(&tp->stop, memory_order_acquire))
            return NULL;
        const uint64_t j = atomic_load(&tp->join);
        if ((uint32_t)(j >> 32) != seen)
            continue; /* our shared run closed, maybe the next began: look again */
        if (!((uint32_t)j & JOIN_ALL)) {
            if (!join_run(tp, seen)) {
                /* the caller did the work without us, or the run has
                 * all the threads it takes */
                left_out = ith >= atomic_load_explicit(&tp->active, memory_order_relaxed);
                continue;
            }
            tp->fn(tp->arg, ith, tp->nthreads); /* ith indexes per-thread scratch */
            atomic_fetch_add(&tp->left_done, 1);
            if (atomic_load(&tp->caller_sleeping))
                futex_wake_all(&tp->left_done);
            continue;
        }
        const int nth = atomic_load_explicit(&tp->active, memory_order_relaxed);
        if (ith >= nth) {
            left_out = true; /* pending counts only the active ones */
            continue;
        }
        tp->fn(tp->arg, ith, nth);
        /* seq_cst pairs with the caller's announce-then-check before it sleeps */
        if (atomic_fetch_sub(&tp->pending, 1) == 1 && atomic_load(&tp->caller_sleeping))
            futex_wake_all(&tp->pending);
    }
}

static void stop_workers(ecs_threadpool_t *tp, int nstarted)
{
    atomic_store(&tp->stop, true);
    atomic_fetch_add(&tp->gen, 1);
    futex_wake_all(&tp->gen);
    for (int i = 0; i < nstarted; i++)
        pthread_join(tp->threads[i], NULL);
}

ecs_err_t ecs_threadpool_create(int nthreads, ecs_threadpool_t **out)
{
    *out = NULL;
    if (nthreads < 1 || nthreads > TP_MAX_THREADS)
        return ecs_error(ECS_ERR_RANGE, "thread pool size %d not in [1, %d]", nthreads,
                         TP_MAX_THREADS);
    ecs_threadpool_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return ecs_error(ECS_ERR_NOMEM, "thread pool: out of memory");
    tp->nthreads = nthreads;
    atomic_init(&tp->active, nthreads);
    atomic_init(&tp->pin_caller, -1);
    if (nthreads > 1) {
        tp->threads = calloc((size_t)(nthreads - 1), sizeof(pthread_t));
        if (!tp->threads) {
            free(tp);
            return ecs_error(ECS_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 1; i < nthreads; i++) {
        worker_arg_t *wa = malloc(sizeof(*wa));
        int rc = ENOMEM;
        if (wa) {
            wa->tp = tp;
            wa->ith = i;
            rc = pthread_create(&tp->threads[i - 1], NULL, worker_main, wa);
        }
        if (rc != 0) {
            free(wa);
            stop_workers(tp, i - 1);
            free(tp->threads);
            free(tp);
            return ecs_error(ECS_ERR_NOMEM, "thread pool: cannot start thread %d of %d (%s)", i,
                             nthreads, rc == ENOMEM ? "out of memory" : "pthread_create failed");
        }
    }
    *out = tp;
    return ECS_OK;
}

void ecs_threadpool_destroy(ecs_threadpool_t *tp)
{
    if (!tp)
        return;
    stop_workers(tp, tp->nthreads - 1);
    free(tp->threads);
    free(tp);
}

int ecs_threadpool_size(const ecs_threadpool_t *tp)
{
    return tp ? atomic_load_explicit(&tp->active, memory_order_relaxed) : 1;
}

int ecs_threadpool_capacity(const ecs_threadpool_t *tp)
{
    return tp ? tp->nthreads : 1;
}

ecs_err_t ecs_threadpool_set_active(ecs_threadpool_t *tp, int n)
{
    const int cap = ecs_threadpool_capacity(tp);
    if (n < 1 || n > cap)
        return ecs_error(ECS_ERR_RANGE, "thread pool: %d threads asked of a pool of %d", n, cap);
    if (tp) /* read by the workers after the next run's gen (seq_cst store) */
        atomic_store_explicit(&tp->active, n, memory_order_relaxed);
    return ECS_OK;
}

/* Publishes a run of fn to the workers and wakes the sleeping ones; kind:
 * JOIN_ALL (every thread runs it) or 0 (a shared run, joined by count). */
static void start_run(ecs_threadpool_t *tp, ecs_task_fn fn, void *arg, uint32_t kind)
{
    pin_caller(tp);
    atomic_store_explicit(&tp->ho_req, 0, memory_order_relaxed); /* published with gen */
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->parked, false, memory_order_relaxed);
    atomic_store_explicit(&tp->pending, (uint32_t)(atomic_load(&tp->active) - 1),
                          memory_order_relaxed);
    /* every worker that joined the previous shared run has finished it,
     * and a late one of any earlier run finds that run closed: nobody
     * else touches left_done now */
    atomic_store_explicit(&tp->left_done, 0, memory_order_relaxed);
    const uint32_t gen = atomic_load_explicit(&tp->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&tp->join, (uint64_t)gen << 32 | kind, memory_order_relaxed);
    atomic_store(&tp->gen, gen); /* seq_cst: publishes fn/arg/pending/join */
    if (atomic_load(&tp->sleepers) > 0)
        futex_wake_all(&tp->gen);
    if (atomic_load(&tp->ho_sleepers) > 0) { /* a hand-off's sleeper: this run is its */
        _Atomic uint32_t *park = atomic_load(&tp->ho_park);
        atomic_fetch_add(park, 1);
        futex_shared(park, FUTEX_WAKE, INT_MAX, NULL);
    }
}

void ecs_threadpool_run(ecs_threadpool_t *tp, ecs_task_fn fn, void *arg)
{
    if (ecs_threadpool_size(tp) == 1) {
        fn(arg, 0, 1);
        return;
    }
    start_run(tp, fn, arg, JOIN_ALL);
    fn(arg, 0, ecs_threadpool_size(tp));
    wait_count(tp, &tp->pending, 0);
}

void ecs_threadpool_run_shared(ecs_threadpool_t *tp, ecs_task_fn fn, void *arg)
{
    if (ecs_threadpool_size(tp) == 1) {
        fn(arg, 0, 1);
        return;
    }
    start_run(tp, fn, arg, 0);
    fn(arg, 0, tp->nthreads);
    /* the work is all taken: wait only for the threads that are in it (a
     * thread the scheduler has not run yet, its core lent to another
     * process, would otherwise hold the caller for a time slice) */
    const uint32_t joined = (uint32_t)atomic_fetch_or(&tp->join, JOIN_CLOSED) & ~JOIN_CLOSED;
    wait_count(tp, &tp->left_done, joined);
}

void ecs_threadpool_park(ecs_threadpool_t *tp)
{
    /* a park that lands during a run only makes that run's threads sleep
     * after it rather than spin: slower wake-up, never a lost one */
    if (tp && tp->nthreads > 1)
        atomic_store_explicit(&tp->parked, true, memory_order_relaxed);
}

void ecs_threadpool_handoff(ecs_threadpool_t *tp, _Atomic uint32_t *peer, _Atomic uint32_t *own)
{
    if (!tp || tp->nthreads < 2 || !peer || !own) {
        ecs_threadpool_park(tp);
        return;
    }
    atomic_store(&tp->ho_peer, peer);
    atomic_store(&tp->ho_park, own);
    /* a spinning idle thread takes it (parked ends the spin); one already
     * asleep is woken for it: that wake-up crosses CPUs, as the other
     * process's first run would have to without the hand-off. seq_cst
     * pairs with wait_for_gen's count-then-check of sleepers. */
    atomic_store(&tp->ho_req, HO_ASKED | atomic_load(&tp->gen));
    atomic_store_explicit(&tp->parked, true, memory_order_relaxed);
    if (atomic_load(&tp->sleepers) > 0)
        futex_wake_all(&tp->gen);
}

ecs_err_t ecs_threadpool_pin(ecs_threadpool_t *tp)
{
    if (!tp || atomic_load(&tp->pin_caller) >= 0)
        return ECS_OK; /* pinned already */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set))
        return ecs_error(ECS_ERR_IO, "thread pool: cannot read the CPUs this process may use");
    int cpus[TP_MAX_THREADS], n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < tp->nthreads; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    if (n < tp->nthreads)
        return ecs_error(ECS_ERR_RANGE, "thread pool: %d threads to pin, this process may use %d "
                         "CPUs", tp->nthreads, CPU_COUNT(&set));
    tp->allowed = set;
    for (int i = 1; i < tp->nthreads; i++)
        pin_thread(tp->threads[i - 1], cpus[i], NULL);
    atomic_store(&tp->pin_caller, cpus[0]);
    atomic_fetch_add(&tp->pin_gen, 1);
    return ECS_OK;
}

void ecs_threadpool_unpin(ecs_threadpool_t *tp)
{
    if (!tp || atomic_load(&tp->pin_caller) < 0)
        return;
    for (int i = 1; i < tp->nthreads; i++)
        pin_thread(tp->threads[i - 1], -1, &tp->allowed);
    atomic_store(&tp->pin_caller, -1);
    atomic_fetch_add(&tp->pin_gen, 1);
    if (caller_pool == tp) /* this thread at once; other callers at their next run */
        pin_caller(tp);
}
