"""bench_failover.py - the failover figures: kill -9 a spawned worker in
the middle of a teacher-forced ecs-run and time, from the coordinator's
log lines stamped as they arrive: detection (kill -> "declared dead"),
the stall after detection (-> the re-sent layer's log line: with a replica
that is one re-sent call; without, the restart and load), the restart
(declared dead -> "is back") and the worker's own load time ("reloaded
... in X ms"). Standard library only.

usage: bench_failover.py BUILD MODEL [ROUNDS] [ecs-run args...]   (FAILOVER_TOKENS=400)
       e.g. bench_failover.py build m.gguf 3 --replication 1 (the restart
       path: without it the 2 spawned workers each hold every expert, the
       default, and the dead worker's calls go to the other)"""
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

build, model = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
extra = sys.argv[4:]
toks = ",".join(str(random.Random(5).randrange(1, 2000))
                for _ in range(int(os.environ.get("FAILOVER_TOKENS", "400"))))


def one():
    cmd = [os.path.join(build, "bin", "ecs-run"), "-m", model, "--threads", "1", "--no-repack",
           "--tokens", toks, "--step", "1", "--top", "1", "--dump-logits", "/dev/null",
           "--spawn-workers", "2", "--worker-threads", "1"] + extra
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []

    def read():
        for line in p.stderr:
            lines.append((time.monotonic(), line.rstrip()))

    th = threading.Thread(target=read)
    th.start()
    t_ready = None
    while p.poll() is None and t_ready is None:
        if sum("ready:" in ln for _, ln in lines) >= 2:
            t_ready = time.monotonic()
        time.sleep(0.01)
    time.sleep(1.0)  # into the run
    pid = int(re.findall(r"worker w1 registered \(pid (\d+)", "\n".join(ln for _, ln in lines))[-1])
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    p.wait()
    th.join()
    after = [(t, ln) for t, ln in lines if t >= t_kill]

    def first(pat):
        for t, ln in after:
            m = re.search(pat, ln)
            if m:
                return t, m
        return None, None

    t_dead, _ = first(r"worker w1 declared dead")
    t_back, m_back = first(r"worker w1 is back .*, (\d+) ms after")
    _, m_load = first(r"worker w1 reloaded its (\d+) experts in (\d+) ms")
    t_layer, m_layer = first(r"layer (\d+): .*the layer took (\d+) ms")
    return {
        "rc": p.returncode,
        "detect_ms": (t_dead - t_kill) * 1e3 if t_dead else None,
        "stall_after_detect_ms": (t_layer - t_dead) * 1e3 if t_layer and t_dead else None,
        "layer_ms": int(m_layer.group(2)) if m_layer else None,
        "back_ms": int(m_back.group(1)) if m_back else None,
        "load_ms": int(m_load.group(2)) if m_load else None,
        "experts": int(m_load.group(1)) if m_load else None,
    }


print("== bench_failover: %s, %s, %s ==" % (os.path.basename(model), " ".join(extra) or
                                           "no replica", time.strftime("%Y-%m-%d %H:%M UTC",
                                                                        time.gmtime())))
print("load: %s" % open("/proc/loadavg").read().strip())
for r in range(rounds):
    m = one()
    fmt = lambda v: "-" if v is None else "%.0f" % v  # noqa: E731
    print("round %d: rc %d  detection %s ms  stall after detection %s ms (the layer took %s ms)  "
          "back after %s ms (load of %s experts %s ms)"
          % (r + 1, m["rc"], fmt(m["detect_ms"]), fmt(m["stall_after_detect_ms"]),
             fmt(m["layer_ms"]), fmt(m["back_ms"]), fmt(m["experts"]), fmt(m["load_ms"])))
print("load: %s" % open("/proc/loadavg").read().strip())
