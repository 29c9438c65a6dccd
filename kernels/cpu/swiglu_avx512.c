/* swiglu_avx512.c - SwiGLU's elementwise step on AVX-512: silu by a vector
 * exp (common/simd_avx512.h), 16 values per pass, the tail masked. */
#include <immintrin.h>

#include "common/simd_avx512.h"
#include "kernels/cpu/cpu.h"

bool kcpu_swiglu_avx512(float *g, const float *u, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = ecs_tail_mask16(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(k, g + i);
        const __m512 e = ecs_exp512_ps(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(g + i, k, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, u + i)));
    }
    return true;
}
