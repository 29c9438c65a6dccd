/* json.c - JSON mode's recogniser (sampler.h, response_format
 * {"type": "json_object"}): a pushdown automaton over bytes that accepts
 * exactly the prefixes of one RFC 8259 object. The scheduler tries each
 * token's bytes on a copy of a request's state and masks the tokens that
 * fail, so the recogniser must be exact (a prefix it wrongly refuses can
 * leave nothing to sample; one it wrongly accepts ends in invalid JSON)
 * and cheap: ~100k tokens are tried per step, most of them refused on
 * their first byte. The state is a few bytes of plain data and allocates
 * nothing. */
#include "coordinator/sampler/sampler.h"

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

bool sampler_json_done(const sampler_json_t *j) { return j->state == J_DONE; }

bool sampler_json_in_string(const sampler_json_t *j) { return j->state == J_STR; }

static bool is_ws(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int hex_val(unsigned c)
{
    return c >= '0' && c <= '9' ? (int)(c - '0')
           : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10)
           : c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10)
                                  : -1;
}

static bool top_is_array(const sampler_json_t *j) { return (j->stack >> (j->depth - 1)) & 1; }

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

static void pop(sampler_json_t *j)
{
    j->depth--;
    after_value(j);
}

/* The first byte of a value (state J_VALUE or J_ARR_FIRST). */
static bool value_start(sampler_json_t *j, unsigned c)
{
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
        if (j->key)
            j->state = J_COLON;
        else
            after_value(j);
        return true;
    }
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
    if (++j->aux < 4)
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
    if (digits && c >= '0' && c <= '9')
        return true;
    if (dot && c == '.') {
        j->state = J_DOT;
        return true;
    }
    if (exp && (c == 'e' || c == 'E')) {
        j->state = J_E;
        return true;
    }
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
        return c == '{' && push(j, false);
    case J_VALUE:
        if (is_ws(c))
            return ws_byte(j);
        return value_start(j, c);
    case J_ARR_FIRST:
        if (is_ws(c))
            return ws_byte(j);
        if (c == ']') {
            pop(j);
            return true;
        }
        return value_start(j, c);
    case J_OBJ_FIRST:
    case J_OBJ_KEY:
        if (is_ws(c))
            return ws_byte(j);
        if (c == '}' && j->state == J_OBJ_FIRST) {
            pop(j);
            return true;
        }
        if (c != '"')
            return false;
        j->state = J_STR;
        j->key = 1;
        return true;
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
            return true;
        }
        if (c == (top_is_array(j) ? ']' : '}')) {
            pop(j);
            return true;
        }
        return false;
    case J_STR: return byte_in_string(j, c);
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
        return c >= '0' && c <= '9';
    case J_ZERO: return number_byte(j, c, false, true, true);
    case J_INT: return number_byte(j, c, true, true, true);
    case J_DOT:
    case J_E:
    case J_ESIGN:
        if (j->state == J_E && (c == '+' || c == '-')) {
            j->state = J_ESIGN;
            return true;
        }
        if (c < '0' || c > '9')
            return false;
        j->state = j->state == J_DOT ? J_FRAC : J_EXP;
        return true;
    case J_FRAC: return number_byte(j, c, true, false, true);
    case J_EXP: return number_byte(j, c, true, false, false);
    case J_LIT:
        if ((unsigned char)lits[j->lit][j->aux] != c)
            return false;
        if (lits[j->lit][++j->aux] == 0)
            after_value(j);
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
