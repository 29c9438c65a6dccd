/* rope.c - rotary position embedding as ggml computes it (ggml_rope_ext):
 * NORM and NEOX pair layouts, linear scaling and YaRN (ramp between
 * extrapolated and interpolated frequencies, magnitude correction). */
#include <math.h>

#include "coordinator/model/model_int.h"

static float yarn_ramp(float low, float high, int i0)
{
    const float y = (float)(i0 / 2 - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

void model_rope_yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast,
                               float beta_slow, float dims[2])
{
    const float start = floorf(corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base));
    const float end = ceilf(corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base));
    dims[0] = fmaxf(0.0f, start);
    dims[1] = fminf((float)(n_dims - 1), end);
}

void model_rope_cache(const arch_rope_t *r, int pos, float *cs)
{
    float corr[2];
    model_rope_yarn_corr_dims(r->n_rot, r->n_ctx_orig, r->freq_base, r->beta_fast, r->beta_slow,
                              corr);
    const float theta_scale = powf(r->freq_base, -2.0f / (float)r->n_rot);
    float theta_extrap = (float)pos;
    for (int i0 = 0; i0 < r->n_rot; i0 += 2) {
        /* YaRN: interpolate low frequencies, extrapolate high ones, blend
         * in between, and scale the magnitude for interpolation. */
        const float theta_interp = r->freq_scale * theta_extrap;
        float theta = theta_interp, mscale = r->attn_factor;
        if (r->ext_factor != 0.0f) {
            const float mix = yarn_ramp(corr[0], corr[1], i0) * r->ext_factor;
            theta = theta_interp * (1 - mix) + theta_extrap * mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / r->freq_scale);
        }
        cs[i0] = cosf(theta) * mscale;
        cs[i0 + 1] = sinf(theta) * mscale;
        theta_extrap *= theta_scale;
    }
}

void model_rope_apply(const arch_rope_t *r, const float *cs, float *x)
{
    const int n = r->n_rot;
    /* NORM rotates (x[2i], x[2i+1]); NEOX rotates (x[i], x[i + n/2]). */
    const int stride = r->mode == ARCH_ROPE_NEOX ? n / 2 : 1;
    for (int i0 = 0; i0 < n; i0 += 2) {
        const int a = r->mode == ARCH_ROPE_NEOX ? i0 / 2 : i0;
        const float c = cs[i0], s = cs[i0 + 1];
        const float x0 = x[a], x1 = x[a + stride];
        x[a] = x0 * c - x1 * s;
        x[a + stride] = x0 * s + x1 * c;
    }
}

