/* gguf_write.c - the streaming GGUF writer (gguf_writer_*): metadata and
 * tensor infos are serialised into memory, then the header is written and the
 * tensors' data streams after it. Split from gguf.c (the reader) because the
 * two share only the format's constants (gguf_int.h). */
#include "gguf.h"
#include "gguf_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    size_t sz = gguf_scalar_size(et);
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
    return buf_put(b, raw, gguf_scalar_size(v->type));
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
    if (gguf_type_is_unsigned(t))
        v.u64 = u;
    else if (gguf_type_is_signed(t))
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
    if (!gguf_scalar_size(elem))
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
