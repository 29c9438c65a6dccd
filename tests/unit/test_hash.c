/* test_hash.c - SHA-256 and xxHash64 against published known answers, the
 * incremental SHA-256 against the one-call form over every split, and the
 * model fingerprint (gguf_fingerprint): it covers the metadata and tensor
 * table, not the tensor data. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/hash.h"

#define DS2_Q8 "../shared/models/tiny-ds2-q8_0.gguf"
#define QWEN_Q8 "../shared/models/tiny-qwen3moe-q8_0.gguf"

static void sha_hex(const void *p, size_t n, char *hex)
{
    uint8_t d[ECS_SHA256_BYTES];
    ecs_sha256(p, n, d);
    ecs_hex(d, sizeof d, hex);
}

Test(hash, sha256_known_answers)
{
    char hex[65];
    sha_hex("", 0, hex);
    cr_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha_hex("abc", 3, hex);
    cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56: two blocks */
    sha_hex(two, strlen(two), hex);
    cr_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *mil = malloc(1000000);
    cr_assert(mil);
    memset(mil, 'a', 1000000);
    sha_hex(mil, 1000000, hex);
    cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* incremental, split anywhere */
    uint8_t one[32], inc[32];
    ecs_sha256(mil, 1000, one);
    for (size_t cut = 0; cut <= 1000; cut += 37) {
        ecs_sha256_t s;
        ecs_sha256_init(&s);
        ecs_sha256_update(&s, mil, cut);
        ecs_sha256_update(&s, mil + cut, 1000 - cut);
        ecs_sha256_final(&s, inc);
        cr_assert_eq(memcmp(one, inc, 32), 0, "split at %zu", cut);
    }
    free(mil);
}

Test(hash, xxhash64_known_answers)
{
    static const struct {
        uint64_t seed;
        const char *s;
        uint64_t want;
    } v[] = {
        {0, "", 0xef46db3751d8e999ULL},
        {0, "a", 0xd24ec4f1a98c6e5bULL},
        {0, "abc", 0x44bc2cf5ad770999ULL},
        {0, "1234", 0xd8316e61d84f6ba4ULL},
        {0, "12345678", 0xd2d02f08cf7cfd4aULL},
        {0, "123456789012345", 0xc377d78ade001a3cULL},
        {0, "1234567890123456", 0xb61c33dc6c59f270ULL},
        {0, "1234567890123456789012345678901", 0x8f367cb873a5376eULL},
        {0, "12345678901234567890123456789012", 0x40fd1aa52d98274cULL},
        {0, "The quick brown fox jumps over the lazy dog", 0x0b242d361fda71bcULL},
        {5381, "", 0xaf382146d5c3cacfULL},
        {5381, "abc", 0x19d1c1b5c673451fULL},
        {5381, "12345678901234567890123456789012", 0x38ea26e7c55f8095ULL},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        cr_assert_eq(ecs_hash64(v[i].s, strlen(v[i].s), v[i].seed), v[i].want, "\"%s\" seed %llu",
                     v[i].s, (unsigned long long)v[i].seed);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n);
    cr_assert(b && fread(b, 1, *n, f) == *n);
    fclose(f);
    return b;
}

static void fingerprint_of(const uint8_t *buf, size_t n, uint8_t fp[GGUF_FINGERPRINT_BYTES],
                           size_t *data_off)
{
    gguf_file_t *g;
    cr_assert_eq(gguf_open_buffer(buf, n, "buf", &g), ECS_OK, "%s", ecs_errmsg());
    gguf_fingerprint(g, fp);
    *data_off = gguf_data_offset(g);
    gguf_close(g);
}

Test(hash, fingerprint_covers_metadata_and_tensor_table_only)
{
    size_t n, off, off2;
    uint8_t *buf = slurp(DS2_Q8, &n);
    uint8_t a[32], b[32], want[32];
    fingerprint_of(buf, n, a, &off);
    cr_assert(off > 0 && off < n);
    ecs_sha256(buf, off, want);
    cr_assert_eq(memcmp(a, want, 32), 0, "the bytes before the tensor data");
    /* a weight byte changes nothing; a metadata byte (the architecture
     * name's last letter, deepseek2 -> deepseek3) changes it */
    buf[n - 1] ^= 0x55;
    fingerprint_of(buf, n, b, &off2);
    cr_assert_eq(memcmp(a, b, 32), 0);
    uint8_t *arch = memmem(buf, off, "deepseek2", 9);
    cr_assert(arch);
    arch[8] = '3';
    fingerprint_of(buf, n, b, &off2);
    cr_assert_neq(memcmp(a, b, 32), 0);
    free(buf);
    /* another model, another fingerprint */
    buf = slurp(QWEN_Q8, &n);
    fingerprint_of(buf, n, b, &off2);
    cr_assert_neq(memcmp(a, b, 32), 0);
    free(buf);
    char hex[2 * GGUF_FINGERPRINT_BYTES + 1];
    ecs_hex(a, sizeof a, hex);
    cr_assert_eq(strlen(hex), 64);
    cr_assert_eq(strspn(hex, "0123456789abcdef"), 64);
}
