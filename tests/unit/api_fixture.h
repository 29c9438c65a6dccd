/* api_fixture.h - request-parsing helpers of the serving front's tests
 * (test_api.c, test_api_tools.c): parse a body, expect an error whose
 * message names the mistake. */
#ifndef ECS_TEST_API_FIXTURE_H
#define ECS_TEST_API_FIXTURE_H

#include <criterion/criterion.h>
#include <string.h>

#include "coordinator/api/api_int.h"

static char err[512];

/* Tool calls in the form of a template of kind chat. */
static inline ecs_err_t parse_for(api_route_t route, tok_chat_kind_t chat, const char *json,
                                  api_req_t *r)
{
    err[0] = '\0';
    return api_req_parse(route, chat, json, strlen(json), r, err, sizeof err);
}

static inline ecs_err_t parse(api_route_t route, const char *json, api_req_t *r)
{
    return parse_for(route, TOK_CHAT_CHATML, json, r);
}

static inline void expect_error_for(api_route_t route, tok_chat_kind_t chat, const char *json,
                                    ecs_err_t code, const char *needle)
{
    api_req_t r;
    cr_assert_eq(parse_for(route, chat, json, &r), code, "%s -> %s", json, err);
    cr_assert(strstr(err, needle), "'%s' not in '%s'", needle, err);
}

static inline void expect_error(api_route_t route, const char *json, ecs_err_t code,
                                const char *needle)
{
    expect_error_for(route, TOK_CHAT_CHATML, json, code, needle);
}

/* Whether r's compiled schema (JSON mode's recogniser) takes text. */
static inline bool schema_takes(const api_req_t *r, const char *text)
{
    sampler_json_t j;
    sampler_json_init_schema(&j, r->schema);
    return sampler_json_feed(&j, text, strlen(text)) && sampler_json_done(&j);
}

#endif
