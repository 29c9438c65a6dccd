/* metrics_workers.c - /metrics lines for the pooled dispatcher's workers
 * (coordinator/dispatch's own figures: dispatch_stats and
 * dispatch_worker_stats, the same ones dispatch_print_stats prints):
 * per worker calls and rows in flight and in total, bytes each way and the
 * round-trip latency histogram; the mean per-layer imbalance. */
#include <stddef.h>
#include <string.h>

#include "api_int.h"

void api_server_set_dispatch(api_server_t *srv, const dispatch_t *d) { srv->dispatch = d; }

/* One labelled sample per worker for each of the stats' fields. */
typedef struct {
    const char *name, *type, *help;
    size_t off; /* of a uint64_t in dispatch_worker_stats_t */
} wfield_t;

#define WF(n, t, h, f) {n, t, h, offsetof(dispatch_worker_stats_t, f)}
static const wfield_t fields[] = {
    WF("ecs_worker_calls_in_flight", "gauge", "Expert calls sent to the worker, not answered yet.",
       calls_in_flight),
    WF("ecs_worker_rows_in_flight", "gauge", "Activation rows in the worker's unanswered calls.",
       rows_in_flight),
    WF("ecs_worker_calls_total", "counter", "Expert calls sent to the worker.", calls),
    WF("ecs_worker_rows_total", "counter", "Activation rows sent to the worker.", rows),
    WF("ecs_worker_sent_bytes_total", "counter", "Bytes sent to the worker.", bytes_out),
    WF("ecs_worker_received_bytes_total", "counter", "Bytes received from the worker.", bytes_in),
};

void api_metrics_workers(const api_server_t *srv, api_buf_t *b)
{
    const dispatch_t *d = srv->dispatch;
    if (!d)
        return;
    dispatch_stats_t st;
    dispatch_stats(d, &st);
    api_buf_printf(b, "# HELP ecs_workers Expert workers registered.\n# TYPE ecs_workers gauge\n"
                      "ecs_workers %d\n", st.n_workers);
    api_buf_printf(b, "# HELP ecs_dispatch_layer_calls_total MoE layers sent to the workers.\n"
                      "# TYPE ecs_dispatch_layer_calls_total counter\n"
                      "ecs_dispatch_layer_calls_total %llu\n", (unsigned long long)st.layer_calls);
    api_buf_printf(b, "# HELP ecs_dispatch_imbalance_ratio Per MoE layer, rows of the busiest "
                      "worker over the mean, averaged over layers (1: balanced).\n"
                      "# TYPE ecs_dispatch_imbalance_ratio gauge\n"
                      "ecs_dispatch_imbalance_ratio %.6f\n", st.imbalance);
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        api_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", fields[f].name, fields[f].help,
                       fields[f].name, fields[f].type);
        for (int i = 0; i < st.n_workers; i++) {
            dispatch_worker_stats_t w;
            if (dispatch_worker_stats(d, i, &w) != ECS_OK)
                continue;
            uint64_t v;
            memcpy(&v, (const char *)&w + fields[f].off, sizeof v);
            api_buf_printf(b, "%s{worker=\"%s\"} %llu\n", fields[f].name, w.id,
                           (unsigned long long)v);
        }
    }
    api_buf_puts(b, "# HELP ecs_worker_call_latency_seconds Round trip of an expert call to the "
                    "worker (the sum estimated from bucket midpoints).\n# TYPE ecs_worker_call_latency_seconds histogram\n");
    for (int i = 0; i < st.n_workers; i++) {
        dispatch_worker_stats_t w;
        if (dispatch_worker_stats(d, i, &w) != ECS_OK)
            continue;
        uint64_t cum = 0;
        double sum = 0;
        for (int k = 0; k < DISPATCH_LAT_BUCKETS; k++) {
            cum += w.latency_hist[k];
            sum += (double)w.latency_hist[k] * 1.5 * (double)(1ull << k) * 1e-6;
            /* bucket k holds [2^k, 2^(k+1)) us: its upper bound */
            api_buf_printf(b, "ecs_worker_call_latency_seconds_bucket{worker=\"%s\",le=\"%g\"} %llu\n",
                           w.id, (double)(1ull << (k + 1)) * 1e-6, (unsigned long long)cum);
        }
        api_buf_printf(b, "ecs_worker_call_latency_seconds_bucket{worker=\"%s\",le=\"+Inf\"} %llu\n"
                          "ecs_worker_call_latency_seconds_sum{worker=\"%s\"} %.6f\n"
                          "ecs_worker_call_latency_seconds_count{worker=\"%s\"} %llu\n",
                       w.id, (unsigned long long)cum, w.id, sum, w.id, (unsigned long long)cum);
    }
}
