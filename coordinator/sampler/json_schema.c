/* json_schema.c - a JSON Schema (response_format json_schema) compiled into
 * the node table json.c's recogniser walks (json_int.h). The subset is
 * OpenAI's structured outputs': type (one or a list), properties,
 * required, additionalProperties, items, enum and const of scalars, anyOf /
 * oneOf whose alternatives differ in JSON type or are objects told apart
 * by a first property of constant string value, $ref into $defs /
 * definitions (recursion included); annotations (description, title, ...)
 * are ignored. Any other keyword is refused with its name rather than
 * ignored: a constraint the output would silently break is worse than an
 * error. Bounded: SAMPLER_SCHEMA_MAX_NODES nodes, 64 properties per object
 * and 64 values per enum (the recogniser's candidate sets are 64-bit). */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/sampler/json_int.h"

#define MAX_STRS 4096
#define MAX_TEXT 1024

typedef struct {
    sampler_schema_t *s;
    json_t *root;
    const json_t *memo_key[SAMPLER_SCHEMA_MAX_NODES];
    uint16_t memo_node[SAMPLER_SCHEMA_MAX_NODES];
    int n_memo;
    int nest;
} build_t;

static ecs_err_t refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static ecs_err_t refuse(const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ecs_error(ECS_ERR_UNSUPPORTED, "json_schema: %s", msg);
}

static ecs_err_t new_node(build_t *b, int kind, uint16_t *out)
{
    sampler_schema_t *s = b->s;
    if (s->n_nodes >= SAMPLER_SCHEMA_MAX_NODES)
        return refuse("more than %d schema nodes", SAMPLER_SCHEMA_MAX_NODES);
    js_node_t *n = &s->nodes[s->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    for (int c = 0; c < JC_N; c++)
        n->alt[c] = JS_NONE;
    n->extra = n->items = JS_NONE;
    *out = (uint16_t)s->n_nodes++;
    return ECS_OK;
}

/* A node that takes any value. */
static ecs_err_t new_any(build_t *b, uint16_t *out)
{
    ecs_err_t rc = new_node(b, JK_ANY, out);
    for (int c = 0; rc == ECS_OK && c < JC_N; c++)
        b->s->nodes[*out].alt[c] = *out;
    return rc;
}

/* A string for the tables (JSON text of a value, or a property's name as
 * it appears between quotes). */
static ecs_err_t add_str(build_t *b, char *text, uint16_t node)
{
    sampler_schema_t *s = b->s;
    const size_t len = text ? strlen(text) : 0;
    if (!text)
        return ecs_error(ECS_ERR_NOMEM, "json_schema: out of memory");
    if (s->n_strs >= MAX_STRS || len > MAX_TEXT) {
        free(text);
        return refuse(s->n_strs >= MAX_STRS ? "more than %d names and values" :
                      "a name or value over %d bytes", s->n_strs >= MAX_STRS ? MAX_STRS : MAX_TEXT);
    }
    s->texts[s->n_texts++] = text;
    s->strs[s->n_strs++] = (js_str_t){text, (uint16_t)len, node};
    return ECS_OK;
}

static ecs_err_t build(build_t *b, json_t *sch, uint16_t *out);

/* A scalar's JSON text as a model would write it: a real in the fewest
 * digits that read back the same (jansson writes 0.1 as
 * 0.10000000000000001). */
static char *value_text(json_t *v)
{
    if (!json_is_real(v))
        return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    const double d = json_real_value(v);
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    return strdup(buf);
}

/* enum / const: scalars only, each as its compact JSON text. */
static ecs_err_t build_enum(build_t *b, json_t *vals, uint16_t self)
{
    js_node_t *n = &b->s->nodes[self];
    n->first = (uint16_t)b->s->n_strs;
    const size_t cnt = json_is_array(vals) ? json_array_size(vals) : 1;
    if (cnt < 1 || cnt > 64)
        return refuse("an enum of %zu values (1 to 64)", cnt);
    for (size_t i = 0; i < cnt; i++) {
        json_t *v = json_is_array(vals) ? json_array_get(vals, i) : vals;
        if (json_is_object(v) || json_is_array(v))
            return refuse("enum and const values must be strings, numbers, booleans or null");
        ecs_err_t rc = add_str(b, value_text(v), JS_NONE);
        if (rc != ECS_OK)
            return rc;
        b->s->nodes[self].alt[js_class_of((unsigned char)b->s->strs[b->s->n_strs - 1].text[0])] = self;
    }
    b->s->nodes[self].n = (uint16_t)cnt;
    return ECS_OK;
}

static ecs_err_t build_object(build_t *b, json_t *sch, uint16_t self)
{
    json_t *props = json_object_get(sch, "properties"), *req = json_object_get(sch, "required");
    json_t *extra = json_object_get(sch, "additionalProperties");
    if (props && !json_is_object(props))
        return refuse("'properties' must be an object");
    if (json_object_size(props) > 64)
        return refuse("an object of %zu properties (at most 64)", json_object_size(props));
    const uint16_t first = (uint16_t)b->s->n_strs;
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) {
        /* the name as JSON text, without its quotes */
        json_t *ks = json_string(k);
        char *q = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (q && strlen(q) >= 2) {
            const size_t l = strlen(q);
            memmove(q, q + 1, l - 2);
            q[l - 2] = 0;
        }
        ecs_err_t rc = add_str(b, q, JS_NONE);
        if (rc != ECS_OK)
            return rc;
    }
    const uint16_t n = (uint16_t)(b->s->n_strs - first);
    b->s->nodes[self].first = first;
    b->s->nodes[self].n = n;
    int i = 0;
    json_object_foreach(props, k, v) {
        uint16_t node;
        ecs_err_t rc = build(b, v, &node);
        if (rc != ECS_OK)
            return rc;
        b->s->strs[first + i++].node = node;
    }
    uint64_t required = 0;
    for (size_t r = 0; req && r < json_array_size(req); r++) {
        const char *name = json_string_value(json_array_get(req, r));
        int at = -1, j = 0;
        json_object_foreach(props, k, v) {
            if (name && !strcmp(k, name))
                at = j;
            j++;
        }
        if (at < 0)
            return refuse("required property '%.64s' is not in 'properties'", name ? name : "?");
        required |= 1ull << at;
    }
    if (req && !json_is_array(req))
        return refuse("'required' must be an array of names");
    b->s->nodes[self].required = required;
    if (extra && json_is_false(extra))
        return ECS_OK;
    uint16_t en;
    ecs_err_t rc = extra && !json_is_true(extra) ? build(b, extra, &en) : new_any(b, &en);
    b->s->nodes[self].extra = en;
    return rc;
}

/* One concrete node of type t (the schema's other keywords apply to it). */
static ecs_err_t build_typed(build_t *b, json_t *sch, const char *t, uint16_t *out)
{
    static const struct {
        const char *name;
        int kind, c1, c2;
    } types[] = {
        {"object", JK_OBJECT, JC_OBJ, -1}, {"array", JK_ARRAY, JC_ARR, -1},
        {"string", JK_STRING, JC_STR, -1}, {"number", JK_NUMBER, JC_NUM, -1},
        {"integer", JK_INTEGER, JC_NUM, -1}, {"boolean", JK_BOOL, JC_TRUE, JC_FALSE},
        {"null", JK_NULL, JC_NULL, -1},
    };
    size_t i = 0;
    while (i < sizeof types / sizeof types[0] && (!t || strcmp(t, types[i].name)))
        i++;
    if (i == sizeof types / sizeof types[0])
        return refuse("unknown type '%.32s'", t ? t : "?");
    ecs_err_t rc = new_node(b, types[i].kind, out);
    if (rc != ECS_OK)
        return rc;
    b->s->nodes[*out].alt[types[i].c1] = *out;
    if (types[i].c2 >= 0)
        b->s->nodes[*out].alt[types[i].c2] = *out;
    if (types[i].kind == JK_OBJECT)
        return build_object(b, sch, *out);
    if (types[i].kind == JK_ARRAY) {
        json_t *items = json_object_get(sch, "items");
        uint16_t it;
        rc = items ? build(b, items, &it) : new_any(b, &it);
        b->s->nodes[*out].items = it;
    }
    return rc;
}

/* A union: each class goes to the one alternative that takes it (objects
 * aside: build_switch tells several apart). */
static ecs_err_t merge_alt(build_t *b, uint16_t self, uint16_t alt)
{
    for (int c = 0; c < JC_N; c++) {
        const uint16_t a = b->s->nodes[alt].alt[c];
        if (a == JS_NONE || c == JC_OBJ)
            continue;
        if (b->s->nodes[self].alt[c] != JS_NONE)
            return refuse("anyOf / oneOf / type alternatives must differ in JSON type (two take "
                          "the same kind of value)");
        b->s->nodes[self].alt[c] = a;
    }
    return ECS_OK;
}

/* The tag of a union's object alternative: its first property, required,
 * whose value is one string constant. */
static const js_str_t *switch_tag(const build_t *b, uint16_t obj)
{
    const js_node_t *o = &b->s->nodes[obj];
    if (o->kind != JK_OBJECT || o->n < 1 || !(o->required & 1))
        return NULL;
    const js_str_t *tag = &b->s->strs[o->first];
    const js_node_t *v = tag->node == JS_NONE ? NULL : &b->s->nodes[tag->node];
    return v && v->kind == JK_ENUM && v->n == 1 && b->s->strs[v->first].text[0] == '"' ? tag
                                                                                       : NULL;
}

/* Several object alternatives: told apart by their tag's value (a
 * discriminated union, as a list of tool calls is: {"name": const, ...}).
 * The union's objects go to a node that takes only the tag; its value's
 * enum names, for each constant, the alternative the object becomes once
 * the value is read (json.c: sch_scalar_end). The recogniser never
 * backtracks, so the tag must be the first property written. */
static ecs_err_t build_switch(build_t *b, const uint16_t *objs, int n, uint16_t self)
{
    sampler_schema_t *s = b->s;
    const js_str_t *tag0 = switch_tag(b, objs[0]);
    for (int i = 0; i < n; i++) {
        const js_str_t *t = switch_tag(b, objs[i]);
        if (!t || t->len != tag0->len || memcmp(t->text, tag0->text, t->len))
            return refuse("anyOf / oneOf alternatives that are objects must each start with the "
                          "same required property whose value is one string constant (a "
                          "discriminated union), told apart by it");
        const js_str_t *v = &s->strs[s->nodes[t->node].first];
        for (int k = 0; k < i; k++) {
            const js_str_t *w = &s->strs[s->nodes[switch_tag(b, objs[k])->node].first];
            if (v->len == w->len && !memcmp(v->text, w->text, v->len))
                return refuse("two anyOf / oneOf object alternatives have the same tag %.64s",
                              v->text);
        }
    }
    uint16_t sw, en;
    ecs_err_t rc = new_node(b, JK_OBJECT, &sw);
    if (rc != ECS_OK || (rc = new_node(b, JK_ENUM, &en)) != ECS_OK)
        return rc;
    s->nodes[en].first = (uint16_t)s->n_strs;
    s->nodes[en].alt[JC_STR] = en;
    for (int i = 0; i < n; i++) {
        const js_str_t *v = &s->strs[s->nodes[switch_tag(b, objs[i])->node].first];
        if ((rc = add_str(b, strdup(v->text), objs[i])) != ECS_OK)
            return rc;
    }
    s->nodes[en].n = (uint16_t)n;
    s->nodes[sw].first = (uint16_t)s->n_strs;
    if ((rc = add_str(b, strdup(tag0->text), en)) != ECS_OK)
        return rc;
    s->nodes[sw].n = 1;
    s->nodes[sw].required = 1;
    s->nodes[sw].alt[JC_OBJ] = sw;
    s->nodes[self].alt[JC_OBJ] = sw;
    return ECS_OK;
}

static bool known_keyword(const char *k)
{
    static const char *const ok[] = {
        "type", "properties", "required", "additionalProperties", "items", "enum", "const",
        "anyOf", "oneOf", "$ref", "$defs", "definitions", "description", "title", "default",
        "$schema", "$id", "examples", "$comment", "strict", "name"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(k, ok[i]))
            return true;
    return false;
}

static ecs_err_t resolve_ref(build_t *b, const char *ref, json_t **out)
{
    if (!strcmp(ref, "#")) {
        *out = b->root;
        return ECS_OK;
    }
    const char *p = !strncmp(ref, "#/$defs/", 8) ? ref + 8 : !strncmp(ref, "#/definitions/", 14) ? ref + 14 : NULL;
    json_t *defs = p ? json_object_get(b->root, ref[2] == '$' ? "$defs" : "definitions") : NULL;
    *out = defs && !strchr(p, '/') ? json_object_get(defs, p) : NULL;
    return *out ? ECS_OK : refuse("$ref '%.64s' (only #, #/$defs/NAME, #/definitions/NAME)", ref);
}

static ecs_err_t build_body(build_t *b, json_t *sch, uint16_t *out)
{
    const char *k;
    json_t *v;
    json_object_foreach(sch, k, v) {
        if (!known_keyword(k))
            return refuse("keyword '%.40s' is not supported (type, properties, required, "
                          "additionalProperties, items, enum, const, anyOf, oneOf, $ref)", k);
    }
    json_t *e = json_object_get(sch, "enum"), *c = json_object_get(sch, "const");
    json_t *any = json_object_get(sch, "anyOf") ? json_object_get(sch, "anyOf") : json_object_get(sch, "oneOf");
    json_t *t = json_object_get(sch, "type");
    ecs_err_t rc;
    if (e || c) {
        if ((rc = new_node(b, JK_ENUM, out)) != ECS_OK)
            return rc;
        return build_enum(b, e ? e : c, *out);
    }
    if (any || json_is_array(t)) {
        json_t *list = any ? any : t;
        if (!json_is_array(list) || json_array_size(list) < 1)
            return refuse("anyOf / oneOf / type lists must be non-empty arrays");
        if (json_array_size(list) > 64)
            return refuse("anyOf / oneOf / type lists of %zu alternatives (at most 64)",
                          json_array_size(list));
        if ((rc = new_node(b, JK_UNION, out)) != ECS_OK)
            return rc;
        const uint16_t self = *out;
        uint16_t objs[64];
        int n_objs = 0;
        for (size_t i = 0; i < json_array_size(list); i++) {
            uint16_t a;
            json_t *x = json_array_get(list, i);
            rc = any ? build(b, x, &a) : build_typed(b, sch, json_string_value(x), &a);
            if (rc != ECS_OK)
                return rc;
            if (b->s->nodes[a].alt[JC_OBJ] != JS_NONE) /* objects: maybe told apart by a tag */
                objs[n_objs++] = b->s->nodes[a].alt[JC_OBJ];
            if ((rc = merge_alt(b, self, a)) != ECS_OK)
                return rc;
        }
        if (n_objs == 1)
            b->s->nodes[self].alt[JC_OBJ] = objs[0];
        return n_objs > 1 ? build_switch(b, objs, n_objs, self) : ECS_OK;
    }
    if (t)
        return build_typed(b, sch, json_string_value(t), out);
    if (json_object_get(sch, "properties"))
        return build_typed(b, sch, "object", out);
    if (json_object_get(sch, "items"))
        return build_typed(b, sch, "array", out);
    return new_any(b, out);
}

static ecs_err_t build(build_t *b, json_t *sch, uint16_t *out)
{
    if (json_is_true(sch)) /* the schema that takes anything */
        return new_any(b, out);
    if (!json_is_object(sch))
        return refuse("a schema must be an object");
    json_t *ref;
    for (int hops = 0; (ref = json_object_get(sch, "$ref")); hops++) { /* a chain of them */
        if (!json_is_string(ref))
            return refuse("'$ref' must be a string");
        if (hops == 64)
            return refuse("a $ref chain of more than 64 (a cycle?)");
        ecs_err_t rc = resolve_ref(b, json_string_value(ref), &sch);
        if (rc != ECS_OK)
            return rc;
        if (!json_is_object(sch))
            return refuse("a $ref to something other than a schema object");
    }
    for (int i = 0; i < b->n_memo; i++) /* a $ref's target, or a recursion */
        if (b->memo_key[i] == sch) {
            *out = b->memo_node[i];
            return ECS_OK;
        }
    if (++b->nest > 64) /* a $ref chain that never reaches a node */
        return refuse("schema nesting over 64");
    /* the node's index is known before its children are built: recursion
     * through $ref finds it in the memo */
    const int slot = b->n_memo < SAMPLER_SCHEMA_MAX_NODES ? b->n_memo++ : -1;
    if (slot < 0)
        return refuse("more than %d schema nodes", SAMPLER_SCHEMA_MAX_NODES);
    b->memo_key[slot] = sch;
    b->memo_node[slot] = (uint16_t)b->s->n_nodes; /* the next new_node's index */
    ecs_err_t rc = build_body(b, sch, out);
    b->memo_node[slot] = *out;
    b->nest--;
    return rc;
}

void sampler_schema_free(sampler_schema_t *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_texts; i++)
        free(s->texts[i]);
    free(s->texts);
    free(s->strs);
    free(s->nodes);
    free(s);
}

ecs_err_t sampler_schema_new(const char *text, size_t len, sampler_schema_t **out)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ecs_error(ECS_ERR_INVAL, "json_schema: not JSON: %s", je.text);
    sampler_schema_t *s = calloc(1, sizeof *s);
    build_t *b = calloc(1, sizeof *b);
    ecs_err_t rc = ECS_ERR_NOMEM;
    if (!s || !b || !(s->nodes = malloc(SAMPLER_SCHEMA_MAX_NODES * sizeof *s->nodes)) ||
        !(s->strs = malloc(MAX_STRS * sizeof *s->strs)) ||
        !(s->texts = malloc(MAX_STRS * sizeof *s->texts))) {
        ecs_error(rc, "json_schema: out of memory");
        goto fail;
    }
    b->s = s;
    b->root = root;
    if ((rc = build(b, root, &s->root)) != ECS_OK)
        goto fail;
    if (s->nodes[s->root].alt[JC_OBJ] == JS_NONE) {
        rc = refuse("the schema's root must take an object");
        goto fail;
    }
    free(b);
    json_decref(root);
    *out = s;
    return ECS_OK;
fail:
    free(b);
    json_decref(root);
    sampler_schema_free(s);
    return rc;
}
