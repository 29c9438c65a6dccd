/* quant_k.c - the 256-element super-block "k-quants" Q2_K..Q6_K and the
 * activation type Q8_K: reference quantizers, dequantization and the scalar
 * dot products with Q8_K.
 *
 * The quantizers reproduce ggml's quantize_row_q*_K_ref arithmetic step by
 * step (same searches, same float operation order, same integer wrap-arounds)
 * because llama.cpp's files are made with them and a requantized tensor
 * should come out bit-identical. The helper names point at ggml's
 * make_qkx2_quants / make_q3_quants / make_qx_quants.
 *
 * For reading, every weight super-block is unpacked into signed integer
 * levels q[e], per-sub-block integer scales sc[] (and mins mn[]) and the two
 * fp16 factors: value = d*sc[s]*q[e] - dmin*mn[s]. Dequantization and the
 * dot products share that single description of each bit layout. */
#include <math.h>
#include <string.h>

#include "common/quant_impl.h"

#define QK_K ECS_QK_K
#define GROUP_MAX_EPS 1e-15f

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }
static int iclamp(int v, int lo, int hi) { return imin(hi, imax(lo, v)); }

/* Round to nearest, ties to even, by letting the FPU do it: adding 1.5*2^23
 * leaves the integer in the low mantissa bits. This is ggml's nearest_int,
 * exact for |v| < 2^22; larger or NaN inputs (never produced by finite data)
 * are clamped first so the result stays defined. */
static int nearest_int(float v)
{
    if (!(fabsf(v) <= 4194303.0f))
        v = v > 0 ? 4194303.0f : (v < 0 ? -4194303.0f : 0.0f);
    const float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, sizeof i);
    return (i & 0x007FFFFF) - 0x00400000;
}

/* ======================= scale searches (quantizers) ======================= */

/* ggml's make_qkx2_quants: levels L[i] in [0, nmax] with value = scale*L + min
 * (min <= 0), chosen by trying nstep+1 grid spacings around nmax/(max-min)
 * and refitting scale and min by weighted least squares each time; keeps the
 * candidate with the smallest weighted error (absolute if use_mad, else
 * squared). Returns scale; *neg_min receives -min. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *neg_min, float rmin, float rdelta, int nstep, bool use_mad)
{
    uint8_t Laux[32];
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)iclamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_err += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = iclamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                err += w[i] * diff;
            }
            if (err < best_err) {
                memcpy(L, Laux, (size_t)n);
                best_err = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

/* The value of largest magnitude (the first of equals), its magnitude in
 * *amax: the symmetric quantizers put it at the extreme level. */
static float signed_max(int n, const float *x, float *amax)
{
    float max = 0;
    *amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > *amax) {
            *amax = ax;
            max = x[i];
        }
    }
    return max;
}

/* ggml's make_q3_quants (rmse variant): signed levels in [-nmax, nmax-1],
 * the largest magnitude at -nmax, then up to 5 passes of moving single
 * levels while that improves the x^2-weighted fit. L gets level + nmax. */
static float fit_q3(int n, int nmax, const float *x, int8_t *L)
{
    float amax;
    const float max = signed_max(n, x, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = iclamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                const int new_l = iclamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* ggml's make_qx_quants with rmse_type 1 and no importance weights: signed
 * levels in [-nmax, nmax-1] (L gets level + nmax), trying 18 scales around
 * -nmax/max and keeping the best x^2-weighted least-squares fit. */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L)
{
    float amax;
    const float max = signed_max(n, x, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = iclamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = iclamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + iclamp(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* ======================= bit layouts ======================= */

/* 2-bit fields (Q2_K qs, low bits of Q3_K): each 128-element half uses 32
 * bytes; element 32*k + l of the half sits at bits 2k of byte l. */
static void pack_2bit(const uint8_t *L, uint8_t *qs)
{
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

static int get_2bit(const uint8_t *qs, int e)
{
    const int r = e % 128;
    return (qs[(e / 128) * 32 + r % 32] >> (2 * (r / 32))) & 3;
}

/* Q3_K scales: 16 six-bit values; low nibbles in bytes 0..7 (elements 0..7
 * low nibble, 8..15 high nibble), the top two bits in bytes 8..11. */
static void set_scale_q3(uint8_t *sc, int j, int v)
{
    if (j < 8)
        sc[j] = (uint8_t)(v & 0xF);
    else
        sc[j - 8] |= (uint8_t)((v & 0xF) << 4);
    sc[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
}

static int get_scale_q3(const uint8_t *sc, int j)
{
    const int lo = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
    return lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

/* Q4_K/Q5_K scales: 8 (scale, min) pairs of six bits in 12 bytes. Pairs 0..3
 * use the low 6 bits of bytes 0..3 / 4..7; pairs 4..7 keep their low nibbles
 * in bytes 8..11 and their top 2 bits in the spare top bits of bytes 0..7. */
static void set_scale_min_k4(uint8_t *q, int j, uint8_t ls, uint8_t lm)
{
    if (j < 4) {
        q[j] = ls;
        q[j + 4] = lm;
    } else {
        q[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        q[j - 4] |= (uint8_t)((ls >> 4) << 6);
        q[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

static void get_scale_min_k4(const uint8_t *q, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* 4-bit fields of Q4_K/Q5_K: each 64-element chunk uses 32 bytes, elements
 * 0..31 of the chunk in the low nibbles, 32..63 in the high ones. */
static int get_4bit_k(const uint8_t *qs, int e)
{
    const int r = e % 64;
    const uint8_t b = qs[(e / 64) * 32 + r % 32];
    return r < 32 ? b & 0xF : b >> 4;
}

/* One high bit per element (Q3_K hmask, Q5_K qh): bit e/32 of byte e%32. */
static int get_high_bit(const uint8_t *h, int e)
{
    return (h[e % 32] >> (e / 32)) & 1;
}

/* ======================= unpacked super-block ======================= */

typedef struct {
    float d, dmin;
    bool has_min;
    int sub;        /* elements per sub-block: 16 or 32 */
    int sc[16], mn[16];
    int8_t q[QK_K]; /* signed levels */
} kblock_t;

static void q2_K_unpack(const void *blk, kblock_t *u)
{
    const ecs_block_q2_K *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->dmin = ecs_fp16_to_f32(b->dmin);
    u->has_min = true;
    u->sub = 16;
    for (int j = 0; j < 16; j++) {
        u->sc[j] = b->scales[j] & 0xF;
        u->mn[j] = b->scales[j] >> 4;
    }
    for (int e = 0; e < QK_K; e++)
        u->q[e] = (int8_t)get_2bit(b->qs, e);
}

static void q3_K_unpack(const void *blk, kblock_t *u)
{
    const ecs_block_q3_K *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->dmin = 0;
    u->has_min = false;
    u->sub = 16;
    for (int j = 0; j < 16; j++)
        u->sc[j] = get_scale_q3(b->scales, j) - 32;
    /* a clear hmask bit means the level is 4 lower */
    for (int e = 0; e < QK_K; e++)
        u->q[e] = (int8_t)(get_2bit(b->qs, e) - (get_high_bit(b->hmask, e) ? 0 : 4));
}

static void k4_scales_unpack(const uint8_t *scales, kblock_t *u)
{
    u->has_min = true;
    u->sub = 32;
    for (int j = 0; j < 8; j++)
        get_scale_min_k4(scales, j, &u->sc[j], &u->mn[j]);
}

static void q4_K_unpack(const void *blk, kblock_t *u)
{
    const ecs_block_q4_K *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->dmin = ecs_fp16_to_f32(b->dmin);
    k4_scales_unpack(b->scales, u);
    for (int e = 0; e < QK_K; e++)
        u->q[e] = (int8_t)get_4bit_k(b->qs, e);
}

static void q5_K_unpack(const void *blk, kblock_t *u)
{
    const ecs_block_q5_K *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->dmin = ecs_fp16_to_f32(b->dmin);
    k4_scales_unpack(b->scales, u);
    for (int e = 0; e < QK_K; e++)
        u->q[e] = (int8_t)(get_4bit_k(b->qs, e) + 16 * get_high_bit(b->qh, e));
}

/* Q6_K: each 128-element half has 64 ql bytes and 32 qh bytes. Element l
 * of quarter k (0..3) of the half: low 4 bits from ql[l + 32*(k&1)] (low
 * nibble for k < 2, high nibble otherwise), top 2 bits from bits 2k..2k+1 of
 * qh[l]; the level is that 6-bit value minus 32. */
static void q6_K_unpack(const void *blk, kblock_t *u)
{
    const ecs_block_q6_K *b = blk;
    u->d = ecs_fp16_to_f32(b->d);
    u->dmin = 0;
    u->has_min = false;
    u->sub = 16;
    for (int j = 0; j < 16; j++)
        u->sc[j] = b->scales[j];
    for (int e = 0; e < QK_K; e++) {
        const int half = e / 128, r = e % 128, k = r / 32, l = r % 32;
        const uint8_t qlb = b->ql[half * 64 + (k & 1) * 32 + l];
        const int lo = k < 2 ? qlb & 0xF : qlb >> 4;
        const int hi = (b->qh[half * 32 + l] >> (2 * k)) & 3;
        u->q[e] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

static void q8_K_unpack(const void *blk, kblock_t *u)
{
    const ecs_block_q8_K *b = blk;
    u->d = b->d;
    u->dmin = 0;
    u->has_min = false;
    u->sub = 16;
    for (int j = 0; j < 16; j++)
        u->sc[j] = 1;
    memcpy(u->q, b->qs, QK_K);
}

/* ======================= quantizers ======================= */

static void q2_K_quantize(const float *x, void *blk)
{
    ecs_block_q2_K *y = blk;
    uint8_t L[QK_K];
    float w[16], scales[16], mins[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++)
            w[l] = fabsf(x[16 * j + l]);
        scales[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    /* scales and mins as 4-bit multiples of d and dmin; the uint8 casts wrap
     * like ggml's implicit conversions */
    if (max_scale > 0) {
        const float iscale = 15.0f / max_scale;
        for (int j = 0; j < 16; j++)
            y->scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
        y->d = ecs_f32_to_fp16(max_scale / 15.0f);
    } else {
        memset(y->scales, 0, sizeof y->scales);
        y->d = ecs_f32_to_fp16(0.0f);
    }
    if (max_min > 0) {
        const float iscale = 15.0f / max_min;
        for (int j = 0; j < 16; j++)
            y->scales[j] |= (uint8_t)((unsigned)nearest_int(iscale * mins[j]) << 4);
        y->dmin = ecs_f32_to_fp16(max_min / 15.0f);
    } else {
        y->dmin = ecs_f32_to_fp16(0.0f);
    }
    /* requantize against the rounded scales; a zero scale keeps the search's L */
    const float d_all = ecs_fp16_to_f32(y->d), m_all = ecs_fp16_to_f32(y->dmin);
    for (int j = 0; j < 16; j++) {
        const float d = d_all * (float)(y->scales[j] & 0xF);
        if (!d)
            continue;
        const float dm = m_all * (float)(y->scales[j] >> 4);
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (uint8_t)iclamp(nearest_int((x[16 * j + i] + dm) / d), 0, 3);
    }
    pack_2bit(L, y->qs);
}

static void q3_K_quantize(const float *x, void *blk)
{
    ecs_block_q3_K *y = blk;
    int8_t L[QK_K];
    float scales[16], amax;
    for (int j = 0; j < 16; j++)
        scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
    const float max_scale = signed_max(16, scales, &amax);
    memset(y->scales, 0, sizeof y->scales);
    if (max_scale) {
        const float iscale = -32.0f / max_scale;
        for (int j = 0; j < 16; j++)
            set_scale_q3(y->scales, j, iclamp(nearest_int(iscale * scales[j]), -32, 31) + 32);
        y->d = ecs_f32_to_fp16(1 / iscale);
    } else {
        y->d = ecs_f32_to_fp16(0.0f);
    }
    const float d_all = ecs_fp16_to_f32(y->d);
    for (int j = 0; j < 16; j++) {
        const float d = d_all * (float)(get_scale_q3(y->scales, j) - 32);
        if (!d)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(iclamp(nearest_int(x[16 * j + i] / d), -4, 3) + 4);
    }
    /* levels 0..7: bit 2 goes to hmask, the low two bits to qs */
    uint8_t low[QK_K];
    memset(y->hmask, 0, sizeof y->hmask);
    for (int e = 0; e < QK_K; e++) {
        if (L[e] > 3)
            y->hmask[e % 32] |= (uint8_t)(1u << (e / 32));
        low[e] = (uint8_t)(L[e] & 3);
    }
    pack_2bit(low, y->qs);
}

/* Q4_K/Q5_K share everything but the level range and search parameters:
 * per 32-element sub-block an affine fit, then six-bit scales and mins
 * relative to the block's largest, then levels requantized against them. */
static void quantize_k4_common(const float *x, int nmax, float rmin, int nstep, uint8_t *scales12,
                               ecs_fp16_t *d_out, ecs_fp16_t *dmin_out, uint8_t *L)
{
    float w[32], scales[8], mins[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = fit_scale_min(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep,
                                  false);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        const uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        const uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        set_scale_min_k4(scales12, j, (uint8_t)imin(63, ls), (uint8_t)imin(63, lm));
    }
    *d_out = ecs_f32_to_fp16(max_scale / 63.0f);
    *dmin_out = ecs_f32_to_fp16(max_min / 63.0f);
    const float d_all = ecs_fp16_to_f32(*d_out), m_all = ecs_fp16_to_f32(*dmin_out);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        get_scale_min_k4(scales12, j, &sc, &mn);
        const float d = d_all * (float)sc;
        if (!d)
            continue;
        const float dm = m_all * (float)mn;
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = (uint8_t)iclamp(nearest_int((x[32 * j + i] + dm) / d), 0, nmax);
    }
}

static void q4_K_quantize(const float *x, void *blk)
{
    ecs_block_q4_K *y = blk;
    uint8_t L[QK_K];
    quantize_k4_common(x, 15, -1.0f, 20, y->scales, &y->d, &y->dmin, L);
    for (int c = 0; c < QK_K / 64; c++)
        for (int l = 0; l < 32; l++)
            y->qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + l + 32] << 4));
}

static void q5_K_quantize(const float *x, void *blk)
{
    ecs_block_q5_K *y = blk;
    uint8_t L[QK_K];
    quantize_k4_common(x, 31, -0.5f, 15, y->scales, &y->d, &y->dmin, L);
    memset(y->qh, 0, sizeof y->qh);
    for (int e = 0; e < QK_K; e++)
        if (L[e] > 15)
            y->qh[e % 32] |= (uint8_t)(1u << (e / 32));
    for (int c = 0; c < QK_K / 64; c++)
        for (int l = 0; l < 32; l++)
            y->qs[32 * c + l] =
                (uint8_t)((L[64 * c + l] & 0xF) | ((L[64 * c + l + 32] & 0xF) << 4));
}

static void q6_K_quantize(const float *x, void *blk)
{
    ecs_block_q6_K *y = blk;
    int8_t L[QK_K];
    float scales[16], max_abs_scale;
    for (int j = 0; j < 16; j++)
        scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
    const float max_scale = signed_max(16, scales, &max_abs_scale);
    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(y, 0, sizeof *y);
        return;
    }
    const float iscale = -128.0f / max_scale;
    y->d = ecs_f32_to_fp16(1 / iscale);
    for (int j = 0; j < 16; j++)
        y->scales[j] = (int8_t)imin(127, nearest_int(iscale * scales[j]));
    const float d_all = ecs_fp16_to_f32(y->d);
    for (int j = 0; j < 16; j++) {
        const float d = d_all * (float)y->scales[j];
        if (!d)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(iclamp(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
    }
    /* layout: see q6_K_unpack */
    for (int half = 0; half < 2; half++) {
        const int8_t *Lh = L + 128 * half;
        uint8_t *ql = y->ql + 64 * half, *qh = y->qh + 32 * half;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
            ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
            qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                              ((Lh[l + 96] >> 4) << 6));
        }
    }
}

/* Activations: symmetric over [-127, 127] with the largest magnitude at
 * -127, an unrounded float d, and the sums of each 16 levels that let the
 * dot products apply the weight's mins without touching every element. */
static void q8_K_quantize(const float *x, void *blk)
{
    ecs_block_q8_K *y = blk;
    float amax;
    const float max = signed_max(QK_K, x, &amax);
    if (!amax) {
        memset(y, 0, sizeof *y);
        return;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < QK_K; j++)
        y->qs[j] = (int8_t)iclamp(nearest_int(iscale * x[j]), -128, 127);
    for (int j = 0; j < QK_K / 16; j++) {
        int sum = 0;
        for (int i = 0; i < 16; i++)
            sum += y->qs[16 * j + i];
        y->bsums[j] = (int16_t)sum;
    }
    y->d = 1 / iscale;
}

/* ======================= generic row loops ======================= */

typedef struct {
    size_t size;
    void (*quantize)(const float *x, void *blk);
    void (*unpack)(const void *blk, kblock_t *u);
} k_type_t;

static void k_to_float(const k_type_t *t, const void *src, float *dst, int64_t nb)
{
    const uint8_t *p = src;
    kblock_t u;
    for (int64_t i = 0; i < nb; i++, p += t->size, dst += QK_K) {
        t->unpack(p, &u);
        for (int e = 0; e < QK_K; e++) {
            const int s = e / u.sub;
            const float v = (u.d * (float)u.sc[s]) * (float)u.q[e];
            dst[e] = u.has_min ? v - u.dmin * (float)u.mn[s] : v;
        }
    }
}

static void k_from_float(const k_type_t *t, const float *src, void *dst, int64_t nb)
{
    uint8_t *p = dst;
    for (int64_t i = 0; i < nb; i++, p += t->size, src += QK_K)
        t->quantize(src, p);
}

/* Per super-block: exact integer sums sum_s sc[s] * (q . a over s) and
 * sum_s mn[s] * (sum of a over s, from bsums), then one float step
 * d_w*d_a*isum - dmin_w*d_a*msum. ggml's generic code computes the same
 * integers (it spreads the float step over 8 lanes; only rounding differs). */
static float k_vec_dot(const k_type_t *t, int64_t nb, const void *w, const void *a)
{
    const uint8_t *pw = w;
    const ecs_block_q8_K *y = a;
    float sum = 0.0f;
    kblock_t u;
    for (int64_t i = 0; i < nb; i++, pw += t->size) {
        t->unpack(pw, &u);
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < QK_K / u.sub; s++) {
            int32_t dot = 0;
            for (int e = s * u.sub; e < (s + 1) * u.sub; e++)
                dot += (int32_t)u.q[e] * y[i].qs[e];
            isum += u.sc[s] * dot;
            if (u.has_min) {
                int32_t bs = 0;
                for (int k = s * u.sub / 16; k < (s + 1) * u.sub / 16; k++)
                    bs += y[i].bsums[k];
                msum += u.mn[s] * bs;
            }
        }
        const float d = u.d * y[i].d;
        sum += d * (float)isum;
        if (u.has_min)
            sum -= (u.dmin * y[i].d) * (float)msum;
    }
    return sum;
}

#define K_OPS(name, block)                                                                    \
    static const k_type_t name##_type = {sizeof(block), name##_quantize, name##_unpack};      \
    static void name##_to_float(const void *src, float *dst, int64_t nb)                      \
    {                                                                                         \
        k_to_float(&name##_type, src, dst, nb);                                               \
    }                                                                                         \
    static void name##_from_float(const float *src, void *dst, int64_t nb)                    \
    {                                                                                         \
        k_from_float(&name##_type, src, dst, nb);                                             \
    }                                                                                         \
    static float name##_vec_dot(int64_t nb, const void *w, const void *a)                     \
    {                                                                                         \
        return k_vec_dot(&name##_type, nb, w, a);                                             \
    }                                                                                         \
    const quant_ops_t quant_ops_##name = {name##_to_float, name##_from_float, name##_vec_dot};

K_OPS(q2_K, ecs_block_q2_K)
K_OPS(q3_K, ecs_block_q3_K)
K_OPS(q4_K, ecs_block_q4_K)
K_OPS(q5_K, ecs_block_q5_K)
K_OPS(q6_K, ecs_block_q6_K)
K_OPS(q8_K, ecs_block_q8_K)
