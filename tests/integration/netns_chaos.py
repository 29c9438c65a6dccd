"""netns_chaos.py - the driver of test_netns.sh, run inside the
coordinator's network namespace: the coordinator under test serves on
127.0.0.1:8080 (three workers across veth links, injected delay and loss),
a reference coordinator with local experts on 8081. Takes links down with
`ip link set vcN down|up` (the coordinator's end of worker N's veth).
Standard library only.
usage: netns_chaos.py COORD_LOG"""
import subprocess
import sys
import threading
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from serve_lib import request, stream_text, wait_until  # noqa: E402

log_path = sys.argv[1]
ok = True


def say(good, msg):
    global ok
    print(("ok   " if good else "FAIL ") + msg)
    ok &= good


def log():
    with open(log_path) as f:
        return f.read()


def link(n, state):
    subprocess.check_call(["ip", "link", "set", "vc%d" % n, state])


def healthy(port):
    try:
        return request(port, "GET", "/health", timeout=5)[0] == 200
    except OSError:
        return False


wait_until(lambda: healthy(8081), "the reference coordinator serves", 60)
wait_until(lambda: healthy(8080), "the coordinator with three workers serves", 90)

prompts = ["Once upon a time there was", "The quick brown fox", "In the beginning",
           "A long way from home"]
reqs = [{"prompt": p, "max_tokens": 48, "temperature": 0, "ignore_eos": True} for p in prompts]
ref = [stream_text(8081, "/v1/completions", r)[0] for r in reqs]


def error_of(evs):
    for _, d in evs:
        if isinstance(d, dict) and "error" in d:
            return d["error"].get("message", str(d["error"]))
    return None


# A: one worker's link goes down for 3 s while four streams run (two at a
#    time): its calls go to the replicas; every text is the fault-free one
out = {}


def client(idx):
    for i in idx:
        try:
            out[i] = stream_text(8080, "/v1/completions", reqs[i])
        except Exception as e:  # noqa: BLE001 - reported below
            out[i] = (None, [("exception", {"error": {"message": repr(e)}})])


t0 = time.time()
th = [threading.Thread(target=client, args=(ix,)) for ix in ([0, 2], [1, 3])]
for t in th:
    t.start()
time.sleep(0.5)
running = any(t.is_alive() for t in th)
link(1, "down")
time.sleep(3)
link(1, "up")
for t in th:
    t.join(120)
took = time.time() - t0
say(running, "A: the streams were running when the link of n1 went down")
for i in range(len(reqs)):
    text, evs = out.get(i, (None, []))
    if text == ref[i]:
        say(True, "A: request %d completed, text identical to the fault-free run (%d chars)"
            % (i, len(text)))
    else:
        say(False, "A: request %d: %s" % (i, error_of(evs) or "text differs: %r vs %r"
                                          % (text, ref[i])))
print("     A took %.1f s with a 3 s link outage and injected delay and loss" % took)
say("worker n1 declared dead" in log(), "A: n1 was declared dead while its link was down")
try:
    wait_until(lambda: "worker n1 is back" in log(), "n1 back after its link came up", 30)
    say(True, "A: n1 is back once its link is up")
except AssertionError as e:
    say(False, "A: " + str(e))

# B: two links down: some experts have no reachable holder; the request
#    fails at its deadline (--call-timeout 8000) with an error naming them
link(1, "down")
link(2, "down")
t0 = time.time()
text, evs = stream_text(8080, "/v1/completions", reqs[0])
took = time.time() - t0
err = error_of(evs)
say(err is not None and "experts missing" in err,
    "B: with n1 and n2 unreachable the request failed after %.1f s: %s" % (took, (err or "")[:200]))
link(1, "up")
link(2, "up")
try:
    wait_until(lambda: log().count("is back") >= 3, "n1 and n2 back", 40)
except AssertionError as e:
    say(False, "B: " + str(e))
text, evs = stream_text(8080, "/v1/completions", reqs[3])
say(text == ref[3], "B: after the links came back the next request completed with the "
    "fault-free text" if text == ref[3] else "B: after recovery: %s" % (error_of(evs) or text))
sys.exit(0 if ok else 1)
