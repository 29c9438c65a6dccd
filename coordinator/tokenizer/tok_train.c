/* tok_train.c - learns a byte-level BPE vocabulary from a text, for models
 * made without a real vocabulary GGUF, and writes it as tokenizer.* keys.
 *
 * Classic BPE training over the distinct pre-tokenized words weighted by
 * their counts: repeatedly merge the most frequent adjacent pair. Pair counts
 * are updated only around each merge site, each pair keeps the list of words
 * it occurs in, and a max-heap with lazy deletion finds the next pair, so a
 * merge costs the size of the words it touches rather than of the corpus. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

#define TRAIN_MAX_MERGES (1 << 20)
#define BOS_TEXT "<｜begin▁of▁sentence｜>"
#define EOS_TEXT "<｜end▁of▁sentence｜>"

typedef struct {
    int64_t count;
    uint64_t key;   /* left id << 32 | right id */
    int32_t *words; /* words the pair occurs in (may hold stale entries) */
    uint32_t n_words, cap_words;
    int32_t merged; /* token the pair was merged into, -1 before */
    bool dirty;
} pair_t;

typedef struct {
    int64_t count;
    uint64_t key;
    uint32_t pair;
} heap_ent_t;

typedef struct {
    /* words */
    tok_strmap_t word_map;
    int64_t *wcount;
    uint32_t *woff, *wlen;
    int32_t *wstamp; /* last merge that visited the word */
    size_t n_words, cap_words;
    int32_t *syms;
    size_t n_syms;
    /* vocabulary */
    tok_strmap_t tok_map;
    tok_arena_t arena;
    const char **tok_text;
    size_t n_tok, cap_tok;
    char **merges;
    size_t n_merges, cap_merges;
    /* pairs */
    tok_u64map_t pair_map;
    pair_t *pairs;
    size_t n_pairs, cap_pairs;
    heap_ent_t *heap;
    size_t n_heap, cap_heap;
    uint32_t *dirty;
    size_t n_dirty, cap_dirty;
} trainer_t;

static ecs_err_t nomem(void) { return ecs_error(ECS_ERR_NOMEM, "tok_train: out of memory"); }

/* Grows *arr (of elem-byte items) to hold at least need items. */
static ecs_err_t grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return ECS_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    if (c > SIZE_MAX / elem)
        return nomem();
    void *p = realloc(*arr, c * elem);
    if (!p)
        return nomem();
    *arr = p;
    *cap = c;
    return ECS_OK;
}

static void trainer_free(trainer_t *tr)
{
    tok_strmap_free(&tr->word_map);
    tok_strmap_free(&tr->tok_map);
    tok_u64map_free(&tr->pair_map);
    tok_arena_free(&tr->arena);
    for (size_t i = 0; i < tr->n_pairs; i++)
        free(tr->pairs[i].words);
    free(tr->pairs);
    free(tr->wcount);
    free(tr->woff);
    free(tr->wlen);
    free(tr->wstamp);
    free(tr->syms);
    free(tr->tok_text);
    free(tr->merges);
    free(tr->heap);
    free(tr->dirty);
}

/* ---- words ---- */

/* Room for one more word in the four per-word arrays. */
static ecs_err_t reserve_word(trainer_t *tr)
{
    if (tr->n_words < tr->cap_words)
        return ECS_OK;
    size_t cap = tr->cap_words ? tr->cap_words * 2 : 1024;
    int64_t *c = realloc(tr->wcount, cap * sizeof *c);
    if (c)
        tr->wcount = c;
    uint32_t *o = c ? realloc(tr->woff, cap * sizeof *o) : NULL;
    if (o)
        tr->woff = o;
    uint32_t *l = o ? realloc(tr->wlen, cap * sizeof *l) : NULL;
    if (l)
        tr->wlen = l;
    int32_t *s = l ? realloc(tr->wstamp, cap * sizeof *s) : NULL;
    if (!s)
        return nomem();
    tr->wstamp = s;
    tr->cap_words = cap;
    return ECS_OK;
}

static ecs_err_t count_word(void *ud, const char *w, size_t n)
{
    trainer_t *tr = ud;
    int32_t idx = tok_strmap_get(&tr->word_map, w, n);
    if (idx >= 0) {
        tr->wcount[idx]++;
        return ECS_OK;
    }
    ecs_err_t err = reserve_word(tr);
    if (err)
        return err;
    size_t k = tr->n_words;
    tr->wcount[k] = 1;
    tr->woff[k] = (uint32_t)tr->n_syms; /* spelled out in learn() */
    tr->wlen[k] = (uint32_t)n;
    tr->wstamp[k] = -1;
    tr->n_syms += n;
    tr->n_words++;
    return tok_strmap_put(&tr->word_map, w, n, (int32_t)k, NULL);
}

/* ---- vocabulary ---- */

static ecs_err_t add_token(trainer_t *tr, const char *text, size_t n, int32_t *id)
{
    int32_t old = tok_strmap_get(&tr->tok_map, text, n);
    if (old >= 0) {
        *id = old;
        return ECS_OK;
    }
    ecs_err_t err = grow((void **)&tr->tok_text, &tr->cap_tok, tr->n_tok + 1, sizeof *tr->tok_text);
    if (err)
        return err;
    char *p = tok_arena_put(&tr->arena, text, n);
    if (!p)
        return nomem();
    *id = (int32_t)tr->n_tok;
    tr->tok_text[tr->n_tok++] = p;
    return tok_strmap_put(&tr->tok_map, p, n, *id, NULL);
}

/* The 256 byte tokens in GPT-2 order: printable bytes first, then the rest. */
static ecs_err_t add_byte_tokens(trainer_t *tr, int32_t byte_id[256])
{
    for (int pass = 0; pass < 2; pass++) {
        for (int b = 0; b < 256; b++) {
            uint32_t cp = tok_byte_to_cp((uint8_t)b);
            if ((cp < 256) != (pass == 0))
                continue;
            char u[4];
            ecs_err_t err = add_token(tr, u, tok_u8_put(cp, u), &byte_id[b]);
            if (err)
                return err;
        }
    }
    return ECS_OK;
}

/* ---- pairs ---- */

/* Most frequent pair first; ties go to the smaller key, so training is
 * deterministic. */
static bool heap_before(const heap_ent_t *x, const heap_ent_t *y)
{
    return x->count > y->count || (x->count == y->count && x->key < y->key);
}

static ecs_err_t heap_push(trainer_t *tr, uint32_t p)
{
    ecs_err_t err = grow((void **)&tr->heap, &tr->cap_heap, tr->n_heap + 1, sizeof *tr->heap);
    if (err)
        return err;
    heap_ent_t e = { tr->pairs[p].count, tr->pairs[p].key, p };
    size_t i = tr->n_heap++;
    while (i > 0) {
        size_t q = (i - 1) / 2;
        if (!heap_before(&e, &tr->heap[q]))
            break;
        tr->heap[i] = tr->heap[q];
        i = q;
    }
    tr->heap[i] = e;
    return ECS_OK;
}

static heap_ent_t heap_pop(trainer_t *tr)
{
    heap_ent_t top = tr->heap[0], last = tr->heap[--tr->n_heap];
    size_t i = 0, n = tr->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_before(&tr->heap[c + 1], &tr->heap[c]))
            c++;
        if (!heap_before(&tr->heap[c], &last))
            break;
        tr->heap[i] = tr->heap[c];
        i = c;
    }
    if (n)
        tr->heap[i] = last;
    return top;
}

static ecs_err_t pair_at(trainer_t *tr, int32_t a, int32_t b, uint32_t *idx)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b, *v;
    bool added;
    ecs_err_t err = tok_u64map_upsert(&tr->pair_map, key, tr->n_pairs, &v, &added);
    if (err)
        return err;
    if (added) {
        if ((err = grow((void **)&tr->pairs, &tr->cap_pairs, tr->n_pairs + 1, sizeof *tr->pairs)))
            return err;
        tr->pairs[tr->n_pairs++] = (pair_t){ .key = key, .merged = -1 };
    }
    *idx = (uint32_t)*v;
    return ECS_OK;
}

/* Adds delta occurrences of (a, b) found in word w. */
static ecs_err_t pair_add(trainer_t *tr, int32_t a, int32_t b, int64_t delta, int32_t w)
{
    uint32_t p;
    ecs_err_t err = pair_at(tr, a, b, &p);
    if (err)
        return err;
    pair_t *pr = &tr->pairs[p];
    pr->count += delta;
    if (delta > 0 && (pr->n_words == 0 || pr->words[pr->n_words - 1] != w)) {
        size_t cap = pr->cap_words;
        if ((err = grow((void **)&pr->words, &cap, (size_t)pr->n_words + 1, sizeof *pr->words)))
            return err;
        pr->cap_words = (uint32_t)cap;
        pr->words[pr->n_words++] = w;
    }
    if (!pr->dirty) {
        if ((err = grow((void **)&tr->dirty, &tr->cap_dirty, tr->n_dirty + 1, sizeof *tr->dirty)))
            return err;
        pr->dirty = true;
        tr->dirty[tr->n_dirty++] = p;
    }
    return ECS_OK;
}

/* Queues the new counts of every pair changed since the last call. */
static ecs_err_t flush_dirty(trainer_t *tr)
{
    for (size_t i = 0; i < tr->n_dirty; i++) {
        uint32_t p = tr->dirty[i];
        tr->pairs[p].dirty = false;
        ecs_err_t err = tr->pairs[p].count > 0 ? heap_push(tr, p) : ECS_OK;
        if (err)
            return err;
    }
    tr->n_dirty = 0;
    return ECS_OK;
}

/* Rewrites every (a, b) in word w as c, updating the counts of the pairs
 * around each site (the previous symbol is read from the rewritten part, so
 * runs like "a b a b" come out right). */
static ecs_err_t merge_word(trainer_t *tr, int32_t w, int32_t a, int32_t b, int32_t c)
{
    int32_t *s = tr->syms + tr->woff[w];
    uint32_t n = tr->wlen[w], o = 0;
    int64_t k = tr->wcount[w];
    ecs_err_t err = ECS_OK;
    for (uint32_t i = 0; i < n && !err;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            if (o > 0 && ((err = pair_add(tr, s[o - 1], a, -k, w)) || (err = pair_add(tr, s[o - 1], c, k, w))))
                break;
            if ((err = pair_add(tr, a, b, -k, w)))
                break;
            if (i + 2 < n && ((err = pair_add(tr, b, s[i + 2], -k, w)) || (err = pair_add(tr, c, s[i + 2], k, w))))
                break;
            s[o++] = c;
            i += 2;
        } else {
            s[o++] = s[i++];
        }
    }
    tr->wlen[w] = o;
    return err;
}

/* Records merge "A B" and its token AB (an existing id if the string was
 * already made by another pair). */
static ecs_err_t add_merge(trainer_t *tr, int32_t a, int32_t b, int32_t *c)
{
    const char *ta = tr->tok_text[a], *tb = tr->tok_text[b];
    size_t la = strlen(ta), lb = strlen(tb);
    ecs_err_t err = grow((void **)&tr->merges, &tr->cap_merges, tr->n_merges + 1, sizeof *tr->merges);
    if (err)
        return err;
    char *buf = malloc(la + lb + 1);
    if (!buf)
        return nomem();
    memcpy(buf, ta, la);
    buf[la] = ' ';
    memcpy(buf + la + 1, tb, lb);
    char *m = tok_arena_put(&tr->arena, buf, la + 1 + lb);
    memmove(buf + la, buf + la + 1, lb); /* now "AB" */
    err = m ? add_token(tr, buf, la + lb, c) : nomem();
    free(buf);
    if (!err)
        tr->merges[tr->n_merges++] = m;
    return err;
}

static ecs_err_t apply_merge(trainer_t *tr, uint32_t p, int32_t stamp)
{
    uint64_t key = tr->pairs[p].key;
    int32_t a = (int32_t)(key >> 32), b = (int32_t)(uint32_t)key, c = tr->pairs[p].merged;
    ecs_err_t err;
    /* a pair can come back when another merge re-creates one of its tokens
     * (two pairs spelling the same string); its rule already exists then */
    if (c < 0) {
        if ((err = add_merge(tr, a, b, &c)))
            return err;
        tr->pairs[p].merged = c;
    }
    /* merge_word adds pairs (tr->pairs may move) but never to this pair's
     * list: index on every step, keep no pointer */
    for (uint32_t i = 0; i < tr->pairs[p].n_words; i++) {
        int32_t w = tr->pairs[p].words[i];
        if (tr->wstamp[w] == stamp)
            continue;
        tr->wstamp[w] = stamp;
        if ((err = merge_word(tr, w, a, b, c)))
            return err;
    }
    tr->pairs[p].n_words = 0;
    return flush_dirty(tr);
}

static ecs_err_t learn(trainer_t *tr, int n_target)
{
    int32_t byte_id[256];
    ecs_err_t err = add_byte_tokens(tr, byte_id);
    if (err)
        return err;
    if (!(tr->syms = malloc((tr->n_syms ? tr->n_syms : 1) * sizeof *tr->syms)))
        return nomem();
    /* word keys point into the text: spell each word in byte-token ids */
    for (size_t e = 0; e < tr->word_map.n; e++) {
        const tok_strent_t *en = &tr->word_map.ents[e];
        int32_t w = en->val;
        for (uint32_t i = 0; i < en->len; i++)
            tr->syms[tr->woff[w] + i] = byte_id[(uint8_t)en->key[i]];
    }
    for (size_t w = 0; w < tr->n_words; w++) {
        const int32_t *s = tr->syms + tr->woff[w];
        for (uint32_t i = 0; i + 1 < tr->wlen[w]; i++)
            if ((err = pair_add(tr, s[i], s[i + 1], tr->wcount[w], (int32_t)w)))
                return err;
    }
    if ((err = flush_dirty(tr)))
        return err;
    while ((int)tr->n_merges < n_target && tr->n_heap) {
        heap_ent_t top = heap_pop(tr);
        if (top.count != tr->pairs[top.pair].count)
            continue; /* stale entry */
        if (top.count < 2)
            break; /* merging a pair seen once saves nothing */
        if ((err = apply_merge(tr, top.pair, (int32_t)tr->n_merges)))
            return err;
    }
    return ECS_OK;
}

static ecs_err_t write_keys(trainer_t *tr, gguf_writer_t *w, uint32_t *n_vocab)
{
    int32_t bos = -1, eos = -1;
    ecs_err_t err;
    if ((err = add_token(tr, BOS_TEXT, strlen(BOS_TEXT), &bos)) ||
        (err = add_token(tr, EOS_TEXT, strlen(EOS_TEXT), &eos)))
        return err;
    int32_t *types = malloc(tr->n_tok * sizeof *types);
    if (!types)
        return nomem();
    for (size_t i = 0; i < tr->n_tok; i++)
        types[i] = (int32_t)i == bos || (int32_t)i == eos ? TOK_TYPE_CONTROL : TOK_TYPE_NORMAL;
    if (!(err = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) &&
        !(err = gguf_writer_set_str(w, "tokenizer.ggml.pre", "deepseek-llm")) &&
        !(err = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tr->tok_text, tr->n_tok)) &&
        !(err = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, tr->n_tok)) &&
        !(err = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)tr->merges,
                                        tr->n_merges)) &&
        !(err = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos)) &&
        !(err = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos)) &&
        !(err = gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)eos)) &&
        !(err = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true)) &&
        !(err = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false)))
        err = gguf_writer_set_str(w, "tokenizer.chat_template", tok_deepseek2_template);
    free(types);
    if (!err && n_vocab)
        *n_vocab = (uint32_t)tr->n_tok;
    return err;
}

ecs_err_t tok_train_to_gguf(const char *text, size_t len, int n_merges_target, gguf_writer_t *w,
                            uint32_t *n_vocab)
{
    if ((!text && len) || !w)
        return ecs_error(ECS_ERR_INVAL, "tok_train: NULL text or writer");
    if (n_merges_target < 0 || n_merges_target > TRAIN_MAX_MERGES)
        return ecs_error(ECS_ERR_RANGE, "tok_train: %d merges requested (0..%d)", n_merges_target,
                         TRAIN_MAX_MERGES);
    if (len > TOK_MAX_TEXT)
        return ecs_error(ECS_ERR_RANGE, "tok_train: text of %zu bytes is too long", len);
    trainer_t tr;
    memset(&tr, 0, sizeof tr);
    const char *s = text ? text : "";
    size_t n = len;
    char *owned = NULL;
    tok_pretok_t *pre = NULL;
    ecs_err_t err;
    if (!(err = tok_u8_sanitize(s, len, &s, &n, &owned)) && !(err = tok_pretok_new("deepseek-llm", 12, &pre)) &&
        !(err = tok_strmap_init(&tr.word_map, 1024)) && !(err = tok_strmap_init(&tr.tok_map, 1024)) &&
        !(err = tok_u64map_init(&tr.pair_map, 4096)) && !(err = tok_pretok_split(pre, s, n, count_word, &tr)) &&
        !(err = learn(&tr, n_merges_target)))
        err = write_keys(&tr, w, n_vocab);
    tok_pretok_free(pre);
    trainer_free(&tr);
    free(owned);
    return err;
}
