/* gguf_int.h - private to gguf.c (reader) and gguf_write.c (writer), not a
 * public header: the format's constants and the scalar sizes both halves
 * need. */
#ifndef ECS_GGUF_INT_H
#define ECS_GGUF_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/gguf.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_MAX_NAME 64   /* ggml's limit, terminator included */
#define GGUF_MAX_DEPTH 8   /* nested arrays deeper than this are refused */

/* Bytes of one scalar of type t; 0 for strings, arrays and unknown types. */
static inline size_t gguf_scalar_size(gguf_type_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static inline bool gguf_type_is_unsigned(gguf_type_t t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}

static inline bool gguf_type_is_signed(gguf_type_t t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

#endif
