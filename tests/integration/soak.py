"""soak.py - `make soak` (minutes; not in make test): agent-like clients
against ecs-coordinator with spawned workers and replication 2, once calm
and once while a chaos loop SIGKILLs a random worker every SOAK_KILL_EVERY
seconds (the supervisor restarts it). Every request of both runs is then
replayed on a coordinator with local experts (the reference: greedy, so
the text must be the same). Prints, per run: requests sent, completed,
failed, mismatched, tokens per second, and the stall (the longest wait
for one token of a request, the first included) p50 / p99 / max; then the
throughput ratio and the supervisor's failover lines. Exit status 1 if any
request failed or mismatched. Standard library only.

usage: soak.py ROOT BUILD
env:   SOAK_SECONDS (300, per run)  SOAK_KILL_EVERY (30)  SOAK_CLIENTS (4)
       SOAK_WORKERS (3)  SOAK_MODEL (tiny-ds2-q8_0)  SOAK_ROUNDS (1: calm then
       chaos; 2 or more alternate calm, chaos, chaos, calm, ... so that a
       drift of a shared host's speed cancels in the throughput ratio)"""
import http.client
import json
import os
import random
import re
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import HOST, Server, model_path  # noqa: E402

root, build = sys.argv[1], sys.argv[2]
SECONDS = float(os.environ.get("SOAK_SECONDS", "300"))
KILL_EVERY = float(os.environ.get("SOAK_KILL_EVERY", "30"))
CLIENTS = int(os.environ.get("SOAK_CLIENTS", "4"))
WORKERS = int(os.environ.get("SOAK_WORKERS", "3"))
ROUNDS = int(os.environ.get("SOAK_ROUNDS", "1"))
binary = os.path.join(root, build, "bin", "ecs-coordinator")
model = model_path(root, build, os.environ.get("SOAK_MODEL", "tiny-ds2-q8_0"))

TASKS = ["List the files in the project and say which one holds the tests.",
         "Read the error message and explain what went wrong.",
         "Write a short plan to fix the failing build.",
         "Summarise what you did so far in two sentences.",
         "Which function should be changed first, and why?",
         "Propose a test that would have caught this bug.",
         "Rename the variable to something clearer.",
         "What is the next step?"]
TURNS = 6          # then the agent starts a new conversation
KILL_RND = random.Random(7)  # the chaos loop's victims, across rounds
MAX_TOKENS = 32


def stream(port, body):
    """One streamed chat completion: (ok, text, token times, error)."""
    t0 = time.time()
    times, text = [], ""
    try:
        c = http.client.HTTPConnection(HOST, port, timeout=300)
        c.request("POST", "/v1/chat/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return False, "", [], "HTTP %d: %s" % (r.status, r.read()[:200])
        done = False
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            d = json.loads(line[6:])
            if "error" in d:
                return False, text, times, d["error"].get("message", "error")
            piece = (d.get("choices") or [{}])[0].get("delta", {}).get("content")
            if piece:
                text += piece
                times.append(time.time())
        c.close()
        return done, text, [t0] + times, None if done else "stream ended without [DONE]"
    except (OSError, ValueError, http.client.HTTPException) as e:
        return False, text, times, repr(e)


def agent(port, cid, stop_at, out, lock):
    rnd = random.Random(cid)
    conv = 0
    while time.time() < stop_at:
        msgs = [{"role": "system", "content": "You are agent %d working on a code base." % cid}]
        conv += 1
        for turn in range(TURNS):
            if time.time() >= stop_at:
                break
            msgs.append({"role": "user", "content": rnd.choice(TASKS)})
            body = {"messages": list(msgs), "max_tokens": MAX_TOKENS, "temperature": 0,
                    "stream": True}
            ok, text, times, err = stream(port, body)
            gaps = [b - a for a, b in zip(times, times[1:])]
            with lock:
                out.append({"body": body, "ok": ok, "text": text, "err": err,
                            "tokens": max(len(times) - 1, 0),
                            "stall": max(gaps) if gaps else None})
            if not ok:
                break  # a failed turn ends the conversation
            msgs.append({"role": "assistant", "content": text})


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(name, kills):
    srv = Server(binary, model, "--spawn-workers", str(WORKERS), "--replication", "2",
                 "--worker-threads", "1", "--max-running", str(CLIENTS),
                 log="/tmp/ecs-soak-%s-%d.log" % (name, os.getpid()))
    out, lock = [], threading.Lock()
    t0 = time.time()
    stop_at = t0 + SECONDS
    th = [threading.Thread(target=agent, args=(srv.port, c, stop_at, out, lock))
          for c in range(CLIENTS)]
    for t in th:
        t.start()
    killed = []
    rnd = KILL_RND
    while kills and time.time() + KILL_EVERY < stop_at:
        time.sleep(KILL_EVERY)
        wid = "w%d" % rnd.randrange(WORKERS)
        pids = re.findall(r"worker %s registered \(pid (\d+)" % wid, srv.read_log())
        if pids:
            try:
                os.kill(int(pids[-1]), signal.SIGKILL)
                killed.append((round(time.time() - t0, 1), wid))
            except ProcessLookupError:
                pass
    for t in th:
        t.join()
    took = time.time() - t0
    log = srv.read_log()
    rc = srv.stop()
    return {"name": name, "out": out, "took": took, "killed": killed, "log": log, "rc": rc}


def main():
    print("soak: %d clients, %d workers (replication 2), %.0f s per run, %d round(s), a kill every "
          "%.0f s, model %s, load %s" % (CLIENTS, WORKERS, SECONDS, ROUNDS, KILL_EVERY,
                                         os.path.basename(model),
                                         open("/proc/loadavg").read().split()[0]))
    runs = {"calm": [], "chaos": []}
    for r in range(ROUNDS):
        for name in (("calm", "chaos") if r % 2 == 0 else ("chaos", "calm")):
            runs[name].append(run(name, name == "chaos"))
    # each kind's runs as one: requests, time, kills and logs added up
    calm, chaos = ({"name": k, "out": [x for v in runs[k] for x in v["out"]],
                    "took": sum(v["took"] for v in runs[k]),
                    "killed": [x for v in runs[k] for x in v["killed"]],
                    "log": "\n".join(v["log"] for v in runs[k]),
                    "rc": max(v["rc"] for v in runs[k])} for k in ("calm", "chaos"))
    # the reference: every distinct request once, on local experts
    ref_srv = Server(binary, model, "--max-running", str(CLIENTS))
    ref = {}
    todo = {json.dumps(r["body"], sort_keys=True): r["body"]
            for res in (calm, chaos) for r in res["out"] if r["ok"]}
    keys = list(todo)
    lock = threading.Lock()

    def replay(part):
        for k in part:
            ok, text, _, err = stream(ref_srv.port, todo[k])
            with lock:
                ref[k] = text if ok else None

    th = [threading.Thread(target=replay, args=(keys[i::CLIENTS],)) for i in range(CLIENTS)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    ref_srv.stop()
    bad = 0
    tps = {}
    for res in (calm, chaos):
        out = res["out"]
        ok = [r for r in out if r["ok"]]
        failed = [r for r in out if not r["ok"]]
        mism = [r for r in ok if ref.get(json.dumps(r["body"], sort_keys=True)) != r["text"]]
        stalls = [r["stall"] for r in ok if r["stall"] is not None]
        tps[res["name"]] = sum(r["tokens"] for r in ok) / res["took"]
        print("%-5s sent %d  completed %d  failed %d  mismatched %d  %.1f tok/s  stall p50 %.0f "
              "ms  p99 %.0f ms  max %.0f ms  (%.0f s, coordinator exit %s)"
              % (res["name"], len(out), len(ok), len(failed), len(mism), tps[res["name"]],
                 1e3 * pct(stalls, 0.5), 1e3 * pct(stalls, 0.99),
                 1e3 * max(stalls or [float("nan")]), res["took"], res["rc"]))
        for r in failed[:3]:
            print("      failed: %s" % r["err"])
        for r in mism[:3]:
            print("      mismatch: %r" % r["text"][:80])
        bad += len(failed) + len(mism) + (res["rc"] != 0)
    print("kills: %s" % ", ".join("%s at %.0f s" % (w, t) for t, w in chaos["killed"]))
    print("throughput with kills / without: %.2f" % (tps["chaos"] / tps["calm"] if tps["calm"]
                                                     else float("nan")))
    for line in chaos["log"].splitlines():
        if re.search(r"declared dead|is back|reloaded|sent again", line):
            print("      " + line.strip()[:160])
    sys.exit(1 if bad else 0)


main()
