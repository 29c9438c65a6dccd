/* quant.c - the element-type table (GGUF ids, ggml names, block geometry,
 * activation types) and the public row entry points of quant.h, which check
 * their arguments and dispatch to the per-type code in quant_float.c,
 * quant_legacy.c and quant_k.c. */
#include <assert.h>
#include <math.h>
#include <stdint.h>

#include "common/quant_impl.h"

/* The block structs must be byte-for-byte ggml's. */
static_assert(sizeof(ecs_block_q4_0) == 18, "q4_0 layout");
static_assert(sizeof(ecs_block_q4_1) == 20, "q4_1 layout");
static_assert(sizeof(ecs_block_q5_0) == 22, "q5_0 layout");
static_assert(sizeof(ecs_block_q5_1) == 24, "q5_1 layout");
static_assert(sizeof(ecs_block_q8_0) == 34, "q8_0 layout");
static_assert(sizeof(ecs_block_q8_1) == 36, "q8_1 layout");
static_assert(sizeof(ecs_block_q2_K) == 84, "q2_K layout");
static_assert(sizeof(ecs_block_q3_K) == 110, "q3_K layout");
static_assert(sizeof(ecs_block_q4_K) == 144, "q4_K layout");
static_assert(sizeof(ecs_block_q5_K) == 176, "q5_K layout");
static_assert(sizeof(ecs_block_q6_K) == 210, "q6_K layout");
static_assert(sizeof(ecs_block_q8_K) == 292, "q8_K layout");

typedef struct {
    ecs_type_traits_t traits;
    const quant_ops_t *ops;
} type_entry_t;

/* Activation types as ggml pairs them. Q8_1 and Q8_K are activation-only
 * (never weights); ggml gives them no dot product, here each dots with its
 * own type so that every valid type has a reference. */
static const type_entry_t types[ECS_TYPE_COUNT] = {
    [ECS_TYPE_F32] = {{"f32", 1, sizeof(float), ECS_TYPE_F32, true}, &quant_ops_f32},
    [ECS_TYPE_F16] = {{"f16", 1, sizeof(ecs_fp16_t), ECS_TYPE_F16, true}, &quant_ops_f16},
    [ECS_TYPE_Q4_0] = {{"q4_0", ECS_QK, sizeof(ecs_block_q4_0), ECS_TYPE_Q8_0, true}, &quant_ops_q4_0},
    [ECS_TYPE_Q4_1] = {{"q4_1", ECS_QK, sizeof(ecs_block_q4_1), ECS_TYPE_Q8_1, true}, &quant_ops_q4_1},
    [ECS_TYPE_Q5_0] = {{"q5_0", ECS_QK, sizeof(ecs_block_q5_0), ECS_TYPE_Q8_0, true}, &quant_ops_q5_0},
    [ECS_TYPE_Q5_1] = {{"q5_1", ECS_QK, sizeof(ecs_block_q5_1), ECS_TYPE_Q8_1, true}, &quant_ops_q5_1},
    [ECS_TYPE_Q8_0] = {{"q8_0", ECS_QK, sizeof(ecs_block_q8_0), ECS_TYPE_Q8_0, true}, &quant_ops_q8_0},
    [ECS_TYPE_Q8_1] = {{"q8_1", ECS_QK, sizeof(ecs_block_q8_1), ECS_TYPE_Q8_1, false}, &quant_ops_q8_1},
    [ECS_TYPE_Q2_K] = {{"q2_K", ECS_QK_K, sizeof(ecs_block_q2_K), ECS_TYPE_Q8_K, true}, &quant_ops_q2_K},
    [ECS_TYPE_Q3_K] = {{"q3_K", ECS_QK_K, sizeof(ecs_block_q3_K), ECS_TYPE_Q8_K, true}, &quant_ops_q3_K},
    [ECS_TYPE_Q4_K] = {{"q4_K", ECS_QK_K, sizeof(ecs_block_q4_K), ECS_TYPE_Q8_K, true}, &quant_ops_q4_K},
    [ECS_TYPE_Q5_K] = {{"q5_K", ECS_QK_K, sizeof(ecs_block_q5_K), ECS_TYPE_Q8_K, true}, &quant_ops_q5_K},
    [ECS_TYPE_Q6_K] = {{"q6_K", ECS_QK_K, sizeof(ecs_block_q6_K), ECS_TYPE_Q8_K, true}, &quant_ops_q6_K},
    [ECS_TYPE_Q8_K] = {{"q8_K", ECS_QK_K, sizeof(ecs_block_q8_K), ECS_TYPE_Q8_K, false}, &quant_ops_q8_K},
    [ECS_TYPE_BF16] = {{"bf16", 1, sizeof(ecs_bf16_t), ECS_TYPE_BF16, true}, &quant_ops_bf16},
};

static const type_entry_t *entry(uint32_t type)
{
    if (type >= ECS_TYPE_COUNT || !types[type].ops)
        return NULL;
    return &types[type];
}

const ecs_type_traits_t *ecs_type_traits(ecs_type_t type)
{
    const type_entry_t *e = entry((uint32_t)type);
    return e ? &e->traits : NULL;
}

bool ecs_type_valid(uint32_t type)
{
    return entry(type) != NULL;
}

const char *ecs_type_name(ecs_type_t type)
{
    const type_entry_t *e = entry((uint32_t)type);
    return e ? e->traits.name : "unknown";
}

size_t ecs_row_size(ecs_type_t type, int64_t n)
{
    const type_entry_t *e = entry((uint32_t)type);
    if (!e || n < 0 || n % e->traits.blck_size != 0)
        return 0;
    const uint64_t nb = (uint64_t)(n / e->traits.blck_size);
    if (nb > SIZE_MAX / e->traits.type_size)
        return 0;
    return (size_t)nb * e->traits.type_size;
}

/* The entry for a row of n elements of type, or NULL if the row is not a
 * whole number of blocks of a known type. */
static const type_entry_t *row_entry(ecs_type_t type, int64_t n)
{
    const type_entry_t *e = entry((uint32_t)type);
    if (!e || n < 0 || n % e->traits.blck_size != 0)
        return NULL;
    return e;
}

/* An invalid call has no error channel here: make it visible as NaNs. */
void ecs_dequantize_row(ecs_type_t type, const void *src, float *dst, int64_t n)
{
    const type_entry_t *e = row_entry(type, n);
    if (!e) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = NAN;
        return;
    }
    e->ops->to_float(src, dst, n / e->traits.blck_size);
}

/* An invalid call writes nothing (the destination's size is unknowable). */
void ecs_quantize_row(ecs_type_t type, const float *src, void *dst, int64_t n)
{
    const type_entry_t *e = row_entry(type, n);
    if (e)
        e->ops->from_float(src, dst, n / e->traits.blck_size);
}

float ecs_vec_dot_ref(ecs_type_t type, int64_t n, const void *w, const void *a)
{
    const type_entry_t *e = row_entry(type, n);
    if (!e)
        return NAN;
    return e->ops->vec_dot(n / e->traits.blck_size, w, a);
}
