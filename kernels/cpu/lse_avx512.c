/* lse_avx512.c - log-sum-exp of a row on AVX-512: the max, then the
 * shared vector exp (common/simd_avx512.h) of each value less the max,
 * summed in double (16 lanes, the tail masked). */
#include <immintrin.h>
#include <math.h>

#include "common/simd_avx512.h"
#include "kernels/cpu/cpu.h"

bool kcpu_logsumexp_avx512(const float *x, int64_t n, float *out)
{
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16)
        vmx = _mm512_max_ps(vmx, _mm512_mask_loadu_ps(vmx, ecs_tail_mask16(n - i), x + i));
    const float mxs = _mm512_reduce_max_ps(vmx);
    const __m512 mx = _mm512_set1_ps(mxs);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = ecs_tail_mask16(n - i);
        const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mx);
        const __m512 e = _mm512_maskz_mov_ps(k, ecs_exp512_ps(d));
        const __m256 e_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(e_hi));
    }
    *out = mxs + (float)log(_mm512_reduce_add_pd(_mm512_add_pd(lo, hi)));
    return true;
}
