/* console.c - GET /console: the live console, one HTML page compiled into
 * the binary (console.html, turned into a byte array at build time by the
 * Makefile, so there is no build step beyond that and no CDN); it polls
 * GET /console/state, the JSON of opts.state_json (read-only, no
 * secrets), every second. */
#include <stdlib.h>
#include <string.h>

#include "api_int.h"
#include "coordinator/api/console_html.h"

void api_console_page(api_conn_t *c)
{
    c->extra_hdr = "Cache-Control: no-cache\r\n";
    api_send_simple(c, 200, "text/html; charset=utf-8", (const char *)api_console_html,
                    sizeof api_console_html);
    api_conn_done(c);
}

void api_console_state(api_conn_t *c)
{
    api_server_t *srv = c->srv;
    char *s = srv->o.state_json ? srv->o.state_json(srv->o.state_arg) : NULL;
    if (!srv->o.state_json) {
        api_send_error(c, API_ROUTE_CHAT, 404, "this server has no console state");
    } else if (!s) {
        api_send_error(c, API_ROUTE_CHAT, 500, "out of memory");
    } else {
        c->extra_hdr = "Cache-Control: no-cache\r\n";
        api_send_simple(c, 200, "application/json", s, strlen(s));
    }
    free(s);
    api_conn_done(c);
}
