/* test_sampler.c - the sampler's contract: parameter checks, greedy ties,
 * determinism of the seeded draw, the sampled distributions (chi-square
 * against the exact softmax with fixed seeds), truncation sets, penalty
 * arithmetic, and stop-string hold-back across every split of the text. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/sampler/sampler.h"

#define MAXV 16

static sampler_t *mk(sampler_params_t p, int32_t n_vocab)
{
    sampler_t *s = NULL;
    ecs_err_t e = sampler_new(&p, n_vocab, &s);
    cr_assert_eq(e, ECS_OK, "sampler_new: %s", ecs_errmsg());
    return s;
}

static int32_t sample1(sampler_t *s, const float *logits, int32_t n)
{
    float buf[MAXV];
    cr_assert(n <= MAXV);
    memcpy(buf, logits, (size_t)n * sizeof *buf);
    int32_t tok = -1;
    cr_assert_eq(sampler_sample(s, buf, &tok), ECS_OK, "%s", ecs_errmsg());
    cr_assert(tok >= 0 && tok < n);
    return tok;
}

/* Draws n_draws tokens and returns the chi-square statistic against the
 * expected probabilities; any draw with expected probability 0 fails. */
static double chi2_of(sampler_params_t p, const float *logits, int32_t n, const double *expect,
                      int n_draws)
{
    sampler_t *s = mk(p, n);
    int counts[MAXV] = {0};
    for (int i = 0; i < n_draws; i++)
        counts[sample1(s, logits, n)]++;
    sampler_free(s);
    double chi2 = 0.0;
    for (int32_t i = 0; i < n; i++) {
        if (expect[i] == 0.0) {
            cr_assert_eq(counts[i], 0, "token %d has probability 0 but was drawn %d times", i,
                         counts[i]);
            continue;
        }
        double e = expect[i] * n_draws;
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi2;
}

/* Upper 0.1% points of chi-square for 1..7 degrees of freedom. */
static double chi2_crit(int dof)
{
    static const double crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
    cr_assert(dof >= 1 && dof <= 7);
    return crit[dof];
}

/* softmax(logits / temp) restricted to the ids with keep[i] != 0. */
static void softmax_ref(const float *logits, int32_t n, double temp, const int *keep, double *out)
{
    double max = -INFINITY, z = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (!keep || keep[i])
            max = fmax(max, logits[i] / temp);
    for (int32_t i = 0; i < n; i++) {
        out[i] = (!keep || keep[i]) ? exp(logits[i] / temp - max) : 0.0;
        z += out[i];
    }
    for (int32_t i = 0; i < n; i++)
        out[i] /= z;
}

static const float L8[8] = {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -0.5f, 0.25f};
/* probabilities 0.5, 0.3, 0.15, 0.05 */
static float P4[4];

static void init_p4(void)
{
    const double p[4] = {0.5, 0.3, 0.15, 0.05};
    for (int i = 0; i < 4; i++)
        P4[i] = (float)log(p[i]);
}

/* ---------------- parameters ---------------- */

static void expect_bad(sampler_params_t p, const char *word)
{
    sampler_t *s = (sampler_t *)1;
    ecs_clear_error();
    cr_assert_eq(sampler_new(&p, 10, &s), ECS_ERR_INVAL);
    cr_assert_null(s);
    cr_assert(strstr(ecs_errmsg(), word), "message '%s' should name %s", ecs_errmsg(), word);
}

Test(sampler_params, defaults_are_valid)
{
    sampler_params_t p = sampler_params_default();
    cr_assert_eq(sampler_params_check(&p), ECS_OK);
}

Test(sampler_params, bad_values_are_rejected_with_a_named_field)
{
    sampler_params_t d = sampler_params_default(), p;
    p = d; p.temp = -0.1f; expect_bad(p, "temperature");
    p = d; p.temp = NAN; expect_bad(p, "temperature");
    p = d; p.top_k = -1; expect_bad(p, "top_k");
    p = d; p.top_p = 1.01f; expect_bad(p, "top_p");
    p = d; p.top_p = -0.01f; expect_bad(p, "top_p");
    p = d; p.top_p = NAN; expect_bad(p, "top_p");
    p = d; p.min_p = 1.5f; expect_bad(p, "min_p");
    p = d; p.min_p = -1.0f; expect_bad(p, "min_p");
    p = d; p.repeat_penalty = 0.0f; expect_bad(p, "repeat_penalty");
    p = d; p.repeat_penalty = INFINITY; expect_bad(p, "repeat_penalty");
    p = d; p.freq_penalty = NAN; expect_bad(p, "frequency_penalty");
    p = d; p.presence_penalty = -INFINITY; expect_bad(p, "presence_penalty");
    p = d; p.penalty_last_n = -1; expect_bad(p, "penalty_last_n");
    p = d; p.penalty_last_n = SAMPLER_MAX_PENALTY_LAST_N + 1; expect_bad(p, "penalty_last_n");
}

Test(sampler_params, bad_vocab_and_null_arguments)
{
    sampler_params_t p = sampler_params_default();
    sampler_t *s = NULL;
    cr_assert_eq(sampler_new(&p, 0, &s), ECS_ERR_INVAL);
    cr_assert_eq(sampler_new(&p, -5, &s), ECS_ERR_INVAL);
    cr_assert_eq(sampler_new(&p, SAMPLER_MAX_VOCAB + 1, &s), ECS_ERR_INVAL);
    cr_assert_eq(sampler_new(NULL, 10, &s), ECS_ERR_INVAL);
    cr_assert_eq(sampler_new(&p, 10, NULL), ECS_ERR_INVAL);
}

/* ---------------- greedy and bad logits ---------------- */

Test(sampler_greedy, temp0_is_argmax_with_ties_to_lowest_id)
{
    sampler_params_t p = sampler_params_default();
    p.temp = 0.0f;
    sampler_t *s = mk(p, 6);
    const float a[6] = {0.1f, 3.0f, -2.0f, 3.0f, 2.9f, 3.0f};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(sample1(s, a, 6), 1);
    const float b[6] = {-INFINITY, -INFINITY, -7.0f, -INFINITY, -7.0f, -8.0f};
    cr_assert_eq(sample1(s, b, 6), 2);
    sampler_free(s);
}

/* The first index of the largest value, by a plain loop. */
static int32_t argmax_naive(const float *l, int32_t n)
{
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(l[i]) && (best < 0 || l[i] > l[best]))
            best = i;
    return best < 0 ? 0 : best;
}

Test(sampler_greedy, argmax_matches_a_plain_loop)
{
    enum { N = 1000 };
    float l[N];
    uint64_t r = 99;
    for (int32_t n = 1; n <= N; n += n < 40 ? 1 : 37) {
        for (int32_t i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            l[i] = (float)((r >> 40) % 64) - 40.0f; /* many ties */
        }
        cr_assert_eq(sampler_argmax(l, n), argmax_naive(l, n), "n = %d", n);
        l[n / 2] = NAN; /* never wins, wherever it is */
        l[0] = NAN;
        cr_assert_eq(sampler_argmax(l, n), argmax_naive(l, n), "n = %d with NaNs", n);
        l[n - 1] = 1000.0f; /* the last one, past the vector blocks */
        cr_assert_eq(sampler_argmax(l, n), n == 1 ? 0 : n - 1, "n = %d, largest last", n);
    }
    const float ties[] = {-INFINITY, 3, 1, 3, 3};
    cr_assert_eq(sampler_argmax(ties, 5), 1, "ties go to the lowest id");
    const float none[] = {NAN, NAN};
    cr_assert_eq(sampler_argmax(none, 2), 0);
}

Test(sampler_greedy, top_k_1_is_greedy_at_any_temperature)
{
    sampler_params_t p = sampler_params_default();
    p.temp = 5.0f;
    p.top_k = 1;
    sampler_t *s = mk(p, 8);
    for (int i = 0; i < 50; i++)
        cr_assert_eq(sample1(s, L8, 8), 2);
    sampler_free(s);
}

Test(sampler_greedy, nan_inf_and_all_masked_logits_are_errors)
{
    sampler_params_t p = sampler_params_default();
    sampler_t *s = mk(p, 4);
    int32_t tok;
    float a[4] = {0.0f, NAN, 1.0f, 2.0f};
    cr_assert_eq(sampler_sample(s, a, &tok), ECS_ERR_RANGE);
    cr_assert(strstr(ecs_errmsg(), "NaN"));
    float b[4] = {0.0f, 1.0f, INFINITY, 2.0f};
    cr_assert_eq(sampler_sample(s, b, &tok), ECS_ERR_RANGE);
    float c[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    cr_assert_eq(sampler_sample(s, c, &tok), ECS_ERR_RANGE);
    sampler_free(s);
}

Test(sampler_greedy, masked_tokens_are_never_drawn)
{
    sampler_params_t p = sampler_params_default();
    p.temp = 3.0f;
    p.seed = 11;
    sampler_t *s = mk(p, 8);
    float l[8];
    memcpy(l, L8, sizeof l);
    l[2] = -INFINITY;
    l[5] = -INFINITY;
    for (int i = 0; i < 2000; i++) {
        int32_t t = sample1(s, l, 8);
        cr_assert(t != 2 && t != 5);
    }
    sampler_free(s);
}

Test(sampler_greedy, tiny_temperature_behaves_like_greedy)
{
    sampler_params_t p = sampler_params_default();
    p.temp = 1e-30f; /* logits / temp would overflow a float */
    p.seed = 3;
    sampler_t *s = mk(p, 8);
    for (int i = 0; i < 200; i++)
        cr_assert_eq(sample1(s, L8, 8), 2);
    sampler_free(s);
}

/* ---------------- determinism ---------------- */

static void draw_seq(uint64_t seed, int32_t *out, int n)
{
    sampler_params_t p = sampler_params_default();
    p.seed = seed;
    p.top_p = 0.95f;
    sampler_t *s = mk(p, 8);
    for (int i = 0; i < n; i++)
        out[i] = sample1(s, L8, 8);
    sampler_free(s);
}

Test(sampler_determinism, same_seed_same_tokens_different_seed_differs)
{
    int32_t a[300], b[300], c[300];
    draw_seq(42, a, 300);
    draw_seq(42, b, 300);
    draw_seq(43, c, 300);
    cr_assert_arr_eq(a, b, sizeof a);
    int same = 0;
    for (int i = 0; i < 300; i++)
        same += a[i] == c[i];
    cr_assert_lt(same, 200, "seeds 42 and 43 agree on %d of 300 draws", same);
}

Test(sampler_determinism, reset_restarts_the_random_stream_and_history)
{
    sampler_params_t p = sampler_params_default();
    p.seed = 7;
    p.repeat_penalty = 1.5f;
    sampler_t *s = mk(p, 8);
    int32_t first[100], again[100];
    for (int i = 0; i < 100; i++) {
        first[i] = sample1(s, L8, 8);
        cr_assert_eq(sampler_accept(s, first[i]), ECS_OK);
    }
    sampler_reset(s);
    for (int i = 0; i < 100; i++) {
        again[i] = sample1(s, L8, 8);
        cr_assert_eq(sampler_accept(s, again[i]), ECS_OK);
    }
    cr_assert_arr_eq(first, again, sizeof first);
    sampler_free(s);
}

/* ---------------- distributions ---------------- */

Test(sampler_dist, temperature_1_matches_softmax)
{
    double e[8];
    softmax_ref(L8, 8, 1.0, NULL, e);
    sampler_params_t p = sampler_params_default();
    for (uint64_t seed = 1; seed <= 3; seed++) {
        p.seed = seed;
        double chi2 = chi2_of(p, L8, 8, e, 20000);
        cr_assert_lt(chi2, chi2_crit(7), "seed %lu: chi2 %.2f", (unsigned long)seed, chi2);
    }
}

Test(sampler_dist, other_temperatures_match_scaled_softmax)
{
    const double temps[] = {0.5, 2.0};
    for (int t = 0; t < 2; t++) {
        double e[8];
        softmax_ref(L8, 8, temps[t], NULL, e);
        sampler_params_t p = sampler_params_default();
        p.temp = (float)temps[t];
        p.seed = 100 + (uint64_t)t;
        double chi2 = chi2_of(p, L8, 8, e, 20000);
        cr_assert_lt(chi2, chi2_crit(7), "temp %.1f: chi2 %.2f", temps[t], chi2);
    }
}

Test(sampler_dist, chi_square_has_power_to_see_a_wrong_temperature)
{
    /* Samples at temp 1.3 judged against the temp-1 softmax must fail. */
    double e[8];
    softmax_ref(L8, 8, 1.0, NULL, e);
    sampler_params_t p = sampler_params_default();
    p.temp = 1.3f;
    p.seed = 5;
    cr_assert_gt(chi2_of(p, L8, 8, e, 20000), 10 * chi2_crit(7));
}

Test(sampler_dist, top_k_keeps_the_k_best_renormalised)
{
    /* The 3 best of L8 are ids 2 (2.0), 5 (1.5), 0 (1.0). */
    const int keep[8] = {1, 0, 1, 0, 0, 1, 0, 0};
    double e[8];
    softmax_ref(L8, 8, 1.0, keep, e);
    sampler_params_t p = sampler_params_default();
    p.top_k = 3;
    p.seed = 9;
    double chi2 = chi2_of(p, L8, 8, e, 20000);
    cr_assert_lt(chi2, chi2_crit(2), "chi2 %.2f", chi2);
}

Test(sampler_dist, top_p_keeps_the_smallest_prefix_reaching_p, .init = init_p4)
{
    sampler_params_t p = sampler_params_default();
    p.seed = 21;
    const float tops[] = {0.75f, 0.9f};
    const int keeps[2][4] = {{1, 1, 0, 0}, {1, 1, 1, 0}};
    for (int t = 0; t < 2; t++) {
        double e[4];
        softmax_ref(P4, 4, 1.0, keeps[t], e);
        p.top_p = tops[t];
        double chi2 = chi2_of(p, P4, 4, e, 20000);
        cr_assert_lt(chi2, chi2_crit(t + 1), "top_p %.2f: chi2 %.2f", tops[t], chi2);
    }
}

Test(sampler_dist, top_p_is_computed_before_temperature, .init = init_p4)
{
    /* llama.cpp order: a high temperature flattens the survivors but does
     * not let top-p admit more of them. */
    const int keep[4] = {1, 1, 0, 0};
    double e[4];
    softmax_ref(P4, 4, 4.0, keep, e);
    sampler_params_t p = sampler_params_default();
    p.top_p = 0.75f;
    p.temp = 4.0f;
    p.seed = 22;
    double chi2 = chi2_of(p, P4, 4, e, 20000);
    cr_assert_lt(chi2, chi2_crit(1), "chi2 %.2f", chi2);
}

Test(sampler_dist, min_p_drops_tokens_below_a_fraction_of_the_best, .init = init_p4)
{
    /* min_p 0.2 of p_max 0.5 = 0.1: keeps 0.5, 0.3, 0.15, drops 0.05. */
    const int keep[4] = {1, 1, 1, 0};
    double e[4];
    softmax_ref(P4, 4, 1.0, keep, e);
    sampler_params_t p = sampler_params_default();
    p.min_p = 0.2f;
    p.seed = 23;
    double chi2 = chi2_of(p, P4, 4, e, 20000);
    cr_assert_lt(chi2, chi2_crit(2), "chi2 %.2f", chi2);
}

Test(sampler_dist, top_k_then_top_p_then_min_p_compose)
{
    /* top_k 4 keeps ids 2,5,0,1 of L8; top_p then needs the 3 best of those. */
    float l[8];
    memcpy(l, L8, sizeof l);
    double e[8];
    const int k4[8] = {1, 1, 1, 0, 0, 1, 0, 0};
    softmax_ref(l, 8, 1.0, k4, e);
    double cum = e[2] + e[5];
    cr_assert(cum < 0.8 && cum + e[0] > 0.8);
    const int keep[8] = {1, 0, 1, 0, 0, 1, 0, 0};
    softmax_ref(l, 8, 1.0, keep, e);
    sampler_params_t p = sampler_params_default();
    p.top_k = 4;
    p.top_p = 0.8f;
    p.min_p = 0.01f;
    p.seed = 24;
    double chi2 = chi2_of(p, l, 8, e, 20000);
    cr_assert_lt(chi2, chi2_crit(2), "chi2 %.2f", chi2);
}

/* Ranks candidates like the sampler (logit desc, id asc) for brute force. */
static const float *g_rank_logits;
static int rank_cmp(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float li = g_rank_logits[i], lj = g_rank_logits[j];
    if (li != lj)
        return li > lj ? -1 : 1;
    return i < j ? -1 : i > j;
}

Test(sampler_dist, top_p_on_a_large_flat_vocabulary_matches_brute_force)
{
    /* Flat logits force the selected prefix to grow far beyond its first
     * guess; every draw must fall inside the exact top-p set. */
    enum { N = 102400 };
    float *l = malloc(N * sizeof *l), *work = malloc(N * sizeof *work);
    int32_t *order = malloc(N * sizeof *order);
    char *in_set = calloc(N, 1);
    cr_assert(l && work && order && in_set);
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((x >> 40) % 1000) / 1000.0f; /* many exact ties too */
        order[i] = i;
    }
    g_rank_logits = l;
    qsort(order, N, sizeof *order, rank_cmp);
    double z = 0.0, cum = 0.0;
    for (int i = 0; i < N; i++)
        z += exp((double)l[i] - l[order[0]]);
    const float top_p = 0.6f;
    int m = 0;
    while (m < N) {
        cum += exp((double)l[order[m]] - l[order[0]]) / z;
        in_set[order[m++]] = 1;
        if (cum >= top_p)
            break;
    }
    cr_assert_gt(m, 1024, "the test needs a set larger than the first guesses (m=%d)", m);
    sampler_params_t p = sampler_params_default();
    p.top_p = top_p;
    p.seed = 77;
    sampler_t *s = mk(p, N);
    for (int d = 0; d < 200; d++) {
        memcpy(work, l, N * sizeof *l);
        int32_t tok;
        cr_assert_eq(sampler_sample(s, work, &tok), ECS_OK);
        cr_assert(in_set[tok], "draw %d: token %d is outside the top-p set", d, tok);
    }
    sampler_free(s);
    free(l); free(work); free(order); free(in_set);
}

/* ---------------- penalties ---------------- */

Test(sampler_penalties, llama_cpp_arithmetic_over_the_window)
{
    sampler_params_t p = sampler_params_default();
    p.penalty_last_n = 3;
    p.repeat_penalty = 2.0f;
    p.freq_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    sampler_t *s = mk(p, 8);
    const int32_t acc[] = {1, 2, 2, 5}; /* window keeps the last 3: 2, 2, 5 */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sampler_accept(s, acc[i]), ECS_OK);
    float l[8] = {1.0f, 3.0f, 3.0f, 0.0f, 0.0f, -1.0f, 0.0f, 0.0f};
    sampler_apply_penalties(s, l);
    cr_assert_float_eq(l[1], 3.0f, 1e-7, "token 1 left the window: unchanged");
    cr_assert_float_eq(l[2], 3.0f / 2.0f - 2 * 0.5f - 0.25f, 1e-6);
    cr_assert_float_eq(l[5], -1.0f * 2.0f - 1 * 0.5f - 0.25f, 1e-6);
    cr_assert_float_eq(l[0], 1.0f, 1e-7);
    /* a second application starts from the same counts (marks were undone) */
    float m[8] = {0.0f, 0.0f, 4.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    sampler_apply_penalties(s, m);
    cr_assert_float_eq(m[2], 4.0f / 2.0f - 1.0f - 0.25f, 1e-6);
    cr_assert_float_eq(m[5], 0.0f - 0.5f - 0.25f, 1e-6);
    sampler_free(s);
}

Test(sampler_penalties, window_zero_or_neutral_values_change_nothing)
{
    sampler_params_t p = sampler_params_default();
    p.penalty_last_n = 0;
    p.repeat_penalty = 3.0f;
    sampler_t *s = mk(p, 8);
    cr_assert_eq(sampler_accept(s, 2), ECS_OK);
    float l[8];
    memcpy(l, L8, sizeof l);
    sampler_apply_penalties(s, l);
    cr_assert_arr_eq(l, L8, sizeof l);
    sampler_free(s);
}

Test(sampler_penalties, repetition_changes_the_greedy_choice_and_reset_forgets)
{
    sampler_params_t p = sampler_params_default();
    p.temp = 0.0f;
    p.repeat_penalty = 1.5f; /* 2.0 / 1.5 = 1.33 < 1.5 (id 5) */
    sampler_t *s = mk(p, 8);
    cr_assert_eq(sample1(s, L8, 8), 2);
    cr_assert_eq(sampler_accept(s, 2), ECS_OK);
    cr_assert_eq(sample1(s, L8, 8), 5);
    sampler_reset(s);
    cr_assert_eq(sample1(s, L8, 8), 2);
    cr_assert_eq(sampler_accept(s, 8), ECS_ERR_RANGE);
    cr_assert_eq(sampler_accept(s, -1), ECS_ERR_RANGE);
    sampler_free(s);
}

/* ---------------- stop strings ---------------- */

static sampler_stops_t *mk_stops(const char *const *v, size_t n)
{
    sampler_stops_t *st = NULL;
    cr_assert_eq(sampler_stops_new(v, n, &st), ECS_OK, "%s", ecs_errmsg());
    return st;
}

/* Streams `text` in pieces ending at cuts[0..n_cuts) (then the rest), as a
 * server would, and returns what was emitted and how it finished. The text
 * grows only as far as generation ran. */
static sampler_finish_t stream(const sampler_stops_t *st, const char *text, const size_t *cuts,
                               size_t n_cuts, bool eog_at_end, char *out, size_t *stop_len_at)
{
    size_t total = strlen(text), emitted = 0, o = 0;
    for (size_t c = 0; c <= n_cuts; c++) {
        size_t len = c < n_cuts ? cuts[c] : total;
        bool last = c == n_cuts;
        sampler_stop_result_t r = sampler_stops_check(st, text, len, emitted, last && eog_at_end);
        cr_assert(r.emit_end >= emitted && r.emit_end <= len);
        memcpy(out + o, text + emitted, r.emit_end - emitted);
        o += r.emit_end - emitted;
        emitted = r.emit_end;
        if (r.finish != SAMPLER_GO) {
            out[o] = '\0';
            *stop_len_at = len;
            return r.finish;
        }
    }
    out[o] = '\0';
    *stop_len_at = total;
    return SAMPLER_GO;
}

Test(sampler_stop, every_two_piece_split_emits_exactly_the_text_before_the_stop)
{
    const char *stops[] = {"\n\nUser:", "###"};
    sampler_stops_t *st = mk_stops(stops, 2);
    const char *text = "Hello ## there\n\nUse it\n\nUser: more";
    const size_t stop_end = strlen("Hello ## there\n\nUse it\n\nUser:");
    char out[128];
    for (size_t cut = 0; cut <= strlen(text); cut++) {
        size_t at;
        sampler_finish_t f = stream(st, text, &cut, 1, false, out, &at);
        cr_assert_eq(f, SAMPLER_STOP_STRING, "cut %zu", cut);
        cr_assert_str_eq(out, "Hello ## there\n\nUse it", "cut %zu", cut);
        cr_assert_eq(at, cut >= stop_end ? cut : strlen(text), "stop seen as soon as complete");
    }
    sampler_stops_free(st);
}

Test(sampler_stop, byte_by_byte_streaming_holds_back_only_possible_prefixes)
{
    const char *stops[] = {"</s>", "\n\nUser:"};
    sampler_stops_t *st = mk_stops(stops, 2);
    const char *text = "a<b\n\nx</ s></s>tail";
    size_t cuts[64], n = strlen(text);
    for (size_t i = 0; i < n; i++)
        cuts[i] = i + 1;
    char out[64];
    size_t at;
    cr_assert_eq(stream(st, text, cuts, n, false, out, &at), SAMPLER_STOP_STRING);
    cr_assert_str_eq(out, "a<b\n\nx</ s>");
    cr_assert_eq(at, strlen("a<b\n\nx</ s></s>"));
    sampler_stops_free(st);
}

Test(sampler_stop, hold_counts)
{
    const char *stops[] = {"\n\nUser:", "###"};
    sampler_stops_t *st = mk_stops(stops, 2);
    struct { const char *t; size_t hold; } cases[] = {
        {"Hello\n\nUs", 4}, {"Hello\n", 1}, {"abc#", 1}, {"abc##", 2},
        {"Hello\n\nX", 0}, {"", 0}, {"\n\nUser", 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = strlen(cases[i].t);
        sampler_stop_result_t r = sampler_stops_check(st, cases[i].t, len, 0, false);
        cr_assert_eq(r.finish, SAMPLER_GO);
        cr_assert_eq(r.hold, cases[i].hold, "'%s': hold %zu", cases[i].t, r.hold);
        cr_assert_eq(r.emit_end, len - cases[i].hold);
        cr_assert_eq(r.stop_index, -1);
    }
    sampler_stops_free(st);
}

Test(sampler_stop, earliest_stop_wins_and_eog_flushes)
{
    const char *stops[] = {"ab", "b", "zz"};
    sampler_stops_t *st = mk_stops(stops, 3);
    sampler_stop_result_t r = sampler_stops_check(st, "xab", 3, 0, false);
    cr_assert_eq(r.finish, SAMPLER_STOP_STRING);
    cr_assert_eq(r.stop_index, 0);
    cr_assert_eq(r.emit_end, 1);
    /* a stop string in the text beats the end-of-generation token */
    r = sampler_stops_check(st, "xxb", 3, 0, true);
    cr_assert_eq(r.finish, SAMPLER_STOP_STRING);
    cr_assert_eq(r.stop_index, 1);
    /* EOG releases the held-back "z" */
    r = sampler_stops_check(st, "xxz", 3, 0, true);
    cr_assert_eq(r.finish, SAMPLER_STOP_EOG);
    cr_assert_eq(r.emit_end, 3);
    r = sampler_stops_check(st, "xxz", 3, 0, false);
    cr_assert_eq(r.finish, SAMPLER_GO);
    cr_assert_eq(r.emit_end, 2);
    sampler_stops_free(st);
}

Test(sampler_stop, no_stop_strings_only_eog_ends)
{
    sampler_stops_t *st = mk_stops(NULL, 0);
    sampler_stop_result_t r = sampler_stops_check(st, "anything", 8, 3, false);
    cr_assert_eq(r.finish, SAMPLER_GO);
    cr_assert_eq(r.emit_end, 8);
    r = sampler_stops_check(st, "anything", 8, 8, true);
    cr_assert_eq(r.finish, SAMPLER_STOP_EOG);
    sampler_stops_free(st);
}

Test(sampler_stop, bad_stop_lists_are_rejected)
{
    sampler_stops_t *st = NULL;
    const char *empty[] = {"ok", ""};
    cr_assert_eq(sampler_stops_new(empty, 2, &st), ECS_ERR_INVAL);
    const char *null_entry[] = {NULL};
    cr_assert_eq(sampler_stops_new(null_entry, 1, &st), ECS_ERR_INVAL);
    char long_stop[SAMPLER_MAX_STOP_LEN + 2];
    memset(long_stop, 'a', sizeof long_stop - 1);
    long_stop[sizeof long_stop - 1] = '\0';
    const char *too_long[] = {long_stop};
    cr_assert_eq(sampler_stops_new(too_long, 1, &st), ECS_ERR_INVAL);
    const char *many[SAMPLER_MAX_STOPS + 1];
    for (int i = 0; i <= SAMPLER_MAX_STOPS; i++)
        many[i] = "x";
    cr_assert_eq(sampler_stops_new(many, SAMPLER_MAX_STOPS + 1, &st), ECS_ERR_INVAL);
    cr_assert_null(st);
    cr_assert_eq(sampler_stops_new(many, SAMPLER_MAX_STOPS, &st), ECS_OK);
    sampler_stops_free(st);
}
