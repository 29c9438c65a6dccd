/* test_gguf.c - GGUF writer/reader round trip, a corpus of broken files that
 * must each fail with their own message, and the shared reference models. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gguf.h"

static char *tmp_path(const char *tag)
{
    static char path[256];
    snprintf(path, sizeof path, "/tmp/ecs_test_gguf_%d_%s.gguf", (int)getpid(), tag);
    return path;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    *len = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc(*len);
    cr_assert(p);
    cr_assert_eq(fread(p, 1, *len, fp), *len);
    fclose(fp);
    return p;
}

/* ---- round trip of every value type ---- */

static void write_everything(const char *path, uint32_t version, uint32_t alignment)
{
    gguf_writer_t *w;
    cr_assert_eq(gguf_writer_new(&w), ECS_OK);
    cr_assert_eq(gguf_writer_set_version(w, version), ECS_OK);
    if (alignment)
        cr_assert_eq(gguf_writer_set_alignment(w, alignment), ECS_OK);
    gguf_value_t v = { 0 };
    v.type = GGUF_TYPE_UINT8; v.u64 = 200; gguf_writer_set_value(w, "t.u8", &v);
    v.type = GGUF_TYPE_INT8; v.i64 = -100; gguf_writer_set_value(w, "t.i8", &v);
    v.type = GGUF_TYPE_UINT16; v.u64 = 60000; gguf_writer_set_value(w, "t.u16", &v);
    v.type = GGUF_TYPE_INT16; v.i64 = -30000; gguf_writer_set_value(w, "t.i16", &v);
    cr_assert_eq(gguf_writer_set_u32(w, "t.u32", 4000000000u), ECS_OK);
    cr_assert_eq(gguf_writer_set_i32(w, "t.i32", -2000000000), ECS_OK);
    cr_assert_eq(gguf_writer_set_f32(w, "t.f32", 1.5f), ECS_OK);
    cr_assert_eq(gguf_writer_set_bool(w, "t.bool", true), ECS_OK);
    cr_assert_eq(gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo"), ECS_OK);
    v.type = GGUF_TYPE_UINT64; v.u64 = 0xfedcba9876543210ull; gguf_writer_set_value(w, "t.u64", &v);
    v.type = GGUF_TYPE_INT64; v.i64 = -1234567890123ll; gguf_writer_set_value(w, "t.i64", &v);
    v.type = GGUF_TYPE_FLOAT64; v.f64 = 3.141592653589793; gguf_writer_set_value(w, "t.f64", &v);
    cr_assert_eq(gguf_writer_set_u32(w, "t.replaced", 1), ECS_OK);
    cr_assert_eq(gguf_writer_set_u32(w, "t.replaced", 2), ECS_OK);

    int32_t ai[5] = { 1, -2, 3, -4, 5 };
    float af[3] = { 0.5f, -0.25f, 8.0f };
    uint8_t ab[4] = { 1, 0, 1, 1 };
    double ad[2] = { 1e300, -2.5 };
    cr_assert_eq(gguf_writer_set_arr(w, "a.i32", GGUF_TYPE_INT32, ai, 5), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr(w, "a.f32", GGUF_TYPE_FLOAT32, af, 3), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr(w, "a.bool", GGUF_TYPE_BOOL, ab, 4), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr(w, "a.f64", GGUF_TYPE_FLOAT64, ad, 2), ECS_OK);
    cr_assert_eq(gguf_writer_set_arr(w, "a.empty", GGUF_TYPE_UINT16, NULL, 0), ECS_OK);
    const char *strs[3] = { "alpha", "", "\xe4\xb8\xad" };
    cr_assert_eq(gguf_writer_set_arr_str(w, "a.str", strs, 3), ECS_OK);

    /* nested: [[1,2],[3]] and [["x"],["y","z"]] */
    uint32_t n0[2] = { 1, 2 }, n1[1] = { 3 };
    gguf_value_t inner[2] = { { .type = GGUF_TYPE_ARRAY }, { .type = GGUF_TYPE_ARRAY } };
    inner[0].arr.elem_type = GGUF_TYPE_UINT32; inner[0].arr.n = 2; inner[0].arr.raw = n0;
    inner[1].arr.elem_type = GGUF_TYPE_UINT32; inner[1].arr.n = 1; inner[1].arr.raw = n1;
    gguf_value_t outer = { .type = GGUF_TYPE_ARRAY };
    outer.arr.elem_type = GGUF_TYPE_ARRAY; outer.arr.n = 2; outer.arr.elems = inner;
    cr_assert_eq(gguf_writer_set_value(w, "a.nested", &outer), ECS_OK);
    gguf_str_t sx[1] = { { "x", 1 } }, syz[2] = { { "y", 1 }, { "z", 1 } };
    gguf_value_t sinner[2] = { { .type = GGUF_TYPE_ARRAY }, { .type = GGUF_TYPE_ARRAY } };
    sinner[0].arr.elem_type = GGUF_TYPE_STRING; sinner[0].arr.n = 1; sinner[0].arr.strs = sx;
    sinner[1].arr.elem_type = GGUF_TYPE_STRING; sinner[1].arr.n = 2; sinner[1].arr.strs = syz;
    outer.arr.elems = sinner;
    cr_assert_eq(gguf_writer_set_value(w, "a.nested_str", &outer), ECS_OK);

    int64_t ne_a[2] = { 4, 3 }, ne_b[3] = { 64, 2, 2 };
    cr_assert_eq(gguf_writer_add_tensor(w, "a", ECS_TYPE_F32, 2, ne_a), ECS_OK);
    cr_assert_eq(gguf_writer_add_tensor(w, "b", ECS_TYPE_Q8_0, 3, ne_b), ECS_OK);
    cr_assert_neq(gguf_writer_add_tensor(w, "a", ECS_TYPE_F32, 2, ne_a), ECS_OK, "duplicate name");
    int64_t bad_ne[1] = { 33 };
    cr_assert_neq(gguf_writer_add_tensor(w, "c", ECS_TYPE_Q8_0, 1, bad_ne), ECS_OK, "row not a block multiple");
    cr_assert_eq(gguf_writer_begin(w, path), ECS_OK);
    float a[12];
    for (int i = 0; i < 12; i++)
        a[i] = (float)i * 0.5f;
    uint8_t b[4 * 2 * 34];
    for (size_t i = 0; i < sizeof b; i++)
        b[i] = (uint8_t)(i * 7);
    cr_assert_neq(gguf_writer_write_tensor(w, a, 4), ECS_OK, "wrong size accepted");
    cr_assert_eq(gguf_writer_write_tensor(w, a, sizeof a), ECS_OK);
    cr_assert_eq(gguf_writer_write_tensor(w, b, sizeof b), ECS_OK);
    cr_assert_eq(gguf_writer_finish(w), ECS_OK, "%s", ecs_errmsg());
    gguf_writer_free(w);
}

static void check_everything(const char *path, uint32_t version, uint32_t alignment)
{
    gguf_file_t *f;
    cr_assert_eq(gguf_open(path, &f), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(gguf_version(f), version);
    cr_assert_eq(gguf_alignment(f), alignment ? alignment : GGUF_DEFAULT_ALIGNMENT);
    const gguf_value_t *v;
    cr_assert_eq(gguf_find(f, "t.u8")->u64, 200);
    cr_assert_eq(gguf_find(f, "t.u8")->type, GGUF_TYPE_UINT8);
    cr_assert_eq(gguf_find(f, "t.i8")->i64, -100);
    cr_assert_eq(gguf_find(f, "t.u16")->u64, 60000);
    cr_assert_eq(gguf_find(f, "t.i16")->i64, -30000);
    uint32_t u32;
    cr_assert_eq(gguf_get_u32(f, "t.u32", &u32), ECS_OK);
    cr_assert_eq(u32, 4000000000u);
    cr_assert_eq(gguf_get_u32(f, "t.u8", &u32), ECS_OK, "u8 widens to u32");
    cr_assert_eq(u32, 200);
    cr_assert_eq(gguf_get_u32(f, "t.i32", &u32), ECS_ERR_TYPE, "negative is not u32");
    cr_assert_eq(gguf_get_u32(f, "t.u64", &u32), ECS_ERR_RANGE);
    cr_assert_eq(gguf_get_u32(f, "t.replaced", &u32), ECS_OK);
    cr_assert_eq(u32, 2);
    int64_t i64;
    cr_assert_eq(gguf_get_i64(f, "t.i32", &i64), ECS_OK);
    cr_assert_eq(i64, -2000000000);
    cr_assert_eq(gguf_get_i64(f, "t.i64", &i64), ECS_OK);
    cr_assert_eq(i64, -1234567890123ll);
    uint64_t u64;
    cr_assert_eq(gguf_get_u64(f, "t.u64", &u64), ECS_OK);
    cr_assert_eq(u64, 0xfedcba9876543210ull);
    float fl;
    cr_assert_eq(gguf_get_f32(f, "t.f32", &fl), ECS_OK);
    cr_assert_eq(fl, 1.5f);
    cr_assert_eq(gguf_find(f, "t.f64")->f64, 3.141592653589793);
    bool b;
    cr_assert_eq(gguf_get_bool(f, "t.bool", &b), ECS_OK);
    cr_assert(b);
    gguf_str_t s;
    cr_assert_eq(gguf_get_str(f, "t.str", &s), ECS_OK);
    cr_assert(gguf_str_eq(s, "h\xc3\xa9llo"));

    cr_assert_eq(gguf_get_str(f, "t.u32", &s), ECS_ERR_TYPE);
    cr_assert(strstr(ecs_errmsg(), "t.u32") && strstr(ecs_errmsg(), "uint32"), "%s", ecs_errmsg());
    cr_assert_eq(gguf_get_u32(f, "no.such.key", &u32), ECS_ERR_NOTFOUND);
    cr_assert(strstr(ecs_errmsg(), "no.such.key"), "%s", ecs_errmsg());
    cr_assert_eq(gguf_get_u32_or(f, "no.such.key", 7, &u32), ECS_OK);
    cr_assert_eq(u32, 7);
    cr_assert_eq(gguf_get_u32_or(f, "t.str", 7, &u32), ECS_ERR_TYPE);

    cr_assert_eq(gguf_get_arr(f, "a.i32", GGUF_TYPE_INT32, &v), ECS_OK);
    cr_assert_eq(v->arr.n, 5);
    cr_assert_eq(gguf_arr_i64(v, 3), -4);
    cr_assert_eq(gguf_get_arr(f, "a.i32", GGUF_TYPE_UINT32, &v), ECS_ERR_TYPE);
    cr_assert_eq(gguf_get_arr(f, "a.f32", GGUF_TYPE_FLOAT32, &v), ECS_OK);
    cr_assert_eq(gguf_arr_f64(v, 1), -0.25);
    cr_assert_eq(gguf_get_arr(f, "a.bool", GGUF_TYPE_BOOL, &v), ECS_OK);
    cr_assert_eq(gguf_arr_i64(v, 1), 0);
    cr_assert_eq(gguf_arr_i64(v, 3), 1);
    cr_assert_eq(gguf_get_arr(f, "a.f64", GGUF_TYPE_FLOAT64, &v), ECS_OK);
    cr_assert_eq(gguf_arr_f64(v, 0), 1e300);
    cr_assert_eq(gguf_get_arr(f, "a.empty", GGUF_TYPE_UINT16, &v), ECS_OK);
    cr_assert_eq(v->arr.n, 0);
    cr_assert_eq(gguf_get_arr(f, "a.str", GGUF_TYPE_STRING, &v), ECS_OK);
    cr_assert_eq(v->arr.n, 3);
    cr_assert(gguf_str_eq(v->arr.strs[0], "alpha"));
    cr_assert(gguf_str_eq(v->arr.strs[1], ""));
    cr_assert(gguf_str_eq(v->arr.strs[2], "\xe4\xb8\xad"));
    cr_assert_eq(gguf_get_arr(f, "a.nested", GGUF_TYPE_ARRAY, &v), ECS_OK);
    cr_assert_eq(v->arr.n, 2);
    cr_assert_eq(v->arr.elems[0].arr.n, 2);
    cr_assert_eq(gguf_arr_i64(&v->arr.elems[0], 1), 2);
    cr_assert_eq(gguf_arr_i64(&v->arr.elems[1], 0), 3);
    cr_assert_eq(gguf_get_arr(f, "a.nested_str", GGUF_TYPE_ARRAY, &v), ECS_OK);
    cr_assert(gguf_str_eq(v->arr.elems[1].arr.strs[1], "z"));

    cr_assert_eq(gguf_n_tensors(f), 2);
    const gguf_tensor_t *ta = gguf_find_tensor(f, "a"), *tb = gguf_find_tensor(f, "b");
    cr_assert(ta && tb);
    cr_assert_eq(ta->ne[0], 4);
    cr_assert_eq(ta->ne[1], 3);
    cr_assert_eq(ta->ne[2], 1);
    cr_assert_eq(ta->nbytes, 48);
    cr_assert_eq(((const float *)ta->data)[5], 2.5f);
    cr_assert_eq(tb->type, ECS_TYPE_Q8_0);
    cr_assert_eq(tb->n_dims, 3);
    cr_assert_eq(tb->nbytes, 4 * 2 * 34);
    cr_assert_eq(((const uint8_t *)tb->data)[10], 70);
    cr_assert_eq(tb->offset % gguf_alignment(f), 0);
    cr_assert_null(gguf_find_tensor(f, "c"));
    gguf_close(f);
}

Test(gguf, round_trip_v3)
{
    char *p = tmp_path("rt3");
    write_everything(p, 3, 0);
    check_everything(p, 3, 0);
    unlink(p);
}

Test(gguf, round_trip_v2_aligned64)
{
    char *p = tmp_path("rt2");
    write_everything(p, 2, 64);
    check_everything(p, 2, 64);
    unlink(p);
}

Test(gguf, writer_misuse)
{
    gguf_writer_t *w;
    cr_assert_eq(gguf_writer_new(&w), ECS_OK);
    cr_assert_neq(gguf_writer_set_version(w, 1), ECS_OK);
    cr_assert_neq(gguf_writer_set_alignment(w, 48), ECS_OK);
    cr_assert_neq(gguf_writer_write_tensor(w, "x", 1), ECS_OK);
    int64_t ne[1] = { 32 };
    cr_assert_eq(gguf_writer_add_tensor(w, "t", ECS_TYPE_F32, 1, ne), ECS_OK);
    cr_assert_neq(gguf_writer_add_tensor(w, "u", (ecs_type_t)4, 1, ne), ECS_OK);
    char *p = tmp_path("misuse");
    cr_assert_eq(gguf_writer_begin(w, p), ECS_OK);
    cr_assert_neq(gguf_writer_finish(w), ECS_OK, "missing tensor data not reported");
    gguf_writer_free(w);
    unlink(p);
}

/* ---- broken files ---- */

/* A small valid file: 1 kv (u32 "k" = 5), 1 tensor "w" F32 [8]. Layout:
 * 0 magic, 4 version, 8 n_tensors, 16 n_kv, 24 keylen, 32 "k", 33 type,
 * 37 value, 41 namelen, 49 "w", 50 n_dims, 54 ne0, 62 type, 66 offset, 74. */
static uint8_t *valid_file(size_t *len)
{
    char *p = tmp_path("small");
    gguf_writer_t *w;
    cr_assert_eq(gguf_writer_new(&w), ECS_OK);
    gguf_writer_set_u32(w, "k", 5);
    int64_t ne[1] = { 8 };
    gguf_writer_add_tensor(w, "w", ECS_TYPE_F32, 1, ne);
    cr_assert_eq(gguf_writer_begin(w, p), ECS_OK);
    float d[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    cr_assert_eq(gguf_writer_write_tensor(w, d, sizeof d), ECS_OK);
    cr_assert_eq(gguf_writer_finish(w), ECS_OK);
    gguf_writer_free(w);
    uint8_t *buf = slurp(p, len);
    unlink(p);
    return buf;
}

static void put32(uint8_t *b, size_t off, uint32_t v) { memcpy(b + off, &v, 4); }
static void put64(uint8_t *b, size_t off, uint64_t v) { memcpy(b + off, &v, 8); }

static void expect_fail(const uint8_t *buf, size_t len, const char *needle)
{
    gguf_file_t *f = NULL;
    ecs_err_t err = gguf_open_buffer(buf, len, "broken.gguf", &f);
    cr_assert_neq(err, ECS_OK, "accepted a broken file (expected: %s)", needle);
    cr_assert_null(f);
    cr_assert(strstr(ecs_errmsg(), needle), "message '%s' lacks '%s'", ecs_errmsg(), needle);
    cr_assert(strstr(ecs_errmsg(), "broken.gguf"), "message '%s' does not name the file", ecs_errmsg());
}

Test(gguf, small_valid_file_layout)
{
    size_t len;
    uint8_t *b = valid_file(&len);
    gguf_file_t *f;
    cr_assert_eq(gguf_open_buffer(b, len, "small", &f), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(gguf_find(f, "k")->u64, 5);
    cr_assert_eq(((const float *)gguf_tensor_at(f, 0)->data)[7], 8.0f);
    gguf_close(f);
    uint64_t off;
    memcpy(&off, b + 66, 8);
    cr_assert_eq(off, 0, "layout assumption of the corpus below is wrong");
    cr_assert_eq(b[49], 'w');
    free(b);
}

Test(gguf, truncated_everywhere)
{
    size_t len;
    uint8_t *b = valid_file(&len);
    for (size_t cut = 0; cut < len; cut++) {
        gguf_file_t *f = NULL;
        cr_assert_neq(gguf_open_buffer(b, cut, "cut.gguf", &f), ECS_OK, "truncated at %zu accepted", cut);
        cr_assert_null(f);
        cr_assert(strstr(ecs_errmsg(), "cut.gguf"));
    }
    free(b);
}

#define CORRUPT(needle, stmt) do { \
        uint8_t *c = malloc(len); memcpy(c, b, len); stmt; expect_fail(c, len, needle); free(c); \
    } while (0)

Test(gguf, broken_corpus)
{
    size_t len;
    uint8_t *b = valid_file(&len);
    CORRUPT("bad magic", c[0] = 'X');
    CORRUPT("unsupported GGUF version 1", put32(c, 4, 1));
    CORRUPT("unsupported GGUF version 4", put32(c, 4, 4));
    CORRUPT("absurd tensor count", put64(c, 8, 1ull << 60));
    CORRUPT("absurd metadata count", put64(c, 16, 1ull << 60));
    CORRUPT("metadata key has length", put64(c, 24, 1ull << 62));
    CORRUPT("unknown value type 99", put32(c, 33, 99));
    CORRUPT("tensor name length", put64(c, 41, 0));
    CORRUPT("has 5 dimensions", put32(c, 50, 5));
    CORRUPT("has dimension 0 = 0", put64(c, 54, 0));
    CORRUPT("is absurd", put64(c, 54, 1ull << 63));
    CORRUPT("unknown type 4", put32(c, 62, 4));
    CORRUPT("unknown type 200", put32(c, 62, 200));
    CORRUPT("not a multiple of the alignment", put64(c, 66, 4));
    CORRUPT("past the end", put64(c, 66, 1ull << 40));
    CORRUPT("past the end", put64(c, 54, 1024));
    free(b);
}

static ecs_err_t open_kv(uint32_t type, const void *payload, size_t n, const char *key)
{
    /* header + one kv of the given type/payload, no tensors */
    static uint8_t buf[256];
    size_t klen = strlen(key);
    memcpy(buf, "GGUF", 4);
    put32(buf, 4, 3);
    put64(buf, 8, 0);
    put64(buf, 16, 1);
    put64(buf, 24, klen);
    memcpy(buf + 32, key, klen);
    put32(buf, 32 + klen, type);
    memcpy(buf + 36 + klen, payload, n);
    gguf_file_t *f = NULL;
    ecs_err_t err = gguf_open_buffer(buf, 36 + klen + n, "kv.gguf", &f);
    gguf_close(f);
    return err;
}

Test(gguf, broken_metadata)
{
    uint8_t p[32] = { 0 };
    /* array of 2^40 uint32 in a tiny file */
    put32(p, 0, GGUF_TYPE_UINT32);
    put64(p, 4, 1ull << 40);
    cr_assert_eq(open_kv(GGUF_TYPE_ARRAY, p, 12, "arr"), ECS_ERR_FORMAT);
    cr_assert(strstr(ecs_errmsg(), "does not fit"), "%s", ecs_errmsg());
    /* array of unknown element type */
    put32(p, 0, 77);
    put64(p, 4, 1);
    cr_assert_eq(open_kv(GGUF_TYPE_ARRAY, p, 12, "arr"), ECS_ERR_FORMAT);
    cr_assert(strstr(ecs_errmsg(), "unknown array element type 77"), "%s", ecs_errmsg());
    /* string longer than the file */
    put64(p, 0, 1000);
    cr_assert_eq(open_kv(GGUF_TYPE_STRING, p, 8, "s"), ECS_ERR_FORMAT);
    cr_assert(strstr(ecs_errmsg(), "string value has length 1000"), "%s", ecs_errmsg());
    /* alignment of wrong type and non power of two */
    put32(p, 0, 5);
    cr_assert_eq(open_kv(GGUF_TYPE_INT32, p, 4, "general.alignment"), ECS_ERR_FORMAT);
    cr_assert(strstr(ecs_errmsg(), "expected uint32"), "%s", ecs_errmsg());
    put32(p, 0, 48);
    cr_assert_eq(open_kv(GGUF_TYPE_UINT32, p, 4, "general.alignment"), ECS_ERR_FORMAT);
    cr_assert(strstr(ecs_errmsg(), "not a power of two"), "%s", ecs_errmsg());
    /* deeply nested arrays */
    uint8_t deep[12 * 12];
    for (int i = 0; i < 12; i++) {
        put32(deep, 12 * i, GGUF_TYPE_ARRAY);
        put64(deep, 12 * i + 4, 1);
    }
    cr_assert_eq(open_kv(GGUF_TYPE_ARRAY, deep, sizeof deep, "deep"), ECS_ERR_FORMAT);
    cr_assert(strstr(ecs_errmsg(), "nested deeper"), "%s", ecs_errmsg());
    /* a valid scalar still opens */
    put32(p, 0, 64);
    cr_assert_eq(open_kv(GGUF_TYPE_UINT32, p, 4, "general.alignment"), ECS_OK, "%s", ecs_errmsg());
}

Test(gguf, duplicate_key_and_tensor)
{
    char *p = tmp_path("dup");
    gguf_writer_t *w;
    cr_assert_eq(gguf_writer_new(&w), ECS_OK);
    gguf_writer_set_u32(w, "aa", 1);
    gguf_writer_set_u32(w, "bb", 2);
    cr_assert_eq(gguf_writer_begin(w, p), ECS_OK);
    cr_assert_eq(gguf_writer_finish(w), ECS_OK);
    gguf_writer_free(w);
    size_t len;
    uint8_t *b = slurp(p, &len);
    unlink(p);
    /* second key "bb" -> "aa": kv 0 at 24 = 8 + 2 + 4 + 4 = 18 bytes */
    memcpy(b + 24 + 18 + 8, "aa", 2);
    expect_fail(b, len, "duplicate key 'aa'");
    free(b);
}

Test(gguf, missing_file)
{
    gguf_file_t *f;
    cr_assert_eq(gguf_open("/nonexistent/x.gguf", &f), ECS_ERR_IO);
    cr_assert(strstr(ecs_errmsg(), "/nonexistent/x.gguf"));
    cr_assert_null(f);
}

/* ---- the shared reference models ---- */

static void check_model(const char *path, const char *arch, uint64_t n_tensors)
{
    gguf_file_t *f;
    cr_assert_eq(gguf_open(path, &f), ECS_OK, "%s (run the tests from the repo root with ../shared present)",
                 ecs_errmsg());
    gguf_str_t s;
    cr_assert_eq(gguf_get_str(f, "general.architecture", &s), ECS_OK);
    cr_assert(gguf_str_eq(s, arch));
    cr_assert_eq(gguf_n_tensors(f), n_tensors);
    const gguf_value_t *tok;
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tok), ECS_OK);
    cr_assert_eq(tok->arr.n, 102400);
    uint32_t bos;
    cr_assert_eq(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos), ECS_OK);
    cr_assert_eq(bos, 100000);
    size_t total = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        cr_assert(t->type == ECS_TYPE_F32 || t->type == ECS_TYPE_Q8_0, "%s", t->name);
        total += t->nbytes;
    }
    const gguf_tensor_t *emb = gguf_find_tensor(f, "token_embd.weight");
    cr_assert(emb);
    cr_assert_eq(emb->ne[0], 256);
    cr_assert_eq(emb->ne[1], 102400);
    cr_assert_eq(emb->type, ECS_TYPE_Q8_0);
    cr_assert_lt(total, gguf_file_size(f));
    gguf_close(f);
}

Test(gguf, shared_tiny_ds2) { check_model("../shared/models/tiny-ds2-q8_0.gguf", "deepseek2", 63); }
Test(gguf, shared_tiny_qwen3moe) { check_model("../shared/models/tiny-qwen3moe-q8_0.gguf", "qwen3moe", 51); }
