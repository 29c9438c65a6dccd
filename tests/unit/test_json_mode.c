/* test_json_mode.c - JSON mode's recogniser (sampler_json_*) and the
 * logit bias: valid objects are accepted byte by byte and complete only at
 * their last byte; each kind of invalid text is refused at the byte that
 * breaks it; the depth and whitespace bounds; and a differential run
 * against jansson over generated objects and their one-byte mutations
 * (both must agree whether the text is one complete JSON object). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "coordinator/sampler/sampler.h"

/* Bytes of text fed one by one: -1 if all are accepted, else the index of
 * the first refused byte; *done: whether complete after the last. */
static int feed_bytes(const char *text, size_t n, bool *done)
{
    sampler_json_t j;
    sampler_json_init(&j);
    *done = false;
    for (size_t i = 0; i < n; i++) {
        if (!sampler_json_feed(&j, text + i, 1))
            return (int)i;
        if (i + 1 < n && sampler_json_done(&j))
            return (int)i + 1; /* complete too early: the next byte is refused */
    }
    *done = sampler_json_done(&j);
    return -1;
}

static bool whole(const char *text)
{
    bool done;
    return feed_bytes(text, strlen(text), &done) < 0 && done;
}

Test(json_mode, valid_objects_complete_at_their_last_byte)
{
    static const char *const ok[] = {
        "{}",
        " \n\t{ }",
        "{\"a\":1}",
        "{\"a\" : -0.5e+10, \"b\":[true,false,null,[],{}], \"c\":{\"d\":\"x\"}}",
        "{\"s\":\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\ud83d\\ude00\"}",
        "{\"n\":[0,-0,10,1.25,3e7,4E-2,-9.0e0]}",
        "{\"utf8\":\"\xc3\xa9\xe4\xb8\xad\"}",
        "{\"\":\"\"}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        bool done;
        const int at = feed_bytes(ok[i], strlen(ok[i]), &done);
        cr_assert(at < 0, "'%s' refused at byte %d", ok[i], at);
        cr_assert(done, "'%s' not complete", ok[i]);
    }
    /* and fed as one piece, or in pieces of 3 */
    const char *t = ok[3];
    sampler_json_t j;
    sampler_json_init(&j);
    cr_assert(sampler_json_feed(&j, t, strlen(t)) && sampler_json_done(&j));
    sampler_json_init(&j);
    for (size_t i = 0; i < strlen(t); i += 3)
        cr_assert(sampler_json_feed(&j, t + i, strlen(t) - i < 3 ? strlen(t) - i : 3));
    cr_assert(sampler_json_done(&j));
}

Test(json_mode, invalid_text_is_refused_where_it_breaks)
{
    static const struct {
        const char *text;
        int at;
    } bad[] = {
        {"[1]", 0},              /* an object, not any value */
        {"x{}", 0},
        {"{\"a\" 1}", 5},
        {"{\"a\":01}", 6},       /* no leading zeros */
        {"{\"a\":1.}", 7},
        {"{\"a\":-}", 6},
        {"{\"a\":1e}", 7},
        {"{\"a\":tru}", 8},
        {"{\"a\":nul }", 8},
        {"{,}", 1},
        {"{\"a\":1,}", 7},
        {"{\"a\":[1,]}", 8},
        {"{\"a\":[1}", 7},
        {"{\"a\":\"\x01\"}", 6},  /* control characters must be escaped */
        {"{\"a\":\"\\x\"}", 7},
        {"{\"a\":\"\\u12g4\"}", 10},
        {"{\"a\":\"\\ud800\"}", 12}, /* a high surrogate alone */
        {"{\"a\":\"\\udc00\"}", 9}, /* a low one alone: refused at its c */
        {"{\"a\":\"\\ud800\\n\"}", 13},
        {"{\"a\":\"\\ud800\\u0041\"}", 14},
        {"{1:2}", 1},
        {"{}}", 2},             /* nothing after the object */
        {"{} ", 2},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bool done;
        const int at = feed_bytes(bad[i].text, strlen(bad[i].text), &done);
        cr_assert_eq(at, bad[i].at, "'%s': refused at %d, expected %d", bad[i].text, at,
                     bad[i].at);
    }
}

Test(json_mode, depth_and_whitespace_are_bounded)
{
    char t[512];
    int n = 0;
    t[n++] = '{';
    t[n++] = '"';
    t[n++] = '"';
    t[n++] = ':';
    for (int d = 1; d < SAMPLER_JSON_MAX_DEPTH; d++)
        t[n++] = '[';
    t[n] = 0;
    bool done;
    cr_assert_eq(feed_bytes(t, (size_t)n, &done), -1, "depth %d refused", SAMPLER_JSON_MAX_DEPTH);
    t[n++] = '[';
    cr_assert_eq(feed_bytes(t, (size_t)n, &done), n - 1, "depth %d accepted",
                 SAMPLER_JSON_MAX_DEPTH + 1);

    n = 0;
    t[n++] = '{';
    for (int i = 0; i < SAMPLER_JSON_MAX_WS; i++)
        t[n++] = i % 2 ? ' ' : '\n';
    cr_assert_eq(feed_bytes(t, (size_t)n, &done), -1);
    t[n++] = ' ';
    cr_assert_eq(feed_bytes(t, (size_t)n, &done), n - 1, "whitespace run over the bound");
    /* a run ends at any other byte, and spaces inside strings do not count */
    n = 0;
    t[n++] = '{';
    t[n++] = '"';
    for (int i = 0; i < 2 * SAMPLER_JSON_MAX_WS; i++)
        t[n++] = ' ';
    t[n++] = '"';
    for (int i = 0; i < SAMPLER_JSON_MAX_WS; i++)
        t[n++] = ' ';
    t[n++] = ':';
    for (int i = 0; i < SAMPLER_JSON_MAX_WS; i++)
        t[n++] = ' ';
    t[n++] = '1';
    t[n++] = '}';
    t[n] = 0;
    cr_assert(whole(t));
}

/* ---- differential: generated objects and mutations against jansson ---- */

static uint64_t rng = 88172645463325252ull;
static unsigned rnd(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

typedef struct {
    char b[4096];
    size_t n;
} gen_t;

static void put(gen_t *g, const char *s)
{
    const size_t k = strlen(s);
    if (g->n + k < sizeof g->b)
        memcpy(g->b + g->n, s, k), g->n += k;
}

static void ws(gen_t *g)
{
    static const char *const w[] = {"", "", " ", "\n  ", "\t", "\r\n"};
    put(g, w[rnd(6)]);
}

static void gen_string(gen_t *g)
{
    static const char *const parts[] = {"a", "key", " ", "\\\"", "\\\\", "\\n", "\\u00e9",
                                        "\\ud83d\\ude00", "\\/", "x y", "{", "]", ":"};
    put(g, "\"");
    for (unsigned i = rnd(4); i > 0; i--)
        put(g, parts[rnd(sizeof parts / sizeof parts[0])]);
    put(g, "\"");
}

static void gen_value(gen_t *g, int depth);

static void gen_object(gen_t *g, int depth)
{
    put(g, "{");
    const unsigned n = depth > 3 ? 0 : rnd(4);
    for (unsigned i = 0; i < n; i++) {
        ws(g);
        gen_string(g);
        ws(g);
        put(g, ":");
        ws(g);
        gen_value(g, depth + 1);
        ws(g);
        if (i + 1 < n)
            put(g, ",");
    }
    put(g, "}");
}

static void gen_value(gen_t *g, int depth)
{
    static const char *const scalars[] = {"0", "-1", "12", "3.5", "-0.25e3", "7E+2", "true",
                                          "false", "null"};
    switch (rnd(depth > 3 ? 2 : 4)) {
    case 0: put(g, scalars[rnd(sizeof scalars / sizeof scalars[0])]); break;
    case 1: gen_string(g); break;
    case 2: gen_object(g, depth); break;
    default: {
        put(g, "[");
        const unsigned n = rnd(4);
        for (unsigned i = 0; i < n; i++) {
            ws(g);
            gen_value(g, depth + 1);
            ws(g);
            if (i + 1 < n)
                put(g, ",");
        }
        put(g, "]");
    }
    }
}

static bool jansson_object(const char *b, size_t n)
{
    json_error_t e;
    json_t *v = json_loadb(b, n, JSON_ALLOW_NUL, &e);
    const bool ok = v && json_is_object(v);
    json_decref(v);
    return ok;
}

Test(json_mode, agrees_with_jansson_on_generated_objects_and_mutations)
{
    static const char mut[] = "{}[]\":,0123456789.eE+-tfnulrsa \\\n\x01/";
    int agreed = 0, mutated_valid = 0;
    for (int it = 0; it < 3000; it++) {
        gen_t g = {.n = 0};
        ws(&g);
        gen_object(&g, 0);
        bool done;
        cr_assert(feed_bytes(g.b, g.n, &done) < 0 && done, "generated '%.*s' refused",
                  (int)g.n, g.b);
        cr_assert(jansson_object(g.b, g.n));
        /* one byte changed (ASCII only: the recogniser, like the sampler's
         * text, leaves UTF-8 checks to the detokenizer) */
        const size_t at = rnd((unsigned)g.n);
        g.b[at] = mut[rnd(sizeof mut - 1)];
        bool ours = feed_bytes(g.b, g.n, &done) < 0 && done;
        bool theirs = jansson_object(g.b, g.n);
        cr_assert_eq(ours, theirs, "'%.*s': ours %d, jansson %d", (int)g.n, g.b, ours, theirs);
        agreed++;
        mutated_valid += theirs;
        /* every prefix of a valid text is accepted */
        if (theirs)
            for (size_t k = 0; k < g.n; k++)
                cr_assert(feed_bytes(g.b, k, &done) < 0 && !done);
    }
    cr_assert(mutated_valid > 100 && mutated_valid < agreed - 100, "%d of %d mutations valid",
              mutated_valid, agreed);
}

/* ---- logit bias ---- */

Test(json_mode, logit_bias_is_added_before_the_draw)
{
    sampler_params_t p = sampler_params_default();
    p.temp = 0;
    p.n_bias = 2;
    p.bias_id[0] = 3;
    p.bias[0] = 5;
    p.bias_id[1] = 0;
    p.bias[1] = -100;
    sampler_t *s = NULL;
    cr_assert_eq(sampler_new(&p, 4, &s), ECS_OK, "%s", ecs_errmsg());
    float l[4] = {10, 6, 2, 1};
    int32_t t = -1;
    cr_assert_eq(sampler_sample(s, l, &t), ECS_OK);
    cr_assert_eq(t, 1, "token 0 banned, token 3 at 6 ties 1 and loses on id: got %d", t);
    cr_assert_eq(l[3], 6.0f);
    sampler_free(s);

    p.bias_id[1] = 4; /* outside a vocabulary of 4 */
    cr_assert_eq(sampler_new(&p, 4, &s), ECS_ERR_RANGE);
    p.bias_id[1] = 2;
    p.bias[1] = NAN;
    cr_assert_eq(sampler_new(&p, 4, &s), ECS_ERR_INVAL);
    p.bias[1] = 0;
    p.n_bias = SAMPLER_MAX_BIAS + 1;
    cr_assert_eq(sampler_new(&p, 4, &s), ECS_ERR_INVAL);
}

/* ---- JSON Schema (response_format json_schema) ---- */

static sampler_schema_t *schema(const char *text)
{
    sampler_schema_t *s = NULL;
    cr_assert_eq(sampler_schema_new(text, strlen(text), &s), ECS_OK, "%s: %s", text, ecs_errmsg());
    return s;
}

/* Whether text is one complete object that s accepts, fed byte by byte
 * (every prefix accepted on the way). */
static bool follows(const sampler_schema_t *s, const char *text)
{
    sampler_json_t j;
    sampler_json_init_schema(&j, s);
    const size_t n = strlen(text);
    for (size_t i = 0; i < n; i++)
        if (!sampler_json_feed(&j, text + i, 1) || (i + 1 < n && sampler_json_done(&j)))
            return false;
    return sampler_json_done(&j);
}

Test(json_schema, objects_types_required_and_extra_properties)
{
    sampler_schema_t *s = schema(
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"age\":{\"type\":\"integer\"},\"score\":{\"type\":\"number\"},"
        "\"ok\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
        "\"nick\":{\"type\":[\"string\",\"null\"]}},"
        "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}");
    cr_assert(follows(s, "{\"name\":\"Ada\",\"age\":36}"));
    cr_assert(follows(s, "{ \"age\" : 36 , \"name\" : \"Ada\", \"tags\": [\"a\", \"b\"], \"nick\": null }"));
    cr_assert(follows(s, "{\"name\":\"x\",\"age\":-1,\"score\":2.5e3,\"ok\":true,\"nick\":\"y\",\"tags\":[]}"));
    cr_assert(!follows(s, "{\"name\":\"Ada\"}"), "a required property missing");
    cr_assert(!follows(s, "{\"name\":\"Ada\",\"age\":36.5}"), "integer with a fraction");
    cr_assert(!follows(s, "{\"name\":\"Ada\",\"age\":3e1}"), "integer with an exponent");
    cr_assert(!follows(s, "{\"name\":1,\"age\":1}"), "a number for a string");
    cr_assert(!follows(s, "{\"name\":\"a\",\"age\":1,\"x\":1}"), "an extra property");
    cr_assert(!follows(s, "{\"name\":\"a\",\"age\":1,\"name\":\"b\"}"), "a property twice");
    cr_assert(!follows(s, "{\"nam\":\"a\",\"age\":1}"), "a prefix of a name");
    cr_assert(!follows(s, "{\"name\":\"a\",\"age\":1,\"tags\":[1]}"), "an item of the wrong type");
    cr_assert(!follows(s, "{\"name\":\"a\",\"age\":1,\"ok\":null}"), "null for a boolean");
    cr_assert(!follows(s, "[]"));
    sampler_schema_free(s);
    /* additionalProperties absent: other keys take any value */
    s = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}");
    cr_assert(follows(s, "{\"zz\":{\"deep\":[1,{\"x\":null}]},\"a\":2,\"b\":\"s\"}"));
    cr_assert(!follows(s, "{\"a\":\"s\"}"));
    cr_assert(!follows(s, "{\"a\":1,\"a\":\"s\"}"), "a listed property again as another");
    cr_assert(follows(s, "{\"a\":1,\"aa\":\"s\"}"));
    sampler_schema_free(s);
}

Test(json_schema, enums_consts_unions_and_refs)
{
    sampler_schema_t *s = schema(
        "{\"type\":\"object\",\"properties\":{"
        "\"color\":{\"enum\":[\"red\",\"green\",\"re\\\"d\"]},\"n\":{\"enum\":[1,10,2.5,0.1,-1e-7]},"
        "\"k\":{\"const\":\"fixed\"},\"v\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"number\"},"
        "{\"type\":\"null\"}]},\"node\":{\"$ref\":\"#/$defs/node\"}},"
        "\"required\":[\"color\"],\"additionalProperties\":false,"
        "\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/node\"}}},\"additionalProperties\":false}}}");
    cr_assert(follows(s, "{\"color\":\"green\"}"));
    cr_assert(follows(s, "{\"color\":\"re\\\"d\",\"n\":10,\"k\":\"fixed\",\"v\":null}"));
    cr_assert(follows(s, "{\"color\":\"red\",\"n\":2.5,\"v\":\"x\"}"));
    cr_assert(follows(s, "{\"color\":\"red\",\"n\":0.1}"), "a real as written, not %.17g");
    cr_assert(follows(s, "{\"color\":\"red\",\"n\":-1e-07}"));
    cr_assert(follows(s, "{\"color\":\"red\",\"node\":{\"kids\":[{\"kids\":[]},{}]}}"));
    cr_assert(!follows(s, "{\"color\":\"blue\"}"));
    cr_assert(!follows(s, "{\"color\":\"gree\"}"), "a prefix of a value");
    cr_assert(!follows(s, "{\"color\":\"greenish\"}"));
    cr_assert(!follows(s, "{\"color\":\"red\",\"n\":100}"));
    cr_assert(!follows(s, "{\"color\":\"red\",\"n\":2}"));
    cr_assert(!follows(s, "{\"color\":\"red\",\"v\":true}"));
    cr_assert(!follows(s, "{\"color\":\"red\",\"node\":{\"kids\":[{\"x\":1}]}}"));
    sampler_schema_free(s);
    /* a $ref to a $ref is followed to the schema it names */
    s = schema("{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/a\"}},"
               "\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"type\":\"string\"}}}");
    cr_assert(follows(s, "{\"x\":\"s\"}"));
    cr_assert(!follows(s, "{\"x\":1}"));
    sampler_schema_free(s);
    sampler_schema_t *bad = NULL;
    const char *cyc = "{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/a\"}},"
                      "\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}}}";
    cr_assert_eq(sampler_schema_new(cyc, strlen(cyc), &bad), ECS_ERR_UNSUPPORTED);
    cr_assert(strstr(ecs_errmsg(), "cycle"), "%s", ecs_errmsg());
}

/* Objects told apart by a tag, the shape of a call to one of several
 * tools: {"name": const, "arguments": that tool's parameters}. */
#define TAGGED(NAME, ARGS)                                                                      \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"" NAME "\"},\"arguments\":" ARGS \
    "},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false}"
#define ARGS_CITY "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],\"additionalProperties\":false}"
#define ARGS_N "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"],\"additionalProperties\":false}"
#define TAGGED_TOOLS "{\"anyOf\":[" TAGGED("get", ARGS_CITY) "," TAGGED("getx", ARGS_N) "]}"

Test(json_schema, discriminated_unions_follow_the_alternative_their_tag_names)
{
    sampler_schema_t *s = schema(TAGGED_TOOLS);
    cr_assert(follows(s, "{\"name\":\"get\",\"arguments\":{\"city\":\"Oslo\"}}"));
    cr_assert(follows(s, "{\"name\": \"getx\", \"arguments\": {\"n\": 3}}"));
    cr_assert(!follows(s, "{\"name\":\"get\",\"arguments\":{\"n\":3}}"), "get's arguments");
    cr_assert(!follows(s, "{\"name\":\"getx\",\"arguments\":{\"city\":\"x\"}}"));
    cr_assert(!follows(s, "{\"name\":\"ge\",\"arguments\":{}}"), "a tag's prefix");
    cr_assert(!follows(s, "{\"name\":\"put\"}"));
    cr_assert(!follows(s, "{\"arguments\":{\"n\":3},\"name\":\"getx\"}"), "the tag comes first");
    cr_assert(!follows(s, "{}"));
    cr_assert(!follows(s, "{\"name\":\"get\"}"), "the alternative's required arguments");
    cr_assert(!follows(s, "{\"name\":\"get\",\"arguments\":{\"city\":\"x\"},\"name\":\"get\"}"));
    sampler_schema_free(s);
    /* inside a property, beside other types, and an alternative shared
     * through $defs keeps its meaning where it stands alone */
    s = schema("{\"type\":\"object\",\"properties\":{\"one\":{\"$ref\":\"#/$defs/g\"},"
               "\"u\":{\"anyOf\":[{\"$ref\":\"#/$defs/g\"},{\"type\":\"null\"}," TAGGED("getx", ARGS_N)
               "]}},\"additionalProperties\":false,\"$defs\":{\"g\":" TAGGED("get", ARGS_CITY) "}}");
    cr_assert(follows(s, "{\"u\":null,\"one\":{\"name\":\"get\",\"arguments\":{\"city\":\"a\"}}}"));
    cr_assert(follows(s, "{\"u\":{\"name\":\"getx\",\"arguments\":{\"n\":1}}}"));
    cr_assert(follows(s, "{\"u\":{\"name\":\"get\",\"arguments\":{\"city\":\"a\"}},\"one\":"
                         "{\"name\":\"get\",\"arguments\":{\"city\":\"b\"}}}"));
    cr_assert(!follows(s, "{\"one\":{\"name\":\"getx\",\"arguments\":{\"n\":1}}}"));
    cr_assert(!follows(s, "{\"u\":{\"name\":\"getx\",\"arguments\":{\"n\":1.5}}}"));
    cr_assert(!follows(s, "{\"u\":1}"));
    sampler_schema_free(s);
}

Test(json_schema, unsupported_or_bad_schemas_are_refused_by_name)
{
    static const struct {
        const char *schema, *word;
    } bad[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":3}}}", "minLength"},
        {"{\"type\":\"string\"}", "root"},
        {"{\"type\":\"object\",\"required\":[\"a\"]}", "required property 'a'"},
        {"{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"properties\":{}}]}", "discriminated"},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"enum\":[\"a\"]}]}", "differ"},
        /* a tag must come first, be required and differ between alternatives */
        {"{\"anyOf\":[{\"properties\":{\"x\":{},\"t\":{\"const\":\"a\"}},\"required\":[\"t\"]},"
         "{\"properties\":{\"t\":{\"const\":\"b\"}},\"required\":[\"t\"]}]}", "discriminated"},
        {"{\"anyOf\":[{\"properties\":{\"t\":{\"const\":\"a\"}}},"
         "{\"properties\":{\"t\":{\"const\":\"b\"}},\"required\":[\"t\"]}]}", "discriminated"},
        {"{\"anyOf\":[{\"properties\":{\"t\":{\"const\":\"a\"}},\"required\":[\"t\"]},"
         "{\"properties\":{\"u\":{\"const\":\"b\"}},\"required\":[\"u\"]}]}", "discriminated"},
        {"{\"anyOf\":[{\"properties\":{\"t\":{\"const\":\"a\"}},\"required\":[\"t\"]},"
         "{\"properties\":{\"t\":{\"enum\":[\"a\"]}},\"required\":[\"t\"]}]}", "same tag"},
        {"{\"anyOf\":[{\"properties\":{\"t\":{\"const\":1}},\"required\":[\"t\"]},"
         "{\"properties\":{\"t\":{\"const\":2}},\"required\":[\"t\"]}]}", "discriminated"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/nope\"}}}", "$ref"},
        {"{\"type\":\"objekt\"}", "unknown type"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[[1]]}}}", "enum"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sampler_schema_t *s = NULL;
        cr_assert_neq(sampler_schema_new(bad[i].schema, strlen(bad[i].schema), &s), ECS_OK, "%s",
                      bad[i].schema);
        cr_assert_null(s);
        cr_assert(strstr(ecs_errmsg(), bad[i].word), "%s: '%s' lacks '%s'", bad[i].schema,
                  ecs_errmsg(), bad[i].word);
    }
}

Test(json_schema, free_strings_only_take_the_plain_token_shortcut)
{
    sampler_schema_t *s = schema("{\"type\":\"object\",\"properties\":{\"e\":{\"enum\":[\"ab\"]},"
                                 "\"t\":{\"type\":\"string\"}},\"additionalProperties\":false}");
    sampler_json_t j;
    sampler_json_init_schema(&j, s);
    cr_assert(sampler_json_feed(&j, "{\"", 2));
    cr_assert(!sampler_json_in_string(&j), "a key is checked byte by byte");
    cr_assert(sampler_json_feed(&j, "t\":\"", 4));
    cr_assert(sampler_json_in_string(&j), "a free string value");
    cr_assert(sampler_json_feed(&j, "x\",\"e\":\"", 8));
    cr_assert(!sampler_json_in_string(&j), "an enum's string");
    sampler_json_t t = j;
    cr_assert(!sampler_json_feed(&t, "x", 1));
    cr_assert(sampler_json_feed(&j, "ab\"}", 4) && sampler_json_done(&j));
    sampler_schema_free(s);
    /* other properties allowed: a key is free text once no listed name fits */
    s = schema("{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}}}");
    sampler_json_init_schema(&j, s);
    cr_assert(sampler_json_feed(&j, "{\"a", 3));
    cr_assert(!sampler_json_in_string(&j), "'a' may still become 'ab'");
    cr_assert(sampler_json_feed(&j, "x", 1));
    cr_assert(sampler_json_in_string(&j), "'ax' is another property's name");
    const char *rest = "\":\"v\",\"ab\":1}";
    cr_assert(sampler_json_feed(&j, rest, strlen(rest)) && sampler_json_done(&j));
    sampler_schema_free(s);
}

/* Random walks, one byte at a time among the bytes each state takes: no
 * reachable state may take none before the object is complete (the
 * scheduler would find every token masked). Byte-level vocabularies hold
 * every single byte as a token, so bytes are what matters. */
Test(json_schema, no_dead_ends_on_random_walks)
{
    static const char *const schemas[] = {
        NULL,
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"enum\":[\"x\",\"xy\",1,"
        "true,null]}},\"required\":[\"a\"],\"additionalProperties\":false}",
        "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}},"
        "\"s\":{\"type\":[\"string\",\"null\"]},\"c\":{\"const\":\"q\\\"\"}},\"additionalProperties\":false}",
        "{\"type\":\"object\",\"properties\":{\"only\":{\"type\":\"boolean\"}},\"required\":[\"only\"],"
        "\"additionalProperties\":false}",
        "{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"object\","
        "\"properties\":{\"y\":{\"type\":\"string\"}}}]}},\"additionalProperties\":{\"type\":\"integer\"}}",
        TAGGED_TOOLS,
    };
    for (size_t si = 0; si < sizeof schemas / sizeof schemas[0]; si++) {
        sampler_schema_t *s = schemas[si] ? schema(schemas[si]) : NULL;
        int completed = 0;
        for (int walk = 0; walk < 300; walk++) {
            sampler_json_t j;
            sampler_json_init_schema(&j, s);
            char path[1024];
            int n = 0;
            while (!sampler_json_done(&j) && n < (int)sizeof path - 1) {
                unsigned char ok[256];
                int k = 0;
                for (int b = 0; b < 128; b++) { /* ASCII: jansson checks UTF-8, we do not */
                    sampler_json_t t = j;
                    const char c = (char)b;
                    if (sampler_json_feed(&t, &c, 1))
                        ok[k++] = (unsigned char)b;
                }
                path[n] = 0;
                cr_assert(k > 0, "schema %zu: dead end after '%s'", si, path);
                /* prefer structure over long strings so walks finish */
                unsigned char pick = ok[rnd((unsigned)k)];
                for (int i = 0; i < k && rnd(4) == 0; i++)
                    if (strchr("\"}],:0123456789tfn{[", ok[i]) && ok[i])
                        pick = ok[i];
                path[n++] = (char)pick;
                cr_assert(sampler_json_feed(&j, (const char *)&pick, 1));
            }
            completed += sampler_json_done(&j);
            if (sampler_json_done(&j) && !schemas[si]) {
                path[n] = 0;
                json_error_t e;
                json_t *v = json_loadb(path, (size_t)n, 0, &e);
                /* numbers jansson cannot hold are still JSON */
                cr_assert(json_is_object(v) || strstr(e.text, "overflow") ||
                          strstr(e.text, "too big"), "'%s': %s", path, e.text);
                json_decref(v);
            }
        }
        cr_assert(completed > 0, "schema %zu: no walk completed", si);
        sampler_schema_free(s);
    }
}
