/* json_int.h - a compiled JSON Schema (json_schema.c builds it, json.c's
 * recogniser walks it). Every schema is a node; a value is checked from
 * its first byte on: the byte's class (object, array, string, number,
 * true, false, null) picks the concrete node the value must match (alt),
 * so a union (anyOf, a list of types) is resolved at once and never
 * needs backtracking; several object alternatives are told apart by
 * their first property's constant (a tag), read before anything else. */
#ifndef ECS_SAMPLER_JSON_INT_H
#define ECS_SAMPLER_JSON_INT_H

#include <stdint.h>

#include "coordinator/sampler/sampler.h"

#define JS_NONE 0xFFFF

/* A value's first byte: its class. */
enum { JC_OBJ, JC_ARR, JC_STR, JC_NUM, JC_TRUE, JC_FALSE, JC_NULL, JC_N };

static inline int js_class_of(unsigned char c)
{
    return c == '{' ? JC_OBJ : c == '[' ? JC_ARR : c == '"' ? JC_STR : c == 't' ? JC_TRUE
           : c == 'f' ? JC_FALSE : c == 'n' ? JC_NULL : JC_NUM;
}

/* What a concrete node accepts. */
enum { JK_ANY, JK_OBJECT, JK_ARRAY, JK_STRING, JK_NUMBER, JK_INTEGER, JK_BOOL, JK_NULL, JK_ENUM,
       JK_UNION };

typedef struct {
    uint8_t kind;
    uint16_t alt[JC_N]; /* the concrete node of a value of each class; JS_NONE: refused */
    uint16_t first, n;  /* object: its properties, enum: its values (schema strs) */
    uint64_t required;  /* object: properties that must appear */
    uint16_t extra;     /* object: the node of other properties' values; JS_NONE: none */
    uint16_t items;     /* array: the node of its items */
} js_node_t;

/* A property (name as JSON text between its quotes, and its value's node)
 * or an enum value (the value's JSON text; node: JS_NONE, or for a
 * discriminated union's tag the object node its value selects). */
typedef struct {
    const char *text;
    uint16_t len;
    uint16_t node;
} js_str_t;

struct sampler_schema {
    js_node_t *nodes;
    int n_nodes;
    js_str_t *strs;
    int n_strs;
    char **texts; /* what strs point into */
    int n_texts;
    uint16_t root;
};

#endif
