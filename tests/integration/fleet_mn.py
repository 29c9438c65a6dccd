"""fleet_mn.py - several coordinators share one expert pool (M:N): three
ecs-worker processes started by hand, each given three coordinators
(--coordinator repeated), serve two coordinators at once; each coordinator
serves its own clients concurrently and its outputs equal those of one
coordinator alone: teacher-forced logits byte-identical (ecs-run
--control), greedy text identical (ecs-coordinator over HTTP). The second
coordinator's assignment equals the first's (placement does not depend on
registration order), so no worker loads twice; a third coordinator whose
placement differs (--replication 2) is refused by every worker while the
others are registered, naming the coordinator whose assignment it keeps.
Every process is started here and stopped by pid. Standard library only.
usage: fleet_mn.py ROOT BUILD"""
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading

from serve_lib import Server, free_port, stream_text

root, build = sys.argv[1], sys.argv[2]
bin_dir = os.path.join(root, build, "bin")
model = os.path.join(root, "..", "shared", "models", "tiny-ds2-q8_0.gguf")
tmp = tempfile.mkdtemp(prefix="ecs-fleet-")
ctl = {n: "tcp://127.0.0.1:%d" % free_port() for n in "ABC"}
fails = []
procs = []


def ok(msg):
    print("ok   " + msg)


def bad(msg):
    print("FAIL " + msg)
    fails.append(msg)


def start(cmd, log):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    procs.append(p)
    return p


def tail(path, n=3):
    with open(path) as f:
        return " | ".join(f.read().splitlines()[-n:])


rng = random.Random(11)
toks = {n: ",".join(str(rng.randrange(1, 2000)) for _ in range(96)) for n in "AB"}


def run_tf(name, coord, which, extra=()):
    """A teacher-forced ecs-run on control endpoint `coord` over the
    three shared workers; returns (process, logits file, log file)."""
    out = os.path.join(tmp, name + ".json")
    log = out + ".err"
    cmd = [os.path.join(bin_dir, "ecs-run"), "-m", model, "--threads", "1", "--no-repack",
           "--tokens", toks[which], "--top", "8", "--dump-logits", out, "--control", ctl[coord],
           "--min-workers", "3"] + list(extra)
    return start(cmd, log), out, log


def same(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


try:
    wlogs = []
    for i in range(3):
        log = os.path.join(tmp, "f%d.err" % i)
        wlogs.append(log)
        start([os.path.join(bin_dir, "ecs-worker"), "-m", model, "--coordinator", ctl["A"],
               "--coordinator", ctl["B"], "--coordinator", ctl["C"], "--id", "f%d" % i,
               "--threads", "1", "--listen", "tcp://127.0.0.1:*"], log)

    # 1. one coordinator alone, A then B, each on its own tokens
    solo = {}
    for n in "AB":
        p, out, log = run_tf("solo" + n, n, n)
        if p.wait(timeout=120) != 0:
            bad("solo %s: ecs-run failed: %s" % (n, tail(log)))
            raise SystemExit(1)
        solo[n] = out

    # 2. both at once over the same three workers
    runs = {n: run_tf("both" + n, n, n) for n in "AB"}
    for n, (p, out, log) in runs.items():
        if p.wait(timeout=120) != 0:
            bad("concurrent %s: ecs-run failed: %s" % (n, tail(log)))
        elif same(out, solo[n]):
            ok("teacher-forced on coordinator %s while %s runs on the same workers: logits "
               "byte-identical to %s alone" % (n, "B" if n == "A" else "A", n))
        else:
            bad("concurrent %s: logits differ from %s alone" % (n, n))
    held = [open(l).read().count("already holds these") for l in wlogs]
    loads = [open(l).read().count("loaded in") for l in wlogs]
    if all(h > 0 for h in held) and all(x == 1 for x in loads):
        ok("every worker loaded its experts once (%s loads) and answered the other "
           "coordinators' equal assignments without loading (%s times)" % (loads, held))
    else:
        bad("workers loaded %s times, adopted %s times (want 1 load each)" % (loads, held))

    # 3. HTTP: greedy text on two ecs-coordinators at once equals one alone
    coord = os.path.join(bin_dir, "ecs-coordinator")
    prompts = ["Once upon a time there was", "The capital of the moon is"]
    req = lambda p: {"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    srv_a = Server(coord, model, "--control", ctl["A"], "--min-workers", "3",
                   log=os.path.join(tmp, "coordA.log"))
    alone = [stream_text(srv_a.port, "/v1/completions", req(p))[0] for p in prompts]
    srv_b = Server(coord, model, "--control", ctl["B"], "--min-workers", "3",
                   log=os.path.join(tmp, "coordB.log"))
    results, threads = {}, []
    for s, name in ((srv_a, "A"), (srv_b, "B")):
        for i, p in enumerate(prompts):
            for rep in range(2):
                key = (name, i, rep)
                t = threading.Thread(target=lambda k=key, s=s, p=p: results.update(
                    {k: stream_text(s.port, "/v1/completions", req(p))[0]}))
                threads.append(t)
                t.start()
    for t in threads:
        t.join(180)
    diff = [k for k in results if results[k] != alone[k[1]]]
    if len(results) != len(threads):
        bad("http: %d of %d concurrent requests finished" % (len(results), len(threads)))
    elif diff:
        bad("http: greedy text differs from one coordinator alone for %s" % diff)
    else:
        ok("http: %d greedy completions, 4 at once on each of two coordinators sharing three "
           "workers: text identical to one coordinator alone" % len(results))

    # 4. a coordinator with another placement is refused, the others unharmed
    p, out, log = run_tf("conflict", "C", "A", ["--replication", "2", "--call-timeout", "5000"])
    rc = p.wait(timeout=120)
    text = open(log).read()
    if rc == 0:
        bad("conflict: a coordinator with another placement was not refused")
    elif "placement differs" in text and "calls; this coordinator" in text:
        line = [l for l in text.splitlines() if "placement differs" in l][0]
        ok("conflict: a coordinator with another placement is refused: %s" % line[:200])
    else:
        bad("conflict: unclear failure: %s" % tail(log))
    again = stream_text(srv_b.port, "/v1/completions", req(prompts[0]))[0]
    if again == alone[0]:
        ok("after the refused coordinator, B still serves the same text")
    else:
        bad("after the refused coordinator, B's text differs")
    for s, n in ((srv_a, "A"), (srv_b, "B")):
        rc = s.stop()
        if rc != 0:
            bad("coordinator %s exited %d on SIGTERM" % (n, rc))
finally:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for i, p in enumerate(procs):
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        if i < 3 and rc != 0:
            bad("worker f%d exited %d on SIGTERM: %s" % (i, rc, tail(wlogs[i])))
    if fails:
        for l in wlogs:
            print("---- " + l)
            print(open(l).read()[-1500:])
    subprocess.call(["rm", "-rf", tmp])

sys.exit(1 if fails else 0)
