"""curve_peer.py - the hostile (and one friendly) peer of test_curve.sh,
with pyzmq (/usr/bin/python3 has it).

  curve_peer.py keygen DIR NAME...     PREFIX.pub / PREFIX.key (0600) per name,
                                        in the format of proto/curve.h
  curve_peer.py probe ENDPOINT [--server-pub FILE] [--key FILE] [--wait S]
      connects a DEALER to a worker's data endpoint (plaintext, or CURVE with
      --key and the worker's --server-pub) through a TCP relay that records
      every byte, sends a message that carries a marker, and prints one JSON
      line: whether anything came back, and whether the marker could be read
      on the wire."""
import json
import os
import socket
import sys
import threading
import time

import zmq

MARKER = b"ECS-MARKER-7f3a9c"


def keygen(d, names):
    os.makedirs(d, exist_ok=True)
    for n in names:
        pub, sec = zmq.curve_keypair()
        with open(os.path.join(d, n + ".pub"), "w") as f:
            f.write(pub.decode() + "\n")
        fd = os.open(os.path.join(d, n + ".key"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"public " + pub + b"\nsecret " + sec + b"\n")
        os.close(fd)


def load(path):
    with open(path) as f:
        lines = f.read().split("\n")
    if lines[0].startswith("public "):
        return lines[0][7:].encode(), lines[1][7:].encode()
    return lines[0].strip().encode(), None


class Relay:
    """A TCP relay on a free loopback port that records what passes."""

    def __init__(self, host, port):
        self.target = (host, port)
        self.seen = bytearray()
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(4)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                a, _ = self.ls.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self.pump, args=(x, y), daemon=True).start()

    def pump(self, src, dst):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            self.seen += data
            try:
                dst.sendall(data)
            except OSError:
                return


def probe(endpoint, server_pub=None, key=None, wait=2.0):
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    relay = Relay(host, int(port))
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if key:
        pub, sec = load(key)
        s.curve_publickey, s.curve_secretkey = pub, sec
        s.curve_serverkey = load(server_pub)[0]
    s.connect("tcp://127.0.0.1:%d" % relay.port)
    # not a valid ExpertCall: a worker that reads it answers with an Error
    s.send_multipart([b"\x0a\x01" + MARKER, MARKER * 4])
    replied = bool(s.poll(int(wait * 1000)))
    reply = s.recv_multipart() if replied else []
    time.sleep(0.2)
    s.close()
    ctx.term()
    print(json.dumps({"replied": replied, "reply_frames": len(reply),
                      "wire_bytes": len(relay.seen), "marker_on_wire": MARKER in relay.seen}))


if __name__ == "__main__":
    if sys.argv[1] == "keygen":
        keygen(sys.argv[2], sys.argv[3:])
    else:
        args = sys.argv[3:]
        opt = {args[i].lstrip("-").replace("-", "_"): args[i + 1] for i in range(0, len(args), 2)}
        probe(sys.argv[2], opt.get("server_pub"), opt.get("key"), float(opt.get("wait", 2)))
