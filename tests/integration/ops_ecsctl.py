"""ops_ecsctl.py - ecsctl against ecs-coordinator --spawn-workers 3 under
load: status, workers and placement read back what the coordinator holds;
drain w1 while greedy requests run (its experts move, it takes no more
calls, it holds none), drain w0 too, draining the last live worker is
refused, undrain both (they hold experts again), restart w2 (a new pid,
back live); every request of the load answers 200 with the text of the
fault-free run. Bad requests get clear errors. Standard library only.
usage: ops_ecsctl.py ROOT BUILD"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from ops_lib import check, finish
from serve_lib import Server, model_path, post_json, wait_until

root, build = sys.argv[1], sys.argv[2]
binary = os.path.join(root, build, "bin", "ecs-coordinator")
model = model_path(root, build, "tiny-ds2-q8_0")
tmp = tempfile.mkdtemp(prefix="ecs-ops-")
admin = "ipc://%s/admin" % tmp
ctl = [os.path.join(root, build, "bin", "ecsctl"), "--admin", admin]
prompts = ["Once upon a time there was", "The capital of France is", "def fibonacci(n):"]


def ecsctl(*args):
    p = subprocess.run(ctl + list(args), capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def as_json(*args):
    rc, out, err = ecsctl("--json", *args)
    assert rc == 0, (args, rc, err)
    return json.loads(out)


def workers():
    return {w["id"]: w for w in as_json("workers")}


def complete(port, prompt):
    st, body = post_json(port, "/v1/completions", {"prompt": prompt, "max_tokens": 64,
                                                   "temperature": 0, "ignore_eos": True})
    return st, body["choices"][0]["text"] if st == 200 else json.dumps(body)


# uniform (--replication 1): a drain must move the experts (the default
# would hold every expert on every spawned worker already)
srv = Server(binary, model, "--spawn-workers", "3", "--worker-threads", "1", "--admin", admin,
             "--replication", "1")
try:
    ref = {p: complete(srv.port, p)[1] for p in prompts}
    rc, out, err = ecsctl("status")
    check(rc == 0 and re.search(r"workers\s+3 live of 3", out), "status: 3 live of 3 workers")
    rc, out, err = ecsctl("workers")
    rows = [l.split() for l in out.splitlines()[1:]]
    check(rc == 0 and sorted(r[0] for r in rows) == ["w0", "w1", "w2"]
          and all(r[1] == "live" and int(r[3]) > 0 for r in rows),
          "workers: w0 w1 w2 live, each holding experts")
    rc, out, err = ecsctl("placement")
    held = {m[0]: int(m[1]) for m in re.findall(r"# (w\d) holds (\d+) ", out)}
    check(rc == 0 and len(held) == 3 and sum(held.values()) == 3 * 16,
          "placement: every (layer, expert) of the 3 MoE layers x 16 experts has a holder: %s"
          % held)

    # the load: three clients sending greedy requests until told to stop
    stop = threading.Event()
    results = []

    def client(i):
        k = i
        while not stop.is_set():
            p = prompts[k % len(prompts)]
            results.append((p,) + complete(srv.port, p))
            k += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()

    def running():
        return as_json("status")["requests"]["running"] > 0

    wait_until(running, "requests running")
    rc, out, err = ecsctl("drain", "w1")
    check(rc == 0 and "drained" in out, "drain w1 under load: %s" % (out.strip() or err.strip()))
    w = workers()
    check(w["w1"]["state"] == "drained" and w["w1"]["experts"] == 0
          and w["w0"]["experts"] + w["w2"]["experts"] == 48,
          "w1 drained, holds nothing; w0 + w2 hold all 48 pairs")
    rc, out, err = ecsctl("placement")
    check("# w1 holds 0 " in out, "placement: w1 holds 0 pairs")
    calls = w["w1"]["calls"]
    n = len(results)
    wait_until(lambda: len(results) >= n + 3, "three more requests")
    check(workers()["w1"]["calls"] == calls, "no call went to the drained w1 (%d calls)" % calls)

    wait_until(running, "requests running")
    rc, out, err = ecsctl("drain", "w0")
    check(rc == 0, "drain w0 too: %s" % (out.strip() or err.strip()))
    rc, out, err = ecsctl("drain", "w2")
    check(rc == 1 and "cannot drain" in err, "draining the last live worker is refused: %s"
          % err.strip())
    for wid in ("w0", "w1"):
        wait_until(running, "requests running")
        rc, out, err = ecsctl("undrain", wid)
        check(rc == 0 and "undrained" in out, "undrain %s: %s" % (wid, (out + err).strip()))
    w = workers()
    check(all(w[i]["state"] == "live" and w[i]["experts"] > 0 for i in w),
          "after undrain every worker is live and holds experts: %s"
          % {i: w[i]["experts"] for i in w})

    pid = w["w2"]["pid"]
    wait_until(running, "requests running")
    rc, out, err = ecsctl("restart", "w2")
    w = workers()
    check(rc == 0 and w["w2"]["pid"] != pid and w["w2"]["state"] == "live"
          and w["w2"]["restarts"] >= 1, "restart w2: %s" % (out.strip() or err.strip()))
    n = len(results)
    wait_until(lambda: len(results) >= n + 3, "three more requests")
    stop.set()
    for t in threads:
        t.join(120)
    bad = [r for r in results if r[1] != 200 or r[2] != ref[r[0]]]
    check(len(results) > 6 and not bad, "%d requests under drain/undrain/restart: all 200, "
          "texts identical to the fault-free run%s" % (len(results), ": %r" % bad[:2] if bad else ""))

    rc, out, err = ecsctl("drain", "nosuch")
    check(rc == 1 and "no worker 'nosuch'" in err, "drain of an unknown worker: %s" % err.strip())
    rc, out, err = ecsctl("undrain", "w1")
    check(rc == 0 and "nothing to do" in out, "undrain of a live worker: nothing to do")
    p = subprocess.run(ctl[:1] + ["--admin", "ipc://%s/none" % tmp, "--timeout", "1", "status"],
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 1 and "no answer" in p.stderr, "no coordinator: %s" % p.stderr.strip())
    p = subprocess.run(ctl + ["drain"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and "takes a worker id" in p.stderr, "drain without a worker: usage")
    log = srv.read_log()
    for line in log.splitlines():
        if re.search(r"drain|restart|admin:", line):
            print("     [log] " + line)
finally:
    rc = srv.stop()
    check(rc == 0, "coordinator exit status %s" % rc)
    shutil.rmtree(tmp, ignore_errors=True)
finish()
