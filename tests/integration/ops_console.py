"""ops_console.py - the live console in a real browser: ecs-coordinator
with two workers started by hand over tcp (replication 2), a streamed
request running; headless Chromium loads /console and its rendered DOM
shows both workers live and the running request; worker c1 is killed
with SIGKILL; Chromium loads the page again and c1's state there is dead
while c0 stays live; the stream completes. Screenshots go to
BUILD/artifacts/console*.png. Skipped (and said so) only when
/usr/bin/chromium is absent.
usage: ops_console.py ROOT BUILD"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from ops_lib import check, finish
from serve_lib import Server, free_port, model_path, request, stream_text, wait_until

root, build = sys.argv[1], sys.argv[2]
chromium = "/usr/bin/chromium"
if not os.access(chromium, os.X_OK):
    print("SKIP console: %s is not installed (make deps installs it)" % chromium)
    sys.exit(0)
binary = os.path.join(root, build, "bin", "ecs-coordinator")
worker_bin = os.path.join(root, build, "bin", "ecs-worker")
model = model_path(root, build, "tiny-ds2-q8_0")
art = os.path.join(root, build, "artifacts")
os.makedirs(art, exist_ok=True)
tmp = tempfile.mkdtemp(prefix="ecs-console-")


def browse(url, *extra):
    """Chromium's rendered DOM of url after the page's first polls."""
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--user-data-dir=" + os.path.join(tmp, "profile"), "--virtual-time-budget=3000",
           "--window-size=1280,800"] + list(extra) + [url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    return p.returncode, p.stdout


def worker_states(dom):
    return dict(re.findall(r'<tr id="worker-([^"]+)" data-state="([^"]+)"', dom))


ctl = "tcp://127.0.0.1:%d" % free_port()
procs = {}
srv = None
try:
    for wid in ("c0", "c1"):
        procs[wid] = subprocess.Popen(
            [worker_bin, "-m", model, "--coordinator", ctl, "--id", wid, "--threads", "1",
             "--listen", "tcp://127.0.0.1:*"], stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(tmp, wid + ".err"), "w"))
    srv = Server(binary, model, "--control", ctl, "--min-workers", "2", "--replication", "2",
                 "--admin", "off")
    url = "http://127.0.0.1:%d/console" % srv.port
    req = {"prompt": "Once upon a time there was", "max_tokens": 800, "temperature": 0,
           "ignore_eos": True}
    out = {}
    t = threading.Thread(target=lambda: out.update(r=stream_text(srv.port, "/v1/completions", req)))
    t.start()

    def state():
        return json.loads(request(srv.port, "GET", "/console/state")[2])

    wait_until(lambda: state()["status"]["requests"]["running"] > 0, "the stream running")
    rc, dom = browse(url, "--dump-dom")
    st = worker_states(dom)
    check(rc == 0 and st == {"c0": "live", "c1": "live"},
          "Chromium renders /console with both workers live: %s" % st)
    m = re.search(r'id="running">(\d+)<', dom)
    check(m is not None and int(m.group(1)) >= 1 if t.is_alive() else m is not None,
          "the page shows the running request (running = %s)" % (m.group(1) if m else None))
    browse(url, "--screenshot=" + os.path.join(art, "console.png"))
    procs["c1"].send_signal(signal.SIGKILL)
    procs["c1"].wait()
    wait_until(lambda: {w["id"]: w["state"] for w in state()["workers"]}["c1"] == "dead",
               "c1 declared dead")
    rc, dom = browse(url, "--dump-dom")
    st = worker_states(dom)
    check(rc == 0 and st == {"c0": "live", "c1": "dead"},
          "after kill -9 of c1 the page shows it dead, c0 live: %s" % st)
    check(re.search(r'id="live">1 / 2<', dom) is not None, "the page counts 1 of 2 workers live")
    browse(url, "--screenshot=" + os.path.join(art, "console-killed.png"))
    check(os.path.getsize(os.path.join(art, "console-killed.png")) > 1000,
          "screenshots kept: %s/console.png, console-killed.png" % art)
    t.join(120)
    check("r" in out and len(out["r"][0]) > 0, "the stream completed on the replica")
finally:
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    if srv:
        srv.stop()
    shutil.rmtree(tmp, ignore_errors=True)
finish()
