/* gguf.c - GGUF v2/v3 reader (mmap + validation) and the typed getters.
 * The streaming writer is in gguf_write.c (it shares only the format's
 * constants and scalar sizes, from gguf_int.h, so the two halves split
 * cleanly and each fits in a head).
 *
 * The reader never trusts a count: every length is checked against the bytes
 * left in the file before anything is allocated, so a lying header fails with
 * a message instead of a huge allocation. Errors name the file, the field and
 * the byte offset where parsing stopped. */
#include "gguf.h"
#include "gguf_int.h"
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
    size_t min_elem = gguf_scalar_size(et) ? gguf_scalar_size(et) : (et == GGUF_TYPE_STRING ? 8 : 12);
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
    if (gguf_scalar_size(et)) {
        v->arr.raw = c->base + c->pos;
        c->pos += n * gguf_scalar_size(et);
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
    size_t sz = gguf_scalar_size(t);
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
    if (gguf_type_is_unsigned(v->type)) {
        *u = v->u64;
        *neg = false;
        *s = v->u64 > INT64_MAX ? INT64_MAX : (int64_t)v->u64;
        return true;
    }
    if (gguf_type_is_signed(v->type)) {
        *s = v->i64;
        *neg = v->i64 < 0;
        *u = *neg ? 0 : (uint64_t)v->i64;
        return true;
    }
    return false;
}

/* The integer value of key, as value_int gives it. sign: any int64 (a value
 * above INT64_MAX is a range error); !sign: any uint64 (a negative value is a
 * type error). The two integer getters differ in nothing else. */
static ecs_err_t lookup_int(const gguf_file_t *f, const char *key, bool sign, int64_t *s, uint64_t *u)
{
    const gguf_value_t *v;
    bool neg;
    ecs_err_t err = lookup(f, key, &v);
    if (err)
        return err;
    if (!value_int(v, s, u, &neg) || (!sign && neg))
        return wrong_type(f, key, v, sign ? "an integer" : "a non-negative integer");
    if (sign && !neg && *u > INT64_MAX)
        return ecs_error(ECS_ERR_RANGE, "%s: metadata key '%s' does not fit in int64", f->path, key);
    return ECS_OK;
}

ecs_err_t gguf_get_u64(const gguf_file_t *f, const char *key, uint64_t *out)
{
    int64_t s;
    uint64_t u;
    ecs_err_t err = lookup_int(f, key, false, &s, &u);
    if (!err)
        *out = u;
    return err;
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
    int64_t s;
    uint64_t u;
    ecs_err_t err = lookup_int(f, key, true, &s, &u);
    if (!err)
        *out = s;
    return err;
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
    size_t sz = gguf_scalar_size(arr->arr.elem_type);
    if (arr->type == GGUF_TYPE_ARRAY && sz && i < arr->arr.n)
        scalar_decode(arr->arr.elem_type, (const uint8_t *)arr->arr.raw + i * sz, &e);
    return e;
}

int64_t gguf_arr_i64(const gguf_value_t *arr, uint64_t i)
{
    gguf_value_t e = arr_elem(arr, i);
    if (gguf_type_is_unsigned(e.type))
        return e.u64 > INT64_MAX ? INT64_MAX : (int64_t)e.u64;
    if (gguf_type_is_signed(e.type))
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
