/* stop.c - stop strings on streamed text: find a completed stop string, and
 * hold back a tail that could still grow into one, so a client never sees
 * part of a stop string. Tokens split text at arbitrary byte positions, so
 * the check works on the whole generated text, not on token pieces. */
#include "coordinator/sampler/sampler.h"

#include <stdlib.h>
#include <string.h>

struct sampler_stops {
    size_t n;
    size_t len[SAMPLER_MAX_STOPS];
    char str[SAMPLER_MAX_STOPS][SAMPLER_MAX_STOP_LEN];
};

ecs_err_t sampler_stops_new(const char *const *stops, size_t n, sampler_stops_t **out)
{
    if (!out)
        return ecs_error(ECS_ERR_INVAL, "stop strings: out is NULL");
    *out = NULL;
    if (n > SAMPLER_MAX_STOPS)
        return ecs_error(ECS_ERR_INVAL, "stop strings: %zu given, at most %d allowed", n,
                         SAMPLER_MAX_STOPS);
    if (n > 0 && !stops)
        return ecs_error(ECS_ERR_INVAL, "stop strings: list is NULL");
    for (size_t i = 0; i < n; i++) {
        size_t l = stops[i] ? strnlen(stops[i], SAMPLER_MAX_STOP_LEN + 1) : 0;
        if (l == 0)
            return ecs_error(ECS_ERR_INVAL, "stop strings: string %zu is empty", i);
        if (l > SAMPLER_MAX_STOP_LEN)
            return ecs_error(ECS_ERR_INVAL, "stop strings: string %zu is longer than %d bytes",
                             i, SAMPLER_MAX_STOP_LEN);
    }
    sampler_stops_t *st = calloc(1, sizeof *st);
    if (!st)
        return ecs_error(ECS_ERR_NOMEM, "stop strings: out of memory");
    st->n = n;
    for (size_t i = 0; i < n; i++) {
        st->len[i] = strlen(stops[i]);
        memcpy(st->str[i], stops[i], st->len[i]);
    }
    *out = st;
    return ECS_OK;
}

void sampler_stops_free(sampler_stops_t *st) { free(st); }

/* Longest proper prefix of stop that is a suffix of text[0, len), looking no
 * further back than max bytes. */
static size_t partial_suffix(const char *stop, size_t stop_len, const char *text, size_t len,
                             size_t max)
{
    size_t k = stop_len - 1;
    if (k > max)
        k = max;
    for (; k > 0; k--)
        if (memcmp(text + len - k, stop, k) == 0)
            return k;
    return 0;
}

sampler_stop_result_t sampler_stops_check(const sampler_stops_t *st, const char *text,
                                          size_t len, size_t from, bool is_eog)
{
    sampler_stop_result_t r = {.finish = SAMPLER_GO, .emit_end = len, .hold = 0, .stop_index = -1};
    if (from > len)
        from = len;
    size_t n = st ? st->n : 0;
    size_t best = len;
    for (size_t i = 0; i < n; i++) {
        const char *hit = memmem(text + from, len - from, st->str[i], st->len[i]);
        if (hit && (size_t)(hit - text) < best) {
            best = (size_t)(hit - text);
            r.stop_index = (int)i;
        }
    }
    if (r.stop_index >= 0) {
        r.finish = SAMPLER_STOP_STRING;
        r.emit_end = best;
        return r;
    }
    if (is_eog) {
        r.finish = SAMPLER_STOP_EOG;
        return r;
    }
    for (size_t i = 0; i < n; i++) {
        size_t h = partial_suffix(st->str[i], st->len[i], text, len, len - from);
        r.hold = h > r.hold ? h : r.hold;
    }
    r.emit_end = len - r.hold;
    return r;
}
