/* test_threadpool.c - the pool runs every share exactly once per call, makes
 * the shares' writes visible to the caller, survives idle periods (threads
 * asleep on the futex) and shuts down cleanly; pinned, thread i runs on
 * the i-th CPU; two pools handing their cores to each other lose no run. */
#include <criterion/criterion.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "common/threadpool.h"

#define MAX_T 4

typedef struct {
    atomic_int count[MAX_T];
    atomic_int bad_nth;
    int seen_nth;
    long data[MAX_T]; /* plain writes: the run's return must publish them */
    long round;
} count_arg_t;

static void count_task(void *p, int ith, int nth)
{
    count_arg_t *a = p;
    if (nth != a->seen_nth || ith < 0 || ith >= nth)
        atomic_fetch_add(&a->bad_nth, 1);
    else {
        atomic_fetch_add(&a->count[ith], 1);
        a->data[ith] = a->round * 100 + ith;
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void run_rounds(ecs_threadpool_t *tp, int n, count_arg_t *a, int idle_ms)
{
    const int nth = ecs_threadpool_size(tp);
    for (int r = 0; r < n; r++) {
        a->round = r + 1;
        ecs_threadpool_run(tp, count_task, a);
        for (int i = 0; i < nth; i++)
            cr_assert_eq(a->data[i], a->round * 100 + i, "round %d thread %d", r, i);
        if (idle_ms)
            sleep_ms(idle_ms);
    }
}

Test(threadpool, each_thread_once_per_run)
{
    for (int size = 1; size <= MAX_T; size++) {
        ecs_threadpool_t *tp = NULL;
        cr_assert_eq(ecs_threadpool_create(size, &tp), ECS_OK);
        cr_assert_eq(ecs_threadpool_size(tp), size);
        count_arg_t a;
        memset(&a, 0, sizeof(a));
        a.seen_nth = size;
        const int rounds = 3000;
        run_rounds(tp, rounds, &a, 0);
        cr_assert_eq(atomic_load(&a.bad_nth), 0);
        for (int i = 0; i < size; i++)
            cr_assert_eq(atomic_load(&a.count[i]), rounds, "size %d thread %d ran %d times", size,
                         i, atomic_load(&a.count[i]));
        for (int i = size; i < MAX_T; i++)
            cr_assert_eq(atomic_load(&a.count[i]), 0);
        ecs_threadpool_destroy(tp);
    }
}

/* Idle gaps longer than the spin window put the workers to sleep on the
 * futex; every run must still wake all of them. */
/* A pool of 3 threads and its zeroed counters. */
static ecs_threadpool_t *pool3(count_arg_t *a)
{
    ecs_threadpool_t *tp = NULL;
    cr_assert_eq(ecs_threadpool_create(3, &tp), ECS_OK);
    memset(a, 0, sizeof(*a));
    a->seen_nth = 3;
    return tp;
}

Test(threadpool, wakes_sleeping_threads)
{
    count_arg_t a;
    ecs_threadpool_t *tp = pool3(&a);
    run_rounds(tp, 20, &a, 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(atomic_load(&a.count[i]), 20);
    ecs_threadpool_destroy(tp);
}

static void slow_task(void *p, int ith, int nth)
{
    (void)nth;
    count_arg_t *a = p;
    if (ith == 1)
        sleep_ms(5); /* the caller outlasts its spin window and sleeps */
    atomic_fetch_add(&a->count[ith], 1);
}

Test(threadpool, caller_waits_for_slow_thread)
{
    ecs_threadpool_t *tp = NULL;
    cr_assert_eq(ecs_threadpool_create(2, &tp), ECS_OK);
    count_arg_t a;
    memset(&a, 0, sizeof(a));
    for (int r = 1; r <= 5; r++) {
        ecs_threadpool_run(tp, slow_task, &a);
        cr_assert_eq(atomic_load(&a.count[1]), r);
        cr_assert_eq(atomic_load(&a.count[0]), r);
    }
    ecs_threadpool_destroy(tp);
}

/* ecs_threadpool_park between runs (the workers skip their spin and
 * sleep at once) and from another thread during runs: every run still
 * wakes every thread and runs each share once. */
static void *park_loop(void *p)
{
    ecs_threadpool_t *tp = p;
    for (int i = 0; i < 20000; i++)
        ecs_threadpool_park(tp);
    return NULL;
}

Test(threadpool, parked_threads_wake_for_the_next_run)
{
    count_arg_t a;
    ecs_threadpool_t *tp = pool3(&a);
    for (int r = 0; r < 200; r++) {
        run_rounds(tp, 1, &a, 0);
        ecs_threadpool_park(tp);
        if (r % 50 == 0)
            sleep_ms(1);
    }
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, park_loop, tp), 0);
    run_rounds(tp, 2000, &a, 0);
    pthread_join(th, NULL);
    cr_assert_eq(atomic_load(&a.bad_nth), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(atomic_load(&a.count[i]), 2200, "thread %d ran %d times", i,
                     atomic_load(&a.count[i]));
    ecs_threadpool_park(NULL); /* no pool: nothing to park */
    ecs_threadpool_destroy(tp);
}

Test(threadpool, null_pool_runs_inline)
{
    count_arg_t a;
    memset(&a, 0, sizeof(a));
    a.seen_nth = 1;
    ecs_threadpool_run(NULL, count_task, &a);
    cr_assert_eq(atomic_load(&a.count[0]), 1);
    cr_assert_eq(ecs_threadpool_size(NULL), 1);
    ecs_threadpool_destroy(NULL);
}

Test(threadpool, bad_size_rejected)
{
    ecs_threadpool_t *tp = (ecs_threadpool_t *)&tp;
    cr_assert_eq(ecs_threadpool_create(0, &tp), ECS_ERR_RANGE);
    cr_assert_null(tp);
    cr_assert_eq(ecs_threadpool_create(-3, &tp), ECS_ERR_RANGE);
    cr_assert_eq(ecs_threadpool_create(100000, &tp), ECS_ERR_RANGE);
    cr_assert_neq(strlen(ecs_errmsg()), 0);
}

/* Pools created and destroyed repeatedly, some never run, some destroyed
 * while their threads sleep: no hang, no leak (ASan checks the latter). */
Test(threadpool, create_destroy_cycles)
{
    for (int i = 0; i < 50; i++) {
        ecs_threadpool_t *tp = NULL;
        int size = 1 + i % MAX_T;
        cr_assert_eq(ecs_threadpool_create(size, &tp), ECS_OK);
        count_arg_t a;
        memset(&a, 0, sizeof(a));
        a.seen_nth = size;
        if (i % 3 != 0)
            run_rounds(tp, i % 7, &a, 0);
        if (i % 10 == 9)
            sleep_ms(1);
        ecs_threadpool_destroy(tp);
    }
}

/* ecs_threadpool_run_shared: items taken from a shared counter. */
typedef struct {
    atomic_int next;
    int n;
    atomic_int done[256];
    atomic_int in_fn;    /* threads inside fn now */
    atomic_int after;    /* fn calls that began after the run returned */
    atomic_bool returned;
} shared_arg_t;

static void shared_task(void *p, int ith, int nth)
{
    shared_arg_t *a = p;
    (void)ith, (void)nth;
    atomic_fetch_add(&a->in_fn, 1);
    if (atomic_load(&a->returned))
        atomic_fetch_add(&a->after, 1);
    for (;;) {
        const int i = atomic_fetch_add(&a->next, 1);
        if (i >= a->n)
            break;
        atomic_fetch_add(&a->done[i], 1);
    }
    atomic_fetch_sub(&a->in_fn, 1);
}

/* Every item exactly once, no thread still (or newly) inside a run's fn
 * once it returned, and plain runs and shared runs alternating: a thread
 * that skipped a shared run (it came late) must not take a part in the
 * next plain run twice, nor miss it (count_task counts every thread). */
Test(threadpool, shared_runs_each_item_once_and_mix_with_plain_runs)
{
    for (int size = 2; size <= MAX_T; size++) {
        ecs_threadpool_t *tp = NULL;
        cr_assert_eq(ecs_threadpool_create(size, &tp), ECS_OK);
        static shared_arg_t s[2];
        for (int r = 0; r < 3000; r++) {
            shared_arg_t *a = &s[r & 1];
            memset(a, 0, sizeof *a);
            a->n = 1 + r % 256;
            ecs_threadpool_run_shared(tp, shared_task, a);
            atomic_store(&a->returned, true);
            cr_assert_eq(atomic_load(&a->in_fn), 0, "size %d round %d: a thread still in fn",
                         size, r);
            for (int i = 0; i < a->n; i++)
                cr_assert_eq(atomic_load(&a->done[i]), 1, "size %d round %d item %d", size, r, i);
            if (r % 3 == 0) {
                count_arg_t c;
                memset(&c, 0, sizeof c);
                c.seen_nth = size;
                c.round = r + 1;
                ecs_threadpool_run(tp, count_task, &c);
                for (int i = 0; i < size; i++)
                    cr_assert_eq(atomic_load(&c.count[i]), 1, "size %d round %d thread %d",
                                 size, r, i);
                cr_assert_eq(atomic_load(&c.bad_nth), 0);
            }
            if (r % 500 == 499)
                sleep_ms(2); /* the workers fall asleep on the futex */
        }
        /* the previous round's fn is never entered after its run returned */
        cr_assert_eq(atomic_load(&s[0].after) + atomic_load(&s[1].after), 0);
        ecs_threadpool_destroy(tp);
    }
}

/* A shared run's fn that records the most threads inside it at once. */
typedef struct {
    atomic_int in_fn, most, items;
} width_arg_t;

static void width_task(void *p, int ith, int nth)
{
    width_arg_t *a = p;
    (void)ith, (void)nth;
    const int now = atomic_fetch_add(&a->in_fn, 1) + 1;
    int m = atomic_load(&a->most);
    while (now > m && !atomic_compare_exchange_weak(&a->most, &m, now))
        ;
    sleep_ms(1); /* long enough for every woken thread to try to join */
    atomic_fetch_add(&a->items, 1);
    atomic_fetch_sub(&a->in_fn, 1);
}

/* ecs_threadpool_set_active (a worker's call on its share of the cores):
 * plain runs give exactly the active shares with nth = active, shared runs
 * never have more than active threads inside, 1 runs inline; the whole
 * pool again afterwards; out-of-range counts refused. */
Test(threadpool, active_count_limits_runs)
{
    ecs_threadpool_t *tp = NULL;
    cr_assert_eq(ecs_threadpool_create(MAX_T, &tp), ECS_OK);
    for (int act = 1; act <= MAX_T; act++) {
        cr_assert_eq(ecs_threadpool_set_active(tp, act), ECS_OK);
        cr_assert_eq(ecs_threadpool_size(tp), act);
        cr_assert_eq(ecs_threadpool_capacity(tp), MAX_T);
        count_arg_t a;
        memset(&a, 0, sizeof a);
        a.seen_nth = act;
        for (int r = 0; r < 200; r++) {
            run_rounds(tp, 1, &a, r % 50 == 0 ? 2 : 0);
        }
        cr_assert_eq(atomic_load(&a.bad_nth), 0);
        for (int i = 0; i < MAX_T; i++)
            cr_assert_eq(atomic_load(&a.count[i]), i < act ? 200 : 0, "active %d thread %d ran %d",
                         act, i, atomic_load(&a.count[i]));
        for (int r = 0; r < 20; r++) {
            width_arg_t w;
            memset(&w, 0, sizeof w);
            ecs_threadpool_run_shared(tp, width_task, &w);
            cr_assert_geq(atomic_load(&w.items), 1);
            cr_assert(atomic_load(&w.most) <= act, "active %d: %d threads in a shared run", act,
                      atomic_load(&w.most));
        }
    }
    cr_assert_eq(ecs_threadpool_set_active(tp, 0), ECS_ERR_RANGE);
    cr_assert_eq(ecs_threadpool_set_active(tp, MAX_T + 1), ECS_ERR_RANGE);
    cr_assert(strstr(ecs_errmsg(), "pool of 4"), "%s", ecs_errmsg());
    cr_assert_eq(ecs_threadpool_size(tp), MAX_T, "a refused count changes nothing");
    cr_assert_eq(ecs_threadpool_set_active(NULL, 1), ECS_OK);
    cr_assert_eq(ecs_threadpool_set_active(NULL, 2), ECS_ERR_RANGE);
    ecs_threadpool_destroy(tp);
}

typedef struct {
    atomic_int cpu[MAX_T];
    atomic_int n_allowed[MAX_T]; /* CPUs the thread may use */
} where_arg_t;

static void where_task(void *p, int ith, int nth)
{
    (void)nth;
    where_arg_t *w = p;
    atomic_store(&w->cpu[ith], sched_getcpu());
    cpu_set_t set;
    atomic_store(&w->n_allowed[ith], sched_getaffinity(0, sizeof set, &set) ? -1 : CPU_COUNT(&set));
}

Test(threadpool, pin_puts_thread_i_on_the_ith_cpu)
{
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    int cpus[MAX_T], n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < MAX_T; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    ecs_threadpool_t *tp = NULL;
    cr_assert_eq(ecs_threadpool_create(n, &tp), ECS_OK);
    cr_assert_eq(ecs_threadpool_pin(tp), ECS_OK, "%s", ecs_errmsg());
    for (int r = 0; r < 20; r++) {
        where_arg_t w;
        memset(&w, 0, sizeof w);
        ecs_threadpool_run(tp, where_task, &w);
        for (int i = 0; i < n; i++)
            cr_assert_eq(atomic_load(&w.cpu[i]), cpus[i], "run %d: thread %d on CPU %d, not %d",
                         r, i, atomic_load(&w.cpu[i]), cpus[i]);
    }
    cr_assert_eq(ecs_threadpool_pin(tp), ECS_OK, "pinned already: nothing to do");
    /* unpinned: every thread, the caller at once, may use all of them again
     * (a process forked by the caller would otherwise inherit one CPU) */
    ecs_threadpool_unpin(tp);
    cpu_set_t now;
    cr_assert_eq(sched_getaffinity(0, sizeof now, &now), 0);
    cr_assert(CPU_EQUAL(&now, &set), "the caller still pinned after unpin");
    where_arg_t w;
    memset(&w, 0, sizeof w);
    ecs_threadpool_run(tp, where_task, &w);
    for (int i = 0; i < n; i++)
        cr_assert_eq(atomic_load(&w.n_allowed[i]), CPU_COUNT(&set), "thread %d may use %d CPUs", i,
                     atomic_load(&w.n_allowed[i]));
    /* and pinned again */
    cr_assert_eq(ecs_threadpool_pin(tp), ECS_OK);
    memset(&w, 0, sizeof w);
    ecs_threadpool_run(tp, where_task, &w);
    for (int i = 0; i < n; i++)
        cr_assert(atomic_load(&w.n_allowed[i]) == 1 && atomic_load(&w.cpu[i]) == cpus[i],
                  "re-pinned thread %d", i);
    ecs_threadpool_unpin(tp);
    ecs_threadpool_destroy(tp);
    /* more threads than CPUs: refused, nothing pinned */
    cr_assert_eq(ecs_threadpool_create(CPU_COUNT(&set) + 1, &tp), ECS_OK);
    cr_assert_eq(ecs_threadpool_pin(tp), ECS_ERR_RANGE);
    cr_assert(strstr(ecs_errmsg(), "threads to pin"), "%s", ecs_errmsg());
    ecs_threadpool_destroy(tp);
    cr_assert_eq(ecs_threadpool_pin(NULL), ECS_OK);
}

/* Two pools taking turns as two processes would: each runs, hands its
 * cores to the other through their park words and lets the other's
 * caller go on; the words stand for the shared segment's. */
typedef struct {
    ecs_threadpool_t *tp[2];
    _Atomic uint32_t word[2];
    _Atomic uint32_t turn; /* futex word: whose caller runs, counts up */
    count_arg_t a[2];
    int rounds;
} turns_t;

static void take_turns(turns_t *t, int me)
{
    for (int r = 0; r < t->rounds; r++) {
        uint32_t v;
        while ((v = atomic_load(&t->turn)) % 2 != (uint32_t)me)
            syscall(SYS_futex, (uint32_t *)&t->turn, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
        t->a[me].round = r + 1;
        ecs_threadpool_run(t->tp[me], count_task, &t->a[me]);
        ecs_threadpool_handoff(t->tp[me], &t->word[!me], &t->word[me]);
        atomic_fetch_add(&t->turn, 1);
        syscall(SYS_futex, (uint32_t *)&t->turn, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    }
}

static void *other_side(void *p)
{
    take_turns(p, 1);
    return NULL;
}

Test(threadpool, handoff_between_two_pools_loses_no_run)
{
    static turns_t t;
    memset(&t, 0, sizeof t);
    t.rounds = 300;
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ecs_threadpool_create(2, &t.tp[i]), ECS_OK);
        t.a[i].seen_nth = 2;
    }
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, other_side, &t), 0);
    take_turns(&t, 0);
    pthread_join(th, NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(atomic_load(&t.a[i].bad_nth), 0);
        for (int k = 0; k < 2; k++)
            cr_assert_eq(atomic_load(&t.a[i].count[k]), t.rounds, "pool %d thread %d ran %d of %d",
                         i, k, atomic_load(&t.a[i].count[k]), t.rounds);
        /* each word bumped by the other pool's hand-offs and its own runs
         * waking its sleepers: the hand-offs took place */
        cr_assert_gt(atomic_load(&t.word[i]), 0, "no hand-off reached pool %d (words %u %u)", i, atomic_load(&t.word[0]), atomic_load(&t.word[1]));
        ecs_threadpool_destroy(t.tp[i]);
    }
}

Test(threadpool, handoff_sleeper_joins_the_next_run)
{
    /* nobody hands the cores back: the pool's own next run wakes the
     * thread asleep on its park word, and the run has all its threads */
    ecs_threadpool_t *tp = NULL;
    cr_assert_eq(ecs_threadpool_create(2, &tp), ECS_OK);
    static _Atomic uint32_t peer, own;
    count_arg_t a;
    memset(&a, 0, sizeof a);
    a.seen_nth = 2;
    for (int r = 0; r < 100; r++) {
        run_rounds(tp, 1, &a, 0);
        ecs_threadpool_handoff(tp, &peer, &own);
        if (r % 10 == 0)
            sleep_ms(1);
    }
    run_rounds(tp, 1, &a, 0);
    cr_assert_eq(atomic_load(&a.bad_nth), 0);
    cr_assert_eq(atomic_load(&a.count[0]), 101);
    cr_assert_eq(atomic_load(&a.count[1]), 101);
    cr_assert_gt(atomic_load(&peer), 0, "no idle thread took a hand-off");
    cr_assert_gt(atomic_load(&own), 0, "no run woke a hand-off's sleeper through its word");
    /* a pool of one thread, or no words: a park */
    ecs_threadpool_handoff(tp, NULL, &own);
    run_rounds(tp, 1, &a, 0);
    ecs_threadpool_handoff(NULL, &peer, &own);
    ecs_threadpool_destroy(tp);
}
