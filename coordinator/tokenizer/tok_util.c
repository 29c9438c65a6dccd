/* tok_util.c - small pieces the tokenizer is built from: GPT-2's byte to
 * code point mapping, UTF-8 decoding with llama.cpp's leniency, a string
 * arena and two open-addressing hash maps. */
#include "tok_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- GPT-2 bytes_to_unicode ----
 * Printable Latin-1 bytes map to themselves; the other 68 bytes (0..32,
 * 127..160, 173) map, in byte order, to U+0100 onwards. */

static bool byte_is_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

uint32_t tok_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b))
        return b;
    if (b <= 32)
        return 256u + b;
    if (b <= 160)
        return 256u + 33u + (b - 127u);
    return 256u + 67u; /* 173, soft hyphen */
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_is_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68)
        return -1;
    uint32_t i = cp - 256;
    if (i < 33)
        return (int)i;
    if (i < 67)
        return (int)(127 + i - 33);
    return 173;
}

/* ---- UTF-8 ---- */

size_t tok_u8_put(uint32_t cp, char *out)
{
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tok_u8_lenient(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t b = s[0];
    size_t len;
    uint32_t v;
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (!(b & 0x40))
        return 0;
    if (!(b & 0x20)) {
        len = 2;
        v = b & 0x1F;
    } else if (!(b & 0x10)) {
        len = 3;
        v = b & 0x0F;
    } else if (!(b & 0x08)) {
        len = 4;
        v = b & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

int tok_u8_strict(const uint8_t *s, size_t n)
{
    uint8_t b = s[0];
    int len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF) {
        len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return 0;
        if (s[i] < lo || s[i] > hi)
            return -i;
        lo = 0x80;
        hi = 0xBF;
    }
    return len;
}

static bool u8_all_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = tok_u8_strict(s + i, n - i);
        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

ecs_err_t tok_u8_sanitize(const char *text, size_t len, const char **out, size_t *out_len,
                          char **owned)
{
    const uint8_t *s = (const uint8_t *)text;
    *owned = NULL;
    if (u8_all_valid(s, len)) {
        *out = text;
        *out_len = len;
        return ECS_OK;
    }
    /* every input byte becomes at most 3 output bytes (U+FFFD) */
    char *buf = malloc(len * 3 + 1);
    if (!buf)
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory sanitizing %zu bytes", len);
    size_t o = 0, i = 0;
    while (i < len) {
        uint32_t cp;
        size_t k = tok_u8_lenient(s + i, len - i, &cp);
        if (k == 0) {
            cp = 0xFFFD;
            k = 1;
        } else if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            cp = 0xFFFD;
        }
        o += tok_u8_put(cp, buf + o);
        i += k;
    }
    buf[o] = '\0';
    *out = *owned = buf;
    *out_len = o;
    return ECS_OK;
}

/* ---- arena ---- */

struct tok_arena_block {
    tok_arena_block_t *next;
    size_t used, cap;
    char data[];
};

#define ARENA_BLOCK 65536

static char *arena_alloc(tok_arena_t *a, size_t n)
{
    tok_arena_block_t *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    char *p = b->data + b->used;
    b->used += n;
    return p;
}

char *tok_arena_put2(tok_arena_t *a, const void *p, size_t n, const void *q, size_t m)
{
    if (n > SIZE_MAX / 2 || m > SIZE_MAX / 2)
        return NULL;
    char *d = arena_alloc(a, n + m + 1);
    if (!d)
        return NULL;
    if (n)
        memcpy(d, p, n);
    if (m)
        memcpy(d + n, q, m);
    d[n + m] = '\0';
    return d;
}

char *tok_arena_put(tok_arena_t *a, const void *p, size_t n)
{
    return tok_arena_put2(a, p, n, NULL, 0);
}

void tok_arena_free(tok_arena_t *a)
{
    tok_arena_block_t *b = a->head;
    while (b) {
        tok_arena_block_t *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

/* ---- hashing ---- */

static uint32_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 0x100000001b3ull;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* ---- string map ---- */

ecs_err_t tok_strmap_init(tok_strmap_t *m, size_t expect)
{
    memset(m, 0, sizeof *m);
    if (expect > ((size_t)1 << 30))
        return ecs_error(ECS_ERR_RANGE, "tokenizer: %zu map entries is too many", expect);
    m->cap = pow2_at_least(expect * 2);
    m->slots = malloc(m->cap * sizeof *m->slots);
    m->ents_cap = expect > 16 ? expect : 16;
    m->ents = malloc(m->ents_cap * sizeof *m->ents);
    if (!m->slots || !m->ents) {
        tok_strmap_free(m);
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory for a %zu-entry map", expect);
    }
    memset(m->slots, 0xFF, m->cap * sizeof *m->slots);
    return ECS_OK;
}

void tok_strmap_free(tok_strmap_t *m)
{
    free(m->slots);
    free(m->ents);
    memset(m, 0, sizeof *m);
}

static size_t strmap_find(const tok_strmap_t *m, const char *key, size_t len, uint32_t h)
{
    size_t mask = m->cap - 1, i = h & mask;
    for (;;) {
        int32_t e = m->slots[i];
        if (e < 0)
            return i;
        const tok_strent_t *en = &m->ents[e];
        if (en->hash == h && en->len == len && memcmp(en->key, key, len) == 0)
            return i;
        i = (i + 1) & mask;
    }
}

int32_t tok_strmap_get(const tok_strmap_t *m, const char *key, size_t len)
{
    if (!m->cap || len > UINT32_MAX)
        return -1;
    int32_t e = m->slots[strmap_find(m, key, len, hash_bytes(key, len))];
    return e < 0 ? -1 : m->ents[e].val;
}

static ecs_err_t strmap_grow(tok_strmap_t *m)
{
    size_t cap = m->cap * 2;
    int32_t *slots = malloc(cap * sizeof *slots);
    if (!slots)
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory growing a map");
    memset(slots, 0xFF, cap * sizeof *slots);
    for (size_t e = 0; e < m->n; e++) {
        size_t i = m->ents[e].hash & (cap - 1);
        while (slots[i] >= 0)
            i = (i + 1) & (cap - 1);
        slots[i] = (int32_t)e;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return ECS_OK;
}

ecs_err_t tok_strmap_put(tok_strmap_t *m, const char *key, size_t len, int32_t val,
                         int32_t *existing)
{
    if (len > UINT32_MAX || m->n >= INT32_MAX)
        return ecs_error(ECS_ERR_RANGE, "tokenizer: map key or map too large");
    uint32_t h = hash_bytes(key, len);
    size_t i = strmap_find(m, key, len, h);
    if (m->slots[i] >= 0) {
        if (existing)
            *existing = m->ents[m->slots[i]].val;
        return ECS_OK;
    }
    if (existing)
        *existing = -1;
    if (m->n == m->ents_cap) {
        size_t nc = m->ents_cap * 2;
        tok_strent_t *ents = realloc(m->ents, nc * sizeof *ents);
        if (!ents)
            return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory growing a map");
        m->ents = ents;
        m->ents_cap = nc;
    }
    m->ents[m->n] = (tok_strent_t){ key, (uint32_t)len, h, val };
    m->slots[i] = (int32_t)m->n;
    m->n++;
    if (m->n * 2 > m->cap)
        return strmap_grow(m);
    return ECS_OK;
}

/* ---- u64 map ---- */

#define U64_EMPTY UINT64_MAX

ecs_err_t tok_u64map_init(tok_u64map_t *m, size_t expect)
{
    memset(m, 0, sizeof *m);
    if (expect > ((size_t)1 << 30))
        return ecs_error(ECS_ERR_RANGE, "tokenizer: %zu map entries is too many", expect);
    m->cap = pow2_at_least(expect * 2);
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->vals = malloc(m->cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        tok_u64map_free(m);
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory for a %zu-entry map", expect);
    }
    memset(m->keys, 0xFF, m->cap * sizeof *m->keys);
    return ECS_OK;
}

void tok_u64map_free(tok_u64map_t *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t u64map_slot(const uint64_t *keys, size_t cap, uint64_t key)
{
    size_t mask = cap - 1, i = (size_t)mix64(key) & mask;
    while (keys[i] != U64_EMPTY && keys[i] != key)
        i = (i + 1) & mask;
    return i;
}

uint64_t *tok_u64map_get(const tok_u64map_t *m, uint64_t key)
{
    if (!m->cap || key == U64_EMPTY)
        return NULL;
    size_t i = u64map_slot(m->keys, m->cap, key);
    return m->keys[i] == key ? &m->vals[i] : NULL;
}

static ecs_err_t u64map_grow(tok_u64map_t *m)
{
    size_t cap = m->cap * 2;
    uint64_t *keys = malloc(cap * sizeof *keys);
    uint64_t *vals = malloc(cap * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory growing a map");
    }
    memset(keys, 0xFF, cap * sizeof *keys);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == U64_EMPTY)
            continue;
        size_t j = u64map_slot(keys, cap, m->keys[i]);
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return ECS_OK;
}

ecs_err_t tok_u64map_upsert(tok_u64map_t *m, uint64_t key, uint64_t def, uint64_t **val,
                            bool *added)
{
    if (key == U64_EMPTY)
        return ecs_error(ECS_ERR_INTERNAL, "tokenizer: reserved map key");
    if ((m->n + 1) * 2 > m->cap) {
        ecs_err_t err = u64map_grow(m);
        if (err)
            return err;
    }
    size_t i = u64map_slot(m->keys, m->cap, key);
    *added = m->keys[i] != key;
    if (*added) {
        m->keys[i] = key;
        m->vals[i] = def;
        m->n++;
    }
    *val = &m->vals[i];
    return ECS_OK;
}
