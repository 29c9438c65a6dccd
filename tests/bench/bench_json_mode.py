#!/usr/bin/python3
"""bench_json_mode.py - what JSON mode's token mask costs a decoded token:
ecs-coordinator started here on MODEL, the same greedy request (prefix
cached after a warm-up) without a response_format, with json_object and
with a json_schema, in turn within each round; each mode's decode time a
token is (time of N tokens - time of 1) / (tokens - 1). Prints each round
and the medians of json_object - plain and json_schema - plain (ms a token).

usage: tests/bench/bench_json_mode.py BUILD_DIR MODEL [ROUNDS] [N]"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from serve_lib import Server, post_json  # noqa: E402

build, model = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
n_tok = int(sys.argv[4]) if len(sys.argv) > 4 else 128
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
binary = os.path.join(root, build, "bin", "ecs-coordinator")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}}}
MODES = {"plain": None, "json_object": {"type": "json_object"},
         "json_schema": {"type": "json_schema", "json_schema": {"name": "b", "schema": SCHEMA}}}
BODY = {"messages": [{"role": "user", "content": "Describe a city as JSON."}], "temperature": 0,
        "ignore_eos": True}


def timed(port, rf, n):
    body = dict(BODY, max_tokens=n)
    if rf:
        body["response_format"] = rf
    t = time.perf_counter()
    st, r = post_json(port, "/v1/chat/completions", body)
    assert st == 200, r
    return time.perf_counter() - t, r["usage"]["completion_tokens"]


srv = Server(binary, model, "--ctx", "2048")
try:
    print("== bench_json_mode: %s, %d tokens, %d rounds, %s UTC ==" %
          (os.path.basename(model), n_tok, rounds, time.strftime("%Y-%m-%d %H:%M", time.gmtime())))
    timed(srv.port, None, 4)  # the prompt into the prefix cache
    per = {m: [] for m in MODES}
    for r in range(rounds):
        line = []
        for m, rf in MODES.items():
            t1, _ = timed(srv.port, rf, 1)
            tn, n = timed(srv.port, rf, n_tok)
            ms = 1000 * (tn - t1) / max(n - 1, 1)
            per[m].append(ms)
            line.append("%s %.2f ms/token (%d tokens)" % (m, ms, n))
        print("round %d  %s  (load %s)" % (r + 1, ", ".join(line), open("/proc/loadavg").read().split()[0]))
    for m in ("json_object", "json_schema"):
        d = [a - b for a, b in zip(per[m], per["plain"])]
        print("%s - plain: median %+.2f ms a token (rounds %s); plain median %.2f" %
              (m, statistics.median(d), " ".join("%+.2f" % x for x in d), statistics.median(per["plain"])))
finally:
    srv.stop()
