#!/usr/bin/env python3
"""bench_serve.py - serving benchmark for any OpenAI-compatible server
(ecs-coordinator, llama.cpp's and ik_llama.cpp's llama-server), issue 17's
Performance section. Python 3 standard library only. Prints one table:

  streams N     1, 4 and 8 concurrent streamed completions (100-token
                prompts, 128 new tokens, ignore_eos, temperature 0):
                aggregate generated tok/s, and each stream's own tok/s
                (its tokens after the first / time from first to last)
  ttft          warm time to first token of a conversation that grows to
                ~1k, ~4k, ~8k tokens and resends its history each turn,
                against cold TTFT at the same length (the same prompt with
                other first words, so no prefix can be reused); warm
                8k / warm 1k and cold 8k / warm 8k
  restart       (--restart, needs --server-cmd) the same conversation with
                the server restarted before each measured turn: warm TTFT
                after a restart (ecs-coordinator --prefix-cache-dir)
  gap           longest gap between two tokens of a running stream while a
                4k-token prompt is admitted, against that stream's median
                and the median of its gaps outside the admission

Lengths are the server's own prompt_tokens (usage); prompts are sentences
of coordinator/tokenizer/corpus.txt (the test models' tokenizers are made
from it), shuffled with a per-run seed so nothing is cached from a previous
run. Requests go to /v1/completions with stream_options.include_usage and
cache_prompt: true (llama-server's prefix reuse; ECS ignores it).

usage:
  bench_serve.py --url http://127.0.0.1:8080 [options]
  bench_serve.py --server-cmd 'CMD ... {port} ...' [--restart] [options]
    --server-cmd: the harness picks a free port, starts CMD (no shell),
    waits for GET /health, and stops it by pid (SIGTERM) at the end.
  options: --streams 1,4,8  --prompt-tokens 100  --gen-tokens 128
           --lengths 1024,4096,8192  --turn-tokens 512  --gap-prompt 4096
           --sections streams,ttft,gap (a subset: e.g. llama-server with
           --parallel 8 -c 4096 for streams, --parallel 2 -c 18432 for the
           rest, as it splits -c evenly over its slots)
           --label NAME  --json FILE  --quick (streams 1,4; lengths 512,1024;
           gap prompt 1024)
examples:
  bench_serve.py --server-cmd 'build/bin/ecs-coordinator -m M.gguf --http 127.0.0.1:{port}
      --ctx 9216 --max-running 8 --prefix-cache-dir /tmp/pc' --restart
  bench_serve.py --sections streams --server-cmd '/work/peers/llama.cpp/build/bin/llama-server
      -m M.gguf --host 127.0.0.1 --port {port} -t 2 --parallel 8 -c 4096'
  bench_serve.py --sections ttft,gap --server-cmd '.../llama-server -m M.gguf
      --host 127.0.0.1 --port {port} -t 2 --parallel 2 -c 18432'  (2 slots of 9216)
make bench runs it (tests/bench/run.sh) when ECS_SERVE_MODEL (default
/work/models-cache/ds2-lite-4l.gguf) exists: ecs-coordinator, then each
llama-server built under ECS_PEERS (default ../peers)/{llama.cpp,ik_llama.cpp}.
The context per sequence must hold the longest length + 16 tokens (and the
gap stream's prompt + --gap-stream-tokens)."""
import argparse
import http.client
import json
import os
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "coordinator", "tokenizer", "corpus.txt")


# ---- the server ----
class Target:
    """The server under test: at a URL, or started from --server-cmd."""

    def __init__(self, url=None, cmd=None):
        self.cmd, self.proc, self.log = cmd, None, None
        if cmd:
            self.start()
        else:
            u = urllib.parse.urlparse(url)
            self.host, self.port = u.hostname, u.port or 80
        self.model = self.model_name()

    def start(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.host, self.port = "127.0.0.1", s.getsockname()[1]
        s.close()
        argv = [a.replace("{port}", str(self.port)) for a in shlex.split(self.cmd)]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 600
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited at start (%d), log %s" % (self.proc.returncode, self.log.name))
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("server not healthy after 600 s, log " + self.log.name)
            time.sleep(0.2)

    def stop(self):
        if not self.proc:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        rc, self.proc = self.proc.returncode, None
        self.log.close()
        if rc in (0, -signal.SIGTERM):  # a clean stop: its log goes
            os.unlink(self.log.name)
        else:
            print("bench_serve: the server exited with %d, log %s" % (rc, self.log.name), file=sys.stderr)

    def restart(self):
        self.stop()
        self.start()

    def conn(self, timeout=3600):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path):
        c = self.conn(30)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def model_name(self):
        st, body = self.get("/v1/models")
        if st != 200:
            raise RuntimeError("GET /v1/models: %d" % st)
        try:
            return json.loads(body)["data"][0]["id"]
        except (ValueError, KeyError, IndexError):
            return "default"  # a server that takes any name


def body_for(t, prompt, max_tokens):
    # logprobs 0: ecs-coordinator then sends every token as it comes, text
    # or not (a random-weight model's tokens often decode to no text);
    # llama-server sends every token anyway, and computes no probabilities
    return {"model": t.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "cache_prompt": True, "logprobs": 0}


def stream(t, prompt, max_tokens, on_event=None, started=None):
    """One streamed completion. Returns dict: t0 (sent), times of the events
    that carried tokens (a choice without finish_reason, its text possibly
    empty), prompt_tokens, completion_tokens, text. on_event(i) after each
    such event may return False to hang up (the server cancels)."""
    c = t.conn()
    out = {"times": [], "text": "", "prompt_tokens": None, "completion_tokens": None}
    try:
        data = json.dumps(body_for(t, prompt, max_tokens))
        out["t0"] = time.perf_counter()
        if started:
            started.set()
        c.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError("POST /v1/completions: %d %s" % (r.status, r.read()[:300]))
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            d = json.loads(payload)
            now = time.perf_counter()
            u = d.get("usage")
            if u:
                out["prompt_tokens"] = u.get("prompt_tokens")
                out["completion_tokens"] = u.get("completion_tokens")
            elif "tokens_evaluated" in d:  # llama-server's own final chunk
                out["prompt_tokens"] = d["tokens_evaluated"]
            ch = d.get("choices") or []
            if ch and ch[0].get("finish_reason") is None:
                out["times"].append(now)
                out["text"] += ch[0].get("text") or ""
                if on_event and on_event(len(out["times"])) is False:
                    break
    finally:
        c.close()
    return out


# ---- texts ----
class Texts:
    """Prompts of corpus sentences; calibrated so a word count gives about
    the wanted server tokens."""

    def __init__(self, seed):
        with open(CORPUS) as f:
            words = f.read().split()
        self.sentences, cur = [], []
        for w in words:
            cur.append(w)
            if re.search(r"[.!?]['\"]?$", w):
                self.sentences.append(" ".join(cur))
                cur = []
        self.rng = random.Random(seed)
        self.tok_per_word = 1.3
        self.n = 0

    def words(self, n_words):
        out = []
        while len(out) < n_words:
            out += self.rng.choice(self.sentences).split()
        return " ".join(out[:n_words])

    def head(self):
        """First words unlike those of any other prompt of this run or an
        earlier one: a run number and random letters."""
        self.n += 1
        return "Note %d of %s:" % (self.n, "".join(self.rng.choice("abcdefghijklmnop") for _ in range(6)))

    def fresh(self, n_tokens):
        """About n_tokens of text (the words' tokens vary: +-20%)."""
        return self.head() + " " + self.words(max(1, int(n_tokens / self.tok_per_word)))

    def sized(self, t, n_tokens):
        """A fresh prompt of n_tokens (+-2%) server tokens: its words are
        counted by the server under another head of the same shape (so
        nothing of it is cached); other words after 5 tries."""
        for _ in range(4):
            pool = self.words(int(n_tokens / self.tok_per_word) * 2 + 50).split()
            m = int(n_tokens / self.tok_per_word)
            for _ in range(5):
                k = stream(t, "Note 0 of zzzzzz: " + " ".join(pool[:m]), 1)["prompt_tokens"]
                if not k or abs(k - n_tokens) <= max(2, n_tokens // 50):
                    return self.head() + " " + " ".join(pool[:m])
                m = max(1, min(len(pool), int(round(m * n_tokens / k))))
        return self.head() + " " + " ".join(pool[:m])

    def calibrate(self, t):
        p = self.fresh(200)  # fits a 512-token slot (-c 4096 --parallel 8) at 2.5 tokens a word
        s = stream(t, p, 1)
        if s["prompt_tokens"]:
            self.tok_per_word = s["prompt_tokens"] / len(p.split())


# ---- measures ----
def streams_bench(t, texts, n, prompt_tokens, gen_tokens):
    prompts = [texts.sized(t, prompt_tokens) for _ in range(n)]
    res = [None] * n
    errs = []

    def run(i):
        try:
            res[i] = stream(t, prompts[i], gen_tokens)
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(e)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    wall = time.perf_counter() - t0
    if errs:
        raise errs[0]
    gen = sum(r["completion_tokens"] or len(r["times"]) for r in res)
    own = []
    for r in res:
        k = r["completion_tokens"] or len(r["times"])
        span = r["times"][-1] - r["times"][0] if len(r["times"]) > 1 else 0
        own.append((k - 1) / span if span > 0 else 0.0)
    return {"streams": n, "aggregate_tok_s": gen / wall, "stream_tok_s": own,
            "prompt_tokens": [r["prompt_tokens"] for r in res], "wall_s": wall}


def ttft(s):
    return s["times"][0] - s["t0"] if s["times"] else float("nan")


def conversation(t, texts, lengths, turn_tokens, restart=False):
    """A conversation growing by about turn_tokens (a user turn, then a
    16-token answer appended) until it passes the longest length; the turn
    nearest each length is measured. restart: the server is restarted
    before each measured turn."""
    hist = texts.fresh(64)
    cur, targets, rows, first = 64, sorted(lengths), [], True
    while targets:
        est = cur + turn_tokens  # this turn's prompt, about
        measure = not first and abs(est - targets[0]) <= abs(est + turn_tokens + 16 - targets[0])
        if measure and restart:  # then one short unrelated request: the
            t.restart()          # first request's own start-up costs apart
            stream(t, texts.fresh(32), 2)
        prompt = hist + "\nUser: " + texts.words(int(turn_tokens / texts.tok_per_word)) + "\nAssistant:"
        s = stream(t, prompt, 16)
        if measure:
            rows.append({"target": targets.pop(0), "prompt_tokens": s["prompt_tokens"], "ttft_s": ttft(s),
                         "prompt": prompt})
        hist = prompt + s["text"]
        cur = (s["prompt_tokens"] or est) + 16
        first = False
    return rows


def cold(t, texts, warm_row):
    """The measured turn's prompt with other first words: the same length,
    no prefix to reuse (a prefix cache's chain, llama-server's common
    prefix: both start at the first token)."""
    p = warm_row.pop("prompt")
    s = stream(t, texts.head() + p[p.index(":") + 1:], 1)
    return {"prompt_tokens": s["prompt_tokens"], "ttft_s": ttft(s)}


def gap_bench(t, texts, prompt_tokens, gap_prompt, stream_tokens):
    """A stream runs; once it has 16 tokens a gap_prompt-token prompt is
    sent; the stream hangs up 16 tokens after that prompt's first token."""
    state = {"big": None, "sent": None, "after": None}
    big_done = threading.Event()

    def big():
        state["big"] = stream(t, texts.fresh(gap_prompt), 1)
        big_done.set()

    def on_event(i):
        if i == 16 and state["sent"] is None:
            state["sent"] = time.perf_counter()
            threading.Thread(target=big).start()
        if big_done.is_set():
            if state["after"] is None:
                state["after"] = i
            if i >= state["after"] + 16:
                return False
        return True
    s = stream(t, texts.fresh(prompt_tokens), stream_tokens, on_event)
    big_done.wait()
    ts = s["times"]
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    t_sent, t_big = state["sent"], state["big"]["times"][0] if state["big"]["times"] else ts[-1]
    during = [b - a for a, b in zip(ts, ts[1:]) if b > t_sent and a < t_big]
    # outside the admission: the stream's normal step (the median of all
    # gaps leans to the admission's steps when there are many of them, as
    # with a prompt whose chunks run in slices of layers)
    quiet = [b - a for a, b in zip(ts, ts[1:]) if not (b > t_sent and a < t_big)]
    return {"median_gap_s": statistics.median(gaps), "max_gap_s": max(during or gaps),
            "median_quiet_gap_s": statistics.median(quiet or gaps),
            "median_during_gap_s": statistics.median(during or gaps),
            "big_prompt_tokens": state["big"]["prompt_tokens"], "big_ttft_s": ttft(state["big"]),
            "stream_tokens": len(ts), "complete": big_done.is_set() and state["after"] is not None}


# ---- main ----
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--server-cmd")
    ap.add_argument("--restart", action="store_true")
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--lengths", default="1024,4096,8192")
    ap.add_argument("--turn-tokens", type=int, default=512)
    ap.add_argument("--gap-prompt", type=int, default=4096)
    ap.add_argument("--gap-stream-tokens", type=int, default=1024)
    ap.add_argument("--label", default="")
    ap.add_argument("--json")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="streams,ttft,gap",
                    help="what to run (streams, ttft, gap; --restart adds restart)")
    a = ap.parse_args()
    if bool(a.url) == bool(a.server_cmd):
        ap.error("give exactly one of --url and --server-cmd")
    if a.restart and not a.server_cmd:
        ap.error("--restart needs --server-cmd")
    if a.quick:
        a.streams, a.lengths, a.gap_prompt, a.turn_tokens = "1,4", "512,1024", 1024, 256
    streams = [int(x) for x in a.streams.split(",")]
    lengths = [int(x) for x in a.lengths.split(",")]
    seed = a.seed if a.seed is not None else int(time.time() * 1000) % (1 << 30)
    t = Target(a.url, a.server_cmd)
    out = {"label": a.label, "model": t.model, "seed": seed, "load_before": os.getloadavg()}
    try:
        texts = Texts(seed)
        texts.calibrate(t)
        stream(t, texts.fresh(a.prompt_tokens), 8)  # warm-up
        sections = a.sections.split(",")
        if "streams" in sections:
            out["streams"] = [streams_bench(t, texts, n, a.prompt_tokens, a.gen_tokens) for n in streams]
        if "ttft" in sections:
            out["warm"] = conversation(t, texts, lengths, a.turn_tokens)
            out["cold"] = [cold(t, texts, r) for r in out["warm"]]
        if a.restart:
            out["restart"] = conversation(t, texts, lengths, a.turn_tokens, restart=True)
            for r in out["restart"]:
                r.pop("prompt")
        if "gap" in sections:
            out["gap"] = gap_bench(t, texts, a.prompt_tokens, a.gap_prompt, a.gap_stream_tokens)
    finally:
        out["load_after"] = os.getloadavg()
        t.stop()
    print_table(out)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


def print_table(o):
    rows = []
    for s in o.get("streams", []):
        own = s["stream_tok_s"]
        rows.append(("%d stream%s, %s-token prompts" % (s["streams"], "s" if s["streams"] > 1 else "",
                                                         "/".join(sorted({str(p) for p in s["prompt_tokens"]}))[:20]),
                     "%.2f tok/s aggregate; per stream %.2f min, %.2f median, %.2f max" %
                     (s["aggregate_tok_s"], min(own), statistics.median(own), max(own))))
    for w, c in zip(o.get("warm", []), o.get("cold", [])):
        rows.append(("TTFT at %d tokens (target %d)" % (w["prompt_tokens"] or 0, w["target"]),
                     "warm %.3f s, cold %.3f s (%d tokens): cold/warm %.1fx" %
                     (w["ttft_s"], c["ttft_s"], c["prompt_tokens"] or 0, c["ttft_s"] / w["ttft_s"])))
    w, c = o.get("warm"), o.get("cold")
    if w:
        rows.append(("warm %d / warm %d" % (w[-1]["target"], w[0]["target"]),
                     "%.2fx" % (w[-1]["ttft_s"] / w[0]["ttft_s"])))
        rows.append(("cold %d / warm %d" % (w[-1]["target"], w[-1]["target"]),
                     "%.1fx" % (c[-1]["ttft_s"] / w[-1]["ttft_s"])))
    for r in o.get("restart", []):
        rows.append(("TTFT after a restart at %d tokens" % (r["prompt_tokens"] or 0), "%.3f s" % r["ttft_s"]))
    g = o.get("gap")
    if g:
        rows.append(("gap while a %d-token prompt is admitted" % (g["big_prompt_tokens"] or 0),
                     "max %.1f ms vs median %.1f ms: %.1fx; vs median outside the admission %.1f ms: "
                     "%.1fx; median during it %.1f ms (its TTFT %.2f s%s)" %
                     (g["max_gap_s"] * 1e3, g["median_gap_s"] * 1e3, g["max_gap_s"] / g["median_gap_s"],
                      g["median_quiet_gap_s"] * 1e3, g["max_gap_s"] / g["median_quiet_gap_s"],
                      g["median_during_gap_s"] * 1e3,
                      g["big_ttft_s"], "" if g["complete"] else "; the stream ended before it")))
    width = max(len(r[0]) for r in rows)
    print("== bench_serve %s: model %s, seed %d, load average %.1f before, %.1f after ==" %
          (o["label"], o["model"], o["seed"], o["load_before"][0], o["load_after"][0]))
    print("| %-*s | %s |" % (width, "measure", "result"))
    print("|%s|%s|" % ("-" * (width + 2), "-" * 8))
    for k, v in rows:
        print("| %-*s | %s |" % (width, k, v))


if __name__ == "__main__":
    sys.exit(main())
