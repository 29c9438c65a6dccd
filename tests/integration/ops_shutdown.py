"""ops_shutdown.py - graceful shutdown: ecs-coordinator --spawn-workers 2
gets SIGTERM while a streamed greedy completion runs; /ready turns 503
with Retry-After, a new request gets 503 with Retry-After, the running
stream completes with the fault-free text, the process exits 0 and none
of the workers it spawned is left. Standard library only.
usage: ops_shutdown.py ROOT BUILD"""
import json
import os
import re
import signal
import sys
import threading

from ops_lib import check, finish
from serve_lib import Server, model_path, request, stream_text, wait_until

root, build = sys.argv[1], sys.argv[2]
binary = os.path.join(root, build, "bin", "ecs-coordinator")
model = model_path(root, build, "tiny-ds2-q8_0")
req = {"prompt": "Once upon a time there was", "max_tokens": 400, "temperature": 0,
       "ignore_eos": True}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for this purpose
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


srv = Server(binary, model, "--spawn-workers", "2", "--worker-threads", "1", "--admin", "off",
             "--grace-period", "3600")
try:
    clean, _ = stream_text(srv.port, "/v1/completions", req)
    pids = [int(p) for p in re.findall(r"worker w\d registered \(pid (\d+)", srv.read_log())]
    check(len(pids) == 2 and all(alive(p) for p in pids), "two spawned workers: %s" % pids)
    out = {}
    t = threading.Thread(target=lambda: out.update(r=stream_text(srv.port, "/v1/completions", req)))
    t.start()

    def running():
        st, _, body = request(srv.port, "GET", "/console/state")
        return json.loads(body)["status"]["requests"]["running"] > 0

    wait_until(running, "the stream running")
    os.kill(srv.proc.pid, signal.SIGTERM)
    wait_until(lambda: request(srv.port, "GET", "/ready")[0] == 503, "/ready 503")
    st, h, body = request(srv.port, "GET", "/ready")
    check(st == 503 and int(h.get("retry-after", "0")) >= 1,
          "/ready after SIGTERM: %d, Retry-After %s" % (st, h.get("retry-after")))
    st, h, body = request(srv.port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    check(st == 503 and int(h.get("retry-after", "0")) >= 1 and b"shutting down" in body,
          "a new request after SIGTERM: %d, Retry-After %s" % (st, h.get("retry-after")))
    st, _, _ = request(srv.port, "GET", "/health")
    check(st == 200, "/health still answers while shutting down")
    t.join(120)
    check("r" in out and out["r"][0] == clean,
          "the running stream completed with the fault-free text (%d chars)" % len(clean))
    rc = srv.proc.wait(120)
    check(rc == 0, "exit status %d after the last request finished" % rc)
    left = [p for p in pids if alive(p)]
    check(not left, "no spawned worker left%s" % (": %s" % left if left else ""))
    log = srv.read_log()
    check("every running request finished" in log, "the log says the running request finished")
    for line in log.splitlines():
        if re.search(r"SIGTERM|finished|shutting", line):
            print("     [log] " + line)
finally:
    srv.stop()
finish()
