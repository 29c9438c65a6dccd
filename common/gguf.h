/* gguf.h - reading and writing GGUF model files (versions 2 and 3).
 *
 * The reader mmaps the file read-only and validates everything before use:
 * every count and string length is bounded by the file size, every tensor
 * lies inside the data section with a byte size that matches its type and
 * shape, and offsets are aligned. Metadata values are parsed into a small
 * tree whose strings point into the mapping (not NUL-terminated). Tensor data
 * is never copied.
 *
 * The writer collects metadata and tensor infos, writes the header, then
 * takes each tensor's data in declaration order, so a multi-GB model can be
 * streamed to disk. */
#ifndef ECS_GGUF_H
#define ECS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "err.h"
#include "quant.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef enum {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT,
} gguf_type_t;

typedef struct {
    const char *ptr; /* not NUL-terminated */
    uint64_t len;
} gguf_str_t;

typedef struct gguf_value {
    gguf_type_t type;
    union {
        uint64_t u64; /* every unsigned integer type */
        int64_t i64;  /* every signed integer type */
        double f64;   /* FLOAT32 and FLOAT64 */
        bool b;
        gguf_str_t str;
        struct {
            gguf_type_t elem_type;
            uint64_t n;
            /* scalar elements: raw little-endian bytes, possibly unaligned
             * (read with memcpy or gguf_arr_*); NULL otherwise */
            const void *raw;
            /* STRING elements: n strings; ARRAY elements: n nested values */
            gguf_str_t *strs;
            struct gguf_value *elems;
        } arr;
    };
} gguf_value_t;

typedef struct {
    gguf_str_t key;
    gguf_value_t value;
} gguf_kv_t;

typedef struct {
    char name[128];   /* NUL-terminated copy (GGUF caps names at 64 bytes) */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous row length; unused dims are 1 */
    ecs_type_t type;
    uint64_t offset;  /* relative to the data section */
    size_t nbytes;
    const void *data; /* inside the mapping */
} gguf_tensor_t;

typedef struct gguf_file gguf_file_t;

/* Opens, maps and validates path. On failure *out is NULL and the message
 * names the file, the field and its byte offset. */
ecs_err_t gguf_open(const char *path, gguf_file_t **out);
/* Same, over a caller-owned buffer (used by the fuzzer and tests); buf must
 * outlive the returned file. */
ecs_err_t gguf_open_buffer(const void *buf, size_t size, const char *name, gguf_file_t **out);
void gguf_close(gguf_file_t *f);

const char *gguf_path(const gguf_file_t *f);
uint32_t gguf_version(const gguf_file_t *f);
uint32_t gguf_alignment(const gguf_file_t *f);
size_t gguf_file_size(const gguf_file_t *f);

/* The model fingerprint: SHA-256 of the file's bytes before the tensor
 * data (header, metadata and tensor table, alignment padding included).
 * Equal fingerprints mean the same architecture, hyperparameters,
 * tokenizer and tensor names, types, shapes and offsets; the weights'
 * values are not covered (that would read the whole file at every start).
 * What two daemons compare before they serve one model together; print it
 * with ecs_hex (common/hash.h). */
#define GGUF_FINGERPRINT_BYTES 32
void gguf_fingerprint(const gguf_file_t *f, uint8_t out[GGUF_FINGERPRINT_BYTES]);
/* Offset of the tensor data section (the fingerprint covers [0, this)). */
size_t gguf_data_offset(const gguf_file_t *f);
/* The opened file's fstat (device, inode, ctime: which file this mapping
 * is, as no later stat of the path can tell); NULL for a buffer. */
const struct stat *gguf_stat(const gguf_file_t *f);

uint64_t gguf_n_kv(const gguf_file_t *f);
const gguf_kv_t *gguf_kv_at(const gguf_file_t *f, uint64_t i);
/* NULL if absent. */
const gguf_value_t *gguf_find(const gguf_file_t *f, const char *key);

/* Typed getters: ECS_ERR_NOTFOUND if the key is missing, ECS_ERR_TYPE if its
 * type does not convert losslessly (any integer type that fits is accepted
 * for the integer getters; FLOAT32/FLOAT64 for the float getter). */
ecs_err_t gguf_get_u32(const gguf_file_t *f, const char *key, uint32_t *out);
ecs_err_t gguf_get_u64(const gguf_file_t *f, const char *key, uint64_t *out);
ecs_err_t gguf_get_i64(const gguf_file_t *f, const char *key, int64_t *out);
ecs_err_t gguf_get_f32(const gguf_file_t *f, const char *key, float *out);
ecs_err_t gguf_get_bool(const gguf_file_t *f, const char *key, bool *out);
ecs_err_t gguf_get_str(const gguf_file_t *f, const char *key, gguf_str_t *out);
/* An array whose elements have type elem (checked). */
ecs_err_t gguf_get_arr(const gguf_file_t *f, const char *key, gguf_type_t elem,
                       const gguf_value_t **out);
/* Element i of a scalar array, converted as the getters above convert. */
int64_t gguf_arr_i64(const gguf_value_t *arr, uint64_t i);
double gguf_arr_f64(const gguf_value_t *arr, uint64_t i);

/* Default-aware variants: absent key gives def, wrong type is an error. */
ecs_err_t gguf_get_u32_or(const gguf_file_t *f, const char *key, uint32_t def, uint32_t *out);
ecs_err_t gguf_get_f32_or(const gguf_file_t *f, const char *key, float def, float *out);
ecs_err_t gguf_get_bool_or(const gguf_file_t *f, const char *key, bool def, bool *out);

bool gguf_str_eq(gguf_str_t s, const char *cstr);

uint64_t gguf_n_tensors(const gguf_file_t *f);
const gguf_tensor_t *gguf_tensor_at(const gguf_file_t *f, uint64_t i);
const gguf_tensor_t *gguf_find_tensor(const gguf_file_t *f, const char *name);

const char *gguf_type_name(gguf_type_t t);

/* ---- writer ---- */

typedef struct gguf_writer gguf_writer_t;

ecs_err_t gguf_writer_new(gguf_writer_t **out);
void gguf_writer_free(gguf_writer_t *w);

/* Metadata, in the order added; adding a key twice replaces its value. The
 * writer copies everything it is given. */
ecs_err_t gguf_writer_set_u32(gguf_writer_t *w, const char *key, uint32_t v);
ecs_err_t gguf_writer_set_i32(gguf_writer_t *w, const char *key, int32_t v);
ecs_err_t gguf_writer_set_f32(gguf_writer_t *w, const char *key, float v);
ecs_err_t gguf_writer_set_bool(gguf_writer_t *w, const char *key, bool v);
ecs_err_t gguf_writer_set_str(gguf_writer_t *w, const char *key, const char *v);
/* Any value tree, e.g. one taken from gguf_find() on another file (used to
 * copy tokenizer metadata), or a nested array built by hand. */
ecs_err_t gguf_writer_set_value(gguf_writer_t *w, const char *key, const gguf_value_t *v);
/* Scalar array of n elements of type elem from raw little-endian bytes. */
ecs_err_t gguf_writer_set_arr(gguf_writer_t *w, const char *key, gguf_type_t elem,
                              const void *data, uint64_t n);
ecs_err_t gguf_writer_set_arr_str(gguf_writer_t *w, const char *key,
                                  const char *const *strs, uint64_t n);
ecs_err_t gguf_writer_set_version(gguf_writer_t *w, uint32_t version); /* 2 or 3; default 3 */
ecs_err_t gguf_writer_set_alignment(gguf_writer_t *w, uint32_t alignment); /* writes general.alignment */

/* Declares a tensor; data follows later in declaration order. */
ecs_err_t gguf_writer_add_tensor(gguf_writer_t *w, const char *name, ecs_type_t type,
                                 uint32_t n_dims, const int64_t *ne);

/* Writes header, metadata and tensor infos to path. */
ecs_err_t gguf_writer_begin(gguf_writer_t *w, const char *path);
/* The next declared tensor's bytes (exactly its size). */
ecs_err_t gguf_writer_write_tensor(gguf_writer_t *w, const void *data, size_t nbytes);
/* Checks that every tensor was written, pads, closes the file. */
ecs_err_t gguf_writer_finish(gguf_writer_t *w);

#endif
