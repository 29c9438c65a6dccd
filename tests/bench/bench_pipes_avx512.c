/* bench_pipes_avx512.c - what a float operation costs next to vpdpbusd.
 *
 * The batched quantized products are chains of vpdpbusd (zmm) plus, per
 * group of values, some scaling operations. This measures, with everything
 * in registers (assembly), 16 independent vpdpbusd chains per iteration
 * alone and with 6 other independent operations added (float multiply, FMA, int->float convert,
 * vpmulld, vpmaddwd, vpaddd): the extra core cycles per added operation say
 * which operations compete with vpdpbusd for its pipes (docs/benchmarks.md:
 * why Q4_K products scale groups in integers, k4_avx512.c). Core cycles
 * come from the TSC, scaled by a dependent chain of scalar adds (one cycle
 * each) timed the same way. Last, vfmadd231ps and vdpbf16ps chains alone:
 * the float products a cycle that the attention kernels are held against.
 *
 * usage: bench_pipes_avx512 (skips itself, saying so, without AVX-512 VNNI) */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <x86intrin.h>

#define ITERS 20000000L
#define NOINLINE __attribute__((noinline, target("avx512f,avx512vnni,avx512bw")))

enum { ALONE, MULPS, FMA, CVT, MULLD, MADDWD, ADDD, NMODES };
static const char *const NAMES[NMODES] = {"vpdpbusd alone", "+ vmulps",   "+ vfmadd",
                                          "+ vcvtdq2ps",    "+ vpmulld",  "+ vpmaddwd",
                                          "+ vpaddd"};

static double tsc_per_cycle(void)
{
    uint64_t x = 1;
    const uint64_t t0 = __rdtsc();
    for (long i = 0; i < ITERS * 2; i++)
        __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0" : "+r"(x));
    const double ticks = (double)(__rdtsc() - t0) / (8.0 * ITERS);
    return x ? ticks : ticks + 1e-9; /* x keeps the chain */
}

/* 16 independent chains of op on zmm0-15 (sources zmm30, zmm31). */
#define CHAINS_OF(op)                                                                         \
    op " %%zmm31, %%zmm30, %%zmm0\n\t" op " %%zmm31, %%zmm30, %%zmm1\n\t"                     \
    op " %%zmm31, %%zmm30, %%zmm2\n\t" op " %%zmm31, %%zmm30, %%zmm3\n\t"                     \
    op " %%zmm31, %%zmm30, %%zmm4\n\t" op " %%zmm31, %%zmm30, %%zmm5\n\t"                     \
    op " %%zmm31, %%zmm30, %%zmm6\n\t" op " %%zmm31, %%zmm30, %%zmm7\n\t"                     \
    op " %%zmm31, %%zmm30, %%zmm8\n\t" op " %%zmm31, %%zmm30, %%zmm9\n\t"                     \
    op " %%zmm31, %%zmm30, %%zmm10\n\t" op " %%zmm31, %%zmm30, %%zmm11\n\t"                   \
    op " %%zmm31, %%zmm30, %%zmm12\n\t" op " %%zmm31, %%zmm30, %%zmm13\n\t"                   \
    op " %%zmm31, %%zmm30, %%zmm14\n\t" op " %%zmm31, %%zmm30, %%zmm15\n\t"
#define SIX(op)                                                                               \
    op " %%zmm29, %%zmm16, %%zmm16\n\t" op " %%zmm29, %%zmm17, %%zmm17\n\t"                   \
    op " %%zmm29, %%zmm18, %%zmm18\n\t" op " %%zmm29, %%zmm19, %%zmm19\n\t"                   \
    op " %%zmm29, %%zmm20, %%zmm20\n\t" op " %%zmm29, %%zmm21, %%zmm21\n\t"
#define SIX_CVT                                                                               \
    "vcvtdq2ps %%zmm22, %%zmm16\n\t vcvtdq2ps %%zmm23, %%zmm17\n\t"                         \
    "vcvtdq2ps %%zmm24, %%zmm18\n\t vcvtdq2ps %%zmm25, %%zmm19\n\t"                         \
    "vcvtdq2ps %%zmm26, %%zmm20\n\t vcvtdq2ps %%zmm27, %%zmm21\n\t"
/* vpdpbusd's sources: unsigned bytes 255, signed bytes 1 */
#define INIT_VNNI                                                                             \
    "vpternlogd $0xff, %%zmm30, %%zmm30, %%zmm30\n\t vpabsb %%zmm30, %%zmm31\n\t"
#define INIT_ZERO "vpxord %%zmm30, %%zmm30, %%zmm30\n\t vpxord %%zmm31, %%zmm31, %%zmm31\n\t"

/* TSC ticks per iteration of LOOP, written in assembly so that the
 * compiler's register allocation cannot add moves or spills to it. */
#define RUN_ASM(name, INIT, LOOP)                                                             \
    NOINLINE static double name(void)                                                         \
    {                                                                                         \
        long n = ITERS;                                                                       \
        const uint64_t t0 = __rdtsc();                                                        \
        __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n\t" INIT                              \
                         "vpxord %%zmm29, %%zmm29, %%zmm29\n\t"                                \
                         "1:\n\t" LOOP "dec %0\n\t jnz 1b"                                     \
                         : "+r"(n)                                                            \
                         :                                                                    \
                         : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",      \
                           "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",        \
                           "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20",     \
                           "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27",     \
                           "xmm29", "xmm30", "xmm31");                                        \
        return (double)(__rdtsc() - t0) / ITERS;                                              \
    }
/* 16 vpdpbusd chains plus 6 independent operations BODY on zmm16-21 */
#define RUN(name, BODY) RUN_ASM(name, INIT_VNNI, CHAINS_OF("vpdpbusd") BODY)
RUN(run_alone, "")
RUN(run_mulps, SIX("vmulps"))
RUN(run_fma, SIX("vfmadd231ps"))
RUN(run_cvt, SIX_CVT)
RUN(run_mulld, SIX("vpmulld"))
RUN(run_maddwd, SIX("vpmaddwd"))
RUN(run_addd, SIX("vpaddd"))

static double (*const RUNS[NMODES])(void) = {run_alone, run_mulps, run_fma,   run_cvt,
                                             run_mulld, run_maddwd, run_addd};

/* The float products' peaks that the attention kernels are measured
 * against (docs/benchmarks.md): vfmadd231ps (16 products each) or
 * vdpbf16ps (32) chains alone. */
RUN_ASM(run_fma_alone, INIT_ZERO, CHAINS_OF("vfmadd231ps"))
RUN_ASM(run_bf16_alone, INIT_ZERO, CHAINS_OF("vdpbf16ps"))

static void peaks(double tpc)
{
    const struct {
        const char *op;
        double (*run)(void);
        int products;
        bool needs_bf16;
    } ps[] = {{"vfmadd231ps", run_fma_alone, 16, false}, {"vdpbf16ps", run_bf16_alone, 32, true}};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
        if (ps[i].needs_bf16 && !__builtin_cpu_supports("avx512bf16")) {
            printf("pipes   %s skipped: this CPU has no AVX-512 BF16\n", ps[i].op);
            continue;
        }
        ps[i].run(); /* warm-up */
        const double cyc = ps[i].run() / tpc;
        printf("pipes   16 x %-11s alone %6.2f cycles/iteration = %.1f products a cycle\n", ps[i].op,
               cyc, 16.0 * ps[i].products / cyc);
    }
}

int main(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni")) {
        printf("pipes   skipped: this CPU has no AVX-512 VNNI\n");
        return 0;
    }
    const double tpc = tsc_per_cycle();
    printf("pipes   core clock = %.2f x the TSC's (dependent scalar adds)\n", 1.0 / tpc);
    double alone = 0;
    for (int m = 0; m < NMODES; m++) {
        RUNS[m](); /* warm-up */
        const double cyc = RUNS[m]() / tpc;
        if (m == ALONE)
            alone = cyc;
        printf("pipes   16 x vpdpbusd %-16s %6.2f cycles/iteration", NAMES[m], cyc);
        if (m != ALONE)
            printf("   %+.2f cycles per added operation", (cyc - alone) / 6.0);
        printf("\n");
        fflush(stdout);
    }
    peaks(tpc);
    return 0;
}
