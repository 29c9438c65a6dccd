/* hash.h - hashes for identities and damage checks.
 *
 * ecs_sha256: SHA-256 (FIPS 180-4), for identities two processes compare
 * (the model fingerprint, gguf_fingerprint). ecs_hash64: the xxHash64
 * algorithm, ~10 GB/s on one core, for checksums of large payloads (the
 * row-interleaved copy's chunks) where SHA-256 would cost seconds per GB.
 *
 *     uint8_t d[ECS_SHA256_BYTES];
 *     ecs_sha256(buf, len, d);
 *     char hex[2 * ECS_SHA256_BYTES + 1];
 *     ecs_hex(d, sizeof d, hex);
 *     uint64_t sum = ecs_hash64(buf, len, 0);
 */
#ifndef ECS_HASH_H
#define ECS_HASH_H

#include <stddef.h>
#include <stdint.h>

#define ECS_SHA256_BYTES 32

/* Incremental SHA-256: init, update any number of times, final. */
typedef struct {
    uint32_t h[8];
    uint64_t len;      /* bytes hashed so far */
    uint8_t buf[64];
    size_t nbuf;
} ecs_sha256_t;

void ecs_sha256_init(ecs_sha256_t *s);
void ecs_sha256_update(ecs_sha256_t *s, const void *data, size_t n);
void ecs_sha256_final(ecs_sha256_t *s, uint8_t out[ECS_SHA256_BYTES]);
/* One call: out = SHA-256(data[0, n)). */
void ecs_sha256(const void *data, size_t n, uint8_t out[ECS_SHA256_BYTES]);

/* xxHash64 of data[0, n) with seed (the reference algorithm's values). */
uint64_t ecs_hash64(const void *data, size_t n, uint64_t seed);

/* bytes as lower-case hex into out (2 n + 1 chars, NUL-terminated). */
void ecs_hex(const uint8_t *bytes, size_t n, char *out);

#endif
