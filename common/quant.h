/* quant.h - tensor element types and their block layouts.
 *
 * The enum values are GGUF's type ids (append-only, explicit numbers) and the
 * block structs are bit-compatible with the files llama.cpp writes. For each
 * type: dequantize a row, quantize a row (the scalar reference), and a scalar
 * reference dot product of a weight row with an activation row quantized to
 * the type's vec_dot_type. The SIMD kernels in kernels/cpu are tested against
 * these references. */
#ifndef ECS_QUANT_H
#define ECS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    ECS_TYPE_F32 = 0,
    ECS_TYPE_F16 = 1,
    ECS_TYPE_Q4_0 = 2,
    ECS_TYPE_Q4_1 = 3,
    /* 4, 5: removed Q4_2/Q4_3, never valid */
    ECS_TYPE_Q5_0 = 6,
    ECS_TYPE_Q5_1 = 7,
    ECS_TYPE_Q8_0 = 8,
    ECS_TYPE_Q8_1 = 9,
    ECS_TYPE_Q2_K = 10,
    ECS_TYPE_Q3_K = 11,
    ECS_TYPE_Q4_K = 12,
    ECS_TYPE_Q5_K = 13,
    ECS_TYPE_Q6_K = 14,
    ECS_TYPE_Q8_K = 15,
    ECS_TYPE_BF16 = 30,
    ECS_TYPE_COUNT = 31, /* one past the largest id; not every id below is valid */
} ecs_type_t;

#define ECS_QK 32   /* block size of the legacy quants (Q4_0 .. Q8_1) */
#define ECS_QK_K 256 /* super-block size of the k-quants */
#define ECS_K_SCALE_SIZE 12

typedef uint16_t ecs_fp16_t;
typedef uint16_t ecs_bf16_t;

typedef struct { ecs_fp16_t d; uint8_t qs[ECS_QK / 2]; } ecs_block_q4_0;
typedef struct { ecs_fp16_t d, m; uint8_t qs[ECS_QK / 2]; } ecs_block_q4_1;
typedef struct { ecs_fp16_t d; uint8_t qh[4]; uint8_t qs[ECS_QK / 2]; } ecs_block_q5_0;
typedef struct { ecs_fp16_t d, m; uint8_t qh[4]; uint8_t qs[ECS_QK / 2]; } ecs_block_q5_1;
typedef struct { ecs_fp16_t d; int8_t qs[ECS_QK]; } ecs_block_q8_0;
typedef struct { ecs_fp16_t d, s; int8_t qs[ECS_QK]; } ecs_block_q8_1; /* s = d * sum(qs) */

typedef struct {
    uint8_t scales[ECS_QK_K / 16]; /* 4-bit scale | 4-bit min per 16 values */
    uint8_t qs[ECS_QK_K / 4];
    ecs_fp16_t d, dmin;
} ecs_block_q2_K;
typedef struct {
    uint8_t hmask[ECS_QK_K / 8];
    uint8_t qs[ECS_QK_K / 4];
    uint8_t scales[ECS_K_SCALE_SIZE]; /* 16 x 6-bit scales */
    ecs_fp16_t d;
} ecs_block_q3_K;
typedef struct {
    ecs_fp16_t d, dmin;
    uint8_t scales[ECS_K_SCALE_SIZE]; /* 8 x (6-bit scale, 6-bit min) */
    uint8_t qs[ECS_QK_K / 2];
} ecs_block_q4_K;
typedef struct {
    ecs_fp16_t d, dmin;
    uint8_t scales[ECS_K_SCALE_SIZE];
    uint8_t qh[ECS_QK_K / 8];
    uint8_t qs[ECS_QK_K / 2];
} ecs_block_q5_K;
typedef struct {
    uint8_t ql[ECS_QK_K / 2];
    uint8_t qh[ECS_QK_K / 4];
    int8_t scales[ECS_QK_K / 16];
    ecs_fp16_t d;
} ecs_block_q6_K;
typedef struct {
    float d;
    int8_t qs[ECS_QK_K];
    int16_t bsums[ECS_QK_K / 16]; /* sum of each 16 qs */
} ecs_block_q8_K;

typedef struct {
    const char *name;        /* "q4_K", as ggml names it */
    int64_t blck_size;       /* elements per block */
    size_t type_size;        /* bytes per block */
    ecs_type_t vec_dot_type; /* activation type the dot product takes */
    bool is_weight;          /* may appear as a weight tensor in a model */
} ecs_type_traits_t;

/* NULL for an id that is not a type this build knows. */
const ecs_type_traits_t *ecs_type_traits(ecs_type_t type);
bool ecs_type_valid(uint32_t type);
const char *ecs_type_name(ecs_type_t type);

/* Bytes of a row of n elements; 0 if n is not a multiple of the block size
 * or the type is unknown. */
size_t ecs_row_size(ecs_type_t type, int64_t n);

float ecs_fp16_to_f32(ecs_fp16_t h);
ecs_fp16_t ecs_f32_to_fp16(float f); /* round to nearest even */
float ecs_bf16_to_f32(ecs_bf16_t h);
ecs_bf16_t ecs_f32_to_bf16(float f); /* round to nearest even */

/* n must be a multiple of the type's block size (callers check with
 * ecs_row_size). */
void ecs_dequantize_row(ecs_type_t type, const void *src, float *dst, int64_t n);
/* Reference quantizer (as ggml's quantize_row_*_ref). */
void ecs_quantize_row(ecs_type_t type, const float *src, void *dst, int64_t n);
/* Scalar reference dot product: w is a row of `type`, a a row of n values
 * of ecs_type_traits(type)->vec_dot_type. */
float ecs_vec_dot_ref(ecs_type_t type, int64_t n, const void *w, const void *a);

#endif
