/* dispatch.c - picks the kernels for this CPU at run time.
 *
 * The ISA is detected with cpuid/xgetbv (the OS must also save the wide
 * registers), can be lowered with ECS_ISA=scalar|avx2|avx512 or
 * kcpu_set_isa(), and every lookup falls back to a lower ISA, down to the
 * scalar references of common/quant.h. */
#include <cpuid.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

/* ---- ISA detection ---- */

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static kcpu_isa_t detect(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return KCPU_ISA_SCALAR;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
               f16c = c & (1u << 29);
    if (!(osxsave && avx && fma && f16c))
        return KCPU_ISA_SCALAR;
    const uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) /* SSE and AVX state */
        return KCPU_ISA_SCALAR;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 5)))
        return KCPU_ISA_SCALAR;
    /* DQ as well: the Makefile builds *_avx512.c with -mavx512dq, so the
     * compiler may use it anywhere in those files. Every VNNI CPU has it. */
    const bool f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31),
               vnni = c & (1u << 11);
    if (f && dq && bw && vl && vnni && (xcr0 & 0xE0) == 0xE0) /* opmask, ZMM state */
        return KCPU_ISA_AVX512;
    return KCPU_ISA_AVX2;
}

kcpu_isa_t kcpu_isa_detect(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        v = (int)detect();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return (kcpu_isa_t)v;
}

static _Atomic int g_isa = -1;

static kcpu_isa_t isa_from_env(kcpu_isa_t best)
{
    const char *e = getenv("ECS_ISA");
    if (!e)
        return best;
    kcpu_isa_t want = best;
    if (strcmp(e, "scalar") == 0)
        want = KCPU_ISA_SCALAR;
    else if (strcmp(e, "avx2") == 0)
        want = KCPU_ISA_AVX2;
    else if (strcmp(e, "avx512") == 0)
        want = KCPU_ISA_AVX512;
    return want < best ? want : best;
}

kcpu_isa_t kcpu_isa(void)
{
    int v = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (v < 0) {
        int init = (int)isa_from_env(kcpu_isa_detect());
        int expected = -1;
        /* a concurrent kcpu_set_isa() wins over the environment default */
        if (!atomic_compare_exchange_strong(&g_isa, &expected, init))
            return (kcpu_isa_t)expected;
        v = init;
    }
    return (kcpu_isa_t)v;
}

kcpu_isa_t kcpu_set_isa(kcpu_isa_t isa)
{
    kcpu_isa_t best = kcpu_isa_detect();
    if ((int)isa < (int)KCPU_ISA_SCALAR)
        isa = KCPU_ISA_SCALAR;
    if (isa > best)
        isa = best;
    atomic_store(&g_isa, (int)isa);
    return isa;
}

const char *kcpu_isa_name(kcpu_isa_t isa)
{
    switch (isa) {
    case KCPU_ISA_SCALAR: return "scalar";
    case KCPU_ISA_AVX2: return "avx2";
    case KCPU_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

/* ---- scalar level: the references ---- */

#define REF_DOT(name, type)                                                                   \
    static float ref_##name(int64_t n, const void *w, const void *a)                          \
    {                                                                                         \
        return ecs_vec_dot_ref(type, n, w, a);                                                \
    }
REF_DOT(f32, ECS_TYPE_F32)
REF_DOT(f16, ECS_TYPE_F16)
REF_DOT(bf16, ECS_TYPE_BF16)
REF_DOT(q4_0, ECS_TYPE_Q4_0)
REF_DOT(q4_1, ECS_TYPE_Q4_1)
REF_DOT(q5_0, ECS_TYPE_Q5_0)
REF_DOT(q5_1, ECS_TYPE_Q5_1)
REF_DOT(q8_0, ECS_TYPE_Q8_0)
REF_DOT(q2_K, ECS_TYPE_Q2_K)
REF_DOT(q3_K, ECS_TYPE_Q3_K)
REF_DOT(q4_K, ECS_TYPE_Q4_K)
REF_DOT(q5_K, ECS_TYPE_Q5_K)
REF_DOT(q6_K, ECS_TYPE_Q6_K)

static kcpu_vec_dot_fn ref_dot(ecs_type_t t)
{
    switch (t) {
    case ECS_TYPE_F32: return ref_f32;
    case ECS_TYPE_F16: return ref_f16;
    case ECS_TYPE_BF16: return ref_bf16;
    case ECS_TYPE_Q4_0: return ref_q4_0;
    case ECS_TYPE_Q4_1: return ref_q4_1;
    case ECS_TYPE_Q5_0: return ref_q5_0;
    case ECS_TYPE_Q5_1: return ref_q5_1;
    case ECS_TYPE_Q8_0: return ref_q8_0;
    case ECS_TYPE_Q2_K: return ref_q2_K;
    case ECS_TYPE_Q3_K: return ref_q3_K;
    case ECS_TYPE_Q4_K: return ref_q4_K;
    case ECS_TYPE_Q5_K: return ref_q5_K;
    case ECS_TYPE_Q6_K: return ref_q6_K;
    default: return NULL;
    }
}

/* ---- lookups ---- */

static kcpu_kernel_t kernel_at(ecs_type_t wtype, kcpu_isa_t isa)
{
    kcpu_kernel_t none = {NULL, NULL, NULL};
    if (isa > kcpu_isa_detect())
        return none; /* never hand out code this CPU cannot run */
    switch (isa) {
    case KCPU_ISA_AVX512: return kcpu_kernel_avx512(wtype);
    case KCPU_ISA_AVX2: return kcpu_kernel_avx2(wtype);
    case KCPU_ISA_SCALAR: {
        kcpu_kernel_t k = {ref_dot(wtype), NULL, NULL};
        return k;
    }
    }
    return none;
}

kcpu_vec_dot_fn kcpu_vec_dot_for(ecs_type_t wtype, kcpu_isa_t isa)
{
    return kernel_at(wtype, isa).dot;
}

kcpu_kernel_t kcpu_kernel(ecs_type_t wtype)
{
    for (int isa = (int)kcpu_isa(); isa >= (int)KCPU_ISA_SCALAR; isa--) {
        kcpu_kernel_t k = kernel_at(wtype, (kcpu_isa_t)isa);
        if (k.dot)
            return k;
    }
    kcpu_kernel_t none = {NULL, NULL, NULL};
    return none;
}

kcpu_gemm_t kcpu_gemm(ecs_type_t wtype)
{
    if (kcpu_isa() >= KCPU_ISA_AVX512)
        return kcpu_gemm_avx512(wtype);
    return (kcpu_gemm_t){0};
}

void kcpu_quantize_act(ecs_type_t vdt, const float *x, void *out, int64_t n)
{
    const kcpu_isa_t isa = kcpu_isa();
    if (isa >= KCPU_ISA_AVX512 && kcpu_quantize_act_avx512(vdt, x, out, n))
        return;
    if (isa >= KCPU_ISA_AVX2 && kcpu_quantize_act_avx2(vdt, x, out, n))
        return;
    ecs_quantize_row(vdt, x, out, n);
}

size_t kcpu_act_bytes(ecs_type_t wtype, int64_t ncols, int nb)
{
    const ecs_type_traits_t *tr = ecs_type_traits(wtype);
    if (!tr || nb < 0)
        return 0;
    return ecs_row_size(tr->vec_dot_type, ncols) * (size_t)nb;
}

/* Zen 5: AMD's family 1Ah (cpuid leaf 0's vendor, leaf 1's family). */
static bool cpu_is_zen5(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u) /* "Auth"enticAMD */
        return false;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return false;
    const unsigned base = (a >> 8) & 0xF;
    return base == 0xF && base + ((a >> 20) & 0xFF) == 0x1A;
}

/* The decode kernels' prefetch for this CPU, read once: the distance
 * ahead in bytes (a multiple of 4 KB) with bit 0 set for L1.
 * L1 prefetches were chosen on 48 KB L1 caches (Sapphire Rapids, Zen 5);
 * on Zen 4's 32 KB they evict lines still in use, and L2 prefetches gave
 * one-process decode of ds2-lite 1.27x the speed (median of 6 alternated
 * pairs; docs/benchmarks.md, "session 29"). The distance, 8 KB, was chosen
 * on the Intel VM (matmul.c); on Zen 5, 4 KB: tg64 of ds2-lite 1.048 /
 * 1.022 / 1.021x (medians of three series of alternated pairs), 2 KB
 * 0.965x, 16 KB 0.943x (docs/benchmarks.md, "session 30"). */
static int prefetch_traits(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
        v = (cpu_is_zen5() ? 4096 : 8192) | (l1 <= 0 || l1 >= KCPU_PREFETCH_L1_MIN);
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

bool kcpu_prefetch_l1(void)
{
    return prefetch_traits() & 1;
}

size_t kcpu_prefetch_ahead(void)
{
    return (size_t)(prefetch_traits() & ~1);
}
