/* route.c - MoE routing of one row, as llama.cpp's build_moe_ffn: gating
 * (softmax or sigmoid), optional selection bias, DeepSeek-V3 group limit,
 * top-k, optional renormalisation and scaling. */
#include <math.h>
#include <string.h>

#include "coordinator/model/model_int.h"

static void softmax_inplace(float *p, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = p[i] > mx ? p[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        p[i] = expf(p[i] - mx);
        sum += (double)p[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        p[i] *= inv;
}

/* Index of the largest value not yet taken (taken = NaN); ties: lowest. */
static int argmax_untaken(const float *v, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(v[i]) && (best < 0 || v[i] > v[best]))
            best = i;
    return best;
}

/* DeepSeek-V3 group limit (as llama.cpp): a group scores the sum of its two
 * best selection values; experts outside the n_group_used best groups are
 * excluded. gs holds n_expert_groups floats. */
static void group_limit(const arch_hparams_t *hp, float *sel, float *gs)
{
    const int ng = hp->n_expert_groups, per = hp->n_expert / ng;
    for (int g = 0; g < ng; g++) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            if (sel[e] > b1) {
                b2 = b1;
                b1 = sel[e];
            } else if (sel[e] > b2) {
                b2 = sel[e];
            }
        }
        gs[g] = per > 1 ? b1 + b2 : b1;
    }
    for (int r = 0; r < hp->n_group_used; r++)
        gs[argmax_untaken(gs, ng)] = NAN; /* NaN marks a kept group */
    for (int g = 0; g < ng; g++)
        if (!isnan(gs[g]))
            for (int e = g * per; e < (g + 1) * per; e++)
                sel[e] = -INFINITY;
}

void model_route(const arch_hparams_t *hp, const float *logits, const float *bias, int32_t *ids,
                 float *w, float *scratch)
{
    const int ne = hp->n_expert, k = hp->n_expert_used;
    float *probs = scratch, *sel = scratch + ne, *gs = scratch + 2 * ne;
    memcpy(probs, logits, (size_t)ne * sizeof *probs);
    if (hp->gating == ARCH_GATING_SIGMOID)
        for (int e = 0; e < ne; e++)
            probs[e] = 1.0f / (1.0f + expf(-probs[e]));
    else
        softmax_inplace(probs, ne);
    /* the bias steers which experts win, not how much they count */
    for (int e = 0; e < ne; e++)
        sel[e] = bias ? probs[e] + bias[e] : probs[e];
    if (hp->n_expert_groups > 1 && hp->n_group_used < hp->n_expert_groups)
        group_limit(hp, sel, gs);
    for (int j = 0; j < k; j++) {
        const int e = argmax_untaken(sel, ne);
        ids[j] = e;
        w[j] = probs[e];
        sel[e] = NAN;
    }
    if (hp->expert_weights_norm) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++)
            sum += w[j];
        sum = fmaxf(sum, 6.103515625e-5f);
        for (int j = 0; j < k; j++)
            w[j] /= sum;
    }
    if (hp->expert_weights_scale != 0.0f)
        for (int j = 0; j < k; j++)
            w[j] *= hp->expert_weights_scale;
}

