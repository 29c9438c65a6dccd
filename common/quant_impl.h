/* quant_impl.h - private to the quant files of common/ (not a public header).
 *
 * quant.c owns the type table and dispatches every row operation through the
 * per-type ops defined in quant_float.c, quant_legacy.c and quant_k.c. The ops
 * work on whole blocks: the public entry points have already checked the
 * type and that n is a multiple of the block size. */
#ifndef ECS_QUANT_IMPL_H
#define ECS_QUANT_IMPL_H

#include <stdint.h>

#include "common/quant.h"

typedef struct {
    void (*to_float)(const void *src, float *dst, int64_t nb);
    void (*from_float)(const float *src, void *dst, int64_t nb);
    /* w: nb blocks of the weight type; a: the matching activation blocks */
    float (*vec_dot)(int64_t nb, const void *w, const void *a);
} quant_ops_t;

extern const quant_ops_t quant_ops_f32, quant_ops_f16, quant_ops_bf16;
extern const quant_ops_t quant_ops_q4_0, quant_ops_q4_1, quant_ops_q5_0, quant_ops_q5_1,
    quant_ops_q8_0, quant_ops_q8_1;
extern const quant_ops_t quant_ops_q2_K, quant_ops_q3_K, quant_ops_q4_K, quant_ops_q5_K,
    quant_ops_q6_K, quant_ops_q8_K;

#endif
