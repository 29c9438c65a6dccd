/* state.c - what ecsctl and the console read: the scheduler's and the
 * dispatcher's state as JSON (jansson). Nothing here holds a secret. */
#include <jansson.h>
#include <stdlib.h>
#include <time.h>

#include "coordinator/admin/admin.h"

double admin_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

json_t *admin_workers_obj(admin_src_t *src)
{
    json_t *a = json_array();
    dispatch_t *d = src->dispatch;
    for (int i = 0; a && d && i < dispatch_n_workers(d); i++) {
        dispatch_worker_stats_t w;
        if (dispatch_worker_stats(d, i, &w) != ECS_OK)
            continue;
        json_t *o = json_pack(
            "{s:s,s:s,s:i,s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:i,s:i,s:I,s:b,s:s}", "id", w.id,
            "state", w.state, "pid", w.pid, "threads", w.threads, "experts", w.pairs_held,
            "bytes_held", (json_int_t)w.bytes_held, "calls_in_flight",
            (json_int_t)w.calls_in_flight, "rows_in_flight", (json_int_t)w.rows_in_flight,
            "calls", (json_int_t)w.calls, "rows", (json_int_t)w.rows, "latency_p50_us",
            (json_int_t)w.latency_p50_us, "latency_p99_us", (json_int_t)w.latency_p99_us,
            "restarts", w.restarts, "deaths", w.deaths, "last_heartbeat_ms",
            (json_int_t)w.last_heard_ms, "spawned", w.spawned, "why", w.why);
        if (o)
            json_array_append_new(a, o);
    }
    return a;
}

json_t *admin_placement_obj(admin_src_t *src)
{
    dispatch_t *d = src->dispatch;
    if (!d)
        return json_pack("{s:s,s:[],s:[],s:s}", "mode", "local", "workers", "layers", "text",
                         "");
    int *counts = NULL, first = 0, nl = 0;
    char *text = NULL;
    const int nw = dispatch_n_workers(d);
    json_t *o = json_pack("{s:s,s:i,s:[],s:[]}", "mode", "workers", "first_moe_layer", 0,
                          "workers", "layers");
    if (!o || dispatch_layer_counts(d, &counts, &first, &nl) != ECS_OK ||
        dispatch_placement_text(d, &text) != ECS_OK) {
        json_decref(o);
        free(counts);
        return NULL;
    }
    json_object_set_new(o, "first_moe_layer", json_integer(first));
    json_object_set_new(o, "text", json_string(text));
    json_t *ws = json_object_get(o, "workers"), *ls = json_object_get(o, "layers");
    for (int i = 0; i < nw; i++) {
        dispatch_worker_stats_t w;
        if (dispatch_worker_stats(d, i, &w) == ECS_OK)
            json_array_append_new(ws, json_string(w.id));
    }
    for (int l = 0; l < nl; l++) {
        json_t *row = json_array();
        for (int i = 0; row && i < nw; i++)
            json_array_append_new(row, json_integer(counts[(size_t)l * (size_t)nw + (size_t)i]));
        json_array_append_new(ls, row);
    }
    free(counts);
    free(text);
    return o;
}

json_t *admin_status_obj(admin_src_t *src)
{
    sched_stats_t st;
    sched_stats(src->sched, &st);
    char op[256] = "";
    int n = 0, live = 0;
    dispatch_t *d = src->dispatch;
    if (d) {
        dispatch_op_status(d, op, sizeof op);
        n = dispatch_n_workers(d);
        for (int i = 0; i < n; i++) {
            dispatch_worker_stats_t w;
            if (dispatch_worker_stats(d, i, &w) == ECS_OK && w.state[0] == 'l' &&
                w.state[1] == 'i')
                live++;
        }
    }
    return json_pack(
        "{s:s,s:f,s:b,s:s,s:{s:i,s:i},s:s,s:{s:i,s:i},s:{s:i,s:i,s:I,s:I,s:s},s:{s:I,s:I},"
        "s:{s:I,s:I},s:I,s:I}",
        "model", src->model_id, "uptime_s", admin_now() - src->started, "shutting_down",
        (int)atomic_load(&src->shutting_down), "experts", d ? "workers" : "local", "workers",
        "total", n, "live", live, "operation", op, "requests", "running", st.running, "waiting",
        st.waiting, "kv", "blocks", st.kv_blocks, "used", st.kv_blocks_used, "bytes",
        (json_int_t)st.kv_bytes, "block_bytes", (json_int_t)st.kv_block_bytes, "type", st.kv_type,
        "prefix_cache",
        "hit_tokens",
        (json_int_t)st.prefix_hit_tokens, "lookup_tokens", (json_int_t)st.prefix_lookup_tokens,
        "tokens", "prompt", (json_int_t)st.prompt_tokens, "generated",
        (json_int_t)st.gen_tokens, "steps", (json_int_t)st.steps, "preemptions",
        (json_int_t)st.preemptions);
}

char *admin_state_json(admin_src_t *src)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "time_s", json_real(admin_now() - src->started));
    json_object_set_new(o, "status", admin_status_obj(src));
    json_object_set_new(o, "workers", admin_workers_obj(src));
    json_object_set_new(o, "placement", admin_placement_obj(src));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}
