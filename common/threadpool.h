/* threadpool.h - a persistent pool of worker threads for the compute kernels.
 *
 * Threads are created once; ecs_threadpool_run() wakes them, runs fn on every
 * thread (the caller is thread 0) and returns when all have finished. No
 * thread is created per call. */
#ifndef ECS_THREADPOOL_H
#define ECS_THREADPOOL_H

#include <stdatomic.h>
#include <stdint.h>

#include "err.h"

typedef struct ecs_threadpool ecs_threadpool_t;

/* Most threads a pool takes (the caller included). */
#define ECS_THREADPOOL_MAX 256

/* fn(arg, ith, nth): ith in [0, nth). */
typedef void (*ecs_task_fn)(void *arg, int ith, int nth);

/* nthreads counts the calling thread; 1 means run everything inline. */
ecs_err_t ecs_threadpool_create(int nthreads, ecs_threadpool_t **out);
void ecs_threadpool_destroy(ecs_threadpool_t *tp);
/* The threads a run uses now (ecs_threadpool_set_active; the pool's size
 * until then). */
int ecs_threadpool_size(const ecs_threadpool_t *tp);
/* The pool's size as created (what scratch per thread must cover). */
int ecs_threadpool_capacity(const ecs_threadpool_t *tp);
/* Runs from now on use n threads (the caller included; 1: inline), n in
 * [1, capacity]: a process that shares the host's cores with others takes
 * all of them for a call it computes alone and its share when they
 * compute at once (worker/: the call's thread count). The other threads
 * stay asleep. Between runs, on the thread that runs them; tp NULL: only
 * n == 1. */
ecs_err_t ecs_threadpool_set_active(ecs_threadpool_t *tp, int n);
/* Not reentrant: one run at a time per pool. tp may be NULL (runs inline). */
void ecs_threadpool_run(ecs_threadpool_t *tp, ecs_task_fn fn, void *arg);
/* The same for a fn that takes its work from a counter shared by the
 * threads (whichever thread comes takes the next piece, and a thread that
 * finds none left returns): when the caller is back from its own share,
 * it waits only for the threads that have begun theirs; a thread the
 * scheduler has not run by then skips the run. Never for fns that split
 * the work by ith. */
void ecs_threadpool_run_shared(ecs_threadpool_t *tp, ecs_task_fn fn, void *arg);
/* After a run, idle threads spin briefly for the next one before they
 * sleep. A caller that knows no run comes soon (it now waits for another
 * process that shares the cores) parks them: they sleep at once. The next
 * run wakes them as usual. Any thread may call it; tp may be NULL. */
void ecs_threadpool_park(ecs_threadpool_t *tp);

/* Two processes that take turns on the same cores (a coordinator and the
 * worker it spawned: one computes while the other waits for it) pair
 * their threads CPU by CPU, so that handing the cores over wakes each
 * thread on the waker's own CPU rather than on an idle one, which on a VM
 * costs ten times as much:
 *
 * ecs_threadpool_pin: thread i runs on the i-th CPU the calling thread may
 * use, a thread that calls the runs on the first (at its next run). An
 * error if the pool has more threads than there are CPUs (nothing
 * pinned); pinned already, nothing changes. ecs_threadpool_unpin gives
 * every thread back the CPUs the pinning thread had (a calling thread at
 * once if it is the one that unpins, else at its next run). Between runs.
 *
 * ecs_threadpool_handoff: ecs_threadpool_park for a caller about to wait
 * for the other process: an idle thread (woken if asleep) bumps and wakes
 * peer (the other pool's park word, in memory both processes map) from
 * its CPU, then sleeps on own until the other's hand-off or this pool's
 * next run wakes it, and spins for that run. Between runs, on the thread
 * that runs them; with a NULL word or a pool of one thread it parks.
 *
 *     ecs_threadpool_pin(tp);                       // both processes, once
 *     ecs_threadpool_handoff(tp, their_word, my_word);
 *     send_call(); wait_result();                   // they compute meanwhile
 *     ecs_threadpool_run(tp, fn, arg);              // our cores again */
ecs_err_t ecs_threadpool_pin(ecs_threadpool_t *tp);
void ecs_threadpool_unpin(ecs_threadpool_t *tp);
void ecs_threadpool_handoff(ecs_threadpool_t *tp, _Atomic uint32_t *peer, _Atomic uint32_t *own);

#endif
