"""serve_lib.py - starting and stopping ecs-coordinator for the serving tests
(by pid, loopback only), and small raw-HTTP helpers. Standard library only."""
import json
import os
import re
import signal
import socket
import subprocess
import time

HOST = "127.0.0.1"


def free_port():
    s = socket.socket()
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """One ecs-coordinator process; stop() sends SIGTERM to its pid and
    checks that it exits cleanly."""

    def __init__(self, binary, model, *args, log=None):
        self.port = free_port()
        self.log_path = log or "/tmp/ecs-serve-%d.log" % self.port
        self.log = open(self.log_path, "w")
        cmd = [binary, "-m", model, "--http", "%s:%d" % (HOST, self.port), "--threads", "2",
               "--no-repack"] + list(args)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited at start (%d): %s" % (self.proc.returncode, self.read_log()))
            try:
                st, _, body = request(self.port, "GET", "/health")
                if st == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("server did not come up: " + self.read_log())
            time.sleep(0.1)

    def read_log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise RuntimeError("server did not stop on SIGTERM")
        self.log.close()
        log = self.read_log()
        for bad in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            if bad in log:
                raise RuntimeError("sanitizer report in the server's log %s" % self.log_path)
        if self.proc.returncode == 0:
            os.unlink(self.log_path)
        return self.proc.returncode

    def metrics(self):
        st, _, body = request(self.port, "GET", "/metrics")
        assert st == 200, st
        out = {}
        for line in body.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, val = line.rsplit(" ", 1)
            out[name] = float(val)
        return out


def read_response(sock_file):
    """Reads one HTTP/1.1 response (Content-Length or chunked) from a
    socket's file object; returns (status, headers, body)."""
    line = sock_file.readline()
    if not line:
        raise ConnectionError("connection closed before a response")
    status = int(line.split()[1])
    headers = {}
    while True:
        h = sock_file.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, v = h.decode().split(":", 1)
        headers[k.strip().lower()] = v.strip()
    if status == 100:
        return read_response(sock_file)
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            n = int(sock_file.readline().strip(), 16)
            if n == 0:
                sock_file.readline()
                break
            body += sock_file.read(n)
            sock_file.readline()
    else:
        body = sock_file.read(int(headers.get("content-length", "0")))
    return status, headers, body


def request(port, method, path, body=None, headers=None, timeout=120):
    """One request on a fresh connection."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    try:
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        h = {"Host": "x", "Connection": "close"}
        if body is not None:
            h["Content-Type"] = "application/json"
            h["Content-Length"] = str(len(data))
        h.update(headers or {})
        req = "%s %s HTTP/1.1\r\n" % (method, path) + "".join("%s: %s\r\n" % kv for kv in h.items())
        s.sendall(req.encode() + b"\r\n" + data)
        f = s.makefile("rb")
        return read_response(f)
    finally:
        s.close()


def post_json(port, path, obj, headers=None):
    st, h, body = request(port, "POST", path, obj, headers)
    return st, json.loads(body) if body else None


def sse_events(body):
    """(event, data) pairs of an SSE body; data parsed as JSON where it is."""
    out = []
    for block in body.decode().split("\n\n"):
        ev, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is None:
            continue
        try:
            data = json.loads(data)
        except ValueError:
            pass
        out.append((ev, data))
    return out


def stream_text(port, path, obj):
    """Streams a completion; returns (joined text, events)."""
    o = dict(obj, stream=True)
    st, h, body = request(port, "POST", path, o)
    assert st == 200, (st, body[:300])
    assert h.get("content-type", "").startswith("text/event-stream"), h
    evs = sse_events(body)
    text = ""
    for ev, d in evs:
        if not isinstance(d, dict):
            continue
        if "choices" in d and d["choices"]:
            c = d["choices"][0]
            text += c.get("text") or c.get("delta", {}).get("content") or ""
        elif d.get("type") == "content_block_delta":
            text += d["delta"]["text"]
    return text, evs


def model_path(root, build, name):
    """A tiny test model: the shared one, else made with ecs-mkmodel."""
    shared = os.path.join(root, "..", "shared", "models", name + ".gguf")
    if os.path.exists(shared):
        return shared
    out = os.path.join(root, build, "models", name + ".gguf")
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        arch = "deepseek2" if "ds2" in name else "qwen3moe"
        subprocess.check_call([os.path.join(root, build, "bin", "ecs-mkmodel"), "--arch", arch,
                               "--preset", "tiny", "--types", "q8_0", "--seed", "1", "-o", out])
    return out


def run_check(name, fn):
    """Runs one check and prints PASS or FAIL with its error; True if it passed."""
    try:
        fn()
        print("PASS", name, flush=True)
        return True
    except Exception as e:  # noqa: BLE001 - report every failure and go on
        print("FAIL %s: %r" % (name, e), flush=True)
        return False


def wait_until(fn, what, limit=60):
    deadline = time.time() + limit
    while not fn():
        if time.time() > deadline:
            raise AssertionError("never happened: " + what)
        time.sleep(0.05)


def metric_value(m, name):
    for k, v in m.items():
        if re.fullmatch(re.escape(name), k):
            return v
    return 0.0
