/* r16.c - the row-interleaved weight layout (cpu.h: KCPU_R16_ROWS): which
 * matrices have it, its size, packing rows into it, and row views that keep
 * it. Plain C: packing runs once (model load), the products that read the
 * layout live with the other AVX-512 kernels (gemm_avx512.c). */
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/kscales.h"

bool kcpu_r16_fits(ecs_type_t type, int64_t nrows, int64_t ncols)
{
    return type == ECS_TYPE_Q4_K && nrows > 0 && nrows % KCPU_R16_ROWS == 0 && ncols > 0 &&
           ncols % ECS_QK_K == 0;
}

size_t kcpu_r16_bytes(ecs_type_t type, int64_t nrows, int64_t ncols)
{
    if (!kcpu_r16_fits(type, nrows, ncols))
        return 0;
    return (size_t)(nrows / KCPU_R16_ROWS) * (size_t)(ncols / ECS_QK_K) * KCPU_R16_Q4_K_BLOCK;
}

/* Offsets inside a Q4_K row group's block. */
#define R16_D 0
#define R16_DMIN 32
#define R16_SC 64
#define R16_MN 192
#define R16_QS 320

/* Block b of 16 consecutive Q4_K rows (row_bytes apart) into out. */
static void pack_q4_K_block(const uint8_t *rows, size_t row_bytes, int64_t b, uint8_t *out)
{
    for (int r = 0; r < KCPU_R16_ROWS; r++) {
        const ecs_block_q4_K *x =
            (const ecs_block_q4_K *)(rows + (size_t)r * row_bytes) + b;
        memcpy(out + R16_D + 2 * r, &x->d, 2);
        memcpy(out + R16_DMIN + 2 * r, &x->dmin, 2);
        uint64_t sc, mn;
        k4_scales(x->scales, &sc, &mn);
        for (int g = 0; g < 8; g++) {
            out[R16_SC + 16 * g + r] = (uint8_t)(sc >> (8 * g));
            out[R16_MN + 16 * g + r] = (uint8_t)(mn >> (8 * g));
        }
        for (int wd = 0; wd < 32; wd++) /* word wd = 8 c + k */
            memcpy(out + R16_QS + 64 * wd + 4 * r, x->qs + 4 * wd, 4);
    }
}

void kcpu_r16_pack(const kcpu_mat_t *w, int64_t r0, int64_t n, void *out)
{
    const int64_t nblk = w->ncols / ECS_QK_K;
    uint8_t *o = out;
    for (int64_t g = r0; g < r0 + n; g += KCPU_R16_ROWS) {
        const uint8_t *rows = (const uint8_t *)w->data + (size_t)g * w->row_bytes;
        for (int64_t b = 0; b < nblk; b++, o += KCPU_R16_Q4_K_BLOCK)
            pack_q4_K_block(rows, w->row_bytes, b, o);
    }
}

kcpu_mat_t kcpu_mat_rows(const kcpu_mat_t *w, int64_t r0, int64_t n)
{
    kcpu_mat_t s = *w;
    s.nrows = n;
    s.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    s.r16 = NULL;
    if (w->r16 && r0 % KCPU_R16_ROWS == 0)
        s.r16 = (const uint8_t *)w->r16 + kcpu_r16_bytes(w->type, r0, w->ncols);
    return s;
}
