/* r16.c - the row-interleaved weight layout (cpu.h: KCPU_R16_ROWS): which
 * matrices have it, its size, packing rows into it, and row views that keep
 * it. Plain C: packing runs once (model load), the products that read the
 * layout live with the other AVX-512 kernels (gemm_avx512.c). */
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/kscales.h"

/* Bytes per block of 16 rows; 0: no layout. */
static size_t block_bytes(ecs_type_t type)
{
    switch (type) {
    case ECS_TYPE_Q4_K: return KCPU_R16_Q4_K_BLOCK;
    case ECS_TYPE_Q5_0: return KCPU_R16_Q5_0_BLOCK;
    case ECS_TYPE_Q8_0: return KCPU_R16_Q8_0_BLOCK;
    default: return 0;
    }
}

static int64_t block_cols(ecs_type_t type) { return type == ECS_TYPE_Q4_K ? ECS_QK_K : ECS_QK; }

bool kcpu_r16_fits(ecs_type_t type, int64_t nrows, int64_t ncols)
{
    /* legacy superblocks: an even number of blocks keeps every part aligned */
    const int64_t cols = type == ECS_TYPE_Q4_K ? ECS_QK_K : 2 * ECS_QK;
    return block_bytes(type) && nrows > 0 && nrows % KCPU_R16_ROWS == 0 &&
           ncols >= KCPU_GEMM_SB && ncols % cols == 0;
}

size_t kcpu_r16_bytes(ecs_type_t type, int64_t nrows, int64_t ncols)
{
    if (!kcpu_r16_fits(type, nrows, ncols))
        return 0;
    return (size_t)(nrows / KCPU_R16_ROWS) * (size_t)(ncols / block_cols(type)) *
           block_bytes(type);
}

#define R16_D KCPU_R16_Q4_K_D
#define R16_DMIN KCPU_R16_Q4_K_DMIN
#define R16_SC KCPU_R16_Q4_K_SC
#define R16_MN KCPU_R16_Q4_K_MN
#define R16_QS KCPU_R16_Q4_K_QS

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

/* Q5_0 / Q8_0: pairs of blocks, each pair's bytes together (decode streams
 * them in order; parts kept in separate runs slowed the stream from DRAM):
 * qs [2][W][16 rows] 32-bit words, W = 4 (Q5_0: word k's low nibbles are
 * values 4 k.., the high ones 16 + 4 k..) or 8 (Q8_0: values 4 k.., stored
 * + 128 as the kernels' unsigned levels); Q5_0 only, the fifth bits as
 * [2][8] 64-bit byte masks, one per qs vector the kernel loads (mask
 * half * 4 + k, bit 4 r + j: the fifth bit of value 16 half + 4 k + j of
 * row r), so that the kernel takes each as it is (a mask register load)
 * instead of shuffling it out of the rows' qh words; d [2][16 rows] (fp16). */
static void pack_legacy_pair(ecs_type_t type, const uint8_t *rows, size_t row_bytes, int64_t b0,
                             uint8_t *out)
{
    const bool q5 = type == ECS_TYPE_Q5_0;
    const int W = q5 ? 4 : 8;
    uint8_t *qp = out, *hp = out + 2 * 64 * W, *dp = hp + (q5 ? 128 : 0);
    if (q5)
        memset(hp, 0, 128);
    for (int r = 0; r < KCPU_R16_ROWS; r++) {
        const uint8_t *row = rows + (size_t)r * row_bytes;
        for (int b = 0; b < 2; b++) {
            uint8_t q[32]; /* 4 W bytes: the words of the block */
            if (q5) {
                const ecs_block_q5_0 *x = (const ecs_block_q5_0 *)row + b0 + b;
                memcpy(dp + 32 * b + 2 * r, &x->d, 2);
                uint32_t qh;
                memcpy(&qh, x->qh, 4);
                for (int v = 0; v < 32; v++) { /* value v = 16 half + 4 k + j */
                    const int bit = 4 * r + v % 4, m = v / 4; /* m = half * 4 + k */
                    hp[64 * b + 8 * m + bit / 8] |= (uint8_t)(((qh >> v) & 1) << (bit % 8));
                }
                memcpy(q, x->qs, 16);
            } else {
                const ecs_block_q8_0 *x = (const ecs_block_q8_0 *)row + b0 + b;
                memcpy(dp + 32 * b + 2 * r, &x->d, 2);
                for (int i = 0; i < 32; i++)
                    q[i] = (uint8_t)(x->qs[i] + 128);
            }
            for (int k = 0; k < W; k++)
                memcpy(qp + (size_t)64 * (W * b + k) + 4 * r, q + 4 * k, 4);
        }
    }
}

void kcpu_r16_pack(const kcpu_mat_t *w, int64_t r0, int64_t n, void *out)
{
    const int64_t nblk = w->ncols / block_cols(w->type);
    const size_t bb = block_bytes(w->type);
    uint8_t *o = out;
    for (int64_t g = r0; g < r0 + n; g += KCPU_R16_ROWS) {
        const uint8_t *rows = (const uint8_t *)w->data + (size_t)g * w->row_bytes;
        if (w->type == ECS_TYPE_Q4_K) {
            for (int64_t b = 0; b < nblk; b++, o += bb)
                pack_q4_K_block(rows, w->row_bytes, b, o);
            continue;
        }
        for (int64_t b = 0; b < nblk; b += 2, o += 2 * bb)
            pack_legacy_pair(w->type, rows, w->row_bytes, b, o);
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
