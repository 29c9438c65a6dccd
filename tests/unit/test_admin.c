/* test_admin.c - the admin protocol's request decoder: valid requests
 * round-trip through the encoder, every kind of bad one is refused with a
 * message saying what is wrong. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/admin.h"

static ecs_err_t dec(const char *s, admin_req_t *r, char *err)
{
    return admin_req_decode(s, strlen(s), r, err, 256);
}

Test(admin, valid_requests_round_trip)
{
    for (int c = 0; c < ADMIN_N_CMDS; c++) {
        admin_req_t q = {.cmd = (admin_cmd_t)c}, r;
        if (admin_cmd_needs_worker(q.cmd))
            strcpy(q.worker, "gpu-host-3.w1");
        char *s = admin_req_encode(&q), err[256];
        cr_assert_not_null(s);
        cr_assert_eq(dec(s, &r, err), ECS_OK, "%s: %s", s, err);
        cr_assert_eq(r.cmd, q.cmd);
        cr_assert_str_eq(r.worker, q.worker);
        cr_assert_str_eq(admin_cmd_name(r.cmd), admin_cmd_name(q.cmd));
        free(s);
    }
}

Test(admin, bad_requests_say_why)
{
    static const struct {
        const char *in, *why;
    } cases[] = {
        {"", "empty"},
        {"{", "not JSON"},
        {"[1]", "not a JSON object"},
        {"{\"cmd\":\"status\"}", "required"},
        {"{\"v\":2,\"cmd\":\"status\"}", "must be 1"},
        {"{\"v\":1,\"cmd\":\"reboot\"}", "unknown \"cmd\""},
        {"{\"v\":1,\"cmd\":\"drain\"}", "needs \"worker\""},
        {"{\"v\":1,\"cmd\":\"status\",\"worker\":\"w1\"}", "takes no"},
        {"{\"v\":1,\"cmd\":\"drain\",\"worker\":\"w 1\"}", "worker id"},
        {"{\"v\":1,\"cmd\":\"drain\",\"worker\":\"\"}", "worker id"},
        {"{\"v\":1,\"cmd\":\"drain\",\"worker\":7}", "worker id"},
        {"{\"v\":1,\"cmd\":\"drain\",\"worker\":\"w\\u00001\"}", "not JSON"},
        {"{\"v\":1,\"cmd\":\"status\",\"x\":1}", "unknown member"},
        {"{\"v\":1,\"v\":1,\"cmd\":\"status\"}", "not JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        admin_req_t r;
        char err[256] = "";
        cr_assert_eq(dec(cases[i].in, &r, err), ECS_ERR_INVAL, "accepted %s", cases[i].in);
        cr_assert(strstr(err, cases[i].why), "%s: '%s' does not say '%s'", cases[i].in, err,
                  cases[i].why);
        cr_assert_eq(r.worker[0], 0);
    }
    char big[5000];
    memset(big, ' ', sizeof big);
    admin_req_t r;
    char err[256];
    cr_assert_eq(admin_req_decode(big, sizeof big, &r, err, sizeof err), ECS_ERR_INVAL);
    char id[100];
    memset(id, 'a', 64);
    id[64] = 0;
    char req[200];
    snprintf(req, sizeof req, "{\"v\":1,\"cmd\":\"undrain\",\"worker\":\"%s\"}", id);
    cr_assert_eq(dec(req, &r, err), ECS_ERR_INVAL, "a 64-byte id is too long");
    id[63] = 0;
    snprintf(req, sizeof req, "{\"v\":1,\"cmd\":\"undrain\",\"worker\":\"%s\"}", id);
    cr_assert_eq(dec(req, &r, err), ECS_OK, "%s", err);
}
