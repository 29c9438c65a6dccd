/* json_mode.c - JSON mode and structured outputs at the scheduler: which
 * tokens a request's recogniser (sampler.h sampler_json_*) lets be drawn
 * next, and what a drawn token does to it. The vocabulary is classified
 * once at start-up (s->json_tok), so a step tries on the recogniser only
 * the tokens whose first byte it takes and that are not plain text inside
 * a free string. */
#include <math.h>

#include "sched_int.h"

/* s->json_tok from the vocabulary (sched_int.h). */
void sched_json_classify(sched_t *s)
{
    for (int32_t id = 0; id < s->n_vocab; id++) {
        size_t len = 0;
        const char *b = tok_token_piece(s->tok, id, &len);
        const int ty = tok_token_type(s->tok, id);
        uint8_t c = SCHED_JSON_PLAIN;
        if (!b || !len || (ty != TOK_TYPE_NORMAL && ty != TOK_TYPE_USER_DEFINED && ty != TOK_TYPE_BYTE))
            c = SCHED_JSON_NEVER;
        for (size_t i = 0; i < len && c == SCHED_JSON_PLAIN; i++)
            if (b[i] == '"' || b[i] == '\\' || (unsigned char)b[i] < 0x20)
                c = SCHED_JSON_TRY;
        s->json_tok[id] = c;
    }
}

/* JSON mode: the tokens whose bytes would leave the text no longer the
 * start of one JSON object are masked, and so are control tokens (the end
 * of the turn among them: the request ends when the object does). */
void sched_json_mask(const sched_t *s, const sched_req_t *r, float *l)
{
    /* most tokens are refused on their first byte: which bytes may come
     * next is 256 trials, the vocabulary's first bytes then a lookup */
    bool first_ok[256];
    for (int b = 0; b < 256; b++) {
        sampler_json_t t = r->json;
        const char c = (char)b;
        first_ok[b] = sampler_json_feed(&t, &c, 1);
    }
    const bool in_str = sampler_json_in_string(&r->json);
    for (int32_t id = 0; id < s->n_vocab; id++) {
        const uint8_t c = s->json_tok[id];
        size_t len = 0;
        const char *b = tok_token_piece(s->tok, id, &len);
        if (c == SCHED_JSON_NEVER || !first_ok[(unsigned char)b[0]]) {
            l[id] = -INFINITY;
            continue;
        }
        if (c == SCHED_JSON_PLAIN && in_str)
            continue;
        sampler_json_t t = r->json;
        if (!sampler_json_feed(&t, b, len))
            l[id] = -INFINITY;
    }
}

/* JSON mode: id's bytes taken; whether the object is complete. */
bool sched_json_take(const sched_t *s, sched_req_t *r, int32_t id)
{
    size_t len = 0;
    const char *b = tok_token_piece(s->tok, id, &len);
    return b && sampler_json_feed(&r->json, b, len) && sampler_json_done(&r->json);
}

