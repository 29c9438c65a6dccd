/* prompt.c - requests to token ids.
 *
 * A chat is rendered with the model's template, but with each message's
 * content replaced by a sentinel; the control tokens found in that rendering
 * are the template's own. The real text is then the template's plain text
 * with the contents put back, cut only at those control tokens and encoded
 * without parsing special tokens, so "<|im_end|>" typed in a message stays
 * text. The tools list this server adds to the system turn is template
 * text too (api_req_t.sys_own): DeepSeek-V3's example call there is
 * control tokens, as in llama-server's rendering. Where a message holds no
 * control-token text, the ids equal llama-server's (template rendered,
 * then encoded with parse_special). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_int.h"

static int cmp_len_desc(const void *a, const void *b)
{
    const api_special_t *x = a, *y = b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

ecs_err_t api_specials_init(const tok_t *tok, api_specials_t *sp)
{
    int n = 0, V = tok_n_vocab(tok);
    for (int id = 0; id < V; id++) {
        int ty = tok_token_type(tok, id);
        n += ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN;
    }
    sp->v = calloc((size_t)n + 1, sizeof *sp->v);
    if (!sp->v)
        return ecs_error(ECS_ERR_NOMEM, "out of memory");
    sp->n = 0;
    for (int id = 0; id < V; id++) {
        int ty = tok_token_type(tok, id);
        size_t len = 0;
        const char *t = tok_token_piece(tok, id, &len);
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN) && t && len)
            sp->v[sp->n++] = (api_special_t){id, t, len};
    }
    qsort(sp->v, (size_t)sp->n, sizeof *sp->v, cmp_len_desc);
    return ECS_OK;
}

void api_specials_free(api_specials_t *sp)
{
    free(sp->v);
    sp->v = NULL;
}

typedef struct {
    const tok_t *tok;
    int32_t *ids;
    size_t n, cap;   /* n may pass cap: the count needed */
    char *plain;
    size_t plain_len;
} build_t;

static ecs_err_t flush_plain(build_t *b)
{
    if (!b->plain_len)
        return ECS_OK;
    size_t got = 0, room = b->n < b->cap ? b->cap - b->n : 0;
    ecs_err_t e = tok_encode(b->tok, b->plain, b->plain_len, false, false, b->ids + (b->n < b->cap ? b->n : 0),
                             room, &got);
    if (e != ECS_OK && e != ECS_ERR_RANGE)
        return e;
    b->n += got;
    b->plain_len = 0;
    return ECS_OK;
}

static void push_id(build_t *b, int32_t id)
{
    if (b->n < b->cap)
        b->ids[b->n] = id;
    b->n++;
}

static ecs_err_t finish_ids(build_t *b, int n_ctx, int32_t **out, int *n_out)
{
    if (tok_add_eos(b->tok) && tok_eos(b->tok) >= 0)
        push_id(b, tok_eos(b->tok));
    if (b->n >= (size_t)n_ctx) {
        free(b->ids);
        return ecs_error(ECS_ERR_RANGE,
                         "the prompt is %zu tokens; this server's context holds %d (prompt and at "
                         "least one generated token)",
                         b->n, n_ctx);
    }
    if (b->n == 0) {
        free(b->ids);
        return ecs_error(ECS_ERR_INVAL, "the prompt is empty");
    }
    *out = b->ids;
    *n_out = (int)b->n;
    return ECS_OK;
}

ecs_err_t api_prompt_text(const tok_t *tok, const char *text, int n_ctx, int32_t **out, int *n_out)
{
    build_t b = {.tok = tok, .cap = (size_t)n_ctx + 1};
    if (!(b.ids = malloc(b.cap * sizeof *b.ids)))
        return ecs_error(ECS_ERR_NOMEM, "out of memory");
    size_t got = 0;
    ecs_err_t e = tok_encode(tok, text, strlen(text), true, true, b.ids, b.cap, &got);
    if (e != ECS_OK && e != ECS_ERR_RANGE) {
        free(b.ids);
        return e;
    }
    b.n = got;
    return finish_ids(&b, n_ctx, out, n_out);
}

#define SENT_OPEN '\x01'
#define SENT_CLOSE '\x02'

static ecs_err_t put_template(build_t *b, const api_specials_t *sp, const char *tmpl, size_t len,
                              const tok_chat_msg_t *msgs, size_t sys_own);

/* Message k's content: plain, but for the server's own text at the end
 * of the system turn, which is template text. */
static ecs_err_t put_content(build_t *b, const api_specials_t *sp, const tok_chat_msg_t *msgs,
                             int k, size_t sys_own)
{
    const char *c = msgs[k].content;
    size_t cl = strlen(c), own = k == 0 && sys_own <= cl ? sys_own : 0;
    memcpy(b->plain + b->plain_len, c, cl - own);
    b->plain_len += cl - own;
    return own ? put_template(b, sp, c + cl - own, own, NULL, 0) : ECS_OK;
}

/* Template text into b: its control-token text as those tokens, the rest
 * plain, and each message's sentinel (msgs: NULL for none) as the
 * message's content (put_content). */
static ecs_err_t put_template(build_t *b, const api_specials_t *sp, const char *tmpl, size_t len,
                              const tok_chat_msg_t *msgs, size_t sys_own)
{
    ecs_err_t e;
    for (size_t i = 0; i < len;) {
        if (msgs && tmpl[i] == SENT_OPEN) { /* a message's content goes back in */
            if ((e = put_content(b, sp, msgs, atoi(tmpl + i + 1), sys_own)) != ECS_OK)
                return e;
            i = (size_t)(strchr(tmpl + i, SENT_CLOSE) - tmpl) + 1;
            continue;
        }
        int hit = -1;
        for (int s = 0; s < sp->n && hit < 0; s++)
            if (sp->v[s].len <= len - i && memcmp(tmpl + i, sp->v[s].text, sp->v[s].len) == 0)
                hit = s;
        if (hit < 0) {
            b->plain[b->plain_len++] = tmpl[i++];
            continue;
        }
        if ((e = flush_plain(b)) != ECS_OK)
            return e;
        push_id(b, sp->v[hit].id);
        i += sp->v[hit].len;
    }
    return ECS_OK;
}

ecs_err_t api_prompt_chat(const tok_t *tok, const api_specials_t *sp, const tok_chat_msg_t *msgs,
                          int n, size_t sys_own, const char *prefill, int n_ctx, int32_t **out,
                          int *n_out)
{
    ecs_err_t e = ECS_ERR_NOMEM;
    tok_chat_msg_t *sm = calloc((size_t)n + 1, sizeof *sm);
    char (*sent)[16] = calloc((size_t)n + 1, sizeof *sent);
    char *tmpl = NULL;
    build_t b = {.tok = tok, .cap = (size_t)n_ctx + 1};
    size_t total = prefill ? strlen(prefill) : 0, len = 0;
    if (!sm || !sent)
        goto fail;
    for (int i = 0; i < n; i++) {
        snprintf(sent[i], sizeof sent[i], "%c%d%c", SENT_OPEN, i, SENT_CLOSE);
        sm[i] = (tok_chat_msg_t){msgs[i].role, sent[i]};
        total += strlen(msgs[i].content);
    }
    e = tok_chat_format(tok, TOK_CHAT_CHATML, sm, n, true, NULL, 0, &len);
    if (e != ECS_OK && e != ECS_ERR_RANGE)
        goto fail;
    e = ECS_ERR_NOMEM;
    if (!(tmpl = malloc(len + 1)) || !(b.plain = malloc(len + total + 1)) ||
        !(b.ids = malloc(b.cap * sizeof *b.ids)))
        goto fail;
    if ((e = tok_chat_format(tok, TOK_CHAT_CHATML, sm, n, true, tmpl, len + 1, &len)) != ECS_OK)
        goto fail;
    if (tok_add_bos(tok) && tok_bos(tok) >= 0)
        push_id(&b, tok_bos(tok));
    if (n == 0 || strcmp(msgs[0].role, "system"))
        sys_own = 0;
    if ((e = put_template(&b, sp, tmpl, len, msgs, sys_own)) != ECS_OK)
        goto fail;
    if (prefill && (e = put_template(&b, sp, prefill, strlen(prefill), NULL, 0)) != ECS_OK)
        goto fail; /* the answer's start: ours, so its control-token text is control tokens */
    if ((e = flush_plain(&b)) != ECS_OK)
        goto fail;
    free(sm);
    free(sent);
    free(tmpl);
    free(b.plain);
    return finish_ids(&b, n_ctx, out, n_out);
fail:
    if (e == ECS_ERR_NOMEM)
        ecs_error(e, "out of memory");
    free(sm);
    free(sent);
    free(tmpl);
    free(b.plain);
    free(b.ids);
    return e;
}

/* Tools live in Qwen's ChatML form or DeepSeek-V3's (tools.c). */
ecs_err_t api_tools_template(tok_chat_kind_t k)
{
    if (k == TOK_CHAT_CHATML || k == TOK_CHAT_NONE || k == TOK_CHAT_DEEPSEEK3)
        return ECS_OK; /* NONE: the ChatML fallback */
    return ecs_error(ECS_ERR_UNSUPPORTED, "tools are not supported with this model: its chat "
                     "template (%s) has no place for tool calls (ChatML / Qwen and DeepSeek-V3 "
                     "templates have)", tok_chat_kind_name(k));
}

int api_tools_keep(const api_req_t *r, const tok_t *tok, int32_t keep[TOK_KEEP_MAX])
{
    int n = 0;
    if (!api_tools_render_special(r))
        return 0;
    for (int i = 0; i < API_V3_N_MARKUP && n < TOK_KEEP_MAX; i++) {
        int32_t id = tok_find(tok, api_v3_markup[i], strlen(api_v3_markup[i]));
        if (id >= 0)
            keep[n++] = id;
    }
    return n;
}

/* The budget is enforced by the scheduler, which needs the closing text as
 * this model's ids; here, not in reasoning.c, because that file stays free
 * of the tokenizer (the request fuzzer links it alone). */
ecs_err_t api_think_budget(const api_req_t *r, const tok_t *tok, bool open, int dflt,
                           sched_think_budget_t *t)
{
    static const char close[] = "\n" API_THINK_CLOSE "\n\n"; /* as Qwen3's template writes it */
    const int budget = r->think_budget == API_THINK_BUDGET_DEFAULT ? dflt : r->think_budget;
    *t = (sched_think_budget_t){.budget = -1};
    if (budget < 0)
        return ECS_OK;
    size_t n = 0;
    ecs_err_t e = tok_encode(tok, close, strlen(close), false, true, t->close_ids, SCHED_MAX_CLOSE,
                             &n);
    if (e != ECS_OK)
        return e;
    t->budget = budget;
    t->opened = open;
    t->open_tag = API_THINK_OPEN;
    t->close_tag = API_THINK_CLOSE;
    t->n_close = (int)n;
    return ECS_OK;
}
