/* sampler.c - penalties, truncation (top-k / top-p / min-p), temperature and
 * the seeded draw, in llama.cpp's order. See sampler.h for the contract.
 *
 * Candidates are kept in one n_vocab-sized array allocated at sampler_new.
 * Truncation uses selection (expected O(n)) plus a sort of the survivors
 * rather than a full sort of the vocabulary: top-p without top-k grows the
 * selected prefix until it holds enough probability mass, which on real
 * distributions is a few hundred tokens out of ~100k. */
#include "coordinator/sampler/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float logit;
    int32_t id;
} cand_t;

struct sampler {
    sampler_params_t p;
    int32_t n_vocab;
    cand_t *cand;       /* n_vocab scratch */
    int32_t *counts;    /* occurrences of each id in the penalty window */
    int32_t *window;    /* ring of the last penalty_last_n accepted ids */
    int32_t win_len;    /* ids currently in the ring */
    int32_t win_head;   /* next slot to write */
    uint64_t rng[4];    /* xoshiro256** state */
};

/* ---- random numbers: splitmix64 seeds xoshiro256** (both public domain) ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t r = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

static void rng_seed(uint64_t s[4], uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&seed);
}

/* ---- parameters ---- */

sampler_params_t sampler_params_default(void)
{
    return (sampler_params_t){
        .temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
        .repeat_penalty = 1.0f, .freq_penalty = 0.0f, .presence_penalty = 0.0f,
        .penalty_last_n = 64, .seed = 0,
    };
}

ecs_err_t sampler_params_check(const sampler_params_t *p)
{
    if (!p)
        return ecs_error(ECS_ERR_INVAL, "sampler: params is NULL");
    if (!isfinite(p->temp) || p->temp < 0.0f)
        return ecs_error(ECS_ERR_INVAL, "sampler: temperature %g must be finite and >= 0", p->temp);
    if (p->top_k < 0)
        return ecs_error(ECS_ERR_INVAL, "sampler: top_k %d must be >= 0 (0 = off)", p->top_k);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return ecs_error(ECS_ERR_INVAL, "sampler: top_p %g must be in [0, 1]", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return ecs_error(ECS_ERR_INVAL, "sampler: min_p %g must be in [0, 1]", p->min_p);
    if (!isfinite(p->repeat_penalty) || p->repeat_penalty <= 0.0f)
        return ecs_error(ECS_ERR_INVAL, "sampler: repeat_penalty %g must be finite and > 0",
                         p->repeat_penalty);
    if (!isfinite(p->freq_penalty))
        return ecs_error(ECS_ERR_INVAL, "sampler: frequency_penalty must be finite");
    if (!isfinite(p->presence_penalty))
        return ecs_error(ECS_ERR_INVAL, "sampler: presence_penalty must be finite");
    if (p->penalty_last_n < 0 || p->penalty_last_n > SAMPLER_MAX_PENALTY_LAST_N)
        return ecs_error(ECS_ERR_INVAL, "sampler: penalty_last_n %d must be in [0, %d]",
                         p->penalty_last_n, SAMPLER_MAX_PENALTY_LAST_N);
    if (p->n_bias < 0 || p->n_bias > SAMPLER_MAX_BIAS)
        return ecs_error(ECS_ERR_INVAL, "sampler: %d logit_bias entries (at most %d)", p->n_bias,
                         SAMPLER_MAX_BIAS);
    for (int32_t i = 0; i < p->n_bias; i++)
        if (!isfinite(p->bias[i]) || p->bias_id[i] < 0)
            return ecs_error(ECS_ERR_INVAL, "sampler: logit_bias entry %d (token %d) is not a "
                             "finite bias of a token id", i, p->bias_id[i]);
    return ECS_OK;
}

/* ---- life cycle ---- */

ecs_err_t sampler_new(const sampler_params_t *p, int32_t n_vocab, sampler_t **out)
{
    if (!out)
        return ecs_error(ECS_ERR_INVAL, "sampler: out is NULL");
    *out = NULL;
    ecs_err_t e = sampler_params_check(p);
    if (e)
        return e;
    if (n_vocab <= 0 || n_vocab > SAMPLER_MAX_VOCAB)
        return ecs_error(ECS_ERR_INVAL, "sampler: n_vocab %d must be in [1, %d]", n_vocab,
                         SAMPLER_MAX_VOCAB);
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias_id[i] >= n_vocab)
            return ecs_error(ECS_ERR_RANGE, "logit_bias: token id %d outside the vocabulary "
                             "(0..%d)", p->bias_id[i], n_vocab - 1);
    sampler_t *s = calloc(1, sizeof *s);
    if (!s)
        return ecs_error(ECS_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->window = malloc((size_t)(p->penalty_last_n > 0 ? p->penalty_last_n : 1) * sizeof *s->window);
    if (!s->cand || !s->counts || !s->window) {
        sampler_free(s);
        return ecs_error(ECS_ERR_NOMEM, "sampler: out of memory for n_vocab %d", n_vocab);
    }
    rng_seed(s->rng, p->seed);
    *out = s;
    return ECS_OK;
}

void sampler_free(sampler_t *s)
{
    if (!s)
        return;
    free(s->cand);
    free(s->counts);
    free(s->window);
    free(s);
}

void sampler_reset(sampler_t *s)
{
    for (int32_t i = 0; i < s->win_len; i++)
        s->counts[s->window[i]] = 0;
    s->win_len = 0;
    s->win_head = 0;
    rng_seed(s->rng, s->p.seed);
}

ecs_err_t sampler_accept(sampler_t *s, int32_t token)
{
    if (token < 0 || token >= s->n_vocab)
        return ecs_error(ECS_ERR_RANGE, "sampler: token %d outside vocabulary [0, %d)", token,
                         s->n_vocab);
    int32_t cap = s->p.penalty_last_n;
    if (cap == 0)
        return ECS_OK;
    if (s->win_len == cap)
        s->counts[s->window[s->win_head]]--;
    else
        s->win_len++;
    s->window[s->win_head] = token;
    s->counts[token]++;
    s->win_head = (s->win_head + 1) % cap;
    return ECS_OK;
}

/* ---- penalties ---- */

static bool penalties_active(const sampler_params_t *p)
{
    return p->penalty_last_n > 0 &&
           (p->repeat_penalty != 1.0f || p->freq_penalty != 0.0f || p->presence_penalty != 0.0f);
}

void sampler_apply_penalties(sampler_t *s, float *logits)
{
    const sampler_params_t *p = &s->p;
    if (!penalties_active(p))
        return;
    /* Each distinct id in the window is penalised once: its count is negated
     * to mark it done, then restored in a second pass. */
    for (int32_t i = 0; i < s->win_len; i++) {
        int32_t t = s->window[i];
        int32_t c = s->counts[t];
        if (c <= 0)
            continue;
        float l = logits[t];
        l = l <= 0.0f ? l * p->repeat_penalty : l / p->repeat_penalty;
        logits[t] = l - (float)c * p->freq_penalty - p->presence_penalty;
        s->counts[t] = -c;
    }
    for (int32_t i = 0; i < s->win_len; i++) {
        int32_t t = s->window[i];
        if (s->counts[t] < 0)
            s->counts[t] = -s->counts[t];
    }
}

/* ---- candidate ordering: logit descending, then id ascending (a total order,
 * so results never depend on the selection's internal choices) ---- */

static bool cand_before(const cand_t *a, const cand_t *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *va, const void *vb)
{
    const cand_t *a = va, *b = vb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

static void cand_swap(cand_t *a, cand_t *b)
{
    cand_t t = *a;
    *a = *b;
    *b = t;
}

/* Moves the k best candidates of c[0, n) into c[0, k) (unordered).
 * Quickselect with a median-of-three pivot; if it fails to shrink the range
 * quickly (adversarial input) the remaining range is simply sorted. */
static void cand_select(cand_t *c, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n - 1, budget = 64;
    while (lo < hi) {
        if (--budget == 0) {
            qsort(c + lo, (size_t)(hi - lo + 1), sizeof *c, cand_cmp);
            return;
        }
        int32_t mid = lo + (hi - lo) / 2;
        if (cand_before(&c[mid], &c[lo]))
            cand_swap(&c[mid], &c[lo]);
        if (cand_before(&c[hi], &c[lo]))
            cand_swap(&c[hi], &c[lo]);
        if (cand_before(&c[hi], &c[mid]))
            cand_swap(&c[hi], &c[mid]);
        cand_swap(&c[mid], &c[hi]); /* pivot (the median) at hi */
        int32_t store = lo;
        for (int32_t i = lo; i < hi; i++)
            if (cand_before(&c[i], &c[hi]))
                cand_swap(&c[i], &c[store++]);
        cand_swap(&c[store], &c[hi]);
        if (store == k - 1 || store == k)
            return;
        if (store < k)
            lo = store + 1;
        else
            hi = store - 1;
    }
}

/* Puts the k best of c[0, n) first, in order. */
static void cand_top_sorted(cand_t *c, int32_t n, int32_t k)
{
    if (k < n)
        cand_select(c, n, k);
    else
        k = n;
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
}

static float cand_max(const cand_t *c, int32_t n)
{
    float m = c[0].logit;
    for (int32_t i = 1; i < n; i++)
        m = c[i].logit > m ? c[i].logit : m;
    return m;
}

static double cand_expsum(const cand_t *c, int32_t n, float max)
{
    double z = 0.0;
    for (int32_t i = 0; i < n; i++)
        z += exp((double)c[i].logit - max);
    return z;
}

/* Smallest sorted prefix of c whose probability mass reaches top_p (at
 * least one token), as llama.cpp's top-p. Sorts only as much as needed. */
static int32_t cand_top_p(cand_t *c, int32_t n, bool sorted, float top_p)
{
    float max = cand_max(c, n);
    double z = cand_expsum(c, n, max);
    int32_t k = sorted ? n : 256, done = 0;
    double cum = 0.0;
    for (;;) {
        if (!sorted) {
            if (k > n)
                k = n;
            cand_top_sorted(c, n, k);
            cum = 0.0;
            done = 0;
        }
        for (; done < k; done++) {
            cum += exp((double)c[done].logit - max) / z;
            if (cum >= top_p)
                return done + 1;
        }
        if (k == n)
            return n;
        k = k > n / 4 ? n : k * 4;
    }
}

/* Keeps candidates whose probability is at least min_p times the largest,
 * compared on logits as llama.cpp does: l >= max + log(min_p). */
static int32_t cand_min_p(cand_t *c, int32_t n, float min_p)
{
    float thr = cand_max(c, n) + logf(min_p);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (c[i].logit >= thr)
            c[m++] = c[i];
    return m;
}

/* Draws from softmax(c / temp). Scaling happens in double on the shifted
 * logits, so a tiny temperature cannot overflow to inf - inf. */
static int32_t cand_draw(sampler_t *s, const cand_t *c, int32_t n)
{
    const double inv_t = 1.0 / (double)s->p.temp;
    const float max = cand_max(c, n);
    double z = 0.0;
    for (int32_t i = 0; i < n; i++)
        z += exp(((double)c[i].logit - max) * inv_t);
    const double target = rng_uniform(s->rng) * z;
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += exp(((double)c[i].logit - max) * inv_t);
        if (cum > target)
            return c[i].id;
    }
    return c[n - 1].id; /* rounding: target landed at the very top */
}

/* Running maxima kept per lane: the loop vectorises (a sequential max is
 * one dependent compare per logit: ~0.3 ms of a 102400-entry vocabulary,
 * per token). */
#define ARGMAX_LANES 16

int32_t sampler_argmax(const float *l, int32_t n)
{
    float mx[ARGMAX_LANES];
    for (int j = 0; j < ARGMAX_LANES; j++)
        mx[j] = -INFINITY;
    int32_t i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int j = 0; j < ARGMAX_LANES; j++)
            mx[j] = l[i + j] > mx[j] ? l[i + j] : mx[j];
    float m = -INFINITY;
    for (int j = 0; j < ARGMAX_LANES; j++)
        m = mx[j] > m ? mx[j] : m;
    for (; i < n; i++)
        m = l[i] > m ? l[i] : m;
    for (i = 0; i < n; i++)
        if (l[i] == m)
            return i;
    return 0;
}

/* A NaN or +inf logit, or none above -inf, is an error naming the first
 * bad one. The scan runs in lanes without an early exit, so that it is
 * vectorised like sampler_argmax: with the exit it took ~0.2 ms of a
 * 102400-token row, most of a greedy draw. */
static ecs_err_t check_logits(const float *l, int32_t n)
{
    int32_t bad[ARGMAX_LANES] = {0}, finite[ARGMAX_LANES] = {0};
    int32_t i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int j = 0; j < ARGMAX_LANES; j++) {
            bad[j] |= !(l[i + j] < INFINITY); /* NaN or +inf */
            finite[j] += l[i + j] != -INFINITY;
        }
    for (int j = 1; j < ARGMAX_LANES; j++) {
        bad[0] |= bad[j];
        finite[0] += finite[j];
    }
    for (; i < n; i++) {
        bad[0] |= !(l[i] < INFINITY);
        finite[0] += l[i] != -INFINITY;
    }
    for (i = 0; bad[0] && i < n; i++)
        if (isnan(l[i]) || l[i] == INFINITY)
            return ecs_error(ECS_ERR_RANGE, "sampler: logit %d is %s", i,
                             isnan(l[i]) ? "NaN" : "+inf");
    if (finite[0] == 0)
        return ecs_error(ECS_ERR_RANGE, "sampler: every logit is -inf");
    return ECS_OK;
}

ecs_err_t sampler_sample(sampler_t *s, float *logits, int32_t *token)
{
    ecs_err_t e = check_logits(logits, s->n_vocab);
    if (e)
        return e;
    const sampler_params_t *p = &s->p;
    for (int32_t i = 0; i < p->n_bias; i++) /* llama.cpp's chain starts with it too */
        logits[p->bias_id[i]] += p->bias[i];
    sampler_apply_penalties(s, logits);
    if (p->temp == 0.0f || p->top_k == 1) {
        *token = sampler_argmax(logits, s->n_vocab);
        return ECS_OK;
    }
    cand_t *c = s->cand;
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_vocab; i++)
        if (logits[i] != -INFINITY)
            c[n++] = (cand_t){logits[i], i};
    bool sorted = false;
    if (p->top_k > 0 && p->top_k < n) {
        cand_top_sorted(c, n, p->top_k);
        n = p->top_k;
        sorted = true;
    }
    if (p->top_p < 1.0f) {
        n = cand_top_p(c, n, sorted, p->top_p);
        sorted = true;
    }
    if (p->min_p > 0.0f)
        n = cand_min_p(c, n, p->min_p);
    *token = cand_draw(s, c, n);
    return ECS_OK;
}
