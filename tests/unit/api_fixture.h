/* api_fixture.h - request-parsing helpers of the serving front's tests
 * (test_api.c, test_api_tools.c): parse a body, expect an error whose
 * message names the mistake. */
#ifndef ECS_TEST_API_FIXTURE_H
#define ECS_TEST_API_FIXTURE_H

#include <criterion/criterion.h>
#include <string.h>

#include "coordinator/api/api_int.h"

static char err[512];

static inline ecs_err_t parse(api_route_t route, const char *json, api_req_t *r)
{
    err[0] = '\0';
    return api_req_parse(route, json, strlen(json), r, err, sizeof err);
}

static inline void expect_error(api_route_t route, const char *json, ecs_err_t code,
                                const char *needle)
{
    api_req_t r;
    cr_assert_eq(parse(route, json, &r), code, "%s -> %s", json, err);
    cr_assert(strstr(err, needle), "'%s' not in '%s'", needle, err);
}

#endif
