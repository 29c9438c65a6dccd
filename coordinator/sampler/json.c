/* json.c - JSON mode's recogniser (sampler.h, response_format
 * json_object and json_schema): a pushdown automaton over bytes that
 * accepts exactly the prefixes of one RFC 8259 object, and, with a schema
 * (json_schema.c's node table), only those the schema allows: hooks at a
 * value's first byte, a key's bytes, a scalar's bytes and a container's
 * close narrow the syntax's verdict. The scheduler tries each token's
 * bytes on a copy of a request's state and masks the tokens that fail, so
 * the recogniser must be exact (a prefix it wrongly refuses can leave
 * nothing to sample; one it wrongly accepts ends in invalid JSON), every
 * state it can reach must take some byte (no dead ends: a refusal comes
 * at the first byte that rules a text out), and it must be cheap: ~100k
 * tokens are tried a step. The state is ~150 bytes of plain data and
 * allocates nothing. */
#include "coordinator/sampler/json_int.h"

#include <string.h>

enum {
    J_START,     /* before the object: whitespace or '{' */
    J_VALUE,     /* a value (after ':' or an array's ',') */
    J_OBJ_FIRST, /* after '{': a key or '}' */
    J_OBJ_KEY,   /* after an object's ',': a key */
    J_COLON,     /* after a key */
    J_NEXT,      /* after a value inside a container: ',' or its closer */
    J_ARR_FIRST, /* after '[': a value or ']' */
    J_STR,       /* in a string (key: a key's) */
    J_ESC,       /* after a backslash in a string */
    J_HEX,       /* in \uXXXX: aux digits read so far, hex their value */
    J_LOW_BS,    /* after a high surrogate's escape: '\' of the low one */
    J_LOW_U,     /* and its 'u' */
    J_MINUS,     /* number: after '-' */
    J_ZERO,      /* number: a leading 0 */
    J_INT,       /* number: in the integer digits */
    J_DOT,       /* number: after '.' */
    J_FRAC,      /* number: in the fraction digits */
    J_E,         /* number: after 'e' / 'E' */
    J_ESIGN,     /* number: after the exponent's sign */
    J_EXP,       /* number: in the exponent digits */
    J_LIT,       /* in true / false / null: lit which, aux bytes matched */
    J_DONE,      /* the object is complete */
};

static const char *const lits[3] = {"true", "false", "null"};

void sampler_json_init(sampler_json_t *j) { memset(j, 0, sizeof *j); }

void sampler_json_init_schema(sampler_json_t *j, const sampler_schema_t *s)
{
    sampler_json_init(j);
    j->sc = s;
    j->vnode = s ? s->root : 0;
}

bool sampler_json_done(const sampler_json_t *j) { return j->state == J_DONE; }

static const js_node_t *node(const sampler_json_t *j, uint16_t i) { return &j->sc->nodes[i]; }

/* Whether the schema checks what comes now (not inside a value it leaves
 * free). */
static bool tracked(const sampler_json_t *j) { return j->sc && !j->any; }

static const js_node_t *top_node(const sampler_json_t *j) { return node(j, j->fnode[j->sdepth - 1]); }

/* Whether the object being read takes properties it does not list. */
static bool free_keys(const sampler_json_t *j) { return top_node(j)->extra != JS_NONE; }

/* Every one of a node's properties or values, as a candidate set. */
static uint64_t all_of(const js_node_t *n) { return n->n >= 64 ? ~0ull : (1ull << n->n) - 1; }

bool sampler_json_in_string(const sampler_json_t *j)
{
    /* free text: a value string that is not an enum's, or a key that can
     * no longer name a listed property (an additional one: any text) */
    return j->state == J_STR &&
           (!tracked(j) || (!j->key && node(j, j->cur)->kind != JK_ENUM) ||
            (j->key && !j->cand && !j->dup && free_keys(j)));
}

static bool is_ws(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int hex_val(unsigned c)
{
    return c >= '0' && c <= '9' ? (int)(c - '0')
           : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10)
           : c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10)
                                  : -1;
}

static bool top_is_array(const sampler_json_t *j) { return (j->stack >> (j->depth - 1)) & 1; }

/* ---- the schema's side (no-ops without one; json_int.h) ---- */

/* Candidates of set m whose text has byte c at offset off. */
static uint64_t match(const sampler_json_t *j, uint16_t first, uint64_t m, unsigned off, unsigned c)
{
    uint64_t keep = 0;
    for (; m; m &= m - 1) {
        const int i = __builtin_ctzll(m);
        const js_str_t *t = &j->sc->strs[first + i];
        if (off < t->len && (unsigned char)t->text[off] == c)
            keep |= 1ull << i;
    }
    return keep;
}

/* The candidate of m whose text is exactly off bytes, -1 if none. */
static int exact(const sampler_json_t *j, uint16_t first, uint64_t m, unsigned off)
{
    for (; m; m &= m - 1)
        if (j->sc->strs[first + __builtin_ctzll(m)].len == off)
            return __builtin_ctzll(m);
    return -1;
}

/* A value's first byte c: the node it must match (vnode's, by c's class). */
static bool sch_value(sampler_json_t *j, unsigned c)
{
    if (!j->sc)
        return true;
    const bool container = c == '{' || c == '[';
    if (j->any) {
        j->any += container;
        return true;
    }
    const uint16_t n = node(j, j->vnode)->alt[js_class_of(c)];
    if (n == JS_NONE)
        return false;
    const js_node_t *nd = node(j, n);
    j->cur = n;
    switch (nd->kind) {
    case JK_ANY:
        j->any = container;
        return true;
    case JK_OBJECT:
    case JK_ARRAY:
        if (j->sdepth >= SAMPLER_SCHEMA_MAX_DEPTH)
            return false;
        j->fnode[j->sdepth] = n;
        j->fseen[j->sdepth++] = 0;
        j->vnode = nd->items; /* an array's first item */
        return true;
    case JK_ENUM:
        j->cand = match(j, nd->first, all_of(nd), 0, c);
        j->off = 1;
        return j->cand != 0;
    default:
        return true;
    }
}

/* A byte of a scalar value after its first (the closing quote included). */
static bool sch_scalar(sampler_json_t *j, unsigned c)
{
    if (!tracked(j) || node(j, j->cur)->kind != JK_ENUM)
        return true;
    j->cand = match(j, node(j, j->cur)->first, j->cand, j->off++, c);
    return j->cand != 0;
}

/* A scalar value complete: an enum's text must be one of its values whole.
 * A discriminated union's tag (json_schema.c: build_switch) turns the
 * object being read into the alternative its value names. */
static bool sch_scalar_end(sampler_json_t *j)
{
    if (!tracked(j) || node(j, j->cur)->kind != JK_ENUM)
        return true;
    const int v = exact(j, node(j, j->cur)->first, j->cand, j->off);
    if (v < 0)
        return false;
    const uint16_t to = j->sc->strs[node(j, j->cur)->first + v].node;
    if (to != JS_NONE)
        j->fnode[j->sdepth - 1] = to;
    return true;
}

/* A key's opening quote: its candidates are the properties not seen yet. */
static bool sch_key_start(sampler_json_t *j)
{
    if (!tracked(j))
        return true;
    j->cand = all_of(top_node(j)) & ~j->fseen[j->sdepth - 1];
    j->dup = free_keys(j) ? j->fseen[j->sdepth - 1] : 0; /* another name may not repeat one */
    j->off = 0;
    return j->cand || free_keys(j);
}

static bool sch_key_byte(sampler_json_t *j, unsigned c)
{
    if (!tracked(j))
        return true;
    j->dup = match(j, top_node(j)->first, j->dup, j->off, c);
    j->cand = match(j, top_node(j)->first, j->cand, j->off++, c);
    return j->cand || free_keys(j);
}

/* A key's closing quote: the property it names, else another property's. */
static bool sch_key_end(sampler_json_t *j)
{
    if (!tracked(j))
        return true;
    const js_node_t *o = top_node(j);
    const int p = exact(j, o->first, j->cand, j->off);
    if (p >= 0) {
        j->fseen[j->sdepth - 1] |= 1ull << p;
        j->vnode = j->sc->strs[o->first + p].node;
        return true;
    }
    j->vnode = o->extra;
    return free_keys(j) && exact(j, o->first, j->dup, j->off) < 0;
}

/* An object's ',': only where a property may still come (else the
 * object could only close, and the ',' would leave nothing to write). */
static bool sch_more_keys(const sampler_json_t *j)
{
    if (!tracked(j))
        return true;
    return (all_of(top_node(j)) & ~j->fseen[j->sdepth - 1]) || free_keys(j);
}

/* An array's ',': the next item's node. */
static void sch_next_item(sampler_json_t *j)
{
    if (tracked(j))
        j->vnode = top_node(j)->items;
}

/* A container's close: an object must hold its required properties. */
static bool sch_close(sampler_json_t *j)
{
    if (!j->sc)
        return true;
    if (j->any) {
        j->any--;
        return true;
    }
    const js_node_t *o = top_node(j);
    if (o->kind == JK_OBJECT && (o->required & ~j->fseen[j->sdepth - 1]))
        return false;
    j->sdepth--;
    return true;
}

static void after_value(sampler_json_t *j) { j->state = j->depth ? J_NEXT : J_DONE; }

static bool push(sampler_json_t *j, bool array)
{
    if (j->depth >= SAMPLER_JSON_MAX_DEPTH)
        return false;
    j->stack = (j->stack & ~(1ull << j->depth)) | ((uint64_t)array << j->depth);
    j->depth++;
    j->state = array ? J_ARR_FIRST : J_OBJ_FIRST;
    return true;
}

static bool pop(sampler_json_t *j)
{
    if (!sch_close(j))
        return false;
    j->depth--;
    after_value(j);
    return true;
}

/* The first byte of a value (state J_VALUE or J_ARR_FIRST). */
static bool value_start(sampler_json_t *j, unsigned c)
{
    if (!sch_value(j, c))
        return false;
    switch (c) {
    case '{': return push(j, false);
    case '[': return push(j, true);
    case '"': j->state = J_STR; j->key = 0; return true;
    case '-': j->state = J_MINUS; return true;
    case '0': j->state = J_ZERO; return true;
    case 't': case 'f': case 'n':
        j->state = J_LIT;
        j->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        j->aux = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            j->state = J_INT;
            return true;
        }
        return false;
    }
}

/* A number's byte c in a state where the number may end here: digits,
 * '.', 'e' continue it (as each state allows); anything else ends it and
 * is the next byte after the value. */
static bool feed_byte(sampler_json_t *j, unsigned c);

static bool byte_in_string(sampler_json_t *j, unsigned c)
{
    if (c == '"') {
        if (j->key) {
            j->state = J_COLON;
            return sch_key_end(j);
        }
        if (!sch_scalar(j, c) || !sch_scalar_end(j))
            return false;
        after_value(j);
        return true;
    }
    if (!(j->key ? sch_key_byte(j, c) : sch_scalar(j, c)))
        return false;
    if (c == '\\') {
        j->state = J_ESC;
        return true;
    }
    return c >= 0x20; /* control characters must be escaped */
}

static bool byte_escape(sampler_json_t *j, unsigned c)
{
    if (c == 'u') {
        j->state = J_HEX;
        j->aux = 0;
        j->hex = 0;
        return true;
    }
    if (j->low) /* a high surrogate's escape must be its low half */
        return false;
    if (!strchr("\"\\/bfnrt", (int)c) || c == 0)
        return false;
    j->state = J_STR;
    return true;
}

static bool byte_hex(sampler_json_t *j, unsigned c)
{
    const int v = hex_val(c);
    if (v < 0)
        return false;
    j->hex = (uint16_t)(j->hex << 4 | (unsigned)v);
    /* refused at the first digit that rules a valid escape out, never
     * later: a prefix no digit can finish would be a dead end */
    if (++j->aux == 1 && j->low && j->hex != 0xD)
        return false;
    if (j->aux == 2 && (j->hex >> 4) == 0xD && (j->low != ((j->hex & 0xF) >= 0xC)))
        return false;
    if (j->aux < 4)
        return true;
    const bool high = j->hex >= 0xD800 && j->hex <= 0xDBFF;
    const bool low = j->hex >= 0xDC00 && j->hex <= 0xDFFF;
    if (j->low) { /* strict parsers refuse unpaired surrogates */
        if (!low)
            return false;
        j->low = 0;
        j->state = J_STR;
        return true;
    }
    if (low)
        return false;
    j->low = high;
    j->state = high ? J_LOW_BS : J_STR;
    return true;
}

static bool number_byte(sampler_json_t *j, unsigned c, bool digits, bool dot, bool exp)
{
    const bool integer = tracked(j) && node(j, j->cur)->kind == JK_INTEGER;
    if (digits && c >= '0' && c <= '9')
        return sch_scalar(j, c);
    if (dot && c == '.' && !integer) {
        j->state = J_DOT;
        return sch_scalar(j, c);
    }
    if (exp && (c == 'e' || c == 'E') && !integer) {
        j->state = J_E;
        return sch_scalar(j, c);
    }
    if (!sch_scalar_end(j))
        return false;
    after_value(j); /* the number ended: c follows it */
    return feed_byte(j, c);
}

/* Whitespace where the grammar allows it, bounded in a row. */
static bool ws_byte(sampler_json_t *j) { return ++j->ws <= SAMPLER_JSON_MAX_WS; }

static bool feed_byte(sampler_json_t *j, unsigned c)
{
    switch (j->state) {
    case J_START:
        if (is_ws(c))
            return ws_byte(j);
        return c == '{' && value_start(j, c);
    case J_VALUE:
        if (is_ws(c))
            return ws_byte(j);
        return value_start(j, c);
    case J_ARR_FIRST:
        if (is_ws(c))
            return ws_byte(j);
        if (c == ']')
            return pop(j);
        return value_start(j, c);
    case J_OBJ_FIRST:
    case J_OBJ_KEY:
        if (is_ws(c))
            return ws_byte(j);
        if (c == '}' && j->state == J_OBJ_FIRST)
            return pop(j);
        if (c != '"')
            return false;
        j->state = J_STR;
        j->key = 1;
        return sch_key_start(j);
    case J_COLON:
        if (is_ws(c))
            return ws_byte(j);
        if (c != ':')
            return false;
        j->state = J_VALUE;
        return true;
    case J_NEXT:
        if (is_ws(c))
            return ws_byte(j);
        if (c == ',') {
            j->state = top_is_array(j) ? J_VALUE : J_OBJ_KEY;
            if (!top_is_array(j))
                return sch_more_keys(j);
            sch_next_item(j);
            return true;
        }
        if (c == (top_is_array(j) ? ']' : '}'))
            return pop(j);
        return false;
    case J_STR: return byte_in_string(j, c);
    case J_ESC:
    case J_HEX:
    case J_LOW_BS:
    case J_LOW_U: /* an escape's bytes are the string's text too */
        if (!(j->key ? sch_key_byte(j, c) : sch_scalar(j, c)))
            return false;
        break;
    default:
        break;
    }
    switch (j->state) {
    case J_ESC: return byte_escape(j, c);
    case J_HEX: return byte_hex(j, c);
    case J_LOW_BS:
        j->state = J_LOW_U;
        return c == '\\';
    case J_LOW_U:
        j->state = J_HEX;
        j->aux = 0;
        j->hex = 0;
        return c == 'u';
    case J_MINUS:
        j->state = c == '0' ? J_ZERO : J_INT;
        return c >= '0' && c <= '9' && sch_scalar(j, c);
    case J_ZERO: return number_byte(j, c, false, true, true);
    case J_INT: return number_byte(j, c, true, true, true);
    case J_DOT:
    case J_E:
    case J_ESIGN:
        if (j->state == J_E && (c == '+' || c == '-')) {
            j->state = J_ESIGN;
            return sch_scalar(j, c);
        }
        if (c < '0' || c > '9')
            return false;
        j->state = j->state == J_DOT ? J_FRAC : J_EXP;
        return sch_scalar(j, c);
    case J_FRAC: return number_byte(j, c, true, false, true);
    case J_EXP: return number_byte(j, c, true, false, false);
    case J_LIT:
        if ((unsigned char)lits[j->lit][j->aux] != c || !sch_scalar(j, c))
            return false;
        if (lits[j->lit][++j->aux] == 0) {
            if (!sch_scalar_end(j))
                return false;
            after_value(j);
        }
        return true;
    default: /* J_DONE: nothing may follow */
        return false;
    }
}

bool sampler_json_feed(sampler_json_t *j, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t ws = j->ws;
        if (!feed_byte(j, (unsigned char)b[i]))
            return false;
        if (j->ws == ws) /* not whitespace between tokens: a run of it ends */
            j->ws = 0;
    }
    return true;
}
