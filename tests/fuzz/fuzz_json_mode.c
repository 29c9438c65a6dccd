/* fuzz_json_mode.c - libFuzzer target for JSON mode's recogniser
 * (sampler_json_*), plain and following a schema: the input fed whole and
 * in pieces (cut where its first byte says) must get the same verdict, a
 * schema may only refuse more than plain JSON mode, and on ASCII input the verdict
 * must agree with jansson's on whether the text is one JSON object (the
 * recogniser's own bounds, whitespace runs and depth, and integers too big
 * for jansson excepted, in the direction they excuse). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/sampler/sampler.h"

/* A schema with most of the subset in it (a discriminated union too); its
 * verdicts must be a subset of plain JSON mode's. */
static const char schema_text[] =
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
    "\"b\":{\"enum\":[\"x\",\"xy\",1.5,true,null]},\"c\":{\"type\":\"array\","
    "\"items\":{\"$ref\":\"#\"}},\"d\":{\"anyOf\":[{\"type\":\"string\"},"
    "{\"type\":\"number\"}]},\"e\":{\"anyOf\":[{\"properties\":{\"t\":{\"const\":\"x\"},"
    "\"v\":{\"type\":\"integer\"}},\"required\":[\"t\"]},{\"properties\":{\"t\":{\"const\":\"xy\"},"
    "\"w\":{\"$ref\":\"#\"}},\"required\":[\"t\",\"w\"],\"additionalProperties\":false},"
    "{\"type\":\"null\"}]}},\"required\":[\"a\"],\"additionalProperties\":{\"type\":\"boolean\"}}";

static const sampler_schema_t *the_schema(void)
{
    static sampler_schema_t *s;
    if (!s && sampler_schema_new(schema_text, sizeof schema_text - 1, &s) != ECS_OK)
        abort();
    return s;
}

static bool ours_with(const sampler_schema_t *sc, const uint8_t *d, size_t n, size_t cut)
{
    sampler_json_t j;
    sampler_json_init_schema(&j, sc);
    for (size_t i = 0; i < n; i += cut) {
        const size_t k = n - i < cut ? n - i : cut;
        /* complete before the end: the rest is refused */
        if (!sampler_json_feed(&j, (const char *)d + i, k))
            return false;
    }
    return sampler_json_done(&j);
}

static bool ours(const uint8_t *d, size_t n, size_t cut) { return ours_with(NULL, d, n, cut); }

/* What the recogniser may refuse that jansson takes. */
static bool beyond_bounds(const uint8_t *d, size_t n)
{
    int ws = 0, digits = 0, open = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t c = d[i];
        ws = c == ' ' || c == '\t' || c == '\n' || c == '\r' ? ws + 1 : 0;
        digits = c >= '0' && c <= '9' ? digits + 1 : 0;
        open += c == '[' || c == '{';
        if (ws > SAMPLER_JSON_MAX_WS || digits > 15 || open > SAMPLER_JSON_MAX_DEPTH)
            return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const size_t cut = 1 + data[0] % 7;
    const uint8_t *d = data + 1;
    const size_t n = size - 1;
    const bool whole = ours(d, n, n ? n : 1);
    if (ours(d, n, cut) != whole)
        abort();
    const bool sch = ours_with(the_schema(), d, n, n ? n : 1);
    if (ours_with(the_schema(), d, n, cut) != sch || (sch && !whole))
        abort(); /* pieces change nothing; the schema only narrows */
    for (size_t i = 0; i < n; i++)
        if (d[i] >= 0x80 || d[i] == 0)
            return 0; /* UTF-8 is the detokenizer's business, not the recogniser's;
                         jansson's buffer reader lets a NUL pass between tokens */
    json_error_t e;
    json_t *v = json_loadb((const char *)d, n, JSON_ALLOW_NUL, &e);
    const bool theirs = v && json_is_object(v);
    json_decref(v);
    /* numbers jansson cannot hold ("too big integer", "real number
     * overflow") and a \u0000 in a key ("NUL byte in object key not
     * supported") are still JSON */
    if (whole && !theirs && !strstr(e.text, "too big") && !strstr(e.text, "overflow") &&
        !strstr(e.text, "NUL byte"))
        abort();
    /* jansson takes whitespace after the object; the request ends before */
    size_t m = n;
    while (m && (d[m - 1] == ' ' || d[m - 1] == '\t' || d[m - 1] == '\n' || d[m - 1] == '\r'))
        m--;
    if (theirs && !ours(d, m, m ? m : 1) && !beyond_bounds(d, m))
        abort();
    return 0;
}
