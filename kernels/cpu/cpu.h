/* cpu.h - CPU compute kernels: quantized dot products, matrix-vector and
 * small-batch matrix products, with runtime SIMD dispatch.
 *
 * Every kernel has a scalar reference (common/quant.h's ecs_vec_dot_ref) and
 * AVX2 / AVX-512 (VNNI) versions chosen at run time with cpuid, so one binary
 * runs on any x86-64. Tests compare each SIMD path against the reference. */
#ifndef ECS_KERNELS_CPU_H
#define ECS_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/quant.h"
#include "common/threadpool.h"

typedef enum {
    KCPU_ISA_SCALAR = 0,
    KCPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KCPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/VNNI (+BF16 where present) */
} kcpu_isa_t;

/* Best ISA this CPU supports. */
kcpu_isa_t kcpu_isa_detect(void);
/* ISA in use (default: detected; ECS_ISA=scalar|avx2|avx512 in the
 * environment lowers it). */
kcpu_isa_t kcpu_isa(void);
/* Lowers (never raises above detected) the ISA in use; returns the ISA now in use. */
kcpu_isa_t kcpu_set_isa(kcpu_isa_t isa);
const char *kcpu_isa_name(kcpu_isa_t isa);

/* dot(w row of n elements of wtype, a row of n elements of wtype's vec_dot_type) */
typedef float (*kcpu_vec_dot_fn)(int64_t n, const void *w, const void *a);
/* The implementation for one ISA (NULL if that ISA has none for wtype; callers
 * then fall back to a lower ISA). */
kcpu_vec_dot_fn kcpu_vec_dot_for(ecs_type_t wtype, kcpu_isa_t isa);

/* Quantizes a row of n floats to vec_dot type vdt (F32, F16, BF16, Q8_0, Q8_1,
 * Q8_K), SIMD where available. Result equals ecs_quantize_row's bit for bit,
 * except that float rounding may differ in the last place of a scale. */
void kcpu_quantize_act(ecs_type_t vdt, const float *x, void *out, int64_t n);

/* A weight matrix: nrows rows of ncols elements of type, row_bytes apart. */
typedef struct {
    ecs_type_t type;
    int64_t ncols;
    int64_t nrows;
    size_t row_bytes;
    const void *data;
} kcpu_mat_t;

#define KCPU_MAX_BATCH 64

/* Bytes needed to hold nb activation rows of ncols quantized for w's type. */
size_t kcpu_act_bytes(ecs_type_t wtype, int64_t ncols, int nb);

/* Quantizes nb rows of x (ldx floats apart) into act (rows packed,
 * ecs_row_size(vdt, ncols) apart) for weights of type wtype. */
void kcpu_quantize_rows(ecs_threadpool_t *tp, ecs_type_t wtype, const float *x, int64_t ldx,
                        int nb, int64_t ncols, void *act);

/* y[b*ldy + r] = dot(W row r, activation row b) for r in [0, w->nrows),
 * b in [0, nb), 1 <= nb <= KCPU_MAX_BATCH. act as made by kcpu_quantize_rows.
 * Output rows are split across the pool's threads. */
void kcpu_matmul_q(ecs_threadpool_t *tp, const kcpu_mat_t *w, const void *act, int nb,
                   float *y, int64_t ldy);

/* Convenience: quantize x into scratch (kcpu_act_bytes large) then matmul. */
void kcpu_matmul(ecs_threadpool_t *tp, const kcpu_mat_t *w, const float *x, int64_t ldx, int nb,
                 float *y, int64_t ldy, void *scratch);

/* ---- Internal to kernels/cpu: how the per-ISA files (*_avx2.c, *_avx512.c)
 * hand their kernels to dispatch.c and matmul.c. Other modules use the API
 * above. ---- */

#define KCPU_MAX_NA 4

/* out[j] = dot(w, a + j*a_stride) for j in [0, na), 1 <= na <= KCPU_MAX_NA:
 * the weight row is decoded once for na activation rows, which is what
 * makes batched (prompt / multi-token) products cheaper than na dots. */
typedef void (*kcpu_dot_multi_fn)(int64_t n, const void *w, const void *a, size_t a_stride,
                                  int na, float *out);

typedef struct {
    kcpu_vec_dot_fn dot;     /* NULL: no kernel for this type on this ISA */
    kcpu_dot_multi_fn multi; /* NULL: callers loop over dot */
} kcpu_kernel_t;

kcpu_kernel_t kcpu_kernel_avx2(ecs_type_t wtype);
kcpu_kernel_t kcpu_kernel_avx512(ecs_type_t wtype);
/* The kernel for wtype at the ISA in use, falling back to lower ISAs (the
 * scalar level always has one for a weight type). */
kcpu_kernel_t kcpu_kernel(ecs_type_t wtype);

/* SIMD activation quantizers; false if vdt has none on that ISA. */
bool kcpu_quantize_act_avx2(ecs_type_t vdt, const float *x, void *out, int64_t n);
bool kcpu_quantize_act_avx512(ecs_type_t vdt, const float *x, void *out, int64_t n);

/* Defines name##_dot (a kcpu_vec_dot_fn) and name##_multi (a
 * kcpu_dot_multi_fn) from impl(NA, n, w, a, a_stride, out), an always-inline
 * kernel whose activation-row count NA is a compile-time constant. */
#define KCPU_DEFINE_KERNEL(name, impl)                                                        \
    static float name##_dot(int64_t n, const void *w, const void *a)                          \
    {                                                                                         \
        float r;                                                                              \
        impl(1, n, w, a, 0, &r);                                                              \
        return r;                                                                             \
    }                                                                                         \
    static void name##_multi(int64_t n, const void *w, const void *a, size_t as, int na,      \
                             float *out)                                                      \
    {                                                                                         \
        switch (na) {                                                                         \
        case 1: impl(1, n, w, a, as, out); break;                                             \
        case 2: impl(2, n, w, a, as, out); break;                                             \
        case 3: impl(3, n, w, a, as, out); break;                                             \
        default: impl(4, n, w, a, as, out); break;                                            \
        }                                                                                     \
    }

#endif
