/* kscales.h - the 6-bit scale packings of Q4_K / Q5_K and Q3_K, unpacked
 * with SSE2 operations that every x86-64 kernel file can use (dot_avx2.c,
 * dot_avx512.c, gemm_avx512.c). Internal to kernels/cpu. */
#ifndef ECS_KCPU_KSCALES_H
#define ECS_KCPU_KSCALES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define KS_INLINE static inline __attribute__((always_inline))

/* Q4_K / Q5_K scales: 8 x (6-bit scale, 6-bit min) packed in 12 bytes. */
KS_INLINE void k4_scales(const uint8_t s[12], uint64_t *sc, uint64_t *mn)
{
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t sc_lo = u0 & 0x3F3F3F3F, mn_lo = u1 & 0x3F3F3F3F;
    const uint32_t sc_hi = (u2 & 0x0F0F0F0F) | (((u0 >> 6) & 0x03030303) << 4);
    const uint32_t mn_hi = ((u2 >> 4) & 0x0F0F0F0F) | (((u1 >> 6) & 0x03030303) << 4);
    *sc = ((uint64_t)sc_hi << 32) | sc_lo;
    *mn = ((uint64_t)mn_hi << 32) | mn_lo;
}

/* Q3_K scales: 16 x 6-bit in 12 bytes, stored +32. */
KS_INLINE __m128i k3_scales(const uint8_t s[12])
{
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&a2, s + 8, 4);
    const uint32_t m4 = 0x0F0F0F0F, m2 = 0x03030303;
    const __m128i v = _mm_set_epi32((int)(((a1 >> 4) & m4) | (((a2 >> 6) & m2) << 4)),
                                    (int)(((a0 >> 4) & m4) | (((a2 >> 4) & m2) << 4)),
                                    (int)((a1 & m4) | (((a2 >> 2) & m2) << 4)),
                                    (int)((a0 & m4) | ((a2 & m2) << 4)));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

#undef KS_INLINE

#endif
