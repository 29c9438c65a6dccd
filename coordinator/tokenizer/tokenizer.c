/* tokenizer.c - the accessors, encoding (special-token partition, regex
 * pre-tokenization, rank-ordered merges) and the streaming UTF-8-safe
 * detokenizer. Loading the vocabulary from GGUF (and tok_free) is in
 * tok_load.c; struct tok, which both fill or read, is in tok_impl.h.
 *
 * Merges are kept as a hash map from the pair of symbol ids to (rank, merged
 * id). Strings that occur in merges but are not tokens get "virtual" ids
 * above n_vocab so that a chain of merges through them behaves as it does in
 * llama.cpp, which merges by string. Encoding a word uses a heap of candidate
 * pairs, O(n log n) in the word length. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"


/* ---- small accessors ---- */

int32_t tok_n_vocab(const tok_t *t) { return t->n_vocab; }
int32_t tok_bos(const tok_t *t) { return t->bos; }
int32_t tok_eos(const tok_t *t) { return t->eos; }
int32_t tok_eot(const tok_t *t) { return t->eot; }
int32_t tok_pad(const tok_t *t) { return t->pad; }
bool tok_add_bos(const tok_t *t) { return t->add_bos; }
bool tok_add_eos(const tok_t *t) { return t->add_eos; }
const char *tok_pre_name(const tok_t *t) { return tok_pretok_name(t->pre); }
tok_chat_kind_t tok_chat_kind(const tok_t *t) { return t->chat; }
bool tok_chat_thinks(const tok_t *t) { return t->chat == TOK_CHAT_CHATML && t->chat_thinks; }
bool tok_chat_think_open(const tok_t *t) { return tok_chat_thinks(t) && t->chat_think_open; }
void tok_set_chat_kind(tok_t *t, tok_chat_kind_t k) { t->chat = k; }
const char *tok_chat_first_line(const struct tok *t) { return t->chat_line; }

static bool valid_id(const tok_t *t, int32_t id) { return id >= 0 && id < t->n_vocab; }

bool tok_is_eog(const tok_t *t, int32_t id)
{
    return valid_id(t, id) && (t->flags[id] & TOK_FLAG_EOG);
}

const char *tok_token_text(const tok_t *t, int32_t id)
{
    return valid_id(t, id) ? t->text[id] : NULL;
}

int tok_token_type(const tok_t *t, int32_t id)
{
    return valid_id(t, id) ? t->type[id] : TOK_TYPE_UNDEFINED;
}

const char *tok_token_piece(const tok_t *t, int32_t id, size_t *len)
{
    if (!valid_id(t, id))
        return NULL;
    *len = t->piece_len[id];
    return t->piece[id];
}

int32_t tok_find(const tok_t *t, const char *text, size_t len)
{
    int32_t id = tok_strmap_get(&t->vocab, text, len);
    return id < t->n_vocab ? id : -1;
}

size_t tok_encode_bound(size_t len)
{
    /* an invalid byte becomes U+FFFD (3 bytes), each byte at most one token */
    return len > (SIZE_MAX - 2) / 3 ? SIZE_MAX : 3 * len + 2;
}

/* ---- encoding ---- */

typedef struct {
    int32_t start, len, id, prev, next;
} sym_t;

typedef struct {
    uint64_t key; /* rank << 32 | left index: smaller pops first */
    int32_t right, size, result;
} bigram_t;

typedef struct {
    const tok_t *t;
    int32_t *out;
    size_t cap, n;
    sym_t *sym;
    bigram_t *heap;
    size_t sym_cap, heap_n;
} enc_t;

static void emit(enc_t *e, int32_t id)
{
    if (e->n < e->cap)
        e->out[e->n] = id;
    e->n++;
}

static void heap_push(enc_t *e, bigram_t b)
{
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (e->heap[p].key <= b.key)
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = b;
}

static bigram_t heap_pop(enc_t *e)
{
    bigram_t top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && e->heap[c + 1].key < e->heap[c].key)
            c++;
        if (last.key <= e->heap[c].key)
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = last;
    return top;
}

static void add_bigram(enc_t *e, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const sym_t *L = &e->sym[l], *R = &e->sym[r];
    uint64_t key = (uint64_t)(uint32_t)L->id << 32 | (uint32_t)R->id;
    const uint64_t *v = tok_u64map_get(&e->t->ranks, key);
    if (!v)
        return;
    heap_push(e, (bigram_t){ (*v >> 32) << 32 | (uint32_t)l, r, L->len + R->len, (int32_t)(uint32_t)*v });
}

static ecs_err_t enc_reserve(enc_t *e, size_t n)
{
    if (n <= e->sym_cap)
        return ECS_OK;
    size_t cap = e->sym_cap ? e->sym_cap : 64;
    while (cap < n)
        cap *= 2;
    sym_t *s = realloc(e->sym, cap * sizeof *s);
    if (s)
        e->sym = s;
    /* each merge pushes at most two pairs: 3n covers all pushes */
    bigram_t *h = s ? realloc(e->heap, 3 * cap * sizeof *h) : NULL;
    if (!s || !h)
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte word", n);
    e->heap = h;
    e->sym_cap = cap;
    return ECS_OK;
}

/* Byte-level BPE of one pre-tokenized word. */
static ecs_err_t bpe_word(void *ud, const char *w, size_t n)
{
    enc_t *e = ud;
    const tok_t *t = e->t;
    const uint8_t *b = (const uint8_t *)w;
    if (n == 1) {
        emit(e, t->byte_tok[b[0]]);
        return ECS_OK;
    }
    ecs_err_t err = enc_reserve(e, n);
    if (err)
        return err;
    for (size_t i = 0; i < n; i++)
        e->sym[i] = (sym_t){ (int32_t)i, 1, t->byte_tok[b[i]], (int32_t)i - 1,
                             i + 1 < n ? (int32_t)i + 1 : -1 };
    e->heap_n = 0;
    for (size_t i = 1; i < n; i++)
        add_bigram(e, (int32_t)i - 1, (int32_t)i);
    while (e->heap_n) {
        bigram_t g = heap_pop(e);
        int32_t l = (int32_t)(uint32_t)g.key;
        sym_t *L = &e->sym[l], *R = &e->sym[g.right];
        /* stale if either side was merged since the pair was queued */
        if (L->len == 0 || R->len == 0 || L->len + R->len != g.size)
            continue;
        L->len += R->len;
        L->id = g.result;
        R->len = 0;
        L->next = R->next;
        if (R->next >= 0)
            e->sym[R->next].prev = l;
        add_bigram(e, L->prev, l);
        add_bigram(e, l, L->next);
    }
    for (int32_t i = 0; i >= 0; i = e->sym[i].next) {
        const sym_t *s = &e->sym[i];
        if (s->id < t->n_vocab) {
            emit(e, s->id);
        } else { /* merged into a string that is no token: spell it in bytes */
            for (int32_t j = 0; j < s->len; j++)
                emit(e, t->byte_tok[b[s->start + j]]);
        }
    }
    return ECS_OK;
}

static ecs_err_t encode_raw(enc_t *e, const char *text, size_t len)
{
    const char *s;
    size_t n;
    char *owned;
    ecs_err_t err = tok_u8_sanitize(text, len, &s, &n, &owned);
    if (err)
        return err;
    err = tok_pretok_split(e->t->pre, s, n, bpe_word, e);
    free(owned);
    return err;
}

typedef struct {
    uint32_t pos, len;
    int32_t tok;
} occ_t;

static int occ_priority(const void *pa, const void *pb)
{
    const occ_t *a = pa, *b = pb;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    if (a->tok != b->tok)
        return a->tok < b->tok ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static int occ_position(const void *pa, const void *pb)
{
    const occ_t *a = pa, *b = pb;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static bool allowed(const tok_t *t, int32_t id, bool parse_special)
{
    return parse_special || t->type[id] == TOK_TYPE_USER_DEFINED;
}

/* Every place a special token's text occurs in text. */
static ecs_err_t find_occurrences(const tok_t *t, const uint8_t *s, size_t len, bool parse_special,
                                  occ_t **out, size_t *n_out)
{
    occ_t *v = NULL;
    size_t n = 0, cap = 0;
    for (size_t p = 0; p < len; p++) {
        int32_t node = t->trie_root[s[p]];
        for (size_t d = 1; node >= 0; d++) {
            int32_t id = t->trie[node].tok;
            if (id >= 0 && allowed(t, id, parse_special)) {
                if (n == cap) {
                    size_t nc = cap ? cap * 2 : 16;
                    occ_t *nv = realloc(v, nc * sizeof *nv);
                    if (!nv) {
                        free(v);
                        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory");
                    }
                    v = nv;
                    cap = nc;
                }
                v[n++] = (occ_t){ (uint32_t)p, (uint32_t)d, id };
            }
            if (p + d >= len)
                break;
            node = tok_trie_child(t, node, s[p + d]);
        }
    }
    *out = v;
    *n_out = n;
    return ECS_OK;
}

/* llama.cpp's partition: longest special token text first, each token's
 * occurrences left to right, skipping those overlapping one already taken;
 * the text between taken occurrences is encoded as ordinary text. */
static ecs_err_t encode_text(enc_t *e, const char *text, size_t len, bool parse_special)
{
    const tok_t *t = e->t;
    occ_t *occ = NULL;
    size_t n_occ = 0;
    ecs_err_t err = find_occurrences(t, (const uint8_t *)text, len, parse_special, &occ, &n_occ);
    if (err)
        return err;
    if (n_occ == 0)
        return encode_raw(e, text, len);
    uint8_t *used = calloc(len, 1);
    if (!used) {
        free(occ);
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory");
    }
    qsort(occ, n_occ, sizeof *occ, occ_priority);
    size_t n_taken = 0;
    for (size_t i = 0; i < n_occ; i++) {
        bool free_span = true;
        for (uint32_t j = 0; j < occ[i].len && free_span; j++)
            free_span = !used[occ[i].pos + j];
        if (!free_span)
            continue;
        memset(used + occ[i].pos, 1, occ[i].len);
        occ[n_taken++] = occ[i];
    }
    free(used);
    qsort(occ, n_taken, sizeof *occ, occ_position);
    size_t at = 0;
    for (size_t i = 0; i < n_taken && !err; i++) {
        if (occ[i].pos > at)
            err = encode_raw(e, text + at, occ[i].pos - at);
        emit(e, occ[i].tok);
        at = occ[i].pos + occ[i].len;
    }
    if (!err && at < len)
        err = encode_raw(e, text + at, len - at);
    free(occ);
    return err;
}

ecs_err_t tok_encode(const tok_t *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *out, size_t cap, size_t *n_out)
{
    *n_out = 0;
    if ((!text && len) || (!out && cap))
        return ecs_error(ECS_ERR_INVAL, "tok_encode: NULL buffer");
    if (len > TOK_MAX_TEXT)
        return ecs_error(ECS_ERR_RANGE, "tok_encode: text of %zu bytes exceeds the %zu-byte limit",
                         len, TOK_MAX_TEXT);
    enc_t e = { .t = t, .out = out, .cap = cap };
    ecs_err_t err = ECS_OK;
    if (add_special && t->add_bos)
        emit(&e, t->bos);
    if (len)
        err = encode_text(&e, text, len, parse_special);
    if (add_special && t->add_eos)
        emit(&e, t->eos);
    free(e.sym);
    free(e.heap);
    if (err)
        return err;
    *n_out = e.n;
    if (e.n > cap)
        return ecs_error(ECS_ERR_RANGE, "tok_encode: %zu tokens do not fit in %zu", e.n, cap);
    return ECS_OK;
}

/* ---- decoding ---- */

void tok_decoder_init(tok_decoder_t *d, const tok_t *t, bool render_special)
{
    d->tok = t;
    d->render_special = render_special;
    d->n_pending = 0;
    d->n_keep = 0;
}

void tok_decoder_keep(tok_decoder_t *d, const int32_t *ids, int n)
{
    d->n_keep = n < 0 ? 0 : n > TOK_KEEP_MAX ? TOK_KEEP_MAX : n;
    if (d->n_keep)
        memcpy(d->keep, ids, (size_t)d->n_keep * sizeof *ids);
}

static bool decoder_keeps(const tok_decoder_t *d, int32_t id)
{
    for (int i = 0; i < d->n_keep; i++)
        if (d->keep[i] == id)
            return true;
    return false;
}

size_t tok_decoder_max_out(const tok_t *t)
{
    /* every byte (held back ones included) can turn into a 3-byte U+FFFD */
    return 3 * ((size_t)t->max_piece_len + 3);
}

static const char REPLACEMENT[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

typedef struct {
    char *out;
    size_t cap, n;
} sink_t;

static bool sink_put(sink_t *k, const void *p, size_t n)
{
    if (n > k->cap - k->n)
        return false;
    memcpy(k->out + k->n, p, n);
    k->n += n;
    return true;
}

/* Emits the complete sequences of pending ++ p, replacing invalid subparts;
 * a valid but unfinished tail is saved in tail (unless final). */
static ecs_err_t dec_run(const uint8_t *pend, size_t np, const uint8_t *p, size_t n, bool final,
                         sink_t *k, uint8_t tail[3], size_t *n_tail)
{
    size_t total = np + n, i = 0;
    *n_tail = 0;
    while (i < total) {
        uint8_t seq[4];
        const uint8_t *s;
        size_t avail = total - i;
        if (i >= np) {
            s = p + (i - np);
        } else {
            avail = avail < 4 ? avail : 4;
            for (size_t j = 0; j < avail; j++)
                seq[j] = i + j < np ? pend[i + j] : p[i + j - np];
            s = seq;
        }
        int r = tok_u8_strict(s, avail);
        bool ok = true;
        if (r > 0) {
            ok = sink_put(k, s, (size_t)r);
            i += (size_t)r;
        } else if (r == 0 && !final) { /* unfinished: hold back (at most 3 bytes) */
            for (size_t j = 0; j < avail; j++)
                tail[j] = s[j];
            *n_tail = avail;
            break;
        } else {
            ok = sink_put(k, REPLACEMENT, 3);
            i += r == 0 ? avail : (size_t)-r;
        }
        if (!ok)
            return ecs_error(ECS_ERR_RANGE, "tok_decoder: output buffer of %zu bytes too small", k->cap);
    }
    return ECS_OK;
}

static ecs_err_t decoder_feed(tok_decoder_t *d, const char *p, size_t n, bool final, char *out,
                              size_t cap, size_t *n_out)
{
    sink_t k = { out, cap, 0 };
    uint8_t tail[3];
    size_t n_tail;
    *n_out = 0;
    ecs_err_t err = dec_run(d->pending, d->n_pending, (const uint8_t *)p, n, final, &k, tail, &n_tail);
    if (err)
        return err;
    memcpy(d->pending, tail, n_tail);
    d->n_pending = (uint8_t)n_tail;
    *n_out = k.n;
    return ECS_OK;
}

ecs_err_t tok_decoder_push(tok_decoder_t *d, int32_t id, char *out, size_t cap, size_t *n)
{
    const tok_t *t = d->tok;
    *n = 0;
    if (!valid_id(t, id))
        return ecs_error(ECS_ERR_RANGE, "tok_decoder: token id %d outside the vocabulary (%d)", id,
                         t->n_vocab);
    int ty = t->type[id];
    if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN) && !d->render_special &&
        !decoder_keeps(d, id))
        return ECS_OK;
    return decoder_feed(d, t->piece[id], t->piece_len[id], false, out, cap, n);
}

ecs_err_t tok_decoder_flush(tok_decoder_t *d, char *out, size_t cap, size_t *n)
{
    return decoder_feed(d, NULL, 0, true, out, cap, n);
}

ecs_err_t tok_decode(const tok_t *t, const int32_t *ids, size_t n, bool render_special,
                     char *out, size_t cap, size_t *len)
{
    tok_decoder_t d;
    size_t m = tok_decoder_max_out(t), total = 0, k;
    char *buf = malloc(m);
    ecs_err_t err = ECS_OK;
    *len = 0;
    if (!buf)
        return ecs_error(ECS_ERR_NOMEM, "tok_decode: out of memory");
    tok_decoder_init(&d, t, render_special);
    for (size_t i = 0; i <= n && !err; i++) {
        err = i < n ? tok_decoder_push(&d, ids[i], buf, m, &k) : tok_decoder_flush(&d, buf, m, &k);
        if (!err && total + k < cap)
            memcpy(out + total, buf, k);
        total += err ? 0 : k;
    }
    free(buf);
    if (err)
        return err;
    *len = total;
    if (total >= cap)
        return ecs_error(ECS_ERR_RANGE, "tok_decode: %zu bytes do not fit in %zu", total + 1, cap);
    out[total] = '\0';
    return ECS_OK;
}
