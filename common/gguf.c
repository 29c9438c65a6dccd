/* gguf.c - GGUF v2/v3 reader (mmap + validation) and streaming writer.
 *
 * The reader never trusts a count: every length is checked against the bytes
 * left in the file before anything is allocated, so a lying header fails with
 * a message instead of a huge allocation. Errors name the file, the field and
 * the byte offset where parsing stopped. */
#include "gguf.h"
#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_MAX_NAME 64   /* ggml's limit, terminator included */
#define GGUF_MAX_DEPTH 8   /* nested arrays deeper than this are refused */

struct gguf_file {
    char *path;
    const uint8_t *base;
    size_t size;
    bool mapped;
    uint32_t version;
    uint32_t alignment;
    size_t data_offset;
    struct stat st; /* gguf_open's fstat */
    bool has_st;
    uint64_t n_kv;
    gguf_kv_t *kv;
    uint64_t n_tensors;
    gguf_tensor_t *tensors;
};

/* ---------------------------------------------------------------- reader */

typedef struct {
    const uint8_t *base;
    size_t size;
    size_t pos;
    const char *name; /* file name for messages */
} cursor_t;

static size_t cur_left(const cursor_t *c) { return c->size - c->pos; }

static ecs_err_t cur_read(cursor_t *c, void *dst, size_t n, const char *what)
{
    if (cur_left(c) < n)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: truncated file while reading %s "
                         "(need %zu bytes, %zu left)", c->name, c->pos, what, n, cur_left(c));
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return ECS_OK;
}

static ecs_err_t cur_u32(cursor_t *c, uint32_t *v, const char *what) { return cur_read(c, v, 4, what); }
static ecs_err_t cur_u64(cursor_t *c, uint64_t *v, const char *what) { return cur_read(c, v, 8, what); }

static ecs_err_t cur_str(cursor_t *c, gguf_str_t *s, const char *what)
{
    size_t at = c->pos;
    ecs_err_t err = cur_u64(c, &s->len, what);
    if (err)
        return err;
    if (s->len > cur_left(c))
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: %s has length %llu but only %zu bytes "
                         "are left in the file", c->name, at, what,
                         (unsigned long long)s->len, cur_left(c));
    s->ptr = (const char *)c->base + c->pos;
    c->pos += s->len;
    return ECS_OK;
}

static size_t scalar_size(gguf_type_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *gguf_type_name(gguf_type_t t)
{
    static const char *const names[GGUF_TYPE_COUNT] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
        "string", "array", "uint64", "int64", "float64",
    };
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* Decodes one little-endian scalar of type t at p into v. */
static void scalar_decode(gguf_type_t t, const uint8_t *p, gguf_value_t *v)
{
    v->type = t;
    switch (t) {
    case GGUF_TYPE_UINT8: v->u64 = p[0]; break;
    case GGUF_TYPE_INT8: v->i64 = (int8_t)p[0]; break;
    case GGUF_TYPE_BOOL: v->b = p[0] != 0; break;
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); v->u64 = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); v->i64 = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); v->u64 = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); v->i64 = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); v->f64 = x; break; }
    case GGUF_TYPE_UINT64: memcpy(&v->u64, p, 8); break;
    case GGUF_TYPE_INT64: memcpy(&v->i64, p, 8); break;
    case GGUF_TYPE_FLOAT64: memcpy(&v->f64, p, 8); break;
    default: break;
    }
}

static void value_free(gguf_value_t *v)
{
    if (v->type != GGUF_TYPE_ARRAY)
        return;
    free(v->arr.strs);
    if (v->arr.elems) {
        for (uint64_t i = 0; i < v->arr.n; i++)
            value_free(&v->arr.elems[i]);
        free(v->arr.elems);
    }
    v->arr.strs = NULL;
    v->arr.elems = NULL;
}

static ecs_err_t parse_value(cursor_t *c, gguf_type_t t, gguf_value_t *v, int depth, const char *key);

static ecs_err_t parse_array(cursor_t *c, gguf_value_t *v, int depth, const char *key)
{
    size_t at = c->pos;
    uint32_t et;
    uint64_t n;
    ecs_err_t err;
    if ((err = cur_u32(c, &et, "array element type")) || (err = cur_u64(c, &n, "array length")))
        return err;
    if (et >= GGUF_TYPE_COUNT)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: key '%s': unknown array element type %u",
                         c->name, at, key, et);
    if (depth >= GGUF_MAX_DEPTH)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: key '%s': arrays nested deeper than %d",
                         c->name, at, key, GGUF_MAX_DEPTH);
    /* Each element takes at least one byte (strings and arrays 8 or 12): this
     * bounds n by the file size before any allocation. */
    size_t min_elem = scalar_size(et) ? scalar_size(et) : (et == GGUF_TYPE_STRING ? 8 : 12);
    if (n > cur_left(c) / min_elem)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: key '%s': array of %llu %s elements does "
                         "not fit in the %zu bytes left", c->name, at, key, (unsigned long long)n,
                         gguf_type_name(et), cur_left(c));
    v->type = GGUF_TYPE_ARRAY;
    v->arr.elem_type = et;
    v->arr.n = n;
    v->arr.raw = NULL;
    v->arr.strs = NULL;
    v->arr.elems = NULL;
    if (scalar_size(et)) {
        v->arr.raw = c->base + c->pos;
        c->pos += n * scalar_size(et);
        return ECS_OK;
    }
    if (et == GGUF_TYPE_STRING) {
        v->arr.strs = malloc((n ? n : 1) * sizeof *v->arr.strs);
        if (!v->arr.strs)
            return ecs_error(ECS_ERR_NOMEM, "%s: key '%s': out of memory for %llu strings", c->name,
                             key, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++)
            if ((err = cur_str(c, &v->arr.strs[i], "array string")))
                return err;
        return ECS_OK;
    }
    v->arr.elems = calloc(n ? n : 1, sizeof *v->arr.elems);
    if (!v->arr.elems)
        return ecs_error(ECS_ERR_NOMEM, "%s: key '%s': out of memory for %llu nested arrays", c->name,
                         key, (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++)
        if ((err = parse_value(c, GGUF_TYPE_ARRAY, &v->arr.elems[i], depth + 1, key)))
            return err;
    return ECS_OK;
}

static ecs_err_t parse_value(cursor_t *c, gguf_type_t t, gguf_value_t *v, int depth, const char *key)
{
    size_t sz = scalar_size(t);
    if (sz) {
        if (cur_left(c) < sz)
            return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: truncated file in value of key '%s'",
                             c->name, c->pos, key);
        scalar_decode(t, c->base + c->pos, v);
        c->pos += sz;
        return ECS_OK;
    }
    if (t == GGUF_TYPE_STRING) {
        v->type = t;
        return cur_str(c, &v->str, "string value");
    }
    if (t == GGUF_TYPE_ARRAY)
        return parse_array(c, v, depth, key);
    return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: key '%s' has unknown value type %u", c->name,
                     c->pos, key, (unsigned)t);
}

/* A printable copy of a key for messages. */
static void key_copy(char *dst, size_t cap, gguf_str_t s)
{
    size_t n = s.len < cap - 1 ? s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

static ecs_err_t parse_kvs(gguf_file_t *f, cursor_t *c)
{
    ecs_err_t err;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv_t *kv = &f->kv[i];
        size_t at = c->pos;
        uint32_t t;
        char key[96];
        if ((err = cur_str(c, &kv->key, "metadata key")))
            return err;
        key_copy(key, sizeof key, kv->key);
        if ((err = cur_u32(c, &t, "metadata value type")))
            return err;
        if (t >= GGUF_TYPE_COUNT)
            return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: key '%s' has unknown value type %u",
                             c->name, at, key, t);
        if ((err = parse_value(c, (gguf_type_t)t, &kv->value, 0, key)))
            return err;
        for (uint64_t j = 0; j < i; j++)
            if (f->kv[j].key.len == kv->key.len && !memcmp(f->kv[j].key.ptr, kv->key.ptr, kv->key.len))
                return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: duplicate key '%s'", c->name, at, key);
    }
    return ECS_OK;
}

static ecs_err_t read_alignment(gguf_file_t *f)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_value_t *v = gguf_find(f, "general.alignment");
    if (!v)
        return ECS_OK;
    if (v->type != GGUF_TYPE_UINT32)
        return ecs_error(ECS_ERR_FORMAT, "%s: general.alignment has type %s, expected uint32",
                         f->path, gguf_type_name(v->type));
    if (v->u64 == 0 || (v->u64 & (v->u64 - 1)) || v->u64 > (1u << 20))
        return ecs_error(ECS_ERR_FORMAT, "%s: general.alignment %llu is not a power of two in "
                         "[1, 1 MiB]", f->path, (unsigned long long)v->u64);
    f->alignment = (uint32_t)v->u64;
    return ECS_OK;
}

/* Checks one tensor's dims and type and computes its byte size. */
static ecs_err_t tensor_size(const cursor_t *c, size_t at, gguf_tensor_t *t)
{
    const ecs_type_traits_t *tr = ecs_type_traits(t->type);
    if (!tr)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: tensor '%s' has unknown type %u", c->name,
                         at, t->name, (unsigned)t->type);
    int64_t nelem = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] <= 0)
            return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: tensor '%s' has dimension %d = %lld",
                             c->name, at, t->name, d, (long long)t->ne[d]);
        if (nelem > INT64_MAX / t->ne[d])
            return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: tensor '%s' element count overflows",
                             c->name, at, t->name);
        nelem *= t->ne[d];
    }
    if (t->ne[0] % tr->blck_size)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: tensor '%s': row length %lld is not a "
                         "multiple of %s's block size %lld", c->name, at, t->name,
                         (long long)t->ne[0], tr->name, (long long)tr->blck_size);
    uint64_t blocks = (uint64_t)(nelem / tr->blck_size);
    if (blocks > SIZE_MAX / tr->type_size)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: tensor '%s' byte size overflows", c->name,
                         at, t->name);
    t->nbytes = blocks * tr->type_size;
    return ECS_OK;
}

static ecs_err_t parse_tensor_info(gguf_file_t *f, cursor_t *c, gguf_tensor_t *t)
{
    size_t at = c->pos;
    gguf_str_t name;
    uint32_t type;
    ecs_err_t err;
    if ((err = cur_str(c, &name, "tensor name")))
        return err;
    if (name.len == 0 || name.len >= GGUF_MAX_NAME)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: tensor name length %llu not in [1, %d]",
                         c->name, at, (unsigned long long)name.len, GGUF_MAX_NAME - 1);
    memcpy(t->name, name.ptr, name.len);
    t->name[name.len] = '\0';
    if ((err = cur_u32(c, &t->n_dims, "tensor dimension count")))
        return err;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: tensor '%s' has %u dimensions (max %d)",
                         c->name, at, t->name, t->n_dims, GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if ((uint32_t)d < t->n_dims && (err = cur_u64(c, &ne, "tensor dimension")))
            return err;
        if (ne > INT64_MAX)
            return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: tensor '%s' dimension %d is absurd "
                             "(%llu)", c->name, at, t->name, d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    if ((err = cur_u32(c, &type, "tensor type")) || (err = cur_u64(c, &t->offset, "tensor offset")))
        return err;
    t->type = (ecs_type_t)type;
    if (!ecs_type_valid(type))
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: tensor '%s' has unknown type %u", c->name,
                         at, t->name, type);
    (void)f;
    return tensor_size(c, at, t);
}

static ecs_err_t place_tensors(gguf_file_t *f)
{
    size_t avail = f->size - f->data_offset;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor_t *t = &f->tensors[i];
        if (t->offset % f->alignment)
            return ecs_error(ECS_ERR_FORMAT, "%s: tensor '%s': data offset %llu is not a multiple of "
                             "the alignment %u", f->path, t->name, (unsigned long long)t->offset,
                             f->alignment);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return ecs_error(ECS_ERR_FORMAT, "%s: tensor '%s': data [%llu, +%zu) past the end of "
                             "the file (data section holds %zu bytes from offset %zu)", f->path,
                             t->name, (unsigned long long)t->offset, t->nbytes, avail,
                             f->data_offset);
        t->data = f->base + f->data_offset + t->offset;
        for (uint64_t j = 0; j < i; j++)
            if (!strcmp(f->tensors[j].name, t->name))
                return ecs_error(ECS_ERR_FORMAT, "%s: duplicate tensor name '%s'", f->path, t->name);
    }
    return ECS_OK;
}

static ecs_err_t parse_header(gguf_file_t *f, cursor_t *c)
{
    char magic[4];
    ecs_err_t err;
    if ((err = cur_read(c, magic, 4, "magic")))
        return err;
    if (memcmp(magic, GGUF_MAGIC, 4))
        return ecs_error(ECS_ERR_FORMAT, "%s: offset 0: bad magic (not a GGUF file)", c->name);
    if ((err = cur_u32(c, &f->version, "version")))
        return err;
    if (f->version != 2 && f->version != 3)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset 4: unsupported GGUF version %u (need 2 or 3)",
                         c->name, f->version);
    if ((err = cur_u64(c, &f->n_tensors, "tensor count")) || (err = cur_u64(c, &f->n_kv, "kv count")))
        return err;
    /* a kv takes >= 8+1+4+1 bytes and a tensor info >= 8+1+4+8+4+8 */
    if (f->n_kv > cur_left(c) / 14)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset 16: absurd metadata count %llu for a %zu-byte file",
                         c->name, (unsigned long long)f->n_kv, c->size);
    if (f->n_tensors > cur_left(c) / 33)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset 8: absurd tensor count %llu for a %zu-byte file",
                         c->name, (unsigned long long)f->n_tensors, c->size);
    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors)
        return ecs_error(ECS_ERR_NOMEM, "%s: out of memory for the header", c->name);
    return ECS_OK;
}

static ecs_err_t parse(gguf_file_t *f)
{
    cursor_t c = { f->base, f->size, 0, f->path };
    ecs_err_t err;
    if ((err = parse_header(f, &c)) || (err = parse_kvs(f, &c)) || (err = read_alignment(f)))
        return err;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if ((err = parse_tensor_info(f, &c, &f->tensors[i])))
            return err;
    size_t data = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
    if (f->n_tensors && data > f->size)
        return ecs_error(ECS_ERR_FORMAT, "%s: offset %zu: file ends before the data section",
                         f->path, c.pos);
    f->data_offset = data > f->size ? f->size : data;
    return place_tensors(f);
}

void gguf_close(gguf_file_t *f)
{
    if (!f)
        return;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++)
            value_free(&f->kv[i].value);
    free(f->kv);
    free(f->tensors);
    if (f->mapped && f->base)
        munmap((void *)f->base, f->size);
    free(f->path);
    free(f);
}

static ecs_err_t open_common(gguf_file_t *f, gguf_file_t **out)
{
    ecs_err_t err = parse(f);
    if (err) {
        gguf_close(f);
        return err;
    }
    *out = f;
    return ECS_OK;
}

static gguf_file_t *file_new(const char *name)
{
    gguf_file_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->path = strdup(name ? name : "<buffer>");
    if (!f->path) {
        free(f);
        return NULL;
    }
    return f;
}

ecs_err_t gguf_open_buffer(const void *buf, size_t size, const char *name, gguf_file_t **out)
{
    *out = NULL;
    gguf_file_t *f = file_new(name);
    if (!f)
        return ecs_error(ECS_ERR_NOMEM, "out of memory opening %s", name ? name : "<buffer>");
    f->base = buf;
    f->size = size;
    return open_common(f, out);
}

ecs_err_t gguf_open(const char *path, gguf_file_t **out)
{
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (a regular
     * file ignores the flag; anything else is refused below) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return ecs_error(ECS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ecs_error(ECS_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return ecs_error(ECS_ERR_FORMAT, "%s: offset 0: file of %lld bytes is too small for a GGUF "
                         "header", path, (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return ecs_error(ECS_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    gguf_file_t *f = file_new(path);
    if (!f) {
        munmap(map, (size_t)st.st_size);
        return ecs_error(ECS_ERR_NOMEM, "out of memory opening %s", path);
    }
    f->base = map;
    f->size = (size_t)st.st_size;
    f->mapped = true;
    f->st = st;
    f->has_st = true;
    return open_common(f, out);
}

const char *gguf_path(const gguf_file_t *f) { return f->path; }
uint32_t gguf_version(const gguf_file_t *f) { return f->version; }
uint32_t gguf_alignment(const gguf_file_t *f) { return f->alignment; }
size_t gguf_file_size(const gguf_file_t *f) { return f->size; }
uint64_t gguf_n_kv(const gguf_file_t *f) { return f->n_kv; }
uint64_t gguf_n_tensors(const gguf_file_t *f) { return f->n_tensors; }

const gguf_kv_t *gguf_kv_at(const gguf_file_t *f, uint64_t i)
{
    return i < f->n_kv ? &f->kv[i] : NULL;
}

size_t gguf_data_offset(const gguf_file_t *f) { return f->data_offset; }

const struct stat *gguf_stat(const gguf_file_t *f) { return f->has_st ? &f->st : NULL; }

void gguf_fingerprint(const gguf_file_t *f, uint8_t out[GGUF_FINGERPRINT_BYTES])
{
    ecs_sha256(f->base, f->data_offset, out);
}

const gguf_tensor_t *gguf_tensor_at(const gguf_file_t *f, uint64_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

bool gguf_str_eq(gguf_str_t s, const char *cstr)
{
    size_t n = strlen(cstr);
    return s.len == n && !memcmp(s.ptr, cstr, n);
}

const gguf_value_t *gguf_find(const gguf_file_t *f, const char *key)
{
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key))
            return &f->kv[i].value;
    return NULL;
}

const gguf_tensor_t *gguf_find_tensor(const gguf_file_t *f, const char *name)
{
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

/* ---------------------------------------------------------------- getters */

static bool type_is_unsigned(gguf_type_t t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}

static bool type_is_signed(gguf_type_t t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

static ecs_err_t lookup(const gguf_file_t *f, const char *key, const gguf_value_t **v)
{
    *v = gguf_find(f, key);
    if (!*v)
        return ecs_error(ECS_ERR_NOTFOUND, "%s: missing metadata key '%s'", f->path, key);
    return ECS_OK;
}

static ecs_err_t wrong_type(const gguf_file_t *f, const char *key, const gguf_value_t *v, const char *want)
{
    return ecs_error(ECS_ERR_TYPE, "%s: metadata key '%s' has type %s, expected %s", f->path, key,
                     gguf_type_name(v->type), want);
}

/* Any integer value as a signed 128-bit-safe pair: ok=false if not an integer. */
static bool value_int(const gguf_value_t *v, int64_t *s, uint64_t *u, bool *neg)
{
    if (type_is_unsigned(v->type)) {
        *u = v->u64;
        *neg = false;
        *s = v->u64 > INT64_MAX ? INT64_MAX : (int64_t)v->u64;
        return true;
    }
    if (type_is_signed(v->type)) {
        *s = v->i64;
        *neg = v->i64 < 0;
        *u = *neg ? 0 : (uint64_t)v->i64;
        return true;
    }
    return false;
}

ecs_err_t gguf_get_u64(const gguf_file_t *f, const char *key, uint64_t *out)
{
    const gguf_value_t *v;
    int64_t s;
    uint64_t u;
    bool neg;
    ecs_err_t err = lookup(f, key, &v);
    if (err)
        return err;
    if (!value_int(v, &s, &u, &neg) || neg)
        return wrong_type(f, key, v, "a non-negative integer");
    *out = u;
    return ECS_OK;
}

ecs_err_t gguf_get_u32(const gguf_file_t *f, const char *key, uint32_t *out)
{
    uint64_t u;
    ecs_err_t err = gguf_get_u64(f, key, &u);
    if (err)
        return err;
    if (u > UINT32_MAX)
        return ecs_error(ECS_ERR_RANGE, "%s: metadata key '%s' = %llu does not fit in 32 bits",
                         f->path, key, (unsigned long long)u);
    *out = (uint32_t)u;
    return ECS_OK;
}

ecs_err_t gguf_get_i64(const gguf_file_t *f, const char *key, int64_t *out)
{
    const gguf_value_t *v;
    int64_t s;
    uint64_t u;
    bool neg;
    ecs_err_t err = lookup(f, key, &v);
    if (err)
        return err;
    if (!value_int(v, &s, &u, &neg))
        return wrong_type(f, key, v, "an integer");
    if (!neg && u > INT64_MAX)
        return ecs_error(ECS_ERR_RANGE, "%s: metadata key '%s' does not fit in int64", f->path, key);
    *out = s;
    return ECS_OK;
}

ecs_err_t gguf_get_f32(const gguf_file_t *f, const char *key, float *out)
{
    const gguf_value_t *v;
    ecs_err_t err = lookup(f, key, &v);
    if (err)
        return err;
    if (v->type != GGUF_TYPE_FLOAT32 && v->type != GGUF_TYPE_FLOAT64)
        return wrong_type(f, key, v, "float32");
    *out = (float)v->f64;
    return ECS_OK;
}

/* The value of key, which must have type t. */
static ecs_err_t lookup_typed(const gguf_file_t *f, const char *key, gguf_type_t t,
                              const gguf_value_t **v)
{
    ecs_err_t err = lookup(f, key, v);
    if (err)
        return err;
    return (*v)->type == t ? ECS_OK : wrong_type(f, key, *v, gguf_type_name(t));
}

ecs_err_t gguf_get_bool(const gguf_file_t *f, const char *key, bool *out)
{
    const gguf_value_t *v;
    ecs_err_t err = lookup_typed(f, key, GGUF_TYPE_BOOL, &v);
    if (!err)
        *out = v->b;
    return err;
}

ecs_err_t gguf_get_str(const gguf_file_t *f, const char *key, gguf_str_t *out)
{
    const gguf_value_t *v;
    ecs_err_t err = lookup_typed(f, key, GGUF_TYPE_STRING, &v);
    if (!err)
        *out = v->str;
    return err;
}

ecs_err_t gguf_get_arr(const gguf_file_t *f, const char *key, gguf_type_t elem, const gguf_value_t **out)
{
    const gguf_value_t *v;
    ecs_err_t err = lookup_typed(f, key, GGUF_TYPE_ARRAY, &v);
    if (err)
        return err;
    if (v->arr.elem_type != elem)
        return ecs_error(ECS_ERR_TYPE, "%s: metadata key '%s' is an array of %s, expected %s",
                         f->path, key, gguf_type_name(v->arr.elem_type), gguf_type_name(elem));
    *out = v;
    return ECS_OK;
}

static gguf_value_t arr_elem(const gguf_value_t *arr, uint64_t i)
{
    gguf_value_t e = { 0 };
    size_t sz = scalar_size(arr->arr.elem_type);
    if (arr->type == GGUF_TYPE_ARRAY && sz && i < arr->arr.n)
        scalar_decode(arr->arr.elem_type, (const uint8_t *)arr->arr.raw + i * sz, &e);
    return e;
}

int64_t gguf_arr_i64(const gguf_value_t *arr, uint64_t i)
{
    gguf_value_t e = arr_elem(arr, i);
    if (type_is_unsigned(e.type))
        return e.u64 > INT64_MAX ? INT64_MAX : (int64_t)e.u64;
    if (type_is_signed(e.type))
        return e.i64;
    if (e.type == GGUF_TYPE_BOOL)
        return e.b;
    if (e.type == GGUF_TYPE_FLOAT32 || e.type == GGUF_TYPE_FLOAT64)
        return (int64_t)e.f64;
    return 0;
}

double gguf_arr_f64(const gguf_value_t *arr, uint64_t i)
{
    gguf_value_t e = arr_elem(arr, i);
    if (e.type == GGUF_TYPE_FLOAT32 || e.type == GGUF_TYPE_FLOAT64)
        return e.f64;
    return (double)gguf_arr_i64(arr, i);
}

/* Absent key gives the default; a present key of the wrong type is still an
 * error, so a typo in a file is never silently replaced by the default. */
#define GGUF_GETTER_OR(name, T, getter)                                          \
    ecs_err_t name(const gguf_file_t *f, const char *key, T def, T *out)         \
    {                                                                            \
        if (!gguf_find(f, key)) {                                                \
            *out = def;                                                          \
            return ECS_OK;                                                       \
        }                                                                        \
        return getter(f, key, out);                                              \
    }

GGUF_GETTER_OR(gguf_get_u32_or, uint32_t, gguf_get_u32)
GGUF_GETTER_OR(gguf_get_f32_or, float, gguf_get_f32)
GGUF_GETTER_OR(gguf_get_bool_or, bool, gguf_get_bool)

/* ---------------------------------------------------------------- writer */

/* Growable byte buffer; the writer serialises each key/value as soon as it is
 * set, so replacing a key swaps one blob. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
} buf_t;

static ecs_err_t buf_put(buf_t *b, const void *src, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p)
            return ecs_error(ECS_ERR_NOMEM, "gguf writer: out of memory");
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, src, n);
    b->len += n;
    return ECS_OK;
}

static ecs_err_t buf_u32(buf_t *b, uint32_t v) { return buf_put(b, &v, 4); }
static ecs_err_t buf_u64(buf_t *b, uint64_t v) { return buf_put(b, &v, 8); }

static ecs_err_t buf_str(buf_t *b, const char *s, uint64_t len)
{
    ecs_err_t err = buf_u64(b, len);
    return err ? err : buf_put(b, s, len);
}

typedef struct {
    char *key;
    buf_t blob; /* key + type + value, serialised */
} wkv_t;

typedef struct {
    char name[GGUF_MAX_NAME];
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    ecs_type_t type;
    size_t nbytes;
    uint64_t offset;
} wtensor_t;

struct gguf_writer {
    uint32_t version;
    uint32_t alignment;
    wkv_t *kv;
    size_t n_kv, cap_kv;
    wtensor_t *t;
    size_t n_t, cap_t;
    FILE *fp;
    char *path;
    size_t next; /* next tensor to receive data */
    uint64_t written; /* bytes of the data section written */
};

ecs_err_t gguf_writer_new(gguf_writer_t **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return ecs_error(ECS_ERR_NOMEM, "gguf writer: out of memory");
    (*out)->version = 3;
    (*out)->alignment = GGUF_DEFAULT_ALIGNMENT;
    return ECS_OK;
}

void gguf_writer_free(gguf_writer_t *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].blob.p);
    }
    free(w->kv);
    free(w->t);
    if (w->fp)
        fclose(w->fp);
    free(w->path);
    free(w);
}

static ecs_err_t put_value(buf_t *b, const gguf_value_t *v, int depth);

static ecs_err_t put_array(buf_t *b, const gguf_value_t *v, int depth)
{
    gguf_type_t et = v->arr.elem_type;
    size_t sz = scalar_size(et);
    ecs_err_t err;
    if (depth >= GGUF_MAX_DEPTH)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: arrays nested deeper than %d", GGUF_MAX_DEPTH);
    if ((err = buf_u32(b, et)) || (err = buf_u64(b, v->arr.n)))
        return err;
    if (sz)
        return v->arr.n && !v->arr.raw ? ecs_error(ECS_ERR_INVAL, "gguf writer: array without data")
                                       : buf_put(b, v->arr.raw, v->arr.n * sz);
    for (uint64_t i = 0; i < v->arr.n; i++) {
        if (et == GGUF_TYPE_STRING)
            err = buf_str(b, v->arr.strs[i].ptr, v->arr.strs[i].len);
        else if (et == GGUF_TYPE_ARRAY)
            err = put_array(b, &v->arr.elems[i], depth + 1);
        else
            err = ecs_error(ECS_ERR_INVAL, "gguf writer: bad array element type %u", (unsigned)et);
        if (err)
            return err;
    }
    return ECS_OK;
}

static ecs_err_t put_scalar(buf_t *b, const gguf_value_t *v)
{
    uint8_t raw[8];
    switch (v->type) {
    case GGUF_TYPE_UINT8: raw[0] = (uint8_t)v->u64; break;
    case GGUF_TYPE_INT8: raw[0] = (uint8_t)(int8_t)v->i64; break;
    case GGUF_TYPE_BOOL: raw[0] = v->b; break;
    case GGUF_TYPE_UINT16: { uint16_t x = (uint16_t)v->u64; memcpy(raw, &x, 2); break; }
    case GGUF_TYPE_INT16: { int16_t x = (int16_t)v->i64; memcpy(raw, &x, 2); break; }
    case GGUF_TYPE_UINT32: { uint32_t x = (uint32_t)v->u64; memcpy(raw, &x, 4); break; }
    case GGUF_TYPE_INT32: { int32_t x = (int32_t)v->i64; memcpy(raw, &x, 4); break; }
    case GGUF_TYPE_FLOAT32: { float x = (float)v->f64; memcpy(raw, &x, 4); break; }
    case GGUF_TYPE_UINT64: memcpy(raw, &v->u64, 8); break;
    case GGUF_TYPE_INT64: memcpy(raw, &v->i64, 8); break;
    case GGUF_TYPE_FLOAT64: memcpy(raw, &v->f64, 8); break;
    default: return ecs_error(ECS_ERR_INVAL, "gguf writer: bad value type %u", (unsigned)v->type);
    }
    return buf_put(b, raw, scalar_size(v->type));
}

static ecs_err_t put_value(buf_t *b, const gguf_value_t *v, int depth)
{
    if (v->type == GGUF_TYPE_STRING)
        return buf_str(b, v->str.ptr, v->str.len);
    if (v->type == GGUF_TYPE_ARRAY)
        return put_array(b, v, depth);
    return put_scalar(b, v);
}

static ecs_err_t writer_slot(gguf_writer_t *w, const char *key, wkv_t **slot)
{
    if (w->fp)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: metadata set after gguf_writer_begin");
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) {
            w->kv[i].blob.len = 0;
            *slot = &w->kv[i];
            return ECS_OK;
        }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        wkv_t *kv = realloc(w->kv, cap * sizeof *kv);
        if (!kv)
            return ecs_error(ECS_ERR_NOMEM, "gguf writer: out of memory");
        w->kv = kv;
        w->cap_kv = cap;
    }
    wkv_t *s = &w->kv[w->n_kv];
    memset(s, 0, sizeof *s);
    if (!(s->key = strdup(key)))
        return ecs_error(ECS_ERR_NOMEM, "gguf writer: out of memory");
    w->n_kv++;
    *slot = s;
    return ECS_OK;
}

ecs_err_t gguf_writer_set_value(gguf_writer_t *w, const char *key, const gguf_value_t *v)
{
    wkv_t *s = NULL;
    ecs_err_t err = writer_slot(w, key, &s);
    if (err)
        return err;
    if ((err = buf_str(&s->blob, key, strlen(key))) || (err = buf_u32(&s->blob, v->type)) ||
        (err = put_value(&s->blob, v, 0)))
        return err;
    if (!strcmp(key, "general.alignment")) {
        if (v->type != GGUF_TYPE_UINT32 || !v->u64 || (v->u64 & (v->u64 - 1)))
            return ecs_error(ECS_ERR_INVAL, "gguf writer: general.alignment must be a uint32 power of two");
        w->alignment = (uint32_t)v->u64;
    }
    return ECS_OK;
}

static ecs_err_t set_scalar(gguf_writer_t *w, const char *key, gguf_type_t t, uint64_t u, int64_t i,
                            double f, bool b)
{
    gguf_value_t v = { .type = t };
    if (type_is_unsigned(t))
        v.u64 = u;
    else if (type_is_signed(t))
        v.i64 = i;
    else if (t == GGUF_TYPE_BOOL)
        v.b = b;
    else
        v.f64 = f;
    return gguf_writer_set_value(w, key, &v);
}

ecs_err_t gguf_writer_set_u32(gguf_writer_t *w, const char *key, uint32_t v)
{
    return set_scalar(w, key, GGUF_TYPE_UINT32, v, 0, 0, false);
}
ecs_err_t gguf_writer_set_i32(gguf_writer_t *w, const char *key, int32_t v)
{
    return set_scalar(w, key, GGUF_TYPE_INT32, 0, v, 0, false);
}
ecs_err_t gguf_writer_set_f32(gguf_writer_t *w, const char *key, float v)
{
    return set_scalar(w, key, GGUF_TYPE_FLOAT32, 0, 0, v, false);
}
ecs_err_t gguf_writer_set_bool(gguf_writer_t *w, const char *key, bool v)
{
    return set_scalar(w, key, GGUF_TYPE_BOOL, 0, 0, 0, v);
}

ecs_err_t gguf_writer_set_str(gguf_writer_t *w, const char *key, const char *s)
{
    gguf_value_t v = { .type = GGUF_TYPE_STRING, .str = { s, strlen(s) } };
    return gguf_writer_set_value(w, key, &v);
}

ecs_err_t gguf_writer_set_arr(gguf_writer_t *w, const char *key, gguf_type_t elem, const void *data,
                              uint64_t n)
{
    if (!scalar_size(elem))
        return ecs_error(ECS_ERR_INVAL, "gguf writer: key '%s': %s is not a scalar element type",
                         key, gguf_type_name(elem));
    gguf_value_t v = { .type = GGUF_TYPE_ARRAY };
    v.arr.elem_type = elem;
    v.arr.n = n;
    v.arr.raw = data;
    return gguf_writer_set_value(w, key, &v);
}

ecs_err_t gguf_writer_set_arr_str(gguf_writer_t *w, const char *key, const char *const *strs, uint64_t n)
{
    gguf_str_t *s = malloc((n ? n : 1) * sizeof *s);
    if (!s)
        return ecs_error(ECS_ERR_NOMEM, "gguf writer: out of memory");
    for (uint64_t i = 0; i < n; i++)
        s[i] = (gguf_str_t){ strs[i], strlen(strs[i]) };
    gguf_value_t v = { .type = GGUF_TYPE_ARRAY };
    v.arr.elem_type = GGUF_TYPE_STRING;
    v.arr.n = n;
    v.arr.strs = s;
    ecs_err_t err = gguf_writer_set_value(w, key, &v);
    free(s);
    return err;
}

ecs_err_t gguf_writer_set_version(gguf_writer_t *w, uint32_t version)
{
    if (version != 2 && version != 3)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: version %u (only 2 and 3 exist)", version);
    w->version = version;
    return ECS_OK;
}

ecs_err_t gguf_writer_set_alignment(gguf_writer_t *w, uint32_t alignment)
{
    return gguf_writer_set_u32(w, "general.alignment", alignment);
}

ecs_err_t gguf_writer_add_tensor(gguf_writer_t *w, const char *name, ecs_type_t type, uint32_t n_dims,
                                 const int64_t *ne)
{
    const ecs_type_traits_t *tr = ecs_type_traits(type);
    if (w->fp)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: tensor '%s' added after gguf_writer_begin", name);
    if (!tr)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: tensor '%s': unknown type %u", name, (unsigned)type);
    if (strlen(name) == 0 || strlen(name) >= GGUF_MAX_NAME)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: tensor name '%s' must be 1..%d bytes", name,
                         GGUF_MAX_NAME - 1);
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: tensor '%s': %u dimensions", name, n_dims);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return ecs_error(ECS_ERR_INVAL, "gguf writer: duplicate tensor '%s'", name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor_t *t = realloc(w->t, cap * sizeof *t);
        if (!t)
            return ecs_error(ECS_ERR_NOMEM, "gguf writer: out of memory");
        w->t = t;
        w->cap_t = cap;
    }
    wtensor_t *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    strcpy(t->name, name);
    t->n_dims = n_dims;
    t->type = type;
    int64_t rows = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
        if (t->ne[d] <= 0)
            return ecs_error(ECS_ERR_INVAL, "gguf writer: tensor '%s': dimension %u is %lld", name, d,
                             (long long)t->ne[d]);
        if (d)
            rows *= t->ne[d];
    }
    size_t row = ecs_row_size(type, t->ne[0]);
    if (!row)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: tensor '%s': row of %lld is not a multiple of "
                         "%s's block size", name, (long long)t->ne[0], tr->name);
    t->nbytes = row * (size_t)rows;
    w->n_t++;
    return ECS_OK;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static ecs_err_t write_pad(gguf_writer_t *w, size_t pos)
{
    static const uint8_t zeros[64];
    size_t pad = align_up(pos, w->alignment) - pos;
    while (pad) {
        size_t n = pad < sizeof zeros ? pad : sizeof zeros;
        if (fwrite(zeros, 1, n, w->fp) != n)
            return ecs_error(ECS_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
        pad -= n;
    }
    return ECS_OK;
}

static ecs_err_t build_header(gguf_writer_t *w, buf_t *h)
{
    ecs_err_t err;
    if ((err = buf_put(h, GGUF_MAGIC, 4)) || (err = buf_u32(h, w->version)) ||
        (err = buf_u64(h, w->n_t)) || (err = buf_u64(h, w->n_kv)))
        return err;
    for (size_t i = 0; i < w->n_kv; i++)
        if ((err = buf_put(h, w->kv[i].blob.p, w->kv[i].blob.len)))
            return err;
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor_t *t = &w->t[i];
        t->offset = off;
        off = align_up(off + t->nbytes, w->alignment);
        if ((err = buf_str(h, t->name, strlen(t->name))) || (err = buf_u32(h, t->n_dims)))
            return err;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((err = buf_u64(h, (uint64_t)t->ne[d])))
                return err;
        if ((err = buf_u32(h, t->type)) || (err = buf_u64(h, t->offset)))
            return err;
    }
    return ECS_OK;
}

ecs_err_t gguf_writer_begin(gguf_writer_t *w, const char *path)
{
    if (w->fp)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: begin called twice");
    buf_t h = { 0 };
    ecs_err_t err = build_header(w, &h);
    if (err) {
        free(h.p);
        return err;
    }
    free(w->path);
    w->path = strdup(path);
    w->fp = w->path ? fopen(path, "wb") : NULL;
    if (!w->fp) {
        free(h.p);
        return ecs_error(ECS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    if (fwrite(h.p, 1, h.len, w->fp) != h.len)
        err = ecs_error(ECS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (!err)
        err = write_pad(w, h.len);
    free(h.p);
    w->next = 0;
    w->written = 0;
    return err;
}

ecs_err_t gguf_writer_write_tensor(gguf_writer_t *w, const void *data, size_t nbytes)
{
    if (!w->fp)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: tensor data before gguf_writer_begin");
    if (w->next >= w->n_t)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: more tensor data than declared tensors");
    wtensor_t *t = &w->t[w->next];
    if (nbytes != t->nbytes)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: tensor '%s' needs %zu bytes, got %zu", t->name,
                         t->nbytes, nbytes);
    if (fwrite(data, 1, nbytes, w->fp) != nbytes)
        return ecs_error(ECS_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    w->written = t->offset + nbytes;
    w->next++;
    return write_pad(w, (size_t)w->written);
}

ecs_err_t gguf_writer_finish(gguf_writer_t *w)
{
    if (!w->fp)
        return ecs_error(ECS_ERR_INVAL, "gguf writer: finish before begin");
    ecs_err_t err = ECS_OK;
    if (w->next != w->n_t)
        err = ecs_error(ECS_ERR_INVAL, "gguf writer: only %zu of %zu tensors were written", w->next,
                        w->n_t);
    if (fclose(w->fp) != 0 && !err)
        err = ecs_error(ECS_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
    w->fp = NULL;
    return err;
}
