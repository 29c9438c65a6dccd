"""serve_failover.py - the serving path survives a worker's death:
ecs-coordinator --spawn-workers 2 streams a greedy completion while one
worker is killed with SIGKILL; the text equals the fault-free run's, and
the supervisor restarted the worker. Standard library only.
usage: serve_failover.py ROOT BUILD"""
import os
import re
import signal
import sys
import threading
import time

from serve_lib import Server, metric_value, stream_text

root, build = sys.argv[1], sys.argv[2]
binary = os.path.join(root, build, "bin", "ecs-coordinator")
model = os.path.join(root, "..", "shared", "models", "tiny-ds2-q8_0.gguf")
req = {"prompt": "Once upon a time there was", "max_tokens": 300, "temperature": 0,
       "ignore_eos": True}

# uniform (--replication 1): the stream's calls to w1 wait for its restart,
# the path this test is for (the default's replica path: test_supervise.sh)
srv = Server(binary, model, "--spawn-workers", "2", "--worker-threads", "1", "--replication", "1")
try:
    t0 = time.time()
    clean, _ = stream_text(srv.port, "/v1/completions", req)
    t_clean = time.time() - t0
    pid = int(re.findall(r"worker w1 registered \(pid (\d+)", srv.read_log())[-1])
    out = {}
    t = threading.Thread(target=lambda: out.update(r=stream_text(srv.port, "/v1/completions", req)))
    t0 = time.time()
    t.start()
    time.sleep(t_clean / 3)  # a third into the stream, by the fault-free run's time
    running = t.is_alive()
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    t.join(120)
    took = time.time() - t0
    for _ in range(200):  # the restart may finish after the stream
        if "w1 is back" in srv.read_log():
            break
        time.sleep(0.05)
    log = srv.read_log()
    ok = True
    if "r" not in out:
        print("FAIL serve: the stream did not finish after worker w1 was killed")
        ok = False
    elif not running or "worker w1 declared dead" not in log:
        print("FAIL serve: the stream ended before the kill (or the death was not seen)")
        ok = False
    elif out["r"][0] != clean:
        print("FAIL serve: the streamed text differs after the kill:\n%r\n%r" % (out["r"][0], clean))
        ok = False
    else:
        print("ok   serve: kill -9 of w1 %.1f s into a streamed greedy completion (%d chars): "
              "text identical, the request took %.1f s (%.1f s without the kill)"
              % (t_kill - t0, len(clean), took, t_clean))
    if "w1 is back (restarted" in log:
        print("ok   serve: w1 restarted and serving again")
    else:
        print("FAIL serve: w1 was not restarted")
        ok = False
    for line in log.splitlines():
        if re.search(r"declared dead|sent again|is back", line):
            print("     [serve] " + line)
    m = srv.metrics()  # the dispatcher's per-worker figures on /metrics
    try:
        assert metric_value(m, "ecs_workers") == 2, m
        assert metric_value(m, "ecs_dispatch_layer_calls_total") > 0
        assert metric_value(m, "ecs_dispatch_imbalance_ratio") >= 1
        for w in ("w0", "w1"):
            calls = metric_value(m, 'ecs_worker_calls_total{worker="%s"}' % w)
            assert calls > 0 and metric_value(m, 'ecs_worker_rows_total{worker="%s"}' % w) >= calls
            assert metric_value(m, 'ecs_worker_sent_bytes_total{worker="%s"}' % w) > 0
            assert metric_value(m, 'ecs_worker_calls_in_flight{worker="%s"}' % w) >= 0
        # w0 never died: its histogram counts its answered calls
        n_lat = metric_value(m, 'ecs_worker_call_latency_seconds_count{worker="w0"}')
        assert 0 < n_lat <= metric_value(m, 'ecs_worker_calls_total{worker="w0"}'), m
        assert metric_value(m, 'ecs_worker_call_latency_seconds_bucket{worker="w0",le="+Inf"}') == n_lat
        print("ok   serve: /metrics shows each worker's calls, rows, bytes and latency histogram")
    except AssertionError as e:
        print("FAIL serve: worker metrics: %s" % str(e)[:2000])
        ok = False
finally:
    srv.stop()
sys.exit(0 if ok else 1)
