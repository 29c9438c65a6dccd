/* bench_icount.c - instructions a decode product retires, per 64 weights:
 * a figure that, unlike a timing, does not depend on the machine's load.
 *
 * valgrind 3.19 cannot run AVX-512 and this project's VMs expose no
 * hardware counters to perf, so the count is taken by single-stepping
 * (ptrace): the process forks, the child runs kcpu_matmul_q on one thread
 * between two markers (SIGUSR1 to itself) and the parent counts the steps
 * between them. Each configuration runs at two matrix heights and reports
 * the slope (the kernel's instructions per 64 weights, nothing per call)
 * and the per-call rest (activation packing, dispatch).
 *
 * usage: bench_icount [TYPE LAYOUT NB NCOLS]...
 *   TYPE q4_K|q5_0|q6_K|q8_0, LAYOUT rows|copy, NB 1..64 activation rows
 *   (decode: 1..3; from 4 on the prompt paths).
 *   No arguments: the decode shapes of DeepSeek-V2-Lite's Q4_K_M mix. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

#define REPS 2

typedef struct {
    const char *type, *layout;
    int nb;
    int64_t ncols;
} cfg_t;

static ecs_type_t type_of(const char *s)
{
    static const struct {
        const char *name;
        ecs_type_t t;
    } T[] = {{"q4_K", ECS_TYPE_Q4_K}, {"q5_0", ECS_TYPE_Q5_0}, {"q6_K", ECS_TYPE_Q6_K},
             {"q8_0", ECS_TYPE_Q8_0}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(s, T[i].name))
            return T[i].t;
    return ECS_TYPE_COUNT;
}

static void *xalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_icount: cannot allocate %zu bytes\n", n);
        exit(2);
    }
    return p;
}

/* The child: REPS products of an nrows x ncols matrix between the markers. */
static int child(const cfg_t *c, int64_t nrows)
{
    const ecs_type_t t = type_of(c->type);
    const ecs_type_t vdt = ecs_type_traits(t)->vec_dot_type;
    const size_t rb = ecs_row_size(t, c->ncols), ab = ecs_row_size(vdt, c->ncols);
    uint8_t *w = xalloc(rb * (size_t)nrows), *act = xalloc(ab * (size_t)c->nb);
    float *x = xalloc(sizeof(float) * (size_t)c->ncols);
    float *y = xalloc(sizeof(float) * (size_t)(nrows * c->nb));
    unsigned s = 1;
    for (int64_t r = 0; r < nrows + c->nb; r++) {
        for (int64_t i = 0; i < c->ncols; i++)
            x[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / (float)(1u << 24) - 0.5f;
        if (r < nrows)
            ecs_quantize_row(t, x, w + (size_t)r * rb, c->ncols);
        else
            kcpu_quantize_act(vdt, x, act + (size_t)(r - nrows) * ab, c->ncols);
    }
    kcpu_mat_t m = {t, c->ncols, nrows, rb, w, NULL};
    if (!strcmp(c->layout, "copy")) {
        if (!kcpu_r16_fits(t, nrows, c->ncols))
            return 3;
        void *r16 = xalloc(kcpu_r16_bytes(t, nrows, c->ncols));
        kcpu_r16_pack(&m, 0, nrows, r16);
        m.r16 = r16;
    }
    kcpu_matmul_q(NULL, &m, act, c->nb, y, nrows); /* scratch grown, caches warm */
    raise(SIGUSR1);
    for (int i = 0; i < REPS; i++)
        kcpu_matmul_q(NULL, &m, act, c->nb, y, nrows);
    raise(SIGUSR1);
    return 0;
}

/* Steps between the child's two markers; -1 on failure. */
static long long count(const cfg_t *c, int64_t nrows)
{
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        ptrace(PTRACE_TRACEME, 0, NULL, NULL);
        raise(SIGSTOP);
        _exit(child(c, nrows));
    }
    long long n = 0;
    int markers = 0, st;
    while (waitpid(pid, &st, 0) == pid) {
        if (WIFEXITED(st))
            return markers == 2 && WEXITSTATUS(st) == 0 ? n : -1;
        if (WIFSIGNALED(st))
            return -1;
        int sig = WSTOPSIG(st);
        if (sig == SIGUSR1) {
            markers++;
            sig = 0;
        } else if (sig == SIGSTOP || sig == SIGTRAP) {
            sig = 0;
        }
        if (markers == 1) {
            n++;
            ptrace(PTRACE_SINGLESTEP, pid, NULL, (void *)(long)sig);
        } else {
            ptrace(PTRACE_CONT, pid, NULL, (void *)(long)sig);
        }
    }
    return -1;
}

static int run(const cfg_t *c)
{
    const ecs_type_t t = type_of(c->type);
    if (t == ECS_TYPE_COUNT || c->nb < 1 || c->nb > 64) {
        fprintf(stderr, "bench_icount: bad configuration %s %s %d\n", c->type, c->layout, c->nb);
        return 1;
    }
    const int64_t h0 = 64, h1 = 192; /* matrix heights: the slope between them */
    const long long n0 = count(c, h0), n1 = count(c, h1);
    if (n0 < 0 || n1 < 0) {
        fprintf(stderr, "bench_icount: %s %s nb=%d: the child failed\n", c->type, c->layout,
                c->nb);
        return 1;
    }
    const double per64 = (double)(n1 - n0) / REPS / (double)((h1 - h0) * c->ncols / 64);
    const double call = (double)n0 / REPS - per64 * (double)(h0 * c->ncols / 64);
    const double bytes64 = (double)ecs_row_size(t, c->ncols) * 64.0 / (double)c->ncols;
    printf("%-5s %-4s nb=%d ncols=%-5lld %7.2f instr/64 weights (%5.2f per row), "
           "%5.1f bytes/64 -> %.2f bytes/instr; +%.0f instr per call\n",
           c->type, c->layout, c->nb, (long long)c->ncols, per64, per64 / c->nb, bytes64,
           bytes64 / per64, call);
    return 0;
}

int main(int argc, char **argv)
{
    static const cfg_t DEF[] = {
        {"q4_K", "rows", 1, 2048}, {"q4_K", "copy", 1, 2048}, {"q5_0", "rows", 1, 1408},
        {"q5_0", "copy", 1, 1408}, {"q6_K", "rows", 1, 2048}, {"q8_0", "rows", 1, 1408},
        {"q8_0", "copy", 1, 1408}, {"q4_K", "copy", 2, 2048}, {"q5_0", "copy", 2, 1408},
        {"q4_K", "copy", 3, 2048}, {"q5_0", "copy", 3, 1408},
    };
    printf("isa %s, %d products per count, slope between 64 and 192 rows\n",
           kcpu_isa_name(kcpu_isa()), REPS);
    int rc = 0;
    if (argc < 2) {
        for (size_t i = 0; i < sizeof DEF / sizeof DEF[0]; i++)
            rc |= run(&DEF[i]);
        return rc;
    }
    for (int i = 1; i + 3 < argc; i += 4) {
        const cfg_t c = {argv[i], argv[i + 1], atoi(argv[i + 2]), atoll(argv[i + 3])};
        rc |= run(&c);
    }
    return rc;
}
