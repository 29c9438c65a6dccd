#!/usr/bin/env python3
"""bench_chunk.py - an agent's turn alone on ecs-coordinator, two sets of
scheduler options side by side (default: 256-row prompt chunks, the old
default, against --idle-chunk's default, the whole batch), or two builds
(--a-build, --b-build: before and after a change).

Each variant's server computes the same random prefix once (its cold time
is printed), then the rounds alternate: each server computes one warm turn
of the same new tokens after the prefix (prefix-cached), the order swapped
every round. Prints each turn's time to first token, the ratio B / A per
round and its median, and checks that both gave the same first token and
log-probabilities (the cut never changes a bit). Python 3 standard library
only; the servers are started here and stopped by pid.

usage: bench_chunk.py BUILD MODEL [--prefix N] [--turn N] [--rounds N]
                      [--a 'OPTS'] [--b 'OPTS'] [--a-build DIR] [--b-build DIR] [--threads N]
  e.g. bench_chunk.py build /work/models-cache/ds2-lite-q4_k_m.gguf --prefix 7500 --turn 530
"""
import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(port, tokens):
    """Seconds to the first (and only) token, and its log-probabilities."""
    body = json.dumps({"prompt": tokens, "max_tokens": 1, "temperature": 0,
                       "logprobs": 5}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, body,
                                 {"Content-Type": "application/json"})
    t = time.time()
    with urllib.request.urlopen(req, timeout=3600) as r:
        d = json.loads(r.read())
    return time.time() - t, json.dumps(d["choices"][0]["logprobs"]), d["usage"]


def start(binary, model, ctx, threads, opts, log):
    port = free_port()
    cmd = [binary, "-m", model, "--http", "127.0.0.1:%d" % port, "--threads", str(threads),
           "--ctx", str(ctx), "--max-running", "2"] + opts.split()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    for _ in range(600):
        if p.poll() is not None:
            sys.exit("bench_chunk: %s exited (%s): see %s" % (" ".join(cmd), p.returncode, log))
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/ready" % port, timeout=2) as r:
                if r.status == 200:
                    return p, port
        except OSError:
            pass
        time.sleep(1)
    p.kill()
    sys.exit("bench_chunk: %s not ready after 600 s" % " ".join(cmd))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("model")
    ap.add_argument("--prefix", type=int, default=4000)
    ap.add_argument("--turn", type=int, default=530)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--a", default="--idle-chunk 256")
    ap.add_argument("--b", default="")
    ap.add_argument("--a-build", help="A's build directory (default: BUILD)")
    ap.add_argument("--b-build", help="B's build directory (default: BUILD)")
    ap.add_argument("--seed", type=int, default=7)
    o = ap.parse_args()
    rng = random.Random(o.seed)
    prefix = [rng.randrange(1000, 30000) for _ in range(o.prefix)]
    ctx = o.prefix + o.turn + 64
    logs = os.environ.get("TMPDIR", "/tmp")
    servers = []
    try:
        for name, opts, build in (("A", o.a, o.a_build or o.build), ("B", o.b, o.b_build or o.build)):
            binary = os.path.join(build, "bin", "ecs-coordinator")
            p, port = start(binary, o.model, ctx, o.threads, opts,
                            os.path.join(logs, "bench_chunk_%s.log" % name))
            servers.append((name, opts, p, port))
            print("%s: %s %s" % (name, binary, opts or "(defaults)"), flush=True)
        for name, _, _, port in servers:
            t, _, _ = complete(port, prefix)
            print("%s: cold prefix of %d tokens %.2f s" % (name, o.prefix, t), flush=True)
        ratios = []
        for r in range(o.rounds):
            turn = [rng.randrange(1000, 30000) for _ in range(o.turn)]
            got = {}
            for name, _, _, port in (servers if r % 2 == 0 else servers[::-1]):
                t, lp, u = complete(port, prefix + turn)
                cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                got[name] = (t, lp)
                print("round %d %s: warm turn %.3f s (%d cached of %d)" %
                      (r + 1, name, t, cached, u["prompt_tokens"]), flush=True)
            if got["A"][1] != got["B"][1]:
                sys.exit("bench_chunk: round %d: the variants' log-probabilities differ" % (r + 1))
            ratios.append(got["B"][0] / got["A"][0])
            print("round %d: B / A %.3f, same log-probabilities" % (r + 1, ratios[-1]), flush=True)
        print("bench_chunk: warm turn of %d tokens after %d, B / A median %.3f (%s)" %
              (o.turn, o.prefix, statistics.median(ratios),
               " ".join("%.3f" % x for x in ratios)))
    finally:
        for _, _, p, _ in servers:
            p.send_signal(signal.SIGTERM)
            p.wait()


if __name__ == "__main__":
    main()
