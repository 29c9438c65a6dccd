/* bench_wake.c - what one futex wake-up costs on this machine: the time
 * from FUTEX_WAKE to the woken thread running, for a sleeper on another
 * CPU and on the waker's own, with the waker going on computing or going
 * to sleep right after (as a hand-off does). Every hand-off between the
 * coordinator and a worker, and every thread-pool run after an idle spell,
 * pays one; on a VM a sleeper on another vCPU can cost ten times one on the
 * waker's (docs/benchmarks.md, "AMD EPYC VM, session 23").
 *
 * The waker computes 1 ms between wake-ups, so the sleeper has long
 * stopped spinning and its CPU is idle (or running the waker) each time.
 *
 * Then two processes taking turns as a coordinator and its worker do
 * (each computes 200 us, wakes the other through a futex word in shared
 * memory and sleeps): what a turn costs beyond the work with the other
 * process on the waker's CPU (both pinned there: --pin-threads) and on
 * the other CPU (docs/benchmarks.md, "session 35").
 *
 * usage: bench_wake [N]   (N wake-ups per case, default 400; needs 2 CPUs,
 *                          says so and skips the cross-CPU cases otherwise) */
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    _Atomic uint32_t word;    /* bumped once per wake-up */
    _Atomic uint64_t t_wake;  /* when the waker bumped it */
    _Atomic bool ready, stop; /* the sleeper is waiting / the case is over */
    int cpu, n;
    uint64_t *lat; /* ns from wake to run, one per wake-up */
} wake_case_t;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *sleeper(void *p)
{
    wake_case_t *c = p;
    pin(c->cpu);
    for (int i = 0; i < c->n;) {
        const uint32_t v = atomic_load(&c->word);
        atomic_store(&c->ready, true);
        while (atomic_load(&c->word) == v && !atomic_load(&c->stop))
            syscall(SYS_futex, &c->word, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
        if (atomic_load(&c->stop))
            break;
        c->lat[i++] = now_ns() - atomic_load(&c->t_wake);
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One case: the waker on CPU 0, the sleeper on cpu; 0 or -1 (said why). */
static int run_case(int cpu, bool waker_sleeps, int n)
{
    wake_case_t c = {.cpu = cpu, .n = n, .lat = calloc((size_t)n, sizeof(uint64_t))};
    if (!c.lat || pin(0) != 0) {
        fprintf(stderr, "bench_wake: %s\n", c.lat ? "cannot pin to CPU 0" : "out of memory");
        free(c.lat);
        return -1;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, sleeper, &c) != 0) {
        fprintf(stderr, "bench_wake: cannot start a thread\n");
        free(c.lat);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        while (!atomic_load(&c.ready))
            sched_yield();
        atomic_store(&c.ready, false);
        const uint64_t t = now_ns();
        while (now_ns() - t < 1000000u) /* 1 ms of work: the sleeper is asleep */
            ;
        atomic_store(&c.t_wake, now_ns());
        atomic_fetch_add(&c.word, 1);
        syscall(SYS_futex, &c.word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        if (waker_sleeps)
            usleep(2000);
    }
    atomic_store(&c.stop, true);
    atomic_fetch_add(&c.word, 1);
    syscall(SYS_futex, &c.word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    pthread_join(th, NULL);
    qsort(c.lat, (size_t)n, sizeof(uint64_t), cmp_u64);
    printf("sleeper on CPU %d, waker %-18s wake to run: median %6.1f us  p10 %6.1f  p90 %6.1f  "
           "p99 %6.1f\n",
           cpu, waker_sleeps ? "then sleeps:" : "goes on computing:", c.lat[n / 2] / 1e3,
           c.lat[n / 10] / 1e3, c.lat[n * 9 / 10] / 1e3, c.lat[n * 99 / 100] / 1e3);
    free(c.lat);
    return 0;
}

#define TURN_WORK_NS 200000u

/* One side of the turns: me 0 or 1, n turns each. */
static void take_turns(_Atomic uint32_t *turn, int me, int n)
{
    for (int i = 0; i < n; i++) {
        uint32_t v;
        while ((v = atomic_load(turn)) % 2 != (uint32_t)me)
            syscall(SYS_futex, turn, FUTEX_WAIT, v, NULL, NULL, 0);
        const uint64_t t = now_ns();
        while (now_ns() - t < TURN_WORK_NS)
            ;
        atomic_fetch_add(turn, 1);
        syscall(SYS_futex, turn, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
}

/* Two processes, this one on CPU 0 and the child on cpu; 0 or -1. */
static int run_turns(int cpu, int n)
{
    _Atomic uint32_t *turn = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                                  -1, 0);
    if (turn == MAP_FAILED || pin(0) != 0) {
        fprintf(stderr, "bench_wake: cannot map a shared page or pin to CPU 0\n");
        return -1;
    }
    atomic_store(turn, 0);
    const uint64_t t0 = now_ns();
    const pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "bench_wake: fork failed\n");
        munmap((void *)turn, 4096);
        return -1;
    }
    if (pid == 0) {
        pin(cpu);
        take_turns(turn, 1, n);
        _exit(0);
    }
    take_turns(turn, 0, n);
    int st;
    waitpid(pid, &st, 0);
    const double per = (double)(now_ns() - t0) / (2.0 * n) - TURN_WORK_NS;
    printf("two processes taking turns, the other on CPU %d: %6.1f us a turn beyond its work\n",
           cpu, per / 1e3);
    munmap((void *)turn, 4096);
    return 0;
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 400;
    if (n < 10 || n > 100000) {
        fprintf(stderr, "usage: bench_wake [N]  (N wake-ups per case, 10 to 100000)\n");
        return 2;
    }
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int rc = 0;
    for (int sleeps = 0; sleeps < 2; sleeps++) {
        rc |= run_case(0, sleeps, n);
        if (ncpu >= 2)
            rc |= run_case(1, sleeps, n);
        else if (sleeps == 0)
            printf("bench_wake: one CPU: the cross-CPU cases skipped\n");
    }
    rc |= run_turns(0, n);
    if (ncpu >= 2)
        rc |= run_turns(1, n);
    return rc ? 1 : 0;
}
